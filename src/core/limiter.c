/*
 * limiter.c - sliding_log, fixed_window, token_bucket and sliding_window on
 * one key's state, exactly as docs/algorithms.md defines them.  This is the
 * in-process twin of lua/ratelimit.lua: the memory store (and the local
 * fallback when Redis fails) must give the same answers as Redis for the
 * same history and clock, so every formula below is the page's formula, in
 * the page's order.  See limiter.h for the call sequence.
 *
 * DESIGN
 *
 * Time is an int64_t in microseconds.  Where the page computes on doubles
 * (token_bucket, sliding_window's estimate and retry) we convert each
 * integer operand to double and write the expression in the page's order;
 * every integer involved stays below 2^53 (limiter_params_set() bounds the
 * limit and the window), so the conversions are exact and the roundings are
 * those of Lua's doubles.  Lua runs each operation as its own VM step, so
 * it never fuses a multiply and an add; neither may we: ISO mode (-std=c11)
 * keeps GCC at -ffp-contract=off.  Where the page uses fmod(now, X) we use
 * now % X: for 0 <= now < 2^53 both are exact and equal.
 *
 * sliding_log keeps runs (t, n) of units admitted at the same microsecond
 * in a ring buffer sorted by t, oldest at head.  A run is one allocation
 * slot for any cost, so memory is O(min(L, distinct times in the window)).
 * The ring grows by doubling (capped at L runs) in phase 1, when a request
 * is admitted and the ring is full, so phase 2 never allocates; it shrinks
 * by halves when it is less than a quarter full.  Units are recorded at
 * max(now, newest), as the page says: runs are only ever appended or added
 * to the newest one, also when the clock steps back.
 *
 * sliding_window keeps the B + 1 counts of buckets newest-B .. newest in a
 * small heap array indexed by bucket index mod B + 1 (allocated on the
 * first record, so fixed_window and token_bucket keys stay small).  Phase 1
 * moves the ring to the current bucket i and drops every bucket outside
 * i-B .. i, older or newer: newer ones exist only after the clock stepped
 * back or the window changed (bucket indexes then mean other times).
 *
 * The expiry of a state is the moment its history stops changing answers;
 * it is a function of the state and the parameters only, not of `now`.
 */
#include "core/limiter.h"
#include "core/limiter_concurrency.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

#define SW_B	    LIMITER_SW_BUCKETS
#define SW_SLOTS    (LIMITER_SW_BUCKETS + 1)
#define LOG_MIN_CAP 4

/* ceil_ms(x) of docs/algorithms.md: microseconds to milliseconds, rounded
 * up; 0 for x <= 0. */
static int64_t
ceil_ms(int64_t x)
{
	return util_ceil_div(x, 1000);
}

/* ceil() of a double time or time difference, as an integer, saturated at
 * +-1.5 * 2^62 (a tat is at most LIMITER_MAX_AHEAD_US after a clock's
 * time, far inside; ceil_ms() may still add to it). */
#define CEIL_US_MAX (0x1p62 + 0x1p61)

static int64_t
ceil_us(double x)
{
	x = ceil(x);
	if (x > CEIL_US_MAX)
		return (int64_t)CEIL_US_MAX;
	if (x < -CEIL_US_MAX)
		return -(int64_t)CEIL_US_MAX;
	return (int64_t)x;
}

/* An overdraft in units, -rem of a negative remaining, as an integer:
 * 0 .. LIMITER_MAX_UNITS (docs/algorithms.md, "Usage reported after the
 * fact"). */
static int64_t
over_units(double rem)
{
	if (!(rem < 0))
		return 0;
	if (-rem >= (double)LIMITER_MAX_UNITS)
		return LIMITER_MAX_UNITS;
	return (int64_t)-rem;
}

int
limiter_params_set(struct limiter_params *p, enum rl_algorithm alg,
    int64_t limit, int64_t window_ms, char *err, size_t errlen)
{
	if (limit < 1 || limit > LIMITER_MAX_LIMIT) {
		snprintf(err, errlen, "limit %lld out of range 1..%lld",
		    (long long)limit, (long long)LIMITER_MAX_LIMIT);
		return -1;
	}
	if (window_ms < 1 || window_ms > LIMITER_MAX_WINDOW_MS) {
		snprintf(err, errlen, "window %lld ms out of range 1..%lld",
		    (long long)window_ms, (long long)LIMITER_MAX_WINDOW_MS);
		return -1;
	}
	switch (alg) {
	case RL_ALG_SLIDING_LOG:
	case RL_ALG_SLIDING_WINDOW:
	case RL_ALG_FIXED_WINDOW:
	case RL_ALG_TOKEN_BUCKET:
	case RL_ALG_CONCURRENCY:
		break;
	default:
		snprintf(err, errlen, "unknown algorithm %d", (int)alg);
		return -1;
	}
	p->algorithm = alg;
	p->limit = limit;
	p->window_us = window_ms * 1000;
	p->token = NULL;
	return 0;
}

