/*
 * check_backend_memory.c - unit tests of the in-process store through the
 * backend.h interface: atomicity across rules, shadow rules, cost 0, many
 * threads on one key, expiry and reclaiming, max_keys, and allocation
 * failures.  The clock is injected: a static time the tests move by hand.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/backend.h"
#include "base/util.h"
#include "store/memory.h"

#define T0  INT64_C(1700000000000000)
#define MS  INT64_C(1000)
#define SEC INT64_C(1000000)

static int64_t fake_now = T0;

static struct rl_check
mkcheck(enum rl_algorithm alg, int64_t limit, int64_t window_ms, int64_t cost,
    bool shadow, const char *key)
{
	struct rl_check c;

	memset(&c, 0, sizeof(c));
	c.algorithm = alg;
	c.limit = limit;
	c.window_ms = window_ms;
	c.cost = cost;
	c.shadow = shadow;
	c.key = key;
	c.keylen = strlen(key);
	return c;
}

static struct backend *
new_backend(int64_t max_keys)
{
	struct backend *b;

	fake_now = T0;
	b = backend_memory_new(max_keys, test_clock, &fake_now);
	ck_assert_ptr_nonnull(b);
	ck_assert_str_eq(b->name, "memory");
	return b;
}

/* decide() that must succeed; returns all_allowed. */
static bool
decide_ok(struct backend *b, const struct rl_check *c, size_t n,
    struct rl_result *out)
{
	enum backend_error_kind kind = BACKEND_ERR_NONE;
	char err[256] = "";
	bool all = false;
	int rc;

	rc = backend_decide(b, c, n, out, &all, &kind, err, sizeof(err));
	ck_assert_msg(rc == 0, "decide: %s", err);
	ck_assert_int_eq(kind, BACKEND_ERR_NONE);
	return all;
}

/* Units used by a sliding_log key now, by asking with cost 0. */
static int64_t
used_of(struct backend *b, int64_t limit, const char *key)
{
	struct rl_check c = mkcheck(RL_ALG_SLIDING_LOG, limit, 1000, 0, false,
	    key);
	struct rl_result r;

	(void)decide_ok(b, &c, 1, &r);
	return limit - r.remaining;
}

START_TEST(test_basic)
{
	struct backend *b = new_backend(1000);
	struct rl_check c = mkcheck(RL_ALG_SLIDING_LOG, 2, 1000, 1, false,
	    "rl:login:{10.0.0.1}");
	struct rl_result r;

	ck_assert(backend_is_ready(b));
	ck_assert(decide_ok(b, &c, 1, &r));
	ck_assert(r.allowed);
	ck_assert_int_eq(r.remaining, 1);
	ck_assert_int_eq(r.reset_ms, 1000);
	ck_assert_int_eq(r.retry_after_ms, 0);
	fake_now += 400 * MS;
	ck_assert(decide_ok(b, &c, 1, &r));
	ck_assert_int_eq(r.remaining, 0);
	fake_now += 100 * MS;
	/* the first unit (T0) expires at T0 + 1 s: 500 ms from now */
	ck_assert(!decide_ok(b, &c, 1, &r));
	ck_assert(!r.allowed);
	ck_assert_int_eq(r.retry_after_ms, 500);
	ck_assert_int_eq(r.reset_ms, 900);
	ck_assert_uint_eq(backend_memory_key_count(b), 1);
	/* n = 0: nothing applies, allowed */
	ck_assert(decide_ok(b, NULL, 0, NULL));
	backend_free(b);
	backend_free(NULL);
}
END_TEST

/* One rule denies: the other, which allows, records nothing. */
START_TEST(test_all_or_nothing)
{
	struct backend *b = new_backend(1000);
	struct rl_check c[2] = {
		mkcheck(RL_ALG_SLIDING_LOG, 5, 1000, 1, false, "rl:a:{x}"),
		mkcheck(RL_ALG_FIXED_WINDOW, 1, 1000, 1, false, "rl:b:{x}"),
	};
	struct rl_result r[2];

	ck_assert(decide_ok(b, c, 2, r));
	ck_assert_int_eq(r[0].remaining, 4);
	ck_assert_int_eq(r[1].remaining, 0);
	ck_assert(!decide_ok(b, c, 2, r));
	ck_assert(r[0].allowed); /* a alone would admit it */
	ck_assert_int_eq(r[0].retry_after_ms, 0);
	ck_assert_int_eq(r[0].remaining, 4); /* not recorded */
	ck_assert(!r[1].allowed);
	ck_assert_int_eq(r[1].retry_after_ms, 1000);
	ck_assert_int_eq(used_of(b, 5, "rl:a:{x}"), 1);
	/* with costs: a would take 3 of its 4 left, b denies */
	c[0].cost = 3;
	ck_assert(!decide_ok(b, c, 2, r));
	ck_assert_int_eq(used_of(b, 5, "rl:a:{x}"), 1);
	backend_free(b);
}
END_TEST

