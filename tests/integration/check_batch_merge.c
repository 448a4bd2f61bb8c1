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
 * identical denied requests, then a cheaper one that still fits); one
 * key mixed with others, with multi-check requests that record on it (so
 * that a remembered denial must be forgotten), one that another key denies
 * (so that nothing is recorded), and a shadow check on it; and requests of
 * three checks of three algorithms, as bench/speed.sh's row (e) sends them
 * (sliding_log and fixed_window on their keys, token_bucket on a key every
 * request shares), until each of them denies, mixed with single checks,
 * shadow checks and a key that changes algorithm.
 *
 * A fixed_window hash counted under another window (a reload) gets its
 * TTL moved to the window's end alike on the fast path (lean_request) and
 * on the general path.
 *
 * And a batch whose requests have the same checks (one rule's single
 * sliding_log checks, or row (e)'s three), as the store sends it (the
 * checks' five values once, after 'same'), decides exactly as the same
 * batch with five values per check.
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
#include "script_time.h"
#include "core/rules.h"

#define M_KEYS	 3
#define M_MAXREQ 24
#define M_MAXCHK 3

/* One check: key k<key>, limit, cost, shadow, and 1 + its algorithm (enum
 * rl_algorithm), or 0 for the scenario's (the window is the scenario's). */
struct m_check {
	int key;
	int64_t limit, cost;
	bool shadow;
	int alg;
};

struct m_req {
	size_t n;
	struct m_check c[M_MAXCHK];
};

/* An EVAL being built: argv[0 .. argc - 1], numbers and keys written in
 * text. */
struct m_args {
	const char *argv[5 + M_MAXREQ * (1 + 6 * M_MAXCHK)];
	char text[5 + M_MAXREQ * (1 + 6 * M_MAXCHK)][48];
	int argc;
};

/* Add an argument: s, or with fmt != NULL, fmt and its number. */
static void
m_arg(struct m_args *a, const char *s, const char *fmt, int64_t v)
{
	if (fmt != NULL) {
		snprintf(a->text[a->argc], sizeof(a->text[a->argc]), fmt, v);
		s = a->text[a->argc];
	}
	a->argv[a->argc++] = s;
}

/* EVAL, the script at now, and the keys of rq[0 .. nrq - 1]'s checks,
 * "m:<set>:{k<i>}", then 'marks'. */
static void
m_start(struct m_args *a, int64_t now, const char *set, const struct m_req *rq,
    size_t nrq)
{
	size_t i, j, nk = 0;

	a->argc = 0;
	for (i = 0; i < nrq; i++)
		nk += rq[i].n;
	m_arg(a, "EVAL", NULL, 0);
	m_arg(a, script_time_at(now), NULL, 0);
	m_arg(a, NULL, "%" PRId64, (int64_t)nk);
	for (i = 0; i < nrq; i++)
		for (j = 0; j < rq[i].n; j++) {
			snprintf(a->text[a->argc], sizeof(a->text[a->argc]),
			    "m:%s:{k%d}", set, rq[i].c[j].key);
			m_arg(a, a->text[a->argc], NULL, 0);
		}
	m_arg(a, "marks", NULL, 0);
}

/* The five values of check k: its algorithm (or alg), limit, window_ms,
 * cost and shadow. */
static void
m_check_args(struct m_args *a, const struct m_check *k, int alg,
    int64_t window_ms)
{
	m_arg(a, NULL, "%" PRId64, k->alg != 0 ? k->alg - 1 : alg);
	m_arg(a, NULL, "%" PRId64, k->limit);
	m_arg(a, NULL, "%" PRId64, window_ms);
	m_arg(a, NULL, "%" PRId64, k->cost);
	m_arg(a, k->shadow ? "1" : "0", NULL, 0);
}

/* EVAL at now, with 'marks', of rq[0 .. nrq - 1] on "m:<set>:{k<i>}";
 * every check of algorithm alg and window window_ms.  Free the reply. */
static redisReply *
m_eval(int64_t now, const char *set, int alg, int64_t window_ms,
    const struct m_req *rq, size_t nrq)
{
	struct m_args a;
	size_t i, j;

	m_start(&a, now, set, rq, nrq);
	m_arg(&a, NULL, "%" PRId64, (int64_t)nrq);
	for (i = 0; i < nrq; i++)
		m_arg(&a, NULL, "%" PRId64, (int64_t)rq[i].n);
	for (i = 0; i < nrq; i++)
		for (j = 0; j < rq[i].n; j++)
			m_check_args(&a, &rq[i].c[j], alg, window_ms);
	return script_time_eval(h_redis_ctx(&h_shared_redis), a.argc, a.argv);
}

/* Are two fields of replies the same (an integer, or a mark's text)? */
static bool
same_field(const redisReply *x, const redisReply *y)
{
	return x->type == y->type &&
	    (x->type == REDIS_REPLY_INTEGER ? x->integer == y->integer :
					      strcmp(x->str, y->str) == 0);
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

			ck_assert_msg(same_field(x, y),
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
		redisContext *c = h_redis_ctx(&h_shared_redis);
		redisReply *d[2];
		long long ttl[2];
		int s;

		for (s = 0; s < 2; s++) {
			const char *set = s == 0 ? "b" : "o";

			d[s] = redisCommand(c, "DUMP m:%s:{k%d}", set, k);
			ck_assert_ptr_nonnull(d[s]);
			ttl[s] = h_redis_int(&h_shared_redis, "PTTL m:%s:{k%d}",
			    set, k);
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
				(k), (l), (c), false, 0 \
			} \
		} \
	}
#define TWO(k1, l1, c1, k2, l2, c2) \
	{ \
		2, \
		{ \
			{ (k1), (l1), (c1), false, 0 }, \
			{ \
				(k2), (l2), (c2), false, 0 \
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
		ONE(0, 5, 3),			 /* denied: 3 + 3 > 5 */
		ONE(0, 5, 3),			 /* the same again */
		TWO(1, 5, 1, 0, 5, 1),		 /* records 1 on k0: 4 used */
		ONE(0, 5, 3),			 /* denied, other remaining */
		ONE(2, 1, 1),			 /* k2 full */
		TWO(0, 5, 1, 2, 1, 1),		 /* k2 denies: nothing on k0 */
		ONE(0, 5, 3),			 /* as before that request */
		{ 1, { { 0, 5, 1, true, 0 } } }, /* shadow: records 1 on k0 */
		ONE(0, 5, 3),			 /* denied, 0 remaining */
		ONE(0, 5, 1),			 /* denied */
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

/* One check of algorithm a (enum rl_algorithm) on k<k>. */
#define CK(a, k, l, c) \
	{ \
		(k), (l), (c), false, 1 + (a) \
	}
#define LOG RL_ALG_SLIDING_LOG
#define FIX RL_ALG_FIXED_WINDOW
#define TB  RL_ALG_TOKEN_BUCKET
#define SW  RL_ALG_SLIDING_WINDOW
/* Row (e): sliding_log on k0, fixed_window on k1, token_bucket on k2. */
#define ROW_E(l0, c0, l1, c1, l2, c2) \
	{ \
		3, \
		{ \
			CK(LOG, 0, l0, c0), CK(FIX, 1, l1, c1), \
			    CK(TB, 2, l2, c2) \
		} \
	}

/* k0 sliding_log (limit 6), k1 fixed_window (limit 8) and k2 token_bucket
 * (limit 10, a unit every 60 s): row (e) until k0 denies, then k1, then
 * k2; single checks on the same keys; shadow checks; a request with c = 0;
 * k2 read as a sliding_log key, then as a token_bucket again, and k1 as a
 * sliding_window (another algorithm on a key: it starts fresh). */
START_TEST(test_three)
{
	static const struct m_req rq[] = {
		ROW_E(6, 1, 8, 1, 10, 1),
		ROW_E(6, 1, 8, 1, 10, 1),
		{ 1, { CK(TB, 2, 10, 1) } },
		ROW_E(6, 2, 8, 1, 10, 1),
		{ 1, { CK(LOG, 0, 6, 1) } },
		ROW_E(6, 2, 8, 1, 10, 1), /* k0 denies: nothing recorded */
		ROW_E(6, 0, 8, 2, 10, 1),
		{ 3,
		    { CK(LOG, 0, 6, 1), { 1, 8, 1, true, 1 + FIX },
			CK(TB, 2, 10, 1) } }, /* a shadow: the general path */
		ROW_E(6, 0, 8, 3, 10, 1),     /* k1 denies */
		{ 1, { CK(FIX, 1, 8, 1) } },
		{ 1, { CK(TB, 2, 10, 1) } },
		ROW_E(6, 0, 8, 0, 10, 4), /* k2 denies */
		ROW_E(6, 0, 8, 0, 10, 0),
		{ 2, { CK(LOG, 2, 5, 1), CK(LOG, 0, 6, 0) } },
		ROW_E(7, 1, 9, 1, 10, 1),
		{ 2, { CK(TB, 0, 10, 1), CK(SW, 1, 8, 1) } },
		ROW_E(7, 1, 9, 1, 10, 1),
	};

	int denied = m_compare("three algorithms", RL_ALG_SLIDING_LOG, 600000,
	    rq, sizeof(rq) / sizeof(rq[0]));

	/* each of the three must have denied a request of row (e) */
	ck_assert_msg(denied >= 3, "three algorithms: %d denied", denied);
}
END_TEST

/* EVAL at now, with 'marks', of rq[0 .. nrq - 1] in the 'same' form
 * (lua/ratelimit.lua): every request has rq[0]'s checks, whose five values
 * go once, each request's keys "m:<set>:{k<i>}".  Free the reply. */
static redisReply *
m_eval_same(int64_t now, const char *set, int alg, int64_t window_ms,
    const struct m_req *rq, size_t nrq)
{
	struct m_args a;
	size_t j;

	m_start(&a, now, set, rq, nrq);
	m_arg(&a, "same", NULL, 0);
	m_arg(&a, NULL, "%" PRId64, (int64_t)rq[0].n);
	for (j = 0; j < rq[0].n; j++)
		m_check_args(&a, &rq[0].c[j], alg, window_ms);
	return script_time_eval(h_redis_ctx(&h_shared_redis), a.argc, a.argv);
}

/*
 * Send rq (every request with rq[0]'s checks) at now as one batch with
 * five values per check, on "m:b:{k<i>}", and in the 'same' form, on
 * "m:s:{k<i>}"; the replies must be the same, field by field, and so must
 * every key's data after.  Returns how many requests were denied.
 */
static int
same_compare(const char *what, int64_t now, int64_t window_ms,
    const struct m_req *rq, size_t nrq)
{
	redisReply *x = m_eval(now, "b", RL_ALG_SLIDING_LOG, window_ms, rq,
		       nrq),
		   *y = m_eval_same(now, "s", RL_ALG_SLIDING_LOG, window_ms, rq,
		       nrq);
	size_t per = 1 + rq[0].n * 6, i;
	int denied = 0, k;

	ck_assert_uint_eq(x->elements, nrq * per);
	ck_assert_uint_eq(y->elements, x->elements);
	for (i = 0; i < x->elements; i++) {
		const redisReply *a = x->element[i], *b = y->element[i];

		ck_assert_msg(same_field(a, b),
		    "%s, field %zu: five per check %lld/%s, same %lld/%s", what,
		    i, a->integer,
		    a->type == REDIS_REPLY_INTEGER ? "-" : a->str, b->integer,
		    b->type == REDIS_REPLY_INTEGER ? "-" : b->str);
		if (i % per == 0 && a->integer == 0)
			denied++;
	}
	freeReplyObject(x);
	freeReplyObject(y);
	for (k = 0; k < M_KEYS; k++) {
		redisContext *c = h_redis_ctx(&h_shared_redis);
		redisReply *d0 = redisCommand(c, "DUMP m:b:{k%d}", k),
			   *d1 = redisCommand(c, "DUMP m:s:{k%d}", k);

		ck_assert_ptr_nonnull(d0);
		ck_assert_ptr_nonnull(d1);
		ck_assert_msg(d1->type == d0->type && d1->len == d0->len &&
			(d0->type != REDIS_REPLY_STRING ||
			    memcmp(d0->str, d1->str, d0->len) == 0),
		    "%s: key k%d holds other data", what, k);
		ck_assert_msg((h_redis_int(&h_shared_redis, "PTTL m:s:{k%d}",
				   k) > 0) == (d0->type == REDIS_REPLY_STRING),
		    "%s: key k%d: TTL and data disagree", what, k);
		freeReplyObject(d0);
		freeReplyObject(d1);
	}
	return denied;
}

/* A batch of one rule's single checks sent in the 'same' form (what
 * src/store/redis_script.c sends for it) decides exactly as the same batch
 * with five values per check.  Three keys of limit 5, cost 2: k0 fills
 * and then denies (merged), k1 and k2 in between.  Run twice, the second
 * time on keys the first filled, one window later less a millisecond. */
START_TEST(test_same_form)
{
	static const int keys[] = { 0, 0, 1, 0, 2, 0, 1, 0, 0, 2, 1, 1 };
	struct m_req rq[sizeof(keys) / sizeof(keys[0])];
	const size_t n = sizeof(keys) / sizeof(keys[0]);
	int denied;
	size_t i;

	for (i = 0; i < n; i++)
		rq[i] = (struct m_req)ONE(keys[i], 5, 2);
	denied = same_compare("one rule", 1700000000000000, 1000, rq, n);
	denied += same_compare("one rule, again", 1700000000999000, 1000, rq,
	    n);
	/* k0 denied in both rounds, k1 in the second: merged answers */
	ck_assert_msg(denied >= 6, "one rule: %d denied", denied);
}
END_TEST

/* The same for requests of three rules (bench/speed.sh's row (e)): k0
 * sliding_log (limit 6), k1 fixed_window (8), k2 token_bucket (10), cost 1
 * each, until k0 denies and the request records nothing. */
START_TEST(test_same_three)
{
	struct m_req rq[10];
	size_t i;
	int denied;

	for (i = 0; i < 10; i++)
		rq[i] = (struct m_req)ROW_E(6, 1, 8, 1, 10, 1);
	denied = same_compare("three rules", 1700000000000000, 600000, rq, 10);
	ck_assert_int_eq(denied, 4);
}
END_TEST

/* The 'same' form refuses what it cannot stand for: one check of another
 * algorithm, a shadow check, a cost past the limit, a missing value, a key
 * count that is no multiple of the checks' count, a key twice in one
 * request, sliding_window among several checks. */
/*
 * fixed_window after a reload changed its window (docs/algorithms.md,
 * fixed_window): k1 holds now's window start under W = 600 s with 2 units,
 * no `w` (as an older version writes it) and a 1 s TTL, the old window's.
 * A request of row (e) (lean_request) on "m:l:" and the same request with
 * a shadow check added (the general path) on "m:g:" each record 1 on k1:
 * both keep the 2 units, write `w` and move k1's TTL to the window's end,
 * 400 s after now, and answer alike.
 */
START_TEST(test_fixed_resized)
{
	static const struct m_req lean = ROW_E(6, 1, 8, 1, 10, 1);
	static const struct m_req general = { 3,
		{ CK(LOG, 0, 6, 1), CK(FIX, 1, 8, 1),
		    { 2, 10, 1, true, 1 + TB } } };
	const int64_t now = 1700000000000000, w_us = 600000000;
	redisContext *c = h_redis_ctx(&h_shared_redis);
	redisReply *r[2], *d[2];
	long long ttl;
	size_t j;
	int s;

	for (s = 0; s < 2; s++) {
		const char *set = s == 0 ? "l" : "g";

		h_redis_int(&h_shared_redis, "HSET m:%s:{k1} s %lld n 2", set,
		    (long long)(now - now % w_us));
		h_redis_int(&h_shared_redis, "PEXPIRE m:%s:{k1} 1000", set);
		r[s] = m_eval(now, set, RL_ALG_SLIDING_LOG, w_us / 1000,
		    s == 0 ? &lean : &general, 1);
		ck_assert_uint_eq(r[s]->elements, 1 + 3 * 6);
		ttl = h_redis_int(&h_shared_redis, "PTTL m:%s:{k1}", set);
		ck_assert_msg(ttl > 390000 && ttl <= 400000,
		    "%s: k1's TTL %lld ms, expected the window's end, 400 s",
		    set, ttl);
		d[s] = redisCommand(c, "HMGET m:%s:{k1} s n w", set);
		ck_assert_ptr_nonnull(d[s]);
		ck_assert_str_eq(d[s]->element[1]->str, "3");
		ck_assert_ptr_nonnull(d[s]->element[2]->str);
		ck_assert_str_eq(d[s]->element[2]->str, "600000000");
	}
	/* k1's fields of the reply: allowed, remaining 8 - 3, reset, retry,
	 * effective, mark */
	for (j = 7; j < 13; j++)
		ck_assert_msg(same_field(r[0]->element[j], r[1]->element[j]),
		    "field %zu: lean %lld, general %lld", j,
		    r[0]->element[j]->integer, r[1]->element[j]->integer);
	ck_assert_int_eq(r[0]->element[8]->integer, 5);
	ck_assert_str_eq(d[0]->element[0]->str, d[1]->element[0]->str);
	for (s = 0; s < 2; s++) {
		freeReplyObject(r[s]);
		freeReplyObject(d[s]);
	}
}
END_TEST

START_TEST(test_same_refused)
{
	static const char *const bad[][13] = {
		{ "1", "k0", "1", "2", "5", "1000", "1", "0" },
		{ "1", "k0", "1", "0", "5", "1000", "1", "1" },
		{ "1", "k0", "1", "0", "5", "1000", "6", "0" },
		{ "1", "k0", "1", "0", "x", "1000", "1", "0" },
		{ "1", "k0", "2", "0", "5", "1000", "1", "0", "2", "5", "1000",
		    "1", "0" },
		{ "2", "k0", "k0", "2", "0", "5", "1000", "1", "0", "2", "5",
		    "1000", "1" },
		{ "2", "k0", "k1", "2", "0", "5", "1000", "1", "0", "1", "5",
		    "1000", "1" },
	};
	static const int nargs[] = { 8, 8, 8, 8, 13, 13, 13 };
	redisContext *c = h_redis_ctx(&h_shared_redis);
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *argv[20];
		size_t lens[20];
		char keys[2][32];
		int nk = atoi(bad[i][0]), argc = 0, j;
		redisReply *r;

		argv[argc++] = "EVAL";
		argv[argc++] = script_time_at(1700000000000000);
		for (j = 0; j < nargs[i]; j++) {
			if (j >= 1 && j <= nk) {
				snprintf(keys[j - 1], sizeof(keys[j - 1]),
				    "m:r:{%s}", bad[i][j]);
				argv[argc++] = keys[j - 1];
			} else {
				argv[argc++] = bad[i][j];
			}
			if (j == nk)
				argv[argc++] = "same";
		}
		if (i >= 5) /* the last value: shadow 0 */
			argv[argc++] = "0";
		for (j = 0; j < argc; j++)
			lens[j] = strlen(argv[j]);
		r = redisCommandArgv(c, argc, argv, lens);
		free((char *)argv[1]);
		ck_assert_ptr_nonnull(r);
		ck_assert_msg(r->type == REDIS_REPLY_ERROR &&
			strstr(r->str, "bad arguments after same") != NULL,
		    "case %zu: %s", i,
		    r->type == REDIS_REPLY_ERROR ? r->str : "not an error");
		freeReplyObject(r);
	}
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "EXISTS m:r:{k0}"), 0);
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "EXISTS m:r:{k1}"), 0);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("batch_merge");
	TCase *tc = h_shared_redis_tcase("merge");

	tcase_add_loop_test(tc, test_one_key, 0, 4);
	tcase_add_loop_test(tc, test_mixed, 0, 4);
	tcase_add_test(tc, test_three);
	tcase_add_test(tc, test_same_form);
	tcase_add_test(tc, test_same_three);
	tcase_add_test(tc, test_fixed_resized);
	tcase_add_test(tc, test_same_refused);
	suite_add_tcase(s, tc);
	test_main_at_end(h_shared_redis_stop);
	return s;
}
