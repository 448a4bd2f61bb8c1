/*
 * http.c - the HTTP front end on libmicrohttpd (see http.h): the server's
 * life cycle, the dispatch of libmicrohttpd's calls to the handlers
 * (http_handlers.c), and a request's life: its states and the one
 * function that moves it between them (http_request_enter()), and the one
 * submit step that hands a prepared call to the store (http_submit()).
 *
 * `threads` event loops (http_loop.c), each a thread of ours running its
 * own libmicrohttpd daemon in external epoll mode over the connections
 * the acceptor (http_accept.c) gives it in turn; HTTP/1.1 keep-alive is
 * libmicrohttpd's default.  The body is gathered (bounded by
 * max_body_bytes) and turned into attributes in the event loop, and
 * decide_prepare() runs there.  When the store must be asked and does not
 * answer inline (Redis), the connection is suspended and the job handed
 * to the store; its completion resumes the connection, and the loop
 * answers.  The first loop runs the Redis store's I/O itself
 * (core/backend.h, host_adopt), so that its requests go to Redis and back
 * without waking another thread; the other loops' calls reach it through
 * the store's queue.  No thread waits for Redis, and a slow call never
 * delays the other connections of a loop, /healthz included.  The memory
 * store answers inline.  Then the answer (http_response.c): JSON and the
 * RateLimit headers, rendered once from the decision.
 *
 * Shutdown: once quiesced, answers carry "Connection: close" so that
 * keep-alive clients go; http_server_stop() then answers new requests at
 * once (503) and waits until every suspended request was resumed and
 * answered (each store call completes by its deadline) before it stops
 * libmicrohttpd, which must not stop with connections suspended.
 *
 * The listening socket is bound by listen_socket_open() (listen.c) and
 * accepted on by http_accept.c, which hands each connection to
 * libmicrohttpd.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "base/util.h"
#include "core/config_slot.h"
#include "front/http.h"
#include "front/http_accept.h"
#include "front/http_guard.h"
#include "front/http_loop.h"
#include "front/http_priv.h"
#include "front/lease_wait.h"
#include "front/wait_timer.h"

#define HTTP_CONN_MEMORY    (16 * 1024) /* per connection, see start */
#define HTTP_MHD_CONN_LIMIT 1100000	/* past max_connections' bound */
/* The longest a stop waits for suspended requests: past every store
 * deadline (redis.timeout is at most a day, but a store fails its calls
 * at once when it stops). */
#define HTTP_STOP_WAIT_US (30 * 1000000LL)

void
http_server_set_config(struct http_server *s, struct config *cfg)
{
	config_slot_set(&s->cfg, cfg);
}

struct config *
http_server_get_config(struct http_server *s)
{
	return config_slot_get(&s->cfg);
}

void *
http_conn_ctx(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn,
	    MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci != NULL ? ci->socket_context : NULL;
}

/* Which states a move to each state may come from (a bit per state). */
#define RQ_BIT(st) (1u << (st))
static const unsigned rq_from[] = {
	[RQ_READING] = 0,
	[RQ_DECIDING] = RQ_BIT(RQ_READING),
	[RQ_WAITING_LEASE] = RQ_BIT(RQ_READING) | RQ_BIT(RQ_ANSWERING),
	[RQ_WAITING_TURN] = RQ_BIT(RQ_ANSWERING),
	[RQ_RESUMED] = RQ_BIT(RQ_DECIDING) | RQ_BIT(RQ_WAITING_LEASE) |
	    RQ_BIT(RQ_WAITING_TURN),
	[RQ_ANSWERING] = RQ_BIT(RQ_READING) | RQ_BIT(RQ_RESUMED),
	[RQ_DONE] = RQ_BIT(RQ_READING) | RQ_BIT(RQ_ANSWERING) |
	    RQ_BIT(RQ_RESUMED),
};

static bool
rq_is_suspended(enum request_state st)
{
	return st == RQ_DECIDING || st == RQ_WAITING_LEASE ||
	    st == RQ_WAITING_TURN;
}

/*
 * Move rq to state `to`, with what the move implies (http_priv.h, enum
 * request_state).  False only when a suspension is refused because the
 * server is stopping; rq is then where it was.  The suspension is counted
 * before the stop is looked at, so that http_server_stop() never misses
 * one under way.  The thread that has rq: the event loop, or the one that
 * resumes it (RESUMED; rq is the loop's again after).
 */
