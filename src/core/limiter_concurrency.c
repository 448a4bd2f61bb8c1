/*
 * limiter_concurrency.c - the concurrency algorithm of docs/algorithms.md
 * (docs/leases.md): a key holds leases, each `cost` units until it expires,
 * and a request is admitted while the units held stay within the limit.
 * The in-process twin of the concurrency part of lua/ratelimit.lua and of
 * lua/lease.lua; limiter.c dispatches here.
 *
 * DESIGN
 *
 * The leases of a key are an array sorted by expiry, oldest first: expiring
 * drops a prefix, the retry of a denied request walks from the front, and
 * the newest expiry (the state's own) is the last.  A new lease expires at
 * now + W, at or after every other one unless a reload shortened W or the
 * clock stepped back, so it is nearly always appended; a renewed one moves
 * to its place.  At most L leases are held (each holds a unit or more), so
 * the array grows by doubling up to L, in phase 1 as limiter.h requires,
 * and halves when less than a quarter full.
 */
#include "core/limiter_concurrency.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

#define CONC_MIN_CAP 4

static int64_t
ceil_ms(int64_t x)
{
	return util_ceil_div(x, 1000);
}

void
conc_clear(struct limiter_state *s)
{
	rl_free(s->u.conc.leases);
	s->u.conc.leases = NULL;
	s->u.conc.cap = s->u.conc.len = 0;
	s->u.conc.used = 0;
}

static int
conc_resize(struct limiter_state *s, size_t cap)
{
	struct limiter_lease *l;

	if (cap > SIZE_MAX / sizeof(*l))
		return -1;
	if ((l = rl_realloc(s->u.conc.leases, cap * sizeof(*l))) == NULL)
		return -1;
	s->u.conc.leases = l;
	s->u.conc.cap = cap;
	return 0;
}

/* Remove lease k, keeping the order. */
static void
conc_remove(struct limiter_state *s, size_t k)
{
	s->u.conc.used -= s->u.conc.leases[k].cost;
	memmove(&s->u.conc.leases[k], &s->u.conc.leases[k + 1],
	    (s->u.conc.len - k - 1) * sizeof(struct limiter_lease));
	s->u.conc.len--;
}

/* Put *l in its place by expiry (room for it is there). */
static void
conc_insert(struct limiter_state *s, const struct limiter_lease *l)
{
	size_t k = s->u.conc.len;

	assert(s->u.conc.len < s->u.conc.cap);
	while (k > 0 && s->u.conc.leases[k - 1].expires > l->expires)
		k--;
	memmove(&s->u.conc.leases[k + 1], &s->u.conc.leases[k],
	    (s->u.conc.len - k) * sizeof(*l));
	s->u.conc.leases[k] = *l;
	s->u.conc.len++;
	s->u.conc.used += l->cost;
}

/* Drop leases with expires <= now: their units are free again. */
static void
conc_expire(struct limiter_state *s, int64_t now)
{
	size_t k = 0;

	while (k < s->u.conc.len && s->u.conc.leases[k].expires <= now)
		s->u.conc.used -= s->u.conc.leases[k++].cost;
	if (k > 0) {
		memmove(s->u.conc.leases, &s->u.conc.leases[k],
		    (s->u.conc.len - k) * sizeof(struct limiter_lease));
		s->u.conc.len -= k;
	}
	if (s->u.conc.cap > CONC_MIN_CAP && s->u.conc.len < s->u.conc.cap / 4)
		(void)conc_resize(s, s->u.conc.cap / 2);
}

/* The index of the lease of token and cost, or len. */
static size_t
conc_find(const struct limiter_state *s, const char *token, int64_t cost)
{
	size_t k;

	for (k = 0; k < s->u.conc.len; k++)
		if (s->u.conc.leases[k].cost == cost &&
		    strcmp(s->u.conc.leases[k].token, token) == 0)
			break;
	return k;
}

int
conc_check(struct limiter_state *s, const struct limiter_params *p, int64_t now,
    int64_t cost, bool *allowed, char *err, size_t errlen)
{
	size_t cap;

	conc_expire(s, now);
	/* No token: a look that takes no lease, denied (backend.h). */
	*allowed = cost <= p->limit - s->u.conc.used &&
	    (p->token != NULL || cost == 0);
	if (!*allowed || cost == 0 || s->u.conc.len < s->u.conc.cap)
		return 0;
	/* Admitted with cost >= 1: len <= used < L, so min(2 cap, L) > len. */
	cap = s->u.conc.cap == 0 ? CONC_MIN_CAP : 2 * s->u.conc.cap;
	if ((uint64_t)cap > (uint64_t)p->limit)
		cap = (size_t)p->limit;
	if (conc_resize(s, cap) == -1) {
		snprintf(err, errlen, "out of memory (%zu leases)", cap);
		return -1;
	}
	return 0;
}

void
conc_record(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost)
{
	struct limiter_lease l;

	memset(&l, 0, sizeof(l));
	l.expires = now + p->window_us;
	l.cost = cost;
	if (p->token != NULL)
		snprintf(l.token, sizeof(l.token), "%s", p->token);
	conc_insert(s, &l);
}

void
conc_result(const struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool allowed, struct rl_result *out)
{
	int64_t used = s->u.conc.used, k, acc = 0;
	size_t j;

	out->remaining = used >= p->limit ? 0 : p->limit - used;
	out->reset_ms = s->u.conc.len == 0 ?
	    0 :
	    ceil_ms(s->u.conc.leases[s->u.conc.len - 1].expires - now);
	if (allowed)
		return;
	/* k = used + c - L units must be freed: by expiry, oldest first
	 * (at least 1: a look denied with room waits for the oldest). */
	k = used - p->limit + cost;
	if (k < 1)
		k = 1;
	for (j = 0; j < s->u.conc.len; j++) {
		acc += s->u.conc.leases[j].cost;
		if (acc >= k) {
			out->retry_after_ms = ceil_ms(
			    s->u.conc.leases[j].expires - now);
			if (out->retry_after_ms < 1)
				out->retry_after_ms = 1;
			return;
		}
	}
	out->retry_after_ms = 1; /* no lease held: a look */
}

int64_t
conc_expiry(const struct limiter_state *s)
{
	if (s->u.conc.len == 0)
		return INT64_MIN;
	return s->u.conc.leases[s->u.conc.len - 1].expires;
}

size_t
conc_bytes(const struct limiter_state *s)
{
	return s->u.conc.cap * sizeof(struct limiter_lease);
}

bool
limiter_lease_release(struct limiter_state *s, int64_t now, const char *token,
    int64_t cost)
{
	size_t k;

	if (s->algorithm != RL_ALG_CONCURRENCY)
		return false;
	conc_expire(s, now);
	if ((k = conc_find(s, token, cost)) == s->u.conc.len)
		return false;
	conc_remove(s, k);
	return true;
}

bool
limiter_lease_renew(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, const char *token, int64_t cost)
{
	struct limiter_lease l;
	size_t k;

	if (s->algorithm != RL_ALG_CONCURRENCY)
		return false;
	conc_expire(s, now);
	if ((k = conc_find(s, token, cost)) == s->u.conc.len)
		return false;
	l = s->u.conc.leases[k];
	conc_remove(s, k);
	l.expires = now + p->window_us;
	conc_insert(s, &l);
	return true;
}
