/*
 * check_redis_conn.c - one pipelined Redis connection (src/store/redis_conn.c)
 * against a scripted fake server: a thread of the test listens on a
 * loopback port and plays a script of steps (accept, expect exactly these
 * bytes, send these, wait for the test, close), so every byte on the wire
 * is known.  The test drives the connection the way the store's event loop
 * does: poll(2) on redis_conn_fd(), then redis_conn_io().
 *
 * What is checked: the handshake queued ahead of the first command (AUTH
 * with or without a user, SELECT, SCRIPT LOAD, and no SCRIPT LOAD of a
 * script over 16 KiB before AUTH), replies handed back in order to the
 * commands they answer, a reply split across reads, an error reply (which
 * leaves the connection up), a failed AUTH, the peer closing mid-reply and
 * the connection made again, a refused connect, a server that stalls (the
 * owner's timeout closes it), the connect deadline, replies nobody asked
 * for, garbage on the wire, which commands a close says never left
 * (redis_conn_unwritten()), and ROLE holding back the commands behind it
 * until the owner accepts its answer (Sentinel).
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_main.h"

#include "base/util.h"
#include "core/redis_url.h"
#include "store/redis_conn.h"

#define WAIT_MS 5000 /* any one wait, server or client side */

/* --- the fake server ------------------------------------------------------ */

enum step_op {
	ACCEPT, /* accept the next connection */
	EXPECT, /* read exactly data, byte for byte */
	SEND,	/* write data */
	GATE,	/* tell the test, wait until it says go */
	CLOSE,	/* close the connection */
	END
};

struct step {
	enum step_op op;
	const char *data;
};

struct fake {
	int lfd, port, fd;
	const struct step *steps;
	pthread_t thread;
	sem_t at_gate, go;
	char err[512];
};

/* The first failure is the one the test reports. */
static void __attribute__((format(printf, 2, 3)))
fake_fail(struct fake *f, const char *fmt, ...)
{
	va_list ap;

	if (f->err[0] != '\0')
		return;
	va_start(ap, fmt);
	vsnprintf(f->err, sizeof(f->err), fmt, ap);
	va_end(ap);
}

static bool
fake_wait(int fd, short ev)
{
	struct pollfd p = { .fd = fd, .events = ev };

	return poll(&p, 1, WAIT_MS) == 1;
}

static void
fake_expect(struct fake *f, const char *want)
{
	size_t len = strlen(want), got = 0;
	char *buf = malloc(len + 1);
	ssize_t n;

	if (buf == NULL) {
		fake_fail(f, "out of memory");
		return;
	}
	while (got < len) {
		if (!fake_wait(f->fd, POLLIN)) {
			buf[got] = '\0';
			fake_fail(f, "expected \"%s\", got only \"%s\"", want,
			    buf);
			break;
		}
		n = recv(f->fd, buf + got, len - got, 0);
		if (n <= 0) {
			buf[got] = '\0';
			fake_fail(f, "expected \"%s\", got \"%s\" and EOF",
			    want, buf);
			break;
		}
		got += (size_t)n;
	}
	buf[got] = '\0';
	if (got == len && memcmp(buf, want, len) != 0)
		fake_fail(f, "expected \"%s\", got \"%s\"", want, buf);
	free(buf);
}

static void *
fake_run(void *arg)
{
	struct fake *f = arg;
	const struct step *s;
	size_t len;

	for (s = f->steps; s->op != END && f->err[0] == '\0'; s++) {
		switch (s->op) {
		case ACCEPT:
			if (!fake_wait(f->lfd, POLLIN) ||
			    (f->fd = accept(f->lfd, NULL, NULL)) < 0)
				fake_fail(f, "no connection came");
			break;
		case EXPECT:
			fake_expect(f, s->data);
			break;
		case SEND:
			len = strlen(s->data);
			if (send(f->fd, s->data, len, MSG_NOSIGNAL) !=
			    (ssize_t)len)
				fake_fail(f, "send \"%s\" failed", s->data);
			break;
		case GATE:
			sem_post(&f->at_gate);
			sem_wait(&f->go);
			break;
		case CLOSE:
			close(f->fd);
			f->fd = -1;
			break;
		case END:
			break;
		}
	}
	/* A failure must not leave the test waiting at a gate. */
	sem_post(&f->at_gate);
	return NULL;
}

