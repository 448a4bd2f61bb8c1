/*
 * backend.h - the one small interface between a decision and the store that
 * keeps the counters.  Two stores implement it: the in-process memory store
 * (backend_memory.c) and Redis (backend_redis.c).  decide.c uses it for the
 * main backend and, with on_backend_error: local, for the fallback.
 *
 * A call hands over every rule that applies to one request at once, so a
 * store can evaluate them atomically: either every non-shadow check allows
 * and each allowing check records its cost, or nothing is recorded at all.
 *
 * Calls are asynchronous: the caller fills a struct backend_call with the
 * checks, a deadline and a completion function, and submits it; the store
 * runs the completion exactly once, with the results or an error, by the
 * deadline.  The memory store completes every call inside submit (it never
 * blocks: b->completes_inline).  Redis completes calls on its own I/O
 * thread, and batches the calls that arrive together into one script call
 * (backend_redis.c).  backend_decide() and backend_is_ready() wrap a call
 * for callers that may block (tests, tools).
 */
#ifndef RL_BACKEND_H
#define RL_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/rules.h"

/* One applying rule of one request.  Everything is borrowed for the call. */
struct rl_check {
	enum rl_algorithm algorithm;
	int64_t limit;	   /* >= 1 */
	int64_t window_ms; /* >= 1 */
	int64_t cost;	   /* 0 <= cost <= limit; 0 records nothing */
	bool shadow;	   /* never denies the request */
	const char *key;   /* full store key: "<prefix><rule>:{<key>}" */
	size_t keylen;
	const char *token; /* concurrency: the token of the lease this
			    * request takes (32 hex digits); NULL for a
			    * look only, which takes none and is denied
			    * (docs/leases.md, a request queued behind
			    * waiters); else NULL */
	/* docs/algorithms.md, "Taking quota in advance": when > 0 (and
	 * >= cost >= 1), a recording check takes a chunk of up to this many
	 * units, usable for prefetch_hold_us; 0: records cost only. */
	int64_t prefetch_want;
	int64_t prefetch_hold_us;
};

/* What one check would do, filled by the backend. */
struct rl_result {
	bool allowed;		/* this rule alone admits the request */
	int64_t remaining;	/* units left after this request (if admitted
				 * overall), else left now; >= 0 */
	int64_t reset_ms;	/* until the whole limit is free again */
	int64_t retry_after_ms; /* 0 if allowed; else until it would be */
	int64_t effective_ms;	/* the RateLimit header's t: until more
				 * quota comes back, i.e. the retry_after
				 * of a request of remaining + 1 units; the
				 * window when nothing is used; 0 for a
				 * concurrency rule (docs/algorithms.md) */
	double mark;		/* Redis Cluster: where the units were
				 * recorded (lua/takeback.lua); else 0 */
	int64_t taken;		/* a chunk was recorded (prefetch_want):
				 * its units, cost included; else 0 */
	int64_t taken_us;	/* then: how long after the store's now
				 * its units may be used */
};

/*
 * One stat key of a /record or /stats request (docs/stats.md,
 * docs/stats.md): record value (if record) at the store's time, then read
 * the live sub-windows.  Everything is borrowed for the call.
 */
#define RL_STATS_MAX_QUANTILES 16
struct rl_stat_op {
	const char *key; /* "<prefix>stat:<name>:{<key>}" */
	size_t keylen;
	int64_t window_ms;     /* >= 1 */
	int64_t resolution_ms; /* 1 .. window_ms */
	double accuracy;       /* relative_accuracy */
	bool record;
	double value;		 /* finite; if record */
	const double *quantiles; /* nquantiles in [0, 1] */
	size_t nquantiles;	 /* <= RL_STATS_MAX_QUANTILES */
};

/* What the store answers for one stat op: count 0 means an empty window
 * (the other fields are then 0). */
struct rl_stat_result {
	uint64_t count;
	double sum, min, max;
	double q[RL_STATS_MAX_QUANTILES];
};

enum backend_error_kind {
	BACKEND_ERR_NONE = 0,
	BACKEND_ERR_CONNECT,	  /* cannot connect / pool exhausted */
	BACKEND_ERR_TIMEOUT,	  /* no answer within the timeout */
	BACKEND_ERR_PROTOCOL,	  /* unexpected reply, script error */
	BACKEND_ERR_FULL,	  /* memory store at max_keys */
	BACKEND_ERR_CIRCUIT_OPEN, /* not tried: too many recent failures */
	BACKEND_ERR_TLS,	  /* TLS handshake or verification failed */
	BACKEND_ERR_DEADLINE	  /* the caller's own deadline (deadline_us,
				   * earlier than the store's timeout)
				   * passed first: says nothing about the
				   * store */
};

#define BACKEND_ERR_MAX 200

struct backend_call;
typedef void (*backend_done_fn)(struct backend_call *call);

