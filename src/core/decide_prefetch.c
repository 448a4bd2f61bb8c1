/*
 * decide_prefetch.c - quota taken in advance, as a decision uses it
 * (prefetch.c holds the units; docs/algorithms.md, "Taking quota in
 * advance").  It is used in prepare, after the deny cache: a request
 * whose every check has a key the daemon holds enough units of is
 * answered from them, with no store call; any other request uses none,
 * and those of its prefetched checks whose key holds fewer units than
 * their cost ask the store for a chunk.  Completion holds the chunks
 * recorded, under the generation of the request's config.
 *
 * Thread: the thread that prepares or completes the decision, as in
 * decide.c.
 */
#include <stdint.h>

#include "base/util.h"
#include "core/decide.h"
#include "core/decide_priv.h"
#include "core/prefetch.h"

/* Does check i of the job take part in prefetch?  Not under an
 * override (docs/admin.md): units held were taken under the rule's own
 * limit, so a key whose limit an override changed goes to the store.  Nor
 * in a report (/report records past the limit and answers what was
 * overdrawn: the store's to say). */
static bool
prefetch_applies(const struct decide_job *job, size_t i)
{
	const struct rule *r = job->ap[i].rule;

	return job->d->prefetch != NULL && r->prefetch_units > 0 &&
	    job->checks[i].cost > 0 && job->wait_us == 0 && !job->report &&
	    r->algorithm != RL_ALG_CONCURRENCY && !job->ap[i].overridden;
}

/* Check i asks the store for a chunk when the daemon holds fewer than
 * its cost of the key and has room to hold more (prefetch_wants_chunk);
 * else it is a plain check. */
static void
prefetch_want_chunk(struct decide_job *job, size_t i, int64_t now)
{
	struct rl_check *c = &job->checks[i];
	const struct rule *r = job->ap[i].rule;

	if (!prefetch_wants_chunk(job->d->prefetch, job->cfg->serial, c->key,
		c->keylen, c->cost, now))
		return;
	c->prefetch_want = r->prefetch_units > c->cost ? r->prefetch_units :
							 c->cost;
	c->prefetch_hold_us = r->prefetch_hold_ms * 1000;
}

static void
swap_checks(struct decide_job *job, size_t a, size_t b)
{
	struct applying ap = job->ap[a];
	struct rl_check ck = job->checks[a];

	job->ap[a] = job->ap[b];
	job->checks[a] = job->checks[b];
	job->ap[b] = ap;
	job->checks[b] = ck;
}

/*
 * Before the store: when this daemon holds enough units for every check
 * of the request, they are taken and the request is answered in process
 * (every check moved past the ones for the store: returns 0).  Otherwise
 * nothing held is used, every check goes to the store, and each
 * prefetched one whose key holds fewer units than its cost asks for a
 * chunk (the others are plain checks, their held units left for whole
 * requests): a request admitted only once the store answers its other
 * checks could use units whose hold ended meanwhile (docs/algorithms.md).
 * Returns the number of checks for the store.
 */
