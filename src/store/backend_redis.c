/*
 * backend_redis.c - the Redis store behind backend.h.  A request's checks
 * are evaluated by lua/ratelimit.lua, atomically on the server with the
 * server's clock (docs/algorithms.md); this file moves calls to Redis and
 * results back, batches what arrives together, routes each call to the
 * primary that holds its keys, and keeps a failing Redis from slowing the
 * daemon down.
 *
 * DESIGN
 *
 * One I/O thread owns every connection (redis_conn.c) and an epoll set.
 * backend_submit() puts a call on a queue under a mutex and wakes the
 * thread through an eventfd; it never touches a socket.  Each turn of the
 * loop takes every call queued since the last turn and sends them as
 * batches: up to REDIS_BATCH_CALLS requests in one EVALSHA (the script
 * evaluates them one after the other, each all-or-nothing on its own;
 * redis_script.c encodes and decodes), each batch on the connection of its
 * node with the fewest commands in flight, then writes each connection's
 * buffer with one write(2).  Under load calls queue while the thread
 * works, so batches grow by themselves; alone, a call leaves at once.
 *
 * Nodes.  Every server the store talks to is a node with its own
 * pool_size connections.  A single Redis (redis.url) is node 0.  Under
 * Sentinel (redis.sentinel) node 0 is the primary the sentinels name: it
 * is asked of them at start, and on +switch-master (a subscription), a
 * READONLY reply or a lost connection, node 0 moves to the primary they
 * name then: its connections close and reconnect there.  Under Redis
 * Cluster (redis.cluster) node i is slot_map.c's node i: the slot map
 * comes from CLUSTER SLOTS of any node that answers (the seeds first), and
 * a call goes to the node that owns the hash slot of its keys.  A batch
 * holds calls of one slot only (a script may touch one slot's keys).  A
 * request whose keys fall in several slots is split into one call per slot
 * and made all-or-nothing again by redis_split.c.  MOVED updates the map
 * (and asks for a new one) and sends the calls again to the new owner; ASK
 * sends the batch once to the node named, after ASKING; TRYAGAIN and
 * CLUSTERDOWN send it again 50 ms later.  None of these ran the script, so
 * sending again never counts twice.  A call that cannot be routed now (no
 * map yet, a slot without owner, no primary known) is parked in the
 * in-flight list and sent when the topology is known, or fails at its
 * deadline.
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
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "core/backend.h"
#include "core/config.h"
#include "base/log.h"
#include "base/metrics.h"
#include "store/redis_conn.h"
#include "store/redis_script.h"
#include "store/redis_split.h"
#include "store/redis_topology.h"
#include "core/redis_url.h"
#include "store/slot_map.h"
#include "base/util.h"
#include "store/redis.h"

/* The scripts of lua/ and their SHA1s, made by the Makefile. */
extern const char rl_lua_ratelimit[], rl_lua_ratelimit_sha[];
extern const char rl_lua_takeback[];
extern const char rl_lua_stats[], rl_lua_stats_sha[];
extern const char rl_lua_lease[];

#define REDIS_CB_THRESHOLD	5	/* consecutive failures to open */
#define REDIS_CB_BACKOFF_MIN_MS	100
#define REDIS_CB_BACKOFF_MAX_MS	5000
#define REDIS_LOG_INTERVAL_US	1000000	/* one line per kind per second */
#define REDIS_NKINDS		(BACKEND_ERR_CIRCUIT_OPEN + 1)
#define REDIS_BATCH_CALLS	64	/* requests in one EVALSHA */
#define REDIS_BATCH_KEYS	512	/* keys in one EVALSHA */
#define REDIS_RECONNECT_US	100000	/* between connects of one slot */
#define REDIS_EVFD_TAG		UINT64_MAX
#define REDIS_SENTINEL_TAG	(UINT64_C(1) << 40)	/* | sentinel index */
#define REDIS_SUB_TAG		(UINT64_C(1) << 41)
#define REDIS_REL_TAG		(UINT64_C(1) << 42)
#define REDIS_REL_RETRY_US	1000000	/* between subscription attempts */
#define REDIS_REL_REFUSED_US	60000000	/* ... after a refusal */
#define REDIS_HUNG		"no reply within the timeout"
/* Script calls in flight at once, per primary.  Redis runs one script at
 * a time, so more would only wait there; calls that arrive meanwhile wait
 * here and leave together, in one call, when one comes back. */
#define REDIS_WINDOW		8
#define REDIS_RETRY_US		50000	/* after TRYAGAIN, CLUSTERDOWN */
#define REDIS_REDIRECTS_MAX	5	/* MOVED / ASK followed per call */
#define REDIS_TOPOLOGY_US	100000	/* between topology questions */
#define REDIS_OPEN_BATCHES	64	/* batches filled in one turn */
#define REDIS_WATCH_US		500000	/* topology while the circuit is open */
#define REDIS_NODE_THRESHOLD	3	/* lost connections to mark one down */

enum redis_mode { REDIS_SINGLE, REDIS_CLUSTER, REDIS_SENTINEL };

/* What a call is (backend_call.q_kind). */
enum { CALL_REQUEST, CALL_PROBE, CALL_TAKEBACK, CALL_STATS, CALL_LEASE };

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

struct redis_node;

/* One connection and what the loop knows of it. */
struct redis_slot {
	struct redis_node *node;
	struct redis_conn *conn;
	int reg_fd;			/* registered with epoll, or -1 */
	uint64_t reg_gen;
	uint32_t reg_events;
	int64_t next_connect_us;	/* no new connect before */
	bool busy;			/* counted in the pool gauge */
};

/* One server and its connections. */
struct redis_node {
	struct redis_backend *rb;
	size_t index;
	char host[SLOT_MAP_HOST_MAX];
	struct redis_url url;		/* the config's, at host:port */
	struct redis_conn_config ccfg;
	struct redis_slot *conns;
	size_t nconns;

	/* Cluster: the breaker of this primary alone (the others keep
	 * deciding while it is down). */
	int failures;			/* consecutive lost connections */
	int64_t down_until_us;		/* calls fail at once until then */
	int64_t backoff_us;
};

/* One EVALSHA (or PING, or take-back) in flight. */
struct redis_batch {
	struct redis_backend *rb;
	struct redis_slot *slot;	/* sent on; NULL before */
	size_t ncalls, live;		/* live: calls not answered yet */
	int kind;			/* CALL_* of every call in it */
	bool resent, counted;
	int hslot;			/* Cluster: its keys' slot; else -1 */
	int ask_node;			/* ASK: send there once; else -1 */
	struct backend_call *calls[REDIS_BATCH_CALLS];	/* NULL: answered */
	size_t counts[REDIS_BATCH_CALLS];
};

/* Sentinel mode: who to ask where the primary is. */
struct redis_sentinels {
	char *master;
	size_t n;
	struct redis_url *urls;		/* host:port and password */
	struct redis_conn_config *cfgs;
	struct redis_slot *q;		/* for questions, one per sentinel */
	struct redis_slot sub;		/* SUBSCRIBE +switch-master */
	size_t ask_next, sub_next;	/* which sentinel is asked next */
	bool asking, ask_wanted, subscribed, sub_wanted;
	int64_t next_ask_us, next_sub_us;
	bool known;			/* node 0 is the primary they named */
};

struct redis_backend {
	struct backend base;		/* first: we are a struct backend */
	enum redis_mode mode;
	struct redis_url url;		/* credentials (and the single node) */
	char *shown_url;		/* redacted, for messages */
	int64_t timeout_us;
	size_t pool_size;

	struct redis_node **nodes;
	size_t nnodes;

	/* Cluster: the slot map, and asking for a new one. */
	struct slot_map map;
	int16_t last_owner[SLOT_MAP_SLOTS];	/* the map before */
	size_t nprimaries;		/* nodes that own slots */
	bool refresh_wanted, refreshing;
	int64_t next_watch_us;		/* topology while the circuit is open */
	size_t refresh_next;		/* node asked next */
	int64_t next_refresh_us;

	struct redis_sentinels sentinels;

	/* Releases of leases (backend_redis_watch_releases()): the I/O
	 * thread's subscription to rel_channel on one node.  rel_fn and
	 * rel_arg are set once, under qmu, before the first request. */
	backend_released_fn rel_fn;
	void *rel_arg;
	char *rel_channel;		/* "<key_prefix>released" */
	struct redis_slot rel;
	struct redis_conn_config rel_cfg;
	size_t rel_node;		/* the node subscribed to, or next */
	bool rel_started, rel_wanted;
	bool rel_refused;		/* the last SUBSCRIBE was refused */
	int64_t next_rel_us;

	pthread_t thread;
	bool thread_started;
	int epfd, evfd;

	pthread_mutex_t qmu;		/* guards the submission queue */
	struct backend_call *qhead, *qtail;
	bool stopping;

	/* The I/O thread's: calls sent, parked or about to be sent, by
	 * deadline; calls held back while the window of script calls is
	 * full (FIFO). */
	struct backend_call *fhead, *ftail;
	struct backend_call *hhead, *htail;
	struct backend_call *shead, *stail;	/* to route next turn */
	size_t batches_out;		/* script calls in flight */
	size_t parked;			/* calls in flight with no batch */
	int64_t unpark_us;		/* send parked calls then; 0: never */
	bool closing;			/* the thread is stopping */

