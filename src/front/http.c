/*
 * http.c - the HTTP front end on libmicrohttpd (see http.h).
 *
 * libmicrohttpd runs `threads` threads, each with its own event loop over
 * its connections (MHD_OPTION_THREAD_POOL_SIZE); HTTP/1.1 keep-alive is its
 * default.  The body is gathered (bounded by max_body_bytes) and turned into
 * attributes in the event loop, and decide_prepare() runs there.  When the
 * store must be asked and does not answer inline (Redis), the connection
 * is suspended and the job handed to the store; its completion, on the
 * store's I/O thread, resumes the connection, and the loop answers.  No
 * thread waits for Redis, and a slow call never delays the other
 * connections of a loop, /healthz included.  The memory store answers
 * inline.  Then the answer: JSON and the RateLimit headers.
 *
 * Shutdown: once quiesced, answers carry "Connection: close" so that
 * keep-alive clients go; http_server_stop() then answers new requests at
 * once (503) and waits until every suspended request was resumed and
 * answered (each store call completes by its deadline) before it stops
 * libmicrohttpd, which must not stop with connections suspended.
 *
 * The listening socket is bound by listen_socket_open() (listen.c).
 */
#include "front/http.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "core/client_ip.h"
#include "core/config_slot.h"
#include "front/http_guard.h"
#include "core/listen_addr.h"
#include "base/log.h"
#include "base/metrics.h"
#include "core/rate_headers.h"
#include "core/lease.h"
#include "front/lease_wait.h"
#include "core/request_json.h"
#include "core/stats_request.h"
#include "base/util.h"
#include "front/wait_timer.h"

#define JSON_TYPE "application/json"
#define HTTP_CONN_MEMORY (16 * 1024)	/* per connection, see start */
#define HTTP_MHD_CONN_LIMIT 1100000	/* past max_connections' bound */
/* The longest a stop waits for suspended requests: past every store
 * deadline (redis.timeout is at most a day, but a store fails its calls
 * at once when it stops). */
#define HTTP_STOP_WAIT_US (30 * 1000000LL)

enum endpoint {
	EP_ACQUIRE, EP_AUTH, EP_READY, EP_SIMPLE, EP_BAD_METHOD, EP_NOT_FOUND,
	EP_RECORD, EP_STATS,	/* docs/stats.md */
	EP_RELEASE, EP_RENEW	/* docs/leases.md */
};

/* The endpoints whose JSON body is read, and which are answered with a
 * decision when answered straight on the socket (resume()). */
#define EP_HAS_BODY(ep) ((ep) == EP_ACQUIRE || (ep) == EP_RECORD || \
	(ep) == EP_STATS || (ep) == EP_RELEASE || (ep) == EP_RENEW)
#define EP_DECIDES(ep) ((ep) == EP_ACQUIRE || (ep) == EP_AUTH)

struct http_server {
	struct MHD_Daemon *mhd;
	int listen_fd;			/* -1 once quiesced */
	struct config_slot cfg;		/* the snapshot served */
	const struct decider *decider;
	struct metrics *metrics;
	int inflight;			/* atomic */
	int suspended;			/* atomic: waiting for the store */
	bool draining;			/* atomic: quiesced; close after each
					 * answer */
	bool stopping;			/* atomic: suspend nothing more */
	struct http_guard *guard;	/* connection limit, request timeout */
	struct wait_timer *timer;	/* answers waiting requests */
	long long waiting;		/* atomic: requests that may wait */
	struct lease_wait *leases;	/* requests waiting for a lease;
					 * borrowed */
};

/* Per-request state, from the first call of the handler to completion. */
enum request_state { RQ_READING, RQ_WAITING, RQ_DECIDED };

struct request {
	enum endpoint ep;
	enum request_state state;
	struct http_server *s;
	struct config *cfg;		/* the snapshot this request uses */
	int64_t arrived_us;
	char *body;
	size_t len, cap;
	bool too_large;

	/* What decide takes and gives, kept here while the connection is
	 * suspended and the store decides. */
	struct MHD_Connection *conn;
	struct attrs attrs;
	char *rule;
	struct decide_request dr;
	struct decision decision;
	struct backend_call probe;	/* EP_READY */
	struct stats_request sr;	/* EP_RECORD, EP_STATS */
	struct rl_check lease_check;	/* EP_RELEASE, EP_RENEW, with probe */
	struct rl_result lease_out;
	char *lease_key;		/* lease_check's key and token */
	int stats_pending;		/* atomic: stat calls not done */
	bool answered_raw;		/* see resume() */
	bool resumed_seen;		/* the handler ran after the resume */
	bool answered;			/* an answer was queued */
	uint64_t body_seen;		/* body bytes, kept or not */
	/* Waiting for a turn (docs/waiting.md). */
	bool wait_slot;			/* counted in s->waiting */
	bool wait_over;			/* the timer fired */
	bool wait_cut;			/* fired early: shutting down */
	/* Waiting for a lease (docs/leases.md with wait_ms; lease_wait.h). */
	struct lease_waiter lw;
	bool lease_over;		/* no more waiting for a lease */
	int64_t wait_until_us;		/* arrival + wait_ms */
	int64_t lease_waited_ms;	/* answered after this wait */
	int64_t tried_us;		/* the last decision was asked then */
	bool counted_turn, counted_lease;	/* in the waiting gauge */
	int64_t declared_len;		/* Content-Length, or -1 */
};

/* --- snapshot --------------------------------------------------------- */

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

/* --- responses -------------------------------------------------------- */

static enum MHD_Result
respond(struct http_server *s, struct MHD_Connection *conn, int status,
    const char *type, const char *body, size_t len,
    struct MHD_Response *prepared)
{
	struct MHD_Response *r = prepared;
	enum MHD_Result ret;

	if (r == NULL)
		r = MHD_create_response_from_buffer(len, (void *)(uintptr_t)body,
		    MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	if (type != NULL)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE))
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION,
		    "close");
	ret = MHD_queue_response(conn, (unsigned)status, r);
	MHD_destroy_response(r);
	metrics_http_response(s->metrics, status);
	return ret;
}

/* The JSON body of an error: {"error": code, "message": ...}, in a new
 * buffer (free()), or NULL when out of memory. */
static char *
error_json(const char *code, const char *fmt, va_list ap)
{
	char msg[512], *text;
	json_t *o;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	o = json_pack("{s:s, s:s}", "error", code, "message", msg);
	text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return text;
}

static enum MHD_Result
respond_error(struct http_server *s, struct MHD_Connection *conn,
    int status, const char *code, const char *fmt, ...)
{
	enum MHD_Result ret;
	va_list ap;
	char *text;

	va_start(ap, fmt);
	text = error_json(code, fmt, ap);
	va_end(ap);
	if (text == NULL)
		return respond(s, conn, 500, NULL, "", 0, NULL);
	ret = respond(s, conn, status, JSON_TYPE, text, strlen(text), NULL);
	free(text);
	return ret;
}

/*
 * printf into stack (cap bytes) when it fits, else into a new allocation of
 * the exact size: a rule name or other data of any length is never cut or
 * read past.  Returns the text (free it with fmt_free(text, stack)) and its
 * length in *len, or NULL (OOM, or a format error).
 */
static char *
vfmt_buf(char *stack, size_t cap, size_t *len, const char *fmt, va_list ap)
{
	va_list again;
	char *p;
	int n;

	va_copy(again, ap);
	n = vsnprintf(stack, cap, fmt, ap);
	if (n < 0 || (size_t)n < cap) {
		va_end(again);
		*len = n < 0 ? 0 : (size_t)n;
		return n < 0 ? NULL : stack;
	}
	*len = (size_t)n;
	if ((p = rl_malloc((size_t)n + 1)) != NULL)
		vsnprintf(p, (size_t)n + 1, fmt, again);
	va_end(again);
	return p;
}

