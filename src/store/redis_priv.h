/*
 * redis_priv.h - what the files of the Redis store share and nothing else
 * sees: its tunables, its types (the backend, its nodes and connections,
 * batches) and the functions one of its files offers the others, grouped
 * by the file that defines them.  The store's public face is store/redis.h;
 * its design is told at the top of backend_redis.c.
 *
 * Included only by backend_redis.c and the src/store/redis_*.c files.
 *
 * Thread: everything here belongs to the store's I/O thread (redis_loop.c)
 * unless a comment says otherwise.  Other threads reach the store through
 * backend_submit() (the submission queue, under qmu), the circuit breaker
 * (under mu), the failure log and the metrics pointer (atomics).
 */
#ifndef RL_REDIS_PRIV_H
#define RL_REDIS_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "core/backend.h"
#include "core/redis_url.h"
#include "store/redis.h"
#include "store/redis_conn.h"
#include "store/slot_map.h"

/* The scripts of lua/ and their SHA1s, made by the Makefile. */
extern const char rl_lua_ratelimit[], rl_lua_ratelimit_sha[];
extern const char rl_lua_takeback[];
extern const char rl_lua_stats[], rl_lua_stats_sha[];
extern const char rl_lua_lease[];
extern const char rl_lua_override[]; /* docs/admin.md */
extern const char rl_lua_reset[];    /* docs/admin.md */

#define REDIS_CB_THRESHOLD	5 /* consecutive failures to open */
#define REDIS_CB_BACKOFF_MIN_MS 100
#define REDIS_CB_BACKOFF_MAX_MS 5000
#define REDIS_LOG_INTERVAL_US	1000000 /* one line per kind per second */
#define REDIS_NKINDS		(BACKEND_ERR_DEADLINE + 1)
#define REDIS_BATCH_CALLS	64     /* requests in one EVALSHA */
#define REDIS_BATCH_KEYS	512    /* keys in one EVALSHA */
#define REDIS_RECONNECT_US	100000 /* between connects of one slot */
#define REDIS_EVFD_TAG		UINT64_MAX
#define REDIS_SENTINEL_TAG	(UINT64_C(1) << 40) /* | sentinel index */
#define REDIS_SUB_TAG		(UINT64_C(1) << 41)
#define REDIS_REL_TAG		(UINT64_C(1) << 42)
#define REDIS_REL_RETRY_US	1000000	 /* between subscription attempts */
#define REDIS_REL_REFUSED_US	60000000 /* ... after a refusal */
#define REDIS_HUNG		"no reply within the timeout"
/* Script calls in flight at once, per primary.  Redis runs one script at
 * a time, so more would only wait there; calls that arrive meanwhile wait
 * here and leave together, in one call, when one comes back. */
#define REDIS_WINDOW	     8
#define REDIS_RETRY_US	     50000  /* after TRYAGAIN, CLUSTERDOWN */
#define REDIS_REDIRECTS_MAX  5	    /* MOVED / ASK followed per call */
#define REDIS_TOPOLOGY_US    100000 /* between topology questions */
#define REDIS_OPEN_BATCHES   64	    /* batches filled in one turn */
#define REDIS_WATCH_US	     500000 /* topology while the circuit is open */
#define REDIS_NODE_THRESHOLD 3	    /* lost connections to mark one down */

enum redis_mode { REDIS_SINGLE, REDIS_CLUSTER, REDIS_SENTINEL };

/* What a call is (set by backend_redis.c's submit, or by whoever makes
 * the call inside the store: split parts, take-backs). */
enum redis_call_kind {
	REDIS_CALL_REQUEST,  /* a request's checks: lua/ratelimit.lua */
	REDIS_CALL_PROBE,    /* readiness: PING */
	REDIS_CALL_TAKEBACK, /* Cluster: undo a split part */
	REDIS_CALL_STATS,    /* /record, /stats: lua/stats.lua */
	REDIS_CALL_LEASE,    /* /release, /renew: lua/lease.lua */
	REDIS_CALL_ADMIN     /* docs/admin.md: DEL, lua/override.lua */
};

enum redis_circuit {
	REDIS_CIRCUIT_CLOSED,
	REDIS_CIRCUIT_OPEN,
	REDIS_CIRCUIT_HALF_OPEN /* one trial call in flight */
};

