/*
 * check_ops.c - ratelimitd as an operator meets it: Redis failing in the
 * ways it fails (refusing, hanging, paused, killed under load, asking for a
 * password), reloads (SIGHUP, a rename over the file, a ConfigMap symlink
 * swap, a bad file), /metrics checked by promtool, SIGTERM under load (and
 * a second SIGTERM that cuts the drain short), and the log (JSON, levels,
 * access log, no secrets).  docs/man/ratelimitd.8,
 * docs/operations.md and docs/configuration.md are the reference.
 *
 * Every daemon runs one rule, x, keyed by the JSON field "user", so each
 * test picks its counters by naming users (ops.h has the helpers).  The
 * time bound: a request may take redis.timeout plus MARGIN_MS, however
 * Redis fails and whatever other connections are waiting for.
 *
 * Two things the harness does not do are done without touching it:
 *  - a daemon with another environment or command line: the harness runs
 *    "$RATELIMITD_BIN -c FILE", so ops_wrap_daemon() points RATELIMITD_BIN
 *    at an sh script that sets things up and execs the real binary (same
 *    PID, so the harness still tracks and stops it);
 *  - HTTP that reports libcurl's own result, for the shutdown test to tell
 *    a refused connection from a cut answer: post_raw().
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"
#include "ops.h"

#define TIMEOUT_MS   OPS_TIMEOUT_MS /* redis.timeout, mostly */
#define MARGIN_MS    150	    /* what a request may take beyond it */
#define LOAD_THREADS 4

/* Assert every recorded request of the workers was a degraded 200 that
 * took at most TIMEOUT_MS + MARGIN_MS. */
static void
assert_all_degraded_and_quick(const struct ops_worker *w, int n)
{
	size_t k, total = 0;
	int i;

	for (i = 0; i < n; i++) {
		for (k = 0; k < w[i].n; k++, total++) {
			const struct ops_sample *s = &w[i].s[k];

			ck_assert_msg(s->status == 200 && s->degraded,
			    "request %zu of thread %d: status %ld, degraded "
			    "%d; expected a degraded 200",
			    k, i, s->status, s->degraded);
		}
	}
	ck_assert_msg(total > 0, "no request was made");
	ck_assert_msg(ops_load_max_ms(w, n) < TIMEOUT_MS + MARGIN_MS,
	    "a request took %lld ms; redis.timeout is %d ms",
	    ops_load_max_ms(w, n), TIMEOUT_MS);
}

/* =====================================================================
 * 1. Backend failure policy
 * ===================================================================== */

/* Redis refuses connections: allow => degraded 200s, quickly; /readyz 503. */
START_TEST(test_policy_allow_refused)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long ms;
	int i;

	ops_start(&d, ops_closed_port(),
	    &(struct ops_conf){ .policy = "allow" });
	for (i = 0; i < 8; i++) {
		ops_acquire_timed(&r, "a", &ms);
		ck_assert_int_eq(r.status, 200);
		ck_assert_msg(ops_is_degraded(&r), "not degraded: %s", r.body);
		ck_assert_msg(json_is_true(h_json_get(&r, "allowed")), "%s",
		    r.body);
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "took %lld ms", ms);
		h_resp_free(&r);
	}
	ck_assert_int_eq(ops_get("/readyz", &ms), 503);
	ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "/readyz took %lld ms", ms);
	h_daemon_stop(&d);
}
END_TEST

/* Redis refuses connections: deny => 503 backend_unavailable. */
START_TEST(test_policy_deny_refused)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long ms;
	int i;

	ops_start(&d, ops_closed_port(),
	    &(struct ops_conf){ .policy = "deny" });
	for (i = 0; i < 8; i++) {
		ops_acquire_timed(&r, "a", &ms);
		ck_assert_int_eq(r.status, 503);
		ck_assert_str_eq(h_json_str(&r, "error"),
		    "backend_unavailable");
		ck_assert_ptr_nonnull(h_json_str(&r, "message"));
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "took %lld ms", ms);
		h_resp_free(&r);
	}
	h_daemon_stop(&d);
}
END_TEST

/* Redis refuses connections: local => the in-process limiter decides
 * (limit 2: two 200s, then 429), every answer marked degraded. */
START_TEST(test_policy_local_refused)
{
	static const long want_status[] = { 200, 200, 429, 429 };
	static const long long want_remaining[] = { 1, 0, 0, 0 };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long ms;
	int i;

	ops_start(&d, ops_closed_port(),
	    &(struct ops_conf){ .policy = "local" });
	for (i = 0; i < 4; i++) {
		ops_acquire_timed(&r, "l", &ms);
		ck_assert_msg(r.status == want_status[i],
		    "request %d: status "
		    "%ld, expected %ld: %s",
		    i + 1, r.status, want_status[i], r.body);
		ck_assert_msg(ops_is_degraded(&r), "not degraded: %s", r.body);
		ck_assert_str_eq(h_json_str(&r, "rule"), "x");
		ck_assert_int_eq(h_json_int(&r, "limit"), 2);
		ck_assert_int_eq(h_json_int(&r, "remaining"),
		    want_remaining[i]);
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "took %lld ms", ms);
		h_resp_free(&r);
	}
	/* Another user has its own local counter. */
	ops_acquire(&r, "m");
	ck_assert_int_eq(r.status, 200);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/* Redis accepts and never answers: every request, /readyz included,
 * still ends within the timeout, also from several threads at once. */
START_TEST(test_policy_silent_redis)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	struct ops_worker *w;
	long long ms;
	int port, fd = ops_silent_listener(&port), i;

	ops_start(&d, port, &(struct ops_conf){ .policy = "allow" });
	for (i = 0; i < 3; i++) {
		ops_acquire_timed(&r, "a", &ms);
		ck_assert_int_eq(r.status, 200);
		ck_assert_msg(ops_is_degraded(&r), "not degraded: %s", r.body);
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "took %lld ms", ms);
		h_resp_free(&r);
	}
	w = ops_load_start(LOAD_THREADS, 5000, 6, 0);
	ops_load_join(w, LOAD_THREADS);
	assert_all_degraded_and_quick(w, LOAD_THREADS);
	free(w);
	ck_assert_int_eq(ops_get("/readyz", &ms), 503);
	ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "/readyz took %lld ms", ms);
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* The same with on_backend_error: deny. */
START_TEST(test_policy_silent_redis_deny)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long ms;
	int port, fd = ops_silent_listener(&port), i;

	ops_start(&d, port, &(struct ops_conf){ .policy = "deny" });
	for (i = 0; i < 8; i++) {
		ops_acquire_timed(&r, "a", &ms);
		ck_assert_int_eq(r.status, 503);
		ck_assert_str_eq(h_json_str(&r, "error"),
		    "backend_unavailable");
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "took %lld ms", ms);
		h_resp_free(&r);
	}
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* A hanging Redis and more clients than connections: the wait for a free
 * connection is part of the same deadline. */
START_TEST(test_policy_silent_redis_small_pool)
{
	struct h_daemon d = { 0 };
	struct ops_worker *w;
	int port, fd = ops_silent_listener(&port);

	ops_start(&d, port,
	    &(struct ops_conf){ .redis_extra = "  pool_size: 2\n" });
	w = ops_load_start(2 * LOAD_THREADS, 5000, 10, 0);
	ops_load_join(w, 2 * LOAD_THREADS);
	assert_all_degraded_and_quick(w, 2 * LOAD_THREADS);
	free(w);
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* Redis by a host name that resolves ("localhost", from /etc/hosts): the
 * name is looked up off the I/O thread and Redis decides. */
START_TEST(test_redis_by_host_name)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };

	h_redis_start(&red);
	ops_start(&d, red.port,
	    &(struct ops_conf){ .policy = "deny",
		.url = "redis://localhost:%REDIS_PORT%/0",
		.timeout_ms = 1000 });
	ck_assert(ops_wait_not_degraded("h", 3000));
	ops_acquire(&r, "h");
	ck_assert_int_eq(r.status, 200); /* limit 2: the wait took one */
	h_resp_free(&r);
	ops_acquire(&r, "h");
	ck_assert_int_eq(r.status, 429);
	ck_assert_msg(!ops_is_degraded(&r), "degraded: %s", r.body);
	h_resp_free(&r);
	ck_assert_int_eq(ops_get("/readyz", NULL), 200);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/*
 * Redis by a host name that no resolver answers for: each request is still
 * answered within redis.timeout, under each policy, and so is /readyz.
 * The daemon runs in a private mount namespace whose /etc/resolv.conf
 * names 127.0.0.1, where a UDP socket of this test takes the queries and
 * never answers; the machine's own resolv.conf is not touched.  A name
 * resolved on the store's I/O thread would hold every request for the
 * resolver's whole timeout (5 s here).
 */
static const char *const dns_policy[] = { "allow", "deny", "local" };

/* A UDP socket on 127.0.0.1:53 that never reads: a resolver that does
 * not answer.  The test fails when the port cannot be had (it needs root,
 * as make check runs, and nothing else serving DNS on 127.0.0.1). */
static int
silent_resolver(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), one = 1;

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	/* Parallel runs of this test share the port; none answers. */
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons(53);
	ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0,
	    "DNS test: cannot bind 127.0.0.1:53/udp (%s): run as root, with "
	    "no resolver listening on 127.0.0.1",
	    strerror(errno));
	return fd;
}

/*
 * Run the next daemon in a private mount namespace whose /etc/resolv.conf
 * names 127.0.0.1 with options (a line), where the returned UDP socket
 * takes the queries and never answers.  Fails the test when this machine
 * cannot (no mount namespace for it, or the port taken).
 */