void
limiter_state_init(struct limiter_state *s, enum rl_algorithm alg)
{
	memset(s, 0, sizeof(*s));
	s->algorithm = alg;
	if (alg == RL_ALG_TOKEN_BUCKET)
		s->u.bucket.tat = -HUGE_VAL;
}

void
limiter_state_clear(struct limiter_state *s)
{
	if (s->algorithm == RL_ALG_SLIDING_LOG)
		rl_free(s->u.log.runs);
	else if (s->algorithm == RL_ALG_SLIDING_WINDOW)
		rl_free(s->u.window.counts);
	else if (s->algorithm == RL_ALG_CONCURRENCY)
		conc_clear(s);
	limiter_state_init(s, s->algorithm);
}

/* --- sliding_log ------------------------------------------------------- */

/* The k-th run from the oldest (k < len, or k < cap when inserting). */
static struct limiter_run *
log_at(const struct limiter_state *s, size_t k)
{
	return &s->u.log.runs[(s->u.log.head + k) % s->u.log.cap];
}

/* Move the runs to a new buffer of cap slots (cap >= len). */
static int
log_resize(struct limiter_state *s, size_t cap)
{
	struct limiter_run *runs;
	size_t k;

	if (cap > SIZE_MAX / sizeof(*runs))
		return -1;
	if ((runs = rl_malloc(cap * sizeof(*runs))) == NULL)
		return -1;
	for (k = 0; k < s->u.log.len; k++)
		runs[k] = *log_at(s, k);
	rl_free(s->u.log.runs);
	s->u.log.runs = runs;
	s->u.log.cap = cap;
	s->u.log.head = 0;
	return 0;
}

/* Drop units with t <= now - W; give back memory the ring no longer needs
 * (best effort: a failed shrink keeps the larger ring). */
static void
log_expire(struct limiter_state *s, const struct limiter_params *p, int64_t now)
{
	int64_t edge = now - p->window_us;
	struct limiter_run *r;

	while (s->u.log.len > 0 && (r = log_at(s, 0))->t <= edge) {
		s->u.log.used -= r->n;
		s->u.log.head = (s->u.log.head + 1) % s->u.log.cap;
		s->u.log.len--;
	}
	if (s->u.log.cap > LOG_MIN_CAP && s->u.log.len < s->u.log.cap / 4)
		(void)log_resize(s, s->u.log.cap / 2);
}

static int
log_check(struct limiter_state *s, const struct limiter_params *p, int64_t now,
    int64_t cost, bool *allowed, char *err, size_t errlen)
{
	size_t cap;

	log_expire(s, p, now);
	/* used + c <= L, without overflow */
	*allowed = cost <= p->limit - s->u.log.used;
	if (!*allowed || cost == 0 || s->u.log.len < s->u.log.cap)
		return 0;
	/* Room for one more run.  Admitted means used + cost <= L with
	 * cost >= 1, so len <= used < L and min(2 * cap, L) > len. */
	cap = s->u.log.cap == 0 ? LOG_MIN_CAP : 2 * s->u.log.cap;
	if ((uint64_t)cap > (uint64_t)p->limit)
		cap = (size_t)p->limit;
	if (log_resize(s, cap) == -1) {
		snprintf(err, errlen, "out of memory (sliding_log of %zu runs)",
		    cap);
		return -1;
	}
	return 0;
}

/* count + cost, never past LIMITER_MAX_UNITS: only a report, which records
 * past L, gets there (docs/algorithms.md, "Usage reported after the
 * fact"). */
static int64_t
units_add(int64_t count, int64_t cost)
{
	return cost > LIMITER_MAX_UNITS - count ? LIMITER_MAX_UNITS :
						  count + cost;
}

