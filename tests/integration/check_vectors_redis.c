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
#include "core/rules.h"

#include "../vectors/vectors.h"

#define TIME_LINE "local time = redis.call('TIME')\n"
extern const char rl_lua_ratelimit[];

static struct h_redis redis;

/* The script split around TIME_LINE (at start-up, in the runner). */
static char *script_head, *script_tail;

static void
split_script(void)
{
	const char *s = rl_lua_ratelimit, *at, *again;
	size_t n = strlen(TIME_LINE);

	at = strstr(s, TIME_LINE);
	again = at != NULL ? strstr(at + n, TIME_LINE) : NULL;
	if (at == NULL || (at != s && at[-1] != '\n') || again != NULL) {
		fprintf(stderr,
		    "lua/ratelimit.lua: the line \"%.*s\" is %s; "
		    "this test replaces it to set the script's time\n",
		    (int)n - 1, TIME_LINE,
		    at == NULL	      ? "gone" :
			again != NULL ? "there twice" :
					"not a whole line");
		exit(EXIT_FAILURE);
	}
	script_head = strndup(s, (size_t)(at - s));
	script_tail = strdup(at + n);
	if (script_head == NULL || script_tail == NULL) {
		fprintf(stderr, "out of memory\n");
		exit(EXIT_FAILURE);
	}
}

/* The script with its time fixed at now (microseconds).  Free it. */
static char *
script_at(int64_t now)
{
	char *text;

	if (asprintf(&text, "%slocal time = {'%" PRId64 "', '%" PRId64 "'}\n%s",
		script_head, now / 1000000, now % 1000000, script_tail) == -1)
		ck_abort_msg("out of memory");
	return text;
}

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
	char *text = script_at(now);
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
		if (sc->rules[r].alg == RL_ALG_CONCURRENCY)
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
	redisContext *c = h_redis_ctx(&redis);
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

/* --- fixtures and main -------------------------------------------------- */

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
	printf("%zu scenarios from %s\n", nscenarios, vec_path);
	free(script_head);
	free(script_tail);
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("vectors_redis");
	TCase *tc = tcase_create("redis");

	test_srcdir_path(VEC_FILE, vec_path, sizeof(vec_path));
	vec_load(vec_path);
	split_script();
	tcase_add_unchecked_fixture(tc, start_redis, h_reap_orphans);
	tcase_add_checked_fixture(tc, flush_redis, h_test_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_scenario, 0, (int)nscenarios);
	suite_add_tcase(s, tc);
	test_main_at_end(suite_done);
	return s;
}