static int
dns_unanswered_setup(const char *options)
{
	const char *unshare = geteuid() == 0 ? "unshare -m" : "unshare -rm";
	char rc[H_PATH_MAX], pre[2 * H_PATH_MAX], text[256], probe[64];
	int fd;

	snprintf(probe, sizeof(probe), "%s true 2>/dev/null", unshare);
	ck_assert_msg(system(probe) == 0,
	    "DNS test: \"%s true\" failed: it "
	    "needs a private mount namespace (root, or user namespaces)",
	    unshare);
	fd = silent_resolver();
	ops_tmp_name(rc, sizeof(rc), "resolv.conf");
	snprintf(text, sizeof(text), "nameserver 127.0.0.1\n%s\n", options);
	ops_write_file(rc, text);
	snprintf(pre, sizeof(pre),
	    "if [ -z \"$RL_PRIVATE_NS\" ]; then\n"
	    "  export RL_PRIVATE_NS=1\n"
	    "  exec %s \"$0\" \"$@\"\n"
	    "fi\n"
	    "mount --bind '%s' /etc/resolv.conf || exit 1",
	    unshare, rc);
	ops_wrap_daemon(pre);
	return fd;
}

START_TEST(test_dns_unanswered)
{
	const char *policy = dns_policy[_i];
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long ms;
	int fd, i;

	if ((fd = dns_unanswered_setup("options timeout:5 attempts:1")) < 0)
		return;
	ops_start(&d, 0,
	    &(struct ops_conf){ .policy = policy,
		.url = "redis://redis-0.ratelimitd.test:6379/0" });
	for (i = 0; i < 4; i++) {
		ops_acquire_timed(&r, "n", &ms);
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS,
		    "%s: request %d "
		    "took %lld ms; redis.timeout is %d ms",
		    policy, i + 1, ms, TIMEOUT_MS);
		if (_i == 1) {
			ck_assert_int_eq(r.status, 503);
			ck_assert_str_eq(h_json_str(&r, "error"),
			    "backend_unavailable");
		} else {
			/* local: limit 2, then its own 429s. */
			ck_assert_int_eq(r.status,
			    _i == 2 && i >= 2 ? 429 : 200);
			ck_assert_msg(ops_is_degraded(&r), "not degraded: %s",
			    r.body);
		}
		h_resp_free(&r);
	}
	ck_assert_int_eq(ops_get("/readyz", &ms), 503);
	ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "/readyz took %lld ms", ms);
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* The CPU time (ms) pid has used so far. */
static long long
cpu_ms(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	ck_assert((f = fopen(path, "r")) != NULL);
	ck_assert(fgets(buf, sizeof(buf), f) != NULL);
	fclose(f);
	ck_assert((p = strrchr(buf, ')')) != NULL);
	/* After "pid (comm)": state is field 3, utime 14, stime 15. */
	ck_assert(sscanf(p + 2,
		      "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u "
		      "%*u %llu %llu",
		      &ut, &st) == 2);
	return (long long)(ut + st) * 1000 / sysconf(_SC_CLK_TCK);
}

/*
 * A lookup that outlives its connection: the connect times out while the
 * name is being looked up (1 s here), the next connect waits for the same
 * lookup, and the lookup ends while no connection waits for it.  Every
 * request fails by its deadline as a timeout, never as another kind of
 * error, and the daemon does not spin on the finished lookup meanwhile.
 */
START_TEST(test_dns_lookup_outlives_connection)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long ms, cpu;
	int fd, i;

	if ((fd = dns_unanswered_setup("options timeout:1 attempts:1")) < 0)
		return;
	ops_start(&d, 0,
	    &(struct ops_conf){ .policy = "deny",
		.url = "redis://redis-1.ratelimitd.test:6379/0",
		.redis_extra = "  pool_size: 1\n" });
	for (i = 0; i < 3; i++) {
		if (i == 2)
			h_sleep_ms(2500); /* the lookup gave up */
		else if (i == 1)
			h_sleep_ms(150); /* the connect timed out */
		ops_acquire_timed(&r, "o", &ms);
		ck_assert_int_eq(r.status, 503);
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS,
		    "request %d took "
		    "%lld ms",
		    i + 1, ms);
		h_resp_free(&r);
		if (i == 1) {
			/* Idle, with a finished lookup nobody waits for. */
			h_sleep_ms(2500);
			cpu = cpu_ms(d.pid);
			h_sleep_ms(1000);
			cpu = cpu_ms(d.pid) - cpu;
			ck_assert_msg(cpu < 300,
			    "idle, the daemon used %lld "
			    "ms of CPU in 1 s",
			    cpu);
		}
	}
	ck_assert_int_eq(ops_metric("ratelimitd_backend_errors_total"
				    "{backend=\"redis\",kind=\"connect\"}"),
	    0);
	ck_assert_int_ge(ops_metric("ratelimitd_backend_errors_total"
				    "{backend=\"redis\",kind=\"timeout\"}"),
	    3);
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* A real Redis that stops answering (SIGSTOP) under load and resumes. */
START_TEST(test_redis_paused_under_load)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct ops_worker *w;

	h_redis_start(&red);
	ops_start(&d, red.port, &(struct ops_conf){ .limit = 1000000 });
	ck_assert(ops_wait_not_degraded("load", 2000));
	w = ops_load_start(LOAD_THREADS, 2000, 0, 5);
	h_sleep_ms(500);
	ck_assert(kill(red.pid, SIGSTOP) == 0);
	h_sleep_ms(1000);
	ck_assert(kill(red.pid, SIGCONT) == 0);
	ops_load_join(w, LOAD_THREADS);
	ck_assert_msg(ops_load_max_ms(w, LOAD_THREADS) < TIMEOUT_MS + MARGIN_MS,
	    "a request took %lld ms while Redis was paused; redis.timeout "
	    "is %d ms",
	    ops_load_max_ms(w, LOAD_THREADS), TIMEOUT_MS);
	free(w);
	ck_assert_msg(ops_wait_not_degraded("after", 8000),
	    "still degraded 8 s after Redis resumed");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/*
 * Redis slow for longer than half redis.timeout but less than all of it,
 * with the pool's one connection busy: a call that comes meanwhile goes
 * behind the first on that connection, which is not closed to make room
 * (docs/operations.md: only past the timeout).  Both are answered by
 * Redis, policy deny (a failed call is a 503).
 */
START_TEST(test_slow_redis_keeps_calls)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct ops_call first, second;
	CURL *c1 = h_curl_new(), *c2 = h_curl_new();

	h_redis_start(&red);
	ops_start(&d, red.port,
	    &(struct ops_conf){ .policy = "deny",
		.timeout_ms = 1000,
		.limit = 1000,
		.redis_extra = "  pool_size: 1\n" });
	ck_assert(ops_wait_not_degraded("slow", 2000));
	ck_assert(kill(red.pid, SIGSTOP) == 0);
	ops_call_start(&first, c1, "POST", "/acquire", "{\"user\":\"slow\"}");
	h_sleep_ms(600); /* the first waits past half the timeout */
	ops_call_start(&second, c2, "GET", "/readyz", NULL);
	h_sleep_ms(100);
	ck_assert(kill(red.pid, SIGCONT) == 0);
	ops_call_finish(&first);
	ops_call_finish(&second);
	ck_assert_msg(first.r.status == 200, "the first call: %ld %s",
	    first.r.status, first.r.body);
	ck_assert_msg(second.r.status == 200, "the second call: %ld %s",
	    second.r.status, second.r.body);
	h_resp_free(&first.r);
	h_resp_free(&second.r);
	curl_easy_cleanup(c1);
	curl_easy_cleanup(c2);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/*
 * The daemon's TCP connections to Redis (remote port redis_port, in
 * /proc/net/tcp): how many are established, and how many of those run a
 * keepalive timer (the "tr" field 2) due within max_s seconds.
 */
static void
keepalive_count(int redis_port, int max_s, int *conns, int *kept)
{
	char line[512], rem[64];
	unsigned st, tr, port;
	unsigned long when;
	FILE *f = fopen("/proc/net/tcp", "r");

	*conns = *kept = 0;
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, " %*u: %*s %63s %x %*s %x:%lx", rem, &st, &tr,
			&when) != 4 ||
		    strchr(rem, ':') == NULL ||
		    sscanf(strchr(rem, ':') + 1, "%x", &port) != 1 ||
		    (int)port != redis_port || st != 1)
			continue;
		(*conns)++;
		/* tm->when in clock ticks (USER_HZ, 100 a second) */
		if (tr == 2 && when <= (unsigned long)max_s * 100)
			(*kept)++;
	}
	fclose(f);
}

/*
 * Every connection the daemon keeps to Redis, the idle ones included (the
 * release subscription), has TCP keepalive probed within 15 s, so a peer
 * gone without a word is found (docs/operations.md).
 */
START_TEST(test_redis_keepalive)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	int conns = 0, kept = 0, i;

	h_redis_start(&red);
	ops_start(&d, red.port, &(struct ops_conf){ .limit = 1000 });
	ck_assert(ops_wait_not_degraded("ka", 2000));
	for (i = 0; i < 50 && conns < 2; i++) {
		h_sleep_ms(100);
		keepalive_count(red.port, 15, &conns, &kept);
	}
	ck_assert_msg(conns >= 2, "%d connections to Redis", conns);
	ck_assert_msg(kept == conns,
	    "%d of %d connections to Redis run a keepalive timer of 15 s", kept,
	    conns);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

#define HOL_CONNS      5 /* keep-alive connections ... */
#define HOL_THREADS    4 /* ... on this many HTTP worker threads */
#define HOL_TIMEOUT_MS 200

