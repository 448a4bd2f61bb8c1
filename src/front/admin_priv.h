/*
 * admin_priv.h - what the files of the admin API share (admin.h is the
 * outside's view):
 *
 *   admin.c        the server, the token, routing, /admin/config, answers
 *   admin_store.c  /admin/counters and /admin/overrides: the endpoints
 *                  that ask the store
 *
 * Threads: every function runs on the connection's own thread
 * (libmicrohttpd's thread per connection), which may wait for the store.
 */
#ifndef RL_ADMIN_PRIV_H
#define RL_ADMIN_PRIV_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <microhttpd.h>

#include "core/config_slot.h"
#include "core/decide.h"
#include "front/admin.h"

struct admin_server {
	struct MHD_Daemon *mhd;
	struct config_slot cfg;	       /* the snapshot served */
	const struct decider *decider; /* borrowed: its stores */
	struct overrides *overrides;   /* borrowed; may be NULL */
	struct lease_wait *leases;     /* borrowed; may be NULL */
	struct metrics *metrics;       /* borrowed; may be NULL */
	char *token;		       /* NULL: no token asked */
	size_t token_len;
};

/* --- admin.c ---------------------------------------------------------- */
/* Queue an answer (body copied); MHD_YES or MHD_NO. */
int admin_respond(struct MHD_Connection *conn, unsigned status,
    const char *body);
/* v as the body (consumes v; NULL: a 500). */
int admin_respond_json(struct MHD_Connection *conn, unsigned status, json_t *v);
/* {"error": code, "message": ...} */
int admin_error(struct MHD_Connection *conn, unsigned status, const char *code,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* 405 method_not_allowed for method on path, naming in Allow what the
 * path takes ("GET, HEAD", ...; RFC 9110). */
int admin_not_allowed(struct MHD_Connection *conn, const char *method,
    const char *path, const char *allow);
/* The peer as "address:port", "unix" or "unknown", for the log. */
void admin_peer(struct MHD_Connection *conn, char *buf, size_t len);
/* One log line for a write: who (the peer), what; never the token. */
void admin_log_write(struct MHD_Connection *conn, const char *op,
    const char *rule, const char *key, const char *what);

/* --- admin_store.c ---------------------------------------------------- */
int admin_handle_counters(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *method);
int admin_handle_overrides(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *method, const char *body, size_t len);

#endif
