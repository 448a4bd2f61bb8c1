/*
 * check_stats.c - windowed statistics (docs/stats.md) over
 * HTTP against the real daemon, on a real Redis and on the memory store:
 *   - count, sum, min and max exact, and every quantile within
 *     relative_accuracy of the exact quantile of the values sent (skewed
 *     positive values, zeros and negative values);
 *   - the window sliding on the store's clock (window 2 s, resolution
 *     200 ms): an event counts for at least the window and is gone after
 *     window + resolution;
 *   - two daemons recording into one key on one Redis;
 *   - bad input answered 400 with nothing recorded;
 *   - values written in their shortest form (41.7 reads 41.7);
 *   - /metrics counting the records;
 *   - on Redis, the sub-window keys in the stat key's hash tag, each with
 *     a TTL of at most window + resolution.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "harness.h"

static const char memory_head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "backend: memory\n";

static const char redis_head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "backend: redis\n"
    "redis:\n"
    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
    "  timeout: 1s\n"
    "  key_prefix: \"st:\"\n";

static const char stats_yaml[] =
    "stats:\n"
    "  - name: lat\n"
    "    match: { kind: lat }\n"
    "    key: \"${route}\"\n"
    "    window: 1m\n"
    "    resolution: 3s\n"
    "  - name: slide\n"
    "    match: { kind: slide }\n"
    "    window: 2s\n"
    "    resolution: 200ms\n"
    "  - name: rw\n"
    "    match: { kind: rw }\n"
    "    window: 2s\n"
    "    resolution: 200ms\n"
    "  - name: fine\n"
    "    match: { kind: fine }\n"
    "    window: 1m\n"
    "    resolution: 200ms\n"
    "    relative_accuracy: 0.0001\n";

static bool use_redis;

struct conn {
	struct h_daemon d;
	CURL *curl;
	struct h_resp r;
};

static void
conn_open(struct conn *c)
{
	char yaml[4096];

	memset(c, 0, sizeof(*c));
	snprintf(yaml, sizeof(yaml), "%s%s",
	    use_redis ? redis_head : memory_head, stats_yaml);
	h_daemon_start(&c->d, yaml);
	c->curl = h_curl_new();
}

static void
conn_close(struct conn *c)
{
	h_resp_free(&c->r);
	curl_easy_cleanup(c->curl);
	h_daemon_stop(&c->d);
}

/* POST body to path; returns the status. */
static long
post(struct conn *c, const char *path, const char *body)
{
	ck_assert_msg(h_request(c->curl, c->d.port, &c->r, "POST", path, body,
			  strlen(body), NULL) == 0,
	    "%s: %s", path, c->r.err);
	return c->r.status;
}

/* The first stat of the last answer (200 asserted). */
static json_t *
first_stat(struct conn *c)
{
	json_t *list;

	ck_assert_msg(c->r.status == 200, "status %ld: %s", c->r.status,
	    c->r.body);
	list = h_json_get(&c->r, "stats");
	ck_assert_msg(json_is_array(list) && json_array_size(list) >= 1,
	    "no stat in %s", c->r.body);
	return json_array_get(list, 0);
}

static double
num(json_t *o, const char *field)
{
	json_t *v = json_object_get(o, field);

	ck_assert_msg(json_is_number(v), "%s is not a number", field);
	return json_number_value(v);
}

static long long
count_of(struct conn *c, const char *body)
{
	json_t *o;

	ck_assert_int_eq(post(c, "/stats", body), 200);
	o = first_stat(c);
	return (long long)json_integer_value(json_object_get(o, "count"));
}

static void
record(struct conn *c, const char *attrs, double v)
{
	char body[256];

	snprintf(body, sizeof(body), "{%s, \"value\": %.17g}", attrs, v);
	ck_assert_msg(post(c, "/record", body) == 200, "record %g: %ld %s", v,
	    c->r.status, c->r.body);
}

/* xorshift64*, seeded. */
static uint64_t rng = 88172645463325252u;

