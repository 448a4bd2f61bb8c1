/*
 * check_grpc.c - Envoy's rate limit service over gRPC (docs/grpc.md)
 * against the real daemon, called by a real gRPC client: python3-grpcio
 * with stubs generated from proto/ at run time (tests/grpc/rls_client.py),
 * and nghttp for frames no gRPC library would send.  On the memory store
 * and on a real redis-server.
 */
#include <check.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "h2raw.h"
#include "harness.h"
#include "ops.h"

#define RLS_PATH \
	"/envoy.service.ratelimit.v3.RateLimitService/" \
	"ShouldRateLimit"

static int grpc_port;

/* Start a daemon with grpc_listen on a free port; `more` goes before the
 * rules (backend, policy), `rules` after "rules:". */
static void
start(struct h_daemon *d, const char *more, const char *rules)
{
	char yaml[4096];

	grpc_port = h_free_port();
	snprintf(yaml, sizeof(yaml),
	    "listen: \"127.0.0.1:%%PORT%%\"\n"
	    "grpc_listen: \"127.0.0.1:%d\"\n"
	    "threads: 2\n"
	    "shutdown_timeout: 2s\n"
	    "%s"
	    "rules:\n%s",
	    grpc_port, more, rules);
	h_daemon_start(d, yaml);
}

/* Run the client with args (already shell-quoted); its JSON line. */
static json_t *
client(const char *fmt, ...)
{
	char args[2048], cmd[3072], line[16384];
	const char *src = getenv("RATELIMITD_SRCDIR");
	json_error_t jerr;
	json_t *j;
	va_list ap;
	FILE *p;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd),
	    "/usr/bin/python3 %s/tests/grpc/rls_client.py"
	    " 127.0.0.1:%d %s/proto %s",
	    src != NULL ? src : ".", grpc_port, src != NULL ? src : ".", args);
	ck_assert_ptr_nonnull(p = popen(cmd, "r"));
	line[0] = '\0';
	if (fgets(line, sizeof(line), p) == NULL)
		line[0] = '\0';
	ck_assert_int_eq(pclose(p), 0);
	j = json_loads(line, 0, &jerr);
	ck_assert_msg(j != NULL, "%s: not JSON: %s", cmd, line);
	return j;
}

/* One ShouldRateLimit call: spec is the client's JSON. */
static json_t *
call(const char *spec)
{
	return client("call '%s'", spec);
}

static const char *
str(json_t *j, const char *field)
{
	const char *s = json_string_value(json_object_get(j, field));

	ck_assert_msg(s != NULL, "no %s in %s", field, json_dumps(j, 0));
	return s;
}

/* statuses[i].field as a string or an integer (-1 when absent). */
static json_t *
status(json_t *j, size_t i)
{
	json_t *s = json_array_get(json_object_get(j, "statuses"), i);

	ck_assert_ptr_nonnull(s);
	return s;
}

static long long
status_int(json_t *j, size_t i, const char *field)
{
	json_t *v = json_object_get(status(j, i), field);

	return v == NULL ? -1 : json_integer_value(v);
}

static const char *
header(json_t *j, const char *name)
{
	return json_string_value(json_object_get(json_object_get(j, "headers"),
	    name));
}

/* One ShouldRateLimit call for domain "edge", [user=user], with
 * grpc-timeout timeout, on a connection of its own (h2raw, so that no
 * client deadline races the daemon's): its grpc-status into code, ""
 * when none came within ms. */
static void
raw_call(const char *timeout, const char *user, int ms, char *code,
    size_t codelen)
{
	struct h2raw c;
	struct h2raw_frame f = { 0 };
	uint8_t buf[1024];
	size_t len = 0;
	long long t0 = h_now_ms();

	code[0] = '\0';
	h2raw_connect(&c, grpc_port, NULL, 0);
	h2raw_call_headers_timeout(buf, &len, 1, H2RAW_RLS_PATH, timeout,
	    false);
	h2raw_call_data(buf, &len, 1, "edge", "user", user);
	ck_assert_uint_eq(h2raw_send(&c, buf, len, 1000), len);
	while (code[0] == '\0' && h_now_ms() - t0 < ms &&
	    h2raw_read(&c, &f, 100) >= 0)
		if (f.payload != NULL && f.stream == 1 && f.type == H2_HEADERS)
			(void)h2raw_header(&f, "grpc-status", code, codelen);
	h2raw_close(&c);
}

static const char rules_edge[] =
    "  - name: per-user\n"
    "    match: { domain: \"edge\" }\n"
    "    key: \"${user}\"\n"
    "    limit: 3\n"
    "    window: 1m\n"
    "  - name: per-route\n"
    "    match: { domain: \"edge\" }\n"
    "    key: \"${route}\"\n"
    "    limit: 100\n"
    "    window: 1h\n";

/*
 * Allowed, then over the limit: each descriptor's status from its own
 * rule, the RateLimit headers, Retry-After when over; an HTTP /acquire of
 * the same attributes counts against the same key (one decision path);
 * the decisions counted with protocol="grpc".
 */
START_TEST(test_allowed_then_over_limit)
{
	const char *spec =
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"user\", \"bob\"]], [[\"route\", \"/a\"]]]}";
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	json_t *j, *lim;

	start(&d, "backend: memory\n", rules_edge);
	j = call(spec);
	ck_assert_str_eq(str(j, "code"), "OK");
	ck_assert_str_eq(str(j, "overall"), "OK");
	ck_assert_uint_eq(json_array_size(json_object_get(j, "statuses")), 2);
	ck_assert_str_eq(str(status(j, 0), "code"), "OK");
	lim = json_object_get(status(j, 0), "limit");
	ck_assert_str_eq(json_string_value(json_object_get(lim, "name")),
	    "per-user");
	ck_assert_int_eq(json_integer_value(json_object_get(lim, "per_unit")),
	    3);
	ck_assert_str_eq(json_string_value(json_object_get(lim, "unit")),
	    "MINUTE");
	ck_assert_int_eq(status_int(j, 0, "remaining"), 2);
	ck_assert_int_eq(status_int(j, 1, "remaining"), 99);
	ck_assert(status_int(j, 1, "reset_ms") > 3500000);
	ck_assert_str_eq(header(j, "X-RateLimit-Remaining"), "2");
	ck_assert_ptr_null(header(j, "Retry-After"));
	json_decref(j);

	/* The same key through HTTP. */
	h_http(&r, "POST", "/acquire",
	    "{\"domain\": \"edge\", \"user\": \"bob\"}", NULL);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(h_json_int(&r, "remaining"), 1);
	h_resp_free(&r);

	j = call(spec);
	ck_assert_str_eq(str(j, "overall"), "OK");
	ck_assert_int_eq(status_int(j, 0, "remaining"), 0);
	json_decref(j);
	j = call(spec);
	ck_assert_str_eq(str(j, "code"), "OK");
	ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 0), "code"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 1), "code"), "OK");
	/* Nothing recorded for the route: still 98 left after two. */
	ck_assert_int_eq(status_int(j, 1, "remaining"), 98);
	ck_assert_ptr_nonnull(header(j, "Retry-After"));
	ck_assert(atoi(header(j, "Retry-After")) >= 1);
	json_decref(j);

	/* A descriptor no rule applies to: OK without a limit. */
	j = call(
	    "{\"domain\": \"other\", \"descriptors\": "
	    "[[[\"user\", \"bob\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	ck_assert_ptr_null(json_object_get(status(j, 0), "limit"));
	json_decref(j);

	ck_assert_int_eq(
	    h_metric("ratelimitd_decisions_total{rule=\"per-user\","
		     "result=\"allowed\",protocol=\"grpc\"}"),
	    2);
	ck_assert_int_eq(
	    h_metric("ratelimitd_decisions_total{rule=\"per-user\","
		     "result=\"allowed\",protocol=\"http\"}"),
	    1);
	ck_assert_int_eq(
	    h_metric("ratelimitd_decisions_total{rule=\"per-user\","
		     "result=\"denied\",protocol=\"grpc\"}"),
	    1);
	ck_assert_int_eq(h_metric("ratelimitd_grpc_responses_total"
				  "{code=\"OK\"}"),
	    4);
	h_daemon_stop(&d);
}
END_TEST

/* docs/grpc.md's example: per-client and per-user, domain "edge". */
static const char rules_docs[] =
    "  - name: per-client\n"
    "    match: { domain: \"edge\" }\n"
    "    key: \"${remote_address}\"\n"
    "    limit: 600\n"
    "    window: 1m\n"
    "  - name: per-user\n"
    "    match: { domain: \"edge\" }\n"
    "    key: \"${user}\"\n"
    "    limit: 50\n"
    "    window: 1s\n"
    "    algorithm: token_bucket\n";

