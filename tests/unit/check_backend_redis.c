/*
 * check_backend_redis.c - the Redis store (backend_redis.c and
 * lua/ratelimit.lua) against a real redis-server, through backend.h only.
 *
 * The binary starts its own redis-server once, in an unchecked fixture: a
 * free loopback port, a redis.conf in a mkdtemp() directory, fork/exec, wait
 * for PING; the teardown kills it by PID and removes the directory.  Each
 * test (forked by Check) starts from FLUSHALL and inspects the server with
 * its own hiredis connection.  Failure cases use sockets made here: a port
 * nobody listens on (refused) and a listener that never accepts (timeout).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "check_main.h"

#include "core/backend.h"
#include "core/config.h"
#include "base/util.h"
#include "store/redis.h"

#define TEST_PASSWORD "t3st-pass"

static char tmpdir[48];
static int redis_port;
static pid_t redis_pid = -1;
static char redis_url[64];

/* ---- the server ------------------------------------------------------ */

static redisContext *
direct(void)
{
	struct timeval tv = { 2, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);

	if (c == NULL || c->err != 0) {
		if (c != NULL)
			redisFree(c);
		return NULL;
	}
	return c;
}

static bool
redis_answers(void)
{
	redisContext *c = direct();
	redisReply *r;
	bool ok = false;

	if (c == NULL)
		return false;
	if ((r = redisCommand(c, "PING")) != NULL) {
		ok = r->type == REDIS_REPLY_STATUS;
		freeReplyObject(r);
	}
	redisFree(c);
	return ok;
}

