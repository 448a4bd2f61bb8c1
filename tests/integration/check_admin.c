/*
 * check_admin.c - the admin API (docs/admin.md) against the real daemon:
 * who may ask (only on admin_listen, only with the bearer token of
 * admin_token_file, a wrong one refused like none, the token never
 * logged), GET /admin/config with every secret as "***", the counters
 * (read without consuming, reset), and overrides: seen by a second daemon
 * on the same Redis within 1 s, expiring with their TTL, surviving a
 * restart on Redis; in process on the memory store; those of a rule a
 * reload removed (kept and reachable on the memory store, out of the
 * bound on Redis); on Redis, a write that touches one field of a big hash,
 * expired fields dropped by the daemons' reads (only if unchanged since),
 * override.lua's undo putting back only a field that holds what its set
 * wrote, a hash read in pages and a failed read warned of, a PUT refused
 * for want of room after its write taking back only that write (and
 * saying the override may be set when that fails);
 * a clean stop while notices of overrides keep coming; a counter reset
 * drops the quota held in advance, a chunk in flight then too (replies
 * delayed by a loopback proxy), and a daemon that missed the reset's
 * notice drops its quota when its subscription is back.  Also
 * `--check`, which like GET /admin/config reads the config without serving it:
 * the keys only it checks (redis.password_file, user) are placed FILE:LINE:COL.
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"
#include "ops.h"

#define TOKEN "s3cret-admin-token-0123456789"

static bool use_redis; /* set in the runner by the TCase's fixture */

/* A daemon with its admin listener on a port of its own. */
struct admin_daemon {
	struct h_daemon d;
	int admin_port;
	char token_path[H_PATH_MAX];
};

static const char *const auth_ok[] = { "Authorization: Bearer " TOKEN, NULL };

/* The config of a's daemon into yaml: token, admin_token_file; extra,
 * more YAML at the top level; rules, more rules after the usual ones
 * (YAML list items), or NULL. */
static void
admin_yaml(const struct admin_daemon *a, bool token, const char *extra,
    const char *rules, char *yaml, size_t len)
{
	snprintf(yaml, len,
	    "listen: \"127.0.0.1:%%PORT%%\"\n"
	    "admin_listen: \"127.0.0.1:%d\"\n"
	    "%s%s%s\n"
	    "threads: 2\n"
	    "shutdown_timeout: 2s\n"
	    "%s"
	    "rules:\n"
	    "  - name: api\n"
	    "    match: { t: api }\n"
	    "    key: \"${user}\"\n"
	    "    limit: 3\n"
	    "    window: 10s\n"
	    "  - name: tb\n"
	    "    match: { t: tb }\n"
	    "    key: \"${user}\"\n"
	    "    limit: 2\n"
	    "    window: 10s\n"
	    "    algorithm: token_bucket\n"
	    "  - name: lock\n"
	    "    match: { t: lock }\n"
	    "    key: \"${user}\"\n"
	    "    limit: 1\n"
	    "    window: 2s\n"
	    "    algorithm: concurrency\n"
	    "  - name: pf\n"
	    "    match: { t: pf }\n"
	    "    key: \"${user}\"\n"
	    "    limit: 10\n"
	    "    window: 30s\n"
	    "    prefetch: { max_units: 5, hold: 30s }\n"
	    "%s",
	    a->admin_port, token ? "admin_token_file: \"" : "",
	    token ? a->token_path : "", token ? "\"" : "",
	    extra != NULL ? extra :
		use_redis ? "backend: redis\n"
			    "redis:\n"
			    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
			    "  timeout: 500ms\n"
			    "  key_prefix: \"adm:\"\n"
			    "on_backend_error: deny\n" :
			    "backend: memory\n",
	    rules != NULL ? rules : "");
}

/* Start a daemon; admin_port 0 picks a free one, token: write and use
 * admin_token_file, extra and rules as for admin_yaml(). */
static void
admin_start_rules(struct admin_daemon *a, int admin_port, bool token,
    const char *extra, const char *rules)
{
	char yaml[4096];
	FILE *f;

	memset(&a->d, 0, sizeof(a->d));
	a->admin_port = admin_port > 0 ? admin_port : h_free_port();
	snprintf(a->token_path, sizeof(a->token_path), "%s/admin.token",
	    h_tmpdir());
	if (token) {
		ck_assert_ptr_nonnull(f = fopen(a->token_path, "w"));
		fputs(TOKEN "\n", f);
		fclose(f);
	}
	admin_yaml(a, token, extra, rules, yaml, sizeof(yaml));
	h_daemon_start(&a->d, yaml);
}

static void
admin_start(struct admin_daemon *a, int admin_port, bool token,
    const char *extra)
{
	admin_start_rules(a, admin_port, token, extra, NULL);
}

/* Reload a's daemon (started with the token) on its config with extra
 * and rules as for admin_yaml(), and wait for the reload.  reloads: how
 * many reloads it has made before this one. */
static void
admin_reload(struct admin_daemon *a, const char *extra, const char *rules,
    int reloads)
{
	char yaml[4096], port[16], redis_port[16], text[4096];
	const char *p;
	size_t n = 0;

	admin_yaml(a, true, extra, rules, yaml, sizeof(yaml));
	snprintf(port, sizeof(port), "%d", a->d.port);
	snprintf(redis_port, sizeof(redis_port), "%d", a->d.redis_port);
	for (p = yaml; *p != '\0' && n + 16 < sizeof(text);) {
		if (strncmp(p, "%PORT%", 6) == 0) {
			n += (size_t)snprintf(text + n, sizeof(text) - n, "%s",
			    port);
			p += 6;
		} else if (strncmp(p, "%REDIS_PORT%", 12) == 0) {
			n += (size_t)snprintf(text + n, sizeof(text) - n, "%s",
			    redis_port);
			p += 12;
		} else
			text[n++] = *p++;
	}
	text[n] = '\0';
	ops_write_file(a->d.conf, text);
	ck_assert_int_eq(kill(a->d.pid, SIGHUP), 0);
	ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
				      "{result=\"success\"}",
			  reloads + 1, 10000) >= reloads + 1,
	    "no reload");
}

static void
admin_stop(struct admin_daemon *a)
{
	h_daemon_stop(&a->d);
}

/* One request to the admin port. */
static void
admin_req(struct admin_daemon *a, struct h_resp *r, const char *method,
    const char *path, const char *body, const char *const *headers)
{
	CURL *c = h_curl_new();

	h_resp_free(r);
	memset(r, 0, sizeof(*r));
	ck_assert_msg(h_request(c, a->admin_port, r, method, path, body,
			  body != NULL ? strlen(body) : 0, headers) == 0,
	    "admin %s %s: %s", method, path, r->err);
	curl_easy_cleanup(c);
}

START_TEST(test_who_may)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	const char *const wrong[] = { "Authorization: Bearer " TOKEN "x",
		NULL };
	const char *const shorter[] = { "Authorization: Bearer s3cret", NULL };
	const char *const basic[] = { "Authorization: Basic " TOKEN, NULL };

	admin_start(&a, 0, true, NULL);
	/* Not on the main listener, token or not. */
	h_http(&r, "GET", "/admin/config", NULL, auth_ok);
	ck_assert_int_eq(r.status, 404);
	h_http(&r, "GET", "/admin/counters?rule=api&key=u", NULL, auth_ok);
	ck_assert_int_eq(r.status, 404);
	/* On the admin listener: only with the token. */
	admin_req(&a, &r, "GET", "/admin/config", NULL, NULL);
	ck_assert_int_eq(r.status, 401);
	ck_assert_str_eq(h_json_str(&r, "error"), "unauthorized");
	ck_assert_ptr_nonnull(h_resp_header(&r, "WWW-Authenticate"));
	admin_req(&a, &r, "GET", "/admin/config", NULL, wrong);
	ck_assert_int_eq(r.status, 401);
	admin_req(&a, &r, "GET", "/admin/config", NULL, shorter);
	ck_assert_int_eq(r.status, 401);
	admin_req(&a, &r, "GET", "/admin/config", NULL, basic);
	ck_assert_int_eq(r.status, 401);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"u\",\"limit\":9}", wrong);
	ck_assert_int_eq(r.status, 401);
	admin_req(&a, &r, "GET", "/admin/config", NULL, auth_ok);
	ck_assert_int_eq(r.status, 200);
	admin_req(&a, &r, "GET", "/admin/nothing", NULL, auth_ok);
	ck_assert_int_eq(r.status, 404);
	/* A path that is not UTF-8 is quoted as valid UTF-8: still 404. */
	admin_req(&a, &r, "GET", "/admin/%ff%fe", NULL, auth_ok);
	ck_assert_msg(r.status == 404, "%ld %s", r.status, r.body);
	ck_assert_str_eq(h_json_str(&r, "error"), "not_found");
	/* A 405 says in Allow what the path takes. */
	admin_req(&a, &r, "POST", "/admin/config", NULL, auth_ok);
	ck_assert_int_eq(r.status, 405);
	ck_assert_str_eq(h_resp_header(&r, "Allow"), "GET, HEAD");
	admin_req(&a, &r, "POST", "/admin/counters?rule=api&key=u", NULL,
	    auth_ok);
	ck_assert_int_eq(r.status, 405);
	ck_assert_str_eq(h_resp_header(&r, "Allow"), "GET, HEAD, DELETE");
	admin_req(&a, &r, "POST", "/admin/overrides", "{}", auth_ok);
	ck_assert_int_eq(r.status, 405);
	ck_assert_str_eq(h_resp_header(&r, "Allow"), "GET, HEAD, PUT, DELETE");
	/* The main listener still serves. */
	h_http(&r, "POST", "/acquire", "{\"t\":\"api\",\"user\":\"u\"}", NULL);
	ck_assert_int_eq(r.status, 200);
	h_resp_free(&r);
	admin_stop(&a);
	ck_assert(h_file_count(a.d.log, TOKEN) == 0);
}
END_TEST

START_TEST(test_no_admin_listen)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };

	h_daemon_start(&d,
	    "listen: \"127.0.0.1:%PORT%\"\n"
	    "rules:\n"
	    "  - name: api\n"
	    "    limit: 3\n"
	    "    window: 10s\n");
	h_http(&r, "GET", "/admin/config", NULL, NULL);
	ck_assert_int_eq(r.status, 404);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

START_TEST(test_config_secrets)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	json_t *redis_o, *rules;

	admin_start(&a, 0, true,
	    "backend: memory\n"
	    "redis:\n"
	    "  url: \"redis://alice:hunter2pw@127.0.0.1:6379/3\"\n"
	    "  key_prefix: \"x:\"\n");
	admin_req(&a, &r, "GET", "/admin/config", NULL, auth_ok);
	ck_assert_int_eq(r.status, 200);
	ck_assert_msg(strstr(r.body, "hunter2pw") == NULL, "%s", r.body);
	ck_assert_msg(strstr(r.body, TOKEN) == NULL, "%s", r.body);
	redis_o = h_json_get(&r, "redis");
	ck_assert_ptr_nonnull(redis_o);
	ck_assert_str_eq(json_string_value(json_object_get(redis_o, "url")),
	    "redis://***@127.0.0.1:6379/3");
	ck_assert_str_eq(json_string_value(json_object_get(redis_o,
			     "key_prefix")),
	    "x:");
	ck_assert_str_eq(h_json_str(&r, "admin_token_file"), a.token_path);
	rules = h_json_get(&r, "rules");
	ck_assert_int_eq(json_array_size(rules), 4);
	ck_assert_str_eq(json_string_value(
			     json_object_get(json_array_get(rules, 0), "name")),
	    "api");
	ck_assert_int_eq(json_integer_value(json_object_get(
			     json_array_get(rules, 0), "limit")),
	    3);
	ck_assert_str_eq(json_string_value(json_object_get(
			     json_array_get(rules, 1), "algorithm")),
	    "token_bucket");
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* `ratelimitd -c yaml --check`: the exit status, and its output in log
 * (the caller frees it). */
