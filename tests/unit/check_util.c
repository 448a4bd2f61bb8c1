/*
 * check_util.c - unit tests of base/util's number helpers:
 * util_fmt_int64() writes every number of an answer (docs/http.md), so it
 * must give what printf's "%lld" gives, at every length and sign; and
 * util_ceil_div() rounds the answer's times up without overflowing.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"

#include "base/util.h"

/* util_fmt_int64(v) against snprintf, with nothing written past it. */
static void
same_as_printf(int64_t v)
{
	char want[32], got[UTIL_INT64_DEC_MAX + 8];
	size_t n;

	snprintf(want, sizeof(want), "%" PRId64, v);
	memset(got, '#', sizeof(got));
	n = util_fmt_int64(got, v);
	ck_assert_uint_le(n, UTIL_INT64_DEC_MAX);
	ck_assert_uint_eq(n, strlen(want));
	ck_assert_int_eq(memcmp(got, want, n), 0);
	ck_assert_int_eq(got[n], '#');
}

/* Every length from 1 to 19 digits, at both ends of each and on both
 * sides of zero, and the extremes. */
START_TEST(test_fmt_int64_lengths)
{
	int64_t p = 1;
	int k;

	same_as_printf(0);
	same_as_printf(INT64_MAX);
	same_as_printf(INT64_MIN);
	same_as_printf(INT64_MIN + 1);
	for (k = 0; k < 19; k++) {
		same_as_printf(p);
		same_as_printf(-p);
		same_as_printf(p - 1);
		same_as_printf(1 - p);
		same_as_printf(p + 1);
		same_as_printf(-p - 1);
		if (k < 18) {
			same_as_printf(p * 10 - 1);
			p *= 10;
		}
	}
}
END_TEST

/* Numbers whose digit pairs run through every value 00..99. */
START_TEST(test_fmt_int64_pairs)
{
	uint64_t x = 88172645463325252ULL; /* xorshift64 */
	int64_t v;
	int i;

	for (v = -1000; v <= 1000; v++)
		same_as_printf(v);
	for (i = 0; i < 100000; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		v = (int64_t)(x >> (i % 63));
		same_as_printf(i % 2 ? -v : v);
	}
}
END_TEST

/* util_ceil_div: a / b rounded up, 0 for a <= 0, and no overflow at
 * INT64_MAX (a + b - 1 would: the RateLimit headers divide times in ms
 * that a long window can take near it). */
START_TEST(test_ceil_div)
{
	static const int64_t bs[] = { 1, 2, 7, 1000, INT64_MAX };
	static const int64_t as[] = { 0, 1, 2, 6, 7, 8, 999, 1000, 1001,
		INT64_MAX - 1000, INT64_MAX - 1, INT64_MAX };
	size_t i, k;

	ck_assert_int_eq(util_ceil_div(-5, 1000), 0);
	ck_assert_int_eq(util_ceil_div(INT64_MIN, 7), 0);
	ck_assert_int_eq(util_ceil_div(INT64_MAX, 1000), 9223372036854776);
	for (k = 0; k < sizeof(bs) / sizeof(bs[0]); k++)
		for (i = 0; i < sizeof(as) / sizeof(as[0]); i++) {
			int64_t a = as[i], b = bs[k], q = a / b;

			if (q * b != a)
				q++;
			ck_assert_int_eq(util_ceil_div(a, b), q);
		}
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("util");
	TCase *tc = tcase_create("base");

	tcase_add_test(tc, test_fmt_int64_lengths);
	tcase_add_test(tc, test_fmt_int64_pairs);
	tcase_add_test(tc, test_ceil_div);
	suite_add_tcase(s, tc);
	return s;
}
