/*
 * decide.c - one request, one decision (see decide.h).
 *
 * Validation comes first and completely: the forced rule exists, every
 * applying rule's key renders within RL_MAX_KEY_BYTES and its cost fits its
 * limit.  Only then is the backend called, once, with every applying rule,
 * so a bad request never touches the store and a good one is evaluated
 * all-or-nothing.  The failure policy (docs/operations.md) is applied here, the
 * same for every backend.
 *
 * A job holds what the store call borrows (checks, results, keys) from
 * prepare to completion: one allocation, with room for DECIDE_STACK_RULES
 * checks inside it, the keys in an arena of their own.  A job freed waits
 * on its thread for that thread's next prepare, arena included (at most
 * 64 per thread, none under AddressSanitizer, which then sees every
 * job's life; freed when the thread ends): a job is over 2 KiB, which
 * glibc serves from its large bins, and before each such malloc it
 * merges every small block freed since (a request frees dozens: its
 * JSON, the answer's headers); and the arena grew by a realloc per rule.
 *
 * Quota taken in advance (prefetch.c) is decide_prefetch.c's, and the
 * leases a decision holds decide_lease.c's.
 *
 * The deny cache (deny_cache.c) is asked in prepare, for stores that do not
 * answer inline: if any non-shadow check's key was denied lately for a cost
 * no larger, the request is denied as the store would, with the time left.
 * It learns in completion from every check the store denied by itself,
 * with the time the call was sent (the store decided later) and the retry
 * less its rounding up to a millisecond.  Both name the serial of the
 * request's config, so that a denial decided under the rules before a
 * reload is never answered under the new ones.
 */
#include "core/decide.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/decide_priv.h"
#include "core/deny_cache.h"
#include "core/lease.h"
#include "core/limiter.h"
#include "core/overrides.h"
#include "core/prefetch.h"
#include "base/util.h"

/* Jobs kept per thread. */
static const size_t cached_jobs_max = UTIL_KEEP(64);

const char *
decide_status_code(enum decide_status s)
{
	switch (s) {
	case DECIDE_OK:
		return "ok";
	case DECIDE_UNKNOWN_RULE:
		return "unknown_rule";
	case DECIDE_COST_EXCEEDS_LIMIT:
		return "cost_exceeds_limit";
	case DECIDE_INVALID_COST:
		return "invalid_cost";
	case DECIDE_KEY_TOO_LONG:
		return "key_too_long";
	case DECIDE_BACKEND_UNAVAILABLE:
		return "backend_unavailable";
	case DECIDE_INTERNAL:
		return "internal_error";
	case DECIDE_DEADLINE_EXCEEDED:
		return "deadline_exceeded";
	}
	return "internal_error";
}

int
decide_fail(struct decision *out, enum decide_status s, const char *fmt, ...)
{
	va_list ap;

	out->status = s;
	va_start(ap, fmt);
	vsnprintf(out->message, sizeof(out->message), fmt, ap);
	va_end(ap);
	return -1;
}

/*
 * Render rule r's store key into buf: "<prefix><rule>:{<key>}".  Returns
 * RENDER_OK with the length in *len, RENDER_MISSING, or RENDER_TOO_LONG.
 */
static enum render_result
render_key(const struct config *cfg, const struct rule *r,
    const struct attrs *a, char *buf, size_t buflen, size_t *len)
{
	char rendered[RL_MAX_KEY_BYTES + 1];
	size_t n = 0, plen, nlen, w;
	enum render_result rc;

	rendered[0] = '\0';
	if (r->key != NULL) {
		rc = template_render(r->key, a, rendered, sizeof(rendered), &n);
		if (rc != RENDER_OK)
			return rc;
	}
	/* Copied, not formatted: this runs for every rule of every request
	 * (template_render's n bytes hold no NUL: it copies C strings). */
	plen = strlen(cfg->redis.key_prefix);
	nlen = strlen(r->name);
	w = plen + nlen + 2 + n + 1;
	if (w >= buflen)
		return RENDER_TOO_LONG;
	memcpy(buf, cfg->redis.key_prefix, plen);
	memcpy(buf + plen, r->name, nlen);
	memcpy(buf + plen + nlen, ":{", 2);
	memcpy(buf + plen + nlen + 2, rendered, n);
	buf[w - 1] = '}';
	buf[w] = '\0';
	*len = w;
	return RENDER_OK;
}

