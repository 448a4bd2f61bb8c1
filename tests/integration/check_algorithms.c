/*
 * check_algorithms.c - the algorithms' defining behaviour in real time,
 * over HTTP, against the real daemon with a real Redis and with the memory
 * store (docs/algorithms.md; tests/vectors/algorithms.txt pins the exact
 * numbers with a fake clock, this checks that the daemon really runs them
 * on the backend's clock):
 *   - fixed_window admits again just after a window boundary, where
 *     sliding_log still denies;
 *   - token_bucket gives back exactly one request per window / limit;
 *   - sliding_window under steady 2x overload admits within the bound
 *     docs/algorithms.md gives;
 *   - fixed_window keeps a window's count across a reload that lengthens
 *     the window when the window's start stays one, until the new
 *     window's end (on Redis the key's TTL follows the new window);
 *   - on Redis, a sliding_log call of cost 1,000,000 is one member of the
 *     sorted set, not a million (one client used to block Redis for
 *     seconds and fill its memory with one request).
 * Timed steps keep at least 150 ms away from every boundary or expiry they
 * depend on, and a test fails as "too slow" rather than guess when the
 * machine could not keep the schedule.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "harness.h"
#include "ops.h"

static const char memory_head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 4\n"
    "shutdown_timeout: 2s\n"
    "backend: memory\n";

static const char redis_head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 4\n"
    "shutdown_timeout: 2s\n"
    "backend: redis\n"
    "redis:\n"
    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
    "  timeout: 500ms\n"
    "  key_prefix: \"alg:\"\n"
    "on_backend_error: deny\n";

#define RULE_W(name, alg, limit, window) \
	"  - name: " name \
	"\n" \
	"    match:\n" \
	"      t: " name \
	"\n" \
	"    limit: " #limit \
	"\n" \
	"    window: " window \
	"\n" \
	"    algorithm: " alg "\n"
#define RULE(name, alg, limit) RULE_W(name, alg, limit, "1s")

static const char rules_yaml[] = "rules:\n" RULE("fw", "fixed_window", 2)
    RULE("sl", "sliding_log", 2) RULE("tb", "token_bucket", 5)
	RULE("sw", "sliding_window", 20)
	    RULE_W("big", "sliding_log", 1000000, "60s");

#define SW_LIMIT      20
#define SW_BUCKET_MAX 4 /* admitted in a 50 ms bucket at 40/s, jitter */

/* Set in the runner by the TCase's unchecked fixture, inherited by tests. */
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
	    use_redis ? redis_head : memory_head, rules_yaml);
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

/*
 * POST /acquire {"t": rule} on the kept-alive connection; returns whether
 * it was allowed (200) and sets *retry_ms to retry_after_ms.  Anything but
 * a 200 or a 429 from that rule fails the test.
 */
static bool
acquire(struct conn *c, const char *rule, long long *retry_ms, const char *what)
{
	char body[64];
	const char *got;

	snprintf(body, sizeof(body), "{\"t\":\"%s\"}", rule);
	ck_assert_msg(h_request(c->curl, c->d.port, &c->r, "POST", "/acquire",
			  body, strlen(body), NULL) == 0,
	    "%s: %s", what, c->r.err);
	ck_assert_msg(c->r.status == 200 || c->r.status == 429,
	    "%s: status %ld (body %s)", what, c->r.status, c->r.body);
	got = h_json_str(&c->r, "rule");
	ck_assert_msg(got != NULL && strcmp(got, rule) == 0,
	    "%s: rule %s, expected %s", what, got ? got : "null", rule);
	if (retry_ms != NULL)
		*retry_ms = h_json_int(&c->r, "retry_after_ms");
	return c->r.status == 200;
}

