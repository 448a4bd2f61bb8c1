/*
 * stats_request.h - POST /record and POST /stats (docs/stats.md) without the
 * HTTP: the JSON body into the stat ops a store runs, and the store's
 * results into the JSON answer.  Every check is made before the first op
 * is handed to a store, so a bad request records nothing.
 *
 * Pure: no I/O (jansson for JSON).  A stats_request is used by one thread
 * at a time; its ops and results stay put until it is freed, so a store
 * may hold them while the caller's connection waits.
 */
#ifndef RL_STATS_REQUEST_H
#define RL_STATS_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/request_json.h"

struct stats_request {
	bool record;  /* /record, else /stats */
	double value; /* /record */
	double quantiles[RL_STATS_MAX_QUANTILES];
	size_t nquantiles;
	struct attrs attrs;

	/* The stats that apply, in config order: n of each. */
	size_t n;
	const struct stat_def **defs; /* borrowed from the config */
	char **keys;		      /* the rendered keys, for the answer */
	char **store_keys;	      /* "<prefix>stat:<name>:{<key>}" */
	struct rl_stat_op *ops;
	struct rl_stat_result *results;
	struct backend_call *calls; /* one per op, for the caller */
};

/*
 * The fields of a /record or /stats body that are not attributes
 * (docs/stats.md): value, stat and quantiles, NULL-terminated.  The config
 * refuses these names as a stat's attributes (config_stats.c).
 */
extern const char *const stats_request_reserved[];

/*
 * Parse body (len bytes) for /record (record) or /stats under cfg
 * (borrowed until sr is freed), and prepare one op per applying stat.
 * Returns 0 (sr->n may be 0), or -1 with *e set: invalid_json,
 * invalid_attribute, too_many_attributes, invalid_value, invalid_quantiles,
 * unknown_stat, key_too_long (400), internal_error (500).  sr is zeroed
 * first; free it with stats_request_clear() either way.
 */
int stats_request_prepare(struct stats_request *sr, const struct config *cfg,
    const char *body, size_t len, bool record, struct request_error *e);

/*
 * The name a quantile q in [0, 1] answers under: "p" and q in percent,
 * the shortest decimal that reads back as q ("p50", "p99.9", "p0",
 * "p100"), so distinct quantiles have distinct names.  Into buf, which
 * STATS_QUANTILE_NAME_MAX bytes hold for any q (the smallest, 5e-324, is
 * "p0." and 321 zeros and "5").  Any thread.
 */
#define STATS_QUANTILE_NAME_MAX 352
void stats_quantile_name(char *buf, size_t len, double q);

/*
 * A stat value x as the answer writes it (docs/stats.md "HTTP"), into buf
 * (STATS_NUMBER_MAX bytes, NUL-terminated); returns the length.  A whole
 * number below 2^53 in magnitude is an integer ("912"; -0.0 is "0").  Any
 * other is the shortest of %.15g, %.16g and %.17g that strtod reads back
 * as x bit for bit ("41.7", where %.17g says 41.700000000000003), as
 * jansson writes a real: the exponent without '+' or leading zeros
 * ("1e300", "1e-7"), ".0" after a number with neither point nor
 * exponent ("9007199254740994.0").  A NaN or an infinity, which no store
 * answers, is "null".  Any thread.
 */
#define STATS_NUMBER_MAX 32
size_t stats_number_text(char *buf, double x);

/*
 * The answer once every op has its result: {"stats": [...]} as docs/stats.md
 * says, in a new NUL-terminated buffer (free()) of *len bytes, or NULL
 * (OOM).
 */
char *stats_request_answer(const struct stats_request *sr, size_t *len);

/* Free what sr owns; sr is then zeroed.  NULL does nothing. */
void stats_request_clear(struct stats_request *sr);

#endif
