/*
 * backend_redis.c - the Redis store behind backend.h.  A request's checks
 * are evaluated by lua/ratelimit.lua, atomically on the server with the
 * server's clock (docs/algorithms.md); this file moves calls to Redis and
 * results back, batches what arrives together, routes each call to the
 * primary that holds its keys, and keeps a failing Redis from slowing the
 * daemon down.
 *
 * DESIGN
 *
 * One I/O thread owns every connection (redis_conn.c) and an epoll set.
 * backend_submit() puts a call on a queue under a mutex and wakes the
 * thread through an eventfd; it never touches a socket.  Each turn of the
 * loop takes every call queued since the last turn and sends them as
 * batches: up to REDIS_BATCH_CALLS requests in one EVALSHA (the script
 * evaluates them one after the other, each all-or-nothing on its own;
 * redis_script.c encodes and decodes), each batch on the connection of its
 * node with the fewest commands in flight, then writes each connection's
 * buffer with one write(2).  Under load calls queue while the thread
 * works, so batches grow by themselves; alone, a call leaves at once.
 *
 * Nodes.  Every server the store talks to is a node with its own
 * pool_size connections.  A single Redis (redis.url) is node 0.  Under
 * Sentinel (redis.sentinel) node 0 is the primary the sentinels name: it
 * is asked of them at start, and on +switch-master (a subscription), a
 * READONLY reply or a lost connection, node 0 moves to the primary they
 * name then: its connections close and reconnect there.  Under Redis
 * Cluster (redis.cluster) node i is slot_map.c's node i: the slot map
 * comes from CLUSTER SLOTS of any node that answers (the seeds first), and
 * a call goes to the node that owns the hash slot of its keys.  A batch
 * holds calls of one slot only (a script may touch one slot's keys).  A
 * request whose keys fall in several slots is split into one call per slot
 * and made all-or-nothing again by redis_split.c.  MOVED updates the map
 * (and asks for a new one) and sends the calls again to the new owner; ASK
 * sends the batch once to the node named, after ASKING; CLUSTERDOWN sends
 * it again 50 ms later.  TRYAGAIN (the slot's keys split by a migration)
 * sends each call of a batch again in a batch of its own, at once, and a
 * call alone 50 ms later (redis_flight_tryagain()).  None of these ran the
 * script, so sending again never counts twice.  A call that cannot be routed
 * now (no map yet, a slot without owner, no primary known) is parked in the
 * in-flight list and sent when the topology is known, or fails at its
 * deadline.
 *
 * Deadlines.  A call carries its own deadline (set when its request
 * arrived).  The thread keeps the calls in its hands in a list sorted by
 * deadline and sleeps no longer than the first; a call past its deadline
 * fails at once with BACKEND_ERR_TIMEOUT, and its part of a late reply is
 * dropped.  When that deadline was the caller's own, earlier than
 * redis.timeout's (a gRPC client's grpc-timeout), the call fails with
 * BACKEND_ERR_DEADLINE instead, which the circuit does not count: the
 * client gave up, Redis did not fail.  A call whose script may have run is
 * never sent again (it would count twice): a closed connection fails its calls.
 * Only a call none of whose bytes reached a socket (queued on a connection
 * still connecting, or behind what the socket had not taken) is known not to
 * have run (redis_conn_unwritten()): under Sentinel such a call, and one
 * no connection could take, is parked until the sentinels next name the
 * primary and sent there, within its deadline (redis_flight_requeue(),
 * docs/scale.md); on a single Redis or a Cluster it fails as before.
 * NOSCRIPT means the script did not run, so the batch is sent again once,
 * after SCRIPT LOAD.  A connection whose oldest command is older than the
 * timeout is closed (everything on it has failed by then), and so is a connect
 * that takes longer.
 *
 * Script.  Every new connection queues AUTH, SELECT and SCRIPT LOAD ahead
 * of the first call; EVALSHA uses the SHA1 the Makefile computed from the
 * script text, so no call waits for the handshake.
 *
 * Circuit breaker.  After REDIS_CB_THRESHOLD consecutive failed calls the
 * circuit opens: calls fail at once with BACKEND_ERR_CIRCUIT_OPEN, inside
 * submit, without queueing.  After a backoff (100 ms, doubling on every
 * failed trial up to 5 s) it half-opens: exactly one call goes through as
 * a trial while the others still fail fast.  Success anywhere closes the
 * circuit and resets the backoff.  Under Cluster each primary has a
 * breaker of its own as well, and the store's counts a failure only while
 * no primary is known (the seeds cannot be reached: no slot map).  Readiness
 * probes bypass the circuit: /readyz reports Redis as it is (under Cluster,
 * every primary: redis_cluster_ready()).
 *
 * Failures are logged with log_warnx at most once a second per kind, with a
 * count of the lines held back; the URL appears only redacted.  Under
 * Cluster a line about one node names it (host:port), and one about the
 * cluster as a whole the first seed.
 *
 * Files.  This file is the store itself (submit, new, free); the rest is
 * one concern a file, sharing store/redis_priv.h:
 *   redis_loop.c      the I/O thread: wake-ups, expiry, epoll, one write
 *   redis_route.c     a turn's calls into batches
 *   redis_batch.c     a batch into its command (EVALSHA, EVAL, PING)
 *   redis_reply.c     a reply back into results, or sent again / parked
 *   redis_flight.c    calls in flight by deadline, parking, answering
 *   redis_node.c      nodes, their connections, which one takes a command
 *   redis_circuit.c   the circuit breakers and the failure log
 *   redis_cluster.c   slot map, MOVED / ASK, requests across slots
 *   redis_sentinel.c  the primary the sentinels name
 *   redis_releases.c  the subscription that hears lease releases
 * and below them redis_conn.c (one connection), redis_resolve.c (host
 * names), redis_script.c (ratelimit.lua's arguments and reply),
 * redis_split.c (a request across slots), redis_topology.c (CLUSTER SLOTS
 * and Sentinel replies) and slot_map.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/redis_url.h"
#include "base/util.h"
#include "store/redis.h"
#include "store/redis_priv.h"
#include "store/redis_tls.h"
#include "store/slot_map.h"

static void
redis_submit(struct backend *b, struct backend_call *call)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	struct redis_call_priv *q = redis_call(call);
	uint64_t one = 1;
	int64_t own;
	bool wake;

	q->next = q->prev = NULL;
	q->batch = NULL;
	q->split = NULL;
	q->parked = REDIS_PARK_NO_PRIMARY;
	q->at = 0;
	q->alone = false;
	q->kind = call->n > 0 ?
	    (call->lease_op != BACKEND_LEASE_NONE ? REDIS_CALL_LEASE :
						    REDIS_CALL_REQUEST) :
	    call->stat != NULL	? REDIS_CALL_STATS :
	    call->admin != NULL ? REDIS_CALL_ADMIN :
				  REDIS_CALL_PROBE;
	q->redirects = 0;
	q->trial = false;
	call->all_allowed = false;
	call->err[0] = '\0';
	/* The store owns its timeout: from the request's arrival. */
	own = (call->start_us > 0 ? call->start_us : util_monotonic_us()) +
	    rb->timeout_us;
	q->caller_deadline = call->deadline_us != 0 && call->deadline_us < own;
	if (!q->caller_deadline)
		call->deadline_us = own;
	/* Cluster: a breaker per primary too, in the I/O thread
	 * (redis_circuit_node_is_down); this one opens only while no
	 * primary is known (redis_circuit_outcome). */
	if (call->n > 0 && redis_circuit_enter(rb, &q->trial) == -1) {
		call->rc = -1;
		call->kind = BACKEND_ERR_CIRCUIT_OPEN;
		snprintf(call->err, sizeof(call->err),
		    "redis: circuit open "
		    "after repeated failures");
		call->done(call);
		return;
	}
	pthread_mutex_lock(&rb->qmu);
	if (rb->stopping) {
		pthread_mutex_unlock(&rb->qmu);
		call->rc = -1;
		call->kind = BACKEND_ERR_CONNECT;
		snprintf(call->err, sizeof(call->err), "redis: shutting down");
		if (call->n > 0)
			redis_circuit_leave(rb, q->trial,
			    REDIS_OUTCOME_NEUTRAL);
		call->done(call);
		return;
	}
	wake = rb->asleep;
	rb->asleep = false;
	if (rb->qtail != NULL)
		redis_call(rb->qtail)->next = call;
	else
		rb->qhead = call;
	rb->qtail = call;
	pthread_mutex_unlock(&rb->qmu);
	/* A wake-up only for a thread that sleeps, once: while it works,
	 * its next turn takes what came meanwhile.  The event loop that
	 * hosts the I/O runs a turn after its handlers: never woken by
	 * itself. */
	if (wake && redis_hosted_here != rb)
		(void)!write(rb->evfd, &one, sizeof(one));
}

