/*
 * check_overrides.c - the table of limits per key (core/overrides.h):
 * a rule's overrides replaced by a read of its Redis hash, and such a read
 * that a write of this daemon overtook left unapplied, so that a read
 * begun before the admin API changed an override cannot bring the old
 * one back (docs/admin.md); expired overrides freed and the table
 * bounded (OVERRIDES_MAX); a rule's overrides kept apart from another's;
 * a rule the config no longer has named as holding some (the memory
 * store keeps them) or dropped (with Redis).
 * Pure: the replies are made here in the
 * OVERRIDE_READ form of core/backend.h.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/overrides.h"

#define KEY_VIP	  "rl:api:{vip}"
#define KEY_OTHER "rl:api:{other}"

/* An OVERRIDE_READ reply: field, value, field, value... (NULL ends). */
static char *
reply_of(size_t *len, ...)
{
	static char buf[1024];
	const char *s;
	uint32_t n;
	va_list ap;

	*len = 0;
	va_start(ap, len);
	while ((s = va_arg(ap, const char *)) != NULL) {
		n = (uint32_t)strlen(s);
		ck_assert_uint_le(*len + sizeof(n) + n, sizeof(buf));
		memcpy(buf + *len, &n, sizeof(n));
		memcpy(buf + *len + sizeof(n), s, n);
		*len += sizeof(n) + n;
	}
	va_end(ap);
	return buf;
}

static int64_t
limit_of(struct overrides *o, const char *key)
{
	int64_t limit = -1, window = -1;

	if (!overrides_get(o, key, strlen(key), 1000, &limit, &window))
		return 0;
	return limit;
}

/* Load rule api's reply r, read with no write since. */
static int
load_fresh(struct overrides *o, const char *r, size_t len)
{
	return overrides_load_rule(o, "rl:", "api", r, len,
	    overrides_writes(o, "rl:", "api"));
}

START_TEST(test_load_replaces_the_rule)
{
	struct overrides *o = overrides_new();
	const char *r;
	size_t len;

	ck_assert_ptr_nonnull(o);
	r = reply_of(&len, "vip", "5 10000 0", "other", "7 10000 0", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 5);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 7);
	/* The hash without vip: gone from the table too. */
	r = reply_of(&len, "other", "8 10000 0", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 0);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 8);
	/* A malformed reply changes nothing. */
	r = reply_of(&len, "other", "nine", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), -1);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 8);
	overrides_free(o);
}
END_TEST

/* A field that comes twice (HSCAN may send one again) keeps its last
 * value, expired or not: an expired later copy leaves no override. */
struct reloader {
	struct overrides *o;
	const char *reply;
	size_t len;
	atomic_int stop;
	atomic_long loads;
};

static void *
reload_loop(void *arg)
{
	struct reloader *rl = arg;

	while (!atomic_load(&rl->stop)) {
		ck_assert_int_eq(load_fresh(rl->o, rl->reply, rl->len), 0);
		atomic_fetch_add(&rl->loads, 1);
	}
	return NULL;
}

/* A rule's overrides read again while decisions look them up: every
 * lookup finds the override, never a table that seems empty while the
 * old entries are out and the new not yet in (the rule holds every
 * entry, so the count would pass through 0). */
START_TEST(test_load_while_looked_up)
{
	struct reloader rl = { 0 };
	pthread_t th;
	long i, missed = 0;
	size_t len;

	rl.o = overrides_new();
	ck_assert_ptr_nonnull(rl.o);
	rl.reply = reply_of(&len, "vip", "5 10000 0", NULL);
	rl.len = len;
	ck_assert_int_eq(load_fresh(rl.o, rl.reply, rl.len), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, reload_loop, &rl), 0);
	for (i = 0;
	     i < 3000000 && (i < 100000 || atomic_load(&rl.loads) < 20000); i++)
		missed += limit_of(rl.o, KEY_VIP) != 5;
	atomic_store(&rl.stop, 1);
	pthread_join(th, NULL);
	ck_assert_msg(missed == 0, "%ld of %ld lookups missed, %ld loads",
	    missed, i, atomic_load(&rl.loads));
	ck_assert_uint_eq(overrides_count(rl.o), 1);
	overrides_free(rl.o);
}
END_TEST

