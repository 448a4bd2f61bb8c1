/*
 * check_prefetch_hold.c - the quota a daemon holds in advance
 * (src/core/prefetch.c; docs/algorithms.md, "Taking quota in advance"):
 * units are taken only while enough are held and before their deadline;
 * units put back never outlive their own deadline; a second chunk keeps
 * the earlier deadline; what leaves unused is reported lost; memory is
 * bounded, and a key with no room, or holding the cost already, asks
 * for no chunk; after a reload nothing taken under the old rules is held,
 * nor after a counter reset what a call that left before it brings, nor
 * after a forget of every key (a reset that may have gone unheard)
 * anything held or in flight then.
 */
#include <check.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/prefetch.h"

#define K(s) (s), strlen(s)
#define G    7 /* the holdings' generation (a config's serial) */

static int64_t lost;

static void
on_lost(const char *rule, int64_t units, void *arg)
{
	(void)arg;
	ck_assert_str_eq(rule, "hot");
	lost += units;
}

START_TEST(test_take_until_deadline)
{
	struct prefetch *pf = prefetch_new(8, G, on_lost, NULL);
	struct prefetch_view v;

	lost = 0;
	ck_assert(!prefetch_take(pf, G, K("k"), 1, 0, &v)); /* nothing held */
	prefetch_add(pf, G, "hot", K("k"), 5, 1000, 0, 0, 80, 500, 100, 0);
	ck_assert(prefetch_take(pf, G, K("k"), 2, 100, &v));
	ck_assert_int_eq(v.remaining, 80 + 3);
	ck_assert_int_eq(v.until, 1000);
	ck_assert(!prefetch_take(pf, G, K("k"), 4, 100, &v)); /* 3 left */
	ck_assert(prefetch_take(pf, G, K("k"), 3, 999, &v));
	ck_assert_int_eq(prefetch_held(pf, K("k"), 999), 0);
	/* at the deadline, nothing more */
	prefetch_add(pf, G, "hot", K("k"), 2, 1000, 999, 999, 80, 500, 100, 0);
	ck_assert(!prefetch_take(pf, G, K("k"), 1, 1000, &v));
	ck_assert_int_eq(lost, 2);
	prefetch_free(pf);
}
END_TEST

START_TEST(test_put_back_and_merge)
{
	struct prefetch *pf = prefetch_new(8, G, on_lost, NULL);
	struct prefetch_view v;

	lost = 0;
	prefetch_add(pf, G, "hot", K("k"), 5, 2000, 0, 0, 50, 500, 100, 0);
	ck_assert(prefetch_take(pf, G, K("k"), 5, 10, &v));
	/* put back: they join the holding */
	prefetch_put_back(pf, G, "hot", K("k"), 5, v.until, 20, 0);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 20), 5);
	/* a later chunk adds its units, keeping the earlier deadline */
	prefetch_add(pf, G, "hot", K("k"), 4, 9000, 30, 30, 40, 500, 100, 0);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 30), 9);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 2000), 0);
	ck_assert_int_eq(lost, 9);
	/* units put back after their deadline, or to no holding: lost */
	prefetch_put_back(pf, G, "hot", K("k"), 3, 2500, 2600, 0);
	prefetch_put_back(pf, G, "hot", K("other"), 2, 9999, 2600, 0);
	ck_assert_int_eq(lost, 14);
	prefetch_free(pf);
}
END_TEST

