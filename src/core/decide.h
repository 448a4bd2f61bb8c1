/*
 * decide.h - turns one request (attributes, an optional forced rule and
 * cost) into one decision under one config snapshot: which rules apply,
 * their keys, one atomic backend call, the failure policy, and the deciding
 * rule (docs/algorithms.md, docs/http.md, docs/operations.md).  No HTTP here;
 * the front ends map a decision to their answer.  Every front end takes this
 * one path.
 *
 * A decision has two halves.  decide_prepare() does everything that needs
 * no store: the rules that apply, their keys and costs, the checks, and the
 * deny cache; it answers at once when that settles it.  Otherwise it gives
 * a job, and decide_run() hands the job to the store and completes the
 * decision when the store answers (the failure policy, the local store,
 * the deciding rule), then tells the caller.  With Redis that completion
 * runs on the store's I/O thread, so no thread waits for Redis.
 */
#ifndef RL_DECIDE_H
#define RL_DECIDE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/rules.h"

/*
 * One of several attribute sets decided together (a gRPC call's
 * descriptors, docs/grpc.md): its attributes and its cost (-1: each rule's
 * own default cost).
 */
struct decide_group {
	const struct attrs *attrs;
	int64_t cost;
};

/*
 * What one group's rules did, for a front end that answers per group.
 * rule is the group's deciding rule among its own (as docs/http.md picks
 * one for a request), NULL when none applies to the group or the backend
 * was not asked (policy allow); allowed is false iff one of its own
 * non-shadow rules denied.  When another group denied, the numbers are
 * what is left now: nothing was recorded.
 */
struct decide_group_result {
	const struct rule *rule;
	bool allowed;
	int64_t limit, remaining, reset_ms, retry_after_ms;
	int64_t window_ms; /* the rule's, or an override's (docs/admin.md) */
};

/* What a request asks.  Everything borrowed for the call. */
struct decide_request {
	const struct attrs *attrs;
	const char *rule;    /* evaluate only this rule (skip match); or NULL */
	int64_t cost;	     /* -1: each rule's own default cost */
	int64_t start_us;    /* monotonic: the request's arrival, from
			      * which the store's timeout runs; 0: now */
	int64_t deadline_us; /* monotonic: the caller's own tighter
			      * bound (grpc-timeout); 0: none.  Past it
			      * first: DECIDE_DEADLINE_EXCEEDED */
	int64_t wait_ms;     /* docs/waiting.md: 0 answers now; else the store
			      * may reserve a time within wait_ms (one
			      * attribute set only) */
	/*
	 * Or, when ngroups > 0, several attribute sets in one decision
	 * (attrs, rule and cost are then unused): the rules that apply to
	 * each group all join one all-or-nothing store call, a rule whose
	 * key two groups share is checked once with their costs added, and
	 * group_out[i] (ngroups of them, filled when the decision is final
	 * with status DECIDE_OK) tells what group i's rules did.
	 */
	const struct decide_group *groups;
	size_t ngroups;
	struct decide_group_result *group_out;
	/*
	 * docs/leases.md: true for POST /acquire, whose client can release.
	 * Then concurrency rules apply and an allowed decision carries the
	 * leases taken; else (/auth, gRPC) concurrency rules are skipped.
	 */
	bool leases;
	/*
	 * docs/http.md, POST /report: record the cost in every applying
	 * rule that is neither shadow nor concurrency, even past its limit
	 * (a cost above a rule's limit is no error), and never deny;
	 * out->reported tells what each rule has left.  No deny cache, no
	 * waiting, no rule hook (the front counts reports itself).
	 */
	bool report;
};

/* One rule a report recorded in (decision.reported). */
struct decide_reported {
	const struct rule *rule; /* borrowed from the config snapshot */
	int64_t limit, remaining, overdrawn;
};

/* A lease one allowed request took (docs/leases.md). */
struct decide_lease {
	const struct rule *rule; /* borrowed from the config snapshot */
	char *lease;		 /* the lease string (lease.h); owned */
	int64_t held_until_us;	 /* monotonic: the store holds the lease
				  * at least until then, the key's window
				  * from when the call left for the store
				  * (the store took it later) */
};

