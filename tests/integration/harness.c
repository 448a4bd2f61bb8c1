/*
 * harness.c - processes, ports, Redis and HTTP for the integration tests;
 * see harness.h for what each function promises and for how processes are
 * kept track of across Check's forked tests.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check_main.h"
#include "harness.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum proc_kind { PROC_REDIS = 'r', PROC_DAEMON = 'd' };

/* The processes this process started and has not stopped yet. */
struct proc {
	pid_t pid;
	pid_t owner;
	int kind;
	char log[H_PATH_MAX];
};

#define MAX_PROCS 64
static struct proc procs[MAX_PROCS];

static char tmpdir[H_PATH_MAX];
static char registry[H_PATH_MAX + 32];
static pid_t runner_pid;
static int last_redis_port;
static struct h_daemon *current_daemon;
static unsigned file_seq;

/* --- small helpers ---------------------------------------------------- */

long long
h_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
h_sleep_ms(long long ms)
{
	struct timespec ts;

	if (ms <= 0)
		return;
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (ms % 1000) * 1000000;
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

static void
write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_msg(f != NULL, "cannot write %s: %s", path, strerror(errno));
	fputs(text, f);
	ck_assert_msg(fclose(f) == 0, "cannot write %s", path);
}

void
h_print_file(const char *title, const char *path)
{
	char buf[4096];
	size_t n;
	FILE *f = fopen(path, "r");

	fprintf(stderr, "----- %s (%s) -----\n", title, path);
	if (f == NULL) {
		fprintf(stderr, "(cannot open: %s)\n", strerror(errno));
	} else {
		while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
			fwrite(buf, 1, n, stderr);
		fclose(f);
	}
	fprintf(stderr, "----- end of %s -----\n", title);
}

/* A fresh path in the temporary directory: <tmpdir>/<stem>-<pid>-<n><ext>. */
static void
tmp_path(char *out, size_t outlen, const char *stem, const char *ext)
{
	int n = snprintf(out, outlen, "%s/%s-%ld-%u%s", h_tmpdir(), stem,
	    (long)getpid(), file_seq++, ext);

	ck_assert_msg(n > 0 && (size_t)n < outlen, "path too long");
}

/* --- the process registry ---------------------------------------------- */

static void
registry_append(const char *line)
{
	int fd = open(registry, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
	    0600);

	if (fd < 0)
		return;
	/* One write with O_APPEND: lines from several processes never mix. */
	if (write(fd, line, strlen(line)) < 0)
		fprintf(stderr, "harness: registry: %s\n", strerror(errno));
	close(fd);
}

static void
proc_add(pid_t pid, int kind, const char *log)
{
	char line[H_PATH_MAX + 64];
	size_t i;

	for (i = 0; i < MAX_PROCS; i++) {
		if (procs[i].pid == 0) {
			procs[i].pid = pid;
			procs[i].owner = getpid();
			procs[i].kind = kind;
			snprintf(procs[i].log, sizeof(procs[i].log), "%s", log);
			break;
		}
	}
	snprintf(line, sizeof(line), "S %ld %c %s\n", (long)pid, kind, log);
	registry_append(line);
	if (i == MAX_PROCS)
		ck_abort_msg("harness: more than %d processes", MAX_PROCS);
}

static void
proc_del(pid_t pid)
{
	char line[64];
	size_t i;

	for (i = 0; i < MAX_PROCS; i++)
		if (procs[i].pid == pid)
			procs[i].pid = 0;
	snprintf(line, sizeof(line), "E %ld\n", (long)pid);
	registry_append(line);
}

/* Wait for pid for at most ms; returns true and the status if it ended. */
static bool
wait_pid(pid_t pid, long long ms, int *status)
{
	long long end = h_now_ms() + ms;
	pid_t w;

	for (;;) {
		w = waitpid(pid, status, WNOHANG);
		if (w == pid)
			return true;
		if (w < 0 && errno == ECHILD) {
			/* Not (or no longer) our child: wait for it to go. */
			if (kill(pid, 0) != 0) {
				*status = -1;
				return true;
			}
		}
		if (h_now_ms() >= end)
			return false;
		h_sleep_ms(10);
	}
}

/* SIGTERM, wait up to ms, then SIGKILL.  Returns the wait status, or -1
 * if it had to be killed or the status is unknown. */
static int
terminate(pid_t pid, long long ms)
{
	int status = -1;

	if (kill(pid, SIGTERM) != 0 && errno == ESRCH) {
		if (!wait_pid(pid, 100, &status))
			status = -1;
		return status;
	}
	if (wait_pid(pid, ms, &status))
		return status;
	kill(pid, SIGKILL);
	wait_pid(pid, 2000, &status);
	return -1;
}

static void
describe_status(int status, char *buf, size_t len)
{
	if (status == -1)
		snprintf(buf, len, "killed by the harness or unknown");
	else if (WIFEXITED(status))
		snprintf(buf, len, "exit status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status),
		    strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "wait status %d", status);
}

