/*
 * listen.h - the listening sockets of the front ends: HTTP (`listen`) and
 * gRPC (`grpc_listen`) bind the same way, so a port in use is the same
 * clear start-up error for both and a unix socket works like TCP
 * (docs/configuration.md).
 *
 * Start-up and exit only (main thread): sockets are bound before
 * privileges are dropped.
 */
#ifndef RL_LISTEN_H
#define RL_LISTEN_H

#include <stddef.h>
#include <sys/types.h>

#include "core/listen_addr.h"

/* The kernel's queue of connections not yet accepted. */
#define LISTEN_BACKLOG 1024

/*
 * The file of a unix socket a start bound: removed at exit, and only while
 * it is still that socket (its device and inode), so that a file another
 * start has put at the path since is left alone (docs/configuration.md).
 */
struct listen_unix {
	char path[LISTEN_PATH_MAX + 1]; /* "": nothing to remove */
	dev_t dev;
	ino_t ino;
};

/* How a unix socket's file is made: its mode (listen_mode, -1: the
 * umask's) and owner ((uid_t)-1 and (gid_t)-1: the process's), so that
 * with `user` the file is that user's (docs/security.md). */
struct listen_file {
	int mode;
	uid_t uid;
	gid_t gid;
};

/*
 * Bind and listen on `listen` ("host:port", "[v6]:port", "unix:/path").
 * Returns the socket (the caller owns it), or -1 with a message in err
 * ("127.0.0.1:8080: address already in use").  A stale unix socket file
 * (its connect refused) is replaced; any other socket there (a daemon
 * accepts on it, another user's, a datagram socket) is an error and stays;
 * *file sets the unix socket file's mode and owner.  *made records
 * the unix socket's file (path "" for TCP and on failure); the caller
 * removes it with listen_unix_remove().
 */
int listen_socket_open(const char *listen, const struct listen_file *file,
    struct listen_unix *made, char *err, size_t errlen);

/* Remove made's socket file if the path still names it, and forget it
 * (nothing when made->path is "").  At exit, or on a failed start. */
void listen_unix_remove(struct listen_unix *made);

#endif
