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
#include "front/admin_priv.h"

/* The query's rule and key: 0, or -1 answered (400). */
static int
query_rule_key(struct MHD_Connection *conn, const struct config *cfg,
    const struct rule **r, const char **key, int *ret)
{
	const char *name = MHD_lookup_connection_value(conn,
	    MHD_GET_ARGUMENT_KIND, "rule");

	*key = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "key");
	if (*key == NULL)
		*key = ""; /* a rule without a key: its one counter */
	if (name == NULL) {
		*ret = admin_error(conn, 400, "unknown_rule",
		    "the query needs rule=");
		return -1;
	}
	if ((*r = config_find_rule(cfg, name)) == NULL) {
		*ret = admin_error(conn, 400, "unknown_rule",
		    "no rule named \"%s\"", name);
		return -1;
	}
	if (strlen(*key) > RL_MAX_KEY_BYTES) {
		*ret = admin_error(conn, 400, "key_too_long",
		    "the key is longer than %d bytes", RL_MAX_KEY_BYTES);
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
	(void)overrides_get(s->overrides, k, len, util_realtime_us() / 1000,
	    &limit, &window);
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
 * may hold some from a degraded spell); this daemon's deny cache forgets
 * every denial. */
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
	const char *key;
	int ret;

	if (strcmp(method, "GET") != 0 && strcmp(method, "DELETE") != 0)
		return admin_error(conn, 405, "method_not_allowed",
		    "%s /admin/counters: use GET or DELETE", method);
	if (query_rule_key(conn, cfg, &r, &key, &ret) < 0)
		return ret;
	return strcmp(method, "GET") == 0 ? counter_read(s, conn, cfg, r, key) :
					    counter_reset(s, conn, cfg, r, key);
}

int
admin_handle_overrides(struct admin_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *method, const char *body, size_t len)
{
	(void)s;
	(void)cfg;
	(void)method;
	(void)body;
	(void)len;
	return admin_error(conn, 404, "not_found", "no endpoint");
}
