/*
 * stats_request.c - POST /record and POST /stats without the HTTP (see
 * stats_request.h): which stats apply to a request, the op for each, and
 * the JSON answer.
 */
#include "core/stats_request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* The quantiles answered when the request names none: p50, p90, p99. */
static const double default_quantiles[] = { 0.5, 0.9, 0.99 };

const char *const stats_request_reserved[] = { "value", "stat", "quantiles",
	NULL };

/* "value": a finite JSON number. */
static int
parse_value(const json_t *fields, bool record, double *out,
    struct request_error *e)
{
	const json_t *v = json_object_get(fields, "value");

	if (!record) {
		if (v != NULL)
			return request_error_set(e, 400, "invalid_value",
			    "/stats records nothing: leave \"value\" out "
			    "(POST /record records)");
		return 0;
	}
	if (v == NULL || json_is_null(v))
		return request_error_set(e, 400, "invalid_value",
		    "\"value\" is required: the number to record");
	if (!json_is_number(v) || !isfinite(json_number_value(v)))
		return request_error_set(e, 400, "invalid_value",
		    "\"value\" must be a finite number");
	*out = json_number_value(v);
	return 0;
}

/* "quantiles": 1 .. RL_STATS_MAX_QUANTILES numbers in [0, 1]. */
static int
parse_quantiles(const json_t *fields, struct stats_request *sr,
    struct request_error *e)
{
	const json_t *v = json_object_get(fields, "quantiles"), *q;
	size_t i;

	if (v == NULL || json_is_null(v)) {
		memcpy(sr->quantiles, default_quantiles,
		    sizeof(default_quantiles));
		sr->nquantiles = sizeof(default_quantiles) /
		    sizeof(default_quantiles[0]);
		return 0;
	}
	if (!json_is_array(v) || json_array_size(v) == 0 ||
	    json_array_size(v) > RL_STATS_MAX_QUANTILES)
		return request_error_set(e, 400, "invalid_quantiles",
		    "\"quantiles\" must be an array of 1 to %d numbers in "
		    "[0, 1]",
		    RL_STATS_MAX_QUANTILES);
	json_array_foreach(v, i, q)
	{
		double x;
		size_t j;

		if (!json_is_number(q) ||
		    !(x = json_number_value(q), x >= 0 && x <= 1))
			return request_error_set(e, 400, "invalid_quantiles",
			    "\"quantiles\"[%zu] must be a number in [0, 1]", i);
		/* Each answers under its own name (p<percent>): one number
		 * twice (0 and -0 too) would give one name two values. */
		for (j = 0; j < i; j++)
			if (sr->quantiles[j] == x)
				return request_error_set(e, 400,
				    "invalid_quantiles",
				    "\"quantiles\"[%zu] "
				    "repeats \"quantiles\"[%zu]",
				    i, j);
		sr->quantiles[i] = x == 0 ? 0 : x;
	}
	sr->nquantiles = json_array_size(v);
	return 0;
}

/* The hash tag of a stat key on Redis (docs/stats.md "Keys on Redis"): the
 * rendered key k, with STAT_TAG_MARK in front when k is empty or begins with
 * '}' (the tag would be empty: Redis Cluster would hash each sub-window's
 * whole name, so one script would reach several slots) or with the mark
 * itself (so that the encoding stays one-to-one). */
#define STAT_TAG_MARK "~"

static bool
stat_tag_marked(const char *k)
{
	return k[0] == '\0' || k[0] == '}' || k[0] == STAT_TAG_MARK[0];
}

static int
oom(struct request_error *e)
{
	return request_error_set(e, 500, "internal_error", "out of memory");
}

/* Render sd's key for sr->attrs into slot i.  0; 1 when the stat does not
 * apply (an attribute is missing); -1 with *e. */
static int
add_stat(struct stats_request *sr, const struct config *cfg,
    const struct stat_def *sd, struct request_error *e)
{
	char rendered[RL_MAX_KEY_BYTES + 1];
	size_t n = 0, i = sr->n, klen;
	struct rl_stat_op *op;

	rendered[0] = '\0';
	if (sd->rule.key != NULL) {
		switch (template_render(sd->rule.key, &sr->attrs, rendered,
		    sizeof(rendered), &n)) {
		case RENDER_OK:
			break;
		case RENDER_MISSING:
			return 1;
		case RENDER_TOO_LONG:
			return request_error_set(e, 400, "key_too_long",
			    "the key of stat %s is longer than %d bytes",
			    sd->rule.name, RL_MAX_KEY_BYTES);
		}
	}
	klen = strlen(cfg->redis.key_prefix) + 5 + strlen(sd->rule.name) + 3 +
	    1 + n + 1;
	if ((sr->keys[i] = rl_strdup(rendered)) == NULL ||
	    (sr->store_keys[i] = rl_malloc(klen)) == NULL) {
		rl_free(sr->keys[i]);
		sr->keys[i] = NULL;
		return oom(e);
	}
	snprintf(sr->store_keys[i], klen, "%sstat:%s:{%s%s}",
	    cfg->redis.key_prefix, sd->rule.name,
	    stat_tag_marked(rendered) ? STAT_TAG_MARK : "", rendered);
	sr->defs[i] = sd;
	op = &sr->ops[i];
	op->key = sr->store_keys[i];
	op->keylen = strlen(sr->store_keys[i]);
	op->window_ms = sd->rule.window_ms;
	op->resolution_ms = sd->resolution_ms;
	op->accuracy = sd->accuracy;
	op->record = sr->record;
	op->value = sr->value;
	op->quantiles = sr->quantiles;
	op->nquantiles = sr->nquantiles;
	sr->calls[i].stat = op;
	sr->calls[i].stat_out = &sr->results[i];
	sr->n++;
	return 0;
}

