/*
 * check_main.h - the one main() of every test binary (tests/check_main.c)
 * and the fixture helpers the tests share.
 *
 * A test file defines test_suite() and no main(): the shared main builds
 * the suite, runs it the way Check's environment says (CK_RUN_SUITE,
 * CK_RUN_CASE, CK_DEFAULT_TIMEOUT, CK_VERBOSITY, CK_FORK, the log file
 * variables), prints the results and exits non-zero when a check failed.
 * The integration binaries link the same main compiled with
 * CHECK_MAIN_HARNESS (the Makefile does it): it calls h_init() before the
 * suite is built and runs every test in its own process whatever CK_FORK
 * says, which the harness's process registry needs
 * (tests/integration/harness.h).
 *
 * Thread: test_suite() and test_main_at_end() run on the runner's main
 * thread; the helpers run in a test (they fail it with ck_assert) unless
 * they say otherwise.
 */
#ifndef RL_TESTS_CHECK_MAIN_H
#define RL_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* Defined by every test file: the suite to run.  Called once, in the
 * runner, before any test runs, so it is also where a file does its
 * one-time set-up (reading a vector file, for example).  The suite is
 * owned by the runner from then on. */
Suite *test_suite(void);

/* Run fn in the runner after every test ran and the results were printed,
 * before main returns (the last registered first): for what a file's
 * set-up started once for all its tests (a shared redis-server).  At most
 * TEST_MAIN_AT_END_MAX; called from test_suite(). */
#define TEST_MAIN_AT_END_MAX 8
void test_main_at_end(void (*fn)(void));

/* --- fixtures ------------------------------------------------------------ */

/* An injected clock (backend_clock_fn of store/memory.h) that reads the
 * microseconds at arg, an int64_t the test moves:
 * backend_memory_new(n, test_clock, &now_us).  Any thread. */
int64_t test_clock(void *arg);

/* Write len bytes of text into a new file under $TMPDIR (or /tmp) named
 * after name, and put its path into path[pathlen].  The test removes it
 * (unlink) when it is done. */
void test_write_tmp(const char *name, const void *text, size_t len, char *path,
    size_t pathlen);

/* rel (a path from the top of the source tree) under $RATELIMITD_SRCDIR,
 * or as is when that is unset (make runs the tests from the top), into
 * buf[len].  Any thread, the runner included. */
void test_srcdir_path(const char *rel, char *buf, size_t len);

/* A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0,
 * read it back, close): nobody listens on it, so a connect is refused. */
int test_free_port(void);

/* A listening TCP socket on 127.0.0.1 on a port the kernel picks (backlog
 * 16), its port in *port.  Returns the descriptor; the caller closes it. */
int test_listen(int *port);

#endif
