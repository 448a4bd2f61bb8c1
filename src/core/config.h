/*
 * config.h - the YAML rules file (docs/configuration.md) as an immutable
 * snapshot.
 *
 * config_load() parses and validates a whole file with libyaml and returns a
 * new struct config, or NULL with "FILE:LINE:COL: message" in err.  Nothing
 * is changed on failure, which is what lets a reload keep the old rules.
 * A loaded config is never modified again (config_apply_env() runs before it
 * is published); readers hold a reference (config_ref/config_unref), so a
 * request in flight finishes on the snapshot it started with while a reload
 * swaps in the next one.
 */
#ifndef RL_CONFIG_H
#define RL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/client_ip.h"
#include "base/log.h"
#include "core/rules.h"

#define RL_DEFAULT_CONFIG_PATH "/etc/ratelimitd/ratelimitd.yaml"

enum rl_backend_kind { RL_BACKEND_MEMORY, RL_BACKEND_REDIS };
enum rl_on_error { RL_ON_ERROR_ALLOW, RL_ON_ERROR_DENY, RL_ON_ERROR_LOCAL };
enum rl_log_format { RL_LOG_LOGFMT, RL_LOG_JSON };

/* Where a key's value is in the rules file (1-based; 0 when the key is
 * absent), for the checks only --check makes (docs/configuration.md). */
struct config_place {
	int line, col;
};

/* redis.sentinel (docs/scale.md): set iff master != NULL. */
struct sentinel_config {
	char *master; /* the name the sentinels monitor */
	char **nodes; /* "host:port" of the sentinels, nnodes >= 1 */
	size_t nnodes;
	char *password_file; /* NULL, or the sentinels' password */
	bool tls;	     /* the sentinels speak TLS (redis.tls) */
	struct config_place password_file_at;
};

/* A file a key of redis.tls names, and where the key's value is in the
 * rules file, so that a bad file can be reported as FILE:LINE:COL. */
struct tls_file {
	char *path; /* NULL: not set */
	int line, col;
};

/* redis.tls (docs/configuration.md).  The files are only named here; the
 * Redis store reads them (store/redis_tls.h), at start and on reload. */
struct redis_tls_config {
	bool section;		   /* a tls: section was given */
	struct tls_file ca_file;   /* NULL: the system's CAs */
	struct tls_file cert_file; /* client certificate, with key_file */
	struct tls_file key_file;
	char *server_name; /* NULL: each connection's host */
};

struct redis_config {
	char *url;	/* redis://[user:pass@]host:port[/db], unix:///p */
	char **cluster; /* "host:port" seed nodes; ncluster > 0 => cluster */
	size_t ncluster;
	struct sentinel_config sentinel;
	int pool_size;	    /* 1..1024, default 8 */
	int64_t timeout_ms; /* default 50 */
	char *key_prefix;   /* default "rl:" */
	char *
	    password_file; /* NULL or a file whose first line is the password */
	struct config_place password_file_at;
	struct redis_tls_config tls;
};

/* Whether connections to Redis use TLS: a rediss:// URL or a redis.tls
 * section (docs/configuration.md). */
bool config_redis_tls_is_on(const struct redis_config *rc);

/*
 * Whether c would turn TLS to Redis on or off against old once a reload
 * has given it old's redis.url (a start key): a rediss:// URL and a
 * redis.tls section count alike.  That applies only at the next start:
 * the reload keeps old's redis.tls whole and does not read its files
 * again (docs/configuration.md).  Any thread.
 */
bool config_redis_tls_switches(const struct redis_config *old,
    const struct redis_config *c);

struct memory_config {
	int64_t max_keys; /* default 1000000; full => backend error */
};

/* One `stats:` entry (docs/stats.md).  rule holds its name, match, key and
 * window (window_ms); its limit, algorithm, cost and shadow are unused. */
struct stat_def {
	struct rule rule;
	int64_t resolution_ms; /* 1 .. window_ms; default window / 20 */
	double accuracy;       /* relative_accuracy; default 0.01 */
};

struct config {
	char *path; /* the file it was loaded from */

