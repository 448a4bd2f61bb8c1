/*
 * overrides_priv.h - what overrides.c (the table) and overrides_sync.c
 * (its sync with Redis) share: the table's structure and two helpers.
 * Nothing outside those two files includes it.
 *
 * Threads: the table's fields under its read-write lock, the sync's
 * under its mutex, as each field says.
 */
#ifndef RL_OVERRIDES_PRIV_H
#define RL_OVERRIDES_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/config_slot.h"
#include "core/overrides.h"

#define OV_CHAINS_MIN  256   /* a power of two */
#define OV_CHAINS_MAX  65536 /* past it, chains only grow longer */
#define OV_PRUNE_MIN   1024  /* entries before the first prune */
#define OV_DIRTY       64    /* rules marked one by one; past it, all */
#define OV_FREED_SLOTS 64    /* a power of two */

struct ov_group;

struct ov_entry {
	struct ov_entry *next;		 /* its chain */
	struct ov_entry *gnext, **gprev; /* its group's list */
	struct ov_group *group;
	uint64_t hash;
	int64_t limit, window_ms, expires_ms;
	size_t keylen;
	char key[]; /* the store key, not NUL-terminated */
};

/* One rule's entries: store keys "<name>:{...}", name "<prefix><rule>"
 * (NUL-terminated). */
struct ov_group {
	struct ov_group *next;
	struct ov_entry *head;
	unsigned long writes; /* o->writes at its last change */
	size_t namelen;
	char name[];
};

struct overrides {
	pthread_rwlock_t lock;
	struct ov_entry **chains;
	size_t nchains;		 /* a power of two; lock */
	struct ov_group *groups; /* lock */
	atomic_long count;
	long prune_at;	      /* prune when a new entry finds this many; lock */
	unsigned long writes; /* changes so far: set, delete, load; lock */
	/* writes when a rule without a group last changed (its group freed,
	 * or a delete found none), per slot of the rule's name; lock */
	unsigned long freed[OV_FREED_SLOTS];

	/* The sync (NULL backend: none started). */
	struct backend *backend;
	struct config_slot cfg;
	pthread_t thread;
	pthread_mutex_t mu; /* guards what follows */
	pthread_cond_t cond;
	pthread_cond_t read_cond; /* signalled when read_once is set */
	bool read_once;		  /* a full read (of every rule) ended */
	bool stop, all;
	atomic_bool stopping; /* stop, read without mu: the sync gives up
			       * its round between two calls to the store */
	bool joined;	      /* the thread ended (main thread only) */
	bool asked;	      /* a notice or a reload since the last round */
	char *dirty[OV_DIRTY];
	size_t ndirty;
	overrides_read_fn on_read; /* set before the sync starts */
	void *on_read_arg;
};

/* The next length-prefixed string of a reply (as overrides_load_rule()
 * reads it): 0, or -1 past its end. */
int ov_next_str(const char **p, const char *end, const char **s, uint32_t *n);

/* Free every expired entry now, and every entry of a rule the sync's
 * config does not have.  Takes the write lock.  The sync thread, after a
 * full read. */
void ov_prune_now(struct overrides *o);

#endif
