/*
 * grpc_conn.c - the gRPC front's connections (grpc_priv.h): accept, with
 * max_connections and a back-off when out of descriptors
 * (docs/security.md); reading while the connection has places in the
 * store; writing what nghttp2 has and watching for what the socket needs;
 * a loop's turn of answers back from the store and of requests that
 * waited for a place; and the sweep of request_timeout, idle_timeout and
 * quiescing (docs/grpc.md).
 *
 * Threads: everything here runs on the thread of the loop that owns the
 * connection (or grpc_fuzz_feed()'s thread).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "base/log.h"
#include "base/util.h"
#include "front/grpc_priv.h"

void
grpc_conn_close(struct gconn *c)
{
	struct gloop *l = c->l;

	/* Streams die with the session: their calls lose them first. */
	while (c->streams != NULL)
		grpc_stream_free(c, c->streams);
	nghttp2_session_del(c->h2);
	c->h2 = NULL;
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		l->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	atomic_fetch_sub(&c->s->nconns, 1);
	/* Its calls still in the store hold its places: freed with the
	 * last of them (grpc_loop_drain). */
	if (c->ncalls > 0)
		c->dead = true;
	else
		rl_free(c);
}

/* Is c read?  Not while it has GRPC_MAX_STREAMS calls in the store or a
 * whole request waiting for a place: the rest stays in the socket, and
 * TCP holds the client back. */
bool
grpc_conn_reading(const struct gconn *c)
{
	return c->ncalls < GRPC_MAX_STREAMS && c->nwaiting == 0;
}

/* Write what nghttp2 has; watch for input while c is read and for
 * output while the socket is full.  Closes a connection that is done or
 * failed (returns false then). */
bool
grpc_conn_flush(struct gconn *c)
{
	struct epoll_event ev = { .data.ptr = c };
	bool want;

	if (c->closing)
		return true; /* nothing more is written */

	if (nghttp2_session_send(c->h2) != 0) {
		grpc_conn_close(c);
		return false;
	}
	if (!nghttp2_session_want_read(c->h2) &&
	    !nghttp2_session_want_write(c->h2)) {
		grpc_conn_close(c);
		return false;
	}
	want = nghttp2_session_want_write(c->h2) != 0;
	if (!want)
		c->out_us = util_monotonic_us();
	ev.events = (grpc_conn_reading(c) ? EPOLLIN : 0) |
	    (want ? EPOLLOUT : 0);
	if (ev.events != c->events) {
		epoll_ctl(c->l->epfd, EPOLL_CTL_MOD, c->fd, &ev);
		c->events = ev.events;
	}
	return true;
}

void
grpc_conn_read(struct gconn *c)
{
	uint8_t buf[GRPC_READ_CHUNK];
	ssize_t n;

	if (c->closing) {
		/* Dropped unread, until the client's close. */
		for (;;) {
			n = recv(c->fd, buf, sizeof(buf), 0);
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return;
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				grpc_conn_close(c);
				return;
			}
		}
	}

	while (grpc_conn_reading(c)) {
		n = recv(c->fd, buf, sizeof(buf), 0);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 ||
		    nghttp2_session_mem_recv(c->h2, buf, (size_t)n) < 0) {
			grpc_conn_close(c);
			return;
		}
		c->last_us = util_monotonic_us();
		if ((size_t)n < sizeof(buf))
			break;
	}
	grpc_conn_flush(c);
}

static void
conn_goaway(struct gconn *c)
{
	if (c->goaway || c->calm)
		return;
	c->goaway = true;
	nghttp2_submit_goaway(c->h2, NGHTTP2_FLAG_NONE,
	    nghttp2_session_get_last_proc_stream_id(c->h2), NGHTTP2_NO_ERROR,
	    NULL, 0);
}

/*
 * Close c, which has no stream left, the graceful way: its GOAWAY and all
 * nghttp2 has to write sent, then our side shut (FIN), and what the
 * client still sends read and dropped until it closes too, or
 * GRPC_LINGER_MS pass (grpc_loop_sweep).  Closed at once with input
 * unread, the socket would send a reset, on which the client's side may
 * drop the GOAWAY and the last answers before they are read.  At once
 * all the same when the socket cannot take what is left to write.
 */
