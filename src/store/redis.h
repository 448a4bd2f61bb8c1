/*
 * redis.h - the Redis store (backend_redis.c and the redis_*.c files it is
 * made of): a pool of connections on one I/O thread, calls batched into
 * script calls, Cluster routing and Sentinel discovery, behind the
 * core/backend.h interface.
 */
#ifndef RL_STORE_REDIS_H
#define RL_STORE_REDIS_H

#include "core/backend.h"

struct redis_config;
/*
 * The Redis store: a pool of pool_size connections to rc->url, each call
 * bounded by rc->timeout_ms.  Connections are made lazily and remade after
 * errors, so this succeeds with Redis down.  Returns a new backend, or NULL
 * with a message in err (bad URL, unreadable password_file, OOM).
 * rc is copied.
 */
struct backend *backend_redis_new(const struct redis_config *rc, char *err,
    size_t errlen);

/*
 * Tell fn(arg, key, keylen) when a lease of key (a full store key) is
 * released through any daemon on the same Redis (docs/leases.md):
 * lua/lease.lua PUBLISHes the key on "<key_prefix>released", and the
 * store keeps a subscription to it (on the primary; under Cluster on any
 * node, which hears every PUBLISH).  key is NULL when releases may have
 * gone unheard (the subscription was down and is back).  fn runs on the
 * store's I/O thread and must be quick; arg must outlive the store.
 * Start-up, once, before any client's request (calls of the daemon's own,
 * such as the overrides sync's reads, may come before).
 */
typedef void (*backend_released_fn)(void *arg, const char *key, size_t keylen);
void backend_redis_watch_releases(struct backend *b, backend_released_fn fn,
    void *arg);

/*
 * Tell fn(arg, key, keylen) when units a request recorded on key (a full
 * store key) were taken back: under Redis Cluster, a request split across
 * slots that another slot denied (lua/takeback.lua, docs/algorithms.md).
 * fn runs on the store's I/O thread once the take-back's reply came (or it
 * failed: its units may be back all the same), possibly after the request
 * was answered; it must be quick, and arg must outlive the store.
 * Start-up, once, before the first call.
 */
void backend_redis_watch_takebacks(struct backend *b, backend_released_fn fn,
    void *arg);

/*
 * --check: read the files of rc->tls (docs/configuration.md) as the store
 * would, when rc asks for TLS.  Returns 0, or -1 with err and *bad at the
 * file that failed (its line and column), or NULL when none is to blame.
 * Any thread.
 */
struct tls_file;
int backend_redis_check_tls(const struct redis_config *rc,
    const struct tls_file **bad, char *err, size_t errlen);

/*
 * Reload: read the files of rc->tls again, so that new connections use
 * them (open ones keep theirs).  A no-op returning 0 for a store that
 * uses no TLS.  On failure, -1 with err and *bad as above, and the store
 * keeps what it had.  Any thread.
 */
int backend_redis_reload_tls(struct backend *b, const struct redis_config *rc,
    const struct tls_file **bad, char *err, size_t errlen);

/* Count pool use in m (borrowed; set before the first call).  Start-up. */
struct metrics;
void backend_redis_set_metrics(struct backend *b, struct metrics *m);

#endif
