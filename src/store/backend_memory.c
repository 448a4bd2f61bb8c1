/*
 * backend_memory.c - the in-process store behind backend.h: `backend:
 * memory` for a single instance, and the local fallback of
 * on_backend_error: local.  Every key's state lives in a hash table in this
 * process and is run through limiter.c, so the answers are those of
 * docs/algorithms.md, the same as the Redis store's.
 *
 * DESIGN
 *
 * Keys are spread over MEMORY_STRIPES stripes, each a mutex and a chained
 * hash table of its own, by the top bits of a keyed SipHash-2-4 of the key
 * bytes (keys come from clients, so the hash is seeded at random to keep
 * chains short whatever keys they send).  One decide() call locks the
 * distinct stripes of its keys in ascending order, so calls never deadlock,
 * and holds them for the whole call: phase 1 on every check, phase 2 only
 * if every non-shadow check allows, the results, unlock.  That makes the
 * call atomic against every other call that shares one of its keys.  The
 * clock is read once, after locking, so the times recorded under one stripe
 * never go back (with a clock that does not).
 *
 * All memory a call may need (new entries, a grown sliding_log ring) is
 * allocated before anything is recorded; on failure the call records
 * nothing and answers -1.
 *
 * The table itself (hashing, chains, expiry and sweeping) is
 * memory_table.c; memory_priv.h holds what the two share.
 */
#include "core/backend.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/log.h"
#include "base/util.h"
#include "core/limiter.h"
#include "store/memory.h"
#include "store/memory_priv.h"
#include "store/memory_stats.h"

/*
 * Waiting (docs/algorithms.md, "Waiting for a turn"): after phase 1 denied,
 * the earliest t at which every non-shadow check fits, iterating to the
 * max of the rules' earliest times until they agree.  Records at t and
 * returns t - now, or returns 0 (nothing recorded) when there is no such t
 * within wait_us; -1 with err when out of memory.
 */
#define MEMORY_WAIT_ROUNDS 64

static int64_t
memory_reserve(const struct rl_check *checks, struct memory_slot *slots,
    size_t n, int64_t now, int64_t wait_us, char *err, size_t errlen)
{
	int64_t t = now, e, next;
	size_t i, round;

	for (round = 0; round < MEMORY_WAIT_ROUNDS; round++) {
		next = t;
		for (i = 0; i < n; i++) {
			if (checks[i].shadow)
				continue;
			e = limiter_earliest(&slots[i].entry->state,
			    &slots[i].params, now, t, checks[i].cost);
			if (e > next)
				next = e;
		}
		if (next == INT64_MAX || next - now > wait_us)
			return 0;
		if (next == t)
			break;
		t = next;
	}
	if (round == MEMORY_WAIT_ROUNDS || t == now)
		return 0;
	for (i = 0; i < n; i++)
		if (checks[i].cost > 0 &&
		    limiter_reserve_room(&slots[i].entry->state,
			&slots[i].params, err, errlen) == -1)
			return -1;
	for (i = 0; i < n; i++) {
		slots[i].admits_now = slots[i].allowed;
		slots[i].allowed = !checks[i].shadow ||
		    limiter_earliest(&slots[i].entry->state, &slots[i].params,
			now, t, checks[i].cost) == t;
		if (slots[i].allowed && checks[i].cost > 0) {
			limiter_record_at(&slots[i].entry->state,
			    &slots[i].params, now, t, checks[i].cost);
			slots[i].recorded = true;
		}
	}
	return t - now;
}

/*
 * A report (docs/algorithms.md, "Usage reported after the fact"): phase 1
 * ran with cost 0 (expire, read); make room everywhere first, then record
 * every check's cost whatever it allows.  0, or -1 with err (out of
 * memory: nothing recorded).
 */
