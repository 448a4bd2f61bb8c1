/*
 * check_tls.c - ratelimitd on Redis over TLS (docs/configuration.md, "Redis
 * over TLS"): Debian's redis-server serving TLS only (port 0, tls-port),
 * with a CA, server and client certificates made here by the openssl
 * command line (h_tls_make).
 *
 * What is shown: /acquire decided over TLS (allowed, then denied on the
 * same counter); a wrong CA, a wrong server name, an IP address the
 * certificate names only as a DNS name, an expired certificate, a missing
 * client certificate and a handshake that never comes are each refused,
 * while a session the server ends with close_notify is no TLS failure,
 * on_backend_error answers (deny: 503), /readyz says 503, the failure is
 * counted as kind "tls" and logged once with its reason; with tls-auth-clients
 * yes the client certificate is what lets the daemon in;
 * --check places a bad PEM file at its key's line and column; a Cluster
 * whose nodes speak only TLS; and a client certificate rotated under load
 * with SIGHUP, no request failing, new connections using the new one;
 * a reload that would turn TLS off, or that fails, leaving the running
 * files in use; and Sentinel with the sentinels over TLS
 * (redis.sentinel.tls).
 */
#include <check.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "check_main.h"
#include "harness.h"
#include "ops.h"

/* A fresh directory of certificates for this test. */
static void
tls_dir(char *out, size_t outlen, const char *stem)
{
	static unsigned seq;

	snprintf(out, outlen, "%s/%s-%ld-%u", h_tmpdir(), stem, (long)getpid(),
	    seq++);
	h_tls_make(out);
}

/* The YAML of a daemon listening on listen ("127.0.0.1:%PORT%" for the
 * harness) on the Redis at port, as scheme ("redis" or "rediss"): limit 2
 * a minute on ${user}, policy deny; tls holds the lines of redis.tls (4
 * spaces in), NULL for no tls: section. */
static void
render(char *yaml, size_t len, const char *listen, const char *scheme, int port,
    const char *tls)
{
	snprintf(yaml, len,
	    "listen: \"%s\"\n"
	    "threads: 2\n"
	    "shutdown_timeout: 2s\n"
	    "log_level: debug\n"
	    "backend: redis\n"
	    "redis:\n"
	    "  url: \"%s://127.0.0.1:%d/0\"\n"
	    "  timeout: 500ms\n"
	    "  pool_size: 2\n"
	    "%s%s"
	    "on_backend_error: deny\n"
	    "rules:\n"
	    "  - name: x\n"
	    "    key: \"${user}\"\n"
	    "    limit: 2\n"
	    "    window: 1m\n",
	    listen, scheme, port, tls != NULL ? "  tls:\n" : "",
	    tls != NULL ? tls : "");
}

/* A daemon on the TLS Redis at port (rediss://), as render(). */
static void
start_daemon(struct h_daemon *d, int port, const char *tls)
{
	char yaml[4096];

	render(yaml, sizeof(yaml), "127.0.0.1:%PORT%", "rediss", port, tls);
	d->redis_port = port;
	h_daemon_start(d, yaml);
}

static long
acquire(const char *user)
{
	struct h_resp r = { 0 };
	char body[128];
	long st;

	snprintf(body, sizeof(body), "{\"user\":\"%s\"}", user);
	h_http(&r, "POST", "/acquire", body, NULL);
	st = r.status;
	h_resp_free(&r);
	return st;
}

/*
 * The daemon cannot get through: the policy answers (503), /readyz says
 * 503, kind="tls" counts, and the reason (what follows "tls: ") is logged
 * once however many connections fail; or, with reason2, one of the two
 * (each at most once).
 */
static void
assert_refused2(struct h_daemon *d, int port, const char *reason,
    const char *reason2)
{
	char line[256], line2[256];
	int i, n, n2 = 0;

	for (i = 0; i < 5; i++)
		ck_assert_int_eq(acquire("alice"), 503);
	ck_assert_int_eq(ops_poll_status("/readyz", 503, 2000), 503);
	ck_assert_msg(ops_metric("ratelimitd_backend_errors_total"
				 "{backend=\"redis\",kind=\"tls\"}") >= 3,
	    "tls errors not counted");
	ck_assert_msg(ops_metric("ratelimitd_redis_errors_total"
				 "{kind=\"tls\"}") >= 3,
	    "tls errors not counted as ratelimitd_redis_errors_total");
	snprintf(line, sizeof(line), "msg=\"redis 127.0.0.1:%d: tls: %s", port,
	    reason);
	n = ops_count_in_file(d->log, line);
	if (reason2 != NULL) {
		snprintf(line2, sizeof(line2),
		    "msg=\"redis 127.0.0.1:%d: tls: %s", port, reason2);
		n2 = ops_count_in_file(d->log, line2);
		ck_assert_msg(n <= 1 && n2 <= 1 && n + n2 >= 1,
		    "want \"%s\" or \"%s\" once each at most", line, line2);
	} else
		ck_assert_msg(n == 1, "want one line with \"%s\"", line);
	ck_assert_msg(ops_count_in_file(d->log, "PRIVATE KEY") == 0,
	    "key material in the log");
}

