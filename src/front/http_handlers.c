/*
 * http_handlers.c - one handler per endpoint of docs/http.md: /acquire and
 * /auth (decisions), /readyz (a probe of the store), /record and /stats
 * (docs/stats.md), /release and /renew (docs/leases.md), /healthz and
 * /metrics, and the routing of a method and path to one of them.  A
 * handler runs on the event loop in the last call of a request, and again
 * when a suspended request was resumed.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <microhttpd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "base/util.h"
#include "core/lease.h"
#include "core/overrides.h"
#include "core/prefetch.h"
#include "core/request_json.h"
#include "core/stats_request.h"
#include "front/access_log.h"
#include "front/http_guard.h"
#include "front/http_priv.h"
#include "front/http_request.h"
#include "front/lease_wait.h"

void
http_log_access(const struct request *rq)
{
	access_log_decision(rq->ep == EP_ACQUIRE ? "acquire" : "auth",
	    &rq->decision, NULL);
}

/* A decided request: answer it and log it. */
enum MHD_Result
http_finish_decision(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	enum MHD_Result ret = http_respond_decision(s, conn, rq);

	if (rq->cfg->access_log && log_enabled(LOG_LEVEL_INFO))
		http_log_access(rq);
	return ret;
}

/* The answer to http_auth_attrs()'s failure rc (http_priv.h). */
static enum MHD_Result
auth_attrs_error(struct http_server *s, struct MHD_Connection *conn,
    const struct request *rq, int rc)
{
	if (rc == -2)
		return http_respond_error(s, conn, 400, "too_many_attributes",
		    "more than %d attributes (headers included)",
		    rq->cfg->max_attributes);
	if (rc == -3)
		return http_respond_error(s, conn, 400, "invalid_path",
		    "the path has an encoded NUL (%%00)");
	return http_respond_error(s, conn, 500, "internal_error",
	    "out of memory");
}

/*
 * The last call for /acquire or /auth: gather attributes, decide what can
 * be decided here, and hand the rest to the store.  Called again after the
 * store's answer resumed the connection, in RQ_ANSWERING.
 */
