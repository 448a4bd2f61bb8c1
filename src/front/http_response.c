/*
 * http_response.c - every answer of the HTTP front end (docs/http.md): the
 * error JSON {"error": code, "message": ...}, the answer to a decision
 * (its JSON body and its RateLimit headers), an error that closes the
 * connection, and the raw answer written straight on the socket for a
 * client that half-closed while its request waited.  Answers are queued
 * on libmicrohttpd's connection from the event loop, and so is the raw
 * answer (request_completed() in http.c).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <jansson.h>
#include <microhttpd.h>

#include "base/metrics.h"
#include "base/util.h"
#include "core/rate_headers.h"
#include "front/http_priv.h"

enum MHD_Result
http_respond(struct http_server *s, struct MHD_Connection *conn, int status,
    const char *type, const char *body, size_t len,
    struct MHD_Response *prepared)
{
	struct MHD_Response *r = prepared;
	enum MHD_Result ret;

	if (r == NULL)
		r = MHD_create_response_from_buffer(len,
		    (void *)(uintptr_t)body, MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	if (type != NULL)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE))
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	ret = MHD_queue_response(conn, (unsigned)status, r);
	MHD_destroy_response(r);
	metrics_http_response(s->metrics, status);
	return ret;
}

/*
 * The JSON body of an error: {"error": code, "message": ...}, in a new
 * buffer (free()), or NULL when out of memory.  The message may quote
 * what a client sent (a path, an attribute or rule name), whole or cut
 * inside a character: it is made valid UTF-8 first (docs/http.md,
 * Errors), since jansson refuses to encode anything else and the answer
 * would become a 500 without a body.  Should it refuse all the same, the
 * answer keeps its code with a fixed message.  code is one of the
 * daemon's own codes (docs/http.md): nothing to escape.
 */
char *
http_error_json(const char *code, const char *fmt, va_list ap)
{
	char msg[512], clean[3 * sizeof(msg)], *text;
	json_t *o;
	size_t cap;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	util_utf8_clean(clean, msg);
	o = json_pack("{s:s, s:s}", "error", code, "message", clean);
	text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (text != NULL)
		return text;
	cap = strlen(code) + 64;
	if ((text = malloc(cap)) != NULL)
		snprintf(text, cap,
		    "{\"error\":\"%s\",\"message\":\"request refused\"}", code);
	return text;
}

char *
http_error_text(const char *code, const char *fmt, ...)
{
	va_list ap;
	char *text;

	va_start(ap, fmt);
	text = http_error_json(code, fmt, ap);
	va_end(ap);
	return text;
}

enum MHD_Result
http_respond_error(struct http_server *s, struct MHD_Connection *conn,
    int status, const char *code, const char *fmt, ...)
{
	enum MHD_Result ret;
	va_list ap;
	char *text;

	va_start(ap, fmt);
	text = http_error_json(code, fmt, ap);
	va_end(ap);
	if (text == NULL)
		return http_respond(s, conn, 500, NULL, "", 0, NULL);
	ret = http_respond(s, conn, status, JSON_TYPE, text, strlen(text),
	    NULL);
	free(text);
	return ret;
}

/*
 * printf into stack (cap bytes) when it fits, else into a new allocation of
 * the exact size: a rule name or other data of any length is never cut or
 * read past.  Returns the text (free it with http_fmt_free(text, stack)) and
 * its length in *len, or NULL (OOM, or a format error).
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

char *__attribute__((format(printf, 4, 5)))
http_fmt_buf(char *stack, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	char *p;

	va_start(ap, fmt);
	p = vfmt_buf(stack, cap, len, fmt, ap);
	va_end(ap);
	return p;
}

void
http_fmt_free(char *text, const char *stack)
{
	if (text != stack)
		rl_free(text);
}

/*
 * ',"leases":[...]' for the leases rq's decision took (docs/leases.md), or
 * "".  Each expires_ms is what the store still holds of the lease when
 * the answer goes out (rq->answer_us, set by http_answer_decision()),
 * counted from when the call left for the store.  Rule names are
 * [A-Za-z0-9_.-]+ and leases hex, digits and dots: nothing to escape.  A
 * new string, or NULL when out of memory.
 */