/* A shadow rule that would deny records nothing and denies nothing. */
START_TEST(test_shadow)
{
	struct backend *b = new_backend(1000);
	struct rl_check c[2] = {
		mkcheck(RL_ALG_SLIDING_LOG, 1, 1000, 1, true, "rl:s:{x}"),
		mkcheck(RL_ALG_SLIDING_LOG, 5, 1000, 1, false, "rl:n:{x}"),
	};
	struct rl_result r[2];

	ck_assert(decide_ok(b, c, 2, r));
	ck_assert(r[0].allowed && r[1].allowed);
	fake_now += 200 * MS;
	ck_assert(decide_ok(b, c, 2, r)); /* the shadow does not deny */
	ck_assert(!r[0].allowed);
	/* its unit from T0 expires in 800 ms */
	ck_assert_int_eq(r[0].retry_after_ms, 800);
	ck_assert(r[1].allowed);
	ck_assert_int_eq(r[1].remaining, 3);
	ck_assert_int_eq(used_of(b, 1, "rl:s:{x}"), 1);
	ck_assert_int_eq(used_of(b, 5, "rl:n:{x}"), 2);
	/* the non-shadow rule denying still stops everything */
	c[1].cost = 4;
	ck_assert(!decide_ok(b, c, 2, r));
	ck_assert_int_eq(used_of(b, 5, "rl:n:{x}"), 2);
	backend_free(b);
}
END_TEST

/* cost 0 reports and stores nothing, not even a key. */
START_TEST(test_cost_zero)
{
	struct backend *b = new_backend(1000);
	static const enum rl_algorithm algs[] = { RL_ALG_SLIDING_LOG,
		RL_ALG_SLIDING_WINDOW, RL_ALG_FIXED_WINDOW,
		RL_ALG_TOKEN_BUCKET };
	struct rl_check c;
	struct rl_result r;
	size_t i;

	for (i = 0; i < 4; i++) {
		c = mkcheck(algs[i], 7, 1000, 0, false, "rl:z:{x}");
		ck_assert(decide_ok(b, &c, 1, &r));
		ck_assert(r.allowed);
		ck_assert_int_eq(r.remaining, 7);
		ck_assert_int_eq(r.reset_ms, 0);
		ck_assert_int_eq(r.retry_after_ms, 0);
		ck_assert_uint_eq(backend_memory_key_count(b), 0);
	}
	backend_free(b);
}
END_TEST

/* Many threads on one key inside one window: exactly `limit` admitted.
 * Each call also carries a key of the thread's own and a shadow key shared
 * by half the threads, in two orders, so calls lock several stripes. */
#define NTHREADS 8
#define NCALLS	 10000
#define TLIMIT	 1000

struct worker {
	struct backend *b;
	enum rl_algorithm alg;
	int id;
	int admitted;
	int errors;
};

static void *
worker_run(void *arg)
{
	struct worker *w = arg;
	char own[32], pair[32];
	struct rl_check c[3], d[3];
	struct rl_result r[3];
	enum backend_error_kind kind;
	char err[128];
	bool all;
	int k;

	snprintf(own, sizeof(own), "rl:own:{%d}", w->id);
	snprintf(pair, sizeof(pair), "rl:pair:{%d}", w->id % 2);
	c[0] = mkcheck(RL_ALG_FIXED_WINDOW, 1000000, 60000, 1, false, own);
	c[1] = mkcheck(w->alg, TLIMIT, 60000, 1, false, "rl:shared:{}");
	c[2] = mkcheck(RL_ALG_SLIDING_LOG, 1000000, 60000, 1, true, pair);
	d[0] = c[2];
	d[1] = c[1];
	d[2] = c[0];
	for (k = 0; k < NCALLS; k++) {
		if (backend_decide(w->b, w->id % 2 ? c : d, 3, r, &all, &kind,
			err, sizeof(err)) != 0)
			w->errors++;
		else if (all)
			w->admitted++;
	}
	return NULL;
}