static char * __attribute__((format(printf, 4, 5)))
fmt_buf(char *stack, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	char *p;

	va_start(ap, fmt);
	p = vfmt_buf(stack, cap, len, fmt, ap);
	va_end(ap);
	return p;
}

static void
fmt_free(char *text, const char *stack)
{
	if (text != stack)
		rl_free(text);
}

/* Where headers go: an MHD response, or a raw answer being written. */
struct header_sink {
	struct MHD_Response *r;		/* or NULL */
	char *buf;			/* raw: NUL-terminated text */
	size_t len, cap;
	bool failed;
};

static void
sink_add(struct header_sink *k, const char *name, const char *value)
{
	size_t need;
	char *nb;

	if (k->r != NULL) {
		if (MHD_add_response_header(k->r, name, value) != MHD_YES)
			k->failed = true;
		return;
	}
	need = k->len + strlen(name) + strlen(value) + 5;
	if (need > k->cap) {
		if ((nb = rl_realloc(k->buf, need * 2)) == NULL) {
			k->failed = true;
			return;
		}
		k->buf = nb;
		k->cap = need * 2;
	}
	k->len += (size_t)snprintf(k->buf + k->len, k->cap - k->len,
	    "%s: %s\r\n", name, value);
}

/* The RateLimit headers of docs/http.md for the deciding rule. */
static void
add_rate_headers(struct header_sink *k, const struct decision *d)
{
	struct rate_header h[RATE_HEADERS_MAX];
	int i, n = rate_headers(d, h);

	for (i = 0; i < n; i++)
		sink_add(k, h[i].name, h[i].value);
}

/*
 * The status and body of a decided request (d->status == DECIDE_OK): JSON
 * for /acquire, empty for /auth.  The body is in stack or a new buffer
 * (fmt_free); NULL when out of memory.
 */
/*
 * ',"leases":[...]' for the leases a decision took (docs/leases.md), or "".
 * Rule names are [A-Za-z0-9_.-]+ and leases hex, digits and dots: nothing
 * to escape.  A new string, or NULL when out of memory.
 */
static char *
leases_json(const struct decision *d)
{
	size_t cap = 16, i, off;
	char *p;

	for (i = 0; i < d->nleases; i++)
		cap += strlen(d->leases[i].rule->name) +
		    strlen(d->leases[i].lease) + 64;
	if ((p = rl_malloc(cap)) == NULL)
		return NULL;
	p[0] = '\0';
	if (d->nleases == 0)
		return p;
	off = (size_t)snprintf(p, cap, ",\"leases\":[");
	for (i = 0; i < d->nleases; i++)
		off += (size_t)snprintf(p + off, cap - off, "%s{\"rule\":\"%s\","
		    "\"lease\":\"%s\",\"expires_ms\":%lld}", i > 0 ? "," : "",
		    d->leases[i].rule->name, d->leases[i].lease,
		    (long long)d->leases[i].expires_ms);
	snprintf(p + off, cap - off, "]");
	return p;
}

/* ",\"waited_ms\":N" for an answer that waited for its turn or for a
 * lease, else "". */
static const char *
waited_field(const struct request *rq, const struct decision *d, char *buf,
    size_t cap)
{
	int64_t ms = d->waited_ms + rq->lease_waited_ms;

	if (!d->allowed || ms <= 0)
		return "";
	snprintf(buf, cap, ",\"waited_ms\":%lld", (long long)ms);
	return buf;
}

static char *
decision_body(const struct request *rq, const struct decision *d,
    char *stack, size_t cap, size_t *n, int *status)
{
	char *leases, *body, waited[40];

	*n = 0;
	stack[0] = '\0';
	if (rq->ep == EP_AUTH)
		*status = d->allowed ? 200 : rq->cfg->auth_deny_status;
	else
		*status = d->allowed ? 200 : 429;
	if (rq->ep == EP_ACQUIRE && d->rule != NULL) {
		if ((leases = leases_json(d)) == NULL)
			return NULL;
		/* Rule names are [A-Za-z0-9_.-]+: nothing to escape. */
		body = fmt_buf(stack, cap, n, "{\"allowed\":%s,"
		    "\"rule\":\"%s\",\"limit\":%lld,\"remaining\":%lld,"
		    "\"reset_ms\":%lld,\"retry_after_ms\":%lld,"
		    "\"shadow\":%s%s%s%s}", d->allowed ? "true" : "false",
		    d->rule->name, (long long)d->limit,
		    (long long)d->remaining, (long long)d->reset_ms,
		    (long long)d->retry_after_ms, d->shadow ? "true" : "false",
		    d->degraded ? ",\"degraded\":true" : "",
		    waited_field(rq, d, waited, sizeof(waited)), leases);
		rl_free(leases);
		return body;
	}
	if (rq->ep == EP_ACQUIRE)
		return fmt_buf(stack, cap, n, "{\"allowed\":true,"
		    "\"rule\":null,\"limit\":null,\"remaining\":null,"
		    "\"reset_ms\":0,\"retry_after_ms\":0,\"shadow\":false%s}",
		    d->degraded ? ",\"degraded\":true" : "");
	return stack;
}

/* Answer a decision: JSON for /acquire, an empty body for /auth. */
static enum MHD_Result
respond_decision(struct http_server *s, struct MHD_Connection *conn,
    const struct request *rq, const struct decision *d)
{
	struct header_sink k = { 0 };
	char stack[512], *body;
	size_t n = 0;
	int status;

	if (d->status != DECIDE_OK) {
		int code = d->status == DECIDE_BACKEND_UNAVAILABLE ? 503 :
		    d->status == DECIDE_INTERNAL ? 500 : 400;

		return respond_error(s, conn, code,
		    decide_status_code(d->status), "%s", d->message);
	}
	if ((body = decision_body(rq, d, stack, sizeof(stack), &n,
	    &status)) == NULL)
		return respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	k.r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_COPY);
	fmt_free(body, stack);
	if (k.r == NULL)
		return MHD_NO;
	add_rate_headers(&k, d);
	return respond(s, conn, status, rq->ep == EP_ACQUIRE ? JSON_TYPE :
	    NULL, NULL, 0, k.r);
}

/*
 * Write the answer of a decided request straight to the socket, and close
 * after it: for a client that shut down its sending side while its request
 * waited for the store, whose answer libmicrohttpd would drop on resume
 * (it sees the end of input first).  False when it could not be written
 * whole; either way the connection is then closed.  Runs on the store's
 * thread while the connection is suspended: nothing else touches it.
 */
