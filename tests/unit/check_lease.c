/*
 * check_lease.c - lease strings (src/core/lease.c) and the lease calls of
 * the concurrency algorithm (limiter_lease_release / _renew) and of the
 * memory store (BACKEND_LEASE_*), with an injected clock.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/backend.h"
#include "core/lease.h"
#include "core/limiter.h"
#include "base/util.h"
#include "store/memory.h"

START_TEST(test_token)
{
	char a[LEASE_TOKEN_LEN + 1], b[LEASE_TOKEN_LEN + 1];
	size_t i;

	ck_assert_int_eq(lease_token_new(a), 0);
	ck_assert_int_eq(lease_token_new(b), 0);
	ck_assert_uint_eq(strlen(a), LEASE_TOKEN_LEN);
	for (i = 0; i < LEASE_TOKEN_LEN; i++)
		ck_assert(strchr("0123456789abcdef", a[i]) != NULL);
	ck_assert_str_ne(a, b);
}
END_TEST

static struct lease_ref ref_any;

/* lease_parse of a C string. */
static int
P(const char *s)
{
	return lease_parse(s, strlen(s), &ref_any);
}

START_TEST(test_format_parse)
{
	const char *suffix = "lock:{night:ly}";
	const char *tok = "0123456789abcdef0123456789abcdef";
	struct lease_ref ref;
	char *s;

	s = lease_format(suffix, strlen(suffix), 3, tok);
	ck_assert_ptr_nonnull(s);
	ck_assert_int_eq(lease_parse(s, strlen(s), &ref), 0);
	ck_assert_str_eq(ref.suffix, suffix);
	ck_assert_uint_eq(ref.suffix_len, strlen(suffix));
	ck_assert_str_eq(ref.rule, "lock");
	ck_assert_int_eq(ref.cost, 3);
	ck_assert_str_eq(ref.token, tok);
	/* a digit short, a digit more, an upper-case digit, a bad cost */
	ck_assert_int_eq(lease_parse(s, strlen(s) - 1, &ref), -1);
	rl_free(s);
	s = lease_format(suffix, strlen(suffix), 3, tok);
	s[strlen(s) - 1] = 'F';
	ck_assert_int_eq(lease_parse(s, strlen(s), &ref), -1);
	rl_free(s);
	ck_assert_int_eq(P(""), -1);
	ck_assert_int_eq(P("x.1.0123456789abcdef0123456789abcdef"), -1);
	/* "a:{}" is fine; "a" (no key part) and "a b:{}" (a bad name) not */
	ck_assert_int_eq(P("613a7b7d.1.0123456789abcdef0123456789"
			   "abcdef"),
	    0);
	ck_assert_int_eq(P("61.1.0123456789abcdef0123456789abcdef"), -1);
	ck_assert_int_eq(P("6120623a7b7d.1.0123456789abcdef012345"
			   "6789abcdef"),
	    -1);
	ck_assert_int_eq(P("613a7b7d.0.0123456789abcdef0123456789"
			   "abcdef"),
	    -1);
	ck_assert_int_eq(P("613a7b7d.01.0123456789abcdef012345678"
			   "9abcdef"),
	    -1);
}
END_TEST

#define T1 "11111111111111111111111111111111"
#define T2 "22222222222222222222222222222222"

/* The check that releases a lease: its key and token laid out in one
 * buffer, the limit at least the cost. */
START_TEST(test_check_make)
{
	char tok[LEASE_TOKEN_LEN + 1], *l, buf[LEASE_KEY_CAP(3)];
	struct lease_ref ref;
	struct rl_check c;

	ck_assert_int_eq(lease_token_new(tok), 0);
	l = lease_format("jobs:{j1}", 9, 3, tok);
	ck_assert_ptr_nonnull(l);
	ck_assert_int_eq(lease_parse(l, strlen(l), &ref), 0);
	lease_check_make(&c, buf, "rl:", &ref, 10, 60000);
	ck_assert_int_eq(c.algorithm, RL_ALG_CONCURRENCY);
	ck_assert_uint_eq(c.keylen, 12);
	ck_assert(memcmp(c.key, "rl:jobs:{j1}", 12) == 0);
	ck_assert_str_eq(c.token, tok);
	ck_assert_int_eq(c.cost, 3);
	ck_assert_int_eq(c.limit, 10);
	ck_assert_int_eq(c.window_ms, 60000);
	/* A reload lowered the limit below the lease's cost. */
	lease_check_make(&c, buf, "rl:", &ref, 2, 1000);
	ck_assert_int_eq(c.limit, 3);
	rl_free(l);
}
END_TEST

