/*
 * check_stats_request.c - the answer of /record and /stats
 * (src/core/stats_request.c, docs/stats.md "HTTP"):
 *   - the names quantiles answer under: "p" and the quantile in percent,
 *     exact, so that two distinct quantiles never share a name (they did:
 *     1 and 0.999999999999 both answered as "p100", and -0.0 as "p-0");
 *   - the numbers: the shortest of %.15g, %.16g and %.17g that reads back
 *     as the value (41.7 answered 41.700000000000003, every real of the
 *     answer being dumped with 17 digits);
 *   - the whole answer's text, its fields in order, strings escaped.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "check_main.h"

#include "base/util.h"
#include "core/config.h"
#include "core/stats_request.h"

static const char *
name(double q)
{
	static char buf[STATS_QUANTILE_NAME_MAX];

	stats_quantile_name(buf, sizeof(buf), q);
	return buf;
}

START_TEST(test_names)
{
	ck_assert_str_eq(name(0.5), "p50");
	ck_assert_str_eq(name(0.9), "p90");
	ck_assert_str_eq(name(0.99), "p99");
	ck_assert_str_eq(name(0.999), "p99.9");
	ck_assert_str_eq(name(0.07), "p7"); /* 0.07 * 100 rounds */
	ck_assert_str_eq(name(1), "p100");
	ck_assert_str_eq(name(0), "p0");
	ck_assert_str_eq(name(-0.0), "p0");
	ck_assert_str_eq(name(0.999999999999), "p99.9999999999");
	ck_assert_str_eq(name(0.0001), "p0.01");
	ck_assert_str_eq(name(1e-7), "p0.00001");
	ck_assert_str_eq(name(0.1234), "p12.34");
}
END_TEST

/* Distinct numbers, distinct names; and a name reads back as its number
 * (percent / 100 within the roundings of reading and dividing). */
START_TEST(test_distinct_and_exact)
{
	char a[STATS_QUANTILE_NAME_MAX], b[STATS_QUANTILE_NAME_MAX];
	double x, y;
	int i;

	srand(7);
	for (i = 0; i < 100000; i++) {
		x = (double)rand() / RAND_MAX;
		y = i % 2 == 0 ? nextafter(x, 2) : (double)rand() / RAND_MAX;
		if (y > 1 || x == y)
			continue;
		stats_quantile_name(a, sizeof(a), x);
		stats_quantile_name(b, sizeof(b), y);
		ck_assert_msg(strcmp(a, b) != 0, "%.17g and %.17g: %s", x, y,
		    a);
		ck_assert_msg(a[0] == 'p' &&
			fabs(strtod(a + 1, NULL) / 100 - x) <= 4e-16,
		    "%s for %.17g", a, x);
	}
}
END_TEST

/* Tiny quantiles keep every digit: 1e-100 and 1e-200 were both cut to
 * "p0." and 37 zeros, one field of the answer overwriting the other. */
START_TEST(test_tiny)
{
	static const double qs[] = { 1e-100, 1e-200, 1e-300, 2.5e-308,
		4.9406564584124654e-324, 1.2345678901234567e-300 };
	char a[STATS_QUANTILE_NAME_MAX], b[STATS_QUANTILE_NAME_MAX];
	size_t i, j;

	for (i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
		stats_quantile_name(a, sizeof(a), qs[i]);
		ck_assert_msg(strtod(a + 1, NULL) / 100 == qs[i] ||
			fabs(strtod(a + 1, NULL) / 100 - qs[i]) <=
			    4e-16 * qs[i],
		    "%s for %.17g", a, qs[i]);
		for (j = 0; j < i; j++) {
			stats_quantile_name(b, sizeof(b), qs[j]);
			ck_assert_msg(strcmp(a, b) != 0, "%s", a);
		}
	}
	stats_quantile_name(a, sizeof(a), 4.9406564584124654e-324);
	ck_assert_uint_eq(strlen(a), 3 + 321 + 1);
	ck_assert_str_eq(a + 3 + 321, "5");
}
END_TEST

static const char *
text(double x)
{
	static char buf[STATS_NUMBER_MAX];
	size_t n = stats_number_text(buf, x);

	ck_assert_uint_eq(n, strlen(buf));
	return buf;
}

START_TEST(test_number_text)
{
	ck_assert_str_eq(text(41.7), "41.7");
	ck_assert_str_eq(text(-41.7), "-41.7");
	ck_assert_str_eq(text(0.1 + 0.2), "0.30000000000000004");
	ck_assert_str_eq(text(1.0 / 3), "0.3333333333333333");
	ck_assert_str_eq(text(31.47), "31.47");
	ck_assert_str_eq(text(1e-7), "1e-7");
	ck_assert_str_eq(text(1.5e-300), "1.5e-300");
	/* The smallest double: 15 digits already read back as it. */
	ck_assert_str_eq(text(5e-324), "4.94065645841247e-324");
	ck_assert_str_eq(text(1e300), "1e300");
	ck_assert_str_eq(text(1e19), "1e19");
	ck_assert_str_eq(text(DBL_MAX), "1.7976931348623157e308");
	ck_assert_str_eq(text(-DBL_MAX), "-1.7976931348623157e308");
	/* Whole numbers below 2^53 are integers, -0.0 included. */
	ck_assert_str_eq(text(912), "912");
	ck_assert_str_eq(text(-3), "-3");
	ck_assert_str_eq(text(0), "0");
	ck_assert_str_eq(text(-0.0), "0");
	ck_assert_str_eq(text(9007199254740991.0), "9007199254740991");
	/* From 2^53 on, a real: its point kept so that it reads as one. */
	ck_assert_str_eq(text(9007199254740994.0), "9007199254740994.0");
	ck_assert_str_eq(text(-9007199254740994.0), "-9007199254740994.0");
	ck_assert_str_eq(text(INFINITY), "null");
	ck_assert_str_eq(text(NAN), "null");
}
END_TEST

