/*
 * ops.h - helpers of the operations tests (check_ops.c), on top of the
 * harness: a daemon described by a few fields, files rewritten the way
 * tools and Kubernetes rewrite them, a Redis that hangs, HTTP probes that
 * poll and time, /metrics samples and promtool, and client threads that
 * record every answer.
 *
 * Every daemon made by ops_start() runs one rule, x, keyed by the JSON field
 * "user" of /acquire.  Like the harness, functions that can fail call
 * ck_abort_msg(): they belong in tests; the thread bodies behind
 * ops_load_start() and ops_call_start() assert nothing.
 */
#ifndef RL_OPS_H
#define RL_OPS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "harness.h"

#define OPS_TIMEOUT_MS	100  /* default redis.timeout */
#define OPS_MAX_SAMPLES 2048 /* answers kept per thread */

/* Call once in main() after h_init(): remembers $RATELIMITD_BIN, which
 * ops_wrap_daemon() changes in a test. */
void ops_init(void);

/* --- the daemon ------------------------------------------------------ */

/* A daemon's YAML, declaratively; zero fields take the defaults. */
struct ops_conf {
	bool memory;		 /* backend: memory (else redis) */
	int threads;		 /* default 8 */
	const char *shutdown;	 /* shutdown_timeout; default 2s */
	const char *url;	 /* redis.url; default on %REDIS_PORT% */
	int timeout_ms;		 /* redis.timeout; OPS_TIMEOUT_MS */
	const char *policy;	 /* on_backend_error; default allow */
	int limit;		 /* of rule x (window 1m); default 2 */
	const char *redis_extra; /* more lines under redis: */
	const char *extra;	 /* more top-level lines */
};

/* The YAML of c into buf, with %PORT% and %REDIS_PORT% left for the
 * harness.  A memory daemon has no redis: section unless c->url is set. */
void ops_render(const struct ops_conf *c, char *buf, size_t len);

/* The YAML of c as the running daemon d has it (its ports filled in), for
 * rewriting its file. */
void ops_render_for(const struct h_daemon *d, const struct ops_conf *c,
    char *buf, size_t len);

/* h_daemon_start() on c, with Redis (or whatever listens there) on
 * redis_port. */
void ops_start(struct h_daemon *d, int redis_port, const struct ops_conf *c);

/* Make the next h_daemon_start() in this test run an sh script: prelude
 * (shell lines; "$2" is the harness's config file), then exec of the real
 * daemon with "$@".  The PID stays the daemon's, so the harness still
 * tracks and stops it.  Changes $RATELIMITD_BIN of this test process. */
void ops_wrap_daemon(const char *prelude);

/* Wait, without reaping it, until child pid has exited: the ms that took,
 * or -1 if it still runs after ms.  h_daemon_stop() reaps it later. */
long long ops_exit_time_ms(pid_t pid, long long ms);

/* Whether child pid has not exited (without reaping it). */
bool ops_is_running(pid_t pid);

/* --- files ---------------------------------------------------------- */

/* A path in the run's directory, unique to this test process. */
void ops_tmp_name(char *out, size_t len, const char *what);

void ops_write_file(const char *path, const char *text);

/* Replace path atomically: write path.tmp, rename it over path. */
void ops_replace_file(const char *path, const char *text);

/* The whole file as a C string; the caller frees it. */
char *ops_slurp(const char *path);

/* How many times what occurs in the file. */
int ops_count_in_file(const char *path, const char *what);

/* --- Redis and fakes ------------------------------------------------- */

/* A 127.0.0.1 port where nothing listens (connections are refused). */
int ops_closed_port(void);

/* A listening socket on 127.0.0.1 that is never accepted from or read:
 * the kernel completes connections, nothing ever answers (a hung Redis).
 * Returns the fd, to close at the end; *port gets its port. */
int ops_silent_listener(int *port);

/* Run a command on r that must answer +OK. */
void ops_redis_ok(struct h_redis *r, const char *fmt, ...);

/* --- HTTP probes on h_daemon_current() ------------------------------- */

/* POST /acquire {"user": user}; *ms (if not NULL) gets the wall time. */
void ops_acquire_timed(struct h_resp *r, const char *user, long long *ms);
void ops_acquire(struct h_resp *r, const char *user);

/* Whether the body says "degraded": true. */
bool ops_is_degraded(struct h_resp *r);

/* GET path: its status; *ms (if not NULL) gets the wall time. */
long ops_get(const char *path, long long *ms);

/* GET path every 50 ms until it answers want, at most ms: the last status. */
long ops_poll_status(const char *path, long want, long long ms);

/* Rule x's limit as a new user sees it now, or -1 if not a 200 with one. */
long long ops_current_limit(void);

/* Poll ops_current_limit() until it is want, at most ms: the last value. */
long long ops_wait_limit(long long want, long long ms);

/* Poll /acquire for user, at most ms, until Redis decides (a 200 naming
 * a rule, not degraded); whether it did. */
bool ops_wait_not_degraded(const char *user, long long ms);

/* --- metrics ---------------------------------------------------------- */

/* The value of the sample called exactly series ("name{labels}") in the
 * exposition text, or -1 when there is none. */
double ops_metric_in(const char *text, const char *series);

/* GET /metrics into r; asserts a 200. */
void ops_scrape(struct h_resp *r);

/* One sample from a fresh scrape, as ops_metric_in(). */
double ops_metric(const char *series);

/* Poll ops_metric() until it is at least want, at most ms: the last value. */
double ops_wait_metric(const char *series, double want, long long ms);

/* `promtool check metrics` on text; fails the test with promtool's words
 * when it complains, or when promtool is missing (make check installs it). */
void ops_promtool_check(const char *text);

/* --- client threads --------------------------------------------------- */

struct ops_sample {
	long long t0, t1; /* monotonic ms */
	long status;	  /* 0: the transfer failed */
	bool degraded;
};

/* A thread sending POST /acquire {"user":"load"} on one keep-alive
 * connection, recording each answer. */
struct ops_worker {
	pthread_t thread;
	int port;
	long long until; /* monotonic ms */
	int max;	 /* requests; 0 = until `until` */
	int pause_ms;	 /* between requests */
	struct ops_sample s[OPS_MAX_SAMPLES];
	size_t n;
};

/* Start n workers on the current daemon for ms, each sending at most max
 * requests (0: no limit) with pause_ms between them.  Free the array after
 * ops_load_join(). */
struct ops_worker *ops_load_start(int n, long long ms, int max, int pause_ms);
void ops_load_join(struct ops_worker *w, int n);

/* The longest request of the n workers, in ms. */
long long ops_load_max_ms(const struct ops_worker *w, int n);

/* One request on the connection of a given easy handle, in a thread. */
struct ops_call {
	pthread_t thread;
	CURL *curl;
	int port;
	const char *method, *path, *body;
	struct h_resp r; /* status 0 when the transfer failed */
	long long ms;
};

/* Send method path (body a C string or NULL) to the current daemon on
 * curl's connection, in a new thread; ops_call_finish() joins it and
 * returns the wall time in ms.  The answer stays in q->r until
 * h_resp_free(). */
void ops_call_start(struct ops_call *q, CURL *curl, const char *method,
    const char *path, const char *body);
long long ops_call_finish(struct ops_call *q);

#endif
