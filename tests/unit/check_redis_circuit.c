/*
 * check_redis_circuit.c - the Redis store's circuit breaker
 * (src/store/redis_circuit.c, docs/operations.md "When Redis fails"),
 * without a server: it opens after REDIS_CB_THRESHOLD failures in a row,
 * lets one trial through after its backoff, closes on the trial's success
 * and doubles the backoff on its failure; a call whose caller gave up
 * first (a gRPC deadline shorter than redis.timeout) counts for nothing,
 * and a trial so ended waits the backoff again rather than letting the
 * next caller try at once.  Under Cluster a failure counts only while no
 * node has answered for redis.timeout, and the topology is watched only
 * for a primary marked down, not for a node that owns no slot.
 */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "base/util.h"
#include "store/redis_priv.h"

static struct redis_backend rb;

static void
setup(void)
{
	memset(&rb, 0, sizeof(rb));
	ck_assert_int_eq(pthread_mutex_init(&rb.mu, NULL), 0);
	rb.shown_url = (char *)"redis://test";
	rb.circuit = REDIS_CIRCUIT_CLOSED;
	rb.backoff_ms = REDIS_CB_BACKOFF_MIN_MS;
}

static void
teardown(void)
{
	pthread_mutex_destroy(&rb.mu);
}

/* Open the circuit as REDIS_CB_THRESHOLD failures in a row do. */
static void
open_it(void)
{
	bool trial;
	int i;

	for (i = 0; i < REDIS_CB_THRESHOLD; i++) {
		ck_assert_int_eq(redis_circuit_enter(&rb, &trial), 0);
		ck_assert(!trial);
		redis_circuit_leave(&rb, false, REDIS_OUTCOME_FAIL);
	}
	ck_assert_int_eq(rb.circuit, REDIS_CIRCUIT_OPEN);
}

/* Let the backoff pass, and take the trial. */
static void
take_trial(void)
{
	bool trial;

	rb.open_until_us = util_monotonic_us() - 1;
	ck_assert_int_eq(redis_circuit_enter(&rb, &trial), 0);
	ck_assert(trial);
	ck_assert_int_eq(rb.circuit, REDIS_CIRCUIT_HALF_OPEN);
	/* Only one trial at a time. */
	ck_assert_int_eq(redis_circuit_enter(&rb, &trial), -1);
}

START_TEST(test_opens_and_closes)
{
	bool trial;

	open_it();
	ck_assert_int_eq(redis_circuit_enter(&rb, &trial), -1);
	take_trial();
	redis_circuit_leave(&rb, true, REDIS_OUTCOME_FAIL);
	ck_assert_int_eq(rb.circuit, REDIS_CIRCUIT_OPEN);
	ck_assert_int_eq(rb.backoff_ms, 2 * REDIS_CB_BACKOFF_MIN_MS);
	take_trial();
	redis_circuit_leave(&rb, true, REDIS_OUTCOME_OK);
	ck_assert_int_eq(rb.circuit, REDIS_CIRCUIT_CLOSED);
	ck_assert_int_eq(rb.backoff_ms, REDIS_CB_BACKOFF_MIN_MS);
}
END_TEST

/* Callers that give up first never open it, however many. */
START_TEST(test_gave_up_opens_nothing)
{
	bool trial;
	int i;

	for (i = 0; i < 10 * REDIS_CB_THRESHOLD; i++) {
		ck_assert_int_eq(redis_circuit_enter(&rb, &trial), 0);
		redis_circuit_leave(&rb, false, REDIS_OUTCOME_GAVE_UP);
	}
	ck_assert_int_eq(rb.circuit, REDIS_CIRCUIT_CLOSED);
	ck_assert_int_eq(rb.failures, 0);
}
END_TEST

/* A trial whose caller gave up: open again for the same backoff (not
 * doubled), so the next caller does not try at once. */
