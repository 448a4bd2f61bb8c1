/*
 * redis_resolve.c - a Redis host name resolved on a thread of its own
 * (see redis_resolve.h).
 *
 * The owner and the lookup thread share the lookup under its mutex: the
 * thread stores its answer, marks it done and signals the eventfd if the
 * owner is watching; the owner opens and closes the eventfd and may drop
 * the lookup.  Whichever finds the other gone (done and dropped) frees it,
 * so it is freed exactly once.  The eventfd is only ever written under the
 * mutex, so the owner never closes it under the thread's feet, and it is
 * never read: once done it stays readable, and a level-triggered epoll
 * keeps saying so until the owner acts.
 *
 * Even starting the lookup's thread is not the owner's work: creating a
 * thread can take long (ThreadSanitizer's pthread_create waits until the
 * new thread runs, a loaded machine schedules it late).  The owner queues
 * the lookup for one spawner thread, started with the first lookup, which
 * creates the lookup threads.
 */
#include "store/redis_resolve.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/util.h"

struct redis_resolve {
	pthread_mutex_t mu;
	bool done;    /* the answer is in */
	bool dropped; /* the owner left: the thread frees */
	int efd;      /* the owner's, or -1 */
	int port;
	char *host;
	int rc;	       /* getaddrinfo()'s result */
	int sys_errno; /* errno, when rc is EAI_SYSTEM */
	struct addrinfo *res;
	struct redis_resolve *next; /* in the spawner's queue */
};

/* The spawner: lookups waiting for their thread. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct redis_resolve *head, *tail;
	bool started;
} spawner = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL,
	false };

static void
resolve_free(struct redis_resolve *r)
{
	if (r->res != NULL)
		freeaddrinfo(r->res);
	if (r->efd >= 0)
		close(r->efd);
	pthread_mutex_destroy(&r->mu);
	rl_free(r->host);
	rl_free(r);
}

static void
signal_fd(int efd)
{
	uint64_t one = 1;

	(void)!write(efd, &one, sizeof(one));
}

/* The answer is in: hand it over, and free the lookup if the owner
 * left. */
static void
resolve_finish(struct redis_resolve *r, int rc, int sys_errno,
    struct addrinfo *res)
{
	bool dropped;

	pthread_mutex_lock(&r->mu);
	r->rc = rc;
	r->sys_errno = sys_errno;
	r->res = rc == 0 ? res : NULL;
	r->done = true;
	if (r->efd >= 0)
		signal_fd(r->efd);
	dropped = r->dropped;
	pthread_mutex_unlock(&r->mu);
	if (dropped)
		resolve_free(r);
}

static void *
resolve_thread(void *arg)
{
	struct redis_resolve *r = arg;
	struct addrinfo hints, *res = NULL;
	char port[8];
	int rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%d", r->port); /* immutable */
	rc = getaddrinfo(r->host, port, &hints, &res);
	resolve_finish(r, rc, errno, res);
	return NULL;
}

/* Start a thread for every lookup queued; one that cannot have one is
 * done with why.  Signals are blocked here, and so in every lookup
 * thread: they stay with the threads that wait for them. */
static void *
spawner_main(void *arg)
{
	struct redis_resolve *r;
	pthread_attr_t attr;
	pthread_t tid;
	int rc;

	(void)arg;
	pthread_attr_init(&attr);
	(void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (;;) {
		pthread_mutex_lock(&spawner.mu);
		while (spawner.head == NULL)
			pthread_cond_wait(&spawner.cv, &spawner.mu);
		r = spawner.head;
		if ((spawner.head = r->next) == NULL)
			spawner.tail = NULL;
		pthread_mutex_unlock(&spawner.mu);
		r->next = NULL;
		if ((rc = pthread_create(&tid, &attr, resolve_thread, r)) != 0)
			resolve_finish(r, EAI_SYSTEM, rc, NULL);
	}
	return NULL;
}

struct redis_resolve *
redis_resolve_start(const char *host, int port, char *err, size_t errlen)
{
	struct redis_resolve *r;
	pthread_t tid;
	sigset_t all, old;
	int rc = 0;

	if ((r = rl_calloc(1, sizeof(*r))) == NULL) {
		snprintf(err, errlen, "resolve %s: out of memory", host);
		return NULL;
	}
	pthread_mutex_init(&r->mu, NULL);
	r->port = port;
	r->efd = -1;
	if ((r->host = rl_strdup(host)) == NULL) {
		snprintf(err, errlen, "resolve %s: out of memory", host);
		goto fail;
	}
	if (redis_resolve_fd(r, err, errlen) < 0)
		goto fail;
	pthread_mutex_lock(&spawner.mu);
	if (!spawner.started) {
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		if ((rc = pthread_create(&tid, NULL, spawner_main, NULL)) == 0)
			(void)pthread_detach(tid);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		spawner.started = rc == 0;
	}
	if (rc == 0) {
		if (spawner.tail != NULL)
			spawner.tail->next = r;
		else
			spawner.head = r;
		spawner.tail = r;
		pthread_cond_signal(&spawner.cv);
	}
	pthread_mutex_unlock(&spawner.mu);
	if (rc != 0) {
		snprintf(err, errlen, "resolve %s: no thread: %s", host,
		    strerror(rc));
		goto fail;
	}
	return r;
fail:
	resolve_free(r);
	return NULL;
}

int
redis_resolve_fd(struct redis_resolve *r, char *err, size_t errlen)
{
	int fd;

	pthread_mutex_lock(&r->mu);
	if (r->efd < 0) {
		r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (r->efd < 0)
			snprintf(err, errlen, "resolve %s: eventfd: %s",
			    r->host, strerror(errno));
		else if (r->done)
			signal_fd(r->efd);
	}
	fd = r->efd;
	pthread_mutex_unlock(&r->mu);
	return fd;
}

void
redis_resolve_unwatch(struct redis_resolve *r)
{
	pthread_mutex_lock(&r->mu);
	if (r->efd >= 0)
		close(r->efd);
	r->efd = -1;
	pthread_mutex_unlock(&r->mu);
}

bool
redis_resolve_is_for(const struct redis_resolve *r, const char *host, int port)
{
	return r->port == port && strcmp(r->host, host) == 0;
}

bool
redis_resolve_is_done(struct redis_resolve *r)
{
	bool done;

	pthread_mutex_lock(&r->mu);
	done = r->done;
	pthread_mutex_unlock(&r->mu);
	return done;
}

const struct addrinfo *
redis_resolve_result(const struct redis_resolve *r, char *err, size_t errlen)
{
	/* Written before done was set under the mutex, which the owner
	 * took in redis_resolve_is_done(); not written again. */
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
	bool done;

	if (r == NULL)
		return;
	pthread_mutex_lock(&r->mu);
	if (r->efd >= 0)
		close(r->efd);
	r->efd = -1;
	r->dropped = true;
	done = r->done;
	pthread_mutex_unlock(&r->mu);
	if (done)
		resolve_free(r);
}