/*
 * A request that waits on Redis holds up no other connection while worker
 * threads are free.  Five keep-alive connections to four worker threads:
 * for each pair, /readyz (which always asks the hanging Redis, circuit or
 * not) runs on one while /healthz goes on the other.  If a pair turns out
 * to wait on each other, two /acquire on that pair must still each end
 * within the timeout.  Only two requests are ever in flight.
 */
START_TEST(test_no_head_of_line_blocking)
{
	static const char body[] = "{\"user\":\"h\"}";
	struct h_daemon d = { 0 };
	struct ops_call slow, fast;
	CURL *c[HOL_CONNS];
	long long health_ms = 0, first_ms, second_ms;
	int port, fd = ops_silent_listener(&port), i, j, si = -1, sj = -1;

	ops_start(&d, port,
	    &(struct ops_conf){
		.threads = HOL_THREADS, .timeout_ms = HOL_TIMEOUT_MS });
	for (i = 0; i < HOL_CONNS; i++) {
		c[i] = h_curl_new();
		ops_call_start(&fast, c[i], "GET", "/healthz", NULL);
		ops_call_finish(&fast);
		h_resp_free(&fast.r);
	}
	for (i = 0; i < HOL_CONNS && si < 0; i++) {
		for (j = i + 1; j < HOL_CONNS && si < 0; j++) {
			ops_call_start(&slow, c[i], "GET", "/readyz", NULL);
			h_sleep_ms(50);
			ops_call_start(&fast, c[j], "GET", "/healthz", NULL);
			health_ms = ops_call_finish(&fast);
			ops_call_finish(&slow);
			ck_assert_int_eq(fast.r.status, 200);
			ck_assert_int_eq(fast.r.num_connects, 0);
			ck_assert_int_eq(slow.r.status, 503);
			if (health_ms > MARGIN_MS) {
				si = i;
				sj = j;
			}
			h_resp_free(&slow.r);
			h_resp_free(&fast.r);
		}
	}
	if (si >= 0) {
		ops_call_start(&slow, c[si], "POST", "/acquire", body);
		h_sleep_ms(20);
		ops_call_start(&fast, c[sj], "POST", "/acquire", body);
		second_ms = ops_call_finish(&fast);
		first_ms = ops_call_finish(&slow);
		h_resp_free(&slow.r);
		h_resp_free(&fast.r);
		ck_assert_msg(second_ms < HOL_TIMEOUT_MS + MARGIN_MS,
		    "POST /acquire took %lld ms (redis.timeout %d ms): it "
		    "waited for a /acquire on another connection (%lld ms), "
		    "with only 2 requests in flight and %d worker threads",
		    second_ms, HOL_TIMEOUT_MS, first_ms, HOL_THREADS);
		ck_assert_msg(health_ms <= MARGIN_MS,
		    "GET /healthz took %lld "
		    "ms behind a /readyz on another connection",
		    health_ms);
	}
	for (i = 0; i < HOL_CONNS; i++)
		curl_easy_cleanup(c[i]);
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* Kill -9 a real Redis under load, restart it on the same port: no
 * request waits past the timeout, the daemon lives, answers in the outage
 * are degraded, and afterwards Redis decides again by itself. */
START_TEST(test_redis_killed_under_load)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct ops_worker *w;
	long long killed_at, back_at;
	size_t k, before = 0, during = 0;
	int i;

	h_redis_start(&red);
	ops_start(&d, red.port,
	    &(struct ops_conf){ .policy = "allow", .limit = 1000000 });
	ck_assert(ops_wait_not_degraded("load", 2000));
	w = ops_load_start(LOAD_THREADS, 3000, 0, 5);

	h_sleep_ms(1000);
	killed_at = h_now_ms();
	ck_assert(kill(red.pid, SIGKILL) == 0);
	h_redis_stop(&red); /* reaps it */
	h_sleep_ms(200);
	ck_assert_int_eq(ops_get("/readyz", NULL), 503);
	h_sleep_ms(800);
	back_at = h_now_ms();
	h_redis_start(&red); /* the same port */

	ops_load_join(w, LOAD_THREADS);
	ck_assert_msg(ops_is_running(d.pid), "the daemon died");
	for (i = 0; i < LOAD_THREADS; i++) {
		for (k = 0; k < w[i].n; k++) {
			const struct ops_sample *s = &w[i].s[k];

			ck_assert_msg(s->status == 200,
			    "thread %d request "
			    "%zu (at %lld ms): status %ld, expected 200",
			    i, k, s->t0 - killed_at, s->status);
			if (s->t1 < killed_at) {
				before++;
				ck_assert_msg(!s->degraded,
				    "degraded before "
				    "Redis was killed");
			}
			if (s->t0 > killed_at && s->t1 < back_at) {
				during++;
				ck_assert_msg(s->degraded,
				    "not degraded "
				    "while Redis was down (at %lld ms)",
				    s->t0 - killed_at);
			}
		}
	}
	ck_assert_msg(before > 0 && during > 0,
	    "%zu requests before the "
	    "kill, %zu during the outage",
	    before, during);
	ck_assert_msg(ops_load_max_ms(w, LOAD_THREADS) < TIMEOUT_MS + MARGIN_MS,
	    "a request took %lld ms; redis.timeout is %d ms",
	    ops_load_max_ms(w, LOAD_THREADS), TIMEOUT_MS);
	free(w);

	ck_assert_msg(ops_wait_not_degraded("after", 8000),
	    "still degraded 8 s after Redis came back");
	ck_assert_int_eq(ops_poll_status("/readyz", 200, 2000), 200);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* =====================================================================
 * 2. Reload
 * ===================================================================== */

static const struct ops_conf reload_conf = { .memory = true, .limit = 1 };

/* Write c as d's file, SIGHUP d, and wait for its first reload to
 * succeed. */
static void
sighup_reload(struct h_daemon *d, const struct ops_conf *c)
{
	char yaml[4096];

	ops_render_for(d, c, yaml, sizeof(yaml));
	ops_write_file(d->conf, yaml);
	ck_assert(kill(d->pid, SIGHUP) == 0);
	ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
				      "{result=\"success\"}",
			  1, 2000) >= 1,
	    "no reload");
}

/* SIGHUP reloads (counted, logged); with a changed file, the new limit. */
START_TEST(test_reload_sighup)
{
	struct h_daemon d = { 0 };
	struct ops_conf c = reload_conf;
	char yaml[4096], *log;

	ops_start(&d, 0, &c);
	ck_assert_int_eq(ops_current_limit(), 1);
	ck_assert(kill(d.pid, SIGHUP) == 0);
	ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
				      "{result=\"success\"}",
			  1, 2000) == 1,
	    "SIGHUP did not reload");
	log = ops_slurp(d.log);
	ck_assert_msg(strstr(log, "reloaded") != NULL, "log: %s", log);
	free(log);

	c.limit = 3;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_write_file(d.conf, yaml);
	ck_assert(kill(d.pid, SIGHUP) == 0);
	ck_assert_int_eq(ops_wait_limit(3, 2000), 3);
	h_daemon_stop(&d);
}
END_TEST

/*
 * redis.timeout is start-only (docs/configuration.md): a reload that changes
 * it is logged as applying after a restart, and every request keeps the
 * value the daemon started with, on the front and in the store alike.
 * Redis stopped for 600 ms (SIGSTOP), policy deny: a daemon started at 2 s
 * and reloaded to 20 ms waits and answers from Redis (200); one started at
 * 20 ms and reloaded to 2 s answers 503 well before Redis is back.  (The
 * front ends used to read the reloaded value per request: 503 after 21 ms
 * in the first case, while the log said 2000 ms.)
 */
static void
timeout_reloaded(int start_ms, int reload_ms, long want, long long *ms)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct ops_conf c = { .policy = "deny", .limit = 1000000 };
	struct ops_call q;
	char *log;
	CURL *curl;

	h_redis_start(&red);
	c.timeout_ms = start_ms;
	ops_start(&d, red.port, &c);
	ck_assert(ops_wait_not_degraded("warm", 2000));
	c.timeout_ms = reload_ms;
	sighup_reload(&d, &c);
	log = ops_slurp(d.log);
	ck_assert_msg(strstr(log,
			  "redis.timeout changed; it applies after "
			  "a restart") != NULL,
	    "log: %s", log);
	free(log);

	curl = h_curl_new();
	ck_assert(kill(red.pid, SIGSTOP) == 0);
	ops_call_start(&q, curl, "POST", "/acquire", "{\"user\":\"t\"}");
	h_sleep_ms(600);
	ck_assert(kill(red.pid, SIGCONT) == 0);
	*ms = ops_call_finish(&q);
	ck_assert_msg(q.r.status == want,
	    "started at %d ms, reloaded to %d "
	    "ms: status %ld after %lld ms, expected %ld: %s",
	    start_ms, reload_ms, q.r.status, *ms, want, q.r.body);
	h_resp_free(&q.r);
	curl_easy_cleanup(curl);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}

START_TEST(test_reload_redis_timeout_start_only)
{
	long long ms;

	timeout_reloaded(2000, 20, 200, &ms);
	ck_assert_msg(ms >= 550,
	    "answered after %lld ms, before Redis was "
	    "back",
	    ms);
	timeout_reloaded(20, 2000, 503, &ms);
	ck_assert_msg(ms < 550,
	    "answered after %lld ms: the start value "
	    "is 20 ms",
	    ms);
}
END_TEST