static void
assert_refused(struct h_daemon *d, int port, const char *reason)
{
	assert_refused2(d, port, reason, NULL);
}

/* Over TLS as over TCP: the same counter, allowed then denied; the key is
 * in Redis.  Connections the server drops are remade, resuming their TLS
 * session, and such a drop is no TLS failure. */
START_TEST(test_acquire_over_tls)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], tls[H_PATH_MAX + 64], line[128];
	const char *out;
	int i;

	tls_dir(dir, sizeof(dir), "tls");
	red.tls_dir = dir;
	h_redis_start(&red);
	snprintf(tls, sizeof(tls), "    ca_file: %s/ca.pem\n", dir);
	start_daemon(&d, red.port, tls);
	ck_assert_int_eq(acquire("alice"), 200);
	ck_assert_int_eq(acquire("alice"), 200);
	ck_assert_int_eq(acquire("alice"), 429);
	ck_assert_int_eq(acquire("bob"), 200);
	ck_assert_int_eq(ops_poll_status("/readyz", 200, 2000), 200);
	ck_assert_str_eq(h_redis_cli(&red,
			     (const char *const[]){
				 "EXISTS", "rl:x:{alice}", NULL }),
	    "1");
	ck_assert_int_eq(ops_metric("ratelimitd_backend_errors_total"
				    "{backend=\"redis\",kind=\"tls\"}"),
	    0);

	out = h_redis_cli(&red,
	    (const char *const[]){
		"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes", NULL });
	ck_assert_msg(atoi(out) >= 1, "CLIENT KILL: %s", out);
	h_sleep_ms(100);
	for (i = 0; i < 20 && ops_count_in_file(d.log, "session resumed") == 0;
	     i++) {
		(void)acquire("carol");
		h_sleep_ms(50);
	}
	ck_assert_msg(ops_count_in_file(d.log, "session resumed") >= 1,
	    "no TLS session resumed");
	ck_assert_int_eq(ops_metric("ratelimitd_backend_errors_total"
				    "{backend=\"redis\",kind=\"tls\"}"),
	    0);
	snprintf(line, sizeof(line),
	    "msg=\"redis 127.0.0.1:%d: tls: ", red.port);
	ck_assert_int_eq(ops_count_in_file(d.log, line), 0);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* The server's certificate is of a CA the daemon was not given. */
START_TEST(test_wrong_ca)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], other[H_PATH_MAX], tls[H_PATH_MAX + 64];

	tls_dir(dir, sizeof(dir), "tls");
	tls_dir(other, sizeof(other), "other");
	red.tls_dir = dir;
	h_redis_start(&red);
	snprintf(tls, sizeof(tls), "    ca_file: %s/ca.pem\n", other);
	start_daemon(&d, red.port, tls);
	assert_refused(&d, red.port,
	    "the server's certificate is signed by an unknown CA");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* server_name is verified: a certificate for localhost is not one for
 * redis.example. */
START_TEST(test_wrong_name)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], tls[H_PATH_MAX + 128];

	tls_dir(dir, sizeof(dir), "tls");
	red.tls_dir = dir;
	h_redis_start(&red);
	snprintf(tls, sizeof(tls),
	    "    ca_file: %s/ca.pem\n    server_name: redis.example\n", dir);
	start_daemon(&d, red.port, tls);
	assert_refused(&d, red.port,
	    "the server's certificate does not match the name "
	    "redis.example");
	h_daemon_stop(&d);
	h_redis_stop(&red);

	/* The name the certificate has is good. */
	h_redis_start(&red);
	snprintf(tls, sizeof(tls),
	    "    ca_file: %s/ca.pem\n    server_name: localhost\n", dir);
	start_daemon(&d, red.port, tls);
	ck_assert_int_eq(acquire("alice"), 200);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* Run the openssl command line (output to dir/openssl.log). */
static void
openssl_in(const char *dir, const char *const argv[])
{
	char log[H_PATH_MAX + 16];

	snprintf(log, sizeof(log), "%s/openssl.log", dir);
	if (h_run((char *const *)argv, log) != 0) {
		h_print_file("openssl", log);
		ck_abort_msg("openssl %s failed", argv[1]);
	}
}

/* dir/dnsip.pem and .key, of dir's CA, naming 127.0.0.1 only as a DNS
 * name (subjectAltName DNS:127.0.0.1, no IP address). */
static void
dns_named_ip_cert(const char *dir)
{
	char key[H_PATH_MAX + 16], csr[H_PATH_MAX + 16], pem[H_PATH_MAX + 16],
	    ca[H_PATH_MAX + 16], cakey[H_PATH_MAX + 16], ext[H_PATH_MAX + 16],
	    serial[H_PATH_MAX + 16];

	snprintf(key, sizeof(key), "%s/dnsip.key", dir);
	snprintf(csr, sizeof(csr), "%s/dnsip.csr", dir);
	snprintf(pem, sizeof(pem), "%s/dnsip.pem", dir);
	snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
	snprintf(cakey, sizeof(cakey), "%s/ca.key", dir);
	snprintf(ext, sizeof(ext), "%s/dnsip.cnf", dir);
	snprintf(serial, sizeof(serial), "%s/ca.srl", dir);
	openssl_in(dir,
	    (const char *const[]){ "openssl", "req", "-new", "-newkey", "ec",
		"-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
		"-out", csr, "-subj", "/CN=127.0.0.1", NULL });
	ops_write_file(ext,
	    "subjectAltName=DNS:127.0.0.1\n"
	    "extendedKeyUsage=serverAuth\n");
	openssl_in(dir,
	    (const char *const[]){ "openssl", "x509", "-req", "-in", csr, "-CA",
		ca, "-CAkey", cakey, "-CAserial", serial, "-CAcreateserial",
		"-days", "2", "-extfile", ext, "-out", pem, NULL });
}

