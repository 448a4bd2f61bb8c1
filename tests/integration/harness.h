/*
 * harness.h - what the integration tests use to drive ratelimitd from the
 * outside, as a user would: a private temporary directory, free loopback
 * ports, a real redis-server, the daemon binary itself ($RATELIMITD_BIN)
 * started on a YAML file, and HTTP requests through libcurl.
 *
 * Process ownership.  Tests run in Check's fork mode: every test is a child
 * of the runner, and a failed ck_assert ends that child with _exit(1), so
 * neither its atexit handlers nor its teardown run.  To still stop every
 * process by PID, the runner is a child subreaper (PR_SET_CHILD_SUBREAPER)
 * and every start is written to a registry file in the temporary directory;
 * a stop crosses it out.  h_reap_orphans(), run by the runner after each
 * TCase and at exit, stops (SIGTERM, then SIGKILL) and waits for each
 * process that was started and never stopped, and prints the daemon's log:
 * such a process belongs to a test that failed.  Every process also gets
 * PR_SET_PDEATHSIG, so nothing outlives a runner killed from outside.
 *
 * Functions that can fail call ck_abort_msg(), so they belong in tests and
 * fixtures; h_request() is the exception (it is for worker threads).
 */
#ifndef RL_HARNESS_H
#define RL_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <check.h>
#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

#define H_PATH_MAX 512

/* Called once by the shared main() (tests/check_main.c, built with
 * CHECK_MAIN_HARNESS) before test_suite() and before any test or thread:
 * creates the temporary directory, makes this process the subreaper,
 * initialises libcurl, and registers the at-exit clean-up.  Exits 1 with a
 * message if RATELIMITD_BIN is unset or the directory cannot be made. */
void h_init(void);

/* The test run's private directory (mkdtemp under $TMPDIR or /tmp), removed
 * with everything in it when the runner exits.  Borrowed, static. */
const char *h_tmpdir(void);

/* A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0,
 * getsockname, close).  Aborts the test if no socket can be had. */
int h_free_port(void);

/* Milliseconds on CLOCK_MONOTONIC, and a sleep in milliseconds. */
long long h_now_ms(void);
void h_sleep_ms(long long ms);

/* --- redis-server ------------------------------------------------------ */

struct h_redis {
	int port;    /* in: 0 = pick a free one; out: the port */
	pid_t pid;   /* 0 when not running */
	pid_t owner; /* the process that started it */
	char conf[H_PATH_MAX];
	char log[H_PATH_MAX];
	redisContext *ctx; /* this process's connection, see h_redis_ctx */
	pid_t ctx_pid;
	const char *extra; /* in: more redis.conf lines, or NULL */
	bool sentinel;	   /* in: run redis-sentinel on the file */
	/* in: TLS only (port 0, tls-port = port) with the files of
	 * h_tls_make() in this directory; NULL: in the clear.  hiredis
	 * 0.14 has no TLS: use h_redis_cli() on such a server. */
	const char *tls_dir;
};

/* Write a redis.conf into the temporary directory (port, bind 127.0.0.1,
 * save "", appendonly no), start redis-server on it and wait until PING
 * answers (at most 5 s).  r->port may preset the port (to restart on the
 * same one).  The last started server is the default for h_daemon_start. */
void h_redis_start(struct h_redis *r);

/* SIGTERM by PID and waitpid; closes this process's connection.  Does
 * nothing if r is not running. */
void h_redis_stop(struct h_redis *r);

/* A connection for direct inspection, made on first use in each process
 * (a forked test never shares a socket with the runner). */
redisContext *h_redis_ctx(struct h_redis *r);

/* Run a command (hiredis format) that answers an integer, and return it. */
long long h_redis_int(struct h_redis *r, const char *fmt, ...);

/* The units a sliding_log key holds: the sum of n over its members
 * "<end>:<n>" (docs/algorithms.md); 0 for no key.  Fails the test on a
 * member of another form. */
long long h_redis_log_units(struct h_redis *r, const char *key);

/* --- TLS ------------------------------------------------------------------ */

/*
 * Make, with the openssl command line, in dir (created): ca.pem/ca.key (a
 * CA), server.pem/server.key (for localhost and 127.0.0.1, signed by the
 * CA) and client.pem/client.key (a client certificate of the CA).
 */
void h_tls_make(const char *dir);

/* One more certificate in dir: NAME.pem and NAME.key signed by dir's CA
 * (for localhost and 127.0.0.1), valid for days (0: it expires at once). */
void h_tls_cert(const char *dir, const char *name, int days);

/* Run one redis-cli command on r (over TLS with r->tls_dir's client
 * certificate when set, not verifying the server) and return its output,
 * trimmed (static; the next call overwrites it). */
