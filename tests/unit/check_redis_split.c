/*
 * check_redis_split.c - a request across Redis Cluster slots
 * (src/store/redis_split.c), without a server: parts grouped by slot in
 * the order of their first check; all allowed stands as it is; a denial
 * takes back exactly the checks that recorded (allowed, cost > 0, in a
 * part that allowed) and reports their units as free; a failed part fails
 * the request.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "store/redis_split.h"

static int parts_done, tbs_done;

static void
part_done(struct backend_call *c)
{
	(void)c;
	parts_done++;
}

static void
tb_done(struct backend_call *c)
{
	(void)c;
	tbs_done++;
}

static struct rl_check checks[4] = {
	{ RL_ALG_SLIDING_LOG, 10, 1000, 1, false, "a", 1, NULL, 0, 0 },
	{ RL_ALG_SLIDING_LOG, 3, 1000, 1, false, "b", 1, NULL, 0, 0 },
	{ RL_ALG_FIXED_WINDOW, 5, 1000, 2, false, "c", 1, NULL, 0, 0 },
	{ RL_ALG_SLIDING_LOG, 7, 1000, 0, false, "d", 1, NULL, 0, 0 },
};
/* a and c in slot 7, b in slot 9, d in slot 7 too. */
static const unsigned slots[4] = { 7, 9, 7, 7 };

static struct redis_split *
make(struct backend_call *parent, struct rl_result *out)
{
	struct redis_split *s;

	memset(parent, 0, sizeof(*parent));
	parent->checks = checks;
	parent->n = 4;
	parent->out = out;
	parent->deadline_us = 12345;
	s = redis_split_new(parent, slots, part_done, &parts_done);
	ck_assert_ptr_nonnull(s);
	return s;
}

/* The script's answer for a part: every check allowed or not. */
static void
answer(struct backend_call *part, bool allowed, int64_t rem)
{
	size_t i;

	part->rc = 0;
	part->all_allowed = allowed;
	for (i = 0; i < part->n; i++) {
		part->out[i].allowed = allowed;
		part->out[i].remaining = rem;
		part->out[i].mark = 1000.0 + (double)i;
	}
}

START_TEST(test_grouping)
{
	struct backend_call parent, *p0, *p1;
	struct rl_result out[4];
	struct redis_split *s = make(&parent, out);

	ck_assert_uint_eq(redis_split_nparts(s), 2);
	p0 = redis_split_part(s, 0);
	p1 = redis_split_part(s, 1);
	ck_assert_uint_eq(p0->n, 3);
	ck_assert_str_eq(p0->checks[0].key, "a");
	ck_assert_str_eq(p0->checks[1].key, "c");
	ck_assert_str_eq(p0->checks[2].key, "d");
	ck_assert_uint_eq(p1->n, 1);
	ck_assert_str_eq(p1->checks[0].key, "b");
	ck_assert_int_eq(p0->deadline_us, 12345);
	ck_assert_ptr_eq(redis_split_of(p0), s);
	ck_assert_ptr_eq(redis_split_user(s), &parts_done);
	ck_assert(!redis_split_one_done(s));
	ck_assert(redis_split_one_done(s));
	redis_split_free(s);
}
END_TEST

START_TEST(test_all_allowed)
{
	struct backend_call parent;
	struct rl_result out[4];
	struct redis_split *s = make(&parent, out);

	answer(redis_split_part(s, 0), true, 4);
	answer(redis_split_part(s, 1), true, 2);
	ck_assert(redis_split_allowed(s));
	ck_assert_int_eq(redis_split_takebacks(s, tb_done, 99), 0);
	redis_split_answer(s);
	ck_assert(redis_split_answered(s));
	ck_assert_int_eq(parent.rc, 0);
	ck_assert(parent.all_allowed);
	/* Results back in the request's order. */
	ck_assert_int_eq(out[0].remaining, 4);
	ck_assert_int_eq(out[1].remaining, 2);
	ck_assert_int_eq(out[2].remaining, 4);
	ck_assert(out[0].mark == 0);
	redis_split_free(s);
}
END_TEST

START_TEST(test_denied_takes_back)
{
	struct backend_call parent, *tb;
	struct rl_result out[4];
	struct redis_split *s = make(&parent, out);

	answer(redis_split_part(s, 0), true, 4);
	answer(redis_split_part(s, 1), false, 0);
	ck_assert(!redis_split_allowed(s));
	ck_assert_int_eq(redis_split_takebacks(s, tb_done, 99), 1);
	tb = redis_split_takeback(s, 0);
	/* a (cost 1) and c (cost 2); not d (cost 0 recorded nothing). */
	ck_assert_uint_eq(tb->n, 2);
	ck_assert_str_eq(tb->checks[0].key, "a");
	ck_assert_str_eq(tb->checks[1].key, "c");
	ck_assert(tb->out[0].mark == 1000.0);
	ck_assert(tb->out[1].mark == 1001.0);
	ck_assert_int_eq(tb->deadline_us, 99);
	ck_assert_ptr_eq(tb->done, tb_done);
	ck_assert(redis_split_one_done(s)); /* the one take-back */
	redis_split_answer(s);
	ck_assert_int_eq(parent.rc, 0);
	ck_assert(!parent.all_allowed);
	/* a and c got their units back: 4 + cost, within the limit. */
	ck_assert_int_eq(out[0].remaining, 5);
	ck_assert_int_eq(out[2].remaining, 5);
	ck_assert_int_eq(out[3].remaining, 4);
	ck_assert(!out[1].allowed);
	redis_split_free(s);
}
END_TEST

START_TEST(test_failed_part)
{
	struct backend_call parent;
	struct rl_result out[4];
	struct redis_split *s = make(&parent, out);
	struct backend_call *p1 = redis_split_part(s, 1);

	answer(redis_split_part(s, 0), true, 4);
	p1->rc = -1;
	p1->kind = BACKEND_ERR_TIMEOUT;
	strcpy(p1->err, "redis: no answer");
	ck_assert_int_eq(redis_split_takebacks(s, tb_done, 99), 1);
	redis_split_answer(s);
	ck_assert_int_eq(parent.rc, -1);
	ck_assert_int_eq(parent.kind, BACKEND_ERR_TIMEOUT);
	ck_assert_str_eq(parent.err, "redis: no answer");
	ck_assert(!parent.all_allowed);
	redis_split_free(s);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("redis_split");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_grouping);
	tcase_add_test(tc, test_all_allowed);
	tcase_add_test(tc, test_denied_takes_back);
	tcase_add_test(tc, test_failed_part);
	suite_add_tcase(s, tc);
	return s;
}