static double
uniform(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (double)((rng * UINT64_C(2685821657736338717)) >> 11) /
	    9007199254740992.0;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

#define NVALUES 1500

START_TEST(test_exact_and_quantiles)
{
	static const double qs[] = { 0.01, 0.25, 0.5, 0.9, 0.99, 0.999 };
	static const char *const qn[] = { "p1", "p25", "p50", "p90", "p99",
		"p99.9" };
	double v[NVALUES], sum = 0, mn = INFINITY, mx = -INFINITY;
	struct conn c;
	json_t *o;
	size_t i;

	conn_open(&c);
	for (i = 0; i < NVALUES; i++) {
		double u = uniform();

		/* 10% zero, 20% negative, the rest a skewed latency. */
		if (u < 0.1)
			v[i] = 0;
		else if (u < 0.3)
			v[i] = -exp(4 * uniform());
		else
			v[i] = exp(2 + 3 * uniform() * uniform());
		record(&c, "\"kind\": \"lat\", \"route\": \"pay\"", v[i]);
		sum += v[i];
		mn = v[i] < mn ? v[i] : mn;
		mx = v[i] > mx ? v[i] : mx;
	}
	/* The answer of /record already counts the value it recorded. */
	o = first_stat(&c);
	ck_assert_int_eq(json_integer_value(json_object_get(o, "count")),
	    NVALUES);
	ck_assert_int_eq(
	    post(&c, "/stats",
		"{\"kind\": \"lat\", \"route\": "
		"\"pay\", \"quantiles\": [0.01, 0.25, 0.5, 0.9, 0.99, 0.999]}"),
	    200);
	o = first_stat(&c);
	ck_assert_str_eq(json_string_value(json_object_get(o, "name")), "lat");
	ck_assert_str_eq(json_string_value(json_object_get(o, "key")), "pay");
	ck_assert_int_eq(json_integer_value(json_object_get(o, "window_ms")),
	    60000);
	ck_assert_int_eq(json_integer_value(json_object_get(o, "count")),
	    NVALUES);
	ck_assert_msg(fabs(num(o, "sum") - sum) <= 1e-9 * fabs(sum),
	    "sum %.17g, expected %.17g", num(o, "sum"), sum);
	ck_assert(num(o, "min") == mn);
	ck_assert(num(o, "max") == mx);
	ck_assert(fabs(num(o, "avg") - sum / NVALUES) <= 1e-9 * fabs(sum));
	qsort(v, NVALUES, sizeof(v[0]), cmp_double);
	for (i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
		double truth = v[(size_t)floor(qs[i] * (NVALUES - 1))];
		double got = num(o, qn[i]);

		ck_assert_msg(truth == 0 ?
			got == 0 :
			fabs(got - truth) <= 0.01 * fabs(truth) * (1 + 1e-9),
		    "%s: %.17g, exact "
		    "%.17g",
		    qn[i], got, truth);
	}
	/* Another key of the same stat is empty: count 0, the rest null. */
	ck_assert_int_eq(post(&c, "/stats",
			     "{\"kind\": \"lat\", \"route\": "
			     "\"other\"}"),
	    200);
	o = first_stat(&c);
	ck_assert_int_eq(json_integer_value(json_object_get(o, "count")), 0);
	ck_assert(json_is_null(json_object_get(o, "sum")));
	ck_assert(json_is_null(json_object_get(o, "p99")));
	ck_assert(json_is_null(json_object_get(o, "min")));
	conn_close(&c);
}
END_TEST

/* Window 2 s, resolution 200 ms: an event counts while it is less than
 * 2 s old and is gone once it is 2.2 s old. */
START_TEST(test_window_slides)
{
	static const char body[] = "{\"kind\": \"slide\"}";
	long long a_after, b_before, now;
	struct conn c;

	conn_open(&c);
	record(&c, "\"kind\": \"slide\"", 1);
	a_after = h_now_ms();
	h_sleep_ms(1000);
	b_before = h_now_ms();
	record(&c, "\"kind\": \"slide\"", 2);
	ck_assert_int_eq(count_of(&c, body), 2);
	/* A: at least 2.2 s + 200 ms old; B: at most 1.6 s old. */
	h_sleep_ms(a_after + 2400 - h_now_ms());
	ck_assert_int_eq(count_of(&c, body), 1);
	now = h_now_ms();
	ck_assert_msg(now - b_before < 1800, "too slow: %lld ms",
	    now - b_before);
	ck_assert(num(first_stat(&c), "sum") == 2);
	/* B: at least 2.4 s old. */
	h_sleep_ms(b_before + 2000 + 200 + 400 + 200 - h_now_ms());
	ck_assert_int_eq(count_of(&c, body), 0);
	conn_close(&c);
}
END_TEST

/*
 * Values near the largest double: their sum saturates there (docs/stats.md
 * "Bounds") and every call keeps answering 200.  Two of 1.7e308 used to
 * make the sum infinite, and then every /record and /stats of that key
 * failed for window + resolution (memory: 500, Redis: 503).
 */
START_TEST(test_sum_saturates)
{
	static const char rec[] =
	    "{\"kind\": \"lat\", \"route\": \"huge\", "
	    "\"value\": 1.7e308}";
	static const char neg[] =
	    "{\"kind\": \"lat\", \"route\": \"tiny\", "
	    "\"value\": -1.7e308}";
	struct conn c;
	json_t *o;
	int i;

	conn_open(&c);
	for (i = 0; i < 3; i++) {
		ck_assert_int_eq(post(&c, "/record", rec), 200);
		o = first_stat(&c);
		ck_assert_int_eq(json_integer_value(json_object_get(o,
				     "count")),
		    i + 1);
		ck_assert_msg(num(o, "sum") == (i == 0 ? 1.7e308 : DBL_MAX),
		    "sum %.17g after %d", num(o, "sum"), i + 1);
		ck_assert(num(o, "max") == 1.7e308);
		ck_assert(isfinite(num(o, "avg")));
	}
	ck_assert_int_eq(post(&c, "/stats",
			     "{\"kind\": \"lat\", \"route\": "
			     "\"huge\"}"),
	    200);
	ck_assert(num(first_stat(&c), "sum") == DBL_MAX);
	for (i = 0; i < 2; i++)
		ck_assert_int_eq(post(&c, "/record", neg), 200);
	ck_assert(num(first_stat(&c), "sum") == -DBL_MAX);
	conn_close(&c);
}
END_TEST

START_TEST(test_bad_input)
{
	/* clang-format off */
	static const char *const bad[][2] = {
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\"}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": \"12\"}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": true}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": null}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": 1e999}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": 1, \"quantiles\": [0.5, 1.5]}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": 1, \"quantiles\": []}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": 1, \"quantiles\": \"p99\"}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": 1, \"stat\": \"nope\"}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": {\"x\": 1}, "
		    "\"value\": 1}" },
		{ "/record", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": 1" },
		{ "/stats", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"value\": 1}" },
		{ "/stats", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"quantiles\": [-0.1]}" },
		/* One number twice would answer under one name. */
		{ "/stats", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"quantiles\": [0.5, 0.9, 0.5]}" },
		{ "/stats", "{\"kind\": \"lat\", \"route\": \"b\", "
		    "\"quantiles\": [0, -0.0]}" },
	};
	/* clang-format on */
	static const char *const codes[] = { "invalid_value", "invalid_value",
		"invalid_value", "invalid_value", "invalid_json",
		"invalid_quantiles", "invalid_quantiles", "invalid_quantiles",
		"unknown_stat", "invalid_attribute", "invalid_json",
		"invalid_value", "invalid_quantiles", "invalid_quantiles",
		"invalid_quantiles" };
	struct conn c;
	size_t i;

	conn_open(&c);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *code;

		ck_assert_msg(post(&c, bad[i][0], bad[i][1]) == 400,
		    "%s %s: %ld", bad[i][0], bad[i][1], c.r.status);
		code = h_json_str(&c.r, "error");
		ck_assert_msg(code != NULL && strcmp(code, codes[i]) == 0,
		    "%s: %s, expected %s", bad[i][1], code ? code : "none",
		    codes[i]);
		/* The name quoted, as unknown_rule quotes a rule's. */
		if (strcmp(codes[i], "unknown_stat") == 0) {
			const char *m = h_json_str(&c.r, "message");

			ck_assert_str_eq(m != NULL ? m : "",
			    "no stat named \"nope\"");
		}
	}
	ck_assert_int_eq(count_of(&c,
			     "{\"kind\": \"lat\", \"route\": "
			     "\"b\"}"),
	    0);
	/* GET is not the method, and no stat applies => []. */
	ck_assert_int_eq(h_request(c.curl, c.d.port, &c.r, "GET", "/stats",
			     NULL, 0, NULL),
	    0);
	ck_assert_int_eq(c.r.status, 405);
	ck_assert_int_eq(post(&c, "/record",
			     "{\"kind\": \"none\", "
			     "\"value\": 3}"),
	    200);
	ck_assert_str_eq(c.r.body, "{\"stats\":[]}");
	/* A stat whose key attribute is missing does not apply. */
	ck_assert_int_eq(post(&c, "/record",
			     "{\"kind\": \"lat\", "
			     "\"value\": 3}"),
	    200);
	ck_assert_str_eq(c.r.body, "{\"stats\":[]}");
	ck_assert_int_eq(h_metric("ratelimitd_stats_records_total"
				  "{stat=\"lat\"}"),
	    -1);
	conn_close(&c);
}
END_TEST