const char *h_redis_cli(struct h_redis *r, const char *const *args);

/* FLUSHALL, and CONFIG RESETSTAT so command counts start from zero. */
void h_redis_flush(struct h_redis *r);

/*
 * One redis-server shared by the tests of a binary that want one:
 * h_shared_redis_up() starts it once (an unchecked fixture: it outlives
 * the forked tests), h_shared_redis_flush() empties it before each test (a
 * checked fixture), h_shared_redis_stop() stops it (for
 * test_main_at_end()).
 */
extern struct h_redis h_shared_redis;
void h_shared_redis_up(void);
void h_shared_redis_flush(void);
void h_shared_redis_stop(void);
/* A test case named name with those two fixtures (and orphan daemons
 * reaped, each test's teardown run), 60 s per test. */
TCase *h_shared_redis_tcase(const char *name);

/* Sum of "calls" in INFO commandstats over the script commands: eval,
 * evalsha, eval_ro, evalsha_ro, fcall, fcall_ro. */
long long h_redis_script_calls(struct h_redis *r);

/* --- Redis Cluster and Sentinel ----------------------------------------- */

#define H_CLUSTER_NODES 6

/* Three primaries, each with one replica, on free loopback ports:
 * cluster-node-timeout 1500 ms, made with `redis-cli --cluster create
 * --cluster-replicas 1`; h_cluster_start returns once every node reports
 * cluster_state:ok and all agree on the slots (at most 30 s). */
struct h_cluster {
	struct h_redis node[H_CLUSTER_NODES];
};

void h_cluster_start(struct h_cluster *c);
/* The same cluster speaking only TLS (clients, the bus and replication)
 * with the files of h_tls_make(tls_dir); made with redis-cli --tls. */
void h_cluster_start_tls(struct h_cluster *c, const char *tls_dir);
void h_cluster_stop(struct h_cluster *c);
/* The node (index into c->node) that serves slot now as a primary, asked
 * of any node that answers; -1 if none knows. */
int h_cluster_owner(struct h_cluster *c, unsigned slot);
/* Wait (at most ms) until every running node says cluster_state:ok;
 * returns whether they did. */
bool h_cluster_wait_ok(struct h_cluster *c, long long ms);

/* A primary and its replica, watched by three sentinels (quorum 2,
 * down-after 1000 ms, failover-timeout 5000 ms) under the name "mymaster". */
struct h_sentinel {
	struct h_redis primary, replica;
	struct h_redis sentinel[3];
};

void h_sentinel_start(struct h_sentinel *s);
void h_sentinel_stop(struct h_sentinel *s);
/* The port the sentinels name as the primary now (asked of the first that
 * answers), or 0. */
int h_sentinel_primary_port(struct h_sentinel *s);

/* Run argv (a program on PATH) to its end with output to log; its exit
 * status, or -1 when it could not run. */
int h_run(char *const argv[], const char *log);

/* Load in the background: threads sending POST /acquire to port in a
 * loop, each request's body made from body_fmt with a number ("%d"), so
 * the keys spread.  h_load_stop() stops them and tells what they saw. */
struct h_load;
struct h_load_stats {
	long long requests, ok, denied, unavailable, other;
	long long slowest_ms; /* the longest request */
};
struct h_load *h_load_start(int port, int threads, const char *body_fmt);
void h_load_stop(struct h_load *l, struct h_load_stats *out);

/*
 * Just after a primary was killed, with load running: POST body to
 * /acquire on h_daemon_current() every 50 ms until Redis decides it again
 * (200), at most max_ms; then stop the load, print the figures under
 * what, and assert that Redis came back, that every answer meanwhile was
 * 200 or 503 (on_backend_error: deny), and that no request took longer
 * than timeout_ms + 1500.  Returns the milliseconds until Redis decided.
 */
long long h_failover_measure(const char *what, const char *body,
    struct h_load *load, long long max_ms, long long timeout_ms);

/* --- a relay in front of a server ---------------------------------------- */

/*
 * A TCP relay on a free loopback port, run by threads of the calling
 * process: each connection made to it is joined to a new one to
 * 127.0.0.1:to_port, and bytes pass both ways.  h_relay_hold() makes it
 * hold what comes back from to_port for ms before passing it on (a reply
 * late after the server ran the command: a slow network, a busy I/O
 * loop); 0 passes it at once again.  A connection that sent SUBSCRIBE
 * is never held (a daemon behind the relay hears its notices at once
 * while its calls' replies come late).  What is read during a hold waits
 * for it, then is held its own ms: two replies on one connection within
 * a hold come back up to twice as late.  h_relay_stop() closes every
 * connection, joins the threads and frees the relay.  Aborts the test
 * when it cannot start.
 */
