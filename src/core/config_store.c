/*
 * config_store.c - the sections of the rules file (docs/configuration.md)
 * that configure the stores: redis (its address, Cluster seed nodes,
 * Sentinel, pool and timeout) and memory.  Each is a key table for the
 * engine in config_table.c, plus the checks that span keys; the top-level
 * table in config.c points at them.
 *
 * A Redis address is parsed here already, so that `ratelimitd --check`
 * catches a bad one; messages never show a password (redis_url_parse()
 * redacts it).  The files of redis.tls are named here with where they are
 * named: reading them needs the TLS library, which only the store links
 * (store/redis_tls.h), so main.c's --check reads them and places an error
 * with the line and column kept here.
 */
#include "core/config_priv.h"

#include <string.h>

#include "core/redis_url.h"
#include "base/util.h"

/* redis.cluster, redis.sentinel.nodes: a sequence of "host:port".  dst:
 * the string_list. */
static int
parse_hostports(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	static const char expect[] = "a sequence of \"host:port\" strings";
	struct string_list *l = dst;
	yaml_node_item_t *it;
	size_t n;

	if (cfg_is_null(v))
		return 0;
	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	if (n == 0)
		return 0;
	if ((l->v = rl_calloc(n, sizeof(*l->v))) == NULL)
		return cfg_oom(ld);
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top;
	     it++) {
		yaml_node_t *e = yaml_document_get_node(ld->doc, *it);
		char q[QUOTE_MAX];
		const char *s, *colon;
		int64_t port;

		if ((s = cfg_scalar(ld, what, e, expect)) == NULL)
			return -1;
		colon = strrchr(s, ':');
		if (colon == NULL || colon == s ||
		    util_parse_int64(colon + 1, &port) != 0 || port < 1 ||
		    port > 65535) {
			cfg_errf(ld, e, "%s: expected \"host:port\", got %s",
			    what, cfg_quote(q, s));
			return -1;
		}
		if ((l->v[l->n] = rl_strdup(s)) == NULL)
			return cfg_oom(ld);
		l->n++;
	}
	return 0;
}

/*
 * True iff url parses as a Redis address; else false with the (redacted)
 * reason in err, or "out of memory" when oom is set.
 */
bool
cfg_redis_url_is_valid(const char *url, char *err, size_t errlen, bool *oom_out)
{
	struct redis_url u;

	*oom_out = false;
	if (redis_url_parse(url, &u, err, errlen) != 0) {
		*oom_out = strcmp(err, "out of memory") == 0;
		return false;
	}
	redis_url_free(&u);
	return true;
}

/* redis.url, checked now so that --check catches a bad address.  dst: the
 * char *url.  Messages never show a password (redis_url_parse redacts). */
