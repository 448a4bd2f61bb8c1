/*
 * check_limiter.c - unit tests of limiter.c, the four algorithms of
 * docs/algorithms.md on one key's state, with explicit times, and the
 * earliest time a concurrency check admits a request that waits for its
 * turn.
 *
 * Every expected number is worked out by hand from docs/algorithms.md in
 * the comment next to it, never copied from the implementation's output.
 * Times are microseconds at a realistic epoch magnitude: T0 is 2023-11-14,
 * a multiple of 40 s, so fixed windows of 1, 10 and 20 s and sliding_window
 * buckets of 1 s start exactly on it.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/limiter.h"
#include "base/util.h"

#define T0  INT64_C(1700000000000000)
#define MS  INT64_C(1000)
#define SEC INT64_C(1000000)

static struct limiter_params
params(enum rl_algorithm alg, int64_t limit, int64_t window_ms)
{
	struct limiter_params p;
	char err[128];

	ck_assert_int_eq(limiter_params_set(&p, alg, limit, window_ms, err,
			     sizeof(err)),
	    0);
	return p;
}

static struct rl_result
take(struct limiter_state *s, const struct limiter_params *p, int64_t now,
    int64_t cost)
{
	struct rl_result r;
	char err[128];

	memset(&r, 0xa5, sizeof(r));
	ck_assert_int_eq(limiter_take(s, p, now, cost, &r, err, sizeof(err)),
	    0);
	return r;
}

/* Assert one call's four results. */
#define ck_take(s, p, now, cost, allowed_, remaining_, reset_, retry_) \
	do { \
		struct rl_result r_ = take((s), (p), (now), (cost)); \
		ck_assert_msg(r_.allowed == (allowed_), "allowed %d, want %d", \
		    (int)r_.allowed, (int)(allowed_)); \
		ck_assert_int_eq(r_.remaining, (remaining_)); \
		ck_assert_int_eq(r_.reset_ms, (reset_)); \
		ck_assert_int_eq(r_.retry_after_ms, (retry_)); \
	} while (0)

/* A deterministic generator for the property tests. */
static uint64_t rng_state = 88172645463325252ULL;

static uint64_t
rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* --- sliding_log ------------------------------------------------------- */

