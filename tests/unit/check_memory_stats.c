/*
 * check_memory_stats.c - stat calls on the memory store (backend_memory.c
 * and memory_stats.c) with an injected clock: the window slides with the
 * store's time, keys expire once nothing in them is live, a read creates
 * nothing, and a store at max_keys refuses a new key without recording.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/backend.h"
#include "store/memory_stats.h"
#include "store/memory.h"

#define T0 INT64_C(1700000000000000) /* us */
#define MS INT64_C(1000)

static int64_t now_us;

static void
no_done(struct backend_call *call)
{
	(void)call;
}

static const double qs[] = { 0.5, 1 };

/* One stat call on key (window 1 s, resolution 100 ms); its rc. */
static int
stat(struct backend *b, const char *key, bool record, double v,
    struct rl_stat_result *out, struct backend_call *call)
{
	struct rl_stat_op op = {
		.key = key,
		.keylen = strlen(key),
		.window_ms = 1000,
		.resolution_ms = 100,
		.accuracy = 0.01,
		.record = record,
		.value = v,
		.quantiles = qs,
		.nquantiles = 2,
	};

	memset(call, 0, sizeof(*call));
	call->stat = &op;
	call->stat_out = out;
	call->done = no_done;
	backend_submit(b, call);
	return call->rc;
}

START_TEST(test_slides_and_expires)
{
	struct backend *b = backend_memory_new(100, test_clock, &now_us);
	struct backend_call call;
	struct rl_stat_result r;

	now_us = T0;
	ck_assert_int_eq(stat(b, "k", true, 5, &r, &call), 0);
	ck_assert_uint_eq(r.count, 1);
	ck_assert(r.q[0] == 5 && r.q[1] == 5);
	now_us = T0 + 600 * MS;
	ck_assert_int_eq(stat(b, "k", true, -2, &r, &call), 0);
	ck_assert_uint_eq(r.count, 2);
	ck_assert(r.sum == 3 && r.min == -2 && r.max == 5);
	/* 1.1 s after the first: it is gone, the second stays. */
	now_us = T0 + 1100 * MS;
	ck_assert_int_eq(stat(b, "k", false, 0, &r, &call), 0);
	ck_assert_uint_eq(r.count, 1);
	ck_assert(r.sum == -2);
	ck_assert_int_eq(stat(b, "other", false, 0, &r, &call), 0);
	ck_assert_uint_eq(r.count, 0);
	/* Past 600 + 100 + 1000 ms nothing is live: the key is reclaimed. */
	now_us = T0 + 1700 * MS;
	ck_assert_int_eq(stat(b, "k", false, 0, &r, &call), 0);
	ck_assert_uint_eq(r.count, 0);
	backend_free(b);
}
END_TEST

START_TEST(test_full)
{
	struct backend *b = backend_memory_new(2, test_clock, &now_us);
	struct backend_call call;
	struct rl_stat_result r;

	now_us = T0;
	ck_assert_int_eq(stat(b, "a", true, 1, &r, &call), 0);
	ck_assert_int_eq(stat(b, "b", true, 1, &r, &call), 0);
	ck_assert_int_eq(stat(b, "c", true, 1, &r, &call), -1);
	ck_assert_int_eq(call.kind, BACKEND_ERR_FULL);
	/* Existing keys still record. */
	ck_assert_int_eq(stat(b, "a", true, 2, &r, &call), 0);
	ck_assert_uint_eq(r.count, 2);
	/* Once "a" and "b" expired, "c" fits. */
	now_us = T0 + 2 * 1000 * MS;
	ck_assert_int_eq(stat(b, "c", true, 1, &r, &call), 0);
	ck_assert_uint_eq(r.count, 1);
	backend_free(b);
}
END_TEST

/* A full table sweeps everything at most once a second: the refused
 * records in between walk no keys (they did, each under the one mutex). */
START_TEST(test_full_sweep_limited)
{
	struct memory_stats *ms = memory_stats_new(2);
	struct rl_stat_op op = {
		.window_ms = 60000,
		.resolution_ms = 1000,
		.accuracy = 0.01,
		.record = true,
		.value = 1,
	};
	enum backend_error_kind kind;
	struct rl_stat_result r;
	char err[BACKEND_ERR_MAX];
	static const char *const keys[] = { "a", "b", "c", "d", "e" };
	int i;

	for (i = 0; i < 5; i++) {
		op.key = keys[i];
		op.keylen = 1;
		ck_assert_int_eq(memory_stats_run(ms, &op, T0 + i * MS, &r,
				     &kind, err, sizeof(err)),
		    i < 2 ? 0 : -1);
	}
	ck_assert_int_eq(kind, BACKEND_ERR_FULL);
	/* "c" swept at T0 + 2 ms; "d" and "e" within the second did not */
	ck_assert_uint_eq(memory_stats_full_sweeps(ms), 1);
	ck_assert_int_eq(memory_stats_run(ms, &op, T0 + 1002 * MS, &r, &kind,
			     err, sizeof(err)),
	    -1);
	ck_assert_uint_eq(memory_stats_full_sweeps(ms), 2);
	/* once the keys expired, a new key fits (a sweep of two chains or the
	 * full one, a second on, frees them) */
	ck_assert_int_eq(memory_stats_run(ms, &op, T0 + 70000 * MS, &r, &kind,
			     err, sizeof(err)),
	    0);
	memory_stats_free(ms);
}
END_TEST

