/*
 * check_redis_url.c - unit tests of redis_url.c: URL parsing, redaction
 * (no secret may reach a message) and the password file.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"

#include "core/redis_url.h"
#include "base/util.h"

static struct redis_url u;
static char err[256];

static void
parse_ok(const char *url)
{
	err[0] = '\0';
	ck_assert_msg(redis_url_parse(url, &u, err, sizeof(err)) == 0, "%s: %s",
	    url, err);
}

static void
parse_bad(const char *url, const char *needle)
{
	err[0] = '\0';
	ck_assert_msg(redis_url_parse(url, &u, err, sizeof(err)) == -1,
	    "%s parsed", url);
	ck_assert_ptr_null(u.host);
	ck_assert_ptr_null(u.password);
	if (needle != NULL)
		ck_assert_msg(strstr(err, needle) != NULL,
		    "%s: '%s' not in "
		    "'%s'",
		    url, needle, err);
}

static void
teardown(void)
{
	redis_url_free(&u);
}

START_TEST(test_host_port_db)
{
	parse_ok("redis://127.0.0.1:6380/2");
	ck_assert(!u.is_unix);
	ck_assert_str_eq(u.host, "127.0.0.1");
	ck_assert_int_eq(u.port, 6380);
	ck_assert_int_eq(u.db, 2);
	ck_assert_ptr_null(u.user);
	ck_assert_ptr_null(u.password);
}
END_TEST

/* rediss:// is redis:// over TLS: the same grammar and defaults. */
START_TEST(test_rediss)
{
	parse_ok("rediss://alice:s3cret@redis.internal:6380/1");
	ck_assert(u.tls);
	ck_assert(!u.is_unix);
	ck_assert_str_eq(u.host, "redis.internal");
	ck_assert_int_eq(u.port, 6380);
	ck_assert_int_eq(u.db, 1);
	ck_assert_str_eq(u.user, "alice");
	ck_assert_str_eq(u.password, "s3cret");
	redis_url_free(&u);
	parse_ok("REDISS://[::1]");
	ck_assert(u.tls);
	ck_assert_str_eq(u.host, "::1");
	ck_assert_int_eq(u.port, REDIS_DEFAULT_PORT);
	redis_url_free(&u);
	parse_ok("redis://h");
	ck_assert(!u.tls);
	redis_url_free(&u);
	parse_ok("unix:///tmp/r.sock");
	ck_assert(!u.tls);
}
END_TEST

START_TEST(test_defaults)
{
	parse_ok("redis://cache.internal");
	ck_assert_str_eq(u.host, "cache.internal");
	ck_assert_int_eq(u.port, 6379);
	ck_assert_int_eq(u.db, 0);
	redis_url_free(&u);
	parse_ok("redis://h/");
	ck_assert_int_eq(u.port, 6379);
	ck_assert_int_eq(u.db, 0);
	redis_url_free(&u);
	parse_ok("REDIS://h:1");
	ck_assert_int_eq(u.port, 1);
}
END_TEST

START_TEST(test_ipv6)
{
	parse_ok("redis://[::1]:7000/3");
	ck_assert_str_eq(u.host, "::1");
	ck_assert_int_eq(u.port, 7000);
	ck_assert_int_eq(u.db, 3);
	redis_url_free(&u);
	parse_ok("redis://[fe80::1]");
	ck_assert_str_eq(u.host, "fe80::1");
	ck_assert_int_eq(u.port, 6379);
}
END_TEST

START_TEST(test_user_pass)
{
	parse_ok("redis://alice:s3cret@10.0.0.1:6379/0");
	ck_assert_str_eq(u.user, "alice");
	ck_assert_str_eq(u.password, "s3cret");
	ck_assert_str_eq(u.host, "10.0.0.1");
}
END_TEST

START_TEST(test_pass_only)
{
	parse_ok("redis://:s3cret@h");
	ck_assert_ptr_null(u.user);
	ck_assert_str_eq(u.password, "s3cret");
}
END_TEST

START_TEST(test_user_only)
{
	/* The password then comes from password_file. */
	parse_ok("redis://alice@h");
	ck_assert_str_eq(u.user, "alice");
	ck_assert_ptr_null(u.password);
}
END_TEST

START_TEST(test_percent_and_at_in_password)
{
	parse_ok("redis://bob:p%40ss%2Fw%3Ard@h:1/1");
	ck_assert_str_eq(u.user, "bob");
	ck_assert_str_eq(u.password, "p@ss/w:rd");
	redis_url_free(&u);
	/* An unencoded '@' in the password: the last '@' ends it. */
	parse_ok("redis://bob:p@ss@h:1");
	ck_assert_str_eq(u.password, "p@ss");
	ck_assert_str_eq(u.host, "h");
}
END_TEST

