/*
 * check_config.c - unit tests for config.c: the YAML rules file.
 *
 * Most cases load text with config_load_string() under the name "t.yaml"
 * and compare the whole error message, position included, since the
 * "FILE:LINE:COL: message" line is what an operator sees from --check.
 * Files on disk are used only for config_load() itself.  Every test runs in
 * its own process (Check's fork mode), so setenv() and the allocation
 * failure hook never leak from one test into another.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"

#include "core/config.h"

#define X10	  "xxxxxxxxxx"
#define LONG_PATH X10 X10 X10 X10 X10 X10 X10 X10 X10 X10 X10 /* 110 */
#define LONG_HOST LONG_PATH LONG_PATH LONG_PATH		      /* 330 bytes */
#include "core/rules.h"
#include "base/util.h"

#define ERRLEN 512

/* Why a reserved field of the body is never a rule's attribute (without
 * gRPC), or a stat's. */
#define NO_GRPC(f) \
	f " is a reserved field of /acquire and /report, and no gRPC " \
	  "descriptor gives it without grpc_listen"
#define ON_RECORD(f) f " is a reserved field of /record and /stats"

static struct config *
load(const char *text, char *err)
{
	err[0] = '\0';
	return config_load_string("t.yaml", text, strlen(text), err, ERRLEN);
}

/* Load text that must fail, and check the whole message. */
static void
expect_error(const char *text, const char *want)
{
	char err[ERRLEN];
	struct config *c = load(text, err);

	ck_assert_msg(c == NULL, "loaded, wanted: %s\n--- text:\n%s", want,
	    text);
	ck_assert_str_eq(err, want);
}

/* Load text that must fail with a message starting with prefix. */
static void
expect_error_prefix(const char *text, const char *prefix)
{
	char err[ERRLEN];
	struct config *c = load(text, err);

	ck_assert_msg(c == NULL, "loaded, wanted: %s", prefix);
	ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0,
	    "got \"%s\", wanted a message starting \"%s\"", err, prefix);
}

static struct config *
expect_ok(const char *text)
{
	char err[ERRLEN];
	struct config *c = load(text, err);

	ck_assert_msg(c != NULL, "failed: %s\n--- text:\n%s", err, text);
	return c;
}

/* A config using every key, none at its default. */
static const char rich[] =
    "listen: \"unix:/run/ratelimitd.sock\"\n"
    "grpc_listen: \"[::1]:8081\"\n"
    "threads: 16\n"
    "max_body_bytes: 1024\n"
    "shutdown_timeout: 30s\n"
    "log_level: debug\n"
    "log_format: json\n"
    "access_log: true\n"
    "backend: redis\n"
    "backend_required: true\n"
    "redis:\n"
    "  url: \"redis://:pw@redis.local:6380/0\"\n"
    "  cluster: [\"10.0.0.1:7000\", \"10.0.0.2:7001\", \"[::1]:7002\"]\n"
    "  pool_size: 32\n"
    "  timeout: 250ms\n"
    "  key_prefix: \"\"\n"
    "  password_file: /etc/ratelimitd/redis.pass\n"
    "memory:\n"
    "  max_keys: 5000\n"
    "on_backend_error: local\n"
    "auth:\n"
    "  deny_status: 403\n"
    "  client_ip: x-forwarded-for\n"
    "  xff_trusted_hops: 2\n"
    "  ipv6_prefix: 56\n"
    "rules:\n"
    "  - name: login-per-ip\n"
    "    match:\n"
    "      method: POST\n"
    "      path: \"/login*\"\n"
    "      host: \"~^api\\\\.\"\n"
    "    key: \"${ip}:${header.x-user}\"\n"
    "    limit: 5\n"
    "    window: 1m\n"
    "    algorithm: fixed_window\n"
    "    cost: 2\n"
    "    shadow: true\n"
    "  - name: global\n"
    "    limit: \"1000\"\n"
    "    window: 1d\n"
    "    algorithm: token_bucket\n"
    "  - name: v2.window_rule\n"
    "    match: {}\n"
    "    limit: 1000000000\n"
    "    window: 366d\n"
    "    algorithm: sliding_window\n"
    "    cost: 0\n";

/* --- loading ----------------------------------------------------------- */

