/*
 * main.c - ratelimitd: command line, start-up, signals and reload, shutdown.
 *
 *   ratelimitd [-c FILE] [--check] [--version] [--help]
 *
 * Start-up is the only place that may exit on an error, with one clear line
 * (a bad file, a port in use, a required backend that does not answer).
 * Afterwards the main thread only waits for signals: SIGHUP, or a change of
 * the file on disk (watch.c), reloads the rules (a bad file keeps the old
 * ones); SIGTERM/SIGINT stop accepting (HTTP and gRPC), let requests in
 * flight finish within shutdown_timeout (a second one cuts that short),
 * remove the unix socket files they bound, and exit 0.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/decide.h"
#include "core/deny_cache.h"
#include "core/overrides.h"
#include "core/prefetch.h"
#include "core/redis_url.h"
#include "front/admin.h"
#include "front/grpc.h"
#include "front/http.h"
#include "front/listen.h"
#include "core/lease.h"
#include "front/lease_wait.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/notify.h"
#include "base/util.h"
#include "base/watch.h"
#include "store/memory.h"
#include "store/redis.h"

/* Keys denied lately, kept to answer repeat requests without Redis: at
 * most this many, each with a copy of its key (under 1 KiB). */
#define DENY_CACHE_SLOTS 4096
#define PREFETCH_KEYS	 65536 /* keys held in advance at once */
/* After a second stop signal, how long the waiters it cut have for their
 * 503 to be written before the daemon exits (shut_down()). */
#define CUT_ANSWER_MS 200
/* At start, how long the first read of the overrides may hold the
 * listeners back (start_fronts()). */
#define OVERRIDES_START_WAIT_MS 2000

#ifndef RL_VERSION
#define RL_VERSION "unknown"
#endif

struct daemon {
	const char *path;
	struct config *cfg; /* the config the daemon started with */
	struct backend *backend;
	struct backend *local;
	struct deny_cache *deny;
	struct prefetch *prefetch;   /* quota held in advance */
	struct overrides *overrides; /* limits per key (docs/admin.md) */
	struct lease_wait *leases;   /* requests waiting for a lease */
	struct metrics *metrics;
	struct decider decider;
	struct decider grpc_decider; /* the same, counted as gRPC's */
	struct http_server *http;
	struct grpc_server *grpc;   /* NULL without grpc_listen */
	struct admin_server *admin; /* NULL without admin_listen */
	char *admin_token;	    /* admin_token_file's, or NULL */
	struct watch *watch;
	int http_fd, grpc_fd; /* bound, not yet served; else -1 */
	int admin_fd;	      /* the same for admin_listen */
	/* The unix socket files bound (listen, grpc_listen, admin_listen),
	 * removed at exit (docs/configuration.md). */
	struct listen_unix made[3];
	int signal_fd; /* SIGHUP, SIGTERM, SIGINT, SIGUSR1, SIGUSR2 */
	int change_fd; /* eventfd: the file changed */
	/* What the last load read (reload_digest(); 0: unknown, as when
	 * the file changed while it was loaded, or the last reload
	 * failed): a change on disk that leaves all of it as it was
	 * reloads nothing. */
	uint64_t digest;
};

/* The file changed on disk: wake the main loop, which reloads as for
 * SIGHUP (an eventfd, not a signal: no signal semantics to get wrong). */
static void
on_file_change(void *arg)
{
	uint64_t one = 1;

	(void)!write(*(int *)arg, &one, sizeof(one));
}

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: ratelimitd [-c FILE] [--check] [--version] [--help]\n"
	    "  -c, --config FILE  the YAML rules file (default %s)\n"
	    "      --check        validate FILE, print \"ok: N rules\", exit\n"
	    "  -V, --version      print the version and exit\n"
	    "  -h, --help         this text\n"
	    "environment: RATELIMITD_LISTEN, RATELIMITD_REDIS_URL, "
	    "RATELIMITD_LOG_LEVEL\n",
	    RL_DEFAULT_CONFIG_PATH);
}

#define DIGEST_BASIS UINT64_C(0xcbf29ce484222325)

/* FNV-1a of the bytes of the file at path, on from h (DIGEST_BASIS to
 * start); h itself for a NULL path; 0 when it cannot be read (nor then
 * is any reload skipped). */
static uint64_t
file_digest(uint64_t h, const char *path)
{
	unsigned char buf[4096];
	size_t n, i;
	FILE *f;

	if (path == NULL || h == 0)
		return h;
	if ((f = fopen(path, "rb")) == NULL)
		return 0;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		for (i = 0; i < n; i++)
			h = (h ^ buf[i]) * UINT64_C(0x100000001b3);
	if (ferror(f))
		h = 0;
	fclose(f);
	/* A file's end, so that bytes moved between two files count. */
	return h != 0 ? (h ^ 0xff) * UINT64_C(0x100000001b3) : 0;
}

/* What a reload reads: the config file, and the files config c names
 * (redis.tls, the password files, the admin token), so that a rotated
 * certificate beside an unchanged config is a change.  0: one could not
 * be read. */
