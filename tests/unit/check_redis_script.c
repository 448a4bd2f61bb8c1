/*
 * check_redis_script.c - lua/ratelimit.lua's and lua/stats.lua's calling
 * convention (src/store/redis_script.c), without a server: the exact
 * EVALSHA arguments a batch becomes (keys, "marks", the per-call counts
 * with a wait, the five numbers of each check, a concurrency check's
 * lease token; a batch of requests with the same checks, one rule's or
 * three rules', with their five numbers once, after "same", and what keeps
 * a batch from that), and the replies taken
 * back apart, including the ones that must be refused without touching any call
 * (an error reply such as NOSCRIPT, a wrong length, a negative number, a mark
 * that is no number).
 *
 * Replies are made by hiredis's own reader from RESP text, as the store
 * gets them.  What happens around these functions (SCRIPT LOAD on every
 * connection, EVAL after a NOSCRIPT) is the store's, tested against a real
 * redis-server by check_backend_redis and the integration tests.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "check_main.h"

#include "base/util.h"
#include "store/redis_script.h"

#define SHA   "e0e1f9fabfc9d4800c877a703b823ac0578ff831"
#define TOKEN "0123456789abcdef0123456789abcdef"

static char err[256];

/* A reply as hiredis reads it from text (RESP).  Free with
 * freeReplyObject(). */
static redisReply *
resp(const char *text)
{
	redisReader *rd = redisReaderCreate();
	void *r = NULL;

	ck_assert_ptr_nonnull(rd);
	ck_assert_int_eq(redisReaderFeed(rd, text, strlen(text)), REDIS_OK);
	ck_assert_int_eq(redisReaderGetReply(rd, &r), REDIS_OK);
	ck_assert_msg(r != NULL, "incomplete RESP: %s", text);
	redisReaderFree(rd);
	return r;
}

/* The arguments are exactly want[0..n-1] (C strings; lens included). */
static void
expect_args(const struct redis_script_args *a, const char *const *want, int n)
{
	int i;

	ck_assert_int_eq(a->argc, n);
	for (i = 0; i < n; i++) {
		ck_assert_msg(a->lens[i] == strlen(want[i]) &&
			memcmp(a->argv[i], want[i], a->lens[i]) == 0,
		    "argument %d is \"%.*s\" (%zu bytes), want \"%s\"", i,
		    (int)a->lens[i], a->argv[i], a->lens[i], want[i]);
	}
}

/* --- a batch into EVALSHA --------------------------------------------- */

static const struct rl_check batch_a[2] = {
	{ RL_ALG_SLIDING_LOG, 10, 1000, 1, false, "rl:a:{x}", 8, NULL, 0, 0 },
	{ RL_ALG_TOKEN_BUCKET, 5, 60000, 2, true, "rl:b", 4, NULL, 0, 0 },
};
static const struct rl_check batch_b[1] = {
	{ RL_ALG_FIXED_WINDOW, 100, 1000, 0, false, "k3", 2, NULL, 0, 0 },
};

static void
two_calls(struct backend_call *a, struct backend_call *b,
    struct backend_call *calls[2])
{
	memset(a, 0, sizeof(*a));
	memset(b, 0, sizeof(*b));
	a->checks = batch_a;
	a->n = 2;
	b->checks = batch_b;
	b->n = 1;
	calls[0] = a;
	calls[1] = b;
}

START_TEST(test_encode_batch)
{
	static const char *const want[] = {
		"EVALSHA", SHA, "3", "rl:a:{x}", "rl:b", "k3",
		"2",			      /* R: two requests */
		"2", "1",		      /* their check counts */
		"0", "10", "1000", "1", "0",  /* sliding_log */
		"3", "5", "60000", "2", "1",  /* token_bucket, shadow */
		"2", "100", "1000", "0", "0", /* fixed_window, cost 0 */
	};
	struct backend_call a, b, *calls[2];
	struct redis_script_args args;

	two_calls(&a, &b, calls);
	ck_assert_int_eq(redis_script_encode(calls, 2, SHA, false, &args), 0);
	expect_args(&args, want, (int)(sizeof(want) / sizeof(want[0])));
	/* The SHA and the keys are borrowed, not copied. */
	ck_assert_ptr_eq(args.argv[3], batch_a[0].key);
	redis_script_args_free(&args);
	ck_assert_ptr_null(args.argv);
}
END_TEST