static void
conn_linger(struct gconn *c, int64_t now)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };

	conn_goaway(c);
	if (c->fd < 0 || nghttp2_session_send(c->h2) != 0 ||
	    nghttp2_session_want_write(c->h2) ||
	    shutdown(c->fd, SHUT_WR) != 0) {
		grpc_conn_close(c);
		return;
	}
	c->closing = true;
	c->close_at = now + (int64_t)GRPC_LINGER_MS * 1000;
	if (c->events != EPOLLIN) {
		epoll_ctl(c->l->epfd, EPOLL_CTL_MOD, c->fd, &ev);
		c->events = EPOLLIN;
	}
}

/* Start the waiting requests of c while there are places. */
static void
conn_start_waiting(struct gconn *c)
{
	struct gstream *st;

	for (st = c->streams; st != NULL && c->nwaiting > 0; st = st->next)
		if (st->waiting) {
			if (!grpc_call_take_place(c))
				break;
			st->waiting = false;
			c->nwaiting--;
			grpc_stream_start(st);
		}
}

/*
 * Out of descriptors (EMFILE, ENFILE) or kernel memory, accept fails
 * while the connection stays in the backlog, and a level-triggered
 * listener would wake the loop again at once: a core spent for nothing.
 * Take the listener out of the epoll for GRPC_ACCEPT_PAUSE_MS instead;
 * the backlog waits for a descriptor to be freed (docs/security.md).
 */
static void
listen_pause(struct gloop *l, int err)
{
	if (l->listening) {
		epoll_ctl(l->epfd, EPOLL_CTL_DEL, l->s->lfd, NULL);
		l->listening = false;
	}
	l->accept_at_us = util_monotonic_us() + GRPC_ACCEPT_PAUSE_MS * 1000;
	if (!l->fd_warned) {
		l->fd_warned = true;
		log_warnx(
		    "grpc: cannot accept connections (%s); retrying "
		    "every %d ms",
		    strerror(err), GRPC_ACCEPT_PAUSE_MS);
	}
}

/* Put the listener back in the epoll, unless quiescing.  0 or -1. */
int
grpc_listen_resume(struct gloop *l)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE,
		.data.ptr = &grpc_tag_listen };

	if (l->listening || l->quiesced)
		return 0;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->s->lfd, &ev) != 0)
		return -1;
	l->listening = true;
	return 0;
}

/* A connection of loop l on fd (-1: none, for grpc_fuzz_feed), its
 * SETTINGS queued; linked into l's list.  NULL when out of memory. */
struct gconn *
grpc_conn_new(struct gloop *l, int fd)
{
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, GRPC_MAX_STREAMS },
		{ NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
		    (uint32_t)l->cur->max_header_bytes },
	};
	struct gconn *c;

	if ((c = rl_calloc(1, sizeof(*c))) == NULL)
		return NULL;
	c->fd = fd;
	c->s = l->s;
	c->l = l;
	c->credit = GRPC_MAX_STREAMS;
	c->last_us = c->out_us = util_monotonic_us();
	if (nghttp2_session_server_new2(&c->h2, l->s->cbs, c, l->s->opt) != 0) {
		rl_free(c);
		return NULL;
	}
	nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, 2);
	c->events = EPOLLIN;
	c->next = l->conns;
	if (l->conns != NULL)
		l->conns->prev = c;
	l->conns = c;
	atomic_fetch_add(&l->s->nconns, 1);
	return c;
}

