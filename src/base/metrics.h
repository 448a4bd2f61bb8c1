/*
 * metrics.h - counters and histograms for GET /metrics, rendered in the
 * Prometheus text exposition format 0.0.4.
 *
 * Every metrics_* recording function may be called from any thread at any
 * rate: counters are atomics, and the per-rule table is read-mostly.  A
 * NULL struct metrics * makes every function a no-op, so modules and tests
 * need not care whether metrics are on.
 *
 * This is the base floor: it knows nothing of rules, decisions or stores.
 * Its callers hand it names and its own label enums below; main.c wires
 * the decision path's hooks to it (docs/architecture.md).
 */
#ifndef RL_METRICS_H
#define RL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct metrics;

/* New, empty metrics; NULL on OOM.  metrics_free(NULL) does nothing. */
struct metrics *metrics_new(void);
void metrics_free(struct metrics *m);

/* One HTTP response with this status. */
void metrics_http_response(struct metrics *m, int status);

/* The outcome of one applying rule (the label result=). */
enum metrics_outcome {
	METRICS_ALLOWED,
	METRICS_DENIED,
	METRICS_SHADOW_DENIED,
	METRICS_DEGRADED,
	METRICS_ERROR,
	METRICS_NOUTCOMES
};

/* Which front end decided (the label protocol=). */
enum metrics_protocol { METRICS_HTTP, METRICS_GRPC, METRICS_NPROTOCOLS };

/* One applying rule, named rule (borrowed for the call), had outcome o in
 * a decision asked over protocol p.  Unknown values are ignored. */
void metrics_decision(struct metrics *m, enum metrics_protocol p,
    const char *rule, enum metrics_outcome o);

/* Units of quota taken in advance (docs/algorithms.md, "Taking quota in
 * advance"), the label event= of ratelimitd_prefetch_units_total: taken
 * by this daemon in chunks beyond the requests that took them, used by
 * requests admitted in process, or lost (the hold ended, a reload, no room
 * to keep them).  Any thread. */
enum metrics_prefetch {
	METRICS_PREFETCH_TAKEN,
	METRICS_PREFETCH_USED,
	METRICS_PREFETCH_LOST,
	METRICS_PREFETCH_NEVENTS
};
void metrics_prefetch(struct metrics *m, const char *rule,
    enum metrics_prefetch ev, uint64_t units);

/* One value recorded into stat `stat` (docs/stats.md). */
void metrics_stat_record(struct metrics *m, const char *stat);

/* The gRPC front end is on: render its series.  Start-up. */
void metrics_set_grpc(struct metrics *m);

/* One gRPC call answered with this status code (0 OK .. 16). */
void metrics_grpc_response(struct metrics *m, int code);

/* Why a store call failed (the label kind= of the error counter). */
enum metrics_store_error {
	METRICS_STORE_OK,
	METRICS_STORE_CONNECT,
	METRICS_STORE_TIMEOUT,
	METRICS_STORE_PROTOCOL,
	METRICS_STORE_FULL,
	METRICS_STORE_CIRCUIT_OPEN,
	METRICS_STORE_TLS,
	METRICS_STORE_NERRORS
};

/* One call to the store named backend ("redis" or "memory"; others are
 * ignored) that took usec microseconds and ended with e. */
void metrics_backend_call(struct metrics *m, const char *backend, int64_t usec,
    enum metrics_store_error e);

/*
 * Where a request that asked a networked store (Redis) spent its time in
 * the daemon, one histogram per phase (docs/operations.md):
 *   prepare  HTTP: from the request's arrival (its headers read) to the
 *            store call's submit: the body, the rules, the keys
 *   queue    from submit to the store writing the call's command
 *   store    from that write to the reply, read and decided
 *   resume   HTTP: from the reply to the loop answering
 */
enum metrics_phase {
	METRICS_PHASE_PREPARE,
	METRICS_PHASE_QUEUE,
	METRICS_PHASE_STORE,
	METRICS_PHASE_RESUME,
	METRICS_NPHASES
};
void metrics_phase(struct metrics *m, enum metrics_phase p, int64_t usec);

/* Requests held by the HTTP front end with wait_ms (docs/waiting.md,
 * docs/leases.md): until their reserved turn, or until a lease is freed (a
 * gauge); and requests decided at once because max_waiting were waiting. */
enum metrics_wait { METRICS_WAIT_TURN, METRICS_WAIT_LEASE };
void metrics_waiting(struct metrics *m, enum metrics_wait w, int delta);
void metrics_wait_full(struct metrics *m);

/* What a usage report (POST /report) did (the label result=). */
enum metrics_report {
	METRICS_REPORT_WITHIN,	   /* recorded, every rule within its limit */
	METRICS_REPORT_OVERDRAWN,  /* recorded, some rule past its limit */
	METRICS_REPORT_UNRECORDED, /* the store failed: nothing recorded */
	METRICS_NREPORTS
};
void metrics_report(struct metrics *m, enum metrics_report r);

/* One write of the admin API (docs/admin.md; the label op=). */
enum metrics_admin_op {
	METRICS_ADMIN_OVERRIDE_SET,
	METRICS_ADMIN_OVERRIDE_DELETE,
	METRICS_ADMIN_COUNTER_RESET,
	METRICS_ADMIN_NOPS
};
void metrics_admin_write(struct metrics *m, enum metrics_admin_op op);

/* Connections to Redis with calls in flight now (a gauge). */
void metrics_pool_in_use(struct metrics *m, int delta);

/* Redis topology events: a MOVED or ASK redirection followed, a new slot
 * map read from the cluster, a new primary taken from the sentinels, and
 * a request's units taken back across slots. */
enum metrics_redis_event {
	METRICS_REDIS_MOVED,
	METRICS_REDIS_ASK,
	METRICS_REDIS_TOPOLOGY_REFRESH,
	METRICS_REDIS_FAILOVER,
	METRICS_REDIS_TAKEBACK,
	METRICS_REDIS_TAKEBACK_FAILED,
	METRICS_REDIS_NEVENTS
};
void metrics_redis_event(struct metrics *m, enum metrics_redis_event ev);

/* Render ratelimitd_deny_cache_hits_total as hits(arg): the deny cache's
 * counter, read at each scrape on the scraping thread (arg borrowed; set
 * before serving). */
typedef uint64_t (*metrics_count_fn)(const void *arg);
void metrics_set_deny_hits(struct metrics *m, metrics_count_fn hits,
    const void *arg);

/* One config reload, successful or not. */
void metrics_reload(struct metrics *m, bool ok);

/* Render everything into a new NUL-terminated buffer (*out, caller frees
 * with rl_free) of *len bytes.  0 or -1 (OOM). */
int metrics_render(struct metrics *m, char **out, size_t *len);

#endif
