/*
 * wait_timer.h - one timer for every request that waits for its turn
 * (docs/waiting.md): a min-heap of due times served by one thread, so a
 * waiting request holds no thread of its own, only a heap slot.  The HTTP
 * front end (http.c) arms it when the store reserved a time for a request
 * and resumes the suspended connection when it fires.
 *
 * Ownership: the timer owns its heap and thread; the args are the
 * caller's, borrowed until their callback ran.  Threads: every function
 * may be called from any thread; callbacks run on the timer's thread, one
 * at a time, without the timer's lock held (a callback may add).
 */
#ifndef RL_WAIT_TIMER_H
#define RL_WAIT_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct wait_timer;

/* Called once per added entry: at its due time (cut false), or at once
 * when wait_timer_cut() or wait_timer_free() moved it up (cut true). */
typedef void (*wait_timer_fn)(void *arg, bool cut);

/* A new timer with its thread running; NULL with a message in err. */
struct wait_timer *wait_timer_new(char *err, size_t errlen);

/* Run fn(arg, ...) at monotonic time due_us (util_monotonic_us()).
 * Returns 0, or -1 when out of memory (fn will not run). */
int wait_timer_add(struct wait_timer *t, int64_t due_us, wait_timer_fn fn,
    void *arg);

/* Shutdown: entries due after until_us, and any added later that are,
 * run at once with cut true; the others keep their time. */
void wait_timer_cut(struct wait_timer *t, int64_t until_us);

/* Entries not yet run. */
size_t wait_timer_pending(struct wait_timer *t);

/* Run every entry left at once (cut true), stop the thread, free.
 * wait_timer_free(NULL) does nothing. */
void wait_timer_free(struct wait_timer *t);

#endif
