/*
 * backend_redis.c - the Redis store behind backend.h.  A request's checks
 * are evaluated by lua/ratelimit.lua, atomically on the server with the
 * server's clock (docs/algorithms.md); this file moves calls to Redis and
 * results back, batches what arrives together, and keeps a failing Redis
 * from slowing the daemon down.
 *
 * DESIGN
 *
 * One I/O thread owns every connection (redis_conn.c) and an epoll set.
 * backend_submit() puts a call on a queue under a mutex and wakes the
 * thread through an eventfd; it never touches a socket.  Each turn of the
 * loop takes every call queued since the last turn and sends them as
 * batches: up to REDIS_BATCH_CALLS requests in one EVALSHA (the script
 * evaluates them one after the other, each all-or-nothing on its own;
 * redis_script.c encodes and decodes), each batch on the connection with
 * the fewest commands in flight, then writes each connection's buffer
 * with one write(2).  Under load calls queue while the thread works, so
 * batches grow by themselves; alone, a call leaves at once.
 *
 * Deadlines.  A call carries its own deadline (set when its request
 * arrived).  The thread keeps the calls in its hands in a list sorted by
 * deadline and sleeps no longer than the first; a call past its deadline
 * fails at once with BACKEND_ERR_TIMEOUT, and its part of a late reply is
 * dropped.  A call whose script may have run is never sent again (it
 * would count twice): a closed connection fails its calls.  NOSCRIPT means
 * the script did not run, so the batch is sent again once, after SCRIPT
 * LOAD.  A connection whose oldest command is older than the timeout is
 * closed (everything on it has failed by then), and so is a connect that
 * takes longer.
 *
 * Script.  Every new connection queues AUTH, SELECT and SCRIPT LOAD ahead
 * of the first call; EVALSHA uses the SHA1 the Makefile computed from the
 * script text, so no call waits for the handshake.
 *
 * Circuit breaker.  After REDIS_CB_THRESHOLD consecutive failed calls the
 * circuit opens: calls fail at once with BACKEND_ERR_CIRCUIT_OPEN, inside
 * submit, without queueing.  After a backoff (100 ms, doubling on every
 * failed trial up to 5 s) it half-opens: exactly one call goes through as
 * a trial while the others still fail fast.  Success anywhere closes the
 * circuit and resets the backoff.  Readiness probes bypass the circuit:
 * /readyz reports Redis as it is.
 *
 * Failures are logged with log_warnx at most once a second per kind, with a
 * count of the lines held back; the URL appears only redacted.
 *
 * Cluster mode (redis.cluster) is not implemented yet; backend_redis_new()
 * refuses it.  The pieces are separate for it: a connection set per node,
 * the script's encoding, and (to come) routing of each batch by slot.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "backend.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "redis_conn.h"
#include "redis_script.h"
#include "redis_url.h"
#include "util.h"

/* lua/ratelimit.lua and its SHA1, made by the Makefile. */
extern const char rl_lua_ratelimit[], rl_lua_ratelimit_sha[];

#define REDIS_CB_THRESHOLD	5	/* consecutive failures to open */
#define REDIS_CB_BACKOFF_MIN_MS	100
#define REDIS_CB_BACKOFF_MAX_MS	5000
#define REDIS_LOG_INTERVAL_US	1000000	/* one line per kind per second */
#define REDIS_NKINDS		(BACKEND_ERR_CIRCUIT_OPEN + 1)
#define REDIS_BATCH_CALLS	64	/* requests in one EVALSHA */
#define REDIS_BATCH_KEYS	512	/* keys in one EVALSHA */
#define REDIS_RECONNECT_US	100000	/* between connects of one slot */
#define REDIS_EVFD_TAG		UINT64_MAX
#define REDIS_HUNG		"no reply within the timeout"
/* Script calls in flight at once.  Redis runs one script at a time, so
 * more would only wait there; calls that arrive meanwhile wait here and
 * leave together, in one call, when one comes back. */
#define REDIS_WINDOW		8

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

