/*
 * redis_url.c - parse and redact the Redis URL of the config file, and read
 * a password file.  Pure string work (plus one fopen), kept apart from
 * backend_redis.c so the unit tests reach every branch without a server.
 * The grammar is in redis_url.h.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/redis_url.h"
#include "base/util.h"

#define REDACTED_MAX 512 /* enough of a URL to recognise it */
#define PASSWORD_MAX 4096

/* Percent-decode s[0..n) into a new string.  NULL for a bad escape, an
 * encoded NUL or OOM (*oom tells which). */
static char *
pct_decode(const char *s, size_t n, bool *oom)
{
	char *out, *o;
	size_t i;

	*oom = false;
	if ((out = rl_malloc(n + 1)) == NULL) {
		*oom = true;
		return NULL;
	}
	o = out;
	for (i = 0; i < n; i++) {
		if (s[i] == '%') {
			int hi, lo;

			if (i + 2 >= n)
				goto bad;
			hi = util_hex_value((unsigned char)s[i + 1]);
			lo = util_hex_value((unsigned char)s[i + 2]);
			if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
				goto bad;
			*o++ = (char)(hi << 4 | lo);
			i += 2;
		} else
			*o++ = s[i];
	}
	*o = '\0';
	return out;
bad:
	explicit_bzero(out, n + 1);
	rl_free(out);
	return NULL;
}

