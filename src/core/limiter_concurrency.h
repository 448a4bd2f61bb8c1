/*
 * limiter_concurrency.h - the concurrency algorithm (leases) of
 * docs/algorithms.md on one key's state, for limiter.c, which dispatches
 * to these as it does to its own algorithms.  Not for other callers: they
 * use limiter.h.
 *
 * Pure, like limiter.c: the caller passes `now` and serialises every call
 * on one state.
 */
#ifndef RL_LIMITER_CONCURRENCY_H
#define RL_LIMITER_CONCURRENCY_H

#include "core/limiter.h"

void conc_clear(struct limiter_state *s);
int conc_check(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool *allowed, char *err, size_t errlen);
void conc_record(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost);
void conc_result(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool allowed, struct rl_result *out);
int64_t conc_expiry(const struct limiter_state *s);
size_t conc_bytes(const struct limiter_state *s);

#endif
