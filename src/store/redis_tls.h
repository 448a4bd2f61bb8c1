/*
 * redis_tls.h - TLS for the Redis store's connections (docs/configuration.md,
 * "Redis over TLS"): the OpenSSL client context made from redis.tls, swapped
 * for a new one when a reload reads the files again, and what a failed
 * handshake means, said once per reason.
 *
 * A struct redis_tls is owned by the store (struct redis_backend) and lives
 * as long as it.  redis_tls_reload() may run on any thread (the main
 * thread, on SIGHUP) while the store's I/O thread makes connections: the
 * context is behind a mutex, and each new connection takes what it needs
 * from the current one (SSL_new() holds its own reference), so a swap
 * never disturbs a connection that is open or opening.  Everything else
 * here runs on the I/O thread.
 *
 * Included by the store's files (redis_conn.c, backend_redis.c) only.
 */
#ifndef RL_REDIS_TLS_H
#define RL_REDIS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "core/config.h"

/* Why a TLS connection failed: one log line per reason (redis_tls_fail). */
enum redis_tls_reason {
	REDIS_TLS_EXPIRED,	 /* the server's certificate expired */
	REDIS_TLS_NOT_YET_VALID, /* ... is not valid yet */
	REDIS_TLS_UNKNOWN_CA,	 /* ... chains to no CA we trust */
	REDIS_TLS_NAME,		 /* ... is not for the name we asked */
	REDIS_TLS_CERT,		 /* ... is refused for another reason */
	REDIS_TLS_CLIENT_CERT,	 /* the server refused ours (or none) */
	REDIS_TLS_NOT_TLS,	 /* the server answered, not in TLS */
	REDIS_TLS_TIMEOUT,	 /* no handshake within the timeout */
	REDIS_TLS_CLOSED,	 /* closed, no close_notify nor alert */
	REDIS_TLS_SHUTDOWN,	 /* closed with close_notify: on purpose */
	REDIS_TLS_OTHER,	 /* any other handshake failure */
	REDIS_TLS_NREASONS
};

/* Every close reason of a TLS failure starts with this (redis_reply.c
 * counts such a failure as kind "tls"). */
#define REDIS_TLS_PREFIX "tls: "
#define REDIS_TLS_HUNG	 "tls: no handshake within the timeout"

/* The session a connection may resume, kept by the connection (its host
 * and port, and the context generation it came from). */
struct redis_tls_session {
	SSL_SESSION *sess;
	uint64_t gen;
	int port;
	char host[256];
};

struct redis_tls;

/*
 * A context from tc: the CA file (else the system's CAs), the client
 * certificate and key if given, TLS 1.2 at least, the peer always
 * verified.  Returns a new object, or NULL with err (naming the key, never
 * a file's content) and *bad at the file that failed (NULL when no file is
 * to blame: out of memory).  Any thread.
 */
struct redis_tls *redis_tls_new(const struct redis_tls_config *tc,
    const struct tls_file **bad, char *err, size_t errlen);

/* NULL: no-op.  No connection may use it any more. */
void redis_tls_free(struct redis_tls *t);

/*
 * Read tc's files again into a new context for new connections (server
 * name too); connections made already keep theirs.  Returns 0, or -1 with
 * err and *bad as redis_tls_new() (the old context stays).  Any thread.
 */
int redis_tls_reload(struct redis_tls *t, const struct redis_tls_config *tc,
    const struct tls_file **bad, char *err, size_t errlen);

/*
 * A client SSL for a connection to host:port (the config's server_name,
 * if any, instead of host for SNI and the name verified), resuming *sess
 * when it is from the same context and server; the SSL records new
 * sessions in *sess (which the caller frees with redis_tls_session_clear).
 * Returns the SSL (the caller's, SSL_free), or NULL with err.
 */
SSL *redis_tls_ssl_new(struct redis_tls *t, const char *host, int port,
    struct redis_tls_session *sess, char *err, size_t errlen);

/* Drop the session in *s.  Safe on a zeroed one. */
void redis_tls_session_clear(struct redis_tls_session *s);

/*
 * The SSL call on ssl that returned ret failed (SSL_get_error() says
 * SSL_ERROR_SSL, SYSCALL or ZERO_RETURN; handshake: still in it): write
 * why (REDIS_TLS_PREFIX ...) and log it, once per reason (redis_tls.c),
 * naming host:port.  Returns the reason.  Past the handshake a plain
 * close (REDIS_TLS_CLOSED) is no TLS failure: why says so without the
 * prefix, and nothing is logged; nor, at any time, is a close the server
 * announced with close_notify (REDIS_TLS_SHUTDOWN: CLIENT KILL, an idle
 * timeout), which refuses nothing.  Clears OpenSSL's error queue.
 */
enum redis_tls_reason redis_tls_fail(struct redis_tls *t, SSL *ssl, int ret,
    bool handshake, const char *host, int port, char *why, size_t whylen);

/* A handshake to host:port did not finish in time: as redis_tls_fail. */
void redis_tls_fail_timeout(struct redis_tls *t, const char *host, int port);

/* Check tc's files as redis_tls_new() would, and make nothing.  Any
 * thread. */
int redis_tls_check(const struct redis_tls_config *tc,
    const struct tls_file **bad, char *err, size_t errlen);

#endif