START_TEST(test_shipped_config)
{
	char path[4096], err[ERRLEN];
	const struct rule *r;
	struct config *c;

	test_srcdir_path("conf/ratelimitd.yaml", path, sizeof(path));
	c = config_load(path, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_str_eq(c->path, path);
	ck_assert_str_eq(c->listen, "127.0.0.1:8080");
	ck_assert_int_eq(c->backend, RL_BACKEND_MEMORY);
	ck_assert_uint_ge(c->nrules, 3);
	ck_assert_uint_le(c->nrules, 4);
	ck_assert_uint_eq(c->nstats, 1);
	ck_assert_ptr_nonnull(config_find_stat(c, "upstream-latency"));

	r = config_find_rule(c, "login-per-ip");
	ck_assert_ptr_nonnull(r);
	ck_assert_ptr_nonnull(r->key);
	ck_assert_uint_eq(r->nmatch, 2);
	r = config_find_rule(c, "api-per-key");
	ck_assert_ptr_nonnull(r);
	ck_assert_str_eq(r->key->source, "${header.x-api-key}");
	r = config_find_rule(c, "global");
	ck_assert_ptr_nonnull(r);
	ck_assert_ptr_null(r->key);
	ck_assert_uint_eq(r->nmatch, 0);
	ck_assert(c->rules[c->nrules - 1].shadow);
	config_unref(c);
}
END_TEST

START_TEST(test_defaults)
{
	static const char *const empties[] = {
		"",
		"\n\n",
		"# nothing but a comment\n",
		"---\n",
		"--- ~\n",
		"null\n",
		"---\n...\n",
	};
	size_t i;

	for (i = 0; i < sizeof(empties) / sizeof(empties[0]); i++) {
		struct config *c = expect_ok(empties[i]);

		ck_assert_str_eq(c->path, "t.yaml");
		ck_assert_str_eq(c->listen, "127.0.0.1:8080");
		ck_assert_ptr_null(c->grpc_listen);
		ck_assert_int_eq(c->threads,
		    sysconf(_SC_NPROCESSORS_ONLN) < 1 ?
			1 :
			sysconf(_SC_NPROCESSORS_ONLN) > 1024 ?
			1024 :
			(int)sysconf(_SC_NPROCESSORS_ONLN));
		ck_assert_int_eq(c->max_body_bytes, 16384);
		ck_assert_int_eq(c->shutdown_timeout_ms, 10000);
		ck_assert_int_eq(c->log_level, LOG_LEVEL_INFO);
		ck_assert_int_eq(c->log_format, RL_LOG_LOGFMT);
		ck_assert(!c->access_log);
		ck_assert_int_eq(c->backend, RL_BACKEND_MEMORY);
		ck_assert(!c->backend_required);
		ck_assert_str_eq(c->redis.url, "redis://127.0.0.1:6379/0");
		ck_assert_ptr_null(c->redis.cluster);
		ck_assert_uint_eq(c->redis.ncluster, 0);
		ck_assert_int_eq(c->redis.pool_size, 8);
		ck_assert_int_eq(c->redis.timeout_ms, 50);
		ck_assert_str_eq(c->redis.key_prefix, "rl:");
		ck_assert_ptr_null(c->redis.password_file);
		ck_assert_int_eq(c->memory.max_keys, 1000000);
		ck_assert_int_eq(c->on_backend_error, RL_ON_ERROR_ALLOW);
		ck_assert_int_eq(c->auth_deny_status, 429);
		ck_assert_int_eq(c->auth_ip.source, CLIENT_IP_AUTO);
		ck_assert_int_eq(c->auth_ip.xff_trusted_hops, 0);
		ck_assert_int_eq(c->auth_ip.ipv6_prefix, 64);
		ck_assert_ptr_null(c->rules);
		ck_assert_uint_eq(c->nrules, 0);
		ck_assert_int_eq(c->refs, 1);
		config_unref(c);
	}
}
END_TEST

/* prefetch: { max_units, hold } lands on the rule; absent, 0. */
START_TEST(test_prefetch)
{
	char err[ERRLEN];
	struct config *c = load(
	    "rules:\n"
	    "  - {name: a, limit: 100, window: 1s,\n"
	    "     prefetch: {max_units: 20, hold: 50ms}}\n"
	    "  - {name: b, limit: 100, window: 1s}\n",
	    err);

	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_int_eq(c->rules[0].prefetch_units, 20);
	ck_assert_int_eq(c->rules[0].prefetch_hold_ms, 50);
	ck_assert_int_eq(c->rules[1].prefetch_units, 0);
	ck_assert_int_eq(c->rules[1].prefetch_hold_ms, 0);
	config_unref(c);
}
END_TEST

START_TEST(test_null_sections)
{
	struct config *c;

	/* A key with nothing after it is an empty section. */
	c = expect_ok("redis:\nmemory: ~\nauth:\nrules:\n");
	ck_assert_uint_eq(c->nrules, 0);
	ck_assert_int_eq(c->redis.pool_size, 8);
	config_unref(c);

	c = expect_ok("rules: []\nredis:\n  cluster: []\n");
	ck_assert_uint_eq(c->nrules, 0);
	ck_assert_uint_eq(c->redis.ncluster, 0);
	ck_assert_ptr_null(c->redis.sentinel.master);
	config_unref(c);

	c = expect_ok(
	    "redis:\n  sentinel:\n    master: mymaster\n"
	    "    nodes: [\"10.0.0.5:26379\", \"[::1]:26380\"]\n"
	    "    password_file: /run/s\n");
	ck_assert_str_eq(c->redis.sentinel.master, "mymaster");
	ck_assert_uint_eq(c->redis.sentinel.nnodes, 2);
	ck_assert_str_eq(c->redis.sentinel.nodes[1], "[::1]:26380");
	ck_assert_str_eq(c->redis.sentinel.password_file, "/run/s");
	config_unref(c);
}
END_TEST

/* redis.tls names its files and where they are named (for --check); a
 * rediss:// URL or a tls section turns TLS on. */
START_TEST(test_redis_tls)
{
	struct config *c;

	c = expect_ok("redis:\n  url: \"redis://h:1\"\n");
	ck_assert(!config_redis_tls_is_on(&c->redis));
	ck_assert(!c->redis.tls.section);
	ck_assert_ptr_null(c->redis.tls.ca_file.path);
	config_unref(c);

	c = expect_ok("redis:\n  url: \"rediss://u:p@h:6380/1\"\n");
	ck_assert(config_redis_tls_is_on(&c->redis));
	ck_assert(!c->redis.tls.section);
	config_unref(c);

	c = expect_ok(
	    "redis:\n  url: \"redis://h:1\"\n  tls:\n"
	    "    ca_file: /etc/ca.pem\n"
	    "    cert_file: \"/etc/c.pem\"\n"
	    "    key_file: /etc/c.key\n"
	    "    server_name: redis.internal\n"
	    "  sentinel:\n    master: m\n    nodes: [\"s:1\"]\n"
	    "    tls: true\n");
	ck_assert(config_redis_tls_is_on(&c->redis));
	ck_assert(c->redis.tls.section);
	ck_assert_str_eq(c->redis.tls.ca_file.path, "/etc/ca.pem");
	ck_assert_int_eq(c->redis.tls.ca_file.line, 4);
	ck_assert_int_eq(c->redis.tls.ca_file.col, 14);
	ck_assert_str_eq(c->redis.tls.cert_file.path, "/etc/c.pem");
	ck_assert_int_eq(c->redis.tls.cert_file.line, 5);
	ck_assert_int_eq(c->redis.tls.cert_file.col, 16);
	ck_assert_str_eq(c->redis.tls.key_file.path, "/etc/c.key");
	ck_assert_int_eq(c->redis.tls.key_file.line, 6);
	ck_assert_str_eq(c->redis.tls.server_name, "redis.internal");
	ck_assert(c->redis.sentinel.tls);
	config_unref(c);

	/* An empty section is TLS with the system's CAs. */
	c = expect_ok("redis:\n  tls: {}\n");
	ck_assert(config_redis_tls_is_on(&c->redis));
	ck_assert_ptr_null(c->redis.tls.ca_file.path);
	config_unref(c);
}
END_TEST

START_TEST(test_every_key)
{
	struct config *c = expect_ok(rich);
	const struct rule *r;

	ck_assert_str_eq(c->listen, "unix:/run/ratelimitd.sock");
	ck_assert_str_eq(c->grpc_listen, "[::1]:8081");
	ck_assert_int_eq(c->threads, 16);
	ck_assert_int_eq(c->max_body_bytes, 1024);
	ck_assert_int_eq(c->shutdown_timeout_ms, 30000);
	ck_assert_int_eq(c->log_level, LOG_LEVEL_DEBUG);
	ck_assert_int_eq(c->log_format, RL_LOG_JSON);
	ck_assert(c->access_log);
	ck_assert_int_eq(c->backend, RL_BACKEND_REDIS);
	ck_assert(c->backend_required);
	ck_assert_str_eq(c->redis.url, "redis://:pw@redis.local:6380/0");
	ck_assert_uint_eq(c->redis.ncluster, 3);
	ck_assert_str_eq(c->redis.cluster[0], "10.0.0.1:7000");
	ck_assert_str_eq(c->redis.cluster[1], "10.0.0.2:7001");
	ck_assert_str_eq(c->redis.cluster[2], "[::1]:7002");
	ck_assert_int_eq(c->redis.pool_size, 32);
	ck_assert_int_eq(c->redis.timeout_ms, 250);
	ck_assert_str_eq(c->redis.key_prefix, "");
	ck_assert_str_eq(c->redis.password_file, "/etc/ratelimitd/redis.pass");
	ck_assert_int_eq(c->memory.max_keys, 5000);
	ck_assert_int_eq(c->on_backend_error, RL_ON_ERROR_LOCAL);
	ck_assert_int_eq(c->auth_deny_status, 403);
	ck_assert_int_eq(c->auth_ip.source, CLIENT_IP_XFF);
	ck_assert_int_eq(c->auth_ip.xff_trusted_hops, 2);
	ck_assert_int_eq(c->auth_ip.ipv6_prefix, 56);
	ck_assert_uint_eq(c->nrules, 3);

	r = &c->rules[0];
	ck_assert_str_eq(r->name, "login-per-ip");
	ck_assert_uint_eq(r->index, 0);
	ck_assert_uint_eq(r->nmatch, 3);
	ck_assert_str_eq(r->match[0].attr, "method");
	ck_assert_int_eq(r->match[0].pattern.kind, PATTERN_EXACT);
	ck_assert_str_eq(r->match[1].attr, "path");
	ck_assert_int_eq(r->match[1].pattern.kind, PATTERN_GLOB);
	ck_assert_str_eq(r->match[2].attr, "host");
	ck_assert_int_eq(r->match[2].pattern.kind, PATTERN_REGEX);
	ck_assert_ptr_nonnull(r->key);
	ck_assert_str_eq(r->key->source, "${ip}:${header.x-user}");
	ck_assert_int_eq(r->limit, 5);
	ck_assert_int_eq(r->window_ms, 60000);
	ck_assert_int_eq(r->algorithm, RL_ALG_FIXED_WINDOW);
	ck_assert_int_eq(r->cost, 2);
	ck_assert(r->shadow);

	r = &c->rules[1];
	ck_assert_str_eq(r->name, "global");
	ck_assert_uint_eq(r->index, 1);
	ck_assert_uint_eq(r->nmatch, 0);
	ck_assert_ptr_null(r->key);
	ck_assert_int_eq(r->limit, 1000); /* a quoted "1000" is fine */
	ck_assert_int_eq(r->window_ms, 86400000);
	ck_assert_int_eq(r->algorithm, RL_ALG_TOKEN_BUCKET);
	ck_assert_int_eq(r->cost, 1); /* the default */
	ck_assert(!r->shadow);

	r = &c->rules[2];
	ck_assert_str_eq(r->name, "v2.window_rule");
	ck_assert_uint_eq(r->index, 2);
	ck_assert_int_eq(r->limit, 1000000000);
	ck_assert_int_eq(r->window_ms, INT64_C(366) * 86400000);
	ck_assert_int_eq(r->algorithm, RL_ALG_SLIDING_WINDOW);
	ck_assert_int_eq(r->cost, 0);
	config_unref(c);
}
END_TEST

START_TEST(test_rule_defaults_and_matching)
{
	struct config *c = expect_ok(
	    "rules:\n"
	    "  - name: login\n"
	    "    match:\n"
	    "      method: POST\n"
	    "      path: \"/login*\"\n"
	    "    key: \"${ip}\"\n"
	    "    limit: 5\n"
	    "    window: 250ms\n");
	const struct rule *r = config_find_rule(c, "login");
	struct attrs a = { 0 };
	char buf[RL_MAX_KEY_BYTES + 1];
	size_t len;

	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->algorithm, RL_ALG_SLIDING_LOG);
	ck_assert_int_eq(r->cost, 1);
	ck_assert(!r->shadow);
	ck_assert_int_eq(r->window_ms, 250);

	/* The compiled patterns and template work as rules.c says. */
	ck_assert_int_eq(attrs_set(&a, "method", "POST"), 0);
	ck_assert_int_eq(attrs_set(&a, "path", "/login/form"), 0);
	ck_assert(rule_matches(r, &a));
	ck_assert_int_eq(template_render(r->key, &a, buf, sizeof(buf), &len),
	    RENDER_MISSING);
	ck_assert_int_eq(attrs_set(&a, "ip", "10.1.2.3"), 0);
	ck_assert_int_eq(template_render(r->key, &a, buf, sizeof(buf), &len),
	    RENDER_OK);
	ck_assert_str_eq(buf, "10.1.2.3");
	ck_assert_int_eq(attrs_set(&a, "method", "GET"), 0);
	ck_assert(!rule_matches(r, &a));
	attrs_clear(&a);
	config_unref(c);
}
END_TEST

/* Rules are found by name through the loader's index, every one of many,
 * and a name given twice is refused at its second place however far
 * apart the two are. */
START_TEST(test_find_many_rules)
{
	enum { N = 3000 };
	size_t cap = N * 48 + 256, len = 0, i;
	char *text = malloc(cap), name[32], want[64];
	struct config *c;

	ck_assert_ptr_nonnull(text);
	len += (size_t)snprintf(text + len, cap - len, "rules:\n");
	for (i = 0; i < N; i++)
		len += (size_t)snprintf(text + len, cap - len,
		    "  - {name: r%zu, limit: 3, window: 1s}\n", i);
	c = expect_ok(text);
	ck_assert_uint_eq(c->nrules, N);
	ck_assert_ptr_nonnull(c->rule_slots);
	ck_assert_uint_ge(c->rule_nslots, 2 * N);
	for (i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "r%zu", i);
		ck_assert_ptr_eq(config_find_rule(c, name), &c->rules[i]);
	}
	ck_assert_ptr_null(config_find_rule(c, "r3000"));
	ck_assert_ptr_null(config_find_rule(c, "r"));
	ck_assert_ptr_null(config_find_rule(c, ""));
	config_unref(c);

	/* The first rule again, as the last. */
	snprintf(text + len, cap - len,
	    "  - {name: r0, limit: 3, window: 1s}\n");
	snprintf(want, sizeof(want), "t.yaml:%d:12: duplicate rule name \"r0\"",
	    N + 2);
	expect_error(text, want);
	free(text);
}
END_TEST

START_TEST(test_find_and_names)
{
	struct config *c = expect_ok(rich);

	ck_assert_ptr_eq(config_find_rule(c, "global"), &c->rules[1]);
	ck_assert_ptr_eq(config_find_rule(c, "login-per-ip"), &c->rules[0]);
	ck_assert_ptr_null(config_find_rule(c, "nope"));
	ck_assert_ptr_null(config_find_rule(c, ""));
	ck_assert_ptr_null(config_find_rule(c, NULL));
	ck_assert_ptr_null(config_find_rule(NULL, "global"));
	config_unref(c);

	ck_assert_str_eq(config_backend_name(RL_BACKEND_MEMORY), "memory");
	ck_assert_str_eq(config_backend_name(RL_BACKEND_REDIS), "redis");
	ck_assert_str_eq(config_on_error_name(RL_ON_ERROR_ALLOW), "allow");
	ck_assert_str_eq(config_on_error_name(RL_ON_ERROR_DENY), "deny");
	ck_assert_str_eq(config_on_error_name(RL_ON_ERROR_LOCAL), "local");
}
END_TEST

START_TEST(test_aliases)
{
	/* Anchors and aliases are plain YAML; they resolve to the value. */
	struct config *c = expect_ok(
	    "threads: &n 8\n"
	    "redis:\n"
	    "  pool_size: *n\n"
	    "rules:\n"
	    "  - &base {name: a, limit: 3, window: 1s}\n"
	    "  - {name: b, limit: 3, window: 1s}\n");

	ck_assert_int_eq(c->threads, 8);
	ck_assert_int_eq(c->redis.pool_size, 8);
	ck_assert_uint_eq(c->nrules, 2);
	config_unref(c);

	/* The same rule twice through an alias is a duplicate name. */
	expect_error(
	    "rules:\n"
	    "  - &r {name: a, limit: 3, window: 1s}\n"
	    "  - *r\n",
	    "t.yaml:2:15: duplicate rule name \"a\"");
}
END_TEST