/* Listen on a free loopback port and play steps in a thread.  What
 * remains open after the last step stays open (a server that stalls)
 * until fake_stop(). */
static void
fake_start(struct fake *f, const struct step *steps)
{
	memset(f, 0, sizeof(*f));
	f->fd = -1;
	f->steps = steps;
	f->lfd = test_listen(&f->port);
	ck_assert_int_eq(sem_init(&f->at_gate, 0, 0), 0);
	ck_assert_int_eq(sem_init(&f->go, 0, 0), 0);
	ck_assert_int_eq(pthread_create(&f->thread, NULL, fake_run, f), 0);
}

/* Wait for the script to end and fail the test if it did not go as
 * written. */
static void
fake_stop(struct fake *f)
{
	pthread_join(f->thread, NULL);
	if (f->fd >= 0)
		close(f->fd);
	close(f->lfd);
	ck_assert_msg(f->err[0] == '\0', "fake server: %s", f->err);
}

/* Wait for the script to end, then read what the client sends until it
 * closes (at most WAIT_MS) into rest, and stop as fake_stop(). */
static void
fake_stop_rest(struct fake *f, char *rest, size_t restlen)
{
	size_t got = 0;
	ssize_t n;

	pthread_join(f->thread, NULL);
	while (f->fd >= 0 && got + 1 < restlen && fake_wait(f->fd, POLLIN) &&
	    (n = recv(f->fd, rest + got, restlen - 1 - got, 0)) > 0)
		got += (size_t)n;
	rest[got] = '\0';
	if (f->fd >= 0)
		close(f->fd);
	close(f->lfd);
	ck_assert_msg(f->err[0] == '\0', "fake server: %s", f->err);
}

/* --- the client side ------------------------------------------------------ */

/* What one callback saw. */
struct rec {
	int arg;	/* which command */
	bool null;	/* no reply: err says why */
	bool unwritten; /* ... and redis_conn_unwritten() said so */
	int type;
	long long integer;
	char str[64];
	size_t elements;
	char err[160];
};

static struct rec recs[32];
static int nrec, npush;
static struct redis_conn *cur; /* the connection of the test */
static char push_err[160];

static void
on_reply(void *arg, redisReply *r, const char *err)
{
	struct rec *e;

	ck_assert_int_lt(nrec, 32);
	e = &recs[nrec++];
	memset(e, 0, sizeof(*e));
	e->arg = (int)(intptr_t)arg;
	e->null = r == NULL;
	if (r != NULL) {
		e->type = r->type;
		e->integer = r->integer;
		e->elements = r->elements;
		if (r->str != NULL)
			snprintf(e->str, sizeof(e->str), "%s", r->str);
	} else {
		snprintf(e->err, sizeof(e->err), "%s", err);
		e->unwritten = redis_conn_unwritten(cur);
	}
}

static void
on_push(void *arg, redisReply *r, const char *err)
{
	(void)arg;
	npush++;
	if (r == NULL)
		snprintf(push_err, sizeof(push_err), "%s", err);
	else
		ck_assert_int_eq(r->integer, 5);
}

static struct redis_url url;
static struct redis_conn_config cfg;

static struct redis_conn *
conn_new(const char *fmt, int port, const char *script)
{
	char text[256], err[256];
	struct redis_conn *c;

	nrec = npush = 0;
	push_err[0] = '\0';
	snprintf(text, sizeof(text), fmt, port);
	ck_assert_msg(redis_url_parse(text, &url, err, sizeof(err)) == 0, "%s",
	    err);
	cfg.url = &url;
	cfg.script = script;
	cfg.connect_timeout_us = 2000000;
	cfg.role_check = NULL;
	c = redis_conn_new(&cfg);
	ck_assert_ptr_nonnull(c);
	cur = c;
	return c;
}

static void
conn_free(struct redis_conn *c)
{
	redis_conn_free(c, "test over");
	redis_url_free(&url);
}

/* Queue one command given as words; its callback gets arg. */
static void
send_words(struct redis_conn *c, int arg, int argc, const char **argv)
{
	size_t lens[8];
	char err[256];
	int i;

	for (i = 0; i < argc; i++)
		lens[i] = strlen(argv[i]);
	ck_assert_msg(redis_conn_send(c, argc, argv, lens, on_reply,
			  (void *)(intptr_t)arg, err, sizeof(err)) == 0,
	    "%s", err);
}

