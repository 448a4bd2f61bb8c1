/*
 * check_prefetch.c - quota taken in advance on a hot key
 * (docs/algorithms.md, "Taking quota in advance"): three daemons on one
 * Redis (and on a Redis Cluster) share one key whose rule has prefetch.
 *
 * - Never over the limit: every admission's time is read from the
 *   daemons' access logs (the daemon's clock, in milliseconds, written
 *   just after the decision; a store's admission a little earlier), and
 *   sliding_log must hold at most L in every interval of W - LAG,
 *   fixed_window at most L in each window after its first LAG (the
 *   admissions logged there were all made in that window), token_bucket
 *   at most L + (t + LAG) * L / W + 1 in every interval of length t.
 * - Bounded under-admission: with demand far above the limit, at least
 *   90 % of the limit per window is admitted (hold = W / 50); 70 % under
 *   AddressSanitizer (below).  Units held and not used within the hold
 *   are lost by design, so the share depends on how soon the daemons,
 *   their load and Redis get the CPU: a run that falls short is run
 *   again, up to three in all (a daemon that loses units falls short
 *   every time).
 * - Few store calls: with the limit far away, Redis runs at most one
 *   script call per ten admitted requests (INFO commandstats).
 * - A reload: a chunk taken under the old rules that comes back after it
 *   answers nothing under the new ones.
 * - A request with a rule that does not prefetch loses at most one
 *   chunk's spare units per hold, not a chunk per call.
 * - Sequential requests on one key never see remaining rise; units whose
 *   hold ended count as lost by the next GET /metrics.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "harness.h"

#define W_MS	    1000 /* every rule's window */
#define LAG_MS	    30	 /* an admission's log line comes at most this late */
#define RUN_MS	    3500 /* load per run */
#define THREADS	    3	 /* load threads per daemon */
#define NDAEMONS    3
#define MAX_ADMITS  2000000
#define HOT_LIMIT   400 /* per second: far below what the load asks */
#define HOT_UNITS   40
#define HOT_HOLD_MS (W_MS / 50)
/* The least share of the limit admitted per window.  What a daemon holds
 * and does not use within the hold is lost to the window; under
 * AddressSanitizer, three daemons, their load and Redis are slow enough on
 * two cores that a daemon stalls past the 20 ms hold now and then: its
 * runs there admitted 77-100 % (fixed_window on Cluster the least, the
 * code before the last change to prefetch alike; the plain and UBSan
 * builds 98-100 %).  ThreadSanitizer slows them more: 53-69 % (a daemon
 * that loses units it should not, as prefetch once did, kept 24 %). */
#if defined(__SANITIZE_ADDRESS__)
#define SHARE_MIN 0.7
#elif defined(__SANITIZE_THREAD__)
#define SHARE_MIN 0.4
#else
#define SHARE_MIN 0.9
#endif

static struct h_cluster cluster;
static bool on_cluster;

static const char yaml_fmt[] =
    "listen: \"127.0.0.1:%%PORT%%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "access_log: true\n"
    "log_level: info\n"
    "backend: redis\n"
    "redis:\n"
    "%s"
    "  timeout: 2s\n"
    "  pool_size: 2\n"
    "  key_prefix: \"pf%lld:\"\n"
    "on_backend_error: deny\n"
    "rules:\n"
    "  - name: hot\n"
    "    key: \"global\"\n"
    "    algorithm: %s\n"
    "    limit: %d\n"
    "    window: %dms\n"
    "    prefetch: { max_units: %d, hold: %dms }\n";

struct run {
	struct h_load_stats load; /* summed over the daemons */
	long long *ts;		  /* admissions, ms since the epoch, sorted */
	size_t n;
	long long calls; /* script calls Redis ran meanwhile */
};

static long long
script_calls(void)
{
	long long n = 0;
	int i;

	if (!on_cluster)
		return h_redis_script_calls(&h_shared_redis);
	for (i = 0; i < H_CLUSTER_NODES; i++)
		if (cluster.node[i].pid != 0)
			n += h_redis_script_calls(&cluster.node[i]);
	return n;
}

