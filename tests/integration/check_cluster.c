/*
 * check_cluster.c - ratelimitd on a real Redis Cluster (docs/scale.md): three
 * primaries and three replicas on loopback ports, made by the harness with
 * redis-cli --cluster create.
 *
 * What is shown: keys of 300 users land each on the primary that owns its
 * slot; two daemons with many threads on one key admit exactly the limit;
 * a request whose rules live in different slots is all-or-nothing (what
 * one slot recorded is taken back when another denies), also when a
 * primary hangs (a denial stands over the hung part's failure, a take-back
 * after the deadline still runs, parts that fail at once answer at once;
 * the denials learnt while units were held are forgotten, by the daemon
 * that took them back and, through its notice, by another);
 * a slot migrated
 * under the daemon is followed (ASK while it migrates, MOVED after), and
 * while its keys are split between the two nodes (TRYAGAIN) the requests
 * of a batch are decided one by one, each where its keys are; a
 * primary killed under load is replaced by its replica and decisions come
 * back by themselves, no request waiting past redis.timeout meanwhile,
 * and the log names the node each failure is about.
 * The kill runs last: it changes the cluster.  A daemon whose only seed
 * is a node later removed with `redis-cli --cluster del-node` still hears
 * releases (tcase "del_node", on a cluster of its own).  /readyz answers 503
 * while a primary that does not own slot 0 is down and 200 after the
 * failover, which leaves the topology unwatched while idle (tcase "readyz",
 * on a cluster of its own); a cluster that cannot be reached, or whose
 * every node hangs, opens the store's circuit, which closes once it
 * answers (tcase "unreachable").
 * A key_prefix holding "{}" at its first '{' is refused (tcase "config",
 * no cluster needed).
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"
#include "store/slot_map.h"

static struct h_cluster cluster;

static const char yaml_fmt[] =
    "listen: \"127.0.0.1:%%PORT%%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "backend: redis\n"
    "redis:\n"
    "  cluster: [\"127.0.0.1:%d\"]\n"
    "  timeout: %s\n"
    "  pool_size: 2\n"
    "  key_prefix: \"cl:\"\n"
    "on_backend_error: deny\n"
    "rules:\n"
    "  - name: one\n"
    "    match: { t: one }\n"
    "    key: \"${user}\"\n"
    "    limit: %d\n"
    "    window: 1h\n"
    "  - name: wide\n"
    "    match: { t: pair }\n"
    "    key: \"${user}\"\n"
    "    limit: 10\n"
    "    window: 1h\n"
    "  - name: narrow\n"
    "    match: { t: pair }\n"
    "    key: \"${user}:n\"\n"
    "    limit: 3\n"
    "    window: 1h\n"
    "  - name: lk\n"
    "    match: { t: lock }\n"
    "    key: \"${user}\"\n"
    "    algorithm: concurrency\n"
    "    limit: 1\n"
    "    window: 1h\n"
    "stats:\n"
    "  - name: lat\n"
    "    match: { t: stat }\n"
    "    key: \"${user}\"\n"
    "    window: 1h\n"
    "  - name: bare\n"
    "    match: { t: bare }\n"
    "    window: 1h\n"
    "  - name: raw\n"
    "    match: { t: raw }\n"
    "    key: \"${user}\"\n"
    "    window: 1h\n";

static void
cluster_up(void)
{
	h_cluster_start(&cluster);
}

static void
cluster_down(void)
{
	h_reap_orphans();
}

static void
flush_all(void)
{
	int i;

	for (i = 0; i < H_CLUSTER_NODES; i++) {
		redisContext *c;
		redisReply *r;

		if (cluster.node[i].pid == 0)
			continue;
		c = h_redis_ctx(&cluster.node[i]);
		r = redisCommand(c, "FLUSHALL");
		if (r != NULL)
			freeReplyObject(r); /* replicas refuse: fine */
	}
}

static void
start(struct h_daemon *d, int seed, const char *timeout, int limit)
{
	char yaml[2048];

	memset(d, 0, sizeof(*d));
	snprintf(yaml, sizeof(yaml), yaml_fmt, seed, timeout, limit);
	d->redis_port = seed;
	h_daemon_start(d, yaml);
}

/* The primary (index) that holds key now, asked of the cluster. */
static int
owner_of(const char *key)
{
	return h_cluster_owner(&cluster, slot_map_keyslot(key, strlen(key)));
}

/* Units of a sliding_log key on node i (0 if it has none there). */
static long long
units_on(int i, const char *key)
{
	return h_redis_log_units(&cluster.node[i], key);
}

static long
get_status(const char *path)
{
	struct h_resp r = { 0 };
	long status;

	h_http(&r, "GET", path, NULL, NULL);
	status = r.status;
	h_resp_free(&r);
	return status;
}

static long
acquire(const char *body)
{
	struct h_resp r = { 0 };
	long status;

	h_http(&r, "POST", "/acquire", body, NULL);
	status = r.status;
	h_resp_free(&r);
	return status;
}

START_TEST(test_keys_on_their_primaries)
{
	struct h_daemon d;
	bool on[H_CLUSTER_NODES] = { false };
	char body[128], key[64];
	int i, n, used = 0;

	start(&d, cluster.node[0].port, "2s", 3);
	for (i = 0; i < 300; i++) {
		snprintf(body, sizeof(body), "{\"t\":\"one\",\"user\":\"u%d\"}",
		    i);
		ck_assert_int_eq(acquire(body), 200);
	}
	for (i = 0; i < 300; i++) {
		snprintf(key, sizeof(key), "cl:one:{u%d}", i);
		n = owner_of(key);
		ck_assert_msg(n >= 0, "no primary owns %s", key);
		ck_assert_msg(units_on(n, key) == 1,
		    "%s: %lld units on its "
		    "primary (port %d), expected 1",
		    key, units_on(n, key), cluster.node[n].port);
		on[n] = true;
	}
	for (i = 0; i < H_CLUSTER_NODES; i++)
		used += on[i];
	ck_assert_msg(used == 3,
	    "300 keys landed on %d primaries, "
	    "expected all 3",
	    used);
	h_daemon_stop(&d);
}
END_TEST

/* Stat keys (docs/stats.md): each user's sub-window hashes on the primary
 * of its hash tag, and every user's window read back whole. */
START_TEST(test_stats_on_their_primaries)
{
	struct h_daemon d;
	struct h_resp r = { 0 };
	char body[128], pattern[64];
	int i, k, n;

	start(&d, cluster.node[0].port, "2s", 3);
	for (k = 0; k < 3; k++)
		for (i = 0; i < 30; i++) {
			snprintf(body, sizeof(body),
			    "{\"t\":\"stat\","
			    "\"user\":\"u%d\",\"value\":%d}",
			    i, 10 * k + i);
			h_http(&r, "POST", "/record", body, NULL);
			ck_assert_msg(r.status == 200, "%s: %ld %s", body,
			    r.status, r.body);
		}
	for (i = 0; i < 30; i++) {
		redisReply *keys;
		json_t *o;

		snprintf(body, sizeof(body),
		    "{\"t\":\"stat\",\"user\":"
		    "\"u%d\"}",
		    i);
		h_http(&r, "POST", "/stats", body, NULL);
		ck_assert_int_eq(r.status, 200);
		o = json_array_get(h_json_get(&r, "stats"), 0);
		ck_assert_int_eq(json_integer_value(json_object_get(o,
				     "count")),
		    3);
		ck_assert(json_number_value(json_object_get(o, "sum")) ==
		    30 + 3 * i);
		snprintf(pattern, sizeof(pattern), "cl:stat:lat:{u%d}", i);
		n = owner_of(pattern);
		ck_assert(n >= 0);
		keys = redisCommand(h_redis_ctx(&cluster.node[n]), "KEYS %s:*",
		    pattern);
		ck_assert_msg(keys != NULL && keys->elements >= 1,
		    "no "
		    "sub-window of %s on its primary",
		    pattern);
		freeReplyObject(keys);
	}
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/* A stat without a key, and keys that begin with '}' or with the marker,
 * still give every sub-window one non-empty hash tag (docs/stats.md "Keys
 * on Redis"): the script reads them all in one slot, and two keys that
 * differ stay apart. */
START_TEST(test_stats_empty_hash_tag)
{
	static const struct {
		const char *t, *user;
		int value;
	} c[] = {
		{ "bare", NULL, 5 },
		{ "raw", "}x", 7 },
		{ "raw", "~}x", 11 },
		{ "raw", "~", 13 },
		{ "raw", "~~", 17 },
	};
	struct h_daemon d;
	struct h_resp r = { 0 };
	char body[128];
	size_t i;
	int k;

	start(&d, cluster.node[0].port, "2s", 3);
	for (k = 0; k < 2; k++)
		for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
			if (c[i].user != NULL)
				snprintf(body, sizeof(body),
				    "{\"t\":\"%s\",\"user\":\"%s\","
				    "\"value\":%d}",
				    c[i].t, c[i].user, c[i].value);
			else
				snprintf(body, sizeof(body),
				    "{\"t\":\"%s\",\"value\":%d}", c[i].t,
				    c[i].value);
			h_http(&r, "POST", "/record", body, NULL);
			ck_assert_msg(r.status == 200, "%s: %ld %s", body,
			    r.status, r.body);
		}
	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		json_t *o;

		if (c[i].user != NULL)
			snprintf(body, sizeof(body),
			    "{\"t\":\"%s\",\"user\":\"%s\"}", c[i].t,
			    c[i].user);
		else
			snprintf(body, sizeof(body), "{\"t\":\"%s\"}", c[i].t);
		h_http(&r, "POST", "/stats", body, NULL);
		ck_assert_msg(r.status == 200, "%s: %ld %s", body, r.status,
		    r.body);
		o = json_array_get(h_json_get(&r, "stats"), 0);
		ck_assert_msg(json_integer_value(json_object_get(o, "count")) ==
			2,
		    "%s: %s", body, r.body);
		ck_assert_msg(json_number_value(json_object_get(o, "sum")) ==
			2 * c[i].value,
		    "%s: %s", body, r.body);
	}
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/* --- exactness: two daemons, threads, one key -------------------------- */