#define SEND_CMD(c, arg, ...) \
	do { \
		const char *w_[] = { __VA_ARGS__ }; \
		send_words((c), (arg), (int)(sizeof(w_) / sizeof(w_[0])), w_); \
	} while (0)

/* One turn of the event loop: wait (at most ms) for what the connection
 * waits for, then let it work.  Returns the replies handed back. */
static size_t
turn(struct redis_conn *c, int ms)
{
	struct pollfd p;

	if (redis_conn_fd(c) < 0)
		return 0;
	p.fd = redis_conn_fd(c);
	p.events = POLLIN | (redis_conn_wants_write(c) ? POLLOUT : 0);
	p.revents = 0;
	if (poll(&p, 1, ms) <= 0)
		return 0;
	return redis_conn_io(c);
}

/* Turn until n callbacks ran (or the connection closed with nothing
 * left to report); fails the test after WAIT_MS. */
static size_t
pump_until(struct redis_conn *c, int n)
{
	int64_t end = util_monotonic_us() + WAIT_MS * 1000LL;
	size_t replies = 0;

	while (nrec < n) {
		ck_assert_msg(util_monotonic_us() < end,
		    "%d of %d callbacks "
		    "after %d ms (state %d)",
		    nrec, n, WAIT_MS, (int)redis_conn_state(c));
		ck_assert_msg(redis_conn_fd(c) >= 0,
		    "closed with %d of %d "
		    "callbacks: %s",
		    nrec, n, redis_conn_last_error(c));
		replies += turn(c, 50);
	}
	return replies;
}

/* Turn until the fake server is at its next gate, then read whatever it
 * sent before it. */
static void
pump_to_gate(struct redis_conn *c, struct fake *f)
{
	int64_t end = util_monotonic_us() + WAIT_MS * 1000LL;

	while (sem_trywait(&f->at_gate) != 0) {
		ck_assert_msg(util_monotonic_us() < end, "no gate");
		turn(c, 10);
	}
	turn(c, 200);
}

/* --- tests ---------------------------------------------------------------- */

#define PING   "*1\r\n$4\r\nPING\r\n"
#define GET(k) "*2\r\n$3\r\nGET\r\n$1\r\n" k "\r\n"

