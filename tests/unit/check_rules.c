/*
 * check_rules.c - unit tests of rules.c and util.c's parsers: attributes,
 * globs, patterns, key templates, rule matching, durations.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/rules.h"
#include "base/util.h"

START_TEST(test_attrs_set_get_replace)
{
	struct attrs a = { 0 };
	char name[16];
	int i;

	ck_assert_int_eq(attrs_set(&a, "ip", "10.0.0.1"), 0);
	ck_assert_str_eq(attrs_get(&a, "ip"), "10.0.0.1");
	ck_assert_int_eq(attrs_set(&a, "ip", "10.0.0.2"), 0);
	ck_assert_str_eq(attrs_get(&a, "ip"), "10.0.0.2");
	ck_assert_uint_eq(a.n, 1);
	ck_assert_ptr_null(attrs_get(&a, "IP"));
	/* Growth past the first allocation keeps every entry. */
	for (i = 0; i < 100; i++) {
		snprintf(name, sizeof(name), "k%d", i);
		ck_assert_int_eq(attrs_set(&a, name, name), 0);
	}
	ck_assert_str_eq(attrs_get(&a, "k0"), "k0");
	ck_assert_str_eq(attrs_get(&a, "k99"), "k99");
	ck_assert_int_eq(attrs_setn(&a, "cut", "abcdef", 3), 0);
	ck_assert_str_eq(attrs_get(&a, "cut"), "abc");
	/* A value taken from the one it replaces (name and value share
	 * one allocation, freed once the new one is made). */
	ck_assert_int_eq(attrs_setn(&a, "cut", attrs_get(&a, "cut") + 1, 2), 0);
	ck_assert_str_eq(attrs_get(&a, "cut"), "bc");
	ck_assert_int_eq(attrs_set(&a, "cut", ""), 0);
	ck_assert_str_eq(attrs_get(&a, "cut"), "");
	ck_assert_int_eq(attrs_set(&a, "", "empty name"), 0);
	ck_assert_str_eq(attrs_get(&a, ""), "empty name");
	attrs_clear(&a);
	ck_assert_uint_eq(a.n, 0);
	ck_assert_ptr_null(attrs_get(&a, "ip"));
}
END_TEST

