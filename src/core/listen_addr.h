/*
 * listen_addr.h - the `listen` address of the config (docs/configuration.md):
 * "host:port", "[v6]:port" or "unix:/path", parsed and bounded without a
 * socket, so that --check refuses exactly what start-up would (a port past
 * 65535, a host name past 255 bytes, a unix path too long for sun_path).
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

#endif
