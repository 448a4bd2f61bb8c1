/*
 * redis_releases.c - hearing releases of leases made through any daemon on
 * the same Redis (docs/leases.md): lua/lease.lua PUBLISHes the key on
 * "<key_prefix>released", and the store keeps one subscription to it (on
 * the primary; under Cluster on a node that owns slots, which hears every
 * PUBLISH, and moved when a new slot map gives it none: redis_cluster.c),
 * handing each key to backend_redis_watch_releases()'s function.
 *
 * Thread: the store's I/O thread.
 */
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "store/redis_priv.h"

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
		rb->rel_fn(rb->rel_arg, r->element[2]->str, r->element[2]->len);
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
		log_warnx(
		    "redis: SUBSCRIBE %s refused (%s): requests waiting "
		    "for a lease learn of releases through other daemons "
		    "only when the lease expires",
		    rb->rel_channel,
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
	rb->rel_refused = true;
	rb->next_rel_us = util_monotonic_us() + REDIS_REL_REFUSED_US;
}

void
redis_releases_subscribe(struct redis_backend *rb)
{
	const char *argv[2] = { "SUBSCRIBE", rb->rel_channel };
	size_t lens[2] = { 9, strlen(rb->rel_channel) };
	char err[BACKEND_ERR_MAX];
	struct redis_node *node;
	int owner;

	rb->rel_wanted = false;
	if (rb->rel.conn != NULL) {
		redis_conn_set_push(rb->rel.conn, NULL, NULL);
		redis_conn_free(rb->rel.conn, "moving the subscription");
		rb->rel.conn = NULL;
		rb->rel.reg_fd = -1;
	}
	if (rb->nnodes == 0 ||
	    (rb->mode == REDIS_SENTINEL && !rb->sentinels.known)) {
		rb->rel_wanted = true; /* no address yet */
		rb->next_rel_us = util_monotonic_us() + REDIS_TOPOLOGY_US;
		return;
	}
	if (rb->mode == REDIS_CLUSTER) {
		/* A node that owns slots: one that owns none may have left
		 * the cluster and hear nothing (redis_cluster.c). */
		rb->rel_node %= rb->nnodes;
		if ((owner = redis_cluster_owner_from(rb, rb->rel_node)) >= 0)
			rb->rel_node = (size_t)owner;
	}
	node = rb->nodes[rb->mode == REDIS_CLUSTER ? rb->rel_node : 0];
	rb->rel_cfg = node->ccfg;
	rb->rel_cfg.script = NULL;
	if ((rb->rel.conn = redis_conn_new(&rb->rel_cfg)) == NULL) {
		rel_later(rb);
		return;
	}
	redis_conn_set_push(rb->rel.conn, rel_push, rb);
	if (redis_conn_send(rb->rel.conn, 2, argv, lens, rel_sub_reply, rb, err,
		sizeof(err)) == -1) {
		redis_log_node_failure(rb,
		    rb->mode == REDIS_CLUSTER ? node : NULL,
		    BACKEND_ERR_CONNECT, err);
		rel_later(rb);
	}
}