/* Pick the deciding rule among results (docs/http.md) and fill *out. */
static void
pick_deciding(const struct applying *ap, const struct rl_check *checks,
    const struct rl_result *res, size_t n, bool all_allowed,
    struct decision *out)
{
	size_t i, best = 0;
	bool found = false;

	for (i = 0; i < n; i++) {
		if (!all_allowed) {
			if (res[i].allowed || checks[i].shadow)
				continue;
			if (!found ||
			    res[i].retry_after_ms > res[best].retry_after_ms)
				best = i;
		} else if (!found || res[i].remaining < res[best].remaining)
			best = i;
		found = true;
	}
	out->allowed = all_allowed;
	out->rule = ap[best].rule;
	out->limit = checks[best].limit; /* an override's, or the rule's */
	out->window_ms = checks[best].window_ms;
	out->remaining = res[best].remaining;
	out->reset_ms = res[best].reset_ms;
	out->effective_ms = res[best].effective_ms;
	out->retry_after_ms = all_allowed ? 0 : res[best].retry_after_ms;
	if (!all_allowed && out->retry_after_ms < 1)
		out->retry_after_ms = 1;
	/* A Retry-After is never earlier than t (docs/http.md).  t is when
	 * one unit more than remaining fits; a denial past the limit (a
	 * report, a lowered limit) of fewer units, cost 0 say, is retried
	 * sooner, and within its retry no more than remaining can be used
	 * all the same. */
	if (!all_allowed && out->effective_ms > out->retry_after_ms)
		out->effective_ms = out->retry_after_ms;
	out->shadow = ap[best].rule->shadow;
}

/* Each group's own outcome among the checks it shares in (see decide.h). */
static void
pick_groups(const struct decide_job *job)
{
	size_t g, i, best;
	bool found, denied;

	for (g = 0; g < job->ngroups; g++) {
		struct decide_group_result *o = &job->group_out[g];

		found = denied = false;
		best = 0;
		for (i = 0; i < job->n; i++) {
			if (!(job->ap[i].groups & ((uint64_t)1 << g)))
				continue;
			if (!job->res[i].allowed && !job->checks[i].shadow) {
				if (!denied ||
				    job->res[i].retry_after_ms >
					job->res[best].retry_after_ms)
					best = i;
				denied = true;
			} else if (!denied &&
			    (!found ||
				job->res[i].remaining <
				    job->res[best].remaining))
				best = i;
			found = true;
		}
		memset(o, 0, sizeof(*o));
		o->allowed = !denied;
		if (!found)
			continue;
		o->rule = job->ap[best].rule;
		o->limit = job->checks[best].limit;
		o->window_ms = job->checks[best].window_ms;
		o->remaining = job->res[best].remaining;
		o->reset_ms = job->res[best].reset_ms;
		o->retry_after_ms = denied ? job->res[best].retry_after_ms : 0;
		if (denied && o->retry_after_ms < 1)
			o->retry_after_ms = 1;
	}
}

/* Every group allowed without the store (the failure policy allow). */
static void
allow_groups(const struct decide_job *job)
{
	size_t g;

	for (g = 0; g < job->ngroups; g++)
		job->group_out[g] = (struct decide_group_result){
			.allowed = true
		};
}