static uint64_t
reload_digest(const char *path, const struct config *c)
{
	uint64_t h = file_digest(DIGEST_BASIS, path);

	h = file_digest(h, c->redis.tls.ca_file.path);
	h = file_digest(h, c->redis.tls.cert_file.path);
	h = file_digest(h, c->redis.tls.key_file.path);
	h = file_digest(h, c->redis.password_file);
	h = file_digest(h, c->redis.sentinel.password_file);
	return file_digest(h, c->admin_token_file);
}

/* reload_digest() of what a load of path made c, whose file read as
 * `before` (file_digest()) just before: 0 when it reads otherwise now,
 * as it changed during the load, so that the next change reloads. */
static uint64_t
loaded_digest(const char *path, uint64_t before, const struct config *c)
{
	return file_digest(DIGEST_BASIS, path) == before ?
	    reload_digest(path, c) :
	    0;
}

/* Load path and apply the environment.  NULL with err on failure. */
static struct config *
load(const char *path, char *err, size_t errlen)
{
	struct config *c;

	if ((c = config_load(path, err, errlen)) == NULL)
		return NULL;
	if (config_apply_env(c, err, errlen) < 0) {
		config_unref(c);
		return NULL;
	}
	return c;
}

static void
apply_logging(const struct config *c)
{
	log_set_level(c->log_level);
	log_set_json(c->log_format == RL_LOG_JSON);
}

/*
 * The decision path's hooks, wired to the metrics (base/metrics.h knows
 * nothing of rules or stores: these map the core's outcomes onto its
 * labels).  They run on whichever thread completes a decision.
 */
static enum metrics_outcome
metrics_outcome_of(enum decide_rule_result r)
{
	switch (r) {
	case DECIDE_RULE_ALLOWED:
		return METRICS_ALLOWED;
	case DECIDE_RULE_DENIED:
		return METRICS_DENIED;
	case DECIDE_RULE_SHADOW_DENIED:
		return METRICS_SHADOW_DENIED;
	case DECIDE_RULE_DEGRADED:
		return METRICS_DEGRADED;
	case DECIDE_RULE_ERROR:
		break;
	}
	return METRICS_ERROR;
}

static enum metrics_store_error
metrics_store_error_of(enum backend_error_kind kind)
{
	switch (kind) {
	case BACKEND_ERR_NONE:
		return METRICS_STORE_OK;
	case BACKEND_ERR_CONNECT:
		return METRICS_STORE_CONNECT;
	case BACKEND_ERR_TIMEOUT:
		return METRICS_STORE_TIMEOUT;
	case BACKEND_ERR_PROTOCOL:
		return METRICS_STORE_PROTOCOL;
	case BACKEND_ERR_FULL:
		return METRICS_STORE_FULL;
	case BACKEND_ERR_CIRCUIT_OPEN:
		return METRICS_STORE_CIRCUIT_OPEN;
	case BACKEND_ERR_TLS:
		return METRICS_STORE_TLS;
	case BACKEND_ERR_DEADLINE:
		return METRICS_STORE_OK; /* on_backend leaves it out */
	}
	return METRICS_STORE_PROTOCOL;
}

static void
on_rule_http(const struct rule *r, enum decide_rule_result result, void *arg)
{
	metrics_decision(arg, METRICS_HTTP, r != NULL ? r->name : NULL,
	    metrics_outcome_of(result));
}

static void
on_rule_grpc(const struct rule *r, enum decide_rule_result result, void *arg)
{
	metrics_decision(arg, METRICS_GRPC, r != NULL ? r->name : NULL,
	    metrics_outcome_of(result));
}

static void
on_backend(const char *backend, int64_t usec, int64_t queued_usec,
    enum backend_error_kind kind, void *arg)
{
	/* A gRPC call whose own deadline passed first was given up, not
	 * answered: neither a store error nor a store time
	 * (docs/operations.md). */
	if (kind == BACKEND_ERR_DEADLINE)
		return;
	metrics_backend_call(arg, backend, usec, metrics_store_error_of(kind));
	if (queued_usec >= 0) {
		metrics_phase(arg, METRICS_PHASE_QUEUE, queued_usec);
		metrics_phase(arg, METRICS_PHASE_STORE, usec - queued_usec);
	}
}

/* docs/algorithms.md, "Taking quota in advance": units taken, used, lost. */
static void
on_prefetch(const struct rule *r, bool used, int64_t units, void *arg)
{
	metrics_prefetch(arg, r->name,
	    used ? METRICS_PREFETCH_USED : METRICS_PREFETCH_TAKEN,
	    (uint64_t)units);
}

static void
on_prefetch_lost(const char *rule, int64_t units, void *arg)
{
	metrics_prefetch(arg, rule, METRICS_PREFETCH_LOST, (uint64_t)units);
}

static uint64_t
deny_hits(const void *arg)
{
	return deny_cache_hits(arg);
}

