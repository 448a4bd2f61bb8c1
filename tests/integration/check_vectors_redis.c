/*
 * check_vectors_redis.c - the shared test vectors of
 * tests/vectors/algorithms.txt run through lua/ratelimit.lua on a real
 * redis-server.  tests/unit/check_vectors.c runs the same file through the
 * memory store; both passing is what "the memory store and Redis give the
 * same answers" means in practice.  The file's header comment defines its
 * format.
 *
 * The script is the one compiled into the daemon (rl_lua_ratelimit from
 * librl.a).  It takes its time from `redis.call('TIME')`, so for each step
 * this test runs, with EVAL, a copy of that text whose line
 *	local time = redis.call('TIME')
 * is replaced by `local time = {'<sec>', '<usec>'}` with the step's time.
 * The line must be there exactly once: a refactor of the script that moves
 * it fails here, loudly, instead of testing the real clock by accident.
 *
 * Each step's EVAL runs in MULTI/EXEC together with a PERSIST of the
 * scenario's keys.  The script's TTLs are meant for real time; the steps'
 * times are not real, and a PEXPIRE of 1 ms (fixed_window near the end of
 * its window, 1 ms windows) could otherwise go off between two steps.  By
 * docs/algorithms.md a key's state stops changing answers when its TTL is
 * up, so keeping it must not change any answer; the memory store, which
 * does drop states at their expiry, is held to the same numbers.
 *
 * The parser below is the twin of the one in tests/unit/check_vectors.c
 * (the unit and the integration suites link separately); a format change
 * must go to both.
 */
#include <check.h>
#include <errno.h>
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

#include "../vectors/vectors.h"

/* Read one reply of a pipeline; abort on a transport error. */
static redisReply *
get_reply(redisContext *c)
{
	void *rep = NULL;

	ck_assert_msg(redisGetReply(c, &rep) == REDIS_OK && rep != NULL,
	    "redis: %s", c->errstr);
	return rep;
}

/* Run one step: MULTI, EVAL, PERSIST of every key, EXEC; return EXEC's
 * first element (EVAL's reply) in *out, to free with the returned reply. */
static redisReply *
run_step(redisContext *c, const struct vec_scenario *sc, char keys[][96],
    int64_t now, const struct vec_step *st, size_t step, redisReply **out)
{
	int64_t cost = st->cost, wait_us = st->wait_us;
	const char *argv[5 + 6 * VEC_MAX_RULES];
	size_t argl[5 + 6 * VEC_MAX_RULES];
	char nums[VEC_MAX_RULES][5][48], nkeys[8], count[48];
	char *text = script_time_at(now);
	redisReply *rep, *exec;
	size_t r, n = 0, j;
	int argc = 0;

	snprintf(nkeys, sizeof(nkeys), "%zu", sc->nrules);
	argv[argc++] = "EVAL";
	argv[argc++] = text;
	argv[argc++] = nkeys;
	for (r = 0; r < sc->nrules; r++)
		argv[argc++] = keys[r];
	if (st->chunk_want > 0)
		argv[argc++] = "chunks";
	if (st->report) {
		/* A batch of one request, whose count says "report". */
		snprintf(count, sizeof(count), "%zu:r", sc->nrules);
		argv[argc++] = "1";
		argv[argc++] = count;
	} else if (wait_us > 0) {
		/* A batch of one request, whose count carries the wait. */
		snprintf(count, sizeof(count), "%zu:%" PRId64, sc->nrules,
		    wait_us);
		argv[argc++] = "1";
		argv[argc++] = count;
	}
	for (r = 0; r < sc->nrules; r++) {
		if (sc->rules[r].alg == RL_ALG_CONCURRENCY && st->look)
			/* "4": a look, no token */
			snprintf(nums[r][0], sizeof(nums[r][0]), "%d",
			    (int)sc->rules[r].alg);
		else if (sc->rules[r].alg == RL_ALG_CONCURRENCY)
			/* a lease token of its own per step, as in memory */
			snprintf(nums[r][0], sizeof(nums[r][0]), "%d:%032zx",
			    (int)sc->rules[r].alg, step + 1);
		else if (r == 0 && st->chunk_want > 0)
			/* "<alg>+<want>+<hold_us>": take a chunk */
			snprintf(nums[r][0], sizeof(nums[r][0]),
			    "%d+%" PRId64 "+%" PRId64, (int)sc->rules[r].alg,
			    st->chunk_want, st->chunk_hold_us);
		else
			snprintf(nums[r][0], sizeof(nums[r][0]), "%d",
			    (int)sc->rules[r].alg);
		snprintf(nums[r][1], sizeof(nums[r][1]), "%" PRId64,
		    sc->rules[r].limit);
		snprintf(nums[r][2], sizeof(nums[r][2]), "%" PRId64,
		    sc->rules[r].window_ms);
		snprintf(nums[r][3], sizeof(nums[r][3]), "%" PRId64, cost);
		snprintf(nums[r][4], sizeof(nums[r][4]), "%d",
		    sc->rules[r].shadow ? 1 : 0);
		for (j = 0; j < 5; j++)
			argv[argc++] = nums[r][j];
	}
	for (j = 0; j < (size_t)argc; j++)
		argl[j] = strlen(argv[j]);

	redisAppendCommand(c, "MULTI");
	redisAppendCommandArgv(c, argc, argv, argl);
	for (r = 0; r < sc->nrules; r++) {
		redisAppendCommand(c, "PERSIST %s", keys[r]);
		n++;
	}
	redisAppendCommand(c, "EXEC");
	free(text);
	for (j = 0; j < n + 2; j++) {
		rep = get_reply(c); /* +OK, then +QUEUED each */
		ck_assert_msg(rep->type == REDIS_REPLY_STATUS, "redis: %s",
		    rep->type == REDIS_REPLY_ERROR ?
			rep->str :
			"unexpected reply in MULTI");
		freeReplyObject(rep);
	}
	exec = get_reply(c);
	ck_assert_msg(exec->type == REDIS_REPLY_ARRAY &&
		exec->elements == n + 1,
	    "redis: EXEC did not answer %zu "
	    "replies",
	    n + 1);
	*out = exec->element[0];
	return exec;
}

