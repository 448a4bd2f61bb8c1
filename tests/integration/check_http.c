/*
 * check_http.c - ratelimitd over HTTP, tested from outside against
 * docs/configuration.md, docs/http.md, docs/algorithms.md and
 * docs/operations.md: the real binary, a real Redis, real HTTP through
 * libcurl.
 *
 * Most of it is one table of cases.  A case is a short sequence of requests
 * and what each must answer; it runs against a fresh daemon, once with
 * `backend: memory` and once with `backend: redis` (docs/algorithms.md: both
 * stores give the same answers).  Besides what a step spells out,
 * every answer is held to the rules that hold for all answers:
 *   - a decision (200/429 from /acquire) is a JSON object whose `allowed`
 *     agrees with the status; when a rule decided, the RateLimit-Policy,
 *     RateLimit and X-RateLimit-* headers say exactly what the JSON says,
 *     values are within the rule's limit and window, and a 429 carries
 *     Retry-After = max(1, ceil(retry_after_ms / 1000)); when no rule
 *     applied, limit and remaining are null and no RateLimit header is sent;
 *   - an error is a JSON {"error", "message"} and the daemon still serves
 *     after it; with Redis, it touched nothing (DBSIZE and the number of
 *     script calls in INFO commandstats are unchanged);
 *   - with Redis, a step may name the key it must have left, which must be
 *     exactly <key_prefix><rule>:{<rendered key>}, a sorted set (the
 *     sliding log of docs/algorithms.md) of the expected size whose TTL is
 *     positive and at most the window.
 * The rest are tests that do not fit a table: keep-alive, the sliding
 * (not fixed) window across a window boundary, /readyz following Redis
 * going away and coming back, and a path with an encoded NUL.
 *
 * In bodies and expected JSON a ' stands for a " (so the table reads), and
 * #N# stands for N letters 'a' (long values).
 */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"

#define KEY_PREFIX "it:"

static const char memory_head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 4\n"
    "max_body_bytes: 1024\n"
    "shutdown_timeout: 2s\n"
    "backend: memory\n";

