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

struct overrides;

/* A new, empty table; NULL when out of memory.  overrides_free(NULL)
 * does nothing; the sync (if started) is stopped first. */
struct overrides *overrides_new(void);
void overrides_free(struct overrides *o);

/*
 * The override of store key `key` at now_ms (epoch milliseconds; 0: the
 * clock's now, read only when the table holds something): true
 * with *limit and *window_ms set, or false (they are left alone).  An
 * override past its expiry is none.  o may be NULL (false).
 */
bool overrides_get(struct overrides *o, const char *key, size_t keylen,
    int64_t now_ms, int64_t *limit, int64_t *window_ms);

/* Set (or replace) key's override, expiring at expires_ms (0: never).
 * 0, or -1 when out of memory. */
int overrides_set(struct overrides *o, const char *key, size_t keylen,
    int64_t limit, int64_t window_ms, int64_t expires_ms);

/* Drop key's override; true iff there was a live one at now_ms. */
bool overrides_delete(struct overrides *o, const char *key, size_t keylen,
    int64_t now_ms);

/* One override, as overrides_each() hands it out. */
struct override_view {
	const char *key; /* the rendered key (inside the braces) */
	size_t keylen;
	int64_t limit, window_ms, expires_ms;
};

/* fn for every live override of rule (store keys "<prefix><rule>:{...}"),
 * under the read lock: fn must not call back into o. */
void overrides_each(struct overrides *o, const char *prefix, const char *rule,
    int64_t now_ms, void (*fn)(const struct override_view *v, void *arg),
    void *arg);

/* How many times the table has changed (overrides_set(),
 * overrides_delete(), a load by overrides_load_rule()): read it before a
 * read of a hash for overrides_load_rule(). */
unsigned long overrides_writes(struct overrides *o);

/*
 * Replace rule's overrides by the fields of an OVERRIDE_READ reply
 * (core/backend.h: pairs of length-prefixed strings, field = the rendered
 * key, value = "<limit> <window_ms> <expires_at_ms>"), read after
 * overrides_writes() said `since`.  0; 1 when the table changed since,
 * by a write or another load (the reply may predate that change: the
 * table is left as it was, and the caller reads again); or -1: a
 * malformed reply (the table is left as it was), or out of memory (the
 * rule may then hold part of the reply until the next read).
 */
int overrides_load_rule(struct overrides *o, const char *prefix,
    const char *rule, const char *reply, size_t len, unsigned long since);

/*
 * The sync with Redis (see the top of this file): a thread reading every
 * rule's hash of cfg now and then through b (borrowed; it must outlive the
 * sync).  Takes a reference to cfg.  0, or -1 with err.  Main thread.
 */
int overrides_sync_start(struct overrides *o, struct backend *b,
    struct config *cfg, char *err, size_t errlen);
/* A reload: the rules and the prefix of cfg from now on (a reference
 * taken), every rule read again.  Main thread. */
void overrides_sync_set_config(struct overrides *o, struct config *cfg);
/* A notice heard on the release channel: "<prefix>override:<rule>" reads
 * that rule again; NULL (the subscription is back) reads every rule.  Any
 * thread; quick (it only wakes the sync). */
void overrides_notice(struct overrides *o, const char *msg, size_t len);

#endif