static void
report(const struct decider *d, const struct applying *ap,
    const struct rl_check *checks, const struct rl_result *res, size_t n,
    bool all_allowed, enum decide_rule_result forced)
{
	enum decide_rule_result r;
	size_t i;

	if (d->on_rule == NULL)
		return;
	for (i = 0; i < n; i++) {
		if (res == NULL)
			r = forced;
		else if (checks[i].shadow && !res[i].allowed)
			r = DECIDE_RULE_SHADOW_DENIED;
		else if (!all_allowed)
			r = DECIDE_RULE_DENIED;
		else
			r = forced;
		d->on_rule(ap[i].rule, r, d->hook_arg);
	}
}

/* The calling thread's jobs freed (see the top); the key's destructor
 * frees them when the thread ends. */
static _Thread_local struct decide_job *free_jobs;
static _Thread_local size_t nfree_jobs;
static pthread_key_t free_jobs_key;
static pthread_once_t free_jobs_once = PTHREAD_ONCE_INIT;

static void
free_jobs_drop(void *unused)
{
	struct decide_job *job;

	(void)unused;
	while ((job = free_jobs) != NULL) {
		free_jobs = job->next_free;
		rl_free(job->arena);
		rl_free(job);
	}
	nfree_jobs = 0;
}

static void
free_jobs_init(void)
{
	(void)pthread_key_create(&free_jobs_key, free_jobs_drop);
}

/* A job from the thread's cache (its arena kept), or a new one; fields
 * are set by decide_prepare(). */
static struct decide_job *
job_alloc(void)
{
	struct decide_job *job = free_jobs;

	if (job != NULL) {
		free_jobs = job->next_free;
		nfree_jobs--;
		return job;
	}
	if ((job = rl_malloc(sizeof(*job))) != NULL) {
		job->arena = NULL;
		job->arena_cap = 0;
	}
	return job;
}

static void
job_free(struct decide_job *job)
{
	if (job == NULL)
		return;
	if (job->ap != job->ap_small) {
		rl_free(job->ap);
		rl_free(job->checks);
		rl_free(job->res);
		rl_free(job->over);
	}
	if (nfree_jobs < cached_jobs_max) {
		if (free_jobs == NULL) {
			/* Armed once per thread: the destructor runs only
			 * for a key set to something. */
			(void)pthread_once(&free_jobs_once, free_jobs_init);
			(void)pthread_setspecific(free_jobs_key, &free_jobs);
		}
		job->next_free = free_jobs;
		free_jobs = job;
		nfree_jobs++;
		return;
	}
	rl_free(job->arena);
	rl_free(job);
}

/* Ceiling of us / 1000 for us > 0, else 0. */
static int64_t
us_to_ms(int64_t us)
{
	return us <= 0 ? 0 : (us + 999) / 1000;
}

/*
 * Does the deny cache answer for check c?  Not for a shadow check, one of
 * cost 0, or a concurrency check (a release may free it at once).  Its
 * entries name the check's limit and window, an override's for a key under
 * one (docs/admin.md), so that a denial learnt under one limit is never
 * answered under another; one learnt under another config is never
 * answered either (deny_cache.h).
 */
static bool
deny_applies(const struct rl_check *c)
{
	return !c->shadow && c->cost > 0 && c->algorithm != RL_ALG_CONCURRENCY;
}

/*
 * Deny from the deny cache: 1 with *out filled when every non-shadow
 * check's key is denied there for this cost, the answer the one denied
 * longest; else 0.  A check the cache does not answer may deny for longer
 * than the ones it does (only the store knows), so a request with one goes
 * to the store.
 */
