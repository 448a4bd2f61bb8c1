/*
 * http.h - the HTTP front end (docs/http.md) on libmicrohttpd: POST
 * /acquire, /auth, /healthz, /readyz, /metrics.
 *
 * The server holds the current config snapshot.  Each request takes a
 * reference to the snapshot when it starts and drops it when it completes,
 * so http_server_set_config() (a reload) never changes the rules under a
 * request in flight.
 */
#ifndef RL_HTTP_H
#define RL_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/decide.h"

struct http_server;

/* Counts and renders what http.c observes; see metrics.h.  May be NULL. */
struct metrics;

/*
 * Start serving on listen_fd (ownership passes to the server) with
 * cfg->threads event-loop threads.  Takes one reference to cfg.  The
 * decider, the queues of requests waiting for a lease (lease_wait.h; the
 * server cuts them when it stops) and metrics are borrowed for the
 * server's life (the decider's stores must outlive it).  Returns the
 * server, or NULL with a message in err.
 */
struct lease_wait;
struct http_server *http_server_start(int listen_fd, struct config *cfg,
    const struct decider *decider, struct lease_wait *leases,
    struct metrics *metrics, char *err, size_t errlen);

/* Publish a new snapshot (takes one reference; drops the old one). */
void http_server_set_config(struct http_server *s, struct config *cfg);

/* The current snapshot with one reference for the caller. */
struct config *http_server_get_config(struct http_server *s);

/* Stop accepting connections; requests in progress go on, and every
 * answer from now on closes its connection. */
void http_server_quiesce(struct http_server *s);

/* End the drain's waits now (a second stop signal, docs/operations.md):
 * every request still waiting for its turn or a lease is answered 503
 * shutting_down at once, as one due after shutdown_timeout is.  Any
 * thread; after http_server_quiesce(). */
void http_server_cut(struct http_server *s);

/* Requests being processed now. */
int http_server_inflight(struct http_server *s);

/* Answer what waits for the store, stop every thread, close every
 * connection, free.  NULL does nothing. */
void http_server_stop(struct http_server *s);

#endif