/*
 * A descriptor whose key would pass 512 bytes fails closed: the call is
 * OVER_LIMIT, that descriptor OVER_LIMIT, the others OK without a limit,
 * and nothing is recorded for the per-client rule (docs/grpc.md).
 * Before, the call was INVALID_ARGUMENT, which Envoy with
 * failure_mode_deny false lets through: a long x-user header escaped
 * every limit of the request, the per-IP one too.
 */
START_TEST(test_key_too_long_fails_closed)
{
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	char spec[1024], user[601];
	json_t *j;

	memset(user, 'u', 600);
	user[600] = '\0';
	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 500ms\n",
	    rules_docs);
	snprintf(spec, sizeof(spec),
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"remote_address\", \"10.0.0.1\"]], [[\"user\", \"%s\"]]]}",
	    user);
	j = call(spec);
	ck_assert_str_eq(str(j, "code"), "OK");
	ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 0), "code"), "OK");
	ck_assert_ptr_null(json_object_get(status(j, 0), "limit"));
	ck_assert_str_eq(str(status(j, 1), "code"), "OVER_LIMIT");
	json_decref(j);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:per-client:{10.0.0.1}"), 0);

	/* The same client with a short user is decided and counted. */
	j = call(
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"remote_address\", \"10.0.0.1\"]], "
	    "[[\"user\", \"ann\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	ck_assert_int_eq(status_int(j, 0, "remaining"), 599);
	json_decref(j);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:per-client:{10.0.0.1}"), 1);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/*
 * A hits_addend over a rule's limit marks only the descriptors whose rule
 * it exceeds (with a key two descriptors share, their costs together):
 * a descriptor no rule applies to, or whose rule the cost fits, is OK
 * without current_limit, and nothing is recorded (docs/grpc.md).
 * Before, every descriptor was OVER_LIMIT.
 */
START_TEST(test_cost_over_limit_marks_its_descriptors)
{
	struct h_daemon d = { 0 };
	json_t *j;

	start(&d, "backend: memory\n", rules_edge);
	j = call(
	    "{\"domain\": \"edge\", \"hits_addend\": 5, "
	    "\"descriptors\": [[[\"route\", \"/r\"]], "
	    "[[\"user\", \"bo\"]], [[\"other\", \"x\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 0), "code"), "OK");
	ck_assert_str_eq(str(status(j, 1), "code"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 2), "code"), "OK");
	ck_assert_ptr_null(json_object_get(status(j, 0), "limit"));
	ck_assert_ptr_null(json_object_get(status(j, 2), "limit"));
	json_decref(j);

	/* 2 + 2 on one key past 3: both descriptors of that key. */
	j = call(
	    "{\"domain\": \"edge\", \"hits_addend\": 2, "
	    "\"descriptors\": [[[\"user\", \"bo\"]], "
	    "[[\"user\", \"bo\"]], [[\"route\", \"/r\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 0), "code"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 1), "code"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 2), "code"), "OK");
	json_decref(j);

	/* Nothing was recorded for the route. */
	j = call(
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"route\", \"/r\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	ck_assert_int_eq(status_int(j, 0, "remaining"), 99);
	json_decref(j);
	h_daemon_stop(&d);
}
END_TEST

/*
 * On Redis: several descriptors with one over its limit consume nothing
 * (the keys in Redis unchanged), hits_addend is the cost, 0 means one hit,
 * a descriptor's own hits_addend wins (0: a look without a hit), and a
 * cost past the limit is over the limit.
 */
START_TEST(test_all_or_nothing_and_hits_addend_on_redis)
{
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	json_t *j;

	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 500ms\n",
	    rules_edge);
	j = call(
	    "{\"domain\": \"edge\", \"hits_addend\": 3, \"descriptors\": "
	    "[[[\"user\", \"ann\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	ck_assert_int_eq(status_int(j, 0, "remaining"), 0);
	json_decref(j);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:per-user:{ann}"), 3);

	/* ann is full: the route is not charged either. */
	j = call(
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"route\", \"/r\"]], [[\"user\", \"ann\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
	ck_assert_str_eq(str(status(j, 0), "code"), "OK");
	ck_assert_str_eq(str(status(j, 1), "code"), "OVER_LIMIT");
	json_decref(j);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:per-route:{/r}"), 0);

	/* hits_addend 0 is one hit; a descriptor's own 0 records nothing. */
	j = call(
	    "{\"domain\": \"edge\", \"hits_addend\": 0, \"descriptors\": "
	    "[[[\"route\", \"/r\"]], [[\"user\", \"cy\"]]], "
	    "\"descriptor_hits\": [null, 0]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	ck_assert_int_eq(status_int(j, 0, "remaining"), 99);
	ck_assert_int_eq(status_int(j, 1, "remaining"), 3);
	json_decref(j);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:per-route:{/r}"), 1);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:per-user:{cy}"), 0);

	/* More than the limit in one call can never fit. */
	j = call(
	    "{\"domain\": \"edge\", \"hits_addend\": 4, \"descriptors\": "
	    "[[[\"user\", \"dee\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
	json_decref(j);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:per-user:{dee}"), 0);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/* Many calls at once on one HTTP/2 connection, one key: exactly the
 * limit admitted, every call answered. */
START_TEST(test_concurrent_streams_exact)
{
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	json_t *j;

	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 2s\n",
	    "  - name: shared\n"
	    "    key: \"${k}\"\n"
	    "    limit: 25\n"
	    "    window: 1m\n");
	j = client(
	    "concurrent 60 '{\"domain\": \"x\", \"descriptors\": "
	    "[[[\"k\", \"one\"]]]}'");
	ck_assert_int_eq(json_integer_value(json_object_get(j, "OK")), 25);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "OVER_LIMIT")),
	    35);
	ck_assert_uint_eq(json_object_size(j), 2);
	json_decref(j);
	ck_assert_int_eq(h_redis_log_units(&rs, "rl:shared:{one}"), 25);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/* Run nghttp with one request body (bytes) to path; its output. */
static char *
nghttp(const char *path, const char *ctype, const unsigned char *body,
    size_t len)
{
	char file[512], cmd[1024], *out;
	size_t n = 0;
	FILE *f, *p;

	snprintf(file, sizeof(file), "%s/nghttp.body", h_tmpdir());
	ck_assert_ptr_nonnull(f = fopen(file, "wb"));
	ck_assert_uint_eq(fwrite(body, 1, len, f), len);
	fclose(f);
	snprintf(cmd, sizeof(cmd),
	    "nghttp -v -H 'content-type: %s' -d %s "
	    "http://127.0.0.1:%d%s 2>&1",
	    ctype, file, grpc_port, path);
	ck_assert_ptr_nonnull(p = popen(cmd, "r"));
	out = calloc(1, 65536);
	n = fread(out, 1, 65535, p);
	out[n] = '\0';
	pclose(p);
	while (n-- > 0) /* the body is printed raw */
		if (out[n] == '\0')
			out[n] = '.';
	return out;
}

/*
 * Health, and what is not a good call: an unknown method or service, a
 * message that is not protobuf, broken gRPC framing, a compressed message,
 * a non-gRPC content-type.  Each is a gRPC status; the daemon goes on.
 */
START_TEST(test_health_and_bad_calls)
{
	static const unsigned char short_len[] = { 0, 0, 0, 0, 9, 0x0a, 1 };
	static const unsigned char compressed[] = { 1, 0, 0, 0, 0 };
	static const unsigned char empty[] = { 0, 0, 0, 0, 0 };
	struct h_daemon d = { 0 };
	char *out;
	json_t *j;

	start(&d, "backend: memory\n", rules_edge);
	j = client("health");
	ck_assert_str_eq(str(j, "status"), "SERVING");
	json_decref(j);
	j = client("health envoy.service.ratelimit.v3.RateLimitService");
	ck_assert_str_eq(str(j, "status"), "SERVING");
	json_decref(j);
	j = client("health no.such.Service");
	ck_assert_str_eq(str(j, "code"), "NOT_FOUND");
	json_decref(j);
	j = client("method /envoy.service.ratelimit.v3.RateLimitService/Nope");
	ck_assert_str_eq(str(j, "code"), "UNIMPLEMENTED");
	json_decref(j);
	j = client("raw ffffffff0f");
	ck_assert_str_eq(str(j, "code"), "INVALID_ARGUMENT");
	json_decref(j);

	out = nghttp(RLS_PATH, "application/grpc", short_len,
	    sizeof(short_len));
	ck_assert_msg(strstr(out, "grpc-status: 13") != NULL, "%s", out);
	free(out);
	out = nghttp(RLS_PATH, "application/grpc", compressed,
	    sizeof(compressed));
	ck_assert_msg(strstr(out, "grpc-status: 12") != NULL, "%s", out);
	free(out);
	out = nghttp(RLS_PATH, "application/json", empty, sizeof(empty));
	ck_assert_msg(strstr(out, "grpc-status: 13") != NULL, "%s", out);
	free(out);
	/* An empty message is a request without descriptors: OK. */
	out = nghttp(RLS_PATH, "application/grpc", empty, sizeof(empty));
	ck_assert_msg(strstr(out, "grpc-status: 0") != NULL, "%s", out);
	free(out);

	j = call(
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"user\", \"eve\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	json_decref(j);
	ck_assert_int_eq(h_metric("ratelimitd_grpc_responses_total"
				  "{code=\"UNIMPLEMENTED\"}"),
	    2);
	h_daemon_stop(&d);
}
END_TEST

/* Redis down, under each on_backend_error: allow answers OK, deny answers
 * UNAVAILABLE (so Envoy's failure_mode_deny decides), local decides in
 * process; health is NOT_SERVING. */
START_TEST(test_backend_down_policies)
{
	static const char *const policy[] = { "allow", "deny", "local" };
	const char *spec =
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"user\", \"fay\"]]]}";
	char more[512];
	struct h_daemon d = { 0 };
	size_t i;
	int dead = h_free_port(), k;
	json_t *j;

	for (i = 0; i < 3; i++) {
		snprintf(more, sizeof(more),
		    "backend: redis\nredis:\n"
		    "  url: \"redis://127.0.0.1:%d/0\"\n"
		    "  timeout: 100ms\n"
		    "on_backend_error: %s\n",
		    dead, policy[i]);
		start(&d, more, rules_edge);
		j = call(spec);
		if (i == 0) {
			ck_assert_str_eq(str(j, "code"), "OK");
			ck_assert_str_eq(str(j, "overall"), "OK");
		} else if (i == 1) {
			ck_assert_str_eq(str(j, "code"), "UNAVAILABLE");
		} else {
			json_decref(j);
			for (k = 0; k < 3; k++)
				json_decref(call(spec));
			j = call(spec);
			ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
		}
		json_decref(j);
		j = client("health");
		ck_assert_str_eq(str(j, "status"), "NOT_SERVING");
		json_decref(j);
		h_daemon_stop(&d);
	}
}
END_TEST

/*
 * grpc-timeout bounds the store call: with Redis stopped (SIGSTOP) and
 * redis.timeout 3s, a call with a 300 ms deadline gives up on Redis by
 * then, not at redis.timeout: it is answered DEADLINE_EXCEEDED well
 * before 3 s, and Redis is not blamed (no backend error is counted).
 */
START_TEST(test_grpc_timeout_bounds_the_store)
{
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	char code[16];
	long long t0;

	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 3s\n"
	    "on_backend_error: deny\n",
	    rules_edge);
	/* Connected first, so only the deadline is left to stop it. */
	json_decref(
	    call("{\"domain\": \"edge\", \"descriptors\": "
		 "[[[\"user\", \"hal\"]]]}"));
	kill(rs.pid, SIGSTOP);
	t0 = h_now_ms();
	raw_call("300m", "hal", 5000, code, sizeof(code));
	ck_assert_str_eq(code, "4");
	ck_assert_msg(h_now_ms() - t0 < 2500, "the store call took %lld ms",
	    h_now_ms() - t0);
	ck_assert(ops_metric("ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"timeout\"}") <= 0);
	kill(rs.pid, SIGCONT);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/*
 * The first calls of a daemon on Redis, with no HTTP request at all (a
 * daemon behind Envoy only): the event loop that took over the store's
 * I/O serves them at once, never leaving them queued until some HTTP
 * request comes.  The daemon is started by hand here (the harness asks
 * /healthz, which runs the loop), and is ready when its gRPC port is.
 */
START_TEST(test_first_calls_without_http)
{
	struct h_redis rs = { 0 };
	char conf[H_PATH_MAX], logp[H_PATH_MAX];
	const char *bin = getenv("RATELIMITD_BIN");
	struct sockaddr_in sa;
	int status, fd, i, up = 0;
	json_t *j;
	FILE *f;
	pid_t pid;

	h_redis_start(&rs);
	grpc_port = h_free_port();
	snprintf(conf, sizeof(conf), "%s/first.yaml", h_tmpdir());
	snprintf(logp, sizeof(logp), "%s/first.log", h_tmpdir());
	ck_assert_ptr_nonnull(f = fopen(conf, "w"));
	fprintf(f,
	    "listen: \"127.0.0.1:%d\"\n"
	    "grpc_listen: \"127.0.0.1:%d\"\n"
	    "threads: 2\n"
	    "backend: redis\n"
	    "redis:\n"
	    "  url: \"redis://127.0.0.1:%d/0\"\n"
	    "  timeout: 2s\n"
	    "on_backend_error: deny\n"
	    "rules:\n%s",
	    h_free_port(), grpc_port, rs.port, rules_edge);
	fclose(f);
	ck_assert_ptr_nonnull(bin);
	ck_assert((pid = fork()) >= 0);
	if (pid == 0) {
		if ((fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >=
		    0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(bin, bin, "-c", conf, (char *)NULL);
		_exit(127);
	}
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)grpc_port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (i = 0; i < 100 && !up; i++) {
		h_sleep_ms(50);
		fd = socket(AF_INET, SOCK_STREAM, 0);
		up = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
	}
	h_sleep_ms(500); /* the store's start is over */
	j = up ? call(
		     "{\"domain\": \"edge\", \"timeout\": 1.5, "
		     "\"descriptors\": [[[\"user\", \"first\"]]]}") :
		 NULL;
	kill(pid, SIGTERM);
	ck_assert(waitpid(pid, &status, 0) == pid);
	if (!up || strcmp(str(j, "code"), "OK") != 0)
		h_print_file("ratelimitd log", logp);
	ck_assert_msg(up, "the gRPC port never opened");
	ck_assert_msg(strcmp(str(j, "code"), "OK") == 0, "the first call: %s",
	    json_dumps(j, 0));
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "the daemon's exit status %d", status);
	json_decref(j);
	h_redis_stop(&rs);
}
END_TEST

/*
 * The same while the call is held back (Redis stopped, its window of
 * script calls filled by HELD_FILL /acquire of redis.timeout 3 s, each
 * its own call): held behind calls of a later deadline, it still gives up
 * by its own (docs/grpc.md), not when those time out.
 */
#define HELD_FILL 10

START_TEST(test_grpc_timeout_while_held)
{
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	struct ops_call fill[HELD_FILL];
	CURL *c[HELD_FILL];
	char code[16];
	long long t0;
	int i;

	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 3s\n"
	    "  pool_size: 1\n"
	    "on_backend_error: deny\n",
	    rules_edge);
	json_decref(
	    call("{\"domain\": \"edge\", \"descriptors\": "
		 "[[[\"user\", \"held\"]]]}"));
	kill(rs.pid, SIGSTOP);
	for (i = 0; i < HELD_FILL; i++) {
		c[i] = h_curl_new();
		ops_call_start(&fill[i], c[i], "POST", "/acquire",
		    "{\"domain\":\"edge\",\"user\":\"held\"}");
		h_sleep_ms(30); /* a call of its own */
	}
	t0 = h_now_ms();
	raw_call("300m", "held", 5000, code, sizeof(code));
	ck_assert_str_eq(code, "4");
	ck_assert_msg(h_now_ms() - t0 < 1500,
	    "the held call gave up after %lld ms", h_now_ms() - t0);
	kill(rs.pid, SIGCONT);
	for (i = 0; i < HELD_FILL; i++) {
		ops_call_finish(&fill[i]);
		h_resp_free(&fill[i].r);
		curl_easy_cleanup(c[i]);
	}
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/*
 * SIGTERM with calls in flight (Redis stopped, so they wait for
 * redis.timeout): the daemon stops taking calls, answers those it has
 * (the policy, allow) and exits 0.
 */
START_TEST(test_sigterm_answers_calls_in_flight)
{
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	char cmd[1024], line[1024];
	const char *src = getenv("RATELIMITD_SRCDIR");
	json_t *j;
	FILE *p;

	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 2s\n",
	    rules_edge);
	json_decref(
	    call("{\"domain\": \"edge\", \"descriptors\": "
		 "[[[\"user\", \"ida\"]]]}"));
	kill(rs.pid, SIGSTOP);
	snprintf(cmd, sizeof(cmd),
	    "/usr/bin/python3 %s/tests/grpc/rls_client.py"
	    " 127.0.0.1:%d %s/proto concurrent 5 '{\"domain\": \"edge\", "
	    "\"descriptors\": [[[\"user\", \"ida\"]]]}'",
	    src != NULL ? src : ".", grpc_port, src != NULL ? src : ".");
	ck_assert_ptr_nonnull(p = popen(cmd, "r"));
	/* The calls are sent once the client has started (~0.5 s). */
	ck_assert(ops_wait_metric("ratelimitd_redis_pool_in_use", 1, 5000) >=
	    1);
	h_sleep_ms(300);   /* all five in */
	h_daemon_stop(&d); /* SIGTERM; asserts exit status 0 */
	line[0] = '\0';
	if (fgets(line, sizeof(line), p) == NULL)
		line[0] = '\0';
	ck_assert_int_eq(pclose(p), 0);
	ck_assert_ptr_nonnull(j = json_loads(line, 0, NULL));
	ck_assert_int_eq(json_integer_value(json_object_get(j, "OK")), 5);
	json_decref(j);
	kill(rs.pid, SIGCONT);
	h_redis_stop(&rs);
}
END_TEST

/*
 * A client that sends its request headers and never the rest: the stream
 * is answered and reset at request_timeout, the connection closed once
 * idle for idle_timeout (before: both held for ever), and others are
 * served meanwhile.
 */
START_TEST(test_unfinished_request_is_cut)
{
	struct h_daemon d = { 0 };
	char cmd[1024], line[256];
	const char *src = getenv("RATELIMITD_SRCDIR");
	long long rst, closed;
	json_t *j;
	FILE *p;

	start(&d,
	    "backend: memory\nrequest_timeout: 500ms\n"
	    "idle_timeout: 1s\n",
	    rules_edge);
	snprintf(cmd, sizeof(cmd),
	    "/usr/bin/python3 %s/tests/grpc/"
	    "h2_dribble.py %d 6",
	    src != NULL ? src : ".", grpc_port);
	ck_assert_ptr_nonnull(p = popen(cmd, "r"));
	j = call(
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"user\", \"jo\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	json_decref(j);
	line[0] = '\0';
	if (fgets(line, sizeof(line), p) == NULL)
		line[0] = '\0';
	ck_assert_int_eq(pclose(p), 0);
	ck_assert_msg((j = json_loads(line, 0, NULL)) != NULL, "%s", line);
	ck_assert_msg(json_is_integer(json_object_get(j, "rst_after_ms")) &&
		json_is_integer(json_object_get(j, "closed_after_ms")),
	    "%s", line);
	rst = json_integer_value(json_object_get(j, "rst_after_ms"));
	closed = json_integer_value(json_object_get(j, "closed_after_ms"));
	ck_assert_msg(rst >= 400 && rst < 2000, "reset after %lld ms", rst);
	ck_assert_msg(closed >= rst && closed < 4000, "closed after %lld ms",
	    closed);
	json_decref(j);
	h_daemon_stop(&d);
}
END_TEST

/*
 * The deadline answer reaches the client: a call whose request is not
 * whole at request_timeout gets a trailers-only answer with grpc-status 4
 * (DEADLINE_EXCEEDED) before its stream is reset (the reset used to go
 * out alone: the answer was queued and dropped in the same turn, while
 * /metrics counted a DEADLINE_EXCEEDED nobody received).
 */
START_TEST(test_deadline_answer_arrives)
{
	struct h_daemon d = { 0 };
	struct h2raw c;
	struct h2raw_frame f = { 0 };
	uint8_t buf[1024];
	size_t len = 0;
	char status[32] = "";
	long long t0;
	bool rst = false, answered_first = false;

	start(&d,
	    "backend: memory\nrequest_timeout: 300ms\n"
	    "idle_timeout: 5s\n",
	    rules_edge);
	h2raw_connect(&c, grpc_port, NULL, 0);
	h2raw_call_headers(buf, &len, 1, H2RAW_RLS_PATH, false);
	ck_assert_uint_eq(h2raw_send(&c, buf, len, 1000), len);
	t0 = h_now_ms();
	while (!rst && h_now_ms() - t0 < 3000 && h2raw_read(&c, &f, 200) >= 0) {
		if (f.payload == NULL || f.stream != 1)
			continue;
		if (f.type == H2_HEADERS &&
		    h2raw_header(&f, "grpc-status", status, sizeof(status)))
			answered_first = true;
		if (f.type == H2_RST_STREAM)
			rst = true;
	}
	ck_assert_msg(answered_first, "no grpc-status before %s",
	    rst ? "the reset" : "3 s");
	ck_assert_str_eq(status, "4");
	ck_assert_msg(rst, "the stream was not reset");
	h2raw_close(&c);
	ck_assert_int_eq(h_metric("ratelimitd_grpc_responses_total"
				  "{code=\"DEADLINE_EXCEEDED\"}"),
	    1);
	h_daemon_stop(&d);
}
END_TEST

/* CPU time (user + system) the process has used, in milliseconds. */
static long long
cpu_ms(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	ck_assert_ptr_nonnull(f = fopen(path, "r"));
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* Fields 14 and 15, counted after the command's closing ')'. */
	ck_assert_ptr_nonnull(p = strrchr(buf, ')'));
	ck_assert_int_eq(sscanf(p + 2,
			     "%*c %*d %*d %*d %*d %*d %*u %*u %*u "
			     "%*u %*u %llu %llu",
			     &ut, &st),
	    2);
	return (long long)(ut + st) * 1000 / sysconf(_SC_CLK_TCK);
}

static int
tcp_connect(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int fd;

	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0),
	    0);
	ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0,
	    "connect: %s", strerror(errno));
	return fd;
}

