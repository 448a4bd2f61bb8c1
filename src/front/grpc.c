/*
 * grpc.c - the gRPC server (see grpc.h): connections, HTTP/2 through
 * libnghttp2, and the server's life; the calls and their answers are in
 * grpc_call.c, and grpc_priv.h says what the files share.
 *
 * Threads: `threads` event loops (struct gloop), as many as HTTP has,
 * each with its own epoll holding the shared listener; a connection and
 * its streams belong to the loop that accepted it.  The
 * grpc_server_set_config/quiesce/inflight/stop entry points run on any
 * thread, through the config slot, atomics and each loop's eventfd.
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
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "core/config_slot.h"
#include "base/log.h"
#include "base/metrics.h"
#include "front/grpc_priv.h"
#include "base/util.h"

char grpc_tag_listen, grpc_tag_event;

void
grpc_server_set_config(struct grpc_server *s, struct config *cfg)
{
	config_slot_set(&s->cfg, cfg);
}

void
grpc_loop_wake(struct gloop *l)
{
	uint64_t one = 1;

	(void)!write(l->efd, &one, sizeof(one));
}

/* ---- HTTP/2 callbacks ------------------------------------------------- */

static ssize_t
on_send(nghttp2_session *h2, const uint8_t *data, size_t len, int flags,
    void *arg)
{
	struct gconn *c = arg;
	ssize_t n;

	(void)h2;
	(void)flags;
	if (c->fd < 0) /* grpc_fuzz_feed(): no socket */
		return (ssize_t)len;
	n = send(c->fd, data, len, MSG_NOSIGNAL);
	if (n > 0)
		c->out_us = util_monotonic_us();
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ||
			errno == EINTR ?
		    NGHTTP2_ERR_WOULDBLOCK :
		    NGHTTP2_ERR_CALLBACK_FAILURE;
	return n;
}

static int
on_begin_headers(nghttp2_session *h2, const nghttp2_frame *f, void *arg)
{
	struct gconn *c = arg;
	struct gstream *st;

	if (f->hd.type != NGHTTP2_HEADERS ||
	    f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	if ((st = rl_calloc(1, sizeof(*st))) == NULL)
		return NGHTTP2_ERR_CALLBACK_FAILURE;
	st->id = f->hd.stream_id;
	st->c = c;
	st->start_us = util_monotonic_us();
	st->next = c->streams;
	if (c->streams != NULL)
		c->streams->prev = st;
	c->streams = st;
	c->nstreams++;
	atomic_fetch_add(&c->s->inflight, 1);
	nghttp2_session_set_stream_user_data(h2, st->id, st);
	return 0;
}

/* grpc-timeout: up to 8 digits and a unit (H M S m u n).  0 if bad. */
static int64_t
parse_timeout(const uint8_t *v, size_t len)
{
	int64_t n = 0;
	size_t i;

	if (len < 2 || len > 9)
		return 0;
	for (i = 0; i + 1 < len; i++) {
		if (v[i] < '0' || v[i] > '9')
			return 0;
		n = n * 10 + (v[i] - '0');
	}
	switch (v[len - 1]) {
	case 'H':
		return n * 3600 * 1000000;
	case 'M':
		return n * 60 * 1000000;
	case 'S':
		return n * 1000000;
	case 'm':
		return n * 1000;
	case 'u':
		return n;
	case 'n':
		return n / 1000 > 0 ? n / 1000 : 1;
	}
	return 0;
}

static bool
is(const uint8_t *v, size_t len, const char *s)
{
	return len == strlen(s) && memcmp(v, s, len) == 0;
}

/*
 * A call's decoded headers are bounded by max_header_bytes, as HTTP's are
 * (docs/security.md), counted as HTTP/2 counts a header list (name, value
 * and 32 bytes each): a few bytes of HPACK can refer to a large header
 * again and again (an HPACK bomb).  Past it the stream is reset at once
 * and nghttp2 skips the rest of the block without looking at it; a
 * connection that does it GRPC_HEADER_STRIKES times is sent GOAWAY.
 */
static int
header_refuse(struct gconn *c, struct gstream *st)
{
	log_debug("grpc: stream %d: headers over max_header_bytes (%d)",
	    (int)st->id, c->l->cur->max_header_bytes);
	if (++c->strikes >= GRPC_HEADER_STRIKES && !c->goaway) {
		c->goaway = true;
		nghttp2_session_terminate_session(c->h2,
		    NGHTTP2_ENHANCE_YOUR_CALM);
	}
	return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
}

static int
on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name,
    size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
    void *arg)
{
	struct gconn *c = arg;
	struct gstream *st;

	(void)flags;
	if (f->hd.type != NGHTTP2_HEADERS ||
	    f->headers.cat != NGHTTP2_HCAT_REQUEST ||
	    (st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id)) ==
		NULL)
		return 0;
	st->header_bytes += namelen + valuelen + 32;
	if (st->header_bytes > (size_t)c->l->cur->max_header_bytes)
		return header_refuse(c, st);
	if (is(name, namelen, ":method"))
		st->post = is(value, valuelen, "POST");
	else if (is(name, namelen, ":path"))
		st->method = is(value, valuelen, PATH_RLS) ? M_RLS :
		    is(value, valuelen, PATH_HEALTH)	   ? M_HEALTH :
							     M_OTHER;
	else if (is(name, namelen, "content-type"))
		st->grpc_type = valuelen >= 16 &&
		    memcmp(value, "application/grpc", 16) == 0 &&
		    (valuelen == 16 || value[16] == '+' || value[16] == ';');
	else if (is(name, namelen, "grpc-timeout"))
		st->timeout_us = parse_timeout(value, valuelen);
	return 0;
}

