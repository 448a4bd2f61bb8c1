/*
 * redis_loop.c - the Redis store's I/O thread: one epoll set over every
 * connection and the eventfd submit() wakes it by.  Each turn takes the
 * calls queued since the last, asks for the topology when needed, routes
 * and sends (redis_route.c), writes each connection's buffer with one
 * write(2), fails calls past their deadline and closes connections that
 * hang, and sleeps no longer than the next deadline.
 *
 * The turns run on the store's own thread, or on an HTTP event loop that
 * adopts the store's I/O (core/backend.h, host_adopt): then the loop polls
 * this epoll set inside its own, and a request of that loop is sent,
 * answered and resumed without a hand-off to another thread.
 *
 * Thread: this is the I/O thread (the own one or the host); it owns
 * everything in struct redis_backend but the submission queue (qmu) and
 * the circuit (mu).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "base/util.h"
#include "store/redis_priv.h"

/* Whatever the topology needs this turn; returns when it next needs the
 * loop to wake (monotonic us), or INT64_MAX. */
static int64_t
topology_turn(struct redis_backend *rb, int64_t now)
{
	struct redis_sentinels *ss = &rb->sentinels;
	int64_t next = INT64_MAX;

	/* While the circuit is open only trial calls fail, rarely: watch
	 * the topology meanwhile, so a failover shows without waiting for
	 * the next trial. */
	if (rb->mode != REDIS_SINGLE && now >= rb->next_watch_us) {
		rb->next_watch_us = now + REDIS_WATCH_US;
		pthread_mutex_lock(&rb->mu);
		if (rb->circuit != REDIS_CIRCUIT_CLOSED)
			redis_node_want_topology(rb);
		pthread_mutex_unlock(&rb->mu);
		if (redis_circuit_any_node_down(rb))
			redis_node_want_topology(rb);
	}
	if (rb->mode != REDIS_SINGLE && rb->next_watch_us < next)
		next = rb->next_watch_us;
	if (rb->mode == REDIS_CLUSTER && rb->refresh_wanted &&
	    !rb->refreshing) {
		if (now >= rb->next_refresh_us)
			redis_cluster_refresh(rb);
		if (rb->refresh_wanted)
			next = rb->next_refresh_us;
	}
	if (rb->mode == REDIS_SENTINEL) {
		if (ss->ask_wanted && !ss->asking) {
			if (now >= ss->next_ask_us)
				redis_sentinel_ask(rb);
			if (ss->ask_wanted && ss->next_ask_us < next)
				next = ss->next_ask_us;
		}
		if (ss->sub_wanted) {
			if (now >= ss->next_sub_us)
				redis_sentinel_subscribe(rb);
			if (ss->sub_wanted && ss->next_sub_us < next)
				next = ss->next_sub_us;
		}
	}
	if (rb->rel_wanted) {
		if (now >= rb->next_rel_us)
			redis_releases_subscribe(rb);
		if (rb->rel_wanted && rb->next_rel_us < next)
			next = rb->next_rel_us;
	}
	return next;
}

/* Every connection the loop drives, with the epoll tag of each. */
static struct redis_slot *
slot_of_tag(struct redis_backend *rb, uint64_t tag)
{
	if (tag == REDIS_SUB_TAG)
		return rb->sentinels.sub.conn != NULL ? &rb->sentinels.sub :
							NULL;
	if (tag == REDIS_REL_TAG)
		return rb->rel.conn != NULL ? &rb->rel : NULL;
	if (tag & REDIS_SENTINEL_TAG) {
		tag &= ~REDIS_SENTINEL_TAG;
		return tag < rb->sentinels.n ? &rb->sentinels.q[tag] : NULL;
	}
	if ((tag >> 16) >= rb->nnodes ||
	    (tag & 0xffff) >= rb->nodes[tag >> 16]->nconns)
		return NULL;
	return &rb->nodes[tag >> 16]->conns[tag & 0xffff];
}