static bool
answer_raw(struct http_server *s, int fd, const struct request *rq)
{
	const struct decision *d = &rq->decision;
	struct header_sink k = { 0 };
	char stack[512], *body, head[160];
	size_t n = 0, off;
	int status = 503, hl;
	bool ok = false;
	const char *parts[3];
	size_t lens[3];
	ssize_t w;
	int i;

	if (d->status != DECIDE_OK) {
		int code = d->status == DECIDE_BACKEND_UNAVAILABLE ? 503 :
		    d->status == DECIDE_INTERNAL ? 500 : 400;
		json_t *o = json_pack("{s:s, s:s}", "error",
		    decide_status_code(d->status), "message", d->message);
		char *text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;

		json_decref(o);
		if (text == NULL)
			return false;
		body = fmt_buf(stack, sizeof(stack), &n, "%s", text);
		free(text);
		status = code;
		sink_add(&k, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
	} else {
		body = decision_body(rq, d, stack, sizeof(stack), &n, &status);
		if (rq->ep == EP_ACQUIRE)
			sink_add(&k, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
		add_rate_headers(&k, d);
	}
	if (body == NULL || k.failed)
		goto out;
	hl = snprintf(head, sizeof(head), "HTTP/1.1 %d %s\r\n"
	    "Connection: close\r\nContent-Length: %zu\r\n", status,
	    MHD_get_reason_phrase_for((unsigned)status), n);
	parts[0] = head;
	lens[0] = (size_t)hl;
	parts[1] = k.buf != NULL ? k.buf : "";
	lens[1] = k.len;
	parts[2] = body;
	lens[2] = n;
	for (i = 0; i < 3; i++) {
		for (off = 0; off < lens[i]; off += (size_t)w) {
			w = send(fd, parts[i] + off, lens[i] - off,
			    MSG_NOSIGNAL);
			if (w <= 0)
				goto out;
		}
		if (i == 1 && send(fd, "\r\n", 2, MSG_NOSIGNAL) != 2)
			goto out;
	}
	ok = true;
	metrics_http_response(s->metrics, status);
out:
	if (body != NULL)
		fmt_free(body, stack);
	rl_free(k.buf);
	return ok;
}

/* The fields of /acquire that are not attributes (docs/http.md). */
static const char *const acquire_reserved[] = { "cost", "rule", "wait_ms",
    NULL };

/*
 * The JSON body of /acquire into attributes, the forced rule and the cost.
 * Returns 0, or -1 after answering the error itself.
 */
static int
acquire_attrs(struct http_server *s, struct MHD_Connection *conn,
    const struct request *rq, struct attrs *a, char **rule, int64_t *cost,
    int64_t *wait_ms, enum MHD_Result *ret)
{
	struct request_error e;
	json_t *fields;
	const char *r = NULL;
	int rc = -1;

	*cost = -1;
	*rule = NULL;
	*wait_ms = 0;
	if (request_json_parse(rq->body, rq->len, acquire_reserved,
	    (size_t)rq->cfg->max_attributes, a, &fields, &e) < 0) {
		*ret = respond_error(s, conn, e.status, e.code, "%s",
		    e.message);
		return -1;
	}
	if (request_json_int(fields, "cost", 0, INT64_MAX, "invalid_cost",
	    cost, &e) < 0 ||
	    request_json_int(fields, "wait_ms", 0, rq->cfg->max_wait_ms,
	    "invalid_wait", wait_ms, &e) < 0 ||
	    request_json_string(fields, "rule", "unknown_rule", &r, &e) < 0) {
		*ret = respond_error(s, conn, e.status, e.code, "%s",
		    e.message);
		goto done;
	}
	if (r != NULL && (*rule = rl_strdup(r)) == NULL) {
		*ret = respond_error(s, conn, 500, "internal_error",
		    "out of memory");
		goto done;
	}
	rc = 0;
done:
	json_decref(fields);
	return rc;
}

struct header_walk {
	struct attrs *a;
	int failed;		/* 1: out of memory, 2: too many */
	size_t n, max;
};

static enum MHD_Result
collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct header_walk *w = cls;
	char name[256];
	size_t i, n;

	const char *old;

	(void)kind;
	if (w->max > 0 && ++w->n > w->max) {
		w->failed = 2;
		return MHD_NO;
	}
	n = util_strlcpy(name, "header.", sizeof(name));
	for (i = 0; key[i] != '\0' && n + 1 < sizeof(name); i++, n++)
		name[n] = (char)tolower((unsigned char)key[i]);
	name[n] = '\0';
	if (value == NULL)
		value = "";
	if ((old = attrs_get(w->a, name)) != NULL) {
		/* A header sent several times is one comma-separated list
		 * (RFC 9110 5.3): X-Forwarded-For from several proxies
		 * must not replace each other. */
		size_t ol = strlen(old), vl = strlen(value);
		char *joined = rl_malloc(ol + vl + 2);

		if (joined == NULL) {
			w->failed = 1;
			return MHD_NO;
		}
		memcpy(joined, old, ol);
		joined[ol] = ',';
		memcpy(joined + ol + 1, value, vl + 1);
		if (attrs_set(w->a, name, joined) < 0)
			w->failed = 1;
		rl_free(joined);
		return w->failed ? MHD_NO : MHD_YES;
	}
	if (attrs_set(w->a, name, value) < 0)
		w->failed = 1;
	return MHD_YES;
}

/* First non-empty of headers h1, h2, else fallback (may be NULL). */
static const char *
first_of(const struct attrs *a, const char *h1, const char *h2,
    const char *fallback)
{
	const char *v;

	if ((v = attrs_get(a, h1)) != NULL && *v != '\0')
		return v;
	if (h2 != NULL && (v = attrs_get(a, h2)) != NULL && *v != '\0')
		return v;
	return fallback;
}

/* The attributes of a proxied request (docs/http.md, /auth).  0, -1 (out of
 * memory) or -2 (more headers than max_attributes, less the four that
 * /auth derives). */
static int
auth_attrs(struct MHD_Connection *conn, const struct config *cfg,
    const char *url, const char *method, struct attrs *a)
{
	struct header_walk w = { a, 0, 0,
	    cfg->max_attributes > 4 ? (size_t)cfg->max_attributes - 4 : 1 };
	const union MHD_ConnectionInfo *ci;
	char peer[INET6_ADDRSTRLEN] = "", ip[CLIENT_IP_MAX];
	const char *v;

	MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, &w);
	if (w.failed)
		return w.failed == 2 ? -2 : -1;
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (ci != NULL && ci->client_addr != NULL) {
		const struct sockaddr *sa = ci->client_addr;

		if (sa->sa_family == AF_INET)
			inet_ntop(AF_INET,
			    &((const struct sockaddr_in *)sa)->sin_addr, peer,
			    sizeof(peer));
		else if (sa->sa_family == AF_INET6)
			inet_ntop(AF_INET6,
			    &((const struct sockaddr_in6 *)sa)->sin6_addr,
			    peer, sizeof(peer));
	}
	v = first_of(a, "header.x-original-method", "header.x-forwarded-method",
	    method);
	if (attrs_set(a, "method", v) < 0)
		return -1;
	/* Envoy's ext_authz sends the original path behind path_prefix:
	 * /auth/login is a check of /login. */
	if (strncmp(url, "/auth/", 6) == 0)
		url += 5;
	v = first_of(a, "header.x-original-uri", "header.x-forwarded-uri",
	    url);
	if (attrs_setn(a, "path", v, strcspn(v, "?")) < 0)
		return -1;
	if ((v = first_of(a, "header.x-forwarded-host", "header.host",
	    NULL)) != NULL && attrs_set(a, "host", v) < 0)
		return -1;
	if (client_ip_pick(&cfg->auth_ip, attrs_get(a, "header.x-real-ip"),
	    attrs_get(a, "header.x-forwarded-for"),
	    peer[0] != '\0' ? peer : NULL, ip, sizeof(ip)) == 0 &&
	    attrs_set(a, "ip", ip) < 0)
		return -1;
	return 0;
}

/* --- handlers --------------------------------------------------------- */