static int
run_check(const char *text, char **log)
{
	char yaml[H_PATH_MAX + 16], out[H_PATH_MAX + 16];
	char *argv[] = { getenv("RATELIMITD_BIN"), (char *)"-c", yaml,
		(char *)"--check", NULL };
	int rc;

	snprintf(yaml, sizeof(yaml), "%s/check.yaml", h_tmpdir());
	snprintf(out, sizeof(out), "%s/check.out", h_tmpdir());
	ops_write_file(yaml, text);
	unlink(out); /* h_run appends */
	rc = h_run(argv, out);
	*log = ops_slurp(out);
	return rc;
}

/* Every --check error is FILE:LINE:COL: message (docs/configuration.md),
 * also for the keys that only --check looks at. */
START_TEST(test_check_errors_placed)
{
	char want[H_PATH_MAX + 128], *log;

	ck_assert_int_eq(run_check("backend: redis\n"
				   "redis:\n"
				   "  timeout: 1s\n"
				   "  password_file: /nonexistent/redis.pass\n",
			     &log),
	    1);
	snprintf(want, sizeof(want),
	    "%s/check.yaml:4:18: redis.password_file: cannot read "
	    "/nonexistent/redis.pass: ",
	    h_tmpdir());
	ck_assert_msg(strncmp(log, want, strlen(want)) == 0, "want %s in: %s",
	    want, log);
	free(log);

	ck_assert_int_eq(run_check("threads: 2\nuser: no-such-user-rl\n", &log),
	    1);
	snprintf(want, sizeof(want),
	    "%s/check.yaml:2:7: user: no user \"no-such-user-rl\"\n",
	    h_tmpdir());
	ck_assert_str_eq(log, want);
	free(log);
}
END_TEST

/* Without admin_token_file, anyone who reaches admin_listen may ask. */
START_TEST(test_no_token)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start(&a, 0, false, NULL);
	admin_req(&a, &r, "GET", "/admin/config", NULL, NULL);
	ck_assert_int_eq(r.status, 200);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* A counter read consumes nothing; a reset frees the key at once. */
START_TEST(test_counters)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	int i;

	admin_start(&a, 0, true, NULL);
	for (i = 0; i < 2; i++) {
		h_http(&r, "POST", "/acquire",
		    "{\"t\":\"api\",\"user\":\"u 1\"}", NULL);
		ck_assert_int_eq(r.status, 200);
	}
	for (i = 0; i < 3; i++) {
		admin_req(&a, &r, "GET", "/admin/counters?rule=api&key=u%201",
		    NULL, auth_ok);
		ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
		ck_assert_str_eq(h_json_str(&r, "rule"), "api");
		ck_assert_str_eq(h_json_str(&r, "key"), "u 1");
		ck_assert_int_eq(h_json_int(&r, "limit"), 3);
		ck_assert_int_eq(h_json_int(&r, "remaining"), 1);
		ck_assert_int_eq(h_json_int(&r, "retry_after_ms"), 0);
		ck_assert(h_json_int(&r, "reset_ms") > 9000);
	}
	h_http(&r, "POST", "/acquire", "{\"t\":\"api\",\"user\":\"u 1\"}",
	    NULL);
	ck_assert_int_eq(r.status, 200);
	h_http(&r, "POST", "/acquire", "{\"t\":\"api\",\"user\":\"u 1\"}",
	    NULL);
	ck_assert_int_eq(r.status, 429);
	admin_req(&a, &r, "GET", "/admin/counters?rule=api&key=u%201", NULL,
	    auth_ok);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 0);
	ck_assert(h_json_int(&r, "retry_after_ms") > 9000);
	/* An unknown rule, a key never used. */
	admin_req(&a, &r, "GET", "/admin/counters?rule=nope&key=u", NULL,
	    auth_ok);
	ck_assert_int_eq(r.status, 400);
	admin_req(&a, &r, "GET", "/admin/counters?rule=tb&key=new", NULL,
	    auth_ok);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 2);
	admin_req(&a, &r, "POST", "/admin/counters?rule=tb&key=new", NULL,
	    auth_ok);
	ck_assert_int_eq(r.status, 405);

	/* Reset: the next acquire is allowed again, on the store's count. */
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=api&key=u%201", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert(json_is_true(h_json_get(&r, "found")));
	h_http(&r, "POST", "/acquire", "{\"t\":\"api\",\"user\":\"u 1\"}",
	    NULL);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 2);
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=tb&key=never", NULL,
	    auth_ok);
	ck_assert(json_is_false(h_json_get(&r, "found")));
	ck_assert_int_eq(
	    h_metric("ratelimitd_admin_writes_total{op=\"counter_reset\"}"), 2);
	h_resp_free(&r);
	admin_stop(&a);
	ck_assert(h_file_count(a.d.log, "op=\"counter_reset\"") > 0);
	ck_assert(h_file_count(a.d.log, "peer=\"127.0.0.1:") > 0);
}
END_TEST

/* A key that is not valid UTF-8 (a rendered key holds whatever bytes the
 * request had: /auth's ${header.x}) is refused with 400 invalid_key
 * before the store is asked: no 500, no reset done and logged anyway.  So
 * is one with an encoded NUL, which no rendered key holds: cut there, it
 * would act on the key before it (and a rule name with one is no rule). */
START_TEST(test_key_not_utf8)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	static const char *const bad[] = {
		"GET /admin/counters?rule=api&key=%FF",
		"DELETE /admin/counters?rule=api&key=%FF",
		"DELETE /admin/counters?rule=api&key=a%C0%80",
		"DELETE /admin/counters?rule=api&key=%ED%A0%80",
		"DELETE /admin/overrides?rule=api&key=%FF",
		"DELETE /admin/counters?rule=api&key=zed%00junk",
		"DELETE /admin/overrides?rule=api&key=zed%00junk",
		"GET /admin/counters?rule=api&key=%00", NULL
	};
	char method[16], path[128];
	size_t i;

	admin_start(&a, 0, true, NULL);
	for (i = 0; bad[i] != NULL; i++) {
		ck_assert_int_eq(sscanf(bad[i], "%15s %127s", method, path), 2);
		admin_req(&a, &r, method, path, NULL, auth_ok);
		ck_assert_msg(r.status == 400, "%s: %ld %s", bad[i], r.status,
		    r.body);
		ck_assert_str_eq(h_json_str(&r, "error"), "invalid_key");
	}
	admin_req(&a, &r, "GET", "/admin/counters?rule=%FF", NULL, auth_ok);
	ck_assert_msg(r.status == 400, "%ld %s", r.status, r.body);
	ck_assert_str_eq(h_json_str(&r, "error"), "unknown_rule");
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=api%00x&key=zed",
	    NULL, auth_ok);
	ck_assert_msg(r.status == 400, "%ld %s", r.status, r.body);
	ck_assert_str_eq(h_json_str(&r, "error"), "unknown_rule");
	/* UTF-8 beyond ASCII is a key like any other. */
	admin_req(&a, &r, "GET", "/admin/counters?rule=api&key=%C3%A9", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_str_eq(h_json_str(&r, "key"), "\xc3\xa9");
	ck_assert(
	    h_metric("ratelimitd_admin_writes_total{op=\"counter_reset\"}") <=
	    0);
	h_resp_free(&r);
	admin_stop(&a);
	ck_assert(h_file_count(a.d.log, "op=\"counter_reset\"") == 0);
	ck_assert(h_file_count(a.d.log, "op=\"override_delete\"") == 0);
}
END_TEST

/* Acquire one unit of rule api for user on the main listener of d. */
static long
acquire_on(struct admin_daemon *a, const char *user, struct h_resp *r)
{
	char body[128];

	snprintf(body, sizeof(body), "{\"t\":\"api\",\"user\":\"%s\"}", user);
	h_post(a->d.port, "/acquire", body, r);
	return r->status;
}

/* The limit a's counters read for api/user (its override, if any). */
static long long
limit_seen(struct admin_daemon *a, const char *user, struct h_resp *r)
{
	char path[128];

	snprintf(path, sizeof(path), "/admin/counters?rule=api&key=%s", user);
	admin_req(a, r, "GET", path, NULL, auth_ok);
	ck_assert_msg(r->status == 200, "%ld %s", r->status, r->body);
	return h_json_int(r, "limit");
}

/* Poll until a sees limit want for api/user; the milliseconds it took,
 * or -1 past max_ms. */
static long long
wait_limit(struct admin_daemon *a, const char *user, long long want,
    long long max_ms)
{
	struct h_resp r = { 0 };
	long long t0 = h_now_ms(), got;

	for (;;) {
		got = limit_seen(a, user, &r);
		if (got == want)
			break;
		if (h_now_ms() - t0 > max_ms) {
			h_resp_free(&r);
			return -1;
		}
		h_sleep_ms(20);
	}
	h_resp_free(&r);
	return h_now_ms() - t0;
}

START_TEST(test_overrides)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	json_t *list;

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"vip\",\"limit\":1,\"window\":\"20s\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_int_eq(h_json_int(&r, "window_ms"), 20000);
	ck_assert_int_eq(acquire_on(&a, "vip", &r), 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 1);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 0);
	ck_assert_str_eq(h_resp_header(&r, "RateLimit-Policy"),
	    "\"api\";q=1;w=20");
	ck_assert_int_eq(acquire_on(&a, "vip", &r), 429);
	ck_assert_int_eq(acquire_on(&a, "vip", &r), 429); /* deny cache */
	ck_assert_int_eq(h_json_int(&r, "limit"), 1);
	ck_assert_int_eq(acquire_on(&a, "other", &r), 200); /* its own */
	ck_assert_int_eq(h_json_int(&r, "limit"), 3);

	admin_req(&a, &r, "GET", "/admin/overrides?rule=api", NULL, auth_ok);
	ck_assert_int_eq(r.status, 200);
	list = h_json_get(&r, "overrides");
	ck_assert_int_eq(json_array_size(list), 1);
	ck_assert_str_eq(
	    json_string_value(json_object_get(json_array_get(list, 0), "key")),
	    "vip");
	ck_assert(json_is_null(json_object_get(json_array_get(list, 0),
	    "expires_ms")));

	/* Gone: the rule's limit again, whatever the cache learnt. */
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=vip", NULL,
	    auth_ok);
	ck_assert(json_is_true(h_json_get(&r, "deleted")));
	ck_assert_int_eq(acquire_on(&a, "vip", &r), 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 3);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 1);
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=vip", NULL,
	    auth_ok);
	ck_assert(json_is_false(h_json_get(&r, "deleted")));

	/* A raised limit admits at once past a cached denial. */
	ck_assert_int_eq(acquire_on(&a, "vip", &r), 200);
	ck_assert_int_eq(acquire_on(&a, "vip", &r), 429);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"vip\",\"limit\":5}", auth_ok);
	ck_assert_int_eq(acquire_on(&a, "vip", &r), 200);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 1);

	/* A TTL: the override goes by itself. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"brief\",\"limit\":1,\"ttl\":700}",
	    auth_ok);
	ck_assert_int_eq(h_json_int(&r, "expires_ms"), 700);
	ck_assert_int_eq(acquire_on(&a, "brief", &r), 200);
	ck_assert_int_eq(acquire_on(&a, "brief", &r), 429);
	h_sleep_ms(900);
	ck_assert_int_eq(acquire_on(&a, "brief", &r), 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 3);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 1);
	/* Expired, it is no override to delete, though the table may
	 * still hold it.  On Redis a read of the hash drops expired fields,
	 * so one is written straight into it, "<limit> <window_ms>
	 * <expires_at_ms>" with an expiry long past, as a field nothing has
	 * read since it expired. */
	if (use_redis)
		h_redis_int(&h_shared_redis, "HSET %s %s %s",
		    "adm:override:api", "brief", "1 0 1000");
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=brief", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200 &&
		json_is_false(h_json_get(&r, "deleted")),
	    "DELETE of an expired override: %ld %s", r.status, r.body);
	if (use_redis)
		ck_assert_int_eq(h_redis_int(&h_shared_redis, "HEXISTS %s %s",
				     "adm:override:api", "brief"),
		    0);

	/* Bad requests change nothing. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":0}", auth_ok);
	ck_assert_int_eq(r.status, 400);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"nope\",\"key\":\"x\",\"limit\":2}", auth_ok);
	ck_assert_int_eq(r.status, 400);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,\"window\":\"soon\"}",
	    auth_ok);
	ck_assert_int_eq(r.status, 400);
	admin_req(&a, &r, "PUT", "/admin/overrides", "[", auth_ok);
	ck_assert_int_eq(r.status, 400);
	/* A name twice, as on the main listener; a window past a rule's
	 * bound (366 days). */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,\"limit\":3}",
	    auth_ok);
	ck_assert_int_eq(r.status, 400);
	ck_assert_str_eq(h_json_str(&r, "error"), "invalid_json");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,"
	    "\"window\":\"367d\"}",
	    auth_ok);
	ck_assert_int_eq(r.status, 400);
	ck_assert_str_eq(h_json_str(&r, "error"), "invalid_window");
	ck_assert_int_eq(
	    h_metric("ratelimitd_admin_writes_total{op=\"override_set\"}"), 3);
	/* null is no value: the rule's window, no expiry. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,"
	    "\"window\":null,\"ttl\":null}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert(json_is_true(h_json_get(&r, "window_from_rule")));
	ck_assert(json_is_null(h_json_get(&r, "expires_ms")));
	h_resp_free(&r);
	admin_stop(&a);
	ck_assert(h_file_count(a.d.log, "op=\"override_set\"") > 0);
	ck_assert(h_file_count(a.d.log,
		      "key=\"brief\" change=\"none to delete\"") > 0);
}
END_TEST

/* An override obeys the checks the config file's limits do: for a
 * token_bucket rule, at least 1 us of window per unit (GCRA's step would
 * round to 0 below it), with the override's window or the rule's. */
