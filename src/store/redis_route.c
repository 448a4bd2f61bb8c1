/*
 * redis_route.c - the calls of one turn of the loop into batches: each
 * call goes to the batch of its kind and slot (up to REDIS_BATCH_CALLS
 * requests in one EVALSHA), which leaves when full or at the end of the
 * turn; take-backs, stats and leases go alone, and so does a request
 * whose batch met TRYAGAIN (redis_flight_tryagain()).  A call with no node
 * known now is parked (redis_flight.c).
 *
 * Thread: the store's I/O thread.
 */
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "store/redis_priv.h"
#include "store/redis_script.h"
#include "store/redis_tls.h"

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
	int rc = redis_batch_send(rb, b, err, sizeof(err));

	t->open[i] = t->open[--t->nopen];
	t->keys[i] = t->keys[t->nopen];
	if (rc == 1) {
		redis_node_want_topology(rb);
		redis_flight_park(b, 0, false);
		redis_batch_free(b);
	} else if (rc == -1) {
		/* Nothing was sent: under Sentinel the calls wait for the
		 * primary; else they fail, still waiting to reconnect after
		 * a TLS failure counted as what it is (redis_tls.h). */
		if (!redis_flight_requeue(b, b->slot, err))
			redis_flight_fail(b,
			    strstr(err, "(reconnecting: " REDIS_TLS_PREFIX) !=
				    NULL ?
				BACKEND_ERR_TLS :
				BACKEND_ERR_CONNECT,
			    err);
		redis_batch_free(b);
	}
}

/* Into a batch of this turn, or parked. */
void
redis_route_call(struct redis_backend *rb, struct redis_turn *t,
    struct backend_call *call)
{
	struct redis_call_priv *q = redis_call(call);
	unsigned slots[REDIS_BATCH_KEYS];
	struct redis_batch *b = NULL;
	int hslot = -1, n;
	size_t i, k;

	q->batch = NULL;
	redis_flight_add(rb, call);
	if (rb->closing) {
		redis_flight_finish(rb, call, -1, BACKEND_ERR_CONNECT,
		    "shutting down");
		return;
	}
	if (call->deadline_us <= util_monotonic_us()) {
		redis_flight_expire(rb, call,
		    "no answer within the timeout (never sent: Redis was "
		    "busy)");
		return;
	}
	if (rb->mode == REDIS_CLUSTER && q->kind == REDIS_CALL_PROBE)
		hslot = 0;
	else if (rb->mode == REDIS_CLUSTER && q->kind == REDIS_CALL_STATS)
		hslot = (int)slot_map_keyslot(call->stat->key,
		    call->stat->keylen);
	else if (rb->mode == REDIS_CLUSTER && q->kind == REDIS_CALL_ADMIN)
		hslot = (int)slot_map_keyslot(call->admin->key,
		    call->admin->keylen);
	else if (rb->mode == REDIS_CLUSTER) {
		bool one = true;

		if (call->n > REDIS_BATCH_KEYS) {
			redis_flight_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
			    "too many rules for one request");
			return;
		}
		for (i = 0; i < call->n; i++) {
			slots[i] = slot_map_keyslot(call->checks[i].key,
			    call->checks[i].keylen);
			one = one && slots[i] == slots[0];
		}
		if (!one && q->kind == REDIS_CALL_REQUEST) {
			redis_cluster_split(rb, t, call, slots);
			return;
		}
		hslot = (int)slots[0];
	}
	if ((n = redis_node_for(rb, hslot)) < 0) {
		redis_node_want_topology(rb);
		q->parked = REDIS_PARK_NO_PRIMARY;
		q->at = 0;
		return; /* parked */
	}
	q->at = (unsigned short)(n + 1);
	/* Readiness under Cluster is every primary's: the probe's PING goes
	 * to slot 0's, the others get one each (redis_cluster.c). */
	if (rb->mode == REDIS_CLUSTER && q->kind == REDIS_CALL_PROBE)
		redis_cluster_ping_primaries(rb, n);
	if (redis_circuit_node_is_down(rb->nodes[n], util_monotonic_us())) {
		redis_flight_finish(rb, call, -1, BACKEND_ERR_CIRCUIT_OPEN,
		    "the primary of this key is down");
		return;
	}
	/* A batch of the same kind and slot with room, but a take-back
	 * always alone, and a request that met TRYAGAIN in a batch of
	 * several (redis_flight_tryagain()). */
	for (k = 0; q->kind != REDIS_CALL_TAKEBACK &&
	     q->kind != REDIS_CALL_STATS && q->kind != REDIS_CALL_LEASE &&
	     q->kind != REDIS_CALL_ADMIN && !q->alone && k < t->nopen;
	     k++) {
		struct redis_batch *o = t->open[k];

		if (o->kind != q->kind || o->hslot != hslot)
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
		if ((b = redis_batch_new(rb, q->kind, hslot)) == NULL) {
			redis_flight_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
			    "out of memory");
			return;
		}
		k = t->nopen++;
		t->open[k] = b;
		t->keys[k] = 0;
	}
	b->calls[b->ncalls] = call;
	b->counts[b->ncalls++] = call->n;
	b->live++;
	q->batch = b;
	t->keys[k] += call->n;
	if (q->kind == REDIS_CALL_TAKEBACK || q->kind == REDIS_CALL_STATS ||
	    q->kind == REDIS_CALL_LEASE || q->kind == REDIS_CALL_ADMIN ||
	    q->alone)
		turn_send(rb, t, k);
}

/* Route a list of calls (linked by redis_call()->next), then send every
 * batch. */
void
redis_route_dispatch(struct redis_backend *rb, struct backend_call *list)
{
	struct redis_turn t;
	struct backend_call *call, *next;

	t.nopen = 0;
	for (call = list; call != NULL; call = next) {
		next = redis_call(call)->next;
		redis_route_call(rb, &t, call);
	}
	while (t.nopen > 0)
		turn_send(rb, &t, t.nopen - 1);
}
