/*
 * admin_store.c - the admin endpoints that ask the store (docs/admin.md):
 * /admin/counters (read a key's usage without consuming it, reset it) and
 * /admin/overrides (limits per key).
 *
 * A counter is read with the rule's check at cost 0, which records
 * nothing in any algorithm (docs/algorithms.md) and answers what is left;
 * the retry of one unit is the effective window when nothing is left.
 *
 * Thread: the connection's own, which waits for the store.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/metrics.h"
#include "base/util.h"
#include "core/backend.h"
#include "core/deny_cache.h"
#include "core/lease.h"
#include "core/overrides.h"
#include "core/prefetch.h"
#include "core/request_json.h"
#include "core/rules.h"
#include "front/admin_priv.h"
#include "front/lease_wait.h"

/* GET of a rule's overrides on Redis: reads of the hash at most, while
 * another change of the table overtakes each. */
#define OVERRIDE_LIST_READS 3

/* The query's rule and key: 0, or -1 answered (400).  Checked before
 * anything is read or written: a key that is not UTF-8 could not be put
 * in the answer (docs/admin.md).  *name is the rule's name, *r the rule,
 * or NULL for a rule cfg does not have whose overrides `held` still holds
 * (held NULL: none such accepted). */
static int
query_rule_key(struct MHD_Connection *conn, const struct config *cfg,
    struct overrides *held, const char **name, const struct rule **r,
    const char **key, bool *given, int *ret)
{
	size_t nlen = 0, klen = 0;

	*name = *key = NULL;
	(void)MHD_lookup_connection_value_n(conn, MHD_GET_ARGUMENT_KIND, "rule",
	    4, name, &nlen);
	(void)MHD_lookup_connection_value_n(conn, MHD_GET_ARGUMENT_KIND, "key",
	    3, key, &klen);
	*given = *key != NULL;
	if (*key == NULL)
		*key = ""; /* a rule without a key: its one counter */
	if (*name == NULL) {
		*ret = admin_error(conn, 400, "unknown_rule",
		    "the query needs rule=");
		return -1;
	}
	/* An encoded NUL (%00) would cut the value short, and act on the
	 * rule or key before it: no name nor rendered key holds one. */
	if (strlen(*name) != nlen) {
		*ret = admin_error(conn, 400, "unknown_rule",
		    "rule= has an encoded NUL (%%00)");
		return -1;
	}
	if (strlen(*key) != klen) {
		*ret = admin_error(conn, 400, "invalid_key",
		    "key= has an encoded NUL (%%00)");
		return -1;
	}
	if (!util_utf8_valid(*name)) {
		*ret = admin_error(conn, 400, "unknown_rule",
		    "rule= is not valid UTF-8");
		return -1;
	}
	if ((*r = config_find_rule(cfg, *name)) == NULL &&
	    !overrides_has_rule(held, cfg->redis.key_prefix, *name)) {
		*ret = admin_error(conn, 400, "unknown_rule",
		    "no rule named \"%s\"", *name);
		return -1;
	}
	if (strlen(*key) > RL_MAX_KEY_BYTES) {
		*ret = admin_error(conn, 400, "key_too_long",
		    "the key is longer than %d bytes", RL_MAX_KEY_BYTES);
		return -1;
	}
	if (!util_utf8_valid(*key)) {
		*ret = admin_error(conn, 400, "invalid_key",
		    "key= is not valid UTF-8 (percent-encode the key's UTF-8 "
		    "bytes)");
		return -1;
	}
	return 0;
}

/*
 * Does key name a counter of rule r (docs/admin.md)?  A rule without a key
 * template has one counter, named by no key or "": any other is refused,
 * unless any_keyless (a DELETE of overrides, which must reach whatever GET
 * lists: one set by an older daemon, or while the rule had a template).  A
 * rule with a template needs the key named (given: the request names
 * one), "" included (a template renders it from empty attributes).
 * field: how the request names it ("key=", "\"key\"").  r NULL (a rule
 * the config no longer has): any key.  0, or -1 answered (400
 * invalid_key) in *ret.
 */
