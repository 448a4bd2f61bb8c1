/*
 * redis_reply.c - what the reply to a batch means: the results of its
 * calls, or an error that sends it again (NOSCRIPT, ASK), parks it (MOVED,
 * TRYAGAIN, READONLY) or fails it.
 *
 * Thread: the store's I/O thread.
 */
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "store/redis_priv.h"
#include "store/redis_script.h"


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

/* The reply to a batch, or NULL with err when its connection closed. */
void
redis_reply_batch(void *arg, redisReply *r, const char *err)
{
	struct redis_batch *b = arg;
	struct redis_backend *rb = b->rb;
	struct redis_slot *s = b->slot;
	char msg[BACKEND_ERR_MAX];
	size_t i;

	if (r == NULL) {
		/* Closed because Redis stopped answering: a timeout. */
		snprintf(msg, sizeof(msg), "connection lost: %s", err);
		redis_flight_fail(b, strncmp(err, REDIS_HUNG, strlen(REDIS_HUNG)) == 0 ||
		    strcmp(err, "connect: timed out") == 0 ?
		    BACKEND_ERR_TIMEOUT : BACKEND_ERR_CONNECT, msg);
		redis_node_want_topology(rb);
		if (s != NULL)
			redis_circuit_node_failed(rb, s->node);
		goto out;
	}
	if (s != NULL)
		redis_circuit_node_answered(rb, s->node);
	if (b->live == 0)
		goto out;		/* every call timed out already */
	if (b->kind == REDIS_CALL_PROBE) {
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
				redis_flight_finish(rb, b->calls[i], ok ? 0 : -1,
				    BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	if (r->type == REDIS_REPLY_ERROR) {
		switch (redis_cluster_redirect(b, r, msg, sizeof(msg))) {
		case 1:
			if (s != NULL)
				redis_slot_busy(rb, s);
			return;			/* sent again (ASK) */
		case 0:
			goto out;		/* parked (MOVED) */
		}
		if (is_error(r, "TRYAGAIN") || is_error(r, "CLUSTERDOWN") ||
		    is_error(r, "LOADING") || is_error(r, "MASTERDOWN")) {
			/* Nothing ran: again a little later. */
			if (!is_error(r, "TRYAGAIN"))
				redis_node_want_topology(rb);
			redis_flight_park(b, util_monotonic_us() + REDIS_RETRY_US,
			    false);
			goto out;
		}
		if (is_error(r, "READONLY") && rb->mode != REDIS_SINGLE) {
			/* A replica now: the script stopped at its first
			 * write, so nothing was recorded.  Again once the
			 * new primary is known. */
			redis_node_want_topology(rb);
			redis_flight_park(b, 0, false);
			goto out;
		}
	}
	if (b->kind == REDIS_CALL_STATS && is_error(r, "NOSCRIPT") && !b->resent) {
		/* Not loaded on this node yet: once more, loading it. */
		if (redis_batch_reload(rb, b, s, msg, sizeof(msg)) == 0) {
			redis_slot_busy(rb, s);
			return;
		}
		redis_flight_fail(b, BACKEND_ERR_CONNECT, msg);
		goto out;
	}
	if (b->kind == REDIS_CALL_STATS) {
		struct backend_call *call = b->calls[0];

		if (call != NULL) {
			int rc = redis_stats_decode(r, call->stat,
			    call->stat_out, msg, sizeof(msg));

			redis_flight_finish(rb, call, rc, BACKEND_ERR_PROTOCOL, msg);
		}
		goto out;
	}
	if (b->kind == REDIS_CALL_LEASE) {
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
			redis_flight_finish(rb, c, ok ? 0 : -1, BACKEND_ERR_PROTOCOL,
			    msg);
		}
		goto out;
	}
	if (b->kind == REDIS_CALL_TAKEBACK) {
		bool ok = r->type == REDIS_REPLY_INTEGER;

		snprintf(msg, sizeof(msg), "take-back: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		for (i = 0; i < b->ncalls; i++)
			if (b->calls[i] != NULL)
				redis_flight_finish(rb, b->calls[i], ok ? 0 : -1,
				    BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	if (is_error(r, "NOSCRIPT") && !b->resent) {
		/* The script did not run: load it and send the calls still
		 * waiting once more. */
		if (redis_batch_reload(rb, b, s, msg, sizeof(msg)) == 0) {
			redis_slot_busy(rb, s);
			return;
		}
		redis_flight_fail(b, BACKEND_ERR_CONNECT, msg);
		goto out;
	}
	if (is_error(r, "NOAUTH") || is_error(r, "WRONGPASS")) {
		/* The server changed under us: authenticate anew. */
		snprintf(msg, sizeof(msg), "script: %s", r->str);
		redis_flight_fail(b, BACKEND_ERR_CONNECT, msg);
		redis_conn_close(s->conn, msg);
		goto out;
	}
	if (redis_script_decode(r, b->calls, b->counts, b->ncalls,
	    rb->mode == REDIS_CLUSTER, msg, sizeof(msg)) == -1) {
		redis_flight_fail(b, BACKEND_ERR_PROTOCOL, msg);
		goto out;
	}
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			redis_flight_finish(rb, b->calls[i], 0, BACKEND_ERR_NONE, "");
out:
	if (s != NULL)
		redis_slot_busy(rb, s);
	redis_batch_free(b);
}