static int
parse_redis_url(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	char uerr[256];
	const char *s;
	bool nomem;

	if ((s = cfg_scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (!cfg_redis_url_is_valid(s, uerr, sizeof(uerr), &nomem)) {
		if (nomem)
			return cfg_oom(ld);
		cfg_errf(ld, v, "%s: %s", what, uerr);
		return -1;
	}
	return cfg_parse_string(ld, what, v, false, dst);
}

/* A file of redis.tls: its path, and where the value is, so that
 * `--check` can place a file that does not load.  dst: the struct
 * tls_file. */
static int
parse_tls_file(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct tls_file *f = dst;

	if (cfg_parse_string(ld, what, v, false, &f->path) == -1)
		return -1;
	f->line = (int)v->start_mark.line + 1;
	f->col = (int)v->start_mark.column + 1;
	return 0;
}

#define TO(f) offsetof(struct redis_tls_config, f)
/* clang-format off */
static const struct field tls_fields[] = {
	{ "ca_file",     F_CUSTOM, TO(ca_file),     0, 0, parse_tls_file, 0,
	    NULL },
	{ "cert_file",   F_CUSTOM, TO(cert_file),   0, 0, parse_tls_file, 0,
	    NULL },
	{ "key_file",    F_CUSTOM, TO(key_file),    0, 0, parse_tls_file, 0,
	    NULL },
	{ "server_name", F_STRING, TO(server_name), 0, 0, NULL, 0, NULL },
};
/* clang-format on */
#undef TO

static const struct schema tls_schema = { "redis.tls", "redis.tls.", tls_fields,
	NELEM(tls_fields) };

/* redis.tls: the files are read by the store (and by --check), not here;
 * a client certificate needs its key and the key its certificate.  dst:
 * the struct redis_tls_config. */
static int
parse_tls(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct redis_tls_config *tc = dst;

	if (cfg_walk_mapping(ld, what, v, &tls_schema, dst, NULL) == -1)
		return -1;
	tc->section = true;
	if ((tc->cert_file.path == NULL) != (tc->key_file.path == NULL)) {
		cfg_errf(ld, v, "%s: cert_file and key_file go together", what);
		return -1;
	}
	return 0;
}

bool
config_redis_tls_is_on(const struct redis_config *rc)
{
	struct redis_url u;
	char err[256];
	bool on;

	if (rc->tls.section)
		return true;
	if (rc->url == NULL || redis_url_parse(rc->url, &u, err, sizeof(err)))
		return false;
	on = u.tls;
	redis_url_free(&u);
	return on;
}

bool
config_redis_tls_switches(const struct redis_config *old,
    const struct redis_config *c)
{
	struct redis_config kept = *c;

	kept.url = old->url;
	return config_redis_tls_is_on(old) != config_redis_tls_is_on(&kept);
}

/* A copy of src's path, or NULL; false when out of memory. */
static bool
tls_file_copy(struct tls_file *dst, const struct tls_file *src)
{
	*dst = *src;
	dst->path = NULL;
	return src->path == NULL || (dst->path = rl_strdup(src->path)) != NULL;
}

int
cfg_redis_tls_keep(struct redis_tls_config *dst,
    const struct redis_tls_config *src)
{
	struct redis_tls_config t = { .section = src->section };

	if (!tls_file_copy(&t.ca_file, &src->ca_file) ||
	    !tls_file_copy(&t.cert_file, &src->cert_file) ||
	    !tls_file_copy(&t.key_file, &src->key_file) ||
	    (src->server_name != NULL &&
		(t.server_name = rl_strdup(src->server_name)) == NULL))
		goto oom;
	rl_free(dst->ca_file.path);
	rl_free(dst->cert_file.path);
	rl_free(dst->key_file.path);
	rl_free(dst->server_name);
	*dst = t;
	return 0;
oom:
	rl_free(t.ca_file.path);
	rl_free(t.cert_file.path);
	rl_free(t.key_file.path);
	return -1;
}

#define SO(f) offsetof(struct sentinel_config, f)
/* clang-format off */
static const struct field sentinel_fields[] = {
	{ "master",        F_STRING,   SO(master),        0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "nodes",         F_CUSTOM,   SO(nodes),         0, 0,
	    parse_hostports, F_START_ONLY | F_CMP_LIST, NULL },
	{ "password_file", F_STRING,   SO(password_file), 0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "tls",           F_BOOL,     SO(tls),           0, 0, NULL,
	    F_START_ONLY, NULL },
};
/* clang-format on */
#undef SO

static const struct schema sentinel_schema = { "redis.sentinel",
	"redis.sentinel.", sentinel_fields, NELEM(sentinel_fields) };

/* redis.sentinel: master and at least one node.  dst: the
 * struct sentinel_config. */
static int
parse_sentinel(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	yaml_node_t *seen[MAX_FIELDS] = { NULL };
	struct sentinel_config *sc = dst;

	if (cfg_is_null(v))
		return 0;
	if (cfg_walk_mapping(ld, what, v, &sentinel_schema, dst, seen) == -1)
		return -1;
	sc->password_file_at = cfg_place_of(&sentinel_schema, seen,
	    "password_file");
	if (sc->master == NULL || sc->nnodes == 0) {
		cfg_errf(ld, v, "%s: needs master and at least one of nodes",
		    what);
		return -1;
	}
	return 0;
}

#define RO(f) offsetof(struct redis_config, f)
/* clang-format off */
static const struct field redis_fields[] = {
	{ "url",           F_CUSTOM,   RO(url),           0, 0,
	    parse_redis_url, F_START_ONLY, NULL },
	{ "cluster",       F_CUSTOM,   RO(cluster),       0, 0,
	    parse_hostports, F_START_ONLY | F_CMP_LIST, NULL },
	{ "sentinel",      F_CUSTOM,   RO(sentinel),      0, 0,
	    parse_sentinel, 0, &sentinel_schema },
	{ "pool_size",     F_INT,      RO(pool_size),     1, 1024, NULL,
	    F_START_ONLY, NULL },
	{ "timeout",       F_DURATION, RO(timeout_ms),    1, DAY_MS, NULL,
	    F_START_ONLY, NULL },
	{ "key_prefix",    F_STRING0,  RO(key_prefix),    0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "password_file", F_STRING,   RO(password_file), 0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "tls",           F_CUSTOM,   RO(tls),           0, 0, parse_tls, 0,
	    &tls_schema },
};
/* clang-format on */
#undef RO

/* clang-format off */
static const struct field memory_fields[] = {
	{ "max_keys", F_INT64, offsetof(struct memory_config, max_keys),
	    1, INT64_MAX, NULL, F_START_ONLY, NULL },
};
/* clang-format on */

const struct schema cfg_redis_schema = { "redis", "redis.", redis_fields,
	NELEM(redis_fields) };
const struct schema cfg_memory_schema = { "memory", "memory.", memory_fields,
	NELEM(memory_fields) };

_Static_assert(NELEM(redis_fields) <= MAX_FIELDS, "raise MAX_FIELDS");

/*
 * On Redis Cluster a key's slot is the CRC16 of its hash tag: the bytes
 * between its FIRST '{' and the next '}', or the whole name when those
 * are empty.  Every key the daemon names begins with the prefix
 * ("<key_prefix><rule>:{<key>}").  A prefix whose first '{' is followed
 * at once by '}' makes that tag empty: Redis then hashes each whole name,
 * which scatters the sub-windows of a stat key ("...{<t>}:<s>") over
 * slots that no one script may touch together.  Any other '{' still gives
 * every key one tag shared by the keys a script touches: a tag inside the
 * prefix ("{app}:") puts every key in its one slot, an unclosed '{' takes
 * the tag up to the key's own '}' (docs/configuration.md).
 */
static const char prefix_brace[] =
    "must not hold \"{}\" at its first '{' with redis.cluster: Redis "
    "Cluster would hash each key's whole name instead of its tag";

static bool
prefix_is_bad(const struct redis_config *rc)
{
	const char *b;

	return rc->ncluster > 0 && rc->key_prefix != NULL &&
	    (b = strchr(rc->key_prefix, '{')) != NULL && b[1] == '}';
}

int
cfg_redis_check(const struct redis_config *rc, char *err, size_t errlen,
    bool *oom_out)
{
	struct redis_url u;
	bool bad_cluster, bad_tls;

	*oom_out = false;
	if (prefix_is_bad(rc)) {
		snprintf(err, errlen, "redis.key_prefix: %s", prefix_brace);
		return -1;
	}
	if (rc->ncluster > 0 && rc->sentinel.master != NULL) {
		snprintf(err, errlen,
		    "set redis.cluster or redis.sentinel, not both");
		return -1;
	}
	if (rc->url == NULL)
		return 0;
	/* A URL that does not parse is refused by its own check. */
	if (redis_url_parse(rc->url, &u, err, errlen) != 0) {
		*oom_out = strcmp(err, "out of memory") == 0;
		return *oom_out ? -1 : 0;
	}
	bad_cluster = rc->ncluster > 0 && (u.db != 0 || u.is_unix);
	bad_tls = u.is_unix && (rc->tls.section || u.tls);
	redis_url_free(&u);
	if (bad_cluster) {
		snprintf(err, errlen,
		    "Redis Cluster has only db 0 and TCP nodes; redis.url "
		    "may give credentials only");
		return -1;
	}
	if (bad_tls) {
		snprintf(err, errlen,
		    "TLS needs a TCP address (rediss://host:port); Redis "
		    "does not encrypt unix sockets");
		return -1;
	}
	return 0;
}

/* The node of key's value among seen (of cfg_redis_schema), else dflt. */
static yaml_node_t *
field_node(yaml_node_t *const seen[MAX_FIELDS], const char *key,
    yaml_node_t *dflt)
{
	size_t i;

	for (i = 0; i < cfg_redis_schema.nfields; i++)
		if (strcmp(cfg_redis_schema.fields[i].name, key) == 0 &&
		    seen[i] != NULL)
			return seen[i];
	return dflt;
}

int
cfg_parse_redis(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	yaml_node_t *seen[MAX_FIELDS] = { NULL };
	struct redis_config *rc = dst;
	char err[256];
	bool nomem;

	if (cfg_walk_mapping(ld, what, v, &cfg_redis_schema, dst, seen) == -1)
		return -1;
	rc->password_file_at = cfg_place_of(&cfg_redis_schema, seen,
	    "password_file");
	/* Placed at the prefix itself (the default holds no '{'). */
	if (prefix_is_bad(rc)) {
		cfg_errf(ld, field_node(seen, "key_prefix", v),
		    "%s.key_prefix: %s", what, prefix_brace);
		return -1;
	}
	if (cfg_redis_check(rc, err, sizeof(err), &nomem) == -1) {
		if (nomem)
			return cfg_oom(ld);
		cfg_errf(ld, v, "%s: %s", what, err);
		return -1;
	}
	return 0;
}

int
cfg_parse_memory(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	return cfg_walk_mapping(ld, what, v, &cfg_memory_schema, dst, NULL);
}
