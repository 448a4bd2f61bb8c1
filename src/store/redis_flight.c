/*
 * redis_flight.c - the calls in the Redis I/O thread's hands: the list of
 * calls in flight sorted by deadline (whether sent, parked or about to be
 * sent), parking and unparking, and answering a call (redis_flight_finish),
 * the one place a call leaves the store.
 *
 * A call that cannot be routed now (no slot map yet, a slot without owner,
 * no primary known, TRYAGAIN, CLUSTERDOWN) is parked: it stays in the
 * deadline list without a batch and is routed again when the topology is
 * known (or 50 ms later), or fails at its deadline (redis_loop.c), saying
 * why it waited.  A batch of several requests that meets TRYAGAIN is not
 * parked whole: its requests go again one by one
 * (redis_flight_tryagain()).  Under Sentinel so is a call whose command
 * never reached a socket (a connect that failed or was given up,
 * the primary moved while connecting, a server the sentinels named whose
 * ROLE said replica): Redis never saw it, so it is sent again to the
 * primary the sentinels name next, within its deadline.  A
 * call whose command may have run is never sent again (backend_redis.c).
 *
 * Thread: the store's I/O thread.
 */
#include <stdio.h>

#include "base/util.h"
#include "store/redis_priv.h"

/* Keep the call in the deadline-sorted list (nearly always at the end). */
void
redis_flight_add(struct redis_backend *rb, struct backend_call *call)
{
	struct redis_call_priv *q = redis_call(call);
	struct backend_call *at = rb->ftail;

	while (at != NULL && at->deadline_us > call->deadline_us)
		at = redis_call(at)->prev;
	q->prev = at;
	q->next = at != NULL ? redis_call(at)->next : rb->fhead;
	if (q->next != NULL)
		redis_call(q->next)->prev = call;
	else
		rb->ftail = call;
	if (at != NULL)
		redis_call(at)->next = call;
	else
		rb->fhead = call;
}

void
redis_flight_remove(struct redis_backend *rb, struct backend_call *call)
{
	struct redis_call_priv *q = redis_call(call);

	if (q->prev != NULL)
		redis_call(q->prev)->next = q->next;
	else
		rb->fhead = q->next;
	if (q->next != NULL)
		redis_call(q->next)->prev = q->prev;
	else
		rb->ftail = q->prev;
	q->next = q->prev = NULL;
}

/* Calls to route at the next turn, whatever the window (FIFO). */
void
redis_flight_soon(struct redis_backend *rb, struct backend_call *call)
{
	redis_call(call)->next = NULL;
	redis_call(call)->prev = NULL;
	if (rb->stail != NULL)
		redis_call(rb->stail)->next = call;
	else
		rb->shead = call;
	rb->stail = call;
}

/* Answer call: out of the list and its batch, the circuit told, done.
 * rc 0 means out[] and all_allowed are filled in already. */
void
redis_flight_finish(struct redis_backend *rb, struct backend_call *call, int rc,
    enum backend_error_kind kind, const char *err)
{
	struct redis_call_priv *q = redis_call(call);
	struct redis_batch *b = q->batch;
	const struct redis_node *node = redis_flight_node(rb, call);
	size_t i;

	redis_flight_remove(rb, call);
	if (b != NULL) {
		for (i = 0; i < b->ncalls; i++)
			if (b->calls[i] == call)
				b->calls[i] = NULL;
		b->live--;
		if (rc != 0 && kind == BACKEND_ERR_DEADLINE)
			b->deadlined++;
		q->batch = NULL;
	}
	call->rc = rc;
	call->kind = rc == 0 ? BACKEND_ERR_NONE : kind;
	if (rc != 0) {
		snprintf(call->err, sizeof(call->err), "redis: %s", err);
		if (kind != BACKEND_ERR_DEADLINE)
			redis_log_node_failure(rb, node, kind, err);
	}
	/* A part of a split request counts once, with its request
	 * (redis_cluster.c).  A call whose caller gave up first says nothing
	 * about Redis: any client could open the circuit for all with a tiny
	 * grpc-timeout.  Under Cluster only failures while no primary is
	 * known count (redis_circuit_outcome). */
	if ((q->kind == REDIS_CALL_REQUEST || q->kind == REDIS_CALL_LEASE) &&
	    q->split == NULL)
		redis_circuit_leave(rb, q->trial,
		    redis_circuit_outcome(rb, rc, kind));
	call->done(call);
}

void
redis_flight_expire(struct redis_backend *rb, struct backend_call *call,
    const char *err)
{
	if (redis_call(call)->caller_deadline)
		redis_flight_finish(rb, call, -1, BACKEND_ERR_DEADLINE,
		    "the caller's deadline passed first");
	else
		redis_flight_finish(rb, call, -1, BACKEND_ERR_TIMEOUT, err);
}

/* Fail every call of b that is still waiting. */
void
redis_flight_fail(struct redis_batch *b, enum backend_error_kind kind,
    const char *err)
{
	size_t i;

	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			redis_flight_finish(b->rb, b->calls[i], -1, kind, err);
}

/* The node a call's line is about: Cluster only, where one seed names
 * the whole store but each key has its node.  The node of the connection
 * its batch is on; else the one it was last sent to. */
