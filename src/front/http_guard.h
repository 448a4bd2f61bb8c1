/*
 * http_guard.h - what the HTTP front end owes the clients it does not serve
 * right away (docs/security.md): a bound on open connections, past which a new
 * one is closed at once instead of waiting in the backlog, and a bound on
 * the time from a request's first byte to its end, past which a client
 * that dribbles its headers or body is cut off.
 *
 * libmicrohttpd cuts connections that stay silent (idle_timeout), but a
 * client that sends one byte now and then is never silent.  The guard's
 * thread looks at every TCP connection twice a second: the kernel's count
 * of bytes received (TCP_INFO) tells when a new request began after the
 * previous one ended, and a request older than request_timeout that is not
 * waiting for the store is shut down, which libmicrohttpd then sees as the
 * client's close.  A socket is only touched while its connection is known
 * open: libmicrohttpd reports a close before it closes the socket, under
 * the same lock.
 *
 * Thread: the callbacks run on the event loops (libmicrohttpd's callbacks,
 * http_loop.c); the guard has one thread of its own.
 */
#ifndef RL_HTTP_GUARD_H
#define RL_HTTP_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct http_guard;

/* The limits now (they may change on reload); called by the guard's
 * thread and by admit. */
typedef void (*http_guard_limits_fn)(void *arg, int64_t *max_connections,
    int64_t *request_timeout_us);

/* A guard and its thread; NULL with a message in err. */
struct http_guard *http_guard_start(http_guard_limits_fn limits, void *arg,
    char *err, size_t errlen);

/* Stop the thread and free.  Every connection must be closed.  NULL:
 * no-op. */
void http_guard_stop(struct http_guard *g);

/* May one more connection open?  (The accept policy.) */
bool http_guard_admit(struct http_guard *g);

/* A connection opened on socket fd, or closed; *ctx is its socket
 * context, which the guard owns from open to close. */
void http_guard_opened(struct http_guard *g, int fd, void **ctx);
void http_guard_closed(struct http_guard *g, void **ctx);

/* The connection's request ended (answered or abandoned). */
void http_guard_request_done(void *ctx);
/* The connection's next request line was read: a request is under way
 * until the next http_guard_request_done(). */
void http_guard_request_started(void *ctx);

/* The connection's request waits for the store (true) or no longer
 * (false): it is not cut meanwhile; the store's own deadline bounds it. */
void http_guard_waiting(void *ctx, bool waiting);

/* Connections open now; connections refused and cut since the start. */
int64_t http_guard_open(const struct http_guard *g);
uint64_t http_guard_refused(const struct http_guard *g);
uint64_t http_guard_cut(const struct http_guard *g);

#endif
