/*
 * check_sketch.c - unit tests of sketch.c: the exact count, sum, min and
 * max, and the quantile guarantee of docs/stats.md checked against the
 * exact quantiles of the same data (sorted, rank floor(q * (n - 1))) on
 * skewed, bimodal, negative and zero-heavy data from a seeded generator;
 * and sketch_merge() against adding the buckets one at a time, folding
 * past the bound at each add (the order docs/stats.md says is the same).
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

/* The reference merge: src's buckets added to dst one at a time, the
 * lowest folded into the next whenever a set passes the bound. */
static void
ref_add(struct sketch_side *d, int32_t i, uint64_t n)
{
	uint32_t at = 0, hi = d->n;

	while (at < hi) { /* the first index >= i */
		uint32_t mid = at + (hi - at) / 2;

		if (d->b[mid].index < i)
			at = mid + 1;
		else
			hi = mid;
	}
	if (at < d->n && d->b[at].index == i) {
		d->b[at].count += n;
		return;
	}
	ck_assert_uint_lt(d->n, d->cap);
	memmove(d->b + at + 1, d->b + at, (d->n - at) * sizeof(*d->b));
	d->b[at].index = i;
	d->b[at].count = n;
	d->n++;
	if (d->n > SKETCH_MAX_BUCKETS) {
		d->b[1].count += d->b[0].count;
		memmove(d->b, d->b + 1, (d->n - 1) * sizeof(*d->b));
		d->n--;
	}
}

/* A side of n distinct random indices in [lo, lo + span), sorted, each
 * with a count of 1 to 1000. */
static void
random_side(struct sketch_side *d, uint32_t n, int32_t lo, uint32_t span)
{
	uint32_t k, m = 0;

	d->b = malloc((SKETCH_MAX_BUCKETS + 1) * sizeof(*d->b));
	d->cap = SKETCH_MAX_BUCKETS + 1;
	/* Each index of the span in turn, taken with probability n / span. */
	for (k = 0; k < span && m < n && m < SKETCH_MAX_BUCKETS; k++)
		if (uniform() * (double)(span - k) < (double)(n - m)) {
			d->b[m].index = lo + (int32_t)k;
			d->b[m].count = 1 + (uint64_t)(uniform() * 1000);
			m++;
		}
	d->n = m;
}

static void
random_sketch(struct sketch *s)
{
	uint32_t span = 1 + (uint32_t)(uniform() * 9000);
	uint32_t n = (uint32_t)(uniform() *
	    (double)(span < 4096 ? span : 4096));
	int32_t lo = (int32_t)(uniform() * 8000) - 4000;
	uint32_t k;

	sketch_init(s);
	random_side(&s->pos, n, lo, span);
	random_side(&s->neg, n / 3, -lo, span);
	for (k = 0; k < s->pos.n; k++)
		s->count += s->pos.b[k].count;
	for (k = 0; k < s->neg.n; k++)
		s->count += s->neg.b[k].count;
	s->zeros = (uint64_t)(uniform() * 3);
	s->count += s->zeros + 1;
	s->min = -1;
	s->max = 1;
}

static void
same_side(const struct sketch_side *a, const struct sketch_side *b)
{
	uint32_t k;

	ck_assert_uint_eq(a->n, b->n);
	for (k = 0; k < a->n; k++) {
		ck_assert_int_eq(a->b[k].index, b->b[k].index);
		ck_assert_uint_eq(a->b[k].count, b->b[k].count);
	}
}

/* Merging many random sketches (sometimes far past the bound, sometimes
 * overlapping, sometimes disjoint bands) gives exactly the buckets of
 * the one-at-a-time reference after every merge. */
START_TEST(test_merge_matches_reference)
{
	struct sketch acc, src;
	struct sketch_side rp, rn;
	int round, k, folded = 0;
	uint32_t j;

	rng_state = 0xdecafbad;
	for (round = 0; round < 10; round++) {
		sketch_init(&acc);
		memset(&rp, 0, sizeof(rp));
		memset(&rn, 0, sizeof(rn));
		rp.b = malloc((SKETCH_MAX_BUCKETS + 1) * sizeof(*rp.b));
		rn.b = malloc((SKETCH_MAX_BUCKETS + 1) * sizeof(*rn.b));
		rp.cap = rn.cap = SKETCH_MAX_BUCKETS + 1;
		for (k = 0; k < 10; k++) {
			random_sketch(&src);
			for (j = 0; j < src.pos.n; j++)
				ref_add(&rp, src.pos.b[j].index,
				    src.pos.b[j].count);
			for (j = 0; j < src.neg.n; j++)
				ref_add(&rn, src.neg.b[j].index,
				    src.neg.b[j].count);
			ck_assert_int_eq(sketch_merge(&acc, &src), 0);
			same_side(&acc.pos, &rp);
			same_side(&acc.neg, &rn);
			folded += acc.pos.n == SKETCH_MAX_BUCKETS;
			sketch_clear(&src);
		}
		free(rp.b);
		free(rn.b);
		sketch_clear(&acc);
	}
	ck_assert_int_gt(folded, 10); /* the bound was reached, often */
}
END_TEST