/*
 * Out of descriptors: under an open-files limit of 64 the daemon warns
 * at start that HTTP and gRPC cannot both hold max_connections; with the
 * limit reached by clients on the gRPC port it does not spin on accept
 * (it used to take a whole core: EMFILE on a level-triggered listener),
 * and once those clients leave it serves again.
 */
START_TEST(test_out_of_descriptors)
{
	enum { HOLD = 120 };
	static int fds[HOLD];
	struct h_daemon d = { 0 };
	long long cpu0, cpu1, t0, t1;
	char *log;
	json_t *j;
	int i;

	/* The daemon alone runs under the low limit (soft and hard). */
	ops_init();
	ops_wrap_daemon("ulimit -n 64");
	start(&d, "backend: memory\n", rules_edge);
	log = ops_slurp(d.log);
	ck_assert_msg(strstr(log, "open files limited to 64") != NULL &&
		strstr(log, "HTTP and gRPC") != NULL,
	    "no warning at start: %s", log);
	free(log);

	for (i = 0; i < HOLD; i++)
		fds[i] = tcp_connect(grpc_port);
	h_sleep_ms(300);
	cpu0 = cpu_ms(d.pid);
	t0 = h_now_ms();
	h_sleep_ms(2000);
	cpu1 = cpu_ms(d.pid);
	t1 = h_now_ms();
	fprintf(stderr, "out of descriptors: %lld ms of CPU in %lld ms\n",
	    cpu1 - cpu0, t1 - t0);
	ck_assert_msg(cpu1 - cpu0 < 300,
	    "%lld ms of CPU in %lld ms out of "
	    "descriptors",
	    cpu1 - cpu0, t1 - t0);

	for (i = 0; i < HOLD; i++)
		close(fds[i]);
	j = call(
	    "{\"domain\": \"edge\", \"timeout\": 5, \"descriptors\": "
	    "[[[\"user\", \"kim\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	json_decref(j);
	h_daemon_stop(&d);
}
END_TEST

/*
 * A client that never reads: a whole call sent with
 * SETTINGS_INITIAL_WINDOW_SIZE 0, so its answer's message can never be
 * written.  The stream is reset once its answer has waited
 * request_timeout, and the connection closed at idle_timeout (both were
 * held for ever: the sweep closed only connections without streams).
 */
START_TEST(test_window_zero_client_is_cut)
{
	static const uint32_t window0[] = { H2_SET_INITIAL_WINDOW_SIZE, 0 };
	struct h_daemon d = { 0 };
	struct h2raw c;
	struct h2raw_frame f = { 0 };
	uint8_t buf[1024];
	size_t len = 0;
	long long t0, rst = -1, closed = -1;
	int r;

	start(&d,
	    "backend: memory\nrequest_timeout: 1s\n"
	    "idle_timeout: 1s\n",
	    rules_edge);
	h2raw_connect(&c, grpc_port, window0, 1);
	h2raw_call_headers(buf, &len, 1, H2RAW_RLS_PATH, false);
	h2raw_call_data(buf, &len, 1, "edge", "user", "lee");
	ck_assert_uint_eq(h2raw_send(&c, buf, len, 1000), len);
	t0 = h_now_ms();
	while (closed < 0 && h_now_ms() - t0 < 8000) {
		r = h2raw_read(&c, &f, 200);
		if (r < 0)
			closed = h_now_ms() - t0;
		else if (r > 0 && f.type == H2_RST_STREAM && f.stream == 1 &&
		    rst < 0)
			rst = h_now_ms() - t0;
	}
	h2raw_close(&c);
	fprintf(stderr,
	    "window 0: reset after %lld ms, closed after %lld "
	    "ms\n",
	    rst, closed);
	ck_assert_msg(rst >= 900 && rst < 2500, "reset after %lld ms", rst);
	ck_assert_msg(closed >= rst && closed < 4500, "closed after %lld ms",
	    closed);
	h_daemon_stop(&d);
}
END_TEST

/*
 * A daemon on a real Redis (redis.timeout `timeout`, policy allow) with
 * one rule, wide (${k}, far from its limit), that has decided once (so it
 * is connected), and then the Redis stopped (SIGSTOP): calls now wait for
 * Redis only.  The caller sends SIGCONT and stops both.
 */
static void
start_redis_stopped(struct h_redis *rs, struct h_daemon *d, const char *timeout)
{
	char more[256];

	h_redis_start(rs);
	snprintf(more, sizeof(more),
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%%REDIS_PORT%%/0\"\n"
	    "  timeout: %s\n"
	    "on_backend_error: allow\n",
	    timeout);
	start(d, more,
	    "  - name: wide\n"
	    "    key: \"${k}\"\n"
	    "    limit: 1000000\n"
	    "    window: 1h\n");
	json_decref(
	    call("{\"domain\": \"x\", \"descriptors\": "
		 "[[[\"k\", \"warm\"]]]}"));
	kill(rs->pid, SIGSTOP);
}

/*
 * Rapid reset (the shape of CVE-2023-44487): one connection sends a whole
 * call and resets it, 990 times, with Redis stopped so that every call
 * started stays in the store's hands until redis.timeout.  At most 128
 * calls of a connection are in the store at once (docs/grpc.md), a
 * stream reset does not free its place until the store answers, and the
 * connection is told to go away (GOAWAY) once it has cancelled more
 * calls than it could have at once.  Before, all 990 went to the store.
 */
START_TEST(test_rapid_reset_is_bounded)
{
	enum { N = 990 };
	static uint8_t buf[N * 256];
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	struct h2raw c;
	struct h2raw_frame f = { 0 };
	uint8_t rst[4] = { 0, 0, 0, 8 }; /* CANCEL */
	size_t len = 0, sent;
	long long t0, stored, goaway = -1;
	uint32_t id;
	int i, r;

	start_redis_stopped(&rs, &d, "1s");
	h2raw_connect(&c, grpc_port, NULL, 0);
	for (i = 0; i < N; i++) {
		id = 2 * (uint32_t)i + 1;
		h2raw_call_headers(buf, &len, id, H2RAW_RLS_PATH, false);
		h2raw_call_data(buf, &len, id, "x", "k", "flood");
		h2raw_frame(buf, &len, H2_RST_STREAM, 0, id, rst, 4);
	}
	sent = h2raw_send(&c, buf, len, 3000);
	t0 = h_now_ms();
	while (h_now_ms() - t0 < 3000 && (r = h2raw_read(&c, &f, 200)) >= 0)
		if (r > 0 && f.type == H2_GOAWAY && goaway < 0)
			goaway = h_now_ms() - t0;
	h2raw_close(&c);
	/* Every call that reached the store fails by redis.timeout (1 s). */
	h_sleep_ms(2000 - (h_now_ms() - t0));
	kill(rs.pid, SIGCONT);
	stored = (long long)ops_wait_metric(
	    "ratelimitd_backend_errors_total"
	    "{backend=\"redis\",kind=\"timeout\"}",
	    -1, 1500);
	fprintf(stderr,
	    "rapid reset: %zu of %zu bytes sent, %lld calls in "
	    "the store, GOAWAY after %lld ms\n",
	    sent, len, stored, goaway);
	ck_assert_msg(stored >= 1 && stored <= 128,
	    "%lld calls reached the "
	    "store",
	    stored);
	ck_assert_msg(goaway >= 0, "no GOAWAY");
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/* Read frames of c into f for up to ms: the error code of the first
 * GOAWAY (-1: none; -2: the connection closed first). */
static long long
read_goaway(struct h2raw *c, struct h2raw_frame *f, int ms)
{
	long long t0 = h_now_ms();
	int r;

	while (h_now_ms() - t0 < ms) {
		if ((r = h2raw_read(c, f, 100)) < 0)
			return -2;
		if (r > 0 && f->type == H2_GOAWAY && f->len >= 8)
			return (long long)f->payload[4] << 24 |
			    f->payload[5] << 16 | f->payload[6] << 8 |
			    f->payload[7];
	}
	return -1;
}

/*
 * A connection that abandons calls while the daemon shuts down is still
 * told ENHANCE_YOUR_CALM (docs/grpc.md).  127 calls sent and reset while
 * in the store (Redis stopped) leave it one call it may abandon; once
 * they are back, one more call goes to the store, SIGTERM sends the
 * graceful GOAWAY (NO_ERROR), and that call is reset too.  Before, the
 * graceful GOAWAY set the one flag that also stood for ENHANCE_YOUR_CALM
 * sent, and the second GOAWAY never went out.
 */
START_TEST(test_abandon_after_quiesce_goaway)
{
	enum { N = 127 };
	static uint8_t buf[N * 256];
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	struct h2raw c;
	struct h2raw_frame f = { 0 };
	uint8_t rst[4] = { 0, 0, 0, 8 }; /* CANCEL */
	size_t len = 0;
	long long code;
	uint32_t id;
	int i;

	start_redis_stopped(&rs, &d, "5s");
	h2raw_connect(&c, grpc_port, NULL, 0);
	for (i = 0; i < N; i++) {
		id = 2 * (uint32_t)i + 1;
		h2raw_call_headers(buf, &len, id, H2RAW_RLS_PATH, false);
		h2raw_call_data(buf, &len, id, "x", "k", "abandon");
		h2raw_frame(buf, &len, H2_RST_STREAM, 0, id, rst, 4);
	}
	ck_assert_uint_eq(h2raw_send(&c, buf, len, 2000), len);
	ck_assert_int_eq(read_goaway(&c, &f, 300), -1);
	kill(rs.pid, SIGCONT); /* the 127 come back */
	ck_assert_int_eq(read_goaway(&c, &f, 500), -1);
	kill(rs.pid, SIGSTOP);
	id = 2 * N + 1;
	len = 0;
	h2raw_call_headers(buf, &len, id, H2RAW_RLS_PATH, false);
	h2raw_call_data(buf, &len, id, "x", "k", "abandon");
	ck_assert_uint_eq(h2raw_send(&c, buf, len, 2000), len);
	ck_assert_int_eq(read_goaway(&c, &f, 300), -1); /* in the store */
	kill(d.pid, SIGTERM);
	code = read_goaway(&c, &f, 2000);
	ck_assert_msg(code == 0, "graceful GOAWAY: %lld", code);
	len = 0;
	h2raw_frame(buf, &len, H2_RST_STREAM, 0, id, rst, 4);
	ck_assert_uint_eq(h2raw_send(&c, buf, len, 2000), len);
	code = read_goaway(&c, &f, 1000);
	ck_assert_msg(code == 11, "after the last reset: GOAWAY %lld", code);
	h2raw_close(&c);
	kill(rs.pid, SIGCONT);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/*
 * SIGTERM while a client keeps calls coming on one connection: it is
 * told GOAWAY (NO_ERROR), every call up to the GOAWAY's last stream is
 * answered, and the connection then ends in an orderly close, not a
 * reset.  (The drain used to end as soon as no call was in the store, and
 * the connection was closed with the client's input unread: no GOAWAY in
 * most runs, a reset, and up to ~100 calls never answered, which an Envoy
 * that fails open lets through.)
 */
START_TEST(test_sigterm_goaway_then_orderly_close)
{
	enum { BATCH = 8, MAXID = 4000 };
	static uint8_t buf[BATCH * 256];
	static bool answered[MAXID + 1];
	struct h_daemon d = { 0 };
	struct h2raw c;
	struct h2raw_frame f = { 0 };
	long long code = -1, t0, end;
	uint32_t id = 1, last = 0, i;
	size_t len;
	int r, b;

	memset(answered, 0, sizeof(answered));
	start(&d, "backend: memory\n",
	    "  - name: wide\n"
	    "    key: \"${k}\"\n"
	    "    limit: 1000000\n"
	    "    window: 1h\n");
	h2raw_connect(&c, grpc_port, NULL, 0);
	t0 = h_now_ms();
	end = t0 + 8000;
	for (b = 0; h_now_ms() < end; b++) {
		if (b == 20)
			ck_assert_int_eq(kill(d.pid, SIGTERM), 0);
		/* Calls keep coming until the server closes: those past its
		 * GOAWAY's last stream are the client's to send again. */
		for (len = 0, i = 0; i < BATCH && id + 2 * i <= MAXID; i++) {
			h2raw_call_headers(buf, &len, id + 2 * i,
			    H2RAW_RLS_PATH, false);
			h2raw_call_data(buf, &len, id + 2 * i, "x", "k", "v");
		}
		id += 2 * i;
		(void)h2raw_send(&c, buf, len, 200);
		while ((r = h2raw_read(&c, &f, b < 20 ? 5 : 20)) > 0) {
			if (f.type == H2_GOAWAY && f.len >= 8 && code < 0) {
				last = ((uint32_t)f.payload[0] << 24 |
					   (uint32_t)f.payload[1] << 16 |
					   (uint32_t)f.payload[2] << 8 |
					   f.payload[3]) &
				    0x7fffffff;
				code = (long long)f.payload[4] << 24 |
				    f.payload[5] << 16 | f.payload[6] << 8 |
				    f.payload[7];
			}
			if (f.type == H2_HEADERS && (f.flags & H2_END_STREAM) &&
			    f.stream <= MAXID)
				answered[f.stream] = true;
		}
		if (r < 0)
			break;
	}
	ck_assert_msg(r < 0, "the connection was not closed");
	ck_assert_msg(code == 0, "no graceful GOAWAY before the close: %lld",
	    code);
	ck_assert_msg(c.closed_errno == 0, "closed by a reset: %s",
	    strerror(c.closed_errno));
	ck_assert_msg(last >= 1, "the GOAWAY's last stream: %u", last);
	for (i = 1; i <= last && i <= MAXID; i += 2)
		ck_assert_msg(answered[i], "call %u (<= %u) not answered", i,
		    last);
	h2raw_close(&c);
	ck_assert_int_ge(ops_exit_time_ms(d.pid, 5000), 0);
	h_daemon_stop(&d);
}
END_TEST

/* A line of /proc/PID/status ("VmRSS"), in kB. */
static long long
proc_status_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	long long v = -1;
	size_t n = strlen(field);
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	ck_assert_ptr_nonnull(f = fopen(path, "r"));
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, n) == 0 && line[n] == ':')
			v = atoll(line + n + 1);
	fclose(f);
	return v;
}