static int
deny_cached(const struct decider *d, struct decide_job *job)
{
	int64_t now = util_monotonic_us();
	struct deny_times t, best_t = { 0 };
	size_t i, best = 0;
	bool hit = false;

	for (i = 0; i < job->n; i++) {
		const struct rl_check *c = &job->checks[i];

		if (c->shadow)
			continue;
		if (!deny_applies(c) ||
		    !deny_cache_get(d->deny, job->cfg->serial, c->key,
			c->keylen, c->limit, c->window_ms, c->cost, now, &t))
			return 0;
		if (!hit || t.until_us > best_t.until_us) {
			best = i;
			best_t = t;
		}
		hit = true;
	}
	if (!hit)
		return 0;
	deny_cache_count_hit(d->deny);
	job->out->allowed = false;
	job->out->rule = job->ap[best].rule;
	job->out->limit = job->checks[best].limit;
	job->out->window_ms = job->checks[best].window_ms;
	job->out->remaining = best_t.remaining;
	/* The store's own retry was rounded up; so is what is left. */
	job->out->retry_after_ms = us_to_ms(best_t.until_us - now) + 1;
	job->out->reset_ms = us_to_ms(best_t.reset_us - now);
	if (job->out->reset_ms < job->out->retry_after_ms)
		job->out->reset_ms = job->out->retry_after_ms;
	/* Between 1 ms and the retry: quota may have come back already. */
	job->out->effective_ms = us_to_ms(best_t.effective_us - now) + 1;
	if (job->out->effective_ms > job->out->retry_after_ms)
		job->out->effective_ms = job->out->retry_after_ms;
	job->out->shadow = false;
	report(d, job->ap, job->checks, NULL, job->n, false,
	    DECIDE_RULE_DENIED);
	return 1;
}

/* Teach the deny cache what the store denied. */
static void
deny_learn(const struct decider *d, const struct decide_job *job)
{
	int64_t sent = job->submit_us;
	size_t i;

	for (i = 0; i < job->nstore; i++) {
		const struct rl_check *c = &job->checks[i];
		const struct rl_result *r = &job->res[i];
		struct deny_times t;

		if (!deny_applies(c) || r->allowed || r->retry_after_ms < 2)
			continue;
		t.until_us = sent + (r->retry_after_ms - 1) * 1000;
		t.reset_us = sent + (r->reset_ms - 1) * 1000;
		t.effective_us = sent + (r->effective_ms - 1) * 1000;
		t.remaining = r->remaining;
		deny_cache_put(d->deny, job->cfg->serial, job->ap[i].dc_stamp,
		    c->key, c->keylen, c->limit, c->window_ms, c->cost, &t);
	}
}

/* A report's rows: what each rule it recorded in has left.  Out of
 * memory: a 500 (the units are recorded all the same). */
static void
take_reported(struct decide_job *job)
{
	struct decision *out = job->out;
	size_t i;

	/* A key the report took past its limit denies until its usage
	 * drains: what this daemon holds of it may not admit meanwhile
	 * (docs/algorithms.md, "Usage reported after the fact").  Only a
	 * rule with prefetch holds any; a forget also drops the chunks in
	 * flight of the keys that share the key's stripe, so none for the
	 * others. */
	for (i = 0; i < job->n; i++)
		if (job->over[i] > 0 && job->ap[i].rule->prefetch_units > 0)
			prefetch_forget(job->d->prefetch, job->checks[i].key,
			    job->checks[i].keylen);

	out->reported = rl_calloc(job->n, sizeof(*out->reported));
	if (out->reported == NULL) {
		decide_fail(out, DECIDE_INTERNAL, "out of memory");
		return;
	}
	for (i = 0; i < job->n; i++)
		out->reported[i] = (struct decide_reported){
			.rule = job->ap[i].rule,
			.limit = job->checks[i].limit,
			.remaining = job->res[i].remaining,
			.overdrawn = job->over[i],
		};
	out->nreported = job->n;
}

/* Finish: the decision is final; free the job, then tell the caller. */
static void
job_finish(struct decide_job *job)
{
	decide_done_fn done = job->done;
	void *arg = job->arg;

	job_free(job);
	done(arg);
}

static void job_call_done(struct backend_call *call);