START_TEST(test_connect_and_reply)
{
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, PING },
		{ SEND, "+PONG\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;
	int64_t t0, t1;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CLOSED);
	ck_assert_int_eq(redis_conn_fd(c), -1);
	ck_assert_int_eq(redis_conn_pending(c), 0);
	ck_assert(redis_conn_oldest_us(c) == INT64_MAX);
	ck_assert(redis_conn_connect_deadline_us(c) == INT64_MAX);

	/* Sending connects; the deadline runs from then. */
	t0 = util_monotonic_us();
	SEND_CMD(c, 1, "PING");
	t1 = util_monotonic_us();
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CONNECTING);
	ck_assert_int_ge(redis_conn_fd(c), 0);
	ck_assert_uint_eq(redis_conn_generation(c), 1);
	ck_assert(redis_conn_wants_write(c));
	ck_assert_int_eq(redis_conn_pending(c), 1);
	ck_assert(redis_conn_oldest_us(c) >= t0 &&
	    redis_conn_oldest_us(c) <= t1);
	ck_assert(redis_conn_connect_deadline_us(c) >= t0 + 2000000 &&
	    redis_conn_connect_deadline_us(c) <= t1 + 2000000);

	ck_assert_uint_eq(pump_until(c, 1), 1);
	ck_assert_int_eq(recs[0].arg, 1);
	ck_assert(!recs[0].null);
	ck_assert_int_eq(recs[0].type, REDIS_REPLY_STATUS);
	ck_assert_str_eq(recs[0].str, "PONG");
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	ck_assert(!redis_conn_wants_write(c));
	ck_assert_int_eq(redis_conn_pending(c), 0);
	ck_assert(redis_conn_oldest_us(c) == INT64_MAX);
	ck_assert(redis_conn_connect_deadline_us(c) == INT64_MAX);
	ck_assert_str_eq(redis_conn_last_error(c), "");
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_handshake)
{
	/* AUTH user pass, SELECT db, SCRIPT LOAD, then the command, in
	 * one stream; only the command's reply reaches the caller. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT,
		    "*3\r\n$4\r\nAUTH\r\n$5\r\nalice\r\n$6\r\ns3cr3t\r\n"
		    "*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n"
		    "*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$8\r\nreturn 1\r\n" GET(
			"k") },
		{ SEND,
		    "+OK\r\n+OK\r\n"
		    "$40\r\ne0e1f9fabfc9d4800c877a703b823ac0578ff831\r\n"
		    "$1\r\nv\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://alice:s3cr3t@127.0.0.1:%d/3", f.port, "return 1");
	SEND_CMD(c, 7, "GET", "k");
	ck_assert_int_eq(redis_conn_pending(c), 4);
	ck_assert_uint_eq(pump_until(c, 1), 4);
	ck_assert_int_eq(nrec, 1);
	ck_assert_int_eq(recs[0].arg, 7);
	ck_assert_int_eq(recs[0].type, REDIS_REPLY_STRING);
	ck_assert_str_eq(recs[0].str, "v");
	ck_assert_int_eq(redis_conn_pending(c), 0);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_handshake_password_big_script)
{
	/* A password alone is "AUTH pass"; db 0 sends no SELECT; a script
	 * over 16 KiB is not loaded ahead of AUTH (Redis would refuse the
	 * unauthenticated bulk): it waits for its first NOSCRIPT. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, "*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n" PING },
		{ SEND, "+OK\r\n+PONG\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;
	char *script = malloc(16386);

	ck_assert_ptr_nonnull(script);
	memset(script, '-', 16385);
	script[16385] = '\0';
	fake_start(&f, steps);
	c = conn_new("redis://:pw@127.0.0.1:%d/0", f.port, script);
	SEND_CMD(c, 1, "PING");
	ck_assert_int_eq(redis_conn_pending(c), 2);
	pump_until(c, 1);
	ck_assert_str_eq(recs[0].str, "PONG");
	fake_stop(&f);
	conn_free(c);
	free(script);
}
END_TEST

START_TEST(test_auth_refused)
{
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, "*2\r\n$4\r\nAUTH\r\n$3\r\nbad\r\n" GET("k") },
		{ SEND, "-WRONGPASS invalid username-password pair\r\n" },
		{ END, NULL },
	};
	static const char why[] =
	    "AUTH failed: WRONGPASS invalid username-password pair";
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://:bad@127.0.0.1:%d", f.port, NULL);
	redis_conn_set_push(c, on_push, NULL);
	SEND_CMD(c, 1, "GET", "k");
	pump_until(c, 1);
	ck_assert(recs[0].null);
	ck_assert_str_eq(recs[0].err, why);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CLOSED);
	ck_assert_int_eq(redis_conn_fd(c), -1);
	ck_assert_int_eq(redis_conn_pending(c), 0);
	ck_assert_str_eq(redis_conn_last_error(c), why);
	/* The push function hears of the close after the commands. */
	ck_assert_int_eq(npush, 1);
	ck_assert_str_eq(push_err, why);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_pipelined_in_order)
{
	/* Three commands queued in one turn leave together; the replies,
	 * arriving in one segment, go to them in order. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT,
		    "*2\r\n$4\r\nINCR\r\n$1\r\na\r\n"
		    "*2\r\n$4\r\nINCR\r\n$1\r\nb\r\n" GET("c") },
		{ SEND, ":1\r\n:2\r\n$1\r\nz\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	SEND_CMD(c, 10, "INCR", "a");
	SEND_CMD(c, 11, "INCR", "b");
	SEND_CMD(c, 12, "GET", "c");
	ck_assert_int_eq(redis_conn_pending(c), 3);
	ck_assert_uint_eq(pump_until(c, 3), 3);
	ck_assert_int_eq(recs[0].arg, 10);
	ck_assert_int_eq(recs[0].integer, 1);
	ck_assert_int_eq(recs[1].arg, 11);
	ck_assert_int_eq(recs[1].integer, 2);
	ck_assert_int_eq(recs[2].arg, 12);
	ck_assert_str_eq(recs[2].str, "z");
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_reply_split_across_reads)
{
	/* A bulk string cut in its middle, then an array cut between \r
	 * and \n: nothing is handed back before a reply is whole. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, GET("a") GET("b") },
		{ SEND, "$5\r\nhel" },
		{ GATE, NULL },
		{ SEND, "lo\r\n*2\r\n:1\r" },
		{ GATE, NULL },
		{ SEND, "\n:2\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	SEND_CMD(c, 1, "GET", "a");
	SEND_CMD(c, 2, "GET", "b");
	pump_to_gate(c, &f);
	ck_assert_int_eq(nrec, 0);
	ck_assert_int_eq(redis_conn_pending(c), 2);
	sem_post(&f.go);
	pump_to_gate(c, &f);
	ck_assert_int_eq(nrec, 1);
	ck_assert_int_eq(recs[0].arg, 1);
	ck_assert_str_eq(recs[0].str, "hello");
	ck_assert_int_eq(redis_conn_pending(c), 1);
	sem_post(&f.go);
	pump_until(c, 2);
	ck_assert_int_eq(recs[1].arg, 2);
	ck_assert_int_eq(recs[1].type, REDIS_REPLY_ARRAY);
	ck_assert_uint_eq(recs[1].elements, 2);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_error_reply_keeps_connection)
{
	/* An error reply (NOSCRIPT, which the store answers with EVAL) is
	 * a reply like any other: the connection stays up. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, "*3\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n0\r\n" },
		{ SEND, "-NOSCRIPT No matching script. Please use EVAL.\r\n" },
		{ EXPECT, PING },
		{ SEND, "+PONG\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	SEND_CMD(c, 1, "EVALSHA", "abc", "0");
	pump_until(c, 1);
	ck_assert(!recs[0].null);
	ck_assert_int_eq(recs[0].type, REDIS_REPLY_ERROR);
	ck_assert_str_eq(recs[0].str,
	    "NOSCRIPT No matching script. Please use EVAL.");
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	SEND_CMD(c, 2, "PING");
	pump_until(c, 2);
	ck_assert_str_eq(recs[1].str, "PONG");
	ck_assert_uint_eq(redis_conn_generation(c), 1);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_peer_closes_mid_reply)
{
	/* The first reply is whole, the second cut by the close: it fails
	 * with the reason, and the next send connects anew. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, GET("a") GET("b") },
		{ SEND, ":1\r\n$10\r\nabc" },
		{ CLOSE, NULL },
		{ ACCEPT, NULL },
		{ EXPECT, PING },
		{ SEND, "+PONG\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	redis_conn_set_push(c, on_push, NULL);
	SEND_CMD(c, 1, "GET", "a");
	SEND_CMD(c, 2, "GET", "b");
	pump_until(c, 2);
	ck_assert(!recs[0].null);
	ck_assert_int_eq(recs[0].integer, 1);
	ck_assert(recs[1].null);
	ck_assert_str_eq(recs[1].err, "connection closed by the server");
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CLOSED);
	ck_assert_int_eq(redis_conn_pending(c), 0);
	ck_assert_int_eq(npush, 1);
	ck_assert_str_eq(push_err, "connection closed by the server");

	SEND_CMD(c, 3, "PING");
	ck_assert_uint_eq(redis_conn_generation(c), 2);
	pump_until(c, 3);
	ck_assert_str_eq(recs[2].str, "PONG");
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	/* The reason of the last close stays for the logs. */
	ck_assert_str_eq(redis_conn_last_error(c),
	    "connection closed by the server");
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_connect_refused)
{
	/* Nobody listens.  A non-blocking connect may be refused at once
	 * (send fails, no callback) or a moment later (the callback). */
	struct redis_conn *c;
	const char *argv[1] = { "PING" };
	size_t lens[1] = { 4 };
	char err[256];

	c = conn_new("redis://127.0.0.1:%d", test_free_port(), NULL);
	redis_conn_set_push(c, on_push, NULL);
	if (redis_conn_send(c, 1, argv, lens, on_reply, NULL, err,
		sizeof(err)) == -1) {
		ck_assert_str_eq(err, "connect: Connection refused");
		ck_assert_int_eq(nrec, 0);
	} else {
		ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CONNECTING);
		pump_until(c, 1);
		ck_assert(recs[0].null);
		ck_assert_str_eq(recs[0].err, "connect: Connection refused");
		ck_assert(recs[0].unwritten); /* it never left */
		/* It was open (connecting): the push function hears of
		 * the close too. */
		ck_assert_int_eq(npush, 1);
		ck_assert_str_eq(push_err, "connect: Connection refused");
	}
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CLOSED);
	ck_assert_int_eq(redis_conn_fd(c), -1);
	ck_assert_int_eq(redis_conn_pending(c), 0);
	ck_assert_str_eq(redis_conn_last_error(c),
	    "connect: Connection refused");
	conn_free(c);
}
END_TEST