/* Parse s[0..n) as a decimal integer in [lo, hi].  0 or -1. */
static int
parse_range(const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out)
{
	int64_t v = 0;
	size_t i;

	if (n == 0 || n > 18)
		return -1;
	for (i = 0; i < n; i++) {
		if (!isdigit((unsigned char)s[i]))
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	if (v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* Append s[0..n) to buf at *off, bounded by buflen, NUL-terminated. */
static void
redact_put(char *buf, size_t buflen, size_t *off, const char *s, size_t n)
{
	if (*off + 1 < buflen) {
		size_t room = buflen - 1 - *off;

		memcpy(buf + *off, s, n < room ? n : room);
		buf[*off + (n < room ? n : room)] = '\0';
	}
	*off += n;
}

size_t
redis_url_redact(const char *url, char *buf, size_t buflen)
{
	const char *start, *at, *p;
	size_t off = 0;

	if (buflen > 0)
		buf[0] = '\0';
	start = strstr(url, "://");
	start = start != NULL ? start + 3 : url;
	/* The last '@' anywhere after the scheme: a password with an
	 * unencoded '/' or '@' is still hidden (at worst a unix path with an
	 * '@' is over-redacted). */
	at = NULL;
	for (p = start; *p != '\0'; p++)
		if (*p == '@')
			at = p;
	if (at == NULL) {
		redact_put(buf, buflen, &off, url, strlen(url));
		return off;
	}
	redact_put(buf, buflen, &off, url, (size_t)(start - url));
	redact_put(buf, buflen, &off, "***@", 4);
	redact_put(buf, buflen, &off, at + 1, strlen(at + 1));
	return off;
}

/*
 * The URL as an error quotes it.  With an '@', redis_url_redact().  Without
 * one, a password may still sit where the port or the path goes (a
 * forgotten '@', a password holding '/'), so nothing after the first ':'
 * past the scheme (or past a leading [IPv6] host) is shown: "redis://u:***".
 */
static void
redact_for_error(const char *url, char *buf, size_t buflen)
{
	const char *start = strstr(url, "://"), *from, *colon;
	size_t off = 0;

	start = start != NULL ? start + 3 : url;
	if (strchr(start, '@') != NULL) {
		redis_url_redact(url, buf, buflen);
		return;
	}
	from = start;
	if (*start == '[' && strchr(start, ']') != NULL)
		from = strchr(start, ']');
	if ((colon = strchr(from, ':')) == NULL) {
		redact_put(buf, buflen, &off, url, strlen(url));
		return;
	}
	redact_put(buf, buflen, &off, url, (size_t)(colon + 1 - url));
	redact_put(buf, buflen, &off, "***", 3);
}

static int
parse_unix(const char *rest, struct redis_url *out, const char *shown,
    char *err, size_t errlen)
{
	const char *q = strchr(rest, '?');
	size_t plen = q != NULL ? (size_t)(q - rest) : strlen(rest);

	if (plen < 2 || rest[0] != '/') {
		snprintf(err, errlen,
		    "redis URL %s: unix:// needs an "
		    "absolute socket path (a password goes in "
		    "password_file)",
		    shown);
		return -1;
	}
	if (q != NULL) {
		if (strncmp(q, "?db=", 4) != 0 ||
		    parse_range(q + 4, strlen(q + 4), 0, INT32_MAX, &out->db) ==
			-1) {
			snprintf(err, errlen,
			    "redis URL %s: the only query "
			    "is ?db=N",
			    shown);
			return -1;
		}
	}
	out->is_unix = true;
	if ((out->path = rl_strndup(rest, plen)) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

static int
parse_userinfo(const char *ui, size_t n, struct redis_url *out,
    const char *shown, char *err, size_t errlen)
{
	const char *colon = memchr(ui, ':', n);
	size_t ulen = colon != NULL ? (size_t)(colon - ui) : n;
	bool oom;

	if (colon != NULL && (size_t)(colon - ui) + 1 == n) {
		snprintf(err, errlen, "redis URL %s: empty password", shown);
		return -1;
	}
	if (colon == NULL && n == 0) {
		snprintf(err, errlen, "redis URL %s: empty user name", shown);
		return -1;
	}
	if (ulen > 0 && (out->user = pct_decode(ui, ulen, &oom)) == NULL)
		goto bad;
	if (colon != NULL &&
	    (out->password = pct_decode(colon + 1, n - ulen - 1, &oom)) == NULL)
		goto bad;
	return 0;
bad:
	if (oom)
		snprintf(err, errlen, "out of memory");
	else
		snprintf(err, errlen,
		    "redis URL %s: bad %%-escape in user "
		    "or password",
		    shown);
	return -1;
}

static int
parse_tcp(const char *rest, struct redis_url *out, const char *shown, char *err,
    size_t errlen)
{
	const char *auth_end, *at, *p, *host, *host_end, *port;
	int64_t v;

	auth_end = rest + strcspn(rest, "/?#");
	if (strpbrk(rest, "?#") != NULL) {
		snprintf(err, errlen,
		    "redis URL %s: query strings are not "
		    "supported",
		    shown);
		return -1;
	}
	at = NULL;
	for (p = rest; p < auth_end; p++)
		if (*p == '@')
			at = p;
	if (at != NULL) {
		if (parse_userinfo(rest, (size_t)(at - rest), out, shown, err,
			errlen) == -1)
			return -1;
		host = at + 1;
	} else
		host = rest;

	port = NULL;
	if (*host == '[') {
		host_end = memchr(host, ']', (size_t)(auth_end - host));
		if (host_end == NULL || host_end == host + 1) {
			snprintf(err, errlen,
			    "redis URL %s: bad [IPv6] "
			    "address",
			    shown);
			return -1;
		}
		if (host_end + 1 < auth_end) {
			if (host_end[1] != ':') {
				snprintf(err, errlen,
				    "redis URL %s: junk "
				    "after ]",
				    shown);
				return -1;
			}
			port = host_end + 2;
		}
		host++;
	} else {
		host_end = memchr(host, ':', (size_t)(auth_end - host));
		if (host_end != NULL) {
			port = host_end + 1;
			if (memchr(port, ':', (size_t)(auth_end - port))) {
				snprintf(err, errlen,
				    "redis URL %s: an IPv6 "
				    "address needs [brackets]",
				    shown);
				return -1;
			}
		} else
			host_end = auth_end;
	}
	if (host_end == host) {
		snprintf(err, errlen, "redis URL %s: no host", shown);
		return -1;
	}
	out->port = REDIS_DEFAULT_PORT;
	if (port != NULL) {
		if (parse_range(port, (size_t)(auth_end - port), 1, 65535,
			&v) == -1) {
			snprintf(err, errlen,
			    "redis URL %s: bad port (want "
			    "1..65535)",
			    shown);
			return -1;
		}
		out->port = (int)v;
	}
	if (*auth_end == '/' && auth_end[1] != '\0' &&
	    parse_range(auth_end + 1, strlen(auth_end + 1), 0, INT32_MAX,
		&out->db) == -1) {
		snprintf(err, errlen,
		    "redis URL %s: bad database number "
		    "after /",
		    shown);
		return -1;
	}
	if ((out->host = rl_strndup(host, (size_t)(host_end - host))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

int
redis_url_parse(const char *url, struct redis_url *out, char *err,
    size_t errlen)
{
	char raw[REDACTED_MAX], shown[REDACTED_MAX];
	int rc;

	memset(out, 0, sizeof(*out));
	raw[0] = '\0';
	redact_for_error(url, raw, sizeof(raw));
	/* Escaped, so that a message stays one line (a newline in the URL
	 * must not start another log line). */
	util_escape(shown, sizeof(shown), raw);
	if (strncasecmp(url, "redis://", 8) == 0)
		rc = parse_tcp(url + 8, out, shown, err, errlen);
	else if (strncasecmp(url, "unix://", 7) == 0)
		rc = parse_unix(url + 7, out, shown, err, errlen);
	else if (strncasecmp(url, "rediss://", 9) == 0) {
		rc = parse_tcp(url + 9, out, shown, err, errlen);
		out->tls = true;
	} else {
		snprintf(err, errlen,
		    "redis URL %s: want redis://host:port, "
		    "rediss://host:port or unix:///path",
		    shown);
		rc = -1;
	}
	if (rc == -1)
		redis_url_free(out);
	return rc;
}

void
redis_url_free(struct redis_url *u)
{
	if (u->password != NULL)
		explicit_bzero(u->password, strlen(u->password));
	rl_free(u->host);
	rl_free(u->path);
	rl_free(u->user);
	rl_free(u->password);
	memset(u, 0, sizeof(*u));
}

int
redis_read_password_file(const char *path, char **out, char *err, size_t errlen)
{
	char buf[PASSWORD_MAX + 2];
	size_t n, len;
	FILE *f;
	int rc = -1;

	*out = NULL;
	if ((f = fopen(path, "re")) == NULL) {
		snprintf(err, errlen, "password_file %s: %s", path,
		    strerror(errno));
		return -1;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	if (ferror(f)) {
		snprintf(err, errlen, "password_file %s: %s", path,
		    strerror(errno));
		goto out_close;
	}
	buf[n] = '\0';
	len = strcspn(buf, "\n");
	if (len > 0 && buf[len - 1] == '\r')
		len--;
	if (len > PASSWORD_MAX) {
		snprintf(err, errlen,
		    "password_file %s: first line longer "
		    "than %d bytes",
		    path, PASSWORD_MAX);
		goto out_wipe;
	}
	if (len == 0) {
		snprintf(err, errlen,
		    "password_file %s: the first line is "
		    "empty",
		    path);
		goto out_wipe;
	}
	if ((*out = rl_strndup(buf, len)) == NULL) {
		snprintf(err, errlen, "out of memory");
		goto out_wipe;
	}
	rc = 0;
out_wipe:
	explicit_bzero(buf, sizeof(buf));
out_close:
	fclose(f);
	return rc;
}
