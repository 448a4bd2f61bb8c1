/*
 * redis_batch.c - a batch of calls into the command that carries it: one
 * EVALSHA of lua/ratelimit.lua for requests (redis_script.c encodes), EVAL
 * of lua/takeback.lua, EVALSHA of lua/stats.lua, EVAL of lua/lease.lua,
 * or PING for a probe; after ASKING when a Cluster ASK sent it there.
 *
 * Thread: the store's I/O thread.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "store/redis_priv.h"
#include "store/redis_script.h"

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
		s = redis_conn_send(conn, (int)argc, argv, lens,
		    redis_reply_batch, b, err, errlen) == 0 ? b->slot : NULL;
	else
		s = redis_node_send(rb, node, (int)argc, argv, lens,
		    redis_reply_batch, b, err, errlen);
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
		if (redis_conn_send(conn, a.argc, a.argv, a.lens,
		    redis_reply_batch, b, err, errlen) == 0)
			s = b->slot;
	} else
		s = redis_node_send(rb, node, a.argc, a.argv, a.lens,
		    redis_reply_batch, b, err, errlen);
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
		return redis_conn_send(conn, 9, argv, lens, redis_reply_batch,
		    b, err, errlen) == 0 ? b->slot : NULL;
	return redis_node_send(rb, node, 9, argv, lens, redis_reply_batch, b,
	    err, errlen);
}

/*
 * Send b to its node.  0; -1 with err (nothing sent; b intact); or 1 when
 * no node is known for it now (nothing sent; the caller parks it).
 */
int
redis_batch_send(struct redis_backend *rb, struct redis_batch *b, char *err,
    size_t errlen)
{
	struct redis_script_args a;
	struct redis_node *node;
	struct redis_slot *s;
	int n;

	n = b->ask_node >= 0 ? b->ask_node : redis_node_for(rb, b->hslot);
	if (n < 0 || (size_t)n >= rb->nnodes)
		return 1;
	node = rb->nodes[n];
	if (b->ask_node >= 0) {
		const char *argv[1] = { "ASKING" };
		size_t lens[1] = { 6 };

		if ((s = redis_node_send(rb, node, 1, argv, lens,
		    redis_reply_ignore, NULL, err, errlen)) == NULL)
			return -1;
		/* The call must follow on the same connection, each kind
		 * with its own script. */
		if (b->kind == REDIS_CALL_STATS ||
		    b->kind == REDIS_CALL_LEASE ||
		    b->kind == REDIS_CALL_TAKEBACK) {
			b->slot = s;
			if ((b->kind == REDIS_CALL_STATS ? stats_send(rb, node,
			    s->conn, b, err, errlen) :
			    b->kind == REDIS_CALL_LEASE ? lease_send(rb, node,
			    s->conn, b, err, errlen) : takeback_send(rb, node,
			    s->conn, b, err, errlen)) == NULL)
				s = NULL;
		} else {
			if (redis_script_encode(b->calls, b->ncalls,
			    rl_lua_ratelimit_sha, true, &a) == -1) {
				snprintf(err, errlen, "out of memory");
				return -1;
			}
			if (redis_conn_send(s->conn, a.argc, a.argv, a.lens,
			    redis_reply_batch, b, err, errlen) == -1)
				s = NULL;
			redis_script_args_free(&a);
		}
	} else if (b->kind == REDIS_CALL_PROBE) {
		const char *argv[1] = { "PING" };
		size_t lens[1] = { 4 };

		s = redis_node_send(rb, node, 1, argv, lens,
		    redis_reply_batch, b, err, errlen);
	} else if (b->kind == REDIS_CALL_TAKEBACK) {
		s = takeback_send(rb, node, NULL, b, err, errlen);
	} else if (b->kind == REDIS_CALL_STATS) {
		s = stats_send(rb, node, NULL, b, err, errlen);
	} else if (b->kind == REDIS_CALL_LEASE) {
		s = lease_send(rb, node, NULL, b, err, errlen);
	} else {
		if (redis_script_encode(b->calls, b->ncalls,
		    rl_lua_ratelimit_sha, rb->mode == REDIS_CLUSTER, &a) ==
		    -1) {
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		s = redis_node_send(rb, node, a.argc, a.argv, a.lens,
		    redis_reply_batch, b, err, errlen);
		redis_script_args_free(&a);
	}
	if (s == NULL)
		return -1;
	if (!b->counted && b->kind == REDIS_CALL_REQUEST) {
		rb->batches_out++;
		b->counted = true;
	}
	b->slot = s;
	redis_slot_busy(rb, s);
	return 0;
}

/* b met NOSCRIPT on s, so its script did not run: send it once more, so
 * that the script loads.  A stat call goes as EVAL on the same connection
 * (which caches the script for the next EVALSHA); requests go again, the
 * calls still waiting only, after SCRIPT LOAD on s.  0, or -1 with err. */
int
redis_batch_reload(struct redis_backend *rb, struct redis_batch *b,
    struct redis_slot *s, char *err, size_t errlen)
{
	const char *argv[3] = { "SCRIPT", "LOAD", rl_lua_ratelimit };
	size_t lens[3] = { 6, 4, strlen(rl_lua_ratelimit) };
	int rc;

	b->resent = true;
	if (b->kind == REDIS_CALL_STATS)
		return stats_send(rb, s->node, s->conn, b, err, errlen) !=
		    NULL ? 0 : -1;
	redis_batch_compact(b);
	if (redis_conn_send(s->conn, 3, argv, lens, redis_reply_ignore, NULL,
	    err, errlen) == -1)
		return -1;
	if ((rc = redis_batch_send(rb, b, err, errlen)) == 1)
		snprintf(err, errlen, "no primary known for its keys");
	return rc == 0 ? 0 : -1;
}

/* Drop the answered calls from b, so it can be encoded again. */
void
redis_batch_compact(struct redis_batch *b)
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
void
redis_batch_free(struct redis_batch *b)
{
	if (b->counted)
		b->rb->batches_out--;
	rl_free(b);
}