START_TEST(test_threads)
{
	static const enum rl_algorithm algs[] = { RL_ALG_SLIDING_LOG,
		RL_ALG_SLIDING_WINDOW, RL_ALG_FIXED_WINDOW,
		RL_ALG_TOKEN_BUCKET };
	struct worker w[NTHREADS];
	pthread_t th[NTHREADS];
	struct backend *b;
	bool parity[2];
	int i, total, keys;
	size_t a;

	for (a = 0; a < 4; a++) {
		b = new_backend(1000000);
		fake_now = T0 + 123; /* stuck inside one window */
		for (i = 0; i < NTHREADS; i++) {
			w[i].b = b;
			w[i].alg = algs[a];
			w[i].id = i;
			w[i].admitted = w[i].errors = 0;
			ck_assert_int_eq(pthread_create(&th[i], NULL,
					     worker_run, &w[i]),
			    0);
		}
		total = 0;
		keys = 1; /* the shared key */
		memset(parity, 0, sizeof(parity));
		for (i = 0; i < NTHREADS; i++) {
			pthread_join(th[i], NULL);
			ck_assert_int_eq(w[i].errors, 0);
			total += w[i].admitted;
			/* own and pair keys exist iff something was recorded
			 * in them: iff the thread had a request admitted */
			if (w[i].admitted > 0) {
				keys++;
				parity[i % 2] = true;
			}
		}
		ck_assert_msg(total == TLIMIT, "%s: %d admitted",
		    rl_algorithm_name(algs[a]), total);
		keys += parity[0] + parity[1];
		ck_assert_uint_eq(backend_memory_key_count(b), (size_t)keys);
		backend_free(b);
	}
}
END_TEST

/* Keys go once their state stops mattering. */
START_TEST(test_expiry_reclaims)
{
	struct backend *b = new_backend(0);
	struct rl_check c;
	struct rl_result r;
	char key[32];
	int k;

	for (k = 0; k < 100; k++) {
		snprintf(key, sizeof(key), "rl:f:{%d}", k);
		c = mkcheck(RL_ALG_FIXED_WINDOW, 5, 1000, 1, false, key);
		(void)decide_ok(b, &c, 1, &r);
		snprintf(key, sizeof(key), "rl:l:{%d}", k);
		c = mkcheck(RL_ALG_SLIDING_LOG, 5, 1000, 1, false, key);
		(void)decide_ok(b, &c, 1, &r);
	}
	ck_assert_uint_eq(backend_memory_key_count(b), 200);
	/* both windows started at T0 (a multiple of 1 s) */
	fake_now = T0 + SEC - 1;
	ck_assert_uint_eq(backend_memory_key_count(b), 200);
	fake_now = T0 + SEC;
	ck_assert_uint_eq(backend_memory_key_count(b), 0);
	backend_free(b);
}
END_TEST

/* A key reused after its expiry starts fresh, and an algorithm change on a
 * reload resets it. */
START_TEST(test_reuse_and_reload)
{
	struct backend *b = new_backend(0);
	struct rl_check c = mkcheck(RL_ALG_SLIDING_LOG, 1, 1000, 1, false,
	    "rl:r:{x}");
	struct rl_result r;

	ck_assert(decide_ok(b, &c, 1, &r));
	ck_assert(!decide_ok(b, &c, 1, &r));
	fake_now += SEC;
	ck_assert(decide_ok(b, &c, 1, &r));
	/* the rule becomes a token bucket of 2: a fresh bucket */
	c = mkcheck(RL_ALG_TOKEN_BUCKET, 2, 1000, 2, false, "rl:r:{x}");
	ck_assert(decide_ok(b, &c, 1, &r));
	ck_assert_int_eq(r.remaining, 0);
	ck_assert_uint_eq(backend_memory_key_count(b), 1);
	backend_free(b);
}
END_TEST

/* Like Redis, only a call that records sets a key's expiry: reading a
 * sliding_log under a longer window (a reload) does not keep its units. */
START_TEST(test_expiry_set_by_records)
{
	struct backend *b = new_backend(0);
	struct rl_check c = mkcheck(RL_ALG_SLIDING_LOG, 2, 1000, 1, false,
	    "rl:e:{x}");
	struct rl_result r;

	ck_assert(decide_ok(b, &c, 1, &r)); /* expiry T0 + 1 s */
	c.window_ms = 10000;
	c.cost = 0;
	fake_now = T0 + 500 * MS;
	(void)decide_ok(b, &c, 1, &r); /* a read: expiry stays */
	ck_assert_int_eq(r.remaining, 1);
	fake_now = T0 + 2 * SEC;
	(void)decide_ok(b, &c, 1, &r);
	ck_assert_int_eq(r.remaining, 2); /* gone at T0 + 1 s */
	ck_assert_uint_eq(backend_memory_key_count(b), 0);
	backend_free(b);
}
END_TEST

