/*
 * check_wait_memory.c - unit tests of waiting for a turn (docs/waiting.md,
 * docs/algorithms.md "Waiting for a turn") on the in-process store: the
 * reserved times of many waiters respect each limit exactly (sliding_log
 * over every window, fixed_window per window, token_bucket's spacing), in
 * arrival order; sliding_window never waits; a request that cannot fit
 * within its wait records nothing; several rules agree on one time.  The
 * clock is injected.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"

#include "core/backend.h"
#include "base/util.h"
#include "store/memory.h"

#define T0  INT64_C(1700000000000000)
#define MS  INT64_C(1000)
#define SEC INT64_C(1000000)

static int64_t fake_now = T0;

static void
call_done(struct backend_call *call)
{
	(void)call;
}

static struct rl_check
mkcheck(enum rl_algorithm alg, int64_t limit, int64_t window_ms, int64_t cost,
    const char *key)
{
	struct rl_check c;

	memset(&c, 0, sizeof(c));
	c.algorithm = alg;
	c.limit = limit;
	c.window_ms = window_ms;
	c.cost = cost;
	c.key = key;
	c.keylen = strlen(key);
	return c;
}

/* One call waiting up to wait_us: the absolute admitted time, or -1 when
 * denied. */
static int64_t
acquire(struct backend *b, const struct rl_check *c, size_t n, int64_t wait_us)
{
	struct rl_result out[4];
	struct backend_call call;

	memset(&call, 0, sizeof(call));
	call.checks = c;
	call.n = n;
	call.out = out;
	call.wait_us = wait_us;
	call.done = call_done;
	backend_submit(b, &call);
	ck_assert_msg(call.rc == 0, "decide: %s", call.err);
	if (!call.all_allowed)
		return -1;
	return fake_now + call.waited_us;
}

/* Admitted times of `count` waiters arriving `gap` apart. */
static void
admit_many(struct backend *b, const struct rl_check *c, size_t n, int count,
    int64_t gap, int64_t wait_us, int64_t *at)
{
	int i;

	for (i = 0; i < count; i++) {
		at[i] = acquire(b, c, n, wait_us);
		fake_now += gap;
	}
}

/* Most admitted in any half-open (x - w, x], over every x at an admitted
 * time (where the count can reach its maximum). */
static int
most_in_window(const int64_t *at, int count, int64_t w)
{
	int i, j, k, best = 0;

	for (i = 0; i < count; i++) {
		if (at[i] < 0)
			continue;
		k = 0;
		for (j = 0; j < count; j++)
			if (at[j] >= 0 && at[j] > at[i] - w && at[j] <= at[i])
				k++;
		if (k > best)
			best = k;
	}
	return best;
}

START_TEST(test_log_exact_in_order)
{
	struct backend *b = backend_memory_new(0, test_clock, &fake_now);
	struct rl_check c = mkcheck(RL_ALG_SLIDING_LOG, 3, 1000, 1, "log");
	int64_t at[20];
	int i;

	fake_now = T0;
	admit_many(b, &c, 1, 20, 7 * MS, 30 * SEC, at);
	for (i = 0; i < 20; i++) {
		ck_assert_int_ge(at[i], 0);
		if (i > 0) /* first come, first served */
			ck_assert_int_ge(at[i], at[i - 1]);
	}
	/* Three at once, then three a window later, and so on. */
	ck_assert_int_eq(at[3], at[0] + SEC);
	ck_assert_int_eq(at[19], at[18 - 2] + SEC);
	ck_assert_int_eq(most_in_window(at, 20, SEC), 3);
	/* A plain request now is denied: the waiters come first. */
	ck_assert_int_eq(acquire(b, &c, 1, 0), -1);
	backend_free(b);
}
END_TEST

START_TEST(test_fixed_per_window)
{
	struct backend *b = backend_memory_new(0, test_clock, &fake_now);
	struct rl_check c = mkcheck(RL_ALG_FIXED_WINDOW, 4, 1000, 1, "fw");
	int64_t at[18], w, cnt;
	int i, j;

	fake_now = T0 + 100 * MS;
	admit_many(b, &c, 1, 18, 3 * MS, 30 * SEC, at);
	for (i = 0; i < 18; i++) {
		ck_assert_int_ge(at[i], 0);
		if (i > 0)
			ck_assert_int_ge(at[i], at[i - 1]);
		w = at[i] - at[i] % SEC;
		for (cnt = 0, j = 0; j < 18; j++)
			if (at[j] - at[j] % SEC == w)
				cnt++;
		ck_assert_int_le(cnt, 4);
	}
	/* Reservations past the first window land at window starts. */
	ck_assert_int_eq(at[4] % SEC, 0);
	ck_assert_int_eq(at[8], at[4] + SEC);
	ck_assert_int_eq(acquire(b, &c, 1, 0), -1);
	backend_free(b);
}
END_TEST