enum decide_status {
	DECIDE_OK = 0,
	DECIDE_UNKNOWN_RULE,	    /* 400 unknown_rule */
	DECIDE_COST_EXCEEDS_LIMIT,  /* 400 cost_exceeds_limit */
	DECIDE_INVALID_COST,	    /* 400 invalid_cost: a report's costs of
				     * one key past 2^53 */
	DECIDE_KEY_TOO_LONG,	    /* 400 key_too_long */
	DECIDE_BACKEND_UNAVAILABLE, /* 503, on_backend_error: deny */
	DECIDE_INTERNAL,	    /* 500, out of memory */
	DECIDE_DEADLINE_EXCEEDED    /* the caller's own deadline (deadline_us)
				     * passed before the store answered;
				     * no policy applies */
};

/* Outcome of one applying rule, for metrics and the access log. */
enum decide_rule_result {
	DECIDE_RULE_ALLOWED,
	DECIDE_RULE_DENIED,	   /* denied, or not recorded: another denied */
	DECIDE_RULE_SHADOW_DENIED, /* a shadow rule that would deny */
	DECIDE_RULE_DEGRADED,	   /* answered without the backend */
	DECIDE_RULE_ERROR	   /* backend failed, policy deny */
};

#define DECIDE_MESSAGE_MAX 256
/* Attribute sets in one request, at most. */
#define DECIDE_MAX_GROUPS 64

struct decision {
	enum decide_status status;
	char message[DECIDE_MESSAGE_MAX]; /* for status != DECIDE_OK */
	/* With groups and DECIDE_KEY_TOO_LONG or DECIDE_COST_EXCEEDS_LIMIT:
	 * the groups (group i is bit i) whose rule failed: its key, or a
	 * cost over its limit (the costs of every group sharing the key).
	 * Nothing was decided for any group. */
	uint64_t failed_groups;

	bool allowed;
	bool degraded; /* the backend failed; policy allow or local */
	enum backend_error_kind backend_error; /* when the backend failed */
	const struct rule *rule; /* deciding rule, NULL if none applies;
				  * borrowed from the config snapshot */
	int64_t limit, remaining, reset_ms, retry_after_ms;
	int64_t effective_ms; /* the deciding rule's (struct rl_result) */
	int64_t window_ms;    /* the deciding key's window (an override's,
			       * docs/admin.md); 0: the rule's */
	bool shadow;	      /* the deciding rule is a shadow rule */
	/* With req->leases: one per concurrency rule that recorded, when a
	 * store allowed: the configured one, or the local one of
	 * on_backend_error: local (degraded; the lease is held there).  Not
	 * under policy allow.  Owned: decide_leases_free(). */
	struct decide_lease *leases;
	size_t nleases;
	/* With req->report, when the store recorded (not policy allow):
	 * one row per rule recorded in.  Owned: decide_leases_free(). */
	struct decide_reported *reported;
	size_t nreported;
	int64_t waited_ms; /* allowed by a reservation this far ahead
			    * (store time): answer then; else 0 */
	/*
	 * docs/leases.md with wait_ms: denied by a concurrency rule while every
	 * other rule that denied could admit the request within wait_ms, so
	 * it may wait for a lease to be freed.  lease_key is lease_key_hash()
	 * of that rule's key, lease_retry_ms the time until its oldest lease
	 * expires.
	 */
	bool lease_wait;
	uint64_t lease_key;
	int64_t lease_retry_ms;
};

/* Free out's leases and reported rows (safe on any decision, any number
 * of times). */
void decide_leases_free(struct decision *out);

/*
 * docs/leases.md: what an answer sent at at_us (monotonic) says of lease
 * l, its expires_ms: the milliseconds the store still holds it then, a
 * part of one counted whole, never below 0.  Pure; any thread.
 */
int64_t decide_lease_left_ms(const struct decide_lease *l, int64_t at_us);

