/*
 * check_stats_request.c - the names quantiles answer under
 * (src/core/stats_request.c, docs/stats.md "HTTP"): "p" and the quantile in
 * percent, exact, so that two distinct quantiles never share a name (they
 * did: 1 and 0.999999999999 both answered as "p100", and -0.0 as "p-0").
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

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

Suite *
test_suite(void)
{
	Suite *s = suite_create("stats_request");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_names);
	tcase_add_test(tc, test_distinct_and_exact);
	tcase_add_test(tc, test_tiny);
	suite_add_tcase(s, tc);
	return s;
}