static void
log_record(struct limiter_state *s, int64_t now, int64_t cost)
{
	struct limiter_run *r;

	cost = units_add(s->u.log.used, cost) - s->u.log.used;
	if (cost == 0)
		return;

	/* Units are recorded at max(now, newest): a clock that went back
	 * adds to the newest run, so runs stay sorted by time. */
	if (s->u.log.len > 0 && (r = log_at(s, s->u.log.len - 1))->t >= now) {
		r->n += cost;
	} else {
		assert(s->u.log.len < s->u.log.cap);
		r = log_at(s, s->u.log.len);
		r->t = now;
		r->n = cost;
		s->u.log.len++;
	}
	s->u.log.used += cost;
}

static void
log_result(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool allowed, struct rl_result *out)
{
	int64_t used = s->u.log.used, k, acc = 0;
	size_t j;

	out->remaining = used >= p->limit ? 0 : p->limit - used;
	out->reset_ms = s->u.log.len == 0 ?
	    0 :
	    ceil_ms(log_at(s, s->u.log.len - 1)->t + p->window_us - now);
	if (allowed)
		return;
	/* The k-th oldest unit must expire, k = used + c - L (1 <= k <= used
	 * since the request was denied and c <= L). */
	k = used - p->limit + cost;
	for (j = 0; j < s->u.log.len; j++) {
		acc += log_at(s, j)->n;
		if (acc >= k) {
			out->retry_after_ms = ceil_ms(log_at(s, j)->t +
			    p->window_us - now);
			return;
		}
	}
	/* Not reached unless cost > L, which callers refuse. */
	out->retry_after_ms = 1;
}

static int64_t
log_expiry(const struct limiter_state *s, const struct limiter_params *p)
{
	if (s->u.log.len == 0)
		return INT64_MIN;
	return log_at(s, s->u.log.len - 1)->t + p->window_us;
}

/* --- fixed_window ------------------------------------------------------ */

/* s_now = now - fmod(now, W) */
static int64_t
fixed_start(const struct limiter_params *p, int64_t now)
{
	return now - now % p->window_us;
}

/* The count of the current window. */
static int64_t
fixed_count(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now)
{
	return s->u.fixed.start == fixed_start(p, now) ? s->u.fixed.n : 0;
}

/* Does the state hold units reserved in a window after now's?  A start
 * that is not a multiple of W comes from another window size (a reload)
 * and is stale, never a reservation. */
static bool
fixed_reserved(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now)
{
	return s->u.fixed.n > 0 && s->u.fixed.start > fixed_start(p, now) &&
	    s->u.fixed.start % p->window_us == 0;
}

static void
fixed_check(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool *allowed)
{
	int64_t start = fixed_start(p, now);

	if (fixed_reserved(s, p, now)) {
		/* Units reserved in a later window (waiting): those waiters
		 * come first, so only a report (cost 0) passes now. */
		*allowed = cost == 0;
		return;
	}
	if (s->u.fixed.start != start) {
		s->u.fixed.start = start;
		s->u.fixed.n = 0;
	}
	*allowed = cost <= p->limit - s->u.fixed.n;
}

/* The earliest t >= from at which cost fits (docs/algorithms.md,
 * "Waiting"): not before the window of the newest reservation; in that
 * window if its count leaves room, else at the start of the next. */
static int64_t
fixed_earliest(const struct limiter_state *s, const struct limiter_params *p,
    int64_t from, int64_t cost)
{
	int64_t t = from;

	if (s->u.fixed.n == 0)
		return t;
	if (fixed_reserved(s, p, t))
		t = s->u.fixed.start;
	if (fixed_start(p, t) != s->u.fixed.start ||
	    cost <= p->limit - s->u.fixed.n)
		return t;
	return s->u.fixed.start + p->window_us;
}

static void
fixed_result(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool allowed, struct rl_result *out)
{
	int64_t n = fixed_count(s, p, now);
	int64_t left = ceil_ms(fixed_start(p, now) + p->window_us - now);

	if (fixed_reserved(s, p, now)) {
		/* A later window holds reservations. */
		out->remaining = 0;

		out->reset_ms = ceil_ms(s->u.fixed.start + p->window_us - now);
		if (!allowed) {
			int64_t at = fixed_earliest(s, p, now, cost);

			out->retry_after_ms = ceil_ms(at - now);
		}
		return;
	}
	out->remaining = n >= p->limit ? 0 : p->limit - n;
	out->reset_ms = n > 0 ? left : 0;
	if (!allowed)
		out->retry_after_ms = left;
}

