/*
 * overrides.c - the table of limits per key and its sync with Redis (see
 * overrides.h; docs/admin.md).
 *
 * DESIGN
 *
 * A fixed number of hash chains under one read-write lock: decisions only
 * read, and take the lock only while the table holds something (an atomic
 * count says so), so a daemon without overrides pays one atomic load per
 * rule.  Writers are the admin API and the sync, both rare.
 *
 * The sync thread sleeps on a condition variable until a notice marks a
 * rule (or every rule) to be read again, or OVERRIDES_RESYNC_MS pass; it
 * then reads each marked rule's hash through the store, one blocking
 * admin call each (bounded by redis.timeout), and replaces that rule's
 * entries.  A read that fails keeps what the table had.  So does a read
 * that another change of the table overtook (the count `writes` moved
 * while it was out): a write of this daemon's, or another read of the
 * hash applied first (the admin API's, or the sync's own).  The reply may
 * hold the hash from before that change, and applied last it would take
 * the change back until the next read; the rule is marked to be read
 * again instead.  So of two reads of one hash that overlap, only the one
 * applied first is applied, and the other is read again.
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

#define OV_CHAINS 1024 /* a power of two */
#define OV_DIRTY  64   /* rules marked one by one; past it, all */

struct ov_entry {
	struct ov_entry *next;
	uint64_t hash;
	int64_t limit, window_ms, expires_ms;
	size_t keylen;
	char key[]; /* the store key, not NUL-terminated */
};

struct overrides {
	pthread_rwlock_t lock;
	struct ov_entry *chains[OV_CHAINS];
	atomic_long count;
	unsigned long writes; /* changes so far: set, delete, load; lock */

	/* The sync (NULL backend: none started). */
	struct backend *backend;
	struct config_slot cfg;
	pthread_t thread;
	pthread_mutex_t mu; /* guards what follows */
	pthread_cond_t cond;
	bool stop, all;
	char *dirty[OV_DIRTY];
	size_t ndirty;
};

/* FNV-1a: keys here come from operators, not from clients. */
static uint64_t
ov_hash(const char *s, size_t n)
{
	uint64_t h = UINT64_C(14695981039346656037);
	size_t i;

	for (i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= UINT64_C(1099511628211);
	}
	return h;
}

struct overrides *
overrides_new(void)
{
	struct overrides *o;

	if ((o = rl_calloc(1, sizeof(*o))) == NULL)
		return NULL;
	if (pthread_rwlock_init(&o->lock, NULL) != 0) {
		rl_free(o);
		return NULL;
	}
	atomic_init(&o->count, 0);
	return o;
}

/* The entry of key (the lock held), and where it hangs. */
static struct ov_entry **
ov_find(struct overrides *o, const char *key, size_t keylen, uint64_t h)
{
	struct ov_entry **pp = &o->chains[h & (OV_CHAINS - 1)];

	for (; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->hash == h && (*pp)->keylen == keylen &&
		    memcmp((*pp)->key, key, keylen) == 0)
			break;
	return pp;
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
	if (now_ms <= 0)
		now_ms = util_realtime_us() / 1000;
	h = ov_hash(key, keylen);
	pthread_rwlock_rdlock(&o->lock);
	e = *ov_find(o, key, keylen, h);
	if (e != NULL && (e->expires_ms == 0 || e->expires_ms > now_ms)) {
		*limit = e->limit;
		*window_ms = e->window_ms;
		found = true;
	}
	pthread_rwlock_unlock(&o->lock);
	return found;
}

/* Insert or replace (the write lock held).  0 or -1 (OOM). */
static int
ov_put(struct overrides *o, const char *key, size_t keylen, int64_t limit,
    int64_t window_ms, int64_t expires_ms)
{
	uint64_t h = ov_hash(key, keylen);
	struct ov_entry **pp = ov_find(o, key, keylen, h), *e = *pp;

	if (e == NULL) {
		if ((e = rl_malloc(sizeof(*e) + keylen)) == NULL)
			return -1;
		e->next = NULL;
		e->hash = h;
		e->keylen = keylen;
		memcpy(e->key, key, keylen);
		*pp = e;
		atomic_fetch_add(&o->count, 1);
	}
	e->limit = limit;
	e->window_ms = window_ms;
	e->expires_ms = expires_ms;
	return 0;
}

