/*
 * check_main.c - main() of every unit and integration test binary, and the
 * fixture helpers the tests share (check_main.h says how to use them).
 *
 * Every binary used to carry its own copy of the same dozen lines; they
 * differed only in what the integration ones added (h_init(), fork mode
 * forced, a shared server stopped after the run), which is here now under
 * CHECK_MAIN_HARNESS or behind test_main_at_end().
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_main.h"

#ifdef CHECK_MAIN_HARNESS
#include "harness.h"
#endif

static void (*at_end[TEST_MAIN_AT_END_MAX])(void);
static size_t nat_end;

void
test_main_at_end(void (*fn)(void))
{
	if (nat_end == TEST_MAIN_AT_END_MAX) {
		fprintf(stderr, "test_main_at_end: more than %d\n",
		    TEST_MAIN_AT_END_MAX);
		exit(EXIT_FAILURE);
	}
	at_end[nat_end++] = fn;
}

int
main(void)
{
	SRunner *sr;
	int failed;

#ifdef CHECK_MAIN_HARNESS
	/* The temporary directory, the subreaper, libcurl, and the at-exit
	 * reaping of whatever a failed test left running. */
	h_init();
#endif
	sr = srunner_create(test_suite());
#ifdef CHECK_MAIN_HARNESS
	/* A test stops what it started by PID from its own process; with
	 * CK_FORK=no one failure would leave the rest to the next test. */
	srunner_set_fork_status(sr, CK_FORK);
#endif
	/* CK_VERBOSITY, normal when unset; CK_RUN_SUITE, CK_RUN_CASE and the
	 * log variables are read by the runner, CK_DEFAULT_TIMEOUT by
	 * tcase_create(). */
	srunner_run_all(sr, CK_ENV);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	while (nat_end > 0)
		at_end[--nat_end]();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* --- fixtures ------------------------------------------------------------ */

int64_t
test_clock(void *arg)
{
	return *(const int64_t *)arg;
}

void
test_write_tmp(const char *name, const void *text, size_t len, char *path,
    size_t pathlen)
{
	const char *base = getenv("TMPDIR");
	size_t off = 0;
	int fd, n;

	if (base == NULL || *base == '\0')
		base = "/tmp";
	n = snprintf(path, pathlen, "%s/%s.XXXXXX", base, name);
	ck_assert_msg(n > 0 && (size_t)n < pathlen, "path too long");
	fd = mkstemp(path);
	ck_assert_msg(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
	while (off < len) {
		ssize_t w = write(fd, (const char *)text + off, len - off);

		if (w < 0 && errno == EINTR)
			continue;
		ck_assert_msg(w > 0, "write %s: %s", path, strerror(errno));
		off += (size_t)w;
	}
	ck_assert_int_eq(close(fd), 0);
}

void
test_srcdir_path(const char *rel, char *buf, size_t len)
{
	const char *dir = getenv("RATELIMITD_SRCDIR");

	if (dir != NULL && *dir != '\0')
		snprintf(buf, len, "%s/%s", dir, rel);
	else
		snprintf(buf, len, "%s", rel);
}

static int
bound_socket(int *port)
{
	struct sockaddr_in sa;
	socklen_t salen = sizeof(sa);
	int fd;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0,
	    "bind: %s", strerror(errno));
	ck_assert_msg(getsockname(fd, (struct sockaddr *)&sa, &salen) == 0,
	    "getsockname: %s", strerror(errno));
	*port = ntohs(sa.sin_port);
	return fd;
}

int
test_free_port(void)
{
	int port, fd = bound_socket(&port);

	close(fd);
	return port;
}

int
test_listen(int *port)
{
	int fd = bound_socket(port);

	ck_assert_msg(listen(fd, 16) == 0, "listen: %s", strerror(errno));
	return fd;
}