static const char redis_head[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 4\n"
    "max_body_bytes: 1024\n"
    "shutdown_timeout: 2s\n"
    "backend: redis\n"
    "redis:\n"
    "  url: \"redis://127.0.0.1:%REDIS_PORT%/0\"\n"
    "  timeout: 200ms\n"
    "  key_prefix: \"" KEY_PREFIX
    "\"\n"
    "on_backend_error: deny\n";

/* The rules every test runs with; each case uses its own few (by the
 * attribute t, or by path/code/... for the match cases). */
static const char rules_yaml[] =
    "rules:\n"
    "  - name: basic\n"
    "    match:\n"
    "      t: basic\n"
    "    key: \"${user}\"\n"
    "    limit: 3\n"
    "    window: 1m\n"
    "  - name: nokey\n"
    "    match:\n"
    "      t: nokey\n"
    "    limit: 2\n"
    "    window: 10s\n"
    "  - name: cost\n"
    "    match:\n"
    "      t: cost\n"
    "    key: \"${user}\"\n"
    "    limit: 5\n"
    "    window: 1m\n"
    "  - name: dcost\n"
    "    match:\n"
    "      t: dcost\n"
    "    limit: 6\n"
    "    window: 1m\n"
    "    cost: 3\n"
    "  - name: r-exact\n"
    "    match:\n"
    "      path: \"/exact\"\n"
    "    limit: 100\n"
    "    window: 1h\n"
    "  - name: r-glob\n"
    "    match:\n"
    "      path: \"/glob/*/x?\"\n"
    "    limit: 100\n"
    "    window: 1h\n"
    "  - name: r-regex\n"
    "    match:\n"
    "      path: \"~^/v[0-9]+/login$\"\n"
    "    limit: 100\n"
    "    window: 1h\n"
    "  - name: r-search\n"
    "    match:\n"
    "      code: \"~[0-9]{3}\"\n"
    "    limit: 100\n"
    "    window: 1h\n"
    "  - name: r-multi\n"
    "    match:\n"
    "      method: POST\n"
    "      path: \"/multi/*\"\n"
    "    limit: 100\n"
    "    window: 1h\n"
    "  - name: r-int\n"
    "    match:\n"
    "      tier: \"7\"\n"
    "    limit: 100\n"
    "    window: 1h\n"
    "  - name: r-bool\n"
    "    match:\n"
    "      vip: \"true\"\n"
    "    limit: 100\n"
    "    window: 1h\n"
    "  - name: dshort\n"
    "    match:\n"
    "      ds: \"y\"\n"
    "    key: \"${user}\"\n"
    "    limit: 1\n"
    "    window: 3s\n"
    "  - name: dlong\n"
    "    match:\n"
    "      dl: \"y\"\n"
    "    key: \"${user}\"\n"
    "    limit: 3\n"
    "    window: 1m\n"
    "  - name: ip\n"
    "    match:\n"
    "      t: ip\n"
    "    key: \"${ip}\"\n"
    "    limit: 1\n"
    "    window: 1m\n"
    "  - name: pair\n"
    "    match:\n"
    "      t: pair\n"
    "    key: \"u=${user}/i=${ip}\"\n"
    "    limit: 1\n"
    "    window: 1m\n"
    "  - name: aon-wide\n"
    "    match:\n"
    "      t: aon\n"
    "    key: \"${user}\"\n"
    "    limit: 5\n"
    "    window: 1m\n"
    "  - name: aon-narrow\n"
    "    match:\n"
    "      t: aon\n"
    "    key: \"${user}\"\n"
    "    limit: 1\n"
    "    window: 1m\n"
    "  - name: shadow\n"
    "    match:\n"
    "      t: shadow\n"
    "    key: \"${user}\"\n"
    "    limit: 3\n"
    "    window: 1m\n"
    "    shadow: true\n"
    "  - name: shadow2\n"
    "    match:\n"
    "      t: mix\n"
    "    key: \"${user}\"\n"
    "    limit: 1\n"
    "    window: 1m\n"
    "    shadow: true\n"
    "  - name: mixreal\n"
    "    match:\n"
    "      t: mix\n"
    "    key: \"${user}\"\n"
    "    limit: 3\n"
    "    window: 1m\n"
    "  - name: keep\n"
    "    match:\n"
    "      t: keep\n"
    "    key: \"${user}\"\n"
    "    limit: 2\n"
    "    window: 1m\n"
    "  - name: slide\n"
    "    match:\n"
    "      t: slide\n"
    "    limit: 2\n"
    "    window: 2s\n";

/* The window of each rule above, to check headers and bounds. */
/* clang-format off */
static const struct {
	const char *name;
	long long window_ms;
} windows[] = {
	{ "basic", 60000 }, { "nokey", 10000 }, { "cost", 60000 },
	{ "dcost", 60000 }, { "r-exact", 3600000 }, { "r-glob", 3600000 },
	{ "r-regex", 3600000 }, { "r-search", 3600000 },
	{ "r-multi", 3600000 }, { "r-int", 3600000 }, { "r-bool", 3600000 },
	{ "ip", 60000 }, { "pair", 60000 }, { "aon-wide", 60000 },
	{ "aon-narrow", 60000 }, { "shadow", 60000 }, { "shadow2", 60000 },
	{ "mixreal", 60000 }, { "keep", 60000 }, { "slide", 2000 },
	{ "dshort", 3000 }, { "dlong", 60000 },
};
/* clang-format on */

/* Set in the runner by the TCase's unchecked fixture, inherited by tests. */
static bool use_redis;

/* --- the table -------------------------------------------------------- */

struct step {
	const char *method; /* NULL: POST */
	const char *path;   /* NULL: /acquire */
	const char *body;   /* ' for ", #N# for N a's; NULL: no body */
	size_t body_len;    /* if set, the expanded body has this length */
	int status;
	const char *json;	/* a subset the JSON answer must contain */
	const char *error;	/* the error code of an error answer */
	const char *text;	/* the exact body of a text answer */
	long long min_retry_ms; /* retry_after_ms must be at least this */
	const char *rkey;	/* redis: this key (after the prefix) ... */
	long long units;	/* ... holds this many units (0: none) */
};

#define MAX_STEPS 14

struct http_case {
	const char *name;
	struct step steps[MAX_STEPS]; /* up to the first status 0 */
};

/* clang-format off */
#define ACQ(b, st, j) { .body = (b), .status = (st), .json = (j) }
#define ERR(b, st, code) { .body = (b), .status = (st), .error = (code) }

static const struct http_case cases[] = {
	{ "allowed up to the limit, then 429; keys are independent", {
		{ .body = "{'t':'basic','user':'u1'}", .status = 200,
		  .json = "{'allowed':true,'rule':'basic','limit':3,"
		  "'remaining':2,'retry_after_ms':0,'shadow':false}",
		  .rkey = "basic:{u1}", .units = 1 },
		ACQ("{'t':'basic','user':'u1'}", 200,
		    "{'rule':'basic','remaining':1}"),
		{ .body = "{'t':'basic','user':'u1'}", .status = 200,
		  .json = "{'rule':'basic','limit':3,'remaining':0}",
		  .rkey = "basic:{u1}", .units = 3 },
		/* the first unit expires in about a minute */
		{ .body = "{'t':'basic','user':'u1'}", .status = 429,
		  .json = "{'allowed':false,'rule':'basic','limit':3,"
		  "'remaining':0,'shadow':false}",
		  .min_retry_ms = 50000,
		  .rkey = "basic:{u1}", .units = 3 },
		{ .body = "{'t':'basic','user':'u1'}", .status = 429,
		  .json = "{'allowed':false,'rule':'basic'}",
		  .rkey = "basic:{u1}", .units = 3 },
		{ .body = "{'t':'basic','user':'u2'}", .status = 200,
		  .json = "{'allowed':true,'rule':'basic','remaining':2}",
		  .rkey = "basic:{u2}", .units = 1 },
	} },
	{ "no rule applies: allowed, nulls, no RateLimit headers", {
		ACQ("{'t':'none'}", 200, "{'allowed':true,'rule':null,"
		    "'limit':null,'remaining':null}"),
		ACQ("{}", 200, "{'allowed':true,'rule':null,'limit':null,"
		    "'remaining':null}"),
		ACQ("{'user':'u1','n':3,'b':false}", 200,
		    "{'allowed':true,'rule':null}"),
	} },
	/* On Redis the 2nd request's denial goes to the deny cache; the
	 * 5th has it there for dshort only, and dlong, which the cache
	 * knows nothing of, denies it for longer: the answer is dlong's,
	 * as the store (and the memory store) give it. */
	{ "a denial remembered for one rule does not answer for another", {
		ACQ("{'ds':'y','dl':'y','user':'d1'}", 200,
		    "{'rule':'dshort','remaining':0}"),
		ACQ("{'ds':'y','dl':'y','user':'d1'}", 429,
		    "{'rule':'dshort','remaining':0}"),
		ACQ("{'dl':'y','user':'d1'}", 200,
		    "{'rule':'dlong','remaining':1}"),
		ACQ("{'dl':'y','user':'d1'}", 200,
		    "{'rule':'dlong','remaining':0}"),
		{ .body = "{'ds':'y','dl':'y','user':'d1'}", .status = 429,
		  .json = "{'allowed':false,'rule':'dlong','limit':3,"
		  "'remaining':0}", .min_retry_ms = 50000 },
	} },
	{ "one counter for a rule without key", {
		{ .body = "{'t':'nokey','user':'a'}", .status = 200,
		  .json = "{'rule':'nokey','limit':2,'remaining':1}",
		  .rkey = "nokey:{}", .units = 1 },
		ACQ("{'t':'nokey','user':'b'}", 200,
		    "{'rule':'nokey','remaining':0}"),
		ACQ("{'t':'nokey','user':'c'}", 429,
		    "{'rule':'nokey','remaining':0}"),
	} },
	{ "rule forcing evaluates that rule only, skipping match", {
		{ .body = "{'rule':'basic','user':'f1'}", .status = 200,
		  .json = "{'rule':'basic','remaining':2}",
		  .rkey = "basic:{f1}", .units = 1 },
		/* t=basic would match basic; forcing nokey must skip it */
		{ .body = "{'rule':'nokey','t':'basic','user':'f1'}",
		  .status = 200,
		  .json = "{'rule':'nokey','limit':2,'remaining':1}",
		  .rkey = "basic:{f1}", .units = 1 },
		ACQ("{'rule':'basic','user':'f1','cost':0}", 200,
		    "{'rule':'basic','remaining':2}"),
		ERR("{'rule':'nope','t':'basic','user':'f1'}", 400,
		    "unknown_rule"),
		ERR("{'rule':'nope'}", 400, "unknown_rule"),
		{ .body = "{'rule':'basic','user':'f1','cost':0}",
		  .status = 200, .json = "{'rule':'basic','remaining':2}",
		  .rkey = "basic:{f1}", .units = 1 },
	} },
	{ "cost: units, cost 0 only reports, bad costs", {
		{ .body = "{'t':'cost','user':'c1','cost':0}", .status = 200,
		  .json = "{'allowed':true,'rule':'cost','limit':5,"
		  "'remaining':5}", .rkey = "cost:{c1}", .units = 0 },
		{ .body = "{'t':'cost','user':'c1','cost':2}", .status = 200,
		  .json = "{'rule':'cost','remaining':3}",
		  .rkey = "cost:{c1}", .units = 2 },
		ACQ("{'t':'cost','user':'c1','cost':0}", 200,
		    "{'rule':'cost','remaining':3}"),
		{ .body = "{'t':'cost','user':'c1','cost':4}", .status = 429,
		  .json = "{'allowed':false,'rule':'cost','remaining':3}",
		  .rkey = "cost:{c1}", .units = 2 },
		{ .body = "{'t':'cost','user':'c1','cost':3}", .status = 200,
		  .json = "{'rule':'cost','remaining':0}",
		  .rkey = "cost:{c1}", .units = 5 },
		ACQ("{'t':'cost','user':'c1','cost':0}", 200,
		    "{'allowed':true,'rule':'cost','remaining':0}"),
		ERR("{'t':'cost','user':'c1','cost':6}", 400,
		    "cost_exceeds_limit"),
		ERR("{'t':'cost','user':'c1','cost':-1}", 400,
		    "invalid_cost"),
		ERR("{'t':'cost','user':'c1','cost':1.5}", 400,
		    "invalid_cost"),
		ERR("{'t':'cost','user':'c1','cost':'2'}", 400,
		    "invalid_cost"),
		{ .body = "{'t':'cost','user':'c1','cost':5}", .status = 429,
		  .json = "{'allowed':false,'rule':'cost','remaining':0}",
		  .rkey = "cost:{c1}", .units = 5 },
	} },
	{ "a repeated denial says what is left, as the store did", {
		/* with Redis the third and later denials come from the deny
		 * cache (docs/operations.md): the same remaining, 1 */
		ACQ("{'t':'cost','user':'dc','cost':2}", 200,
		    "{'rule':'cost','remaining':3}"),
		ACQ("{'t':'cost','user':'dc','cost':2}", 200,
		    "{'rule':'cost','remaining':1}"),
		{ .body = "{'t':'cost','user':'dc','cost':2}", .status = 429,
		  .json = "{'rule':'cost','remaining':1}",
		  .rkey = "cost:{dc}", .units = 4 },
		ACQ("{'t':'cost','user':'dc','cost':2}", 429,
		    "{'rule':'cost','remaining':1}"),
		{ .body = "{'t':'cost','user':'dc','cost':2}", .status = 429,
		  .json = "{'rule':'cost','remaining':1}",
		  .rkey = "cost:{dc}", .units = 4 },
	} },
	{ "the rule's default cost", {
		{ .body = "{'t':'dcost'}", .status = 200,
		  .json = "{'rule':'dcost','limit':6,'remaining':3}",
		  .rkey = "dcost:{}", .units = 3 },
		ACQ("{'t':'dcost'}", 200, "{'rule':'dcost','remaining':0}"),
		{ .body = "{'t':'dcost'}", .status = 429,
		  .json = "{'rule':'dcost','remaining':0}",
		  .rkey = "dcost:{}", .units = 6 },
		ACQ("{'t':'dcost','cost':0}", 200,
		    "{'allowed':true,'rule':'dcost','remaining':0}"),
		ERR("{'t':'dcost','cost':7}", 400, "cost_exceeds_limit"),
	} },
	{ "bad input is refused, records nothing, the daemon goes on", {
		{ .body = "{'t':'basic','user':'e1'}", .status = 200,
		  .json = "{'rule':'basic','remaining':2}",
		  .rkey = "basic:{e1}", .units = 1 },
		ERR("not json", 400, "invalid_json"),
		ERR("{'t':'basic','user':'e1'", 400, "invalid_json"),
		ERR("{'t':'basic','user':'e1','x':{'a':1}}", 400,
		    "invalid_attribute"),
		ERR("{'t':'basic','user':'e1','x':[1,2]}", 400,
		    "invalid_attribute"),
		ERR("{'t':'basic','user':'e1','cost':-3}", 400,
		    "invalid_cost"),
		{ .method = "GET", .status = 405,
		  .error = "method_not_allowed" },
		{ .method = "PUT", .body = "{'t':'basic','user':'e1'}",
		  .status = 405, .error = "method_not_allowed" },
		{ .method = "GET", .path = "/nope", .status = 404,
		  .error = "not_found" },
		{ .path = "/acquire/x", .body = "{'t':'basic','user':'e1'}",
		  .status = 404, .error = "not_found" },
		{ .body = "{'t':'basic','user':'e1'}", .status = 200,
		  .json = "{'rule':'basic','remaining':1}",
		  .rkey = "basic:{e1}", .units = 2 },
	} },
	{ "an error quoting text that is not UTF-8 keeps its status", {
		/* docs/http.md, Errors: the message is made valid UTF-8
		 * (a byte that is not becomes U+FFFD), so the answer stays
		 * the 400 or 404 it is rather than a 500 */
		{ .method = "GET", .path = "/%ff", .status = 404,
		  .error = "not_found" },
		{ .method = "GET", .path = "/%c3%a9%e9", .status = 404,
		  .error = "not_found" },
		/* the attribute name is quoted up to 64 bytes: cut inside
		 * the 2-byte é */
		ERR("{'#63#\xc3\xa9':[1]}", 400, "invalid_attribute"),
		/* the rule name is quoted into a 256-byte message */
		ERR("{'rule':'#231#"
		    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"
		    "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9'}",
		    400, "unknown_rule"),
		{ .body = "{'t':'basic','user':'u8'}", .status = 200,
		  .json = "{'rule':'basic','remaining':2}",
		  .rkey = "basic:{u8}", .units = 1 },
	} },
	{ "JSON edges: null reserved fields, numbers past jansson, leases", {
		/* null is absent for the reserved fields too (docs/http.md) */
		{ .body = "{'t':'cost','user':'n1','cost':null}",
		  .status = 200, .json = "{'rule':'cost','remaining':4}",
		  .rkey = "cost:{n1}", .units = 1 },
		ACQ("{'t':'cost','user':'n1','wait_ms':null}", 200,
		    "{'rule':'cost','remaining':3}"),
		ACQ("{'t':'cost','user':'n1','rule':null}", 200,
		    "{'rule':'cost','remaining':2}"),
		/* a number jansson cannot hold is no JSON it reads */
		ERR("{'t':'cost','user':'n1','cost':99999999999999999999}",
		    400, "invalid_json"),
		ERR("{'t':'cost','user':'n1','x':1e400}", 400,
		    "invalid_json"),
		/* an empty body is {}: no lease */
		{ .path = "/release", .status = 400, .error = "invalid_lease" },
		{ .path = "/renew", .status = 400, .error = "invalid_lease" },
		{ .path = "/release", .body = "{'lease':'a','lease':'b'}",
		  .status = 400, .error = "invalid_json" },
		{ .path = "/renew", .body = "{'lease':'a','lease':'b'}",
		  .status = 400, .error = "invalid_json" },
		{ .body = "{'t':'cost','user':'n1'}", .status = 200,
		  .json = "{'rule':'cost','remaining':1}",
		  .rkey = "cost:{n1}", .units = 4 },
	} },
	{ "max_body_bytes: 1024 bytes pass, 1025 are 413", {
		{ .body = "{'t':'none','pad':'#1003#'}", .body_len = 1024,
		  .status = 200, .json = "{'allowed':true,'rule':null}" },
		{ .body = "{'t':'none','pad':'#1004#'}", .body_len = 1025,
		  .status = 413, .error = "body_too_large" },
		ERR("{'t':'none','pad':'#65536#'}", 413, "body_too_large"),
		ERR("{'t':'basic','user':'b1','pad':'#1100#'}", 413,
		    "body_too_large"),
		{ .body = "{'t':'basic','user':'b1'}", .status = 200,
		  .json = "{'rule':'basic','remaining':2}",
		  .rkey = "basic:{b1}", .units = 1 },
	} },
	{ "a rendered key of 512 bytes is fine, 513 is key_too_long", {
		ERR("{'t':'ip','ip':'#513#'}", 400, "key_too_long"),
		{ .body = "{'t':'ip','ip':'#512#'}", .status = 200,
		  .json = "{'rule':'ip','remaining':0}",
		  .rkey = "ip:{#512#}", .units = 1 },
		ACQ("{'t':'ip','ip':'#512#'}", 429, "{'rule':'ip'}"),
	} },
	{ "key templates: one counter per value; missing => no rule", {
		{ .body = "{'t':'ip','ip':'10.0.0.1'}", .status = 200,
		  .json = "{'rule':'ip','limit':1,'remaining':0}",
		  .rkey = "ip:{10.0.0.1}", .units = 1 },
		ACQ("{'t':'ip','ip':'10.0.0.1'}", 429,
		    "{'rule':'ip','remaining':0}"),
		{ .body = "{'t':'ip','ip':'10.0.0.2'}", .status = 200,
		  .json = "{'rule':'ip','remaining':0}",
		  .rkey = "ip:{10.0.0.2}", .units = 1 },
		ACQ("{'t':'ip'}", 200, "{'allowed':true,'rule':null}"),
		ACQ("{'t':'ip','ip':'10.0.0.2'}", 429, "{'rule':'ip'}"),
		{ .body = "{'t':'pair','user':'a','ip':'1'}", .status = 200,
		  .json = "{'rule':'pair','remaining':0}",
		  .rkey = "pair:{u=a/i=1}", .units = 1 },
		{ .body = "{'t':'pair','user':'a','ip':'2'}", .status = 200,
		  .json = "{'rule':'pair','remaining':0}",
		  .rkey = "pair:{u=a/i=2}", .units = 1 },
		ACQ("{'t':'pair','user':'a','ip':'1'}", 429,
		    "{'rule':'pair'}"),
		ACQ("{'t':'pair','user':'a'}", 200,
		    "{'allowed':true,'rule':null}"),
		/* integers and booleans are attributes too */
		{ .body = "{'t':'pair','user':7,'ip':true}", .status = 200,
		  .json = "{'rule':'pair','remaining':0}",
		  .rkey = "pair:{u=7/i=true}", .units = 1 },
	} },
	{ "match: exact, glob and regex patterns, whole value", {
		ACQ("{'path':'/exact'}", 200, "{'rule':'r-exact'}"),
		ACQ("{'path':'/exact/'}", 200, "{'rule':null}"),
		ACQ("{'path':'/EXACT'}", 200, "{'rule':null}"),
		ACQ("{'path':'/glob/a/b/xy'}", 200, "{'rule':'r-glob'}"),
		ACQ("{'path':'/glob/a/x'}", 200, "{'rule':null}"),
		ACQ("{'path':'/glob/a/xyz'}", 200, "{'rule':null}"),
		ACQ("{'path':'/v12/login'}", 200, "{'rule':'r-regex'}"),
		ACQ("{'path':'/v/login'}", 200, "{'rule':null}"),
		ACQ("{'path':'/v1/login/x'}", 200, "{'rule':null}"),
		ACQ("{'code':'ab123cd'}", 200, "{'rule':'r-search'}"),
		ACQ("{'code':'ab12cd'}", 200, "{'rule':null}"),
	} },
	{ "match: every entry must match; integer and boolean values", {
		ACQ("{'method':'POST','path':'/multi/1'}", 200,
		    "{'rule':'r-multi','limit':100,'remaining':99}"),
		ACQ("{'path':'/multi/1'}", 200, "{'rule':null}"),
		ACQ("{'method':'GET','path':'/multi/1'}", 200,
		    "{'rule':null}"),
		ACQ("{'tier':7}", 200, "{'rule':'r-int'}"),
		ACQ("{'tier':'7'}", 200, "{'rule':'r-int'}"),
		ACQ("{'tier':77}", 200, "{'rule':null}"),
		ACQ("{'vip':true}", 200, "{'rule':'r-bool'}"),
		ACQ("{'vip':false}", 200, "{'rule':null}"),
	} },
	{ "all or nothing: a denial by one rule records in no rule", {
		/* the deciding rule is the one with the least remaining */
		{ .body = "{'t':'aon','user':'a1'}", .status = 200,
		  .json = "{'rule':'aon-narrow','remaining':0}",
		  .rkey = "aon-wide:{a1}", .units = 1 },
		{ .body = "{'t':'aon','user':'a1'}", .status = 429,
		  .json = "{'allowed':false,'rule':'aon-narrow'}",
		  .rkey = "aon-wide:{a1}", .units = 1 },
		ACQ("{'t':'aon','user':'a1'}", 429,
		    "{'allowed':false,'rule':'aon-narrow'}"),
		{ .body = "{'rule':'aon-wide','user':'a1','cost':0}",
		  .status = 200,
		  .json = "{'rule':'aon-wide','limit':5,'remaining':4}",
		  .rkey = "aon-wide:{a1}", .units = 1 },
		{ .body = "{'rule':'aon-narrow','user':'a1','cost':0}",
		  .status = 200,
		  .json = "{'rule':'aon-narrow','limit':1,'remaining':0}",
		  .rkey = "aon-narrow:{a1}", .units = 1 },
	} },
	{ "shadow: never denies; a would-be denial records nothing", {
		{ .body = "{'t':'shadow','user':'s1','cost':2}", .status = 200,
		  .json = "{'allowed':true,'rule':'shadow','shadow':true,"
		  "'limit':3,'remaining':1}",
		  .rkey = "shadow:{s1}", .units = 2 },
		{ .body = "{'t':'shadow','user':'s1','cost':2}", .status = 200,
		  .json = "{'allowed':true,'rule':'shadow','shadow':true,"
		  "'remaining':1,'retry_after_ms':0}",
		  .rkey = "shadow:{s1}", .units = 2 },
		ACQ("{'rule':'shadow','user':'s1','cost':0}", 200,
		    "{'rule':'shadow','remaining':1}"),
		{ .body = "{'t':'shadow','user':'s1','cost':1}", .status = 200,
		  .json = "{'allowed':true,'rule':'shadow','remaining':0}",
		  .rkey = "shadow:{s1}", .units = 3 },
		{ .body = "{'t':'shadow','user':'s1'}", .status = 200,
		  .json = "{'allowed':true,'rule':'shadow','shadow':true}",
		  .rkey = "shadow:{s1}", .units = 3 },
	} },
	{ "shadow beside a real rule: only the real rule denies", {
		{ .body = "{'t':'mix','user':'m'}", .status = 200,
		  .json = "{'allowed':true}",
		  .rkey = "shadow2:{m}", .units = 1 },
		{ .body = "{'t':'mix','user':'m'}", .status = 200,
		  .json = "{'allowed':true}",
		  .rkey = "shadow2:{m}", .units = 1 },
		{ .body = "{'rule':'mixreal','user':'m','cost':0}",
		  .status = 200, .json = "{'rule':'mixreal','remaining':1}",
		  .rkey = "mixreal:{m}", .units = 2 },
		ACQ("{'t':'mix','user':'m'}", 200, "{'allowed':true}"),
		{ .body = "{'t':'mix','user':'m'}", .status = 429,
		  .json = "{'allowed':false,'rule':'mixreal','shadow':false,"
		  "'remaining':0}",
		  .rkey = "mixreal:{m}", .units = 3 },
	} },
	{ "health and readiness", {
		{ .method = "GET", .path = "/healthz", .status = 200,
		  .text = "ok" },
		{ .method = "GET", .path = "/readyz", .status = 200 },
	} },
};
/* clang-format on */

#define NCASES ((int)(sizeof(cases) / sizeof(cases[0])))

/* ' becomes ", and #N# becomes N letters a.  Caller frees. */
static char *
expand(const char *src, size_t *lenp)
{
	size_t cap = strlen(src) + 1, n = 0;
	char *out = malloc(cap), *end;
	const char *p;

	ck_assert(out != NULL);
	for (p = src; *p != '\0'; p++) {
		size_t rep = 1;
		char c = *p == '\'' ? '"' : *p;

		if (*p == '#') {
			rep = strtoul(p + 1, &end, 10);
			ck_assert_msg(*end == '#', "bad #N# in %s", src);
			p = end;
			c = 'a';
		}
		if (n + rep + 1 > cap) {
			cap = (n + rep + 1) * 2;
			out = realloc(out, cap);
			ck_assert(out != NULL);
		}
		memset(out + n, c, rep);
		n += rep;
	}
	out[n] = '\0';
	if (lenp != NULL)
		*lenp = n;
	return out;
}

static long long
window_ms_of(const char *rule)
{
	size_t i;

	for (i = 0; i < sizeof(windows) / sizeof(windows[0]); i++)
		if (strcmp(windows[i].name, rule) == 0)
			return windows[i].window_ms;
	ck_abort_msg(
	    "the answer names rule \"%s\", which is not in the "
	    "config",
	    rule);
	return 0;
}

static const char *
or_none(const char *s)
{
	return s != NULL ? s : "(none)";
}

static long long
ceil_s(long long ms)
{
	return ms <= 0 ? 0 : (ms + 999) / 1000;
}

static void
start_daemon(struct h_daemon *d)
{
	char yaml[8192];

	snprintf(yaml, sizeof(yaml), "%s%s",
	    use_redis ? redis_head : memory_head, rules_yaml);
	h_daemon_start(d, yaml);
}

static bool
is_json_type(const struct h_resp *r)
{
	const char *ct = h_resp_header(r, "Content-Type");

	return ct != NULL && strncasecmp(ct, "application/json", 16) == 0;
}

/* The headers and bounds every decision must satisfy (see the top). */
static void
check_decision(struct h_resp *r, const char *ctx)
{
	json_t *j = h_json(r), *rule, *allowed, *degraded;
	static const char *const rl_headers[] = { "RateLimit-Policy",
		"RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining",
		"X-RateLimit-Reset" };
	const char *retry_hdr = h_resp_header(r, "Retry-After");
	char want[640];
	size_t i;

	ck_assert_msg(json_is_object(j),
	    "%s: answer is not a JSON object: "
	    "%s",
	    ctx, r->body);
	ck_assert_msg(is_json_type(r),
	    "%s: Content-Type is %s, expected "
	    "application/json",
	    ctx, or_none(h_resp_header(r, "Content-Type")));
	allowed = json_object_get(j, "allowed");
	ck_assert_msg(json_is_boolean(allowed) &&
		json_is_true(allowed) == (r->status == 200),
	    "%s: status %ld but allowed is %s", ctx, r->status,
	    allowed ? (json_is_true(allowed) ? "true" : "false/other") :
		      "absent");
	degraded = json_object_get(j, "degraded");
	ck_assert_msg(!json_is_true(degraded), "%s: degraded answer: %s", ctx,
	    r->body);
	rule = json_object_get(j, "rule");
	ck_assert_msg(rule != NULL, "%s: no \"rule\" field: %s", ctx, r->body);
	if (json_is_null(rule)) {
		ck_assert_msg(r->status == 200,
		    "%s: no rule but status "
		    "%ld",
		    ctx, r->status);
		ck_assert_msg(json_is_null(json_object_get(j, "limit")) &&
			json_is_null(json_object_get(j, "remaining")),
		    "%s: no rule, but limit/remaining are not null: %s", ctx,
		    r->body);
		for (i = 0; i < sizeof(rl_headers) / sizeof(*rl_headers); i++)
			ck_assert_msg(h_resp_header(r, rl_headers[i]) == NULL,
			    "%s: no rule applies, but %s: %s is sent", ctx,
			    rl_headers[i], h_resp_header(r, rl_headers[i]));
		ck_assert_msg(retry_hdr == NULL, "%s: Retry-After on a 200",
		    ctx);
		return;
	}
	ck_assert_msg(json_is_string(rule),
	    "%s: rule is neither a string "
	    "nor null: %s",
	    ctx, r->body);
	{
		const char *name = json_string_value(rule);
		long long win = window_ms_of(name);
		long long limit = h_json_int(r, "limit");
		long long remaining = h_json_int(r, "remaining");
		long long reset = h_json_int(r, "reset_ms");
		long long retry = h_json_int(r, "retry_after_ms");
		const char *v;

		ck_assert_msg(json_is_boolean(json_object_get(j, "shadow")),
		    "%s: \"shadow\" is not a boolean: %s", ctx, r->body);
		ck_assert_msg(remaining >= 0 && remaining <= limit,
		    "%s: remaining %lld outside [0, %lld]", ctx, remaining,
		    limit);
		ck_assert_msg(reset >= 0 && reset <= win,
		    "%s: reset_ms %lld "
		    "outside [0, window %lld]",
		    ctx, reset, win);
		if (r->status == 200)
			ck_assert_msg(retry == 0,
			    "%s: allowed but "
			    "retry_after_ms is %lld",
			    ctx, retry);
		else
			ck_assert_msg(retry >= 1 && retry <= win,
			    "%s: denied"
			    " but retry_after_ms %lld outside [1, %lld]",
			    ctx, retry, win);

		snprintf(want, sizeof(want), "\"%s\";q=%lld;w=%lld", name,
		    limit, win / 1000);
		v = h_resp_header(r, "RateLimit-Policy");
		ck_assert_msg(v != NULL && strcmp(v, want) == 0,
		    "%s: RateLimit-Policy: expected %s, got %s", ctx, want,
		    or_none(v));
		/* t, the effective window (docs/http.md): the whole window
		 * when nothing is used, else when quota comes back: no later
		 * than the whole limit (reset) and no later than a denial's
		 * Retry-After. */
		snprintf(want, sizeof(want), "\"%s\";r=%lld;t=", name,
		    remaining);
		v = h_resp_header(r, "RateLimit");
		ck_assert_msg(v != NULL && strncmp(v, want, strlen(want)) == 0,
		    "%s: RateLimit: expected %s..., got %s", ctx, want,
		    or_none(v));
		{
			long long t = atoll(v + strlen(want));

			if (remaining == limit)
				ck_assert_msg(t == ceil_s(win),
				    "%s: RateLimit "
				    "%s: nothing used, t is not the window",
				    ctx, v);
			else
				ck_assert_msg(t >= 1 && t <= ceil_s(reset) &&
					(r->status == 200 ||
					    t <= ceil_s(retry)),
				    "%s: RateLimit %s: t outside [1, reset "
				    "%lld s] or after the retry (%lld ms)",
				    ctx, v, ceil_s(reset), retry);
		}
		snprintf(want, sizeof(want), "%lld", limit);
		v = h_resp_header(r, "X-RateLimit-Limit");
		ck_assert_msg(v != NULL && strcmp(v, want) == 0,
		    "%s: X-RateLimit-Limit: expected %s, got %s", ctx, want,
		    or_none(v));
		snprintf(want, sizeof(want), "%lld", remaining);
		v = h_resp_header(r, "X-RateLimit-Remaining");
		ck_assert_msg(v != NULL && strcmp(v, want) == 0,
		    "%s: X-RateLimit-Remaining: expected %s, got %s", ctx, want,
		    or_none(v));
		snprintf(want, sizeof(want), "%lld", ceil_s(reset));
		v = h_resp_header(r, "X-RateLimit-Reset");
		ck_assert_msg(v != NULL && strcmp(v, want) == 0,
		    "%s: X-RateLimit-Reset: expected %s (reset_ms %lld), "
		    "got %s",
		    ctx, want, reset, or_none(v));
		if (r->status == 429) {
			snprintf(want, sizeof(want), "%lld",
			    ceil_s(retry) < 1 ? 1 : ceil_s(retry));
			ck_assert_msg(retry_hdr != NULL &&
				strcmp(retry_hdr, want) == 0,
			    "%s: Retry-After: expected %s (retry_after_ms "
			    "%lld), got %s",
			    ctx, want, retry, or_none(retry_hdr));
		} else {
			ck_assert_msg(retry_hdr == NULL,
			    "%s: Retry-After: %s"
			    " on a 200",
			    ctx, retry_hdr);
		}
	}
}

static void
check_error(struct h_resp *r, const char *code, const char *ctx)
{
	json_t *j = h_json(r);
	const char *err = h_json_str(r, "error");
	const char *msg = h_json_str(r, "message");

	ck_assert_msg(json_is_object(j),
	    "%s: error body is not a JSON "
	    "object: %s",
	    ctx, r->body);
	ck_assert_msg(err != NULL && msg != NULL && *msg != '\0',
	    "%s: error body lacks \"error\" or \"message\": %s", ctx, r->body);
	ck_assert_msg(strcmp(code, "*") == 0 || strcmp(err, code) == 0,
	    "%s: error \"%s\", expected \"%s\" (body %s)", ctx, err, code,
	    r->body);
	ck_assert_msg(is_json_type(r),
	    "%s: Content-Type is %s, expected "
	    "application/json",
	    ctx, or_none(h_resp_header(r, "Content-Type")));
}

static void
check_subset(struct h_resp *r, const char *expected, const char *ctx)
{
	char *text = expand(expected, NULL);
	json_error_t e;
	json_t *want = json_loads(text, 0, &e), *got = h_json(r), *v;
	const char *k;

	ck_assert_msg(want != NULL, "bad expected JSON %s: %s", text, e.text);
	json_object_foreach(want, k, v)
	{
		json_t *g = json_is_object(got) ? json_object_get(got, k) :
						  NULL;
		char *ws = json_dumps(v, JSON_ENCODE_ANY);
		char *gs = g ? json_dumps(g, JSON_ENCODE_ANY) : NULL;

		ck_assert_msg(g != NULL && json_equal(g, v),
		    "%s: \"%s\" expected %s, got %s (body %s)", ctx, k, ws,
		    gs ? gs : "(absent)", r->body);
		free(ws);
		free(gs);
	}
	json_decref(want);
	free(text);
}

static void
check_redis_key(const struct step *s, const char *ctx)
{
	char *rkey = expand(s->rkey, NULL);
	char key[1024], rule[64];
	long long units, pttl;
	size_t rl = strcspn(rkey, ":");

	snprintf(key, sizeof(key), "%s%s", KEY_PREFIX, rkey);
	snprintf(rule, sizeof(rule), "%.*s", (int)rl, rkey);
	units = h_redis_log_units(&h_shared_redis, key);
	ck_assert_msg(units == s->units,
	    "%s: %s holds %lld units, expected "
	    "%lld",
	    ctx, key, units, s->units);
	if (s->units > 0) {
		/* W, and up to W / 8 more (docs/algorithms.md, sliding_log) */
		long long w = window_ms_of(rule), most = w + (w + 7) / 8;

		pttl = h_redis_int(&h_shared_redis, "PTTL %s", key);
		ck_assert_msg(pttl > 0 && pttl <= most,
		    "%s: PTTL %s is %lld, expected in (0, %lld]", ctx, key,
		    pttl, most);
	}
	free(rkey);
}

static void
run_step(const struct step *s, int n, const char *name)
{
	const char *method = s->method ? s->method : "POST";
	const char *path = s->path ? s->path : "/acquire";
	struct h_daemon *d = h_daemon_current();
	struct h_resp r = { 0 }, hz = { 0 };
	bool is_error = s->status >= 400 && s->status != 429;
	long long dbsize = 0, scripts = 0;
	size_t len = 0;
	char *body = s->body ? expand(s->body, &len) : NULL;
	char ctx[400];
	CURL *c;

	snprintf(ctx, sizeof(ctx), "[%s] case \"%s\", step %d, %s %s %.100s%s",
	    use_redis ? "redis" : "memory", name, n + 1, method, path,
	    body ? body : "", len > 100 ? "..." : "");
	if (s->body_len != 0)
		ck_assert_msg(len == s->body_len,
		    "%s: the table's body is "
		    "%zu bytes, meant %zu",
		    ctx, len, s->body_len);
	if (use_redis) {
		dbsize = h_redis_int(&h_shared_redis, "DBSIZE");
		scripts = h_redis_script_calls(&h_shared_redis);
	}
	c = h_curl_new();
	ck_assert_msg(h_request(c, d->port, &r, method, path, body, len,
			  NULL) == 0,
	    "%s: %s", ctx, r.err);
	curl_easy_cleanup(c);
	ck_assert_msg(r.status == s->status,
	    "%s: status %ld, expected %d "
	    "(body %s)",
	    ctx, r.status, s->status, r.body);

	if (strcmp(path, "/acquire") == 0 && !is_error) {
		check_decision(&r, ctx);
		/* An admission by a rule asks Redis: this is what makes "no
		 * new script calls" after an error mean something.  (A
		 * repeated denial may come from the deny cache.) */
		if (use_redis && json_is_string(h_json_get(&r, "rule")) &&
		    r.status == 200)
			ck_assert_msg(h_redis_script_calls(&h_shared_redis) >
				scripts,
			    "%s: decided by a rule, but no script ran in "
			    "Redis",
			    ctx);
	}
	if (s->json != NULL)
		check_subset(&r, s->json, ctx);
	if (s->min_retry_ms > 0)
		ck_assert_msg(h_json_int(&r, "retry_after_ms") >=
			s->min_retry_ms,
		    "%s: retry_after_ms %lld, expected at "
		    "least %lld",
		    ctx, h_json_int(&r, "retry_after_ms"), s->min_retry_ms);
	if (s->text != NULL) {
		size_t tl = strlen(s->text);

		ck_assert_msg(r.len >= tl && memcmp(r.body, s->text, tl) == 0 &&
			(r.len == tl ||
			    (r.len == tl + 1 && r.body[tl] == '\n')),
		    "%s: body \"%s\", expected \"%s\"", ctx, r.body, s->text);
	}
	if (is_error) {
		check_error(&r, s->error ? s->error : "*", ctx);
		if (use_redis) {
			long long db2 = h_redis_int(&h_shared_redis, "DBSIZE");
			long long sc2 = h_redis_script_calls(&h_shared_redis);

			ck_assert_msg(db2 == dbsize,
			    "%s: touched Redis: "
			    "DBSIZE %lld -> %lld",
			    ctx, dbsize, db2);
			ck_assert_msg(sc2 == scripts,
			    "%s: touched Redis: "
			    "%lld script calls",
			    ctx, sc2 - scripts);
		}
		h_http(&hz, "GET", "/healthz", NULL, NULL);
		ck_assert_msg(hz.status == 200,
		    "%s: /healthz answers %ld "
		    "afterwards",
		    ctx, hz.status);
	}
	if (use_redis && s->rkey != NULL)
		check_redis_key(s, ctx);
	h_resp_free(&r);
	h_resp_free(&hz);
	free(body);
}

START_TEST(test_case_table)
{
	const struct http_case *tc = &cases[_i];
	struct h_daemon d = { 0 };
	int n;

	start_daemon(&d);
	for (n = 0; n < MAX_STEPS && tc->steps[n].status != 0; n++)
		run_step(&tc->steps[n], n, tc->name);
	h_daemon_stop(&d);
}
END_TEST

/* --- tests that do not fit the table ------------------------------------ */

/* Each decision that asked Redis is timed through its phases in the daemon
 * (docs/operations.md, ratelimitd_request_phase_seconds): prepare, queue,
 * store and resume each count it once; a decision the memory store makes
 * inline counts in none.  A 429 from the store counts too; a request
 * refused before any decision (400) does not. */
START_TEST(test_phase_metrics)
{
	static const char *const names[] = {
		"ratelimitd_request_phase_seconds_count{phase=\"prepare\"}",
		"ratelimitd_request_phase_seconds_count{phase=\"queue\"}",
		"ratelimitd_request_phase_seconds_count{phase=\"store\"}",
		"ratelimitd_request_phase_seconds_count{phase=\"resume\"}",
	};
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long long want = use_redis ? 4 : 0;
	int i;

	start_daemon(&d);
	for (i = 0; i < 4; i++) {
		h_post(d.port, "/acquire", "{\"t\":\"basic\",\"user\":\"ph\"}",
		    &r);
		ck_assert_int_eq(r.status, i < 3 ? 200 : 429);
		h_resp_free(&r);
	}
	h_post(d.port, "/acquire", "{\"t\":", &r);
	ck_assert_int_eq(r.status, 400);
	h_resp_free(&r);
	for (i = 0; i < 4; i++)
		ck_assert_msg(h_metric_settles(names[i], want) == want,
		    "%s: %lld, want %lld", names[i], h_metric(names[i]), want);
	if (use_redis)
		ck_assert_int_ge(
		    h_metric("ratelimitd_request_phase_seconds_"
			     "bucket{phase=\"store\",le=\"+Inf\"}"),
		    4);
	h_daemon_stop(&d);
}
END_TEST

/* Several /acquire requests on one handle share one connection, 429s
 * included: a proxy asks for every request it forwards. */
START_TEST(test_keepalive)
{
	static const struct {
		const char *method, *path, *body;
		long status;
	} seq[] = {
		{ "POST", "/acquire", "{\"t\":\"keep\",\"user\":\"k\"}", 200 },
		{ "POST", "/acquire", "{\"t\":\"keep\",\"user\":\"k\"}", 200 },
		{ "POST", "/acquire", "{\"t\":\"keep\",\"user\":\"k\"}", 429 },
		{ "POST", "/acquire", "{\"t\":\"none\"}", 200 },
		{ "POST", "/acquire", "{\"t\":\"keep\",\"user\":\"k\"}", 429 },
	};
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	CURL *c;
	size_t i;

	start_daemon(&d);
	c = h_curl_new();
	for (i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
		ck_assert_msg(h_request(c, d.port, &r, seq[i].method,
				  seq[i].path, seq[i].body,
				  seq[i].body ? strlen(seq[i].body) : 0,
				  NULL) == 0,
		    "request %zu: %s", i + 1, r.err);
		ck_assert_msg(r.status == seq[i].status,
		    "request %zu: "
		    "status %ld, expected %ld",
		    i + 1, r.status, seq[i].status);
		ck_assert_msg(r.num_connects == (i == 0 ? 1 : 0),
		    "request %zu (%s %s, after a %ld): %ld new connections, "
		    "expected %d: the connection was not kept alive",
		    i + 1, seq[i].method, seq[i].path,
		    i ? seq[i - 1].status : 0L, r.num_connects, i == 0 ? 1 : 0);
	}
	h_resp_free(&r);
	curl_easy_cleanup(c);
	h_daemon_stop(&d);
}
END_TEST

static void
acquire_slide(long status, const char *what, long long retry_lo,
    long long retry_hi, long long want_t)
{
	struct h_resp r = { 0 };
	long long retry;
	char want[64];

	h_http(&r, "POST", "/acquire", "{\"t\":\"slide\"}", NULL);
	ck_assert_msg(r.status == status,
	    "%s: status %ld, expected %ld "
	    "(body %s)",
	    what, r.status, status, r.body);
	check_decision(&r, what);
	snprintf(want, sizeof(want), "\"slide\";r=%lld;t=%lld",
	    h_json_int(&r, "remaining"), want_t);
	ck_assert_msg(strcmp(or_none(h_resp_header(&r, "RateLimit")), want) ==
		0,
	    "%s: RateLimit: %s, expected %s", what,
	    or_none(h_resp_header(&r, "RateLimit")), want);
	if (status == 429) {
		retry = h_json_int(&r, "retry_after_ms");
		ck_assert_msg(retry >= retry_lo && retry <= retry_hi,
		    "%s: retry_after_ms %lld, expected in [%lld, %lld]", what,
		    retry, retry_lo, retry_hi);
	}
	h_resp_free(&r);
}

/*
 * limit 2, window 2 s.  The first request goes 100 ms after an even
 * wall-clock second (Redis TIME and the daemon's clock are this host's), so
 * a fixed window (windows start at multiples of 2 s) would put A and B in
 * one window and C and D in the next, and allow D.  A sliding log admits C
 * (A has expired) and denies D (B is still in the window):
 *	t=0.0 A 200    t=1.2 B 200, X 429 (retry ~800 ms)
 *	t=2.4 C 200 (A gone at 2.0), D 429 (B holds until 3.2: retry ~800 ms)
 * Every decision is at least 400 ms away from an expiry.  The RateLimit
 * header's t is when a unit comes back (the oldest leaving), not when the
 * whole limit does: 2 s after A, then 1 s (0.8 s until A leaves at 2.0,
 * and until B leaves at 3.2), where the whole limit is free only 2 s
 * after the newest.
 */
START_TEST(test_sliding_not_fixed)
{
	struct h_daemon d = { 0 };
	struct timespec ts;
	long long t0, into;

	start_daemon(&d);
	clock_gettime(CLOCK_REALTIME, &ts);
	into = (ts.tv_sec % 2) * 1000 + ts.tv_nsec / 1000000;
	h_sleep_ms((2000 + 100 - into) % 2000);
	t0 = h_now_ms();
	acquire_slide(200, "A at 0.0 s", 0, 0, 2);
	h_sleep_ms(t0 + 1200 - h_now_ms());
	acquire_slide(200, "B at 1.2 s", 0, 0, 1);
	acquire_slide(429, "X at 1.2 s", 500, 900, 1);
	h_sleep_ms(t0 + 2400 - h_now_ms());
	acquire_slide(200, "C at 2.4 s (A has expired)", 0, 0, 1);
	acquire_slide(429, "D at 2.4 s (B is still in the window)", 500, 900,
	    1);
	ck_assert_msg(h_now_ms() - t0 < 2900,
	    "the requests were too slow "
	    "(%lld ms) for the timing to mean anything",
	    h_now_ms() - t0);
	h_daemon_stop(&d);
}
END_TEST

/*
 * The longest rule name the config takes (128 bytes) comes back whole in
 * the body and in both RateLimit headers.  The answers used to be printed
 * into fixed stack buffers: a long name was cut from the headers and the
 * body was read past its buffer.
 */
START_TEST(test_long_rule_name)
{
	static const char name[] =
	    "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn";
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	char yaml[1024], want[512];
	int i;

	snprintf(yaml, sizeof(yaml),
	    "%s"
	    "rules:\n"
	    "  - name: %s\n"
	    "    limit: 1\n"
	    "    window: 1m\n",
	    memory_head, name);
	h_daemon_start(&d, yaml);
	for (i = 0; i < 2; i++) {
		h_http(&r, "POST", "/acquire", "{}", NULL);
		ck_assert_int_eq(r.status, i == 0 ? 200 : 429);
		ck_assert_ptr_nonnull(h_json_str(&r, "rule"));
		ck_assert_str_eq(h_json_str(&r, "rule"), name);
		snprintf(want, sizeof(want), "\"%s\";q=1;w=60", name);
		ck_assert_str_eq(or_none(h_resp_header(&r, "RateLimit-Policy")),
		    want);
		snprintf(want, sizeof(want), "\"%s\";r=0;t=", name);
		ck_assert_msg(strncmp(or_none(h_resp_header(&r, "RateLimit")),
				  want, strlen(want)) == 0,
		    "RateLimit: %s", or_none(h_resp_header(&r, "RateLimit")));
		h_resp_free(&r);
	}
	h_daemon_stop(&d);
}
END_TEST

/* A 405 names the methods the endpoint takes in Allow (RFC 9110
 * 15.5.6; docs/http.md, Errors). */
START_TEST(test_bad_method_allow)
{
	static const struct {
		const char *method, *path, *allow;
	} want[] = {
		{ "GET", "/acquire", "POST" },
		{ "PUT", "/report", "POST" },
		{ "GET", "/release", "POST" },
		{ "DELETE", "/stats", "POST" },
		{ "POST", "/healthz", "GET, HEAD" },
		{ "PUT", "/metrics", "GET, HEAD" },
		{ "POST", "/readyz", "GET, HEAD" },
	};
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	size_t i;

	start_daemon(&d);
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		h_http(&r, want[i].method, want[i].path, NULL, NULL);
		ck_assert_int_eq(r.status, 405);
		ck_assert_str_eq(h_json_str(&r, "error"), "method_not_allowed");
		ck_assert_msg(h_resp_header_count(&r, "Allow") == 1 &&
			strcmp(h_resp_header(&r, "Allow"), want[i].allow) == 0,
		    "%s %s: Allow: %s, expected %s", want[i].method,
		    want[i].path, or_none(h_resp_header(&r, "Allow")),
		    want[i].allow);
		h_resp_free(&r);
	}
	h_daemon_stop(&d);
}
END_TEST