/*
 * Room in every call for what the store it was submitted to keeps about
 * it while the call is in its hands (list links, its batch, ...), so a
 * store needs no allocation per call.  Its layout is the store's alone
 * (the Redis store's: struct redis_call_priv in store/redis_priv.h, which
 * checks that it fits); the memory store uses none of it.
 */
#define BACKEND_CALL_STORE_SIZE 64
struct backend_call_store {
	_Alignas(max_align_t) unsigned char opaque[BACKEND_CALL_STORE_SIZE];
};

/* What a call does besides deciding (backend_call.lease_op). */
enum backend_lease_op {
	BACKEND_LEASE_NONE = 0,
	BACKEND_LEASE_RELEASE, /* POST /release (docs/leases.md) */
	BACKEND_LEASE_RENEW    /* POST /renew */
};

/*
 * docs/admin.md: a call that decides nothing, on one store key
 * (backend_call.admin, with n == 0).  Everything borrowed for the call
 * but reply, which the store sets and the caller frees (rl_free).
 */
enum backend_admin_op {
	BACKEND_ADMIN_RESET = 1,     /* drop key's state (a counter) */
	BACKEND_ADMIN_OVERRIDE_SET,  /* field := value in the hash key,
				      * expiring in ttl_ms (0: never) */
	BACKEND_ADMIN_OVERRIDE_DEL,  /* drop field of the hash key */
	BACKEND_ADMIN_OVERRIDE_READ, /* a page of the hash key into reply */
	BACKEND_ADMIN_OVERRIDE_DROP, /* drop the fields of pairs that still
				      * hold the value given and are expired
				      * by the store's clock */
	BACKEND_ADMIN_OVERRIDE_UNDO  /* take an OVERRIDE_SET of field back:
				      * the field as it was, if it still
				      * holds what the set wrote */
};
/* OVERRIDE_DROP: at most this many pairs in one call. */
#define BACKEND_OVERRIDE_DROP_MAX 128
/* OVERRIDE_READ: about this many fields a page (Redis's HSCAN COUNT; a
 * small hash comes whole). */
#define BACKEND_OVERRIDE_PAGE 500
struct backend_admin {
	enum backend_admin_op op;
	const char *key; /* the store key, or the override hash */
	size_t keylen;
	const char *field; /* OVERRIDE_SET, _DEL, _UNDO: the rendered key */
	size_t fieldlen;
	const char *value; /* OVERRIDE_SET: "<limit> <window_ms>" */
	int64_t ttl_ms;	   /* OVERRIDE_SET: 0 = no expiry */
	/* OVERRIDE_DROP: npairs (1 to BACKEND_OVERRIDE_DROP_MAX) field and
	 * value pairs, laid out as OVERRIDE_READ's reply (below).
	 * OVERRIDE_UNDO: the reply of the OVERRIDE_SET to take back, npairs
	 * 1. */
	const char *pairs;
	size_t pairslen, npairs;
	/* OVERRIDE_READ: where the scan of the hash is, 0 to begin; the
	 * store sets it to where the next page begins, 0 after the last. */
	uint64_t cursor;
	/* Set by the store: RESET, OVERRIDE_DEL and OVERRIDE_DROP, whether
	 * there was something; OVERRIDE_READ, the page's fields (expired
	 * ones included; a field may come in two pages) as pairs of
	 * strings, each a uint32_t length (host order) and its bytes, the value
	 * "<limit> <window_ms> <expires_at_ms>" (0: never; the store's
	 * clock, epoch milliseconds).  OVERRIDE_SET: whether the field held
	 * something, and in reply one pair so laid out: what it held ("":
	 * nothing) and the value the set wrote.  OVERRIDE_UNDO: whether the
	 * field was put back (false: a write since changed it). */
	bool found;
	char *reply;
	size_t replylen;
};

/*
 * One call: a request's checks; or (n == 0, stat != NULL) one stat op,
 * answered in *stat_out; or (n == 0, admin != NULL) an admin call
 * (struct backend_admin); or (n == 0, stat == NULL) a readiness probe,
 * which asks whether the store answers now (a PING on Redis); or
 * (lease_op set, n == 1) a lease's release or renewal: checks[0] names
 * the concurrency key, its token, its cost and (renew) the window;
 * out[0].allowed tells whether the lease was held, and out[0].reset_ms
 * is its new lifetime (renew).  The caller owns the
 * struct and everything it points to, and keeps them alive and unchanged
 * until done runs; done may free them.
 */