START_TEST(test_scenario)
{
	const struct vec_scenario *sc = &scenarios[_i];
	char keys[VEC_MAX_RULES][96];
	redisContext *c = h_redis_ctx(&h_shared_redis);
	redisReply *exec, *rep;
	long long waited;
	size_t s, r;

	for (r = 0; r < sc->nrules; r++)
		snprintf(keys[r], sizeof(keys[r]), "vec:%s:%zu", sc->name, r);
	for (s = 0; s < sc->nsteps; s++) {
		const struct vec_step *st = &sc->steps[s];
		long long got[5];
		size_t j;

		size_t f = st->chunk_want > 0 ? 7 : 5; /* fields per rule */

		exec = run_step(c, sc, keys, sc->epoch + st->t, st, s, &rep);
		ck_assert_msg(rep->type == REDIS_REPLY_ARRAY &&
			rep->elements == 1 + f * sc->nrules,
		    "%s:%d (%s): the script answered %s", vec_path, st->line,
		    sc->name,
		    rep->type == REDIS_REPLY_ERROR ? rep->str :
						     "not an array of 1 + 5n");
		for (j = 0; j < rep->elements; j++)
			ck_assert_msg(rep->element[j]->type ==
				REDIS_REPLY_INTEGER,
			    "%s:%d: element %zu of the "
			    "reply is not an integer",
			    vec_path, st->line, j);
		for (r = 0; r < sc->nrules; r++) {
			const struct vec_result *w = &st->want[r];

			for (j = 0; j < 5; j++)
				got[j] = rep->element[1 + f * r + j]->integer;
			ck_assert_msg(vec_field_ok(w, 0, got[0]) &&
				vec_field_ok(w, 1, got[1]) &&
				vec_field_ok(w, 2, got[2]) &&
				vec_field_ok(w, 3, got[3]) &&
				vec_field_ok(w, 4, got[4]),
			    "%s:%d (%s, rule %zu, %s): got %lld %lld %lld "
			    "%lld t=%lld, want %d %" PRId64 " %" PRId64
			    " %" PRId64 " t=%" PRId64,
			    vec_path, st->line, sc->name, r + 1,
			    rl_algorithm_name(sc->rules[r].alg), got[0], got[1],
			    got[2], got[3], got[4], (int)w->allowed,
			    w->remaining, w->reset_ms, w->retry_after_ms,
			    w->effective_ms);
		}
		ck_assert_msg(st->chunk_want == 0 ||
			(rep->element[6]->integer == st->took &&
			    rep->element[7]->integer == st->took_us),
		    "%s:%d (%s): took %lld %lld, want %" PRId64 " %" PRId64,
		    vec_path, st->line, sc->name, rep->element[6]->integer,
		    rep->element[7]->integer, st->took, st->took_us);
		/* all_allowed: 0, 1, or 1 + the microseconds to the turn
		 * reserved. */
		ck_assert_msg((rep->element[0]->integer >= 1) == st->want_all,
		    "%s:%d (%s): all_allowed %lld, want %d", vec_path, st->line,
		    sc->name, rep->element[0]->integer, (int)st->want_all);
		waited = rep->element[0]->integer > 1 ?
		    rep->element[0]->integer - 1 :
		    0;
		ck_assert_msg(waited == st->waited_us,
		    "%s:%d (%s): waited "
		    "%lld us, want %" PRId64,
		    vec_path, st->line, sc->name, waited, st->waited_us);
		freeReplyObject(exec);
	}
}
END_TEST

