/*
 * lease_wait.h - requests that wait for a lease to be freed (docs/leases.md
 * with wait_ms): a queue per concurrency key, in arrival order, and one
 * thread that says when the first waiter of a key should try again.
 *
 * A request denied by a concurrency rule cannot know when it would fit: a
 * lease may be released at any moment, by any daemon.  So it waits here
 * until one of: a release of its key (lease_wait_released(), from this
 * daemon's /release or from the store's notice of another daemon's), the
 * expiry of the key's oldest lease (the time its denial gave), a change
 * that may have made room anywhere (lease_wait_all(): a reload, an
 * override, notices that went unheard), or its own deadline.  Only the first
 * waiter of a key tries again; while it tries, the others keep their places, so
 * a daemon serves its own waiters in arrival order.  The HTTP front end
 * (http.c) owns the requests and does the trying; this module only schedules.
 *
 * A waiter is told one event per wait (fn):
 *   LEASE_WAIT_TRY      try again now; it keeps its place until it calls
 *                       lease_wait_park() again (still denied) or
 *                       lease_wait_leave() (done);
 *   LEASE_WAIT_TIMEOUT  its deadline came; it has left the queue;
 *   LEASE_WAIT_CUT      the daemon is stopping; it has left the queue.
 *
 * Keys are the 64-bit hashes of store keys (lease_key_hash()): two keys
 * with one hash share a queue, which costs a needless try, never a wrong
 * answer.
 *
 * Ownership: the module owns its queues and thread; a waiter is the
 * caller's memory, borrowed from lease_wait_park() until its event (or
 * its lease_wait_leave()).  Threads: every function may be called from
 * any thread; fn runs on the module's thread without its lock held, and
 * may call back in.
 */
#ifndef RL_LEASE_WAIT_H
#define RL_LEASE_WAIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum lease_wait_event { LEASE_WAIT_TRY, LEASE_WAIT_TIMEOUT, LEASE_WAIT_CUT };

struct lease_waiter;
typedef void (*lease_wait_fn)(struct lease_waiter *w, enum lease_wait_event ev);

struct lease_queue;

/* Embedded in the caller's request.  Set fn before the first park; the
 * rest is the module's. */
struct lease_waiter {
	lease_wait_fn fn;

	struct lease_queue *q; /* NULL: not queued */
	struct lease_waiter *prev, *next;
	int64_t retry_us; /* first of its key: try then */
	int64_t deadline_us;
	bool trying; /* told TRY, not parked again yet */
};

struct lease_wait;

/* A new scheduler with its thread running; NULL with a message in err. */
struct lease_wait *lease_wait_new(char *err, size_t errlen);

/*
 * w waits for a lease of key to be freed: at the end of the queue, or at
 * its own place when it is there already (after a TRY).  retry_us is when
 * the key's oldest lease expires (monotonic; INT64_MAX: unknown: a new
 * first waiter then tries at once), and deadline_us when w gives up.
 * since_us is when the denial that makes w wait was asked of the store: a
 * release heard since may have come too late for it, so a new first
 * waiter tries at once then too.  Returns 0; -1 when the daemon is
 * stopping, -2 when out of memory (w is not queued; no event will come).
 */
int lease_wait_park(struct lease_wait *lw, struct lease_waiter *w, uint64_t key,
    int64_t retry_us, int64_t deadline_us, int64_t since_us);

/* w is done (it got its lease, failed, or gives up): it leaves its queue,
 * and the next waiter of its key tries at once.  Not queued: no-op. */
void lease_wait_leave(struct lease_wait *lw, struct lease_waiter *w);

/* A lease of key was freed: its first waiter tries again. */
void lease_wait_released(struct lease_wait *lw, uint64_t key);

/* Releases may have gone unseen (the store's notices were lost for a
 * while), or the limits changed (a reload, an override set or deleted
 * here or heard of from another daemon): the first waiter of every key
 * tries again, once (a waiter that parks later, denied before this call,
 * tries at once too).  It only takes the module's lock, never tells a
 * waiter itself: callers are the Redis I/O thread (release notices), the
 * main thread (reload), the admin API's connection threads (override
 * writes) and the overrides sync thread (another daemon's overrides);
 * any other thread may call it too. */
void lease_wait_all(struct lease_wait *lw);

/* Is a request waiting for any of the n keys?  (A newcomer that may wait
 * then queues behind it.)  On true, *key is one such key. */
bool lease_wait_any(struct lease_wait *lw, const uint64_t *keys, size_t n,
    uint64_t *key);

/* Stopping: every waiter is told CUT now, and later parks fail. */
void lease_wait_cut(struct lease_wait *lw);

/* Waiters queued now. */
size_t lease_wait_count(struct lease_wait *lw);

/* Stop the thread and free, once every waiter is gone (after
 * lease_wait_cut() and their answers); any left are dropped untold.
 * NULL does nothing. */
void lease_wait_free(struct lease_wait *lw);

#endif
