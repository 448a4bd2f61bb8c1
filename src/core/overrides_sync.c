/*
 * overrides_sync.c - the overrides table kept in step with Redis (see
 * overrides.h; docs/admin.md): the thread that reads each rule's hash
 * again, the notices that mark a rule to be read, and the drop of the
 * fields it finds expired.  The table itself is overrides.c.
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
 *
 * A reload reads the hashes of the rules it adds on the main thread,
 * with the same sync_rule(), before the front ends take the new rules
 * (overrides_sync_set_config()).
 *
 * Thread: sync_main() and what it calls run on the sync thread, but
 * sync_rule() also on the main thread at a reload; the functions of
 * overrides.h on the threads it names for each.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/util.h"
#include "core/overrides.h"
#include "core/overrides_priv.h"

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
		if (ov_next_str(&p, end, &f, &fl) < 0 ||
		    ov_next_str(&p, end, &v, &vl) < 0)
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
 * not NULL) is set, or deadline_us (if not 0) has passed: -1 with
 * BACKEND_ERR_CONNECT, or BACKEND_ERR_TIMEOUT. */
static int
read_hash(struct backend *b, const char *hash, size_t hashlen,
    const atomic_bool *stop, int64_t deadline_us, char **reply, size_t *len,
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
		if (deadline_us != 0 && util_monotonic_us() >= deadline_us) {
			*kind = BACKEND_ERR_TIMEOUT;
			snprintf(err, errlen, "the reload's wait ran out");
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
	return read_hash(b, hash, hashlen, NULL, 0, reply, len, kind, err,
	    errlen);
}

/* Read rule's hash into the table, giving up at deadline_us (0: none);
 * a read that fails is logged as a warning when warn (once per rule per
 * full read), else for debugging.  The fields it finds expired are
 * dropped in Redis, but not by a read with a deadline (a reload's, on
 * the main thread: the sync's next full read drops them).  0, or -1 when
 * the store gave nothing (what it gave and the table refused, malformed
 * or past the bound, is logged, and 0).  The sync thread, or the main
 * thread at a reload. */
static int
sync_rule(struct overrides *o, const struct config *cfg, const char *rule,
    bool warn, int64_t deadline_us)
{
	struct backend_admin a = { .op = BACKEND_ADMIN_OVERRIDE_READ };
	enum backend_error_kind kind;
	char err[BACKEND_ERR_MAX], *hash;
	size_t n = strlen(cfg->redis.key_prefix) + 9 + strlen(rule);
	unsigned long since = overrides_writes(o, cfg->redis.key_prefix, rule);
	int rc, read = -1;

	if ((hash = rl_malloc(n + 1)) == NULL)
		return -1;
	snprintf(hash, n + 1, "%soverride:%s", cfg->redis.key_prefix, rule);
	if (read_hash(o->backend, hash, n, &o->stopping, deadline_us, &a.reply,
		&a.replylen, &kind, err, sizeof(err)) < 0) {
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
		read = 0;
	if (a.reply != NULL && deadline_us == 0)
		sync_drop_expired(o, hash, n, a.reply, a.replylen,
		    util_realtime_us() / 1000);
	rl_free(a.reply);
	rl_free(hash);
	return read;
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
				(void)sync_rule(o, cfg, cfg->rules[i].name, all,
				    0);
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
			ov_prune_now(o);
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

size_t
overrides_sync_set_config(struct overrides *o, struct config *cfg,
    const struct config *old, int64_t wait_ms)
{
	int64_t deadline;
	size_t i, unread = 0;

	if (o == NULL || o->backend == NULL)
		return 0;
	/* First the config, so that a prune of the sync's from now on keeps
	 * the new rules' entries (ov_prune_now() reads it under the lock
	 * that a load takes). */
	config_slot_set(&o->cfg, cfg);
	/* A rule no longer configured: its copy goes at once, so that it
	 * counts no more toward OVERRIDES_MAX (room for the reads below);
	 * its hash stays in Redis and is read again (below, and at every
	 * full read) if the rule comes back.  Its requests until the fronts
	 * take cfg are decided without its overrides: it is going. */
	overrides_drop_unconfigured(o, cfg);
	/* The wait is the reads' (the drop above frees what it frees, up
	 * to 100,000 entries, whatever the time). */
	deadline = util_monotonic_us() + wait_ms * 1000;
	/* A rule added, or back: nothing of its hash is held, so read it
	 * before the fronts decide under it, as at start (else its first
	 * requests would be decided under the rule's own limit).  Once one
	 * read fails (Redis down, the time out), the others are left to
	 * the sync. */
	for (i = 0; i < cfg->nrules; i++) {
		if (old != NULL &&
		    config_find_rule(old, cfg->rules[i].name) != NULL)
			continue;
		if (unread > 0 || util_monotonic_us() >= deadline ||
		    sync_rule(o, cfg, cfg->rules[i].name, true, deadline) < 0)
			unread++;
	}
	pthread_mutex_lock(&o->mu);
	o->all = o->asked = true;
	pthread_cond_signal(&o->cond);
	pthread_mutex_unlock(&o->mu);
	return unread;
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
