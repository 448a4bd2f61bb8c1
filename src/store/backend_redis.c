/*
 * backend_redis.c - the Redis store behind backend.h.  One decide() call is
 * one EVALSHA of lua/ratelimit.lua, which evaluates every rule of a request
 * atomically on the server with the server's clock (docs/algorithms.md).
 * This file only moves the checks to Redis and the results back, and keeps
 * a failing Redis from slowing the daemon down.
 *
 * DESIGN
 *
 * Pool.  pool_size blocking hiredis connections, each used by one caller at
 * a time.  A mutex guards a stack of idle slots; a caller with none free
 * waits on a condition variable (CLOCK_MONOTONIC) until its deadline, then
 * fails with "pool exhausted".  Slots are connected lazily, outside the
 * mutex, and any I/O error or timeout frees the connection, because a late
 * reply would desynchronise it; the next user of the slot reconnects.
 *
 * Timeouts.  Each call has one deadline, now + timeout_ms, shared by the
 * wait for a slot, the connect, AUTH/SELECT/SCRIPT LOAD and the EVALSHA.
 * Before each command the socket's SO_RCVTIMEO/SO_SNDTIMEO (redisSetTimeout)
 * is lowered to what is left; it is only reset when it is off by more than
 * a millisecond, so the common path costs no extra system call.  A read or
 * write that times out fails with EAGAIN, which is how BACKEND_ERR_TIMEOUT
 * is told from a refused or broken connection (BACKEND_ERR_CONNECT).  Host
 * names are resolved by getaddrinfo() inside hiredis, which the deadline
 * does not bound: use an address or a local resolver.
 *
 * Script loading.  Each new connection runs SCRIPT LOAD with the script
 * text compiled into the binary and keeps the SHA1 it answers, so no SHA-1
 * code is needed here.  A NOSCRIPT reply (SCRIPT FLUSH, a failover to a
 * replica without the script) loads it again and retries once.
 *
 * Circuit breaker.  After REDIS_CB_THRESHOLD consecutive failures the
 * circuit opens: calls fail at once with BACKEND_ERR_CIRCUIT_OPEN, without
 * touching Redis or the pool.  After a backoff (100 ms, doubling on every
 * failed trial up to 5 s) it half-opens: exactly one caller goes through as
 * a trial while the others still fail fast.  Success anywhere closes the
 * circuit and resets the backoff.  A caller that found the pool exhausted
 * says nothing about Redis and neither counts nor spends the trial.
 * is_ready() bypasses the circuit: /readyz reports Redis as it is.
 *
 * Failures are logged with log_warnx at most once a second per kind, with a
 * count of the lines held back; the URL appears only redacted.
 *
 * Later: auto-pipelining.  decide() is a blocking call that hands over a
 * whole request, so a pipelining layer fits behind it unchanged: callers
 * would enqueue their EVALSHA (already one per request) on a shared
 * connection and wait on a per-call condition for their reply, while one
 * writer flushes whatever has queued since the last flush in one write(2)
 * and one reader hands replies back in order (Redis answers in order).  The
 * pool would shrink to a few such connections, the deadline and error
 * classification stay per call, and a timeout would fail every call queued
 * on that connection, as a broken connection does now.
 *
 * hiredis writes with write(2), so a peer that closed its end raises
 * SIGPIPE: backend_redis_new() ignores SIGPIPE if it still has its default
 * disposition (the daemon does not want it either).
 *
 * Cluster mode (redis.cluster) is not implemented yet; backend_redis_new()
 * refuses it.  Each key is its own {hash tag}, so the keys of one request
 * usually live on different slots: routing will need one EVALSHA per node
 * (atomic per node only) or rules that share a tag.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "backend.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "redis_url.h"
#include "util.h"

/* lua/ratelimit.lua, turned into a C string by the Makefile. */
extern const char rl_lua_ratelimit[];