static int
key_fits_rule(struct MHD_Connection *conn, const struct rule *r,
    const char *key, bool given, bool any_keyless, const char *field, int *ret)
{
	char tmpl[96];

	if (r == NULL)
		return 0;
	if (r->key == NULL && key[0] != '\0' && !any_keyless) {
		*ret = admin_error(conn, 400, "invalid_key",
		    "rule \"%s\" has no key template: its one counter takes "
		    "no %s, or an empty one",
		    r->name, field);
		return -1;
	}
	if (r->key != NULL && !given) {
		*ret = admin_error(conn, 400, "invalid_key",
		    "rule \"%s\" has a key template (\"%s\"): name the key "
		    "it rendered with %s",
		    r->name, util_escape(tmpl, sizeof(tmpl), r->key->source),
		    field);
		return -1;
	}
	return 0;
}

/* "<prefix><rule>:{<key>}", as decide.c renders it.  New; NULL: OOM. */
static char *
store_key(const struct config *cfg, const struct rule *r, const char *key,
    size_t *len)
{
	size_t n = strlen(cfg->redis.key_prefix) + strlen(r->name) +
	    strlen(key) + 4;
	char *k = rl_malloc(n + 1);

	if (k != NULL)
		*len = (size_t)snprintf(k, n + 1, "%s%s:{%s}",
		    cfg->redis.key_prefix, r->name, key);
	return k;
}

static int
counter_read(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const struct rule *r, const char *key)
{
	char zero_token[LEASE_TOKEN_LEN + 1], err[BACKEND_ERR_MAX];
	enum backend_error_kind kind;
	struct rl_check c = { 0 };
	struct rl_result out = { 0 };
	int64_t limit = r->limit, window = r->window_ms;
	bool all;
	size_t len = 0;
	char *k;
	int ret;

	if ((k = store_key(cfg, r, key, &len)) == NULL)
		return admin_error(conn, 500, "internal_error",
		    "out of memory");
	if (overrides_get(s->overrides, k, len, util_realtime_us() / 1000,
		&limit, &window))
		limit = overrides_fit_limit(r->algorithm, limit, window);
	memset(zero_token, '0', LEASE_TOKEN_LEN);
	zero_token[LEASE_TOKEN_LEN] = '\0';
	c = (struct rl_check){
		.algorithm = r->algorithm,
		.limit = limit,
		.window_ms = window,
		.cost = 0,
		.key = k,
		.keylen = len,
		.token = r->algorithm == RL_ALG_CONCURRENCY ? zero_token : NULL,
	};
	if (backend_decide(s->decider->backend, &c, 1, &out, &all, &kind, err,
		sizeof(err)) < 0) {
		rl_free(k);
		return admin_error(conn, 503, "backend_unavailable",
		    "the %s store failed (%s)", s->decider->backend->name,
		    backend_error_kind_name(kind));
	}
	rl_free(k);
	/* One unit: at once while any is left; else when more comes back
	 * (a concurrency rule: when the last lease held expires, at the
	 * latest). */
	ret = admin_respond_json(conn, 200,
	    json_pack("{s:s, s:s, s:I, s:I, s:I, s:I}", "rule", r->name, "key",
		key, "limit", (json_int_t)limit, "remaining",
		(json_int_t)out.remaining, "reset_ms", (json_int_t)out.reset_ms,
		"retry_after_ms",
		(json_int_t)(out.remaining > 0 ? 0 :
			r->algorithm == RL_ALG_CONCURRENCY ?
						 out.reset_ms :
						 out.effective_ms)));
	return ret;
}

/* Drop the key's state in the store (and in the local fallback, which
 * may hold some from a degraded spell) and the quota held in advance for
 * it; this daemon's deny cache forgets every denial. */
