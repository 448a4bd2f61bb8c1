/*
 * overrides.c - the table of limits per key and its sync with Redis (see
 * overrides.h; docs/admin.md).
 *
 * DESIGN
 *
 * Hash chains under one read-write lock: decisions only read, and take
 * the lock only while the table holds something (an atomic count says
 * so), so a daemon without overrides pays one atomic load per rule.
 * Writers are the admin API and the sync, both rare.  The chains double
 * when they hold two entries each on average, so a lookup stays short up
 * to the bound.
 *
 * Each entry is also on its rule's list (a group: every store key that
 * begins "<prefix><rule>:{"), so listing or replacing one rule's overrides
 * visits that rule's entries only, never the whole table under the write
 * lock.  A load (the sync's, every 5 s on every daemon) parses and
 * allocates the new entries first, takes the write lock only to unlink
 * the old ones and link the new (no malloc or free under it but when the
 * chains grow or the table is at its bound), and frees
 * the old after: with 100,000 entries the lock is held for about 2 ms
 * instead of about 30, which every decision would wait on.
 *
 * Bounded: at most OVERRIDES_MAX entries; a new one past it is refused
 * (ENOSPC).  An expired entry is no override (overrides_get() skips it)
 * and is freed by the next prune: a new entry prunes the whole table once
 * the count has doubled since the last prune (so a prune costs O(1) per
 * insertion over time), and again before refusing one at the bound; a
 * load skips expired fields; the sync prunes after every full read.
 * With Redis the entries of a rule a reload removed are freed too (at
 * the reload and after every full read), the hash keeping them; the
 * memory store keeps them, the only copy, and the admin API can still
 * list and delete them (docs/admin.md).
 *
 * The sync thread sleeps on a condition variable until a notice marks a
 * rule (or every rule) to be read again, or the full read falls due (an
 * absolute deadline, moved OVERRIDES_RESYNC_MS on only when a full read
 * is done, so notices arriving more often than that never put it off);
 * it then reads each marked rule's hash through the store, in pages
 * (HSCAN), one blocking admin call each (bounded by redis.timeout, which
 * a whole hash of 100,000 fields would not fit), and replaces that rule's
 * entries with the whole of what it read.  A read that fails is a warning
 * when it was part of a full read (so once per rule per period at most).  The
 * fields it found expired it asks Redis to drop, in batches, each only if it
 * still holds the value read (lua/override.lua's drop): the script's set and
 * del touch only their own field, so that a write costs Redis the same however
 * big the hash is, and the reads, which see every field anyway, keep the hash
 * clean.  A read that fails keeps what the table had.  So does a read that
 * another change of the rule's overrides overtook (the rule's count of
 * changes, its group's `writes`, moved while it was out; a change of another
 * rule does not move it, so that writes elsewhere never starve the long read
 * of a big hash): a write of this daemon's, or another read of the hash applied
 * first (the admin API's, or the sync's own). The reply may hold the hash from
 * before that change, and applied last it would take the change back until the
 * next read; the rule is marked to be read again instead.  So of two reads of
 * one hash that overlap, only the one applied first is applied, and the other
 * is read again.  A stop gives the round up between two calls to the
 * store, so that it waits for the one call under way at most.
 */
#include "core/overrides.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/util.h"
#include "core/config_slot.h"

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

/* FNV-1a of s after h: keys here come from operators, not from
 * clients. */
static uint64_t
ov_hash_on(uint64_t h, const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= UINT64_C(1099511628211);
	}
	return h;
}

static uint64_t
ov_hash(const char *s, size_t n)
{
	return ov_hash_on(UINT64_C(14695981039346656037), s, n);
}

/* The slot of o->freed of rule "<prefix><rule>". */
static size_t
ov_freed_slot(const char *prefix, const char *rule)
{
	uint64_t h = ov_hash(prefix, strlen(prefix));

	return ov_hash_on(h, rule, strlen(rule)) & (OV_FREED_SLOTS - 1);
}

static int64_t
ov_now(int64_t now_ms)
{
	return now_ms > 0 ? now_ms : util_realtime_us() / 1000;
}

static bool
ov_expired(const struct ov_entry *e, int64_t now_ms)
{
	return e->expires_ms != 0 && e->expires_ms <= now_ms;
}

struct overrides *
overrides_new(void)
{
	struct overrides *o;

	if ((o = rl_calloc(1, sizeof(*o))) == NULL)
		return NULL;
	if ((o->chains = rl_calloc(OV_CHAINS_MIN, sizeof(o->chains[0]))) ==
	    NULL) {
		rl_free(o);
		return NULL;
	}
	if (pthread_rwlock_init(&o->lock, NULL) != 0) {
		rl_free(o->chains);
		rl_free(o);
		return NULL;
	}
	o->nchains = OV_CHAINS_MIN;
	o->prune_at = OV_PRUNE_MIN;
	atomic_init(&o->count, 0);
	atomic_init(&o->stopping, false);
	return o;
}

/* The entry of key (the lock held), and where it hangs. */
static struct ov_entry **
ov_find(struct overrides *o, const char *key, size_t keylen, uint64_t h)
{
	struct ov_entry **pp = &o->chains[h & (o->nchains - 1)];

	for (; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->hash == h && (*pp)->keylen == keylen &&
		    memcmp((*pp)->key, key, keylen) == 0)
			break;
	return pp;
}

/* The group "<prefix><rule>" (the lock held; the write lock to create
 * it), or NULL: none (create false) or out of memory. */
