/*
 * check_vectors.c - the shared test vectors of tests/vectors/algorithms.txt
 * run through the in-process store (backend_memory_new with an injected
 * clock).  tests/integration/check_vectors_redis.c runs the same file
 * through lua/ratelimit.lua on a real redis-server; both passing is what
 * "the memory store and Redis give the same answers" means in practice.
 * The file's header comment defines its format.
 *
 * One Check test per scenario.  The file is read from
 * $RATELIMITD_SRCDIR/tests/vectors/algorithms.txt, or relative to the
 * current directory (make unit runs from the top of the tree).
 *
 * The parser below has a twin in check_vectors_redis.c (the unit and the
 * integration suites link separately); a format change must go to both,
 * and a drift between them fails one of the runners on the same file.
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

#include "core/backend.h"
#include "core/rules.h"

#include "../vectors/vectors.h"
#include "store/memory.h"

static int64_t fake_now;

/* The memory store completes a call inside submit. */
static void
call_done(struct backend_call *call)
{
	(void)call;
}

START_TEST(test_scenario)
{
	const struct vec_scenario *sc = &scenarios[_i];
	struct rl_check checks[VEC_MAX_RULES];
	struct rl_result out[VEC_MAX_RULES];
	int64_t over[VEC_MAX_RULES];
	char keys[VEC_MAX_RULES][96], token[40];
	struct backend_call call;
	struct backend *b;
	size_t s, r;

	b = backend_memory_new(1000, test_clock, &fake_now);
	ck_assert_ptr_nonnull(b);
	for (r = 0; r < sc->nrules; r++) {
		snprintf(keys[r], sizeof(keys[r]), "vec:%s:%zu", sc->name, r);
		memset(&checks[r], 0, sizeof(checks[r]));
		checks[r].algorithm = sc->rules[r].alg;
		checks[r].limit = sc->rules[r].limit;
		checks[r].window_ms = sc->rules[r].window_ms;
		checks[r].shadow = sc->rules[r].shadow;
		checks[r].key = keys[r];
		checks[r].keylen = strlen(keys[r]);
	}
	for (s = 0; s < sc->nsteps; s++) {
		const struct vec_step *st = &sc->steps[s];

		fake_now = sc->epoch + st->t;
		/* concurrency: a lease token of its own per step */
		snprintf(token, sizeof(token), "%032zx", s + 1);
		for (r = 0; r < sc->nrules; r++) {
			checks[r].cost = st->cost;
			checks[r].prefetch_want = r == 0 ? st->chunk_want : 0;
			checks[r].prefetch_hold_us = r == 0 ?
			    st->chunk_hold_us :
			    0;
			checks[r].token = sc->rules[r].alg ==
				    RL_ALG_CONCURRENCY &&
				!st->look ?
			    token :
			    NULL;
		}
		memset(out, 0xa5, sizeof(out));
		memset(over, 0xa5, sizeof(over));
		memset(&call, 0, sizeof(call));
		call.checks = checks;
		call.n = sc->nrules;
		call.out = out;
		call.wait_us = st->wait_us;
		call.report = st->report;
		call.overdrawn = over;
		call.done = call_done;
		call.all_allowed = !st->want_all;
		backend_submit(b, &call);
		ck_assert_msg(call.rc == 0, "%s:%d (%s): decide: %s", vec_path,
		    st->line, sc->name, call.err);
		for (r = 0; r < sc->nrules; r++) {
			const struct vec_result *w = &st->want[r];

			ck_assert_msg(vec_field_ok(w, 0, out[r].allowed) &&
				vec_field_ok(w, 1, out[r].remaining) &&
				vec_field_ok(w, 2, out[r].reset_ms) &&
				vec_field_ok(w, 3,
				    st->report ? over[r] :
						 out[r].retry_after_ms) &&
				vec_field_ok(w, 4, out[r].effective_ms),
			    "%s:%d (%s, rule %zu, %s): got %d %" PRId64
			    " %" PRId64 " %" PRId64 " t=%" PRId64
			    ", want %d %" PRId64 " %" PRId64 " %" PRId64
			    " t=%" PRId64,
			    vec_path, st->line, sc->name, r + 1,
			    rl_algorithm_name(sc->rules[r].alg),
			    (int)out[r].allowed, out[r].remaining,
			    out[r].reset_ms, out[r].retry_after_ms,
			    out[r].effective_ms, (int)w->allowed, w->remaining,
			    w->reset_ms, w->retry_after_ms, w->effective_ms);
		}
		ck_assert_msg(call.all_allowed == st->want_all,
		    "%s:%d (%s): "
		    "all_allowed %d, want %d",
		    vec_path, st->line, sc->name, (int)call.all_allowed,
		    (int)st->want_all);
		ck_assert_msg(st->chunk_want == 0 ||
			(out[0].taken == st->took &&
			    out[0].taken_us == st->took_us),
		    "%s:%d (%s): took %" PRId64 " %" PRId64 ", want %" PRId64
		    " %" PRId64,
		    vec_path, st->line, sc->name, out[0].taken, out[0].taken_us,
		    st->took, st->took_us);
		ck_assert_msg(call.waited_us == st->waited_us,
		    "%s:%d (%s): "
		    "waited %" PRId64 " us, want %" PRId64,
		    vec_path, st->line, sc->name, call.waited_us,
		    st->waited_us);
	}
	backend_free(b);
}
END_TEST

static void
say_scenarios(void)
{
	printf("%zu scenarios from %s\n", nscenarios, vec_path);
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("vectors");
	TCase *tc = tcase_create("memory");

	test_srcdir_path(VEC_FILE, vec_path, sizeof(vec_path));
	vec_load(vec_path);
	tcase_add_loop_test(tc, test_scenario, 0, (int)nscenarios);
	suite_add_tcase(s, tc);
	test_main_at_end(say_scenarios);
	return s;
}
