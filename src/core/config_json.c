/*
 * config_json.c - a config snapshot as JSON, for GET /admin/config
 * (docs/admin.md): what the daemon runs now, with every secret replaced
 * by "***".  The only secret a config holds itself is a password written
 * in redis.url; files that hold secrets (redis.password_file,
 * admin_token_file, ...) are shown by path, never read here.  Keys are
 * those of docs/configuration.md; durations in milliseconds, with the
 * key's name ending in _ms.
 */
#include "core/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/client_ip.h"
#include "core/redis_url.h"
#include "base/log.h"
#include "base/util.h"

/* Set key to a new value; a NULL value (out of memory) fails it. */
static int
set(json_t *o, const char *key, json_t *v)
{
	return v == NULL ? -1 : json_object_set_new(o, key, v);
}

/* A string, or null for NULL. */
static json_t *
str_or_null(const char *s)
{
	return s != NULL ? json_string(s) : json_null();
}

static json_t *
str_list(char *const *v, size_t n)
{
	json_t *a = json_array();
	size_t i;

	for (i = 0; a != NULL && i < n; i++)
		if (json_array_append_new(a, json_string(v[i])) != 0) {
			json_decref(a);
			return NULL;
		}
	return a;
}

/* redis.url with "user:pass@" as "***@" (redis_url_redact()). */
static json_t *
redacted_url(const char *url)
{
	char buf[512], *big;
	size_t need;
	json_t *v;

	if (url == NULL)
		return json_null();
	need = redis_url_redact(url, buf, sizeof(buf));
	if (need < sizeof(buf))
		return json_string(buf);
	if ((big = rl_malloc(need + 1)) == NULL)
		return NULL;
	redis_url_redact(url, big, need + 1);
	v = json_string(big);
	rl_free(big);
	return v;
}

static json_t *
rule_json(const struct rule *r, bool is_stat)
{
	json_t *o = json_object(), *m = json_object();
	size_t i;

	if (o == NULL || m == NULL)
		goto fail;
	for (i = 0; i < r->nmatch; i++) {
		const struct pattern *p = &r->match[i].pattern;
		char *text = NULL;
		json_t *v;

		/* As written: a regex with its leading '~' again. */
		if (p->kind == PATTERN_REGEX &&
		    (text = rl_malloc(strlen(p->text) + 2)) != NULL) {
			text[0] = '~';
			strcpy(text + 1, p->text);
		}
		v = json_string(p->kind == PATTERN_REGEX ? text : p->text);
		rl_free(text);
		if (set(m, r->match[i].attr, v) != 0)
			goto fail;
	}
	if (set(o, "name", json_string(r->name)) != 0 ||
	    json_object_set(o, "match", m) != 0 ||
	    set(o, "key", str_or_null(r->key ? r->key->source : NULL)) != 0 ||
	    set(o, "window_ms", json_integer(r->window_ms)) != 0)
		goto fail;
	if (!is_stat &&
	    (set(o, "limit", json_integer(r->limit)) != 0 ||
		set(o, "algorithm",
		    json_string(rl_algorithm_name(r->algorithm))) != 0 ||
		set(o, "cost", json_integer(r->cost)) != 0 ||
		set(o, "shadow", json_boolean(r->shadow)) != 0 ||
		set(o, "prefetch",
		    r->prefetch_units > 0 ?
			json_pack("{s:I,s:I}", "max_units",
			    (json_int_t)r->prefetch_units, "hold_ms",
			    (json_int_t)r->prefetch_hold_ms) :
			json_null()) != 0))
		goto fail;
	json_decref(m);
	return o;
fail:
	json_decref(m);
	json_decref(o);
	return NULL;
}

/* redis.tls: the files by path (never read here), or null without the
 * section. */