bool
http_request_enter(struct request *rq, enum request_state to)
{
	struct http_server *s = rq->s;
	enum request_state from = rq->state;

	assert((rq_from[to] & RQ_BIT(from)) != 0);
	if (rq_is_suspended(to)) {
		__atomic_add_fetch(&s->suspended, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) {
			__atomic_sub_fetch(&s->suspended, 1, __ATOMIC_SEQ_CST);
			return false;
		}
		if (to == RQ_WAITING_TURN && !rq->waited_turn) {
			rq->waited_turn = true; /* before the timer has it */
			metrics_waiting(s->metrics, METRICS_WAIT_TURN, 1);
		}
		if (to == RQ_WAITING_LEASE && !rq->waited_lease) {
			rq->waited_lease = true; /* before it is parked */
			metrics_waiting(s->metrics, METRICS_WAIT_LEASE, 1);
		}
		if (to == RQ_DECIDING && from == RQ_READING &&
		    EP_DECIDES(rq->ep))
			metrics_phase(s->metrics, METRICS_PHASE_PREPARE,
			    util_monotonic_us() - rq->arrived_us);
		rq->state = to;
		http_guard_waiting(http_conn_ctx(rq->conn), true);
		MHD_suspend_connection(rq->conn);
		return true;
	}
	if (from == RQ_RESUMED) {
		http_guard_waiting(http_conn_ctx(rq->conn), false);
		__atomic_sub_fetch(&s->suspended, 1, __ATOMIC_SEQ_CST);
		if (rq->replied_us != 0)
			metrics_phase(s->metrics, METRICS_PHASE_RESUME,
			    util_monotonic_us() - rq->replied_us);
		rq->replied_us = 0;
	}
	if (to == RQ_DONE) {
		if (rq->wait_slot)
			__atomic_sub_fetch(&s->waiting, 1, __ATOMIC_SEQ_CST);
		if (rq->waited_turn)
			metrics_waiting(s->metrics, METRICS_WAIT_TURN, -1);
		if (rq->waited_lease)
			metrics_waiting(s->metrics, METRICS_WAIT_LEASE, -1);
		rq->wait_slot = rq->waited_turn = rq->waited_lease = false;
	}
	if (to == RQ_RESUMED && from == RQ_DECIDING && EP_DECIDES(rq->ep))
		rq->replied_us = util_monotonic_us();
	rq->state = to;
	if (to == RQ_RESUMED) {
		struct http_loop *loop = rq->loop; /* rq may go at once */
		struct http_server *srv = rq->s;

		/* Counted until the wake is done: once resumed, the loop may
		 * answer at once and the suspended count reach 0, and the
		 * loop must outlive this (http_server_stop). */
		__atomic_add_fetch(&srv->resuming, 1, __ATOMIC_SEQ_CST);
		MHD_resume_connection(rq->conn); /* the loop's again */
		http_loop_wake(loop);
		__atomic_sub_fetch(&srv->resuming, 1, __ATOMIC_SEQ_CST);
	}
	return true;
}

/* The store answered, the time came, or the wait was cut (any thread):
 * wake the connection, and the loop calls the handler again.  A client
 * that shut down its sending side meanwhile is answered by
 * request_completed(): libmicrohttpd sees its end of input first on
 * resume and closes, with the socket still open. */
void
http_resume(void *arg)
{
	struct request *rq = arg;

	http_request_enter(rq, RQ_RESUMED);
}

/* The store answered inside the submit: nothing to wake. */
static void
inline_done(void *arg)
{
	(void)arg;
}

static void
call_inline_done(struct backend_call *call)
{
	(void)call;
}

/* One backend call is done (the store's thread): the last one wakes the
 * connection. */
static void
call_done(struct backend_call *call)
{
	struct request *rq = call->arg;

	if (__atomic_sub_fetch(&rq->calls_pending, 1, __ATOMIC_ACQ_REL) == 0)
		http_resume(rq);
}

/*
 * Hand a prepared store call to the store: a decision job (job != NULL;
 * n is 0) or n backend calls (their arg and done are set here).  The
 * memory store answers inside the submit: 1, answer now.  Else the
 * connection is suspended until the store's answer resumes it, and the
 * handler runs again: 0, return MHD_YES.  -1 when the server is stopping:
 * nothing was submitted (the job is cancelled), answer 503.  The event
 * loop.
 */
