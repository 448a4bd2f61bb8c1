/*
 * redis_script.c - batches to EVALSHA arguments and replies to results,
 * as lua/ratelimit.lua's header defines them (see redis_script.h).
 */
#include "store/redis_script.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define ARGS_PER_CHECK	 5
#define FIELDS_PER_CHECK 5
/* An int64 in decimal, or a concurrency algorithm and its lease token, or
 * an algorithm asking for a chunk with its want and hold, and
 * a NUL. */
#define NUM_MAX 64

/* Put v (>= 0, as every argument is) in decimal at *num as argument k;
 * printf's machinery was a tenth of the daemon's time. */
static void
put_num(struct redis_script_args *a, size_t k, char **num, int64_t v)
{
	char tmp[NUM_MAX], *p = tmp + sizeof(tmp);
	uint64_t u = v < 0 ? 0 : (uint64_t)v;
	size_t n;

	do {
		*--p = (char)('0' + u % 10);
		u /= 10;
	} while (u != 0);
	n = (size_t)(tmp + sizeof(tmp) - p);
	memcpy(*num, p, n);
	(*num)[n] = '\0';
	a->argv[k] = *num;
	a->lens[k] = n;
	*num += NUM_MAX;
}

/* Does c take a chunk (docs/algorithms.md, "Taking quota in advance")? */
static bool
asks_chunk(const struct rl_check *c)
{
	return c->prefetch_want > 0 && c->cost > 0 &&
	    c->prefetch_want >= c->cost && c->prefetch_hold_us > 0 &&
	    c->algorithm != RL_ALG_CONCURRENCY;
}

/*
 * Make a's one allocation for argc arguments and nums numbers, and fill
 * its first three: EVALSHA sha nkeys.  Returns where the numbers go, or
 * NULL (out of memory, or too many arguments).
 */
static char *
args_start(struct redis_script_args *a, size_t argc, size_t nums,
    const char *sha, size_t nkeys)
{
	char *num;
	void *mem;
	size_t need;

	if (argc > (size_t)INT32_MAX / 2)
		return NULL;
	need = argc * (sizeof(char *) + sizeof(size_t)) + nums * NUM_MAX;
	mem = need <= sizeof(a->own) ? a->own.bytes : rl_malloc(need);
	if (mem == NULL)
		return NULL;
	a->argv = mem;
	a->lens = (size_t *)(a->argv + argc);
	num = (char *)(a->lens + argc);
	a->argc = (int)argc;
	a->argv[0] = "EVALSHA";
	a->lens[0] = 7;
	a->argv[1] = sha;
	a->lens[1] = strlen(sha);
	put_num(a, 2, &num, (int64_t)nkeys);
	return num;
}

/* The most checks a request may have to go in the 'same' form (its keys
 * are compared pair by pair). */
#define SAME_MAX_CHECKS 8

/* May check c stand at position j of a request of n checks in the 'same'
 * form, beside the first request's check c0 there? */
static bool
same_check(const struct rl_check *c, const struct rl_check *c0, size_t n)
{
	bool alg_ok = c->algorithm == RL_ALG_SLIDING_LOG ||
	    (n > 1 &&
		(c->algorithm == RL_ALG_FIXED_WINDOW ||
		    c->algorithm == RL_ALG_TOKEN_BUCKET));

	return alg_ok && !c->shadow && !asks_chunk(c) &&
	    c->algorithm == c0->algorithm && c->limit == c0->limit &&
	    c->window_ms == c0->window_ms && c->cost == c0->cost;
}

/*
 * Can the batch go as 'same' (lua/ratelimit.lua)?  Every call has the
 * first one's number of checks, each like the first call's at its place
 * (one rule's, or one set of rules'): one sliding_log check, or up to
 * SAME_MAX_CHECKS of sliding_log, fixed_window and token_bucket on keys
 * that differ; none shadow or taking a chunk; no call waits or reports.
 * Then the checks' five values go once instead of per key: Redis reads a
 * key per check instead of a key, a count and five values.
 */
static bool
all_same(struct backend_call *const *calls, size_t ncalls)
{
	const struct backend_call *c0 = calls[0], *c;
	size_t n = c0->n, i, j, k;

	if (n < 1 || n > SAME_MAX_CHECKS)
		return false;
	for (i = 0; i < ncalls; i++) {
		c = calls[i];
		if (c->n != n || c->report || c->wait_us > 0)
			return false;
		for (j = 0; j < n; j++) {
			if (!same_check(&c->checks[j], &c0->checks[j], n))
				return false;
			for (k = 0; k < j; k++)
				if (c->checks[k].keylen ==
					c->checks[j].keylen &&
				    memcmp(c->checks[k].key, c->checks[j].key,
					c->checks[j].keylen) == 0)
					return false;
		}
	}
	return true;
}