void
h_reap_orphans(void)
{
	struct orphan {
		long pid;
		int kind;
		char log[H_PATH_MAX];
	} *o = NULL;
	size_t n = 0, cap = 0, i, j;
	char line[H_PATH_MAX + 64], st[96];
	FILE *f;

	if (getpid() != runner_pid || registry[0] == '\0')
		return;
	f = fopen(registry, "r");
	if (f == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		long pid;
		char kind, log[H_PATH_MAX];

		if (sscanf(line, "S %ld %c %511s", &pid, &kind, log) == 3) {
			if (n == cap) {
				cap = cap ? cap * 2 : 16;
				o = realloc(o, cap * sizeof(*o));
				if (o == NULL)
					abort();
			}
			o[n].pid = pid;
			o[n].kind = kind;
			snprintf(o[n].log, sizeof(o[n].log), "%s", log);
			n++;
		} else if (sscanf(line, "E %ld", &pid) == 1) {
			for (j = 0; j < n; j++)
				if (o[j].pid == pid)
					o[j].pid = 0;
		}
	}
	fclose(f);
	for (i = 0; i < n; i++) {
		bool mine = false;

		if (o[i].pid == 0)
			continue;
		for (j = 0; j < MAX_PROCS; j++)
			if (procs[j].pid == (pid_t)o[i].pid)
				mine = true;
		if (mine)
			continue; /* the runner's own, still in use */
		describe_status(terminate((pid_t)o[i].pid, 5000), st,
		    sizeof(st));
		fprintf(stderr,
		    "harness: %s pid %ld was left running by a "
		    "failed test; stopped (%s)\n",
		    o[i].kind == PROC_DAEMON ? "ratelimitd" : "redis-server",
		    o[i].pid, st);
		if (o[i].kind == PROC_DAEMON)
			h_print_file("ratelimitd log", o[i].log);
		snprintf(line, sizeof(line), "E %ld\n", o[i].pid);
		registry_append(line);
	}
	free(o);
}

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void
at_exit(void)
{
	size_t i;

	/* Whatever this process started and still runs (a test that
	 * returned without stopping, or the runner's shared servers). */
	for (i = 0; i < MAX_PROCS; i++) {
		if (procs[i].pid != 0 && procs[i].owner == getpid()) {
			terminate(procs[i].pid, 5000);
			proc_del(procs[i].pid);
		}
	}
	if (getpid() != runner_pid)
		return;
	h_reap_orphans();
	if (getenv("RATELIMITD_KEEP_TMP") != NULL)
		fprintf(stderr, "harness: kept %s\n", tmpdir);
	else if (tmpdir[0] != '\0')
		nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void
h_init(void)
{
	const char *base = getenv("TMPDIR");
	const char *bin = getenv("RATELIMITD_BIN");

	if (bin == NULL || *bin == '\0') {
		fprintf(stderr,
		    "RATELIMITD_BIN is not set (run `make "
		    "integration`)\n");
		exit(1);
	}
	if (access(bin, X_OK) != 0) {
		fprintf(stderr, "RATELIMITD_BIN=%s: %s\n", bin,
		    strerror(errno));
		exit(1);
	}
	if (base == NULL || *base == '\0')
		base = "/tmp";
	if (strlen(base) > H_PATH_MAX - 128) {
		fprintf(stderr, "TMPDIR is too long\n");
		exit(1);
	}
	snprintf(tmpdir, sizeof(tmpdir), "%s/rl-itest-XXXXXX", base);
	if (mkdtemp(tmpdir) == NULL) {
		fprintf(stderr, "mkdtemp %s: %s\n", tmpdir, strerror(errno));
		exit(1);
	}
	snprintf(registry, sizeof(registry), "%s/processes", tmpdir);
	runner_pid = getpid();
	/* Orphans of failed tests become our children, so we can wait for
	 * them by PID. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
		fprintf(stderr, "harness: PR_SET_CHILD_SUBREAPER: %s\n",
		    strerror(errno));
	if (curl_global_init(CURL_GLOBAL_ALL) != 0) {
		fprintf(stderr, "curl_global_init failed\n");
		exit(1);
	}
	atexit(at_exit);
}

const char *
h_tmpdir(void)
{
	ck_assert_msg(tmpdir[0] != '\0', "h_init() was not called");
	return tmpdir;
}

int
h_free_port(void)
{
	return test_free_port();
}

/* fork and exec argv with stdout/stderr to log; registered at once. */
static pid_t
spawn(char *const argv[], const char *log, int kind)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	sigset_t none;
	int fd;

	ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		/* Never outlive the process that started us. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		signal(SIGALRM, SIG_DFL);
		fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0)
			_exit(126);
		dup2(fd, 1);
		dup2(fd, 2);
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0)
			dup2(fd, 0);
		for (fd = 3; fd < 1024; fd++)
			close(fd);
		unsetenv("RATELIMITD_LISTEN");
		unsetenv("RATELIMITD_REDIS_URL");
		unsetenv("RATELIMITD_LOG_LEVEL");
		execvp(argv[0], argv);
		dprintf(2, "harness: exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	proc_add(pid, kind, log);
	return pid;
}

/* --- redis-server ------------------------------------------------------ */

static bool
redis_pings(int port)
{
	struct timeval tv = { 0, 200000 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	redisReply *rep;
	bool ok = false;

	if (c == NULL)
		return false;
	if (!c->err) {
		redisSetTimeout(c, tv);
		rep = redisCommand(c, "PING");
		ok = rep != NULL && rep->type == REDIS_REPLY_STATUS &&
		    strcmp(rep->str, "PONG") == 0;
		if (rep != NULL)
			freeReplyObject(rep);
	}
	redisFree(c);
	return ok;
}

/* --- TLS ------------------------------------------------------------------ */

/* Run the openssl command line; abort the test when it fails. */
static void
openssl_run(const char *const argv[])
{
	char log[H_PATH_MAX];

	tmp_path(log, sizeof(log), "openssl", ".log");
	if (h_run((char *const *)argv, log) != 0) {
		h_print_file("openssl", log);
		ck_abort_msg("openssl %s failed", argv[1]);
	}
}

/* dir/NAME.key (P-256) and a request for it in dir/NAME.csr. */
static void
tls_key_and_csr(const char *dir, const char *name, const char *cn)
{
	char key[H_PATH_MAX], csr[H_PATH_MAX], subj[128];

	snprintf(key, sizeof(key), "%s/%s.key", dir, name);
	snprintf(csr, sizeof(csr), "%s/%s.csr", dir, name);
	snprintf(subj, sizeof(subj), "/CN=%s", cn);
	openssl_run((const char *const[]){ "openssl", "req", "-new", "-newkey",
	    "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
	    key, "-out", csr, "-subj", subj, NULL });
}

void
h_tls_cert(const char *dir, const char *name, int days)
{
	char csr[H_PATH_MAX], pem[H_PATH_MAX], ca[H_PATH_MAX],
	    cakey[H_PATH_MAX], ext[H_PATH_MAX], serial[H_PATH_MAX], d[16];

	tls_key_and_csr(dir, name, "localhost");
	snprintf(csr, sizeof(csr), "%s/%s.csr", dir, name);
	snprintf(pem, sizeof(pem), "%s/%s.pem", dir, name);
	snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
	snprintf(cakey, sizeof(cakey), "%s/ca.key", dir);
	snprintf(ext, sizeof(ext), "%s/ext.cnf", dir);
	snprintf(serial, sizeof(serial), "%s/ca.srl", dir);
	snprintf(d, sizeof(d), "%d", days);
	write_file(ext,
	    "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
	    "extendedKeyUsage=serverAuth,clientAuth\n");
	openssl_run((const char *const[]){ "openssl", "x509", "-req", "-in",
	    csr, "-CA", ca, "-CAkey", cakey, "-CAserial", serial,
	    "-CAcreateserial", "-days", d, "-extfile", ext, "-out", pem,
	    NULL });
}

void
h_tls_make(const char *dir)
{
	char key[H_PATH_MAX], ca[H_PATH_MAX];

	ck_assert_msg(mkdir(dir, 0700) == 0 || errno == EEXIST, "mkdir %s: %s",
	    dir, strerror(errno));
	snprintf(key, sizeof(key), "%s/ca.key", dir);
	snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
	openssl_run((const char *const[]){ "openssl", "req", "-x509", "-newkey",
	    "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
	    key, "-out", ca, "-days", "2", "-subj", "/CN=ratelimitd test CA",
	    NULL });
	h_tls_cert(dir, "server", 2);
	h_tls_cert(dir, "client", 2);
}

const char *
h_redis_cli(struct h_redis *r, const char *const *args)
{
	static char out[8192];
	char log[H_PATH_MAX], port[16], ca[H_PATH_MAX], cert[H_PATH_MAX],
	    key[H_PATH_MAX];
	char *argv[64];
	size_t n = 0, len;
	FILE *f;

	snprintf(port, sizeof(port), "%d", r->port);
	argv[n++] = (char *)"redis-cli";
	argv[n++] = (char *)"-h";
	argv[n++] = (char *)"127.0.0.1";
	argv[n++] = (char *)"-p";
	argv[n++] = port;
	if (r->tls_dir != NULL) {
		snprintf(ca, sizeof(ca), "%s/ca.pem", r->tls_dir);
		snprintf(cert, sizeof(cert), "%s/client.pem", r->tls_dir);
		snprintf(key, sizeof(key), "%s/client.key", r->tls_dir);
		argv[n++] = (char *)"--tls";
		argv[n++] = (char *)"--cacert";
		argv[n++] = ca;
		argv[n++] = (char *)"--cert";
		argv[n++] = cert;
		argv[n++] = (char *)"--key";
		argv[n++] = key;
		/* The tests look at the daemon's verification, not at this
		 * control connection's: it must work with an expired or
		 * rotated server certificate too. */
		argv[n++] = (char *)"--insecure";
	}
	while (*args != NULL && n < 63)
		argv[n++] = (char *)*args++;
	argv[n] = NULL;
	tmp_path(log, sizeof(log), "redis-cli", ".out");
	out[0] = '\0';
	(void)h_run(argv, log);
	if ((f = fopen(log, "r")) != NULL) {
		len = fread(out, 1, sizeof(out) - 1, f);
		out[len] = '\0';
		fclose(f);
	}
	len = strlen(out);
	while (len > 0 && (out[len - 1] == '\n' || out[len - 1] == '\r'))
		out[--len] = '\0';
	return out;
}

static bool
redis_ready(struct h_redis *r)
{
	if (r->tls_dir == NULL)
		return redis_pings(r->port);
	return strcmp(h_redis_cli(r, (const char *const[]){ "PING", NULL }),
		   "PONG") == 0;
}

void
h_redis_start(struct h_redis *r)
{
	char conf[4 * H_PATH_MAX + 1024], tls[4 * H_PATH_MAX + 256];
	char rdb[32], path[H_PATH_MAX + 32];
	char *argv[3];
	long long end;
	int status, attempt;
	bool fixed = r->port != 0;

	for (attempt = 0; attempt < 3; attempt++) {
		if (!fixed)
			r->port = h_free_port();
		tmp_path(r->conf, sizeof(r->conf), "redis", ".conf");
		tmp_path(r->log, sizeof(r->log), "redis", ".log");
		tls[0] = '\0';
		if (r->tls_dir != NULL)
			snprintf(tls, sizeof(tls),
			    "port 0\ntls-port %d\n"
			    "tls-cert-file %s/server.pem\n"
			    "tls-key-file %s/server.key\n"
			    "tls-ca-cert-file %s/ca.pem\n"
			    "tls-auth-clients no\n",
			    r->port, r->tls_dir, r->tls_dir, r->tls_dir);
		/* Each server its own RDB file, removed first: a replica's
		 * full sync writes one, which a later server on the shared
		 * directory would load at start (a cluster node then is not
		 * empty). */
		snprintf(rdb, sizeof(rdb), "dump-%d.rdb", r->port);
		snprintf(path, sizeof(path), "%s/%s", h_tmpdir(), rdb);
		(void)unlink(path);
		snprintf(conf, sizeof(conf),
		    "port %d\nbind 127.0.0.1\n%s%s%sdaemonize no\ndir %s\n"
		    "logfile \"%s\"\n%s%s",
		    r->port,
		    r->sentinel ? "" : "save \"\"\nappendonly no\ndbfilename ",
		    r->sentinel ? "" : rdb, r->sentinel ? "" : "\n", h_tmpdir(),
		    r->log, tls, r->extra != NULL ? r->extra : "");
		write_file(r->conf, conf);
		argv[0] = r->sentinel ? (char *)"redis-sentinel" :
					(char *)"redis-server";
		argv[1] = r->conf;
		argv[2] = NULL;
		r->pid = spawn(argv, r->log, PROC_REDIS);
		r->owner = getpid();
		end = h_now_ms() + 5000;
		while (h_now_ms() < end) {
			if (redis_ready(r)) {
				last_redis_port = r->port;
				return;
			}
			if (waitpid(r->pid, &status, WNOHANG) == r->pid)
				break; /* e.g. the port was taken */
			h_sleep_ms(20);
		}
		h_print_file("redis-server log", r->log);
		terminate(r->pid, 2000);
		proc_del(r->pid);
		r->pid = 0;
		if (fixed)
			break;
	}
	ck_abort_msg("redis-server did not answer PING on port %d", r->port);
}

void
h_redis_stop(struct h_redis *r)
{
	if (r->ctx != NULL && r->ctx_pid == getpid())
		redisFree(r->ctx);
	r->ctx = NULL;
	if (r->pid == 0 || r->owner != getpid())
		return;
	terminate(r->pid, 5000);
	proc_del(r->pid);
	r->pid = 0;
}

redisContext *
h_redis_ctx(struct h_redis *r)
{
	struct timeval tv = { 2, 0 };

	if (r->ctx != NULL && r->ctx_pid == getpid() && !r->ctx->err)
		return r->ctx;
	if (r->ctx != NULL && r->ctx_pid == getpid())
		redisFree(r->ctx);
	/* A context inherited from another process is dropped, not freed:
	 * its socket belongs to that process's conversation. */
	r->ctx = redisConnectWithTimeout("127.0.0.1", r->port, tv);
	r->ctx_pid = getpid();
	ck_assert_msg(r->ctx != NULL && !r->ctx->err,
	    "cannot connect to redis on port %d: %s", r->port,
	    r->ctx ? r->ctx->errstr : "out of memory");
	redisSetTimeout(r->ctx, tv);
	return r->ctx;
}

static redisReply *
redis_vcmd(struct h_redis *r, const char *fmt, va_list ap)
{
	redisContext *c = h_redis_ctx(r);
	redisReply *rep = redisvCommand(c, fmt, ap);

	ck_assert_msg(rep != NULL, "redis %s: %s", fmt, c->errstr);
	if (rep->type == REDIS_REPLY_ERROR) {
		char msg[256];

		snprintf(msg, sizeof(msg), "%s", rep->str);
		freeReplyObject(rep);
		ck_abort_msg("redis %s: %s", fmt, msg);
	}
	return rep;
}

static redisReply *
redis_cmd(struct h_redis *r, const char *fmt, ...)
{
	va_list ap;
	redisReply *rep;

	va_start(ap, fmt);
	rep = redis_vcmd(r, fmt, ap);
	va_end(ap);
	return rep;
}

long long
h_redis_int(struct h_redis *r, const char *fmt, ...)
{
	va_list ap;
	redisReply *rep;
	long long v;

	va_start(ap, fmt);
	rep = redis_vcmd(r, fmt, ap);
	va_end(ap);
	if (rep->type != REDIS_REPLY_INTEGER) {
		freeReplyObject(rep);
		ck_abort_msg("redis %s: not an integer reply", fmt);
	}
	v = rep->integer;
	freeReplyObject(rep);
	return v;
}

long long
h_redis_log_units(struct h_redis *r, const char *key)
{
	redisReply *rep = redis_cmd(r, "ZRANGE %s 0 -1", key);
	long long units = 0, end, n;
	size_t i;

	if (rep->type != REDIS_REPLY_ARRAY) {
		freeReplyObject(rep);
		ck_abort_msg("ZRANGE %s: not an array", key);
	}
	for (i = 0; i < rep->elements; i++) {
		if (sscanf(rep->element[i]->str, "%lld:%lld", &end, &n) != 2 ||
		    n < 1 || end < n) {
			freeReplyObject(rep);
			ck_abort_msg("%s: a member is not <end>:<n>", key);
		}
		units += n;
	}
	freeReplyObject(rep);
	return units;
}

void
h_redis_flush(struct h_redis *r)
{
	freeReplyObject(redis_cmd(r, "FLUSHALL"));
	freeReplyObject(redis_cmd(r, "CONFIG RESETSTAT"));
}

struct h_redis h_shared_redis;

void
h_shared_redis_up(void)
{
	if (h_shared_redis.pid == 0)
		h_redis_start(&h_shared_redis);
}

void
h_shared_redis_flush(void)
{
	h_redis_flush(&h_shared_redis);
}

void
h_shared_redis_stop(void)
{
	h_redis_stop(&h_shared_redis);
}

TCase *
h_shared_redis_tcase(const char *name)
{
	TCase *tc = tcase_create(name);

	tcase_add_unchecked_fixture(tc, h_shared_redis_up, h_reap_orphans);
	tcase_add_checked_fixture(tc, h_shared_redis_flush, h_test_teardown);
	tcase_set_timeout(tc, 60);
	return tc;
}

long long
h_redis_script_calls(struct h_redis *r)
{
	static const char *const names[] = { "eval", "evalsha", "eval_ro",
		"evalsha_ro", "fcall", "fcall_ro" };
	redisReply *rep = redis_cmd(r, "INFO commandstats");
	long long sum = 0;
	const char *p;
	size_t i;

	ck_assert_msg(rep->type == REDIS_REPLY_STRING ||
		rep->type == REDIS_REPLY_STATUS,
	    "INFO: unexpected reply");
	for (p = rep->str; p != NULL && *p != '\0';) {
		const char *eol = strchr(p, '\n');

		if (strncmp(p, "cmdstat_", 8) == 0) {
			const char *name = p + 8;
			const char *colon = strchr(name, ':');
			const char *calls = colon ? strstr(colon, "calls=") :
						    NULL;

			for (i = 0; colon && calls &&
			     i < sizeof(names) / sizeof(names[0]);
			     i++)
				if ((size_t)(colon - name) ==
					strlen(names[i]) &&
				    strncasecmp(name, names[i],
					strlen(names[i])) == 0)
					sum += atoll(calls + 6);
		}
		p = eol ? eol + 1 : NULL;
	}
	freeReplyObject(rep);
	return sum;
}

/* --- Redis Cluster and Sentinel ----------------------------------------- */

int
h_run(char *const argv[], const char *log)
{
	pid_t pid = spawn(argv, log, PROC_REDIS);
	int status;

	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	proc_del(pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A short-lived connection to port, or NULL. */
static redisContext *
quick_ctx(int port)
{
	struct timeval tv = { 1, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);

	if (c != NULL && c->err) {
		redisFree(c);
		return NULL;
	}
	if (c != NULL)
		redisSetTimeout(c, tv);
	return c;
}

/* Whether INFO-like text of "CLUSTER INFO" on port says state ok. */
static bool
cluster_ok(int port)
{
	redisContext *c = quick_ctx(port);
	redisReply *r;
	bool ok = false;

	if (c == NULL)
		return false;
	r = redisCommand(c, "CLUSTER INFO");
	ok = r != NULL && r->type == REDIS_REPLY_STRING &&
	    strstr(r->str, "cluster_state:ok") != NULL;
	if (r != NULL)
		freeReplyObject(r);
	redisFree(c);
	return ok;
}

/* The primaries' ports per CLUSTER SLOTS on port, as "a-b:port,..."
 * (sorted as the server gives them), for comparing views. */
static void
cluster_view(int port, char *out, size_t outlen)
{
	redisContext *c = quick_ctx(port);
	redisReply *r;
	size_t i, used = 0;

	out[0] = '\0';
	if (c == NULL)
		return;
	r = redisCommand(c, "CLUSTER SLOTS");
	if (r != NULL && r->type == REDIS_REPLY_ARRAY) {
		for (i = 0; i < r->elements; i++) {
			redisReply *e = r->element[i];

			if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
			    e->element[2]->type != REDIS_REPLY_ARRAY ||
			    e->element[2]->elements < 2)
				continue;
			used += (size_t)snprintf(out + used,
			    used < outlen ? outlen - used : 0,
			    "%lld-%lld:%lld,", e->element[0]->integer,
			    e->element[1]->integer,
			    e->element[2]->element[1]->integer);
			if (used >= outlen)
				used = outlen - 1;
		}
	}
	if (r != NULL)
		freeReplyObject(r);
	redisFree(c);
}

bool
h_cluster_wait_ok(struct h_cluster *c, long long ms)
{
	long long end = h_now_ms() + ms;
	char first[512], view[512];
	int i, seen;

	while (h_now_ms() < end) {
		bool ok = true;

		seen = 0;
		for (i = 0; i < H_CLUSTER_NODES && ok; i++) {
			if (c->node[i].pid == 0)
				continue;
			if (!cluster_ok(c->node[i].port)) {
				ok = false;
				break;
			}
			cluster_view(c->node[i].port, view, sizeof(view));
			if (seen++ == 0)
				memcpy(first, view, sizeof(first));
			else if (strcmp(first, view) != 0)
				ok = false;
		}
		if (ok && seen > 0)
			return true;
		h_sleep_ms(100);
	}
	return false;
}

/* Whether every running TLS node says cluster_state:ok. */
static bool
cluster_tls_ok(struct h_cluster *c)
{
	int i;

	for (i = 0; i < H_CLUSTER_NODES; i++)
		if (c->node[i].pid != 0 &&
		    strstr(h_redis_cli(&c->node[i],
			       (const char *const[]){
				   "CLUSTER", "INFO", NULL }),
			"cluster_state:ok") == NULL)
			return false;
	return true;
}

static void
cluster_start(struct h_cluster *c, const char *tls_dir)
{
	char extra[H_PATH_MAX + 128], addr[H_CLUSTER_NODES][32],
	    log[H_PATH_MAX], ca[H_PATH_MAX], cert[H_PATH_MAX], key[H_PATH_MAX],
	    nodes[H_PATH_MAX + 32];
	char *argv[H_CLUSTER_NODES + 16];
	long long end;
	int i, n = 0;

	memset(c, 0, sizeof(*c));
	for (i = 0; i < H_CLUSTER_NODES; i++) {
		c->node[i].port = h_free_port();
		/* A node killed earlier in the run may have had this port
		 * and left its nodes file: this one starts empty. */
		snprintf(nodes, sizeof(nodes), "%s/nodes-%d.conf", h_tmpdir(),
		    c->node[i].port);
		(void)unlink(nodes);
		/* The bus port would be port + 10000, past 65535 for most
		 * free ports: give it one of its own. */
		snprintf(extra, sizeof(extra),
		    "cluster-enabled yes\ncluster-config-file nodes-%d.conf\n"
		    "cluster-node-timeout 1500\ncluster-port %d\n"
		    "cluster-replica-validity-factor 0\n%s",
		    c->node[i].port, h_free_port(),
		    tls_dir != NULL ? "tls-cluster yes\ntls-replication yes\n" :
				      "");
		c->node[i].extra = extra;
		c->node[i].tls_dir = tls_dir;
		h_redis_start(&c->node[i]);
		c->node[i].extra = NULL;
		snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d",
		    c->node[i].port);
	}
	argv[n++] = (char *)"redis-cli";
	if (tls_dir != NULL) {
		snprintf(ca, sizeof(ca), "%s/ca.pem", tls_dir);
		snprintf(cert, sizeof(cert), "%s/client.pem", tls_dir);
		snprintf(key, sizeof(key), "%s/client.key", tls_dir);
		argv[n++] = (char *)"--tls";
		argv[n++] = (char *)"--cacert";
		argv[n++] = ca;
		argv[n++] = (char *)"--cert";
		argv[n++] = cert;
		argv[n++] = (char *)"--key";
		argv[n++] = key;
	}
	argv[n++] = (char *)"--cluster";
	argv[n++] = (char *)"create";
	for (i = 0; i < H_CLUSTER_NODES; i++)
		argv[n++] = addr[i];
	argv[n++] = (char *)"--cluster-replicas";
	argv[n++] = (char *)"1";
	argv[n++] = (char *)"--cluster-yes";
	argv[n] = NULL;
	tmp_path(log, sizeof(log), "cluster-create", ".log");
	if (h_run(argv, log) != 0) {
		h_print_file("redis-cli --cluster create", log);
		ck_abort_msg("redis-cli --cluster create failed");
	}
	if (tls_dir != NULL) {
		/* hiredis 0.14 speaks no TLS: ask through redis-cli. */
		end = h_now_ms() + 30000;
		while (!cluster_tls_ok(c) && h_now_ms() < end)
			h_sleep_ms(200);
		if (!cluster_tls_ok(c)) {
			h_print_file("redis-cli --cluster create", log);
			ck_abort_msg(
			    "the TLS cluster did not reach "
			    "cluster_state:ok");
		}
		return;
	}
	if (!h_cluster_wait_ok(c, 30000)) {
		h_print_file("redis-cli --cluster create", log);
		ck_abort_msg("the cluster did not reach cluster_state:ok");
	}
}

void
h_cluster_start(struct h_cluster *c)
{
	cluster_start(c, NULL);
}

void
h_cluster_start_tls(struct h_cluster *c, const char *tls_dir)
{
	cluster_start(c, tls_dir);
}

void
h_cluster_stop(struct h_cluster *c)
{
	int i;

	for (i = 0; i < H_CLUSTER_NODES; i++)
		h_redis_stop(&c->node[i]);
}

int
h_cluster_owner(struct h_cluster *c, unsigned slot)
{
	redisContext *ctx;
	redisReply *r;
	int i, j, port = 0;
	size_t k;

	for (i = 0; i < H_CLUSTER_NODES && port == 0; i++) {
		if (c->node[i].pid == 0 ||
		    (ctx = quick_ctx(c->node[i].port)) == NULL)
			continue;
		r = redisCommand(ctx, "CLUSTER SLOTS");
		for (k = 0; r != NULL && r->type == REDIS_REPLY_ARRAY &&
		     k < r->elements;
		     k++) {
			redisReply *e = r->element[k];

			if (e->elements >= 3 &&
			    (unsigned)e->element[0]->integer <= slot &&
			    (unsigned)e->element[1]->integer >= slot)
				port = (int)e->element[2]->element[1]->integer;
		}
		if (r != NULL)
			freeReplyObject(r);
		redisFree(ctx);
	}
	for (j = 0; j < H_CLUSTER_NODES; j++)
		if (port != 0 && c->node[j].port == port)
			return j;
	return -1;
}

void
h_sentinel_start(struct h_sentinel *s)
{
	char extra[512];
	int i;

	memset(s, 0, sizeof(*s));
	h_redis_start(&s->primary);
	snprintf(extra, sizeof(extra), "replicaof 127.0.0.1 %d\n",
	    s->primary.port);
	s->replica.extra = extra;
	h_redis_start(&s->replica);
	s->replica.extra = NULL;
	for (i = 0; i < 3; i++) {
		snprintf(extra, sizeof(extra),
		    "sentinel monitor mymaster 127.0.0.1 %d 2\n"
		    "sentinel down-after-milliseconds mymaster 1000\n"
		    "sentinel failover-timeout mymaster 5000\n"
		    "sentinel parallel-syncs mymaster 1\n",
		    s->primary.port);
		s->sentinel[i].sentinel = true;
		s->sentinel[i].extra = extra;
		h_redis_start(&s->sentinel[i]);
		s->sentinel[i].extra = NULL;
	}
	/* Every sentinel must know the replica and the other sentinels
	 * before a failover can happen: wait for it (at most 20 s). */
	for (i = 0; i < 3; i++) {
		long long end = h_now_ms() + 20000;
		bool ready = false;

		while (!ready && h_now_ms() < end) {
			redisContext *c = quick_ctx(s->sentinel[i].port);
			redisReply *r = c != NULL ?
			    redisCommand(c, "SENTINEL MASTER mymaster") :
			    NULL;
			long long replicas = -1, others = -1;
			size_t k;

			for (k = 0; r != NULL && r->type == REDIS_REPLY_ARRAY &&
			     k + 1 < r->elements;
			     k += 2) {
				if (strcmp(r->element[k]->str, "num-slaves") ==
				    0)
					replicas = atoll(
					    r->element[k + 1]->str);
				if (strcmp(r->element[k]->str,
					"num-other-sentinels") == 0)
					others = atoll(r->element[k + 1]->str);
			}
			ready = replicas >= 1 && others >= 2;
			if (r != NULL)
				freeReplyObject(r);
			if (c != NULL)
				redisFree(c);
			if (!ready)
				h_sleep_ms(100);
		}
		ck_assert_msg(ready,
		    "sentinel %d did not see the replica "
		    "and the other sentinels",
		    i);
	}
}

void
h_sentinel_stop(struct h_sentinel *s)
{
	int i;

	for (i = 0; i < 3; i++)
		h_redis_stop(&s->sentinel[i]);
	h_redis_stop(&s->replica);
	h_redis_stop(&s->primary);
}

int
h_sentinel_primary_port(struct h_sentinel *s)
{
	int i, port = 0;

	for (i = 0; i < 3 && port == 0; i++) {
		redisContext *c;
		redisReply *r;

		if (s->sentinel[i].pid == 0 ||
		    (c = quick_ctx(s->sentinel[i].port)) == NULL)
			continue;
		r = redisCommand(c,
		    "SENTINEL GET-MASTER-ADDR-BY-NAME mymaster");
		if (r != NULL && r->type == REDIS_REPLY_ARRAY &&
		    r->elements == 2 &&
		    r->element[1]->type == REDIS_REPLY_STRING)
			port = atoi(r->element[1]->str);
		if (r != NULL)
			freeReplyObject(r);
		redisFree(c);
	}
	return port;
}

#define H_LOAD_THREADS_MAX 16

struct h_load_worker {
	pthread_t thread;
	struct h_load *load;
	int id;
	struct h_load_stats st;
};

struct h_load {
	int port, nthreads;
	const char *fmt;
	atomic_bool stop;
	struct h_load_worker w[H_LOAD_THREADS_MAX];
};

static void *
load_work(void *arg)
{
	struct h_load_worker *w = arg;
	struct h_resp r = { 0 };
	CURL *c = curl_easy_init();
	char body[256];
	int k = 0;

	while (c != NULL && !atomic_load(&w->load->stop)) {
		long long t = h_now_ms(), took;

		snprintf(body, sizeof(body), w->load->fmt,
		    w->id * 1000 + k++ % 1000);
		if (h_request(c, w->load->port, &r, "POST", "/acquire", body,
			strlen(body), NULL) != 0)
			w->st.other++;
		else if (r.status == 200)
			w->st.ok++;
		else if (r.status == 429)
			w->st.denied++;
		else if (r.status == 503)
			w->st.unavailable++;
		else
			w->st.other++;
		w->st.requests++;
		if ((took = h_now_ms() - t) > w->st.slowest_ms)
			w->st.slowest_ms = took;
	}
	h_resp_free(&r);
	if (c != NULL)
		curl_easy_cleanup(c);
	return NULL;
}

struct h_load *
h_load_start(int port, int threads, const char *body_fmt)
{
	struct h_load *l = calloc(1, sizeof(*l));
	int i;

	ck_assert(l != NULL && threads >= 1 && threads <= H_LOAD_THREADS_MAX);
	l->port = port;
	l->nthreads = threads;
	l->fmt = body_fmt;
	atomic_init(&l->stop, false);
	for (i = 0; i < threads; i++) {
		l->w[i].load = l;
		l->w[i].id = i;
		ck_assert(pthread_create(&l->w[i].thread, NULL, load_work,
			      &l->w[i]) == 0);
	}
	return l;
}

void
h_load_stop(struct h_load *l, struct h_load_stats *out)
{
	int i;

	memset(out, 0, sizeof(*out));
	atomic_store(&l->stop, true);
	for (i = 0; i < l->nthreads; i++) {
		struct h_load_stats *s = &l->w[i].st;

		pthread_join(l->w[i].thread, NULL);
		out->requests += s->requests;
		out->ok += s->ok;
		out->denied += s->denied;
		out->unavailable += s->unavailable;
		out->other += s->other;
		if (s->slowest_ms > out->slowest_ms)
			out->slowest_ms = s->slowest_ms;
	}
	free(l);
}

long long
h_failover_measure(const char *what, const char *body, struct h_load *load,
    long long max_ms, long long timeout_ms)
{
	struct h_load_stats st;
	long long t0 = h_now_ms(), back = -1;
	struct h_resp r = { 0 };
	long status;

	while (h_now_ms() - t0 < max_ms) {
		h_http(&r, "POST", "/acquire", body, NULL);
		status = r.status;
		h_resp_free(&r);
		ck_assert_msg(status == 200 || status == 503, "status %ld",
		    status);
		if (status == 200) {
			back = h_now_ms() - t0;
			break;
		}
		h_sleep_ms(50);
	}
	h_sleep_ms(300);
	h_load_stop(load, &st);
	fprintf(stderr,
	    "%s failover under load: decisions back %lld ms "
	    "after the primary was killed; %lld requests meanwhile (%lld "
	    "decided by Redis, %lld 503), slowest %lld ms\n",
	    what, back, st.requests, st.ok, st.unavailable, st.slowest_ms);
	ck_assert_msg(back >= 0,
	    "no decision from Redis %lld ms after the "
	    "primary was killed",
	    max_ms);
	ck_assert_msg(st.other == 0 && st.denied == 0,
	    "%lld unexpected "
	    "answers, %lld denials",
	    st.other, st.denied);
	ck_assert_msg(st.slowest_ms < timeout_ms + 1500,
	    "a request took %lld "
	    "ms with redis.timeout %lld ms",
	    st.slowest_ms, timeout_ms);
	return back;
}

/* --- a relay in front of a server ---------------------------------------- */

#define RELAY_CONNS 32

struct relay_conn {
	struct h_relay *relay;
	int cfd, sfd;		/* the client's side, the server's */
	atomic_bool subscriber; /* sent SUBSCRIBE: never held */
	pthread_t up, down;
};

struct h_relay {
	int to_port, port, lfd;
	atomic_llong hold_ms;
	pthread_t accepter;
	struct relay_conn conn[RELAY_CONNS]; /* the accepter's until the
					      * stop joins it */
	int nconn;
};

static bool
relay_write(int fd, const char *p, ssize_t n)
{
	ssize_t w;

	for (; n > 0; p += w, n -= w)
		if ((w = send(fd, p, (size_t)n, MSG_NOSIGNAL)) <= 0)
			return false;
	return true;
}

/* Client to server, at once; at the end, the other way is shut too. */
static void *
relay_up(void *arg)
{
	struct relay_conn *c = arg;
	char buf[16384];
	ssize_t n;

	while ((n = read(c->cfd, buf, sizeof(buf))) > 0) {
		if (memmem(buf, (size_t)n, "SUBSCRIBE", 9) != NULL)
			atomic_store(&c->subscriber, true);
		if (!relay_write(c->sfd, buf, n))
			break;
	}
	shutdown(c->sfd, SHUT_RDWR);
	return NULL;
}

/* Microseconds of CLOCK_MONOTONIC: a hold counted in whole ms could
 * fall short by one. */
static long long
relay_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Server to client, each piece held hold_ms from when it was read (a
 * piece read during another's hold waits for that one first). */
static void *
relay_down(void *arg)
{
	struct relay_conn *c = arg;
	char buf[16384];
	ssize_t n;

	while ((n = read(c->sfd, buf, sizeof(buf))) > 0) {
		long long due = relay_now_us() +
		    (atomic_load(&c->subscriber) ?
			    0 :
			    atomic_load(&c->relay->hold_ms) * 1000);
		long long left;

		while ((left = due - relay_now_us()) > 0)
			usleep((useconds_t)(left > 100000 ? 100000 : left));
		if (!relay_write(c->cfd, buf, n))
			break;
	}
	shutdown(c->cfd, SHUT_RDWR);
	return NULL;
}

static void *
relay_accept(void *arg)
{
	struct h_relay *r = arg;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct relay_conn *c;
	int cfd;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons((uint16_t)r->to_port);
	while ((cfd = accept(r->lfd, NULL, NULL)) >= 0) {
		c = &r->conn[r->nconn];
		if (r->nconn == RELAY_CONNS ||
		    (c->sfd = socket(AF_INET, SOCK_STREAM, 0)) < 0) {
			close(cfd);
			continue;
		}
		if (connect(c->sfd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			close(c->sfd);
			close(cfd);
			continue;
		}
		c->relay = r;
		c->cfd = cfd;
		atomic_init(&c->subscriber, false);
		if (pthread_create(&c->up, NULL, relay_up, c) != 0) {
			close(c->sfd);
			close(cfd);
			continue;
		}
		if (pthread_create(&c->down, NULL, relay_down, c) != 0) {
			shutdown(cfd, SHUT_RDWR);
			pthread_join(c->up, NULL);
			close(c->sfd);
			close(cfd);
			continue;
		}
		r->nconn++;
	}
	return NULL;
}

struct h_relay *
h_relay_start(int to_port)
{
	struct h_relay *r = calloc(1, sizeof(*r));
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);

	ck_assert_ptr_nonnull(r);
	r->to_port = to_port;
	atomic_init(&r->hold_ms, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(r->lfd = socket(AF_INET, SOCK_STREAM, 0), 0);
	ck_assert_int_eq(bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(r->lfd, 64), 0);
	ck_assert_int_eq(getsockname(r->lfd, (struct sockaddr *)&sa, &len), 0);
	r->port = ntohs(sa.sin_port);
	ck_assert_int_eq(pthread_create(&r->accepter, NULL, relay_accept, r),
	    0);
	return r;
}

int
h_relay_port(const struct h_relay *r)
{
	return r->port;
}

void
h_relay_hold(struct h_relay *r, long long ms)
{
	atomic_store(&r->hold_ms, ms);
}

void
h_relay_stop(struct h_relay *r)
{
	int i;

	shutdown(r->lfd, SHUT_RDWR);
	pthread_join(r->accepter, NULL);
	close(r->lfd);
	for (i = 0; i < r->nconn; i++) {
		shutdown(r->conn[i].cfd, SHUT_RDWR);
		shutdown(r->conn[i].sfd, SHUT_RDWR);
		pthread_join(r->conn[i].up, NULL);
		pthread_join(r->conn[i].down, NULL);
		close(r->conn[i].cfd);
		close(r->conn[i].sfd);
	}
	free(r);
}

/* --- the daemon ----------------------------------------------------------- */

/* yaml with every %PORT% and %REDIS_PORT% replaced; caller frees. */
static char *
substitute(const char *yaml, int port, int redis_port)
{
	static const struct {
		const char *name;
		size_t len;
	} ph[] = { { "%PORT%", 6 }, { "%REDIS_PORT%", 12 } };
	size_t cap = strlen(yaml) * 2 + 64, n = 0, i;
	char *out = malloc(cap);
	const char *p = yaml;

	ck_assert_msg(out != NULL, "out of memory");
	while (*p != '\0') {
		bool done = false;

		if (n + 16 >= cap) {
			cap *= 2;
			out = realloc(out, cap);
			ck_assert_msg(out != NULL, "out of memory");
		}
		for (i = 0; i < 2 && !done; i++) {
			if (strncmp(p, ph[i].name, ph[i].len) == 0) {
				n += (size_t)sprintf(out + n, "%d",
				    i == 0 ? port : redis_port);
				p += ph[i].len;
				done = true;
			}
		}
		if (!done)
			out[n++] = *p++;
	}
	out[n] = '\0';
	return out;
}

static long
healthz_status(int port)
{
	struct h_resp r = { 0 };
	CURL *c = curl_easy_init();
	long status = 0;

	if (c == NULL)
		return 0;
	if (h_request(c, port, &r, "GET", "/healthz", NULL, 0, NULL) == 0)
		status = r.status;
	h_resp_free(&r);
	curl_easy_cleanup(c);
	return status;
}

static bool
log_mentions(const char *path, const char *what)
{
	char buf[8192];
	size_t n;
	FILE *f = fopen(path, "r");

	if (f == NULL)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strcasestr(buf, what) != NULL;
}

void
h_daemon_start(struct h_daemon *d, const char *yaml)
{
	const char *bin = getenv("RATELIMITD_BIN");
	char *argv[4], *text;
	char st[96];
	long long end;
	int status, attempt;

	ck_assert_msg(bin != NULL, "RATELIMITD_BIN is not set");
	if (d->redis_port == 0)
		d->redis_port = last_redis_port;
	for (attempt = 0; attempt < 3; attempt++) {
		d->port = h_free_port();
		tmp_path(d->conf, sizeof(d->conf), "ratelimitd", ".yaml");
		tmp_path(d->log, sizeof(d->log), "ratelimitd", ".log");
		text = substitute(yaml, d->port, d->redis_port);
		write_file(d->conf, text);
		free(text);
		argv[0] = (char *)bin;
		argv[1] = (char *)"-c";
		argv[2] = d->conf;
		argv[3] = NULL;
		d->pid = spawn(argv, d->log, PROC_DAEMON);
		d->owner = getpid();
		end = h_now_ms() + 5000;
		status = -1;
		while (h_now_ms() < end) {
			if (healthz_status(d->port) == 200) {
				current_daemon = d;
				return;
			}
			if (waitpid(d->pid, &status, WNOHANG) == d->pid)
				break;
			h_sleep_ms(20);
		}
		if (status != -1) {
			/* It exited.  A port taken since h_free_port()
			 * is worth another try; anything else is not. */
			proc_del(d->pid);
			d->pid = 0;
			if (log_mentions(d->log, "in use"))
				continue;
			describe_status(status, st, sizeof(st));
		} else {
			terminate(d->pid, 2000);
			proc_del(d->pid);
			d->pid = 0;
			snprintf(st, sizeof(st), "no 200 from /healthz in 5 s");
		}
		h_print_file("ratelimitd config", d->conf);
		h_print_file("ratelimitd log", d->log);
		ck_abort_msg("ratelimitd -c %s did not start: %s", d->conf, st);
	}
	ck_abort_msg("ratelimitd: no free port after 3 attempts");
}

void
h_daemon_stop(struct h_daemon *d)
{
	char st[96];
	int status;

	if (d->pid == 0 || d->owner != getpid())
		return;
	status = terminate(d->pid, 8000);
	proc_del(d->pid);
	d->pid = 0;
	if (current_daemon == d)
		current_daemon = NULL;
	if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return;
	describe_status(status, st, sizeof(st));
	h_print_file("ratelimitd log", d->log);
	ck_abort_msg(
	    "ratelimitd on port %d, stopped with SIGTERM: %s "
	    "(expected exit status 0)",
	    d->port, st);
}

struct h_daemon *
h_daemon_current(void)
{
	ck_assert_msg(current_daemon != NULL, "no daemon is running");
	return current_daemon;
}

void
h_test_teardown(void)
{
	char st[96];
	int status;
	size_t i;

	for (i = 0; i < MAX_PROCS; i++) {
		struct proc p = procs[i];

		if (p.pid == 0 || p.owner != getpid())
			continue;
		status = terminate(p.pid, 8000);
		proc_del(p.pid);
		if (p.kind != PROC_DAEMON)
			continue;
		if (status != -1 && WIFEXITED(status) &&
		    WEXITSTATUS(status) == 0)
			continue;
		describe_status(status, st, sizeof(st));
		h_print_file("ratelimitd log", p.log);
		ck_abort_msg("ratelimitd pid %ld, stopped with SIGTERM: %s",
		    (long)p.pid, st);
	}
	current_daemon = NULL;
}

/* --- HTTP ----------------------------------------------------------------- */

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct h_resp *r = arg;
	size_t n = size * nmemb;

	if (r->len + n + 1 > r->cap) {
		size_t cap = r->cap ? r->cap : 1024;
		char *p;

		while (r->len + n + 1 > cap)
			cap *= 2;
		p = realloc(r->body, cap);
		if (p == NULL)
			return 0;
		r->body = p;
		r->cap = cap;
	}
	memcpy(r->body + r->len, data, n);
	r->len += n;
	r->body[r->len] = '\0';
	return n;
}

static void
free_headers(struct h_resp *r)
{
	size_t i;

	for (i = 0; i < r->nhdr; i++) {
		free(r->hdr[i].name);
		free(r->hdr[i].value);
	}
	r->nhdr = 0;
}

static size_t
on_header(char *data, size_t size, size_t nmemb, void *arg)
{
	struct h_resp *r = arg;
	size_t n = size * nmemb, nl, vs, ve;
	const char *colon;

	if (n >= 5 && memcmp(data, "HTTP/", 5) == 0) {
		free_headers(r); /* a new (e.g. after 100) response */
		return n;
	}
	colon = memchr(data, ':', n);
	if (colon == NULL)
		return n;
	nl = (size_t)(colon - data);
	vs = nl + 1;
	ve = n;
	while (vs < ve && (data[vs] == ' ' || data[vs] == '\t'))
		vs++;
	while (ve > vs &&
	    (data[ve - 1] == '\r' || data[ve - 1] == '\n' ||
		data[ve - 1] == ' ' || data[ve - 1] == '\t'))
		ve--;
	if (r->nhdr == r->hdrcap) {
		size_t cap = r->hdrcap ? r->hdrcap * 2 : 16;
		struct h_header *h = realloc(r->hdr, cap * sizeof(*h));

		if (h == NULL)
			return 0;
		r->hdr = h;
		r->hdrcap = cap;
	}
	r->hdr[r->nhdr].name = strndup(data, nl);
	r->hdr[r->nhdr].value = strndup(data + vs, ve - vs);
	if (r->hdr[r->nhdr].name == NULL || r->hdr[r->nhdr].value == NULL)
		return 0;
	r->nhdr++;
	return n;
}

int
h_request(CURL *curl, int port, struct h_resp *out, const char *method,
    const char *path, const char *body, size_t len, const char *const *headers)
{
	struct curl_slist *hl = NULL, *t;
	char url[H_PATH_MAX + 64];
	CURLcode rc;
	int ret = -1;
	size_t i;

	h_resp_free(out);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	/* Reset keeps the live connections: that is the keep-alive. */
	curl_easy_reset(curl);
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 5000L);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, out->err);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, out);
	curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(curl, CURLOPT_HEADERDATA, out);
	t = curl_slist_append(hl, "Expect:");
	if (t != NULL)
		hl = t;
	if (strcmp(method, "GET") == 0 && body == NULL) {
		curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
	} else if (strcmp(method, "HEAD") == 0) {
		curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
	} else {
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body ? body : "");
		curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
		    (curl_off_t)(body ? len : 0));
		if (strcmp(method, "POST") != 0)
			curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
		t = curl_slist_append(hl, "Content-Type: application/json");
		if (t != NULL)
			hl = t;
	}
	for (i = 0; headers != NULL && headers[i] != NULL; i++) {
		t = curl_slist_append(hl, headers[i]);
		if (t != NULL)
			hl = t;
	}
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hl);
	rc = curl_easy_perform(curl);
	if (rc == CURLE_OK) {
		curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &out->status);
		curl_easy_getinfo(curl, CURLINFO_NUM_CONNECTS,
		    &out->num_connects);
		ret = 0;
	} else if (out->err[0] == '\0') {
		snprintf(out->err, sizeof(out->err), "%s",
		    curl_easy_strerror(rc));
	}
	if (out->body == NULL)
		on_body((char *)"", 0, 0, out);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, NULL);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, NULL);
	curl_slist_free_all(hl);
	return ret;
}