START_TEST(test_stalled_server)
{
	/* The server reads the command and says nothing.  The connection
	 * waits as long as it is let: the owner's timeout (from
	 * redis_conn_oldest_us) closes it, failing the command with why. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, GET("k") },
		{ GATE, NULL },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;
	int64_t t0, t1;
	int i;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	t0 = util_monotonic_us();
	SEND_CMD(c, 1, "GET", "k");
	t1 = util_monotonic_us();
	pump_to_gate(c, &f);
	for (i = 0; i < 10; i++)
		turn(c, 10);
	ck_assert_int_eq(nrec, 0);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	ck_assert_int_eq(redis_conn_pending(c), 1);
	ck_assert(redis_conn_oldest_us(c) >= t0 &&
	    redis_conn_oldest_us(c) <= t1);
	redis_conn_close(c, "timeout");
	ck_assert_int_eq(nrec, 1);
	ck_assert(recs[0].null);
	ck_assert_str_eq(recs[0].err, "timeout");
	ck_assert_int_eq(redis_conn_fd(c), -1);
	ck_assert_str_eq(redis_conn_last_error(c), "timeout");
	sem_post(&f.go);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_free_fails_in_flight)
{
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, GET("k") GET("l") },
		{ GATE, NULL },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	SEND_CMD(c, 1, "GET", "k");
	SEND_CMD(c, 2, "GET", "l");
	pump_to_gate(c, &f);
	redis_conn_free(c, "shutting down");
	ck_assert_int_eq(nrec, 2);
	ck_assert_int_eq(recs[0].arg, 1);
	ck_assert_str_eq(recs[0].err, "shutting down");
	ck_assert_int_eq(recs[1].arg, 2);
	ck_assert_str_eq(recs[1].err, "shutting down");
	sem_post(&f.go);
	fake_stop(&f);
	redis_url_free(&url);
}
END_TEST

START_TEST(test_unwritten_on_close)
{
	/* A close tells each command whether any of its bytes left: not
	 * while connecting, nor when queued after the last write; yes once
	 * written (it may have run). */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, GET("a") },
		{ GATE, NULL },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;
	int lfd, port;

	lfd = test_listen(&port); /* never accepts */
	c = conn_new("redis://127.0.0.1:%d", port, NULL);
	SEND_CMD(c, 1, "GET", "a");
	ck_assert_int_ne(redis_conn_state(c), REDIS_CONN_UP);
	redis_conn_close(c, "the primary moved");
	ck_assert_int_eq(nrec, 1);
	ck_assert(recs[0].null && recs[0].unwritten);
	ck_assert(!redis_conn_unwritten(c)); /* only inside the callback */
	conn_free(c);
	close(lfd);

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	SEND_CMD(c, 1, "GET", "a");
	pump_to_gate(c, &f);
	SEND_CMD(c, 2, "GET", "b"); /* queued, not written yet */
	redis_conn_close(c, "the primary moved");
	ck_assert_int_eq(nrec, 2);
	ck_assert_int_eq(recs[0].arg, 1);
	ck_assert(recs[0].null && !recs[0].unwritten);
	ck_assert_int_eq(recs[1].arg, 2);
	ck_assert(recs[1].null && recs[1].unwritten);
	sem_post(&f.go);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