static int64_t
fixed_expiry(const struct limiter_state *s, const struct limiter_params *p)
{
	return s->u.fixed.n > 0 ? s->u.fixed.start + p->window_us : INT64_MIN;
}

/* --- token_bucket (GCRA) ----------------------------------------------- */

/* base = max(tat, now); tat absent (-HUGE_VAL) gives now. */
static double
bucket_base(const struct limiter_state *s, int64_t now)
{
	double tat = s->u.bucket.tat, dnow = (double)now;

	return tat > dnow ? tat : dnow;
}

/* new_tat = base + c * W / L */
static double
bucket_new_tat(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost)
{
	double inc = (double)cost * (double)p->window_us / (double)p->limit;

	return bucket_base(s, now) + inc;
}

/* The tat a record of cost at t leaves: new_tat, but never more than
 * LIMITER_MAX_AHEAD_US after t (only a report gets there). */
static double
bucket_record_tat(const struct limiter_state *s, const struct limiter_params *p,
    int64_t t, int64_t cost)
{
	double tat = bucket_new_tat(s, p, t, cost);
	double cap = (double)t + (double)LIMITER_MAX_AHEAD_US;

	return tat > cap ? cap : tat;
}

static void
bucket_check(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool *allowed)
{
	double new_tat = bucket_new_tat(s, p, now, cost);

	*allowed = new_tat - (double)now <= (double)p->window_us + 1;
}

/* floor((W + 1 - (t - now)) * L / W) after the call, not floored. */
static double
bucket_rem(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now)
{
	double t = bucket_base(s, now);
	double w = (double)p->window_us, dnow = (double)now;

	return floor((w + 1 - (t - dnow)) * (double)p->limit / w);
}

static void
bucket_result(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool allowed, struct rl_result *out)
{
	/* t = new_tat if recorded, else base: after a record tat = new_tat
	 * > now, so both are max(tat, now) of the state after the call. */
	double t = bucket_base(s, now);
	double w = (double)p->window_us, dnow = (double)now;
	double rem = bucket_rem(s, p, now);
	int64_t retry;

	if (rem <= 0)
		out->remaining = 0;
	else if (rem >= (double)p->limit)
		out->remaining = p->limit;
	else
		out->remaining = (int64_t)rem;
	out->reset_ms = ceil_ms(ceil_us(t - dnow));
	if (!allowed) {
		retry = ceil_ms(ceil_us(bucket_new_tat(s, p, now, cost) - w -
		    dnow));
		out->retry_after_ms = retry < 1 ? 1 : retry;
	}
}

static int64_t
bucket_expiry(const struct limiter_state *s)
{
	if (s->u.bucket.tat == -HUGE_VAL)
		return INT64_MIN;
	return ceil_us(s->u.bucket.tat);
}

/* --- sliding_window ---------------------------------------------------- */

static int64_t
sw_granule(const struct limiter_params *p)
{
	return p->window_us / SW_B; /* G; W is a multiple of 1000 */
}

static size_t
sw_slot(int64_t j)
{
	return (size_t)(((j % SW_SLOTS) + SW_SLOTS) % SW_SLOTS);
}

/* The count of bucket j, 0 unless the ring holds it. */
static int64_t
sw_count(const struct limiter_state *s, int64_t j)
{
	if (s->u.window.counts == NULL || j > s->u.window.newest ||
	    j < s->u.window.newest - SW_B)
		return 0;
	return s->u.window.counts[sw_slot(j)];
}

/* Move the ring to hold i-B .. i, dropping every other bucket. */
static void
sw_expire(struct limiter_state *s, int64_t i)
{
	int64_t kept[SW_SLOTS], j;

	if (s->u.window.counts != NULL && s->u.window.newest != i) {
		memset(kept, 0, sizeof(kept));
		for (j = i - SW_B; j <= i; j++)
			kept[sw_slot(j)] = sw_count(s, j);
		memcpy(s->u.window.counts, kept, sizeof(kept));
	}
	s->u.window.newest = i;
}

/* f = ((i+1)*G - now) / G, the part of bucket i-B still in the window. */
static double
sw_fraction(const struct limiter_params *p, int64_t now, int64_t i)
{
	int64_t g = sw_granule(p);

	return (double)((i + 1) * g - now) / (double)g;
}