static int
counter_reset(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const struct rule *r, const char *key)
{
	struct backend_admin a = { .op = BACKEND_ADMIN_RESET };
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX];
	struct backend_admin la;
	size_t len = 0;
	char *k;

	if ((k = store_key(cfg, r, key, &len)) == NULL)
		return admin_error(conn, 500, "internal_error",
		    "out of memory");
	a.key = k;
	a.keylen = len;
	if (backend_admin_call(s->decider->backend, &a, &kind, err,
		sizeof(err)) < 0) {
		rl_free(k);
		return admin_error(conn, 503, "backend_unavailable",
		    "the %s store failed (%s)", s->decider->backend->name,
		    backend_error_kind_name(kind));
	}
	if (s->decider->local != NULL &&
	    s->decider->local != s->decider->backend) {
		la = a;
		(void)backend_admin_call(s->decider->local, &la, &kind, err,
		    sizeof(err));
	}
	/* A concurrency key's leases went with it: its waiters here try
	 * again at once (on Redis every daemon hears it too, reset.lua). */
	if (a.found && r->algorithm == RL_ALG_CONCURRENCY && s->leases != NULL)
		lease_wait_released(s->leases, lease_key_hash(k, len));
	/* Units this daemon took in advance from the old counter would
	 * count twice against the new one (other daemons drop theirs when
	 * they hear reset.lua's notice). */
	prefetch_forget(s->decider->prefetch, k, len);
	rl_free(k);
	if (s->decider->deny != NULL)
		deny_cache_clear(s->decider->deny);
	metrics_admin_write(s->metrics, METRICS_ADMIN_COUNTER_RESET);
	admin_log_write(conn, "counter_reset", r->name, key,
	    a.found ? "reset" : "nothing to reset");
	return admin_respond_json(conn, 200,
	    json_pack("{s:s, s:s, s:b, s:b}", "rule", r->name, "key", key,
		"reset", 1, "found", a.found));
}

int
admin_handle_counters(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *method)
{
	const struct rule *r;
	const char *name, *key;
	bool given;
	int ret;
	/* HEAD is GET, its body left out by libmicrohttpd (docs/admin.md). */
	bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

	if (!get && strcmp(method, "DELETE") != 0)
		return admin_not_allowed(conn, method, "/admin/counters",
		    "GET, HEAD, DELETE");
	if (query_rule_key(conn, cfg, NULL, &name, &r, &key, &given, &ret) < 0)
		return ret;
	if (key_fits_rule(conn, r, key, given, false, "key=", &ret) < 0)
		return ret;
	return get ? counter_read(s, conn, cfg, r, key) :
		     counter_reset(s, conn, cfg, r, key);
}

/* --- overrides ------------------------------------------------------------ */

/* A duration: an integer of milliseconds, or a string "<n><unit>" with
 * ms, s, m, h or d, as in the config file.  0, or -1. */
