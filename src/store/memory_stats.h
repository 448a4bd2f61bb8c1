/*
 * memory_stats.h - the stat keys of the in-process store (docs/stats.md):
 * one stats_window per key, found by its store key, expiring like the
 * Redis store's sub-window keys.  backend_memory.c hands it the stat calls.
 *
 * Thread: any; one mutex guards the whole table (a stat call is a few
 * microseconds of work, and stat traffic is small beside decisions).
 */
#ifndef RL_MEMORY_STATS_H
#define RL_MEMORY_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

struct memory_stats;

/* A new table of at most max_keys keys (< 1: no bound), or NULL (OOM). */
struct memory_stats *memory_stats_new(int64_t max_keys);
/* memory_stats_free(NULL) does nothing. */
void memory_stats_free(struct memory_stats *ms);

/*
 * Run op at now_us (the store's clock): record (if op->record), then read
 * into *out.  Returns 0, or -1 with *kind and a message in err (out of
 * memory: BACKEND_ERR_PROTOCOL; the table at max_keys: BACKEND_ERR_FULL);
 * nothing is recorded then.
 */
int memory_stats_run(struct memory_stats *ms, const struct rl_stat_op *op,
    int64_t now_us, struct rl_stat_result *out, enum backend_error_kind *kind,
    char *err, size_t errlen);

/* Full sweeps made because the table was at max_keys (at most one a
 * second of the store's clock); for tests. */
uint64_t memory_stats_full_sweeps(struct memory_stats *ms);

/* Live stat keys now (sweeps the expired ones first). */
size_t memory_stats_key_count(struct memory_stats *ms, int64_t now_us);

/* The entries held now, expired ones included: nothing is swept (tests). */
size_t memory_stats_held(struct memory_stats *ms);

#endif
