/*
 * check_request_json.c - unit tests of request_json.c: JSON bodies into
 * attributes and reserved fields (docs/http.md).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/request_json.h"
#include "base/util.h"

static const char *const reserved[] = { "cost", "rule", NULL };

/* Parse text; returns the rc, fills *a and *fields. */
static int
parse(const char *text, size_t max, struct attrs *a, json_t **fields,
    struct request_error *e)
{
	memset(e, 0, sizeof(*e));
	return request_json_parse(text, strlen(text), reserved, max, a, fields,
	    e);
}

START_TEST(test_attributes_and_reserved)
{
	struct attrs a = { 0 };
	struct request_error e;
	json_t *f;
	int64_t cost = -1;
	const char *rule = NULL;

	ck_assert_int_eq(
	    parse("{\"ip\":\"10.0.0.1\",\"n\":-42,\"ok\":true,"
		  "\"no\":false,\"gone\":null,\"cost\":3,\"rule\":\"r1\"}",
		0, &a, &f, &e),
	    0);
	ck_assert_uint_eq(a.n, 4);
	ck_assert_str_eq(attrs_get(&a, "ip"), "10.0.0.1");
	ck_assert_str_eq(attrs_get(&a, "n"), "-42");
	ck_assert_str_eq(attrs_get(&a, "ok"), "true");
	ck_assert_str_eq(attrs_get(&a, "no"), "false");
	ck_assert_ptr_null(attrs_get(&a, "gone"));
	ck_assert_ptr_null(attrs_get(&a, "cost"));
	ck_assert_ptr_null(attrs_get(&a, "rule"));
	ck_assert_int_eq(request_json_int(f, "cost", 0, 100, "invalid_cost",
			     &cost, &e),
	    0);
	ck_assert_int_eq(cost, 3);
	ck_assert_int_eq(request_json_string(f, "rule", "unknown_rule", &rule,
			     &e),
	    0);
	ck_assert_str_eq(rule, "r1");
	json_decref(f);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_empty_body)
{
	struct attrs a = { 0 };
	struct request_error e;
	json_t *f = NULL;
	int64_t cost = -1;

	ck_assert_int_eq(request_json_parse("", 0, reserved, 0, &a, &f, &e), 0);
	ck_assert_ptr_null(f); /* no reserved field: no object */
	ck_assert_uint_eq(a.n, 0);
	/* Absent reserved fields leave the default. */
	ck_assert_int_eq(request_json_int(f, "cost", 0, 100, "invalid_cost",
			     &cost, &e),
	    0);
	ck_assert_int_eq(cost, -1);
	json_decref(f);
}
END_TEST

static const struct {
	const char *body;
	const char *code;
} bad_cases[] = {
	{ "{", "invalid_json" },
	{ "[1,2]", "invalid_json" },
	{ "\"x\"", "invalid_json" },
	{ "{\"a\":1,\"a\":2}", "invalid_json" },     /* duplicate name */
	{ "{\"a\":\"x\\u0000y\"}", "invalid_json" }, /* NUL refused */
	{ "{\"a\":{\"b\":1}}", "invalid_attribute" },
	{ "{\"a\":[1]}", "invalid_attribute" },
	{ "{\"a\":1.5}", "invalid_attribute" },
	{ "{\"a\":1,\"b\":2,\"c\":3}", "too_many_attributes" },
};

START_TEST(test_bad_bodies)
{
	struct attrs a = { 0 };
	struct request_error e;
	json_t *f = (json_t *)1;

	ck_assert_int_eq(parse(bad_cases[_i].body, 2, &a, &f, &e), -1);
	ck_assert_ptr_null(f);
	ck_assert_int_eq(e.status, 400);
	ck_assert_msg(strcmp(e.code, bad_cases[_i].code) == 0,
	    "%s: got %s, want %s", bad_cases[_i].body, e.code,
	    bad_cases[_i].code);
	ck_assert_int_gt(strlen(e.message), 0);
	attrs_clear(&a);
}
END_TEST

