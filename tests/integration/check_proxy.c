/*
 * check_proxy.c - ratelimitd where it is deployed: behind a proxy's
 * external-authorization hook, and under systemd.
 *
 * The daemon's /auth endpoint is only as good as the proxy set-ups it is
 * documented with (docs/proxies.md), so these tests drive it the way each
 * proxy does:
 *   - nginx: a real nginx runs the shipped conf/nginx/ratelimitd.conf (only
 *     its ports are substituted, so a broken shipped file fails here) in
 *     front of an upstream, and the client must see the upstream's answers,
 *     then a 429 with Retry-After and the RateLimit headers;
 *   - Envoy's ext_authz HTTP service and Traefik's ForwardAuth: no proxy is
 *     installed, so libcurl sends requests shaped exactly like theirs, and
 *     rules whose match and key depend on method, path, host and ip prove
 *     that each attribute comes from the header docs/http.md says;
 *   - systemd's notify protocol: READY=1 once the daemon serves,
 *     RELOADING=1 then READY=1 on SIGHUP, STOPPING=1 on SIGTERM, and exit
 *     status 0.
 * The daemon comes from harness.h; nginx and the daemon under a notify
 * socket are started here.  Each is written to a list in the temporary
 * directory when it starts and crossed out when it stops, and gets
 * PR_SET_PDEATHSIG; the runner (a subreaper, see harness.h) stops and waits
 * for whatever a failed test left, by PID, after each TCase.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"

extern char **environ;

/* --- processes started here -------------------------------------------- */

/* The list of processes started here: "S pid" and "E pid" lines. */
static void
own_note(char what, pid_t pid)
{
	char path[H_PATH_MAX + 32], line[64];
	int fd, n;

	snprintf(path, sizeof(path), "%s/proxy-processes", h_tmpdir());
	n = snprintf(line, sizeof(line), "%c %ld\n", what, (long)pid);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (write(fd, line, (size_t)n) != n)
		fprintf(stderr, "check_proxy: cannot note pid %ld\n",
		    (long)pid);
	close(fd);
}

/*
 * fork and exec argv with stdout and stderr appended to log and, if env is
 * not NULL, the NULL-terminated "NAME=value" list added to the environment
 * (the RATELIMITD_* overrides and NOTIFY_SOCKET are always dropped).
 */
static pid_t
own_spawn(char *const argv[], const char *log, const char *const *env)
{
	char **envp;
	size_t n = 0, i, k = 0;
	pid_t parent = getpid(), pid;
	sigset_t none;
	int fd;

	while (environ[n] != NULL)
		n++;
	for (i = 0; env != NULL && env[i] != NULL; i++)
		;
	envp = calloc(n + i + 1, sizeof(*envp));
	ck_assert_msg(envp != NULL, "out of memory");
	for (i = 0; i < n; i++)
		if (strncmp(environ[i], "RATELIMITD_", 11) != 0 &&
		    strncmp(environ[i], "NOTIFY_SOCKET=", 14) != 0)
			envp[k++] = environ[i];
	for (i = 0; env != NULL && env[i] != NULL; i++)
		envp[k++] = (char *)env[i];
	envp[k] = NULL;
	pid = fork();
	ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0)
			_exit(126);
		dup2(fd, 1);
		dup2(fd, 2);
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0)
			dup2(fd, 0);
		for (fd = 3; fd < 1024; fd++)
			close(fd);
		execvpe(argv[0], argv, envp);
		dprintf(2, "check_proxy: exec %s: %s\n", argv[0],
		    strerror(errno));
		_exit(127);
	}
	free(envp);
	own_note('S', pid);
	return pid;
}

/* Wait at most ms for pid; true with *status if it ended. */
static bool
own_wait(pid_t pid, long long ms, int *status)
{
	long long end = h_now_ms() + ms;
	pid_t w;

	for (;;) {
		w = waitpid(pid, status, WNOHANG);
		if (w == pid)
			return true;
		if (w < 0 && errno == ECHILD && kill(pid, 0) != 0) {
			*status = -1;
			return true;
		}
		if (h_now_ms() >= end)
			return false;
		h_sleep_ms(10);
	}
}

/* SIGTERM, wait at most ms, then SIGKILL; the wait status or -1. */
static int
own_stop(pid_t pid, long long ms)
{
	int status = -1;

	if (pid <= 0)
		return -1;
	kill(pid, SIGTERM);
	if (!own_wait(pid, ms, &status)) {
		kill(pid, SIGKILL);
		own_wait(pid, 2000, &status);
		status = -1;
	}
	own_note('E', pid);
	return status;
}

/* Runner side: stop and wait for what a failed test left running. */
static void
own_reap(void)
{
	char path[H_PATH_MAX + 32], line[64];
	long pids[256], pid;
	size_t n = 0, i;
	char what;
	FILE *f;

	snprintf(path, sizeof(path), "%s/proxy-processes", h_tmpdir());
	if ((f = fopen(path, "r")) == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%c %ld", &what, &pid) != 2)
			continue;
		if (what == 'S' && n < sizeof(pids) / sizeof(pids[0]))
			pids[n++] = pid;
		for (i = 0; what == 'E' && i < n; i++)
			if (pids[i] == pid)
				pids[i] = 0;
	}
	fclose(f);
	for (i = 0; i < n; i++) {
		if (pids[i] == 0)
			continue;
		fprintf(stderr,
		    "check_proxy: pid %ld was left running by a "
		    "failed test; stopping it\n",
		    pids[i]);
		own_stop((pid_t)pids[i], 5000);
	}
}