/*
 * A path with an encoded NUL is refused on every endpoint, 400
 * invalid_path, before it is routed (docs/http.md, Errors): the daemon
 * is handed the path decoded, and "/acquire%00junk" cut at the NUL would
 * be "/acquire".  The connection stays, its body read and dropped, and
 * its next request is served (and the refused one counted nowhere).
 * "%2500" (an encoded '%', then "00") is no NUL, nor is a %00 in the
 * query, which no endpoint reads.
 */
START_TEST(test_path_nul)
{
	static const char keep[] = "{\"t\":\"keep\",\"user\":\"nul\"}";
	static const struct {
		const char *method, *path, *body;
		long status;
		const char *error;   /* NULL: a decision */
		long long remaining; /* of a decision */
	} seq[] = {
		{ "POST", "/acquire%00junk", keep, 400, "invalid_path", 0 },
		{ "POST", "/acquire", keep, 200, NULL, 1 },
		{ "GET", "/auth/login%00xyz", NULL, 400, "invalid_path", 0 },
		{ "GET", "/healthz%00", NULL, 400, "invalid_path", 0 },
		{ "GET", "/readyz%00x", NULL, 400, "invalid_path", 0 },
		{ "GET", "/metrics%00", NULL, 400, "invalid_path", 0 },
		{ "POST", "/report%00", keep, 400, "invalid_path", 0 },
		{ "POST", "/record%00", keep, 400, "invalid_path", 0 },
		{ "POST", "/stats%00", keep, 400, "invalid_path", 0 },
		{ "POST", "/release%00", "{}", 400, "invalid_path", 0 },
		{ "POST", "/renew%00", "{}", 400, "invalid_path", 0 },
		{ "GET", "/acquire%00", NULL, 400, "invalid_path", 0 },
		{ "GET", "/nowhere%00", NULL, 400, "invalid_path", 0 },
		{ "POST", "/acquire%2500", keep, 404, "not_found", 0 },
		{ "POST", "/acquire?x=%00", keep, 200, NULL, 0 },
		{ "POST", "/acquire", keep, 429, NULL, 0 },
	};
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	CURL *c;
	size_t i;

	start_daemon(&d);
	c = h_curl_new();
	for (i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
		ck_assert_msg(h_request(c, d.port, &r, seq[i].method,
				  seq[i].path, seq[i].body,
				  seq[i].body ? strlen(seq[i].body) : 0,
				  NULL) == 0,
		    "%s %s: %s", seq[i].method, seq[i].path, r.err);
		ck_assert_msg(r.status == seq[i].status,
		    "%s %s: status %ld, expected %ld (body %s)", seq[i].method,
		    seq[i].path, r.status, seq[i].status, r.body);
		ck_assert_msg(r.num_connects == (i == 0 ? 1 : 0),
		    "%s %s: %ld new connections, expected %d: the connection "
		    "was not kept",
		    seq[i].method, seq[i].path, r.num_connects, i == 0 ? 1 : 0);
		if (seq[i].error != NULL) {
			ck_assert_str_eq(or_none(h_json_str(&r, "error")),
			    seq[i].error);
			if (seq[i].status == 400)
				ck_assert_str_eq(or_none(h_json_str(&r,
						     "message")),
				    "the path has an encoded NUL (%00)");
		} else if (seq[i].status == 200) {
			ck_assert_msg(h_json_int(&r, "remaining") ==
				seq[i].remaining,
			    "%s %s: remaining %lld, expected %lld",
			    seq[i].method, seq[i].path,
			    h_json_int(&r, "remaining"), seq[i].remaining);
		}
	}
	h_resp_free(&r);
	curl_easy_cleanup(c);
	h_daemon_stop(&d);
}
END_TEST