START_TEST(test_metrics_and_forced)
{
	struct conn c;
	int i;

	conn_open(&c);
	for (i = 0; i < 5; i++)
		record(&c, "\"kind\": \"lat\", \"route\": \"m\"", i);
	/* "stat" forces one stat, skipping match. */
	record(&c,
	    "\"stat\": \"slide\", \"kind\": \"lat\", \"route\": "
	    "\"m\"",
	    7);
	ck_assert_str_eq(json_string_value(json_object_get(first_stat(&c),
			     "name")),
	    "slide");
	ck_assert_int_eq(json_array_size(h_json_get(&c.r, "stats")), 1);
	ck_assert_int_eq(h_metric("ratelimitd_stats_records_total"
				  "{stat=\"lat\"}"),
	    5);
	ck_assert_int_eq(h_metric("ratelimitd_stats_records_total"
				  "{stat=\"slide\"}"),
	    1);
	/* /stats records nothing. */
	ck_assert_int_eq(count_of(&c,
			     "{\"kind\": \"lat\", \"route\": "
			     "\"m\"}"),
	    5);
	ck_assert_int_eq(h_metric("ratelimitd_stats_records_total"
				  "{stat=\"lat\"}"),
	    5);
	conn_close(&c);
}
END_TEST

/* A value reads as it was sent: 41.7, not 41.700000000000003, the
 * shortest decimal that reads back as the same double (docs/stats.md
 * "HTTP"), in the answer of /record and of /stats. */
