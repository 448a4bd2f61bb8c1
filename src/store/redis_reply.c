/*
 * redis_reply.c - what the reply to a batch means: the results of its
 * calls, or an error that sends it again (NOSCRIPT, ASK), parks it (MOVED,
 * TRYAGAIN, READONLY) or fails it.
 *
 * redis_reply_batch() handles what every kind shares (a lost connection,
 * the errors that say the command did not run) and hands the rest to the
 * reply function of the batch's kind: a request's (lua/ratelimit.lua),
 * a probe's (PING), a take-back's, a stat's and a lease's.
 *
 * Thread: the store's I/O thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "store/redis_priv.h"
#include "store/redis_script.h"
#include "store/redis_tls.h"

/* What reply_error() did with the batch. */
enum reply_next {
	REPLY_READ,  /* nothing: the kind's reply reads it */
	REPLY_AGAIN, /* sent again: the batch is in flight */
	REPLY_DONE   /* parked or failed: the batch is done with */
};

/* Replies that matter not (SCRIPT LOAD after NOSCRIPT, ASKING): a
 * failure shows in the command behind. */
void
redis_reply_ignore(void *arg, redisReply *r, const char *err)
{
	(void)arg;
	(void)r;
	(void)err;
}

static bool
is_error(const redisReply *r, const char *prefix)
{
	return r->type == REDIS_REPLY_ERROR &&
	    strncmp(r->str, prefix, strlen(prefix)) == 0;
}

/* Answer every call of b still waiting alike: rc 0 if ok, else -1 with
 * msg. */
static void
finish_all(struct redis_batch *b, bool ok, const char *msg)
{
	size_t i;

	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			redis_flight_finish(b->rb, b->calls[i], ok ? 0 : -1,
			    BACKEND_ERR_PROTOCOL, msg);
}

/* The connection closed before the reply: b's calls fail, as timeouts
 * when Redis stopped answering. */
static void
reply_lost(struct redis_batch *b, const char *err)
{
	struct redis_backend *rb = b->rb;
	char msg[BACKEND_ERR_MAX];
	bool hung = strncmp(err, REDIS_HUNG, strlen(REDIS_HUNG)) == 0 ||
	    strcmp(err, "connect: timed out") == 0;
	bool tls = strncmp(err, REDIS_TLS_PREFIX, strlen(REDIS_TLS_PREFIX)) ==
	    0;

	snprintf(msg, sizeof(msg), "connection lost: %s", err);
	/* Redis kept a decision's command past redis.timeout, but every
	 * call in it had left by its caller's own, earlier deadline
	 * (BACKEND_ERR_DEADLINE, which the circuit does not count): the
	 * hang itself counts once, so that a Redis that stalls still opens
	 * the circuit when every client's deadline is shorter than
	 * redis.timeout.  A call that left at redis.timeout's own deadline
	 * (from its arrival, before the hang check from the send closes
	 * the connection) was counted already: none more then. */
	if (hung && b->live == 0 && b->deadlined == b->ncalls &&
	    (b->kind == REDIS_CALL_REQUEST || b->kind == REDIS_CALL_LEASE))
		redis_circuit_leave(rb, false,
		    redis_circuit_outcome(rb, -1, BACKEND_ERR_TIMEOUT));
	redis_flight_fail(b,
	    tls	     ? BACKEND_ERR_TLS :
		hung ? BACKEND_ERR_TIMEOUT :
		       BACKEND_ERR_CONNECT,
	    msg);
	redis_node_want_topology(rb);
	if (b->slot != NULL)
		redis_circuit_node_failed(rb, b->slot->node);
}

/*
 * The errors that say the command did not run, whatever its kind: a
 * Cluster redirection, a node not ready (TRYAGAIN, CLUSTERDOWN, LOADING,
 * MASTERDOWN), a replica (READONLY), a script not loaded (NOSCRIPT).
 * Nothing ran, so sending again never counts twice.  s is the connection
 * the reply came on.
 */