int
overrides_set(struct overrides *o, const char *key, size_t keylen,
    int64_t limit, int64_t window_ms, int64_t expires_ms)
{
	int rc;

	pthread_rwlock_wrlock(&o->lock);
	rc = ov_put(o, key, keylen, limit, window_ms, expires_ms);
	o->writes++;
	pthread_rwlock_unlock(&o->lock);
	return rc;
}

bool
overrides_delete(struct overrides *o, const char *key, size_t keylen,
    int64_t now_ms)
{
	struct ov_entry **pp, *e;
	bool live = false;

	pthread_rwlock_wrlock(&o->lock);
	pp = ov_find(o, key, keylen, ov_hash(key, keylen));
	if ((e = *pp) != NULL) {
		live = e->expires_ms == 0 || e->expires_ms > now_ms;
		*pp = e->next;
		rl_free(e);
		atomic_fetch_sub(&o->count, 1);
	}
	o->writes++;
	pthread_rwlock_unlock(&o->lock);
	return live;
}

unsigned long
overrides_writes(struct overrides *o)
{
	unsigned long n;

	pthread_rwlock_rdlock(&o->lock);
	n = o->writes;
	pthread_rwlock_unlock(&o->lock);
	return n;
}

/* Is e one of rule's: "<prefix><rule>:{...}"?  Its key's offset, or 0. */
static size_t
ov_of_rule(const struct ov_entry *e, const char *prefix, size_t plen,
    const char *rule, size_t rlen)
{
	if (e->keylen < plen + rlen + 3 || memcmp(e->key, prefix, plen) != 0 ||
	    memcmp(e->key + plen, rule, rlen) != 0 ||
	    memcmp(e->key + plen + rlen, ":{", 2) != 0 ||
	    e->key[e->keylen - 1] != '}')
		return 0;
	return plen + rlen + 2;
}

void
overrides_each(struct overrides *o, const char *prefix, const char *rule,
    int64_t now_ms, void (*fn)(const struct override_view *v, void *arg),
    void *arg)
{
	size_t plen = strlen(prefix), rlen = strlen(rule), i, at;
	struct override_view v;
	struct ov_entry *e;

	pthread_rwlock_rdlock(&o->lock);
	for (i = 0; i < OV_CHAINS; i++)
		for (e = o->chains[i]; e != NULL; e = e->next) {
			if ((at = ov_of_rule(e, prefix, plen, rule, rlen)) ==
				0 ||
			    (e->expires_ms != 0 && e->expires_ms <= now_ms))
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

int
overrides_load_rule(struct overrides *o, const char *prefix, const char *rule,
    const char *reply, size_t len, unsigned long since)
{
	const char *p = reply, *end = reply + len, *f = NULL, *v = NULL;
	size_t plen = strlen(prefix), rlen = strlen(rule), i, nkeys = 0;
	struct ov_entry **pp;
	char val[96], *key;
	uint32_t fl = 0, vl = 0;
	long long lim, win, exp;
	int rc = 0;

	/* Check the whole reply first: a bad one changes nothing. */
	while (p < end) {
		if (next_str(&p, end, &f, &fl) < 0 ||
		    next_str(&p, end, &v, &vl) < 0 || vl >= sizeof(val) ||
		    fl > RL_MAX_KEY_BYTES)
			return -1;
		memcpy(val, v, vl);
		val[vl] = '\0';
		if (sscanf(val, "%lld %lld %lld", &lim, &win, &exp) != 3 ||
		    lim < 1 || win < 1 || exp < 0)
			return -1;
		nkeys++;
	}
	if ((key = rl_malloc(plen + rlen + RL_MAX_KEY_BYTES + 4)) == NULL)
		return -1;
	pthread_rwlock_wrlock(&o->lock);
	if (o->writes != since) {
		/* A write came after the read began: the reply may predate
		 * it. */
		pthread_rwlock_unlock(&o->lock);
		rl_free(key);
		return 1;
	}
	for (i = 0; i < OV_CHAINS; i++)
		for (pp = &o->chains[i]; *pp != NULL;) {
			struct ov_entry *e = *pp;

			if (ov_of_rule(e, prefix, plen, rule, rlen) == 0) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			rl_free(e);
			atomic_fetch_sub(&o->count, 1);
		}
	for (p = reply; p < end && rc == 0;) {
		(void)next_str(&p, end, &f, &fl);
		(void)next_str(&p, end, &v, &vl);
		memcpy(val, v, vl);
		val[vl] = '\0';
		(void)sscanf(val, "%lld %lld %lld", &lim, &win, &exp);
		memcpy(key, prefix, plen);
		memcpy(key + plen, rule, rlen);
		memcpy(key + plen + rlen, ":{", 2);
		memcpy(key + plen + rlen + 2, f, fl);
		key[plen + rlen + 2 + fl] = '}';
		rc = ov_put(o, key, plen + rlen + 3 + fl, lim, win, exp);
	}
	o->writes++;
	pthread_rwlock_unlock(&o->lock);
	rl_free(key);
	(void)nkeys;
	return rc;
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
	if (o->ndirty < OV_DIRTY && !marked(o->dirty, o->ndirty, copy)) {
		o->dirty[o->ndirty++] = copy;
		copy = NULL;
	} else if (o->ndirty == OV_DIRTY)
		o->all = true;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->mu);
	rl_free(copy);
}

/* Read rule's hash into the table.  The sync thread. */
static void
sync_rule(struct overrides *o, const struct config *cfg, const char *rule)
{
	struct backend_admin a = { .op = BACKEND_ADMIN_OVERRIDE_READ };
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX], *hash;
	size_t n = strlen(cfg->redis.key_prefix) + 9 + strlen(rule);
	unsigned long since = overrides_writes(o);
	int rc;

	if ((hash = rl_malloc(n + 1)) == NULL)
		return;
	snprintf(hash, n + 1, "%soverride:%s", cfg->redis.key_prefix, rule);
	a.key = hash;
	a.keylen = n;
	if (backend_admin_call(o->backend, &a, &kind, err, sizeof(err)) < 0)
		log_debug("overrides of %s not read: %s", rule, err);
	else if ((rc = overrides_load_rule(o, cfg->redis.key_prefix, rule,
		      a.reply, a.replylen, since)) < 0)
		log_warnx("overrides of %s: a malformed hash %s, ignored", rule,
		    hash);
	else if (rc == 1)
		mark_rule(o, rule, strlen(rule));
	rl_free(a.reply);
	rl_free(hash);
}

