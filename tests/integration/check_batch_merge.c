/*
 * check_batch_merge.c - requests of one key merged within one call of
 * lua/ratelimit.lua (docs/algorithms.md, "Requests of one key in one
 * call") decide exactly as the same requests sent one call each.
 *
 * For each algorithm (sliding_log, sliding_window, fixed_window,
 * token_bucket) a batch is sent in one call on the keys "m:b:{k<i>}", then
 * the same requests one call each, in the same order, on "m:o:{k<i>}"; the
 * batch's reply must be the one-by-one replies end to end (every field,
 * marks included), and each key must hold the same data after (DUMP, which
 * serialises the value without the key's name or TTL) and have a TTL in
 * both or in neither.
 *
 * What makes the comparison exact: the script takes its time from TIME,
 * and real calls are microseconds apart, which moves reset, retry and
 * effective fields and sliding_log's run times.  So, as in
 * check_vectors_redis.c, every call here is an EVAL of the compiled-in
 * script whose line "local time = redis.call('TIME')" is replaced by a
 * fixed time: the batch and every single call run at the same microsecond,
 * and any difference is the merging's.  Only TTLs are set against the real
 * clock (PEXPIRE is relative), at different real moments: their values are
 * computed from the same fixed time, and they are compared within 2 s.
 *
 * The batches: one key only (costs 1 to 3 until past the limit, then
 * identical denied requests, then a cheaper one that still fits); and one
 * key mixed with others, with multi-check requests that record on it (so
 * that a remembered denial must be forgotten), one that another key denies
 * (so that nothing is recorded), and a shadow check on it.
 */
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "harness.h"
#include "core/rules.h"

#define TIME_LINE "local time = redis.call('TIME')\n"
extern const char rl_lua_ratelimit[];

static struct h_redis redis;
static char *script_head, *script_tail;

#define M_KEYS	 3
#define M_MAXREQ 24
#define M_MAXCHK 2

/* One check: key k<key>, limit, cost, shadow (window and algorithm are
 * the scenario's). */
struct m_check {
	int key;
	int64_t limit, cost;
	bool shadow;
};

struct m_req {
	size_t n;
	struct m_check c[M_MAXCHK];
};

static void
split_script(void)
{
	const char *s = rl_lua_ratelimit, *at;

	at = strstr(s, TIME_LINE);
	if (at == NULL || strstr(at + 1, TIME_LINE) != NULL) {
		fprintf(stderr,
		    "lua/ratelimit.lua: the line %s is not there "
		    "exactly once\n",
		    TIME_LINE);
		exit(EXIT_FAILURE);
	}
	script_head = strndup(s, (size_t)(at - s));
	script_tail = strdup(at + strlen(TIME_LINE));
	if (script_head == NULL || script_tail == NULL) {
		fprintf(stderr, "out of memory\n");
		exit(EXIT_FAILURE);
	}
}

/* EVAL at now, with 'marks', of rq[0 .. nrq - 1] on "m:<set>:{k<i>}";
 * every check of algorithm alg and window window_ms.  Free the reply. */
