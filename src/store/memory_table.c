/*
 * memory_table.c - the memory store's table (see memory_priv.h): keys
 * hashed into stripes, each a chained hash table under its own mutex,
 * and the expiry and sweeping that give their memory back.
 *
 * Each entry has an expiry, set like the Redis store's TTL: when a call
 * records in it, to limiter_expiry() (from then on the state changes no
 * answer); a call that only reads leaves it alone.  Expired entries are
 * reclaimed on lookup (reset in place), by a sweep of two hash chains of
 * the stripe on every insert (so a stripe is swept in full every
 * nbuckets / 2 inserts and expired entries never outnumber live ones by
 * much), by deleting a state left empty at the end of a call (cost 0 on a
 * new key stores nothing), by a full sweep when the store is at max_keys
 * (at most once a second) or when backend_memory_key_count() is asked,
 * and by a sweep that moves with the traffic, whatever its keys: every
 * call, as it ends, sweeps the next MEMORY_STEP_CHAINS chains of one
 * stripe, the next in turn for its thread, if that stripe's lock is free
 * (a try-lock: the step never waits).  So after a burst of keys the
 * memory comes back while later calls use keys the store already has
 * (every stripe's table in full within about 2 * chains / 8 calls), not
 * only when new keys arrive.  A stripe knows a time before which none of
 * its entries expires (soonest: the least expiry its last full round of
 * sweeping saw, and any expiry given since), and until then its sweeps
 * walk no chain: a store whose keys all live on costs each call no walk
 * over entries that are not in its cache.  A stripe's table doubles when it
 * holds more entries than chains and halves, one halving per sweep step, when
 * it holds fewer than a quarter (never below MEMORY_INITIAL_BUCKETS): after a
 * halving it is under half full, so growing and shrinking never chase each
 * other.  While a call uses an entry its expiry is MEMORY_PINNED, so no
 * sweep frees it under it.
 *
 * Thread: any; every function that takes a stripe says whether its lock
 * must be held.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "core/limiter.h"
#include "store/memory_priv.h"

/* --- hashing ----------------------------------------------------------- */

#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND \
	do { \
		v0 += v1; \
		v1 = ROTL64(v1, 13); \
		v1 ^= v0; \
		v0 = ROTL64(v0, 32); \
		v2 += v3; \
		v3 = ROTL64(v3, 16); \
		v3 ^= v2; \
		v0 += v3; \
		v3 = ROTL64(v3, 21); \
		v3 ^= v0; \
		v2 += v1; \
		v1 = ROTL64(v1, 17); \
		v1 ^= v2; \
		v2 = ROTL64(v2, 32); \
	} while (0)

