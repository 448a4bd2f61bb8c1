/*
 * access_log.c - the access log's one line per decision (access_log.h),
 * shared by the HTTP and the gRPC front ends.
 */
#include "front/access_log.h"

#include <stdio.h>

#include "base/log.h"

void
access_log_decision(const char *endpoint, const struct decision *d,
    const char *code)
{
	char lim[24], rem[24], retry[24];
	const char *k[] = { "endpoint", "allowed", "rule", "limit", "remaining",
		"retry_after_ms", "degraded", "code" };
	const char *v[] = { endpoint,
		d->status != DECIDE_OK ? decide_status_code(d->status) :
		    d->allowed	       ? "true" :
					 "false",
		d->rule != NULL ? d->rule->name : "", lim, rem, retry,
		d->degraded ? "true" : "false", code };

	if (!log_enabled(LOG_LEVEL_INFO))
		return;
	lim[0] = rem[0] = '\0';
	if (d->rule != NULL) {
		snprintf(lim, sizeof(lim), "%lld", (long long)d->limit);
		snprintf(rem, sizeof(rem), "%lld", (long long)d->remaining);
	}
	snprintf(retry, sizeof(retry), "%lld", (long long)d->retry_after_ms);
	log_fields(LOG_LEVEL_INFO, "decision", k, v, code != NULL ? 8 : 7);
}