START_TEST(test_encode_marks)
{
	static const char *const want[] = {
		"EVALSHA",
		SHA,
		"3",
		"rl:a:{x}",
		"rl:b",
		"k3",
		"marks",
		"2",
		"2",
		"1",
		"0",
		"10",
		"1000",
		"1",
		"0",
		"3",
		"5",
		"60000",
		"2",
		"1",
		"2",
		"100",
		"1000",
		"0",
		"0",
	};
	struct backend_call a, b, *calls[2];
	struct redis_script_args args;

	two_calls(&a, &b, calls);
	ck_assert_int_eq(redis_script_encode(calls, 2, SHA, true, &args), 0);
	expect_args(&args, want, (int)(sizeof(want) / sizeof(want[0])));
	redis_script_args_free(&args);
}
END_TEST

START_TEST(test_encode_wait_and_lease)
{
	/* A waiting call's count is "<n>:<wait_us>" (docs/waiting.md); a
	 * concurrency check's algorithm is "4:<token>" (docs/leases.md),
	 * the token cut at 32 characters, "4" without one (a look). */
	static const struct rl_check checks[3] = {
		{ RL_ALG_CONCURRENCY, 3, 30000, 1, false, "c:1", 3, TOKEN, 0,
		    0 },
		{ RL_ALG_CONCURRENCY, 3, 30000, 1, false, "c:2", 3,
		    TOKEN "ffff", 0, 0 },
		{ RL_ALG_CONCURRENCY, 3, 30000, 1, false, "c:3", 3, NULL, 0,
		    0 },
	};
	static const char *const want[] = {
		"EVALSHA",
		SHA,
		"3",
		"c:1",
		"c:2",
		"c:3",
		"1",
		"3:250000",
		"4:" TOKEN,
		"3",
		"30000",
		"1",
		"0",
		"4:" TOKEN,
		"3",
		"30000",
		"1",
		"0",
		"4",
		"3",
		"30000",
		"1",
		"0",
	};
	struct backend_call call, *calls[1] = { &call };
	struct redis_script_args args;

	memset(&call, 0, sizeof(call));
	call.checks = checks;
	call.n = 3;
	call.wait_us = 250000;
	ck_assert_int_eq(redis_script_encode(calls, 1, SHA, false, &args), 0);
	expect_args(&args, want, (int)(sizeof(want) / sizeof(want[0])));
	redis_script_args_free(&args);
}
END_TEST

START_TEST(test_encode_numbers_and_keys)
{
	/* Keys go by length (a NUL inside stays); the largest int64 is
	 * written in full; a negative number, which no caller passes,
	 * becomes 0 rather than a '-' the script would refuse. */
	static const struct rl_check checks[1] = {
		{ RL_ALG_SLIDING_WINDOW, INT64_MAX, 1, -5, false, "a\0b", 3,
		    NULL, 0, 0 },
	};
	struct backend_call call, *calls[1] = { &call };
	struct redis_script_args args;

	memset(&call, 0, sizeof(call));
	call.checks = checks;
	call.n = 1;
	ck_assert_int_eq(redis_script_encode(calls, 1, SHA, false, &args), 0);
	ck_assert_int_eq(args.argc, 3 + 1 + 1 + 1 + 5);
	ck_assert_uint_eq(args.lens[3], 3);
	ck_assert_int_eq(memcmp(args.argv[3], "a\0b", 3), 0);
	ck_assert_str_eq(args.argv[6], "1");
	ck_assert_str_eq(args.argv[7], "9223372036854775807");
	ck_assert_uint_eq(args.lens[7], 19);
	ck_assert_str_eq(args.argv[8], "1");
	ck_assert_str_eq(args.argv[9], "0");
	redis_script_args_free(&args);
}
END_TEST

/* Three calls of one sliding_log check each, on keys "s:0".. "s:2", with
 * limit 10, window 1000 and cost 2 unless a test changes one. */
struct same_batch {
	struct rl_check checks[3];
	struct backend_call call[3], *calls[3];
};

static void
same_batch_init(struct same_batch *sb)
{
	static const char *const keys[3] = { "s:0", "s:1", "s:2" };
	size_t i;

	memset(sb, 0, sizeof(*sb));
	for (i = 0; i < 3; i++) {
		sb->checks[i] = (struct rl_check){ RL_ALG_SLIDING_LOG, 10, 1000,
			2, false, keys[i], 3, NULL, 0, 0 };
		sb->call[i].checks = &sb->checks[i];
		sb->call[i].n = 1;
		sb->calls[i] = &sb->call[i];
	}
}

