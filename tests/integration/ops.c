/*
 * ops.c - helpers of the operations tests; see ops.h for what each one
 * promises.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ops.h"

#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The real daemon binary, taken before a test may wrap it. */
static char real_bin[H_PATH_MAX];

void
ops_init(void)
{
	const char *bin = getenv("RATELIMITD_BIN");

	snprintf(real_bin, sizeof(real_bin), "%s", bin ? bin : "");
}

/* --- the daemon ------------------------------------------------------ */

/* Replace every token in buf by the decimal value. */
static void
subst(char *buf, size_t len, const char *token, int value)
{
	char num[16], *p;
	size_t tl = strlen(token), nl;

	nl = (size_t)snprintf(num, sizeof(num), "%d", value);
	while ((p = strstr(buf, token)) != NULL) {
		ck_assert_msg(strlen(buf) - tl + nl < len, "YAML too long");
		memmove(p + nl, p + tl, strlen(p + tl) + 1);
		memcpy(p, num, nl);
	}
}

/* The YAML of c, with %PORT% and %REDIS_PORT% left for the harness. */
void
ops_render(const struct ops_conf *c, char *buf, size_t len)
{
	char redis[1024] = "";
	int n;

	if (!c->memory || c->url != NULL)
		snprintf(redis, sizeof(redis),
		    "redis:\n"
		    "  url: \"%s\"\n"
		    "  timeout: %dms\n"
		    "%s",
		    c->url ? c->url : "redis://127.0.0.1:%REDIS_PORT%/0",
		    c->timeout_ms ? c->timeout_ms : OPS_TIMEOUT_MS,
		    c->redis_extra ? c->redis_extra : "");
	/* %% because the harness's placeholders look like conversions. */
	n = snprintf(buf, len,
	    "listen: \"127.0.0.1:%%PORT%%\"\n"
	    "threads: %d\n"
	    "shutdown_timeout: %s\n"
	    "backend: %s\n"
	    "%s"
	    "on_backend_error: %s\n"
	    "%s"
	    "rules:\n"
	    "  - name: x\n"
	    "    key: \"${user}\"\n"
	    "    limit: %d\n"
	    "    window: 1m\n",
	    c->threads ? c->threads : 8, c->shutdown ? c->shutdown : "2s",
	    c->memory ? "memory" : "redis", redis,
	    c->policy ? c->policy : "allow", c->extra ? c->extra : "",
	    c->limit ? c->limit : 2);
	ck_assert_msg(n > 0 && (size_t)n < len, "YAML too long");
}

/* The YAML of c as the running daemon d has it (ports filled in). */
void
ops_render_for(const struct h_daemon *d, const struct ops_conf *c, char *buf,
    size_t len)
{
	ops_render(c, buf, len);
	subst(buf, len, "%PORT%", d->port);
	subst(buf, len, "%REDIS_PORT%", d->redis_port);
}

/* Start d on c with Redis (or the fake one) on redis_port. */
void
ops_start(struct h_daemon *d, int redis_port, const struct ops_conf *c)
{
	char yaml[4096];

	ops_render(c, yaml, sizeof(yaml));
	d->redis_port = redis_port;
	h_daemon_start(d, yaml);
}

/* --- files, processes, sockets ---------------------------------------- */

void
ops_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	fputs(text, f);
	ck_assert_msg(fclose(f) == 0, "%s: %s", path, strerror(errno));
}

/* Replace path atomically: write a temporary file beside it, rename. */
void
ops_replace_file(const char *path, const char *text)
{
	char tmp[H_PATH_MAX + 16];

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	ops_write_file(tmp, text);
	ck_assert_msg(rename(tmp, path) == 0, "rename %s: %s", tmp,
	    strerror(errno));
}

/* The whole file as a string; caller frees. */
char *
ops_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	size_t len = 0, cap = 0, n;

	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	do {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 8192;
			buf = realloc(buf, cap);
			ck_assert(buf != NULL);
		}
		n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
	} while (n > 0);
	fclose(f);
	buf[len] = '\0';
	return buf;
}

/* A path in the run's directory, unique to this test process. */
void
ops_tmp_name(char *out, size_t len, const char *what)
{
	snprintf(out, len, "%s/ops-%ld-%s", h_tmpdir(), (long)getpid(), what);
}

/* Make h_daemon_start run an sh script that runs prelude, then execs the
 * real daemon with the harness's arguments ("$@": -c FILE). */
void
ops_wrap_daemon(const char *prelude)
{
	char path[H_PATH_MAX], text[4096];

	ops_tmp_name(path, sizeof(path), "wrapper.sh");
	snprintf(text, sizeof(text), "#!/bin/sh\n%s\nexec '%s' \"$@\"\n",
	    prelude, real_bin);
	ops_write_file(path, text);
	ck_assert(chmod(path, 0755) == 0);
	ck_assert(setenv("RATELIMITD_BIN", path, 1) == 0);
}

