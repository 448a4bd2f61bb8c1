/*
 * check_concurrency.c - exact admission under concurrency (docs/algorithms.md:
 * sliding_log is exact; evaluation is atomic; time is the backend's).
 *
 * 16 client threads, each with its own keep-alive curl handle, send 2,000
 * requests for one key as fast as they can.  With Redis the requests
 * alternate between TWO daemons sharing one Redis, the set-up where
 * docs/scale.md has any number of daemons share one set of limits and
 * docs/algorithms.md has sliding_log exact; with the memory store there
 * is one daemon.  The window is an hour, so nothing expires meanwhile and
 * the right answer is exact: precisely `limit` answers are 200, all others
 * 429, nothing else.  Stronger still, every admission must have seen a
 * different count: the `remaining` values of the 200s are exactly
 * 0 .. limit-1, once each (a lost update or a double admission shows up as
 * a repeated value even when the totals happen to add up).  With two rules
 * on the request (limits 200 and 150) the narrower one decides, and the
 * wider one must have recorded only the 150 admitted requests: denied
 * requests record nothing, even when they race.
 *
 * The Redis timeout is 1 s rather than the usual 200 ms: this test is
 * about exactness, not latency, and on_backend_error: deny turns any
 * backend trouble into a visible 503 instead of a silent allow.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "harness.h"

#define THREADS	   16
#define TOTAL	   2000
#define PER_THREAD (TOTAL / THREADS)
#define MAX_LIMIT  200

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
    "  timeout: 1s\n"
    "  pool_size: 8\n"
    "  key_prefix: \"cc:\"\n"
    "on_backend_error: deny\n";

static const char rules_yaml[] =
    "rules:\n"
    "  - name: burst\n"
    "    match:\n"
    "      t: burst\n"
    "    key: \"${user}\"\n"
    "    limit: 200\n"
    "    window: 1h\n"
    "  - name: pair-wide\n"
    "    match:\n"
    "      t: pair\n"
    "    key: \"${user}\"\n"
    "    limit: 200\n"
    "    window: 1h\n"
    "  - name: pair-narrow\n"
    "    match:\n"
    "      t: pair\n"
    "    key: \"${user}\"\n"
    "    limit: 150\n"
    "    window: 1h\n";

/* One scenario: what is sent, and what must come back. */
struct scenario {
	const char *body;
	const char *rule;    /* the deciding rule of every answer */
	int limit;	     /* that rule's limit: exactly this many 200s */
	const char *keys[2]; /* redis keys that must hold `limit` units */
};

static const struct scenario one_rule = {
	"{\"t\":\"burst\",\"user\":\"hot\"}",
	"burst",
	200,
	{ "cc:burst:{hot}", NULL },
};

static const struct scenario two_rules = {
	"{\"t\":\"pair\",\"user\":\"hot\"}",
	"pair-narrow",
	150,
	{ "cc:pair-wide:{hot}", "cc:pair-narrow:{hot}" },
};

struct worker {
	pthread_t thread;
	int id;
	const int *ports;
	int nports;
	const struct scenario *sc;
	pthread_barrier_t *go;
	/* results */
	int ok, denied, other;
	int remaining[PER_THREAD]; /* of each 200, in order */
	char problem[256];	   /* the first unexpected answer */
};

static void *
work(void *arg)
{
	struct worker *w = arg;
	struct h_resp r = { 0 };
	CURL *c = curl_easy_init();
	size_t len = strlen(w->sc->body);
	int k;

	pthread_barrier_wait(w->go);
	if (c == NULL) {
		snprintf(w->problem, sizeof(w->problem),
		    "curl_easy_init "
		    "failed");
		w->other = PER_THREAD;
		return NULL;
	}
	for (k = 0; k < PER_THREAD; k++) {
		int port = w->ports[(w->id + k) % w->nports];
		const char *rule;
		json_t *rem;

		if (h_request(c, port, &r, "POST", "/acquire", w->sc->body, len,
			NULL) != 0) {
			if (w->other++ == 0)
				snprintf(w->problem, sizeof(w->problem),
				    "request failed: %.200s", r.err);
			continue;
		}
		rule = h_json_str(&r, "rule");
		rem = h_json_get(&r, "remaining");
		if ((r.status != 200 && r.status != 429) || rule == NULL ||
		    strcmp(rule, w->sc->rule) != 0 || !json_is_integer(rem)) {
			if (w->other++ == 0)
				snprintf(w->problem, sizeof(w->problem),
				    "status %ld, body %.200s", r.status,
				    r.body);
			continue;
		}
		if (r.status == 200)
			w->remaining[w->ok++] = (int)json_integer_value(rem);
		else
			w->denied++;
	}
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return NULL;
}

/* Fire TOTAL requests from THREADS threads at the daemons and check the
 * answers (see the top of the file). */