START_TEST(test_bounded_and_clear)
{
	struct prefetch *pf = prefetch_new(1, G, on_lost, NULL);
	char key[32];
	int i, held = 0;

	lost = 0;
	/* one key per stripe at most: some of these find no room */
	for (i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		prefetch_add(pf, G, "hot", K(key), 1, 1000, 0, 0, 0, 0, 0, 0);
	}
	for (i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		held += (int)prefetch_held(pf, K(key), 1);
	}
	ck_assert_int_le(held, 16);
	ck_assert_int_eq(held + lost, 200);
	/* A new key finds no room in its full stripe (no chunk is asked
	 * for it); a held key does, for a cost above what it holds; and
	 * at the holdings' deadline the stripe is swept. */
	ck_assert(!prefetch_wants_chunk(pf, G, K("new"), 1, 1));
	for (i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		if (prefetch_held(pf, K(key), 1) > 0)
			break;
	}
	ck_assert(prefetch_wants_chunk(pf, G, K(key), 2, 1));
	ck_assert(prefetch_wants_chunk(pf, G, K("new"), 1, 1000));
	prefetch_clear(pf, G);
	ck_assert_int_eq(lost, 200);
	/* expired entries make room */
	prefetch_add(pf, G, "hot", K("k0"), 1, 5000, 2000, 2000, 0, 0, 0, 0);
	ck_assert_int_eq(prefetch_held(pf, K("k0"), 2000), 1);
	prefetch_free(pf);
	ck_assert_int_eq(lost, 201);
}
END_TEST

/* A counter reset (prefetch_forget) drops what is held for the key, and
 * what a call that left before it brings back or puts back: the store
 * may have recorded it in the counter dropped. */
START_TEST(test_forget_drops_in_flight)
{
	struct prefetch *pf = prefetch_new(8, G, on_lost, NULL);
	struct prefetch_view v;
	uint64_t before, after;

	lost = 0;
	before = prefetch_stamp(pf, K("k"));
	prefetch_add(pf, G, "hot", K("k"), 5, 1000, 0, 0, 80, 500, 100, before);
	ck_assert(prefetch_take(pf, G, K("k"), 2, 10, &v));
	prefetch_forget(pf, K("k"));
	ck_assert_int_eq(lost, 3);
	/* a chunk of a call that left before the reset: lost */
	prefetch_add(pf, G, "hot", K("k"), 5, 1000, 20, 20, 80, 500, 100,
	    before);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 20), 0);
	ck_assert_int_eq(lost, 8);
	/* one that left after it is held; units taken before it are not
	 * put back into it */
	after = prefetch_stamp(pf, K("k"));
	prefetch_add(pf, G, "hot", K("k"), 4, 1000, 30, 30, 80, 500, 100,
	    after);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 30), 4);
	prefetch_put_back(pf, G, "hot", K("k"), 2, v.until, 40, before);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 40), 4);
	ck_assert_int_eq(lost, 10);
	prefetch_free(pf);
	ck_assert_int_eq(lost, 14);
}
END_TEST

/* A forget of every key (the notices' subscription is back: a reset may
 * have gone unheard) drops every key's units, reported lost, and what
 * any call that left before brings back or puts back; the generation
 * stays. */
START_TEST(test_forget_all)
{
	struct prefetch *pf = prefetch_new(64, G, on_lost, NULL);
	struct prefetch_view v;
	uint64_t before[8];
	char key[16];
	int i;

	lost = 0;
	for (i = 0; i < 8; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		before[i] = prefetch_stamp(pf, K(key));
		prefetch_add(pf, G, "hot", K(key), 5, 1000, 0, 0, 80, 500, 100,
		    before[i]);
	}
	ck_assert(prefetch_take(pf, G, K("k0"), 2, 10, &v));
	prefetch_forget_all(pf);
	ck_assert_int_eq(lost, 8 * 5 - 2);
	for (i = 0; i < 8; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		ck_assert_int_eq(prefetch_held(pf, K(key), 20), 0);
		/* a chunk of a call that left before: lost */
		prefetch_add(pf, G, "hot", K(key), 5, 1000, 20, 20, 80, 500,
		    100, before[i]);
		ck_assert_int_eq(prefetch_held(pf, K(key), 20), 0);
	}
	ck_assert_int_eq(lost, 8 * 5 - 2 + 8 * 5);
	/* the units taken before: not put back */
	prefetch_put_back(pf, G, "hot", K("k0"), 2, v.until, 30, before[0]);
	ck_assert_int_eq(lost, 8 * 5 + 8 * 5);
	/* a chunk of a call that left after it is held, same generation */
	prefetch_add(pf, G, "hot", K("k0"), 4, 1000, 30, 30, 80, 500, 100,
	    prefetch_stamp(pf, K("k0")));
	ck_assert_int_eq(prefetch_held(pf, K("k0"), 30), 4);
	prefetch_forget_all(NULL);
	prefetch_free(pf);
}
END_TEST