START_TEST(test_bucket_spacing)
{
	struct backend *b = backend_memory_new(0, test_clock, &fake_now);
	struct rl_check c = mkcheck(RL_ALG_TOKEN_BUCKET, 5, 1000, 1, "tb");
	int64_t at[25];
	int i;

	fake_now = T0;
	admit_many(b, &c, 1, 25, 0, 30 * SEC, at);
	for (i = 0; i < 25; i++) {
		ck_assert_int_ge(at[i], 0);
		if (i >= 6) { /* after the burst, one per W / L (GCRA's
			       * tolerance is 1 us) */
			ck_assert_int_ge(at[i] - at[i - 1], 200 * MS - 1);
			ck_assert_int_le(at[i] - at[i - 1], 200 * MS + 1);
		}
	}
	/* The burst of L at once, then the refill rate: never sooner. */
	ck_assert_int_eq(at[4], T0);
	ck_assert_int_ge(at[5], T0 + 200 * MS - 1);
	backend_free(b);
}
END_TEST

START_TEST(test_sliding_window_never_waits)
{
	struct backend *b = backend_memory_new(0, test_clock, &fake_now);
	struct rl_check c = mkcheck(RL_ALG_SLIDING_WINDOW, 2, 1000, 1, "sw");

	fake_now = T0;
	ck_assert_int_eq(acquire(b, &c, 1, 5 * SEC), T0);
	ck_assert_int_eq(acquire(b, &c, 1, 5 * SEC), T0);
	ck_assert_int_eq(acquire(b, &c, 1, 5 * SEC), -1);
	backend_free(b);
}
END_TEST

START_TEST(test_too_long_records_nothing)
{
	struct backend *b = backend_memory_new(0, test_clock, &fake_now);
	struct rl_check c = mkcheck(RL_ALG_SLIDING_LOG, 1, 1000, 1, "one");

	fake_now = T0;
	ck_assert_int_eq(acquire(b, &c, 1, 0), T0);
	/* Fits in 1 s; 999 ms is not enough, and takes nothing. */
	ck_assert_int_eq(acquire(b, &c, 1, 999 * MS), -1);
	ck_assert_int_eq(acquire(b, &c, 1, 1000 * MS), T0 + SEC);
	ck_assert_int_eq(acquire(b, &c, 1, 1500 * MS), -1);
	ck_assert_int_eq(acquire(b, &c, 1, 2000 * MS), T0 + 2 * SEC);
	backend_free(b);
}
END_TEST

START_TEST(test_rules_agree)
{
	struct backend *b = backend_memory_new(0, test_clock, &fake_now);
	struct rl_check c[2] = {
		mkcheck(RL_ALG_SLIDING_LOG, 2, 1000, 1, "a"),
		mkcheck(RL_ALG_FIXED_WINDOW, 3, 1500, 1, "b"),
	};
	int64_t at[12], w, cnt;
	int i, j;

	fake_now = T0;
	admit_many(b, c, 2, 12, MS, 60 * SEC, at);
	for (i = 0; i < 12; i++) {
		ck_assert_int_ge(at[i], 0);
		if (i > 0)
			ck_assert_int_ge(at[i], at[i - 1]);
		w = at[i] - at[i] % (1500 * MS);
		for (cnt = 0, j = 0; j < 12; j++)
			if (at[j] - at[j] % (1500 * MS) == w)
				cnt++;
		ck_assert_int_le(cnt, 3);
	}
	ck_assert_int_le(most_in_window(at, 12, SEC), 2);
	backend_free(b);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("wait_memory");
	TCase *tc = tcase_create("wait");

	tcase_add_test(tc, test_log_exact_in_order);
	tcase_add_test(tc, test_fixed_per_window);
	tcase_add_test(tc, test_bucket_spacing);
	tcase_add_test(tc, test_sliding_window_never_waits);
	tcase_add_test(tc, test_too_long_records_nothing);
	tcase_add_test(tc, test_rules_agree);
	suite_add_tcase(s, tc);
	return s;
}