struct backend_call {
	/* Set by the caller. */
	const struct rl_check *checks;
	size_t n;
	struct rl_result *out; /* n results */
	int64_t start_us;      /* monotonic: when the request
				* arrived; the store's own timeout
				* (redis.timeout) runs from then.
				* 0: from submit */
	int64_t deadline_us;   /* monotonic: a tighter bound of the
				* caller's (a gRPC client's
				* grpc-timeout); 0: none.  The store
				* sets it to the deadline it keeps:
				* the earlier of the two */
	backend_done_fn done;
	void *arg;	 /* the caller's */
	int64_t wait_us; /* docs/waiting.md: when denied now, reserve
			  * the earliest time within this many
			  * store microseconds; 0: no waiting */
	const struct rl_stat_op *stat; /* a stat call, or NULL */
	struct rl_stat_result *stat_out;
	enum backend_lease_op lease_op; /* BACKEND_LEASE_NONE: decide */
	struct backend_admin *admin;	/* n == 0: an admin call, or NULL */
	bool report;	    /* POST /report (docs/algorithms.md, "Usage
			     * reported after the fact"): every check records
			     * its cost, even past its limit (cost may exceed
			     * limit), and all_allowed is true; no concurrency
			     * check */
	int64_t *overdrawn; /* a report: n values the store fills with
			     * the units each check's usage is past its
			     * limit after the call (0 when within;
			     * docs/algorithms.md); may be NULL */

	/* Set by the store before done runs.  rc is 0 with out[] and
	 * all_allowed: true iff every non-shadow check allows, in which case
	 * the cost was recorded for each allowing check.  rc is -1 with kind
	 * and err when the call failed (nothing is known to be recorded). */
	int rc;
	bool all_allowed;
	int64_t waited_us; /* all_allowed by a reservation: the
			    * store time from now until it (> 0);
			    * else 0 */
	int64_t sent_us;   /* monotonic: when the store last sent the
			    * call's command; 0 if it sent none (the
			    * memory store, a call failed before) */
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX];

	/* Owned by the store the call was submitted to, from submit until
	 * done runs; nothing else reads or writes it. */
	struct backend_call_store store;
};

struct backend;

struct backend_ops {
	/* Take call; run call->done(call) exactly once, inside this function
	 * or later on the store's thread, by call->deadline_us.  Any thread,
	 * concurrently. */
	void (*submit)(struct backend *b, struct backend_call *call);
	/* Stop the store's threads, answering every call in its hands (as
	 * failed), then free everything.  No submit may run meanwhile or
	 * after. */
	void (*free)(struct backend *b);

	/* A store with I/O of its own (Redis) may let an event loop run it
	 * on the loop's thread, so that a request is sent, answered and
	 * resumed without waking another thread.  NULL for a store without
	 * (memory).  host_adopt stops the store's own I/O thread (nothing in
	 * its hands is lost) and returns a descriptor that polls readable
	 * when the store has work.  From then on the loop calls host_turn
	 * when that descriptor is readable, when the delay the last turn
	 * returned (ms; -1: none) has passed, and after its own handlers
	 * ran (it is not woken for calls it submits itself); poll is false
	 * when the loop knows the descriptor was not readable, and the turn
	 * then does not look.  host_release
	 * gives the I/O back to a new own thread (0, or -1 with err); the
	 * loop calls it before it ends, and before free.  All three on the
	 * hosting thread; one host at a time. */
	int (*host_adopt)(struct backend *b);
	int (*host_turn)(struct backend *b, bool poll);
	int (*host_release)(struct backend *b, char *err, size_t errlen);
};

struct backend {
	const struct backend_ops *ops;
	const char *name;      /* "memory", "redis" */
	bool completes_inline; /* done always runs inside submit */
};

static inline void
backend_submit(struct backend *b, struct backend_call *call)
{
	b->ops->submit(b, call);
}

/* backend_free(NULL) does nothing. */
static inline void
backend_free(struct backend *b)
{
	if (b != NULL)
		b->ops->free(b);
}

/*
 * The blocking forms, for callers that may wait (tests, tools; not the
 * event loops): evaluate n checks within the store's timeout.
 * backend_decide returns 0 with out[] and *all_allowed, or -1 with *kind
 * and a message in err.  Any thread.
 */
int backend_decide(struct backend *b, const struct rl_check *checks, size_t n,
    struct rl_result *out, bool *all_allowed, enum backend_error_kind *kind,
    char *err, size_t errlen);
/* One admin call (docs/admin.md), waiting for the store: 0 with *a's
 * answer (a->reply to free with rl_free), or -1 with *kind and err.
 * Any thread that may block. */
int backend_admin_call(struct backend *b, struct backend_admin *a,
    enum backend_error_kind *kind, char *err, size_t errlen);
/* True iff the store answers a probe within its timeout.  Any thread. */
bool backend_is_ready(struct backend *b);

/* Stable names ("connect", ...) for logs and metric labels. */
static inline const char *
backend_error_kind_name(enum backend_error_kind kind)
{
	static const char *const names[] = {
		[BACKEND_ERR_NONE] = "none",
		[BACKEND_ERR_CONNECT] = "connect",
		[BACKEND_ERR_TIMEOUT] = "timeout",
		[BACKEND_ERR_PROTOCOL] = "protocol",
		[BACKEND_ERR_FULL] = "full",
		[BACKEND_ERR_CIRCUIT_OPEN] = "circuit_open",
		[BACKEND_ERR_TLS] = "tls",
		[BACKEND_ERR_DEADLINE] = "deadline",
	};

	if ((unsigned)kind >= sizeof(names) / sizeof(names[0]))
		return "unknown";
	return names[kind];
}

#endif
