/*
 * decide.c - one request, one decision (see decide.h).
 *
 * Validation comes first and completely: the forced rule exists, every
 * applying rule's key renders within RL_MAX_KEY_BYTES and its cost fits its
 * limit.  Only then is the backend called, once, with every applying rule,
 * so a bad request never touches the store and a good one is evaluated
 * all-or-nothing.  The failure policy (CONTRACT 6) is applied here, the same
 * for every backend.
 */
#include "decide.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

/* Requests with few applying rules (nearly all) use the stack. */
#define DECIDE_STACK_RULES 8

struct applying {
	const struct rule *rule;
	size_t keyoff;		/* the key's offset in the key arena */
	size_t keylen;
};

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
	case DECIDE_KEY_TOO_LONG:
		return "key_too_long";
	case DECIDE_BACKEND_UNAVAILABLE:
		return "backend_unavailable";
	case DECIDE_INTERNAL:
		return "internal_error";
	}
	return "internal_error";
}

static int __attribute__((format(printf, 3, 4)))
fail(struct decision *out, enum decide_status s, const char *fmt, ...)
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
	size_t n = 0;
	enum render_result rc;
	int w;

	rendered[0] = '\0';
	if (r->key != NULL) {
		rc = template_render(r->key, a, rendered, sizeof(rendered), &n);
		if (rc != RENDER_OK)
			return rc;
	}
	w = snprintf(buf, buflen, "%s%s:{%s}", cfg->redis.key_prefix, r->name,
	    rendered);
	if (w < 0 || (size_t)w >= buflen)
		return RENDER_TOO_LONG;
	*len = (size_t)w;
	return RENDER_OK;
}

/* Pick the deciding rule among results (CONTRACT 5) and fill *out. */
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
	out->limit = ap[best].rule->limit;
	out->remaining = res[best].remaining;
	out->reset_ms = res[best].reset_ms;
	out->retry_after_ms = all_allowed ? 0 : res[best].retry_after_ms;
	if (!all_allowed && out->retry_after_ms < 1)
		out->retry_after_ms = 1;
	out->shadow = ap[best].rule->shadow;
}

