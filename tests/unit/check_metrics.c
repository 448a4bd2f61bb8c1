/*
 * check_metrics.c - unit tests for metrics.c: every family moves when its
 * recording function is called, the histogram is cumulative and agrees with
 * its count, label values are escaped, totals are exact under concurrency,
 * NULL is a no-op, OOM fails cleanly, and the document is valid exposition
 * format (checked here by a small structural validator, and by
 * `promtool check metrics` when promtool is installed).
 *
 * The tests read the rendered text only, line by line, the way a scraper
 * would; they know nothing of metrics.c's internals.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"

#include "base/metrics.h"
#include "base/util.h"

#ifndef RL_VERSION
#define RL_VERSION "unknown"
#endif

#define MAX_RULES 10000 /* METRICS_MAX_RULES in metrics.c */

/* ---- helpers -------------------------------------------------------- */

/* Render m, check the document's shape, and return it (caller rl_frees). */
static char *render(struct metrics *m);

/*
 * The value of the one sample line "<series> <value>" in text, where series
 * is the metric name with its labels exactly as rendered; NULL if there is
 * none.  Fails the test if there are several.  Returns a static buffer.
 */
static const char *
sample(const char *text, const char *series)
{
	static char val[128];
	size_t n = strlen(series), vlen;
	const char *p = text, *eol, *found = NULL;

	for (; *p != '\0'; p = *eol == '\0' ? eol : eol + 1) {
		eol = strchr(p, '\n');
		if (eol == NULL)
			eol = p + strlen(p);
		if ((size_t)(eol - p) > n && strncmp(p, series, n) == 0 &&
		    p[n] == ' ') {
			ck_assert_msg(found == NULL, "duplicate series %s",
			    series);
			found = p + n + 1;
			vlen = (size_t)(eol - found);
			ck_assert_uint_lt(vlen, sizeof(val));
			memcpy(val, found, vlen);
			val[vlen] = '\0';
		}
	}
	return found != NULL ? val : NULL;
}

/* Like sample(), for a value that must be present and an integer. */
static unsigned long long
sample_u64(const char *text, const char *series)
{
	const char *v = sample(text, series);
	char *end;
	unsigned long long n;

	ck_assert_msg(v != NULL, "no sample for %s", series);
	n = strtoull(v, &end, 10);
	ck_assert_msg(*v != '\0' && *end == '\0', "%s: not an integer: %s",
	    series, v);
	return n;
}

/* Number of lines in text that start with prefix. */
static size_t
count_lines(const char *text, const char *prefix)
{
	size_t n = 0, plen = strlen(prefix);
	const char *p = text;

	while (p != NULL && *p != '\0') {
		if (strncmp(p, prefix, plen) == 0)
			n++;
		p = strchr(p, '\n');
		if (p != NULL)
			p++;
	}
	return n;
}

static bool
has_suffix(const char *s, size_t len, const char *suffix)
{
	size_t sl = strlen(suffix);

	return len >= sl && memcmp(s + len - sl, suffix, sl) == 0;
}

/*
 * A structural check of the exposition format, independent of promtool:
 * the text is NUL-terminated at len and ends in a newline; every family
 * has "# HELP" then "# TYPE" before its samples; every sample belongs to
 * the current family (histograms: _bucket, _sum, _count); no family
 * appears twice.
 */
