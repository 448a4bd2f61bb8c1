/*
 * check_watch.c - the config file watch (src/base/watch.c) on real files
 * in a temporary directory: a file replaced by rename is seen; a path that
 * is a symlink into another directory is seen when its target is replaced,
 * and again after the link is pointed elsewhere; a change of any link of
 * a chain of symlinks is seen (a ConfigMap's "..data" swap behind a
 * user's own symlink too), and a chain longer than the walk follows still
 * sees its file replaced; other files changing all the time in the
 * directory do not hold a pending change back; the config's directory
 * deleted and made again, or swapped for another by rename, is followed.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

/* Point link at target the way deployment tools do: a new symlink renamed
 * over the old one. */
static void
relink(const char *target, const char *link)
{
	char tmp[PATH_MAX];

	snprintf(tmp, sizeof(tmp), "%s.tmp", link);
	ck_assert_msg(symlink(target, tmp) == 0, "symlink %s: %s", tmp,
	    strerror(errno));
	ck_assert_msg(rename(tmp, link) == 0, "rename: %s", strerror(errno));
}

static void
make_dir(const char *rel)
{
	char p[PATH_MAX];

	ck_assert_msg(mkdir(at(p, rel), 0755) == 0, "mkdir %s: %s", p,
	    strerror(errno));
}

/*
 * c/conf.yaml -> ../l1/link -> ../l2/link -> ../r/real.yaml, each link in
 * its own directory.  Pointing the middle link l1/link at l2b/link ->
 * ../r2/real.yaml is a change (only c/ and r/ used to be watched: it was
 * never seen), and then r2/ is watched.  Shortening the chain
 * (l1/link -> ../r/real.yaml) is a change too, and l2b/ no longer counts.
 */
START_TEST(test_symlink_chain)
{
	char p[PATH_MAX], conf[PATH_MAX];
	struct watch *w;

	make_dir("c");
	make_dir("l1");
	make_dir("l2");
	make_dir("l2b");
	make_dir("r");
	make_dir("r2");
	write_file(at(p, "r/real.yaml"), "r\n");
	ck_assert_int_eq(symlink("../r/real.yaml", at(p, "l2/link")), 0);
	ck_assert_int_eq(symlink("../l2/link", at(p, "l1/link")), 0);
	ck_assert_int_eq(symlink("../l1/link", at(conf, "c/conf.yaml")), 0);
	w = start(conf);

	write_file(at(p, "r2/real.yaml"), "r2\n");
	ck_assert_int_eq(symlink("../r2/real.yaml", at(p, "l2b/link")), 0);
	ck_assert_int_eq(changes_within(pfd[0], 400), 0);
	relink("../l2b/link", at(p, "l1/link"));
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "a change of the chain's middle link was not seen");
	replace_file(at(p, "r2/real.yaml"), "r2 again\n");
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "the new end of the chain was not watched");

	relink("../r/real.yaml", at(p, "l1/link"));
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "a chain that got shorter was not seen");
	relink("../r/real.yaml", at(p, "l2b/link"));
	replace_file(at(p, "r2/real.yaml"), "r2 gone\n");
	ck_assert_int_eq(changes_within(pfd[0], 600), 0);
	replace_file(at(p, "r/real.yaml"), "r again\n");
	ck_assert_int_ge(first_change_ms(pfd[0], 2000), 0);
	watch_stop(w);
}
END_TEST

/*
 * A user's own symlink to a file of a ConfigMap volume: u/conf.yaml ->
 * ../cm/ratelimitd.yaml -> ..data/ratelimitd.yaml, ..data -> ..v1.  The
 * kubelet swapping ..data to ..v2 is a change, and so is the next swap.
 */
START_TEST(test_configmap_behind_symlink)
{
	char p[PATH_MAX], conf[PATH_MAX];
	struct watch *w;

	make_dir("u");
	make_dir("cm");
	make_dir("cm/..v1");
	make_dir("cm/..v2");
	make_dir("cm/..v3");
	write_file(at(p, "cm/..v1/ratelimitd.yaml"), "v1\n");
	write_file(at(p, "cm/..v2/ratelimitd.yaml"), "v2\n");
	write_file(at(p, "cm/..v3/ratelimitd.yaml"), "v3\n");
	ck_assert_int_eq(symlink("..v1", at(p, "cm/..data")), 0);
	ck_assert_int_eq(symlink("..data/ratelimitd.yaml",
			     at(p, "cm/ratelimitd.yaml")),
	    0);
	ck_assert_int_eq(symlink("../cm/ratelimitd.yaml",
			     at(conf, "u/conf.yaml")),
	    0);
	w = start(conf);

	relink("..v2", at(p, "cm/..data"));
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "the ..data swap behind a symlink was not seen");
	relink("..v3", at(p, "cm/..data"));
	ck_assert_int_ge(first_change_ms(pfd[0], 2000), 0);
	watch_stop(w);
}
END_TEST

/*
 * A chain of 12 symlinks, more than the walk follows: a change of the
 * second link is seen, and so is the file at the end replaced (the
 * resolved file is watched when the walk stops short of it).
 */