/* An IP address is checked against the certificate's IP addresses, never
 * its DNS names: a certificate that names 127.0.0.1 only as a DNS name is
 * refused for the address 127.0.0.1 (the good certificates of the other
 * cases carry it as an IP address and pass). */
START_TEST(test_ip_not_dns_name)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], tls[H_PATH_MAX + 64], extra[2 * H_PATH_MAX + 64];

	tls_dir(dir, sizeof(dir), "tls");
	dns_named_ip_cert(dir);
	snprintf(extra, sizeof(extra),
	    "tls-cert-file %s/dnsip.pem\ntls-key-file %s/dnsip.key\n", dir,
	    dir);
	red.tls_dir = dir;
	red.extra = extra;
	h_redis_start(&red);
	snprintf(tls, sizeof(tls), "    ca_file: %s/ca.pem\n", dir);
	start_daemon(&d, red.port, tls);
	assert_refused(&d, red.port,
	    "the server's certificate does not match the name 127.0.0.1");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* A server certificate that has expired. */
START_TEST(test_expired)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], tls[3 * H_PATH_MAX + 128],
	    extra[2 * H_PATH_MAX + 64];

	tls_dir(dir, sizeof(dir), "tls");
	h_tls_cert(dir, "expired", 0); /* notAfter: now */
	h_sleep_ms(1100);
	snprintf(extra, sizeof(extra),
	    "tls-cert-file %s/expired.pem\ntls-key-file %s/expired.key\n", dir,
	    dir);
	red.tls_dir = dir;
	red.extra = extra;
	h_redis_start(&red);
	/* The client's expired too: said when the files are loaded, since
	 * a server's refusal of it often comes with no alert. */
	snprintf(tls, sizeof(tls),
	    "    ca_file: %s/ca.pem\n    cert_file: %s/expired.pem\n"
	    "    key_file: %s/expired.key\n",
	    dir, dir, dir);
	start_daemon(&d, red.port, tls);
	assert_refused(&d, red.port, "the server's certificate has expired");
	ck_assert_msg(ops_count_in_file(d.log,
			  "the client certificate has expired") == 1,
	    "the expired client certificate was not warned about at start");
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* tls-auth-clients yes: without a client certificate the server refuses
 * the daemon; with one of its CA it lets it in. */
START_TEST(test_client_certificate)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], tls[3 * H_PATH_MAX + 128];

	tls_dir(dir, sizeof(dir), "tls");
	red.tls_dir = dir;
	red.extra = "tls-auth-clients yes\n";
	h_redis_start(&red);
	snprintf(tls, sizeof(tls), "    ca_file: %s/ca.pem\n", dir);
	start_daemon(&d, red.port, tls);
	/* TLS 1.3: the refusal is an alert after the handshake, or only
	 * the connection closing when the alert is lost to a reset. */
	assert_refused2(&d, red.port, "the server refused the client",
	    "the server closed the connection during the handshake");
	h_daemon_stop(&d);

	snprintf(tls, sizeof(tls),
	    "    ca_file: %s/ca.pem\n    cert_file: %s/client.pem\n"
	    "    key_file: %s/client.key\n",
	    dir, dir, dir);
	start_daemon(&d, red.port, tls);
	ck_assert_int_eq(acquire("alice"), 200);
	ck_assert_int_eq(acquire("alice"), 200);
	ck_assert_int_eq(acquire("alice"), 429);
	h_daemon_stop(&d);
	h_redis_stop(&red);
}
END_TEST

/* A server that accepts the connection and never answers the handshake:
 * the connect deadline (redis.timeout) ends it, and the policy answers. */
START_TEST(test_handshake_timeout)
{
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], tls[H_PATH_MAX + 64];
	long long t0;
	int port, fd = ops_silent_listener(&port);

	tls_dir(dir, sizeof(dir), "tls");
	snprintf(tls, sizeof(tls), "    ca_file: %s/ca.pem\n", dir);
	start_daemon(&d, port, tls);
	t0 = h_now_ms();
	ck_assert_int_eq(acquire("alice"), 503);
	ck_assert_int_lt(h_now_ms() - t0, 1500);
	ck_assert_int_eq(ops_poll_status("/readyz", 503, 2000), 503);
	h_sleep_ms(100);
	ck_assert_msg(ops_count_in_file(d.log,
			  "tls: no handshake within the timeout") >= 1,
	    "no handshake timeout in the log");
	h_daemon_stop(&d);
	close(fd);
}
END_TEST

