/*
 * overrides.h - limits per key (docs/admin.md): one rendered key of one
 * rule with its own limit and window, set through the admin API without a
 * reload.  Every decision asks this table (decide.c), so it is the one
 * place an override takes effect, whatever the store.
 *
 * The table is keyed by the full store key, "<key_prefix><rule>:{<key>}",
 * which names the rule and the key at once.  With the memory store it is
 * the only copy (in process).  With Redis the overrides live in the hash
 * "<key_prefix>override:<rule>" (lua/override.lua) and this table mirrors
 * it: a sync thread reads a rule's hash again when a daemon PUBLISHes a
 * change (overrides_notice()), every rule's when the subscription comes
 * back (a notice may have been missed) and every OVERRIDES_RESYNC_MS
 * whatever happens; the daemon that writes updates its own table at once.
 *
 * Threads: overrides_get() on any thread, many at once (a read lock, and
 * none while the table is empty); the writers on any thread; the sync
 * functions as each says.
 */
#ifndef RL_OVERRIDES_H
#define RL_OVERRIDES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/config.h"

/* Every rule's hash is read again this often, notices or not. */
#define OVERRIDES_RESYNC_MS 5000
/* At most this many overrides in the table (docs/admin.md); a new one
 * past it is refused.  About 600 bytes each at the longest key. */
#define OVERRIDES_MAX 100000

struct overrides;

/* A new, empty table; NULL when out of memory.  overrides_free(NULL)
 * does nothing; the sync (if started) is stopped first.  Main thread:
 * nothing may call into o any more, overrides_notice() included (stop
 * the store that hands out notices first). */
struct overrides *overrides_new(void);
void overrides_free(struct overrides *o);

/*
 * The override of store key `key` at now_ms (epoch milliseconds; 0: the
 * clock's now, read only when the table holds something): true
 * with *limit and *window_ms set, or false (they are left alone).  An
 * override set without a window follows the rule's (docs/admin.md): then
 * *window_ms is left alone too, so the caller sets both to the rule's
 * before asking, and fits the limit to that window with
 * overrides_fit_limit().  An override past its expiry is none.  o may be
 * NULL (false).
 */
bool overrides_get(struct overrides *o, const char *key, size_t keylen,
    int64_t now_ms, int64_t *limit, int64_t *window_ms);

/*
 * Set (or replace) the override of rendered key `key` (keylen bytes) of
 * rule, whose store key is "<prefix><rule>:{<key>}", window_ms 0 for the
 * rule's window whatever it is when a decision asks, expiring at
 * expires_ms (0: never); now_ms as for overrides_get().  Expired
 * overrides may be freed on the way.  0, or -1 with errno ENOSPC (the
 * table holds OVERRIDES_MAX live overrides, key not among them) or
 * ENOMEM.
 */
int overrides_set(struct overrides *o, const char *prefix, const char *rule,
    const char *key, size_t keylen, int64_t limit, int64_t window_ms,
    int64_t expires_ms, int64_t now_ms);

/* Drop the override of rendered key `key` of rule (as overrides_set());
 * true iff there was a live one at now_ms (0: the clock's now). */
bool overrides_delete(struct overrides *o, const char *prefix, const char *rule,
    const char *key, size_t keylen, int64_t now_ms);

/*
 * Can a rule of algorithm alg run at limit per window_ms?  The checks the
 * config file's limits pass too (docs/configuration.md): a token_bucket
 * needs at least 1 us of window per unit, since GCRA spaces units
 * window/limit apart on a microsecond clock and a smaller step would round
 * to 0 and admit without bound.  true, or false with the reason in err.
 * Pure; any thread.
 */
bool overrides_limit_ok(enum rl_algorithm alg, int64_t limit, int64_t window_ms,
    char *err, size_t errlen);

/* limit, or the largest a rule of algorithm alg can run at per window_ms
 * when it is more (overrides_limit_ok()): an override that follows the
 * rule's window was checked against the window of its PUT, and a reload
 * may have shortened it since.  Pure; any thread. */
int64_t overrides_fit_limit(enum rl_algorithm alg, int64_t limit,
    int64_t window_ms);

/* Would overrides_set() of that key find room (it is there already, or
 * the table holds fewer than OVERRIDES_MAX live overrides)?  Expired
 * ones may be freed on the way.  Asked before a write to Redis, so that a
 * refusal changes nothing there. */
bool overrides_has_room(struct overrides *o, const char *prefix,
    const char *rule, const char *key, size_t keylen, int64_t now_ms);

/* How many entries the table holds, expired ones not yet freed
 * included.  o may be NULL (0). */
size_t overrides_count(struct overrides *o);

/* One override, as overrides_each() hands it out. */
struct override_view {
	const char *key; /* the rendered key (inside the braces) */
	size_t keylen;
	int64_t limit, window_ms, expires_ms; /* window_ms 0: the rule's */
};

/* fn for every live override of rule (store keys "<prefix><rule>:{...}"),
 * under the read lock: fn must not call back into o.  Visits that rule's
 * overrides only. */
void overrides_each(struct overrides *o, const char *prefix, const char *rule,
    int64_t now_ms, void (*fn)(const struct override_view *v, void *arg),
    void *arg);

/* Does the table hold overrides of rule (under prefix), live or expired
 * and not yet freed?  o may be NULL (false). */
bool overrides_has_rule(struct overrides *o, const char *prefix,
    const char *rule);

