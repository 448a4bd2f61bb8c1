/*
 * check_decide.c - unit tests of decide.c with a scripted fake backend: the
 * pure decision logic (which rules apply, validation before any backend
 * call, the deciding rule, the failure policy, the hooks, how long a
 * lease is held).  The real stores are tested in check_backend_memory.c
 * and check_backend_redis.c.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/decide.h"
#include "core/overrides.h"
#include "core/prefetch.h"
#include "base/util.h"
#include "store/memory.h"

/* A backend that answers from a script and remembers what it was asked. */
struct fake {
	struct backend base;
	int calls;
	int fail; /* answer -1 with BACKEND_ERR_TIMEOUT, or fail_kind */
	enum backend_error_kind fail_kind;
	size_t n; /* checks in the last call */
	char keys[4][600];
	int64_t costs[4];
	struct rl_result answer[4]; /* what to answer, by position */
	int64_t sent_us;	    /* the call's stamp of its send */
};

static int
fake_decide(struct backend *b, const struct rl_check *checks, size_t n,
    struct rl_result *out, bool *all_allowed, enum backend_error_kind *kind,
    char *err, size_t errlen)
{
	struct fake *f = (struct fake *)b;
	size_t i;

	f->calls++;
	if (f->fail) {
		*kind = f->fail_kind != BACKEND_ERR_NONE ? f->fail_kind :
							   BACKEND_ERR_TIMEOUT;
		snprintf(err, errlen, "timeout");
		return -1;
	}
	f->n = n;
	*all_allowed = true;
	for (i = 0; i < n && i < 4; i++) {
		snprintf(f->keys[i], sizeof(f->keys[i]), "%.*s",
		    (int)checks[i].keylen, checks[i].key);
		f->costs[i] = checks[i].cost;
		out[i] = f->answer[i];
		if (!out[i].allowed && !checks[i].shadow)
			*all_allowed = false;
	}
	return 0;
}

/* Every call answered inside submit, as the memory store does. */
static void
fake_submit(struct backend *b, struct backend_call *call)
{
	if (call->n == 0) {
		call->rc = ((struct fake *)b)->fail ? -1 : 0;
		call->kind = BACKEND_ERR_TIMEOUT;
	} else
		call->rc = fake_decide(b, call->checks, call->n, call->out,
		    &call->all_allowed, &call->kind, call->err,
		    sizeof(call->err));
	call->sent_us = ((struct fake *)b)->sent_us;
	call->done(call);
}

static void
fake_free(struct backend *b)
{
	(void)b;
}

static const struct backend_ops fake_ops = { .submit = fake_submit,
	.free = fake_free };

static struct fake main_be, local_be;
static struct rule rules[3];
static struct config cfg;
static struct decider dec;
static int hook_calls[5];

static void
on_rule(const struct rule *r, enum decide_rule_result res, void *arg)
{
	(void)r;
	(void)arg;
	hook_calls[res]++;
}

static void
add_rule(size_t i, const char *name, const char *match_attr,
    const char *pattern, const char *key, int64_t limit, bool shadow)
{
	struct rule *r = &rules[i];
	char err[256];

	memset(r, 0, sizeof(*r));
	r->name = rl_strdup(name);
	r->limit = limit;
	r->window_ms = 60000;
	r->cost = 1;
	r->shadow = shadow;
	r->index = i;
	if (match_attr != NULL) {
		r->match = rl_calloc(1, sizeof(*r->match));
		r->match->attr = rl_strdup(match_attr);
		ck_assert_int_eq(pattern_compile(&r->match->pattern, pattern,
				     err, sizeof(err)),
		    0);
		r->nmatch = 1;
	}
	if (key != NULL) {
		r->key = rl_calloc(1, sizeof(*r->key));
		ck_assert_int_eq(template_compile(r->key, key, err,
				     sizeof(err)),
		    0);
	}
}

