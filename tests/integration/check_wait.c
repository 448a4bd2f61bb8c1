/*
 * check_wait.c - waiting for a turn over HTTP (docs/waiting.md) on a real
 * daemon with the memory store: many waiters on one key are answered in
 * arrival order at times that respect the limit (the spacing of the
 * answers is printed), a waiter that disconnects keeps its reservation, a
 * full max_waiting answers 429 at once, SIGTERM answers the waiters due
 * within shutdown_timeout and 503s the others, and a bad wait_ms is 400
 * invalid_wait.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"

#define WAITERS 12

static const char yaml[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 1200ms\n"
    "backend: memory\n"
    "max_waiting: 20\n"
    "rules:\n"
    "  - name: log3\n"
    "    match: { t: log }\n"
    "    key: \"${w}\"\n"
    "    algorithm: sliding_log\n"
    "    limit: 3\n"
    "    window: 1s\n"
    "  - name: one\n"
    "    match: { t: one }\n"
    "    key: \"${w}\"\n"
    "    algorithm: sliding_log\n"
    "    limit: 1\n"
    "    window: 1s\n"
    "  - name: sw\n"
    "    match: { t: sw }\n"
    "    key: \"${w}\"\n"
    "    algorithm: sliding_window\n"
    "    limit: 1\n"
    "    window: 10s\n"
    "  - name: tb2\n"
    "    match: { t: tb2 }\n"
    "    key: \"${w}\"\n"
    "    algorithm: token_bucket\n"
    "    limit: 2\n"
    "    window: 4s\n";

static const char redis_head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 1200ms\n"
    "backend: redis\n"
    "redis:\n"
    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
    "  timeout: 1s\n"
    "on_backend_error: deny\n"
    "max_waiting: 20\n";

static const char redis_rules[] =
    "rules:\n"
    "  - name: log3\n"
    "    match: { t: log }\n"
    "    key: \"${w}\"\n"
    "    algorithm: sliding_log\n"
    "    limit: 3\n"
    "    window: 1s\n"
    "  - name: fw3\n"
    "    match: { t: fw }\n"
    "    key: \"${w}\"\n"
    "    algorithm: fixed_window\n"
    "    limit: 3\n"
    "    window: 1s\n"
    "  - name: tb\n"
    "    match: { t: tb }\n"
    "    key: \"${w}\"\n"
    "    algorithm: token_bucket\n"
    "    limit: 3\n"
    "    window: 1s\n"
    "  - name: one\n"
    "    match: { t: one }\n"
    "    key: \"${w}\"\n"
    "    algorithm: sliding_log\n"
    "    limit: 1\n"
    "    window: 1s\n";

struct waiter {
	int port;
	const char *body;
	long long delay_ms;	    /* before sending */
	long status;		    /* out */
	long long waited_ms;	    /* out, -1 when absent */
	long long sent_ms, done_ms; /* out */
	char error[64];		    /* out */
};

static void *
waiter_main(void *arg)
{
	struct waiter *w = arg;
	CURL *c = h_curl_new();
	struct h_resp r;
	json_t *v;

	memset(&r, 0, sizeof(r));
	if (w->delay_ms > 0)
		h_sleep_ms(w->delay_ms);
	w->sent_ms = h_now_ms();
	(void)h_request(c, w->port, &r, "POST", "/acquire", w->body,
	    strlen(w->body), NULL);
	w->done_ms = h_now_ms();
	w->status = r.status;
	w->waited_ms = (v = h_json_get(&r, "waited_ms")) != NULL &&
		json_is_integer(v) ?
	    json_integer_value(v) :
	    -1;
	snprintf(w->error, sizeof(w->error), "%s",
	    h_json_str(&r, "error") != NULL ? h_json_str(&r, "error") : "");
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return NULL;
}

static void send_and_leave(int port, const char *body, long long ms);

static void
start_waiter(pthread_t *t, struct waiter *w, int port, const char *body,
    long long delay_ms)
{
	memset(w, 0, sizeof(*w));
	w->port = port;
	w->body = body;
	w->delay_ms = delay_ms;
	ck_assert_int_eq(pthread_create(t, NULL, waiter_main, w), 0);
}

static long
post(const char *body, struct h_resp *r)
{
	memset(r, 0, sizeof(*r));
	h_http(r, "POST", "/acquire", body, NULL);
	return r->status;
}