#define REDIS_CB_THRESHOLD	5	/* consecutive failures to open */
#define REDIS_CB_BACKOFF_MIN_MS	100
#define REDIS_CB_BACKOFF_MAX_MS	5000
#define REDIS_LOG_INTERVAL_US	1000000	/* one line per kind per second */
#define REDIS_TIMEOUT_SLACK_US	1000	/* socket timeout vs. deadline */
#define REDIS_SHA_LEN		40
#define REDIS_ARGS_PER_CHECK	5
#define REDIS_FIELDS_PER_CHECK	4
#define REDIS_NUM_MAX		24	/* an int64 in decimal, and a NUL */
#define REDIS_NKINDS		(BACKEND_ERR_CIRCUIT_OPEN + 1)

struct redis_conn {
	redisContext *ctx;		/* NULL: connect on next use */
	char sha[REDIS_SHA_LEN + 1];	/* the script's SHA1 on this server */
	int64_t timeout_us;		/* socket timeout set on ctx, -1 none */
};

enum redis_circuit {
	REDIS_CIRCUIT_CLOSED,
	REDIS_CIRCUIT_OPEN,
	REDIS_CIRCUIT_HALF_OPEN		/* one trial call in flight */
};

enum redis_outcome {
	REDIS_OUTCOME_OK,
	REDIS_OUTCOME_FAIL,
	REDIS_OUTCOME_NEUTRAL		/* says nothing about Redis */
};

struct redis_backend {
	struct backend base;		/* first: we are a struct backend */
	struct redis_url url;
	char *shown_url;		/* redacted, for messages */
	int64_t timeout_us;

	pthread_mutex_t mu;		/* guards the pool and the circuit */
	pthread_cond_t cv;		/* a slot was returned */
	struct redis_conn *conns;	/* nconns slots */
	size_t nconns;
	size_t *idle;			/* stack of idle slot indices */
	size_t nidle;

	enum redis_circuit circuit;
	int failures;			/* consecutive */
	int64_t backoff_ms;		/* of the next opening */
	int64_t open_until_us;		/* monotonic; when OPEN */

	struct metrics *metrics;	/* borrowed; may be NULL */

	_Atomic int64_t last_log_us[REDIS_NKINDS];	/* INT64_MIN: never */
	atomic_long suppressed[REDIS_NKINDS];
};

/* Log msg at most once a second per kind.  Any thread, lock-free. */
static void redis_log_failure(struct redis_backend *rb,
    enum backend_error_kind kind, const char *msg)
{
	int64_t now = util_monotonic_us();
	int64_t last = atomic_load(&rb->last_log_us[kind]);
	long held;

	if ((last != INT64_MIN && now - last < REDIS_LOG_INTERVAL_US) ||
	    !atomic_compare_exchange_strong(&rb->last_log_us[kind], &last,
	    now)) {
		atomic_fetch_add(&rb->suppressed[kind], 1);
		return;
	}
	held = atomic_exchange(&rb->suppressed[kind], 0);
	if (held > 0)
		log_warnx("redis %s: %s (kind=%s; %ld similar lines "
		    "suppressed)", rb->shown_url, msg,
		    backend_error_kind_name(kind), held);
	else
		log_warnx("redis %s: %s (kind=%s)", rb->shown_url, msg,
		    backend_error_kind_name(kind));
}

static struct timeval redis_tv(int64_t us)
{
	struct timeval tv;

	tv.tv_sec = (time_t)(us / 1000000);
	tv.tv_usec = (suseconds_t)(us % 1000000);
	return tv;
}

/* ---- circuit breaker ------------------------------------------------- */

/* May this call go to Redis?  Sets *trial when it is the half-open trial.
 * Returns 0, or -1 when the circuit is open. */