/* A 127.0.0.1 port where nothing listens. */
int
ops_closed_port(void)
{
	return h_free_port();
}

/* A socket that accepts connections (the kernel does) and never reads or
 * answers: a Redis that hangs.  Returns the fd; *port gets its port. */
int
ops_silent_listener(int *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	ck_assert(listen(fd, 512) == 0);
	ck_assert(getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
	*port = ntohs(sa.sin_port);
	return fd;
}

/* Wait (without reaping) until pid exits; the ms it took, or -1 when it
 * still runs after ms. */
long long
ops_exit_time_ms(pid_t pid, long long ms)
{
	long long start = h_now_ms();
	siginfo_t si;

	for (;;) {
		memset(&si, 0, sizeof(si));
		if (waitid(P_PID, (id_t)pid, &si,
			WEXITED | WNOHANG | WNOWAIT) == 0 &&
		    si.si_pid == pid)
			return h_now_ms() - start;
		if (h_now_ms() - start > ms)
			return -1;
		h_sleep_ms(5);
	}
}

bool
ops_is_running(pid_t pid)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	return waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) ==
	    0 &&
	    si.si_pid == 0;
}

/* Run a Redis command on r that must answer +OK. */
void
ops_redis_ok(struct h_redis *r, const char *fmt, ...)
{
	redisContext *c = h_redis_ctx(r);
	redisReply *rep;
	va_list ap;
	bool ok;

	va_start(ap, fmt);
	rep = redisvCommand(c, fmt, ap);
	va_end(ap);
	ck_assert_msg(rep != NULL, "redis %s: %s", fmt, c->errstr);
	ok = rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "OK") == 0;
	if (!ok)
		fprintf(stderr, "redis %s: %s\n", fmt,
		    rep->str ? rep->str : "?");
	freeReplyObject(rep);
	ck_assert_msg(ok, "redis %s: not OK", fmt);
}

/* --- HTTP ------------------------------------------------------------- */

static unsigned probe_seq;

/* POST /acquire for user on the current daemon; *ms gets the wall time. */
void
ops_acquire_timed(struct h_resp *r, const char *user, long long *ms)
{
	char body[256];
	long long t0 = h_now_ms();

	snprintf(body, sizeof(body), "{\"user\":\"%s\"}", user);
	h_http(r, "POST", "/acquire", body, NULL);
	if (ms != NULL)
		*ms = h_now_ms() - t0;
}

void
ops_acquire(struct h_resp *r, const char *user)
{
	ops_acquire_timed(r, user, NULL);
}

bool
ops_is_degraded(struct h_resp *r)
{
	return json_is_true(h_json_get(r, "degraded"));
}

/* GET path; the status, and *ms the wall time. */
long
ops_get(const char *path, long long *ms)
{
	struct h_resp r = { 0 };
	long long t0 = h_now_ms();
	long st;

	h_http(&r, "GET", path, NULL, NULL);
	if (ms != NULL)
		*ms = h_now_ms() - t0;
	st = r.status;
	h_resp_free(&r);
	return st;
}

/* Poll path every 50 ms until it answers want; the last status. */
long
ops_poll_status(const char *path, long want, long long ms)
{
	long long end = h_now_ms() + ms;
	long st;

	while ((st = ops_get(path, NULL)) != want && h_now_ms() < end)
		h_sleep_ms(50);
	return st;
}

/* Rule x's limit as a fresh user sees it now, or -1 if none answered. */
long long
ops_current_limit(void)
{
	struct h_resp r = { 0 };
	char user[64];
	long long lim = -1;

	snprintf(user, sizeof(user), "probe-%u", probe_seq++);
	ops_acquire(&r, user);
	if (r.status == 200 && json_is_integer(h_json_get(&r, "limit")))
		lim = h_json_int(&r, "limit");
	h_resp_free(&r);
	return lim;
}

/* Poll until rule x's limit is want (at most ms); the last one seen. */
long long
ops_wait_limit(long long want, long long ms)
{
	long long end = h_now_ms() + ms, lim;

	while ((lim = ops_current_limit()) != want && h_now_ms() < end)
		h_sleep_ms(50);
	return lim;
}

/* Poll (at most ms) until a decision for user is made by Redis, not
 * degraded; true if one was. */
bool
ops_wait_not_degraded(const char *user, long long ms)
{
	long long end = h_now_ms() + ms;
	struct h_resp r = { 0 };
	bool ok;

	do {
		ops_acquire(&r, user);
		ok = r.status == 200 && !ops_is_degraded(&r) &&
		    h_json_str(&r, "rule") != NULL;
		h_resp_free(&r);
		if (!ok)
			h_sleep_ms(50);
	} while (!ok && h_now_ms() < end);
	return ok;
}

/* --- metrics ---------------------------------------------------------- */

/* The value of the sample called exactly series ("name{labels}") in the
 * exposition text, or -1 when there is none. */