/*
 * max_header_bytes is start-only too: reloaded from 8192 to 1024, with the
 * limit changed in the same file, a request with 2000 bytes of headers is
 * still served (and under the new limit, which a reload does apply).
 * (The reload used to publish the new value, which the front end reads
 * per request: 431.)
 */
START_TEST(test_reload_header_limit_start_only)
{
	struct h_daemon d = { 0 };
	struct ops_conf c = reload_conf;
	struct h_resp r = { 0 };
	char yaml[4096], pad[2100], *log;
	const char *hdrs[] = { pad, NULL };

	c.extra = "max_header_bytes: 8192\n";
	ops_start(&d, 0, &c);
	c.extra = "max_header_bytes: 1024\n";
	c.limit = 3;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_write_file(d.conf, yaml);
	ck_assert(kill(d.pid, SIGHUP) == 0);
	ck_assert_int_eq(ops_wait_limit(3, 2000), 3);
	log = ops_slurp(d.log);
	ck_assert_msg(strstr(log,
			  "reload: max_header_bytes changed; it applies "
			  "after a restart") != NULL,
	    "log: %s", log);
	free(log);

	snprintf(pad, sizeof(pad), "X-Pad: %02000d", 0);
	h_http(&r, "POST", "/acquire", "{\"user\":\"h\"}", hdrs);
	ck_assert_msg(r.status == 200, "2000 bytes of headers: %ld %s",
	    r.status, r.body);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/*
 * redis.key_prefix is start-only: it names a daemon's keys, its overrides
 * and the channel of lease releases it subscribes to, built once at start.
 * A reload from "a:" to "b:" is logged as applying after a restart, and a
 * key first taken after it is still written under "a:".  (The reload used
 * to move the keys to "b:" while the release channel stayed "a:released",
 * so a waiter missed the releases of daemons started on "b:".)
 */
START_TEST(test_reload_key_prefix_start_only)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct ops_conf c = { .limit = 5,
		.redis_extra = "  key_prefix: \"a:\"\n" };
	struct h_resp r = { 0 };
	char *log;

	h_redis_start(&red);
	ops_start(&d, red.port, &c);
	c.redis_extra = "  key_prefix: \"b:\"\n";
	sighup_reload(&d, &c);
	log = ops_slurp(d.log);
	ck_assert_msg(strstr(log,
			  "reload: redis.key_prefix changed; it applies "
			  "after a restart") != NULL,
	    "log: %s", log);
	free(log);

	h_post(d.port, "/acquire", "{\"user\":\"after\"}", &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	h_resp_free(&r);
	ck_assert_int_eq(h_redis_int(&red, "EXISTS %s", "a:x:{after}"), 1);
	ck_assert_int_eq(h_redis_int(&red, "EXISTS %s", "b:x:{after}"), 0);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/*
 * A reload to on_backend_error: local takes effect at once: with Redis
 * refusing, the in-process limiter decides (limit 2: 200, 200, 429), where
 * it used to answer every request as `allow` because the local store was
 * only made when the daemon started with `local`.  A start-only key changed
 * in the same reload is named in the log.
 */
START_TEST(test_reload_to_local)
{
	static const long want[] = { 200, 200, 429 };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	struct ops_conf c = { .policy = "allow" };
	char *log;
	int i;

	ops_start(&d, ops_closed_port(), &c);
	ops_acquire(&r, "r");
	ck_assert_int_eq(r.status, 200);
	ck_assert(ops_is_degraded(&r));
	h_resp_free(&r);

	c.policy = "local";
	c.threads = 3;
	sighup_reload(&d, &c);
	for (i = 0; i < 3; i++) {
		ops_acquire(&r, "r");
		ck_assert_msg(r.status == want[i],
		    "request %d: status %ld, "
		    "expected %ld: %s",
		    i + 1, r.status, want[i], r.body);
		ck_assert(ops_is_degraded(&r));
		h_resp_free(&r);
	}
	log = ops_slurp(d.log);
	ck_assert_msg(strstr(log,
			  "reload: threads changed; it applies after "
			  "a restart") != NULL,
	    "log: %s", log);
	ck_assert_msg(strstr(log, "on_backend_error changed") == NULL,
	    "log: %s", log);
	free(log);
	h_daemon_stop(&d);
}
END_TEST

/*
 * A denial the store decided under the old rules, whose answer arrives
 * after a reload, is not remembered for the new ones.  Limit 1: "u" uses
 * it; Redis stopped, a second request of "u" waits for its denial; the
 * file goes to limit 100 and SIGHUP; Redis resumes and the waiting one is
 * denied (old rules).  The next request of "u" is admitted (1 of 100
 * used).  (The deny cache used to learn that late denial after the reload
 * had cleared it, and answered 429 {"limit":100,"remaining":0} until the
 * old retry_after had passed.)
 */
START_TEST(test_reload_deny_in_flight)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct ops_conf c = {
		.policy = "deny", .limit = 1, .timeout_ms = 5000
	};
	struct h_resp r = { 0 };
	struct ops_call q;
	CURL *curl;
	int i;

	h_redis_start(&red);
	ops_start(&d, red.port, &c);
	ops_acquire(&r, "u");
	ck_assert_msg(r.status == 200, "first: %ld %s", r.status, r.body);
	h_resp_free(&r);

	curl = h_curl_new();
	ck_assert(kill(red.pid, SIGSTOP) == 0);
	ops_call_start(&q, curl, "POST", "/acquire", "{\"user\":\"u\"}");
	h_sleep_ms(300);
	c.limit = 100;
	sighup_reload(&d, &c);
	ck_assert(kill(red.pid, SIGCONT) == 0);
	ops_call_finish(&q);
	ck_assert_msg(q.r.status == 429, "in flight: %ld %s", q.r.status,
	    q.r.body);
	h_resp_free(&q.r);
	curl_easy_cleanup(curl);

	for (i = 0; i < 3; i++) {
		ops_acquire(&r, "u");
		ck_assert_msg(r.status == 200,
		    "after the reload, request %d: %ld %s", i + 1, r.status,
		    r.body);
		h_resp_free(&r);
	}
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* A file replaced by rename (how editors and config tools write) is
 * reloaded without a signal. */
START_TEST(test_reload_rename)
{
	struct h_daemon d = { 0 };
	struct ops_conf c = reload_conf;
	char yaml[4096];

	ops_start(&d, 0, &c);
	ck_assert_int_eq(ops_current_limit(), 1);
	c.limit = 4;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_replace_file(d.conf, yaml);
	ck_assert_int_eq(ops_wait_limit(4, 2000), 4);
	c.limit = 5; /* and again: the watch survives */
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_replace_file(d.conf, yaml);
	ck_assert_int_eq(ops_wait_limit(5, 2000), 5);
	h_daemon_stop(&d);
}
END_TEST

/*
 * A change on disk that leaves the text as it was reloads nothing (a
 * touch, the same text renamed over the file: as the watch's own event
 * after a SIGHUP that loaded the new text already); SIGHUP always
 * reloads; a change of the text reloads, once.  (Each used to be a reload:
 * warnings of start-only keys logged again, quota held in advance dropped.)
 */
START_TEST(test_reload_same_text)
{
	const char *ok = "ratelimitd_config_reloads_total{result=\"success\"}";
	struct h_daemon d = { 0 };
	struct ops_conf c = reload_conf;
	char yaml[4096];

	ops_start(&d, 0, &c);
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_replace_file(d.conf, yaml);
	ck_assert_int_eq(utimes(d.conf, NULL), 0);
	h_sleep_ms(800); /* the watch waits 200 ms for quiet */
	ck_assert_msg(ops_metric(ok) <= 0, "the same text was reloaded");
	ck_assert(kill(d.pid, SIGHUP) == 0);
	ck_assert_msg(ops_wait_metric(ok, 1, 2000) == 1, "SIGHUP: no reload");

	/* A new text: reloaded by the watch, once. */
	c.limit = 4;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_replace_file(d.conf, yaml);
	ck_assert_int_eq(ops_wait_limit(4, 2000), 4);
	h_sleep_ms(800);
	ck_assert_int_eq(ops_metric(ok), 2);
	h_daemon_stop(&d);
}
END_TEST

/* Put text into dir/..<version>/ratelimitd.yaml. */
static void
cm_version(const char *dir, const char *version, const char *text)
{
	char p[H_PATH_MAX + 64];

	snprintf(p, sizeof(p), "%s/%s", dir, version);
	ck_assert_msg(mkdir(p, 0755) == 0, "mkdir %s: %s", p, strerror(errno));
	snprintf(p, sizeof(p), "%s/%s/ratelimitd.yaml", dir, version);
	ops_write_file(p, text);
}

/* Put text into dir/<version>/pw. */
static void
cm_pw(const char *dir, const char *version, const char *text)
{
	char p[H_PATH_MAX + 64];

	snprintf(p, sizeof(p), "%s/%s/pw", dir, version);
	ops_write_file(p, text);
}

/* Point dir/..data at version the way the kubelet does: a new symlink,
 * renamed over the old one. */
static void
cm_swap(const char *dir, const char *version)
{
	char tmp[H_PATH_MAX + 32], data[H_PATH_MAX + 32];

	snprintf(tmp, sizeof(tmp), "%s/..data_tmp", dir);
	snprintf(data, sizeof(data), "%s/..data", dir);
	ck_assert(symlink(version, tmp) == 0);
	ck_assert_msg(rename(tmp, data) == 0, "rename: %s", strerror(errno));
}

/* A ConfigMap volume: dir/ratelimitd.yaml -> ..data/ratelimitd.yaml,
 * ..data -> ..v1; an update swaps ..data to a new version directory.
 * One with the same text and files reloads nothing; one with the same
 * text beside another password file does. */
START_TEST(test_reload_configmap)
{
	const char *ok = "ratelimitd_config_reloads_total{result=\"success\"}";
	struct h_daemon d = { 0 };
	struct ops_conf c = reload_conf;
	char dir[H_PATH_MAX], link[H_PATH_MAX + 32], pre[3 * H_PATH_MAX];
	char yaml[4096], pw[H_PATH_MAX + 64];

	ops_tmp_name(dir, sizeof(dir), "configmap");
	/* A password file in the volume too (the memory store reads it
	 * not, but a reload's check of what changed does). */
	snprintf(pw, sizeof(pw), "  password_file: \"%s/..data/pw\"\n", dir);
	c.url = "redis://127.0.0.1:1/0";
	c.redis_extra = pw;
	ck_assert(mkdir(dir, 0755) == 0);
	snprintf(link, sizeof(link), "%s/..v1", dir);
	ck_assert(mkdir(link, 0755) == 0);
	cm_pw(dir, "..v1", "one");
	snprintf(link, sizeof(link), "%s/..data", dir);
	ck_assert(symlink("..v1", link) == 0);
	snprintf(link, sizeof(link), "%s/ratelimitd.yaml", dir);
	ck_assert(symlink("..data/ratelimitd.yaml", link) == 0);
	/* The daemon reads the harness's file through the volume. */
	snprintf(pre, sizeof(pre),
	    "cp \"$2\" '%s/..v1/ratelimitd.yaml' && "
	    "set -- -c '%s'",
	    dir, link);
	ops_wrap_daemon(pre);
	ops_start(&d, 0, &c);
	ck_assert_int_eq(ops_current_limit(), 1);

	c.limit = 6;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	cm_version(dir, "..v2", yaml);
	cm_swap(dir, "..v2");
	ck_assert_int_eq(ops_wait_limit(6, 2000), 6);

	c.limit = 7;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	cm_version(dir, "..v3", yaml);
	cm_pw(dir, "..v3", "one");
	cm_swap(dir, "..v3");
	ck_assert_int_eq(ops_wait_limit(7, 2000), 7);
	ck_assert_int_eq(ops_wait_metric(ok, 2, 2000), 2);

	/* The same text and password file again: no reload; the same text
	 * beside another password: a reload (a Secret rotated in the
	 * volume that holds the config). */
	cm_version(dir, "..v4", yaml);
	cm_pw(dir, "..v4", "one");
	cm_swap(dir, "..v4");
	h_sleep_ms(800);
	ck_assert_int_eq(ops_metric(ok), 2);
	cm_version(dir, "..v5", yaml);
	cm_pw(dir, "..v5", "two");
	cm_swap(dir, "..v5");
	ck_assert_msg(ops_wait_metric(ok, 3, 2000) == 3,
	    "a file the config names changed: no reload");
	h_daemon_stop(&d);
}
END_TEST

/* -c dirB/link.yaml, a symlink to ../dirA/real.yaml: replacing the target
 * reloads.  (Only dirB used to be watched: the change was never seen.) */
START_TEST(test_reload_symlink_other_dir)
{
	struct h_daemon d = { 0 };
	struct ops_conf c = reload_conf;
	char dir[H_PATH_MAX], real[H_PATH_MAX + 32], link[H_PATH_MAX + 32];
	char pre[3 * H_PATH_MAX], yaml[4096];

	ops_tmp_name(dir, sizeof(dir), "symlinked");
	ck_assert(mkdir(dir, 0755) == 0);
	snprintf(real, sizeof(real), "%s/dirA", dir);
	ck_assert(mkdir(real, 0755) == 0);
	snprintf(link, sizeof(link), "%s/dirB", dir);
	ck_assert(mkdir(link, 0755) == 0);
	snprintf(real, sizeof(real), "%s/dirA/real.yaml", dir);
	snprintf(link, sizeof(link), "%s/dirB/link.yaml", dir);
	ck_assert(symlink("../dirA/real.yaml", link) == 0);
	snprintf(pre, sizeof(pre), "cp \"$2\" '%s' && set -- -c '%s'", real,
	    link);
	ops_wrap_daemon(pre);
	ops_start(&d, 0, &c);
	ck_assert_int_eq(ops_current_limit(), 1);

	c.limit = 6;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_replace_file(real, yaml);
	ck_assert_int_eq(ops_wait_limit(6, 2000), 6);
	h_daemon_stop(&d);
}
END_TEST

/* -c dir/c/conf.yaml -> ../l1/link -> ../l2/link -> ../r/real.yaml, each
 * link in its own directory: pointing the middle link at l2b/link ->
 * ../r2/real.yaml, a file with another limit, reloads.  (Only the first
 * and the last link's directories used to be watched: it did not.) */
START_TEST(test_reload_symlink_chain)
{
	static const char *const dirs[] = { "c", "l1", "l2", "l2b", "r", "r2" };
	struct h_daemon d = { 0 };
	struct ops_conf c = reload_conf;
	char dir[H_PATH_MAX], p[H_PATH_MAX + 32], conf[H_PATH_MAX + 32];
	char tmp[H_PATH_MAX + 32], pre[3 * H_PATH_MAX], yaml[4096];
	size_t i;

	ops_tmp_name(dir, sizeof(dir), "chain");
	ck_assert(mkdir(dir, 0755) == 0);
	for (i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, dirs[i]);
		ck_assert(mkdir(p, 0755) == 0);
	}
	snprintf(p, sizeof(p), "%s/l2/link", dir);
	ck_assert(symlink("../r/real.yaml", p) == 0);
	snprintf(p, sizeof(p), "%s/l1/link", dir);
	ck_assert(symlink("../l2/link", p) == 0);
	snprintf(conf, sizeof(conf), "%s/c/conf.yaml", dir);
	ck_assert(symlink("../l1/link", conf) == 0);
	snprintf(pre, sizeof(pre),
	    "cp \"$2\" '%s/r/real.yaml' && set -- -c '%s'", dir, conf);
	ops_wrap_daemon(pre);
	ops_start(&d, 0, &c);
	ck_assert_int_eq(ops_current_limit(), 1);

	c.limit = 6;
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	snprintf(p, sizeof(p), "%s/r2/real.yaml", dir);
	ops_write_file(p, yaml);
	snprintf(p, sizeof(p), "%s/l2b/link", dir);
	ck_assert(symlink("../r2/real.yaml", p) == 0);
	snprintf(tmp, sizeof(tmp), "%s/l1/link.tmp", dir);
	snprintf(p, sizeof(p), "%s/l1/link", dir);
	ck_assert(symlink("../l2b/link", tmp) == 0);
	ck_assert_msg(rename(tmp, p) == 0, "rename: %s", strerror(errno));
	ck_assert_int_eq(ops_wait_limit(6, 2000), 6);
	h_daemon_stop(&d);
}
END_TEST

/* A file with a syntax error: rejected, the old rules stay, the log says
 * FILE:LINE:COL, and the failure counter goes up by exactly one. */
START_TEST(test_reload_bad_file)
{
	static const char failures[] =
	    "ratelimitd_config_reloads_total{result=\"failure\"}";
	struct h_daemon d = { 0 };
	char yaml[4096], where[H_PATH_MAX + 32], *log;
	int bad_line = 0;
	double before;
	const char *p;

	ops_start(&d, 0, &reload_conf);
	ck_assert_int_eq(ops_current_limit(), 1);
	before = ops_metric(failures);
	ck_assert_msg(before == 0, "%s is %g before any reload", failures,
	    before);

	/* The good file, then a key indented to no level: an error at
	 * column 3 of the line after the last. */
	ops_render_for(&d, &reload_conf, yaml, sizeof(yaml));
	for (p = yaml; *p != '\0'; p++)
		bad_line += *p == '\n';
	bad_line++;
	strcat(yaml, "  oops: 1\n");
	ops_replace_file(d.conf, yaml);
	ck_assert_msg(ops_wait_metric(failures, 1, 2000) == 1,
	    "the bad file was not counted as a failed reload");
	h_sleep_ms(500);
	ck_assert_msg(ops_metric(failures) == 1, "failures: %g, expected 1",
	    ops_metric(failures));
	ck_assert_msg(ops_metric("ratelimitd_config_last_reload_success") == 0,
	    "last_reload_success is not 0 after a failure");
	ck_assert_int_eq(ops_current_limit(), 1);

	log = ops_slurp(d.log);
	snprintf(where, sizeof(where), "%s:%d:3: ", d.conf, bad_line);
	ck_assert_msg(strstr(log, where) != NULL,
	    "the log does not say "
	    "\"%s\":\n%s",
	    where, log);
	free(log);
	h_daemon_stop(&d);
}
END_TEST

/* =====================================================================
 * 3. Metrics
 * ===================================================================== */

START_TEST(test_metrics)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	const char *ctype;
	int i, allowed = 0, denied = 0;

	h_redis_start(&red);
	ops_start(&d, red.port, &(struct ops_conf){ .limit = 3 });
	for (i = 0; i < 5; i++) {
		ops_acquire(&r, "m");
		ck_assert_msg(!ops_is_degraded(&r), "%s", r.body);
		allowed += r.status == 200;
		denied += r.status == 429;
		h_resp_free(&r);
	}
	ck_assert_int_eq(allowed, 3);
	ck_assert_int_eq(denied, 2);

	ops_scrape(&r);
	ctype = h_resp_header(&r, "Content-Type");
	ck_assert_msg(ctype != NULL && strstr(ctype, "version=0.0.4") != NULL,
	    "Content-Type: %s", ctype ? ctype : "(none)");
	ops_promtool_check(r.body);
	ck_assert_int_eq(
	    ops_metric_in(r.body,
		"ratelimitd_decisions_total"
		"{rule=\"x\",result=\"allowed\",protocol=\"http\"}"),
	    allowed);
	ck_assert_int_eq(
	    ops_metric_in(r.body,
		"ratelimitd_decisions_total"
		"{rule=\"x\",result=\"denied\",protocol=\"http\"}"),
	    denied);
	ck_assert_int_eq(ops_metric_in(r.body,
			     "ratelimitd_http_responses_total"
			     "{code=\"429\"}"),
	    denied);
	/* Each request asked Redis, or was a repeated denial answered
	 * from the deny cache: the 4th is Redis' first denial, so at
	 * least 4 calls. */
	ck_assert_int_ge(ops_metric_in(r.body,
			     "ratelimitd_backend_request_"
			     "duration_seconds_count{backend=\"redis\"}"),
	    4);
	ck_assert_int_eq(ops_metric_in(r.body,
			     "ratelimitd_backend_request_"
			     "duration_seconds_count{backend=\"redis\"}") +
		ops_metric_in(r.body, "ratelimitd_deny_cache_hits_total"),
	    5);
	ck_assert_int_eq(ops_metric_in(r.body,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"connect\"}"),
	    0);
	h_resp_free(&r);

	h_redis_stop(&red);
	/* Another key: "m" is still denied from the deny cache, as Redis
	 * would deny it. */
	for (i = 0; i < 3; i++) {
		ops_acquire(&r, "m2");
		ck_assert_msg(r.status == 200 && ops_is_degraded(&r), "%s",
		    r.body);
		h_resp_free(&r);
	}
	ops_scrape(&r);
	ops_promtool_check(r.body);
	ck_assert_int_ge(ops_metric_in(r.body,
			     "ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"connect\"}"),
	    1);
	ck_assert_int_eq(
	    ops_metric_in(r.body,
		"ratelimitd_decisions_total"
		"{rule=\"x\",result=\"degraded\",protocol=\"http\"}"),
	    3);
	ck_assert_int_eq(
	    ops_metric_in(r.body,
		"ratelimitd_decisions_total"
		"{rule=\"x\",result=\"allowed\",protocol=\"http\"}"),
	    allowed);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/* =====================================================================
 * 4. Shutdown
 * ===================================================================== */

/* How one request of the shutdown test ended. */
struct outcome {
	long long t1;
	CURLcode rc;
	long status;
	bool json_ok; /* a JSON object with "allowed" */
};

struct client {
	pthread_t thread;
	int port;
	bool fresh; /* a new connection for every request */
	atomic_bool *stop;
	struct outcome o[8192];
	size_t n;
};

static size_t
sink(char *data, size_t size, size_t nmemb, void *arg)
{
	char *buf = arg;
	size_t n = size * nmemb, have = strlen(buf);

	if (have + n < 4096) {
		memcpy(buf + have, data, n);
		buf[have + n] = '\0';
	}
	return n;
}

/* POST /acquire, reporting libcurl's own result. */
static void
post_raw(CURL *c, int port, bool fresh, struct outcome *o)
{
	static const char body[] = "{\"user\":\"s\"}";
	char url[64], resp[4096] = "";
	json_t *j;

	snprintf(url, sizeof(url), "http://127.0.0.1:%d/acquire", port);
	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_FORBID_REUSE, fresh ? 1L : 0L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, resp);
	o->status = 0;
	o->rc = curl_easy_perform(c);
	o->t1 = h_now_ms();
	if (o->rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &o->status);
	j = json_loads(resp, 0, NULL);
	o->json_ok = json_is_object(j) &&
	    json_is_boolean(json_object_get(j, "allowed"));
	json_decref(j);
}