START_TEST(test_encode_same)
{
	/* One rule's batch: its five values once, after 'same' and the count
	 * of checks (and after 'marks'), each key a request. */
	static const char *const want[] = { "EVALSHA", SHA, "3", "s:0", "s:1",
		"s:2", "same", "1", "0", "10", "1000", "2", "0" };
	static const char *const want_marks[] = { "EVALSHA", SHA, "3", "s:0",
		"s:1", "s:2", "marks", "same", "1", "0", "10", "1000", "2",
		"0" };
	struct same_batch sb;
	struct redis_script_args args;

	same_batch_init(&sb);
	ck_assert_int_eq(redis_script_encode(sb.calls, 3, SHA, false, &args),
	    0);
	expect_args(&args, want, (int)(sizeof(want) / sizeof(want[0])));
	ck_assert_ptr_eq(args.argv[4], sb.checks[1].key);
	redis_script_args_free(&args);
	ck_assert_int_eq(redis_script_encode(sb.calls, 3, SHA, true, &args), 0);
	expect_args(&args, want_marks,
	    (int)(sizeof(want_marks) / sizeof(want_marks[0])));
	redis_script_args_free(&args);
	/* A batch this small fits the arguments' own block: no allocation,
	 * so it encodes even when none can be made. */
	rl_alloc_fail_after(0);
	ck_assert_int_eq(redis_script_encode(sb.calls, 3, SHA, false, &args),
	    0);
	rl_alloc_fail_after(-1);
	expect_args(&args, want, (int)(sizeof(want) / sizeof(want[0])));
	redis_script_args_free(&args);
}
END_TEST

START_TEST(test_encode_same_three)
{
	/* Requests of three rules (bench/speed.sh's row (e)): the three
	 * checks' values once, every request's three keys.  A request whose
	 * checks repeat a key, or whose check at one place differs, keeps
	 * the batch from the form. */
	static const char *const keys[2][3] = { { "a:0", "b:0", "c" },
		{ "a:1", "b:1", "c" } };
	static const char *const want[] = { "EVALSHA", SHA, "6", "a:0", "b:0",
		"c", "a:1", "b:1", "c", "same", "3", "0", "10", "1000", "1",
		"0", "2", "20", "1000", "1", "0", "3", "30", "60000", "1",
		"0" };
	struct rl_check checks[2][3];
	struct backend_call call[2], *calls[2] = { &call[0], &call[1] };
	struct redis_script_args args;
	size_t i, j;
	int how;

	for (how = 0; how < 4; how++) {
		memset(call, 0, sizeof(call));
		for (i = 0; i < 2; i++) {
			for (j = 0; j < 3; j++)
				checks[i][j] = (struct rl_check){ j == 0 ?
					    RL_ALG_SLIDING_LOG :
					    j == 1 ? RL_ALG_FIXED_WINDOW :
						     RL_ALG_TOKEN_BUCKET,
					10 * (int64_t)(j + 1),
					j == 2 ? 60000 : 1000, 1, false,
					keys[i][j], strlen(keys[i][j]), NULL, 0,
					0 };
			call[i].checks = checks[i];
			call[i].n = 3;
		}
		if (how == 1) /* a:1 twice in the second request */
			checks[1][1].key = "a:1";
		if (how == 2) /* another window at the second place */
			checks[1][1].window_ms = 2000;
		if (how == 3) /* sliding_window: not one lean_request() takes */
			checks[0][1].algorithm = checks[1][1].algorithm =
			    RL_ALG_SLIDING_WINDOW;
		ck_assert_int_eq(redis_script_encode(calls, 2, SHA, false,
				     &args),
		    0);
		if (how == 0)
			expect_args(&args, want,
			    (int)(sizeof(want) / sizeof(want[0])));
		else
			ck_assert_msg(strcmp(args.argv[9], "same") != 0 &&
				args.argc == 3 + 6 + 1 + 2 + 30,
			    "case %d: argument 9 is %s, %d arguments", how,
			    args.argv[9], args.argc);
		redis_script_args_free(&args);
	}
}
END_TEST

