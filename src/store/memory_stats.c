/*
 * memory_stats.c - the stat keys of the in-process store (see
 * memory_stats.h): a chained hash table of stats_window entries under one
 * mutex.
 *
 * An entry expires when its last recorded sub-window is dead
 * (stats_window_expiry_ms, the Redis store's TTL), under the window of
 * its last record or read.  Expired entries are
 * freed on lookup, by a sweep of two chains on every call (a record or a
 * read, of a new key or one already held: after a burst of keys the memory
 * comes back while later calls use old keys), and by a full sweep when the
 * table is at max_keys (at most once a second: until the next, a new key
 * is refused without one).  The hash is seeded per process, so
 * clients cannot aim their keys at one chain from outside.
 */
#include "store/memory_stats.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "core/sketch.h"
#include "core/stats_window.h"
#include "base/util.h"

#define STATS_INITIAL_BUCKETS 64
#define STATS_SWEEP_CHAINS    2
/* At most one full sweep a second when the table is full, as for the rule
 * keys (backend_memory.c): a sweep walks every key under the one mutex. */
#define STATS_FULL_SWEEP_MS 1000

struct stats_entry {
	struct stats_entry *next;
	uint64_t hash;
	int64_t expires_ms;
	struct stats_window w;
	size_t keylen;
	char key[];
};

struct memory_stats {
	pthread_mutex_t mu;
	struct stats_entry **buckets;
	size_t nbuckets; /* a power of two */
	size_t count;
	size_t sweep;
	int64_t max_keys;
	uint64_t seed;
	struct sketch scratch;	 /* merge target, reused */
	int64_t last_full_sweep; /* ms of the last one; INT64_MIN: none */
	uint64_t full_sweeps;	 /* made because the table was full */
};

static uint64_t
stats_hash(const struct memory_stats *ms, const char *key, size_t len)
{
	uint64_t h = util_fnv1a(key, len) ^ ms->seed;

	/* A final mix, so that the seed reaches every bit. */
	h ^= h >> 33;
	h *= UINT64_C(0xff51afd7ed558ccd);
	h ^= h >> 33;
	return h;
}

struct memory_stats *
memory_stats_new(int64_t max_keys)
{
	struct memory_stats *ms = rl_calloc(1, sizeof(*ms));

	if (ms == NULL)
		return NULL;
	ms->buckets = rl_calloc(STATS_INITIAL_BUCKETS, sizeof(*ms->buckets));
	if (ms->buckets == NULL) {
		rl_free(ms);
		return NULL;
	}
	ms->nbuckets = STATS_INITIAL_BUCKETS;
	ms->max_keys = max_keys;
	ms->last_full_sweep = INT64_MIN;
	if (getrandom(&ms->seed, sizeof(ms->seed), GRND_NONBLOCK) !=
	    (ssize_t)sizeof(ms->seed))
		ms->seed = (uint64_t)util_monotonic_us() *
		    UINT64_C(0x9e3779b97f4a7c15);
	sketch_init(&ms->scratch);
	pthread_mutex_init(&ms->mu, NULL);
	return ms;
}

static void
entry_free(struct stats_entry *e)
{
	stats_window_clear(&e->w);
	rl_free(e);
}

void
memory_stats_free(struct memory_stats *ms)
{
	struct stats_entry *e, *next;
	size_t k;

	if (ms == NULL)
		return;
	for (k = 0; k < ms->nbuckets; k++)
		for (e = ms->buckets[k]; e != NULL; e = next) {
			next = e->next;
			entry_free(e);
		}
	rl_free(ms->buckets);
	sketch_clear(&ms->scratch);
	pthread_mutex_destroy(&ms->mu);
	rl_free(ms);
}

/* Free the expired entries of chain k. */
static void
sweep_chain(struct memory_stats *ms, size_t k, int64_t now_ms)
{
	struct stats_entry **pp = &ms->buckets[k], *e;

	while ((e = *pp) != NULL) {
		if (e->expires_ms <= now_ms) {
			*pp = e->next;
			entry_free(e);
			ms->count--;
		} else
			pp = &e->next;
	}
}

static void
sweep_all(struct memory_stats *ms, int64_t now_ms)
{
	size_t k;

	for (k = 0; k < ms->nbuckets; k++)
		sweep_chain(ms, k, now_ms);
}

/* Double the table when it is fuller than one entry per chain. */
static void
grow(struct memory_stats *ms)
{
	size_t n = ms->nbuckets * 2, k;
	struct stats_entry **nb, *e, *next;

	if (ms->count < ms->nbuckets ||
	    (nb = rl_calloc(n, sizeof(*nb))) == NULL)
		return; /* longer chains, still correct */
	for (k = 0; k < ms->nbuckets; k++)
		for (e = ms->buckets[k]; e != NULL; e = next) {
			next = e->next;
			e->next = nb[e->hash & (n - 1)];
			nb[e->hash & (n - 1)] = e;
		}
	rl_free(ms->buckets);
	ms->buckets = nb;
	ms->nbuckets = n;
	ms->sweep = 0;
}

