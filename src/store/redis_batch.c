/*
 * redis_batch.c - a batch of calls into the command that carries it: one
 * EVALSHA of lua/ratelimit.lua for requests (redis_script.c encodes), EVAL
 * of lua/takeback.lua, EVALSHA of lua/stats.lua, EVAL of lua/lease.lua,
 * or PING for a probe; after ASKING when a Cluster ASK sent it there.
 *
 * Thread: the store's I/O thread.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "store/redis_priv.h"
#include "store/redis_script.h"

/* Queue b's command on conn when given (it follows ASKING there), else
 * on a connection of node.  The slot, or NULL with err. */
static struct redis_slot *
command_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, int argc, const char **argv,
    const size_t *lens, char *err, size_t errlen)
{
	if (conn != NULL)
		return redis_conn_send(conn, argc, argv, lens,
			   redis_reply_batch, b, err, errlen) == 0 ?
		    b->slot :
		    NULL;
	return redis_node_send(rb, node, argc, argv, lens, redis_reply_batch, b,
	    err, errlen);
}

/* EVALSHA ratelimit.lua for the requests of b. */
static struct redis_slot *
script_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	struct redis_script_args a;
	struct redis_slot *s;

	if (redis_script_encode(b->calls, b->ncalls, rl_lua_ratelimit_sha,
		rb->mode == REDIS_CLUSTER, &a) == -1) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s = command_send(rb, node, conn, b, a.argc, a.argv, a.lens, err,
	    errlen);
	redis_script_args_free(&a);
	return s;
}

/* PING for the probes of b. */
static struct redis_slot *
ping_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	const char *argv[1] = { "PING" };
	size_t lens[1] = { 4 };

	return command_send(rb, node, conn, b, 1, argv, lens, err, errlen);
}

/* Room for one argument of takeback.lua: a number, or a lease token (32
 * hex digits). */
#define TB_NUM 48

/* EVAL takeback.lua for the one call of b. */
static struct redis_slot *
takeback_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	const struct backend_call *call = b->calls[0];
	size_t argc = 3 + call->n * 6 + 1, i, k;
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
	argv[k++] = rb->rel_channel; /* a lease taken back is a release */
	for (i = 0; i < argc; i++)
		if (lens[i] == 0)
			lens[i] = strlen(argv[i]);
	s = command_send(rb, node, conn, b, (int)argc, argv, lens, err, errlen);
out:
	rl_free(argv);
	rl_free(lens);
	rl_free(nums);
	return s;
}

/* EVALSHA stats.lua (EVAL once it answered NOSCRIPT) for the one stat
 * call of b. */
static struct redis_slot *
stats_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	const struct rl_stat_op *op = b->calls[0]->stat;
	struct redis_stats_args a;
	struct redis_slot *s;

	if (redis_stats_encode(op, b->resent ? rl_lua_stats : NULL,
		rl_lua_stats_sha, &a) < 0) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s = command_send(rb, node, conn, b, a.argc, a.argv, a.lens, err,
	    errlen);
	redis_stats_args_free(&a);
	return s;
}

/* EVAL lease.lua for the one call of b (a release or a renewal). */
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
	argv[8] = rb->rel_channel; /* release: PUBLISH the key there */
	for (i = 0; i < 9; i++)
		lens[i] = strlen(argv[i]);
	lens[3] = c->keylen;
	return command_send(rb, node, conn, b, 9, argv, lens, err, errlen);
}

/* EVAL lua/override.lua with the pairs of b's one call: drop, the field
 * and value pairs a read found expired (no notice: what goes was no
 * override); undo, the field and the one pair of the set it takes back,
 * then the channel of its notice. */
static struct redis_slot *
pairs_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	const struct backend_admin *a = b->calls[0]->admin;
	bool undo = a->op == BACKEND_ADMIN_OVERRIDE_UNDO;
	size_t max = undo ? 1 : BACKEND_OVERRIDE_DROP_MAX;
	const char *argv[7 + 2 * BACKEND_OVERRIDE_DROP_MAX];
	size_t lens[7 + 2 * BACKEND_OVERRIDE_DROP_MAX];
	const char *p = a->pairs, *end = a->pairs + a->pairslen;
	uint32_t n;
	int argc = 0, head;

	argv[argc] = "EVAL";
	lens[argc++] = 4;
	argv[argc] = rl_lua_override;
	lens[argc++] = strlen(rl_lua_override);
	argv[argc] = "1";
	lens[argc++] = 1;
	argv[argc] = a->key;
	lens[argc++] = a->keylen;
	argv[argc] = undo ? "undo" : "drop";
	lens[argc++] = 4;
	if (undo) {
		argv[argc] = a->field;
		lens[argc++] = a->fieldlen;
	}
	head = argc;
	if (a->npairs < 1 || a->npairs > max)
		goto malformed;
	while (p < end && argc < head + 2 * (int)a->npairs) {
		if ((size_t)(end - p) < sizeof(n))
			goto malformed;
		memcpy(&n, p, sizeof(n));
		p += sizeof(n);
		if ((size_t)(end - p) < n)
			goto malformed;
		argv[argc] = p;
		lens[argc++] = n;
		p += n;
	}
	if (p != end || argc != head + 2 * (int)a->npairs)
		goto malformed;
	if (undo) {
		argv[argc] = rb->rel_channel;
		lens[argc++] = strlen(rb->rel_channel);
	}
	return command_send(rb, node, conn, b, argc, argv, lens, err, errlen);
