/*
 * http_wait.c - a request with wait_ms that waits in the daemon instead of
 * being answered 429 at once (docs/waiting.md, docs/leases.md): for its
 * turn (the store reserved a time; the server's wait timer, wait_timer.c,
 * resumes it then) or for a lease of a concurrency rule (the daemon's
 * lease queues, lease_wait.c, tell it when to try again).  While it waits
 * its connection is suspended and the timer's or the queues' thread has
 * it.  A waiter a shutdown cuts while it holds leases has them released
 * before its 503.  And a decision whose lease would be answered with
 * nothing left (the store's reply came late, a turn on top) is not
 * answered: the lease is released and the request decided again, as a
 * waiter for a lease (lease_lost()).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <microhttpd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "base/util.h"
#include "core/decide.h"
#include "core/lease.h"
#include "front/http_priv.h"
#include "front/lease_wait.h"
#include "front/wait_timer.h"

/* Allowed by a reservation whose time has not come yet. */
bool
http_wait_needed(const struct request *rq)
{
	return rq->decision.status == DECIDE_OK && rq->decision.allowed &&
	    rq->decision.waited_ms > 0 && !rq->turn_came;
}

/*
 * Waiting for a turn (docs/waiting.md).  A request with wait_ms takes a slot
 * of max_waiting for its whole life (past it, it is decided as if it had
 * no wait_ms: 429 at once when denied).  When the store reserved a time,
 * the connection is suspended and the one timer of the server resumes it
 * then (wait_fire), or at once with 503 shutting_down when a shutdown cut
 * it.  A client that left meanwhile keeps its reservation.
 */
void
http_wait_take_slot(struct http_server *s, struct request *rq)
{
	if (rq->dr.wait_ms <= 0)
		return;
	if (__atomic_add_fetch(&s->waiting, 1, __ATOMIC_SEQ_CST) >
	    rq->cfg->max_waiting) {
		__atomic_sub_fetch(&s->waiting, 1, __ATOMIC_SEQ_CST);
		metrics_wait_full(s->metrics);
		rq->dr.wait_ms = 0;
		return;
	}
	rq->wait_slot = true;
}

/*
 * A waiter for its turn holds the leases its decision took (a concurrency
 * rule admitted it, another rule reserved a later time).  When a shutdown
 * cuts its wait, its answer is 503 shutting_down, so nobody will release
 * them: they are released first, as POST /release would (docs/waiting.md,
 * docs/leases.md), one store call per lease on the store that holds it
 * (the local one of a degraded answer), each under the store's own
 * timeout.  So are the leases of a decision that would be answered with
 * one that has nothing left (lease_lost()).  The calls and their keys
 * live in one block, freed by the last completion, which then runs
 * then(rq) (rq NULL: nobody waits for them).
 */
struct lease_drop {
	struct request *rq;	   /* then(rq) at the end, or NULL */
	void (*then)(void *rq);	   /* http_resume, or lease_again */
	struct lease_wait *leases; /* the server's queues; borrowed */
	int pending;		   /* atomic: calls out, and the starter */
	struct lease_drop_call {
		struct backend_call call;
		struct rl_check check;
		struct rl_result out;
	} c[];
	/* then, per call, its key: "<prefix><suffix>" NUL token NUL */
};

/* One call of a drop is done (the store's thread, or inside the submit);
 * the last one frees the drop and hands its request on. */
static void
lease_drop_done(struct backend_call *call)
{
	struct lease_drop *drop = call->arg;
	const struct rl_check *c = call->checks;
	void (*then)(void *rq);
	struct request *rq;

	if (call->rc != 0)
		log_debug(
		    "a lease of a request not answered 200 was not "
		    "released: %s",
		    call->err);
	else if (call->out[0].allowed) /* its waiters may go on */
		lease_wait_released(drop->leases,
		    lease_key_hash(c->key, c->keylen));
	if (__atomic_sub_fetch(&drop->pending, 1, __ATOMIC_ACQ_REL) > 0)
		return;
	rq = drop->rq;
	then = drop->then;
	rl_free(drop);
	if (rq != NULL)
		then(rq);
}

/* Fill call i of drop (key at key) to release lease l; false when l is
 * not a lease this daemon formats (it cannot happen). */