/* "ts=2026-11-26T15:40:41.123Z" -> ms since the epoch, or -1. */
static long long
parse_ts(const char *line)
{
	struct tm tm;
	int ms;

	memset(&tm, 0, sizeof(tm));
	if (sscanf(line, "ts=%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon,
		&tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
		return -1;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	return (long long)timegm(&tm) * 1000 + ms;
}

static int
cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;

	return x < y ? -1 : x > y;
}

/* Every allowed="true" decision of the log at path into r->ts. */
static void
read_admissions(const char *path, struct run *r)
{
	char line[1024];
	FILE *f = fopen(path, "r");
	long long t;

	ck_assert_msg(f != NULL, "%s", path);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strstr(line, "msg=\"decision\"") == NULL ||
		    strstr(line, " allowed=\"true\"") == NULL)
			continue;
		ck_assert((t = parse_ts(line)) > 0);
		ck_assert(r->n < MAX_ADMITS);
		r->ts[r->n++] = t;
	}
	fclose(f);
}

/* Three daemons on the hot key for RUN_MS under load far above the
 * limit; their admissions and the script calls Redis ran. */
static void
run_three(const char *alg, int limit, int units, int hold_ms, struct run *r)
{
	struct h_daemon d[NDAEMONS];
	struct h_load *load[NDAEMONS];
	struct h_load_stats st;
	char yaml[2048], where[128];
	long long calls0;
	int i;

	if (on_cluster)
		snprintf(where, sizeof(where),
		    "  cluster: [\"127.0.0.1:%d\"]\n", cluster.node[0].port);
	else
		snprintf(where, sizeof(where),
		    "  url: \"redis://127.0.0.1:%%REDIS_PORT%%/0\"\n");
	/* a key of its own per run: a cluster is not flushed */
	snprintf(yaml, sizeof(yaml), yaml_fmt, where, h_now_ms(), alg, limit,
	    W_MS, units, hold_ms);
	memset(r, 0, sizeof(*r));
	r->ts = calloc(MAX_ADMITS, sizeof(*r->ts));
	ck_assert_ptr_nonnull(r->ts);
	for (i = 0; i < NDAEMONS; i++) {
		memset(&d[i], 0, sizeof(d[i]));
		d[i].redis_port = on_cluster ? 0 : h_shared_redis.port;
		h_daemon_start(&d[i], yaml);
	}
	calls0 = script_calls();
	for (i = 0; i < NDAEMONS; i++)
		load[i] = h_load_start(d[i].port, THREADS, "{\"u\":%d}");
	h_sleep_ms(RUN_MS);
	for (i = 0; i < NDAEMONS; i++) {
		h_load_stop(load[i], &st);
		r->load.requests += st.requests;
		r->load.ok += st.ok;
		r->load.denied += st.denied;
		r->load.other += st.other + st.unavailable;
		if (st.slowest_ms > r->load.slowest_ms)
			r->load.slowest_ms = st.slowest_ms;
	}
	r->calls = script_calls() - calls0;
	for (i = 0; i < NDAEMONS; i++) {
		h_daemon_stop(&d[i]);
		read_admissions(d[i].log, r);
	}
	qsort(r->ts, r->n, sizeof(*r->ts), cmp_ll);
	printf(
	    "prefetch %s%s L=%d max_units=%d hold=%dms: %lld requests, "
	    "%lld admitted, %lld denied, %lld script calls, slowest request "
	    "%lld ms\n",
	    alg, on_cluster ? " (cluster)" : "", limit, units, hold_ms,
	    r->load.requests, r->load.ok, r->load.denied, r->calls,
	    r->load.slowest_ms);
	fflush(stdout); /* a failed assertion exits without flushing */
	ck_assert_int_eq(r->load.other, 0);
	ck_assert_int_eq((long long)r->n, r->load.ok);
}

/* The most admissions in any interval [x, x + len) of log time. */
static long long
most_in(const struct run *r, long long len)
{
	size_t i, j = 0;
	long long best = 0;

	for (i = 0; i < r->n; i++) {
		while (j < r->n && r->ts[j] < r->ts[i] + len)
			j++;
		if ((long long)(j - i) > best)
			best = (long long)(j - i);
	}
	return best;
}

/* Whether the steady part of the run admitted at least SHARE_MIN of the
 * limit per window: from a window after the first admission to LAG before
 * the last; for fixed_window (aligned), the whole windows in that part.
 * The figures go to what (len bytes). */
