/*
 * check_rls.c - unit tests of rls.c: a RateLimitRequest's descriptors into
 * attribute groups (docs/grpc.md), built with protobuf-c as Envoy sends
 * them, packed, and decoded as the gRPC front decodes them.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"

#include "front/rls.h"
#include "rls.pb-c.h"
#include "base/util.h"

typedef Envoy__Service__Ratelimit__V3__RateLimitRequest req_t;
typedef Envoy__Service__Ratelimit__V3__RateLimitDescriptor desc_t;
typedef Envoy__Service__Ratelimit__V3__RateLimitDescriptor__Entry entry_t;

/*
 * Pack a request for domain with one descriptor of n entries (keys[i],
 * values[i]) and decode it into c with at most max attributes per
 * descriptor.  Returns rls_decode's rc.
 */
static int
decode_one(struct rls_call *c, const char *domain, const char *const *keys,
    const char *const *values, size_t n, int max, char *err, size_t errlen)
{
	req_t rq = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_REQUEST__INIT;
	desc_t d = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__INIT;
	desc_t *dp = &d;
	entry_t e[8], *ep[8];
	uint8_t *buf;
	size_t i, len;
	int rc;

	ck_assert_uint_le(n, 8);
	for (i = 0; i < n; i++) {
		envoy__service__ratelimit__v3__rate_limit_descriptor__entry__init(
		    &e[i]);
		e[i].key = (char *)keys[i];
		e[i].value = (char *)values[i];
		ep[i] = &e[i];
	}
	d.n_entries = n;
	d.entries = ep;
	rq.domain = (char *)domain;
	rq.n_descriptors = 1;
	rq.descriptors = &dp;
	len =
	    envoy__service__ratelimit__v3__rate_limit_request__get_packed_size(
		&rq);
	buf = malloc(len + 1);
	ck_assert_ptr_nonnull(buf);
	envoy__service__ratelimit__v3__rate_limit_request__pack(&rq, buf);
	memset(c, 0, sizeof(*c));
	rc = rls_decode(c, buf, len, max, err, errlen);
	free(buf);
	return rc;
}

START_TEST(test_entries_become_attributes)
{
	static const char *const k[] = { "remote_address", "user" };
	static const char *const v[] = { "10.0.0.1", "alice" };
	struct rls_call c;
	char err[128];

	ck_assert_int_eq(decode_one(&c, "edge", k, v, 2, 16, err, sizeof(err)),
	    0);
	ck_assert_uint_eq(c.n, 1);
	ck_assert_uint_eq(c.attrs[0].n, 3);
	ck_assert_str_eq(attrs_get(&c.attrs[0], "domain"), "edge");
	ck_assert_str_eq(attrs_get(&c.attrs[0], "remote_address"), "10.0.0.1");
	ck_assert_str_eq(attrs_get(&c.attrs[0], "user"), "alice");
	ck_assert_int_eq(c.groups[0].cost, 1);
	rls_call_clear(&c);
}
END_TEST

/*
 * An entry may be named as a reserved field of /acquire is (cost, rule,
 * wait_ms): over gRPC those are attributes like any other, which is why
 * the config lets a rule match or key on them only with grpc_listen.
 */
START_TEST(test_reserved_names_are_attributes)
{
	static const char *const k[] = { "cost", "rule", "wait_ms" };
	static const char *const v[] = { "7", "login", "100" };
	struct rls_call c;
	char err[128];

	ck_assert_int_eq(decode_one(&c, "edge", k, v, 3, 16, err, sizeof(err)),
	    0);
	ck_assert_str_eq(attrs_get(&c.attrs[0], "cost"), "7");
	ck_assert_str_eq(attrs_get(&c.attrs[0], "rule"), "login");
	ck_assert_str_eq(attrs_get(&c.attrs[0], "wait_ms"), "100");
	ck_assert_int_eq(c.groups[0].cost, 1);
	rls_call_clear(&c);
}
END_TEST

/*
 * An entry named `domain` does not replace the call's domain: a call for
 * "other" must not match rules written for domain "edge" (docs/grpc.md).
 */