/* The page's full, old and est = full + old * f at now. */
struct sw_view {
	int64_t i, full, old;
	double est;
};

static void
sw_view(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, struct sw_view *v)
{
	int64_t g = sw_granule(p), j;

	v->i = now / g; /* (now - fmod(now, G)) / G */
	v->full = 0;
	for (j = v->i - SW_B + 1; j <= v->i; j++)
		v->full += sw_count(s, j);
	v->old = sw_count(s, v->i - SW_B);
	v->est = (double)v->full + (double)v->old * sw_fraction(p, now, v->i);
}

static int
sw_check(struct limiter_state *s, const struct limiter_params *p, int64_t now,
    int64_t cost, bool *allowed, char *err, size_t errlen)
{
	struct sw_view v;

	sw_expire(s, now / sw_granule(p));
	sw_view(s, p, now, &v);
	*allowed = v.est + (double)cost <= (double)p->limit;
	if (*allowed && cost > 0 && s->u.window.counts == NULL) {
		s->u.window.counts = rl_calloc(SW_SLOTS, sizeof(int64_t));
		if (s->u.window.counts == NULL) {
			snprintf(err, errlen,
			    "out of memory (sliding_window counts)");
			return -1;
		}
	}
	return 0;
}

static void
sw_record(struct limiter_state *s, const struct limiter_params *p, int64_t now,
    int64_t cost)
{
	int64_t i = now / sw_granule(p);

	assert(s->u.window.counts != NULL && s->u.window.newest == i);
	s->u.window.counts[sw_slot(i)] = units_add(
	    s->u.window.counts[sw_slot(i)], cost);
}

/* retry_after when denied: step through bucket boundaries with no new
 * traffic until full + c <= L, then solve est(t) + c = L in that bucket. */
static int64_t
sw_retry(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, const struct sw_view *v)
{
	int64_t g = sw_granule(p), L = p->limit;
	int64_t i = v->i, full = v->full, old = v->old, b, step, retry;
	double t = (double)now;

	for (step = 0; step <= SW_B; step++) {
		b = (i + 1) * g;
		if (cost <= L - full) { /* full + c <= L */
			if (old > 0) {
				t = (double)b -
				    (double)g * (double)(L - cost - full) /
					(double)old;
				if (t < (double)now)
					t = (double)now;
			}
			break;
		}
		old = sw_count(s, i - SW_B + 1);
		full -= old;
		i++;
	}
	retry = ceil_ms(ceil_us(t - (double)now));
	return retry < 1 ? 1 : retry;
}

/* floor(L - est') after the call, not floored at 0 (*v: the view). */
static double
sw_rem(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool recorded, struct sw_view *v)
{
	double est;

	sw_view(s, p, now, v);
	est = v->est;
	if (recorded) {
		/* est' = est + c, with est of phase 1 (bucket i without c). */
		est = (double)(v->full - cost) +
		    (double)v->old * sw_fraction(p, now, v->i);
		est = est + (double)cost;
	}
	return floor((double)p->limit - est);
}

static void
sw_result(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool allowed, bool recorded,
    struct rl_result *out)
{
	struct sw_view v;
	double rem;
	int64_t j;

	rem = sw_rem(s, p, now, cost, recorded, &v);
	out->remaining = rem <= 0 ? 0 : (int64_t)rem;
	out->reset_ms = 0;
	for (j = v.i; j >= v.i - SW_B; j--) {
		if (sw_count(s, j) > 0) {
			out->reset_ms = ceil_ms((j + 1) * sw_granule(p) +
			    p->window_us - now);
			break;
		}
	}
	if (!allowed)
		out->retry_after_ms = sw_retry(s, p, now, cost, &v);
}

static int64_t
sw_expiry(const struct limiter_state *s, const struct limiter_params *p)
{
	int64_t j;

	for (j = s->u.window.newest; j >= s->u.window.newest - SW_B; j--)
		if (sw_count(s, j) > 0)
			return (j + 1) * sw_granule(p) + p->window_us;
	return INT64_MIN;
}

/* --- the effective window ---------------------------------------------- */

/*
 * The RateLimit header's t (docs/algorithms.md, "The effective window"):
 * when nothing is used, the whole window; else the retry_after that a
 * request of remaining + 1 units would get now, i.e. when more quota comes
 * back.  No t for a concurrency rule: its units come back on release.
 */