malformed:
	snprintf(err, errlen, "admin: malformed %s",
	    undo ? "set to take back" : "fields to drop");
	return NULL;
}

/* docs/admin.md: DEL for a counter's reset, HSCAN to read a page of a
 * rule's overrides (every field: the daemon skips the expired ones), EVAL
 * lua/override.lua to set or delete one, to take a set back, or to drop
 * those a read found expired (pairs_send()), for the one call of b.
 * Reading is no script call: every daemon reads every rule's overrides
 * every few seconds. */
static struct redis_slot *
admin_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	const struct backend_admin *a = b->calls[0]->admin;
	/* At most EVAL, script, 1, key, set, field, value, ttl, channel. */
	const char *argv[9];
	size_t lens[9];
	char ttl[32], cursor[32], count[16];
	int argc = 0, i;

	if (a->op == BACKEND_ADMIN_OVERRIDE_DROP ||
	    a->op == BACKEND_ADMIN_OVERRIDE_UNDO)
		return pairs_send(rb, node, conn, b, err, errlen);
	if (a->op == BACKEND_ADMIN_RESET) {
		argv[argc++] = "EVAL";
		argv[argc++] = rl_lua_reset;
		argv[argc++] = "1";
		argv[argc++] = a->key;
		argv[argc++] = rb->rel_channel;
	} else if (a->op == BACKEND_ADMIN_OVERRIDE_READ) {
		/* A page each call, under the store's timeout: a whole hash
		 * of 100,000 fields is more than one timeout holds. */
		snprintf(cursor, sizeof(cursor), "%" PRIu64, a->cursor);
		snprintf(count, sizeof(count), "%d", BACKEND_OVERRIDE_PAGE);
		argv[argc++] = "HSCAN";
		argv[argc++] = a->key;
		argv[argc++] = cursor;
		argv[argc++] = "COUNT";
		argv[argc++] = count;
	} else {
		argv[argc++] = "EVAL";
		argv[argc++] = rl_lua_override;
		argv[argc++] = "1";
		argv[argc++] = a->key;
		if (a->op == BACKEND_ADMIN_OVERRIDE_DEL) {
			argv[argc++] = "del";
			argv[argc++] = a->field;
		} else {
			snprintf(ttl, sizeof(ttl), "%" PRId64, a->ttl_ms);
			argv[argc++] = "set";
			argv[argc++] = a->field;
			argv[argc++] = a->value;
			argv[argc++] = ttl;
		}
		argv[argc++] = rb->rel_channel;
	}
	for (i = 0; i < argc; i++)
		lens[i] = argv[i] == a->key ? a->keylen :
		    argv[i] == a->field	    ? a->fieldlen :
					      strlen(argv[i]);
	return command_send(rb, node, conn, b, argc, argv, lens, err, errlen);
}

/* The command of b's kind, on conn when given, else on node. */
static struct redis_slot *
kind_send(struct redis_backend *rb, struct redis_node *node,
    struct redis_conn *conn, struct redis_batch *b, char *err, size_t errlen)
{
	switch (b->kind) {
	case REDIS_CALL_PROBE:
		return ping_send(rb, node, conn, b, err, errlen);
	case REDIS_CALL_TAKEBACK:
		return takeback_send(rb, node, conn, b, err, errlen);
	case REDIS_CALL_STATS:
		return stats_send(rb, node, conn, b, err, errlen);
	case REDIS_CALL_LEASE:
		return lease_send(rb, node, conn, b, err, errlen);
	case REDIS_CALL_ADMIN:
		return admin_send(rb, node, conn, b, err, errlen);
	default:
		return script_send(rb, node, conn, b, err, errlen);
	}
}

static int batch_send_on(struct redis_backend *rb, struct redis_batch *b,
    struct redis_node *node, struct redis_conn *conn, char *err, size_t errlen);

/*
 * Send b to its node.  0; -1 with err (nothing sent; b intact); or 1 when
 * no node is known for it now (nothing sent; the caller parks it).
 */
