/*
 * memory.h - the in-process store (backend_memory.c): every algorithm of
 * core/limiter.c behind the core/backend.h interface, answering inline.
 * Used as the configured store (redis absent) and as the local fallback
 * of on_backend_error: local.
 */
#ifndef RL_STORE_MEMORY_H
#define RL_STORE_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

/*
 * The in-process store.  max_keys bounds the number of live keys (expired
 * keys are reclaimed first; a full store answers BACKEND_ERR_FULL).  clock
 * returns microseconds on a scale that never steps back; NULL means a
 * struct memory_clock over util_realtime_us and util_monotonic_us, made
 * when the store is.  Returns a new backend, or NULL (OOM).
 */
typedef int64_t (*backend_clock_fn)(void *arg);
struct backend *backend_memory_new(int64_t max_keys, backend_clock_fn clock,
    void *clock_arg);
/*
 * The store's clock when none is injected (docs/algorithms.md, "Common
 * ground"): the wall clock read once by memory_clock_init, then moved on by
 * the monotonic clock.  Its times are microseconds since the epoch, as the
 * Redis store's are (within the drift since init), and never step back when
 * the wall clock is stepped (NTP, an operator): a stored window start or
 * theoretical arrival time read as being in the future would refuse a key
 * for the length of the step.  realtime and monotonic are the sources
 * (util_realtime_us and util_monotonic_us outside tests).  memory_clock_read
 * is a backend_clock_fn whose arg is a struct memory_clock, owned by the
 * caller.  Init on one thread; read from any thread after.
 */
struct memory_clock {
	int64_t (*monotonic)(void);
	int64_t offset; /* realtime - monotonic at init */
};
void memory_clock_init(struct memory_clock *c, int64_t (*realtime)(void),
    int64_t (*monotonic)(void));
int64_t memory_clock_read(void *arg);

/* Live keys now (for tests and metrics): sweeps every stripe first, so
 * that only keys not yet expired are counted.  Any thread. */
size_t backend_memory_key_count(struct backend *b);
/*
 * Entries the store holds now, expired ones not yet freed included, without
 * sweeping anything (for tests and metrics: what the store costs in memory).
 * When chains is not NULL, *chains is the number of hash chains of every
 * stripe's table (each a pointer), read under each stripe's lock in turn.
 * Any thread.
 */
size_t backend_memory_held(struct backend *b, size_t *chains);
/*
 * Entries the sweeping could pass over (for tests): one that expires
 * before its stripe's soonest time, or, in a chain the stripe's current
 * round has swept, before that round's least expiry.  0 when every entry
 * will be freed once expired, by traffic alone.  Any thread.
 */
size_t backend_memory_unswept(struct backend *b);

#endif