static struct ov_group *
ov_group(struct overrides *o, const char *prefix, const char *rule, bool create)
{
	size_t plen = strlen(prefix), rlen = strlen(rule);
	struct ov_group *g;

	for (g = o->groups; g != NULL; g = g->next)
		if (g->namelen == plen + rlen &&
		    memcmp(g->name, prefix, plen) == 0 &&
		    memcmp(g->name + plen, rule, rlen) == 0)
			return g;
	if (!create || (g = rl_malloc(sizeof(*g) + plen + rlen + 1)) == NULL)
		return NULL;
	g->head = NULL;
	g->writes = 0; /* set by the change that made it */
	g->namelen = plen + rlen;
	memcpy(g->name, prefix, plen);
	memcpy(g->name + plen, rule, rlen);
	g->name[plen + rlen] = '\0';
	g->next = o->groups;
	o->groups = g;
	return g;
}

/* Free g if it holds nothing (the write lock held). */
static void
ov_group_drop_empty(struct overrides *o, struct ov_group *g)
{
	struct ov_group **pp;

	if (g->head != NULL)
		return;
	for (pp = &o->groups; *pp != NULL; pp = &(*pp)->next)
		if (*pp == g) {
			*pp = g->next;
			o->freed[ov_hash(g->name, g->namelen) &
			    (OV_FREED_SLOTS - 1)] = ++o->writes;
			rl_free(g);
			return;
		}
}

/* Count a change of rule's overrides (the write lock held): a read of
 * its hash begun before is not applied (overrides_load_rule()). */
static void
ov_changed(struct overrides *o, const char *prefix, const char *rule)
{
	struct ov_group *g = ov_group(o, prefix, rule, false);

	if (g != NULL)
		g->writes = ++o->writes;
	else
		o->freed[ov_freed_slot(prefix, rule)] = ++o->writes;
}

/* Put e at the head of g's list (the write lock held; its chain is the
 * caller's). */
static void
ov_group_push(struct ov_group *g, struct ov_entry *e)
{
	e->group = g;
	e->gnext = g->head;
	if (g->head != NULL)
		g->head->gprev = &e->gnext;
	e->gprev = &g->head;
	g->head = e;
}

/* Take e out of its chain, not out of its group's list, nor out of the
 * count (the write lock held); the caller counts it gone and frees it. */
static void
ov_unlink_chain(struct overrides *o, struct ov_entry *e)
{
	struct ov_entry **pp = ov_find(o, e->key, e->keylen, e->hash);

	*pp = e->next;
}

/* Unlink e, hanging at *pp of its chain, and free it (the write lock
 * held; its group stays, maybe empty). */
static void
ov_remove(struct overrides *o, struct ov_entry **pp, struct ov_entry *e)
{
	*pp = e->next;
	if (e->gnext != NULL)
		e->gnext->gprev = e->gprev;
	*e->gprev = e->gnext;
	rl_free(e);
	atomic_fetch_sub(&o->count, 1);
}

/* Free every entry of g (the write lock held); with only_expired, those
 * expired at now_ms. */
static void
ov_clear_group(struct overrides *o, struct ov_group *g, bool only_expired,
    int64_t now_ms)
{
	struct ov_entry *e, *next;

	for (e = g->head; e != NULL; e = next) {
		next = e->gnext;
		if (!only_expired || ov_expired(e, now_ms))
			ov_remove(o, ov_find(o, e->key, e->keylen, e->hash), e);
	}
}

/* Free every expired entry, and every group left empty but keep (the
 * write lock held). */
static void
ov_prune(struct overrides *o, int64_t now_ms, const struct ov_group *keep)
{
	struct ov_group *g, *next;

	for (g = o->groups; g != NULL; g = next) {
		next = g->next;
		ov_clear_group(o, g, true, now_ms);
		if (g != keep)
			ov_group_drop_empty(o, g);
	}
	o->prune_at = 2 * atomic_load(&o->count);
	if (o->prune_at < OV_PRUNE_MIN)
		o->prune_at = OV_PRUNE_MIN;
}

/* Twice the chains, when there are two entries per chain (the write lock
 * held): true when they grew.  Out of memory, the chains stay as they
 * are. */
static bool
ov_grow(struct overrides *o)
{
	size_t n = o->nchains * 2, i;
	struct ov_entry **chains, *e, *next;

	if (o->nchains >= OV_CHAINS_MAX ||
	    (size_t)atomic_load(&o->count) <= 2 * o->nchains ||
	    (chains = rl_calloc(n, sizeof(chains[0]))) == NULL)
		return false;
	for (i = 0; i < o->nchains; i++)
		for (e = o->chains[i]; e != NULL; e = next) {
			next = e->next;
			e->next = chains[e->hash & (n - 1)];
			chains[e->hash & (n - 1)] = e;
		}
	rl_free(o->chains);
	o->chains = chains;
	o->nchains = n;
	return true;
}

bool
overrides_get(struct overrides *o, const char *key, size_t keylen,
    int64_t now_ms, int64_t *limit, int64_t *window_ms)
{
	struct ov_entry *e;
	uint64_t h;
	bool found = false;

	if (o == NULL || atomic_load(&o->count) == 0)
		return false;
	now_ms = ov_now(now_ms);
	h = ov_hash(key, keylen);
	pthread_rwlock_rdlock(&o->lock);
	e = *ov_find(o, key, keylen, h);
	if (e != NULL && !ov_expired(e, now_ms)) {
		*limit = e->limit;
		if (e->window_ms > 0) /* 0: the rule's, as the caller has it */
			*window_ms = e->window_ms;
		found = true;
	}
	pthread_rwlock_unlock(&o->lock);
	return found;
}

