/*
 * fuzz_config.c - libFuzzer target: the YAML loader (src/core/config.c)
 * on any text: a config or a "FILE:LINE:COL: message", never a crash or a
 * leak.  A loaded config is also compared with itself for reload.
 */
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
none(const char *key, void *arg)
{
	(void)key;
	(void)arg;
	__builtin_trap(); /* a config differs from itself */
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512];
	struct config *c = config_load_string("f.yaml", (const char *)data,
	    size, err, sizeof(err));

	if (c != NULL) {
		config_start_only_changes(c, c, none, NULL);
		config_unref(c);
	}
	return 0;
}