#define THREADS	   8
#define PER_THREAD 60
#define HOT_LIMIT  100

struct worker {
	pthread_t thread;
	int port;
	int ok, denied, other;
};

static void *
work(void *arg)
{
	struct worker *w = arg;
	static const char body[] = "{\"t\":\"one\",\"user\":\"hot\"}";
	struct h_resp r = { 0 };
	CURL *c = h_curl_new();
	int k;

	for (k = 0; k < PER_THREAD; k++) {
		if (h_request(c, w->port, &r, "POST", "/acquire", body,
			strlen(body), NULL) != 0)
			w->other++;
		else if (r.status == 200)
			w->ok++;
		else if (r.status == 429)
			w->denied++;
		else
			w->other++;
	}
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return NULL;
}

START_TEST(test_two_daemons_exact)
{
	struct h_daemon d[2];
	struct worker w[THREADS];
	int i, ok = 0, denied = 0, other = 0, n;

	start(&d[0], cluster.node[0].port, "2s", HOT_LIMIT);
	start(&d[1], cluster.node[1].port, "2s", HOT_LIMIT);
	memset(w, 0, sizeof(w));
	for (i = 0; i < THREADS; i++) {
		w[i].port = d[i % 2].port;
		ck_assert(pthread_create(&w[i].thread, NULL, work, &w[i]) == 0);
	}
	for (i = 0; i < THREADS; i++) {
		pthread_join(w[i].thread, NULL);
		ok += w[i].ok;
		denied += w[i].denied;
		other += w[i].other;
	}
	ck_assert_msg(other == 0, "%d answers were neither 200 nor 429", other);
	ck_assert_msg(ok == HOT_LIMIT, "%d admitted, expected exactly %d", ok,
	    HOT_LIMIT);
	ck_assert_int_eq(denied, THREADS * PER_THREAD - HOT_LIMIT);
	n = owner_of("cl:one:{hot}");
	ck_assert_int_eq(units_on(n, "cl:one:{hot}"), HOT_LIMIT);
	h_daemon_stop(&d[0]);
	h_daemon_stop(&d[1]);
}
END_TEST

/* --- all-or-nothing across slots ---------------------------------------- */

START_TEST(test_across_slots_all_or_nothing)
{
	static const char body[] = "{\"t\":\"pair\",\"user\":\"x1\"}";
	const char *wide = "cl:wide:{x1}", *narrow = "cl:narrow:{x1:n}";
	struct h_daemon d;
	int i;

	/* The two keys must be in different slots for this to mean
	 * anything. */
	ck_assert_uint_ne(slot_map_keyslot(wide, strlen(wide)),
	    slot_map_keyslot(narrow, strlen(narrow)));
	start(&d, cluster.node[2].port, "2s", 3);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(acquire(body), 200);
	/* narrow (3) is full now: each of these is denied, and wide must
	 * not keep what its slot recorded for them. */
	for (i = 0; i < 4; i++)
		ck_assert_int_eq(acquire(body), 429);
	ck_assert_int_eq(units_on(owner_of(wide), wide), 3);
	ck_assert_int_eq(units_on(owner_of(narrow), narrow), 3);
	/* The first denial takes back; the deny cache answers the next
	 * ones without a store call, so nothing is recorded for them. */
	ck_assert_int_ge(
	    h_metric("ratelimitd_redis_takebacks_total{result=\"ok\"}"), 1);
	ck_assert_int_eq(
	    h_metric("ratelimitd_redis_takebacks_total{result=\"failed\"}"), 0);
	h_daemon_stop(&d);
}
END_TEST

/*
 * The take-back of each algorithm: "wide" (limit 10, the algorithm under
 * test) and "narrow" (limit 3) in different slots.  Three requests pass;
 * the fourth is denied by narrow after wide's slot recorded it, so wide
 * must get exactly that back: a request that only wide applies to then
 * sees 10 - 3 - 1 = 6 remaining (5 if the units stayed).  wide's window is
 * 366 days: a fixed_window's starts on the clock's multiples of it, and
 * one that began during a test would empty wide's count.
 */
static const char algo_fmt[] =
    "listen: \"127.0.0.1:%%PORT%%\"\n"
    "backend: redis\n"
    "redis:\n"
    "  cluster: [\"127.0.0.1:%d\"]\n"
    "  timeout: 2s\n"
    "  key_prefix: \"cl:\"\n"
    "on_backend_error: deny\n"
    "rules:\n"
    "  - name: wide\n"
    "    match: { t: \"~^(pair|solo)$\" }\n"
    "    key: \"${user}\"\n"
    "    algorithm: %s\n"
    "    limit: 10\n"
    "    window: 366d\n"
    "  - name: narrow\n"
    "    match: { t: pair }\n"
    "    key: \"${user}:n\"\n"
    "    limit: 3\n"
    "    window: 1h\n";

START_TEST(test_takeback_each_algorithm)
{
	static const char *const algos[] = {
		"sliding_log", "sliding_window", "fixed_window", "token_bucket",
		"concurrency" /* the lease of the denied request is freed */
	};
	struct h_daemon d;
	struct h_resp r = { 0 };
	char yaml[2048];
	int i;

	for (i = 0; i < 5; i++) {
		memset(&d, 0, sizeof(d));
		snprintf(yaml, sizeof(yaml), algo_fmt, cluster.node[0].port,
		    algos[i]);
		h_daemon_start(&d, yaml);
		ck_assert_int_eq(acquire("{\"t\":\"pair\",\"user\":\"tb\"}"),
		    200);
		ck_assert_int_eq(acquire("{\"t\":\"pair\",\"user\":\"tb\"}"),
		    200);
		ck_assert_int_eq(acquire("{\"t\":\"pair\",\"user\":\"tb\"}"),
		    200);
		ck_assert_int_eq(acquire("{\"t\":\"pair\",\"user\":\"tb\"}"),
		    429);
		h_http(&r, "POST", "/acquire",
		    "{\"t\":\"solo\",\"user\":\"tb\"}", NULL);
		ck_assert_int_eq(r.status, 200);
		ck_assert_msg(h_json_int(&r, "remaining") == 6,
		    "%s: %lld "
		    "remaining after the take-back, expected 6",
		    algos[i], h_json_int(&r, "remaining"));
		h_resp_free(&r);
		h_daemon_stop(&d);
		flush_all();
	}
}
END_TEST

/* --- a slot migrated under the daemon ----------------------------------- */

static void
node_id(int i, char *out, size_t outlen)
{
	redisReply *r = redisCommand(h_redis_ctx(&cluster.node[i]),
	    "CLUSTER MYID");

	ck_assert(r != NULL && r->type == REDIS_REPLY_STRING);
	snprintf(out, outlen, "%s", r->str);
	freeReplyObject(r);
}

static void
cmd_ok(int i, const char *fmt, const char *a, const char *b)
{
	redisReply *r = redisCommand(h_redis_ctx(&cluster.node[i]), fmt, a, b);

	ck_assert_msg(r != NULL && r->type != REDIS_REPLY_ERROR,
	    "node %d: %s: %s", i, fmt, r != NULL ? r->str : "no reply");
	freeReplyObject(r);
}

