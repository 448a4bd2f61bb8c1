/*
 * check_log.c - unit tests of log.c: what a line says of a value that is
 * not plain text.  A value may quote what a client sent (an admin's key
 * or rule, an attribute), any bytes: a JSON line must still be JSON, and
 * neither format may carry a raw control character (docs/operations.md,
 * the log).
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "check_main.h"

#include "base/log.h"

/* One log_fields() line (n fields) as written on stderr, in buf. */
static void
capture(char *buf, size_t cap, bool json, const char *const *keys,
    const char *const *vals, size_t n)
{
	int fds[2], saved;
	ssize_t got;

	ck_assert_int_eq(pipe(fds), 0);
	saved = dup(STDERR_FILENO);
	ck_assert_int_ge(saved, 0);
	ck_assert_int_ge(dup2(fds[1], STDERR_FILENO), 0);
	log_set_json(json);
	log_fields(LOG_LEVEL_ERROR, "counters reset", keys, vals, n);
	ck_assert_int_ge(dup2(saved, STDERR_FILENO), 0);
	close(saved);
	close(fds[1]);
	got = read(fds[0], buf, cap - 1);
	close(fds[0]);
	ck_assert_int_gt(got, 0);
	buf[got] = '\0';
}

static const char *const keys[] = { "rule", "key", "c1", "ok" };
static const char *const vals[] = { "a", "\xff\xfe", "x\xc2\x85y",
	"caf\xc3\xa9" };

/* A byte that is no UTF-8 becomes \u00XX, a C1 control \u0080-\u009f;
 * valid text other than that is kept as it is. */
START_TEST(test_json_line_is_json)
{
	char buf[4096];
	json_error_t e;
	json_t *o;

	capture(buf, sizeof(buf), true, keys, vals, 4);
	o = json_loads(buf, 0, &e);
	ck_assert_msg(o != NULL, "not JSON (%s): %s", e.text, buf);
	ck_assert_str_eq(json_string_value(json_object_get(o, "key")),
	    "\xc3\xbf\xc3\xbe");
	ck_assert_str_eq(json_string_value(json_object_get(o, "c1")),
	    "x\xc2\x85y");
	ck_assert_str_eq(json_string_value(json_object_get(o, "ok")),
	    "caf\xc3\xa9");
	ck_assert_ptr_nonnull(strstr(buf, "\"key\":\"\\u00ff\\u00fe\""));
	ck_assert_ptr_nonnull(strstr(buf, "\"c1\":\"x\\u0085y\""));
	ck_assert_ptr_nonnull(strstr(buf, "\"ok\":\"caf\xc3\xa9\""));
	json_decref(o);
}
END_TEST

START_TEST(test_text_line_escapes)
{
	char buf[4096];

	capture(buf, sizeof(buf), false, keys, vals, 4);
	ck_assert_msg(strstr(buf, " key=\"\\u00ff\\u00fe\"") != NULL, "%s",
	    buf);
	ck_assert_msg(strstr(buf, " c1=\"x\\u0085y\"") != NULL, "%s", buf);
	ck_assert_msg(strstr(buf, " ok=\"caf\xc3\xa9\"") != NULL, "%s", buf);
}
END_TEST

/* A sequence cut by the end of the value, overlong forms and surrogates
 * are no UTF-8 either. */
START_TEST(test_bad_sequences)
{
	static const char *const k[] = { "cut", "overlong", "surrogate" };
	static const char *const v[] = { "a\xc3", "\xc0\xaf", "\xed\xa0\x80" };
	char buf[4096];
	json_error_t e;
	json_t *o;

	capture(buf, sizeof(buf), true, k, v, 3);
	o = json_loads(buf, 0, &e);
	ck_assert_msg(o != NULL, "not JSON (%s): %s", e.text, buf);
	ck_assert_ptr_nonnull(strstr(buf, "\"cut\":\"a\\u00c3\""));
	ck_assert_ptr_nonnull(strstr(buf, "\"overlong\":\"\\u00c0\\u00af\""));
	ck_assert_ptr_nonnull(strstr(buf,
	    "\"surrogate\":\"\\u00ed\\u00a0\\u0080\""));
	json_decref(o);
}
END_TEST

/* A value of n copies of byte b and then tail, in a new string. */
static char *
repeat(unsigned char b, size_t n, const char *tail)
{
	char *s = malloc(n + strlen(tail) + 1);

	ck_assert_ptr_nonnull(s);
	memset(s, b, n);
	strcpy(s + n, tail);
	return s;
}