static int redis_circuit_enter(struct redis_backend *rb, bool *trial)
{
	int rc = 0;

	*trial = false;
	pthread_mutex_lock(&rb->mu);
	switch (rb->circuit) {
	case REDIS_CIRCUIT_CLOSED:
		break;
	case REDIS_CIRCUIT_OPEN:
		if (util_monotonic_us() < rb->open_until_us) {
			rc = -1;
			break;
		}
		rb->circuit = REDIS_CIRCUIT_HALF_OPEN;
		*trial = true;
		break;
	case REDIS_CIRCUIT_HALF_OPEN:
		rc = -1;
		break;
	}
	pthread_mutex_unlock(&rb->mu);
	return rc;
}

static void redis_circuit_open(struct redis_backend *rb)
{
	rb->circuit = REDIS_CIRCUIT_OPEN;
	rb->open_until_us = util_monotonic_us() + rb->backoff_ms * 1000;
}

/* Account for the outcome of a call let through by redis_circuit_enter. */
static void redis_circuit_leave(struct redis_backend *rb, bool trial,
    enum redis_outcome outcome)
{
	bool opened = false, closed = false;
	int64_t backoff = 0;

	pthread_mutex_lock(&rb->mu);
	if (outcome == REDIS_OUTCOME_OK) {
		closed = rb->circuit != REDIS_CIRCUIT_CLOSED;
		rb->circuit = REDIS_CIRCUIT_CLOSED;
		rb->failures = 0;
		rb->backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
	} else if (outcome == REDIS_OUTCOME_NEUTRAL) {
		/* Give the trial back: the next caller tries again. */
		if (trial && rb->circuit == REDIS_CIRCUIT_HALF_OPEN) {
			rb->circuit = REDIS_CIRCUIT_OPEN;
			rb->open_until_us = 0;
		}
	} else {
		rb->failures++;
		if (trial && rb->circuit == REDIS_CIRCUIT_HALF_OPEN) {
			rb->backoff_ms *= 2;
			if (rb->backoff_ms > REDIS_CB_BACKOFF_MAX_MS)
				rb->backoff_ms = REDIS_CB_BACKOFF_MAX_MS;
			redis_circuit_open(rb);
		} else if (rb->circuit == REDIS_CIRCUIT_CLOSED &&
		    rb->failures >= REDIS_CB_THRESHOLD) {
			rb->backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
			redis_circuit_open(rb);
			opened = true;
			backoff = rb->backoff_ms;
		}
	}
	pthread_mutex_unlock(&rb->mu);
	if (opened)
		log_warnx("redis %s: circuit open after %d consecutive "
		    "failures; next try in %" PRId64 " ms", rb->shown_url,
		    REDIS_CB_THRESHOLD, backoff);
	if (closed)
		log_info("redis %s: circuit closed, Redis answers again",
		    rb->shown_url);
}

/* ---- pool ------------------------------------------------------------ */

static void redis_conn_close(struct redis_conn *c)
{
	if (c->ctx != NULL)
		redisFree(c->ctx);
	c->ctx = NULL;
	c->sha[0] = '\0';
	c->timeout_us = -1;
}

/* Take an idle slot, waiting until deadline_us (monotonic) at most.
 * Returns it, or NULL when the pool stayed exhausted. */
static struct redis_conn *redis_pool_get(struct redis_backend *rb,
    int64_t deadline_us)
{
	struct redis_conn *c = NULL;
	struct timespec ts;

	ts.tv_sec = (time_t)(deadline_us / 1000000);
	ts.tv_nsec = (long)(deadline_us % 1000000) * 1000;
	pthread_mutex_lock(&rb->mu);
	while (rb->nidle == 0) {
		if (util_monotonic_us() >= deadline_us)
			goto out_unlock;
		(void)pthread_cond_timedwait(&rb->cv, &rb->mu, &ts);
	}
	c = &rb->conns[rb->idle[--rb->nidle]];
out_unlock:
	pthread_mutex_unlock(&rb->mu);
	if (c != NULL)
		metrics_pool_in_use(rb->metrics, 1);
	return c;
}

/* Give a slot back; a broken one is closed first (outside the mutex: the
 * slot is still ours). */
