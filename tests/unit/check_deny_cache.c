/*
 * check_deny_cache.c - the deny cache (src/core/deny_cache.c): a denial
 * holds for the same cost until its time, never for another cost or after
 * it, nor under another limit or window; keys are compared in full; a full
 * table replaces entries and stays bounded; clear forgets everything, a
 * forget one key under every limit, and a denial asked before either is
 * not put after it; an entry answers only lookups of the generation
 * (config serial) it was learnt under.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/deny_cache.h"

/* A key under limit 10 in 1000 ms. */
#define K(s) (s), strlen(s), 10, 1000
/* The times of a denial: until, reset, effective; and what was left. */
#define T(u, r, e)	  (&(struct deny_times){ (u), (r), (e), 0 })
#define TR(u, r, e, left) (&(struct deny_times){ (u), (r), (e), (left) })

START_TEST(test_cost_and_time)
{
	struct deny_cache *dc = deny_cache_new(64);
	struct deny_times t;

	ck_assert_ptr_nonnull(dc);
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{x}"), 1, 0, &t));
	deny_cache_put(dc, 1, 0, K("rl:a:{x}"), 2, TR(1000, 5000, 700, 1));
	/* The same cost is denied until 1000, not at it, with what the
	 * store said was left. */
	ck_assert(deny_cache_get(dc, 1, K("rl:a:{x}"), 2, 999, &t));
	ck_assert_int_eq(t.until_us, 1000);
	ck_assert_int_eq(t.reset_us, 5000);
	ck_assert_int_eq(t.effective_us, 700);
	ck_assert_int_eq(t.remaining, 1);
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{x}"), 2, 1000, &t));
	/* A larger cost may have to wait longer than 1000 (more units must
	 * leave the window): ask the store. */
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{x}"), 7, 0, &t));
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{x}"), 3, 0, &t));
	/* A smaller cost may fit: ask the store. */
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{x}"), 1, 0, &t));
	/* Another key, a prefix of it, or one byte longer: a miss. */
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{y}"), 2, 0, &t));
	ck_assert(!deny_cache_get(dc, 1, "rl:a:{x}", 7, 10, 1000, 2, 0, &t));
	/* Under another limit or window (an override's): a miss. */
	ck_assert(!deny_cache_get(dc, 1, "rl:a:{x}", 8, 11, 1000, 2, 0, &t));
	ck_assert(!deny_cache_get(dc, 1, "rl:a:{x}", 8, 10, 999, 2, 0, &t));
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{x}}"), 2, 0, &t));
	/* Lookups count nothing; a request answered from the cache does. */
	ck_assert_uint_eq(deny_cache_hits(dc), 0);
	deny_cache_count_hit(dc);
	ck_assert_uint_eq(deny_cache_hits(dc), 1);
	deny_cache_free(dc);
}
END_TEST

START_TEST(test_update)
{
	struct deny_cache *dc = deny_cache_new(64);
	struct deny_times t;

	deny_cache_put(dc, 1, 0, K("k"), 3, T(1000, 2000, 0));
	/* A cheaper denial that lasts longer replaces it. */
	deny_cache_put(dc, 1, 0, K("k"), 1, T(1500, 2500, 0));
	ck_assert(deny_cache_get(dc, 1, K("k"), 1, 1200, &t));
	ck_assert_int_eq(t.until_us, 1500);
	/* A dearer one that ends sooner does not shrink it. */
	deny_cache_put(dc, 1, 0, K("k"), 5, T(1100, 2100, 0));
	ck_assert(deny_cache_get(dc, 1, K("k"), 1, 1400, &t));
	ck_assert_int_eq(t.until_us, 1500);
	deny_cache_clear(dc);
	ck_assert(!deny_cache_get(dc, 1, K("k"), 5, 0, &t));
	deny_cache_free(dc);
}
END_TEST

/* A denial learnt under one config's rules (generation 1) after a reload
 * to generation 2 is never answered under the new ones; one of the new
 * generation replaces it. */
START_TEST(test_generation)
{
	struct deny_cache *dc = deny_cache_new(64);
	struct deny_times t;

	deny_cache_put(dc, 1, 0, K("k"), 1, T(1000, 2000, 0));
	ck_assert(!deny_cache_get(dc, 2, K("k"), 1, 0, &t));
	ck_assert(deny_cache_get(dc, 1, K("k"), 1, 0, &t));
	/* A dearer denial that ends sooner, of the new generation: not
	 * kept out by the old cheaper one. */
	deny_cache_put(dc, 2, 0, K("k"), 3, T(500, 900, 0));
	ck_assert(deny_cache_get(dc, 2, K("k"), 3, 0, &t));
	ck_assert_int_eq(t.until_us, 500);
	ck_assert(!deny_cache_get(dc, 1, K("k"), 1, 0, &t));
	deny_cache_free(dc);
}
END_TEST

