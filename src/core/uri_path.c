/*
 * uri_path.c - the path of a proxied request as the proxy routes it (see
 * uri_path.h).
 *
 * Two passes over the caller's buffer: the first copies the path part of
 * the input, with its leading "/" and its escapes decoded; the second
 * resolves the segments in place (a written segment is never longer than
 * what was read for it, so the write index never passes the read index).
 * Every byte is looked at a bounded number of times: a path of any length
 * costs a few passes and no allocation.
 */
#include "core/uri_path.h"

#include <string.h>

#include "base/util.h"

static bool
is_scheme_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
}

/* An absolute URI ("https://host:8443/login"): the offset of its path in
 * s[0..len), len when it has none; 0 when s is no absolute URI. */
static size_t
absolute_path_at(const char *s, size_t len)
{
	size_t i = 0;

	if (len == 0 ||
	    !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
		return 0;
	while (i < len && is_scheme_char(s[i]))
		i++;
	if (len - i < 3 || memcmp(s + i, "://", 3) != 0)
		return 0;
	for (i += 3; i < len && s[i] != '/'; i++)
		;
	return i;
}

/* Pass one: the path part of in into out with a leading "/", decoded when
 * raw.  Returns its length, or -1 on an encoded NUL. */
static long
copy_path(const char *in, size_t len, bool raw, char *out)
{
	size_t i = 0, n = 0, q;

	for (q = 0; q < len && in[q] != '?' && (!raw || in[q] != '#'); q++)
		;
	len = q;
	if (raw && len > 0 && in[0] != '/')
		i = absolute_path_at(in, len);
	if (i >= len || in[i] != '/')
		out[n++] = '/';
	for (; i < len; i++) {
		int hi, lo;

		if (!raw || in[i] != '%' || len - i < 3 ||
		    (hi = util_hex_value((unsigned char)in[i + 1])) < 0 ||
		    (lo = util_hex_value((unsigned char)in[i + 2])) < 0) {
			out[n++] = in[i]; /* a malformed escape stays */
			continue;
		}
		if (hi == 0 && lo == 0)
			return -1;
		out[n++] = (char)(hi << 4 | lo);
		i += 2;
	}
	return (long)n;
}

/* Pass two: merge slashes and resolve dot segments in p[0..n), which
 * starts with "/"; returns the new length (at least 1). */
static size_t
resolve_segments(char *p, size_t n)
{
	size_t r = 0, w = 0;

	for (;;) {
		size_t s, seg;

		while (r < n && p[r] == '/')
			r++;
		if (r == n) {
			p[w++] = '/'; /* the path ends at a slash: keep one */
			break;
		}
		for (s = r; r < n && p[r] != '/'; r++)
			;
		seg = r - s;
		if (seg == 1 && p[s] == '.')
			continue; /* ends: the loop's next turn writes "/" */
		if (seg == 2 && p[s] == '.' && p[s + 1] == '.') {
			while (w > 0 && p[--w] != '/')
				;
			continue;
		}
		p[w++] = '/';
		memmove(p + w, p + s, seg);
		w += seg;
		if (r == n)
			break;
	}
	return w;
}

int
uri_path_normalize(const char *in, size_t len, bool raw, char *out,
    size_t outlen, char *err, size_t errlen)
{
	long n;

	len = strnlen(in, len);
	if (outlen < URI_PATH_ROOM(len)) {
		util_strlcpy(err, "no room for the path", errlen);
		return -1;
	}
	if ((n = copy_path(in, len, raw, out)) < 0) {
		util_strlcpy(err, "the path has an encoded NUL (%00)", errlen);
		return -1;
	}
	out[resolve_segments(out, (size_t)n)] = '\0';
	return 0;
}

bool
uri_path_target_has_nul(const char *target)
{
	const char *p;

	for (p = target; *p != '\0' && *p != '?'; p++)
		if (p[0] == '%' && p[1] == '0' && p[2] == '0')
			return true;
	return false;
}