/* Is there room for one more entry of keep at now_ms, pruning if it is
 * time to (the write lock held)? */
static bool
ov_room(struct overrides *o, int64_t now_ms, const struct ov_group *keep)
{
	long n = atomic_load(&o->count);

	if (n >= o->prune_at || n >= OVERRIDES_MAX) {
		ov_prune(o, now_ms, keep);
		n = atomic_load(&o->count);
	}
	return n < OVERRIDES_MAX;
}

/* Insert or replace key (a store key of g's: "<g->name>:{...}"), the
 * write lock held.  0, or -1 with errno ENOSPC (full) or ENOMEM. */
static int
ov_put(struct overrides *o, struct ov_group *g, const char *key, size_t keylen,
    int64_t limit, int64_t window_ms, int64_t expires_ms, int64_t now_ms)
{
	uint64_t h = ov_hash(key, keylen);
	struct ov_entry **pp = ov_find(o, key, keylen, h), *e = *pp;

	if (e == NULL) {
		if (!ov_room(o, now_ms, g)) {
			errno = ENOSPC;
			return -1;
		}
		if ((e = rl_malloc(sizeof(*e) + keylen)) == NULL) {
			errno = ENOMEM;
			return -1;
		}
		e->hash = h;
		e->keylen = keylen;
		memcpy(e->key, key, keylen);
		ov_group_push(g, e);
		/* pp may lie in an entry the prune freed: look again. */
		e->next = NULL;
		*ov_find(o, key, keylen, h) = e;
		atomic_fetch_add(&o->count, 1);
		ov_grow(o);
	}
	e->limit = limit;
	e->window_ms = window_ms;
	e->expires_ms = expires_ms;
	return 0;
}

/* "<prefix><rule>:{<key>}" into a new buffer; NULL: out of memory. */
static char *
ov_store_key(const char *prefix, const char *rule, const char *key,
    size_t keylen, size_t *len)
{
	size_t plen = strlen(prefix), rlen = strlen(rule);
	char *k;

	if ((k = rl_malloc(plen + rlen + keylen + 3)) == NULL)
		return NULL;
	memcpy(k, prefix, plen);
	memcpy(k + plen, rule, rlen);
	memcpy(k + plen + rlen, ":{", 2);
	memcpy(k + plen + rlen + 2, key, keylen);
	k[plen + rlen + 2 + keylen] = '}';
	*len = plen + rlen + keylen + 3;
	return k;
}

int
overrides_set(struct overrides *o, const char *prefix, const char *rule,
    const char *key, size_t keylen, int64_t limit, int64_t window_ms,
    int64_t expires_ms, int64_t now_ms)
{
	struct ov_group *g;
	size_t len = 0;
	char *k;
	int rc = -1;

	now_ms = ov_now(now_ms);
	if ((k = ov_store_key(prefix, rule, key, keylen, &len)) == NULL) {
		errno = ENOMEM;
		return -1;
	}
	pthread_rwlock_wrlock(&o->lock);
	if ((g = ov_group(o, prefix, rule, true)) == NULL)
		errno = ENOMEM;
	else if ((rc = ov_put(o, g, k, len, limit, window_ms, expires_ms,
		      now_ms)) < 0)
		ov_group_drop_empty(o, g);
	ov_changed(o, prefix, rule);
	pthread_rwlock_unlock(&o->lock);
	rl_free(k);
	return rc;
}

bool
overrides_delete(struct overrides *o, const char *prefix, const char *rule,
    const char *key, size_t keylen, int64_t now_ms)
{
	struct ov_entry **pp, *e;
	struct ov_group *g;
	bool live = false;
	size_t len = 0;
	char *k;

	now_ms = ov_now(now_ms);
	if ((k = ov_store_key(prefix, rule, key, keylen, &len)) == NULL)
		return false;
	pthread_rwlock_wrlock(&o->lock);
	pp = ov_find(o, k, len, ov_hash(k, len));
	if ((e = *pp) != NULL) {
		live = !ov_expired(e, now_ms);
		g = e->group;
		ov_remove(o, pp, e);
		ov_group_drop_empty(o, g);
	}
	ov_changed(o, prefix, rule);
	pthread_rwlock_unlock(&o->lock);
	rl_free(k);
	return live;
}

bool
overrides_limit_ok(enum rl_algorithm alg, int64_t limit, int64_t window_ms,
    char *err, size_t errlen)
{
	if (alg == RL_ALG_TOKEN_BUCKET && window_ms <= INT64_MAX / 1000 &&
	    limit > window_ms * 1000) {
		snprintf(err, errlen,
		    "token_bucket needs at least 1us of window per unit "
		    "(limit <= %" PRId64 " for a window of %" PRId64 " ms)",
		    window_ms * 1000, window_ms);
		return false;
	}
	return true;
}

int64_t
overrides_fit_limit(enum rl_algorithm alg, int64_t limit, int64_t window_ms)
{
	if (alg == RL_ALG_TOKEN_BUCKET && window_ms <= INT64_MAX / 1000 &&
	    limit > window_ms * 1000)
		return window_ms * 1000;
	return limit;
}

bool
overrides_has_room(struct overrides *o, const char *prefix, const char *rule,
    const char *key, size_t keylen, int64_t now_ms)
{
	size_t len = 0;
	char *k;
	bool room;

	now_ms = ov_now(now_ms);
	if ((k = ov_store_key(prefix, rule, key, keylen, &len)) == NULL)
		return false;
	pthread_rwlock_wrlock(&o->lock);
	room = *ov_find(o, k, len, ov_hash(k, len)) != NULL ||
	    ov_room(o, now_ms, NULL);
	pthread_rwlock_unlock(&o->lock);
	rl_free(k);
	return room;
}

