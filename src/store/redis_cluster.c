/*
 * redis_cluster.c - what Redis Cluster adds to the store: the slot map
 * (CLUSTER SLOTS of any node that answers, the seeds first), following
 * MOVED and ASK, and a request whose keys fall in several slots, split into
 * one call per slot and made all-or-nothing again (redis_split.c;
 * docs/scale.md).
 *
 * MOVED updates the map (and asks for a new one) and sends the calls again
 * to the new owner; ASK sends the batch once to the node named, after
 * ASKING.  Neither ran the script, so sending again never counts twice.
 *
 * Thread: the store's I/O thread (redis_cluster_init at start-up).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/config.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/util.h"
#include "store/redis_priv.h"
#include "store/redis_split.h"
#include "store/redis_topology.h"

/* Cluster: a node for every address the slot map knows.  0 or -1. */
int
redis_cluster_sync_nodes(struct redis_backend *rb)
{
	while (rb->nnodes < rb->map.nnodes)
		if (redis_node_add(rb, rb->map.nodes[rb->nnodes].host,
			rb->map.nodes[rb->nnodes].port) == -1)
			return -1;
	return 0;
}

/* ---- the slot map ------------------------------------------------------ */

size_t
redis_cluster_mark_primaries(struct redis_backend *rb)
{
	size_t i, n = 0;
	int o;

	for (i = 0; i < rb->nnodes; i++)
		rb->nodes[i]->primary = false;
	for (i = 0; i < SLOT_MAP_SLOTS; i++)
		if ((o = rb->map.owner[i]) >= 0 && (size_t)o < rb->nnodes &&
		    !rb->nodes[o]->primary) {
			rb->nodes[o]->primary = true;
			n++;
		}
	for (i = 0; i < rb->nnodes; i++)
		if (!rb->nodes[i]->primary)
			redis_circuit_node_forget(rb->nodes[i]);
	return n;
}

/*
 * /readyz under Cluster (docs/scale.md): every slot has a primary in the
 * map, and no primary is marked down by its breaker.  A failed primary
 * stays in CLUSTER SLOTS until its replica is promoted: its breaker is
 * what says it is down meanwhile.
 */
bool
redis_cluster_ready(const struct redis_backend *rb, char *msg, size_t msglen)
{
	size_t i;

	if (slot_map_unowned(&rb->map) > 0) {
		snprintf(msg, msglen, "%zu cluster slots have no primary",
		    slot_map_unowned(&rb->map));
		return false;
	}
	for (i = 0; i < rb->nnodes; i++)
		if (rb->nodes[i]->primary && rb->nodes[i]->down_until_us != 0) {
			snprintf(msg, msglen, "the primary %.64s:%d is down",
			    rb->nodes[i]->host, rb->nodes[i]->url.port);
			return false;
		}
	return true;
}

/* The PING of a probe to one primary: what it tells that node's breaker. */
static void
ping_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_node *node = arg;
	struct redis_backend *rb = node->rb;

	(void)err;
	if (rb->closing)
		return;
	if (r == NULL)
		redis_circuit_node_failed(rb, node);
	else if (r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0)
		redis_circuit_node_answered(rb, node);
}

/*
 * A probe's PING goes to the owner of slot 0 (redis_route.c); every other
 * primary gets one too, answered to its breaker, so that a primary that
 * died while no request went its way is marked down after
 * REDIS_NODE_THRESHOLD probes, and one that answers again is not any
 * more.  A primary none of whose connections may take a command now is
 * left for the next probe.
 */
void
redis_cluster_ping_primaries(struct redis_backend *rb, int skip)
{
	const char *argv[1] = { "PING" };
	size_t lens[1] = { 4 }, i;
	char err[BACKEND_ERR_MAX];

	for (i = 0; i < rb->nnodes; i++)
		if (rb->nodes[i]->primary && (int)i != skip)
			(void)redis_node_send(rb, rb->nodes[i], 1, argv, lens,
			    ping_reply, rb->nodes[i], err, sizeof(err));
}

int
redis_cluster_owner_from(struct redis_backend *rb, size_t from)
{
	size_t n = rb->map.nnodes, i, k;
	int found = -1;
	bool *owns;

	if (n == 0 || (owns = rl_calloc(n, sizeof(*owns))) == NULL)
		return -1;
	for (i = 0; i < SLOT_MAP_SLOTS; i++)
		if (rb->map.owner[i] >= 0 && (size_t)rb->map.owner[i] < n)
			owns[rb->map.owner[i]] = true;
	for (k = 0; k < n && found < 0; k++)
		if (owns[(from + k) % n])
			found = (int)((from + k) % n);
	rl_free(owns);
	return found;
}

