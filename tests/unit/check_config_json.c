/*
 * check_config_json.c - unit tests for config_json.c: the running config as
 * GET /admin/config answers it (docs/admin.md).  Every key a rules file may
 * set is there, with durations in milliseconds; secrets are "***" and files
 * that hold secrets are named by path, never read.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check_main.h"

#include "core/config.h"

#define ERRLEN 512

/* text loaded under the name "t.yaml" and answered as JSON. */
static json_t *
as_json(const char *text)
{
	char err[ERRLEN], *s;
	struct config *c;
	json_error_t je;
	json_t *o;

	c = config_load_string("t.yaml", text, strlen(text), err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	ck_assert_ptr_nonnull(s = config_to_json(c));
	ck_assert_msg(strstr(s, "hunter2") == NULL, "leak: %s", s);
	o = json_loads(s, 0, &je);
	ck_assert_msg(o != NULL, "%s: %s", je.text, s);
	free(s);
	config_unref(c);
	return o;
}

static const char *
str_at(json_t *o, const char *path)
{
	json_t *v = json_object_get(o, path);

	ck_assert_msg(json_is_string(v), "%s is not a string", path);
	return json_string_value(v);
}

static json_int_t
int_at(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	ck_assert_msg(json_is_integer(v), "%s is not an integer", key);
	return json_integer_value(v);
}

/* auth, log_format, listen_mode, redis.tls and a rule's prefetch: all set
 * away from their defaults, all answered. */
START_TEST(test_every_key)
{
	json_t *o = as_json(
	    "listen: \"unix:/run/rl.sock\"\n"
	    "listen_mode: \"0660\"\n"
	    "log_format: json\n"
	    "backend: redis\n"
	    "redis:\n"
	    "  url: \"rediss://alice:hunter2@10.0.0.5:6380/0\"\n"
	    "  sentinel:\n"
	    "    master: m\n"
	    "    nodes: [\"10.0.0.9:26379\"]\n"
	    "    tls: true\n"
	    "  tls:\n"
	    "    ca_file: /etc/rl/ca.pem\n"
	    "    cert_file: /etc/rl/client.pem\n"
	    "    key_file: /etc/rl/client.key\n"
	    "    server_name: redis.internal\n"
	    "auth:\n"
	    "  deny_status: 403\n"
	    "  client_ip: x-forwarded-for\n"
	    "  xff_trusted_hops: 2\n"
	    "  ipv6_prefix: 48\n"
	    "rules:\n"
	    "  - name: hot\n"
	    "    match: { t: hot }\n"
	    "    limit: 1000\n"
	    "    window: 1s\n"
	    "    prefetch: { max_units: 50, hold: 20ms }\n"
	    "  - name: cold\n"
	    "    match: { t: cold }\n"
	    "    limit: 10\n"
	    "    window: 1m\n");
	json_t *auth, *redis, *tls, *pf;

	ck_assert_str_eq(str_at(o, "log_format"), "json");
	ck_assert_str_eq(str_at(o, "listen_mode"), "0660");
	ck_assert_ptr_nonnull(auth = json_object_get(o, "auth"));
	ck_assert_int_eq(int_at(auth, "deny_status"), 403);
	ck_assert_str_eq(str_at(auth, "client_ip"), "x-forwarded-for");
	ck_assert_int_eq(int_at(auth, "xff_trusted_hops"), 2);
	ck_assert_int_eq(int_at(auth, "ipv6_prefix"), 48);
	ck_assert_ptr_nonnull(redis = json_object_get(o, "redis"));
	ck_assert_str_eq(str_at(redis, "url"), "rediss://***@10.0.0.5:6380/0");
	ck_assert_ptr_nonnull(tls = json_object_get(redis, "tls"));
	ck_assert_str_eq(str_at(tls, "ca_file"), "/etc/rl/ca.pem");
	ck_assert_str_eq(str_at(tls, "cert_file"), "/etc/rl/client.pem");
	ck_assert_str_eq(str_at(tls, "key_file"), "/etc/rl/client.key");
	ck_assert_str_eq(str_at(tls, "server_name"), "redis.internal");
	ck_assert(json_is_true(
	    json_object_get(json_object_get(redis, "sentinel"), "tls")));
	pf = json_object_get(json_array_get(json_object_get(o, "rules"), 0),
	    "prefetch");
	ck_assert_ptr_nonnull(pf);
	ck_assert_int_eq(int_at(pf, "max_units"), 50);
	ck_assert_int_eq(int_at(pf, "hold_ms"), 20);
	ck_assert(json_is_null(json_object_get(
	    json_array_get(json_object_get(o, "rules"), 1), "prefetch")));
	json_decref(o);
}
END_TEST

/* The defaults: no tls section and no listen_mode are null, auth and
 * log_format at their defaults. */
START_TEST(test_defaults)
{
	json_t *o = as_json("threads: 2\n"), *auth, *redis;

	ck_assert_str_eq(str_at(o, "log_format"), "logfmt");
	ck_assert(json_is_null(json_object_get(o, "listen_mode")));
	ck_assert_ptr_nonnull(auth = json_object_get(o, "auth"));
	ck_assert_int_eq(int_at(auth, "deny_status"), 429);
	ck_assert_str_eq(str_at(auth, "client_ip"), "auto");
	ck_assert_int_eq(int_at(auth, "xff_trusted_hops"), 0);
	ck_assert_int_eq(int_at(auth, "ipv6_prefix"), 64);
	ck_assert_ptr_nonnull(redis = json_object_get(o, "redis"));
	ck_assert(json_is_null(json_object_get(redis, "tls")));
	/* Present, null: not set and without a default (docs/admin.md). */
	ck_assert(json_is_null(json_object_get(redis, "sentinel")));
	json_decref(o);
}
END_TEST

/* An empty tls section turns TLS on: an object, its files null. */
START_TEST(test_empty_tls)
{
	json_t *o = as_json("redis:\n  tls: {}\n"), *tls;

	tls = json_object_get(json_object_get(o, "redis"), "tls");
	ck_assert(json_is_object(tls));
	ck_assert(json_is_null(json_object_get(tls, "ca_file")));
	ck_assert(json_is_null(json_object_get(tls, "server_name")));
	json_decref(o);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("config_json");
	TCase *tc = tcase_create("config_json");

	tcase_add_test(tc, test_every_key);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_empty_tls);
	suite_add_tcase(s, tc);
	return s;
}