/* A \u0000 in a body is 400 invalid_json in the daemon's words (no
 * attribute holds a NUL), never in the JSON parser's, which names its own
 * flags; a field named twice is named, however long (docs/http.md).  The
 * same on /release, which reads its body apart. */
START_TEST(test_json_refusals_worded)
{
	static const struct {
		const char *path, *body, *says;
	} want[] = {
		{ "/acquire", "{\"t\":\"basic\",\"user\":\"x\\u0000y\"}",
		    "a string holds \\u0000" },
		{ "/acquire", "{\"t\":\"basic\",\"a\\u0000b\":1}",
		    "a field name holds \\u0000" },
		{ "/report", "{\"t\":\"basic\",\"user\":\"\\u0000\"}",
		    "a string holds \\u0000" },
		{ "/release", "{\"lease\":\"x\\u0000\"}",
		    "a string holds \\u0000" },
		{ "/acquire",
		    "{\"t\":\"basic\",\"a_name_longer_than_twenty\":1,"
		    "\"a_name_longer_than_twenty\":2}",
		    "the field \"a_name_longer_than_twenty\" is named twice" },
		{ "/release", "{\"lease\":\"a\",\"lease\":\"b\"}",
		    "the field \"lease\" is named twice" },
	};
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	const char *msg;
	size_t i;

	start_daemon(&d);
	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		h_http(&r, "POST", want[i].path, want[i].body, NULL);
		ck_assert_msg(r.status == 400, "%s %s: %ld %s", want[i].path,
		    want[i].body, r.status, r.body);
		ck_assert_str_eq(h_json_str(&r, "error"), "invalid_json");
		msg = h_json_str(&r, "message");
		ck_assert_msg(msg != NULL &&
			strstr(msg, want[i].says) != NULL &&
			strstr(msg, "JSON_ALLOW_NUL") == NULL,
		    "%s %s: %s, expected \"%s\"", want[i].path, want[i].body,
		    r.body, want[i].says);
		h_resp_free(&r);
	}
	h_daemon_stop(&d);
}
END_TEST