/* The start keys a reload changed, each followed by '\0', noted before
 * config_keep_start_only() makes them equal and logged only once the
 * reload is accepted: a reload refused afterwards changes nothing. */
struct start_keys {
	char buf[1024];
	size_t len;
};

static void
note_start_only(const char *key, void *arg)
{
	struct start_keys *k = arg;
	size_t n = strlen(key) + 1;

	if (n <= sizeof(k->buf) - k->len) {
		memcpy(k->buf + k->len, key, n);
		k->len += n;
	}
}

static void
warn_start_only(const struct start_keys *k)
{
	size_t at;

	for (at = 0; at < k->len; at += strlen(k->buf + at) + 1)
		log_warnx("reload: %s changed; it applies after a restart",
		    k->buf + at);
}

/* "FILE:LINE:COL: msg" when bad names where the file was named, else
 * "FILE: msg", into buf. */
static void
place_tls_error(const char *path, const struct tls_file *bad, const char *msg,
    char *buf, size_t buflen)
{
	if (bad != NULL)
		snprintf(buf, buflen, "%s:%d:%d: %s", path, bad->line, bad->col,
		    msg);
	else
		snprintf(buf, buflen, "%s: %s", path, msg);
}

/* Room for max_connections sockets on each front end (HTTP, and gRPC
 * when grpc_listen is set: each allows max_connections) and the daemon's
 * own: raise the soft limit on open files as far as the hard limit
 * allows, and warn when it cannot hold them (docs/security.md).  At start
 * and at a reload that raises max_connections; never lowers the limit. */
static void
raise_fd_limit(const struct config *c)
{
	struct rlimit rl;
	rlim_t fronts = c->grpc_listen != NULL ? 2 : 1;
	rlim_t want = fronts * (rlim_t)c->max_connections + 256;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ?
	    want :
	    rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < want)
		log_warnx(
		    "open files limited to %llu, where max_connections "
		    "(%lld)%s needs %llu: raise the hard limit "
		    "(LimitNOFILE, ulimit -Hn) or lower max_connections",
		    (unsigned long long)rl.rlim_cur,
		    (long long)c->max_connections,
		    fronts == 2 ? " on each of HTTP and gRPC" : "",
		    (unsigned long long)want);
}

/* Reload: the Redis store reads its TLS files again (a rotated client
 * certificate, a new CA) for its new connections; not when the reload
 * turns TLS on or off (kept: that applies at the next start, and
 * config_keep_start_only() gave c the running redis.tls).  c has the
 * running backend (a start key).  0, or -1 with err. */
static int
reload_tls(struct daemon *d, const struct config *c, bool kept, char *err,
    size_t errlen)
{
	const struct tls_file *bad;
	char msg[384];

	if (c->backend != RL_BACKEND_REDIS || kept)
		return 0;
	if (backend_redis_reload_tls(d->backend, &c->redis, &bad, msg,
		sizeof(msg)) == -1) {
		place_tls_error(c->path, bad, msg, err, errlen);
		return -1;
	}
	return 0;
}

/* Reload the file: on SIGHUP, always; for a change the watch saw
 * (watched), only when the file or one the running config names reads
 * otherwise than at the last load, so that a touch, a rewrite of the
 * same text, or the watch's own event after a SIGHUP that already loaded
 * it changes nothing. */
