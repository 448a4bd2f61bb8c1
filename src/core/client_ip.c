/*
 * client_ip.c - the client address of a proxied request (see client_ip.h).
 *
 * The X-Forwarded-For list is walked from the right without copying it:
 * only the chosen entry is copied, into a buffer of fixed size, and parsed
 * with inet_pton(), so a header of any length costs one pass and no
 * allocation.
 */
#include "core/client_ip.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

/* The longest entry worth parsing: "[" v6 "]:" port, with room to spare. */
#define ENTRY_MAX 64

const char *const client_ip_source_names[CLIENT_IP_NSOURCES] = {
	[CLIENT_IP_AUTO] = "auto",
	[CLIENT_IP_X_REAL_IP] = "x-real-ip",
	[CLIENT_IP_XFF] = "x-forwarded-for",
	[CLIENT_IP_PEER] = "peer",
};

static bool
is_blank(char c)
{
	return c == ' ' || c == '\t';
}

static bool
all_digits(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

int
client_ip_normalize(const char *s, size_t len, int ipv6_prefix, char *out,
    size_t outlen)
{
	char buf[ENTRY_MAX], text[INET6_ADDRSTRLEN];
	unsigned char a6[16];
	struct in_addr a4;
	char *host = buf, *colon;
	int bits, i;

	while (len > 0 && is_blank(*s)) {
		s++;
		len--;
	}
	while (len > 0 && is_blank(s[len - 1]))
		len--;
	if (len == 0 || len >= sizeof(buf))
		return -1;
	memcpy(buf, s, len);
	buf[len] = '\0';

	if (buf[0] == '[') {
		/* "[v6]" or "[v6]:port" */
		char *end = strchr(buf, ']');

		if (end == NULL ||
		    (end[1] != '\0' && (end[1] != ':' || !all_digits(end + 2))))
			return -1;
		*end = '\0';
		host = buf + 1;
	} else if ((colon = strchr(buf, ':')) != NULL &&
	    strchr(colon + 1, ':') == NULL) {
		/* One colon: "v4:port". */
		if (!all_digits(colon + 1))
			return -1;
		*colon = '\0';
	}

	if (inet_pton(AF_INET, host, &a4) == 1)
		goto v4;
	if (inet_pton(AF_INET6, host, a6) != 1)
		return -1;
	if (memcmp(a6, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
		memcpy(&a4, a6 + 12, 4);
		goto v4;
	}
	bits = ipv6_prefix < 1 ? 1 : ipv6_prefix > 128 ? 128 : ipv6_prefix;
	for (i = 0; i < 16; i++) {
		int keep = bits - i * 8;

		if (keep <= 0)
			a6[i] = 0;
		else if (keep < 8)
			a6[i] &= (unsigned char)(0xff << (8 - keep));
	}
	if (inet_ntop(AF_INET6, a6, text, sizeof(text)) == NULL)
		return -1;
	if (bits == 128)
		return util_strlcpy(out, text, outlen) < outlen ? 0 : -1;
	i = snprintf(out, outlen, "%s/%d", text, bits);
	return i > 0 && (size_t)i < outlen ? 0 : -1;

v4:
	if (inet_ntop(AF_INET, &a4, text, sizeof(text)) == NULL)
		return -1;
	return util_strlcpy(out, text, outlen) < outlen ? 0 : -1;
}

/*
 * The entry of the comma-separated list `list` that lies `hops` places from
 * the right (blank and empty entries skipped), or the first when there are
 * fewer.  Sets *start and *len; returns false when the list has no entry.
 */
static bool
xff_entry(const char *list, int hops, const char **start, size_t *len)
{
	const char *end = list + strlen(list), *p = end;
	const char *first = NULL;
	size_t first_len = 0;
	int seen = 0;

	while (p > list) {
		const char *e = p, *b;

		/* One entry: back to the previous comma or the start. */
		while (p > list && p[-1] != ',')
			p--;
		b = p;
		while (b < e && is_blank(*b))
			b++;
		while (e > b && is_blank(e[-1]))
			e--;
		if (e > b) {
			if (seen == hops) {
				*start = b;
				*len = (size_t)(e - b);
				return true;
			}
			seen++;
			first = b; /* leftmost so far */
			first_len = (size_t)(e - b);
		}
		if (p > list)
			p--; /* over the comma */
	}
	if (first == NULL)
		return false;
	*start = first;
	*len = first_len;
	return true;
}

static int
from_header(const char *v, char *out, size_t outlen, int ipv6_prefix)
{
	if (v == NULL)
		return -1;
	return client_ip_normalize(v, strlen(v), ipv6_prefix, out, outlen);
}

static int
from_xff(const struct client_ip_policy *p, const char *xff, char *out,
    size_t outlen)
{
	const char *start;
	size_t len;

	if (xff == NULL ||
	    !xff_entry(xff, p->xff_trusted_hops < 0 ? 0 : p->xff_trusted_hops,
		&start, &len))
		return -1;
	return client_ip_normalize(start, len, p->ipv6_prefix, out, outlen);
}

int
client_ip_pick(const struct client_ip_policy *p, const char *x_real_ip,
    const char *xff, const char *peer, char *out, size_t outlen)
{
	int rc = -1;

	if (outlen == 0)
		return -1;
	switch (p->source) {
	case CLIENT_IP_AUTO:
		if ((rc = from_header(x_real_ip, out, outlen,
			 p->ipv6_prefix)) == 0)
			break;
		rc = from_xff(p, xff, out, outlen);
		break;
	case CLIENT_IP_X_REAL_IP:
		rc = from_header(x_real_ip, out, outlen, p->ipv6_prefix);
		break;
	case CLIENT_IP_XFF:
		rc = from_xff(p, xff, out, outlen);
		break;
	case CLIENT_IP_PEER:
		break;
	}
	if (rc != 0)
		rc = from_header(peer, out, outlen, p->ipv6_prefix);
	if (rc != 0)
		out[0] = '\0';
	return rc;
}