static void
expect(struct conn *c, const char *rule, bool allowed, long long min_retry,
    long long max_retry, const char *what)
{
	long long retry;
	bool got = acquire(c, rule, &retry, what);

	ck_assert_msg(got == allowed, "%s: %s, expected %s", what,
	    got ? "allowed" : "denied", allowed ? "allowed" : "denied");
	ck_assert_msg(retry >= min_retry && retry <= max_retry,
	    "%s: retry_after_ms %lld, expected %lld..%lld", what, retry,
	    min_retry, max_retry);
}

/* The backend's clock in microseconds: Redis TIME, or this host's real
 * time for the memory store (the daemon's util_realtime_us). */
static long long
backend_now_us(void)
{
	struct timespec ts;
	redisReply *rep;
	long long us;

	if (!use_redis) {
		clock_gettime(CLOCK_REALTIME, &ts);
		return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
	}
	rep = redisCommand(h_redis_ctx(&h_shared_redis), "TIME");
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
		rep->elements == 2,
	    "redis TIME failed");
	us = atoll(rep->element[0]->str) * 1000000 +
	    atoll(rep->element[1]->str);
	freeReplyObject(rep);
	return us;
}

static void
sleep_until(long long mono_ms)
{
	long long now = h_now_ms();

	if (mono_ms > now)
		h_sleep_ms(mono_ms - now);
}

/*
 * limit 2, window 1 s, for fixed_window (fw) and sliding_log (sl).  On the
 * backend's clock, with B a whole second:
 *	B+600 ms  fw 200 200 429 (retry to B+1000)
 *	          sl 200 200 429 (retry to B+1600)
 *	B+1200    fw 200: a new fixed window
 *	          sl 429: both units of B+600 are in (B+200, B+1200], until
 *	          B+1600
 * Every step is at least 200 ms away from the boundary or expiry it tests.
 */
START_TEST(test_fixed_vs_sliding_at_boundary)
{
	struct conn c;
	long long b, start;

	conn_open(&c);
	/* B: the whole second on the backend's clock whose +600 ms is at
	 * least 20 ms from now, as a time on h_now_ms(). */
	start = h_now_ms();
	b = start - (backend_now_us() % 1000000) / 1000;
	while (b + 600 < start + 20)
		b += 1000;
	sleep_until(b + 600);
	expect(&c, "fw", true, 0, 0, "fw 1 at +600 ms");
	expect(&c, "fw", true, 0, 0, "fw 2 at +600 ms");
	expect(&c, "fw", false, 200, 400, "fw 3 at +600 ms (window full)");
	expect(&c, "sl", true, 0, 0, "sl 1 at +600 ms");
	expect(&c, "sl", true, 0, 0, "sl 2 at +600 ms");
	expect(&c, "sl", false, 800, 1000, "sl 3 at +600 ms (log full)");
	ck_assert_msg(h_now_ms() < b + 800,
	    "too slow: the first six "
	    "requests took until +%lld ms, past +800",
	    h_now_ms() - b);

	sleep_until(b + 1200);
	expect(&c, "fw", true, 0, 0, "fw at +1200 ms (a new fixed window)");
	/* the oldest unit went in between +600 and +800 */
	expect(&c, "sl", false, 150, 600,
	    "sl at +1200 ms (both units of "
	    "+600 ms are still in the last second)");
	ck_assert_msg(h_now_ms() < b + 1400,
	    "too slow: the requests after "
	    "the boundary took until +%lld ms, past +1400",
	    h_now_ms() - b);
	conn_close(&c);
}
END_TEST

/* The head and one fixed_window rule "fr", limit 5, of this window. */
static void
fr_yaml(char *out, size_t len, const char *window)
{
	snprintf(out, len,
	    "%srules:\n  - name: fr\n    match:\n      t: fr\n"
	    "    limit: 5\n    window: %s\n    algorithm: fixed_window\n",
	    use_redis ? redis_head : memory_head, window);
}

/* Reload d with fr_yaml(window), %PORT% and %REDIS_PORT% written out, by
 * SIGHUP; waits for the reload's success (the reloads-th). */
