/*
 * admin.c - the admin API's server (see admin.h and docs/admin.md): its
 * own libmicrohttpd daemon on admin_listen, the bearer token, the routing
 * of the admin paths, GET /admin/config, and the log line of every write.  The
 * endpoints that touch the store are in admin_store.c.
 *
 * The token is compared in constant time (admin_token_ok): the time an
 * answer takes says nothing about how much of a guess was right.  A
 * request without the right token is refused before its body is read.
 * A path with an encoded NUL is refused (400 invalid_path), as on the main
 * listener: libmicrohttpd hands on the URL cut at the NUL, so
 * "/admin/overrides%00x" would be served as "/admin/overrides"; only the
 * request-line callback (path_seen) sees the target as sent.
 */
#include "front/admin.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "base/log.h"
#include "base/util.h"
#include "core/config_slot.h"
#include "core/uri_path.h"
#include "front/admin_priv.h"

/* One request: its body, gathered up to max_body_bytes. */
struct admin_req {
	char *body;
	size_t len, cap;
	bool too_large;
	bool refused;  /* answered on its first call (401) */
	bool path_nul; /* the target's path has an encoded NUL */
};

/* The first *con_cls of a request whose path has an encoded NUL: an
 * address no struct admin_req has.  Never written. */
static char path_nul_mark;

/* libmicrohttpd's request-line callback: the target as sent.  Returns the
 * access handler's first *con_cls: NULL, or path_nul_mark. */
static void *
path_seen(void *cls, const char *uri, struct MHD_Connection *conn)
{
	(void)cls;
	(void)conn;
	return uri != NULL && uri_path_target_has_nul(uri) ? &path_nul_mark :
							     NULL;
}

/* --- answers ------------------------------------------------------------ */

/* body as the answer; allow: the Allow header of a 405, or NULL. */
static int
respond(struct MHD_Connection *conn, unsigned status, const char *body,
    const char *allow)
{
	struct MHD_Response *r;
	int ret;

	r = MHD_create_response_from_buffer(strlen(body), (void *)body,
	    MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
	    "application/json");
	if (status == 401)
		MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
		    "Bearer realm=\"ratelimitd admin\"");
	if (allow != NULL)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

int
admin_respond(struct MHD_Connection *conn, unsigned status, const char *body)
{
	return respond(conn, status, body, NULL);
}

int
admin_respond_json(struct MHD_Connection *conn, unsigned status, json_t *v)
{
	char *text = v != NULL ? json_dumps(v, JSON_COMPACT) : NULL;
	int ret;

	json_decref(v);
	if (text == NULL)
		return admin_error(conn, 500, "internal_error",
		    "out of memory");
	ret = admin_respond(conn, status, text);
	free(text);
	return ret;
}

int
admin_error(struct MHD_Connection *conn, unsigned status, const char *code,
    const char *fmt, ...)
{
	char msg[256], clean[3 * sizeof(msg)];
	va_list ap;
	json_t *v;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* It may quote the path asked, cut inside a character or not UTF-8:
	 * JSON holds nothing but UTF-8. */
	util_utf8_clean(clean, msg);
	v = json_pack("{s:s, s:s}", "error", code, "message", clean);
	if (v == NULL)
		return admin_respond(conn, 500,
		    "{\"error\":\"internal_error\","
		    "\"message\":\"out of memory\"}");
	return admin_respond_json(conn, status, v);
}

int
admin_not_allowed(struct MHD_Connection *conn, const char *method,
    const char *path, const char *allow)
{
	char msg[128], clean[3 * sizeof(msg)], *text;
	json_t *v;
	int ret;

	snprintf(msg, sizeof(msg), "%s %s: use %s", method, path, allow);
	util_utf8_clean(clean, msg); /* the method is the client's */
	v = json_pack("{s:s, s:s}", "error", "method_not_allowed", "message",
	    clean);
	if (v == NULL || (text = json_dumps(v, JSON_COMPACT)) == NULL) {
		json_decref(v);
		return admin_error(conn, 500, "internal_error",
		    "out of memory");
	}
	json_decref(v);
	ret = respond(conn, 405, text, allow);
	free(text);
	return ret;
}

