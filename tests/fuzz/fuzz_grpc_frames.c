/*
 * fuzz_grpc_frames.c - libFuzzer target: bytes as read from one client of
 * the gRPC front (src/front/grpc*.c), fed through grpc_fuzz_feed() to a
 * server-side HTTP/2 session with the front's own callbacks: frames,
 * HPACK, gRPC framing, calls decided on the memory store, resets, the
 * limits of docs/grpc.md.  Any input must end without a crash, a leak or
 * undefined behaviour.  The connection preface is prepended to inputs
 * that lack it, so the fuzzer spends its time past it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/decide.h"
#include "front/grpc.h"
#include "store/memory.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char yaml[] =
    "max_header_bytes: 2048\n"
    "max_body_bytes: 1024\n"
    "rules:\n"
    "  - name: per-user\n"
    "    match: { domain: \"edge\" }\n"
    "    key: \"${user}\"\n"
    "    limit: 5\n"
    "    window: 1m\n";

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct config *cfg;
	static struct backend *be;
	static struct decider d;
	size_t plen = sizeof(preface) - 1;
	char err[256];
	uint8_t *buf;

	if (cfg == NULL) {
		cfg = config_load_string("fuzz.yaml", yaml, sizeof(yaml) - 1,
		    err, sizeof(err));
		be = backend_memory_new(1000, NULL, NULL);
		if (cfg == NULL || be == NULL)
			__builtin_trap();
		d.backend = be;
	}
	if (size >= plen && memcmp(data, preface, plen) == 0) {
		(void)grpc_fuzz_feed(cfg, &d, data, size);
		return 0;
	}
	if ((buf = malloc(plen + size)) == NULL)
		return 0;
	memcpy(buf, preface, plen);
	if (size > 0)
		memcpy(buf + plen, data, size);
	(void)grpc_fuzz_feed(cfg, &d, buf, plen + size);
	free(buf);
	return 0;
}