static void
setup(void)
{
	memset(&main_be, 0, sizeof(main_be));
	memset(&local_be, 0, sizeof(local_be));
	main_be.base = (struct backend){ &fake_ops, "fake", true };
	local_be.base = (struct backend){ &fake_ops, "local", true };
	memset(hook_calls, 0, sizeof(hook_calls));
	add_rule(0, "login", "path", "/login*", "${ip}", 5, false);
	add_rule(1, "global", NULL, NULL, NULL, 100, false);
	add_rule(2, "watch", "path", "/login*", "${user}", 2, true);
	memset(&cfg, 0, sizeof(cfg));
	cfg.rules = rules;
	cfg.nrules = 3;
	cfg.redis.key_prefix = (char *)"rl:";
	cfg.on_backend_error = RL_ON_ERROR_ALLOW;
	dec = (struct decider){ .backend = &main_be.base,
		.local = &local_be.base,
		.on_rule = on_rule };
}

static void
teardown(void)
{
	size_t i;

	for (i = 0; i < 3; i++)
		rule_free_contents(&rules[i]);
}

static const struct config *
cfg_ptr(void)
{
	return &cfg;
}

START_TEST(test_applying_rules_and_keys)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;

	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	main_be.answer[0] = (struct rl_result){ true, 4, 60000, 0, 0, 0, 0, 0 };
	main_be.answer[1] = (struct rl_result){ true, 99, 60000, 0, 0, 0, 0,
		0 };
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	/* "watch" needs ${user}: it does not apply. */
	ck_assert_uint_eq(main_be.n, 2);
	ck_assert_str_eq(main_be.keys[0], "rl:login:{10.0.0.1}");
	ck_assert_str_eq(main_be.keys[1], "rl:global:{}");
	ck_assert(d.allowed);
	ck_assert_str_eq(d.rule->name, "login"); /* least remaining */
	ck_assert_int_eq(d.remaining, 4);
	ck_assert_int_eq(d.limit, 5);
	ck_assert_int_eq(d.retry_after_ms, 0);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_ALLOWED], 2);
	attrs_clear(&a);
}
END_TEST

/* A thread's jobs are used again, their key arena too (decide.c): after a
 * request of three long keys, requests of fewer and shorter keys send
 * exactly their own. */
START_TEST(test_jobs_used_again)
{
	char ip[501], user[401], want[600];
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	int round;

	memset(ip, 'i', sizeof(ip) - 1);
	ip[sizeof(ip) - 1] = '\0';
	memset(user, 'u', sizeof(user) - 1);
	user[sizeof(user) - 1] = '\0';
	main_be.answer[0] = main_be.answer[1] = main_be.answer[2] =
	    (struct rl_result){ true, 1, 60000, 0, 0, 0, 0, 0 };
	for (round = 0; round < 3; round++) {
		attrs_set(&a, "path", "/login");
		attrs_set(&a, "ip", ip);
		attrs_set(&a, "user", user);
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
		ck_assert_uint_eq(main_be.n, 3);
		snprintf(want, sizeof(want), "rl:login:{%s}", ip);
		ck_assert_str_eq(main_be.keys[0], want);
		ck_assert_str_eq(main_be.keys[1], "rl:global:{}");
		snprintf(want, sizeof(want), "rl:watch:{%s}", user);
		ck_assert_str_eq(main_be.keys[2], want);
		attrs_clear(&a);

		/* Only "global" applies. */
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
		ck_assert_uint_eq(main_be.n, 1);
		ck_assert_str_eq(main_be.keys[0], "rl:global:{}");

		attrs_set(&a, "path", "/login");
		attrs_set(&a, "ip", "10.0.0.9");
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
		ck_assert_uint_eq(main_be.n, 2);
		ck_assert_str_eq(main_be.keys[0], "rl:login:{10.0.0.9}");
		ck_assert_str_eq(main_be.keys[1], "rl:global:{}");
		attrs_clear(&a);
	}
}
END_TEST

START_TEST(test_no_rule_applies)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;

	cfg.nrules = 1; /* only "login", which needs a path */
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert_ptr_null(d.rule);
	ck_assert_int_eq(main_be.calls, 0);
}
END_TEST

