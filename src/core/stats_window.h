/*
 * stats_window.h - one stat key's sliding window (docs/stats.md) as a ring of
 * sub-windows, each a sketch (sketch.h), for the in-process store.  The
 * Redis store keeps the same sub-windows as hashes (lua/stats.lua); both
 * follow docs/stats.md.
 *
 * Time is in milliseconds, passed in.  Sub-window s holds the events of
 * [s * R, (s + 1) * R) for the resolution R.  At time now the live
 * sub-windows are floor((now - W) / R) .. floor(now / R) for the window W:
 * every event of the last W, none older than W + R.
 *
 * Pure: no I/O, no clock, no locks; the caller serialises every use of one
 * window (the memory store holds its stripe's lock).
 */
#ifndef RL_STATS_WINDOW_H
#define RL_STATS_WINDOW_H

#include <stddef.h>
#include <stdint.h>

#include "core/sketch.h"

/* A stat's parameters; fill with stats_window_params_set(). */
struct stats_window_params {
	struct sketch_params sketch;
	int64_t window_ms;     /* W >= 1 */
	int64_t resolution_ms; /* R, 1 .. W */
	uint32_t nsub;	       /* ring size: ceil(W / R) + 1 */
};

#define STATS_MAX_SUBWINDOWS 1000 /* W / R at most this */

struct stats_window {
	struct sketch *sub; /* nsub sketches */
	int64_t *id;	    /* the sub-window each holds; -1 none */
	uint32_t nsub;
	double accuracy; /* the params it was built with */
	int64_t resolution_ms;
	int64_t window_ms;
	int64_t last; /* newest sub-window recorded, -1 none */
};

/* Returns 0, or -1 with a message in err (a bound broken). */
int stats_window_params_set(struct stats_window_params *p, int64_t window_ms,
    int64_t resolution_ms, double accuracy, char *err, size_t errlen);

/* Zero it (or stats_window_init) before use; stats_window_clear() frees
 * it.  A window recorded in with another resolution or accuracy than it
 * was built with starts empty; with only another window length it keeps
 * its sub-windows (stats_window_adapt). */
void stats_window_init(struct stats_window *w);
void stats_window_clear(struct stats_window *w);

/* Record v (finite) at now_ms >= 0.  Returns 0, or -1 on out of memory
 * (nothing recorded). */
int stats_window_record(struct stats_window *w,
    const struct stats_window_params *p, int64_t now_ms, double v)
    __attribute__((warn_unused_result));

/* Make w fit p at now_ms, as stats_window_record() does first: after a
 * change of window length only, the sub-windows still live under the old
 * window move to a ring of the new size; after a change of resolution or
 * accuracy w is emptied.  A window never recorded in is left as it is.
 * Returns 0, or -1 on out of memory. */
int stats_window_adapt(struct stats_window *w,
    const struct stats_window_params *p, int64_t now_ms)
    __attribute__((warn_unused_result));

/* Merge the live sub-windows at now_ms into out (an empty sketch; the
 * caller clears it).  A window not adapted to p (stats_window_adapt)
 * reads as empty.  Returns 0, or -1 on out of memory. */
int stats_window_read(const struct stats_window *w,
    const struct stats_window_params *p, int64_t now_ms, struct sketch *out)
    __attribute__((warn_unused_result));

/* The time (ms) from which no recorded event is live any more: the
 * store's expiry for the key.  0 for a window never recorded in. */
int64_t stats_window_expiry_ms(const struct stats_window *w,
    const struct stats_window_params *p);

#endif
