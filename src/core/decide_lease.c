/*
 * decide_lease.c - the leases of a decision (docs/leases.md): the ones an
 * allowed request took, as strings for its answer, how long each is held,
 * and whether a request a concurrency rule denied may wait for one.
 * Part of decide.c's completion (see decide_priv.h).
 *
 * Thread: the thread that completes the decision, as in decide.c.
 */
#include <stdint.h>
#include <string.h>

#include "base/util.h"
#include "core/decide.h"
#include "core/decide_priv.h"
#include "core/lease.h"

void
decide_leases_free(struct decision *out)
{
	size_t i;

	for (i = 0; i < out->nleases; i++)
		rl_free(out->leases[i].lease);
	rl_free(out->leases);
	out->leases = NULL;
	out->nleases = 0;
	rl_free(out->reported);
	out->reported = NULL;
	out->nreported = 0;
}

int64_t
decide_lease_left_ms(const struct decide_lease *l, int64_t at_us)
{
	return l->held_until_us > at_us ?
	    util_ceil_div(l->held_until_us - at_us, 1000) :
	    0;
}

bool
decide_leases_held(const struct decision *out, int64_t at_us)
{
	size_t i;

	for (i = 0; i < out->nleases; i++)
		if (!out->leases[i].rule->shadow &&
		    out->leases[i].held_until_us - at_us < 1000)
			return false;
	return true;
}

/*
 * The leases the store recorded for an allowed request: one per
 * concurrency check that allowed with cost > 0.  Each is held for the
 * key's window from when the store took it, which was after the call
 * left: counted from then, whatever kept the reply (docs/leases.md).
 * Out of memory: the decision becomes a 500, and the leases expire by
 * themselves.
 */
void
decide_take_leases(struct decide_job *job)
{
	struct decision *out = job->out;
	size_t plen = strlen(job->cfg->redis.key_prefix), i, k = 0;
	/* The memory store stamps no send: it decides inside the submit. */
	int64_t sent = job->call.sent_us > 0 ? job->call.sent_us :
					       job->submit_us;

	for (i = 0; i < job->n; i++)
		if (job->ap[i].tokoff != SIZE_MAX && job->res[i].allowed &&
		    job->checks[i].cost > 0)
			k++;
	if (k == 0)
		return;
	if ((out->leases = rl_calloc(k, sizeof(*out->leases))) == NULL)
		goto oom;
	for (i = 0; i < job->n; i++) {
		const struct rl_check *c = &job->checks[i];
		struct decide_lease *l = &out->leases[out->nleases];

		if (job->ap[i].tokoff == SIZE_MAX || !job->res[i].allowed ||
		    c->cost == 0)
			continue;
		l->rule = job->ap[i].rule;
		l->held_until_us = sent + c->window_ms * 1000;
		l->lease = lease_format(c->key + plen, c->keylen - plen,
		    c->cost, c->token);
		if (l->lease == NULL)
			goto oom;
		out->nleases++;
	}
	return;
oom:
	decide_leases_free(out);
	decide_fail(out, DECIDE_INTERNAL, "out of memory");
}

/*
 * Denied with wait_ms: may the request wait for a lease (decide.h)?  Only
 * when a concurrency rule denied and no other rule that denied needs
 * longer than the wait, nor is a sliding_window rule, which never waits
 * (docs/waiting.md: answered 429 at once).
 */
void
decide_lease_wait_check(struct decide_job *job)
{
	struct decision *out = job->out;
	size_t i, best = SIZE_MAX;

	for (i = 0; i < job->n; i++) {
		const struct rl_check *c = &job->checks[i];
		const struct rl_result *r = &job->res[i];

		if (c->shadow || r->allowed)
			continue;
		if (c->algorithm == RL_ALG_SLIDING_WINDOW)
			return;
		if (c->algorithm != RL_ALG_CONCURRENCY) {
			if (r->retry_after_ms * 1000 > job->wait_us)
				return;
		} else if (best == SIZE_MAX ||
		    r->retry_after_ms > job->res[best].retry_after_ms)
			best = i;
	}
	if (best == SIZE_MAX)
		return;
	out->lease_wait = true;
	out->lease_key = lease_key_hash(job->checks[best].key,
	    job->checks[best].keylen);
	out->lease_retry_ms = job->res[best].retry_after_ms;
}
