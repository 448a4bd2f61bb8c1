/*
 * check_limits.c - the daemon's defences against clients it does not
 * trust (docs/security.md, RFC 9112 framing), from raw sockets:
 *   - request smuggling shapes: two Content-Length values, Content-Length
 *     with Transfer-Encoding, a header name with a space before its colon,
 *     an unknown Transfer-Encoding: each answered 400/501 and closed, and
 *     the request hidden behind it never answered;
 *   - max_connections: past it a connection is closed at once, and a
 *     place that frees up is taken again;
 *   - request_timeout: a client that dribbles its headers is cut off while
 *     other clients are answered as usual;
 *   - idle_timeout: a silent keep-alive connection is closed;
 *   - max_header_bytes (431) and max_attributes (400), for /acquire and
 *     /auth;
 *   - listen: unix: a live daemon's socket is never taken over; a stale one
 *     is; one that cannot be judged stale (a datagram socket) is kept and
 *     the start fails; listen_mode sets its mode; a clean exit removes
 *     the socket files it bound, and only those;
 *   - listen: a name whose first address cannot be bound serves on the
 *     next one;
 *   - user: started as root, the daemon serves as that user, and its unix
 *     socket is that user's.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"
#include "ops.h"

static const char head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "backend: memory\n";

static const char rules[] =
    "rules:\n"
    "  - name: r\n"
    "    key: \"${user}\"\n"
    "    limit: 1000000\n"
    "    window: 60s\n";

static void
start(struct h_daemon *d, const char *extra)
{
	char yaml[2048];

	snprintf(yaml, sizeof(yaml), "%s%s%s", head, extra, rules);
	h_daemon_start(d, yaml);
}

/* --- raw sockets ------------------------------------------------------- */

static int
raw_connect(int port)
{
	struct sockaddr_in sin;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_msg(connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0,
	    "connect: %s", strerror(errno));
	return fd;
}

static void
raw_send(int fd, const char *s)
{
	size_t n = strlen(s);

	ck_assert_msg(send(fd, s, n, MSG_NOSIGNAL) == (ssize_t)n, "send: %s",
	    strerror(errno));
}

/*
 * Read what comes within ms into buf (NUL-terminated); *closed says
 * whether the peer closed (EOF or reset) by then.
 */
static size_t
raw_read(int fd, char *buf, size_t cap, int ms, bool *closed)
{
	long long until = h_now_ms() + ms;
	size_t have = 0;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	ssize_t n;

	*closed = false;
	buf[0] = '\0';
	while (h_now_ms() < until) {
		if (poll(&p, 1, (int)(until - h_now_ms())) <= 0)
			break;
		n = recv(fd, buf + have, cap - 1 - have, 0);
		if (n <= 0) {
			*closed = true;
			break;
		}
		have += (size_t)n;
		buf[have] = '\0';
		if (have + 1 >= cap)
			break;
	}
	return have;
}

static int
count(const char *hay, const char *needle)
{
	int n = 0;

	for (; (hay = strstr(hay, needle)) != NULL; hay++)
		n++;
	return n;
}

/* --- framing ------------------------------------------------------------ */

struct shape {
	const char *name;
	const char *bytes;
	const char *status; /* the status line's start */
};

/* Each shape hides a second request, GET /metrics, behind the first: it
 * must never be answered, and the connection must close. */
/* clang-format off */
static const struct shape shapes[] = {
	{ "two Content-Length values",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n"
	  "Content-Length: 44\r\n\r\n{\"user\":\"a\"}"
	  "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400" },
	{ "Content-Length with Transfer-Encoding",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
	  "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
	  "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400" },
	{ "a space before the colon",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Length : 34\r\n\r\n"
	  "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400" },
	{ "a Content-Length folded onto the next line",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n 34\r\n"
	  "\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400" },
	{ "an unknown Transfer-Encoding",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
	  "\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 501" },
	/* libmicrohttpd refuses these three itself, and used to write its
	 * answer twice (two status lines, the first with no body). */
	{ "a signed Content-Length",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Length: +9\r\n\r\n"
	  "{\"u\":\"1\"}GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
	  "HTTP/1.1 400" },
	{ "a Content-Length list",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 9, 9\r\n"
	  "\r\n{\"u\":\"1\"}GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
	  "HTTP/1.1 400" },
	{ "a Content-Length past 2^64",
	  "POST /acquire HTTP/1.1\r\nHost: x\r\n"
	  "Content-Length: 99999999999999999999999\r\n\r\n"
	  "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 413" },
};
/* clang-format on */

START_TEST(test_smuggling_shapes)
{
	const struct shape *sh = &shapes[_i];
	struct h_daemon d = { 0 };
	char buf[8192];
	bool closed;
	int fd;

	start(&d, "");
	fd = raw_connect(d.port);
	raw_send(fd, sh->bytes);
	raw_read(fd, buf, sizeof(buf), 3000, &closed);
	ck_assert_msg(strncmp(buf, sh->status, strlen(sh->status)) == 0,
	    "%s: answered \"%.40s\", expected %s", sh->name, buf, sh->status);
	ck_assert_msg(count(buf, "HTTP/1.1 ") == 1,
	    "%s: %d answers: the "
	    "hidden request was served",
	    sh->name, count(buf, "HTTP/1.1 "));
	ck_assert_msg(strstr(buf, "ratelimitd_") == NULL,
	    "%s: /metrics was "
	    "served",
	    sh->name);
	ck_assert_msg(closed, "%s: the connection stayed open", sh->name);
	close(fd);
	h_daemon_stop(&d);
}
END_TEST

/* A well-formed keep-alive exchange still works: two requests, two
 * answers, on one connection (the checks above refuse only bad shapes). */
START_TEST(test_keepalive_still_works)
{
	struct h_daemon d = { 0 };
	char buf[8192];
	bool closed;
	int fd;

	start(&d, "");
	fd = raw_connect(d.port);
	raw_send(fd,
	    "POST /acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 12"
	    "\r\n\r\n{\"user\":\"a\"}POST /acquire HTTP/1.1\r\nHost: x\r\n"
	    "Transfer-Encoding: chunked\r\n\r\nc\r\n{\"user\":\"b\"}\r\n0\r\n"
	    "\r\n");
	raw_read(fd, buf, sizeof(buf), 1500, &closed);
	ck_assert_msg(count(buf, "HTTP/1.1 200") == 2,
	    "expected two 200s: "
	    "%s",
	    buf);
	ck_assert(!closed);
	close(fd);
	h_daemon_stop(&d);
}
END_TEST

/* Header names made of every character a token may hold (RFC 9110 5.1:
 * letters, digits and !#$%&'*+-.^_`|~) are taken; one with a character
 * past them, '@' or a byte past ASCII, is refused. */
START_TEST(test_token_names)
{
	static const struct {
		const char *headers, *status;
	} cases[] = {
		{ "azAZ09-!#$%&'*+.^_`|~: 1\r\nX-Y: 2\r\n", "HTTP/1.1 200" },
		{ "X@Y: 1\r\n", "HTTP/1.1 400" },
		{ "X\xc3\xa9: 1\r\n", "HTTP/1.1 400" },
	};
	struct h_daemon d = { 0 };
	char req[512], buf[8192];
	bool closed;
	size_t i;
	int fd;

	start(&d, "");
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(req, sizeof(req),
		    "POST /acquire HTTP/1.1\r\nHost: x\r\n%sContent-Length: "
		    "12\r\n\r\n{\"user\":\"a\"}",
		    cases[i].headers);
		fd = raw_connect(d.port);
		raw_send(fd, req);
		raw_read(fd, buf, sizeof(buf), 1500, &closed);
		ck_assert_msg(strncmp(buf, cases[i].status, 12) == 0, "%s: %s",
		    cases[i].headers, buf);
		close(fd);
	}
	h_daemon_stop(&d);
}
END_TEST