static void *
client_main(void *arg)
{
	struct client *cl = arg;
	CURL *c = curl_easy_init();

	while (c != NULL && !atomic_load(cl->stop) &&
	    cl->n < sizeof(cl->o) / sizeof(cl->o[0])) {
		post_raw(c, cl->port, cl->fresh, &cl->o[cl->n]);
		if (cl->o[cl->n++].rc != CURLE_OK)
			h_sleep_ms(5);
	}
	if (c != NULL)
		curl_easy_cleanup(c);
	return NULL;
}

/* A connection error, as opposed to a broken or partial answer. */
static bool
is_connection_error(CURLcode rc)
{
	return rc == CURLE_COULDNT_CONNECT || rc == CURLE_GOT_NOTHING ||
	    rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR;
}

/* SIGTERM under load: exit 0 within shutdown_timeout + 1 s, and every
 * client saw a whole answer or, after the signal, a connection error or a
 * 503.  Run 0 on the memory store; runs 1-3 on Redis, half the clients on
 * keep-alive connections, where decisions wait for the Redis thread
 * (libmicrohttpd used to abort when stopped with such requests
 * suspended, in about half of the runs). */
START_TEST(test_sigterm_under_load)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct client *cl = calloc(LOAD_THREADS, sizeof(*cl));
	atomic_bool stop = false;
	long long sig_at, took;
	size_t k, ok_before = 0, refused_after = 0;
	int i;
	bool on_redis = _i > 0;

	ck_assert(cl != NULL);
	if (on_redis) {
		h_redis_start(&red);
		ops_start(&d, red.port, &(struct ops_conf){ .limit = 1000000 });
	} else
		ops_start(&d, 0,
		    &(struct ops_conf){ .memory = true, .limit = 1000000 });
	for (i = 0; i < LOAD_THREADS; i++) {
		cl[i].port = d.port;
		cl[i].fresh = i % 2 == 1;
		cl[i].stop = &stop;
		ck_assert(pthread_create(&cl[i].thread, NULL, client_main,
			      &cl[i]) == 0);
	}
	h_sleep_ms(300);
	sig_at = h_now_ms();
	ck_assert(kill(d.pid, SIGTERM) == 0);
	took = ops_exit_time_ms(d.pid, 2000 + 1000);
	h_sleep_ms(200);
	atomic_store(&stop, true);
	for (i = 0; i < LOAD_THREADS; i++)
		pthread_join(cl[i].thread, NULL);
	ck_assert_msg(took >= 0,
	    "still running 3 s after SIGTERM "
	    "(shutdown_timeout 2s)");
	h_daemon_stop(&d); /* asserts exit status 0 */

	for (i = 0; i < LOAD_THREADS; i++) {
		for (k = 0; k < cl[i].n; k++) {
			const struct outcome *o = &cl[i].o[k];

			if (o->rc == CURLE_OK && o->status == 503 &&
			    o->t1 >= sig_at)
				continue; /* shutting down */
			if (o->rc == CURLE_OK) {
				ck_assert_msg(o->status == 200 && o->json_ok,
				    "client %d request %zu: status %ld, "
				    "body %s JSON",
				    i, k, o->status,
				    o->json_ok ? "is" : "is not");
				ok_before += o->t1 < sig_at;
				continue;
			}
			ck_assert_msg(is_connection_error(o->rc),
			    "client %d request %zu, %lld ms after SIGTERM: %s "
			    "(%d)",
			    i, k, o->t1 - sig_at, curl_easy_strerror(o->rc),
			    o->rc);
			ck_assert_msg(o->t1 >= sig_at,
			    "client %d request "
			    "%zu: %s before SIGTERM",
			    i, k, curl_easy_strerror(o->rc));
			refused_after += o->rc == CURLE_COULDNT_CONNECT;
		}
	}
	ck_assert_msg(ok_before > 0, "no request was answered before SIGTERM");
	ck_assert_msg(refused_after > 0, "no client saw the listener close");
	free(cl);
	if (on_redis)
		h_redis_stop(&red);
}
END_TEST

