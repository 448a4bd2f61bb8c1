/*
 * check_report.c - POST /report (docs/http.md, docs/algorithms.md "Usage
 * reported after the fact") against the real daemon: with the memory
 * store, with one Redis, and with two daemons sharing one Redis (the
 * report on one, the acquires on the other).  For each algorithm: a
 * report past the limit is recorded and answered 200 with how far it is
 * overdrawn; the key then denies with a retry_after_ms that the
 * algorithm's drain explains; and once that time has passed it admits
 * again.  Also the answer's shape: shadow and concurrency rules skipped,
 * a cost above the limit accepted, no rule applying, a bad body.
 *
 * tests/vectors/algorithms.txt pins the exact numbers with a fake clock;
 * this checks the daemon runs them on the store's clock, end to end.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    "  timeout: 500ms\n"
    "  key_prefix: \"rep:\"\n"
    "on_backend_error: deny\n";

#define RULE(name, alg) \
	"  - name: " name \
	"\n" \
	"    match: { t: " name \
	" }\n" \
	"    key: \"${user}\"\n" \
	"    limit: 3\n" \
	"    window: 1s\n" \
	"    algorithm: " alg "\n"

static const char rules_yaml[] =
    "rules:\n" RULE("sl", "sliding_log") RULE("fw", "fixed_window")
	RULE("tb", "token_bucket") RULE("sw", "sliding_window")
	    "  - name: tw\n"
	    "    match: { t: tw }\n"
	    "    key: \"${user}\"\n"
	    "    limit: 3\n"
	    "    window: 10s\n"
	    "  - name: shadowed\n"
	    "    match: { t: sl }\n"
	    "    limit: 1\n"
	    "    window: 1s\n"
	    "    shadow: true\n"
	    "  - name: conc\n"
	    "    match: { t: sl }\n"
	    "    limit: 1\n"
	    "    window: 1s\n"
	    "    algorithm: concurrency\n";

/* The algorithms, by rule name, with the retry the drain gives after one
 * unit and a report of 5 on a limit of 3 per second (docs/algorithms.md):
 * sliding_log, the 4th unit leaves 1 s after the report; token_bucket,
 * the TAT is 6/3 s ahead and one more unit fits 4/3 s after the first;
 * sliding_window, their bucket leaves the window about 1 s later (within
 * a 50 ms bucket); fixed_window, the window's end, anywhere in it. */
static const struct {
	const char *rule;
	long long min_retry, max_retry;
} algs[] = {
	{ "sl", 850, 1000 },
	{ "fw", 1, 1000 },
	{ "tb", 1150, 1340 },
	{ "sw", 800, 1050 },
};

/* Set in the runner by the TCase's unchecked fixture. */
static int mode; /* 0 memory, 1 redis, 2 two daemons on one redis */

static void
start_daemons(struct h_daemon *a, struct h_daemon *b)
{
	char yaml[4096];

	snprintf(yaml, sizeof(yaml), "%s%s",
	    mode == 0 ? memory_head : redis_head, rules_yaml);
	memset(a, 0, sizeof(*a));
	memset(b, 0, sizeof(*b));
	h_daemon_start(a, yaml);
	if (mode == 2)
		h_daemon_start(b, yaml);
}

static void
stop_daemons(struct h_daemon *a, struct h_daemon *b)
{
	h_daemon_stop(a);
	if (mode == 2)
		h_daemon_stop(b);
}

/* The first row of a report's "rules" whose rule is name, or NULL. */
static json_t *
report_row(struct h_resp *r, const char *name)
{
	json_t *rules = h_json_get(r, "rules"), *row;
	size_t i;

	json_array_foreach(rules, i, row)
	{
		const char *n = json_string_value(json_object_get(row, "rule"));

		if (n != NULL && strcmp(n, name) == 0)
			return row;
	}
	return NULL;
}

static long long
row_int(json_t *row, const char *field)
{
	json_t *v = json_object_get(row, field);

	ck_assert_msg(json_is_integer(v), "field %s is not an integer", field);
	return json_integer_value(v);
}

/* fixed_window: keep the steps inside one window of the store's clock
 * (200 .. 600 ms into a second). */
static void
away_from_window_edge(void)
{
	struct timespec ts;
	long long ms;
	redisReply *rep;

	if (mode == 0) {
		clock_gettime(CLOCK_REALTIME, &ts);
		ms = ts.tv_nsec / 1000000;
	} else {
		rep = redisCommand(h_redis_ctx(&h_shared_redis), "TIME");
		ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_ARRAY,
		    "TIME failed");
		ms = atoll(rep->element[1]->str) / 1000;
		freeReplyObject(rep);
	}
	if (ms < 200)
		h_sleep_ms(200 - ms);
	else if (ms > 600)
		h_sleep_ms(1200 - ms);
}