static int
on_data(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data,
    size_t len, void *arg)
{
	struct gconn *c = arg;
	struct gstream *st;
	size_t max, cap;
	uint8_t *n;

	(void)flags;
	if ((st = nghttp2_session_get_stream_user_data(h2, id)) == NULL ||
	    st->too_big)
		return 0;
	max = (size_t)c->l->cur->max_body_bytes + GRPC_PREFIX;
	if (st->inlen + len > max || c->buffered + len > GRPC_CONN_BUFFERED) {
		st->too_big = true;
		return 0;
	}
	if (st->inlen + len > st->incap) {
		cap = st->incap == 0 ? 256 : st->incap;
		while (cap < st->inlen + len)
			cap *= 2;
		if ((n = rl_realloc(st->in, cap)) == NULL)
			return NGHTTP2_ERR_CALLBACK_FAILURE;
		st->in = n;
		st->incap = cap;
	}
	memcpy(st->in + st->inlen, data, len);
	st->inlen += len;
	c->buffered += len;
	return 0;
}

static int
on_frame(nghttp2_session *h2, const nghttp2_frame *f, void *arg)
{
	struct gstream *st;

	(void)arg;
	if ((f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) ||
	    !(f->hd.flags & NGHTTP2_FLAG_END_STREAM) ||
	    (st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id)) ==
		NULL ||
	    st->answered || st->call != NULL)
		return 0;
	grpc_stream_request(st);
	return 0;
}

/*
 * A stream cut at request_timeout is reset only once its answer has left:
 * an RST_STREAM submitted in the same turn as the answer makes nghttp2
 * drop the answer.  RST_STREAM(NO_ERROR) after a complete response tells
 * the client to stop sending (RFC 9113, section 8.1).
 */
static int
on_frame_sent(nghttp2_session *h2, const nghttp2_frame *f, void *arg)
{
	struct gstream *st;

	(void)arg;
	if (f->hd.type == NGHTTP2_HEADERS &&
	    (f->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
	    (st = nghttp2_session_get_stream_user_data(h2, f->hd.stream_id)) !=
		NULL &&
	    st->cut)
		nghttp2_submit_rst_stream(h2, NGHTTP2_FLAG_NONE, st->id,
		    NGHTTP2_NO_ERROR);
	return 0;
}

void
grpc_stream_free(struct gconn *c, struct gstream *st)
{
	if (st->call != NULL)
		st->call->st = NULL; /* the store still has it */
	if (st->waiting)
		c->nwaiting--;
	if (!st->answered)
		atomic_fetch_sub(&c->s->inflight, 1);
	if (st->prev != NULL)
		st->prev->next = st->next;
	else
		c->streams = st->next;
	if (st->next != NULL)
		st->next->prev = st->prev;
	c->nstreams--;
	c->buffered -= st->inlen;
	rl_free(st->in);
	rl_free(st->out);
	rl_free(st);
}

/*
 * A stream closed while its call was in the store: the call was
 * abandoned (a reset, the CVE-2023-44487 pattern when repeated).  Each
 * costs the connection one credit, each call answered gives one back;
 * out of credit, it is told to go away.
 */
static void
conn_abandoned(struct gconn *c)
{
	if (--c->credit > 0 || c->goaway)
		return;
	c->goaway = true;
	log_debug(
	    "grpc: a connection abandoned %d calls more than it was "
	    "answered; GOAWAY",
	    GRPC_MAX_STREAMS);
	nghttp2_session_terminate_session(c->h2, NGHTTP2_ENHANCE_YOUR_CALM);
}

static int
on_close(nghttp2_session *h2, int32_t id, uint32_t code, void *arg)
{
	struct gconn *c = arg;
	struct gstream *st;

	(void)code;
	if ((st = nghttp2_session_get_stream_user_data(h2, id)) != NULL) {
		nghttp2_session_set_stream_user_data(h2, id, NULL);
		if (st->call != NULL)
			conn_abandoned(c);
		grpc_stream_free(c, st);
	}
	return 0;
}

/* ---- connections ------------------------------------------------------ */

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
	if (c->goaway)
		return;
	c->goaway = true;
	nghttp2_submit_goaway(c->h2, NGHTTP2_FLAG_NONE,
	    nghttp2_session_get_last_proc_stream_id(c->h2), NGHTTP2_NO_ERROR,
	    NULL, 0);
}