START_TEST(test_unix)
{
	parse_ok("unix:///run/redis/redis.sock");
	ck_assert(u.is_unix);
	ck_assert_str_eq(u.path, "/run/redis/redis.sock");
	ck_assert_int_eq(u.db, 0);
	redis_url_free(&u);
	parse_ok("unix:///tmp/r.sock?db=4");
	ck_assert_str_eq(u.path, "/tmp/r.sock");
	ck_assert_int_eq(u.db, 4);
}
END_TEST

START_TEST(test_bad)
{
	parse_bad("", "want redis://");
	parse_bad("http://h:1", "want redis://");
	parse_bad("rediss://", "no host");
	parse_bad("rediss://h:0", "bad port");
	parse_bad("redisss://h", "want redis://");
	parse_bad("redis://", "no host");
	parse_bad("redis://:6379", "no host");
	parse_bad("redis://h:0", "bad port");
	parse_bad("redis://h:65536", "bad port");
	parse_bad("redis://h:", "bad port");
	parse_bad("redis://h:12x", "bad port");
	parse_bad("redis://h:1/x", "database");
	parse_bad("redis://h:1/-1", "database");
	parse_bad("redis://h/1?timeout=5", "query");
	parse_bad("redis://::1:6379", "brackets");
	parse_bad("redis://[::1", "IPv6");
	parse_bad("redis://[::1]x", "junk");
	parse_bad("redis://u:@h", "empty password");
	parse_bad("redis://@h", "empty user");
	parse_bad("redis://u:p%4@h", "escape");
	parse_bad("redis://u:p%00x@h", "escape");
	parse_bad("unix://", "absolute");
	parse_bad("unix://relative.sock", "absolute");
	parse_bad("unix:///tmp/r.sock?db=x", "db=N");
	parse_bad("unix:///tmp/r.sock?x=1", "db=N");
}
END_TEST

START_TEST(test_errors_never_show_the_password)
{
	static const char *urls[] = {
		"redis://alice:hunter2@h:99999",
		"redis://:hunter2@h/x",
		"redis://:hunter2@",
		"redis://alice:hunter2@h/1?x",
		"redis://al:hun%zzter2@h",
		"rediss://al:hunter2@h:0",
		"redis:/alice:hunter2@h",
	};
	size_t i;

	for (i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
		parse_bad(urls[i], NULL);
		ck_assert_msg(strstr(err, "hunter2") == NULL &&
			strstr(err, "hun") == NULL,
		    "leak: %s", err);
		ck_assert_msg(strstr(err, "***@") != NULL, "%s", err);
	}
}
END_TEST

/* A URL without '@' can still hold a password where the port or the path
 * goes (a forgotten '@', a password with '/'): its errors show nothing
 * after the first ':' past the scheme (docs/security.md). */
START_TEST(test_errors_without_at_never_show_the_password)
{
	static const struct {
		const char *url, *shown;
	} c[] = {
		{ "redis://u:hunter2", "redis URL redis://u:***: bad port" },
		{ "redis://:hunter2", "redis URL redis://:***: no host" },
		{ "rediss://u:hun/ter2", "redis URL rediss://u:***: bad port" },
		{ "redis://u:hunter2/x", "redis URL redis://u:***: bad port" },
		{ "redis://u:hun?ter2", "redis URL redis://u:***: query" },
		{ "redis://h:1:hunter2", "redis URL redis://h:***: an IPv6" },
		{ "u:hunter2", "redis URL u:***: want redis://" },
		{ "unix://u:hunter2", "redis URL unix://u:***: unix:// needs" },
		{ "redis://[::1]:hunter2", "redis URL redis://[::1]:***: bad" },
	};
	size_t i;

	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		parse_bad(c[i].url, NULL);
		ck_assert_msg(strstr(err, "hun") == NULL &&
			strstr(err, "ter2") == NULL,
		    "leak: %s", err);
		ck_assert_msg(strncmp(err, c[i].shown, strlen(c[i].shown)) == 0,
		    "%s: %s", c[i].url, err);
	}
	/* Without a ':' there is nothing to hide, and the URL helps. */
	parse_bad("redis://h/x", NULL);
	ck_assert_str_eq(err,
	    "redis URL redis://h/x: bad database number after /");
}
END_TEST

START_TEST(test_redact)
{
	char buf[128];

	ck_assert_uint_eq(redis_url_redact("redis://u:p@h:1/2", buf,
			      sizeof(buf)),
	    strlen("redis://***@h:1/2"));
	ck_assert_str_eq(buf, "redis://***@h:1/2");
	redis_url_redact("redis://:p@h", buf, sizeof(buf));
	ck_assert_str_eq(buf, "redis://***@h");
	redis_url_redact("redis://h:1/2", buf, sizeof(buf));
	ck_assert_str_eq(buf, "redis://h:1/2");
	redis_url_redact("redis://u:p@ss/x@h:1", buf, sizeof(buf));
	ck_assert_str_eq(buf, "redis://***@h:1");
	redis_url_redact("rediss://u:p@h:1", buf, sizeof(buf));
	ck_assert_str_eq(buf, "rediss://***@h:1");
	redis_url_redact("unix:///tmp/r.sock", buf, sizeof(buf));
	ck_assert_str_eq(buf, "unix:///tmp/r.sock");
	redis_url_redact("noscheme:secret@h", buf, sizeof(buf));
	ck_assert_str_eq(buf, "***@h");
}
END_TEST