/* A request in flight (waiting on a Redis that never answers) when
 * SIGTERM comes is finished, not cut. */
START_TEST(test_sigterm_finishes_in_flight)
{
	struct h_daemon d = { 0 };
	struct ops_call q;
	CURL *c = h_curl_new();
	long long took;
	int port, fd = ops_silent_listener(&port);

	ops_start(&d, port, &(struct ops_conf){ .timeout_ms = 600 });
	ops_call_start(&q, c, "POST", "/acquire", "{\"user\":\"q\"}");
	h_sleep_ms(200);
	ck_assert(kill(d.pid, SIGTERM) == 0);
	took = ops_exit_time_ms(d.pid, 2000 + 1000);
	ops_call_finish(&q);
	ck_assert_msg(took >= 0, "still running 3 s after SIGTERM");
	h_daemon_stop(&d);
	ck_assert_msg(q.r.status == 200 && ops_is_degraded(&q.r),
	    "the request in flight got status %ld (%s), expected a "
	    "degraded 200",
	    q.r.status, q.r.status ? q.r.body : q.r.err);
	h_resp_free(&q.r);
	curl_easy_cleanup(c);
	close(fd);
}
END_TEST

/* Requests that outlast shutdown_timeout do not hold the exit up: it comes
 * within shutdown_timeout + 1 s, still with status 0. */