START_TEST(test_denied_picks_largest_retry)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;

	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	main_be.answer[0] = (struct rl_result){ false, 0, 30000, 2000, 0, 0, 0,
		0 };
	main_be.answer[1] = (struct rl_result){ false, 0, 60000, 7000, 5000, 0,
		0, 0 };
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(!d.allowed);
	ck_assert_str_eq(d.rule->name, "global");
	ck_assert_int_eq(d.retry_after_ms, 7000);
	/* The deciding rule's effective window (the RateLimit t). */
	ck_assert_int_eq(d.effective_ms, 5000);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_DENIED], 2);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_shadow_never_denies)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;

	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	attrs_set(&a, "user", "bob");
	main_be.answer[0] = (struct rl_result){ true, 3, 1000, 0, 0, 0, 0, 0 };
	main_be.answer[1] = (struct rl_result){ true, 50, 1000, 0, 0, 0, 0, 0 };
	main_be.answer[2] = (struct rl_result){ false, 0, 1000, 500, 0, 0, 0,
		0 };
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert_str_eq(d.rule->name, "watch");
	ck_assert(d.shadow);
	ck_assert_int_eq(d.retry_after_ms, 0);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_SHADOW_DENIED], 1);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_ALLOWED], 2);
	attrs_clear(&a);
}
END_TEST

/* Nor when the cost exceeds its limit: it is left out of the call, where a
 * rule that denies would give 400 cost_exceeds_limit. */
START_TEST(test_shadow_cost_over_limit)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = 3 };
	struct decision d;

	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	attrs_set(&a, "user", "bob");
	main_be.answer[0] = (struct rl_result){ true, 2, 1000, 0, 0, 0, 0, 0 };
	main_be.answer[1] = (struct rl_result){ true, 97, 1000, 0, 0, 0, 0, 0 };
	/* cost 3: over watch's 2 (shadow), within login's 5 and global's */
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert_uint_eq(main_be.n, 2);
	ck_assert_str_eq(main_be.keys[0], "rl:login:{10.0.0.1}");
	ck_assert_str_eq(main_be.keys[1], "rl:global:{}");
	attrs_clear(&a);
}
END_TEST

START_TEST(test_forced_rule_and_cost)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = "login", .cost = 3 };
	struct decision d;

	/* Forcing skips match, but the key still needs ${ip}. */
	attrs_set(&a, "ip", "1.2.3.4");
	main_be.answer[0] = (struct rl_result){ true, 2, 1000, 0, 0, 0, 0, 0 };
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_uint_eq(main_be.n, 1);
	ck_assert_str_eq(main_be.keys[0], "rl:login:{1.2.3.4}");
	ck_assert_int_eq(main_be.costs[0], 3);

	rq.rule = "nope";
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), -1);
	ck_assert_int_eq(d.status, DECIDE_UNKNOWN_RULE);
	ck_assert_str_eq(decide_status_code(d.status), "unknown_rule");
	ck_assert_int_eq(main_be.calls, 1);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_validation_before_backend)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = 6 };
	struct decision d;
	char big[600];

	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	/* cost 6 > login's limit 5, though global (100) would take it. */
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), -1);
	ck_assert_int_eq(d.status, DECIDE_COST_EXCEEDS_LIMIT);
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	attrs_set(&a, "ip", big);
	rq.cost = -1;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), -1);
	ck_assert_int_eq(d.status, DECIDE_KEY_TOO_LONG);
	ck_assert_int_eq(main_be.calls, 0);
	attrs_clear(&a);
}
END_TEST

/* Nor when its key is too long: it is left out, where a rule that denies
 * would give key_too_long. */
START_TEST(test_shadow_key_too_long)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	char big[600];

	memset(big, 'u', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	attrs_set(&a, "user", big); /* watch (shadow) keys on ${user} */
	main_be.answer[0] = (struct rl_result){ true, 4, 1000, 0, 0, 0, 0, 0 };
	main_be.answer[1] = (struct rl_result){ true, 99, 1000, 0, 0, 0, 0, 0 };
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(d.status, DECIDE_OK);
	ck_assert(d.allowed);
	ck_assert_uint_eq(main_be.n, 2);
	ck_assert_str_eq(main_be.keys[0], "rl:login:{10.0.0.1}");
	ck_assert_str_eq(main_be.keys[1], "rl:global:{}");
	attrs_clear(&a);
}
END_TEST

