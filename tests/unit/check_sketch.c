/*
 * check_sketch.c - unit tests of sketch.c: the exact count, sum, min and
 * max, and the quantile guarantee of docs/stats.md checked against the
 * exact quantiles of the same data (sorted, rank floor(q * (n - 1))) on
 * skewed, bimodal, negative and zero-heavy data from a seeded generator.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/sketch.h"
#include "base/util.h"

/* xorshift64*, seeded: the same data every run. */
static uint64_t rng_state;

static double
uniform(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (double)((rng_state * UINT64_C(2685821657736338717)) >> 11) /
	    9007199254740992.0;
}

static double
normal(void)
{
	double u = uniform(), v = uniform();

	if (u < 1e-300)
		u = 1e-300;
	return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static const double qs[] = { 0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99,
	0.999, 1 };

/* Add v[0..n-1], check the exact fields, then every quantile of qs
 * against the sorted data; returns the largest relative error seen. */
static double
check_data(double *v, size_t n, double a)
{
	struct sketch_params p;
	struct sketch s;
	double sum = 0, worst = 0;
	size_t k;

	ck_assert_int_eq(sketch_params_set(&p, a), 0);
	sketch_init(&s);
	for (k = 0; k < n; k++) {
		ck_assert_int_eq(sketch_add(&s, &p, v[k], 1), 0);
		sum += v[k];
	}
	qsort(v, n, sizeof(*v), cmp_double);
	ck_assert_uint_eq(s.count, n);
	ck_assert(s.min == v[0]);
	ck_assert(s.max == v[n - 1]);
	ck_assert(fabs(s.sum - sum) <= 1e-9 * fabs(sum) + 1e-9);
	for (k = 0; k < sizeof(qs) / sizeof(qs[0]); k++) {
		double truth = v[(size_t)floor(qs[k] * (double)(n - 1))];
		double got = sketch_quantile(&s, &p, qs[k]);
		double err = truth == 0 ? fabs(got) :
					  fabs(got - truth) / fabs(truth);

		if (truth == 0)
			ck_assert_msg(got == 0, "q %g: 0 expected, got %g",
			    qs[k], got);
		ck_assert_msg(err <= a * (1 + 1e-9),
		    "q %g: %g for %g "
		    "(error %g > %g)",
		    qs[k], got, truth, err, a);
		if (err > worst)
			worst = err;
	}
	sketch_clear(&s);
	return worst;
}

#define N 100000

START_TEST(test_lognormal)
{
	double *v = malloc(N * sizeof(*v));
	size_t k;

	rng_state = 0x9e3779b97f4a7c15u;
	for (k = 0; k < N; k++)
		v[k] = exp(3 + 1.5 * normal()); /* a latency in ms */
	check_data(v, N, 0.01);
	for (k = 0; k < N; k++)
		v[k] = exp(3 + 1.5 * normal());
	check_data(v, N, 0.001);
	free(v);
}
END_TEST

START_TEST(test_bimodal)
{
	double *v = malloc(N * sizeof(*v));
	size_t k;

	rng_state = 12345;
	/* 90% fast cache hits near 2 ms, 10% slow misses near 800 ms. */
	for (k = 0; k < N; k++)
		v[k] = uniform() < 0.9 ? 2 * exp(0.2 * normal()) :
					 800 * exp(0.3 * normal());
	check_data(v, N, 0.01);
	free(v);
}
END_TEST

START_TEST(test_negative_and_zero)
{
	double *v = malloc(N * sizeof(*v));
	size_t k;

	rng_state = 777;
	/* Balances: a third zero, the rest of either sign over six
	 * decades. */
	for (k = 0; k < N; k++) {
		double u = uniform();

		v[k] = u < 1.0 / 3 ?
		    0 :
		    (u < 2.0 / 3 ? -1 : 1) * pow(10, 6 * uniform() - 2);
	}
	check_data(v, N, 0.01);
	/* All negative. */
	for (k = 0; k < N; k++)
		v[k] = -exp(2 * normal());
	check_data(v, N, 0.02);
	/* All zero: every quantile exactly 0. */
	for (k = 0; k < 1000; k++)
		v[k] = 0;
	ck_assert(check_data(v, 1000, 0.01) == 0);
	free(v);
}
END_TEST

START_TEST(test_exact_fields)
{
	struct sketch_params p;
	struct sketch s, t, m;

	ck_assert_int_eq(sketch_params_set(&p, 0.01), 0);
	sketch_init(&s);
	sketch_init(&t);
	sketch_init(&m);
	ck_assert(sketch_quantile(&s, &p, 0.5) == 0);
	ck_assert_int_eq(sketch_add(&s, &p, 2.5, 1), 0);
	ck_assert_int_eq(sketch_add(&s, &p, -4, 2), 0);
	ck_assert_int_eq(sketch_add(&t, &p, 0, 1), 0);
	ck_assert_int_eq(sketch_add(&t, &p, 1000.25, 1), 0);
	ck_assert_int_eq(sketch_merge(&m, &s), 0);
	ck_assert_int_eq(sketch_merge(&m, &t), 0);
	ck_assert_uint_eq(m.count, 5);
	ck_assert_uint_eq(m.zeros, 1);
	ck_assert(m.sum == 2.5 - 8 + 1000.25);
	ck_assert(m.min == -4);
	ck_assert(m.max == 1000.25);
	/* Sorted: -4 -4 0 2.5 1000.25; rank floor(0.5 * 4) = 2 is 0. */
	ck_assert(sketch_quantile(&m, &p, 0.5) == 0);
	ck_assert(sketch_quantile(&m, &p, 0) == -4);
	ck_assert(sketch_quantile(&m, &p, 1) == 1000.25);
	ck_assert(fabs(sketch_quantile(&m, &p, 0.25) + 4) <= 0.04);
	/* {0, 1000.25}: rank floor(0.75 * 1) = 0 is 0.  One value: every
	 * quantile is it (clamped to min and max). */
	ck_assert(sketch_quantile(&t, &p, 0.75) == 0);
	sketch_clear(&t);
	ck_assert_int_eq(sketch_add(&t, &p, 1000.25, 1), 0);
	ck_assert(sketch_quantile(&t, &p, 0.75) == 1000.25);
	sketch_clear(&s);
	sketch_clear(&t);
	sketch_clear(&m);
	sketch_clear(NULL);
}
END_TEST

START_TEST(test_mapping)
{
	struct sketch_params p;
	int32_t i;

	ck_assert_int_eq(sketch_params_set(&p, 0.00009), -1);
	ck_assert_int_eq(sketch_params_set(&p, 0.11), -1);
	ck_assert_int_eq(sketch_params_set(&p, NAN), -1);
	ck_assert_int_eq(sketch_params_set(&p, 0.01), 0);
	/* gamma = 1.01 / 0.99; 1 is bucket 0, which stands for
	 * 2 / (gamma + 1) = 0.99. */
	ck_assert_int_eq(sketch_index(&p, 1), 0);
	ck_assert(fabs(sketch_bucket_value(&p, 0) - 0.99) < 1e-12);
	ck_assert_int_eq(sketch_index(&p, 1.01), 1);
	/* Every bucket's value is within a of both its ends. */
	for (i = -2000; i <= 2000; i += 7) {
		double lo = pow(p.gamma, i - 1), hi = pow(p.gamma, i);
		double r = sketch_bucket_value(&p, i);

		ck_assert(fabs(r - lo) / lo <= 0.01 * (1 + 1e-9));
		ck_assert(fabs(r - hi) / hi <= 0.01 * (1 + 1e-9));
	}
	/* Extremes stay finite and ordered. */
	ck_assert(sketch_index(&p, 1e-300) < sketch_index(&p, 1e300));
	ck_assert(sketch_index(&p, 4.9e-324) < 0);
}
END_TEST

START_TEST(test_bucket_bound)
{
	struct sketch_params p;
	struct sketch s;
	int k;

	/* 0.0001: gamma^4096 is only ~2.27, so values over 1e-6 .. 1e6
	 * overflow the bound; the lowest buckets are folded upward, the
	 * count stays exact, and the top quantiles keep their guarantee. */
	ck_assert_int_eq(sketch_params_set(&p, 0.0001), 0);
	sketch_init(&s);
	for (k = 0; k < 200000; k++)
		ck_assert_int_eq(sketch_add(&s, &p,
				     pow(10, -6 + 12.0 * k / 200000), 1),
		    0);
	ck_assert_uint_le(s.pos.n, SKETCH_MAX_BUCKETS);
	ck_assert_uint_eq(s.count, 200000);
	/* Rank floor(0.9999 * 199999) = 199979. */
	ck_assert(fabs(sketch_quantile(&s, &p, 0.9999) /
			  pow(10, -6 + 12.0 * 199979 / 200000) -
		      1) <= 0.0001 * (1 + 1e-9));
	sketch_clear(&s);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("sketch");
	TCase *tc = tcase_create("sketch");

	tcase_add_test(tc, test_mapping);
	tcase_add_test(tc, test_exact_fields);
	tcase_add_test(tc, test_lognormal);
	tcase_add_test(tc, test_bimodal);
	tcase_add_test(tc, test_negative_and_zero);
	tcase_add_test(tc, test_bucket_bound);
	suite_add_tcase(s, tc);
	return s;
}
