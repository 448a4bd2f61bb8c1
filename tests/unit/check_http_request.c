/*
 * check_http_request.c - unit tests of the HTTP request mapping
 * (front/http_request.h, docs/http.md) without a daemon: the attributes,
 * rule, cost and wait an /acquire body gives, the errors of bad bodies,
 * and the attributes /auth derives from a proxied request's headers and
 * peer (X-Original-* and X-Forwarded-*, Host, the client address).
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "base/util.h"
#include "core/config.h"
#include "front/http_request.h"

static struct config *cfg;

/* max_attributes 6: an /acquire body has up to 6 attributes, /auth up to
 * 2 headers besides the four it derives.  max_wait 5 s. */
static void
setup(void)
{
	static const char text[] = "max_attributes: 6\nmax_wait: 5s\n";
	char err[256];

	cfg = config_load_string("t.yaml", text, strlen(text), err,
	    sizeof(err));
	ck_assert_msg(cfg != NULL, "%s", err);
}

static void
teardown(void)
{
	config_unref(cfg);
}

/* Parse body as /acquire does; returns its result. */
static int
acquire(const char *body, struct attrs *a, struct http_acquire *out,
    struct request_error *e)
{
	return http_acquire_parse(cfg, body, strlen(body), a, out, e);
}

START_TEST(test_acquire_attributes)
{
	struct attrs a = { 0 };
	struct http_acquire q;
	struct request_error e;

	ck_assert_int_eq(
	    acquire("{\"user\":\"alice\",\"n\":42,\"vip\":true,"
		    "\"cost\":3,\"wait_ms\":1500,\"rule\":\"per_user\"}",
		&a, &q, &e),
	    0);
	ck_assert_str_eq(attrs_get(&a, "user"), "alice");
	ck_assert_str_eq(attrs_get(&a, "n"), "42");
	ck_assert_str_eq(attrs_get(&a, "vip"), "true");
	/* The reserved fields are not attributes. */
	ck_assert_ptr_null(attrs_get(&a, "cost"));
	ck_assert_ptr_null(attrs_get(&a, "rule"));
	ck_assert_ptr_null(attrs_get(&a, "wait_ms"));
	ck_assert_int_eq(q.cost, 3);
	ck_assert_int_eq(q.wait_ms, 1500);
	ck_assert_str_eq(q.rule, "per_user");
	rl_free(q.rule);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_acquire_defaults)
{
	struct attrs a = { 0 };
	struct http_acquire q;
	struct request_error e;

	/* No body at all is an empty object. */
	ck_assert_int_eq(http_acquire_parse(cfg, NULL, 0, &a, &q, &e), 0);
	ck_assert_int_eq(q.cost, -1);
	ck_assert_int_eq(q.wait_ms, 0);
	ck_assert_ptr_null(q.rule);
	ck_assert_ptr_null(attrs_get(&a, "user"));
	/* null is an absent attribute. */
	ck_assert_int_eq(acquire("{\"user\":null,\"ip\":\"10.0.0.1\"}", &a, &q,
			     &e),
	    0);
	ck_assert_ptr_null(attrs_get(&a, "user"));
	ck_assert_str_eq(attrs_get(&a, "ip"), "10.0.0.1");
	attrs_clear(&a);
}
END_TEST

/* Bad bodies: the status, code and (part of) the message answered. */
static const struct {
	const char *body;
	int status;
	const char *code;
	const char *message; /* a part of it */
} bad_bodies[] = {
	{ "{\"user\":", 400, "invalid_json", "line 1" },
	{ "[1,2]", 400, "invalid_json", "must be a JSON object" },
	{ "{\"a\":1,\"a\":2}", 400, "invalid_json", "" },
	{ "{\"user\":[1]}", 400, "invalid_attribute", "\"user\"" },
	{ "{\"user\":{\"x\":1}}", 400, "invalid_attribute", "\"user\"" },
	{ "{\"a\":1,\"b\":2,\"c\":3,\"d\":4,\"e\":5,\"f\":6,\"g\":7}", 400,
	    "too_many_attributes", "more than 6" },
	{ "{\"cost\":-1}", 400, "invalid_cost", "cost" },
	{ "{\"cost\":\"3\"}", 400, "invalid_cost", "cost" },
	{ "{\"cost\":1.5}", 400, "invalid_cost", "cost" },
	{ "{\"wait_ms\":5001}", 400, "invalid_wait", "wait_ms" },
	{ "{\"wait_ms\":-1}", 400, "invalid_wait", "wait_ms" },
	{ "{\"rule\":7}", 400, "unknown_rule", "rule" },
};

START_TEST(test_acquire_bad_body)
{
	struct attrs a = { 0 };
	struct http_acquire q;
	struct request_error e;

	memset(&e, 0, sizeof(e));
	ck_assert_int_eq(acquire(bad_bodies[_i].body, &a, &q, &e), -1);
	ck_assert_int_eq(e.status, bad_bodies[_i].status);
	ck_assert_str_eq(e.code, bad_bodies[_i].code);
	ck_assert_msg(strstr(e.message, bad_bodies[_i].message) != NULL,
	    "%s: message \"%s\" lacks \"%s\"", bad_bodies[_i].body, e.message,
	    bad_bodies[_i].message);
	ck_assert_ptr_null(q.rule);
	attrs_clear(&a);
}
END_TEST