static enum reply_next
reply_error(struct redis_batch *b, struct redis_slot *s, const redisReply *r)
{
	struct redis_backend *rb = b->rb;
	char msg[BACKEND_ERR_MAX];

	if (r->type != REDIS_REPLY_ERROR)
		return REPLY_READ;
	switch (redis_cluster_redirect(b, r, msg, sizeof(msg))) {
	case 1:
		return REPLY_AGAIN; /* ASK: sent there */
	case 0:
		return REPLY_DONE; /* MOVED: parked */
	}
	if (is_error(r, "TRYAGAIN")) {
		/* A slot being migrated, its keys split between the two
		 * nodes: the requests of a batch go again one by one at
		 * once (each may have all its keys on one side); one alone
		 * again a little later. */
		redis_flight_tryagain(b);
		return REPLY_DONE;
	}
	if (is_error(r, "CLUSTERDOWN") || is_error(r, "LOADING") ||
	    is_error(r, "MASTERDOWN")) {
		/* Again a little later. */
		redis_node_want_topology(rb);
		redis_flight_park_for(b, util_monotonic_us() + REDIS_RETRY_US,
		    false,
		    is_error(r, "CLUSTERDOWN") ? REDIS_PARK_CLUSTERDOWN :
			is_error(r, "LOADING") ? REDIS_PARK_LOADING :
						 REDIS_PARK_MASTERDOWN);
		return REPLY_DONE;
	}
	if (is_error(r, "READONLY") && rb->mode != REDIS_SINGLE) {
		/* A replica now (a connection made while it was the
		 * primary: under Sentinel a new one asks ROLE first,
		 * redis_sentinel.c): the script ran up to its first write,
		 * which a read-only replica refuses and which ends it, so
		 * nothing was recorded.  Again once the new primary is
		 * known. */
		redis_node_want_topology(rb);
		redis_flight_park_for(b, 0, false, REDIS_PARK_READONLY);
		return REPLY_DONE;
	}
	/* Only the kinds sent by EVALSHA meet NOSCRIPT (take-backs and
	 * leases go as EVAL, probes as PING); once more, loading it. */
	if (is_error(r, "NOSCRIPT") && !b->resent &&
	    (b->kind == REDIS_CALL_REQUEST || b->kind == REDIS_CALL_STATS)) {
		if (redis_batch_reload(rb, b, s, msg, sizeof(msg)) == 0)
			return REPLY_AGAIN;
		redis_flight_fail(b, BACKEND_ERR_CONNECT, msg);
		return REPLY_DONE;
	}
	return REPLY_READ;
}

/* PING: PONG, and under Cluster every slot with a primary not marked
 * down (redis_cluster_ready()). */
