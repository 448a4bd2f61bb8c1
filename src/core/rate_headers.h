/*
 * rate_headers.h - the RateLimit headers of a decision (docs/http.md), as
 * text, for every front end: HTTP adds them to its response, gRPC to
 * response_headers_to_add (docs/grpc.md).  One place decides their names
 * and values, so the two never drift apart.  Pure, no allocation; any
 * thread.
 */
#ifndef RL_RATE_HEADERS_H
#define RL_RATE_HEADERS_H

#include "core/decide.h"
#include "core/rules.h"

#define RATE_HEADERS_MAX 6
/* The longest value: a quoted rule name and three 20-digit numbers. */
#define RATE_HEADER_VALUE_MAX (RL_MAX_NAME_BYTES + 80)

struct rate_header {
	const char *name; /* static */
	char value[RATE_HEADER_VALUE_MAX];
};

/*
 * Fill h[] with the headers for d's deciding rule: RateLimit-Policy,
 * RateLimit, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset,
 * and Retry-After when denied.  None when no rule decided (d->rule NULL).
 * Returns how many.
 */
int rate_headers(const struct decision *d,
    struct rate_header h[RATE_HEADERS_MAX]);

#endif