enum redis_outcome {
	REDIS_OUTCOME_OK,
	REDIS_OUTCOME_FAIL,
	REDIS_OUTCOME_NEUTRAL, /* says nothing about Redis */
	REDIS_OUTCOME_GAVE_UP  /* nothing either: the caller's own deadline
				* passed first; a trial so ended waits the
				* backoff again (not doubled) */
};

struct redis_node;
struct redis_split;

/* One connection and what the loop knows of it.  Owned by its node (or
 * by the sentinels, or the release subscription). */
struct redis_slot {
	struct redis_node *node;
	struct redis_conn *conn;
	int reg_fd; /* registered with epoll, or -1 */
	uint64_t reg_gen;
	uint32_t reg_events;
	int64_t next_connect_us; /* no new connect before */
	bool busy;		 /* counted in the pool gauge */
};

/* One server and its connections.  Owned by the backend (rb->nodes);
 * lives until the backend is freed. */
struct redis_node {
	struct redis_backend *rb;
	size_t index;
	char host[SLOT_MAP_HOST_MAX];
	struct redis_url url; /* the config's, at host:port */
	struct redis_conn_config ccfg;
	struct redis_slot *conns;
	size_t nconns;

	/* Cluster: the breaker of this primary alone (the others keep
	 * deciding while it is down; redis_circuit.c). */
	bool primary;	       /* owns a slot in the map now */
	int failures;	       /* consecutive lost connections */
	int64_t down_until_us; /* calls fail at once until then */
	int64_t backoff_us;
};

/* One EVALSHA (or PING, or take-back) in flight.  Made by redis_route.c,
 * freed by the reply (redis_reply.c) or by whoever parks or fails it
 * before it is sent.  Its calls are borrowed from their callers. */
struct redis_batch {
	struct redis_backend *rb;
	struct redis_slot *slot; /* sent on; NULL before */
	size_t ncalls, live;	 /* live: calls not answered yet */
	size_t deadlined;	 /* calls that left by their caller's own
				  * deadline (BACKEND_ERR_DEADLINE) */
	int kind;		 /* REDIS_CALL_* of every call in it */
	bool resent, counted;
	int hslot;		       /* Cluster: its keys' slot; else -1 */
	int ask_node;		       /* ASK: send there once; else -1 */
	struct redis_batch *next_free; /* in rb->free_batches */
	/* Filled up to ncalls; redis_batch_new() clears what is above. */
	struct backend_call *calls[REDIS_BATCH_CALLS]; /* NULL: answered */
	size_t counts[REDIS_BATCH_CALLS];
};

/* Sentinel mode: who to ask where the primary is (redis_sentinel.c). */
struct redis_sentinels {
	char *master;
	size_t n;
	struct redis_url *urls; /* host:port and password */
	struct redis_conn_config *cfgs;
	struct redis_slot *q;	   /* for questions, one per sentinel */
	struct redis_slot sub;	   /* SUBSCRIBE +switch-master */
	size_t ask_next, sub_next; /* which sentinel is asked next */
	bool asking, ask_wanted, subscribed, sub_wanted;
	int64_t next_ask_us, next_sub_us;
	bool known;	/* node 0 is the primary they named */
	bool doubted;	/* ... but its ROLE said otherwise: unknown until
			 * they name one again */
	bool confirmed; /* its ROLE said "master" since it was named: one
			 * that says otherwise later has been demoted */
};

/* The store.  Made by backend_redis_new(), freed by its ops' free. */
struct redis_backend {
	struct backend base; /* first: we are a struct backend */
	enum redis_mode mode;
	struct redis_url url; /* credentials (and the single node) */
	char *shown_url;      /* redacted, for messages */
	int64_t timeout_us;
	size_t pool_size;

	/* TLS (redis_tls.h): NULL when no connection uses it; for the data
	 * nodes (a rediss:// URL or redis.tls), and for the sentinels
	 * (redis.sentinel.tls). */
	struct redis_tls *tls;
	bool tls_nodes, tls_sentinels;

	struct redis_node **nodes;
	size_t nnodes;

	/* Cluster: the slot map, and asking for a new one. */
	struct slot_map map;
	int16_t last_owner[SLOT_MAP_SLOTS]; /* the map before */
	size_t nprimaries;		    /* nodes that own slots */
	bool refresh_wanted, refreshing;
	int64_t next_watch_us; /* topology while the circuit is open */
	size_t refresh_next;   /* node asked next */
	int64_t next_refresh_us;