	pthread_mutex_t mu;		/* guards the circuit */
	enum redis_circuit circuit;
	int failures;			/* consecutive */
	int64_t backoff_ms;		/* of the next opening */
	int64_t open_until_us;		/* monotonic; when OPEN */

	/* Borrowed; may be NULL.  Set by backend_redis_set_metrics() on
	 * another thread while this one runs: atomic. */
	struct metrics *_Atomic metrics;

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

/* The topology changed (a new slot map, a new primary): an open circuit
 * tries again at once, with the shortest backoff.  Returns whether the
 * circuit was open. */
static bool redis_circuit_kick(struct redis_backend *rb)
{
	bool open;

	pthread_mutex_lock(&rb->mu);
	open = rb->circuit == REDIS_CIRCUIT_OPEN;
	if (open) {
		rb->open_until_us = 0;
		rb->backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
	}
	pthread_mutex_unlock(&rb->mu);
	return open;
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

/* Calls to route at the next turn, whatever the window (FIFO). */
static void
soon_add(struct redis_backend *rb, struct backend_call *call)
{
	call->q_next = NULL;
	call->q_prev = NULL;
	if (rb->stail != NULL)
		rb->stail->q_next = call;
	else
		rb->shead = call;
	rb->stail = call;
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
	/* A part of a split request counts once, with its request. */
	if ((call->q_kind == CALL_REQUEST || call->q_kind == CALL_LEASE) &&
	    call->q_split == NULL && rb->mode != REDIS_CLUSTER)
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

/* Take the calls still waiting out of b and park them: they stay in the
 * deadline list and are routed again at unpark time (0: when the
 * topology is next known).  A call redirected too often fails. */
static void
batch_park(struct redis_batch *b, int64_t unpark_us, bool redirected)
{
	struct redis_backend *rb = b->rb;
	size_t i;

	for (i = 0; i < b->ncalls; i++) {
		struct backend_call *call = b->calls[i];

		if (call == NULL)
			continue;
		if (redirected && ++call->q_redirects > REDIS_REDIRECTS_MAX) {
			call_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
			    "too many cluster redirections");
			continue;
		}
		b->calls[i] = NULL;
		b->live--;
		call->q_batch = NULL;
	}
	if (unpark_us != 0 && (rb->unpark_us == 0 || unpark_us < rb->unpark_us))
		rb->unpark_us = unpark_us;
}

/* Send every parked call again now: to the soon list. */
static void
unpark_all(struct redis_backend *rb)
{
	struct backend_call *call, *next;

	rb->unpark_us = 0;
	for (call = rb->fhead; call != NULL; call = next) {
		next = call->q_next;
		if (call->q_batch != NULL)
			continue;
		flight_remove(rb, call);
		soon_add(rb, call);
	}
}

/* ---- requests across cluster slots ------------------------------------ */

static void
split_answer(struct redis_split *s)
{
	struct backend_call *parent = redis_split_parent(s);

	redis_split_answer(s);
	parent->done(parent);
}

/* A take-back finished; the last one answers the request, unless it was
 * answered already (its deadline had passed), and frees the split. */
static void
split_takeback_done(struct backend_call *tb)
{
	struct redis_split *s = tb->q_split;
	struct redis_backend *rb = redis_split_user(s);

	if (tb->rc == 0)
		metrics_redis_event(rb->metrics, METRICS_REDIS_TAKEBACK);
	else {
		metrics_redis_event(rb->metrics,
		    METRICS_REDIS_TAKEBACK_FAILED);
		log_warnx("redis %s: a denied request's units could not be "
		    "taken back (%s); they count until they expire",
		    rb->shown_url, tb->err);
	}
	if (!redis_split_one_done(s))
		return;
	if (!redis_split_answered(s))
		split_answer(s);
	redis_split_free(s);
}

/* A part finished; once all are in, take back what a request that does
 * not stand recorded, then answer it. */
static void
split_part_done(struct backend_call *part)
{
	struct redis_split *s = part->q_split;
	struct redis_backend *rb = redis_split_user(s);
	struct backend_call *parent = redis_split_parent(s);
	int64_t now = util_monotonic_us(), deadline;
	bool late = parent->deadline_us <= now;
	int n, i;

	if (!redis_split_one_done(s))
		return;
	/* Past the request's deadline the take-back still goes out, on a
	 * deadline of its own, but the request is answered at once. */
	deadline = late ? now + rb->timeout_us : parent->deadline_us;
	n = redis_split_takebacks(s, split_takeback_done, deadline);
	if (n < 0)
		log_warnx("redis %s: out of memory: a denied request's units "
		    "count until they expire", rb->shown_url);
	if (n <= 0) {
		split_answer(s);
		redis_split_free(s);
		return;
	}
	if (late)
		split_answer(s);
	for (i = 0; i < n; i++) {
		struct backend_call *tb = redis_split_takeback(s, (size_t)i);

		tb->q_kind = CALL_TAKEBACK;
		soon_add(rb, tb);
	}
}

/* ---- nodes and connections ------------------------------------------- */

static void
slot_busy(struct redis_backend *rb, struct redis_slot *s)
{
	bool busy = redis_conn_pending(s->conn) > 0;

	if (busy != s->busy) {
		metrics_pool_in_use(rb->metrics, busy ? 1 : -1);
		s->busy = busy;
	}
}

/* A node at host:port (host "" while unknown) with pool_size closed
 * connections, as rb->nodes[rb->nnodes].  0 or -1 (OOM). */
static int
node_add(struct redis_backend *rb, const char *host, int port)
{
	struct redis_node *node, **grown;
	size_t i;

	grown = rl_realloc(rb->nodes, (rb->nnodes + 1) * sizeof(*grown));
	if (grown == NULL)
		return -1;
	rb->nodes = grown;
	if ((node = rl_calloc(1, sizeof(*node))) == NULL)
		return -1;
	node->rb = rb;
	node->index = rb->nnodes;
	node->url = rb->url;		/* credentials, db: borrowed */
	if (!rb->url.is_unix) {
		util_strlcpy(node->host, host, sizeof(node->host));
		node->url.host = node->host;
		node->url.port = port;
	}
	node->ccfg.url = &node->url;
	node->ccfg.script = rl_lua_ratelimit;
	node->ccfg.connect_timeout_us = rb->timeout_us;
	node->conns = rl_calloc(rb->pool_size, sizeof(*node->conns));
	if (node->conns == NULL) {
		rl_free(node);
		return -1;
	}
	for (i = 0; i < rb->pool_size; i++) {
		node->conns[i].node = node;
		node->conns[i].reg_fd = -1;
		if ((node->conns[i].conn = redis_conn_new(&node->ccfg)) ==
		    NULL) {
			while (i-- > 0)
				redis_conn_free(node->conns[i].conn, "");
			rl_free(node->conns);
			rl_free(node);
			return -1;
		}
		node->nconns++;
	}
	rb->nodes[rb->nnodes++] = node;
	return 0;
}

static void
node_close(struct redis_backend *rb, struct redis_node *node,
    const char *why)
{
	size_t i;

	for (i = 0; i < node->nconns; i++) {
		redis_conn_close(node->conns[i].conn, why);
		slot_busy(rb, &node->conns[i]);
	}
}

/* Cluster: a node for every address the slot map knows.  0 or -1. */
static int
nodes_sync(struct redis_backend *rb)
{
	while (rb->nnodes < rb->map.nnodes)
		if (node_add(rb, rb->map.nodes[rb->nnodes].host,
		    rb->map.nodes[rb->nnodes].port) == -1)
			return -1;
	return 0;
}

/* The node for a call of hash slot hslot (-1: not cluster), or -1 when
 * none is known now. */
static int
node_for(struct redis_backend *rb, int hslot)
{
	switch (rb->mode) {
	case REDIS_SINGLE:
		return 0;
	case REDIS_SENTINEL:
		return rb->sentinels.known ? 0 : -1;
	case REDIS_CLUSTER:
		return hslot < 0 ? -1 : slot_map_owner(&rb->map,
		    (unsigned)hslot);
	}
	return -1;
}

/* Ask for the topology again (rate-limited by the loop). */
static void
topology_wanted(struct redis_backend *rb)
{
	if (rb->mode == REDIS_CLUSTER)
		rb->refresh_wanted = true;
	else if (rb->mode == REDIS_SENTINEL)
		rb->sentinels.ask_wanted = true;
}

/* Cluster: a connection to node was lost, or it answered. */
static void
node_failed(struct redis_backend *rb, struct redis_node *node)
{
	if (rb->mode != REDIS_CLUSTER ||
	    ++node->failures < REDIS_NODE_THRESHOLD)
		return;
	node->backoff_us = node->backoff_us == 0 ?
	    REDIS_CB_BACKOFF_MIN_MS * 1000 : node->backoff_us * 2;
	if (node->backoff_us > REDIS_CB_BACKOFF_MAX_MS * 1000)
		node->backoff_us = REDIS_CB_BACKOFF_MAX_MS * 1000;
	if (node->down_until_us == 0)
		log_warnx("redis cluster: %.64s:%d is down; its slots fail at "
		    "once until it or its replica answers", node->host,
		    node->url.port);
	node->down_until_us = util_monotonic_us() + node->backoff_us;
}

static void
node_answered(struct redis_backend *rb, struct redis_node *node)
{
	if (node->down_until_us != 0)
		log_info("redis cluster: %.64s:%d answers again", node->host,
		    node->url.port);
	node->failures = 0;
	node->down_until_us = 0;
	node->backoff_us = 0;
	(void)rb;
}

/* Whether a call for node fails at once: it is down, and its backoff has
 * not passed (then calls try it again). */
static bool
node_down(const struct redis_node *node, int64_t now)
{
	return node->down_until_us != 0 && now < node->down_until_us;
}

/* Whether some node is marked down (the topology is then watched). */
static bool
nodes_down(const struct redis_backend *rb)
{
	size_t i;

	for (i = 0; i < rb->nnodes; i++)
		if (rb->nodes[i]->down_until_us != 0)
			return true;
	return false;
}

/* The connection of node for the next command: the open one with the
 * fewest commands in flight, else one that may connect now, else a hung
 * one made anew; NULL if none. */
static struct redis_slot *
slot_pick(struct redis_backend *rb, struct redis_node *node, int64_t now)
{
	struct redis_slot *best = NULL, *closed = NULL, *hung = NULL;
	size_t i, pend, best_pend = SIZE_MAX;

	for (i = 0; i < node->nconns; i++) {
		struct redis_slot *s = &node->conns[i];

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

/* Queue one command on a connection of node (connecting if need be).
 * Returns the slot, or NULL with err. */
static struct redis_slot *
node_send(struct redis_backend *rb, struct redis_node *node, int argc,
    const char **argv, const size_t *lens, redis_reply_fn fn, void *arg,
    char *err, size_t errlen)
{
	struct redis_slot *s = slot_pick(rb, node, util_monotonic_us());

	if (s == NULL) {
		snprintf(err, errlen, "no connection to %.64s:%d "
		    "(reconnecting: %.80s)", node->url.is_unix ? node->url.path : node->host,
		    node->url.port, redis_conn_last_error(node->conns[0].conn));
		return NULL;
	}
	if (redis_conn_state(s->conn) == REDIS_CONN_CLOSED)
		s->next_connect_us = util_monotonic_us() + REDIS_RECONNECT_US;
	if (redis_conn_send(s->conn, argc, argv, lens, fn, arg, err,
	    errlen) == -1)
		return NULL;
	slot_busy(rb, s);
	return s;
}

/* ---- batches ---------------------------------------------------------- */

static void batch_reply(void *arg, redisReply *r, const char *err);

/* Replies that matter not (SCRIPT LOAD after NOSCRIPT, ASKING): a
 * failure shows in the command behind. */
static void
reply_ignore(void *arg, redisReply *r, const char *err)
{
	(void)arg;
	(void)r;
	(void)err;
}

/* Room for one argument of takeback.lua: a number, or a lease token (32
 * hex digits). */
#define TB_NUM 48

/* EVAL takeback.lua for the one call of b, on conn when given (after
 * ASKING), else on node. */
static struct redis_slot *
takeback_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	const struct backend_call *call = b->calls[0];
	size_t argc = 3 + call->n * 6, i, k;
	struct redis_slot *s = NULL;
	const char **argv;
	size_t *lens;
	char *nums;

	argv = rl_calloc(argc, sizeof(*argv));
	lens = rl_calloc(argc, sizeof(*lens));
	nums = rl_calloc(call->n * 5 + 1, TB_NUM);
	if (argv == NULL || lens == NULL || nums == NULL) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	argv[0] = "EVAL";
	argv[1] = rl_lua_takeback;
	snprintf(nums, TB_NUM, "%zu", call->n);
	argv[2] = nums;
	k = 3;
	for (i = 0; i < call->n; i++) {
		argv[k++] = call->checks[i].key;
		lens[k - 1] = call->checks[i].keylen;
	}
	for (i = 0; i < call->n; i++) {
		const struct rl_check *c = &call->checks[i];
		char *p = nums + (1 + i * 5) * TB_NUM;

		snprintf(p, TB_NUM, "%d", (int)c->algorithm);
		snprintf(p + TB_NUM, TB_NUM, "%" PRId64, c->limit);
		snprintf(p + 2 * TB_NUM, TB_NUM, "%" PRId64, c->window_ms);
		snprintf(p + 3 * TB_NUM, TB_NUM, "%" PRId64, c->cost);
		if (c->algorithm == RL_ALG_CONCURRENCY)
			snprintf(p + 4 * TB_NUM, TB_NUM, "%s",
			    c->token != NULL ? c->token : "0");
		else
			snprintf(p + 4 * TB_NUM, TB_NUM, "%.17g",
			    call->out[i].mark);
		for (int j = 0; j < 5; j++)
			argv[k++] = p + j * TB_NUM;
	}
	for (i = 0; i < argc; i++)
		if (lens[i] == 0)
			lens[i] = strlen(argv[i]);
	if (conn != NULL)
		s = redis_conn_send(conn, (int)argc, argv, lens, batch_reply,
		    b, err, errlen) == 0 ? b->slot : NULL;
	else
		s = node_send(rb, node, (int)argc, argv, lens, batch_reply, b,
		    err, errlen);
out:
	rl_free(argv);
	rl_free(lens);
	rl_free(nums);
	return s;
}

/* EVALSHA stats.lua (EVAL once it answered NOSCRIPT) for the one stat
 * call of b, on conn when given (after ASKING), else on node. */
static struct redis_slot *
stats_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err,
    size_t errlen)
{
	const struct rl_stat_op *op = b->calls[0]->stat;
	struct redis_stats_args a;
	struct redis_slot *s = NULL;

	if (redis_stats_encode(op, b->resent ? rl_lua_stats : NULL,
	    rl_lua_stats_sha, &a) < 0) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (conn != NULL) {
		if (redis_conn_send(conn, a.argc, a.argv, a.lens, batch_reply,
		    b, err, errlen) == 0)
			s = b->slot;
	} else
		s = node_send(rb, node, a.argc, a.argv, a.lens, batch_reply, b,
		    err, errlen);
	redis_stats_args_free(&a);
	return s;
}

/* EVAL lease.lua for the one call of b (a release or a renewal), on conn
 * when given (after ASKING), else on node. */
static struct redis_slot *
lease_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	const struct backend_call *call = b->calls[0];
	const struct rl_check *c = &call->checks[0];
	char cost[32], wms[32];
	const char *argv[9];
	size_t lens[9];
	int i;

	snprintf(cost, sizeof(cost), "%" PRId64, c->cost);
	snprintf(wms, sizeof(wms), "%" PRId64, c->window_ms);
	argv[0] = "EVAL";
	argv[1] = rl_lua_lease;
	argv[2] = "1";
	argv[3] = c->key;
	argv[4] = call->lease_op == BACKEND_LEASE_RENEW ? "renew" : "release";
	argv[5] = c->token != NULL ? c->token : "";
	argv[6] = cost;
	argv[7] = wms;
	argv[8] = rb->rel_channel;	/* release: PUBLISH the key there */
	for (i = 0; i < 9; i++)
		lens[i] = strlen(argv[i]);
	lens[3] = c->keylen;
	if (conn != NULL)
		return redis_conn_send(conn, 9, argv, lens, batch_reply, b,
		    err, errlen) == 0 ? b->slot : NULL;
	return node_send(rb, node, 9, argv, lens, batch_reply, b, err,
	    errlen);
}

/*
 * Send b to its node.  0; -1 with err (nothing sent; b intact); or 1 when
 * no node is known for it now (nothing sent; the caller parks it).
 */
static int
batch_send(struct redis_backend *rb, struct redis_batch *b, char *err,
    size_t errlen)
{
	struct redis_script_args a;
	struct redis_node *node;
	struct redis_slot *s;
	int n;

	n = b->ask_node >= 0 ? b->ask_node : node_for(rb, b->hslot);
	if (n < 0 || (size_t)n >= rb->nnodes)
		return 1;
	node = rb->nodes[n];
	if (b->ask_node >= 0) {
		const char *argv[1] = { "ASKING" };
		size_t lens[1] = { 6 };

		if ((s = node_send(rb, node, 1, argv, lens, reply_ignore, NULL,
		    err, errlen)) == NULL)
			return -1;
		/* The call must follow on the same connection, each kind
		 * with its own script. */
		if (b->kind == CALL_STATS || b->kind == CALL_LEASE ||
		    b->kind == CALL_TAKEBACK) {
			b->slot = s;
			if ((b->kind == CALL_STATS ? stats_send(rb, node,
			    s->conn, b, err, errlen) : b->kind == CALL_LEASE ?
			    lease_send(rb, node, s->conn, b, err, errlen) :
			    takeback_send(rb, node, s->conn, b, err,
			    errlen)) == NULL)
				s = NULL;
		} else {
			if (redis_script_encode(b->calls, b->ncalls,
			    rl_lua_ratelimit_sha, true, &a) == -1) {
				snprintf(err, errlen, "out of memory");
				return -1;
			}
			if (redis_conn_send(s->conn, a.argc, a.argv, a.lens,
			    batch_reply, b, err, errlen) == -1)
				s = NULL;
			redis_script_args_free(&a);
		}
	} else if (b->kind == CALL_PROBE) {
		const char *argv[1] = { "PING" };
		size_t lens[1] = { 4 };

		s = node_send(rb, node, 1, argv, lens, batch_reply, b, err,
		    errlen);
	} else if (b->kind == CALL_TAKEBACK) {
		s = takeback_send(rb, node, NULL, b, err, errlen);
	} else if (b->kind == CALL_STATS) {
		s = stats_send(rb, node, NULL, b, err, errlen);
	} else if (b->kind == CALL_LEASE) {
		s = lease_send(rb, node, NULL, b, err, errlen);
	} else {
		if (redis_script_encode(b->calls, b->ncalls,
		    rl_lua_ratelimit_sha, rb->mode == REDIS_CLUSTER, &a) ==
		    -1) {
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		s = node_send(rb, node, a.argc, a.argv, a.lens, batch_reply, b,
		    err, errlen);
		redis_script_args_free(&a);
	}
	if (s == NULL)
		return -1;
	if (!b->counted && b->kind == CALL_REQUEST) {
		rb->batches_out++;
		b->counted = true;
	}
	b->slot = s;
	slot_busy(rb, s);
	return 0;
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

/* b is done with: out of the window, freed. */
static void
batch_free(struct redis_batch *b)
{
	if (b->counted)
		b->rb->batches_out--;
	rl_free(b);
}

static bool
is_error(const redisReply *r, const char *prefix)
{
	return r->type == REDIS_REPLY_ERROR &&
	    strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/* MOVED or ASK: follow it.  Returns 1 when b was sent again (ASK: it is
 * still in flight), 0 when its calls were parked (MOVED: b is done with),
 * -1 when it is not a redirection or cannot be followed (b fails). */
static int
batch_redirect(struct redis_batch *b, const redisReply *r, char *msg,
    size_t msglen)
{
	struct redis_backend *rb = b->rb;
	struct redis_node *from = b->slot->node;
	char host[SLOT_MAP_HOST_MAX];
	enum slot_redirect kind;
	unsigned slot;
	int port, node;
	size_t i;

	kind = slot_map_parse_redirect(r->str, r->len, &slot, host,
	    sizeof(host), &port);
	if (kind == SLOT_REDIRECT_NONE || rb->mode != REDIS_CLUSTER)
		return -1;
	if (host[0] == '\0')
		util_strlcpy(host, from->host, sizeof(host));
	if (kind == SLOT_REDIRECT_MOVED) {
		metrics_redis_event(rb->metrics, METRICS_REDIS_MOVED);
		if (slot_map_move(&rb->map, slot, host, port, msg, msglen) ==
		    -1 || nodes_sync(rb) == -1)
			return -1;
		rb->refresh_wanted = true;
		batch_park(b, util_monotonic_us(), true);
		return 0;
	}
	metrics_redis_event(rb->metrics, METRICS_REDIS_ASK);
	if ((node = slot_map_node(&rb->map, host, port, msg, msglen)) < 0 ||
	    nodes_sync(rb) == -1)
		return -1;
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL &&
		    ++b->calls[i]->q_redirects > REDIS_REDIRECTS_MAX) {
			snprintf(msg, msglen, "too many cluster redirections");
			return -1;
		}
	batch_compact(b);
	b->ask_node = node;
	return batch_send(rb, b, msg, msglen) == 0 ? 1 : -1;
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
		topology_wanted(rb);
		if (s != NULL)
			node_failed(rb, s->node);
		goto out;
	}
	if (s != NULL)
		node_answered(rb, s->node);
	if (b->live == 0)
		goto out;		/* every call timed out already */
	if (b->kind == CALL_PROBE) {
		bool ok = r->type == REDIS_REPLY_STATUS &&
		    strcmp(r->str, "PONG") == 0;

		snprintf(msg, sizeof(msg), "PING: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		if (ok && rb->mode == REDIS_CLUSTER &&
		    slot_map_unowned(&rb->map) > 0) {
			ok = false;
			snprintf(msg, sizeof(msg), "%zu cluster slots have no "
			    "primary", slot_map_unowned(&rb->map));
		}
		for (i = 0; i < b->ncalls; i++)
			if (b->calls[i] != NULL)
				call_finish(rb, b->calls[i], ok ? 0 : -1,
				    BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	if (r->type == REDIS_REPLY_ERROR) {
		switch (batch_redirect(b, r, msg, sizeof(msg))) {
		case 1:
			if (s != NULL)
				slot_busy(rb, s);
			return;			/* sent again (ASK) */
		case 0:
			goto out;		/* parked (MOVED) */
		}
		if (is_error(r, "TRYAGAIN") || is_error(r, "CLUSTERDOWN") ||
		    is_error(r, "LOADING") || is_error(r, "MASTERDOWN")) {
			/* Nothing ran: again a little later. */
			if (!is_error(r, "TRYAGAIN"))
				topology_wanted(rb);
			batch_park(b, util_monotonic_us() + REDIS_RETRY_US,
			    false);
			goto out;
		}
		if (is_error(r, "READONLY") && rb->mode != REDIS_SINGLE) {
			/* A replica now: the script stopped at its first
			 * write, so nothing was recorded.  Again once the
			 * new primary is known. */
			topology_wanted(rb);
			batch_park(b, 0, false);
			goto out;
		}
	}
	if (b->kind == CALL_STATS && is_error(r, "NOSCRIPT") && !b->resent) {
		/* Not loaded on this node yet: once more as EVAL, which
		 * caches it for the next EVALSHA. */
		b->resent = true;
		if (stats_send(rb, s->node, s->conn, b, msg, sizeof(msg)) !=
		    NULL) {
			slot_busy(rb, s);
			return;
		}
		batch_fail(b, BACKEND_ERR_CONNECT, msg);
		goto out;
	}
	if (b->kind == CALL_STATS) {
		struct backend_call *call = b->calls[0];

		if (call != NULL) {
			int rc = redis_stats_decode(r, call->stat,
			    call->stat_out, msg, sizeof(msg));

			call_finish(rb, call, rc, BACKEND_ERR_PROTOCOL, msg);
		}
		goto out;
	}
	if (b->kind == CALL_LEASE) {
		bool ok = r->type == REDIS_REPLY_INTEGER && r->integer >= 0;

		snprintf(msg, sizeof(msg), "lease: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		for (i = 0; i < b->ncalls; i++) {
			struct backend_call *c = b->calls[i];

			if (c == NULL)
				continue;
			if (ok) {
				memset(&c->out[0], 0, sizeof(c->out[0]));
				c->out[0].allowed = r->integer > 0;
				c->out[0].reset_ms =
				    c->lease_op == BACKEND_LEASE_RENEW ?
				    r->integer : 0;
			}
			call_finish(rb, c, ok ? 0 : -1, BACKEND_ERR_PROTOCOL,
			    msg);
		}
		goto out;
	}
	if (b->kind == CALL_TAKEBACK) {
		bool ok = r->type == REDIS_REPLY_INTEGER;

		snprintf(msg, sizeof(msg), "take-back: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		for (i = 0; i < b->ncalls; i++)
			if (b->calls[i] != NULL)
				call_finish(rb, b->calls[i], ok ? 0 : -1,
				    BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	if (is_error(r, "NOSCRIPT") && !b->resent) {
		/* The script did not run: load it and send the calls still
		 * waiting once more. */
		const char *argv[3] = { "SCRIPT", "LOAD", rl_lua_ratelimit };
		size_t lens[3] = { 6, 4, strlen(rl_lua_ratelimit) };

		b->resent = true;
		batch_compact(b);
		if (redis_conn_send(s->conn, 3, argv, lens, reply_ignore,
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
	if (redis_script_decode(r, b->calls, b->counts, b->ncalls,
	    rb->mode == REDIS_CLUSTER, msg, sizeof(msg)) == -1) {
		batch_fail(b, BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			call_finish(rb, b->calls[i], 0, BACKEND_ERR_NONE, "");
out:
	if (s != NULL)
		slot_busy(rb, s);
	batch_free(b);
}

/* ---- routing ---------------------------------------------------------- */

/* The batches being filled in one turn. */
struct redis_turn {
	struct redis_batch *open[REDIS_OPEN_BATCHES];
	size_t keys[REDIS_OPEN_BATCHES];
	size_t nopen;
};

/* Send the open batch i of the turn (or park / fail its calls). */
static void
turn_send(struct redis_backend *rb, struct redis_turn *t, size_t i)
{
	struct redis_batch *b = t->open[i];
	char err[BACKEND_ERR_MAX];
	int rc = batch_send(rb, b, err, sizeof(err));

	t->open[i] = t->open[--t->nopen];
	t->keys[i] = t->keys[t->nopen];
	if (rc == 1) {
		topology_wanted(rb);
		batch_park(b, 0, false);
		batch_free(b);
	} else if (rc == -1) {
		batch_fail(b, BACKEND_ERR_CONNECT, err);
		batch_free(b);
	}
}

static void route(struct redis_backend *rb, struct redis_turn *t,
    struct backend_call *call);

/* Cluster: a request whose keys are in several slots, one part each. */
static void
route_split(struct redis_backend *rb, struct redis_turn *t,
    struct backend_call *call, const unsigned *slots)
{
	struct redis_split *s;
	size_t i;

	flight_remove(rb, call);	/* its parts are in flight instead */
	if ((s = redis_split_new(call, slots, split_part_done, rb)) == NULL) {
		flight_add(rb, call);
		call_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
		    "out of memory");
		return;
	}
	for (i = 0; i < redis_split_nparts(s); i++) {
		struct backend_call *part = redis_split_part(s, i);

		part->q_kind = CALL_REQUEST;
		part->q_trial = false;
		route(rb, t, part);
	}
}

/* Into a batch of this turn, or parked. */
static void
route(struct redis_backend *rb, struct redis_turn *t,
    struct backend_call *call)
{
	unsigned slots[REDIS_BATCH_KEYS];
	struct redis_batch *b = NULL;
	int hslot = -1, n;
	size_t i, k;

	call->q_batch = NULL;
	flight_add(rb, call);
	if (rb->closing) {
		call_finish(rb, call, -1, BACKEND_ERR_CONNECT,
		    "shutting down");
		return;
	}
	if (call->deadline_us <= util_monotonic_us()) {
		call_finish(rb, call, -1, BACKEND_ERR_TIMEOUT, "no answer "
		    "within the timeout (never sent: Redis was busy)");
		return;
	}
	if (rb->mode == REDIS_CLUSTER && call->q_kind == CALL_PROBE)
		hslot = 0;
	else if (rb->mode == REDIS_CLUSTER && call->q_kind == CALL_STATS)
		hslot = (int)slot_map_keyslot(call->stat->key,
		    call->stat->keylen);
	else if (rb->mode == REDIS_CLUSTER) {
		bool one = true;

		if (call->n > REDIS_BATCH_KEYS) {
			call_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
			    "too many rules for one request");
			return;
		}
		for (i = 0; i < call->n; i++) {
			slots[i] = slot_map_keyslot(call->checks[i].key,
			    call->checks[i].keylen);
			one = one && slots[i] == slots[0];
		}
		if (!one && call->q_kind == CALL_REQUEST) {
			route_split(rb, t, call, slots);
			return;
		}
		hslot = (int)slots[0];
	}
	if ((n = node_for(rb, hslot)) < 0) {
		topology_wanted(rb);
		return;				/* parked */
	}
	if (node_down(rb->nodes[n], util_monotonic_us())) {
		call_finish(rb, call, -1, BACKEND_ERR_CIRCUIT_OPEN, "the "
		    "primary of this key is down");
		return;
	}
	/* A batch of the same kind and slot with room, but a take-back
	 * always alone. */
	for (k = 0; call->q_kind != CALL_TAKEBACK &&
	    call->q_kind != CALL_STATS && call->q_kind != CALL_LEASE &&
	    k < t->nopen; k++) {
		struct redis_batch *o = t->open[k];

		if (o->kind != call->q_kind || o->hslot != hslot)
			continue;
		if (o->ncalls == REDIS_BATCH_CALLS ||
		    (call->n > 0 && t->keys[k] + call->n > REDIS_BATCH_KEYS)) {
			turn_send(rb, t, k);
			break;
		}
		b = o;
		break;
	}
	if (b == NULL) {
		if (t->nopen == REDIS_OPEN_BATCHES)
			turn_send(rb, t, 0);
		if ((b = rl_calloc(1, sizeof(*b))) == NULL) {
			call_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
			    "out of memory");
			return;
		}
		b->rb = rb;
		b->kind = call->q_kind;
		b->hslot = hslot;
		b->ask_node = -1;
		k = t->nopen++;
		t->open[k] = b;
		t->keys[k] = 0;
	}
	b->calls[b->ncalls] = call;
	b->counts[b->ncalls++] = call->n;
	b->live++;
	call->q_batch = b;
	t->keys[k] += call->n;
	if (call->q_kind == CALL_TAKEBACK || call->q_kind == CALL_STATS ||
	    call->q_kind == CALL_LEASE)
		turn_send(rb, t, k);
}

/* Route a list of calls (linked by q_next), then send every batch. */
static void
dispatch(struct redis_backend *rb, struct backend_call *list)
{
	struct redis_turn t;
	struct backend_call *call, *next;

	t.nopen = 0;
	for (call = list; call != NULL; call = next) {
		next = call->q_next;
		route(rb, &t, call);
	}
	while (t.nopen > 0)
		turn_send(rb, &t, t.nopen - 1);
}

/* ---- Cluster: the slot map -------------------------------------------- */

static void
refresh_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_node *node = arg;
	struct redis_backend *rb = node->rb;
	struct slot_range *ranges = NULL;
	size_t n = 0, i, owners;
	char msg[BACKEND_ERR_MAX];
	bool *owns;

	rb->refreshing = false;
	if (r == NULL) {
		snprintf(msg, sizeof(msg), "CLUSTER SLOTS on %.64s:%d: %.80s",
		    node->host, node->url.port, err);
		goto fail;
	}
	if (redis_topology_slots(r, node->host, &ranges, &n, msg,
	    sizeof(msg)) == -1)
		goto fail;
	memcpy(rb->last_owner, rb->map.owner, sizeof(rb->last_owner));
	if (slot_map_build(&rb->map, ranges, n, msg, sizeof(msg)) == -1 ||
	    nodes_sync(rb) == -1) {
		rl_free(ranges);
		goto fail;
	}
	rl_free(ranges);
	metrics_redis_event(rb->metrics, METRICS_REDIS_TOPOLOGY_REFRESH);
	owners = 0;
	if ((owns = rl_calloc(rb->map.nnodes, sizeof(*owns))) != NULL) {
		for (i = 0; i < SLOT_MAP_SLOTS; i++)
			if (rb->map.owner[i] >= 0 && !owns[rb->map.owner[i]]) {
				owns[rb->map.owner[i]] = true;
				owners++;
			}
		rl_free(owns);
	}
	if (memcmp(rb->last_owner, rb->map.owner, sizeof(rb->last_owner)) !=
	    0 && redis_circuit_kick(rb))
		log_info("redis cluster: the slot map changed; trying again");
	if (owners != rb->nprimaries)
		log_info("redis cluster: %zu primaries, slot map from "
		    "%s:%d", owners, node->host, node->url.port);
	rb->nprimaries = owners;
	if (slot_map_unowned(&rb->map) > 0) {
		/* Part of the cluster is down: ask again, less often. */
		rb->refresh_wanted = true;
		rb->next_refresh_us = util_monotonic_us() +
		    10 * REDIS_TOPOLOGY_US;
	}
	rb->unpark_us = util_monotonic_us();
	return;
fail:
	rb->refresh_next++;
	rb->refresh_wanted = true;
	redis_log_failure(rb, BACKEND_ERR_CONNECT, msg);
}

/* Ask the next node for the slot map. */
static void
refresh_start(struct redis_backend *rb)
{
	const char *argv[2] = { "CLUSTER", "SLOTS" };
	size_t lens[2] = { 7, 5 };
	struct redis_node *node;
	char err[BACKEND_ERR_MAX];

	rb->next_refresh_us = util_monotonic_us() + REDIS_TOPOLOGY_US;
	node = rb->nodes[rb->refresh_next % rb->nnodes];
	if (node_send(rb, node, 2, argv, lens, refresh_reply, node, err,
	    sizeof(err)) == NULL) {
		rb->refresh_next++;
		redis_log_failure(rb, BACKEND_ERR_CONNECT, err);
		return;
	}
	rb->refresh_wanted = false;
	rb->refreshing = true;
}

/* ---- Sentinel: the primary -------------------------------------------- */

/* Node 0 is host:port now; move its connections if it moved. */
static void
sentinel_primary(struct redis_backend *rb, const char *host, int port,
    const char *how)
{
	struct redis_sentinels *ss = &rb->sentinels;
	struct redis_node *node = rb->nodes[0];
	char why[SLOT_MAP_HOST_MAX + 64];

	if (!ss->known || node->url.port != port ||
	    strcmp(node->host, host) != 0) {
		if (ss->known) {
			metrics_redis_event(rb->metrics,
			    METRICS_REDIS_FAILOVER);
			log_warnx("redis sentinel: primary \"%s\" moved from "
			    "%s:%d to %s:%d (%s)", ss->master, node->host,
			    node->url.port, host, port, how);
		} else
			log_info("redis sentinel: primary \"%s\" is %s:%d",
			    ss->master, host, port);
		snprintf(why, sizeof(why), "the primary moved to %s:%d",
		    host, port);
		node_close(rb, node, why);
		util_strlcpy(node->host, host, sizeof(node->host));
		node->url.port = port;
		ss->known = true;
		rb->rel_wanted = rb->rel_started;	/* follow it there */
		rb->next_rel_us = 0;
		(void)redis_circuit_kick(rb);
	}
	rb->unpark_us = util_monotonic_us();
}

static void
sentinel_ask_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;
	struct redis_sentinels *ss = &rb->sentinels;
	char host[SLOT_MAP_HOST_MAX], msg[BACKEND_ERR_MAX];
	int port;

	ss->asking = false;
	if (r != NULL && redis_topology_sentinel_addr(r, host, sizeof(host),
	    &port) == 0) {
		sentinel_primary(rb, host, port, "asked");
		return;
	}
	snprintf(msg, sizeof(msg), "sentinel %s:%d: %s",
	    ss->urls[ss->ask_next % ss->n].host,
	    ss->urls[ss->ask_next % ss->n].port, r == NULL ? err :
	    r->type == REDIS_REPLY_ERROR ? r->str :
	    "does not know the primary");
	redis_log_failure(rb, BACKEND_ERR_CONNECT, msg);
	ss->ask_next++;
	ss->ask_wanted = true;
}

static void
sentinel_ask(struct redis_backend *rb)
{
	struct redis_sentinels *ss = &rb->sentinels;
	struct redis_slot *s = &ss->q[ss->ask_next % ss->n];
	const char *argv[3] = { "SENTINEL", "GET-MASTER-ADDR-BY-NAME",
	    ss->master };
	size_t lens[3] = { 8, 23, strlen(ss->master) };
	char err[BACKEND_ERR_MAX];

	ss->next_ask_us = util_monotonic_us() + REDIS_TOPOLOGY_US;
	if (redis_conn_send(s->conn, 3, argv, lens, sentinel_ask_reply, rb,
	    err, sizeof(err)) == -1) {
		redis_log_failure(rb, BACKEND_ERR_CONNECT, err);
		ss->ask_next++;
		return;
	}
	ss->ask_wanted = false;
	ss->asking = true;
}

/* Messages on the subscription, and its end. */
static void
sentinel_push(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;
	struct redis_sentinels *ss = &rb->sentinels;
	char host[SLOT_MAP_HOST_MAX];
	int port;

	(void)err;
	if (r == NULL) {
		ss->subscribed = false;
		ss->sub_next++;
		ss->sub_wanted = true;
		ss->next_sub_us = util_monotonic_us() + 5 * REDIS_TOPOLOGY_US;
		return;
	}
	if (redis_topology_switch_master(r, ss->master, host, sizeof(host),
	    &port) == 0)
		sentinel_primary(rb, host, port, "+switch-master");
}

static void
sentinel_sub_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;
	struct redis_sentinels *ss = &rb->sentinels;

	(void)err;
	if (r != NULL && r->type == REDIS_REPLY_ARRAY) {
		ss->subscribed = true;
		/* A switch between the last question and now would be
		 * missed: ask once more. */
		ss->ask_wanted = true;
		return;
	}
	if (r != NULL)
		redis_conn_close(ss->sub.conn, "SUBSCRIBE refused");
}

static void
sentinel_subscribe(struct redis_backend *rb)
{
	struct redis_sentinels *ss = &rb->sentinels;
	const char *argv[2] = { "SUBSCRIBE", "+switch-master" };
	size_t lens[2] = { 9, 14 };
	char err[BACKEND_ERR_MAX];

	ss->sub_wanted = false;
	ss->next_sub_us = util_monotonic_us() + 5 * REDIS_TOPOLOGY_US;
	if (ss->sub.conn != NULL) {
		redis_conn_set_push(ss->sub.conn, NULL, NULL);
		redis_conn_free(ss->sub.conn, "moving the subscription");
		ss->sub.reg_fd = -1;
	}
	ss->sub.conn = redis_conn_new(&ss->cfgs[ss->sub_next % ss->n]);
	if (ss->sub.conn == NULL) {
		ss->sub_wanted = true;
		return;
	}
	redis_conn_set_push(ss->sub.conn, sentinel_push, rb);
	if (redis_conn_send(ss->sub.conn, 2, argv, lens, sentinel_sub_reply,
	    rb, err, sizeof(err)) == -1) {
		redis_log_failure(rb, BACKEND_ERR_CONNECT, err);
		ss->sub_next++;
		ss->sub_wanted = true;
	}
}

/* ---- releases of leases ---------------------------------------------- */

/* Try again later, on the next node (Cluster: any node hears every
 * PUBLISH; Sentinel: the primary). */
static void
rel_later(struct redis_backend *rb)
{
	if (rb->rel_wanted)
		return;
	rb->rel_wanted = true;
	rb->rel_node++;
	rb->next_rel_us = util_monotonic_us() + REDIS_REL_RETRY_US;
}

/* Messages on the subscription, and its end. */
static void
rel_push(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;

	(void)err;
	if (r == NULL) {
		rel_later(rb);
		return;
	}
	if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
	    r->element[0]->type == REDIS_REPLY_STRING &&
	    strcmp(r->element[0]->str, "message") == 0 &&
	    r->element[2]->type == REDIS_REPLY_STRING)
		rb->rel_fn(rb->rel_arg, r->element[2]->str,
		    r->element[2]->len);
}

static void
rel_sub_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;

	(void)err;
	if (r != NULL && r->type == REDIS_REPLY_ARRAY) {
		/* Releases while it was down went unheard. */
		if (rb->rel_refused)
			log_info("redis: SUBSCRIBE %s accepted",
			    rb->rel_channel);
		rb->rel_refused = false;
		rb->rel_fn(rb->rel_arg, NULL, 0);
		return;
	}
	if (rb->rel.conn != NULL)
		redis_conn_close(rb->rel.conn, "SUBSCRIBE failed");
	rel_later(rb);
	if (r == NULL)
		return;
	/* Refused (an ACL without the channel): say so once, and ask again
	 * only now and then. */
	if (!rb->rel_refused)
		log_warnx("redis: SUBSCRIBE %s refused (%s): requests waiting "
		    "for a lease learn of releases through other daemons "
		    "only when the lease expires", rb->rel_channel,
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	rb->rel_refused = true;
	rb->next_rel_us = util_monotonic_us() + REDIS_REL_REFUSED_US;
}

static void
rel_subscribe(struct redis_backend *rb)
{
	const char *argv[2] = { "SUBSCRIBE", rb->rel_channel };
	size_t lens[2] = { 9, strlen(rb->rel_channel) };
	char err[BACKEND_ERR_MAX];
	struct redis_node *node;

	rb->rel_wanted = false;
	if (rb->rel.conn != NULL) {
		redis_conn_set_push(rb->rel.conn, NULL, NULL);
		redis_conn_free(rb->rel.conn, "moving the subscription");
		rb->rel.conn = NULL;
		rb->rel.reg_fd = -1;
	}
	if (rb->nnodes == 0 || (rb->mode == REDIS_SENTINEL &&
	    !rb->sentinels.known)) {
		rb->rel_wanted = true;		/* no address yet */
		rb->next_rel_us = util_monotonic_us() + REDIS_TOPOLOGY_US;
		return;
	}
	node = rb->nodes[rb->mode == REDIS_CLUSTER ?
	    rb->rel_node % rb->nnodes : 0];
	rb->rel_cfg = node->ccfg;
	rb->rel_cfg.script = NULL;
	if ((rb->rel.conn = redis_conn_new(&rb->rel_cfg)) == NULL) {
		rel_later(rb);
		return;
	}
	redis_conn_set_push(rb->rel.conn, rel_push, rb);
	if (redis_conn_send(rb->rel.conn, 2, argv, lens, rel_sub_reply, rb,
	    err, sizeof(err)) == -1) {
		redis_log_failure(rb, BACKEND_ERR_CONNECT, err);
		rel_later(rb);
	}
}

/* Whatever the topology needs this turn; returns when it next needs the
 * loop to wake (monotonic us), or INT64_MAX. */
static int64_t
topology_turn(struct redis_backend *rb, int64_t now)
{
	struct redis_sentinels *ss = &rb->sentinels;
	int64_t next = INT64_MAX;

	/* While the circuit is open only trial calls fail, rarely: watch
	 * the topology meanwhile, so a failover shows without waiting for
	 * the next trial. */
	if (rb->mode != REDIS_SINGLE && now >= rb->next_watch_us) {
		rb->next_watch_us = now + REDIS_WATCH_US;
		pthread_mutex_lock(&rb->mu);
		if (rb->circuit != REDIS_CIRCUIT_CLOSED)
			topology_wanted(rb);
		pthread_mutex_unlock(&rb->mu);
		if (nodes_down(rb))
			topology_wanted(rb);
	}
	if (rb->mode != REDIS_SINGLE && rb->next_watch_us < next)
		next = rb->next_watch_us;
	if (rb->mode == REDIS_CLUSTER && rb->refresh_wanted &&
	    !rb->refreshing) {
		if (now >= rb->next_refresh_us)
			refresh_start(rb);
		if (rb->refresh_wanted)
			next = rb->next_refresh_us;
	}
	if (rb->mode == REDIS_SENTINEL) {
		if (ss->ask_wanted && !ss->asking) {
			if (now >= ss->next_ask_us)
				sentinel_ask(rb);
			if (ss->ask_wanted && ss->next_ask_us < next)
				next = ss->next_ask_us;
		}
		if (ss->sub_wanted) {
			if (now >= ss->next_sub_us)
				sentinel_subscribe(rb);
			if (ss->sub_wanted && ss->next_sub_us < next)
				next = ss->next_sub_us;
		}
	}
	if (rb->rel_wanted) {
		if (now >= rb->next_rel_us)
			rel_subscribe(rb);
		if (rb->rel_wanted && rb->next_rel_us < next)
			next = rb->next_rel_us;
	}
	return next;
}

/* ---- the I/O thread -------------------------------------------------- */

/* Every connection the loop drives, with the epoll tag of each. */
static struct redis_slot *
slot_of_tag(struct redis_backend *rb, uint64_t tag)
{
	if (tag == REDIS_SUB_TAG)
		return rb->sentinels.sub.conn != NULL ? &rb->sentinels.sub :
		    NULL;
	if (tag == REDIS_REL_TAG)
		return rb->rel.conn != NULL ? &rb->rel : NULL;
	if (tag & REDIS_SENTINEL_TAG) {
		tag &= ~REDIS_SENTINEL_TAG;
		return tag < rb->sentinels.n ? &rb->sentinels.q[tag] : NULL;
	}
	if ((tag >> 16) >= rb->nnodes ||
	    (tag & 0xffff) >= rb->nodes[tag >> 16]->nconns)
		return NULL;
	return &rb->nodes[tag >> 16]->conns[tag & 0xffff];
}

/* Call fn on every connection with its tag. */
static void
each_slot(struct redis_backend *rb,
    void (*fn)(struct redis_backend *, struct redis_slot *, uint64_t, void *),
    void *arg)
{
	size_t i, j;

	for (i = 0; i < rb->nnodes; i++)
		for (j = 0; j < rb->nodes[i]->nconns; j++)
			fn(rb, &rb->nodes[i]->conns[j],
			    ((uint64_t)i << 16) | j, arg);
	for (i = 0; i < rb->sentinels.n; i++)
		fn(rb, &rb->sentinels.q[i], REDIS_SENTINEL_TAG | i, arg);
	if (rb->sentinels.sub.conn != NULL)
		fn(rb, &rb->sentinels.sub, REDIS_SUB_TAG, arg);
	if (rb->rel.conn != NULL)
		fn(rb, &rb->rel, REDIS_REL_TAG, arg);
}

/* Close a connection whose connect or oldest command is overdue; lower
 * *(int64_t *)arg to when the next one would be. */
static void
expire_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	int64_t *next = arg, now = util_monotonic_us(), t;

	(void)tag;
	if ((t = redis_conn_connect_deadline_us(s->conn)) <= now) {
		redis_conn_close(s->conn, "connect: timed out");
		slot_busy(rb, s);
	} else if (t < *next)
		*next = t;
	t = redis_conn_oldest_us(s->conn);
	if (t != INT64_MAX && t + rb->timeout_us <= now) {
		redis_conn_close(s->conn, REDIS_HUNG);
		slot_busy(rb, s);
	} else if (t != INT64_MAX && t + rb->timeout_us < *next)
		*next = t + rb->timeout_us;
}

/* Fail calls past their deadline and close connections that hang; return
 * how long the loop may sleep (ms, -1 for ever). */
static int
expire(struct redis_backend *rb, int64_t next)
{
	int64_t now = util_monotonic_us();
	char msg[BACKEND_ERR_MAX];

	while (rb->fhead != NULL && rb->fhead->deadline_us <= now) {
		snprintf(msg, sizeof(msg), "no answer within %" PRId64 " ms%s",
		    rb->timeout_us / 1000, rb->fhead->q_batch == NULL ?
		    " (no primary known for its keys)" : "");
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
	if (rb->fhead != NULL && rb->fhead->deadline_us < next)
		next = rb->fhead->deadline_us;
	if (rb->hhead != NULL && rb->hhead->deadline_us < next)
		next = rb->hhead->deadline_us;
	if (rb->unpark_us != 0 && rb->unpark_us < next)
		next = rb->unpark_us;
	if (rb->shead != NULL)
		next = now;
	each_slot(rb, expire_slot, &next);
	if (next == INT64_MAX)
		return -1;
	return next <= now ? 0 : (int)((next - now + 999) / 1000);
}

/* Register a connection's socket with epoll as it is now. */
static void
watch_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	struct epoll_event ev;
	int fd = redis_conn_fd(s->conn);
	uint64_t gen = redis_conn_generation(s->conn);
	uint32_t want = EPOLLIN |
	    (redis_conn_wants_write(s->conn) ? EPOLLOUT : 0);

	(void)arg;
	if (fd != s->reg_fd || gen != s->reg_gen) {
		/* A closed socket left the set by itself. */
		s->reg_fd = -1;
		if (fd < 0)
			return;
		memset(&ev, 0, sizeof(ev));
		ev.events = want;
		ev.data.u64 = tag;
		if (epoll_ctl(rb->epfd, EPOLL_CTL_ADD, fd, &ev) == -1) {
			redis_conn_close(s->conn, "epoll_ctl failed");
			return;
		}
		s->reg_fd = fd;
		s->reg_gen = gen;
		s->reg_events = want;
	} else if (fd >= 0 && want != s->reg_events) {
		memset(&ev, 0, sizeof(ev));
		ev.events = want;
		ev.data.u64 = tag;
		(void)epoll_ctl(rb->epfd, EPOLL_CTL_MOD, fd, &ev);
		s->reg_events = want;
	}
}

/* One write for everything a connection got this turn. */
static void
flush_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	(void)tag;
	(void)arg;
	if (redis_conn_state(s->conn) == REDIS_CONN_UP &&
	    redis_conn_wants_write(s->conn)) {
		redis_conn_io(s->conn);
		slot_busy(rb, s);
	}
}

static void
close_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	(void)tag;
	redis_conn_close(s->conn, arg);
	slot_busy(rb, s);
}

/* Script calls allowed in flight now. */
static size_t
window(const struct redis_backend *rb)
{
	return REDIS_WINDOW * (rb->nprimaries > 1 ? rb->nprimaries : 1);
}

static void *
redis_thread(void *arg)
{
	struct redis_backend *rb = arg;
	struct epoll_event evs[32];
	struct backend_call *list;
	struct redis_slot *s;
	uint64_t count;
	bool stop = false;
	int n, i, wait_ms = -1;
	int64_t now, next;

	while (!stop) {
		n = epoll_wait(rb->epfd, evs, 32, wait_ms);
		for (i = 0; i < n; i++) {
			if (evs[i].data.u64 == REDIS_EVFD_TAG) {
				(void)!read(rb->evfd, &count, sizeof(count));
				continue;
			}
			if ((s = slot_of_tag(rb, evs[i].data.u64)) == NULL)
				continue;
			redis_conn_io(s->conn);
			slot_busy(rb, s);
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
		if (rb->rel_fn != NULL && !rb->rel_started) {
			rb->rel_started = rb->rel_wanted = true;
			rb->next_rel_us = 0;
		}
		pthread_mutex_unlock(&rb->qmu);
		now = util_monotonic_us();
		next = topology_turn(rb, now);
		if (rb->unpark_us != 0 && now >= rb->unpark_us)
			unpark_all(rb);
		if (rb->shead != NULL) {
			list = rb->shead;
			rb->shead = rb->stail = NULL;
			dispatch(rb, list);
		}
		if (rb->hhead != NULL && (rb->batches_out < window(rb) ||
		    stop)) {
			list = rb->hhead;
			rb->hhead = rb->htail = NULL;
			dispatch(rb, list);
		}
		each_slot(rb, flush_slot, NULL);
		wait_ms = expire(rb, next);
		each_slot(rb, watch_slot, NULL);
	}
	/* Stopping: nothing is submitted any more; answer what is left.
	 * Failing a part of a split request may queue its take-backs, which
	 * fail at once too. */
	rb->closing = true;
	each_slot(rb, close_slot, (void *)"shutting down");
	for (;;) {
		if (rb->shead != NULL) {
			list = rb->shead;
			rb->shead = rb->stail = NULL;
			dispatch(rb, list);
		}
		if (rb->hhead != NULL) {
			list = rb->hhead;
			rb->hhead = rb->htail = NULL;
			dispatch(rb, list);
		}
		while (rb->fhead != NULL)
			call_finish(rb, rb->fhead, -1, BACKEND_ERR_CONNECT,
			    "shutting down");
		if (rb->shead == NULL && rb->hhead == NULL)
			break;
	}
	return NULL;
}

/* ---- the backend ----------------------------------------------------- */

static void
redis_submit(struct backend *b, struct backend_call *call)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	uint64_t one = 1;
	int64_t own;
	bool wake;

	call->q_next = call->q_prev = NULL;
	call->q_batch = NULL;
	call->q_split = NULL;
	call->q_kind = call->n > 0 ? (call->lease_op != BACKEND_LEASE_NONE ?
	    CALL_LEASE : CALL_REQUEST) : call->stat != NULL ? CALL_STATS :
	    CALL_PROBE;
	call->q_redirects = 0;
	call->q_trial = false;
	call->all_allowed = false;
	call->err[0] = '\0';
	call->q_start_us = util_monotonic_us();
	/* The store owns its timeout: from the request's arrival. */
	own = (call->start_us > 0 ? call->start_us : call->q_start_us) +
	    rb->timeout_us;
	if (call->deadline_us == 0 || call->deadline_us > own)
		call->deadline_us = own;
	/* Cluster: a breaker per primary, in the I/O thread (node_down). */
	if (call->n > 0 && rb->mode != REDIS_CLUSTER &&
	    redis_circuit_enter(rb, &call->q_trial) == -1) {
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
		if (call->n > 0 && rb->mode != REDIS_CLUSTER)
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
	struct redis_sentinels *ss;
	uint64_t one = 1;
	size_t i, j;

	if (rb == NULL)
		return;
	ss = &rb->sentinels;
	if (rb->thread_started) {
		pthread_mutex_lock(&rb->qmu);
		rb->stopping = true;
		pthread_mutex_unlock(&rb->qmu);
		(void)!write(rb->evfd, &one, sizeof(one));
		pthread_join(rb->thread, NULL);
	}
	for (i = 0; i < rb->nnodes; i++) {
		for (j = 0; j < rb->nodes[i]->nconns; j++)
			redis_conn_free(rb->nodes[i]->conns[j].conn,
			    "shutting down");
		rl_free(rb->nodes[i]->conns);
		rl_free(rb->nodes[i]);
	}
	rl_free(rb->nodes);
	if (ss->sub.conn != NULL) {
		redis_conn_set_push(ss->sub.conn, NULL, NULL);
		redis_conn_free(ss->sub.conn, "shutting down");
	}
	if (rb->rel.conn != NULL) {
		redis_conn_set_push(rb->rel.conn, NULL, NULL);
		redis_conn_free(rb->rel.conn, "shutting down");
	}
	rl_free(rb->rel_channel);
	for (i = 0; ss->q != NULL && i < ss->n; i++)
		redis_conn_free(ss->q[i].conn, "shutting down");
	for (i = 0; ss->urls != NULL && i < ss->n; i++)
		rl_free(ss->urls[i].host);
	if (ss->urls != NULL)
		rl_free(ss->urls[0].password);	/* shared by all */
	rl_free(ss->urls);
	rl_free(ss->cfgs);
	rl_free(ss->q);
	rl_free(ss->master);
	slot_map_release(&rb->map);
	if (rb->epfd >= 0)
		close(rb->epfd);
	if (rb->evfd >= 0)
		close(rb->evfd);
	pthread_mutex_destroy(&rb->mu);
	pthread_mutex_destroy(&rb->qmu);
	rl_free(rb->shown_url);
	redis_url_free(&rb->url);
	rl_free(rb);
}

static const struct backend_ops redis_ops = {
	.submit = redis_submit,
	.free = redis_free,
};

/* "host:port" (the port after the last ':') into host and *port. */
static int
split_hostport(const char *s, char *host, size_t hostlen, int *port)
{
	const char *colon = strrchr(s, ':');
	char *end;
	long p;

	if (colon == NULL || colon == s ||
	    (size_t)(colon - s) >= hostlen)
		return -1;
	p = strtol(colon + 1, &end, 10);
	if (*end != '\0' || p < 1 || p > 65535)
		return -1;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	if (host[0] == '[' && colon - s > 2 && host[colon - s - 1] == ']') {
		memmove(host, host + 1, (size_t)(colon - s) - 2);
		host[colon - s - 2] = '\0';
	}
	*port = (int)p;
	return 0;
}

/* The seeds of redis.cluster, as the slot map's first nodes. */
static int
cluster_init(struct redis_backend *rb, const struct redis_config *rc,
    char *err, size_t errlen)
{
	char host[SLOT_MAP_HOST_MAX];
	int port;
	size_t i;

	rb->mode = REDIS_CLUSTER;
	slot_map_init(&rb->map);
	for (i = 0; i < rc->ncluster; i++) {
		if (split_hostport(rc->cluster[i], host, sizeof(host),
		    &port) == -1) {
			snprintf(err, errlen, "redis.cluster: bad node "
			    "\"%.64s\"", rc->cluster[i]);
			return -1;
		}
		if (slot_map_node(&rb->map, host, port, err, errlen) < 0)
			return -1;
	}
	if (nodes_sync(rb) == -1) {
		snprintf(err, errlen, "redis: out of memory");
		return -1;
	}
	rb->refresh_wanted = true;
	return 0;
}

/* The sentinels of redis.sentinel, and node 0 waiting for a primary. */
static int
sentinel_init(struct redis_backend *rb, const struct redis_config *rc,
    char *err, size_t errlen)
{
	const struct sentinel_config *sc = &rc->sentinel;
	struct redis_sentinels *ss = &rb->sentinels;
	char host[SLOT_MAP_HOST_MAX], *password = NULL;
	size_t i;
	int port;

	rb->mode = REDIS_SENTINEL;
	if (sc->password_file != NULL && redis_read_password_file(
	    sc->password_file, &password, err, errlen) == -1)
		return -1;
	if ((ss->master = rl_strdup(sc->master)) == NULL ||
	    (ss->urls = rl_calloc(sc->nnodes, sizeof(*ss->urls))) == NULL ||
	    (ss->cfgs = rl_calloc(sc->nnodes, sizeof(*ss->cfgs))) == NULL ||
	    (ss->q = rl_calloc(sc->nnodes, sizeof(*ss->q))) == NULL) {
		rl_free(password);
		goto oom;
	}
	if (sc->nnodes > 0)
		ss->urls[0].password = password;
	for (i = 0; i < sc->nnodes; i++) {
		if (split_hostport(sc->nodes[i], host, sizeof(host),
		    &port) == -1) {
			snprintf(err, errlen, "redis.sentinel.nodes: bad node "
			    "\"%.64s\"", sc->nodes[i]);
			return -1;
		}
		if ((ss->urls[i].host = rl_strdup(host)) == NULL)
			goto oom;
		ss->urls[i].port = port;
		ss->urls[i].password = password;
		ss->cfgs[i].url = &ss->urls[i];
		ss->cfgs[i].connect_timeout_us = rb->timeout_us;
		ss->q[i].reg_fd = -1;
		if ((ss->q[i].conn = redis_conn_new(&ss->cfgs[i])) == NULL)
			goto oom;
		ss->n++;
	}
	ss->sub.reg_fd = -1;
	ss->ask_wanted = ss->sub_wanted = true;
	if (node_add(rb, "", 0) == -1)
		goto oom;
	return 0;
oom:
	snprintf(err, errlen, "redis: out of memory");
	return -1;
}

struct backend *
backend_redis_new(const struct redis_config *rc, char *err, size_t errlen)
{
	struct redis_backend *rb;
	struct epoll_event ev;
	size_t i, shown_len;
	const char *url = rc->url != NULL ? rc->url : "redis://127.0.0.1:6379";

	if ((rc->url == NULL && rc->ncluster == 0 &&
	    rc->sentinel.master == NULL) || rc->pool_size < 1 ||
	    rc->timeout_ms < 1 || rc->pool_size > 0xffff) {
		snprintf(err, errlen, "redis: need a url, cluster or "
		    "sentinel, pool_size >= 1 and timeout >= 1ms");
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
	rb->pool_size = (size_t)rc->pool_size;
	rb->circuit = REDIS_CIRCUIT_CLOSED;
	rb->backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
	rb->epfd = rb->evfd = -1;
	rb->rel.reg_fd = -1;
	slot_map_init(&rb->map);
	pthread_mutex_init(&rb->mu, NULL);
	pthread_mutex_init(&rb->qmu, NULL);
	for (i = 0; i < REDIS_NKINDS; i++) {
		atomic_init(&rb->last_log_us[i], INT64_MIN);
		atomic_init(&rb->suppressed[i], 0);
	}
	if (redis_url_parse(url, &rb->url, err, errlen) == -1)
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
	if ((rb->rel_channel = rl_malloc(strlen(rc->key_prefix != NULL ?
	    rc->key_prefix : "") + 9)) == NULL)
		goto oom;
	snprintf(rb->rel_channel, strlen(rc->key_prefix != NULL ?
	    rc->key_prefix : "") + 9, "%sreleased", rc->key_prefix != NULL ?
	    rc->key_prefix : "");
	if (rc->ncluster > 0)
		url = rc->cluster[0];
	else if (rc->sentinel.master != NULL)
		url = rc->sentinel.master;
	shown_len = redis_url_redact(url, NULL, 0) + 1;
	if ((rb->shown_url = rl_malloc(shown_len)) == NULL)
		goto oom;
	(void)redis_url_redact(url, rb->shown_url, shown_len);

	if (rc->ncluster > 0) {
		if (cluster_init(rb, rc, err, errlen) == -1)
			goto fail;
	} else if (rc->sentinel.master != NULL) {
		if (sentinel_init(rb, rc, err, errlen) == -1)
			goto fail;
	} else {
		rb->mode = REDIS_SINGLE;
		if (node_add(rb, rb->url.host != NULL ? rb->url.host : "",
		    rb->url.port) == -1)
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
	/* Ask for the topology at once, before the first request. */
	(void)!write(rb->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
	return &rb->base;

oom:
	snprintf(err, errlen, "redis: out of memory");
fail:
	redis_free(&rb->base);
	return NULL;
}

void
backend_redis_watch_releases(struct backend *b, backend_released_fn fn,
    void *arg)
{
	struct redis_backend *rb = (struct redis_backend *)b;

	pthread_mutex_lock(&rb->qmu);
	rb->rel_fn = fn;
	rb->rel_arg = arg;
	pthread_mutex_unlock(&rb->qmu);
	(void)!write(rb->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
}

void
backend_redis_set_metrics(struct backend *b, struct metrics *m)
{
	atomic_store(&((struct redis_backend *)b)->metrics, m);
}
