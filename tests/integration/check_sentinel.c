/*
 * check_sentinel.c - ratelimitd under Redis Sentinel (docs/scale.md): a
 * primary, its replica and three sentinels on loopback ports.
 *
 * What is shown: the primary is found through the sentinels and counts
 * land there; `/readyz` follows Redis; a failover (the primary killed, the
 * replica promoted by the sentinels) moves the daemon to the new primary
 * by itself, with the counts the replica had, no request waiting past
 * redis.timeout meanwhile; /metrics counts the failover; and when the
 * daemon's subscription hears nothing (its sentinel stopped), the old
 * primary's READONLY makes it ask the sentinels again.  The kill runs
 * last: it leaves no replica.  A second group of servers, fresh, shows
 * that calls that never reached a socket while the primary was down
 * (refused connects, no connection to send on) wait for the new primary
 * and are decided there, not by on_backend_error.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "harness.h"

static struct h_sentinel sen;

static const char yaml_fmt[] =
    "listen: \"127.0.0.1:%%PORT%%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "backend: redis\n"
    "redis:\n"
    "  sentinel:\n"
    "    master: %s\n"
    "    nodes: [%s]\n"
    "  timeout: %s\n"
    "  pool_size: 2\n"
    "  key_prefix: \"sn:\"\n"
    "on_backend_error: deny\n"
    "rules:\n"
    "  - name: one\n"
    "    key: \"${user}\"\n"
    "    limit: 1000\n"
    "    window: 1h\n"
    "  - name: lk\n"
    "    match: { t: lock }\n"
    "    key: \"${user}\"\n"
    "    algorithm: concurrency\n"
    "    limit: 1\n"
    "    window: 1h\n";

static void sentinels_resume(void);

static void
sentinels_up(void)
{
	h_sentinel_start(&sen);
}

static void
sentinels_down(void)
{
	sentinels_resume();
	h_reap_orphans();
}

/* A daemon on the sentinels of nodes (a YAML list's items) that know the
 * primary as master, with redis.timeout timeout. */
static void
start_on(struct h_daemon *d, const char *master, const char *nodes,
    const char *timeout)
{
	char yaml[2048];

	memset(d, 0, sizeof(*d));
	snprintf(yaml, sizeof(yaml), yaml_fmt, master, nodes, timeout);
	d->redis_port = sen.primary.port;
	h_daemon_start(d, yaml);
}

/* A daemon on the three sentinels, with redis.timeout timeout. */
static void
start_timeout(struct h_daemon *d, const char *timeout)
{
	char nodes[128];

	snprintf(nodes, sizeof(nodes),
	    "\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\"",
	    sen.sentinel[0].port, sen.sentinel[1].port, sen.sentinel[2].port);
	start_on(d, "mymaster", nodes, timeout);
}

static void
start(struct h_daemon *d)
{
	start_timeout(d, "500ms");
}

static long
get(const char *path, const char *body)
{
	struct h_resp r = { 0 };
	long status;

	h_http(&r, body != NULL ? "POST" : "GET", path, body, NULL);
	status = r.status;
	h_resp_free(&r);
	return status;
}

/* The servers in their roles now (a failover swaps them): the one the
 * sentinels name as primary, and the other. */
static void
roles(struct h_redis **primary, struct h_redis **replica)
{
	int port = h_sentinel_primary_port(&sen);

	ck_assert_msg(port != 0, "no sentinel names a primary");
	*primary = port == sen.primary.port ? &sen.primary : &sen.replica;
	*replica = port == sen.primary.port ? &sen.replica : &sen.primary;
}

/* Whether r says it is a replica (ROLE). */
static bool
is_replica(struct h_redis *r)
{
	redisContext *c;
	redisReply *rep;
	bool yes;

	if ((c = redisConnect("127.0.0.1", r->port)) == NULL || c->err) {
		if (c != NULL)
			redisFree(c);
		return false;
	}
	rep = redisCommand(c, "ROLE");
	yes = rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
	    rep->elements > 0 && rep->element[0]->type == REDIS_REPLY_STRING &&
	    strcmp(rep->element[0]->str, "slave") == 0;
	if (rep != NULL)
		freeReplyObject(rep);
	redisFree(c);
	return yes;
}

/* Resume every sentinel (a test that failed may have left one stopped). */
static void
sentinels_resume(void)
{
	int i;

	for (i = 0; i < 3; i++)
		if (sen.sentinel[i].pid != 0)
			kill(sen.sentinel[i].pid, SIGCONT);
}