	struct redis_sentinels sentinels;

	/* Releases of leases (backend_redis_watch_releases()): the I/O
	 * thread's subscription to rel_channel on one node.  rel_fn and
	 * rel_arg are set once, under qmu, at start-up (before any client's
	 * request; the overrides sync may have made calls already): the
	 * subscription begins at the next turn that sees them. */
	backend_released_fn rel_fn;
	void *rel_arg;
	char *rel_channel; /* "<key_prefix>released" */
	struct redis_slot rel;
	struct redis_conn_config rel_cfg;
	size_t rel_node; /* the node subscribed to (Cluster: one that
			  * owned slots when the map last said), or next */
	bool rel_started, rel_wanted;
	bool rel_refused; /* the last SUBSCRIBE was refused */
	int64_t next_rel_us;

	/* Take-backs done (backend_redis_watch_takebacks()): set once,
	 * under qmu, before the first request; called on the I/O thread. */
	backend_released_fn tb_fn;
	void *tb_arg;

	pthread_t thread;
	bool thread_started; /* the store's own I/O thread runs; false
			      * while an event loop hosts the I/O */
	int epfd, evfd;

	pthread_mutex_t qmu; /* guards the submission queue */
	struct backend_call *qhead, *qtail;
	bool stopping;
	bool handover; /* an event loop adopts the I/O: the own
			* thread ends (redis_loop_adopt()) */
	bool adopted;  /* ever hosted (the I/O thread's or host's) */
	bool asleep;   /* the I/O thread waits, or is about to, with
			* nothing queued: a submit must wake it (evfd);
			* else it takes the queue on its next turn */

	/* The I/O thread's: calls sent, parked or about to be sent, by
	 * deadline; calls held back while the window of script calls is
	 * full (FIFO). */
	struct backend_call *fhead, *ftail;
	struct backend_call *hhead, *htail;
	int64_t hmin_us; /* no held call's deadline is earlier
			  * (INT64_MAX: none held) */
	struct backend_call *shead, *stail; /* to route next turn */
	size_t batches_out;		    /* script calls in flight */
	size_t parked;			    /* calls in flight with no batch */
	struct redis_batch *free_batches;   /* kept by redis_batch_free */
	size_t nfree_batches;
	int64_t unpark_us; /* send parked calls then; 0: never */
	bool closing;	   /* the thread is stopping */

	pthread_mutex_t mu; /* guards the circuit */
	enum redis_circuit circuit;
	int failures;	       /* consecutive */
	int64_t backoff_ms;    /* of the next opening */
	int64_t open_until_us; /* monotonic; when OPEN */

	/* Borrowed; may be NULL.  Set by backend_redis_set_metrics() on
	 * another thread while this one runs: atomic. */
	struct metrics *_Atomic metrics;

	_Atomic int64_t last_log_us[REDIS_NKINDS]; /* INT64_MIN: never */
	atomic_long suppressed[REDIS_NKINDS];
};

/* Why a call waits in the deadline list with no batch (parked), told
 * when it expires so: the first (0) is the default. */
enum redis_park {
	REDIS_PARK_NO_PRIMARY,	/* no primary known for its keys */
	REDIS_PARK_UNWRITTEN,	/* Sentinel: never sent, waits for the
				 * primary the sentinels name */
	REDIS_PARK_TRYAGAIN,	/* its slot is being migrated and its keys
				 * are split between two nodes */
	REDIS_PARK_CLUSTERDOWN, /* the cluster said CLUSTERDOWN */
	REDIS_PARK_LOADING,	/* the node is loading its data */
	REDIS_PARK_MASTERDOWN,	/* the node said MASTERDOWN */
	REDIS_PARK_READONLY	/* the node became a replica */
};

/*
 * What the store keeps about a call while it is in its hands, in the
 * call's own store area (core/backend.h: struct backend_call_store), so a
 * call costs no allocation.  Set by submit (backend_redis.c), or by
 * redis_split.c for the calls it makes; the I/O thread's from then on.
 */