START_TEST(test_encode_not_same)
{
	/* Any call that differs sends five values per check: the last one
	 * with another limit, window, cost or algorithm, shadow, waiting, a
	 * report, taking a chunk, or of two checks. */
	static const char *const want[] = { "EVALSHA", SHA, "3", "s:0", "s:1",
		"s:2", "3", "1", "1", "1", "0", "10", "1000", "2", "0", "0",
		"10", "1000", "2", "0", "0", "10", "1000", "3", "0" };
	struct same_batch sb;
	struct redis_script_args args;
	int how;

	same_batch_init(&sb);
	sb.checks[2].cost = 3;
	ck_assert_int_eq(redis_script_encode(sb.calls, 3, SHA, false, &args),
	    0);
	expect_args(&args, want, (int)(sizeof(want) / sizeof(want[0])));
	redis_script_args_free(&args);
	for (how = 0; how < 8; how++) {
		same_batch_init(&sb);
		switch (how) {
		case 0:
			sb.checks[2].limit = 11;
			break;
		case 1:
			sb.checks[2].window_ms = 2000;
			break;
		case 2:
			sb.checks[2].algorithm = RL_ALG_FIXED_WINDOW;
			break;
		case 3:
			sb.checks[2].shadow = true;
			break;
		case 4:
			sb.call[2].wait_us = 1000;
			break;
		case 5:
			sb.call[2].report = true;
			break;
		case 6:
			sb.checks[2].prefetch_want = 5;
			sb.checks[2].prefetch_hold_us = 1000;
			break;
		case 7:
			sb.call[1].n = 2; /* s:1 and s:2 */
			sb.calls[2] = NULL;
			break;
		}
		ck_assert_int_eq(redis_script_encode(sb.calls, how == 7 ? 2 : 3,
				     SHA, false, &args),
		    0);
		ck_assert_msg(args.argc > 6 &&
			strcmp(args.argv[6], "same") != 0,
		    "case %d went as 'same'", how);
		ck_assert_int_eq(args.argc,
		    3 + 3 + (how == 6 ? 1 : 0) + 1 + (how == 7 ? 2 : 3) + 15);
		redis_script_args_free(&args);
	}
}
END_TEST

START_TEST(test_encode_refused)
{
	struct backend_call a, b, *calls[2];
	struct redis_script_args args;
	int rc;

	two_calls(&a, &b, calls);
	ck_assert_int_eq(redis_script_encode(calls, 0, SHA, false, &args), -1);
	/* Two requests fit the arguments' own block: encoded without an
	 * allocation. */
	rl_alloc_fail_after(0);
	rc = redis_script_encode(calls, 2, SHA, false, &args);
	rl_alloc_fail_after(-1);
	ck_assert_int_eq(rc, 0);
	ck_assert_str_eq(args.argv[6], "2");
	redis_script_args_free(&args);
}
END_TEST

/* Batches too large for the arguments' own block: LARGE_N calls of one
 * sliding_log check each, all alike ('same' form) or with costs 1 and 2
 * in turn (one value set per request).  Their block is allocated: refused
 * when it cannot be, whole when it can. */
#define LARGE_N 400

START_TEST(test_encode_large)
{
	static struct rl_check checks[LARGE_N];
	static struct backend_call call[LARGE_N], *calls[LARGE_N];
	static char keys[LARGE_N][16];
	struct redis_script_args args;
	size_t i, same;

	for (same = 0; same < 2; same++) {
		for (i = 0; i < LARGE_N; i++) {
			snprintf(keys[i], sizeof(keys[i]), "s:%zu", i);
			checks[i] = (struct rl_check){ RL_ALG_SLIDING_LOG, 10,
				1000, same ? 2 : 1 + (int64_t)(i % 2), false,
				keys[i], strlen(keys[i]), NULL, 0, 0 };
			memset(&call[i], 0, sizeof(call[i]));
			call[i].checks = &checks[i];
			call[i].n = 1;
			calls[i] = &call[i];
		}
		rl_alloc_fail_after(0);
		ck_assert_int_eq(redis_script_encode(calls, LARGE_N, SHA, false,
				     &args),
		    -1);
		rl_alloc_fail_after(-1);
		ck_assert_int_eq(redis_script_encode(calls, LARGE_N, SHA, false,
				     &args),
		    0);
		ck_assert_int_eq(args.argc,
		    same ? 3 + LARGE_N + 7 : 3 + LARGE_N + 1 + 6 * LARGE_N);
		for (i = 0; i < LARGE_N; i++)
			ck_assert_ptr_eq(args.argv[3 + i], keys[i]);
		if (same) {
			ck_assert_str_eq(args.argv[3 + LARGE_N], "same");
			ck_assert_str_eq(args.argv[3 + LARGE_N + 3], "10");
		} else {
			/* R, then the counts, then the last request's
			 * cost (i = LARGE_N - 1, odd: 2). */
			ck_assert_str_eq(args.argv[3 + LARGE_N], "400");
			ck_assert_str_eq(args.argv[args.argc - 2], "2");
		}
		redis_script_args_free(&args);
	}
}
END_TEST

/* --- the reply back into the calls ------------------------------------ */

/* Two calls (2 checks and 1) with out[] filled with a sentinel, to see
 * what decode touched. */
struct decoded {
	struct backend_call a, b, *calls[2];
	struct rl_result out_a[2], out_b[1];
};

