/*
 * prefetch.c - the quota one daemon holds in advance (see prefetch.h;
 * docs/algorithms.md, "Taking quota in advance").
 *
 * A fixed number of stripes, each a mutex over a small chained hash table
 * of keys, so that the HTTP threads and the store's thread contend only
 * when they touch keys of one stripe (a hot key's requests do, whatever the
 * layout: its holding is one counter).  Expired holdings are dropped when
 * their chain is walked, and a stripe that is full is swept whole before a
 * new key is refused; prefetch_sweep() sweeps every stripe, when the
 * counts of units lost are read.  Units that leave unused are reported
 * as they leave, under the stripe's lock.
 *
 * The generation is the config's (config.h, serial) whose rules the
 * holdings were taken under.  prefetch_clear() sets the new one before it
 * empties the stripes, and every other function compares it with the
 * caller's under a stripe's lock: a chunk of the old rules that comes back
 * after a stripe was emptied, or a request prepared under them, finds the
 * new generation and holds nothing.  Each entry keeps the generation it
 * was held under too, and one of an older generation is dropped when met,
 * like an expired one: the new config is published before the stripes
 * are emptied, and a request under it must not take the old rules' units
 * from a stripe not emptied yet.
 *
 * A counter reset (prefetch_forget) works the same way for one key, with
 * a stamp per stripe rather than per key: a chunk recorded before the
 * reset may come back after it, and what was read before must not be
 * held after it.  A stripe's other keys lose their chunks in flight too,
 * rarely (resets are few) and on the side of denying.
 */
#include "core/prefetch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/util.h"

#define PF_STRIPES 16
#define PF_BUCKETS 64 /* chains per stripe */

struct pf_entry {
	struct pf_entry *next;
	uint64_t hash;
	int64_t units; /* held, >= 0 */
	int64_t until; /* monotonic: usable before this */
	int64_t at;    /* when the answer below came */
	int64_t sent;  /* when the call of that answer left */
	int64_t remaining, reset_ms, effective_ms;
	uint64_t gen; /* the holdings' generation when it was made */
	char *rule;
	size_t keylen;
	char key[];
};

struct pf_stripe {
	pthread_mutex_t mu;
	struct pf_entry *chains[PF_BUCKETS];
	size_t n, max;
	/* prefetch_forget()s of its keys so far: a chunk or a put-back
	 * whose stamp is older is lost (written under mu) */
	atomic_uint_least64_t forgets;
};

struct prefetch {
	struct pf_stripe stripes[PF_STRIPES];
	atomic_uint_least64_t gen; /* the config's serial; see the top */
	prefetch_lost_fn lost;
	void *arg;
};

static uint64_t
pf_hash(const char *key, size_t len)
{
	uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
	size_t i;

	for (i = 0; i < len; i++) {
		h ^= (unsigned char)key[i];
		h *= UINT64_C(1099511628211);
	}
	return h;
}

static void
pf_report(struct prefetch *pf, const char *rule, int64_t units)
{
	if (units > 0 && pf->lost != NULL)
		pf->lost(rule, units, pf->arg);
}

static struct pf_stripe *
pf_stripe_of(struct prefetch *pf, uint64_t h)
{
	return &pf->stripes[h % PF_STRIPES];
}

static struct pf_entry **
pf_chain(struct pf_stripe *st, uint64_t h)
{
	return &st->chains[(h / PF_STRIPES) % PF_BUCKETS];
}

/* Unlink and free *pp (lock held), reporting its units. */
static void
pf_drop(struct prefetch *pf, struct pf_stripe *st, struct pf_entry **pp)
{
	struct pf_entry *e = *pp;

	*pp = e->next;
	st->n--;
	pf_report(pf, e->rule, e->units);
	rl_free(e->rule);
	rl_free(e);
}

/* Is e past its deadline, or of a generation before the holdings'
 * (prefetch_clear() has not reached its stripe yet)?  Lock held. */
