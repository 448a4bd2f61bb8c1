/*
 * lease_wait.c - requests waiting for a lease to be freed (see
 * lease_wait.h).
 *
 * DESIGN
 *
 * A queue per key, found through a small chained hash table, holds its
 * waiters in arrival order; every queue is also on one list, which the
 * thread walks.  A queue is marked `wake` when its first waiter should try
 * at once: a release of its key, or a new first waiter (the one before
 * got its lease, or gave up, and a lease may still be free).  A release
 * that comes while the first waiter is trying marks `again`: that try may
 * have been decided before the release, so when it parks again it tries
 * once more.  A waiter that comes to a key with no queue may have been
 * denied just before a release nobody waited for: the last releases heard
 * are remembered, with when, so that such a waiter tries at once.  The
 * thread sleeps on a condition variable (CLOCK_MONOTONIC)
 * until the earliest of every first waiter's retry time and every
 * waiter's deadline, or a signal, and then tells what is due, with the
 * lock released.  A walk costs one step per waiter, and max_waiting
 * bounds the waiters.
 */
#include "front/lease_wait.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/util.h"

#define LW_BUCKETS 1024 /* a power of two */
#define LW_BATCH   64	/* events told per turn of the thread */
#define LW_RECENT  256	/* releases remembered (a power of two) */

struct lease_queue {
	uint64_t key;
	struct lease_waiter *head, *tail;
	bool wake, again;
	struct lease_queue *hnext;	 /* in its bucket */
	struct lease_queue *prev, *next; /* on the list of queues */
};

struct lease_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	struct lease_queue *buckets[LW_BUCKETS];
	struct lease_queue *queues;
	size_t count;
	bool cut, stop;
	/* The last LW_RECENT releases heard, and the last "all". */
	struct {
		uint64_t key;
		int64_t at;
	} recent[LW_RECENT];
	size_t nrecent;
	int64_t all_at;
};

struct lw_event {
	struct lease_waiter *w;
	enum lease_wait_event ev;
};

static struct lease_queue **
bucket_of(struct lease_wait *lw, uint64_t key)
{
	return &lw->buckets[(key ^ (key >> 32)) & (LW_BUCKETS - 1)];
}

static struct lease_queue *
queue_find(struct lease_wait *lw, uint64_t key)
{
	struct lease_queue *q;

	for (q = *bucket_of(lw, key); q != NULL; q = q->hnext)
		if (q->key == key)
			return q;
	return NULL;
}

static struct lease_queue *
queue_get(struct lease_wait *lw, uint64_t key)
{
	struct lease_queue **b = bucket_of(lw, key), *q;

	if ((q = queue_find(lw, key)) != NULL)
		return q;
	if ((q = rl_calloc(1, sizeof(*q))) == NULL)
		return NULL;
	q->key = key;
	q->hnext = *b;
	*b = q;
	q->next = lw->queues;
	if (lw->queues != NULL)
		lw->queues->prev = q;
	lw->queues = q;
	return q;
}

static void
queue_free(struct lease_wait *lw, struct lease_queue *q)
{
	struct lease_queue **b = bucket_of(lw, q->key);

	while (*b != q)
		b = &(*b)->hnext;
	*b = q->hnext;
	if (q->prev != NULL)
		q->prev->next = q->next;
	else
		lw->queues = q->next;
	if (q->next != NULL)
		q->next->prev = q->prev;
	rl_free(q);
}

/* Was a release of key heard at since_us or later?  (True too when that
 * may have been forgotten.) */
static bool
released_since(const struct lease_wait *lw, uint64_t key, int64_t since_us)
{
	size_t i, n = lw->nrecent < LW_RECENT ? lw->nrecent : LW_RECENT;

	if (lw->all_at >= since_us)
		return true;
	if (lw->nrecent > LW_RECENT &&
	    lw->recent[lw->nrecent % LW_RECENT].at >= since_us)
		return true; /* the oldest remembered is newer */
	for (i = 0; i < n; i++)
		if (lw->recent[i].key == key && lw->recent[i].at >= since_us)
			return true;
	return false;
}

/* Take w out of its queue; a new first waiter tries at once.  The queue
 * stays, even empty: the caller frees it (the thread walks the list). */
