/*
 * check_deny_cache.c - the deny cache (src/core/deny_cache.c): a denial
 * holds for the same cost until its time, never for another cost or after
 * it; keys are compared in full; a full table replaces
 * entries and stays bounded; clear forgets everything.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/deny_cache.h"

#define K(s) (s), strlen(s)

START_TEST(test_cost_and_time)
{
	struct deny_cache *dc = deny_cache_new(64);
	int64_t until, reset;

	ck_assert_ptr_nonnull(dc);
	ck_assert(!deny_cache_get(dc, K("rl:a:{x}"), 1, 0, &until, &reset));
	deny_cache_put(dc, K("rl:a:{x}"), 2, 1000, 5000);
	/* The same cost is denied until 1000, not at it. */
	ck_assert(deny_cache_get(dc, K("rl:a:{x}"), 2, 999, &until, &reset));
	ck_assert_int_eq(until, 1000);
	ck_assert_int_eq(reset, 5000);
	ck_assert(!deny_cache_get(dc, K("rl:a:{x}"), 2, 1000, &until,
	    &reset));
	/* A larger cost may have to wait longer than 1000 (more units must
	 * leave the window): ask the store. */
	ck_assert(!deny_cache_get(dc, K("rl:a:{x}"), 7, 0, &until, &reset));
	ck_assert(!deny_cache_get(dc, K("rl:a:{x}"), 3, 0, &until, &reset));
	/* A smaller cost may fit: ask the store. */
	ck_assert(!deny_cache_get(dc, K("rl:a:{x}"), 1, 0, &until, &reset));
	/* Another key, a prefix of it, or one byte longer: a miss. */
	ck_assert(!deny_cache_get(dc, K("rl:a:{y}"), 2, 0, &until, &reset));
	ck_assert(!deny_cache_get(dc, "rl:a:{x}", 7, 2, 0, &until, &reset));
	ck_assert(!deny_cache_get(dc, K("rl:a:{x}}"), 2, 0, &until, &reset));
	ck_assert_uint_eq(deny_cache_hits(dc), 1);
	deny_cache_free(dc);
}
END_TEST

START_TEST(test_update)
{
	struct deny_cache *dc = deny_cache_new(64);
	int64_t until, reset;

	deny_cache_put(dc, K("k"), 3, 1000, 2000);
	/* A cheaper denial that lasts longer replaces it. */
	deny_cache_put(dc, K("k"), 1, 1500, 2500);
	ck_assert(deny_cache_get(dc, K("k"), 1, 1200, &until, &reset));
	ck_assert_int_eq(until, 1500);
	/* A dearer one that ends sooner does not shrink it. */
	deny_cache_put(dc, K("k"), 5, 1100, 2100);
	ck_assert(deny_cache_get(dc, K("k"), 1, 1400, &until, &reset));
	ck_assert_int_eq(until, 1500);
	deny_cache_clear(dc);
	ck_assert(!deny_cache_get(dc, K("k"), 5, 0, &until, &reset));
	deny_cache_free(dc);
}
END_TEST

/* More keys than slots: each answer is still right for its own key (a
 * replaced entry is a miss, never another key's answer). */
START_TEST(test_bounded)
{
	struct deny_cache *dc = deny_cache_new(16);
	int64_t until, reset;
	char key[32];
	int i, hits = 0;

	for (i = 0; i < 1000; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		deny_cache_put(dc, K(key), 1, 1000 + i, 9000);
	}
	for (i = 0; i < 1000; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		if (deny_cache_get(dc, K(key), 1, 0, &until, &reset)) {
			ck_assert_int_eq(until, 1000 + i);
			hits++;
		}
	}
	ck_assert_int_ge(hits, 1);
	ck_assert_int_le(hits, 16);
	deny_cache_free(dc);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("deny_cache");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_cost_and_time);
	tcase_add_test(tc, test_update);
	tcase_add_test(tc, test_bounded);
	suite_add_tcase(s, tc);
	return s;
}