START_TEST(test_table_alone)
{
	struct memory_stats *ms = memory_stats_new(0);
	struct rl_stat_op op = {
		.window_ms = 1000,
		.resolution_ms = 100,
		.accuracy = 0.01,
		.record = true,
		.value = 1,
		.quantiles = qs,
		.nquantiles = 2,
	};
	enum backend_error_kind kind;
	struct rl_stat_result r;
	char key[32], err[BACKEND_ERR_MAX];
	int i;

	/* Many keys: the table grows and every one keeps its own value. */
	for (i = 0; i < 5000; i++) {
		snprintf(key, sizeof(key), "key%d", i);
		op.key = key;
		op.keylen = strlen(key);
		op.value = i;
		ck_assert_int_eq(memory_stats_run(ms, &op, T0, &r, &kind, err,
				     sizeof(err)),
		    0);
	}
	ck_assert_uint_eq(memory_stats_key_count(ms, T0), 5000);
	op.record = false;
	for (i = 0; i < 5000; i += 499) {
		snprintf(key, sizeof(key), "key%d", i);
		op.key = key;
		op.keylen = strlen(key);
		ck_assert_int_eq(memory_stats_run(ms, &op, T0, &r, &kind, err,
				     sizeof(err)),
		    0);
		ck_assert_uint_eq(r.count, 1);
		ck_assert(r.sum == i);
	}
	/* A read of a key not there creates nothing. */
	op.key = "absent";
	op.keylen = 6;
	ck_assert_int_eq(memory_stats_run(ms, &op, T0, &r, &kind, err,
			     sizeof(err)),
	    0);
	ck_assert_uint_eq(r.count, 0);
	ck_assert_uint_eq(memory_stats_key_count(ms, T0), 5000);
	/* Bad params are refused, nothing recorded. */
	op.record = true;
	op.resolution_ms = 0;
	ck_assert_int_eq(memory_stats_run(ms, &op, T0, &r, &kind, err,
			     sizeof(err)),
	    -1);
	ck_assert_uint_eq(memory_stats_key_count(ms, T0 + 10000 * MS), 0);
	memory_stats_free(ms);
	memory_stats_free(NULL);
}
END_TEST

/* Expired keys are freed while later calls use a key already held, not
 * only when new keys come: every call sweeps a little. */
START_TEST(test_expired_freed_by_old_key)
{
	struct memory_stats *ms = memory_stats_new(0);
	struct rl_stat_op op = {
		.window_ms = 1000,
		.resolution_ms = 100,
		.accuracy = 0.01,
		.record = true,
		.value = 1,
		.quantiles = qs,
		.nquantiles = 2,
	};
	enum backend_error_kind kind;
	struct rl_stat_result r;
	char key[32], err[BACKEND_ERR_MAX];
	int i;

	for (i = 0; i < 3000; i++) {
		snprintf(key, sizeof(key), "key%d", i);
		op.key = key;
		op.keylen = strlen(key);
		ck_assert_int_eq(memory_stats_run(ms, &op, T0, &r, &kind, err,
				     sizeof(err)),
		    0);
	}
	ck_assert_uint_eq(memory_stats_held(ms), 3000);
	/* An hour later, reads and records of key0 alone. */
	op.key = "key0";
	op.keylen = 4;
	for (i = 0; i < 6000; i++) {
		op.record = i % 2 == 0;
		ck_assert_int_eq(memory_stats_run(ms, &op,
				     T0 + 3600000 * MS + i * MS, &r, &kind, err,
				     sizeof(err)),
		    0);
	}
	ck_assert_uint_eq(memory_stats_held(ms), 1);
	memory_stats_free(ms);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("memory_stats");
	TCase *tc = tcase_create("memory_stats");

	tcase_add_test(tc, test_slides_and_expires);
	tcase_add_test(tc, test_full);
	tcase_add_test(tc, test_full_sweep_limited);
	tcase_add_test(tc, test_table_alone);
	tcase_add_test(tc, test_expired_freed_by_old_key);
	suite_add_tcase(s, tc);
	return s;
}