/* A TLS server on a thread of the test's: each connection it accepts
 * gets the whole handshake, then at once close_notify (as CLIENT KILL
 * sends) when notify, else a bare close (FIN), and is read to its end
 * before it is closed, so that no reset follows. */
struct shut_server {
	int fd;
	SSL_CTX *ctx;
	bool notify;
	pthread_t thread;
	atomic_bool stop;
	atomic_int shut; /* connections closed after the handshake */
};

static void *
shut_main(void *arg)
{
	struct shut_server *s = arg;
	struct pollfd p = { .fd = s->fd, .events = POLLIN };
	struct timeval tv = { .tv_sec = 1 };
	char buf[4096];
	SSL *ssl;
	int c;

	while (!atomic_load(&s->stop)) {
		if (poll(&p, 1, 100) <= 0 ||
		    (c = accept(s->fd, NULL, NULL)) < 0)
			continue;
		(void)setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		if ((ssl = SSL_new(s->ctx)) != NULL &&
		    SSL_set_fd(ssl, c) == 1 && SSL_accept(ssl) == 1) {
			if (s->notify)
				(void)SSL_shutdown(ssl);
			atomic_fetch_add(&s->shut, 1);
			(void)shutdown(c, SHUT_WR);
			while (read(c, buf, sizeof(buf)) > 0)
				;
		}
		SSL_free(ssl);
		close(c);
	}
	return NULL;
}

/* The daemon d on a shut_server that notifies or not: 503 (policy
 * deny), and the server did close sessions after their handshake; the
 * server stopped, the daemon left running. */
static void
shut_run(struct h_daemon *d, bool notify)
{
	struct shut_server s = { .fd = -1, .notify = notify };
	char dir[H_PATH_MAX], path[H_PATH_MAX + 16], tls[H_PATH_MAX + 64];
	int port, i;

	tls_dir(dir, sizeof(dir), "tls");
	ck_assert_ptr_nonnull(s.ctx = SSL_CTX_new(TLS_server_method()));
	snprintf(path, sizeof(path), "%s/server.pem", dir);
	ck_assert_int_eq(SSL_CTX_use_certificate_chain_file(s.ctx, path), 1);
	snprintf(path, sizeof(path), "%s/server.key", dir);
	ck_assert_int_eq(SSL_CTX_use_PrivateKey_file(s.ctx, path,
			     SSL_FILETYPE_PEM),
	    1);
	s.fd = ops_silent_listener(&port);
	ck_assert_int_eq(pthread_create(&s.thread, NULL, shut_main, &s), 0);

	snprintf(tls, sizeof(tls), "    ca_file: %s/ca.pem\n", dir);
	start_daemon(d, port, tls);
	for (i = 0; i < 5; i++)
		ck_assert_int_eq(acquire("alice"), 503);
	ck_assert_msg(atomic_load(&s.shut) >= 1, "no session was closed");
	atomic_store(&s.stop, true);
	pthread_join(s.thread, NULL);
	close(s.fd);
	SSL_CTX_free(s.ctx);
}

/*
 * A server that ends each session right after the handshake, before any
 * reply.  With close_notify it is a close on purpose (CLIENT KILL, an
 * idle timeout): kind "connect", logged as a closed connection.  (It used
 * to be taken for a refused client certificate: kind "tls", "the server
 * closed the connection during the handshake".)  With a bare close it
 * may be a refused certificate whose alert was lost: kind "tls", the
 * warning naming both.
 */
START_TEST(test_close_notify_no_tls_failure)
{
	struct h_daemon d = { 0 };

	shut_run(&d, true);
	ck_assert_msg(ops_wait_metric("ratelimitd_backend_errors_total"
				      "{backend=\"redis\",kind=\"connect\"}",
			  1, 2000) >= 1,
	    "the closes were not counted as connect");
	ck_assert_msg(ops_metric("ratelimitd_backend_errors_total"
				 "{backend=\"redis\",kind=\"tls\"}") <= 0,
	    "a close on purpose counted as a TLS failure");
	ck_assert_int_eq(ops_count_in_file(d.log, "tls: the server closed"), 0);
	ck_assert_msg(ops_count_in_file(d.log,
			  "connection closed by the "
			  "server") >= 1,
	    "no closed connection in the log");
	h_daemon_stop(&d);

	memset(&d, 0, sizeof(d));
	shut_run(&d, false);
	ck_assert_msg(ops_wait_metric("ratelimitd_backend_errors_total"
				      "{backend=\"redis\",kind=\"tls\"}",
			  1, 2000) >= 1,
	    "a bare close in the handshake not counted as tls");
	ck_assert_msg(ops_count_in_file(d.log,
			  "tls: the server closed the connection during the "
			  "handshake with no alert") >= 1,
	    "no warning of a close with no alert");
	h_daemon_stop(&d);
}
END_TEST

/* `ratelimitd -c yaml --check` with its output in out: the exit status. */
static int
run_check(const char *yaml, const char *out)
{
	char *argv[] = { getenv("RATELIMITD_BIN"), (char *)"-c", (char *)yaml,
		(char *)"--check", NULL };

	return h_run(argv, out);
}

