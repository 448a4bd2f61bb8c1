/*
 * rls.c - ShouldRateLimit's messages to and from a decision (see rls.h).
 *
 * The mapping (docs/grpc.md): each descriptor is one group of attributes,
 * `domain` plus one attribute per entry, and all groups are decided
 * together, all-or-nothing, as the rules of one HTTP request are.  Each
 * descriptor's status comes from its own rules; current_limit gives the
 * deciding rule's limit over the largest whole unit (second .. day) that
 * fits in its window, rounded down; the RateLimit headers are HTTP's.
 */
#include "front/rls.h"

#include <stdio.h>
#include <string.h>

#include "core/rate_headers.h"
#include "rls.pb-c.h"
#include "base/util.h"

typedef Envoy__Service__Ratelimit__V3__RateLimitRequest rls_request;
typedef Envoy__Service__Ratelimit__V3__RateLimitDescriptor rls_descriptor;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse rls_response;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus
    rls_status;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit rls_limit;
typedef Envoy__Service__Ratelimit__V3__Duration rls_duration;
typedef Envoy__Service__Ratelimit__V3__HeaderValue rls_header;

/* protoc-c's names, shorter. */
#define response_init envoy__service__ratelimit__v3__rate_limit_response__init
#define response_size \
	envoy__service__ratelimit__v3__rate_limit_response__get_packed_size
#define response_pack envoy__service__ratelimit__v3__rate_limit_response__pack
#define status_init \
	envoy__service__ratelimit__v3__rate_limit_response__descriptor_status__init
#define limit_init \
	envoy__service__ratelimit__v3__rate_limit_response__rate_limit__init
#define CODE_OK ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK
#define CODE_OVER \
	ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT

void
rls_call_clear(struct rls_call *c)
{
	size_t i;

	for (i = 0; i < DECIDE_MAX_GROUPS; i++)
		attrs_clear(&c->attrs[i]);
	c->n = 0;
}

int
rls_decode(struct rls_call *c, const uint8_t *msg, size_t len,
    int max_attributes, char *err, size_t errlen)
{
	rls_request *rq;
	size_t i, j;
	int rc = -1;

	rq = envoy__service__ratelimit__v3__rate_limit_request__unpack(NULL,
	    len, msg);
	if (rq == NULL) {
		snprintf(err, errlen, "cannot parse a RateLimitRequest");
		return -1;
	}
	if (rq->n_descriptors > DECIDE_MAX_GROUPS) {
		snprintf(err, errlen, "more than %d descriptors",
		    DECIDE_MAX_GROUPS);
		goto out;
	}
	for (i = 0; i < rq->n_descriptors; i++) {
		const rls_descriptor *d = rq->descriptors[i];
		int64_t cost = rq->hits_addend > 0 ? rq->hits_addend : 1;

		if (d->n_entries + 1 > (size_t)max_attributes) {
			snprintf(err, errlen,
			    "descriptor %zu: more than %d "
			    "attributes",
			    i, max_attributes);
			goto out;
		}
		for (j = 0; j < d->n_entries; j++)
			if (attrs_set(&c->attrs[i], d->entries[j]->key,
				d->entries[j]->value) < 0)
				goto oom;
		/* Last, so that the call's domain wins over an entry of
		 * the same name (docs/grpc.md). */
		if (attrs_set(&c->attrs[i], "domain", rq->domain) < 0)
			goto oom;
		if (d->hits_addend != NULL)
			cost = d->hits_addend->value > INT64_MAX ?
			    INT64_MAX :
			    (int64_t)d->hits_addend->value;
		c->groups[i] = (struct decide_group){ &c->attrs[i], cost };
	}
	c->n = rq->n_descriptors;
	c->req = (struct decide_request){ .cost = -1,
		.groups = c->groups,
		.ngroups = c->n,
		.group_out = c->results };
	rc = 0;
	goto out;
oom:
	snprintf(err, errlen, "out of memory");
out:
	envoy__service__ratelimit__v3__rate_limit_request__free_unpacked(rq,
	    NULL);
	return rc;
}

/* limit over window_ms as a count per the largest unit that fits. */
static void
limit_per_unit(int64_t limit, int64_t window_ms, rls_limit *l)
{
	static const int64_t unit_ms[] = { 86400000, 3600000, 60000, 1000 };
	static const int unit[] = { 4, 3, 2, 1 }; /* DAY .. SECOND */
	double per;
	size_t i;

	for (i = 0; i < 3 && window_ms < unit_ms[i]; i++)
		;
	per = (double)limit * (double)unit_ms[i] / (double)window_ms;
	l->unit = unit[i];
	l->requests_per_unit = per < 1 ? 1 :
	    per >= 4294967295.0	       ? UINT32_MAX :
					 (uint32_t)per;
}

