/*
 * http_accept.c - accepts the HTTP front end's connections on its own
 * thread and hands them over (see http_accept.h for why).
 *
 * The thread polls the listening socket and an eventfd (the stop), and
 * accepts until the kernel's queue is empty.  libmicrohttpd's accept
 * policy (the connection limit) still runs, in the loop's
 * MHD_add_connection(), which closes a connection it refuses.
 *
 * Out of descriptors (EMFILE, ENFILE: the open-files limit is below what
 * max_connections needs, docs/security.md) a connection must still be
 * refused at once, not left in the kernel's queue where its client waits
 * without an answer.  The thread keeps one descriptor in reserve (on
 * /dev/null): it gives it up, accepts the connection into its place,
 * closes the connection and takes the reserve back.  Without a reserve
 * (ENOBUFS, ENOMEM, or another thread took the place) it logs once a
 * second and pauses 10 ms before it tries again, so that it does not spin.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"
#include "front/http_accept.h"

#define ACCEPT_FULL_PAUSE_NS (10 * 1000 * 1000)
#define ACCEPT_LOG_US	     1000000

struct http_acceptor {
	http_accept_fn fn;
	void *arg;
	int listen_fd; /* owned */
	int stop_fd;   /* eventfd: stop */
	int spare_fd;  /* /dev/null, given up to refuse a connection; -1 */
	pthread_t thread;
	bool started;
	int64_t logged_us; /* the last "out of descriptors" line */
};

/* Out of descriptors: refuse one connection of the queue with the spare
 * descriptor's place.  True when one was refused. */
static bool
refuse_one(struct http_acceptor *a)
{
	int fd;

	if (a->spare_fd < 0 &&
	    (a->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
		return false; /* its place was taken: try again later */
	close(a->spare_fd);
	fd = accept4(a->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0)
		close(fd);
	a->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return fd >= 0;
}

/* Accept until the queue is empty; false when the table is full. */
static bool
accept_all(struct http_acceptor *a)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd;
	int64_t now;

	for (;;) {
		len = sizeof(ss);
		fd = accept4(a->listen_fd, (struct sockaddr *)&ss, &len,
		    SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			a->fn(a->arg, fd, (struct sockaddr *)&ss, len);
			continue;
		}
		switch (errno) {
		case EINTR:
		case ECONNABORTED:
		case EPROTO:
			continue;
		case EMFILE:
		case ENFILE:
		case ENOBUFS:
		case ENOMEM:
			now = util_monotonic_us();
			if (now - a->logged_us >= ACCEPT_LOG_US) {
				log_warnx("http: cannot accept: %s%s",
				    strerror(errno),
				    errno == EMFILE || errno == ENFILE ?
					" (connections refused; raise the "
					"open-files limit)" :
					"");
				a->logged_us = now;
			}
			if ((errno == EMFILE || errno == ENFILE) &&
			    refuse_one(a))
				continue;
			return false;
		default: /* EAGAIN: the queue is empty */
			return true;
		}
	}
}

static void *
accept_run(void *arg)
{
	struct http_acceptor *a = arg;
	struct timespec pause = { 0, ACCEPT_FULL_PAUSE_NS };
	struct pollfd pfd[2];

	pfd[0].fd = a->listen_fd;
	pfd[0].events = POLLIN;
	pfd[1].fd = a->stop_fd;
	pfd[1].events = POLLIN;
	for (;;) {
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_warnx("http: accept poll: %s", strerror(errno));
			nanosleep(&pause, NULL);
			continue;
		}
		if (pfd[1].revents != 0)
			break;
		if (pfd[0].revents != 0 && !accept_all(a))
			nanosleep(&pause, NULL);
	}
	return NULL;
}

struct http_acceptor *
http_accept_start(int listen_fd, http_accept_fn fn, void *arg, char *err,
    size_t errlen)
{
	struct http_acceptor *a;
	int flags, rc;

	if ((a = rl_calloc(1, sizeof(*a))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	a->fn = fn;
	a->arg = arg;
	a->listen_fd = a->stop_fd = a->spare_fd = -1;
	if ((flags = fcntl(listen_fd, F_GETFL)) == -1 ||
	    fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK) == -1 ||
	    (a->stop_fd = eventfd(0, EFD_CLOEXEC)) == -1 ||
	    (a->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) == -1) {
		snprintf(err, errlen, "http: acceptor: %s", strerror(errno));
		goto fail;
	}
	a->listen_fd = listen_fd;
	if ((rc = pthread_create(&a->thread, NULL, accept_run, a)) != 0) {
		a->listen_fd = -1;
		snprintf(err, errlen, "http: acceptor thread: %s",
		    strerror(rc));
		goto fail;
	}
	a->started = true;
	pthread_setname_np(a->thread, "rl-accept");
	return a;

fail:
	if (a->stop_fd >= 0)
		close(a->stop_fd);
	if (a->spare_fd >= 0)
		close(a->spare_fd);
	rl_free(a);
	return NULL;
}

void
http_accept_stop(struct http_acceptor *a)
{
	if (a == NULL)
		return;
	if (a->started) {
		(void)!write(a->stop_fd, &(uint64_t){ 1 }, sizeof(uint64_t));
		pthread_join(a->thread, NULL);
		a->started = false;
	}
	if (a->listen_fd >= 0) {
		close(a->listen_fd);
		a->listen_fd = -1;
	}
}

void
http_accept_free(struct http_acceptor *a)
{
	if (a == NULL)
		return;
	http_accept_stop(a);
	close(a->stop_fd);
	if (a->spare_fd >= 0)
		close(a->spare_fd);
	rl_free(a);
}