static void
reap_all(void)
{
	own_reap();
	h_reap_orphans();
}

static void
write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_msg(f != NULL, "cannot write %s: %s", path, strerror(errno));
	fputs(text, f);
	ck_assert_msg(fclose(f) == 0, "cannot write %s", path);
}

/* The whole file as a string (caller frees); aborts if unreadable. */
static char *
read_text(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long len;

	ck_assert_msg(f != NULL, "cannot read %s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)len + 1);
	ck_assert_msg(buf != NULL, "out of memory");
	ck_assert_msg(fread(buf, 1, (size_t)len, f) == (size_t)len,
	    "cannot read %s", path);
	buf[len] = '\0';
	fclose(f);
	return buf;
}

/* A new directory in the temporary one, named after stem and the pid. */
static void
make_dir(char *out, size_t len, const char *stem)
{
	snprintf(out, len, "%s/%s-%ld", h_tmpdir(), stem, (long)getpid());
	ck_assert_msg(mkdir(out, 0755) == 0 || errno == EEXIST, "mkdir %s: %s",
	    out, strerror(errno));
}

/* --- HTTP shaped like a proxy's ------------------------------------------ */

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct h_resp *r = arg;
	size_t n = size * nmemb;
	char *p;

	if (r->len + n + 1 > r->cap) {
		r->cap = (r->len + n + 1) * 2;
		if ((p = realloc(r->body, r->cap)) == NULL)
			return 0;
		r->body = p;
	}
	memcpy(r->body + r->len, data, n);
	r->len += n;
	r->body[r->len] = '\0';
	return n;
}

static size_t
on_header(char *data, size_t size, size_t nmemb, void *arg)
{
	struct h_resp *r = arg;
	size_t n = size * nmemb, nl, vs, ve, i;
	const char *colon = memchr(data, ':', n);
	struct h_header *h;

	if (n >= 5 && memcmp(data, "HTTP/", 5) == 0) {
		for (i = 0; i < r->nhdr; i++) {
			free(r->hdr[i].name);
			free(r->hdr[i].value);
		}
		r->nhdr = 0;
		return n;
	}
	if (colon == NULL)
		return n;
	nl = (size_t)(colon - data);
	for (vs = nl + 1; vs < n && (data[vs] == ' ' || data[vs] == '\t');)
		vs++;
	for (ve = n; ve > vs && strchr("\r\n \t", data[ve - 1]) != NULL;)
		ve--;
	if (r->nhdr == r->hdrcap) {
		r->hdrcap = r->hdrcap ? r->hdrcap * 2 : 16;
		if ((h = realloc(r->hdr, r->hdrcap * sizeof(*h))) == NULL)
			return 0;
		r->hdr = h;
	}
	r->hdr[r->nhdr].name = strndup(data, nl);
	r->hdr[r->nhdr].value = strndup(data + vs, ve - vs);
	r->nhdr++;
	return n;
}

/*
 * One request to 127.0.0.1:port with exactly this method, path (dot
 * segments and all) and these headers ("Name: value", NULL-terminated) and no
 * body: libcurl's own Accept is removed, and the Host header is libcurl's
 * unless headers name one.  Aborts the test if the transfer fails.
 */
static void
raw_request(struct h_resp *out, int port, const char *method, const char *path,
    const char *const *headers)
{
	struct curl_slist *hl = NULL, *t;
	char url[H_PATH_MAX + 64];
	CURL *c = h_curl_new();
	CURLcode rc;
	size_t i;

	h_resp_free(out);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, out->err);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L); /* "/./x" as it is */
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, out);
	hl = curl_slist_append(hl, "Accept:");
	for (i = 0; headers != NULL && headers[i] != NULL; i++)
		if ((t = curl_slist_append(hl, headers[i])) != NULL)
			hl = t;
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
	rc = curl_easy_perform(c);
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
	curl_slist_free_all(hl);
	curl_easy_cleanup(c);
	if (out->body == NULL)
		on_body((char *)"", 0, 0, out);
	ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, path,
	    out->err[0] ? out->err : curl_easy_strerror(rc));
}

/* The integer value of header name, or -1 if absent or not a number. */
static long
header_long(const struct h_resp *r, const char *name)
{
	const char *v = h_resp_header(r, name);
	char *end;
	long n;

	if (v == NULL || *v == '\0')
		return -1;
	n = strtol(v, &end, 10);
	return *end == '\0' ? n : -1;
}

/* --- nginx auth_request with the shipped configuration ------------------ */

struct nginx {
	int port;	   /* the proxy the client talks to */
	int upstream_port; /* the application behind it */
	pid_t pid;
	char dir[H_PATH_MAX];
	char conf[H_PATH_MAX + 16];
	char log[H_PATH_MAX + 16];
};

/* text with the one occurrence of from replaced by to; aborts when from
 * does not occur exactly once (the shipped file changed shape). */
static char *
replace_once(char *text, const char *from, const char *to)
{
	char *at = strstr(text, from), *out;
	size_t n;

	ck_assert_msg(at != NULL && strstr(at + 1, from) == NULL,
	    "conf/nginx/ratelimitd.conf: expected \"%s\" exactly once; "
	    "update check_proxy.c if the shipped file changed on purpose",
	    from);
	n = strlen(text) - strlen(from) + strlen(to) + 1;
	out = malloc(n);
	ck_assert_msg(out != NULL, "out of memory");
	snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to,
	    at + strlen(from));
	free(text);
	return out;
}

