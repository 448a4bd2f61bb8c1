/*
 * deny_cache.c - recently denied keys (see deny_cache.h).
 *
 * DESIGN
 *
 * slots entries, each the key's 64-bit FNV-1a hash, a copy of the key, the
 * limit, window, generation and cost it was denied for and its times.  A
 * key lives only in the slot its hash names; a put replaces the slot
 * whatever it held (a cache, not a store: losing an entry costs one store
 * call).  DENY_STRIPES mutexes guard the slots, slot i under mutex
 * i % DENY_STRIPES.  Keys are compared in full, so a hash collision is a
 * miss, never a wrong answer.
 *
 * The stamps are per slot, not per key (a slot outlives its entries) nor
 * global: a forget drops only the denials in flight of its slot's keys,
 * and a Cluster take-back per denied cross-slot request would otherwise
 * keep the cache from learning any denial at all under load.  A stamp is
 * moved on under its slot's mutex and compared there by a put, and read
 * without it when the store is asked.
 */
#include "core/deny_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/util.h"

#define DENY_STRIPES 16

struct deny_entry {
	uint64_t hash;
	char *key; /* NULL: empty */
	size_t keylen;
	uint64_t gen; /* the config serial it was learnt under */
	int64_t limit, window_ms;
	int64_t cost;
	struct deny_times t;
	atomic_uint_least64_t stamp; /* the slot's clears and forgets */
};

struct deny_cache {
	struct deny_entry *slots;
	size_t mask;
	pthread_mutex_t locks[DENY_STRIPES];
	atomic_ullong hits;
};

static uint64_t
deny_hash(const char *key, size_t len)
{
	return util_fnv1a(key, len);
}

struct deny_cache *
deny_cache_new(size_t slots)
{
	struct deny_cache *dc;
	size_t n = 1, i;

	while (n < slots && n < ((size_t)1 << 30))
		n <<= 1;
	if ((dc = rl_calloc(1, sizeof(*dc))) == NULL)
		return NULL;
	if ((dc->slots = rl_calloc(n, sizeof(*dc->slots))) == NULL) {
		rl_free(dc);
		return NULL;
	}
	dc->mask = n - 1;
	for (i = 0; i < n; i++)
		atomic_init(&dc->slots[i].stamp, 0);
	for (i = 0; i < DENY_STRIPES; i++)
		pthread_mutex_init(&dc->locks[i], NULL);
	atomic_init(&dc->hits, 0);
	return dc;
}

/* Empty slot e (its lock held), moving its stamp on: a put of a denial
 * asked before, which comes later, sees it and is dropped. */
static void
deny_slot_drop(struct deny_entry *e)
{
	rl_free(e->key);
	e->key = NULL;
	e->keylen = 0;
	atomic_fetch_add(&e->stamp, 1);
}

void
deny_cache_clear(struct deny_cache *dc)
{
	size_t i;

	if (dc == NULL)
		return;
	for (i = 0; i <= dc->mask; i++) {
		pthread_mutex_lock(&dc->locks[i % DENY_STRIPES]);
		deny_slot_drop(&dc->slots[i]);
		pthread_mutex_unlock(&dc->locks[i % DENY_STRIPES]);
	}
}

/* Does e hold key (its lock held)? */
static bool
deny_slot_is(const struct deny_entry *e, uint64_t h, const char *key,
    size_t keylen)
{
	return e->key != NULL && e->hash == h && e->keylen == keylen &&
	    memcmp(e->key, key, keylen) == 0;
}

void
deny_cache_forget(struct deny_cache *dc, const char *key, size_t keylen)
{
	uint64_t h;
	size_t i;
	struct deny_entry *e;

	if (dc == NULL)
		return;
	h = deny_hash(key, keylen);
	i = (size_t)h & dc->mask;
	e = &dc->slots[i];
	pthread_mutex_lock(&dc->locks[i % DENY_STRIPES]);
	if (deny_slot_is(e, h, key, keylen))
		deny_slot_drop(e);
	else
		atomic_fetch_add(&e->stamp, 1); /* its denials in flight */
	pthread_mutex_unlock(&dc->locks[i % DENY_STRIPES]);
}

void
deny_cache_free(struct deny_cache *dc)
{
	size_t i;

	if (dc == NULL)
		return;
	deny_cache_clear(dc);
	for (i = 0; i < DENY_STRIPES; i++)
		pthread_mutex_destroy(&dc->locks[i]);
	rl_free(dc->slots);
	rl_free(dc);
}

uint64_t
deny_cache_stamp(const struct deny_cache *dc, const char *key, size_t keylen)
{
	size_t i = (size_t)deny_hash(key, keylen) & dc->mask;

	return atomic_load(&dc->slots[i].stamp);
}

void
deny_cache_put(struct deny_cache *dc, uint64_t gen, uint64_t stamp,
    const char *key, size_t keylen, int64_t limit, int64_t window_ms,
    int64_t cost, const struct deny_times *t)
{
	uint64_t h = deny_hash(key, keylen);
	size_t i = (size_t)h & dc->mask;
	struct deny_entry *e = &dc->slots[i];
	char *copy = NULL;

	pthread_mutex_lock(&dc->locks[i % DENY_STRIPES]);
	if (atomic_load(&e->stamp) != stamp)
		goto out; /* asked before a clear or a forget: its units
			   * may be back */
	if (!deny_slot_is(e, h, key, keylen)) {
		if ((copy = rl_malloc(keylen + 1)) == NULL)
			goto out; /* a cache: go without */
		memcpy(copy, key, keylen);
		copy[keylen] = '\0';
		rl_free(e->key);
		e->key = copy;
		e->keylen = keylen;
		e->hash = h;
	} else if (e->gen == gen && e->limit == limit &&
	    e->window_ms == window_ms && e->cost < cost &&
	    e->t.until_us >= t->until_us) {
		/* A cheaper request is denied for longer already: keep. */
		goto out;
	}
	e->gen = gen;
	e->limit = limit;
	e->window_ms = window_ms;
	e->cost = cost;
	e->t = *t;
out:
	pthread_mutex_unlock(&dc->locks[i % DENY_STRIPES]);
}

bool
deny_cache_get(struct deny_cache *dc, uint64_t gen, const char *key,
    size_t keylen, int64_t limit, int64_t window_ms, int64_t cost,
    int64_t now_us, struct deny_times *t)
{
	uint64_t h = deny_hash(key, keylen);
	size_t i = (size_t)h & dc->mask;
	struct deny_entry *e = &dc->slots[i];
	bool hit;

	pthread_mutex_lock(&dc->locks[i % DENY_STRIPES]);
	hit = deny_slot_is(e, h, key, keylen) && now_us < e->t.until_us &&
	    cost == e->cost && gen == e->gen && limit == e->limit &&
	    window_ms == e->window_ms;
	if (hit)
		*t = e->t;
	pthread_mutex_unlock(&dc->locks[i % DENY_STRIPES]);
	return hit;
}

void
deny_cache_count_hit(struct deny_cache *dc)
{
	atomic_fetch_add_explicit(&dc->hits, 1, memory_order_relaxed);
}

uint64_t
deny_cache_hits(const struct deny_cache *dc)
{
	return atomic_load_explicit(&((struct deny_cache *)dc)->hits,
	    memory_order_relaxed);
}