static bool
share_is_met(const struct run *r, int limit, bool aligned, char *what,
    size_t len)
{
	long long from, to, n = 0;
	size_t i;
	double want;

	ck_assert_msg(r->load.denied > 2 * r->load.ok,
	    "the load did not ask far above the limit: %lld admitted, %lld "
	    "denied",
	    r->load.ok, r->load.denied);
	ck_assert(r->n > 0);
	from = r->ts[0] + W_MS;
	to = r->ts[r->n - 1] - LAG_MS;
	if (aligned) {
		/* the whole windows after the first admission's, before the
		 * last admission's */
		from = (r->ts[0] + W_MS - 1) / W_MS * W_MS;
		to = r->ts[r->n - 1] / W_MS * W_MS;
		ck_assert(to > from);
	}
	for (i = 0; i < r->n; i++)
		if (r->ts[i] >= from && r->ts[i] < to)
			n++;
	want = SHARE_MIN * limit * ((double)(to - from) / W_MS);
	snprintf(what, len,
	    "%lld admitted in %lld ms, %.0f%% of the limit, want >= %.0f "
	    "(slowest request %lld ms)",
	    n, to - from, 100.0 * n / (limit * (double)(to - from) / W_MS),
	    want, r->load.slowest_ms);
	printf("  steady: %s\n", what);
	fflush(stdout); /* a failed assertion exits without flushing */
	return n >= want;
}

/* Never over the limit: sliding_log holds at most L in any W - LAG. */
static void
sliding_log_bound(const struct run *r)
{
	long long most = most_in(r, W_MS - LAG_MS);

	printf("  most in %d ms: %lld\n", W_MS - LAG_MS, most);
	ck_assert_msg(most <= HOT_LIMIT, "%lld admitted within %d ms", most,
	    W_MS - LAG_MS);
}

/* Never over the limit: fixed_window holds at most L in each window after
 * its first LAG. */
static void
fixed_window_bound(const struct run *r)
{
	long long most = 0, k, n;
	size_t i = 0, j;

	while (i < r->n) {
		k = r->ts[i] / W_MS;
		for (j = i, n = 0; j < r->n && r->ts[j] / W_MS == k; j++)
			if (r->ts[j] - k * W_MS >= LAG_MS)
				n++;
		if (n > most)
			most = n;
		i = j;
	}
	printf("  most in one window (after its first %d ms): %lld\n", LAG_MS,
	    most);
	ck_assert_msg(most <= HOT_LIMIT, "%lld admitted in one window", most);
}

/* Never over the rate: token_bucket (GCRA) with LAG of slack. */
static void
token_bucket_bound(const struct run *r)
{
	double g, gmin = 0, worst = -1e18, bound;
	size_t j;

	/* GCRA: for i <= j, (j - i + 1) <= L + (t_j - t_i + LAG) * L / W +
	 * 1, i.e. g(j) - min over i <= j of g(i) + 1 <= L + LAG * L / W + 1
	 * with g(k) = k - t_k * L / W. */
	for (j = 0; j < r->n; j++) {
		g = (double)j -
		    (double)(r->ts[j] - r->ts[0]) * HOT_LIMIT / W_MS;
		if (j == 0 || g < gmin)
			gmin = g;
		if (g - gmin + 1 > worst)
			worst = g - gmin + 1;
	}
	bound = HOT_LIMIT + (double)LAG_MS * HOT_LIMIT / W_MS + 1;
	printf("  GCRA: at most %.1f beyond the rate, bound %.1f\n", worst,
	    bound);
	ck_assert_msg(worst <= bound, "%.1f units over the rate, bound %.1f",
	    worst, bound);
}

/*
 * The hot key under alg: every run must stay within bound (never run
 * again for that), and admit at least SHARE_MIN of the limit.  Units held
 * and not used within the hold are lost (docs/algorithms.md), and the
 * hold counts from when the chunk's call left, so how much is lost
 * depends on how soon three daemons, their load and Redis get two cores,
 * which the test does not control: a run that falls short is run again,
 * up to three in all.  A daemon that loses units it should not falls
 * short on every run.
 */