/* --- who asks ------------------------------------------------------------ */

void
admin_peer(struct MHD_Connection *conn, char *buf, size_t len)
{
	const union MHD_ConnectionInfo *ci;
	char host[INET6_ADDRSTRLEN + 8], port[16];
	socklen_t sl;

	snprintf(buf, len, "unknown");
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (ci == NULL || ci->client_addr == NULL)
		return;
	if (ci->client_addr->sa_family == AF_UNIX) {
		snprintf(buf, len, "unix");
		return;
	}
	sl = ci->client_addr->sa_family == AF_INET6 ?
	    sizeof(struct sockaddr_in6) :
	    sizeof(struct sockaddr_in);
	if (getnameinfo(ci->client_addr, sl, host, sizeof(host), port,
		sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) == 0)
		snprintf(buf, len, "%s:%s", host, port);
}

void
admin_log_write(struct MHD_Connection *conn, const char *op, const char *rule,
    const char *key, const char *what)
{
	const char *k[] = { "peer", "op", "rule", "key", "change" };
	const char *v[5];
	char peer[80];

	admin_peer(conn, peer, sizeof(peer));
	v[0] = peer;
	v[1] = op;
	v[2] = rule != NULL ? rule : "";
	v[3] = key != NULL ? key : "";
	v[4] = what != NULL ? what : "";
	log_fields(LOG_LEVEL_INFO, "admin write", k, v, 5);
}

/* Constant time in the length of the guess: every byte is looked at
 * whatever the first difference, and the lengths differ or not alike. */
static bool
admin_token_ok(const char *want, size_t wlen, const char *got)
{
	size_t glen = strlen(got), i;
	unsigned char diff = (unsigned char)(glen != wlen);

	for (i = 0; i < glen; i++)
		diff |= (unsigned char)(got[i] ^
		    want[i % (wlen > 0 ? wlen : 1)]);
	return diff == 0 && wlen > 0;
}

static bool
authorized(const struct admin_server *s, struct MHD_Connection *conn)
{
	const char *h;

	if (s->token == NULL)
		return true;
	h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_AUTHORIZATION);
	if (h == NULL || strncasecmp(h, "Bearer ", 7) != 0)
		return false;
	h += 7;
	while (*h == ' ')
		h++;
	return admin_token_ok(s->token, s->token_len, h);
}

/* --- endpoints ------------------------------------------------------------ */

static int
handle_config(struct MHD_Connection *conn, const struct config *cfg)
{
	char *text = config_to_json(cfg);
	int ret;

	if (text == NULL)
		return admin_error(conn, 500, "internal_error",
		    "out of memory");
	ret = admin_respond(conn, 200, text);
	free(text);
	return ret;
}

static int
route(struct admin_server *s, struct MHD_Connection *conn, struct config *cfg,
    const char *url, const char *method, struct admin_req *rq)
{
	bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;

	if (rq->path_nul)
		return admin_error(conn, 400, "invalid_path",
		    "the path has an encoded NUL (%%00)");
	if (strcmp(url, "/admin/config") == 0) {
		if (!get)
			return admin_not_allowed(conn, method, url,
			    "GET, HEAD");
		return handle_config(conn, cfg);
	}
	if (strcmp(url, "/admin/counters") == 0)
		return admin_handle_counters(s, conn, cfg, method);
	if (strcmp(url, "/admin/overrides") == 0)
		return admin_handle_overrides(s, conn, cfg, method, rq->body,
		    rq->len);
	return admin_error(conn, 404, "not_found", "no endpoint %s", url);
}