/* --- connections -------------------------------------------------------- */

START_TEST(test_max_connections)
{
	struct h_daemon d = { 0 };
	int fds[20], extra, again, i;
	char buf[512];
	bool closed;

	start(&d, "max_connections: 20\n");
	/* h_daemon_start's /healthz connection may still be closing. */
	h_sleep_ms(200);
	for (i = 0; i < 20; i++)
		fds[i] = raw_connect(d.port);
	h_sleep_ms(300);
	extra = raw_connect(d.port);
	raw_send(extra, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
	raw_read(extra, buf, sizeof(buf), 2000, &closed);
	ck_assert_msg(closed && buf[0] == '\0',
	    "connection 21 of 20 was "
	    "%s (\"%.20s\")",
	    closed ? "answered" : "kept waiting", buf);
	close(extra);
	/* The held ones are served. */
	raw_send(fds[0], "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
	raw_read(fds[0], buf, sizeof(buf), 2000, &closed);
	ck_assert_msg(strncmp(buf, "HTTP/1.1 200", 12) == 0,
	    "a held "
	    "connection: \"%.20s\"",
	    buf);
	/* A place freed is taken again. */
	close(fds[1]);
	h_sleep_ms(300);
	again = raw_connect(d.port);
	raw_send(again, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
	raw_read(again, buf, sizeof(buf), 2000, &closed);
	ck_assert_msg(strncmp(buf, "HTTP/1.1 200", 12) == 0,
	    "after one "
	    "closed: \"%.20s\"",
	    buf);
	close(again);
	for (i = 0; i < 20; i++)
		if (i != 1)
			close(fds[i]);
	h_daemon_stop(&d);
}
END_TEST

/*
 * request_timeout 1s: a client sends a header byte every 100 ms, so it is
 * never silent; it is cut within a few seconds, and a normal client is
 * answered meanwhile.
 */
START_TEST(test_request_timeout_dribbler)
{
	static const char req[] =
	    "POST /acquire HTTP/1.1\r\nHost: x\r\n"
	    "X-Slow: 0123456789012345678901234567890123456789012345678901"
	    "23456789\r\n";
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long t0 = 0, cut_ms = -1;
	char one[2] = { 0 }, buf[512];
	bool closed = false;
	size_t i;
	int fd;

	start(&d, "request_timeout: 1s\nidle_timeout: 30s\n");
	fd = raw_connect(d.port);
	t0 = h_now_ms();
	for (i = 0; i < sizeof(req) - 1 && h_now_ms() - t0 < 6000; i++) {
		one[0] = req[i % (sizeof(req) - 1)];
		if (send(fd, one, 1, MSG_NOSIGNAL) != 1) {
			cut_ms = h_now_ms() - t0;
			break;
		}
		raw_read(fd, buf, sizeof(buf), 100, &closed);
		if (closed) {
			cut_ms = h_now_ms() - t0;
			break;
		}
		if (i == 10) {
			h_http(&r, "GET", "/healthz", NULL, NULL);
			ck_assert_int_eq(r.status, 200);
			h_resp_free(&r);
		}
	}
	ck_assert_msg(cut_ms >= 900 && cut_ms < 4000,
	    "the dribbling client "
	    "was %s after %lld ms (request_timeout 1s)",
	    cut_ms < 0 ? "never cut" : "cut",
	    cut_ms < 0 ? h_now_ms() - t0 : cut_ms);
	close(fd);
	h_daemon_stop(&d);
}
END_TEST

/* A request begun right after the previous answer on a keep-alive
 * connection, or pipelined behind it, and then left unfinished, is cut
 * at request_timeout too, not left to idle_timeout: its first bytes came
 * before the guard saw the previous request end.  (Both were held 30 s,
 * to idle_timeout.) */
START_TEST(test_request_timeout_after_keepalive)
{
	static const char full[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
	static const char part[] = "POST /acquire HTTP/1.1\r\nHost: x\r\n";
	struct h_daemon d = { 0 };
	char buf[1024], both[256];
	bool closed;
	long long t0;
	int fd, k;

	start(&d, "request_timeout: 1s\nidle_timeout: 30s\n");
	snprintf(both, sizeof(both), "%s%s", full, part);
	for (k = 0; k < 2; k++) {
		fd = raw_connect(d.port);
		if (k == 0) {
			raw_send(fd, full);
			raw_read(fd, buf, sizeof(buf), 1000, &closed);
			ck_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0);
			raw_send(fd, part);
		} else
			raw_send(fd, both);
		t0 = h_now_ms();
		closed = false;
		while (!closed && h_now_ms() - t0 < 6000)
			raw_read(fd, buf, sizeof(buf), 200, &closed);
		ck_assert_msg(closed && h_now_ms() - t0 < 4000,
		    "%s: the unfinished request was %s after %lld ms "
		    "(request_timeout 1s)",
		    k == 0 ? "after an answer" : "pipelined",
		    closed ? "cut" : "never cut", h_now_ms() - t0);
		close(fd);
	}
	h_daemon_stop(&d);
}
END_TEST

START_TEST(test_idle_timeout)
{
	struct h_daemon d = { 0 };
	char buf[512];
	bool closed;
	long long t0;
	int fd;

	start(&d, "idle_timeout: 1s\n");
	fd = raw_connect(d.port);
	t0 = h_now_ms();
	raw_send(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
	raw_read(fd, buf, sizeof(buf), 300, &closed);
	ck_assert_msg(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%.20s", buf);
	ck_assert(!closed);
	raw_read(fd, buf, sizeof(buf), 5000, &closed);
	ck_assert_msg(closed,
	    "an idle connection was still open after 5 s "
	    "(idle_timeout 1s)");
	ck_assert_msg(h_now_ms() - t0 >= 800,
	    "closed after %lld ms, before "
	    "idle_timeout",
	    h_now_ms() - t0);
	close(fd);
	h_daemon_stop(&d);
}
END_TEST

/* A metric's value from a fresh scrape of the current daemon. */
static long long
metric(const char *series)
{
	return (long long)ops_metric(series);
}

/*
 * 250 clients send headers and half a body, then close; 300 more dribble
 * their headers a byte at a time.  Meanwhile every normal request is
 * answered within a second, and within request_timeout (1 s) plus a few
 * ticks all of them are gone (libmicrohttpd's epoll loop never noticed the
 * closed ones: they stayed 60 s and locked new clients out).
 */
START_TEST(test_slow_and_half_sent_clients)
{
	enum { HALF = 250, SLOW = 300, NORMAL = 20 };
	static int slow[SLOW];
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long t0, took, worst = 0, open_now = -1;
	struct rlimit rl = { 4096, 4096 };
	int i, k, fd;

	setrlimit(RLIMIT_NOFILE, &rl);
	start(&d, "request_timeout: 1s\n");
	for (i = 0; i < HALF; i++) {
		fd = raw_connect(d.port);
		raw_send(fd,
		    "POST /acquire HTTP/1.1\r\nHost: x\r\n"
		    "Content-Length: 100\r\n\r\n{\"user\":");
		close(fd);
	}
	for (i = 0; i < SLOW; i++) {
		slow[i] = raw_connect(d.port);
		raw_send(slow[i], "POST /acq");
	}
	for (k = 0; k < NORMAL; k++) {
		for (i = 0; i < SLOW; i++)
			(void)send(slow[i], "u", 1, MSG_NOSIGNAL);
		t0 = h_now_ms();
		h_http(&r, "POST", "/acquire", "{\"user\":\"n\"}", NULL);
		took = h_now_ms() - t0;
		ck_assert_msg(r.status == 200, "normal request %d: %ld", k,
		    r.status);
		h_resp_free(&r);
		if (took > worst)
			worst = took;
		h_sleep_ms(100);
	}
	fprintf(stderr,
	    "slow clients: slowest of %d normal requests %lld "
	    "ms\n",
	    NORMAL, worst);
	ck_assert_msg(worst < 1000,
	    "a normal request took %lld ms among "
	    "%d slow and %d half-sent clients",
	    worst, SLOW, HALF);
	for (i = 0; i < 40; i++) {
		h_sleep_ms(100);
		if ((open_now = metric("ratelimitd_http_connections_open")) <=
		    5)
			break;
	}
	ck_assert_msg(open_now >= 0 && open_now <= 5,
	    "%lld connections "
	    "still open 6 s later (request_timeout 1s)",
	    open_now);
	/* Every dribbler was cut; the half-sent ones were cut or reaped. */
	ck_assert_int_ge(metric("ratelimitd_http_requests_cut_total"), SLOW);
	for (i = 0; i < SLOW; i++)
		close(slow[i]);
	h_daemon_stop(&d);
}
END_TEST

/* 10,000 connections (the default max_connections) held open at once,
 * and every one answered (libmicrohttpd's default limit answered about
 * 1,020). */
START_TEST(test_ten_thousand_connections)
{
	enum { N = 10000 };
	static int fds[N];
	struct h_daemon d = { 0 };
	struct rlimit rl = { N + 512, N + 512 };
	char buf[256];
	int i, answered = 0;
	struct pollfd p;

	ck_assert_msg(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit: %s",
	    strerror(errno));
	start(&d, "");
	for (i = 0; i < N; i++) {
		fds[i] = raw_connect(d.port);
		raw_send(fds[i], "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
	}
	for (i = 0; i < N; i++) {
		p.fd = fds[i];
		p.events = POLLIN;
		if (poll(&p, 1, 10000) == 1 &&
		    recv(fds[i], buf, sizeof(buf) - 1, 0) >= 12 &&
		    strncmp(buf, "HTTP/1.1 200", 12) == 0)
			answered++;
	}
	ck_assert_msg(answered == N, "%d of %d connections answered", answered,
	    N);
	/* Full: one more is refused; one closed makes room for it. */
	close(fds[0]);
	h_sleep_ms(500);
	ck_assert_int_ge(metric("ratelimitd_http_connections_open"), N - 1);
	for (i = 1; i < N; i++)
		close(fds[i]);
	h_daemon_stop(&d);
}
END_TEST

/* The soft "Max open files" of pid, from /proc. */
static long long
soft_nofile(pid_t pid)
{
	char path[64], line[256];
	long long soft = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	ck_assert_msg((f = fopen(path, "r")) != NULL, "%s: %s", path,
	    strerror(errno));
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "Max open files", 14) == 0)
			soft = strtoll(line + 14, NULL, 10);
	fclose(f);
	return soft;
}

/* Write max_connections n into d's file and reload it by SIGHUP. */
static void
reload_max_connections(struct h_daemon *d, int n, int reloads)
{
	char yaml[2048], extra[64];

	snprintf(extra, sizeof(extra), "max_connections: %d\n", n);
	snprintf(yaml, sizeof(yaml), "%s%s%s", head, extra, rules);
	for (char *p; (p = strstr(yaml, "%PORT%")) != NULL;) {
		char port[16];
		int len = snprintf(port, sizeof(port), "%d", d->port);

		memmove(p + len, p + 6, strlen(p + 6) + 1);
		memcpy(p, port, (size_t)len);
	}
	ops_write_file(d->conf, yaml);
	ck_assert(kill(d->pid, SIGHUP) == 0);
	ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
				      "{result=\"success\"}",
			  reloads, 3000) >= reloads,
	    "no reload");
}

/* Open n connections, each sending GET /healthz; count those answered
 * 200 and those closed unanswered within 5 s (all waited for together);
 * the rest were kept waiting.  The connections stay open. */
static void
open_many(int port, int *fds, int n, int *answered, int *refused)
{
	static struct pollfd p[1024];
	long long until;
	char buf[256];
	int i, left = n;
	ssize_t got;

	ck_assert_int_le(n, 1024);
	*answered = *refused = 0;
	for (i = 0; i < n; i++) {
		fds[i] = raw_connect(port);
		raw_send(fds[i], "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
		p[i].fd = fds[i];
		p[i].events = POLLIN;
	}
	until = h_now_ms() + 5000;
	while (left > 0 && h_now_ms() < until) {
		if (poll(p, (nfds_t)n, (int)(until - h_now_ms())) <= 0)
			break;
		for (i = 0; i < n; i++) {
			if (p[i].fd < 0 || p[i].revents == 0)
				continue;
			got = recv(fds[i], buf, sizeof(buf) - 1, 0);
			if (got >= 12 && strncmp(buf, "HTTP/1.1 200", 12) == 0)
				(*answered)++;
			else
				(*refused)++;
			p[i].fd = -1; /* done with it */
			left--;
		}
	}
}

/*
 * max_connections is reloadable, and the open-files limit must follow it:
 * started at 10 under a soft limit of 200 (raised to 266), reloaded to
 * 600, the daemon raises its soft limit to 856 (docs/security.md) and
 * serves 400 connections at once (before: the limit stayed 266, and the
 * connections past it waited unanswered in the kernel's queue).
 */
START_TEST(test_max_connections_reload_raises_fd_limit)
{
	enum { N = 400 };
	static int fds[N];
	struct h_daemon d = { 0 };
	struct rlimit rl, low;
	int i, answered, refused;

	ck_assert(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 2048) {
		fprintf(stderr, "skipped: hard open-files limit %llu\n",
		    (unsigned long long)rl.rlim_max);
		return;
	}
	low = rl;
	low.rlim_cur = 200;
	ck_assert(setrlimit(RLIMIT_NOFILE, &low) == 0);
	start(&d, "max_connections: 10\n");
	rl.rlim_cur = 2048;
	ck_assert(setrlimit(RLIMIT_NOFILE, &rl) == 0);
	ck_assert_int_eq(soft_nofile(d.pid), 10 + 256);
	reload_max_connections(&d, 600, 1);
	ck_assert_msg(soft_nofile(d.pid) >= 600 + 256,
	    "open-files limit %lld after max_connections 10 -> 600, "
	    "expected %d",
	    soft_nofile(d.pid), 600 + 256);
	open_many(d.port, fds, N, &answered, &refused);
	ck_assert_msg(answered == N,
	    "%d of %d connections answered, %d refused, the rest kept "
	    "waiting",
	    answered, N, refused);
	for (i = 0; i < N; i++)
		close(fds[i]);
	h_daemon_stop(&d);
}
END_TEST

/*
 * When the open-files limit cannot hold max_connections (its hard limit
 * is lower), a connection past it is refused at once, as past
 * max_connections, not kept waiting in the kernel's queue: the daemon's
 * limit is cut to 150 while max_connections is 600, and of 300
 * connections each is answered or closed (before: about half waited
 * unanswered).
 */
START_TEST(test_out_of_descriptors_refused_at_once)
{
	enum { N = 300 };
	static int fds[N];
	struct h_daemon d = { 0 };
	struct rlimit rl = { 150, 150 }, mine = { 2048, 2048 };
	int i, answered, refused;

	ck_assert(setrlimit(RLIMIT_NOFILE, &mine) == 0);
	start(&d, "max_connections: 600\n");
	ck_assert_msg(prlimit(d.pid, RLIMIT_NOFILE, &rl, NULL) == 0,
	    "prlimit: %s", strerror(errno));
	open_many(d.port, fds, N, &answered, &refused);
	ck_assert_msg(answered > 0 && answered + refused == N,
	    "%d of %d connections answered, %d refused, %d kept waiting",
	    answered, N, refused, N - answered - refused);
	/* Those held are still served, and a place freed is taken. */
	for (i = 0; i < N; i++)
		close(fds[i]);
	h_sleep_ms(300);
	open_many(d.port, fds, 1, &answered, &refused);
	ck_assert_int_eq(answered, 1);
	close(fds[0]);
	h_daemon_stop(&d);
}
END_TEST

/* --- header and attribute limits ----------------------------------------- */

START_TEST(test_header_and_attribute_limits)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	char big[3000], hdrs[12][32], buf[4096];
	const char *h[13];
	bool closed;
	int fd, i;

	start(&d, "max_header_bytes: 2048\nmax_attributes: 8\n");
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	fd = raw_connect(d.port);
	snprintf(buf, sizeof(buf),
	    "GET /healthz HTTP/1.1\r\nHost: x\r\n"
	    "X-Big: %s\r\n\r\n",
	    big);
	raw_send(fd, buf);
	raw_read(fd, buf, sizeof(buf), 2000, &closed);
	ck_assert_msg(strncmp(buf, "HTTP/1.1 431", 12) == 0,
	    "3 KB of "
	    "headers over max_header_bytes 2048: \"%.20s\"",
	    buf);
	close(fd);

	/* Eight attributes pass, nine do not. */
	h_http(&r, "POST", "/acquire",
	    "{\"user\":\"u\",\"a\":1,\"b\":1,"
	    "\"c\":1,\"d\":1,\"e\":1,\"f\":1,\"g\":1}",
	    NULL);
	ck_assert_msg(r.status == 200, "8 attributes: %ld %s", r.status,
	    r.body);
	h_resp_free(&r);
	h_http(&r, "POST", "/acquire",
	    "{\"user\":\"u\",\"a\":1,\"b\":1,"
	    "\"c\":1,\"d\":1,\"e\":1,\"f\":1,\"g\":1,\"h\":1}",
	    NULL);
	ck_assert_msg(r.status == 400 &&
		strcmp(h_json_str(&r, "error"), "too_many_attributes") == 0,
	    "9 attributes: %ld %s", r.status, r.body);
	h_resp_free(&r);

	/* /auth: headers are attributes too. */
	for (i = 0; i < 12; i++) {
		snprintf(hdrs[i], sizeof(hdrs[i]), "X-H%d: v", i);
		h[i] = hdrs[i];
	}
	h[12] = NULL;
	h_http(&r, "GET", "/auth", NULL, h);
	ck_assert_msg(r.status == 400,
	    "/auth with 14 headers, "
	    "max_attributes 8: %ld",
	    r.status);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/*
 * Writes to out a GET /healthz whose request line and headers count
 * exactly max_header_bytes (8192 by default), as http_framing.c counts
 * them (the URL, and each header's name and value plus 4): Host and 63
 * padding headers, the last taking what is left, with extra appended to
 * it ("x": one byte over).
 */
static void
at_limit_request(char *out, size_t cap, const char *extra)
{
	const size_t limit = 8192, nhdr = 63;
	size_t used = strlen("/healthz") + strlen("Host") + strlen("x") + 4;
	size_t i, len, per, n;

	n = (size_t)snprintf(out, cap, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
	per = (limit - used) / nhdr - strlen("X-Pad-00") - 4;
	for (i = 0; i < nhdr; i++) {
		len = i + 1 < nhdr ? per :
				     limit - used - strlen("X-Pad-00") - 4;
		n += (size_t)snprintf(out + n, cap - n, "X-Pad-%02zu: ", i);
		memset(out + n, 'v', len);
		n += len;
		used += strlen("X-Pad-00") + len + 4;
		n += (size_t)snprintf(out + n, cap - n, "%s\r\n",
		    i + 1 < nhdr ? "" : extra);
	}
	ck_assert_uint_eq(used, limit);
	snprintf(out + n, cap - n, "\r\n");
}

/* req on a new connection to port is the 431 headers_too_large. */
static void
expect_431(int port, const char *req, const char *what)
{
	char buf[4096];
	bool closed;
	int fd = raw_connect(port);

	raw_send(fd, req);
	raw_read(fd, buf, sizeof(buf), 2000, &closed);
	ck_assert_msg(strncmp(buf, "HTTP/1.1 431", 12) == 0 &&
		strstr(buf, "headers_too_large") != NULL,
	    "%s: \"%.40s\"", what, buf);
	close(fd);
}

/* Each connection's libmicrohttpd memory holds a request whose headers
 * are exactly max_header_bytes (docs/http.md), on a fresh connection and
 * again on the same one once its memory was reused; a byte more is the
 * 431 of docs/http.md. */
START_TEST(test_headers_exactly_at_the_limit)
{
	struct h_daemon d = { 0 };
	char req[9000], buf[4096];
	bool closed;
	int fd, i;

	start(&d, "");
	fd = raw_connect(d.port);
	at_limit_request(req, sizeof(req), "");
	for (i = 0; i < 3; i++) {
		raw_send(fd, req);
		raw_read(fd, buf, sizeof(buf), 1000, &closed);
		ck_assert_msg(strncmp(buf, "HTTP/1.1 200", 12) == 0 && !closed,
		    "request %d with 8192 bytes of headers: \"%.40s\"%s", i,
		    buf, closed ? " (closed)" : "");
	}
	close(fd);

	at_limit_request(req, sizeof(req), "x");
	expect_431(d.port, req, "8193 bytes of headers");
	h_daemon_stop(&d);
}
END_TEST

/* The query counts against max_header_bytes like the rest of the request
 * line (docs/configuration.md): a query of 11,000 bytes is a 431, as a
 * header or a path of that size is.  (It used to be let through.) */
START_TEST(test_query_counts_in_header_bytes)
{
	struct h_daemon d = { 0 };
	char req[12000];
	size_t n;

	start(&d, "");
	n = (size_t)snprintf(req, sizeof(req), "GET /healthz?q=");
	memset(req + n, 'v', 11000);
	n += 11000;
	snprintf(req + n, sizeof(req) - n, " HTTP/1.1\r\nHost: x\r\n\r\n");
	expect_431(d.port, req, "a query of 11000 bytes");
	h_daemon_stop(&d);
}
END_TEST

/* A body declared larger than max_body_bytes is answered 413 as soon as
 * the headers are in: no "100 Continue", none of the body read, the
 * connection closed (docs/http.md).  (It used to be read whole first,
 * and a slow one ran into the request timeout without an answer.) */
START_TEST(test_large_body_refused_unread)
{
	struct h_daemon d = { 0 };
	char buf[4096];
	bool closed = false;
	int fd;

	start(&d, "");
	fd = raw_connect(d.port);
	raw_send(fd,
	    "POST /acquire HTTP/1.1\r\nHost: x\r\n"
	    "Content-Type: application/json\r\n"
	    "Content-Length: 100000000\r\n"
	    "Expect: 100-continue\r\n\r\n");
	raw_read(fd, buf, sizeof(buf), 2000, &closed);
	ck_assert_msg(strncmp(buf, "HTTP/1.1 413", 12) == 0 &&
		strstr(buf, "body_too_large") != NULL,
	    "a body of 100,000,000 bytes declared: \"%.60s\"", buf);
	if (!closed)
		raw_read(fd, buf, sizeof(buf), 2000, &closed);
	ck_assert_msg(closed, "the connection stays open");
	close(fd);
	h_daemon_stop(&d);
}
END_TEST

/* --- store failures ------------------------------------------------------ */

/* A full memory store is said in the log and counted, and the 503 of
 * on_backend_error: deny names the kind of failure only. */
START_TEST(test_memory_full_said_and_counted)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	char body[64], line[512];
	bool logged = false;
	FILE *f;
	int i;

	h_daemon_start(&d,
	    "listen: \"127.0.0.1:%PORT%\"\nbackend: memory\n"
	    "memory:\n  max_keys: 3\non_backend_error: deny\n"
	    "shutdown_timeout: 1s\n"
	    "rules:\n  - name: r\n"
	    "    key: \"${user}\"\n    limit: 5\n    window: 60s\n");
	for (i = 0; i < 6; i++) {
		snprintf(body, sizeof(body), "{\"user\":\"u%d\"}", i);
		h_http(&r, "POST", "/acquire", body, NULL);
		if (i < 3)
			ck_assert_int_eq(r.status, 200);
		else {
			ck_assert_msg(r.status == 503 &&
				strcmp(h_json_str(&r, "message"),
				    "the memory store failed (full)") == 0,
			    "key %d of max_keys 3: %ld %s", i, r.status,
			    r.body);
		}
		h_resp_free(&r);
	}
	ck_assert_int_ge(metric("ratelimitd_backend_errors_total{backend="
				"\"memory\",kind=\"full\"}"),
	    3);
	f = fopen(d.log, "r");
	ck_assert(f != NULL);
	while (fgets(line, sizeof(line), f) != NULL)
		logged |= strstr(line, "memory store full") != NULL;
	fclose(f);
	ck_assert_msg(logged, "no log line says the memory store is full");
	h_daemon_stop(&d);
}
END_TEST

/* Redis refuses connections, on_backend_error: deny: the 503 says which
 * kind of failure, not the address or the system's words. */
START_TEST(test_backend_error_text_not_leaked)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	char yaml[1024];
	int port = h_free_port();

	snprintf(yaml, sizeof(yaml),
	    "listen: \"127.0.0.1:%%PORT%%\"\n"
	    "backend: redis\nredis:\n  url: \"redis://127.0.0.1:%d/0\"\n"
	    "on_backend_error: deny\nshutdown_timeout: 1s\n%s",
	    port, rules);
	h_daemon_start(&d, yaml);
	h_http(&r, "POST", "/acquire", "{\"user\":\"a\"}", NULL);
	ck_assert_msg(r.status == 503, "%ld %s", r.status, r.body);
	/* "connect", or "timeout" on a slow machine (valgrind). */
	ck_assert_msg(strstr(r.body, "127.0.0.1") == NULL &&
		strstr(r.body, "refused") == NULL &&
		strstr(r.body, "\"the redis store failed (") != NULL,
	    "503 body: %s", r.body);
	h_resp_free(&r);
	h_daemon_stop(&d);
}
END_TEST

/*
 * Clients that shut down their sending side right after the request (as
 * some proxies and scripts do) get their answer on the Redis path too:
 * libmicrohttpd dropped it when the end of input came while the request
 * waited for Redis (16-39 of 82 lost).
 */
START_TEST(test_half_close_on_redis)
{
	enum { N = 82 };
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char yaml[1024], req[2200], buf[2048];
	int fds[N], i, answered = 0;
	bool closed;

	h_redis_start(&red);
	snprintf(yaml, sizeof(yaml),
	    "listen: \"127.0.0.1:%%PORT%%\"\n"
	    "backend: redis\nredis:\n  url: \"redis://127.0.0.1:%d/0\"\n"
	    "  timeout: 2s\nshutdown_timeout: 1s\n%s",
	    red.port, rules);
	h_daemon_start(&d, yaml);
	for (i = 0; i < N; i++) {
		int body = snprintf(buf, sizeof(buf), "{\"user\":\"h%d\"}", i);

		snprintf(req, sizeof(req),
		    "POST /acquire HTTP/1.1\r\nHost: x"
		    "\r\nContent-Length: %d\r\n\r\n%s",
		    body, buf);
		fds[i] = raw_connect(d.port);
		raw_send(fds[i], req);
		shutdown(fds[i], SHUT_WR);
	}
	for (i = 0; i < N; i++) {
		raw_read(fds[i], buf, sizeof(buf), 3000, &closed);
		answered += strncmp(buf, "HTTP/1.1 200", 12) == 0 &&
		    strstr(buf, "\"allowed\":true") != NULL;
		close(fds[i]);
	}
	ck_assert_msg(answered == N, "%d of %d half-closed clients answered",
	    answered, N);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* --- unix sockets and users ---------------------------------------------- */

/* Start the daemon on yaml (no HTTP port to wait on); returns its pid. */
static pid_t
spawn(const char *conf, const char *yaml, const char *log)
{
	FILE *f = fopen(conf, "w");
	pid_t pid;
	int fd;

	ck_assert(f != NULL);
	fputs(yaml, f);
	fclose(f);
	if ((pid = fork()) == 0) {
		fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		execl(getenv("RATELIMITD_BIN"), "ratelimitd", "-c", conf,
		    (char *)NULL);
		_exit(127);
	}
	ck_assert(pid > 0);
	return pid;
}

/* Exit status of pid within ms, or -1 if it still runs. */
static int
exited(pid_t pid, int ms)
{
	long long until = h_now_ms() + ms;
	int st;

	while (h_now_ms() < until) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
		h_sleep_ms(20);
	}
	return -1;
}

static void
unix_addr(struct sockaddr_un *sun, const char *path)
{
	ck_assert(strlen(path) < sizeof(sun->sun_path));
	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	memcpy(sun->sun_path, path, strlen(path) + 1);
}

/* Connect fd to sa; then does it answer GET /healthz with 200?  fd is
 * closed. */
static bool
healthz_answers(int fd, const struct sockaddr *sa, socklen_t len)
{
	char buf[256];
	bool closed, ok;

	if (connect(fd, sa, len) != 0) {
		close(fd);
		return false;
	}
	raw_send(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
	raw_read(fd, buf, sizeof(buf), 2000, &closed);
	ok = strncmp(buf, "HTTP/1.1 200", 12) == 0;
	close(fd);
	return ok;
}

static bool
unix_answers(const char *path)
{
	struct sockaddr_un sun;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
	return healthz_answers(socket(AF_UNIX, SOCK_STREAM, 0),
	    (struct sockaddr *)&sun, sizeof(sun));
}

START_TEST(test_unix_socket_live_and_mode)
{
	char sock[H_PATH_MAX], c1[H_PATH_MAX], c2[H_PATH_MAX], l1[H_PATH_MAX],
	    l2[H_PATH_MAX], yaml[1024];
	struct stat st;
	pid_t a, b;
	int i;

	snprintf(sock, sizeof(sock), "%s/rl.sock", h_tmpdir());
	snprintf(c1, sizeof(c1), "%s/u1.yaml", h_tmpdir());
	snprintf(c2, sizeof(c2), "%s/u2.yaml", h_tmpdir());
	snprintf(l1, sizeof(l1), "%s/u1.log", h_tmpdir());
	snprintf(l2, sizeof(l2), "%s/u2.log", h_tmpdir());
	snprintf(yaml, sizeof(yaml),
	    "listen: \"unix:%s\"\nlisten_mode: "
	    "\"0600\"\nbackend: memory\nshutdown_timeout: 1s\n%s",
	    sock, rules);
	a = spawn(c1, yaml, l1);
	for (i = 0; i < 100 && !unix_answers(sock); i++)
		h_sleep_ms(50);
	ck_assert_msg(unix_answers(sock),
	    "the first daemon does not answer "
	    "on %s",
	    sock);
	ck_assert_int_eq(stat(sock, &st), 0);
	ck_assert_msg((st.st_mode & 07777) == 0600, "mode %o, expected 600",
	    st.st_mode & 07777);

	/* A second daemon on the same path must not take it over. */
	b = spawn(c2, yaml, l2);
	ck_assert_msg(exited(b, 3000) == 1,
	    "the second daemon did not exit "
	    "1 on a live socket");
	ck_assert_msg(unix_answers(sock), "the first daemon lost its socket");

	/* A stale socket (its daemon killed) is taken over. */
	kill(a, SIGKILL);
	waitpid(a, NULL, 0);
	b = spawn(c2, yaml, l2);
	for (i = 0; i < 100 && !unix_answers(sock); i++)
		h_sleep_ms(50);
	ck_assert_msg(unix_answers(sock),
	    "a daemon did not take over a "
	    "stale socket");
	kill(b, SIGTERM);
	ck_assert_int_eq(exited(b, 5000), 0);
}
END_TEST

/* Exit status of pid within ms; one still running is killed and -1. */
static int
exited_or_kill(pid_t pid, int ms)
{
	int rc = exited(pid, ms);

	if (rc == -1) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	return rc;
}

/* A socket file the daemon cannot tell stale is never removed: a datagram
 * socket (as /dev/log) refuses a stream connect with EPROTOTYPE, not
 * ECONNREFUSED; the start fails and the file stays. */
START_TEST(test_unix_socket_in_use_kept)
{
	char sock[H_PATH_MAX], conf[H_PATH_MAX], log[H_PATH_MAX], yaml[1024];
	struct sockaddr_un sun;
	struct stat before, after;
	char *text;
	int fd, rc;

	snprintf(sock, sizeof(sock), "%s/dgram.sock", h_tmpdir());
	snprintf(conf, sizeof(conf), "%s/dgram.yaml", h_tmpdir());
	snprintf(log, sizeof(log), "%s/dgram.log", h_tmpdir());
	unix_addr(&sun, sock);
	fd = socket(AF_UNIX, SOCK_DGRAM, 0);
	ck_assert(fd >= 0);
	ck_assert_msg(bind(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0,
	    "bind %s: %s", sock, strerror(errno));
	ck_assert_int_eq(stat(sock, &before), 0);
	snprintf(yaml, sizeof(yaml),
	    "listen: \"unix:%s\"\nbackend: memory\nshutdown_timeout: 1s\n%s",
	    sock, rules);
	rc = exited_or_kill(spawn(conf, yaml, log), 3000);
	text = ops_slurp(log);
	ck_assert_msg(rc == 1, "the daemon %s on a datagram socket's path: %s",
	    rc == -1 ? "started" : "did not exit 1", text);
	ck_assert_msg(strstr(text, "not replaced") != NULL, "log: %s", text);
	free(text);
	ck_assert_msg(stat(sock, &after) == 0 && after.st_ino == before.st_ino,
	    "the datagram socket's file was removed");
	close(fd);
}
END_TEST

/* A clean exit removes the unix socket files it bound (a client then finds
 * no file, ENOENT, not a refused connect), and only those: a file put at a
 * socket's path meanwhile stays. */
START_TEST(test_unix_socket_removed_at_exit)
{
	char sock[H_PATH_MAX], adm[H_PATH_MAX], conf[H_PATH_MAX],
	    log[H_PATH_MAX], yaml[2048];
	struct stat st;
	pid_t pid;
	int i, rc;
	FILE *f;

	snprintf(sock, sizeof(sock), "%s/exit.sock", h_tmpdir());
	snprintf(adm, sizeof(adm), "%s/exit-admin.sock", h_tmpdir());
	snprintf(conf, sizeof(conf), "%s/exit.yaml", h_tmpdir());
	snprintf(log, sizeof(log), "%s/exit.log", h_tmpdir());
	snprintf(yaml, sizeof(yaml),
	    "listen: \"unix:%s\"\nadmin_listen: \"unix:%s\"\n"
	    "backend: memory\nshutdown_timeout: 1s\n%s",
	    sock, adm, rules);
	pid = spawn(conf, yaml, log);
	for (i = 0; i < 100 && !unix_answers(sock); i++)
		h_sleep_ms(50);
	ck_assert_msg(unix_answers(sock), "the daemon does not answer on %s",
	    sock);
	ck_assert_int_eq(stat(adm, &st), 0);
	/* Someone else's file now at the admin socket's path. */
	ck_assert_int_eq(unlink(adm), 0);
	f = fopen(adm, "w");
	ck_assert(f != NULL);
	fclose(f);
	kill(pid, SIGTERM);
	rc = exited_or_kill(pid, 5000);
	ck_assert_msg(rc == 0, "exit status %d", rc);
	ck_assert_msg(stat(sock, &st) == -1 && errno == ENOENT,
	    "%s is still there after a clean exit", sock);
	ck_assert_msg(stat(adm, &st) == 0 && S_ISREG(st.st_mode),
	    "the file put at %s was removed", adm);
}
END_TEST

/* With `user`, the unix socket is that user's (listen_mode 0660 then
 * shares it through the user's group), and the daemon, no longer root,
 * still removes it at exit from a sticky directory such as /tmp. */
START_TEST(test_unix_socket_owned_by_user)
{
	char dir[] = "/tmp/rl-sticky-XXXXXX", sock[H_PATH_MAX],
	     conf[H_PATH_MAX], log[H_PATH_MAX], yaml[2048];
	struct passwd *pw = getpwnam("nobody");
	struct stat st;
	pid_t pid;
	int i, rc;

	if (geteuid() != 0 || pw == NULL) {
		fprintf(stderr,
		    "test_unix_socket_owned_by_user: skipped (needs root "
		    "and a user nobody)\n");
		return;
	}
	ck_assert(mkdtemp(dir) != NULL);
	ck_assert_int_eq(chmod(dir, 01777), 0);
	snprintf(sock, sizeof(sock), "%s/rl.sock", dir);
	snprintf(conf, sizeof(conf), "%s/owner.yaml", h_tmpdir());
	snprintf(log, sizeof(log), "%s/owner.log", h_tmpdir());
	snprintf(yaml, sizeof(yaml),
	    "listen: \"unix:%s\"\nlisten_mode: \"0660\"\nuser: nobody\n"
	    "backend: memory\nshutdown_timeout: 1s\n%s",
	    sock, rules);
	pid = spawn(conf, yaml, log);
	for (i = 0; i < 100 && !unix_answers(sock); i++)
		h_sleep_ms(50);
	ck_assert_msg(unix_answers(sock), "the daemon does not answer on %s",
	    sock);
	ck_assert_int_eq(stat(sock, &st), 0);
	ck_assert_msg(st.st_uid == pw->pw_uid && st.st_gid == pw->pw_gid,
	    "the socket is %u:%u, expected nobody's %u:%u", (unsigned)st.st_uid,
	    (unsigned)st.st_gid, (unsigned)pw->pw_uid, (unsigned)pw->pw_gid);
	ck_assert_msg((st.st_mode & 07777) == 0660, "mode %o, expected 660",
	    st.st_mode & 07777);
	kill(pid, SIGTERM);
	rc = exited_or_kill(pid, 5000);
	ck_assert_msg(rc == 0, "exit status %d", rc);
	ck_assert_msg(stat(sock, &st) == -1 && errno == ENOENT,
	    "%s is still there after a clean exit", sock);
	rmdir(dir);
}
END_TEST

/* Does 127.0.0.1:port answer GET /healthz with 200? */
static bool
tcp4_answers(int port)
{
	struct sockaddr_in sin;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return healthz_answers(socket(AF_INET, SOCK_STREAM, 0),
	    (struct sockaddr *)&sin, sizeof(sin));
}

/*
 * listen: "localhost:PORT" where localhost is first an address this host
 * lacks (192.0.2.1, TEST-NET-1) and then 127.0.0.1 (a hosts file given to
 * the daemon alone in a mount namespace): the daemon binds the next
 * address, 127.0.0.1, and warns that it serves on one of the two.  Then
 * with [::1] first and its port taken: the start fails (a port in use is
 * not skipped).  Skipped without root (the namespace).
 */
static int
start_with_hosts(const char *hosts_text, int port, pid_t *pid, char **log_text,
    bool *up)
{
	char hosts[H_PATH_MAX], conf[H_PATH_MAX], log[H_PATH_MAX], yaml[2048];
	int i, rc = -1, out;
	FILE *f;

	snprintf(hosts, sizeof(hosts), "%s/hosts", h_tmpdir());
	snprintf(conf, sizeof(conf), "%s/name.yaml", h_tmpdir());
	snprintf(log, sizeof(log), "%s/name.log", h_tmpdir());
	ck_assert((f = fopen(hosts, "w")) != NULL);
	fputs(hosts_text, f);
	fclose(f);
	snprintf(yaml, sizeof(yaml),
	    "listen: \"localhost:%d\"\nbackend: memory\n"
	    "shutdown_timeout: 1s\n%s",
	    port, rules);
	ck_assert((f = fopen(conf, "w")) != NULL);
	fputs(yaml, f);
	fclose(f);
	if ((*pid = fork()) == 0) {
		out = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(out, 1);
		dup2(out, 2);
		if (unshare(CLONE_NEWNS) != 0 ||
		    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
		    mount(hosts, "/etc/hosts", NULL, MS_BIND, NULL) != 0) {
			fprintf(stderr, "namespace: %s\n", strerror(errno));
			_exit(77);
		}
		execl(getenv("RATELIMITD_BIN"), "ratelimitd", "-c", conf,
		    (char *)NULL);
		_exit(127);
	}
	ck_assert(*pid > 0);
	*up = false;
	for (i = 0; i < 100 && !*up && rc == -1; i++)
		if (!(*up = tcp4_answers(port)))
			rc = exited(*pid, 50);
	if (!*up && rc == -1)
		rc = exited_or_kill(*pid, 0);
	*log_text = ops_slurp(log);
	return rc;
}

START_TEST(test_listen_name_tries_next_address)
{
	struct sockaddr_in6 sin6;
	int port = h_free_port(), fd6, one = 1, rc;
	bool up;
	char *text;
	pid_t pid;

	if (geteuid() != 0) {
		fprintf(stderr,
		    "test_listen_name_tries_next_address: skipped "
		    "(needs root)\n");
		return;
	}
	rc = start_with_hosts("192.0.2.1 localhost\n127.0.0.1 localhost\n",
	    port, &pid, &text, &up);
	if (rc == 77) {
		fprintf(stderr,
		    "test_listen_name_tries_next_address: skipped (%s)", text);
		free(text);
		return;
	}
	ck_assert_msg(up,
	    "localhost:%d does not answer on 127.0.0.1 after 192.0.2.1: %s",
	    port, text);
	ck_assert_msg(strstr(text, "resolves to 2 addresses") != NULL,
	    "no warning: %s", text);
	free(text);
	kill(pid, SIGTERM);
	ck_assert_int_eq(exited_or_kill(pid, 5000), 0);

	/* [::1] first, its port taken: no fall back, the start fails. */
	port = h_free_port();
	memset(&sin6, 0, sizeof(sin6));
	sin6.sin6_family = AF_INET6;
	sin6.sin6_port = htons((uint16_t)port);
	sin6.sin6_addr = in6addr_loopback;
	fd6 = socket(AF_INET6, SOCK_STREAM, 0);
	ck_assert(fd6 >= 0);
	setsockopt(fd6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd6, (struct sockaddr *)&sin6, sizeof(sin6)) != 0 ||
	    listen(fd6, 1) != 0) {
		fprintf(stderr,
		    "test_listen_name_tries_next_address: no [::1], "
		    "the port-in-use half skipped\n");
		close(fd6);
		return;
	}
	rc = start_with_hosts("::1 localhost\n127.0.0.1 localhost\n", port,
	    &pid, &text, &up);
	ck_assert_msg(!up && rc == 1 && strstr(text, "in use") != NULL,
	    "with [::1]:%d taken: rc %d, answers %d: %s", port, rc, up, text);
	free(text);
	close(fd6);
}
END_TEST

START_TEST(test_user_drops_root)
{
	struct h_daemon d = { 0 };
	struct passwd *pw = getpwnam("nobody");
	char path[64], line[256];
	unsigned uid = 0, euid = 0;
	FILE *f;

	/* make check runs as root; Debian's base-passwd has nobody. */
	ck_assert_msg(geteuid() == 0,
	    "test_user_drops_root needs root (uid "
	    "%u): only root can start a daemon that drops to a user",
	    (unsigned)geteuid());
	ck_assert_msg(pw != NULL, "test_user_drops_root: no user nobody");
	start(&d, "user: nobody\n");
	snprintf(path, sizeof(path), "/proc/%d/status", (int)d.pid);
	f = fopen(path, "r");
	ck_assert(f != NULL);
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "Uid: %u %u", &uid, &euid) == 2)
			break;
	fclose(f);
	ck_assert_msg(uid == pw->pw_uid && euid == pw->pw_uid,
	    "uid %u euid "
	    "%u, expected %u (nobody)",
	    uid, euid, (unsigned)pw->pw_uid);
	h_daemon_stop(&d);
}
END_TEST

/* Run --check on yaml (file i of the test): it must exit 1 and print
 * the config's path and then said. */
static void
check_refuses(size_t i, const char *yaml, const char *said)
{
	char *text;
	char conf[H_PATH_MAX], log[H_PATH_MAX];
	pid_t pid;
	FILE *f;
	int st;

	snprintf(conf, sizeof(conf), "%s/chk%zu.yaml", h_tmpdir(), i);
	snprintf(log, sizeof(log), "%s/chk%zu.log", h_tmpdir(), i);
	f = fopen(conf, "w");
	ck_assert(f != NULL);
	fputs(yaml, f);
	fclose(f);
	if ((pid = fork()) == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		dup2(fd, 1);
		dup2(fd, 2);
		execl(getenv("RATELIMITD_BIN"), "ratelimitd", "-c", conf,
		    "--check", (char *)NULL);
		_exit(127);
	}
	ck_assert(waitpid(pid, &st, 0) == pid);
	text = ops_slurp(log);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1,
	    "--check passed: %s: %s", yaml, text);
	ck_assert_msg(strstr(text, conf) == text &&
		strstr(text, said) == text + strlen(conf),
	    "--check said \"%s\", expected \"%s%s\"", text, conf, said);
	free(text);
}

