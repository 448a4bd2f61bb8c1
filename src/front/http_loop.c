/*
 * http_loop.c - one HTTP event loop (see http_loop.h): a thread that polls
 * one epoll set holding libmicrohttpd's own epoll descriptor, an eventfd
 * for the inbox of connections the acceptor hands over, and, on the loop
 * that hosts the store, the store's descriptor.
 *
 * Each turn: wait no longer than libmicrohttpd's next connection timeout
 * or the store's next deadline (not at all when a connection was resumed
 * on this thread meanwhile; one resumed on another thread writes the
 * eventfd: without its own threads libmicrohttpd signals nothing); add
 * the connections queued in the inbox (MHD_add_connection() is not safe
 * from another thread when libmicrohttpd has no threads of its own, so
 * the acceptor queues and this thread adds); run libmicrohttpd (MHD_run(),
 * which reads requests, calls the handlers and writes answers, resumed
 * connections included) when its descriptor or the inbox asked; then run
 * the store's turn, which sends what the handlers submitted, reads
 * replies and completes their calls.  When that resumed connections of
 * this loop, libmicrohttpd and the store run again at once, up to
 * LOOP_ROUNDS times, before the loop polls again.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/log.h"
#include "base/util.h"
#include "core/backend.h"
#include "front/http_loop.h"

enum { LOOP_TAG_INBOX = 1, LOOP_TAG_MHD, LOOP_TAG_STORE };

/* Rounds of libmicrohttpd and store turns in one wake-up while the store
 * keeps completing calls of this loop. */
#define LOOP_ROUNDS 8

/* Request records a loop keeps (http_loop_record_get). */
static const size_t loop_records = UTIL_KEEP(128);

/* A connection accepted, not yet given to libmicrohttpd. */
struct loop_conn {
	int fd;
	socklen_t addrlen;
	struct sockaddr_storage addr;
};

struct http_loop {
	struct MHD_Daemon *mhd; /* borrowed */
	struct backend *host;	/* borrowed; NULL: hosts no store */
	int epfd, evfd;
	pthread_t thread;
	bool started;
	atomic_bool stop;
	bool again; /* the loop's own: run libmicrohttpd again at once */

	pthread_mutex_t mu; /* guards the inbox */
	struct loop_conn *inbox;
	size_t n, cap;

	/* Request records given back on this thread (http_loop_record_get),
	 * linked through their first bytes; the loop's own. */
	void *records;
	size_t nrecords, record_size;
};

/* Hand the connections queued to libmicrohttpd. */
static void
take_inbox(struct http_loop *l)
{
	struct loop_conn *q;
	uint64_t count;
	size_t n, i;

	(void)!read(l->evfd, &count, sizeof(count));
	pthread_mutex_lock(&l->mu);
	q = l->inbox;
	n = l->n;
	l->inbox = NULL;
	l->n = l->cap = 0;
	pthread_mutex_unlock(&l->mu);
	for (i = 0; i < n; i++)
		/* Refused or not, libmicrohttpd owns the socket now. */
		(void)MHD_add_connection(l->mhd, q[i].fd,
		    (const struct sockaddr *)&q[i].addr, q[i].addrlen);
	rl_free(q);
}

static _Thread_local struct http_loop *loop_self;

struct http_loop *
http_loop_current(void)
{
	return loop_self;
}