static void
check_document(const char *text, size_t len)
{
	char family[128] = "", type[32] = "", seen[4096] = " ";
	const char *p = text, *eol, *sp;
	size_t nlen;
	bool help = false;

	ck_assert_uint_eq(strlen(text), len);
	ck_assert_uint_gt(len, 0);
	ck_assert_int_eq(text[len - 1], '\n');
	for (; *p != '\0'; p = eol + 1) {
		eol = strchr(p, '\n');
		ck_assert_ptr_nonnull(eol);
		ck_assert_msg(eol > p, "empty line");
		if (strncmp(p, "# HELP ", 7) == 0) {
			sp = strchr(p + 7, ' ');
			ck_assert_msg(sp != NULL && sp < eol, "bad HELP");
			nlen = (size_t)(sp - (p + 7));
			ck_assert_uint_lt(nlen, sizeof(family) - 2);
			memcpy(family, p + 7, nlen);
			family[nlen] = '\0';
			/* " name " must not be in seen yet. */
			ck_assert_uint_lt(strlen(seen) + nlen + 2,
			    sizeof(seen));
			strcat(family, " ");
			ck_assert_msg(strstr(seen, family) == NULL,
			    "family twice: %s", family);
			strcat(seen, family);
			family[nlen] = '\0';
			help = true;
			type[0] = '\0';
			continue;
		}
		if (strncmp(p, "# TYPE ", 7) == 0) {
			nlen = strlen(family);
			ck_assert_msg(help &&
				strncmp(p + 7, family, nlen) == 0 &&
				p[7 + nlen] == ' ',
			    "TYPE not after its HELP");
			sp = p + 7 + nlen + 1;
			ck_assert_uint_lt((size_t)(eol - sp), sizeof(type));
			memcpy(type, sp, (size_t)(eol - sp));
			type[eol - sp] = '\0';
			ck_assert_msg(strcmp(type, "counter") == 0 ||
				strcmp(type, "gauge") == 0 ||
				strcmp(type, "histogram") == 0,
			    "type %s", type);
			continue;
		}
		ck_assert_msg(*p != '#', "stray comment");
		ck_assert_msg(type[0] != '\0', "sample before TYPE");
		/* The metric name ends at '{' or ' '. */
		for (sp = p; sp < eol && *sp != '{' && *sp != ' '; sp++)
			;
		nlen = strlen(family);
		if (strcmp(type, "histogram") == 0)
			ck_assert_msg((size_t)(sp - p) > nlen &&
				strncmp(p, family, nlen) == 0 &&
				(has_suffix(p, (size_t)(sp - p), "_bucket") ||
				    has_suffix(p, (size_t)(sp - p), "_sum") ||
				    has_suffix(p, (size_t)(sp - p), "_count")),
			    "sample %.*s outside %s", (int)(eol - p), p,
			    family);
		else
			ck_assert_msg((size_t)(sp - p) == nlen &&
				strncmp(p, family, nlen) == 0,
			    "sample %.*s outside %s", (int)(eol - p), p,
			    family);
	}
}

static char *
render(struct metrics *m)
{
	char *text = NULL;
	size_t len = 0;

	ck_assert_int_eq(metrics_render(m, &text, &len), 0);
	ck_assert_ptr_nonnull(text);
	check_document(text, len);
	return text;
}

static void
decide_n(struct metrics *m, const char *name, enum metrics_outcome res, int n)
{
	while (n-- > 0)
		metrics_decision(m, METRICS_HTTP, name, res);
}

/* ---- tests ---------------------------------------------------------- */

START_TEST(test_new_free)
{
	struct metrics *m = metrics_new();

	ck_assert_ptr_nonnull(m);
	metrics_free(m);
	metrics_free(NULL);
}
END_TEST

START_TEST(test_fresh_document)
{
	struct metrics *m = metrics_new();
	char *text, line[256];
	const char *v;
	double start;
	int64_t now = util_realtime_us();

	text = render(m);
	snprintf(line, sizeof(line), "ratelimitd_build_info{version=\"%s\"}",
	    RL_VERSION);
	ck_assert_uint_eq(sample_u64(text, line), 1);
	v = sample(text, "ratelimitd_start_time_seconds");
	ck_assert_ptr_nonnull(v);
	start = strtod(v, NULL);
	ck_assert_msg(start > (double)now / 1e6 - 60 &&
		start <= (double)now / 1e6 + 1,
	    "start time %s", v);
	ck_assert_uint_eq(sample_u64(text,
			      "ratelimitd_config_last_reload_success"),
	    1);
	ck_assert_uint_eq(
	    sample_u64(text,
		"ratelimitd_config_reloads_total{result=\"success\"}"),
	    0);
	ck_assert_uint_eq(sample_u64(text, "ratelimitd_redis_pool_in_use"), 0);
	/* No rule seen, no HTTP response sent: families without samples. */
	ck_assert_uint_eq(count_lines(text, "ratelimitd_decisions_total"), 0);
	ck_assert_uint_eq(count_lines(text,
			      "# TYPE ratelimitd_decisions_total "
			      "counter"),
	    1);
	ck_assert_uint_eq(count_lines(text, "ratelimitd_http_responses_total"),
	    0);
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_decisions_counted)
{
	struct metrics *m = metrics_new();
	char *text;

	decide_n(m, "api", METRICS_ALLOWED, 3);
	decide_n(m, "api", METRICS_DENIED, 2);
	decide_n(m, "login", METRICS_SHADOW_DENIED, 1);
	decide_n(m, "login", METRICS_DEGRADED, 4);
	decide_n(m, "login", METRICS_ERROR, 5);
	decide_n(m, "login", (enum metrics_outcome)99, 1); /* ignored */
	text = render(m);
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"allowed\",protocol=\"http\"}"),
	    "3");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"denied\",protocol=\"http\"}"),
	    "2");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"shadow_denied\",protocol=\"http\"}"),
	    "0");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_decisions_total"
			     "{rule=\"login\",result=\"shadow_denied\","
			     "protocol=\"http\"}"),
	    "1");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"login\",result=\"degraded\",protocol=\"http\"}"),
	    "4");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"login\",result=\"error\",protocol=\"http\"}"),
	    "5");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"login\",result=\"allowed\",protocol=\"http\"}"),
	    "0");
	/* Two rules, five results each. */
	ck_assert_uint_eq(count_lines(text, "ratelimitd_decisions_total{"), 10);
	rl_free(text);
	metrics_free(m);
}
END_TEST