/* --check reads the PEM files: a bad one is FILE:LINE:COL of its key. */
START_TEST(test_check_bad_pem)
{
	char dir[H_PATH_MAX], yaml[H_PATH_MAX + 16], bad[H_PATH_MAX + 16],
	    out[H_PATH_MAX + 16], text[4 * H_PATH_MAX], want[4 * H_PATH_MAX];
	char *log;

	tls_dir(dir, sizeof(dir), "tls");
	snprintf(bad, sizeof(bad), "%s/bad.pem", dir);
	ops_write_file(bad, "-----BEGIN CERTIFICATE-----\nnot base64\n");
	snprintf(yaml, sizeof(yaml), "%s/check.yaml", dir);
	snprintf(out, sizeof(out), "%s/check.out", dir);

	snprintf(text, sizeof(text),
	    "backend: redis\nredis:\n  url: \"rediss://127.0.0.1:1\"\n"
	    "  tls:\n    ca_file: %s/ca.pem\n    cert_file: %s\n"
	    "    key_file: %s/client.key\n",
	    dir, bad, dir);
	ops_write_file(yaml, text);
	ck_assert_int_eq(run_check(yaml, out), 1);
	snprintf(want, sizeof(want), "%s:6:16: redis.tls.cert_file: ", yaml);
	log = ops_slurp(out);
	ck_assert_msg(strstr(log, want) != NULL, "want %s in: %s", want, log);
	free(log);

	/* A missing CA file, and a key that is not the certificate's. */
	snprintf(text, sizeof(text),
	    "backend: redis\nredis:\n  url: \"rediss://127.0.0.1:1\"\n"
	    "  tls:\n    ca_file: %s/nope.pem\n",
	    dir);
	ops_write_file(yaml, text);
	ck_assert_int_eq(run_check(yaml, out), 1);
	snprintf(want, sizeof(want),
	    "%s:5:14: redis.tls.ca_file: cannot read %s/nope.pem", yaml, dir);
	log = ops_slurp(out);
	ck_assert_msg(strstr(log, want) != NULL, "want %s in: %s", want, log);
	free(log);

	snprintf(text, sizeof(text),
	    "backend: redis\nredis:\n  url: \"rediss://127.0.0.1:1\"\n"
	    "  tls:\n    cert_file: %s/client.pem\n"
	    "    key_file: %s/server.key\n",
	    dir, dir);
	ops_write_file(yaml, text);
	ck_assert_int_eq(run_check(yaml, out), 1);
	snprintf(want, sizeof(want), "%s:6:15: redis.tls.key_file: ", yaml);
	log = ops_slurp(out);
	ck_assert_msg(strstr(log, want) != NULL &&
		strstr(log, "is not the key of") != NULL,
	    "want %s in: %s", want, log);
	ck_assert_msg(strstr(log, "PRIVATE KEY") == NULL, "key material: %s",
	    log);
	free(log);

	/* And good files pass. */
	snprintf(text, sizeof(text),
	    "backend: redis\nredis:\n  url: \"rediss://127.0.0.1:1\"\n"
	    "  tls:\n    ca_file: %s/ca.pem\n    cert_file: %s/client.pem\n"
	    "    key_file: %s/client.key\n",
	    dir, dir, dir);
	ops_write_file(yaml, text);
	ck_assert_int_eq(run_check(yaml, out), 0);
}
END_TEST

/*
 * A client certificate rotated under load: the files are replaced by a
 * certificate of a second CA and the daemon gets SIGHUP while requests
 * run; none fails (open connections keep their session).  Then the server
 * trusts only the second CA and drops every client: the connections made
 * anew present the new certificate and are let in.
 */
