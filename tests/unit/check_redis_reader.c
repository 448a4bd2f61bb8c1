/*
 * check_redis_reader.c - the Redis store's reply reader (redis_reader_new
 * in src/store/redis_reader.c): the script's replies read as hiredis reads
 * them, and an array header past REDIS_REPLY_ELEMENTS_MAX refused at once
 * (found by fuzzing: "*1333333333" made hiredis allocate 10 GB); the
 * integers and element tables redis_reply_free() keeps come back whole in
 * the next replies.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "store/redis_reader.h"

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

/* Replies read and freed in turn with redis_reply_free(), so that the
 * later ones are made of the integers the earlier ones gave back: each
 * reads as it would fresh, nothing left over from an object's last use. */
START_TEST(test_kept_integers)
{
	static const char ints[] = "*5\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n";
	static const char mixed[] =
	    "*4\r\n:-9\r\n*2\r\n:10\r\n$3\r\nabc\r\n$-1\r\n:11\r\n";
	redisReply *rep, *in;
	int round;
	size_t i;

	for (round = 0; round < 3; round++) {
		ck_assert_int_eq(read_one(ints, sizeof(ints) - 1, &rep),
		    REDIS_OK);
		ck_assert_uint_eq(rep->elements, 5);
		for (i = 0; i < 5; i++) {
			ck_assert_int_eq(rep->element[i]->type,
			    REDIS_REPLY_INTEGER);
			ck_assert_int_eq(rep->element[i]->integer,
			    (long long)i + 1);
			ck_assert_ptr_null(rep->element[i]->element);
			ck_assert_ptr_null(rep->element[i]->str);
			ck_assert_uint_eq(rep->element[i]->elements, 0);
		}
		redis_reply_free(rep);

		ck_assert_int_eq(read_one(mixed, sizeof(mixed) - 1, &rep),
		    REDIS_OK);
		ck_assert_uint_eq(rep->elements, 4);
		ck_assert_int_eq(rep->element[0]->integer, -9);
		in = rep->element[1];
		ck_assert_int_eq(in->type, REDIS_REPLY_ARRAY);
		ck_assert_uint_eq(in->elements, 2);
		ck_assert_int_eq(in->element[0]->integer, 10);
		ck_assert_int_eq(in->element[1]->type, REDIS_REPLY_STRING);
		ck_assert_str_eq(in->element[1]->str, "abc");
		ck_assert_int_eq(rep->element[2]->type, REDIS_REPLY_NIL);
		ck_assert_int_eq(rep->element[3]->integer, 11);
		ck_assert_ptr_null(rep->element[3]->element);
		redis_reply_free(rep);
	}
	/* A lone integer, and one whose reader is freed before its reply:
	 * the reply stays the caller's. */
	ck_assert_int_eq(read_one(":42\r\n", strlen(":42\r\n"), &rep),
	    REDIS_OK);
	ck_assert_int_eq(rep->type, REDIS_REPLY_INTEGER);
	ck_assert_int_eq(rep->integer, 42);
	redis_reply_free(rep);
	/* An array cut short: the reader frees what it made of it. */
	ck_assert_int_eq(read_one("*3\r\n:1\r\n:2\r\n",
			     strlen("*3\r\n:1\r\n:2\r\n"), &rep),
	    REDIS_OK);
	ck_assert_ptr_null(rep);
	ck_assert_int_eq(read_one(":7\r\n", strlen(":7\r\n"), &rep), REDIS_OK);
	ck_assert_int_eq(rep->integer, 7);
	freeReplyObject(rep); /* hiredis's own free takes it too */
}
END_TEST

/* Arrays of sizes in one table class and across them (16 pointers, 32,
 * ... kept one per class), twice over, each freed before the next: every
 * element reads back whole, whatever table it was given. */
START_TEST(test_kept_tables)
{
	static const int sizes[] = { 20, 3, 17, 32, 16, 1, 33, 200, 5000, 64,
		18 };
	char *text;
	size_t len, cap = 64 * 1024, i, s;
	redisReply *rep;
	int round, n;

	text = malloc(cap);
	ck_assert_ptr_nonnull(text);
	for (round = 0; round < 2; round++)
		for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			n = sizes[s];
			len = (size_t)snprintf(text, cap, "*%d\r\n", n);
			for (i = 0; i < (size_t)n; i++)
				len += (size_t)snprintf(text + len, cap - len,
				    ":%zu\r\n", i * 7 + (size_t)round);
			ck_assert_int_eq(read_one(text, len, &rep), REDIS_OK);
			ck_assert_int_eq(rep->type, REDIS_REPLY_ARRAY);
			ck_assert_uint_eq(rep->elements, (size_t)n);
			for (i = 0; i < (size_t)n; i++)
				ck_assert_int_eq(rep->element[i]->integer,
				    (long long)(i * 7 + (size_t)round));
			redis_reply_free(rep);
		}
	free(text);
	/* An empty array has no table. */
	ck_assert_int_eq(read_one("*0\r\n", strlen("*0\r\n"), &rep), REDIS_OK);
	ck_assert_int_eq(rep->type, REDIS_REPLY_ARRAY);
	ck_assert_uint_eq(rep->elements, 0);
	ck_assert_ptr_null(rep->element);
	redis_reply_free(rep);
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
	tcase_add_test(tc, test_kept_integers);
	tcase_add_test(tc, test_kept_tables);
	tcase_add_test(tc, test_huge_array_refused);
	suite_add_tcase(s, tc);
	return s;
}