/*
 * A migration of key's slot, from its owner to another primary: started
 * (IMPORTING / MIGRATING, and key MIGRATEd, so the source answers ASK for
 * it), then ended (the slot the destination's on every node).
 */
struct migration {
	char slot[16], dst_id[64];
	int src, dst;
};

/* A primary (it owns some slot) other than node i. */
static int
other_primary(int i)
{
	int n, k;

	for (n = 0; n < H_CLUSTER_NODES; n++) {
		int o = -1;

		for (k = 0; k < 16384 && o != n; k += 97)
			o = h_cluster_owner(&cluster, (unsigned)k);
		if (o == n && n != i)
			return n;
	}
	ck_abort_msg("no primary but node %d", i);
	return -1;
}

/* Move key from m's source to its destination (MIGRATE). */
static void
migrate_key(const struct migration *m, const char *key)
{
	char port[16];
	redisReply *r;

	snprintf(port, sizeof(port), "%d", cluster.node[m->dst].port);
	r = redisCommand(h_redis_ctx(&cluster.node[m->src]),
	    "MIGRATE 127.0.0.1 %s %s 0 5000 KEYS %s", port, "", key);
	ck_assert_msg(r != NULL && r->type != REDIS_REPLY_ERROR, "MIGRATE: %s",
	    r != NULL ? r->str : "no reply");
	freeReplyObject(r);
}

static void
migration_start(struct migration *m, const char *key)
{
	char src_id[64];

	m->src = owner_of(key);
	ck_assert_int_ge(m->src, 0);
	m->dst = other_primary(m->src);
	node_id(m->src, src_id, sizeof(src_id));
	node_id(m->dst, m->dst_id, sizeof(m->dst_id));
	snprintf(m->slot, sizeof(m->slot), "%u",
	    slot_map_keyslot(key, strlen(key)));
	cmd_ok(m->dst, "CLUSTER SETSLOT %s IMPORTING %s", m->slot, src_id);
	cmd_ok(m->src, "CLUSTER SETSLOT %s MIGRATING %s", m->slot, m->dst_id);
	migrate_key(m, key);
}

static void
migration_end(const struct migration *m)
{
	int i;

	for (i = 0; i < H_CLUSTER_NODES; i++) {
		redisReply *r;

		if (cluster.node[i].pid == 0)
			continue;
		r = redisCommand(h_redis_ctx(&cluster.node[i]),
		    "CLUSTER SETSLOT %s NODE %s", m->slot, m->dst_id);
		if (r != NULL)
			freeReplyObject(r); /* replicas may refuse */
	}
}

START_TEST(test_slot_migration_ask_then_moved)
{
	const char *old_key = "cl:one:{m1}";
	struct migration m;
	struct h_daemon d;

	start(&d, cluster.node[0].port, "2s", 3);
	ck_assert_int_eq(acquire("{\"t\":\"one\",\"user\":\"m1\"}"), 200);
	/* ASK: once the key has moved to the destination, the source
	 * answers ASK for it until the migration ends. */
	migration_start(&m, old_key);
	ck_assert_int_eq(acquire("{\"t\":\"one\",\"user\":\"m1\"}"), 200);
	/* The destination serves the slot only after ASKING, until the
	 * end of the migration. */
	freeReplyObject(redisCommand(h_redis_ctx(&cluster.node[m.dst]),
	    "ASKING"));
	ck_assert_int_eq(units_on(m.dst, old_key), 2);
	ck_assert_int_ge(h_metric("ratelimitd_redis_redirects_total"
				  "{kind=\"ask\"}"),
	    1);

	/* MOVED: the slot is the destination's now, everywhere. */
	migration_end(&m);
	ck_assert_int_eq(acquire("{\"t\":\"one\",\"user\":\"m1\"}"), 200);
	ck_assert_int_eq(acquire("{\"t\":\"one\",\"user\":\"m1\"}"), 429);
	ck_assert_int_eq(units_on(m.dst, old_key), 3);
	ck_assert_int_ge(h_metric("ratelimitd_redis_redirects_total"
				  "{kind=\"moved\"}"),
	    1);
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
	h_daemon_stop(&d);
}
END_TEST

/*
 * Sent to the destination by an ASK, a batch that meets NOSCRIPT there
 * (its scripts flushed) is sent again after SCRIPT LOAD and ASKING once
 * more: ASKING holds for one command only, and without it the
 * destination answers MOVED back to the source.
 */
START_TEST(test_slot_migration_ask_noscript)
{
	const char *key = "cl:one:{m3}";
	struct migration m;
	struct h_daemon d;

	start(&d, cluster.node[0].port, "2s", 3);
	ck_assert_int_eq(acquire("{\"t\":\"one\",\"user\":\"m3\"}"), 200);
	migration_start(&m, key);
	cmd_ok(m.dst, "SCRIPT FLUSH", NULL, NULL);
	ck_assert_int_eq(acquire("{\"t\":\"one\",\"user\":\"m3\"}"), 200);
	freeReplyObject(redisCommand(h_redis_ctx(&cluster.node[m.dst]),
	    "ASKING"));
	ck_assert_int_eq(units_on(m.dst, key), 2);
	ck_assert_int_eq(h_metric("ratelimitd_redis_redirects_total"
				  "{kind=\"moved\"}"),
	    0);
	migration_end(&m);
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
	h_daemon_stop(&d);
}
END_TEST

/* --- TRYAGAIN: a slot whose keys are split between two nodes ------------ */

/* Rules "big" and "big2" on one user's key: one slot ({<user>}); a request
 * with t "big" or "big2" checks one of them, t "both" both at once. */
static const char split_fmt[] =
    "listen: \"127.0.0.1:%%PORT%%\"\n"
    "threads: 4\n"
    "shutdown_timeout: 2s\n"
    "backend: redis\n"
    "redis:\n"
    "  cluster: [\"127.0.0.1:%d\"]\n"
    "  timeout: 1s\n"
    "  pool_size: 2\n"
    "  key_prefix: \"cl:\"\n"
    "on_backend_error: deny\n"
    "rules:\n"
    "  - name: big\n"
    "    match: { t: \"~^(big|both)$\" }\n"
    "    key: \"${user}\"\n"
    "    limit: 1000000\n"
    "    window: 1h\n"
    "  - name: big2\n"
    "    match: { t: \"~^(big2|both)$\" }\n"
    "    key: \"${user}\"\n"
    "    limit: 1000000\n"
    "    window: 1h\n";

static void
start_split(struct h_daemon *d, int seed)
{
	char yaml[2048];

	memset(d, 0, sizeof(*d));
	snprintf(yaml, sizeof(yaml), split_fmt, seed);
	d->redis_port = seed;
	h_daemon_start(d, yaml);
}

/* TRYAGAIN errors node i has answered (INFO errorstats). */
static long long
tryagains_on(int i)
{
	redisReply *r = redisCommand(h_redis_ctx(&cluster.node[i]),
	    "INFO errorstats");
	const char *at;
	long long n = 0;

	ck_assert(r != NULL && r->type == REDIS_REPLY_STRING);
	if ((at = strstr(r->str, "errorstat_TRYAGAIN:count=")) != NULL)
		n = atoll(at + strlen("errorstat_TRYAGAIN:count="));
	freeReplyObject(r);
	return n;
}

/* Units of a key on the destination of a migration (ASKING first). */
static long long
units_importing(const struct migration *m, const char *key)
{
	freeReplyObject(redisCommand(h_redis_ctx(&cluster.node[m->dst]),
	    "ASKING"));
	return units_on(m->dst, key);
}

/* The migration of m's slot completed: key, left on the source, moved
 * too, then the slot the destination's. */
static void
migration_finish(const struct migration *m, const char *key)
{
	migrate_key(m, key);
	migration_end(m);
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
}

#define STREAMS	   8
#define PER_STREAM 40

/* One client sending body PER_STREAM times, one request after another. */
struct stream {
	pthread_t thread;
	int port;
	const char *body;
	int ok, other;
	long long slowest_ms;
};

static void *
stream_run(void *arg)
{
	struct stream *w = arg;
	struct h_resp r = { 0 };
	CURL *c = h_curl_new();
	long long t0;
	int k;

	for (k = 0; k < PER_STREAM; k++) {
		t0 = h_now_ms();
		if (h_request(c, w->port, &r, "POST", "/acquire", w->body,
			strlen(w->body), NULL) == 0 &&
		    r.status == 200 && h_json_get(&r, "degraded") == NULL)
			w->ok++;
		else
			w->other++;
		if (h_now_ms() - t0 > w->slowest_ms)
			w->slowest_ms = h_now_ms() - t0;
	}
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return NULL;
}

