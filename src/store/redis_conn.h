/*
 * redis_conn.h - one pipelined, non-blocking connection to one Redis
 * server, driven by an event loop that is not its own (redis_loop.c).
 *
 * Commands are formatted with hiredis into an output buffer and written
 * when the socket is writable, all that queued since the last write in one
 * write(2); replies are parsed with hiredis's reader and handed back in
 * order, each to the function given with its command.  A connection is
 * made on demand: redis_conn_send() on a closed connection starts a
 * non-blocking connect (after looking a host name up on another thread)
 * and queues AUTH / SELECT / SCRIPT LOAD ahead of the command, so callers
 * never wait for the handshake, nor for DNS.  With cfg->role_check the
 * handshake ends with ROLE, and what is queued behind it leaves only once
 * the answer is accepted: a server that is not the one wanted never sees
 * a command.  With cfg->tls every
 * connection is TLS: the TLS handshake runs, non-blocking, after the
 * connect and within the same deadline (the state stays CONNECTING).
 *
 * Every function runs on the one thread that owns the connection (the
 * store's I/O thread); nothing here locks.
 */
#ifndef RL_REDIS_CONN_H
#define RL_REDIS_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "core/redis_url.h"

enum redis_conn_state {
	REDIS_CONN_CLOSED,     /* no socket */
	REDIS_CONN_RESOLVING,  /* the host name is being looked up */
	REDIS_CONN_CONNECTING, /* connect(2) in progress */
	REDIS_CONN_UP	       /* connected; the handshake may still run */
};

/*
 * The answer to one command: r is the reply (an error reply included),
 * owned by the connection and freed after the call; or r is NULL and err
 * says why there will be none (the connection closed: whether the command
 * ran is not known, unless redis_conn_unwritten() says it never left).
 */
typedef void (*redis_reply_fn)(void *arg, redisReply *r, const char *err);

struct redis_tls;

/*
 * Whether the server may take the commands behind the handshake, from its
 * answer to ROLE (an error reply included): true, or false with why (the
 * connection then closes with why, those commands never written).
 */
typedef bool (*redis_role_fn)(void *arg, const redisReply *r, char *why,
    size_t whylen);

/* The server and what every new connection sends first.  Borrowed. */
struct redis_conn_config {
	const struct redis_url *url;
	const char *script; /* SCRIPT LOAD on every connection */
	int64_t connect_timeout_us;
	struct redis_tls *tls; /* NULL: in the clear (store/redis_tls.h) */
	/* Non-NULL: ROLE ends the handshake, and the commands queued
	 * behind it stay unwritten until role_check(role_arg, ...) has
	 * accepted its answer (docs/scale.md, "Sentinel"). */
	redis_role_fn role_check;
	void *role_arg;
};

struct redis_conn;

/* A closed connection; NULL on OOM.  cfg is borrowed for its life. */
struct redis_conn *redis_conn_new(const struct redis_conn_config *cfg);

/* Close (failing every command in flight with why) and free.  NULL: no-op. */
void redis_conn_free(struct redis_conn *c, const char *why);

/*
 * Queue one command.  fn(arg, ...) runs exactly once: with its reply, or
 * with NULL when the connection closes first.  Connects if closed.  Returns
 * 0, or -1 with a message in err (out of memory, cannot start a connect)
 * and fn not called.
 */
int redis_conn_send(struct redis_conn *c, int argc, const char **argv,
    const size_t *lens, redis_reply_fn fn, void *arg, char *err, size_t errlen);

/*
 * Replies that arrive with no command waiting (a SUBSCRIBE's messages) go
 * to fn(arg, reply, NULL); without fn they are a protocol error that
 * closes the connection.  When an open connection closes, fn(arg, NULL,
 * why) runs after the commands in flight were failed.
 */
void redis_conn_set_push(struct redis_conn *c, redis_reply_fn fn, void *arg);

/* Close the socket; every command in flight gets NULL with why. */
void redis_conn_close(struct redis_conn *c, const char *why);

/*
 * Event loop glue.  redis_conn_fd() is the socket (-1 when closed; while
 * RESOLVING, a descriptor that turns readable when the lookup is done);
 * redis_conn_wants_write() says whether to wait for writability too.
 * redis_conn_io() handles readiness (either way; it tries both) and may
 * close the connection.  Returns the number of replies handed back.
 */
int redis_conn_fd(const struct redis_conn *c);
bool redis_conn_wants_write(const struct redis_conn *c);
size_t redis_conn_io(struct redis_conn *c);

/* Write what is buffered on an UP connection, and no more: the replies
 * come with readability, through redis_conn_io().  Reading right after a
 * write only finds the socket empty (a recv(2) that fails with EAGAIN,
 * once per batch).  May close the connection. */
void redis_conn_flush(struct redis_conn *c);

enum redis_conn_state redis_conn_state(const struct redis_conn *c);

/* Grows by one with every socket opened: the same fd number with another
 * generation is another socket (to re-register it with epoll). */
uint64_t redis_conn_generation(const struct redis_conn *c);

/* Commands sent (or queued) and not answered yet. */
size_t redis_conn_pending(const struct redis_conn *c);

/* When the oldest unanswered command was queued (monotonic us), or
 * INT64_MAX when none is; and when a connect in progress (its lookup
 * included) gives up. */
int64_t redis_conn_oldest_us(const struct redis_conn *c);
int64_t redis_conn_connect_deadline_us(const struct redis_conn *c);

/* The connect deadline passed: close, saying whether it was the TCP
 * connect (or lookup) or the TLS handshake that did not finish. */
void redis_conn_connect_expired(struct redis_conn *c);

/*
 * Inside a reply function run with r NULL (the connection closed): true
 * when none of that command's bytes reached the socket (it was queued
 * while connecting, or behind what the socket had not taken yet), so the
 * server never saw it and it may be sent again; false when it may have
 * run.  False anywhere else.
 */
bool redis_conn_unwritten(const struct redis_conn *c);

/*
 * Whether the connection's last close was the server refusing its
 * handshake (an error reply to AUTH, SELECT or SCRIPT LOAD, or TLS
 * failing or hanging), until it connects again.  A refusal is no reason
 * to wait for another try: redis_conn_unwritten() is then false.
 */
bool redis_conn_refused(const struct redis_conn *c);

/* Why the last connection closed ("" if never), for logs. */
const char *redis_conn_last_error(const struct redis_conn *c);

#endif