/* --- errors ------------------------------------------------------------ */

/* clang-format off */
/* Each case: the text, then the whole expected message. */
static const struct {
	const char *text;
	const char *want;
} error_cases[] = {
	/* unknown keys */
	{ "listen: \"x:1\"\nlimt: 5\n",
	  "t.yaml:2:1: unknown key \"limt\"" },
	{ "rules:\n  - name: a\n    limt: 5\n",
	  "t.yaml:3:5: unknown key \"limt\" in rule" },
	{ "redis:\n  urll: x\n",
	  "t.yaml:2:3: unknown key \"urll\" in redis" },
	{ "memory:\n  keys: 5\n",
	  "t.yaml:2:3: unknown key \"keys\" in memory" },
	{ "auth:\n  status: 403\n",
	  "t.yaml:2:3: unknown key \"status\" in auth" },
	{ "\"thr\\neads\": 5\n",
	  "t.yaml:1:1: unknown key \"thr\\x0aeads\"" },
	{ "\"threads\\0x\": 5\n",
	  "t.yaml:1:1: expected a key name" },
	{ "[a]: 5\n",
	  "t.yaml:1:1: expected a key name" },
	{ "~: 5\n",
	  "t.yaml:1:1: expected a key name" },

	/* wrong node types */
	{ "hello\n",
	  "t.yaml:1:1: expected a mapping of settings at the top level" },
	{ "- a\n- b\n",
	  "t.yaml:1:1: expected a mapping of settings at the top level" },
	{ "threads: [1]\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "listen: {host: a}\n",
	  "t.yaml:1:9: listen: expected a string" },
	{ "listen:\n",
	  "t.yaml:1:8: listen: expected a string" },
	{ "listen: \"\"\n",
	  "t.yaml:1:9: listen: must not be empty" },
	/* What start-up would refuse or misread, refused here. */
	{ "listen: \"127.0.0.1:99999\"\n",
	  "t.yaml:1:9: listen: \"127.0.0.1:99999\": the port must be a number "
	  "from 1 to 65535" },
	{ "listen: \"127.0.0.1:0\"\n",
	  "t.yaml:1:9: listen: \"127.0.0.1:0\": the port must be a number "
	  "from 1 to 65535" },
	{ "listen: \"127.0.0.1:http\"\n",
	  "t.yaml:1:9: listen: \"127.0.0.1:http\": the port must be a number "
	  "from 1 to 65535" },
	{ "listen: \"::1:8080\"\n",
	  "t.yaml:1:9: listen: \"::1:8080\": expected host:port, [v6]:port or "
	  "unix:/path" },
	{ "listen: \"unix:/" LONG_PATH "\"\n",
	  "t.yaml:1:9: listen: unix socket path longer than 107 bytes" },
	{ "listen: \"" LONG_HOST ":80\"\n",
	  "t.yaml:1:9: listen: host name longer than 255 bytes" },
	{ "grpc_listen: \"127.0.0.1:0\"\n",
	  "t.yaml:1:14: grpc_listen: \"127.0.0.1:0\": the port must be a "
	  "number from 1 to 65535" },
	{ "grpc_listen: \"\"\n",
	  "t.yaml:1:14: grpc_listen: must not be empty" },

	/* two listeners on one address: start-up could not bind both */
	{ "listen: \"127.0.0.1:8090\"\nadmin_listen: \"127.0.0.1:8090\"\n",
	  "t.yaml:2:15: admin_listen: \"127.0.0.1:8090\" shares its address "
	  "with listen \"127.0.0.1:8090\"; each needs an address of its own" },
	{ "admin_listen: \"127.0.0.1:8080\"\n",
	  "t.yaml:1:15: admin_listen: \"127.0.0.1:8080\" shares its address "
	  "with listen \"127.0.0.1:8080\" (its default); each needs an "
	  "address of its own" },
	{ "grpc_listen: \"127.0.0.1:8090\"\nlisten: \"127.0.0.1:8090\"\n",
	  "t.yaml:2:9: listen: \"127.0.0.1:8090\" shares its address with "
	  "grpc_listen \"127.0.0.1:8090\"; each needs an address of its own" },
	{ "listen: \"unix:/run/rl.sock\"\ngrpc_listen: \"unix:/run/g.sock\"\n"
	  "admin_listen: \"unix:/run/g.sock\"\n",
	  "t.yaml:3:15: admin_listen: \"unix:/run/g.sock\" shares its address "
	  "with grpc_listen \"unix:/run/g.sock\"; each needs an address of "
	  "its own" },
	{ "listen: \"0.0.0.0:8090\"\ngrpc_listen: \"127.0.0.1:8090\"\n",
	  "t.yaml:2:14: grpc_listen: \"127.0.0.1:8090\" shares its address "
	  "with listen \"0.0.0.0:8090\"; each needs an address of its own" },
	{ "listen: \"[::1]:8090\"\nadmin_listen: \"[0:0::1]:8090\"\n",
	  "t.yaml:2:15: admin_listen: \"[0:0::1]:8090\" shares its address "
	  "with listen \"[::1]:8090\"; each needs an address of its own" },
	{ "listen: \"Localhost:8090\"\nadmin_listen: \"localhost:8090\"\n",
	  "t.yaml:2:15: admin_listen: \"localhost:8090\" shares its address "
	  "with listen \"Localhost:8090\"; each needs an address of its own" },
	{ "listen_mode: \"0999\"\n",
	  "t.yaml:1:14: listen_mode: expected an octal file mode such as "
	  "\"0660\"" },
	{ "max_connections: 0\n",
	  "t.yaml:1:18: max_connections: expected an integer from 1 to "
	  "1000000" },
	{ "max_attributes: 5000\n",
	  "t.yaml:1:17: max_attributes: expected an integer from 1 to 4096" },
	{ "max_header_bytes: 100\n",
	  "t.yaml:1:19: max_header_bytes: expected an integer from 1024 to "
	  "1048576" },
	{ "idle_timeout: 10ms\n",
	  "t.yaml:1:15: idle_timeout: expected a duration from 1s to 1d" },
	{ "rules:\n  - name: r\n    match: {path: \"~a{1000}{1000}{1000}\"}\n"
	  "    limit: 1\n    window: 1s\n",
	  "t.yaml:3:19: regex \"a{1000}{1000}{1000}\" is too large once its "
	  "repetitions are expanded (more than 20000 states, or 500 "
	  "optional ones)" },
	/* Found by fuzzing: 14 nested loops, minutes in regcomp. */
	{ "rules:\n  - name: r\n    match: {path: \"~x*+++++++++++++\"}\n"
	  "    limit: 1\n    window: 1s\n",
	  "t.yaml:3:19: regex \"x*+++++++++++++\" is too large once its "
	  "repetitions are expanded (more than 20000 states, or 500 "
	  "optional ones)" },
	{ "rules:\n  - name: r\n    match: {path: \"~((((a*)*)*)*)*\"}\n"
	  "    limit: 1\n    window: 1s\n",
	  "t.yaml:3:19: regex \"((((a*)*)*)*)*\" is too large once its "
	  "repetitions are expanded (more than 20000 states, or 500 "
	  "optional ones)" },
	{ "rules:\n  - name: r\n    match: {path: \"~(a+)\\\\1\"}\n"
	  "    limit: 1\n    window: 1s\n",
	  "t.yaml:3:19: regex \"(a+)\\\\1\": back-references are not "
	  "allowed" },
	{ "listen: \"a\\0b\"\n",
	  "t.yaml:1:9: listen: contains a NUL byte" },
	{ "redis: 5\n",
	  "t.yaml:1:8: redis: expected a mapping" },
	{ "redis: [a]\n",
	  "t.yaml:1:8: redis: expected a mapping" },
	{ "rules: {}\n",
	  "t.yaml:1:8: rules: expected a sequence of rules" },
	{ "rules: login\n",
	  "t.yaml:1:8: rules: expected a sequence of rules" },
	{ "rules:\n  - 5\n",
	  "t.yaml:2:5: rules: each rule must be a mapping" },
	{ "rules:\n  - [name, a]\n",
	  "t.yaml:2:5: rules: each rule must be a mapping" },
	{ "rules:\n  - name: [a]\n",
	  "t.yaml:2:11: name: expected a string" },
	{ "rules:\n  - name: a\n    limit: 1\n    window: 1s\n"
	  "    match: [path]\n",
	  "t.yaml:5:12: match: expected a mapping of attribute: pattern" },
	{ "rules:\n  - name: a\n    limit: 1\n    window: 1s\n"
	  "    match:\n      path: [a]\n",
	  "t.yaml:6:13: match.path: expected a pattern string" },
	{ "rules:\n  - name: a\n    limit: 1\n    window: 1s\n"
	  "    match:\n      path:\n",
	  "t.yaml:6:12: match.path: expected a pattern string" },
	{ "rules:\n  - name: a\n    limit: 1\n    window: 1s\n"
	  "    key: {a: b}\n",
	  "t.yaml:5:10: key: expected a string" },
	{ "redis:\n  cluster: \"a:1\"\n",
	  "t.yaml:2:12: redis.cluster: expected a sequence of \"host:port\" "
	  "strings" },
	{ "redis:\n  cluster: [[a]]\n",
	  "t.yaml:2:13: redis.cluster: expected a sequence of \"host:port\" "
	  "strings" },
	{ "redis:\n  cluster: [\"a:1\"]\n  sentinel:\n    master: m\n"
	  "    nodes: [\"s:26379\"]\n",
	  "t.yaml:2:3: redis: set redis.cluster or redis.sentinel, not both" },
	{ "redis:\n  cluster: [\"a:1\"]\n  url: \"redis://h/3\"\n",
	  "t.yaml:2:3: redis: Redis Cluster has only db 0 and TCP nodes; "
	  "redis.url may give credentials only" },
	/* docs/configuration.md: an empty hash tag at the prefix's first
	 * '{' would make Redis Cluster hash each key's whole name. */
	{ "redis:\n  cluster: [\"a:1\"]\n  key_prefix: \"app{}:\"\n",
	  "t.yaml:3:15: redis.key_prefix: must not hold \"{}\" at its first "
	  "'{' with redis.cluster: Redis Cluster would hash each key's whole "
	  "name instead of its tag" },
	{ "redis:\n  key_prefix: \"{}app{x}:\"\n  cluster: [\"a:1\"]\n",
	  "t.yaml:2:15: redis.key_prefix: must not hold \"{}\" at its first "
	  "'{' with redis.cluster: Redis Cluster would hash each key's whole "
	  "name instead of its tag" },
	{ "redis:\n  sentinel:\n    master: m\n",
	  "t.yaml:3:5: redis.sentinel: needs master and at least one of "
	  "nodes" },
	{ "redis:\n  sentinel:\n    nodes: [\"s:1\"]\n",
	  "t.yaml:3:5: redis.sentinel: needs master and at least one of "
	  "nodes" },
	{ "redis:\n  sentinel:\n    master: m\n    nodes: [\"s\"]\n",
	  "t.yaml:4:13: redis.sentinel.nodes: expected \"host:port\", got "
	  "\"s\"" },
	{ "redis:\n  sentinel:\n    master: m\n    nodes: [\"s:1\"]\n"
	  "    port: 1\n",
	  "t.yaml:5:5: unknown key \"port\" in redis.sentinel" },
	{ "redis:\n  sentinel:\n    master: m\n    nodes: [\"s:1\"]\n"
	  "    tls: yes\n",
	  "t.yaml:5:10: redis.sentinel.tls: expected true or false" },

	/* redis.tls */
	{ "redis:\n  tls:\n    ca: /x\n",
	  "t.yaml:3:5: unknown key \"ca\" in redis.tls" },
	{ "redis:\n  tls: true\n",
	  "t.yaml:2:8: redis.tls: expected a mapping" },
	{ "redis:\n  tls:\n    ca_file: \"\"\n",
	  "t.yaml:3:14: redis.tls.ca_file: must not be empty" },
	{ "redis:\n  tls:\n    cert_file: /c.pem\n",
	  "t.yaml:3:5: redis.tls: cert_file and key_file go together" },
	{ "redis:\n  tls:\n    key_file: /k.pem\n",
	  "t.yaml:3:5: redis.tls: cert_file and key_file go together" },
	{ "redis:\n  url: \"unix:///r.sock\"\n  tls:\n    ca_file: /a\n",
	  "t.yaml:2:3: redis: TLS needs a TCP address (rediss://host:port); "
	  "Redis does not encrypt unix sockets" },

	/* integers */
	{ "threads: four\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "threads: 4.0\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "threads: 0x10\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "threads: \" 4\"\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "threads: 0\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "threads: 1025\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "threads: 99999999999999999999\n",
	  "t.yaml:1:10: threads: expected an integer from 1 to 1024" },
	{ "max_body_bytes: 67108865\n",
	  "t.yaml:1:17: max_body_bytes: expected an integer from 1 to "
	  "67108864" },
	{ "redis:\n  pool_size: 0\n",
	  "t.yaml:2:14: redis.pool_size: expected an integer from 1 to 1024" },
	{ "memory:\n  max_keys: 0\n",
	  "t.yaml:2:13: memory.max_keys: expected an integer of at least 1" },
	{ "auth:\n  deny_status: 200\n",
	  "t.yaml:2:16: auth.deny_status: expected an integer from 400 to "
	  "599" },
	{ "auth:\n  deny_status: 600\n",
	  "t.yaml:2:16: auth.deny_status: expected an integer from 400 to "
	  "599" },
	{ "auth:\n  client_ip: first\n",
	  "t.yaml:2:14: auth.client_ip: expected auto, x-real-ip, "
	  "x-forwarded-for or peer" },
	{ "auth:\n  xff_trusted_hops: -1\n",
	  "t.yaml:2:21: auth.xff_trusted_hops: expected an integer from 0 "
	  "to 64" },
	{ "auth:\n  ipv6_prefix: 0\n",
	  "t.yaml:2:16: auth.ipv6_prefix: expected an integer from 1 to "
	  "128" },
	{ "auth:\n  ipv6_prefix: 129\n",
	  "t.yaml:2:16: auth.ipv6_prefix: expected an integer from 1 to "
	  "128" },
	{ "rules:\n  - name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n    limit: 1\n    window: 1s\n",
	  "t.yaml:2:11: rule name \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...\" is longer than 128 bytes" },
	{ "rules:\n  - name: a\n    algorithm: token_bucket\n"
	  "    limit: 1001\n    window: 1ms\n",
	  "t.yaml:4:12: limit: token_bucket needs at least 1us of window "
	  "per unit (limit <= 1000 for this window)" },
	{ "rules:\n  - name: a\n    limit: 0\n    window: 1s\n",
	  "t.yaml:3:12: limit: expected an integer from 1 to 1000000000" },
	{ "rules:\n  - name: a\n    limit: -5\n    window: 1s\n",
	  "t.yaml:3:12: limit: expected an integer from 1 to 1000000000" },
	{ "rules:\n  - name: a\n    limit: 1000000001\n    window: 1s\n",
	  "t.yaml:3:12: limit: expected an integer from 1 to 1000000000" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n    cost: -1\n",
	  "t.yaml:5:11: cost: expected an integer from 0 to 1000000000" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n    cost: 6\n",
	  "t.yaml:5:11: cost: 6 is larger than limit 5" },

	/* durations */
	{ "shutdown_timeout: 10 s\n",
	  "t.yaml:1:19: shutdown_timeout: expected a duration such as 250ms, "
	  "10s, 1m, 1h or 1d" },
	{ "shutdown_timeout: 1.5s\n",
	  "t.yaml:1:19: shutdown_timeout: expected a duration such as 250ms, "
	  "10s, 1m, 1h or 1d" },
	{ "shutdown_timeout: -1s\n",
	  "t.yaml:1:19: shutdown_timeout: expected a duration such as 250ms, "
	  "10s, 1m, 1h or 1d" },
	{ "shutdown_timeout: 10sec\n",
	  "t.yaml:1:19: shutdown_timeout: expected a duration such as 250ms, "
	  "10s, 1m, 1h or 1d" },
	{ "shutdown_timeout: 10\n",
	  "t.yaml:1:19: shutdown_timeout: \"10\" has no unit; add one of ms, "
	  "s, m, h or d (e.g. 10s)" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 60\n",
	  "t.yaml:4:13: window: \"60\" has no unit; add one of ms, s, m, h or "
	  "d (e.g. 60s)" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: \"60\"\n",
	  "t.yaml:4:13: window: \"60\" has no unit; add one of ms, s, m, h or "
	  "d (e.g. 60s)" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 0ms\n",
	  "t.yaml:4:13: window: expected a duration from 1ms to 366d" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 367d\n",
	  "t.yaml:4:13: window: expected a duration from 1ms to 366d" },
	{ "redis:\n  timeout: 0s\n",
	  "t.yaml:2:12: redis.timeout: expected a duration from 1ms to 1d" },

	/* booleans and enumerations */
	{ "access_log: yes\n",
	  "t.yaml:1:13: access_log: expected true or false" },
	{ "backend_required: 1\n",
	  "t.yaml:1:19: backend_required: expected true or false" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    shadow: True\n",
	  "t.yaml:5:13: shadow: expected true or false" },
	{ "log_level: verbose\n",
	  "t.yaml:1:12: log_level: expected debug, info, warn or error" },
	{ "log_level: INFO\n",
	  "t.yaml:1:12: log_level: expected debug, info, warn or error" },
	{ "log_format: text\n",
	  "t.yaml:1:13: log_format: expected logfmt or json" },
	{ "backend: etcd\n",
	  "t.yaml:1:10: backend: expected memory or redis" },
	{ "on_backend_error: maybe\n",
	  "t.yaml:1:19: on_backend_error: expected allow, deny or local" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    algorithm: leaky_bucket\n",
	  "t.yaml:5:16: algorithm: expected sliding_log, sliding_window, "
	  "fixed_window, token_bucket or concurrency" },

	/* stats */
	{ "stats:\n  - name: lat\n    window: 1m\n"
	  "  - name: lat\n    window: 1s\n",
	  "t.yaml:4:11: duplicate stat name \"lat\"" },
	{ "rules:\n  - {name: lat, limit: 1, window: 1s}\n"
	  "stats:\n  - {name: lat, window: 1s}\n",
	  "t.yaml:4:12: stat name \"lat\" is the name of a rule" },
	{ "stats:\n  - {name: lat, window: 1s}\n"
	  "rules:\n  - {name: lat, limit: 1, window: 1s}\n",
	  "t.yaml:4:12: rule name \"lat\" is the name of a stat" },
	{ "stats:\n  - {name: lat}\n",
	  "t.yaml:2:5: stat \"lat\" is missing \"window\"" },
	{ "stats:\n  - {window: 1s}\n",
	  "t.yaml:2:5: stat is missing \"name\"" },
	{ "stats:\n  - {name: lat, window: 1s, resolution: 2s}\n",
	  "t.yaml:2:41: stat \"lat\": resolution must be between 1ms and "
	  "the window" },
	{ "stats:\n  - {name: lat, window: 1h, resolution: 1ms}\n",
	  "t.yaml:2:41: stat \"lat\": window / resolution must be at most "
	  "1000" },
	{ "stats:\n  - {name: lat, window: 1s, relative_accuracy: 0.5}\n",
	  "t.yaml:2:48: relative_accuracy: expected a number from 0.0001 "
	  "to 0.1" },
	{ "stats:\n  - {name: lat, window: 1s, relative_accuracy: x}\n",
	  "t.yaml:2:48: relative_accuracy: expected a number from 0.0001 "
	  "to 0.1" },
	{ "stats:\n  - {name: lat, window: 1s, limit: 3}\n",
	  "t.yaml:2:29: unknown key \"limit\" in stat" },
	{ "stats: {name: lat}\n",
	  "t.yaml:1:8: stats: expected a sequence of stats" },

	/* prefetch (docs/algorithms.md, "Taking quota in advance") */
	{ "rules:\n  - name: c\n    limit: 5\n    window: 1s\n"
	  "    algorithm: concurrency\n"
	  "    prefetch: {max_units: 2, hold: 10ms}\n",
	  "t.yaml:6:15: prefetch: not for a concurrency rule (its units are "
	  "leases)" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    prefetch: {max_units: 2}\n",
	  "t.yaml:5:15: prefetch: needs both \"max_units\" and \"hold\"" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    prefetch: {max_units: 0, hold: 1ms}\n",
	  "t.yaml:5:27: prefetch.max_units: expected an integer from 1 to "
	  "1000000000" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    prefetch: {max_units: 2, hold: 2m}\n",
	  "t.yaml:5:36: prefetch.hold: expected a duration from 1ms to 1m" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    prefetch: {max_units: 2, hold: 1ms, share: 3}\n",
	  "t.yaml:5:41: unknown key \"share\" in prefetch" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    prefetch: 5\n",
	  "t.yaml:5:15: prefetch: expected a mapping { max_units, hold }" },

	/* rules */
	{ "rules:\n  - name: login\n    limit: 5\n    window: 1s\n"
	  "  - name: other\n    limit: 5\n    window: 1s\n"
	  "  - name: login\n    limit: 9\n    window: 1s\n",
	  "t.yaml:8:11: duplicate rule name \"login\"" },
	{ "rules:\n  - name: \"log in\"\n    limit: 5\n    window: 1s\n",
	  "t.yaml:2:11: bad rule name \"log in\": use letters, digits, '_', "
	  "'.' and '-'" },
	{ "rules:\n  - name: \"a/b\"\n",
	  "t.yaml:2:11: bad rule name \"a/b\": use letters, digits, '_', '.' "
	  "and '-'" },
	{ "rules:\n  - name: \"\"\n",
	  "t.yaml:2:11: bad rule name \"\": use letters, digits, '_', '.' "
	  "and '-'" },
	{ "rules:\n  - limit: 5\n    window: 1s\n",
	  "t.yaml:2:5: rule is missing \"name\"" },
	{ "rules:\n  - name: a\n    window: 1s\n",
	  "t.yaml:2:5: rule \"a\" is missing \"limit\"" },
	{ "rules:\n  - name: a\n    limit: 5\n",
	  "t.yaml:2:5: rule \"a\" is missing \"window\"" },
	{ "rules:\n  - {}\n",
	  "t.yaml:2:5: rule is missing \"name\"" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    key: \"${ip\"\n",
	  "t.yaml:5:10: key template \"${ip\": unterminated \"${\"" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    key: \"${}\"\n",
	  "t.yaml:5:10: key template \"${}\": empty attribute name" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    key: \"\"\n",
	  "t.yaml:5:10: key: must not be empty (leave it out for one counter "
	  "per rule)" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    key: \"${header.X-Api-Key}\"\n",
	  "t.yaml:5:10: key: attribute \"header.X-Api-Key\" is never present: "
	  "header names are lower-case" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    match:\n      header.User-Agent: \"curl*\"\n",
	  "t.yaml:6:7: match: attribute \"header.User-Agent\" is never "
	  "present: header names are lower-case" },
	/* the reserved fields of a body are never attributes */
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    match:\n      path: /a\n      cost: \"*\"\n",
	  "t.yaml:7:7: match: attribute \"cost\" is never present: " NO_GRPC("cost") },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    match: { rule: a }\n",
	  "t.yaml:5:14: match: attribute \"rule\" is never present: " NO_GRPC("rule") },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    match:\n      wait_ms: \"~.\"\n",
	  "t.yaml:6:7: match: attribute \"wait_ms\" is never present: "
	  NO_GRPC("wait_ms") },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    key: \"${cost}\"\n",
	  "t.yaml:5:10: key: attribute \"cost\" is never present: " NO_GRPC("cost") },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    key: \"${ip}:${rule}\"\n",
	  "t.yaml:5:10: key: attribute \"rule\" is never present: " NO_GRPC("rule") },
	{ "rules:\n  - name: a\n    key: \"w$$${wait_ms}\"\n    limit: 5\n"
	  "    window: 1s\n",
	  "t.yaml:3:10: key: attribute \"wait_ms\" is never present: "
	  NO_GRPC("wait_ms") },
	{ "stats:\n  - name: s\n    window: 1s\n"
	  "    match:\n      value: \"*\"\n",
	  "t.yaml:5:7: match: attribute \"value\" is never present: "
	  ON_RECORD("value") },
	{ "stats:\n  - name: s\n    window: 1s\n    match: { stat: s }\n",
	  "t.yaml:4:14: match: attribute \"stat\" is never present: "
	  ON_RECORD("stat") },
	/* gRPC brings no attribute to a stat */
	{ "grpc_listen: \"127.0.0.1:8081\"\nstats:\n  - name: s\n"
	  "    window: 1s\n    match: { quantiles: \"*\" }\n",
	  "t.yaml:5:14: match: attribute \"quantiles\" is never present: "
	  ON_RECORD("quantiles") },
	{ "stats:\n  - name: s\n    window: 1s\n    key: \"${value}\"\n",
	  "t.yaml:4:10: key: attribute \"value\" is never present: "
	  ON_RECORD("value") },
	{ "stats:\n  - name: s\n    window: 1s\n    key: \"${upstream}${stat}\"\n",
	  "t.yaml:4:10: key: attribute \"stat\" is never present: "
	  ON_RECORD("stat") },
	{ "stats:\n  - name: s\n    window: 1s\n    key: \"q:${quantiles}\"\n",
	  "t.yaml:4:10: key: attribute \"quantiles\" is never present: "
	  ON_RECORD("quantiles") },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    match:\n      \"a b\": x\n",
	  "t.yaml:6:7: match: bad attribute name \"a b\"" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    match:\n      ~: x\n",
	  "t.yaml:6:7: expected a key name in match" },
	{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	  "    match:\n      path: /a\n      path: /b\n",
	  "t.yaml:7:7: duplicate key \"path\" in match" },

	/* duplicate keys */
	{ "threads: 2\nthreads: 3\n",
	  "t.yaml:2:1: duplicate key \"threads\"" },
	{ "redis:\n  pool_size: 2\n  pool_size: 3\n",
	  "t.yaml:3:3: duplicate key \"pool_size\" in redis" },
	{ "rules:\n  - name: a\n    limit: 5\n    limit: 6\n",
	  "t.yaml:4:5: duplicate key \"limit\" in rule" },
	{ "{threads: 2, threads: 2}\n",
	  "t.yaml:1:14: duplicate key \"threads\"" },

	/* cluster seeds and the Redis URL */
	{ "redis:\n  cluster: [\"10.0.0.1\"]\n",
	  "t.yaml:2:13: redis.cluster: expected \"host:port\", got "
	  "\"10.0.0.1\"" },
	{ "redis:\n  cluster: [\":7000\"]\n",
	  "t.yaml:2:13: redis.cluster: expected \"host:port\", got \":7000\"" },
	{ "redis:\n  cluster: [\"a:1\", \"b:70000\"]\n",
	  "t.yaml:2:20: redis.cluster: expected \"host:port\", got "
	  "\"b:70000\"" },
	{ "redis:\n  password_file: \"\"\n",
	  "t.yaml:2:18: redis.password_file: must not be empty" },

	/* documents */
	{ "threads: 2\n---\nthreads: 3\n",
	  "t.yaml:3:1: only one YAML document is allowed" },
};
/* clang-format on */

