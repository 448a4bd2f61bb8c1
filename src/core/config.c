/*
 * config.c - the YAML rules file (docs/configuration.md) into an immutable
 * struct config: the top level of the loader and the public API of config.h.
 *
 * The text is parsed whole with libyaml's document API (yaml_parser_load),
 * which keeps every node's position, and then walked against a small schema:
 * each mapping the file may hold (the top level, redis, memory, auth, a rule)
 * is a table with one line per key giving its type, bounds and destination,
 * in the manner of Redis's config.c.  Anything a user can get wrong is
 * reported as "FILE:LINE:COL: message" at the offending key or value, and
 * nothing half-built escapes: a load returns a complete snapshot or NULL,
 * which is what lets a reload keep the old rules.
 *
 * The loader is split by concern, with config_priv.h between the files:
 *   config_table.c  the engine: messages, strict scalars, the walk of a
 *                   mapping against a key table, the reload comparison
 *   config_store.c  the redis (and redis.sentinel) and memory sections
 *   config_rules.c  the rules section
 *   config_stats.c  the stats section
 *   config.c        this file: the top-level key table and the auth
 *                   section, loading a file or a string, the environment
 *                   overrides, which keys a reload cannot apply, and the
 *                   snapshot's references and look-ups
 */
#include "core/config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <yaml.h>

#include "core/config_priv.h"
#include "core/listen_addr.h"
#include "base/util.h"

#define MAX_FILE_BYTES (16 << 20) /* a rules file larger is a mistake */

static const char *const backend_names[] = {
	[RL_BACKEND_MEMORY] = "memory",
	[RL_BACKEND_REDIS] = "redis",
};
static const char *const on_error_names[] = {
	[RL_ON_ERROR_ALLOW] = "allow",
	[RL_ON_ERROR_DENY] = "deny",
	[RL_ON_ERROR_LOCAL] = "local",
};
static const char *const log_format_names[] = {
	[RL_LOG_LOGFMT] = "logfmt",
	[RL_LOG_JSON] = "json",
};

/* --- enums ------------------------------------------------------------- */