/* The owner's view of ROLE: "master" passes, anything else does not. */
static int nroles;
static char role_seen[32];

static bool
role_check(void *arg, const redisReply *r, char *why, size_t whylen)
{
	(void)arg;
	nroles++;
	snprintf(role_seen, sizeof(role_seen), "%s",
	    r->type == REDIS_REPLY_ARRAY && r->elements > 0 ?
		r->element[0]->str :
		"?");
	snprintf(why, whylen, "%s, not the primary", role_seen);
	return strcmp(role_seen, "master") == 0;
}

#define ROLE "*1\r\n$4\r\nROLE\r\n"

START_TEST(test_role_holds_commands)
{
	/* ROLE ends the handshake; the command queued behind it is not
	 * written until the answer is accepted. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, ROLE },
		{ GATE, NULL },
		{ SEND, "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n" },
		{ EXPECT, GET("a") },
		{ SEND, "$1\r\nv\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;
	char byte;

	nroles = 0;
	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	cfg.role_check = role_check;
	SEND_CMD(c, 1, "GET", "a");
	pump_to_gate(c, &f);
	/* Only ROLE reached the server. */
	ck_assert_int_eq(recv(f.fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK), -1);
	ck_assert(!redis_conn_wants_write(c));
	ck_assert_int_eq(nroles, 0);
	sem_post(&f.go);
	ck_assert_uint_eq(pump_until(c, 1), 2);
	ck_assert_int_eq(nroles, 1);
	ck_assert_str_eq(role_seen, "master");
	ck_assert_int_eq(nrec, 1);
	ck_assert_int_eq(recs[0].arg, 1);
	ck_assert_str_eq(recs[0].str, "v");
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_role_refused)
{
	/* A replica: the connection closes, and the commands held behind
	 * ROLE never left (redis_conn_unwritten()), so the owner may send
	 * them elsewhere. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, ROLE },
		{ SEND, "*1\r\n$5\r\nslave\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;
	char rest[256];

	nroles = 0;
	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	cfg.role_check = role_check;
	SEND_CMD(c, 1, "GET", "a");
	SEND_CMD(c, 2, "GET", "b");
	ck_assert_uint_eq(pump_until(c, 2), 1);
	ck_assert_int_eq(nroles, 1);
	ck_assert(recs[0].null && recs[0].unwritten);
	ck_assert(recs[1].null && recs[1].unwritten);
	ck_assert_str_eq(recs[0].err, "slave, not the primary");
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CLOSED);
	fake_stop_rest(&f, rest, sizeof(rest));
	ck_assert_str_eq(rest, ""); /* nothing but ROLE, then EOF */
	conn_free(c);
}
END_TEST