/* The gRPC series: none until its front end is on, then a protocol of
 * its own beside HTTP's, and its status codes by name. */
/* docs/algorithms.md, "Taking quota in advance": only rules that took
 * quota in advance get series. */
START_TEST(test_prefetch_units)
{
	struct metrics *m = metrics_new();
	char *text;

	decide_n(m, "plain", METRICS_ALLOWED, 1);
	metrics_prefetch(m, "hot", METRICS_PREFETCH_TAKEN, 12);
	metrics_prefetch(m, "hot", METRICS_PREFETCH_TAKEN, 10);
	metrics_prefetch(m, "hot", METRICS_PREFETCH_USED, 20);
	metrics_prefetch(m, "hot", METRICS_PREFETCH_LOST, 2);
	metrics_prefetch(m, "hot", (enum metrics_prefetch)9, 1); /* ignored */
	text = render(m);
	ck_assert_str_eq(sample(text,
			     "ratelimitd_prefetch_units_total"
			     "{rule=\"hot\",event=\"taken\"}"),
	    "22");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_prefetch_units_total"
			     "{rule=\"hot\",event=\"used\"}"),
	    "20");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_prefetch_units_total"
			     "{rule=\"hot\",event=\"lost\"}"),
	    "2");
	ck_assert_ptr_null(strstr(text, "{rule=\"plain\",event="));
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_grpc_series)
{
	struct metrics *m = metrics_new();
	const char *r = "api";
	char *text;

	decide_n(m, "api", METRICS_ALLOWED, 2);
	metrics_decision(m, METRICS_GRPC, r, METRICS_DENIED);
	metrics_grpc_response(m, 14);
	text = render(m);
	ck_assert_uint_eq(count_lines(text, "ratelimitd_decisions_total{"), 5);
	ck_assert_ptr_null(strstr(text, "protocol=\"grpc\""));
	ck_assert_ptr_null(strstr(text, "ratelimitd_grpc_responses_total"));
	rl_free(text);

	metrics_set_grpc(m);
	metrics_decision(m, METRICS_GRPC, r, METRICS_DENIED);
	metrics_grpc_response(m, 0);
	metrics_grpc_response(m, 99); /* ignored */
	text = render(m);
	ck_assert_uint_eq(count_lines(text, "ratelimitd_decisions_total{"), 10);
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"allowed\",protocol=\"http\"}"),
	    "2");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"denied\",protocol=\"grpc\"}"),
	    "2");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"allowed\",protocol=\"grpc\"}"),
	    "0");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_grpc_responses_total"
			     "{code=\"OK\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_grpc_responses_total"
			     "{code=\"UNAVAILABLE\"}"),
	    "1");
	ck_assert_uint_eq(count_lines(text, "ratelimitd_grpc_responses_total{"),
	    2);
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_reload_keeps_counts_by_name)
{
	struct metrics *m = metrics_new();
	char *a = rl_strdup("api");
	char *b = rl_strdup("api"); /* after a reload */
	char *text;

	metrics_decision(m, METRICS_HTTP, a, METRICS_ALLOWED);
	rl_free(a);
	metrics_decision(m, METRICS_HTTP, b, METRICS_ALLOWED);
	text = render(m);
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"allowed\",protocol=\"http\"}"),
	    "2");
	rl_free(text);
	rl_free(b);
	metrics_free(m);
}
END_TEST