static long
poll_status(const char *path, long want, long long ms)
{
	struct h_resp r = { 0 };
	long long end = h_now_ms() + ms;
	long got;

	for (;;) {
		h_http(&r, "GET", path, NULL, NULL);
		got = r.status;
		h_resp_free(&r);
		if (got == want || h_now_ms() >= end)
			return got;
		h_sleep_ms(50);
	}
}

/* /readyz is 503 while Redis is gone and 200 again once it is back (the
 * daemon reconnects by itself); meanwhile, with on_backend_error: deny,
 * /acquire is 503 backend_unavailable and /healthz stays 200. */
START_TEST(test_readyz_follows_redis)
{
	struct h_redis own = { 0 };
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	long st;

	h_redis_start(&own);
	d.redis_port = own.port;
	start_daemon(&d);
	ck_assert_int_eq(poll_status("/readyz", 200, 2000), 200);

	h_redis_stop(&own);
	st = poll_status("/readyz", 503, 3000);
	ck_assert_msg(st == 503,
	    "/readyz answers %ld with Redis stopped, "
	    "expected 503",
	    st);
	h_http(&r, "GET", "/healthz", NULL, NULL);
	ck_assert_msg(r.status == 200,
	    "/healthz answers %ld with Redis "
	    "stopped",
	    r.status);
	h_http(&r, "POST", "/acquire", "{\"t\":\"basic\",\"user\":\"down\"}",
	    NULL);
	ck_assert_msg(r.status == 503,
	    "/acquire with Redis down and "
	    "on_backend_error: deny: status %ld, expected 503 (body %s)",
	    r.status, r.body);
	check_error(&r, "backend_unavailable", "/acquire, Redis down");

	h_redis_start(&own); /* the same port */
	st = poll_status("/readyz", 200, 10000);
	ck_assert_msg(st == 200,
	    "/readyz answers %ld 10 s after Redis came "
	    "back, expected 200",
	    st);
	h_http(&r, "POST", "/acquire", "{\"t\":\"basic\",\"user\":\"down\"}",
	    NULL);
	ck_assert_msg(r.status == 200,
	    "/acquire after Redis came back: "
	    "status %ld (body %s)",
	    r.status, r.body);
	check_subset(&r, "{'rule':'basic','remaining':2}", "after Redis");
	h_resp_free(&r);
	h_daemon_stop(&d);
	h_redis_stop(&own);
}
END_TEST

