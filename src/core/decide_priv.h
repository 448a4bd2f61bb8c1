/*
 * decide_priv.h - what decide.c shares with decide_prefetch.c and
 * decide_lease.c: a job (what the store call borrows, from prepare to
 * completion) and the steps of prepare and completion those files take.
 * Nothing else includes it.
 *
 * Thread: a job belongs to one thread at a time, the one that prepares
 * it, then the one that completes it (decide.c).
 */
#ifndef RL_DECIDE_PRIV_H
#define RL_DECIDE_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/decide.h"
#include "core/limiter.h"
#include "core/rules.h"

/* Requests with few applying rules (nearly all) use the stack. */
#define DECIDE_STACK_RULES 8

struct applying {
	const struct rule *rule;
	size_t keyoff; /* the key's offset in the key arena */
	size_t keylen;
	uint64_t groups;   /* bit g: group g's (with req->groups) */
	size_t tokoff;	   /* concurrency: its lease token's offset in
			    * the key arena; else SIZE_MAX */
	int64_t pf_units;  /* units taken from what the daemon holds (the
			    * check is then answered in process); else 0 */
	int64_t pf_until;  /* their deadline (prefetch_put_back) */
	uint64_t pf_stamp; /* prefetch_stamp() before the take and the
			    * call: a counter reset since drops a chunk */
	uint64_t dc_stamp; /* deny_cache_stamp() when the store was
			    * asked: units given back since (a reset,
			    * a take-back) drop its denial */
	bool overridden;   /* its limit and window are an override's */
};

struct decide_job {
	const struct decider *d;
	const struct config *cfg;
	struct decision *out;
	decide_done_fn done;
	void *arg;
	struct backend_call call;
	bool on_local;		 /* the call went to the local store */
	bool leases;		 /* req->leases */
	bool report;		 /* req->report */
	int64_t req_start_us;	 /* req->start_us */
	int64_t req_deadline_us; /* req->deadline_us */
	int64_t submit_us;	 /* monotonic: when the store was asked */
	int64_t wait_us;	 /* docs/waiting.md; 0: no waiting */
	struct decide_group_result *group_out; /* ngroups, or NULL */
	size_t ngroups;
	size_t n;
	size_t nstore; /* checks[0..nstore) go to the store; the others
			* were answered from units held in advance */
	struct applying *ap;
	struct rl_check *checks;
	struct rl_result *res;
	int64_t *over; /* a report's overdrawn, n */
	char *arena;
	size_t arena_cap;
	struct decide_job *next_free; /* in its thread's cache */
	struct applying ap_small[DECIDE_STACK_RULES];
	struct rl_check ck_small[DECIDE_STACK_RULES];
	struct rl_result rs_small[DECIDE_STACK_RULES];
	int64_t ov_small[DECIDE_STACK_RULES];
};

/* out becomes a failure of status s with the formatted message; -1. */
int decide_fail(struct decision *out, enum decide_status s, const char *fmt,
    ...) __attribute__((format(printf, 3, 4)));

/* decide_prefetch.c: before the store, answer every check from units
 * held, or ask for chunks; returns the checks for the store (0: answered
 * in process).  The local store decides instead: no chunk.  Once the
 * decision is known: units used, chunks held. */
size_t decide_prefetch_plan(struct decide_job *job);
void decide_prefetch_no_chunks(struct decide_job *job);
void decide_prefetch_settle(struct decide_job *job, bool admitted);

/* decide_lease.c: the leases an allowed request took (out of memory: a
 * 500); whether a denied request may wait for one. */
void decide_take_leases(struct decide_job *job);
void decide_lease_wait_check(struct decide_job *job);

#endif
