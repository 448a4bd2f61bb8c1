/*
 * overrides.c - the table of limits per key (see overrides.h; docs/admin.md);
 * its sync with Redis is overrides_sync.c.
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
 */
#include "core/overrides.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/util.h"
#include "core/overrides_priv.h"

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

/* Without a sync, true; with one, whether its config (the newest: a
 * reload sets it first) has rule.  Under the table's lock. */
static bool
ov_sync_has_rule(struct overrides *o, const char *rule)
{
	struct config *cfg;
	bool found;

	if (o->backend == NULL)
		return true;
	cfg = config_slot_get(&o->cfg);
	found = config_find_rule(cfg, rule) != NULL;
	config_unref(cfg);
	return found;
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

int
ov_next_str(const char **p, const char *end, const char **s, uint32_t *n)
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

/* fresh, a list linked by gnext, with the entries whose key the table
 * holds now first and the others after, each in its order.  Under the
 * write lock, before the rule's entries are unlinked. */
static struct ov_entry *
ov_held_first(struct overrides *o, struct ov_entry *fresh)
{
	struct ov_entry *held = NULL, **ht = &held, *rest = NULL, **rt = &rest;
	struct ov_entry *e, *next;

	for (e = fresh; e != NULL; e = next) {
		next = e->gnext;
		e->gnext = NULL;
		if (*ov_find(o, e->key, e->keylen, e->hash) != NULL) {
			*ht = e;
			ht = &e->gnext;
		} else {
			*rt = e;
			rt = &e->gnext;
		}
	}
	*ht = rest;
	return held;
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
		(void)ov_next_str(&p, end, &f, &fl);
		(void)ov_next_str(&p, end, &v, &vl);
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
		if (ov_next_str(&p, end, &f, &fl) < 0 ||
		    ov_next_str(&p, end, &v, &vl) < 0 || vl >= sizeof(val) ||
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
	if (!ov_sync_has_rule(o, rule)) {
		/* A reload removed the rule while its hash was read: its
		 * entries would only take room from those of the rules it
		 * added, which it is reading now. */
		pthread_rwlock_unlock(&o->lock);
		ov_free_list(fresh);
		return 0;
	}
	if ((g = ov_group(o, prefix, rule, true)) == NULL) {
		pthread_rwlock_unlock(&o->lock);
		ov_free_list(fresh);
		errno = ENOMEM;
		return -1;
	}
	/* Past the bound, the keys the table holds now go in first, so
	 * that overrides in use stay and new ones are left out (two
	 * daemons that each took a few more than the bound allows cannot
	 * then throw out others at random). */
	if ((size_t)atomic_load(&o->count) + nfresh > OVERRIDES_MAX)
		fresh = ov_held_first(o, fresh);
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

/* A read of the admin API under an older config may have brought back
 * an entry of a rule the config no longer has since the reload.  The
 * config is the newest, read under the lock: a reload sets it before it
 * loads an added rule's entries (under this lock), so they stay. */
void
ov_prune_now(struct overrides *o)
{
	struct config *cfg;

	pthread_rwlock_wrlock(&o->lock);
	cfg = config_slot_get(&o->cfg);
	ov_prune(o, util_realtime_us() / 1000, NULL);
	ov_drop_unconfigured(o, cfg);
	pthread_rwlock_unlock(&o->lock);
	config_unref(cfg);
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
