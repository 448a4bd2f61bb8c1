/*
 * deny_cache.c - recently denied keys (see deny_cache.h).
 *
 * DESIGN
 *
 * slots entries, each the key's 64-bit FNV-1a hash, a copy of the key, the
 * generation and cost it was denied for and its times.  A key lives only in the
 * slot its hash names; a put replaces the slot whatever it held (a cache, not a
 * store: losing an entry costs one store call).  DENY_STRIPES mutexes guard
 * the slots, slot i under mutex i % DENY_STRIPES.  Keys are compared in
 * full, so a hash collision is a miss, never a wrong answer.
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
	int64_t cost;
	struct deny_times t;
};

struct deny_cache {
	struct deny_entry *slots;
	size_t mask;
	pthread_mutex_t locks[DENY_STRIPES];
	atomic_ullong hits;
	atomic_ullong clears; /* deny_cache_clear() calls begun */
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
	for (i = 0; i < DENY_STRIPES; i++)
		pthread_mutex_init(&dc->locks[i], NULL);
	atomic_init(&dc->hits, 0);
	return dc;
}

void
deny_cache_clear(struct deny_cache *dc)
{
	size_t i;

	/* First: a put of a denial asked before this clear, which may come
	 * to a slot already cleared, sees it and is dropped. */
	atomic_fetch_add(&dc->clears, 1);
	for (i = 0; i <= dc->mask; i++) {
		pthread_mutex_lock(&dc->locks[i % DENY_STRIPES]);
		rl_free(dc->slots[i].key);
		memset(&dc->slots[i], 0, sizeof(dc->slots[i]));
		pthread_mutex_unlock(&dc->locks[i % DENY_STRIPES]);
	}
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
deny_cache_clears(const struct deny_cache *dc)
{
	return atomic_load(&((struct deny_cache *)dc)->clears);
}

void
deny_cache_put(struct deny_cache *dc, uint64_t gen, uint64_t clears,
    const char *key, size_t keylen, int64_t cost, const struct deny_times *t)
{
	uint64_t h = deny_hash(key, keylen);
	size_t i = (size_t)h & dc->mask;
	struct deny_entry *e = &dc->slots[i];
	char *copy = NULL;

	pthread_mutex_lock(&dc->locks[i % DENY_STRIPES]);
	if (atomic_load(&dc->clears) != clears)
		goto out; /* asked before a clear: its state may be gone */
	if (e->key == NULL || e->hash != h || e->keylen != keylen ||
	    memcmp(e->key, key, keylen) != 0) {
		if ((copy = rl_malloc(keylen + 1)) == NULL)
			goto out; /* a cache: go without */
		memcpy(copy, key, keylen);
		copy[keylen] = '\0';
		rl_free(e->key);
		e->key = copy;
		e->keylen = keylen;
		e->hash = h;
	} else if (e->gen == gen && e->cost < cost &&
	    e->t.until_us >= t->until_us) {
		/* A cheaper request is denied for longer already: keep. */
		goto out;
	}
	e->gen = gen;
	e->cost = cost;
	e->t = *t;
out:
	pthread_mutex_unlock(&dc->locks[i % DENY_STRIPES]);
}

bool
deny_cache_get(struct deny_cache *dc, uint64_t gen, const char *key,
    size_t keylen, int64_t cost, int64_t now_us, struct deny_times *t)
{
	uint64_t h = deny_hash(key, keylen);
	size_t i = (size_t)h & dc->mask;
	struct deny_entry *e = &dc->slots[i];
	bool hit;

	pthread_mutex_lock(&dc->locks[i % DENY_STRIPES]);
	hit = e->key != NULL && e->hash == h && e->keylen == keylen &&
	    now_us < e->t.until_us && cost == e->cost && gen == e->gen &&
	    memcmp(e->key, key, keylen) == 0;
	if (hit)
		*t = e->t;
	pthread_mutex_unlock(&dc->locks[i % DENY_STRIPES]);
	if (hit)
		atomic_fetch_add_explicit(&dc->hits, 1, memory_order_relaxed);
	return hit;
}

uint64_t
deny_cache_hits(const struct deny_cache *dc)
{
	return atomic_load_explicit(&((struct deny_cache *)dc)->hits,
	    memory_order_relaxed);
}