static void
fr_reload(const struct h_daemon *d, const char *window, int reloads)
{
	char yaml[2048], out[2048], *p;
	size_t at = 0;

	fr_yaml(yaml, sizeof(yaml), window);
	for (p = yaml; *p != '\0' && at + 16 < sizeof(out);) {
		if (strncmp(p, "%PORT%", 6) == 0) {
			at += (size_t)snprintf(out + at, sizeof(out) - at, "%d",
			    d->port);
			p += 6;
		} else if (strncmp(p, "%REDIS_PORT%", 12) == 0) {
			at += (size_t)snprintf(out + at, sizeof(out) - at, "%d",
			    h_shared_redis.port);
			p += 12;
		} else
			out[at++] = *p++;
	}
	out[at] = '\0';
	ops_replace_file(d->conf, out);
	ck_assert(kill(d->pid, SIGHUP) == 0);
	ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
				      "{result=\"success\"}",
			  reloads, 3000) >= reloads,
	    "no reload");
}

/* POST /acquire {"t":"fr","cost":cost}: expects allowed and remaining. */
static void
expect_fr(struct conn *c, int cost, bool allowed, long long remaining,
    const char *what)
{
	char body[64];

	snprintf(body, sizeof(body), "{\"t\":\"fr\",\"cost\":%d}", cost);
	ck_assert_msg(h_request(c->curl, c->d.port, &c->r, "POST", "/acquire",
			  body, strlen(body), NULL) == 0,
	    "%s: %s", what, c->r.err);
	ck_assert_msg(c->r.status == (allowed ? 200 : 429),
	    "%s: status %ld, expected %d (body %s)", what, c->r.status,
	    allowed ? 200 : 429, c->r.body);
	ck_assert_msg(h_json_int(&c->r, "remaining") == remaining,
	    "%s: remaining %lld, expected %lld (body %s)", what,
	    h_json_int(&c->r, "remaining"), remaining, c->r.body);
}

/*
 * fixed_window, limit 5, window 3 s, reloaded to 6 s (docs/algorithms.md,
 * fixed_window: a reload keeps a window's count while its start is one
 * under the new W).  On the backend's clock, with B a multiple of 6 s
 * (so a window start under both windows):
 *	B+200 ms   cost 3: 200, 2 left (window [B, B+3 s), its end the TTL)
 *	           reload to window 6 s
 *	< B+2700   cost 1: 200, 1 left: the count of 3 is kept in [B, B+6 s)
 *	B+3500     cost 1: 200, 0 left; cost 1: 429
 * The key must not vanish at B+3 s, the old window's end: that would
 * forget the 4 units and admit 5 more in the same window.
 */
START_TEST(test_fixed_window_reload_longer)
{
	struct conn c;
	char yaml[2048];
	long long b, start;

	memset(&c, 0, sizeof(c));
	fr_yaml(yaml, sizeof(yaml), "3s");
	h_daemon_start(&c.d, yaml);
	c.curl = h_curl_new();
	/* B: a multiple of 6 s on the backend's clock whose +200 ms is at
	 * least 20 ms from now, as a time on h_now_ms(). */
	start = h_now_ms();
	b = start - (backend_now_us() % 6000000) / 1000;
	while (b + 200 < start + 20)
		b += 6000;
	sleep_until(b + 200);
	expect_fr(&c, 3, true, 2, "cost 3 at +200 ms, window 3 s");

	fr_reload(&c.d, "6s", 1);
	expect_fr(&c, 1, true, 1, "cost 1 after the reload to 6 s (3 kept)");
	ck_assert_msg(h_now_ms() < b + 2700,
	    "too slow: the reload and the request after it took until "
	    "+%lld ms, past +2700",
	    h_now_ms() - b);

	sleep_until(b + 3500);
	expect_fr(&c, 1, true, 0,
	    "cost 1 at +3500 ms (past the 3 s window's end, within 6 s)");
	expect_fr(&c, 1, false, 0, "cost 1 at +3500 ms (window 6 s full)");
	ck_assert_msg(h_now_ms() < b + 5800,
	    "too slow: the requests at +3500 ms took until +%lld ms, past "
	    "+5800",
	    h_now_ms() - b);
	conn_close(&c);
}
END_TEST