void
grpc_loop_accept(struct gloop *l)
{
	struct grpc_server *s = l->s;
	struct epoll_event ev;
	struct gconn *c;
	int fd, one = 1, i;

	for (i = 0; i < GRPC_ACCEPT_BATCH; i++) {
		fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE ||
			    errno == ENOBUFS || errno == ENOMEM)
				listen_pause(l, errno);
			return;
		}
		l->fd_warned = false;
		if (atomic_load(&s->nconns) >= l->cur->max_connections ||
		    (c = grpc_conn_new(l, fd)) == NULL) {
			close(fd);
			continue;
		}
		/* Headers, message and trailers leave in separate sends:
		 * without this, Nagle holds the last until an ACK. */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		ev = (struct epoll_event){ .events = EPOLLIN, .data.ptr = c };
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			grpc_conn_close(c); /* closes fd */
			continue;
		}
		grpc_conn_flush(c);
	}
}

/* Answer the calls the store gave back, start requests that waited for
 * their places, and write. */
void
grpc_loop_drain(struct gloop *l)
{
	struct gcall *gc, *next;
	struct gconn *c, *cn;

	pthread_mutex_lock(&l->lock);
	gc = l->done_head;
	l->done_head = l->done_tail = NULL;
	pthread_mutex_unlock(&l->lock);
	for (; gc != NULL; gc = next) {
		next = gc->qnext;
		c = gc->c;
		if (gc->st != NULL && c->credit < GRPC_MAX_STREAMS)
			c->credit++;
		grpc_call_answer(gc);
		grpc_call_free(gc);
		atomic_fetch_sub(&l->s->pending, 1);
		if (--c->ncalls == 0 && c->dead)
			rl_free(c);
	}
	for (c = l->conns; c != NULL; c = cn) {
		cn = c->next;
		if (c->nwaiting > 0)
			conn_start_waiting(c);
		grpc_conn_flush(c);
	}
}

/* The streams of c past request_timeout (req_us) at now: a call that never
 * finished sending or never had a place is cut, an answer that could not
 * be written is given up. */
static void
sweep_streams(struct gconn *c, int64_t now, int64_t req_us)
{
	struct gstream *st;

	for (st = c->streams; st != NULL; st = st->next)
		if (!st->answered && st->call == NULL &&
		    now - st->start_us > req_us) {
			if (st->waiting) {
				st->waiting = false;
				c->nwaiting--;
			}
			/* And reset it once the answer is out
			 * (on_frame_sent): its client may never end it. */
			st->cut = true;
			grpc_answer_status(st, GRPC_DEADLINE_EXCEEDED,
			    "request_timeout passed before the "
			    "request was whole or had a place");
		} else if (st->answered && !st->reset &&
		    now - st->answered_us > req_us) {
			/* Its answer could not be written (a client whose
			 * window stays shut): give it up. */
			st->reset = true;
			nghttp2_submit_rst_stream(c->h2, NGHTTP2_FLAG_NONE,
			    st->id, NGHTTP2_CANCEL);
		}
}

/*
 * Once per tick: cut calls past request_timeout that never finished
 * sending or never had a place, reset streams whose answer could not be
 * written within request_timeout, close connections idle past
 * idle_timeout or unable to write for as long, and, quiescing, those with
 * nothing left in progress.
 */
void
grpc_loop_sweep(struct gloop *l)
{
	int64_t now = util_monotonic_us();
	int64_t req_us = l->cur->request_timeout_ms * 1000;
	int64_t idle_us = l->cur->idle_timeout_ms * 1000;
	struct gconn *c, *cn;

	for (c = l->conns; c != NULL; c = cn) {
		cn = c->next;
		if (c->closing) {
			if (now >= c->close_at)
				grpc_conn_close(c);
			continue;
		}
		/* A client that reads nothing at all: what it was sent has
		 * stayed in a full socket for idle_timeout (every loop turn
		 * writes what it submits, so only a full socket leaves
		 * anything to write here). */
		if (nghttp2_session_want_write(c->h2) &&
		    now - c->out_us > idle_us) {
			grpc_conn_close(c);
			continue;
		}
		sweep_streams(c, now, req_us);
		if (l->quiesced)
			conn_goaway(c);
		if (c->nstreams == 0 &&
		    (l->quiesced || now - c->last_us > idle_us)) {
			conn_linger(c, now);
			continue;
		}
		grpc_conn_flush(c);
	}
}
