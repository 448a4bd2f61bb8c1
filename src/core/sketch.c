/*
 * sketch.c - the log-bucketed histogram of docs/stats.md (see sketch.h).
 *
 * Each sign keeps its buckets in an array sorted by index: a value is
 * added by a binary search and, for a new bucket, one memmove.  The arrays
 * stay small (a few hundred buckets cover nine decades at a = 0.01), so
 * this beats a hash table in both memory and time, and it makes merging
 * and the quantile walk plain ordered scans.
 *
 * A merge is one such scan: the two sorted arrays are merged from the
 * back into the target's own array, then folded once to the
 * SKETCH_MAX_BUCKETS highest indices (as lua/stats.lua does).  Adding the
 * buckets one by one would cost a memmove of the whole array for each
 * bucket past the bound, and a read merges up to 1001 sub-windows of
 * 4096 buckets a sign.
 */
#include "core/sketch.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "base/util.h"

int
sketch_params_set(struct sketch_params *p, double a)
{
	if (!(a >= SKETCH_MIN_ACCURACY && a <= SKETCH_MAX_ACCURACY))
		return -1;
	p->accuracy = a;
	p->gamma = (1 + a) / (1 - a);
	p->ln_gamma = log(p->gamma);
	return 0;
}

int32_t
sketch_index(const struct sketch_params *p, double m)
{
	double i = ceil(log(m) / p->ln_gamma);

	if (i < (double)INT32_MIN)
		return INT32_MIN;
	if (i > (double)INT32_MAX)
		return INT32_MAX;
	return (int32_t)i;
}

double
sketch_bucket_value(const struct sketch_params *p, int32_t i)
{
	return 2 * pow(p->gamma, i) / (p->gamma + 1);
}

void
sketch_init(struct sketch *s)
{
	memset(s, 0, sizeof(*s));
}

void
sketch_clear(struct sketch *s)
{
	if (s == NULL)
		return;
	rl_free(s->pos.b);
	rl_free(s->neg.b);
	sketch_init(s);
}

/* a + b, saturated at the largest finite double of its sign: the sum of
 * values each finite stays finite (docs/stats.md "Bounds"), however many. */
static double
sum_add(double a, double b)
{
	double r = a + b;

	if (isinf(r))
		return r > 0 ? DBL_MAX : -DBL_MAX;
	return r;
}

/* The position of index i in d: where it is, or where it would go. */
static uint32_t
side_find(const struct sketch_side *d, int32_t i, bool *found)
{
	uint32_t lo = 0, hi = d->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (d->b[mid].index < i)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = lo < d->n && d->b[lo].index == i;
	return lo;
}

/* Add n to bucket i of d; fold the lowest buckets past the bound. */
static int
side_add(struct sketch_side *d, int32_t i, uint64_t n)
{
	bool found;
	uint32_t at = side_find(d, i, &found);

	if (found) {
		d->b[at].count += n;
		return 0;
	}
	if (d->n == d->cap) {
		uint32_t cap = d->cap == 0 ? 8 : d->cap * 2;
		struct sketch_bucket *nb;

		if ((nb = rl_realloc(d->b, (size_t)cap * sizeof(*nb))) == NULL)
			return -1;
		d->b = nb;
		d->cap = cap;
	}
	memmove(d->b + at + 1, d->b + at, (d->n - at) * sizeof(*d->b));
	d->b[at].index = i;
	d->b[at].count = n;
	d->n++;
	if (d->n > SKETCH_MAX_BUCKETS) {
		/* docs/stats.md, "Bounds": the lowest bucket goes into the
		 * next one up. */
		d->b[1].count += d->b[0].count;
		memmove(d->b, d->b + 1, (d->n - 1) * sizeof(*d->b));
		d->n--;
	}
	return 0;
}

int
sketch_add(struct sketch *s, const struct sketch_params *p, double v,
    uint64_t n)
{
	if (v > 0) {
		if (side_add(&s->pos, sketch_index(p, v), n) < 0)
			return -1;
	} else if (v < 0) {
		if (side_add(&s->neg, sketch_index(p, -v), n) < 0)
			return -1;
	} else {
		s->zeros += n;
	}
	if (s->count == 0 || v < s->min)
		s->min = v;
	if (s->count == 0 || v > s->max)
		s->max = v;
	s->count += n;
	s->sum = sum_add(s->sum,
	    sum_add(v * (double)(n / 2), v * (double)(n - n / 2)));
	return 0;
}