/*
 * token_bucket, limit 5, window 1 s: one unit comes back every 200 ms.
 * Five back to back are admitted and the sixth is denied with
 * retry_after_ms <= 200 (t0 + 200 minus the time the six took).  Sleeping
 * retry_after_ms + 50 ms gives exactly one more: the one after it needs
 * t0 + 400 and comes about 150 ms too early.
 */
START_TEST(test_token_bucket_one_more)
{
	struct conn c;
	long long t0, retry, retry2;
	int i;
	char what[64];

	conn_open(&c);
	t0 = h_now_ms();
	for (i = 1; i <= 5; i++) {
		snprintf(what, sizeof(what), "tb %d of the burst", i);
		expect(&c, "tb", true, 0, 0, what);
	}
	ck_assert_msg(!acquire(&c, "tb", &retry, "tb 6"),
	    "tb 6: allowed, expected denied (the burst is 5)");
	ck_assert_msg(h_now_ms() - t0 < 150,
	    "too slow: six requests took "
	    "%lld ms",
	    h_now_ms() - t0);
	ck_assert_msg(retry >= 1 && retry <= 200,
	    "tb 6: retry_after_ms "
	    "%lld, expected 1..200",
	    retry);

	h_sleep_ms(retry + 50);
	expect(&c, "tb", true, 0, 0, "tb 7, after retry_after_ms + 50 ms");
	ck_assert_msg(!acquire(&c, "tb", &retry2, "tb 8"),
	    "tb 8: allowed "
	    "right after tb 7, expected denied (one unit per 200 ms)");
	ck_assert_msg(h_now_ms() - t0 < 380,
	    "too slow: eight requests took "
	    "%lld ms, the 8th may have earned its unit",
	    h_now_ms() - t0);
	ck_assert_msg(retry2 >= 20 && retry2 <= 200,
	    "tb 8: retry_after_ms "
	    "%lld, expected about 150",
	    retry2);
	conn_close(&c);
}
END_TEST

/*
 * sliding_window, limit 20 per 1 s (B = 20: 50 ms buckets), fed 40
 * requests per second, evenly, for 3 s.  docs/algorithms.md bounds the
 * units in any window of length W by L + the count of one bucket (over),
 * and a window ending at a denial holds more than L - c - that count
 * (under).  At 40/s a bucket admits 2, a few more with timing jitter
 * (SW_BUCKET_MAX), and the run spans three windows, each ending near a
 * denial, so over the run
 *	3 * (L - 1 - SW_BUCKET_MAX) + 3 <= admitted <= 3 * (L + SW_BUCKET_MAX)
 * where an exact limiter admits 3 L = 60.
 */
START_TEST(test_sliding_window_overload)
{
	enum { N = 120, PERIOD_MS = 25 };
	long long sent[N], start, worst = 0;
	bool ok[N];
	int admitted = 0, i, j, in;
	struct conn c;
	char what[64];

	conn_open(&c);
	start = h_now_ms() + 20;
	for (i = 0; i < N; i++) {
		sleep_until(start + (long long)i * PERIOD_MS);
		sent[i] = h_now_ms();
		snprintf(what, sizeof(what), "sw request %d", i + 1);
		ok[i] = acquire(&c, "sw", NULL, what);
		admitted += ok[i];
	}
	ck_assert_msg(h_now_ms() - start < 3100,
	    "too slow: %d requests "
	    "took %lld ms instead of 3000",
	    N, h_now_ms() - start);
	/* For the log only: the most admitted in 1 s by the client's clock
	 * (off by the request's latency from the server's). */
	for (i = 0; i < N; i++) {
		for (in = 0, j = i; j < N && sent[j] < sent[i] + 1000; j++)
			in += ok[j];
		if (in > worst)
			worst = in;
	}
	fprintf(stderr,
	    "sliding_window (%s): %d of %d admitted in 3 s, at "
	    "most %lld in one second; an exact limit admits %d\n",
	    use_redis ? "redis" : "memory", admitted, N, worst, 3 * SW_LIMIT);
	ck_assert_msg(admitted <= 3 * (SW_LIMIT + SW_BUCKET_MAX),
	    "sliding_window admitted %d of %d in 3 s, more than 3 * (L + %d) "
	    "= %d",
	    admitted, N, SW_BUCKET_MAX, 3 * (SW_LIMIT + SW_BUCKET_MAX));
	ck_assert_msg(admitted >= 3 * (SW_LIMIT - 1 - SW_BUCKET_MAX) + 3,
	    "sliding_window admitted %d of %d in 3 s, fewer than "
	    "3 * (L - 1 - %d) + 3 = %d",
	    admitted, N, SW_BUCKET_MAX, 3 * (SW_LIMIT - 1 - SW_BUCKET_MAX) + 3);
	conn_close(&c);
}
END_TEST