START_TEST(test_shortest_numbers)
{
	static const char want[] =
	    "\"count\":1,\"sum\":41.7,\"avg\":41.7,"
	    "\"min\":41.7,\"max\":41.7,";
	struct conn c;

	conn_open(&c);
	ck_assert_int_eq(post(&c, "/record",
			     "{\"kind\": \"lat\", \"route\": \"short\", "
			     "\"value\": 41.7}"),
	    200);
	ck_assert_msg(strstr(c.r.body, want) != NULL, "%s", c.r.body);
	ck_assert_int_eq(post(&c, "/stats",
			     "{\"kind\": \"lat\", \"route\": \"short\"}"),
	    200);
	ck_assert_msg(strstr(c.r.body, want) != NULL, "%s", c.r.body);
	ck_assert(num(first_stat(&c), "avg") == 41.7);
	conn_close(&c);
}
END_TEST

/* Two daemons on one Redis record into one key and read the same. */
START_TEST(test_two_daemons)
{
	struct conn a, b;
	char body_a[4096], body_b[4096];
	int i;

	conn_open(&a);
	conn_open(&b);
	for (i = 0; i < 100; i++) {
		record(&a, "\"kind\": \"lat\", \"route\": \"two\"", i);
		record(&b, "\"kind\": \"lat\", \"route\": \"two\"", 1000 + i);
	}
	ck_assert_int_eq(count_of(&a,
			     "{\"kind\": \"lat\", \"route\": "
			     "\"two\"}"),
	    200);
	ck_assert_int_eq(count_of(&b,
			     "{\"kind\": \"lat\", \"route\": "
			     "\"two\"}"),
	    200);
	snprintf(body_a, sizeof(body_a), "%s", a.r.body);
	snprintf(body_b, sizeof(body_b), "%s", b.r.body);
	ck_assert_str_eq(body_a, body_b);
	ck_assert(num(first_stat(&a), "min") == 0);
	ck_assert(num(first_stat(&a), "max") == 1099);
	conn_close(&a);
	conn_close(&b);
}
END_TEST