/* backend_decide(), timed for the on_backend hook. */
static int
timed_decide(const struct decider *d, struct backend *b,
    const struct rl_check *checks, size_t n, struct rl_result *res,
    bool *all_allowed, enum backend_error_kind *kind, char *err,
    size_t errlen)
{
	int64_t start = d->on_backend != NULL ? util_monotonic_us() : 0;
	int rc;

	*kind = BACKEND_ERR_NONE;
	rc = backend_decide(b, checks, n, res, all_allowed, kind, err, errlen);
	if (d->on_backend != NULL)
		d->on_backend(b->name, util_monotonic_us() - start,
		    rc == 0 ? BACKEND_ERR_NONE : *kind, d->hook_arg);
	return rc;
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

int
decide(const struct decider *d, const struct config *cfg,
    const struct decide_request *req, struct decision *out)
{
	struct applying ap_stack[DECIDE_STACK_RULES], *ap = ap_stack;
	struct rl_check ck_stack[DECIDE_STACK_RULES], *checks = ck_stack;
	struct rl_result rs_stack[DECIDE_STACK_RULES], *res = rs_stack;
	char *arena = NULL;
	size_t nrules, n = 0, i, keymax, off = 0;
	const struct rule *forced = NULL;
	enum backend_error_kind kind = BACKEND_ERR_NONE;
	char err[DECIDE_MESSAGE_MAX - 8];
	bool all_allowed = false, degraded = false;
	int rc = -1;

	memset(out, 0, sizeof(*out));
	out->allowed = true;
	if (req->rule != NULL) {
		if ((forced = config_find_rule(cfg, req->rule)) == NULL)
			return fail(out, DECIDE_UNKNOWN_RULE,
			    "no rule named \"%s\"", req->rule);
		nrules = 1;
	} else
		nrules = cfg->nrules;
	if (nrules == 0)
		return 0;

	keymax = strlen(cfg->redis.key_prefix) + RL_MAX_KEY_BYTES + 4;
	if (nrules > DECIDE_STACK_RULES) {
		ap = rl_calloc(nrules, sizeof(*ap));
		checks = rl_calloc(nrules, sizeof(*checks));
		res = rl_calloc(nrules, sizeof(*res));
		if (ap == NULL || checks == NULL || res == NULL)
			goto oom;
	}

	/* Which rules apply, with their keys and costs. */
	for (i = 0; i < nrules; i++) {
		const struct rule *r = forced != NULL ? forced : &cfg->rules[i];
		size_t need = keymax + strlen(r->name), len = 0;
		int64_t cost = req->cost >= 0 ? req->cost : r->cost;
		enum render_result rr;
		char *na;

		if (forced == NULL && !rule_matches(r, req->attrs))
			continue;
		if ((na = rl_realloc(arena, off + need)) == NULL)
			goto oom;
		arena = na;
		rr = render_key(cfg, r, req->attrs, arena + off, need, &len);
		if (rr == RENDER_MISSING)
			continue;
		if (rr == RENDER_TOO_LONG) {
			fail(out, DECIDE_KEY_TOO_LONG,
			    "rule \"%s\": the key is longer than 512 bytes",
			    r->name);
			goto done;
		}
		if (cost > r->limit) {
			fail(out, DECIDE_COST_EXCEEDS_LIMIT,
			    "cost is larger than the limit of rule \"%s\"",
			    r->name);
			goto done;
		}
		ap[n].rule = r;
		ap[n].keyoff = off;	/* the arena may still move */
		ap[n].keylen = len;
		checks[n] = (struct rl_check){
			.algorithm = r->algorithm, .limit = r->limit,
			.window_ms = r->window_ms, .cost = cost,
			.shadow = r->shadow, .keylen = len,
		};
		off += len + 1;
		n++;
	}
	if (n == 0) {
		rc = 0;
		goto done;
	}
	for (i = 0; i < n; i++)
		checks[i].key = arena + ap[i].keyoff;

	if (timed_decide(d, d->backend, checks, n, res, &all_allowed, &kind,
	    err, sizeof(err)) == 0) {
		pick_deciding(ap, checks, res, n, all_allowed, out);
		report(d, ap, checks, res, n, all_allowed,
		    DECIDE_RULE_ALLOWED);
		rc = 0;
		goto done;
	}
	out->backend_error = kind;
	switch (cfg->on_backend_error) {
	case RL_ON_ERROR_DENY:
		report(d, ap, checks, NULL, n, false, DECIDE_RULE_ERROR);
		fail(out, DECIDE_BACKEND_UNAVAILABLE, "%s", err);
		goto done;
	case RL_ON_ERROR_LOCAL:
		degraded = true;
		if (d->local != NULL && d->local != d->backend &&
		    timed_decide(d, d->local, checks, n, res, &all_allowed,
		    &kind, err, sizeof(err)) == 0) {
			pick_deciding(ap, checks, res, n, all_allowed, out);
			out->degraded = true;
			report(d, ap, checks, res, n, all_allowed,
			    DECIDE_RULE_DEGRADED);
			rc = 0;
			goto done;
		}
		/* The local store failed too: allow. */
		__attribute__((fallthrough));
	case RL_ON_ERROR_ALLOW:
		degraded = true;
		break;
	}
	out->degraded = degraded;
	report(d, ap, checks, NULL, n, true, DECIDE_RULE_DEGRADED);
	rc = 0;
	goto done;

oom:
	fail(out, DECIDE_INTERNAL, "out of memory");
done:
	if (ap != ap_stack) {
		rl_free(ap);
		rl_free(checks);
		rl_free(res);
	}
	rl_free(arena);
	return rc;
}
