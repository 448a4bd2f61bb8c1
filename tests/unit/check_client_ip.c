/*
 * check_client_ip.c - unit tests of client_ip.c: which address a proxied
 * request came from, with X-Forwarded-For counted from the right
 * (docs/http.md) and IPv6 addresses reduced to their network
 * (docs/security.md).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "core/client_ip.h"

struct pick_case {
	enum client_ip_source source;
	int hops, prefix;
	const char *xri, *xff, *peer;
	const char *want; /* NULL: no address (-1) */
};

/* clang-format off */
static const struct pick_case pick_cases[] = {
	/* The nearest proxy's entry is the last one: a client writing its
	 * own entries ahead of it changes nothing. */
	{ CLIENT_IP_AUTO, 0, 64, NULL, "203.0.113.7", "10.0.0.1",
	  "203.0.113.7" },
	{ CLIENT_IP_AUTO, 0, 64, NULL, "1.1.1.1, 203.0.113.7", "10.0.0.1",
	  "203.0.113.7" },
	{ CLIENT_IP_AUTO, 0, 64, NULL, "9.9.9.9, 8.8.8.8, 203.0.113.7",
	  "10.0.0.1", "203.0.113.7" },
	/* One trusted proxy in front of the nearest: one place left. */
	{ CLIENT_IP_AUTO, 1, 64, NULL, "9.9.9.9, 198.51.100.2, 203.0.113.7",
	  "10.0.0.1", "198.51.100.2" },
	{ CLIENT_IP_AUTO, 2, 64, NULL, "9.9.9.9, 198.51.100.2, 203.0.113.7",
	  "10.0.0.1", "9.9.9.9" },
	/* Shorter than the hops: the first address. */
	{ CLIENT_IP_AUTO, 5, 64, NULL, "198.51.100.2, 203.0.113.7",
	  "10.0.0.1", "198.51.100.2" },
	/* Several headers joined into one list, blanks and empty entries
	 * dropped. */
	{ CLIENT_IP_AUTO, 1, 64, NULL, "6.6.6.6,  198.51.100.2 ,,\t203.0.113.7 ",
	  "10.0.0.1", "198.51.100.2" },
	{ CLIENT_IP_AUTO, 0, 64, NULL, " , ,", "10.0.0.1", "10.0.0.1" },
	/* Ports and brackets. */
	{ CLIENT_IP_AUTO, 0, 128, NULL, "1.2.3.4, 203.0.113.7:51234",
	  NULL, "203.0.113.7" },
	{ CLIENT_IP_AUTO, 0, 128, NULL, "[2001:db8::1]:443", NULL,
	  "2001:db8::1" },
	/* Not an address: counts as absent, the peer is used. */
	{ CLIENT_IP_AUTO, 0, 64, NULL, "1.2.3.4, unknown", "10.0.0.1",
	  "10.0.0.1" },
	{ CLIENT_IP_AUTO, 0, 64, "garbage", NULL, "10.0.0.1", "10.0.0.1" },
	{ CLIENT_IP_AUTO, 0, 64, NULL, "1.2.3.4:99x", "10.0.0.1",
	  "10.0.0.1" },
	/* auto prefers X-Real-IP. */
	{ CLIENT_IP_AUTO, 0, 64, "192.0.2.5", "203.0.113.7", "10.0.0.1",
	  "192.0.2.5" },
	/* x-real-ip alone: X-Forwarded-For is ignored. */
	{ CLIENT_IP_X_REAL_IP, 0, 64, NULL, "203.0.113.7", "10.0.0.1",
	  "10.0.0.1" },
	{ CLIENT_IP_X_REAL_IP, 0, 64, "192.0.2.5", "203.0.113.7",
	  "10.0.0.1", "192.0.2.5" },
	/* x-forwarded-for alone: X-Real-IP is ignored. */
	{ CLIENT_IP_XFF, 0, 64, "192.0.2.5", "1.1.1.1, 203.0.113.7",
	  "10.0.0.1", "203.0.113.7" },
	{ CLIENT_IP_XFF, 0, 64, "192.0.2.5", NULL, "10.0.0.1", "10.0.0.1" },
	/* peer: headers never count. */
	{ CLIENT_IP_PEER, 0, 64, "192.0.2.5", "203.0.113.7", "10.0.0.1",
	  "10.0.0.1" },
	{ CLIENT_IP_PEER, 0, 64, "192.0.2.5", "203.0.113.7", NULL, NULL },
	/* IPv6: the /64 by default, any prefix, 128 keeps it whole. */
	{ CLIENT_IP_AUTO, 0, 64, NULL, "2001:db8:1:2:aaaa:bbbb:cccc:dddd",
	  NULL, "2001:db8:1:2::/64" },
	{ CLIENT_IP_AUTO, 0, 48, NULL, "2001:db8:1:2:aaaa::1", NULL,
	  "2001:db8:1::/48" },
	{ CLIENT_IP_AUTO, 0, 60, NULL, "2001:db8:1:2ff:aaaa::1", NULL,
	  "2001:db8:1:2f0::/60" },
	{ CLIENT_IP_AUTO, 0, 128, NULL, "2001:DB8::A", NULL,
	  "2001:db8::a" },
	{ CLIENT_IP_PEER, 0, 64, NULL, NULL, "2001:db8:1:2::99",
	  "2001:db8:1:2::/64" },
	/* IPv4-mapped counts as IPv4, never masked. */
	{ CLIENT_IP_PEER, 0, 64, NULL, NULL, "::ffff:192.0.2.1",
	  "192.0.2.1" },
	/* Nothing at all. */
	{ CLIENT_IP_AUTO, 0, 64, NULL, NULL, NULL, NULL },
};
/* clang-format on */

