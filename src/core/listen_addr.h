/*
 * listen_addr.h - the `listen` address of the config (docs/configuration.md):
 * "host:port", "[v6]:port" or "unix:/path", parsed and bounded without a
 * socket, so that --check refuses exactly what start-up would (a port past
 * 65535, a host name past 255 bytes, a unix path too long for sun_path),
 * and compared, so that it refuses two listeners on one address too.
 *
 * Pure; any thread.
 */
#ifndef RL_LISTEN_ADDR_H
#define RL_LISTEN_ADDR_H

#include <stdbool.h>
#include <stddef.h>

#define LISTEN_HOST_MAX 255
#define LISTEN_PATH_MAX 107 /* sun_path holds 108 bytes with the NUL */

struct listen_addr {
	bool is_unix;
	char host[LISTEN_HOST_MAX + 1]; /* TCP: name or address, no
					 * brackets; "" for every address */
	int port;			/* TCP: 1..65535 */
	char path[LISTEN_PATH_MAX + 1]; /* unix */
};

/* Parse s into *out.  Returns 0, or -1 with a message in err. */
int listen_addr_parse(const char *s, struct listen_addr *out, char *err,
    size_t errlen);

/*
 * True if a and b share an address, so that the second to be bound fails
 * ("Address already in use"): the same unix path (as text), or the same
 * port on the same host, where a name is compared as text (case aside), an
 * IP address as the address it is ("::1" is "0::1"), and 0.0.0.0 or [::]
 * holds every address of its family.  Names are not resolved: a name and
 * the address it resolves to are not found alike; nor is the empty host
 * (every address) alike to an address, since which family's wildcard it
 * binds is the resolver's choice.
 */
bool listen_addr_is_shared(const struct listen_addr *a,
    const struct listen_addr *b);

#endif