/* --- a batch against the same requests one call each -------------------- */

/* One request of the batch test: one or two checks, each on key k<key>. */
struct b_req {
	size_t n;
	int key[2], alg[2];
	int64_t limit[2], window_ms[2], cost;
};

#define B_KEYS 3
#define B_REQS 12

/* EVAL the script at now with 'marks' and the requests rq[0 .. nrq - 1]
 * on the keys "b:<set>:{k<i>}"; return the reply (free it). */
static redisReply *
b_eval(redisContext *c, int64_t now, const char *set, const struct b_req *rq,
    size_t nrq)
{
	const char *argv[4 + 2 * B_REQS * 7 + B_REQS];
	char nums[4 + 2 * B_REQS * 7 + B_REQS][48];
	char *text = script_time_at(now);
	size_t i, j, nk = 0, u = 0;
	int argc = 0;

	for (i = 0; i < nrq; i++)
		nk += rq[i].n;
	argv[argc++] = "EVAL";
	argv[argc++] = text;
	snprintf(nums[u], sizeof(nums[u]), "%zu", nk);
	argv[argc++] = nums[u++];
	for (i = 0; i < nrq; i++)
		for (j = 0; j < rq[i].n; j++) {
			snprintf(nums[u], sizeof(nums[u]), "b:%s:{k%d}", set,
			    rq[i].key[j]);
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
			snprintf(nums[u], sizeof(nums[u]), "%d", rq[i].alg[j]);
			argv[argc++] = nums[u++];
			snprintf(nums[u], sizeof(nums[u]), "%" PRId64,
			    rq[i].limit[j]);
			argv[argc++] = nums[u++];
			snprintf(nums[u], sizeof(nums[u]), "%" PRId64,
			    rq[i].window_ms[j]);
			argv[argc++] = nums[u++];
			snprintf(nums[u], sizeof(nums[u]), "%" PRId64,
			    rq[i].cost);
			argv[argc++] = nums[u++];
			argv[argc++] = "0";
		}
	return script_time_eval(c, argc, argv);
}

/* Two replies' elements a[from ..] and b[0 ..] are the same. */
static void
b_same(const redisReply *a, size_t from, const redisReply *b, int round,
    size_t req)
{
	size_t j;

	ck_assert_msg(from + b->elements <= a->elements,
	    "round %d, request %zu: the batch's reply is short", round, req);
	for (j = 0; j < b->elements; j++) {
		const redisReply *x = a->element[from + j], *y = b->element[j];

		ck_assert_msg(x->type == y->type &&
			(x->type == REDIS_REPLY_INTEGER ?
				x->integer == y->integer :
				strcmp(x->str, y->str) == 0),
		    "round %d, request %zu, field %zu: batch %lld/%s, one "
		    "by one %lld/%s",
		    round, req, j, x->integer,
		    x->type == REDIS_REPLY_INTEGER ? "-" : x->str, y->integer,
		    y->type == REDIS_REPLY_INTEGER ? "-" : y->str);
	}
}

