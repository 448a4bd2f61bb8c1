/*
 * redis_resolve.h - a Redis host name resolved on a thread of its own, so
 * that the store's I/O thread never waits for DNS.
 *
 * getaddrinfo() blocks for as long as the resolver takes (seconds, with a
 * name server that does not answer); on the I/O thread that would hold
 * every call of every connection past redis.timeout.  A lookup here runs
 * getaddrinfo() on a detached thread (started by a spawner thread, so
 * that the owner does not even wait for pthread_create()) and says it is
 * done through an eventfd that the I/O thread's epoll watches, so a
 * connect waits for its name while the loop goes on failing calls at
 * their deadlines.
 *
 * A lookup belongs to the thread that started it (the owner), which alone
 * calls the functions below; the lookup thread only answers.  The eventfd
 * is the owner's: it may close it and stop waiting (redis_resolve_unwatch)
 * while the lookup goes on, and wait again later with a new one, so that a
 * descriptor it closes also leaves its epoll set.  The owner may give a
 * lookup up at any time with redis_resolve_drop(), also while it runs:
 * whichever of the owner and the lookup thread is last frees it.
 */
#ifndef RL_REDIS_RESOLVE_H
#define RL_REDIS_RESOLVE_H

#include <stdbool.h>
#include <stddef.h>

#include <netdb.h>

struct redis_resolve;

/*
 * Start resolving host (a name, not a numeric address) for TCP port port
 * on a new thread.  Returns the lookup, watched (redis_resolve_fd()), or
 * NULL with why in err (out of memory, no thread).  The caller owns it
 * until redis_resolve_drop().
 */
struct redis_resolve *redis_resolve_start(const char *host, int port, char *err,
    size_t errlen);

/* A descriptor that becomes readable when the lookup is done (at once if
 * it is), opened if need be: the owner's until redis_resolve_unwatch() or
 * redis_resolve_drop() closes it.  -1 with err when none can be made. */
int redis_resolve_fd(struct redis_resolve *r, char *err, size_t errlen);

/* Close the descriptor (no-op without one); the lookup goes on. */
void redis_resolve_unwatch(struct redis_resolve *r);

/* Whether r is a lookup of host and port. */
bool redis_resolve_is_for(const struct redis_resolve *r, const char *host,
    int port);

/* Whether the lookup has finished (redis_resolve_result() then answers). */
bool redis_resolve_is_done(struct redis_resolve *r);

/*
 * The answer of a finished lookup: its addresses, borrowed until
 * redis_resolve_drop(), or NULL with why in err (getaddrinfo's message,
 * after the host).  Only after redis_resolve_is_done() said true.
 */
const struct addrinfo *redis_resolve_result(const struct redis_resolve *r,
    char *err, size_t errlen);

/* Give the lookup up (closing its descriptor): freed now if it is done,
 * else by its thread when getaddrinfo() returns.  NULL: no-op. */
void redis_resolve_drop(struct redis_resolve *r);

#endif