size_t
overrides_count(struct overrides *o)
{
	return o != NULL ? (size_t)atomic_load(&o->count) : 0;
}

/* The count of rule's changes (the lock held): its group's last, or,
 * when it has none, the last change of a rule without a group in its
 * slot (so that a group made and freed since tells too; a rule of the
 * same slot may move it, which only reads the hash again). */
static unsigned long
ov_rule_writes(struct overrides *o, const char *prefix, const char *rule)
{
	struct ov_group *g = ov_group(o, prefix, rule, false);

	return g != NULL ? g->writes : o->freed[ov_freed_slot(prefix, rule)];
}

unsigned long
overrides_writes(struct overrides *o, const char *prefix, const char *rule)
{
	unsigned long n;

	pthread_rwlock_rdlock(&o->lock);
	n = ov_rule_writes(o, prefix, rule);
	pthread_rwlock_unlock(&o->lock);
	return n;
}

void
overrides_each(struct overrides *o, const char *prefix, const char *rule,
    int64_t now_ms, void (*fn)(const struct override_view *v, void *arg),
    void *arg)
{
	struct override_view v;
	struct ov_group *g;
	struct ov_entry *e;
	size_t at;

	pthread_rwlock_rdlock(&o->lock);
	if ((g = ov_group(o, prefix, rule, false)) != NULL)
		for (e = g->head, at = g->namelen + 2; e != NULL;
		     e = e->gnext) {
			if (ov_expired(e, now_ms))
				continue;
			v.key = e->key + at;
			v.keylen = e->keylen - at - 1;
			v.limit = e->limit;
			v.window_ms = e->window_ms;
			v.expires_ms = e->expires_ms;
			fn(&v, arg);
		}
	pthread_rwlock_unlock(&o->lock);
}

/* Is g the group of a rule of cfg (under cfg's key_prefix)? */
static bool
ov_configured(const struct ov_group *g, const struct config *cfg)
{
	size_t plen = strlen(cfg->redis.key_prefix);

	return g->namelen > plen &&
	    memcmp(g->name, cfg->redis.key_prefix, plen) == 0 &&
	    config_find_rule(cfg, g->name + plen) != NULL;
}

bool
overrides_has_rule(struct overrides *o, const char *prefix, const char *rule)
{
	bool has;

	if (o == NULL || atomic_load(&o->count) == 0)
		return false;
	pthread_rwlock_rdlock(&o->lock);
	has = ov_group(o, prefix, rule, false) != NULL;
	pthread_rwlock_unlock(&o->lock);
	return has;
}

size_t
overrides_unconfigured(struct overrides *o, const struct config *cfg,
    int64_t now_ms, char *buf, size_t len)
{
	size_t plen = strlen(cfg->redis.key_prefix), n = 0, at = 0;
	const struct ov_group *g;
	const struct ov_entry *e;
	long live;
	int w;

	if (len > 0)
		buf[0] = '\0';
	if (o == NULL)
		return 0;
	now_ms = ov_now(now_ms);
	pthread_rwlock_rdlock(&o->lock);
	for (g = o->groups; g != NULL; g = g->next) {
		if (ov_configured(g, cfg))
			continue;
		for (live = 0, e = g->head; e != NULL; e = e->gnext)
			live += !ov_expired(e, now_ms);
		if (live == 0)
			continue;
		/* Another prefix's group (key_prefix changed): its whole
		 * name. */
		w = snprintf(buf + at, at < len ? len - at : 0,
		    "%s\"%s\" (%ld)", n > 0 ? ", " : "",
		    memcmp(g->name, cfg->redis.key_prefix, plen) == 0 ?
			g->name + plen :
			g->name,
		    live);
		if (w > 0)
			at += (size_t)w;
		n++;
	}
	pthread_rwlock_unlock(&o->lock);
	return n;
}

/* Free the entries of every rule cfg does not have (the write lock
 * held). */
static void
ov_drop_unconfigured(struct overrides *o, const struct config *cfg)
{
	struct ov_group *g, *next;

	for (g = o->groups; g != NULL; g = next) {
		next = g->next;
		if (ov_configured(g, cfg))
			continue;
		ov_clear_group(o, g, false, 0);
		ov_group_drop_empty(o, g); /* a change of its rule */
	}
}

void
overrides_drop_unconfigured(struct overrides *o, const struct config *cfg)
{
	if (o == NULL)
		return;
	pthread_rwlock_wrlock(&o->lock);
	ov_drop_unconfigured(o, cfg);
	pthread_rwlock_unlock(&o->lock);
}

/* The next length-prefixed string of a reply: 0, or -1 past its end. */
static int
next_str(const char **p, const char *end, const char **s, uint32_t *n)
{
	if ((size_t)(end - *p) < sizeof(*n))
		return -1;
	memcpy(n, *p, sizeof(*n));
	*p += sizeof(*n);
	if ((size_t)(end - *p) < *n)
		return -1;
	*s = *p;
	*p += *n;
	return 0;
}

/* Free a list of entries linked by gnext (no lock: they are in no
 * table). */
static void
ov_free_list(struct ov_entry *e)
{
	struct ov_entry *next;

	for (; e != NULL; e = next) {
		next = e->gnext;
		rl_free(e);
	}
}

