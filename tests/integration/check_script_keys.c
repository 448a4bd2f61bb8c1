/*
 * check_script_keys.c - lua/ratelimit.lua on keys another algorithm left:
 * a reload that changes a rule's algorithm keeps the rule's keys, and the
 * new algorithm must start fresh on them (docs/algorithms.md, "Common
 * ground"), never fail the call.
 *
 * For every pair of algorithms (a, b), concurrency with two tokens
 * included: three requests of a on one key, then on the same key three
 * requests of b, a report and a waiting request (a report of sliding_log
 * when b is concurrency, which takes no report).  Every reply must be an
 * array: a script error here is a request answered by the failure policy
 * instead of the rule.  And b starts fresh: its requests see only their
 * own units.  The script runs at fixed times (script_time.h), so
 * the sequence is the same on every run.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "harness.h"
#include "script_time.h"

static const char *const algs[] = { "0", "1", "2", "3", "4:abc1", "4:777" };
#define NALGS (sizeof(algs) / sizeof(algs[0]))

/* EVAL at now on key of one request: count ("1", "1:r", "1:500000"),
 * then one check (alg, limit 5, window 10 s, cost 1).  Asserts an array
 * came back; returns the check's remaining. */
static long long
eval_one(int64_t now, const char *count, const char *alg, const char *what)
{
	redisContext *c = h_redis_ctx(&h_shared_redis);
	char *text = script_time_at(now);
	const char *argv[] = { "EVAL", text, "1", "rl:x:{k}", "1", count, alg,
		"5", "10000", "1", "0" };
	size_t argl[sizeof(argv) / sizeof(argv[0])], i;
	redisReply *rep;
	long long remaining;

	for (i = 0; i < sizeof(argv) / sizeof(argv[0]); i++)
		argl[i] = strlen(argv[i]);
	rep = redisCommandArgv(c, (int)(sizeof(argv) / sizeof(argv[0])), argv,
	    argl);
	free(text);
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_ARRAY, "%s: %s",
	    what,
	    rep == NULL			       ? c->errstr :
		rep->type == REDIS_REPLY_ERROR ? rep->str :
						 "not an array");
	ck_assert_msg(rep->elements >= 3 &&
		rep->element[2]->type == REDIS_REPLY_INTEGER,
	    "%s: no remaining", what);
	remaining = rep->element[2]->integer;
	freeReplyObject(rep);
	return remaining;
}

START_TEST(test_algorithm_changed)
{
	const char *a = algs[_i / NALGS], *b = algs[_i % NALGS];
	const int64_t t = 1712345678000000;
	char what[96];
	long long left;
	int i;

	h_shared_redis_flush();
	for (i = 0; i < 3; i++) {
		snprintf(what, sizeof(what), "%s, request %d", a, i + 1);
		eval_one(t + i * 1000, "1", a, what);
	}
	for (i = 0; i < 3; i++) {
		snprintf(what, sizeof(what), "%s then %s, request %d", a, b,
		    i + 1);
		left = eval_one(t + 5000 + i * 1000, "1", b, what);
		/* Fresh on another algorithm's state: 5 - (i + 1) left
		 * (the same algorithm, or the other lease token, goes on
		 * with what is there; "777:1" reads as a run). */
		if (strcmp(a, b) != 0 && a[0] != b[0] &&
		    strcmp(a, "4:777") != 0)
			ck_assert_msg(left == 5 - (i + 1),
			    "%s: %lld left, want %d", what, left, 5 - (i + 1));
	}
	snprintf(what, sizeof(what), "%s then %s, a report", a, b);
	eval_one(t + 9000, "1:r", b[0] == '4' ? "0" : b, what);
	snprintf(what, sizeof(what), "%s then %s, a wait", a, b);
	eval_one(t + 9500, "1:500000", b, what);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("script_keys");
	TCase *tc = tcase_create("keys");

	tcase_add_unchecked_fixture(tc, h_shared_redis_up, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_add_loop_test(tc, test_algorithm_changed, 0,
	    (int)(NALGS * NALGS));
	suite_add_tcase(s, tc);
	test_main_at_end(h_shared_redis_stop);
	return s;
}