static void redis_pool_put(struct redis_backend *rb, struct redis_conn *c,
    bool broken)
{
	if (broken)
		redis_conn_close(c);
	pthread_mutex_lock(&rb->mu);
	rb->idle[rb->nidle++] = (size_t)(c - rb->conns);
	pthread_cond_signal(&rb->cv);
	pthread_mutex_unlock(&rb->mu);
	metrics_pool_in_use(rb->metrics, -1);
}

/* ---- commands -------------------------------------------------------- */

/* Classify a failed hiredis call on ctx; errno as it was right after. */
static enum backend_error_kind redis_io_kind(const redisContext *ctx,
    int saved_errno)
{
	if (ctx->err != REDIS_ERR_IO)
		return BACKEND_ERR_CONNECT;	/* EOF, or a broken stream */
	if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
	    saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS)
		return BACKEND_ERR_TIMEOUT;
	/* errno may have moved on; hiredis kept strerror's text. */
	if (strcmp(ctx->errstr, strerror(EAGAIN)) == 0 ||
	    strcmp(ctx->errstr, strerror(ETIMEDOUT)) == 0)
		return BACKEND_ERR_TIMEOUT;
	return BACKEND_ERR_CONNECT;
}

/*
 * Run one command on a connected slot within deadline_us.  Returns the
 * reply (the caller frees it; it may be an error reply), or NULL with *kind
 * and err set and, if anything was sent, the connection closed.
 */
static redisReply *redis_conn_command(struct redis_conn *c,
    int64_t deadline_us, int argc, const char **argv, const size_t *lens,
    enum backend_error_kind *kind, char *err, size_t errlen)
{
	int64_t left = deadline_us - util_monotonic_us();
	redisReply *r;
	int saved_errno;

	if (left <= 0) {
		/* Nothing sent: the connection stays usable. */
		*kind = BACKEND_ERR_TIMEOUT;
		snprintf(err, errlen, "%s: no time left", argv[0]);
		return NULL;
	}
	if (c->timeout_us < 0 || left < c->timeout_us - REDIS_TIMEOUT_SLACK_US
	    || left > c->timeout_us + REDIS_TIMEOUT_SLACK_US) {
		if (redisSetTimeout(c->ctx, redis_tv(left)) != REDIS_OK) {
			*kind = BACKEND_ERR_CONNECT;
			snprintf(err, errlen, "set socket timeout: %s",
			    c->ctx->errstr);
			redis_conn_close(c);
			return NULL;
		}
		c->timeout_us = left;
	}
	errno = 0;
	r = redisCommandArgv(c->ctx, argc, argv, lens);
	saved_errno = errno;
	if (r == NULL) {
		*kind = c->ctx->err != 0 ? redis_io_kind(c->ctx, saved_errno) :
		    BACKEND_ERR_CONNECT;
		snprintf(err, errlen, "%s%s%s: %s", argv[0],
		    argc > 1 && strcmp(argv[0], "SCRIPT") == 0 ? " " : "",
		    argc > 1 && strcmp(argv[0], "SCRIPT") == 0 ? argv[1] : "",
		    c->ctx->err != 0 ? c->ctx->errstr : "no reply");
		redis_conn_close(c);
	}
	return r;
}

/* The kind of an error reply.  Authentication errors mean the password
 * changed or is missing: nothing works until the configuration changes,
 * so they count as connect errors, like a failed AUTH. */
static enum backend_error_kind redis_reply_kind(const redisReply *r)
{
	if (r->type == REDIS_REPLY_ERROR && (strncmp(r->str, "NOAUTH", 6) == 0
	    || strncmp(r->str, "WRONGPASS", 9) == 0))
		return BACKEND_ERR_CONNECT;
	return BACKEND_ERR_PROTOCOL;
}

