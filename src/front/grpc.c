/*
 * grpc.c - the gRPC server (see grpc.h): connections, HTTP/2 through
 * libnghttp2, gRPC's framing, and the calls.
 *
 * A call is one HTTP/2 stream: request headers (:method POST, :path the
 * method, content-type application/grpc, grpc-timeout), one
 * length-prefixed message, end of stream.  The answer is headers, one
 * length-prefixed message and trailers with grpc-status; a call that
 * fails before a message is answered "trailers-only" (the status in the
 * headers).  nghttp2 does the HTTP/2 framing, flow control and stream
 * states; this file keeps per stream only what the call needs.
 *
 * Ownership: a struct gstream belongs to its connection and dies with its
 * HTTP/2 stream.  A decision or health probe in the store's hands is a
 * struct gcall, owned by the store until its completion queues it here;
 * the loop then answers the stream if it still exists and frees the call.
 * A stream that closes first only unlinks itself from its call.
 *
 * Threads: `threads` event loops (struct gloop), as many as HTTP has,
 * each with its own epoll holding the shared listener (EPOLLEXCLUSIVE,
 * so one loop wakes per new connection); a connection, its streams and
 * its calls' answers belong to the loop that accepted it.  call_done()
 * runs on the store's thread and only queues to that loop; the
 * grpc_server_set_config/quiesce/inflight/stop entry points run on any
 * thread, through the config slot, atomics and each loop's eventfd.
 *
 * What one client can cost (docs/security.md, docs/grpc.md): a
 * connection has at most GRPC_MAX_STREAMS calls in the store at once,
 * counting those whose stream it has reset, and is not read while it
 * has that many; a whole request beyond it, or beyond GRPC_MAX_PENDING
 * calls in the store for the whole server, waits for a place.  A
 * connection that abandons more calls than it has had answered (plus
 * GRPC_MAX_STREAMS) is sent GOAWAY, as is one resetting streams faster
 * than nghttp2's reset rate limit allows.
 */
#include "front/grpc.h"

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
#include "health.pb-c.h"
#include "base/log.h"
#include "base/metrics.h"
#include "front/rls.h"
#include "base/util.h"

#define GRPC_PREFIX	 5   /* compressed flag, length (BE) */
#define GRPC_MAX_STREAMS 128 /* concurrent calls per connection */
#define GRPC_READ_CHUNK	 16384
/* Request bytes held per connection. */
#define GRPC_CONN_BUFFERED   (256 * 1024)
#define GRPC_TICK_MS	     250  /* timeouts are checked this often */
#define GRPC_ACCEPT_PAUSE_MS 100  /* out of descriptors: accept later */
#define GRPC_ACCEPT_BATCH    16	  /* accepted per wake, so loops share */
#define GRPC_MAX_PENDING     1024 /* calls in the store, whole server */
#define GRPC_RESET_BURST     512  /* RST_STREAM frames a client may */
#define GRPC_RESET_RATE	     128  /* send at once, and then per second */
#define GRPC_HEADER_STRIKES  2	  /* header lists refused, then GOAWAY */

#define PATH_RLS \
	"/envoy.service.ratelimit.v3.RateLimitService/" \
	"ShouldRateLimit"
#define PATH_HEALTH "/grpc.health.v1.Health/Check"
#define SERVICE_RLS "envoy.service.ratelimit.v3.RateLimitService"

enum gmethod { M_NONE, M_RLS, M_HEALTH, M_OTHER };

struct gconn;
struct gcall;

struct gstream {
	int32_t id;
	struct gconn *c;
	enum gmethod method;
	bool post, grpc_type; /* :method POST, application/grpc */
	bool too_big;	      /* the message passed the limit */
	bool answered;
	bool cut;	     /* reset once its answer is out */
	bool waiting;	     /* whole, waiting for a place */
	size_t header_bytes; /* decoded, as HTTP/2 counts them */
	bool reset;	     /* RST_STREAM submitted */
	int64_t start_us;    /* monotonic, at its first header */
	int64_t answered_us; /* when its answer was submitted */
	int64_t timeout_us;  /* grpc-timeout, or 0 */
	uint8_t *in;	     /* the request's bytes */
	size_t inlen, incap;
	uint8_t *out; /* the framed response message */
	size_t outlen, outoff;
	int status;	    /* grpc-status for the trailers */
	struct gcall *call; /* in the store's hands, or NULL */
	struct gstream *next, *prev;
};

