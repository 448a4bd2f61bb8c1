/*
 * grpc_call.c - the gRPC front's calls (grpc_priv.h, docs/grpc.md): a
 * whole request checked, ShouldRateLimit decided through rls.c and the
 * one decision path, Health/Check answered by a probe of the store as
 * /readyz is, the store's completion, and the answers in gRPC's framing
 * (headers, a length-prefixed message and trailers with grpc-status; or
 * trailers-only, the status in the headers, for a call that failed).
 *
 * Threads: call_done() runs on the store's thread and only queues the
 * call to its connection's loop; everything else here runs on that loop.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include <nghttp2/nghttp2.h>

#include "health.pb-c.h"
#include "base/metrics.h"
#include "base/util.h"
#include "front/access_log.h"
#include "front/grpc_priv.h"
#include "front/rls.h"

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
void
grpc_answer_status(struct gstream *st, int status, const char *message)
{
	char code[16], msg[512];

	if (st->answered)
		return;
	st->answered = true;
	st->answered_us = util_monotonic_us();
	grpc_stream_drop_request(st);
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
	grpc_stream_drop_request(st);
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
		grpc_answer_status(st, GRPC_INTERNAL, "out of memory");
		return;
	}
	grpc__health__v1__health_check_response__pack(&r, msg + GRPC_PREFIX);
	answer_message(st, msg, GRPC_PREFIX + size);
}

/* ---- calls ------------------------------------------------------------ */

void
grpc_call_free(struct gcall *gc)
{
	if (gc->method == M_RLS)
		rls_call_clear(&gc->rls);
	config_unref(gc->cfg);
	rl_free(gc);
}

/*
 * The store is done with gc (any thread): queue it for the loop, and wake
 * the loop while still holding its lock.  Once the lock is let go the
 * loop may drain gc, bring pending to 0, see stop, exit, and
 * grpc_server_stop() free the loops and close their eventfds: a wake after
 * the unlock could read freed memory and write to a descriptor reused by
 * then.  Nothing of l is touched after the unlock.
 */
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
	grpc_loop_wake(l);
	pthread_mutex_unlock(&l->lock);
}

static void
probe_done(struct backend_call *call)
{
	call_done(call->arg);
}

/* Answer a call back from the store, if its stream is still there. */
void
grpc_call_answer(struct gcall *gc)
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
		if (gc->probe.rc != 0 && gc->probe.kind == BACKEND_ERR_DEADLINE)
			grpc_answer_status(st, GRPC_DEADLINE_EXCEEDED,
			    "the deadline passed before the store answered");
		else
			answer_health(st, gc->probe.rc == 0);
		return;
	}
	status = rls_encode(&gc->rls, GRPC_PREFIX, &out, &outlen, msg,
	    sizeof(msg));
	if (gc->cfg->access_log)
		access_log_decision("grpc", &gc->rls.decision,
		    rls_answer_code(&gc->rls, status));
	if (status == GRPC_OK)
		answer_message(st, out, outlen);
	else
		grpc_answer_status(st, status, msg);
}

/* gc goes to the store for connection c, in the server's place that
 * grpc_stream_start() was given: it holds one of c's places
 * (GRPC_MAX_STREAMS) and that one of the server's (GRPC_MAX_PENDING)
 * until it comes back, whatever becomes of its stream. */
static void
call_enter(struct gcall *gc, struct gconn *c)
{
	gc->c = c;
	c->ncalls++;
}

/*
 * Take a place in the store for one more call of c, or false.  c's own
 * count belongs to its loop; the server's is shared by every loop, so
 * the place is reserved with a compare-and-swap: a load and a later
 * increment would let each loop take the last place at once.
 */
bool
grpc_call_take_place(const struct gconn *c)
{
	int n;

	if (c->ncalls >= GRPC_MAX_STREAMS)
		return false;
	n = atomic_load(&c->s->pending);
	while (n < GRPC_MAX_PENDING)
		if (atomic_compare_exchange_weak(&c->s->pending, &n, n + 1))
			return true;
	return false;
}

/* The client's own deadline (grpc-timeout), or 0; the store keeps the
 * earlier of it and its own timeout from the call's arrival. */