/* A fresh connection to r (a server that changed roles drops its
 * clients). */
static struct h_redis *
fresh(struct h_redis *r)
{
	if (r->ctx != NULL) {
		redisFree(r->ctx);
		r->ctx = NULL;
	}
	return r;
}

/* The replica has caught up with what the primary holds (so a failover
 * keeps it), at most 10 s. */
static void
wait_replicated(struct h_redis *replica, const char *key, long long units)
{
	long long end = h_now_ms() + 10000;

	while (h_now_ms() < end) {
		if (h_redis_log_units(fresh(replica), key) == units)
			return;
		h_sleep_ms(100);
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
	/* The replica is a replica: it refuses what the daemon would do. */
	ck_assert_int_eq(h_redis_log_units(&sen.replica, "sn:one:{a}") >= 0, 1);
	ck_assert_int_eq(get("/readyz", NULL), 200);
	h_daemon_stop(&d);
}
END_TEST

/* The backend errors of the Redis store so far, every kind. */
static long long
backend_errors(void)
{
	static const char *const kinds[] = { "connect", "timeout", "protocol",
		"circuit_open", "tls" };
	char name[160];
	long long sum = 0;
	size_t i;

	for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		snprintf(name, sizeof(name),
		    "ratelimitd_backend_errors_total{backend=\"redis\","
		    "kind=\"%s\"}",
		    kinds[i]);
		sum += h_metric(name);
	}
	return sum;
}

/* A sentinel of its own, watching the master "stale" at port with quorum
 * (it knows no other sentinel of that name, so it never moves it). */
static void
sentinel_watching(struct h_redis *s, int port, int quorum)
{
	char extra[256];

	memset(s, 0, sizeof(*s));
	snprintf(extra, sizeof(extra),
	    "sentinel monitor stale 127.0.0.1 %d %d\n"
	    "sentinel down-after-milliseconds stale 1000\n",
	    port, quorum);
	s->sentinel = true;
	s->extra = extra;
	h_redis_start(s);
	s->extra = NULL;
}

/*
 * A sentinel that names a replica (docs/scale.md, "Sentinel"): one that
 * has not heard of a failover names the old primary, turned replica.
 * Made here for good by a sentinel that watches the replica's address
 * under a name only it and a second sentinel (watching the primary) know:
 * neither can fail the other over, so the first names the replica for as
 * long as the test runs.  A daemon that asks it first finds the replica
 * by ROLE before sending it anything, says so, and asks the next sentinel,
 * whose primary decides every request once; one that knows only that
 * sentinel answers by on_backend_error within redis.timeout.  The
 * replica runs no script call either way.
 */
START_TEST(test_replica_named_refused)
{
	struct h_redis *primary, *replica, stale, good;
	struct h_daemon d;
	char nodes[128], text[128];
	long long scripts, units, t;
	int i;

	roles(&primary, &replica);
	sentinel_watching(&stale, replica->port, 3);
	sentinel_watching(&good, primary->port, 2);
	scripts = h_redis_script_calls(fresh(replica));
	units = h_redis_log_units(fresh(primary), "sn:one:{sr}");
	snprintf(nodes, sizeof(nodes), "\"127.0.0.1:%d\", \"127.0.0.1:%d\"",
	    stale.port, good.port);
	start_on(&d, "stale", nodes, "2000ms");
	for (i = 0; i < 5; i++) {
		t = h_now_ms();
		ck_assert_int_eq(get("/acquire", "{\"user\":\"sr\"}"), 200);
		fprintf(stderr,
		    "sentinel naming a replica, then one naming the primary: "
		    "request %d answered in %lld ms\n",
		    i, h_now_ms() - t);
	}
	ck_assert_int_eq(h_redis_log_units(fresh(primary), "sn:one:{sr}"),
	    units + 5);
	ck_assert_int_eq(backend_errors(), 0);
	/* A stale sentinel corrected is no failover (docs/scale.md). */
	ck_assert_int_eq(h_metric("ratelimitd_redis_failovers_total"), 0);
	h_daemon_stop(&d);
	snprintf(text, sizeof(text),
	    "127.0.0.1:%d is a replica, not the primary the sentinel named",
	    replica->port);
	ck_assert_msg(h_file_count(d.log, text) > 0,
	    "the log does not say \"%s\"", text);

	/* Only that sentinel: the policy answers, within the deadline. */
	snprintf(nodes, sizeof(nodes), "\"127.0.0.1:%d\"", stale.port);
	start_on(&d, "stale", nodes, "500ms");
	t = h_now_ms();
	ck_assert_int_eq(get("/acquire", "{\"user\":\"sr\"}"), 503);
	t = h_now_ms() - t;
	ck_assert_msg(t < 500 + 300, "answered in %lld ms", t);
	ck_assert_int_eq(h_redis_log_units(fresh(primary), "sn:one:{sr}"),
	    units + 5);
	h_daemon_stop(&d);
	ck_assert_msg(h_file_count(d.log, text) > 0,
	    "the log does not say \"%s\"", text);
	ck_assert_int_eq(h_redis_script_calls(fresh(replica)), scripts);
	h_redis_stop(&good);
	h_redis_stop(&stale);
}
END_TEST