START_TEST(test_rotate_under_load)
{
	struct h_redis red = { 0 };
	struct h_daemon d = { 0 };
	struct h_load *load;
	struct h_load_stats st;
	char dir[H_PATH_MAX], dir2[H_PATH_MAX], live[H_PATH_MAX + 8];
	char bundle[H_PATH_MAX + 16], tls[4 * H_PATH_MAX],
	    path[H_PATH_MAX + 64];
	char extra[H_PATH_MAX + 64], ca2[H_PATH_MAX + 16], *text, *more;
	const char *outp;

	tls_dir(dir, sizeof(dir), "tls");
	tls_dir(dir2, sizeof(dir2), "tls2");
	/* The server trusts both CAs at first. */
	snprintf(path, sizeof(path), "%s/ca.pem", dir);
	text = ops_slurp(path);
	snprintf(path, sizeof(path), "%s/ca.pem", dir2);
	more = ops_slurp(path);
	snprintf(bundle, sizeof(bundle), "%s/bundle.pem", dir);
	text = realloc(text, strlen(text) + strlen(more) + 1);
	ck_assert(text != NULL);
	strcat(text, more);
	ops_write_file(bundle, text);
	free(text);
	free(more);
	snprintf(extra, sizeof(extra),
	    "tls-auth-clients yes\ntls-ca-cert-file %s\n", bundle);
	red.tls_dir = dir;
	red.extra = extra;
	h_redis_start(&red);

	/* The daemon's certificate lives in a directory of its own. */
	snprintf(live, sizeof(live), "%s/live", dir);
	ck_assert(mkdir(live, 0700) == 0);
	snprintf(path, sizeof(path), "%s/client.pem", dir);
	text = ops_slurp(path);
	snprintf(path, sizeof(path), "%s/client.pem", live);
	ops_write_file(path, text);
	free(text);
	snprintf(path, sizeof(path), "%s/client.key", dir);
	text = ops_slurp(path);
	snprintf(path, sizeof(path), "%s/client.key", live);
	ops_write_file(path, text);
	free(text);
	snprintf(tls, sizeof(tls),
	    "    ca_file: %s/ca.pem\n    cert_file: %s/client.pem\n"
	    "    key_file: %s/client.key\n",
	    dir, live, live);
	start_daemon(&d, red.port, tls);
	ck_assert_int_eq(acquire("warm"), 200);

	load = h_load_start(d.port, 4, "{\"user\":\"l%d\"}");
	h_sleep_ms(300);
	/* Rotate: the second CA's client certificate, each file renamed
	 * into place, then SIGHUP. */
	snprintf(path, sizeof(path), "%s/client.pem", dir2);
	text = ops_slurp(path);
	snprintf(path, sizeof(path), "%s/client.pem", live);
	ops_replace_file(path, text);
	free(text);
	snprintf(path, sizeof(path), "%s/client.key", dir2);
	text = ops_slurp(path);
	snprintf(path, sizeof(path), "%s/client.key", live);
	ops_replace_file(path, text);
	free(text);
	ck_assert(kill(d.pid, SIGHUP) == 0);
	ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
				      "{result=\"success\"}",
			  1, 2000) == 1,
	    "SIGHUP did not reload");
	h_sleep_ms(300);
	h_load_stop(load, &st);
	fprintf(stderr,
	    "tls rotation under load: %lld requests, %lld ok, %lld denied, "
	    "%lld unavailable, %lld other\n",
	    st.requests, st.ok, st.denied, st.unavailable, st.other);
	ck_assert_int_gt(st.requests, 0);
	ck_assert_int_eq(st.unavailable, 0);
	ck_assert_int_eq(st.other, 0);

	/* Now only the second CA is trusted, and every client is dropped:
	 * the new connections present the rotated certificate. */
	snprintf(ca2, sizeof(ca2), "%s/ca.pem", dir2);
	outp = h_redis_cli(&red,
	    (const char *const[]){
		"CONFIG", "SET", "tls-ca-cert-file", ca2, NULL });
	ck_assert_msg(strcmp(outp, "OK") == 0, "CONFIG SET: %s", outp);
	/* redis-cli must now show a certificate of the second CA too. */
	red.tls_dir = dir2;
	outp = h_redis_cli(&red,
	    (const char *const[]){
		"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes", NULL });
	ck_assert_msg(atoi(outp) >= 1, "CLIENT KILL: %s", outp);
	ck_assert_int_eq(ops_poll_status("/readyz", 200, 3000), 200);
	ck_assert_int_eq(acquire("after"), 200);
	ck_assert_msg(ops_count_in_file(d.log, "refused the client") == 0,
	    "the old certificate was used");
	h_daemon_stop(&d);
	red.tls_dir = dir;
	h_redis_stop(&red);
}
END_TEST

/* The YAML of a daemon on the TLS Cluster whose seed is port, trusting
 * the CA of dir, limit 1 a minute on ${user}; listen as render(). */
static void
render_cluster(char *yaml, size_t len, const char *listen, int port,
    const char *dir)
{
	snprintf(yaml, len,
	    "listen: \"%s\"\n"
	    "threads: 2\n"
	    "shutdown_timeout: 2s\n"
	    "backend: redis\n"
	    "redis:\n"
	    "  cluster: [\"127.0.0.1:%d\"]\n"
	    "  timeout: 500ms\n"
	    "  pool_size: 2\n"
	    "  tls:\n"
	    "    ca_file: %s/ca.pem\n"
	    "on_backend_error: deny\n"
	    "rules:\n"
	    "  - name: x\n"
	    "    key: \"${user}\"\n"
	    "    limit: 1\n"
	    "    window: 1m\n",
	    listen, port, dir);
}

/* A Redis Cluster whose nodes speak only TLS: the seed and every node the
 * slot map names are reached over TLS. */
START_TEST(test_cluster_over_tls)
{
	struct h_cluster cl;
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], yaml[2 * H_PATH_MAX + 1024], user[32];
	int i, ok = 0, denied = 0;

	tls_dir(dir, sizeof(dir), "tls");
	h_cluster_start_tls(&cl, dir);
	render_cluster(yaml, sizeof(yaml), "127.0.0.1:%PORT%", cl.node[0].port,
	    dir);
	d.redis_port = cl.node[0].port;
	h_daemon_start(&d, yaml);
	ck_assert_int_eq(ops_poll_status("/readyz", 200, 5000), 200);
	/* 60 users spread over the three primaries' slots. */
	for (i = 0; i < 60; i++) {
		snprintf(user, sizeof(user), "u%d", i);
		ok += acquire(user) == 200;
		denied += acquire(user) == 429;
	}
	ck_assert_int_eq(ok, 60);
	ck_assert_int_eq(denied, 60);
	ck_assert_int_eq(ops_metric("ratelimitd_backend_errors_total"
				    "{backend=\"redis\",kind=\"tls\"}"),
	    0);
	h_daemon_stop(&d);
	h_cluster_stop(&cl);
}
END_TEST