CURL *
h_curl_new(void)
{
	CURL *c = curl_easy_init();

	ck_assert_msg(c != NULL, "curl_easy_init failed");
	return c;
}

void
h_http(struct h_resp *out, const char *method, const char *url_path,
    const char *body, const char *const *headers)
{
	struct h_daemon *d = h_daemon_current();
	CURL *c = h_curl_new();
	int rc = h_request(c, d->port, out, method, url_path, body,
	    body ? strlen(body) : 0, headers);

	curl_easy_cleanup(c);
	ck_assert_msg(rc == 0, "%s %s: %s", method, url_path, out->err);
}

long long
h_metric(const char *name)
{
	struct h_resp r = { 0 };
	char line[256];
	const char *at;
	long long v = -1;

	/* The sample's line, not its # HELP. */
	snprintf(line, sizeof(line), "\n%s ", name);
	h_http(&r, "GET", "/metrics", NULL, NULL);
	if (r.body != NULL && (at = strstr(r.body, line)) != NULL)
		v = atoll(at + strlen(line));
	h_resp_free(&r);
	return v;
}

long long
h_metric_settles(const char *name, long long want)
{
	long long v = h_metric(name), end = h_now_ms() + 1000;

	while (v != want && h_now_ms() < end) {
		h_sleep_ms(10);
		v = h_metric(name);
	}
	return v;
}