struct gconn {
	int fd;
	struct grpc_server *s;
	struct gloop *l; /* the loop that owns it */
	nghttp2_session *h2;
	struct gstream *streams;
	int nstreams;
	int ncalls;	 /* its calls in the store, their
			  * streams reset or not */
	int nwaiting;	 /* streams with waiting set */
	int credit;	 /* calls it may still abandon */
	int strikes;	 /* header lists refused */
	size_t buffered; /* request bytes its streams hold */
	int64_t last_us; /* last read, monotonic */
	int64_t out_us;	 /* last byte written, or nothing
			  * left to write */
	uint32_t events; /* what its epoll entry watches */
	bool goaway;	 /* GOAWAY sent */
	bool dead;	 /* closed; freed when ncalls is 0 */
	struct gconn *next, *prev;
};

/* A decision or a probe in the store's hands. */
struct gcall {
	struct grpc_server *s;
	struct gconn *c;    /* kept allocated while it is here */
	struct gstream *st; /* NULL once the stream is gone */
	struct config *cfg; /* one reference */
	enum gmethod method;
	struct rls_call rls;	   /* M_RLS */
	struct backend_call probe; /* M_HEALTH */
	struct gcall *qnext;
};

/* One event loop: its thread, epoll and connections. */
struct gloop {
	struct grpc_server *s;
	int efd, epfd;
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t lock; /* guards the done queue */
	struct gcall *done_head, *done_tail;
	bool quiesced;	      /* the loop acted on quiesce */
	bool listening;	      /* the listener is in the epoll */
	bool fd_warned;	      /* out of descriptors, logged */
	int64_t accept_at_us; /* paused: listen again then */
	struct config *cur;   /* the loop's snapshot for this turn */
	struct gconn *conns;
};

struct grpc_server {
	int lfd;
	const struct decider *decider;
	struct metrics *metrics;
	struct config_slot cfg; /* the snapshot served */

	atomic_bool quiesce, stop;
	atomic_int inflight; /* calls received, not answered */
	atomic_int pending;  /* gcalls not yet back from the store */
	atomic_int nconns;   /* open connections, every loop */
	nghttp2_session_callbacks *cbs;
	nghttp2_option *opt;
	struct gloop *loops;
	int nloops;
};

/* epoll tags for the two fds that are not connections. */
static char tag_listen, tag_event;

void
grpc_server_set_config(struct grpc_server *s, struct config *cfg)
{
	config_slot_set(&s->cfg, cfg);
}

static void
wake(struct gloop *l)
{
	uint64_t one = 1;

	(void)!write(l->efd, &one, sizeof(one));
}

/* ---- answers ---------------------------------------------------------- */

/* grpc-message is percent-encoded (the gRPC spec): printable ASCII but
 * '%' as is, the rest %XX. */
static void
percent_encode(const char *in, char *out, size_t outlen)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (; *in != '\0' && o + 4 < outlen; in++) {
		unsigned char ch = (unsigned char)*in;

		if (ch >= 0x20 && ch < 0x7f && ch != '%')
			out[o++] = (char)ch;
		else {
			out[o++] = '%';
			out[o++] = hex[ch >> 4];
			out[o++] = hex[ch & 15];
		}
	}
	out[o] = '\0';
}

#define NV(n, v) \
	{ \
		(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), \
		    NGHTTP2_NV_FLAG_NONE \
	}

/* Answer a call that failed: trailers-only, the status in the headers. */
static void
answer_status(struct gstream *st, int status, const char *message)
{
	char code[16], msg[512];

	if (st->answered)
		return;
	st->answered = true;
	st->answered_us = util_monotonic_us();
	snprintf(code, sizeof(code), "%d", status);
	percent_encode(message, msg, sizeof(msg));
	metrics_grpc_response(st->c->s->metrics, status);
	atomic_fetch_sub(&st->c->s->inflight, 1);
	{
		nghttp2_nv nv[] = {
			NV(":status", "200"),
			NV("content-type", "application/grpc"),
			NV("grpc-status", code),
			NV("grpc-message", msg),
		};

		if (nghttp2_submit_response(st->c->h2, st->id, nv,
			msg[0] != '\0' ? 4 : 3, NULL) != 0)
			nghttp2_submit_rst_stream(st->c->h2, NGHTTP2_FLAG_NONE,
			    st->id, NGHTTP2_INTERNAL_ERROR);
	}
}