/* One connection and what the loop knows of it. */
struct redis_slot {
	struct redis_conn *conn;
	int reg_fd;			/* registered with epoll, or -1 */
	uint64_t reg_gen;
	uint32_t reg_events;
	int64_t next_connect_us;	/* no new connect before */
	bool busy;			/* counted in the pool gauge */
};

/* One EVALSHA (or PING, for a probe) in flight. */
struct redis_batch {
	struct redis_backend *rb;
	struct redis_slot *slot;
	size_t ncalls, live;		/* live: calls not answered yet */
	bool probe, resent;
	struct backend_call *calls[REDIS_BATCH_CALLS];	/* NULL: answered */
	size_t counts[REDIS_BATCH_CALLS];
};

struct redis_backend {
	struct backend base;		/* first: we are a struct backend */
	struct redis_url url;
	char *shown_url;		/* redacted, for messages */
	int64_t timeout_us;
	struct redis_conn_config ccfg;

	struct redis_slot *slots;
	size_t nslots;

	pthread_t thread;
	bool thread_started;
	int epfd, evfd;

	pthread_mutex_t qmu;		/* guards the submission queue */
	struct backend_call *qhead, *qtail;
	bool stopping;

	/* The I/O thread's: calls sent or about to be, by deadline; calls
	 * held back while the window of script calls is full (FIFO). */
	struct backend_call *fhead, *ftail;
	struct backend_call *hhead, *htail;
	size_t batches_out;		/* script calls in flight */

	pthread_mutex_t mu;		/* guards the circuit */
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


/* ---- calls in flight ------------------------------------------------- */

/* Keep the call in the deadline-sorted list (nearly always at the end). */
static void
flight_add(struct redis_backend *rb, struct backend_call *call)
{
	struct backend_call *at = rb->ftail;

	while (at != NULL && at->deadline_us > call->deadline_us)
		at = at->q_prev;
	call->q_prev = at;
	call->q_next = at != NULL ? at->q_next : rb->fhead;
	if (call->q_next != NULL)
		call->q_next->q_prev = call;
	else
		rb->ftail = call;
	if (at != NULL)
		at->q_next = call;
	else
		rb->fhead = call;
}

static void
flight_remove(struct redis_backend *rb, struct backend_call *call)
{
	if (call->q_prev != NULL)
		call->q_prev->q_next = call->q_next;
	else
		rb->fhead = call->q_next;
	if (call->q_next != NULL)
		call->q_next->q_prev = call->q_prev;
	else
		rb->ftail = call->q_prev;
	call->q_next = call->q_prev = NULL;
}

/* Answer call: out of the list and its batch, the circuit told, done.
 * rc 0 means out[] and all_allowed are filled in already. */
static void
call_finish(struct redis_backend *rb, struct backend_call *call, int rc,
    enum backend_error_kind kind, const char *err)
{
	struct redis_batch *b = call->q_batch;
	size_t i;

