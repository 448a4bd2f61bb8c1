/*
 * rls.h - Envoy's rate limit service (docs/grpc.md) mapped onto the one
 * decision every front end takes: a RateLimitRequest's descriptors become
 * attribute groups of one decide_request (decide.h), and the decision
 * becomes a RateLimitResponse.  Protobuf in, protobuf out; no sockets and
 * no HTTP/2 here (grpc_h2.c carries the bytes).  A call is used by one thread
 * at a time.
 */
#ifndef RL_RLS_H
#define RL_RLS_H

#include <stddef.h>
#include <stdint.h>

#include "core/decide.h"
#include "core/rules.h"

/* gRPC status codes the front end answers with. */
enum grpc_status {
	GRPC_OK = 0,
	GRPC_INVALID_ARGUMENT = 3,
	GRPC_DEADLINE_EXCEEDED = 4,
	GRPC_NOT_FOUND = 5,
	GRPC_RESOURCE_EXHAUSTED = 8,
	GRPC_UNIMPLEMENTED = 12,
	GRPC_INTERNAL = 13,
	GRPC_UNAVAILABLE = 14
};

/* One ShouldRateLimit call: what it asks, and the decision. */
struct rls_call {
	struct attrs attrs[DECIDE_MAX_GROUPS]; /* one per descriptor */
	struct decide_group groups[DECIDE_MAX_GROUPS];
	struct decide_group_result results[DECIDE_MAX_GROUPS];
	size_t n;		   /* descriptors */
	struct decide_request req; /* set by rls_decode, but deadline_us */
	struct decision decision;  /* filled by the decision */
};

/*
 * Decode one RateLimitRequest (msg, len bytes) into c, which the caller
 * zeroed: per descriptor an attribute map of `domain` and its entries,
 * and its cost (the descriptor's hits_addend when set, else the
 * request's, 0 meaning 1).  At most DECIDE_MAX_GROUPS descriptors and
 * max_attributes attributes in each.  0, or -1 with a message for an
 * INVALID_ARGUMENT status in err; rls_call_clear() either way.
 */
int rls_decode(struct rls_call *c, const uint8_t *msg, size_t len,
    int max_attributes, char *err, size_t errlen);

/*
 * Encode the answer once c->decision is final.  Returns GRPC_OK with a
 * new RateLimitResponse in *out (rl_malloc; its first `headroom` bytes
 * left for the caller's framing) of *outlen bytes including them; or
 * another status with its message in msg (nothing allocated).  A call
 * without descriptors is OK with no statuses.  A key too long fails
 * closed: GRPC_OK with OVER_LIMIT for the call and for the descriptors
 * in c->decision.failed_groups (docs/grpc.md).
 */
enum grpc_status rls_encode(const struct rls_call *c, size_t headroom,
    uint8_t **out, size_t *outlen, char *msg, size_t msglen);

/*
 * The call's overall code as the access log names it: "OK" or
 * "OVER_LIMIT" for an answer with a RateLimitResponse (status GRPC_OK),
 * else the gRPC status's name ("UNAVAILABLE", ...).  A static string.
 */
const char *rls_answer_code(const struct rls_call *c, enum grpc_status status);

/* Free what rls_decode stored in c. */
void rls_call_clear(struct rls_call *c);

#endif
