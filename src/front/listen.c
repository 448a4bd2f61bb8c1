/*
 * listen.c - binds the listening socket of a front end (listen.h): TCP,
 * IPv4 or IPv6, or a unix socket whose stale file from a process that died
 * is replaced, and whose file is removed at exit.  HTTP and gRPC both start
 * from the socket this returns, so that the errors and the unix-socket handling
 * are the same for both.
 */
#include "front/listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"
#include "core/listen_addr.h"

/*
 * May the socket file at sun be replaced?  Only when nothing accepts on
 * it: a connect refused (ECONNREFUSED) is the file of a process that died,
 * and a file gone meanwhile (ENOENT) is nothing to replace.  Any other
 * answer is a socket in use or one this process cannot judge: a live
 * daemon accepts, another user's socket refuses permission (EACCES), a
 * datagram socket such as /dev/log has the wrong type (EPROTOTYPE); it is
 * never removed.  0, or -1 with err.
 */
static int
unix_socket_check_stale(const char *listen_s, const struct sockaddr_un *sun,
    char *err, size_t errlen)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc, e;

	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", listen_s, strerror(errno));
		return -1;
	}
	rc = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
	e = errno;
	close(fd);
	if (rc == 0) {
		snprintf(err, errlen,
		    "%s: another process accepts connections on it", listen_s);
		return -1;
	}
	if (e == ECONNREFUSED || e == ENOENT)
		return 0;
	snprintf(err, errlen,
	    "%s: a socket is there and not known to be stale (connect: %s); "
	    "not replaced",
	    listen_s, strerror(e));
	return -1;
}

/* Bind and listen on the unix socket la->path, recording its file in
 * *made.  The socket, or -1 with err. */
static int
listen_unix_open(const char *listen_s, const struct listen_addr *la,
    const struct listen_file *file, struct listen_unix *made, char *err,
    size_t errlen)
{
	struct sockaddr_un sun;
	struct stat st;
	int fd;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	util_strlcpy(sun.sun_path, la->path, sizeof(sun.sun_path));
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		goto syserr;
	if (stat(la->path, &st) == 0 && S_ISSOCK(st.st_mode)) {
		if (unix_socket_check_stale(listen_s, &sun, err, errlen) < 0)
			goto fail;
		unlink(la->path); /* stale */
	}
	if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0)
		goto syserr;
	/* Ours from here: removed on a failure below, and at exit. */
	if (lstat(la->path, &st) < 0)
		goto syserr_bound;
	util_strlcpy(made->path, la->path, sizeof(made->path));
	made->dev = st.st_dev;
	made->ino = st.st_ino;
	if (file->mode >= 0 && chmod(la->path, (mode_t)file->mode) < 0)
		goto syserr_bound;
	/* Not followed if the path were swapped for a link meanwhile. */
	if ((file->uid != (uid_t)-1 || file->gid != (gid_t)-1) &&
	    lchown(la->path, file->uid, file->gid) < 0)
		goto syserr_bound;
	if (listen(fd, LISTEN_BACKLOG) < 0)
		goto syserr_bound;
	return fd;

syserr_bound:
	snprintf(err, errlen, "%s: %s", listen_s, strerror(errno));
	listen_unix_remove(made);
	goto fail;
syserr:
	snprintf(err, errlen, "%s: %s", listen_s, strerror(errno));
fail:
	if (fd >= 0)
		close(fd);
	return -1;
}

void
listen_unix_remove(struct listen_unix *made)
{
	struct stat st;

	if (made->path[0] == '\0')
		return;
	/* Another start may have replaced the file since: leave its. */
	if (lstat(made->path, &st) == 0 && S_ISSOCK(st.st_mode) &&
	    st.st_dev == made->dev && st.st_ino == made->ino &&
	    unlink(made->path) < 0)
		log_warn("cannot remove the socket %s", made->path);
	made->path[0] = '\0';
}

/* Bind and listen on one address ai: the socket, or -1 with errno. */
static int
listen_tcp_one(const struct addrinfo *ai)
{
	int fd, one = 1, e;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ai->ai_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
	    listen(fd, LISTEN_BACKLOG) < 0) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/*
 * Bind the first address la resolves to that can be bound, in
 * getaddrinfo()'s order (the order clients try them): a name that
 * resolves to [::1] and 127.0.0.1 serves on 127.0.0.1 on a host without
 * IPv6.  One socket serves one address: when a name has more, the others
 * are named in a warning (docs/configuration.md).  The socket, or -1 with
 * err (the first address's error).
 */
static int
listen_tcp_open(const char *listen_s, const struct listen_addr *la, char *err,
    size_t errlen)
{
	struct addrinfo hints, *res = NULL, *ai;
	char port[8], host[NI_MAXHOST];
	int fd = -1, rc, bind_errno = 0, n = 0;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%d", la->port);
	if ((rc = getaddrinfo(la->host[0] != '\0' ? la->host : NULL, port,
		 &hints, &res)) != 0) {
		snprintf(err, errlen, "%s: %s", listen_s, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		n++;
		/* Only an address this host lacks moves on to the next: a
		 * port taken (EADDRINUSE) or refused stops the start, as
		 * for a numeric address. */
		if (fd >= 0 ||
		    (bind_errno != 0 && bind_errno != EADDRNOTAVAIL &&
			bind_errno != EAFNOSUPPORT))
			continue;
		if ((fd = listen_tcp_one(ai)) >= 0) {
			if (getnameinfo(ai->ai_addr, ai->ai_addrlen, host,
				sizeof(host), NULL, 0, NI_NUMERICHOST) != 0)
				util_strlcpy(host, "?", sizeof(host));
		} else
			bind_errno = errno; /* the last one: what stopped it */
	}
	freeaddrinfo(res);
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", listen_s, strerror(bind_errno));
		return -1;
	}
	if (n > 1 && la->host[0] != '\0')
		log_warnx(
		    "%s: %s resolves to %d addresses; serving on %s only "
		    "(name one address in `listen` to choose)",
		    listen_s, la->host, n, host);
	return fd;
}

int
listen_socket_open(const char *listen_s, const struct listen_file *file,
    struct listen_unix *made, char *err, size_t errlen)
{
	struct listen_addr la;

	made->path[0] = '\0';
	if (listen_addr_parse(listen_s, &la, err, errlen) == -1)
		return -1;
	if (la.is_unix)
		return listen_unix_open(listen_s, &la, file, made, err, errlen);
	return listen_tcp_open(listen_s, &la, err, errlen);
}
