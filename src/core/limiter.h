/*
 * limiter.h - the four algorithms of docs/algorithms.md applied to one key's
 * state, for the in-process store (backend_memory.c, and the fallback of
 * on_backend_error: local).  The Redis store runs the same algorithms as Lua;
 * both follow docs/algorithms.md to the letter, including the order of the
 * double arithmetic, so a request gets the same answer from either store.
 *
 * Pure: no locks, no I/O, no clock (the caller passes `now`, microseconds,
 * 0 <= now < 2^53), no global state.  One store call on one key is:
 *
 *	limiter_check()   phase 1: expire, check; records nothing
 *	limiter_record()  phase 2: only if the request is admitted overall
 *	limiter_result()  remaining, reset_ms, retry_after_ms, effective_ms
 *	                  after the call
 *	limiter_expiry()  from when on the state changes no answer (reclaim)
 *
 * limiter_take() is the three in one for a rule evaluated alone.
 * concurrency (leases, limiter_concurrency.c) adds limiter_lease_release()
 * and limiter_lease_renew(), the calls of POST /release and /renew.
 *
 * Threads: a state is plain data.  The caller serialises every call on one
 * state (the memory store holds the lock of the state's stripe); different
 * states may be used from different threads at once.
 */
#ifndef RL_LIMITER_H
#define RL_LIMITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/rules.h"

#define LIMITER_SW_BUCKETS 20 /* B of sliding_window */
/* Counts and times stay exact in doubles below 2^53 (the Lua side has only
 * doubles), which bounds the limit and the window. */
#define LIMITER_MAX_LIMIT     (INT64_C(1) << 53)
#define LIMITER_MAX_WINDOW_MS INT64_C(1000000000000) /* ~31 years */
/* Reports may record past L (docs/algorithms.md, "Usage reported after the
 * fact"): a token_bucket tat runs at most LIMITER_MAX_AHEAD_US after the
 * time it is recorded at (~142 years, past any window), and a report's
 * overdrawn is at most LIMITER_MAX_UNITS, so every time difference and
 * count stays exact in Lua's doubles and fits an int64_t. */
#define LIMITER_MAX_AHEAD_US (INT64_C(1) << 52)
#define LIMITER_MAX_UNITS    LIMITER_MAX_LIMIT

/* A lease token: LIMITER_TOKEN_LEN lower-case hex digits (128 bits). */
#define LIMITER_TOKEN_LEN 32
/* Waiting (docs/algorithms.md, "Waiting for a turn"): a concurrency check
 * admits at a reserved time t only while the lease it takes at the
 * decision has at least this long left (t <= now + W - 1 ms). */
#define LIMITER_LEASE_LEFT_US INT64_C(1000)

/* A rule's parameters as the algorithms see them.  Fill with
 * limiter_params_set(). */
struct limiter_params {
	enum rl_algorithm algorithm;
	int64_t limit;	   /* L, 1 .. LIMITER_MAX_LIMIT */
	int64_t window_us; /* W = window_ms * 1000 */
	/* concurrency only: the token of the lease this call records
	 * (LIMITER_TOKEN_LEN hex digits), borrowed for the call; set by the
	 * caller after limiter_params_set(), which leaves it NULL. */
	const char *token;
};

/* concurrency: one lease, holding `cost` units until `expires`. */
struct limiter_lease {
	int64_t expires;
	int64_t cost;
	char token[LIMITER_TOKEN_LEN + 1];
};

/* sliding_log: `n` units admitted at the same microsecond `t`. */
struct limiter_run {
	int64_t t;
	int64_t n;
};

/*
 * One key's state.  The fields are private to limiter.c; they are in the
 * header so that a store can embed a state in its own entries.  A state may
 * own heap memory (sliding_log runs, sliding_window counts): release it with
 * limiter_state_clear().  A state built by one algorithm and then used with
 * another is reset first, and one built under another limit or window keeps
 * its history (docs/algorithms.md says how each algorithm reads it).
 */
struct limiter_state {
	enum rl_algorithm algorithm; /* the algorithm that built it */
	union {
		struct { /* sliding_log: ring of runs, by t */
			struct limiter_run *runs;
			size_t cap, head, len;
			int64_t used; /* sum of n over the runs */
		} log;
		struct {	       /* fixed_window */
			int64_t start; /* s */
			int64_t n;
		} fixed;
		struct {	    /* token_bucket */
			double tat; /* -HUGE_VAL: absent */
		} bucket;
		struct {		 /* sliding_window */
			int64_t *counts; /* B + 1 slots, or NULL */
			int64_t newest;	 /* slots hold newest-B .. newest */
		} window;
		struct { /* concurrency: unordered leases */
			struct limiter_lease *leases;
			size_t cap, len;
			int64_t used; /* sum of cost over the leases */
		} conc;
	} u;
};

/* Validate limit (1 .. LIMITER_MAX_LIMIT) and window_ms
 * (1 .. LIMITER_MAX_WINDOW_MS) and fill *p.  Returns 0, or -1 with a
 * message in err. */
int limiter_params_set(struct limiter_params *p, enum rl_algorithm alg,
    int64_t limit, int64_t window_ms, char *err, size_t errlen);

/* Make *s an empty state of algorithm alg.  Owns nothing yet. */
void limiter_state_init(struct limiter_state *s, enum rl_algorithm alg);