START_TEST(test_override_token_bucket)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"tb\",\"key\":\"x\",\"limit\":10000000,"
	    "\"window\":\"1s\"}",
	    auth_ok);
	ck_assert_msg(r.status == 400, "%ld %s", r.status, r.body);
	ck_assert_str_eq(h_json_str(&r, "error"), "invalid_limit");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"tb\",\"key\":\"x\",\"limit\":10000001}", auth_ok);
	ck_assert_msg(r.status == 400, "%ld %s", r.status, r.body);
	admin_req(&a, &r, "GET", "/admin/overrides?rule=tb", NULL, auth_ok);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "overrides")), 0);
	/* At the bound, and for another algorithm, it is accepted. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"tb\",\"key\":\"x\",\"limit\":1000000,"
	    "\"window\":\"1s\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":10000000,"
	    "\"window\":\"1s\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* An override's limit has a rule's bound, 1 .. 1,000,000,000
 * (docs/admin.md): past it 400, and a limit at it is a RateLimit-Policy
 * a strict Structured Fields parser reads (before: up to 2^53, 16
 * digits, past RFC 9651's 15). */
START_TEST(test_override_limit_bound)
{
	static const char *const over[] = { "1000000001", "9007199254740992",
		NULL };
	struct admin_daemon a;
	struct h_resp r = { 0 };
	char body[128];
	size_t i;

	admin_start(&a, 0, true, NULL);
	for (i = 0; over[i] != NULL; i++) {
		snprintf(body, sizeof(body),
		    "{\"rule\":\"api\",\"key\":\"big\",\"limit\":%s}", over[i]);
		admin_req(&a, &r, "PUT", "/admin/overrides", body, auth_ok);
		ck_assert_msg(r.status == 400, "limit %s: %ld %s", over[i],
		    r.status, r.body);
		ck_assert_str_eq(h_json_str(&r, "error"), "invalid_limit");
	}
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"big\",\"limit\":1000000000}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_http(&r, "POST", "/acquire", "{\"t\":\"api\",\"user\":\"big\"}",
	    NULL);
	ck_assert_int_eq(r.status, 200);
	ck_assert_str_eq(h_resp_header(&r, "RateLimit-Policy"),
	    "\"api\";q=1000000000;w=10");
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* Expect a's answer r to be 400 with error code and a message holding
 * needle. */
static void
refused_with(struct h_resp *r, const char *code, const char *needle)
{
	const char *msg;

	ck_assert_msg(r->status == 400, "%ld %s", r->status, r->body);
	ck_assert_str_eq(h_json_str(r, "error"), code);
	msg = h_json_str(r, "message");
	ck_assert_msg(msg != NULL && strstr(msg, needle) != NULL,
	    "message %s, not naming %s", r->body, needle);
}

/* A PUT's body takes rule, key, limit, window and ttl (docs/admin.md):
 * any other field is 400 invalid_json naming it, and nothing is set (a
 * misspelt "tll" would have set an override that never expires). */
START_TEST(test_override_unknown_field)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"a\",\"limit\":5,\"foo\":1}", auth_ok);
	refused_with(&r, "invalid_json", "\"foo\"");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"a\",\"limit\":5,\"tll\":\"1h\"}",
	    auth_ok);
	refused_with(&r, "invalid_json", "\"tll\"");
	admin_req(&a, &r, "GET", "/admin/overrides?rule=api", NULL, auth_ok);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "overrides")), 0);
	ck_assert(
	    h_metric("ratelimitd_admin_writes_total{op=\"override_set\"}") <=
	    0);
	/* Each of the five is taken. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"a\",\"limit\":5,\"window\":\"1m\","
	    "\"ttl\":\"1h\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* A rule without a key template (sl3) has one counter: its override and
 * its counter take no key, or "", and any other is refused, since
 * nothing could ever reach it.  A rule with one (api) needs the key
 * named: a missing one is not taken for "" (docs/admin.md).  A DELETE of
 * overrides takes any key of a keyless rule: what GET lists, it can
 * delete. */
START_TEST(test_key_fits_rule)
{
	static const char sl3[] =
	    "  - name: sl3\n"
	    "    match: { t: sl3 }\n"
	    "    limit: 3\n"
	    "    window: 10s\n";
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start_rules(&a, 0, true, NULL, sl3);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"sl3\",\"key\":\"whatever\",\"limit\":50}", auth_ok);
	refused_with(&r, "invalid_key", "no key template");
	admin_req(&a, &r, "GET", "/admin/counters?rule=sl3&key=x", NULL,
	    auth_ok);
	refused_with(&r, "invalid_key", "no key template");
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=sl3&key=x", NULL,
	    auth_ok);
	refused_with(&r, "invalid_key", "no key template");
	admin_req(&a, &r, "GET", "/admin/overrides?rule=sl3", NULL, auth_ok);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "overrides")), 0);

	/* A keyed rule: no key, or a null one, is refused. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"limit\":50}", auth_ok);
	refused_with(&r, "invalid_key", "${user}");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":null,\"limit\":50}", auth_ok);
	refused_with(&r, "invalid_key", "${user}");
	admin_req(&a, &r, "GET", "/admin/counters?rule=api", NULL, auth_ok);
	refused_with(&r, "invalid_key", "${user}");
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=api", NULL, auth_ok);
	refused_with(&r, "invalid_key", "${user}");
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api", NULL, auth_ok);
	refused_with(&r, "invalid_key", "${user}");
	admin_req(&a, &r, "GET", "/admin/overrides?rule=api", NULL, auth_ok);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "overrides")), 0);
	ck_assert(
	    h_metric("ratelimitd_admin_writes_total{op=\"override_set\"}") <=
	    0);

	/* What is taken: the keyless rule's one counter, without a key or
	 * with "", and the override applies to it; a keyed rule's key
	 * rendered empty, named. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"sl3\",\"limit\":50}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"sl3\",\"key\":\"\",\"limit\":40}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_http(&r, "POST", "/acquire", "{\"t\":\"sl3\"}", NULL);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 40);
	admin_req(&a, &r, "GET", "/admin/counters?rule=sl3", NULL, auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 39);
	admin_req(&a, &r, "GET", "/admin/counters?rule=sl3&key=", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"\",\"limit\":2}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_http(&r, "POST", "/acquire", "{\"t\":\"api\",\"user\":\"\"}", NULL);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 2);
	admin_req(&a, &r, "GET", "/admin/counters?rule=api&key=", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 1);
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=", NULL,
	    auth_ok);
	ck_assert(json_is_true(h_json_get(&r, "deleted")));
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=sl3&key=whatever",
	    NULL, auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert(json_is_false(h_json_get(&r, "deleted")));
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=sl3", NULL, auth_ok);
	ck_assert(json_is_true(h_json_get(&r, "deleted")));
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* A field named twice is said to be one, named (jansson names only a
 * short one itself), not "the body is not a JSON object". */
START_TEST(test_override_field_twice)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,\"limit\":3}",
	    auth_ok);
	refused_with(&r, "invalid_json", "the field \"limit\" is named twice");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,"
	    "\"a_name_of_more_than_twenty\\\"\":1,"
	    "\"a_name_of_more_than_twenty\\\"\":2}",
	    auth_ok);
	refused_with(&r, "invalid_json",
	    "the field \"a_name_of_more_than_twenty\\\"\" is named twice");
	admin_req(&a, &r, "GET", "/admin/overrides?rule=api", NULL, auth_ok);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "overrides")), 0);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* invalid_ttl names both bounds, 1ms and 36500d, and the upper one
 * holds. */
START_TEST(test_override_ttl_bounds)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,\"ttl\":\"36501d\"}",
	    auth_ok);
	refused_with(&r, "invalid_ttl", "from 1ms to 36500d");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,\"ttl\":0}", auth_ok);
	refused_with(&r, "invalid_ttl", "from 1ms to 36500d");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"x\",\"limit\":2,\"ttl\":\"36500d\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_int_eq(h_json_int(&r, "expires_ms"), 3153600000000LL);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* An override set without a TTL is logged as having no expiry, not as
 * "ttl 0 ms"; one with a TTL, with it. */
START_TEST(test_override_logged_expiry)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"forever\",\"limit\":2}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"brief\",\"limit\":2,\"window\":\"20s\","
	    "\"ttl\":\"1h\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_resp_free(&r);
	admin_stop(&a);
	ck_assert(h_file_count(a.d.log,
		      "key=\"forever\" change=\"limit 2, the rule's window, no "
		      "expiry\"") > 0);
	ck_assert(
	    h_file_count(a.d.log,
		"key=\"brief\" change=\"limit 2, window 20000 ms, ttl 3600000 "
		"ms\"") > 0);
	ck_assert(h_file_count(a.d.log, "ttl 0 ms") == 0);
}
END_TEST

/* HEAD is GET without a body wherever GET is allowed (docs/admin.md):
 * the same status, headers, and no counter consumed. */