/*
 * Does every lease of out have at least 1 ms (1000 us) left at at_us?  False
 * when one would be answered with nothing left: the store may have let it go,
 * and another request taken its units.  A shadow rule's lease limits
 * nothing and is not looked at.  True without leases.  Pure; any thread.
 */
bool decide_leases_held(const struct decision *out, int64_t at_us);

/*
 * Called once per applying rule after the decision, e.g. to count it.
 * May be NULL.
 */
typedef void (*decide_rule_fn)(const struct rule *r,
    enum decide_rule_result result, void *arg);

/* Called after each backend call with its duration; may be NULL.  Of
 * usec, queued_usec passed before the store sent the call (its queue, on
 * the store's side), or -1 when the store does not tell (one that answers
 * inline). */
typedef void (*decide_backend_fn)(const char *backend, int64_t usec,
    int64_t queued_usec, enum backend_error_kind kind, void *arg);

/* Units of a rule taken in a chunk beyond the request that took them
 * (used false), or used by a request admitted in process (used true):
 * docs/algorithms.md, "Taking quota in advance".  May be NULL. */
typedef void (*decide_prefetch_fn)(const struct rule *r, bool used,
    int64_t units, void *arg);

struct deny_cache;
struct overrides;
struct prefetch;

/* The long-lived parts a decision needs.  Borrowed; set up by main.c. */
struct decider {
	struct backend *backend;     /* the configured store */
	struct backend *local;	     /* in-process store for
				      * on_backend_error: local; may be NULL */
	struct deny_cache *deny;     /* keys denied lately; may be NULL.
				      * Used only for a store that does not
				      * answer inline. */
	struct overrides *overrides; /* limits per key (docs/admin.md);
				      * may be NULL */
	decide_rule_fn on_rule;
	decide_backend_fn on_backend;
	void *hook_arg; /* passed to the hooks */
	/* Quota taken in advance for the rules with prefetch
	 * (docs/algorithms.md, "Taking quota in advance"); may be NULL:
	 * then every request asks the store. */
	struct prefetch *prefetch;
	decide_prefetch_fn on_prefetch;
};

struct decide_job;
typedef void (*decide_done_fn)(void *arg);

/*
 * The first half.  Returns 0 when *out is final already (a validation
 * error, no rule applies, a denial from the deny cache, or every check
 * admitted from quota held in advance: d->prefetch), else 1 with a
 * job for decide_run().  A request that fails validation never touches a
 * store.  cfg, req's strings and out are borrowed until the decision is
 * final.  Any thread.
 */
int decide_prepare(const struct decider *d, const struct config *cfg,
    const struct decide_request *req, struct decision *out,
    struct decide_job **job);

/*
 * The second half: one store call for the job, then *out is final and
 * done(arg) runs, exactly once: inside this call when the store answers
 * inline (d->backend->completes_inline) or fails at once, else later on
 * the store's thread.  The job is freed before done runs.
 */
void decide_run(struct decide_job *job, decide_done_fn done, void *arg);

/* The lease_key_hash() of each concurrency key the job would take a
 * lease on, at most max of them into keys; returns how many. */
size_t decide_job_lease_keys(const struct decide_job *job, uint64_t *keys,
    size_t max);

/*
 * Before decide_run(): the job takes no lease.  Each of its concurrency
 * checks only looks, and is denied (rl_check.token NULL), while its other
 * rules are asked as ever: a request queued behind others that wait for
 * a lease learns whether they would let it wait (decision.lease_wait)
 * without taking a lease freed for those before it (docs/leases.md).
 */
void decide_job_look_leases(struct decide_job *job);

/* Drop a job that will not run (the caller answers otherwise). */
void decide_cancel(struct decide_job *job);

/*
 * Both halves, waiting for the store (tests, tools).  Fills *out; returns
 * 0 when a decision (allowed or denied, possibly degraded) was made, -1
 * when out->status says why not.  Any thread that may block.
 */
int decide(const struct decider *d, const struct config *cfg,
    const struct decide_request *req, struct decision *out);

/* Stable names: "unknown_rule", ... for the JSON error field. */
const char *decide_status_code(enum decide_status s);

#endif