static int
memory_report(const struct rl_check *checks, struct memory_slot *slots,
    size_t n, int64_t now, char *err, size_t errlen)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (checks[i].cost > 0 &&
		    limiter_reserve_room(&slots[i].entry->state,
			&slots[i].params, err, errlen) == -1)
			return -1;
	for (i = 0; i < n; i++) {
		slots[i].allowed = true;
		if (checks[i].cost > 0) {
			limiter_record(&slots[i].entry->state, &slots[i].params,
			    now, checks[i].cost);
			slots[i].recorded = true;
		}
	}
	return 0;
}

/*
 * One call with its stripes locked: find or create the entries, phase 1,
 * phase 2 if every non-shadow check allows, results.  Whatever happens, the
 * entries' expiries are brought up to date and empty ones are freed.
 */
static enum memory_attempt
memory_attempt(struct memory_backend *m, const struct rl_check *checks,
    struct memory_slot *slots, size_t n, struct rl_result *out,
    bool *all_allowed, int64_t wait_us, int64_t *waited_us, bool report,
    int64_t *overdrawn, char *err, size_t errlen)
{
	enum memory_attempt rc = MEMORY_OK;
	struct memory_stripe *st;
	struct memory_entry *e;
	uint64_t mask = 0;
	int64_t now;
	size_t i, j;
	bool all = true;

	for (i = 0; i < n; i++) {
		slots[i].entry = NULL;
		slots[i].recorded = false;
		out[i].taken = out[i].taken_us = 0;
		mask |= UINT64_C(1) << memory_stripe_of(slots[i].hash);
	}
	memory_lock_mask(m, mask);
	now = m->clock(m->clock_arg);

	for (i = 0; i < n && rc == MEMORY_OK; i++) {
		st = &m->stripes[memory_stripe_of(slots[i].hash)].s;
		e = memory_lookup(st, slots[i].hash, checks[i].key,
		    checks[i].keylen);
		if (e == NULL) {
			rc = memory_insert(m, st, &checks[i], &slots[i], now,
			    &e, err, errlen);
			if (rc != MEMORY_OK)
				break;
			slots[i].prev_expires = INT64_MIN;
		} else if (e->expires <= now) {
			limiter_state_clear(&e->state); /* as if absent */
			slots[i].prev_expires = INT64_MIN;
		} else {
			slots[i].prev_expires = e->expires;
		}
		e->expires = MEMORY_PINNED;
		slots[i].entry = e;
	}
	for (i = 0; i < n && rc == MEMORY_OK; i++) {
		if (limiter_check(&slots[i].entry->state, &slots[i].params, now,
			report ? 0 : checks[i].cost, &slots[i].allowed, err,
			errlen) == -1)
			rc = MEMORY_ERROR;
		else if (report)
			continue;
		else if (!slots[i].allowed && !checks[i].shadow)
			all = false;
	}
	*waited_us = 0;
	if (rc == MEMORY_OK && report) {
		if (memory_report(checks, slots, n, now, err, errlen) == -1) {
			rc = MEMORY_ERROR;
			goto unpin;
		}
		*all_allowed = true;
		for (i = 0; i < n; i++) {
			limiter_result(&slots[i].entry->state, &slots[i].params,
			    now, checks[i].cost, true, slots[i].recorded,
			    &out[i]);
			if (overdrawn != NULL)
				overdrawn[i] = limiter_overdrawn(
				    &slots[i].entry->state, &slots[i].params,
				    now, checks[i].cost, slots[i].recorded);
		}
		goto unpin;
	}
	if (rc == MEMORY_OK && !all && wait_us > 0) {
		int64_t w = memory_reserve(checks, slots, n, now, wait_us, err,
		    errlen);

		if (w < 0) {
			rc = MEMORY_ERROR;
		} else if (w > 0) {
			*waited_us = w;
			*all_allowed = true;
			/* allowed: every non-shadow rule; a shadow rule only
			 * if it admits at the reserved time
			 * (docs/algorithms.md, "Waiting for a turn"), as
			 * memory_reserve() found; one that admits now but
			 * not then gets phase 1's retry (0), at least 1 */
			for (i = 0; i < n; i++) {
				limiter_result(&slots[i].entry->state,
				    &slots[i].params, now, checks[i].cost,
				    slots[i].allowed || slots[i].admits_now,
				    slots[i].recorded, &out[i]);
				if (!slots[i].allowed && slots[i].admits_now) {
					out[i].allowed = false;
					out[i].retry_after_ms = 1;
				}
			}
			goto unpin;
		}
	}
	if (rc == MEMORY_OK) {
		for (i = 0; i < n; i++) {
			out[i].taken = out[i].taken_us = 0;
			if (!all || !slots[i].allowed || checks[i].cost <= 0)
				continue;
			if (checks[i].prefetch_want >= checks[i].cost)
				out[i].taken = limiter_chunk(
				    &slots[i].entry->state, &slots[i].params,
				    now, checks[i].cost,
				    checks[i].prefetch_want,
				    checks[i].prefetch_hold_us,
				    &out[i].taken_us);
			else
				limiter_record(&slots[i].entry->state,
				    &slots[i].params, now, checks[i].cost);
			slots[i].recorded = true;
		}
		for (i = 0; i < n; i++)
			limiter_result(&slots[i].entry->state, &slots[i].params,
			    now,
			    out[i].taken > 0 ? out[i].taken : checks[i].cost,
			    slots[i].allowed, slots[i].recorded, &out[i]);
		*all_allowed = all;
	}

unpin:
	/*
	 * Unpin.  As in Redis, a key gets a new expiry only when recorded in,
	 * keeps its own when only read, and goes when its state is empty.  A
	 * key may appear in several checks.
	 */
	for (i = 0; i < n; i++)
		if ((e = slots[i].entry) != NULL &&
		    slots[i].prev_expires != MEMORY_PINNED)
			e->expires = slots[i].prev_expires;
	for (i = 0; i < n; i++)
		if ((e = slots[i].entry) != NULL && slots[i].recorded)
			e->expires = limiter_expiry(&e->state,
			    &slots[i].params);
	for (i = 0; i < n; i++) {
		if ((e = slots[i].entry) == NULL ||
		    (e->expires > now &&
			limiter_expiry(&e->state, &slots[i].params) !=
			    INT64_MIN))
			continue;
		for (j = 0; j < n; j++) /* earlier slots too: e is freed */
			if (slots[j].entry == e)
				slots[j].entry = NULL;
		memory_remove(m, &m->stripes[memory_stripe_of(e->hash)].s, e);
	}
	for (i = 0; i < n; i++)
		if ((e = slots[i].entry) != NULL)
			memory_note_expiry(
			    &m->stripes[memory_stripe_of(e->hash)].s,
			    e->expires);
	memory_unlock_mask(m, mask);
	return rc;
}