/* Read the deny cache's stamp of each check the store is asked about. */
static void
deny_stamps(struct decide_job *job)
{
	size_t i;

	for (i = 0; i < job->nstore; i++)
		if (deny_applies(&job->checks[i]))
			job->ap[i].dc_stamp = deny_cache_stamp(job->d->deny,
			    job->checks[i].key, job->checks[i].keylen);
}

static void
job_submit(struct decide_job *job, struct backend *b)
{
	memset(&job->call, 0, sizeof(job->call));
	job->call.checks = job->checks;
	job->call.n = job->nstore;
	job->call.out = job->res;
	job->call.start_us = job->on_local ? 0 : job->req_start_us;
	job->call.deadline_us = job->on_local ? 0 : job->req_deadline_us;
	job->call.done = job_call_done;
	job->call.arg = job;
	job->call.wait_us = job->wait_us;
	job->call.report = job->report;
	job->call.overdrawn = job->report ? job->over : NULL;
	job->submit_us = util_monotonic_us();
	if (job->d->deny != NULL && !job->on_local)
		deny_stamps(job);
	backend_submit(b, &job->call);
}

/* The store answered (or failed): complete the decision. */
static void
job_call_done(struct backend_call *call)
{
	struct decide_job *job = call->arg;
	const struct decider *d = job->d;
	struct decision *out = job->out;
	struct backend *b = job->on_local ? d->local : d->backend;

	if (d->on_backend != NULL)
		d->on_backend(b->name, util_monotonic_us() - job->submit_us,
		    call->sent_us >= job->submit_us ?
			call->sent_us - job->submit_us :
			-1,
		    call->rc == 0 ? BACKEND_ERR_NONE : call->kind, d->hook_arg);
	if (call->rc == 0) {
		decide_prefetch_settle(job, call->all_allowed);
		pick_deciding(job->ap, job->checks, job->res, job->n,
		    call->all_allowed, out);
		out->waited_ms = call->all_allowed && call->waited_us > 0 ?
		    util_ceil_div(call->waited_us, 1000) :
		    0;
		pick_groups(job);
		out->degraded = job->on_local;
		/* The local store's leases too: POST /release and /renew
		 * find them there (docs/leases.md). */
		if (call->all_allowed)
			decide_take_leases(job);
		if (job->report) {
			take_reported(job);
			job_finish(job);
			return;
		}
		if (!call->all_allowed && job->wait_us > 0)
			decide_lease_wait_check(job);
		report(d, job->ap, job->checks, job->res, job->n,
		    call->all_allowed,
		    job->on_local ? DECIDE_RULE_DEGRADED : DECIDE_RULE_ALLOWED);
		if (!call->all_allowed && !job->on_local && d->deny != NULL &&
		    !b->completes_inline)
			deny_learn(d, job);
		job_finish(job);
		return;
	}
	if (call->kind == BACKEND_ERR_DEADLINE) {
		/* The caller gave up before the store answered: no decision
		 * to make for it, and no sign that the store failed. */
		decide_prefetch_settle(job, false);
		decide_fail(out, DECIDE_DEADLINE_EXCEEDED,
		    "the deadline passed before the %s store answered",
		    b->name);
		job_finish(job);
		return;
	}
	if (!job->on_local) {
		out->backend_error = call->kind;
		switch (job->cfg->on_backend_error) {
		case RL_ON_ERROR_DENY:
			decide_prefetch_settle(job, false);
			if (!job->report)
				report(d, job->ap, job->checks, NULL, job->n,
				    false, DECIDE_RULE_ERROR);
			/* The kind only: the store's own text (its replies,
			 * addresses) goes to the log, not to clients. */
			decide_fail(out, DECIDE_BACKEND_UNAVAILABLE,
			    "the %s store "
			    "failed (%s)",
			    b->name, backend_error_kind_name(call->kind));
			job_finish(job);
			return;
		case RL_ON_ERROR_LOCAL:
			if (d->local != NULL && d->local != d->backend) {
				/* The local store's units are not the
				 * key's: no chunk from there. */
				job->on_local = true;
				decide_prefetch_no_chunks(job);
				job_submit(job, d->local);
				return;
			}
			break;
		case RL_ON_ERROR_ALLOW:
			break;
		}
	}
	decide_prefetch_settle(job, false);
	/* Policy allow, or the local store failed too: allow. */
	out->degraded = true;
	allow_groups(job);
	if (!job->report)
		report(d, job->ap, job->checks, NULL, job->n, true,
		    DECIDE_RULE_DEGRADED);
	job_finish(job);
}