static void
reload(struct daemon *d, bool watched)
{
	struct config *c, *cur;
	struct start_keys changed = { .len = 0 };
	uint64_t before;
	char err[512];
	bool tls_kept;
	size_t unread;

	if (watched && d->digest != 0) {
		uint64_t now;

		cur = http_server_get_config(d->http);
		now = reload_digest(d->path, cur);
		config_unref(cur);
		if (now == d->digest) {
			log_debug(
			    "%s changed on disk but reads as loaded: "
			    "no reload",
			    d->path);
			return;
		}
	}
	before = file_digest(DIGEST_BASIS, d->path);
	notify_send("RELOADING=1");
	if ((c = load(d->path, err, sizeof(err))) == NULL)
		goto fail;
	cur = http_server_get_config(d->http);
	config_start_only_changes(cur, c, note_start_only, &changed);
	tls_kept = config_redis_tls_switches(&cur->redis, &c->redis);
	/* What applies only at the next start keeps its running value, so
	 * that no per-request reader sees the new one early.  The TLS
	 * context is swapped last, once nothing else can refuse the
	 * reload: a reload that fails leaves new connections on the
	 * running files. */
	if (config_keep_start_only(c, cur, err, sizeof(err)) == -1 ||
	    reload_tls(d, c, tls_kept, err, sizeof(err)) == -1) {
		config_unref(cur);
		config_unref(c);
		goto fail;
	}
	/* max_connections is reloadable: a raised one needs its room in
	 * the open-files limit before the first connection past the old
	 * one comes. */
	if (c->max_connections > cur->max_connections)
		raise_fd_limit(c);
	warn_start_only(&changed);
	apply_logging(c);
	/* The overrides of a rule added (or back) are read before any
	 * request is decided under it, as at start. */
	if ((unread = overrides_sync_set_config(d->overrides, c, cur,
		 OVERRIDES_START_WAIT_MS)) > 0)
		log_warnx(
		    "reload: the overrides of %zu added rule%s not read "
		    "(failed, or past %d s); applying meanwhile, their "
		    "keys under the rules' own limits until the sync "
		    "reads them",
		    unread, unread == 1 ? "" : "s",
		    OVERRIDES_START_WAIT_MS / 1000);
	config_unref(cur);
	http_server_set_config(d->http, c);
	if (d->grpc != NULL)
		grpc_server_set_config(d->grpc, c);
	admin_server_set_config(d->admin, c);
	/* Limits may have changed: forget what the old rules denied (a
	 * denial of theirs learnt later is of the old serial, never
	 * answered: core/deny_cache.h), and drop the quota held in advance
	 * under them. */
	if (d->deny != NULL)
		deny_cache_clear(d->deny);
	prefetch_clear(d->prefetch, c->serial);
	/* A limit raised, or a rule removed, may admit a request that
	 * waits for a lease: each waits on until a release or an expiry
	 * unless told to try again under the new rules (docs/leases.md). */
	lease_wait_all(d->leases);
	log_info("reloaded %s: %zu rules", d->path, c->nrules);
	d->digest = loaded_digest(d->path, before, c);
	config_unref(c);
	metrics_reload(d->metrics, true);
	notify_send("READY=1\nSTATUS=serving");
	return;
fail:
	d->digest = 0; /* the next change reloads */
	log_error("reload failed, keeping the old rules: %s", err);
	metrics_reload(d->metrics, false);
	notify_send("READY=1\nSTATUS=reload failed");
}

/* During the drain: wait up to ms for a signal.  True for a second
 * SIGTERM or SIGINT, with its number in *sig; SIGHUP is dropped (no
 * reload while stopping), and so are SIGUSR1 and SIGUSR2. */
static bool
drain_signal(struct daemon *d, int ms, int *sig)
{
	struct pollfd pfd = { .fd = d->signal_fd, .events = POLLIN };
	struct signalfd_siginfo si;

	if (poll(&pfd, 1, ms) <= 0 || !(pfd.revents & POLLIN) ||
	    read(d->signal_fd, &si, sizeof(si)) != (ssize_t)sizeof(si))
		return false;
	*sig = (int)si.ssi_signo;
	return *sig == SIGTERM || *sig == SIGINT;
}

/*
 * Stop accepting, wait for requests in flight (bounded), stop.
 *
 * A second SIGTERM or SIGINT during the wait ends it as if
 * shutdown_timeout ran out then (docs/operations.md): the waiters still
 * waiting for their turn now fall after the end and are answered 503 at
 * once, which takes the loops a moment (CUT_ANSWER_MS at most, never past
 * the first deadline); whatever is still in flight after that is left as
 * on expiry.  Later signals change nothing.  The signals come from the
 * signalfd (take_signals()), so nothing here runs in a handler.
 */
static void
shut_down(struct daemon *d)
{
	struct config *c = http_server_get_config(d->http);
	int64_t deadline = util_monotonic_us() + c->shutdown_timeout_ms * 1000;
	bool cut = false;
	int left, sig;

	config_unref(c);
	notify_send("STOPPING=1");
	admin_server_stop(d->admin);
	d->admin = NULL;
	http_server_quiesce(d->http);
	grpc_server_quiesce(d->grpc);
	/* Until every request is answered, and every gRPC client has had
	 * its GOAWAY and its connection closed the graceful way (an
	 * Envoy whose calls are cut may let them through). */
	while (((left = http_server_inflight(d->http) +
			grpc_server_inflight(d->grpc)) > 0 ||
		   !grpc_server_drained(d->grpc)) &&
	    util_monotonic_us() < deadline) {
		if (!drain_signal(d, 10, &sig) || cut)
			continue;
		cut = true;
		log_warnx(
		    "second signal (%s): drain cut short, %d requests "
		    "still in flight",
		    strsignal(sig), left);
		http_server_cut(d->http);
		if (deadline > util_monotonic_us() + CUT_ANSWER_MS * 1000)
			deadline = util_monotonic_us() + CUT_ANSWER_MS * 1000;
	}
	if (left > 0) {
		/* Their workers may be blocked in a backend call, which
		 * nothing interrupts, and MHD_stop_daemon() would wait for
		 * them: leave without them. */
		if (!cut)
			log_warnx(
			    "shutdown: %d requests still in flight "
			    "after shutdown_timeout; exiting without "
			    "them",
			    left);
		log_info("stopped");
		_exit(0);
	}
	grpc_server_stop(d->grpc);
	d->grpc = NULL;
	http_server_stop(d->http);
	d->http = NULL;
}

/* Started as root: after binding, become `user` (and its groups), or warn
 * that the daemon serves as root.  0 or -1 with err. */