	flight_remove(rb, call);
	if (b != NULL) {
		for (i = 0; i < b->ncalls; i++)
			if (b->calls[i] == call)
				b->calls[i] = NULL;
		b->live--;
		call->q_batch = NULL;
	}
	call->rc = rc;
	call->kind = rc == 0 ? BACKEND_ERR_NONE : kind;
	if (rc != 0) {
		snprintf(call->err, sizeof(call->err), "redis: %s", err);
		redis_log_failure(rb, kind, err);
	}
	if (call->n > 0)
		redis_circuit_leave(rb, call->q_trial, rc == 0 ?
		    REDIS_OUTCOME_OK : REDIS_OUTCOME_FAIL);
	call->done(call);
}

/* Fail every call of b that is still waiting. */
static void
batch_fail(struct redis_batch *b, enum backend_error_kind kind,
    const char *err)
{
	size_t i;

	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			call_finish(b->rb, b->calls[i], -1, kind, err);
}

/* ---- connections ----------------------------------------------------- */

static void
slot_busy(struct redis_backend *rb, struct redis_slot *s)
{
	bool busy = redis_conn_pending(s->conn) > 0;

	if (busy != s->busy) {
		metrics_pool_in_use(rb->metrics, busy ? 1 : -1);
		s->busy = busy;
	}
}

/* The connection for the next batch: the open one with the fewest
 * commands in flight, else one that may connect now, else a hung one
 * made anew; NULL if none. */
static struct redis_slot *
slot_pick(struct redis_backend *rb, int64_t now)
{
	struct redis_slot *best = NULL, *closed = NULL, *hung = NULL;
	size_t i, pend, best_pend = SIZE_MAX;

	for (i = 0; i < rb->nslots; i++) {
		struct redis_slot *s = &rb->slots[i];

		if (redis_conn_state(s->conn) == REDIS_CONN_CLOSED) {
			if (closed == NULL && now >= s->next_connect_us)
				closed = s;
			continue;
		}
		/* One whose oldest command waits for half the timeout
		 * already is likely hung: new calls go elsewhere. */
		if (redis_conn_oldest_us(s->conn) != INT64_MAX &&
		    now - redis_conn_oldest_us(s->conn) > rb->timeout_us / 2) {
			hung = s;
			continue;
		}
		pend = redis_conn_pending(s->conn);
		if (pend < best_pend) {
			best = s;
			best_pend = pend;
		}
	}
	if (best != NULL && (best_pend == 0 || closed == NULL))
		return best;
	/* Busy everywhere: open another connection if one is free. */
	if (closed != NULL || best != NULL)
		return closed != NULL ? closed : best;
	if (hung != NULL) {
		/* Only hung ones: drop one (its calls fail as timeouts) and
		 * connect anew for this batch. */
		redis_conn_close(hung->conn, REDIS_HUNG);
		slot_busy(rb, hung);
	}
	return hung;
}

static void batch_reply(void *arg, redisReply *r, const char *err);

/* SCRIPT LOAD after NOSCRIPT: its answer matters not (a failure shows in
 * the EVALSHA behind it). */
static void
batch_reply_ignore(void *arg, redisReply *r, const char *err)
{
	(void)arg;
	(void)r;
	(void)err;
}

/* Send b on a connection.  0, or -1 with err (nothing sent; b intact). */
static int
batch_send(struct redis_backend *rb, struct redis_batch *b, char *err,
    size_t errlen)
{
	struct redis_script_args a;
	struct redis_slot *s;
	bool was_closed;
	int rc;

	if ((s = slot_pick(rb, util_monotonic_us())) == NULL) {
		snprintf(err, errlen, "no connection (reconnecting: %s)",
		    redis_conn_last_error(rb->slots[0].conn));
		return -1;
	}
	was_closed = redis_conn_state(s->conn) == REDIS_CONN_CLOSED;
	if (was_closed)
		s->next_connect_us = util_monotonic_us() + REDIS_RECONNECT_US;
	if (b->probe) {
		const char *argv[1] = { "PING" };
		size_t lens[1] = { 4 };

		rc = redis_conn_send(s->conn, 1, argv, lens, batch_reply, b,
		    err, errlen);
	} else {
		if (redis_script_encode(b->calls, b->ncalls,
		    rl_lua_ratelimit_sha, &a) == -1) {
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		rc = redis_conn_send(s->conn, a.argc, a.argv, a.lens,
		    batch_reply, b, err, errlen);
		redis_script_args_free(&a);
	}
	if (rc == 0) {
		if (b->slot == NULL && !b->probe)
			rb->batches_out++;
		b->slot = s;
		slot_busy(rb, s);
	}
	return rc;
}

/* Drop the answered calls from b, so it can be encoded again. */
static void
batch_compact(struct redis_batch *b)
{
	size_t i, n = 0;

	for (i = 0; i < b->ncalls; i++) {
		if (b->calls[i] == NULL)
			continue;
		b->calls[n] = b->calls[i];
		b->counts[n++] = b->counts[i];
	}
	b->ncalls = n;
}

static bool
is_error(const redisReply *r, const char *prefix)
{
	return r->type == REDIS_REPLY_ERROR &&
	    strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/* The reply to a batch, or NULL with err when its connection closed. */
static void
batch_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_batch *b = arg;
	struct redis_backend *rb = b->rb;
	struct redis_slot *s = b->slot;
	char msg[BACKEND_ERR_MAX];
	size_t i;

	if (r == NULL) {
		/* Closed because Redis stopped answering: a timeout. */
		snprintf(msg, sizeof(msg), "connection lost: %s", err);
		batch_fail(b, strncmp(err, REDIS_HUNG, strlen(REDIS_HUNG)) == 0 ||
		    strcmp(err, "connect: timed out") == 0 ?
		    BACKEND_ERR_TIMEOUT : BACKEND_ERR_CONNECT, msg);
		goto out;
	}
	if (b->live == 0)
		goto out;		/* every call timed out already */
	if (b->probe) {
		bool ok = r->type == REDIS_REPLY_STATUS &&
		    strcmp(r->str, "PONG") == 0;

		snprintf(msg, sizeof(msg), "PING: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		for (i = 0; i < b->ncalls; i++)
			if (b->calls[i] != NULL)
				call_finish(rb, b->calls[i], ok ? 0 : -1,
				    BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	if (is_error(r, "NOSCRIPT") && !b->resent) {
		/* The script did not run: load it and send the calls still
		 * waiting once more, on any connection. */
		const char *argv[3] = { "SCRIPT", "LOAD", rl_lua_ratelimit };
		size_t lens[3] = { 6, 4, strlen(rl_lua_ratelimit) };

		b->resent = true;
		batch_compact(b);
		if (redis_conn_send(s->conn, 3, argv, lens, batch_reply_ignore,
		    NULL, msg, sizeof(msg)) == 0 &&
		    batch_send(rb, b, msg, sizeof(msg)) == 0) {
			slot_busy(rb, s);
			return;
		}
		batch_fail(b, BACKEND_ERR_CONNECT, msg);
		goto out;
	}
	if (is_error(r, "NOAUTH") || is_error(r, "WRONGPASS")) {
		/* The server changed under us: authenticate anew. */
		snprintf(msg, sizeof(msg), "script: %s", r->str);
		batch_fail(b, BACKEND_ERR_CONNECT, msg);
		redis_conn_close(s->conn, msg);
		goto out;
	}
	if (redis_script_decode(r, b->calls, b->counts, b->ncalls, msg,
	    sizeof(msg)) == -1) {
		batch_fail(b, BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			call_finish(rb, b->calls[i], 0, BACKEND_ERR_NONE, "");
out:
	if (s != NULL)
		slot_busy(rb, s);
	if (!b->probe)
		rb->batches_out--;
	rl_free(b);
}

/* ---- the I/O thread -------------------------------------------------- */

/* Send what was submitted since the last turn, as batches. */
static void
dispatch(struct redis_backend *rb, struct backend_call *list)
{
	struct redis_batch *b = NULL, *probe = NULL;
	struct backend_call *call, *next;
	char err[BACKEND_ERR_MAX];
	size_t keys = 0;

	for (call = list; call != NULL; call = next) {
		struct redis_batch **into = call->n == 0 ? &probe : &b;

		next = call->q_next;
		flight_add(rb, call);
		if (call->deadline_us <= util_monotonic_us()) {
			call_finish(rb, call, -1, BACKEND_ERR_TIMEOUT,
			    "no answer within the timeout (never sent: "
			    "Redis was busy)");
			continue;
		}
		if (*into != NULL && ((*into)->ncalls == REDIS_BATCH_CALLS ||
		    (call->n > 0 && keys + call->n > REDIS_BATCH_KEYS &&
		    keys > 0))) {
			if (batch_send(rb, *into, err, sizeof(err)) == -1) {
				batch_fail(*into, BACKEND_ERR_CONNECT, err);
				rl_free(*into);
			}
			*into = NULL;
		}
		if (*into == NULL) {
			if ((*into = rl_calloc(1, sizeof(**into))) == NULL) {
				call_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
				    "out of memory");
				continue;
			}
			(*into)->rb = rb;
			(*into)->probe = call->n == 0;
			if (call->n > 0)
				keys = 0;
		}
		(*into)->calls[(*into)->ncalls] = call;
		(*into)->counts[(*into)->ncalls++] = call->n;
		(*into)->live++;
		call->q_batch = *into;
		keys += call->n;
	}
	if (b != NULL && batch_send(rb, b, err, sizeof(err)) == -1) {
		batch_fail(b, BACKEND_ERR_CONNECT, err);
		rl_free(b);
	}
	if (probe != NULL && batch_send(rb, probe, err, sizeof(err)) == -1) {
		batch_fail(probe, BACKEND_ERR_CONNECT, err);
		rl_free(probe);
	}
}

/* Fail calls past their deadline and close connections that hang; return
 * how long the loop may sleep (ms, -1 for ever). */
static int
expire(struct redis_backend *rb)
{
	int64_t now = util_monotonic_us(), next = INT64_MAX, t;
	char msg[BACKEND_ERR_MAX];
	size_t i;

	while (rb->fhead != NULL && rb->fhead->deadline_us <= now) {
		snprintf(msg, sizeof(msg), "no answer within %" PRId64 " ms",
		    rb->timeout_us / 1000);
		call_finish(rb, rb->fhead, -1, BACKEND_ERR_TIMEOUT, msg);
	}
	/* Held back past the deadline: never sent. */
	while (rb->hhead != NULL && rb->hhead->deadline_us <= now) {
		struct backend_call *call = rb->hhead;

		if ((rb->hhead = call->q_next) == NULL)
			rb->htail = NULL;
		flight_add(rb, call);
		call_finish(rb, call, -1, BACKEND_ERR_TIMEOUT, "no answer "
		    "within the timeout (never sent: Redis was busy)");
	}
	if (rb->fhead != NULL)
		next = rb->fhead->deadline_us;
	if (rb->hhead != NULL && rb->hhead->deadline_us < next)
		next = rb->hhead->deadline_us;
	for (i = 0; i < rb->nslots; i++) {
		struct redis_conn *c = rb->slots[i].conn;

		if ((t = redis_conn_connect_deadline_us(c)) <= now) {
			redis_conn_close(c, "connect: timed out");
			slot_busy(rb, &rb->slots[i]);
		} else if (t < next)
			next = t;
		t = redis_conn_oldest_us(c);
		if (t != INT64_MAX && t + rb->timeout_us <= now) {
			redis_conn_close(c, REDIS_HUNG);
			slot_busy(rb, &rb->slots[i]);
		} else if (t != INT64_MAX && t + rb->timeout_us < next)
			next = t + rb->timeout_us;
	}
	if (next == INT64_MAX)
		return -1;
	return next <= now ? 0 : (int)((next - now + 999) / 1000);
}

/* Register each connection's socket with epoll as it is now. */
static void
watch_sockets(struct redis_backend *rb)
{
	struct epoll_event ev;
	size_t i;

	for (i = 0; i < rb->nslots; i++) {
		struct redis_slot *s = &rb->slots[i];
		int fd = redis_conn_fd(s->conn);
		uint64_t gen = redis_conn_generation(s->conn);
		uint32_t want = EPOLLIN |
		    (redis_conn_wants_write(s->conn) ? EPOLLOUT : 0);

		if (fd != s->reg_fd || gen != s->reg_gen) {
			/* A closed socket left the set by itself. */
			s->reg_fd = -1;
			if (fd < 0)
				continue;
			memset(&ev, 0, sizeof(ev));
			ev.events = want;
			ev.data.u64 = i;
			if (epoll_ctl(rb->epfd, EPOLL_CTL_ADD, fd, &ev) == -1) {
				redis_conn_close(s->conn, "epoll_ctl failed");
				continue;
			}
			s->reg_fd = fd;
			s->reg_gen = gen;
			s->reg_events = want;
		} else if (fd >= 0 && want != s->reg_events) {
			memset(&ev, 0, sizeof(ev));
			ev.events = want;
			ev.data.u64 = i;
			(void)epoll_ctl(rb->epfd, EPOLL_CTL_MOD, fd, &ev);
			s->reg_events = want;
		}
	}
}

static void *
redis_thread(void *arg)
{
	struct redis_backend *rb = arg;
	struct epoll_event evs[32];
	struct backend_call *list;
	uint64_t count;
	bool stop = false;
	int n, i, wait_ms = -1;
	size_t k;

	while (!stop) {
		n = epoll_wait(rb->epfd, evs, 32, wait_ms);
		for (i = 0; i < n; i++) {
			if (evs[i].data.u64 == REDIS_EVFD_TAG) {
				(void)!read(rb->evfd, &count, sizeof(count));
				continue;
			}
			k = (size_t)evs[i].data.u64;
			redis_conn_io(rb->slots[k].conn);
			slot_busy(rb, &rb->slots[k]);
		}
		pthread_mutex_lock(&rb->qmu);
		list = rb->qhead;
		if (list != NULL) {
			if (rb->htail != NULL)
				rb->htail->q_next = list;
			else
				rb->hhead = list;
			rb->htail = rb->qtail;
		}
		rb->qhead = rb->qtail = NULL;
		stop = rb->stopping;
		pthread_mutex_unlock(&rb->qmu);
		if (rb->hhead != NULL && (rb->batches_out < REDIS_WINDOW ||
		    stop)) {
			list = rb->hhead;
			rb->hhead = rb->htail = NULL;
			dispatch(rb, list);
			/* One write per connection for the whole turn. */
			for (k = 0; k < rb->nslots; k++) {
				if (redis_conn_state(rb->slots[k].conn) ==
				    REDIS_CONN_UP &&
				    redis_conn_wants_write(rb->slots[k].conn)) {
					redis_conn_io(rb->slots[k].conn);
					slot_busy(rb, &rb->slots[k]);
				}
			}
		}
		wait_ms = expire(rb);
		watch_sockets(rb);
	}
	/* Stopping: nothing is submitted any more; answer what is left. */
	for (k = 0; k < rb->nslots; k++) {
		redis_conn_close(rb->slots[k].conn, "shutting down");
		slot_busy(rb, &rb->slots[k]);
	}
	while (rb->fhead != NULL)
		call_finish(rb, rb->fhead, -1, BACKEND_ERR_CONNECT,
		    "shutting down");
	return NULL;
}

/* ---- the backend ----------------------------------------------------- */

static void
redis_submit(struct backend *b, struct backend_call *call)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	uint64_t one = 1;
	bool wake;

	call->q_next = call->q_prev = NULL;
	call->q_batch = NULL;
	call->q_trial = false;
	call->all_allowed = false;
	call->err[0] = '\0';
	call->q_start_us = util_monotonic_us();
	if (call->deadline_us == 0)
		call->deadline_us = call->q_start_us + rb->timeout_us;
	if (call->n > 0 && redis_circuit_enter(rb, &call->q_trial) == -1) {
		call->rc = -1;
		call->kind = BACKEND_ERR_CIRCUIT_OPEN;
		snprintf(call->err, sizeof(call->err), "redis: circuit open "
		    "after repeated failures");
		call->done(call);
		return;
	}
	pthread_mutex_lock(&rb->qmu);
	if (rb->stopping) {
		pthread_mutex_unlock(&rb->qmu);
		call->rc = -1;
		call->kind = BACKEND_ERR_CONNECT;
		snprintf(call->err, sizeof(call->err), "redis: shutting down");
		if (call->n > 0)
			redis_circuit_leave(rb, call->q_trial,
			    REDIS_OUTCOME_NEUTRAL);
		call->done(call);
		return;
	}
	wake = rb->qhead == NULL;
	if (rb->qtail != NULL)
		rb->qtail->q_next = call;
	else
		rb->qhead = call;
	rb->qtail = call;
	pthread_mutex_unlock(&rb->qmu);
	/* One wake-up per turn: later calls find the queue non-empty. */
	if (wake)
		(void)!write(rb->evfd, &one, sizeof(one));
}

static void
redis_free(struct backend *b)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	uint64_t one = 1;
	size_t i;

	if (rb == NULL)
		return;
	if (rb->thread_started) {
		pthread_mutex_lock(&rb->qmu);
		rb->stopping = true;
		pthread_mutex_unlock(&rb->qmu);
		(void)!write(rb->evfd, &one, sizeof(one));
		pthread_join(rb->thread, NULL);
	}
	for (i = 0; rb->slots != NULL && i < rb->nslots; i++)
		redis_conn_free(rb->slots[i].conn, "shutting down");
	if (rb->epfd >= 0)
		close(rb->epfd);
	if (rb->evfd >= 0)
		close(rb->evfd);
	pthread_mutex_destroy(&rb->mu);
	pthread_mutex_destroy(&rb->qmu);
	rl_free(rb->slots);
	rl_free(rb->shown_url);
	redis_url_free(&rb->url);
	rl_free(rb);
}

static const struct backend_ops redis_ops = {
	.submit = redis_submit,
	.free = redis_free,
};

struct backend *
backend_redis_new(const struct redis_config *rc, char *err, size_t errlen)
{
	struct redis_backend *rb;
	struct epoll_event ev;
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
	if ((rb = rl_calloc(1, sizeof(*rb))) == NULL) {
		snprintf(err, errlen, "redis: out of memory");
		return NULL;
	}
	rb->base.ops = &redis_ops;
	rb->base.name = "redis";
	rb->base.completes_inline = false;
	rb->timeout_us = rc->timeout_ms * 1000;
	rb->circuit = REDIS_CIRCUIT_CLOSED;
	rb->backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
	rb->epfd = rb->evfd = -1;
	pthread_mutex_init(&rb->mu, NULL);
	pthread_mutex_init(&rb->qmu, NULL);
	for (i = 0; i < REDIS_NKINDS; i++) {
		atomic_init(&rb->last_log_us[i], INT64_MIN);
		atomic_init(&rb->suppressed[i], 0);
	}
	if (redis_url_parse(rc->url, &rb->url, err, errlen) == -1)
		goto fail;
	if (rb->url.password == NULL && rc->password_file != NULL &&
	    redis_read_password_file(rc->password_file, &rb->url.password,
	    err, errlen) == -1)
		goto fail;
	if (rb->url.user != NULL && rb->url.password == NULL) {
		snprintf(err, errlen, "redis URL: user name without a "
		    "password (add :pass or a password_file)");
		goto fail;
	}
	shown_len = redis_url_redact(rc->url, NULL, 0) + 1;
	if ((rb->shown_url = rl_malloc(shown_len)) == NULL)
		goto oom;
	(void)redis_url_redact(rc->url, rb->shown_url, shown_len);

	rb->ccfg.url = &rb->url;
	rb->ccfg.script = rl_lua_ratelimit;
	rb->ccfg.connect_timeout_us = rb->timeout_us;
	rb->nslots = (size_t)rc->pool_size;
	if ((rb->slots = rl_calloc(rb->nslots, sizeof(*rb->slots))) == NULL)
		goto oom;
	for (i = 0; i < rb->nslots; i++) {
		rb->slots[i].reg_fd = -1;
		if ((rb->slots[i].conn = redis_conn_new(&rb->ccfg)) == NULL)
			goto oom;
	}
	if ((rb->epfd = epoll_create1(EPOLL_CLOEXEC)) == -1 ||
	    (rb->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) == -1) {
		snprintf(err, errlen, "redis: %s", strerror(errno));
		goto fail;
	}
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.u64 = REDIS_EVFD_TAG;
	if (epoll_ctl(rb->epfd, EPOLL_CTL_ADD, rb->evfd, &ev) == -1 ||
	    (errno = pthread_create(&rb->thread, NULL, redis_thread, rb)) !=
	    0) {
		snprintf(err, errlen, "redis: I/O thread: %s",
		    strerror(errno));
		goto fail;
	}
	rb->thread_started = true;
	return &rb->base;

oom:
	snprintf(err, errlen, "redis: out of memory");
fail:
	redis_free(&rb->base);
	return NULL;
}

void
backend_redis_set_metrics(struct backend *b, struct metrics *m)
{
	((struct redis_backend *)b)->metrics = m;
}