START_TEST(test_pick)
{
	const struct pick_case *c = &pick_cases[_i];
	struct client_ip_policy p = { c->source, c->hops, c->prefix };
	char out[CLIENT_IP_MAX];
	int rc;

	memset(out, 'x', sizeof(out));
	rc = client_ip_pick(&p, c->xri, c->xff, c->peer, out, sizeof(out));
	if (c->want == NULL) {
		ck_assert_int_eq(rc, -1);
		ck_assert_str_eq(out, "");
	} else {
		ck_assert_msg(rc == 0, "case %d: no address", _i);
		ck_assert_msg(strcmp(out, c->want) == 0,
		    "case %d: got %s, want %s", _i, out, c->want);
	}
}
END_TEST

/* A client that sends a new spoofed entry each time always lands on the
 * same key, whatever it writes and however much. */
START_TEST(test_spoofing_changes_nothing)
{
	struct client_ip_policy p = { CLIENT_IP_AUTO, 0, 64 };
	char xff[8192], out[CLIENT_IP_MAX];
	size_t n = 0;
	int i;

	for (i = 0; i < 500; i++) {
		n += (size_t)snprintf(xff + n, sizeof(xff) - n, "10.%d.%d.%d, ",
		    i / 256, i % 256, i % 7);
		ck_assert_int_lt(n, sizeof(xff) - 64);
		snprintf(xff + n, sizeof(xff) - n, "203.0.113.7");
		ck_assert_int_eq(client_ip_pick(&p, NULL, xff, "127.0.0.1", out,
				     sizeof(out)),
		    0);
		ck_assert_str_eq(out, "203.0.113.7");
	}
}
END_TEST

START_TEST(test_normalize_bounds)
{
	char out[CLIENT_IP_MAX], small[8];
	char big[200];

	/* A too small buffer is an error, never a truncated key. */
	ck_assert_int_eq(client_ip_normalize("203.0.113.7", 11, 64, small,
			     sizeof(small)),
	    -1);
	/* An overlong entry is not an address. */
	memset(big, '1', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	ck_assert_int_eq(client_ip_normalize(big, strlen(big), 64, out,
			     sizeof(out)),
	    -1);
	ck_assert_int_eq(client_ip_normalize("", 0, 64, out, sizeof(out)), -1);
	ck_assert_int_eq(client_ip_normalize("[::1", 4, 64, out, sizeof(out)),
	    -1);
	ck_assert_int_eq(client_ip_normalize("[::1]x", 6, 128, out,
			     sizeof(out)),
	    -1);
	ck_assert_int_eq(client_ip_normalize("1.2.3.4:", 8, 64, out,
			     sizeof(out)),
	    -1);
	/* The longest form fits CLIENT_IP_MAX. */
	ck_assert_int_eq(
	    client_ip_normalize("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 39,
		127, out, sizeof(out)),
	    0);
	ck_assert_str_eq(out, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127");
}
END_TEST

START_TEST(test_source_names)
{
	ck_assert_str_eq(client_ip_source_names[CLIENT_IP_AUTO], "auto");
	ck_assert_str_eq(client_ip_source_names[CLIENT_IP_XFF],
	    "x-forwarded-for");
	ck_assert_str_eq(client_ip_source_names[CLIENT_IP_X_REAL_IP],
	    "x-real-ip");
	ck_assert_str_eq(client_ip_source_names[CLIENT_IP_PEER], "peer");
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("client_ip");
	TCase *tc = tcase_create("core");

	tcase_add_loop_test(tc, test_pick, 0,
	    sizeof(pick_cases) / sizeof(pick_cases[0]));
	tcase_add_test(tc, test_spoofing_changes_nothing);
	tcase_add_test(tc, test_normalize_bounds);
	tcase_add_test(tc, test_source_names);
	suite_add_tcase(s, tc);
	return s;
}
