/*
 * http_guard.c - the connection limit and the request timeout (see
 * http_guard.h).
 *
 * DESIGN
 *
 * Each open connection has a record in a doubly linked list under one
 * mutex.  The event loops (libmicrohttpd's callbacks) add and remove
 * records (open, close) and flip two fields without the lock: `done`, a
 * count of requests ended, and `waiting`.  Every GUARD_TICK_US the
 * guard's thread walks the list under the mutex.  For each TCP connection
 * it reads tcpi_bytes_received: when a request ended since the last look,
 * the count then is the baseline; bytes past the baseline mean the next
 * request began, at this look (so a request is cut between
 * request_timeout and request_timeout plus a tick after its first byte).
 * Bytes that came before that look, the start of a request sent right
 * after the previous answer (or pipelined behind it), are under the
 * baseline: such a request is seen by `started` instead, which the loop
 * counts when libmicrohttpd has read a request line (http_framing.c).
 * More requests started than ended means one is under way.
 * A request past request_timeout that does not wait for the store is
 * shut down for reading and writing.  Unix sockets carry no byte count
 * and are left alone: only local processes reach them.
 */
#include "front/http_guard.h"

#include <errno.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/log.h"
#include "base/util.h"

#define GUARD_TICK_US 500000

struct guard_conn {
	struct guard_conn *prev, *next;
	int fd;
	bool tcp;
	atomic_uint done;    /* requests ended */
	atomic_uint started; /* request lines read */
	atomic_bool waiting;
	unsigned seen_done; /* the guard thread's */
	uint64_t baseline;  /* bytes when the last request ended */
	int64_t began_us;   /* the current request's first byte seen;
			     * 0: none yet */
};

struct http_guard {
	http_guard_limits_fn limits;
	void *arg;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* wakes the thread to stop */
	bool stop;
	pthread_t thread;
	struct guard_conn *head;
	atomic_llong open;
	atomic_ullong refused, cut;
};

static bool
bytes_received(int fd, uint64_t *out)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
	    len < offsetof(struct tcp_info, tcpi_bytes_received) +
		    sizeof(ti.tcpi_bytes_received))
		return false;
	*out = ti.tcpi_bytes_received;
	return true;
}

/* One look at every connection; called with g->mu held. */
static void
guard_tick(struct http_guard *g, int64_t timeout_us)
{
	int64_t now = util_monotonic_us();
	struct guard_conn *c;
	unsigned done;
	uint64_t bytes;

	for (c = g->head; c != NULL; c = c->next) {
		if (!c->tcp || !bytes_received(c->fd, &bytes))
			continue;
		done = atomic_load_explicit(&c->done, memory_order_acquire);
		if (done != c->seen_done) {
			c->seen_done = done;
			c->baseline = bytes;
			c->began_us = 0;
			continue;
		}
		if (c->began_us == 0) {
			if (bytes > c->baseline ||
			    atomic_load_explicit(&c->started,
				memory_order_acquire) != done)
				c->began_us = now;
			continue;
		}
		if (now - c->began_us <= timeout_us ||
		    atomic_load_explicit(&c->waiting, memory_order_acquire))
			continue;
		/* Cut once: the close comes back through http_guard_closed. */
		c->began_us = INT64_MAX / 2;
		(void)shutdown(c->fd, SHUT_RDWR);
		atomic_fetch_add(&g->cut, 1);
		log_debug(
		    "http: a request past request_timeout (%lld ms) "
		    "was cut off",
		    (long long)(timeout_us / 1000));
	}
}

static void *
guard_main(void *arg)
{
	struct http_guard *g = arg;
	int64_t maxc, timeout_us;
	struct timespec ts;

	pthread_mutex_lock(&g->mu);
	while (!g->stop) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += (GUARD_TICK_US % 1000000) * 1000;
		ts.tv_sec += GUARD_TICK_US / 1000000 + ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		(void)pthread_cond_timedwait(&g->cv, &g->mu, &ts);
		if (g->stop)
			break;
		g->limits(g->arg, &maxc, &timeout_us);
		guard_tick(g, timeout_us);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

struct http_guard *
http_guard_start(http_guard_limits_fn limits, void *arg, char *err,
    size_t errlen)
{
	struct http_guard *g = rl_calloc(1, sizeof(*g));
	pthread_condattr_t ca;

	if (g == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	g->limits = limits;
	g->arg = arg;
	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	atomic_init(&g->open, 0);
	atomic_init(&g->refused, 0);
	atomic_init(&g->cut, 0);
	if ((errno = pthread_create(&g->thread, NULL, guard_main, g)) != 0) {
		snprintf(err, errlen, "guard thread: %s", strerror(errno));
		pthread_cond_destroy(&g->cv);
		pthread_mutex_destroy(&g->mu);
		rl_free(g);
		return NULL;
	}
	return g;
}

void
http_guard_stop(struct http_guard *g)
{
	struct guard_conn *c, *next;

	if (g == NULL)
		return;
	pthread_mutex_lock(&g->mu);
	g->stop = true;
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
	pthread_join(g->thread, NULL);
	for (c = g->head; c != NULL; c = next) {
		next = c->next;
		rl_free(c);
	}
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	rl_free(g);
}

bool
http_guard_admit(struct http_guard *g)
{
	int64_t maxc, timeout_us;

	g->limits(g->arg, &maxc, &timeout_us);
	if (atomic_load(&g->open) < maxc)
		return true;
	atomic_fetch_add(&g->refused, 1);
	return false;
}

void
http_guard_opened(struct http_guard *g, int fd, void **ctx)
{
	struct guard_conn *c = rl_calloc(1, sizeof(*c));
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	atomic_fetch_add(&g->open, 1);
	*ctx = c;
	if (c == NULL)
		return; /* not watched; still counted */
	c->fd = fd;
	c->tcp = getsockname(fd, (struct sockaddr *)&ss, &len) == 0 &&
	    (ss.ss_family == AF_INET || ss.ss_family == AF_INET6);
	atomic_init(&c->done, 0);
	atomic_init(&c->waiting, false);
	pthread_mutex_lock(&g->mu);
	c->next = g->head;
	if (g->head != NULL)
		g->head->prev = c;
	g->head = c;
	pthread_mutex_unlock(&g->mu);
}

void
http_guard_closed(struct http_guard *g, void **ctx)
{
	struct guard_conn *c = *ctx;

	atomic_fetch_sub(&g->open, 1);
	*ctx = NULL;
	if (c == NULL)
		return;
	pthread_mutex_lock(&g->mu);
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		g->head = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&g->mu);
	rl_free(c);
}

void
http_guard_request_done(void *ctx)
{
	struct guard_conn *c = ctx;

	if (c != NULL)
		atomic_fetch_add_explicit(&c->done, 1, memory_order_release);
}

void
http_guard_request_started(void *ctx)
{
	struct guard_conn *c = ctx;

	if (c != NULL)
		atomic_fetch_add_explicit(&c->started, 1, memory_order_release);
}

void
http_guard_waiting(void *ctx, bool waiting)
{
	struct guard_conn *c = ctx;

	if (c != NULL)
		atomic_store_explicit(&c->waiting, waiting,
		    memory_order_release);
}

int64_t
http_guard_open(const struct http_guard *g)
{
	return atomic_load(&((struct http_guard *)g)->open);
}

uint64_t
http_guard_refused(const struct http_guard *g)
{
	return atomic_load(&((struct http_guard *)g)->refused);
}

uint64_t
http_guard_cut(const struct http_guard *g)
{
	return atomic_load(&((struct http_guard *)g)->cut);
}