static void
hammer(struct h_daemon *d, int nd, const struct scenario *sc)
{
	static struct worker w[THREADS];
	pthread_barrier_t go;
	int ports[2], seen[MAX_LIMIT + 1];
	int ok = 0, denied = 0, other = 0, i, k;
	const char *problem = NULL;

	for (i = 0; i < nd; i++)
		ports[i] = d[i].port;
	ck_assert(pthread_barrier_init(&go, NULL, THREADS) == 0);
	memset(w, 0, sizeof(w));
	for (i = 0; i < THREADS; i++) {
		w[i].id = i;
		w[i].ports = ports;
		w[i].nports = nd;
		w[i].sc = sc;
		w[i].go = &go;
		ck_assert(pthread_create(&w[i].thread, NULL, work, &w[i]) == 0);
	}
	memset(seen, 0, sizeof(seen));
	for (i = 0; i < THREADS; i++) {
		pthread_join(w[i].thread, NULL);
		ok += w[i].ok;
		denied += w[i].denied;
		other += w[i].other;
		if (problem == NULL && w[i].problem[0] != '\0')
			problem = w[i].problem;
		for (k = 0; k < w[i].ok; k++) {
			int rem = w[i].remaining[k];

			seen[rem >= 0 && rem < sc->limit ? rem : MAX_LIMIT]++;
		}
	}
	pthread_barrier_destroy(&go);

	ck_assert_msg(other == 0,
	    "%d of %d answers were neither a 200 nor a"
	    " 429 decided by %s; first: %s",
	    other, TOTAL, sc->rule, problem ? problem : "?");
	ck_assert_msg(ok == sc->limit && denied == TOTAL - sc->limit,
	    "%d daemon(s), limit %d: %d allowed and %d denied, expected %d "
	    "and %d",
	    nd, sc->limit, ok, denied, sc->limit, TOTAL - sc->limit);
	ck_assert_msg(seen[MAX_LIMIT] == 0,
	    "%d allowed answers had a "
	    "remaining outside [0, %d)",
	    seen[MAX_LIMIT], sc->limit);
	for (k = 0; k < sc->limit; k++)
		ck_assert_msg(seen[k] == 1,
		    "remaining=%d was answered %d "
		    "times to allowed requests, expected once (a lost or "
		    "double count)",
		    k, seen[k]);
}

static void
check_keys(const struct scenario *sc)
{
	size_t i;

	for (i = 0; i < 2 && sc->keys[i] != NULL; i++) {
		long long card = h_redis_log_units(&h_shared_redis,
		    sc->keys[i]);

		ck_assert_msg(card == sc->limit,
		    "%s holds %lld units, expected "
		    "%d: %s",
		    sc->keys[i], card, sc->limit,
		    card > sc->limit ? "denied requests were recorded" :
				       "admitted requests were not recorded");
	}
}

static void
start(struct h_daemon *d, bool with_redis)
{
	char yaml[4096];

	snprintf(yaml, sizeof(yaml), "%s%s",
	    with_redis ? redis_head : memory_head, rules_yaml);
	h_daemon_start(d, yaml);
}

static void
run_redis(const struct scenario *sc)
{
	struct h_daemon d[2];

	memset(d, 0, sizeof(d));
	start(&d[0], true);
	start(&d[1], true);
	hammer(d, 2, sc);
	check_keys(sc);
	h_daemon_stop(&d[0]);
	h_daemon_stop(&d[1]);
}

static void
run_memory(const struct scenario *sc)
{
	struct h_daemon d = { 0 };

	start(&d, false);
	hammer(&d, 1, sc);
	h_daemon_stop(&d);
}

START_TEST(test_redis_two_daemons_one_rule)
{
	run_redis(&one_rule);
}
END_TEST

START_TEST(test_redis_two_daemons_two_rules)
{
	run_redis(&two_rules);
}
END_TEST

START_TEST(test_memory_one_rule)
{
	run_memory(&one_rule);
}
END_TEST

START_TEST(test_memory_two_rules)
{
	run_memory(&two_rules);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("concurrency");
	TCase *red = h_shared_redis_tcase("redis");
	TCase *mem = tcase_create("memory");

	tcase_add_test(red, test_redis_two_daemons_one_rule);
	tcase_add_test(red, test_redis_two_daemons_two_rules);
	tcase_add_unchecked_fixture(mem, NULL, h_reap_orphans);
	tcase_add_checked_fixture(mem, NULL, h_test_teardown);
	tcase_set_timeout(mem, 60);
	tcase_add_test(mem, test_memory_one_rule);
	tcase_add_test(mem, test_memory_two_rules);
	suite_add_tcase(s, red);
	suite_add_tcase(s, mem);
	test_main_at_end(h_shared_redis_stop);
	return s;
}