START_TEST(test_max_keys)
{
	struct backend *b = new_backend(10);
	enum backend_error_kind kind = BACKEND_ERR_NONE;
	struct rl_check c;
	struct rl_result r;
	char key[32], err[256] = "";
	bool all;
	int k;

	for (k = 0; k < 10; k++) {
		snprintf(key, sizeof(key), "rl:m:{%d}", k);
		c = mkcheck(RL_ALG_SLIDING_LOG, 3, 1000, 1, false, key);
		ck_assert(decide_ok(b, &c, 1, &r));
	}
	c = mkcheck(RL_ALG_SLIDING_LOG, 3, 1000, 1, false, "rl:m:{new}");
	ck_assert_int_eq(backend_decide(b, &c, 1, &r, &all, &kind, err,
			     sizeof(err)),
	    -1);
	ck_assert_int_eq(kind, BACKEND_ERR_FULL);
	ck_assert_ptr_nonnull(strstr(err, "full"));
	ck_assert_str_eq(backend_error_kind_name(kind), "full");
	/* existing keys still work */
	c = mkcheck(RL_ALG_SLIDING_LOG, 3, 1000, 1, false, "rl:m:{3}");
	ck_assert(decide_ok(b, &c, 1, &r));
	ck_assert_int_eq(r.remaining, 1);
	/* a failed call with an existing and a new key records nothing */
	{
		struct rl_check two[2] = {
			mkcheck(RL_ALG_SLIDING_LOG, 3, 1000, 1, false,
			    "rl:m:{4}"),
			mkcheck(RL_ALG_SLIDING_LOG, 3, 1000, 1, false,
			    "rl:m:{new}"),
		};
		ck_assert_int_eq(backend_decide(b, two, 2, &r, &all, &kind, err,
				     sizeof(err)),
		    -1);
		ck_assert_int_eq(used_of(b, 3, "rl:m:{4}"), 1);
	}
	ck_assert_uint_eq(backend_memory_key_count(b), 10);
	/* once the keys expire, there is room again */
	fake_now += SEC;
	c = mkcheck(RL_ALG_SLIDING_LOG, 3, 1000, 1, false, "rl:m:{new}");
	ck_assert(decide_ok(b, &c, 1, &r));
	ck_assert_uint_eq(backend_memory_key_count(b), 1);
	backend_free(b);
}
END_TEST

/* Enough keys to grow every stripe's table several times. */
START_TEST(test_many_keys)
{
	struct backend *b = new_backend(0);
	struct rl_check c;
	struct rl_result r;
	char key[32];
	int k;

	for (k = 0; k < 20000; k++) {
		snprintf(key, sizeof(key), "rl:k:{%d}", k);
		c = mkcheck(RL_ALG_FIXED_WINDOW, 1, 60000, 1, false, key);
		ck_assert(decide_ok(b, &c, 1, &r));
	}
	ck_assert_uint_eq(backend_memory_key_count(b), 20000);
	for (k = 0; k < 20000; k++) {
		snprintf(key, sizeof(key), "rl:k:{%d}", k);
		c = mkcheck(RL_ALG_FIXED_WINDOW, 1, 60000, 1, false, key);
		ck_assert(!decide_ok(b, &c, 1, &r));
	}
	/* keys are bytes, not C strings: "a\0b" and "a\0c" differ */
	c = mkcheck(RL_ALG_FIXED_WINDOW, 1, 60000, 1, false, "a");
	c.key = "a\0b";
	c.keylen = 3;
	ck_assert(decide_ok(b, &c, 1, &r));
	c.key = "a\0c";
	ck_assert(decide_ok(b, &c, 1, &r));
	ck_assert_uint_eq(backend_memory_key_count(b), 20002);
	backend_free(b);
}
END_TEST

/*
 * A burst of distinct keys, then traffic on one key the store already has:
 * the expired keys are freed and the tables shrink back, with no new key
 * and nothing asking for the key count (which sweeps everything).
 */
START_TEST(test_expired_freed_without_inserts)
{
	struct backend *b = new_backend(0);
	struct rl_check c,
	    old = mkcheck(RL_ALG_SLIDING_LOG, 1000000, 1000, 1, false,
		"rl:old:{x}");
	struct rl_result r;
	size_t chains, start_chains;
	char key[32];
	int k;

	ck_assert_uint_eq(backend_memory_held(b, &start_chains), 0);
	ck_assert(decide_ok(b, &old, 1, &r));
	for (k = 0; k < 20000; k++) {
		snprintf(key, sizeof(key), "rl:burst:{%d}", k);
		c = mkcheck(RL_ALG_SLIDING_LOG, 5, 1000, 1, false, key);
		ck_assert(decide_ok(b, &c, 1, &r));
	}
	/* the sweeps on insert free nothing: every key is live */
	ck_assert_uint_eq(backend_memory_held(b, &chains), 20001);
	ck_assert_uint_ge(chains, 20001);
	/* an hour later, only the old key is used */
	fake_now += 3600 * SEC;
	for (k = 0; k < 20000; k++) {
		ck_assert(decide_ok(b, &old, 1, &r));
		fake_now += MS;
	}
	ck_assert_uint_eq(backend_memory_held(b, &chains), 1);
	ck_assert_uint_eq(chains, start_chains);
	backend_free(b);
}
END_TEST

