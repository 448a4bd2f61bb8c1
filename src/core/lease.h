/*
 * lease.h - the lease strings of docs/leases.md: what POST /acquire hands out
 * for each concurrency rule that recorded, and what POST /release and
 * POST /renew take back.
 *
 * A lease is opaque to clients.  It carries what the daemon needs to find
 * the lease in the store, and nothing a client could use to free another's:
 *
 *	<hex of "<rule>:{<rendered key>}">.<cost>.<token>
 *
 * The first part is the store key without its key_prefix (so a lease stays
 * valid across daemons with one prefix); the token is 128 bits from
 * getrandom(), 32 lower-case hex digits, and only the lease with that token
 * (and that cost) is ever freed by it.
 *
 * Pure functions on caller-owned memory; any thread.
 */
#ifndef RL_LEASE_H
#define RL_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "core/limiter.h"
#include "core/rules.h"

#define LEASE_TOKEN_LEN LIMITER_TOKEN_LEN
/* "<rule>:{<key>}": a rule name (at most LEASE_RULE_MAX bytes), the
 * rendered key (at most RL_MAX_KEY_BYTES), ":{" and "}". */
#define LEASE_RULE_MAX	 255
#define LEASE_SUFFIX_MAX (LEASE_RULE_MAX + RL_MAX_KEY_BYTES + 3)

/* A new token: LEASE_TOKEN_LEN hex digits and a NUL in out.  0, or -1 when
 * the kernel gives no randomness (then no lease may be taken). */
int lease_token_new(char out[LEASE_TOKEN_LEN + 1]);

/*
 * The lease of a check that recorded: suffix is its store key without the
 * key_prefix ("<rule>:{<key>}", len bytes).  Returns a new string (the
 * caller frees it with rl_free), or NULL when out of memory.
 */
char *lease_format(const char *suffix, size_t len, int64_t cost,
    const char *token);

/* The hash by which the daemon knows a concurrency key in its queues of
 * waiters (FNV-1a over the full store key, "<prefix><rule>:{<key>}"). */
uint64_t lease_key_hash(const char *key, size_t len);

/* A parsed lease. */
struct lease_ref {
	char suffix[LEASE_SUFFIX_MAX + 1]; /* "<rule>:{<key>}", NUL */
	size_t suffix_len;
	char rule[LEASE_RULE_MAX + 1]; /* the rule's name */
	int64_t cost;		       /* >= 1 */
	char token[LEASE_TOKEN_LEN + 1];
};

/* Parse s (len bytes).  0, or -1 when it is not a well-formed lease. */
int lease_parse(const char *s, size_t len, struct lease_ref *out);

/* The bytes lease_check_make() needs in buf for a key_prefix of plen. */
#define LEASE_KEY_CAP(plen) ((plen) + LEASE_SUFFIX_MAX + LEASE_TOKEN_LEN + 2)

/*
 * The check that releases or renews the lease ref (docs/leases.md), into
 * *c: its store key "<prefix><rule>:{<key>}" and its token laid out in buf
 * (LEASE_KEY_CAP(strlen(prefix)) bytes, kept by the caller while c is
 * used), with the rule's limit and window (the limit at least the lease's
 * cost: a reload may have lowered it).
 */
void lease_check_make(struct rl_check *c, char *buf, const char *prefix,
    const struct lease_ref *ref, int64_t limit, int64_t window_ms);

#endif