/* The algorithm a run_waiters() key has. */
enum kind { K_LOG, K_FIXED, K_BUCKET };

/* WAITERS requests 30 ms apart on one key limited to 3 a second, sent
 * to the daemons of ports[] in turn: every one is 200, in the order
 * sent, and any 4 consecutive answers span at least the window
 * (sliding_log); any 7 (fixed_window: two windows hold 6); for
 * token_bucket, consecutive answers after the burst are W/L apart. */
static void
run_waiters(const char *what, const int *ports, int nports, const char *body,
    enum kind kind)
{
	bool bucket = kind == K_BUCKET;
	int n = kind == K_FIXED ? 6 : 3;
	pthread_t t[WAITERS];
	struct waiter w[WAITERS];
	long long min_span = -1, min_gap = -1, span, due;
	int i;

	for (i = 0; i < WAITERS; i++)
		start_waiter(&t[i], &w[i], ports[i % nports], body, 30LL * i);
	for (i = 0; i < WAITERS; i++)
		pthread_join(t[i], NULL);
	for (i = 0; i < WAITERS; i++) {
		ck_assert_msg(w[i].status == 200, "waiter %d: %ld %s", i,
		    w[i].status, w[i].error);
		/* Never before its turn: the store counts from the first
		 * request's arrival, which is after sent_ms (a late answer
		 * is harmless, an early one breaks the limit). */
		due = kind == K_LOG ? (i / 3) * 1000LL :
		    kind == K_FIXED ? (i / 3 - 1) * 1000LL :
				      (i - 2) * 1000LL / 3;
		ck_assert_msg(w[i].done_ms - w[0].sent_ms >= due - 2,
		    "waiter %d answered %lld ms after the first was sent, "
		    "before its turn (%lld ms)",
		    i, w[i].done_ms - w[0].sent_ms, due);
		if (i > 0) /* first come, first served */
			ck_assert_msg(w[i].done_ms + 150 >= w[i - 1].done_ms,
			    "waiter %d answered %lld ms before waiter %d", i,
			    w[i - 1].done_ms - w[i].done_ms, i - 1);
		if (bucket && i >= 4) {
			span = w[i].done_ms - w[i - 1].done_ms;
			if (min_gap < 0 || span < min_gap)
				min_gap = span;
		}
		if (!bucket && i >= n) {
			span = w[i].done_ms - w[i - n].done_ms;
			if (min_span < 0 || span < min_span)
				min_span = span;
		}
		/* fixed_window: a window may begin among the first ones. */
		if (i >= 3 && kind != K_FIXED)
			ck_assert_int_gt(w[i].waited_ms, 0);
	}
	/* 12 at 3 a second: the last is answered about 3 s after the
	 * first. */
	if (bucket)
		fprintf(stderr,
		    "%s: %d waiters over %d daemon(s), limit "
		    "3/1s: first to last %lld ms, shortest gap after the "
		    "burst %lld ms (W/L is 333 ms)\n",
		    what, WAITERS, nports,
		    w[WAITERS - 1].done_ms - w[0].done_ms, min_gap);
	else
		fprintf(stderr,
		    "%s: %d waiters over %d daemon(s), limit "
		    "3/1s: first to last %lld ms, shortest span of %d "
		    "consecutive answers %lld ms (the window is 1000 ms)\n",
		    what, WAITERS, nports,
		    w[WAITERS - 1].done_ms - w[0].done_ms, n + 1, min_span);
	ck_assert_int_ge(w[WAITERS - 1].done_ms - w[0].done_ms,
	    kind == K_LOG	? 3000 - 100 :
		kind == K_FIXED ? 2000 - 100 :
				  2667 - 100);
}

START_TEST(test_waiters_in_order_within_limit)
{
	struct h_daemon d;

	h_daemon_start(&d, yaml);
	run_waiters("memory sliding_log", &d.port, 1,
	    "{\"t\":\"log\",\"w\":\"a\",\"wait_ms\":10000}", K_LOG);
	h_daemon_stop(&d);
}
END_TEST