/*
 * A name that was a stat and becomes a rule after a reload (or the other
 * way round) has series in both families: its decisions are counted in
 * ratelimitd_decisions_total and its records stay in
 * ratelimitd_stats_records_total.
 */
START_TEST(test_stat_then_rule_by_name)
{
	struct metrics *m = metrics_new();
	char *text;

	/* "signups" is a stat, then a rule after a reload. */
	metrics_stat_record(m, "signups");
	metrics_stat_record(m, "signups");
	metrics_decision(m, METRICS_HTTP, "signups", METRICS_ALLOWED);
	/* "api" is a rule, then a stat after a reload. */
	metrics_decision(m, METRICS_HTTP, "api", METRICS_DENIED);
	metrics_stat_record(m, "api");
	text = render(m);
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"signups\",result=\"allowed\",protocol=\"http\"}"),
	    "1");
	ck_assert_str_eq(
	    sample(text, "ratelimitd_stats_records_total{stat=\"signups\"}"),
	    "2");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"api\",result=\"denied\",protocol=\"http\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_stats_records_total{stat=\"api\"}"),
	    "1");
	/* A name only ever a stat has no decisions, and the other way. */
	metrics_stat_record(m, "only-stat");
	metrics_decision(m, METRICS_HTTP, "only-rule", METRICS_ALLOWED);
	rl_free(text);
	text = render(m);
	ck_assert_ptr_null(sample(text,
	    "ratelimitd_decisions_total"
	    "{rule=\"only-stat\",result=\"allowed\",protocol=\"http\"}"));
	ck_assert_ptr_null(sample(text,
	    "ratelimitd_stats_records_total{stat=\"only-rule\"}"));
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_label_escaping)
{
	struct metrics *m = metrics_new();
	char *text;

	decide_n(m, "a\"b\\c\nd", METRICS_DENIED, 7);
	decide_n(m, "caf\xc3\xa9", METRICS_ALLOWED, 1); /* UTF-8 */
	decide_n(m, "bad\xff\xc3", METRICS_ALLOWED, 1); /* not UTF-8 */
	text = render(m);
	ck_assert_str_eq(sample(text,
			     "ratelimitd_decisions_total"
			     "{rule=\"a\\\"b\\\\c\\nd\",result=\"denied\","
			     "protocol=\"http\"}"),
	    "7");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_decisions_total"
			     "{rule=\"caf\xc3\xa9\",result=\"allowed\","
			     "protocol=\"http\"}"),
	    "1");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"bad\xef\xbf\xbd\xef\xbf\xbd\",result=\"allowed\","
		"protocol=\"http\"}"),
	    "1");
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_rule_cap)
{
	struct metrics *m = metrics_new();
	char name[32], *text;
	int i;

	for (i = 0; i < MAX_RULES + 5; i++) {
		snprintf(name, sizeof(name), "r%d", i);
		decide_n(m, name, METRICS_ALLOWED, 1);
	}
	decide_n(m, "r0", METRICS_ALLOWED, 1);	/* known: its own */
	decide_n(m, "late", METRICS_DENIED, 2); /* new: _other */
	text = render(m);
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"r0\",result=\"allowed\",protocol=\"http\"}"),
	    "2");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"r9999\",result=\"allowed\",protocol=\"http\"}"),
	    "1");
	ck_assert_ptr_null(sample(text,
	    "ratelimitd_decisions_total"
	    "{rule=\"r10000\",result=\"allowed\",protocol=\"http\"}"));
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"_other\",result=\"allowed\",protocol=\"http\"}"),
	    "5");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"_other\",result=\"denied\",protocol=\"http\"}"),
	    "2");
	ck_assert_uint_eq(count_lines(text, "ratelimitd_decisions_total{"),
	    (MAX_RULES + 1) * 5);
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_http_responses)
{
	struct metrics *m = metrics_new();
	char *text;

	metrics_http_response(m, 200);
	metrics_http_response(m, 200);
	metrics_http_response(m, 429);
	metrics_http_response(m, 100);
	metrics_http_response(m, 599);
	metrics_http_response(m, 99); /* out of range: ignored */
	metrics_http_response(m, 600);
	metrics_http_response(m, -1);
	text = render(m);
	ck_assert_str_eq(sample(text,
			     "ratelimitd_http_responses_total{code=\"200\"}"),
	    "2");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_http_responses_total{code=\"429\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_http_responses_total{code=\"100\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_http_responses_total{code=\"599\"}"),
	    "1");
	ck_assert_uint_eq(count_lines(text, "ratelimitd_http_responses_total{"),
	    4);
	rl_free(text);
	metrics_free(m);
}
END_TEST