const struct redis_node *
redis_flight_node(const struct redis_backend *rb,
    const struct backend_call *call)
{
	const struct redis_call_priv *q =
	    (const struct redis_call_priv *)(const void *)call->store.opaque;

	if (rb->mode != REDIS_CLUSTER)
		return NULL;
	if (q->batch != NULL && q->batch->slot != NULL)
		return q->batch->slot->node;
	if (q->at == 0 || q->at > rb->nnodes)
		return NULL;
	return rb->nodes[q->at - 1];
}

void
redis_flight_park(struct redis_batch *b, int64_t unpark_us, bool redirected)
{
	redis_flight_park_for(b, unpark_us, redirected, REDIS_PARK_NO_PRIMARY);
}

/* Take the calls still waiting out of b and park them: they stay in the
 * deadline list and are routed again at unpark time (0: when the
 * topology is next known), or expire there, told why.  A call redirected
 * too often fails. */
void
redis_flight_park_for(struct redis_batch *b, int64_t unpark_us, bool redirected,
    enum redis_park why)
{
	struct redis_backend *rb = b->rb;
	size_t i;

	for (i = 0; i < b->ncalls; i++) {
		struct backend_call *call = b->calls[i];

		if (call == NULL)
			continue;
		if (redirected &&
		    ++redis_call(call)->redirects > REDIS_REDIRECTS_MAX) {
			redis_flight_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
			    "too many cluster redirections");
			continue;
		}
		b->calls[i] = NULL;
		b->live--;
		redis_call(call)->batch = NULL;
		redis_call(call)->parked = (unsigned char)why;
		if (why == REDIS_PARK_NO_PRIMARY)
			redis_call(call)->at = 0; /* no node's doing */
	}
	if (unpark_us != 0 && (rb->unpark_us == 0 || unpark_us < rb->unpark_us))
		rb->unpark_us = unpark_us;
}

/*
 * TRYAGAIN: the slot of b's keys is being migrated and some of them are
 * on the source, some on the target; the script did not run.  A batch of
 * several requests would meet it again for as long as the migration of
 * the slot lasts, though each request's own keys may all be on one side:
 * each goes again alone, at the next turn, and gets its own answer (or
 * ASK, or TRYAGAIN for it alone).  A batch of one is parked, and sent
 * again REDIS_RETRY_US later, alone too: its keys are split.
 */
void
redis_flight_tryagain(struct redis_batch *b)
{
	struct redis_backend *rb = b->rb;
	size_t i;

	/* A request whose keys are split meets ASK (the source lacks one)
	 * and TRYAGAIN (the target lacks another) in turn until the
	 * migration moves them all: only its deadline bounds that, not the
	 * redirection limit, which is for MOVED and ASK that lead nowhere. */
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL) {
			redis_call(b->calls[i])->alone = true;
			redis_call(b->calls[i])->redirects = 0;
		}
	if (b->ncalls < 2) {
		redis_flight_park_for(b, util_monotonic_us() + REDIS_RETRY_US,
		    false, REDIS_PARK_TRYAGAIN);
		return;
	}
	for (i = 0; i < b->ncalls; i++) {
		struct backend_call *call = b->calls[i];

		if (call == NULL)
			continue;
		b->calls[i] = NULL;
		b->live--;
		redis_call(call)->batch = NULL;
		redis_flight_remove(rb, call);
		redis_flight_soon(rb, call);
	}
}

/* Send every parked call again now: to the soon list. */
void
redis_flight_unpark_all(struct redis_backend *rb)
{
	struct backend_call *call, *next;

	rb->unpark_us = 0;
	for (call = rb->fhead; call != NULL; call = next) {
		next = redis_call(call)->next;
		if (redis_call(call)->batch != NULL)
			continue;
		redis_flight_remove(rb, call);
		redis_flight_soon(rb, call);
	}
}

/* b never left: under Sentinel, park its calls for the next primary. */
bool
redis_flight_requeue(struct redis_batch *b, struct redis_slot *s,
    const char *why)
{
	struct redis_backend *rb = b->rb;
	char msg[BACKEND_ERR_MAX];
	const struct redis_conn *c;

	if (rb->mode != REDIS_SENTINEL || rb->closing)
		return false;
	/* A server that refused the handshake (a wrong password, TLS)
	 * will again: fail at once, as what it is.  Asked of the
	 * connection b was on: another's flag may be of an older server
	 * (a handshake timed out on the primary before a failover), kept
	 * until that connection is made again.  Without one, of the
	 * connection whose error the caller reports. */
	c = s != NULL ? s->conn : rb->nodes[0]->conns[0].conn;
	if (redis_conn_refused(c))
		return false;
	if (b->live == 0)
		return true; /* every call has had its answer */
	snprintf(msg, sizeof(msg),
	    "%s; the calls not sent yet wait for the primary the sentinels "
	    "name",
	    why);
	redis_log_failure(rb, BACKEND_ERR_CONNECT, msg);
	redis_flight_park_for(b, 0, false, REDIS_PARK_UNWRITTEN);
	redis_node_want_topology(rb);
	return true;
}