/* Room in d for n buckets; its buckets are kept.  0, or -1 (d unchanged). */
static int
side_reserve(struct sketch_side *d, uint32_t n)
{
	struct sketch_bucket *nb;
	uint32_t cap;

	if (n <= d->cap)
		return 0;
	cap = d->cap * 2 > n ? d->cap * 2 : n;
	if ((nb = rl_realloc(d->b, (size_t)cap * sizeof(*nb))) == NULL)
		return -1;
	d->b = nb;
	d->cap = cap;
	return 0;
}

/*
 * Add src's buckets to dst, whose array has room for dst->n + src->n.  The
 * two sorted arrays are merged from the back, so that no bucket of dst is
 * overwritten before it is read (the write position never falls below the
 * read one), then the result is folded once: past SKETCH_MAX_BUCKETS, the
 * counts of the lowest indices go to the lowest index kept (docs/stats.md,
 * "Bounds"), which is what adding the buckets one by one gives.
 */
static void
side_merge(struct sketch_side *dst, const struct sketch_side *src)
{
	struct sketch_bucket *b = dst->b;
	uint32_t i = dst->n, j = src->n, end = dst->n + src->n, w = end;
	uint32_t n, first, k;

	/* w - i = j + the indices found in both so far: never below j. */
	while (j > 0) {
		if (i > 0 && b[i - 1].index > src->b[j - 1].index)
			b[--w] = b[--i];
		else if (i > 0 && b[i - 1].index == src->b[j - 1].index) {
			w--;
			i--;
			j--;
			b[w].index = b[i].index;
			b[w].count = b[i].count + src->b[j].count;
		} else
			b[--w] = src->b[--j];
	}
	/* What is left of dst, b[0 .. i), goes right below what is merged:
	 * it is there already unless some indices were in both. */
	if (w > i)
		memmove(b + w - i, b, i * sizeof(*b));
	w -= i;
	n = end - w;
	first = w;
	if (n > SKETCH_MAX_BUCKETS) {
		first = end - SKETCH_MAX_BUCKETS;
		for (k = w; k < first; k++)
			b[first].count += b[k].count;
		n = SKETCH_MAX_BUCKETS;
	}
	if (first > 0)
		memmove(b, b + first, n * sizeof(*b));
	dst->n = n;
}

int
sketch_merge(struct sketch *dst, const struct sketch *src)
{
	if (src->count == 0)
		return 0;
	if (side_reserve(&dst->pos, dst->pos.n + src->pos.n) < 0 ||
	    side_reserve(&dst->neg, dst->neg.n + src->neg.n) < 0)
		return -1;
	side_merge(&dst->pos, &src->pos);
	side_merge(&dst->neg, &src->neg);
	if (dst->count == 0 || src->min < dst->min)
		dst->min = src->min;
	if (dst->count == 0 || src->max > dst->max)
		dst->max = src->max;
	dst->zeros += src->zeros;
	dst->count += src->count;
	dst->sum = sum_add(dst->sum, src->sum);
	return 0;
}

static double
clamp(const struct sketch *s, double v)
{
	return v < s->min ? s->min : v > s->max ? s->max : v;
}

double
sketch_quantile(const struct sketch *s, const struct sketch_params *p, double q)
{
	uint64_t rank, seen = 0;
	uint32_t k;

	if (s->count == 0)
		return 0;
	if (q <= 0)
		return s->min;
	if (q >= 1)
		return s->max;
	rank = (uint64_t)floor(q * (double)(s->count - 1));
	/* Increasing order: negatives from the largest magnitude down,
	 * zeros, positives from the smallest magnitude up. */
	for (k = s->neg.n; k-- > 0;) {
		seen += s->neg.b[k].count;
		if (seen > rank)
			return clamp(s,
			    -sketch_bucket_value(p, s->neg.b[k].index));
	}
	seen += s->zeros;
	if (seen > rank)
		return 0;
	for (k = 0; k < s->pos.n; k++) {
		seen += s->pos.b[k].count;
		if (seen > rank)
			return clamp(s,
			    sketch_bucket_value(p, s->pos.b[k].index));
	}
	return s->max;
}

size_t
sketch_bucket_count(const struct sketch *s)
{
	return (size_t)s->pos.n + s->neg.n;
}