static void *
sync_main(void *arg)
{
	struct overrides *o = arg;
	char *names[OV_DIRTY];
	struct timespec at;
	struct config *cfg;
	size_t n, i;
	bool all;

	pthread_mutex_lock(&o->mu);
	while (!o->stop) {
		clock_gettime(CLOCK_MONOTONIC, &at);
		at.tv_sec += OVERRIDES_RESYNC_MS / 1000;
		while (!o->stop && !o->all && o->ndirty == 0)
			if (pthread_cond_timedwait(&o->cond, &o->mu, &at) ==
			    ETIMEDOUT)
				o->all = true;
		if (o->stop)
			break;
		all = o->all;
		n = o->ndirty;
		memcpy(names, o->dirty, n * sizeof(names[0]));
		o->all = false;
		o->ndirty = 0;
		pthread_mutex_unlock(&o->mu);

		cfg = config_slot_get(&o->cfg);
		for (i = 0; i < cfg->nrules; i++)
			if (all || marked(names, n, cfg->rules[i].name))
				sync_rule(o, cfg, cfg->rules[i].name);
		config_unref(cfg);
		for (i = 0; i < n; i++)
			rl_free(names[i]);
		pthread_mutex_lock(&o->mu);
	}
	pthread_mutex_unlock(&o->mu);
	return NULL;
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
	config_slot_set(&o->cfg, cfg);
	pthread_mutex_lock(&o->mu);
	o->all = true;
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
		o->all = true;
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
overrides_free(struct overrides *o)
{
	struct ov_entry *e, *next;
	size_t i;

	if (o == NULL)
		return;
	if (o->backend != NULL) {
		pthread_mutex_lock(&o->mu);
		o->stop = true;
		pthread_cond_signal(&o->cond);
		pthread_mutex_unlock(&o->mu);
		pthread_join(o->thread, NULL);
		for (i = 0; i < o->ndirty; i++)
			rl_free(o->dirty[i]);
		pthread_cond_destroy(&o->cond);
		pthread_mutex_destroy(&o->mu);
		config_slot_destroy(&o->cfg);
	}
	for (i = 0; i < OV_CHAINS; i++)
		for (e = o->chains[i]; e != NULL; e = next) {
			next = e->next;
			rl_free(e);
		}
	pthread_rwlock_destroy(&o->lock);
	rl_free(o);
}