static int
parse_log_level(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	static const char expect[] = "debug, info, warn or error";
	const char *s;

	if ((s = cfg_scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (log_level_parse(s, dst) != 0) {
		cfg_errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	return 0;
}

static int
parse_log_format(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	int i = cfg_parse_enum(ld, what, v, log_format_names,
	    NELEM(log_format_names), "logfmt or json");

	if (i < 0)
		return -1;
	*(enum rl_log_format *)dst = (enum rl_log_format)i;
	return 0;
}

static int
parse_backend(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	int i = cfg_parse_enum(ld, what, v, backend_names, NELEM(backend_names),
	    "memory or redis");

	if (i < 0)
		return -1;
	*(enum rl_backend_kind *)dst = (enum rl_backend_kind)i;
	return 0;
}

static int
parse_on_error(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	int i = cfg_parse_enum(ld, what, v, on_error_names,
	    NELEM(on_error_names), "allow, deny or local");

	if (i < 0)
		return -1;
	*(enum rl_on_error *)dst = (enum rl_on_error)i;
	return 0;
}

/* --- auth -------------------------------------------------------------- */

static int
parse_client_ip(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	int i = cfg_parse_enum(ld, what, v, client_ip_source_names,
	    CLIENT_IP_NSOURCES, "auto, x-real-ip, x-forwarded-for or peer");

	if (i < 0)
		return -1;
	*(enum client_ip_source *)dst = (enum client_ip_source)i;
	return 0;
}

/* The auth section lives in struct config itself. */
#define AU(f) offsetof(struct config, f)
/* clang-format off */
static const struct field auth_fields[] = {
	{ "deny_status",      F_INT,    AU(auth_deny_status), 400, 599, NULL,
	    0, NULL },
	{ "xff_trusted_hops", F_INT,    AU(auth_ip.xff_trusted_hops), 0, 64,
	    NULL, 0, NULL },
	{ "client_ip",        F_CUSTOM, AU(auth_ip.source), 0, 0,
	    parse_client_ip, 0, NULL },
	{ "ipv6_prefix",      F_INT,    AU(auth_ip.ipv6_prefix), 1, 128,
	    NULL, 0, NULL },
};
/* clang-format on */
#undef AU

static const struct schema auth_schema = { "auth", "auth.", auth_fields,
	NELEM(auth_fields) };

static int
parse_auth(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	return cfg_walk_mapping(ld, what, v, &auth_schema, dst, NULL);
}

/* --- the top level ----------------------------------------------------- */

/* listen_mode: an octal file mode in a string, "0660". */
static int
parse_listen_mode(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	const char *s, *p;
	long m = 0;

	if ((s = cfg_scalar(ld, what, v, "a string")) == NULL)
		return -1;
	for (p = s; *p >= '0' && *p <= '7' && m <= 07777; p++)
		m = m * 8 + (*p - '0');
	if (*s == '\0' || *p != '\0' || m > 07777) {
		cfg_errf(ld, v,
		    "%s: expected an octal file mode such as "
		    "\"0660\"",
		    what);
		return -1;
	}
	*(int *)dst = (int)m;
	return 0;
}

static int
parse_listen(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct listen_addr a;
	char lerr[256];
	const char *s;

	if ((s = cfg_scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (*s == '\0') /* cfg_parse_string() says so */
		return cfg_parse_string(ld, what, v, false, dst);
	if (listen_addr_parse(s, &a, lerr, sizeof(lerr)) == -1) {
		cfg_errf(ld, v, "%s: %s", what, lerr);
		return -1;
	}
	return cfg_parse_string(ld, what, v, false, dst);
}

#define CO(f) offsetof(struct config, f)
/* clang-format off */
static const struct field top_fields[] = {
	{ "listen",           F_CUSTOM,   CO(listen),         0, 0,
	    parse_listen, F_START_ONLY, NULL },
	{ "grpc_listen",      F_CUSTOM,   CO(grpc_listen),    0, 0,
	    parse_listen, F_START_ONLY, NULL },
	{ "admin_listen",     F_CUSTOM,   CO(admin_listen),   0, 0,
	    parse_listen, F_START_ONLY, NULL },
	{ "admin_token_file", F_STRING,   CO(admin_token_file), 0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "threads",          F_INT,      CO(threads),        1, 1024, NULL,
	    F_START_ONLY, NULL },
	{ "max_body_bytes",   F_INT64,    CO(max_body_bytes), 1, 64 << 20,
	    NULL, 0, NULL },
	{ "max_connections",  F_INT64,    CO(max_connections), 1, 1000000,
	    NULL, 0, NULL },
	{ "idle_timeout",     F_DURATION, CO(idle_timeout_ms), 1000, DAY_MS,
	    NULL, F_START_ONLY, NULL },
	{ "request_timeout",  F_DURATION, CO(request_timeout_ms), 1, DAY_MS,
	    NULL, 0, NULL },
	{ "max_header_bytes", F_INT,      CO(max_header_bytes), 1024,
	    1 << 20, NULL, F_START_ONLY, NULL },
	{ "max_attributes",   F_INT,      CO(max_attributes), 1, 4096, NULL,
	    0, NULL },
	{ "user",             F_STRING,   CO(user),           0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "listen_mode",      F_CUSTOM,   CO(listen_mode),    0, 0,
	    parse_listen_mode, F_START_ONLY | F_CMP_ENUM, NULL },
	{ "shutdown_timeout", F_DURATION, CO(shutdown_timeout_ms),
	    0, DAY_MS, NULL, 0, NULL },
	{ "max_wait",         F_DURATION, CO(max_wait_ms),    0, DAY_MS,
	    NULL, 0, NULL },
	{ "max_waiting",      F_INT64,    CO(max_waiting),    0, 10000000,
	    NULL, 0, NULL },
	{ "log_level",        F_CUSTOM,   CO(log_level),      0, 0,
	    parse_log_level, 0, NULL },
	{ "log_format",       F_CUSTOM,   CO(log_format),     0, 0,
	    parse_log_format, 0, NULL },
	{ "access_log",       F_BOOL,     CO(access_log),     0, 0, NULL, 0,
	    NULL },
	{ "backend",          F_CUSTOM,   CO(backend),        0, 0,
	    parse_backend, F_START_ONLY | F_CMP_ENUM, NULL },
	{ "backend_required", F_BOOL,     CO(backend_required), 0, 0, NULL, 0,
	    NULL },
	{ "redis",            F_CUSTOM,   CO(redis),          0, 0,
	    cfg_parse_redis, 0, &cfg_redis_schema },
	{ "memory",           F_CUSTOM,   CO(memory),         0, 0,
	    cfg_parse_memory, 0, &cfg_memory_schema },
	{ "on_backend_error", F_CUSTOM,   CO(on_backend_error), 0, 0,
	    parse_on_error, 0, NULL },
	{ "auth",             F_CUSTOM,   0,                  0, 0,
	    parse_auth, 0, NULL },
	{ "rules",            F_CUSTOM,   0,                  0, 0,
	    cfg_parse_rules, 0, NULL },
	{ "stats",            F_CUSTOM,   0,                  0, 0,
	    cfg_parse_stats, 0, NULL },
};
/* clang-format on */
#undef CO

_Static_assert(NELEM(top_fields) <= MAX_FIELDS, "raise MAX_FIELDS");

static const struct schema top_schema = { NULL, "", top_fields,
	NELEM(top_fields) };

/* --- reload ------------------------------------------------------------ */

size_t
config_start_only_changes(const struct config *old, const struct config *c,
    void (*fn)(const char *key, void *arg), void *arg)
{
	size_t n = cfg_start_changes(&top_schema, (const char *)old,
	    (const char *)c, fn, arg);

	/* redis.tls is reloadable but for turning TLS on or off. */
	if (config_redis_tls_switches(&old->redis, &c->redis)) {
		fn("redis.tls", arg);
		n++;
	}
	return n;
}

int
config_keep_start_only(struct config *c, const struct config *old, char *err,
    size_t errlen)
{
	bool nomem = false, tls_kept;

	tls_kept = config_redis_tls_switches(&old->redis, &c->redis);
	if (cfg_keep_start(&top_schema, (char *)c, (const char *)old) == -1 ||
	    (tls_kept &&
		cfg_redis_tls_keep(&c->redis.tls, &old->redis.tls) == -1)) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	/* The redis keys kept (the URL, cluster, sentinel) and those a
	 * reload changes (tls) must still agree. */
	if (cfg_redis_check(&c->redis, err, errlen, &nomem) == -1)
		return -1;
	return 0;
}

/* --- loading ---------------------------------------------------------- */

static void
config_free(struct config *c)
{
	size_t i;

	if (c == NULL)
		return;
	for (i = 0; i < c->nrules; i++)
		rule_free_contents(&c->rules[i]);
	rl_free(c->rules);
	rl_free(c->rule_slots);
	for (i = 0; i < c->nstats; i++)
		rule_free_contents(&c->stats[i].rule);
	rl_free(c->stats);
	for (i = 0; i < c->redis.ncluster; i++)
		rl_free(c->redis.cluster[i]);
	rl_free(c->redis.cluster);
	for (i = 0; i < c->redis.sentinel.nnodes; i++)
		rl_free(c->redis.sentinel.nodes[i]);
	rl_free(c->redis.sentinel.nodes);
	rl_free(c->redis.sentinel.master);
	rl_free(c->redis.sentinel.password_file);
	rl_free(c->redis.url);
	rl_free(c->redis.key_prefix);
	rl_free(c->redis.password_file);
	rl_free(c->redis.tls.ca_file.path);
	rl_free(c->redis.tls.cert_file.path);
	rl_free(c->redis.tls.key_file.path);
	rl_free(c->redis.tls.server_name);
	rl_free(c->listen);
	rl_free(c->grpc_listen);
	rl_free(c->admin_listen);
	rl_free(c->admin_token_file);
	rl_free(c->user);
	rl_free(c->path);
	rl_free(c);
}

/* One event loop per core: more only take turns on the same cores. */
static int
config_default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

/* A config holding the defaults of config.h, or NULL (out of memory). */
static struct config *
config_new(const char *path)
{
	static atomic_uint_least64_t serials = 1; /* config.h, serial */
	struct config *c;

	if ((c = rl_calloc(1, sizeof(*c))) == NULL)
		return NULL;
	c->serial = atomic_fetch_add(&serials, 1);
	c->refs = 1;
	c->threads = config_default_threads();
	c->max_body_bytes = 16384;
	c->max_connections = 10000;
	c->idle_timeout_ms = 60000;
	c->request_timeout_ms = 10000;
	c->max_header_bytes = 8192;
	c->max_attributes = 64;
	c->listen_mode = -1;
	c->shutdown_timeout_ms = 10000;
	c->max_wait_ms = 30000;
	c->max_waiting = 10000;
	c->log_level = LOG_LEVEL_INFO;
	c->log_format = RL_LOG_LOGFMT;
	c->access_log = false;
	c->backend = RL_BACKEND_MEMORY;
	c->redis.pool_size = 8;
	c->redis.timeout_ms = 50;
	c->memory.max_keys = 1000000;
	c->backend_required = false;
	c->on_backend_error = RL_ON_ERROR_ALLOW;
	c->auth_deny_status = 429;
	c->auth_ip.source = CLIENT_IP_AUTO;
	c->auth_ip.xff_trusted_hops = 0;
	c->auth_ip.ipv6_prefix = 64;
	if ((c->path = rl_strdup(path)) == NULL ||
	    (c->listen = rl_strdup("127.0.0.1:8080")) == NULL ||
	    (c->redis.url = rl_strdup("redis://127.0.0.1:6379/0")) == NULL ||
	    (c->redis.key_prefix = rl_strdup("rl:")) == NULL) {
		config_free(c);
		return NULL;
	}
	return c;
}

/*
 * The parser holds no second document.  It is an error, found before any
 * semantics so that syntax errors anywhere in the file come first.
 * Returns 0 or -1.
 */
static int
load_no_second_document(struct loader *ld, yaml_parser_t *parser)
{
	yaml_document_t extra;
	yaml_node_t *next;

	if (!yaml_parser_load(parser, &extra)) {
		cfg_yaml_error(ld, parser);
		return -1;
	}
	next = yaml_document_get_root_node(&extra);
	if (next != NULL)
		cfg_errf(ld, next, "only one YAML document is allowed");
	yaml_document_delete(&extra);
	return next != NULL ? -1 : 0;
}

struct config_place
cfg_place_of(const struct schema *s, yaml_node_t *const seen[MAX_FIELDS],
    const char *key)
{
	struct config_place at = { 0, 0 };
	size_t i;

	for (i = 0; i < s->nfields; i++)
		if (strcmp(s->fields[i].name, key) == 0 && seen[i] != NULL) {
			at.line = (int)seen[i]->start_mark.line + 1;
			at.col = (int)seen[i]->start_mark.column + 1;
		}
	return at;
}

/* The listeners of a config, by key, for the check that each has an
 * address of its own. */
struct listener {
	const char *key;
	const char *addr; /* NULL: off */
};

/* The first two of the n listeners l that share an address
 * (listen_addr_is_shared()): 0 with *i < *j their indexes, or -1 when each
 * has its own.  Each address parses (its key's parser checked it). */
static int
listeners_shared(const struct listener *l, size_t n, size_t *i, size_t *j)
{
	struct listen_addr a, b;
	char lerr[256];

	for (*i = 0; *i < n; (*i)++) {
		if (l[*i].addr == NULL ||
		    listen_addr_parse(l[*i].addr, &a, lerr, sizeof(lerr)) != 0)
			continue;
		for (*j = *i + 1; *j < n; (*j)++)
			if (l[*j].addr != NULL &&
			    listen_addr_parse(l[*j].addr, &b, lerr,
				sizeof(lerr)) == 0 &&
			    listen_addr_is_shared(&a, &b))
				return 0;
	}
	return -1;
}

/* Where n is in the file, -1 for none (a key left at its default). */
static long
node_index(const yaml_node_t *n)
{
	return n != NULL ? (long)n->start_mark.index : -1;
}

/*
 * listen, grpc_listen and admin_listen each need an address of their own
 * (docs/configuration.md): start-up would fail to bind the second.  The
 * error is at the later of the two in the file, and names both.  0 or -1.
 */
static int
check_listeners(struct loader *ld, const struct config *c,
    yaml_node_t *const seen[MAX_FIELDS])
{
	const struct listener l[] = { { "listen", c->listen },
		{ "grpc_listen", c->grpc_listen },
		{ "admin_listen", c->admin_listen } };
	yaml_node_t *ni = NULL, *nj = NULL, *n;
	char qa[QUOTE_MAX], qb[QUOTE_MAX];
	size_t i, j, k;

	if (listeners_shared(l, NELEM(l), &i, &j) != 0)
		return 0;
	for (k = 0; k < NELEM(top_fields); k++) {
		if (strcmp(top_fields[k].name, l[i].key) == 0)
			ni = seen[k];
		if (strcmp(top_fields[k].name, l[j].key) == 0)
			nj = seen[k];
	}
	if (node_index(ni) > node_index(nj)) { /* j: the later one */
		k = i;
		i = j;
		j = k;
		n = ni;
		ni = nj;
		nj = n;
	}
	/* Only listen has a default: nj, the later, is in the file. */
	cfg_errf(ld, nj,
	    "%s: %s shares its address with %s %s%s; each needs an "
	    "address of its own",
	    l[j].key, cfg_quote(qa, l[j].addr), l[i].key,
	    cfg_quote(qb, l[i].addr), ni == NULL ? " (its default)" : "");
	return -1;
}

/* Fill c from the top-level mapping of ld->doc (none: the defaults).
 * Returns 0 or -1. */
static int
load_top_level(struct loader *ld, struct config *c)
{
	yaml_node_t *root = yaml_document_get_root_node(ld->doc);
	yaml_node_t *seen[MAX_FIELDS] = { NULL };

	if (root == NULL || cfg_is_null(root))
		return 0;
	if (root->type != YAML_MAPPING_NODE) {
		cfg_errf(ld, root,
		    "expected a mapping of settings at the top "
		    "level");
		return -1;
	}
	if (cfg_walk_mapping(ld, "top level", root, &top_schema, c, seen) != 0)
		return -1;
	if (check_listeners(ld, c, seen) != 0)
		return -1;
	c->user_at = cfg_place_of(&top_schema, seen, "user");
	c->admin_token_file_at = cfg_place_of(&top_schema, seen,
	    "admin_token_file");
	return 0;
}

struct config *
config_load_string(const char *name, const char *text, size_t len, char *err,
    size_t errlen)
{
	struct loader ld = { name, text != NULL ? text : "", len, NULL, err,
		errlen };
	yaml_parser_t parser;
	yaml_document_t doc;
	struct config *c, *ret = NULL;

	if (text == NULL)
		ld.len = 0;
	if ((c = config_new(name)) == NULL) {
		cfg_oom(&ld);
		return NULL;
	}
	if (!yaml_parser_initialize(&parser)) {
		cfg_oom(&ld);
		goto out;
	}
	yaml_parser_set_input_string(&parser, (const unsigned char *)ld.text,
	    ld.len);
	if (!yaml_parser_load(&parser, &doc)) { /* deletes doc on failure */
		cfg_yaml_error(&ld, &parser);
		goto out_parser;
	}
	ld.doc = &doc;
	if (load_no_second_document(&ld, &parser) != 0 ||
	    load_top_level(&ld, c) != 0)
		goto out_doc;
	ret = c;
	c = NULL;
out_doc:
	yaml_document_delete(&doc);
out_parser:
	yaml_parser_delete(&parser);
out:
	config_free(c);
	return ret;
}

struct config *
config_load(const char *path, char *err, size_t errlen)
{
	struct loader ld = { path, NULL, 0, NULL, err, errlen };
	struct config *c = NULL;
	char *buf = NULL, *nbuf, eb[128];
	size_t len = 0, cap = 0;
	ssize_t n;
	int fd;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1) {
		if (err != NULL && errlen > 0)
			snprintf(err, errlen, "%s: cannot open: %s", path,
			    strerror_r(errno, eb, sizeof(eb)));
		return NULL;
	}
	for (;;) {
		if (len == cap) {
			if (cap >= MAX_FILE_BYTES) {
				if (err != NULL && errlen > 0)
					snprintf(err, errlen,
					    "%s: larger "
					    "than %d MiB",
					    path, MAX_FILE_BYTES >> 20);
				goto out;
			}
			cap = cap == 0 ? 8192 : cap * 2;
			if ((nbuf = rl_realloc(buf, cap)) == NULL) {
				cfg_oom(&ld);
				goto out;
			}
			buf = nbuf;
		}
		n = read(fd, buf + len, cap - len);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1) {
			if (err != NULL && errlen > 0)
				snprintf(err, errlen, "%s: cannot read: %s",
				    path, strerror_r(errno, eb, sizeof(eb)));
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	c = config_load_string(path, buf, len, err, errlen);
out:
	close(fd);
	rl_free(buf);
	return c;
}

/* --- the environment -------------------------------------------------- */

/* Set err to "VAR: message"; returns -1. */
static int
env_error(char *err, size_t errlen, const char *var, const char *msg)
{
	if (err != NULL && errlen > 0)
		snprintf(err, errlen, "%s: %s", var, msg);
	return -1;
}

/* Does listen, replacing c's, share its address with grpc_listen or
 * admin_listen (which the load found apart)?  If so, say so in msg. */
static bool
env_listen_shared(const struct config *c, const char *listen, char *msg,
    size_t msglen)
{
	const struct listener l[] = { { "RATELIMITD_LISTEN", listen },
		{ "grpc_listen", c->grpc_listen },
		{ "admin_listen", c->admin_listen } };
	char qa[QUOTE_MAX], qb[QUOTE_MAX];
	size_t i, j;

	if (listeners_shared(l, NELEM(l), &i, &j) != 0 || i != 0)
		return false;
	snprintf(msg, msglen,
	    "%s shares its address with %s %s; each needs an address of "
	    "its own",
	    cfg_quote(qa, l[i].addr), l[j].key, cfg_quote(qb, l[j].addr));
	return true;
}

int
config_apply_env(struct config *c, char *err, size_t errlen)
{
	const char *listen = getenv("RATELIMITD_LISTEN");
	const char *url = getenv("RATELIMITD_REDIS_URL");
	const char *level = getenv("RATELIMITD_LOG_LEVEL");
	char *nlisten = NULL, *nurl = NULL, uerr[256];
	struct listen_addr la;
	enum log_level lv = c->log_level;
	bool nomem;

	/* Check and copy everything first, so that a failure changes
	 * nothing. */
	if (listen != NULL && *listen == '\0')
		return env_error(err, errlen, "RATELIMITD_LISTEN",
		    "must not be empty");
	if (listen != NULL &&
	    listen_addr_parse(listen, &la, uerr, sizeof(uerr)) == -1)
		return env_error(err, errlen, "RATELIMITD_LISTEN", uerr);
	if (listen != NULL && env_listen_shared(c, listen, uerr, sizeof(uerr)))
		return env_error(err, errlen, "RATELIMITD_LISTEN", uerr);
	if (url != NULL && *url == '\0')
		return env_error(err, errlen, "RATELIMITD_REDIS_URL",
		    "must not be empty");
	if (url != NULL &&
	    !cfg_redis_url_is_valid(url, uerr, sizeof(uerr), &nomem))
		return env_error(err, errlen, "RATELIMITD_REDIS_URL", uerr);
	if (level != NULL && log_level_parse(level, &lv) != 0)
		return env_error(err, errlen, "RATELIMITD_LOG_LEVEL",
		    "expected debug, info, warn or error");
	if (listen != NULL && (nlisten = rl_strdup(listen)) == NULL)
		return env_error(err, errlen, "RATELIMITD_LISTEN",
		    "out of memory");
	if (url != NULL && (nurl = rl_strdup(url)) == NULL) {
		rl_free(nlisten);
		return env_error(err, errlen, "RATELIMITD_REDIS_URL",
		    "out of memory");
	}

	/* The new URL with the rest of redis: the checks across its keys,
	 * as for redis.url (an out-of-memory reason says so itself). */
	if (nurl != NULL) {
		struct redis_config rc = c->redis;

		rc.url = nurl;
		if (cfg_redis_check(&rc, uerr, sizeof(uerr), &nomem) == -1) {
			rl_free(nlisten);
			rl_free(nurl);
			return env_error(err, errlen, "RATELIMITD_REDIS_URL",
			    uerr);
		}
	}
	if (nlisten != NULL) {
		rl_free(c->listen);
		c->listen = nlisten;
	}
	if (nurl != NULL) {
		rl_free(c->redis.url);
		c->redis.url = nurl;
	}
	c->log_level = lv;
	return 0;
}

/* --- references and look-ups ------------------------------------------ */

struct config *
config_ref(struct config *c)
{
	if (c != NULL)
		__atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
	return c;
}

void
config_unref(struct config *c)
{
	if (c != NULL && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
		config_free(c);
}

/* The slot of name in c's rule index: the one holding its rule (*found
 * set), or the empty one where it would go (*found NULL). */
static size_t
rule_slot(const struct config *c, const char *name, const struct rule **found)
{
	size_t mask = c->rule_nslots - 1, i, v;

	i = (size_t)util_fnv1a(name, strlen(name)) & mask;
	while ((v = c->rule_slots[i]) != 0) {
		if (strcmp(c->rules[v - 1].name, name) == 0) {
			*found = &c->rules[v - 1];
			return i;
		}
		i = (i + 1) & mask;
	}
	*found = NULL;
	return i;
}

int
cfg_rule_index_init(struct config *c, size_t n)
{
	size_t slots = 2;

	while (slots < n && slots <= SIZE_MAX / 4)
		slots <<= 1;
	if ((c->rule_slots = rl_calloc(slots * 2, sizeof(size_t))) == NULL)
		return -1;
	c->rule_nslots = slots * 2;
	return 0;
}

const struct rule *
cfg_rule_index_put(struct config *c, const struct rule *r)
{
	const struct rule *found;
	size_t i = rule_slot(c, r->name, &found);

	if (found == NULL)
		c->rule_slots[i] = (size_t)(r - c->rules) + 1;
	return found;
}

const struct rule *
config_find_rule(const struct config *c, const char *name)
{
	const struct rule *r;
	size_t i;

	if (c == NULL || name == NULL)
		return NULL;
	if (c->rule_slots != NULL) {
		(void)rule_slot(c, name, &r);
		return r;
	}
	for (i = 0; i < c->nrules; i++)
		if (c->rules[i].name != NULL &&
		    strcmp(c->rules[i].name, name) == 0)
			return &c->rules[i];
	return NULL;
}

const struct stat_def *
config_find_stat(const struct config *c, const char *name)
{
	size_t i;

	if (c == NULL || name == NULL)
		return NULL;
	for (i = 0; i < c->nstats; i++)
		if (c->stats[i].rule.name != NULL &&
		    strcmp(c->stats[i].rule.name, name) == 0)
			return &c->stats[i];
	return NULL;
}

const char *
config_backend_name(enum rl_backend_kind kind)
{
	if ((size_t)kind < NELEM(backend_names))
		return backend_names[kind];
	return "unknown";
}

const char *
config_on_error_name(enum rl_on_error e)
{
	if ((size_t)e < NELEM(on_error_names))
		return on_error_names[e];
	return "unknown";
}