/*
 * Add the rules that apply to attrs (one group: bit, or 0 without groups)
 * to the job's checks, each with its key rendered into the arena at *off;
 * a rule and key already there (another group's) adds its cost to that
 * check.  0; -1 with job->out failed (key too long, cost over the limit);
 * -2 when out of memory.
 */
static int
collect(struct decide_job *job, const struct config *cfg,
    const struct rule *forced, size_t nrules, const struct attrs *attrs,
    int64_t gcost, uint64_t bit, size_t *np, size_t *offp)
{
	size_t keymax = strlen(cfg->redis.key_prefix) + RL_MAX_KEY_BYTES + 4;
	size_t i, j, n = *np, off = *offp;

	for (i = 0; i < nrules; i++) {
		const struct rule *r = forced != NULL ? forced : &cfg->rules[i];
		size_t need = keymax + strlen(r->name), len = 0;
		int64_t cost = gcost >= 0 ? gcost : r->cost, limit, window;
		bool overridden;
		enum render_result rr;
		char *na;

		if (forced == NULL && !rule_matches(r, attrs))
			continue;
		if (r->algorithm == RL_ALG_CONCURRENCY && !job->leases)
			continue; /* no client to release it */
		if (job->report &&
		    (r->shadow || r->algorithm == RL_ALG_CONCURRENCY))
			continue; /* a report records in neither */
		if (r->algorithm == RL_ALG_CONCURRENCY)
			need += LEASE_TOKEN_LEN + 1;
		if (off + need > job->arena_cap) {
			size_t cap = job->arena_cap * 2 > off + need ?
			    job->arena_cap * 2 :
			    off + need;

			if ((na = rl_realloc(job->arena, cap)) == NULL)
				return -2;
			job->arena = na;
			job->arena_cap = cap;
		}
		rr = render_key(cfg, r, attrs, job->arena + off, need, &len);
		if (rr == RENDER_MISSING)
			continue;
		/* A shadow rule never denies, not even by an error
		 * (docs/http.md): one whose key is too long is left out. */
		if (rr == RENDER_TOO_LONG && r->shadow)
			continue;
		if (rr == RENDER_TOO_LONG) {
			job->out->failed_groups |= bit;
			return decide_fail(job->out, DECIDE_KEY_TOO_LONG,
			    "rule \"%s\": the key is longer than 512 bytes",
			    r->name);
		}
		for (j = 0; j < n; j++)
			if (job->ap[j].rule == r && job->ap[j].keylen == len &&
			    memcmp(job->arena + job->ap[j].keyoff,
				job->arena + off, len) == 0)
				break;
		limit = r->limit;
		window = r->window_ms;
		overridden = overrides_get(job->d->overrides, job->arena + off,
		    len, 0, &limit, &window);
		if (overridden)
			limit = overrides_fit_limit(r->algorithm, limit,
			    window);
		if (j < n)
			cost += job->checks[j].cost;
		/* One report's cost is at most 2^53 (http_request.c); two
		 * groups that share a key may add up past it. */
		if (job->report && cost > LIMITER_MAX_LIMIT)
			return decide_fail(job->out, DECIDE_INVALID_COST,
			    "the costs of rule \"%s\"'s key add up past 2^53",
			    r->name);
		/* A shadow rule never denies, not even by an error: one that
		 * the cost exceeds is left out of the call (docs/http.md). */
		if (cost > limit && !job->report && r->shadow)
			continue;
		if (cost > limit && !job->report) {
			/* A key two groups share: their costs together. */
			job->out->failed_groups |= bit |
			    (j < n ? job->ap[j].groups : 0);
			return decide_fail(job->out, DECIDE_COST_EXCEEDS_LIMIT,
			    "cost is larger than the limit of rule \"%s\"",
			    r->name);
		}
		if (j < n) {
			job->checks[j].cost = cost;
			job->ap[j].groups |= bit;
			continue;
		}
		job->ap[n].rule = r;
		job->ap[n].keyoff = off; /* the arena may still move */
		job->ap[n].keylen = len;
		job->ap[n].groups = bit;
		job->ap[n].tokoff = SIZE_MAX;
		job->ap[n].overridden = overridden;
		job->checks[n] = (struct rl_check){
			.algorithm = r->algorithm,
			.limit = limit,
			.window_ms = window,
			.cost = cost,
			.shadow = r->shadow,
			.keylen = len,
		};
		off += len + 1;
		if (r->algorithm == RL_ALG_CONCURRENCY) {
			if (lease_token_new(job->arena + off) == -1)
				return decide_fail(job->out, DECIDE_INTERNAL,
				    "no randomness for a lease token");
			job->ap[n].tokoff = off;
			off += LEASE_TOKEN_LEN + 1;
		}
		n++;
		*np = n;
		*offp = off;
	}
	return 0;
}