/*
 * The release subscription hears the cluster's PUBLISH messages only on a
 * node of the cluster.  A node removed from it (redis-cli --cluster
 * del-node resets it and leaves it running) keeps the connection up and
 * hears nothing more: when the new map gives the subscribed node no slot,
 * subscribe again on the next node that owns some, as after a lost
 * connection (the watcher is told once the new SUBSCRIBE is accepted:
 * releases meanwhile went unheard).
 */
static void
releases_follow(struct redis_backend *rb)
{
	struct redis_node *was;
	int owner;

	if (!rb->rel_started || rb->rel_wanted || rb->rel_node >= rb->nnodes)
		return;
	if ((owner = redis_cluster_owner_from(rb, rb->rel_node)) < 0 ||
	    (size_t)owner == rb->rel_node)
		return;
	was = rb->nodes[rb->rel_node];
	log_info(
	    "redis cluster: %s:%d owns no slot; subscribing to %s on "
	    "%s:%d instead",
	    was->host, was->url.port, rb->rel_channel, rb->nodes[owner]->host,
	    rb->nodes[owner]->url.port);
	rb->rel_node = (size_t)owner;
	rb->rel_wanted = true;
	rb->next_rel_us = 0;
}

static void
refresh_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_node *node = arg;
	struct redis_backend *rb = node->rb;
	struct slot_range *ranges = NULL;
	size_t n = 0, owners;
	char msg[BACKEND_ERR_MAX];

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
	    redis_cluster_sync_nodes(rb) == -1) {
		rl_free(ranges);
		goto fail;
	}
	rl_free(ranges);
	metrics_redis_event(rb->metrics, METRICS_REDIS_TOPOLOGY_REFRESH);
	redis_circuit_node_answered(rb, node);
	owners = redis_cluster_mark_primaries(rb);
	if (memcmp(rb->last_owner, rb->map.owner, sizeof(rb->last_owner)) !=
		0 &&
	    redis_circuit_kick(rb))
		log_info("redis cluster: the slot map changed; trying again");
	if (owners != rb->nprimaries)
		log_info(
		    "redis cluster: %zu primaries, slot map from "
		    "%s:%d",
		    owners, node->host, node->url.port);
	rb->nprimaries = owners;
	releases_follow(rb);
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
void
redis_cluster_refresh(struct redis_backend *rb)
{
	const char *argv[2] = { "CLUSTER", "SLOTS" };
	size_t lens[2] = { 7, 5 };
	struct redis_node *node;
	char err[BACKEND_ERR_MAX];

	rb->next_refresh_us = util_monotonic_us() + REDIS_TOPOLOGY_US;
	node = rb->nodes[rb->refresh_next % rb->nnodes];
	if (redis_node_send(rb, node, 2, argv, lens, refresh_reply, node, err,
		sizeof(err)) == NULL) {
		rb->refresh_next++;
		redis_log_failure(rb, BACKEND_ERR_CONNECT, err);
		return;
	}
	rb->refresh_wanted = false;
	rb->refreshing = true;
}

/* ---- MOVED and ASK ----------------------------------------------------- */

/* MOVED or ASK: follow it.  Returns 1 when b was sent again (ASK: it is
 * still in flight), 0 when its calls were parked (MOVED: b is done with),
 * -1 when it is not a redirection or cannot be followed (b fails). */
int
redis_cluster_redirect(struct redis_batch *b, const redisReply *r, char *msg,
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
			-1 ||
		    redis_cluster_sync_nodes(rb) == -1)
			return -1;
		(void)redis_cluster_mark_primaries(rb);
		rb->refresh_wanted = true;
		redis_flight_park(b, util_monotonic_us(), true);
		return 0;
	}
	metrics_redis_event(rb->metrics, METRICS_REDIS_ASK);
	if ((node = slot_map_node(&rb->map, host, port, msg, msglen)) < 0 ||
	    redis_cluster_sync_nodes(rb) == -1)
		return -1;
	for (i = 0; i < b->ncalls; i++)
		if (b->calls[i] != NULL &&
		    ++redis_call(b->calls[i])->redirects >
			REDIS_REDIRECTS_MAX) {
			snprintf(msg, msglen, "too many cluster redirections");
			return -1;
		}
	redis_batch_compact(b);
	b->ask_node = node;
	return redis_batch_send(rb, b, msg, msglen) == 0 ? 1 : -1;
}

/* ---- requests across cluster slots ------------------------------------- */

/* Answer a split request, and tell the store's circuit how it ended (its
 * parts are not counted): the request may be the circuit's trial. */