#define HIST "ratelimitd_backend_request_duration_seconds"

static const char *const le[] = { "0.0001", "0.00025", "0.0005", "0.001",
	"0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
	"+Inf" };
#define NLE (sizeof(le) / sizeof(le[0]))

static unsigned long long
bucket(const char *text, const char *backend, const char *bound)
{
	char series[160];

	snprintf(series, sizeof(series),
	    HIST
	    "_bucket{backend=\"%s\","
	    "le=\"%s\"}",
	    backend, bound);
	return sample_u64(text, series);
}

START_TEST(test_histogram)
{
	struct metrics *m = metrics_new();
	/* The le bound itself belongs to its bucket. */
	static const int64_t calls[] = { 50, 100, 101, 3000, 2000000, -5 };
	/* Expected cumulative counts, bucket by bucket. */
	static const unsigned long long want[NLE] = { 3, 4, 4, 4, 4, 5, 5, 5, 5,
		5, 5, 5, 5, 6 };
	unsigned long long prev = 0, n;
	char *text;
	size_t i;

	for (i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
		metrics_backend_call(m, "redis", calls[i], METRICS_STORE_OK);
	metrics_backend_call(m, "memory", 1000, METRICS_STORE_OK);
	metrics_backend_call(m, "postgres", 1000, METRICS_STORE_TIMEOUT);
	metrics_backend_call(m, NULL, 1000, METRICS_STORE_TIMEOUT);
	text = render(m);
	for (i = 0; i < NLE; i++) {
		n = bucket(text, "redis", le[i]);
		ck_assert_msg(n >= prev, "bucket le=%s not cumulative", le[i]);
		ck_assert_msg(n == want[i], "le=%s: %llu, want %llu", le[i], n,
		    want[i]);
		prev = n;
	}
	ck_assert_uint_eq(sample_u64(text, HIST "_count{backend=\"redis\"}"),
	    6);
	ck_assert_uint_eq(bucket(text, "redis", "+Inf"), 6);
	/* 50 + 100 + 101 + 3000 + 2000000 + 0 microseconds. */
	ck_assert_str_eq(sample(text, HIST "_sum{backend=\"redis\"}"),
	    "2.003251");
	ck_assert_uint_eq(bucket(text, "memory", "0.0005"), 0);
	ck_assert_uint_eq(bucket(text, "memory", "0.001"), 1);
	ck_assert_uint_eq(sample_u64(text, HIST "_count{backend=\"memory\"}"),
	    1);
	ck_assert_str_eq(sample(text, HIST "_sum{backend=\"memory\"}"),
	    "0.001000");
	ck_assert_uint_eq(count_lines(text, HIST "_bucket{"), 2 * NLE);
	ck_assert_uint_eq(count_lines(text, HIST "_count{"), 2);
	ck_assert_uint_eq(count_lines(text,
			      "ratelimitd_backend_errors_total"
			      "{backend=\"postgres\""),
	    0);
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_backend_errors)
{
	struct metrics *m = metrics_new();
	char *text;

	metrics_backend_call(m, "redis", 10, METRICS_STORE_TIMEOUT);
	metrics_backend_call(m, "redis", 10, METRICS_STORE_TIMEOUT);
	metrics_backend_call(m, "redis", 10, METRICS_STORE_CIRCUIT_OPEN);
	metrics_backend_call(m, "redis", 10, METRICS_STORE_TLS);
	metrics_backend_call(m, "memory", 10, METRICS_STORE_FULL);
	metrics_backend_call(m, "memory", 10, METRICS_STORE_OK);
	metrics_backend_call(m, "memory", 10, (enum metrics_store_error)42);
	text = render(m);
	ck_assert_str_eq(sample(text,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"timeout\"}"),
	    "2");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"circuit_open\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"connect\"}"),
	    "0");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"tls\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"memory\",kind=\"full\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"memory\",kind=\"protocol\"}"),
	    "0");
	/* 2 backends x 6 kinds, no "none". */
	ck_assert_uint_eq(count_lines(text, "ratelimitd_backend_errors_total{"),
	    12);
	ck_assert_uint_eq(count_lines(text,
			      "ratelimitd_backend_errors_total"
			      "{backend=\"redis\",kind=\"none\"}"),
	    0);
	/* The Redis store's under docs/operations.md's second name: the
	 * same counts, kind by kind, the memory store's not among them. */
	ck_assert_uint_eq(count_lines(text,
			      "# TYPE ratelimitd_redis_errors_total counter"),
	    1);
	ck_assert_uint_eq(count_lines(text, "ratelimitd_redis_errors_total{"),
	    6);
	ck_assert_str_eq(sample(text,
			     "ratelimitd_redis_errors_total{kind=\"tls\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_redis_errors_total{kind=\"timeout\"}"),
	    "2");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_redis_errors_total"
			     "{kind=\"circuit_open\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_redis_errors_total{kind=\"full\"}"),
	    "0");
	/* Failed calls are timed too. */
	ck_assert_uint_eq(sample_u64(text, HIST "_count{backend=\"redis\"}"),
	    4);
	ck_assert_uint_eq(sample_u64(text, HIST "_count{backend=\"memory\"}"),
	    3);
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_pool_and_reloads)
{
	struct metrics *m = metrics_new();
	char *text;

	metrics_pool_in_use(m, 3);
	metrics_pool_in_use(m, -1);
	metrics_reload(m, false);
	text = render(m);
	ck_assert_str_eq(sample(text, "ratelimitd_redis_pool_in_use"), "2");
	ck_assert_str_eq(
	    sample(text, "ratelimitd_config_reloads_total{result=\"failure\"}"),
	    "1");
	ck_assert_str_eq(
	    sample(text, "ratelimitd_config_reloads_total{result=\"success\"}"),
	    "0");
	ck_assert_str_eq(sample(text, "ratelimitd_config_last_reload_success"),
	    "0");
	rl_free(text);

	metrics_pool_in_use(m, -5);
	metrics_reload(m, true);
	metrics_reload(m, true);
	text = render(m);
	ck_assert_str_eq(sample(text, "ratelimitd_redis_pool_in_use"), "-3");
	ck_assert_str_eq(
	    sample(text, "ratelimitd_config_reloads_total{result=\"success\"}"),
	    "2");
	ck_assert_str_eq(sample(text, "ratelimitd_config_last_reload_success"),
	    "1");
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_null_safety)
{
	struct metrics *m = metrics_new();
	const char *r = "api", *noname = NULL;
	char *text, line[256];
	size_t len = 0;

	metrics_http_response(NULL, 200);
	metrics_decision(NULL, METRICS_HTTP, r, METRICS_ALLOWED);
	metrics_decision(NULL, METRICS_HTTP, NULL, METRICS_ALLOWED);
	metrics_decision(m, METRICS_HTTP, NULL, METRICS_ALLOWED);
	metrics_decision(m, METRICS_HTTP, noname, METRICS_ALLOWED);
	metrics_backend_call(NULL, "redis", 10, METRICS_STORE_TIMEOUT);
	metrics_pool_in_use(NULL, 1);
	metrics_reload(NULL, false);
	metrics_free(NULL);

	/* metrics_render(NULL) is build_info alone. */
	ck_assert_int_eq(metrics_render(NULL, &text, &len), 0);
	check_document(text, len);
	snprintf(line, sizeof(line), "# HELP ratelimitd_build_info ");
	ck_assert_uint_eq(count_lines(text, "# HELP "), 1);
	ck_assert_uint_eq(count_lines(text, line), 1);
	snprintf(line, sizeof(line), "ratelimitd_build_info{version=\"%s\"}",
	    RL_VERSION);
	ck_assert_str_eq(sample(text, line), "1");
	rl_free(text);
	/* len is optional; out is not. */
	ck_assert_int_eq(metrics_render(NULL, &text, NULL), 0);
	rl_free(text);
	ck_assert_int_eq(metrics_render(m, NULL, &len), -1);

	text = render(m);
	ck_assert_uint_eq(count_lines(text, "ratelimitd_decisions_total{"), 0);
	rl_free(text);
	metrics_free(m);
}
END_TEST