START_TEST(test_head)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	static const char *const paths[] = { "/admin/config",
		"/admin/counters?rule=api&key=h", "/admin/overrides?rule=api",
		NULL };
	size_t i;

	admin_start(&a, 0, true, NULL);
	for (i = 0; paths[i] != NULL; i++) {
		admin_req(&a, &r, "HEAD", paths[i], NULL, auth_ok);
		ck_assert_msg(r.status == 200, "HEAD %s: %ld", paths[i],
		    r.status);
		ck_assert_str_eq(h_resp_header(&r, "Content-Type"),
		    "application/json");
	}
	admin_req(&a, &r, "HEAD", "/admin/counters?rule=nope", NULL, auth_ok);
	ck_assert_int_eq(r.status, 400);
	admin_req(&a, &r, "HEAD", "/admin/counters?rule=api&key=h", NULL, NULL);
	ck_assert_int_eq(r.status, 401);
	admin_req(&a, &r, "GET", "/admin/counters?rule=api&key=h", NULL,
	    auth_ok);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 3);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* An encoded NUL in an admin path is refused, 400 invalid_path, and writes
 * nothing: libmicrohttpd hands on the URL cut at the NUL, so
 * "/admin/overrides%00x" was served as "/admin/overrides". */
START_TEST(test_path_nul)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "GET", "/admin/config%00x", NULL, auth_ok);
	ck_assert_msg(r.status == 400, "GET config%%00: %ld %s", r.status,
	    r.body);
	ck_assert_str_eq(h_json_str(&r, "error"), "invalid_path");
	admin_req(&a, &r, "PUT", "/admin/overrides%00x",
	    "{\"rule\":\"api\",\"key\":\"nul\",\"limit\":1}", auth_ok);
	ck_assert_msg(r.status == 400, "PUT overrides%%00: %ld %s", r.status,
	    r.body);
	ck_assert_str_eq(h_json_str(&r, "error"), "invalid_path");
	admin_req(&a, &r, "GET", "/admin/overrides?rule=api", NULL, auth_ok);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "overrides")), 0);
	/* Unauthorized first, whatever the path. */
	admin_req(&a, &r, "GET", "/admin/config%00x", NULL, NULL);
	ck_assert_int_eq(r.status, 401);
	/* "%2500" decodes to "%00", which is no NUL. */
	admin_req(&a, &r, "GET", "/admin/config%2500", NULL, auth_ok);
	ck_assert_int_eq(r.status, 404);
	admin_req(&a, &r, "GET", "/admin/config", NULL, auth_ok);
	ck_assert_int_eq(r.status, 200);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* A lease renewed on a key with an override lasts the override's window,
 * as the lease it renews did (it lasted the rule's 2 s before). */
START_TEST(test_override_renew)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	char body[256];
	const char *lease;

	admin_start(&a, 0, true, NULL);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"lock\",\"key\":\"w1\",\"limit\":1,"
	    "\"window\":\"1h\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_post(a.d.port, "/acquire", "{\"t\":\"lock\",\"user\":\"w1\"}", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(json_integer_value(json_object_get(
			     json_array_get(h_json_get(&r, "leases"), 0),
			     "expires_ms")),
	    3600000);
	lease = json_string_value(json_object_get(
	    json_array_get(h_json_get(&r, "leases"), 0), "lease"));
	ck_assert_ptr_nonnull(lease);
	snprintf(body, sizeof(body), "{\"lease\":\"%s\"}", lease);
	h_post(a.d.port, "/renew", body, &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert(json_is_true(h_json_get(&r, "renewed")));
	ck_assert_int_eq(h_json_int(&r, "expires_ms"), 3600000);
	/* Past the rule's own window the lease is still held. */
	h_sleep_ms(2300);
	h_post(a.d.port, "/acquire", "{\"t\":\"lock\",\"user\":\"w1\"}", &r);
	ck_assert_int_eq(r.status, 429);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

struct lock_waiter {
	pthread_t thread;
	int port;
	long status;
	long long answered_ms;
};

static void *
lock_waiter_run(void *arg)
{
	struct lock_waiter *w = arg;
	struct h_resp r = { 0 };

	h_post(w->port, "/acquire",
	    "{\"t\":\"lock\",\"user\":\"w2\",\"wait_ms\":5000}", &r);
	w->status = r.status;
	w->answered_ms = h_now_ms();
	h_resp_free(&r);
	return NULL;
}

/* A reset of a concurrency key frees its leases: a request waiting for
 * one is served at once, not when the lease would have expired (2 s). */
START_TEST(test_reset_serves_lease_waiters)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	struct lock_waiter w = { 0 };
	long long reset_ms;

	admin_start(&a, 0, true, NULL);
	h_post(a.d.port, "/acquire", "{\"t\":\"lock\",\"user\":\"w2\"}", &r);
	ck_assert_int_eq(r.status, 200);
	w.port = a.d.port;
	ck_assert_int_eq(pthread_create(&w.thread, NULL, lock_waiter_run, &w),
	    0);
	h_sleep_ms(300);
	reset_ms = h_now_ms();
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=lock&key=w2", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert(json_is_true(h_json_get(&r, "found")));
	pthread_join(w.thread, NULL);
	ck_assert_int_eq(w.status, 200);
	ck_assert_msg(w.answered_ms - reset_ms < 1000,
	    "the waiter was served %lld ms after the reset",
	    w.answered_ms - reset_ms);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* Two daemons on one Redis: what one sets, the other applies within 1 s;
 * a TTL expires there too; overrides outlive a restart. */
START_TEST(test_overrides_shared)
{
	struct admin_daemon a, b;
	struct h_resp r = { 0 };
	long long ms;
	int b_port;

	admin_start(&a, 0, true, NULL);
	admin_start(&b, 0, true, NULL);
	b_port = b.admin_port;
	ck_assert(wait_limit(&b, "k", 3, 100) >= 0);

	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"k\",\"limit\":1}", auth_ok);
	ck_assert_int_eq(r.status, 200);
	ms = wait_limit(&b, "k", 1, 1000);
	ck_assert_msg(ms >= 0, "the other daemon did not see it within 1 s");
	printf("override seen by the other daemon after %lld ms\n", ms);
	ck_assert_int_eq(acquire_on(&b, "k", &r), 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 1);
	ck_assert_int_eq(acquire_on(&b, "k", &r), 429);

	/* A TTL expires on the other daemon too. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"t\",\"limit\":2,\"ttl\":\"1500ms\"}",
	    auth_ok);
	ck_assert(wait_limit(&b, "t", 2, 1000) >= 0);
	ck_assert(wait_limit(&b, "t", 3, 2500) >= 0);

	/* Deleted: the other daemon follows. */
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=k", NULL,
	    auth_ok);
	ck_assert(json_is_true(h_json_get(&r, "deleted")));
	ck_assert(wait_limit(&b, "k", 3, 1000) >= 0);

	/* Set while b is down, and kept in Redis across a restart of both. */
	admin_stop(&b);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"r\",\"limit\":2}", auth_ok);
	admin_stop(&a);
	admin_start(&b, b_port, true, NULL);
	ck_assert(wait_limit(&b, "r", 2, 1000) >= 0);
	admin_req(&b, &r, "GET", "/admin/overrides?rule=api", NULL, auth_ok);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "overrides")), 1);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HLEN %s",
			     "adm:override:api"),
	    1);
	h_resp_free(&r);
	admin_stop(&b);
}
END_TEST

/* Units rule pf admits to user on a's main listener, of n asked. */
static int
pf_admitted(struct admin_daemon *a, const char *user, int n)
{
	struct h_resp r = { 0 };
	char body[128];
	int i, ok = 0;

	snprintf(body, sizeof(body), "{\"t\":\"pf\",\"user\":\"%s\"}", user);
	for (i = 0; i < n; i++) {
		h_post(a->d.port, "/acquire", body, &r);
		ck_assert_msg(r.status == 200 || r.status == 429, "%ld %s",
		    r.status, r.body);
		ok += r.status == 200;
		h_resp_free(&r);
	}
	return ok;
}

/*
 * A reset drops the quota the daemons hold in advance for the key, this
 * one's at once and the other's when it hears reset.lua's notice: those
 * units came from the counter dropped, and would be admitted on top of a
 * fresh limit.  Limit 10, chunks of 5: each daemon takes one chunk, the
 * key is full; after the reset at most 10 are admitted in all.
 */
START_TEST(test_reset_drops_prefetched)
{
	struct admin_daemon a, b;
	struct h_resp r = { 0 };
	int ok;

	admin_start(&a, 0, true, NULL);
	admin_start(&b, 0, true, NULL);
	ck_assert_int_eq(pf_admitted(&a, "p1", 1), 1);
	ck_assert_int_eq(pf_admitted(&b, "p1", 1), 1);
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=pf&key=p1", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_resp_free(&r);
	h_sleep_ms(300); /* b hears the notice */
	ok = pf_admitted(&a, "p1", 10) + pf_admitted(&b, "p1", 10);
	ck_assert_msg(ok <= 10, "%d admitted after the reset, limit 10", ok);
	ck_assert_msg(ok >= 8, "only %d admitted after the reset", ok);
	admin_stop(&a);
	admin_stop(&b);
}
END_TEST

struct pf_acquire {
	int port;
	long status;
};

static void *
pf_acquire_one(void *arg)
{
	struct pf_acquire *q = arg;
	struct h_resp r = { 0 };

	h_post(q->port, "/acquire", "{\"t\":\"pfr\",\"user\":\"q\"}", &r);
	q->status = r.status;
	h_resp_free(&r);
	return NULL;
}

/* Clients subscribed to adm:released now. */
static long long
subscribers(void)
{
	redisReply *rep;
	long long have;

	rep = redisCommand(h_redis_ctx(&h_shared_redis),
	    "PUBSUB NUMSUB adm:released");
	ck_assert(rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
	    rep->elements == 2);
	have = rep->element[1]->integer;
	freeReplyObject(rep);
	return have;
}

/* Wait (at most 5 s) until n clients subscribe to adm:released. */
static void
wait_subscribers(long long n)
{
	long long have = -1;
	int i;

	for (i = 0; i < 500 && have < n; i++) {
		if (i > 0)
			h_sleep_ms(10);
		have = subscribers();
	}
	ck_assert_msg(have >= n, "%lld subscribers, want %lld", have, n);
}

/* Requests of rule pfr admitted to user q on d, of n asked. */
static int
pfr_admitted(struct h_daemon *d, int n)
{
	struct h_resp r = { 0 };
	int i, ok = 0;

	for (i = 0; i < n; i++) {
		h_post(d->port, "/acquire", "{\"t\":\"pfr\",\"user\":\"q\"}",
		    &r);
		ck_assert_msg(r.status == 200 || r.status == 429, "%ld %s",
		    r.status, r.body);
		ok += r.status == 200;
		h_resp_free(&r);
	}
	return ok;
}

/*
 * A reset while a chunk is in flight: b's replies come 400 ms late
 * (h_relay), its notices at once.  b's request takes a chunk of
 * 1 + min(49, 99 / 8) = 13 (limit 100, prefetch 50); the counter is reset
 * on a before the reply reaches b, and b hears the notice first.  The
 * chunk was recorded in the counter dropped: b must not hold its 12
 * spare units, so after the reset a and b admit at most 100 in all.
 * (b held them, and 112 were admitted.)
 */
