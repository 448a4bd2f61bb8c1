/*
 * metrics.h - counters and histograms for GET /metrics, rendered in the
 * Prometheus text exposition format 0.0.4.
 *
 * Every metrics_* recording function may be called from any thread at any
 * rate: counters are atomics, and the per-rule table is read-mostly.  A
 * NULL struct metrics * makes every function a no-op, so modules and tests
 * need not care whether metrics are on.
 */
#ifndef RL_METRICS_H
#define RL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/decide.h"

struct metrics;

/* New, empty metrics; NULL on OOM.  metrics_free(NULL) does nothing. */
struct metrics *metrics_new(void);
void metrics_free(struct metrics *m);

/* One HTTP response with this status. */
void metrics_http_response(struct metrics *m, int status);

/* One applying rule's outcome (a decide_rule_fn; arg is the metrics),
 * decided for HTTP, or for gRPC (the protocol label). */
void metrics_rule_decision(const struct rule *r,
    enum decide_rule_result result, void *arg);
void metrics_rule_decision_grpc(const struct rule *r,
    enum decide_rule_result result, void *arg);

/* One value recorded into stat `stat` (CONTRACT 9). */
void metrics_stat_record(struct metrics *m, const char *stat);

/* The gRPC front end is on: render its series.  Start-up. */
void metrics_set_grpc(struct metrics *m);

/* One gRPC call answered with this status code (0 OK .. 16). */
void metrics_grpc_response(struct metrics *m, int code);

/* One backend call that took `usec` microseconds and failed with `kind`
 * (BACKEND_ERR_NONE for success). */
void metrics_backend_call(struct metrics *m, const char *backend,
    int64_t usec, enum backend_error_kind kind);

/* Requests held by the HTTP front end with wait_ms (CONTRACT 10, 11):
 * until their reserved turn, or until a lease is freed (a gauge); and
 * requests decided at once because max_waiting were waiting. */
enum metrics_wait { METRICS_WAIT_TURN, METRICS_WAIT_LEASE };
void metrics_waiting(struct metrics *m, enum metrics_wait w, int delta);
void metrics_wait_full(struct metrics *m);

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

/* Render the deny cache's hits (borrowed; set before serving). */
struct deny_cache;
void metrics_set_deny_cache(struct metrics *m, const struct deny_cache *dc);

/* One config reload, successful or not. */
void metrics_reload(struct metrics *m, bool ok);

/* Render everything into a new NUL-terminated buffer (*out, caller frees
 * with rl_free) of *len bytes.  0 or -1 (OOM). */
int metrics_render(struct metrics *m, char **out, size_t *len);

#endif