struct h_relay;
struct h_relay *h_relay_start(int to_port);
int h_relay_port(const struct h_relay *r);
void h_relay_hold(struct h_relay *r, long long ms);
void h_relay_stop(struct h_relay *r);

/* --- the daemon ----------------------------------------------------------- */

struct h_daemon {
	int redis_port; /* in: %REDIS_PORT%; 0 = the last h_redis */
	int port;	/* out: %PORT% */
	pid_t pid;
	pid_t owner;
	char conf[H_PATH_MAX];
	char log[H_PATH_MAX];
};

/* Write yaml, with "%PORT%" and "%REDIS_PORT%" substituted, to a file in
 * the temporary directory, start "$RATELIMITD_BIN -c FILE" with stdout and
 * stderr going to a log file, and wait until GET /healthz answers 200 (at
 * most 5 s).  On failure print the log to stderr and abort the test.
 * The RATELIMITD_* environment overrides are cleared for the daemon. */
void h_daemon_start(struct h_daemon *d, const char *yaml);

/* SIGTERM, waitpid (at most 8 s, then SIGKILL), and assert that it exited
 * with status 0; the log is printed when it did not. */
void h_daemon_stop(struct h_daemon *d);

/* The daemon that h_http() talks to: the last one started here. */
struct h_daemon *h_daemon_current(void);

/* Print a file to stderr between two marker lines. */
void h_print_file(const char *title, const char *path);

/* Runner side: stop, wait for and report every registered process that
 * was started and not stopped (see the top of this file).  Harmless in a
 * test process (it does nothing there).  Usable as an unchecked teardown. */
void h_reap_orphans(void);

/* Checked teardown: stop whatever this test started and did not stop. */
void h_test_teardown(void);

/* --- HTTP ----------------------------------------------------------------- */

struct h_header {
	char *name;
	char *value;
};

struct h_resp {
	long status;	      /* 0 if the transfer failed */
	struct h_header *hdr; /* of the final response */
	size_t nhdr, hdrcap;
	char *body; /* NUL-terminated */
	size_t len, cap;
	long num_connects; /* CURLINFO_NUM_CONNECTS */
	json_t *json;	   /* parsed on demand by h_json() */
	char err[CURL_ERROR_SIZE];
};

/* One request on an existing easy handle (so connections are reused),
 * to http://127.0.0.1:port/path.  method is sent as is; body (len bytes,
 * may be NULL) goes with Content-Type: application/json; headers is a
 * NULL-terminated list of "Name: value" or NULL.  Fills *out (which must be
 * zeroed or h_resp_free'd).  Returns 0, or -1 with out->err set.  Touches
 * no global state: callable from several threads, one handle each. */
int h_request(CURL *curl, int port, struct h_resp *out, const char *method,
    const char *path, const char *body, size_t len, const char *const *headers);

/* A new easy handle for h_request(); aborts the test on failure. */
CURL *h_curl_new(void);

/* POST body (a C string) to path on 127.0.0.1:port on a fresh handle;
 * *out is zeroed or freed first.  Aborts the test if the transfer fails
 * (not on any status).  The test's thread. */
void h_post(int port, const char *path, const char *body, struct h_resp *out);

/* One request to h_daemon_current() on a fresh handle; body is a C string
 * or NULL.  Aborts the test if the transfer fails (not on any status). */
void h_http(struct h_resp *out, const char *method, const char *url_path,
    const char *body, const char *const *headers);

/* The value of an unlabelled sample (or one with its labels written out
 * in name) in GET /metrics of h_daemon_current(), or -1 if absent. */
long long h_metric(const char *name);

/* h_metric(), read again every 10 ms until it equals want (a value that
 * lags an answer by the request's completion), at most 1 s: the last. */
long long h_metric_settles(const char *name, long long want);

/* How many times what occurs in the file at path (a daemon's log): the
 * whole file, read now.  Aborts the test when the file cannot be read. */
int h_file_count(const char *path, const char *what);

/* Value of the first header called name (any case), or NULL. */
const char *h_resp_header(const struct h_resp *r, const char *name);
/* How many headers are called name (any case). */
size_t h_resp_header_count(const struct h_resp *r, const char *name);

void h_resp_free(struct h_resp *r);

/* The body as JSON (parsed once, owned by r), or NULL if it is not JSON. */
json_t *h_json(struct h_resp *r);
/* The field of a JSON object body, or NULL if absent or not an object. */
json_t *h_json_get(struct h_resp *r, const char *field);
/* The integer field; aborts the test if it is not an integer. */
long long h_json_int(struct h_resp *r, const char *field);
/* The string field, or NULL if it is absent or not a string. */
const char *h_json_str(struct h_resp *r, const char *field);

#endif