static int
drop_privileges(const struct config *c, char *err, size_t errlen)
{
	struct passwd *pw;

	if (geteuid() != 0) {
		if (c->user != NULL)
			log_info("user: %s ignored, not started as root",
			    c->user);
		return 0;
	}
	if (c->user == NULL) {
		log_warnx(
		    "running as root; set `user` to drop privileges "
		    "after binding");
		return 0;
	}
	errno = 0;
	if ((pw = getpwnam(c->user)) == NULL) {
		snprintf(err, errlen, "user: no user \"%s\"%s%s", c->user,
		    errno != 0 ? ": " : "", errno != 0 ? strerror(errno) : "");
		return -1;
	}
	if (initgroups(pw->pw_name, pw->pw_gid) != 0 ||
	    setgid(pw->pw_gid) != 0 || setuid(pw->pw_uid) != 0) {
		snprintf(err, errlen, "user: cannot become \"%s\": %s", c->user,
		    strerror(errno));
		return -1;
	}
	if (setuid(0) == 0) {
		snprintf(err, errlen,
		    "user: still root after dropping to "
		    "\"%s\"",
		    c->user);
		return -1;
	}
	log_info("running as %s (uid %u, gid %u)", pw->pw_name,
	    (unsigned)pw->pw_uid, (unsigned)pw->pw_gid);
	return 0;
}

/* Redis heard a lease released, or a key reset (by any daemon): its
 * waiters try again, and what is held in advance for it goes.
 * The same channel carries the notices of lua/override.lua, the name of
 * an override hash, which never ends in '}' as a lease's key does: that
 * rule's overrides are read again (docs/admin.md); and those of
 * lua/takeback.lua, a key followed by a NUL byte: units of it were taken
 * back on Redis Cluster, so a denial of it learnt meanwhile goes
 * (docs/algorithms.md, "Taking a request back").  NULL: any of them may
 * have gone unheard: everything held in advance goes, and every denial
 * remembered. */
static void
on_released(void *arg, const char *key, size_t keylen)
{
	struct daemon *d = arg;

	if (key == NULL) {
		lease_wait_all(d->leases);
		overrides_notice(d->overrides, NULL, 0);
		prefetch_forget_all(d->prefetch);
		deny_cache_clear(d->deny);
	} else if (keylen > 1 && key[keylen - 1] == '\0')
		deny_cache_forget(d->deny, key, keylen - 1);
	else if (keylen > 0 && key[keylen - 1] != '}')
		overrides_notice(d->overrides, key, keylen);
	else {
		lease_wait_released(d->leases, lease_key_hash(key, keylen));
		/* Also an admin reset's (lua/reset.lua): the quota held in
		 * advance for that key came from the counter dropped. */
		prefetch_forget(d->prefetch, key, keylen);
	}
}

/* Redis Cluster took back the units a denied request had recorded on key
 * in another slot (docs/algorithms.md): a denial of key the store decided
 * while they were held no longer holds.  The store's I/O thread. */
static void
on_taken_back(void *arg, const char *key, size_t keylen)
{
	struct daemon *d = arg;

	deny_cache_forget(d->deny, key, keylen);
}

/* The overrides sync read what another daemon set or deleted (or what a
 * reload brought back): a limit may have risen, so every request that
 * waits for a lease tries again (docs/admin.md).  The sync thread. */
static void
on_overrides_read(void *arg)
{
	struct daemon *d = arg;

	lease_wait_all(d->leases);
}

/* Make the backends the config asks for.  0 or -1 with err. */
static int
make_backends(struct daemon *d, char *err, size_t errlen)
{
	const struct config *c = d->cfg;

	if (c->backend == RL_BACKEND_REDIS) {
		d->backend = backend_redis_new(&c->redis, err, errlen);
		if (d->backend == NULL)
			return -1;
		backend_redis_set_metrics(d->backend, d->metrics);
		/* Always there, so that a reload to on_backend_error:
		 * local works; it holds nothing until it is used. */
		d->local = backend_memory_new(c->memory.max_keys, NULL, NULL);
		d->deny = deny_cache_new(DENY_CACHE_SLOTS);
		backend_redis_watch_takebacks(d->backend, on_taken_back, d);
	} else
		d->backend = backend_memory_new(c->memory.max_keys, NULL, NULL);
	if (d->backend == NULL ||
	    (c->backend == RL_BACKEND_REDIS &&
		(d->local == NULL || d->deny == NULL))) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (c->backend_required && !backend_is_ready(d->backend)) {
		snprintf(err, errlen,
		    "backend %s does not answer and "
		    "backend_required is true",
		    config_backend_name(c->backend));
		return -1;
	}
	return 0;
}

/* --check: a file the key at `at` names (NULL: not set) must be read
 * as start-up reads it (redis_read_password_file(): a readable regular
 * file whose first line is neither empty nor too long), and what it
 * holds is wiped at once: 0, or -1 after FILE:LINE:COL. */