/*
 * Requests for the same keys in one call (lua/ratelimit.lua reads a
 * sliding_log key once per call and sets its TTL once) decide exactly as
 * the same requests sent one call each at the same time: every field and
 * mark, and the keys' contents and TTLs after.  Costs 0 to 3 against
 * limits 3 and 5, so that requests are allowed and denied; windows of 30
 * and 60 s over rounds 7 s apart, so that runs expire; a window changed
 * between requests; a key checked twice in one request; and a key that a
 * fixed_window check takes over and a sliding_log check takes back (in
 * requests of their own: one request holding both writes each type in
 * turn, which the script does not support).
 */
START_TEST(test_batch_same_key)
{
	redisContext *c = h_redis_ctx(&h_shared_redis);
	const int64_t epoch = 1700000000000000;
	uint32_t rng = 12345;
	struct b_req rq[B_REQS];
	int round, k;
	size_t i, j, at;

	for (round = 0; round < 14; round++) {
		int64_t now = epoch + (int64_t)round * 7000000;
		redisReply *batch, *one;

		for (i = 0; i < B_REQS; i++) {
			rng = rng * 1103515245 + 12345;
			rq[i].n = (rng >> 16) % 4 == 0 ? 2 : 1;
			rq[i].cost = (int64_t)((rng >> 8) % 4);
			for (j = 0; j < rq[i].n; j++) {
				rng = rng * 1103515245 + 12345;
				k = (int)((rng >> 16) % B_KEYS);
				rq[i].key[j] = k;
				rq[i].alg[j] = RL_ALG_SLIDING_LOG;
				rq[i].limit[j] = k == 1 ? 3 : 5;
				rq[i].window_ms[j] = k == 1 ? 30000 : 60000;
				if (k == 1 && (rng >> 8) % 3 == 0)
					rq[i].window_ms[j] = 45000;
				if (k == 2 && rq[i].n == 1 &&
				    (rng >> 8) % 5 == 0)
					rq[i].alg[j] = RL_ALG_FIXED_WINDOW;
			}
		}
		batch = b_eval(c, now, "batch", rq, B_REQS);
		for (i = 0, at = 0; i < B_REQS; i++) {
			one = b_eval(c, now, "one", &rq[i], 1);
			b_same(batch, at, one, round, i);
			at += one->elements;
			freeReplyObject(one);
		}
		ck_assert_uint_eq(at, batch->elements);
		freeReplyObject(batch);
	}
	for (k = 0; k < B_KEYS; k++) {
		long long ttl[2];
		redisReply *v[2];
		int s;

		for (s = 0; s < 2; s++) {
			const char *set = s == 0 ? "batch" : "one";

			ttl[s] = h_redis_int(&h_shared_redis, "PTTL b:%s:{k%d}",
			    set, k);
			v[s] = redisCommand(c,
			    "ZRANGE b:%s:{k%d} 0 -1 WITHSCORES", set, k);
			ck_assert_ptr_nonnull(v[s]);
		}
		ck_assert_msg(ttl[0] > 0 && llabs(ttl[0] - ttl[1]) < 5000,
		    "k%d: TTL %lld in the batch, %lld one by one", k, ttl[0],
		    ttl[1]);
		ck_assert_int_eq(v[0]->type, v[1]->type);
		if (v[0]->type == REDIS_REPLY_ARRAY) {
			ck_assert_uint_eq(v[0]->elements, v[1]->elements);
			for (j = 0; j < v[0]->elements; j++)
				ck_assert_str_eq(v[0]->element[j]->str,
				    v[1]->element[j]->str);
		}
		freeReplyObject(v[0]);
		freeReplyObject(v[1]);
	}
}
END_TEST

/* --- fixtures and main -------------------------------------------------- */

static void
suite_done(void)
{
	h_shared_redis_stop();
	printf("%zu scenarios from %s\n", nscenarios, vec_path);
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("vectors_redis");
	TCase *tc = h_shared_redis_tcase("redis");

	test_srcdir_path(VEC_FILE, vec_path, sizeof(vec_path));
	vec_load(vec_path);
	tcase_add_loop_test(tc, test_scenario, 0, (int)nscenarios);
	suite_add_tcase(s, tc);
	tc = h_shared_redis_tcase("batch");
	tcase_add_test(tc, test_batch_same_key);
	suite_add_tcase(s, tc);
	test_main_at_end(suite_done);
	return s;
}