static redisReply *
m_eval(int64_t now, const char *set, int alg, int64_t window_ms,
    const struct m_req *rq, size_t nrq)
{
	enum { MAXARG = 5 + M_MAXREQ * (1 + 6 * M_MAXCHK) };
	redisContext *c = h_redis_ctx(&redis);
	const char *argv[MAXARG];
	size_t argl[MAXARG], i, j, nk = 0, u = 0;
	char nums[MAXARG][48];
	char *text;
	redisReply *rep;
	int argc = 0;

	if (asprintf(&text, "%slocal time = {'%" PRId64 "', '%" PRId64 "'}\n%s",
		script_head, now / 1000000, now % 1000000, script_tail) == -1)
		ck_abort_msg("out of memory");
	for (i = 0; i < nrq; i++)
		nk += rq[i].n;
	argv[argc++] = "EVAL";
	argv[argc++] = text;
	snprintf(nums[u], sizeof(nums[u]), "%zu", nk);
	argv[argc++] = nums[u++];
	for (i = 0; i < nrq; i++)
		for (j = 0; j < rq[i].n; j++) {
			snprintf(nums[u], sizeof(nums[u]), "m:%s:{k%d}", set,
			    rq[i].c[j].key);
			argv[argc++] = nums[u++];
		}
	argv[argc++] = "marks";
	snprintf(nums[u], sizeof(nums[u]), "%zu", nrq);
	argv[argc++] = nums[u++];
	for (i = 0; i < nrq; i++) {
		snprintf(nums[u], sizeof(nums[u]), "%zu", rq[i].n);
		argv[argc++] = nums[u++];
	}
	for (i = 0; i < nrq; i++)
		for (j = 0; j < rq[i].n; j++) {
			const struct m_check *k = &rq[i].c[j];

			snprintf(nums[u], sizeof(nums[u]), "%d", alg);
			argv[argc++] = nums[u++];
			snprintf(nums[u], sizeof(nums[u]), "%" PRId64,
			    k->limit);
			argv[argc++] = nums[u++];
			snprintf(nums[u], sizeof(nums[u]), "%" PRId64,
			    window_ms);
			argv[argc++] = nums[u++];
			snprintf(nums[u], sizeof(nums[u]), "%" PRId64, k->cost);
			argv[argc++] = nums[u++];
			argv[argc++] = k->shadow ? "1" : "0";
		}
	for (i = 0; i < (size_t)argc; i++)
		argl[i] = strlen(argv[i]);
	rep = redisCommandArgv(c, argc, argv, argl);
	free(text);
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_ARRAY,
	    "redis: %s",
	    rep == NULL			       ? c->errstr :
		rep->type == REDIS_REPLY_ERROR ? rep->str :
						 "not an array");
	return rep;
}

/* Send rq as one batch and one call each at the same time; compare the
 * replies and then every key.  Returns how many requests were denied. */
static int
m_compare(const char *what, int alg, int64_t window_ms, const struct m_req *rq,
    size_t nrq)
{
	const int64_t now = 1700000000000000 + (int64_t)alg * 1000;
	redisReply *batch = m_eval(now, "b", alg, window_ms, rq, nrq), *one;
	size_t i, j, at = 0;
	int denied = 0, k;

	for (i = 0; i < nrq; i++) {
		one = m_eval(now, "o", alg, window_ms, &rq[i], 1);
		ck_assert_msg(at + one->elements <= batch->elements,
		    "%s: the batch's reply is short", what);
		if (one->element[0]->integer == 0)
			denied++;
		for (j = 0; j < one->elements; j++) {
			const redisReply *x = batch->element[at + j],
					 *y = one->element[j];

			ck_assert_msg(x->type == y->type &&
				(x->type == REDIS_REPLY_INTEGER ?
					x->integer == y->integer :
					strcmp(x->str, y->str) == 0),
			    "%s, request %zu, field %zu: batch %lld/%s, one "
			    "by one %lld/%s",
			    what, i, j, x->integer,
			    x->type == REDIS_REPLY_INTEGER ? "-" : x->str,
			    y->integer,
			    y->type == REDIS_REPLY_INTEGER ? "-" : y->str);
		}
		at += one->elements;
		freeReplyObject(one);
	}
	ck_assert_uint_eq(at, batch->elements);
	freeReplyObject(batch);

	for (k = 0; k < M_KEYS; k++) {
		redisContext *c = h_redis_ctx(&redis);
		redisReply *d[2];
		long long ttl[2];
		int s;

		for (s = 0; s < 2; s++) {
			const char *set = s == 0 ? "b" : "o";

			d[s] = redisCommand(c, "DUMP m:%s:{k%d}", set, k);
			ck_assert_ptr_nonnull(d[s]);
			ttl[s] = h_redis_int(&redis, "PTTL m:%s:{k%d}", set, k);
		}
		ck_assert_msg(d[0]->type == d[1]->type &&
			d[0]->len == d[1]->len &&
			(d[0]->type != REDIS_REPLY_STRING ||
			    memcmp(d[0]->str, d[1]->str, d[0]->len) == 0),
		    "%s: key k%d holds other data after the batch", what, k);
		ck_assert_msg((ttl[0] > 0) == (ttl[1] > 0) &&
			(ttl[0] > 0 || ttl[0] == ttl[1]) &&
			llabs(ttl[0] - ttl[1]) < 2000,
		    "%s: k%d: TTL %lld after the batch, %lld one by one", what,
		    k, ttl[0], ttl[1]);
		freeReplyObject(d[0]);
		freeReplyObject(d[1]);
	}
	return denied;
}