static bool
pf_stale(struct prefetch *pf, const struct pf_entry *e, int64_t now)
{
	return e->until <= now || e->gen != atomic_load(&pf->gen);
}

/* The live entry of key, dropping stale entries met in its chain. */
static struct pf_entry *
pf_find(struct prefetch *pf, struct pf_stripe *st, uint64_t h, const char *key,
    size_t keylen, int64_t now)
{
	struct pf_entry **pp = pf_chain(st, h), *e;

	while ((e = *pp) != NULL) {
		if (pf_stale(pf, e, now)) {
			pf_drop(pf, st, pp);
			continue;
		}
		if (e->hash == h && e->keylen == keylen &&
		    memcmp(e->key, key, keylen) == 0)
			return e;
		pp = &e->next;
	}
	return NULL;
}

struct prefetch *
prefetch_new(size_t max_keys, uint64_t gen, prefetch_lost_fn lost, void *arg)
{
	struct prefetch *pf;
	size_t i;

	if (max_keys < 1 || (pf = rl_calloc(1, sizeof(*pf))) == NULL)
		return NULL;
	atomic_init(&pf->gen, gen);
	pf->lost = lost;
	pf->arg = arg;
	for (i = 0; i < PF_STRIPES; i++) {
		pthread_mutex_init(&pf->stripes[i].mu, NULL);
		atomic_init(&pf->stripes[i].forgets, 0);
		pf->stripes[i].max = (max_keys + PF_STRIPES - 1) / PF_STRIPES;
	}
	return pf;
}

/* Is gen the holdings' generation?  Under a stripe's lock. */
static bool
pf_current(struct prefetch *pf, uint64_t gen)
{
	return atomic_load(&pf->gen) == gen;
}

void
prefetch_clear(struct prefetch *pf, uint64_t gen)
{
	size_t i, j;

	if (pf == NULL)
		return;
	atomic_store(&pf->gen, gen);
	for (i = 0; i < PF_STRIPES; i++) {
		struct pf_stripe *st = &pf->stripes[i];

		pthread_mutex_lock(&st->mu);
		for (j = 0; j < PF_BUCKETS; j++)
			while (st->chains[j] != NULL)
				pf_drop(pf, st, &st->chains[j]);
		pthread_mutex_unlock(&st->mu);
	}
}

void
prefetch_free(struct prefetch *pf)
{
	size_t i;

	if (pf == NULL)
		return;
	prefetch_clear(pf, atomic_load(&pf->gen));
	for (i = 0; i < PF_STRIPES; i++)
		pthread_mutex_destroy(&pf->stripes[i].mu);
	rl_free(pf);
}

void
prefetch_forget(struct prefetch *pf, const char *key, size_t keylen)
{
	uint64_t h;
	struct pf_stripe *st;
	struct pf_entry **pp, *e;

	if (pf == NULL)
		return;
	h = pf_hash(key, keylen);
	st = pf_stripe_of(pf, h);
	pthread_mutex_lock(&st->mu);
	atomic_fetch_add(&st->forgets, 1);
	for (pp = pf_chain(st, h); (e = *pp) != NULL; pp = &e->next)
		if (e->hash == h && e->keylen == keylen &&
		    memcmp(e->key, key, keylen) == 0) {
			pf_drop(pf, st, pp);
			break;
		}
	pthread_mutex_unlock(&st->mu);
}

void
prefetch_forget_all(struct prefetch *pf)
{
	size_t i, j;

	if (pf == NULL)
		return;
	for (i = 0; i < PF_STRIPES; i++) {
		struct pf_stripe *st = &pf->stripes[i];

		pthread_mutex_lock(&st->mu);
		atomic_fetch_add(&st->forgets, 1);
		for (j = 0; j < PF_BUCKETS; j++)
			while (st->chains[j] != NULL)
				pf_drop(pf, st, &st->chains[j]);
		pthread_mutex_unlock(&st->mu);
	}
}