/* Run a command that must answer +OK (AUTH, SELECT).  0 or -1. */
static int redis_conn_expect_ok(struct redis_conn *c, int64_t deadline_us,
    int argc, const char **argv, enum backend_error_kind *kind, char *err,
    size_t errlen)
{
	size_t lens[3];
	redisReply *r;
	int i, rc = -1;

	for (i = 0; i < argc; i++)
		lens[i] = strlen(argv[i]);
	if ((r = redis_conn_command(c, deadline_us, argc, argv, lens, kind,
	    err, errlen)) == NULL)
		return -1;
	if (r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0)
		rc = 0;
	else {
		/* Wrong credentials or database: nothing works until the
		 * configuration changes, so report it as a connect error. */
		*kind = BACKEND_ERR_CONNECT;
		snprintf(err, errlen, "%s failed: %s", argv[0],
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		redis_conn_close(c);
	}
	freeReplyObject(r);
	return rc;
}

/* SCRIPT LOAD the script on c and keep its SHA1.  0 or -1 (closed). */
static int redis_conn_load_script(struct redis_conn *c, int64_t deadline_us,
    enum backend_error_kind *kind, char *err, size_t errlen)
{
	const char *argv[3] = { "SCRIPT", "LOAD", rl_lua_ratelimit };
	size_t lens[3] = { 6, 4, strlen(rl_lua_ratelimit) };
	redisReply *r;
	int rc = -1;

	if ((r = redis_conn_command(c, deadline_us, 3, argv, lens, kind, err,
	    errlen)) == NULL)
		return -1;
	if (r->type == REDIS_REPLY_STRING && r->len == REDIS_SHA_LEN) {
		memcpy(c->sha, r->str, REDIS_SHA_LEN + 1);
		rc = 0;
	} else {
		*kind = redis_reply_kind(r);
		snprintf(err, errlen, "SCRIPT LOAD: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		redis_conn_close(c);
	}
	freeReplyObject(r);
	return rc;
}

/* Make sure c is connected, authenticated, on its database and has the
 * script.  0, or -1 with *kind and err (c closed). */
static int redis_conn_ensure(struct redis_backend *rb, struct redis_conn *c,
    int64_t deadline_us, enum backend_error_kind *kind, char *err,
    size_t errlen)
{
	int64_t left;
	int saved_errno;
	char db[REDIS_NUM_MAX];

	if (c->ctx != NULL)
		return 0;
	if ((left = deadline_us - util_monotonic_us()) <= 0) {
		*kind = BACKEND_ERR_TIMEOUT;
		snprintf(err, errlen, "connect: no time left");
		return -1;
	}
	errno = 0;
	if (rb->url.is_unix)
		c->ctx = redisConnectUnixWithTimeout(rb->url.path,
		    redis_tv(left));
	else
		c->ctx = redisConnectWithTimeout(rb->url.host, rb->url.port,
		    redis_tv(left));
	saved_errno = errno;
	if (c->ctx == NULL) {
		*kind = BACKEND_ERR_CONNECT;
		snprintf(err, errlen, "connect: out of memory");
		return -1;
	}
	if (c->ctx->err != 0) {
		*kind = redis_io_kind(c->ctx, saved_errno);
		snprintf(err, errlen, "connect: %s", c->ctx->errstr);
		redis_conn_close(c);
		return -1;
	}
	c->timeout_us = -1;
	c->sha[0] = '\0';
	if (rb->url.password != NULL) {
		const char *auth[3] = { "AUTH", NULL, NULL };
		int n = 1;

		if (rb->url.user != NULL)
			auth[n++] = rb->url.user;
		auth[n++] = rb->url.password;
		if (redis_conn_expect_ok(c, deadline_us, n, auth, kind, err,
		    errlen) == -1)
			return -1;
	}
	if (rb->url.db != 0) {
		const char *sel[2] = { "SELECT", db };

		snprintf(db, sizeof(db), "%" PRId64, rb->url.db);
		if (redis_conn_expect_ok(c, deadline_us, 2, sel, kind, err,
		    errlen) == -1)
			return -1;
	}
	return redis_conn_load_script(c, deadline_us, kind, err, errlen);
}

/* ---- decide ---------------------------------------------------------- */

/* The EVALSHA arguments for n checks; argv[1] (the SHA) is set per
 * connection.  One allocation; rl_free(a->argv) frees it. */
struct redis_args {
	const char **argv;
	size_t *lens;
	int argc;
};

static int redis_args_build(struct redis_args *a,
    const struct rl_check *checks, size_t n)
{
	size_t argc = 3 + n + n * REDIS_ARGS_PER_CHECK, i, j;
	size_t nums = 1 + n * REDIS_ARGS_PER_CHECK;
	char *num;
	void *mem;
	int64_t v[REDIS_ARGS_PER_CHECK];

	if (n > (size_t)(INT32_MAX / 8))
		return -1;
	mem = rl_malloc(argc * (sizeof(char *) + sizeof(size_t)) +
	    nums * REDIS_NUM_MAX);
	if (mem == NULL)
		return -1;
	a->argv = mem;
	a->lens = (size_t *)(a->argv + argc);
	num = (char *)(a->lens + argc);
	a->argc = (int)argc;

	a->argv[0] = "EVALSHA";
	a->lens[0] = 7;
	a->argv[1] = NULL;
	a->lens[1] = 0;
	a->argv[2] = num;
	a->lens[2] = (size_t)snprintf(num, REDIS_NUM_MAX, "%zu", n);
	num += REDIS_NUM_MAX;
	for (i = 0; i < n; i++) {
		a->argv[3 + i] = checks[i].key;
		a->lens[3 + i] = checks[i].keylen;
		v[0] = (int64_t)checks[i].algorithm;
		v[1] = checks[i].limit;
		v[2] = checks[i].window_ms;
		v[3] = checks[i].cost;
		v[4] = checks[i].shadow ? 1 : 0;
		for (j = 0; j < REDIS_ARGS_PER_CHECK; j++) {
			size_t k = 3 + n + i * REDIS_ARGS_PER_CHECK + j;

			a->argv[k] = num;
			a->lens[k] = (size_t)snprintf(num, REDIS_NUM_MAX,
			    "%" PRId64, v[j]);
			num += REDIS_NUM_MAX;
		}
	}
	return 0;
}

/* Turn the script's reply into results.  0, or -1 with err. */
static int redis_reply_parse(const redisReply *r, size_t n,
    struct rl_result *out, bool *all_allowed, char *err, size_t errlen)
{
	size_t i;

	if (r->type == REDIS_REPLY_ERROR) {
		snprintf(err, errlen, "script: %s", r->str);
		return -1;
	}
	if (r->type != REDIS_REPLY_ARRAY ||
	    r->elements != 1 + n * REDIS_FIELDS_PER_CHECK) {
		snprintf(err, errlen, "script: unexpected reply (type %d, %zu "
		    "elements)", r->type, r->type == REDIS_REPLY_ARRAY ?
		    r->elements : (size_t)0);
		return -1;
	}
	for (i = 0; i < r->elements; i++) {
		if (r->element[i]->type != REDIS_REPLY_INTEGER ||
		    r->element[i]->integer < 0) {
			snprintf(err, errlen, "script: element %zu is not a "
			    "non-negative integer", i);
			return -1;
		}
	}
	*all_allowed = r->element[0]->integer == 1;
	for (i = 0; i < n; i++) {
		redisReply **e = r->element + 1 + i * REDIS_FIELDS_PER_CHECK;

		out[i].allowed = e[0]->integer == 1;
		out[i].remaining = e[1]->integer;
		out[i].reset_ms = e[2]->integer;
		out[i].retry_after_ms = e[3]->integer;
	}
	return 0;
}

static int redis_decide(struct backend *b, const struct rl_check *checks,
    size_t n, struct rl_result *out, bool *all_allowed,
    enum backend_error_kind *kind, char *err, size_t errlen)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	struct redis_args a;
	struct redis_conn *c;
	redisReply *r = NULL;
	int64_t deadline;
	bool trial, retried = false;
	enum redis_outcome outcome = REDIS_OUTCOME_FAIL;
	int rc = -1;

	*kind = BACKEND_ERR_NONE;
	*all_allowed = false;
	if (n == 0) {
		*all_allowed = true;
		return 0;
	}
	if (redis_circuit_enter(rb, &trial) == -1) {
		*kind = BACKEND_ERR_CIRCUIT_OPEN;
		snprintf(err, errlen, "redis: circuit open after repeated "
		    "failures");
		return -1;
	}
	deadline = util_monotonic_us() + rb->timeout_us;
	if (redis_args_build(&a, checks, n) == -1) {
		*kind = BACKEND_ERR_PROTOCOL;
		snprintf(err, errlen, "redis: out of memory");
		outcome = REDIS_OUTCOME_NEUTRAL;
		goto out_circuit;
	}
	if ((c = redis_pool_get(rb, deadline)) == NULL) {
		*kind = BACKEND_ERR_CONNECT;
		snprintf(err, errlen, "redis: pool exhausted (%zu "
		    "connections busy)", rb->nconns);
		outcome = REDIS_OUTCOME_NEUTRAL;
		goto out_args;
	}
again:
	if (redis_conn_ensure(rb, c, deadline, kind, err, errlen) == -1)
		goto out_put;
	a.argv[1] = c->sha;
	a.lens[1] = REDIS_SHA_LEN;
	if ((r = redis_conn_command(c, deadline, a.argc, a.argv, a.lens, kind,
	    err, errlen)) == NULL)
		goto out_put;
	if (r->type == REDIS_REPLY_ERROR && !retried &&
	    strncmp(r->str, "NOSCRIPT", 8) == 0) {
		/* Flushed, or a new server behind the same address. */
		freeReplyObject(r);
		r = NULL;
		retried = true;
		if (redis_conn_load_script(c, deadline, kind, err,
		    errlen) == -1)
			goto out_put;
		goto again;
	}
	if (redis_reply_parse(r, n, out, all_allowed, err, errlen) == -1) {
		/* NOAUTH: the server changed; authenticate anew. */
		if ((*kind = redis_reply_kind(r)) == BACKEND_ERR_CONNECT)
			redis_conn_close(c);
		goto out_put;
	}
	rc = 0;
	outcome = REDIS_OUTCOME_OK;
out_put:
	if (r != NULL)
		freeReplyObject(r);
	redis_pool_put(rb, c, false);
out_args:
	rl_free(a.argv);
out_circuit:
	redis_circuit_leave(rb, trial, outcome);
	if (rc == -1)
		redis_log_failure(rb, *kind, err);
	return rc;
}

static bool redis_is_ready(struct backend *b)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	const char *argv[1] = { "PING" };
	size_t lens[1] = { 4 };
	enum backend_error_kind kind = BACKEND_ERR_NONE;
	int64_t deadline = util_monotonic_us() + rb->timeout_us;
	struct redis_conn *c;
	redisReply *r;
	char err[256];
	bool ok = false;

	if ((c = redis_pool_get(rb, deadline)) == NULL)
		return false;
	if (redis_conn_ensure(rb, c, deadline, &kind, err, sizeof(err)) == -1)
		goto out_put;
	r = redis_conn_command(c, deadline, 1, argv, lens, &kind, err,
	    sizeof(err));
	if (r == NULL)
		goto out_put;
	ok = r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
	if (!ok) {
		kind = BACKEND_ERR_PROTOCOL;
		snprintf(err, sizeof(err), "PING: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	}
	freeReplyObject(r);
out_put:
	redis_pool_put(rb, c, false);
	if (!ok)
		redis_log_failure(rb, kind, err);
	return ok;
}

static void redis_free(struct backend *b)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	size_t i;

	if (rb == NULL)
		return;
	for (i = 0; i < rb->nconns; i++)
		redis_conn_close(&rb->conns[i]);
	pthread_cond_destroy(&rb->cv);
	pthread_mutex_destroy(&rb->mu);
	rl_free(rb->conns);
	rl_free(rb->idle);
	rl_free(rb->shown_url);
	redis_url_free(&rb->url);
	rl_free(rb);
}

static const struct backend_ops redis_ops = {
	.decide = redis_decide,
	.is_ready = redis_is_ready,
	.free = redis_free,
};

/* Ignore SIGPIPE unless someone already chose what it does. */
static void redis_ignore_sigpipe(void)
{
	struct sigaction sa;

	if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL &&
	    !(sa.sa_flags & SA_SIGINFO)) {
		sa.sa_handler = SIG_IGN;
		(void)sigaction(SIGPIPE, &sa, NULL);
	}
}