START_TEST(test_policy_allow_deny_local)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;

	cfg.nrules = 2;
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	main_be.fail = 1;

	cfg.on_backend_error = RL_ON_ERROR_ALLOW;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert(d.degraded);
	ck_assert_ptr_null(d.rule);
	ck_assert_int_eq(d.backend_error, BACKEND_ERR_TIMEOUT);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_DEGRADED], 2);

	cfg.on_backend_error = RL_ON_ERROR_DENY;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), -1);
	ck_assert_int_eq(d.status, DECIDE_BACKEND_UNAVAILABLE);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_ERROR], 2);

	cfg.on_backend_error = RL_ON_ERROR_LOCAL;
	local_be.answer[0] = (struct rl_result){ false, 0, 9000, 9000, 0, 0, 0,
		0 };
	local_be.answer[1] = (struct rl_result){ true, 10, 9000, 0, 0, 0, 0,
		0 };
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(local_be.calls, 1);
	ck_assert(!d.allowed);
	ck_assert(d.degraded);
	ck_assert_str_eq(d.rule->name, "login");
	ck_assert_int_eq(d.retry_after_ms, 9000);

	/* The local store failing too falls back to allow. */
	local_be.fail = 1;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert(d.degraded);
	attrs_clear(&a);
}
END_TEST

/*
 * A call that failed only because the caller's own deadline passed first
 * (BACKEND_ERR_DEADLINE) is answered DEADLINE_EXCEEDED whatever the
 * policy: not degraded, not denied by policy, not sent to the local
 * store, and no rule counted as an error or degraded.
 */
START_TEST(test_caller_deadline_is_no_store_failure)
{
	static const enum rl_on_error policy[] = { RL_ON_ERROR_ALLOW,
		RL_ON_ERROR_DENY, RL_ON_ERROR_LOCAL };
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	size_t i;

	cfg.nrules = 2;
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	main_be.fail = 1;
	main_be.fail_kind = BACKEND_ERR_DEADLINE;
	for (i = 0; i < 3; i++) {
		cfg.on_backend_error = policy[i];
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), -1);
		ck_assert_int_eq(d.status, DECIDE_DEADLINE_EXCEEDED);
		ck_assert_str_eq(decide_status_code(d.status),
		    "deadline_exceeded");
		ck_assert(!d.degraded);
	}
	ck_assert_int_eq(local_be.calls, 0);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_DEGRADED], 0);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_ERROR], 0);
	main_be.fail_kind = BACKEND_ERR_NONE;
	attrs_clear(&a);
}
END_TEST

/*
 * docs/leases.md: a lease is held for its key's window from when the call
 * left for the store (the store's stamp of its send; without one, the
 * submit), whatever kept the reply.  An answer at a time says the whole
 * milliseconds left then, and a lease with less than 1 ms left is not
 * held; a shadow rule's lease limits nothing and is not looked at.
 */