static int64_t
limiter_effective(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t remaining)
{
	struct rl_result r = { 0 };

	if (p->algorithm == RL_ALG_CONCURRENCY)
		return 0;
	if (remaining >= p->limit)
		return ceil_ms(p->window_us);
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		log_result(s, p, now, remaining + 1, false, &r);
		break;
	case RL_ALG_FIXED_WINDOW:
		fixed_result(s, p, now, remaining + 1, false, &r);
		break;
	case RL_ALG_TOKEN_BUCKET:
		bucket_result(s, p, now, remaining + 1, false, &r);
		break;
	case RL_ALG_SLIDING_WINDOW:
		sw_result(s, p, now, remaining + 1, false, false, &r);
		break;
	case RL_ALG_CONCURRENCY:
		break;
	}
	return r.retry_after_ms;
}

/* --- the interface ----------------------------------------------------- */

int
limiter_check(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool *allowed, char *err, size_t errlen)
{
	if (s->algorithm != p->algorithm) {
		limiter_state_clear(s);
		limiter_state_init(s, p->algorithm);
	}
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		return log_check(s, p, now, cost, allowed, err, errlen);
	case RL_ALG_FIXED_WINDOW:
		fixed_check(s, p, now, cost, allowed);
		return 0;
	case RL_ALG_TOKEN_BUCKET:
		bucket_check(s, p, now, cost, allowed);
		return 0;
	case RL_ALG_SLIDING_WINDOW:
		return sw_check(s, p, now, cost, allowed, err, errlen);
	case RL_ALG_CONCURRENCY:
		return conc_check(s, p, now, cost, allowed, err, errlen);
	}
	snprintf(err, errlen, "unknown algorithm %d", (int)p->algorithm);
	return -1;
}

void
limiter_record(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost)
{
	if (cost <= 0)
		return;
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		log_record(s, now, cost);
		break;
	case RL_ALG_FIXED_WINDOW:
		s->u.fixed.n = units_add(s->u.fixed.n, cost);
		break;
	case RL_ALG_TOKEN_BUCKET:
		s->u.bucket.tat = bucket_record_tat(s, p, now, cost);
		break;
	case RL_ALG_SLIDING_WINDOW:
		sw_record(s, p, now, cost);
		break;
	case RL_ALG_CONCURRENCY:
		conc_record(s, p, now, cost);
		break;
	}
}

void
limiter_result(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool allowed, bool recorded,
    struct rl_result *out)
{
	out->allowed = allowed;
	out->remaining = 0;
	out->reset_ms = 0;
	out->retry_after_ms = 0;
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		log_result(s, p, now, cost, allowed, out);
		break;
	case RL_ALG_FIXED_WINDOW:
		fixed_result(s, p, now, cost, allowed, out);
		break;
	case RL_ALG_TOKEN_BUCKET:
		bucket_result(s, p, now, cost, allowed, out);
		break;
	case RL_ALG_SLIDING_WINDOW:
		sw_result(s, p, now, cost, allowed, recorded, out);
		break;
	case RL_ALG_CONCURRENCY:
		conc_result(s, p, now, cost, allowed, out);
		break;
	}
	out->effective_ms = limiter_effective(s, p, now, out->remaining);
}

int64_t
limiter_overdrawn(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool recorded)
{
	struct sw_view v;
	int64_t used = 0;
	double rem;

	if (s->algorithm != p->algorithm)
		return 0;
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		used = s->u.log.used;
		break;
	case RL_ALG_FIXED_WINDOW:
		/* the state's window: now's, or a later one it holds */
		used = fixed_reserved(s, p, now) ? s->u.fixed.n :
						   fixed_count(s, p, now);
		break;
	case RL_ALG_TOKEN_BUCKET:
		rem = bucket_rem(s, p, now);
		return over_units(rem);
	case RL_ALG_SLIDING_WINDOW:
		rem = sw_rem(s, p, now, cost, recorded, &v);
		return over_units(rem);
	case RL_ALG_CONCURRENCY:
		used = s->u.conc.used;
		break;
	}
	return used > p->limit ? used - p->limit : 0;
}

int64_t
limiter_expiry(const struct limiter_state *s, const struct limiter_params *p)
{
	if (s->algorithm != p->algorithm)
		return INT64_MIN; /* the next check resets it anyway */
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		return log_expiry(s, p);
	case RL_ALG_FIXED_WINDOW:
		return fixed_expiry(s, p);
	case RL_ALG_TOKEN_BUCKET:
		return bucket_expiry(s);
	case RL_ALG_SLIDING_WINDOW:
		return sw_expiry(s, p);
	case RL_ALG_CONCURRENCY:
		return conc_expiry(s);
	}
	return INT64_MIN;
}