struct backend *backend_redis_new(const struct redis_config *rc, char *err,
    size_t errlen)
{
	struct redis_backend *rb;
	pthread_condattr_t ca;
	size_t i, shown_len;

	if (rc->ncluster > 0) {
		snprintf(err, errlen, "redis.cluster: Redis Cluster mode is "
		    "not supported yet; use redis.url");
		return NULL;
	}
	if (rc->url == NULL || rc->pool_size < 1 || rc->timeout_ms < 1) {
		snprintf(err, errlen, "redis: need a url, pool_size >= 1 and "
		    "timeout >= 1ms");
		return NULL;
	}
	if ((rb = rl_calloc(1, sizeof(*rb))) == NULL)
		goto oom;
	rb->base.ops = &redis_ops;
	rb->base.name = "redis";
	rb->timeout_us = rc->timeout_ms * 1000;
	rb->circuit = REDIS_CIRCUIT_CLOSED;
	rb->backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
	for (i = 0; i < REDIS_NKINDS; i++) {
		atomic_init(&rb->last_log_us[i], INT64_MIN);
		atomic_init(&rb->suppressed[i], 0);
	}
	if (redis_url_parse(rc->url, &rb->url, err, errlen) == -1)
		goto out_free;
	if (rb->url.password == NULL && rc->password_file != NULL &&
	    redis_read_password_file(rc->password_file, &rb->url.password,
	    err, errlen) == -1)
		goto out_url;
	if (rb->url.user != NULL && rb->url.password == NULL) {
		snprintf(err, errlen, "redis URL: user name without a "
		    "password (add :pass or a password_file)");
		goto out_url;
	}
	shown_len = redis_url_redact(rc->url, NULL, 0) + 1;
	if ((rb->shown_url = rl_malloc(shown_len)) == NULL)
		goto oom_url;
	(void)redis_url_redact(rc->url, rb->shown_url, shown_len);

	rb->nconns = (size_t)rc->pool_size;
	rb->conns = rl_calloc(rb->nconns, sizeof(*rb->conns));
	rb->idle = rl_calloc(rb->nconns, sizeof(*rb->idle));
	if (rb->conns == NULL || rb->idle == NULL)
		goto oom_url;
	for (i = 0; i < rb->nconns; i++) {
		rb->conns[i].timeout_us = -1;
		rb->idle[rb->nconns - 1 - i] = i;
	}
	rb->nidle = rb->nconns;

	if (pthread_condattr_init(&ca) != 0)
		goto oom_url;
	if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
	    pthread_cond_init(&rb->cv, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		goto oom_url;
	}
	pthread_condattr_destroy(&ca);
	if (pthread_mutex_init(&rb->mu, NULL) != 0) {
		pthread_cond_destroy(&rb->cv);
		goto oom_url;
	}
	redis_ignore_sigpipe();
	return &rb->base;

oom_url:
	snprintf(err, errlen, "redis: out of memory");
out_url:
	rl_free(rb->conns);
	rl_free(rb->idle);
	rl_free(rb->shown_url);
	redis_url_free(&rb->url);
out_free:
	rl_free(rb);
	return NULL;
oom:
	snprintf(err, errlen, "redis: out of memory");
	return NULL;
}

void
backend_redis_set_metrics(struct backend *b, struct metrics *m)
{
	((struct redis_backend *)b)->metrics = m;
}