/*
 * A primary that refuses the handshake (here AUTH with a password it does
 * not have) will again: under Sentinel too, the calls behind it fail at
 * once with on_backend_error's answer, not after waiting redis.timeout for
 * another primary (docs/scale.md, "What a failover looks like").
 */
START_TEST(test_refused_handshake_fails_at_once)
{
	struct h_daemon d;
	char base[2048], yaml[2560], nodes[128], pwfile[H_PATH_MAX + 16];
	const char *p;
	long long t;
	FILE *f;
	int i;

	snprintf(pwfile, sizeof(pwfile), "%s/sentinel-pw", h_tmpdir());
	ck_assert((f = fopen(pwfile, "w")) != NULL);
	fputs("not-the-password\n", f);
	ck_assert_int_eq(fclose(f), 0);
	snprintf(nodes, sizeof(nodes),
	    "\"127.0.0.1:%d\", \"127.0.0.1:%d\", \"127.0.0.1:%d\"",
	    sen.sentinel[0].port, sen.sentinel[1].port, sen.sentinel[2].port);
	snprintf(base, sizeof(base), yaml_fmt, "mymaster", nodes, "3s");
	p = strstr(base, "  pool_size: 2\n");
	ck_assert(p != NULL);
	snprintf(yaml, sizeof(yaml), "%.*s  password_file: \"%s\"\n%s",
	    (int)(p - base), base, pwfile, p);
	memset(&d, 0, sizeof(d));
	d.redis_port = sen.primary.port;
	h_daemon_start(&d, yaml);
	for (i = 0; i < 3; i++) {
		t = h_now_ms();
		ck_assert_int_eq(get("/acquire", "{\"user\":\"pw\"}"), 503);
		t = h_now_ms() - t;
		ck_assert_msg(t < 1000,
		    "request %d answered in %lld ms "
		    "(redis.timeout 3s)",
		    i, t);
	}
	h_daemon_stop(&d);
}
END_TEST

/*
 * The subscription cannot tell (its sentinel is stopped): the other two
 * sentinels move the primary, the old one turns replica (answering
 * READONLY, or ROLE on a new connection), and the daemon asks the
 * sentinels again by itself.
 */
START_TEST(test_readonly_followed)
{
	struct h_redis *primary, *replica;
	struct h_daemon d;
	redisReply *r;
	long long t0, back = -1, units;
	int i;

	roles(&primary, &replica);
	start(&d);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(get("/acquire", "{\"user\":\"r\"}"), 200);
	wait_replicated(replica, "sn:one:{r}", 3);
	/* The daemon subscribed on the first sentinel. */
	kill(sen.sentinel[0].pid, SIGSTOP);
	r = redisCommand(h_redis_ctx(&sen.sentinel[1]),
	    "SENTINEL FAILOVER mymaster");
	ck_assert_msg(r != NULL && r->type == REDIS_REPLY_STATUS,
	    "SENTINEL FAILOVER: %s", r != NULL ? r->str : "no reply");
	freeReplyObject(r);
	t0 = h_now_ms();
	/* The sentinels have moved the primary, and the old one has been
	 * made a replica (until then it still takes writes: Sentinel's own
	 * window)... */
	while (!is_replica(primary) && h_now_ms() - t0 < 30000)
		h_sleep_ms(100);
	ck_assert_msg(is_replica(primary),
	    "the old primary was not turned "
	    "into a replica");
	units = h_redis_log_units(fresh(replica), "sn:one:{r}");
	/* ... and the daemon's next admission lands on the new one. */
	while (h_now_ms() - t0 < 30000) {
		long st = get("/acquire", "{\"user\":\"r\"}");

		ck_assert_msg(st == 200 || st == 503, "status %ld", st);
		if (st == 200) {
			ck_assert_int_eq(h_redis_log_units(fresh(replica),
					     "sn:one:{r}"),
			    units + 1);
			back = h_now_ms() - t0;
			break;
		}
		h_sleep_ms(100);
	}
	kill(sen.sentinel[0].pid, SIGCONT);
	fprintf(stderr,
	    "sentinel failover without +switch-master: the new "
	    "primary decides %lld ms after SENTINEL FAILOVER\n",
	    back);
	ck_assert_msg(back >= 0,
	    "the daemon did not move to the new "
	    "primary within 30 s");
	ck_assert_int_ge(h_metric("ratelimitd_redis_failovers_total"), 1);
	h_daemon_stop(&d);
	/* It moved because it asked, not because it was told. */
	ck_assert_msg(h_file_count(d.log, "(asked)") > 0 &&
		h_file_count(d.log, "+switch-master") == 0,
	    "the daemon did not move by "
	    "asking the sentinels");
}
END_TEST