static bool
ov_build_expired(const struct ov_entry *e, int64_t now_ms)
{
	return e->expires_ms != 0 && e->expires_ms <= now_ms;
}

/*
 * The entries of a checked reply's live fields, as a list linked by
 * gnext, a field that comes twice (HSCAN may) once, with its last value;
 * no lock held.  0, or -1 (out of memory: nothing made).
 */
static int
ov_build(const char *prefix, const char *rule, const char *reply, size_t len,
    int64_t now_ms, struct ov_entry **out, size_t *nout)
{
	const char *p = reply, *end = reply + len, *f = NULL, *v = NULL;
	size_t plen = strlen(prefix), rlen = strlen(rule), n = 0, size, i;
	struct ov_entry *list = NULL, *e, **seen = NULL, **link;
	char val[96];
	uint32_t fl = 0, vl = 0;
	long long lim, win, exp;

	for (size = 16; size < len / 8; size *= 2)
		; /* at least twice the fields: each takes 8 bytes or more */
	if ((seen = rl_calloc(size, sizeof(seen[0]))) == NULL)
		return -1;
	while (p < end) {
		(void)next_str(&p, end, &f, &fl);
		(void)next_str(&p, end, &v, &vl);
		memcpy(val, v, vl);
		val[vl] = '\0';
		(void)sscanf(val, "%lld %lld %lld", &lim, &win, &exp);
		if ((e = rl_malloc(sizeof(*e) + plen + rlen + 3 + fl)) ==
		    NULL) {
			ov_free_list(list);
			rl_free(seen);
			return -1;
		}
		e->keylen = plen + rlen + 3 + fl;
		memcpy(e->key, prefix, plen);
		memcpy(e->key + plen, rule, rlen);
		memcpy(e->key + plen + rlen, ":{", 2);
		memcpy(e->key + plen + rlen + 2, f, fl);
		e->key[e->keylen - 1] = '}';
		e->hash = ov_hash(e->key, e->keylen);
		/* A rule's bound, as a PUT has (docs/admin.md): a larger
		 * limit, written by an older daemon, reads as the bound, so
		 * that RateLimit-Policy stays within 15 digits. */
		e->limit = lim > RL_MAX_LIMIT ? RL_MAX_LIMIT : lim;
		e->window_ms = win;
		e->expires_ms = exp;
		for (i = e->hash & (size - 1); seen[i] != NULL;
		     i = (i + 1) & (size - 1))
			if (seen[i]->hash == e->hash &&
			    seen[i]->keylen == e->keylen &&
			    memcmp(seen[i]->key, e->key, e->keylen) == 0)
				break;
		if (seen[i] != NULL) { /* twice: the later value, expired
					* or not (dropped below) */
			seen[i]->limit = e->limit;
			seen[i]->window_ms = e->window_ms;
			seen[i]->expires_ms = e->expires_ms;
			rl_free(e);
			continue;
		}
		if (ov_build_expired(e, now_ms)) {
			rl_free(e); /* the sync asks Redis to drop it
				       (sync_drop_expired()) */
			continue;
		}
		seen[i] = e;
		e->gnext = list;
		list = e;
		n++;
	}
	/* A field whose later copy was expired is none. */
	for (link = &list; (e = *link) != NULL;) {
		if (ov_build_expired(e, now_ms)) {
			*link = e->gnext;
			rl_free(e);
			n--;
		} else
			link = &e->gnext;
	}
	rl_free(seen);
	*out = list;
	*nout = n;
	return 0;
}

int
overrides_load_rule(struct overrides *o, const char *prefix, const char *rule,
    const char *reply, size_t len, unsigned long since)
{
	const char *p = reply, *end = reply + len, *f = NULL, *v = NULL;
	int64_t now_ms = util_realtime_us() / 1000;
	struct ov_entry *fresh = NULL, *old, *e, *next;
	struct ov_group *g;
	char val[96];
	uint32_t fl = 0, vl = 0;
	long long lim, win, exp;
	size_t nfresh = 0, nold = 0, nnew = 0;
	int rc = 0;

	/* Check the whole reply first: a bad one changes nothing. */
	while (p < end) {
		if (next_str(&p, end, &f, &fl) < 0 ||
		    next_str(&p, end, &v, &vl) < 0 || vl >= sizeof(val) ||
		    fl > RL_MAX_KEY_BYTES)
			goto malformed;
		memcpy(val, v, vl);
		val[vl] = '\0';
		if (sscanf(val, "%lld %lld %lld", &lim, &win, &exp) != 3 ||
		    lim < 1 || win < 0 || exp < 0)
			goto malformed;
	}
	/* Made and freed outside the lock, which every decision waits on:
	 * under it, only the old entries unlinked and the new linked. */
	if (ov_build(prefix, rule, reply, len, now_ms, &fresh, &nfresh) < 0) {
		errno = ENOMEM;
		return -1;
	}
	pthread_rwlock_wrlock(&o->lock);
	if (ov_rule_writes(o, prefix, rule) != since) {
		/* A change of the rule came after the read began: the reply
		 * may predate it. */
		pthread_rwlock_unlock(&o->lock);
		ov_free_list(fresh);
		return 1;
	}
	if ((g = ov_group(o, prefix, rule, true)) == NULL) {
		pthread_rwlock_unlock(&o->lock);
		ov_free_list(fresh);
		errno = ENOMEM;
		return -1;
	}
	/* The count moves once, by the difference, when the new entries
	 * are in: overrides_get() reads the table without the lock while
	 * the count is 0, and must not find it 0 meanwhile, the old entries
	 * out and the new not yet in (the rule may hold them all). */
	old = g->head;
	for (e = old; e != NULL; e = e->gnext) {
		ov_unlink_chain(o, e);
		nold++;
	}
	g->head = NULL;
	if ((size_t)atomic_load(&o->count) - nold + nfresh > OVERRIDES_MAX)
		ov_prune(o, now_ms, g);
	for (e = fresh; e != NULL; e = next) {
		next = e->gnext;
		if ((size_t)atomic_load(&o->count) - nold + nnew >=
		    OVERRIDES_MAX) {
			fresh = e; /* the rest, freed below */
			errno = ENOSPC;
			rc = -1;
			break;
		}
		ov_group_push(g, e);
		e->next = o->chains[e->hash & (o->nchains - 1)];
		o->chains[e->hash & (o->nchains - 1)] = e;
		nnew++;
	}
	atomic_fetch_add(&o->count, (long)nnew - (long)nold);
	if (rc == 0)
		fresh = NULL;
	while (ov_grow(o))
		;
	ov_group_drop_empty(o, g);
	ov_changed(o, prefix, rule);
	pthread_rwlock_unlock(&o->lock);
	ov_free_list(old);
	ov_free_list(fresh);
	return rc;
malformed:
	errno = EINVAL;
	return -1;
}