/*
 * A stripe's sweeps walk nothing until its soonest expiry: keys of a short
 * window made after keys of a long one bring that time forward, and are
 * freed when they expire, by traffic on a long-lived key alone.
 */
START_TEST(test_short_keys_after_long_freed)
{
	struct backend *b = new_backend(0);
	struct rl_check c,
	    old = mkcheck(RL_ALG_SLIDING_LOG, 1000000, 3600 * 1000, 1, false,
		"rl:old:{x}");
	struct rl_result r;
	char key[32];
	int k;

	for (k = 0; k < 5000; k++) {
		snprintf(key, sizeof(key), "rl:long:{%d}", k);
		c = mkcheck(RL_ALG_SLIDING_LOG, 5, 3600 * 1000, 1, false, key);
		ck_assert(decide_ok(b, &c, 1, &r));
	}
	/* every stripe's soonest is now an hour on */
	ck_assert(decide_ok(b, &old, 1, &r));
	ck_assert_uint_eq(backend_memory_held(b, NULL), 5001);
	for (k = 0; k < 1000; k++) {
		snprintf(key, sizeof(key), "rl:short:{%d}", k);
		c = mkcheck(RL_ALG_SLIDING_LOG, 5, 1000, 1, false, key);
		ck_assert(decide_ok(b, &c, 1, &r));
	}
	ck_assert_uint_eq(backend_memory_held(b, NULL), 6001);
	fake_now += 10 * SEC;
	for (k = 0; k < 20000; k++)
		ck_assert(decide_ok(b, &old, 1, &r));
	ck_assert_uint_eq(backend_memory_held(b, NULL), 5001);
	backend_free(b);
}
END_TEST

/*
 * Random calls of one to four checks (a check repeated in its call
 * included), keys of four algorithms, windows of 1 s to 1 h, cost 0 to 2, with
 * the clock moving by up to 0.4 s and now and then by seconds: after every call
 * no entry is one the sweeping could pass over (backend_memory_unswept), and at
 * the end traffic on one key frees every other.
 */
START_TEST(test_sweep_bookkeeping_random)
{
	static const enum rl_algorithm algs[] = { RL_ALG_SLIDING_LOG,
		RL_ALG_FIXED_WINDOW, RL_ALG_TOKEN_BUCKET,
		RL_ALG_SLIDING_WINDOW };
	static const int64_t windows[] = { 1000, 60000, 3600000 };
	struct backend *b = new_backend(0);
	enum backend_error_kind kind;
	struct rl_check c[4],
	    old = mkcheck(RL_ALG_SLIDING_LOG, 1000000, 1000, 1, false,
		"rl:old:{x}");
	struct rl_result r[4];
	char keys[4][32], err[256];
	uint64_t x = 42;
	size_t n, i;
	bool all;
	int call;
	/* few keys, then many: small tables whose rounds end within a
	 * call's inserts, then tables that grow */
	unsigned nkeys = _i == 0 ? 200 : 3000;

	for (call = 0; call < 20000; call++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		n = 1 + (size_t)(x >> 62);
		for (i = 0; i < n; i++) {
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
			/* the first check again, one time in eight (its
			 * rule and key: a key has one rule's algorithm) */
			if (i > 0 && (x >> 61) == 0) {
				c[i] = c[0];
				c[i].cost = (int64_t)((x >> 16) % 3);
				continue;
			}
			/* a key's algorithm and window are its own */
			snprintf(keys[i], sizeof(keys[i]), "rl:%c%u:{%u}",
			    (char)('a' + (x >> 8) % 4),
			    (unsigned)((x >> 12) % 3),
			    (unsigned)((x >> 20) % nkeys));
			c[i] = mkcheck(algs[(x >> 8) % 4], 5,
			    windows[(x >> 12) % 3], (int64_t)((x >> 16) % 3),
			    false, keys[i]);
		}
		kind = BACKEND_ERR_NONE;
		ck_assert_int_eq(backend_decide(b, c, n, r, &all, &kind, err,
				     sizeof(err)),
		    0);
		ck_assert_msg(backend_memory_unswept(b) == 0,
		    "call %d: %zu entries the sweeping could miss", call,
		    backend_memory_unswept(b));
		fake_now += (int64_t)((x >> 32) % 400) * MS;
		if ((x >> 40) % 500 == 0)
			fake_now += 5 * SEC;
	}
	fake_now += 2 * 3600 * SEC;
	for (call = 0; call < 20000; call++) {
		ck_assert(decide_ok(b, &old, 1, r));
		fake_now += MS;
	}
	ck_assert_uint_eq(backend_memory_held(b, NULL), 1);
	backend_free(b);
}
END_TEST

