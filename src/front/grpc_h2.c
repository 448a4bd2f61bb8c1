/*
 * grpc_h2.c - the nghttp2 session callbacks of the gRPC front
 * (grpc_priv.h, docs/grpc.md): a stream per request HEADERS; the headers a
 * call needs, bounded by max_header_bytes (an HPACK bomb) with a GOAWAY
 * after GRPC_HEADER_STRIKES refusals; the message gathered up to
 * max_body_bytes and GRPC_CONN_BUFFERED, its bytes freed once decoded or
 * refused; END_STREAM handing the request to
 * grpc_call.c; a stream's close and the credit of calls abandoned by a
 * reset (CVE-2023-44487); the send to the socket; and the reset rate
 * limit of the session options (docs/security.md).
 *
 * Threads: nghttp2 calls these from grpc_conn_read() and grpc_conn_flush()
 * on the thread of the loop that owns the connection (or from
 * grpc_fuzz_feed()'s thread).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <nghttp2/nghttp2.h>

#include "base/log.h"
#include "base/util.h"
#include "front/grpc_priv.h"

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
	st->timeout_us = -1;
	st->next = c->streams;
	if (c->streams != NULL)
		c->streams->prev = st;
	c->streams = st;
	c->nstreams++;
	atomic_fetch_add(&c->s->inflight, 1);
	nghttp2_session_set_stream_user_data(h2, st->id, st);
	return 0;
}

/* grpc-timeout: up to 8 digits and a unit (H M S m u n), in
 * microseconds; -1 (no deadline) if bad.  0 is a deadline already passed
 * (docs/grpc.md); a timeout under a microsecond but not 0 counts as 1. */
static int64_t
parse_timeout(const uint8_t *v, size_t len)
{
	int64_t n = 0;
	size_t i;

	if (len < 2 || len > 9)
		return -1;
	for (i = 0; i + 1 < len; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
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
		return n == 0 ? 0 : n / 1000 > 0 ? n / 1000 : 1;
	}
	return -1;
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
	if (++c->strikes >= GRPC_HEADER_STRIKES && !c->calm) {
		c->calm = true;
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
	    st->too_big || st->over_budget || st->answered)
		return 0;
	max = (size_t)c->l->cur->max_body_bytes + GRPC_PREFIX;
	/* The buffer grows by doubling, never past max; the connection's
	 * budget counts what is allocated, not what was received. */
	cap = st->incap;
	if (st->inlen + len > cap) {
		cap = cap == 0 ? 256 : cap;
		while (cap < st->inlen + len)
			cap *= 2;
		if (cap > max)
			cap = max;
	}
	if (st->inlen + len > max ||
	    c->buffered - st->incap + cap > GRPC_CONN_BUFFERED) {
		/* Answered at END_STREAM; what it sent is of no use. */
		st->too_big = st->inlen + len > max;
		st->over_budget = !st->too_big;
		grpc_stream_drop_request(st);
		return 0;
	}
	if (cap != st->incap) {
		if ((n = rl_realloc(st->in, cap)) == NULL)
			return NGHTTP2_ERR_CALLBACK_FAILURE;
		c->buffered += cap - st->incap;
		st->in = n;
		st->incap = cap;
	}
	memcpy(st->in + st->inlen, data, len);
	st->inlen += len;
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

/*
 * GRPC_CONN_BUFFERED bounds the requests a connection has not had
 * decoded yet: still arriving, or whole and waiting for a place
 * (docs/grpc.md), counted as the buffers they hold.  Once a request is
 * decoded, refused or answered its buffer is freed and leaves the count,
 * so calls in the store or answers the client has not read yet hold none.
 */
void
grpc_stream_drop_request(struct gstream *st)
{
	st->c->buffered -= st->incap;
	rl_free(st->in);
	st->in = NULL;
	st->inlen = st->incap = 0;
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
	grpc_stream_drop_request(st);
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
	if (--c->credit > 0 || c->calm)
		return;
	c->calm = true;
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

/* The session callbacks every connection shares, and its options: a
 * client resetting streams past the rate is sent GOAWAY (docs/security.md). */
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