static void
check_hot(const char *alg, void (*bound)(const struct run *), bool aligned)
{
	struct run r;
	char what[256];
	bool met;
	int go;

	for (go = 1;; go++) {
		run_three(alg, HOT_LIMIT, HOT_UNITS, HOT_HOLD_MS, &r);
		bound(&r);
		met = share_is_met(&r, HOT_LIMIT, aligned, what, sizeof(what));
		free(r.ts);
		if (met)
			return;
		ck_assert_msg(go < 3,
		    "below %.0f%% of the limit in %d runs: %s", 100 * SHARE_MIN,
		    go, what);
		printf("  short: run again\n");
	}
}

static void
check_sliding_log(void)
{
	check_hot("sliding_log", sliding_log_bound, false);
}

static void
check_fixed_window(void)
{
	check_hot("fixed_window", fixed_window_bound, true);
}

static void
check_token_bucket(void)
{
	check_hot("token_bucket", token_bucket_bound, false);
}

/* With the limit far away, chunks of max_units: at most one script call
 * per ten admitted requests. */
static void
check_few_calls(void)
{
	struct run r;

	run_three("sliding_log", 1000000, 100, 200, &r);
	ck_assert_int_eq(r.load.denied, 0);
	ck_assert_msg(r.calls * 10 <= r.load.ok,
	    "%lld script calls for %lld admitted", r.calls, r.load.ok);
	free(r.ts);
}

START_TEST(test_sliding_log)
{
	check_sliding_log();
}
END_TEST

START_TEST(test_fixed_window)
{
	check_fixed_window();
}
END_TEST

START_TEST(test_token_bucket)
{
	check_token_bucket();
}
END_TEST

START_TEST(test_few_calls)
{
	check_few_calls();
}
END_TEST

/*
 * A chunk in flight across a reload: fixed_window, limit 1000 a window,
 * prefetch up to 1000.  Redis is paused while one request's call (a chunk
 * of 1 + min(999, 999 / 8) = 125) is out; the limit is reloaded to 10
 * meanwhile.  When Redis answers, the chunk's 124 spare units must not be
 * held: the key has used 125 of its new 10, so every later request is
 * denied by the store.  (They were held, and answered 124 requests under
 * the new limit.)
 */
static const char reload_fmt[] =
    "listen: \"127.0.0.1:%s\"\n"
    "threads: 2\n"
    "backend: redis\n"
    "redis:\n"
    "  url: \"redis://127.0.0.1:%d/0\"\n"
    "  timeout: 5s\n"
    "on_backend_error: deny\n"
    "rules:\n"
    "  - name: hot\n"
    "    key: \"global\"\n"
    "    algorithm: fixed_window\n"
    "    limit: %d\n"
    "    window: 366d\n" /* no window starts during the test */
    "    prefetch: { max_units: 1000, hold: 30s }\n";

static void *
acquire_one(void *arg)
{
	struct h_resp r = { 0 };

	h_post(*(int *)arg, "/acquire", "{}", &r);
	*(int *)arg = (int)r.status;
	h_resp_free(&r);
	return NULL;
}

START_TEST(test_reload_drops_chunk_in_flight)
{
	struct h_daemon d = { 0 };
	char yaml[1024], listen[16];
	redisReply *rep;
	pthread_t th;
	int i, port, status, admitted = 0;
	FILE *f;

	d.redis_port = h_shared_redis.port;
	snprintf(yaml, sizeof(yaml), reload_fmt, "%PORT%", h_shared_redis.port,
	    1000);
	h_daemon_start(&d, yaml);
	rep = redisCommand(h_redis_ctx(&h_shared_redis),
	    "CLIENT PAUSE 1500 ALL");
	ck_assert(rep != NULL && rep->type != REDIS_REPLY_ERROR);
	freeReplyObject(rep);
	port = d.port;
	ck_assert_int_eq(pthread_create(&th, NULL, acquire_one, &port), 0);
	h_sleep_ms(300);
	snprintf(listen, sizeof(listen), "%d", d.port);
	snprintf(yaml, sizeof(yaml), reload_fmt, listen, h_shared_redis.port,
	    10);
	ck_assert_ptr_nonnull(f = fopen(d.conf, "w"));
	fputs(yaml, f);
	fclose(f);
	ck_assert_int_eq(kill(d.pid, SIGHUP), 0);
	ck_assert_int_eq(
	    h_metric_settles(
		"ratelimitd_config_reloads_total{result=\"success\"}", 1),
	    1);
	pthread_join(th, NULL);
	ck_assert_int_eq(port, 200);
	for (i = 0; i < 30; i++) {
		struct h_resp r = { 0 };

		h_post(d.port, "/acquire", "{}", &r);
		status = (int)r.status;
		h_resp_free(&r);
		ck_assert(status == 200 || status == 429);
		admitted += status == 200;
	}
	ck_assert_int_eq(admitted, 0);
	h_daemon_stop(&d);
}
END_TEST

