/*
 * http_request.c - the HTTP request mapping (docs/http.md): the attributes
 * a rule matches on, from the JSON body of /acquire (with its reserved
 * fields cost, rule and wait_ms) or from the headers of the request that
 * /auth checks for a proxy (method, path, host and ip derived from the
 * X-Original-* and X-Forwarded-* headers, the Host header and the peer).
 * The mapping is pure over its inputs (http_request.h, unit-tested by
 * tests/unit/check_http_request.c); the adapter at the end walks a
 * libmicrohttpd connection into it.  Runs on the event loop of the
 * request's connection.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include <jansson.h>
#include <microhttpd.h>

#include "base/util.h"
#include "core/client_ip.h"
#include "core/limiter.h"
#include "core/request_json.h"
#include "core/uri_path.h"
#include "front/http_priv.h"
#include "front/http_request.h"

/* The body of /acquire, or of /report when !wait: there wait_ms is
 * reserved all the same (not an attribute) but ignored, whatever its
 * value (docs/http.md). */
static int
parse_body(const struct config *cfg, const char *body, size_t len,
    struct attrs *a, struct http_acquire *out, bool wait,
    struct request_error *e)
{
	json_t *fields;
	const char *r = NULL;
	int rc = -1;

	out->cost = -1;
	out->rule = NULL;
	out->wait_ms = 0;
	if (request_json_parse(body, len, request_json_acquire_reserved,
		(size_t)cfg->max_attributes, a, &fields, e) < 0)
		return -1;
	/* A report's (the body without wait_ms) may pass a rule's limit,
	 * never 2^53, as far as every count stays exact (docs/http.md). */
	if (request_json_int(fields, "cost", 0,
		wait ? INT64_MAX : LIMITER_MAX_LIMIT, "invalid_cost",
		&out->cost, e) < 0 ||
	    (wait &&
		request_json_int(fields, "wait_ms", 0, cfg->max_wait_ms,
		    "invalid_wait", &out->wait_ms, e) < 0) ||
	    request_json_string(fields, "rule", "unknown_rule", &r, e) < 0)
		goto done;
	if (r != NULL && (out->rule = rl_strdup(r)) == NULL) {
		request_error_set(e, 500, "internal_error", "out of memory");
		goto done;
	}
	rc = 0;
done:
	json_decref(fields);
	return rc;
}

int
http_acquire_parse(const struct config *cfg, const char *body, size_t len,
    struct attrs *a, struct http_acquire *out, struct request_error *e)
{
	return parse_body(cfg, body, len, a, out, true, e);
}

int
http_report_parse(const struct config *cfg, const char *body, size_t len,
    struct attrs *a, struct http_acquire *out, struct request_error *e)
{
	return parse_body(cfg, body, len, a, out, false, e);
}

void
http_headers_init(struct http_headers *h, struct attrs *a,
    const struct config *cfg)
{
	h->a = a;
	h->n = 0;
	h->max = cfg->max_attributes > 4 ? (size_t)cfg->max_attributes - 4 : 1;
}

int
http_headers_add(struct http_headers *h, const char *key, const char *value)
{
	char name[256];
	size_t i, n;
	const char *old;
	int rc;

	if (h->max > 0 && ++h->n > h->max)
		return -2;
	n = util_strlcpy(name, "header.", sizeof(name));
	for (i = 0; key[i] != '\0' && n + 1 < sizeof(name); i++, n++)
		name[n] = (char)tolower((unsigned char)key[i]);
	name[n] = '\0';
	if (value == NULL)
		value = "";
	if ((old = attrs_get(h->a, name)) != NULL) {
		/* A header sent several times is one comma-separated list
		 * (RFC 9110 5.3): X-Forwarded-For from several proxies
		 * must not replace each other. */
		size_t ol = strlen(old), vl = strlen(value);
		char *joined = rl_malloc(ol + vl + 2);

		if (joined == NULL)
			return -1;
		memcpy(joined, old, ol);
		joined[ol] = ',';
		memcpy(joined + ol + 1, value, vl + 1);
		rc = attrs_set(h->a, name, joined);
		rl_free(joined);
		return rc < 0 ? -1 : 0;
	}
	return attrs_set(h->a, name, value) < 0 ? -1 : 0;
}

