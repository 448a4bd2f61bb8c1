/*
 * redis_resolve.h - a Redis host name resolved on a thread of its own, so
 * that the store's I/O thread never waits for DNS.
 *
 * getaddrinfo() blocks for as long as the resolver takes (seconds, with a
 * name server that does not answer); on the I/O thread that would hold
 * every call of every connection past redis.timeout.  A lookup here runs
 * getaddrinfo() on a detached thread and says it is done through an
 * eventfd that the I/O thread's epoll watches, so a connect waits for its
 * name while the loop goes on failing calls at their deadlines.
 *
 * A lookup belongs to the thread that started it (the owner), which alone
 * calls the functions below.  The owner may give a lookup up at any time
 * with redis_resolve_drop(), also while it runs: whichever of the owner
 * and the lookup thread is last frees it.  One lookup thread exists per
 * lookup in progress; redis_conn.c keeps at most one per connection.
 */
#ifndef RL_REDIS_RESOLVE_H
#define RL_REDIS_RESOLVE_H

#include <stdbool.h>
#include <stddef.h>

#include <netdb.h>

struct redis_resolve;

/*
 * Start resolving host (a name, not a numeric address) for TCP port port
 * on a new thread.  Returns the lookup, or NULL with why in err (out of
 * memory, no thread).  The caller owns it until redis_resolve_drop().
 */
struct redis_resolve *redis_resolve_start(const char *host, int port,
    char *err, size_t errlen);

/* A descriptor that becomes readable when the lookup is done (and stays
 * so: the owner watches it level-triggered, never reads it).  Valid until
 * redis_resolve_drop(); the lookup closes it. */
int redis_resolve_fd(const struct redis_resolve *r);

/* Whether r is a lookup of host and port. */
bool redis_resolve_is_for(const struct redis_resolve *r, const char *host,
    int port);

/* Whether the lookup has finished (redis_resolve_result() then answers). */
bool redis_resolve_is_done(const struct redis_resolve *r);

/*
 * The answer of a finished lookup: its addresses, borrowed until
 * redis_resolve_drop(), or NULL with why in err (getaddrinfo's message,
 * prefixed by the host).  Only after redis_resolve_is_done() said true.
 */
const struct addrinfo *redis_resolve_result(const struct redis_resolve *r,
    char *err, size_t errlen);

/* Give the lookup up: freed now if it is done, else by its thread when
 * getaddrinfo() returns.  NULL: no-op. */
void redis_resolve_drop(struct redis_resolve *r);

#endif