size_t
limiter_state_bytes(const struct limiter_state *s)
{
	size_t n = sizeof(*s);

	if (s->algorithm == RL_ALG_SLIDING_LOG)
		n += s->u.log.cap * sizeof(struct limiter_run);
	else if (s->algorithm == RL_ALG_SLIDING_WINDOW &&
	    s->u.window.counts != NULL)
		n += SW_SLOTS * sizeof(int64_t);
	else if (s->algorithm == RL_ALG_CONCURRENCY)
		n += conc_bytes(s);
	return n;
}

int
limiter_take(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, struct rl_result *out, char *err, size_t errlen)
{
	bool allowed;

	if (limiter_check(s, p, now, cost, &allowed, err, errlen) == -1)
		return -1;
	if (allowed)
		limiter_record(s, p, now, cost);
	limiter_result(s, p, now, cost, allowed, allowed, out);
	return 0;
}

/* --- waiting (docs/algorithms.md, "Waiting for a turn") ----------------- */

/* sliding_log: not before the newest run; at t0 = max(from, newest) the
 * units of (t0 - W, t0] plus cost must fit, else t is when the k-th oldest
 * of them leaves the window, k = count + c - L. */
static int64_t
log_earliest(const struct limiter_state *s, const struct limiter_params *p,
    int64_t from, int64_t cost)
{
	int64_t t0 = from, count = 0, k, acc = 0;
	size_t j, first = 0;

	if (s->u.log.len > 0 && log_at(s, s->u.log.len - 1)->t > t0)
		t0 = log_at(s, s->u.log.len - 1)->t;
	while (first < s->u.log.len && log_at(s, first)->t <= t0 - p->window_us)
		first++;
	for (j = first; j < s->u.log.len; j++)
		count += log_at(s, j)->n;
	if (cost <= p->limit - count)
		return t0;
	k = count + cost - p->limit;
	for (j = first; j < s->u.log.len; j++) {
		acc += log_at(s, j)->n;
		if (acc >= k)
			return log_at(s, j)->t + p->window_us;
	}
	return INT64_MAX; /* cost > L: refused by the callers */
}

/* token_bucket: t >= from with max(tat, t) + c*W/L - t <= W + 1. */
static int64_t
bucket_earliest(const struct limiter_state *s, const struct limiter_params *p,
    int64_t from, int64_t cost)
{
	double inc = (double)cost * (double)p->window_us / (double)p->limit;
	double tat = s->u.bucket.tat, x;
	int64_t t = from;
	bool ok;

	bucket_check(s, p, t, cost, &ok);
	if (ok)
		return t;
	x = ceil(tat + inc - (double)p->window_us - 1);
	if (x > (double)t)
		t = (int64_t)x;
	for (;;) {
		bucket_check(s, p, t, cost, &ok);
		if (ok)
			return t;
		t++;
	}
}

int64_t
limiter_earliest(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t from, int64_t cost)
{
	bool ok;

	if (from < now)
		from = now;
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		return log_earliest(s, p, from, cost);
	case RL_ALG_FIXED_WINDOW:
		return fixed_earliest(s, p, from, cost);
	case RL_ALG_TOKEN_BUCKET:
		return bucket_earliest(s, p, from, cost);
	case RL_ALG_SLIDING_WINDOW:
		/* Never waits: admits now or never. */
		if (from != now)
			return INT64_MAX;
		ok = false;
		{
			struct sw_view v;

			sw_view(s, p, now, &v);
			ok = v.est + (double)cost <= (double)p->limit;
		}
		return ok ? now : INT64_MAX;
	case RL_ALG_CONCURRENCY:
		/* The lease is taken when the request is decided
		 * (docs/leases.md) and expires at now + W: one that fits now
		 * fits at a turn another rule gives it while the answer,
		 * sent ceil_ms(t - now) after the decision, finds at least
		 * 1 ms of it left.  One that does not fit is waited for by
		 * the daemon, not here; nor a look (no token), which never
		 * takes one. */
		return cost <= p->limit - s->u.conc.used &&
			(p->token != NULL || cost == 0) &&
			from <= now + p->window_us - LIMITER_LEASE_LEFT_US ?
		    from :
		    INT64_MAX;
	}
	return INT64_MAX;
}