/* More checks in one call than fit on the stack. */
START_TEST(test_many_checks)
{
	struct backend *b = new_backend(0);
	struct rl_check c[40];
	struct rl_result r[40];
	char keys[40][32];
	int k;

	for (k = 0; k < 40; k++) {
		snprintf(keys[k], sizeof(keys[k]), "rl:c:{%d}", k);
		c[k] = mkcheck(RL_ALG_SLIDING_LOG, 2, 1000, 1, false, keys[k]);
	}
	ck_assert(decide_ok(b, c, 40, r));
	ck_assert(decide_ok(b, c, 40, r));
	ck_assert(!decide_ok(b, c, 40, r));
	for (k = 0; k < 40; k++)
		ck_assert_int_eq(r[k].retry_after_ms, 1000);
	backend_free(b);
}
END_TEST

START_TEST(test_invalid)
{
	struct backend *b = new_backend(0);
	enum backend_error_kind kind = BACKEND_ERR_NONE;
	struct rl_check c = mkcheck(RL_ALG_SLIDING_LOG, 2, 1000, 3, false,
	    "rl:i:{x}");
	struct rl_result r;
	char err[256] = "";
	bool all;

	ck_assert_int_eq(backend_decide(b, &c, 1, &r, &all, &kind, err,
			     sizeof(err)),
	    -1);
	ck_assert_int_eq(kind, BACKEND_ERR_PROTOCOL);
	ck_assert_ptr_nonnull(strstr(err, "invalid"));
	c.cost = 1;
	c.window_ms = 0;
	ck_assert_int_eq(backend_decide(b, &c, 1, &r, &all, &kind, err,
			     sizeof(err)),
	    -1);
	c.window_ms = 1000;
	c.limit = 0;
	ck_assert_int_eq(backend_decide(b, &c, 1, &r, &all, &kind, err,
			     sizeof(err)),
	    -1);
	ck_assert_uint_eq(backend_memory_key_count(b), 0);
	backend_free(b);
}
END_TEST

START_TEST(test_kind_names)
{
	ck_assert_str_eq(backend_error_kind_name(BACKEND_ERR_NONE), "none");
	ck_assert_str_eq(backend_error_kind_name(BACKEND_ERR_CONNECT),
	    "connect");
	ck_assert_str_eq(backend_error_kind_name(BACKEND_ERR_TIMEOUT),
	    "timeout");
	ck_assert_str_eq(backend_error_kind_name(BACKEND_ERR_PROTOCOL),
	    "protocol");
	ck_assert_str_eq(backend_error_kind_name(BACKEND_ERR_FULL), "full");
	ck_assert_str_eq(backend_error_kind_name(BACKEND_ERR_CIRCUIT_OPEN),
	    "circuit_open");
}
END_TEST

/* backend_memory_new() under every allocation failure: NULL, no leak. */
START_TEST(test_alloc_fail_new)
{
	struct backend *b;
	long n;
	int made = 0;

	for (n = 0; n < 200; n++) {
		rl_alloc_fail_after(n);
		b = backend_memory_new(0, test_clock, &fake_now);
		rl_alloc_fail_after(-1);
		if (b != NULL) {
			made++;
			backend_free(b);
		}
	}
	ck_assert_int_gt(made, 0);
}
END_TEST

/*
 * decide() with the n-th allocation failing, for every n a script of calls
 * needs: each call either succeeds or answers -1 with a message; a failed
 * call records nothing (what is used afterwards is exactly what the
 * successful calls admitted); nothing leaks (under ASan).
 */
#define AF_KEYS	 20
#define AF_CALLS 60
#define AF_LIMIT 40