START_TEST(test_reset_drops_chunk_in_flight)
{
	static const char rules[] =
	    "  - name: pfr\n"
	    "    match: { t: pfr }\n"
	    "    key: \"${user}\"\n"
	    "    algorithm: fixed_window\n"
	    "    limit: 100\n"
	    "    window: 366d\n" /* no window starts during the test */
	    "    prefetch: { max_units: 50, hold: 30s }\n";
	struct admin_daemon a, b;
	struct h_relay *px;
	struct pf_acquire q;
	struct h_resp r = { 0 };
	char extra[512];
	pthread_t th;
	int ok_a, ok_b;

	px = h_relay_start(h_shared_redis.port);
	h_relay_hold(px, 400);
	snprintf(extra, sizeof(extra),
	    "backend: redis\n"
	    "redis:\n"
	    "  url: \"redis://127.0.0.1:%d/0\"\n"
	    "  timeout: 3s\n"
	    "  key_prefix: \"adm:\"\n"
	    "on_backend_error: deny\n",
	    h_relay_port(px));
	admin_start_rules(&a, 0, true, NULL, rules);
	admin_start_rules(&b, 0, true, extra, rules);
	wait_subscribers(2); /* b hears notices */
	q.port = b.d.port;
	ck_assert_int_eq(pthread_create(&th, NULL, pf_acquire_one, &q), 0);
	h_sleep_ms(150); /* the chunk is recorded; its reply is delayed */
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=pfr&key=q", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200 && json_is_true(h_json_get(&r, "found")),
	    "%ld %s", r.status, r.body);
	h_resp_free(&r);
	pthread_join(th, NULL);
	ck_assert_int_eq(q.status, 200);
	ok_a = pfr_admitted(&a.d, 110);
	ok_b = pfr_admitted(&b.d, 20);
	printf(
	    "reset during a chunk in flight: %d + %d admitted, limit "
	    "100\n",
	    ok_a, ok_b);
	ck_assert_msg(ok_a + ok_b <= 100, "%d + %d admitted after the reset",
	    ok_a, ok_b);
	admin_stop(&a);
	admin_stop(&b);
	h_relay_stop(px);
}
END_TEST

/*
 * A reset whose notice went unheard: both daemons' subscriptions are cut
 * (CLIENT KILL TYPE pubsub) and a resets the key before they are back, so
 * b never hears reset.lua's notice.  b's request took a chunk of 13
 * (limit 100, prefetch 50: test_reset_drops_chunk_in_flight) from the
 * counter dropped; when its subscription is back, b must drop the 12 it
 * holds (it may have missed a reset), so that after the reset a and b
 * admit at most 100 in all.
 */
START_TEST(test_resubscribe_drops_prefetched)
{
	static const char rules[] =
	    "  - name: pfr\n"
	    "    match: { t: pfr }\n"
	    "    key: \"${user}\"\n"
	    "    algorithm: fixed_window\n"
	    "    limit: 100\n"
	    "    window: 366d\n" /* no window starts during the test */
	    "    prefetch: { max_units: 50, hold: 30s }\n";
	struct admin_daemon a, b;
	struct h_resp r = { 0 };
	int ok_a, ok_b;

	admin_start_rules(&a, 0, true, NULL, rules);
	admin_start_rules(&b, 0, true, NULL, rules);
	wait_subscribers(2);
	ck_assert_int_eq(pfr_admitted(&b.d, 1), 1);
	ck_assert_int_eq(h_redis_int(&h_shared_redis,
			     "CLIENT KILL TYPE pubsub"),
	    2);
	admin_req(&a, &r, "DELETE", "/admin/counters?rule=pfr&key=q", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200 && json_is_true(h_json_get(&r, "found")),
	    "%ld %s", r.status, r.body);
	h_resp_free(&r);
	/* Nobody was subscribed when reset.lua published. */
	ck_assert_int_eq(subscribers(), 0);
	wait_subscribers(2);
	h_sleep_ms(200); /* the SUBSCRIBE replies reach the daemons */
	ok_a = pfr_admitted(&a.d, 110);
	ok_b = pfr_admitted(&b.d, 20);
	ck_assert_msg(ok_a + ok_b <= 100, "%d + %d admitted after the reset",
	    ok_a, ok_b);
	admin_stop(&a);
	admin_stop(&b);
}
END_TEST

/* A Redis user that may not PUBLISH on the release channel: an override
 * is set and deleted all the same (the notice is what is lost). */
START_TEST(test_overrides_without_channel_acl)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	redisReply *rep;

	rep = redisCommand(h_redis_ctx(&h_shared_redis),
	    "ACL SETUSER admnochan on >pw ~* +@all resetchannels");
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STATUS,
	    "ACL SETUSER: %s", rep != NULL ? rep->str : "no reply");
	freeReplyObject(rep);
	admin_start(&a, 0, true,
	    "backend: redis\n"
	    "redis:\n"
	    "  url: \"redis://admnochan:pw@127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  key_prefix: \"adm:\"\n"
	    "on_backend_error: deny\n");
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"api\",\"key\":\"n\",\"limit\":1}", auth_ok);
	ck_assert_msg(r.status == 200, "PUT: %ld %s", r.status, r.body);
	ck_assert_int_eq(acquire_on(&a, "n", &r), 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 1);
	ck_assert_int_eq(acquire_on(&a, "n", &r), 429);
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=n", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200 &&
		json_is_true(h_json_get(&r, "deleted")),
	    "DELETE: %ld %s", r.status, r.body);
	h_resp_free(&r);
	admin_stop(&a);
	rep = redisCommand(h_redis_ctx(&h_shared_redis),
	    "ACL DELUSER admnochan");
	freeReplyObject(rep);
}
END_TEST

/* The full read of every rule's hash, every 5 s whatever happens, is not
 * put off by notices arriving more often: a field written straight into
 * api's hash (no notice of its own) is applied within a period while a
 * notice for rule tb comes every 500 ms.  Within 5 s normally; up to two
 * periods are allowed, for a read that timed out on a loaded machine
 * (before the fix it never was while the notices kept coming). */
START_TEST(test_resync_despite_notices)
{
	struct admin_daemon a;
	long long t0, ms = -1;
	struct h_resp r = { 0 };

	admin_start(&a, 0, true, NULL);
	ck_assert(wait_limit(&a, "h", 3, 100) >= 0);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HSET %s %s %s",
			     "adm:override:api", "h", "2 10000 0"),
	    1);
	t0 = h_now_ms();
	while (h_now_ms() - t0 < 12000) {
		h_redis_int(&h_shared_redis, "PUBLISH %s %s", "adm:released",
		    "adm:override:tb");
		admin_req(&a, &r, "GET", "/admin/counters?rule=api&key=h", NULL,
		    auth_ok);
		if (r.status == 200 && h_json_int(&r, "limit") == 2) {
			ms = h_now_ms() - t0;
			break;
		}
		h_sleep_ms(500);
	}
	printf("a field written without a notice applied after %lld ms\n", ms);
	ck_assert_msg(ms >= 0 && ms <= 11000,
	    "the field was not applied within 11 s (%lld ms)", ms);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

#define RULE_GONE \
	"  - name: gone\n" \
	"    match: { t: gone }\n" \
	"    key: \"${user}\"\n" \
	"    limit: 5\n" \
	"    window: 10s\n"

/* How many overrides GET /admin/overrides?rule= lists, or -1 when the
 * answer is not 200. */
static long
listed(struct admin_daemon *a, const char *rule)
{
	struct h_resp r = { 0 };
	char path[128];
	long n;

	snprintf(path, sizeof(path), "/admin/overrides?rule=%s", rule);
	admin_req(a, &r, "GET", path, NULL, auth_ok);
	n = r.status == 200 ?
	    (long)json_array_size(h_json_get(&r, "overrides")) :
	    -1;
	h_resp_free(&r);
	return n;
}

/* Memory store: a rule removed by a reload keeps its overrides (they
 * apply again if it comes back), and since they still count toward the
 * bound, GET and DELETE can still name the rule; a rule that holds none
 * stays unknown. */
START_TEST(test_override_removed_rule_memory)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	admin_start_rules(&a, 0, true, NULL, RULE_GONE);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"gone\",\"key\":\"g1\",\"limit\":1}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"gone\",\"key\":\"g2\",\"limit\":1}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	admin_reload(&a, NULL, NULL, 0);
	ck_assert_int_eq(listed(&a, "gone"), 2);
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=gone&key=g1", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200 &&
		json_is_true(h_json_get(&r, "deleted")),
	    "DELETE: %ld %s", r.status, r.body);
	ck_assert_int_eq(listed(&a, "gone"), 1);
	ck_assert_int_eq(listed(&a, "never"), -1);
	/* Still no PUT for a rule the config does not have. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"gone\",\"key\":\"g3\",\"limit\":1}", auth_ok);
	ck_assert_int_eq(r.status, 400);
	/* Back: the one kept applies again. */
	admin_reload(&a, NULL, RULE_GONE, 1);
	h_post(a.d.port, "/acquire", "{\"t\":\"gone\",\"user\":\"g2\"}", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(h_json_int(&r, "limit"), 1);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* Fill hash with n fields straight in Redis, "<prefix><i>" = value. */
static void
fill_hash_with(const char *hash, int n, const char *prefix, const char *value)
{
	const char *argv[2 + 2 * 1000];
	size_t lens[2 + 2 * 1000];
	static char fields[1000][16];
	redisReply *rep;
	int i, j, k;

	for (i = 0; i < n; i += 1000) {
		argv[0] = "HSET";
		argv[1] = hash;
		for (j = 0, k = 2; j < 1000 && i + j < n; j++) {
			snprintf(fields[j], sizeof(fields[j]), "%s%d", prefix,
			    i + j);
			argv[k++] = fields[j];
			argv[k++] = value;
		}
		for (j = 0; j < k; j++)
			lens[j] = strlen(argv[j]);
		rep = redisCommandArgv(h_redis_ctx(&h_shared_redis), k, argv,
		    lens);
		ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_INTEGER,
		    "HSET failed");
		freeReplyObject(rep);
	}
}

/* Fill adm:override:gone with n fields straight in Redis. */
static void
fill_hash(int n)
{
	fill_hash_with("adm:override:gone", n, "f", "2 10000 0");
}

/* Fill adm:override:api with n fields of limit 3 and the override of
 * key h, h_value ("<limit> <window_ms> <expires_ms>"). */
static void
fill_api_hash(int n, const char *h_value)
{
	fill_hash_with("adm:override:api", n, "f", "3 10000 0");
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HSET %s %s %s",
			     "adm:override:api", "h", h_value),
	    1);
}

/* Status of a PUT of a new override for api. */
static long
put_api(struct admin_daemon *a, const char *key, struct h_resp *r)
{
	char body[128];

	snprintf(body, sizeof(body),
	    "{\"rule\":\"api\",\"key\":\"%s\",\"limit\":2}", key);
	admin_req(a, r, "PUT", "/admin/overrides", body, auth_ok);
	return r->status;
}

/* The Redis store with time for a read of 200,000 strings, which takes
 * a while under a sanitizer. */
#define REDIS_SLOW \
	"backend: redis\n" \
	"redis:\n" \
	"  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n" \
	"  timeout: 5s\n" \
	"  key_prefix: \"adm:\"\n"

/* Whether a PUT of a new override for api answers 507 within 15 s (the
 * sync reads a hash in a moment): each one that passes is deleted. */
static bool
wait_full(struct admin_daemon *a, struct h_resp *r)
{
	long long t0 = h_now_ms();

	while (put_api(a, "new", r) != 507) {
		admin_req(a, r, "DELETE", "/admin/overrides?rule=api&key=new",
		    NULL, auth_ok);
		if (h_now_ms() - t0 > 15000)
			return false;
		h_sleep_ms(50);
	}
	return true;
}

/* Redis: the overrides of a rule a reload removed no longer count toward
 * the bound (the daemon's copy goes; the hash stays, and is read again
 * when the rule comes back).  The bound is reached cheaply: the hash of
 * rule gone is filled in Redis and read at start. */