static void
decoded_init(struct decoded *d)
{
	size_t i;

	memset(d, 0, sizeof(*d));
	two_calls(&d->a, &d->b, d->calls);
	d->a.out = d->out_a;
	d->b.out = d->out_b;
	for (i = 0; i < 2; i++)
		d->out_a[i].remaining = -7;
	d->out_b[0].remaining = -7;
	d->a.waited_us = d->b.waited_us = -7;
}

static const size_t counts[2] = { 2, 1 };

/* Call a: all allowed; check 1 allowed (9 left, a unit back in 100 ms),
 * check 2 (the shadow one) denied for 400 ms.  Call b: admitted by a
 * reservation 250 ms away. */
#define REPLY_OK \
	"*17\r\n" \
	":1\r\n" \
	":1\r\n:9\r\n:1000\r\n:0\r\n:100\r\n" \
	":0\r\n:0\r\n:12000\r\n:400\r\n:400\r\n" \
	":250001\r\n" \
	":1\r\n:99\r\n:1000\r\n:0\r\n:10\r\n"

START_TEST(test_decode)
{
	redisReply *r = resp(REPLY_OK);
	struct decoded d;

	decoded_init(&d);
	ck_assert_int_eq(redis_script_decode(r, d.calls, counts, 2, false, err,
			     sizeof(err)),
	    0);
	ck_assert(d.a.all_allowed);
	ck_assert_int_eq(d.a.waited_us, 0);
	ck_assert(d.out_a[0].allowed);
	ck_assert_int_eq(d.out_a[0].remaining, 9);
	ck_assert_int_eq(d.out_a[0].reset_ms, 1000);
	ck_assert_int_eq(d.out_a[0].retry_after_ms, 0);
	ck_assert_int_eq(d.out_a[0].effective_ms, 100);
	ck_assert(!d.out_a[1].allowed);
	ck_assert_int_eq(d.out_a[1].remaining, 0);
	ck_assert_int_eq(d.out_a[1].reset_ms, 12000);
	ck_assert_int_eq(d.out_a[1].retry_after_ms, 400);
	ck_assert(d.b.all_allowed);
	ck_assert_int_eq(d.b.waited_us, 250000);
	ck_assert(d.out_b[0].allowed);
	ck_assert_int_eq(d.out_b[0].remaining, 99);
	ck_assert_int_eq(d.out_b[0].effective_ms, 10);
	ck_assert(d.out_a[0].mark == 0 && d.out_b[0].mark == 0);
	freeReplyObject(r);

	/* A denied call: first element 0. */
	r = resp("*6\r\n:0\r\n:0\r\n:0\r\n:700\r\n:700\r\n:700\r\n");
	decoded_init(&d);
	d.a.all_allowed = true;
	ck_assert_int_eq(redis_script_decode(r, &d.calls[1], &counts[1], 1,
			     false, err, sizeof(err)),
	    0);
	ck_assert(!d.b.all_allowed);
	ck_assert_int_eq(d.b.waited_us, 0);
	ck_assert_int_eq(d.out_b[0].retry_after_ms, 700);
	freeReplyObject(r);
}
END_TEST

START_TEST(test_decode_skips_answered)
{
	/* A NULL call was answered already: its part is skipped, the
	 * next call still gets its own part. */
	redisReply *r = resp(REPLY_OK);
	struct decoded d;

	decoded_init(&d);
	d.calls[0] = NULL;
	ck_assert_int_eq(redis_script_decode(r, d.calls, counts, 2, false, err,
			     sizeof(err)),
	    0);
	ck_assert_int_eq(d.out_a[0].remaining, -7);
	ck_assert_int_eq(d.a.waited_us, -7);
	ck_assert_int_eq(d.out_b[0].remaining, 99);
	ck_assert_int_eq(d.b.waited_us, 250000);
	freeReplyObject(r);
}
END_TEST

START_TEST(test_decode_marks)
{
	/* With marks each check has a sixth field: where it recorded, a
	 * string (a double for token_bucket). */
	redisReply *r = resp(
	    "*13\r\n:1\r\n"
	    ":1\r\n:9\r\n:1000\r\n:0\r\n:100\r\n$13\r\n1700000000123\r\n"
	    ":1\r\n:3\r\n:60000\r\n:0\r\n:20000\r\n$4\r\n12.5\r\n");
	struct decoded d;

	decoded_init(&d);
	ck_assert_int_eq(redis_script_decode(r, d.calls, counts, 1, true, err,
			     sizeof(err)),
	    0);
	ck_assert(d.a.all_allowed);
	ck_assert(d.out_a[0].mark == 1700000000123.0);
	ck_assert(d.out_a[1].mark == 12.5);
	ck_assert_int_eq(d.out_a[1].remaining, 3);
	ck_assert_int_eq(d.out_a[1].effective_ms, 20000);
	freeReplyObject(r);
}
END_TEST