START_TEST(test_load_twice_last_expired)
{
	struct overrides *o = overrides_new();
	const char *r;
	size_t len;

	ck_assert_ptr_nonnull(o);
	r = reply_of(&len, "vip", "5 10000 0", "other", "7 10000 0", "vip",
	    "9 10000 1000", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 0);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 7);
	ck_assert_uint_eq(overrides_count(o), 1);
	/* Expired, then live again: the last value. */
	r = reply_of(&len, "vip", "5 10000 0", "vip", "9 10000 1000", "vip",
	    "6 10000 0", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 6);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 0);
	ck_assert_uint_eq(overrides_count(o), 1);
	overrides_free(o);
}
END_TEST

/* A limit past a rule's bound, as an older daemon could write (up to
 * 2^53), is read as the bound. */
START_TEST(test_load_limit_past_bound)
{
	struct overrides *o = overrides_new();
	const char *r;
	size_t len;

	ck_assert_ptr_nonnull(o);
	r = reply_of(&len, "vip", "9007199254740992 10000 0", "other",
	    "1000000000 10000 0", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 1000000000);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 1000000000);
	overrides_free(o);
}
END_TEST

/* The race a daemon's sync can lose: its read of the hash begins, the
 * admin API then sets (or deletes) an override in Redis and in the table,
 * and the read's reply, from before that write, arrives last. */
START_TEST(test_load_overtaken_by_a_write)
{
	struct overrides *o = overrides_new();
	unsigned long since;
	const char *r;
	size_t len;

	ck_assert_ptr_nonnull(o);
	/* A set: the reply from before it does not take it back. */
	since = overrides_writes(o, "rl:", "api");
	ck_assert_int_eq(overrides_set(o, "rl:", "api", "vip", 3, 5, 10000, 0,
			     1000),
	    0);
	r = reply_of(&len, "other", "7 10000 0", NULL);
	ck_assert_int_eq(overrides_load_rule(o, "rl:", "api", r, len, since),
	    1);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 5);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 0);

	/* A delete: the reply from before it does not bring it back. */
	since = overrides_writes(o, "rl:", "api");
	ck_assert(overrides_delete(o, "rl:", "api", "vip", 3, 1000));
	r = reply_of(&len, "vip", "5 10000 0", NULL);
	ck_assert_int_eq(overrides_load_rule(o, "rl:", "api", r, len, since),
	    1);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 0);

	/* A read begun after the write is applied. */
	since = overrides_writes(o, "rl:", "api");
	r = reply_of(&len, "other", "7 10000 0", NULL);
	ck_assert_int_eq(overrides_load_rule(o, "rl:", "api", r, len, since),
	    0);
	ck_assert_int_eq(limit_of(o, KEY_OTHER), 7);
	overrides_free(o);
}
END_TEST

/* A read of one rule's hash is overtaken only by changes of that rule:
 * writes to another rule while it was out (a read of a big hash takes a
 * while, in pages) do not make it read again, and so never starve it. */
