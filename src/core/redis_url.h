/*
 * redis_url.h - the Redis address of the config file (docs/configuration.md),
 * parsed without touching a socket so that it can be tested alone.
 *
 *   redis://[user:pass@]host[:port][/db]   port 6379 and db 0 by default;
 *                                          host may be [v6]
 *   rediss://...                           the same, over TLS
 *   redis://:pass@host ...                 password only (AUTH pass)
 *   redis://user@host ...                  user; password from password_file
 *   unix:///path/redis.sock[?db=N]
 *
 * User and password may be percent-encoded (%40 for '@', %2F for '/').
 * Secrets never appear in messages: errors quote the redacted URL.
 */
#ifndef RL_REDIS_URL_H
#define RL_REDIS_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REDIS_DEFAULT_PORT 6379

struct redis_url {
	bool is_unix;
	bool tls;	/* rediss:// */
	char *host;	/* TCP: host name or address, no brackets */
	int port;	/* TCP: 1..65535 */
	char *path;	/* unix: socket path */
	char *user;	/* NULL, or the ACL user name */
	char *password; /* NULL, or the password */
	int64_t db;	/* >= 0 */
};

/*
 * Parse url into *out, which then owns its strings until redis_url_free().
 * Returns 0, or -1 with a message in err (which names the URL only in
 * redacted form) and *out zeroed.  Any thread.
 */
int redis_url_parse(const char *url, struct redis_url *out, char *err,
    size_t errlen) __attribute__((warn_unused_result));

/* Free what *u owns and zero it.  Safe on a zeroed struct. */
void redis_url_free(struct redis_url *u);

/*
 * Copy url into buf with any "user:pass@" replaced by "***@", so that it
 * can be logged.  Returns the length the full result needs, like strlcpy.
 * Any thread.
 */
size_t redis_url_redact(const char *url, char *buf, size_t buflen);

/*
 * Read the first line of path (without "\n" or "\r\n") into a new string
 * in *out (the caller frees it with rl_free).  Returns 0, or -1 with a
 * message in err for an unreadable file or an empty first line.
 */
int redis_read_password_file(const char *path, char **out, char *err,
    size_t errlen) __attribute__((warn_unused_result));

#endif
