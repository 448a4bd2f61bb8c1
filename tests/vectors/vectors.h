/*
 * vectors.h - the reader of tests/vectors/algorithms.txt, shared by the two
 * runners of the same vectors: tests/unit/check_vectors.c (the in-process
 * store, injected clock) and tests/integration/check_vectors_redis.c (the
 * Lua script on a real redis-server).  Test code only, included once per
 * test binary, so its functions are static.
 */
#ifndef RL_TESTS_VECTORS_H
#define RL_TESTS_VECTORS_H

#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rules.h"

#define VEC_FILE       "tests/vectors/algorithms.txt"
#define VEC_MAX_RULES  8
#define VEC_MAX_TOKENS (10 + 5 * VEC_MAX_RULES)

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
	int64_t effective_ms; /* `t=MS`; unchecked (skip bit 4) if absent */
	unsigned skip;	      /* bit j: field j is '-', not checked */
};

struct vec_step {
	int line;
	int64_t t; /* microseconds after the scenario's epoch */
	int64_t cost;
	int64_t wait_us;   /* docs/waiting.md: 0 answers now */
	int64_t waited_us; /* the reservation's distance, or 0 */
	/* docs/algorithms.md, "Taking quota in advance": the first rule
	 * asks for a chunk of up to chunk_want units held chunk_hold_us
	 * (0: no chunk), and took / took_us are what it must get. */
	int64_t chunk_want, chunk_hold_us, took, took_us;
	bool report;   /* POST /report: records past the limit; the
			* fourth field is overdrawn, not the retry */
	bool look;     /* concurrency checks carry no token: they look
			* and are denied (docs/leases.md, queued) */
	bool want_all; /* every non-shadow rule admits, or waited */
	struct vec_result want[VEC_MAX_RULES];
};

/* Does a field match its expected value (or is it not checked)? */
static bool
vec_field_ok(const struct vec_result *w, int j, int64_t got)
{
	const int64_t want[5] = { w->allowed ? 1 : 0, w->remaining, w->reset_ms,
		w->retry_after_ms, w->effective_ms };

	return (w->skip & (1u << j)) != 0 || got == want[j];
}

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
	    !parse_int(tok[1], &r->limit) ||
	    !parse_int(tok[2], &r->window_ms) || r->limit < 1 ||
	    r->window_ms < 1)
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

/* T COST [wait W | report] [look] [chunk WANT HOLD_US] -> A R S Y [t=E]
 * [| A R S Y [t=E] ...] [waited X] [took K VALID_US] */
static int
parse_step(char **tok, int n, const struct vec_scenario *sc,
    struct vec_step *st)
{
	int64_t v[4];
	size_t r;
	int k = 2, j;

	if (n < 3 || !parse_int(tok[0], &st->t) || st->t < 0 ||
	    !parse_int(tok[1], &st->cost) || st->cost < 0)
		return -1;
	if (k + 1 < n && strcmp(tok[k], "wait") == 0) {
		if (!parse_int(tok[k + 1], &st->wait_us) || st->wait_us < 1)
			return -1;
		k += 2;
	} else if (k < n && strcmp(tok[k], "report") == 0) {
		st->report = true;
		k++;
	}
	if (k < n && strcmp(tok[k], "look") == 0) {
		st->look = true;
		k++;
	}
	if (k + 2 < n && strcmp(tok[k], "chunk") == 0) {
		if (!parse_int(tok[k + 1], &st->chunk_want) ||
		    !parse_int(tok[k + 2], &st->chunk_hold_us) ||
		    st->chunk_want < st->cost || st->cost < 1 ||
		    st->chunk_hold_us < 1)
			return -1;
		k += 3;
	}
	if (k >= n || strcmp(tok[k++], "->") != 0)
		return -1;
	st->want_all = true;
	for (r = 0; r < sc->nrules; r++) {
		if (r > 0 && (k >= n || strcmp(tok[k++], "|") != 0))
			return -1;
		st->want[r].skip = 0;
		for (j = 0; j < 4; j++) {
			if (k < n && strcmp(tok[k], "-") == 0) {
				st->want[r].skip |= 1u << j;
				v[j] = 0;
				k++;
			} else if (k >= n || !parse_int(tok[k++], &v[j]))
				return -1;
		}
		if (v[0] != 0 && v[0] != 1)
			return -1;
		st->want[r].allowed = v[0] == 1;
		st->want[r].remaining = v[1];
		st->want[r].reset_ms = v[2];
		st->want[r].retry_after_ms = v[3];
		if (k < n && strncmp(tok[k], "t=", 2) == 0) {
			if (!parse_int(tok[k] + 2, &st->want[r].effective_ms) ||
			    st->want[r].effective_ms < 0)
				return -1;
			k++;
		} else
			st->want[r].skip |= 1u << 4;
		if (!sc->rules[r].shadow && (st->want[r].skip & 1) == 0 &&
		    !st->want[r].allowed)
			st->want_all = false;
	}
	if (k + 1 < n && strcmp(tok[k], "waited") == 0) {
		if (st->wait_us == 0 ||
		    !parse_int(tok[k + 1], &st->waited_us) ||
		    st->waited_us < 1 || st->waited_us > st->wait_us)
			return -1;
		k += 2;
	}
	if (k + 2 < n && strcmp(tok[k], "took") == 0) {
		if (st->chunk_want == 0 || !parse_int(tok[k + 1], &st->took) ||
		    !parse_int(tok[k + 2], &st->took_us))
			return -1;
		k += 3;
	} else if (st->chunk_want > 0)
		return -1; /* a chunk step says what it took */
	/* An allowed unchecked without a reservation says nothing. */
	for (r = 0; r < sc->nrules; r++)
		if ((st->want[r].skip & 1) != 0 && st->waited_us == 0)
			return -1;
	if (st->waited_us > 0)
		st->want_all = true;
	/* A report is never denied. */
	if (st->report && !st->want_all)
		return -1;
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
		for (p = strtok_r(line, " \t\r\n", &save);
		     p != NULL && n < VEC_MAX_TOKENS;
		     p = strtok_r(NULL, " \t\r\n", &save))
			tok[n++] = p;
		if (n == 0)
			continue;
		if (strcmp(tok[0], "scenario") == 0) {
			scenarios = realloc(scenarios,
			    (nscenarios + 1) * sizeof(*scenarios));
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
				sc->steps = realloc(sc->steps,
				    sc->cap * sizeof(*sc->steps));
				if (sc->steps == NULL)
					goto oom;
			}
			memset(&sc->steps[sc->nsteps], 0, sizeof(*sc->steps));
			sc->steps[sc->nsteps].line = lineno;
			if (parse_step(tok, n, sc, &sc->steps[sc->nsteps]) ==
			    -1) {
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

#endif