static const struct {
	const char *pat, *s;
	bool match;
} glob_cases[] = {
	{ "/login*", "/login", true },
	{ "/login*", "/login/x/y", true },
	{ "/login*", "/logi", false },
	{ "/login*", "x/login", false },
	{ "*", "", true },
	{ "?", "", false },
	{ "?", "a", true },
	{ "a?c", "abc", true },
	{ "a?c", "abbc", false },
	{ "*.png", "/img/a.png", true },
	{ "*.png", "/img/a.png.txt", false },
	{ "/a/*/c", "/a/b/b/c", true },
	{ "*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false },
	{ "exact", "Exact", false },
};

/* Past ATTRS_SCAN the map is indexed: many attributes, each found, each
 * replaced in place, absent names absent, insertion order kept. */
START_TEST(test_attrs_many)
{
	struct attrs a = { 0 };
	char name[32], value[32];
	int i;

	for (i = 0; i < 5000; i++) {
		snprintf(name, sizeof(name), "k%d", i);
		snprintf(value, sizeof(value), "v%d", i);
		ck_assert_int_eq(attrs_set(&a, name, value), 0);
	}
	ck_assert_uint_eq(a.n, 5000);
	for (i = 0; i < 5000; i += 7) {
		snprintf(name, sizeof(name), "k%d", i);
		snprintf(value, sizeof(value), "w%d", i);
		ck_assert_int_eq(attrs_set(&a, name, value), 0);
	}
	ck_assert_uint_eq(a.n, 5000);
	for (i = 0; i < 5000; i++) {
		snprintf(name, sizeof(name), "k%d", i);
		snprintf(value, sizeof(value), "%c%d", i % 7 == 0 ? 'w' : 'v',
		    i);
		ck_assert_str_eq(attrs_get(&a, name), value);
		ck_assert_str_eq(a.v[i].name, name);
	}
	ck_assert_ptr_null(attrs_get(&a, "k5000"));
	ck_assert_ptr_null(attrs_get(&a, "k"));
	attrs_clear(&a);
	ck_assert_uint_eq(a.n, 0);
	ck_assert_ptr_null(attrs_get(&a, "k1"));
}
END_TEST

START_TEST(test_glob)
{
	ck_assert_msg(glob_match(glob_cases[_i].pat, glob_cases[_i].s) ==
		glob_cases[_i].match,
	    "glob \"%s\" on \"%s\"", glob_cases[_i].pat, glob_cases[_i].s);
}
END_TEST

START_TEST(test_pattern_kinds)
{
	struct pattern p;
	char err[256];

	ck_assert_int_eq(pattern_compile(&p, "POST", err, sizeof(err)), 0);
	ck_assert_int_eq(p.kind, PATTERN_EXACT);
	ck_assert(pattern_matches(&p, "POST"));
	ck_assert(!pattern_matches(&p, "POSTS"));
	ck_assert(!pattern_matches(&p, "post"));
	pattern_free(&p);

	ck_assert_int_eq(pattern_compile(&p, "/api/*", err, sizeof(err)), 0);
	ck_assert_int_eq(p.kind, PATTERN_GLOB);
	ck_assert(pattern_matches(&p, "/api/v1"));
	ck_assert(!pattern_matches(&p, "/apix"));
	pattern_free(&p);

	ck_assert_int_eq(pattern_compile(&p, "~^/v[0-9]+/login$", err,
			     sizeof(err)),
	    0);
	ck_assert_int_eq(p.kind, PATTERN_REGEX);
	ck_assert(pattern_matches(&p, "/v12/login"));
	ck_assert(!pattern_matches(&p, "/v/login"));
	ck_assert(!pattern_matches(&p, "/v1/login/x"));
	pattern_free(&p);

	/* An unanchored regex is a search. */
	ck_assert_int_eq(pattern_compile(&p, "~adm", err, sizeof(err)), 0);
	ck_assert(pattern_matches(&p, "/x/admin"));
	pattern_free(&p);

	ck_assert_int_eq(pattern_compile(&p, "~(", err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "bad regex"));
}
END_TEST

/* Regexes whose optional copies, once expanded, pass 500 are refused
 * before regcomp(), whose memory grows with their square (found by
 * fuzzing: "V+H\xf2{,15666}" made it take over 2 GB); the usual bounded
 * ones compile and match. */
START_TEST(test_pattern_optional_bound)
{
	static const char *const refused[] = { "~V+H\xf2{,15666}", "~a{0,501}",
		"~a{0,300}b{0,300}", "~((a?){100}){100}", "~(a?){501}",
		"~(ab){0,251}", "~(a{1,300}){2}" };
	static const char *const fine[] = { "~a{0,500}",
		"~^/users/[a-z0-9-]{1,64}$", "~(a?){500}", "~(ab){0,250}",
		"~a{5,}", "~a{1000}", "~^/v[0-9]+/(x|y)?$" };
	struct pattern p;
	char err[256];
	size_t i;

	for (i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		ck_assert_msg(pattern_compile(&p, refused[i], err,
				  sizeof(err)) == -1,
		    "%s compiled", refused[i]);
		ck_assert_ptr_nonnull(strstr(err, "500 optional ones"));
	}
	for (i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
		ck_assert_msg(pattern_compile(&p, fine[i], err, sizeof(err)) ==
			0,
		    "%s: %s", fine[i], err);
		pattern_free(&p);
	}
	ck_assert_int_eq(pattern_compile(&p, "~^/users/[a-z]{1,64}$", err,
			     sizeof(err)),
	    0);
	ck_assert(pattern_matches(&p, "/users/abc"));
	ck_assert(!pattern_matches(&p, "/users/"));
	pattern_free(&p);
}
END_TEST

START_TEST(test_template_render)
{
	struct key_template t;
	struct attrs a = { 0 };
	char err[256], buf[RL_MAX_KEY_BYTES + 1];
	size_t len;

	attrs_set(&a, "ip", "10.1.2.3");
	attrs_set(&a, "header.x-api-key", "k1");
	ck_assert_int_eq(template_compile(&t, "${ip}:${header.x-api-key}$$x",
			     err, sizeof(err)),
	    0);
	ck_assert_int_eq(template_render(&t, &a, buf, sizeof(buf), &len),
	    RENDER_OK);
	ck_assert_str_eq(buf, "10.1.2.3:k1$x");
	ck_assert_uint_eq(len, strlen("10.1.2.3:k1$x"));
	template_free(&t);

	/* A lone '$' is literal; a missing attribute means "no key". */
	ck_assert_int_eq(template_compile(&t, "cost$ ${user}", err,
			     sizeof(err)),
	    0);
	ck_assert_int_eq(template_render(&t, &a, buf, sizeof(buf), &len),
	    RENDER_MISSING);
	attrs_set(&a, "user", "bob");
	ck_assert_int_eq(template_render(&t, &a, buf, sizeof(buf), &len),
	    RENDER_OK);
	ck_assert_str_eq(buf, "cost$ bob");
	template_free(&t);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_template_too_long)
{
	struct key_template t;
	struct attrs a = { 0 };
	char err[256], buf[RL_MAX_KEY_BYTES + 1], big[RL_MAX_KEY_BYTES + 2];
	size_t len;

	memset(big, 'x', sizeof(big) - 1);
	big[RL_MAX_KEY_BYTES] = '\0'; /* exactly 512 bytes: fits */
	attrs_set(&a, "v", big);
	ck_assert_int_eq(template_compile(&t, "${v}", err, sizeof(err)), 0);
	ck_assert_int_eq(template_render(&t, &a, buf, sizeof(buf), &len),
	    RENDER_OK);
	ck_assert_uint_eq(len, RL_MAX_KEY_BYTES);
	big[RL_MAX_KEY_BYTES] = 'x'; /* 513 bytes: too long */
	big[RL_MAX_KEY_BYTES + 1] = '\0';
	attrs_set(&a, "v", big);
	ck_assert_int_eq(template_render(&t, &a, buf, sizeof(buf), &len),
	    RENDER_TOO_LONG);
	template_free(&t);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_template_errors)
{
	struct key_template t;
	char err[256];

	ck_assert_int_eq(template_compile(&t, "${ip", err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "unterminated"));
	ck_assert_int_eq(template_compile(&t, "${}", err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "empty"));
	ck_assert_int_eq(template_compile(&t, "${a b}", err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "bad attribute name"));
}
END_TEST

START_TEST(test_template_oom)
{
	struct key_template t;
	char err[256];
	long n;
	int rc;

	/* Every allocation failure is reported, never a crash or a leak. */
	for (n = 0; n < 20; n++) {
		rl_alloc_fail_after(n);
		rc = template_compile(&t, "a${b}c${d}e$$", err, sizeof(err));
		rl_alloc_fail_after(-1);
		if (rc == 0) {
			template_free(&t);
			break;
		}
		ck_assert_str_eq(err, "out of memory");
	}
	ck_assert_int_eq(rc, 0);
	ck_assert_int_gt(n, 0);
}
END_TEST

START_TEST(test_rule_matches)
{
	struct rule r = { 0 };
	struct rule_match m[2];
	struct attrs a = { 0 };
	char err[256];

	m[0].attr = (char *)"method";
	ck_assert_int_eq(pattern_compile(&m[0].pattern, "POST", err,
			     sizeof(err)),
	    0);
	m[1].attr = (char *)"path";
	ck_assert_int_eq(pattern_compile(&m[1].pattern, "/login*", err,
			     sizeof(err)),
	    0);
	r.match = m;
	r.nmatch = 2;
	ck_assert(!rule_matches(&r, &a)); /* absent => no match */
	attrs_set(&a, "method", "POST");
	ck_assert(!rule_matches(&r, &a));
	attrs_set(&a, "path", "/login/x");
	ck_assert(rule_matches(&r, &a));
	attrs_set(&a, "method", "GET");
	ck_assert(!rule_matches(&r, &a));
	r.nmatch = 0; /* no match: every request */
	ck_assert(rule_matches(&r, &a));
	pattern_free(&m[0].pattern);
	pattern_free(&m[1].pattern);
	attrs_clear(&a);
}
END_TEST

START_TEST(test_names_and_algorithms)
{
	enum rl_algorithm alg;

	ck_assert(rule_name_is_valid("login-per-ip_v1.2"));
	ck_assert(!rule_name_is_valid(""));
	ck_assert(!rule_name_is_valid("a b"));
	ck_assert(!rule_name_is_valid("a:b"));
	ck_assert(!rule_name_is_valid("a{b}"));
	ck_assert_int_eq(rl_algorithm_parse("token_bucket", &alg), 0);
	ck_assert_int_eq(alg, RL_ALG_TOKEN_BUCKET);
	ck_assert_str_eq(rl_algorithm_name(alg), "token_bucket");
	ck_assert_int_eq(rl_algorithm_parse("leaky", &alg), -1);
}
END_TEST

START_TEST(test_durations)
{
	int64_t ms;

	ck_assert_int_eq(util_parse_duration_ms("250ms", &ms), 0);
	ck_assert_int_eq(ms, 250);
	ck_assert_int_eq(util_parse_duration_ms("10s", &ms), 0);
	ck_assert_int_eq(ms, 10000);
	ck_assert_int_eq(util_parse_duration_ms("1m", &ms), 0);
	ck_assert_int_eq(ms, 60000);
	ck_assert_int_eq(util_parse_duration_ms("2h", &ms), 0);
	ck_assert_int_eq(ms, 7200000);
	ck_assert_int_eq(util_parse_duration_ms("1d", &ms), 0);
	ck_assert_int_eq(ms, 86400000);
	ck_assert_int_eq(util_parse_duration_ms("10", &ms), -1);
	ck_assert_int_eq(util_parse_duration_ms("s", &ms), -1);
	ck_assert_int_eq(util_parse_duration_ms("-1s", &ms), -1);
	ck_assert_int_eq(util_parse_duration_ms("1.5s", &ms), -1);
	ck_assert_int_eq(util_parse_duration_ms("10 s", &ms), -1);
	ck_assert_int_eq(util_parse_duration_ms("99999999999999999999d", &ms),
	    -1);
	ck_assert_int_eq(util_parse_duration_ms("999999999999999d", &ms), -1);
}
END_TEST

START_TEST(test_int64_and_ceil)
{
	int64_t v;

	ck_assert_int_eq(util_parse_int64("42", &v), 0);
	ck_assert_int_eq(v, 42);
	ck_assert_int_eq(util_parse_int64("-7", &v), 0);
	ck_assert_int_eq(v, -7);
	ck_assert_int_eq(util_parse_int64("", &v), -1);
	ck_assert_int_eq(util_parse_int64(" 1", &v), -1);
	ck_assert_int_eq(util_parse_int64("1x", &v), -1);
	ck_assert_int_eq(util_parse_int64("9223372036854775808", &v), -1);
	ck_assert_int_eq(util_ceil_div(0, 1000), 0);
	ck_assert_int_eq(util_ceil_div(1, 1000), 1);
	ck_assert_int_eq(util_ceil_div(1000, 1000), 1);
	ck_assert_int_eq(util_ceil_div(1001, 1000), 2);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("rules");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_attrs_set_get_replace);
	tcase_add_test(tc, test_attrs_many);
	tcase_add_loop_test(tc, test_glob, 0,
	    sizeof(glob_cases) / sizeof(glob_cases[0]));
	tcase_add_test(tc, test_pattern_kinds);
	tcase_add_test(tc, test_pattern_optional_bound);
	tcase_add_test(tc, test_template_render);
	tcase_add_test(tc, test_template_too_long);
	tcase_add_test(tc, test_template_errors);
	tcase_add_test(tc, test_template_oom);
	tcase_add_test(tc, test_rule_matches);
	tcase_add_test(tc, test_names_and_algorithms);
	tcase_add_test(tc, test_durations);
	tcase_add_test(tc, test_int64_and_ceil);
	suite_add_tcase(s, tc);
	return s;
}