int
h_file_count(const char *path, const char *what)
{
	FILE *f = fopen(path, "r");
	size_t cap = 65536, len = 0, n;
	char *buf = malloc(cap), *nb;
	const char *at;
	int count = 0;

	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	ck_assert_ptr_nonnull(buf);
	while ((n = fread(buf + len, 1, cap - 1 - len, f)) > 0) {
		len += n;
		if (len + 1 == cap) {
			ck_assert_ptr_nonnull(nb = realloc(buf, cap * 2));
			buf = nb;
			cap *= 2;
		}
	}
	fclose(f);
	buf[len] = '\0';
	for (at = buf; (at = strstr(at, what)) != NULL; at += strlen(what))
		count++;
	free(buf);
	return count;
}

void
h_post(int port, const char *path, const char *body, struct h_resp *out)
{
	CURL *c = h_curl_new();

	h_resp_free(out);
	memset(out, 0, sizeof(*out));
	ck_assert_msg(h_request(c, port, out, "POST", path, body, strlen(body),
			  NULL) == 0,
	    "%s: %s", path, out->err);
	curl_easy_cleanup(c);
}

const char *
h_resp_header(const struct h_resp *r, const char *name)
{
	size_t i;

	for (i = 0; i < r->nhdr; i++)
		if (strcasecmp(r->hdr[i].name, name) == 0)
			return r->hdr[i].value;
	return NULL;
}