static bool
lease_drop_fill(struct lease_drop *drop, size_t i, char *key,
    const char *prefix, const struct decide_lease *l)
{
	struct lease_drop_call *dc = &drop->c[i];
	struct lease_ref ref;

	if (lease_parse(l->lease, strlen(l->lease), &ref) == -1)
		return false;
	lease_check_make(&dc->check, key, prefix, &ref, l->rule->limit,
	    l->rule->window_ms);
	dc->call.checks = &dc->check;
	dc->call.n = 1;
	dc->call.out = &dc->out;
	dc->call.lease_op = BACKEND_LEASE_RELEASE;
	dc->call.done = lease_drop_done;
	dc->call.arg = drop;
	return true;
}

/*
 * Release rq's leases (above), and forget them.  With then, true when
 * the release is under way: its last completion runs then(rq) (maybe
 * before this returns), and rq is no longer the caller's.  False when
 * there was nothing to release, or no memory for it (the leases then
 * expire after their window); the caller goes on with rq.  Without then
 * (NULL), nobody waits: the caller answers rq at once.  The thread that
 * has rq.
 */
static bool
lease_drop_start(struct request *rq, void (*then)(void *rq))
{
	const struct decider *d = rq->s->decider;
	struct decision *dec = &rq->decision;
	const char *prefix = rq->cfg->redis.key_prefix;
	size_t keycap = LEASE_KEY_CAP(strlen(prefix));
	struct backend *b = dec->degraded && d->local != NULL ? d->local :
								d->backend;
	struct lease_drop *drop;
	char *keys;
	size_t i, n = 0;

	if (dec->nleases == 0)
		return false;
	drop = rl_calloc(1,
	    sizeof(*drop) + dec->nleases * (sizeof(drop->c[0]) + keycap));
	if (drop == NULL) {
		decide_leases_free(dec);
		return false;
	}
	keys = (char *)&drop->c[dec->nleases];
	for (i = 0; i < dec->nleases; i++)
		if (lease_drop_fill(drop, n, keys + n * keycap, prefix,
			&dec->leases[i]))
			n++;
	decide_leases_free(dec);
	if (n == 0) {
		rl_free(drop);
		return false;
	}
	drop->rq = then != NULL ? rq : NULL;
	drop->then = then;
	drop->leases = rq->s->leases;
	drop->pending = (int)n + 1; /* the starter's until all are out */
	for (i = 0; i < n; i++)
		backend_submit(b, &drop->c[i].call);
	if (__atomic_sub_fetch(&drop->pending, 1, __ATOMIC_ACQ_REL) == 0) {
		rl_free(drop);
		if (then != NULL)
			then(rq);
	}
	return then != NULL;
}

/* The timer's thread: the time has come (or a shutdown cut it; a cut
 * waiter's leases are released before it is resumed). */
static void
wait_fire(void *arg, bool cut)
{
	struct request *rq = arg;

	rq->cut = cut;
	if (cut && lease_drop_start(rq, http_resume))
		return;
	http_resume(rq);
}

/*
 * Waiting for a lease (docs/leases.md with wait_ms).  A request with a wait
 * slot that a concurrency rule denied, while every other rule could admit
 * it in time (decision.lease_wait), stays suspended in the daemon's
 * lease_wait queues (lease_wait.c).  Told TRY, it is decided again with
 * the wait left (lease_try(), on the queue's thread), and the store's
 * answer comes back to lease_tried(): denied the same way, it parks again
 * at its place; else it leaves the queue, which lets the next waiter of
 * the key try, and is answered.  At its deadline it is decided once more
 * without waiting, and answered whatever that says: the answer carries
 * the numbers of then.  A newcomer that may wait for a key others already
 * wait for queues behind them without trying, so that it cannot take a
 * lease freed for the first of them; when its deadline passes before the
 * store answers that look, it too is decided once more without waiting.
 */
static bool
lease_wait_needed(const struct request *rq)
{
	return rq->wait_slot && !rq->lease_over &&
	    rq->decision.status == DECIDE_OK && !rq->decision.allowed &&
	    rq->decision.lease_wait && util_monotonic_us() < rq->wait_until_us;
}

static void lease_try(struct request *rq);