/*
 * sliding_log, limit 1,000,000: one call of cost 1,000,000 is admitted and
 * leaves a sorted set of one member; the next unit is denied until that
 * run leaves the window; a denied call records nothing.  Before runs, the
 * same call added a million members (about 115 MB, seconds of Redis).
 */
START_TEST(test_log_large_cost)
{
	static const char body[] = "{\"t\":\"big\",\"cost\":1000000}";
	struct conn c;
	redisReply *keys, *mem;
	long long retry;

	conn_open(&c);
	ck_assert_msg(h_request(c.curl, c.d.port, &c.r, "POST", "/acquire",
			  body, strlen(body), NULL) == 0,
	    "cost 1e6: %s", c.r.err);
	ck_assert_msg(c.r.status == 200,
	    "cost 1e6: status %ld, expected 200 "
	    "(body %s)",
	    c.r.status, c.r.body);
	ck_assert_int_eq(h_json_int(&c.r, "remaining"), 0);
	ck_assert_msg(!acquire(&c, "big", &retry, "one more unit"),
	    "one more unit: allowed past the limit of 1,000,000");
	ck_assert_msg(retry > 59000 && retry <= 60000,
	    "one more unit: "
	    "retry_after_ms %lld, expected about the 60 s window",
	    retry);

	keys = redisCommand(h_redis_ctx(&h_shared_redis), "KEYS alg:big:*");
	ck_assert_msg(keys != NULL && keys->type == REDIS_REPLY_ARRAY &&
		keys->elements == 1,
	    "expected one key alg:big:*");
	ck_assert_int_eq(h_redis_int(&h_shared_redis, "ZCARD %s",
			     keys->element[0]->str),
	    1);
	mem = redisCommand(h_redis_ctx(&h_shared_redis),
	    "MEMORY USAGE %s SAMPLES 0", keys->element[0]->str);
	ck_assert_msg(mem != NULL && mem->type == REDIS_REPLY_INTEGER &&
		mem->integer < 1024,
	    "MEMORY USAGE of the key: %lld bytes, "
	    "expected < 1 KiB",
	    mem != NULL ? mem->integer : -1);
	freeReplyObject(mem);
	freeReplyObject(keys);
	conn_close(&c);
}
END_TEST

/* --- fixtures and main -------------------------------------------------- */

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
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_fixed_vs_sliding_at_boundary);
	tcase_add_test(tc, test_token_bucket_one_more);
	tcase_add_test(tc, test_fixed_window_reload_longer);
	tcase_add_test(tc, test_sliding_window_overload);
	if (with_redis)
		tcase_add_test(tc, test_log_large_cost);
	return tc;
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("algorithms");

	suite_add_tcase(s, backend_tcase("memory", false));
	suite_add_tcase(s, backend_tcase("redis", true));
	test_main_at_end(h_shared_redis_stop);
	return s;
}