/* EVALSHA sha nkeys keys... [marks] same n (algorithm L window_ms cost 0)
 * x n: the first call's n checks stand for every call's (all_same()). */
static int
encode_same(struct backend_call *const *calls, size_t ncalls, const char *sha,
    bool marks, struct redis_script_args *a)
{
	const struct backend_call *c0 = calls[0];
	size_t n = c0->n, nkeys = ncalls * n, i, j, key = 3, arg;
	size_t argc = 3 + nkeys + (marks ? 1 : 0) + 2 + 5 * n;
	char *num;

	if ((num = args_start(a, argc, 2 + 4 * n, sha, nkeys)) == NULL)
		return -1;
	for (i = 0; i < ncalls; i++)
		for (j = 0; j < n; j++) {
			a->argv[key] = calls[i]->checks[j].key;
			a->lens[key++] = calls[i]->checks[j].keylen;
		}
	arg = key;
	if (marks) {
		a->argv[arg] = "marks";
		a->lens[arg++] = 5;
	}
	a->argv[arg] = "same";
	a->lens[arg++] = 4;
	put_num(a, arg++, &num, (int64_t)n);
	for (j = 0; j < n; j++) {
		const struct rl_check *c = &c0->checks[j];

		put_num(a, arg++, &num, (int64_t)c->algorithm);
		put_num(a, arg++, &num, c->limit);
		put_num(a, arg++, &num, c->window_ms);
		put_num(a, arg++, &num, c->cost);
		a->argv[arg] = "0"; /* not shadow */
		a->lens[arg++] = 1;
	}
	return 0;
}

int
redis_script_encode(struct backend_call *const *calls, size_t ncalls,
    const char *sha, bool marks, struct redis_script_args *a)
{
	size_t nkeys = 0, argc, nums, i, j, k, key, arg;
	bool chunks = false;
	char *num;

	if (ncalls > 0 && all_same(calls, ncalls))
		return encode_same(calls, ncalls, sha, marks, a);
	for (i = 0; i < ncalls; i++) {
		nkeys += calls[i]->n;
		for (j = 0; j < calls[i]->n; j++)
			if (asks_chunk(&calls[i]->checks[j]))
				chunks = true;
	}
	/* EVALSHA sha nkeys, keys, [marks], [chunks], R, counts, 5 per
	 * check */
	argc = 3 + nkeys + (marks ? 1 : 0) + (chunks ? 1 : 0) + 1 + ncalls +
	    nkeys * ARGS_PER_CHECK;
	nums = 2 + ncalls + nkeys * ARGS_PER_CHECK;
	if (ncalls == 0 ||
	    (num = args_start(a, argc, nums, sha, nkeys)) == NULL)
		return -1;
	arg = 3 + nkeys;
	if (marks) {
		a->argv[arg] = "marks";
		a->lens[arg++] = 5;
	}
	if (chunks) {
		a->argv[arg] = "chunks";
		a->lens[arg++] = 6;
	}
	put_num(a, arg++, &num, (int64_t)ncalls);
	for (i = 0; i < ncalls; i++) {
		if (calls[i]->report) {
			/* "<count>:r": a report (docs/algorithms.md) */
			snprintf(num, NUM_MAX, "%zu:r", calls[i]->n);
			a->argv[arg] = num;
			a->lens[arg++] = strlen(num);
			num += NUM_MAX;
		} else if (calls[i]->wait_us > 0) {
			/* "<count>:<wait_us>": wait for a turn
			 * (docs/waiting.md) */
			snprintf(num, NUM_MAX, "%zu:%lld", calls[i]->n,
			    (long long)calls[i]->wait_us);
			a->argv[arg] = num;
			a->lens[arg++] = strlen(num);
			num += NUM_MAX;
		} else {
			put_num(a, arg++, &num, (int64_t)calls[i]->n);
		}
	}
	key = 3;
	for (i = 0; i < ncalls; i++) {
		for (j = 0; j < calls[i]->n; j++) {
			const struct rl_check *c = &calls[i]->checks[j];

			a->argv[key] = c->key;
			a->lens[key++] = c->keylen;
			k = arg;
			if (c->algorithm == RL_ALG_CONCURRENCY) {
				/* "4:<token>": the lease this call takes;
				 * "4": a look that takes none */
				if (c->token != NULL)
					snprintf(num, NUM_MAX, "%d:%.32s",
					    (int)c->algorithm, c->token);
				else
					snprintf(num, NUM_MAX, "%d",
					    (int)c->algorithm);
				a->argv[k] = num;
				a->lens[k++] = strlen(num);
				num += NUM_MAX;
			} else if (asks_chunk(c)) {
				/* "<alg>+<want>+<hold_us>": take a chunk
				 * (docs/algorithms.md, "Taking quota in
				 * advance") */
				snprintf(num, NUM_MAX, "%d+%lld+%lld",
				    (int)c->algorithm,
				    (long long)c->prefetch_want,
				    (long long)c->prefetch_hold_us);
				a->argv[k] = num;
				a->lens[k++] = strlen(num);
				num += NUM_MAX;
			} else
				put_num(a, k++, &num, (int64_t)c->algorithm);
			put_num(a, k++, &num, c->limit);
			put_num(a, k++, &num, c->window_ms);
			put_num(a, k++, &num, c->cost);
			put_num(a, k++, &num, c->shadow ? 1 : 0);
			arg = k;
		}
	}
	return 0;
}