START_TEST(test_gave_up_trial_waits_the_backoff)
{
	bool trial;

	open_it();
	take_trial();
	redis_circuit_leave(&rb, true, REDIS_OUTCOME_GAVE_UP);
	ck_assert_int_eq(rb.circuit, REDIS_CIRCUIT_OPEN);
	ck_assert_int_eq(rb.backoff_ms, REDIS_CB_BACKOFF_MIN_MS);
	ck_assert(rb.open_until_us > util_monotonic_us());
	ck_assert_int_eq(redis_circuit_enter(&rb, &trial), -1);
}
END_TEST

/* A trial given back unsent (shutting down): the next caller tries. */
START_TEST(test_neutral_trial_given_back)
{
	bool trial;

	open_it();
	take_trial();
	redis_circuit_leave(&rb, true, REDIS_OUTCOME_NEUTRAL);
	ck_assert_int_eq(rb.circuit, REDIS_CIRCUIT_OPEN);
	ck_assert_int_eq(redis_circuit_enter(&rb, &trial), 0);
	ck_assert(trial);
}
END_TEST

/* Cluster: a failure counts only while no primary is known (the seeds
 * refuse); once a slot map names primaries, a failure is one primary's,
 * neutral to the store's circuit, however quiet the others are. */
START_TEST(test_cluster_outcome)
{
	ck_assert_int_eq(redis_circuit_outcome(&rb, -1, BACKEND_ERR_TIMEOUT),
	    REDIS_OUTCOME_FAIL);
	rb.mode = REDIS_CLUSTER;
	ck_assert_int_eq(redis_circuit_outcome(&rb, 0, BACKEND_ERR_NONE),
	    REDIS_OUTCOME_OK);
	ck_assert_int_eq(redis_circuit_outcome(&rb, -1, BACKEND_ERR_DEADLINE),
	    REDIS_OUTCOME_GAVE_UP);
	/* No slot map: the seeds refuse. */
	rb.nprimaries = 0;
	ck_assert_int_eq(redis_circuit_outcome(&rb, -1, BACKEND_ERR_TIMEOUT),
	    REDIS_OUTCOME_FAIL);
	rb.nprimaries = 3;
	ck_assert_int_eq(redis_circuit_outcome(&rb, -1, BACKEND_ERR_TIMEOUT),
	    REDIS_OUTCOME_NEUTRAL);
	ck_assert_int_eq(redis_circuit_outcome(&rb, -1,
			     BACKEND_ERR_CIRCUIT_OPEN),
	    REDIS_OUTCOME_NEUTRAL);
	ck_assert_int_eq(redis_circuit_outcome(&rb, -1, BACKEND_ERR_CONNECT),
	    REDIS_OUTCOME_NEUTRAL);
	rb.nprimaries = 0;
}
END_TEST

/* A primary marked down keeps the topology watched; once the map gives it
 * no slot its breaker is forgotten, and nothing is watched for. */
START_TEST(test_node_down_watch)
{
	struct redis_node node, *nodes[1] = { &node };
	int i;

	memset(&node, 0, sizeof(node));
	node.rb = &rb;
	node.primary = true;
	rb.mode = REDIS_CLUSTER;
	rb.nodes = nodes;
	rb.nnodes = 1;
	for (i = 0; i < REDIS_NODE_THRESHOLD; i++)
		redis_circuit_node_failed(&rb, &node);
	ck_assert(node.down_until_us != 0);
	ck_assert(redis_circuit_any_node_down(&rb));
	node.primary = false;
	ck_assert(!redis_circuit_any_node_down(&rb));
	redis_circuit_node_forget(&node);
	ck_assert(node.down_until_us == 0 && node.failures == 0);
	node.primary = true;
	ck_assert(!redis_circuit_any_node_down(&rb));
	rb.nodes = NULL;
	rb.nnodes = 0;
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("redis_circuit");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_opens_and_closes);
	tcase_add_test(tc, test_gave_up_opens_nothing);
	tcase_add_test(tc, test_gave_up_trial_waits_the_backoff);
	tcase_add_test(tc, test_neutral_trial_given_back);
	tcase_add_test(tc, test_cluster_outcome);
	tcase_add_test(tc, test_node_down_watch);
	suite_add_tcase(s, tc);
	return s;
}