static enum MHD_Result
access_handler(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	struct admin_server *s = cls;
	struct admin_req *rq = *con_cls;
	struct config *cfg;
	char *nb;
	int ret;

	(void)version;
	if (rq == NULL || (void *)rq == &path_nul_mark) {
		if ((rq = rl_calloc(1, sizeof(*rq))) == NULL)
			return MHD_NO;
		rq->path_nul = *con_cls == &path_nul_mark;
		*con_cls = rq;
		if (!authorized(s, conn)) {
			rq->refused = true;
			return (enum MHD_Result)admin_error(conn, 401,
			    "unauthorized",
			    "the admin API needs Authorization: Bearer "
			    "<the token of admin_token_file>");
		}
		return MHD_YES;
	}
	if (rq->refused)
		return MHD_NO;
	cfg = config_slot_get(&s->cfg);
	if (*upload_data_size > 0) {
		if (rq->len + *upload_data_size > (size_t)cfg->max_body_bytes)
			rq->too_large = true;
		else {
			if (rq->len + *upload_data_size + 1 > rq->cap) {
				nb = rl_realloc(rq->body,
				    rq->len + *upload_data_size + 1);
				if (nb == NULL) {
					config_unref(cfg);
					return MHD_NO;
				}
				rq->body = nb;
				rq->cap = rq->len + *upload_data_size + 1;
			}
			memcpy(rq->body + rq->len, upload_data,
			    *upload_data_size);
			rq->len += *upload_data_size;
			rq->body[rq->len] = '\0';
		}
		*upload_data_size = 0;
		config_unref(cfg);
		return MHD_YES;
	}
	if (rq->too_large)
		ret = admin_error(conn, 413, "body_too_large",
		    "the body is larger than %lld bytes",
		    (long long)cfg->max_body_bytes);
	else
		ret = route(s, conn, cfg, url, method, rq);
	config_unref(cfg);
	return (enum MHD_Result)ret;
}

static void
request_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct admin_req *rq = *con_cls;

	(void)cls;
	(void)conn;
	(void)toe;
	if (rq == NULL || (void *)rq == &path_nul_mark) {
		*con_cls = NULL; /* ended before its headers were in */
		return;
	}
	rl_free(rq->body);
	rl_free(rq);
	*con_cls = NULL;
}

static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	size_t n;

	(void)cls;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	log_debug("admin: %s", msg);
}

struct admin_server *
admin_server_start(int listen_fd, struct config *cfg,
    const struct decider *decider, struct overrides *overrides,
    struct lease_wait *leases, struct metrics *metrics, const char *token,
    char *err, size_t errlen)
{
	struct admin_server *s;

	if ((s = rl_calloc(1, sizeof(*s))) == NULL) {
		snprintf(err, errlen, "out of memory");
		close(listen_fd);
		return NULL;
	}
	config_slot_init(&s->cfg, cfg);
	s->decider = decider;
	s->overrides = overrides;
	s->leases = leases;
	s->metrics = metrics;
	if (token != NULL) {
		if ((s->token = rl_strdup(token)) == NULL) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		s->token_len = strlen(token);
	}
	s->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION |
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
	    0, NULL, NULL, access_handler, s, MHD_OPTION_EXTERNAL_LOGGER,
	    mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET, listen_fd,
	    MHD_OPTION_NOTIFY_COMPLETED, request_completed, s,
	    MHD_OPTION_URI_LOG_CALLBACK, path_seen, NULL,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)ADMIN_MAX_CONNECTIONS,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)30, MHD_OPTION_END);
	if (s->mhd == NULL) {
		snprintf(err, errlen, "%s: cannot start the admin server",
		    cfg->admin_listen != NULL ? cfg->admin_listen : "admin");
		goto fail;
	}
	return s;
fail:
	close(listen_fd);
	config_slot_destroy(&s->cfg);
	if (s->token != NULL)
		explicit_bzero(s->token, s->token_len);
	rl_free(s->token);
	rl_free(s);
	return NULL;
}

void
admin_server_set_config(struct admin_server *s, struct config *cfg)
{
	if (s != NULL)
		config_slot_set(&s->cfg, cfg);
}

void
admin_server_stop(struct admin_server *s)
{
	if (s == NULL)
		return;
	MHD_stop_daemon(s->mhd);
	config_slot_destroy(&s->cfg);
	if (s->token != NULL)
		explicit_bzero(s->token, s->token_len);
	rl_free(s->token);
	rl_free(s);
}