static void
log_access(const struct request *rq)
{
	const struct decision *d = &rq->decision;
	char lim[24], rem[24], retry[24];
	const char *k[] = { "endpoint", "allowed", "rule", "limit",
	    "remaining", "retry_after_ms", "degraded" };
	const char *v[] = { rq->ep == EP_ACQUIRE ? "acquire" : "auth",
	    d->status != DECIDE_OK ? decide_status_code(d->status) :
	    d->allowed ? "true" : "false",
	    d->rule != NULL ? d->rule->name : "", lim, rem, retry,
	    d->degraded ? "true" : "false" };

	lim[0] = rem[0] = '\0';
	if (d->rule != NULL) {
		snprintf(lim, sizeof(lim), "%lld", (long long)d->limit);
		snprintf(rem, sizeof(rem), "%lld", (long long)d->remaining);
	}
	snprintf(retry, sizeof(retry), "%lld", (long long)d->retry_after_ms);
	log_fields(LOG_LEVEL_INFO, "decision", k, v, 7);
}

/* A decided request: answer it and log it. */
static enum MHD_Result
finish_decision(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	rq->answered = true;
	enum MHD_Result ret = respond_decision(s, conn, rq, &rq->decision);

	if (rq->cfg->access_log && log_enabled(LOG_LEVEL_INFO))
		log_access(rq);
	return ret;
}

/* Has the client shut down its sending side (a FIN is waiting)? */
static bool
client_half_closed(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn,
	    MHD_CONNECTION_INFO_CONNECTION_FD);
	char c;

	return ci != NULL && recv(ci->connect_fd, &c, 1,
	    MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* The guard's record of a connection (its socket context). */
static void *
conn_ctx(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn,
	    MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci != NULL ? ci->socket_context : NULL;
}

/* --- request framing ---------------------------------------------------- */

struct framing {
	int content_length;		/* Content-Length headers */
	const char *cl_first;
	bool cl_differ, cl_bad;
	int transfer_encoding;
	const char *te;
	bool bad_name;			/* a header name that is no token */
	size_t bytes;			/* names and values */
	size_t count;
};

/* RFC 9110 5.1: a field name is a token. */
static bool
is_token(const char *s)
{
	static const char extra[] = "!#$%&'*+-.^_`|~";

	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (!isalnum((unsigned char)*s) && strchr(extra, *s) == NULL)
			return false;
	return true;
}

static enum MHD_Result
framing_walk(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct framing *f = cls;

	(void)kind;
	if (value == NULL)
		value = "";
	f->count++;
	f->bytes += strlen(key) + strlen(value) + 4;
	/* libmicrohttpd turns "Content-Length:" folded onto a next line
	 * " 34" into a header named "Content-Length34": a framing header
	 * in disguise, which the proxy in front may have read as one. */
	if (!is_token(key) || (strncasecmp(key, "content-length", 14) == 0 &&
	    key[14] != '\0') || (strncasecmp(key, "transfer-encoding", 17) ==
	    0 && key[17] != '\0'))
		f->bad_name = true;
	if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
		if (value[0] == '\0' || strspn(value, "0123456789") !=
		    strlen(value))
			f->cl_bad = true;	/* empty (a folded line), signs */
		if (f->content_length++ > 0 && strcmp(f->cl_first, value) != 0)
			f->cl_differ = true;
		if (f->cl_first == NULL)
			f->cl_first = value;
	} else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
		f->transfer_encoding++;
		f->te = value;
	}
	return MHD_YES;
}

/* An error answer that closes its connection. */
static enum MHD_Result __attribute__((format(printf, 5, 6)))
refuse(struct http_server *s, struct MHD_Connection *conn, int status,
    const char *code, const char *fmt, ...)
{
	struct MHD_Response *r;
	va_list ap;
	char *text;

	va_start(ap, fmt);
	text = error_json(code, fmt, ap);
	va_end(ap);
	r = MHD_create_response_from_buffer(text != NULL ? strlen(text) : 0,
	    text != NULL ? text : (char *)"", MHD_RESPMEM_MUST_COPY);
	free(text);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	return respond(s, conn, status, JSON_TYPE, NULL, 0, r);
}

/*
 * Check how the request says where it ends (RFC 9112 6): one
 * Content-Length or chunked, never both, never two lengths, no header name
 * that is not a token (`Content-Length : 5` would leave its body to be
 * read as the next request), and the headers within max_header_bytes.
 * Returns MHD_YES to go on with *answered false, or the result of an
 * answer that closes the connection with *answered true.
 */
static enum MHD_Result
check_framing(struct http_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *url, bool *answered)
{
	struct framing f;

	memset(&f, 0, sizeof(f));
	*answered = true;
	MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_walk, &f);
	if (f.bytes + strlen(url) > (size_t)cfg->max_header_bytes)
		return refuse(s, conn, 431, "headers_too_large", "the request "
		    "line and headers are larger than %d bytes",
		    cfg->max_header_bytes);
	if (f.bad_name)
		return refuse(s, conn, 400, "bad_request", "a header name "
		    "is not a token");
	if (f.content_length > 0 && f.transfer_encoding > 0)
		return refuse(s, conn, 400, "bad_request", "both "
		    "Content-Length and Transfer-Encoding");
	if (f.content_length > 1 && f.cl_differ)
		return refuse(s, conn, 400, "bad_request", "Content-Length "
		    "headers that differ");
	if (f.cl_bad)
		return refuse(s, conn, 400, "bad_request", "a Content-Length "
		    "that is not a number");
	if (f.transfer_encoding > 1 || (f.transfer_encoding == 1 &&
	    strcasecmp(f.te, "chunked") != 0))
		return refuse(s, conn, 501, "not_implemented", "only the "
		    "chunked transfer coding is understood");
	*answered = false;
	return MHD_YES;
}

/*
 * Suspend rq's connection until the store answers; false when the server
 * is stopping (then nothing is suspended).  Counted first, so that
 * http_server_stop() never misses a suspension that is under way.
 */
static bool
suspend(struct http_server *s, struct request *rq)
{
	__atomic_add_fetch(&s->suspended, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) {
		__atomic_sub_fetch(&s->suspended, 1, __ATOMIC_SEQ_CST);
		return false;
	}
	rq->state = RQ_WAITING;
	http_guard_waiting(conn_ctx(rq->conn), true);
	MHD_suspend_connection(rq->conn);
	return true;
}

/* Allowed by a reservation whose time has not come yet. */
static bool
wait_needed(const struct request *rq)
{
	return rq->decision.status == DECIDE_OK && rq->decision.allowed &&
	    rq->decision.waited_ms > 0 && !rq->wait_over;
}

/* The store answered (any thread): wake the connection.  The loop then
 * calls the handler again, which answers and uncounts it.  A client that
 * shut down its sending side meanwhile is answered here, straight on the
 * socket: libmicrohttpd would see its end of input first on resume and
 * close without the answer. */
static void
resume(void *arg)
{
	struct request *rq = arg;
	const union MHD_ConnectionInfo *ci;

	if (EP_DECIDES(rq->ep) && !wait_needed(rq) && !rq->wait_cut &&
	    client_half_closed(rq->conn) &&
	    (ci = MHD_get_connection_info(rq->conn,
	    MHD_CONNECTION_INFO_CONNECTION_FD)) != NULL) {
		(void)answer_raw(rq->s, ci->connect_fd, rq);
		rq->answered_raw = true;
	}
	rq->state = RQ_DECIDED;
	MHD_resume_connection(rq->conn);
}

static void
probe_done(struct backend_call *call)
{
	resume(call->arg);
}

/* Called again after a resume: the request is no longer suspended. */
static void
resumed(struct http_server *s, struct request *rq)
{
	rq->resumed_seen = true;
	http_guard_waiting(conn_ctx(rq->conn), false);
	__atomic_sub_fetch(&s->suspended, 1, __ATOMIC_SEQ_CST);
}

static void
inline_done(void *arg)
{
	(void)arg;
}

static void
probe_inline_done(struct backend_call *call)
{
	(void)call;
}