static json_t *
tls_json(const struct redis_tls_config *t)
{
	json_t *o;

	if (!t->section)
		return json_null();
	if ((o = json_object()) == NULL ||
	    set(o, "ca_file", str_or_null(t->ca_file.path)) != 0 ||
	    set(o, "cert_file", str_or_null(t->cert_file.path)) != 0 ||
	    set(o, "key_file", str_or_null(t->key_file.path)) != 0 ||
	    set(o, "server_name", str_or_null(t->server_name)) != 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static json_t *
redis_json(const struct redis_config *r)
{
	json_t *o = json_object(), *s = json_object();

	if (o == NULL || s == NULL ||
	    set(o, "url", redacted_url(r->url)) != 0 ||
	    set(o, "password_file", str_or_null(r->password_file)) != 0 ||
	    set(o, "cluster", str_list(r->cluster, r->ncluster)) != 0 ||
	    set(o, "pool_size", json_integer(r->pool_size)) != 0 ||
	    set(o, "timeout_ms", json_integer(r->timeout_ms)) != 0 ||
	    set(o, "key_prefix", json_string(r->key_prefix)) != 0 ||
	    set(o, "tls", tls_json(&r->tls)) != 0)
		goto fail;
	if (r->sentinel.nnodes > 0) {
		if (set(s, "master", str_or_null(r->sentinel.master)) != 0 ||
		    set(s, "nodes",
			str_list(r->sentinel.nodes, r->sentinel.nnodes)) != 0 ||
		    set(s, "password_file",
			str_or_null(r->sentinel.password_file)) != 0 ||
		    set(s, "tls", json_boolean(r->sentinel.tls)) != 0 ||
		    json_object_set(o, "sentinel", s) != 0)
			goto fail;
	} else if (json_object_set_new(o, "sentinel", json_null()) != 0)
		goto fail;
	json_decref(s);
	return o;
fail:
	json_decref(s);
	json_decref(o);
	return NULL;
}

/* listen_mode as written ("0660"), or null when not set. */
static json_t *
listen_mode_json(int mode)
{
	char buf[16];

	if (mode < 0)
		return json_null();
	snprintf(buf, sizeof(buf), "%04o", (unsigned)mode);
	return json_string(buf);
}

static json_t *
auth_json(const struct config *c)
{
	int src = (int)c->auth_ip.source;

	return json_pack("{s:i,s:s,s:i,s:i}", "deny_status",
	    c->auth_deny_status, "client_ip",
	    src >= 0 && src < CLIENT_IP_NSOURCES ? client_ip_source_names[src] :
						   "unknown",
	    "xff_trusted_hops", c->auth_ip.xff_trusted_hops, "ipv6_prefix",
	    c->auth_ip.ipv6_prefix);
}

char *
config_to_json(const struct config *c)
{
	json_t *o = json_object(), *rules = json_array(), *stats = json_array();
	char *text = NULL;
	size_t i;

	if (o == NULL || rules == NULL || stats == NULL)
		goto out;
	for (i = 0; i < c->nrules; i++)
		if (json_array_append_new(rules,
			rule_json(&c->rules[i], false)) != 0)
			goto out;
	for (i = 0; i < c->nstats; i++) {
		json_t *s = rule_json(&c->stats[i].rule, true);

		if (s == NULL ||
		    set(s, "resolution_ms",
			json_integer(c->stats[i].resolution_ms)) != 0 ||
		    set(s, "relative_accuracy",
			json_real(c->stats[i].accuracy)) != 0 ||
		    json_array_append_new(stats, s) != 0)
			goto out;
	}
	if (set(o, "path", str_or_null(c->path)) != 0 ||
	    set(o, "listen", json_string(c->listen)) != 0 ||
	    set(o, "grpc_listen", str_or_null(c->grpc_listen)) != 0 ||
	    set(o, "admin_listen", str_or_null(c->admin_listen)) != 0 ||
	    set(o, "admin_token_file", str_or_null(c->admin_token_file)) != 0 ||
	    set(o, "threads", json_integer(c->threads)) != 0 ||
	    set(o, "max_body_bytes", json_integer(c->max_body_bytes)) != 0 ||
	    set(o, "max_connections", json_integer(c->max_connections)) != 0 ||
	    set(o, "idle_timeout_ms", json_integer(c->idle_timeout_ms)) != 0 ||
	    set(o, "request_timeout_ms", json_integer(c->request_timeout_ms)) !=
		0 ||
	    set(o, "max_header_bytes", json_integer(c->max_header_bytes)) !=
		0 ||
	    set(o, "max_attributes", json_integer(c->max_attributes)) != 0 ||
	    set(o, "user", str_or_null(c->user)) != 0 ||
	    set(o, "listen_mode", listen_mode_json(c->listen_mode)) != 0 ||
	    set(o, "shutdown_timeout_ms",
		json_integer(c->shutdown_timeout_ms)) != 0 ||
	    set(o, "max_wait_ms", json_integer(c->max_wait_ms)) != 0 ||
	    set(o, "max_waiting", json_integer(c->max_waiting)) != 0 ||
	    set(o, "log_level", json_string(log_level_name(c->log_level))) !=
		0 ||
	    set(o, "log_format",
		json_string(c->log_format == RL_LOG_JSON ? "json" :
							   "logfmt")) != 0 ||
	    set(o, "access_log", json_boolean(c->access_log)) != 0 ||
	    set(o, "backend", json_string(config_backend_name(c->backend))) !=
		0 ||
	    set(o, "backend_required", json_boolean(c->backend_required)) !=
		0 ||
	    set(o, "redis", redis_json(&c->redis)) != 0 ||
	    set(o, "memory",
		json_pack("{s:I}", "max_keys",
		    (json_int_t)c->memory.max_keys)) != 0 ||
	    set(o, "on_backend_error",
		json_string(config_on_error_name(c->on_backend_error))) != 0 ||
	    set(o, "auth", auth_json(c)) != 0 ||
	    json_object_set(o, "rules", rules) != 0 ||
	    json_object_set(o, "stats", stats) != 0)
		goto out;
	text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
out:
	json_decref(rules);
	json_decref(stats);
	json_decref(o);
	return text;
}