/*
 * A request whose rules do not all prefetch (docs/algorithms.md, "Taking
 * quota in advance"): peruser (fixed_window, 100 per minute, prefetch 50
 * for 10 s) beside global (no prefetch).  Such a request never uses the
 * units held, so its peruser check asks for a chunk only while fewer
 * than its cost are held; 100 requests one after the other lose at most
 * one chunk's spare units, fewer than max_units.  (A chunk on every call,
 * each left to expire, admitted 24 of the 100.)
 */
static const char mixed_yaml[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "backend: redis\n"
    "redis:\n"
    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
    "  timeout: 2s\n"
    "on_backend_error: deny\n"
    "rules:\n"
    "  - name: peruser\n"
    "    key: \"${user}\"\n"
    "    algorithm: fixed_window\n"
    "    limit: 100\n"
    "    window: 1m\n"
    "    prefetch: { max_units: 50, hold: 10s }\n"
    "  - name: global\n"
    "    key: \"all\"\n"
    "    algorithm: fixed_window\n"
    "    limit: 1000000\n"
    "    window: 1m\n";

START_TEST(test_mixed_request_keeps_quota)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	int i, admitted = 0;

	d.redis_port = h_shared_redis.port;
	h_daemon_start(&d, mixed_yaml);
	for (i = 0; i < 100; i++) {
		h_post(d.port, "/acquire", "{\"user\":\"u1\"}", &r);
		ck_assert_msg(r.status == 200 || r.status == 429, "%ld %s",
		    r.status, r.body);
		admitted += r.status == 200;
		h_resp_free(&r);
	}
	printf("mixed request: %d of 100 admitted\n", admitted);
	ck_assert_msg(admitted > 100 - 50, "%d of 100 admitted", admitted);
	h_daemon_stop(&d);
}
END_TEST

/* The head of a config for start_on(): the backend's name, then the
 * shared Redis's port, fill it; the rules follow. */
#define BOTH_STORES_HEAD \
	"listen: \"127.0.0.1:%%PORT%%\"\n" \
	"threads: 2\n" \
	"backend: %s\n" \
	"redis:\n" \
	"  url: \"redis://127.0.0.1:%d/0\"\n" \
	"  timeout: 2s\n" \
	"on_backend_error: deny\n" \
	"rules:\n"

/*
 * A report that takes a key past its limit (docs/algorithms.md, "Usage
 * reported after the fact") denies what comes next until its usage
 * drains, units held in advance included: the daemon drops what it holds
 * of the key.  On Redis and on the memory store.
 */
static const char report_fmt[] = BOTH_STORES_HEAD
    "  - name: p\n"
    "    key: \"${user}\"\n"
    "    limit: 1000\n"
    "    window: 10s\n"
    "    prefetch: { max_units: 100, hold: 5s }\n";

/* Start d on backend (redis or memory) with yaml made of fmt, which
 * takes the backend's name and the shared Redis's port. */
static void
start_on(struct h_daemon *d, const char *fmt, const char *backend)
{
	char yaml[1024];

	memset(d, 0, sizeof(*d));
	d->redis_port = h_shared_redis.port;
	snprintf(yaml, sizeof(yaml), fmt, backend, h_shared_redis.port);
	h_daemon_start(d, yaml);
}

/* n requests for user u1, one after the other, each answered status. */
static void
acquire_n(const struct h_daemon *d, int n, long status, const char *backend)
{
	struct h_resp r = { 0 };
	int i;

	for (i = 0; i < n; i++) {
		h_post(d->port, "/acquire", "{\"user\":\"u1\"}", &r);
		ck_assert_msg(r.status == status, "%s: request %d: %ld %s",
		    backend, i, r.status, r.body);
		h_resp_free(&r);
	}
}