int
stats_request_prepare(struct stats_request *sr, const struct config *cfg,
    const char *body, size_t len, bool record, struct request_error *e)
{
	const struct stat_def *forced = NULL;
	const char *name = NULL;
	json_t *fields = NULL;
	size_t i, max = cfg->nstats;
	int rc = -1, r;

	memset(sr, 0, sizeof(*sr));
	sr->record = record;
	if (request_json_parse_flags(body, len, stats_request_reserved,
		(size_t)cfg->max_attributes, &sr->attrs, &fields,
		REQUEST_JSON_BIG_INT_REAL, e) < 0)
		return -1;
	if (parse_value(fields, record, &sr->value, e) < 0 ||
	    parse_quantiles(fields, sr, e) < 0 ||
	    request_json_string(fields, "stat", "unknown_stat", &name, e) < 0)
		goto done;
	if (name != NULL) {
		if ((forced = config_find_stat(cfg, name)) == NULL) {
			request_error_set(e, 400, "unknown_stat",
			    "no stat named \"%s\"", name);
			goto done;
		}
		max = 1;
	}
	if (max > 0 &&
	    ((sr->defs = rl_calloc(max, sizeof(*sr->defs))) == NULL ||
		(sr->keys = rl_calloc(max, sizeof(*sr->keys))) == NULL ||
		(sr->store_keys = rl_calloc(max, sizeof(*sr->store_keys))) ==
		    NULL ||
		(sr->ops = rl_calloc(max, sizeof(*sr->ops))) == NULL ||
		(sr->results = rl_calloc(max, sizeof(*sr->results))) == NULL ||
		(sr->calls = rl_calloc(max, sizeof(*sr->calls))) == NULL)) {
		oom(e);
		goto done;
	}
	/* A forced stat skips match, as a forced rule does (docs/http.md). */
	for (i = 0; i < cfg->nstats; i++) {
		const struct stat_def *sd = &cfg->stats[i];

		if (forced != NULL ? sd != forced :
				     !rule_matches(&sd->rule, &sr->attrs))
			continue;
		if ((r = add_stat(sr, cfg, sd, e)) < 0)
			goto done;
	}
	rc = 0;
done:
	json_decref(fields);
	return rc;
}

/*
 * "p50", "p99.9", "p0", "p100", "p99.9999999999": q in percent, written
 * exactly.  The shortest decimal that reads back as q (so two quantiles
 * have the same name only if they are the same number), with the decimal
 * point moved two places by hand: q * 100 in floating point would round.
 */
void
stats_quantile_name(char *buf, size_t len, double q)
{
	char e[40], digits[24], out[STATS_QUANTILE_NAME_MAX];
	int prec, exp10, nd = 0, o = 0, i;
	const char *p;

	if (q == 0) { /* -0.0 too */
		snprintf(buf, len, "p0");
		return;
	}
	for (prec = 1; prec <= 17; prec++) {
		snprintf(e, sizeof(e), "%.*e", prec - 1, q);
		if (strtod(e, NULL) == q)
			break;
	}
	/* e is "d.ddde[+-]XX": its digits, and the exponent plus two. */
	for (p = e; *p != 'e' && *p != '\0'; p++)
		if (*p >= '0' && *p <= '9' && nd < (int)sizeof(digits) - 1)
			digits[nd++] = *p;
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	exp10 = (*p == 'e' ? atoi(p + 1) : 0) + 2;
	out[o++] = 'p';
	if (exp10 < 0) {
		out[o++] = '0';
		out[o++] = '.';
		/* q >= 5e-324: exp10 >= -322, so 2 + 321 + 17 digits fit */
		for (i = 0; i < -exp10 - 1 && o < (int)sizeof(out) - 24; i++)
			out[o++] = '0';
		for (i = 0; i < nd; i++)
			out[o++] = digits[i];
	} else {
		for (i = 0; i <= exp10 && o < (int)sizeof(out) - 24; i++)
			out[o++] = i < nd ? digits[i] : '0';
		if (nd > exp10 + 1) {
			out[o++] = '.';
			for (i = exp10 + 1; i < nd; i++)
				out[o++] = digits[i];
		}
	}
	out[o] = '\0';
	snprintf(buf, len, "%s", out);
}