/* --check refuses what start-up would, at the key's FILE:LINE:COL: a
 * password_file or token file that cannot be read, a user that does not
 * exist. */
START_TEST(test_check_what_start_reads)
{
	static const char *const bad[] = {
		"backend: redis\nredis:\n  password_file: /nonexistent/pw\n",
		"user: no-such-user-here\n",
		"admin_token_file: /nonexistent/tok\n",
		"backend: redis\nredis:\n  sentinel:\n    master: m\n"
		"    nodes: [\"127.0.0.1:1\"]\n"
		"    password_file: /nonexistent/pass\n",
	};
	static const char *const said[] = {
		":3:18: redis.password_file: cannot read /nonexistent/pw",
		":1:7: user: no user",
		":1:19: admin_token_file: cannot read /nonexistent/tok",
		":6:20: redis.sentinel.password_file: cannot read "
		"/nonexistent/pass",
	};
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		check_refuses(i, bad[i], said[i]);
}
END_TEST

/* --check reads a token or password file as start-up does: a directory,
 * an empty first line and a first line over 4096 bytes are refused there
 * too, at the key.  (--check used to ask only whether the file could be
 * opened, and said ok for files start-up then refused.) */
START_TEST(test_check_reads_files_as_start)
{
	char dir[H_PATH_MAX], empty[H_PATH_MAX], lng[H_PATH_MAX];
	char yaml[3 * H_PATH_MAX], said[2 * H_PATH_MAX];
	FILE *f;
	int k;

	snprintf(dir, sizeof(dir), "%s/tokdir", h_tmpdir());
	ck_assert(mkdir(dir, 0700) == 0);
	snprintf(empty, sizeof(empty), "%s/empty.tok", h_tmpdir());
	f = fopen(empty, "w");
	ck_assert(f != NULL);
	fputs("\nsecond\n", f);
	fclose(f);
	snprintf(lng, sizeof(lng), "%s/long.tok", h_tmpdir());
	f = fopen(lng, "w");
	ck_assert(f != NULL);
	for (k = 0; k < 4097; k++)
		fputc('t', f);
	fputc('\n', f);
	fclose(f);

	snprintf(yaml, sizeof(yaml), "admin_token_file: %s\n", dir);
	snprintf(said, sizeof(said),
	    ":1:19: admin_token_file: cannot read %s: Is a directory\n", dir);
	check_refuses(0, yaml, said);
	snprintf(yaml, sizeof(yaml), "admin_token_file: %s\n", empty);
	snprintf(said, sizeof(said),
	    ":1:19: admin_token_file: cannot read %s: the first line is "
	    "empty\n",
	    empty);
	check_refuses(1, yaml, said);
	snprintf(yaml, sizeof(yaml), "admin_token_file: %s\n", lng);
	snprintf(said, sizeof(said),
	    ":1:19: admin_token_file: cannot read %s: first line longer "
	    "than 4096 bytes\n",
	    lng);
	check_refuses(2, yaml, said);
	snprintf(yaml, sizeof(yaml),
	    "backend: redis\nredis:\n  password_file: %s\n", dir);
	snprintf(said, sizeof(said),
	    ":3:18: redis.password_file: cannot read %s: Is a directory\n",
	    dir);
	check_refuses(3, yaml, said);
	snprintf(yaml, sizeof(yaml),
	    "backend: redis\nredis:\n  sentinel:\n    master: m\n"
	    "    nodes: [\"127.0.0.1:1\"]\n    password_file: %s\n",
	    empty);
	snprintf(said, sizeof(said),
	    ":6:20: redis.sentinel.password_file: cannot read %s: the first "
	    "line is empty\n",
	    empty);
	check_refuses(4, yaml, said);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("limits");
	TCase *tc = tcase_create("limits");

	tcase_add_unchecked_fixture(tc, NULL, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_smuggling_shapes, 0,
	    (int)(sizeof(shapes) / sizeof(shapes[0])));
	tcase_add_test(tc, test_keepalive_still_works);
	tcase_add_test(tc, test_token_names);
	tcase_add_test(tc, test_max_connections);
	tcase_add_test(tc, test_request_timeout_dribbler);
	tcase_add_test(tc, test_request_timeout_after_keepalive);
	tcase_add_test(tc, test_idle_timeout);
	tcase_add_test(tc, test_slow_and_half_sent_clients);
	tcase_add_test(tc, test_ten_thousand_connections);
	tcase_add_test(tc, test_header_and_attribute_limits);
	tcase_add_test(tc, test_headers_exactly_at_the_limit);
	tcase_add_test(tc, test_query_counts_in_header_bytes);
	tcase_add_test(tc, test_large_body_refused_unread);
	tcase_add_test(tc, test_unix_socket_live_and_mode);
	tcase_add_test(tc, test_user_drops_root);
	tcase_add_test(tc, test_check_what_start_reads);
	tcase_add_test(tc, test_check_reads_files_as_start);
	tcase_add_test(tc, test_memory_full_said_and_counted);
	tcase_add_test(tc, test_backend_error_text_not_leaked);
	tcase_add_test(tc, test_half_close_on_redis);
	suite_add_tcase(s, tc);

	/* The open-files limit: raised with max_connections, and what
	 * happens when it is too low. */
	tc = tcase_create("fd_limit");
	tcase_add_unchecked_fixture(tc, NULL, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_max_connections_reload_raises_fd_limit);
	tcase_add_test(tc, test_out_of_descriptors_refused_at_once);
	suite_add_tcase(s, tc);

	/* listen: the sockets a start binds, and what is left at exit. */
	tc = tcase_create("listen");
	tcase_add_unchecked_fixture(tc, NULL, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_unix_socket_in_use_kept);
	tcase_add_test(tc, test_unix_socket_removed_at_exit);
	tcase_add_test(tc, test_unix_socket_owned_by_user);
	tcase_add_test(tc, test_listen_name_tries_next_address);
	suite_add_tcase(s, tc);
	return s;
}