/* Reserved fields are not attributes and count against no bound. */
START_TEST(test_bound_counts_attributes_only)
{
	struct attrs a = { 0 };
	struct request_error e;
	json_t *f;

	ck_assert_int_eq(parse("{\"a\":1,\"b\":null,\"cost\":1,\"rule\":\"x\","
			       "\"c\":2}",
			     2, &a, &f, &e),
	    0);
	ck_assert_uint_eq(a.n, 2);
	json_decref(f);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_reserved_readers)
{
	struct attrs a = { 0 };
	struct request_error e;
	json_t *f;
	int64_t cost = 7;
	const char *rule = NULL;

	ck_assert_int_eq(parse("{\"cost\":-1,\"rule\":5}", 0, &a, &f, &e), 0);
	ck_assert_int_eq(request_json_int(f, "cost", 0, 100, "invalid_cost",
			     &cost, &e),
	    -1);
	ck_assert_str_eq(e.code, "invalid_cost");
	ck_assert_int_eq(cost, 7);
	ck_assert_int_eq(request_json_string(f, "rule", "unknown_rule", &rule,
			     &e),
	    -1);
	ck_assert_str_eq(e.code, "unknown_rule");
	json_decref(f);

	ck_assert_int_eq(parse("{\"cost\":\"3\"}", 0, &a, &f, &e), 0);
	ck_assert_int_eq(request_json_int(f, "cost", 0, 100, "invalid_cost",
			     &cost, &e),
	    -1);
	json_decref(f);
	ck_assert_int_eq(parse("{\"cost\":101}", 0, &a, &f, &e), 0);
	ck_assert_int_eq(request_json_int(f, "cost", 0, 100, "invalid_cost",
			     &cost, &e),
	    -1);
	json_decref(f);

	/* null is absent, as for an attribute (docs/http.md) */
	ck_assert_int_eq(parse("{\"cost\":null,\"rule\":null}", 0, &a, &f, &e),
	    0);
	ck_assert_int_eq(request_json_int(f, "cost", 0, 100, "invalid_cost",
			     &cost, &e),
	    0);
	ck_assert_int_eq(cost, 7);
	ck_assert_int_eq(request_json_string(f, "rule", "unknown_rule", &rule,
			     &e),
	    0);
	ck_assert_ptr_null(rule);
	json_decref(f);
	attrs_clear(&a);
}
END_TEST

/* Every allocation failure is an internal_error, never a crash or leak. */
START_TEST(test_oom)
{
	const char *body = "{\"ip\":\"10.0.0.1\",\"user\":\"u\",\"cost\":1}";
	long n;
	int ok = 0;

	for (n = 0; n < 40; n++) {
		struct attrs a = { 0 };
		struct request_error e;
		json_t *f = NULL;
		int rc;

		rl_alloc_fail_after(n);
		rc = request_json_parse(body, strlen(body), reserved, 0, &a, &f,
		    &e);
		rl_alloc_fail_after(-1);
		if (rc == 0) {
			ok++;
			ck_assert_uint_eq(a.n, 2);
			json_decref(f);
		} else {
			ck_assert_str_eq(e.code, "internal_error");
			ck_assert_int_eq(e.status, 500);
		}
		attrs_clear(&a);
	}
	ck_assert_int_gt(ok, 0);
}
END_TEST

/* REQUEST_JSON_BIG_INT_REAL: an integer past int64 reads as a double;
 * every other number, and digits in strings, as they were.  Without the
 * flag (the decision endpoints) such a body stays invalid_json. */
