/*
 * http_accept.h - the thread that accepts the HTTP front end's
 * connections and hands each to libmicrohttpd (MHD_add_connection()),
 * which gives it to one of its event loops by the socket's number.
 *
 * Why not libmicrohttpd's own accept: every loop of its thread pool polls
 * the one listening socket and accepts what it sees first, so a burst of
 * connections (a proxy's pool, a load generator) can land all on one loop
 * and leave the others idle: seen with 50 keep-alive connections, all on
 * one of two loops in one run out of three.  Handed out by number,
 * consecutive connections alternate between the loops.
 *
 * Ownership: the acceptor owns the listening socket from
 * http_accept_start() on and closes it in http_accept_stop().  Start and
 * stop run on the thread that owns the server (main); the acceptor thread
 * only accepts.
 */
#ifndef RL_HTTP_ACCEPT_H
#define RL_HTTP_ACCEPT_H

#include <stddef.h>

struct MHD_Daemon;
struct http_acceptor;

/*
 * Accept on listen_fd (made non-blocking here) and add every connection to
 * mhd, started with MHD_USE_NO_LISTEN_SOCKET.  Returns NULL with a message
 * in err; listen_fd is then still the caller's.
 */
struct http_acceptor *http_accept_start(int listen_fd, struct MHD_Daemon *mhd,
    char *err, size_t errlen);

/*
 * Stop accepting: new connections are refused at once (the socket is
 * closed).  Connections already handed over are libmicrohttpd's.  Safe
 * with NULL and more than once.
 */
void http_accept_stop(struct http_acceptor *a);

/* Stop, then free.  NULL is fine. */
void http_accept_free(struct http_acceptor *a);

#endif