struct redis_call_priv {
	struct backend_call *next, *prev; /* the list it is on */
	struct redis_batch *batch;	  /* sent or about to be; NULL: none */
	struct redis_split *split;	  /* Cluster: a part's or take-back's */
	bool trial;			  /* the half-open circuit's trial */
	bool caller_deadline;		  /* deadline_us is the caller's,
					   * earlier than redis.timeout's */
	bool alone;			  /* Cluster: in a batch of its own
					   * (a batch it was in met
					   * TRYAGAIN) */
	unsigned char kind;		  /* enum redis_call_kind */
	unsigned char redirects;	  /* Cluster: MOVED / ASK followed */
	unsigned char parked;		  /* enum redis_park: why it waits
					   * with no batch */
	unsigned short at;		  /* Cluster: 1 + the index of the
					   * node it was last sent to (0:
					   * none), named by the log */
};

_Static_assert(sizeof(struct redis_call_priv) <=
	sizeof(struct backend_call_store),
    "struct redis_call_priv does not "
    "fit in a call's store area (BACKEND_CALL_STORE_SIZE)");
_Static_assert(_Alignof(struct redis_call_priv) <=
	_Alignof(struct backend_call_store),
    "struct redis_call_priv needs "
    "more alignment than a call's store area has");

/* The store's part of call (submitted to this store, or made by it). */
static inline struct redis_call_priv *
redis_call(struct backend_call *call)
{
	return (struct redis_call_priv *)(void *)call->store.opaque;
}

/* The batches being filled in one turn of the loop (redis_route.c). */
struct redis_turn;

/* ---- redis_circuit.c: the breakers and the failure log ---------------- */

/* Log msg at most once a second per kind.  Any thread, lock-free.  The
 * line names the store (a single Redis, the master of Sentinel, the first
 * seed of Cluster); redis_log_node_failure()'s names node (host:port) when
 * not NULL, for a line about that node alone. */
void redis_log_failure(struct redis_backend *rb, enum backend_error_kind kind,
    const char *msg);
void redis_log_node_failure(struct redis_backend *rb,
    const struct redis_node *node, enum backend_error_kind kind,
    const char *msg);
/* May this call go to Redis?  Sets *trial when it is the half-open trial.
 * Returns 0, or -1 when the circuit is open.  Any thread. */
int redis_circuit_enter(struct redis_backend *rb, bool *trial);
/* The topology changed: an open circuit tries again at once.  Returns
 * whether it was open.  Any thread. */
bool redis_circuit_kick(struct redis_backend *rb);
/* Account for the outcome of a call let through by redis_circuit_enter.
 * Any thread. */
void redis_circuit_leave(struct redis_backend *rb, bool trial,
    enum redis_outcome outcome);
/* What a call's end (rc, kind) tells the store's circuit.  Under Cluster
 * a failure counts only while no primary is known (no slot map: the
 * seeds cannot be reached); else it is neutral, a primary that fails
 * being its own breaker's business.  The I/O thread. */
enum redis_outcome redis_circuit_outcome(const struct redis_backend *rb, int rc,
    enum backend_error_kind kind);
/* Cluster, one primary's breaker: a connection to node was lost; node
 * answered (anything: the cluster is heard); node owns no slot any more
 * (its breaker is forgotten); whether a call for node fails at once now;
 * whether some primary is marked down (the topology is then watched). */
void redis_circuit_node_failed(struct redis_backend *rb,
    struct redis_node *node);
void redis_circuit_node_answered(struct redis_backend *rb,
    struct redis_node *node);
void redis_circuit_node_forget(struct redis_node *node);
bool redis_circuit_node_is_down(const struct redis_node *node, int64_t now);
bool redis_circuit_any_node_down(const struct redis_backend *rb);

/* ---- redis_flight.c: the calls in the I/O thread's hands --------------- */

/* Into / out of the deadline-sorted list of calls in flight. */
void redis_flight_add(struct redis_backend *rb, struct backend_call *call);
void redis_flight_remove(struct redis_backend *rb, struct backend_call *call);
/* Route call at the next turn, whatever the window (FIFO). */
void redis_flight_soon(struct redis_backend *rb, struct backend_call *call);
/* Answer call: out of the list and its batch, the circuit told, its done
 * run.  rc 0 means out[] and all_allowed are filled in already. */
void redis_flight_finish(struct redis_backend *rb, struct backend_call *call,
    int rc, enum backend_error_kind kind, const char *err);
/* Fail call, whose deadline has passed, with err: BACKEND_ERR_TIMEOUT, or
 * BACKEND_ERR_DEADLINE when that deadline was the caller's own, earlier
 * than redis.timeout's (neither logged nor counted by the circuit). */
void redis_flight_expire(struct redis_backend *rb, struct backend_call *call,
    const char *err);