/* The sub-window keys: in the hash tag, each with a TTL; a stat without a
 * key has the tag "~", never an empty one (docs/stats.md). */
START_TEST(test_redis_keys)
{
	redisReply *keys;
	struct conn c;
	size_t i;

	conn_open(&c);
	record(&c, "\"kind\": \"slide\"", 5);
	record(&c, "\"kind\": \"lat\", \"route\": \"k\"", 5);
	keys = redisCommand(h_redis_ctx(&h_shared_redis), "KEYS st:*");
	ck_assert_ptr_nonnull(keys);
	ck_assert_uint_ge(keys->elements, 2);
	for (i = 0; i < keys->elements; i++) {
		const char *k = keys->element[i]->str;
		long long ttl = h_redis_int(&h_shared_redis, "PTTL %s", k);

		ck_assert_msg(strncmp(k, "st:stat:slide:{~}:", 18) == 0 ||
			strncmp(k, "st:stat:lat:{k}:", 16) == 0,
		    "key %s", k);
		ck_assert_msg(ttl > 0 && ttl <= (k[8] == 's' ? 2200 : 63000),
		    "%s: ttl %lld", k, ttl);
	}
	freeReplyObject(keys);
	conn_close(&c);
}
END_TEST

/* One spec, two stores: the same values recorded through a daemon on the
 * memory store and one on Redis give the same answer, byte for byte.  The
 * values are multiples of 1/8 below 2^20, so every sum is exact whatever
 * sub-windows the two clocks cut. */
START_TEST(test_same_answer_both_stores)
{
	static const char q[] =
	    "{\"kind\": \"lat\", \"route\": \"both\", "
	    "\"quantiles\": [0, 0.05, 0.3, 0.5, 0.77, 0.9, 0.99, 1]}";
	struct conn mem, red;
	char *mem_body;
	int i;

	use_redis = false;
	conn_open(&mem);
	use_redis = true;
	conn_open(&red);
	for (i = 0; i < 400; i++) {
		double u = uniform(), v = round(exp(8 * uniform()) * 8) / 8;

		v = u < 0.1 ? 0 : u < 0.35 ? -v : v;
		record(&mem, "\"kind\": \"lat\", \"route\": \"both\"", v);
		record(&red, "\"kind\": \"lat\", \"route\": \"both\"", v);
	}
	ck_assert_int_eq(post(&mem, "/stats", q), 200);
	ck_assert_int_eq(post(&red, "/stats", q), 200);
	mem_body = strdup(mem.r.body);
	ck_assert_str_eq(mem_body, red.r.body);
	ck_assert_int_eq(json_integer_value(json_object_get(first_stat(&red),
			     "count")),
	    400);
	free(mem_body);
	conn_close(&mem);
	conn_close(&red);
}
END_TEST

/* Copy into out (size n) the text of in with every "from" written "to". */
static void
replace_all(char *out, size_t n, const char *in, const char *from,
    const char *to)
{
	size_t len = 0, flen = strlen(from);
	const char *at;

	while ((at = strstr(in, from)) != NULL) {
		len += (size_t)snprintf(out + len, n - len, "%.*s%s",
		    (int)(at - in), in, to);
		ck_assert_uint_lt(len, n);
		in = at + flen;
	}
	snprintf(out + len, n - len, "%s", in);
}

/* A reload of c's daemon with the stat rw's window now 4 s. */
static void
reload_rw_window_4s(struct conn *c)
{
	char a[4096], b[4096], port[16];
	FILE *f;

	snprintf(a, sizeof(a), "%s%s", use_redis ? redis_head : memory_head,
	    stats_yaml);
	replace_all(b, sizeof(b), a, "kind: rw }\n    window: 2s",
	    "kind: rw }\n    window: 4s");
	snprintf(port, sizeof(port), "%d", c->d.port);
	replace_all(a, sizeof(a), b, "%PORT%", port);
	snprintf(port, sizeof(port), "%d", h_shared_redis.port);
	replace_all(b, sizeof(b), a, "%REDIS_PORT%", port);
	ck_assert_ptr_nonnull(f = fopen(c->d.conf, "w"));
	fputs(b, f);
	fclose(f);
	ck_assert_int_eq(kill(c->d.pid, SIGHUP), 0);
	ck_assert_int_eq(
	    h_metric_settles(
		"ratelimitd_config_reloads_total{result=\"success\"}", 1),
	    1);
}

