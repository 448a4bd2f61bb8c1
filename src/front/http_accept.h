/*
 * http_accept.h - the thread that accepts the HTTP front end's
 * connections and hands each to a callback (http.c gives it to the event
 * loops in turn, http_loop.h).
 *
 * Why one acceptor and not an accept in every loop: loops that all poll
 * the one listening socket accept what each sees first, so a burst of
 * connections (a proxy's pool, a load generator) can land all on one loop
 * and leave the others idle: seen with 50 keep-alive connections, all on
 * one of two loops in one run out of three.  Handed out in turn,
 * consecutive connections alternate between the loops.
 *
 * Ownership: the acceptor owns the listening socket from
 * http_accept_start() on and closes it in http_accept_stop().  Start and
 * stop run on the thread that owns the server (main); the acceptor thread
 * accepts and calls the callback.
 */
#ifndef RL_HTTP_ACCEPT_H
#define RL_HTTP_ACCEPT_H

#include <stddef.h>
#include <sys/socket.h>

struct http_acceptor;

/* Takes a connection accepted on fd (non-blocking), which it owns from
 * then on; runs on the acceptor's thread. */
typedef void (*http_accept_fn)(void *arg, int fd, const struct sockaddr *addr,
    socklen_t addrlen);

/*
 * Accept on listen_fd (made non-blocking here) and give every connection
 * to fn.  Returns NULL with a message in err; listen_fd is then still the
 * caller's.
 */
struct http_acceptor *http_accept_start(int listen_fd, http_accept_fn fn,
    void *arg, char *err, size_t errlen);

/*
 * Stop accepting: new connections are refused at once (the socket is
 * closed).  Connections already handed over are the callback's.  Safe
 * with NULL and more than once.
 */
void http_accept_stop(struct http_acceptor *a);

/* Stop, then free.  NULL is fine. */
void http_accept_free(struct http_acceptor *a);

#endif
