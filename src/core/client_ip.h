/*
 * client_ip.h - which address a proxied request came from (docs/http.md,
 * docs/security.md): the `ip` attribute of /auth.
 *
 * Every proxy appends the address it was called from to X-Forwarded-For,
 * and a client can write anything it likes ahead of those.  So the only
 * trustworthy entries are the ones on the right, added by proxies we run:
 * `xff_trusted_hops` counts the proxies in front of the nearest one, and the
 * address taken is that many places from the right.  X-Real-IP, when the
 * proxy sets it, is a single address it vouches for.  `client_ip` names the
 * header the deployment's proxy controls (auto: X-Real-IP, else
 * X-Forwarded-For, else the peer).
 *
 * An IPv6 address is reduced to the network of `ipv6_prefix` bits, written
 * "2001:db8:1:2::/64", because one client commonly holds a whole /64 and
 * could rotate through it; 128 keeps the address as it is.  An IPv4-mapped
 * IPv6 address ("::ffff:192.0.2.1") counts as the IPv4 address.
 *
 * Pure: no I/O, no allocation, no state.  Any thread.
 */
#ifndef RL_CLIENT_IP_H
#define RL_CLIENT_IP_H

#include <stddef.h>

/* Enough for "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128". */
#define CLIENT_IP_MAX 56

enum client_ip_source {
	CLIENT_IP_AUTO = 0,  /* X-Real-IP, else X-Forwarded-For, else peer */
	CLIENT_IP_X_REAL_IP, /* X-Real-IP, else peer */
	CLIENT_IP_XFF,	     /* X-Forwarded-For, else peer */
	CLIENT_IP_PEER	     /* the connection's own peer address */
};
#define CLIENT_IP_NSOURCES 4

/* "auto", "x-real-ip", "x-forwarded-for", "peer", indexed by the enum. */
extern const char *const client_ip_source_names[CLIENT_IP_NSOURCES];

struct client_ip_policy {
	enum client_ip_source source;
	int xff_trusted_hops; /* >= 0 */
	int ipv6_prefix;      /* 1 .. 128 */
};

/*
 * The client address of one request under policy p, written into out
 * (NUL-terminated, at most CLIENT_IP_MAX bytes with the NUL).
 *
 *   x_real_ip  the X-Real-IP header, or NULL
 *   xff        every X-Forwarded-For header of the request joined with ","
 *              in the order they came (one list), or NULL
 *   peer       the peer address as text, or NULL (a unix socket)
 *
 * The X-Forwarded-For list is split at commas, with blanks around entries
 * and empty entries dropped; the entry xff_trusted_hops places from the
 * right is taken, or the first when the list is shorter.  A header value
 * that is not an IP address (with an optional port, "192.0.2.1:3456" or
 * "[2001:db8::1]:443") counts as absent, so the next source is tried: a
 * bogus value can never become a key of its own.
 * Returns 0, or -1 when no source gives an address (out is then "").
 */
int client_ip_pick(const struct client_ip_policy *p, const char *x_real_ip,
    const char *xff, const char *peer, char *out, size_t outlen);

/*
 * Parse one address (optionally with a port, see above) and write its
 * canonical text into out, an IPv6 address reduced to its /ipv6_prefix
 * network.  Returns 0, or -1 when s is not an address or out is too small.
 */
int client_ip_normalize(const char *s, size_t len, int ipv6_prefix, char *out,
    size_t outlen);

#endif