/* Sentinel with redis.sentinel.tls: the sentinel and the primary it names
 * both speak only TLS.  Without sentinel.tls the sentinel is not reached
 * and the policy answers. */
START_TEST(test_sentinel_over_tls)
{
	struct h_redis primary = { 0 }, sentinel = { 0 };
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], extra[256], yaml[2 * H_PATH_MAX + 1024];
	const char *out;
	int tls;

	tls_dir(dir, sizeof(dir), "tls");
	primary.tls_dir = dir;
	h_redis_start(&primary);
	snprintf(extra, sizeof(extra),
	    "sentinel monitor mymaster 127.0.0.1 %d 1\n"
	    "sentinel down-after-milliseconds mymaster 1000\n"
	    "tls-replication yes\n",
	    primary.port);
	sentinel.sentinel = true;
	sentinel.tls_dir = dir;
	sentinel.extra = extra;
	h_redis_start(&sentinel);
	out = h_redis_cli(&sentinel,
	    (const char *const[]){
		"SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster", NULL });
	ck_assert_msg(strstr(out, "127.0.0.1") != NULL, "sentinel: %s", out);

	for (tls = 1; tls >= 0; tls--) {
		snprintf(yaml, sizeof(yaml),
		    "listen: \"127.0.0.1:%%PORT%%\"\n"
		    "threads: 2\n"
		    "shutdown_timeout: 2s\n"
		    "backend: redis\n"
		    "redis:\n"
		    "  timeout: 500ms\n"
		    "  pool_size: 2\n"
		    "  tls:\n"
		    "    ca_file: %s/ca.pem\n"
		    "  sentinel:\n"
		    "    master: mymaster\n"
		    "    nodes: [\"127.0.0.1:%d\"]\n"
		    "    tls: %s\n"
		    "on_backend_error: deny\n"
		    "rules:\n"
		    "  - name: x\n"
		    "    key: \"${user}\"\n"
		    "    limit: 2\n"
		    "    window: 1m\n",
		    dir, sentinel.port, tls ? "true" : "false");
		d.redis_port = sentinel.port;
		h_daemon_start(&d, yaml);
		if (tls) {
			ck_assert_int_eq(ops_poll_status("/readyz", 200, 5000),
			    200);
			ck_assert_int_eq(acquire("alice"), 200);
			ck_assert_int_eq(acquire("alice"), 200);
			ck_assert_int_eq(acquire("alice"), 429);
		} else {
			h_sleep_ms(500);
			ck_assert_int_eq(acquire("alice"), 503);
			ck_assert_int_eq(ops_poll_status("/readyz", 503, 2000),
			    503);
		}
		h_daemon_stop(&d);
		memset(&d, 0, sizeof(d));
	}
	h_redis_stop(&sentinel);
	h_redis_stop(&primary);
}
END_TEST

/*
 * Turning TLS off by reload applies at the next start: the running
 * redis.tls is kept, files and all.  The daemon runs redis:// with a tls:
 * section naming the CA; the new file drops the section (TLS off), or
 * drops it and says rediss:// (TLS on, but with the system's CAs once the
 * running redis:// is kept).  After SIGHUP every connection is dropped:
 * the new ones still trust the CA, and the reload said redis.tls waits
 * for a restart.
 */
START_TEST(test_reload_keeps_tls_switch)
{
	static const char *const schemes[] = { "redis", "rediss" };
	struct h_redis red = { 0 };
	struct h_daemon d;
	char dir[H_PATH_MAX], tls[H_PATH_MAX + 64], yaml[4096], listen[32],
	    user[48];
	const char *out;
	size_t i;
	int j;

	tls_dir(dir, sizeof(dir), "tls");
	red.tls_dir = dir;
	h_redis_start(&red);
	snprintf(tls, sizeof(tls), "    ca_file: %s/ca.pem\n", dir);
	for (i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
		memset(&d, 0, sizeof(d));
		render(yaml, sizeof(yaml), "127.0.0.1:%PORT%", "redis",
		    red.port, tls);
		d.redis_port = red.port;
		h_daemon_start(&d, yaml);
		ck_assert_int_eq(acquire("alice"), 200);

		snprintf(listen, sizeof(listen), "127.0.0.1:%d", d.port);
		render(yaml, sizeof(yaml), listen, schemes[i], red.port, NULL);
		ops_replace_file(d.conf, yaml);
		ck_assert(kill(d.pid, SIGHUP) == 0);
		ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
					      "{result=\"success\"}",
				  1, 2000) >= 1,
		    "SIGHUP did not reload");
		ck_assert_msg(ops_count_in_file(d.log,
				  "reload: redis.tls changed; it applies "
				  "after a restart") >= 1,
		    "%s: redis.tls not said to wait for a restart", schemes[i]);

		out = h_redis_cli(&red,
		    (const char *const[]){ "CLIENT", "KILL", "TYPE", "normal",
			"SKIPME", "yes", NULL });
		ck_assert_msg(atoi(out) >= 1, "CLIENT KILL: %s", out);
		h_sleep_ms(200);
		ck_assert_int_eq(ops_poll_status("/readyz", 200, 3000), 200);
		for (j = 0; j < 3; j++) {
			snprintf(user, sizeof(user), "u%zu-%d", i, j);
			ck_assert_msg(acquire(user) == 200,
			    "%s: /acquire refused after the reload",
			    schemes[i]);
		}
		ck_assert_msg(ops_count_in_file(d.log, "unknown CA") == 0,
		    "%s: the CA was dropped by the reload", schemes[i]);
		h_daemon_stop(&d);
	}
	h_redis_stop(&red);
}
END_TEST