/*
 * An admin's key of 400 control bytes escapes to 2,400 bytes, more than
 * a line holds: the key is cut (ending "..."), and the fields after it
 * are still whole and the object closed, so the line is one JSON record
 * that keeps every field.
 */
START_TEST(test_json_long_value_keeps_fields)
{
	const char *k[] = { "rule", "key", "change", "after" };
	const char *v[4];
	char buf[8192], *key = repeat(0x01, 400, "victim");
	const char *got;
	json_error_t e;
	json_t *o;

	v[0] = "per-key";
	v[1] = key;
	v[2] = "{\"limit\":5}";
	v[3] = "end";
	capture(buf, sizeof(buf), true, k, v, 4);
	ck_assert_msg(strlen(buf) <= 2048, "%zu bytes", strlen(buf));
	ck_assert_msg(strchr(buf, '\n') == buf + strlen(buf) - 1, "%s", buf);
	o = json_loads(buf, 0, &e);
	ck_assert_msg(o != NULL, "not JSON (%s): %s", e.text, buf);
	ck_assert_str_eq(json_string_value(json_object_get(o, "msg")),
	    "counters reset");
	ck_assert_str_eq(json_string_value(json_object_get(o, "rule")),
	    "per-key");
	ck_assert_str_eq(json_string_value(json_object_get(o, "change")),
	    "{\"limit\":5}");
	ck_assert_str_eq(json_string_value(json_object_get(o, "after")), "end");
	got = json_string_value(json_object_get(o, "key"));
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_gt(strlen(got), 100);
	ck_assert_str_eq(got + strlen(got) - 3, "...");
	ck_assert_int_eq(got[0], 0x01);
	json_decref(o);
	free(key);
}
END_TEST

/* Several values too long for a line share it: each is cut, none lost. */
START_TEST(test_json_many_long_values)
{
	const char *k[] = { "a", "b", "c", "d" };
	const char *v[4];
	char buf[8192], *big = repeat(0x7f, 3000, ""),
			*mid = repeat('x', 500, "");
	json_error_t e;
	json_t *o;
	size_t i;

	v[0] = big;
	v[1] = mid;
	v[2] = big;
	v[3] = "short";
	capture(buf, sizeof(buf), true, k, v, 4);
	o = json_loads(buf, 0, &e);
	ck_assert_msg(o != NULL, "not JSON (%s): %s", e.text, buf);
	for (i = 0; i < 3; i++) {
		const char *got = json_string_value(json_object_get(o, k[i]));

		ck_assert_ptr_nonnull(got);
		ck_assert_uint_gt(strlen(got), 3);
	}
	ck_assert_str_eq(json_string_value(json_object_get(o, "b")), mid);
	ck_assert_str_eq(json_string_value(json_object_get(o, "d")), "short");
	json_decref(o);
	free(big);
	free(mid);
}
END_TEST

/* The same in logfmt: the long value is cut inside its quotes, the
 * fields after it are whole. */
START_TEST(test_text_long_value_keeps_fields)
{
	const char *k[] = { "rule", "key", "change", "after" };
	const char *v[4];
	char buf[8192], *key = repeat(0x01, 400, "victim");

	v[0] = "per-key";
	v[1] = key;
	v[2] = "{\"limit\":5}";
	v[3] = "end";
	capture(buf, sizeof(buf), false, k, v, 4);
	ck_assert_msg(strlen(buf) <= 2048, "%zu bytes", strlen(buf));
	ck_assert_msg(strchr(buf, '\n') == buf + strlen(buf) - 1, "%s", buf);
	ck_assert_msg(strstr(buf, " rule=\"per-key\" key=\"\\u0001") != NULL,
	    "%s", buf);
	ck_assert_msg(strstr(buf,
			  "\\u0001...\" change=\"{\\\"limit\\\":5}\" "
			  "after=\"end\"\n") != NULL,
	    "%s", buf);
	free(key);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("escaping");

	tcase_add_test(tc, test_json_line_is_json);
	tcase_add_test(tc, test_text_line_escapes);
	tcase_add_test(tc, test_bad_sequences);
	suite_add_tcase(s, tc);
	tc = tcase_create("long");
	tcase_add_test(tc, test_json_long_value_keeps_fields);
	tcase_add_test(tc, test_json_many_long_values);
	tcase_add_test(tc, test_text_long_value_keeps_fields);
	suite_add_tcase(s, tc);
	return s;
}