/* Free what *s owns and make it empty again (same algorithm).  Safe on an
 * initialised state any number of times. */
void limiter_state_clear(struct limiter_state *s);

/*
 * Phase 1 for a request of `cost` (0 <= cost <= p->limit) at `now`: reset
 * the state if it was built by another algorithm, drop what has expired,
 * and set *allowed to whether the rule alone admits the request.  When it
 * does and cost > 0, the memory limiter_record() needs is allocated here,
 * so that recording cannot fail.  Returns 0, or -1 with a message in err
 * (out of memory: nothing recorded, the state is still valid).
 */
int limiter_check(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, bool *allowed, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * Phase 2: record `cost` at `now`.  Only right after limiter_check() on the
 * same state with the same p, now and cost said *allowed; cannot fail.
 * cost 0 records nothing.
 */
void limiter_record(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost);

/*
 * The results of the call at `now`, after limiter_check() and, if the
 * request was admitted overall, limiter_record(): out->allowed = allowed
 * (phase 1's answer), and remaining, reset_ms, retry_after_ms and
 * effective_ms as docs/algorithms.md defines them.  recorded: limiter_record()
 * ran in this call (sliding_window's est' is phase 1's est + c, in that order).
 */
void limiter_result(const struct limiter_state *s,
    const struct limiter_params *p, int64_t now, int64_t cost, bool allowed,
    bool recorded, struct rl_result *out);

/*
 * The units by which the usage of *s is past p->limit at `now`, after the
 * call limiter_result() describes (same cost and recorded): 0 when within
 * it (docs/algorithms.md, "Usage reported after the fact").  Pure.
 */
int64_t limiter_overdrawn(const struct limiter_state *s,
    const struct limiter_params *p, int64_t now, int64_t cost, bool recorded);

/*
 * The time (microseconds) from which on *s no longer changes any answer
 * under p: the TTL of docs/algorithms.md as an absolute time.  INT64_MIN
 * iff the state is empty (or was built by another algorithm than p's).
 * Like Redis, a store sets a key's expiry when it records in it, keeps it
 * when a call only reads, deletes an empty state, and treats a state as
 * absent from its expiry on.
 */
int64_t limiter_expiry(const struct limiter_state *s,
    const struct limiter_params *p);

/* Bytes used by *s: the struct and the heap memory it owns. */
size_t limiter_state_bytes(const struct limiter_state *s);

/*
 * One rule alone: limiter_check(), limiter_record() if allowed, then
 * limiter_result() into *out.  Returns 0, or -1 with a message in err
 * (out of memory; nothing recorded).
 */
int limiter_take(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, struct rl_result *out, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * concurrency: free the lease `token` holding `cost` units of *s at now
 * (expired leases are dropped first).  Returns true iff it was held.
 * A state of another algorithm holds no lease: false.
 */
bool limiter_lease_release(struct limiter_state *s, int64_t now,
    const char *token, int64_t cost);

/*
 * concurrency: give the lease `token` holding `cost` units a full window
 * of p (expires at now + W).  Returns true iff it was held (not expired).
 */
bool limiter_lease_renew(struct limiter_state *s,
    const struct limiter_params *p, int64_t now, const char *token,
    int64_t cost);

/*
 * Waiting (docs/algorithms.md, "Waiting for a turn").  After
 * limiter_check() at `now` (which dropped what expired), the earliest time
 * t >= max(from, now) at which the rule admits `cost`, counting the units
 * reserved after now, and never before the newest reservation (first come,
 * first served).  INT64_MAX when the rule never waits (sliding_window: now
 * if it admits now, else INT64_MAX).  concurrency: `from` if it admits now
 * and from <= now + W - LIMITER_LEASE_LEFT_US (its lease, taken at now,
 * is still held then), else INT64_MAX.  Pure.
 */
int64_t limiter_earliest(const struct limiter_state *s,
    const struct limiter_params *p, int64_t now, int64_t from, int64_t cost);

/* Make sure limiter_record_at() cannot fail on *s (grow the sliding_log
 * ring).  Returns 0, or -1 with a message in err (nothing changed). */
int limiter_reserve_room(struct limiter_state *s,
    const struct limiter_params *p, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Record `cost` at t >= now, a time limiter_earliest() gave for every rule
 * of the request; after limiter_reserve_room().  sliding_window records
 * in the bucket of now. */
void limiter_record_at(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t t, int64_t cost);

/*
 * Taking quota in advance (docs/algorithms.md, "Taking quota in advance").
 * Instead of limiter_record() for a check that asks for a chunk: record
 * k = cost + min(want - cost, floor(F / LIMITER_PREFETCH_SHARE)) units,
 * F being the units still free after cost, so that units admitted up to
 * *valid_us after now keep the algorithm's guarantee (sliding_log at
 * max(now + hold, newest), token_bucket as if taken at now + hold,
 * fixed_window and sliding_window never past the window's or bucket's
 * end).  Same preconditions as limiter_record() with cost >= 1 and
 * want >= cost; cannot fail.  Returns k; then limiter_result() with cost
 * k and recorded gives the call's results.
 */
#define LIMITER_PREFETCH_SHARE 8
int64_t limiter_chunk(struct limiter_state *s, const struct limiter_params *p,
    int64_t now, int64_t cost, int64_t want, int64_t hold_us,
    int64_t *valid_us);

#endif