/*
 * The text of a stat value (docs/stats.md "HTTP"): its shortest form, as
 * JavaScript and Python print numbers, within what printf offers.  jansson
 * writes every real of a dump with one precision, and 17 digits turn 41.7
 * into 41.700000000000003, so the answer is written here (answer_put_*)
 * rather than dumped.
 */
size_t
stats_number_text(char *buf, double x)
{
	char *ep, *from;
	size_t n = 0;
	int prec;

	if (!isfinite(x)) /* none comes from a store: JSON has no such number */
		return (size_t)snprintf(buf, STATS_NUMBER_MAX, "null");
	if (x == floor(x) && fabs(x) < 9007199254740992.0) { /* 2^53 */
		n = util_fmt_int64(buf, (int64_t)x);	     /* -0.0 is 0 */
		buf[n] = '\0';
		return n;
	}
	for (prec = 15; prec <= 17; prec++) {
		n = (size_t)snprintf(buf, STATS_NUMBER_MAX, "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	/* As jansson writes a real: "1e19" and "1e-7", not "1e+19" nor
	 * "1e-07"; a point when there is no exponent, so that the number
	 * still reads back as a real ("9007199254740994.0"). */
	if ((ep = strchr(buf, 'e')) != NULL) {
		ep += 1 + (ep[1] == '-');
		from = ep + (ep[0] == '+');
		while (from[0] == '0' && from[1] != '\0')
			from++;
		memmove(ep, from, strlen(from) + 1);
		n = strlen(buf);
	} else if (strchr(buf, '.') == NULL) {
		memcpy(buf + n, ".0", 3);
		n += 2;
	}
	return n;
}

/* s as a JSON string, escaped by jansson as in the daemon's other
 * answers.  s is valid UTF-8 (a stat's name, or a key rendered from
 * attributes jansson read); should jansson refuse it, the answer fails. */
static void
answer_put_string(struct util_buf *b, const char *s)
{
	json_t *j = json_string(s);
	char *text = j != NULL ? json_dumps(j, JSON_ENCODE_ANY) : NULL;

	if (text != NULL)
		util_buf_puts(b, text);
	else
		b->oom = true;
	free(text);
	json_decref(j);
}

/* ,"<name>": and x, or null when the window is empty.  name is a field
 * of ours or a quantile's name ("p99.9"): nothing to escape. */
static void
answer_put_number(struct util_buf *b, const char *name, bool empty, double x)
{
	char num[STATS_NUMBER_MAX];

	util_buf_puts(b, ",\"");
	util_buf_puts(b, name);
	util_buf_puts(b, "\":");
	if (empty)
		util_buf_puts(b, "null");
	else
		util_buf_add(b, num, stats_number_text(num, x));
}

char *
stats_request_answer(const struct stats_request *sr, size_t *len)
{
	struct util_buf b = { 0 };
	char qn[STATS_QUANTILE_NAME_MAX], num[UTIL_INT64_DEC_MAX];
	size_t i, j;

	util_buf_puts(&b, "{\"stats\":[");
	for (i = 0; i < sr->n; i++) {
		const struct rl_stat_result *r = &sr->results[i];
		bool empty = r->count == 0;

		util_buf_puts(&b, i > 0 ? ",{\"name\":" : "{\"name\":");
		answer_put_string(&b, sr->defs[i]->rule.name);
		util_buf_puts(&b, ",\"key\":");
		answer_put_string(&b, sr->keys[i]);
		util_buf_puts(&b, ",\"window_ms\":");
		util_buf_add(&b, num,
		    util_fmt_int64(num, sr->defs[i]->rule.window_ms));
		util_buf_puts(&b, ",\"count\":");
		util_buf_add(&b, num, util_fmt_int64(num, (int64_t)r->count));
		answer_put_number(&b, "sum", empty, r->sum);
		answer_put_number(&b, "avg", empty,
		    empty ? 0 : r->sum / (double)r->count);
		answer_put_number(&b, "min", empty, r->min);
		answer_put_number(&b, "max", empty, r->max);
		for (j = 0; j < sr->nquantiles; j++) {
			stats_quantile_name(qn, sizeof(qn), sr->quantiles[j]);
			answer_put_number(&b, qn, empty, r->q[j]);
		}
		util_buf_puts(&b, "}");
	}
	util_buf_puts(&b, "]}");
	if (b.oom) {
		rl_free(b.p);
		return NULL;
	}
	*len = b.len;
	return b.p;
}

void
stats_request_clear(struct stats_request *sr)
{
	size_t i;

	if (sr == NULL)
		return;
	for (i = 0; i < sr->n; i++) {
		rl_free(sr->keys[i]);
		rl_free(sr->store_keys[i]);
	}
	rl_free(sr->defs);
	rl_free(sr->keys);
	rl_free(sr->store_keys);
	rl_free(sr->ops);
	rl_free(sr->results);
	rl_free(sr->calls);
	attrs_clear(&sr->attrs);
	memset(sr, 0, sizeof(*sr));
}