/* Park rq (suspended) for key; when that fails, answer it now. */
static void
lease_park(struct request *rq, uint64_t key, int64_t retry_us)
{
	int rc;

	rc = lease_wait_park(rq->s->leases, &rq->lw, key, retry_us,
	    rq->wait_until_us, rq->tried_us);
	if (rc == 0)
		return;
	rq->lease_over = true;
	if (rc == -1) { /* stopping */
		rq->cut = true;
		http_resume(rq);
	} else /* out of memory: decide now */
		lease_try(rq);
}

/* A try is done (the store's thread, or inline). */
static void
lease_tried(void *arg)
{
	struct request *rq = arg;
	int64_t now = util_monotonic_us();

	if (lease_wait_needed(rq)) {
		lease_park(rq, rq->decision.lease_key,
		    now + rq->decision.lease_retry_ms * 1000);
		return;
	}
	rq->lease_over = true;
	lease_wait_leave(rq->s->leases, &rq->lw);
	rq->lease_waited_ms = (now - rq->arrived_us) / 1000;
	http_resume(rq);
}

/* Decide rq again with the wait it has left (none once lease_over), its
 * concurrency checks only looking when lease_again() says so, under the
 * rules in force now: a reload while it waits (up to max_wait) applies
 * to it, as to the requests that arrive meanwhile, so no more leases are
 * held than the new limit; and the reload (or an override) makes it try
 * at once (lease_wait_all()), so a raised limit serves it.  The request
 * is parked: nothing else reads rq->cfg meanwhile. */
static void
lease_try(struct request *rq)
{
	int64_t now = util_monotonic_us();
	struct config *cur = http_server_get_config(rq->s);
	struct decide_job *job;
	bool look = rq->lease_look; /* lease_again() */

	rq->lease_look = false;
	decide_leases_free(&rq->decision); /* it names the old rules */
	if (cur != rq->cfg) {
		config_unref(rq->cfg);
		rq->cfg = cur;
	} else
		config_unref(cur);
	if (now >= rq->wait_until_us)
		rq->lease_over = true;
	rq->dr.wait_ms = rq->lease_over ? 0 : (rq->wait_until_us - now) / 1000;
	rq->dr.start_us = now;
	rq->tried_us = now;
	if (decide_prepare(rq->s->decider, rq->cfg, &rq->dr, &rq->decision,
		&job) == 0) {
		lease_tried(rq);
		return;
	}
	if (look)
		decide_job_look_leases(job);
	decide_run(job, lease_tried, rq);
}

/*
 * A lease that would be answered with nothing left (docs/leases.md): the
 * store took it when the call left, or later, and holds it for its
 * window from then, so an answer that goes out a window after the call
 * left (a reply held up on its way back, a turn on another rule on top)
 * could hand out a lease the store has let go, while another request
 * takes its units.  Such a decision is not answered 200: its leases are
 * released, as POST /release would (this daemon's waiters, and on Redis
 * every daemon's, try again), and then it is decided again
 * (lease_again()).  rq waits in WAITING_LEASE meanwhile.  The event loop.
 */
static void lease_again(void *arg);

static enum MHD_Result
lease_lost(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	log_debug(
	    "a lease would be answered with nothing left: released, "
	    "the request is decided again");
	if (!http_request_enter(rq, RQ_WAITING_LEASE)) {
		rq->cut = true;
		(void)lease_drop_start(rq, NULL);
		return http_respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	}
	if (!lease_drop_start(rq, lease_again))
		lease_again(rq);
	return MHD_YES;
}

/*
 * The lost leases are released (the store's thread, or inline): decide
 * rq again, once, with the wait it has left, as a waiter for a lease
 * (it may take a lease now free, wait for one, or for its turn).  With
 * none left, or lost a second time, its concurrency checks only look,
 * and it is answered that, as a wait that ran out: the 429 of then.
 */
static void
lease_again(void *arg)
{
	struct request *rq = arg;
	bool again = !rq->lease_lost && rq->wait_slot &&
	    util_monotonic_us() < rq->wait_until_us;

	rq->lease_lost = true;
	rq->turn_came = false; /* a new decision: maybe a new turn */
	rq->lease_over = !again;
	rq->lease_look = !again;
	lease_try(rq);
}

