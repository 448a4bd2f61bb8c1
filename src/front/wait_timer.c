/*
 * wait_timer.c - the one timer of waiting requests (see wait_timer.h).
 *
 * DESIGN
 *
 * A binary min-heap of (due, seq, fn, arg) ordered by due time, then by
 * the order of adding, so waiters due at the same microsecond are answered
 * in arrival order.  One thread sleeps on a condition variable (on
 * CLOCK_MONOTONIC, the clock of util_monotonic_us()) until the earliest
 * due time or an add that comes earlier, pops what is due and runs it
 * with the lock released.  A cut (shutdown) lowers the due time of every
 * entry past its bound to 0, marking it cut, and re-heapifies.
 */
#include "front/wait_timer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

struct wait_entry {
	int64_t due;
	uint64_t seq;
	wait_timer_fn fn;
	void *arg;
	bool cut;
};

struct wait_timer {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	struct wait_entry *heap;
	size_t len, cap;
	uint64_t seq;
	int64_t cut_after; /* INT64_MAX: no cut */
	bool stop;
};

static bool
entry_before(const struct wait_entry *a, const struct wait_entry *b)
{
	return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

static void
heap_up(struct wait_timer *t, size_t i)
{
	struct wait_entry e = t->heap[i];

	while (i > 0 && entry_before(&e, &t->heap[(i - 1) / 2])) {
		t->heap[i] = t->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	t->heap[i] = e;
}

static void
heap_down(struct wait_timer *t, size_t i)
{
	struct wait_entry e = t->heap[i];
	size_t c;

	while ((c = 2 * i + 1) < t->len) {
		if (c + 1 < t->len &&
		    entry_before(&t->heap[c + 1], &t->heap[c]))
			c++;
		if (!entry_before(&t->heap[c], &e))
			break;
		t->heap[i] = t->heap[c];
		i = c;
	}
	t->heap[i] = e;
}

static struct wait_entry
heap_pop(struct wait_timer *t)
{
	struct wait_entry top = t->heap[0];

	t->heap[0] = t->heap[--t->len];
	if (t->len > 0)
		heap_down(t, 0);
	return top;
}

static void *
timer_main(void *arg)
{
	struct wait_timer *t = arg;
	struct wait_entry e;
	struct timespec ts;
	int64_t now;

	pthread_mutex_lock(&t->lock);
	for (;;) {
		if (t->len == 0) {
			if (t->stop)
				break;
			pthread_cond_wait(&t->cond, &t->lock);
			continue;
		}
		now = util_monotonic_us();
		if (t->heap[0].due > now && !t->stop) {
			ts.tv_sec = (time_t)(t->heap[0].due / 1000000);
			ts.tv_nsec = (long)(t->heap[0].due % 1000000) * 1000;
			(void)pthread_cond_timedwait(&t->cond, &t->lock, &ts);
			continue;
		}
		e = heap_pop(t);
		pthread_mutex_unlock(&t->lock);
		e.fn(e.arg, e.cut || t->stop);
		pthread_mutex_lock(&t->lock);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

struct wait_timer *
wait_timer_new(char *err, size_t errlen)
{
	struct wait_timer *t;
	pthread_condattr_t ca;
	int rc;

	if ((t = rl_calloc(1, sizeof(*t))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	t->cut_after = INT64_MAX;
	pthread_mutex_init(&t->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&t->cond, &ca);
	pthread_condattr_destroy(&ca);
	if ((rc = pthread_create(&t->thread, NULL, timer_main, t)) != 0) {
		snprintf(err, errlen, "wait timer thread: %s", strerror(rc));
		pthread_cond_destroy(&t->cond);
		pthread_mutex_destroy(&t->lock);
		rl_free(t);
		return NULL;
	}
	return t;
}

int
wait_timer_add(struct wait_timer *t, int64_t due_us, wait_timer_fn fn,
    void *arg)
{
	struct wait_entry *h;
	size_t cap;

	pthread_mutex_lock(&t->lock);
	if (t->len == t->cap) {
		cap = t->cap == 0 ? 64 : 2 * t->cap;
		if ((h = rl_realloc(t->heap, cap * sizeof(*h))) == NULL) {
			pthread_mutex_unlock(&t->lock);
			return -1;
		}
		t->heap = h;
		t->cap = cap;
	}
	t->heap[t->len].due = due_us;
	t->heap[t->len].seq = t->seq++;
	t->heap[t->len].fn = fn;
	t->heap[t->len].arg = arg;
	t->heap[t->len].cut = false;
	if (due_us > t->cut_after) {
		t->heap[t->len].due = 0;
		t->heap[t->len].cut = true;
	}
	heap_up(t, t->len++);
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
	return 0;
}

void
wait_timer_cut(struct wait_timer *t, int64_t until_us)
{
	size_t i;

	pthread_mutex_lock(&t->lock);
	if (until_us < t->cut_after)
		t->cut_after = until_us;
	for (i = 0; i < t->len; i++) {
		if (t->heap[i].due > until_us) {
			t->heap[i].due = 0;
			t->heap[i].cut = true;
		}
	}
	for (i = t->len / 2 + 1; i-- > 0;)
		if (i < t->len)
			heap_down(t, i);
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
}

size_t
wait_timer_pending(struct wait_timer *t)
{
	size_t n;

	pthread_mutex_lock(&t->lock);
	n = t->len;
	pthread_mutex_unlock(&t->lock);
	return n;
}

void
wait_timer_free(struct wait_timer *t)
{
	if (t == NULL)
		return;
	pthread_mutex_lock(&t->lock);
	t->stop = true;
	pthread_cond_signal(&t->cond);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->thread, NULL);
	pthread_cond_destroy(&t->cond);
	pthread_mutex_destroy(&t->lock);
	rl_free(t->heap);
	rl_free(t);
}
