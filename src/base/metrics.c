/*
 * metrics.c - the counters behind GET /metrics and their rendering in the
 * Prometheus text exposition format 0.0.4 (see metrics.h).
 *
 * Recording happens on the request path of every worker thread, so it must
 * be cheap and never block for long: every counter is a relaxed C11 atomic,
 * and the only lock is a reader-writer lock around the per-rule table, taken
 * for reading on every decision and for writing only the first time a rule
 * name is seen.  Rendering is rare (one scrape every few seconds) and builds
 * a fresh buffer without stopping recorders; a scrape is not a consistent
 * snapshot across series, only each series is monotonic.
 *
 * DESIGN
 * Rules are keyed by name, not by struct rule pointer: a reload builds new
 * rules with the same names, and their counters must carry on.  The table
 * is open addressing over entries that are allocated once and never moved
 * or freed before metrics_free(), so a recorder may bump an entry's counter
 * after dropping the read lock.  Names of rules removed by a reload stay
 * (Prometheus handles series that stop moving).  The table is capped at
 * METRICS_MAX_RULES names; later names all count into rule="_other", so a
 * stream of reloads with ever-new names cannot grow memory without bound.
 *
 * Label values are escaped per the format (backslash, double quote,
 * newline) and bytes that are not valid UTF-8 become U+FFFD, because one bad
 * byte makes Prometheus reject the whole scrape.  Config validation keeps
 * rule names to [A-Za-z0-9_.-], but this file does not rely on it.
 *
 * Histogram buckets are stored per bucket (not cumulative) in microseconds,
 * with one slot above the largest bound; rendering sums them up, and _count
 * and the +Inf bucket are both that same sum, so they always agree.
 */
#include "base/metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

#ifndef RL_VERSION
#define RL_VERSION "unknown"
#endif

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2,
    "metrics counters must be lock-free atomics");

#define METRICS_MAX_RULES  10000 /* distinct names before "_other" */
#define METRICS_OTHER_RULE "_other"
#define METRICS_MIN_SLOTS  64

#define METRICS_NRESULTS       METRICS_NOUTCOMES
#define METRICS_GRPC_CODES     17 /* gRPC status codes 0..16 */
#define METRICS_NKINDS	       METRICS_STORE_NERRORS
#define METRICS_NBOUNDS	       13
#define METRICS_NBUCKETS       (METRICS_NBOUNDS + 1) /* + above the last */
#define METRICS_PHASE_NBOUNDS  11 /* finer: phases last microseconds */
#define METRICS_PHASE_NBUCKETS (METRICS_PHASE_NBOUNDS + 1)
#define METRICS_HTTP_MIN       100
#define METRICS_HTTP_MAX       599

/* One rule name's decisions; never moves once created. */
struct metrics_rule {
	atomic_ullong n[METRICS_NPROTOCOLS][METRICS_NRESULTS];
	atomic_ullong records; /* a stat's recorded values */
	atomic_ullong prefetch[METRICS_PREFETCH_NEVENTS];
	atomic_bool has_prefetch; /* counted by metrics_prefetch */
	/* What the name has been seen as, each for its own family: a name
	 * may be a stat in one config and a rule in the next (a reload),
	 * and then has series in both. */
	atomic_bool is_rule; /* counted by metrics_decision/_prefetch */
	atomic_bool is_stat; /* counted by metrics_stat_record */
	uint32_t hash;
	char name[];
};

struct metrics_backend {
	atomic_ullong bucket[METRICS_NBUCKETS]; /* per bucket, microseconds */
	atomic_ullong sum_us;
	atomic_ullong errors[METRICS_NKINDS]; /* [METRICS_STORE_OK] unused */
};

struct metrics {
	/* The rule table.  lock guards these fields, not the counters. */
	pthread_rwlock_t lock;
	struct metrics_rule **slots; /* open addressing; NULL = empty */
	size_t nslots;		     /* 0 or a power of two */
	struct metrics_rule **order; /* insertion order, for rendering */
	size_t nrules, order_cap;
	struct metrics_rule *other; /* set once the table is full */