static const int algs[] = { RL_ALG_SLIDING_LOG, RL_ALG_SLIDING_WINDOW,
	RL_ALG_FIXED_WINDOW, RL_ALG_TOKEN_BUCKET };
static const char *const alg_names[] = { "sliding_log", "sliding_window",
	"fixed_window", "token_bucket" };

#define ONE(k, l, c) \
	{ \
		1, \
		{ \
			{ \
				(k), (l), (c), false \
			} \
		} \
	}
#define TWO(k1, l1, c1, k2, l2, c2) \
	{ \
		2, \
		{ \
			{ (k1), (l1), (c1), false }, \
			{ \
				(k2), (l2), (c2), false \
			} \
		} \
	}

/* One key, limit 10: costs 1, 1, 2, 3, 2 fill it; identical denied
 * requests (cost 2, then cost 1) follow; a cost 3 then. */
START_TEST(test_one_key)
{
	static const struct m_req rq[] = { ONE(0, 10, 1), ONE(0, 10, 1),
		ONE(0, 10, 2), ONE(0, 10, 3), ONE(0, 10, 2), ONE(0, 10, 2),
		ONE(0, 10, 2), ONE(0, 10, 2), ONE(0, 10, 1), ONE(0, 10, 1),
		ONE(0, 10, 1), ONE(0, 10, 3), ONE(0, 10, 3), ONE(0, 10, 0),
		ONE(0, 10, 2) };
	char what[64];
	int denied;

	snprintf(what, sizeof(what), "%s, one key", alg_names[_i]);
	denied = m_compare(what, algs[_i], 600000, rq,
	    sizeof(rq) / sizeof(rq[0]));
	/* some requests must have been denied, or nothing was merged */
	ck_assert_msg(denied >= 4, "%s: %d denied", what, denied);
}
END_TEST

/* k0 (limit 5) mixed with k1 (limit 5) and k2 (limit 1): a denial on k0
 * that a two-check request recording on k0 must make stale; a two-check
 * request that k2 denies (k0 keeps nothing); a shadow check on k0. */
START_TEST(test_mixed)
{
	static const struct m_req rq[] = {
		ONE(0, 5, 3),
		ONE(1, 5, 1),
		ONE(0, 5, 3),		      /* denied: 3 + 3 > 5 */
		ONE(0, 5, 3),		      /* the same again */
		TWO(1, 5, 1, 0, 5, 1),	      /* records 1 on k0: 4 used */
		ONE(0, 5, 3),		      /* denied, other remaining */
		ONE(2, 1, 1),		      /* k2 full */
		TWO(0, 5, 1, 2, 1, 1),	      /* k2 denies: nothing on k0 */
		ONE(0, 5, 3),		      /* as before that request */
		{ 1, { { 0, 5, 1, true } } }, /* shadow: records 1 on k0 */
		ONE(0, 5, 3),		      /* denied, 0 remaining */
		ONE(0, 5, 1),		      /* denied */
		ONE(0, 5, 1),
		ONE(1, 5, 2),
		TWO(0, 5, 1, 1, 5, 1), /* k0 denies: nothing on k1 */
		ONE(0, 5, 1),
		ONE(0, 6, 1), /* another limit (a reload) */
		ONE(0, 5, 1),
	};
	char what[64];

	snprintf(what, sizeof(what), "%s, mixed", alg_names[_i]);
	m_compare(what, algs[_i], 600000, rq, sizeof(rq) / sizeof(rq[0]));
}
END_TEST

static void
start_redis(void)
{
	if (redis.pid == 0)
		h_redis_start(&redis);
}

static void
flush_redis(void)
{
	h_redis_flush(&redis);
}

static void
suite_done(void)
{
	h_redis_stop(&redis);
	free(script_head);
	free(script_tail);
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("batch_merge");
	TCase *tc = tcase_create("merge");

	split_script();
	tcase_add_unchecked_fixture(tc, start_redis, h_reap_orphans);
	tcase_add_checked_fixture(tc, flush_redis, h_test_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_one_key, 0, 4);
	tcase_add_loop_test(tc, test_mixed, 0, 4);
	suite_add_tcase(s, tc);
	test_main_at_end(suite_done);
	return s;
}
