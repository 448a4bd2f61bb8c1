/*
 * prefetch.h - the quota one daemon holds in advance (docs/algorithms.md,
 * "Taking quota in advance"): per store key, the units taken in chunks and
 * not used yet, until when they may be used, and what the store said when
 * they were taken.  decide.c takes from it in decide_prepare() before any
 * store call, puts back what a request denied elsewhere did not use, and
 * adds what a chunk brought.
 *
 * Pure bookkeeping: no I/O, times are the caller's (monotonic
 * microseconds).  Memory is bounded: at most the max_keys given to
 * prefetch_new(); a chunk that finds no room is not kept (its units are
 * reported lost).
 *
 * Threads: every function may be called from any thread at once (one
 * mutex per stripe of keys).  Units that leave unused (the hold ended,
 * prefetch_clear(), no room) are reported through the lost callback, which
 * may run with a stripe's lock held and must not call back in here.
 */
#ifndef RL_PREFETCH_H
#define RL_PREFETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct prefetch;

/* Called with the rule's name and a number of units that left unused.
 * May be NULL. */
typedef void (*prefetch_lost_fn)(const char *rule, int64_t units, void *arg);

/* What the store answered for the chunk a holding came from: what a
 * request admitted from it reports (decide.c). */
struct prefetch_view {
	int64_t remaining; /* the store's remaining after the chunk, plus
			    * what is still held after this request */
	int64_t reset_ms, effective_ms; /* the store's, less the time since */
	int64_t until;			/* the deadline of the units taken */
};

/*
 * New holdings for at most max_keys keys (>= 1), of generation gen: the
 * serial of the config (config.h) whose rules they are taken under.
 * Every function below takes the caller's generation, that of the config
 * its request was prepared with; one that is not the holdings' holds
 * nothing, takes nothing, and what it would add or put back is lost.
 * NULL when out of memory.  lost/arg: see prefetch_lost_fn (borrowed).
 */
struct prefetch *prefetch_new(size_t max_keys, uint64_t gen,
    prefetch_lost_fn lost, void *arg);

/* Report every unit held as lost and free everything.  NULL: nothing. */
void prefetch_free(struct prefetch *pf);

/*
 * Take cost units of key at now, if at least that many are held and their
 * deadline has not passed: true, and *view (may be NULL) filled for the
 * answer.  An expired holding is dropped (its units reported lost).
 */
bool prefetch_take(struct prefetch *pf, uint64_t gen, const char *key,
    size_t keylen, int64_t cost, int64_t now, struct prefetch_view *view);

/*
 * The forget stamp of key now: read before units of key are taken, and
 * before a call that may bring a chunk of key leaves, and given back to
 * prefetch_put_back() and prefetch_add(), which keep nothing if a
 * prefetch_forget() that may concern key ran since (see there).
 */
uint64_t prefetch_stamp(struct prefetch *pf, const char *key, size_t keylen);

/* Give back cost units prefetch_take() gave (with view->until) for a
 * request that was not admitted: they join the key's holding, whose
 * deadline becomes the earlier of the two, if until has not passed, the
 * key still has a holding and no forget ran since stamp (read before the
 * take); else they are reported lost (for rule). */
void prefetch_put_back(struct prefetch *pf, uint64_t gen, const char *rule,
    const char *key, size_t keylen, int64_t cost, int64_t until, int64_t now,
    uint64_t stamp);

/*
 * Should a check of cost units on key, of a request prepared under gen,
 * ask the store for a chunk at now?  Only while the daemon holds fewer
 * than cost units of key: units held answer only the requests they answer
 * whole, and a chunk asked for beside them would be taken and left to
 * expire on every call of a request that also needs the store.  And only
 * when units of key could be held: it has a holding, or its stripe has
 * room (expired holdings swept), since a chunk with no room is lost and
 * its key would have no quota left for the rest of the hold.  A gen that
 * is not the holdings': false (such a chunk is lost).
 */
bool prefetch_wants_chunk(struct prefetch *pf, uint64_t gen, const char *key,
    size_t keylen, int64_t cost, int64_t now);

/*
 * Hold units of key (rule: its rule's name, copied) until the monotonic
 * time `until`, from a chunk whose store answer had remaining, reset_ms and
 * effective_ms, received at now, of a call that left at sent, after stamp
 * was read.  Units already held for the key stay, with the earlier of the
 * two deadlines.  No room, or a forget that may concern key ran since
 * stamp: the units are reported lost, and -1 returned.  Else the
 * remaining the request that took the chunk answers, on the terms of
 * prefetch_take()'s view: the store answer's remaining plus the units held
 * now, or, when the holding has the answer of a call that left later
 * (answers may settle out of order), that one's (which is then kept).
 */
int64_t prefetch_add(struct prefetch *pf, uint64_t gen, const char *rule,
    const char *key, size_t keylen, int64_t units, int64_t until, int64_t sent,
    int64_t now, int64_t remaining, int64_t reset_ms, int64_t effective_ms,
    uint64_t stamp);

/*
 * A plain check of key (no chunk) was admitted by the store with
 * remaining, reset_ms and effective_ms, received at now, of a call that
 * left at sent, after stamp was read: if the daemon holds units of key,
 * their answers start from this one (the store's remaining already counts
 * them) unless the holding has the answer of a call that left later.
 * Returns the remaining the request answers, as prefetch_add() does, or
 * -1 when nothing of key is held (the store's remaining stands).
 */
int64_t prefetch_refresh(struct prefetch *pf, uint64_t gen, const char *key,
    size_t keylen, int64_t sent, int64_t now, int64_t remaining,
    int64_t reset_ms, int64_t effective_ms, uint64_t stamp);

/*
 * Drop every holding whose deadline has passed (or of an older
 * generation), reporting its units lost: so that the lost count is up to
 * date when it is read (GET /metrics), not only at the key's next use.
 * Walks every holding (at most the max_keys of prefetch_new()), one
 * stripe's lock at a time.  NULL pf: nothing.
 */
void prefetch_sweep(struct prefetch *pf, int64_t now);

/* Drop everything held (a reload: the rules may have changed), reporting
 * the units lost; from now on the holdings are of generation gen (the new
 * config's serial). */
void prefetch_clear(struct prefetch *pf, uint64_t gen);

/* Drop what is held for key, reporting it lost: its counter was reset
 * (docs/admin.md), so the units taken from it are no longer counted
 * there.  A chunk still in flight may have been recorded before the reset
 * too: the forget stamp of key (and of the keys that share its stripe)
 * moves on, so that what a call that left before brings back or puts back
 * is lost, not held.  Call it once the reset is done.  NULL pf: nothing. */
void prefetch_forget(struct prefetch *pf, const char *key, size_t keylen);

/* prefetch_forget() of every key: drop everything held, reporting it
 * lost, and move every stripe's forget stamp on.  For a reset that may
 * have gone unheard (the notices' subscription was down and is back:
 * docs/admin.md).  The generation stays.  NULL pf: nothing. */
void prefetch_forget_all(struct prefetch *pf);

/* Units held now for key (tests). */
int64_t prefetch_held(struct prefetch *pf, const char *key, size_t keylen,
    int64_t now);

#endif