int
http_submit(struct request *rq, struct decide_job *job,
    struct backend_call *calls, size_t n)
{
	struct backend *b = rq->s->decider->backend;
	bool now = b->completes_inline;
	size_t i;

	for (i = 0; i < n; i++) {
		calls[i].arg = rq;
		calls[i].done = now ? call_inline_done : call_done;
	}
	if (now) {
		http_request_enter(rq, RQ_ANSWERING);
	} else {
		rq->calls_pending = job != NULL ? 1 : (int)n;
		if (!http_request_enter(rq, RQ_DECIDING)) {
			if (job != NULL)
				decide_cancel(job);
			return -1;
		}
	}
	if (job != NULL)
		decide_run(job, now ? inline_done : http_resume,
		    now ? NULL : rq);
	for (i = 0; i < n; i++)
		backend_submit(b, &calls[i]);
	return now ? 1 : 0;
}

/*
 * The first call for a request, its headers in: make the request (owned
 * by *con_cls until request_completed), refuse a request whose framing
 * cannot be trusted (http_framing.c), and note its Content-Length: a body
 * declared larger than max_body_bytes is refused without being read.  A
 * path with an encoded NUL (*con_cls is http_framing.c's mark) is routed
 * nowhere: its body is read and dropped, and the last call answers 400.
 */
static enum MHD_Result
request_begin(struct http_server *s, struct MHD_Connection *conn,
    const char *url, const char *method, void **con_cls)
{
	bool path_nul = http_framing_path_nul(*con_cls);
	struct request *rq;
	const char *cl;
	enum MHD_Result fr;
	bool answered;

	http_framing_headers_done(conn);
	if ((rq = http_loop_record_get(sizeof(*rq))) == NULL)
		return MHD_NO;
	rq->ep = path_nul ? EP_NUL_PATH : http_route(url, method);
	rq->s = s;
	rq->loop = http_loop_current();
	rq->conn = conn;
	rq->arrived_us = util_monotonic_us();
	rq->cfg = http_server_get_config(s);
	rq->state = RQ_READING;
	__atomic_add_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
	*con_cls = rq;
	fr = http_check_framing(s, conn, rq->cfg, url, &answered);
	if (answered)
		return fr;
	cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_CONTENT_LENGTH);
	rq->declared_len = cl != NULL ? (int64_t)strtoll(cl, NULL, 10) : -1;
	if (EP_HAS_BODY(rq->ep) && cl != NULL &&
	    strtoull(cl, NULL, 10) >
		(unsigned long long)rq->cfg->max_body_bytes) {
		/* Answered before the body: libmicrohttpd sends no "100
		 * Continue", reads none of it, and closes the connection. */
		rq->too_large = true;
		return http_refuse(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	}
	return MHD_YES;
}

/*
 * A piece of rq's body (*size bytes at data, all taken): kept for the
 * endpoints that read one, up to max_body_bytes; past it, or for the
 * others, counted and dropped.  MHD_NO when out of memory.
 */
static enum MHD_Result
request_gather(struct request *rq, const char *data, size_t *size)
{
	size_t n = *size;

	*size = 0;
	rq->body_seen += n;
	if (!EP_HAS_BODY(rq->ep) || rq->too_large)
		return MHD_YES; /* discard */
	if (rq->len + n > (size_t)rq->cfg->max_body_bytes) {
		rq->too_large = true;
		return MHD_YES;
	}
	if (rq->len + n > rq->cap) {
		/* 512 first: a body is rarely larger, and glibc serves 1 KiB
		 * or more from its large bins, merging every small block
		 * freed since first (malloc_consolidate). */
		size_t cap = rq->cap == 0 ? 512 : rq->cap;
		char *nb;

		while (cap < rq->len + n)
			cap *= 2;
		if ((nb = rl_realloc(rq->body, cap)) == NULL)
			return MHD_NO;
		rq->body = nb;
		rq->cap = cap;
	}
	memcpy(rq->body + rq->len, data, n);
	rq->len += n;
	return MHD_YES;
}

/*
 * The 405 of a known endpoint asked with a method it does not take, with
 * the Allow header RFC 9110 (15.5.6) requires: POST for the endpoints that
 * take a body, GET, HEAD for the others (docs/http.md, Errors).
 */
