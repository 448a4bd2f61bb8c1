/*
 * redis_circuit.c - how the Redis store takes failures: the circuit
 * breaker of the whole store, the per-primary breaker of Redis Cluster,
 * and the failure log.
 *
 * A Redis that fails must not slow the daemon down.  After
 * REDIS_CB_THRESHOLD consecutive failed calls the circuit opens: calls
 * fail at once inside submit (backend_redis.c), without queueing.  After a
 * backoff (100 ms, doubling on every failed trial up to 5 s) it half-opens:
 * exactly one call goes through as a trial.  Success anywhere closes it.
 * Under Cluster each primary has its own breaker as well (the others keep
 * deciding while one is down), driven by its lost connections; the store's
 * circuit then counts only the failures of calls while no primary is known
 * (no seed has answered with a slot map), so that a cluster that cannot be
 * reached costs nothing per request either.
 *
 * Thread: the whole-store breaker and the log run on any thread (mu,
 * atomics); the per-node breaker on the I/O thread.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "store/redis_priv.h"

/* Log msg at most once a second per kind.  Any thread, lock-free. */
void
redis_log_failure(struct redis_backend *rb, enum backend_error_kind kind,
    const char *msg)
{
	redis_log_node_failure(rb, NULL, kind, msg);
}

/* The same, naming node (host:port, [v6]:port) when one is given and its
 * host is known, else the store. */
void
redis_log_node_failure(struct redis_backend *rb, const struct redis_node *node,
    enum backend_error_kind kind, const char *msg)
{
	int64_t now = util_monotonic_us();
	int64_t last = atomic_load(&rb->last_log_us[kind]);
	char host[SLOT_MAP_HOST_MAX + 16];
	const char *who = rb->shown_url;
	long held;

	if ((last != INT64_MIN && now - last < REDIS_LOG_INTERVAL_US) ||
	    !atomic_compare_exchange_strong(&rb->last_log_us[kind], &last,
		now)) {
		atomic_fetch_add(&rb->suppressed[kind], 1);
		return;
	}
	if (node != NULL && node->host[0] != '\0') {
		snprintf(host, sizeof(host),
		    strchr(node->host, ':') != NULL ? "[%s]:%d" : "%s:%d",
		    node->host, node->url.port);
		who = host;
	}
	held = atomic_exchange(&rb->suppressed[kind], 0);
	if (held > 0)
		log_warnx(
		    "redis %s: %s (kind=%s; %ld similar lines "
		    "suppressed)",
		    who, msg, backend_error_kind_name(kind), held);
	else
		log_warnx("redis %s: %s (kind=%s)", who, msg,
		    backend_error_kind_name(kind));
}

/* ---- the circuit of the whole store ------------------------------------ */

/* May this call go to Redis?  Sets *trial when it is the half-open trial.
 * Returns 0, or -1 when the circuit is open. */
int
redis_circuit_enter(struct redis_backend *rb, bool *trial)
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

static void
redis_circuit_open(struct redis_backend *rb)
{
	rb->circuit = REDIS_CIRCUIT_OPEN;
	rb->open_until_us = util_monotonic_us() + rb->backoff_ms * 1000;
}

/* The topology changed (a new slot map, a new primary): an open circuit
 * tries again at once, with the shortest backoff.  Returns whether the
 * circuit was open. */
bool
redis_circuit_kick(struct redis_backend *rb)
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
void
redis_circuit_leave(struct redis_backend *rb, bool trial,
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
	} else if (outcome == REDIS_OUTCOME_GAVE_UP) {
		/* The trial went to Redis and its caller stopped waiting:
		 * no verdict, but the next trial waits the backoff again, or
		 * callers with short deadlines would send one after another
		 * to a Redis that does not answer. */
		if (trial && rb->circuit == REDIS_CIRCUIT_HALF_OPEN)
			redis_circuit_open(rb);
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
		log_warnx(
		    "redis %s: circuit open after %d consecutive "
		    "failures; next try in %" PRId64 " ms",
		    rb->shown_url, REDIS_CB_THRESHOLD, backoff);
	if (closed)
		log_info("redis %s: circuit closed, Redis answers again",
		    rb->shown_url);
}

/* What a call's end tells the circuit (redis_priv.h). */
enum redis_outcome
redis_circuit_outcome(const struct redis_backend *rb, int rc,
    enum backend_error_kind kind)
{
	if (rc == 0)
		return REDIS_OUTCOME_OK;
	if (kind == BACKEND_ERR_DEADLINE)
		return REDIS_OUTCOME_GAVE_UP;
	if (rb->mode != REDIS_CLUSTER)
		return REDIS_OUTCOME_FAIL;
	/* Under Cluster a primary that fails is its own breaker's business,
	 * and the others go on deciding: the store's circuit counts a
	 * failure only while no primary is known at all (no seed has given
	 * a slot map).  Counting the failures of calls sent to a dead
	 * primary would open it for every slot whenever the other primaries
	 * happen to be quiet. */
	return rb->nprimaries == 0 ? REDIS_OUTCOME_FAIL : REDIS_OUTCOME_NEUTRAL;
}

/* ---- Cluster: the breaker of one primary ------------------------------- */

/* Cluster: a connection to node was lost, or it answered. */
void
redis_circuit_node_failed(struct redis_backend *rb, struct redis_node *node)
{
	if (rb->mode != REDIS_CLUSTER ||
	    ++node->failures < REDIS_NODE_THRESHOLD)
		return;
	node->backoff_us = node->backoff_us == 0 ?
	    REDIS_CB_BACKOFF_MIN_MS * 1000 :
	    node->backoff_us * 2;
	if (node->backoff_us > REDIS_CB_BACKOFF_MAX_MS * 1000)
		node->backoff_us = REDIS_CB_BACKOFF_MAX_MS * 1000;
	if (node->down_until_us == 0)
		log_warnx(
		    "redis cluster: %.64s:%d is down; its slots fail at "
		    "once until it or its replica answers",
		    node->host, node->url.port);
	node->down_until_us = util_monotonic_us() + node->backoff_us;
}

void
redis_circuit_node_answered(struct redis_backend *rb, struct redis_node *node)
{
	if (node->down_until_us != 0)
		log_info("redis cluster: %.64s:%d answers again", node->host,
		    node->url.port);
	node->failures = 0;
	node->down_until_us = 0;
	node->backoff_us = 0;
	(void)rb;
}

/* A node the new slot map gives no slot (a failed primary replaced by its
 * replica, a node removed): nothing is sent to it any more, so nothing
 * would ever close its breaker, and the topology would be watched for
 * ever.  Should it own slots again, it starts afresh. */
void
redis_circuit_node_forget(struct redis_node *node)
{
	node->failures = 0;
	node->down_until_us = 0;
	node->backoff_us = 0;
}

/* Whether a call for node fails at once: it is down, and its backoff has
 * not passed (then calls try it again). */
bool
redis_circuit_node_is_down(const struct redis_node *node, int64_t now)
{
	return node->down_until_us != 0 && now < node->down_until_us;
}

/* Whether some primary is marked down (the topology is then watched, for
 * its replica's promotion).  A node that owns no slot is not waited for. */
bool
redis_circuit_any_node_down(const struct redis_backend *rb)
{
	size_t i;

	for (i = 0; i < rb->nnodes; i++)
		if (rb->nodes[i]->primary && rb->nodes[i]->down_until_us != 0)
			return true;
	return false;
}
