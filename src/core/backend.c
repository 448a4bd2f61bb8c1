/*
 * backend.c - the blocking forms of a backend call (see backend.h): submit
 * a call and wait for its completion on a condition variable.  For tests
 * and tools; the daemon's front ends submit calls and go on.
 */
#include "core/backend.h"

#include <stdio.h>
#include <string.h>

#include "base/util.h"

static void
call_event_set(struct backend_call *call)
{
	util_event_set(call->arg);
}

/* Submit call and wait until it completes. */
static void
backend_wait(struct backend *b, struct backend_call *call)
{
	struct util_event ev;

	util_event_init(&ev);
	call->done = call_event_set;
	call->arg = &ev;
	backend_submit(b, call);
	util_event_wait(&ev);
	util_event_destroy(&ev);
}

int
backend_decide(struct backend *b, const struct rl_check *checks, size_t n,
    struct rl_result *out, bool *all_allowed, enum backend_error_kind *kind,
    char *err, size_t errlen)
{
	struct backend_call call;

	*all_allowed = false;
	*kind = BACKEND_ERR_NONE;
	if (n == 0) {
		*all_allowed = true;
		return 0;
	}
	memset(&call, 0, sizeof(call));
	call.checks = checks;
	call.n = n;
	call.out = out;
	backend_wait(b, &call);
	if (call.rc == 0) {
		*all_allowed = call.all_allowed;
		return 0;
	}
	*kind = call.kind;
	snprintf(err, errlen, "%s", call.err);
	return -1;
}

int
backend_admin_call(struct backend *b, struct backend_admin *a,
    enum backend_error_kind *kind, char *err, size_t errlen)
{
	struct backend_call call;

	memset(&call, 0, sizeof(call));
	a->found = false;
	a->reply = NULL;
	a->replylen = 0;
	call.admin = a;
	backend_wait(b, &call);
	*kind = call.kind;
	if (call.rc == 0)
		return 0;
	snprintf(err, errlen, "%s", call.err);
	return -1;
}

bool
backend_is_ready(struct backend *b)
{
	struct backend_call call;

	memset(&call, 0, sizeof(call));
	backend_wait(b, &call);
	return call.rc == 0;
}