START_TEST(test_oom)
{
	struct metrics *m = NULL;
	char *text;
	size_t len;
	long n;
	int rc = -1;

	for (n = 0; m == NULL; n++) {
		rl_alloc_fail_after(n);
		m = metrics_new();
		ck_assert_int_lt(n, 100);
	}
	rl_alloc_fail_after(-1);

	/* A new name under OOM loses that one count, nothing else. */
	rl_alloc_fail_after(0);
	decide_n(m, "lost", METRICS_ALLOWED, 1);
	metrics_http_response(m, 200);
	rl_alloc_fail_after(-1);
	decide_n(m, "lost", METRICS_DENIED, 1);
	for (n = 0; n < 200; n++) {
		char name[32];

		snprintf(name, sizeof(name), "rule%ld", n);
		decide_n(m, name, METRICS_ALLOWED, 1);
	}

	/* Render fails cleanly (no leak: ASan) until it has enough. */
	for (n = 0; rc != 0; n++) {
		ck_assert_int_lt(n, 100);
		text = (char *)"sentinel";
		rl_alloc_fail_after(n);
		rc = metrics_render(m, &text, &len);
		rl_alloc_fail_after(-1);
		if (rc != 0)
			ck_assert_ptr_null(text);
	}
	ck_assert_uint_gt(n, 1); /* it did fail at least once */
	check_document(text, len);
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"lost\",result=\"allowed\",protocol=\"http\"}"),
	    "0");
	ck_assert_str_eq(
	    sample(text,
		"ratelimitd_decisions_total"
		"{rule=\"lost\",result=\"denied\",protocol=\"http\"}"),
	    "1");
	ck_assert_str_eq(sample(text,
			     "ratelimitd_http_responses_total{code=\"200\"}"),
	    "1");
	rl_free(text);
	metrics_free(m);
}
END_TEST

