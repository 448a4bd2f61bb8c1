/*
 * check_slot_map.c - Redis Cluster routing alone (src/core/slot_map.c):
 * the CRC16 of the specification, hash tags exactly as it defines them,
 * building and moving slots, and MOVED / ASK parsing.  The slot numbers
 * checked here are the ones redis-server's CLUSTER KEYSLOT gives.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "store/slot_map.h"

#define K(s) (s), strlen(s)

START_TEST(test_crc16)
{
	/* The specification's test vector. */
	ck_assert_uint_eq(slot_map_crc16(K("123456789")), 0x31C3);
	ck_assert_uint_eq(slot_map_crc16("", 0), 0);
}
END_TEST

START_TEST(test_keyslot)
{
	/* CLUSTER KEYSLOT on redis-server 7 gives these. */
	ck_assert_uint_eq(slot_map_keyslot(K("foo")), 12182);
	ck_assert_uint_eq(slot_map_keyslot(K("bar")), 5061);
	ck_assert_uint_eq(slot_map_keyslot(K("somekey")), 11058);
	/* The tag is hashed alone. */
	ck_assert_uint_eq(slot_map_keyslot(K("{user1000}.following")),
	    slot_map_keyslot(K("user1000")));
	ck_assert_uint_eq(slot_map_keyslot(K("rl:per-ip:{user1000}")),
	    slot_map_keyslot(K("{user1000}.followers")));
	/* The first '{' and the first '}' after it. */
	ck_assert_uint_eq(slot_map_keyslot(K("foo{{bar}}zap")),
	    slot_map_keyslot(K("{bar")));
	ck_assert_uint_eq(slot_map_keyslot(K("foo{bar}{zap}")),
	    slot_map_keyslot(K("bar")));
	/* An empty tag, or no '}', hashes the whole key. */
	ck_assert_uint_eq(slot_map_keyslot(K("foo{}{bar}")),
	    slot_map_crc16(K("foo{}{bar}")) & 16383);
	ck_assert_uint_eq(slot_map_keyslot(K("foo{bar")),
	    slot_map_crc16(K("foo{bar")) & 16383);
	ck_assert_uint_eq(slot_map_keyslot(K("}foo{")),
	    slot_map_crc16(K("}foo{")) & 16383);
	/* Why redis.key_prefix holds no "{}" on Cluster (docs/stats.md): a
	 * stat key's sub-windows ("<key>:<s>") share the slot of their tag
	 * ... */
	ck_assert_uint_eq(slot_map_keyslot(K("rl:stat:lat:{~}:7")),
	    slot_map_keyslot(K("rl:stat:lat:{~}")));
	ck_assert_uint_eq(slot_map_keyslot(K("rl}:stat:lat:{~}:7")),
	    slot_map_keyslot(K("~")));
	/* ... unless an empty tag in the prefix hashes each whole name,
	 * scattering them, */
	ck_assert_uint_ne(slot_map_keyslot(K("app{}:stat:lat:{~}:7")),
	    slot_map_keyslot(K("app{}:stat:lat:{~}")));
	/* or a tag in the prefix puts every key in one slot. */
	ck_assert_uint_eq(slot_map_keyslot(K("{app}:one:{u1}")),
	    slot_map_keyslot(K("{app}:one:{u2}")));
	/* Bytes past a NUL count (keys are binary). */
	ck_assert_uint_ne(slot_map_keyslot("a\0b", 3),
	    slot_map_keyslot("a\0c", 3));
}
END_TEST