START_TEST(test_decode_chunks)
{
	/* With 'chunks' (docs/algorithms.md, "Taking quota in advance")
	 * each check has two more fields, after the mark: the units taken
	 * and how long they may be used.  The length tells. */
	redisReply *r = resp(
	    "*17\r\n:1\r\n"
	    ":1\r\n:87\r\n:1100\r\n:0\r\n:1100\r\n$6\r\n100000\r\n"
	    ":13\r\n:100000\r\n"
	    ":1\r\n:3\r\n:60000\r\n:0\r\n:20000\r\n$1\r\n0\r\n"
	    ":0\r\n:0\r\n");
	struct decoded d;

	decoded_init(&d);
	ck_assert_int_eq(redis_script_decode(r, d.calls, counts, 1, true, err,
			     sizeof(err)),
	    0);
	ck_assert(d.out_a[0].mark == 100000.0);
	ck_assert_int_eq(d.out_a[0].taken, 13);
	ck_assert_int_eq(d.out_a[0].taken_us, 100000);
	ck_assert_int_eq(d.out_a[1].taken, 0);
	ck_assert_int_eq(d.out_a[1].remaining, 3);
	freeReplyObject(r);
	/* a chunk field that is a string, as a mark would be */
	r = resp(
	    "*17\r\n:1\r\n"
	    ":1\r\n:87\r\n:1100\r\n:0\r\n:1100\r\n$1\r\n1\r\n"
	    "$2\r\n13\r\n:100000\r\n"
	    ":1\r\n:3\r\n:60000\r\n:0\r\n:20000\r\n$1\r\n0\r\n"
	    ":0\r\n:0\r\n");
	ck_assert_int_eq(redis_script_decode(r, d.calls, counts, 1, true, err,
			     sizeof(err)),
	    -1);
	ck_assert_str_eq(err,
	    "script: element 7 is not a non-negative integer");
	freeReplyObject(r);
}
END_TEST

START_TEST(test_encode_chunks)
{
	/* A check asking for a chunk: 'chunks', and its algorithm written
	 * "<alg>+<want>+<hold_us>"; a cost 0 check never asks. */
	static const struct rl_check checks[2] = {
		{ RL_ALG_TOKEN_BUCKET, 100, 1000, 2, false, "a", 1, NULL, 50,
		    20000 },
		{ RL_ALG_SLIDING_LOG, 100, 1000, 0, false, "b", 1, NULL, 50,
		    20000 },
	};
	static const char *const want[] = { "EVALSHA", SHA, "2", "a", "b",
		"chunks", "1", "2", "3+50+20000", "100", "1000", "2", "0", "0",
		"100", "1000", "0", "0" };
	struct backend_call call, *calls[1] = { &call };
	struct redis_script_args args;

	memset(&call, 0, sizeof(call));
	call.checks = checks;
	call.n = 2;
	ck_assert_int_eq(redis_script_encode(calls, 1, SHA, false, &args), 0);
	expect_args(&args, want, (int)(sizeof(want) / sizeof(want[0])));
	redis_script_args_free(&args);
}
END_TEST

/* Every bad reply fails with exactly this message and touches no call. */
static void
decode_bad(const char *text, size_t first, size_t ncalls, bool marks,
    const char *want)
{
	redisReply *r = resp(text);
	struct decoded d;

	decoded_init(&d);
	err[0] = '\0';
	ck_assert_int_eq(redis_script_decode(r, d.calls + first, counts + first,
			     ncalls, marks, err, sizeof(err)),
	    -1);
	ck_assert_str_eq(err, want);
	ck_assert_int_eq(d.out_a[0].remaining, -7);
	ck_assert_int_eq(d.out_b[0].remaining, -7);
	ck_assert_int_eq(d.a.waited_us, -7);
	ck_assert_int_eq(d.b.waited_us, -7);
	ck_assert(!d.a.all_allowed && !d.b.all_allowed);
	freeReplyObject(r);
}