int
redis_batch_send(struct redis_backend *rb, struct redis_batch *b, char *err,
    size_t errlen)
{
	const char *asking[1] = { "ASKING" };
	size_t asking_len[1] = { 6 };
	struct redis_conn *conn = NULL;
	struct redis_node *node;
	struct redis_slot *s;
	size_t i;
	int n;

	n = b->ask_node >= 0 ? b->ask_node : redis_node_for(rb, b->hslot);
	if (n < 0 || (size_t)n >= rb->nnodes)
		return 1;
	node = rb->nodes[n];
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			redis_call(b->calls[i])->at = (unsigned short)(n + 1);
	if (b->ask_node >= 0) {
		/* The command must follow ASKING on the same connection. */
		if ((s = redis_node_send(rb, node, 1, asking, asking_len,
			 redis_reply_ignore, NULL, err, errlen)) == NULL)
			return -1;
		b->slot = s;
		conn = s->conn;
	}
	return batch_send_on(rb, b, node, conn, err, errlen);
}

/* Send b on conn when given, else on a connection of node, and count it
 * sent.  0, or -1 with err (nothing sent). */
static int
batch_send_on(struct redis_backend *rb, struct redis_batch *b,
    struct redis_node *node, struct redis_conn *conn, char *err, size_t errlen)
{
	struct redis_slot *s;
	int64_t sent;
	size_t i;

	if ((s = kind_send(rb, node, conn, b, err, errlen)) == NULL)
		return -1;
	if (!b->counted && b->kind == REDIS_CALL_REQUEST) {
		rb->batches_out++;
		b->counted = true;
	}
	/* Written at the end of this turn of the loop (one write per
	 * connection): the call's time in the queue ends now. */
	sent = util_monotonic_us();
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL)
			b->calls[i]->sent_us = sent;
	b->slot = s;
	redis_slot_busy(rb, s);
	return 0;
}

/* b met NOSCRIPT on s, so its script did not run: send it once more, so
 * that the script loads.  A stat call goes as EVAL on the same connection
 * (which caches the script for the next EVALSHA); requests go again, the
 * calls still waiting only, after SCRIPT LOAD on s, and on s: on another
 * connection the EVALSHA could run before the SCRIPT LOAD and meet
 * NOSCRIPT again (as it did when several connections met their first
 * NOSCRIPT together: a script over 16 KiB is not loaded by the handshake
 * of a connection with a password, redis_conn.c).  0, or -1 with err. */
int
redis_batch_reload(struct redis_backend *rb, struct redis_batch *b,
    struct redis_slot *s, char *err, size_t errlen)
{
	const char *argv[3] = { "SCRIPT", "LOAD", rl_lua_ratelimit };
	size_t lens[3] = { 6, 4, strlen(rl_lua_ratelimit) };

	b->resent = true;
	if (b->kind != REDIS_CALL_STATS) {
		redis_batch_compact(b);
		if (redis_conn_send(s->conn, 3, argv, lens, redis_reply_ignore,
			NULL, err, errlen) == -1)
			return -1;
	}
	/* Sent there by an ASK: the script call must follow ASKING again
	 * (it holds for the next command only), or the node answers MOVED. */
	if (b->ask_node >= 0 &&
	    redis_conn_send(s->conn, 1, (const char *[]){ "ASKING" },
		(const size_t[]){ 6 }, redis_reply_ignore, NULL, err,
		errlen) == -1)
		return -1;
	if (b->kind == REDIS_CALL_STATS)
		return stats_send(rb, s->node, s->conn, b, err, errlen) !=
			NULL ?
		    0 :
		    -1;
	return batch_send_on(rb, b, s->node, s->conn, err, errlen);
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
	b->deadlined = 0; /* every call left in it is waiting */
}

/* Batches a store keeps for its next ones.  A batch is over 1 KiB, and
 * glibc merges every small block freed since into its bins before each
 * malloc of that size (docs/operations.md): one per script call. */
static const size_t batches_kept = UTIL_KEEP(2 * REDIS_WINDOW);

struct redis_batch *
redis_batch_new(struct redis_backend *rb, int kind, int hslot)
{
	struct redis_batch *b = rb->free_batches;

	if (b != NULL) {
		rb->free_batches = b->next_free;
		rb->nfree_batches--;
		memset(b, 0, offsetof(struct redis_batch, calls));
	} else if ((b = rl_calloc(1, sizeof(*b))) == NULL)
		return NULL;
	b->rb = rb;
	b->kind = kind;
	b->hslot = hslot;
	b->ask_node = -1;
	return b;
}

void
redis_batch_free(struct redis_batch *b)
{
	struct redis_backend *rb = b->rb;

	if (b->counted)
		rb->batches_out--;
	if (rb->nfree_batches >= batches_kept) {
		rl_free(b);
		return;
	}
	b->next_free = rb->free_batches;
	rb->free_batches = b;
	rb->nfree_batches++;
}

void
redis_batch_free_kept(struct redis_backend *rb)
{
	struct redis_batch *b;

	while ((b = rb->free_batches) != NULL) {
		rb->free_batches = b->next_free;
		rl_free(b);
	}
	rb->nfree_batches = 0;
}