START_TEST(test_redact_truncates)
{
	char buf[12];

	ck_assert_uint_eq(redis_url_redact("redis://u:p@host:6379", buf,
			      sizeof(buf)),
	    strlen("redis://***@host:6379"));
	ck_assert_str_eq(buf, "redis://***");
	ck_assert_uint_eq(redis_url_redact("redis://h", NULL, 0), 9);
	buf[0] = 'x';
	redis_url_redact("redis://h", buf, 1);
	ck_assert_str_eq(buf, "");
}
END_TEST

static char *
write_tmp(const char *content, size_t len)
{
	static char path[512];

	test_write_tmp("check_redis_url", content, len, path, sizeof(path));
	return path;
}

START_TEST(test_password_file)
{
	static const struct {
		const char *content;
		const char *want; /* NULL: error */
	} cases[] = {
		{ "hunter2\n", "hunter2" },
		{ "hunter2", "hunter2" },
		{ "hunter2\r\nsecond line\n", "hunter2" },
		{ "  spaced pass \n", "  spaced pass " },
		{ "\nhunter2\n", NULL },
		{ "", NULL },
	};
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *path = write_tmp(cases[i].content,
		    strlen(cases[i].content));
		char *pw = NULL;
		int rc = redis_read_password_file(path, &pw, err, sizeof(err));

		unlink(path);
		if (cases[i].want != NULL) {
			ck_assert_msg(rc == 0, "case %zu: %s", i, err);
			ck_assert_str_eq(pw, cases[i].want);
		} else {
			ck_assert_int_eq(rc, -1);
			ck_assert_ptr_null(pw);
			ck_assert(strstr(err, "empty") != NULL);
		}
		rl_free(pw);
	}
}
END_TEST

START_TEST(test_password_file_missing_and_long)
{
	char *pw = NULL, *big, *path;

	ck_assert_int_eq(redis_read_password_file("/nonexistent/pw", &pw, err,
			     sizeof(err)),
	    -1);
	ck_assert_ptr_null(pw);
	ck_assert(strstr(err, "/nonexistent/pw") != NULL);

	big = malloc(5000);
	ck_assert_ptr_nonnull(big);
	memset(big, 'a', 5000);
	path = write_tmp(big, 5000);
	free(big);
	ck_assert_int_eq(redis_read_password_file(path, &pw, err, sizeof(err)),
	    -1);
	unlink(path);
	ck_assert(strstr(err, "longer") != NULL);
	ck_assert(strstr(err, "aaaa") == NULL);
}
END_TEST

START_TEST(test_oom)
{
	long i;
	int rc = -1;

	/* Every allocation failure is an error, never a crash or a leak;
	 * eventually the parse succeeds. */
	for (i = 0; i < 10 && rc == -1; i++) {
		rl_alloc_fail_after(i);
		rc = redis_url_parse("redis://u:p@h:1/2", &u, err, sizeof(err));
		rl_alloc_fail_after(-1);
		if (rc == -1) {
			ck_assert_str_eq(err, "out of memory");
			ck_assert_ptr_null(u.host);
		}
	}
	ck_assert_int_eq(rc, 0);
	ck_assert_str_eq(u.password, "p");
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("redis_url");
	TCase *tc = tcase_create("parse");

	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_add_test(tc, test_host_port_db);
	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_rediss);
	tcase_add_test(tc, test_ipv6);
	tcase_add_test(tc, test_user_pass);
	tcase_add_test(tc, test_pass_only);
	tcase_add_test(tc, test_user_only);
	tcase_add_test(tc, test_percent_and_at_in_password);
	tcase_add_test(tc, test_unix);
	tcase_add_test(tc, test_bad);
	tcase_add_test(tc, test_errors_never_show_the_password);
	tcase_add_test(tc, test_errors_without_at_never_show_the_password);
	tcase_add_test(tc, test_oom);
	suite_add_tcase(s, tc);

	tc = tcase_create("redact");
	tcase_add_test(tc, test_redact);
	tcase_add_test(tc, test_redact_truncates);
	suite_add_tcase(s, tc);

	tc = tcase_create("password_file");
	tcase_add_test(tc, test_password_file);
	tcase_add_test(tc, test_password_file_missing_and_long);
	suite_add_tcase(s, tc);
	return s;
}
