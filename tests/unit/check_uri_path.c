/*
 * check_uri_path.c - unit tests of uri_path.c: the `path` attribute of
 * /auth normalized as nginx routes it (docs/proxies.md), so that the same
 * path written another way gives the same attribute.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/uri_path.h"

struct norm_case {
	const char *in;
	bool raw;
	const char *want; /* NULL: refused (-1) */
};

/* clang-format off */
static const struct norm_case norm_cases[] = {
	{ "/login", true, "/login" },
	{ "/login?next=/admin", true, "/login" },
	{ "/login#top", true, "/login" },
	/* The same path written another way. */
	{ "/%6cogin", true, "/login" },
	{ "/%6Cogin", true, "/login" },
	{ "//login", true, "/login" },
	{ "/./login", true, "/login" },
	{ "/x/../login", true, "/login" },
	{ "/api//v1///items/", true, "/api/v1/items/" },
	{ "/api/v1/.", true, "/api/v1/" },
	{ "/api/v1/..", true, "/api/" },
	{ "/api/v1/../..", true, "/" },
	/* An encoded slash or dot is one, as nginx decodes it. */
	{ "/%2Flogin", true, "/login" },
	{ "/a%2F..%2Flogin", true, "/login" },
	{ "/%2e/login", true, "/login" },
	{ "/x/%2e%2e/login", true, "/login" },
	/* Decoded once: "%25" is a "%", not the start of another escape. */
	{ "/a%252Fb", true, "/a%2Fb" },
	/* ".." above the root stays at the root. */
	{ "/..", true, "/" },
	{ "/../../login", true, "/login" },
	{ "/%2e%2e/%2e%2e/login", true, "/login" },
	/* A malformed escape stays as it is. */
	{ "/50%", true, "/50%" },
	{ "/a%zzb", true, "/a%zzb" },
	{ "/a%4", true, "/a%4" },
	/* An encoded NUL is refused, as nginx refuses the request. */
	{ "/login%00.png", true, NULL },
	/* An escaped "?" or "#" is part of the path. */
	{ "/a%3Fb?c", true, "/a?b" },
	/* No leading slash; an absolute URI keeps its path. */
	{ "login", true, "/login" },
	{ "", true, "/" },
	{ "?x=1", true, "/" },
	{ "http://example.com/login?x", true, "/login" },
	{ "HTTPS://example.com:8443//./login", true, "/login" },
	{ "http://example.com", true, "/" },
	{ "*", true, "/*" },
	/* Already decoded (the /auth request's own URL): not decoded again,
	 * and "#" is a path character there. */
	{ "/%6cogin", false, "/%6cogin" },
	{ "//login", false, "/login" },
	{ "/x/./../login", false, "/login" },
	{ "/a?b", false, "/a" },
	{ "/a#b", false, "/a#b" },
	{ "login", false, "/login" },
};
/* clang-format on */

START_TEST(test_normalize)
{
	const struct norm_case *c = &norm_cases[_i];
	char out[256], err[128] = "";
	int rc;

	rc = uri_path_normalize(c->in, strlen(c->in), c->raw, out, sizeof(out),
	    err, sizeof(err));
	if (c->want == NULL) {
		ck_assert_msg(rc == -1, "%s: want refused, got \"%s\"", c->in,
		    out);
		ck_assert_str_ne(err, "");
		return;
	}
	ck_assert_msg(rc == 0, "%s: %s", c->in, err);
	ck_assert_str_eq(out, c->want);
}
END_TEST

/* The input is bounded by len and the output by outlen: a long path of
 * slashes and dots fits URI_PATH_ROOM and no more is written; less room
 * is refused. */
START_TEST(test_bounds)
{
	size_t len = 100000, i;
	char *in = malloc(len + 1), *out = malloc(URI_PATH_ROOM(len));
	char err[128];

	ck_assert_ptr_nonnull(in);
	ck_assert_ptr_nonnull(out);
	for (i = 0; i < len; i++)
		in[i] = i % 3 == 2 ? '/' : '.';
	in[len] = '\0';
	ck_assert_int_eq(uri_path_normalize(in, len, true, out,
			     URI_PATH_ROOM(len), err, sizeof(err)),
	    0);
	ck_assert_str_eq(out, "/");
	ck_assert_int_eq(uri_path_normalize(in, len, true, out,
			     URI_PATH_ROOM(len) - 1, err, sizeof(err)),
	    -1);
	/* len stops the input before its NUL: "/login" of "/loginx". */
	ck_assert_int_eq(uri_path_normalize("/loginx", 6, true, out, 8, err,
			     sizeof(err)),
	    0);
	ck_assert_str_eq(out, "/login");
	/* The longest result: a relative path gets its "/". */
	ck_assert_int_eq(uri_path_normalize("ab", 2, true, out, 4, err,
			     sizeof(err)),
	    0);
	ck_assert_str_eq(out, "/ab");
	free(in);
	free(out);
}
END_TEST

/* A raw target's path with an encoded NUL, as libmicrohttpd would cut it;
 * the query and an escaped '%' do not count. */
START_TEST(test_target_has_nul)
{
	ck_assert(uri_path_target_has_nul("/acquire%00junk"));
	ck_assert(uri_path_target_has_nul("/a%00"));
	ck_assert(uri_path_target_has_nul("%00"));
	ck_assert(!uri_path_target_has_nul("/acquire"));
	ck_assert(!uri_path_target_has_nul("/a%2500"));
	ck_assert(!uri_path_target_has_nul("/a%0"));
	ck_assert(!uri_path_target_has_nul("/a%01"));
	ck_assert(!uri_path_target_has_nul("/a?x=%00"));
	ck_assert(!uri_path_target_has_nul(""));
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("uri_path");
	TCase *tc = tcase_create("core");

	tcase_add_loop_test(tc, test_normalize, 0,
	    (int)(sizeof(norm_cases) / sizeof(norm_cases[0])));
	tcase_add_test(tc, test_bounds);
	tcase_add_test(tc, test_target_has_nul);
	suite_add_tcase(s, tc);
	return s;
}