/* The wait bound is the config's max_wait: 5000 is still allowed. */
START_TEST(test_acquire_wait_bound)
{
	struct attrs a = { 0 };
	struct http_acquire q;
	struct request_error e;

	ck_assert_int_eq(acquire("{\"wait_ms\":5000}", &a, &q, &e), 0);
	ck_assert_int_eq(q.wait_ms, 5000);
	attrs_clear(&a);
}
END_TEST

/* /report takes the /acquire body with wait_ms ignored, whatever its
 * value, and never an attribute (docs/http.md). */
START_TEST(test_report_ignores_wait)
{
	static const char *const bodies[] = { "{\"wait_ms\":5000}",
		"{\"wait_ms\":5001}", "{\"wait_ms\":\"x\"}",
		"{\"wait_ms\":-1.5}", "{\"wait_ms\":null}" };
	struct attrs a = { 0 };
	struct http_acquire q;
	struct request_error e;
	size_t i;

	for (i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		ck_assert_msg(http_report_parse(cfg, bodies[i],
				  strlen(bodies[i]), &a, &q, &e) == 0,
		    "%s: %s", bodies[i], e.message);
		ck_assert_int_eq(q.wait_ms, 0);
		ck_assert_ptr_null(attrs_get(&a, "wait_ms"));
		rl_free(q.rule);
		attrs_clear(&a);
	}
	/* the rest is /acquire's */
	ck_assert_int_eq(http_report_parse(cfg, "{\"cost\":-1}", 11, &a, &q,
			     &e),
	    -1);
	ck_assert_str_eq(e.code, "invalid_cost");
	attrs_clear(&a);
}
END_TEST

/* Walk name/value pairs (NULL-terminated) into a, as the adapter walks
 * libmicrohttpd's headers; returns the first failure or 0. */
static int
headers(struct attrs *a, const char *const *kv)
{
	struct http_headers h;
	int rc;

	http_headers_init(&h, a, cfg);
	for (; kv[0] != NULL; kv += 2)
		if ((rc = http_headers_add(&h, kv[0], kv[1])) != 0)
			return rc;
	return 0;
}

START_TEST(test_auth_plain)
{
	static const char *const kv[] = { "Host", "api.example.com",
		"User-Agent", "curl", NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, kv), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", "192.0.2.7", &a),
	    0);
	ck_assert_str_eq(attrs_get(&a, "header.host"), "api.example.com");
	ck_assert_str_eq(attrs_get(&a, "header.user-agent"), "curl");
	ck_assert_str_eq(attrs_get(&a, "method"), "GET");
	ck_assert_str_eq(attrs_get(&a, "path"), "/auth");
	ck_assert_str_eq(attrs_get(&a, "host"), "api.example.com");
	ck_assert_str_eq(attrs_get(&a, "ip"), "192.0.2.7");
	attrs_clear(&a);
}
END_TEST

/* nginx auth_request: X-Original-Method and X-Original-URI win over the
 * request's own, the query is cut; X-Real-IP over the peer. */
START_TEST(test_auth_original)
{
	static const char *const kv[] = { "X-Original-Method", "DELETE",
		"X-Original-URI", "/v1/items/9?force=1", NULL };
	static const char *const kv2[] = { "X-Real-IP", "198.51.100.4", NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, kv), 0);
	ck_assert_int_eq(headers(&a, kv2), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", "127.0.0.1", &a),
	    0);
	ck_assert_str_eq(attrs_get(&a, "method"), "DELETE");
	ck_assert_str_eq(attrs_get(&a, "path"), "/v1/items/9");
	ck_assert_str_eq(attrs_get(&a, "ip"), "198.51.100.4");
	ck_assert_ptr_null(attrs_get(&a, "host"));
	attrs_clear(&a);
}
END_TEST

/* Traefik forwardAuth: X-Forwarded-Method, -Uri and -Host; the host from
 * X-Forwarded-Host over Host, the ip from X-Forwarded-For. */
START_TEST(test_auth_forwarded)
{
	static const char *const kv[] = { "X-Forwarded-Method", "PUT",
		"X-Forwarded-Uri", "/login?next=/", NULL };
	static const char *const kv2[] = { "X-Forwarded-Host", "shop.test",
		"Host", "ratelimitd:8080", NULL };
	static const char *const kv3[] = { "X-Forwarded-For", "203.0.113.9",
		NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, kv), 0);
	ck_assert_int_eq(headers(&a, kv2), 0);
	ck_assert_int_eq(headers(&a, kv3), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", "10.1.1.1", &a),
	    0);
	ck_assert_str_eq(attrs_get(&a, "method"), "PUT");
	ck_assert_str_eq(attrs_get(&a, "path"), "/login");
	ck_assert_str_eq(attrs_get(&a, "host"), "shop.test");
	ck_assert_str_eq(attrs_get(&a, "ip"), "203.0.113.9");
	attrs_clear(&a);
}
END_TEST