START_TEST(test_limiter_release_renew)
{
	struct limiter_params p;
	struct limiter_state s;
	struct rl_result out;
	char err[128];

	ck_assert_int_eq(limiter_params_set(&p, RL_ALG_CONCURRENCY, 2, 1000,
			     err, sizeof(err)),
	    0);
	limiter_state_init(&s, RL_ALG_CONCURRENCY);
	p.token = T1;
	ck_assert_int_eq(limiter_take(&s, &p, 0, 1, &out, err, sizeof(err)), 0);
	p.token = T2;
	ck_assert_int_eq(limiter_take(&s, &p, 100000, 1, &out, err,
			     sizeof(err)),
	    0);
	ck_assert(out.allowed && out.remaining == 0);
	/* wrong cost, wrong token: nothing */
	ck_assert(!limiter_lease_release(&s, 200000, T1, 2));
	ck_assert(!limiter_lease_release(&s, 200000,
	    "33333333333333333333333333333333", 1));
	/* renew T1 at 0.9 s: it now outlives T2 */
	ck_assert(limiter_lease_renew(&s, &p, 900000, T1, 1));
	ck_assert_int_eq(limiter_expiry(&s, &p), 1900000);
	/* at 1.5 s, T2 has expired, T1 still held */
	ck_assert(!limiter_lease_release(&s, 1500000, T2, 1));
	ck_assert(!limiter_lease_renew(&s, &p, 1500000, T2, 1));
	p.token = T2;
	ck_assert_int_eq(limiter_take(&s, &p, 1500000, 1, &out, err,
			     sizeof(err)),
	    0);
	ck_assert(out.allowed && out.remaining == 0);
	ck_assert(limiter_lease_release(&s, 1500000, T1, 1));
	ck_assert(!limiter_lease_release(&s, 1500000, T1, 1));
	limiter_state_clear(&s);
}
END_TEST

static int64_t now_us;

static void
noop_done(struct backend_call *call)
{
	(void)call;
}

/* One lease call on the memory store: whether the lease was held. */
static bool
memory_lease(struct backend *b, enum backend_lease_op op, const char *tok,
    int64_t *expires_ms)
{
	struct rl_check c = {
		.algorithm = RL_ALG_CONCURRENCY,
		.limit = 1,
		.window_ms = 1000,
		.cost = 1,
		.key = "k",
		.keylen = 1,
		.token = tok,
	};
	struct rl_result out;
	struct backend_call call;

	memset(&call, 0, sizeof(call));
	call.checks = &c;
	call.n = 1;
	call.out = &out;
	call.lease_op = op;
	call.done = noop_done;
	backend_submit(b, &call);
	ck_assert_int_eq(call.rc, 0);
	if (expires_ms != NULL)
		*expires_ms = out.reset_ms;
	return out.allowed;
}

START_TEST(test_memory_store)
{
	struct backend *b = backend_memory_new(100, test_clock, &now_us);
	struct rl_check c = {
		.algorithm = RL_ALG_CONCURRENCY,
		.limit = 1,
		.window_ms = 1000,
		.cost = 1,
		.key = "k",
		.keylen = 1,
		.token = T1,
	};
	struct rl_result out;
	enum backend_error_kind kind;
	char err[128];
	bool all;
	int64_t exp = 0;

	ck_assert_ptr_nonnull(b);
	now_us = 1000000;
	ck_assert_int_eq(backend_decide(b, &c, 1, &out, &all, &kind, err,
			     sizeof(err)),
	    0);
	ck_assert(all);
	c.token = T2;
	ck_assert_int_eq(backend_decide(b, &c, 1, &out, &all, &kind, err,
			     sizeof(err)),
	    0);
	ck_assert(!all);
	ck_assert_int_eq(out.retry_after_ms, 1000);
	ck_assert(!memory_lease(b, BACKEND_LEASE_RELEASE, T2, NULL));
	now_us = 1500000;
	ck_assert(memory_lease(b, BACKEND_LEASE_RENEW, T1, &exp));
	ck_assert_int_eq(exp, 1000);
	now_us = 2200000; /* past the first window, not the renewed */
	ck_assert_int_eq(backend_decide(b, &c, 1, &out, &all, &kind, err,
			     sizeof(err)),
	    0);
	ck_assert(!all);
	ck_assert(memory_lease(b, BACKEND_LEASE_RELEASE, T1, NULL));
	ck_assert_uint_eq(backend_memory_key_count(b), 0);
	ck_assert_int_eq(backend_decide(b, &c, 1, &out, &all, &kind, err,
			     sizeof(err)),
	    0);
	ck_assert(all);
	now_us = 3200000; /* T2's lease expired */
	ck_assert(!memory_lease(b, BACKEND_LEASE_RENEW, T2, NULL));
	backend_free(b);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("lease");
	TCase *tc = tcase_create("lease");

	tcase_add_test(tc, test_token);
	tcase_add_test(tc, test_format_parse);
	tcase_add_test(tc, test_check_make);
	tcase_add_test(tc, test_limiter_release_renew);
	tcase_add_test(tc, test_memory_store);
	suite_add_tcase(s, tc);
	return s;
}