void
http_loop_wake(struct http_loop *l)
{
	if (l == loop_self)
		l->again = true;
	else
		(void)!write(l->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
}

void *
http_loop_record_get(size_t size)
{
	struct http_loop *l = loop_self;
	void *p;

	if (l == NULL || l->records == NULL || l->record_size != size)
		return rl_calloc(1, size);
	p = l->records;
	memcpy(&l->records, p, sizeof(void *));
	l->nrecords--;
	memset(p, 0, size);
	return p;
}

void
http_loop_record_put(void *p, size_t size)
{
	struct http_loop *l = loop_self;

	if (p == NULL)
		return;
	if (l == NULL || l->nrecords >= loop_records || size < sizeof(void *) ||
	    (l->record_size != 0 && l->record_size != size)) {
		rl_free(p);
		return;
	}
	l->record_size = size;
	memcpy(p, &l->records, sizeof(void *));
	l->records = p;
	l->nrecords++;
}

static int
watch(struct http_loop *l, int fd, uint32_t tag)
{
	struct epoll_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.u32 = tag;
	return epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void *
loop_run(void *arg)
{
	struct http_loop *l = arg;
	struct epoll_event evs[4];
	MHD_UNSIGNED_LONG_LONG mhd_ms;
	char err[256];
	int store_ms = -1, wait_ms, n, i, fd, round;
	bool run_mhd, poll_store;

	loop_self = l;
	if (l->host != NULL) {
		fd = l->host->ops->host_adopt(l->host);
		if (watch(l, fd, LOOP_TAG_STORE) == -1) {
			log_warnx(
			    "http: cannot poll the store: %s; it keeps "
			    "its own thread",
			    strerror(errno));
			if (l->host->ops->host_release(l->host, err,
				sizeof(err)) == -1)
				log_warnx("%s", err);
			l->host = NULL;
		} else
			/* A turn at once: calls may have come while the
			 * store's thread handed over, and none will wake this
			 * loop until a turn has said it sleeps. */
			store_ms = 0;
	}
	while (!atomic_load_explicit(&l->stop, memory_order_acquire)) {
		wait_ms = -1;
		if (MHD_get_timeout(l->mhd, &mhd_ms) == MHD_YES)
			wait_ms = mhd_ms > INT_MAX ? INT_MAX : (int)mhd_ms;
		if (store_ms >= 0 && (wait_ms < 0 || store_ms < wait_ms))
			wait_ms = store_ms;
		if (l->again)
			wait_ms = 0;
		n = epoll_wait(l->epfd, evs, 4, wait_ms);
		/* A timeout is either's: run both then. */
		run_mhd = l->again || n <= 0;
		poll_store = n <= 0;
		for (i = 0; i < n; i++) {
			if (evs[i].data.u32 == LOOP_TAG_INBOX) {
				take_inbox(l);
				run_mhd = true;
			} else if (evs[i].data.u32 == LOOP_TAG_MHD)
				run_mhd = true;
			else
				poll_store = true;
		}
		/* Calls the store completed resume their connections: answer
		 * them (and read what came meanwhile) at once, and send what
		 * that submits, a few rounds before looking at the inbox. */
		for (round = 0; round < LOOP_ROUNDS; round++) {
			l->again = false;
			if (run_mhd)
				(void)MHD_run(l->mhd);
			if (l->host != NULL)
				store_ms = l->host->ops->host_turn(l->host,
				    poll_store || round > 0);
			if (!l->again)
				break;
			run_mhd = true;
		}
	}
	if (l->host != NULL &&
	    l->host->ops->host_release(l->host, err, sizeof(err)) == -1)
		log_warnx("%s", err);
	return NULL;
}

struct http_loop *
http_loop_start(struct MHD_Daemon *mhd, struct backend *host, const char *name,
    char *err, size_t errlen)
{
	struct http_loop *l;
	const union MHD_DaemonInfo *di;
	int rc;

	if ((l = rl_calloc(1, sizeof(*l))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	l->mhd = mhd;
	l->host = host;
	l->epfd = l->evfd = -1;
	atomic_init(&l->stop, false);
	pthread_mutex_init(&l->mu, NULL);
	if ((di = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_EPOLL_FD)) == NULL) {
		snprintf(err, errlen, "http: libmicrohttpd has no epoll set");
		goto fail;
	}
	if ((l->epfd = epoll_create1(EPOLL_CLOEXEC)) == -1 ||
	    (l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) == -1 ||
	    watch(l, l->evfd, LOOP_TAG_INBOX) == -1 ||
	    watch(l, di->epoll_fd, LOOP_TAG_MHD) == -1) {
		snprintf(err, errlen, "http: event loop: %s", strerror(errno));
		goto fail;
	}
	if ((rc = pthread_create(&l->thread, NULL, loop_run, l)) != 0) {
		snprintf(err, errlen, "http: event loop thread: %s",
		    strerror(rc));
		goto fail;
	}
	l->started = true;
	pthread_setname_np(l->thread, name);
	return l;

fail:
	http_loop_stop(l);
	return NULL;
}

void
http_loop_add(struct http_loop *l, int fd, const struct sockaddr *addr,
    socklen_t addrlen)
{
	struct loop_conn *c;
	size_t cap;

	if (addrlen > sizeof(c->addr)) {
		close(fd);
		return;
	}
	pthread_mutex_lock(&l->mu);
	if (l->n == l->cap) {
		cap = l->cap == 0 ? 16 : 2 * l->cap;
		if ((c = rl_realloc(l->inbox, cap * sizeof(*c))) == NULL) {
			pthread_mutex_unlock(&l->mu);
			log_warnx("http: out of memory: connection closed");
			close(fd);
			return;
		}
		l->inbox = c;
		l->cap = cap;
	}
	c = &l->inbox[l->n++];
	c->fd = fd;
	c->addrlen = addrlen;
	memcpy(&c->addr, addr, addrlen);
	pthread_mutex_unlock(&l->mu);
	(void)!write(l->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
}

void
http_loop_stop(struct http_loop *l)
{
	size_t i;

	if (l == NULL)
		return;
	if (l->started) {
		atomic_store_explicit(&l->stop, true, memory_order_release);
		(void)!write(l->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
		pthread_join(l->thread, NULL);
	}
	for (i = 0; i < l->n; i++)
		close(l->inbox[i].fd);
	rl_free(l->inbox);
	while (l->records != NULL) {
		void *p = l->records;

		memcpy(&l->records, p, sizeof(void *));
		rl_free(p);
	}
	if (l->epfd >= 0)
		close(l->epfd);
	if (l->evfd >= 0)
		close(l->evfd);
	pthread_mutex_destroy(&l->mu);
	rl_free(l);
}
