/*
 * http_framing.c - refuses a request whose framing is in doubt before its
 * body is read (RFC 9112 6, docs/security.md): two Content-Lengths that
 * differ, one that is not a number, both Content-Length and
 * Transfer-Encoding, a coding other than chunked, a header name that is
 * no token, or headers past max_header_bytes.  A proxy in front may read
 * such a request differently, and what it takes for the next request
 * would be smuggled past it; so the answer closes the connection.
 * Connection limits and timeouts are http_guard.c's.  Runs on the event
 * loop.
 *
 * libmicrohttpd 0.9.75 (Debian bookworm) refuses a Content-Length that is
 * not a number ("+9", "9, 9") or too large by itself, before the access
 * handler runs, and writes its own 400 or 413 twice: the status line and
 * headers of the first copy, then the whole second one, so a client sees
 * two answers.  It tells the application only through its log line,
 * which names no connection.  So each event-loop thread keeps the
 * connections whose request line it has seen and whose headers have not
 * reached the access handler yet; when libmicrohttpd logs such a refusal
 * and exactly one connection of the thread is in that state, it is the
 * one refused (the whole life of a connection runs on one thread): the
 * answer is written once, here, as every other framing refusal is, and
 * the socket is shut so that libmicrohttpd's copies are never sent.  With
 * more than one candidate nothing is done (libmicrohttpd answers as it
 * does).
 *
 * The request line is also where an encoded NUL in the path is seen
 * (docs/http.md, Errors): libmicrohttpd decodes the URL before the
 * access handler, which gets it as a C string cut at the NUL
 * ("/acquire%00junk" would be served as "/acquire").  The raw target comes
 * only to the request-line callback, whose return value is the access
 * handler's first *con_cls: a mark there tells the handler to refuse the
 * request.  libmicrohttpd calls the callback again for every request of
 * a keep-alive connection, so the mark is never inherited.
 */
#include <ctype.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "core/uri_path.h"
#include "front/http_guard.h"
#include "front/http_priv.h"

struct framing {
	int content_length; /* Content-Length headers */
	const char *cl_first;
	bool cl_differ, cl_bad;
	int transfer_encoding;
	const char *te;
	bool bad_name; /* a header name that is no token */
	size_t bytes;  /* names and values */
	size_t count;
};

/* RFC 9110 5.1: a field name is a token. */
static bool
is_token(const char *s)
{
	static const char extra[] = "!#$%&'*+-.^_`|~";

	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (!isalnum((unsigned char)*s) && strchr(extra, *s) == NULL)
			return false;
	return true;
}

static enum MHD_Result
framing_walk(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct framing *f = cls;

	(void)kind;
	if (value == NULL)
		value = "";
	f->count++;
	f->bytes += strlen(key) + strlen(value) + 4;
	/* libmicrohttpd turns "Content-Length:" folded onto a next line
	 * " 34" into a header named "Content-Length34": a framing header
	 * in disguise, which the proxy in front may have read as one. */
	if (!is_token(key) ||
	    (strncasecmp(key, "content-length", 14) == 0 && key[14] != '\0') ||
	    (strncasecmp(key, "transfer-encoding", 17) == 0 && key[17] != '\0'))
		f->bad_name = true;
	if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
		if (value[0] == '\0' ||
		    strspn(value, "0123456789") != strlen(value))
			f->cl_bad = true; /* empty (a folded line), signs */
		if (f->content_length++ > 0 && strcmp(f->cl_first, value) != 0)
			f->cl_differ = true;
		if (f->cl_first == NULL)
			f->cl_first = value;
	} else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
		f->transfer_encoding++;
		f->te = value;
	}
	return MHD_YES;
}

/* The query's bytes: libmicrohttpd gives the url without it. */
static enum MHD_Result
framing_query(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct framing *f = cls;

	(void)kind;
	f->bytes += strlen(key) + (value != NULL ? strlen(value) : 0) + 2;
	return MHD_YES;
}