/* Free every expired entry now, and every entry of a rule cfg does not
 * have (a read of the admin API under an older config may have brought
 * one back since the reload).  The sync thread, after a full read. */
static void
ov_prune_now(struct overrides *o, const struct config *cfg)
{
	pthread_rwlock_wrlock(&o->lock);
	ov_prune(o, util_realtime_us() / 1000, NULL);
	ov_drop_unconfigured(o, cfg);
	pthread_rwlock_unlock(&o->lock);
}

/* --- the sync ------------------------------------------------------------ */

static bool
marked(char *const *names, size_t n, const char *rule)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (strcmp(names[i], rule) == 0)
			return true;
	return false;
}

/* Mark the rule named by len bytes of name to be read again (every rule
 * when too many are marked).  Takes o->mu: never called under it. */
static void
mark_rule(struct overrides *o, const char *name, size_t len)
{
	char *copy;

	if ((copy = rl_malloc(len + 1)) == NULL)
		return;
	memcpy(copy, name, len);
	copy[len] = '\0';
	pthread_mutex_lock(&o->mu);
	o->asked = true;
	if (o->ndirty < OV_DIRTY && !marked(o->dirty, o->ndirty, copy)) {
		o->dirty[o->ndirty++] = copy;
		copy = NULL;
	} else if (o->ndirty == OV_DIRTY)
		o->all = true;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->mu);
	rl_free(copy);
}

/* Is the value of a hash field (vl bytes) past its expiry at now_ms? */
static bool
value_expired(const char *v, uint32_t vl, int64_t now_ms)
{
	char val[96];
	long long lim, win, exp;

	if (vl >= sizeof(val))
		return false;
	memcpy(val, v, vl);
	val[vl] = '\0';
	return sscanf(val, "%lld %lld %lld", &lim, &win, &exp) == 3 &&
	    exp > 0 && exp <= now_ms;
}

/* Send one OVERRIDE_DROP of the npairs pairs of buf for hash. */
static void
drop_batch(struct overrides *o, const char *hash, size_t hashlen,
    const char *buf, size_t len, size_t npairs)
{
	struct backend_admin a = { .op = BACKEND_ADMIN_OVERRIDE_DROP };
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX];

	a.key = hash;
	a.keylen = hashlen;
	a.pairs = buf;
	a.pairslen = len;
	a.npairs = npairs;
	if (backend_admin_call(o->backend, &a, &kind, err, sizeof(err)) < 0)
		log_debug("expired overrides of %s not dropped: %s", hash, err);
	rl_free(a.reply);
}

/*
 * Ask Redis to drop the fields of a read of hash (reply, len: as for
 * overrides_load_rule()) that were expired at now_ms, in batches of
 * BACKEND_OVERRIDE_DROP_MAX: the writes no longer sweep the hash, so that
 * a write costs the same whatever its size (lua/override.lua).  Each
 * field goes only if it still holds the value read, so one set again
 * since stays.  The sync thread.
 */
static void
sync_drop_expired(struct overrides *o, const char *hash, size_t hashlen,
    const char *reply, size_t len, int64_t now_ms)
{
	const char *p = reply, *end = reply + len, *f, *v, *pair;
	char *buf = NULL;
	size_t at = 0, npairs = 0;
	uint32_t fl, vl;

	while (p < end) {
		pair = p;
		if (next_str(&p, end, &f, &fl) < 0 ||
		    next_str(&p, end, &v, &vl) < 0)
			break;
		if (!value_expired(v, vl, now_ms))
			continue;
		if (buf == NULL &&
		    (buf = rl_malloc(BACKEND_OVERRIDE_DROP_MAX *
			 (2 * sizeof(uint32_t) + RL_MAX_KEY_BYTES + 96))) ==
			NULL)
			return;
		if (fl > RL_MAX_KEY_BYTES || vl >= 96)
			continue;
		memcpy(buf + at, pair, (size_t)(p - pair));
		at += (size_t)(p - pair);
		if (++npairs == BACKEND_OVERRIDE_DROP_MAX) {
			if (atomic_load(&o->stopping))
				break; /* the next full read drops them */
			drop_batch(o, hash, hashlen, buf, at, npairs);
			at = npairs = 0;
		}
	}
	if (npairs > 0 && !atomic_load(&o->stopping))
		drop_batch(o, hash, hashlen, buf, at, npairs);
	rl_free(buf);
}