START_TEST(test_log_exact_limit)
{
	struct limiter_params p = params(RL_ALG_SLIDING_LOG, 3, 10000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	/* reset = ceil_ms(newest + W - now) = 10 s right after a record */
	ck_take(&s, &p, T0, 1, true, 2, 10000, 0);
	ck_take(&s, &p, T0 + 2 * SEC, 1, true, 1, 10000, 0);
	ck_take(&s, &p, T0 + 4 * SEC, 1, true, 0, 10000, 0);
	/* used 3, k = 3 + 1 - 3 = 1: the oldest unit (T0) must expire:
	 * retry = ceil_ms(T0 + 10 s - (T0 + 5 s)) = 5000;
	 * reset = ceil_ms(T0 + 4 s + 10 s - (T0 + 5 s)) = 9000 */
	ck_take(&s, &p, T0 + 5 * SEC, 1, false, 0, 9000, 5000);
	/* 1 us before T0's unit expires: retry = ceil_ms(1) = 1;
	 * reset = ceil_ms(4 s + 1 us) = 4001 */
	ck_take(&s, &p, T0 + 10 * SEC - 1, 1, false, 0, 4001, 1);
	/* at T0 + 10 s, T0 <= now - W: dropped, used 2, allowed */
	ck_take(&s, &p, T0 + 10 * SEC, 1, true, 0, 10000, 0);
	/* again: the oldest is now T0 + 2 s: retry = 12 s - 10 s = 2000 */
	ck_take(&s, &p, T0 + 10 * SEC, 1, false, 0, 10000, 2000);
	limiter_state_clear(&s);
}
END_TEST

START_TEST(test_log_sliding_not_fixed)
{
	struct limiter_params p = params(RL_ALG_SLIDING_LOG, 3, 10000);
	struct limiter_params pf = params(RL_ALG_FIXED_WINDOW, 3, 10000);
	struct limiter_state s, f;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	limiter_state_init(&f, RL_ALG_FIXED_WINDOW);
	ck_take(&s, &p, T0 + 6 * SEC, 1, true, 2, 10000, 0);
	ck_take(&s, &p, T0 + 7 * SEC, 1, true, 1, 10000, 0);
	ck_take(&s, &p, T0 + 8 * SEC, 1, true, 0, 10000, 0);
	(void)take(&f, &pf, T0 + 6 * SEC, 1);
	(void)take(&f, &pf, T0 + 7 * SEC, 1);
	(void)take(&f, &pf, T0 + 8 * SEC, 1);
	/* 1 us after the fixed boundary T0 + 10 s a fixed window allows
	 * (new window: remaining 2, reset = ceil_ms(10 s - 1 us) = 10000),
	 * the log does not: (T0 + 1 us, T0 + 10 s + 1 us] holds 3 units.
	 * k = 1, oldest T0 + 6 s: retry = ceil_ms(6 s - 1 us) = 6000;
	 * reset = ceil_ms(T0 + 18 s - (T0 + 10 s + 1 us)) = 8000 */
	ck_take(&f, &pf, T0 + 10 * SEC + 1, 1, true, 2, 10000, 0);
	ck_take(&s, &p, T0 + 10 * SEC + 1, 1, false, 0, 8000, 6000);
	ck_take(&s, &p, T0 + 16 * SEC - 1, 1, false, 0, 2001, 1);
	/* T0 + 6 s expires at T0 + 16 s */
	ck_take(&s, &p, T0 + 16 * SEC, 1, true, 0, 10000, 0);
	limiter_state_clear(&s);
	limiter_state_clear(&f);
}
END_TEST

START_TEST(test_log_cost)
{
	struct limiter_params p = params(RL_ALG_SLIDING_LOG, 5, 1000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	ck_take(&s, &p, T0, 3, true, 2, 1000, 0);
	/* used 3 + 3 > 5; k = 3 + 3 - 5 = 1 -> T0:
	 * retry = reset = ceil_ms(T0 + 1 s - (T0 + 100 ms)) = 900 */
	ck_take(&s, &p, T0 + 100 * MS, 3, false, 2, 900, 900);
	ck_take(&s, &p, T0 + 200 * MS, 2, true, 0, 1000, 0);
	/* units T0 x3, T0+200ms x2; k = 5 + 4 - 5 = 4 -> T0 + 200 ms:
	 * retry = ceil_ms(T0 + 1.2 s - (T0 + 300 ms)) = 900, reset 900 */
	ck_take(&s, &p, T0 + 300 * MS, 4, false, 0, 900, 900);
	/* at T0 + 1 s the three T0 units are gone: used 2, 2 + 4 > 5;
	 * k = 2 + 4 - 5 = 1 -> T0 + 200 ms: retry = reset = 200 */
	ck_take(&s, &p, T0 + SEC, 4, false, 3, 200, 200);
	ck_take(&s, &p, T0 + 1200 * MS, 4, true, 1, 1000, 0);
	limiter_state_clear(&s);

	/* cost == L on an empty log */
	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	ck_take(&s, &p, T0, 5, true, 0, 1000, 0);
	/* k = 5 + 1 - 5 = 1 -> T0: retry = 1000 - 1 ms = 999 */
	ck_take(&s, &p, T0 + MS, 1, false, 0, 999, 999);
	limiter_state_clear(&s);
}
END_TEST

START_TEST(test_log_cost_zero)
{
	struct limiter_params p = params(RL_ALG_SLIDING_LOG, 2, 1000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	/* nothing used: remaining L, reset 0, and nothing stored */
	ck_take(&s, &p, T0, 0, true, 2, 0, 0);
	ck_assert(limiter_expiry(&s, &p) == INT64_MIN);
	ck_assert_uint_eq(limiter_state_bytes(&s), sizeof(s));
	ck_take(&s, &p, T0, 1, true, 1, 1000, 0);
	ck_take(&s, &p, T0, 1, true, 0, 1000, 0);
	/* used 2 + 0 <= 2: allowed, reports; reset = 1 s - 500 ms */
	ck_take(&s, &p, T0 + 500 * MS, 0, true, 0, 500, 0);
	ck_take(&s, &p, T0 + 500 * MS, 0, true, 0, 500, 0);
	/* the cost-0 calls recorded nothing: k = 1 -> T0, retry 500 */
	ck_take(&s, &p, T0 + 500 * MS, 1, false, 0, 500, 500);
	ck_take(&s, &p, T0 + SEC, 2, true, 0, 1000, 0);
	limiter_state_clear(&s);
}
END_TEST

/* A steady stream at exactly L per W never trips the limit, and the ring
 * wraps around many times without growing past L runs. */
START_TEST(test_log_ring_wraps)
{
	struct limiter_params p = params(RL_ALG_SLIDING_LOG, 100, 1000);
	struct limiter_state s;
	struct rl_result r;
	int64_t k, now = T0;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	for (k = 0; k < 500; k++) {
		now = T0 + k * 10 * MS;
		/* units at now - 1 s (k - 100) have just expired, so at
		 * most 99 are kept: allowed, remaining 100 - min(k + 1, 100) */
		r = take(&s, &p, now, 1);
		ck_assert(r.allowed);
		ck_assert_int_eq(r.remaining, k >= 99 ? 0 : 99 - k);
		ck_assert_int_eq(r.reset_ms, 1000);
	}
	ck_assert_uint_le(limiter_state_bytes(&s),
	    sizeof(s) + 100 * sizeof(struct limiter_run));
	/* one more at the same time: k = 1, the oldest is now - 990 ms:
	 * retry = ceil_ms(now - 990 ms + 1 s - now) = 10 */
	ck_take(&s, &p, now, 1, false, 0, 1000, 10);
	limiter_state_clear(&s);
}
END_TEST

/*
 * Exactness without a reference implementation: random arrivals and costs;
 * a request is admitted iff the cost admitted in (now - W, now] plus its
 * own is at most L, and a denied request's retry r (ms) is exact to the
 * millisecond: still denied at now + (r - 1) ms, admitted at now + r ms.
 */
struct unit_log {
	int64_t t[4096], c[4096];
	size_t n;
};

static int64_t
admitted_in(const struct unit_log *u, int64_t from, int64_t to)
{
	int64_t sum = 0;
	size_t k;

	for (k = 0; k < u->n; k++)
		if (u->t[k] > from && u->t[k] <= to)
			sum += u->c[k];
	return sum;
}

START_TEST(test_log_exact_random)
{
	const int64_t L = 7, W = SEC;
	struct limiter_params p = params(RL_ALG_SLIDING_LOG, L, 1000);
	struct limiter_state s;
	struct unit_log *u = calloc(1, sizeof(*u));
	struct rl_result r;
	int64_t now = T0, c, used, at;
	int k, admitted = 0;

	ck_assert_ptr_nonnull(u);
	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	for (k = 0; k < 4000; k++) {
		now += (int64_t)(rng() % 60000); /* 0 .. 60 ms */
		c = (int64_t)(rng() % (uint64_t)(L + 1));
		used = admitted_in(u, now - W, now);
		r = take(&s, &p, now, c);
		ck_assert_msg(r.allowed == (used + c <= L),
		    "k %d used %lld c %lld", k, (long long)used, (long long)c);
		if (r.allowed) {
			if (c > 0) {
				u->t[u->n] = now;
				u->c[u->n++] = c;
				used += c;
				admitted++;
			}
			ck_assert_int_eq(r.retry_after_ms, 0);
		} else {
			ck_assert_int_ge(r.retry_after_ms, 1);
			at = now + (r.retry_after_ms - 1) * MS;
			ck_assert_int_gt(admitted_in(u, at - W, now) + c, L);
			at = now + r.retry_after_ms * MS;
			ck_assert_int_le(admitted_in(u, at - W, now) + c, L);
		}
		ck_assert_int_eq(r.remaining, L - used);
	}
	ck_assert_int_gt(admitted, 100);
	limiter_state_clear(&s);
	free(u);
}
END_TEST

START_TEST(test_log_clock_back)
{
	struct limiter_params p = params(RL_ALG_SLIDING_LOG, 2, 1000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	ck_take(&s, &p, T0 + 5 * MS, 1, true, 1, 1000, 0);
	/* the clock stepped back 2 ms; reset still from the newest unit:
	 * ceil_ms(T0 + 5 ms + 1 s - (T0 + 3 ms)) = 1002 */
	ck_take(&s, &p, T0 + 3 * MS, 1, true, 0, 1002, 0);
	/* The second unit was recorded at max(now, newest) = T0 + 5 ms, so
	 * k = 1 finds both at T0 + 5 ms:
	 * retry = reset = ceil_ms(T0 + 5 ms + 1 s - (T0 + 6 ms)) = 999 */
	ck_take(&s, &p, T0 + 6 * MS, 1, false, 0, 999, 999);
	ck_assert_int_eq(limiter_expiry(&s, &p), T0 + 5 * MS + SEC);
	limiter_state_clear(&s);
}
END_TEST

START_TEST(test_log_reload)
{
	struct limiter_params p2 = params(RL_ALG_SLIDING_LOG, 2, 1000);
	struct limiter_params p4 = params(RL_ALG_SLIDING_LOG, 4, 1000);
	struct limiter_params p1 = params(RL_ALG_SLIDING_LOG, 1, 1000);
	struct limiter_params pw = params(RL_ALG_SLIDING_LOG, 4, 2000);
	struct limiter_params pf = params(RL_ALG_FIXED_WINDOW, 4, 1000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	ck_take(&s, &p2, T0, 1, true, 1, 1000, 0);
	ck_take(&s, &p2, T0 + MS, 1, true, 0, 1000, 0);
	/* limit 2 -> 4: the two units stay, two more fit (the ring grows) */
	ck_take(&s, &p4, T0 + 2 * MS, 1, true, 1, 1000, 0);
	ck_take(&s, &p4, T0 + 2 * MS, 1, true, 0, 1000, 0);
	/* k = 1 -> T0: retry = ceil_ms(1 s - 2 ms) = 998 */
	ck_take(&s, &p4, T0 + 2 * MS, 1, false, 0, 1000, 998);
	/* limit 4 -> 1: used 4 > 1, so even cost 0 is over the limit:
	 * k = 4 + 0 - 1 = 3 -> units T0, T0+1ms, T0+2ms, T0+2ms, the 3rd is
	 * T0 + 2 ms: retry = ceil_ms(T0 + 2 ms + 1 s - (T0 + 3 ms)) = 999;
	 * reset = the same newest unit: 999 */
	ck_take(&s, &p1, T0 + 3 * MS, 0, false, 0, 999, 999);
	/* window 1 s -> 2 s at T0 + 1.5 s: with 1 s all four would be gone,
	 * with 2 s (edge T0 - 0.5 s) all stay.  k = 1 -> T0:
	 * retry = ceil_ms(T0 + 2 s - (T0 + 1.5 s)) = 500;
	 * reset = ceil_ms(T0 + 2 ms + 2 s - (T0 + 1.5 s)) = 502 */
	ck_take(&s, &pw, T0 + 1500 * MS, 1, false, 0, 502, 500);
	/* algorithm -> fixed_window: the log is dropped, a fresh window */
	ck_take(&s, &pf, T0 + 1500 * MS, 1, true, 3, 500, 0);
	/* and back: the fixed window's count is dropped too */
	ck_take(&s, &p4, T0 + 1500 * MS, 1, true, 3, 1000, 0);
	limiter_state_clear(&s);
}
END_TEST

/* --- fixed_window ------------------------------------------------------ */

START_TEST(test_fixed_basic)
{
	struct limiter_params p = params(RL_ALG_FIXED_WINDOW, 3, 10000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_FIXED_WINDOW);
	/* window [T0, T0 + 10 s): reset = ceil_ms(T0 + 10 s - now) */
	ck_take(&s, &p, T0 + SEC, 1, true, 2, 9000, 0);
	ck_take(&s, &p, T0 + 2 * SEC, 1, true, 1, 8000, 0);
	ck_take(&s, &p, T0 + 3 * SEC, 1, true, 0, 7000, 0);
	ck_assert_int_eq(limiter_expiry(&s, &p), T0 + 10 * SEC);
	/* retry = reset = ceil_ms(1 us) = 1 */
	ck_take(&s, &p, T0 + 10 * SEC - 1, 1, false, 0, 1, 1);
	/* a new window: allowed again right at its start */
	ck_take(&s, &p, T0 + 10 * SEC, 1, true, 2, 10000, 0);
	ck_assert_int_eq(limiter_expiry(&s, &p), T0 + 20 * SEC);
	limiter_state_clear(&s);
}
END_TEST

START_TEST(test_fixed_cost)
{
	struct limiter_params p = params(RL_ALG_FIXED_WINDOW, 5, 10000);
	const int64_t now = T0 + 12345678;
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_FIXED_WINDOW);
	/* nothing used: reset 0, nothing stored */
	ck_take(&s, &p, now, 0, true, 5, 0, 0);
	ck_assert(limiter_expiry(&s, &p) == INT64_MIN);
	/* s_now = T0 + 10 s; T0 + 20 s - now = 7654322 us -> 7655 ms */
	ck_take(&s, &p, now, 4, true, 1, 7655, 0);
	ck_take(&s, &p, now, 2, false, 1, 7655, 7655);
	ck_take(&s, &p, now, 1, true, 0, 7655, 0);
	ck_take(&s, &p, now, 0, true, 0, 7655, 0);
	ck_take(&s, &p, now, 5, false, 0, 7655, 7655);
	limiter_state_clear(&s);
}
END_TEST

START_TEST(test_fixed_reload)
{
	struct limiter_params p2 = params(RL_ALG_FIXED_WINDOW, 2, 10000);
	struct limiter_params p3 = params(RL_ALG_FIXED_WINDOW, 3, 10000);
	struct limiter_params pw = params(RL_ALG_FIXED_WINDOW, 3, 20000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_FIXED_WINDOW);
	ck_take(&s, &p2, T0 + 11 * SEC, 1, true, 1, 9000, 0);
	ck_take(&s, &p2, T0 + 11 * SEC, 1, true, 0, 9000, 0);
	/* limit 2 -> 3: the count (2) stays; reset = T0 + 20 s - 12 s */
	ck_take(&s, &p3, T0 + 12 * SEC, 1, true, 0, 8000, 0);
	/* window 10 s -> 20 s: s_now = T0 (T0 is a multiple of 20 s), the
	 * stored start T0 + 10 s differs: count 0.
	 * reset = ceil_ms(T0 + 20 s - (T0 + 15 s)) = 5000 */
	ck_take(&s, &pw, T0 + 15 * SEC, 1, true, 2, 5000, 0);
	limiter_state_clear(&s);
}
END_TEST

/* --- token_bucket ------------------------------------------------------ */

START_TEST(test_bucket_burst)
{
	/* L = 10, W = 1 s: inc = 1 * 1e6 / 10 = 100000 us */
	struct limiter_params p = params(RL_ALG_TOKEN_BUCKET, 10, 1000);
	struct limiter_state s;
	int64_t k;

	limiter_state_init(&s, RL_ALG_TOKEN_BUCKET);
	for (k = 1; k <= 10; k++) {
		/* t - now = k * 1e5: remaining = floor((1000001 - k e5) *
		 * 10 / 1e6) = floor(10.00001 - k) = 10 - k; reset = 100 k */
		ck_take(&s, &p, T0, 1, true, 10 - k, 100 * k, 0);
	}
	ck_assert_int_eq(limiter_expiry(&s, &p), T0 + SEC);
	/* base = T0 + 1 s, new_tat = T0 + 1.1 s: 1.1e6 > 1e6 + 1.
	 * retry = ceil_ms(1.1e6 - 1e6) = 100;
	 * remaining = floor((1000001 - 1e6) * 10 / 1e6) = 0; reset 1000 */
	ck_take(&s, &p, T0, 1, false, 0, 1000, 100);
	/* new_tat - now = 1100000 - 99998 = 1000002 > 1000001: denied;
	 * retry = ceil_ms(100000 - 99998) = 1;
	 * t - now = 900002: remaining = floor(99999 * 10 / 1e6) = 0,
	 * reset = ceil_ms(900002) = 901 */
	ck_take(&s, &p, T0 + 99998, 1, false, 0, 901, 1);
	/* exactly one more after W / L = 100 ms: 1e6 <= 1000001;
	 * t - now = 1e6: remaining 0, reset 1000 */
	ck_take(&s, &p, T0 + 100 * MS, 1, true, 0, 1000, 0);
	/* new_tat = T0 + 1.2 s: retry = ceil_ms(1.2e6 - 1e6 - 1e5) = 100 */
	ck_take(&s, &p, T0 + 100 * MS, 1, false, 0, 1000, 100);
	limiter_state_clear(&s);

	/* The page's 1 us tolerance: after the burst, T0 + 99999 gives
	 * new_tat - now = 1000001 <= 1000001, admitted. */
	limiter_state_init(&s, RL_ALG_TOKEN_BUCKET);
	for (k = 1; k <= 10; k++)
		(void)take(&s, &p, T0, 1);
	ck_take(&s, &p, T0 + 99999, 1, true, 0, 1001, 0);
	limiter_state_clear(&s);
}
END_TEST

START_TEST(test_bucket_cost)
{
	struct limiter_params p = params(RL_ALG_TOKEN_BUCKET, 10, 1000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_TOKEN_BUCKET);
	/* empty, cost 0: t = now; floor(1000001 * 10 / 1e6) = 10 (at most
	 * L); reset ceil_ms(0) = 0; nothing stored */
	ck_take(&s, &p, T0, 0, true, 10, 0, 0);
	ck_assert(limiter_expiry(&s, &p) == INT64_MIN);
	/* inc = 4e5: remaining = floor(600001 * 10 / 1e6) = 6; reset 400 */
	ck_take(&s, &p, T0, 4, true, 6, 400, 0);
	/* new_tat = T0 + 4e5 + 7e5 = T0 + 1.1e6 > W + 1: denied;
	 * retry = ceil_ms(1.1e6 - 1e6) = 100; t = base: remaining 6 */
	ck_take(&s, &p, T0, 7, false, 6, 400, 100);
	/* cost 0 reports without recording */
	ck_take(&s, &p, T0, 0, true, 6, 400, 0);
	/* 4e5 + 6e5 = 1e6 <= 1000001: remaining floor(0.00001) = 0 */
	ck_take(&s, &p, T0, 6, true, 0, 1000, 0);
	/* half a window later 5 units have dripped out:
	 * t - now = 5e5: remaining = floor(500001 * 10 / 1e6) = 5 */
	ck_take(&s, &p, T0 + 500 * MS, 0, true, 5, 500, 0);
	ck_take(&s, &p, T0 + 500 * MS, 5, true, 0, 1000, 0);
	limiter_state_clear(&s);
}
END_TEST

/*
 * L = 3, W = 1 s: inc = 1e6 / 3 is not an integer and T0's doubles are
 * spaced 0.25 us apart, so tat is rounded at each record: T0 + 333333.25,
 * T0 + 666666.5, T0 + 999999.75 (each the nearest quarter).  The 4th
 * request: new_tat = T0 + 1333333.083.. -> T0 + 1333333.0, denied;
 * retry = ceil_ms(ceil(333333.0)) = 334 (with any rounding within
 * +-0.5 us it is still 334).
 */
START_TEST(test_bucket_fraction)
{
	struct limiter_params p = params(RL_ALG_TOKEN_BUCKET, 3, 1000);
	struct limiter_state s;
	struct rl_result r;

	limiter_state_init(&s, RL_ALG_TOKEN_BUCKET);
	ck_assert(take(&s, &p, T0, 1).allowed);
	ck_assert(take(&s, &p, T0, 1).allowed);
	r = take(&s, &p, T0, 1);
	ck_assert(r.allowed);
	/* t - now = 999999.75: floor(1.25 * 3 / 1e6) = 0; reset 1000 */
	ck_assert_int_eq(r.remaining, 0);
	ck_assert_int_eq(r.reset_ms, 1000);
	r = take(&s, &p, T0, 1);
	ck_assert(!r.allowed);
	ck_assert_int_eq(r.retry_after_ms, 334);
	/* 1333333 - 333331 = 1000002 > 1000001 */
	ck_assert(!take(&s, &p, T0 + 333331, 1).allowed);
	/* at the retry time: 1333333 - 334000 = 999333 */
	ck_assert(take(&s, &p, T0 + 334 * MS, 1).allowed);
	limiter_state_clear(&s);
}
END_TEST

/* At exactly L per W every request passes, for many windows. */
START_TEST(test_bucket_steady)
{
	struct limiter_params p = params(RL_ALG_TOKEN_BUCKET, 10, 1000);
	struct limiter_state s;
	int64_t k, admitted = 0;

	limiter_state_init(&s, RL_ALG_TOKEN_BUCKET);
	for (k = 0; k < 1000; k++)
		ck_assert(take(&s, &p, T0 + k * 100 * MS, 1).allowed);
	limiter_state_clear(&s);
	limiter_state_init(&s, RL_ALG_TOKEN_BUCKET);
	for (k = 0; k < 2000; k++)
		admitted += take(&s, &p, T0 + k * 50 * MS, 1).allowed;
	/* Twice the rate, requests at 0, 50, .., 99950 ms.  Overloaded, the
	 * bucket is never idle, so after N admissions tat = T0 + N * 100 ms;
	 * each needs tat - now <= W + 1 with now <= T0 + 99.95 s, so
	 * N <= (99.95 s + 1 s) / 100 ms = 1009.5; and the last denials say
	 * N + 1 would not fit by the end: N >= 1008. */
	ck_assert_int_ge(admitted, 1008);
	ck_assert_int_le(admitted, 1010);
	limiter_state_clear(&s);
}
END_TEST

/* --- sliding_window ---------------------------------------------------- */

/* W = 20 s, so G = W / 20 = 1 s and bucket i0 = T0 / G starts at T0. */

START_TEST(test_sw_estimate)
{
	struct limiter_params p = params(RL_ALG_SLIDING_WINDOW, 10, 20000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_WINDOW);
	/* bucket i0 = 4; est' = 4: remaining 6;
	 * reset = ceil_ms((i0 + 1) G + W - now) = 21 s - 0.5 s = 20500 */
	ck_take(&s, &p, T0 + 500 * MS, 4, true, 6, 20500, 0);
	ck_assert_int_eq(limiter_expiry(&s, &p), T0 + 21 * SEC);
	/* i = i0 + 5: full = 4, old (i0 - 15) = 0: est 4 + 6 <= 10;
	 * reset = (i0 + 6) G + W - now = 26 s - 5.25 s = 20750 */
	ck_take(&s, &p, T0 + 5250 * MS, 6, true, 0, 20750, 0);
	/* i = i0 + 20: full = buckets i0+1 .. i0+20 = 6, old = bucket i0
	 * = 4, f = (21 s - 20.25 s) / 1 s = 0.75: est = 6 + 3 = 9 -> 9 + 1
	 * <= 10 allowed; est' = 9 + 1 = 10: remaining 0;
	 * reset = (i0 + 21) G + W - now = 41 s - 20.25 s = 20750 */
	ck_take(&s, &p, T0 + 20250 * MS, 1, true, 0, 20750, 0);
	/* est = 7 + 3 = 10: denied.  full + c = 8 <= 10, old = 4:
	 * t = b - G (L - c - full) / old = T0 + 21 s - 1 s * 2 / 4
	 *   = T0 + 20.5 s: retry = ceil_ms(0.25 s) = 250 */
	ck_take(&s, &p, T0 + 20250 * MS, 1, false, 0, 20750, 250);
	/* cost 0 reports est = 10 without recording */
	ck_take(&s, &p, T0 + 20250 * MS, 0, true, 0, 20750, 0);
	/* at T0 + 20.5 s: f = 0.5, est = 7 + 2 = 9: allowed; est' = 10;
	 * reset = 41 s - 20.5 s = 20500 */
	ck_take(&s, &p, T0 + 20500 * MS, 1, true, 0, 20500, 0);
	/* at T0 + 20.9 s: f = 0.1, est = 8 + 0.4 = 8.4: remaining
	 * floor(10 - 8.4) = 1 with cost 0 */
	ck_take(&s, &p, T0 + 20900 * MS, 0, true, 1, 20100, 0);
	limiter_state_clear(&s);
}
END_TEST

START_TEST(test_sw_retry_steps)
{
	struct limiter_params p = params(RL_ALG_SLIDING_WINDOW, 10, 20000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_WINDOW);
	ck_take(&s, &p, T0 + 500 * MS, 10, true, 0, 20500, 0);
	/*
	 * At T0 + 10 s (i = i0 + 10), full = 10: 11 > 10.  Stepping: the
	 * buckets leaving full are i0-9 .. i0-1 (empty) until i = i0 + 19;
	 * then old = bucket i0 = 10, full = 0, i = i0 + 20, b = T0 + 21 s:
	 * t = T0 + 21 s - 1 s * (10 - 1 - 0) / 10 = T0 + 20.1 s.
	 * retry = ceil_ms(10.1 s) = 10100;
	 * reset = ceil_ms((i0 + 1) G + W - now) = 21 s - 10 s = 11000
	 */
	ck_take(&s, &p, T0 + 10 * SEC, 1, false, 0, 11000, 10100);
	/* 1 us early: f = 0.900001, est = 9.00001, 10.00001 > 10: denied,
	 * retry = ceil_ms(1 us) = 1; reset = 21 s - (20.1 s - 1 us) */
	ck_take(&s, &p, T0 + 20100 * MS - 1, 1, false, 0, 901, 1);
	/* on time: f = 0.9, est = 9.0: allowed; est' = 10: remaining 0;
	 * reset = (i0 + 21) G + W - now = 41 s - 20.1 s = 20900 */
	ck_take(&s, &p, T0 + 20100 * MS, 1, true, 0, 20900, 0);
	limiter_state_clear(&s);
}
END_TEST

/* Admitted cost in (t - W, t] for every admitted t, by two pointers. */
static void
window_counts(const int64_t *t, size_t n, int64_t w, int64_t from,
    int64_t *min_out, int64_t *max_out)
{
	size_t lo = 0, hi;
	int64_t mn = INT64_MAX, mx = 0, cnt;

	for (hi = 0; hi < n; hi++) {
		while (t[lo] <= t[hi] - w)
			lo++;
		cnt = (int64_t)(hi - lo + 1);
		if (cnt > mx)
			mx = cnt;
		if (t[hi] >= from && cnt < mn)
			mn = cnt;
	}
	*min_out = mn;
	*max_out = mx;
}

/*
 * Steady 2x overload: L = 100 per W = 20 s, one request every 100 ms (200
 * per window) for 50 windows.  Only the old bucket is estimated: when t is
 * admitted, est + 1 <= L and the window (t - W, t] really holds
 * full + (the part of old inside it) <= est + old * (1 - f) <= est + old,
 * so at most L + old; a bucket admits about L / B = 5 here, hence the bound
 * L * (1 + 1 / B) = 105.  From below: a request is denied only when
 * est > L - 1, and the window then holds at least full = est - old * f >
 * L - 1 - old, so once warm every window-long interval ending at an
 * admission holds at least L - L / B - 1 = 94.  (With this smooth load the
 * truth is much closer: 99 .. 102.)  The total is then between 50 * 94 and
 * 50 * 105.
 */
START_TEST(test_sw_bound)
{
	struct limiter_params p = params(RL_ALG_SLIDING_WINDOW, 100, 20000);
	struct limiter_state s;
	int64_t *t = calloc(10000, sizeof(*t)), k, mn, mx, now;
	size_t n = 0;

	ck_assert_ptr_nonnull(t);
	limiter_state_init(&s, RL_ALG_SLIDING_WINDOW);
	for (k = 0; k < 10000; k++) {
		now = T0 + 37 * MS + k * 100 * MS;
		if (take(&s, &p, now, 1).allowed)
			t[n++] = now;
	}
	window_counts(t, n, 20 * SEC, T0 + 40 * SEC, &mn, &mx);
	ck_assert_msg(mx <= 105, "max %lld in a window", (long long)mx);
	ck_assert_msg(mn >= 94, "min %lld in a window", (long long)mn);
	ck_assert_msg(n >= 50 * 94 && n <= 50 * 105, "admitted %zu", n);
	limiter_state_clear(&s);
	free(t);
}
END_TEST

START_TEST(test_sw_cost_zero_and_reload)
{
	struct limiter_params p = params(RL_ALG_SLIDING_WINDOW, 10, 20000);
	struct limiter_params pl = params(RL_ALG_SLIDING_WINDOW, 20, 20000);
	struct limiter_params pw = params(RL_ALG_SLIDING_WINDOW, 20, 40000);
	struct limiter_params pt = params(RL_ALG_TOKEN_BUCKET, 20, 40000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_WINDOW);
	/* nothing used: remaining L, reset 0, no counts allocated */
	ck_take(&s, &p, T0, 0, true, 10, 0, 0);
	ck_assert(limiter_expiry(&s, &p) == INT64_MIN);
	ck_assert_uint_eq(limiter_state_bytes(&s), sizeof(s));
	ck_take(&s, &p, T0 + 500 * MS, 10, true, 0, 20500, 0);
	ck_assert_uint_gt(limiter_state_bytes(&s), sizeof(s));
	/* limit 10 -> 20: the bucket stays, est = 10; est' = 15 */
	ck_take(&s, &pl, T0 + SEC, 5, true, 5, 21000, 0);
	/*
	 * window 20 s -> 40 s (G = 2 s): i = (T0 + 2 s) / 2 s = T0 / 2 s + 1
	 * is about half the old indexes, which now lie in the future and
	 * are dropped: a fresh estimate.  reset = (i + 1) G + W - now =
	 * (T0 + 4 s) + 40 s - (T0 + 2 s) = 42000
	 */
	ck_take(&s, &pw, T0 + 2 * SEC, 20, true, 0, 42000, 0);
	/* algorithm change: reset.  inc = 1 * 40e6 / 20 = 2e6 us:
	 * remaining = floor((40000001 - 2e6) * 20 / 40e6) = 19 */
	ck_take(&s, &pt, T0 + 2 * SEC, 1, true, 19, 2000, 0);
	limiter_state_clear(&s);
}
END_TEST

/* The clock steps back across a bucket: buckets newer than the current one
 * count nowhere (docs/algorithms.md, sliding_window, Expire). */
START_TEST(test_sw_clock_back)
{
	struct limiter_params p = params(RL_ALG_SLIDING_WINDOW, 10, 20000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_WINDOW);
	/* reset = (i0 + 6) G + W - now = 26 s - 5 s = 21000 */
	ck_take(&s, &p, T0 + 5 * SEC, 4, true, 6, 21000, 0);
	/* back to T0 + 3 s (i0 + 3): bucket i0 + 5 is dropped: est 0;
	 * est' = 2; reset = (i0 + 4) G + W - now = 24 s - 3 s = 21000 */
	ck_take(&s, &p, T0 + 3 * SEC, 2, true, 8, 21000, 0);
	limiter_state_clear(&s);
}
END_TEST

/* --- concurrency: waiting for a turn ------------------------------------ */

/* limiter_check() at now, then limiter_earliest() from `from`. */
static int64_t
earliest(struct limiter_state *s, const struct limiter_params *p, int64_t now,
    int64_t from, int64_t cost)
{
	char err[128];
	bool ok;

	ck_assert_int_eq(limiter_check(s, p, now, cost, &ok, err, sizeof(err)),
	    0);
	return limiter_earliest(s, p, now, from, cost);
}

/*
 * docs/algorithms.md, "Waiting for a turn": a lease taken at now expires at
 * now + W, and the answer goes out ceil_ms(t - now) later, so concurrency
 * admits at t only while t <= now + W - 1 ms; never past it (a turn there
 * would hand out a lease expired, or expiring, as the answer goes out).
 * L 2, W 1 s; lease a (1 unit) held.
 */
START_TEST(test_conc_earliest)
{
	struct limiter_params p = params(RL_ALG_CONCURRENCY, 2, 1000);
	struct limiter_state s;
	int64_t now = T0 + 100 * MS;

	limiter_state_init(&s, RL_ALG_CONCURRENCY);
	p.token = "0000000000000000000000000000000a";
	ck_take(&s, &p, T0, 1, true, 1, 1000, 0);
	p.token = "0000000000000000000000000000000b";
	/* Fits now: e(from) = from up to now + W - 1 ms, then never. */
	ck_assert_int_eq(earliest(&s, &p, now, now, 1), now);
	ck_assert_int_eq(earliest(&s, &p, now, now + 500 * MS, 1),
	    now + 500 * MS);
	ck_assert_int_eq(earliest(&s, &p, now, now + SEC - MS, 1),
	    now + SEC - MS);
	ck_assert_int_eq(earliest(&s, &p, now, now + SEC - MS + 1, 1),
	    INT64_MAX);
	ck_assert_int_eq(earliest(&s, &p, now, now + SEC, 1), INT64_MAX);
	ck_assert_int_eq(earliest(&s, &p, now, now + 5 * SEC, 1), INT64_MAX);
	/* from before now counts from now. */
	ck_assert_int_eq(earliest(&s, &p, now, now - SEC, 1), now);
	/* The same bound for cost 0, which takes no lease. */
	ck_assert_int_eq(earliest(&s, &p, now, now + SEC - MS, 0),
	    now + SEC - MS);
	ck_assert_int_eq(earliest(&s, &p, now, now + SEC, 0), INT64_MAX);
	/* Does not fit now (2 units, 1 free): never, whatever from is: the
	 * daemon waits for a release instead. */
	ck_assert_int_eq(earliest(&s, &p, now, now, 2), INT64_MAX);
	/* A look (no token) never takes a lease. */
	p.token = NULL;
	ck_assert_int_eq(earliest(&s, &p, now, now, 1), INT64_MAX);
	limiter_state_clear(&s);
}
END_TEST

/* The bound is the key's own window: W 1 ms leaves only t = now. */
START_TEST(test_conc_earliest_short)
{
	struct limiter_params p = params(RL_ALG_CONCURRENCY, 1, 1);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_CONCURRENCY);
	p.token = "0000000000000000000000000000000c";
	ck_assert_int_eq(earliest(&s, &p, T0, T0, 1), T0);
	ck_assert_int_eq(earliest(&s, &p, T0, T0 + 1, 1), INT64_MAX);
	limiter_state_clear(&s);
}
END_TEST

/* --- common ------------------------------------------------------------ */

START_TEST(test_params)
{
	struct limiter_params p;
	char err[128];

	ck_assert_int_eq(limiter_params_set(&p, RL_ALG_SLIDING_LOG, 0, 1000,
			     err, sizeof(err)),
	    -1);
	ck_assert_ptr_nonnull(strstr(err, "limit"));
	ck_assert_int_eq(limiter_params_set(&p, RL_ALG_SLIDING_LOG,
			     LIMITER_MAX_LIMIT + 1, 1000, err, sizeof(err)),
	    -1);
	ck_assert_int_eq(limiter_params_set(&p, RL_ALG_SLIDING_LOG, 1, 0, err,
			     sizeof(err)),
	    -1);
	ck_assert_ptr_nonnull(strstr(err, "window"));
	ck_assert_int_eq(limiter_params_set(&p, (enum rl_algorithm)42, 1, 1,
			     err, sizeof(err)),
	    -1);
	ck_assert_int_eq(limiter_params_set(&p, RL_ALG_FIXED_WINDOW, 5, 250,
			     err, sizeof(err)),
	    0);
	ck_assert_int_eq(p.window_us, 250000);
	ck_assert_int_eq(p.limit, 5);
}
END_TEST

/* Expiry is the moment the state stops mattering: checked for each
 * algorithm by asking 1 us before (state still counts) and at it. */
START_TEST(test_expiry)
{
	struct limiter_params pl = params(RL_ALG_SLIDING_LOG, 2, 1000);
	struct limiter_params pt = params(RL_ALG_TOKEN_BUCKET, 10, 1000);
	struct limiter_params ps = params(RL_ALG_SLIDING_WINDOW, 10, 20000);
	struct limiter_state s;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	(void)take(&s, &pl, T0 + 7, 1);
	ck_assert_int_eq(limiter_expiry(&s, &pl), T0 + 7 + SEC);
	ck_take(&s, &pl, T0 + 7 + SEC - 1, 0, true, 1, 1, 0);
	ck_take(&s, &pl, T0 + 7 + SEC, 0, true, 2, 0, 0);
	ck_assert(limiter_expiry(&s, &pl) == INT64_MIN);
	limiter_state_clear(&s);

	/* tat = T0 + 4e5 */
	limiter_state_init(&s, RL_ALG_TOKEN_BUCKET);
	(void)take(&s, &pt, T0, 4);
	ck_assert_int_eq(limiter_expiry(&s, &pt), T0 + 400 * MS);
	/* 1 us before: t - now = 1: floor(1000000 * 10 / 1e6) = 10, at
	 * most L: the bucket is full again only at tat, where reset is 0 */
	ck_take(&s, &pt, T0 + 400 * MS - 1, 0, true, 10, 1, 0);
	ck_take(&s, &pt, T0 + 400 * MS, 0, true, 10, 0, 0);
	limiter_state_clear(&s);

	/* bucket i0 counts until i0 + B + 1 = T0 + 21 s */
	limiter_state_init(&s, RL_ALG_SLIDING_WINDOW);
	(void)take(&s, &ps, T0 + 500 * MS, 10);
	ck_assert_int_eq(limiter_expiry(&s, &ps), T0 + 21 * SEC);
	/* f = 1 us / 1 s: est = 10e-6: remaining floor(9.99999) = 9 */
	ck_take(&s, &ps, T0 + 21 * SEC - 1, 0, true, 9, 1, 0);
	ck_take(&s, &ps, T0 + 21 * SEC, 0, true, 10, 0, 0);
	ck_assert(limiter_expiry(&s, &ps) == INT64_MIN);
	limiter_state_clear(&s);
}
END_TEST

/* Out of memory in phase 1: -1, nothing recorded, the state still works. */
START_TEST(test_oom)
{
	struct limiter_params pl = params(RL_ALG_SLIDING_LOG, 100, 1000);
	struct limiter_params ps = params(RL_ALG_SLIDING_WINDOW, 10, 20000);
	struct limiter_state s;
	struct rl_result r;
	char err[128];
	int64_t k;

	limiter_state_init(&s, RL_ALG_SLIDING_LOG);
	for (k = 0; k < 4; k++) /* fills the first ring of 4 */
		(void)take(&s, &pl, T0 + k, 1);
	rl_alloc_fail_after(0);
	ck_assert_int_eq(limiter_take(&s, &pl, T0 + 4, 1, &r, err, sizeof(err)),
	    -1);
	ck_assert_ptr_nonnull(strstr(err, "out of memory"));
	/* a cost-0 call needs no memory */
	ck_assert_int_eq(limiter_take(&s, &pl, T0 + 4, 0, &r, err, sizeof(err)),
	    0);
	ck_assert_int_eq(r.remaining, 96);
	rl_alloc_fail_after(-1);
	ck_take(&s, &pl, T0 + 5, 1, true, 95, 1000, 0);
	limiter_state_clear(&s);

	limiter_state_init(&s, RL_ALG_SLIDING_WINDOW);
	rl_alloc_fail_after(0);
	ck_assert_int_eq(limiter_take(&s, &ps, T0, 1, &r, err, sizeof(err)),
	    -1);
	rl_alloc_fail_after(-1);
	ck_take(&s, &ps, T0, 1, true, 9, 21000, 0);
	limiter_state_clear(&s);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("limiter");
	TCase *tc;

	tc = tcase_create("sliding_log");
	tcase_add_test(tc, test_log_exact_limit);
	tcase_add_test(tc, test_log_sliding_not_fixed);
	tcase_add_test(tc, test_log_cost);
	tcase_add_test(tc, test_log_cost_zero);
	tcase_add_test(tc, test_log_ring_wraps);
	tcase_add_test(tc, test_log_exact_random);
	tcase_add_test(tc, test_log_clock_back);
	tcase_add_test(tc, test_log_reload);
	suite_add_tcase(s, tc);

	tc = tcase_create("fixed_window");
	tcase_add_test(tc, test_fixed_basic);
	tcase_add_test(tc, test_fixed_cost);
	tcase_add_test(tc, test_fixed_reload);
	suite_add_tcase(s, tc);

	tc = tcase_create("token_bucket");
	tcase_add_test(tc, test_bucket_burst);
	tcase_add_test(tc, test_bucket_cost);
	tcase_add_test(tc, test_bucket_fraction);
	tcase_add_test(tc, test_bucket_steady);
	suite_add_tcase(s, tc);

	tc = tcase_create("sliding_window");
	tcase_add_test(tc, test_sw_estimate);
	tcase_add_test(tc, test_sw_retry_steps);
	tcase_add_test(tc, test_sw_bound);
	tcase_add_test(tc, test_sw_cost_zero_and_reload);
	tcase_add_test(tc, test_sw_clock_back);
	suite_add_tcase(s, tc);

	tc = tcase_create("concurrency_wait");
	tcase_add_test(tc, test_conc_earliest);
	tcase_add_test(tc, test_conc_earliest_short);
	suite_add_tcase(s, tc);

	tc = tcase_create("common");
	tcase_add_test(tc, test_params);
	tcase_add_test(tc, test_expiry);
	tcase_add_test(tc, test_oom);
	suite_add_tcase(s, tc);
	return s;
}