START_TEST(test_stats)
{
	struct config *c = expect_ok(
	    "stats:\n"
	    "  - name: upstream-latency\n"
	    "    match: { path: \"/api/*\" }\n"
	    "    key: \"${upstream}\"\n"
	    "    window: 1m\n"
	    "    resolution: 3s\n"
	    "    relative_accuracy: 0.001\n"
	    "  - name: sizes\n"
	    "    window: 10s\n");
	const struct stat_def *sd;

	ck_assert_uint_eq(c->nstats, 2);
	ck_assert_uint_eq(c->nrules, 0);
	sd = config_find_stat(c, "upstream-latency");
	ck_assert_ptr_nonnull(sd);
	ck_assert_int_eq(sd->rule.window_ms, 60000);
	ck_assert_int_eq(sd->resolution_ms, 3000);
	ck_assert(sd->accuracy == 0.001);
	ck_assert_uint_eq(sd->rule.nmatch, 1);
	ck_assert_ptr_nonnull(sd->rule.key);
	/* Defaults: resolution window / 20, accuracy 0.01, no key. */
	sd = config_find_stat(c, "sizes");
	ck_assert_int_eq(sd->resolution_ms, 500);
	ck_assert(sd->accuracy == 0.01);
	ck_assert_ptr_null(sd->rule.key);
	ck_assert_ptr_null(config_find_stat(c, "nope"));
	ck_assert_ptr_null(config_find_rule(c, "sizes"));
	config_unref(c);
}
END_TEST