START_TEST(test_report_overdraws_then_drains)
{
	const char *rule = algs[_i].rule;
	struct h_daemon a, b;
	struct h_resp r = { 0 };
	char body[128];
	long long retry, t0;
	json_t *row;
	int other;

	start_daemons(&a, &b);
	other = mode == 2 ? b.port : a.port;
	if (strcmp(rule, "fw") == 0)
		away_from_window_edge();

	/* One unit, then a report of 5 on a limit of 3: 6 used, 3 over. */
	snprintf(body, sizeof(body), "{\"t\":\"%s\",\"user\":\"u1\"}", rule);
	h_post(a.port, "/acquire", body, &r);
	ck_assert_int_eq(r.status, 200);
	snprintf(body, sizeof(body),
	    "{\"t\":\"%s\",\"user\":\"u1\",\"cost\":5}", rule);
	t0 = h_now_ms();
	h_post(a.port, "/report", body, &r);
	ck_assert_msg(r.status == 200, "%s: /report %ld %s", rule, r.status,
	    r.body);
	ck_assert(json_is_true(h_json_get(&r, "recorded")));
	ck_assert_int_eq(json_array_size(h_json_get(&r, "rules")), 1);
	row = report_row(&r, rule);
	ck_assert_msg(row != NULL, "%s: no row in %s", rule, r.body);
	ck_assert_int_eq(row_int(row, "limit"), 3);
	ck_assert_int_eq(row_int(row, "remaining"), 0);
	/* 6 units on 3; token_bucket may count the first as a little
	 * refilled already. */
	ck_assert_msg(row_int(row, "overdrawn") >= 2 &&
		row_int(row, "overdrawn") <= 3,
	    "%s: overdrawn %lld", rule, row_int(row, "overdrawn"));

	/* Denied, on the other daemon too, until the usage drains. */
	snprintf(body, sizeof(body), "{\"t\":\"%s\",\"user\":\"u1\"}", rule);
	h_post(other, "/acquire", body, &r);
	ck_assert_msg(r.status == 429, "%s: after the report %ld %s", rule,
	    r.status, r.body);
	retry = h_json_int(&r, "retry_after_ms");
	ck_assert_msg(retry >= algs[_i].min_retry - (h_now_ms() - t0) &&
		retry <= algs[_i].max_retry + 200,
	    "%s: retry_after_ms %lld", rule, retry);
	/* Half-way through: still denied. */
	if (retry > 300) {
		h_sleep_ms(retry / 2);
		h_post(other, "/acquire", body, &r);
		ck_assert_msg(r.status == 429, "%s: half-way %ld", rule,
		    r.status);
	}
	/* Past the retry the first answer gave: admitted again. */
	while (h_now_ms() < t0 + retry + 60)
		h_sleep_ms(10);
	h_post(other, "/acquire", body, &r);
	ck_assert_msg(r.status == 200, "%s: after %lld ms: %ld %s", rule,
	    h_now_ms() - t0, r.status, r.body);
	h_resp_free(&r);
	stop_daemons(&a, &b);
}
END_TEST

/* The answer's shape: shadow and concurrency rules are not recorded in;
 * a cost above the limit is taken; no rule: recorded false. */