/* Say that the store is full: at most one line every 10 s, with the number
 * of calls it refused since the last one.  Any thread, lock-free. */
static void
memory_log_full(struct memory_backend *m)
{
	long long now = (long long)util_monotonic_us(), n;
	long long last = atomic_load(&m->last_full_log);

	atomic_fetch_add(&m->full_unlogged, 1);
	if ((last != (long long)INT64_MIN && now - last < 10000000LL) ||
	    !atomic_compare_exchange_strong(&m->last_full_log, &last, now))
		return;
	n = atomic_exchange(&m->full_unlogged, 0);
	log_warnx(
	    "memory store full: %lld keys (memory.max_keys); %lld "
	    "calls answered by on_backend_error since the last such line",
	    (long long)m->max_keys, n);
}

static int
memory_decide(struct backend *b, const struct rl_check *checks, size_t n,
    struct rl_result *out, bool *all_allowed, int64_t wait_us,
    int64_t *waited_us, bool report, int64_t *overdrawn,
    enum backend_error_kind *kind, char *err, size_t errlen)
{
	struct memory_backend *m = (struct memory_backend *)b;
	struct memory_slot small[MEMORY_SMALL_CALL], *slots = small;
	enum memory_attempt rc;
	char why[128];
	size_t i;
	int ret = -1;