/* Two daemons on one Redis, each algorithm that waits. */
START_TEST(test_redis_two_daemons)
{
	static const char *const bodies[] = {
		"{\"t\":\"log\",\"w\":\"a\",\"wait_ms\":10000}",
		"{\"t\":\"fw\",\"w\":\"a\",\"wait_ms\":10000}",
		"{\"t\":\"tb\",\"w\":\"a\",\"wait_ms\":10000}",
	};
	static const char *const names[] = { "redis sliding_log",
		"redis fixed_window", "redis token_bucket" };
	char conf[2048];
	struct h_daemon d[2];
	int ports[2], i = _i;

	snprintf(conf, sizeof(conf), "%s%s", redis_head, redis_rules);
	memset(d, 0, sizeof(d));
	h_daemon_start(&d[0], conf);
	h_daemon_start(&d[1], conf);
	ports[0] = d[0].port;
	ports[1] = d[1].port;
	run_waiters(names[i], ports, 2, bodies[i], (enum kind)i);
	h_daemon_stop(&d[1]);
	h_daemon_stop(&d[0]);
}
END_TEST

/* On Redis: a disconnected waiter keeps its turn across daemons, and
 * SIGTERM answers the waiter due in time and 503s the other. */
START_TEST(test_redis_disconnect_and_sigterm)
{
	char conf[2048];
	struct h_daemon d[2];
	struct h_resp r;
	pthread_t t[3];
	struct waiter w[3];

	snprintf(conf, sizeof(conf), "%s%s", redis_head, redis_rules);
	memset(d, 0, sizeof(d));
	h_daemon_start(&d[0], conf);
	h_daemon_start(&d[1], conf);
	ck_assert_int_eq(post("{\"t\":\"one\",\"w\":\"r\"}", &r), 200);
	h_resp_free(&r);
	send_and_leave(d[0].port,
	    "{\"t\":\"one\",\"w\":\"r\",\"wait_ms\":5000}", 100);
	start_waiter(&t[0], &w[0], d[0].port,
	    "{\"t\":\"one\",\"w\":\"r\",\"wait_ms\":5000}", 0);
	pthread_join(t[0], NULL);
	ck_assert_int_eq(w[0].status, 200);
	ck_assert_msg(w[0].waited_ms > 1000,
	    "waited %lld ms: the gone "
	    "waiter's turn was given away",
	    w[0].waited_ms);

	/* The last unit is at T (w[0]'s turn): one waiter due at T + 1 s,
	 * the next at T + 2 s; SIGTERM to the daemon holding both. */
	start_waiter(&t[1], &w[1], d[1].port,
	    "{\"t\":\"one\",\"w\":\"r\",\"wait_ms\":8000}", 0);
	start_waiter(&t[2], &w[2], d[1].port,
	    "{\"t\":\"one\",\"w\":\"r\",\"wait_ms\":8000}", 150);
	h_sleep_ms(400);
	h_daemon_stop(&d[1]);
	pthread_join(t[1], NULL);
	pthread_join(t[2], NULL);
	ck_assert_msg(w[1].status == 200, "the first waiter: %ld %s",
	    w[1].status, w[1].error);
	ck_assert_msg(w[2].status == 503 &&
		strcmp(w[2].error, "shutting_down") == 0,
	    "the second waiter: %ld %s", w[2].status, w[2].error);
	h_daemon_stop(&d[0]);
}
END_TEST

/* Send one /acquire on a raw socket and close it after ms, unanswered. */
static void
send_and_leave(int port, const char *body, long long ms)
{
	struct sockaddr_in sin;
	char req[512];
	int fd, n;

	n = snprintf(req, sizeof(req),
	    "POST /acquire HTTP/1.1\r\n"
	    "Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: %zu\r\n\r\n%s",
	    strlen(body), body);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((unsigned short)port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM, 0), 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(write(fd, req, (size_t)n), n);
	h_sleep_ms(ms);
	close(fd);
}

/* A waiter that goes away keeps its reservation: the next one waits for
 * the window after it. */