static void
unlink_waiter(struct lease_wait *lw, struct lease_waiter *w)
{
	struct lease_queue *q = w->q;
	bool was_head = q->head == w;

	if (w->prev != NULL)
		w->prev->next = w->next;
	else
		q->head = w->next;
	if (w->next != NULL)
		w->next->prev = w->prev;
	else
		q->tail = w->prev;
	w->q = NULL;
	w->prev = w->next = NULL;
	w->trying = false;
	lw->count--;
	if (was_head && q->head != NULL) {
		q->wake = true;
		q->again = false;
	}
}

/*
 * One walk: gather up to LW_BATCH events into ev (the waiters told TIMEOUT
 * or CUT leave their queues here), free empty queues, and return when the
 * next thing falls due (INT64_MAX: nothing; 0: walk again at once).
 */
static int64_t
walk(struct lease_wait *lw, int64_t now, struct lw_event *ev, size_t *nev)
{
	struct lease_queue *q, *qn;
	struct lease_waiter *w, *wn;
	int64_t next = INT64_MAX;

	for (q = lw->queues; q != NULL; q = qn) {
		qn = q->next;
		for (w = q->head; w != NULL; w = wn) {
			wn = w->next;
			if (w->trying)
				continue;
			if (lw->cut || w->deadline_us <= now) {
				if (*nev == LW_BATCH)
					return 0;
				unlink_waiter(lw, w);
				ev[(*nev)++] = (struct lw_event){ w,
					lw->cut ? LEASE_WAIT_CUT :
						  LEASE_WAIT_TIMEOUT };
			} else if (w->deadline_us < next)
				next = w->deadline_us;
		}
		if ((w = q->head) == NULL) {
			queue_free(lw, q);
			continue;
		}
		if (w->trying)
			continue;
		if (q->wake || w->retry_us <= now) {
			if (*nev == LW_BATCH)
				return 0;
			w->trying = true;
			q->wake = q->again = false;
			ev[(*nev)++] = (struct lw_event){ w, LEASE_WAIT_TRY };
		} else if (w->retry_us < next)
			next = w->retry_us;
	}
	return next;
}

static void *
lw_thread(void *arg)
{
	struct lease_wait *lw = arg;
	struct lw_event ev[LW_BATCH];
	struct timespec ts;
	size_t nev, i;
	int64_t next;

	pthread_mutex_lock(&lw->lock);
	while (!lw->stop) {
		nev = 0;
		next = walk(lw, util_monotonic_us(), ev, &nev);
		if (nev > 0) {
			pthread_mutex_unlock(&lw->lock);
			for (i = 0; i < nev; i++)
				ev[i].w->fn(ev[i].w, ev[i].ev);
			pthread_mutex_lock(&lw->lock);
			continue;
		}
		if (next == INT64_MAX) {
			pthread_cond_wait(&lw->cond, &lw->lock);
			continue;
		}
		ts.tv_sec = (time_t)(next / 1000000);
		ts.tv_nsec = (long)(next % 1000000) * 1000;
		(void)pthread_cond_timedwait(&lw->cond, &lw->lock, &ts);
	}
	pthread_mutex_unlock(&lw->lock);
	return NULL;
}

struct lease_wait *
lease_wait_new(char *err, size_t errlen)
{
	struct lease_wait *lw;
	pthread_condattr_t ca;
	int rc;

	if ((lw = rl_calloc(1, sizeof(*lw))) == NULL) {
		snprintf(err, errlen, "lease waits: out of memory");
		return NULL;
	}
	lw->all_at = INT64_MIN;
	pthread_mutex_init(&lw->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&lw->cond, &ca);
	pthread_condattr_destroy(&ca);
	if ((rc = pthread_create(&lw->thread, NULL, lw_thread, lw)) != 0) {
		snprintf(err, errlen, "lease waits: thread: %s", strerror(rc));
		pthread_cond_destroy(&lw->cond);
		pthread_mutex_destroy(&lw->lock);
		rl_free(lw);
		return NULL;
	}
	return lw;
}

