/*
 * stats_window.c - the sliding window of docs/stats.md on a ring of
 * sketches (see stats_window.h).
 *
 * Sub-window s lives in slot s mod nsub.  nsub = ceil(W / R) + 1 is the
 * most sub-windows ever live at once (floor(now / R) - floor((now - W) /
 * R) <= ceil(W / R)), so a slot is reused only once what it held is dead;
 * each slot remembers which sub-window it holds, and one found holding an
 * older one is emptied before it is written or ignored when read.
 *
 * A window whose stat changed only its window length (a reload) keeps its
 * sub-windows: they move to a ring of the new size by their number, minus
 * those the old window had already let go (docs/stats.md "Reloads and
 * limits"); a change of resolution or accuracy starts it empty.
 */
#include "core/stats_window.h"

#include <stdio.h>
#include <string.h>

#include "base/util.h"

/* floor(a / b) for b > 0, a of either sign. */
static int64_t
floor_div(int64_t a, int64_t b)
{
	int64_t q = a / b;

	return (a % b != 0 && a < 0) ? q - 1 : q;
}

int
stats_window_params_set(struct stats_window_params *p, int64_t window_ms,
    int64_t resolution_ms, double accuracy, char *err, size_t errlen)
{
	int64_t n;

	if (window_ms < 1 || resolution_ms < 1 || resolution_ms > window_ms) {
		snprintf(err, errlen,
		    "resolution must be between 1ms and the "
		    "window");
		return -1;
	}
	n = (window_ms + resolution_ms - 1) / resolution_ms;
	if (n > STATS_MAX_SUBWINDOWS) {
		snprintf(err, errlen, "window / resolution must be at most %d",
		    STATS_MAX_SUBWINDOWS);
		return -1;
	}
	if (sketch_params_set(&p->sketch, accuracy) < 0) {
		snprintf(err, errlen,
		    "relative_accuracy must be between %g "
		    "and %g",
		    SKETCH_MIN_ACCURACY, SKETCH_MAX_ACCURACY);
		return -1;
	}
	p->window_ms = window_ms;
	p->resolution_ms = resolution_ms;
	p->nsub = (uint32_t)n + 1;
	return 0;
}

void
stats_window_init(struct stats_window *w)
{
	memset(w, 0, sizeof(*w));
	w->last = -1;
}

void
stats_window_clear(struct stats_window *w)
{
	uint32_t k;

	if (w == NULL)
		return;
	for (k = 0; k < w->nsub && w->sub != NULL; k++)
		sketch_clear(&w->sub[k]);
	rl_free(w->sub);
	rl_free(w->id);
	stats_window_init(w);
}

/* The time (ms) from which sub-window s is dead under window W. */
static int64_t
sub_expiry_ms(int64_t s, int64_t resolution_ms, int64_t window_ms)
{
	return (s + 1) * resolution_ms + window_ms;
}

/*
 * Move w's sub-windows into a ring of p->nsub slots, slot s mod nsub as
 * always, keeping those still live at now_ms under w's old window: the
 * ones it had let go stay gone, as on Redis, where their TTL has fired.
 * Two landing on one slot (a smaller ring) keep the newer: the older is
 * dead under the new window (their numbers are nsub or more apart).
 */
static int
refit(struct stats_window *w, const struct stats_window_params *p,
    int64_t now_ms)
{
	struct sketch *sub = rl_calloc(p->nsub, sizeof(*sub));
	int64_t *id = rl_malloc(p->nsub * sizeof(*id));
	uint32_t k, slot;

	if (sub == NULL || id == NULL) {
		rl_free(sub);
		rl_free(id);
		return -1;
	}
	for (k = 0; k < p->nsub; k++)
		id[k] = -1;
	for (k = 0; k < w->nsub; k++) {
		int64_t s = w->id[k];

		if (s < 0 ||
		    sub_expiry_ms(s, w->resolution_ms, w->window_ms) <=
			now_ms) {
			sketch_clear(&w->sub[k]);
			continue;
		}
		slot = (uint32_t)(s % p->nsub);
		if (id[slot] > s) {
			sketch_clear(&w->sub[k]);
			continue;
		}
		sketch_clear(&sub[slot]);
		sub[slot] = w->sub[k]; /* its buckets move with it */
		id[slot] = s;
	}
	rl_free(w->sub);
	rl_free(w->id);
	w->sub = sub;
	w->id = id;
	w->nsub = p->nsub;
	w->window_ms = p->window_ms;
	return 0;
}

/* Make w fit p at now_ms: the same, moved to a ring of another size, or
 * empty (another resolution or accuracy, or never used). */
static int
fit(struct stats_window *w, const struct stats_window_params *p, int64_t now_ms)
{
	uint32_t k;

	if (w->sub != NULL && w->accuracy == p->sketch.accuracy &&
	    w->resolution_ms == p->resolution_ms) {
		if (w->nsub == p->nsub && w->window_ms == p->window_ms)
			return 0;
		return refit(w, p, now_ms);
	}
	stats_window_clear(w);
	w->sub = rl_calloc(p->nsub, sizeof(*w->sub));
	w->id = rl_malloc(p->nsub * sizeof(*w->id));
	if (w->sub == NULL || w->id == NULL) {
		rl_free(w->sub);
		rl_free(w->id);
		stats_window_init(w);
		return -1;
	}
	for (k = 0; k < p->nsub; k++)
		w->id[k] = -1;
	w->nsub = p->nsub;
	w->accuracy = p->sketch.accuracy;
	w->resolution_ms = p->resolution_ms;
	w->window_ms = p->window_ms;
	return 0;
}

int
stats_window_adapt(struct stats_window *w, const struct stats_window_params *p,
    int64_t now_ms)
{
	if (w->sub == NULL)
		return 0;
	return fit(w, p, now_ms);
}

int
stats_window_record(struct stats_window *w, const struct stats_window_params *p,
    int64_t now_ms, double v)
{
	int64_t s = floor_div(now_ms, p->resolution_ms);
	uint32_t slot;

	if (fit(w, p, now_ms) < 0)
		return -1;
	slot = (uint32_t)(s % p->nsub);
	if (w->id[slot] != s) {
		sketch_clear(&w->sub[slot]);
		w->id[slot] = s;
	}
	if (sketch_add(&w->sub[slot], &p->sketch, v, 1) < 0)
		return -1;
	if (s > w->last)
		w->last = s;
	return 0;
}

int
stats_window_read(const struct stats_window *w,
    const struct stats_window_params *p, int64_t now_ms, struct sketch *out)
{
	int64_t hi = floor_div(now_ms, p->resolution_ms);
	int64_t lo = floor_div(now_ms - p->window_ms, p->resolution_ms);
	uint32_t k;

	if (w->sub == NULL || w->nsub != p->nsub ||
	    w->accuracy != p->sketch.accuracy ||
	    w->resolution_ms != p->resolution_ms ||
	    w->window_ms != p->window_ms)
		return 0; /* not adapted to p: as if empty */
	/* Oldest first, as lua/stats.lua merges. */
	for (k = 0; k < w->nsub; k++) {
		int64_t s = lo + k;

		if (s > hi)
			break;
		if (s < 0)
			continue;
		if (w->id[s % w->nsub] == s &&
		    sketch_merge(out, &w->sub[s % w->nsub]) < 0)
			return -1;
	}
	return 0;
}

int64_t
stats_window_expiry_ms(const struct stats_window *w,
    const struct stats_window_params *p)
{
	if (w->last < 0)
		return 0;
	return (w->last + 1) * p->resolution_ms + p->window_ms;
}
