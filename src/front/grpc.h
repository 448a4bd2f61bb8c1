/*
 * grpc.h - the gRPC front end (docs/grpc.md): HTTP/2 cleartext on
 * libnghttp2, the unary envoy.service.ratelimit.v3.RateLimitService/
 * ShouldRateLimit (mapped by rls.c onto the one decision path) and
 * grpc.health.v1.Health/Check.
 *
 * `threads` event loops (as many as HTTP has) share the listener, each
 * running its own connections on its own epoll; decisions go to the store
 * as HTTP's do and come back through a queue the connection's loop
 * drains, so no thread waits for Redis.  The server holds the current config
 * snapshot; each call takes a reference when it starts and drops it when
 * it is answered (a reload never changes the rules under a call).
 */
#ifndef RL_GRPC_H
#define RL_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/decide.h"

struct grpc_server;
struct metrics;

/*
 * Serve on listen_fd (a listening socket; ownership passes to the server)
 * with cfg->threads threads (start-only).  Takes one reference to cfg.  decider
 * (its on_rule hook counts decisions as gRPC's) and metrics (may be NULL) are
 * borrowed for the server's life.  Returns the server, or NULL with a message
 * in err.  Start-up.
 */
struct grpc_server *grpc_server_start(int listen_fd, struct config *cfg,
    const struct decider *decider, struct metrics *metrics, char *err,
    size_t errlen);

/* Publish a new snapshot (takes one reference; drops the old one). */
void grpc_server_set_config(struct grpc_server *s, struct config *cfg);

/* Stop accepting; tell every client to go away (GOAWAY) once its calls in
 * progress are answered.  Any thread. */
void grpc_server_quiesce(struct grpc_server *s);

/* Calls in progress (received, not yet answered).  Any thread. */
int grpc_server_inflight(struct grpc_server *s);

/* After grpc_server_quiesce(): has every loop sent its GOAWAYs and every
 * connection closed (each once its calls are answered and the client has
 * closed too, or a second after the server's close)?  True for NULL.
 * Any thread. */
bool grpc_server_drained(struct grpc_server *s);

/* Wait for the calls in the store's hands (each ends by its deadline),
 * close every connection, stop the thread, free.  NULL does nothing. */
void grpc_server_stop(struct grpc_server *s);

/*
 * For tests/fuzz/fuzz_grpc_frames.c: feed len bytes, as read from one
 * client, to a new connection's HTTP/2 session with the server's own
 * callbacks, no socket and no thread (what it writes is dropped), under
 * cfg (borrowed); calls are decided by decider, whose store must answer
 * inside the call (the memory store).  Everything is freed before it
 * returns.  0, or -1 when out of memory.  The calling thread only.
 */
int grpc_fuzz_feed(struct config *cfg, const struct decider *decider,
    const uint8_t *data, size_t len);

#endif