int
decide_prepare(const struct decider *d, const struct config *cfg,
    const struct decide_request *req, struct decision *out,
    struct decide_job **jobp)
{
	struct decide_job *job;
	size_t nrules, nmax, n = 0, i, g, ngroups, off = 0;
	int rc;
	bool failed = false;
	const struct rule *forced = NULL;

	*jobp = NULL;
	memset(out, 0, sizeof(*out));
	out->allowed = true;
	ngroups = req->ngroups;
	for (g = 0; g < ngroups; g++)
		req->group_out[g] = (struct decide_group_result){
			.allowed = true
		};
	if (ngroups > DECIDE_MAX_GROUPS)
		return decide_fail(out, DECIDE_INTERNAL,
			   "more than %d attribute "
			   "sets in one request",
			   DECIDE_MAX_GROUPS),
		       0;
	if (ngroups == 0 && req->rule != NULL) {
		if ((forced = config_find_rule(cfg, req->rule)) == NULL)
			return decide_fail(out, DECIDE_UNKNOWN_RULE,
				   "no rule named \"%s\"", req->rule),
			       0;
		nrules = 1;
	} else
		nrules = cfg->nrules;
	if (nrules == 0)
		return 0;
	nmax = nrules * (ngroups > 0 ? ngroups : 1);

	/* Not zeroed: every field is set here or before it is read. */
	if ((job = job_alloc()) == NULL)
		goto oom;
	job->n = 0;
	job->on_local = false;
	job->done = NULL;
	job->arg = NULL;
	job->d = d;
	job->cfg = cfg;
	job->out = out;
	job->req_start_us = req->start_us;
	job->req_deadline_us = req->deadline_us;
	job->wait_us = ngroups > 0 || req->wait_ms <= 0 || req->report ?
	    0 :
	    req->wait_ms * 1000;
	job->group_out = ngroups > 0 ? req->group_out : NULL;
	job->ngroups = ngroups;
	job->report = req->report && ngroups == 0;
	job->leases = req->leases && ngroups == 0 && !job->report;
	job->ap = job->ap_small;
	job->checks = job->ck_small;
	job->res = job->rs_small;
	job->over = job->ov_small;
	if (nmax > DECIDE_STACK_RULES) {
		job->ap = rl_calloc(nmax, sizeof(*job->ap));
		job->checks = rl_calloc(nmax, sizeof(*job->checks));
		job->res = rl_calloc(nmax, sizeof(*job->res));
		job->over = rl_calloc(nmax, sizeof(*job->over));
		if (job->ap == NULL || job->checks == NULL ||
		    job->res == NULL || job->over == NULL)
			goto oom;
	}

