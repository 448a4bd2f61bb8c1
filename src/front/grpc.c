/*
 * grpc.c - the gRPC server's life (grpc.h, docs/grpc.md): start (the
 * listener shared by `threads` event loops, each with its own thread,
 * epoll and eventfd), a loop's turn, quiesce, stop and the config
 * snapshot; and grpc_fuzz_feed(), one connection run with no socket and
 * no thread.  grpc_priv.h says what the other files hold: connections
 * (grpc_conn.c), the HTTP/2 callbacks (grpc_h2.c), the calls and their
 * answers (grpc_call.c).
 *
 * Threads: grpc_server_start() at start-up; loop_main() is each loop's
 * thread; grpc_server_set_config/quiesce/inflight/stop run on any thread,
 * through the config slot, atomics and each loop's eventfd.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "base/metrics.h"
#include "base/util.h"
#include "core/config_slot.h"
#include "front/grpc_priv.h"

char grpc_tag_listen, grpc_tag_event;

void
grpc_server_set_config(struct grpc_server *s, struct config *cfg)
{
	config_slot_set(&s->cfg, cfg);
}

/* ---- the loops -------------------------------------------------------- */

void
grpc_loop_wake(struct gloop *l)
{
	uint64_t one = 1;

	(void)!write(l->efd, &one, sizeof(one));
}

/* How long loop l may wait for events: a tick, or less when its listener
 * is paused (out of descriptors) and due back sooner; due now, it goes
 * back in the epoll. */
static int
loop_wait_ms(struct gloop *l)
{
	int wait_ms = GRPC_TICK_MS;
	int64_t left;

	if (!l->listening && !l->quiesced) {
		left = l->accept_at_us - util_monotonic_us();
		if (left <= 0)
			(void)grpc_listen_resume(l);
		else if (left / 1000 + 1 < wait_ms)
			wait_ms = (int)(left / 1000 + 1);
	}
	return wait_ms;
}

/* Act on n events of loop l's epoll: its eventfd, the listener, or a
 * connection. */
static void
loop_events(struct gloop *l, const struct epoll_event *evs, int n)
{
	uint64_t count;
	uint32_t e;
	int i;

	for (i = 0; i < n; i++) {
		void *p = evs[i].data.ptr;

		e = evs[i].events;
		if (p == &grpc_tag_event) {
			(void)!read(l->efd, &count, sizeof(count));
			continue;
		}
		if (p == &grpc_tag_listen) {
			grpc_loop_accept(l);
			continue;
		}
		/* A connection not read now (grpc_conn_reading) still
		 * reports errors: nothing more can come from it. */
		if ((e & (EPOLLERR | EPOLLHUP)) && !grpc_conn_reading(p))
			grpc_conn_close(p);
		else if (e & (EPOLLIN | EPOLLERR | EPOLLHUP))
			grpc_conn_read(p);
		else if (e & EPOLLOUT)
			grpc_conn_flush(p);
	}
}

/* A loop's thread: turns until stopped with nothing left in the store,
 * each under the config snapshot of its turn. */
static void *
loop_main(void *arg)
{
	struct gloop *l = arg;
	struct grpc_server *s = l->s;
	struct epoll_event evs[64];
	int64_t next_sweep = 0;
	int n;

	for (;;) {
		if (atomic_load(&s->stop) && atomic_load(&s->pending) == 0)
			break;
		if (atomic_load(&s->quiesce) && !l->quiesced) {
			l->quiesced = true;
			atomic_fetch_add(&s->nquiesced, 1);
			if (l->listening)
				epoll_ctl(l->epfd, EPOLL_CTL_DEL, s->lfd, NULL);
			l->listening = false;
			next_sweep = 0;
		}
		n = epoll_wait(l->epfd, evs, 64, loop_wait_ms(l));
		l->cur = config_slot_get(&s->cfg);
		loop_events(l, evs, n);
		/* The store's answers, including those given inline. */
		grpc_loop_drain(l);
		if (util_monotonic_us() >= next_sweep) {
			grpc_loop_sweep(l);
			next_sweep = util_monotonic_us() + GRPC_TICK_MS * 1000;
		}
		config_unref(l->cur);
		l->cur = NULL;
	}
	while (l->conns != NULL)
		grpc_conn_close(l->conns);
	return NULL;
}

/* ---- life ------------------------------------------------------------- */

static void
server_free(struct grpc_server *s)
{
	int i;

	for (i = 0; s->loops != NULL && i < s->nloops; i++) {
		if (s->loops[i].efd >= 0)
			close(s->loops[i].efd);
		if (s->loops[i].epfd >= 0)
			close(s->loops[i].epfd);
		pthread_mutex_destroy(&s->loops[i].lock);
	}
	rl_free(s->loops);
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->cbs != NULL)
		nghttp2_session_callbacks_del(s->cbs);
	if (s->opt != NULL)
		nghttp2_option_del(s->opt);
	config_slot_destroy(&s->cfg);
	rl_free(s);
}

