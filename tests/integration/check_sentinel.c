/*
 * check_sentinel.c - ratelimitd under Redis Sentinel (CONTRACT 7): a
 * primary, its replica and three sentinels on loopback ports.
 *
 * What is shown: the primary is found through the sentinels and counts
 * land there; `/readyz` follows Redis; a failover (the primary killed, the
 * replica promoted by the sentinels) moves the daemon to the new primary
 * by itself, with the counts the replica had, no request waiting past
 * redis.timeout meanwhile; /metrics counts the failover.  The kill runs
 * last: it changes the set-up.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct h_sentinel sen;

static const char yaml_fmt[] =
	"listen: \"127.0.0.1:%%PORT%%\"\n"
	"threads: 2\n"
	"shutdown_timeout: 2s\n"
	"backend: redis\n"
	"redis:\n"
	"  sentinel:\n"
	"    master: mymaster\n"
	"    nodes: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\"]\n"
	"  timeout: 500ms\n"
	"  pool_size: 2\n"
	"  key_prefix: \"sn:\"\n"
	"on_backend_error: deny\n"
	"rules:\n"
	"  - name: one\n"
	"    key: \"${user}\"\n"
	"    limit: 1000\n"
	"    window: 1h\n";

static void sentinels_up(void)
{
	h_sentinel_start(&sen);
}

static void start(struct h_daemon *d)
{
	char yaml[2048];

	memset(d, 0, sizeof(*d));
	snprintf(yaml, sizeof(yaml), yaml_fmt, sen.sentinel[0].port,
	    sen.sentinel[1].port, sen.sentinel[2].port);
	d->redis_port = sen.primary.port;
	h_daemon_start(d, yaml);
}

static long get(const char *path, const char *body)
{
	struct h_resp r = { 0 };
	long status;

	h_http(&r, body != NULL ? "POST" : "GET", path, body, NULL);
	status = r.status;
	h_resp_free(&r);
	return status;
}

/* The replica has caught up with what the primary holds (so a failover
 * keeps it), at most 5 s. */
static void wait_replicated(const char *key, long long units)
{
	long long end = h_now_ms() + 5000;

	while (h_now_ms() < end) {
		if (h_redis_log_units(&sen.replica, key) == units)
			return;
		h_sleep_ms(50);
	}
	ck_abort_msg("the replica did not get %s", key);
}

START_TEST(test_primary_from_sentinels)
{
	struct h_daemon d;
	int i;

	start(&d);
	for (i = 0; i < 5; i++)
		ck_assert_int_eq(get("/acquire", "{\"user\":\"a\"}"), 200);
	ck_assert_int_eq(h_redis_log_units(&sen.primary, "sn:one:{a}"), 5);
	ck_assert_int_eq(get("/readyz", NULL), 200);
	h_daemon_stop(&d);
}
END_TEST

START_TEST(test_failover_followed)
{
	struct h_daemon d;
	struct h_load *load;
	int i, newport;

	start(&d);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(get("/acquire", "{\"user\":\"f\"}"), 200);
	wait_replicated("sn:one:{f}", 3);
	load = h_load_start(d.port, 4, "{\"user\":\"l%d\"}");
	h_sleep_ms(300);
	/* The runner started it and reaps it when the suite ends. */
	kill(sen.primary.pid, SIGKILL);
	sen.primary.pid = 0;
	(void)h_failover_measure("sentinel", "{\"user\":\"f\"}", load, 40000,
	    500);
	newport = h_sentinel_primary_port(&sen);
	ck_assert_int_eq(newport, sen.replica.port);
	/* The count went on from what the replica had.  A promoted replica
	 * drops its clients: connect anew. */
	if (sen.replica.ctx != NULL) {
		redisFree(sen.replica.ctx);
		sen.replica.ctx = NULL;
	}
	ck_assert_int_eq(h_redis_log_units(&sen.replica, "sn:one:{f}"), 4);
	ck_assert_int_eq(get("/readyz", NULL), 200);
	ck_assert_int_ge(h_metric("ratelimitd_redis_failovers_total"), 1);
	h_daemon_stop(&d);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("sentinel");
	TCase *tc = tcase_create("sentinel");
	SRunner *sr;
	int failed;

	h_init();
	tcase_add_unchecked_fixture(tc, sentinels_up, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_primary_from_sentinels);
	tcase_add_test(tc, test_failover_followed);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_FORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	h_sentinel_stop(&sen);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