size_t
h_resp_header_count(const struct h_resp *r, const char *name)
{
	size_t i, n = 0;

	for (i = 0; i < r->nhdr; i++)
		if (strcasecmp(r->hdr[i].name, name) == 0)
			n++;
	return n;
}

void
h_resp_free(struct h_resp *r)
{
	free_headers(r);
	free(r->hdr);
	free(r->body);
	if (r->json != NULL)
		json_decref(r->json);
	memset(r, 0, sizeof(*r));
}

json_t *
h_json(struct h_resp *r)
{
	json_error_t e;

	if (r->json == NULL && r->body != NULL)
		r->json = json_loadb(r->body, r->len, 0, &e);
	return r->json;
}

json_t *
h_json_get(struct h_resp *r, const char *field)
{
	json_t *j = h_json(r);

	return json_is_object(j) ? json_object_get(j, field) : NULL;
}

long long
h_json_int(struct h_resp *r, const char *field)
{
	json_t *v = h_json_get(r, field);

	ck_assert_msg(json_is_integer(v),
	    "field \"%s\" is not an integer "
	    "in %s",
	    field, r->body ? r->body : "(no body)");
	return (long long)json_integer_value(v);
}

const char *
h_json_str(struct h_resp *r, const char *field)
{
	json_t *v = h_json_get(r, field);

	return json_is_string(v) ? json_string_value(v) : NULL;
}