START_TEST(test_build_and_move)
{
	struct slot_map m;
	struct slot_range r[3] = {
		{ 0, 5460, "127.0.0.1", 7000 },
		{ 5461, 10922, "127.0.0.1", 7001 },
		{ 10923, 16383, "::1", 7002 },
	};
	char err[128];
	uint64_t v;

	slot_map_init(&m);
	ck_assert_int_eq(slot_map_owner(&m, 0), -1);
	ck_assert_uint_eq(slot_map_unowned(&m), 16384);
	ck_assert_int_eq(slot_map_build(&m, r, 3, err, sizeof(err)), 0);
	ck_assert_uint_eq(m.nnodes, 3);
	ck_assert_uint_eq(slot_map_unowned(&m), 0);
	ck_assert_int_eq(slot_map_owner(&m, 5460), 0);
	ck_assert_int_eq(slot_map_owner(&m, 5461), 1);
	ck_assert_int_eq(slot_map_owner(&m, 16383), 2);
	ck_assert_int_eq(slot_map_owner(&m, 16384), -1);
	ck_assert_str_eq(m.nodes[2].host, "::1");

	/* MOVED to a known node and to a new one; numbers stay. */
	v = m.version;
	ck_assert_int_eq(slot_map_move(&m, 100, "127.0.0.1", 7001, err,
			     sizeof(err)),
	    0);
	ck_assert_int_eq(slot_map_owner(&m, 100), 1);
	ck_assert_uint_gt(m.version, v);
	ck_assert_int_eq(slot_map_move(&m, 101, "127.0.0.1", 7009, err,
			     sizeof(err)),
	    0);
	ck_assert_int_eq(slot_map_owner(&m, 101), 3);
	ck_assert_int_eq(slot_map_owner(&m, 102), 0);

	/* A new map keeps node numbers; slots it leaves out are unowned. */
	r[0].end = 4000;
	ck_assert_int_eq(slot_map_build(&m, r, 3, err, sizeof(err)), 0);
	ck_assert_int_eq(slot_map_owner(&m, 4001), -1);
	ck_assert_int_eq(slot_map_owner(&m, 101), 0);
	ck_assert_uint_eq(m.nnodes, 4);
	ck_assert_uint_eq(slot_map_unowned(&m), 5460 - 4000);

	/* Refused: overlap, reversed, out of range, bad port; unchanged. */
	r[1].start = 4000;
	ck_assert_int_eq(slot_map_build(&m, r, 3, err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "two ranges"));
	r[1].start = 6000;
	r[1].end = 5999;
	ck_assert_int_eq(slot_map_build(&m, r, 3, err, sizeof(err)), -1);
	r[1].end = 16384;
	ck_assert_int_eq(slot_map_build(&m, r, 3, err, sizeof(err)), -1);
	r[1].end = 10922;
	r[1].port = 0;
	ck_assert_int_eq(slot_map_build(&m, r, 3, err, sizeof(err)), -1);
	ck_assert_int_eq(slot_map_owner(&m, 4001), -1);
	ck_assert_int_eq(slot_map_owner(&m, 7000), 1);
	ck_assert_int_eq(slot_map_move(&m, 16384, "h", 1, err, sizeof(err)),
	    -1);
	slot_map_release(&m);
}
END_TEST

START_TEST(test_node_limits)
{
	struct slot_map m;
	char err[128], host[300];
	int i;

	slot_map_init(&m);
	memset(host, 'h', 256);
	host[256] = '\0';
	ck_assert_int_eq(slot_map_node(&m, host, 1, err, sizeof(err)), -1);
	host[255] = '\0';
	ck_assert_int_eq(slot_map_node(&m, host, 1, err, sizeof(err)), 0);
	ck_assert_int_eq(slot_map_node(&m, "", 1, err, sizeof(err)), -1);
	for (i = 1; i < SLOT_MAP_NODES_MAX; i++)
		ck_assert_int_eq(slot_map_node(&m, "n", i, err, sizeof(err)),
		    i);
	ck_assert_int_eq(slot_map_node(&m, "n", 1, err, sizeof(err)), 1);
	ck_assert_int_eq(slot_map_node(&m, "m", 1, err, sizeof(err)), -1);
	ck_assert_ptr_nonnull(strstr(err, "more than"));
	slot_map_release(&m);
}
END_TEST

START_TEST(test_redirect)
{
	char host[64];
	unsigned slot = 0;
	int port = 0;

	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 3999 127.0.0.1:6381"),
			     &slot, host, sizeof(host), &port),
	    SLOT_REDIRECT_MOVED);
	ck_assert_uint_eq(slot, 3999);
	ck_assert_str_eq(host, "127.0.0.1");
	ck_assert_int_eq(port, 6381);
	ck_assert_int_eq(slot_map_parse_redirect(K("ASK 16383 ::1:7002"), &slot,
			     host, sizeof(host), &port),
	    SLOT_REDIRECT_ASK);
	ck_assert_uint_eq(slot, 16383);
	ck_assert_str_eq(host, "::1");
	ck_assert_int_eq(port, 7002);
	/* An empty host: the answering node's. */
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 0 :6380"), &slot,
			     host, sizeof(host), &port),
	    SLOT_REDIRECT_MOVED);
	ck_assert_str_eq(host, "");
	/* Not redirections, or broken ones. */
	ck_assert_int_eq(slot_map_parse_redirect(K("NOSCRIPT No matching"),
			     &slot, host, sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 16384 h:1"), &slot,
			     host, sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 12 h"), &slot, host,
			     sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 12 h:0"), &slot, host,
			     sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 12 h:65536"), &slot,
			     host, sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 12 h:6379x"), &slot,
			     host, sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED x h:1"), &slot, host,
			     sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	ck_assert_int_eq(slot_map_parse_redirect(K("MOVED 12"), &slot, host,
			     sizeof(host), &port),
	    SLOT_REDIRECT_NONE);
	/* A host longer than the caller's buffer. */
	ck_assert_int_eq(slot_map_parse_redirect(K("ASK 1 abcdefgh:1"), &slot,
			     host, 8, &port),
	    SLOT_REDIRECT_NONE);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("slot_map");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_crc16);
	tcase_add_test(tc, test_keyslot);
	tcase_add_test(tc, test_build_and_move);
	tcase_add_test(tc, test_node_limits);
	tcase_add_test(tc, test_redirect);
	suite_add_tcase(s, tc);
	return s;
}