/* Envoy ext_authz with path_prefix: /auth/login is a check of /login;
 * an empty X-Original-URI does not count. */
START_TEST(test_auth_path_prefix)
{
	static const char *const kv[] = { "X-Original-URI", "", NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, kv), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth/login?x=1", "POST", NULL,
			     &a),
	    0);
	ck_assert_str_eq(attrs_get(&a, "path"), "/login");
	ck_assert_str_eq(attrs_get(&a, "method"), "POST");
	/* No source of an address (a unix socket): no ip. */
	ck_assert_ptr_null(attrs_get(&a, "ip"));
	attrs_clear(&a);
}
END_TEST

/* Every source of the path is normalized (core/uri_path.h): a header is
 * decoded once, the URL (decoded by libmicrohttpd) is not decoded again;
 * an encoded NUL is refused (-3). */
START_TEST(test_auth_path_normalized)
{
	static const char *const xou[] = { "X-Original-URI",
		"//x/%2e%2e/%6cogin?y=1", NULL };
	static const char *const xfu[] = { "X-Forwarded-Uri", "/./login",
		NULL };
	static const char *const nul[] = { "X-Original-URI", "/login%00",
		NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, xou), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", NULL, &a), 0);
	ck_assert_str_eq(attrs_get(&a, "path"), "/login");
	attrs_clear(&a);
	ck_assert_int_eq(headers(&a, xfu), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", NULL, &a), 0);
	ck_assert_str_eq(attrs_get(&a, "path"), "/login");
	attrs_clear(&a);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth//x/../%6cogin", "GET",
			     NULL, &a),
	    0);
	ck_assert_str_eq(attrs_get(&a, "path"), "/%6cogin");
	attrs_clear(&a);
	ck_assert_int_eq(headers(&a, nul), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", NULL, &a), -3);
	attrs_clear(&a);
}
END_TEST

/* A header sent twice is one list; names are lowercased. */
START_TEST(test_auth_repeated_header)
{
	static const char *const kv[] = { "X-Forwarded-For", "198.51.100.1",
		"x-forwarded-for", "203.0.113.5", NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, kv), 0);
	ck_assert_str_eq(attrs_get(&a, "header.x-forwarded-for"),
	    "198.51.100.1,203.0.113.5");
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", "10.0.0.1", &a),
	    0);
	/* xff_trusted_hops 0: the nearest proxy's entry, the rightmost. */
	ck_assert_str_eq(attrs_get(&a, "ip"), "203.0.113.5");
	attrs_clear(&a);
}
END_TEST

/* max_attributes 6 leaves 2 headers to /auth: the third is refused. */
START_TEST(test_auth_too_many_headers)
{
	static const char *const two[] = { "A", "1", "B", "2", NULL };
	static const char *const three[] = { "A", "1", "B", "2", "C", "3",
		NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, two), 0);
	attrs_clear(&a);
	ck_assert_int_eq(headers(&a, three), -2);
	attrs_clear(&a);
}
END_TEST

/* A spoofed address in X-Real-IP that is no address falls through to the
 * next source. */
START_TEST(test_auth_bogus_ip)
{
	static const char *const kv[] = { "X-Real-IP", "not-an-ip", NULL };
	struct attrs a = { 0 };

	ck_assert_int_eq(headers(&a, kv), 0);
	ck_assert_int_eq(http_auth_derive(cfg, "/auth", "GET", "192.0.2.50",
			     &a),
	    0);
	ck_assert_str_eq(attrs_get(&a, "ip"), "192.0.2.50");
	attrs_clear(&a);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("http_request");
	TCase *acq = tcase_create("acquire");
	TCase *auth = tcase_create("auth");

	tcase_add_checked_fixture(acq, setup, teardown);
	tcase_add_test(acq, test_acquire_attributes);
	tcase_add_test(acq, test_acquire_defaults);
	tcase_add_loop_test(acq, test_acquire_bad_body, 0,
	    sizeof(bad_bodies) / sizeof(bad_bodies[0]));
	tcase_add_test(acq, test_acquire_wait_bound);
	tcase_add_test(acq, test_report_ignores_wait);
	suite_add_tcase(s, acq);
	tcase_add_checked_fixture(auth, setup, teardown);
	tcase_add_test(auth, test_auth_plain);
	tcase_add_test(auth, test_auth_original);
	tcase_add_test(auth, test_auth_forwarded);
	tcase_add_test(auth, test_auth_path_prefix);
	tcase_add_test(auth, test_auth_path_normalized);
	tcase_add_test(auth, test_auth_repeated_header);
	tcase_add_test(auth, test_auth_too_many_headers);
	tcase_add_test(auth, test_auth_bogus_ip);
	suite_add_tcase(s, auth);
	return s;
}
