/*
 * check_lease_queue.c - the queues of requests waiting for a lease
 * (src/front/lease_wait.c), with its real thread and clock: who is told
 * to try, when, and in what order.
 *
 * Each test parks waiters whose callback records (waiter, event, time)
 * and waits for the events it expects; "nothing more" is checked by
 * waiting a while for an event that must not come.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"

#include "front/lease_wait.h"
#include "base/util.h"

#define FAR	 (util_monotonic_us() + 60 * 1000000LL)
#define NOW	 util_monotonic_us()
#define QUIET_US 150000 /* no event in this long: none comes */

struct rec_waiter {
	struct lease_waiter w; /* first */
	int id;
};

struct rec {
	int id;
	enum lease_wait_event ev;
	int64_t at;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static struct rec recs[64];
static size_t nrecs, seen;

static void
on_event(struct lease_waiter *w, enum lease_wait_event ev)
{
	struct rec_waiter *rw = (struct rec_waiter *)w;

	pthread_mutex_lock(&mu);
	if (nrecs < 64)
		recs[nrecs++] = (struct rec){ rw->id, ev, util_monotonic_us() };
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* The next event not seen yet, within wait_us; false when none came. */
static bool
next_event(int64_t wait_us, struct rec *out)
{
	int64_t until = util_monotonic_us() + wait_us;
	struct timespec ts;
	bool got;

	pthread_mutex_lock(&mu);
	while (seen == nrecs && util_monotonic_us() < until) {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 10 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&cv, &mu, &ts);
	}
	got = seen < nrecs;
	if (got)
		*out = recs[seen++];
	pthread_mutex_unlock(&mu);
	return got;
}

static void
expect(int id, enum lease_wait_event ev)
{
	struct rec r;

	ck_assert_msg(next_event(2000000, &r), "no event for waiter %d", id);
	ck_assert_msg(r.id == id && r.ev == ev,
	    "expected waiter %d event %d, "
	    "got waiter %d event %d",
	    id, (int)ev, r.id, (int)r.ev);
}

static void
expect_none(void)
{
	struct rec r;

	ck_assert_msg(!next_event(QUIET_US, &r),
	    "unexpected event %d for "
	    "waiter %d",
	    (int)r.ev, r.id);
}

static struct lease_wait *lw;
static struct rec_waiter ws[8];

/* Waiter i denied on key now: its key's oldest lease expires at retry. */
static int
park(int i, uint64_t key, int64_t retry, int64_t deadline)
{
	return lease_wait_park(lw, &ws[i].w, key, retry, deadline, NOW);
}

static void
setup(void)
{
	char err[128];
	int i;

	nrecs = seen = 0;
	memset(ws, 0, sizeof(ws));
	for (i = 0; i < 8; i++) {
		ws[i].w.fn = on_event;
		ws[i].id = i;
	}
	lw = lease_wait_new(err, sizeof(err));
	ck_assert_msg(lw != NULL, "%s", err);
}

static void
teardown(void)
{
	lease_wait_free(lw);
	lw = NULL;
}

START_TEST(test_release_wakes_first_only_in_order)
{
	int i;

	for (i = 0; i < 3; i++)
		ck_assert_int_eq(park(i, 7, FAR, FAR), 0);
	ck_assert_uint_eq(lease_wait_count(lw), 3);
	expect_none();
	lease_wait_released(lw, 7);
	expect(0, LEASE_WAIT_TRY);
	expect_none();
	/* Still denied: it keeps its place, and waits for the next one. */
	ck_assert_int_eq(park(0, 7, FAR, FAR), 0);
	expect_none();
	lease_wait_released(lw, 7);
	expect(0, LEASE_WAIT_TRY);
	/* Got it: the next tries at once (a lease may still be free). */
	lease_wait_leave(lw, &ws[0].w);
	expect(1, LEASE_WAIT_TRY);
	lease_wait_leave(lw, &ws[1].w);
	expect(2, LEASE_WAIT_TRY);
	lease_wait_leave(lw, &ws[2].w);
	expect_none();
	ck_assert_uint_eq(lease_wait_count(lw), 0);
}
END_TEST

START_TEST(test_release_while_trying_tries_again)
{
	ck_assert_int_eq(park(0, 7, FAR, FAR), 0);
	ck_assert_int_eq(park(1, 7, FAR, FAR), 0);
	lease_wait_released(lw, 7);
	expect(0, LEASE_WAIT_TRY);
	lease_wait_released(lw, 7); /* while 0 tries */
	expect_none();
	ck_assert_int_eq(park(0, 7, FAR, FAR), 0);
	expect(0, LEASE_WAIT_TRY);
	expect_none();
}
END_TEST

START_TEST(test_keys_are_apart)
{
	uint64_t keys[2] = { 8, 9 }, k = 0;

	ck_assert_int_eq(park(0, 7, FAR, FAR), 0);
	ck_assert_int_eq(park(1, 8, FAR, FAR), 0);
	ck_assert(lease_wait_any(lw, keys, 2, &k));
	ck_assert_uint_eq(k, 8);
	ck_assert(!lease_wait_any(lw, keys + 1, 1, &k));
	lease_wait_released(lw, 9);
	expect_none();
	lease_wait_released(lw, 8);
	expect(1, LEASE_WAIT_TRY);
	expect_none();
	/* Denied on another key now: it moves to that key's queue. */
	ck_assert_int_eq(park(1, 7, FAR, FAR), 0);
	ck_assert(!lease_wait_any(lw, keys, 1, &k));
	lease_wait_released(lw, 7);
	expect(0, LEASE_WAIT_TRY);
	lease_wait_leave(lw, &ws[0].w);
	expect(1, LEASE_WAIT_TRY);
}
END_TEST

START_TEST(test_expiry_time)
{
	int64_t t0 = util_monotonic_us();

	ck_assert_int_eq(park(0, 7, t0 + 200000, FAR), 0);
	ck_assert_int_eq(park(1, 7, t0 + 50000, FAR), 0);
	/* Only the first's time counts: the second is behind it. */
	expect(0, LEASE_WAIT_TRY);
	ck_assert_int_ge(recs[0].at - t0, 200000);
	expect_none();
}
END_TEST

START_TEST(test_deadline)
{
	int64_t t0 = util_monotonic_us();

	ck_assert_int_eq(park(0, 7, FAR, t0 + 100000), 0);
	ck_assert_int_eq(park(1, 7, FAR, FAR), 0);
	ck_assert_int_eq(park(2, 7, FAR, t0 + 150000), 0);
	expect(0, LEASE_WAIT_TIMEOUT);
	ck_assert_int_ge(recs[0].at - t0, 100000);
	/* The new first tries at once; the third gives up in its turn. */
	expect(1, LEASE_WAIT_TRY);
	expect(2, LEASE_WAIT_TIMEOUT);
	ck_assert_int_ge(recs[2].at - t0, 150000);
	ck_assert_uint_eq(lease_wait_count(lw), 1);
	lease_wait_leave(lw, &ws[1].w);
	ck_assert_uint_eq(lease_wait_count(lw), 0);
}
END_TEST

/* A waiter that comes to a key with no queue tries at once when its
 * denial may be stale: a release heard since it was asked, or no known
 * expiry (a newcomer queued behind waiters that have gone meanwhile). */
START_TEST(test_new_first_waiter)
{
	int64_t asked = NOW;

	lease_wait_released(lw, 7); /* before the denial was asked */
	usleep(2000);
	asked = NOW;
	ck_assert_int_eq(lease_wait_park(lw, &ws[0].w, 7, FAR, FAR, asked), 0);
	expect_none();
	lease_wait_leave(lw, &ws[0].w);
	lease_wait_released(lw, 8); /* after it was asked */
	ck_assert_int_eq(lease_wait_park(lw, &ws[1].w, 8, FAR, FAR, asked), 0);
	expect(1, LEASE_WAIT_TRY);
	ck_assert_int_eq(lease_wait_park(lw, &ws[2].w, 9, INT64_MAX, FAR, NOW),
	    0);
	expect(2, LEASE_WAIT_TRY);
	/* Behind a first waiter: no. */
	ck_assert_int_eq(lease_wait_park(lw, &ws[3].w, 9, INT64_MAX, FAR, NOW),
	    0);
	expect_none();
}
END_TEST

START_TEST(test_cut)
{
	struct rec r1, r2;

	ck_assert_int_eq(park(0, 7, FAR, FAR), 0);
	ck_assert_int_eq(park(1, 7, FAR, FAR), 0);
	ck_assert_int_eq(park(2, 8, FAR, FAR), 0);
	lease_wait_released(lw, 7);
	expect(0, LEASE_WAIT_TRY);
	lease_wait_cut(lw);
	ck_assert(next_event(2000000, &r1) && next_event(2000000, &r2));
	ck_assert(r1.ev == LEASE_WAIT_CUT && r2.ev == LEASE_WAIT_CUT);
	ck_assert_int_eq(r1.id + r2.id, 3); /* 1 and 2, either order */
	ck_assert_int_ne(r1.id, r2.id);
	expect_none();
	/* The one trying is not told: its park fails, and so does a new. */
	ck_assert_int_eq(park(0, 7, FAR, FAR), -1);
	ck_assert_int_eq(park(3, 7, FAR, FAR), -1);
	ck_assert_uint_eq(lease_wait_count(lw), 0);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("lease_queue");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_release_wakes_first_only_in_order);
	tcase_add_test(tc, test_release_while_trying_tries_again);
	tcase_add_test(tc, test_keys_are_apart);
	tcase_add_test(tc, test_expiry_time);
	tcase_add_test(tc, test_deadline);
	tcase_add_test(tc, test_new_first_waiter);
	tcase_add_test(tc, test_cut);
	suite_add_tcase(s, tc);
	return s;
}