START_TEST(test_unasked_reply)
{
	/* A reply with no command waiting closes a connection without a
	 * push function, and goes to it when there is one. */
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, PING },
		{ SEND, "+PONG\r\n:5\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;
	int i;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	SEND_CMD(c, 1, "PING");
	pump_until(c, 1);
	for (i = 0; i < 20 && redis_conn_fd(c) >= 0; i++)
		turn(c, 10);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CLOSED);
	ck_assert_str_eq(redis_conn_last_error(c),
	    "protocol: a reply nobody asked for");
	fake_stop(&f);
	conn_free(c);

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	redis_conn_set_push(c, on_push, NULL);
	SEND_CMD(c, 1, "PING");
	pump_until(c, 1);
	for (i = 0; i < 20 && npush == 0; i++)
		turn(c, 10);
	ck_assert_int_eq(npush, 1);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_UP);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

START_TEST(test_garbage_on_the_wire)
{
	static const struct step steps[] = {
		{ ACCEPT, NULL },
		{ EXPECT, GET("k") },
		{ SEND, "?x\r\n" },
		{ END, NULL },
	};
	struct redis_conn *c;
	struct fake f;

	fake_start(&f, steps);
	c = conn_new("redis://127.0.0.1:%d", f.port, NULL);
	SEND_CMD(c, 1, "GET", "k");
	pump_until(c, 1);
	ck_assert(recs[0].null);
	ck_assert_msg(strncmp(recs[0].err, "protocol: Protocol error", 24) == 0,
	    "%s", recs[0].err);
	ck_assert_int_eq(redis_conn_state(c), REDIS_CONN_CLOSED);
	fake_stop(&f);
	conn_free(c);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("redis_conn");
	TCase *tc = tcase_create("fake_server");

	tcase_add_test(tc, test_connect_and_reply);
	tcase_add_test(tc, test_handshake);
	tcase_add_test(tc, test_handshake_password_big_script);
	tcase_add_test(tc, test_auth_refused);
	tcase_add_test(tc, test_pipelined_in_order);
	tcase_add_test(tc, test_reply_split_across_reads);
	tcase_add_test(tc, test_error_reply_keeps_connection);
	tcase_add_test(tc, test_peer_closes_mid_reply);
	tcase_add_test(tc, test_connect_refused);
	tcase_add_test(tc, test_stalled_server);
	tcase_add_test(tc, test_free_fails_in_flight);
	tcase_add_test(tc, test_unwritten_on_close);
	tcase_add_test(tc, test_role_holds_commands);
	tcase_add_test(tc, test_role_refused);
	tcase_add_test(tc, test_unasked_reply);
	tcase_add_test(tc, test_garbage_on_the_wire);
	suite_add_tcase(s, tc);
	return s;
}