static enum MHD_Result
respond_bad_method(struct http_server *s, struct MHD_Connection *conn,
    const char *url, const char *method)
{
	bool post = strcmp(url, "/acquire") == 0 ||
	    strcmp(url, "/record") == 0 || strcmp(url, "/stats") == 0 ||
	    strcmp(url, "/report") == 0 || strcmp(url, "/release") == 0 ||
	    strcmp(url, "/renew") == 0;
	struct MHD_Response *r;
	char *text;

	text = http_error_text("method_not_allowed", "%s %s: use %s", method,
	    url, post ? "POST" : "GET or HEAD");
	if (text == NULL)
		return http_respond(s, conn, 500, NULL, "", 0, NULL);
	r = MHD_create_response_from_buffer(strlen(text), text,
	    MHD_RESPMEM_MUST_COPY);
	free(text);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW,
	    post ? "POST" : "GET, HEAD");
	return http_respond(s, conn, 405, JSON_TYPE, NULL, 0, r);
}

/*
 * libmicrohttpd calls this once when the headers are in, once per piece of
 * body, and once at the end.  Everything is answered in the last call: a
 * response queued earlier would make it close the connection.
 */
static enum MHD_Result
access_handler(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	struct http_server *s = cls;
	struct request *rq = *con_cls;

	(void)version;
	if (rq == NULL || http_framing_path_nul(rq))
		return request_begin(s, conn, url, method, con_cls);
	if (*upload_data_size > 0)
		return request_gather(rq, upload_data, upload_data_size);
	if (rq->state == RQ_RESUMED)
		http_request_enter(rq, RQ_ANSWERING);
	if (rq->state == RQ_READING && rq->declared_len >= 0 &&
	    rq->body_seen != (uint64_t)rq->declared_len)
		/* The body libmicrohttpd framed is not the one the header
		 * names (a folded Content-Length): what follows is not a
		 * request we can trust. */
		return http_refuse(s, conn, 400, "bad_request",
		    "the body is not "
		    "as long as its Content-Length says");
	switch (rq->ep) {
	case EP_ACQUIRE:
	case EP_AUTH:
		return http_handle_decision(s, conn, rq, url, method);
	case EP_READY:
		return http_handle_ready(s, conn, rq);
	case EP_RELEASE:
	case EP_RENEW:
		return http_handle_lease(s, conn, rq);
	case EP_RECORD:
	case EP_STATS:
		return http_handle_stats(s, conn, rq);
	case EP_REPORT:
		return http_handle_report(s, conn, rq);
	case EP_SIMPLE:
		return http_handle_simple(s, conn, url);
	case EP_BAD_METHOD:
		return respond_bad_method(s, conn, url, method);
	case EP_NUL_PATH:
		/* url is cut at the NUL: any route it named would be one
		 * the client did not ask for (docs/http.md, Errors). */
		return http_respond_error(s, conn, 400, "invalid_path",
		    "the path has an encoded NUL (%%00)");
	case EP_NOT_FOUND:
		break;
	}
	return http_respond_error(s, conn, 404, "not_found", "no endpoint %s",
	    url);
}

static void
request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct http_server *s = cls;
	struct request *rq = *con_cls;

	(void)toe;
	http_guard_request_done(http_conn_ctx(conn));
	if (rq == NULL || http_framing_path_nul(rq)) {
		/* No request made (ended before its headers were in). */
		*con_cls = NULL;
		return;
	}
	if (rq->state == RQ_RESUMED) {
		/* Resumed, then closed by libmicrohttpd before the handler
		 * ran: the client shut down its sending side while its
		 * request waited, and libmicrohttpd read that end of input
		 * first.  The socket is still open: answer on it. */
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
		    conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		if (EP_DECIDES(rq->ep) && ci != NULL && !http_wait_needed(rq) &&
		    !rq->cut && http_wait_raw_ready(rq) &&
		    http_answer_raw(s, ci->connect_fd, rq) &&
		    rq->cfg->access_log && log_enabled(LOG_LEVEL_INFO))
			http_log_access(rq);
	}
	if (rq->state != RQ_DONE)
		http_request_enter(rq, RQ_DONE);
	stats_request_clear(&rq->sr);
	config_unref(rq->cfg);
	decide_leases_free(&rq->decision);
	rl_free(rq->lease_key);
	rl_free(rq->body);
	rl_free(rq->rule);
	attrs_clear(&rq->attrs);
	http_loop_record_put(rq, sizeof(*rq));
	*con_cls = NULL;
	__atomic_sub_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
}