/* Does GET / on port answer at all (any status)? */
static bool
answers(int port)
{
	struct h_resp r = { 0 };
	CURL *c = h_curl_new();
	int rc = h_request(c, port, &r, "GET", "/", NULL, 0, NULL);

	curl_easy_cleanup(c);
	h_resp_free(&r);
	return rc == 0;
}

/*
 * nginx.conf around the shipped conf/nginx/ratelimitd.conf: the shipped
 * server block with its ports pointed at the daemon on daemon_port and at
 * an application server block (also here) that answers
 * "upstream <request uri>" and, under /private/, its own 403.  Everything
 * nginx writes stays in n->dir, so it runs as root without touching /var.
 */
static void
nginx_start(struct nginx *n, int daemon_port)
{
	const char *src = getenv("RATELIMITD_SRCDIR");
	char path[H_PATH_MAX + 64], buf[128], *shipped, *conf;
	long long end;
	int status;
	size_t len;
	char *argv[8];

	ck_assert_msg(src != NULL, "RATELIMITD_SRCDIR is not set");
	make_dir(n->dir, sizeof(n->dir), "nginx");
	snprintf(n->conf, sizeof(n->conf), "%s/nginx.conf", n->dir);
	snprintf(n->log, sizeof(n->log), "%s/error.log", n->dir);
	n->port = h_free_port();
	do
		n->upstream_port = h_free_port();
	while (n->upstream_port == n->port);

	snprintf(path, sizeof(path), "%s/conf/nginx/ratelimitd.conf", src);
	shipped = read_text(path);
	snprintf(buf, sizeof(buf), "listen 127.0.0.1:%d;", n->port);
	shipped = replace_once(shipped, "listen 80;", buf);
	snprintf(buf, sizeof(buf), "server 127.0.0.1:%d;", daemon_port);
	shipped = replace_once(shipped, "server 127.0.0.1:8080;", buf);
	snprintf(buf, sizeof(buf), "server 127.0.0.1:%d;", n->upstream_port);
	shipped = replace_once(shipped, "server 127.0.0.1:9000;", buf);

	len = strlen(shipped) + 8 * strlen(n->dir) + 2048;
	conf = malloc(len);
	ck_assert_msg(conf != NULL, "out of memory");
	snprintf(conf, len,
	    "daemon off;\n"
	    "master_process off;\n"
	    "worker_processes 1;\n"
	    "pid %s/nginx.pid;\n"
	    "error_log %s/error.log info;\n"
	    "events { worker_connections 64; }\n"
	    "http {\n"
	    "access_log %s/access.log;\n"
	    "client_body_temp_path %s/client_body;\n"
	    "proxy_temp_path %s/proxy;\n"
	    "fastcgi_temp_path %s/fastcgi;\n"
	    "uwsgi_temp_path %s/uwsgi;\n"
	    "scgi_temp_path %s/scgi;\n"
	    "default_type text/plain;\n"
	    "# ---- conf/nginx/ratelimitd.conf, ports substituted ----\n"
	    "%s\n"
	    "# ---- the application ----\n"
	    "server {\n"
	    "    listen 127.0.0.1:%d;\n"
	    "    location / { return 200 \"upstream $request_uri\"; }\n"
	    "    location /private/ { return 403 \"upstream forbidden\"; }\n"
	    "}\n"
	    "}\n",
	    n->dir, n->dir, n->dir, n->dir, n->dir, n->dir, n->dir, n->dir,
	    shipped, n->upstream_port);
	write_text(n->conf, conf);
	free(conf);
	free(shipped);

	argv[0] = (char *)"nginx";
	argv[1] = (char *)"-p";
	argv[2] = n->dir;
	argv[3] = (char *)"-c";
	argv[4] = n->conf;
	argv[5] = (char *)"-e";
	argv[6] = n->log;
	argv[7] = NULL;
	n->pid = own_spawn(argv, n->log, NULL);
	end = h_now_ms() + 5000;
	while (h_now_ms() < end) {
		/* The application's port: asking the proxy itself would
		 * already count against the rules. */
		if (answers(n->upstream_port))
			return;
		if (waitpid(n->pid, &status, WNOHANG) == n->pid) {
			own_note('E', n->pid);
			n->pid = 0;
			break;
		}
		h_sleep_ms(20);
	}
	h_print_file("nginx.conf", n->conf);
	h_print_file("nginx error.log", n->log);
	ck_abort_msg("nginx did not start on 127.0.0.1:%d", n->port);
}

static void
nginx_stop(struct nginx *n)
{
	int status;

	if (n->pid == 0)
		return;
	status = own_stop(n->pid, 5000);
	n->pid = 0;
	if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		h_print_file("nginx error.log", n->log);
		ck_abort_msg("nginx did not stop cleanly on SIGTERM");
	}
}