static char *
leases_json(const struct request *rq)
{
	const struct decision *d = &rq->decision;
	int64_t at = rq->answer_us;
	size_t cap = 16, i, off;
	char *p;

	if (d->nleases > 0 && at == 0)
		at = util_monotonic_us();

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
		off += (size_t)snprintf(p + off, cap - off,
		    "%s{\"rule\":\"%s\","
		    "\"lease\":\"%s\",\"expires_ms\":%lld}",
		    i > 0 ? "," : "", d->leases[i].rule->name,
		    d->leases[i].lease,
		    (long long)decide_lease_left_ms(&d->leases[i], at));
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

/* reset_ms as of when the answer goes out: d's times are as of the
 * decision, and an answer that waited for its turn goes out waited_ms
 * later (docs/waiting.md).  A lease's wait came before the decision. */
static int64_t
reset_from_now(const struct decision *d)
{
	if (d->waited_ms <= 0)
		return d->reset_ms;
	return d->reset_ms > d->waited_ms ? d->reset_ms - d->waited_ms : 0;
}

/* The longest body decision_body_plain() writes: its fixed text, a rule
 * name and six numbers, with room to spare. */
#define DECISION_BODY_MAX (RL_MAX_NAME_BYTES + 320)

static void
put_s(char *p, size_t *n, const char *s)
{
	size_t l = strlen(s);

	memcpy(p + *n, s, l);
	*n += l;
}

static void
put_i(char *p, size_t *n, int64_t i)
{
	*n += util_fmt_int64(p + *n, i);
}

/*
 * The body of an /acquire that a rule decided and that holds no lease,
 * the one every request of a plain rule gets, into stack (at least
 * DECISION_BODY_MAX bytes; rule names are at most RL_MAX_NAME_BYTES and
 * [A-Za-z0-9_.-]+, nothing to escape): written piece by piece, since
 * printf cost more than the rest of the answer.
 */
static char *
decision_body_plain(const struct request *rq, const struct decision *d,
    char *stack, size_t *n)
{
	int64_t waited = d->waited_ms + rq->lease_waited_ms;

	*n = 0;
	put_s(stack, n,
	    d->allowed ? "{\"allowed\":true,\"rule\":\"" :
			 "{\"allowed\":false,\"rule\":\"");
	put_s(stack, n, d->rule->name);
	put_s(stack, n, "\",\"limit\":");
	put_i(stack, n, d->limit);
	put_s(stack, n, ",\"remaining\":");
	put_i(stack, n, d->remaining);
	put_s(stack, n, ",\"reset_ms\":");
	put_i(stack, n, reset_from_now(d));
	put_s(stack, n, ",\"retry_after_ms\":");
	put_i(stack, n, d->retry_after_ms);
	put_s(stack, n, d->shadow ? ",\"shadow\":true" : ",\"shadow\":false");
	if (d->degraded)
		put_s(stack, n, ",\"degraded\":true");
	if (d->allowed && waited > 0) {
		put_s(stack, n, ",\"waited_ms\":");
		put_i(stack, n, waited);
	}
	put_s(stack, n, "}");
	stack[*n] = '\0';
	return stack;
}

/*
 * The status and body of a decided request (d->status == DECIDE_OK): JSON
 * for /acquire, empty for /auth.  The body is in stack or a new buffer
 * (fmt_free); NULL when out of memory.
 */
static char *
decision_body(const struct request *rq, const struct decision *d, char *stack,
    size_t cap, size_t *n, int *status)
{
	char *leases, *body, waited[40];

	*n = 0;
	stack[0] = '\0';
	if (rq->ep == EP_AUTH)
		*status = d->allowed ? 200 : rq->cfg->auth_deny_status;
	else
		*status = d->allowed ? 200 : 429;
	if (rq->ep == EP_ACQUIRE && d->rule != NULL && d->nleases == 0 &&
	    cap >= DECISION_BODY_MAX)
		return decision_body_plain(rq, d, stack, n);
	if (rq->ep == EP_ACQUIRE && d->rule != NULL) {
		if ((leases = leases_json(rq)) == NULL)
			return NULL;
		/* Rule names are [A-Za-z0-9_.-]+: nothing to escape. */
		body = http_fmt_buf(stack, cap, n,
		    "{\"allowed\":%s,"
		    "\"rule\":\"%s\",\"limit\":%lld,\"remaining\":%lld,"
		    "\"reset_ms\":%lld,\"retry_after_ms\":%lld,"
		    "\"shadow\":%s%s%s%s}",
		    d->allowed ? "true" : "false", d->rule->name,
		    (long long)d->limit, (long long)d->remaining,
		    (long long)reset_from_now(d), (long long)d->retry_after_ms,
		    d->shadow ? "true" : "false",
		    d->degraded ? ",\"degraded\":true" : "",
		    waited_field(rq, d, waited, sizeof(waited)), leases);
		rl_free(leases);
		return body;
	}
	if (rq->ep == EP_ACQUIRE)
		return http_fmt_buf(stack, cap, n,
		    "{\"allowed\":true,"
		    "\"rule\":null,\"limit\":null,\"remaining\":null,"
		    "\"reset_ms\":0,\"retry_after_ms\":0,\"shadow\":false%s}",
		    d->degraded ? ",\"degraded\":true" : "");
	return stack;
}

/*
 * Render rq's decision once into *a: the status, the body (JSON for
 * /acquire, empty for /auth, the error JSON when the decision is an error)
 * and the headers, which the MHD response and the raw answer then send
 * alike.  Returns 0 (release *a with http_answer_clear()), or -1 when out
 * of memory.  Any thread that has rq.
 */
int
http_render_decision(const struct request *rq, struct http_answer *a)
{
	const struct decision *d = &rq->decision;

	a->type = NULL;
	a->nheaders = 0;
	a->len = 0;
	if (d->status != DECIDE_OK) {
		char *text = http_error_text(decide_status_code(d->status),
		    "%s", d->message);

		a->status = d->status == DECIDE_BACKEND_UNAVAILABLE ? 503 :
		    d->status == DECIDE_INTERNAL		    ? 500 :
								      400;
		a->type = JSON_TYPE;
		if (text == NULL)
			return -1;
		a->body = http_fmt_buf(a->stack, sizeof(a->stack), &a->len,
		    "%s", text);
		free(text);
		return a->body != NULL ? 0 : -1;
	}
	if ((a->body = decision_body(rq, d, a->stack, sizeof(a->stack), &a->len,
		 &a->status)) == NULL)
		return -1;
	if (rq->ep == EP_ACQUIRE)
		a->type = JSON_TYPE;
	a->nheaders = (size_t)rate_headers(d, a->headers);
	return 0;
}

void
http_answer_clear(struct http_answer *a)
{
	if (a->body != NULL)
		http_fmt_free(a->body, a->stack);
	a->body = NULL;
}

/*
 * The last decision answer each event loop built, sent again as it is
 * when the next one is the same bytes: a hot key's denials within one
 * millisecond are.  libmicrohttpd's response and its headers (three
 * allocations each) cost more to build than the decision itself.  The
 * cache holds the response's first reference; a pthread key's destructor
 * drops it when the loop's thread ends.  Never used while the server
 * drains (those answers say "Connection: close").
 */
struct answer_cache {
	struct MHD_Response *r;
	int status;
	const char *type;
	size_t len, nheaders;
	char body[DECISION_BODY_MAX];
	struct rate_header headers[RATE_HEADERS_MAX];
};

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static bool cache_ok;

static void
cache_free(void *arg)
{
	struct answer_cache *c = arg;

	if (c->r != NULL)
		MHD_destroy_response(c->r);
	rl_free(c);
}

static void
cache_init(void)
{
	cache_ok = pthread_key_create(&cache_key, cache_free) == 0;
}

/* This thread's cache, made on first use; NULL when there is none. */
static struct answer_cache *
cache_get(void)
{
	struct answer_cache *c;

	(void)pthread_once(&cache_once, cache_init);
	if (!cache_ok)
		return NULL;
	if ((c = pthread_getspecific(cache_key)) == NULL &&
	    (c = rl_calloc(1, sizeof(*c))) != NULL &&
	    pthread_setspecific(cache_key, c) != 0) {
		rl_free(c);
		c = NULL;
	}
	return c;
}

static bool
cache_holds(const struct answer_cache *c, const struct http_answer *a)
{
	size_t i;

	if (c->r == NULL || c->status != a->status || c->type != a->type ||
	    c->len != a->len || c->nheaders != a->nheaders ||
	    memcmp(c->body, a->body, a->len) != 0)
		return false;
	for (i = 0; i < a->nheaders; i++)
		if (c->headers[i].name != a->headers[i].name ||
		    strcmp(c->headers[i].value, a->headers[i].value) != 0)
			return false;
	return true;
}

/* Keep r (its first reference, taken over) as the answer a. */
static void
cache_keep(struct answer_cache *c, struct MHD_Response *r,
    const struct http_answer *a)
{
	if (c->r != NULL)
		MHD_destroy_response(c->r);
	c->r = r;
	c->status = a->status;
	c->type = a->type;
	c->len = a->len;
	c->nheaders = a->nheaders;
	memcpy(c->body, a->body, a->len);
	memcpy(c->headers, a->headers, a->nheaders * sizeof(a->headers[0]));
}

/* Answer a decision: JSON for /acquire, an empty body for /auth.  The
 * event loop. */
enum MHD_Result
http_respond_decision(struct http_server *s, struct MHD_Connection *conn,
    const struct request *rq)
{
	struct answer_cache *c = NULL;
	struct http_answer a;
	struct MHD_Response *r;
	enum MHD_Result ret;
	size_t i;

	if (http_render_decision(rq, &a) < 0)
		return http_respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	if (!__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE) &&
	    a.len <= sizeof(c->body) && (c = cache_get()) != NULL &&
	    cache_holds(c, &a)) {
		http_answer_clear(&a);
		ret = MHD_queue_response(conn, (unsigned)a.status, c->r);
		metrics_http_response(s->metrics, a.status);
		return ret;
	}
	r = MHD_create_response_from_buffer(a.len, a.body,
	    MHD_RESPMEM_MUST_COPY);
	for (i = 0; r != NULL && i < a.nheaders; i++)
		MHD_add_response_header(r, a.headers[i].name,
		    a.headers[i].value);
	if (r == NULL || c == NULL) {
		http_answer_clear(&a);
		if (r == NULL)
			return MHD_NO;
		return http_respond(s, conn, a.status, a.type, NULL, 0, r);
	}
	if (a.type != NULL)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
		    a.type);
	cache_keep(c, r, &a);
	http_answer_clear(&a);
	ret = MHD_queue_response(conn, (unsigned)a.status, r);
	metrics_http_response(s->metrics, a.status);
	return ret;
}