START_TEST(test_load_not_overtaken_by_another_rule)
{
	struct overrides *o = overrides_new();
	unsigned long since;
	const char *r;
	size_t len;
	int i;

	ck_assert_ptr_nonnull(o);
	since = overrides_writes(o, "rl:", "api");
	for (i = 0; i < 3; i++) {
		ck_assert_int_eq(overrides_set(o, "rl:", "tb", "x", 1, 5, 10000,
				     0, 1000),
		    0);
		ck_assert(overrides_delete(o, "rl:", "tb", "x", 1, 1000));
	}
	r = reply_of(&len, "vip", "5 10000 0", NULL);
	ck_assert_int_eq(overrides_load_rule(o, "rl:", "api", r, len, since),
	    0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 5);
	/* A change of api's own still overtakes it. */
	since = overrides_writes(o, "rl:", "api");
	ck_assert(overrides_delete(o, "rl:", "api", "vip", 3, 1000));
	ck_assert_int_eq(overrides_load_rule(o, "rl:", "api", r, len, since),
	    1);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 0);
	/* A rule whose group was made and freed since the count was read
	 * (api holds none now). */
	since = overrides_writes(o, "rl:", "api");
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert(overrides_delete(o, "rl:", "api", "vip", 3, 1000));
	ck_assert_int_eq(overrides_load_rule(o, "rl:", "api", r, len, since),
	    1);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 0);
	overrides_free(o);
}
END_TEST

/* A reply of api's fields k<from>..k<to - 1>, each "<limit> 10000 0",
 * then `extra` (a field again, as HSCAN may send it; NULL: none) with
 * "<extra_limit> 10000 0".  New (free). */
static char *
big_reply(int from, int to, int limit, const char *extra, int extra_limit,
    size_t *len)
{
	char *buf = malloc((size_t)(to - from + 1) * 48), *p = buf;
	char f[32], v[32];
	uint32_t n;
	int i;

	ck_assert_ptr_nonnull(buf);
	for (i = from; i <= to; i++) {
		if (i < to)
			snprintf(f, sizeof(f), "k%d", i);
		else if (extra != NULL)
			snprintf(f, sizeof(f), "%s", extra);
		else
			break;
		snprintf(v, sizeof(v), "%d 10000 0",
		    i < to ? limit : extra_limit);
		n = (uint32_t)strlen(f);
		memcpy(p, &n, sizeof(n));
		memcpy(p + sizeof(n), f, n);
		p += sizeof(n) + n;
		n = (uint32_t)strlen(v);
		memcpy(p, &n, sizeof(n));
		memcpy(p + sizeof(n), v, n);
		p += sizeof(n) + n;
	}
	*len = (size_t)(p - buf);
	return buf;
}

/* The limit of api's key k<i> (0: none). */
static int64_t
limit_of_k(struct overrides *o, int i)
{
	char key[48];

	snprintf(key, sizeof(key), "rl:api:{k%d}", i);
	return limit_of(o, key);
}

/* A reload of a big rule replaces it whole: of 5,000 entries, half are
 * replaced with new limits, half removed, 2,500 added, a field sent twice
 * keeps its last value, and another rule's entries are not touched; the
 * entries stay findable as the chains grow past them. */
START_TEST(test_load_big_rule_again)
{
	struct overrides *o = overrides_new();
	char *r;
	size_t len;
	int i;

	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(overrides_set(o, "rl:", "tb", "x", 1, 4, 10000, 0,
			     1000),
	    0);
	r = big_reply(0, 5000, 5, NULL, 0, &len);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	free(r);
	ck_assert_uint_eq(overrides_count(o), 5001);
	ck_assert_int_eq(limit_of_k(o, 0), 5);
	ck_assert_int_eq(limit_of_k(o, 4999), 5);

	r = big_reply(2500, 7500, 7, "k3000", 9, &len);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	free(r);
	ck_assert_uint_eq(overrides_count(o), 5001);
	for (i = 0; i < 2500; i++)
		ck_assert_int_eq(limit_of_k(o, i), 0);
	for (i = 2500; i < 7500; i++)
		ck_assert_int_eq(limit_of_k(o, i), i == 3000 ? 9 : 7);
	ck_assert_int_eq(limit_of_k(o, 7500), 0);
	ck_assert_int_eq(limit_of(o, "rl:tb:{x}"), 4);

	/* Emptied: the rule holds nothing, the other rule its own. */
	ck_assert_int_eq(load_fresh(o, "", 0), 0);
	ck_assert_uint_eq(overrides_count(o), 1);
	ck_assert_int_eq(limit_of_k(o, 3000), 0);
	ck_assert_int_eq(limit_of(o, "rl:tb:{x}"), 4);
	overrides_free(o);
}
END_TEST