/*
 * Two streams of requests, rules "big" and "big2", keys in one slot; the
 * slot is being migrated and only big's key has moved.  The daemon
 * batches requests of one slot into one script call, and a call with
 * both keys is answered TRYAGAIN for as long as the migration lasts:
 * resent whole, the batch met it until the deadline, and both requests
 * got the failure policy's answer (503 here) after redis.timeout.  Each
 * request goes again alone instead: big's is ASKed to the destination,
 * big2's runs on the source, and each is counted once, where its key is.
 */
START_TEST(test_tryagain_batch_split)
{
	const char *big = "cl:big:{k5}", *big2 = "cl:big2:{k5}";
	struct stream w[STREAMS];
	long long before, slowest = 0;
	int i, ok[2] = { 0, 0 }, other = 0;
	struct migration m;
	struct h_daemon d;

	ck_assert_uint_eq(slot_map_keyslot(big, strlen(big)),
	    slot_map_keyslot(big2, strlen(big2)));
	start_split(&d, cluster.node[0].port);
	ck_assert_int_eq(acquire("{\"t\":\"big\",\"user\":\"k5\"}"), 200);
	ck_assert_int_eq(acquire("{\"t\":\"big2\",\"user\":\"k5\"}"), 200);
	migration_start(&m, big);
	before = tryagains_on(m.src);
	memset(w, 0, sizeof(w));
	for (i = 0; i < STREAMS; i++) {
		w[i].port = d.port;
		w[i].body = i % 2 == 0 ? "{\"t\":\"big\",\"user\":\"k5\"}" :
					 "{\"t\":\"big2\",\"user\":\"k5\"}";
		ck_assert(pthread_create(&w[i].thread, NULL, stream_run,
			      &w[i]) == 0);
	}
	for (i = 0; i < STREAMS; i++) {
		pthread_join(w[i].thread, NULL);
		ok[i % 2] += w[i].ok;
		other += w[i].other;
		if (w[i].slowest_ms > slowest)
			slowest = w[i].slowest_ms;
	}
	/* The scenario happened: the source refused a call whose keys
	 * were split (two requests of both rules in one batch). */
	fprintf(stderr,
	    "cluster TRYAGAIN: %lld on the source, %d of %d requests decided "
	    "by Redis, slowest %lld ms\n",
	    tryagains_on(m.src) - before, ok[0] + ok[1], STREAMS * PER_STREAM,
	    slowest);
	ck_assert_int_ge(tryagains_on(m.src) - before, 1);
	ck_assert_msg(other == 0,
	    "%d of %d requests not decided by Redis (slowest %lld ms)", other,
	    STREAMS * PER_STREAM, slowest);
	ck_assert_int_eq(ok[0], STREAMS / 2 * PER_STREAM);
	ck_assert_int_eq(ok[1], STREAMS / 2 * PER_STREAM);
	/* Counted once each, where its key is. */
	ck_assert_int_eq(units_importing(&m, big), 1 + ok[0]);
	ck_assert_int_eq(units_on(m.src, big2), 1 + ok[1]);
	migration_finish(&m, big2);
	ck_assert_int_eq(units_on(m.dst, big), 1 + ok[0]);
	ck_assert_int_eq(units_on(m.dst, big2), 1 + ok[1]);
	h_daemon_stop(&d);
}
END_TEST

/*
 * One request whose own keys are split by the migration (both rules, big's
 * key moved) meets TRYAGAIN alone, again and again: it gets the failure
 * policy's answer at redis.timeout, and the log says why, naming the
 * source (not the seed, when the seed is another node): the slot was being
 * migrated, not "no primary known".  Nothing is recorded for it.
 */
START_TEST(test_tryagain_alone_logged)
{
	const char *big = "cl:big:{k7}", *big2 = "cl:big2:{k7}";
	char what[128];
	struct migration m;
	struct h_daemon d;
	int seed;

	ck_assert_int_ge(owner_of(big), 0);
	seed = other_primary(owner_of(big));
	start_split(&d, cluster.node[seed].port);
	ck_assert_int_eq(acquire("{\"t\":\"both\",\"user\":\"k7\"}"), 200);
	migration_start(&m, big);
	ck_assert_int_eq(acquire("{\"t\":\"both\",\"user\":\"k7\"}"), 503);
	snprintf(what, sizeof(what), "redis 127.0.0.1:%d: no answer within",
	    cluster.node[m.src].port);
	ck_assert_msg(h_file_count(d.log, what) == 1, "no line \"%s\"", what);
	ck_assert_int_eq(h_file_count(d.log,
			     "(TRYAGAIN: its slot was being "
			     "migrated"),
	    1);
	ck_assert_int_eq(h_file_count(d.log, "no primary known"), 0);
	ck_assert_int_eq(units_importing(&m, big), 1);
	ck_assert_int_eq(units_on(m.src, big2), 1);
	migration_finish(&m, big2);
	h_daemon_stop(&d);
}
END_TEST

/* --- a primary killed under load ---------------------------------------- */

/* A lease released while its key's slot migrates: the source answers
 * ASK, and lease.lua runs on the destination after ASKING. */
