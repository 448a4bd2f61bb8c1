/*
 * check_rate_headers.c - unit tests of rate_headers.c: the RateLimit
 * headers of a decision (docs/http.md), which HTTP and gRPC both send.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/rate_headers.h"

/* The value of header name among h[0..n-1], or NULL. */
static const char *
value_of(const struct rate_header *h, int n, const char *name)
{
	int i;

	for (i = 0; i < n; i++)
		if (strcmp(h[i].name, name) == 0)
			return h[i].value;
	return NULL;
}

/* t is the effective window, not the reset: sliding_log 3 per 10 s with
 * hits at +0, +2 and +4 s, denied at +5 s (docs/http.md's example). */
START_TEST(test_t_is_the_effective_window)
{
	char name[] = "api";
	struct rule r = { .name = name,
		.limit = 3,
		.window_ms = 10000,
		.algorithm = RL_ALG_SLIDING_LOG };
	struct decision d = { .rule = &r,
		.allowed = false,
		.limit = 3,
		.remaining = 0,
		.reset_ms = 9000,
		.retry_after_ms = 5000,
		.effective_ms = 5000 };
	struct rate_header h[RATE_HEADERS_MAX];
	int n = rate_headers(&d, h);

	ck_assert_int_eq(n, 6);
	ck_assert_str_eq(value_of(h, n, "RateLimit-Policy"),
	    "\"api\";q=3;w=10");
	ck_assert_str_eq(value_of(h, n, "RateLimit"), "\"api\";r=0;t=5");
	ck_assert_str_eq(value_of(h, n, "X-RateLimit-Reset"), "9");
	ck_assert_str_eq(value_of(h, n, "Retry-After"), "5");
	/* Rounded up to whole seconds. */
	d.effective_ms = 1;
	rate_headers(&d, h);
	ck_assert_str_eq(value_of(h, n, "RateLimit"), "\"api\";r=0;t=1");
}
END_TEST

/* A concurrency rule: units held at once, no window and no t. */
START_TEST(test_concurrency_policy)
{
	char name[] = "jobs";
	struct rule r = { .name = name,
		.limit = 4,
		.window_ms = 30000,
		.algorithm = RL_ALG_CONCURRENCY };
	struct decision d = { .rule = &r,
		.allowed = true,
		.limit = 4,
		.remaining = 3,
		.reset_ms = 30000 };
	struct rate_header h[RATE_HEADERS_MAX];
	int n = rate_headers(&d, h);

	ck_assert_int_eq(n, 5);
	ck_assert_str_eq(value_of(h, n, "RateLimit-Policy"),
	    "\"jobs\";q=4;qu=\"concurrent-requests\"");
	ck_assert_str_eq(value_of(h, n, "RateLimit"), "\"jobs\";r=3");
	ck_assert_ptr_null(value_of(h, n, "Retry-After"));
}
END_TEST

/* Numbers are written without printf: the widest and a negative one. */
START_TEST(test_numbers_written_whole)
{
	char name[] = "n";
	struct rule r = { .name = name,
		.limit = INT64_MAX,
		.window_ms = 1000,
		.algorithm = RL_ALG_SLIDING_LOG };
	struct decision d = { .rule = &r,
		.allowed = true,
		.limit = INT64_MAX,
		.remaining = -5,
		.reset_ms = 1000,
		.effective_ms = 1000 };
	struct rate_header h[RATE_HEADERS_MAX];
	int n = rate_headers(&d, h);

	ck_assert_str_eq(value_of(h, n, "X-RateLimit-Limit"),
	    "9223372036854775807");
	ck_assert_str_eq(value_of(h, n, "X-RateLimit-Remaining"), "-5");
	ck_assert_str_eq(value_of(h, n, "RateLimit-Policy"),
	    "\"n\";q=9223372036854775807;w=1");
	ck_assert_str_eq(value_of(h, n, "RateLimit"), "\"n\";r=-5;t=1");
	d.remaining = INT64_MIN;
	n = rate_headers(&d, h);
	ck_assert_str_eq(value_of(h, n, "X-RateLimit-Remaining"),
	    "-9223372036854775808");
	d.remaining = 0;
	n = rate_headers(&d, h);
	ck_assert_str_eq(value_of(h, n, "X-RateLimit-Remaining"), "0");
}
END_TEST