/* Fail every call of b that is still waiting (b stays the caller's). */
void redis_flight_fail(struct redis_batch *b, enum backend_error_kind kind,
    const char *err);
/* Take the calls still waiting out of b and park them until unpark_us (0:
 * until the topology is next known); a call redirected too often fails.
 * redis_flight_park_for() says why (enum redis_park; redis_flight_park()
 * parks for want of a primary). */
void redis_flight_park(struct redis_batch *b, int64_t unpark_us,
    bool redirected);
void redis_flight_park_for(struct redis_batch *b, int64_t unpark_us,
    bool redirected, enum redis_park why);
/* b met TRYAGAIN: its calls go alone from now on; when it held several,
 * each is routed again at the next turn, else the one is parked for
 * REDIS_RETRY_US.  b keeps none (the caller frees it). */
void redis_flight_tryagain(struct redis_batch *b);
/* The node a line about call is about (Cluster: the one it was on, or
 * last sent to), or NULL: the line is about the store as a whole. */
const struct redis_node *redis_flight_node(const struct redis_backend *rb,
    const struct backend_call *call);
/* Send every parked call again, at the next turn. */
void redis_flight_unpark_all(struct redis_backend *rb);
/* b's command never left (s, the slot it was on, closed before writing
 * it; or none could take it, s NULL; why says which): under Sentinel its
 * calls are parked for the primary the sentinels name next, which they
 * are asked for, and true is returned; else false, and the caller fails
 * them.  False too when s's connection (without s, the primary's first)
 * was refused in its handshake (redis_conn_refused()): it would be
 * again. */
bool redis_flight_requeue(struct redis_batch *b, struct redis_slot *s,
    const char *why);

/* ---- redis_node.c: servers, their connections, where a call goes ------ */

/* Recount whether s has commands in flight, for the pool gauge. */
void redis_slot_busy(struct redis_backend *rb, struct redis_slot *s);
/* A node at host:port (host "" while unknown) with pool_size closed
 * connections, as rb->nodes[rb->nnodes].  0 or -1 (OOM). */
int redis_node_add(struct redis_backend *rb, const char *host, int port);
/* Close every connection of node; their calls fail with why. */
void redis_node_close(struct redis_backend *rb, struct redis_node *node,
    const char *why);
/* The node for a call of hash slot hslot (-1: not cluster), or -1 when
 * none is known now. */
int redis_node_for(struct redis_backend *rb, int hslot);
/* Ask for the topology again (rate-limited by the loop). */
void redis_node_want_topology(struct redis_backend *rb);
/* Queue one command on a connection of node (connecting if need be).
 * Returns the slot, or NULL with err. */
struct redis_slot *redis_node_send(struct redis_backend *rb,
    struct redis_node *node, int argc, const char **argv, const size_t *lens,
    redis_reply_fn fn, void *arg, char *err, size_t errlen);
/* "host:port" (the port after the last ':', [v6] unbracketed) into host
 * and *port.  0 or -1. */
int redis_hostport_parse(const char *s, char *host, size_t hostlen, int *port);

/* ---- redis_batch.c: a batch into commands on a connection -------------- */

/* Send b to its node.  0; -1 with err (nothing sent; b intact); or 1 when
 * no node is known for it now (nothing sent; the caller parks it). */
int redis_batch_send(struct redis_backend *rb, struct redis_batch *b, char *err,
    size_t errlen);
/* b's script was not loaded where it went (NOSCRIPT on s): send it once
 * more so that it loads.  0, or -1 with err. */
int redis_batch_reload(struct redis_backend *rb, struct redis_batch *b,
    struct redis_slot *s, char *err, size_t errlen);
/* Drop the answered calls from b, so it can be encoded again. */
void redis_batch_compact(struct redis_batch *b);
/* An empty batch for calls of kind to hslot (-1: any), or NULL when out
 * of memory. */
struct redis_batch *redis_batch_new(struct redis_backend *rb, int kind,
    int hslot);
/* b is done with: out of the window, kept for redis_batch_new() or
 * freed. */
void redis_batch_free(struct redis_batch *b);
/* Free the batches kept (the store is being freed). */
void redis_batch_free_kept(struct redis_backend *rb);

/* ---- redis_reply.c: what a reply means --------------------------------- */

/* The reply to batch arg (r NULL with err when its connection closed):
 * completes its calls, or sends it again, and frees it. */