/* Call fn on every connection with its tag. */
static void
each_slot(struct redis_backend *rb,
    void (*fn)(struct redis_backend *, struct redis_slot *, uint64_t, void *),
    void *arg)
{
	size_t i, j;

	for (i = 0; i < rb->nnodes; i++)
		for (j = 0; j < rb->nodes[i]->nconns; j++)
			fn(rb, &rb->nodes[i]->conns[j], ((uint64_t)i << 16) | j,
			    arg);
	for (i = 0; i < rb->sentinels.n; i++)
		fn(rb, &rb->sentinels.q[i], REDIS_SENTINEL_TAG | i, arg);
	if (rb->sentinels.sub.conn != NULL)
		fn(rb, &rb->sentinels.sub, REDIS_SUB_TAG, arg);
	if (rb->rel.conn != NULL)
		fn(rb, &rb->rel, REDIS_REL_TAG, arg);
}

/* Close a connection whose connect or oldest command is overdue; lower
 * *(int64_t *)arg to when the next one would be. */
static void
expire_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	int64_t *next = arg, now = util_monotonic_us(), t;

	(void)tag;
	if ((t = redis_conn_connect_deadline_us(s->conn)) <= now) {
		redis_conn_connect_expired(s->conn);
		redis_slot_busy(rb, s);
	} else if (t < *next)
		*next = t;
	t = redis_conn_oldest_us(s->conn);
	if (t != INT64_MAX && t + rb->timeout_us <= now) {
		redis_conn_close(s->conn, REDIS_HUNG);
		redis_slot_busy(rb, s);
	} else if (t != INT64_MAX && t + rb->timeout_us < *next)
		*next = t + rb->timeout_us;
}

/* Held back past its deadline: never sent.  The held calls are in
 * arrival order, but their deadlines are not (a call may bring a tighter
 * one of its own, as gRPC's grpc-timeout): the whole list is looked at,
 * and hmin_us becomes the earliest deadline left. */
static void
expire_held(struct redis_backend *rb, int64_t now)
{
	struct backend_call *call, *next, *keep = NULL, *tail = NULL;

	rb->hmin_us = INT64_MAX;
	for (call = rb->hhead; call != NULL; call = next) {
		next = redis_call(call)->next;
		if (call->deadline_us > now) {
			if (tail != NULL)
				redis_call(tail)->next = call;
			else
				keep = call;
			tail = call;
			if (call->deadline_us < rb->hmin_us)
				rb->hmin_us = call->deadline_us;
			continue;
		}
		redis_flight_add(rb, call);
		redis_flight_expire(rb, call,
		    "no answer within the timeout (never sent: Redis was "
		    "busy)");
	}
	if (tail != NULL)
		redis_call(tail)->next = NULL;
	rb->hhead = keep;
	rb->htail = tail;
}

/* Why a call waited with no batch (enum redis_park), for its expiry. */
static const char *
parked_why(unsigned char parked)
{
	switch (parked) {
	case REDIS_PARK_UNWRITTEN:
		return " (never sent: no connection to the primary)";
	case REDIS_PARK_TRYAGAIN:
		return " (TRYAGAIN: its slot was being migrated, its keys "
		       "split between two nodes)";
	case REDIS_PARK_CLUSTERDOWN:
		return " (the cluster said CLUSTERDOWN)";
	case REDIS_PARK_LOADING:
		return " (the node said LOADING: loading its data)";
	case REDIS_PARK_MASTERDOWN:
		return " (the node said MASTERDOWN)";
	case REDIS_PARK_READONLY:
		return " (the node said READONLY: a replica now; waiting for "
		       "the new primary)";
	default:
		return " (no primary known for its keys)";
	}
}

/* Fail calls past their deadline and close connections that hang; return
 * how long the loop may sleep (ms, -1 for ever). */
/* Fail the calls in flight whose deadline is past at now, saying why a
 * parked one waited. */
static void
expire_due(struct redis_backend *rb, int64_t now)
{
	char msg[BACKEND_ERR_MAX];

	while (rb->fhead != NULL && rb->fhead->deadline_us <= now) {
		const struct redis_call_priv *q = redis_call(rb->fhead);

		snprintf(msg, sizeof(msg), "no answer within %" PRId64 " ms%s",
		    rb->timeout_us / 1000,
		    q->batch != NULL ? "" : parked_why(q->parked));
		redis_flight_expire(rb, rb->fhead, msg);
	}
}