void
redis_script_args_free(struct redis_script_args *a)
{
	if ((void *)a->argv != (void *)a->own.bytes)
		rl_free(a->argv);
	a->argv = NULL;
}

/* Is element i of a reply with 'chunks' one of a check's two chunk fields
 * (taken, valid_us), which must be integers? */
static bool
chunk_field(const size_t *counts, size_t ncalls, size_t fields, size_t i)
{
	size_t at = 0, k, j;

	if (fields < FIELDS_PER_CHECK + 3)
		return false; /* no chunk fields */
	for (k = 0; k < ncalls; k++) {
		if (i < at + 1 + counts[k] * fields) {
			if (i == at)
				return false;
			j = (i - at - 1) % fields;
			return j >= fields - 2;
		}
		at += 1 + counts[k] * fields;
	}
	return false;
}

int
redis_script_decode(const redisReply *r, struct backend_call *const *calls,
    const size_t *counts, size_t ncalls, bool marks, char *err, size_t errlen)
{
	size_t fields = FIELDS_PER_CHECK + (marks ? 1 : 0);
	size_t want = 0, nchecks = 0, i, j, at;
	bool chunks = false;
	char *end;

	if (r->type == REDIS_REPLY_ERROR) {
		snprintf(err, errlen, "script: %s", r->str);
		return -1;
	}
	for (i = 0; i < ncalls; i++) {
		want += 1 + counts[i] * fields;
		nchecks += counts[i];
	}
	/* With 'chunks', two more fields per check (taken, valid_us); the
	 * batch's length tells, as a NULL call's checks are not known. */
	if (r->type == REDIS_REPLY_ARRAY && r->elements == want + 2 * nchecks) {
		chunks = true;
		fields += 2;
		want += 2 * nchecks;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements != want) {
		snprintf(err, errlen,
		    "script: unexpected reply (type %d, %zu "
		    "elements, expected %zu)",
		    r->type,
		    r->type == REDIS_REPLY_ARRAY ? r->elements : (size_t)0,
		    want);
		return -1;
	}
	for (i = 0, at = 0; i < ncalls; i++) {
		/* Marks are strings (a double for token_bucket). */
		for (j = 0; marks && j < counts[i]; j++) {
			const redisReply *m =
			    r->element[at + j * fields + FIELDS_PER_CHECK + 1];

			if (m->type != REDIS_REPLY_STRING || m->len == 0 ||
			    (strtod(m->str, &end), *end != '\0')) {
				snprintf(err, errlen,
				    "script: a mark is not "
				    "a number");
				return -1;
			}
		}
		at += 1 + counts[i] * fields;
	}
	for (i = 0; i < r->elements; i++) {
		if (r->element[i]->type == REDIS_REPLY_STRING && marks &&
		    !chunk_field(counts, ncalls, fields, i))
			continue; /* checked above, by position */
		if (r->element[i]->type != REDIS_REPLY_INTEGER ||
		    r->element[i]->integer < 0) {
			snprintf(err, errlen,
			    "script: element %zu is not a "
			    "non-negative integer",
			    i);
			return -1;
		}
	}
	for (i = 0, at = 0; i < ncalls; i++) {
		struct backend_call *c = calls[i];
		redisReply **e = r->element + at;

		at += 1 + counts[i] * fields;
		if (c == NULL)
			continue;
		/* 1 + the microseconds to its turn when it waits */
		c->all_allowed = e[0]->integer >= 1;
		c->waited_us = e[0]->integer > 1 ? e[0]->integer - 1 : 0;
		for (j = 0; j < counts[i]; j++, e += fields) {
			c->out[j].allowed = e[1]->integer == 1;
			c->out[j].remaining = e[2]->integer;
			c->out[j].reset_ms = e[3]->integer;
			/* a report answers how far past, never a retry */
			c->out[j].retry_after_ms = c->report ? 0 :
							       e[4]->integer;
			if (c->report && c->overdrawn != NULL)
				c->overdrawn[j] = e[4]->integer;
			c->out[j].effective_ms = e[5]->integer;
			c->out[j].mark = marks ? strtod(e[6]->str, NULL) : 0;
			c->out[j].taken = chunks ? e[fields - 1]->integer : 0;
			c->out[j].taken_us = chunks ? e[fields]->integer : 0;
		}
	}
	return 0;
}