	*all_allowed = false;
	if (n > MEMORY_SMALL_CALL &&
	    (slots = rl_calloc(n, sizeof(*slots))) == NULL) {
		*kind = BACKEND_ERR_FULL;
		snprintf(err, errlen,
		    "memory store: out of memory "
		    "(call of %zu checks)",
		    n);
		return -1;
	}
	for (i = 0; i < n; i++) {
		const struct rl_check *c = &checks[i];

		if (limiter_params_set(&slots[i].params, c->algorithm, c->limit,
			c->window_ms, why, sizeof(why)) == -1 ||
		    (c->algorithm == RL_ALG_CONCURRENCY && report) ||
		    c->cost < 0 || (c->cost > c->limit && !report) ||
		    (report && c->cost > LIMITER_MAX_LIMIT) || c->key == NULL) {
			*kind = BACKEND_ERR_PROTOCOL;
			snprintf(err, errlen,
			    "memory store: invalid check "
			    "%zu (limit %lld, window %lld ms, cost %lld)",
			    i, (long long)c->limit, (long long)c->window_ms,
			    (long long)c->cost);
			goto free_slots;
		}
		slots[i].params.token = c->token;
		slots[i].hash = memory_siphash(m->seed,
		    (const unsigned char *)c->key, c->keylen);
	}

	rc = memory_attempt(m, checks, slots, n, out, all_allowed, wait_us,
	    waited_us, report, overdrawn, err, errlen);
	if (rc == MEMORY_FULL && memory_may_sweep_all(m)) {
		memory_sweep_all(m);
		rc = memory_attempt(m, checks, slots, n, out, all_allowed,
		    wait_us, waited_us, report, overdrawn, err, errlen);
	}
	if (rc == MEMORY_FULL) {
		*kind = BACKEND_ERR_FULL;
		snprintf(err, errlen,
		    "memory store full: %lld keys "
		    "(max_keys)",
		    (long long)m->max_keys);
		memory_log_full(m);
	} else if (rc == MEMORY_ERROR) {
		*kind = BACKEND_ERR_FULL; /* out of memory */
	} else {
		*kind = BACKEND_ERR_NONE;
		ret = 0;
	}
free_slots:
	if (slots != small)
		rl_free(slots);
	return ret;
}

/*
 * A lease's release or renewal (docs/leases.md): checks[0] is its key, token,
 * cost and window.  The entry's expiry follows the leases left, as after a
 * record; an entry left empty goes.
 */
static int
memory_lease(struct memory_backend *m, const struct rl_check *c,
    enum backend_lease_op op, struct rl_result *out, char *err, size_t errlen)
{
	struct limiter_params params;
	struct memory_stripe *st;
	struct memory_entry *e;
	uint64_t hash;
	int64_t now;
	bool held = false;

	memset(out, 0, sizeof(*out));
	if (c->key == NULL || c->token == NULL ||
	    limiter_params_set(&params, RL_ALG_CONCURRENCY, c->limit,
		c->window_ms, err, errlen) == -1)
		return -1;
	hash = memory_siphash(m->seed, (const unsigned char *)c->key,
	    c->keylen);
	st = &m->stripes[memory_stripe_of(hash)].s;
	memory_lock_mask(m, UINT64_C(1) << memory_stripe_of(hash));
	now = m->clock(m->clock_arg);
	e = memory_lookup(st, hash, c->key, c->keylen);
	if (e != NULL && e->expires > now) {
		held = op == BACKEND_LEASE_RELEASE ?
		    limiter_lease_release(&e->state, now, c->token, c->cost) :
		    limiter_lease_renew(&e->state, &params, now, c->token,
			c->cost);
		if (held)
			e->expires = limiter_expiry(&e->state, &params);
		if (e->expires <= now || e->expires == INT64_MIN)
			memory_remove(m, st, e);
		else
			memory_note_expiry(st, e->expires);
	}
	memory_unlock_mask(m, UINT64_C(1) << memory_stripe_of(hash));
	out->allowed = held;
	out->reset_ms = held && op == BACKEND_LEASE_RENEW ? c->window_ms : 0;
	return 0;
}