START_TEST(test_lease_counts_from_send)
{
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .cost = -1, .leases = true };
	struct decision d;
	int64_t sent, until, before, after;

	rules[0].algorithm = RL_ALG_CONCURRENCY;
	cfg.nrules = 1;
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	main_be.answer[0] = (struct rl_result){ .allowed = true };
	sent = util_monotonic_us() + 5000;
	main_be.sent_us = sent;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert_uint_eq(d.nleases, 1);
	until = sent + 60000 * 1000;
	ck_assert_int_eq(d.leases[0].held_until_us, until);
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], sent), 60000);
	/* A part of a millisecond counts whole: a reply within one gives
	 * the whole window. */
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], sent + 999), 60000);
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], sent + 1000),
	    59999);
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], sent + 300001),
	    59700);
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], until - 1000), 1);
	ck_assert(decide_leases_held(&d, until - 1000));
	/* Held is exact: less than 1000 us left is nothing left. */
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], until - 999), 1);
	ck_assert(!decide_leases_held(&d, until - 999));
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], until), 0);
	ck_assert_int_eq(decide_lease_left_ms(&d.leases[0], until + 5000), 0);
	decide_leases_free(&d);

	rules[0].shadow = true;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_uint_eq(d.nleases, 1);
	ck_assert(decide_leases_held(&d, until + 5000));
	decide_leases_free(&d);
	rules[0].shadow = false;

	/* No stamp: a store that decides inside the submit. */
	main_be.sent_us = 0;
	before = util_monotonic_us();
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	after = util_monotonic_us();
	ck_assert_uint_eq(d.nleases, 1);
	ck_assert_int_ge(d.leases[0].held_until_us, before + 60000 * 1000);
	ck_assert_int_le(d.leases[0].held_until_us, after + 60000 * 1000);
	decide_leases_free(&d);
	attrs_clear(&a);
}
END_TEST

/* The duration reported for each store call is the call's own, on a
 * store that answers inline too (it once was the machine's uptime on the
 * memory store: the start time was one only the Redis store set). */
static int64_t backend_usec[8];
static int backend_calls;

static void
on_backend(const char *name, int64_t usec, int64_t queued_usec,
    enum backend_error_kind kind, void *arg)
{
	(void)name;
	(void)queued_usec;
	(void)kind;
	(void)arg;
	if (backend_calls < 8)
		backend_usec[backend_calls] = usec;
	backend_calls++;
}

START_TEST(test_backend_duration_memory)
{
	struct backend *mem = backend_memory_new(1000, NULL, NULL);
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	int i;

	ck_assert_ptr_nonnull(mem);
	dec.backend = mem;
	dec.on_backend = on_backend;
	backend_calls = 0;
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(backend_calls, 3);
	for (i = 0; i < 3; i++) {
		ck_assert_int_ge(backend_usec[i], 0);
		ck_assert_int_lt(backend_usec[i], 1000000);
	}
	attrs_clear(&a);
	backend_free(mem);
}
END_TEST

/* docs/algorithms.md, "Taking quota in advance". */
static int64_t pf_units[2]; /* [0] taken, [1] used */

static void
on_prefetch(const struct rule *r, bool used, int64_t units, void *arg)
{
	(void)r;
	(void)arg;
	pf_units[used ? 1 : 0] += units;
}

/* The first request takes a chunk of 13 (L = 100: 1 + min(19, 99 / 8))
 * and reports the store's 87 plus the 12 now held; the next 12 are
 * answered in process with no store call, each reporting the store's 87
 * plus what is still held; the 14th asks again (1 + min(19, 86 / 8) =
 * 11) and reports the store's 76 plus the 10 held. */
START_TEST(test_prefetch_local)
{
	struct backend *mem = backend_memory_new(1000, NULL, NULL);
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	int i;

	ck_assert_ptr_nonnull(mem);
	dec.backend = mem;
	dec.on_backend = on_backend;
	dec.on_prefetch = on_prefetch;
	dec.prefetch = prefetch_new(16, cfg_ptr()->serial, NULL, NULL);
	backend_calls = 0;
	pf_units[0] = pf_units[1] = 0;
	rules[1].prefetch_units = 20;
	rules[1].prefetch_hold_ms = 60000;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert_int_eq(d.remaining, 87 + 12);
	ck_assert_int_eq(backend_calls, 1);
	ck_assert_int_eq(prefetch_held(dec.prefetch, "rl:global:{}", 12,
			     util_monotonic_us()),
	    12);
	for (i = 0; i < 12; i++) {
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
		ck_assert(d.allowed);
		ck_assert_int_eq(d.remaining, 87 + 11 - i);
		ck_assert_str_eq(d.rule->name, "global");
	}
	ck_assert_int_eq(backend_calls, 1);
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(backend_calls, 2);
	ck_assert_int_eq(d.remaining, 100 - 13 - 11 + 10);
	ck_assert_int_eq(pf_units[0], 12 + 10);
	ck_assert_int_eq(pf_units[1], 12);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_ALLOWED], 14);
	/* wait_ms never uses what is held */
	rq.wait_ms = 100;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(backend_calls, 3);
	prefetch_free(dec.prefetch);
	backend_free(mem);
}
END_TEST