START_TEST(test_report_over_drops_held)
{
	static const char *const backends[] = { "redis", "memory" };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	size_t b;

	for (b = 0; b < 2; b++) {
		start_on(&d, report_fmt, backends[b]);
		/* The first takes a chunk; the next are answered from it. */
		acquire_n(&d, 3, 200, backends[b]);
		h_post(d.port, "/report", "{\"user\":\"u1\",\"cost\":5000}",
		    &r);
		ck_assert_msg(r.status == 200 &&
			strstr(r.body, "\"recorded\":true") != NULL,
		    "%s: %ld %s", backends[b], r.status, r.body);
		/* The answer names overdrawn only when it is above 0. */
		ck_assert_msg(strstr(r.body, "\"overdrawn\":") != NULL,
		    "%s: not overdrawn: %s", backends[b], r.body);
		h_resp_free(&r);
		acquire_n(&d, 3, 429, backends[b]);
		h_daemon_stop(&d);
	}
}
END_TEST

/*
 * Sequential requests on one key never see remaining rise
 * (docs/algorithms.md, "Taking quota in advance"): limit 50 in a window
 * nothing expires from, prefetch up to 20, one daemon.  The request that
 * takes a chunk answers the store's remaining plus the units the daemon
 * then holds, as the requests answered from them do; a plain check of a
 * mixed request (a rule without prefetch beside) answers the store's
 * remaining plus the units held too.  Every algorithm that takes chunks,
 * a shadow rule of each, pure and mixed requests interleaved, on Redis
 * and on the memory store; the body's remaining and the RateLimit
 * header's r alike.  (The chunk's request answered without the units held:
 * 43, then 48 from them.)
 */
static const char steady_fmt[] = BOTH_STORES_HEAD
    "  - name: other\n"
    "    key: \"${region}\"\n"
    "    limit: 1000000\n"
    "    window: 366d\n";

static const char steady_rule_fmt[] =
    "  - name: %s%s\n"
    "    key: \"${%s%s}\"\n"
    "    algorithm: %s\n"
    "    limit: 50\n"
    "    window: 366d\n" /* nothing expires or refills during the test */
    "    shadow: %s\n"
    "    prefetch: { max_units: 20, hold: 30s }\n";

/* The r of a RateLimit header "\"name\";r=N;t=T", or -1. */
static long long
header_r(const struct h_resp *r)
{
	const char *v = h_resp_header(r, "RateLimit"), *p;

	if (v == NULL || (p = strstr(v, ";r=")) == NULL)
		return -1;
	return atoll(p + 3);
}

START_TEST(test_remaining_never_rises)
{
	static const char *const backends[] = { "redis", "memory" };
	static const char *const algs[] = { "sliding_log", "fixed_window",
		"token_bucket", "sliding_window" };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	char yaml[4096], body[128];
	size_t b, a, sh;
	int i, len;
	long long rem, hr, last;

	for (b = 0; b < 2; b++) {
		memset(&d, 0, sizeof(d));
		d.redis_port = h_shared_redis.port;
		len = snprintf(yaml, sizeof(yaml), steady_fmt, backends[b],
		    h_shared_redis.port);
		for (a = 0; a < 4; a++)
			for (sh = 0; sh < 2; sh++)
				len += snprintf(yaml + len, sizeof(yaml) - len,
				    steady_rule_fmt, algs[a], sh ? "_s" : "",
				    algs[a], sh ? "_s" : "", algs[a],
				    sh ? "true" : "false");
		ck_assert((size_t)len < sizeof(yaml));
		h_daemon_start(&d, yaml);
		for (a = 0; a < 4; a++)
			for (sh = 0; sh < 2; sh++) {
				printf("%s %s%s:", backends[b], algs[a],
				    sh ? " (shadow)" : "");
				last = 50;
				for (i = 0; i < 40; i++) {
					/* every third a mixed request */
					snprintf(body, sizeof(body),
					    "{\"%s%s\":\"u\"%s}", algs[a],
					    sh ? "_s" : "",
					    i % 3 == 2 ? ",\"region\":\"r\"" :
							 "");
					h_post(d.port, "/acquire", body, &r);
					ck_assert_msg(r.status == 200,
					    "%s %s: %ld %s", backends[b], body,
					    r.status, r.body);
					rem = h_json_int(&r, "remaining");
					hr = header_r(&r);
					printf(" %lld", rem);
					fflush(stdout);
					ck_assert_msg(hr == rem,
					    "%s %s: RateLimit r=%lld, "
					    "remaining %lld",
					    backends[b], body, hr, rem);
					ck_assert_msg(rem <= last,
					    "%s %s: request %d: remaining "
					    "%lld after %lld",
					    backends[b], body, i + 1, rem,
					    last);
					last = rem;
					h_resp_free(&r);
				}
				printf("\n");
			}
		h_daemon_stop(&d);
	}
}
END_TEST