START_TEST(test_override_removed_rule_redis)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	fill_hash(100000);
	admin_start_rules(&a, 0, true, REDIS_SLOW, RULE_GONE);
	ck_assert_msg(wait_full(&a, &r), "the table never filled: %ld %s",
	    r.status, r.body);

	admin_reload(&a, REDIS_SLOW, NULL, 0);
	ck_assert_msg(put_api(&a, "new", &r) == 200,
	    "PUT after the rule went: %ld %s", r.status, r.body);
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=new", NULL,
	    auth_ok);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HLEN %s",
			     "adm:override:gone"),
	    100000);
	/* Back: read again, and the table is full again. */
	admin_reload(&a, REDIS_SLOW, RULE_GONE, 1);
	ck_assert_msg(wait_full(&a, &r), "gone's hash not read again: %ld %s",
	    r.status, r.body);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* Key k of the rule matched by {"t": t}, right after a reload: the first
 * request allowed and the second denied, both under its override's limit
 * of 1 (the rule's own is 5). */
static void
assert_override_of_one(struct admin_daemon *a, const char *t)
{
	struct h_resp r = { 0 };
	char body[64];
	int i;

	snprintf(body, sizeof(body), "{\"t\":\"%s\",\"user\":\"k\"}", t);
	for (i = 0; i < 2; i++) {
		h_post(a->d.port, "/acquire", body, &r);
		ck_assert_msg(h_json_int(&r, "limit") == 1,
		    "request %d after the reload: %ld %s", i, r.status, r.body);
		ck_assert_int_eq(r.status, i == 0 ? 200 : 429);
	}
	h_resp_free(&r);
}

/*
 * Redis: a reload that brings a rule back (or adds one) reads its hash
 * before any request is decided under it, as at start: the first request
 * of a key with an override of limit 1 is answered under that limit, and
 * the second denied.  (The rule used to reach the front ends first and
 * its hash to be read after: with 20,000 fields, its first requests were
 * decided under the rule's own limit of 5.)
 */
START_TEST(test_override_rule_back_read_first)
{
	struct admin_daemon a;

	fill_hash_with("adm:override:gone", 20000, "f", "2 10000 0");
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HSET %s %s %s",
			     "adm:override:gone", "k", "1 10000 0"),
	    1);
	admin_start_rules(&a, 0, true, REDIS_SLOW, NULL);
	admin_reload(&a, REDIS_SLOW, RULE_GONE, 0);
	assert_override_of_one(&a, "gone");
	admin_stop(&a);
}
END_TEST

/*
 * Redis: a reload that swaps a rule whose hash fills the table (100,000
 * overrides) for a new one still reads the new rule's hash first: the
 * removed rule's copy goes before, and leaves the room.  (Dropped after
 * the read, it left none: the new rule's overrides were refused as past
 * the bound, and its first requests decided under its own limit.)
 */
START_TEST(test_override_rule_swap_full_table)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	fill_hash(100000);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HSET %s %s %s",
			     "adm:override:fresh", "k", "1 10000 0"),
	    1);
	admin_start_rules(&a, 0, true, REDIS_SLOW, RULE_GONE);
	ck_assert_msg(wait_full(&a, &r), "the table never filled: %ld %s",
	    r.status, r.body);
	admin_reload(&a, REDIS_SLOW,
	    "  - name: fresh\n"
	    "    match: { t: fresh }\n"
	    "    key: \"${user}\"\n"
	    "    limit: 5\n"
	    "    window: 10s\n",
	    0);
	assert_override_of_one(&a, "fresh");
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* The commands the Lua scripts ran, as MONITOR shows them, from when
 * monitor_start() returned until monitor_end(): each line "[0 lua]". */
static redisContext *
monitor_start(void)
{
	redisContext *c = redisConnect("127.0.0.1", h_shared_redis.port);
	redisReply *rep;

	ck_assert_msg(c != NULL && !c->err, "connect for MONITOR");
	rep = redisCommand(c, "MONITOR");
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STATUS,
	    "MONITOR refused");
	freeReplyObject(rep);
	return c;
}

/* Read c's MONITOR lines up to a marker sent now; into buf, the lines of
 * scripts' commands (cut at len); how many there were. */
static int
monitor_end(redisContext *c, char *buf, size_t len)
{
	redisReply *rep;
	size_t at = 0;
	int n = 0, w;

	ck_assert_int_eq(h_redis_int(&h_shared_redis, "STRLEN %s",
			     "monitor-end-marker"),
	    0);
	for (;;) {
		ck_assert_msg(redisGetReply(c, (void **)&rep) == REDIS_OK,
		    "MONITOR: connection lost");
		if (rep->type == REDIS_REPLY_STATUS &&
		    strstr(rep->str, "monitor-end-marker") != NULL) {
			freeReplyObject(rep);
			break;
		}
		if (rep->type == REDIS_REPLY_STATUS &&
		    strstr(rep->str, " lua] ") != NULL) {
			n++;
			w = snprintf(buf + at, at < len ? len - at : 0, "%s\n",
			    rep->str);
			if (w > 0)
				at += (size_t)w;
		}
		freeReplyObject(rep);
	}
	redisFree(c);
	return n;
}

/* A write costs Redis the same however big the hash: a PUT and a DELETE
 * on a hash of 50,000 fields run a handful of commands (TIME, HGET,
 * HSET or HDEL, PUBLISH) and none that reads the whole hash (before, each
 * write ran HGETALL to sweep expired fields: 150 ms at 100,000). */
START_TEST(test_override_write_touches_one_field)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	redisContext *mon;
	char lines[8192];
	int n;

	fill_hash_with("adm:override:api", 50000, "f", "2 10000 0");
	admin_start(&a, 0, true, REDIS_SLOW);
	mon = monitor_start();
	ck_assert_msg(put_api(&a, "vip", &r) == 200, "PUT: %ld %s", r.status,
	    r.body);
	admin_req(&a, &r, "DELETE", "/admin/overrides?rule=api&key=f7", NULL,
	    auth_ok);
	ck_assert_msg(r.status == 200 &&
		json_is_true(h_json_get(&r, "deleted")),
	    "DELETE: %ld %s", r.status, r.body);
	n = monitor_end(mon, lines, sizeof(lines));
	printf("the scripts of a PUT and a DELETE ran %d commands:\n%s", n,
	    lines);
	ck_assert_msg(n >= 2 && n <= 8, "%d commands:\n%s", n, lines);
	ck_assert_msg(strcasestr(lines, "\"hgetall\"") == NULL &&
		strcasestr(lines, "\"hscan\"") == NULL &&
		strcasestr(lines, "\"hkeys\"") == NULL &&
		strcasestr(lines, "\"hvals\"") == NULL,
	    "a write read the whole hash:\n%s", lines);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HLEN %s",
			     "adm:override:api"),
	    50000);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* With no write at all, the fields of a hash past their expiry go: the
 * daemon's read, which sees them, asks Redis to drop them; a live one
 * stays. */
START_TEST(test_override_expired_dropped_by_read)
{
	struct admin_daemon a;
	long long t0, n;

	fill_hash_with("adm:override:api", 1000, "old", "2 10000 1");
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HSET %s %s %s",
			     "adm:override:api", "live", "2 10000 0"),
	    1);
	admin_start(&a, 0, true, REDIS_SLOW);
	ck_assert(wait_limit(&a, "live", 2, 2000) >= 0);
	for (t0 = h_now_ms();; h_sleep_ms(50)) {
		n = h_redis_int(&h_shared_redis, "HLEN %s", "adm:override:api");
		if (n == 1 || h_now_ms() - t0 > 12000)
			break;
	}
	ck_assert_msg(n == 1, "%lld fields left, want 1", n);
	admin_stop(&a);
}
END_TEST

/* Run override.lua (from the source tree) on adm:override:d with args
 * after the key (op first; the channel is added last when channel is
 * true): its reply, never an error. */
static redisReply *
script_eval(const char *const *args, int nargs, bool channel)
{
	const char *src = getenv("RATELIMITD_SRCDIR");
	const char *argv[4 + 1 + 2 * 8 + 1];
	char path[H_PATH_MAX], *script;
	redisReply *rep;
	int argc = 0, i;

	ck_assert(nargs <= 1 + 2 * 8);
	snprintf(path, sizeof(path), "%s/lua/override.lua",
	    src != NULL ? src : ".");
	script = ops_slurp(path);
	argv[argc++] = "EVAL";
	argv[argc++] = script;
	argv[argc++] = "1";
	argv[argc++] = "adm:override:d";
	for (i = 0; i < nargs; i++)
		argv[argc++] = args[i];
	if (channel)
		argv[argc++] = "adm:released";
	rep = redisCommandArgv(h_redis_ctx(&h_shared_redis), argc, argv, NULL);
	free(script);
	ck_assert_msg(rep != NULL && rep->type != REDIS_REPLY_ERROR,
	    "override.lua %s: %s", args[0],
	    rep != NULL && rep->str != NULL ? rep->str : "?");
	return rep;
}

/* override.lua (op first) with the channel: its reply. */
static redisReply *
script_override(const char *const *args, int nargs)
{
	return script_eval(args, nargs, true);
}

/* Run override.lua's drop on adm:override:d with the pairs of argv
 * (field, value, ...): its integer answer. */
static long long
script_drop(const char *const *pairs, int npairs)
{
	const char *args[1 + 2 * 8];
	redisReply *rep;
	long long n;
	int i;

	ck_assert(npairs <= 8);
	args[0] = "drop";
	for (i = 0; i < 2 * npairs; i++)
		args[1 + i] = pairs[i];
	rep = script_eval(args, 1 + 2 * npairs, false);
	ck_assert_msg(rep->type == REDIS_REPLY_INTEGER, "drop: not an integer");
	n = rep->integer;
	freeReplyObject(rep);
	return n;
}

/* override.lua's drop deletes a field only if it still holds the value
 * the daemon read and is expired by Redis's clock: one set again between
 * the read and the drop keeps its new value, and one a daemon with a
 * clock ahead thinks expired stays. */
START_TEST(test_override_drop_is_conditional)
{
	char later[64];
	const char *pairs[] = { "gone", "2 10000 1", "reset", "2 10000 1",
		"ahead", later, "absent", "2 10000 1" };

	snprintf(later, sizeof(later), "2 10000 %lld",
	    (long long)time(NULL) * 1000 + 3600000);
	ck_assert_int_eq(h_redis_int(&h_shared_redis,
			     "HSET %s %s %s %s %s %s %s", "adm:override:d",
			     "gone", "2 10000 1", "reset", "5 10000 0", "ahead",
			     later),
	    3);
	/* "reset" was read as "2 10000 1", then set again. */
	ck_assert_int_eq(script_drop(pairs, 4), 1);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HEXISTS %s %s",
			     "adm:override:d", "gone"),
	    0);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HEXISTS %s %s",
			     "adm:override:d", "reset"),
	    1);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HEXISTS %s %s",
			     "adm:override:d", "ahead"),
	    1);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HLEN %s",
			     "adm:override:d"),
	    2);
}
END_TEST

/* How many times Redis ran command name (lower case), from INFO
 * commandstats (scripts' commands included). */
static long long
command_calls(const char *name)
{
	redisReply *rep = redisCommand(h_redis_ctx(&h_shared_redis),
	    "INFO commandstats");
	char needle[64];
	const char *p;
	long long n = 0;

	ck_assert_msg(rep != NULL &&
		(rep->type == REDIS_REPLY_STRING ||
		    rep->type == REDIS_REPLY_STATUS),
	    "INFO commandstats");
	snprintf(needle, sizeof(needle), "cmdstat_%s:calls=", name);
	if ((p = strstr(rep->str, needle)) != NULL)
		n = strtoll(p + strlen(needle), NULL, 10);
	freeReplyObject(rep);
	return n;
}

/* override.lua's undo as the daemon sends it: 1 or 0. */
static long long
script_undo(const char *field, const char *previous, const char *written)
{
	const char *args[] = { "undo", field, previous, written };
	redisReply *rep = script_override(args, 4);
	long long n;

	ck_assert_int_eq(rep->type, REDIS_REPLY_INTEGER);
	n = rep->integer;
	freeReplyObject(rep);
	return n;
}