/* An integer past 2^63, as JavaScript writes 1e19, is a value like any
 * other (docs/stats.md "HTTP"); a number past a double is invalid_json;
 * an attribute that large is not an integer attribute. */
START_TEST(test_big_integer_value)
{
	struct conn c;
	const char *code;

	conn_open(&c);
	ck_assert_int_eq(post(&c, "/record",
			     "{\"kind\": \"lat\", \"route\": \"big\", "
			     "\"value\": 10000000000000000000}"),
	    200);
	ck_assert(num(first_stat(&c), "max") == 1e19);
	ck_assert_int_eq(post(&c, "/record",
			     "{\"kind\": \"lat\", \"route\": \"big\", "
			     "\"value\": -99999999999999999999}"),
	    200);
	ck_assert(num(first_stat(&c), "min") == -1e20);
	ck_assert_int_eq(post(&c, "/record",
			     "{\"kind\": \"lat\", \"route\": \"big\", "
			     "\"value\": 1e400}"),
	    400);
	code = h_json_str(&c.r, "error");
	ck_assert_str_eq(code != NULL ? code : "", "invalid_json");
	ck_assert_int_eq(post(&c, "/record",
			     "{\"kind\": \"lat\", \"route\": "
			     "10000000000000000000, \"value\": 1}"),
	    400);
	code = h_json_str(&c.r, "error");
	ck_assert_str_eq(code != NULL ? code : "", "invalid_attribute");
	ck_assert_int_eq(count_of(&c,
			     "{\"kind\": \"lat\", \"route\": \"big\"}"),
	    2);
	conn_close(&c);
}
END_TEST

/* A /record into two stats of which one cannot record (the memory store
 * full) answers 503 naming it; the other did record, is named as such,
 * and is counted in /metrics (docs/stats.md "HTTP"). */
START_TEST(test_partial_failure)
{
	static const char yaml[] =
	    "listen: \"127.0.0.1:%PORT%\"\n"
	    "backend: memory\n"
	    "memory:\n"
	    "  max_keys: 3\n"
	    "stats:\n"
	    "  - name: lat\n"
	    "    match: { k: \"*\" }\n"
	    "    key: \"${k}\"\n"
	    "    window: 1m\n"
	    "    resolution: 3s\n"
	    "  - name: cmp\n"
	    "    match: { c: \"*\" }\n"
	    "    key: \"${c}\"\n"
	    "    window: 1m\n"
	    "    resolution: 3s\n";
	static const char body[] =
	    "{\"k\": \"new2\", \"c\": \"k1\", "
	    "\"value\": 42}";
	struct conn c;
	const char *msg;
	int i;

	memset(&c, 0, sizeof(c));
	h_daemon_start(&c.d, yaml);
	c.curl = h_curl_new();
	record(&c, "\"k\": \"k1\"", 1);
	record(&c, "\"k\": \"k2\"", 1);
	record(&c, "\"c\": \"k1\"", 1); /* 3 keys: full */
	for (i = 0; i < 2; i++) {
		ck_assert_int_eq(post(&c, "/record", body), 503);
		msg = h_json_str(&c.r, "message");
		ck_assert_str_eq(msg != NULL ? msg : "",
		    "stat lat: the memory store failed (full); the value "
		    "was recorded in cmp");
		ck_assert_int_eq(h_metric("ratelimitd_stats_records_total"
					  "{stat=\"cmp\"}"),
		    2 + i);
	}
	ck_assert_int_eq(h_metric("ratelimitd_stats_records_total"
				  "{stat=\"lat\"}"),
	    2);
	ck_assert_int_eq(count_of(&c, "{\"c\": \"k1\"}"), 3);
	conn_close(&c);
}
END_TEST

/* A reload that makes the window longer (2 s to 4 s, resolution kept)
 * keeps what was recorded, on both stores, and from the next read the
 * events live by the new window: still there 3 s after they were
 * recorded (the old window let them go after 2.2 s at most; Redis
 * expired the sub-window then), gone 4.7 s after (docs/stats.md
 * "Reloads and limits"). */