START_TEST(test_decode_refused)
{
	/* The error the store answers with EVAL instead. */
	decode_bad("-NOSCRIPT No matching script. Please use EVAL.\r\n", 0, 2,
	    false, "script: NOSCRIPT No matching script. Please use EVAL.");
	decode_bad("-ERR user_script:1: oops\r\n", 0, 2, false,
	    "script: ERR user_script:1: oops");
	decode_bad("*3\r\n:1\r\n:1\r\n:1\r\n", 0, 2, false,
	    "script: unexpected reply (type 2, 3 elements, expected 17)");
	decode_bad(":1\r\n", 0, 2, false,
	    "script: unexpected reply (type 3, 0 elements, expected 17)");
	/* The reply of a batch without marks, read as one with them. */
	decode_bad(REPLY_OK, 0, 2, true,
	    "script: unexpected reply (type 2, 17 elements, expected 20)");
	decode_bad("*6\r\n:1\r\n:1\r\n:-1\r\n:1000\r\n:0\r\n:0\r\n", 1, 1,
	    false, "script: element 2 is not a non-negative integer");
	decode_bad("*6\r\n:1\r\n:1\r\n$1\r\n9\r\n:1000\r\n:0\r\n:0\r\n", 1, 1,
	    false, "script: element 2 is not a non-negative integer");
	decode_bad("*6\r\n:1\r\n:1\r\n$-1\r\n:1000\r\n:0\r\n:0\r\n", 1, 1,
	    false, "script: element 2 is not a non-negative integer");
	decode_bad(
	    "*13\r\n:1\r\n"
	    ":1\r\n:9\r\n:1000\r\n:0\r\n:0\r\n$3\r\n1.5\r\n"
	    ":1\r\n:3\r\n:60000\r\n:0\r\n:0\r\n$2\r\n1x\r\n",
	    0, 1, true, "script: a mark is not a number");
	decode_bad(
	    "*13\r\n:1\r\n"
	    ":1\r\n:9\r\n:1000\r\n:0\r\n:0\r\n$0\r\n\r\n"
	    ":1\r\n:3\r\n:60000\r\n:0\r\n:0\r\n$1\r\n1\r\n",
	    0, 1, true, "script: a mark is not a number");
	decode_bad(
	    "*13\r\n:1\r\n"
	    ":1\r\n:9\r\n:1000\r\n:0\r\n:0\r\n:5\r\n"
	    ":1\r\n:3\r\n:60000\r\n:0\r\n:0\r\n$1\r\n1\r\n",
	    0, 1, true, "script: a mark is not a number");
}
END_TEST

/* --- stats.lua ---------------------------------------------------------- */

static const double quantiles[2] = { 0.5, 0.99 };

static void
stat_op(struct rl_stat_op *op, bool record)
{
	memset(op, 0, sizeof(*op));
	op->key = "rl:stat:lat:{x}";
	op->keylen = strlen(op->key);
	op->window_ms = 60000;
	op->resolution_ms = 1000;
	op->accuracy = 0.01;
	op->record = record;
	op->value = 12.5;
	op->quantiles = quantiles;
	op->nquantiles = 2;
}

static void
expect_stats_args(const struct redis_stats_args *a, const char *const *want,
    int n)
{
	int i;

	ck_assert_int_eq(a->argc, n);
	for (i = 0; i < n; i++)
		ck_assert_msg(a->lens[i] == strlen(want[i]) &&
			memcmp(a->argv[i], want[i], a->lens[i]) == 0,
		    "argument %d is \"%.*s\", want \"%s\"", i, (int)a->lens[i],
		    a->argv[i], want[i]);
}

START_TEST(test_stats_encode)
{
	static const char *const want_sha[] = {
		"EVALSHA",
		SHA,
		"1",
		"rl:stat:lat:{x}",
		"60000",
		"1000",
		"0.01",
		"1",
		"12.5",
		"0.5",
		"0.98999999999999999",
	};
	/* A read sends 0 for the value whatever it holds; EVAL carries
	 * the script's text instead of its SHA. */
	static const char *const want_eval[] = {
		"EVAL",
		"return 1",
		"1",
		"rl:stat:lat:{x}",
		"60000",
		"1000",
		"0.01",
		"0",
		"0",
		"0.5",
		"0.98999999999999999",
	};
	struct redis_stats_args a;
	struct rl_stat_op op;

	stat_op(&op, true);
	ck_assert_int_eq(redis_stats_encode(&op, NULL, SHA, &a), 0);
	expect_stats_args(&a, want_sha, 11);
	redis_stats_args_free(&a);
	ck_assert_ptr_null(a.argv);
	ck_assert_int_eq(a.argc, 0);

	stat_op(&op, false);
	ck_assert_int_eq(redis_stats_encode(&op, "return 1", SHA, &a), 0);
	expect_stats_args(&a, want_eval, 11);
	redis_stats_args_free(&a);

	rl_alloc_fail_after(0);
	ck_assert_int_eq(redis_stats_encode(&op, NULL, SHA, &a), -1);
	rl_alloc_fail_after(-1);
	ck_assert_ptr_null(a.argv);
}
END_TEST