/* Names near the reserved ones are attributes; each endpoint's reserved
 * fields are the other's attributes; and with grpc_listen, given after the
 * rules or before, a descriptor entry may be named as /acquire's reserved
 * fields are (docs/grpc.md), so a rule may match and key on them. */
START_TEST(test_reserved_near_names)
{
	struct config *c = expect_ok(
	    "rules:\n"
	    "  - name: near\n"
	    "    match: { costs: \"*\", rule_id: \"*\", wait: \"*\",\n"
	    "             value: \"*\", stat: \"*\", quantiles: \"*\" }\n"
	    "    key: \"${costs}:${rule_id}:${wait_ms_max}:${header.cost}\"\n"
	    "    limit: 5\n"
	    "    window: 1s\n"
	    "stats:\n"
	    "  - name: s\n"
	    "    match: { values: \"*\", stat_id: \"*\", quantile: \"*\",\n"
	    "             cost: \"*\", rule: \"*\", wait_ms: \"*\" }\n"
	    "    key: \"${cost}:${rule}:${wait_ms}:${values}\"\n"
	    "    window: 1s\n");

	ck_assert_uint_eq(c->nrules, 1);
	ck_assert_uint_eq(c->rules[0].nmatch, 6);
	ck_assert_uint_eq(c->nstats, 1);
	ck_assert_uint_eq(c->stats[0].rule.nmatch, 6);
	config_unref(c);

	c = expect_ok(
	    "rules:\n"
	    "  - name: g\n"
	    "    match: { cost: \"*\", rule: \"*\" }\n"
	    "    key: \"${wait_ms}\"\n"
	    "    limit: 5\n"
	    "    window: 1s\n"
	    "grpc_listen: \"127.0.0.1:8081\"\n");
	ck_assert_uint_eq(c->rules[0].nmatch, 2);
	config_unref(c);
	c = expect_ok(
	    "grpc_listen: \"unix:/run/g.sock\"\n"
	    "rules:\n"
	    "  - name: g\n"
	    "    match: { wait_ms: \"*\" }\n"
	    "    limit: 5\n"
	    "    window: 1s\n");
	config_unref(c);
}
END_TEST

/* Listeners apart: another port, another family (an IPv6 socket takes
 * IPv6 only), another unix path. */
START_TEST(test_listeners_apart)
{
	config_unref(
	    expect_ok("listen: \"127.0.0.1:8080\"\n"
		      "grpc_listen: \"127.0.0.1:8081\"\n"
		      "admin_listen: \"127.0.0.2:8080\"\n"));
	config_unref(
	    expect_ok("listen: \"0.0.0.0:8080\"\n"
		      "grpc_listen: \"[::]:8080\"\n"
		      "admin_listen: \"[::1]:8081\"\n"));
	config_unref(
	    expect_ok("listen: \"unix:/run/a.sock\"\n"
		      "grpc_listen: \"unix:/run/b.sock\"\n"
		      "admin_listen: \"127.0.0.1:8080\"\n"));
}
END_TEST

