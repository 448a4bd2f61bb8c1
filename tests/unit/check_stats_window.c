/*
 * check_stats_window.c - unit tests of stats_window.c: which events a
 * window covers as time goes on (every event of the last W, none older
 * than W + R), on explicit times in milliseconds.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "check_main.h"

#include "core/stats_window.h"

#define T0 INT64_C(1700000000000) /* ms; a multiple of 1000 */

static struct stats_window_params
params(int64_t w, int64_t r)
{
	struct stats_window_params p;
	char err[128];

	ck_assert_int_eq(stats_window_params_set(&p, w, r, 0.01, err,
			     sizeof(err)),
	    0);
	return p;
}

static uint64_t
count_at(const struct stats_window *w, const struct stats_window_params *p,
    int64_t now, double *sum)
{
	struct sketch s;
	uint64_t n;

	sketch_init(&s);
	ck_assert_int_eq(stats_window_read(w, p, now, &s), 0);
	n = s.count;
	if (sum != NULL)
		*sum = s.sum;
	sketch_clear(&s);
	return n;
}

START_TEST(test_slides)
{
	struct stats_window_params p = params(1000, 100);
	struct stats_window w;
	double sum;

	stats_window_init(&w);
	ck_assert_uint_eq(p.nsub, 11);
	ck_assert_uint_eq(count_at(&w, &p, T0, NULL), 0);
	/* One event at T0 + 50 (sub-window T0/100), one at T0 + 450. */
	ck_assert_int_eq(stats_window_record(&w, &p, T0 + 50, 1.5), 0);
	ck_assert_int_eq(stats_window_record(&w, &p, T0 + 450, 2), 0);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 450, &sum), 2);
	ck_assert(sum == 3.5);
	/* At T0 + 1050 the first is exactly W old: still covered. */
	ck_assert_uint_eq(count_at(&w, &p, T0 + 1050, NULL), 2);
	/* At T0 + 1099 its sub-window [T0, T0 + 100) is still live
	 * (floor((T0 + 99) / 100) = T0 / 100): 1049 ms old < W + R. */
	ck_assert_uint_eq(count_at(&w, &p, T0 + 1099, NULL), 2);
	/* At T0 + 1100 it is gone. */
	ck_assert_uint_eq(count_at(&w, &p, T0 + 1100, &sum), 1);
	ck_assert(sum == 2);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 1500, NULL), 0);
	ck_assert(stats_window_expiry_ms(&w, &p) == T0 + 1500);
	stats_window_clear(&w);
}
END_TEST

START_TEST(test_ring_reuse)
{
	struct stats_window_params p = params(1000, 100);
	struct stats_window w;
	int64_t t;

	stats_window_init(&w);
	/* One event every 10 ms for 5 s: at each time exactly the events
	 * of the live sub-windows count (100 per full sub-window). */
	for (t = 0; t < 5000; t += 10) {
		ck_assert_int_eq(stats_window_record(&w, &p, T0 + t, 1), 0);
		if (t >= 1000 && t % 100 == 90)
			/* live: floor((t - 1000) / 100) .. floor(t / 100),
			 * 11 sub-windows, all full. */
			ck_assert_uint_eq(count_at(&w, &p, T0 + t, NULL), 110);
	}
	/* A long gap: slots still holding old sub-windows are ignored. */
	ck_assert_uint_eq(count_at(&w, &p, T0 + 5000 + 950, NULL), 10);
	ck_assert_int_eq(stats_window_record(&w, &p, T0 + 20000, 7), 0);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 20000, NULL), 1);
	stats_window_clear(&w);
}
END_TEST

START_TEST(test_params)
{
	struct stats_window_params p;
	struct stats_window w;
	char err[128];

	ck_assert_int_eq(stats_window_params_set(&p, 1000, 0, 0.01, err,
			     sizeof(err)),
	    -1);
	ck_assert_int_eq(stats_window_params_set(&p, 1000, 1001, 0.01, err,
			     sizeof(err)),
	    -1);
	ck_assert_int_eq(stats_window_params_set(&p, 100000, 1, 0.01, err,
			     sizeof(err)),
	    -1);
	ck_assert_int_eq(stats_window_params_set(&p, 1000, 100, 0.5, err,
			     sizeof(err)),
	    -1);
	/* Window 1 s, resolution 300 ms: ceil(10 / 3) + 1 = 5 slots. */
	p = params(1000, 300);
	ck_assert_uint_eq(p.nsub, 5);
	/* Params changed (a reload): the window starts empty. */
	stats_window_init(&w);
	ck_assert_int_eq(stats_window_record(&w, &p, T0, 1), 0);
	ck_assert_uint_eq(count_at(&w, &p, T0, NULL), 1);
	p = params(1000, 100);
	ck_assert_uint_eq(count_at(&w, &p, T0, NULL), 0);
	ck_assert_int_eq(stats_window_record(&w, &p, T0, 1), 0);
	ck_assert_uint_eq(count_at(&w, &p, T0, NULL), 1);
	stats_window_clear(&w);
	stats_window_clear(NULL);
}
END_TEST

/* Only the window changes (docs/stats.md "Reloads and limits"): the
 * sub-windows the old window still held move to the new ring; those it
 * had let go stay gone. */
START_TEST(test_window_change)
{
	struct stats_window_params p = params(10000, 1000);
	struct stats_window w;
	double sum;

	stats_window_init(&w);
	ck_assert_int_eq(stats_window_record(&w, &p, T0, 1), 0);
	ck_assert_int_eq(stats_window_record(&w, &p, T0 + 7000, 7), 0);
	ck_assert_int_eq(stats_window_record(&w, &p, T0 + 9000, 9), 0);
	/* At T0 + 11500 the window of 10 s has let the first go
	 * ((T0/1000 + 1) * 1000 + 10000 <= now).  Now 20 s: 21 slots. */
	p = params(20000, 1000);
	ck_assert_int_eq(stats_window_adapt(&w, &p, T0 + 11500), 0);
	ck_assert_uint_eq(w.nsub, 21);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 11500, &sum), 2);
	ck_assert(sum == 16);
	/* Live by the new window: 7 until T0 + 28000, 9 until T0 + 30000. */
	ck_assert_uint_eq(count_at(&w, &p, T0 + 27999, NULL), 2);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 28000, &sum), 1);
	ck_assert(sum == 9);
	ck_assert(stats_window_expiry_ms(&w, &p) == T0 + 30000);
	/* Back to 3 s at T0 + 11900: 7 was let go (dead at T0 + 11000
	 * under 3 s, and the ring is smaller), 9 is live until 13000. */
	ck_assert_int_eq(stats_window_record(&w, &p, T0 + 11900, 11), 0);
	p = params(3000, 1000);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 11900, NULL), 0); /* before */
	ck_assert_int_eq(stats_window_adapt(&w, &p, T0 + 11900), 0);
	ck_assert_uint_eq(w.nsub, 4);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 11900, &sum), 2);
	ck_assert(sum == 20);
	/* Another resolution: empty. */
	p = params(3000, 500);
	ck_assert_int_eq(stats_window_adapt(&w, &p, T0 + 11900), 0);
	ck_assert_uint_eq(count_at(&w, &p, T0 + 11900, NULL), 0);
	stats_window_clear(&w);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("stats_window");
	TCase *tc = tcase_create("stats_window");

	tcase_add_test(tc, test_slides);
	tcase_add_test(tc, test_ring_reuse);
	tcase_add_test(tc, test_params);
	tcase_add_test(tc, test_window_change);
	suite_add_tcase(s, tc);
	return s;
}