	char *listen;		 /* default "127.0.0.1:8080" */
	char *grpc_listen;	 /* NULL (off), or as listen (docs/grpc.md) */
	char *admin_listen;	 /* NULL (off), or as listen (docs/admin.md) */
	char *admin_token_file;	 /* NULL, or the admin bearer token's file */
	int threads;		 /* 1..1024, default: online cores */
	int64_t max_body_bytes;	 /* default 16384 */
	int64_t max_connections; /* default 10000 (docs/security.md) */
	int64_t idle_timeout_ms; /* default 60000 */
	int64_t request_timeout_ms;  /* default 10000 */
	int max_header_bytes;	     /* default 8192 */
	int max_attributes;	     /* default 64 */
	char *user;		     /* NULL, or drop to this user */
	int listen_mode;	     /* -1, or a unix socket's file mode */
	int64_t shutdown_timeout_ms; /* default 10000 */
	int64_t
	    max_wait_ms; /* default 30000: wait_ms bound (docs/waiting.md) */
	int64_t max_waiting;	       /* default 10000: waiters at once */
	enum log_level log_level;      /* default info */
	enum rl_log_format log_format; /* default logfmt */
	bool access_log;	       /* default false */

	enum rl_backend_kind backend; /* default memory */
	struct redis_config redis;
	struct memory_config memory;
	bool backend_required;		   /* default false */
	enum rl_on_error on_backend_error; /* default allow */

	int auth_deny_status;		 /* default 429; 400..599 */
	struct client_ip_policy auth_ip; /* xff_trusted_hops 0,
					  * client_ip auto,
					  * ipv6_prefix 64 */

	struct rule *rules; /* array of nrules, in file order */
	size_t nrules;
	/* The rules by name, for config_find_rule(): open addressing over
	 * rule_nslots slots (a power of two, at least twice the rules), each
	 * a rule's place in rules + 1, or 0 when empty.  The loader builds
	 * it; a config made by hand has none and is searched in order. */
	size_t *rule_slots;
	size_t rule_nslots;
	struct stat_def *stats; /* array of nstats, in file order */
	size_t nstats;

	/* Where user and admin_token_file are in the file, for --check's
	 * errors. */
	struct config_place user_at;
	struct config_place admin_token_file_at;

	/* Unique among the configs of one process, in load order: what is
	 * kept across a reload names the config it was made under by it
	 * (core/prefetch.h). */
	uint64_t serial;
	int refs; /* atomic; see config_ref() */
};

/* Load and validate path.  Returns a new config with one reference, or NULL
 * with "FILE:LINE:COL: message" (or "FILE: message" when there is no
 * position, e.g. the file cannot be opened) in err.  Any thread. */
struct config *config_load(const char *path, char *err, size_t errlen);

/* The same for YAML text already in memory; `name` stands for FILE in
 * messages.  Used by config_load() and the unit tests. */
struct config *config_load_string(const char *name, const char *text,
    size_t len, char *err, size_t errlen);

/* Apply RATELIMITD_LISTEN, RATELIMITD_REDIS_URL and RATELIMITD_LOG_LEVEL from
 * the environment (docs/man/ratelimitd.8).  Call before the config is shared.
 * Returns 0, or -1 with "RATELIMITD_X: message" in err. */
int config_apply_env(struct config *c, char *err, size_t errlen);

/* Take one more reference / drop one; the last unref frees.  Any thread.
 * config_unref(NULL) does nothing. */
struct config *config_ref(struct config *c);
void config_unref(struct config *c);

/*
 * The keys that apply only at the next start (the config key table flags
 * them: listen, threads, backend, redis.url, ...) and differ between old
 * and c: fn(key, arg) once for each, key like "redis.pool_size".  Returns
 * how many.  Used by a reload to say what it did not apply.  Any thread.
 */
size_t config_start_only_changes(const struct config *old,
    const struct config *c, void (*fn)(const char *key, void *arg), void *arg);

/*
 * Give c, a config not yet shared, the values of old for every key that
 * applies only at the next start (the same keys as above), so that a
 * reload never publishes one that per-request code would then read
 * (docs/configuration.md), then check again the redis keys across (a
 * kept URL against a new tls).  Strings and lists are copied; old is only
 * read.  Returns 0, or -1 with the reason in err (out of memory, or keys
 * that no longer agree; c is then only fit to unref).  Any thread.
 */
int config_keep_start_only(struct config *c, const struct config *old,
    char *err, size_t errlen) __attribute__((warn_unused_result));

/* Rule by name, or NULL.  Borrowed for the life of c. */
const struct rule *config_find_rule(const struct config *c, const char *name);
/* Stat by name, or NULL.  Borrowed for the life of c. */
const struct stat_def *config_find_stat(const struct config *c,
    const char *name);

/*
 * docs/admin.md, GET /admin/config: c as a JSON object, every key of the
 * running config, every secret (a password in redis.url) replaced by
 * "***" and no file read; rules with their match, key, limit, window,
 * algorithm, cost, shadow and prefetch.  A new string (free()), or NULL
 * when out of memory.  Any thread.
 */
char *config_to_json(const struct config *c);

const char *config_backend_name(enum rl_backend_kind kind);
const char *config_on_error_name(enum rl_on_error e);

#endif