int
lease_wait_park(struct lease_wait *lw, struct lease_waiter *w, uint64_t key,
    int64_t retry_us, int64_t deadline_us, int64_t since_us)
{
	struct lease_queue *q;
	int rc = 0;

	pthread_mutex_lock(&lw->lock);
	if (lw->cut) {
		if (w->q != NULL) {
			q = w->q;
			unlink_waiter(lw, w);
			if (q->head == NULL)
				queue_free(lw, q);
		}
		rc = -1;
		goto out;
	}
	if (w->q != NULL && w->q->key != key) {
		q = w->q; /* denied on another key now */
		unlink_waiter(lw, w);
		if (q->head == NULL)
			queue_free(lw, q);
	}
	if (w->q == NULL) {
		if ((q = queue_get(lw, key)) == NULL) {
			rc = -2;
			goto out;
		}
		w->q = q;
		w->next = NULL;
		w->prev = q->tail;
		if (q->tail != NULL)
			q->tail->next = w;
		else
			q->head = w;
		q->tail = w;
		lw->count++;
		if (q->head == w &&
		    (retry_us == INT64_MAX ||
			released_since(lw, key, since_us)))
			q->wake = true;
	} else if (w->trying && w->q->again) {
		w->q->wake = true; /* freed while it tried */
		w->q->again = false;
	}
	w->trying = false;
	w->retry_us = retry_us;
	w->deadline_us = deadline_us;
	pthread_cond_signal(&lw->cond);
out:
	pthread_mutex_unlock(&lw->lock);
	return rc;
}

void
lease_wait_leave(struct lease_wait *lw, struct lease_waiter *w)
{
	struct lease_queue *q;

	pthread_mutex_lock(&lw->lock);
	if ((q = w->q) != NULL) {
		unlink_waiter(lw, w);
		if (q->head == NULL)
			queue_free(lw, q);
		else
			pthread_cond_signal(&lw->cond);
	}
	pthread_mutex_unlock(&lw->lock);
}

void
lease_wait_released(struct lease_wait *lw, uint64_t key)
{
	struct lease_queue *q;

	pthread_mutex_lock(&lw->lock);
	lw->recent[lw->nrecent++ % LW_RECENT].key = key;
	lw->recent[(lw->nrecent - 1) % LW_RECENT].at = util_monotonic_us();
	if ((q = queue_find(lw, key)) != NULL && q->head != NULL) {
		if (q->head->trying)
			q->again = true;
		else
			q->wake = true;
		pthread_cond_signal(&lw->cond);
	}
	pthread_mutex_unlock(&lw->lock);
}

void
lease_wait_all(struct lease_wait *lw)
{
	struct lease_queue *q;

	pthread_mutex_lock(&lw->lock);
	lw->all_at = util_monotonic_us();
	for (q = lw->queues; q != NULL; q = q->next) {
		if (q->head != NULL && q->head->trying)
			q->again = true;
		else
			q->wake = true;
	}
	pthread_cond_signal(&lw->cond);
	pthread_mutex_unlock(&lw->lock);
}

bool
lease_wait_any(struct lease_wait *lw, const uint64_t *keys, size_t n,
    uint64_t *key)
{
	struct lease_queue *q;
	bool found = false;
	size_t i;

	pthread_mutex_lock(&lw->lock);
	for (i = 0; i < n && !found; i++)
		if ((q = queue_find(lw, keys[i])) != NULL && q->head != NULL) {
			*key = keys[i];
			found = true;
		}
	pthread_mutex_unlock(&lw->lock);
	return found;
}

void
lease_wait_cut(struct lease_wait *lw)
{
	pthread_mutex_lock(&lw->lock);
	lw->cut = true;
	pthread_cond_signal(&lw->cond);
	pthread_mutex_unlock(&lw->lock);
}

size_t
lease_wait_count(struct lease_wait *lw)
{
	size_t n;

	pthread_mutex_lock(&lw->lock);
	n = lw->count;
	pthread_mutex_unlock(&lw->lock);
	return n;
}

void
lease_wait_free(struct lease_wait *lw)
{
	struct lease_queue *q;

	if (lw == NULL)
		return;
	pthread_mutex_lock(&lw->lock);
	lw->cut = lw->stop = true;
	pthread_cond_signal(&lw->cond);
	pthread_mutex_unlock(&lw->lock);
	pthread_join(lw->thread, NULL);
	while ((q = lw->queues) != NULL) {
		while (q->head != NULL)
			unlink_waiter(lw, q->head);
		queue_free(lw, q);
	}
	pthread_cond_destroy(&lw->cond);
	pthread_mutex_destroy(&lw->lock);
	rl_free(lw);
}