size_t
decide_prefetch_plan(struct decide_job *job)
{
	int64_t now;
	uint64_t gen = job->cfg->serial;
	struct prefetch_view v;
	size_t i, nstore = job->n;
	bool all = true, any = false;

	for (i = 0; i < job->n; i++) {
		job->ap[i].pf_units = 0;
		job->ap[i].pf_until = 0;
		job->ap[i].pf_stamp = 0;
		if (!prefetch_applies(job, i))
			all = false;
		else {
			any = true;
			job->ap[i].pf_stamp = prefetch_stamp(job->d->prefetch,
			    job->checks[i].key, job->checks[i].keylen);
		}
	}
	if (!any)
		return job->n; /* no clock read for a request without */
	now = util_monotonic_us();
	for (i = 0; i < nstore;) {
		struct rl_check *c = &job->checks[i];

		if (!prefetch_applies(job, i)) {
			i++;
			continue;
		}
		if (!all ||
		    !prefetch_take(job->d->prefetch, gen, c->key, c->keylen,
			c->cost, now, &v)) {
			prefetch_want_chunk(job, i, now);
			all = false;
			i++;
			continue;
		}
		job->ap[i].pf_units = c->cost;
		job->ap[i].pf_until = v.until;
		job->res[i] = (struct rl_result){
			.allowed = true,
			.remaining = v.remaining < c->limit ? v.remaining :
							      c->limit,
			.reset_ms = v.reset_ms,
			.effective_ms = v.effective_ms,
		};
		nstore--;
		if (i != nstore) {
			struct rl_result rs = job->res[i];

			swap_checks(job, i, nstore);
			job->res[nstore] = rs;
		}
	}
	if (nstore == 0)
		return 0;
	/* A check found too little held after others were taken: those
	 * go back, and ask for a chunk too. */
	for (i = nstore; i < job->n; i++) {
		const struct rl_check *c = &job->checks[i];

		prefetch_put_back(job->d->prefetch, gen, job->ap[i].rule->name,
		    c->key, c->keylen, job->ap[i].pf_units, job->ap[i].pf_until,
		    now, job->ap[i].pf_stamp);
		job->ap[i].pf_units = 0;
		job->ap[i].pf_until = 0;
		job->res[i] = (struct rl_result){ 0 };
		prefetch_want_chunk(job, i, now);
	}
	return job->n;
}

/* The local store decides instead: plain checks, no chunk. */
void
decide_prefetch_no_chunks(struct decide_job *job)
{
	size_t i;

	for (i = 0; i < job->nstore; i++)
		job->checks[i].prefetch_want = job->checks[i]
						   .prefetch_hold_us = 0;
}

/*
 * An admitted check i that went to the store: the chunk it recorded is
 * held, and its answer is given on the terms of one from held units
 * (docs/algorithms.md): the store's remaining, which counts every unit
 * taken, plus the units the daemon holds of the key now, so that the
 * next request, answered from them, does not report more.  A plain check
 * of a key with units held counts them too, and its newer answer is the
 * one theirs start from.  Of two answers that settle out of order, the
 * one of the call that left later stands (prefetch_add()).
 */
static void
prefetch_hold(struct decide_job *job, size_t i, int64_t now)
{
	const struct decider *d = job->d;
	const struct rl_check *c = &job->checks[i];
	const struct rule *r = job->ap[i].rule;
	struct rl_result *res = &job->res[i];
	int64_t answer;

	if (c->prefetch_want > 0 && res->taken > c->cost) {
		/* Held from when the call left: the store's now was
		 * later. */
		answer = prefetch_add(d->prefetch, job->cfg->serial, r->name,
		    c->key, c->keylen, res->taken - c->cost,
		    job->submit_us + res->taken_us, job->submit_us, now,
		    res->remaining, res->reset_ms, res->effective_ms,
		    job->ap[i].pf_stamp);
		if (d->on_prefetch != NULL)
			d->on_prefetch(r, false, res->taken - c->cost,
			    d->hook_arg);
	} else
		answer = prefetch_refresh(d->prefetch, job->cfg->serial, c->key,
		    c->keylen, job->submit_us, now, res->remaining,
		    res->reset_ms, res->effective_ms, job->ap[i].pf_stamp);
	if (answer >= 0)
		res->remaining = answer < c->limit ? answer : c->limit;
}

/*
 * The decision is known: the units answered in process are used (such a
 * request is admitted), and when admitted, the chunks the store recorded
 * are held (prefetch_hold).
 */
void
decide_prefetch_settle(struct decide_job *job, bool admitted)
{
	const struct decider *d = job->d;
	int64_t now = 0; /* read at the first check that needs it */
	size_t i;

	if (d->prefetch == NULL)
		return;
	for (i = 0; i < job->n; i++) {
		if (job->ap[i].pf_units > 0) {
			/* Only a request answered whole in process took any
			 * (prefetch_plan): they are used. */
			if (d->on_prefetch != NULL)
				d->on_prefetch(job->ap[i].rule, true,
				    job->ap[i].pf_units, d->hook_arg);
			continue;
		}
		if (i >= job->nstore || !admitted ||
		    !prefetch_applies(job, i) || job->on_local ||
		    !job->res[i].allowed)
			continue;
		if (now == 0)
			now = util_monotonic_us();
		prefetch_hold(job, i, now);
	}
}