/* The response message, then the trailers (grpc-status 0). */
static ssize_t
read_out(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t length,
    uint32_t *flags, nghttp2_data_source *source, void *arg)
{
	struct gstream *st = source->ptr;
	size_t n = st->outlen - st->outoff;
	nghttp2_nv trailer[] = { NV("grpc-status", "0") };

	(void)arg;
	if (n > length)
		n = length;
	memcpy(buf, st->out + st->outoff, n);
	st->outoff += n;
	if (st->outoff == st->outlen) {
		*flags |= NGHTTP2_DATA_FLAG_EOF |
		    NGHTTP2_DATA_FLAG_NO_END_STREAM;
		if (nghttp2_submit_trailer(h2, id, trailer, 1) != 0)
			return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	}
	return (ssize_t)n;
}

/* Answer with msg (rl_malloc, GRPC_PREFIX bytes at its front free):
 * ownership passes to the stream. */
static void
answer_message(struct gstream *st, uint8_t *msg, size_t len)
{
	nghttp2_nv nv[] = {
		NV(":status", "200"),
		NV("content-type", "application/grpc"),
	};
	nghttp2_data_provider dp;
	size_t body = len - GRPC_PREFIX;

	if (st->answered) {
		rl_free(msg);
		return;
	}
	msg[0] = 0;
	msg[1] = (uint8_t)(body >> 24);
	msg[2] = (uint8_t)(body >> 16);
	msg[3] = (uint8_t)(body >> 8);
	msg[4] = (uint8_t)body;
	st->out = msg;
	st->outlen = len;
	st->outoff = 0;
	st->answered = true;
	st->answered_us = util_monotonic_us();
	dp.source.ptr = st;
	dp.read_callback = read_out;
	metrics_grpc_response(st->c->s->metrics, GRPC_OK);
	atomic_fetch_sub(&st->c->s->inflight, 1);
	if (nghttp2_submit_response(st->c->h2, st->id, nv, 2, &dp) != 0)
		nghttp2_submit_rst_stream(st->c->h2, NGHTTP2_FLAG_NONE, st->id,
		    NGHTTP2_INTERNAL_ERROR);
}

static void
answer_health(struct gstream *st, bool serving)
{
	Grpc__Health__V1__HealthCheckResponse r =
	    GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	size_t size;
	uint8_t *msg;

	r.status = serving ?
	    GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING :
	    GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
	size = grpc__health__v1__health_check_response__get_packed_size(&r);
	if ((msg = rl_malloc(GRPC_PREFIX + size)) == NULL) {
		answer_status(st, GRPC_INTERNAL, "out of memory");
		return;
	}
	grpc__health__v1__health_check_response__pack(&r, msg + GRPC_PREFIX);
	answer_message(st, msg, GRPC_PREFIX + size);
}

/* ---- calls ------------------------------------------------------------ */

static void
call_free(struct gcall *gc)
{
	if (gc->method == M_RLS)
		rls_call_clear(&gc->rls);
	config_unref(gc->cfg);
	rl_free(gc);
}

/* The store is done with gc (any thread): queue it for the loop. */
static void
call_done(void *arg)
{
	struct gcall *gc = arg;
	struct gloop *l = gc->c->l;

	pthread_mutex_lock(&l->lock);
	gc->qnext = NULL;
	if (l->done_tail != NULL)
		l->done_tail->qnext = gc;
	else
		l->done_head = gc;
	l->done_tail = gc;
	pthread_mutex_unlock(&l->lock);
	wake(l);
}

static void
probe_done(struct backend_call *call)
{
	call_done(call->arg);
}

/* Answer a call back from the store, if its stream is still there. */
static void
call_answer(struct gcall *gc)
{
	struct gstream *st = gc->st;
	char msg[DECIDE_MESSAGE_MAX + 64];
	enum grpc_status status;
	uint8_t *out;
	size_t outlen;

	if (st == NULL)
		return;
	st->call = NULL;
	if (gc->method == M_HEALTH) {
		answer_health(st, gc->probe.rc == 0);
		return;
	}
	status = rls_encode(&gc->rls, GRPC_PREFIX, &out, &outlen, msg,
	    sizeof(msg));
	if (status == GRPC_OK)
		answer_message(st, out, outlen);
	else
		answer_status(st, status, msg);
}