/* The stamp of a key: its slot's (the limit and window play no part). */
static uint64_t
stamp_of(struct deny_cache *dc, const char *key)
{
	return deny_cache_stamp(dc, key, strlen(key));
}

/* A denial the store decided before a clear (an admin reset of the key),
 * put after it, is dropped: the key's state may be gone.  One asked after
 * the clear is kept. */
START_TEST(test_put_after_clear)
{
	struct deny_cache *dc = deny_cache_new(64);
	struct deny_times t;
	uint64_t before = stamp_of(dc, "k");

	deny_cache_clear(dc);
	deny_cache_put(dc, 1, before, K("k"), 1, T(1000, 2000, 0));
	ck_assert(!deny_cache_get(dc, 1, K("k"), 1, 0, &t));
	deny_cache_put(dc, 1, stamp_of(dc, "k"), K("k"), 1, T(1000, 2000, 0));
	ck_assert(deny_cache_get(dc, 1, K("k"), 1, 0, &t));
	deny_cache_free(dc);
}
END_TEST

/*
 * Units of a key given back (a Cluster take-back): a forget drops its
 * entry whatever the limit it was learnt under (an override's), and a
 * denial of it asked before, put after, is dropped too.  Another key in
 * another slot keeps its entry and its denials in flight.
 */
START_TEST(test_forget)
{
	struct deny_cache *dc = deny_cache_new(64);
	struct deny_times t;
	uint64_t before, other_before;
	char other[32];
	int i;

	/* A key in another slot than "k"'s: its stamp stays. */
	for (i = 0;; i++) {
		snprintf(other, sizeof(other), "o-%d", i);
		other_before = stamp_of(dc, other);
		deny_cache_forget(dc, "k", 1);
		if (stamp_of(dc, other) == other_before)
			break;
		ck_assert_int_lt(i, 1000);
	}
	deny_cache_put(dc, 1, stamp_of(dc, "k"), "k", 1, 3, 500, 1,
	    T(1000, 2000, 0));
	ck_assert(deny_cache_get(dc, 1, "k", 1, 3, 500, 1, 0, &t));
	deny_cache_put(dc, 1, other_before, K(other), 1, T(1000, 2000, 0));
	before = stamp_of(dc, "k");
	other_before = stamp_of(dc, other);
	deny_cache_forget(dc, "k", 1);
	ck_assert(!deny_cache_get(dc, 1, "k", 1, 3, 500, 1, 0, &t));
	ck_assert(deny_cache_get(dc, 1, K(other), 1, 0, &t));
	/* Asked before the forget, answered after: not learnt. */
	deny_cache_put(dc, 1, before, K("k"), 1, T(1000, 2000, 0));
	ck_assert(!deny_cache_get(dc, 1, K("k"), 1, 0, &t));
	deny_cache_put(dc, 1, other_before, K(other), 2, T(1500, 2000, 0));
	ck_assert(deny_cache_get(dc, 1, K(other), 2, 0, &t));
	ck_assert_int_eq(t.until_us, 1500);
	/* Asked after it: learnt. */
	deny_cache_put(dc, 1, stamp_of(dc, "k"), K("k"), 1, T(1000, 2000, 0));
	ck_assert(deny_cache_get(dc, 1, K("k"), 1, 0, &t));
	deny_cache_forget(NULL, "k", 1);
	deny_cache_free(dc);
}
END_TEST

/* More keys than slots: each answer is still right for its own key (a
 * replaced entry is a miss, never another key's answer). */
START_TEST(test_bounded)
{
	struct deny_cache *dc = deny_cache_new(16);
	struct deny_times t;
	char key[32];
	int i, hits = 0;

	for (i = 0; i < 1000; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		deny_cache_put(dc, 1, 0, K(key), 1, T(1000 + i, 9000, 0));
	}
	for (i = 0; i < 1000; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		if (deny_cache_get(dc, 1, K(key), 1, 0, &t)) {
			ck_assert_int_eq(t.until_us, 1000 + i);
			hits++;
		}
	}
	ck_assert_int_ge(hits, 1);
	ck_assert_int_le(hits, 16);
	deny_cache_free(dc);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("deny_cache");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_cost_and_time);
	tcase_add_test(tc, test_update);
	tcase_add_test(tc, test_generation);
	tcase_add_test(tc, test_put_after_clear);
	tcase_add_test(tc, test_forget);
	tcase_add_test(tc, test_bounded);
	suite_add_tcase(s, tc);
	return s;
}
