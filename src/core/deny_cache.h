/*
 * deny_cache.h - keys the store denied lately, so that requests that are
 * sure to be denied again are answered without a store call.
 *
 * A key denied with retry_after R for cost c stays denied for a request of
 * the same cost until R has passed: units only leave the window with time,
 * and other traffic can only push that time later.  So an entry can only
 * say "denied", with the retry_after the store would give, if the time it
 * is given is no later than when the store decided (decide.c passes the
 * time the call was sent, and R less the millisecond rounding).  Another
 * cost goes to the store: a smaller one may fit, and a larger one may have
 * to wait longer than R (more units must leave).  What was left at the
 * denial (less than the cost, maybe more than 0) is answered as the store
 * said it; other traffic may have used some of it since, as it may right
 * after any answer.
 *
 * A fixed table of slots, direct-mapped by a hash of the store key: a new
 * key replaces whatever held its slot, so memory is bounded by the number
 * of slots and the key length, whatever keys clients send.  Entries of
 * shadow rules are never put (decide.c).  An entry is for one limit and
 * window too (an override's, docs/admin.md, or the rule's): a lookup
 * under another misses, and a put under another replaces it.
 *
 * Each slot has a stamp, moved on by every clear and by a forget of a key
 * of the slot.  A caller reads the stamp of a key when it asks the store,
 * and gives it to deny_cache_put(), which drops a denial asked before
 * (the key's units may have been freed after the store decided).
 *
 * Each entry carries the generation it was learnt under: the serial of the
 * config (config.h) whose rules the store applied.  A lookup of another
 * generation misses, so a denial decided under the old rules whose answer
 * comes back after a reload is never given under the new limits
 * (docs/operations.md); a reload also clears the table, to free it.
 *
 * Thread: any, concurrently (striped mutexes).  Pure: no I/O.
 */
#ifndef RL_DENY_CACHE_H
#define RL_DENY_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct deny_cache;

/* A table of `slots` entries (rounded up to a power of two); NULL on OOM.
 * deny_cache_free(NULL) does nothing. */
struct deny_cache *deny_cache_new(size_t slots);
void deny_cache_free(struct deny_cache *dc);

/* Forget every entry (a reload, an admin reset: docs/admin.md; notices
 * of take-backs that may have gone unheard); every slot's stamp moves on.
 * NULL dc: nothing. */
void deny_cache_clear(struct deny_cache *dc);

/* Forget key's entry, whatever its limit and window, and move its slot's
 * stamp on: units of key were given back (a Redis Cluster take-back,
 * docs/algorithms.md), so a denial the store decided before may no longer
 * hold.  Call it once they are back.  NULL dc: nothing. */
void deny_cache_forget(struct deny_cache *dc, const char *key, size_t keylen);

/* The stamp of key's slot: read it before the store is asked about key,
 * and give it to deny_cache_put(). */
uint64_t deny_cache_stamp(const struct deny_cache *dc, const char *key,
    size_t keylen);

/* The times of a denial, on the caller's clock. */
struct deny_times {
	int64_t until_us;     /* denied for this cost until then */
	int64_t reset_us;     /* the whole limit is free again */
	int64_t effective_us; /* more quota comes back (RateLimit t) */
	int64_t remaining;    /* what the store said was left */
};

/* Remember that key, under limit and window_ms, for cost, is denied with
 * the times *t, under the rules of generation gen (the serial of the
 * request's config), asked of the store when deny_cache_stamp() said
 * stamp; nothing if a clear or a forget of its slot has begun since. */
void deny_cache_put(struct deny_cache *dc, uint64_t gen, uint64_t stamp,
    const char *key, size_t keylen, int64_t limit, int64_t window_ms,
    int64_t cost, const struct deny_times *t);

/*
 * Is key, under limit and window_ms, denied for cost at now_us, under the
 * rules of generation gen?  True with the times of its entry in *t; false
 * if there is no live entry, or it is for another limit, window or cost or
 * was learnt under another generation.
 */
bool deny_cache_get(struct deny_cache *dc, uint64_t gen, const char *key,
    size_t keylen, int64_t limit, int64_t window_ms, int64_t cost,
    int64_t now_us, struct deny_times *t);

/* Count one request answered from the cache (deny_cache_get() may answer
 * for a check of a request that then goes to the store). */
void deny_cache_count_hit(struct deny_cache *dc);

/* Requests counted by deny_cache_count_hit(), since the start. */
uint64_t deny_cache_hits(const struct deny_cache *dc);

#endif