START_TEST(test_call_domain_wins_over_entry)
{
	static const char *const k[] = { "domain", "user" };
	static const char *const v[] = { "edge", "alice" };
	struct rls_call c;
	char err[128];

	ck_assert_int_eq(decode_one(&c, "other", k, v, 2, 16, err, sizeof(err)),
	    0);
	ck_assert_str_eq(attrs_get(&c.attrs[0], "domain"), "other");
	ck_assert_str_eq(attrs_get(&c.attrs[0], "user"), "alice");
	ck_assert_uint_eq(c.attrs[0].n, 2);
	rls_call_clear(&c);
}
END_TEST

START_TEST(test_too_many_entries)
{
	static const char *const k[] = { "a", "b", "c", "d", "e", "f", "g",
		"h" };
	static const char *const v[] = { "1", "2", "3", "4", "5", "6", "7",
		"8" };
	struct rls_call c;
	char err[128] = "";

	/* 8 entries and the domain are 9 attributes; 8 are allowed. */
	ck_assert_int_eq(decode_one(&c, "edge", k, v, 8, 8, err, sizeof(err)),
	    -1);
	ck_assert_ptr_nonnull(strstr(err, "more than 8 attributes"));
	rls_call_clear(&c);
}
END_TEST

typedef Envoy__Service__Ratelimit__V3__RateLimitResponse resp_t;
#define OVER \
	ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT
#define OK ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK

/* Encode c's decision and unpack the answer (free with resp_free). */
static resp_t *
encode(const struct rls_call *c)
{
	char msg[256];
	uint8_t *out;
	size_t outlen;
	resp_t *r;

	ck_assert_int_eq(rls_encode(c, 5, &out, &outlen, msg, sizeof(msg)),
	    GRPC_OK);
	r = envoy__service__ratelimit__v3__rate_limit_response__unpack(NULL,
	    outlen - 5, out + 5);
	ck_assert_ptr_nonnull(r);
	rl_free(out);
	return r;
}

static void
resp_free(resp_t *r)
{
	envoy__service__ratelimit__v3__rate_limit_response__free_unpacked(r,
	    NULL);
}

/* A key too long fails closed: the call and that descriptor OVER_LIMIT,
 * the others OK without a limit, no headers (docs/grpc.md). */
START_TEST(test_key_too_long_is_over_limit)
{
	static struct rls_call c;
	resp_t *r;

	memset(&c, 0, sizeof(c));
	c.n = 3;
	c.decision.status = DECIDE_KEY_TOO_LONG;
	c.decision.failed_groups = 1u << 1;
	r = encode(&c);
	ck_assert_int_eq(r->overall_code, OVER);
	ck_assert_uint_eq(r->n_statuses, 3);
	ck_assert_int_eq(r->statuses[0]->code, OK);
	ck_assert_int_eq(r->statuses[1]->code, OVER);
	ck_assert_int_eq(r->statuses[2]->code, OK);
	ck_assert_ptr_null(r->statuses[0]->current_limit);
	ck_assert_ptr_null(r->statuses[1]->current_limit);
	ck_assert_uint_eq(r->n_response_headers_to_add, 0);
	resp_free(r);
}
END_TEST

/* A cost over a rule's limit: the same, for the descriptors whose rule
 * it exceeds. */
START_TEST(test_cost_over_limit_marks_its_descriptors)
{
	static struct rls_call c;
	resp_t *r;

	memset(&c, 0, sizeof(c));
	c.n = 3;
	c.decision.status = DECIDE_COST_EXCEEDS_LIMIT;
	c.decision.failed_groups = 1u << 0 | 1u << 2;
	r = encode(&c);
	ck_assert_int_eq(r->overall_code, OVER);
	ck_assert_int_eq(r->statuses[0]->code, OVER);
	ck_assert_int_eq(r->statuses[1]->code, OK);
	ck_assert_int_eq(r->statuses[2]->code, OVER);
	ck_assert_ptr_null(r->statuses[1]->current_limit);
	resp_free(r);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("rls");
	TCase *tc = tcase_create("decode");

	tcase_add_test(tc, test_entries_become_attributes);
	tcase_add_test(tc, test_call_domain_wins_over_entry);
	tcase_add_test(tc, test_reserved_names_are_attributes);
	tcase_add_test(tc, test_too_many_entries);
	suite_add_tcase(s, tc);
	tc = tcase_create("encode");
	tcase_add_test(tc, test_key_too_long_is_over_limit);
	tcase_add_test(tc, test_cost_over_limit_marks_its_descriptors);
	suite_add_tcase(s, tc);
	return s;
}
