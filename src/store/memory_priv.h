/*
 * memory_priv.h - what backend_memory.c (a call) and memory_table.c (the
 * table it runs on) share: the store's structure, a call's view of one
 * check, and the table's functions.  Nothing else includes it.
 *
 * Thread: a stripe's fields under its lock; the store's counters atomic.
 */
#ifndef RL_STORE_MEMORY_PRIV_H
#define RL_STORE_MEMORY_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/backend.h"
#include "core/limiter.h"
#include "store/memory.h"
#include "store/memory_stats.h"

#define MEMORY_STRIPE_BITS     6
#define MEMORY_STRIPES	       (1 << MEMORY_STRIPE_BITS) /* 64: a uint64_t */
#define MEMORY_INITIAL_BUCKETS 16	 /* per stripe, a power of two */
#define MEMORY_SWEEP_CHAINS    2	 /* chains swept per insert */
#define MEMORY_STEP_CHAINS     8	 /* chains swept per call: one line */
#define MEMORY_SMALL_CALL      16	 /* checks handled without malloc */
#define MEMORY_PINNED	       INT64_MAX /* expiry of an entry in use */
/* At most one full sweep a second when the store is full. */
#define MEMORY_FULL_SWEEP_US 1000000

struct memory_entry {
	struct memory_entry *next; /* hash chain */
	uint64_t hash;
	int64_t expires; /* limiter_expiry(), or MEMORY_PINNED */
	struct limiter_state state;
	size_t keylen;
	char key[]; /* keylen bytes, not NUL-terminated */
};

struct memory_stripe {
	pthread_mutex_t lock;
	struct memory_entry **buckets; /* nbuckets chains */
	size_t nbuckets;	       /* a power of two */
	size_t count;		       /* entries in this stripe */
	size_t sweep;		       /* next chain to sweep */
	int64_t soonest;	       /* no entry expires before it */
	int64_t cycle_soonest;	       /* the same, of this sweep round */
};

/* A stripe on cache lines of its own, so locking one stripe does not slow
 * down its neighbours. */
union memory_stripe_slot {
	struct memory_stripe s;
	char pad[128];
};
_Static_assert(sizeof(struct memory_stripe) <= 128, "stripe padding");

struct memory_backend {
	struct backend base; /* first: a struct backend * is one */
	backend_clock_fn clock;
	void *clock_arg;
	int64_t max_keys;	      /* < 1: no bound */
	atomic_llong nkeys;	      /* entries in every stripe */
	atomic_llong last_full_sweep; /* clock time of the last one */
	atomic_llong last_full_log;   /* monotonic us of the last "full" line */
	atomic_llong full_unlogged;   /* full answers since that line */
	uint64_t seed[2];	      /* SipHash key */
	struct memory_stats *stats;   /* the stat keys (memory_stats.c) */
	union memory_stripe_slot stripes[MEMORY_STRIPES];
	struct memory_clock own_clock; /* clock_arg when none is injected */
};

/* What one decide() call knows about one of its checks. */
struct memory_slot {
	struct limiter_params params;
	uint64_t hash;
	struct memory_entry *entry;
	int64_t prev_expires; /* the entry's expiry before the call;
			       * INT64_MIN: new or reset; MEMORY_PINNED:
			       * an earlier slot of the call has it */
	bool allowed;
	bool admits_now; /* phase 1's allowed, when waiting moved allowed to
			  * the reserved time */
	bool recorded;
};

/* Outcomes of one locked attempt at a call. */
enum memory_attempt {
	MEMORY_OK = 0,
	MEMORY_ERROR = -1, /* kind and err are set */
	MEMORY_FULL = -2   /* at max_keys: sweep everything and retry */
};

/* --- the table (memory_table.c) ---------------------------------------- */

/* SipHash-2-4 (Aumasson and Bernstein) of len bytes under key k. */
uint64_t memory_siphash(const uint64_t k[2], const unsigned char *in,
    size_t len);

static inline unsigned
memory_stripe_of(uint64_t hash)
{
	return (unsigned)(hash >> (64 - MEMORY_STRIPE_BITS));
}

/* The entry of key in st, or NULL; st's lock held. */
static inline struct memory_entry *
memory_lookup(struct memory_stripe *st, uint64_t hash, const char *key,
    size_t keylen)
{
	struct memory_entry *e;

	for (e = st->buckets[hash & (st->nbuckets - 1)]; e != NULL; e = e->next)
		if (e->hash == hash && e->keylen == keylen &&
		    memcmp(e->key, key, keylen) == 0)
			return e;
	return NULL;
}

/* Unlink and free e; st's lock held. */
void memory_remove(struct memory_backend *m, struct memory_stripe *st,
    struct memory_entry *e);
/* An entry of st was given the expiry t; st's lock held. */
void memory_note_expiry(struct memory_stripe *st, int64_t t);
/* A new, pinned, empty entry for check c in st (its lock held):
 * MEMORY_OK with *out, MEMORY_FULL (max_keys reached) or MEMORY_ERROR
 * (out of memory, with err). */
enum memory_attempt memory_insert(struct memory_backend *m,
    struct memory_stripe *st, const struct rl_check *c,
    const struct memory_slot *slot, int64_t now, struct memory_entry **out,
    char *err, size_t errlen);
/* Lock (in ascending order) or unlock the stripes of mask. */
void memory_lock_mask(struct memory_backend *m, uint64_t mask);
void memory_unlock_mask(struct memory_backend *m, uint64_t mask);
/* Free every expired entry of every stripe, one stripe locked at a time;
 * holding none. */
void memory_sweep_all(struct memory_backend *m);
/* One step of the sweep that moves with the traffic; holding no stripe. */
void memory_sweep_step(struct memory_backend *m);
/* True if a full sweep may run now (at most one per MEMORY_FULL_SWEEP_US). */
bool memory_may_sweep_all(struct memory_backend *m);

#endif