/*
 * Check how the request says where it ends (RFC 9112 6): one
 * Content-Length or chunked, never both, never two lengths, no header name
 * that is not a token (`Content-Length : 5` would leave its body to be
 * read as the next request), and the headers within max_header_bytes.
 * Returns MHD_YES to go on with *answered false, or the result of an
 * answer that closes the connection with *answered true.
 */
enum MHD_Result
http_check_framing(struct http_server *s, struct MHD_Connection *conn,
    const struct config *cfg, const char *url, bool *answered)
{
	struct framing f;

	memset(&f, 0, sizeof(f));
	*answered = true;
	MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_walk, &f);
	MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, framing_query,
	    &f);
	if (f.bytes + strlen(url) > (size_t)cfg->max_header_bytes)
		return http_refuse(s, conn, 431, "headers_too_large",
		    "the request "
		    "line and headers are larger than %d bytes",
		    cfg->max_header_bytes);
	if (f.bad_name)
		return http_refuse(s, conn, 400, "bad_request",
		    "a header name "
		    "is not a token");
	if (f.content_length > 0 && f.transfer_encoding > 0)
		return http_refuse(s, conn, 400, "bad_request",
		    "both "
		    "Content-Length and Transfer-Encoding");
	if (f.content_length > 1 && f.cl_differ)
		return http_refuse(s, conn, 400, "bad_request",
		    "Content-Length "
		    "headers that differ");
	if (f.cl_bad)
		return http_refuse(s, conn, 400, "bad_request",
		    "a Content-Length "
		    "that is not a number");
	if (f.transfer_encoding > 1 ||
	    (f.transfer_encoding == 1 && strcasecmp(f.te, "chunked") != 0))
		return http_refuse(s, conn, 501, "not_implemented",
		    "only the "
		    "chunked transfer coding is understood");
	*answered = false;
	return MHD_YES;
}

/* --- libmicrohttpd's own Content-Length refusals ------------------------- */

#define HEADS_MAX 64

/* This thread's connections between the request line and the handler. */
static _Thread_local struct MHD_Connection *heads[HEADS_MAX];
static _Thread_local size_t nheads;
static _Thread_local bool heads_lost; /* more than HEADS_MAX at once */

/* The first *con_cls of a request whose path has an encoded NUL: an
 * address no struct request has.  Never written. */
static char path_nul_mark;

void *
http_framing_request_line(void *cls, const char *uri,
    struct MHD_Connection *conn)
{
	(void)cls;
	http_guard_request_started(http_conn_ctx(conn));
	if (nheads < HEADS_MAX)
		heads[nheads++] = conn;
	else
		heads_lost = true;
	/* the access handler's first *con_cls */
	return uri != NULL && uri_path_target_has_nul(uri) ? &path_nul_mark :
							     NULL;
}

bool
http_framing_path_nul(const void *con_cls)
{
	return con_cls == &path_nul_mark;
}

void
http_framing_headers_done(struct MHD_Connection *conn)
{
	size_t i;

	for (i = 0; i < nheads; i++)
		if (heads[i] == conn) {
			heads[i] = heads[--nheads];
			break;
		}
	if (nheads == 0)
		heads_lost = false;
}

bool
http_framing_mhd_refused(struct http_server *s, const char *msg)
{
	const union MHD_ConnectionInfo *ci;
	struct MHD_Connection *conn;
	bool too_large;
	int fd;

	too_large = strstr(msg, "Too large value of 'Content-Length'") != NULL;
	if (!too_large &&
	    strstr(msg, "Failed to parse `Content-Length'") == NULL)
		return false;
	if (nheads != 1 || heads_lost)
		return false;
	conn = heads[0];
	http_framing_headers_done(conn);
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci == NULL)
		return false;
	fd = ci->connect_fd;
	if (too_large)
		http_refuse_raw(s, fd, 413, "body_too_large",
		    "the Content-Length is larger than any body this "
		    "server takes");
	else
		http_refuse_raw(s, fd, 400, "bad_request",
		    "a Content-Length that is not a number");
	shutdown(fd, SHUT_RDWR);
	return true;
}
