/*
 * sketch.h - a log-bucketed histogram of doubles with a relative-error
 * guarantee on its quantiles (DDSketch style), plus the exact count, sum,
 * min and max of what it holds.  It is the C half of docs/stats.md; the
 * Redis half is lua/stats.lua, and both follow that page to the letter.
 *
 * A positive value v falls in bucket i = ceil(log(v) / log(gamma)) of the
 * positive set, a negative one in bucket ceil(log(-v) / log(gamma)) of the
 * negative set, and zero is counted on its own, exactly; gamma =
 * (1 + a) / (1 - a) for the relative accuracy a.  Bucket i stands for the
 * value 2 * gamma^i / (gamma + 1), within a of every value it holds.  A
 * set holds at most SKETCH_MAX_BUCKETS buckets: past that its
 * lowest-magnitude buckets are folded into the next one (docs/stats.md,
 * "Bounds").
 *
 * Pure: no I/O, no clock, no locks.  Memory through rl_malloc().  A sketch
 * is plain data; the caller serialises every use of one sketch.
 */
#ifndef RL_SKETCH_H
#define RL_SKETCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SKETCH_MIN_ACCURACY 0.0001
#define SKETCH_MAX_ACCURACY 0.1
#define SKETCH_MAX_BUCKETS  4096 /* per sign, per sketch */

/* The mapping of one relative accuracy; fill with sketch_params_set(). */
struct sketch_params {
	double accuracy; /* a */
	double gamma;	 /* (1 + a) / (1 - a) */
	double ln_gamma; /* log(gamma) */
};

struct sketch_bucket {
	int32_t index;
	uint64_t count; /* >= 1 */
};

/* One sign's buckets, sorted by index, at most SKETCH_MAX_BUCKETS. */
struct sketch_side {
	struct sketch_bucket *b;
	uint32_t n, cap;
};

/* Zero it (or sketch_init) before use; release with sketch_clear(). */
struct sketch {
	uint64_t count;	      /* every value added */
	uint64_t zeros;	      /* of which exactly 0 */
	double sum, min, max; /* min and max meaningful iff count > 0 */
	struct sketch_side pos, neg;
};

/* a in [SKETCH_MIN_ACCURACY, SKETCH_MAX_ACCURACY].  Returns 0, or -1
 * (a out of range). */
int sketch_params_set(struct sketch_params *p, double a);

/* The bucket index of magnitude m > 0 (finite): ceil(log(m) / ln_gamma),
 * clamped to the int32 range.  And the value bucket i stands for. */
int32_t sketch_index(const struct sketch_params *p, double m);
double sketch_bucket_value(const struct sketch_params *p, int32_t i);

void sketch_init(struct sketch *s);
/* Free the buckets; s is empty again.  sketch_clear(NULL) does nothing. */
void sketch_clear(struct sketch *s);

/* Add value v (finite) n >= 1 times.  Returns 0, or -1 on out of memory
 * (s unchanged). */
int sketch_add(struct sketch *s, const struct sketch_params *p, double v,
    uint64_t n) __attribute__((warn_unused_result));

/* Add every value of src (same params) to dst, in time linear in the
 * buckets of both: the union of their buckets, folded to the
 * SKETCH_MAX_BUCKETS highest indices of each sign (docs/stats.md,
 * "Bounds"), the same whatever the order of adds and merges.  Returns 0,
 * or -1 on out of memory (dst unchanged). */
int sketch_merge(struct sketch *dst, const struct sketch *src)
    __attribute__((warn_unused_result));

/* The q-quantile, q in [0, 1], of a non-empty sketch (docs/stats.md,
 * "Quantiles"): the value of the bucket holding rank floor(q * (count -
 * 1)), counted from 0 in increasing order, clamped to [min, max].  An
 * empty sketch gives 0. */
double sketch_quantile(const struct sketch *s, const struct sketch_params *p,
    double q);

/* Buckets held (both signs), for bounds and tests. */
size_t sketch_bucket_count(const struct sketch *s);

#endif