double
ops_metric_in(const char *text, const char *series)
{
	size_t n = strlen(series);
	const char *p = text;

	while ((p = strstr(p, series)) != NULL) {
		if ((p == text || p[-1] == '\n') && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p += n;
	}
	return -1;
}

/* GET /metrics from the current daemon into r (asserts 200). */
void
ops_scrape(struct h_resp *r)
{
	h_http(r, "GET", "/metrics", NULL, NULL);
	ck_assert_int_eq(r->status, 200);
}

double
ops_metric(const char *series)
{
	struct h_resp r = { 0 };
	double v;

	ops_scrape(&r);
	v = ops_metric_in(r.body, series);
	h_resp_free(&r);
	return v;
}

/* Poll until series is at least want (at most ms); the last value. */
double
ops_wait_metric(const char *series, double want, long long ms)
{
	long long end = h_now_ms() + ms;
	double v;

	while ((v = ops_metric(series)) < want && h_now_ms() < end)
		h_sleep_ms(50);
	return v;
}

/* Feed text to `promtool check metrics`; fails the test (with promtool's
 * words) when it complains or is missing: `make check` installs it. */
void
ops_promtool_check(const char *text)
{
	char path[H_PATH_MAX], cmd[H_PATH_MAX + 64], out[4096];
	size_t n;
	FILE *p;
	int st;

	ops_tmp_name(path, sizeof(path), "metrics.txt");
	ops_write_file(path, text);
	snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", path);
	p = popen(cmd, "r");
	ck_assert_msg(p != NULL, "popen: %s", strerror(errno));
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	ck_assert_msg(!(WIFEXITED(st) && WEXITSTATUS(st) == 127),
	    "promtool is not installed (make check installs prometheus)");
	if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
		fprintf(stderr, "----- /metrics -----\n%s----- end -----\n",
		    text);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	    "promtool check metrics failed (status %d): %s", st, out);
}

/* --- client threads --------------------------------------------------- */

/* Send /acquire for one user in a loop and record every answer. */
static void *
worker_main(void *arg)
{
	struct ops_worker *w = arg;
	struct h_resp r = { 0 };
	CURL *c = curl_easy_init();
	static const char body[] = "{\"user\":\"load\"}";

	while (c != NULL && w->n < OPS_MAX_SAMPLES && h_now_ms() < w->until &&
	    (w->max == 0 || w->n < (size_t)w->max)) {
		struct ops_sample *s = &w->s[w->n++];

		s->t0 = h_now_ms();
		if (h_request(c, w->port, &r, "POST", "/acquire", body,
			sizeof(body) - 1, NULL) == 0)
			s->status = r.status;
		s->t1 = h_now_ms();
		s->degraded = s->status != 0 && ops_is_degraded(&r);
		h_resp_free(&r);
		h_sleep_ms(w->pause_ms);
	}
	if (c != NULL)
		curl_easy_cleanup(c);
	return NULL;
}

struct ops_worker *
ops_load_start(int n, long long ms, int max, int pause_ms)
{
	struct ops_worker *w = calloc((size_t)n, sizeof(*w));
	int i;

	ck_assert(w != NULL);
	for (i = 0; i < n; i++) {
		w[i].port = h_daemon_current()->port;
		w[i].until = h_now_ms() + ms;
		w[i].max = max;
		w[i].pause_ms = pause_ms;
		ck_assert(pthread_create(&w[i].thread, NULL, worker_main,
			      &w[i]) == 0);
	}
	return w;
}

void
ops_load_join(struct ops_worker *w, int n)
{
	int i;

	for (i = 0; i < n; i++)
		pthread_join(w[i].thread, NULL);
}

long long
ops_load_max_ms(const struct ops_worker *w, int n)
{
	long long m = 0;
	size_t k;
	int i;

	for (i = 0; i < n; i++)
		for (k = 0; k < w[i].n; k++)
			if (w[i].s[k].t1 - w[i].s[k].t0 > m)
				m = w[i].s[k].t1 - w[i].s[k].t0;
	return m;
}

static void *
call_main(void *arg)
{
	struct ops_call *q = arg;
	long long t0 = h_now_ms();

	(void)h_request(q->curl, q->port, &q->r, q->method, q->path, q->body,
	    q->body ? strlen(q->body) : 0, NULL);
	q->ms = h_now_ms() - t0;
	return NULL;
}

void
ops_call_start(struct ops_call *q, CURL *curl, const char *method,
    const char *path, const char *body)
{
	memset(q, 0, sizeof(*q));
	q->curl = curl;
	q->port = h_daemon_current()->port;
	q->method = method;
	q->path = path;
	q->body = body;
	ck_assert(pthread_create(&q->thread, NULL, call_main, q) == 0);
}

long long
ops_call_finish(struct ops_call *q)
{
	pthread_join(q->thread, NULL);
	return q->ms;
}

int
ops_count_in_file(const char *path, const char *what)
{
	char *log = ops_slurp(path), *p = log;
	int n = 0;

	while ((p = strstr(p, what)) != NULL) {
		n++;
		p += strlen(what);
	}
	free(log);
	return n;
}