/* gc goes to the store for connection c: it holds one of c's places
 * (GRPC_MAX_STREAMS) and one of the server's (GRPC_MAX_PENDING) until it
 * comes back, whatever becomes of its stream. */
static void
call_enter(struct gcall *gc, struct gconn *c)
{
	gc->c = c;
	c->ncalls++;
	atomic_fetch_add(&c->s->pending, 1);
}

/* Is there a place in the store for one more call of c? */
static bool
call_has_place(const struct gconn *c)
{
	return c->ncalls < GRPC_MAX_STREAMS &&
	    atomic_load(&c->s->pending) < GRPC_MAX_PENDING;
}

/* The client's own deadline (grpc-timeout), or 0; the store keeps the
 * earlier of it and its own timeout from the call's arrival. */
static int64_t
call_deadline(const struct gstream *st)
{
	return st->timeout_us > 0 ? st->start_us + st->timeout_us : 0;
}

static void
start_rls(struct gstream *st, struct gcall *gc, const uint8_t *msg, size_t len)
{
	struct grpc_server *s = st->c->s;
	struct decide_job *job;
	char err[256];

	gc->method = M_RLS;
	if (rls_decode(&gc->rls, msg, len, gc->cfg->max_attributes, err,
		sizeof(err)) < 0) {
		answer_status(st, GRPC_INVALID_ARGUMENT, err);
		call_free(gc);
		return;
	}
	gc->rls.req.start_us = st->start_us;
	gc->rls.req.deadline_us = call_deadline(st);
	if (gc->rls.n == 0 ||
	    decide_prepare(s->decider, gc->cfg, &gc->rls.req, &gc->rls.decision,
		&job) == 0) {
		/* Settled without the store. */
		if (gc->rls.n == 0)
			gc->rls.decision = (struct decision){ .allowed = true };
		gc->st = st;
		call_answer(gc);
		call_free(gc);
		return;
	}
	gc->st = st;
	st->call = gc;
	call_enter(gc, st->c);
	decide_run(job, call_done, gc);
}

static void
start_health(struct gstream *st, struct gcall *gc, const uint8_t *msg,
    size_t len)
{
	Grpc__Health__V1__HealthCheckRequest *rq;
	struct grpc_server *s = st->c->s;
	bool known;

	gc->method = M_HEALTH;
	rq = grpc__health__v1__health_check_request__unpack(NULL, len, msg);
	if (rq == NULL) {
		answer_status(st, GRPC_INVALID_ARGUMENT,
		    "cannot parse a HealthCheckRequest");
		call_free(gc);
		return;
	}
	known = rq->service[0] == '\0' || strcmp(rq->service, SERVICE_RLS) == 0;
	grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
	if (!known) {
		answer_status(st, GRPC_NOT_FOUND, "unknown service");
		call_free(gc);
		return;
	}
	/* SERVING when the store answers a probe, as /readyz. */
	gc->st = st;
	st->call = gc;
	gc->probe.start_us = st->start_us;
	gc->probe.deadline_us = call_deadline(st);
	gc->probe.done = probe_done;
	gc->probe.arg = gc;
	call_enter(gc, st->c);
	backend_submit(s->decider->backend, &gc->probe);
}

/* Start the call of a whole, well-formed request (stream_request). */
static void
stream_start(struct gstream *st)
{
	uint32_t mlen = (uint32_t)(st->inlen - GRPC_PREFIX);
	struct gcall *gc;

	if ((gc = rl_calloc(1, sizeof(*gc))) == NULL) {
		answer_status(st, GRPC_INTERNAL, "out of memory");
		return;
	}
	gc->s = st->c->s;
	gc->cfg = config_ref(st->c->l->cur);
	if (st->method == M_RLS)
		start_rls(st, gc, st->in + GRPC_PREFIX, mlen);
	else
		start_health(st, gc, st->in + GRPC_PREFIX, mlen);
}

/* The whole request is in: check it, then start its call, or let it wait
 * while its connection (or the server) has no place in the store. */