/* The longest rule name with the longest numbers: every value whole
 * (the buffers are sized for it), written straight into its buffer. */
START_TEST(test_longest_values_whole)
{
	char name[RL_MAX_NAME_BYTES + 1], want[RATE_HEADER_VALUE_MAX + 64];
	struct rule r = { .name = name,
		.limit = INT64_MAX,
		.window_ms = INT64_MAX,
		.algorithm = RL_ALG_SLIDING_LOG };
	struct decision d = { .rule = &r,
		.allowed = false,
		.limit = INT64_MAX,
		.remaining = INT64_MIN,
		.reset_ms = INT64_MAX,
		.retry_after_ms = INT64_MAX,
		.effective_ms = INT64_MAX };
	struct rate_header h[RATE_HEADERS_MAX];
	int n;

	memset(name, 'r', RL_MAX_NAME_BYTES);
	name[RL_MAX_NAME_BYTES] = '\0';
	n = rate_headers(&d, h);
	snprintf(want, sizeof(want),
	    "\"%s\";q=9223372036854775807;w=9223372036854776", name);
	ck_assert_str_eq(value_of(h, n, "RateLimit-Policy"), want);
	snprintf(want, sizeof(want),
	    "\"%s\";r=-9223372036854775808;t=9223372036854776", name);
	ck_assert_str_eq(value_of(h, n, "RateLimit"), want);
	ck_assert_str_eq(value_of(h, n, "Retry-After"), "9223372036854776");
	r.algorithm = RL_ALG_CONCURRENCY;
	n = rate_headers(&d, h);
	snprintf(want, sizeof(want),
	    "\"%s\";q=9223372036854775807;qu=\"concurrent-requests\"", name);
	ck_assert_str_eq(value_of(h, n, "RateLimit-Policy"), want);
}
END_TEST

/* A waited answer's times are from when it goes out, waited_ms after the
 * decision they were computed at, and never below 0 (docs/waiting.md). */
START_TEST(test_waited_times_from_now)
{
	char name[] = "tb";
	struct rule r = { .name = name,
		.limit = 2,
		.window_ms = 10000,
		.algorithm = RL_ALG_TOKEN_BUCKET };
	struct decision d = { .rule = &r,
		.allowed = true,
		.limit = 2,
		.remaining = 0,
		.reset_ms = 14974,
		.effective_ms = 9974,
		.waited_ms = 4974 };
	struct rate_header h[RATE_HEADERS_MAX];
	int n = rate_headers(&d, h);

	ck_assert_str_eq(value_of(h, n, "RateLimit"), "\"tb\";r=0;t=5");
	ck_assert_str_eq(value_of(h, n, "X-RateLimit-Reset"), "10");
	d.waited_ms = 20000;
	n = rate_headers(&d, h);
	ck_assert_str_eq(value_of(h, n, "RateLimit"), "\"tb\";r=0;t=0");
	ck_assert_str_eq(value_of(h, n, "X-RateLimit-Reset"), "0");
}
END_TEST

START_TEST(test_no_rule_no_headers)
{
	struct decision d = { .allowed = true };
	struct rate_header h[RATE_HEADERS_MAX];

	ck_assert_int_eq(rate_headers(&d, h), 0);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("rate_headers");
	TCase *tc = tcase_create("headers");

	tcase_add_test(tc, test_t_is_the_effective_window);
	tcase_add_test(tc, test_concurrency_policy);
	tcase_add_test(tc, test_numbers_written_whole);
	tcase_add_test(tc, test_longest_values_whole);
	tcase_add_test(tc, test_no_rule_no_headers);
	tcase_add_test(tc, test_waited_times_from_now);
	suite_add_tcase(s, tc);
	return s;
}