START_TEST(test_disconnected_waiter_keeps_its_turn)
{
	struct h_daemon d;
	struct h_resp r;
	pthread_t t;
	struct waiter next;

	h_daemon_start(&d, yaml);
	ck_assert_int_eq(post("{\"t\":\"one\",\"w\":\"b\"}", &r), 200);
	h_resp_free(&r);
	send_and_leave(d.port, "{\"t\":\"one\",\"w\":\"b\",\"wait_ms\":5000}",
	    200);
	start_waiter(&t, &next, d.port,
	    "{\"t\":\"one\",\"w\":\"b\",\"wait_ms\":5000}", 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(next.status, 200);
	/* The window after the one the gone waiter holds. */
	ck_assert_msg(next.waited_ms > 1000,
	    "waited %lld ms: the gone "
	    "waiter's turn was given away",
	    next.waited_ms);
	h_daemon_stop(&d);
}
END_TEST

/* max_waiting 2: the third waiter is answered 429 at once. */
START_TEST(test_max_waiting)
{
	static const char small[] =
	    "listen: \"127.0.0.1:%PORT%\"\n"
	    "backend: memory\n"
	    "max_waiting: 2\n"
	    "rules:\n"
	    "  - name: one\n"
	    "    key: \"${w}\"\n"
	    "    algorithm: sliding_log\n"
	    "    limit: 1\n"
	    "    window: 2s\n";
	struct h_daemon d;
	struct h_resp r;
	pthread_t t[3];
	struct waiter w[3];
	int i;

	h_daemon_start(&d, small);
	ck_assert_int_eq(post("{\"w\":\"c\"}", &r), 200);
	h_resp_free(&r);
	for (i = 0; i < 2; i++)
		start_waiter(&t[i], &w[i], d.port,
		    "{\"w\":\"c\",\"wait_ms\":10000}", 0);
	h_sleep_ms(300);
	start_waiter(&t[2], &w[2], d.port, "{\"w\":\"c\",\"wait_ms\":10000}",
	    0);
	pthread_join(t[2], NULL);
	ck_assert_int_eq(w[2].status, 429);
	ck_assert_msg(w[2].done_ms - w[2].sent_ms < 1000,
	    "the third waiter "
	    "was held %lld ms",
	    w[2].done_ms - w[2].sent_ms);
	/* Both held for their turn (the metrics count them), one refused. */
	ck_assert_int_eq(h_metric("ratelimitd_waiting_requests"
				  "{for=\"turn\"}"),
	    2);
	ck_assert_int_eq(h_metric("ratelimitd_wait_full_total"), 1);
	for (i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(w[i].status, 200);
	}
	ck_assert_int_eq(h_metric_settles("ratelimitd_waiting_requests"
					  "{for=\"turn\"}",
			     0),
	    0);
	h_daemon_stop(&d);
}
END_TEST

/* SIGTERM with two waiters (due about 1 s and 2 s after the first
 * request): the one due within shutdown_timeout (1.2 s after the SIGTERM)
 * is answered 200 at its time, the other 503 shutting_down at once; the
 * daemon exits 0. */
START_TEST(test_sigterm_with_waiters)
{
	struct h_daemon d;
	struct h_resp r;
	pthread_t t[2];
	struct waiter w[2];
	long long sigterm_ms;

	h_daemon_start(&d, yaml);
	ck_assert_int_eq(post("{\"t\":\"one\",\"w\":\"e\"}", &r), 200);
	h_resp_free(&r);
	start_waiter(&t[0], &w[0], d.port,
	    "{\"t\":\"one\",\"w\":\"e\",\"wait_ms\":8000}", 0);
	start_waiter(&t[1], &w[1], d.port,
	    "{\"t\":\"one\",\"w\":\"e\",\"wait_ms\":8000}", 150);
	h_sleep_ms(400);
	sigterm_ms = h_now_ms();
	h_daemon_stop(&d); /* SIGTERM; asserts exit 0 */
	pthread_join(t[0], NULL);
	pthread_join(t[1], NULL);
	ck_assert_msg(w[0].status == 200, "the first waiter: %ld %s",
	    w[0].status, w[0].error);
	ck_assert_msg(w[1].status == 503 &&
		strcmp(w[1].error, "shutting_down") == 0,
	    "the second waiter: %ld %s", w[1].status, w[1].error);
	ck_assert_msg(w[1].done_ms - sigterm_ms < 700,
	    "the second waiter "
	    "was held %lld ms after SIGTERM",
	    w[1].done_ms - sigterm_ms);
}
END_TEST

START_TEST(test_invalid_wait)
{
	static const char *const bad[] = {
		"{\"t\":\"log\",\"w\":\"f\",\"wait_ms\":-1}",
		"{\"t\":\"log\",\"w\":\"f\",\"wait_ms\":\"100\"}",
		"{\"t\":\"log\",\"w\":\"f\",\"wait_ms\":1.5}",
		"{\"t\":\"log\",\"w\":\"f\",\"wait_ms\":30001}",
	};
	struct h_daemon d;
	struct h_resp r;
	size_t i;

	h_daemon_start(&d, yaml);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_int_eq(post(bad[i], &r), 400);
		ck_assert_str_eq(h_json_str(&r, "error"), "invalid_wait");
		h_resp_free(&r);
	}
	/* The bound itself is fine, and 0 answers at once. */
	ck_assert_int_eq(post("{\"t\":\"log\",\"w\":\"f\",\"wait_ms\":30000}",
			     &r),
	    200);
	h_resp_free(&r);
	ck_assert_int_eq(post("{\"t\":\"log\",\"w\":\"f\",\"wait_ms\":0}", &r),
	    200);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/* A request that a sliding_window rule denies is answered at once. */
START_TEST(test_sliding_window_answers_at_once)
{
	struct h_daemon d;
	struct h_resp r;
	long long t0;

	h_daemon_start(&d, yaml);
	ck_assert_int_eq(post("{\"t\":\"sw\",\"w\":\"g\"}", &r), 200);
	h_resp_free(&r);
	t0 = h_now_ms();
	ck_assert_int_eq(post("{\"t\":\"sw\",\"w\":\"g\",\"wait_ms\":20000}",
			     &r),
	    429);
	h_resp_free(&r);
	ck_assert_int_lt(h_now_ms() - t0, 1000);
	h_daemon_stop(&d);
}
END_TEST

/*
 * A waited answer's times are as of when it is sent, not of the decision
 * made waited_ms earlier (docs/waiting.md).  token_bucket 2 per 4 s, two
 * taken at 0: the third waits for the token of +2 s, and is answered
 * then with the bucket full again 4 s later (reset_ms about 4000,
 * X-RateLimit-Reset 4) and the next token 2 s later (t=2); as of the
 * decision these were 6000, 6 and 4.
 */
START_TEST(test_waited_answer_times)
{
	struct h_daemon d;
	struct h_resp r;
	const char *rl, *t;
	long long waited, reset_ms, reset_s, t_s;

	h_daemon_start(&d, yaml);
	ck_assert_int_eq(post("{\"t\":\"tb2\",\"w\":\"h\"}", &r), 200);
	h_resp_free(&r);
	ck_assert_int_eq(post("{\"t\":\"tb2\",\"w\":\"h\"}", &r), 200);
	h_resp_free(&r);
	ck_assert_int_eq(post("{\"t\":\"tb2\",\"w\":\"h\",\"wait_ms\":3000}",
			     &r),
	    200);
	waited = h_json_int(&r, "waited_ms");
	reset_ms = h_json_int(&r, "reset_ms");
	reset_s = atoll(h_resp_header(&r, "X-RateLimit-Reset"));
	rl = h_resp_header(&r, "RateLimit");
	ck_assert_ptr_nonnull(rl);
	t = strstr(rl, ";t=");
	ck_assert_ptr_nonnull(t);
	t_s = atoll(t + 3);
	ck_assert_msg(waited > 1500 && waited <= 2000, "waited_ms %lld",
	    waited);
	ck_assert_msg(reset_ms >= 3500 && reset_ms <= 4000,
	    "reset_ms %lld after waiting %lld ms", reset_ms, waited);
	ck_assert_msg(reset_s == 4, "X-RateLimit-Reset %lld", reset_s);
	ck_assert_msg(t_s == 2, "RateLimit %s", rl);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("wait");
	TCase *mem = tcase_create("memory");
	TCase *red = h_shared_redis_tcase("redis");

	tcase_add_unchecked_fixture(mem, NULL, h_reap_orphans);
	tcase_add_checked_fixture(mem, NULL, h_test_teardown);
	tcase_set_timeout(mem, 60);
	tcase_add_test(mem, test_waiters_in_order_within_limit);
	tcase_add_test(mem, test_disconnected_waiter_keeps_its_turn);
	tcase_add_test(mem, test_max_waiting);
	tcase_add_test(mem, test_sigterm_with_waiters);
	tcase_add_test(mem, test_invalid_wait);
	tcase_add_test(mem, test_sliding_window_answers_at_once);
	tcase_add_test(mem, test_waited_answer_times);
	suite_add_tcase(s, mem);
	tcase_add_loop_test(red, test_redis_two_daemons, 0, 3);
	tcase_add_test(red, test_redis_disconnect_and_sigterm);
	suite_add_tcase(s, red);
	test_main_at_end(h_shared_redis_stop);
	return s;
}
