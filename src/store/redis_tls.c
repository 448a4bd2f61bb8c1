/*
 * redis_tls.c - the OpenSSL side of the Redis store's TLS (see
 * redis_tls.h): a client context from the files of redis.tls, swapped on
 * reload; a client SSL per connection, with the name to verify and the
 * session to resume; and what a failure means, in words an operator can
 * act on (docs/configuration.md, "Redis over TLS").
 *
 * Verification is never optional: SSL_VERIFY_PEER with the CA file or the
 * system's CAs, and the host name (SSL_set1_host) or IP address
 * (X509_VERIFY_PARAM_set1_ip_asc) checked by OpenSSL against the
 * certificate's DNS names or IP addresses.  The error texts name keys and
 * files, never their content, and no password passes through here.
 */
#include "store/redis_tls.h"

#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "base/log.h"
#include "base/util.h"

/* A reason logged once is logged again only after this long without any
 * TLS failure (a handshake that succeeds in between does not count, so a
 * Cluster with one bad node does not log at every reconnect). */
#define REDIS_TLS_RELOG_US (60 * INT64_C(1000000))

struct redis_tls {
	pthread_mutex_t mu; /* guards ctx, server_name, gen */
	SSL_CTX *ctx;
	char *server_name; /* NULL: each connection's host */
	uint64_t gen;	   /* grows with every context */

	/* The I/O thread's, but cleared by a reload: atomics. */
	atomic_uint logged; /* bit per enum redis_tls_reason */
	_Atomic int64_t last_fail_us;
};

/* An encrypted key would make OpenSSL ask for a pass phrase on the
 * terminal: refuse it instead. */
static int
no_passphrase(char *buf, int size, int rwflag, void *u)
{
	(void)buf;
	(void)size;
	(void)rwflag;
	(void)u;
	return 0;
}

/* A new session for the connection whose slot the SSL carries: a copy
 * of it is kept, never shared with an SSL (redis_tls_ssl_new() offers a
 * copy too).  OpenSSL marks the session an SSL uses not resumable when
 * its connection ends in an error, a close without close_notify
 * included (Redis killed, a proxy's idle close): a shared one would cost
 * the next connection a full handshake. */
static int
new_session(SSL *ssl, SSL_SESSION *sess)
{
	struct redis_tls_session *s = SSL_get_app_data(ssl);
	SSL_SESSION *copy;

	if (s == NULL || (copy = SSL_SESSION_dup(sess)) == NULL)
		return 0;
	if (s->sess != NULL)
		SSL_SESSION_free(s->sess);
	s->sess = copy;
	return 0; /* sess stays OpenSSL's */
}

/* The first error OpenSSL queued, as text; the queue is cleared. */
static const char *
ssl_error_text(char *buf, size_t buflen)
{
	unsigned long e = ERR_get_error();
	const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;

	if (r != NULL)
		snprintf(buf, buflen, "%s", r);
	else if (e != 0)
		snprintf(buf, buflen, "error %lx", e);
	else
		snprintf(buf, buflen, "unknown error");
	ERR_clear_error();
	return buf;
}

/* Can f be opened?  Else err names the key and why. */
static int
file_readable(const struct tls_file *f, const char *key, char *err,
    size_t errlen)
{
	FILE *fp = fopen(f->path, "re");

	if (fp == NULL) {
		snprintf(err, errlen, "redis.tls.%s: cannot read %s: %s", key,
		    f->path, strerror(errno));
		return -1;
	}
	fclose(fp);
	return 0;
}

/* A client certificate past its dates is loaded all the same (this
 * machine's clock may be the wrong one), but said: a server that asks
 * for one refuses it, and its alert is often lost to the close, so the
 * failure at run time cannot name the cause. */
static void
warn_cert_dates(SSL_CTX *ctx, const char *path)
{
	X509 *x = SSL_CTX_get0_certificate(ctx);

	if (x == NULL)
		return;
	if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0)
		log_warnx(
		    "redis.tls.cert_file %s: the client certificate has "
		    "expired; a server that asks for one will refuse it",
		    path);
	else if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0)
		log_warnx(
		    "redis.tls.cert_file %s: the client certificate is not "
		    "valid yet (check the clocks); a server that asks for "
		    "one will refuse it",
		    path);
}