static int
parse_duration(json_t *v, int64_t *ms)
{
	static const struct {
		const char *unit;
		int64_t ms;
	} units[] = { { "ms", 1 }, { "s", 1000 }, { "m", 60000 },
		{ "h", 3600000 }, { "d", 86400000 } };
	const char *str;
	char *end;
	long long n;
	size_t i;

	if (json_is_integer(v)) {
		*ms = json_integer_value(v);
		return 0;
	}
	if (!json_is_string(v))
		return -1;
	str = json_string_value(v);
	n = strtoll(str, &end, 10);
	if (end == str || n < 0)
		return -1;
	for (i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (strcmp(end, units[i].unit) == 0) {
			if (n > INT64_MAX / units[i].ms)
				return -1;
			*ms = n * units[i].ms;
			return 0;
		}
	return -1;
}

/* "<prefix>override:<rule>": the rule's hash on Redis.  New, or NULL. */
static char *
hash_key(const struct config *cfg, const char *rule, size_t *len)
{
	size_t n = strlen(cfg->redis.key_prefix) + 9 + strlen(rule);
	char *k = rl_malloc(n + 1);

	if (k != NULL)
		*len = (size_t)snprintf(k, n + 1, "%soverride:%s",
		    cfg->redis.key_prefix, rule);
	return k;
}

static bool
on_redis(const struct admin_server *s)
{
	return strcmp(s->decider->backend->name, "redis") == 0;
}

static int
store_failed(struct admin_server *s, struct MHD_Connection *conn,
    enum backend_error_kind kind)
{
	return admin_error(conn, 503, "backend_unavailable",
	    "the %s store failed (%s)", s->decider->backend->name,
	    backend_error_kind_name(kind));
}

/* The table holds OVERRIDES_MAX overrides (docs/admin.md); named, the
 * rules no longer configured that hold some of them, which only a DELETE
 * frees on the memory store. */
static int
overrides_full(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg)
{
	char names[512];

	if (overrides_unconfigured(s->overrides, cfg, 0, names,
		sizeof(names)) == 0)
		return admin_error(conn, 507, "too_many_overrides",
		    "%d overrides are set already: delete some first",
		    OVERRIDES_MAX);
	return admin_error(conn, 507, "too_many_overrides",
	    "%d overrides are set already: delete some first; rules no "
	    "longer configured hold some (GET and DELETE /admin/overrides "
	    "still name them): %s",
	    OVERRIDES_MAX, names);
}

/* Take back the set of a (OVERRIDE_SET, done) that this daemon's table
 * then had no room for: the field as it was, unless a write since
 * changed it (lua/override.lua's undo).  0, or -1 with *kind and err:
 * the field may still hold what the set wrote. */
static int
override_undo(struct admin_server *s, const struct backend_admin *a,
    enum backend_error_kind *kind, char *err, size_t errlen)
{
	struct backend_admin u = {
		.op = BACKEND_ADMIN_OVERRIDE_UNDO,
		.key = a->key,
		.keylen = a->keylen,
		.field = a->field,
		.fieldlen = a->fieldlen,
		.pairs = a->reply,
		.pairslen = a->replylen,
		.npairs = 1,
	};

	return backend_admin_call(s->decider->backend, &u, kind, err, errlen);
}

/* An override set or deleted here may raise a key's limit: every request
 * of this daemon that waits for a lease tries again (docs/admin.md); the
 * other daemons' do when their sync has read the notice (main.c). */
static void
wake_waiters(struct admin_server *s)
{
	if (s->leases != NULL)
		lease_wait_all(s->leases);
}

/* The change a set makes, for its log line: "limit 5, window 20000 ms,
 * ttl 700 ms"; the rule's window without one, no expiry without a TTL. */
static void
override_what(char *buf, size_t len, int64_t limit, int64_t window, int64_t ttl)
{
	char w[48], t[48];

	if (window > 0)
		snprintf(w, sizeof(w), "window %" PRId64 " ms", window);
	else
		snprintf(w, sizeof(w), "the rule's window");
	if (ttl > 0)
		snprintf(t, sizeof(t), "ttl %" PRId64 " ms", ttl);
	else
		snprintf(t, sizeof(t), "no expiry");
	snprintf(buf, len, "limit %" PRId64 ", %s, %s", limit, w, t);
}

/* The fields of a PUT's body (docs/admin.md); any other is refused, so
 * that a misspelt "tll" does not set an override without its TTL. */
static const char *const put_fields[] = { "rule", "key", "limit", "window",
	"ttl", NULL };

/* The PUT's body as an object whose fields are all put_fields: root (the
 * caller json_decref()s it), or NULL answered (400 invalid_json) in
 * *ret. */
static json_t *
put_body(struct MHD_Connection *conn, const char *body, size_t len, int *ret)
{
	struct request_error e;
	const char *name;
	char quoted[72];
	json_t *root, *v;
	size_t i;

	/* A name given twice is an error, as on the main listener, and
	 * said as it is said there. */
	if ((root = request_json_load(body != NULL ? body : "", len, 0, &e)) ==
	    NULL) {
		*ret = admin_error(conn, (unsigned)e.status, e.code, "%s",
		    e.message);
		return NULL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		*ret = admin_error(conn, 400, "invalid_json",
		    "the body is not a JSON object");
		return NULL;
	}
	json_object_foreach(root, name, v)
	{
		for (i = 0; put_fields[i] != NULL; i++)
			if (strcmp(name, put_fields[i]) == 0)
				break;
		if (put_fields[i] == NULL) {
			*ret = admin_error(conn, 400, "invalid_json",
			    "unknown field \"%s\": the body takes rule, key, "
			    "limit, window and ttl",
			    util_escape(quoted, sizeof(quoted), name));
			json_decref(root);
			return NULL;
		}
	}
	return root;
}

/* PUT {"rule", "key", "limit", "window"?, "ttl"?} */
static int
override_put(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *body, size_t len)
{
	json_t *root, *key_v, *window_v, *ttl_v;
	const char *name, *key;
	const struct rule *r;
	int64_t limit, window, ttl = 0, now_ms = util_realtime_us() / 1000;
	char value[64], what[128], err[BACKEND_ERR_MAX], *h = NULL;
	struct backend_admin a = { .op = BACKEND_ADMIN_OVERRIDE_SET };
	enum backend_error_kind kind;
	size_t hlen = 0;
	int ret;

	if ((root = put_body(conn, body, len, &ret)) == NULL)
		return ret;
	name = json_string_value(json_object_get(root, "rule"));
	/* null is absent, as for "window" and "ttl". */
	key_v = json_object_get(root, "key");
	if (json_is_null(key_v))
		key_v = NULL;
	key = key_v != NULL ? json_string_value(key_v) : "";
	if (name == NULL || (r = config_find_rule(cfg, name)) == NULL) {
		ret = admin_error(conn, 400, "unknown_rule",
		    "\"rule\" names no rule of the running config");
		goto out;
	}
	if (key == NULL || strlen(key) > RL_MAX_KEY_BYTES) {
		ret = admin_error(conn, 400, "invalid_key",
		    "\"key\" is a rendered key of at most %d bytes",
		    RL_MAX_KEY_BYTES);
		goto out;
	}
	if (key_fits_rule(conn, r, key, key_v != NULL, false, "\"key\"", &ret) <
	    0)
		goto out;
	if (!json_is_integer(json_object_get(root, "limit")) ||
	    (limit = json_integer_value(json_object_get(root, "limit"))) < 1 ||
	    limit > RL_MAX_LIMIT) {
		ret = admin_error(conn, 400, "invalid_limit",
		    "\"limit\" is an integer from 1 to %d, as a rule's",
		    RL_MAX_LIMIT);
		goto out;
	}
	/* null is absent, as for the main listener's reserved fields. */
	window_v = json_object_get(root, "window");
	ttl_v = json_object_get(root, "ttl");
	window = 0; /* the rule's, whatever it is when a decision asks */
	if (window_v != NULL && !json_is_null(window_v) &&
	    (parse_duration(window_v, &window) < 0 || window < 1 ||
		window > RL_MAX_WINDOW_MS)) {
		ret = admin_error(conn, 400, "invalid_window",
		    "\"window\" is a duration (\"10s\", or milliseconds) "
		    "from 1ms to 366d, as a rule's");
		goto out;
	}
	if (!overrides_limit_ok(r->algorithm, limit,
		window > 0 ? window : r->window_ms, what, sizeof(what))) {
		ret = admin_error(conn, 400, "invalid_limit", "\"limit\": %s",
		    what);
		goto out;
	}
	if (ttl_v != NULL && !json_is_null(ttl_v) &&
	    (parse_duration(ttl_v, &ttl) < 0 || ttl < 1 ||
		ttl > INT64_C(3153600000000))) {
		ret = admin_error(conn, 400, "invalid_ttl",
		    "\"ttl\" is a duration (\"1h\", or milliseconds) from 1ms "
		    "to 36500d");
		goto out;
	}
	if ((h = hash_key(cfg, r->name, &hlen)) == NULL) {
		ret = admin_error(conn, 500, "internal_error", "out of memory");
		goto out;
	}
	if (s->overrides == NULL) {
		ret = admin_error(conn, 500, "internal_error",
		    "no overrides kept");
		goto out;
	}
	/* Refused before Redis is written, so that a refusal changes
	 * nothing anywhere (a table filled between this look and the set
	 * below has the write taken back there). */
	if (!overrides_has_room(s->overrides, cfg->redis.key_prefix, r->name,
		key, strlen(key), now_ms)) {
		ret = overrides_full(s, conn, cfg);
		goto out;
	}
	snprintf(value, sizeof(value), "%" PRId64 " %" PRId64, limit, window);
	if (on_redis(s)) {
		a.key = h;
		a.keylen = hlen;
		a.field = key;
		a.fieldlen = strlen(key);
		a.value = value;
		a.ttl_ms = ttl;
		if (backend_admin_call(s->decider->backend, &a, &kind, err,
			sizeof(err)) < 0) {
			ret = store_failed(s, conn, kind);
			goto out;
		}
	}
	/* This daemon at once; the others when they hear the notice. */
	if (overrides_set(s->overrides, cfg->redis.key_prefix, r->name, key,
		strlen(key), limit, window, ttl > 0 ? now_ms + ttl : 0,
		now_ms) < 0) {
		bool full = errno == ENOSPC;

		/* Filled since the look above (another PUT, the sync), or no
		 * memory for this daemon's copy: the field gets back what it
		 * held, another daemon's override maybe, so that the refusal
		 * changes nothing.  When that fails, the write may stand: no
		 * 507. */
		if (on_redis(s) &&
		    override_undo(s, &a, &kind, err, sizeof(err)) < 0) {
			snprintf(what, sizeof(what),
			    "%s here; taking it back failed (%s): it may be "
			    "set",
			    full ? "no room" : "out of memory",
			    backend_error_kind_name(kind));
			admin_log_write(conn, "override_set", r->name, key,
			    what);
			ret = admin_error(conn, 503, "backend_unavailable",
			    "the %s store failed (%s) taking back the "
			    "override this daemon could not hold: it may "
			    "be set",
			    s->decider->backend->name,
			    backend_error_kind_name(kind));
			goto out;
		}
		ret = full ?
		    overrides_full(s, conn, cfg) :
		    admin_error(conn, 500, "internal_error", "out of memory");
		goto out;
	}
	metrics_admin_write(s->metrics, METRICS_ADMIN_OVERRIDE_SET);
	wake_waiters(s);
	override_what(what, sizeof(what), limit, window, ttl);
	admin_log_write(conn, "override_set", r->name, key, what);
	ret = admin_respond_json(conn, 200,
	    json_pack("{s:s, s:s, s:I, s:I, s:b, s:o}", "rule", r->name, "key",
		key, "limit", (json_int_t)limit, "window_ms",
		(json_int_t)(window > 0 ? window : r->window_ms),
		"window_from_rule", window == 0, "expires_ms",
		ttl > 0 ? json_integer(ttl) : json_null()));
out:
	rl_free(a.reply);
	rl_free(h);
	json_decref(root);
	return ret;
}

/* What list_one() adds to. */
struct override_list {
	json_t *list;
	const struct rule *r; /* NULL: a rule the config no longer has */
};

/* One override of a GET; one that follows the rule's window reports the
 * rule's current window (none when the config no longer has the rule). */
static void
list_one(const struct override_view *v, void *arg)
{
	struct override_list *l = arg;
	int64_t now_ms = util_realtime_us() / 1000;
	json_t *o, *window;

	if (v->window_ms > 0)
		window = json_integer(v->window_ms);
	else
		window = l->r != NULL ? json_integer(l->r->window_ms) :
					json_null();
	o = json_pack("{s:s%, s:I, s:o, s:b, s:o}", "key", v->key, v->keylen,
	    "limit", (json_int_t)v->limit, "window_ms", window,
	    "window_from_rule", v->window_ms == 0, "expires_ms",
	    v->expires_ms > 0 ?
		json_integer(v->expires_ms > now_ms ? v->expires_ms - now_ms :
						      1) :
		json_null());
	if (o != NULL)
		json_array_append_new(l->list, o);
}

/* GET ?rule=R: every live override of R (on Redis, as Redis has them). */
static int
override_list(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *rule)
{
	struct override_list l = { .r = config_find_rule(cfg, rule) };
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX], *h, *reply;
	size_t hlen = 0, len = 0;
	unsigned long since;
	int tries, rc;

	if (s->overrides == NULL)
		return admin_error(conn, 500, "internal_error",
		    "no overrides kept");
	if (on_redis(s)) {
		if ((h = hash_key(cfg, rule, &hlen)) == NULL)
			return admin_error(conn, 500, "internal_error",
			    "out of memory");
		/* Read again while the table changed during the read (a write,
		 * or the sync's own read applied first: either may be newer or
		 * older than this reply); a few times at most, then the table
		 * as it is, which the sync keeps reading. */
		for (tries = 0; tries < OVERRIDE_LIST_READS; tries++) {
			since = overrides_writes(s->overrides,
			    cfg->redis.key_prefix, rule);
			if (overrides_read_hash(s->decider->backend, h, hlen,
				&reply, &len, &kind, err, sizeof(err)) < 0) {
				rl_free(h);
				return store_failed(s, conn, kind);
			}
			rc = overrides_load_rule(s->overrides,
			    cfg->redis.key_prefix, rule, reply, len, since);
			rl_free(reply);
			if (rc != 1)
				break;
		}
		rl_free(h);
	}
	if ((l.list = json_array()) == NULL)
		return admin_error(conn, 500, "internal_error",
		    "out of memory");
	overrides_each(s->overrides, cfg->redis.key_prefix, rule,
	    util_realtime_us() / 1000, list_one, &l);
	return admin_respond_json(conn, 200,
	    json_pack("{s:s, s:o}", "rule", rule, "overrides", l.list));
}

