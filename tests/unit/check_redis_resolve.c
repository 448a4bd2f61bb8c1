/*
 * check_redis_resolve.c - unit tests of redis_resolve.c: a lookup done on
 * its own thread signals its descriptor and hands its addresses over; a
 * lookup given up while it runs, or after, is freed once (the sanitizer
 * builds see a double free or a leak); one left unwatched while it runs
 * is readable at once when watched again.  "localhost" comes from
 * /etc/hosts, so no name server is asked.
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "store/redis_resolve.h"

static char err[256];

/* Wait (at most 10 s) until r's descriptor is readable and the lookup
 * says it is done. */
static void
wait_done(struct redis_resolve *r)
{
	struct pollfd pfd = { .events = POLLIN };

	pfd.fd = redis_resolve_fd(r, err, sizeof(err));
	ck_assert_msg(pfd.fd >= 0, "%s", err);
	ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
	ck_assert(redis_resolve_is_done(r));
	/* It stays readable: it is never read. */
	ck_assert_int_eq(poll(&pfd, 1, 0), 1);
}

START_TEST(test_localhost)
{
	struct redis_resolve *r = redis_resolve_start("localhost", 6380, err,
	    sizeof(err));
	const struct addrinfo *ai;
	bool v4 = false;

	ck_assert_msg(r != NULL, "%s", err);
	ck_assert(redis_resolve_is_for(r, "localhost", 6380));
	ck_assert(!redis_resolve_is_for(r, "localhost", 6379));
	ck_assert(!redis_resolve_is_for(r, "localhost.", 6380));
	wait_done(r);
	ai = redis_resolve_result(r, err, sizeof(err));
	ck_assert_msg(ai != NULL, "%s", err);
	for (; ai != NULL; ai = ai->ai_next) {
		ck_assert_int_eq(ai->ai_socktype, SOCK_STREAM);
		if (ai->ai_family == AF_INET) {
			const struct sockaddr_in *sin = (const void *)
							    ai->ai_addr;

			ck_assert_int_eq(ntohs(sin->sin_port), 6380);
			v4 = v4 ||
			    ntohl(sin->sin_addr.s_addr) == INADDR_LOOPBACK;
		}
	}
	ck_assert_msg(v4, "no 127.0.0.1 for localhost");
	redis_resolve_drop(r);
}
END_TEST

/* Given up at once, while its thread most likely still runs: the thread
 * frees it.  Many, so that some land on either side of the hand-over. */
START_TEST(test_drop_while_running)
{
	struct redis_resolve *r;
	int i;

	for (i = 0; i < 50; i++) {
		r = redis_resolve_start("localhost", 1000 + i, err,
		    sizeof(err));
		ck_assert_msg(r != NULL, "%s", err);
		redis_resolve_drop(r);
	}
	redis_resolve_drop(NULL);
}
END_TEST

/* Not watched while it runs, watched again after: the new descriptor
 * is readable at once. */
START_TEST(test_unwatch_and_watch_again)
{
	struct redis_resolve *r = redis_resolve_start("localhost", 6379, err,
	    sizeof(err));
	struct pollfd pfd = { .events = POLLIN };
	int i;

	ck_assert_msg(r != NULL, "%s", err);
	redis_resolve_unwatch(r);
	redis_resolve_unwatch(r);
	for (i = 0; i < 10000 && !redis_resolve_is_done(r); i++)
		(void)poll(NULL, 0, 1);
	ck_assert(redis_resolve_is_done(r));
	pfd.fd = redis_resolve_fd(r, err, sizeof(err));
	ck_assert_msg(pfd.fd >= 0, "%s", err);
	ck_assert_int_eq(poll(&pfd, 1, 0), 1);
	ck_assert_ptr_nonnull(redis_resolve_result(r, err, sizeof(err)));
	redis_resolve_drop(r);
}
END_TEST

/* A name that cannot be: done, no addresses, and a message naming it. */
START_TEST(test_bad_name)
{
	struct redis_resolve *r = redis_resolve_start("bad name..", 6379, err,
	    sizeof(err));

	ck_assert_msg(r != NULL, "%s", err);
	wait_done(r);
	err[0] = '\0';
	ck_assert_ptr_null(redis_resolve_result(r, err, sizeof(err)));
	ck_assert_msg(strstr(err, "bad name..") != NULL, "%s", err);
	redis_resolve_drop(r);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("redis_resolve");
	TCase *tc = tcase_create("lookups");

	tcase_add_test(tc, test_localhost);
	tcase_add_test(tc, test_drop_while_running);
	tcase_add_test(tc, test_unwatch_and_watch_again);
	tcase_add_test(tc, test_bad_name);
	suite_add_tcase(s, tc);
	return s;
}