/* Write p (n bytes) whole on fd; false when the socket refuses. */
static bool
send_all(int fd, const char *p, size_t n)
{
	ssize_t w;
	size_t off;

	for (off = 0; off < n; off += (size_t)w)
		if ((w = send(fd, p + off, n - off, MSG_NOSIGNAL)) <= 0)
			return false;
	return true;
}

/*
 * Write the answer of a decided request straight to the socket, and close
 * after it: for a client that shut down its sending side while its request
 * waited for the store, whose answer libmicrohttpd would drop on resume
 * (it sees the end of input first).  False when it could not be written
 * whole; either way the connection is then closed.  Runs on the thread
 * that resumes the request while the connection is suspended: nothing
 * else touches it.
 */
bool
http_answer_raw(struct http_server *s, int fd, const struct request *rq)
{
	struct http_answer a;
	char *head = NULL;
	size_t cap, off, i;
	bool ok = false;

	if (http_render_decision(rq, &a) < 0)
		return false;
	cap = 256 + (a.type != NULL ? strlen(a.type) + 20 : 0);
	for (i = 0; i < a.nheaders; i++)
		cap += strlen(a.headers[i].name) + strlen(a.headers[i].value) +
		    4;
	if ((head = rl_malloc(cap)) == NULL)
		goto out;
	off = (size_t)snprintf(head, cap,
	    "HTTP/1.1 %d %s\r\n"
	    "Connection: close\r\nContent-Length: %zu\r\n",
	    a.status, MHD_get_reason_phrase_for((unsigned)a.status), a.len);
	if (a.type != NULL)
		off += (size_t)snprintf(head + off, cap - off, "%s: %s\r\n",
		    MHD_HTTP_HEADER_CONTENT_TYPE, a.type);
	for (i = 0; i < a.nheaders; i++)
		off += (size_t)snprintf(head + off, cap - off, "%s: %s\r\n",
		    a.headers[i].name, a.headers[i].value);
	off += (size_t)snprintf(head + off, cap - off, "\r\n");
	if (!send_all(fd, head, off) || !send_all(fd, a.body, a.len))
		goto out;
	ok = true;
	metrics_http_response(s->metrics, a.status);
out:
	rl_free(head);
	http_answer_clear(&a);
	return ok;
}

