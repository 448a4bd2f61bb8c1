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

#include "backend.h"
#include "rules.h"

#define VEC_FILE "tests/vectors/algorithms.txt"
#define VEC_MAX_RULES 8
#define VEC_MAX_TOKENS (4 + 5 * VEC_MAX_RULES)

/* --- the vector file ---------------------------------------------------- */

struct vec_rule {
	enum rl_algorithm alg;
	int64_t limit;
	int64_t window_ms;
	bool shadow;
};

struct vec_result {
	bool allowed;
	int64_t remaining, reset_ms, retry_after_ms;
};

struct vec_step {
	int line;
	int64_t t;		/* microseconds after the scenario's epoch */
	int64_t cost;
	struct vec_result want[VEC_MAX_RULES];
};

struct vec_scenario {
	char name[64];
	int line;
	int64_t epoch;
	size_t nrules;
	struct vec_rule rules[VEC_MAX_RULES];
	size_t nsteps, cap;
	struct vec_step *steps;
};

static struct vec_scenario *scenarios;
static size_t nscenarios;
static char vec_path[1024];

static bool
parse_int(const char *s, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0')
		return false;
	*out = v;
	return true;
}

/* ALGORITHM LIMIT WINDOW_MS [shadow] from tok[0..n-1]; returns the number
 * of tokens used, or -1. */
static int
parse_rule(char **tok, int n, struct vec_rule *r)
{
	if (n < 3 || rl_algorithm_parse(tok[0], &r->alg) == -1 ||
	    !parse_int(tok[1], &r->limit) || !parse_int(tok[2],
	    &r->window_ms) || r->limit < 1 || r->window_ms < 1)
		return -1;
	r->shadow = n > 3 && strcmp(tok[3], "shadow") == 0;
	return r->shadow ? 4 : 3;
}

static int
parse_scenario(char **tok, int n, struct vec_scenario *sc)
{
	int used, k;

	if (n < 5 || strlen(tok[1]) >= sizeof(sc->name))
		return -1;
	strcpy(sc->name, tok[1]);
	if ((used = parse_rule(tok + 2, n - 2, &sc->rules[0])) == -1)
		return -1;
	sc->nrules = 1;
	k = 2 + used;
	if (k == n)
		return 0;
	if (k + 2 != n || strcmp(tok[k], "epoch") != 0 ||
	    !parse_int(tok[k + 1], &sc->epoch) || sc->epoch < 0)
		return -1;
	return 0;
}

/* T COST -> A R S Y [| A R S Y ...] */
static int
parse_step(char **tok, int n, const struct vec_scenario *sc,
    struct vec_step *st)
{
	int64_t v[4];
	size_t r;
	int k = 3, j;

	if (n < 3 || !parse_int(tok[0], &st->t) || st->t < 0 ||
	    !parse_int(tok[1], &st->cost) || st->cost < 0 ||
	    strcmp(tok[2], "->") != 0)
		return -1;
	for (r = 0; r < sc->nrules; r++) {
		if (r > 0 && (k >= n || strcmp(tok[k++], "|") != 0))
			return -1;
		for (j = 0; j < 4; j++)
			if (k >= n || !parse_int(tok[k++], &v[j]))
				return -1;
		if (v[0] != 0 && v[0] != 1)
			return -1;
		st->want[r].allowed = v[0] == 1;
		st->want[r].remaining = v[1];
		st->want[r].reset_ms = v[2];
		st->want[r].retry_after_ms = v[3];
	}
	return k == n ? 0 : -1;
}

/* Read the whole file into scenarios[]; on error print FILE:LINE and
 * exit 1 (a broken vector file is not a test failure to shrug off). */