int
limiter_reserve_room(struct limiter_state *s, const struct limiter_params *p,
    char *err, size_t errlen)
{
	size_t cap;

	if (p->algorithm == RL_ALG_SLIDING_LOG &&
	    s->u.log.len == s->u.log.cap) {
		/* Reserved units may take the log past L units (they lie
		 * after now), so the ring is not capped at L runs here. */
		cap = s->u.log.cap == 0 ? LOG_MIN_CAP : 2 * s->u.log.cap;
		if (log_resize(s, cap) == -1) {
			snprintf(err, errlen,
			    "out of memory (sliding_log of "
			    "%zu runs)",
			    cap);
			return -1;
		}
	}
	if (p->algorithm == RL_ALG_SLIDING_WINDOW &&
	    s->u.window.counts == NULL) {
		s->u.window.counts = rl_calloc(SW_SLOTS, sizeof(int64_t));
		if (s->u.window.counts == NULL) {
			snprintf(err, errlen,
			    "out of memory (sliding_window counts)");
			return -1;
		}
	}
	return 0;
}

void
limiter_record_at(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t t, int64_t cost)
{
	int64_t start;

	if (cost <= 0)
		return;
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		log_record(s, t, cost);
		break;
	case RL_ALG_FIXED_WINDOW:
		start = fixed_start(p, t);
		if (s->u.fixed.start != start) {
			s->u.fixed.start = start;
			s->u.fixed.n = 0;
		}
		s->u.fixed.n = units_add(s->u.fixed.n, cost);
		break;
	case RL_ALG_TOKEN_BUCKET:
		s->u.bucket.tat = bucket_record_tat(s, p, t, cost);
		break;
	case RL_ALG_SLIDING_WINDOW:
		/* In the bucket of now: the ring holds no later one. */
		sw_record(s, p, now, cost);
		break;
	case RL_ALG_CONCURRENCY:
		/* Admitted now (limiter_earliest()): the lease from now. */
		limiter_record(s, p, now, cost);
		break;
	}
}

/* --- taking quota in advance ------------------------------------------- */

int64_t
limiter_chunk(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, int64_t want, int64_t hold_us, int64_t *valid_us)
{
	double w = (double)p->window_us, dnow = (double)now, f;
	int64_t g, free_units = 0, x, k;
	struct sw_view v;

	*valid_us = hold_us;
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		free_units = p->limit - s->u.log.used - cost;
		break;
	case RL_ALG_FIXED_WINDOW:
		free_units = p->limit - s->u.fixed.n - cost;
		if (fixed_start(p, now) + p->window_us - now < *valid_us)
			*valid_us = fixed_start(p, now) + p->window_us - now;
		break;
	case RL_ALG_TOKEN_BUCKET:
		f = floor((w + 1 - (bucket_new_tat(s, p, now, cost) - dnow)) *
		    (double)p->limit / w);
		free_units = f <= 0	  ? 0 :
		    f >= (double)p->limit ? p->limit :
					    (int64_t)f;
		break;
	case RL_ALG_SLIDING_WINDOW:
		sw_view(s, p, now, &v);
		f = floor((double)p->limit - v.est - (double)cost);
		free_units = f <= 0 ? 0 : (int64_t)f;
		g = sw_granule(p);
		if ((v.i + 1) * g - now < *valid_us)
			*valid_us = (v.i + 1) * g - now;
		break;
	case RL_ALG_CONCURRENCY:
		break;
	}
	x = free_units < 0 ? 0 : free_units / LIMITER_PREFETCH_SHARE;
	if (x > want - cost)
		x = want - cost;
	if (x < 0 || p->algorithm == RL_ALG_CONCURRENCY)
		x = 0;
	k = cost + x;
	if (p->algorithm == RL_ALG_TOKEN_BUCKET &&
	    bucket_new_tat(s, p, now, k) - dnow > w + 1)
		k = cost; /* double rounding said no */
	switch (p->algorithm) {
	case RL_ALG_SLIDING_LOG:
		log_record(s, now + hold_us, k); /* at max(now + h, newest) */
		break;
	case RL_ALG_TOKEN_BUCKET:
		s->u.bucket.tat = bucket_record_tat(s, p, now + hold_us, k);
		break;
	default:
		limiter_record(s, p, now, k);
		break;
	}
	return k;
}