/*
 * An error answer written straight on the socket fd, for a request that
 * libmicrohttpd refused before the access handler (http_framing.c); the
 * caller then shuts the socket.  Runs on the connection's event loop.
 */
bool __attribute__((format(printf, 5, 6)))
http_refuse_raw(struct http_server *s, int fd, int status, const char *code,
    const char *fmt, ...)
{
	char head[160], *text;
	va_list ap;
	size_t len;
	bool ok;

	va_start(ap, fmt);
	text = http_error_json(code, fmt, ap);
	va_end(ap);
	len = text != NULL ? strlen(text) : 0;
	snprintf(head, sizeof(head),
	    "HTTP/1.1 %d %s\r\nConnection: close\r\n"
	    "Content-Length: %zu\r\nContent-Type: %s\r\n\r\n",
	    status, MHD_get_reason_phrase_for((unsigned)status), len,
	    JSON_TYPE);
	ok = send_all(fd, head, strlen(head)) &&
	    send_all(fd, text != NULL ? text : "", len);
	if (ok)
		metrics_http_response(s->metrics, status);
	free(text);
	return ok;
}

/* An error answer that closes its connection. */
enum MHD_Result __attribute__((format(printf, 5, 6)))
http_refuse(struct http_server *s, struct MHD_Connection *conn, int status,
    const char *code, const char *fmt, ...)
{
	struct MHD_Response *r;
	va_list ap;
	char *text;

	va_start(ap, fmt);
	text = http_error_json(code, fmt, ap);
	va_end(ap);
	r = MHD_create_response_from_buffer(text != NULL ? strlen(text) : 0,
	    text != NULL ? text : (char *)"", MHD_RESPMEM_MUST_COPY);
	free(text);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	return http_respond(s, conn, status, JSON_TYPE, NULL, 0, r);
}