START_TEST(test_sigterm_bounded_by_shutdown_timeout)
{
	struct h_daemon d = { 0 };
	struct ops_call q;
	CURL *c = h_curl_new();
	long long took;
	int port, fd = ops_silent_listener(&port);

	ops_start(&d, port,
	    &(struct ops_conf){ .timeout_ms = 4000, .shutdown = "500ms" });
	ops_call_start(&q, c, "POST", "/acquire", "{\"user\":\"q\"}");
	h_sleep_ms(200);
	ck_assert(kill(d.pid, SIGTERM) == 0);
	took = ops_exit_time_ms(d.pid, 500 + 1000);
	ops_call_finish(&q);
	h_resp_free(&q.r);
	curl_easy_cleanup(c);
	ck_assert_msg(took >= 0,
	    "still running 1.5 s after SIGTERM with "
	    "shutdown_timeout 500ms (a request was waiting on Redis, "
	    "redis.timeout 4s)");
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* A second SIGTERM during the drain ends it as shutdown_timeout running
 * out then would (docs/operations.md), with shutdown_timeout 30s and a
 * request held: run 0 a waiter due in about 10 s on the memory store,
 * which is answered 503 shutting_down at once; run 1 a request waiting
 * on a Redis that never answers (redis.timeout 20s), which is left
 * unanswered as on expiry.  The first SIGTERM leaves the daemon running;
 * the second makes it exit 0 within 2 s and log one line, and a third
 * changes nothing. */
START_TEST(test_second_sigterm_cuts_drain)
{
	static const char waiting[] =
	    "listen: \"127.0.0.1:%PORT%\"\n"
	    "backend: memory\n"
	    "shutdown_timeout: 30s\n"
	    "rules:\n"
	    "  - name: x\n"
	    "    key: \"${user}\"\n"
	    "    limit: 1\n"
	    "    window: 10s\n";
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	struct ops_call q;
	CURL *c = h_curl_new();
	long long took;
	int port, fd = -1;
	bool on_redis = _i == 1;

	if (on_redis) {
		fd = ops_silent_listener(&port);
		ops_start(&d, port,
		    &(struct ops_conf){
			.timeout_ms = 20000, .shutdown = "30s" });
		ops_call_start(&q, c, "POST", "/acquire", "{\"user\":\"q\"}");
		h_sleep_ms(200);
	} else {
		h_daemon_start(&d, waiting);
		ops_acquire(&r, "w");
		ck_assert_int_eq(r.status, 200);
		h_resp_free(&r);
		ops_call_start(&q, c, "POST", "/acquire",
		    "{\"user\":\"w\",\"wait_ms\":20000}");
		ck_assert(ops_wait_metric("ratelimitd_waiting_requests"
					  "{for=\"turn\"}",
			      1, 2000) == 1);
	}
	ck_assert(kill(d.pid, SIGTERM) == 0);
	h_sleep_ms(300);
	ck_assert_msg(ops_is_running(d.pid),
	    "exited on the first SIGTERM with a request held");
	ck_assert(kill(d.pid, SIGTERM) == 0);
	h_sleep_ms(20);
	(void)kill(d.pid, SIGTERM); /* the third: nothing more */
	took = ops_exit_time_ms(d.pid, 2000);
	ck_assert_msg(took >= 0,
	    "still running 2 s after a second SIGTERM "
	    "(shutdown_timeout 30s)");
	ops_call_finish(&q);
	h_daemon_stop(&d); /* asserts exit status 0 */
	if (on_redis)
		ck_assert_msg(q.r.status == 0,
		    "the request waiting on Redis got status %ld (%s), "
		    "expected none, as when shutdown_timeout runs out",
		    q.r.status, q.r.body);
	else
		ck_assert_msg(q.r.status == 503 &&
			strstr(q.r.body, "shutting_down") != NULL,
		    "the waiter got status %ld (%s), expected 503 "
		    "shutting_down",
		    q.r.status, q.r.status ? q.r.body : q.r.err);
	ck_assert_int_eq(ops_count_in_file(d.log, "drain cut short"), 1);
	h_resp_free(&q.r);
	curl_easy_cleanup(c);
	if (fd >= 0)
		close(fd);
}
END_TEST

/* =====================================================================
 * 5. Logs
 * ===================================================================== */

/* Make the daemon log a bit of everything: decisions (allowed, denied,
 * degraded), an error answer, /readyz, a good and a bad reload. */
static void
exercise_logging(struct h_daemon *d, const struct ops_conf *c)
{
	struct h_resp r = { 0 };
	char yaml[4096];
	int i;

	for (i = 0; i < 4; i++) {
		ops_acquire(&r, "log");
		h_resp_free(&r);
	}
	h_http(&r, "POST", "/acquire", "{\"user\":", NULL);
	h_resp_free(&r);
	(void)ops_get("/readyz", NULL);
	ck_assert(kill(d->pid, SIGHUP) == 0);
	ck_assert(ops_wait_metric("ratelimitd_config_reloads_total"
				  "{result=\"success\"}",
		      1, 2000) == 1);
	ops_render_for(d, c, yaml, sizeof(yaml));
	strcat(yaml, "rules: [\"unterminated\n");
	ops_replace_file(d->conf, yaml);
	ck_assert(ops_wait_metric("ratelimitd_config_reloads_total"
				  "{result=\"failure\"}",
		      1, 2000) == 1);
}

/* log_format: json => every line is a JSON object with ts, level, msg. */
START_TEST(test_log_json)
{
	static const char *const levels[] = { "debug", "info", "warn",
		"error" };
	struct ops_conf c = { .policy = "allow",
		.extra =
		    "log_format: json\n"
		    "log_level: debug\naccess_log: true\n" };
	struct h_daemon d = { 0 };
	char *log, *line, *save = NULL;
	int nlines = 0, nwarn = 0;
	size_t i;

	ops_start(&d, ops_closed_port(), &c);
	exercise_logging(&d, &c);
	h_daemon_stop(&d);

	log = ops_slurp(d.log);
	for (line = strtok_r(log, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save), nlines++) {
		json_error_t e;
		json_t *j = json_loads(line, 0, &e);
		const char *lv;
		bool known = false;

		ck_assert_msg(json_is_object(j), "not a JSON object (%s): %s",
		    e.text, line);
		ck_assert_msg(json_is_string(json_object_get(j, "ts")) &&
			json_is_string(json_object_get(j, "msg")) &&
			json_is_string(json_object_get(j, "level")),
		    "ts, level or msg missing: %s", line);
		lv = json_string_value(json_object_get(j, "level"));
		for (i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
			known |= strcmp(lv, levels[i]) == 0;
		ck_assert_msg(known, "unknown level: %s", line);
		nwarn += strcmp(lv, "warn") == 0;
		json_decref(j);
	}
	ck_assert_msg(nlines >= 8 && nwarn > 0, "only %d lines, %d warn",
	    nlines, nwarn);
	free(log);
}
END_TEST

/* The value of level= in a logfmt line, copied into out. */
static void
logfmt_level(const char *line, char *out, size_t len)
{
	const char *p = strstr(line, " level=");
	size_t n = 0;

	out[0] = '\0';
	if (p == NULL)
		return;
	for (p += 7; p[n] != '\0' && p[n] != ' ' && n + 1 < len; n++)
		out[n] = p[n];
	out[n] = '\0';
}

/* log_level: warn => warnings and errors only. */
START_TEST(test_log_level_warn)
{
	struct ops_conf c = { .policy = "allow", .extra = "log_level: warn\n" };
	struct h_daemon d = { 0 };
	char *log, *line, *save = NULL, lv[16];
	int nwarn = 0;

	ops_start(&d, ops_closed_port(), &c);
	exercise_logging(&d, &c);
	h_daemon_stop(&d);

	log = ops_slurp(d.log);
	for (line = strtok_r(log, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		logfmt_level(line, lv, sizeof(lv));
		ck_assert_msg(strcmp(lv, "warn") == 0 ||
			strcmp(lv, "error") == 0,
		    "below warn: %s", line);
		nwarn += strcmp(lv, "warn") == 0;
	}
	ck_assert_msg(nwarn > 0, "no warning was logged at all");
	free(log);
}
END_TEST

/* access_log: true => one line per decision, /acquire and /auth. */
START_TEST(test_access_log)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long end;
	int i, n;

	ops_start(&d, 0,
	    &(struct ops_conf){
		.memory = true, .extra = "access_log: true\n" });
	for (i = 0; i < 3; i++) {
		ops_acquire(&r, "acc");
		ck_assert_int_eq(r.status, i < 2 ? 200 : 429);
		h_resp_free(&r);
	}
	h_http(&r, "GET", "/auth", NULL, NULL);
	ck_assert_int_eq(r.status, 200);
	h_resp_free(&r);
	end = h_now_ms() + 1000;
	while ((n = ops_count_in_file(d.log, "msg=\"decision\"")) < 4 &&
	    h_now_ms() < end)
		h_sleep_ms(20);
	ck_assert_msg(n == 4, "%d access log lines for 4 decisions", n);
	ck_assert_int_eq(ops_count_in_file(d.log, "allowed=\"false\""), 1);
	h_daemon_stop(&d);
}
END_TEST

/* SIGUSR1 and SIGUSR2 (sent by log rotation out of habit) are logged and
 * ignored: the daemon goes on answering, and stops cleanly later.  Their
 * default action would end it at once, with no drain. */
START_TEST(test_sigusr_ignored)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long end;
	int n;

	ops_start(&d, 0, &(struct ops_conf){ .memory = true });
	ck_assert(kill(d.pid, SIGUSR1) == 0);
	ck_assert(kill(d.pid, SIGUSR2) == 0);
	end = h_now_ms() + 2000;
	while ((n = ops_count_in_file(d.log, "ignored: the daemon logs")) < 2 &&
	    h_now_ms() < end)
		h_sleep_ms(20);
	ck_assert_msg(n == 2, "%d log lines for SIGUSR1 and SIGUSR2", n);
	ck_assert_int_eq(ops_count_in_file(d.log, "SIGUSR1 ignored"), 1);
	ck_assert_int_eq(ops_count_in_file(d.log, "SIGUSR2 ignored"), 1);
	ops_acquire(&r, "usr");
	ck_assert_int_eq(r.status, 200);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/* The Redis password is never logged: not on connect errors, not on
 * reloads, not in a config error about the URL. */
START_TEST(test_log_hides_password)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	struct ops_conf c = { .url = "redis://:s3cret@127.0.0.1:%REDIS_PORT%/0",
		.extra = "log_level: debug\naccess_log: true\n" };
	char yaml[4096], shown[64], *log;
	int i, port = ops_closed_port();

	ops_start(&d, port, &c);
	for (i = 0; i < 8; i++) {
		ops_acquire(&r, "pw");
		ck_assert(ops_is_degraded(&r));
		h_resp_free(&r);
		(void)ops_get("/readyz", NULL);
		h_sleep_ms(i == 3 ? 1100 : 0); /* past the log's limit */
	}
	c.url = "redis://:s3cret@127.0.0.1:99999/0"; /* bad port */
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_replace_file(d.conf, yaml);
	ck_assert(ops_wait_metric("ratelimitd_config_reloads_total"
				  "{result=\"failure\"}",
		      1, 2000) == 1);
	c.url = "redis://:s3cret2@127.0.0.1:%REDIS_PORT%/0";
	ops_render_for(&d, &c, yaml, sizeof(yaml));
	ops_replace_file(d.conf, yaml);
	ck_assert(ops_wait_metric("ratelimitd_config_reloads_total"
				  "{result=\"success\"}",
		      1, 2000) == 1);
	h_daemon_stop(&d);

	log = ops_slurp(d.log);
	snprintf(shown, sizeof(shown), "127.0.0.1:%d", port);
	ck_assert_msg(strstr(log, shown) != NULL,
	    "the log never names "
	    "Redis at %s:\n%s",
	    shown, log);
	ck_assert_msg(strstr(log, "s3cret") == NULL,
	    "the password is in "
	    "the log:\n%s",
	    log);
	free(log);
}
END_TEST

/* =====================================================================
 * 6. Redis authentication
 * ===================================================================== */

/* Redis decided (not degraded) for user, keeping its counter in database
 * db, and /readyz is 200. */
static void
assert_redis_decides_in(struct h_redis *red, int db, const char *user)
{
	struct h_resp r = { 0 };
	char key[128];

	ops_acquire(&r, user);
	ck_assert_msg(r.status == 200 && !ops_is_degraded(&r) &&
		h_json_str(&r, "rule") != NULL,
	    "status %ld: %s", r.status, r.body);
	h_resp_free(&r);
	snprintf(key, sizeof(key), "rl:x:{%s}", user);
	ops_redis_ok(red, "SELECT %d", db);
	ck_assert_msg(h_redis_int(red, "EXISTS %s", key) == 1,
	    "no key %s "
	    "in database %d",
	    key, db);
	ck_assert_int_eq(ops_get("/readyz", NULL), 200);
}

static void
assert_redis_decides(struct h_redis *red, const char *user)
{
	assert_redis_decides_in(red, 0, user);
}

/* A Redis on which the default user needs password pass; our own
 * connection (made first) stays authenticated. */
static void
redis_with_password(struct h_redis *red, const char *pass)
{
	h_redis_start(red);
	(void)h_redis_ctx(red);
	ops_redis_ok(red, "CONFIG SET requirepass %s", pass);
}

START_TEST(test_auth_requirepass)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };

	redis_with_password(&red, "pass");
	ops_start(&d, red.port,
	    &(struct ops_conf){
		.url = "redis://:pass@127.0.0.1:%REDIS_PORT%/0" });
	assert_redis_decides(&red, "rp");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* A password with URL delimiters in it, percent-encoded, and a database
 * other than 0. */