static void
stream_request(struct gstream *st)
{
	uint32_t mlen;

	if (!st->post || st->method == M_NONE) {
		answer_status(st, GRPC_INTERNAL, "not a gRPC request");
		return;
	}
	if (st->method == M_OTHER) {
		answer_status(st, GRPC_UNIMPLEMENTED, "unknown method");
		return;
	}
	if (!st->grpc_type) {
		answer_status(st, GRPC_INTERNAL,
		    "content-type is not application/grpc");
		return;
	}
	if (st->too_big) {
		answer_status(st, GRPC_RESOURCE_EXHAUSTED,
		    "message larger than max_body_bytes");
		return;
	}
	if (st->inlen < GRPC_PREFIX) {
		answer_status(st, GRPC_INTERNAL, "no message");
		return;
	}
	if (st->in[0] != 0) {
		answer_status(st, GRPC_UNIMPLEMENTED,
		    "compressed messages are not supported");
		return;
	}
	mlen = (uint32_t)st->in[1] << 24 | (uint32_t)st->in[2] << 16 |
	    (uint32_t)st->in[3] << 8 | st->in[4];
	if (mlen != st->inlen - GRPC_PREFIX) {
		answer_status(st, GRPC_INTERNAL,
		    "a unary call carries one "
		    "whole message");
		return;
	}
	if (!call_has_place(st->c)) {
		/* Started by conn_start_waiting() once a call comes back. */
		st->waiting = true;
		st->c->nwaiting++;
		return;
	}
	stream_start(st);
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
	stream_request(st);
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

static void
stream_free(struct gconn *c, struct gstream *st)
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
		stream_free(c, st);
	}
	return 0;
}

/* ---- connections ------------------------------------------------------ */

static void
conn_close(struct gconn *c)
{
	struct gloop *l = c->l;

	/* Streams die with the session: their calls lose them first. */
	while (c->streams != NULL)
		stream_free(c, c->streams);
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
	 * last of them (drain_done). */
	if (c->ncalls > 0)
		c->dead = true;
	else
		rl_free(c);
}

/* Is c read?  Not while it has GRPC_MAX_STREAMS calls in the store or a
 * whole request waiting for a place: the rest stays in the socket, and
 * TCP holds the client back. */
static bool
conn_reading(const struct gconn *c)
{
	return c->ncalls < GRPC_MAX_STREAMS && c->nwaiting == 0;
}

/* Write what nghttp2 has; watch for input while c is read and for
 * output while the socket is full.  Closes a connection that is done or
 * failed (returns false then). */
static bool
conn_flush(struct gconn *c)
{
	struct epoll_event ev = { .data.ptr = c };
	bool want;

	if (nghttp2_session_send(c->h2) != 0) {
		conn_close(c);
		return false;
	}
	if (!nghttp2_session_want_read(c->h2) &&
	    !nghttp2_session_want_write(c->h2)) {
		conn_close(c);
		return false;
	}
	want = nghttp2_session_want_write(c->h2) != 0;
	if (!want)
		c->out_us = util_monotonic_us();
	ev.events = (conn_reading(c) ? EPOLLIN : 0) | (want ? EPOLLOUT : 0);
	if (ev.events != c->events) {
		epoll_ctl(c->l->epfd, EPOLL_CTL_MOD, c->fd, &ev);
		c->events = ev.events;
	}
	return true;
}

static void
conn_read(struct gconn *c)
{
	uint8_t buf[GRPC_READ_CHUNK];
	ssize_t n;

	while (conn_reading(c)) {
		n = recv(c->fd, buf, sizeof(buf), 0);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 ||
		    nghttp2_session_mem_recv(c->h2, buf, (size_t)n) < 0) {
			conn_close(c);
			return;
		}
		c->last_us = util_monotonic_us();
		if ((size_t)n < sizeof(buf))
			break;
	}
	conn_flush(c);
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
	     st != NULL && c->nwaiting > 0 && call_has_place(c); st = st->next)
		if (st->waiting) {
			st->waiting = false;
			c->nwaiting--;
			stream_start(st);
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
static int
listen_resume(struct gloop *l)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE,
		.data.ptr = &tag_listen };

	if (l->listening || l->quiesced)
		return 0;
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->s->lfd, &ev) != 0)
		return -1;
	l->listening = true;
	return 0;
}

/* A connection of loop l on fd (-1: none, for grpc_fuzz_feed), its
 * SETTINGS queued; linked into l's list.  NULL when out of memory. */