static int64_t
call_deadline(const struct gstream *st)
{
	return st->timeout_us >= 0 ? st->start_us + st->timeout_us : 0;
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
		grpc_answer_status(st, GRPC_INVALID_ARGUMENT, err);
		grpc_call_free(gc);
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
		grpc_call_answer(gc);
		grpc_call_free(gc);
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
		grpc_answer_status(st, GRPC_INVALID_ARGUMENT,
		    "cannot parse a HealthCheckRequest");
		grpc_call_free(gc);
		return;
	}
	known = rq->service[0] == '\0' || strcmp(rq->service, SERVICE_RLS) == 0;
	grpc__health__v1__health_check_request__free_unpacked(rq, NULL);
	if (!known) {
		grpc_answer_status(st, GRPC_NOT_FOUND, "unknown service");
		grpc_call_free(gc);
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

/* Start the call of a whole, well-formed request (grpc_stream_request)
 * in the place it was given; a call settled without the store gives the
 * place back. */
void
grpc_stream_start(struct gstream *st)
{
	uint32_t mlen = (uint32_t)(st->inlen - GRPC_PREFIX);
	struct gcall *gc;

	if ((gc = rl_calloc(1, sizeof(*gc))) == NULL) {
		grpc_answer_status(st, GRPC_INTERNAL, "out of memory");
		goto out;
	}
	gc->s = st->c->s;
	gc->cfg = config_ref(st->c->l->cur);
	if (st->method == M_RLS)
		start_rls(st, gc, st->in + GRPC_PREFIX, mlen);
	else
		start_health(st, gc, st->in + GRPC_PREFIX, mlen);
out:
	/* st->call: in the store's hands (call_enter). */
	if (st->call == NULL)
		atomic_fetch_sub(&st->c->s->pending, 1);
	/* Decoded (or refused): the call holds no request bytes. */
	grpc_stream_drop_request(st);
}

/* The whole request is in: check it, then start its call, or let it wait
 * while its connection (or the server) has no place in the store. */
void
grpc_stream_request(struct gstream *st)
{
	uint32_t mlen;

	if (!st->post || st->method == M_NONE) {
		grpc_answer_status(st, GRPC_INTERNAL, "not a gRPC request");
		return;
	}
	if (st->method == M_OTHER) {
		grpc_answer_status(st, GRPC_UNIMPLEMENTED, "unknown method");
		return;
	}
	if (!st->grpc_type) {
		grpc_answer_status(st, GRPC_INTERNAL,
		    "content-type is not application/grpc");
		return;
	}
	if (st->timeout_us == 0) {
		/* grpc-timeout 0: the client's deadline has passed. */
		grpc_answer_status(st, GRPC_DEADLINE_EXCEEDED,
		    "grpc-timeout 0: the deadline has passed");
		return;
	}
	if (st->too_big) {
		grpc_answer_status(st, GRPC_RESOURCE_EXHAUSTED,
		    "message larger than max_body_bytes");
		return;
	}
	if (st->over_budget) {
		grpc_answer_status(st, GRPC_RESOURCE_EXHAUSTED,
		    "the connection holds 256 KiB of unfinished requests");
		return;
	}
	if (st->inlen < GRPC_PREFIX) {
		grpc_answer_status(st, GRPC_INTERNAL, "no message");
		return;
	}
	if (st->in[0] != 0) {
		grpc_answer_status(st, GRPC_UNIMPLEMENTED,
		    "compressed messages are not supported");
		return;
	}
	mlen = (uint32_t)st->in[1] << 24 | (uint32_t)st->in[2] << 16 |
	    (uint32_t)st->in[3] << 8 | st->in[4];
	if (mlen != st->inlen - GRPC_PREFIX) {
		grpc_answer_status(st, GRPC_INTERNAL,
		    "a unary call carries one "
		    "whole message");
		return;
	}
	if (!grpc_call_take_place(st->c)) {
		/* Started by conn_start_waiting() once a call comes back. */
		st->waiting = true;
		st->c->nwaiting++;
		return;
	}
	grpc_stream_start(st);
}
