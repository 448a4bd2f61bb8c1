/*
 * check_redis_reader.c - the Redis store's reply reader (redis_reader_new
 * in src/store/redis_conn.c): the script's replies read as hiredis reads
 * them, and an array header past REDIS_REPLY_ELEMENTS_MAX refused at once
 * (found by fuzzing: "*1333333333" made hiredis allocate 10 GB).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "store/redis_conn.h"

static int
read_one(const char *bytes, size_t len, redisReply **out)
{
	redisReader *r = redis_reader_new();
	void *reply = NULL;
	int rc;

	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(redisReaderFeed(r, bytes, len), REDIS_OK);
	rc = redisReaderGetReply(r, &reply);
	redisReaderFree(r);
	*out = reply;
	return rc;
}

START_TEST(test_normal_replies)
{
	static const char arr[] = "*3\r\n:1\r\n$2\r\nok\r\n*1\r\n:-7\r\n";
	redisReply *rep;

	ck_assert_int_eq(read_one(arr, sizeof(arr) - 1, &rep), REDIS_OK);
	ck_assert_ptr_nonnull(rep);
	ck_assert_int_eq(rep->type, REDIS_REPLY_ARRAY);
	ck_assert_uint_eq(rep->elements, 3);
	ck_assert_int_eq(rep->element[0]->integer, 1);
	ck_assert_str_eq(rep->element[1]->str, "ok");
	ck_assert_int_eq(rep->element[2]->element[0]->integer, -7);
	freeReplyObject(rep);
}
END_TEST

START_TEST(test_huge_array_refused)
{
	static const char huge[] = "*1333333333\r\n:5\r\n";
	char big[32];
	redisReply *rep;

	ck_assert_int_eq(read_one(huge, sizeof(huge) - 1, &rep), REDIS_ERR);
	ck_assert_ptr_null(rep);
	/* One past the bound is refused too. */
	snprintf(big, sizeof(big), "*%d\r\n", REDIS_REPLY_ELEMENTS_MAX + 1);
	ck_assert_int_eq(read_one(big, strlen(big), &rep), REDIS_ERR);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("redis_reader");
	TCase *tc = tcase_create("reader");

	tcase_add_test(tc, test_normal_replies);
	tcase_add_test(tc, test_huge_array_refused);
	suite_add_tcase(s, tc);
	return s;
}