START_TEST(test_stats_decode)
{
	struct rl_stat_result res;
	struct rl_stat_op op;
	redisReply *r;

	stat_op(&op, true);
	r = resp(
	    "*6\r\n$1\r\n3\r\n$4\r\n37.5\r\n$3\r\n2.5\r\n$2\r\n20\r\n"
	    "$4\r\n12.5\r\n$2\r\n20\r\n");
	memset(&res, 0xff, sizeof(res));
	ck_assert_int_eq(redis_stats_decode(r, &op, &res, err, sizeof(err)), 0);
	ck_assert_uint_eq(res.count, 3);
	ck_assert(res.sum == 37.5 && res.min == 2.5 && res.max == 20);
	ck_assert(res.q[0] == 12.5 && res.q[1] == 20);
	ck_assert(res.q[2] == 0);
	freeReplyObject(r);

	/* An empty window is one element, and every other field 0. */
	r = resp("*1\r\n$1\r\n0\r\n");
	memset(&res, 0xff, sizeof(res));
	ck_assert_int_eq(redis_stats_decode(r, &op, &res, err, sizeof(err)), 0);
	ck_assert_uint_eq(res.count, 0);
	ck_assert(res.sum == 0 && res.min == 0 && res.max == 0 &&
	    res.q[0] == 0);
	freeReplyObject(r);
}
END_TEST

START_TEST(test_stats_decode_refused)
{
	static const char *const bad[] = {
		"*1\r\n$2\r\n-1\r\n", /* negative count */
		"*1\r\n:3\r\n",	      /* not a string */
		"*0\r\n",	      /* nothing */
		"$1\r\n3\r\n",	      /* not an array */
		/* count 3 but no quantiles */
		"*4\r\n$1\r\n3\r\n$1\r\n1\r\n$1\r\n1\r\n$1\r\n1\r\n",
		/* a field that is no number, or not finite */
		"*6\r\n$1\r\n3\r\n$3\r\nabc\r\n$1\r\n1\r\n$1\r\n1\r\n"
		"$1\r\n1\r\n$1\r\n1\r\n",
		"*6\r\n$1\r\n3\r\n$3\r\ninf\r\n$1\r\n1\r\n$1\r\n1\r\n"
		"$1\r\n1\r\n$1\r\n1\r\n",
		"*6\r\n$1\r\n3\r\n$1\r\n1\r\n$1\r\n1\r\n$1\r\n1\r\n"
		"$1\r\n1\r\n$3\r\nnan\r\n",
		"*6\r\n$1\r\n3\r\n$0\r\n\r\n$1\r\n1\r\n$1\r\n1\r\n"
		"$1\r\n1\r\n$1\r\n1\r\n",
	};
	struct rl_stat_result res;
	struct rl_stat_op op;
	redisReply *r;
	size_t i;

	stat_op(&op, true);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r = resp(bad[i]);
		memset(&res, 0, sizeof(res));
		res.count = 77;
		err[0] = '\0';
		ck_assert_msg(redis_stats_decode(r, &op, &res, err,
				  sizeof(err)) == -1,
		    "case %zu accepted", i);
		ck_assert_str_eq(err, "stats script: unexpected reply");
		ck_assert_uint_eq(res.count, 77);
		freeReplyObject(r);
	}
	r = resp("-NOSCRIPT No matching script. Please use EVAL.\r\n");
	ck_assert_int_eq(redis_stats_decode(r, &op, &res, err, sizeof(err)),
	    -1);
	ck_assert_str_eq(err,
	    "stats script: NOSCRIPT No matching script. "
	    "Please use EVAL.");
	freeReplyObject(r);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("redis_script");
	TCase *tc = tcase_create("ratelimit");
	TCase *st = tcase_create("stats");

	tcase_add_test(tc, test_encode_batch);
	tcase_add_test(tc, test_encode_marks);
	tcase_add_test(tc, test_encode_wait_and_lease);
	tcase_add_test(tc, test_encode_numbers_and_keys);
	tcase_add_test(tc, test_encode_refused);
	tcase_add_test(tc, test_encode_large);
	tcase_add_test(tc, test_encode_same);
	tcase_add_test(tc, test_encode_same_three);
	tcase_add_test(tc, test_encode_not_same);
	tcase_add_test(tc, test_decode);
	tcase_add_test(tc, test_decode_skips_answered);
	tcase_add_test(tc, test_decode_marks);
	tcase_add_test(tc, test_decode_chunks);
	tcase_add_test(tc, test_encode_chunks);
	tcase_add_test(tc, test_decode_refused);
	suite_add_tcase(s, tc);
	tcase_add_test(st, test_stats_encode);
	tcase_add_test(st, test_stats_decode);
	tcase_add_test(st, test_stats_decode_refused);
	suite_add_tcase(s, st);
	return s;
}