/* Any finite double: read back bit for bit (by strtod and by jansson),
 * and no precision below the one used reads back. */
START_TEST(test_number_shortest)
{
	char buf[STATS_NUMBER_MAX], shorter[40], json[64];
	uint64_t bits = 88172645463325252u;
	json_t *j;
	double x, y;
	int i, prec;

	for (i = 0; i < 200000; i++) {
		bits ^= bits >> 12;
		bits ^= bits << 25;
		bits ^= bits >> 27;
		memcpy(&x, &bits, sizeof(x));
		if (!isfinite(x))
			continue;
		stats_number_text(buf, x);
		y = strtod(buf, NULL);
		ck_assert_msg(memcmp(&x, &y, sizeof(x)) == 0 ||
			(x == 0 && y == 0),
		    "%.17g written %s", x, buf);
		snprintf(json, sizeof(json), "[%s]", buf);
		ck_assert_ptr_nonnull(j = json_loads(json, 0, NULL));
		ck_assert_msg(json_number_value(json_array_get(j, 0)) == x,
		    "jansson reads %s as %.17g", buf,
		    json_number_value(json_array_get(j, 0)));
		json_decref(j);
		for (prec = 15; prec <= 17; prec++) {
			snprintf(shorter, sizeof(shorter), "%.*g", prec, x);
			if (strtod(shorter, NULL) == x)
				break;
		}
		ck_assert_msg(strlen(buf) <= strlen(shorter) ||
			(x == floor(x) && strchr(buf, '.') != NULL),
		    "%s longer than %s", buf, shorter);
	}
}
END_TEST

static const char stats_yaml[] =
    "stats:\n"
    "  - name: lat\n"
    "    key: \"${route}\"\n"
    "    window: 1m\n"
    "  - name: \"empty\"\n"
    "    window: 2s\n";

/* The whole answer: names and keys escaped, fields in order, integers as
 * integers, reals in their shortest form, null for an empty window. */
START_TEST(test_answer_text)
{
	static const char body[] =
	    "{\"route\": \"/pay \\\"x\\\"\\u00e9\", "
	    "\"value\": 41.7, \"quantiles\": [0.5, "
	    "0.999]}";
	static const char want[] =
	    "{\"stats\":[{\"name\":\"lat\",\"key\":\"/pay \\\"x\\\"\xc3\xa9\","
	    "\"window_ms\":60000,\"count\":3,\"sum\":125.10000000000001,"
	    "\"avg\":41.7,\"min\":-0.1,\"max\":912,\"p50\":41.7,"
	    "\"p99.9\":1e300},"
	    "{\"name\":\"empty\",\"key\":\"\",\"window_ms\":2000,\"count\":0,"
	    "\"sum\":null,\"avg\":null,\"min\":null,\"max\":null,"
	    "\"p50\":null,\"p99.9\":null}]}";
	struct stats_request sr;
	struct request_error e;
	struct config *cfg;
	char err[256], *got;
	size_t len = 0;
	long n;

	cfg = config_load_string("t.yaml", stats_yaml, strlen(stats_yaml), err,
	    sizeof(err));
	ck_assert_msg(cfg != NULL, "%s", err);
	ck_assert_int_eq(stats_request_prepare(&sr, cfg, body, strlen(body),
			     true, &e),
	    0);
	ck_assert_uint_eq(sr.n, 2);
	sr.results[0].count = 3;
	sr.results[0].min = -0.1;
	sr.results[0].max = 912;
	sr.results[0].q[0] = 41.7;
	sr.results[0].q[1] = 1e300;
	sr.results[0].sum = 41.7 * 3;
	ck_assert_ptr_nonnull(got = stats_request_answer(&sr, &len));
	ck_assert_str_eq(got, want);
	ck_assert_uint_eq(len, strlen(want));
	free(got);
	/* Out of memory at any allocation: NULL, nothing leaked. */
	for (n = 0; n < 16; n++) {
		rl_alloc_fail_after(n);
		got = stats_request_answer(&sr, &len);
		rl_alloc_fail_after(-1);
		if (got != NULL) {
			ck_assert_str_eq(got, want);
			free(got);
		}
	}
	stats_request_clear(&sr);
	config_unref(cfg);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("stats_request");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_names);
	tcase_add_test(tc, test_distinct_and_exact);
	tcase_add_test(tc, test_tiny);
	tcase_add_test(tc, test_number_text);
	tcase_add_test(tc, test_number_shortest);
	tcase_add_test(tc, test_answer_text);
	suite_add_tcase(s, tc);
	return s;
}