static SSL_CTX *
ctx_new(const struct redis_tls_config *tc, const struct tls_file **bad,
    char *err, size_t errlen)
{
	char why[160];
	SSL_CTX *ctx;
	int ok;

	*bad = NULL;
	ERR_clear_error();
	if ((ctx = SSL_CTX_new(TLS_client_method())) == NULL) {
		snprintf(err, errlen, "redis.tls: %s",
		    ssl_error_text(why, sizeof(why)));
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	/* A connection cut without close_notify (Redis killed, a reset on
	 * the way) is a close, not a TLS failure, but not one the server
	 * announced: OpenSSL 3 reports it as UNEXPECTED_EOF_WHILE_READING
	 * (queue_reason(): REDIS_TLS_CLOSED), 1.1 as a SYSCALL error, so
	 * SSL_OP_IGNORE_UNEXPECTED_EOF is not set (it would make it look
	 * like close_notify, REDIS_TLS_SHUTDOWN). */
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
	/* The output buffer may grow (and move) between a write that
	 * would block and its retry, and a write may go out in parts. */
	SSL_CTX_set_mode(ctx,
	    SSL_MODE_ENABLE_PARTIAL_WRITE |
		SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_session_cache_mode(ctx,
	    SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(ctx, new_session);
	if (tc->ca_file.path != NULL) {
		*bad = &tc->ca_file;
		if (file_readable(&tc->ca_file, "ca_file", err, errlen) == -1)
			goto fail;
		if (SSL_CTX_load_verify_locations(ctx, tc->ca_file.path,
			NULL) != 1) {
			snprintf(err, errlen,
			    "redis.tls.ca_file: no CA certificate in %s: %s",
			    tc->ca_file.path, ssl_error_text(why, sizeof(why)));
			goto fail;
		}
	} else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
		snprintf(err, errlen, "redis.tls: the system's CAs: %s",
		    ssl_error_text(why, sizeof(why)));
		goto fail;
	}
	if (tc->cert_file.path != NULL) {
		*bad = &tc->cert_file;
		if (file_readable(&tc->cert_file, "cert_file", err, errlen) ==
		    -1)
			goto fail;
		if (SSL_CTX_use_certificate_chain_file(ctx,
			tc->cert_file.path) != 1) {
			snprintf(err, errlen,
			    "redis.tls.cert_file: no certificate in %s: %s",
			    tc->cert_file.path,
			    ssl_error_text(why, sizeof(why)));
			goto fail;
		}
		warn_cert_dates(ctx, tc->cert_file.path);
	}
	if (tc->key_file.path != NULL) {
		*bad = &tc->key_file;
		if (file_readable(&tc->key_file, "key_file", err, errlen) == -1)
			goto fail;
		ok = SSL_CTX_use_PrivateKey_file(ctx, tc->key_file.path,
		    SSL_FILETYPE_PEM);
		if (ok != 1 &&
		    ERR_GET_REASON(ERR_peek_last_error()) ==
			X509_R_KEY_VALUES_MISMATCH) {
			snprintf(err, errlen,
			    "redis.tls.key_file: %s is not the key of "
			    "cert_file %s",
			    tc->key_file.path, tc->cert_file.path);
			ERR_clear_error();
			goto fail;
		}
		if (ok != 1) {
			snprintf(err, errlen,
			    "redis.tls.key_file: no usable private key in %s "
			    "(PEM, not encrypted): %s",
			    tc->key_file.path,
			    ssl_error_text(why, sizeof(why)));
			goto fail;
		}
		if (SSL_CTX_check_private_key(ctx) != 1) {
			snprintf(err, errlen,
			    "redis.tls.key_file: %s is not the key of "
			    "cert_file %s",
			    tc->key_file.path, tc->cert_file.path);
			ERR_clear_error();
			goto fail;
		}
	}
	*bad = NULL;
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

struct redis_tls *
redis_tls_new(const struct redis_tls_config *tc, const struct tls_file **bad,
    char *err, size_t errlen)
{
	struct redis_tls *t;

	*bad = NULL;
	if ((t = rl_calloc(1, sizeof(*t))) == NULL) {
		snprintf(err, errlen, "redis.tls: out of memory");
		return NULL;
	}
	pthread_mutex_init(&t->mu, NULL);
	atomic_init(&t->logged, 0);
	atomic_init(&t->last_fail_us, 0);
	if (redis_tls_reload(t, tc, bad, err, errlen) == -1) {
		redis_tls_free(t);
		return NULL;
	}
	return t;
}

void
redis_tls_free(struct redis_tls *t)
{
	if (t == NULL)
		return;
	SSL_CTX_free(t->ctx);
	rl_free(t->server_name);
	pthread_mutex_destroy(&t->mu);
	rl_free(t);
}

int
redis_tls_reload(struct redis_tls *t, const struct redis_tls_config *tc,
    const struct tls_file **bad, char *err, size_t errlen)
{
	SSL_CTX *ctx, *old;
	char *name = NULL, *old_name;

	if ((ctx = ctx_new(tc, bad, err, errlen)) == NULL)
		return -1;
	if (tc->server_name != NULL &&
	    (name = rl_strdup(tc->server_name)) == NULL) {
		SSL_CTX_free(ctx);
		snprintf(err, errlen, "redis.tls: out of memory");
		return -1;
	}
	pthread_mutex_lock(&t->mu);
	old = t->ctx;
	old_name = t->server_name;
	t->ctx = ctx;
	t->server_name = name;
	t->gen++;
	pthread_mutex_unlock(&t->mu);
	SSL_CTX_free(old); /* SSLs made from it hold their own reference */
	rl_free(old_name);
	/* New files: whatever failed before may fail anew, and be said. */
	atomic_store(&t->logged, 0);
	return 0;
}

int
redis_tls_check(const struct redis_tls_config *tc, const struct tls_file **bad,
    char *err, size_t errlen)
{
	SSL_CTX *ctx = ctx_new(tc, bad, err, errlen);

	if (ctx == NULL)
		return -1;
	SSL_CTX_free(ctx);
	return 0;
}

void
redis_tls_session_clear(struct redis_tls_session *s)
{
	if (s->sess != NULL)
		SSL_SESSION_free(s->sess);
	s->sess = NULL;
	s->gen = 0;
}

/* Is name an IPv4 or IPv6 address (no SNI for those, RFC 6066)? */
static bool
is_ip_literal(const char *name)
{
	unsigned char buf[sizeof(struct in6_addr)];

	return inet_pton(AF_INET, name, buf) == 1 ||
	    inet_pton(AF_INET6, name, buf) == 1;
}

SSL *
redis_tls_ssl_new(struct redis_tls *t, const char *host, int port,
    struct redis_tls_session *sess, char *err, size_t errlen)
{
	const char *name;
	char why[160];
	SSL_SESSION *offer;
	SSL *ssl;

	ERR_clear_error();
	pthread_mutex_lock(&t->mu);
	name = t->server_name != NULL ? t->server_name : host;
	if ((ssl = SSL_new(t->ctx)) == NULL)
		goto fail;
	/* An IP address is checked as one (SAN iPAddress), and sent in no
	 * SNI (RFC 6066).  Not by SSL_set1_host(): OpenSSL 1.1.1's takes
	 * it for a DNS name (3.0's tells them apart); set1_ip_asc is the
	 * same on both. */
	if (is_ip_literal(name)) {
		if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) !=
		    1)
			goto fail;
	} else if (SSL_set1_host(ssl, name) != 1 ||
	    SSL_set_tlsext_host_name(ssl, name) != 1)
		goto fail;
	/* Resume only a session of this context, with this server. */
	if (sess->sess != NULL &&
	    (sess->gen != t->gen || sess->port != port ||
		strcmp(sess->host, host) != 0))
		redis_tls_session_clear(sess);
	if (sess->sess != NULL &&
	    (offer = SSL_SESSION_dup(sess->sess)) != NULL) {
		(void)SSL_set_session(ssl, offer);
		SSL_SESSION_free(offer); /* the SSL holds it */
	}
	sess->gen = t->gen;
	sess->port = port;
	util_strlcpy(sess->host, host, sizeof(sess->host));
	SSL_set_app_data(ssl, sess);
	pthread_mutex_unlock(&t->mu);
	return ssl;
fail:
	pthread_mutex_unlock(&t->mu);
	snprintf(err, errlen, REDIS_TLS_PREFIX "%s",
	    ssl_error_text(why, sizeof(why)));
	SSL_free(ssl);
	return NULL;
}

/* What the server's certificate failed on, from the verify result. */
static enum redis_tls_reason
verify_reason(long v)
{
	switch (v) {
	case X509_V_ERR_CERT_HAS_EXPIRED:
		return REDIS_TLS_EXPIRED;
	case X509_V_ERR_CERT_NOT_YET_VALID:
		return REDIS_TLS_NOT_YET_VALID;
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
	case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
	case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
	case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
		return REDIS_TLS_UNKNOWN_CA;
	case X509_V_ERR_HOSTNAME_MISMATCH:
	case X509_V_ERR_IP_ADDRESS_MISMATCH:
		return REDIS_TLS_NAME;
	default:
		return REDIS_TLS_CERT;
	}
}

/* What an alert from the server (or a local error) in OpenSSL's queue
 * means. */
static enum redis_tls_reason
queue_reason(unsigned long e)
{
	switch (ERR_GET_REASON(e)) {
	case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
	case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
	case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
	case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
	case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
	case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
	case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
		return REDIS_TLS_CLIENT_CERT;
	case SSL_R_WRONG_VERSION_NUMBER:
	case SSL_R_UNKNOWN_PROTOCOL:
	case SSL_R_PACKET_LENGTH_TOO_LONG:
		return REDIS_TLS_NOT_TLS;
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
	case SSL_R_UNEXPECTED_EOF_WHILE_READING:
		return REDIS_TLS_CLOSED; /* no close_notify */
#endif
	default:
		return REDIS_TLS_OTHER;
	}
}

/* Log why for host:port if its reason was not said lately. */
static void
tls_report(struct redis_tls *t, enum redis_tls_reason r, const char *host,
    int port, const char *why)
{
	int64_t now = util_monotonic_us();
	unsigned bit = 1u << r, seen;

	if (now - atomic_load(&t->last_fail_us) > REDIS_TLS_RELOG_US)
		atomic_store(&t->logged, 0);
	atomic_store(&t->last_fail_us, now);
	seen = atomic_fetch_or(&t->logged, bit);
	if (seen & bit)
		return;
	log_warnx("redis %s:%d: %s", host, port, why);
}

enum redis_tls_reason
redis_tls_fail(struct redis_tls *t, SSL *ssl, int ret, bool handshake,
    const char *host, int port, char *why, size_t whylen)
{
	int se = SSL_get_error(ssl, ret);
	long v = SSL_get_verify_result(ssl);
	unsigned long e = ERR_peek_error();
	enum redis_tls_reason r;
	char detail[160], name[256];

	detail[0] = '\0';
	if (v != X509_V_OK) {
		r = verify_reason(v);
		snprintf(detail, sizeof(detail), "%s",
		    X509_verify_cert_error_string(v));
	} else if (se == SSL_ERROR_SSL && e != 0) {
		r = queue_reason(e);
		(void)ssl_error_text(detail, sizeof(detail));
	} else if (se == SSL_ERROR_ZERO_RETURN)
		r = REDIS_TLS_SHUTDOWN;
	else
		r = REDIS_TLS_CLOSED;
	ERR_clear_error();
	pthread_mutex_lock(&t->mu);
	util_strlcpy(name, t->server_name != NULL ? t->server_name : host,
	    sizeof(name));
	pthread_mutex_unlock(&t->mu);
	switch (r) {
	case REDIS_TLS_EXPIRED:
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX "the server's certificate has expired");
		break;
	case REDIS_TLS_NOT_YET_VALID:
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX
		    "the server's certificate is not valid "
		    "yet (check the clocks)");
		break;
	case REDIS_TLS_UNKNOWN_CA:
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX
		    "the server's certificate is signed by "
		    "an unknown CA (%s; set redis.tls.ca_file)",
		    detail);
		break;
	case REDIS_TLS_NAME:
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX
		    "the server's certificate does not "
		    "match the name %s (set "
		    "redis.tls.server_name)",
		    name);
		break;
	case REDIS_TLS_CERT:
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX "the server's certificate is refused: %s",
		    detail);
		break;
	case REDIS_TLS_CLIENT_CERT:
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX
		    "the server refused the client "
		    "certificate (%s; see redis.tls.cert_file)",
		    detail);
		break;
	case REDIS_TLS_NOT_TLS:
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX
		    "the server does not speak TLS on this "
		    "port (%s)",
		    detail);
		break;
	case REDIS_TLS_SHUTDOWN:
		/* The server ended the session on purpose: no refusal of
		 * TLS's, whenever it came. */
		snprintf(why, whylen, "connection closed by the server");
		return r;
	case REDIS_TLS_CLOSED:
		if (!handshake) { /* an ordinary close: not TLS's doing */
			snprintf(why, whylen,
			    "connection closed by the server");
			return r;
		}
		/* No alert to say why: a refused client certificate whose
		 * alert was lost to a reset looks the same as a server
		 * that takes no more connections. */
		snprintf(why, whylen,
		    REDIS_TLS_PREFIX
		    "the server closed the connection during "
		    "the handshake with no alert (a client certificate "
		    "refused? see redis.tls.cert_file; or maxclients)");
		break;
	default:
		snprintf(why, whylen, REDIS_TLS_PREFIX "handshake failed: %s",
		    detail);
		break;
	}
	tls_report(t, r, host, port, why);
	return r;
}

void
redis_tls_fail_timeout(struct redis_tls *t, const char *host, int port)
{
	tls_report(t, REDIS_TLS_TIMEOUT, host, port, REDIS_TLS_HUNG);
}