START_TEST(test_auth_encoded_password_and_db)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };

	redis_with_password(&red, "p@ss:w/rd");
	ops_start(&d, red.port,
	    &(struct ops_conf){
		.url = "redis://:p%40ss%3Aw%2Frd@127.0.0.1:%REDIS_PORT%/3" });
	assert_redis_decides_in(&red, 3, "enc");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

START_TEST(test_auth_acl_user)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };

	redis_with_password(&red, "other");
	ops_redis_ok(&red, "ACL SETUSER rl on >pw ~* +@all");
	ops_start(&d, red.port,
	    &(struct ops_conf){
		.url = "redis://rl:pw@127.0.0.1:%REDIS_PORT%/0" });
	assert_redis_decides(&red, "acl");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

START_TEST(test_auth_password_file)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char pw[H_PATH_MAX], extra[2 * H_PATH_MAX];

	redis_with_password(&red, "filepass");
	ops_tmp_name(pw, sizeof(pw), "redis-password");
	ops_write_file(pw, "filepass\n");
	snprintf(extra, sizeof(extra), "  password_file: \"%s\"\n", pw);
	ops_start(&d, red.port, &(struct ops_conf){ .redis_extra = extra });
	assert_redis_decides(&red, "pf");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* RATELIMITD_REDIS_URL wins over the file's redis.url. */
START_TEST(test_auth_env_url)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char pre[256];

	redis_with_password(&red, "envpass");
	snprintf(pre, sizeof(pre),
	    "RATELIMITD_REDIS_URL="
	    "'redis://:envpass@127.0.0.1:%d/0'\nexport RATELIMITD_REDIS_URL",
	    red.port);
	ops_wrap_daemon(pre);
	ops_start(&d, ops_closed_port(), &(struct ops_conf){ 0 });
	assert_redis_decides(&red, "env");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* A wrong password: not ready, decisions degraded, counted as errors. */
START_TEST(test_auth_wrong_password)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long ms;
	int i;

	redis_with_password(&red, "right");
	ops_start(&d, red.port,
	    &(struct ops_conf){
		.url = "redis://:wrong@127.0.0.1:%REDIS_PORT%/0" });
	ck_assert_int_eq(ops_get("/readyz", NULL), 503);
	for (i = 0; i < 3; i++) {
		ops_acquire_timed(&r, "wp", &ms);
		ck_assert_msg(r.status == 200 && ops_is_degraded(&r),
		    "status "
		    "%ld: %s",
		    r.status, r.body);
		ck_assert_msg(ms < TIMEOUT_MS + MARGIN_MS, "took %lld ms", ms);
		h_resp_free(&r);
	}
	ck_assert_int_eq(h_redis_int(&red, "DBSIZE"), 0);
	ck_assert_int_ge(ops_metric("ratelimitd_backend_errors_total"
				    "{backend=\"redis\",kind=\"connect\"}"),
	    1);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* --- the runner ------------------------------------------------------- */

static TCase *
tcase(Suite *s, const char *name)
{
	TCase *tc = tcase_create(name);

	tcase_add_unchecked_fixture(tc, NULL, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return tc;
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("ops");
	TCase *tc;

	ops_init();

	tc = tcase(s, "backend_failure");
	tcase_add_test(tc, test_policy_allow_refused);
	tcase_add_test(tc, test_policy_deny_refused);
	tcase_add_test(tc, test_policy_local_refused);
	tcase_add_test(tc, test_policy_silent_redis);
	tcase_add_test(tc, test_policy_silent_redis_deny);
	tcase_add_test(tc, test_policy_silent_redis_small_pool);
	tcase_add_test(tc, test_redis_by_host_name);
	tcase_add_loop_test(tc, test_dns_unanswered, 0, 3);
	tcase_add_test(tc, test_dns_lookup_outlives_connection);
	tcase_add_test(tc, test_redis_paused_under_load);
	tcase_add_test(tc, test_slow_redis_keeps_calls);
	tcase_add_test(tc, test_redis_keepalive);
	tcase_add_test(tc, test_no_head_of_line_blocking);
	tcase_add_test(tc, test_redis_killed_under_load);

	tc = tcase(s, "reload");
	tcase_add_test(tc, test_reload_sighup);
	tcase_add_test(tc, test_reload_to_local);
	tcase_add_test(tc, test_reload_redis_timeout_start_only);
	tcase_add_test(tc, test_reload_deny_in_flight);
	tcase_add_test(tc, test_reload_header_limit_start_only);
	tcase_add_test(tc, test_reload_key_prefix_start_only);
	tcase_add_test(tc, test_reload_rename);
	tcase_add_test(tc, test_reload_same_text);
	tcase_add_test(tc, test_reload_configmap);
	tcase_add_test(tc, test_reload_symlink_other_dir);
	tcase_add_test(tc, test_reload_symlink_chain);
	tcase_add_test(tc, test_reload_bad_file);

	tc = tcase(s, "metrics");
	tcase_add_test(tc, test_metrics);

	tc = tcase(s, "shutdown");
	tcase_add_loop_test(tc, test_sigterm_under_load, 0, 4);
	tcase_add_test(tc, test_sigterm_finishes_in_flight);
	tcase_add_test(tc, test_sigterm_bounded_by_shutdown_timeout);
	tcase_add_loop_test(tc, test_second_sigterm_cuts_drain, 0, 2);

	tc = tcase(s, "logs");
	tcase_add_test(tc, test_log_json);
	tcase_add_test(tc, test_log_level_warn);
	tcase_add_test(tc, test_access_log);
	tcase_add_test(tc, test_sigusr_ignored);
	tcase_add_test(tc, test_log_hides_password);

	tc = tcase(s, "redis_auth");
	tcase_add_test(tc, test_auth_requirepass);
	tcase_add_test(tc, test_auth_encoded_password_and_db);
	tcase_add_test(tc, test_auth_acl_user);
	tcase_add_test(tc, test_auth_password_file);
	tcase_add_test(tc, test_auth_env_url);
	tcase_add_test(tc, test_auth_wrong_password);
	return s;
}