enum grpc_status
rls_encode(const struct rls_call *c, size_t headroom, uint8_t **out,
    size_t *outlen, char *msg, size_t msglen)
{
	const struct decision *d = &c->decision;
	rls_response resp;
	rls_status st[DECIDE_MAX_GROUPS], *stp[DECIDE_MAX_GROUPS];
	rls_limit lim[DECIDE_MAX_GROUPS];
	rls_duration dur[DECIDE_MAX_GROUPS];
	rls_header hv[RATE_HEADERS_MAX], *hvp[RATE_HEADERS_MAX];
	struct rate_header h[RATE_HEADERS_MAX];
	bool failed = false;
	size_t i, size;
	int nh = 0;

	*out = NULL;
	*outlen = 0;
	response_init(&resp);
	switch (d->status) {
	case DECIDE_OK:
		break;
	case DECIDE_COST_EXCEEDS_LIMIT:
	case DECIDE_INVALID_COST: /* a report's only: never here */
		/* hits_addend past a limit can never be admitted. */
	case DECIDE_KEY_TOO_LONG:
		/* Fail closed (docs/grpc.md): an error answer would let
		 * Envoy, failure_mode_deny false, pass the request, so a long
		 * header would escape every limit of the call.  Nothing was
		 * decided: the descriptors whose rule failed are OVER_LIMIT,
		 * the others OK without a limit. */
		failed = true;
		break;
	case DECIDE_BACKEND_UNAVAILABLE:
		snprintf(msg, msglen, "%s", d->message);
		return GRPC_UNAVAILABLE;
	case DECIDE_INTERNAL:
		snprintf(msg, msglen, "%s", d->message);
		return GRPC_INTERNAL;
	case DECIDE_DEADLINE_EXCEEDED:
		snprintf(msg, msglen, "%s", d->message);
		return GRPC_DEADLINE_EXCEEDED;
	default:
		snprintf(msg, msglen, "%s", d->message);
		return GRPC_INVALID_ARGUMENT;
	}
	resp.overall_code = failed || !d->allowed ? CODE_OVER : CODE_OK;
	for (i = 0; i < c->n; i++) {
		const struct decide_group_result *g = &c->results[i];
		bool over = failed ? (d->failed_groups >> i & 1) != 0 :
				     !g->allowed;

		status_init(&st[i]);
		stp[i] = &st[i];
		st[i].code = over ? CODE_OVER : CODE_OK;
		if (failed || g->rule == NULL)
			continue;
		limit_init(&lim[i]);
		lim[i].name = g->rule->name;
		limit_per_unit(g->limit,
		    g->window_ms > 0 ? g->window_ms : g->rule->window_ms,
		    &lim[i]);
		st[i].current_limit = &lim[i];
		st[i].limit_remaining = g->remaining > UINT32_MAX ?
		    UINT32_MAX :
		    (uint32_t)g->remaining;
		envoy__service__ratelimit__v3__duration__init(&dur[i]);
		dur[i].seconds = g->reset_ms / 1000;
		dur[i].nanos = (int32_t)(g->reset_ms % 1000) * 1000000;
		st[i].duration_until_reset = &dur[i];
	}
	resp.n_statuses = c->n;
	resp.statuses = c->n > 0 ? stp : NULL;
	if (!failed)
		nh = rate_headers(d, h);
	for (i = 0; i < (size_t)nh; i++) {
		envoy__service__ratelimit__v3__header_value__init(&hv[i]);
		hv[i].key = (char *)h[i].name;
		hv[i].value = h[i].value;
		hvp[i] = &hv[i];
	}
	resp.n_response_headers_to_add = (size_t)nh;
	resp.response_headers_to_add = nh > 0 ? hvp : NULL;

	size = response_size(&resp);
	if ((*out = rl_malloc(headroom + size)) == NULL) {
		snprintf(msg, msglen, "out of memory");
		return GRPC_INTERNAL;
	}
	response_pack(&resp, *out + headroom);
	*outlen = headroom + size;
	return GRPC_OK;
}

const char *
rls_answer_code(const struct rls_call *c, enum grpc_status status)
{
	switch (status) {
	case GRPC_OK:
		return c->decision.status != DECIDE_OK || !c->decision.allowed ?
		    "OVER_LIMIT" :
		    "OK";
	case GRPC_INVALID_ARGUMENT:
		return "INVALID_ARGUMENT";
	case GRPC_DEADLINE_EXCEEDED:
		return "DEADLINE_EXCEEDED";
	case GRPC_NOT_FOUND:
		return "NOT_FOUND";
	case GRPC_RESOURCE_EXHAUSTED:
		return "RESOURCE_EXHAUSTED";
	case GRPC_UNIMPLEMENTED:
		return "UNIMPLEMENTED";
	case GRPC_INTERNAL:
		return "INTERNAL";
	case GRPC_UNAVAILABLE:
		return "UNAVAILABLE";
	}
	return "UNKNOWN";
}