/* --- fixtures and main -------------------------------------------------- */

static void
use_memory_backend(void)
{
	use_redis = false;
}

static void
use_redis_backend(void)
{
	use_redis = true;
	h_shared_redis_up();
}

static TCase *
backend_tcase(const char *name, bool with_redis)
{
	TCase *tc = tcase_create(name);

	tcase_add_unchecked_fixture(tc,
	    with_redis ? use_redis_backend : use_memory_backend,
	    h_reap_orphans);
	tcase_add_checked_fixture(tc, with_redis ? h_shared_redis_flush : NULL,
	    h_test_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_case_table, 0, NCASES);
	tcase_add_test(tc, test_keepalive);
	tcase_add_test(tc, test_phase_metrics);
	tcase_add_test(tc, test_sliding_not_fixed);
	return tc;
}

/* --- the Redis I/O on the first event loop ------------------------------ */

/* How many of pid's threads are named name (a prefix when it ends in
 * '*'). */
static int
threads_named(pid_t pid, const char *name)
{
	char path[384], comm[64];
	size_t len = strlen(name);
	bool prefix = len > 0 && name[len - 1] == '*';
	struct dirent *e;
	DIR *dir;
	FILE *f;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	ck_assert_ptr_nonnull(dir = opendir(path));
	while ((e = readdir(dir)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid,
		    e->d_name);
		if ((f = fopen(path, "r")) == NULL)
			continue;
		if (fgets(comm, sizeof(comm), f) != NULL) {
			comm[strcspn(comm, "\n")] = '\0';
			n += prefix ? strncmp(comm, name, len - 1) == 0 :
				      strcmp(comm, name) == 0;
		}
		fclose(f);
	}
	closedir(dir);
	return n;
}