/* ---- concurrency ---------------------------------------------------- */

#define NTHREADS 4
#define NITER	 100000

struct worker {
	struct metrics *m;
	int id;
	pthread_t tid;
};

static int renderer_done;

static void *
work(void *arg)
{
	struct worker *w = arg;
	const char *shared = "shared";
	char own[16];
	char *mine = own;
	int i;

	snprintf(own, sizeof(own), "t%d", w->id);
	for (i = 0; i < NITER; i++) {
		metrics_decision(w->m, METRICS_HTTP, shared,
		    (enum metrics_outcome)(i % 5));
		/* A fresh name now and then: the write-lock path, raced. */
		if (i % 1000 == 0) {
			snprintf(own, sizeof(own), "t%d.%d", w->id, i / 1000);
			metrics_decision(w->m, METRICS_HTTP, mine,
			    METRICS_DENIED);
		}
		metrics_http_response(w->m, i % 2 == 0 ? 200 : 429);
		metrics_backend_call(w->m, i % 2 == 0 ? "redis" : "memory",
		    i % 3000,
		    i % 10 == 0 ? METRICS_STORE_TIMEOUT : METRICS_STORE_OK);
		metrics_pool_in_use(w->m, 1);
		metrics_pool_in_use(w->m, -1);
	}
	return NULL;
}

static void *
render_loop(void *arg)
{
	struct metrics *m = arg;
	char *text;
	size_t len;

	while (!__atomic_load_n(&renderer_done, __ATOMIC_ACQUIRE)) {
		ck_assert_int_eq(metrics_render(m, &text, &len), 0);
		rl_free(text);
	}
	return NULL;
}