static struct gconn *
conn_new(struct gloop *l, int fd)
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

static void
accept_some(struct gloop *l)
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
		    (c = conn_new(l, fd)) == NULL) {
			close(fd);
			continue;
		}
		/* Headers, message and trailers leave in separate sends:
		 * without this, Nagle holds the last until an ACK. */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		ev = (struct epoll_event){ .events = EPOLLIN, .data.ptr = c };
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			conn_close(c); /* closes fd */
			continue;
		}
		conn_flush(c);
	}
}

/* Answer the calls the store gave back, start requests that waited for
 * their places, and write. */
static void
drain_done(struct gloop *l)
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
		call_answer(gc);
		call_free(gc);
		atomic_fetch_sub(&l->s->pending, 1);
		if (--c->ncalls == 0 && c->dead)
			rl_free(c);
	}
	for (c = l->conns; c != NULL; c = cn) {
		cn = c->next;
		if (c->nwaiting > 0)
			conn_start_waiting(c);
		conn_flush(c);
	}
}

/*
 * Once per tick: cut calls past request_timeout that never finished
 * sending or never had a place, reset streams whose answer could not be
 * written within request_timeout, close connections idle past
 * idle_timeout or unable to write for as long, and, quiescing, those with
 * nothing left in progress.
 */
static void
sweep(struct gloop *l)
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
			conn_close(c);
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
				answer_status(st, GRPC_DEADLINE_EXCEEDED,
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
			conn_close(c);
			continue;
		}
		conn_flush(c);
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
				(void)listen_resume(l);
			else if (left / 1000 + 1 < wait_ms)
				wait_ms = (int)(left / 1000 + 1);
		}
		n = epoll_wait(l->epfd, evs, 64, wait_ms);
		l->cur = config_slot_get(&s->cfg);
		for (i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;

			e = evs[i].events;
			if (p == &tag_event) {
				(void)!read(l->efd, &count, sizeof(count));
				continue;
			}
			if (p == &tag_listen) {
				accept_some(l);
				continue;
			}
			/* A connection not read now (conn_reading) still
			 * reports errors: nothing more can come from it. */
			if ((e & (EPOLLERR | EPOLLHUP)) && !conn_reading(p))
				conn_close(p);
			else if (e & (EPOLLIN | EPOLLERR | EPOLLHUP))
				conn_read(p);
			else if (e & EPOLLOUT)
				conn_flush(p);
		}
		/* The store's answers, including those given inline. */
		drain_done(l);
		if (util_monotonic_us() >= next_sweep) {
			sweep(l);
			next_sweep = util_monotonic_us() + GRPC_TICK_MS * 1000;
		}
		config_unref(l->cur);
		l->cur = NULL;
	}
	while (l->conns != NULL)
		conn_close(l->conns);
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
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &tag_event };

	l->s = s;
	if ((l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
	    (l->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
	    epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->efd, &ev) != 0 ||
	    listen_resume(l) != 0)
		return -1;
	return 0;
}

static int
make_callbacks(struct grpc_server *s)
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
	if (make_callbacks(s) != 0) {
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
		wake(&s->loops[i]);
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
		wake(&s->loops[i]);
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

	if (make_callbacks(&s) != 0)
		goto out;
	pthread_mutex_init(&l.lock, NULL);
	if ((c = conn_new(&l, -1)) == NULL)
		goto out_lock;
	/* In reads of up to 1,000 bytes, each followed by a loop turn: the
	 * store's answers (inline on the memory store), and the writes. */
	for (off = 0; off < len && l.conns == c; off += n) {
		n = len - off < 1000 ? len - off : 1000;
		if (!conn_reading(c))
			break;
		if (nghttp2_session_mem_recv(c->h2, data + off, n) < 0) {
			conn_close(c);
			break;
		}
		drain_done(&l);
	}
	rc = 0;
	/* Whatever is left dies with the connection; no call can still be
	 * in the store (the memory store answers inside the call). */
	while (l.conns != NULL)
		conn_close(l.conns);
	drain_done(&l);
out_lock:
	pthread_mutex_destroy(&l.lock);
out:
	if (s.cbs != NULL)
		nghttp2_session_callbacks_del(s.cbs);
	if (s.opt != NULL)
		nghttp2_option_del(s.opt);
	return rc;
}