/* Make loop l's epoll and eventfd, listening.  0 or -1 with errno. */
static int
loop_init(struct grpc_server *s, struct gloop *l)
{
	struct epoll_event ev = { .events = EPOLLIN,
		.data.ptr = &grpc_tag_event };

	l->s = s;
	if ((l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
	    (l->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
	    epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->efd, &ev) != 0 ||
	    grpc_listen_resume(l) != 0)
		return -1;
	return 0;
}

struct grpc_server *
grpc_server_start(int listen_fd, struct config *cfg,
    const struct decider *decider, struct metrics *metrics, char *err,
    size_t errlen)
{
	struct grpc_server *s;
	int i;

	if ((s = rl_calloc(1, sizeof(*s))) == NULL) {
		close(listen_fd);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s->lfd = listen_fd;
	s->decider = decider;
	s->metrics = metrics;
	config_slot_init(&s->cfg, cfg);
	s->nloops = cfg->threads > 0 ? cfg->threads : 1;
	if ((s->loops = rl_calloc((size_t)s->nloops, sizeof(*s->loops))) ==
	    NULL) {
		s->nloops = 0;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (i = 0; i < s->nloops; i++) {
		s->loops[i].efd = s->loops[i].epfd = -1;
		pthread_mutex_init(&s->loops[i].lock, NULL);
	}
	fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
	for (i = 0; i < s->nloops; i++)
		if (loop_init(s, &s->loops[i]) != 0) {
			snprintf(err, errlen, "grpc: %s", strerror(errno));
			goto fail;
		}
	if (grpc_h2_callbacks_new(s) != 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	metrics_set_grpc(metrics);
	for (i = 0; i < s->nloops; i++) {
		if (pthread_create(&s->loops[i].thread, NULL, loop_main,
			&s->loops[i]) != 0) {
			snprintf(err, errlen, "grpc: cannot start its threads");
			grpc_server_stop(s);
			return NULL;
		}
		s->loops[i].thread_started = true;
		/* Named, so `top -H` and the tests can tell them. */
		pthread_setname_np(s->loops[i].thread, "rl-grpc");
	}
	return s;

fail:
	server_free(s);
	return NULL;
}

void
grpc_server_quiesce(struct grpc_server *s)
{
	int i;

	if (s == NULL)
		return;
	atomic_store(&s->quiesce, true);
	for (i = 0; i < s->nloops; i++)
		grpc_loop_wake(&s->loops[i]);
}

int
grpc_server_inflight(struct grpc_server *s)
{
	return s == NULL ? 0 : atomic_load(&s->inflight);
}

bool
grpc_server_drained(struct grpc_server *s)
{
	return s == NULL ||
	    (atomic_load(&s->nquiesced) == s->nloops &&
		atomic_load(&s->nconns) == 0);
}

void
grpc_server_stop(struct grpc_server *s)
{
	int i;

	if (s == NULL)
		return;
	atomic_store(&s->stop, true);
	for (i = 0; i < s->nloops; i++)
		grpc_loop_wake(&s->loops[i]);
	for (i = 0; i < s->nloops; i++)
		if (s->loops[i].thread_started)
			pthread_join(s->loops[i].thread, NULL);
	server_free(s);
}

/* ---- fuzzing ---------------------------------------------------------- */

int
grpc_fuzz_feed(struct config *cfg, const struct decider *decider,
    const uint8_t *data, size_t len)
{
	struct grpc_server s = { .lfd = -1, .decider = decider };
	struct gloop l = { .s = &s, .efd = -1, .epfd = -1, .cur = cfg };
	struct gconn *c;
	size_t off, n;
	int rc = -1;

	if (grpc_h2_callbacks_new(&s) != 0)
		goto out;
	pthread_mutex_init(&l.lock, NULL);
	if ((c = grpc_conn_new(&l, -1)) == NULL)
		goto out_lock;
	/* In reads of up to 1,000 bytes, each followed by a loop turn: the
	 * store's answers (inline on the memory store), and the writes. */
	for (off = 0; off < len && l.conns == c; off += n) {
		n = len - off < 1000 ? len - off : 1000;
		if (!grpc_conn_reading(c))
			break;
		if (nghttp2_session_mem_recv(c->h2, data + off, n) < 0) {
			grpc_conn_close(c);
			break;
		}
		grpc_loop_drain(&l);
	}
	rc = 0;
	/* Whatever is left dies with the connection; no call can still be
	 * in the store (the memory store answers inside the call). */
	while (l.conns != NULL)
		grpc_conn_close(l.conns);
	grpc_loop_drain(&l);
out_lock:
	pthread_mutex_destroy(&l.lock);
out:
	if (s.cbs != NULL)
		nghttp2_session_callbacks_del(s.cbs);
	if (s.opt != NULL)
		nghttp2_option_del(s.opt);
	return rc;
}