	struct metrics_backend backend[2]; /* by metrics_backend_names */
	atomic_llong pool_in_use;
	atomic_ullong redis_events[METRICS_REDIS_NEVENTS];
	struct metrics_phase_hist {
		atomic_ullong bucket[METRICS_PHASE_NBUCKETS];
		atomic_ullong sum_us;
	} phases[METRICS_NPHASES];
	metrics_count_fn deny_hits; /* may be NULL */
	const void *deny_arg;	    /* borrowed */
	atomic_ullong reloads[2];   /* [0] failure, [1] success */
	atomic_int last_reload_ok;
	atomic_ullong http[METRICS_HTTP_MAX - METRICS_HTTP_MIN + 1];
	atomic_llong waiting[2]; /* by enum metrics_wait */
	atomic_ullong wait_full;
	atomic_ullong reports[METRICS_NREPORTS];
	atomic_ullong admin_writes[METRICS_ADMIN_NOPS];
	atomic_bool grpc_on; /* render the gRPC series */
	atomic_ullong grpc[METRICS_GRPC_CODES];
	int64_t start_us; /* realtime, at metrics_new() */
};

static const char *const metrics_result_names[METRICS_NRESULTS] = {
	[METRICS_ALLOWED] = "allowed",
	[METRICS_DENIED] = "denied",
	[METRICS_SHADOW_DENIED] = "shadow_denied",
	[METRICS_DEGRADED] = "degraded",
	[METRICS_ERROR] = "error",
};

static const char *const metrics_store_error_names[METRICS_NKINDS] = {
	[METRICS_STORE_OK] = "none",
	[METRICS_STORE_CONNECT] = "connect",
	[METRICS_STORE_TIMEOUT] = "timeout",
	[METRICS_STORE_PROTOCOL] = "protocol",
	[METRICS_STORE_FULL] = "full",
	[METRICS_STORE_CIRCUIT_OPEN] = "circuit_open",
	[METRICS_STORE_TLS] = "tls",
};

static const char *const metrics_report_names[METRICS_NREPORTS] = {
	[METRICS_REPORT_WITHIN] = "within",
	[METRICS_REPORT_OVERDRAWN] = "overdrawn",
	[METRICS_REPORT_UNRECORDED] = "unrecorded",
};

static const char *const metrics_admin_op_names[METRICS_ADMIN_NOPS] = {
	[METRICS_ADMIN_OVERRIDE_SET] = "override_set",
	[METRICS_ADMIN_OVERRIDE_DELETE] = "override_delete",
	[METRICS_ADMIN_COUNTER_RESET] = "counter_reset",
};

static const char *const metrics_backend_names[2] = { "redis", "memory" };

static const char *const metrics_protocol_names[METRICS_NPROTOCOLS] = { "http",
	"grpc" };

static const char *const metrics_grpc_code_names[METRICS_GRPC_CODES] = { "OK",
	"CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
	"RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
	"UNAUTHENTICATED" };

/* Upper bounds (le) in microseconds, and as printed in seconds. */
static const uint64_t metrics_bounds_us[METRICS_NBOUNDS] = { 100, 250, 500,
	1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
	1000000 };
static const char *const metrics_bounds_le[METRICS_NBOUNDS] = { "0.0001",
	"0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025",
	"0.05", "0.1", "0.25", "0.5", "1" };

static const uint64_t metrics_phase_bounds_us[METRICS_PHASE_NBOUNDS] = { 10, 25,
	50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000 };
static const char *const metrics_phase_bounds_le[METRICS_PHASE_NBOUNDS] = {
	"0.00001", "0.000025", "0.00005", "0.0001", "0.00025", "0.0005",
	"0.001", "0.0025", "0.005", "0.01", "0.025"
};
static const char *const metrics_phase_names[METRICS_NPHASES] = { "prepare",
	"queue", "store", "resume" };

