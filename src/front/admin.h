/*
 * admin.h - the admin API (docs/admin.md): the admin paths on their own
 * listener, `admin_listen`, apart from the main one, so that a network that can
 * reach /acquire cannot reach what changes limits.  With
 * `admin_token_file`, every request needs `Authorization: Bearer
 * <token>`.
 *
 * The admin API is its own libmicrohttpd daemon, one thread per
 * connection (at most ADMIN_MAX_CONNECTIONS): operators' calls are rare,
 * and a thread that may wait for the store (a counter read, an override
 * written to Redis) keeps the code straight where the main front end must
 * never wait.
 *
 * Threads: start, set_config and stop on the main thread; requests on the
 * daemon's own threads.
 */
#ifndef RL_ADMIN_H
#define RL_ADMIN_H

#include <stddef.h>

#include "core/config.h"
#include "core/decide.h"

#define ADMIN_MAX_CONNECTIONS 16

struct admin_server;
struct lease_wait;
struct metrics;
struct overrides;

/*
 * Serve the admin API on listen_fd (ownership passes to the server).
 * Takes one reference to cfg.  decider (its stores), overrides, leases
 * (the requests waiting for a lease, woken when a reset frees one) and
 * metrics are borrowed for the server's life; overrides and leases may be
 * NULL.  token (NULL: no token asked) is copied.  Returns the server, or
 * NULL with a message in err.
 */
struct admin_server *admin_server_start(int listen_fd, struct config *cfg,
    const struct decider *decider, struct overrides *overrides,
    struct lease_wait *leases, struct metrics *metrics, const char *token,
    char *err, size_t errlen);

/* Publish a new snapshot (takes one reference; drops the old one). */
void admin_server_set_config(struct admin_server *s, struct config *cfg);

/* Stop: close the listener and every connection, free.  NULL: nothing. */
void admin_server_stop(struct admin_server *s);

#endif