/* A request waiting for the lock on one daemon. */
struct lock_waiter {
	pthread_t thread;
	int port;
	struct h_resp r;
	long long answered_ms;
};

static void *
lock_wait_run(void *arg)
{
	struct lock_waiter *w = arg;
	const char *body = "{\"t\":\"lock\",\"user\":\"w\",\"wait_ms\":10000}";
	CURL *c = h_curl_new();

	(void)h_request(c, w->port, &w->r, "POST", "/acquire", body,
	    strlen(body), NULL);
	w->answered_ms = h_now_ms();
	curl_easy_cleanup(c);
	return NULL;
}

/*
 * After the failover, d's subscription to lease releases is on the new
 * primary: a waiter on d is served as soon as another daemon (started on
 * the new primary) releases the lock, long before its lease (1 h) would
 * expire.
 */
static void
lease_wait_after_failover(struct h_daemon *d)
{
	struct h_daemon other;
	struct lock_waiter w;
	struct h_resp r = { 0 };
	char body[1024];
	long long released;

	start(&other);
	h_post(other.port, "/acquire", "{\"t\":\"lock\",\"user\":\"w\"}", &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	snprintf(body, sizeof(body), "{\"lease\":\"%s\"}",
	    json_string_value(json_object_get(
		json_array_get(h_json_get(&r, "leases"), 0), "lease")));
	memset(&w, 0, sizeof(w));
	w.port = d->port;
	ck_assert_int_eq(pthread_create(&w.thread, NULL, lock_wait_run, &w), 0);
	h_sleep_ms(300);
	released = h_now_ms();
	h_post(other.port, "/release", body, &r);
	ck_assert_msg(strstr(r.body, "\"released\":true") != NULL, "%s",
	    r.body);
	pthread_join(w.thread, NULL);
	ck_assert_msg(w.r.status == 200, "the waiter: %ld %s", w.r.status,
	    w.r.body != NULL ? w.r.body : w.r.err);
	ck_assert_msg(w.answered_ms - released < 1500,
	    "the waiter was "
	    "served %lld ms after the release",
	    w.answered_ms - released);
	fprintf(stderr,
	    "sentinel: after the failover, a waiter served %lld "
	    "ms after a release through another daemon\n",
	    w.answered_ms - released);
	h_resp_free(&w.r);
	h_resp_free(&r);
	h_daemon_stop(&other);
}

START_TEST(test_failover_followed)
{
	struct h_redis *primary, *replica;
	struct h_daemon d;
	struct h_load *load;
	int i, newport;

	/* The roles may have changed in the test before. */
	sentinels_resume();
	roles(&primary, &replica);
	start(&d);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(get("/acquire", "{\"user\":\"f\"}"), 200);
	wait_replicated(replica, "sn:one:{f}", 3);
	load = h_load_start(d.port, 4, "{\"user\":\"l%d\"}");
	h_sleep_ms(300);
	/* The runner started it and reaps it when the suite ends. */
	kill(primary->pid, SIGKILL);
	primary->pid = 0;
	(void)h_failover_measure("sentinel", "{\"user\":\"f\"}", load, 40000,
	    500);
	newport = h_sentinel_primary_port(&sen);
	ck_assert_int_eq(newport, replica->port);
	/* The count went on from what the replica had. */
	ck_assert_int_eq(h_redis_log_units(fresh(replica), "sn:one:{f}"), 4);
	ck_assert_int_eq(get("/readyz", NULL), 200);
	ck_assert_int_ge(h_metric("ratelimitd_redis_failovers_total"), 1);
	lease_wait_after_failover(&d);
	h_daemon_stop(&d);
}
END_TEST

/* A request sent from a thread of its own, after a delay. */
struct late_request {
	pthread_t thread;
	int port;
	long long delay_ms, took_ms;
	struct h_resp r;
};

static void *
late_request_run(void *arg)
{
	struct late_request *q = arg;
	const char *body = "{\"user\":\"u\"}";
	CURL *c = h_curl_new();
	long long t;

	h_sleep_ms(q->delay_ms);
	t = h_now_ms();
	(void)h_request(c, q->port, &q->r, "POST", "/acquire", body,
	    strlen(body), NULL);
	q->took_ms = h_now_ms() - t;
	curl_easy_cleanup(c);
	return NULL;
}

/* The other group is done with (its primary killed): a fresh one. */
static void
group_fresh(void)
{
	sentinels_resume();
	h_sentinel_stop(&sen);
	h_reap_orphans();
	h_sentinel_start(&sen);
}

/*
 * The primary is killed with nothing in flight; requests sent meanwhile
 * meet refused connects, or no connection to send on: their commands
 * never reached a socket, so instead of failing (on_backend_error: deny,
 * 503) they wait, within redis.timeout, for the primary the sentinels
 * name, and the replica, once promoted, decides them all.  Sent from one
 * second after the kill (the sentinels take that long to see it down), a
 * few at a time, with redis.timeout long enough to cover the failover.
 */
START_TEST(test_unsent_calls_follow_failover)
{
	struct late_request q[6];
	struct h_redis *primary, *replica;
	struct h_daemon d;
	long long errors;
	size_t i;

	roles(&primary, &replica);
	start_timeout(&d, "4500ms");
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(get("/acquire", "{\"user\":\"u\"}"), 200);
	wait_replicated(replica, "sn:one:{u}", 3);
	errors = backend_errors();
	ck_assert_int_eq(errors, 0);
	/* The runner started it and reaps it when the suite ends. */
	kill(primary->pid, SIGKILL);
	primary->pid = 0;
	memset(q, 0, sizeof(q));
	for (i = 0; i < 6; i++) {
		q[i].port = d.port;
		q[i].delay_ms = 1000 + 200 * (long long)(i / 2);
		ck_assert_int_eq(pthread_create(&q[i].thread, NULL,
				     late_request_run, &q[i]),
		    0);
	}
	for (i = 0; i < 6; i++)
		pthread_join(q[i].thread, NULL);
	for (i = 0; i < 6; i++) {
		fprintf(stderr,
		    "sentinel: a request sent %lld ms after the kill was "
		    "answered %ld in %lld ms\n",
		    q[i].delay_ms, q[i].r.status, q[i].took_ms);
		ck_assert_msg(q[i].r.status == 200,
		    "request %zu (sent %lld ms after the kill): %ld %s", i,
		    q[i].delay_ms, q[i].r.status,
		    q[i].r.body != NULL ? q[i].r.body : q[i].r.err);
		ck_assert_msg(q[i].took_ms < 4500 + 500,
		    "request %zu took %lld ms", i, q[i].took_ms);
		h_resp_free(&q[i].r);
	}
	/* Decided by the new primary, each once; none by the policy. */
	ck_assert_int_eq(h_sentinel_primary_port(&sen), replica->port);
	ck_assert_int_eq(h_redis_log_units(fresh(replica), "sn:one:{u}"), 9);
	ck_assert_int_eq(backend_errors(), 0);
	ck_assert_int_ge(h_metric("ratelimitd_redis_failovers_total"), 1);
	h_daemon_stop(&d);
	ck_assert_msg(h_file_count(d.log,
			  "wait for the primary the sentinels name") > 0,
	    "the daemon did not say the calls wait for the primary");
}
END_TEST

static void
suite_done(void)
{
	h_sentinel_stop(&sen);
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("sentinel");
	TCase *tc = tcase_create("sentinel");

	tcase_add_unchecked_fixture(tc, sentinels_up, sentinels_down);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_primary_from_sentinels);
	tcase_add_test(tc, test_replica_named_refused);
	tcase_add_test(tc, test_refused_handshake_fails_at_once);
	tcase_add_test(tc, test_readonly_followed);
	tcase_add_test(tc, test_failover_followed);
	suite_add_tcase(s, tc);
	tc = tcase_create("requeue");
	tcase_add_unchecked_fixture(tc, group_fresh, sentinels_down);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_unsent_calls_follow_failover);
	suite_add_tcase(s, tc);
	test_main_at_end(suite_done);
	return s;
}