/* Start the waiting requests of c while there are places. */
static void
conn_start_waiting(struct gconn *c)
{
	struct gstream *st;

	for (st = c->streams;
	     st != NULL && c->nwaiting > 0 && grpc_call_has_place(c);
	     st = st->next)
		if (st->waiting) {
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
	struct gstream *st;

	for (c = l->conns; c != NULL; c = cn) {
		cn = c->next;
		/* A client that reads nothing at all: what it was sent has
		 * stayed in a full socket for idle_timeout (every loop turn
		 * writes what it submits, so only a full socket leaves
		 * anything to write here). */
		if (nghttp2_session_want_write(c->h2) &&
		    now - c->out_us > idle_us) {
			grpc_conn_close(c);
			continue;
		}
		for (st = c->streams; st != NULL; st = st->next)
			if (!st->answered && st->call == NULL &&
			    now - st->start_us > req_us) {
				if (st->waiting) {
					st->waiting = false;
					c->nwaiting--;
				}
				/* And reset it once the answer is out
				 * (on_frame_sent): its client may never
				 * end it. */
				st->cut = true;
				grpc_answer_status(st, GRPC_DEADLINE_EXCEEDED,
				    "request_timeout passed before the "
				    "request was whole or had a place");
			} else if (st->answered && !st->reset &&
			    now - st->answered_us > req_us) {
				/* Its answer could not be written (a client
				 * whose window stays shut): give it up. */
				st->reset = true;
				nghttp2_submit_rst_stream(c->h2,
				    NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
			}
		if (l->quiesced)
			conn_goaway(c);
		if (c->nstreams == 0 &&
		    (l->quiesced || now - c->last_us > idle_us)) {
			conn_goaway(c);
			nghttp2_session_send(c->h2);
			grpc_conn_close(c);
			continue;
		}
		grpc_conn_flush(c);
	}
}

static void *
loop_main(void *arg)
{
	struct gloop *l = arg;
	struct grpc_server *s = l->s;
	struct epoll_event evs[64];
	int64_t next_sweep = 0, left;
	uint64_t count;
	uint32_t e;
	int i, n, wait_ms;

	for (;;) {
		if (atomic_load(&s->stop) && atomic_load(&s->pending) == 0)
			break;
		if (atomic_load(&s->quiesce) && !l->quiesced) {
			l->quiesced = true;
			if (l->listening)
				epoll_ctl(l->epfd, EPOLL_CTL_DEL, s->lfd, NULL);
			l->listening = false;
			next_sweep = 0;
		}
		wait_ms = GRPC_TICK_MS;
		if (!l->listening && !l->quiesced) {
			left = l->accept_at_us - util_monotonic_us();
			if (left <= 0)
				(void)grpc_listen_resume(l);
			else if (left / 1000 + 1 < wait_ms)
				wait_ms = (int)(left / 1000 + 1);
		}
		n = epoll_wait(l->epfd, evs, 64, wait_ms);
		l->cur = config_slot_get(&s->cfg);
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
			if ((e & (EPOLLERR | EPOLLHUP)) &&
			    !grpc_conn_reading(p))
				grpc_conn_close(p);
			else if (e & (EPOLLIN | EPOLLERR | EPOLLHUP))
				grpc_conn_read(p);
			else if (e & EPOLLOUT)
				grpc_conn_flush(p);
		}
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

int
grpc_h2_callbacks_new(struct grpc_server *s)
{
	if (nghttp2_session_callbacks_new(&s->cbs) != 0 ||
	    nghttp2_option_new(&s->opt) != 0)
		return -1;
	nghttp2_session_callbacks_set_send_callback(s->cbs, on_send);
	nghttp2_session_callbacks_set_on_begin_headers_callback(s->cbs,
	    on_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(s->cbs, on_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(s->cbs,
	    on_data);
	nghttp2_session_callbacks_set_on_frame_recv_callback(s->cbs, on_frame);
	nghttp2_session_callbacks_set_on_stream_close_callback(s->cbs,
	    on_close);
	nghttp2_session_callbacks_set_on_frame_send_callback(s->cbs,
	    on_frame_sent);
	/* RST_STREAM floods (CVE-2023-44487): GOAWAY past the rate. */
	nghttp2_option_set_stream_reset_rate_limit(s->opt, GRPC_RESET_BURST,
	    GRPC_RESET_RATE);
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