/* A chunk is asked for only while fewer units than the cost are held:
 * the units held answer the requests they answer whole, and a chunk
 * beside them would be left to expire.  Nor under another generation. */
START_TEST(test_chunk_only_when_short)
{
	struct prefetch *pf = prefetch_new(8, G, on_lost, NULL);

	lost = 0;
	ck_assert(prefetch_wants_chunk(pf, G, K("k"), 1, 0));
	prefetch_add(pf, G, "hot", K("k"), 3, 1000, 0, 0, 80, 500, 100, 0);
	ck_assert(!prefetch_wants_chunk(pf, G, K("k"), 1, 10));
	ck_assert(!prefetch_wants_chunk(pf, G, K("k"), 3, 10));
	ck_assert(prefetch_wants_chunk(pf, G, K("k"), 4, 10));
	ck_assert(!prefetch_wants_chunk(pf, G + 1, K("k"), 4, 10));
	/* the holding ended: a chunk again */
	ck_assert(prefetch_wants_chunk(pf, G, K("k"), 1, 1000));
	ck_assert_int_eq(lost, 3);
	prefetch_free(pf);
}
END_TEST

/* Two answers of one key that settle out of order: the one of the call
 * that left later stands (it counted the earlier call's units), and the
 * earlier call's request answers from it, as later requests do.  A plain
 * check's answer (prefetch_refresh) likewise; -1 when nothing is held. */
START_TEST(test_answers_out_of_order)
{
	struct prefetch *pf = prefetch_new(8, G, on_lost, NULL);
	struct prefetch_view v;

	lost = 0;
	ck_assert_int_eq(prefetch_refresh(pf, G, K("k"), 5, 10, 90, 500, 100,
			     0),
	    -1);
	/* the later call (left at 20) settles first: 40 left, 5 held */
	ck_assert_int_eq(prefetch_add(pf, G, "hot", K("k"), 5, 1000, 20, 30, 40,
			     500, 100, 0),
	    45);
	/* the earlier one (left at 10) answered 46 before it: 8 held */
	ck_assert_int_eq(prefetch_add(pf, G, "hot", K("k"), 3, 1000, 10, 31, 46,
			     500, 100, 0),
	    48);
	ck_assert(prefetch_take(pf, G, K("k"), 1, 32, &v));
	ck_assert_int_eq(v.remaining, 47);
	/* a plain check that left at 5: older, the holding's answer stands */
	ck_assert_int_eq(prefetch_refresh(pf, G, K("k"), 5, 33, 49, 500, 100,
			     0),
	    47);
	/* one that left at 40, later than all: its answer is the new base */
	ck_assert_int_eq(prefetch_refresh(pf, G, K("k"), 40, 41, 30, 500, 100,
			     0),
	    37);
	ck_assert(prefetch_take(pf, G, K("k"), 1, 42, &v));
	ck_assert_int_eq(v.remaining, 36);
	ck_assert_int_eq(lost, 0);
	prefetch_free(pf);
}
END_TEST

/* A reload (prefetch_clear with the new config's serial): a chunk of the
 * old rules that comes back after it is lost, and a request prepared
 * under them takes nothing and puts nothing back, even into a holding of
 * the new rules. */
START_TEST(test_generation)
{
	struct prefetch *pf = prefetch_new(8, G, on_lost, NULL);
	struct prefetch_view v;

	lost = 0;
	prefetch_add(pf, G, "hot", K("k"), 5, 1000, 0, 0, 80, 500, 100, 0);
	ck_assert(prefetch_take(pf, G, K("k"), 1, 10, &v));
	prefetch_clear(pf, G + 1);
	ck_assert_int_eq(lost, 4);
	/* the old rules' chunk, back after the reload */
	prefetch_add(pf, G, "hot", K("k"), 5, 1000, 20, 20, 80, 500, 100, 0);
	ck_assert_int_eq(lost, 9);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 20), 0);
	/* the new rules' chunk is held, for the new rules only */
	prefetch_add(pf, G + 1, "hot", K("k"), 5, 1000, 20, 20, 80, 500, 100,
	    0);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 20), 5);
	ck_assert(!prefetch_take(pf, G, K("k"), 1, 30, &v));
	prefetch_put_back(pf, G, "hot", K("k"), 1, v.until, 30, 0);
	ck_assert_int_eq(lost, 10);
	ck_assert_int_eq(prefetch_held(pf, K("k"), 30), 5);
	ck_assert(prefetch_take(pf, G + 1, K("k"), 5, 30, &v));
	prefetch_free(pf);
	ck_assert_int_eq(lost, 10);
}
END_TEST