/* DELETE ?rule=R&key=K */
static int
override_delete(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *rule, const char *key)
{
	struct backend_admin a = { .op = BACKEND_ADMIN_OVERRIDE_DEL };
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX], *h;
	size_t hlen = 0;
	bool found = false, live;

	if (s->overrides == NULL)
		return admin_error(conn, 500, "internal_error",
		    "no overrides kept");
	/* Redis first, then this daemon's table, as a PUT does: a read of
	 * the hash begun before the HDEL and applied after the table's
	 * delete is refused as overtaken (core/overrides.h), where the other
	 * order would let one begun in between bring the field back. */
	if (on_redis(s)) {
		if ((h = hash_key(cfg, rule, &hlen)) == NULL)
			return admin_error(conn, 500, "internal_error",
			    "out of memory");
		a.key = h;
		a.keylen = hlen;
		a.field = key;
		a.fieldlen = strlen(key);
		if (backend_admin_call(s->decider->backend, &a, &kind, err,
			sizeof(err)) < 0) {
			rl_free(h);
			return store_failed(s, conn, kind);
		}
		rl_free(h);
		found = a.found;
	}
	live = overrides_delete(s->overrides, cfg->redis.key_prefix, rule, key,
	    strlen(key), util_realtime_us() / 1000);
	if (!on_redis(s))
		found = live;
	metrics_admin_write(s->metrics, METRICS_ADMIN_OVERRIDE_DELETE);
	wake_waiters(s);
	admin_log_write(conn, "override_delete", rule, key,
	    found ? "deleted" : "none to delete");
	return admin_respond_json(conn, 200,
	    json_pack("{s:s, s:s, s:b}", "rule", rule, "key", key, "deleted",
		found));
}

int
admin_handle_overrides(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *method, const char *body, size_t len)
{
	const struct rule *r;
	const char *name, *key;
	bool given;
	int ret;
	bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

	if (strcmp(method, "PUT") == 0)
		return override_put(s, conn, cfg, body, len);
	if (!get && strcmp(method, "DELETE") != 0)
		return admin_not_allowed(conn, method, "/admin/overrides",
		    "GET, HEAD, PUT, DELETE");
	/* On the memory store a rule a reload removed keeps its overrides,
	 * which still count toward the bound: they can be listed and
	 * deleted (on Redis the copy went at the reload; the hash stays). */
	if (query_rule_key(conn, cfg, on_redis(s) ? NULL : s->overrides, &name,
		&r, &key, &given, &ret) < 0)
		return ret;
	if (get) /* every override of the rule: no key */
		return override_list(s, conn, cfg, name);
	if (key_fits_rule(conn, r, key, given, true, "key=", &ret) < 0)
		return ret;
	return override_delete(s, conn, cfg, name, key);
}