START_TEST(test_lease_release_ask)
{
	const char *key = "cl:lk:{m2}";
	char body[1024];
	struct migration m;
	struct h_daemon d;
	struct h_resp r = { 0 };

	start(&d, cluster.node[0].port, "2s", 3);
	h_http(&r, "POST", "/acquire", "{\"t\":\"lock\",\"user\":\"m2\"}",
	    NULL);
	ck_assert_int_eq(r.status, 200);
	snprintf(body, sizeof(body), "{\"lease\":\"%s\"}",
	    json_string_value(json_object_get(
		json_array_get(h_json_get(&r, "leases"), 0), "lease")));
	migration_start(&m, key);
	h_http(&r, "POST", "/release", body, NULL);
	ck_assert_msg(r.status == 200 &&
		strstr(r.body, "\"released\":true") != NULL,
	    "release during the migration: %ld %s", r.status, r.body);
	freeReplyObject(redisCommand(h_redis_ctx(&cluster.node[m.dst]),
	    "ASKING"));
	ck_assert_int_eq(h_redis_int(&cluster.node[m.dst], "EXISTS %s", key),
	    0);
	migration_end(&m);
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/* A request that waits for the lock, on another daemon than the one the
 * holder releases through. */
struct lock_waiter {
	pthread_t thread;
	int port;
	char body[128];
	long status;
	long long answered_ms;
	char answer[512];
};

static void *
lock_wait_run(void *arg)
{
	struct lock_waiter *w = arg;
	struct h_resp r = { 0 };
	CURL *c = h_curl_new();

	if (h_request(c, w->port, &r, "POST", "/acquire", w->body,
		strlen(w->body), NULL) == 0)
		w->status = r.status;
	w->answered_ms = h_now_ms();
	snprintf(w->answer, sizeof(w->answer), "%s",
	    r.body != NULL ? r.body : r.err);
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return NULL;
}

/*
 * Waiting for a lease across daemons on a Cluster: a release through one
 * daemon is PUBLISHed on the node of its key, and the other daemon, which
 * subscribes on one node only, hears it there as from every node.  One
 * key on each primary: the waiter is served soon after the release, long
 * before the lease (1 h) would expire.
 */
START_TEST(test_lease_wait_across_nodes)
{
	struct h_daemon a, b;
	struct h_resp r = { 0 };
	struct lock_waiter w;
	char key[64], user[16], body[1024];
	bool done[H_CLUSTER_NODES] = { false };
	long long released;
	int i, owner, keys = 0;

	start(&a, cluster.node[0].port, "2s", 3);
	start(&b, cluster.node[0].port, "2s", 3);
	for (i = 0; i < 200 && keys < 3; i++) {
		snprintf(user, sizeof(user), "w%d", i);
		snprintf(key, sizeof(key), "cl:lk:{%s}", user);
		owner = owner_of(key);
		ck_assert_int_ge(owner, 0);
		if (done[owner])
			continue;
		done[owner] = true;
		keys++;
		snprintf(body, sizeof(body), "{\"t\":\"lock\",\"user\":\"%s\"}",
		    user);
		h_post(a.port, "/acquire", body, &r);
		ck_assert_int_eq(r.status, 200);
		snprintf(body, sizeof(body), "{\"lease\":\"%s\"}",
		    json_string_value(json_object_get(
			json_array_get(h_json_get(&r, "leases"), 0), "lease")));
		memset(&w, 0, sizeof(w));
		w.port = b.port;
		snprintf(w.body, sizeof(w.body),
		    "{\"t\":\"lock\",\"user\":"
		    "\"%s\",\"wait_ms\":10000}",
		    user);
		ck_assert_int_eq(pthread_create(&w.thread, NULL, lock_wait_run,
				     &w),
		    0);
		h_sleep_ms(300);
		released = h_now_ms();
		h_post(a.port, "/release", body, &r);
		ck_assert_msg(strstr(r.body, "\"released\":true") != NULL, "%s",
		    r.body);
		pthread_join(w.thread, NULL);
		ck_assert_msg(w.status == 200 &&
			strstr(w.answer, "\"leases\"") != NULL,
		    "waiter for %s (node %d): %ld %s", user, owner, w.status,
		    w.answer);
		ck_assert_msg(w.answered_ms - released < 1500,
		    "waiter for %s "
		    "(node %d) answered %lld ms after the release",
		    user, owner, w.answered_ms - released);
		printf(
		    "cluster: waiter for a key on node %d served %lld ms "
		    "after the release through the other daemon\n",
		    owner, w.answered_ms - released);
	}
	ck_assert_int_eq(keys, 3);
	h_resp_free(&r);
	h_daemon_stop(&b);
	h_daemon_stop(&a);
}
END_TEST

/* Subscribers of "cl:released" on node i of c (PUBSUB NUMSUB is per
 * node under Cluster). */
static long long
release_subscribers(struct h_cluster *c, int i)
{
	redisReply *r = redisCommand(h_redis_ctx(&c->node[i]),
	    "PUBSUB NUMSUB cl:released");
	long long n;

	ck_assert(r != NULL && r->type == REDIS_REPLY_ARRAY &&
	    r->elements == 2 && r->element[1]->type == REDIS_REPLY_INTEGER);
	n = r->element[1]->integer;
	freeReplyObject(r);
	return n;
}

/* Whether node i of c is a replica (ROLE). */
static bool
is_replica(struct h_cluster *c, int i)
{
	redisReply *r = redisCommand(h_redis_ctx(&c->node[i]), "ROLE");
	bool replica;

	ck_assert(r != NULL && r->type == REDIS_REPLY_ARRAY &&
	    r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING);
	replica = strcmp(r->element[0]->str, "slave") == 0;
	freeReplyObject(r);
	return replica;
}

/*
 * A node removed from the cluster while the release subscription is on
 * it: `redis-cli --cluster del-node` resets the node and leaves it
 * running, so the connection stays up and hears no PUBLISH of the cluster
 * any more.  Daemon B's only seed is a replica (it owns no slot), which is
 * then deleted: B must hear the release made through daemon A all the
 * same, and serve its waiter long before wait_ms.  Before, B stayed
 * subscribed on the deleted node and its waiter waited the whole wait_ms.
 * A cluster of its own: the deletion changes it.
 */
START_TEST(test_release_heard_after_del_node)
{
	struct h_cluster c;
	struct h_daemon a, b;
	struct h_resp r = { 0 };
	struct lock_waiter w;
	char body[256], id[64], log[H_PATH_MAX + 16], from[32];
	char *argv[8];
	redisReply *rep;
	long long released, end, subs;
	int i, rep_i = -1, prim_i = -1;

	h_cluster_start(&c);
	for (i = 0; i < H_CLUSTER_NODES; i++) {
		if (is_replica(&c, i))
			rep_i = rep_i < 0 ? i : rep_i;
		else
			prim_i = prim_i < 0 ? i : prim_i;
	}
	ck_assert(rep_i >= 0 && prim_i >= 0);
	rep = redisCommand(h_redis_ctx(&c.node[rep_i]), "CLUSTER MYID");
	ck_assert(rep != NULL && rep->type == REDIS_REPLY_STRING);
	snprintf(id, sizeof(id), "%s", rep->str);
	freeReplyObject(rep);

	start(&a, c.node[prim_i].port, "2s", 3);
	start(&b, c.node[rep_i].port, "2s", 3);
	/* Both daemons subscribed, wherever. */
	end = h_now_ms() + 5000;
	do {
		h_sleep_ms(100);
		for (subs = 0, i = 0; i < H_CLUSTER_NODES; i++)
			subs += release_subscribers(&c, i);
	} while (subs < 2 && h_now_ms() < end);
	ck_assert_int_eq(subs, 2);
	printf("cluster: subscribers on the replica to delete: %lld\n",
	    release_subscribers(&c, rep_i));

	snprintf(from, sizeof(from), "127.0.0.1:%d", c.node[prim_i].port);
	snprintf(log, sizeof(log), "%s/del-node.log", h_tmpdir());
	argv[0] = (char *)"redis-cli";
	argv[1] = (char *)"--cluster";
	argv[2] = (char *)"del-node";
	argv[3] = from;
	argv[4] = id;
	argv[5] = NULL;
	if (h_run(argv, log) != 0) {
		h_print_file("redis-cli --cluster del-node", log);
		ck_abort_msg("redis-cli --cluster del-node failed");
	}
	/* It still runs, outside the cluster. */
	rep = redisCommand(h_redis_ctx(&c.node[rep_i]), "CLUSTER INFO");
	ck_assert(rep != NULL && rep->type == REDIS_REPLY_STRING &&
	    strstr(rep->str, "cluster_known_nodes:1\r\n") != NULL);
	freeReplyObject(rep);
	h_sleep_ms(500);

	h_post(a.port, "/acquire", "{\"t\":\"lock\",\"user\":\"dn\"}", &r);
	ck_assert_int_eq(r.status, 200);
	snprintf(body, sizeof(body), "{\"lease\":\"%s\"}",
	    json_string_value(json_object_get(
		json_array_get(h_json_get(&r, "leases"), 0), "lease")));
	memset(&w, 0, sizeof(w));
	w.port = b.port;
	snprintf(w.body, sizeof(w.body),
	    "{\"t\":\"lock\",\"user\":\"dn\",\"wait_ms\":3000}");
	ck_assert_int_eq(pthread_create(&w.thread, NULL, lock_wait_run, &w), 0);
	h_sleep_ms(300);
	released = h_now_ms();
	h_post(a.port, "/release", body, &r);
	ck_assert_msg(strstr(r.body, "\"released\":true") != NULL, "%s",
	    r.body);
	pthread_join(w.thread, NULL);
	ck_assert_msg(w.status == 200 && strstr(w.answer, "\"leases\"") != NULL,
	    "waiter (wait_ms 3000): %ld after %lld ms: %s", w.status,
	    w.answered_ms - released, w.answer);
	ck_assert_msg(w.answered_ms - released < 1500,
	    "waiter answered %lld ms after the release",
	    w.answered_ms - released);
	printf(
	    "cluster: after del-node, waiter served %lld ms after the "
	    "release through the other daemon\n",
	    w.answered_ms - released);
	h_resp_free(&r);
	h_daemon_stop(&b);
	h_daemon_stop(&a);
	h_cluster_stop(&c);
}
END_TEST

/*
 * A take-back whose slot migrates: the request's units went to the
 * destination by ASK, its other slot denied, and the take-back, sent to
 * the source, is asked on too.  takeback.lua must run there after ASKING
 * (before: ratelimit.lua ran instead and recorded the units again).
 */
START_TEST(test_takeback_ask)
{
	static const char body[] = "{\"t\":\"pair\",\"user\":\"m3\"}";
	const char *wide = "cl:wide:{m3}";
	struct migration m;
	struct h_daemon d;
	int i;

	start(&d, cluster.node[0].port, "2s", 3);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(acquire(body), 200);
	migration_start(&m, wide);
	/* narrow (3) is full: denied, and wide's unit taken back. */
	ck_assert_int_eq(acquire(body), 429);
	migration_end(&m);
	ck_assert_int_eq(units_on(m.dst, wide), 3);
	ck_assert_int_eq(
	    h_metric("ratelimitd_redis_takebacks_total{result=\"failed\"}"), 0);
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
	h_daemon_stop(&d);
}
END_TEST

/*
 * A part whose primary hangs (SIGSTOP, each time for less than the
 * cluster's node timeout, so no replica takes over), on a daemon whose
 * redis.timeout is short and whose failure policy is deny (503):
 * - narrow full, wide's primary hung: narrow's denial decides (429), it
 *   is not turned into the failure policy's answer;
 * - narrow's primary hung: the request fails (503) at its deadline, and
 *   the unit wide's slot recorded is still taken back, after the answer,
 *   from keys the answered request no longer owns;
 * - both keys on one hung primary, in two slots: once that primary is
 *   marked down, each part fails inside routing and the request is
 *   answered at once.
 * The commands a hung primary holds run when it resumes; what they
 * record is not asserted (docs/scale.md).
 */

/* A user named prefix<n> whose wide and narrow keys are in different
 * slots, on different primaries (same = false) or on one (same = true);
 * the keys into key[] and nkey[]. */
static void
pick_user(const char *prefix, bool same, char *user, size_t len, char *key,
    char *nkey, size_t klen)
{
	int i;

	for (i = 0; i < 1000; i++) {
		int a, b;

		snprintf(user, len, "%s%d", prefix, i);
		snprintf(key, klen, "cl:wide:{%s}", user);
		snprintf(nkey, klen, "cl:narrow:{%s:n}", user);
		if (slot_map_keyslot(key, strlen(key)) ==
		    slot_map_keyslot(nkey, strlen(nkey)))
			continue;
		a = owner_of(key);
		b = owner_of(nkey);
		if (a >= 0 && b >= 0 && (a == b) == same)
			return;
	}
	ck_abort_msg("no user with its keys as wanted");
}

/* POST /acquire body with node i stopped: the status, and the body's
 * "rule" into rule (empty if none); the node resumes before any check. */
static long
acquire_hung(int i, const char *body, char *rule, size_t rlen)
{
	struct h_resp r = { 0 };
	json_t *j;
	long status;

	kill(cluster.node[i].pid, SIGSTOP);
	h_http(&r, "POST", "/acquire", body, NULL);
	kill(cluster.node[i].pid, SIGCONT);
	status = r.status;
	rule[0] = '\0';
	if ((j = h_json(&r)) != NULL &&
	    json_is_string(json_object_get(j, "rule")))
		snprintf(rule, rlen, "%s",
		    json_string_value(json_object_get(j, "rule")));
	h_resp_free(&r);
	return status;
}

START_TEST(test_across_slots_primary_hung)
{
	char user[32], key[64], nkey[64], body[128], rule[32];
	struct h_daemon d;
	long long t0, took = 0;
	long status = 0;
	int i, node;

	start(&d, cluster.node[0].port, "150ms", 3);

	/* narrow full; wide's primary hung: narrow decides. */
	pick_user("a", false, user, sizeof(user), key, nkey, sizeof(key));
	snprintf(body, sizeof(body), "{\"t\":\"pair\",\"user\":\"%s\"}", user);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(acquire(body), 200);
	status = acquire_hung(owner_of(key), body, rule, sizeof(rule));
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
	ck_assert_int_eq(status, 429);
	ck_assert_str_eq(rule, "narrow");

	/* narrow's primary hung: 503 at the deadline, and wide's unit
	 * taken back after the answer. */
	pick_user("b", false, user, sizeof(user), key, nkey, sizeof(key));
	snprintf(body, sizeof(body), "{\"t\":\"pair\",\"user\":\"%s\"}", user);
	status = acquire_hung(owner_of(nkey), body, rule, sizeof(rule));
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
	ck_assert_int_eq(status, 503);
	ck_assert_int_eq(
	    h_metric_settles("ratelimitd_redis_takebacks_total{result=\"ok\"}",
		1),
	    1);
	ck_assert_int_eq(units_on(owner_of(key), key), 0);

	/* Both keys on one hung primary: once it is marked down, the
	 * request is answered at once. */
	pick_user("c", true, user, sizeof(user), key, nkey, sizeof(key));
	snprintf(body, sizeof(body), "{\"t\":\"pair\",\"user\":\"%s\"}", user);
	node = owner_of(key);
	kill(cluster.node[node].pid, SIGSTOP);
	for (i = 0; i < 8; i++) {
		t0 = h_now_ms();
		status = acquire(body);
		took = h_now_ms() - t0;
		if (took < 100)
			break;
	}
	kill(cluster.node[node].pid, SIGCONT);
	ck_assert(h_cluster_wait_ok(&cluster, 20000));
	ck_assert_int_eq(status, 503);
	ck_assert_msg(took < 100, "the last request took %lld ms", took);
	ck_assert_int_eq(get_status("/healthz"), 200);
	h_daemon_stop(&d);
}
END_TEST

/*
 * A denial decided while a take-back was pending is not repeated by the
 * deny cache once the units are back (docs/algorithms.md: such a denial
 * only for less than one round trip).  wide (fixed_window, 10) is at 9 and
 * narrow (3) full, on another primary, paused: a pair request R1 records
 * wide's tenth unit and waits for narrow; meanwhile a solo request R2 on
 * wide alone is denied.  narrow then denies R1 and its unit on wide is
 * taken back: a solo request is admitted (the deny cache must have
 * dropped R2's denial), and wide holds 10.
 */
struct pending {
	pthread_t thread;
	int port;
	const char *body;
	long status;
};

static void *
pending_acquire(void *arg)
{
	struct pending *p = arg;
	struct h_resp r = { 0 };
	CURL *c = h_curl_new();

	if (h_request(c, p->port, &r, "POST", "/acquire", p->body,
		strlen(p->body), NULL) == 0)
		p->status = r.status;
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return NULL;
}

/* The count of fixed_window key on primary i (0 if none). */
static long long
fixed_count(int i, const char *key)
{
	redisReply *r = redisCommand(h_redis_ctx(&cluster.node[i]), "HGET %s n",
	    key);
	long long n = 0;

	ck_assert_ptr_nonnull(r);
	if (r->type == REDIS_REPLY_STRING)
		n = atoll(r->str);
	freeReplyObject(r);
	return n;
}

/* The gap of one take-back: a user whose wide (fixed_window, 10) and
 * narrow keys live on different primaries, and the pending request R1. */
struct gap {
	char user[32], key[64], nkey[64], pair[128], solo[128];
	int xnode, ynode;
	struct pending r1;
};

/* Pick g's user and, through h_daemon_current(), fill narrow (3 pairs)
 * and bring wide to 9 (6 solos more). */
static void
gap_fill(struct gap *g, const char *prefix)
{
	int i;

	memset(g, 0, sizeof(*g));
	pick_user(prefix, false, g->user, sizeof(g->user), g->key, g->nkey,
	    sizeof(g->key));
	g->xnode = owner_of(g->key);
	g->ynode = owner_of(g->nkey);
	snprintf(g->pair, sizeof(g->pair), "{\"t\":\"pair\",\"user\":\"%s\"}",
	    g->user);
	snprintf(g->solo, sizeof(g->solo), "{\"t\":\"solo\",\"user\":\"%s\"}",
	    g->user);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(acquire(g->pair), 200);
	for (i = 0; i < 6; i++)
		ck_assert_int_eq(acquire(g->solo), 200);
	ck_assert_int_eq(fixed_count(g->xnode, g->key), 9);
}

/* R1, a pair, through the daemon on port: wide records its tenth unit,
 * narrow's primary is paused, so R1 waits (join it with gap_join()). */
static void
gap_hold(struct gap *g, int port)
{
	redisReply *rp;
	long long t0;

	rp = redisCommand(h_redis_ctx(&cluster.node[g->ynode]),
	    "CLIENT PAUSE 1500");
	ck_assert(rp != NULL && rp->type == REDIS_REPLY_STATUS);
	freeReplyObject(rp);
	g->r1.port = port;
	g->r1.body = g->pair;
	ck_assert(pthread_create(&g->r1.thread, NULL, pending_acquire,
		      &g->r1) == 0);
	t0 = h_now_ms();
	while (fixed_count(g->xnode, g->key) < 10 && h_now_ms() - t0 < 1000)
		h_sleep_ms(5);
	ck_assert_int_eq(fixed_count(g->xnode, g->key), 10);
}

/* R1 denied by narrow, and its unit on wide taken back. */
static void
gap_join(struct gap *g)
{
	pthread_join(g->r1.thread, NULL);
	ck_assert_int_eq(g->r1.status, 429);
	ck_assert_int_eq(fixed_count(g->xnode, g->key), 9);
}

/* Through h_daemon_current(), whose deny cache answered nothing yet: the
 * unit is back, so a solo is admitted, not denied from the deny cache;
 * a denial learnt after the take-back is kept as before. */
static void
gap_after(struct gap *g)
{
	ck_assert_int_eq(acquire(g->solo), 200);
	ck_assert_int_eq(fixed_count(g->xnode, g->key), 10);
	ck_assert_int_eq(h_metric("ratelimitd_deny_cache_hits_total"), 0);
	ck_assert_int_eq(acquire(g->solo), 429);
	ck_assert_int_eq(acquire(g->solo), 429);
	ck_assert_int_eq(h_metric("ratelimitd_deny_cache_hits_total"), 1);
}

START_TEST(test_takeback_frees_deny_cache)
{
	char yaml[2048];
	struct h_daemon d;
	struct gap g;

	memset(&d, 0, sizeof(d));
	snprintf(yaml, sizeof(yaml), algo_fmt, cluster.node[0].port,
	    "fixed_window");
	h_daemon_start(&d, yaml);
	gap_fill(&g, "dc");
	gap_hold(&g, d.port);
	/* R2, while R1's unit is held: denied by Redis. */
	ck_assert_int_eq(acquire(g.solo), 429);
	gap_join(&g);
	ck_assert_int_eq(
	    h_metric_settles("ratelimitd_redis_takebacks_total{result=\"ok\"}",
		1),
	    1);
	gap_after(&g);
	h_daemon_stop(&d);
}
END_TEST

/*
 * The same gap seen from another daemon: R1 goes through daemon A, R2 (a
 * solo, denied while R1's unit is held) through daemon B.  A's take-back
 * PUBLISHes wide's key, followed by a NUL byte, on the release channel,
 * and B forgets the denial it learnt: its next solo is admitted, not
 * answered from its deny cache.
 */
START_TEST(test_takeback_frees_other_daemons_deny_cache)
{
	char yaml[2048];
	struct h_daemon a, b;
	struct timeval tv = { 2, 0 };
	struct gap g;
	redisContext *sub;
	redisReply *rp;
	void *reply = NULL;
	int other;
	bool heard = false;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	snprintf(yaml, sizeof(yaml), algo_fmt, cluster.node[0].port,
	    "fixed_window");
	h_daemon_start(&a, yaml);
	h_daemon_start(&b, yaml); /* h_http()'s from here on */
	gap_fill(&g, "dd");

	/* A listener of its own, on a node that owns neither key: Cluster
	 * carries a PUBLISH to every node. */
	for (other = 0; other == g.xnode || other == g.ynode; other++)
		;
	sub = redisConnectWithTimeout("127.0.0.1", cluster.node[other].port,
	    tv);
	ck_assert(sub != NULL && sub->err == 0);
	ck_assert(redisSetTimeout(sub, tv) == REDIS_OK);
	rp = redisCommand(sub, "SUBSCRIBE cl:released");
	ck_assert(rp != NULL && rp->type == REDIS_REPLY_ARRAY);
	freeReplyObject(rp);

	gap_hold(&g, a.port);
	/* R2 through B, while R1's unit is held: denied by Redis, and the
	 * denial remembered by B. */
	ck_assert_int_eq(acquire(g.solo), 429);
	gap_join(&g);

	/* The notice: wide's key and one NUL byte. */
	while (!heard && redisGetReply(sub, &reply) == REDIS_OK) {
		rp = reply;
		heard = rp->type == REDIS_REPLY_ARRAY && rp->elements == 3 &&
		    rp->element[2]->type == REDIS_REPLY_STRING &&
		    rp->element[2]->len == strlen(g.key) + 1 &&
		    memcmp(rp->element[2]->str, g.key, strlen(g.key) + 1) == 0;
		freeReplyObject(rp);
	}
	redisFree(sub);
	ck_assert_msg(heard, "no take-back notice of %s", g.key);
	/* B's own subscription hears it within moments of ours. */
	h_sleep_ms(200);
	gap_after(&g);
	h_daemon_stop(&b);
	h_daemon_stop(&a);
}
END_TEST

/*
 * The log names the node each failure is about: the seed is another
 * primary than the victim, and the lines about the victim's lost
 * connections and calls say its host:port, not the seed's.
 */
START_TEST(test_primary_killed_failover)
{
	const char *key = "cl:one:{k1}";
	char victim_is[64], seed_lost[64];
	struct h_daemon d;
	struct h_load *load;
	int victim, seed;

	victim = owner_of(key);
	ck_assert_int_ge(victim, 0);
	seed = other_primary(victim);
	start(&d, cluster.node[seed].port, "500ms", 1000000);
	ck_assert_int_eq(acquire("{\"t\":\"one\",\"user\":\"k1\"}"), 200);
	snprintf(victim_is, sizeof(victim_is),
	    "redis 127.0.0.1:%d: ", cluster.node[victim].port);
	snprintf(seed_lost, sizeof(seed_lost),
	    "redis 127.0.0.1:%d: connection lost", cluster.node[seed].port);
	/* Load on keys of every primary while one of them dies. */
	load = h_load_start(d.port, 4, "{\"t\":\"one\",\"user\":\"l%d\"}");
	h_sleep_ms(300);
	/* The runner started it and reaps it when the suite ends. */
	kill(cluster.node[victim].pid, SIGKILL);
	cluster.node[victim].pid = 0;
	(void)h_failover_measure("cluster", "{\"t\":\"one\",\"user\":\"k1\"}",
	    load, 30000, 500);
	ck_assert_int_ge(h_metric("ratelimitd_redis_topology_refreshes_total"),
	    2);
	ck_assert_int_eq(get_status("/readyz"), 200);
	ck_assert_msg(h_file_count(d.log, victim_is) >= 1,
	    "no log line names the killed primary (\"%s\")", victim_is);
	ck_assert_int_eq(h_file_count(d.log, seed_lost), 0);
	h_daemon_stop(&d);
}
END_TEST

/* GET /readyz of the daemon on port: its status. */
static long
readyz_on(int port)
{
	struct h_resp r = { 0 };
	CURL *c = h_curl_new();
	long status;

	ck_assert_msg(h_request(c, port, &r, "GET", "/readyz", NULL, 0, NULL) ==
		0,
	    "/readyz: %s", r.err);
	status = r.status;
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return status;
}

/* Every 20 ms, GET /readyz of idle and of busy, and POST body to busy's
 * /acquire, until both have answered want once, at most ms: in idle_ms
 * and busy_ms when each first did, or -1. */
static void
readyz_until(const struct h_daemon *idle, const struct h_daemon *busy,
    long want, const char *body, long long ms, long long *idle_ms,
    long long *busy_ms)
{
	long long start = h_now_ms();
	struct h_resp r = { 0 };

	*idle_ms = *busy_ms = -1;
	do {
		if (*idle_ms < 0 && readyz_on(idle->port) == want)
			*idle_ms = h_now_ms() - start;
		if (*busy_ms < 0 && readyz_on(busy->port) == want)
			*busy_ms = h_now_ms() - start;
		h_post(busy->port, "/acquire", body, &r);
		h_sleep_ms(20);
	} while ((*idle_ms < 0 || *busy_ms < 0) && h_now_ms() - start < ms);
	h_resp_free(&r);
}

/*
 * /readyz while a primary that does not own slot 0 is down
 * (docs/scale.md): 503 while its slots have no answering primary, 200
 * again once the failover's map names its replica; on daemon idle, which
 * gets no request, as on busy, which gets requests for the dead
 * primary's slots meanwhile (its breaker opens).  Then, with the old
 * primary still dead, busy no longer reads the slot map twice a second.
 * Before, the probe PINGed slot 0's primary only and /readyz answered 200
 * throughout, and the dead node's breaker, open for good (it owned no
 * slot any more, so nothing tried it again), kept the topology watched:
 * about 2 refreshes a second for as long as it stayed dead.  A cluster of
 * its own: the kill changes it.
 */
START_TEST(test_readyz_primary_down_then_failover)
{
	struct h_cluster c;
	struct h_daemon idle, busy;
	char body[128], key[64];
	long long idle_down, busy_down, idle_up, busy_up, r0, r1;
	int i, victim, seed, user = -1;

	h_cluster_start(&c);
	seed = h_cluster_owner(&c, 0);
	victim = h_cluster_owner(&c, SLOT_MAP_SLOTS - 1);
	ck_assert(seed >= 0 && victim >= 0 && seed != victim);
	for (i = 0; i < 1000 && user < 0; i++) {
		snprintf(key, sizeof(key), "cl:one:{rz%d}", i);
		if (h_cluster_owner(&c, slot_map_keyslot(key, strlen(key))) ==
		    victim)
			user = i;
	}
	ck_assert(user >= 0);
	snprintf(body, sizeof(body), "{\"t\":\"one\",\"user\":\"rz%d\"}", user);
	start(&idle, c.node[seed].port, "500ms", 1000000);
	start(&busy, c.node[seed].port, "500ms", 1000000);
	readyz_until(&idle, &busy, 200, body, 5000, &idle_up, &busy_up);
	ck_assert_msg(idle_up >= 0 && busy_up >= 0,
	    "/readyz not 200 before the kill");
	ck_assert_int_eq(acquire(body), 200);

	kill(c.node[victim].pid, SIGKILL);
	h_redis_stop(&c.node[victim]); /* reaps it */
	readyz_until(&idle, &busy, 503, body, 10000, &idle_down, &busy_down);
	readyz_until(&idle, &busy, 200, body, 30000, &idle_up, &busy_up);
	h_sleep_ms(1000);
	r0 = h_metric("ratelimitd_redis_topology_refreshes_total");
	h_sleep_ms(3000);
	r1 = h_metric("ratelimitd_redis_topology_refreshes_total");
	printf(
	    "cluster: primary of slots past 0 killed: /readyz 503 after "
	    "%lld ms (idle daemon) and %lld ms (busy), 200 again %lld and "
	    "%lld ms later; slot maps read in 3 s idle after: %lld\n",
	    idle_down, busy_down, idle_up, busy_up, r1 - r0);
	fflush(stdout); /* a failed check ends the test without it */
	ck_assert_msg(idle_down >= 0 && busy_down >= 0,
	    "/readyz stayed 200 for 10 s with a primary down");
	ck_assert_msg(idle_up >= 0 && busy_up >= 0,
	    "/readyz not 200 again after the failover");
	ck_assert_int_eq(acquire(body), 200);
	ck_assert_msg(r1 - r0 <= 2,
	    "%lld slot maps read in 3 s idle after the failover", r1 - r0);
	h_daemon_stop(&busy);
	h_daemon_stop(&idle);
	h_cluster_stop(&c);
}
END_TEST

/* POST body to /acquire; its status, and in *ms how long it took. */
static long
acquire_timed(const char *body, long long *ms)
{
	long long t0 = h_now_ms();
	long status = acquire(body);

	*ms = h_now_ms() - t0;
	return status;
}

/*
 * A cluster that cannot be reached: the only seed refuses connections
 * (docs/operations.md, "When Redis fails").  Each request waits
 * redis.timeout (500 ms) for a slot map that never comes; after 5 in a
 * row the store's circuit opens and the next ones are answered by the
 * policy at once.  Once a cluster runs on that port, the daemon decides by
 * Redis again, without a restart.  Before, no circuit opened under
 * Cluster: every request waited the whole 500 ms.
 */
START_TEST(test_unreachable_cluster_circuit)
{
	static const char body[] = "{\"t\":\"one\",\"user\":\"ur\"}";
	struct h_redis r;
	struct h_daemon d;
	char extra[256];
	redisReply *rep;
	long long ms, end;
	long status = 0;
	int i, fast = 0;

	memset(&r, 0, sizeof(r));
	r.port = h_free_port();
	start(&d, r.port, "500ms", 1000000);
	for (i = 0; i < 5; i++) {
		ck_assert_int_eq(acquire_timed(body, &ms), 503);
		printf("cluster: unreachable, request %d: 503 in %lld ms\n",
		    i + 1, ms);
	}
	for (i = 0; i < 5; i++) {
		ck_assert_int_eq(acquire_timed(body, &ms), 503);
		printf("cluster: unreachable, request %d: 503 in %lld ms\n",
		    i + 6, ms);
		fast += ms < 250;
	}
	fflush(stdout);
	ck_assert_msg(fast >= 3,
	    "%d of the 5 requests after 5 timeouts answered under 250 ms",
	    fast);
	ck_assert_int_gt(h_metric("ratelimitd_redis_errors_total{kind="
				  "\"circuit_open\"}"),
	    0);

	/* A one-node cluster on the seed's port. */
	snprintf(extra, sizeof(extra),
	    "cluster-enabled yes\ncluster-config-file nodes-%d.conf\n"
	    "cluster-port %d\n",
	    r.port, h_free_port());
	r.extra = extra;
	h_redis_start(&r);
	rep = redisCommand(h_redis_ctx(&r), "CLUSTER ADDSLOTSRANGE 0 16383");
	ck_assert(rep != NULL && rep->type == REDIS_REPLY_STATUS);
	freeReplyObject(rep);
	end = h_now_ms() + 20000;
	while (h_now_ms() < end && (status = acquire(body)) != 200)
		h_sleep_ms(100);
	ck_assert_msg(status == 200,
	    "not decided by Redis within 20 s of the cluster's start");
	ck_assert_int_eq(acquire_timed(body, &ms), 200);
	h_daemon_stop(&d);
	h_redis_stop(&r);
}
END_TEST

/* Write yaml_fmt to conf with listen port 1 (never bound: --check) and
 * key_prefix prefix. */
static void
write_conf_with_prefix(const char *conf, const char *prefix)
{
	char yaml[2048];
	const char *port, *p;
	FILE *f;

	snprintf(yaml, sizeof(yaml), yaml_fmt, 7000, "1s", 3);
	port = strstr(yaml, "%PORT%");
	p = strstr(yaml, "\"cl:\"");
	ck_assert(port != NULL && p != NULL && port < p);
	ck_assert((f = fopen(conf, "w")) != NULL);
	fprintf(f, "%.*s1%.*s\"%s\"%s", (int)(port - yaml), yaml,
	    (int)(p - port - 6), port + 6, prefix, p + 5);
	ck_assert_int_eq(fclose(f), 0);
}

/*
 * A key_prefix holding "{}" at its first '{' is refused with redis.cluster
 * (docs/configuration.md): Redis would hash each key's whole name.  With
 * "cl{}:" every stat answered 503 (a stat key's sub-windows fell in other
 * slots than the one its script ran on).  Other braces still give the keys
 * a script touches one slot, and are accepted.  No cluster is needed.
 */
START_TEST(test_key_prefix_brace_refused)
{
	static const char *const bad[] = { "cl{}:", "{}cl:" };
	static const char *const good[] = { "cl}:", "{cl}:", "cl{" };
	char conf[H_PATH_MAX + 16], out[H_PATH_MAX + 16];
	char *argv[] = { getenv("RATELIMITD_BIN"), (char *)"-c", conf,
		(char *)"--check", NULL };
	char log[1024];
	size_t i, n;
	FILE *f;

	snprintf(conf, sizeof(conf), "%s/brace.yaml", h_tmpdir());
	snprintf(out, sizeof(out), "%s/brace.out", h_tmpdir());
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_conf_with_prefix(conf, bad[i]);
		unlink(out); /* h_run appends */
		ck_assert_int_eq(h_run(argv, out), 1);
		ck_assert((f = fopen(out, "r")) != NULL);
		n = fread(log, 1, sizeof(log) - 1, f);
		log[n] = '\0';
		fclose(f);
		ck_assert_msg(strstr(log,
				  "redis.key_prefix: must not hold \"{}\" at "
				  "its first '{' with redis.cluster") != NULL,
		    "%s: %s", bad[i], log);
	}
	for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		write_conf_with_prefix(conf, good[i]);
		unlink(out);
		ck_assert_msg(h_run(argv, out) == 0, "%s refused", good[i]);
	}
}
END_TEST