enum MHD_Result
http_handle_decision(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq, const char *url, const char *method)
{
	struct decide_job *job;
	int rc;

	if (rq->state == RQ_ANSWERING) /* resumed */
		return http_answer_decision(s, conn, rq);
	if (rq->too_large)
		return http_respond_error(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	rq->dr.attrs = &rq->attrs;
	rq->dr.cost = -1;
	rq->dr.start_us = rq->arrived_us;
	if (rq->ep == EP_ACQUIRE) {
		struct http_acquire acq;
		struct request_error e;

		if (http_acquire_parse(rq->cfg, rq->body, rq->len, &rq->attrs,
			&acq, &e) < 0)
			return http_respond_error(s, conn, e.status, e.code,
			    "%s", e.message);
		rq->rule = acq.rule;
		rq->dr.cost = acq.cost;
		rq->dr.wait_ms = acq.wait_ms;
		rq->dr.rule = rq->rule;
		rq->dr.leases = true; /* /auth: concurrency rules skipped */
		http_wait_take_slot(s, rq);
		rq->wait_until_us = rq->arrived_us + rq->dr.wait_ms * 1000;
		rq->lw.fn = http_lease_event;
		rq->tried_us = util_monotonic_us();
	} else if ((rc = http_auth_attrs(conn, rq->cfg, url, method,
			&rq->attrs)) < 0)
		return auth_attrs_error(s, conn, rq, rc);
	if (decide_prepare(s->decider, rq->cfg, &rq->dr, &rq->decision, &job) ==
	    0)
		return http_finish_decision(s, conn, rq);
	http_lease_queue_behind(s, rq, job);
	if ((rc = http_submit(rq, job, NULL, 0)) == 1)
		return http_answer_decision(s, conn, rq);
	if (rc < 0)
		return http_respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	return MHD_YES; /* suspended: queued behind, or submitted */
}

/* /readyz: a probe of the store, answered when it answers. */
enum MHD_Result
http_handle_ready(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	int rc;

	if (rq->state != RQ_ANSWERING) {
		memset(&rq->probe, 0, sizeof(rq->probe));
		if ((rc = http_submit(rq, NULL, &rq->probe, 1)) < 0)
			return http_respond(s, conn, 503, "text/plain",
			    "not ready\n", 10, NULL);
		if (rc == 0)
			return MHD_YES;
	}
	return rq->probe.rc == 0 ?
	    http_respond(s, conn, 200, "text/plain", "ready\n", 6, NULL) :
	    http_respond(s, conn, 503, "text/plain", "not ready\n", 10, NULL);
}

/* Append to buf (size n, holding *len) the names of sr's stats whose call
 * failed (failed true) or succeeded, ", " between them. */
static void
stat_names(const struct stats_request *sr, bool failed, char *buf, size_t n,
    size_t *len)
{
	bool first = true;
	size_t i;
	int w;

	for (i = 0; i < sr->n && *len < n; i++) {
		if ((sr->calls[i].rc != 0) != failed)
			continue;
		w = snprintf(buf + *len, n - *len, "%s%s", first ? "" : ", ",
		    sr->defs[i]->rule.name);
		*len = w < 0 ? n : *len + (size_t)w;
		first = false;
	}
}

/*
 * Every stat call is done: the answer, or a 503 naming the stats whose
 * store call failed.  Each call is its own: on /record the others did
 * record (docs/stats.md), so they are counted and named too.
 */
static enum MHD_Result
finish_stats(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	struct stats_request *sr = &rq->sr;
	enum backend_error_kind kind = BACKEND_ERR_PROTOCOL;
	enum MHD_Result ret;
	size_t i, len, failed = 0;
	char *text, msg[512];

	/* The body names the kind of failure, never the server's reply
	 * (docs/security.md); the store logs what it answered. */
	for (i = 0; i < sr->n; i++) {
		if (sr->calls[i].rc == 0) {
			if (sr->record)
				metrics_stat_record(s->metrics,
				    sr->defs[i]->rule.name);
			continue;
		}
		log_debug("stat %s: %s", sr->defs[i]->rule.name,
		    sr->calls[i].err);
		if (failed++ == 0)
			kind = sr->calls[i].kind;
	}
	if (failed > 0) {
		len = (size_t)snprintf(msg, sizeof(msg), "stat%s ",
		    failed > 1 ? "s" : "");
		stat_names(sr, true, msg, sizeof(msg), &len);
		if (len < sizeof(msg))
			len += (size_t)snprintf(msg + len, sizeof(msg) - len,
			    ": the %s store failed (%s)",
			    s->decider->backend->name,
			    backend_error_kind_name(kind));
		if (sr->record && failed < sr->n && len < sizeof(msg)) {
			len += (size_t)snprintf(msg + len, sizeof(msg) - len,
			    "; the value was recorded in ");
			stat_names(sr, false, msg, sizeof(msg), &len);
		}
		return http_respond_error(s, conn, 503, "backend_unavailable",
		    "%s", msg);
	}
	if ((text = stats_request_answer(sr, &len)) == NULL)
		return http_respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	ret = http_respond(s, conn, 200, JSON_TYPE, text, len, NULL);
	free(text);
	return ret;
}

/*
 * POST /record and POST /stats (docs/stats.md): every check first
 * (stats_request.c), then one store call per applying stat; the
 * connection waits for the last of them when the store does not answer
 * inline.
 */
enum MHD_Result
http_handle_stats(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	struct stats_request *sr = &rq->sr;
	struct request_error e;
	size_t i;
	int rc;

	if (rq->state == RQ_ANSWERING) /* resumed */
		return finish_stats(s, conn, rq);
	if (rq->too_large)
		return http_respond_error(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	if (stats_request_prepare(sr, rq->cfg, rq->body, rq->len,
		rq->ep == EP_RECORD, &e) < 0)
		return http_respond_error(s, conn, e.status, e.code, "%s",
		    e.message);
	if (sr->n == 0)
		return finish_stats(s, conn, rq);
	for (i = 0; i < sr->n; i++)
		sr->calls[i].start_us = rq->arrived_us;
	if ((rc = http_submit(rq, NULL, sr->calls, sr->n)) < 0)
		return http_respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	return rc == 0 ? MHD_YES : finish_stats(s, conn, rq);
}

static void
local_lease_done(struct backend_call *call)
{
	(void)call; /* read by local_lease() when submit returns */
}

/*
 * A lease a degraded answer handed out is held in the in-process store of
 * on_backend_error: local (docs/leases.md): release or renew rq's lease
 * there first, whatever the policy is now.  True when it was held there
 * (rq->lease_out then says so); false when it was not, or there is no
 * such store.  The memory store answers inside the call: in-process, a
 * look-up of a key that is usually not there.
 */
static bool
local_lease(struct http_server *s, struct request *rq)
{
	struct backend *local = s->decider->local;
	struct backend_call call;
	struct rl_result out;

	if (local == NULL || local == s->decider->backend ||
	    !local->completes_inline)
		return false;
	memset(&call, 0, sizeof(call));
	call.checks = &rq->lease_check;
	call.n = 1;
	call.out = &out;
	call.lease_op = rq->probe.lease_op;
	call.done = local_lease_done;
	backend_submit(local, &call);
	if (call.rc != 0 || !out.allowed)
		return false;
	rq->lease_out = out;
	return true;
}

/*
 * POST /release and POST /renew (docs/leases.md): {"lease": "..."} to one
 * store call on the lease's key, answered when the store answers; a lease
 * the local fallback store holds is answered from there (local_lease()).  A
 * lease whose rule is gone, or no longer concurrency, cannot be renewed
 * (it is still released: it may be held until it expires).
 */
enum MHD_Result
http_handle_lease(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	bool renew = rq->ep == EP_RENEW;
	struct request_error e;
	const struct rule *r;
	struct lease_ref ref;
	const char *what;
	json_t *root, *v;
	int64_t limit, window;
	size_t plen;
	int rc;

	if (rq->state == RQ_ANSWERING) /* resumed */
		goto answer;
	if (rq->too_large)
		return http_respond_error(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	/* An empty body is {}, with no lease; a name given twice is an
	 * error, as in every body, and so is a \u0000 (docs/http.md). */
	root = NULL;
	if (rq->len > 0 &&
	    (root = request_json_load(rq->body, rq->len, 0, &e)) == NULL)
		return http_respond_error(s, conn, e.status, e.code, "%s",
		    e.message);
	if (rq->len > 0 && !json_is_object(root)) {
		json_decref(root);
		return http_respond_error(s, conn, 400, "invalid_json",
		    "the body must be a JSON object");
	}
	/* Every way of not naming a lease is invalid_lease (docs/http.md);
	 * the message says which. */
	v = root != NULL ? json_object_get(root, "lease") : NULL;
	if (v == NULL || json_is_null(v))
		what = "\"lease\" is missing: send a lease /acquire answered";
	else if (!json_is_string(v))
		what = "\"lease\" must be a string: a lease /acquire answered";
	else if (lease_parse(json_string_value(v), json_string_length(v),
		     &ref) < 0)
		what = "\"lease\" is not a lease this service handed out";
	else
		what = NULL;
	json_decref(root);
	if (what != NULL)
		return http_respond_error(s, conn, 400, "invalid_lease", "%s",
		    what);
	r = config_find_rule(rq->cfg, ref.rule);
	if (r != NULL && r->algorithm != RL_ALG_CONCURRENCY)
		r = NULL;
	if (renew && r == NULL)
		return http_respond(s, conn, 200, JSON_TYPE,
		    "{\"renewed\":false}", 17, NULL);
	plen = strlen(rq->cfg->redis.key_prefix);
	if ((rq->lease_key = rl_malloc(LEASE_KEY_CAP(plen))) == NULL)
		return http_respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	lease_check_make(&rq->lease_check, rq->lease_key,
	    rq->cfg->redis.key_prefix, &ref, r != NULL ? r->limit : ref.cost,
	    r != NULL ? r->window_ms : 1);
	/* The key's override, as every decision on it (docs/admin.md): a
	 * renewal lasts the override's window. */
	if (r != NULL) {
		limit = rq->lease_check.limit;
		window = rq->lease_check.window_ms;
		if (overrides_get(s->decider->overrides, rq->lease_key,
			rq->lease_check.keylen, 0, &limit, &window))
			lease_check_make(&rq->lease_check, rq->lease_key,
			    rq->cfg->redis.key_prefix, &ref, limit, window);
	}
	memset(&rq->probe, 0, sizeof(rq->probe));
	rq->probe.checks = &rq->lease_check;
	rq->probe.n = 1;
	rq->probe.out = &rq->lease_out;
	rq->probe.lease_op = renew ? BACKEND_LEASE_RENEW :
				     BACKEND_LEASE_RELEASE;
	rq->probe.start_us = rq->arrived_us;
	if (local_lease(s, rq))
		goto answer; /* probe.rc is 0 */
	if ((rc = http_submit(rq, NULL, &rq->probe, 1)) < 0)
		return http_respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	if (rc == 0)
		return MHD_YES;
answer:
	if (rq->probe.rc != 0)
		return http_respond_error(s, conn, 503, "backend_unavailable",
		    "the %s store failed (%s)", s->decider->backend->name,
		    backend_error_kind_name(rq->probe.kind));
	if (!renew && rq->lease_out.allowed) /* its waiters may go on */
		lease_wait_released(s->leases,
		    lease_key_hash(rq->lease_check.key,
			rq->lease_check.keylen));
	if (!renew)
		return rq->lease_out.allowed ?
		    http_respond(s, conn, 200, JSON_TYPE, "{\"released\":true}",
			17, NULL) :
		    http_respond(s, conn, 200, JSON_TYPE,
			"{\"released\":false}", 18, NULL);
	{
		/* Counted from when the call left, as an /acquire's lease
		 * (docs/leases.md): a late reply shortens it, and one with
		 * less than 1 ms left is no renewal the client can rely on.
		 * A store that stamps no send answered inside the submit,
		 * just now: the whole window. */
		int64_t left = rq->lease_out.reset_ms * 1000;
		char body[80];
		int n;

		if (rq->probe.sent_us > 0)
			left += rq->probe.sent_us - util_monotonic_us();
		if (!rq->lease_out.allowed || left < 1000)
			return http_respond(s, conn, 200, JSON_TYPE,
			    "{\"renewed\":false}", 17, NULL);
		n = snprintf(body, sizeof(body),
		    "{\"renewed\":true,"
		    "\"expires_ms\":%lld}",
		    (long long)util_ceil_div(left, 1000));

		return http_respond(s, conn, 200, JSON_TYPE, body, (size_t)n,
		    NULL);
	}
}

/* A report's answer (docs/http.md): what each rule it recorded in has
 * left, and how far past its limit. */
static enum MHD_Result
finish_report(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	const struct decision *d = &rq->decision;
	enum metrics_report what = METRICS_REPORT_WITHIN;
	enum MHD_Result ret;
	json_t *root, *rules, *o;
	char *text;
	size_t i;

	if (d->status != DECIDE_OK) {
		if (d->status == DECIDE_BACKEND_UNAVAILABLE)
			metrics_report(s->metrics, METRICS_REPORT_UNRECORDED);
		return http_respond_error(s, conn,
		    d->status == DECIDE_BACKEND_UNAVAILABLE ? 503 :
			d->status == DECIDE_INTERNAL	    ? 500 :
							      400,
		    decide_status_code(d->status), "%s", d->message);
	}
	root = json_object();
	rules = json_array();
	if (root == NULL || rules == NULL)
		goto oom;
	for (i = 0; i < d->nreported; i++) {
		const struct decide_reported *r = &d->reported[i];

		if ((o = json_pack("{s:s, s:I, s:I}", "rule", r->rule->name,
			 "limit", (json_int_t)r->limit, "remaining",
			 (json_int_t)r->remaining)) == NULL ||
		    (r->overdrawn > 0 &&
			json_object_set_new(o, "overdrawn",
			    json_integer(r->overdrawn)) != 0) ||
		    json_array_append_new(rules, o) != 0)
			goto oom;
		if (r->overdrawn > 0)
			what = METRICS_REPORT_OVERDRAWN;
	}
	/* Policy allow: nothing was recorded (no rows). */
	if (d->degraded && d->nreported == 0)
		what = METRICS_REPORT_UNRECORDED;
	if (d->nreported > 0 || what == METRICS_REPORT_UNRECORDED)
		metrics_report(s->metrics, what);
	if (json_object_set_new(root, "recorded",
		json_boolean(d->nreported > 0)) != 0 ||
	    json_object_set(root, "rules", rules) != 0 ||
	    (d->degraded &&
		json_object_set_new(root, "degraded", json_true()) != 0))
		goto oom;
	json_decref(rules);
	rules = NULL;
	text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (text == NULL)
		goto oom_text;
	ret = http_respond(s, conn, 200, JSON_TYPE, text, strlen(text), NULL);
	free(text);
	return ret;
oom:
	json_decref(rules);
	json_decref(root);
oom_text:
	return http_respond_error(s, conn, 500, "internal_error",
	    "out of memory");
}

/*
 * POST /report (docs/http.md): the /acquire body; the cost is recorded in
 * every applying rule that is neither shadow nor concurrency, even past
 * its limit, and the answer is never a denial.
 */
enum MHD_Result
http_handle_report(struct http_server *s, struct MHD_Connection *conn,
    struct request *rq)
{
	struct http_acquire acq;
	struct request_error e;
	struct decide_job *job;
	int rc;

	if (rq->state == RQ_ANSWERING) /* resumed */
		return finish_report(s, conn, rq);
	if (rq->too_large)
		return http_respond_error(s, conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)rq->cfg->max_body_bytes);
	if (http_report_parse(rq->cfg, rq->body, rq->len, &rq->attrs, &acq,
		&e) < 0)
		return http_respond_error(s, conn, e.status, e.code, "%s",
		    e.message);
	rq->rule = acq.rule;
	rq->dr.attrs = &rq->attrs;
	rq->dr.rule = rq->rule;
	rq->dr.cost = acq.cost;
	rq->dr.start_us = rq->arrived_us;
	rq->dr.report = true;
	if (decide_prepare(s->decider, rq->cfg, &rq->dr, &rq->decision, &job) ==
	    0)
		return finish_report(s, conn, rq);
	if ((rc = http_submit(rq, job, NULL, 0)) < 0)
		return http_respond_error(s, conn, 503, "shutting_down",
		    "the server is shutting down");
	return rc == 0 ? MHD_YES : finish_report(s, conn, rq);
}

enum MHD_Result
http_handle_simple(struct http_server *s, struct MHD_Connection *conn,
    const char *url)
{
	char *text = NULL, *guard = NULL, *all, stack[1024];
	size_t len, glen;
	enum MHD_Result ret;

	if (strcmp(url, "/healthz") == 0)
		return http_respond(s, conn, 200, "text/plain", "ok\n", 3,
		    NULL);
	/* /metrics: the shared families, then the connection guard's.
	 * Units held in advance whose hold ended count as lost by now
	 * (docs/operations.md), not only at their key's next use. */
	prefetch_sweep(s->decider->prefetch, util_monotonic_us());
	if (metrics_render(s->metrics, &text, &len) < 0 ||
	    (guard = http_fmt_buf(stack, sizeof(stack), &glen,
		 "# HELP ratelimitd_http_connections_open Client connections open "
		 "now.\n# TYPE ratelimitd_http_connections_open gauge\n"
		 "ratelimitd_http_connections_open %lld\n"
		 "# HELP ratelimitd_http_connections_refused_total Connections "
		 "closed at once: max_connections were open.\n"
		 "# TYPE ratelimitd_http_connections_refused_total counter\n"
		 "ratelimitd_http_connections_refused_total %llu\n"
		 "# HELP ratelimitd_http_requests_cut_total Requests cut off past "
		 "request_timeout.\n"
		 "# TYPE ratelimitd_http_requests_cut_total counter\n"
		 "ratelimitd_http_requests_cut_total %llu\n",
		 (long long)http_guard_open(s->guard),
		 (unsigned long long)http_guard_refused(s->guard),
		 (unsigned long long)http_guard_cut(s->guard))) == NULL ||
	    (all = rl_realloc(text, len + glen + 1)) == NULL) {
		if (guard != NULL)
			http_fmt_free(guard, stack);
		rl_free(text);
		return http_respond_error(s, conn, 500, "internal_error",
		    "out of memory");
	}
	memcpy(all + len, guard, glen + 1);
	http_fmt_free(guard, stack);
	ret = http_respond(s, conn, 200,
	    "text/plain; version=0.0.4; charset=utf-8", all, len + glen, NULL);
	rl_free(all);
	return ret;
}

/* Which endpoint a request is for; errors are answered after the body. */
enum endpoint
http_route(const char *url, const char *method)
{
	bool is_get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

	if (strcmp(url, "/acquire") == 0)
		return strcmp(method, "POST") == 0 ? EP_ACQUIRE : EP_BAD_METHOD;
	if (strcmp(url, "/report") == 0)
		return strcmp(method, "POST") == 0 ? EP_REPORT : EP_BAD_METHOD;
	if (strcmp(url, "/record") == 0)
		return strcmp(method, "POST") == 0 ? EP_RECORD : EP_BAD_METHOD;
	if (strcmp(url, "/stats") == 0)
		return strcmp(method, "POST") == 0 ? EP_STATS : EP_BAD_METHOD;
	if (strcmp(url, "/release") == 0)
		return strcmp(method, "POST") == 0 ? EP_RELEASE : EP_BAD_METHOD;
	if (strcmp(url, "/renew") == 0)
		return strcmp(method, "POST") == 0 ? EP_RENEW : EP_BAD_METHOD;
	if (strcmp(url, "/auth") == 0 || strncmp(url, "/auth/", 6) == 0)
		return EP_AUTH;
	if (strcmp(url, "/readyz") == 0)
		return is_get ? EP_READY : EP_BAD_METHOD;
	if (strcmp(url, "/healthz") == 0 || strcmp(url, "/metrics") == 0)
		return is_get ? EP_SIMPLE : EP_BAD_METHOD;
	return EP_NOT_FOUND;
}
