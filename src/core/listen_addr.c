/*
 * listen_addr.c - the `listen` address, parsed, bounded and compared (see
 * listen_addr.h).  http.c binds what this parses; config.c refuses what it
 * refuses, and two listeners on one address, with the line and column.
 */
#include "core/listen_addr.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/util.h"

/* Room for the address quoted in a message (escaped, cut short). */
#define ADDR_QUOTE_MAX 128

static int
bad(char *err, size_t errlen, const char *s)
{
	char q[ADDR_QUOTE_MAX];

	snprintf(err, errlen,
	    "\"%s\": expected host:port, [v6]:port or "
	    "unix:/path",
	    util_escape(q, sizeof(q), s));
	return -1;
}

int
listen_addr_parse(const char *s, struct listen_addr *out, char *err,
    size_t errlen)
{
	const char *host, *port, *end;
	size_t hlen;
	long p = 0;

	memset(out, 0, sizeof(*out));
	if (strncmp(s, "unix:", 5) == 0) {
		out->is_unix = true;
		if (s[5] == '\0')
			return bad(err, errlen, s);
		if (strlen(s + 5) > LISTEN_PATH_MAX) {
			snprintf(err, errlen,
			    "unix socket path longer than %d "
			    "bytes",
			    LISTEN_PATH_MAX);
			return -1;
		}
		memcpy(out->path, s + 5, strlen(s + 5) + 1);
		return 0;
	}
	if (s[0] == '[') {
		if ((end = strchr(s, ']')) == NULL || end[1] != ':')
			return bad(err, errlen, s);
		host = s + 1;
		hlen = (size_t)(end - host);
		port = end + 2;
		if (hlen == 0)
			return bad(err, errlen, s);
	} else {
		if ((end = strrchr(s, ':')) == NULL)
			return bad(err, errlen, s);
		host = s;
		hlen = (size_t)(end - s);
		port = end + 1;
		if (memchr(host, ':', hlen) != NULL) /* v6 needs [] */
			return bad(err, errlen, s);
	}
	if (hlen > LISTEN_HOST_MAX) {
		snprintf(err, errlen, "host name longer than %d bytes",
		    LISTEN_HOST_MAX);
		return -1;
	}
	if (*port == '\0')
		return bad(err, errlen, s);
	for (; *port != '\0'; port++) {
		if (*port < '0' || *port > '9' || p > 65535)
			break;
		p = p * 10 + (*port - '0');
	}
	if (*port != '\0' || p < 1 || p > 65535) {
		char q[ADDR_QUOTE_MAX];

		snprintf(err, errlen,
		    "\"%s\": the port must be a number from 1 "
		    "to 65535",
		    util_escape(q, sizeof(q), s));
		return -1;
	}
	memcpy(out->host, host, hlen);
	out->host[hlen] = '\0';
	out->port = (int)p;
	return 0;
}

/* host as an IP address of either family into buf (16 bytes): AF_INET,
 * AF_INET6, or 0 for a name (or ""). */
static int
ip_of(const char *host, unsigned char buf[16])
{
	if (inet_pton(AF_INET, host, buf) == 1)
		return AF_INET;
	if (inet_pton(AF_INET6, host, buf) == 1)
		return AF_INET6;
	return 0;
}

bool
listen_addr_is_shared(const struct listen_addr *a, const struct listen_addr *b)
{
	static const unsigned char any[16] = { 0 };
	unsigned char ia[16], ib[16];
	int fa, fb;
	size_t n;

	if (a->is_unix || b->is_unix)
		return a->is_unix && b->is_unix &&
		    strcmp(a->path, b->path) == 0;
	if (a->port != b->port)
		return false;
	if (strcasecmp(a->host, b->host) == 0)
		return true;
	fa = ip_of(a->host, ia);
	fb = ip_of(b->host, ib);
	if (fa == 0 || fa != fb)
		return false;
	n = fa == AF_INET ? 4 : 16;
	return memcmp(ia, ib, n) == 0 || memcmp(ia, any, n) == 0 ||
	    memcmp(ib, any, n) == 0;
}