START_TEST(test_errors)
{
	expect_error(error_cases[_i].text, error_cases[_i].want);
}
END_TEST

/* Messages that quote other modules' or libraries' text: check the
 * position and our part only. */
START_TEST(test_error_prefixes)
{
	/* A bad regex, with regerror's text after it. */
	expect_error_prefix(
	    "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
	    "    match:\n      path: \"~(\"\n",
	    "t.yaml:6:13: bad regex \"(\": ");
	/* YAML syntax errors come from libyaml, at its problem mark. */
	expect_error_prefix("a: b: c\n",
	    "t.yaml:1:5: mapping values are not allowed");
	expect_error_prefix("threads: [1, 2\n", "t.yaml:2:1: ");
	expect_error_prefix("listen: 'abc\n",
	    "t.yaml:2:1: found unexpected "
	    "end of stream");
	expect_error_prefix("rules:\n  - name: a\n   limit: 5\n",
	    "t.yaml:3:4: ");
	expect_error_prefix("threads: *nope\n", "t.yaml:1:10: ");
	/* Bad UTF-8 is placed by counting lines up to its offset. */
	expect_error_prefix("threads: 2\nlisten: \"\xff\"\n",
	    "t.yaml:2:10: invalid");
	/* A syntax error in a later document still wins. */
	expect_error_prefix("threads: 2\n---\n: : :\n[\n", "t.yaml:");
	/* The URL is checked now, and its password never shown. */
	expect_error_prefix("redis:\n  url: \"redis://u:secret@h:99999\"\n",
	    "t.yaml:2:8: redis.url: ");
	{
		char err[ERRLEN];

		ck_assert_ptr_null(
		    load("redis:\n  url: \"redis://u:secret@h:"
			 "99999\"\n",
			err));
		ck_assert_ptr_null(strstr(err, "secret"));
		ck_assert_ptr_null(
		    load("redis:\n  url: \"redis://u:secretpw\"\n", err));
		ck_assert_msg(strstr(err, "secretpw") == NULL, "leak: %s", err);
		ck_assert_ptr_null(load("redis:\n  url: \"http://h\"\n", err));
		ck_assert_msg(strncmp(err, "t.yaml:2:8: redis.url: ", 23) == 0,
		    "%s", err);
	}
}
END_TEST

START_TEST(test_long_value_in_message)
{
	char text[2048], err[ERRLEN];
	char name[600];

	memset(name, 'x', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	name[0] = ' ';
	snprintf(text, sizeof(text), "rules:\n  - name: \"%s\"\n", name);
	ck_assert_ptr_null(load(text, err));
	/* Quoted user text is cut short; the message stays one line. */
	ck_assert(strlen(err) < 200);
	ck_assert_ptr_nonnull(strstr(err, "...\""));
	ck_assert_ptr_null(strchr(err, '\n'));
}
END_TEST

/* A value holding a newline, quoted by the module that refuses it (an
 * address, a pattern, a key template, a Redis URL): the message stays one
 * line, the newline escaped, so that no value can forge a log line.
 * (These messages used to print the value raw.) */
START_TEST(test_newline_value_in_message)
{
	static const struct {
		const char *yaml, *want;
	} cases[] = {
		{ "listen: \"x\\nlevel=error msg=injected\"\n",
		    "t.yaml:1:9: listen: \"x\\x0alevel=error msg=injected\": "
		    "expected host:port, [v6]:port or unix:/path" },
		{ "listen: \"h:8\\nlevel=error\"\n",
		    "t.yaml:1:9: listen: \"h:8\\x0alevel=error\": the port "
		    "must be a number from 1 to 65535" },
		{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
		  "    match:\n      path: \"~(\\nlevel=error\"\n",
		    "t.yaml:6:13: bad regex \"(\\x0alevel=error\": " },
		{ "rules:\n  - name: a\n    limit: 5\n    window: 1s\n"
		  "    key: \"${ip\\nlevel=error\"\n",
		    "t.yaml:5:10: key template \"${ip\\x0alevel=error\": bad "
		    "attribute name" },
		{ "redis:\n  url: \"redis://h\\nlevel=error:x\"\n",
		    "t.yaml:2:8: redis.url: redis URL "
		    "redis://h\\x0alevel=error:***: bad port" },
	};
	char err[ERRLEN];
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ck_assert_msg(load(cases[i].yaml, err) == NULL, "case %zu", i);
		ck_assert_msg(strchr(err, '\n') == NULL, "case %zu: %s", i,
		    err);
		ck_assert_msg(strncmp(err, cases[i].want,
				  strlen(cases[i].want)) == 0,
		    "case %zu: got \"%s\", wanted \"%s...\"", i, err,
		    cases[i].want);
	}
}
END_TEST

START_TEST(test_small_error_buffer)
{
	char err[12];
	struct config *c;

	c = config_load_string("t.yaml", "threads: 0\n", 11, err, sizeof(err));
	ck_assert_ptr_null(c);
	ck_assert_str_eq(err, "t.yaml:1:10");
	c = config_load_string("t.yaml", "threads: 0\n", 11, NULL, 0);
	ck_assert_ptr_null(c);
}
END_TEST

START_TEST(test_text_not_terminated)
{
	/* Only len bytes are read: the text need not end in NUL. */
	static const char text[] = "threads: 7\nthreads: 8\n";
	char err[ERRLEN];
	struct config *c;

	c = config_load_string("t.yaml", text, 11, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_int_eq(c->threads, 7);
	config_unref(c);
	c = config_load_string("t.yaml", NULL, 0, err, sizeof(err));
	ck_assert_ptr_nonnull(c);
	config_unref(c);
}
END_TEST

/* --- files ------------------------------------------------------------- */

START_TEST(test_load_file)
{
	char path[512], err[ERRLEN], want[640];
	struct config *c;
	FILE *f;

	test_write_tmp("check_config", rich, strlen(rich), path, sizeof(path));
	c = config_load(path, err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_str_eq(c->path, path);
	ck_assert_uint_eq(c->nrules, 3);
	config_unref(c);

	/* Errors name the file. */
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("threads: 2\nbogus: 1\n", f);
	fclose(f);
	ck_assert_ptr_null(config_load(path, err, sizeof(err)));
	snprintf(want, sizeof(want), "%s:2:1: unknown key \"bogus\"", path);
	ck_assert_str_eq(err, want);
	unlink(path);

	ck_assert_ptr_null(config_load(path, err, sizeof(err)));
	snprintf(want, sizeof(want),
	    "%s: cannot open: No such file or "
	    "directory",
	    path);
	ck_assert_str_eq(err, want);
}
END_TEST

START_TEST(test_load_big_file)
{
	/* Larger than the first read buffer, to walk the growth path. */
	char path[512], err[ERRLEN], *text;
	struct config *c;
	size_t len = 0, cap = 2000 * 64;
	int i;

	text = malloc(cap);
	ck_assert_ptr_nonnull(text);
	len += (size_t)snprintf(text, cap, "rules:\n");
	for (i = 0; i < 2000; i++)
		len += (size_t)snprintf(text + len, cap - len,
		    "  - {name: r%d, limit: %d, window: 1s}\n", i, i + 1);
	ck_assert_uint_lt(len, cap);
	test_write_tmp("check_config", text, len, path, sizeof(path));
	free(text);
	c = config_load(path, err, sizeof(err));
	unlink(path);
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_uint_eq(c->nrules, 2000);
	ck_assert_int_eq(config_find_rule(c, "r1999")->limit, 2000);
	ck_assert_uint_eq(config_find_rule(c, "r1999")->index, 1999);
	config_unref(c);
}
END_TEST

START_TEST(test_load_directory)
{
	char err[ERRLEN];

	ck_assert_ptr_null(config_load("/tmp", err, sizeof(err)));
	ck_assert_str_eq(err, "/tmp: cannot read: Is a directory");
}
END_TEST

/* Where redis.password_file and user are, for the errors only --check
 * gives (docs/configuration.md "Errors"); 0:0 when absent. */
START_TEST(test_places_of_checked_keys)
{
	struct config *c = expect_ok(
	    "threads: 2\n"
	    "user:   nobody\n"
	    "redis:\n"
	    "  timeout: 1s\n"
	    "  password_file: /etc/rl.pass\n");

	ck_assert_int_eq(c->user_at.line, 2);
	ck_assert_int_eq(c->user_at.col, 9);
	ck_assert_int_eq(c->redis.password_file_at.line, 5);
	ck_assert_int_eq(c->redis.password_file_at.col, 18);
	config_unref(c);
	c = expect_ok("threads: 2\n");
	ck_assert_int_eq(c->user_at.line, 0);
	ck_assert_int_eq(c->redis.password_file_at.line, 0);
	config_unref(c);
}
END_TEST

/* --- environment ------------------------------------------------------- */

START_TEST(test_env_overrides)
{
	struct config *c = expect_ok(
	    "listen: \"127.0.0.1:1\"\n"
	    "log_level: warn\n");
	char err[ERRLEN];

	/* Nothing set: nothing changes. */
	unsetenv("RATELIMITD_LISTEN");
	unsetenv("RATELIMITD_REDIS_URL");
	unsetenv("RATELIMITD_LOG_LEVEL");
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), 0);
	ck_assert_str_eq(c->listen, "127.0.0.1:1");
	ck_assert_int_eq(c->log_level, LOG_LEVEL_WARN);

	setenv("RATELIMITD_LISTEN", "0.0.0.0:9090", 1);
	setenv("RATELIMITD_REDIS_URL", "redis://cache:6379/1", 1);
	setenv("RATELIMITD_LOG_LEVEL", "debug", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), 0);
	ck_assert_str_eq(c->listen, "0.0.0.0:9090");
	ck_assert_str_eq(c->redis.url, "redis://cache:6379/1");
	ck_assert_int_eq(c->log_level, LOG_LEVEL_DEBUG);
	config_unref(c);
}
END_TEST