uint64_t
prefetch_stamp(struct prefetch *pf, const char *key, size_t keylen)
{
	return atomic_load(&pf_stripe_of(pf, pf_hash(key, keylen))->forgets);
}

/* Has no forget run in st since stamp was read?  Under st's lock. */
static bool
pf_unforgotten(struct pf_stripe *st, uint64_t stamp)
{
	return atomic_load(&st->forgets) == stamp;
}

bool
prefetch_take(struct prefetch *pf, uint64_t gen, const char *key, size_t keylen,
    int64_t cost, int64_t now, struct prefetch_view *view)
{
	uint64_t h = pf_hash(key, keylen);
	struct pf_stripe *st = pf_stripe_of(pf, h);
	struct pf_entry *e;
	int64_t ago;
	bool ok = false;

	pthread_mutex_lock(&st->mu);
	e = pf_current(pf, gen) ? pf_find(pf, st, h, key, keylen, now) : NULL;
	if (e != NULL && cost >= 1 && e->units >= cost) {
		e->units -= cost;
		ok = true;
		if (view != NULL) {
			ago = (now - e->at) / 1000;
			view->remaining = e->remaining + e->units;
			view->reset_ms = e->reset_ms > ago ? e->reset_ms - ago :
							     0;
			view->effective_ms = e->effective_ms > ago ?
			    e->effective_ms - ago :
			    1;
			view->until = e->until;
		}
	}
	pthread_mutex_unlock(&st->mu);
	return ok;
}

void
prefetch_put_back(struct prefetch *pf, uint64_t gen, const char *rule,
    const char *key, size_t keylen, int64_t cost, int64_t until, int64_t now,
    uint64_t stamp)
{
	uint64_t h = pf_hash(key, keylen);
	struct pf_stripe *st = pf_stripe_of(pf, h);
	struct pf_entry *e;
	bool kept = false;

	pthread_mutex_lock(&st->mu);
	e = pf_current(pf, gen) && pf_unforgotten(st, stamp) ?
	    pf_find(pf, st, h, key, keylen, now) :
	    NULL;
	if (e != NULL && until > now) {
		e->units += cost;
		if (until < e->until)
			e->until = until; /* never used past their own */
		kept = true;
	}
	pthread_mutex_unlock(&st->mu);
	if (!kept)
		pf_report(pf, rule, cost);
}

/* Make room in a full stripe: drop every stale entry (lock held). */
static void
pf_sweep(struct prefetch *pf, struct pf_stripe *st, int64_t now)
{
	struct pf_entry **pp;
	size_t j;

	for (j = 0; j < PF_BUCKETS; j++) {
		pp = &st->chains[j];
		while (*pp != NULL) {
			if (pf_stale(pf, *pp, now))
				pf_drop(pf, st, pp);
			else
				pp = &(*pp)->next;
		}
	}
}

bool
prefetch_wants_chunk(struct prefetch *pf, uint64_t gen, const char *key,
    size_t keylen, int64_t cost, int64_t now)
{
	uint64_t h = pf_hash(key, keylen);
	struct pf_stripe *st = pf_stripe_of(pf, h);
	struct pf_entry *e;
	bool want;

	pthread_mutex_lock(&st->mu);
	if (!pf_current(pf, gen)) {
		want = false;
		goto unlock;
	}
	e = pf_find(pf, st, h, key, keylen, now);
	want = e != NULL ? e->units < cost : st->n < st->max;
	if (e == NULL && !want) {
		pf_sweep(pf, st, now);
		want = st->n < st->max;
	}
unlock:
	pthread_mutex_unlock(&st->mu);
	return want;
}

/*
 * A store answer, of a call that left at sent, received at now: the one
 * the holding's answers start from, unless it has one of a call that
 * left later (two answers of one key may settle out of order, and the
 * later call's counts the earlier's units).  Returns the remaining to
 * answer: the newer answer's plus the units held.  Lock held.
 */
