/*
 * http_loop.h - the HTTP front end's event loops: `threads` threads, each
 * running its own libmicrohttpd daemon (started by http.c in external
 * epoll mode, MHD_USE_EPOLL without its own thread) inside an epoll set of
 * the loop's, which also holds the loop's inbox of new connections and,
 * on the first loop, the Redis store's I/O (core/backend.h, host_adopt).
 *
 * Why our own loops and not libmicrohttpd's thread pool: a request that
 * goes to Redis would otherwise cross two more threads, the loop that
 * suspends it to the store's I/O thread and that thread back to the loop
 * that resumes it, and on a machine with few cores each crossing is a
 * wake-up that waits for a core.  On the loop that hosts the store, the
 * request is read, sent to Redis, answered and written on one thread.
 *
 * Ownership: a loop borrows its daemon (http.c stops it after the loop)
 * and the store it hosts; it owns its epoll set, its inbox and the
 * connections queued in it until it hands them to libmicrohttpd.
 * Thread: start and stop on the thread that owns the server (main);
 * http_loop_add on any thread (the acceptor's).
 */
#ifndef RL_HTTP_LOOP_H
#define RL_HTTP_LOOP_H

#include <stddef.h>
#include <sys/socket.h>

struct MHD_Daemon;
struct backend;
struct http_loop;

/*
 * Run mhd (external epoll, MHD_USE_NO_LISTEN_SOCKET) on a new thread named
 * name; host, when not NULL, is a store whose I/O the loop adopts and runs
 * until it stops.  NULL with a message in err.
 */
struct http_loop *http_loop_start(struct MHD_Daemon *mhd, struct backend *host,
    const char *name, char *err, size_t errlen);

/* Give the loop a connection accepted on fd (non-blocking); the loop adds
 * it to its daemon, whose accept policy may refuse and close it.  The loop
 * owns fd from here on, even when this fails (it is closed then). */
void http_loop_add(struct http_loop *l, int fd, const struct sockaddr *addr,
    socklen_t addrlen);

/* The loop whose thread calls this, or NULL on any other thread. */
struct http_loop *http_loop_current(void);

/*
 * A connection of l's daemon was resumed (MHD_resume_connection()): make
 * the loop run libmicrohttpd again soon.  In external mode libmicrohttpd
 * wakes nobody by itself.  On l's own thread this only notes it; from
 * another thread it wakes the loop.  Any thread.
 */
void http_loop_wake(struct http_loop *l);

/*
 * A zeroed record of size bytes for one request, from the records the
 * calling thread's loop got back, or rl_calloc() (on any other thread, or
 * when it has none); NULL when out of memory.  Give it back with
 * http_loop_record_put(): on a loop's thread it is kept for that loop's
 * next request (at most 128 of them; none under AddressSanitizer, which
 * then sees every record's life), elsewhere freed.
 * Every record of a loop has one size (http.c's struct request).  Why:
 * glibc serves a block this large (over 1 KiB) from its large bins, and
 * before each such malloc it merges every small block freed since into
 * its bins (malloc_consolidate), and a request frees dozens (its JSON,
 * the answer's headers).
 */
void *http_loop_record_get(size_t size);
void http_loop_record_put(void *p, size_t size);

/* Stop the thread (giving the store's I/O back to the store's own thread)
 * and free; connections still queued are closed.  The daemon stays the
 * caller's.  NULL is fine. */
void http_loop_stop(struct http_loop *l);

#endif