static int
check_readable(const char *path, const char *key, const char *file,
    struct config_place at)
{
	static const char lead[] = "password_file ";
	char *secret, sub[512];
	size_t plen;

	if (file == NULL)
		return 0;
	if (redis_read_password_file(file, &secret, sub, sizeof(sub)) == 0) {
		explicit_bzero(secret, strlen(secret));
		rl_free(secret);
		return 0;
	}
	/* "password_file FILE: why" names the file, never its text. */
	plen = strlen(lead) + strlen(file);
	if (strncmp(sub, lead, strlen(lead)) == 0 &&
	    strncmp(sub + strlen(lead), file, strlen(file)) == 0 &&
	    sub[plen] == ':')
		fprintf(stderr, "%s:%d:%d: %s: cannot read %s%s\n", path,
		    at.line, at.col, key, file, sub + plen);
	else
		fprintf(stderr, "%s:%d:%d: %s: %s\n", path, at.line, at.col,
		    key, sub);
	return -1;
}

/* --check: what only start-up reads is refused here too, and a
 * concurrency rule that /auth could match is named.  The exit status. */
static int
check_config(const struct config *c, const char *path)
{
	const struct tls_file *bad;
	char msg[384], line[512];
	size_t i;

	if (c->backend == RL_BACKEND_REDIS &&
	    (check_readable(path, "redis.password_file", c->redis.password_file,
		 c->redis.password_file_at) < 0 ||
		check_readable(path, "redis.sentinel.password_file",
		    c->redis.sentinel.password_file,
		    c->redis.sentinel.password_file_at) < 0))
		return 1;
	if (check_readable(path, "admin_token_file", c->admin_token_file,
		c->admin_token_file_at) < 0)
		return 1;
	/* The TLS files are read as the store will read them (the config
	 * only names them: reading them takes the store's TLS library). */
	if (c->backend == RL_BACKEND_REDIS &&
	    backend_redis_check_tls(&c->redis, &bad, msg, sizeof(msg)) == -1) {
		place_tls_error(path, bad, msg, line, sizeof(line));
		fprintf(stderr, "%s\n", line);
		return 1;
	}
	if (c->user != NULL && getpwnam(c->user) == NULL) {
		fprintf(stderr, "%s:%d:%d: user: no user \"%s\"\n", path,
		    c->user_at.line, c->user_at.col, c->user);
		return 1;
	}
	/* /auth skips concurrency rules (a proxy cannot release a lease). */
	for (i = 0; i < c->nrules; i++)
		if (c->rules[i].algorithm == RL_ALG_CONCURRENCY &&
		    rule_could_match_auth(&c->rules[i]))
			fprintf(stderr,
			    "%s: warning: rule \"%s\" (concurrency) "
			    "could match /auth, which skips concurrency rules: "
			    "a proxy cannot release a lease\n",
			    path, c->rules[i].name);
	printf("ok: %zu rules\n", c->nrules);
	return 0;
}

/*
 * The command line into d->path and *check_only.  Returns -1 to go on,
 * else the exit status (--version, --help, a usage error).
 */