/*
 * A reload that fails keeps the running TLS files.  The new file names
 * another CA, and a client certificate with the key of another: refused
 * when the store reads them, after the CA file was read.  Every
 * connection is then dropped: the new ones still trust the running CA.
 * The start key it changes (redis.cluster, dropped) is not logged as
 * applying after a restart: the reload was refused.
 */
START_TEST(test_failed_reload_keeps_tls)
{
	struct h_cluster cl;
	struct h_daemon d = { 0 };
	char dir[H_PATH_MAX], other[H_PATH_MAX], yaml[4 * H_PATH_MAX + 1024],
	    listen[32], user[48];
	const char *out;
	int i;

	tls_dir(dir, sizeof(dir), "tls");
	tls_dir(other, sizeof(other), "other");
	h_cluster_start_tls(&cl, dir);
	render_cluster(yaml, sizeof(yaml), "127.0.0.1:%PORT%", cl.node[0].port,
	    dir);
	d.redis_port = cl.node[0].port;
	h_daemon_start(&d, yaml);
	ck_assert_int_eq(ops_poll_status("/readyz", 200, 5000), 200);
	ck_assert_int_eq(acquire("before"), 200);

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", d.port);
	snprintf(yaml, sizeof(yaml),
	    "listen: \"%s\"\n"
	    "threads: 2\n"
	    "shutdown_timeout: 2s\n"
	    "backend: redis\n"
	    "redis:\n"
	    "  timeout: 500ms\n"
	    "  pool_size: 2\n"
	    "  tls:\n"
	    "    ca_file: %s/ca.pem\n"
	    "    cert_file: %s/client.pem\n"
	    "    key_file: %s/client.key\n"
	    "on_backend_error: deny\n"
	    "rules:\n"
	    "  - name: x\n"
	    "    key: \"${user}\"\n"
	    "    limit: 1\n"
	    "    window: 1m\n",
	    listen, other, other, dir);
	ops_replace_file(d.conf, yaml);
	ck_assert(kill(d.pid, SIGHUP) == 0);
	ck_assert_msg(ops_wait_metric("ratelimitd_config_reloads_total"
				      "{result=\"failure\"}",
			  1, 2000) >= 1,
	    "the reload did not fail");
	ck_assert_msg(ops_count_in_file(d.log,
			  "reload failed, keeping the old rules") >= 1,
	    "no failed reload in the log");
	/* Nothing of the refused file applies, not even after a restart:
	 * its start keys (the cluster dropped) are not named.  (They used
	 * to be, before the reload was refused.) */
	ck_assert_msg(ops_count_in_file(d.log, "applies after a restart") == 0,
	    "a refused reload named its start keys");

	for (i = 0; i < H_CLUSTER_NODES; i++) {
		out = h_redis_cli(&cl.node[i],
		    (const char *const[]){ "CLIENT", "KILL", "TYPE", "normal",
			"SKIPME", "yes", NULL });
		ck_assert_msg(atoi(out) >= 0, "CLIENT KILL: %s", out);
	}
	h_sleep_ms(200);
	ck_assert_int_eq(ops_poll_status("/readyz", 200, 3000), 200);
	for (i = 0; i < 6; i++) {
		snprintf(user, sizeof(user), "after%d", i);
		ck_assert_msg(acquire(user) == 200,
		    "/acquire refused after the failed reload");
	}
	ck_assert_msg(ops_count_in_file(d.log, "unknown CA") == 0,
	    "the failed reload swapped the CA");
	h_daemon_stop(&d);
	h_cluster_stop(&cl);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("tls");
	TCase *tc = tcase_create("tls");

	ops_init();
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_acquire_over_tls);
	tcase_add_test(tc, test_wrong_ca);
	tcase_add_test(tc, test_wrong_name);
	tcase_add_test(tc, test_expired);
	tcase_add_test(tc, test_ip_not_dns_name);
	tcase_add_test(tc, test_client_certificate);
	tcase_add_test(tc, test_handshake_timeout);
	tcase_add_test(tc, test_close_notify_no_tls_failure);
	tcase_add_test(tc, test_check_bad_pem);
	tcase_add_test(tc, test_rotate_under_load);
	suite_add_tcase(s, tc);

	tc = tcase_create("reload");
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_reload_keeps_tls_switch);
	tcase_add_test(tc, test_failed_reload_keeps_tls);
	suite_add_tcase(s, tc);

	tc = tcase_create("scale");
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_cluster_over_tls);
	tcase_add_test(tc, test_sentinel_over_tls);
	suite_add_tcase(s, tc);
	return s;
}
