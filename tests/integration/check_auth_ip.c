/*
 * check_auth_ip.c - the `ip` attribute of /auth through the real daemon
 * (docs/http.md, docs/security.md): X-Forwarded-For counted from the right,
 * repeated headers as one list, auth.client_ip and IPv6 networks.  Each case
 * runs a daemon on the memory store with one rule keyed on ${ip}, limit 1, so
 * the second request of the same key is denied and a request of another key is
 * not.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "harness.h"

static void
start(struct h_daemon *d, const char *auth)
{
	char yaml[2048];

	snprintf(yaml, sizeof(yaml),
	    "listen: \"127.0.0.1:%%PORT%%\"\n"
	    "threads: 2\n"
	    "shutdown_timeout: 2s\n"
	    "backend: memory\n"
	    "auth:\n"
	    "  deny_status: 429\n"
	    "%s"
	    "rules:\n"
	    "  - name: per-ip\n"
	    "    key: \"${ip}\"\n"
	    "    limit: 1\n"
	    "    window: 1m\n",
	    auth);
	h_daemon_start(d, yaml);
}

/* GET /auth with the given headers (NULL-terminated); the status. */
static long
auth(const char *h1, const char *h2, const char *h3)
{
	const char *headers[4] = { h1, h2, h3, NULL };
	struct h_resp r = { 0 };
	long status;

	h_http(&r, "GET", "/auth", NULL, headers);
	status = r.status;
	h_resp_free(&r);
	return status;
}

#define EXPECT(status, h1, h2, h3) \
	do { \
		long got_ = auth(h1, h2, h3); \
		ck_assert_msg(got_ == (status), \
		    "%s | %s | %s: status %ld, " \
		    "expected %d", \
		    h1 ? h1 : "", h2 ? h2 : "", h3 ? h3 : "", got_, (status)); \
	} while (0)

/*
 * The regression: a client writing a new address ahead of the one its
 * proxy appended used to be a new key every time.  Now the proxy's entry,
 * the last, is the key, whatever comes before it.
 */
START_TEST(test_spoofed_entries_are_ignored)
{
	struct h_daemon d = { 0 };

	start(&d, "");
	EXPECT(200, "X-Forwarded-For: 1.1.1.1, 203.0.113.7", NULL, NULL);
	EXPECT(429, "X-Forwarded-For: 2.2.2.2, 203.0.113.7", NULL, NULL);
	EXPECT(429, "X-Forwarded-For: 203.0.113.7", NULL, NULL);
	EXPECT(429, "X-Forwarded-For: 3.3.3.3", "X-Forwarded-For: 203.0.113.7",
	    NULL);
	/* Another client of the same proxy is its own key. */
	EXPECT(200, "X-Forwarded-For: 1.1.1.1, 203.0.113.8", NULL, NULL);
	h_daemon_stop(&d);
}
END_TEST

/*
 * One trusted proxy in front of the nearest: the second entry from the
 * right.  Repeated headers are one list, in the order sent, so the hop
 * count reaches across them (it used to see the last header only).
 */
START_TEST(test_trusted_hops_across_headers)
{
	struct h_daemon d = { 0 };

	start(&d, "  xff_trusted_hops: 1\n");
	EXPECT(200, "X-Forwarded-For: 198.51.100.1",
	    "X-Forwarded-For: 203.0.113.9", NULL);
	/* The same client through the same two proxies, written as one
	 * header, with a forged entry ahead. */
	EXPECT(429, "X-Forwarded-For: 9.9.9.9, 198.51.100.1, 203.0.113.9", NULL,
	    NULL);
	/* A list shorter than the hops gives its first address. */
	EXPECT(429, "X-Forwarded-For: 198.51.100.1", NULL, NULL);
	EXPECT(200, "X-Forwarded-For: 198.51.100.2, 203.0.113.9", NULL, NULL);
	h_daemon_stop(&d);
}
END_TEST

/* client_ip: peer ignores every header: all of these come from 127.0.0.1. */
START_TEST(test_client_ip_peer)
{
	struct h_daemon d = { 0 };

	start(&d, "  client_ip: peer\n");
	EXPECT(200, "X-Real-IP: 192.0.2.1", NULL, NULL);
	EXPECT(429, "X-Real-IP: 192.0.2.2", "X-Forwarded-For: 192.0.2.3", NULL);
	EXPECT(429, NULL, NULL, NULL);
	h_daemon_stop(&d);
}
END_TEST

/* client_ip: x-forwarded-for ignores X-Real-IP, which this proxy would
 * pass through from the client. */
START_TEST(test_client_ip_xff_only)
{
	struct h_daemon d = { 0 };

	start(&d, "  client_ip: x-forwarded-for\n");
	EXPECT(200, "X-Real-IP: 192.0.2.1", "X-Forwarded-For: 203.0.113.5",
	    NULL);
	EXPECT(429, "X-Real-IP: 192.0.2.9", "X-Forwarded-For: 203.0.113.5",
	    NULL);
	h_daemon_stop(&d);
}
END_TEST

/* IPv6 addresses of one /64 are one key by default; /128 keeps them. */
START_TEST(test_ipv6_networks)
{
	struct h_daemon d = { 0 };

	start(&d, "");
	EXPECT(200, "X-Real-IP: 2001:db8:1:2::1", NULL, NULL);
	EXPECT(429, "X-Real-IP: 2001:db8:1:2:ffff:ffff:ffff:ffff", NULL, NULL);
	EXPECT(200, "X-Real-IP: 2001:db8:1:3::1", NULL, NULL);
	h_daemon_stop(&d);

	start(&d, "  ipv6_prefix: 128\n");
	EXPECT(200, "X-Real-IP: 2001:db8:1:2::1", NULL, NULL);
	EXPECT(200, "X-Real-IP: 2001:db8:1:2::2", NULL, NULL);
	EXPECT(429, "X-Real-IP: 2001:db8:1:2:0::1", NULL, NULL);
	h_daemon_stop(&d);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("client_ip");
	TCase *tc = tcase_create("auth");

	tcase_add_unchecked_fixture(tc, NULL, h_reap_orphans);
	tcase_add_test(tc, test_spoofed_entries_are_ignored);
	tcase_add_test(tc, test_trusted_hops_across_headers);
	tcase_add_test(tc, test_client_ip_peer);
	tcase_add_test(tc, test_client_ip_xff_only);
	tcase_add_test(tc, test_ipv6_networks);
	suite_add_tcase(s, tc);
	return s;
}