/*
 * Waiting for a turn (docs/waiting.md).  A request with wait_ms takes a slot
 * of max_waiting for its whole life (past it, it is decided as if it had
 * no wait_ms: 429 at once when denied).  When the store reserved a time,
 * the connection is suspended and the one timer of the server resumes it
 * then (wait_fire), or at once with 503 shutting_down when a shutdown cut
 * it.  A client that left meanwhile keeps its reservation.
 */
static void
wait_take_slot(struct http_server *s, struct request *rq)
{
	if (rq->dr.wait_ms <= 0)
		return;
	if (__atomic_add_fetch(&s->waiting, 1, __ATOMIC_SEQ_CST) >
	    rq->cfg->max_waiting) {
		__atomic_sub_fetch(&s->waiting, 1, __ATOMIC_SEQ_CST);
		metrics_wait_full(s->metrics);
		rq->dr.wait_ms = 0;
		return;
	}
	rq->wait_slot = true;
}

/* The timer's thread: the time has come (or a shutdown cut it). */
static void
wait_fire(void *arg, bool cut)
{
	struct request *rq = arg;

	rq->wait_over = true;
	rq->wait_cut = cut;
	resume(rq);
}

/*
 * Waiting for a lease (docs/leases.md with wait_ms).  A request with a wait
 * slot that a concurrency rule denied, while every other rule could admit
 * it in time (decision.lease_wait), stays suspended in the daemon's
 * lease_wait queues (lease_wait.c).  Told TRY, it is decided again with
 * the wait left (lease_try(), on the queue's thread), and the store's
 * answer comes back to lease_tried(): denied the same way, it parks again
 * at its place; else it leaves the queue, which lets the next waiter of
 * the key try, and is answered.  At its deadline it is decided once more
 * without waiting, and answered whatever that says: the answer carries
 * the numbers of then.  A newcomer that may wait for a key others already
 * wait for queues behind them without trying, so that it cannot take a
 * lease freed for the first of them.
 */
static bool
lease_wait_needed(const struct request *rq)
{
	return rq->wait_slot && !rq->lease_over &&
	    rq->decision.status == DECIDE_OK && !rq->decision.allowed &&
	    rq->decision.lease_wait &&
	    util_monotonic_us() < rq->wait_until_us;
}

static void lease_try(struct request *rq);

/* Park rq (suspended) for key; when that fails, answer it now. */
static void
lease_park(struct request *rq, uint64_t key, int64_t retry_us)
{
	int rc;

	/* Counted before it is parked: once parked, another thread has it. */
	if (!rq->counted_lease)
		metrics_waiting(rq->s->metrics, METRICS_WAIT_LEASE, 1);
	rq->counted_lease = true;
	rc = lease_wait_park(rq->s->leases, &rq->lw, key, retry_us,
	    rq->wait_until_us, rq->tried_us);
	if (rc == 0)
		return;
	rq->lease_over = true;
	if (rc == -1) {			/* stopping */
		rq->wait_cut = true;
		resume(rq);
	} else				/* out of memory: decide now */
		lease_try(rq);
}

/* A try is done (the store's thread, or inline). */
static void
lease_tried(void *arg)
{
	struct request *rq = arg;
	int64_t now = util_monotonic_us();

	if (lease_wait_needed(rq)) {
		lease_park(rq, rq->decision.lease_key,
		    now + rq->decision.lease_retry_ms * 1000);
		return;
	}
	rq->lease_over = true;
	lease_wait_leave(rq->s->leases, &rq->lw);
	rq->lease_waited_ms = (now - rq->arrived_us) / 1000;
	resume(rq);
}

/* Decide rq again with the wait it has left (none once lease_over). */
static void
lease_try(struct request *rq)
{
	int64_t now = util_monotonic_us();
	struct decide_job *job;

	if (now >= rq->wait_until_us)
		rq->lease_over = true;
	rq->dr.wait_ms = rq->lease_over ? 0 :
	    (rq->wait_until_us - now) / 1000;
	rq->dr.start_us = now;
	rq->tried_us = now;
	decide_leases_free(&rq->decision);
	if (decide_prepare(rq->s->decider, rq->cfg, &rq->dr, &rq->decision,
	    &job) == 0) {
		lease_tried(rq);
		return;
	}
	decide_run(job, lease_tried, rq);
}

/* The queue's thread: what became of rq's wait. */
static void
lease_event(struct lease_waiter *w, enum lease_wait_event ev)
{
	struct request *rq = (struct request *)(void *)((char *)w -
	    offsetof(struct request, lw));

	switch (ev) {
	case LEASE_WAIT_TRY:
		lease_try(rq);
		break;
	case LEASE_WAIT_TIMEOUT:
		rq->lease_over = true;
		lease_try(rq);
		break;
	case LEASE_WAIT_CUT:
		rq->lease_over = true;
		rq->wait_cut = true;
		resume(rq);
		break;
	}
}

/*
 * A newcomer that may wait, whose job would take a lease of a key that
 * others of this daemon wait for: queue it behind them (1), or 0 to go on.
 */
static int
lease_queue_behind(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq, struct decide_job *job)
{
	uint64_t keys[8], key;
	size_t n;

	if (!rq->wait_slot || rq->lease_over ||
	    (n = decide_job_lease_keys(job, keys, 8)) == 0 ||
	    !lease_wait_any(s->leases, keys, n, &key))
		return 0;
	decide_cancel(job);
	rq->conn = conn;
	if (!suspend(s, rq)) {
		rq->wait_cut = true;
		return -1;
	}
	lease_park(rq, key, INT64_MAX);
	return 1;
}

/* A decided /acquire: wait for a lease, or for its reserved time, or
 * answer now. */
static enum MHD_Result
answer_decision(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	if (lease_wait_needed(rq)) {
		rq->conn = conn;
		if (suspend(s, rq)) {
			lease_park(rq, rq->decision.lease_key,
			    util_monotonic_us() +
			    rq->decision.lease_retry_ms * 1000);
			return MHD_YES;
		}
		rq->wait_cut = true;
	}
	if (wait_needed(rq)) {
		rq->conn = conn;
		if (!rq->counted_turn)	/* before the timer has it */
			metrics_waiting(s->metrics, METRICS_WAIT_TURN, 1);
		rq->counted_turn = true;
		if (!suspend(s, rq)) {
			rq->wait_cut = true;
		} else if (wait_timer_add(s->timer, util_monotonic_us() +
		    rq->decision.waited_ms * 1000, wait_fire, rq) == -1) {
			/* Out of memory: resume it at once, cut. */
			wait_fire(rq, true);
			return MHD_YES;
		} else
			return MHD_YES;
	}
	if (rq->wait_cut)
		return respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	return finish_decision(s, conn, rq);
}

/*
 * The last call for /acquire or /auth: gather attributes, decide what can
 * be decided here, and hand the rest to the store.  Called again after the
 * store's answer resumed the connection, with rq->state == RQ_DECIDED.
 */