static void
redis_free(struct backend *b)
{
	struct redis_backend *rb = (struct redis_backend *)b;
	struct redis_sentinels *ss;
	uint64_t one = 1;
	size_t i, j;

	if (rb == NULL)
		return;
	ss = &rb->sentinels;
	if (rb->thread_started) {
		pthread_mutex_lock(&rb->qmu);
		rb->stopping = true;
		pthread_mutex_unlock(&rb->qmu);
		(void)!write(rb->evfd, &one, sizeof(one));
		pthread_join(rb->thread, NULL);
	} else if (rb->adopted) {
		/* Hosted, and never given back (its thread failed to
		 * start): answer what is left here. */
		rb->stopping = true;
		redis_loop_close_all(rb);
	}
	for (i = 0; i < rb->nnodes; i++) {
		for (j = 0; j < rb->nodes[i]->nconns; j++)
			redis_conn_free(rb->nodes[i]->conns[j].conn,
			    "shutting down");
		rl_free(rb->nodes[i]->conns);
		rl_free(rb->nodes[i]);
	}
	rl_free(rb->nodes);
	if (ss->sub.conn != NULL) {
		redis_conn_set_push(ss->sub.conn, NULL, NULL);
		redis_conn_free(ss->sub.conn, "shutting down");
	}
	if (rb->rel.conn != NULL) {
		redis_conn_set_push(rb->rel.conn, NULL, NULL);
		redis_conn_free(rb->rel.conn, "shutting down");
	}
	rl_free(rb->rel_channel);
	for (i = 0; ss->q != NULL && i < ss->n; i++)
		redis_conn_free(ss->q[i].conn, "shutting down");
	for (i = 0; ss->urls != NULL && i < ss->n; i++)
		rl_free(ss->urls[i].host);
	if (ss->urls != NULL)
		rl_free(ss->urls[0].password); /* shared by all */
	rl_free(ss->urls);
	rl_free(ss->cfgs);
	rl_free(ss->q);
	rl_free(ss->master);
	slot_map_release(&rb->map);
	if (rb->epfd >= 0)
		close(rb->epfd);
	if (rb->evfd >= 0)
		close(rb->evfd);
	pthread_mutex_destroy(&rb->mu);
	pthread_mutex_destroy(&rb->qmu);
	rl_free(rb->shown_url);
	redis_url_free(&rb->url);
	redis_tls_free(rb->tls);
	redis_batch_free_kept(rb);
	rl_free(rb);
}