START_TEST(test_big_int_real)
{
	static const char body[] =
	    "{\"value\":10000000000000000000,\"cost\":-99999999999999999999,"
	    "\"rule\":\"\\\"12345678901234567890\",\"n\":7,"
	    "\"q\":[1.123456789012345678901,2e5,9223372036854775807]}";
	static const char *const res[] = { "value", "cost", "rule", "q", NULL };
	struct attrs a = { 0 };
	struct request_error e;
	json_t *f, *q;

	memset(&e, 0, sizeof(e));
	ck_assert_int_eq(request_json_parse_flags(body, strlen(body), res, 0,
			     &a, &f, REQUEST_JSON_BIG_INT_REAL, &e),
	    0);
	ck_assert(json_is_real(json_object_get(f, "value")));
	ck_assert(json_real_value(json_object_get(f, "value")) == 1e19);
	ck_assert(json_real_value(json_object_get(f, "cost")) == -1e20);
	ck_assert_str_eq(json_string_value(json_object_get(f, "rule")),
	    "\"12345678901234567890");
	ck_assert_str_eq(attrs_get(&a, "n"), "7");
	q = json_object_get(f, "q");
	ck_assert(json_real_value(json_array_get(q, 0)) ==
	    1.123456789012345678901);
	ck_assert(json_real_value(json_array_get(q, 1)) == 2e5);
	ck_assert(json_is_integer(json_array_get(q, 2)));
	json_decref(f);
	attrs_clear(&a);
	/* Past a double: still invalid_json. */
	ck_assert_int_eq(request_json_parse_flags("{\"value\":1e400}", 15, res,
			     0, &a, &f, REQUEST_JSON_BIG_INT_REAL, &e),
	    -1);
	ck_assert_str_eq(e.code, "invalid_json");
	json_decref(f);
	attrs_clear(&a);
	/* Without the flag: invalid_json, as before. */
	ck_assert_int_eq(parse("{\"cost\":10000000000000000000}", 0, &a, &f,
			     &e),
	    -1);
	ck_assert_str_eq(e.code, "invalid_json");
	json_decref(f);
	attrs_clear(&a);
}
END_TEST

/* jansson's refusals of a name given twice and of a NUL, in the daemon's
 * words (docs/http.md): the name quoted whole (jansson names one of up to
 * 20 bytes only), with what a quote in it is escaped by, and found where
 * jansson stopped in the body it read (after a big integer read as a
 * real, a copy longer than the body). */
START_TEST(test_refusals_worded)
{
	static const struct {
		unsigned flags;
		const char *body, *says;
	} want[] = {
		{ 0, "{\"a\":1,\"a\":2}",
		    "line 1 column 10: the field \"a\" is named twice" },
		{ 0, "{\"\":1, \"\" :2}", "the field \"\" is named twice" },
		{ 0,
		    "{\"a_name_of_more_than_twenty\":1,\n"
		    "\"a_name_of_more_than_twenty\":2}",
		    "line 2 column 28: the field "
		    "\"a_name_of_more_than_twenty\" is named twice" },
		{ 0, "{\"q\\\"\\\\\":1,\"q\\\"\\\\\":2}",
		    "the field \"q\\\"\\\\\" is named twice" },
		{ 0, "{\"\\u00e9\\\\\":1,\"\\u00e9\\\\\":2}",
		    "the field \"\xc3\xa9\\\\\" is named twice" },
		{ REQUEST_JSON_BIG_INT_REAL,
		    "{\"v\":99999999999999999999,\"b\":1,\"b\":2}",
		    "the field \"b\" is named twice" },
		{ 0, "{\"a\":{\"in\":1,\"in\":2}}",
		    "the field \"in\" is named twice" },
		{ 0, "{\"a\":\"x\\u0000y\"}", "a string holds \\u0000" },
		{ 0, "{\"a\\u0000\":1}", "a field name holds \\u0000" },
	};
	static const char *const res[] = { "v", NULL };
	size_t i;

	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct attrs a = { 0 };
		struct request_error e;
		json_t *f = NULL;

		memset(&e, 0, sizeof(e));
		ck_assert_int_eq(request_json_parse_flags(want[i].body,
				     strlen(want[i].body), res, 0, &a, &f,
				     want[i].flags, &e),
		    -1);
		ck_assert_str_eq(e.code, "invalid_json");
		ck_assert_msg(strstr(e.message, want[i].says) != NULL,
		    "%s: \"%s\", expected \"%s\"", want[i].body, e.message,
		    want[i].says);
		attrs_clear(&a);
	}
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("request_json");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_attributes_and_reserved);
	tcase_add_test(tc, test_empty_body);
	tcase_add_loop_test(tc, test_bad_bodies, 0,
	    sizeof(bad_cases) / sizeof(bad_cases[0]));
	tcase_add_test(tc, test_bound_counts_attributes_only);
	tcase_add_test(tc, test_reserved_readers);
	tcase_add_test(tc, test_oom);
	tcase_add_test(tc, test_big_int_real);
	tcase_add_test(tc, test_refusals_worded);
	suite_add_tcase(s, tc);
	return s;
}
