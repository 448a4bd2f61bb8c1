/*
 * accuracy.c - how far each algorithm's decisions are from an exact
 * sliding window, measured on synthetic request traces.  `make accuracy`
 * builds and runs it; docs/algorithms.md ("Measured") holds its output.
 *
 * Every trace is replayed, key by key, through each algorithm of
 * limiter.h (the in-process limiter, with the trace's times as its clock:
 * tests/vectors/algorithms.txt shows it answers as lua/ratelimit.lua does),
 * through an exact limiter kept here (a brute-force sliding log: the
 * admitted times of the key, counted over (t - W, t]), and through the
 * published two-window approximation (the previous fixed window's count
 * weighted by its overlap with the sliding window, plus the current
 * one's), which is the baseline sliding_window is compared with.  limiter.c
 * fixes sliding_window's B at 20, so B = 20 is what is measured; the tool
 * does not carry a copy of the algorithm to vary it.
 *
 * For each algorithm the tool keeps the exact log of what that algorithm
 * itself admitted, and judges each of its decisions against it:
 *   wrong allow  admitted although the trailing window (t - W, t] already
 *                held L units it had admitted (so it now holds L + 1);
 *   wrong deny   denied although that window held fewer than L;
 *   rate error   |(L - remaining) - exact| / L after the request: the
 *                usage the algorithm reports against the units really in
 *                the trailing window, averaged over all requests;
 *   peak         the most units in any window of length W, over L;
 *   vs exact     units admitted over units the exact limiter admits on the
 *                same trace.
 * Shares are of all requests of the trace.  Every request costs 1.
 *
 * The traces are generated from fixed seeds, so every run prints the same
 * numbers.  Pure computation; no arguments, no files, no network.
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/limiter.h"

#define LIMIT 100			/* L */
#define WINDOW_MS 1000			/* W */
#define W_US (WINDOW_MS * INT64_C(1000))
#define T0 INT64_C(1700000000000000)	/* 2023-11-14, a multiple of W */
#define SEC INT64_C(1000000)

/* --- traces ------------------------------------------------------------- */

/* Arrival times of one key, microseconds after T0, non-decreasing. */
struct times {
	int64_t *t;
	size_t n, cap;
};

static void
times_push(struct times *ts, int64_t t)
{
	if (ts->n == ts->cap) {
		ts->cap = ts->cap == 0 ? 1024 : 2 * ts->cap;
		ts->t = realloc(ts->t, ts->cap * sizeof(*ts->t));
		if (ts->t == NULL) {
			fprintf(stderr, "accuracy: out of memory\n");
			exit(EXIT_FAILURE);
		}
	}
	ts->t[ts->n++] = t;
}