/* Load rule api's hash holding vip at value, read when the count said
 * since. */
static int
load_vip(struct overrides *o, const char *value, unsigned long since)
{
	size_t len;
	const char *r = reply_of(&len, "vip", value, NULL);

	return overrides_load_rule(o, "rl:", "api", r, len, since);
}

/* Two reads of one hash that overlap, as the admin API's GET and the
 * sync make them: the one begun first is read before a write of another
 * daemon (vip at 5), the other after it (vip at 9).  Whichever is applied
 * first, the other one, begun before that, is not applied over it: the
 * newer reply is never taken back by the older one arriving last. */
START_TEST(test_load_overtaken_by_a_load)
{
	struct overrides *o = overrides_new();
	unsigned long old_since, new_since;

	ck_assert_ptr_nonnull(o);
	/* The newer reply is applied first; the older one comes last. */
	old_since = overrides_writes(o, "rl:", "api");
	new_since = overrides_writes(o, "rl:", "api");
	ck_assert_int_eq(load_vip(o, "9 10000 0", new_since), 0);
	ck_assert_int_eq(load_vip(o, "5 10000 0", old_since), 1);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 9);

	/* The older reply is applied first; the newer one, begun before
	 * that, is refused too, and read again it is applied. */
	old_since = overrides_writes(o, "rl:", "api");
	new_since = overrides_writes(o, "rl:", "api");
	ck_assert_int_eq(load_vip(o, "5 10000 0", old_since), 0);
	ck_assert_int_eq(load_vip(o, "9 10000 0", new_since), 1);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 5);
	ck_assert_int_eq(load_vip(o, "9 10000 0",
			     overrides_writes(o, "rl:", "api")),
	    0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 9);

	/* A malformed reply changes nothing, so it overtakes nothing. */
	new_since = overrides_writes(o, "rl:", "api");
	ck_assert_int_eq(load_vip(o, "nine", overrides_writes(o, "rl:", "api")),
	    -1);
	ck_assert_int_eq(load_vip(o, "11 10000 0", new_since), 0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 11);
	overrides_free(o);
}
END_TEST

/* Set api's override of key k at now_ms 1000, expiring at exp. */
static int
set_at(struct overrides *o, const char *k, int64_t limit, int64_t exp)
{
	return overrides_set(o, "rl:", "api", k, strlen(k), limit, 10000, exp,
	    1000);
}

/* Expired overrides are freed, not only skipped: thousands set with a
 * TTL that has passed leave no more than a prune's threshold behind, and
 * a read of the hash leaves its expired fields out. */