/* On the memory store mem, rule global with prefetch (20, 1 minute): the
 * first request rq (of global alone) takes a chunk of 13, 12 held. */
static void
prefetch_first_chunk(struct backend *mem, const struct decide_request *rq)
{
	struct decision d;

	ck_assert_ptr_nonnull(mem);
	dec.backend = mem;
	dec.on_backend = on_backend;
	dec.prefetch = prefetch_new(16, cfg_ptr()->serial, NULL, NULL);
	backend_calls = 0;
	rules[1].prefetch_units = 20;
	rules[1].prefetch_hold_ms = 60000;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert_int_eq(backend_calls, 1);
	ck_assert_int_eq(prefetch_held(dec.prefetch, "rl:global:{}", 12,
			     util_monotonic_us()),
	    12);
}

/* A key whose limit an override changed is never answered from units
 * held under the rule's own limit (docs/admin.md): it goes to the store,
 * which answers under the override's limit. */
START_TEST(test_prefetch_not_under_override)
{
	struct backend *mem = backend_memory_new(1000, NULL, NULL);
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;

	dec.overrides = overrides_new();
	ck_assert_ptr_nonnull(dec.overrides);
	prefetch_first_chunk(mem, &rq);
	/* The override lowers the key's limit to 20: 13 are used already. */
	ck_assert_int_eq(overrides_set(dec.overrides, "rl:", "global", "", 0,
			     20, 60000, 0, 0),
	    0);
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(backend_calls, 2);
	ck_assert_int_eq(d.limit, 20);
	ck_assert_int_eq(d.remaining, 20 - 14);
	overrides_free(dec.overrides);
	dec.overrides = NULL;
	prefetch_free(dec.prefetch);
	backend_free(mem);
}
END_TEST

/* Units held are used only by a request they answer whole.  One that
 * also needs the store would be admitted only when the store answers, and
 * a hold may end meanwhile: it uses none.  Its prefetched check asks for
 * a chunk only when the key holds fewer units than its cost; else it is a
 * plain one, and the units held stay for whole requests (a chunk on every
 * such call was taken and left to expire).  Nor does a report use them
 * (/report answers what was overdrawn: the store's to say). */
START_TEST(test_prefetch_only_whole_requests)
{
	struct backend *mem = backend_memory_new(1000, NULL, NULL);
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	int i;

	prefetch_first_chunk(mem, &rq);
	/* login and watch go to the store, and so does global, plainly:
	 * 12 are held, the store counts 13 + i + 1. */
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	for (i = 0; i < 3; i++) {
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
		ck_assert(d.allowed);
		ck_assert_int_eq(backend_calls, 2 + i);
		ck_assert_int_eq(prefetch_held(dec.prefetch, "rl:global:{}", 12,
				     util_monotonic_us()),
		    12);
	}
	attrs_clear(&a);
	/* global alone: the 12 held answer 12 requests */
	for (i = 0; i < 12; i++) {
		ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
		ck_assert(d.allowed);
	}
	ck_assert_int_eq(backend_calls, 4);
	/* none held: a mixed request asks for a chunk of
	 * 1 + min(19, (100 - 16 - 1) / 8) = 11, 10 held */
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	ck_assert_int_eq(backend_calls, 5);
	ck_assert_int_eq(prefetch_held(dec.prefetch, "rl:global:{}", 12,
			     util_monotonic_us()),
	    10);
	attrs_clear(&a);
	/* A report of 3 on global alone: the store's. */
	rq.report = true;
	rq.cost = 3;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(backend_calls, 6);
	ck_assert_int_eq(prefetch_held(dec.prefetch, "rl:global:{}", 12,
			     util_monotonic_us()),
	    10);
	decide_leases_free(&d);
	prefetch_free(dec.prefetch);
	backend_free(mem);
}
END_TEST