/*
 * docs/admin.md: a counter's reset drops its entry.  Overrides live in
 * the process with the memory store (core/overrides.h), not here: those
 * calls are refused.
 */
static int
memory_admin(struct memory_backend *m, struct backend_admin *a, char *err,
    size_t errlen)
{
	struct memory_stripe *st;
	struct memory_entry *e;
	uint64_t hash;
	int64_t now;

	a->found = false;
	a->reply = NULL;
	a->replylen = 0;
	if (a->op != BACKEND_ADMIN_RESET || a->key == NULL) {
		snprintf(err, errlen,
		    "memory store: overrides are kept in the "
		    "process");
		return -1;
	}
	hash = memory_siphash(m->seed, (const unsigned char *)a->key,
	    a->keylen);
	st = &m->stripes[memory_stripe_of(hash)].s;
	memory_lock_mask(m, UINT64_C(1) << memory_stripe_of(hash));
	now = m->clock(m->clock_arg);
	if ((e = memory_lookup(st, hash, a->key, a->keylen)) != NULL) {
		a->found = e->expires > now;
		memory_remove(m, st, e);
	}
	memory_unlock_mask(m, UINT64_C(1) << memory_stripe_of(hash));
	return 0;
}

/* Every call completes here: the store never blocks.  A probe (n == 0)
 * always succeeds. */
static void
memory_submit(struct backend *b, struct backend_call *call)
{
	struct memory_backend *m = (struct memory_backend *)b;

	call->all_allowed = true;
	call->waited_us = 0;
	call->kind = BACKEND_ERR_NONE;
	call->err[0] = '\0';
	if (call->admin != NULL) {
		call->rc = memory_admin(m, call->admin, call->err,
		    sizeof(call->err));
		if (call->rc == -1)
			call->kind = BACKEND_ERR_PROTOCOL;
	} else if (call->lease_op != BACKEND_LEASE_NONE) {
		call->rc = call->n != 1 ?
		    -1 :
		    memory_lease(m, call->checks, call->lease_op, call->out,
			call->err, sizeof(call->err));
		if (call->rc == -1)
			call->kind = BACKEND_ERR_PROTOCOL;
	} else if (call->n == 0 && call->stat != NULL)
		call->rc = memory_stats_run(m->stats, call->stat,
		    m->clock(m->clock_arg), call->stat_out, &call->kind,
		    call->err, sizeof(call->err));
	else
		call->rc = call->n == 0 ?
		    0 :
		    memory_decide(b, call->checks, call->n, call->out,
			&call->all_allowed, call->wait_us, &call->waited_us,
			call->report, call->overdrawn, &call->kind, call->err,
			sizeof(call->err));
	memory_sweep_step(m);
	call->done(call);
}

static void
memory_free(struct backend *b)
{
	struct memory_backend *m = (struct memory_backend *)b;
	struct memory_stripe *st;
	struct memory_entry *e, *next;
	size_t i, k;

	if (m == NULL)
		return;
	for (i = 0; i < MEMORY_STRIPES; i++) {
		st = &m->stripes[i].s;
		for (k = 0; st->buckets != NULL && k < st->nbuckets; k++) {
			for (e = st->buckets[k]; e != NULL; e = next) {
				next = e->next;
				limiter_state_clear(&e->state);
				rl_free(e);
			}
		}
		rl_free(st->buckets);
		pthread_mutex_destroy(&st->lock);
	}
	memory_stats_free(m->stats);
	rl_free(m);
}

static const struct backend_ops memory_ops = {
	.submit = memory_submit,
	.free = memory_free,
};

void
memory_clock_init(struct memory_clock *c, int64_t (*realtime)(void),
    int64_t (*monotonic)(void))
{
	c->monotonic = monotonic;
	c->offset = realtime() - monotonic();
}

int64_t
memory_clock_read(void *arg)
{
	const struct memory_clock *c = arg;

	return c->monotonic() + c->offset;
}

/* A random SipHash key; without getrandom(), a weaker mix of clocks and
 * addresses (still different per process). */