/*
 * A reload publishes the new config before prefetch_clear() has emptied
 * every stripe: a request under the new rules that reaches a stripe not
 * emptied yet takes nothing of the old rules' units.  Keys "a" and "b"
 * are in two stripes; the clear is held in the lost callback of the first
 * it empties while the other is asked for under the new generation.
 */
static sem_t clear_at, clear_go;
static atomic_bool clear_held;
static char clear_first[8];
static atomic_llong clear_lost;

static void
on_lost_clear(const char *rule, int64_t units, void *arg)
{
	bool no = false;

	(void)arg;
	atomic_fetch_add(&clear_lost, units);
	if (!atomic_compare_exchange_strong(&clear_held, &no, true))
		return;
	snprintf(clear_first, sizeof(clear_first), "%s", rule);
	sem_post(&clear_at);
	sem_wait(&clear_go);
}

static void *
clear_to_next(void *arg)
{
	prefetch_clear(arg, G + 1);
	return NULL;
}

START_TEST(test_generation_per_entry)
{
	struct prefetch *pf, *one;
	struct prefetch_view v;
	const char *other;
	char b[16];
	pthread_t th;
	bool took;
	int i;

	/* b: a key of another stripe than a's (one key per stripe) */
	one = prefetch_new(1, G, NULL, NULL);
	prefetch_add(one, G, "a", K("a"), 1, 1000, 0, 0, 0, 0, 0, 0);
	for (i = 0; i < 1000; i++) {
		snprintf(b, sizeof(b), "b%d", i);
		if (prefetch_wants_chunk(one, G, K(b), 1, 0))
			break;
	}
	ck_assert_int_lt(i, 1000);
	prefetch_free(one);

	ck_assert_int_eq(sem_init(&clear_at, 0, 0), 0);
	ck_assert_int_eq(sem_init(&clear_go, 0, 0), 0);
	atomic_store(&clear_held, false);
	atomic_store(&clear_lost, 0);
	pf = prefetch_new(64, G, on_lost_clear, NULL);
	prefetch_add(pf, G, "a", K("a"), 5, 1000, 0, 0, 80, 500, 100, 0);
	prefetch_add(pf, G, b, K(b), 5, 1000, 0, 0, 80, 500, 100, 0);
	ck_assert_int_eq(pthread_create(&th, NULL, clear_to_next, pf), 0);
	sem_wait(&clear_at); /* one stripe emptied, the other not yet */
	other = strcmp(clear_first, "a") == 0 ? b : "a";
	took = prefetch_take(pf, G + 1, K(other), 1, 10, &v);
	sem_post(&clear_go);
	pthread_join(th, NULL);
	ck_assert_msg(!took, "took a unit of %s held under the old rules",
	    other);
	ck_assert_int_eq(atomic_load(&clear_lost), 10);
	prefetch_free(pf);
	sem_destroy(&clear_at);
	sem_destroy(&clear_go);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("prefetch_hold");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_take_until_deadline);
	tcase_add_test(tc, test_generation);
	tcase_add_test(tc, test_put_back_and_merge);
	tcase_add_test(tc, test_bounded_and_clear);
	tcase_add_test(tc, test_chunk_only_when_short);
	tcase_add_test(tc, test_answers_out_of_order);
	tcase_add_test(tc, test_forget_drops_in_flight);
	tcase_add_test(tc, test_forget_all);
	tcase_add_test(tc, test_generation_per_entry);
	suite_add_tcase(s, tc);
	return s;
}