START_TEST(test_threads)
{
	struct metrics *m = metrics_new();
	struct worker w[NTHREADS];
	pthread_t renderer;
	unsigned long long total = 0;
	char *text, series[128];
	int i, j;

	ck_assert_int_eq(pthread_create(&renderer, NULL, render_loop, m), 0);
	for (i = 0; i < NTHREADS; i++) {
		w[i].m = m;
		w[i].id = i;
		ck_assert_int_eq(pthread_create(&w[i].tid, NULL, work, &w[i]),
		    0);
	}
	for (i = 0; i < NTHREADS; i++)
		pthread_join(w[i].tid, NULL);
	__atomic_store_n(&renderer_done, 1, __ATOMIC_RELEASE);
	pthread_join(renderer, NULL);

	text = render(m);
	/* 100000 = 20000 of each of the 5 results, per thread. */
	ck_assert_uint_eq(sample_u64(text,
			      "ratelimitd_decisions_total"
			      "{rule=\"shared\",result=\"allowed\","
			      "protocol=\"http\"}"),
	    NTHREADS * NITER / 5);
	ck_assert_uint_eq(sample_u64(text,
			      "ratelimitd_decisions_total"
			      "{rule=\"shared\",result=\"error\","
			      "protocol=\"http\"}"),
	    NTHREADS * NITER / 5);
	for (i = 0; i < NTHREADS; i++)
		for (j = 0; j < NITER / 1000; j++) {
			snprintf(series, sizeof(series),
			    "ratelimitd_decisions_total{rule=\"t%d.%d\","
			    "result=\"denied\",protocol=\"http\"}",
			    i, j);
			ck_assert_uint_eq(sample_u64(text, series), 1);
		}
	ck_assert_uint_eq(count_lines(text, "ratelimitd_decisions_total{"),
	    (1 + NTHREADS * NITER / 1000) * 5);
	ck_assert_uint_eq(sample_u64(text,
			      "ratelimitd_http_responses_total{code=\"200\"}"),
	    NTHREADS * NITER / 2);
	ck_assert_uint_eq(sample_u64(text,
			      "ratelimitd_http_responses_total{code=\"429\"}"),
	    NTHREADS * NITER / 2);
	total = sample_u64(text, HIST "_count{backend=\"redis\"}") +
	    sample_u64(text, HIST "_count{backend=\"memory\"}");
	ck_assert_uint_eq(total, NTHREADS * NITER);
	ck_assert_uint_eq(bucket(text, "redis", "+Inf"), NTHREADS * NITER / 2);
	ck_assert_uint_eq(sample_u64(text,
			      "ratelimitd_backend_errors_total"
			      "{backend=\"redis\",kind=\"timeout\"}"),
	    NTHREADS * NITER / 10);
	ck_assert_str_eq(sample(text, "ratelimitd_redis_pool_in_use"), "0");
	rl_free(text);
	metrics_free(m);
}
END_TEST

/* ---- promtool ------------------------------------------------------- */

START_TEST(test_promtool)
{
	struct metrics *m;
	char path[512], cmd[640], out[4096];
	char *text;
	size_t n;
	FILE *p;
	int status, i;

	if (system("command -v promtool >/dev/null 2>&1") != 0) {
		printf(
		    "check_metrics: promtool not installed; skipping "
		    "test_promtool (Debian package: prometheus)\n");
		return;
	}
	m = metrics_new();
	decide_n(m, "api", METRICS_ALLOWED, 3);
	decide_n(m, "we\"ird\\na\nme", METRICS_DENIED, 1);
	decide_n(m, "bad\xff", METRICS_ERROR, 1);
	for (i = 0; i < 20; i++)
		metrics_backend_call(m, i % 2 ? "redis" : "memory", i * 997,
		    i % 5 == 0 ? METRICS_STORE_CONNECT : METRICS_STORE_OK);
	metrics_http_response(m, 200);
	metrics_http_response(m, 503);
	metrics_pool_in_use(m, 2);
	metrics_reload(m, false);
	text = render(m);

	test_write_tmp("check_metrics", text, strlen(text), path, sizeof(path));
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s 2>&1", path);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	status = pclose(p);
	unlink(path);
	/* Check's messages are short; the details go to stderr. */
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || n != 0)
		fprintf(stderr, "promtool said:\n%s\n--- document:\n%s", out,
		    text);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "promtool rejected the document (status %d)", status);
	ck_assert_msg(n == 0, "promtool complained (see stderr)");
	rl_free(text);
	metrics_free(m);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("metrics");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_new_free);
	tcase_add_test(tc, test_fresh_document);
	tcase_add_test(tc, test_decisions_counted);
	tcase_add_test(tc, test_grpc_series);
	tcase_add_test(tc, test_prefetch_units);
	tcase_add_test(tc, test_reload_keeps_counts_by_name);
	tcase_add_test(tc, test_stat_then_rule_by_name);
	tcase_add_test(tc, test_label_escaping);
	tcase_add_test(tc, test_rule_cap);
	tcase_add_test(tc, test_http_responses);
	tcase_add_test(tc, test_histogram);
	tcase_add_test(tc, test_backend_errors);
	tcase_add_test(tc, test_pool_and_reloads);
	tcase_add_test(tc, test_null_safety);
	tcase_add_test(tc, test_oom);
	tcase_add_test(tc, test_threads);
	tcase_add_test(tc, test_promtool);
	suite_add_tcase(s, tc);
	return s;
}