static void
vec_load(const char *path)
{
	char line[1024], *tok[VEC_MAX_TOKENS], *p, *save;
	struct vec_scenario *sc = NULL;
	FILE *f;
	int lineno = 0, n;
	const char *what = NULL;

	if ((f = fopen(path, "r")) == NULL) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		exit(EXIT_FAILURE);
	}
	while (fgets(line, sizeof(line), f) != NULL) {
		lineno++;
		if ((p = strchr(line, '#')) != NULL)
			*p = '\0';
		n = 0;
		for (p = strtok_r(line, " \t\r\n", &save); p != NULL &&
		    n < VEC_MAX_TOKENS; p = strtok_r(NULL, " \t\r\n", &save))
			tok[n++] = p;
		if (n == 0)
			continue;
		if (strcmp(tok[0], "scenario") == 0) {
			scenarios = realloc(scenarios, (nscenarios + 1) *
			    sizeof(*scenarios));
			if (scenarios == NULL)
				goto oom;
			sc = &scenarios[nscenarios++];
			memset(sc, 0, sizeof(*sc));
			sc->line = lineno;
			if (parse_scenario(tok, n, sc) == -1) {
				what = "bad scenario line";
				goto bad;
			}
		} else if (strcmp(tok[0], "rule") == 0) {
			if (sc == NULL || sc->nsteps > 0 ||
			    sc->nrules == VEC_MAX_RULES ||
			    parse_rule(tok + 1, n - 1,
			    &sc->rules[sc->nrules]) != n - 1) {
				what = "bad rule line (or after a step)";
				goto bad;
			}
			sc->nrules++;
		} else {
			if (sc == NULL) {
				what = "a step before any scenario";
				goto bad;
			}
			if (sc->nsteps == sc->cap) {
				sc->cap = sc->cap == 0 ? 16 : 2 * sc->cap;
				sc->steps = realloc(sc->steps, sc->cap *
				    sizeof(*sc->steps));
				if (sc->steps == NULL)
					goto oom;
			}
			memset(&sc->steps[sc->nsteps], 0, sizeof(*sc->steps));
			sc->steps[sc->nsteps].line = lineno;
			if (parse_step(tok, n, sc,
			    &sc->steps[sc->nsteps]) == -1) {
				what = "bad step line";
				goto bad;
			}
			sc->nsteps++;
		}
	}
	fclose(f);
	if (nscenarios == 0) {
		fprintf(stderr, "%s: no scenarios\n", path);
		exit(EXIT_FAILURE);
	}
	return;
bad:
	fprintf(stderr, "%s:%d: %s\n", path, lineno, what);
	exit(EXIT_FAILURE);
oom:
	fprintf(stderr, "%s:%d: out of memory\n", path, lineno);
	exit(EXIT_FAILURE);
}

/* --- the runner --------------------------------------------------------- */

static int64_t fake_now;

static int64_t
fake_clock(void *arg)
{
	(void)arg;
	return fake_now;
}

START_TEST(test_scenario)
{
	const struct vec_scenario *sc = &scenarios[_i];
	struct rl_check checks[VEC_MAX_RULES];
	struct rl_result out[VEC_MAX_RULES];
	char keys[VEC_MAX_RULES][96], err[256];
	enum backend_error_kind kind;
	struct backend *b;
	bool all, want_all;
	size_t s, r;

	b = backend_memory_new(1000, fake_clock, NULL);
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
		want_all = true;
		for (r = 0; r < sc->nrules; r++) {
			checks[r].cost = st->cost;
			if (!sc->rules[r].shadow && !st->want[r].allowed)
				want_all = false;
		}
		all = !want_all;
		kind = BACKEND_ERR_NONE;
		err[0] = '\0';
		memset(out, 0xa5, sizeof(out));
		ck_assert_msg(backend_decide(b, checks, sc->nrules, out, &all,
		    &kind, err, sizeof(err)) == 0, "%s:%d (%s): decide: %s",
		    vec_path, st->line, sc->name, err);
		for (r = 0; r < sc->nrules; r++) {
			const struct vec_result *w = &st->want[r];

			ck_assert_msg(out[r].allowed == w->allowed &&
			    out[r].remaining == w->remaining &&
			    out[r].reset_ms == w->reset_ms &&
			    out[r].retry_after_ms == w->retry_after_ms,
			    "%s:%d (%s, rule %zu, %s): got %d %" PRId64
			    " %" PRId64 " %" PRId64 ", want %d %" PRId64
			    " %" PRId64 " %" PRId64, vec_path, st->line,
			    sc->name, r + 1,
			    rl_algorithm_name(sc->rules[r].alg),
			    (int)out[r].allowed, out[r].remaining,
			    out[r].reset_ms, out[r].retry_after_ms,
			    (int)w->allowed, w->remaining, w->reset_ms,
			    w->retry_after_ms);
		}
		ck_assert_msg(all == want_all, "%s:%d (%s): all_allowed %d, "
		    "want %d", vec_path, st->line, sc->name, (int)all,
		    (int)want_all);
	}
	backend_free(b);
}
END_TEST

int
main(void)
{
	const char *dir = getenv("RATELIMITD_SRCDIR");
	Suite *s = suite_create("vectors");
	TCase *tc = tcase_create("memory");
	SRunner *sr;
	int failed;

	snprintf(vec_path, sizeof(vec_path), "%s%s%s", dir != NULL ? dir : "",
	    dir != NULL ? "/" : "", VEC_FILE);
	vec_load(vec_path);
	tcase_add_loop_test(tc, test_scenario, 0, (int)nscenarios);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	printf("%zu scenarios from %s\n", nscenarios, vec_path);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