static int
expire(struct redis_backend *rb, int64_t next)
{
	int64_t now = util_monotonic_us();

	expire_due(rb, now);
	if (rb->hhead != NULL && rb->hmin_us <= now)
		expire_held(rb, now);
	if (rb->fhead != NULL && rb->fhead->deadline_us < next)
		next = rb->fhead->deadline_us;
	if (rb->hhead != NULL && rb->hmin_us < next)
		next = rb->hmin_us;
	if (rb->unpark_us != 0 && rb->unpark_us < next)
		next = rb->unpark_us;
	if (rb->shead != NULL)
		next = now;
	each_slot(rb, expire_slot, &next);
	if (next == INT64_MAX)
		return -1;
	return next <= now ? 0 : (int)((next - now + 999) / 1000);
}

/* Register a connection's socket with epoll as it is now. */
static void
watch_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	struct epoll_event ev;
	int fd = redis_conn_fd(s->conn);
	uint64_t gen = redis_conn_generation(s->conn);
	uint32_t want = EPOLLIN |
	    (redis_conn_wants_write(s->conn) ? EPOLLOUT : 0);

	(void)arg;
	if (fd != s->reg_fd || gen != s->reg_gen) {
		/* A closed socket left the set by itself. */
		s->reg_fd = -1;
		if (fd < 0)
			return;
		memset(&ev, 0, sizeof(ev));
		ev.events = want;
		ev.data.u64 = tag;
		if (epoll_ctl(rb->epfd, EPOLL_CTL_ADD, fd, &ev) == -1) {
			redis_conn_close(s->conn, "epoll_ctl failed");
			return;
		}
		s->reg_fd = fd;
		s->reg_gen = gen;
		s->reg_events = want;
	} else if (fd >= 0 && want != s->reg_events) {
		memset(&ev, 0, sizeof(ev));
		ev.events = want;
		ev.data.u64 = tag;
		(void)epoll_ctl(rb->epfd, EPOLL_CTL_MOD, fd, &ev);
		s->reg_events = want;
	}
}

/* One write for everything a connection got this turn. */
static void
flush_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	(void)tag;
	(void)arg;
	if (redis_conn_state(s->conn) == REDIS_CONN_UP &&
	    redis_conn_wants_write(s->conn)) {
		redis_conn_flush(s->conn);
		redis_slot_busy(rb, s);
	}
}

static void
close_slot(struct redis_backend *rb, struct redis_slot *s, uint64_t tag,
    void *arg)
{
	(void)tag;
	redis_conn_close(s->conn, arg);
	redis_slot_busy(rb, s);
}

/* Script calls allowed in flight now. */
static size_t
window(const struct redis_backend *rb)
{
	return REDIS_WINDOW * (rb->nprimaries > 1 ? rb->nprimaries : 1);
}

/*
 * One turn: when look, wait up to wait_ms (0: not at all) for events and
 * handle them (a host that knows none came does not look); take the
 * queue, do what the topology needs, send, write, expire.  Returns how
 * long the loop may sleep now (ms, -1 for ever); *stop when the store
 * stops.
 */
static int
turn(struct redis_backend *rb, bool look, int wait_ms, bool *stop)
{
	struct epoll_event evs[32];
	struct backend_call *list;
	struct redis_slot *s;
	uint64_t count;
	int n, i;
	int64_t now, next;

	n = look ? epoll_wait(rb->epfd, evs, 32, wait_ms) : 0;
	for (i = 0; i < n; i++) {
		if (evs[i].data.u64 == REDIS_EVFD_TAG) {
			(void)!read(rb->evfd, &count, sizeof(count));
			continue;
		}
		if ((s = slot_of_tag(rb, evs[i].data.u64)) == NULL)
			continue;
		redis_conn_io(s->conn);
		redis_slot_busy(rb, s);
	}
	pthread_mutex_lock(&rb->qmu);
	rb->asleep = false;
	list = rb->qhead;
	if (list != NULL) {
		struct backend_call *c;

		if (rb->htail != NULL)
			redis_call(rb->htail)->next = list;
		else
			rb->hhead = list;
		rb->htail = rb->qtail;
		for (c = list; c != NULL; c = redis_call(c)->next)
			if (c->deadline_us < rb->hmin_us)
				rb->hmin_us = c->deadline_us;
	}
	rb->qhead = rb->qtail = NULL;
	*stop = rb->stopping;
	if (rb->rel_fn != NULL && !rb->rel_started) {
		rb->rel_started = rb->rel_wanted = true;
		rb->next_rel_us = 0;
	}
	pthread_mutex_unlock(&rb->qmu);
	now = util_monotonic_us();
	next = topology_turn(rb, now);
	if (rb->unpark_us != 0 && now >= rb->unpark_us) {
		/* A parked call whose deadline passed too is failed as
		 * parked, with its reason, not routed and failed as never
		 * sent. */
		expire_due(rb, now);
		redis_flight_unpark_all(rb);
	}
	if (rb->shead != NULL) {
		list = rb->shead;
		rb->shead = rb->stail = NULL;
		redis_route_dispatch(rb, list);
	}
	if (rb->hhead != NULL && (rb->batches_out < window(rb) || *stop)) {
		list = rb->hhead;
		rb->hhead = rb->htail = NULL;
		rb->hmin_us = INT64_MAX;
		redis_route_dispatch(rb, list);
	}
	each_slot(rb, flush_slot, NULL);
	wait_ms = expire(rb, next);
	each_slot(rb, watch_slot, NULL);
	return wait_ms;
}