/* ---- stats.lua --------------------------------------------------------- */

#define STATS_NUM 32 /* bytes for one number argument */

int
redis_stats_encode(const struct rl_stat_op *op, const char *script,
    const char *sha, struct redis_stats_args *a)
{
	size_t argc = 9 + op->nquantiles, i;
	char *nums;

	a->argv = NULL;
	a->lens = NULL;
	a->argc = 0;
	/* argv, lens and the numbers in one block. */
	a->argv = rl_calloc(1,
	    argc * (sizeof(*a->argv) + sizeof(*a->lens)) +
		(5 + op->nquantiles) * STATS_NUM);
	if (a->argv == NULL)
		return -1;
	a->lens = (size_t *)(void *)(a->argv + argc);
	nums = (char *)(a->lens + argc);
	a->argv[0] = script != NULL ? "EVAL" : "EVALSHA";
	a->argv[1] = script != NULL ? script : sha;
	a->argv[2] = "1";
	a->argv[3] = op->key;
	a->lens[3] = op->keylen;
	snprintf(nums, STATS_NUM, "%" PRId64, op->window_ms);
	snprintf(nums + STATS_NUM, STATS_NUM, "%" PRId64, op->resolution_ms);
	snprintf(nums + 2 * STATS_NUM, STATS_NUM, "%.17g", op->accuracy);
	snprintf(nums + 3 * STATS_NUM, STATS_NUM, "%d", op->record ? 1 : 0);
	snprintf(nums + 4 * STATS_NUM, STATS_NUM, "%.17g",
	    op->record ? op->value : 0.0);
	for (i = 0; i < op->nquantiles; i++)
		snprintf(nums + (5 + i) * STATS_NUM, STATS_NUM, "%.17g",
		    op->quantiles[i]);
	for (i = 0; i < 5 + op->nquantiles; i++)
		a->argv[4 + i] = nums + i * STATS_NUM;
	for (i = 0; i < argc; i++)
		if (i != 3)
			a->lens[i] = strlen(a->argv[i]);
	a->argc = (int)argc;
	return 0;
}

void
redis_stats_args_free(struct redis_stats_args *a)
{
	rl_free(a->argv);
	a->argv = NULL;
	a->lens = NULL;
	a->argc = 0;
}

/* A reply element that is a number in a string, into *out. */
static int
stats_number(const redisReply *e, double *out)
{
	char buf[64], *end;

	if (e->type != REDIS_REPLY_STRING || e->len == 0 ||
	    e->len >= sizeof(buf))
		return -1;
	memcpy(buf, e->str, e->len);
	buf[e->len] = '\0';
	*out = strtod(buf, &end);
	return *end == '\0' && isfinite(*out) ? 0 : -1;
}

int
redis_stats_decode(const redisReply *r, const struct rl_stat_op *op,
    struct rl_stat_result *out, char *err, size_t errlen)
{
	struct rl_stat_result res;
	double count, *fields[3] = { &res.sum, &res.min, &res.max };
	size_t i;

	memset(&res, 0, sizeof(res));
	if (r->type == REDIS_REPLY_ERROR) {
		snprintf(err, errlen, "stats script: %.*s", (int)r->len,
		    r->str);
		return -1;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
	    stats_number(r->element[0], &count) < 0 || count < 0)
		goto bad;
	if (count > 0) {
		if (r->elements != 4 + op->nquantiles)
			goto bad;
		for (i = 0; i < 3; i++)
			if (stats_number(r->element[1 + i], fields[i]) < 0)
				goto bad;
		for (i = 0; i < op->nquantiles; i++)
			if (stats_number(r->element[4 + i], &res.q[i]) < 0)
				goto bad;
	}
	res.count = (uint64_t)count;
	*out = res;
	return 0;
bad:
	snprintf(err, errlen, "stats script: unexpected reply");
	return -1;
}
