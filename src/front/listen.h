/*
 * listen.h - the listening sockets of the front ends: HTTP (`listen`) and
 * gRPC (`grpc_listen`) bind the same way, so a port in use is the same
 * clear start-up error for both and a unix socket works like TCP
 * (docs/configuration.md).
 *
 * Start-up only (main thread, before privileges are dropped).
 */
#ifndef RL_LISTEN_H
#define RL_LISTEN_H

#include <stddef.h>

/* The kernel's queue of connections not yet accepted. */
#define LISTEN_BACKLOG 1024

/*
 * Bind and listen on `listen` ("host:port", "[v6]:port", "unix:/path").
 * Returns the socket (the caller owns it), or -1 with a message in err
 * ("127.0.0.1:8080: address already in use").  A stale unix socket file
 * (its connect refused) is replaced; any other socket there (a daemon
 * accepts on it, another user's, a datagram socket) is an error and stays;
 * mode >= 0 is the unix socket's file mode (listen_mode).
 */
int listen_socket_open(const char *listen, int mode, char *err, size_t errlen);

#endif