/* The first HTTP loop runs the Redis store's I/O (docs/architecture.md):
 * once serving, the store has no thread of its own, and requests on every
 * loop (consecutive connections go to the loops in turn) are decided
 * through it, exactly: of six on one key with limit 3, three pass, and
 * none of them stalls.  A stop gives the I/O back to a thread of the
 * store's, which answers what is left, and the daemon exits cleanly. */
START_TEST(test_redis_io_on_first_loop)
{
	struct h_daemon d = { 0 };
	struct h_resp r = { 0 };
	int i, allowed = 0, denied = 0;
	long long start_ms;

	start_daemon(&d);
	h_post(d.port, "/acquire", "{\"t\":\"basic\",\"user\":\"warm\"}", &r);
	ck_assert_int_eq(r.status, 200);
	h_resp_free(&r);
	ck_assert_int_eq(threads_named(d.pid, "rl-http-*"), 4);
	ck_assert_msg(threads_named(d.pid, "rl-redis") == 0,
	    "the Redis store still runs its own I/O thread");
	for (i = 0; i < 6; i++) {
		h_post(d.port, "/acquire",
		    "{\"t\":\"basic\",\"user\":\"loops\"}", &r);
		allowed += r.status == 200;
		denied += r.status == 429;
		h_resp_free(&r);
	}
	ck_assert_int_eq(allowed, 3);
	ck_assert_int_eq(denied, 3);
	/* No stall: a resumed connection is answered at once, not at the
	 * loop's next unrelated wake-up (libmicrohttpd signals nothing by
	 * itself here; http_loop_wake does).  A stall costs up to a second
	 * or more a request; 20 take milliseconds. */
	start_ms = h_now_ms();
	for (i = 0; i < 20; i++) {
		h_post(d.port, "/acquire",
		    "{\"t\":\"basic\",\"user\":\"stall\"}", &r);
		ck_assert_int_eq(r.status, i < 3 ? 200 : 429);
		h_resp_free(&r);
	}
	ck_assert_msg(h_now_ms() - start_ms < 5000,
	    "20 requests took %lld ms: answers wait for another wake-up",
	    h_now_ms() - start_ms);
	h_daemon_stop(&d);
}
END_TEST