/* Is the daemon built with AddressSanitizer or ThreadSanitizer (libasan
 * or libtsan in its maps)?  ASan's quarantine keeps freed memory by
 * design, and TSan's shadow memory grows with what the threads touched,
 * so RSS says little then. */
static bool
under_sanitizer(pid_t pid)
{
	char path[64], line[512];
	bool asan = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	ck_assert_ptr_nonnull(f = fopen(path, "r"));
	while (!asan && fgets(line, sizeof(line), f) != NULL)
		asan = strstr(line, "libasan") != NULL ||
		    strstr(line, "libtsan") != NULL;
	fclose(f);
	return asan;
}

/* The daemon's threads named name (/proc/PID/task/N/comm). */
static int
threads_named(pid_t pid, const char *name)
{
	char path[128], comm[64];
	int tid, count = 0;
	FILE *f;

	/* Task ids follow the PID closely; look at a window past it. */
	for (tid = (int)pid; tid < (int)pid + 4096; tid++) {
		snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", (int)pid,
		    tid);
		if ((f = fopen(path, "r")) == NULL)
			continue;
		if (fgets(comm, sizeof(comm), f) != NULL &&
		    strncmp(comm, name, strlen(name)) == 0 &&
		    comm[strlen(name)] == '\n')
			count++;
		fclose(f);
	}
	return count;
}