START_TEST(test_report_answer)
{
	struct h_daemon a, b;
	struct h_resp r = { 0 };
	json_t *row;

	start_daemons(&a, &b);
	h_post(a.port, "/report", "{\"t\":\"sl\",\"user\":\"u2\",\"cost\":2}",
	    &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(json_array_size(h_json_get(&r, "rules")), 1);
	row = report_row(&r, "sl");
	ck_assert_ptr_nonnull(row);
	ck_assert_int_eq(row_int(row, "remaining"), 1);
	ck_assert_ptr_null(json_object_get(row, "overdrawn"));

	h_post(a.port, "/report", "{\"t\":\"sl\",\"user\":\"u2\",\"cost\":50}",
	    &r);
	ck_assert_int_eq(r.status, 200);
	row = report_row(&r, "sl");
	ck_assert_int_eq(row_int(row, "remaining"), 0);
	ck_assert_int_eq(row_int(row, "overdrawn"), 49);

	h_post(a.port, "/report", "{\"t\":\"none\"}", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert(json_is_false(h_json_get(&r, "recorded")));
	ck_assert_int_eq(json_array_size(h_json_get(&r, "rules")), 0);

	h_post(a.port, "/report", "{\"t\":\"sl\",\"user\":\"u2\",\"cost\":-1}",
	    &r);
	ck_assert_int_eq(r.status, 400);
	ck_assert_str_eq(h_json_str(&r, "error"), "invalid_cost");
	/* Past any limit up to 2^53; past 2^53 the cost is invalid, with
	 * that range in the message (cost_exceeds_limit is not a
	 * report's). */
	h_post(a.port, "/report",
	    "{\"t\":\"sl\",\"user\":\"u3\",\"cost\":9007199254740992}", &r);
	ck_assert_int_eq(r.status, 200);
	h_post(a.port, "/report",
	    "{\"t\":\"sl\",\"user\":\"u3\",\"cost\":9007199254740993}", &r);
	ck_assert_int_eq(r.status, 400);
	ck_assert_str_eq(h_json_str(&r, "error"), "invalid_cost");
	ck_assert_ptr_nonnull(strstr(h_json_str(&r, "message"),
	    "9007199254740992"));
	h_post(a.port, "/report", "[1]", &r);
	ck_assert_int_eq(r.status, 400);
	h_http(&r, "GET", "/report", NULL, NULL);
	ck_assert_int_eq(r.status, 405);

	if (mode != 2) { /* h_metric asks the last daemon started */
		ck_assert_int_eq(
		    h_metric("ratelimitd_reports_total{result=\"within\"}"), 1);
		ck_assert_int_eq(
		    h_metric("ratelimitd_reports_total{result=\"overdrawn\"}"),
		    2);
	}
	h_resp_free(&r);
	stop_daemons(&a, &b);
}
END_TEST

/*
 * A request of cost 0 on a key a report took past its limit (tw: 3 in
 * 10 s; one unit, 1.1 s later two, then a report of one) is denied until
 * the oldest unit leaves, about 8.9 s.  One unit more than its remaining
 * (0) would fit only when the next leaves, at about 10 s: t must not say
 * so, since a Retry-After is never earlier than t (docs/http.md).  (It
 * said t=10 beside Retry-After: 9.)
 */
START_TEST(test_report_over_t_within_retry)
{
	struct h_daemon a, b;
	struct h_resp r = { 0 };
	const char *rl, *ra;
	long long t, retry;

	start_daemons(&a, &b);
	h_post(a.port, "/acquire", "{\"t\":\"tw\",\"user\":\"o\"}", &r);
	ck_assert_int_eq(r.status, 200);
	h_sleep_ms(1100);
	h_post(a.port, "/acquire", "{\"t\":\"tw\",\"user\":\"o\",\"cost\":2}",
	    &r);
	ck_assert_int_eq(r.status, 200);
	h_post(a.port, "/report", "{\"t\":\"tw\",\"user\":\"o\",\"cost\":1}",
	    &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(row_int(report_row(&r, "tw"), "overdrawn"), 1);
	h_post(a.port, "/acquire", "{\"t\":\"tw\",\"user\":\"o\",\"cost\":0}",
	    &r);
	ck_assert_int_eq(r.status, 429);
	rl = h_resp_header(&r, "RateLimit");
	ra = h_resp_header(&r, "Retry-After");
	ck_assert_ptr_nonnull(rl);
	ck_assert_ptr_nonnull(ra);
	ck_assert_ptr_nonnull(strstr(rl, ";t="));
	t = atoll(strstr(rl, ";t=") + 3);
	retry = atoll(ra);
	ck_assert_int_eq(retry,
	    (h_json_int(&r, "retry_after_ms") + 999) / 1000);
	ck_assert_msg(retry >= 8 && t <= retry,
	    "RateLimit: %s, Retry-After: %s", rl, ra);
	h_resp_free(&r);
	stop_daemons(&a, &b);
}
END_TEST

/* wait_ms is no attribute of a report and is ignored, whatever its value
 * (docs/http.md): a report never waits, so none of these is a 400. */
START_TEST(test_report_ignores_wait)
{
	static const char *const bodies[] = {
		"{\"t\":\"fw\",\"user\":\"w\",\"wait_ms\":100}",
		"{\"t\":\"fw\",\"user\":\"w\",\"wait_ms\":\"soon\"}",
		"{\"t\":\"fw\",\"user\":\"w\",\"wait_ms\":99999999}",
		"{\"t\":\"fw\",\"user\":\"w\",\"wait_ms\":-1.5}",
	};
	struct h_daemon a, b;
	struct h_resp r = { 0 };
	size_t i;

	start_daemons(&a, &b);
	for (i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		h_post(a.port, "/report", bodies[i], &r);
		ck_assert_msg(r.status == 200, "%s: %ld %s", bodies[i],
		    r.status, r.body);
		ck_assert(json_is_true(h_json_get(&r, "recorded")));
		ck_assert_ptr_nonnull(report_row(&r, "fw"));
	}
	h_resp_free(&r);
	stop_daemons(&a, &b);
}
END_TEST

/* --- fixtures and main -------------------------------------------------- */

static void
use_memory(void)
{
	mode = 0;
}

static void
use_redis(void)
{
	mode = 1;
	h_shared_redis_up();
}

static void
use_two(void)
{
	mode = 2;
	h_shared_redis_up();
}

static void
flush_redis(void)
{
	if (mode != 0)
		h_shared_redis_flush();
}

static TCase *
store_tcase(const char *name, void (*setup)(void))
{
	TCase *tc = tcase_create(name);

	tcase_add_unchecked_fixture(tc, setup, h_reap_orphans);
	tcase_add_checked_fixture(tc, flush_redis, h_test_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_report_overdraws_then_drains, 0,
	    (int)(sizeof(algs) / sizeof(algs[0])));
	tcase_add_test(tc, test_report_answer);
	tcase_add_test(tc, test_report_ignores_wait);
	tcase_add_test(tc, test_report_over_t_within_retry);
	return tc;
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("report");

	suite_add_tcase(s, store_tcase("memory", use_memory));
	suite_add_tcase(s, store_tcase("redis", use_redis));
	suite_add_tcase(s, store_tcase("two_daemons", use_two));
	test_main_at_end(h_shared_redis_stop);
	return s;
}