/* --- connections spread over the event loops --------------------------- */

#define SPREAD_CONNS 40

/* The inode of the daemon's socket for the connection from client port
 * cport to port, from /proc/net/tcp (the server side: local port is the
 * daemon's); 0 if not found. */
static unsigned long
server_inode(int port, int cport)
{
	FILE *f = fopen("/proc/net/tcp", "r");
	char line[512];
	unsigned lp, rp;
	unsigned long inode, found = 0;

	ck_assert_ptr_nonnull(f);
	while (found == 0 && fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line,
			" %*d: %*x:%x %*x:%x %*x %*x:%*x %*x:%*x %*x %*d %*d %lu",
			&lp, &rp, &inode) == 3 &&
		    (int)lp == port && (int)rp == cport)
			found = inode;
	fclose(f);
	return found;
}

/* How many of the sockets in inodes[] each epoll instance of pid watches:
 * counts[] gets one entry per epoll that watches at least one, returns
 * how many. */
static int
epoll_shares(pid_t pid, const unsigned long *inodes, int n, int *counts,
    int max)
{
	char path[512], link[128], line[256];
	struct dirent *e;
	DIR *dir;
	FILE *f;
	int nep = 0, tfd, i, c;
	unsigned long ino;
	ssize_t len;

	snprintf(path, sizeof(path), "/proc/%d/fdinfo", (int)pid);
	ck_assert_ptr_nonnull(dir = opendir(path));
	while ((e = readdir(dir)) != NULL && nep < max) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/fdinfo/%s", (int)pid,
		    e->d_name);
		if ((f = fopen(path, "r")) == NULL)
			continue;
		c = 0;
		while (fgets(line, sizeof(line), f) != NULL) {
			if (sscanf(line, "tfd: %d", &tfd) != 1)
				continue;
			snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid,
			    tfd);
			len = readlink(path, link, sizeof(link) - 1);
			if (len <= 0)
				continue;
			link[len] = '\0';
			if (sscanf(link, "socket:[%lu]", &ino) != 1)
				continue;
			for (i = 0; i < n; i++)
				if (inodes[i] == ino)
					c++;
		}
		fclose(f);
		if (c > 0)
			counts[nep++] = c;
	}
	closedir(dir);
	return nep;
}

/* A burst of keep-alive connections is spread over the `threads` event
 * loops (src/front/http_accept.c hands them out), not left to whichever
 * loop accepts first: each loop's epoll watches its share of them. */
START_TEST(test_connections_spread)
{
	static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
	struct h_daemon d = { 0 };
	struct sockaddr_in sa = { 0 };
	socklen_t len;
	unsigned long inodes[SPREAD_CONNS];
	int fds[SPREAD_CONNS], counts[16], i, n, total = 0;
	char buf[512];

	h_daemon_start(&d,
	    "listen: \"127.0.0.1:%PORT%\"\n"
	    "threads: 2\n"
	    "backend: memory\n"
	    "rules: []\n");
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)d.port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (i = 0; i < SPREAD_CONNS; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM, 0);
		ck_assert_int_ge(fds[i], 0);
		ck_assert_int_eq(connect(fds[i], (struct sockaddr *)&sa,
				     sizeof(sa)),
		    0);
	}
	/* One answered request each: every connection is in a loop. */
	for (i = 0; i < SPREAD_CONNS; i++) {
		ck_assert_int_eq(write(fds[i], req, sizeof(req) - 1),
		    (ssize_t)(sizeof(req) - 1));
		ck_assert_int_gt(read(fds[i], buf, sizeof(buf)), 0);
		len = sizeof(sa);
		ck_assert_int_eq(getsockname(fds[i], (struct sockaddr *)&sa,
				     &len),
		    0);
		inodes[i] = server_inode(d.port, ntohs(sa.sin_port));
		ck_assert_uint_ne(inodes[i], 0);
		sa.sin_port = htons((uint16_t)d.port);
	}
	n = epoll_shares(d.pid, inodes, SPREAD_CONNS, counts, 16);
	for (i = 0; i < n; i++)
		total += counts[i];
	ck_assert_int_eq(total, SPREAD_CONNS);
	ck_assert_msg(n == 2, "%d event loops hold the connections", n);
	for (i = 0; i < n; i++)
		ck_assert_msg(counts[i] >= SPREAD_CONNS / 4,
		    "one loop holds %d of %d connections", counts[i],
		    SPREAD_CONNS);
	for (i = 0; i < SPREAD_CONNS; i++)
		close(fds[i]);
	h_daemon_stop(&d);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("http");
	TCase *mem, *red;

	mem = backend_tcase("memory", false);
	red = backend_tcase("redis", true);
	tcase_add_test(red, test_readyz_follows_redis);
	tcase_add_test(red, test_redis_io_on_first_loop);
	tcase_add_test(mem, test_long_rule_name);
	tcase_add_test(mem, test_bad_method_allow);
	tcase_add_test(mem, test_path_nul);
	tcase_add_test(mem, test_json_refusals_worded);
	tcase_add_test(mem, test_connections_spread);
	suite_add_tcase(s, mem);
	suite_add_tcase(s, red);
	test_main_at_end(h_shared_redis_stop);
	return s;
}