/* The queue's thread: what became of rq's wait. */
void
http_lease_event(struct lease_waiter *w, enum lease_wait_event ev)
{
	struct request *rq = (struct request *)(void *)((char *)w -
	    offsetof(struct request, lw));

	switch (ev) {
	case LEASE_WAIT_TRY:
		lease_try(rq);
		break;
	case LEASE_WAIT_TIMEOUT:
		rq->lease_over = true;
		lease_try(rq);
		break;
	case LEASE_WAIT_CUT:
		rq->lease_over = true;
		rq->cut = true;
		http_resume(rq);
		break;
	}
}

/*
 * A newcomer that may wait, whose job would take a lease of a key that
 * others of this daemon wait for, must not take a lease freed for them:
 * its job only looks at the lease (decide_job_look_leases()), so the
 * store says whether its other rules would let it wait, and it queues
 * behind them (http_answer_decision()), or is answered 429 at once when
 * another rule denies it for longer than its wait (docs/leases.md).
 */
void
http_lease_queue_behind(struct http_server *s, struct request *rq,
    struct decide_job *job)
{
	uint64_t keys[8];
	size_t n;

	if (!rq->wait_slot || rq->lease_over ||
	    (n = decide_job_lease_keys(job, keys, 8)) == 0 ||
	    !lease_wait_any(s->leases, keys, n, &rq->queued_key))
		return;
	decide_job_look_leases(job);
	rq->queued = true;
}

/* A newcomer's look that would have queued it, but that came back after
 * its deadline (a slow store; wait: lease_wait_needed(), read once): the
 * look's denial is no answer, since it took no lease by design. */
static bool
look_ran_out(const struct request *rq, bool wait)
{
	return rq->queued && rq->decision.status == DECIDE_OK &&
	    !rq->decision.allowed && rq->decision.lease_wait && !wait;
}

/* A decided /acquire: wait for a lease, or for its reserved time, or
 * answer now. */
enum MHD_Result
http_answer_decision(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	/* One look at the clock for both: between two, the deadline could
	 * pass and the look's denial be answered. */
	bool wait = lease_wait_needed(rq), turn;
	int64_t now = 0;

	if (look_ran_out(rq, wait)) {
		/* Decided once more without waiting, as a waiter whose
		 * wait ran out (LEASE_WAIT_TIMEOUT), and answered that. */
		rq->queued = false;
		rq->lease_over = true;
		if (http_request_enter(rq, RQ_WAITING_LEASE)) {
			lease_try(rq);
			return MHD_YES;
		}
		rq->cut = true;
	}
	if (wait) {
		if (http_request_enter(rq, RQ_WAITING_LEASE)) {
			/* Queued behind others, it learnt nothing of the
			 * lease: the first of its key, it tries at once. */
			if (rq->queued)
				lease_park(rq, rq->queued_key, INT64_MAX);
			else
				lease_park(rq, rq->decision.lease_key,
				    util_monotonic_us() +
					rq->decision.lease_retry_ms * 1000);
			rq->queued = false;
			return MHD_YES;
		}
		rq->cut = true;
	}
	turn = http_wait_needed(rq);
	if (rq->decision.nleases > 0 && !rq->cut) {
		/* One look at the clock for the leases and the turn: the
		 * answer goes out now, or at the turn. */
		now = util_monotonic_us();
		if (!decide_leases_held(&rq->decision,
			turn ? now + rq->decision.waited_ms * 1000 : now))
			return lease_lost(s, conn, rq);
		rq->answer_us = now;
	}
	if (turn) {
		if (!http_request_enter(rq, RQ_WAITING_TURN)) {
			/* The server stops: it suspends nothing more, so the
			 * release goes out without waiting for it. */
			rq->cut = true;
			(void)lease_drop_start(rq, NULL);
		} else {
			rq->turn_came = true; /* before the timer has it */
			if (now == 0)
				now = util_monotonic_us();
			if (wait_timer_add(s->timer,
				now + rq->decision.waited_ms * 1000, wait_fire,
				rq) == -1)
				/* Out of memory: resume it at once, cut. */
				wait_fire(rq, true);
			return MHD_YES;
		}
	}
	if (rq->cut)
		return http_respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	return http_finish_decision(s, conn, rq);
}

bool
http_wait_raw_ready(struct request *rq)
{
	int64_t now;

	if (rq->decision.nleases == 0)
		return true;
	now = util_monotonic_us();
	if (decide_leases_held(&rq->decision, now)) {
		rq->answer_us = now;
		return true;
	}
	(void)lease_drop_start(rq, NULL);
	return false;
}