static int64_t
pf_note(struct pf_entry *e, int64_t sent, int64_t now, int64_t remaining,
    int64_t reset_ms, int64_t effective_ms)
{
	if (e->at == 0 || sent >= e->sent) {
		e->sent = sent;
		e->at = now;
		e->remaining = remaining;
		e->reset_ms = reset_ms;
		e->effective_ms = effective_ms;
	}
	return e->remaining + e->units;
}

int64_t
prefetch_add(struct prefetch *pf, uint64_t gen, const char *rule,
    const char *key, size_t keylen, int64_t units, int64_t until, int64_t sent,
    int64_t now, int64_t remaining, int64_t reset_ms, int64_t effective_ms,
    uint64_t stamp)
{
	uint64_t h = pf_hash(key, keylen);
	struct pf_stripe *st = pf_stripe_of(pf, h);
	struct pf_entry *e, **chain;
	int64_t answer = -1;

	if (units <= 0)
		return -1;
	pthread_mutex_lock(&st->mu);
	if (until <= now || !pf_current(pf, gen) || !pf_unforgotten(st, stamp))
		goto unlock;
	e = pf_find(pf, st, h, key, keylen, now);
	if (e == NULL) {
		if (st->n >= st->max)
			pf_sweep(pf, st, now);
		if (st->n >= st->max)
			goto unlock;
		if ((e = rl_calloc(1, sizeof(*e) + keylen)) == NULL)
			goto unlock;
		if ((e->rule = rl_strdup(rule)) == NULL) {
			rl_free(e);
			goto unlock;
		}
		e->hash = h;
		e->gen = gen;
		e->keylen = keylen;
		memcpy(e->key, key, keylen);
		e->until = until;
		chain = pf_chain(st, h);
		e->next = *chain;
		*chain = e;
		st->n++;
	}
	e->units += units;
	if (until < e->until)
		e->until = until;
	answer = pf_note(e, sent, now, remaining, reset_ms, effective_ms);
unlock:
	pthread_mutex_unlock(&st->mu);
	if (answer < 0)
		pf_report(pf, rule, units);
	return answer;
}

int64_t
prefetch_refresh(struct prefetch *pf, uint64_t gen, const char *key,
    size_t keylen, int64_t sent, int64_t now, int64_t remaining,
    int64_t reset_ms, int64_t effective_ms, uint64_t stamp)
{
	uint64_t h = pf_hash(key, keylen);
	struct pf_stripe *st = pf_stripe_of(pf, h);
	struct pf_entry *e;
	int64_t answer = -1;

	pthread_mutex_lock(&st->mu);
	if (!pf_current(pf, gen) || !pf_unforgotten(st, stamp))
		goto unlock;
	e = pf_find(pf, st, h, key, keylen, now);
	if (e == NULL)
		goto unlock;
	answer = pf_note(e, sent, now, remaining, reset_ms, effective_ms);
unlock:
	pthread_mutex_unlock(&st->mu);
	return answer;
}

void
prefetch_sweep(struct prefetch *pf, int64_t now)
{
	size_t i;

	if (pf == NULL)
		return;
	for (i = 0; i < PF_STRIPES; i++) {
		pthread_mutex_lock(&pf->stripes[i].mu);
		pf_sweep(pf, &pf->stripes[i], now);
		pthread_mutex_unlock(&pf->stripes[i].mu);
	}
}

int64_t
prefetch_held(struct prefetch *pf, const char *key, size_t keylen, int64_t now)
{
	uint64_t h = pf_hash(key, keylen);
	struct pf_stripe *st = pf_stripe_of(pf, h);
	struct pf_entry *e;
	int64_t n;

	pthread_mutex_lock(&st->mu);
	e = pf_find(pf, st, h, key, keylen, now);
	n = e != NULL ? e->units : 0;
	pthread_mutex_unlock(&st->mu);
	return n;
}
