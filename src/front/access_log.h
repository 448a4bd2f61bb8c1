/*
 * access_log.h - the access log's line (`access_log: true`,
 * docs/operations.md, the log): one info line per decision, written the
 * same way by every front end (HTTP's /acquire and /auth, gRPC's
 * ShouldRateLimit) so the fields mean the same whichever protocol asked.
 */
#ifndef RL_ACCESS_LOG_H
#define RL_ACCESS_LOG_H

#include "core/decide.h"

/*
 * Log d as msg="decision" with endpoint, allowed (true, false, or the
 * decision's status code when it failed), rule, limit, remaining,
 * retry_after_ms and degraded; and code when not NULL (gRPC's answer:
 * OK, OVER_LIMIT, or the call's gRPC status).  Does nothing below level
 * info.  endpoint, d and code are borrowed for the call.  Any thread.
 */
void access_log_decision(const char *endpoint, const struct decision *d,
    const char *code);

#endif