/* adm:override:d's field, or "(none)". */
static void
d_field(const char *field, char *buf, size_t len)
{
	redisReply *rep = redisCommand(h_redis_ctx(&h_shared_redis),
	    "HGET %s %s", "adm:override:d", field);

	ck_assert(rep != NULL &&
	    (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_NIL));
	snprintf(buf, len, "%s",
	    rep->type == REDIS_REPLY_STRING ? rep->str : "(none)");
	freeReplyObject(rep);
}

/* override.lua's set answers what the field held (nil: nothing) and what
 * it wrote; its undo puts back only a field that still holds what the
 * set wrote: the value held before, expiry and all, or nothing; a field
 * written since keeps that write.  Only an undo that changed the field
 * PUBLISHes. */
START_TEST(test_override_undo_is_conditional)
{
	const char *set[] = { "set", "back", "2 0", "0" };
	char later[64], v[64];
	redisReply *rep;

	snprintf(later, sizeof(later), "5 1000 %lld",
	    (long long)time(NULL) * 1000 + 3600000);
	rep = script_override(set, 4);
	ck_assert_msg(rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
		rep->element[0]->type == REDIS_REPLY_NIL &&
		rep->element[1]->type == REDIS_REPLY_STRING &&
		strcmp(rep->element[1]->str, "2 0 0") == 0,
	    "set of a new field");
	freeReplyObject(rep);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HSET %s %s %s",
			     "adm:override:d", "back", later),
	    0);
	rep = script_override(set, 4);
	ck_assert_msg(rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
		rep->element[0]->type == REDIS_REPLY_STRING &&
		strcmp(rep->element[0]->str, later) == 0 &&
		strcmp(rep->element[1]->str, "2 0 0") == 0,
	    "set of a field held");
	freeReplyObject(rep);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "HSET %s %s %s %s %s",
			     "adm:override:d", "gone", "2 0 0", "kept",
			     "9 0 0"),
	    2);
	freeReplyObject(redisCommand(h_redis_ctx(&h_shared_redis),
	    "CONFIG RESETSTAT"));

	ck_assert_int_eq(script_undo("back", later, "2 0 0"), 1);
	d_field("back", v, sizeof(v));
	ck_assert_str_eq(v, later);
	ck_assert_int_eq(script_undo("gone", "", "2 0 0"), 1);
	d_field("gone", v, sizeof(v));
	ck_assert_str_eq(v, "(none)");
	/* "kept" was set to "2 0 0", then to "9 0 0" by another write. */
	ck_assert_int_eq(script_undo("kept", "", "2 0 0"), 0);
	d_field("kept", v, sizeof(v));
	ck_assert_str_eq(v, "9 0 0");
	ck_assert_int_eq(command_calls("publish"), 2);
}
END_TEST

/* A rule's hash is read in pages, each a call of its own under
 * redis.timeout (one HGETALL of a big hash would not fit it): a daemon
 * with 20,000 fields in api's hash applies the one it is asked about, by
 * the sync and by GET /admin/overrides, and Redis saw HSCANs and no
 * HGETALL. */
START_TEST(test_override_read_in_pages)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	fill_api_hash(20000, "2 10000 0");
	freeReplyObject(redisCommand(h_redis_ctx(&h_shared_redis),
	    "CONFIG RESETSTAT"));
	admin_start(&a, 0, true, REDIS_SLOW);
	ck_assert(wait_limit(&a, "h", 2, 3000) >= 0);
	ck_assert_int_eq(listed(&a, "api"), 20001);
	printf("reads of 20,001 fields: %lld HSCAN, %lld HGETALL\n",
	    command_calls("hscan"), command_calls("hgetall"));
	ck_assert_int_eq(command_calls("hgetall"), 0);
	ck_assert_msg(command_calls("hscan") >= 10, "%lld HSCAN",
	    command_calls("hscan"));
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* Overrides survive restarts: a daemon started on a big hash decides its
 * first request under the override already (it reads the hashes before
 * it serves), not under the rule's own limit while the read goes on. */
START_TEST(test_overrides_at_start)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };

	fill_api_hash(30000, "1 3600000 0");
	admin_start(&a, 0, true, NULL);
	ck_assert_int_eq(acquire_on(&a, "h", &r), 200);
	ck_assert_msg(h_json_int(&r, "limit") == 1, "%s", r.body);
	h_resp_free(&r);
	ck_assert_int_eq(acquire_on(&a, "h", &r), 429);
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* The two PUTs the tests below race: each of api's key, limit 2, from a
 * thread of its own (h_request(), on a handle made beforehand). */
struct racing_put {
	pthread_t thread;
	CURL *curl;
	int port;
	const char *key;
	struct h_resp r;
};

static void *
racing_put_run(void *arg)
{
	struct racing_put *p = arg;
	char body[128];

	snprintf(body, sizeof(body),
	    "{\"rule\":\"api\",\"key\":\"%s\",\"limit\":2}", p->key);
	if (h_request(p->curl, p->port, &p->r, "PUT", "/admin/overrides", body,
		strlen(body), auth_ok) < 0)
		p->r.status = 0;
	return NULL;
}

/* Another daemon's override, as that daemon wrote it. */
#define OTHER_OVERRIDE "7 0 0"

/*
 * Start a, its table at its bound but one (gone's hash of 99,999 fields),
 * and race a PUT of api's a and one of h, both set by another daemon
 * that a never read: the two fields are written as Redis pauses (HSET
 * and CLIENT PAUSE in one write, so that no read of the hash runs between
 * them), and each PUT, sent during the pause, finds room at its look, so
 * both write Redis when the pause ends: the table then has room for one
 * only.  extra: the store's config, as for admin_yaml(), with a
 * redis.timeout longer than pause_ms, how long Redis pauses.  On return
 * the PUTs are started, not done; the connection that paused (no
 * timeout) is returned.
 */
static redisContext *
race_two_puts(struct admin_daemon *a, const char *extra, struct racing_put p[2],
    int pause_ms)
{
	redisContext *c;
	redisReply *rep;
	int i;

	fill_hash(99999);
	admin_start_rules(a, 0, true, extra, RULE_GONE);
	ck_assert_int_eq(listed(a, "gone"), 99999);
	freeReplyObject(redisCommand(h_redis_ctx(&h_shared_redis),
	    "CONFIG RESETSTAT"));
	c = redisConnect("127.0.0.1", h_shared_redis.port);
	ck_assert_msg(c != NULL && !c->err, "connect for CLIENT PAUSE");
	redisAppendCommand(c, "HSET %s %s %s %s %s", "adm:override:api", "a",
	    OTHER_OVERRIDE, "h", OTHER_OVERRIDE);
	redisAppendCommand(c, "CLIENT PAUSE %d ALL", pause_ms);
	for (i = 0; i < 2; i++) {
		ck_assert_int_eq(redisGetReply(c, (void **)&rep), REDIS_OK);
		ck_assert_msg(rep->type != REDIS_REPLY_ERROR, "%s", rep->str);
		freeReplyObject(rep);
	}
	for (i = 0; i < 2; i++) {
		memset(&p[i], 0, sizeof(p[i]));
		p[i].curl = h_curl_new();
		p[i].port = a->admin_port;
		p[i].key = i == 0 ? "a" : "h";
		ck_assert_int_eq(pthread_create(&p[i].thread, NULL,
				     racing_put_run, &p[i]),
		    0);
	}
	return c;
}

static void
racing_puts_join(struct racing_put p[2])
{
	int i;

	for (i = 0; i < 2; i++) {
		pthread_join(p[i].thread, NULL);
		curl_easy_cleanup(p[i].curl);
		printf("PUT of %s: %ld %s\n", p[i].key, p[i].r.status,
		    p[i].r.body);
	}
}

/* api's field in Redis, or "(none)". */
static void
api_field(const char *field, char *buf, size_t len)
{
	redisReply *rep = redisCommand(h_redis_ctx(&h_shared_redis),
	    "HGET %s %s", "adm:override:api", field);

	ck_assert_msg(rep != NULL &&
		(rep->type == REDIS_REPLY_STRING ||
		    rep->type == REDIS_REPLY_NIL),
	    "HGET %s", field);
	snprintf(buf, len, "%s",
	    rep->type == REDIS_REPLY_STRING ? rep->str : "(none)");
	freeReplyObject(rep);
}

/*
 * Whether the race of race_two_puts() went to the overrides sync: the
 * notice of the first write had this daemon read api's hash again before
 * the second PUT kept its copy, and that read, at the bound, kept the
 * second PUT's field in place of the first's, so that both PUTs answered
 * 200 and neither took anything back (two script calls).  Then both
 * fields hold what the PUTs set; the daemon is stopped and api's hash
 * deleted for another go.
 */
static bool
race_went_to_sync(struct admin_daemon *a, struct racing_put p[2])
{
	char v[64];
	int i;

	if (p[0].r.status != 200 || p[1].r.status != 200)
		return false;
	ck_assert_int_eq(command_calls("eval"), 2);
	for (i = 0; i < 2; i++) {
		api_field(p[i].key, v, sizeof(v));
		ck_assert_str_eq(v, "2 0 0");
		h_resp_free(&p[i].r);
	}
	admin_stop(a);
	freeReplyObject(redisCommand(h_redis_ctx(&h_shared_redis), "DEL %s",
	    "adm:override:api"));
	return true;
}

/*
 * A PUT refused for want of room after it wrote Redis (this daemon's
 * table filled between its look and its own copy, here by the other PUT)
 * takes back only its own write: the field it set holds the other
 * daemon's override again.  (It was deleted: that override was lost.)
 * Both PUTs wrote (three script calls: two sets and the one taken
 * back), so the 507 came after the write.  A race that went to the
 * sync is run again, up to three times in all.
 */
START_TEST(test_override_refused_keeps_other)
{
	struct admin_daemon a;
	struct racing_put p[2];
	redisContext *c;
	char v[64];
	int i, go, refused = 0;

	for (go = 0;; go++) {
		c = race_two_puts(&a, REDIS_SLOW, p, 1500);
		racing_puts_join(p);
		redisFree(c);
		if (go == 2 || !race_went_to_sync(&a, p))
			break;
	}
	ck_assert_msg(command_calls("eval") >= 3,
	    "%lld script calls: the PUTs did not both write",
	    command_calls("eval"));
	for (i = 0; i < 2; i++) {
		api_field(p[i].key, v, sizeof(v));
		if (p[i].r.status == 507) {
			refused++;
			ck_assert_msg(strcmp(v, OTHER_OVERRIDE) == 0,
			    "%s refused but holds %s, not the other daemon's "
			    "%s",
			    p[i].key, v, OTHER_OVERRIDE);
		} else {
			ck_assert_msg(p[i].r.status == 200, "PUT of %s: %ld %s",
			    p[i].key, p[i].r.status, p[i].r.body);
			ck_assert_str_eq(v, "2 0 0");
		}
		h_resp_free(&p[i].r);
	}
	ck_assert_int_eq(refused, 1);
	admin_stop(&a);
}
END_TEST

/*
 * When taking the write back fails, the PUT is no 507 ("nothing
 * written"): it answers that the store failed and that the override may
 * be set, and logs it.  A second pause, queued behind the two writes,
 * holds the take-back past redis.timeout (2.5 s, longer than the first
 * pause, 1.6 s, and short enough for the client's 5 s).  The writes have
 * 0.8 s to reach Redis before it, and it 0.8 s to come before the first
 * pause ends.  (The client was told 507 while the field stayed.)
 */