/* First non-empty of headers h1, h2, else fallback (may be NULL). */
static const char *
first_of(const struct attrs *a, const char *h1, const char *h2,
    const char *fallback)
{
	const char *v;

	if ((v = attrs_get(a, h1)) != NULL && *v != '\0')
		return v;
	if (h2 != NULL && (v = attrs_get(a, h2)) != NULL && *v != '\0')
		return v;
	return fallback;
}

/*
 * The path attribute, normalized as the proxy routes it (core/uri_path.h):
 * a header as the client wrote it, or the URL libmicrohttpd has already
 * decoded once, which is not decoded again.  Returns 0, -1 when out of
 * memory, -3 when the path is refused (an encoded NUL).
 */
static int
derive_path(struct attrs *a, const char *url)
{
	const char *v;
	char err[64], buf[512], *path = buf;
	size_t len;
	bool raw = true;
	int rc = -1;

	v = first_of(a, "header.x-original-uri", "header.x-forwarded-uri",
	    NULL);
	if (v == NULL) {
		/* Envoy's ext_authz sends the original path behind
		 * path_prefix: /auth/login is a check of /login. */
		v = strncmp(url, "/auth/", 6) == 0 ? url + 5 : url;
		raw = false;
	}
	/* A path that fits buf, the usual one, costs no allocation. */
	len = strlen(v);
	if (URI_PATH_ROOM(len) > sizeof(buf) &&
	    (path = rl_malloc(URI_PATH_ROOM(len))) == NULL)
		return -1;
	if (uri_path_normalize(v, len, raw, path, URI_PATH_ROOM(len), err,
		sizeof(err)) < 0)
		rc = -3;
	else if (attrs_set(a, "path", path) == 0)
		rc = 0;
	if (path != buf)
		rl_free(path);
	return rc;
}

int
http_auth_derive(const struct config *cfg, const char *url, const char *method,
    const char *peer, struct attrs *a)
{
	char ip[CLIENT_IP_MAX];
	const char *v;
	int rc;

	v = first_of(a, "header.x-original-method", "header.x-forwarded-method",
	    method);
	if (attrs_set(a, "method", v) < 0)
		return -1;
	if ((rc = derive_path(a, url)) < 0)
		return rc;
	if ((v = first_of(a, "header.x-forwarded-host", "header.host", NULL)) !=
		NULL &&
	    attrs_set(a, "host", v) < 0)
		return -1;
	if (client_ip_pick(&cfg->auth_ip, attrs_get(a, "header.x-real-ip"),
		attrs_get(a, "header.x-forwarded-for"), peer, ip,
		sizeof(ip)) == 0 &&
	    attrs_set(a, "ip", ip) < 0)
		return -1;
	return 0;
}

/* --- the libmicrohttpd adapter ------------------------------------------ */

struct header_walk {
	struct http_headers h;
	int rc;
};

static enum MHD_Result
collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct header_walk *w = cls;

	(void)kind;
	w->rc = http_headers_add(&w->h, key, value);
	return w->rc == 0 ? MHD_YES : MHD_NO;
}

int
http_auth_attrs(struct MHD_Connection *conn, const struct config *cfg,
    const char *url, const char *method, struct attrs *a)
{
	struct header_walk w = { .rc = 0 };
	const union MHD_ConnectionInfo *ci;
	char peer[INET6_ADDRSTRLEN] = "";

	http_headers_init(&w.h, a, cfg);
	MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, &w);
	if (w.rc < 0)
		return w.rc;
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (ci != NULL && ci->client_addr != NULL) {
		const struct sockaddr *sa = ci->client_addr;

		if (sa->sa_family == AF_INET)
			inet_ntop(AF_INET,
			    &((const struct sockaddr_in *)sa)->sin_addr, peer,
			    sizeof(peer));
		else if (sa->sa_family == AF_INET6)
			inet_ntop(AF_INET6,
			    &((const struct sockaddr_in6 *)sa)->sin6_addr, peer,
			    sizeof(peer));
	}
	return http_auth_derive(cfg, url, method, peer[0] != '\0' ? peer : NULL,
	    a);
}
