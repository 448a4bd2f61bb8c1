/*
 * check_deny_cache.c - the deny cache (src/core/deny_cache.c): a denial
 * holds for the same cost until its time, never for another cost or after
 * it; keys are compared in full; a full table replaces
 * entries and stays bounded; clear forgets everything, and a denial asked
 * before a clear is not put after it; an entry answers only lookups of the
 * generation (config serial) it was learnt under.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/deny_cache.h"

#define K(s) (s), strlen(s)
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
	ck_assert(!deny_cache_get(dc, 1, "rl:a:{x}", 7, 2, 0, &t));
	ck_assert(!deny_cache_get(dc, 1, K("rl:a:{x}}"), 2, 0, &t));
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

/* A denial the store decided before a clear (an admin reset of the key),
 * put after it, is dropped: the key's state may be gone.  One asked after
 * the clear is kept. */
START_TEST(test_put_after_clear)
{
	struct deny_cache *dc = deny_cache_new(64);
	struct deny_times t;
	uint64_t before = deny_cache_clears(dc);

	deny_cache_clear(dc);
	deny_cache_put(dc, 1, before, K("k"), 1, T(1000, 2000, 0));
	ck_assert(!deny_cache_get(dc, 1, K("k"), 1, 0, &t));
	deny_cache_put(dc, 1, deny_cache_clears(dc), K("k"), 1,
	    T(1000, 2000, 0));
	ck_assert(deny_cache_get(dc, 1, K("k"), 1, 0, &t));
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
	tcase_add_test(tc, test_bounded);
	suite_add_tcase(s, tc);
	return s;
}