static enum MHD_Result
handle_decision(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq, const char *url, const char *method)
{
	enum MHD_Result ret = MHD_NO;
	struct decide_job *job;
	int rc;

	if (rq->state == RQ_DECIDED) {
		resumed(s, rq);
		if (rq->answered_raw) {
			if (rq->cfg->access_log && log_enabled(LOG_LEVEL_INFO))
				log_access(rq);
			return MHD_NO;	/* answered; close */
		}
		return answer_decision(s, conn, rq);
	}
	if (rq->too_large)
		return respond_error(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	rq->dr.attrs = &rq->attrs;
	rq->dr.cost = -1;
	rq->dr.start_us = rq->arrived_us;
	if (rq->ep == EP_ACQUIRE) {
		if (acquire_attrs(s, conn, rq, &rq->attrs, &rq->rule,
		    &rq->dr.cost, &rq->dr.wait_ms, &ret) < 0)
			return ret;
		rq->dr.rule = rq->rule;
		rq->dr.leases = true;	/* /auth: concurrency rules skipped */
		wait_take_slot(s, rq);
		rq->wait_until_us = rq->arrived_us + rq->dr.wait_ms * 1000;
		rq->lw.fn = lease_event;
		rq->tried_us = util_monotonic_us();
	} else if ((rc = auth_attrs(conn, rq->cfg, url, method,
	    &rq->attrs)) < 0)
		return rc == -2 ? respond_error(s, conn, 400,
		    "too_many_attributes", "more than %d attributes (headers "
		    "included)", rq->cfg->max_attributes) :
		    respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	if (decide_prepare(s->decider, rq->cfg, &rq->dr, &rq->decision,
	    &job) == 0)
		return finish_decision(s, conn, rq);
	if ((rc = lease_queue_behind(s, conn, rq, job)) != 0)
		return rc == 1 ? MHD_YES : respond_error(s, conn, 503,
		    "shutting_down", "the server is shutting down");
	if (s->decider->backend->completes_inline) {
		decide_run(job, inline_done, NULL);
		return answer_decision(s, conn, rq);
	}
	rq->conn = conn;
	if (!suspend(s, rq)) {
		decide_cancel(job);
		return respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	}
	decide_run(job, resume, rq);
	return MHD_YES;
}

/* /readyz: a probe of the store, answered when it answers. */
static enum MHD_Result
handle_ready(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	if (rq->state == RQ_DECIDED) {
		resumed(s, rq);
	} else {
		memset(&rq->probe, 0, sizeof(rq->probe));
		rq->probe.deadline_us = 0;
		rq->probe.done = probe_done;
		rq->probe.arg = rq;
		rq->conn = conn;
		if (s->decider->backend->completes_inline) {
			rq->probe.done = probe_inline_done;
			backend_submit(s->decider->backend, &rq->probe);
		} else {
			if (!suspend(s, rq))
				return respond(s, conn, 503, "text/plain",
				    "not ready\n", 10, NULL);
			backend_submit(s->decider->backend, &rq->probe);
			return MHD_YES;
		}
	}
	return rq->probe.rc == 0 ?
	    respond(s, conn, 200, "text/plain", "ready\n", 6, NULL) :
	    respond(s, conn, 503, "text/plain", "not ready\n", 10, NULL);
}

/* One stat call is done (the store's thread, or inline): the last one
 * wakes the connection. */
static void
stat_done(struct backend_call *call)
{
	struct request *rq = call->arg;

	if (__atomic_sub_fetch(&rq->stats_pending, 1, __ATOMIC_ACQ_REL) == 0)
		resume(rq);
}

static void
stat_inline_done(struct backend_call *call)
{
	(void)call;
}

/* Every stat call is done: the answer, or the first store error. */
static enum MHD_Result
finish_stats(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	struct stats_request *sr = &rq->sr;
	enum MHD_Result ret;
	size_t i, len;
	char *text;

	for (i = 0; i < sr->n; i++)
		if (sr->calls[i].rc != 0)
			return respond_error(s, conn, 503,
			    "backend_unavailable", "stat %s: %s",
			    sr->defs[i]->rule.name, sr->calls[i].err);
	if (sr->record)
		for (i = 0; i < sr->n; i++)
			metrics_stat_record(s->metrics, sr->defs[i]->rule.name);
	if ((text = stats_request_answer(sr, &len)) == NULL)
		return respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	ret = respond(s, conn, 200, JSON_TYPE, text, len, NULL);
	free(text);
	return ret;
}

/*
 * POST /record and POST /stats (docs/stats.md): every check first
 * (stats_request.c), then one store call per applying stat; the
 * connection waits for the last of them when the store does not answer
 * inline.
 */
static enum MHD_Result
handle_stats(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	struct stats_request *sr = &rq->sr;
	struct request_error e;
	size_t i;

	if (rq->state == RQ_DECIDED) {
		resumed(s, rq);
		return finish_stats(s, conn, rq);
	}
	if (rq->too_large)
		return respond_error(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	if (stats_request_prepare(sr, rq->cfg, rq->body, rq->len,
	    rq->ep == EP_RECORD, &e) < 0)
		return respond_error(s, conn, e.status, e.code, "%s",
		    e.message);
	if (sr->n == 0)
		return finish_stats(s, conn, rq);
	for (i = 0; i < sr->n; i++) {
		sr->calls[i].start_us = rq->arrived_us;
		sr->calls[i].arg = rq;
		sr->calls[i].done = s->decider->backend->completes_inline ?
		    stat_inline_done : stat_done;
	}
	if (s->decider->backend->completes_inline) {
		for (i = 0; i < sr->n; i++)
			backend_submit(s->decider->backend, &sr->calls[i]);
		return finish_stats(s, conn, rq);
	}
	rq->conn = conn;
	rq->stats_pending = (int)sr->n;
	if (!suspend(s, rq))
		return respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	for (i = 0; i < sr->n; i++)
		backend_submit(s->decider->backend, &sr->calls[i]);
	return MHD_YES;
}

/*
 * POST /release and POST /renew (docs/leases.md): {"lease": "..."} to one
 * store call on the lease's key, answered when the store answers.  A
 * lease whose rule is gone, or no longer concurrency, cannot be renewed
 * (it is still released: it may be held until it expires).
 */
static enum MHD_Result
handle_lease(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	bool renew = rq->ep == EP_RENEW;
	const struct rule *r;
	struct lease_ref ref;
	json_t *root, *v;
	size_t plen;
	int rc;

	if (rq->state == RQ_DECIDED) {
		resumed(s, rq);
		goto answer;
	}
	if (rq->too_large)
		return respond_error(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	root = json_loadb(rq->body != NULL ? rq->body : "", rq->len, 0, NULL);
	if (root == NULL || !json_is_object(root)) {
		json_decref(root);
		return respond_error(s, conn, 400, "invalid_json",
		    "the body is not a JSON object");
	}
	v = json_object_get(root, "lease");
	rc = v != NULL && json_is_string(v) ? lease_parse(json_string_value(v),
	    json_string_length(v), &ref) : -1;
	json_decref(root);
	if (rc == -1)
		return respond_error(s, conn, 400, "invalid_lease",
		    "\"lease\" is not a lease this service handed out");
	r = config_find_rule(rq->cfg, ref.rule);
	if (r != NULL && r->algorithm != RL_ALG_CONCURRENCY)
		r = NULL;
	if (renew && r == NULL)
		return respond(s, conn, 200, JSON_TYPE, "{\"renewed\":false}",
		    17, NULL);
	plen = strlen(rq->cfg->redis.key_prefix);
	if ((rq->lease_key = rl_malloc(plen + ref.suffix_len + 1 +
	    LEASE_TOKEN_LEN + 1)) == NULL)
		return respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	memcpy(rq->lease_key, rq->cfg->redis.key_prefix, plen);
	memcpy(rq->lease_key + plen, ref.suffix, ref.suffix_len);
	rq->lease_key[plen + ref.suffix_len] = '\0';
	memcpy(rq->lease_key + plen + ref.suffix_len + 1, ref.token,
	    LEASE_TOKEN_LEN + 1);
	rq->lease_check = (struct rl_check){
		.algorithm = RL_ALG_CONCURRENCY,
		.limit = r != NULL ? r->limit : ref.cost,
		.window_ms = r != NULL ? r->window_ms : 1,
		.cost = ref.cost,
		.key = rq->lease_key,
		.keylen = plen + ref.suffix_len,
		.token = rq->lease_key + plen + ref.suffix_len + 1,
	};
	if (rq->lease_check.limit < ref.cost)
		rq->lease_check.limit = ref.cost;	/* a reload lowered it */
	memset(&rq->probe, 0, sizeof(rq->probe));
	rq->probe.checks = &rq->lease_check;
	rq->probe.n = 1;
	rq->probe.out = &rq->lease_out;
	rq->probe.lease_op = renew ? BACKEND_LEASE_RENEW :
	    BACKEND_LEASE_RELEASE;
	rq->probe.start_us = rq->arrived_us;
	rq->probe.arg = rq;
	rq->conn = conn;
	if (s->decider->backend->completes_inline) {
		rq->probe.done = probe_inline_done;
		backend_submit(s->decider->backend, &rq->probe);
	} else {
		rq->probe.done = probe_done;
		if (!suspend(s, rq))
			return respond_error(s, conn, 503, "shutting_down",
			    "the server is shutting down");
		backend_submit(s->decider->backend, &rq->probe);
		return MHD_YES;
	}
answer:
	if (rq->probe.rc != 0)
		return respond_error(s, conn, 503, "backend_unavailable",
		    "the %s store failed (%s)", s->decider->backend->name,
		    backend_error_kind_name(rq->probe.kind));
	if (!renew && rq->lease_out.allowed)	/* its waiters may go on */
		lease_wait_released(s->leases, lease_key_hash(
		    rq->lease_check.key, rq->lease_check.keylen));
	if (!renew)
		return rq->lease_out.allowed ?
		    respond(s, conn, 200, JSON_TYPE, "{\"released\":true}", 17,
		    NULL) :
		    respond(s, conn, 200, JSON_TYPE, "{\"released\":false}",
		    18, NULL);
	if (!rq->lease_out.allowed)
		return respond(s, conn, 200, JSON_TYPE, "{\"renewed\":false}",
		    17, NULL);
	{
		char body[80];
		int n = snprintf(body, sizeof(body), "{\"renewed\":true,"
		    "\"expires_ms\":%lld}", (long long)rq->lease_out.reset_ms);

		return respond(s, conn, 200, JSON_TYPE, body, (size_t)n, NULL);
	}
}

static enum MHD_Result
handle_simple(struct http_server *s, struct MHD_Connection *conn,
    const char *url)
{
	char *text = NULL, *guard = NULL, *all, stack[1024];
	size_t len, glen;
	enum MHD_Result ret;

	if (strcmp(url, "/healthz") == 0)
		return respond(s, conn, 200, "text/plain", "ok\n", 3, NULL);
	/* /metrics: the shared families, then the connection guard's. */
	if (metrics_render(s->metrics, &text, &len) < 0 ||
	    (guard = fmt_buf(stack, sizeof(stack), &glen,
	    "# HELP ratelimitd_http_connections_open Client connections open "
	    "now.\n# TYPE ratelimitd_http_connections_open gauge\n"
	    "ratelimitd_http_connections_open %lld\n"
	    "# HELP ratelimitd_http_connections_refused_total Connections "
	    "closed at once: max_connections were open.\n"
	    "# TYPE ratelimitd_http_connections_refused_total counter\n"
	    "ratelimitd_http_connections_refused_total %llu\n"
	    "# HELP ratelimitd_http_requests_cut_total Requests cut off past "
	    "request_timeout.\n"
	    "# TYPE ratelimitd_http_requests_cut_total counter\n"
	    "ratelimitd_http_requests_cut_total %llu\n",
	    (long long)http_guard_open(s->guard),
	    (unsigned long long)http_guard_refused(s->guard),
	    (unsigned long long)http_guard_cut(s->guard))) == NULL ||
	    (all = rl_realloc(text, len + glen + 1)) == NULL) {
		if (guard != NULL)
			fmt_free(guard, stack);
		rl_free(text);
		return respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	}
	memcpy(all + len, guard, glen + 1);
	fmt_free(guard, stack);
	ret = respond(s, conn, 200, "text/plain; version=0.0.4; charset=utf-8",
	    all, len + glen, NULL);
	rl_free(all);
	return ret;
}

/* Which endpoint a request is for; errors are answered after the body. */
static enum endpoint
route(const char *url, const char *method)
{
	bool is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

	if (strcmp(url, "/acquire") == 0)
		return strcmp(method, "POST") == 0 ? EP_ACQUIRE :
		    EP_BAD_METHOD;
	if (strcmp(url, "/record") == 0)
		return strcmp(method, "POST") == 0 ? EP_RECORD : EP_BAD_METHOD;
	if (strcmp(url, "/stats") == 0)
		return strcmp(method, "POST") == 0 ? EP_STATS : EP_BAD_METHOD;
	if (strcmp(url, "/release") == 0)
		return strcmp(method, "POST") == 0 ? EP_RELEASE :
		    EP_BAD_METHOD;
	if (strcmp(url, "/renew") == 0)
		return strcmp(method, "POST") == 0 ? EP_RENEW :
		    EP_BAD_METHOD;
	if (strcmp(url, "/auth") == 0 || strncmp(url, "/auth/", 6) == 0)
		return EP_AUTH;
	if (strcmp(url, "/readyz") == 0)
		return is_get ? EP_READY : EP_BAD_METHOD;
	if (strcmp(url, "/healthz") == 0 || strcmp(url, "/metrics") == 0)
		return is_get ? EP_SIMPLE : EP_BAD_METHOD;
	return EP_NOT_FOUND;
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
	if (rq == NULL) {
		const char *cl;

		if ((rq = rl_calloc(1, sizeof(*rq))) == NULL)
			return MHD_NO;
		rq->ep = route(url, method);
		rq->s = s;
		rq->conn = conn;
		rq->arrived_us = util_monotonic_us();
		rq->cfg = http_server_get_config(s);
		__atomic_add_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
		*con_cls = rq;
		{
			bool answered;
			enum MHD_Result fr = check_framing(s, conn, rq->cfg,
			    url, &answered);

			if (answered)
				return fr;
		}
		cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
		    MHD_HTTP_HEADER_CONTENT_LENGTH);
		rq->declared_len = cl != NULL ? (int64_t)strtoll(cl, NULL, 10) :
		    -1;
		if (EP_HAS_BODY(rq->ep) && cl != NULL &&
		    strtoull(cl, NULL, 10) > (unsigned long long)
		    rq->cfg->max_body_bytes)
			rq->too_large = true;
		return MHD_YES;
	}
	if (*upload_data_size > 0) {
		size_t n = *upload_data_size;

		*upload_data_size = 0;
		rq->body_seen += n;
		if (!EP_HAS_BODY(rq->ep) || rq->too_large)
			return MHD_YES;		/* discard */
		if (rq->len + n > (size_t)rq->cfg->max_body_bytes) {
			rq->too_large = true;
			return MHD_YES;
		}
		if (rq->len + n > rq->cap) {
			size_t cap = rq->cap == 0 ? 1024 : rq->cap;
			char *nb;

			while (cap < rq->len + n)
				cap *= 2;
			if ((nb = rl_realloc(rq->body, cap)) == NULL)
				return MHD_NO;
			rq->body = nb;
			rq->cap = cap;
		}
		memcpy(rq->body + rq->len, upload_data, n);
		rq->len += n;
		return MHD_YES;
	}
	if (rq->state == RQ_READING && rq->declared_len >= 0 &&
	    rq->body_seen != (uint64_t)rq->declared_len)
		/* The body libmicrohttpd framed is not the one the header
		 * names (a folded Content-Length): what follows is not a
		 * request we can trust. */
		return refuse(s, conn, 400, "bad_request", "the body is not "
		    "as long as its Content-Length says");
	switch (rq->ep) {
	case EP_ACQUIRE:
	case EP_AUTH:
		return handle_decision(s, conn, rq, url, method);
	case EP_READY:
		return handle_ready(s, conn, rq);
	case EP_RELEASE:
	case EP_RENEW:
		return handle_lease(s, conn, rq);
	case EP_RECORD:
	case EP_STATS:
		return handle_stats(s, conn, rq);
	case EP_SIMPLE:
		return handle_simple(s, conn, url);
	case EP_BAD_METHOD:
		return respond_error(s, conn, 405, "method_not_allowed",
		    "%s %s: use %s", method, url,
		    strcmp(url, "/acquire") == 0 || strcmp(url, "/record") ==
		    0 || strcmp(url, "/stats") == 0 || strcmp(url, "/release")
		    == 0 || strcmp(url, "/renew") == 0 ? "POST" : "GET");
	case EP_NOT_FOUND:
		break;
	}
	return respond_error(s, conn, 404, "not_found", "no endpoint %s", url);
}

static void
request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct http_server *s = cls;
	struct request *rq = *con_cls;

	(void)toe;
	http_guard_request_done(conn_ctx(conn));
	if (rq == NULL)
		return;
	if (rq->state == RQ_DECIDED && !rq->resumed_seen) {
		/* Resumed, then closed by libmicrohttpd before the handler
		 * ran: the client shut down its sending side after resume()
		 * looked.  The socket is still open: answer on it. */
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
		    conn, MHD_CONNECTION_INFO_CONNECTION_FD);

		if (EP_DECIDES(rq->ep) && !rq->answered_raw && ci != NULL &&
		    !wait_needed(rq) && !rq->wait_cut)
			(void)answer_raw(s, ci->connect_fd, rq);
		resumed(s, rq);
	}
	if (rq->wait_slot)
		__atomic_sub_fetch(&s->waiting, 1, __ATOMIC_SEQ_CST);
	if (rq->counted_turn)
		metrics_waiting(s->metrics, METRICS_WAIT_TURN, -1);
	if (rq->counted_lease)
		metrics_waiting(s->metrics, METRICS_WAIT_LEASE, -1);
	stats_request_clear(&rq->sr);
	config_unref(rq->cfg);
	decide_leases_free(&rq->decision);
	rl_free(rq->lease_key);
	rl_free(rq->body);
	rl_free(rq->rule);
	attrs_clear(&rq->attrs);
	rl_free(rq);
	*con_cls = NULL;
	__atomic_sub_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
}