/*
 * Units held whose hold ends count as lost by the next GET /metrics
 * (docs/operations.md), without another request on their key: one
 * request takes a chunk of 1 + 99, three more use 3, and once the
 * 1.5 s hold has passed the key is idle: taken = used + lost.  On Redis
 * and on the memory store.  (Lost stayed 0 until the key's next use.)
 */
static const char idle_fmt[] = BOTH_STORES_HEAD
    "  - name: idle\n"
    "    key: \"${user}\"\n"
    "    algorithm: sliding_log\n"
    "    limit: 1000\n"
    "    window: 1h\n"
    "    prefetch: { max_units: 100, hold: 1500ms }\n";

START_TEST(test_lost_counted_when_idle)
{
	static const char *const backends[] = { "redis", "memory" };
	struct h_daemon d = { 0 };
	long long taken, used, lost;
	size_t b;

	for (b = 0; b < 2; b++) {
		start_on(&d, idle_fmt, backends[b]);
		acquire_n(&d, 4, 200, backends[b]);
		taken = h_metric(
		    "ratelimitd_prefetch_units_total{rule=\"idle\","
		    "event=\"taken\"}");
		used = h_metric_settles(
		    "ratelimitd_prefetch_units_total{rule=\"idle\","
		    "event=\"used\"}",
		    3);
		ck_assert_msg(taken == 99 && used == 3,
		    "%s: taken %lld used %lld", backends[b], taken, used);
		h_sleep_ms(2000); /* the hold ends; no request meanwhile */
		lost = h_metric(
		    "ratelimitd_prefetch_units_total{rule=\"idle\","
		    "event=\"lost\"}");
		printf("%s: idle key: taken %lld, used %lld, lost %lld\n",
		    backends[b], taken, used, lost);
		ck_assert_msg(lost == taken - used,
		    "%s: taken %lld, used %lld, lost %lld", backends[b], taken,
		    used, lost);
		h_daemon_stop(&d);
	}
}
END_TEST

static void
redis_up(void)
{
	on_cluster = false;
	h_shared_redis_up();
}

static void
redis_flush(void)
{
	if (!on_cluster)
		h_shared_redis_flush();
}

static void
cluster_up(void)
{
	on_cluster = true;
	h_cluster_start(&cluster);
}

static void
cluster_down(void)
{
	h_reap_orphans();
}

static void
suite_done(void)
{
	h_shared_redis_stop();
	h_cluster_stop(&cluster);
}

static TCase *
prefetch_tcase(const char *name, void (*up)(void), void (*down)(void))
{
	TCase *tc = tcase_create(name);

	tcase_add_unchecked_fixture(tc, up, down);
	tcase_add_checked_fixture(tc, redis_flush, h_test_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_sliding_log);
	tcase_add_test(tc, test_fixed_window);
	tcase_add_test(tc, test_token_bucket);
	tcase_add_test(tc, test_few_calls);
	return tc;
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("prefetch");

	suite_add_tcase(s, prefetch_tcase("redis", redis_up, h_reap_orphans));
	{
		TCase *tc = h_shared_redis_tcase("reload");

		tcase_add_test(tc, test_reload_drops_chunk_in_flight);
		tcase_add_test(tc, test_mixed_request_keeps_quota);
		tcase_add_test(tc, test_report_over_drops_held);
		tcase_add_test(tc, test_remaining_never_rises);
		tcase_add_test(tc, test_lost_counted_when_idle);
		suite_add_tcase(s, tc);
	}
	suite_add_tcase(s, prefetch_tcase("cluster", cluster_up, cluster_down));
	test_main_at_end(suite_done);
	return s;
}