uint64_t
memory_siphash(const uint64_t k[2], const unsigned char *in, size_t len)
{
	uint64_t v0 = UINT64_C(0x736f6d6570736575) ^ k[0];
	uint64_t v1 = UINT64_C(0x646f72616e646f6d) ^ k[1];
	uint64_t v2 = UINT64_C(0x6c7967656e657261) ^ k[0];
	uint64_t v3 = UINT64_C(0x7465646279746573) ^ k[1];
	uint64_t m, last = (uint64_t)len << 56;
	size_t i, j, tail = len & 7;

	for (i = 0; i + 8 <= len; i += 8) {
		m = 0;
		for (j = 0; j < 8; j++)
			m |= (uint64_t)in[i + j] << (8 * j);
		v3 ^= m;
		SIPROUND;
		SIPROUND;
		v0 ^= m;
	}
	for (j = 0; j < tail; j++)
		last |= (uint64_t)in[i + j] << (8 * j);
	v3 ^= last;
	SIPROUND;
	SIPROUND;
	v0 ^= last;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* --- one stripe (its lock held) ---------------------------------------- */

static void
memory_entry_free(struct memory_backend *m, struct memory_stripe *st,
    struct memory_entry *e)
{
	limiter_state_clear(&e->state);
	rl_free(e);
	st->count--;
	atomic_fetch_sub(&m->nkeys, 1);
}

/* Unlink and free e. */
void
memory_remove(struct memory_backend *m, struct memory_stripe *st,
    struct memory_entry *e)
{
	struct memory_entry **pp = &st->buckets[e->hash & (st->nbuckets - 1)];

	while (*pp != e)
		pp = &(*pp)->next;
	*pp = e->next;
	memory_entry_free(m, st, e);
}

/* An entry of st was given the expiry t: soonest is at most t. */
void
memory_note_expiry(struct memory_stripe *st, int64_t t)
{
	if (t < st->soonest)
		st->soonest = t;
	if (t < st->cycle_soonest)
		st->cycle_soonest = t;
}

/* Free the expired entries of chain `b`; the others' expiries count
 * towards the round's soonest. */
static void
memory_sweep_chain(struct memory_backend *m, struct memory_stripe *st, size_t b,
    int64_t now)
{
	struct memory_entry **pp = &st->buckets[b], *e;

	while ((e = *pp) != NULL) {
		if (e->expires <= now) {
			*pp = e->next;
			memory_entry_free(m, st, e);
		} else {
			if (e->expires < st->cycle_soonest)
				st->cycle_soonest = e->expires;
			pp = &e->next;
		}
	}
}

/*
 * Sweep the next `chains` chains of st, unless none of its entries can
 * have expired at now.  A round that comes back to chain 0 has seen every
 * entry (a resize starts a new one), or been told of its new expiry by
 * memory_note_expiry(): its least is the stripe's soonest from then on.
 * An entry pinned when seen counts as never expiring; it is noted when
 * its call ends.
 */
static void
memory_sweep_some(struct memory_backend *m, struct memory_stripe *st,
    size_t chains, int64_t now)
{
	size_t k;

	for (k = 0; k < chains && k < st->nbuckets && now >= st->soonest; k++) {
		memory_sweep_chain(m, st, st->sweep, now);
		st->sweep = (st->sweep + 1) & (st->nbuckets - 1);
		if (st->sweep == 0) {
			st->soonest = st->cycle_soonest;
			st->cycle_soonest = INT64_MAX;
		}
	}
}

/* Move st's entries to a table of n chains (a power of two).  Best effort:
 * without memory the table stays as it is. */
static void
memory_resize(struct memory_stripe *st, size_t n)
{
	struct memory_entry **nb, *e, *next;
	size_t b;

	if (n > SIZE_MAX / sizeof(*nb) ||
	    (nb = rl_calloc(n, sizeof(*nb))) == NULL)
		return;
	for (b = 0; b < st->nbuckets; b++) {
		for (e = st->buckets[b]; e != NULL; e = next) {
			next = e->next;
			e->next = nb[e->hash & (n - 1)];
			nb[e->hash & (n - 1)] = e;
		}
	}
	rl_free(st->buckets);
	st->buckets = nb;
	st->nbuckets = n;
	st->sweep = 0;
	st->cycle_soonest = INT64_MAX;
}

/* Double the table when it is fuller than one entry per chain. */
static void
memory_maybe_grow(struct memory_stripe *st)
{
	if (st->count > st->nbuckets)
		memory_resize(st, st->nbuckets * 2);
}

/* Halve the table when it is less than a quarter full, down to
 * MEMORY_INITIAL_BUCKETS; true if it did. */
static bool
memory_maybe_shrink(struct memory_stripe *st)
{
	size_t n = st->nbuckets;

	if (n <= MEMORY_INITIAL_BUCKETS || st->count >= n / 4)
		return false;
	memory_resize(st, n / 2);
	return st->nbuckets < n;
}

/*
 * A new, pinned, empty entry for key in st.  Returns MEMORY_OK, MEMORY_FULL
 * (max_keys reached) or MEMORY_ERROR (out of memory, with err).
 */
enum memory_attempt
memory_insert(struct memory_backend *m, struct memory_stripe *st,
    const struct rl_check *c, const struct memory_slot *slot, int64_t now,
    struct memory_entry **out, char *err, size_t errlen)
{
	struct memory_entry *e;

	memory_sweep_some(m, st, MEMORY_SWEEP_CHAINS, now);
	if (atomic_fetch_add(&m->nkeys, 1) >= m->max_keys && m->max_keys > 0) {
		atomic_fetch_sub(&m->nkeys, 1);
		return MEMORY_FULL;
	}
	if (c->keylen > SIZE_MAX - sizeof(*e) ||
	    (e = rl_malloc(sizeof(*e) + c->keylen)) == NULL) {
		atomic_fetch_sub(&m->nkeys, 1);
		snprintf(err, errlen,
		    "memory store: out of memory "
		    "(new key of %zu bytes)",
		    c->keylen);
		return MEMORY_ERROR;
	}
	e->hash = slot->hash;
	e->expires = MEMORY_PINNED;
	limiter_state_init(&e->state, c->algorithm);
	e->keylen = c->keylen;
	memcpy(e->key, c->key, c->keylen);
	e->next = st->buckets[e->hash & (st->nbuckets - 1)];
	st->buckets[e->hash & (st->nbuckets - 1)] = e;
	st->count++;
	memory_maybe_grow(st);
	*out = e;
	return MEMORY_OK;
}

/* --- every stripe ------------------------------------------------------ */

void
memory_lock_mask(struct memory_backend *m, uint64_t mask)
{
	unsigned i;

	for (i = 0; i < MEMORY_STRIPES; i++)
		if (mask & (UINT64_C(1) << i))
			pthread_mutex_lock(&m->stripes[i].s.lock);
}

void
memory_unlock_mask(struct memory_backend *m, uint64_t mask)
{
	unsigned i;

	for (i = MEMORY_STRIPES; i-- > 0;)
		if (mask & (UINT64_C(1) << i))
			pthread_mutex_unlock(&m->stripes[i].s.lock);
}

/* Free every expired entry of every stripe, one stripe locked at a time. */
void
memory_sweep_all(struct memory_backend *m)
{
	struct memory_stripe *st;
	unsigned i;

	for (i = 0; i < MEMORY_STRIPES; i++) {
		st = &m->stripes[i].s;
		pthread_mutex_lock(&st->lock);
		/* one whole round, from chain 0 (nothing when no entry can
		 * have expired) */
		st->sweep = 0;
		st->cycle_soonest = INT64_MAX;
		memory_sweep_some(m, st, st->nbuckets, m->clock(m->clock_arg));
		while (memory_maybe_shrink(st))
			;
		pthread_mutex_unlock(&st->lock);
	}
}

/* The next stripe this thread's sweep steps visit. */
static _Thread_local unsigned memory_step_next;

/*
 * One step of the sweep that moves with the traffic (above): the next
 * MEMORY_STEP_CHAINS chains of the thread's next stripe, and one halving of
 * its table if it has become mostly empty.  Skipped when another thread
 * holds that stripe.  Any thread, holding no stripe.
 */
void
memory_sweep_step(struct memory_backend *m)
{
	struct memory_stripe *st;

	st = &m->stripes[memory_step_next++ & (MEMORY_STRIPES - 1)].s;
	if (pthread_mutex_trylock(&st->lock) != 0)
		return;
	memory_sweep_some(m, st, MEMORY_STEP_CHAINS, m->clock(m->clock_arg));
	(void)memory_maybe_shrink(st);
	pthread_mutex_unlock(&st->lock);
}

/*
 * True if a full sweep may run now: at most one per MEMORY_FULL_SWEEP_US,
 * so that a store full of live keys does not walk every key on every
 * request for a new one (a key that expired meanwhile may then wait up to
 * that long to be reclaimed).
 */
bool
memory_may_sweep_all(struct memory_backend *m)
{
	long long last = atomic_load(&m->last_full_sweep);
	int64_t now = m->clock(m->clock_arg);

	if (last != (long long)INT64_MIN && now >= last &&
	    now - last < MEMORY_FULL_SWEEP_US)
		return false;
	return atomic_compare_exchange_strong(&m->last_full_sweep, &last,
	    (long long)now);
}