struct metrics *
metrics_new(void)
{
	struct metrics *m;
	pthread_rwlockattr_t attr;
	int rc;

	if ((m = rl_calloc(1, sizeof(*m))) == NULL)
		return NULL;
	if (pthread_rwlockattr_init(&attr) != 0)
		goto free_m;
	/*
	 * glibc prefers readers by default; with every request taking the
	 * read lock, the one writer adding a new rule name could starve.
	 */
	pthread_rwlockattr_setkind_np(&attr,
	    PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	rc = pthread_rwlock_init(&m->lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	if (rc != 0)
		goto free_m;
	atomic_store(&m->last_reload_ok, 1);
	m->start_us = util_realtime_us();
	return m;

free_m:
	rl_free(m);
	return NULL;
}

void
metrics_free(struct metrics *m)
{
	size_t i;

	if (m == NULL)
		return;
	for (i = 0; i < m->nrules; i++)
		rl_free(m->order[i]);
	rl_free(m->order);
	rl_free(m->slots);
	pthread_rwlock_destroy(&m->lock);
	rl_free(m);
}

void
metrics_http_response(struct metrics *m, int status)
{
	if (m == NULL || status < METRICS_HTTP_MIN || status > METRICS_HTTP_MAX)
		return;
	atomic_fetch_add_explicit(&m->http[status - METRICS_HTTP_MIN], 1,
	    memory_order_relaxed);
}

/* ---- the rule table ------------------------------------------------- */

/* FNV-1a: short names, no adversary worth a keyed hash (names come from
 * the config, and the table is capped anyway). */
static uint32_t
metrics_hash(const char *s)
{
	return (uint32_t)util_fnv1a(s, strlen(s));
}

/* The entry for name, or NULL.  Caller holds the lock (either mode). */
static struct metrics_rule *
rule_find(const struct metrics *m, const char *name, uint32_t h)
{
	struct metrics_rule *e;
	size_t i, mask;

	if (m->nslots == 0)
		return NULL;
	mask = m->nslots - 1;
	for (i = h & mask; (e = m->slots[i]) != NULL; i = (i + 1) & mask)
		if (e->hash == h && strcmp(e->name, name) == 0)
			return e;
	return NULL;
}

static void
rule_place(struct metrics_rule **slots, size_t nslots, struct metrics_rule *e)
{
	size_t i, mask = nslots - 1;

	for (i = e->hash & mask; slots[i] != NULL; i = (i + 1) & mask)
		;
	slots[i] = e;
}

/* Make room for one more entry (load <= 1/2).  0 or -1 (OOM).  Write lock. */
static int
rule_reserve(struct metrics *m)
{
	struct metrics_rule **slots, **order;
	size_t i, nslots, cap;

	if ((m->nrules + 1) * 2 > m->nslots) {
		nslots = m->nslots == 0 ? METRICS_MIN_SLOTS : m->nslots * 2;
		if ((slots = rl_calloc(nslots, sizeof(*slots))) == NULL)
			return -1;
		for (i = 0; i < m->nrules; i++)
			rule_place(slots, nslots, m->order[i]);
		rl_free(m->slots);
		m->slots = slots;
		m->nslots = nslots;
	}
	if (m->nrules == m->order_cap) {
		cap = m->order_cap == 0 ? METRICS_MIN_SLOTS : m->order_cap * 2;
		order = rl_realloc(m->order, cap * sizeof(*order));
		if (order == NULL)
			return -1;
		m->order = order;
		m->order_cap = cap;
	}
	return 0;
}

/* Add a new entry for name (not in the table).  NULL on OOM.  Write lock. */
static struct metrics_rule *
rule_add(struct metrics *m, const char *name, uint32_t h)
{
	struct metrics_rule *e;
	size_t len = strlen(name);

	if (rule_reserve(m) < 0)
		return NULL;
	if ((e = rl_calloc(1, sizeof(*e) + len + 1)) == NULL)
		return NULL;
	e->hash = h;
	memcpy(e->name, name, len + 1);
	rule_place(m->slots, m->nslots, e);
	m->order[m->nrules++] = e;
	return e;
}

/*
 * The slow path: name was not found under the read lock.  Takes the write
 * lock, looks again (another thread may have added it), and adds it, or
 * falls back to "_other" when the table is full.  NULL on OOM: that one
 * count is lost, which beats failing a request over metrics.
 */
static struct metrics_rule *
rule_get_slow(struct metrics *m, const char *name, uint32_t h)
{
	struct metrics_rule *e;

	if (pthread_rwlock_wrlock(&m->lock) != 0)
		return NULL;
	if ((e = rule_find(m, name, h)) != NULL)
		goto unlock;
	if (m->nrules < METRICS_MAX_RULES) {
		e = rule_add(m, name, h);
		goto unlock;
	}
	if (m->other == NULL) {
		/* A real rule may be named "_other"; then it shares. */
		h = metrics_hash(METRICS_OTHER_RULE);
		if ((e = rule_find(m, METRICS_OTHER_RULE, h)) == NULL)
			e = rule_add(m, METRICS_OTHER_RULE, h);
		m->other = e;
	}
	e = m->other;
unlock:
	pthread_rwlock_unlock(&m->lock);
	return e;
}

/* The entry of name (a rule or a stat), added on first use; "_other" once
 * the table is full; NULL only when out of memory or the lock fails. */
static struct metrics_rule *
rule_get(struct metrics *m, const char *name)
{
	struct metrics_rule *e;
	uint32_t h = metrics_hash(name);

	if (pthread_rwlock_rdlock(&m->lock) != 0)
		return NULL;
	/* m->other is only set once no new name can be added. */
	if ((e = rule_find(m, name, h)) == NULL)
		e = m->other;
	pthread_rwlock_unlock(&m->lock);
	if (e == NULL)
		e = rule_get_slow(m, name, h);
	return e;
}

void
metrics_decision(struct metrics *m, enum metrics_protocol p, const char *rule,
    enum metrics_outcome o)
{
	struct metrics_rule *e;

	if (m == NULL || rule == NULL || (unsigned)o >= METRICS_NRESULTS ||
	    (unsigned)p >= METRICS_NPROTOCOLS ||
	    (e = rule_get(m, rule)) == NULL)
		return;
	atomic_store_explicit(&e->is_rule, true, memory_order_relaxed);
	atomic_fetch_add_explicit(&e->n[p][o], 1, memory_order_relaxed);
}

void
metrics_prefetch(struct metrics *m, const char *rule, enum metrics_prefetch ev,
    uint64_t units)
{
	struct metrics_rule *e;

	if (m == NULL || rule == NULL ||
	    (unsigned)ev >= METRICS_PREFETCH_NEVENTS ||
	    (e = rule_get(m, rule)) == NULL)
		return;
	atomic_store_explicit(&e->is_rule, true, memory_order_relaxed);
	atomic_store_explicit(&e->has_prefetch, true, memory_order_relaxed);
	atomic_fetch_add_explicit(&e->prefetch[ev], units,
	    memory_order_relaxed);
}

/* Stats share the table of names with rules: a name is one or the
 * other in a config (config.c), but may be each in turn across reloads;
 * each renders in its own family by its own flag. */
void
metrics_stat_record(struct metrics *m, const char *stat)
{
	struct metrics_rule *e;

	if (m == NULL || stat == NULL || (e = rule_get(m, stat)) == NULL)
		return;
	atomic_store_explicit(&e->is_stat, true, memory_order_relaxed);
	atomic_fetch_add_explicit(&e->records, 1, memory_order_relaxed);
}

void
metrics_set_grpc(struct metrics *m)
{
	if (m != NULL)
		atomic_store(&m->grpc_on, true);
}

void
metrics_grpc_response(struct metrics *m, int code)
{
	if (m == NULL || code < 0 || code >= METRICS_GRPC_CODES)
		return;
	atomic_fetch_add_explicit(&m->grpc[code], 1, memory_order_relaxed);
}

/* ---- backends, pool, reloads ---------------------------------------- */

void
metrics_backend_call(struct metrics *m, const char *backend, int64_t usec,
    enum metrics_store_error kind)
{
	struct metrics_backend *b = NULL;
	uint64_t us;
	size_t i;

	if (m == NULL || backend == NULL)
		return;
	for (i = 0; i < 2; i++)
		if (strcmp(backend, metrics_backend_names[i]) == 0)
			b = &m->backend[i];
	if (b == NULL)
		return;
	us = usec < 0 ? 0 : (uint64_t)usec;
	for (i = 0; i < METRICS_NBOUNDS && us > metrics_bounds_us[i]; i++)
		;
	atomic_fetch_add_explicit(&b->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&b->sum_us, us, memory_order_relaxed);
	if (kind != METRICS_STORE_OK && (unsigned)kind < METRICS_NKINDS)
		atomic_fetch_add_explicit(&b->errors[kind], 1,
		    memory_order_relaxed);
}

void
metrics_phase(struct metrics *m, enum metrics_phase p, int64_t usec)
{
	struct metrics_phase_hist *h;
	uint64_t us;
	size_t i;

	if (m == NULL || (unsigned)p >= METRICS_NPHASES)
		return;
	h = &m->phases[p];
	us = usec < 0 ? 0 : (uint64_t)usec;
	for (i = 0;
	     i < METRICS_PHASE_NBOUNDS && us > metrics_phase_bounds_us[i]; i++)
		;
	atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
}

void
metrics_set_deny_hits(struct metrics *m, metrics_count_fn hits, const void *arg)
{
	if (m != NULL) {
		m->deny_hits = hits;
		m->deny_arg = arg;
	}
}

void
metrics_redis_event(struct metrics *m, enum metrics_redis_event ev)
{
	if (m != NULL && ev < METRICS_REDIS_NEVENTS)
		atomic_fetch_add_explicit(&m->redis_events[ev], 1,
		    memory_order_relaxed);
}

void
metrics_waiting(struct metrics *m, enum metrics_wait w, int delta)
{
	if (m == NULL || (unsigned)w > METRICS_WAIT_LEASE)
		return;
	atomic_fetch_add_explicit(&m->waiting[w], delta, memory_order_relaxed);
}

void
metrics_wait_full(struct metrics *m)
{
	if (m != NULL)
		atomic_fetch_add_explicit(&m->wait_full, 1,
		    memory_order_relaxed);
}

void
metrics_report(struct metrics *m, enum metrics_report r)
{
	if (m != NULL && (unsigned)r < METRICS_NREPORTS)
		atomic_fetch_add_explicit(&m->reports[r], 1,
		    memory_order_relaxed);
}

void
metrics_admin_write(struct metrics *m, enum metrics_admin_op op)
{
	if (m != NULL && (unsigned)op < METRICS_ADMIN_NOPS)
		atomic_fetch_add_explicit(&m->admin_writes[op], 1,
		    memory_order_relaxed);
}

void
metrics_pool_in_use(struct metrics *m, int delta)
{
	if (m == NULL)
		return;
	atomic_fetch_add_explicit(&m->pool_in_use, delta, memory_order_relaxed);
}

void
metrics_reload(struct metrics *m, bool ok)
{
	if (m == NULL)
		return;
	atomic_fetch_add_explicit(&m->reloads[ok ? 1 : 0], 1,
	    memory_order_relaxed);
	atomic_store_explicit(&m->last_reload_ok, ok ? 1 : 0,
	    memory_order_relaxed);
}

/* ---- rendering ------------------------------------------------------ */

/* A label value between double quotes, escaped. */
static void
buf_label_value(struct util_buf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n;

	util_buf_add(b, "\"", 1);
	while (*p != '\0') {
		if (*p == '\\')
			util_buf_add(b, "\\\\", 2);
		else if (*p == '"')
			util_buf_add(b, "\\\"", 2);
		else if (*p == '\n')
			util_buf_add(b, "\\n", 2);
		else if ((n = util_utf8_len(p)) == 0)
			util_buf_add(b, "\xef\xbf\xbd", 3); /* U+FFFD */
		else {
			util_buf_add(b, (const char *)p, n);
			p += n;
			continue;
		}
		p++;
	}
	util_buf_add(b, "\"", 1);
}

static void
buf_family(struct util_buf *b, const char *name, const char *type,
    const char *help)
{
	util_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
	    type);
}

/* Microseconds as exact decimal seconds: 1234567 => "1.234567". */
static void
buf_seconds(struct util_buf *b, uint64_t us)
{
	util_buf_printf(b, "%" PRIu64 ".%06" PRIu64, us / 1000000,
	    us % 1000000);
}

static void
render_build_info(struct util_buf *b)
{
	buf_family(b, "ratelimitd_build_info", "gauge",
	    "Build information; the value is always 1.");
	util_buf_puts(b, "ratelimitd_build_info{version=");
	buf_label_value(b, RL_VERSION);
	util_buf_puts(b, "} 1\n");
}

static void
render_http(struct util_buf *b, struct metrics *m)
{
	unsigned long long n;
	size_t i;

	buf_family(b, "ratelimitd_http_responses_total", "counter",
	    "HTTP responses sent, by status code.");
	for (i = 0; i <= METRICS_HTTP_MAX - METRICS_HTTP_MIN; i++) {
		n = atomic_load_explicit(&m->http[i], memory_order_relaxed);
		if (n != 0)
			util_buf_printf(b,
			    "ratelimitd_http_responses_total"
			    "{code=\"%zu\"} %llu\n",
			    i + METRICS_HTTP_MIN, n);
	}
	buf_family(b, "ratelimitd_waiting_requests", "gauge",
	    "Requests with wait_ms held now: for their turn, or for a lease.");
	util_buf_printf(b, "ratelimitd_waiting_requests{for=\"turn\"} %lld\n",
	    atomic_load_explicit(&m->waiting[METRICS_WAIT_TURN],
		memory_order_relaxed));
	util_buf_printf(b, "ratelimitd_waiting_requests{for=\"lease\"} %lld\n",
	    atomic_load_explicit(&m->waiting[METRICS_WAIT_LEASE],
		memory_order_relaxed));
	buf_family(b, "ratelimitd_wait_full_total", "counter",
	    "Requests with wait_ms decided at once: max_waiting were "
	    "waiting.");
	util_buf_printf(b, "ratelimitd_wait_full_total %llu\n",
	    atomic_load_explicit(&m->wait_full, memory_order_relaxed));
	buf_family(b, "ratelimitd_reports_total", "counter",
	    "Usage reports (POST /report), by what they did.");
	for (i = 0; i < METRICS_NREPORTS; i++)
		util_buf_printf(b,
		    "ratelimitd_reports_total{result=\"%s\"} %llu\n",
		    metrics_report_names[i],
		    atomic_load_explicit(&m->reports[i], memory_order_relaxed));
	buf_family(b, "ratelimitd_admin_writes_total", "counter",
	    "Writes of the admin API (docs/admin.md), by operation.");
	for (i = 0; i < METRICS_ADMIN_NOPS; i++)
		util_buf_printf(b,
		    "ratelimitd_admin_writes_total{op=\"%s\"} %llu\n",
		    metrics_admin_op_names[i],
		    atomic_load_explicit(&m->admin_writes[i],
			memory_order_relaxed));
}

/* Copy the rule entries' pointers (stable until metrics_free) so that
 * formatting runs without the lock.  0 or -1. */
static int
rules_snapshot(struct metrics *m, struct metrics_rule ***out, size_t *n)
{
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (pthread_rwlock_rdlock(&m->lock) != 0)
		return -1;
	if (m->nrules > 0) {
		*out = rl_malloc(m->nrules * sizeof(**out));
		if (*out == NULL)
			rc = -1;
		else {
			memcpy(*out, m->order, m->nrules * sizeof(**out));
			*n = m->nrules;
		}
	}
	pthread_rwlock_unlock(&m->lock);
	return rc;
}

/* gRPC's series only once its front end is on: a daemon without it
 * shows no protocol it does not speak. */
static void
render_decisions(struct util_buf *b, struct metrics *m,
    struct metrics_rule **rules, size_t nrules)
{
	size_t i, j, p, np = atomic_load(&m->grpc_on) ? 2 : 1;

	buf_family(b, "ratelimitd_decisions_total", "counter",
	    "Outcomes of applying rules, by rule, result and protocol.");
	for (p = 0; p < np; p++)
		for (i = 0; i < nrules; i++)
			for (j = 0; atomic_load_explicit(&rules[i]->is_rule,
					memory_order_relaxed) &&
			     j < METRICS_NRESULTS;
			     j++) {
				util_buf_puts(b,
				    "ratelimitd_decisions_total{rule=");
				buf_label_value(b, rules[i]->name);
				util_buf_printf(b,
				    ",result=\"%s\",protocol=\"%s\"} "
				    "%llu\n",
				    metrics_result_names[j],
				    metrics_protocol_names[p],
				    atomic_load_explicit(&rules[i]->n[p][j],
					memory_order_relaxed));
			}
}

/* Only the rules that took quota in advance. */
static void
render_prefetch(struct util_buf *b, struct metrics_rule **rules, size_t nrules)
{
	static const char *const names[METRICS_PREFETCH_NEVENTS] = {
		[METRICS_PREFETCH_TAKEN] = "taken",
		[METRICS_PREFETCH_USED] = "used",
		[METRICS_PREFETCH_LOST] = "lost",
	};
	size_t i, j;

	buf_family(b, "ratelimitd_prefetch_units_total", "counter",
	    "Units of quota taken in advance, used in process, or lost, "
	    "by rule.");
	for (i = 0; i < nrules; i++)
		for (j = 0; atomic_load_explicit(&rules[i]->has_prefetch,
				memory_order_relaxed) &&
		     j < METRICS_PREFETCH_NEVENTS;
		     j++) {
			util_buf_puts(b,
			    "ratelimitd_prefetch_units_total{rule=");
			buf_label_value(b, rules[i]->name);
			util_buf_printf(b, ",event=\"%s\"} %llu\n", names[j],
			    atomic_load_explicit(&rules[i]->prefetch[j],
				memory_order_relaxed));
		}
}

static void
render_stats(struct util_buf *b, struct metrics_rule **rules, size_t nrules)
{
	size_t i;

	buf_family(b, "ratelimitd_stats_records_total", "counter",
	    "Values recorded with POST /record, by stat.");
	for (i = 0; i < nrules; i++) {
		if (!atomic_load_explicit(&rules[i]->is_stat,
			memory_order_relaxed))
			continue;
		util_buf_puts(b, "ratelimitd_stats_records_total{stat=");
		buf_label_value(b, rules[i]->name);
		util_buf_printf(b, "} %llu\n",
		    atomic_load_explicit(&rules[i]->records,
			memory_order_relaxed));
	}
}

static void
render_grpc(struct util_buf *b, struct metrics *m)
{
	unsigned long long n;
	size_t i;

	if (!atomic_load(&m->grpc_on))
		return;
	buf_family(b, "ratelimitd_grpc_responses_total", "counter",
	    "gRPC calls answered, by status code.");
	for (i = 0; i < METRICS_GRPC_CODES; i++) {
		n = atomic_load_explicit(&m->grpc[i], memory_order_relaxed);
		if (n != 0 || i == 0)
			util_buf_printf(b,
			    "ratelimitd_grpc_responses_total"
			    "{code=\"%s\"} %llu\n",
			    metrics_grpc_code_names[i], n);
	}
}

static unsigned long long
redis_event(struct metrics *m, enum metrics_redis_event ev)
{
	return atomic_load_explicit(&m->redis_events[ev], memory_order_relaxed);
}

/* One series of a histogram: its buckets (counts per bucket, nb of them,
 * the last above every bound in le[]), sum and count, labelled
 * label="value". */
static void
render_series(struct util_buf *b, const char *name, const char *label,
    const char *value, const atomic_ullong *bucket, size_t nb,
    const char *const *le, const atomic_ullong *sum_us)
{
	unsigned long long cum = 0;
	size_t j;

	for (j = 0; j < nb; j++) {
		cum += atomic_load_explicit(&bucket[j], memory_order_relaxed);
		util_buf_printf(b, "%s_bucket{%s=\"%s\",le=\"%s\"} %llu\n",
		    name, label, value, j + 1 < nb ? le[j] : "+Inf", cum);
	}
	util_buf_printf(b, "%s_sum{%s=\"%s\"} ", name, label, value);
	buf_seconds(b, atomic_load_explicit(sum_us, memory_order_relaxed));
	util_buf_printf(b, "\n%s_count{%s=\"%s\"} %llu\n", name, label, value,
	    cum);
}

static void
render_phases(struct util_buf *b, struct metrics *m)
{
	const char *name = "ratelimitd_request_phase_seconds";
	size_t i;

	buf_family(b, name, "histogram",
	    "Time a request that asked Redis spent in each phase in the "
	    "daemon, in seconds.");
	for (i = 0; i < METRICS_NPHASES; i++)
		render_series(b, name, "phase", metrics_phase_names[i],
		    m->phases[i].bucket, METRICS_PHASE_NBUCKETS,
		    metrics_phase_bounds_le, &m->phases[i].sum_us);
}

static void
render_backends(struct util_buf *b, struct metrics *m)
{
	const char *hname = "ratelimitd_backend_request_duration_seconds";
	const char *ename = "ratelimitd_backend_errors_total";
	size_t i, j;

	buf_family(b, hname, "histogram",
	    "Duration of backend calls in seconds, failed ones included.");
	for (i = 0; i < 2; i++)
		render_series(b, hname, "backend", metrics_backend_names[i],
		    m->backend[i].bucket, METRICS_NBUCKETS, metrics_bounds_le,
		    &m->backend[i].sum_us);

	buf_family(b, ename, "counter",
	    "Failed backend calls, by backend and kind of error.");
	for (i = 0; i < 2; i++)
		for (j = METRICS_STORE_OK + 1; j < METRICS_NKINDS; j++)
			util_buf_printf(b,
			    "%s{backend=\"%s\",kind=\"%s\"} %llu\n", ename,
			    metrics_backend_names[i],
			    metrics_store_error_names[j],
			    atomic_load_explicit(&m->backend[i].errors[j],
				memory_order_relaxed));
	/* The same counters of the Redis store (backend[0]) under the name
	 * docs/operations.md gives them too: one count, two names. */
	buf_family(b, "ratelimitd_redis_errors_total", "counter",
	    "Failed Redis store calls, by kind of error (the same as "
	    "ratelimitd_backend_errors_total{backend=\"redis\"}).");
	for (j = METRICS_STORE_OK + 1; j < METRICS_NKINDS; j++)
		util_buf_printf(b,
		    "ratelimitd_redis_errors_total{kind=\"%s\"} %llu\n",
		    metrics_store_error_names[j],
		    atomic_load_explicit(&m->backend[0].errors[j],
			memory_order_relaxed));

	buf_family(b, "ratelimitd_redis_pool_in_use", "gauge",
	    "Connections to Redis with calls in flight now.");
	util_buf_printf(b, "ratelimitd_redis_pool_in_use %lld\n",
	    atomic_load_explicit(&m->pool_in_use, memory_order_relaxed));

	buf_family(b, "ratelimitd_redis_redirects_total", "counter",
	    "Redis Cluster redirections followed, by kind.");
	util_buf_printf(b,
	    "ratelimitd_redis_redirects_total{kind=\"moved\"} "
	    "%llu\n",
	    redis_event(m, METRICS_REDIS_MOVED));
	util_buf_printf(b,
	    "ratelimitd_redis_redirects_total{kind=\"ask\"} "
	    "%llu\n",
	    redis_event(m, METRICS_REDIS_ASK));
	buf_family(b, "ratelimitd_redis_topology_refreshes_total", "counter",
	    "Redis Cluster slot maps read (CLUSTER SLOTS).");
	util_buf_printf(b, "ratelimitd_redis_topology_refreshes_total %llu\n",
	    redis_event(m, METRICS_REDIS_TOPOLOGY_REFRESH));
	buf_family(b, "ratelimitd_redis_failovers_total", "counter",
	    "Primaries changed under Sentinel.");
	util_buf_printf(b, "ratelimitd_redis_failovers_total %llu\n",
	    redis_event(m, METRICS_REDIS_FAILOVER));
	buf_family(b, "ratelimitd_redis_takebacks_total", "counter",
	    "Requests denied across Redis Cluster slots whose recorded units "
	    "were taken back, by result.");
	util_buf_printf(b,
	    "ratelimitd_redis_takebacks_total{result=\"ok\"} "
	    "%llu\n",
	    redis_event(m, METRICS_REDIS_TAKEBACK));
	util_buf_printf(b,
	    "ratelimitd_redis_takebacks_total{result=\"failed\"} "
	    "%llu\n",
	    redis_event(m, METRICS_REDIS_TAKEBACK_FAILED));

	buf_family(b, "ratelimitd_deny_cache_hits_total", "counter",
	    "Requests denied from the deny cache, without a store call.");
	util_buf_printf(b, "ratelimitd_deny_cache_hits_total %llu\n",
	    m->deny_hits != NULL ?
		(unsigned long long)m->deny_hits(m->deny_arg) :
		0ULL);
}

static void
render_reloads(struct util_buf *b, struct metrics *m)
{
	buf_family(b, "ratelimitd_config_reloads_total", "counter",
	    "Config reloads, by result.");
	util_buf_printf(b,
	    "ratelimitd_config_reloads_total{result=\"success\"} "
	    "%llu\n",
	    atomic_load_explicit(&m->reloads[1], memory_order_relaxed));
	util_buf_printf(b,
	    "ratelimitd_config_reloads_total{result=\"failure\"} "
	    "%llu\n",
	    atomic_load_explicit(&m->reloads[0], memory_order_relaxed));
	buf_family(b, "ratelimitd_config_last_reload_success", "gauge",
	    "1 if the last config reload succeeded or none was tried, else 0.");
	util_buf_printf(b, "ratelimitd_config_last_reload_success %d\n",
	    atomic_load_explicit(&m->last_reload_ok, memory_order_relaxed));
}

/*
 * Render every family into a new buffer.  m == NULL renders build_info
 * alone: a valid document that still says which version answers.  Counters
 * of known label sets (rules seen, both backends, every error kind, both
 * reload results) are rendered even at 0, so rate() works from the first
 * scrape; HTTP codes only once seen, as 500 zero series would be noise.
 * The caller frees *out with rl_free.  0, or -1 (OOM; *out is NULL).
 * Any thread.
 */
int
metrics_render(struct metrics *m, char **out, size_t *len)
{
	struct util_buf b = { 0 };
	struct metrics_rule **rules = NULL;
	size_t nrules = 0;

	if (out == NULL)
		return -1;
	*out = NULL;
	if (len != NULL)
		*len = 0;
	if (!util_buf_reserve(&b, 0))
		goto oom;
	render_build_info(&b);
	if (m != NULL) {
		if (rules_snapshot(m, &rules, &nrules) < 0)
			goto oom;
		buf_family(&b, "ratelimitd_start_time_seconds", "gauge",
		    "Start time of the process in seconds since the epoch.");
		util_buf_puts(&b, "ratelimitd_start_time_seconds ");
		buf_seconds(&b, m->start_us < 0 ? 0 : (uint64_t)m->start_us);
		util_buf_puts(&b, "\n");
		render_http(&b, m);
		render_grpc(&b, m);
		render_decisions(&b, m, rules, nrules);
		render_stats(&b, rules, nrules);
		render_prefetch(&b, rules, nrules);
		render_backends(&b, m);
		render_phases(&b, m);
		render_reloads(&b, m);
	}
	if (b.oom)
		goto oom;
	rl_free(rules);
	*out = b.p;
	if (len != NULL)
		*len = b.len;
	return 0;

oom:
	rl_free(rules);
	rl_free(b.p);
	return -1;
}
