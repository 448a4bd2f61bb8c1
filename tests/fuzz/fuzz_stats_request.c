/*
 * fuzz_stats_request.c - libFuzzer target: a /record or /stats body
 * (src/core/stats_request.c) under a config with keyed, matched and
 * catch-all stats, then the answer built from made-up results.  Any input
 * must give ops or a 400/500 error, never a crash, a leak or undefined
 * behaviour; every op must be in bounds, and the answer JSON.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/config.h"
#include "core/stats_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char yaml[] =
    "stats:\n"
    "  - name: lat\n"
    "    match: { route: \"/api/*\" }\n"
    "    key: \"${upstream}:${route}\"\n"
    "    window: 1m\n"
    "  - name: all\n"
    "    window: 10s\n"
    "    resolution: 1s\n"
    "    relative_accuracy: 0.001\n";

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct config *cfg;
	struct stats_request sr;
	struct request_error e;
	char err[256], *text;
	json_t *doc;
	size_t i, j, len;
	int pass;

	if (cfg == NULL &&
	    (cfg = config_load_string("f.yaml", yaml, strlen(yaml), err,
		 sizeof(err))) == NULL)
		abort();
	for (pass = 0; pass < 2; pass++) {
		if (stats_request_prepare(&sr, cfg, (const char *)data, size,
			pass == 0, &e) == 0) {
			if (sr.n > cfg->nstats ||
			    sr.nquantiles > RL_STATS_MAX_QUANTILES)
				__builtin_trap();
			for (i = 0; i < sr.n; i++) {
				const struct rl_stat_op *op = &sr.ops[i];

				if (op->keylen != strlen(op->key) ||
				    sr.calls[i].stat != op)
					__builtin_trap();
				sr.results[i].count = i;
				sr.results[i].sum = op->value;
				sr.results[i].min = -op->value;
				sr.results[i].max = op->value;
				for (j = 0; j < op->nquantiles; j++)
					sr.results[i].q[j] = op->quantiles[j];
			}
			/* The answer is written by hand: it must be JSON. */
			if ((text = stats_request_answer(&sr, &len)) != NULL) {
				if (strlen(text) != len ||
				    (doc = json_loads(text, 0, NULL)) == NULL)
					__builtin_trap();
				json_decref(doc);
				free(text);
			}
		} else if (e.status != 400 && e.status != 500)
			__builtin_trap();
		stats_request_clear(&sr);
	}
	return 0;
}