/* overrides_read_hash(), which gives up between two pages once *stop (if
 * not NULL) is set: -1 with BACKEND_ERR_CONNECT. */
static int
read_hash(struct backend *b, const char *hash, size_t hashlen,
    const atomic_bool *stop, char **reply, size_t *len,
    enum backend_error_kind *kind, char *err, size_t errlen)
{
	struct backend_admin a = { .op = BACKEND_ADMIN_OVERRIDE_READ };
	char *all = NULL, *grown;
	size_t n = 0, cap = 0;

	a.key = hash;
	a.keylen = hashlen;
	do {
		if (stop != NULL && atomic_load(stop)) {
			*kind = BACKEND_ERR_CONNECT;
			snprintf(err, errlen, "the daemon stops");
			goto fail;
		}
		if (backend_admin_call(b, &a, kind, err, errlen) < 0)
			goto fail;
		if (n + a.replylen + 1 > cap) {
			cap = 2 * (n + a.replylen) + 1;
			if ((grown = rl_realloc(all, cap)) == NULL) {
				*kind = BACKEND_ERR_PROTOCOL;
				snprintf(err, errlen, "out of memory");
				goto fail;
			}
			all = grown;
		}
		if (a.replylen > 0)
			memcpy(all + n, a.reply, a.replylen);
		n += a.replylen;
		rl_free(a.reply);
		a.reply = NULL;
	} while (a.cursor != 0);
	*reply = all;
	*len = n;
	return 0;
fail:
	rl_free(a.reply);
	rl_free(all);
	return -1;
}

int
overrides_read_hash(struct backend *b, const char *hash, size_t hashlen,
    char **reply, size_t *len, enum backend_error_kind *kind, char *err,
    size_t errlen)
{
	return read_hash(b, hash, hashlen, NULL, reply, len, kind, err, errlen);
}

/* Read rule's hash into the table; a read that fails is logged as a
 * warning when warn (once per rule per full read), else for debugging.
 * The sync thread. */
static void
sync_rule(struct overrides *o, const struct config *cfg, const char *rule,
    bool warn)
{
	struct backend_admin a = { .op = BACKEND_ADMIN_OVERRIDE_READ };
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX], *hash;
	size_t n = strlen(cfg->redis.key_prefix) + 9 + strlen(rule);
	unsigned long since = overrides_writes(o, cfg->redis.key_prefix, rule);
	int rc;

	if ((hash = rl_malloc(n + 1)) == NULL)
		return;
	snprintf(hash, n + 1, "%soverride:%s", cfg->redis.key_prefix, rule);
	if (read_hash(o->backend, hash, n, &o->stopping, &a.reply, &a.replylen,
		&kind, err, sizeof(err)) < 0) {
		if (atomic_load(&o->stopping))
			log_debug("overrides of %s: read given up", rule);
		else if (warn)
			log_warnx(
			    "overrides of %s not read (hash %s), the "
			    "ones held kept: %s",
			    rule, hash, err);
		else
			log_debug("overrides of %s not read: %s", rule, err);
	} else if ((rc = overrides_load_rule(o, cfg->redis.key_prefix, rule,
			a.reply, a.replylen, since)) < 0 &&
	    errno == EINVAL)
		log_warnx("overrides of %s: a malformed hash %s, ignored", rule,
		    hash);
	else if (rc < 0 && errno == ENOSPC)
		log_warnx(
		    "overrides of %s: more than %d overrides in all, "
		    "the rest of hash %s left out",
		    rule, OVERRIDES_MAX, hash);
	else if (rc < 0)
		log_warnx("overrides of %s: out of memory", rule);
	else if (rc == 1)
		mark_rule(o, rule, strlen(rule));
	if (a.reply != NULL)
		sync_drop_expired(o, hash, n, a.reply, a.replylen,
		    util_realtime_us() / 1000);
	rl_free(a.reply);
	rl_free(hash);
}

static void *
sync_main(void *arg)
{
	struct overrides *o = arg;
	char *names[OV_DIRTY];
	struct timespec at, now; /* at: when the next full read is due */
	struct config *cfg;
	size_t n, i;
	bool all, asked;

	clock_gettime(CLOCK_MONOTONIC, &at);
	pthread_mutex_lock(&o->mu);
	while (!o->stop) {
		while (!o->stop && !o->all && o->ndirty == 0)
			if (pthread_cond_timedwait(&o->cond, &o->mu, &at) ==
			    ETIMEDOUT)
				o->all = true;
		if (o->stop)
			break;
		/* Due, even if notices kept it from waiting at all. */
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec > at.tv_sec ||
		    (now.tv_sec == at.tv_sec && now.tv_nsec >= at.tv_nsec))
			o->all = true;
		all = o->all;
		asked = o->asked;
		n = o->ndirty;
		memcpy(names, o->dirty, n * sizeof(names[0]));
		o->all = o->asked = false;
		o->ndirty = 0;
		pthread_mutex_unlock(&o->mu);

		cfg = config_slot_get(&o->cfg);
		/* A stop gives the round up between two calls to the store,
		 * so that it waits for one call at most (redis.timeout). */
		for (i = 0; i < cfg->nrules && !atomic_load(&o->stopping); i++)
			if (all || marked(names, n, cfg->rules[i].name))
				sync_rule(o, cfg, cfg->rules[i].name, all);
		for (i = 0; i < n; i++)
			rl_free(names[i]);
		if (atomic_load(&o->stopping)) {
			config_unref(cfg);
			pthread_mutex_lock(&o->mu);
			break;
		}
		if (all) {
			/* The reads replace only the rules of cfg: a removed
			 * rule's entries go here (its hash stays). */
			ov_prune_now(o, cfg);
			clock_gettime(CLOCK_MONOTONIC, &at);
			at.tv_sec += OVERRIDES_RESYNC_MS / 1000;
		}
		config_unref(cfg);
		/* What another daemon (or a reload) changed is in the table
		 * now: whoever waits on a limit may look again. */
		if (asked && o->on_read != NULL)
			o->on_read(o->on_read_arg);
		pthread_mutex_lock(&o->mu);
		if (all && !o->read_once) {
			o->read_once = true;
			pthread_cond_broadcast(&o->read_cond);
		}
	}
	pthread_mutex_unlock(&o->mu);
	return NULL;
}