/* All or nothing: a request that the held units would admit and another
 * rule denies uses none of them. */
START_TEST(test_prefetch_all_or_nothing)
{
	struct backend *mem = backend_memory_new(1000, NULL, NULL);
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	int64_t now;

	ck_assert_ptr_nonnull(mem);
	dec.backend = mem;
	dec.prefetch = prefetch_new(16, cfg_ptr()->serial, NULL, NULL);
	rules[1].prefetch_units = 20;
	rules[1].prefetch_hold_ms = 60000;
	rules[0].limit = 1;
	attrs_set(&a, "path", "/login");
	attrs_set(&a, "ip", "10.0.0.1");
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed);
	now = util_monotonic_us();
	ck_assert_int_eq(prefetch_held(dec.prefetch, "rl:global:{}", 12, now),
	    12);
	/* login (limit 1) denies in the store: global's unit goes back */
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(!d.allowed);
	ck_assert_str_eq(d.rule->name, "login");
	now = util_monotonic_us();
	ck_assert_int_eq(prefetch_held(dec.prefetch, "rl:global:{}", 12, now),
	    12);
	attrs_clear(&a);
	prefetch_free(dec.prefetch);
	backend_free(mem);
}
END_TEST

START_TEST(test_many_rules_heap_path)
{
	struct rule many[20];
	struct config c = cfg;
	struct attrs a = { 0 };
	struct decide_request rq = { .attrs = &a, .rule = NULL, .cost = -1 };
	struct decision d;
	char name[16];
	size_t i;

	for (i = 0; i < 20; i++) {
		memset(&many[i], 0, sizeof(many[i]));
		snprintf(name, sizeof(name), "r%zu", i);
		many[i].name = rl_strdup(name);
		many[i].limit = 10;
		many[i].window_ms = 1000;
		many[i].cost = 1;
	}
	c.rules = many;
	c.nrules = 20;
	main_be.answer[0] = (struct rl_result){ true, 9, 1000, 0, 0, 0, 0, 0 };
	ck_assert_int_eq(decide(&dec, &c, &rq, &d), 0);
	ck_assert_int_eq(main_be.calls, 1);
	ck_assert_str_eq(main_be.keys[3], "rl:r3:{}");
	for (i = 0; i < 20; i++)
		rule_free_contents(&many[i]);
}
END_TEST

/* Several attribute sets in one decision (gRPC descriptors): one call,
 * a rule and key shared by groups checked once with their costs added,
 * and each group told what its own rules did. */
/* An attribute that makes a key longer than 512 bytes. */
static const char *
big_ip(void)
{
	static char big[600];

	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	return big;
}