static void
reply_probe(struct redis_batch *b, const redisReply *r)
{
	struct redis_backend *rb = b->rb;
	char msg[BACKEND_ERR_MAX];
	bool ok = r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;

	snprintf(msg, sizeof(msg), "PING: %s",
	    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	if (ok && rb->mode == REDIS_CLUSTER)
		ok = redis_cluster_ready(rb, msg, sizeof(msg));
	finish_all(b, ok, msg);
}

/* lua/ratelimit.lua: each request's results (redis_script.c decodes). */
static void
reply_request(struct redis_batch *b, struct redis_slot *s, const redisReply *r)
{
	struct redis_backend *rb = b->rb;
	char msg[BACKEND_ERR_MAX];

	if (is_error(r, "NOAUTH") || is_error(r, "WRONGPASS")) {
		/* The server changed under us: authenticate anew. */
		snprintf(msg, sizeof(msg), "script: %s", r->str);
		redis_flight_fail(b, BACKEND_ERR_CONNECT, msg);
		redis_conn_close(s->conn, msg);
		return;
	}
	if (redis_script_decode(r, b->calls, b->counts, b->ncalls,
		rb->mode == REDIS_CLUSTER, msg, sizeof(msg)) == -1) {
		redis_flight_fail(b, BACKEND_ERR_PROTOCOL, msg);
		return;
	}
	finish_all(b, true, "");
}

/* lua/stats.lua: the one stat call's windows (redis_script.c decodes). */
static void
reply_stats(struct redis_batch *b, const redisReply *r)
{
	struct backend_call *call = b->calls[0];
	char msg[BACKEND_ERR_MAX];
	int rc;

	if (call == NULL)
		return;
	rc = redis_stats_decode(r, call->stat, call->stat_out, msg,
	    sizeof(msg));
	redis_flight_finish(b->rb, call, rc, BACKEND_ERR_PROTOCOL, msg);
}

/* lua/lease.lua: whether the lease was held (>= 0), and for a renewal
 * its new lifetime. */
static void
reply_lease(struct redis_batch *b, const redisReply *r)
{
	char msg[BACKEND_ERR_MAX];
	bool ok = r->type == REDIS_REPLY_INTEGER && r->integer >= 0;
	size_t i;

	snprintf(msg, sizeof(msg), "lease: %s",
	    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	for (i = 0; i < b->ncalls; i++) {
		struct backend_call *c = b->calls[i];

		if (c == NULL)
			continue;
		if (ok) {
			memset(&c->out[0], 0, sizeof(c->out[0]));
			c->out[0].allowed = r->integer > 0;
			c->out[0].reset_ms = c->lease_op ==
				BACKEND_LEASE_RENEW ?
			    r->integer :
			    0;
		}
		redis_flight_finish(b->rb, c, ok ? 0 : -1, BACKEND_ERR_PROTOCOL,
		    msg);
	}
}

/* The strings of r (and its nils as "", when nil_ok) into a->reply as
 * length-prefixed strings (backend.h), and finish the call; any other
 * element fails it with msg. */
static void
admin_strings(struct redis_batch *b, struct backend_call *call,
    const redisReply *r, bool nil_ok, const char *msg)
{
	struct backend_admin *a = call->admin;
	size_t i, need = 0;
	uint32_t len;
	char *p;

	for (i = 0; i < r->elements; i++) {
		if (r->element[i]->type != REDIS_REPLY_STRING &&
		    (!nil_ok || r->element[i]->type != REDIS_REPLY_NIL)) {
			redis_flight_finish(b->rb, call, -1,
			    BACKEND_ERR_PROTOCOL, msg);
			return;
		}
		need += sizeof(len) + r->element[i]->len;
	}
	if ((a->reply = rl_malloc(need + 1)) == NULL) {
		redis_flight_finish(b->rb, call, -1, BACKEND_ERR_PROTOCOL,
		    "admin: out of memory");
		return;
	}
	for (i = 0, p = a->reply; i < r->elements; i++) {
		len = (uint32_t)r->element[i]->len;
		memcpy(p, &len, sizeof(len));
		if (len > 0)
			memcpy(p + sizeof(len), r->element[i]->str, len);
		p += sizeof(len) + len;
	}
	a->replylen = need;
	redis_flight_finish(b->rb, call, 0, BACKEND_ERR_PROTOCOL, "");
}

/* docs/admin.md: DEL and override.lua's del, undo and drop answer an
 * integer; override.lua's set what the field held (nil: nothing) and
 * what it wrote; HSCAN the next cursor and a page of fields and values.
 * Strings are copied into admin->reply as length-prefixed strings
 * (backend.h). */
static void
reply_admin(struct redis_batch *b, const redisReply *r)
{
	struct backend_call *call = b->calls[0];
	struct backend_admin *a;
	char msg[BACKEND_ERR_MAX];

	if (call == NULL)
		return;
	a = call->admin;
	snprintf(msg, sizeof(msg), "admin: %s",
	    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	if (a->op == BACKEND_ADMIN_OVERRIDE_SET) {
		if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
		    r->element[1]->type != REDIS_REPLY_STRING) {
			redis_flight_finish(b->rb, call, -1,
			    BACKEND_ERR_PROTOCOL, msg);
			return;
		}
		a->found = r->element[0]->type == REDIS_REPLY_STRING;
		admin_strings(b, call, r, true, msg);
		return;
	}
	if (a->op != BACKEND_ADMIN_OVERRIDE_READ) {
		a->found = r->type == REDIS_REPLY_INTEGER && r->integer > 0;
		redis_flight_finish(b->rb, call,
		    r->type == REDIS_REPLY_INTEGER ? 0 : -1,
		    BACKEND_ERR_PROTOCOL, msg);
		return;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
	    r->element[0]->type != REDIS_REPLY_STRING ||
	    r->element[1]->type != REDIS_REPLY_ARRAY) {
		redis_flight_finish(b->rb, call, -1, BACKEND_ERR_PROTOCOL, msg);
		return;
	}
	a->cursor = strtoull(r->element[0]->str, NULL, 10);
	admin_strings(b, call, r->element[1], false, msg);
}

/* lua/takeback.lua: an integer when it ran. */
static void
reply_takeback(struct redis_batch *b, const redisReply *r)
{
	char msg[BACKEND_ERR_MAX];

	snprintf(msg, sizeof(msg), "take-back: %s",
	    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	finish_all(b, r->type == REDIS_REPLY_INTEGER, msg);
}

void
redis_reply_batch(void *arg, redisReply *r, const char *err)
{
	struct redis_batch *b = arg;
	struct redis_backend *rb = b->rb;
	struct redis_slot *s = b->slot; /* b->slot moves on ASK */

	if (r == NULL) {
		char why[BACKEND_ERR_MAX];

		/* Never written: Redis never saw it, it may go again. */
		snprintf(why, sizeof(why), "connection lost: %s", err);
		if (s == NULL || !redis_conn_unwritten(s->conn) ||
		    !redis_flight_requeue(b, s, why))
			reply_lost(b, err);
		goto out;
	}
	if (s != NULL)
		redis_circuit_node_answered(rb, s->node);
	if (b->live == 0)
		goto out; /* every call timed out already */
	/* A probe reads any reply, errors included. */
	if (b->kind != REDIS_CALL_PROBE) {
		switch (reply_error(b, s, r)) {
		case REPLY_AGAIN:
			if (s != NULL)
				redis_slot_busy(rb, s);
			return;
		case REPLY_DONE:
			goto out;
		case REPLY_READ:
			break;
		}
	}
	switch (b->kind) {
	case REDIS_CALL_PROBE:
		reply_probe(b, r);
		break;
	case REDIS_CALL_STATS:
		reply_stats(b, r);
		break;
	case REDIS_CALL_LEASE:
		reply_lease(b, r);
		break;
	case REDIS_CALL_TAKEBACK:
		reply_takeback(b, r);
		break;
	case REDIS_CALL_ADMIN:
		reply_admin(b, r);
		break;
	default:
		reply_request(b, s, r);
		break;
	}
out:
	if (s != NULL)
		redis_slot_busy(rb, s);
	redis_batch_free(b);
}
