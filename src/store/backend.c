/*
 * backend.c - the blocking forms of a backend call (see backend.h): submit
 * a call and wait for its completion on a condition variable.  For tests
 * and tools; the daemon's front ends submit calls and go on.
 */
#include "backend.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
};

static void
waiter_done(struct backend_call *call)
{
	struct waiter *w = call->arg;

	pthread_mutex_lock(&w->mu);
	w->done = true;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* Submit call and wait until it completes. */
static void
backend_wait(struct backend *b, struct backend_call *call)
{
	struct waiter w = { .done = false };

	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	call->done = waiter_done;
	call->arg = &w;
	backend_submit(b, call);
	pthread_mutex_lock(&w.mu);
	while (!w.done)
		pthread_cond_wait(&w.cv, &w.mu);
	pthread_mutex_unlock(&w.mu);
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.mu);
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

bool
backend_is_ready(struct backend *b)
{
	struct backend_call call;

	memset(&call, 0, sizeof(call));
	backend_wait(b, &call);
	return call.rc == 0;
}
