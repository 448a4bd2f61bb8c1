/*
 * redis_script.h - lua/ratelimit.lua's calling convention: a batch of
 * requests into the arguments of one EVALSHA, and its reply back into each
 * request's results.  No I/O: the Redis store (backend_redis.c) sends what
 * this builds, and tests and fuzzers can drive it alone.
 *
 * Thread: any; nothing is shared.
 */
#ifndef RL_REDIS_SCRIPT_H
#define RL_REDIS_SCRIPT_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/hiredis.h>

#include "core/backend.h"

/* The arguments of one EVALSHA, in one block (argv, lens, and the
 * numbers they point to): the struct's own when they fit, which a batch of
 * one rule or of one set of rules does (no malloc of a large block per
 * script call: docs/operations.md), else one allocation.  Keys and the
 * SHA are borrowed from the caller.  Not to be copied: argv may point
 * into it. */
#define REDIS_SCRIPT_ARGS_INLINE 4096
struct redis_script_args {
	const char **argv;
	size_t *lens;
	int argc;
	union {
		max_align_t align;
		char bytes[REDIS_SCRIPT_ARGS_INLINE];
	} own;
};

/*
 * EVALSHA sha nkeys keys... [marks] R n_1..n_R args... for the
 * calls[0..ncalls-1] (each with n >= 1 checks), borrowed until the args are
 * freed; when every call has the same checks (one sliding_log check, or
 * a few of sliding_log, fixed_window and token_bucket on keys that differ,
 * with the same limits, windows and costs; none shadow or taking a chunk,
 * no call waiting or a report), EVALSHA sha nkeys keys... [marks] same n
 * and five values for each of the n checks of one call.  With marks the
 * script also says where each check recorded (into rl_result.mark, for
 * lua/takeback.lua).  Returns 0, or -1 (out of memory, or too many arguments).
 */
int redis_script_encode(struct backend_call *const *calls, size_t ncalls,
    const char *sha, bool marks, struct redis_script_args *a);
void redis_script_args_free(struct redis_script_args *a);

/*
 * Check the reply to a batch of ncalls requests with counts[i] checks each,
 * then fill out[] and all_allowed of every calls[i] that is not NULL (a
 * NULL call was answered already; its part of the reply is skipped).
 * Returns 0, or -1 with a message in err and no call touched.
 */
int redis_script_decode(const redisReply *r, struct backend_call *const *calls,
    const size_t *counts, size_t ncalls, bool marks, char *err, size_t errlen);

/* The arguments of one stats.lua call (docs/stats.md), in one allocation;
 * the key and the script or SHA are borrowed. */
struct redis_stats_args {
	const char **argv;
	size_t *lens;
	int argc;
};

/*
 * EVALSHA sha 1 key window resolution accuracy record value q... for op,
 * or EVAL script ... when script is not NULL.  Returns 0, or -1 (out of
 * memory).
 */
int redis_stats_encode(const struct rl_stat_op *op, const char *script,
    const char *sha, struct redis_stats_args *a);
void redis_stats_args_free(struct redis_stats_args *a);

/* Check stats.lua's reply to op and fill *out.  Returns 0, or -1 with a
 * message in err (*out then untouched). */
int redis_stats_decode(const redisReply *r, const struct rl_stat_op *op,
    struct rl_stat_result *out, char *err, size_t errlen);

#endif