/* Stopping: nothing is submitted any more; answer what is left.  Failing
 * a part of a split request may queue its take-backs, which fail at once
 * too. */
void
redis_loop_close_all(struct redis_backend *rb)
{
	struct backend_call *list;

	rb->closing = true;
	each_slot(rb, close_slot, (void *)"shutting down");
	for (;;) {
		if (rb->shead != NULL) {
			list = rb->shead;
			rb->shead = rb->stail = NULL;
			redis_route_dispatch(rb, list);
		}
		if (rb->hhead != NULL) {
			list = rb->hhead;
			rb->hhead = rb->htail = NULL;
			redis_route_dispatch(rb, list);
		}
		while (rb->fhead != NULL)
			redis_flight_finish(rb, rb->fhead, -1,
			    BACKEND_ERR_CONNECT, "shutting down");
		if (rb->shead == NULL && rb->hhead == NULL)
			break;
	}
}

/* The store's own thread: turns until the store stops, or until an event
 * loop adopts its I/O (redis_loop_adopt()). */
void *
redis_loop_run(void *arg)
{
	struct redis_backend *rb = arg;
	bool stop = false, handover;
	int wait_ms = 0;

	while (!stop) {
		/* Sleep only with nothing queued, and say so: a submit then
		 * writes the eventfd (backend_redis.c), and only then. */
		pthread_mutex_lock(&rb->qmu);
		handover = rb->handover;
		if (rb->qhead != NULL || rb->stopping || handover)
			wait_ms = 0;
		else if (wait_ms != 0)
			rb->asleep = true;
		pthread_mutex_unlock(&rb->qmu);
		if (handover)
			return NULL;
		wait_ms = turn(rb, true, wait_ms, &stop);
	}
	redis_loop_close_all(rb);
	return NULL;
}

_Thread_local struct redis_backend *redis_hosted_here;

int
redis_loop_adopt(struct redis_backend *rb)
{
	pthread_mutex_lock(&rb->qmu);
	rb->handover = true;
	rb->asleep = false;
	pthread_mutex_unlock(&rb->qmu);
	(void)!write(rb->evfd, &(uint64_t){ 1 }, sizeof(uint64_t));
	if (rb->thread_started) {
		pthread_join(rb->thread, NULL);
		rb->thread_started = false;
	}
	rb->adopted = true;
	redis_hosted_here = rb;
	return rb->epfd;
}

int
redis_loop_host_turn(struct redis_backend *rb, bool poll)
{
	bool stop;
	int wait_ms = turn(rb, poll, 0, &stop);

	/* The host sleeps next, in its own poll, unless calls came during
	 * the turn: a submit from another thread must wake it. */
	pthread_mutex_lock(&rb->qmu);
	if (rb->qhead != NULL)
		wait_ms = 0;
	else if (wait_ms != 0)
		rb->asleep = true;
	pthread_mutex_unlock(&rb->qmu);
	return wait_ms;
}

int
redis_loop_release(struct redis_backend *rb, char *err, size_t errlen)
{
	int rc;

	redis_hosted_here = NULL;
	pthread_mutex_lock(&rb->qmu);
	rb->handover = false;
	rb->asleep = false;
	pthread_mutex_unlock(&rb->qmu);
	if ((rc = pthread_create(&rb->thread, NULL, redis_loop_run, rb)) != 0) {
		snprintf(err, errlen, "redis: I/O thread: %s", strerror(rc));
		return -1;
	}
	rb->thread_started = true;
	pthread_setname_np(rb->thread, "rl-redis");
	return 0;
}