START_TEST(test_alloc_fail_decide)
{
	static const enum rl_algorithm algs[] = { RL_ALG_SLIDING_LOG,
		RL_ALG_SLIDING_WINDOW, RL_ALG_FIXED_WINDOW,
		RL_ALG_TOKEN_BUCKET };
	char keys[AF_KEYS][32];
	int64_t want[AF_KEYS];
	struct rl_check c[AF_KEYS];
	struct rl_result r[AF_KEYS];
	enum backend_error_kind kind;
	struct backend *b;
	char err[256];
	bool all;
	long n;
	int call, k, failures, nk, first, rc;

	for (k = 0; k < AF_KEYS; k++)
		snprintf(keys[k], sizeof(keys[k]), "rl:af:{%d}", k);
	for (n = 0; n < 120; n++) {
		b = new_backend(0);
		fake_now = T0 + 123; /* no expiry during the script */
		memset(want, 0, sizeof(want));
		failures = 0;
		rl_alloc_fail_after(n);
		for (call = 0; call < AF_CALLS; call++) {
			/* calls of 1, 2, 3 and (every 10th) 20 checks; the
			 * sliding_log keys get distinct times: rings grow */
			nk = call % 10 == 9 ? AF_KEYS : call % 3 + 1;
			first = (call * 7) % AF_KEYS;
			for (k = 0; k < nk; k++) {
				int key = (first + k) % AF_KEYS;

				c[k] = mkcheck(algs[key % 4], AF_LIMIT, 60000,
				    1, false, keys[key]);
			}
			fake_now++;
			err[0] = '\0';
			rc = backend_decide(b, c, (size_t)nk, r, &all, &kind,
			    err, sizeof(err));
			if (rc != 0) {
				ck_assert_int_eq(rc, -1);
				ck_assert(err[0] != '\0');
				ck_assert_int_eq(kind, BACKEND_ERR_FULL);
				failures++;
				continue;
			}
			ck_assert(all);
			for (k = 0; k < nk; k++)
				want[(first + k) % AF_KEYS]++;
		}
		rl_alloc_fail_after(-1);
		/* what each key has used, asked with cost 0 */
		for (k = 0; k < AF_KEYS; k++) {
			c[0] = mkcheck(algs[k % 4], AF_LIMIT, 60000, 0, false,
			    keys[k]);
			(void)decide_ok(b, c, 1, r);
			ck_assert_msg(r[0].remaining == AF_LIMIT - want[k],
			    "n %ld key %d: remaining %lld, want %lld", n, k,
			    (long long)r[0].remaining,
			    (long long)(AF_LIMIT - want[k]));
		}
		backend_free(b);
		if (failures == 0)
			break; /* the script no longer meets a failure */
	}
	ck_assert_int_gt(n, 10); /* failures were hit on the way */
	ck_assert_int_lt(n, 120);
}
END_TEST

static void
call_done(struct backend_call *call)
{
	(void)call;
}

/* A report (POST /report) of one check that must succeed; *over gets its
 * overdrawn. */
static void
report_ok(struct backend *b, const struct rl_check *c, struct rl_result *r,
    int64_t *over)
{
	struct backend_call call;

	memset(&call, 0, sizeof(call));
	call.checks = c;
	call.n = 1;
	call.out = r;
	call.report = true;
	call.overdrawn = over;
	call.done = call_done;
	backend_submit(b, &call);
	ck_assert_msg(call.rc == 0, "report: %s", call.err);
	ck_assert(call.all_allowed);
}

/* A token_bucket report whose c * W / L passes 2^63 us: the tat stops
 * LIMITER_MAX_AHEAD_US (2^52) after now and overdrawn at LIMITER_MAX_UNITS
 * (docs/algorithms.md, "Usage reported after the fact"), so the key is
 * kept and refuses, as an overdraft does. */
START_TEST(test_report_bucket_huge)
{
	struct backend *b = new_backend(1000);
	struct rl_check c = mkcheck(RL_ALG_TOKEN_BUCKET, 100, 60000,
	    INT64_C(1) << 53, false, "rl:tb:{huge}");
	struct rl_check d = mkcheck(RL_ALG_TOKEN_BUCKET, 4000, 1,
	    INT64_C(1) << 53, false, "rl:tb:{units}");
	struct rl_result r;
	int64_t over = -1;
	int k;

	report_ok(b, &c, &r, &over);
	ck_assert_int_eq(r.remaining, 0);
	/* tat - now = 2^52 us: reset ceil_ms(2^52) */
	ck_assert_int_eq(r.reset_ms, INT64_C(4503599627371));
	/* -floor((W + 1 - 2^52) * L / W) = ceil(2^52 / 6e5 - 100 - 1 / 6e5)
	 * = ceil(7505999278.95), give or take the rounding of T0 + 2^52 */
	ck_assert_int_ge(over, INT64_C(7505999278));
	ck_assert_int_le(over, INT64_C(7505999280));
	ck_assert_uint_eq(backend_memory_key_count(b), 1);
	fake_now += MS;
	c.cost = 100;
	ck_assert(!decide_ok(b, &c, 1, &r));
	ck_assert_int_gt(r.retry_after_ms, INT64_C(4503599627000));
	ck_assert_uint_eq(backend_memory_key_count(b), 1);

	/* L 4000, W 1 ms: each report moves the tat 2^53 * W / L = 2^51 us,
	 * 2^53 units; from the second on, overdrawn would pass 2^53 and stops
	 * there; after 2 reports the tat stops at now + 2^52 */
	for (k = 0; k < 4; k++) {
		report_ok(b, &d, &r, &over);
		if (k >= 1)
			ck_assert_int_eq(over, INT64_C(1) << 53);
	}
	ck_assert_int_eq(r.reset_ms, INT64_C(4503599627371));
	backend_free(b);
}
END_TEST