static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	size_t n;

	(void)cls;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	log_debug("http: %s", msg);
}

/* --- life cycle ------------------------------------------------------- */

static void
server_free(struct http_server *s)
{
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
notify_connection(void *cls, struct MHD_Connection *conn,
    void **socket_context, enum MHD_ConnectionNotificationCode toe)
{
	struct http_server *s = cls;
	const union MHD_ConnectionInfo *ci;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		ci = MHD_get_connection_info(conn,
		    MHD_CONNECTION_INFO_CONNECTION_FD);
		http_guard_opened(s->guard, ci != NULL ? ci->connect_fd : -1,
		    socket_context);
	} else
		http_guard_closed(s->guard, socket_context);
}

struct http_server *
http_server_start(int listen_fd, struct config *cfg,
    const struct decider *decider, struct lease_wait *leases,
    struct metrics *metrics, char *err, size_t errlen)
{
	struct http_server *s;
	unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
	    MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;

	if ((s = rl_calloc(1, sizeof(*s))) == NULL) {
		snprintf(err, errlen, "out of memory");
		close(listen_fd);
		return NULL;
	}
	config_slot_init(&s->cfg, cfg);
	s->decider = decider;
	s->leases = leases;
	s->metrics = metrics;
	s->listen_fd = listen_fd;
	if ((s->guard = http_guard_start(guard_limits, s, err, errlen)) ==
	    NULL)
		goto fail;
	if ((s->timer = wait_timer_new(err, errlen)) == NULL)
		goto fail;
	/* The logger first: MHD logs with its own, to stderr, until it
	 * has seen this option.  A connection's memory holds its request
	 * headers and the answer's: HTTP_CONN_MEMORY covers the headers
	 * proxies send to /auth (8 KiB), and is what 1,000 idle keep-alive
	 * connections cost at most (the default is 32 KiB); twice
	 * max_header_bytes when that is larger.  The connection limit is
	 * the guard's (max_connections, refused at once, changed by a
	 * reload): libmicrohttpd's own is set past any it allows, since at
	 * its limit it stops accepting and new clients wait unanswered. */
	s->mhd = MHD_start_daemon(flags, 0, accept_policy, s, access_handler,
	    s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
	    MHD_OPTION_LISTEN_SOCKET, listen_fd,
	    MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)cfg->threads,
	    MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
	    MHD_OPTION_NOTIFY_CONNECTION, notify_connection, s,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_MHD_CONN_LIMIT,
	    MHD_OPTION_CONNECTION_TIMEOUT,
	    (unsigned int)((cfg->idle_timeout_ms + 999) / 1000),
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT,
	    (size_t)(2 * cfg->max_header_bytes > HTTP_CONN_MEMORY ?
	    2 * cfg->max_header_bytes : HTTP_CONN_MEMORY),
	    MHD_OPTION_END);
	if (s->mhd == NULL) {
		snprintf(err, errlen, "%s: cannot start the HTTP server",
		    cfg->listen);
		goto fail;
	}
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
	int fd;

	/*
	 * Refuse new connections at once: close the listening socket under
	 * libmicrohttpd by putting a socket that does not listen in its
	 * place.  The number stays taken until MHD_stop_daemon() closes it
	 * (a worker's accept() on it fails, harmlessly), and the kernel
	 * drops the closed socket from the workers' epoll sets by itself.
	 * Not MHD_quiesce_daemon(): in libmicrohttpd 0.9.75 it races with a
	 * worker that removes the listening socket from its epoll set at
	 * the same time, and one of them aborts the process ("Failed to
	 * remove listen FD from epoll set"), as seen when waiters were
	 * resumed during a stop.  First, so that no waiter answered below
	 * finds the listener open.
	 */
	if (s->listen_fd >= 0) {
		if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
		    dup3(fd, s->listen_fd, O_CLOEXEC) < 0)
			(void)shutdown(s->listen_fd, SHUT_RDWR);
		if (fd >= 0)
			close(fd);
		s->listen_fd = -1;
	}
	/* Waiters due within shutdown_timeout are answered then; the
	 * others at once, 503 (docs/waiting.md). */
	wait_timer_cut(s->timer, util_monotonic_us() +
	    c->shutdown_timeout_ms * 1000);
	lease_wait_cut(s->leases);	/* no known time: 503 now */
	config_unref(c);
	__atomic_store_n(&s->draining, true, __ATOMIC_RELEASE);
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
	while (__atomic_load_n(&s->suspended, __ATOMIC_SEQ_CST) > 0 &&
	    util_monotonic_us() < give_up)
		nanosleep(&tick, NULL);
	if (__atomic_load_n(&s->suspended, __ATOMIC_SEQ_CST) > 0) {
		log_warnx("shutdown: %d requests still wait for the store; "
		    "exiting without them",
		    __atomic_load_n(&s->suspended, __ATOMIC_SEQ_CST));
		log_info("stopped");
		_exit(0);
	}
	MHD_stop_daemon(s->mhd);	/* closes the listening socket */
	server_free(s);
}
