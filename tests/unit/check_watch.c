/*
 * check_watch.c - the config file watch (src/base/watch.c) on real files
 * in a temporary directory: a file replaced by rename is seen; a path that
 * is a symlink into another directory is seen when its target is replaced,
 * and again after the link is pointed elsewhere; other files changing all
 * the time in the directory do not hold a pending change back.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"

#include "base/util.h"
#include "base/watch.h"

#define DEBOUNCE_MS 200

/* The callback writes a byte to the pipe whose write end is arg. */
static void
on_change(void *arg)
{
	char c = 1;

	(void)!write(*(int *)arg, &c, 1);
}

/* How many callbacks arrived within ms (reading them all). */
static int
changes_within(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int64_t end = util_monotonic_us() + (int64_t)ms * 1000;
	int64_t left;
	char buf[64];
	int n = 0;
	ssize_t r;

	while ((left = end - util_monotonic_us()) > 0) {
		if (poll(&p, 1, (int)(left / 1000) + 1) <= 0)
			continue;
		if ((r = read(fd, buf, sizeof(buf))) > 0)
			n += (int)r;
	}
	return n;
}

/* Wait up to ms for the first callback: the ms it took, or -1. */
static long long
first_change_ms(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int64_t t0 = util_monotonic_us();
	char c;

	if (poll(&p, 1, ms) <= 0 || read(fd, &c, 1) != 1)
		return -1;
	return (util_monotonic_us() - t0) / 1000;
}

static void
write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
}

/* Replace path the way deployment tools do: a new file renamed over it. */
static void
replace_file(const char *path, const char *text)
{
	char tmp[PATH_MAX];

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	write_file(tmp, text);
	ck_assert_msg(rename(tmp, path) == 0, "rename: %s", strerror(errno));
}

static char root[256]; /* short, so that every path under it fits */
static int pfd[2];

static void
setup(void)
{
	snprintf(root, sizeof(root), "%s/rl-watch-XXXXXX",
	    getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(root));
	ck_assert_int_eq(pipe(pfd), 0);
}

static void
teardown(void)
{
	char cmd[PATH_MAX + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	(void)!system(cmd);
	close(pfd[0]);
	close(pfd[1]);
}

/* A path under root. */
static const char *
at(char *buf, const char *rel)
{
	snprintf(buf, PATH_MAX, "%s/%s", root, rel);
	return buf;
}

static struct watch *
start(const char *path)
{
	char err[256];
	struct watch *w;

	w = watch_start(path, DEBOUNCE_MS, on_change, &pfd[1], err,
	    sizeof(err));
	ck_assert_msg(w != NULL, "watch_start: %s", err);
	return w;
}

START_TEST(test_rename_over)
{
	char p[PATH_MAX];
	struct watch *w;

	write_file(at(p, "r.yaml"), "a\n");
	w = start(p);
	replace_file(p, "b\n");
	ck_assert_int_ge(first_change_ms(pfd[0], 2000), 0);
	/* One burst, one callback; a file beside it is no change. */
	ck_assert_int_eq(changes_within(pfd[0], 400), 0);
	write_file(at(p, "other"), "x\n");
	ck_assert_int_eq(changes_within(pfd[0], 400), 0);
	watch_stop(w);
}
END_TEST

/*
 * -c dirB/link.yaml -> ../dirA/real.yaml: replacing dirA/real.yaml is a
 * change (the watch used to be on dirB alone, and never saw it).  After
 * the link is pointed at dirC/real.yaml (a change too), dirC is watched
 * and dirA no longer is.
 */
START_TEST(test_symlink_other_dir)
{
	char a[PATH_MAX], b[PATH_MAX], link[PATH_MAX], tmp[PATH_MAX];
	struct watch *w;

	ck_assert_int_eq(mkdir(at(a, "dirA"), 0755), 0);
	ck_assert_int_eq(mkdir(at(b, "dirB"), 0755), 0);
	ck_assert_int_eq(mkdir(at(b, "dirC"), 0755), 0);
	write_file(at(a, "dirA/real.yaml"), "a\n");
	write_file(at(a, "dirC/real.yaml"), "c\n");
	ck_assert_int_eq(symlink("../dirA/real.yaml",
			     at(link, "dirB/link.yaml")),
	    0);
	w = start(link);

	replace_file(at(a, "dirA/real.yaml"), "a2\n");
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "the target's replacement in another directory was not seen");

	ck_assert_int_eq(symlink("../dirC/real.yaml", at(tmp, "dirB/l.tmp")),
	    0);
	ck_assert_int_eq(rename(tmp, link), 0);
	ck_assert_int_ge(first_change_ms(pfd[0], 2000), 0);
	replace_file(at(a, "dirC/real.yaml"), "c2\n");
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "the new target's replacement was not seen");
	replace_file(at(a, "dirA/real.yaml"), "a3\n");
	ck_assert_int_eq(changes_within(pfd[0], 600), 0);
	watch_stop(w);
}
END_TEST

/*
 * A change, then another file in the directory written every 100 ms (less
 * than the debounce) for 1.5 s: the change is still called back about
 * DEBOUNCE_MS after it, not once the directory falls quiet.  (Every event
 * used to restart the wait.)
 */
START_TEST(test_busy_directory)
{
	char p[PATH_MAX], o[PATH_MAX];
	struct pollfd pp = { .fd = -1, .events = POLLIN };
	int64_t t0, got = -1;
	struct watch *w;
	char c;
	int i;

	write_file(at(p, "r.yaml"), "a\n");
	at(o, "busy.log");
	w = start(p);
	pp.fd = pfd[0];
	t0 = util_monotonic_us();
	replace_file(p, "b\n");
	for (i = 0; i < 15; i++) {
		write_file(o, "x\n");
		if (got < 0 && poll(&pp, 1, 100) == 1 &&
		    read(pfd[0], &c, 1) == 1)
			got = (util_monotonic_us() - t0) / 1000;
	}
	ck_assert_msg(got >= 0,
	    "no callback while another file changed every 100 ms");
	ck_assert_msg(got < 1000, "called back after %lld ms", (long long)got);
	watch_stop(w);
}
END_TEST

Suite *
test_suite(void)
{
	Suite *s = suite_create("watch");
	TCase *tc = tcase_create("inotify");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_rename_over);
	tcase_add_test(tc, test_symlink_other_dir);
	tcase_add_test(tc, test_busy_directory);
	suite_add_tcase(s, tc);
	return s;
}