START_TEST(test_symlink_chain_too_long)
{
	char p[PATH_MAX], target[80], rel[64], conf[PATH_MAX];
	struct watch *w;
	int i;

	make_dir("r");
	make_dir("r2");
	write_file(at(p, "r/real.yaml"), "r\n");
	write_file(at(p, "r2/real.yaml"), "r2\n");
	snprintf(target, sizeof(target), "../r/real.yaml");
	for (i = 12; i >= 1; i--) {
		snprintf(rel, sizeof(rel), "d%d", i);
		make_dir(rel);
		snprintf(rel, sizeof(rel), "d%d/link", i);
		ck_assert_int_eq(symlink(target, at(p, rel)), 0);
		snprintf(target, sizeof(target), "../%s", rel);
	}
	ck_assert_int_eq(symlink("d1/link", at(conf, "conf.yaml")), 0);
	w = start(conf);

	replace_file(at(p, "r/real.yaml"), "r again\n");
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "the file at the end of a long chain was not watched");
	relink("../r2/real.yaml", at(p, "d2/link"));
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "a change of the second link was not seen");
	replace_file(at(p, "r2/real.yaml"), "r2 again\n");
	ck_assert_int_ge(first_change_ms(pfd[0], 2000), 0);
	watch_stop(w);
}
END_TEST

/* CPU time of this process so far, in ms. */
static long long
cpu_ms(void)
{
	struct rusage ru;

	ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
	return (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
	    (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

/* The watch thread's CPU over 600 ms of quiet, in ms. */
static long long
cpu_while_quiet(void)
{
	long long t0 = cpu_ms();

	ck_assert_int_eq(changes_within(pfd[0], 600), 0);
	return cpu_ms() - t0;
}

/*
 * conf.yaml pointed at a file not there yet in another directory, then at
 * a loop of links: each is a change, and neither walk, which fails, may
 * keep the watch busy (a failed walk once removed the watch it had just
 * added, whose IN_IGNORED woke it to walk and fail again, at full CPU);
 * the file coming later where the link points is seen.
 */
START_TEST(test_link_to_missing_file)
{
	char p[PATH_MAX], conf[PATH_MAX];
	long long cpu;
	struct watch *w;

	make_dir("a");
	make_dir("b");
	make_dir("loop");
	write_file(at(p, "a/real.yaml"), "a\n");
	ck_assert_int_eq(symlink("l2", at(p, "loop/l1")), 0);
	ck_assert_int_eq(symlink("l1", at(p, "loop/l2")), 0);
	ck_assert_int_eq(symlink("a/real.yaml", at(conf, "conf.yaml")), 0);
	w = start(conf);

	relink("b/real.yaml", conf);
	ck_assert_int_ge(first_change_ms(pfd[0], 2000), 0);
	cpu = cpu_while_quiet();
	ck_assert_msg(cpu < 150, "%lld ms of CPU in 600 ms of quiet", cpu);
	write_file(at(p, "b/real.yaml"), "b\n");
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "the file that came where the link points was not seen");

	relink("loop/l1", conf);
	ck_assert_int_ge(first_change_ms(pfd[0], 2000), 0);
	cpu = cpu_while_quiet();
	ck_assert_msg(cpu < 150, "%lld ms of CPU in 600 ms of quiet", cpu);
	watch_stop(w);
}
END_TEST

/*
 * The config's directory deleted and made again, the file written in the
 * new one: a change, and so is a later edit there.  (The watch was on the
 * deleted directory and nothing watched its parent: no change was ever
 * seen again, and the running config stayed.)
 */
START_TEST(test_dir_recreated)
{
	char p[PATH_MAX], d[PATH_MAX], cmd[PATH_MAX + 16];
	struct watch *w;

	make_dir("c");
	write_file(at(p, "c/r.yaml"), "a\n");
	w = start(p);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", at(d, "c"));
	ck_assert_int_eq(system(cmd), 0);
	(void)changes_within(pfd[0], 2 * DEBOUNCE_MS + 100); /* the delete */
	make_dir("c");
	write_file(p, "b\n");
	ck_assert_msg(first_change_ms(pfd[0], 3000) >= 0,
	    "the file in the directory made again was not seen");
	replace_file(p, "c\n");
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "an edit in the directory made again was not seen");
	watch_stop(w);
}
END_TEST

/*
 * mv c c.old; mv c.new c: the path now names another directory, whose
 * file is a change, as is a later edit there; an edit in c.old, which
 * the path no longer names, is none.  (The watch followed the directory
 * to c.old.)
 */
START_TEST(test_dir_swapped)
{
	char p[PATH_MAX], a[PATH_MAX], b[PATH_MAX];
	struct watch *w;

	make_dir("c");
	make_dir("c.new");
	write_file(at(p, "c/r.yaml"), "a\n");
	write_file(at(a, "c.new/r.yaml"), "b\n");
	w = start(p);
	ck_assert_int_eq(rename(at(a, "c"), at(b, "c.old")), 0);
	ck_assert_int_eq(rename(at(a, "c.new"), at(b, "c")), 0);
	ck_assert_msg(first_change_ms(pfd[0], 3000) >= 0,
	    "the directory swapped in was not seen");
	(void)changes_within(pfd[0], 2 * DEBOUNCE_MS + 100);
	replace_file(p, "c\n");
	ck_assert_msg(first_change_ms(pfd[0], 2000) >= 0,
	    "an edit in the directory swapped in was not seen");
	(void)changes_within(pfd[0], 2 * DEBOUNCE_MS + 100);
	replace_file(at(a, "c.old/r.yaml"), "d\n");
	ck_assert_int_eq(changes_within(pfd[0], 1500), 0);
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
	tcase_add_test(tc, test_symlink_chain);
	tcase_add_test(tc, test_configmap_behind_symlink);
	tcase_add_test(tc, test_symlink_chain_too_long);
	tcase_add_test(tc, test_link_to_missing_file);
	tcase_add_test(tc, test_busy_directory);
	tcase_add_test(tc, test_dir_recreated);
	tcase_add_test(tc, test_dir_swapped);
	suite_add_tcase(s, tc);
	return s;
}