static const char nginx_daemon_yaml[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "backend: memory\n"
    "auth:\n"
    "  deny_status: 403\n"
    "  client_ip: x-real-ip\n"
    "rules:\n"
    "  - name: api-per-ip\n"
    "    match:\n"
    "      path: \"/api/*\"\n"
    "    key: \"${ip}\"\n"
    "    limit: 3\n"
    "    window: 1m\n";

/* An answer that the upstream gave, passed through: its status and body,
 * and the rule's state in the copied headers (remaining < 0: none). */
static void
expect_upstream(const struct h_resp *r, const char *what, long status,
    const char *body, long remaining)
{
	ck_assert_msg(r->status == status && strcmp(r->body, body) == 0,
	    "%s: got %ld \"%s\", expected the upstream's %ld \"%s\"", what,
	    r->status, r->body, status, body);
	ck_assert_msg(h_resp_header(r, "Retry-After") == NULL,
	    "%s: Retry-After on an allowed request", what);
	if (remaining < 0) {
		ck_assert_msg(h_resp_header(r, "RateLimit-Policy") == NULL &&
			h_resp_header(r, "X-RateLimit-Limit") == NULL,
		    "%s: RateLimit headers, but no rule applies", what);
		return;
	}
	ck_assert_msg(h_resp_header_count(r, "RateLimit-Policy") == 1 &&
		strcmp(h_resp_header(r, "RateLimit-Policy"),
		    "\"api-per-ip\";q=3;w=60") == 0,
	    "%s: RateLimit-Policy \"%s\"", what,
	    h_resp_header(r, "RateLimit-Policy"));
	ck_assert_msg(header_long(r, "X-RateLimit-Limit") == 3,
	    "%s: X-RateLimit-Limit \"%s\", expected 3", what,
	    h_resp_header(r, "X-RateLimit-Limit"));
	ck_assert_msg(header_long(r, "X-RateLimit-Remaining") == remaining,
	    "%s: X-RateLimit-Remaining \"%s\", expected %ld", what,
	    h_resp_header(r, "X-RateLimit-Remaining"), remaining);
	ck_assert_msg(h_resp_header(r, "RateLimit") != NULL,
	    "%s: no RateLimit header", what);
}

/* The 429 the shipped error_page makes of the daemon's 403. */
static void
expect_limited(const struct h_resp *r, const char *what)
{
	static const char *const once[] = { "Retry-After", "RateLimit-Policy",
		"RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining",
		"X-RateLimit-Reset" };
	const char *state;
	long ra, reset;
	size_t i;

	ck_assert_msg(r->status == 429,
	    "%s: status %ld (body \"%s\"), "
	    "expected 429",
	    what, r->status, r->body);
	ck_assert_msg(strstr(r->body, "rate_limited") != NULL,
	    "%s: body \"%s\"", what, r->body);
	for (i = 0; i < sizeof(once) / sizeof(once[0]); i++)
		ck_assert_msg(h_resp_header_count(r, once[i]) == 1,
		    "%s: %zu %s headers, expected exactly 1", what,
		    h_resp_header_count(r, once[i]), once[i]);
	ra = header_long(r, "Retry-After");
	ck_assert_msg(ra >= 1 && ra <= 60, "%s: Retry-After \"%s\"", what,
	    h_resp_header(r, "Retry-After"));
	ck_assert_msg(strcmp(h_resp_header(r, "RateLimit-Policy"),
			  "\"api-per-ip\";q=3;w=60") == 0,
	    "%s: RateLimit-Policy \"%s\"", what,
	    h_resp_header(r, "RateLimit-Policy"));
	state = h_resp_header(r, "RateLimit");
	ck_assert_msg(strncmp(state, "\"api-per-ip\";r=0;t=", 19) == 0,
	    "%s: RateLimit \"%s\"", what, state);
	ck_assert_msg(header_long(r, "X-RateLimit-Limit") == 3 &&
		header_long(r, "X-RateLimit-Remaining") == 0,
	    "%s: X-RateLimit-Limit \"%s\", X-RateLimit-Remaining \"%s\"", what,
	    h_resp_header(r, "X-RateLimit-Limit"),
	    h_resp_header(r, "X-RateLimit-Remaining"));
	reset = header_long(r, "X-RateLimit-Reset");
	ck_assert_msg(reset >= 1 && reset <= 60,
	    "%s: X-RateLimit-Reset "
	    "\"%s\"",
	    what, h_resp_header(r, "X-RateLimit-Reset"));
}

START_TEST(test_nginx_auth_request)
{
	static const char *const spoof[] = { "X-Real-IP: 198.51.100.9",
		"X-Forwarded-For: 198.51.100.9", NULL };
	struct h_daemon d = { 0 };
	struct nginx n = { 0 };
	struct h_resp r = { 0 };
	CURL *c;

	h_daemon_start(&d, nginx_daemon_yaml);
	nginx_start(&n, d.port);
	c = h_curl_new();

	/* Three requests under /api/ pass to the application, with the
	 * rule's state copied into the answer. */
	ck_assert(h_request(c, n.port, &r, "GET", "/api/a", NULL, 0, NULL) ==
	    0);
	expect_upstream(&r, "1st GET /api/a", 200, "upstream /api/a", 2);
	ck_assert(h_request(c, n.port, &r, "POST", "/api/b?x=1", "{}", 2,
		      NULL) == 0);
	expect_upstream(&r, "2nd POST /api/b?x=1", 200, "upstream /api/b?x=1",
	    1);
	ck_assert(h_request(c, n.port, &r, "GET", "/api/c", NULL, 0, NULL) ==
	    0);
	expect_upstream(&r, "3rd GET /api/c", 200, "upstream /api/c", 0);

	/* The fourth is denied: the daemon's 403 becomes the client's 429
	 * with Retry-After and the RateLimit headers. */
	ck_assert(h_request(c, n.port, &r, "GET", "/api/d", NULL, 0, NULL) ==
	    0);
	expect_limited(&r, "4th GET /api/d");

	/* A client cannot pick its own key: the shipped file sets
	 * X-Real-IP from the connection, over whatever the client sent. */
	ck_assert(h_request(c, n.port, &r, "GET", "/api/e", NULL, 0, spoof) ==
	    0);
	expect_limited(&r,
	    "GET /api/e with a forged X-Real-IP and "
	    "X-Forwarded-For");

	/* Paths no rule limits still pass, and the application's own 403
	 * reaches the client as is: error_page rewrites only the 403 of
	 * the auth subrequest. */
	ck_assert(h_request(c, n.port, &r, "GET", "/index.html", NULL, 0,
		      NULL) == 0);
	expect_upstream(&r, "GET /index.html (no rule)", 200,
	    "upstream /index.html", -1);
	ck_assert(h_request(c, n.port, &r, "GET", "/private/x", NULL, 0,
		      NULL) == 0);
	expect_upstream(&r, "GET /private/x (the application's 403)", 403,
	    "upstream forbidden", -1);

	/* With the daemon gone the shipped file fails closed: auth_request
	 * turns the 502 of its subrequest into a 500 (docs/proxies.md). */
	h_daemon_stop(&d);
	ck_assert(h_request(c, n.port, &r, "GET", "/index.html", NULL, 0,
		      NULL) == 0);
	ck_assert_msg(r.status == 500,
	    "GET /index.html with ratelimitd "
	    "stopped: status %ld, expected 500",
	    r.status);

	h_resp_free(&r);
	curl_easy_cleanup(c);
	nginx_stop(&n);
}
END_TEST

/*
 * The path nginx routes on is $uri, decoded and normalized; the shipped
 * file sends $request_uri, as the client wrote it.  The same path written
 * another way must count against the same rule (docs/proxies.md).
 */
START_TEST(test_nginx_path_forms)
{
	static const char *const forms[] = { "/%61pi/b", "//api/c", "/./api/d",
		"/x/../api/e", "/api/%2e/f", "/%2fapi/g", NULL };
	struct h_daemon d = { 0 };
	struct nginx n = { 0 };
	struct h_resp r = { 0 };
	char what[128];
	size_t i;

	h_daemon_start(&d, nginx_daemon_yaml);
	nginx_start(&n, d.port);
	for (i = 0; i < 3; i++) {
		raw_request(&r, n.port, "GET", "/api/a", NULL);
		ck_assert_msg(r.status == 200, "GET /api/a #%zu: status %ld",
		    i + 1, r.status);
	}
	for (i = 0; forms[i] != NULL; i++) {
		snprintf(what, sizeof(what), "GET %s after 3 of /api/a",
		    forms[i]);
		raw_request(&r, n.port, "GET", forms[i], NULL);
		expect_limited(&r, what);
	}
	h_resp_free(&r);
	nginx_stop(&n);
	h_daemon_stop(&d);
}
END_TEST

/* --- Envoy ext_authz and Traefik ForwardAuth ---------------------------- */

/*
 * One rule whose match depends on path and host and whose key depends on
 * ip and method, limit 1: a request it applies to answers with its
 * RateLimit-Policy; a second identical one is denied; changing ip or
 * method makes a new counter, changing host or path makes the rule not
 * apply.  "root" is there for Envoy's "/auth/" (the original path "/").
 */
static const char attrs_yaml[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 2\n"
    "shutdown_timeout: 2s\n"
    "backend: memory\n"
    "rules:\n"
    "  - name: items\n"
    "    match:\n"
    "      path: \"/api/items\"\n"
    "      host: \"app.example.com\"\n"
    "    key: \"${ip}:${method}\"\n"
    "    limit: 1\n"
    "    window: 1m\n"
    "  - name: root\n"
    "    match:\n"
    "      path: \"/\"\n"
    "      host: \"app.example.com\"\n"
    "    key: \"${ip}\"\n"
    "    limit: 100\n"
    "    window: 1m\n";

/* What a proxy saw from its client, in one of the proxy's shapes. */
struct orig {
	const char *method;
	const char *uri; /* path and query, as the client sent it */
	const char *host;
	const char *ip;
};

typedef void shape_fn(struct h_resp *, int, const struct orig *);

/*
 * Envoy's ext_authz filter with an HTTP service: the original method as
 * the request's own, path_prefix ("/auth") + the original path and query
 * as the request path, the original :authority as Host, content-length
 * 0; x-forwarded-for and x-envoy-external-address pass through
 * allowed_headers and x-real-ip comes from headers_to_add
 * (%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%), as in docs/proxies.md.
 */
static void
envoy_check(struct h_resp *r, int port, const struct orig *o)
{
	char path[256], host[128], xff[96], xea[96], xri[96];
	const char *const hdr[] = { host, "content-length: 0", xff, xea, xri,
		"x-envoy-expected-rq-timeout-ms: 250", NULL };

	snprintf(path, sizeof(path), "/auth%s", o->uri);
	snprintf(host, sizeof(host), "Host: %s", o->host);
	snprintf(xff, sizeof(xff), "x-forwarded-for: %s", o->ip);
	snprintf(xea, sizeof(xea), "x-envoy-external-address: %s", o->ip);
	snprintf(xri, sizeof(xri), "x-real-ip: %s", o->ip);
	raw_request(r, port, o->method, path, hdr);
}

/*
 * Traefik's ForwardAuth: a GET to the configured address
 * (http://127.0.0.1:8080/auth, so Host is the daemon's), the client's
 * headers copied (X-Real-Ip among them, set by the entry point), and
 * X-Forwarded-Method, -Proto, -Host, -Uri and -For set from the original
 * request.
 */
static void
traefik_check(struct h_resp *r, int port, const struct orig *o)
{
	char m[64], xfh[128], xfu[256], xff[96], xri[96];
	const char *const hdr[] = { "User-Agent: Go-http-client/1.1",
		"Accept-Encoding: gzip", "X-Forwarded-Port: 443",
		"X-Forwarded-Proto: https", "X-Forwarded-Server: traefik-0",
		xri, m, xfh, xfu, xff, NULL };

	snprintf(m, sizeof(m), "X-Forwarded-Method: %s", o->method);
	snprintf(xfh, sizeof(xfh), "X-Forwarded-Host: %s", o->host);
	snprintf(xfu, sizeof(xfu), "X-Forwarded-Uri: %s", o->uri);
	snprintf(xff, sizeof(xff), "X-Forwarded-For: %s", o->ip);
	snprintf(xri, sizeof(xri), "X-Real-Ip: %s", o->ip);
	raw_request(r, port, "GET", "/auth", hdr);
}

/* The same, without X-Real-Ip (authRequestHeaders left it out): the
 * address must come from X-Forwarded-For. */
static void
traefik_check_xff(struct h_resp *r, int port, const struct orig *o)
{
	char m[64], xfh[128], xfu[256], xff[96];
	const char *const hdr[] = { "User-Agent: Go-http-client/1.1",
		"X-Forwarded-Proto: https", m, xfh, xfu, xff, NULL };

	snprintf(m, sizeof(m), "X-Forwarded-Method: %s", o->method);
	snprintf(xfh, sizeof(xfh), "X-Forwarded-Host: %s", o->host);
	snprintf(xfu, sizeof(xfu), "X-Forwarded-Uri: %s", o->uri);
	snprintf(xff, sizeof(xff), "X-Forwarded-For: %s", o->ip);
	raw_request(r, port, "GET", "/auth", hdr);
}

/* Send o in shape and check the answer: rule NULL = no rule applied. */
static void
expect_auth(shape_fn *shape, const char *proxy, const struct orig *o,
    long status, const char *rule)
{
	struct h_daemon *d = h_daemon_current();
	struct h_resp r = { 0 };
	const char *pol;
	char want[64];

	shape(&r, d->port, o);
	pol = h_resp_header(&r, "RateLimit-Policy");
	ck_assert_msg(r.status == status,
	    "%s: %s %s, host %s, client %s: "
	    "status %ld, expected %ld (RateLimit-Policy: %s)",
	    proxy, o->method, o->uri, o->host, o->ip, r.status, status,
	    pol ? pol : "none");
	if (rule == NULL) {
		ck_assert_msg(pol == NULL,
		    "%s: %s %s, host %s, client %s: "
		    "rule %s applied, expected none",
		    proxy, o->method, o->uri, o->host, o->ip, pol);
	} else {
		snprintf(want, sizeof(want), "\"%s\";", rule);
		ck_assert_msg(pol != NULL &&
			strncmp(pol, want, strlen(want)) == 0,
		    "%s: %s %s, host %s, client %s: "
		    "RateLimit-Policy %s, expected rule \"%s\" to apply "
		    "(the attributes were not derived as docs/http.md says)",
		    proxy, o->method, o->uri, o->host, o->ip,
		    pol ? pol : "absent", rule);
	}
	if (status != 200)
		ck_assert_msg(header_long(&r, "Retry-After") >= 1,
		    "%s: denied without Retry-After", proxy);
	h_resp_free(&r);
}

/* The cases every shape must pass, against a fresh daemon. */
static void
check_mapping(shape_fn *shape, const char *proxy)
{
	static const struct orig first = { "POST", "/api/items?page=2",
		"app.example.com", "203.0.113.7" };
	static const struct orig other_ip = { "POST", "/api/items",
		"app.example.com", "203.0.113.8" };
	static const struct orig other_method = { "PUT", "/api/items",
		"app.example.com", "203.0.113.7" };
	static const struct orig other_host = { "POST", "/api/items",
		"other.example.com", "203.0.113.7" };
	static const struct orig other_path = { "POST", "/api/other",
		"app.example.com", "203.0.113.7" };
	static const struct orig again = { "POST", "/api/items?page=3",
		"app.example.com", "203.0.113.7" };
	struct h_daemon d = { 0 };

	h_daemon_start(&d, attrs_yaml);
	/* path (query removed) and host match; key ip:method counts. */
	expect_auth(shape, proxy, &first, 200, "items");
	expect_auth(shape, proxy, &again, 429, "items");
	/* ip and method come from the proxy's headers, not the peer or
	 * the request's own method: each is a counter of its own. */
	expect_auth(shape, proxy, &other_ip, 200, "items");
	expect_auth(shape, proxy, &other_method, 200, "items");
	/* host and path come from the proxy's headers too. */
	expect_auth(shape, proxy, &other_host, 200, NULL);
	expect_auth(shape, proxy, &other_path, 200, NULL);
	h_daemon_stop(&d);
}

START_TEST(test_envoy_ext_authz)
{
	static const struct orig root = { "GET", "/", "app.example.com",
		"203.0.113.7" };
	struct h_daemon d = { 0 };

	check_mapping(envoy_check, "Envoy ext_authz");
	/* The original path "/" arrives as "/auth/". */
	h_daemon_start(&d, attrs_yaml);
	expect_auth(envoy_check, "Envoy ext_authz", &root, 200, "root");
	h_daemon_stop(&d);
}
END_TEST

START_TEST(test_traefik_forwardauth)
{
	check_mapping(traefik_check, "Traefik ForwardAuth");
}
END_TEST

START_TEST(test_traefik_forwardauth_xff)
{
	check_mapping(traefik_check_xff, "Traefik ForwardAuth, no X-Real-Ip");
}
END_TEST

/*
 * One rule on the path "/login", limit 1, its key the path itself: each
 * source of the path (X-Original-URI, X-Forwarded-Uri, Envoy's URL), a
 * client of its own, sends "/login" and then the same path written other
 * ways; every one must count as "/login", for the match and for the key.
 */
static const char path_yaml[] =
    "listen: \"127.0.0.1:%PORT%\"\n"
    "threads: 1\n"
    "shutdown_timeout: 2s\n"
    "backend: memory\n"
    "auth:\n"
    "  client_ip: x-real-ip\n"
    "rules:\n"
    "  - name: login\n"
    "    match:\n"
    "      path: \"/login\"\n"
    "    key: \"${ip}${path}\"\n"
    "    limit: 1\n"
    "    window: 1m\n";

static void
expect_path(int port, const char *header, const char *ip, const char *path,
    long status)
{
	struct h_resp r = { 0 };
	char h[256], xri[64], url[256];
	const char *const hdr[] = { xri, header != NULL ? h : NULL, NULL };
	const char *pol;

	snprintf(xri, sizeof(xri), "X-Real-IP: %s", ip);
	if (header != NULL) {
		snprintf(h, sizeof(h), "%s: %s", header, path);
		snprintf(url, sizeof(url), "/auth");
	} else {
		snprintf(url, sizeof(url), "/auth%s", path);
	}
	raw_request(&r, port, "GET", url, hdr);
	pol = h_resp_header(&r, "RateLimit-Policy");
	ck_assert_msg(r.status == status,
	    "%s %s: status %ld, expected %ld (RateLimit-Policy %s, body %s)",
	    header != NULL ? header : "URL", path, r.status, status,
	    pol != NULL ? pol : "none", r.body);
	if (status != 400)
		ck_assert_msg(pol != NULL && strncmp(pol, "\"login\";", 8) == 0,
		    "%s %s: RateLimit-Policy %s, expected the rule login",
		    header != NULL ? header : "URL", path,
		    pol != NULL ? pol : "none");
	h_resp_free(&r);
}

START_TEST(test_path_forms)
{
	static const char *const forms[] = { "/%6cogin", "/%6Cogin?x=1",
		"//login", "/./login", "/x/../login", "/%2e%2e/login",
		"/%2flogin", "/login#frag", NULL };
	static const char *const url_forms[] = { "/%6cogin", "//login",
		"/./login", "/x/../login", "/%2e/login", NULL };
	static const struct {
		const char *header, *ip;
	} src[] = { { "X-Original-URI", "192.0.2.1" },
		{ "X-Forwarded-Uri", "192.0.2.2" }, { NULL, "192.0.2.3" } };
	struct h_daemon d = { 0 };
	size_t i, j;

	h_daemon_start(&d, path_yaml);
	for (i = 0; i < sizeof(src) / sizeof(src[0]); i++) {
		const char *const *f = src[i].header != NULL ? forms :
							       url_forms;

		expect_path(d.port, src[i].header, src[i].ip, "/login", 200);
		for (j = 0; f[j] != NULL; j++)
			expect_path(d.port, src[i].header, src[i].ip, f[j],
			    429);
	}
	/* An encoded NUL is refused, as nginx refuses it, in a header and
	 * in the /auth request's own path (which the daemon gets decoded,
	 * cut at the NUL), and the refused request counts nowhere. */
	expect_path(d.port, "X-Original-URI", "192.0.2.4", "/login%00.png",
	    400);
	expect_path(d.port, NULL, "192.0.2.5", "/login%00xyz", 400);
	expect_path(d.port, NULL, "192.0.2.5", "/login", 200);
	h_daemon_stop(&d);
}
END_TEST

/* --- systemd's notify protocol --------------------------------------- */

/* Does the datagram msg hold the line want? */
static bool
has_line(const char *msg, const char *want)
{
	size_t n = strlen(want);
	const char *p;

	for (p = msg; p != NULL; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, want, n) == 0 && (p[n] == '\n' || p[n] == '\0'))
			return true;
	return false;
}

/*
 * Read datagrams from fd until one holds the line want (at most ms);
 * everything read is appended to seen (for the failure message).  Aborts
 * if it does not come or the daemon exits meanwhile.
 */
static void
expect_notify(int fd, pid_t pid, const char *want, long long ms, char *seen,
    size_t seenlen, const char *log)
{
	long long end = h_now_ms() + ms;
	struct pollfd p = { fd, POLLIN, 0 };
	char msg[1024];
	ssize_t n;
	int status;

	while (h_now_ms() < end) {
		if (poll(&p, 1, 50) == 1) {
			n = recv(fd, msg, sizeof(msg) - 1, 0);
			if (n < 0)
				continue;
			msg[n] = '\0';
			snprintf(seen + strlen(seen), seenlen - strlen(seen),
			    "[%s] ", msg);
			if (has_line(msg, want))
				return;
			continue;
		}
		if (waitpid(pid, &status, WNOHANG) == pid) {
			own_note('E', pid);
			h_print_file("ratelimitd log", log);
			ck_abort_msg(
			    "the daemon exited before sending %s; "
			    "received: %s",
			    want, seen);
		}
	}
	h_print_file("ratelimitd log", log);
	ck_abort_msg("no %s within %lld ms; received: %s", want, ms, seen);
}

START_TEST(test_systemd_notify)
{
	char dir[H_PATH_MAX], conf[H_PATH_MAX + 32], log[H_PATH_MAX + 32];
	char sock[H_PATH_MAX + 32], env[H_PATH_MAX + 64], yaml[512];
	char seen[4096] = "";
	const char *const envs[] = { env, NULL };
	const char *bin = getenv("RATELIMITD_BIN");
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct h_resp r = { 0 };
	char *argv[4];
	CURL *c;
	pid_t pid;
	int fd, port, status;

	make_dir(dir, sizeof(dir), "notify");
	snprintf(conf, sizeof(conf), "%s/ratelimitd.yaml", dir);
	snprintf(log, sizeof(log), "%s/ratelimitd.log", dir);
	snprintf(sock, sizeof(sock), "%s/notify.sock", dir);
	ck_assert_msg(strlen(sock) < sizeof(sun.sun_path), "%s: too long",
	    sock);
	memcpy(sun.sun_path, sock, strlen(sock) + 1);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	ck_assert_msg(bind(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0,
	    "bind %s: %s", sock, strerror(errno));
	snprintf(env, sizeof(env), "NOTIFY_SOCKET=%s", sock);

	port = h_free_port();
	snprintf(yaml, sizeof(yaml),
	    "listen: \"127.0.0.1:%d\"\n"
	    "threads: 2\n"
	    "shutdown_timeout: 2s\n"
	    "backend: memory\n"
	    "rules:\n"
	    "  - name: per-ip\n"
	    "    key: \"${ip}\"\n"
	    "    limit: 10\n"
	    "    window: 1m\n",
	    port);
	write_text(conf, yaml);
	argv[0] = (char *)bin;
	argv[1] = (char *)"-c";
	argv[2] = conf;
	argv[3] = NULL;
	pid = own_spawn(argv, log, envs);

	/* READY=1 means serving: /healthz answers at once. */
	expect_notify(fd, pid, "READY=1", 5000, seen, sizeof(seen), log);
	c = h_curl_new();
	ck_assert_msg(h_request(c, port, &r, "GET", "/healthz", NULL, 0,
			  NULL) == 0 &&
		r.status == 200,
	    "READY=1 was sent, but GET "
	    "/healthz answers %ld (%s)",
	    r.status, r.err);

	/* SIGHUP: RELOADING=1, then READY=1 again, and still serving. */
	seen[0] = '\0';
	ck_assert(kill(pid, SIGHUP) == 0);
	expect_notify(fd, pid, "RELOADING=1", 5000, seen, sizeof(seen), log);
	expect_notify(fd, pid, "READY=1", 5000, seen, sizeof(seen), log);
	ck_assert_msg(h_request(c, port, &r, "GET", "/healthz", NULL, 0,
			  NULL) == 0 &&
		r.status == 200,
	    "after the reload GET /healthz "
	    "answers %ld (%s)",
	    r.status, r.err);
	h_resp_free(&r);
	curl_easy_cleanup(c);

	/* SIGTERM: STOPPING=1, and exit status 0. */
	seen[0] = '\0';
	ck_assert(kill(pid, SIGTERM) == 0);
	expect_notify(fd, pid, "STOPPING=1", 5000, seen, sizeof(seen), log);
	if (!own_wait(pid, 8000, &status)) {
		own_stop(pid, 100);
		h_print_file("ratelimitd log", log);
		ck_abort_msg("the daemon did not exit within 8 s of SIGTERM");
	}
	own_note('E', pid);
	if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		h_print_file("ratelimitd log", log);
		ck_abort_msg(
		    "after SIGTERM: wait status %d, expected exit "
		    "status 0",
		    status);
	}
	close(fd);
}
END_TEST

/* --- main ---------------------------------------------------------------- */

static TCase *
new_tcase(const char *name)
{
	TCase *tc = tcase_create(name);

	tcase_add_unchecked_fixture(tc, NULL, reap_all);
	tcase_add_checked_fixture(tc, NULL, h_test_teardown);
	tcase_set_timeout(tc, 30);
	return tc;
}

Suite *
test_suite(void)
{
	Suite *s = suite_create("proxy");
	TCase *tc;

	tc = new_tcase("nginx");
	tcase_add_test(tc, test_nginx_auth_request);
	tcase_add_test(tc, test_nginx_path_forms);
	suite_add_tcase(s, tc);
	tc = new_tcase("paths");
	tcase_add_test(tc, test_path_forms);
	suite_add_tcase(s, tc);
	tc = new_tcase("envoy");
	tcase_add_test(tc, test_envoy_ext_authz);
	suite_add_tcase(s, tc);
	tc = new_tcase("traefik");
	tcase_add_test(tc, test_traefik_forwardauth);
	tcase_add_test(tc, test_traefik_forwardauth_xff);
	suite_add_tcase(s, tc);
	tc = new_tcase("systemd");
	tcase_add_test(tc, test_systemd_notify);
	suite_add_tcase(s, tc);
	return s;
}
