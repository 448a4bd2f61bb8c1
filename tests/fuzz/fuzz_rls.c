/*
 * fuzz_rls.c - libFuzzer target: bytes as a gRPC ShouldRateLimit message
 * (src/front/rls.c) decoded into attribute groups, decided on the memory
 * store under a small config, and the answer encoded and read back.  Any
 * input must give an answer or an INVALID_ARGUMENT, never a crash, a leak
 * or undefined behaviour; an encoded answer has one status per descriptor.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/decide.h"
#include "front/rls.h"
#include "rls.pb-c.h"
#include "base/util.h"
#include "store/memory.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char yaml[] =
    "rules:\n"
    "  - name: per-user\n"
    "    match: { domain: \"edge\" }\n"
    "    key: \"${user}\"\n"
    "    limit: 5\n"
    "    window: 1m\n"
    "  - name: per-route\n"
    "    key: \"${route}|${user}\"\n"
    "    limit: 3\n"
    "    window: 10s\n"
    "    algorithm: token_bucket\n";

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct config *cfg;
	static struct backend *be;
	static struct decider d;
	static struct rls_call c;
	Envoy__Service__Ratelimit__V3__RateLimitResponse *r;
	char err[256];
	uint8_t *out;
	size_t outlen;

	if (cfg == NULL) {
		cfg = config_load_string("fuzz.yaml", yaml, sizeof(yaml) - 1,
		    err, sizeof(err));
		be = backend_memory_new(1000, NULL, NULL);
		if (cfg == NULL || be == NULL)
			__builtin_trap();
		d.backend = be;
	}
	memset(&c, 0, sizeof(c));
	if (rls_decode(&c, data, size, 64, err, sizeof(err)) == 0) {
		if (c.n > 0)
			(void)decide(&d, cfg, &c.req, &c.decision);
		else
			c.decision.allowed = true;
		if (rls_encode(&c, 5, &out, &outlen, err, sizeof(err)) ==
		    GRPC_OK) {
			r = envoy__service__ratelimit__v3__rate_limit_response__unpack(
			    NULL, outlen - 5, out + 5);
			if (r == NULL || r->n_statuses != c.n)
				__builtin_trap();
			envoy__service__ratelimit__v3__rate_limit_response__free_unpacked(
			    r, NULL);
			rl_free(out);
		}
	}
	rls_call_clear(&c);
	return 0;
}