START_TEST(test_reload_longer_window)
{
	static const char rw[] = "{\"kind\": \"rw\"}";
	struct conn c;
	long long t0;

	conn_open(&c);
	record(&c, "\"kind\": \"rw\"", 7);
	record(&c, "\"kind\": \"rw\"", 9);
	t0 = h_now_ms();
	reload_rw_window_4s(&c);
	ck_assert_int_eq(count_of(&c, rw), 2);
	ck_assert_int_eq(num(first_stat(&c), "window_ms"), 4000);
	h_sleep_ms(t0 + 3000 - h_now_ms());
	ck_assert_int_eq(count_of(&c, rw), 2);
	ck_assert(num(first_stat(&c), "sum") == 16);
	h_sleep_ms(t0 + 4700 - h_now_ms());
	ck_assert_int_eq(count_of(&c, rw), 0);
	conn_close(&c);
}
END_TEST

/* Past the bound of 4096 buckets a sign: 4400 values each in a bucket of
 * its own (at a = 0.0001 consecutive ones are 1.00031 apart, more than
 * gamma), recorded through the daemon on the memory store (a read merges
 * the sub-windows of 200 ms the calls fell in, folding in the merge), and
 * straight into Redis by the script in its bulk mode (folding as each is
 * added).  Both answer the same, byte for byte: the 4096 highest buckets,
 * the lowest of them counting every lower value (docs/stats.md "Bounds"). */
START_TEST(test_same_answer_folded)
{
	static const char q[] =
	    "{\"kind\": \"fine\", "
	    "\"quantiles\": [0.01, 0.05, 0.0697, 0.07, 0.5, 0.99]}";
	const char *src = getenv("RATELIMITD_SRCDIR");
	redisContext *ctx;
	redisReply *rep;
	struct conn mem, red;
	char path[4096], sha[64], *script, *mem_body;
	FILE *f;
	long len;
	int i;

	ck_assert_ptr_nonnull(src);
	snprintf(path, sizeof(path), "%s/lua/stats.lua", src);
	ck_assert_ptr_nonnull(f = fopen(path, "r"));
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	rewind(f);
	script = malloc((size_t)len + 1);
	ck_assert_int_eq(fread(script, 1, (size_t)len, f), len);
	script[len] = '\0';
	fclose(f);
	ctx = h_redis_ctx(&h_shared_redis);
	rep = redisCommand(ctx, "SCRIPT LOAD %s", script);
	ck_assert(rep != NULL && rep->type == REDIS_REPLY_STRING);
	snprintf(sha, sizeof(sha), "%s", rep->str);
	freeReplyObject(rep);
	free(script);

	use_redis = false;
	conn_open(&mem);
	use_redis = true;
	conn_open(&red);
	for (i = 0; i < 4400; i++) {
		double v = round(1000 * exp(0.00031 * i) * 8) / 8;
		char vs[64];

		record(&mem, "\"kind\": \"fine\"", v);
		snprintf(vs, sizeof(vs), "%.17g", v);
		redisAppendCommand(ctx,
		    "EVALSHA %s 1 st:stat:fine:{~} 60000 200 0.0001 2 %s", sha,
		    vs);
	}
	for (i = 0; i < 4400; i++) {
		ck_assert_int_eq(redisGetReply(ctx, (void **)&rep), REDIS_OK);
		ck_assert_msg(rep->type == REDIS_REPLY_ARRAY, "reply %d: %s", i,
		    rep->type == REDIS_REPLY_ERROR ? rep->str : "?");
		freeReplyObject(rep);
	}
	ck_assert_int_eq(post(&mem, "/stats", q), 200);
	ck_assert_int_eq(post(&red, "/stats", q), 200);
	mem_body = strdup(mem.r.body);
	ck_assert_str_eq(mem_body, red.r.body);
	ck_assert_int_eq(json_integer_value(json_object_get(first_stat(&red),
			     "count")),
	    4400);
	/* Rank 43 (p0.01) is among the 305 folded: answered as the lowest
	 * bucket kept, above its true value. */
	ck_assert(num(first_stat(&red), "p1") >
	    1000 * exp(0.00031 * 43) * 1.0002);
	free(mem_body);
	conn_close(&mem);
	conn_close(&red);
}
END_TEST

/* Redis gone: /record and /stats answer 503 backend_unavailable within
 * redis.timeout (1 s) and a bit, and work again once it is back. */