START_TEST(test_override_undo_failed)
{
	static const char timeout_2500ms[] =
	    "backend: redis\n"
	    "redis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 2500ms\n"
	    "  key_prefix: \"adm:\"\n";
	struct admin_daemon a;
	struct racing_put p[2];
	redisContext *c, *c2;
	redisReply *rep;
	char v[64];
	int i, failed = 0;

	c = race_two_puts(&a, timeout_2500ms, p, 1600);
	h_sleep_ms(800); /* both PUTs wait for Redis */
	c2 = redisConnect("127.0.0.1", h_shared_redis.port);
	ck_assert_msg(c2 != NULL && !c2->err, "connect for CLIENT PAUSE");
	rep = redisCommand(c2, "CLIENT PAUSE %d ALL", 5000);
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STATUS,
	    "CLIENT PAUSE");
	freeReplyObject(rep);
	racing_puts_join(p);
	/* The end of the second pause. */
	rep = redisCommand(c2, "PING");
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STATUS, "PING");
	freeReplyObject(rep);
	redisFree(c2);
	redisFree(c);
	for (i = 0; i < 2; i++) {
		if (p[i].r.status == 503) {
			failed++;
			ck_assert_str_eq(h_json_str(&p[i].r, "error"),
			    "backend_unavailable");
			ck_assert_msg(strstr(h_json_str(&p[i].r, "message"),
					  "may be set") != NULL,
			    "PUT of %s: %s", p[i].key, p[i].r.body);
		} else {
			ck_assert_msg(p[i].r.status == 200, "PUT of %s: %ld %s",
			    p[i].key, p[i].r.status, p[i].r.body);
			api_field(p[i].key, v, sizeof(v));
			ck_assert_str_eq(v, "2 0 0");
		}
		h_resp_free(&p[i].r);
	}
	ck_assert_int_eq(failed, 1);
	ck_assert(h_file_count(a.d.log, "may be set") > 0);
	admin_stop(&a);
}
END_TEST

/* A read of a rule's overrides that fails is a warning (it was logged
 * only for debugging), once per full read: tb's hash is a string. */
START_TEST(test_override_read_failure_warned)
{
	struct admin_daemon a;
	redisReply *rep;
	int n;

	rep = redisCommand(h_redis_ctx(&h_shared_redis), "SET %s %s",
	    "adm:override:tb", "not a hash");
	ck_assert_msg(rep != NULL, "SET");
	freeReplyObject(rep);
	admin_start(&a, 0, true, NULL);
	ck_assert(wait_limit(&a, "x", 3, 2000) >= 0);
	h_sleep_ms(6000); /* the read at start, and one 5 s later */
	admin_stop(&a);
	n = ops_count_in_file(a.d.log,
	    "level=warn msg=\"overrides of tb not read");
	ck_assert_msg(n >= 1 && n <= 3, "warned %d times", n);
}
END_TEST

/* Rule win, with window w ("1m", "1h"). */
#define RULE_WIN(w) \
	"  - name: win\n" \
	"    match: { t: win }\n" \
	"    key: \"${user}\"\n" \
	"    limit: 3\n" \
	"    window: " w "\n"

/* The RateLimit-Policy of rule win for user w (asserts a 200). */
static void
win_policy(struct admin_daemon *a, const char *want)
{
	struct h_resp r = { 0 };

	h_post(a->d.port, "/acquire", "{\"t\":\"win\",\"user\":\"w\"}", &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_int_eq(h_json_int(&r, "limit"), 7);
	ck_assert_str_eq(h_resp_header(&r, "RateLimit-Policy"), want);
	h_resp_free(&r);
}

/* An override set without a window follows the rule's window as the
 * config has it now: a reload from 1m to 1h changes the override's too,
 * in decisions and in GET; on Redis the hash says 0 for it. */
START_TEST(test_override_follows_rule_window)
{
	struct admin_daemon a;
	struct h_resp r = { 0 };
	json_t *o;

	admin_start_rules(&a, 0, true, NULL, RULE_WIN("1m"));
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"win\",\"key\":\"w\",\"limit\":7}", auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_int_eq(h_json_int(&r, "window_ms"), 60000);
	win_policy(&a, "\"win\";q=7;w=60");

	admin_reload(&a, NULL, RULE_WIN("1h"), 0);
	win_policy(&a, "\"win\";q=7;w=3600");
	if (use_redis) {
		redisReply *rep = redisCommand(h_redis_ctx(&h_shared_redis),
		    "HGET adm:override:win w");

		ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STRING,
		    "no field");
		ck_assert_str_eq(rep->str, "7 0 0");
		freeReplyObject(rep);
	}
	admin_req(&a, &r, "GET", "/admin/overrides?rule=win", NULL, auth_ok);
	ck_assert_int_eq(r.status, 200);
	o = json_array_get(h_json_get(&r, "overrides"), 0);
	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(json_integer_value(json_object_get(o, "window_ms")),
	    3600000);
	ck_assert(json_is_true(json_object_get(o, "window_from_rule")));

	/* One with its own window keeps it. */
	admin_req(&a, &r, "PUT", "/admin/overrides",
	    "{\"rule\":\"win\",\"key\":\"w\",\"limit\":7,\"window\":\"1m\"}",
	    auth_ok);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert(json_is_false(h_json_get(&r, "window_from_rule")));
	admin_reload(&a, NULL, RULE_WIN("2h"), 1);
	win_policy(&a, "\"win\";q=7;w=60");
	h_resp_free(&r);
	admin_stop(&a);
}
END_TEST

/* Notices of override.lua PUBLISHed from another client, in batches of
 * FLOOD_BATCH with a short pause between them, while *on holds. */
struct notice_flood {
	pthread_t thread;
	int port;
	atomic_bool *on, *stop;
	long long sent;
};

#define FLOOD_BATCH  500
#define FLOOD_PAUSE  1 /* ms between batches */
#define FLOOD_ROUNDS 5

static void *
notice_flood_run(void *arg)
{
	struct notice_flood *f = arg;
	redisContext *c = redisConnect("127.0.0.1", f->port);
	redisReply *rep;
	int i;

	if (c == NULL || c->err) {
		redisFree(c);
		return NULL;
	}
	while (!atomic_load(f->stop)) {
		if (!atomic_load(f->on)) {
			h_sleep_ms(FLOOD_PAUSE);
			continue;
		}
		for (i = 0; i < FLOOD_BATCH; i++)
			redisAppendCommand(c, "PUBLISH %s %s", "adm:released",
			    "adm:override:api");
		for (i = 0; i < FLOOD_BATCH; i++) {
			if (redisGetReply(c, (void **)&rep) != REDIS_OK)
				goto out;
			freeReplyObject(rep);
		}
		f->sent += FLOOD_BATCH;
		h_sleep_ms(FLOOD_PAUSE);
	}
out:
	redisFree(c);
	return NULL;
}

/* Stopped while notices of overrides keep coming: the store's thread,
 * which hands them to the overrides, ends before the overrides are freed,
 * and the daemon exits cleanly (status 0; under AddressSanitizer, no use
 * after free).  The notices come only around each stop, so that the
 * daemon starts unhindered; a few rounds, since each stop is one
 * chance. */
START_TEST(test_stop_during_notices)
{
	struct notice_flood f;
	struct admin_daemon a;
	atomic_bool on, stop;
	int round;

	atomic_init(&on, false);
	atomic_init(&stop, false);
	f = (struct notice_flood){
		.port = h_shared_redis.port, .on = &on, .stop = &stop
	};
	ck_assert_int_eq(pthread_create(&f.thread, NULL, notice_flood_run, &f),
	    0);
	for (round = 0; round < FLOOD_ROUNDS; round++) {
		admin_start(&a, 0, true, NULL);
		atomic_store(&on, true);
		h_sleep_ms(100);
		admin_stop(&a); /* asserts exit status 0 */
		atomic_store(&on, false);
	}
	atomic_store(&stop, true);
	pthread_join(f.thread, NULL);
	ck_assert_msg(f.sent > 0, "no notice was sent");
	printf("%lld notices sent over %d stops\n", f.sent, FLOOD_ROUNDS);
}
END_TEST

/* --- fixtures and main -------------------------------------------------- */

static void
use_memory(void)
{
	use_redis = false;
}

static void
use_redis_store(void)
{
	use_redis = true;
	h_shared_redis_up();
}

static void
flush_redis(void)
{
	if (use_redis)
		h_shared_redis_flush();
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("admin");
	TCase *tc = tcase_create("access");

	tcase_add_unchecked_fixture(tc, use_memory, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_who_may);
	tcase_add_test(tc, test_no_admin_listen);
	tcase_add_test(tc, test_config_secrets);
	tcase_add_test(tc, test_no_token);
	tcase_add_test(tc, test_head);
	tcase_add_test(tc, test_path_nul);
	tcase_add_test(tc, test_check_errors_placed);
	suite_add_tcase(s, tc);

	tc = tcase_create("memory");
	tcase_add_unchecked_fixture(tc, use_memory, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_counters);
	tcase_add_test(tc, test_key_not_utf8);
	tcase_add_test(tc, test_overrides);
	tcase_add_test(tc, test_override_renew);
	tcase_add_test(tc, test_override_token_bucket);
	tcase_add_test(tc, test_override_limit_bound);
	tcase_add_test(tc, test_override_unknown_field);
	tcase_add_test(tc, test_key_fits_rule);
	tcase_add_test(tc, test_override_field_twice);
	tcase_add_test(tc, test_override_ttl_bounds);
	tcase_add_test(tc, test_override_logged_expiry);
	tcase_add_test(tc, test_reset_serves_lease_waiters);
	tcase_add_test(tc, test_override_removed_rule_memory);
	tcase_add_test(tc, test_override_follows_rule_window);
	suite_add_tcase(s, tc);

	tc = tcase_create("redis");
	tcase_add_unchecked_fixture(tc, use_redis_store, h_reap_orphans);
	tcase_add_checked_fixture(tc, flush_redis, h_test_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_counters);
	tcase_add_test(tc, test_key_not_utf8);
	tcase_add_test(tc, test_overrides);
	tcase_add_test(tc, test_override_renew);
	tcase_add_test(tc, test_reset_serves_lease_waiters);
	tcase_add_test(tc, test_overrides_shared);
	tcase_add_test(tc, test_overrides_without_channel_acl);
	tcase_add_test(tc, test_reset_drops_prefetched);
	tcase_add_test(tc, test_resubscribe_drops_prefetched);
	tcase_add_test(tc, test_reset_drops_chunk_in_flight);
	tcase_add_test(tc, test_resync_despite_notices);
	tcase_add_test(tc, test_override_removed_rule_redis);
	tcase_add_test(tc, test_override_follows_rule_window);
	suite_add_tcase(s, tc);

	/* Hashes of many fields (docs/admin.md, "Where they live"). */
	tc = tcase_create("redis_scale");
	tcase_add_unchecked_fixture(tc, use_redis_store, h_reap_orphans);
	tcase_add_checked_fixture(tc, flush_redis, h_test_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_override_write_touches_one_field);
	tcase_add_test(tc, test_override_expired_dropped_by_read);
	tcase_add_test(tc, test_override_drop_is_conditional);
	tcase_add_test(tc, test_override_undo_is_conditional);
	tcase_add_test(tc, test_override_read_in_pages);
	tcase_add_test(tc, test_overrides_at_start);
	tcase_add_test(tc, test_override_refused_keeps_other);
	tcase_add_test(tc, test_override_undo_failed);
	tcase_add_test(tc, test_override_read_failure_warned);
	tcase_add_test(tc, test_override_rule_back_read_first);
	tcase_add_test(tc, test_override_rule_swap_full_table);
	suite_add_tcase(s, tc);

	/* Daemons stopped under a flood of notices: a case of its own, with
	 * more time. */
	tc = tcase_create("stop");
	tcase_add_unchecked_fixture(tc, use_redis_store, h_reap_orphans);
	tcase_add_checked_fixture(tc, flush_redis, h_test_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_stop_during_notices);
	suite_add_tcase(s, tc);
	test_main_at_end(h_shared_redis_stop);
	return s;
}
