/*
 * fuzz_client_ip.c - libFuzzer target: the client address of /auth from
 * X-Real-IP, X-Forwarded-For and the peer (src/core/client_ip.c) under
 * every policy.  The input is split at the first two NUL bytes into the
 * three values; its first byte picks the policy.  The answer must be an
 * address that normalizes to itself, or none.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/client_ip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct client_ip_policy p;
	char *buf, *real, *xff, *peer, out[CLIENT_IP_MAX], again[CLIENT_IP_MAX];
	size_t n;

	if (size < 1)
		return 0;
	p.source = (enum client_ip_source)(data[0] % 4);
	p.xff_trusted_hops = (data[0] >> 2) % 8;
	p.ipv6_prefix = 1 + (int)((data[0] >> 5) * 18) % 128;
	if ((buf = malloc(size + 2)) == NULL)
		return 0;
	memcpy(buf, data + 1, size - 1);
	buf[size - 1] = buf[size] = buf[size + 1] = '\0';
	real = buf;
	n = strlen(real);
	xff = real + n + (n < size - 1 ? 1 : 0);
	n = strlen(xff);
	peer = xff + n + 1 <= buf + size ? xff + n + 1 : xff + n;
	if (client_ip_pick(&p, *real ? real : NULL, *xff ? xff : NULL,
		*peer ? peer : NULL, out, sizeof(out)) == 0) {
		/* An answer is already canonical (IPv4: itself). */
		if (strchr(out, ':') == NULL &&
		    (client_ip_normalize(out, strlen(out), 128, again,
			 sizeof(again)) != 0 ||
			strcmp(out, again) != 0))
			__builtin_trap();
	}
	free(buf);
	return 0;
}
