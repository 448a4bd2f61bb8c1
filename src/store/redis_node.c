/*
 * redis_node.c - the servers the Redis store talks to (nodes), their pools
 * of connections, which node a call goes to, and which connection of it
 * takes the next command.
 *
 * A single Redis is node 0; under Sentinel node 0 is the primary the
 * sentinels name (redis_sentinel.c); under Cluster node i is slot_map.c's
 * node i (redis_cluster.c).  Each node has pool_size connections
 * (redis_conn.c); a command goes on the open one with the fewest commands
 * in flight, and a connection that looks hung gets no new ones.
 *
 * Thread: the store's I/O thread (redis_node_add also at start-up, before
 * the thread runs).
 */
#include <stdio.h>
#include <string.h>

#include "base/metrics.h"
#include "base/util.h"
#include "store/redis_priv.h"

void
redis_slot_busy(struct redis_backend *rb, struct redis_slot *s)
{
	bool busy = redis_conn_pending(s->conn) > 0;

	if (busy != s->busy) {
		metrics_pool_in_use(rb->metrics, busy ? 1 : -1);
		s->busy = busy;
	}
}

/* A node at host:port (host "" while unknown) with pool_size closed
 * connections, as rb->nodes[rb->nnodes].  0 or -1 (OOM). */
int
redis_node_add(struct redis_backend *rb, const char *host, int port)
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
	node->url = rb->url; /* credentials, db: borrowed */
	if (!rb->url.is_unix) {
		util_strlcpy(node->host, host, sizeof(node->host));
		node->url.host = node->host;
		node->url.port = port;
	}
	node->ccfg.url = &node->url;
	node->ccfg.script = rl_lua_ratelimit;
	node->ccfg.connect_timeout_us = rb->timeout_us;
	node->ccfg.tls = rb->tls_nodes ? rb->tls : NULL;
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

void
redis_node_close(struct redis_backend *rb, struct redis_node *node,
    const char *why)
{
	size_t i;

	for (i = 0; i < node->nconns; i++) {
		redis_conn_close(node->conns[i].conn, why);
		redis_slot_busy(rb, &node->conns[i]);
	}
}

/* The node for a call of hash slot hslot (-1: not cluster), or -1 when
 * none is known now. */
int
redis_node_for(struct redis_backend *rb, int hslot)
{
	switch (rb->mode) {
	case REDIS_SINGLE:
		return 0;
	case REDIS_SENTINEL:
		return rb->sentinels.known ? 0 : -1;
	case REDIS_CLUSTER:
		return hslot < 0 ? -1 :
				   slot_map_owner(&rb->map, (unsigned)hslot);
	}
	return -1;
}

/* Ask for the topology again (rate-limited by the loop). */
void
redis_node_want_topology(struct redis_backend *rb)
{
	if (rb->mode == REDIS_CLUSTER)
		rb->refresh_wanted = true;
	else if (rb->mode == REDIS_SENTINEL)
		rb->sentinels.ask_wanted = true;
}

/* The connection of node for the next command: the open one with the
 * fewest commands in flight, else one that may connect now, else the
 * likely hung one with the fewest; NULL if none.  A hung one is never
 * closed here to make room: its calls may still be answered in time, and
 * the loop closes it once its oldest call is past the timeout
 * (docs/operations.md, "When Redis fails"). */
static struct redis_slot *
slot_pick(struct redis_backend *rb, struct redis_node *node, int64_t now)
{
	struct redis_slot *best = NULL, *closed = NULL, *hung = NULL;
	size_t i, pend, best_pend = SIZE_MAX, hung_pend = SIZE_MAX;

	for (i = 0; i < node->nconns; i++) {
		struct redis_slot *s = &node->conns[i];

		if (redis_conn_state(s->conn) == REDIS_CONN_CLOSED) {
			if (closed == NULL && now >= s->next_connect_us)
				closed = s;
			continue;
		}
		pend = redis_conn_pending(s->conn);
		/* One whose oldest command waits for half the timeout
		 * already is likely hung: new calls go elsewhere. */
		if (redis_conn_oldest_us(s->conn) != INT64_MAX &&
		    now - redis_conn_oldest_us(s->conn) > rb->timeout_us / 2) {
			if (pend < hung_pend) {
				hung = s;
				hung_pend = pend;
			}
			continue;
		}
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
	return hung;
}

/* Queue one command on a connection of node (connecting if need be).
 * Returns the slot, or NULL with err. */
struct redis_slot *
redis_node_send(struct redis_backend *rb, struct redis_node *node, int argc,
    const char **argv, const size_t *lens, redis_reply_fn fn, void *arg,
    char *err, size_t errlen)
{
	struct redis_slot *s = slot_pick(rb, node, util_monotonic_us());

	if (s == NULL) {
		snprintf(err, errlen,
		    "no connection to %.64s:%d "
		    "(reconnecting: %.80s)",
		    node->url.is_unix ? node->url.path : node->host,
		    node->url.port, redis_conn_last_error(node->conns[0].conn));
		return NULL;
	}
	if (redis_conn_state(s->conn) == REDIS_CONN_CLOSED)
		s->next_connect_us = util_monotonic_us() + REDIS_RECONNECT_US;
	if (redis_conn_send(s->conn, argc, argv, lens, fn, arg, err, errlen) ==
	    -1)
		return NULL;
	redis_slot_busy(rb, s);
	return s;
}

/* "host:port" (the port after the last ':') into host and *port. */
int
redis_hostport_parse(const char *s, char *host, size_t hostlen, int *port)
{
	const char *colon = strrchr(s, ':');
	char *end;
	long p;

	if (colon == NULL || colon == s || (size_t)(colon - s) >= hostlen)
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