/* splitmix64: small, seedable, good enough for arrival times. */
static uint64_t
rng_next(uint64_t *s)
{
	uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double
rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* Poisson arrivals at `rate` per second over [0, dur). */
static void
poisson(struct times *ts, uint64_t *s, double rate, int64_t dur)
{
	double t = 0;

	for (;;) {
		t += -log(1.0 - rng_unit(s)) / rate * (double)SEC;
		if (t >= (double)dur)
			return;
		times_push(ts, (int64_t)t);
	}
}

/* Evenly spaced at twice the limit's rate, at a random phase per key. */
static void
gen_steady(struct times *ts, uint64_t *s)
{
	int64_t period = W_US / (2 * LIMIT), t;

	for (t = (int64_t)(rng_unit(s) * (double)W_US); t < 30 * SEC;
	    t += period)
		times_push(ts, t);
}

/* L requests spread evenly over d before each window edge (a multiple of
 * W, where fixed windows start) and L over d after it; d is 5..100 ms per
 * key. */
static void
gen_edges(struct times *ts, uint64_t *s)
{
	int64_t d = 5000 + (int64_t)(rng_unit(s) * 95000.0), e, k;

	for (e = W_US; e < 30 * SEC; e += W_US)
		for (k = -LIMIT; k < LIMIT; k++)
			times_push(ts, e + k * d / LIMIT);
}

/* Poisson, rate log-uniform in 0.1 .. 4 times the limit. */
static void
gen_keys(struct times *ts, uint64_t *s)
{
	double u = exp(log(0.1) + rng_unit(s) * (log(4.0) - log(0.1)));

	poisson(ts, s, u * LIMIT * 1000.0 / WINDOW_MS, 30 * SEC);
}

/* Poisson, rate log-uniform in 0.01 .. 1.2 times the limit: most keys
 * well below it, as most clients of a real service are. */
static void
gen_light(struct times *ts, uint64_t *s)
{
	double u = exp(log(0.01) + rng_unit(s) * (log(1.2) - log(0.01)));

	poisson(ts, s, u * LIMIT * 1000.0 / WINDOW_MS, 30 * SEC);
}

/* Poisson, rate uniform in 0.9 .. 1.1 times the limit. */
static void
gen_near(struct times *ts, uint64_t *s)
{
	double u = 0.9 + 0.2 * rng_unit(s);

	poisson(ts, s, u * LIMIT * 1000.0 / WINDOW_MS, 60 * SEC);
}

struct trace {
	const char *name;
	const char *what;
	int nkeys;
	uint64_t seed;
	void (*gen)(struct times *, uint64_t *);
};

static const struct trace traces[] = {
	{ "steady_2x", "evenly spaced at 2L/W, random phase, 30 s",
	    100, 1, gen_steady },
	{ "edge_bursts", "L in d before and L in d after each window edge, "
	    "d = 5..100 ms, 30 s", 100, 2, gen_edges },
	{ "poisson_keys", "Poisson, rate 0.1..4 L/W (log-uniform) per key, "
	    "30 s", 1000, 3, gen_keys },
	{ "near_limit", "Poisson, rate 0.9..1.1 L/W per key, 60 s",
	    200, 4, gen_near },
	{ "light_mix", "Poisson, rate 0.01..1.2 L/W (log-uniform) per key, "
	    "30 s", 2000, 5, gen_light },
};

/* --- the exact log ------------------------------------------------------ */

/* Admitted times of one key; [head, n) are inside the window. */
struct exact {
	int64_t *t;
	size_t head, n, cap;
};

/* Units admitted in (now - W, now]. */
static int64_t
exact_count(struct exact *x, int64_t now)
{
	while (x->head < x->n && x->t[x->head] <= now - W_US)
		x->head++;
	return (int64_t)(x->n - x->head);
}

static void
exact_add(struct exact *x, int64_t now)
{
	if (x->n == x->cap) {
		if (x->head > 0) {
			memmove(x->t, x->t + x->head, (x->n - x->head) *
			    sizeof(*x->t));
			x->n -= x->head;
			x->head = 0;
		} else {
			x->cap = x->cap == 0 ? 4 * LIMIT : 2 * x->cap;
			x->t = realloc(x->t, x->cap * sizeof(*x->t));
			if (x->t == NULL) {
				fprintf(stderr, "accuracy: out of memory\n");
				exit(EXIT_FAILURE);
			}
		}
	}
	x->t[x->n++] = now;
}

/* --- the two-window baseline -------------------------------------------- */

/* Counts of the current fixed window (starting at `start`) and of the one
 * before it; estimate = prev * (W - (now - start)) / W + cur. */
struct two_window {
	int64_t start, cur, prev;
};

static bool
two_window_take(struct two_window *tw, int64_t now, int64_t *remaining)
{
	int64_t start = now - now % W_US;
	double est, rem;
	bool allowed;

	if (start != tw->start) {
		tw->prev = start == tw->start + W_US ? tw->cur : 0;
		tw->cur = 0;
		tw->start = start;
	}
	est = (double)tw->prev * (double)(W_US - (now - start)) /
	    (double)W_US + (double)tw->cur;
	allowed = est + 1 <= LIMIT;
	if (allowed) {
		tw->cur++;
		est += 1;
	}
	rem = floor(LIMIT - est);	/* as sliding_window reports it */
	*remaining = rem <= 0 ? 0 : (int64_t)rem;
	return allowed;
}

/* --- the measurement ---------------------------------------------------- */

enum alg {
	A_EXACT, A_LOG, A_WINDOW, A_TWO, A_FIXED, A_BUCKET, NALG
};

static const char *const alg_names[NALG] = {
	"exact (reference)", "sliding_log", "sliding_window B=20",
	"two-window (baseline)", "fixed_window", "token_bucket",
};

struct stats {
	int64_t requests, admitted, wrong_allow, wrong_deny, peak;
	double err_sum;
};

/* One key's arrivals through algorithm a; adds to *st. */
static void
run_key(enum alg a, const struct times *ts, struct exact *x,
    struct stats *st)
{
	static const enum rl_algorithm lim[NALG] = {
		[A_LOG] = RL_ALG_SLIDING_LOG,
		[A_WINDOW] = RL_ALG_SLIDING_WINDOW,
		[A_FIXED] = RL_ALG_FIXED_WINDOW,
		[A_BUCKET] = RL_ALG_TOKEN_BUCKET,
	};
	struct limiter_params p;
	struct limiter_state ls;
	struct two_window tw = { INT64_MIN, 0, 0 };
	struct rl_result r;
	char err[128];
	int64_t now, before, after, remaining;
	bool allowed;
	size_t k;

	if (limiter_params_set(&p, lim[a], LIMIT, WINDOW_MS, err,
	    sizeof(err)) == -1) {
		fprintf(stderr, "accuracy: %s\n", err);
		exit(EXIT_FAILURE);
	}
	limiter_state_init(&ls, lim[a]);
	x->head = x->n = 0;
	for (k = 0; k < ts->n; k++) {
		now = T0 + ts->t[k];
		before = exact_count(x, now);
		switch (a) {
		case A_EXACT:
			allowed = before + 1 <= LIMIT;
			remaining = LIMIT - before - (allowed ? 1 : 0);
			break;
		case A_TWO:
			allowed = two_window_take(&tw, now, &remaining);
			break;
		default:
			if (limiter_take(&ls, &p, now, 1, &r, err,
			    sizeof(err)) == -1) {
				fprintf(stderr, "accuracy: %s\n", err);
				exit(EXIT_FAILURE);
			}
			allowed = r.allowed;
			remaining = r.remaining;
			break;
		}
		if (allowed)
			exact_add(x, now);
		after = before + (allowed ? 1 : 0);
		st->requests++;
		if (allowed) {
			st->admitted++;
			if (before + 1 > LIMIT)
				st->wrong_allow++;
		} else if (before + 1 <= LIMIT) {
			st->wrong_deny++;
		}
		st->err_sum += fabs((double)(LIMIT - remaining - after)) /
		    LIMIT;
		if (after > st->peak)
			st->peak = after;
	}
	limiter_state_clear(&ls);
}

static double
pct(int64_t part, int64_t whole)
{
	return whole == 0 ? 0 : 100.0 * (double)part / (double)whole;
}

static void
run_trace(const struct trace *tr)
{
	struct stats st[NALG];
	struct times ts = { 0 };
	struct exact x = { 0 };
	uint64_t seed;
	int key, a;

	memset(st, 0, sizeof(st));
	for (key = 0; key < tr->nkeys; key++) {
		seed = tr->seed * UINT64_C(1000003) + (uint64_t)key;
		ts.n = 0;
		tr->gen(&ts, &seed);
		for (a = 0; a < NALG; a++)
			run_key((enum alg)a, &ts, &x, &st[a]);
	}
	printf("\n%s: %s; %d keys, %" PRId64 " requests\n\n", tr->name,
	    tr->what, tr->nkeys, st[0].requests);
	printf("| algorithm | admitted | vs exact | wrong allow | "
	    "wrong deny | rate error | peak |\n");
	printf("|---|---:|---:|---:|---:|---:|---:|\n");
	for (a = 0; a < NALG; a++)
		printf("| %s | %.2f%% | %.4f | %.4f%% | %.4f%% | %.3f%% | "
		    "%.2f |\n", alg_names[a],
		    pct(st[a].admitted, st[a].requests),
		    (double)st[a].admitted / (double)st[A_EXACT].admitted,
		    pct(st[a].wrong_allow, st[a].requests),
		    pct(st[a].wrong_deny, st[a].requests),
		    100.0 * st[a].err_sum / (double)st[a].requests,
		    (double)st[a].peak / LIMIT);
	free(ts.t);
	free(x.t);
}

int
main(void)
{
	struct timespec t0, t1;
	size_t i;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	printf("accuracy: L = %d per %d ms, cost 1, sliding_window B = %d; "
	    "shares are of all requests\n", LIMIT, WINDOW_MS,
	    LIMITER_SW_BUCKETS);
	for (i = 0; i < sizeof(traces) / sizeof(traces[0]); i++)
		run_trace(&traces[i]);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr, "\naccuracy: %.1f s\n", (double)(t1.tv_sec -
	    t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	return EXIT_SUCCESS;
}