static int
redis_host_adopt(struct backend *b)
{
	return redis_loop_adopt((struct redis_backend *)b);
}

static int
redis_host_turn(struct backend *b, bool poll)
{
	return redis_loop_host_turn((struct redis_backend *)b, poll);
}

static int
redis_host_release(struct backend *b, char *err, size_t errlen)
{
	return redis_loop_release((struct redis_backend *)b, err, errlen);
}

static const struct backend_ops redis_ops = {
	.submit = redis_submit,
	.free = redis_free,
	.host_adopt = redis_host_adopt,
	.host_turn = redis_host_turn,
	.host_release = redis_host_release,
};

struct backend *
backend_redis_new(const struct redis_config *rc, char *err, size_t errlen)
{
	struct redis_backend *rb;
	struct epoll_event ev;
	size_t i, shown_len;
	const char *url = rc->url != NULL ? rc->url : "redis://127.0.0.1:6379";
	const struct tls_file *bad;

	if ((rc->url == NULL && rc->ncluster == 0 &&
		rc->sentinel.master == NULL) ||
	    rc->pool_size < 1 || rc->timeout_ms < 1 || rc->pool_size > 0xffff) {
		snprintf(err, errlen,
		    "redis: need a url, cluster or "
		    "sentinel, pool_size >= 1 and timeout >= 1ms");
		return NULL;
	}
	if ((rb = rl_calloc(1, sizeof(*rb))) == NULL) {
		snprintf(err, errlen, "redis: out of memory");
		return NULL;
	}
	rb->base.ops = &redis_ops;
	rb->base.name = "redis";
	rb->base.completes_inline = false;
	rb->timeout_us = rc->timeout_ms * 1000;
	rb->pool_size = (size_t)rc->pool_size;
	rb->circuit = REDIS_CIRCUIT_CLOSED;
	rb->hmin_us = INT64_MAX;
	rb->backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
	rb->epfd = rb->evfd = -1;
	rb->rel.reg_fd = -1;
	slot_map_init(&rb->map);
	pthread_mutex_init(&rb->mu, NULL);
	pthread_mutex_init(&rb->qmu, NULL);
	for (i = 0; i < REDIS_NKINDS; i++) {
		atomic_init(&rb->last_log_us[i], INT64_MIN);
		atomic_init(&rb->suppressed[i], 0);
	}
	if (redis_url_parse(url, &rb->url, err, errlen) == -1)
		goto fail;
	rb->tls_nodes = rb->url.tls || rc->tls.section;
	rb->tls_sentinels = rc->sentinel.master != NULL && rc->sentinel.tls;
	if (rb->tls_nodes && rb->url.is_unix) {
		snprintf(err, errlen,
		    "redis: TLS needs a TCP address; Redis does not "
		    "encrypt unix sockets");
		goto fail;
	}
	if ((rb->tls_nodes || rb->tls_sentinels) &&
	    (rb->tls = redis_tls_new(&rc->tls, &bad, err, errlen)) == NULL)
		goto fail;
	if (rb->url.password == NULL && rc->password_file != NULL &&
	    redis_read_password_file(rc->password_file, &rb->url.password, err,
		errlen) == -1)
		goto fail;
	if (rb->url.user != NULL && rb->url.password == NULL) {
		snprintf(err, errlen,
		    "redis URL: user name without a "
		    "password (add :pass or a password_file)");
		goto fail;
	}
	if ((rb->rel_channel = rl_malloc(
		 strlen(rc->key_prefix != NULL ? rc->key_prefix : "") + 9)) ==
	    NULL)
		goto oom;
	snprintf(rb->rel_channel,
	    strlen(rc->key_prefix != NULL ? rc->key_prefix : "") + 9,
	    "%sreleased", rc->key_prefix != NULL ? rc->key_prefix : "");
	if (rc->ncluster > 0)
		url = rc->cluster[0];
	else if (rc->sentinel.master != NULL)
		url = rc->sentinel.master;
	shown_len = redis_url_redact(url, NULL, 0) + 1;
	if ((rb->shown_url = rl_malloc(shown_len)) == NULL)
		goto oom;
	(void)redis_url_redact(url, rb->shown_url, shown_len);

	if (rc->ncluster > 0) {
		if (redis_cluster_init(rb, rc, err, errlen) == -1)
			goto fail;
	} else if (rc->sentinel.master != NULL) {
		if (redis_sentinel_init(rb, rc, err, errlen) == -1)
			goto fail;
	} else {
		rb->mode = REDIS_SINGLE;
		if (redis_node_add(rb, rb->url.host != NULL ? rb->url.host : "",
			rb->url.port) == -1)
			goto oom;
	}
	if ((rb->epfd = epoll_create1(EPOLL_CLOEXEC)) == -1 ||
	    (rb->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) == -1) {
		snprintf(err, errlen, "redis: %s", strerror(errno));
		goto fail;
	}
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.u64 = REDIS_EVFD_TAG;
	if (epoll_ctl(rb->epfd, EPOLL_CTL_ADD, rb->evfd, &ev) == -1 ||
	    (errno = pthread_create(&rb->thread, NULL, redis_loop_run, rb)) !=
		0) {
		snprintf(err, errlen, "redis: I/O thread: %s", strerror(errno));
		goto fail;
	}
	rb->thread_started = true;
	pthread_setname_np(rb->thread, "rl-redis");
	/* Ask for the topology at once, before the first request. */
	(void)!write(rb->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
	return &rb->base;

oom:
	snprintf(err, errlen, "redis: out of memory");
fail:
	redis_free(&rb->base);
	return NULL;
}

void
backend_redis_watch_releases(struct backend *b, backend_released_fn fn,
    void *arg)
{
	struct redis_backend *rb = (struct redis_backend *)b;

	pthread_mutex_lock(&rb->qmu);
	rb->rel_fn = fn;
	rb->rel_arg = arg;
	pthread_mutex_unlock(&rb->qmu);
	(void)!write(rb->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
}

void
backend_redis_watch_takebacks(struct backend *b, backend_released_fn fn,
    void *arg)
{
	struct redis_backend *rb = (struct redis_backend *)b;

	pthread_mutex_lock(&rb->qmu);
	rb->tb_fn = fn;
	rb->tb_arg = arg;
	pthread_mutex_unlock(&rb->qmu);
}

void
backend_redis_set_metrics(struct backend *b, struct metrics *m)
{
	atomic_store(&((struct redis_backend *)b)->metrics, m);
}

int
backend_redis_check_tls(const struct redis_config *rc,
    const struct tls_file **bad, char *err, size_t errlen)
{
	*bad = NULL;
	if (!config_redis_tls_is_on(rc) &&
	    !(rc->sentinel.master != NULL && rc->sentinel.tls))
		return 0;
	return redis_tls_check(&rc->tls, bad, err, errlen);
}

int
backend_redis_reload_tls(struct backend *b, const struct redis_config *rc,
    const struct tls_file **bad, char *err, size_t errlen)
{
	struct redis_backend *rb = (struct redis_backend *)b;

	*bad = NULL;
	if (rb->tls == NULL)
		return 0;
	return redis_tls_reload(rb->tls, &rc->tls, bad, err, errlen);
}