static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct http_server *s = cls;
	char msg[512];
	size_t n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	log_debug("http: %s", msg);
	if (s != NULL && http_framing_mhd_refused(s, msg))
		log_debug(
		    "http: that request was answered once, by the "
		    "daemon");
}

/* Stop the loops (the first gives the store's I/O back), then their
 * daemons. */
static void
loops_stop(struct http_server *s)
{
	size_t i;

	for (i = 0; s->loops != NULL && i < s->nloops; i++) {
		http_loop_stop(s->loops[i]);
		s->loops[i] = NULL;
	}
	for (i = 0; s->mhd != NULL && i < s->nloops; i++) {
		if (s->mhd[i] != NULL)
			MHD_stop_daemon(s->mhd[i]);
		s->mhd[i] = NULL;
	}
}

static void
server_free(struct http_server *s)
{
	http_accept_free(s->acceptor);
	loops_stop(s);
	rl_free(s->loops);
	rl_free(s->mhd);
	wait_timer_free(s->timer);
	http_guard_stop(s->guard);
	config_slot_destroy(&s->cfg);
	rl_free(s);
}

/* The guard's limits, from the current snapshot. */
static void
guard_limits(void *arg, int64_t *max_connections, int64_t *request_timeout_us)
{
	struct http_server *s = arg;
	struct config *c = http_server_get_config(s);

	*max_connections = c->max_connections;
	*request_timeout_us = c->request_timeout_ms * 1000;
	config_unref(c);
}

static enum MHD_Result
accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	struct http_server *s = cls;

	(void)addr;
	(void)addrlen;
	return http_guard_admit(s->guard) ? MHD_YES : MHD_NO;
}

static void
notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
    enum MHD_ConnectionNotificationCode toe)
{
	struct http_server *s = cls;
	const union MHD_ConnectionInfo *ci;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		ci = MHD_get_connection_info(conn,
		    MHD_CONNECTION_INFO_CONNECTION_FD);
		http_guard_opened(s->guard, ci != NULL ? ci->connect_fd : -1,
		    socket_context);
	} else {
		http_framing_headers_done(conn);
		http_guard_closed(s->guard, socket_context);
	}
}

/* The acceptor's: each loop in turn gets the next connection. */
static void
hand_connection(void *arg, int fd, const struct sockaddr *addr,
    socklen_t addrlen)
{
	struct http_server *s = arg;

	http_loop_add(s->loops[s->next_loop], fd, addr, addrlen);
	s->next_loop = (s->next_loop + 1) % s->nloops;
}

/* One loop's daemon: external epoll (http_loop.c runs it). */
static struct MHD_Daemon *
daemon_start(struct http_server *s, const struct config *cfg)
{
	unsigned int flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
	    MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET;

	/* The logger first: MHD logs with its own, to stderr, until it
	 * has seen this option.  A connection's memory holds its request
	 * headers and the answer's: HTTP_CONN_MEMORY covers the headers
	 * proxies send to /auth (8 KiB), and is what 1,000 idle keep-alive
	 * connections cost at most (the default is 32 KiB); twice
	 * max_header_bytes when that is larger.  No smaller: the request
	 * line and headers stay whole in it with a 64-byte record per
	 * header, and a request that does not fit gets libmicrohttpd's own
	 * 431 (check_limits tests a request at max_header_bytes).  Nor
	 * does a larger one cost less: libmicrohttpd 0.9.75 maps a pool
	 * over 32 KiB apart, but clears every byte of it after each
	 * request (MHD_pool_reset), so an idle keep-alive connection keeps
	 * all of it resident either way (docs/http.md).  The connection limit
	 * is the guard's (max_connections, refused at once, changed by a
	 * reload): libmicrohttpd's own is set past any it allows, since at
	 * its limit it stops accepting and new clients wait unanswered. */
	return MHD_start_daemon(flags, 0, accept_policy, s, access_handler, s,
	    MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_URI_LOG_CALLBACK,
	    http_framing_request_line, NULL, MHD_OPTION_NOTIFY_COMPLETED,
	    request_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
	    notify_connection, s, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned int)HTTP_MHD_CONN_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT,
	    (unsigned int)((cfg->idle_timeout_ms + 999) / 1000),
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT,
	    (size_t)(2 * cfg->max_header_bytes > HTTP_CONN_MEMORY ?
		    2 * cfg->max_header_bytes :
		    HTTP_CONN_MEMORY),
	    MHD_OPTION_END);
}