START_TEST(test_expired_freed)
{
	struct overrides *o = overrides_new();
	const char *r;
	char key[32];
	size_t len;
	int i;

	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(set_at(o, "vip", 5, 0), 0);
	for (i = 0; i < 5000; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		ck_assert_int_eq(set_at(o, key, 2, 900), 0); /* expired */
	}
	ck_assert_msg(overrides_count(o) <= 1024, "%zu entries kept",
	    overrides_count(o));
	ck_assert_int_eq(limit_of(o, KEY_VIP), 5);
	ck_assert_int_eq(limit_of(o, "rl:api:{k4999}"), 0);

	r = reply_of(&len, "vip", "5 10000 0", "old", "7 10000 1", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert_uint_eq(overrides_count(o), 1);
	overrides_free(o);
}
END_TEST

/* At OVERRIDES_MAX live overrides a new one is refused (ENOSPC), a
 * change of one already there is not, and room comes back as they are
 * deleted or expire. */
START_TEST(test_bounded)
{
	struct overrides *o = overrides_new();
	char key[32];
	int i;

	ck_assert_ptr_nonnull(o);
	for (i = 0; i < OVERRIDES_MAX - 1; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		ck_assert_int_eq(set_at(o, key, 2, 0), 0);
	}
	ck_assert_int_eq(set_at(o, "brief", 2, 1500), 0);
	ck_assert_uint_eq(overrides_count(o), OVERRIDES_MAX);
	errno = 0;
	ck_assert_int_eq(set_at(o, "one-more", 2, 0), -1);
	ck_assert_int_eq(errno, ENOSPC);
	ck_assert(!overrides_has_room(o, "rl:", "api", "one-more", 8, 1000));
	ck_assert(overrides_has_room(o, "rl:", "api", "k7", 2, 1000));
	ck_assert_int_eq(set_at(o, "k7", 9, 0), 0);
	ck_assert_int_eq(limit_of(o, "rl:api:{k7}"), 9);
	ck_assert_int_eq(limit_of(o, "rl:api:{one-more}"), 0);

	/* An expired one makes room. */
	ck_assert(overrides_has_room(o, "rl:", "api", "one-more", 8, 2000));
	ck_assert_int_eq(overrides_set(o, "rl:", "api", "one-more", 8, 3, 10000,
			     0, 2000),
	    0);
	/* So does a delete. */
	ck_assert_int_eq(set_at(o, "two-more", 2, 0), -1);
	ck_assert(overrides_delete(o, "rl:", "api", "k8", 2, 1000));
	ck_assert_int_eq(set_at(o, "two-more", 2, 0), 0);
	ck_assert_int_eq(limit_of(o, "rl:api:{two-more}"), 2);
	overrides_free(o);
}
END_TEST

/*
 * A load past the bound keeps the keys the table holds: the rule holds
 * k0..k99, another rule fills the rest, and a reply of k0..k99 and
 * k100..k109 (110 fields, 10 more than there is room for) leaves k0..k99 in
 * use and k100..k109 out, whatever the order of the reply.  (The reply's
 * order decided: ten keys in use were thrown out for the new ones.)
 */
START_TEST(test_load_past_bound_keeps_held)
{
	struct overrides *o = overrides_new();
	char *r, *a, *b;
	size_t len, la, lb;
	int i, order;

	ck_assert_ptr_nonnull(o);
	r = big_reply(0, 100, 5, NULL, 0, &len);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	free(r);
	for (i = 0; overrides_count(o) < OVERRIDES_MAX; i++) {
		char key[32];

		snprintf(key, sizeof(key), "f%d", i);
		ck_assert_int_eq(overrides_set(o, "rl:", "tb", key, strlen(key),
				     4, 10000, 0, 1000),
		    0);
	}
	/* Both orders: which fields of a reply come first is HSCAN's. */
	a = big_reply(0, 100, 6, NULL, 0, &la);
	b = big_reply(100, 110, 7, NULL, 0, &lb);
	ck_assert_ptr_nonnull(r = malloc(la + lb));
	for (order = 0; order < 2; order++) {
		memcpy(r, order == 0 ? a : b, order == 0 ? la : lb);
		memcpy(r + (order == 0 ? la : lb), order == 0 ? b : a,
		    order == 0 ? lb : la);
		errno = 0;
		ck_assert_int_eq(load_fresh(o, r, la + lb), -1);
		ck_assert_int_eq(errno, ENOSPC);
		ck_assert_uint_eq(overrides_count(o), OVERRIDES_MAX);
		for (i = 0; i < 100; i++)
			ck_assert_int_eq(limit_of_k(o, i), 6);
		for (i = 100; i < 110; i++)
			ck_assert_int_eq(limit_of_k(o, i), 0);
	}
	free(a);
	free(b);
	free(r);
	overrides_free(o);
}
END_TEST

static void
count_one(const struct override_view *v, void *arg)
{
	(void)v;
	(*(int *)arg)++;
}

/* A rule's overrides are its own: listing or reloading rule api touches
 * neither rule api2 (a name that begins like it) nor another prefix. */
START_TEST(test_rules_apart)
{
	struct overrides *o = overrides_new();
	const char *r;
	size_t len;
	int n = 0;

	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(set_at(o, "vip", 5, 0), 0);
	ck_assert_int_eq(overrides_set(o, "rl:", "api2", "vip", 3, 6, 10000, 0,
			     1000),
	    0);
	ck_assert_int_eq(overrides_set(o, "x:", "api", "vip", 3, 7, 10000, 0,
			     1000),
	    0);
	overrides_each(o, "rl:", "api", 1000, count_one, &n);
	ck_assert_int_eq(n, 1);
	r = reply_of(&len, NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	ck_assert_int_eq(limit_of(o, KEY_VIP), 0);
	ck_assert_int_eq(limit_of(o, "rl:api2:{vip}"), 6);
	ck_assert_int_eq(limit_of(o, "x:api:{vip}"), 7);
	ck_assert_uint_eq(overrides_count(o), 2);
	overrides_free(o);
}
END_TEST

/* A config of rule api only (no longer rule gone), key_prefix "rl:"
 * (the default). */
static struct config *
config_api_only(void)
{
	static const char text[] =
	    "rules:\n"
	    "  - name: api\n"
	    "    key: \"${user}\"\n"
	    "    limit: 3\n"
	    "    window: 10s\n";
	char err[256];
	struct config *c;

	c = config_load_string("t.yaml", text, strlen(text), err, sizeof(err));
	ck_assert_msg(c != NULL, "%s", err);
	return c;
}

/* The table full, OVERRIDES_MAX - 3 overrides of api and 3 of gone, a
 * rule the config then no longer has. */
static struct overrides *
full_with_gone(void)
{
	struct overrides *o = overrides_new();
	char key[32];
	int i;

	ck_assert_ptr_nonnull(o);
	for (i = 0; i < OVERRIDES_MAX - 3; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		ck_assert_int_eq(set_at(o, key, 2, 0), 0);
	}
	for (i = 0; i < 3; i++) {
		snprintf(key, sizeof(key), "g%d", i);
		ck_assert_int_eq(overrides_set(o, "rl:", "gone", key,
				     strlen(key), 2, 10000, 0, 1000),
		    0);
	}
	ck_assert_int_eq(set_at(o, "one-more", 2, 0), -1);
	return o;
}

/* The memory store keeps a removed rule's overrides: the table names the
 * rule as one that holds some, and a delete of one makes room. */
START_TEST(test_removed_rule_kept)
{
	struct overrides *o = full_with_gone();
	struct config *c = config_api_only();
	char names[128];

	ck_assert(overrides_has_rule(o, "rl:", "gone"));
	ck_assert(!overrides_has_rule(o, "rl:", "never"));
	ck_assert_uint_eq(overrides_unconfigured(o, c, 1000, names,
			      sizeof(names)),
	    1);
	ck_assert_str_eq(names, "\"gone\" (3)");
	ck_assert(overrides_delete(o, "rl:", "gone", "g0", 2, 1000));
	ck_assert_uint_eq(overrides_unconfigured(o, c, 1000, names,
			      sizeof(names)),
	    1);
	ck_assert_str_eq(names, "\"gone\" (2)");
	ck_assert_int_eq(set_at(o, "one-more", 2, 0), 0);
	config_unref(c);
	overrides_free(o);
}
END_TEST

/* With Redis the copy of a removed rule's overrides goes (its hash keeps
 * them): room comes back at once; api's stay. */
START_TEST(test_removed_rule_dropped)
{
	struct overrides *o = full_with_gone();
	struct config *c = config_api_only();
	char names[128];

	overrides_drop_unconfigured(o, c);
	ck_assert_uint_eq(overrides_count(o), OVERRIDES_MAX - 3);
	ck_assert(!overrides_has_rule(o, "rl:", "gone"));
	ck_assert_uint_eq(overrides_unconfigured(o, c, 1000, names,
			      sizeof(names)),
	    0);
	ck_assert_str_eq(names, "");
	ck_assert_int_eq(limit_of(o, "rl:api:{k7}"), 2);
	ck_assert_int_eq(set_at(o, "one-more", 2, 0), 0);
	config_unref(c);
	overrides_free(o);
}
END_TEST

/* An override without a window of its own (0, as PUT stores it and the
 * hash holds it) leaves the caller's window, the rule's, alone; a hash
 * with such a field is no malformed one.  A token_bucket's limit is fit
 * to the window it runs with. */
START_TEST(test_rule_window)
{
	struct overrides *o = overrides_new();
	int64_t limit = 3, window = 3600000;
	const char *r;
	size_t len;

	ck_assert_ptr_nonnull(o);
	ck_assert_int_eq(overrides_set(o, "rl:", "api", "vip", 3, 7, 0, 0,
			     1000),
	    0);
	ck_assert(overrides_get(o, KEY_VIP, strlen(KEY_VIP), 1000, &limit,
	    &window));
	ck_assert_int_eq(limit, 7);
	ck_assert_int_eq(window, 3600000);
	r = reply_of(&len, "other", "9 0 0", NULL);
	ck_assert_int_eq(load_fresh(o, r, len), 0);
	limit = 3;
	window = 60000;
	ck_assert(overrides_get(o, KEY_OTHER, strlen(KEY_OTHER), 1000, &limit,
	    &window));
	ck_assert_int_eq(limit, 9);
	ck_assert_int_eq(window, 60000);
	ck_assert_int_eq(overrides_fit_limit(RL_ALG_TOKEN_BUCKET, 5000000,
			     1000),
	    1000000);
	ck_assert_int_eq(overrides_fit_limit(RL_ALG_TOKEN_BUCKET, 5000, 1000),
	    5000);
	ck_assert_int_eq(overrides_fit_limit(RL_ALG_FIXED_WINDOW, 5000000,
			     1000),
	    5000000);
	overrides_free(o);
}
END_TEST

/* The per-algorithm check shared with the config file: a token_bucket
 * needs 1 us of window per unit; the others take any limit. */
START_TEST(test_limit_ok)
{
	char err[128];

	ck_assert(overrides_limit_ok(RL_ALG_TOKEN_BUCKET, 1000000, 1000, err,
	    sizeof(err)));
	ck_assert(!overrides_limit_ok(RL_ALG_TOKEN_BUCKET, 1000001, 1000, err,
	    sizeof(err)));
	ck_assert_msg(strstr(err, "limit <= 1000000") != NULL, "%s", err);
	ck_assert(overrides_limit_ok(RL_ALG_SLIDING_WINDOW, 10000000, 1000, err,
	    sizeof(err)));
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("overrides");
	TCase *tc = tcase_create("overrides");

	tcase_add_test(tc, test_load_replaces_the_rule);
	tcase_add_test(tc, test_load_limit_past_bound);
	tcase_add_test(tc, test_load_overtaken_by_a_write);
	tcase_add_test(tc, test_load_overtaken_by_a_load);
	tcase_add_test(tc, test_load_not_overtaken_by_another_rule);
	tcase_add_test(tc, test_load_big_rule_again);
	tcase_add_test(tc, test_load_twice_last_expired);
	tcase_add_test(tc, test_load_while_looked_up);
	tcase_add_test(tc, test_expired_freed);
	tcase_add_test(tc, test_bounded);
	tcase_add_test(tc, test_load_past_bound_keeps_held);
	tcase_add_test(tc, test_rules_apart);
	tcase_add_test(tc, test_removed_rule_kept);
	tcase_add_test(tc, test_removed_rule_dropped);
	tcase_add_test(tc, test_rule_window);
	tcase_add_test(tc, test_limit_ok);
	suite_add_tcase(s, tc);
	return s;
}