static void
split_answer(struct redis_split *s)
{
	struct backend_call *parent = redis_split_parent(s);
	struct redis_backend *rb = redis_split_user(s);

	redis_split_answer(s);
	redis_circuit_leave(rb, redis_call(parent)->trial,
	    redis_circuit_outcome(rb, parent->rc, parent->kind));
	parent->done(parent);
}

/* A take-back finished; the last one answers the request, unless it was
 * answered already (its deadline had passed), and frees the split.  Its
 * keys have their units back (or may have, when it failed): the watcher
 * hears each (backend_redis_watch_takebacks()). */
static void
split_takeback_done(struct backend_call *tb)
{
	struct redis_split *s = redis_call(tb)->split;
	struct redis_backend *rb = redis_split_user(s);
	size_t k;

	if (tb->rc == 0)
		metrics_redis_event(rb->metrics, METRICS_REDIS_TAKEBACK);
	else {
		metrics_redis_event(rb->metrics, METRICS_REDIS_TAKEBACK_FAILED);
		log_warnx(
		    "redis %s: a denied request's units could not be "
		    "taken back (%s); they count until they expire",
		    rb->shown_url, tb->err);
	}
	for (k = 0; k < tb->n && rb->tb_fn != NULL; k++)
		rb->tb_fn(rb->tb_arg, tb->checks[k].key, tb->checks[k].keylen);
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
	struct redis_split *s = redis_call(part)->split;
	struct redis_backend *rb = redis_split_user(s);
	struct backend_call *parent = redis_split_parent(s);
	int64_t now = util_monotonic_us(), deadline;
	bool late = parent->deadline_us - now < rb->timeout_us / 2;
	int n, i;

	if (!redis_split_one_done(s))
		return;
	/* Past the request's deadline, or with less than half of
	 * redis.timeout left (the parts were slow: so may the take-back be,
	 * and it must not fail for want of time), the take-back goes out on
	 * a deadline of its own, and the request is answered at once. */
	deadline = late ? now + rb->timeout_us : parent->deadline_us;
	n = redis_split_takebacks(s, split_takeback_done, deadline);
	if (n < 0)
		log_warnx(
		    "redis %s: out of memory: a denied request's units "
		    "count until they expire",
		    rb->shown_url);
	if (n <= 0) {
		split_answer(s);
		redis_split_free(s);
		return;
	}
	if (late)
		split_answer(s);
	for (i = 0; i < n; i++) {
		struct backend_call *tb = redis_split_takeback(s, (size_t)i);

		redis_call(tb)->kind = REDIS_CALL_TAKEBACK;
		redis_flight_soon(rb, tb);
	}
}

/* Cluster: a request whose keys are in several slots, one part each. */
void
redis_cluster_split(struct redis_backend *rb, struct redis_turn *t,
    struct backend_call *call, const unsigned *slots)
{
	struct redis_split *s;
	size_t i, n;

	/* Its parts are in flight instead. */
	redis_flight_remove(rb, call);
	if ((s = redis_split_new(call, slots, split_part_done, rb)) == NULL) {
		redis_flight_add(rb, call);
		redis_flight_finish(rb, call, -1, BACKEND_ERR_PROTOCOL,
		    "out of memory");
		return;
	}
	/* A part may finish inside redis_route_call() (its node's circuit
	 * open, a failed send); the last to finish answers the request and
	 * frees the split, so its size is read before. */
	n = redis_split_nparts(s);
	for (i = 0; i < n; i++) {
		struct backend_call *part = redis_split_part(s, i);

		redis_call(part)->kind = REDIS_CALL_REQUEST;
		redis_call(part)->trial = false;
		redis_route_call(rb, t, part);
	}
}

/* The seeds of redis.cluster, as the slot map's first nodes. */
int
redis_cluster_init(struct redis_backend *rb, const struct redis_config *rc,
    char *err, size_t errlen)
{
	char host[SLOT_MAP_HOST_MAX];
	int port;
	size_t i;

	rb->mode = REDIS_CLUSTER;
	slot_map_init(&rb->map);
	for (i = 0; i < rc->ncluster; i++) {
		if (redis_hostport_parse(rc->cluster[i], host, sizeof(host),
			&port) == -1) {
			snprintf(err, errlen,
			    "redis.cluster: bad node "
			    "\"%.64s\"",
			    rc->cluster[i]);
			return -1;
		}
		if (slot_map_node(&rb->map, host, port, err, errlen) < 0)
			return -1;
	}
	if (redis_cluster_sync_nodes(rb) == -1) {
		snprintf(err, errlen, "redis: out of memory");
		return -1;
	}
	rb->refresh_wanted = true;
	return 0;
}