START_TEST(test_groups)
{
	struct attrs a[3] = { { 0 }, { 0 }, { 0 } };
	struct decide_group g[3] = { { &a[0], -1 }, { &a[1], 2 },
		{ &a[2], -1 } };
	struct decide_group_result gr[3];
	struct decide_request rq = {
		.cost = -1, .groups = g, .ngroups = 3, .group_out = gr
	};
	struct decision d;

	attrs_set(&a[0], "path", "/login");
	attrs_set(&a[0], "ip", "1.1.1.1");
	attrs_set(&a[1], "ip", "2.2.2.2"); /* global only */
	attrs_set(&a[2], "path", "/login");
	attrs_set(&a[2], "ip", "3.3.3.3");
	main_be.answer[0] = (struct rl_result){ false, 0, 9000, 4000, 0, 0, 0,
		0 };
	main_be.answer[1] = (struct rl_result){ true, 50, 60000, 0, 0, 0, 0,
		0 };
	main_be.answer[2] = (struct rl_result){ true, 4, 60000, 0, 0, 0, 0, 0 };
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_int_eq(main_be.calls, 1);
	ck_assert_uint_eq(main_be.n, 3);
	ck_assert_str_eq(main_be.keys[0], "rl:login:{1.1.1.1}");
	ck_assert_str_eq(main_be.keys[1], "rl:global:{}");
	ck_assert_str_eq(main_be.keys[2], "rl:login:{3.3.3.3}");
	ck_assert_int_eq(main_be.costs[0], 1);
	ck_assert_int_eq(main_be.costs[1], 1 + 2 + 1); /* shared */
	ck_assert_int_eq(main_be.costs[2], 1);
	ck_assert(!d.allowed);
	ck_assert_str_eq(d.rule->name, "login");
	ck_assert(!gr[0].allowed);
	ck_assert_str_eq(gr[0].rule->name, "login");
	ck_assert_int_eq(gr[0].retry_after_ms, 4000);
	ck_assert(gr[1].allowed);
	ck_assert_str_eq(gr[1].rule->name, "global");
	ck_assert_int_eq(gr[1].remaining, 50);
	ck_assert(gr[2].allowed);
	ck_assert_str_eq(gr[2].rule->name, "login"); /* least left */
	ck_assert_int_eq(gr[2].remaining, 4);
	ck_assert_int_eq(gr[2].limit, 5);
	ck_assert_int_eq(hook_calls[DECIDE_RULE_DENIED], 3);

	/* A group no rule applies to. */
	attrs_clear(&a[1]);
	attrs_set(&a[1], "path", "/login"); /* login needs ${ip} */
	cfg.nrules = 1;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert_ptr_null(gr[1].rule);
	ck_assert(gr[1].allowed);
	cfg.nrules = 3;

	/* The policy allows every group when the store fails. */
	main_be.fail = 1;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), 0);
	ck_assert(d.allowed && d.degraded);
	ck_assert(gr[0].allowed && gr[0].rule == NULL);
	main_be.fail = 0;

	/* Costs of one key added past its limit: refused, never sent. */
	attrs_set(&a[2], "ip", "1.1.1.1");
	g[0].cost = 3;
	g[2].cost = 3;
	main_be.calls = 0;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), -1);
	ck_assert_int_eq(d.status, DECIDE_COST_EXCEEDS_LIMIT);
	ck_assert_int_eq(main_be.calls, 0);
	ck_assert_uint_eq(d.failed_groups, 1u << 0 | 1u << 2);

	/* Every group a failure is true of is named, not the first only:
	 * group 0's cost over login's limit, group 2's key too long. */
	attrs_set(&a[2], "ip", big_ip());
	g[0].cost = 6;
	g[2].cost = -1;
	ck_assert_int_eq(decide(&dec, cfg_ptr(), &rq, &d), -1);
	ck_assert_uint_eq(d.failed_groups, 1u << 0 | 1u << 2);
	ck_assert_int_eq(main_be.calls, 0);
	attrs_clear(&a[0]);
	attrs_clear(&a[1]);
	attrs_clear(&a[2]);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("decide");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_applying_rules_and_keys);
	tcase_add_test(tc, test_jobs_used_again);
	tcase_add_test(tc, test_no_rule_applies);
	tcase_add_test(tc, test_denied_picks_largest_retry);
	tcase_add_test(tc, test_shadow_never_denies);
	tcase_add_test(tc, test_shadow_cost_over_limit);
	tcase_add_test(tc, test_forced_rule_and_cost);
	tcase_add_test(tc, test_validation_before_backend);
	tcase_add_test(tc, test_shadow_key_too_long);
	tcase_add_test(tc, test_policy_allow_deny_local);
	tcase_add_test(tc, test_caller_deadline_is_no_store_failure);
	tcase_add_test(tc, test_lease_counts_from_send);
	tcase_add_test(tc, test_many_rules_heap_path);
	tcase_add_test(tc, test_groups);
	tcase_add_test(tc, test_backend_duration_memory);
	tcase_add_test(tc, test_prefetch_local);
	tcase_add_test(tc, test_prefetch_not_under_override);
	tcase_add_test(tc, test_prefetch_all_or_nothing);
	tcase_add_test(tc, test_prefetch_only_whole_requests);
	suite_add_tcase(s, tc);
	return s;
}