	/* Which rules apply, with their keys and costs. */
	for (g = 0; g < (ngroups > 0 ? ngroups : 1); g++) {
		rc = ngroups > 0 ?
		    collect(job, cfg, forced, nrules, req->groups[g].attrs,
			req->groups[g].cost, (uint64_t)1 << g, &n, &off) :
		    collect(job, cfg, forced, nrules, req->attrs, req->cost, 0,
			&n, &off);
		if (rc == -2)
			goto oom;
		/* A group's key too long or cost over a limit: nothing is
		 * decided, but every group it is true of is named (gRPC
		 * answers each descriptor, docs/grpc.md). */
		if (rc == -1 && ngroups > 0 &&
		    (out->status == DECIDE_KEY_TOO_LONG ||
			out->status == DECIDE_COST_EXCEEDS_LIMIT)) {
			failed = true;
			continue;
		}
		if (rc == -1)
			goto settled;
	}
	if (failed || n == 0)
		goto settled;
	job->n = n;
	for (i = 0; i < n; i++) {
		job->checks[i].key = job->arena + job->ap[i].keyoff;
		job->checks[i].token = job->ap[i].tokoff == SIZE_MAX ?
		    NULL :
		    job->arena + job->ap[i].tokoff;
	}
	/* The cache knows a key, not a group's other rules: it answers
	 * requests of one attribute set only. */
	if (ngroups == 0 && job->wait_us == 0 && !job->report &&
	    d->deny != NULL && !d->backend->completes_inline &&
	    deny_cached(d, job))
		goto settled;
	job->nstore = decide_prefetch_plan(job);
	if (job->nstore == 0) {
		/* Every check answered from units held in advance. */
		decide_prefetch_settle(job, true);
		pick_deciding(job->ap, job->checks, job->res, job->n, true,
		    out);
		pick_groups(job);
		report(d, job->ap, job->checks, job->res, job->n, true,
		    DECIDE_RULE_ALLOWED);
		goto settled;
	}
	*jobp = job;
	return 1;

oom:
	decide_fail(out, DECIDE_INTERNAL, "out of memory");
settled:
	job_free(job);
	return 0;
}

void
decide_run(struct decide_job *job, decide_done_fn done, void *arg)
{
	job->done = done;
	job->arg = arg;
	job->on_local = false;
	job_submit(job, job->d->backend);
}

size_t
decide_job_lease_keys(const struct decide_job *job, uint64_t *keys, size_t max)
{
	size_t i, k = 0;

	for (i = 0; i < job->n && k < max; i++)
		if (job->checks[i].algorithm == RL_ALG_CONCURRENCY &&
		    !job->checks[i].shadow && job->checks[i].cost > 0)
			keys[k++] = lease_key_hash(job->checks[i].key,
			    job->checks[i].keylen);
	return k;
}

void
decide_job_look_leases(struct decide_job *job)
{
	size_t i;

	for (i = 0; i < job->n; i++)
		if (job->checks[i].algorithm == RL_ALG_CONCURRENCY &&
		    !job->checks[i].shadow && job->checks[i].cost > 0)
			job->checks[i].token = NULL;
}

void
decide_cancel(struct decide_job *job)
{
	job_free(job);
}

static void
decide_event_set(void *arg)
{
	util_event_set(arg);
}

int
decide(const struct decider *d, const struct config *cfg,
    const struct decide_request *req, struct decision *out)
{
	struct util_event ev;
	struct decide_job *job;

	if (decide_prepare(d, cfg, req, out, &job) == 1) {
		util_event_init(&ev);
		decide_run(job, decide_event_set, &ev);
		util_event_wait(&ev);
		util_event_destroy(&ev);
	}
	return out->status == DECIDE_OK ? 0 : -1;
}
