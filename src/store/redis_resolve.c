/*
 * redis_resolve.c - a Redis host name resolved on a thread of its own
 * (see redis_resolve.h).
 *
 * The owner and the lookup thread share the lookup and hand it over with
 * one atomic word: RUNNING until either side is through with it.  The
 * thread stores its answer, signals the eventfd, then swaps in DONE; the
 * owner that gives up swaps in DROPPED.  Whoever finds the other's mark
 * in the swap frees the lookup, so it is freed exactly once, and the
 * thread never touches it after handing it to the owner.  The eventfd is
 * written before the swap: the owner may see it readable a moment before
 * the answer is published, and then simply looks again on the next turn
 * (it never reads the eventfd, so the wake-up is not lost).
 */
#include "redis_resolve.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"

enum resolve_state {
	RESOLVE_RUNNING,
	RESOLVE_DONE,		/* the answer is the owner's */
	RESOLVE_DROPPED		/* the owner left: the thread frees */
};

struct redis_resolve {
	_Atomic int state;
	int efd;
	int port;
	char *host;
	int rc;			/* getaddrinfo()'s result */
	int sys_errno;		/* errno, when rc is EAI_SYSTEM */
	struct addrinfo *res;
};

static void
resolve_free(struct redis_resolve *r)
{
	if (r->res != NULL)
		freeaddrinfo(r->res);
	if (r->efd >= 0)
		close(r->efd);
	rl_free(r->host);
	rl_free(r);
}

static void *
resolve_thread(void *arg)
{
	struct redis_resolve *r = arg;
	struct addrinfo hints;
	char port[8];
	uint64_t one = 1;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%d", r->port);
	r->rc = getaddrinfo(r->host, port, &hints, &r->res);
	if (r->rc != 0) {
		r->sys_errno = errno;
		r->res = NULL;
	}
	(void)!write(r->efd, &one, sizeof(one));
	if (atomic_exchange(&r->state, RESOLVE_DONE) == RESOLVE_DROPPED)
		resolve_free(r);
	return NULL;
}

struct redis_resolve *
redis_resolve_start(const char *host, int port, char *err, size_t errlen)
{
	struct redis_resolve *r;
	pthread_attr_t attr;
	pthread_t tid;
	sigset_t all, old;
	int rc;

	if ((r = rl_calloc(1, sizeof(*r))) == NULL)
		goto oom;
	atomic_init(&r->state, RESOLVE_RUNNING);
	r->port = port;
	r->efd = -1;
	if ((r->host = rl_strdup(host)) == NULL)
		goto oom;
	if ((r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) == -1) {
		snprintf(err, errlen, "resolve %s: eventfd: %s", host,
		    strerror(errno));
		goto fail;
	}
	if ((rc = pthread_attr_init(&attr)) != 0) {
		snprintf(err, errlen, "resolve %s: %s", host, strerror(rc));
		goto fail;
	}
	(void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	/* Signals stay with the threads that wait for them. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&tid, &attr, resolve_thread, r);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		snprintf(err, errlen, "resolve %s: no thread: %s", host,
		    strerror(rc));
		goto fail;
	}
	return r;
oom:
	snprintf(err, errlen, "resolve %s: out of memory", host);
fail:
	if (r != NULL)
		resolve_free(r);
	return NULL;
}

int
redis_resolve_fd(const struct redis_resolve *r)
{
	return r->efd;
}

bool
redis_resolve_is_for(const struct redis_resolve *r, const char *host,
    int port)
{
	return r->port == port && strcmp(r->host, host) == 0;
}

bool
redis_resolve_is_done(const struct redis_resolve *r)
{
	return atomic_load(&((struct redis_resolve *)r)->state) ==
	    RESOLVE_DONE;
}

const struct addrinfo *
redis_resolve_result(const struct redis_resolve *r, char *err,
    size_t errlen)
{
	if (r->rc != 0) {
		snprintf(err, errlen, "connect: %s: %s", r->host,
		    r->rc == EAI_SYSTEM ? strerror(r->sys_errno) :
		    gai_strerror(r->rc));
		return NULL;
	}
	if (r->res == NULL)
		snprintf(err, errlen, "connect: %s: no address", r->host);
	return r->res;
}

void
redis_resolve_drop(struct redis_resolve *r)
{
	if (r == NULL)
		return;
	if (atomic_exchange(&r->state, RESOLVE_DROPPED) == RESOLVE_DONE)
		resolve_free(r);
}