void redis_reply_batch(void *arg, redisReply *r, const char *err);
/* For replies that matter not (SCRIPT LOAD, ASKING). */
void redis_reply_ignore(void *arg, redisReply *r, const char *err);

/* ---- redis_route.c: calls into batches --------------------------------- */

/* Route a list of calls (linked by redis_call()->next), then send every
 * batch. */
void redis_route_dispatch(struct redis_backend *rb, struct backend_call *list);
/* Put one call into a batch of turn t, or park or fail it. */
void redis_route_call(struct redis_backend *rb, struct redis_turn *t,
    struct backend_call *call);

/* ---- redis_cluster.c: slot map, redirections, requests across slots ---- */

/* The seeds of redis.cluster as the first nodes.  0 or -1 with err. */
int redis_cluster_init(struct redis_backend *rb, const struct redis_config *rc,
    char *err, size_t errlen);
/* A node for every address the slot map knows.  0 or -1 (OOM). */
int redis_cluster_sync_nodes(struct redis_backend *rb);
/* Ask the next node for the slot map. */
void redis_cluster_refresh(struct redis_backend *rb);
/* Mark the nodes that own a slot in the map now as primaries (a node that
 * no longer does forgets its breaker); returns how many do. */
size_t redis_cluster_mark_primaries(struct redis_backend *rb);
/* Readiness: every slot has a primary and none is marked down.  false
 * with msg saying why. */
bool redis_cluster_ready(const struct redis_backend *rb, char *msg,
    size_t msglen);
/* A probe: PING every primary but node skip, so that one that died while
 * idle is marked down by its breaker (docs/scale.md). */
void redis_cluster_ping_primaries(struct redis_backend *rb, int skip);
/* The first node from `from` on (in turn, wrapping round the nodes) that
 * owns a slot in the map, or -1 when none does (no map yet) or out of
 * memory. */
int redis_cluster_owner_from(struct redis_backend *rb, size_t from);
/* MOVED or ASK in reply to b: follow it.  1 when b was sent again (ASK),
 * 0 when its calls were parked (MOVED: b is done with), -1 when it is no
 * redirection or cannot be followed (msg says why; b fails). */
int redis_cluster_redirect(struct redis_batch *b, const redisReply *r,
    char *msg, size_t msglen);
/* A request whose keys are in several slots: routed as one part each,
 * made all-or-nothing again (redis_split.h). */
void redis_cluster_split(struct redis_backend *rb, struct redis_turn *t,
    struct backend_call *call, const unsigned *slots);

/* ---- redis_sentinel.c: the primary the sentinels name ------------------ */

/* The sentinels of redis.sentinel, node 0 waiting for a primary.  0 or -1
 * with err. */
int redis_sentinel_init(struct redis_backend *rb, const struct redis_config *rc,
    char *err, size_t errlen);
/* Ask the next sentinel for the primary. */
void redis_sentinel_ask(struct redis_backend *rb);
/* Subscribe to +switch-master on the next sentinel. */
void redis_sentinel_subscribe(struct redis_backend *rb);

/* ---- redis_releases.c: hearing lease releases (docs/leases.md) --------- */

/* Subscribe to the release channel, on the primary (Cluster: the next
 * node), or try again later. */
void redis_releases_subscribe(struct redis_backend *rb);

/* ---- redis_loop.c: the I/O thread -------------------------------------- */

/* The I/O thread's body (arg: the backend) until rb->stopping, when it
 * answers every call left before it returns, or until an event loop
 * adopts the I/O (rb->handover). */
void *redis_loop_run(void *arg);
/* The store's I/O on an event loop's thread (core/backend.h, host_*):
 * adopt stops the store's own thread and returns the epoll fd the loop
 * polls; the loop then runs host_turn when it is readable or its last
 * delay passed; release starts the own thread again (0, or -1 with err).
 * All three on the hosting thread, which redis_hosted_here names. */
int redis_loop_adopt(struct redis_backend *rb);
int redis_loop_host_turn(struct redis_backend *rb, bool poll);
int redis_loop_release(struct redis_backend *rb, char *err, size_t errlen);
/* Answer every call left, as failed: the store stops (redis_free() when
 * no thread of the store's runs). */
void redis_loop_close_all(struct redis_backend *rb);
extern _Thread_local struct redis_backend *redis_hosted_here;

#endif