static void
memory_seed(uint64_t seed[2])
{
	if (getrandom(seed, 2 * sizeof(seed[0]), GRND_NONBLOCK) ==
	    (ssize_t)(2 * sizeof(seed[0])))
		return;
	seed[0] = (uint64_t)util_realtime_us() * UINT64_C(0x9e3779b97f4a7c15);
	seed[1] = ((uint64_t)util_monotonic_us() ^ (uint64_t)(uintptr_t)seed) *
	    UINT64_C(0xbf58476d1ce4e5b9);
}

struct backend *
backend_memory_new(int64_t max_keys, backend_clock_fn clock, void *clock_arg)
{
	struct memory_backend *m;
	struct memory_stripe *st;
	size_t i;

	if ((m = rl_calloc(1, sizeof(*m))) == NULL)
		return NULL;
	m->base.ops = &memory_ops;
	m->base.name = "memory";
	m->base.completes_inline = true;
	if (clock != NULL) {
		m->clock = clock;
		m->clock_arg = clock_arg;
	} else {
		memory_clock_init(&m->own_clock, util_realtime_us,
		    util_monotonic_us);
		m->clock = memory_clock_read;
		m->clock_arg = &m->own_clock;
	}
	m->max_keys = max_keys;
	atomic_init(&m->nkeys, 0);
	atomic_init(&m->last_full_sweep, (long long)INT64_MIN);
	atomic_init(&m->last_full_log, (long long)INT64_MIN);
	atomic_init(&m->full_unlogged, 0);
	memory_seed(m->seed);
	for (i = 0; i < MEMORY_STRIPES; i++) {
		st = &m->stripes[i].s;
		st->buckets = rl_calloc(MEMORY_INITIAL_BUCKETS,
		    sizeof(*st->buckets));
		if (st->buckets == NULL ||
		    pthread_mutex_init(&st->lock, NULL) != 0) {
			rl_free(st->buckets);
			st->buckets = NULL;
			goto free_stripes;
		}
		st->nbuckets = MEMORY_INITIAL_BUCKETS;
		st->soonest = st->cycle_soonest = INT64_MAX;
	}
	if ((m->stats = memory_stats_new(max_keys)) == NULL)
		goto free_stripes;
	return &m->base;

free_stripes:
	while (i-- > 0) {
		rl_free(m->stripes[i].s.buckets);
		pthread_mutex_destroy(&m->stripes[i].s.lock);
	}
	rl_free(m);
	return NULL;
}

size_t
backend_memory_key_count(struct backend *b)
{
	struct memory_backend *m = (struct memory_backend *)b;
	long long n;

	memory_sweep_all(m);
	n = atomic_load(&m->nkeys);
	return n < 0 ? 0 : (size_t)n;
}

size_t
backend_memory_unswept(struct backend *b)
{
	struct memory_backend *m = (struct memory_backend *)b;
	struct memory_stripe *st;
	struct memory_entry *e;
	size_t k, bad = 0;
	unsigned i;

	for (i = 0; i < MEMORY_STRIPES; i++) {
		st = &m->stripes[i].s;
		pthread_mutex_lock(&st->lock);
		for (k = 0; k < st->nbuckets; k++)
			for (e = st->buckets[k]; e != NULL; e = e->next)
				if (e->expires < st->soonest ||
				    (k < st->sweep &&
					e->expires < st->cycle_soonest))
					bad++;
		pthread_mutex_unlock(&st->lock);
	}
	return bad;
}

size_t
backend_memory_held(struct backend *b, size_t *chains)
{
	struct memory_backend *m = (struct memory_backend *)b;
	long long n = atomic_load(&m->nkeys);
	struct memory_stripe *st;
	unsigned i;

	if (chains != NULL) {
		*chains = 0;
		for (i = 0; i < MEMORY_STRIPES; i++) {
			st = &m->stripes[i].s;
			pthread_mutex_lock(&st->lock);
			*chains += st->nbuckets;
			pthread_mutex_unlock(&st->lock);
		}
	}
	return n < 0 ? 0 : (size_t)n;
}