static void
suite_done(void)
{
	h_cluster_stop(&cluster);
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("cluster");
	TCase *tc;

	/* First, on a cluster of its own, stopped before the shared one
	 * starts: two clusters at once may share a port freed by a node
	 * killed in the first. */
	tc = tcase_create("del_node");
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_release_heard_after_del_node);
	suite_add_tcase(s, tc);

	tc = tcase_create("readyz");
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_readyz_primary_down_then_failover);
	suite_add_tcase(s, tc);

	tc = tcase_create("unreachable");
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_unreachable_cluster_circuit);
	suite_add_tcase(s, tc);

	tc = tcase_create("cluster");
	tcase_add_unchecked_fixture(tc, cluster_up, cluster_down);
	tcase_add_checked_fixture(tc, flush_all, h_test_teardown);
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_keys_on_their_primaries);
	tcase_add_test(tc, test_stats_on_their_primaries);
	tcase_add_test(tc, test_stats_empty_hash_tag);
	tcase_add_test(tc, test_two_daemons_exact);
	tcase_add_test(tc, test_across_slots_all_or_nothing);
	tcase_add_test(tc, test_takeback_each_algorithm);
	tcase_add_test(tc, test_takeback_frees_deny_cache);
	tcase_add_test(tc, test_takeback_frees_other_daemons_deny_cache);
	tcase_add_test(tc, test_lease_release_ask);
	tcase_add_test(tc, test_lease_wait_across_nodes);
	tcase_add_test(tc, test_takeback_ask);
	tcase_add_test(tc, test_across_slots_primary_hung);
	tcase_add_test(tc, test_slot_migration_ask_then_moved);
	tcase_add_test(tc, test_slot_migration_ask_noscript);
	tcase_add_test(tc, test_tryagain_batch_split);
	tcase_add_test(tc, test_tryagain_alone_logged);
	tcase_add_test(tc, test_primary_killed_failover);
	suite_add_tcase(s, tc);

	tc = tcase_create("config");
	tcase_add_test(tc, test_key_prefix_brace_refused);
	suite_add_tcase(s, tc);
	test_main_at_end(suite_done);
	return s;
}