START_TEST(test_redis_down)
{
	static const char body[] =
	    "{\"kind\": \"lat\", \"route\": \"down\", "
	    "\"value\": 4}";
	struct h_redis own = { 0 };
	struct conn c;
	long long t0;
	const char *code;

	h_redis_start(&own);
	conn_open(&c); /* on own: the last started */
	ck_assert_int_eq(post(&c, "/record", body), 200);
	h_redis_stop(&own);
	t0 = h_now_ms();
	ck_assert_int_eq(post(&c, "/record", body), 503);
	ck_assert_msg(h_now_ms() - t0 < 2500, "took %lld ms", h_now_ms() - t0);
	code = h_json_str(&c.r, "error");
	ck_assert_str_eq(code != NULL ? code : "", "backend_unavailable");
	ck_assert_int_eq(post(&c, "/stats",
			     "{\"kind\": \"lat\", "
			     "\"route\": \"down\"}"),
	    503);
	h_redis_start(&own); /* same port, empty */
	h_sleep_ms(300);
	ck_assert_int_eq(post(&c, "/record", body), 200);
	ck_assert_int_eq(json_integer_value(json_object_get(first_stat(&c),
			     "count")),
	    1);
	conn_close(&c);
	h_redis_stop(&own);
}
END_TEST

/* Redis refusing writes (maxmemory reached): the 503 names the kind of
 * failure, never Redis's own reply (docs/security.md): it used to carry
 * "OOM command not allowed ... script: <sha1>, on @user_script:51". */
START_TEST(test_redis_error_not_in_body)
{
	static const char body[] =
	    "{\"kind\": \"lat\", \"route\": \"oom\", "
	    "\"value\": 4}";
	struct h_redis own = { 0 };
	redisReply *rep;
	struct conn c;
	const char *code, *msg;

	h_redis_start(&own);
	conn_open(&c); /* on own: the last started */
	rep = redisCommand(h_redis_ctx(&own), "CONFIG SET maxmemory 1");
	ck_assert_ptr_nonnull(rep);
	freeReplyObject(rep);
	ck_assert_int_eq(post(&c, "/record", body), 503);
	code = h_json_str(&c.r, "error");
	msg = h_json_str(&c.r, "message");
	ck_assert_str_eq(code != NULL ? code : "", "backend_unavailable");
	ck_assert_msg(msg != NULL && strstr(msg, "OOM") == NULL &&
		strstr(msg, "script") == NULL &&
		strstr(msg, "maxmemory") == NULL,
	    "the 503 carries Redis's reply: %s", c.r.body);
	conn_close(&c);
	h_redis_stop(&own);
}
END_TEST

static void
use_memory_backend(void)
{
	use_redis = false;
}

static void
use_redis_backend(void)
{
	use_redis = true;
	h_shared_redis_up();
}

static TCase *
backend_tcase(const char *name, bool with_redis)
{
	TCase *tc = tcase_create(name);

	tcase_add_unchecked_fixture(tc,
	    with_redis ? use_redis_backend : use_memory_backend,
	    h_reap_orphans);
	tcase_add_checked_fixture(tc, with_redis ? h_shared_redis_flush : NULL,
	    h_test_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_exact_and_quantiles);
	tcase_add_test(tc, test_window_slides);
	tcase_add_test(tc, test_bad_input);
	tcase_add_test(tc, test_sum_saturates);
	tcase_add_test(tc, test_metrics_and_forced);
	tcase_add_test(tc, test_reload_longer_window);
	tcase_add_test(tc, test_big_integer_value);
	tcase_add_test(tc, test_shortest_numbers);
	if (!with_redis)
		tcase_add_test(tc, test_partial_failure);
	if (with_redis) {
		tcase_add_test(tc, test_two_daemons);
		tcase_add_test(tc, test_redis_keys);
		tcase_add_test(tc, test_same_answer_both_stores);
		tcase_add_test(tc, test_same_answer_folded);
		tcase_add_test(tc, test_redis_down);
		tcase_add_test(tc, test_redis_error_not_in_body);
	}
	return tc;
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("stats");

	suite_add_tcase(s, backend_tcase("memory", false));
	suite_add_tcase(s, backend_tcase("redis", true));
	test_main_at_end(h_shared_redis_stop);
	return s;
}