/* The default clock's sources, moved by hand. */
static int64_t fake_real = T0;
static int64_t fake_mono = 5 * SEC;

static int64_t
fake_realtime(void)
{
	return fake_real;
}

static int64_t
fake_monotonic(void)
{
	return fake_mono;
}

/* The default clock follows the wall clock's epoch but not its steps
 * (docs/algorithms.md, "Common ground"). */
START_TEST(test_clock_steps)
{
	struct memory_clock mc;
	int64_t a, b2, real;
	int i;

	fake_real = T0;
	fake_mono = 5 * SEC;
	memory_clock_init(&mc, fake_realtime, fake_monotonic);
	ck_assert_int_eq(memory_clock_read(&mc), T0);
	fake_mono += SEC;
	fake_real -= 3600 * SEC; /* NTP steps the wall clock back an hour */
	ck_assert_int_eq(memory_clock_read(&mc), T0 + SEC);
	fake_mono += SEC;
	fake_real += 7200 * SEC; /* and forward two */
	ck_assert_int_eq(memory_clock_read(&mc), T0 + 2 * SEC);

	/* on the real sources: near the wall clock, never back */
	memory_clock_init(&mc, util_realtime_us, util_monotonic_us);
	a = memory_clock_read(&mc);
	real = util_realtime_us();
	ck_assert_int_lt(llabs(a - real), SEC);
	for (i = 0; i < 1000; i++) {
		b2 = memory_clock_read(&mc);
		ck_assert_int_ge(b2, a);
		a = b2;
	}
}
END_TEST

/* A wall clock stepped back refuses no key that has room: a fixed_window
 * start and a token_bucket tat are behind the store's clock still. */
START_TEST(test_clock_step_keys)
{
	struct memory_clock mc;
	struct backend *b;
	struct rl_check c[3];
	struct rl_result r[3];

	fake_real = T0;
	fake_mono = 5 * SEC;
	memory_clock_init(&mc, fake_realtime, fake_monotonic);
	b = backend_memory_new(0, memory_clock_read, &mc);
	ck_assert_ptr_nonnull(b);
	c[0] = mkcheck(RL_ALG_FIXED_WINDOW, 100, 1000, 1, false, "fw");
	c[1] = mkcheck(RL_ALG_TOKEN_BUCKET, 100, 1000, 1, false, "tb");
	c[2] = mkcheck(RL_ALG_SLIDING_WINDOW, 100, 1000, 1, false, "sw");
	ck_assert(decide_ok(b, c, 3, r));
	fake_real -= 3600 * SEC;
	fake_mono += MS;
	ck_assert(decide_ok(b, c, 3, r));
	ck_assert_int_eq(r[0].remaining, 98);
	ck_assert_int_eq(r[1].remaining, 98);
	ck_assert_int_eq(r[2].remaining, 98);
	backend_free(b);

	/* the default clock: a store made without one answers */
	b = backend_memory_new(0, NULL, NULL);
	ck_assert_ptr_nonnull(b);
	ck_assert(decide_ok(b, c, 3, r));
	ck_assert_int_eq(r[0].remaining, 99);
	backend_free(b);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("backend_memory");
	TCase *tc;

	tc = tcase_create("decide");
	tcase_add_test(tc, test_basic);
	tcase_add_test(tc, test_all_or_nothing);
	tcase_add_test(tc, test_shadow);
	tcase_add_test(tc, test_cost_zero);
	tcase_add_test(tc, test_invalid);
	tcase_add_test(tc, test_kind_names);
	tcase_add_test(tc, test_many_checks);
	tcase_add_test(tc, test_clock_steps);
	tcase_add_test(tc, test_clock_step_keys);
	tcase_add_test(tc, test_report_bucket_huge);
	suite_add_tcase(s, tc);

	tc = tcase_create("store");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_threads);
	tcase_add_test(tc, test_expiry_reclaims);
	tcase_add_test(tc, test_reuse_and_reload);
	tcase_add_test(tc, test_expiry_set_by_records);
	tcase_add_test(tc, test_max_keys);
	tcase_add_test(tc, test_many_keys);
	tcase_add_test(tc, test_expired_freed_without_inserts);
	tcase_add_test(tc, test_short_keys_after_long_freed);
	tcase_add_loop_test(tc, test_sweep_bookkeeping_random, 0, 2);
	suite_add_tcase(s, tc);

	tc = tcase_create("oom");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_alloc_fail_new);
	tcase_add_test(tc, test_alloc_fail_decide);
	suite_add_tcase(s, tc);
	return s;
}