/* Two alternating bands of 4096 buckets each: the case that made a read
 * cost a memmove of the whole set per bucket.  The result keeps the upper
 * band, its lowest bucket holding every count of the lower one. */
START_TEST(test_merge_bands)
{
	struct sketch_params p;
	struct sketch lo, hi, acc;
	int k;

	ck_assert_int_eq(sketch_params_set(&p, 0.01), 0);
	sketch_init(&lo);
	sketch_init(&hi);
	sketch_init(&acc);
	for (k = 0; k < SKETCH_MAX_BUCKETS; k++) {
		ck_assert_int_eq(sketch_add(&lo, &p,
				     sketch_bucket_value(&p, k - 4096), 1),
		    0);
		ck_assert_int_eq(sketch_add(&hi, &p, sketch_bucket_value(&p, k),
				     1),
		    0);
	}
	ck_assert_uint_eq(lo.pos.n, SKETCH_MAX_BUCKETS);
	ck_assert_uint_eq(hi.pos.n, SKETCH_MAX_BUCKETS);
	for (k = 0; k < 101; k++)
		ck_assert_int_eq(sketch_merge(&acc, k % 2 ? &lo : &hi), 0);
	ck_assert_uint_eq(acc.count, 101 * SKETCH_MAX_BUCKETS);
	ck_assert_uint_eq(acc.pos.n, SKETCH_MAX_BUCKETS);
	ck_assert_int_eq(acc.pos.b[0].index, 0);
	ck_assert_uint_eq(acc.pos.b[0].count, 51 + 50 * SKETCH_MAX_BUCKETS);
	ck_assert_int_eq(acc.pos.b[SKETCH_MAX_BUCKETS - 1].index, 4095);
	ck_assert_uint_eq(acc.pos.b[SKETCH_MAX_BUCKETS - 1].count, 51);
	sketch_clear(&lo);
	sketch_clear(&hi);
	sketch_clear(&acc);
}
END_TEST

/* Out of memory in a merge leaves the target as it was, both signs. */
START_TEST(test_merge_oom)
{
	struct sketch_params p;
	struct sketch dst, src;
	int k;

	ck_assert_int_eq(sketch_params_set(&p, 0.01), 0);
	sketch_init(&dst);
	sketch_init(&src);
	/* dst: 8 buckets of each sign (both arrays full): the merge needs
	 * an allocation for each. */
	for (k = 0; k < 8; k++) {
		ck_assert_int_eq(sketch_add(&dst, &p, 1 << k, 1), 0);
		ck_assert_int_eq(sketch_add(&dst, &p, -(1 << k), 1), 0);
	}
	ck_assert_uint_eq(dst.pos.n, dst.pos.cap);
	ck_assert_uint_eq(dst.neg.n, dst.neg.cap);
	/* src: one bucket dst has, one it has not, in each sign. */
	ck_assert_int_eq(sketch_add(&src, &p, 1, 1), 0);
	ck_assert_int_eq(sketch_add(&src, &p, 1e6, 1), 0);
	ck_assert_int_eq(sketch_add(&src, &p, -1, 1), 0);
	ck_assert_int_eq(sketch_add(&src, &p, -1e6, 1), 0);
	/* The first allocation fails, then the second. */
	for (k = 0; k < 2; k++) {
		rl_alloc_fail_after(k);
		ck_assert_int_eq(sketch_merge(&dst, &src), -1);
		rl_alloc_fail_after(-1);
		ck_assert_uint_eq(dst.count, 16);
		ck_assert_uint_eq(dst.pos.n, 8);
		ck_assert_uint_eq(dst.pos.b[0].count, 1);
		ck_assert_uint_eq(dst.neg.n, 8);
		ck_assert_uint_eq(dst.neg.b[0].count, 1);
	}
	ck_assert_int_eq(sketch_merge(&dst, &src), 0);
	ck_assert_uint_eq(dst.count, 20);
	ck_assert_uint_eq(dst.pos.n, 9);
	ck_assert_uint_eq(dst.pos.b[0].count, 2);
	ck_assert_uint_eq(dst.neg.n, 9);
	ck_assert_uint_eq(dst.neg.b[0].count, 2);
	sketch_clear(&dst);
	sketch_clear(&src);
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
	tcase_add_test(tc, test_merge_matches_reference);
	tcase_add_test(tc, test_merge_bands);
	tcase_add_test(tc, test_merge_oom);
	suite_add_tcase(s, tc);
	return s;
}