static void
start_redis(void)
{
	char conf[128], logf[128];
	FILE *f;
	int i;

	strcpy(tmpdir, "/tmp/check_backend_redis.XXXXXX");
	if (mkdtemp(tmpdir) == NULL) {
		perror("mkdtemp");
		exit(1);
	}
	redis_port = test_free_port();
	snprintf(redis_url, sizeof(redis_url), "redis://127.0.0.1:%d",
	    redis_port);
	snprintf(conf, sizeof(conf), "%s/redis.conf", tmpdir);
	snprintf(logf, sizeof(logf), "%s/redis.log", tmpdir);
	if ((f = fopen(conf, "w")) == NULL) {
		perror(conf);
		exit(1);
	}
	fprintf(f,
	    "port %d\nbind 127.0.0.1\nsave \"\"\nappendonly no\n"
	    "dir %s\nlogfile %s\ndaemonize no\nunixsocket %s/redis.sock\n"
	    "unixsocketperm 700\n",
	    redis_port, tmpdir, logf, tmpdir);
	fclose(f);

	if ((redis_pid = fork()) == -1) {
		perror("fork");
		exit(1);
	}
	if (redis_pid == 0) {
		/* Die with the test binary, whatever kills it. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		execlp("redis-server", "redis-server", conf, (char *)NULL);
		fprintf(stderr,
		    "\n*** check_backend_redis: cannot run "
		    "redis-server: %s (apt-get install redis-server)\n\n",
		    strerror(errno));
		_exit(127);
	}
	for (i = 0; i < 500; i++) {
		int status;

		if (redis_answers())
			return;
		if (waitpid(redis_pid, &status, WNOHANG) == redis_pid) {
			fprintf(stderr,
			    "\n*** check_backend_redis: "
			    "redis-server exited (status %d); see %s\n\n",
			    status, logf);
			exit(1);
		}
		usleep(10000);
	}
	fprintf(stderr,
	    "\n*** check_backend_redis: redis-server on port %d "
	    "did not answer PING within 5 s\n\n",
	    redis_port);
	kill(redis_pid, SIGKILL);
	exit(1);
}

static void
stop_redis(void)
{
	char path[128];

	if (redis_pid > 0) {
		kill(redis_pid, SIGTERM);
		waitpid(redis_pid, NULL, 0);
		redis_pid = -1;
	}
	snprintf(path, sizeof(path), "%s/redis.conf", tmpdir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/redis.log", tmpdir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/password", tmpdir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/redis.sock", tmpdir);
	unlink(path);
	rmdir(tmpdir);
}

/* ---- helpers --------------------------------------------------------- */

static redisReply *
cmd(const char *fmt, ...)
{
	redisContext *c = direct();
	redisReply *r;
	va_list ap;

	ck_assert_msg(c != NULL, "no direct connection to redis");
	va_start(ap, fmt);
	r = redisvCommand(c, fmt, ap);
	va_end(ap);
	ck_assert_msg(r != NULL, "direct command failed: %s", c->errstr);
	redisFree(c);
	return r;
}

static long long
cmd_int(const char *fmt, const char *key)
{
	redisReply *r = cmd(fmt, key);
	long long v;

	ck_assert_msg(r->type == REDIS_REPLY_INTEGER, "%s: reply type %d", fmt,
	    r->type);
	v = r->integer;
	freeReplyObject(r);
	return v;
}

/* The units a sliding_log key holds: the sum of n over its members
 * "<end>:<n>" (docs/algorithms.md); each member checked for that form. */
static long long
log_units(const char *key)
{
	redisReply *r = cmd("ZRANGE %s 0 -1", key);
	long long units = 0, end, n;
	size_t i;

	ck_assert_int_eq(r->type, REDIS_REPLY_ARRAY);
	for (i = 0; i < r->elements; i++) {
		ck_assert_msg(sscanf(r->element[i]->str, "%lld:%lld", &end,
				  &n) == 2 &&
			n >= 1 && end >= n,
		    "member %s", r->element[i]->str);
		units += n;
	}
	freeReplyObject(r);
	return units;
}

static void
cmd_ok(const char *fmt, ...)
{
	redisContext *c = direct();
	redisReply *r;
	va_list ap;

	ck_assert(c != NULL);
	va_start(ap, fmt);
	r = redisvCommand(c, fmt, ap);
	va_end(ap);
	ck_assert_msg(r != NULL && r->type != REDIS_REPLY_ERROR, "%s: %s", fmt,
	    r != NULL ? r->str : c->errstr);
	freeReplyObject(r);
	redisFree(c);
}

/* Undo what a failed test may have left: a password, an ACL user. */
static void
reset_server(void)
{
	redisContext *c = direct();
	redisReply *r;

	ck_assert(c != NULL);
	r = redisCommand(c, "AUTH %s", TEST_PASSWORD);
	freeReplyObject(r);
	r = redisCommand(c, "CONFIG SET requirepass %s", "");
	freeReplyObject(r);
	r = redisCommand(c, "ACL DELUSER alice");
	freeReplyObject(r);
	r = redisCommand(c, "FLUSHALL");
	ck_assert(r != NULL && r->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	redisFree(c);
}

static void
setup(void)
{
	reset_server();
}

static void
teardown(void)
{
	reset_server();
}

static struct backend *
new_backend_full(const char *url, int pool, int64_t timeout_ms,
    const char *password_file)
{
	struct redis_config rc;
	struct backend *b;
	char err[256];

	memset(&rc, 0, sizeof(rc));
	rc.url = (char *)url;
	rc.pool_size = pool;
	rc.timeout_ms = timeout_ms;
	rc.key_prefix = (char *)"rl:";
	rc.password_file = (char *)password_file;
	b = backend_redis_new(&rc, err, sizeof(err));
	ck_assert_msg(b != NULL, "backend_redis_new: %s", err);
	ck_assert_str_eq(b->name, "redis");
	return b;
}

static struct backend *
new_backend(void)
{
	return new_backend_full(redis_url, 4, 1000, NULL);
}

static struct rl_check
mk(enum rl_algorithm alg, int64_t limit, int64_t window_ms, int64_t cost,
    bool shadow, const char *key)
{
	struct rl_check c;

	c.algorithm = alg;
	c.limit = limit;
	c.window_ms = window_ms;
	c.cost = cost;
	c.shadow = shadow;
	c.key = key;
	c.keylen = strlen(key);
	return c;
}

/* decide() that must succeed; returns all_allowed. */
static bool
decide_ok(struct backend *b, const struct rl_check *checks, size_t n,
    struct rl_result *out)
{
	enum backend_error_kind kind = BACKEND_ERR_NONE;
	char err[256] = "";
	bool all = false;

	ck_assert_msg(backend_decide(b, checks, n, out, &all, &kind, err,
			  sizeof(err)) == 0,
	    "decide: kind %d: %s", (int)kind, err);
	ck_assert_int_eq(kind, BACKEND_ERR_NONE);
	return all;
}

static bool
decide1(struct backend *b, struct rl_check c, struct rl_result *out)
{
	return decide_ok(b, &c, 1, out);
}

/* decide() that must fail; returns the kind. */
static enum backend_error_kind
decide_fail(struct backend *b, struct rl_check c, char *err, size_t errlen)
{
	enum backend_error_kind kind = BACKEND_ERR_NONE;
	struct rl_result out;
	bool all = true;

	err[0] = '\0';
	ck_assert_int_eq(backend_decide(b, &c, 1, &out, &all, &kind, err,
			     errlen),
	    -1);
	ck_assert_int_ne(kind, BACKEND_ERR_NONE);
	ck_assert(err[0] != '\0');
	return kind;
}

static int64_t
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void
sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

/* ---- sliding_log ----------------------------------------------------- */

START_TEST(test_sliding_log_limit_then_deny)
{
	const char *key = "rl:login-per-ip:{1.2.3.4}";
	struct backend *b = new_backend();
	struct rl_result r;
	long long pttl;
	int i;

	for (i = 0; i < 3; i++) {
		ck_assert(decide1(b,
		    mk(RL_ALG_SLIDING_LOG, 3, 1000, 1, false, key), &r));
		ck_assert(r.allowed);
		ck_assert_int_eq(r.remaining, 2 - i);
		ck_assert_int_eq(r.retry_after_ms, 0);
		ck_assert(r.reset_ms > 990 && r.reset_ms <= 1000);
	}
	ck_assert(!decide1(b, mk(RL_ALG_SLIDING_LOG, 3, 1000, 1, false, key),
	    &r));
	ck_assert(!r.allowed);
	ck_assert_int_eq(r.remaining, 0);
	ck_assert_msg(r.retry_after_ms > 0 && r.retry_after_ms <= 1000,
	    "retry %lld", (long long)r.retry_after_ms);
	ck_assert(r.reset_ms >= r.retry_after_ms && r.reset_ms <= 1000);

	/* The key is exactly the caller's, a sorted set of 3 units. */
	ck_assert_int_eq(cmd_int("EXISTS %s", key), 1);
	ck_assert_int_eq(cmd_int("ZCARD %s", key), 3);
	/* Its TTL covers the newest unit's window, and at most W / 8 more
	 * (docs/algorithms.md, sliding_log). */
	pttl = cmd_int("PTTL %s", key);
	ck_assert_msg(pttl >= r.reset_ms - 50 && pttl <= 1000 + 125,
	    "pttl %lld, reset %lld", pttl, (long long)r.reset_ms);
	ck_assert_int_eq(cmd_int("DBSIZE", NULL), 1);

	/* After the window, everything is free again. */
	sleep_ms((int)r.retry_after_ms + 5);
	ck_assert(decide1(b, mk(RL_ALG_SLIDING_LOG, 3, 1000, 1, false, key),
	    &r));
	backend_free(b);
}
END_TEST

/* The server's clock in microseconds (TIME). */
static long long
server_us(void)
{
	redisReply *r = cmd("TIME");
	long long us;

	ck_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
	us = strtoll(r->element[0]->str, NULL, 10) * 1000000LL +
	    strtoll(r->element[1]->str, NULL, 10);
	freeReplyObject(r);
	return us;
}

/* One request on each of the script's three ways to a sliding_log check:
 * one check alone; with a fixed_window check (several plain checks); with
 * a shadow check (the general path). */
static void
ttl_round(struct backend *b)
{
	struct rl_check lean[2] = {
		mk(RL_ALG_SLIDING_LOG, 1000, 8000, 1, false, "rl:t:{lean}"),
		mk(RL_ALG_FIXED_WINDOW, 1000, 8000, 1, false, "rl:t:{fw}"),
	};
	struct rl_check gen[2] = {
		mk(RL_ALG_SLIDING_LOG, 1000, 8000, 1, false, "rl:t:{gen}"),
		mk(RL_ALG_SLIDING_LOG, 1000, 8000, 1, true, "rl:t:{sh}"),
	};
	struct rl_result r[2];

	ck_assert(decide1(b,
	    mk(RL_ALG_SLIDING_LOG, 1000, 8000, 1, false, "rl:t:{one}"), r));
	ck_assert(decide_ok(b, lean, 2, r));
	ck_assert(decide_ok(b, gen, 2, r));
}

/* A sliding_log key's TTL is renewed by the first record in each eighth of
 * W (counted from the epoch), to the end of that eighth plus W, and left
 * alone by the records after it in the same eighth: docs/algorithms.md,
 * sliding_log.  W = 8 s, so an eighth is a second of the server's clock. */
START_TEST(test_sliding_log_ttl_renewal)
{
	static const char *keys[] = { "rl:t:{one}", "rl:t:{lean}",
		"rl:t:{gen}" };
	struct backend *b = new_backend();
	long long t, t0, pttl;
	size_t i;

	/* Start early in a second, so that two rounds fit in it. */
	while ((t = server_us() % 1000000) > 200000)
		sleep_ms((int)((1000000 - t) / 1000) + 10);
	t0 = server_us();
	ttl_round(b);
	for (i = 0; i < 3; i++) {
		pttl = cmd_int("PTTL %s", keys[i]);
		ck_assert_msg(pttl > 8000 && pttl <= 9000,
		    "%s: a new key's TTL %lld", keys[i], pttl);
		cmd_ok("PEXPIRE %s 100000", keys[i]);
	}
	ttl_round(b);
	t = server_us();
	ck_assert_msg(t / 1000000 == t0 / 1000000,
	    "two rounds took %lld us: not within one second", t - t0);
	t %= 1000000;
	for (i = 0; i < 3; i++) {
		pttl = cmd_int("PTTL %s", keys[i]);
		ck_assert_msg(pttl > 90000,
		    "%s: TTL %lld renewed in the same eighth", keys[i], pttl);
		ck_assert_int_eq(log_units(keys[i]), 2);
	}
	/* The next second: the first record renews, to the end of that second
	 * plus W. */
	sleep_ms((int)((1000000 - t) / 1000) + 20);
	ttl_round(b);
	for (i = 0; i < 3; i++) {
		pttl = cmd_int("PTTL %s", keys[i]);
		ck_assert_msg(pttl > 8000 && pttl <= 9000,
		    "%s: TTL %lld after a record in a later eighth", keys[i],
		    pttl);
		ck_assert_int_eq(log_units(keys[i]), 3);
	}
	backend_free(b);
}
END_TEST

/* takeback.lua (Redis Cluster's take-back of a split request) rewrites a
 * sliding_log key's runs; it keeps the key's TTL, which a later record
 * renews only once per eighth of W, whether it shrinks the only run or
 * removes a run and renumbers the only one after it. */
extern const char rl_lua_takeback[];

START_TEST(test_takeback_keeps_ttl)
{
	const char *key = "rl:tb:{log}";
	redisReply *r;
	long long pttl;
	int i;

	for (i = 0; i < 2; i++) {
		cmd_ok("DEL %s", key);
		if (i == 0)
			cmd_ok("ZADD %s 1000 5:5", key);
		else
			cmd_ok("ZADD %s 1000 5:5 2000 7:2", key);
		cmd_ok("PEXPIRE %s 100000", key);
		r = cmd("EVAL %s 1 %s 0 10 60000 %s 1000", rl_lua_takeback, key,
		    i == 0 ? "2" : "5");
		ck_assert_msg(r->type == REDIS_REPLY_INTEGER && r->integer == 1,
		    "takeback: type %d %s", r->type,
		    r->type == REDIS_REPLY_ERROR ? r->str : "");
		freeReplyObject(r);
		ck_assert_int_eq(log_units(key), i == 0 ? 3 : 2);
		pttl = cmd_int("PTTL %s", key);
		ck_assert_msg(pttl > 90000,
		    "case %d: TTL %lld after the take-back", i, pttl);
	}
}
END_TEST

/* A take-back that cannot write fails: Redis out of memory is an error
 * reply, not "nothing to take back" (which is for a key of another type
 * only), so the daemon counts it as failed. */
START_TEST(test_takeback_fails_when_redis_refuses)
{
	/* sliding_window (algorithm 1): bucket 5 holds 3 units. */
	const char *key = "rl:tb:{sw}", *str = "rl:tb:{str}";
	redisReply *r;

	cmd_ok("DEL %s %s", key, str);
	cmd_ok("HSET %s 5 3", key);
	cmd_ok("SET %s x", str);
	/* A key of another type: nothing to take back, not an error. */
	r = cmd("EVAL %s 1 %s 1 10 60000 1 5", rl_lua_takeback, str);
	ck_assert_msg(r->type == REDIS_REPLY_INTEGER && r->integer == 0,
	    "wrong type: type %d %s", r->type,
	    r->type == REDIS_REPLY_ERROR ? r->str : "");
	freeReplyObject(r);
	cmd_ok("CONFIG SET maxmemory 1");
	r = cmd("EVAL %s 1 %s 1 10 60000 1 5", rl_lua_takeback, key);
	cmd_ok("CONFIG SET maxmemory 0");
	ck_assert_msg(r->type == REDIS_REPLY_ERROR,
	    "out of memory: type %d, integer %lld", r->type, r->integer);
	ck_assert_msg(strstr(r->str, "OOM") != NULL, "%s", r->str);
	freeReplyObject(r);
	ck_assert_int_eq(cmd_int("HSTRLEN %s 5", key), 1);
	r = cmd("HGET %s 5", key);
	ck_assert_str_eq(r->str, "3");
	freeReplyObject(r);
	/* With room again, it takes the unit back. */
	r = cmd("EVAL %s 1 %s 1 10 60000 1 5", rl_lua_takeback, key);
	ck_assert_msg(r->type == REDIS_REPLY_INTEGER && r->integer == 1,
	    "with room: type %d %s", r->type,
	    r->type == REDIS_REPLY_ERROR ? r->str : "");
	freeReplyObject(r);
	r = cmd("HGET %s 5", key);
	ck_assert_str_eq(r->str, "2");
	freeReplyObject(r);
}
END_TEST

/* A lease taken back is a release: its key is PUBLISHed on the release
 * channel given after the five values, so that requests waiting for a
 * lease of it try again (docs/leases.md). */
START_TEST(test_takeback_of_a_lease_publishes)
{
	const char *key = "rl:tb:{lock}", *ch = "rl:released";
	struct timeval tv = { 2, 0 };
	redisContext *sub = direct();
	redisReply *r;

	ck_assert_ptr_nonnull(sub);
	cmd_ok("DEL %s", key);
	cmd_ok("ZADD %s 99999999999999 tok:1 -1 #used", key);
	r = redisCommand(sub, "SUBSCRIBE %s", ch);
	ck_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
	freeReplyObject(r);
	r = cmd("EVAL %s 1 %s 4 1 60000 1 tok %s", rl_lua_takeback, key, ch);
	ck_assert_msg(r->type == REDIS_REPLY_INTEGER && r->integer == 1,
	    "takeback: type %d %s", r->type,
	    r->type == REDIS_REPLY_ERROR ? r->str : "");
	freeReplyObject(r);
	ck_assert_int_eq(cmd_int("EXISTS %s", key), 0);
	redisSetTimeout(sub, tv);
	ck_assert_int_eq(redisGetReply(sub, (void **)&r), REDIS_OK);
	ck_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 3);
	ck_assert_str_eq(r->element[0]->str, "message");
	ck_assert_str_eq(r->element[2]->str, key);
	freeReplyObject(r);
	redisFree(sub);
}
END_TEST

START_TEST(test_sliding_log_unique_members)
{
	const char *key = "rl:bulk:{k}";
	struct backend *b = new_backend();
	struct rl_result r;
	int64_t t0, dt;
	int i;

	ck_assert(decide1(b, mk(RL_ALG_SLIDING_LOG, 10, 60000, 5, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 5);
	/* One call of cost 5 is one member: a run of 5 units. */
	ck_assert_int_eq(cmd_int("ZCARD %s", key), 1);
	cmd_ok("DEL %s", key);

	/* 1,000 rapid requests, several per microsecond on a fast
	 * machine: at most one member each (calls at one time share a
	 * run), none lost. */
	t0 = now_us();
	for (i = 0; i < 1000; i++)
		ck_assert(decide1(b,
		    mk(RL_ALG_SLIDING_LOG, 1000000, 60000, 1, false, key), &r));
	dt = now_us() - t0;
	ck_assert_int_le(cmd_int("ZCARD %s", key), 1000);
	ck_assert_int_eq(log_units(key), 1000);
	ck_assert_int_eq(r.remaining, 1000000 - 1000);
	fprintf(stderr,
	    "decide() round trip, sliding_log, 1 rule: %.1f us "
	    "(mean of 1000)\n",
	    (double)dt / 1000.0);
	backend_free(b);
}
END_TEST

START_TEST(test_sliding_log_large_cost)
{
	const char *key = "rl:big:{k}";
	struct backend *b = new_backend();
	struct rl_result r;

	/* Two calls of 2,500 units: two members, whatever the cost. */
	ck_assert(decide1(b,
	    mk(RL_ALG_SLIDING_LOG, 5000, 60000, 2500, false, key), &r));
	ck_assert(decide1(b,
	    mk(RL_ALG_SLIDING_LOG, 5000, 60000, 2500, false, key), &r));
	ck_assert_int_eq(r.remaining, 0);
	ck_assert_int_eq(cmd_int("ZCARD %s", key), 2);
	ck_assert(!decide1(b,
	    mk(RL_ALG_SLIDING_LOG, 5000, 60000, 1, false, key), &r));
	ck_assert(r.retry_after_ms > 59000 && r.retry_after_ms <= 60000);
	backend_free(b);
}
END_TEST

/* ---- several rules --------------------------------------------------- */

START_TEST(test_all_or_nothing)
{
	const char *ka = "rl:a:{x}", *kb = "rl:b:{x}", *kc = "rl:c:{x}";
	const char *kd = "rl:d:{x}", *ke = "rl:e:{x}";
	struct backend *b = new_backend();
	struct rl_check ch[5];
	struct rl_result r[5];
	redisReply *rep;

	/* Fill b. */
	ck_assert(decide1(b, mk(RL_ALG_SLIDING_LOG, 1, 60000, 1, false, kb),
	    r));
	ck_assert_int_eq(cmd_int("ZCARD %s", kb), 1);

	ch[0] = mk(RL_ALG_SLIDING_LOG, 10, 60000, 1, false, ka);
	ch[1] = mk(RL_ALG_SLIDING_LOG, 1, 60000, 1, false, kb);
	ch[2] = mk(RL_ALG_FIXED_WINDOW, 10, 3600000, 1, false, kc);
	ch[3] = mk(RL_ALG_TOKEN_BUCKET, 10, 60000, 1, false, kd);
	ch[4] = mk(RL_ALG_SLIDING_WINDOW, 10, 60000, 1, false, ke);
	ck_assert(!decide_ok(b, ch, 5, r));
	ck_assert(r[0].allowed && r[2].allowed && r[3].allowed && r[4].allowed);
	ck_assert(!r[1].allowed);
	ck_assert(r[1].retry_after_ms > 0);
	/* Nothing recorded: remaining is the full limit, keys absent. */
	ck_assert_int_eq(r[0].remaining, 10);
	ck_assert_int_eq(r[2].remaining, 10);
	ck_assert_int_eq(r[3].remaining, 10);
	ck_assert_int_eq(r[4].remaining, 10);
	ck_assert_int_eq(cmd_int("ZCARD %s", ka), 0);
	rep = cmd("HGETALL %s", kc);
	ck_assert_int_eq(rep->elements, 0);
	freeReplyObject(rep);
	ck_assert_int_eq(cmd_int("EXISTS %s", kd), 0);
	ck_assert_int_eq(cmd_int("EXISTS %s", ke), 0);
	ck_assert_int_eq(cmd_int("ZCARD %s", kb), 1);

	/* Without the full rule, every one records. */
	ck_assert(decide_ok(b, ch + 2, 3, r));
	ck_assert_int_eq(r[0].remaining, 9);
	ck_assert_int_eq(r[1].remaining, 9);
	ck_assert_int_eq(r[2].remaining, 9);
	rep = cmd("HGET %s n", kc);
	ck_assert_str_eq(rep->str, "1");
	freeReplyObject(rep);
	ck_assert_int_eq(cmd_int("EXISTS %s", kd), 1);
	ck_assert_int_eq(cmd_int("EXISTS %s", ke), 1);
	backend_free(b);
}
END_TEST

START_TEST(test_shadow)
{
	const char *kn = "rl:normal:{x}", *ks = "rl:shadow:{x}";
	struct backend *b = new_backend();
	struct rl_check ch[2];
	struct rl_result r[2];

	ch[0] = mk(RL_ALG_SLIDING_LOG, 10, 60000, 1, false, kn);
	ch[1] = mk(RL_ALG_SLIDING_LOG, 2, 60000, 1, true, ks);
	/* The shadow rule allows twice and records... */
	ck_assert(decide_ok(b, ch, 2, r));
	ck_assert(decide_ok(b, ch, 2, r));
	ck_assert_int_eq(cmd_int("ZCARD %s", ks), 2);
	/* ...then would deny: the request passes, the shadow key does not
	 * grow, the normal one does. */
	ck_assert(decide_ok(b, ch, 2, r));
	ck_assert(r[0].allowed);
	ck_assert(!r[1].allowed);
	ck_assert(r[1].retry_after_ms > 0);
	ck_assert_int_eq(r[1].remaining, 0);
	ck_assert_int_eq(cmd_int("ZCARD %s", ks), 2);
	ck_assert_int_eq(cmd_int("ZCARD %s", kn), 3);
	ck_assert_int_eq(r[0].remaining, 7);

	/* A non-shadow denial stops the shadow rule recording too. */
	cmd_ok("DEL %s", ks);
	ch[0] = mk(RL_ALG_SLIDING_LOG, 3, 60000, 1, false, kn);
	ck_assert(!decide_ok(b, ch, 2, r));
	ck_assert(!r[0].allowed && r[1].allowed);
	ck_assert_int_eq(cmd_int("EXISTS %s", ks), 0);
	backend_free(b);
}
END_TEST

START_TEST(test_cost_zero_leaves_no_key)
{
	static const char *keys[] = { "rl:z0:{k}", "rl:z1:{k}", "rl:z2:{k}",
		"rl:z3:{k}" };
	struct backend *b = new_backend();
	struct rl_result r;
	int alg;

	for (alg = 0; alg < 4; alg++) {
		ck_assert(decide1(b,
		    mk((enum rl_algorithm)alg, 5, 60000, 0, false, keys[alg]),
		    &r));
		ck_assert(r.allowed);
		ck_assert_int_eq(r.remaining, 5);
		ck_assert_int_eq(r.reset_ms, 0);
		ck_assert_int_eq(r.retry_after_ms, 0);
		ck_assert_int_eq(cmd_int("EXISTS %s", keys[alg]), 0);
	}
	/* Cost 0 reports usage without adding to it. */
	ck_assert(decide1(b,
	    mk(RL_ALG_SLIDING_LOG, 5, 60000, 2, false, keys[0]), &r));
	ck_assert(decide1(b,
	    mk(RL_ALG_SLIDING_LOG, 5, 60000, 0, false, keys[0]), &r));
	ck_assert_int_eq(r.remaining, 3);
	ck_assert(r.reset_ms > 59000);
	ck_assert_int_eq(cmd_int("ZCARD %s", keys[0]), 1);
	backend_free(b);
}
END_TEST

/* ---- the other algorithms -------------------------------------------- */

START_TEST(test_fixed_window)
{
	const char *key = "rl:fw:{k}";
	struct backend *b = new_backend();
	struct rl_result r;
	redisReply *rep;
	long long pttl;

	/* An hour-long window: crossing its edge mid-test is unlikely. */
	ck_assert(decide1(b, mk(RL_ALG_FIXED_WINDOW, 2, 3600000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 1);
	ck_assert(decide1(b, mk(RL_ALG_FIXED_WINDOW, 2, 3600000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 0);
	ck_assert(!decide1(b,
	    mk(RL_ALG_FIXED_WINDOW, 2, 3600000, 1, false, key), &r));
	ck_assert(!r.allowed);
	ck_assert(r.retry_after_ms > 0 && r.retry_after_ms <= 3600000);
	ck_assert_int_eq(r.reset_ms, r.retry_after_ms);
	rep = cmd("HGET %s n", key);
	ck_assert_str_eq(rep->str, "2");
	freeReplyObject(rep);
	rep = cmd("HGET %s s", key);
	ck_assert(rep->type == REDIS_REPLY_STRING);
	ck_assert(strtoll(rep->str, NULL, 10) % 3600000000LL == 0);
	freeReplyObject(rep);
	pttl = cmd_int("PTTL %s", key);
	ck_assert(pttl > 0 && pttl <= 3600000);
	ck_assert(pttl >= r.reset_ms - 50);
	backend_free(b);
}
END_TEST

START_TEST(test_token_bucket)
{
	const char *key = "rl:tb:{k}";
	struct backend *b = new_backend();
	struct rl_result r;
	redisReply *rep;
	long long pttl;
	double tat;
	int i;

	/* Burst 3, one token per 20 s. */
	for (i = 0; i < 3; i++) {
		ck_assert(decide1(b,
		    mk(RL_ALG_TOKEN_BUCKET, 3, 60000, 1, false, key), &r));
		ck_assert_int_eq(r.remaining, 2 - i);
		ck_assert(r.reset_ms > 20000 * (i + 1) - 100 &&
		    r.reset_ms <= 20000 * (i + 1));
	}
	ck_assert(!decide1(b, mk(RL_ALG_TOKEN_BUCKET, 3, 60000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 0);
	ck_assert_msg(r.retry_after_ms > 19900 && r.retry_after_ms <= 20000,
	    "retry %lld", (long long)r.retry_after_ms);
	rep = cmd("GET %s", key);
	ck_assert(rep->type == REDIS_REPLY_STRING);
	tat = strtod(rep->str, NULL);
	ck_assert(tat > 1e15);
	freeReplyObject(rep);
	pttl = cmd_int("PTTL %s", key);
	ck_assert(pttl > 59000 && pttl <= 60000);
	backend_free(b);
}
END_TEST

START_TEST(test_sliding_window)
{
	const char *key = "rl:sw:{k}";
	struct backend *b = new_backend();
	struct rl_result r;
	redisReply *rep;
	long long pttl;
	int i;

	for (i = 0; i < 3; i++) {
		ck_assert(decide1(b,
		    mk(RL_ALG_SLIDING_WINDOW, 3, 60000, 1, false, key), &r));
		ck_assert_int_eq(r.remaining, 2 - i);
		/* Reset: the end of the current 3 s bucket plus W. */
		ck_assert(r.reset_ms > 60000 && r.reset_ms <= 63000);
	}
	ck_assert(!decide1(b,
	    mk(RL_ALG_SLIDING_WINDOW, 3, 60000, 1, false, key), &r));
	ck_assert_int_eq(r.remaining, 0);
	ck_assert(r.retry_after_ms > 0 && r.retry_after_ms <= 63000);
	rep = cmd("HGETALL %s", key);
	ck_assert(rep->elements == 2 || rep->elements == 4);
	freeReplyObject(rep);
	pttl = cmd_int("PTTL %s", key);
	ck_assert(pttl > 62000 && pttl <= 63000);

	/* A bucket from the future (the clock stepped back, or W changed)
	 * counts nowhere and is dropped; so is one long gone. */
	cmd_ok("DEL %s", key);
	cmd_ok("HSET %s 99999999999 7 1 7", key);
	ck_assert(decide1(b, mk(RL_ALG_SLIDING_WINDOW, 3, 60000, 0, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 3);
	ck_assert_int_eq(r.reset_ms, 0);
	ck_assert_int_eq(cmd_int("EXISTS %s", key), 0);
	backend_free(b);
}
END_TEST

/* ---- recovery -------------------------------------------------------- */

START_TEST(test_noscript_recovery)
{
	const char *key = "rl:ns:{k}";
	struct backend *b = new_backend_full(redis_url, 1, 1000, NULL);
	struct rl_result r;

	ck_assert(decide1(b, mk(RL_ALG_SLIDING_LOG, 5, 60000, 1, false, key),
	    &r));
	cmd_ok("SCRIPT FLUSH");
	ck_assert(decide1(b, mk(RL_ALG_SLIDING_LOG, 5, 60000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 3);
	cmd_ok("SCRIPT FLUSH");
	ck_assert(decide1(b, mk(RL_ALG_SLIDING_LOG, 5, 60000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 2);
	backend_free(b);
}
END_TEST

START_TEST(test_wrong_type_recovery)
{
	const char *key = "rl:wt:{k}";
	struct backend *b = new_backend();
	struct rl_result r;
	redisReply *rep;
	int alg;

	/* The rule's algorithm changes on each reload: every store type
	 * meets every other one. */
	cmd_ok("SET %s garbage", key);
	for (alg = 0; alg < 4; alg++) {
		ck_assert(decide1(b,
		    mk((enum rl_algorithm)alg, 5, 60000, 1, false, key), &r));
		ck_assert_int_eq(r.remaining, 4);
		ck_assert(decide1(b,
		    mk((enum rl_algorithm)alg, 5, 60000, 1, false, key), &r));
		ck_assert_int_eq(r.remaining, 3);
	}
	rep = cmd("TYPE %s", key);
	ck_assert_str_eq(rep->str, "string");
	freeReplyObject(rep);
	/* sliding_window after fixed_window: both hashes.  The fixed
	 * window's fields are not counts and are dropped. */
	cmd_ok("DEL %s", key);
	ck_assert(decide1(b, mk(RL_ALG_FIXED_WINDOW, 5, 60000, 2, false, key),
	    &r));
	ck_assert(decide1(b, mk(RL_ALG_SLIDING_WINDOW, 5, 60000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 4);
	rep = cmd("HGETALL %s", key);
	ck_assert_int_eq(rep->elements, 2);
	freeReplyObject(rep);
	/* ...and back: a clean fixed window (s, n and w). */
	ck_assert(decide1(b, mk(RL_ALG_FIXED_WINDOW, 5, 60000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 4);
	rep = cmd("HGETALL %s", key);
	ck_assert_int_eq(rep->elements, 6);
	freeReplyObject(rep);
	/* A token bucket string that is not a number starts fresh. */
	cmd_ok("SET %s nan", key);
	ck_assert(decide1(b, mk(RL_ALG_TOKEN_BUCKET, 5, 60000, 1, false, key),
	    &r));
	ck_assert_int_eq(r.remaining, 4);
	backend_free(b);
}
END_TEST

/*
 * A rule that changes from sliding_log to concurrency on a reload, while
 * its key still holds a run recorded ahead of now (a chunk taken in
 * advance): the concurrency check must start the key afresh, not read the
 * run, when its time comes, as a lease of that many units (which took the
 * key's leases with it and let more than the limit be held).
 */
START_TEST(test_concurrency_after_sliding_log_runs)
{
	const char *key = "rl:conc-after-log:{k}";
	struct backend *b = new_backend();
	struct rl_check c;
	struct rl_result r;

	c = mk(RL_ALG_SLIDING_LOG, 20, 60000, 1, false, key);
	c.prefetch_want = 20;
	c.prefetch_hold_us = 150000; /* the run is recorded 150 ms ahead */
	ck_assert(decide1(b, c, &r));
	c = mk(RL_ALG_CONCURRENCY, 2, 60000, 1, false, key);
	c.token = "11111111111111111111111111111111";
	ck_assert(decide1(b, c, &r));
	ck_assert_int_eq(r.remaining, 1);
	sleep_ms(250); /* the run's time has come */
	c.token = "22222222222222222222222222222222";
	ck_assert(decide1(b, c, &r));
	ck_assert_int_eq(r.remaining, 0);
	c.token = "33333333333333333333333333333333";
	ck_assert(!decide1(b, c, &r));
	backend_free(b);
}
END_TEST

/* ---- both layouts of sliding_log in one key -------------------------- */

extern const char rl_lua_ratelimit[];

/* A sliding_log key as a rolling upgrade leaves it (docs/algorithms.md,
 * sliding_log): runs "<end>:<n>" of this version at both ends, 3 units
 * 30 s ago and 2 units 10 s ago, and two units of the older layout
 * "<T>.<i>" that an older daemon recorded 20 s ago, under a run this
 * version had reserved ahead.  7 units in all, limit 5. */
static void
mixed_key(const char *key, long long now)
{
	long long t = now - 20000000;

	cmd_ok("DEL %s", key);
	cmd_ok("ZADD %s %lld 3:3 %lld %lld.1 %lld %lld.2 %lld 5:2", key,
	    now - 30000000, t, t, t, t, now - 10000000);
	cmd_ok("PEXPIRE %s 120000", key);
}

/* Check i of reply r (after its request's all_allowed at r[at]). */
static long long
field(const redisReply *r, size_t at, size_t i)
{
	ck_assert_uint_lt(at + i, r->elements);
	ck_assert_int_eq(r->element[at + i]->type, REDIS_REPLY_INTEGER);
	return r->element[at + i]->integer;
}

/* One batch on the script's three ways to a sliding_log check (one check
 * alone; beside a fixed_window check; beside a shadow check, the general
 * path), each with the mixed key at its limit between requests on keys the
 * call creates: no error, the other requests answered as usual, the mixed
 * key's denied with the retry of its 3rd oldest unit, 30 s ago (every unit
 * counted, the older ones too), every key the call made with a TTL, and
 * the mixed key rewritten in runs, its 7 units at their own times.
 * Before, the binary search for the retry read "<T>.1" as a run,
 * and the whole call failed with a Lua error, leaving the keys it had
 * made without a TTL. */
START_TEST(test_sliding_log_mixed_layouts)
{
	static const char *mix = "rl:mix:{k}",
			  *made[] = { "rl:mix:{a}", "rl:mix:{b}",
				  "rl:mix:{c}" };
	redisReply *r;
	long long retry;
	size_t i;
	int way;

	for (way = 0; way < 3; way++) {
		cmd_ok("FLUSHALL");
		mixed_key(mix, server_us());
		if (way == 0)
			r = cmd(
			    "EVAL %s 3 %s %s %s 3 1 1 1 0 10 60000 1 0 "
			    "0 5 60000 1 0 0 10 60000 1 0",
			    rl_lua_ratelimit, made[0], mix, made[1]);
		else
			r = cmd(
			    "EVAL %s 4 %s %s %s %s 3 1 2 1 0 10 60000 1 0 "
			    "0 5 60000 1 0 %s 10 60000 1 %s "
			    "0 10 60000 1 0",
			    rl_lua_ratelimit, made[0], mix, made[2], made[1],
			    way == 1 ? "2" : "0", way == 1 ? "0" : "1");
		ck_assert_msg(r->type == REDIS_REPLY_ARRAY,
		    "way %d: reply type %d: %s", way, r->type,
		    r->type == REDIS_REPLY_ERROR ? r->str : "");
		/* Request 1: allowed, 9 left. */
		ck_assert_int_eq(field(r, 0, 0), 1);
		ck_assert_int_eq(field(r, 0, 2), 9);
		/* Request 2: denied on the mixed key. */
		ck_assert_int_eq(field(r, 6, 0), 0);
		ck_assert_int_eq(field(r, 6, 1), 0);
		retry = field(r, 6, 4);
		ck_assert_msg(retry >= 29000 && retry <= 30000,
		    "way %d: retry %lld", way, retry);
		/* Request 3: allowed. */
		i = way == 0 ? 12 : 17;
		ck_assert_int_eq(field(r, i, 0), 1);
		ck_assert_int_eq(field(r, i, 2), 9);
		ck_assert_uint_eq(r->elements, i + 6);
		freeReplyObject(r);

		for (i = 0; i < 3; i++) {
			long long pttl = cmd_int("PTTL %s", made[i]);

			if (i == 2) /* its request was denied */
				ck_assert_int_eq(pttl, -2);
			else
				ck_assert_msg(pttl > 0 && pttl <= 60000 + 7500,
				    "way %d: %s: PTTL %lld", way, made[i],
				    pttl);
		}
		ck_assert_int_eq(cmd_int("ZCARD %s", mix), 3);
		ck_assert_int_eq(log_units(mix), 7);
		ck_assert_msg(cmd_int("PTTL %s", mix) > 0, "way %d", way);

		/* Converted, it still denies, until its 3rd oldest unit
		 * leaves. */
		r = cmd("EVAL %s 1 %s 0 5 60000 1 0", rl_lua_ratelimit, mix);
		ck_assert_int_eq(r->type, REDIS_REPLY_ARRAY);
		ck_assert_int_eq(field(r, 0, 0), 0);
		retry = field(r, 0, 4);
		ck_assert_msg(retry > 29000 && retry <= 30000, "retry %lld",
		    retry);
		freeReplyObject(r);
	}
}
END_TEST

/* The older layout at one end only, with runs in the key (docs/algorithms.md,
 * sliding_log): every unit counts, a run's n and each older unit one.
 * Before, a key whose newest member was older counted a run as one unit
 * (ZCARD), and one whose oldest was older was dropped: both admitted
 * this request over the limit of 5. */
START_TEST(test_sliding_log_older_at_one_end)
{
	static const char *key = "rl:mix:{end}";
	redisReply *r;
	long long now, t;
	int end;

	for (end = 0; end < 2; end++) {
		now = server_us();
		t = now - 10000000 * (end == 0 ? 1 : 3);
		cmd_ok("DEL %s", key);
		cmd_ok("ZADD %s %lld 3:3 %lld %lld.1 %lld %lld.2", key,
		    now - 20000000, t, t, t, t);
		r = cmd("EVAL %s 1 %s 0 5 60000 1 0", rl_lua_ratelimit, key);
		ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "end %d: %s", end,
		    r->type == REDIS_REPLY_ERROR ? r->str : "");
		ck_assert_msg(field(r, 0, 0) == 0, "end %d: admitted", end);
		freeReplyObject(r);
		ck_assert_int_eq(log_units(key), 5);
		ck_assert_msg(cmd_int("PTTL %s", key) > 0, "end %d", end);
	}
}
END_TEST

/* takeback.lua leaves units of the older layout after the run it shrinks
 * where they are, and renumbers the runs around them.  Before, it failed
 * on the first one, after it had rewritten the run. */
START_TEST(test_takeback_past_older_units)
{
	const char *key = "rl:tb:{mix}";
	redisReply *r;

	cmd_ok("DEL %s", key);
	cmd_ok("ZADD %s 1000 5:5 2000 2000.1 3000 7:2", key);
	r = cmd("EVAL %s 1 %s 0 10 60000 2 1000", rl_lua_takeback, key);
	ck_assert_msg(r->type == REDIS_REPLY_INTEGER && r->integer == 1,
	    "takeback: type %d %s", r->type,
	    r->type == REDIS_REPLY_ERROR ? r->str : "");
	freeReplyObject(r);
	r = cmd("ZRANGE %s 0 -1", key);
	ck_assert_uint_eq(r->elements, 3);
	ck_assert_str_eq(r->element[0]->str, "3:3");
	ck_assert_str_eq(r->element[1]->str, "2000.1");
	ck_assert_str_eq(r->element[2]->str, "5:2");
	freeReplyObject(r);
}
END_TEST

/* A rolling upgrade on a hot key (docs/algorithms.md, sliding_log, "The
 * older layout"): an older daemon records one unit "<T>.1" every 100 ms
 * and this version one unit between them, limit 10 per 300 ms, so that
 * at most 6 units are ever in the window and every request of this
 * version fits.  Each call of this version finds an older unit at the
 * key's newest end and converts the key, each unit at its own time, so
 * that units leave when they really do: every request is admitted, and
 * the key holds at most what the window holds.  Before, the key became
 * one run of all its units at its newest time, which never left while
 * older units came less than a window apart: from the 6th call on every
 * request was denied and the key grew by a unit per round. */
START_TEST(test_sliding_log_rolling_upgrade_hot_key)
{
	static const char *key = "rl:mix:{hot}";
	redisReply *r;
	long long t;
	int round;

	for (round = 0; round < 30; round++) {
		t = server_us();
		cmd_ok("ZADD %s %lld %lld.1", key, t, t);
		r = cmd("EVAL %s 1 %s 0 10 300 1 0", rl_lua_ratelimit, key);
		ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "round %d: %s",
		    round, r->type == REDIS_REPLY_ERROR ? r->str : "");
		ck_assert_msg(field(r, 0, 0) == 1,
		    "round %d: denied, %lld left", round, field(r, 0, 2));
		freeReplyObject(r);
		ck_assert_msg(log_units(key) <= 8, "round %d: %lld units",
		    round, log_units(key));
		ck_assert_msg(cmd_int("PTTL %s", key) > 0, "round %d", round);
		sleep_ms(100);
	}
}
END_TEST

/* A batch of two requests on a key with older units between its runs
 * (5 units 30 s ago, 2 older units 20 s ago, 3 units 10 s ago; limit 10),
 * costs 3 then 2, on the script's three ways to a sliding_log check:
 * both denied, as they would be one call each ("a later request in a
 * batch sees what an earlier one recorded": docs/algorithms.md, "Requests
 * of one key in one call"), both with the exact retry (the 3rd and the
 * 2nd oldest units leave in 30 s), and the key's 10 units unchanged, in
 * runs.  Before, the first request found the older units and the key was
 * converted only when the call ended: the second still counted the runs
 * alone (8 units) and was admitted, leaving 12 units. */
START_TEST(test_sliding_log_mixed_found_in_batch)
{
	static const char *mix = "rl:mix:{b}", *other = "rl:mix:{o}";
	redisReply *r;
	long long now, t, retry;
	int way, req;

	for (way = 0; way < 3; way++) {
		cmd_ok("FLUSHALL");
		now = server_us();
		t = now - 20000000;
		cmd_ok("ZADD %s %lld 5:5 %lld %lld.1 %lld %lld.2 %lld 8:3", mix,
		    now - 30000000, t, t, t, t, now - 10000000);
		cmd_ok("PEXPIRE %s 120000", mix);
		if (way == 0)
			r = cmd(
			    "EVAL %s 2 %s %s 2 1 1 0 10 60000 3 0 "
			    "0 10 60000 2 0",
			    rl_lua_ratelimit, mix, mix);
		else
			r = cmd(
			    "EVAL %s 4 %s %s %s %s 2 2 2 "
			    "0 10 60000 3 0 %s 10 60000 1 %s "
			    "0 10 60000 2 0 %s 10 60000 1 %s",
			    rl_lua_ratelimit, mix, other, mix, other,
			    way == 1 ? "2" : "0", way == 1 ? "0" : "1",
			    way == 1 ? "2" : "0", way == 1 ? "0" : "1");
		ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "way %d: %s", way,
		    r->type == REDIS_REPLY_ERROR ? r->str : "");
		for (req = 0; req < 2; req++) {
			size_t at = (size_t)req * (way == 0 ? 6 : 11);

			ck_assert_msg(field(r, at, 0) == 0 &&
				field(r, at, 1) == 0,
			    "way %d: request %d admitted", way, req + 1);
		}
		for (req = 0; req < 2; req++) {
			size_t at = (size_t)req * (way == 0 ? 6 : 11);

			ck_assert_int_eq(field(r, at, 2), 0);
			retry = field(r, at, 4);
			ck_assert_msg(retry >= 29000 && retry <= 30000,
			    "way %d: request %d: retry %lld", way, req + 1,
			    retry);
		}
		freeReplyObject(r);
		ck_assert_int_eq(log_units(mix), 10);
		ck_assert_int_eq(cmd_int("ZCARD %s", mix), 3);
		ck_assert_msg(cmd_int("PTTL %s", mix) > 0, "way %d", way);
	}
}
END_TEST

/* A member between two runs that is neither a run nor an older unit
 * ("9:x", "9:1:1": a run's end and more) is counted as one unit at its
 * time, as an older unit is: no error, the retry of the 6th oldest of the
 * 9 units (40 s, within the window), and the key rewritten in runs.
 * Before, the binary search read such a member as a run ending at 9 and
 * gave the retry of the member's own time (30 s, too early), and the key
 * kept it. */
START_TEST(test_sliding_log_malformed_middle_member)
{
	static const char *key = "rl:mix:{bad}", *bad[] = { "9:x", "9:1:1" };
	redisReply *r;
	long long now, retry;
	int i;

	for (i = 0; i < 2; i++) {
		now = server_us();
		cmd_ok("DEL %s", key);
		cmd_ok("ZADD %s %lld 2:2 %lld 4:2 %lld %s %lld 6:2 %lld 8:2",
		    key, now - 50000000, now - 40000000, now - 30000000, bad[i],
		    now - 20000000, now - 10000000);
		r = cmd("EVAL %s 1 %s 0 8 60000 5 0", rl_lua_ratelimit, key);
		ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "%s: %s", bad[i],
		    r->type == REDIS_REPLY_ERROR ? r->str : "");
		ck_assert_int_eq(field(r, 0, 0), 0);
		retry = field(r, 0, 4);
		ck_assert_msg(retry >= 39000 && retry <= 40000,
		    "%s: retry %lld", bad[i], retry);
		freeReplyObject(r);
		ck_assert_int_eq(log_units(key), 9);
		ck_assert_int_eq(cmd_int("ZCARD %s", key), 5);
		ck_assert_msg(cmd_int("PTTL %s", key) > 0, "%s", bad[i]);
	}
}
END_TEST

/* A member shaped as a run of no unit ("<end>:0": no writer of this
 * version makes one) is counted as one unit at its time, as any member that
 * is not a run (docs/algorithms.md, sliding_log, "The older layout").
 * Between runs, beside an older unit: 5 units at -50, -40, -30, -20 and
 * -10 s, limit 1, so the request is denied with the retry of the 5th
 * oldest unit (50 s, within the window), the key is rewritten in 5 runs of
 * one unit and keeps a TTL, and a second call gets the same answer.  At
 * the newest end (above the runs "1:1", "2:1"): 3 units, 3 runs.
 * Before, the middle one made every call fail ("stack overflow": the
 * conversion wrote it back as a run "<end>:0", so the key again held more
 * members than units and log_time_of converted it again, for ever, after
 * the DEL and the ZADD and before the PEXPIRE: the key was left without a
 * TTL); the newest one was read as a run and kept. */
START_TEST(test_sliding_log_zero_run_member)
{
	static const char *key = "rl:mix:{zero}";
	redisReply *r;
	long long now, t, retry, pttl;
	int layout, call;

	for (layout = 0; layout < 2; layout++) {
		now = server_us();
		t = now - 20000000;
		cmd_ok("DEL %s", key);
		if (layout == 0)
			cmd_ok(
			    "ZADD %s %lld 1:1 %lld 3:0 %lld 4:1 %lld %lld.1 "
			    "%lld 5:1",
			    key, now - 50000000, now - 40000000, now - 30000000,
			    t, t, now - 10000000);
		else
			cmd_ok("ZADD %s %lld 1:1 %lld 2:1 %lld 3:0", key,
			    now - 50000000, now - 40000000, now - 30000000);
		for (call = 0; call < 2; call++) {
			r = cmd("EVAL %s 1 %s 0 1 60000 1 0", rl_lua_ratelimit,
			    key);
			ck_assert_msg(r->type == REDIS_REPLY_ARRAY,
			    "layout %d, call %d: %s", layout, call,
			    r->type == REDIS_REPLY_ERROR ? r->str : "");
			ck_assert_int_eq(field(r, 0, 0), 0);
			retry = field(r, 0, 4);
			if (layout == 0)
				ck_assert_msg(retry >= 49000 && retry <= 50000,
				    "call %d: retry %lld", call, retry);
			else
				ck_assert_msg(retry >= 29000 && retry <= 30000,
				    "call %d: retry %lld", call, retry);
			freeReplyObject(r);
			pttl = cmd_int("PTTL %s", key);
			ck_assert_msg(pttl > 0 && pttl <= 60000,
			    "layout %d, call %d: PTTL %lld", layout, call,
			    pttl);
			ck_assert_int_eq(log_units(key), layout == 0 ? 5 : 3);
			ck_assert_int_eq(cmd_int("ZCARD %s", key),
			    layout == 0 ? 5 : 3);
		}
	}
}
END_TEST

/* The calls of command name (lowercase) the server has run, from INFO
 * commandstats ("cmdstat_<name>:calls=<n>"), the commands of scripts
 * included. */
static long long
command_calls(const char *name)
{
	redisReply *r = cmd("INFO commandstats");
	char pat[64];
	const char *p;
	long long n = 0;

	ck_assert_int_eq(r->type, REDIS_REPLY_STRING);
	snprintf(pat, sizeof(pat), "cmdstat_%s:calls=", name);
	p = strstr(r->str, pat);
	if (p != NULL)
		n = atoll(p + strlen(pat));
	freeReplyObject(r);
	return n;
}

/* A key of many runs with one unit of the older layout at its newest end:
 * what an older daemon leaves on a hot key during a rolling upgrade (it
 * records at its now).  3,000 runs of one unit, 10 ms apart from 50 s
 * ago, and "<T>.1" 1 s ago; a request of cost 0 (it records nothing).
 * One call rewrites the older unit alone (docs/algorithms.md, sliding_log,
 * "The older layout"): the key holds 3,001 runs, the newest "3001:1" at
 * T (the previous newest end + 1) above "3000:1", with a TTL, and the call
 * read no more than the two ends and one page from the top: at most 4
 * ZRANGE or ZREVRANGE, one ZADD, no DEL.  Before, the call rewrote the
 * whole key: a DEL, 6 ZRANGE (4 pages of 1,000 members) and 4 ZADD of
 * 2,000 values, every time an older daemon had written to the key. */
START_TEST(test_sliding_log_older_unit_on_top_of_many_runs)
{
	enum { RUNS = 3000 };
	static const char *key = "rl:mix:{many}";
	static char buf[RUNS][2][24];
	static const char *argv[2 + 2 * RUNS];
	redisContext *c;
	redisReply *r;
	long long now, t, reads, zadds, dels;
	int i;

	now = server_us();
	t = now - 1000000;
	argv[0] = "ZADD";
	argv[1] = key;
	for (i = 0; i < RUNS; i++) {
		snprintf(buf[i][0], sizeof(buf[i][0]), "%lld",
		    now - 50000000 + 10000LL * i);
		snprintf(buf[i][1], sizeof(buf[i][1]), "%d:1", i + 1);
		argv[2 + 2 * i] = buf[i][0];
		argv[3 + 2 * i] = buf[i][1];
	}
	c = direct();
	ck_assert(c != NULL);
	r = redisCommandArgv(c, 2 + 2 * RUNS, argv, NULL);
	ck_assert(r != NULL && r->type == REDIS_REPLY_INTEGER &&
	    r->integer == RUNS);
	freeReplyObject(r);
	redisFree(c);
	cmd_ok("ZADD %s %lld %lld.1", key, t, t);
	cmd_ok("PEXPIRE %s 120000", key);

	reads = command_calls("zrange") + command_calls("zrevrange");
	zadds = command_calls("zadd");
	dels = command_calls("del");
	r = cmd("EVAL %s 1 %s 0 10000 60000 0 0", rl_lua_ratelimit, key);
	ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "%s",
	    r->type == REDIS_REPLY_ERROR ? r->str : "");
	ck_assert_int_eq(field(r, 0, 0), 1);
	ck_assert_int_eq(field(r, 0, 2), 10000 - (RUNS + 1));
	freeReplyObject(r);
	reads = command_calls("zrange") + command_calls("zrevrange") - reads;
	zadds = command_calls("zadd") - zadds;
	dels = command_calls("del") - dels;
	ck_assert_msg(reads <= 4 && zadds == 1 && dels == 0,
	    "%lld ZRANGE/ZREVRANGE, %lld ZADD, %lld DEL", reads, zadds, dels);

	ck_assert_int_eq(cmd_int("ZCARD %s", key), RUNS + 1);
	ck_assert_int_eq(log_units(key), RUNS + 1);
	r = cmd("ZRANGE %s -2 -1 WITHSCORES", key);
	ck_assert_uint_eq(r->elements, 4);
	ck_assert_str_eq(r->element[0]->str, "3000:1");
	ck_assert_str_eq(r->element[2]->str, "3001:1");
	ck_assert_int_eq(strtoll(r->element[3]->str, NULL, 10), t);
	freeReplyObject(r);
	ck_assert_msg(cmd_int("PTTL %s", key) > 0, "no TTL");
}
END_TEST

/*
 * Members of one score sort by their string: an older unit at the very
 * time of the newest run R ("<t>.2", t beginning with '1', sorts below
 * "9:1") lies below R, where the rewrite of the top stops.  It counts all
 * the same: with one more older unit on top, a key of 11 units at a limit
 * of 11 denies (the rewrite read only above R and admitted a 12th).
 */
START_TEST(test_sliding_log_older_unit_at_the_newest_runs_time)
{
	static const char *key = "rl:mix:{tie}";
	long long now, x, y;
	redisReply *r;
	int i;

	now = server_us();
	x = now - 2000000;
	y = now - 1000000;
	for (i = 0; i < 8; i++)
		cmd_ok("ZADD %s %lld %d:1", key, now - 30000000 + 1000LL * i,
		    i + 1);
	cmd_ok("ZADD %s %lld 9:1", key, x);
	cmd_ok("ZADD %s %lld %lld.2", key, x, x);
	cmd_ok("ZADD %s %lld %lld.1", key, y, y);
	cmd_ok("PEXPIRE %s 120000", key);
	r = cmd("ZRANGE %s -3 -2", key);
	ck_assert_uint_eq(r->elements, 2);
	ck_assert_msg(strchr(r->element[0]->str, '.') != NULL &&
		strcmp(r->element[1]->str, "9:1") == 0,
	    "the older unit does not sort below the run: %s, %s",
	    r->element[0]->str, r->element[1]->str);
	freeReplyObject(r);

	r = cmd("EVAL %s 1 %s 0 11 60000 1 0", rl_lua_ratelimit, key);
	ck_assert_msg(r->type == REDIS_REPLY_ARRAY, "%s",
	    r->type == REDIS_REPLY_ERROR ? r->str : "");
	ck_assert_msg(field(r, 0, 0) == 0, "a 12th unit admitted at 11");
	freeReplyObject(r);
	ck_assert_int_eq(log_units(key), 11);
	ck_assert_msg(cmd_int("PTTL %s", key) > 0, "no TTL");
}
END_TEST

/* ---- failures -------------------------------------------------------- */

/* A listener that completes handshakes (the kernel does) and never reads. */
static int
silent_listener(int *port)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int fd;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(fd, 64), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	*port = ntohs(sa.sin_port);
	return fd;
}

START_TEST(test_timeout)
{
	struct backend *b;
	char url[128], err[256];
	int port, fd = silent_listener(&port);
	int64_t t0, dt;
	int i, tries;

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
	b = new_backend_full(url, 1, 200, NULL);
	for (i = 0, tries = 0; i < 2; i++) {
		t0 = now_us();
		ck_assert_int_eq(decide_fail(b,
				     mk(RL_ALG_SLIDING_LOG, 5, 1000, 1, false,
					 "rl:t:{k}"),
				     err, sizeof(err)),
		    BACKEND_ERR_TIMEOUT);
		dt = now_us() - t0;
		/* The connection is closed at the timeout from the send,
		 * a moment after the call failed at the timeout from its
		 * arrival (test_hang_counts_once): a call sent in between
		 * fails with it, early, as hung.  The test waits 50 ms for
		 * the close; a call that still came too soon (a slow
		 * machine) goes again. */
		if (dt < 190000 && strstr(err, "no reply within") != NULL &&
		    ++tries < 3) {
			i--;
			usleep(50000);
			continue;
		}
		ck_assert_msg(dt >= 190000 && dt <= 300000, "took %lld us: %s",
		    (long long)dt, err);
		usleep(50000);
	}
	t0 = now_us();
	ck_assert(!backend_is_ready(b));
	dt = now_us() - t0;
	ck_assert_msg(dt <= 300000, "is_ready took %lld us", (long long)dt);
	backend_free(b);
	close(fd);
}
END_TEST

/*
 * A Redis that stops answering: each call fails at redis.timeout from its
 * arrival, counted once by the circuit, and the connection is closed at
 * redis.timeout from the send, after.  That close must not count the same
 * hang a second time: the circuit opens at the fifth such call, not the
 * third.
 */
START_TEST(test_hang_counts_once)
{
	struct backend *b;
	char url[128], err[256];
	int port, fd = silent_listener(&port);
	struct rl_check c = mk(RL_ALG_SLIDING_LOG, 5, 1000, 1, false,
	    "rl:t:{k}");
	int i;

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
	b = new_backend_full(url, 1, 200, NULL);
	for (i = 0; i < 5; i++)
		ck_assert_msg(decide_fail(b, c, err, sizeof(err)) ==
			BACKEND_ERR_TIMEOUT,
		    "call %d: %s", i + 1, err);
	ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
	    BACKEND_ERR_CIRCUIT_OPEN);
	backend_free(b);
	close(fd);
}
END_TEST

START_TEST(test_connection_refused)
{
	struct backend *b;
	char url[128], err[256];
	int64_t t0;

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", test_free_port());
	b = new_backend_full(url, 2, 200, NULL);
	t0 = now_us();
	ck_assert_int_eq(decide_fail(b,
			     mk(RL_ALG_SLIDING_LOG, 5, 1000, 1, false,
				 "rl:t:{k}"),
			     err, sizeof(err)),
	    BACKEND_ERR_CONNECT);
	ck_assert(now_us() - t0 < 100000);
	ck_assert_msg(strstr(err, "refused") != NULL, "%s", err);
	ck_assert(!backend_is_ready(b));
	backend_free(b);

	snprintf(url, sizeof(url), "unix://%s/nonexistent.sock", tmpdir);
	b = new_backend_full(url, 1, 200, NULL);
	ck_assert_int_eq(decide_fail(b,
			     mk(RL_ALG_SLIDING_LOG, 5, 1000, 1, false,
				 "rl:t:{k}"),
			     err, sizeof(err)),
	    BACKEND_ERR_CONNECT);
	backend_free(b);
}
END_TEST

START_TEST(test_circuit_breaker)
{
	const char *key = "rl:cb:{k}";
	struct rl_check c = mk(RL_ALG_SLIDING_LOG, 100, 60000, 1, false, key);
	struct backend *b = new_backend_full(redis_url, 2, 200, NULL);
	struct rl_result r;
	char err[256];
	int64_t t0;
	int i;

	/* Redis answers, but every call fails (NOAUTH). */
	cmd_ok("CONFIG SET requirepass %s", TEST_PASSWORD);
	for (i = 0; i < 5; i++)
		ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
		    BACKEND_ERR_CONNECT);
	/* Open: fail fast, Redis untouched: no call waits for anything
	 * (a tenth of the 200 ms timeout is slack for slow builds). */
	for (i = 0; i < 100; i++) {
		t0 = now_us();
		ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
		    BACKEND_ERR_CIRCUIT_OPEN);
		ck_assert(now_us() - t0 < 20000);
	}

	/* Half-open after 100 ms: one trial, which fails: open for 200. */
	sleep_ms(110);
	ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
	    BACKEND_ERR_CONNECT);
	ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
	    BACKEND_ERR_CIRCUIT_OPEN);
	sleep_ms(110);
	ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
	    BACKEND_ERR_CIRCUIT_OPEN);

	/* Redis is fixed; the next trial closes the circuit. */
	{
		redisContext *d = direct();
		redisReply *rep;

		ck_assert(d != NULL);
		rep = redisCommand(d, "AUTH %s", TEST_PASSWORD);
		freeReplyObject(rep);
		rep = redisCommand(d, "CONFIG SET requirepass %s", "");
		ck_assert(rep != NULL && rep->type == REDIS_REPLY_STATUS);
		freeReplyObject(rep);
		redisFree(d);
	}
	sleep_ms(100);
	ck_assert(decide1(b, c, &r));
	for (i = 0; i < 10; i++)
		ck_assert(decide1(b, c, &r));
	ck_assert_int_eq(r.remaining, 89);
	backend_free(b);
}
END_TEST

START_TEST(test_circuit_refused_backoff_caps)
{
	struct backend *b;
	char url[128], err[256];
	struct rl_check c = mk(RL_ALG_SLIDING_LOG, 5, 1000, 1, false,
	    "rl:t:{k}");
	int i, trials = 0;
	int64_t t0, at[8];

	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", test_free_port());
	b = new_backend_full(url, 1, 100, NULL);
	for (i = 0; i < 5; i++)
		ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
		    BACKEND_ERR_CONNECT);
	/* Backoffs 100, 200, 400, 800 ms: in 1.6 s at most 4 trials, each
	 * at least twice as long after the one before as that one after
	 * its own (how soon each comes is the machine's business). */
	t0 = now_us();
	while (now_us() - t0 < 1600000) {
		if (decide_fail(b, c, err, sizeof(err)) ==
			BACKEND_ERR_CONNECT &&
		    trials < 8)
			at[trials++] = now_us();
		sleep_ms(5);
	}
	ck_assert_msg(trials >= 2 && trials <= 4, "%d trials", trials);
	for (i = 1; i < trials; i++)
		ck_assert_msg(at[i] - at[i - 1] >= (100000 << i) - 20000,
		    "trial %d came %lld ms after the one before", i + 1,
		    (long long)(at[i] - at[i - 1]) / 1000);
	ck_assert(!backend_is_ready(b));
	backend_free(b);
}
END_TEST

START_TEST(test_is_ready)
{
	struct backend *b = new_backend();
	struct backend *bad;
	char url[128];

	ck_assert(backend_is_ready(b));
	ck_assert(backend_is_ready(b));
	backend_free(b);
	snprintf(url, sizeof(url), "redis://127.0.0.1:%d", test_free_port());
	bad = new_backend_full(url, 1, 100, NULL);
	ck_assert(!backend_is_ready(bad));
	backend_free(bad);
}
END_TEST

/* ---- configuration --------------------------------------------------- */

START_TEST(test_auth)
{
	const char *key = "rl:auth:{k}";
	struct rl_check c = mk(RL_ALG_SLIDING_LOG, 5, 60000, 1, false, key);
	struct rl_result r;
	struct backend *b;
	char url[128], err[256], pwfile[128];
	FILE *f;

	cmd_ok("ACL SETUSER alice on >alicepw ~* +@all");
	cmd_ok("CONFIG SET requirepass %s", TEST_PASSWORD);

	/* Password only. */
	snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d", TEST_PASSWORD,
	    redis_port);
	b = new_backend_full(url, 1, 1000, NULL);
	ck_assert(backend_is_ready(b));
	ck_assert(decide1(b, c, &r));
	backend_free(b);

	/* User and password (ACL). */
	snprintf(url, sizeof(url), "redis://alice:alicepw@127.0.0.1:%d",
	    redis_port);
	b = new_backend_full(url, 1, 1000, NULL);
	ck_assert(decide1(b, c, &r));
	ck_assert_int_eq(r.remaining, 3);
	backend_free(b);

	/* Wrong password: a connect error that never shows the secret. */
	snprintf(url, sizeof(url), "redis://alice:wrongpw@127.0.0.1:%d",
	    redis_port);
	b = new_backend_full(url, 1, 1000, NULL);
	ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
	    BACKEND_ERR_CONNECT);
	ck_assert_msg(strstr(err, "AUTH") != NULL, "%s", err);
	ck_assert(strstr(err, "wrongpw") == NULL);
	ck_assert(!backend_is_ready(b));
	backend_free(b);

	/* No password at all. */
	b = new_backend_full(redis_url, 1, 1000, NULL);
	ck_assert_int_eq(decide_fail(b, c, err, sizeof(err)),
	    BACKEND_ERR_CONNECT);
	ck_assert_msg(strstr(err, "NOAUTH") != NULL, "%s", err);
	ck_assert(!backend_is_ready(b));
	backend_free(b);

	/* The password from password_file, the user from the URL. */
	snprintf(pwfile, sizeof(pwfile), "%s/password", tmpdir);
	f = fopen(pwfile, "w");
	ck_assert(f != NULL);
	fputs("alicepw\n", f);
	fclose(f);
	snprintf(url, sizeof(url), "redis://alice@127.0.0.1:%d", redis_port);
	b = new_backend_full(url, 1, 1000, pwfile);
	ck_assert(decide1(b, c, &r));
	ck_assert_int_eq(r.remaining, 2);
	backend_free(b);
	/* And for the default user. */
	f = fopen(pwfile, "w");
	ck_assert(f != NULL);
	fputs(TEST_PASSWORD "\n", f);
	fclose(f);
	b = new_backend_full(redis_url, 1, 1000, pwfile);
	ck_assert(decide1(b, c, &r));
	backend_free(b);
	unlink(pwfile);
}
END_TEST

START_TEST(test_select_db_and_unix_url_errors)
{
	const char *key = "rl:db:{k}";
	struct redis_config rc;
	struct rl_result r;
	struct backend *b;
	char url[128], err[256];
	redisReply *rep;

	snprintf(url, sizeof(url), "%s/3", redis_url);
	b = new_backend_full(url, 1, 1000, NULL);
	ck_assert(decide1(b, mk(RL_ALG_SLIDING_LOG, 5, 60000, 1, false, key),
	    &r));
	backend_free(b);
	ck_assert_int_eq(cmd_int("EXISTS %s", key), 0);
	{
		redisContext *d = direct();

		rep = redisCommand(d, "SELECT 3");
		freeReplyObject(rep);
		rep = redisCommand(d, "ZCARD %s", key);
		ck_assert_int_eq(rep->integer, 1);
		freeReplyObject(rep);
		redisFree(d);
	}

	/* Bad configurations fail at creation, without the secret. */
	memset(&rc, 0, sizeof(rc));
	rc.pool_size = 1;
	rc.timeout_ms = 50;
	rc.url = (char *)"redis://u:sekrit@h:99999";
	ck_assert_ptr_null(backend_redis_new(&rc, err, sizeof(err)));
	ck_assert(strstr(err, "sekrit") == NULL);
	ck_assert(strstr(err, "port") != NULL);
	rc.url = (char *)"redis://alice@h";
	ck_assert_ptr_null(backend_redis_new(&rc, err, sizeof(err)));
	ck_assert(strstr(err, "password") != NULL);
	rc.password_file = (char *)"/nonexistent/pw";
	ck_assert_ptr_null(backend_redis_new(&rc, err, sizeof(err)));
	ck_assert(strstr(err, "/nonexistent/pw") != NULL);
	rc.password_file = NULL;
	rc.url = (char *)"redis://h";
	{
		char *seeds[1] = { (char *)"no-port" };

		rc.cluster = seeds;
		rc.ncluster = 1;
		ck_assert_ptr_null(backend_redis_new(&rc, err, sizeof(err)));
		ck_assert(strstr(err, "redis.cluster") != NULL);
		rc.cluster = NULL;
		rc.ncluster = 0;
	}
}
END_TEST

START_TEST(test_unix_socket)
{
	const char *key = "rl:unix:{k}";
	struct backend *b;
	struct rl_result r;
	char url[160], sock[128];
	int i;

	/* The server listens there too (see start_redis). */
	snprintf(sock, sizeof(sock), "%s/redis.sock", tmpdir);
	snprintf(url, sizeof(url), "unix://%s?db=2", sock);
	b = new_backend_full(url, 1, 1000, NULL);
	for (i = 0; i < 3; i++)
		ck_assert(decide1(b,
		    mk(RL_ALG_SLIDING_LOG, 5, 60000, 1, false, key), &r));
	ck_assert_int_eq(r.remaining, 2);
	backend_free(b);
	ck_assert_int_eq(cmd_int("EXISTS %s", key), 0); /* db 0 */
}
END_TEST

/* ---- concurrency ----------------------------------------------------- */

struct hammer {
	struct backend *b;
	int allowed;
	int errors;
};

static void *
hammer_run(void *arg)
{
	struct hammer *h = arg;
	struct rl_check c = mk(RL_ALG_SLIDING_LOG, 1000, 60000, 1, false,
	    "rl:hammer:{k}");
	enum backend_error_kind kind;
	struct rl_result r;
	char err[256];
	bool all;
	int i;

	for (i = 0; i < 500; i++) {
		if (backend_decide(h->b, &c, 1, &r, &all, &kind, err,
			sizeof(err)) == -1)
			h->errors++;
		else if (all)
			h->allowed++;
	}
	return NULL;
}

START_TEST(test_threads_share_the_pool)
{
	struct backend *b = new_backend_full(redis_url, 4, 2000, NULL);
	struct hammer h[8];
	pthread_t t[8];
	int i, allowed = 0, errors = 0;

	for (i = 0; i < 8; i++) {
		h[i].b = b;
		h[i].allowed = h[i].errors = 0;
		ck_assert_int_eq(pthread_create(&t[i], NULL, hammer_run, &h[i]),
		    0);
	}
	for (i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		allowed += h[i].allowed;
		errors += h[i].errors;
	}
	ck_assert_int_eq(errors, 0);
	ck_assert_int_eq(allowed, 1000);
	ck_assert_int_eq(log_units("rl:hammer:{k}"), 1000);
	backend_free(b);
}
END_TEST

/*
 * Batches under heavy concurrency: 16 threads each submit 100 calls at
 * once, without waiting, so they queue and leave together in batches.
 * Each call has two checks: "wide" (one key, limit 500) and "narrow" (one
 * of 4 keys, limit 100 each).  Narrow admits exactly 4 x 100 = 400, and a
 * call narrow denies must record nothing in wide (all-or-nothing per
 * request, also inside one script call): wide then holds exactly the 400
 * admitted units.  Fewer script calls than calls shows the batching.
 */
#define BATCH_THREADS 16
#define BATCH_CALLS   100

struct batcher {
	struct backend *b;
	int id;
	struct rl_check checks[BATCH_CALLS][2];
	struct rl_result out[BATCH_CALLS][2];
	struct backend_call calls[BATCH_CALLS];
	char narrow[32];
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, allowed, errors;
};

static void
batcher_done(struct backend_call *call)
{
	struct batcher *t = call->arg;

	pthread_mutex_lock(&t->mu);
	if (call->rc != 0)
		t->errors++;
	else if (call->all_allowed)
		t->allowed++;
	t->done++;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

static void *
batcher_run(void *arg)
{
	struct batcher *t = arg;
	int i;

	snprintf(t->narrow, sizeof(t->narrow), "rl:narrow:{%d}", t->id % 4);
	for (i = 0; i < BATCH_CALLS; i++) {
		t->checks[i][0] = mk(RL_ALG_SLIDING_LOG, 500, 60000, 1, false,
		    "rl:wide:{k}");
		t->checks[i][1] = mk(RL_ALG_SLIDING_LOG, 100, 60000, 1, false,
		    t->narrow);
		memset(&t->calls[i], 0, sizeof(t->calls[i]));
		t->calls[i].checks = t->checks[i];
		t->calls[i].n = 2;
		t->calls[i].out = t->out[i];
		t->calls[i].done = batcher_done;
		t->calls[i].arg = t;
		backend_submit(t->b, &t->calls[i]);
	}
	pthread_mutex_lock(&t->mu);
	while (t->done < BATCH_CALLS)
		pthread_cond_wait(&t->cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

static long long
evalsha_calls(void)
{
	redisReply *r = cmd("INFO commandstats");
	const char *p;
	long long n = 0;

	ck_assert_int_eq(r->type, REDIS_REPLY_STRING);
	p = r->str != NULL ? strstr(r->str, "cmdstat_evalsha:calls=") : NULL;
	if (p != NULL)
		n = atoll(p + strlen("cmdstat_evalsha:calls="));
	freeReplyObject(r);
	return n;
}

START_TEST(test_batches_all_or_nothing)
{
	struct backend *b = new_backend_full(redis_url, 4, 5000, NULL);
	static struct batcher t[BATCH_THREADS];
	pthread_t th[BATCH_THREADS];
	int i, allowed = 0, errors = 0;
	long long scripts;

	cmd_ok("CONFIG RESETSTAT");
	for (i = 0; i < BATCH_THREADS; i++) {
		memset(&t[i], 0, sizeof(t[i]));
		t[i].b = b;
		t[i].id = i;
		pthread_mutex_init(&t[i].mu, NULL);
		pthread_cond_init(&t[i].cv, NULL);
		ck_assert_int_eq(pthread_create(&th[i], NULL, batcher_run,
				     &t[i]),
		    0);
	}
	for (i = 0; i < BATCH_THREADS; i++) {
		pthread_join(th[i], NULL);
		allowed += t[i].allowed;
		errors += t[i].errors;
		pthread_cond_destroy(&t[i].cv);
		pthread_mutex_destroy(&t[i].mu);
	}
	scripts = evalsha_calls();
	fprintf(stderr, "batches: %d calls in %lld script calls\n",
	    BATCH_THREADS * BATCH_CALLS, scripts);
	ck_assert_int_eq(errors, 0);
	ck_assert_int_eq(allowed, 400);
	ck_assert_int_eq(log_units("rl:wide:{k}"), 400);
	for (i = 0; i < 4; i++) {
		char key[32];

		snprintf(key, sizeof(key), "rl:narrow:{%d}", i);
		ck_assert_int_eq(log_units(key), 100);
	}
	ck_assert_msg(scripts > 0 && scripts < BATCH_THREADS * BATCH_CALLS,
	    "%lld script calls for %d calls: no batching", scripts,
	    BATCH_THREADS * BATCH_CALLS);
	backend_free(b);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("backend_redis");
	TCase *tc = tcase_create("redis");

	tcase_add_unchecked_fixture(tc, start_redis, stop_redis);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_sliding_log_limit_then_deny);
	tcase_add_test(tc, test_sliding_log_ttl_renewal);
	tcase_add_test(tc, test_takeback_keeps_ttl);
	tcase_add_test(tc, test_takeback_fails_when_redis_refuses);
	tcase_add_test(tc, test_takeback_of_a_lease_publishes);
	tcase_add_test(tc, test_sliding_log_unique_members);
	tcase_add_test(tc, test_sliding_log_large_cost);
	tcase_add_test(tc, test_all_or_nothing);
	tcase_add_test(tc, test_shadow);
	tcase_add_test(tc, test_cost_zero_leaves_no_key);
	tcase_add_test(tc, test_fixed_window);
	tcase_add_test(tc, test_token_bucket);
	tcase_add_test(tc, test_sliding_window);
	tcase_add_test(tc, test_noscript_recovery);
	tcase_add_test(tc, test_wrong_type_recovery);
	tcase_add_test(tc, test_concurrency_after_sliding_log_runs);
	tcase_add_test(tc, test_sliding_log_mixed_layouts);
	tcase_add_test(tc, test_sliding_log_older_at_one_end);
	tcase_add_test(tc, test_takeback_past_older_units);
	tcase_add_test(tc, test_sliding_log_rolling_upgrade_hot_key);
	tcase_add_test(tc, test_sliding_log_mixed_found_in_batch);
	tcase_add_test(tc, test_sliding_log_malformed_middle_member);
	tcase_add_test(tc, test_sliding_log_zero_run_member);
	tcase_add_test(tc, test_sliding_log_older_unit_on_top_of_many_runs);
	tcase_add_test(tc, test_sliding_log_older_unit_at_the_newest_runs_time);
	tcase_add_test(tc, test_timeout);
	tcase_add_test(tc, test_hang_counts_once);
	tcase_add_test(tc, test_connection_refused);
	tcase_add_test(tc, test_circuit_breaker);
	tcase_add_test(tc, test_circuit_refused_backoff_caps);
	tcase_add_test(tc, test_is_ready);
	tcase_add_test(tc, test_auth);
	tcase_add_test(tc, test_select_db_and_unix_url_errors);
	tcase_add_test(tc, test_unix_socket);
	tcase_add_test(tc, test_threads_share_the_pool);
	tcase_add_test(tc, test_batches_all_or_nothing);
	suite_add_tcase(s, tc);
	return s;
}