/* The entry of key, or NULL.  An expired one is emptied in place. */
static struct stats_entry *
lookup(struct memory_stats *ms, const char *key, size_t len, uint64_t h,
    int64_t now_ms)
{
	struct stats_entry *e;

	for (e = ms->buckets[h & (ms->nbuckets - 1)]; e != NULL; e = e->next)
		if (e->hash == h && e->keylen == len &&
		    memcmp(e->key, key, len) == 0) {
			if (e->expires_ms <= now_ms)
				stats_window_clear(&e->w);
			return e;
		}
	return NULL;
}

static void
fill(struct rl_stat_result *out, const struct sketch *s,
    const struct rl_stat_op *op, const struct sketch_params *p)
{
	size_t i;

	memset(out, 0, sizeof(*out));
	if (s->count == 0)
		return;
	out->count = s->count;
	out->sum = s->sum;
	out->min = s->min;
	out->max = s->max;
	for (i = 0; i < op->nquantiles && i < RL_STATS_MAX_QUANTILES; i++)
		out->q[i] = sketch_quantile(s, p, op->quantiles[i]);
}

int
memory_stats_run(struct memory_stats *ms, const struct rl_stat_op *op,
    int64_t now_us, struct rl_stat_result *out, enum backend_error_kind *kind,
    char *err, size_t errlen)
{
	struct stats_window_params p;
	struct stats_entry *e;
	int64_t now_ms = now_us / 1000;
	uint64_t h;
	size_t k;
	int rc = -1;

	if (stats_window_params_set(&p, op->window_ms, op->resolution_ms,
		op->accuracy, err, errlen) != 0) {
		*kind = BACKEND_ERR_PROTOCOL;
		return -1;
	}
	h = stats_hash(ms, op->key, op->keylen);
	pthread_mutex_lock(&ms->mu);
	/* Before the lookup, which then finds nothing the sweep freed. */
	for (k = 0; k < STATS_SWEEP_CHAINS; k++) {
		sweep_chain(ms, ms->sweep, now_ms);
		ms->sweep = (ms->sweep + 1) & (ms->nbuckets - 1);
	}
	e = lookup(ms, op->key, op->keylen, h, now_ms);
	if (e == NULL && op->record) {
		if (ms->max_keys > 0 && ms->count >= (size_t)ms->max_keys &&
		    (ms->last_full_sweep == INT64_MIN ||
			now_ms < ms->last_full_sweep ||
			now_ms - ms->last_full_sweep >= STATS_FULL_SWEEP_MS)) {
			sweep_all(ms, now_ms);
			ms->last_full_sweep = now_ms;
			ms->full_sweeps++;
		}
		if (ms->max_keys > 0 && ms->count >= (size_t)ms->max_keys) {
			*kind = BACKEND_ERR_FULL;
			snprintf(err, errlen,
			    "memory store full: %lld stat "
			    "keys",
			    (long long)ms->max_keys);
			goto out;
		}
		if ((e = rl_calloc(1, sizeof(*e) + op->keylen)) == NULL)
			goto oom;
		e->hash = h;
		e->keylen = op->keylen;
		memcpy(e->key, op->key, op->keylen);
		stats_window_init(&e->w);
		e->next = ms->buckets[h & (ms->nbuckets - 1)];
		ms->buckets[h & (ms->nbuckets - 1)] = e;
		ms->count++;
		grow(ms);
	}
	if (op->record) {
		if (stats_window_record(&e->w, &p, now_ms, op->value) != 0)
			goto oom;
	} else if (e != NULL && stats_window_adapt(&e->w, &p, now_ms) != 0)
		goto oom;
	/* The expiry of the stat's window now: a reload may have changed
	 * it (docs/stats.md "Reloads and limits"). */
	if (e != NULL)
		e->expires_ms = stats_window_expiry_ms(&e->w, &p);
	sketch_clear(&ms->scratch);
	if (e != NULL &&
	    stats_window_read(&e->w, &p, now_ms, &ms->scratch) != 0)
		goto oom;
	fill(out, &ms->scratch, op, &p.sketch);
	rc = 0;
	goto out;
oom:
	*kind = BACKEND_ERR_PROTOCOL;
	snprintf(err, errlen, "out of memory");
out:
	pthread_mutex_unlock(&ms->mu);
	return rc;
}

uint64_t
memory_stats_full_sweeps(struct memory_stats *ms)
{
	uint64_t n;

	pthread_mutex_lock(&ms->mu);
	n = ms->full_sweeps;
	pthread_mutex_unlock(&ms->mu);
	return n;
}

size_t
memory_stats_key_count(struct memory_stats *ms, int64_t now_us)
{
	size_t n;

	pthread_mutex_lock(&ms->mu);
	sweep_all(ms, now_us / 1000);
	n = ms->count;
	pthread_mutex_unlock(&ms->mu);
	return n;
}

size_t
memory_stats_held(struct memory_stats *ms)
{
	size_t n;

	pthread_mutex_lock(&ms->mu);
	n = ms->count;
	pthread_mutex_unlock(&ms->mu);
	return n;
}