/*
 * A rapid-reset flood (tests/grpc/h2_flood.py: 4 connections for 4 s,
 * reconnecting after each GOAWAY) against Redis: the daemon's memory
 * stays bounded (it grew from ~6 MB past 270 MB, calls piling up in the
 * store without limit), the gRPC front runs `threads` loops (it had one
 * thread), and a normal call is answered afterwards.
 */
START_TEST(test_rapid_reset_flood_memory)
{
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	char cmd[1024], line[256];
	const char *src = getenv("RATELIMITD_SRCDIR");
	long long before, after;
	json_t *j;
	FILE *p;

	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 1s\n",
	    "  - name: wide\n"
	    "    key: \"${k}\"\n"
	    "    limit: 1000000\n"
	    "    window: 1h\n");
	before = proc_status_kb(d.pid, "VmRSS");
	snprintf(cmd, sizeof(cmd),
	    "/usr/bin/python3 %s/tests/grpc/"
	    "h2_flood.py %d 4 4",
	    src != NULL ? src : ".", grpc_port);
	ck_assert_ptr_nonnull(p = popen(cmd, "r"));
	line[0] = '\0';
	if (fgets(line, sizeof(line), p) == NULL)
		line[0] = '\0';
	ck_assert_int_eq(pclose(p), 0);
	after = proc_status_kb(d.pid, "VmRSS");
	fprintf(stderr,
	    "rapid reset flood: %s RSS %lld kB before, %lld kB "
	    "after\n",
	    line, before, after);
	ck_assert_msg(after < 64 * 1024 || under_sanitizer(d.pid),
	    "RSS %lld kB "
	    "after the flood (%lld kB before)",
	    after, before);
	j = call(
	    "{\"domain\": \"x\", \"descriptors\": "
	    "[[[\"k\", \"after\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	json_decref(j);
	ck_assert_int_eq(threads_named(d.pid, "rl-grpc"), 2);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/* Append to buf a call on stream whose header block (HEADERS and eight
 * CONTINUATION frames, ~147 KB) adds a 4,000-byte header to the HPACK
 * table and then refers to it once a byte: ~140,000 headers, 560 MB
 * decoded.  Then its message. */
static void
hpack_bomb(uint8_t *buf, size_t *len, uint32_t stream)
{
	enum { FRAME = 16384, FRAMES = 9, VALUE = 4000 };
	static uint8_t block[FRAME * FRAMES];
	size_t n = 0, off, chunk;
	uint8_t call[1024];
	size_t clen = 0;
	int i, v = VALUE - 127;

	/* The call's own headers: from a HEADERS frame made by h2raw,
	 * without its 9-byte frame header. */
	h2raw_call_headers(call, &clen, stream, H2RAW_RLS_PATH, false);
	memcpy(block, call + 9, clen - 9);
	n = clen - 9;
	/* Literal with incremental indexing, new name "x-bomb". */
	block[n++] = 0x40;
	block[n++] = 6;
	memcpy(block + n, "x-bomb", 6);
	n += 6;
	block[n++] = 0x7f; /* 7-bit prefix full: 127 + varint */
	while (v >= 128) {
		block[n++] = (uint8_t)(v % 128 + 128);
		v /= 128;
	}
	block[n++] = (uint8_t)v;
	memset(block + n, 'b', VALUE);
	n += VALUE;
	while (n < sizeof(block))
		block[n++] = 0xbe; /* indexed: dynamic entry 62 */
	for (i = 0, off = 0; off < n; i++, off += chunk) {
		chunk = n - off < FRAME ? n - off : FRAME;
		h2raw_frame(buf, len, i == 0 ? H2_HEADERS : H2_CONTINUATION,
		    off + chunk == n ? H2_END_HEADERS : 0, stream, block + off,
		    chunk);
	}
	h2raw_call_data(buf, len, stream, "edge", "user", "bomb");
}

/*
 * HPACK bomb: a header block of ~147 KB that decodes to ~140,000
 * references to one 4,000-byte header.  max_header_bytes (8192) bounds a
 * gRPC call's decoded headers as it does HTTP's: the stream is reset as
 * soon as its headers pass it, and a connection that does it again is
 * sent GOAWAY; meanwhile other clients are served.  Before, every bomb
 * was decoded whole and answered OK: 8 took the loop ~2.4 s.
 */
START_TEST(test_hpack_bomb_is_refused)
{
	enum { BOMBS = 8 };
	static uint8_t buf[BOMBS * 150000];
	struct h_daemon d = { 0 };
	struct h2raw c;
	struct h2raw_frame f = { 0 };
	size_t len = 0, sent, first;
	char status[32];
	long long t0, took, goaway = -1;
	int i, r, ok = 0, rst = 0;
	json_t *j;

	start(&d, "backend: memory\n", rules_edge);
	h2raw_connect(&c, grpc_port, NULL, 0);
	for (i = 0; i < BOMBS; i++)
		hpack_bomb(buf, &len, 2 * (uint32_t)i + 1);
	/* The first bomb alone: its stream is reset, the connection lives;
	 * then the others. */
	t0 = h_now_ms();
	first = len / BOMBS;
	sent = h2raw_send(&c, buf, first, 20000);
	while (h_now_ms() - t0 < 20000 && (r = h2raw_read(&c, &f, 200)) >= 0) {
		if (r == 0)
			continue;
		if (f.type == H2_HEADERS &&
		    h2raw_header(&f, "grpc-status", status, sizeof(status)) &&
		    strcmp(status, "0") == 0)
			ok++;
		if (f.type == H2_RST_STREAM)
			rst++;
		if (f.type == H2_GOAWAY && goaway < 0)
			goaway = h_now_ms() - t0;
		if (ok + rst == (sent == len ? BOMBS : 1) || goaway >= 0) {
			if (sent == len)
				break;
			sent += h2raw_send(&c, buf + first, len - first, 20000);
		}
	}
	took = h_now_ms() - t0;
	h2raw_close(&c);
	fprintf(stderr,
	    "hpack bomb: %zu of %zu bytes sent, %d answered OK, "
	    "%d reset, GOAWAY after %lld ms, %lld ms in all\n",
	    sent, len, ok, rst, goaway, took);
	ck_assert_msg(ok == 0, "%d bombs answered OK", ok);
	ck_assert_msg(rst >= 1, "no stream reset");
	ck_assert_msg(goaway >= 0, "no GOAWAY");
	ck_assert_msg(took < 2000, "%lld ms for the bombs", took);
	j = call(
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"user\", \"mo\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OK");
	json_decref(j);
	h_daemon_stop(&d);
}
END_TEST

/* One connection of test_conn_budget_*: its connection-level window
 * (what the server lets it send) and each stream's grpc-status. */
struct budget_conn {
	struct h2raw c;
	struct h2raw_frame f;
	long long win;
	int answered;
	char code[64][8], msg[64][160];
};

/* Take in one frame from the server: a WINDOW_UPDATE of the connection,
 * or the grpc-status (and grpc-message) of a stream. */
static void
budget_frame(struct budget_conn *b)
{
	const struct h2raw_frame *f = &b->f;
	uint32_t i = (f->stream - 1) / 2;

	if (f->type == H2_WINDOW_UPDATE && f->stream == 0 && f->len == 4)
		b->win += ((long long)f->payload[0] << 24 |
			      f->payload[1] << 16 | f->payload[2] << 8 |
			      f->payload[3]) &
		    0x7fffffff;
	if (f->type == H2_HEADERS && f->stream % 2 == 1 && i < 64 &&
	    h2raw_header(f, "grpc-status", b->code[i], sizeof(b->code[i]))) {
		b->answered++;
		if (!h2raw_header(f, "grpc-message", b->msg[i],
			sizeof(b->msg[i])))
			b->msg[i][0] = '\0';
	}
}

/* Send a call's frames (data bytes of DATA payload) once the server's
 * window has room for them. */
static void
budget_send(struct budget_conn *b, const uint8_t *buf, size_t len, size_t data)
{
	long long t0 = h_now_ms();
	int r;

	while (b->win < (long long)data && h_now_ms() - t0 < 5000 &&
	    (r = h2raw_read(&b->c, &b->f, 200)) >= 0)
		if (r > 0)
			budget_frame(b);
	ck_assert_msg(b->win >= (long long)data, "no window for %zu bytes",
	    data);
	ck_assert_uint_eq(h2raw_send(&b->c, buf, len, 2000), len);
	b->win -= (long long)data;
}

/* Read until n streams are answered or ms pass. */
static void
budget_wait(struct budget_conn *b, int n, int ms)
{
	long long t0 = h_now_ms();
	int r;

	while (b->answered < n && h_now_ms() - t0 < ms &&
	    (r = h2raw_read(&b->c, &b->f, 200)) >= 0)
		if (r > 0)
			budget_frame(b);
}

/*
 * The 256 KiB a connection may hold are its requests not yet decoded
 * (docs/grpc.md): with Redis stopped, 20 calls of ~15 KB on one
 * connection (each under max_body_bytes, 300 KB together) all wait in
 * the store and are all answered once Redis is back.  Before, the bytes
 * of a call stayed counted until its stream closed, and calls 18 to 20
 * were refused RESOURCE_EXHAUSTED "message larger than max_body_bytes".
 * Requests still arriving do count, as the buffers they hold (16 KiB for
 * a 15 KB message): the 17th unfinished one passes the budget, and is
 * refused as such, not as too large.  Before, only the bytes received
 * were counted, so 17 fitted (with 32 KiB buffers for max-size messages,
 * a connection held twice the budget).
 */
START_TEST(test_conn_budget_counts_unfinished_requests)
{
	enum { N = 20, PAD = 15000 };
	static uint8_t buf[2 * 16384];
	static struct budget_conn b;
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	size_t len, data;
	char user[16];
	uint32_t id;
	int i;

	start_redis_stopped(&rs, &d, "5s");
	memset(&b, 0, sizeof(b));
	b.win = 65535;
	h2raw_connect(&b.c, grpc_port, NULL, 0);
	for (i = 0; i < N; i++) {
		id = 2 * (uint32_t)i + 1;
		snprintf(user, sizeof(user), "u%d", i);
		len = 0;
		h2raw_call_headers(buf, &len, id, H2RAW_RLS_PATH, false);
		data = len;
		h2raw_call_data_pad(buf, &len, id, "x", "k", user, PAD, true);
		data = len - data - 9;
		budget_send(&b, buf, len, data);
	}
	budget_wait(&b, N, 300); /* refusals come at once */
	kill(rs.pid, SIGCONT);
	budget_wait(&b, N, 5000);
	for (i = 0; i < N; i++)
		ck_assert_msg(strcmp(b.code[i], "0") == 0,
		    "call %d of %d: grpc-status \"%s\" (%s)", i + 1, N,
		    b.code[i], b.msg[i]);
	h2raw_close(&b.c);

	/* 17 requests, none ended: the 17th passes 256 KiB (16 x 16 KiB). */
	memset(&b, 0, sizeof(b));
	b.win = 65535;
	h2raw_connect(&b.c, grpc_port, NULL, 0);
	for (i = 0; i < 17; i++) {
		id = 2 * (uint32_t)i + 1;
		len = 0;
		h2raw_call_headers(buf, &len, id, H2RAW_RLS_PATH, false);
		data = len;
		h2raw_call_data_pad(buf, &len, id, "x", "k", "open", PAD,
		    false);
		data = len - data - 9;
		budget_send(&b, buf, len, data);
	}
	len = 0;
	h2raw_frame(buf, &len, H2_DATA, H2_END_STREAM, 33, NULL, 0);
	budget_send(&b, buf, len, 0);
	budget_wait(&b, 1, 3000);
	ck_assert_msg(b.answered == 1, "%d answers", b.answered);
	ck_assert_str_eq(b.code[16], "8");
	ck_assert_msg(strstr(b.msg[16], "unfinished requests") != NULL,
	    "grpc-message \"%s\"", b.msg[16]);
	h2raw_close(&b.c);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/*
 * grpc-timeout 0 ("0m", "0S", "0n") is a deadline already passed: the
 * call is answered DEADLINE_EXCEEDED at once, as gRPC's own servers do
 * (docs/grpc.md).  A positive timeout, or one that does not parse, is
 * served.  Before, 0 was taken for "no deadline" and answered OK.
 */
START_TEST(test_grpc_timeout_zero_is_expired)
{
	static const struct {
		const char *timeout, *status;
	} cases[] = {
		{ "0m", "4" },
		{ "0S", "4" },
		{ "0n", "4" },
		{ "1S", "0" },
		{ "x1", "0" },
	};
	enum { N = sizeof(cases) / sizeof(cases[0]) };
	static struct budget_conn b;
	struct h_daemon d = { 0 };
	uint8_t buf[4096];
	size_t len = 0;
	uint32_t id;
	int i;

	start(&d, "backend: memory\n", rules_edge);
	memset(&b, 0, sizeof(b));
	h2raw_connect(&b.c, grpc_port, NULL, 0);
	for (i = 0; i < N; i++) {
		id = 2 * (uint32_t)i + 1;
		h2raw_call_headers_timeout(buf, &len, id, H2RAW_RLS_PATH,
		    cases[i].timeout, false);
		h2raw_call_data(buf, &len, id, "edge", "user", "zed");
	}
	ck_assert_uint_eq(h2raw_send(&b.c, buf, len, 2000), len);
	budget_wait(&b, N, 3000);
	for (i = 0; i < N; i++)
		ck_assert_msg(strcmp(b.code[i], cases[i].status) == 0,
		    "grpc-timeout %s: grpc-status \"%s\" (%s), not %s",
		    cases[i].timeout, b.code[i], b.msg[i], cases[i].status);
	h2raw_close(&b.c);
	h_daemon_stop(&d);
}
END_TEST

/* n calls for user on one new connection, each with grpc-timeout
 * timeout[i % ntimeouts], sent at once; every one must be answered
 * grpc-status want. */
static void
tiny_deadline_calls(int n, const char *const *timeout, int ntimeouts,
    const char *user, const char *want)
{
	static struct budget_conn b;
	uint8_t buf[8192];
	size_t len = 0;
	uint32_t id;
	int i;

	ck_assert_int_le(n, 64);
	memset(&b, 0, sizeof(b));
	h2raw_connect(&b.c, grpc_port, NULL, 0);
	for (i = 0; i < n; i++) {
		id = 2 * (uint32_t)i + 1;
		h2raw_call_headers_timeout(buf, &len, id, H2RAW_RLS_PATH,
		    timeout[i % ntimeouts], false);
		h2raw_call_data(buf, &len, id, "edge", "user", user);
	}
	ck_assert_uint_eq(h2raw_send(&b.c, buf, len, 2000), len);
	budget_wait(&b, n, 5000);
	for (i = 0; i < n; i++)
		ck_assert_msg(strcmp(b.code[i], want) == 0,
		    "call %d (grpc-timeout %s): grpc-status \"%s\" (%s), "
		    "not %s",
		    i + 1, timeout[i % ntimeouts], b.code[i], b.msg[i], want);
	h2raw_close(&b.c);
}

/*
 * A client's own deadline, shorter than redis.timeout, that passes
 * before Redis answers says nothing about Redis (docs/grpc.md): the call
 * is answered DEADLINE_EXCEEDED, and neither the circuit nor
 * ratelimitd_backend_errors_total counts it.  Calls with grpc-timeout 1u
 * (given up before they are sent) and 20m (given up in flight, Redis
 * stopped) while Redis is stopped, then 1u calls against a Redis that
 * answers, each burst followed by an HTTP /acquire of another user: with
 * on_backend_error deny, every one is decided by Redis (200), never 503.
 * Before, the calls counted as Redis timeouts: five opened the circuit
 * for every client, and the calls themselves were answered UNAVAILABLE.
 */
START_TEST(test_own_deadline_leaves_circuit_closed)
{
	static const char *const stopped[] = { "1u", "20m" };
	static const char *const running[] = { "1u" };
	struct h_redis rs = { 0 };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	char body[128];
	int i;

	h_redis_start(&rs);
	start(&d,
	    "backend: redis\nredis:\n"
	    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
	    "  timeout: 3s\n"
	    "on_backend_error: deny\n",
	    rules_edge);
	json_decref(
	    call("{\"domain\": \"edge\", \"descriptors\": "
		 "[[[\"user\", \"warm\"]]]}"));
	kill(rs.pid, SIGSTOP);
	for (i = 0; i < 3; i++)
		tiny_deadline_calls(16, stopped, 2, "tiny", "4");
	kill(rs.pid, SIGCONT);
	for (i = 0; i < 5; i++) {
		tiny_deadline_calls(10, running, 1, "tiny", "4");
		snprintf(body, sizeof(body),
		    "{\"domain\":\"edge\",\"user\":\"other%d\"}", i);
		h_post(d.port, "/acquire", body, &r);
		ck_assert_msg(r.status == 200, "/acquire %d: %ld %s", i,
		    r.status, r.body);
	}
	h_resp_free(&r);
	ck_assert(h_redis_log_units(&rs, "rl:per-user:{other4}") == 1);
	ck_assert(ops_metric("ratelimitd_backend_errors_total"
			     "{backend=\"redis\",kind=\"timeout\"}") <= 0);
	ck_assert(ops_metric("ratelimitd_grpc_responses_total"
			     "{code=\"DEADLINE_EXCEEDED\"}") >= 98);
	h_daemon_stop(&d);
	h_redis_stop(&rs);
}
END_TEST

/* A reload applies to gRPC calls too; SIGTERM exits 0 (h_daemon_stop). */
START_TEST(test_reload)
{
	struct h_daemon d = { 0 };
	char yaml[2048];
	json_t *j;
	FILE *f;

	start(&d, "backend: memory\n", rules_edge);
	snprintf(yaml, sizeof(yaml),
	    "listen: \"127.0.0.1:%d\"\n"
	    "grpc_listen: \"127.0.0.1:%d\"\n"
	    "threads: 2\n"
	    "backend: memory\n"
	    "rules:\n"
	    "  - name: strict\n"
	    "    key: \"${user}\"\n"
	    "    limit: 1\n"
	    "    window: 1m\n",
	    d.port, grpc_port);
	ck_assert_ptr_nonnull(f = fopen(d.conf, "w"));
	fputs(yaml, f);
	fclose(f);
	kill(d.pid, SIGHUP);
	ck_assert(ops_wait_metric("ratelimitd_config_reloads_total"
				  "{result=\"success\"}",
		      1, 3000) == 1);
	json_decref(
	    call("{\"domain\": \"any\", \"descriptors\": "
		 "[[[\"user\", \"gus\"]]]}"));
	j = call(
	    "{\"domain\": \"any\", \"descriptors\": "
	    "[[[\"user\", \"gus\"]]]}");
	ck_assert_str_eq(str(j, "overall"), "OVER_LIMIT");
	ck_assert_str_eq(json_string_value(json_object_get(
			     json_object_get(status(j, 0), "limit"), "name")),
	    "strict");
	json_decref(j);
	h_daemon_stop(&d);
}
END_TEST

/* The daemon's JSON log lines of endpoint "grpc", in an array. */
static json_t *
grpc_access_lines(const char *path)
{
	char *log = ops_slurp(path), *line, *save = NULL;
	json_t *all = json_array(), *o;

	for (line = strtok_r(log, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		o = json_loads(line, 0, NULL);
		ck_assert_msg(o != NULL, "not JSON: %s", line);
		if (json_object_get(o, "endpoint") != NULL &&
		    strcmp(json_string_value(json_object_get(o, "endpoint")),
			"grpc") == 0)
			json_array_append(all, o);
		json_decref(o);
	}
	free(log);
	return all;
}

/* access_log: true logs each ShouldRateLimit call as /acquire's are
 * (docs/operations.md, the log): one line per call, its overall code,
 * the deciding rule, limit and remaining. */
START_TEST(test_access_log)
{
	const char *spec =
	    "{\"domain\": \"edge\", \"descriptors\": "
	    "[[[\"user\", \"bob\"]]]}";
	struct h_daemon d = { 0 };
	json_t *j, *lines, *l;
	int i;

	start(&d, "backend: memory\naccess_log: true\nlog_format: json\n",
	    rules_edge);
	for (i = 0; i < 4; i++) {
		j = call(spec);
		ck_assert_str_eq(str(j, "overall"),
		    i < 3 ? "OK" : "OVER_LIMIT");
		json_decref(j);
	}
	lines = grpc_access_lines(d.log);
	ck_assert_uint_eq(json_array_size(lines), 4);
	l = json_array_get(lines, 0);
	ck_assert_str_eq(str(l, "msg"), "decision");
	ck_assert_str_eq(str(l, "level"), "info");
	ck_assert_str_eq(str(l, "code"), "OK");
	ck_assert_str_eq(str(l, "allowed"), "true");
	ck_assert_str_eq(str(l, "rule"), "per-user");
	ck_assert_str_eq(str(l, "limit"), "3");
	ck_assert_str_eq(str(l, "remaining"), "2");
	ck_assert_str_eq(str(l, "degraded"), "false");
	l = json_array_get(lines, 3);
	ck_assert_str_eq(str(l, "code"), "OVER_LIMIT");
	ck_assert_str_eq(str(l, "allowed"), "false");
	ck_assert_str_eq(str(l, "rule"), "per-user");
	ck_assert_str_eq(str(l, "remaining"), "0");
	ck_assert_int_gt(atoi(str(l, "retry_after_ms")), 0);
	json_decref(lines);
	h_daemon_stop(&d);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("grpc");
	TCase *tc = tcase_create("rls");

	tcase_add_unchecked_fixture(tc, NULL, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_add_test(tc, test_allowed_then_over_limit);
	tcase_add_test(tc, test_all_or_nothing_and_hits_addend_on_redis);
	tcase_add_test(tc, test_key_too_long_fails_closed);
	tcase_add_test(tc, test_cost_over_limit_marks_its_descriptors);
	tcase_add_test(tc, test_concurrent_streams_exact);
	tcase_add_test(tc, test_health_and_bad_calls);
	tcase_add_test(tc, test_backend_down_policies);
	tcase_add_test(tc, test_grpc_timeout_bounds_the_store);
	tcase_add_test(tc, test_grpc_timeout_while_held);
	tcase_add_test(tc, test_grpc_timeout_zero_is_expired);
	tcase_add_test(tc, test_first_calls_without_http);
	tcase_add_test(tc, test_sigterm_answers_calls_in_flight);
	tcase_add_test(tc, test_sigterm_goaway_then_orderly_close);
	tcase_add_test(tc, test_unfinished_request_is_cut);
	tcase_add_test(tc, test_reload);
	tcase_add_test(tc, test_access_log);
	suite_add_tcase(s, tc);

	tc = tcase_create("attacks");
	tcase_add_unchecked_fixture(tc, NULL, h_reap_orphans);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_add_test(tc, test_deadline_answer_arrives);
	tcase_add_test(tc, test_out_of_descriptors);
	tcase_add_test(tc, test_window_zero_client_is_cut);
	tcase_add_test(tc, test_rapid_reset_is_bounded);
	tcase_add_test(tc, test_rapid_reset_flood_memory);
	tcase_add_test(tc, test_hpack_bomb_is_refused);
	tcase_add_test(tc, test_conn_budget_counts_unfinished_requests);
	tcase_add_test(tc, test_own_deadline_leaves_circuit_closed);
	tcase_add_test(tc, test_abandon_after_quiesce_goaway);
	suite_add_tcase(s, tc);
	return s;
}