bool
overrides_sync_wait_read(struct overrides *o, int64_t timeout_ms)
{
	struct timespec at;
	bool done;

	if (o == NULL || o->backend == NULL)
		return true;
	clock_gettime(CLOCK_MONOTONIC, &at);
	at.tv_sec += (time_t)(timeout_ms / 1000);
	at.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (at.tv_nsec >= 1000000000) {
		at.tv_sec++;
		at.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&o->mu);
	while (!o->read_once &&
	    pthread_cond_timedwait(&o->read_cond, &o->mu, &at) != ETIMEDOUT)
		;
	done = o->read_once;
	pthread_mutex_unlock(&o->mu);
	return done;
}

void
overrides_on_read(struct overrides *o, overrides_read_fn fn, void *arg)
{
	o->on_read = fn;
	o->on_read_arg = arg;
}

int
overrides_sync_start(struct overrides *o, struct backend *b, struct config *cfg,
    char *err, size_t errlen)
{
	pthread_condattr_t ca;

	config_slot_init(&o->cfg, cfg);
	if (pthread_mutex_init(&o->mu, NULL) != 0 ||
	    pthread_condattr_init(&ca) != 0) {
		snprintf(err, errlen, "overrides: cannot make a lock");
		return -1;
	}
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_cond_init(&o->cond, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		snprintf(err, errlen, "overrides: cannot make a condition");
		return -1;
	}
	if (pthread_cond_init(&o->read_cond, &ca) != 0) {
		pthread_cond_destroy(&o->cond);
		pthread_condattr_destroy(&ca);
		snprintf(err, errlen, "overrides: cannot make a condition");
		return -1;
	}
	pthread_condattr_destroy(&ca);
	o->backend = b;
	o->all = true; /* read every rule at start: they survive restarts */
	if (pthread_create(&o->thread, NULL, sync_main, o) != 0) {
		o->backend = NULL;
		snprintf(err, errlen, "overrides: cannot start a thread");
		return -1;
	}
	return 0;
}

void
overrides_sync_set_config(struct overrides *o, struct config *cfg)
{
	if (o == NULL || o->backend == NULL)
		return;
	/* A rule no longer configured: its copy goes at once, so that it
	 * counts no more toward OVERRIDES_MAX; its hash stays in Redis and
	 * is read again (below, and at every full read) if the rule comes
	 * back. */
	overrides_drop_unconfigured(o, cfg);
	config_slot_set(&o->cfg, cfg);
	pthread_mutex_lock(&o->mu);
	o->all = o->asked = true;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->mu);
}

void
overrides_notice(struct overrides *o, const char *msg, size_t len)
{
	struct config *cfg;
	const char *rule;
	size_t plen;

	if (o == NULL || o->backend == NULL)
		return;
	if (msg == NULL) {
		pthread_mutex_lock(&o->mu);
		o->all = o->asked = true;
		pthread_cond_signal(&o->cond);
		pthread_mutex_unlock(&o->mu);
		return;
	}
	cfg = config_slot_get(&o->cfg);
	plen = strlen(cfg->redis.key_prefix);
	if (len <= plen + 9 || memcmp(msg, cfg->redis.key_prefix, plen) != 0 ||
	    memcmp(msg + plen, "override:", 9) != 0) {
		config_unref(cfg);
		return;
	}
	config_unref(cfg);
	rule = msg + plen + 9;
	mark_rule(o, rule, len - plen - 9);
}

void
overrides_sync_stop(struct overrides *o)
{
	if (o == NULL || o->backend == NULL || o->joined)
		return;
	atomic_store(&o->stopping, true);
	pthread_mutex_lock(&o->mu);
	o->stop = true;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->mu);
	pthread_join(o->thread, NULL);
	o->joined = true;
}

void
overrides_free(struct overrides *o)
{
	struct ov_entry *e, *next;
	struct ov_group *g, *gnext;
	size_t i;

	if (o == NULL)
		return;
	overrides_sync_stop(o);
	if (o->backend != NULL) {
		for (i = 0; i < o->ndirty; i++)
			rl_free(o->dirty[i]);
		pthread_cond_destroy(&o->cond);
		pthread_cond_destroy(&o->read_cond);
		pthread_mutex_destroy(&o->mu);
		config_slot_destroy(&o->cfg);
	}
	for (i = 0; i < o->nchains; i++)
		for (e = o->chains[i]; e != NULL; e = next) {
			next = e->next;
			rl_free(e);
		}
	for (g = o->groups; g != NULL; g = gnext) {
		gnext = g->next;
		rl_free(g);
	}
	rl_free(o->chains);
	pthread_rwlock_destroy(&o->lock);
	rl_free(o);
}
