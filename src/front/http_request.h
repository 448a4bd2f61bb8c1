/*
 * http_request.h - the HTTP request mapping (docs/http.md) without a
 * socket: the attributes, forced rule, cost and wait of an /acquire body,
 * and the attributes of the request a proxy asks /auth about (its headers
 * as header.<name>, and method, path, host and ip derived from them and
 * the peer).  Pure over its inputs, so the unit tests call it as the
 * daemon does; http_request.c also holds the thin libmicrohttpd adapter
 * (http_priv.h).
 *
 * The attrs are the caller's; every function adds to them.  Any thread,
 * one request at a time.
 */
#ifndef RL_HTTP_REQUEST_H
#define RL_HTTP_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/request_json.h"
#include "core/rules.h"

/* What an /acquire body asks besides its attributes. */
struct http_acquire {
	char *rule;	 /* "rule": a new string (rl_free), or NULL */
	int64_t cost;	 /* "cost", or -1: each rule's own */
	int64_t wait_ms; /* "wait_ms", or 0 */
};

/*
 * The JSON body of /acquire (len bytes; none is "{}") into attributes in
 * *a and the reserved fields in *out, within cfg's max_attributes and
 * max_wait_ms.  Returns 0, or -1 with the answer's status, code and
 * message in *e (out->rule is then NULL).
 */
int http_acquire_parse(const struct config *cfg, const char *body, size_t len,
    struct attrs *a, struct http_acquire *out, struct request_error *e);

/* The JSON body of /report, as http_acquire_parse() but with wait_ms
 * ignored, whatever its value (docs/http.md): out->wait_ms is 0. */
int http_report_parse(const struct config *cfg, const char *body, size_t len,
    struct attrs *a, struct http_acquire *out, struct request_error *e);

/* The headers of a request to /auth as they are walked into attributes. */
struct http_headers {
	struct attrs *a;
	size_t n, max; /* seen; 0: no bound */
};

/* Walk into a, at most cfg's max_attributes less the four that /auth
 * derives. */
void http_headers_init(struct http_headers *h, struct attrs *a,
    const struct config *cfg);

/*
 * One header: header.<name lowercased> = value (NULL counts as ""); a
 * header sent again is appended after a comma (RFC 9110 5.3).  Returns 0,
 * -1 when out of memory, -2 past the bound.
 */
int http_headers_add(struct http_headers *h, const char *name,
    const char *value);

/*
 * The attributes /auth derives from the headers already in *a: method
 * (X-Original-Method, X-Forwarded-Method, else the request's), path
 * (X-Original-URI, X-Forwarded-URI, else url without its /auth prefix;
 * normalized by uri_path_normalize(): no query, escapes decoded, slashes
 * merged, dot segments resolved), host (X-Forwarded-Host, else Host) and
 * ip (cfg's auth_ip from X-Real-IP, X-Forwarded-For and peer, which may
 * be NULL).  Returns 0, -1 when out of memory, -3 when the path is
 * refused (an encoded NUL, docs/proxies.md).
 */
int http_auth_derive(const struct config *cfg, const char *url,
    const char *method, const char *peer, struct attrs *a);

#endif