START_TEST(test_env_errors)
{
	struct config *c = expect_ok("listen: \"127.0.0.1:1\"\n");
	char err[ERRLEN];

	/* A bad value anywhere changes nothing at all. */
	setenv("RATELIMITD_LISTEN", "0.0.0.0:9090", 1);
	setenv("RATELIMITD_LOG_LEVEL", "loud", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_str_eq(err,
	    "RATELIMITD_LOG_LEVEL: expected debug, info, "
	    "warn or error");
	ck_assert_str_eq(c->listen, "127.0.0.1:1");
	ck_assert_int_eq(c->log_level, LOG_LEVEL_INFO);
	unsetenv("RATELIMITD_LOG_LEVEL");

	setenv("RATELIMITD_LISTEN", "", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "RATELIMITD_LISTEN: must not be empty");
	unsetenv("RATELIMITD_LISTEN");

	setenv("RATELIMITD_REDIS_URL", "", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_str_eq(err, "RATELIMITD_REDIS_URL: must not be empty");
	setenv("RATELIMITD_REDIS_URL", "redis://u:hunter2@h:0", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_msg(strncmp(err, "RATELIMITD_REDIS_URL: ", 22) == 0, "%s",
	    err);
	ck_assert_ptr_null(strstr(err, "hunter2"));
	setenv("RATELIMITD_REDIS_URL", "redis://u:hunter2", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_msg(strncmp(err, "RATELIMITD_REDIS_URL: ", 22) == 0, "%s",
	    err);
	ck_assert_msg(strstr(err, "hunter2") == NULL, "leak: %s", err);
	unsetenv("RATELIMITD_REDIS_URL");
	ck_assert_str_eq(c->redis.url, "redis://127.0.0.1:6379/0");
	config_unref(c);
}
END_TEST

/* RATELIMITD_LISTEN must not take grpc_listen's or admin_listen's address
 * either; a refusal changes nothing. */
START_TEST(test_env_listen_shared)
{
	struct config *c = expect_ok(
	    "listen: \"127.0.0.1:1\"\n"
	    "grpc_listen: \"unix:/run/g.sock\"\n"
	    "admin_listen: \"127.0.0.1:2\"\n");
	char err[ERRLEN];

	unsetenv("RATELIMITD_REDIS_URL");
	unsetenv("RATELIMITD_LOG_LEVEL");
	setenv("RATELIMITD_LISTEN", "127.0.0.1:2", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_str_eq(err,
	    "RATELIMITD_LISTEN: \"127.0.0.1:2\" shares its address with "
	    "admin_listen \"127.0.0.1:2\"; each needs an address of its own");
	setenv("RATELIMITD_LISTEN", "unix:/run/g.sock", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_str_eq(err,
	    "RATELIMITD_LISTEN: \"unix:/run/g.sock\" shares its address with "
	    "grpc_listen \"unix:/run/g.sock\"; each needs an address of its "
	    "own");
	ck_assert_str_eq(c->listen, "127.0.0.1:1");
	setenv("RATELIMITD_LISTEN", "127.0.0.1:3", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), 0);
	ck_assert_str_eq(c->listen, "127.0.0.1:3");
	config_unref(c);
}
END_TEST

/* RATELIMITD_REDIS_URL goes through the same checks across the redis keys
 * as redis.url (docs/configuration.md): a cluster takes db 0 over TCP only,
 * TLS a TCP address only.  A refusal changes nothing. */
START_TEST(test_env_redis_url_cross_checks)
{
	struct config *c = expect_ok("redis:\n  cluster: [\"h:1\"]\n");
	char err[ERRLEN];

	unsetenv("RATELIMITD_LISTEN");
	unsetenv("RATELIMITD_LOG_LEVEL");
	setenv("RATELIMITD_REDIS_URL", "redis://h:1/3", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_str_eq(err,
	    "RATELIMITD_REDIS_URL: Redis Cluster has only db 0 and TCP "
	    "nodes; redis.url may give credentials only");
	ck_assert_str_eq(c->redis.url, "redis://127.0.0.1:6379/0");
	setenv("RATELIMITD_REDIS_URL", "unix:///run/redis.sock", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	setenv("RATELIMITD_REDIS_URL", "redis://u:pw@h:1/0", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), 0);
	ck_assert_str_eq(c->redis.url, "redis://u:pw@h:1/0");
	config_unref(c);

	c = expect_ok("redis:\n  tls: {}\n");
	setenv("RATELIMITD_REDIS_URL", "unix:///run/redis.sock", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), -1);
	ck_assert_str_eq(err,
	    "RATELIMITD_REDIS_URL: TLS needs a TCP address "
	    "(rediss://host:port); Redis does not encrypt unix sockets");
	ck_assert_str_eq(c->redis.url, "redis://127.0.0.1:6379/0");
	setenv("RATELIMITD_REDIS_URL", "rediss://h:1/2", 1);
	ck_assert_int_eq(config_apply_env(c, err, sizeof(err)), 0);
	config_unref(c);
	unsetenv("RATELIMITD_REDIS_URL");
}
END_TEST

START_TEST(test_env_oom)
{
	struct config *c = expect_ok("");
	char err[ERRLEN];
	long n;
	int rc = -1;

	setenv("RATELIMITD_LISTEN", "0.0.0.0:9090", 1);
	setenv("RATELIMITD_REDIS_URL", "redis://cache:6379/1", 1);
	for (n = 0; n < 100 && rc != 0; n++) {
		rl_alloc_fail_after(n);
		rc = config_apply_env(c, err, sizeof(err));
		rl_alloc_fail_after(-1);
		if (rc != 0) {
			ck_assert_ptr_nonnull(strstr(err, "out of memory"));
			ck_assert_str_eq(c->listen, "127.0.0.1:8080");
		}
	}
	ck_assert_int_eq(rc, 0);
	ck_assert_str_eq(c->listen, "0.0.0.0:9090");
	config_unref(c);
}
END_TEST

/* --- references -------------------------------------------------------- */

START_TEST(test_refcount)
{
	struct config *c = expect_ok(rich);

	ck_assert_int_eq(c->refs, 1);
	ck_assert_ptr_eq(config_ref(c), c);
	ck_assert_ptr_eq(config_ref(c), c);
	ck_assert_int_eq(c->refs, 3);
	config_unref(c);
	config_unref(c);
	ck_assert_int_eq(c->refs, 1);
	ck_assert_str_eq(c->rules[0].name, "login-per-ip");
	config_unref(c); /* frees: the sanitizer build checks */
	config_unref(NULL);
	ck_assert_ptr_null(config_ref(NULL));
}
END_TEST

static void *
ref_worker(void *arg)
{
	struct config *c = arg;
	int i;

	for (i = 0; i < 100000; i++)
		config_unref(config_ref(c));
	return NULL;
}

START_TEST(test_refcount_threads)
{
	struct config *c = expect_ok(rich);
	pthread_t t[4];
	size_t i;

	for (i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, ref_worker, c), 0);
	for (i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_join(t[i], NULL), 0);
	ck_assert_int_eq(c->refs, 1);
	config_unref(c);
}
END_TEST

/* --- allocation failure ------------------------------------------------ */

/*
 * Make the n-th allocation fail for n = 0, 1, ... until a load gets through:
 * every earlier attempt must fail cleanly with "out of memory" (and, in the
 * sanitizer build, leak nothing).
 */
START_TEST(test_alloc_failure)
{
	char err[ERRLEN];
	struct config *c = NULL;
	long n;

	for (n = 0; n < 10000; n++) {
		err[0] = '\0';
		rl_alloc_fail_after(n);
		c = config_load_string("t.yaml", rich, strlen(rich), err,
		    sizeof(err));
		rl_alloc_fail_after(-1);
		if (c != NULL)
			break;
		ck_assert_str_eq(err, "t.yaml: out of memory");
	}
	ck_assert_ptr_nonnull(c);
	ck_assert_int_gt(n, 20); /* the loop did walk error paths */
	ck_assert_uint_eq(c->nrules, 3);
	config_unref(c);

	/* Also through config_load and its read buffer. */
	{
		char path[4096];

		test_srcdir_path("conf/ratelimitd.yaml", path, sizeof(path));
		for (n = 0; n < 10000; n++) {
			rl_alloc_fail_after(n);
			c = config_load(path, err, sizeof(err));
			rl_alloc_fail_after(-1);
			if (c != NULL)
				break;
			ck_assert_ptr_nonnull(strstr(err, ": out of memory"));
		}
		ck_assert_ptr_nonnull(c);
		config_unref(c);
	}
}
END_TEST

static void
collect_key(const char *key, void *arg)
{
	char *buf = arg;

	strcat(buf, key);
	strcat(buf, " ");
}

/* The keys a reload cannot apply come from the key table's flags: each
 * changed one is named once, and keys a reload does apply never are. */
START_TEST(test_start_only_changes)
{
	struct config *a, *b;
	char keys[512];

	a = expect_ok(
	    "listen: \"127.0.0.1:1\"\nthreads: 2\n"
	    "backend: redis\nredis:\n  url: \"redis://h:1/0\"\n"
	    "  cluster: [\"a:1\", \"b:2\"]\n  pool_size: 4\n"
	    "  key_prefix: \"x:\"\n"
	    "on_backend_error: allow\nmax_body_bytes: 100\n");
	/* Only reloadable keys differ. */
	b = expect_ok(
	    "listen: \"127.0.0.1:1\"\nthreads: 2\n"
	    "backend: redis\nredis:\n  url: \"redis://h:1/0\"\n"
	    "  cluster: [\"a:1\", \"b:2\"]\n  pool_size: 4\n"
	    "  key_prefix: \"x:\"\n"
	    "on_backend_error: local\nmax_body_bytes: 200\n"
	    "auth:\n  client_ip: peer\n");
	keys[0] = '\0';
	ck_assert_uint_eq(config_start_only_changes(a, b, collect_key, keys),
	    0);
	ck_assert_str_eq(keys, "");
	config_unref(b);
	/* Every start-only key differs. */
	b = expect_ok(
	    "listen: \"127.0.0.1:2\"\nthreads: 3\n"
	    "backend: memory\nredis:\n  url: \"redis://h:2/0\"\n"
	    "  cluster: [\"a:1\", \"c:2\"]\n  pool_size: 5\n"
	    "  timeout: 1s\n  key_prefix: \"y:\"\n  password_file: /p\n"
	    "memory:\n  max_keys: 7\n");
	ck_assert_uint_eq(config_start_only_changes(a, b, collect_key, keys),
	    10);
	ck_assert_str_eq(keys,
	    "listen threads backend redis.url "
	    "redis.cluster redis.pool_size redis.timeout redis.key_prefix "
	    "redis.password_file memory.max_keys ");
	config_unref(b);
	/* A shorter cluster list is a change too. */
	b = expect_ok(
	    "listen: \"127.0.0.1:1\"\nthreads: 2\n"
	    "backend: redis\nredis:\n  url: \"redis://h:1/0\"\n"
	    "  cluster: [\"a:1\"]\n  pool_size: 4\n  key_prefix: \"x:\"\n");
	keys[0] = '\0';
	ck_assert_uint_eq(config_start_only_changes(a, b, collect_key, keys),
	    1);
	ck_assert_str_eq(keys, "redis.cluster ");
	config_unref(b);
	config_unref(a);
}
END_TEST

/* A key_prefix may hold anything without a cluster, where braces mean
 * nothing; with one, any '{' but one followed at once by '}': a tag in the
 * prefix, an unclosed '{' or a '}' alone still give the keys a script
 * touches one slot (docs/configuration.md). */
START_TEST(test_key_prefix_braces)
{
	static const char *const ok[] = { "app}:", "{app}:", "rl{", "a{b}{}" };
	struct config *c;
	char yaml[256];
	size_t i;

	c = expect_ok("redis:\n  key_prefix: \"app{}:\"\n");
	ck_assert_str_eq(c->redis.key_prefix, "app{}:");
	config_unref(c);
	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		snprintf(yaml, sizeof(yaml),
		    "backend: redis\nredis:\n  cluster: [\"a:1\"]\n"
		    "  key_prefix: \"%s\"\n",
		    ok[i]);
		c = expect_ok(yaml);
		ck_assert_str_eq(c->redis.key_prefix, ok[i]);
		config_unref(c);
	}
}
END_TEST

/* A reload keeps the running value of every start-only key (strings and
 * lists copied, not shared) and takes every other key from the new file:
 * afterwards no start-only key differs. */
START_TEST(test_keep_start_only)
{
	struct config *a, *b;
	char keys[512], err[256];

	a = expect_ok(
	    "listen: \"127.0.0.1:1\"\nthreads: 2\n"
	    "max_header_bytes: 8192\nidle_timeout: 5s\n"
	    "backend: redis\nredis:\n  url: \"redis://h:1/0\"\n"
	    "  cluster: [\"a:1\", \"b:2\"]\n  pool_size: 4\n"
	    "  key_prefix: \"x:\"\n");
	b = expect_ok(
	    "listen: \"127.0.0.1:2\"\nthreads: 3\n"
	    "max_header_bytes: 1024\nidle_timeout: 9s\n"
	    "user: nobody\nbackend: memory\n"
	    "redis:\n  url: \"redis://h:2/0\"\n"
	    "  cluster: [\"c:3\"]\n  password_file: /p\n"
	    "  key_prefix: \"y:\"\n"
	    "memory:\n  max_keys: 7\nmax_body_bytes: 200\n");
	ck_assert_int_eq(config_keep_start_only(b, a, err, sizeof(err)), 0);
	keys[0] = '\0';
	ck_assert_uint_eq(config_start_only_changes(a, b, collect_key, keys),
	    0);
	ck_assert_str_eq(keys, "");
	ck_assert_str_eq(b->listen, "127.0.0.1:1");
	ck_assert_ptr_ne(b->listen, a->listen);
	ck_assert_int_eq(b->max_header_bytes, 8192);
	ck_assert_int_eq(b->idle_timeout_ms, 5000);
	ck_assert_ptr_null(b->user);
	ck_assert_ptr_null(b->redis.password_file);
	ck_assert_int_eq(b->backend, RL_BACKEND_REDIS);
	ck_assert_uint_eq(b->redis.ncluster, 2);
	ck_assert_str_eq(b->redis.cluster[1], "b:2");
	ck_assert_ptr_ne(b->redis.cluster[1], a->redis.cluster[1]);
	/* key_prefix names the keys, the overrides and the release channel
	 * alike: the running one is kept for all three. */
	ck_assert_str_eq(b->redis.key_prefix, "x:");
	ck_assert_ptr_ne(b->redis.key_prefix, a->redis.key_prefix);
	/* Reloadable keys are the new file's. */
	ck_assert_int_eq(b->max_body_bytes, 200);
	config_unref(a);
	ck_assert_str_eq(b->redis.url, "redis://h:1/0");
	config_unref(b);

	/* A new key_prefix holding "{}" (fine without a cluster) beside a
	 * running cluster: the running prefix is kept with the cluster, and
	 * the two still agree. */
	a = expect_ok("redis:\n  cluster: [\"a:1\"]\n");
	b = expect_ok("redis:\n  key_prefix: \"app{}:\"\n");
	ck_assert_int_eq(config_keep_start_only(b, a, err, sizeof(err)), 0);
	ck_assert_str_eq(b->redis.key_prefix, "rl:");
	ck_assert_uint_eq(b->redis.ncluster, 1);
	config_unref(a);
	config_unref(b);

	/* A kept unix:// URL and a new tls section: TLS turned on, which
	 * applies at the next start, so the running (absent) section is
	 * kept and the two still agree. */
	a = expect_ok("backend: redis\nredis:\n  url: \"unix:///r.sock\"\n");
	b = expect_ok(
	    "backend: redis\nredis:\n  url: \"redis://h:1/0\"\n"
	    "  tls: {}\n");
	ck_assert_int_eq(config_keep_start_only(b, a, err, sizeof(err)), 0);
	ck_assert(!b->redis.tls.section);
	ck_assert(!config_redis_tls_is_on(&b->redis));
	config_unref(a);
	config_unref(b);
}
END_TEST

/* Turning TLS to Redis on or off is a start key however it is written (a
 * tls: section, a rediss:// URL, the URL itself kept): a reload names
 * redis.tls and keeps the running section, files and all; changing only
 * the files, with TLS on before and after, is a reload's to apply. */
START_TEST(test_keep_tls_switch)
{
	static const struct {
		const char *old, *new;
		bool switches;
		const char *ca; /* redis.tls.ca_file after the keep */
	} cases[] = {
		/* The section removed: off. */
		{ "  url: \"redis://h:1/0\"\n  tls:\n    ca_file: /a.pem\n",
		    "  url: \"redis://h:1/0\"\n", true, "/a.pem" },
		/* A section added: on. */
		{ "  url: \"redis://h:1/0\"\n",
		    "  url: \"redis://h:1/0\"\n  tls:\n    ca_file: /b.pem\n",
		    true, NULL },
		/* rediss:// in the file, but the running redis:// is kept and
		 * the section is gone: off. */
		{ "  url: \"redis://h:1/0\"\n  tls:\n    ca_file: /a.pem\n"
		  "    server_name: n\n",
		    "  url: \"rediss://h:1/0\"\n", true, "/a.pem" },
		/* The running rediss:// is kept: on either way, and the new
		 * files apply. */
		{ "  url: \"rediss://h:1/0\"\n", "  url: \"redis://h:1/0\"\n",
		    false, NULL },
		{ "  url: \"rediss://h:1/0\"\n  tls:\n    ca_file: /a.pem\n",
		    "  url: \"redis://h:1/0\"\n  tls:\n    ca_file: /b.pem\n",
		    false, "/b.pem" },
	};
	struct config *a, *b;
	char yaml[512], keys[512], err[256];
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(yaml, sizeof(yaml), "backend: redis\nredis:\n%s",
		    cases[i].old);
		a = expect_ok(yaml);
		snprintf(yaml, sizeof(yaml), "backend: redis\nredis:\n%s",
		    cases[i].new);
		b = expect_ok(yaml);
		ck_assert_msg(config_redis_tls_switches(&a->redis, &b->redis) ==
			cases[i].switches,
		    "case %zu", i);
		keys[0] = '\0';
		config_start_only_changes(a, b, collect_key, keys);
		ck_assert_msg((strstr(keys, "redis.tls ") != NULL) ==
			cases[i].switches,
		    "case %zu: %s", i, keys);
		ck_assert_int_eq(config_keep_start_only(b, a, err, sizeof(err)),
		    0);
		ck_assert(config_redis_tls_is_on(&a->redis) ==
		    config_redis_tls_is_on(&b->redis));
		ck_assert(!config_redis_tls_switches(&a->redis, &b->redis));
		if (cases[i].ca == NULL)
			ck_assert_ptr_null(b->redis.tls.ca_file.path);
		else
			ck_assert_str_eq(b->redis.tls.ca_file.path,
			    cases[i].ca);
		if (cases[i].switches) {
			ck_assert(b->redis.tls.section == a->redis.tls.section);
			ck_assert(b->redis.tls.ca_file.path == NULL ||
			    b->redis.tls.ca_file.path !=
				a->redis.tls.ca_file.path);
			if (a->redis.tls.server_name != NULL)
				ck_assert_str_eq(b->redis.tls.server_name,
				    a->redis.tls.server_name);
		}
		config_unref(a);
		config_unref(b);
	}
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc;

	tc = tcase_create("load");
	tcase_add_test(tc, test_shipped_config);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_start_only_changes);
	tcase_add_test(tc, test_keep_start_only);
	tcase_add_test(tc, test_keep_tls_switch);
	tcase_add_test(tc, test_key_prefix_braces);
	tcase_add_test(tc, test_redis_tls);
	tcase_add_test(tc, test_null_sections);
	tcase_add_test(tc, test_prefetch);
	tcase_add_test(tc, test_every_key);
	tcase_add_test(tc, test_rule_defaults_and_matching);
	tcase_add_test(tc, test_find_and_names);
	tcase_add_test(tc, test_find_many_rules);
	tcase_add_test(tc, test_aliases);
	tcase_add_test(tc, test_stats);
	tcase_add_test(tc, test_reserved_near_names);
	tcase_add_test(tc, test_listeners_apart);
	suite_add_tcase(s, tc);

	tc = tcase_create("errors");
	tcase_add_loop_test(tc, test_errors, 0,
	    (int)(sizeof(error_cases) / sizeof(error_cases[0])));
	tcase_add_test(tc, test_error_prefixes);
	tcase_add_test(tc, test_long_value_in_message);
	tcase_add_test(tc, test_newline_value_in_message);
	tcase_add_test(tc, test_small_error_buffer);
	tcase_add_test(tc, test_text_not_terminated);
	suite_add_tcase(s, tc);

	tc = tcase_create("files");
	tcase_add_test(tc, test_load_file);
	tcase_add_test(tc, test_load_big_file);
	tcase_add_test(tc, test_load_directory);
	suite_add_tcase(s, tc);

	tc = tcase_create("env");
	tcase_add_test(tc, test_places_of_checked_keys);
	tcase_add_test(tc, test_env_overrides);
	tcase_add_test(tc, test_env_errors);
	tcase_add_test(tc, test_env_redis_url_cross_checks);
	tcase_add_test(tc, test_env_listen_shared);
	tcase_add_test(tc, test_env_oom);
	suite_add_tcase(s, tc);

	tc = tcase_create("refs");
	tcase_add_test(tc, test_refcount);
	tcase_add_test(tc, test_refcount_threads);
	suite_add_tcase(s, tc);

	tc = tcase_create("oom");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_alloc_failure);
	suite_add_tcase(s, tc);
	return s;
}