struct http_server *
http_server_start(int listen_fd, struct config *cfg,
    const struct decider *decider, struct lease_wait *leases,
    struct metrics *metrics, char *err, size_t errlen)
{
	struct http_server *s;
	struct backend *host;
	char name[16];
	size_t i;

	if ((s = rl_calloc(1, sizeof(*s))) == NULL) {
		snprintf(err, errlen, "out of memory");
		close(listen_fd);
		return NULL;
	}
	config_slot_init(&s->cfg, cfg);
	s->decider = decider;
	s->leases = leases;
	s->metrics = metrics;
	s->nloops = cfg->threads > 0 ? (size_t)cfg->threads : 1;
	if ((s->guard = http_guard_start(guard_limits, s, err, errlen)) == NULL)
		goto fail;
	if ((s->timer = wait_timer_new(err, errlen)) == NULL)
		goto fail;
	if ((s->mhd = rl_calloc(s->nloops, sizeof(*s->mhd))) == NULL ||
	    (s->loops = rl_calloc(s->nloops, sizeof(*s->loops))) == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* The first loop hosts the store's I/O when it has its own. */
	host = decider->backend;
	if (host == NULL || host->completes_inline ||
	    host->ops->host_adopt == NULL)
		host = NULL;
	for (i = 0; i < s->nloops; i++) {
		if ((s->mhd[i] = daemon_start(s, cfg)) == NULL) {
			snprintf(err, errlen,
			    "%s: cannot start the HTTP server", cfg->listen);
			goto fail;
		}
		snprintf(name, sizeof(name), "rl-http-%u",
		    (unsigned)(i % 1000));
		if ((s->loops[i] = http_loop_start(s->mhd[i],
			 i == 0 ? host : NULL, name, err, errlen)) == NULL)
			goto fail;
	}
	if ((s->acceptor = http_accept_start(listen_fd, hand_connection, s, err,
		 errlen)) == NULL)
		goto fail;
	return s;

fail:
	close(listen_fd);
	server_free(s);
	return NULL;
}

void
http_server_quiesce(struct http_server *s)
{
	struct config *c = http_server_get_config(s);

	/* Refuse new connections at once: the acceptor closes the
	 * listening socket.  First, so that no waiter answered below finds
	 * the listener open. */
	http_accept_stop(s->acceptor);
	/* Waiters due within shutdown_timeout are answered then; the
	 * others at once, 503 (docs/waiting.md). */
	wait_timer_cut(s->timer,
	    util_monotonic_us() + c->shutdown_timeout_ms * 1000);
	lease_wait_cut(s->leases); /* no known time: 503 now */
	config_unref(c);
	__atomic_store_n(&s->draining, true, __ATOMIC_RELEASE);
}

void
http_server_cut(struct http_server *s)
{
	wait_timer_cut(s->timer, util_monotonic_us());
	lease_wait_cut(s->leases);
}

int
http_server_inflight(struct http_server *s)
{
	return __atomic_load_n(&s->inflight, __ATOMIC_SEQ_CST);
}

void
http_server_stop(struct http_server *s)
{
	struct timespec tick = { 0, 1000 * 1000 };
	int64_t give_up;

	if (s == NULL)
		return;
	/* Suspend nothing more, and let every suspended request be resumed
	 * and answered: each store call ends by its deadline, and
	 * libmicrohttpd must not stop with connections suspended. */
	__atomic_store_n(&s->draining, true, __ATOMIC_RELEASE);
	__atomic_store_n(&s->stopping, true, __ATOMIC_SEQ_CST);
	wait_timer_cut(s->timer, util_monotonic_us());
	lease_wait_cut(s->leases);
	give_up = util_monotonic_us() + HTTP_STOP_WAIT_US;
	while ((__atomic_load_n(&s->suspended, __ATOMIC_SEQ_CST) > 0 ||
		   __atomic_load_n(&s->resuming, __ATOMIC_SEQ_CST) > 0) &&
	    util_monotonic_us() < give_up)
		nanosleep(&tick, NULL);
	if (__atomic_load_n(&s->suspended, __ATOMIC_SEQ_CST) > 0) {
		log_warnx(
		    "shutdown: %d requests still wait for the store; "
		    "exiting without them",
		    __atomic_load_n(&s->suspended, __ATOMIC_SEQ_CST));
		log_info("stopped");
		_exit(0);
	}
	http_accept_stop(s->acceptor);
	server_free(s);
}