static int
parse_args(int argc, char **argv, struct daemon *d, bool *check_only)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check", no_argument, NULL, 'C' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	while ((ch = getopt_long(argc, argv, "c:Vh", opts, NULL)) != -1) {
		switch (ch) {
		case 'c':
			d->path = optarg;
			break;
		case 'C':
			*check_only = true;
			break;
		case 'V':
			printf("ratelimitd %s\n", RL_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	if (optind != argc) {
		usage(stderr);
		return 1;
	}
	return -1;
}

/* Signals are read from a signalfd, never taken by handlers; every thread
 * started from here on inherits the mask.  (A plain read, unlike
 * sigwait(), which ThreadSanitizer's interception delays by seconds.)
 * SIGUSR1 and SIGUSR2 are taken only to be logged and ignored: log
 * rotation sends them by habit, and their default action would end the
 * daemon with no drain (docs/operations.md, "Signals"). */
static int
take_signals(struct daemon *d, char *err, size_t errlen)
{
	sigset_t sigs;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGUSR1);
	sigaddset(&sigs, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	if ((d->signal_fd = signalfd(-1, &sigs, SFD_CLOEXEC)) < 0) {
		snprintf(err, errlen, "signalfd: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* The long-lived parts a decision needs: metrics, the lease waiters, the
 * stores and the deny cache, wired into the two deciders. */
static int
make_decider(struct daemon *d, char *err, size_t errlen)
{
	if ((d->metrics = metrics_new()) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if ((d->leases = lease_wait_new(err, errlen)) == NULL)
		return -1;
	if ((d->overrides = overrides_new()) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	/* Before the store, whose thread may hear a reset at once. */
	d->prefetch = prefetch_new(PREFETCH_KEYS, d->cfg->serial,
	    on_prefetch_lost, d->metrics);
	if (d->prefetch == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (make_backends(d, err, errlen) < 0)
		return -1;
	/* On Redis every daemon mirrors the overrides the others set. */
	overrides_on_read(d->overrides, on_overrides_read, d);
	if (d->cfg->backend == RL_BACKEND_REDIS &&
	    overrides_sync_start(d->overrides, d->backend, d->cfg, err,
		errlen) < 0)
		return -1;
	/* Last: the store's thread hears the channel once this is set (its
	 * lock orders everything made above before on_released() runs
	 * there), and nothing is lost meanwhile: no waiter, no holding, no
	 * denial yet, and the sync's first round reads every override. */
	if (d->cfg->backend == RL_BACKEND_REDIS)
		backend_redis_watch_releases(d->backend, on_released, d);
	if (d->deny != NULL)
		metrics_set_deny_hits(d->metrics, deny_hits, d->deny);
	d->decider = (struct decider){
		.backend = d->backend,
		.local = d->local,
		.deny = d->deny,
		.overrides = d->overrides,
		.on_rule = on_rule_http,
		.on_backend = on_backend,
		.hook_arg = d->metrics,
		.prefetch = d->prefetch,
		.on_prefetch = on_prefetch,
	};
	d->grpc_decider = d->decider;
	d->grpc_decider.on_rule = on_rule_grpc;
	return 0;
}

/* Bind the listening sockets (as root, for a low port), then drop
 * privileges and watch the file: a change made once the daemon answers
 * must not fall before the watch (it is reloaded by the main loop). */
static int
bind_and_watch(struct daemon *d, char *err, size_t errlen)
{
	struct listen_file file = { d->cfg->listen_mode, (uid_t)-1, (gid_t)-1 },
			   admin_file;
	struct passwd *pw;
	char sub[256];

	/* The unix sockets are `user`'s, shared through its group and
	 * removed at exit where its directory lets it (docs/security.md); an
	 * unknown user fails in drop_privileges(). */
	if (geteuid() == 0 && d->cfg->user != NULL &&
	    (pw = getpwnam(d->cfg->user)) != NULL) {
		file.uid = pw->pw_uid;
		file.gid = pw->pw_gid;
	}
	raise_fd_limit(d->cfg);
	if ((d->http_fd = listen_socket_open(d->cfg->listen, &file, &d->made[0],
		 err, errlen)) < 0)
		return -1;
	if (d->cfg->grpc_listen != NULL &&
	    (d->grpc_fd = listen_socket_open(d->cfg->grpc_listen, &file,
		 &d->made[1], sub, sizeof(sub))) < 0) {
		snprintf(err, errlen, "grpc_listen: %s", sub);
		return -1;
	}
	/* docs/admin.md: bound and its token read before privileges go.
	 * Its socket is the user's, not its group's: the group shared with
	 * a proxy must not reach the admin API. */
	admin_file = file;
	admin_file.gid = (gid_t)-1;
	if (d->cfg->admin_listen != NULL &&
	    (d->admin_fd = listen_socket_open(d->cfg->admin_listen, &admin_file,
		 &d->made[2], sub, sizeof(sub))) < 0) {
		snprintf(err, errlen, "admin_listen: %s", sub);
		return -1;
	}
	if (d->cfg->admin_token_file != NULL &&
	    redis_read_password_file(d->cfg->admin_token_file, &d->admin_token,
		sub, sizeof(sub)) < 0) {
		/* "password_file X: ..." names the file, never its text;
		 * here the key is admin_token_file. */
		if (strncmp(sub, "password_file ", 14) == 0)
			snprintf(err, errlen, "admin_token_file %s", sub + 14);
		else
			snprintf(err, errlen, "admin_token_file: %s", sub);
		return -1;
	}
	if (drop_privileges(d->cfg, err, errlen) < 0)
		return -1;
	if ((d->change_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		return -1;
	}
	d->watch = watch_start(d->path, 200, on_file_change, &d->change_fd, sub,
	    sizeof(sub));
	if (d->watch == NULL)
		log_warnx("reload on file change is off: %s", sub);
	return 0;
}

/* Start the front ends on the bound sockets (each takes its socket).
 * First the overrides' read at start, at most OVERRIDES_START_WAIT_MS:
 * they survive restarts, so the first requests are decided under them
 * (docs/admin.md); connections wait in the listen queue meanwhile. */
static int
start_fronts(struct daemon *d, char *err, size_t errlen)
{
	if (!overrides_sync_wait_read(d->overrides, OVERRIDES_START_WAIT_MS))
		log_warnx(
		    "overrides: the first read of the rules' hashes "
		    "took more than %d s; serving meanwhile, keys not "
		    "read yet under their rules' own limits",
		    OVERRIDES_START_WAIT_MS / 1000);
	if (d->grpc_fd >= 0) {
		d->grpc = grpc_server_start(d->grpc_fd, d->cfg,
		    &d->grpc_decider, d->metrics, err, errlen);
		d->grpc_fd = -1;
		if (d->grpc == NULL)
			return -1;
		log_info("gRPC rate limit service on %s", d->cfg->grpc_listen);
	}
	d->http = http_server_start(d->http_fd, d->cfg, &d->decider, d->leases,
	    d->metrics, err, errlen);
	d->http_fd = -1;
	if (d->http == NULL)
		return -1;
	if (d->admin_fd >= 0) {
		d->admin = admin_server_start(d->admin_fd, d->cfg, &d->decider,
		    d->overrides, d->leases, d->metrics, d->admin_token, err,
		    errlen);
		d->admin_fd = -1;
		if (d->admin == NULL)
			return -1;
		log_info("admin API on %s%s", d->cfg->admin_listen,
		    d->admin_token != NULL ? " (bearer token)" : "");
	}
	log_info(
	    "ratelimitd %s listening on %s: %zu rules, backend %s, "
	    "%d threads",
	    RL_VERSION, d->cfg->listen, d->cfg->nrules,
	    config_backend_name(d->cfg->backend), d->cfg->threads);
	return 0;
}

/* The main thread's loop: reload on SIGHUP or a changed file, return on
 * SIGTERM or SIGINT. */
static void
serve(struct daemon *d)
{
	struct signalfd_siginfo si;
	struct pollfd pfd[2];
	uint64_t count;
	int sig;

	pfd[0] = (struct pollfd){ .fd = d->signal_fd, .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = d->change_fd, .events = POLLIN };
	for (;;) {
		if (poll(pfd, 2, -1) < 0)
			continue;
		if (pfd[1].revents & POLLIN) {
			(void)!read(d->change_fd, &count, sizeof(count));
			reload(d, true);
		}
		if (!(pfd[0].revents & POLLIN) ||
		    read(d->signal_fd, &si, sizeof(si)) != (ssize_t)sizeof(si))
			continue;
		sig = (int)si.ssi_signo;
		if (sig == SIGHUP)
			reload(d, false);
		else if (sig == SIGTERM || sig == SIGINT) {
			log_info("%s: shutting down", strsignal(sig));
			return;
		} else
			log_info(
			    "%s ignored: the daemon logs to standard "
			    "error and has no file to reopen",
			    sig == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
	}
}

/* Free whatever was made, in reverse order (safe on a partial start). */
static void
daemon_free(struct daemon *d)
{
	size_t i;

	watch_stop(d->watch);
	d->watch = NULL;
	if (d->signal_fd >= 0)
		close(d->signal_fd);
	if (d->change_fd >= 0)
		close(d->change_fd);
	if (d->http_fd >= 0)
		close(d->http_fd);
	if (d->grpc_fd >= 0)
		close(d->grpc_fd);
	if (d->admin_fd >= 0)
		close(d->admin_fd);
	admin_server_stop(d->admin);
	if (d->admin_token != NULL)
		explicit_bzero(d->admin_token, strlen(d->admin_token));
	rl_free(d->admin_token);
	grpc_server_stop(d->grpc);
	http_server_stop(d->http);
	/* Nothing accepts on them now: a client finds no file (ENOENT),
	 * and a start under another user can bind the path again. */
	for (i = 0; i < sizeof(d->made) / sizeof(d->made[0]); i++)
		listen_unix_remove(&d->made[i]);
	/* The sync asks the store, and the store's thread hands notices to
	 * the overrides (on_released()) until backend_free() has joined it:
	 * the sync stops first, the overrides go last. */
	overrides_sync_stop(d->overrides);
	backend_free(d->local);
	backend_free(d->backend);
	overrides_free(d->overrides);
	lease_wait_free(d->leases);
	deny_cache_free(d->deny);
	prefetch_free(d->prefetch);
	metrics_free(d->metrics);
	config_unref(d->cfg);
}

int
main(int argc, char **argv)
{
	struct daemon d = { .path = RL_DEFAULT_CONFIG_PATH,
		.http_fd = -1,
		.grpc_fd = -1,
		.admin_fd = -1,
		.signal_fd = -1,
		.change_fd = -1 };
	bool check_only = false;
	char err[512];
	int rc;

	if ((rc = parse_args(argc, argv, &d, &check_only)) >= 0)
		return rc;
	d.digest = file_digest(DIGEST_BASIS, d.path);
	if ((d.cfg = load(d.path, err, sizeof(err))) == NULL) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	d.digest = loaded_digest(d.path, d.digest, d.cfg);
	if (check_only) {
		rc = check_config(d.cfg, d.path);
		config_unref(d.cfg);
		return rc;
	}
	apply_logging(d.cfg);
	if (take_signals(&d, err, sizeof(err)) < 0 ||
	    make_decider(&d, err, sizeof(err)) < 0 ||
	    bind_and_watch(&d, err, sizeof(err)) < 0 ||
	    start_fronts(&d, err, sizeof(err)) < 0) {
		fprintf(stderr, "ratelimitd: %s\n", err);
		daemon_free(&d);
		return 1;
	}
	notify_send("READY=1\nSTATUS=serving");
	serve(&d);
	watch_stop(d.watch);
	d.watch = NULL;
	shut_down(&d);
	log_info("stopped");
	daemon_free(&d);
	return 0;
}