/*
 * The rules that hold live overrides at now_ms (0: the clock's now) though
 * cfg (borrowed) has them no more (removed or renamed by a reload, or
 * under another key_prefix), for the admin API's answer at the bound:
 * into buf (always NUL-terminated, cut at len) as "\"old\" (3),
 * \"gone\" (7)", a name under another prefix given whole.  Returns how
 * many such rules; 0 with buf "" when none.  o may be NULL.  Any thread.
 */
size_t overrides_unconfigured(struct overrides *o, const struct config *cfg,
    int64_t now_ms, char *buf, size_t len);

/* Free the entries of every rule cfg (borrowed) does not have under its
 * key_prefix.  With Redis only, where the hash keeps them (the memory
 * store keeps a removed rule's overrides: docs/admin.md).  Any thread;
 * overrides_sync_set_config() calls it. */
void overrides_drop_unconfigured(struct overrides *o, const struct config *cfg);

/* A count that moves whenever rule's overrides change (overrides_set(),
 * overrides_delete(), a load by overrides_load_rule(), the rule's entries
 * dropped; rarely also when another rule's go): read it before a read of
 * the rule's hash for overrides_load_rule().  A change of another rule
 * does not move it, so that a long read of a big hash is not overtaken
 * by writes elsewhere. */
unsigned long overrides_writes(struct overrides *o, const char *prefix,
    const char *rule);

/*
 * Replace rule's overrides by the fields of an OVERRIDE_READ reply
 * (core/backend.h: pairs of length-prefixed strings, field = the rendered
 * key, value = "<limit> <window_ms> <expires_at_ms>", window 0: the
 * rule's), read after
 * overrides_writes() said `since` for that rule.  Fields already expired by
 * this daemon's clock are left out.  0; 1 when the rule's overrides changed
 * since, by a write or another load (the reply may predate that change: the
 * table is left as it was, and the caller reads again); or -1 with errno:
 * EINVAL, a malformed reply, or ENOMEM (the table is left as it was both
 * times); ENOSPC, the table full (OVERRIDES_MAX: the rule then holds part
 * of the reply until the next read, the keys it held before first).  With the
 * sync started, a rule its config no longer has (a reload removed it during the
 * read) loads nothing: 0.  The new entries are made, and the old freed, outside
 * the table's lock, which is held only to swap them.
 */
int overrides_load_rule(struct overrides *o, const char *prefix,
    const char *rule, const char *reply, size_t len, unsigned long since);

/*
 * Read the whole hash `hash` (hashlen bytes) through b, a page
 * (BACKEND_OVERRIDE_PAGE fields) per call, each call within the store's
 * timeout: into *reply (new, rl_free) and *len, laid out as an
 * OVERRIDE_READ reply for overrides_load_rule() (a field may come twice).
 * 0, or -1 with *kind and err (nothing to free).  Any thread that may
 * block.
 */
int overrides_read_hash(struct backend *b, const char *hash, size_t hashlen,
    char **reply, size_t *len, enum backend_error_kind *kind, char *err,
    size_t errlen);

/*
 * The sync with Redis (see the top of this file): a thread reading every
 * rule's hash of cfg now and then through b (borrowed; it must outlive the
 * sync).  Takes a reference to cfg.  0, or -1 with err.  Main thread.
 */
int overrides_sync_start(struct overrides *o, struct backend *b,
    struct config *cfg, char *err, size_t errlen);
/* fn(arg) runs on the sync thread after each round of reads that a
 * notice (overrides_notice()) or a reload (overrides_sync_set_config())
 * asked for, once the table holds what was read: the limits of some keys
 * may have changed (docs/admin.md).  Not after the periodic full read.
 * Main thread, before overrides_sync_start(). */
typedef void (*overrides_read_fn)(void *arg);
void overrides_on_read(struct overrides *o, overrides_read_fn fn, void *arg);
/* Wait until the sync's first read of every rule's hash has ended (read
 * or failed: docs/admin.md), at most timeout_ms: true when it has (or no
 * sync runs).  Main thread, at start, so that the first requests are
 * decided under the overrides the hashes hold. */
bool overrides_sync_wait_read(struct overrides *o, int64_t timeout_ms);
/*
 * A reload: the rules and the prefix of cfg from now on (a reference
 * taken), every rule read again by the sync; the entries of a rule cfg
 * does not have are freed at once (overrides_drop_unconfigured()), and
 * again after each full read.  The rules cfg has and old (the running
 * config) has not, added or brought back, have their hashes read before
 * it returns, so that their first requests are decided under their
 * overrides, as at start: no page of a hash is asked for past wait_ms,
 * so it returns within wait_ms plus one page's redis.timeout (and the
 * parsing of what was read).  Returns how many of those were not read (a
 * read failed, or the time ran out; logged): the sync reads them.  Main
 * thread, before the fronts get cfg.
 */
size_t overrides_sync_set_config(struct overrides *o, struct config *cfg,
    const struct config *old, int64_t wait_ms);
/* Stop the sync's thread and wait for it, so that the store can be freed:
 * the sync gives up its round between two calls to the store (a page of a
 * hash, a batch of expired fields), so this waits for the one call under
 * way at most, redis.timeout.  o stays usable, overrides_notice()
 * included, until overrides_free().  Nothing when no sync runs, or once
 * stopped.  Main thread. */
void overrides_sync_stop(struct overrides *o);
/* A notice heard on the release channel: "<prefix>override:<rule>" reads
 * that rule again; NULL (the subscription is back) reads every rule.  Any
 * thread; quick (it only wakes the sync). */
void overrides_notice(struct overrides *o, const char *msg, size_t len);

#endif
