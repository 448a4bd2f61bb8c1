/*
 * watch.c - inotify on the config file's directory (see watch.h).
 *
 * One thread polls the inotify descriptor and a pipe used to stop it.  The
 * path is walked link by link, as the kernel would: the path, each
 * symlink it leads through (a link's target is read relative to the
 * link's directory), and the file at the end.  Every step of that chain
 * has its directory watched, and an event there counts when it names that
 * step, or "..data" (the symlink a ConfigMap volume swaps).  So a change
 * of any link is seen, not only of the first and the last: -c conf.yaml
 * -> a/link -> b/real.yaml, or a user's own symlink to a ConfigMap's
 * file.  The walk follows at most WATCH_LINKS symlinks (the kernel
 * allows 40; a config reached through more than a few is unheard of),
 * logs when there are more, and then watches the file the path fully
 * resolves to (realpath) as well, so a change of the file itself is
 * still seen.  Directories often coincide, and share one watch.
 *
 * After every batch of events the chain is walked again: one that leads
 * elsewhere (a link retargeted, a "..data" swapped, a chain grown or
 * shrunk) is a change, and its directories are watched instead of the
 * old ones; a watch no step uses any more is removed, so between walks
 * there are never more than WATCH_LINKS + 3 of them.  A walk that fails (a link
 * or the file being replaced) keeps the chain it had.  A symlink among the
 * directories of a step's path (other than "..data") is followed by the
 * watch but not itself watched (docs/operations.md).
 *
 * A watch follows a directory, not its name.  So every walk first watches
 * the directory the path names again (the same watch while it is the same
 * directory): one moved away (mv conf conf.old; mv conf.new conf) or
 * deleted and made again is then watched anew, and the walk that finds the
 * file in it is a change.  While that directory is missing, or a walk has
 * failed, no event may ever come (nothing watches the parent), so the walk
 * is also tried every WATCH_RETRY_MS; the log says when the directory goes
 * and when it is back.
 *
 * A change sets a deadline debounce_ms later, and each further event of
 * the file moves it (a file written in several steps is read once, whole);
 * at the deadline the thread calls back once.  Events of anything else in
 * the directories never move it, so a busy directory (a log file beside
 * the config) cannot hold a reload back.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"
#include "base/watch.h"

#define WATCH_MASK \
	(IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ATTRIB | \
	    IN_DELETE_SELF | IN_MOVE_SELF)

/* A walk that failed, or the path's directory not there, is tried again
 * this often: no event may ever come (its parent is not watched). */
#define WATCH_RETRY_MS 1000

/* Symlinks followed link by link (docs/operations.md). */
#define WATCH_LINKS 8

/* One step of the walk: a path, the watch on its directory, its name. */
struct watch_step {
	int wd;
	char *path;	  /* as reached from the step before */
	const char *name; /* into path: the last component */
};

/* The path, up to WATCH_LINKS symlinks, the file at the end, and (when
 * the walk stopped short of it) the file the path fully resolves to. */
struct watch_chain {
	int n;
	struct watch_step step[WATCH_LINKS + 2];
	char *real; /* realpath(): NULL before the first walk */
	bool cut;   /* more than WATCH_LINKS symlinks */
};

struct watch {
	int ifd;
	int stop[2]; /* pipe: write one byte to stop */
	int debounce_ms;
	char *path; /* as given */
	char *base; /* the file's name within its directory */
	int wd_dir; /* the directory the path names; -1 while it is gone */
	struct watch_chain chain; /* the last walk that succeeded */
	watch_fn fn;
	void *arg;
	pthread_t thread;
};

/* Split path into its directory (into dir) and its last component. */
static const char *
split(const char *path, char *dir, size_t dirlen)
{
	const char *slash = strrchr(path, '/');

	if (slash == NULL)
		util_strlcpy(dir, ".", dirlen);
	else if (slash == path)
		util_strlcpy(dir, "/", dirlen);
	else
		snprintf(dir, dirlen, "%.*s", (int)(slash - path), path);
	return slash != NULL ? slash + 1 : path;
}

/* Watch path's directory and append path as a step of c.  0, or -1. */
static int
chain_add(struct watch *w, struct watch_chain *c, const char *path)
{
	struct watch_step *s = &c->step[c->n];
	char dir[PATH_MAX];
	const char *name = split(path, dir, sizeof(dir));

	if ((s->path = rl_strdup(path)) == NULL)
		return -1;
	s->name = s->path + (name - path);
	/* A directory that vanished (a ConfigMap version deleted) fails
	 * the walk, which is tried again at the next event. */
	if ((s->wd = inotify_add_watch(w->ifd, dir, WATCH_MASK)) < 0) {
		rl_free(s->path);
		return -1;
	}
	c->n++;
	return 0;
}

/* Does c use the watch wd? */
static bool
chain_uses(const struct watch_chain *c, int wd)
{
	int i;

	for (i = 0; i < c->n; i++)
		if (c->step[i].wd == wd)
			return true;
	return false;
}

/* Free c, removing each of its watches that keep (nor the directory the
 * path names) does not use.  A watch whose directory was deleted went
 * with it: removing it again fails, harmlessly. */
static void
chain_drop(struct watch *w, struct watch_chain *c,
    const struct watch_chain *keep)
{
	int i;

	for (i = 0; i < c->n; i++) {
		if (c->step[i].wd != w->wd_dir &&
		    !chain_uses(keep, c->step[i].wd))
			(void)inotify_rm_watch(w->ifd, c->step[i].wd);
		rl_free(c->step[i].path);
	}
	rl_free(c->real);
	memset(c, 0, sizeof(*c));
}

/* Walk w->path link by link into c (empty), watching each step's
 * directory before reading the step, so that no change slips between.
 * 0, or -1 when it does not resolve (c then holds what was watched). */
static int
chain_walk(struct watch *w, struct watch_chain *c)
{
	char cur[PATH_MAX], target[PATH_MAX], dir[PATH_MAX];
	const struct watch_step *last;
	const char *slash;
	ssize_t len;

	if (util_strlcpy(cur, w->path, sizeof(cur)) >= sizeof(cur))
		return -1;
	for (;;) {
		if (chain_add(w, c, cur) < 0)
			return -1;
		if ((len = readlink(cur, target, sizeof(target) - 1)) < 0) {
			if (errno != EINVAL)
				return -1; /* missing: being replaced */
			break;		   /* not a symlink: the file */
		}
		target[len] = '\0';
		if (c->n > WATCH_LINKS) {
			c->cut = true;
			break;
		}
		if (target[0] == '/') {
			util_strlcpy(cur, target, sizeof(cur));
		} else {
			(void)split(cur, dir, sizeof(dir));
			if (snprintf(cur, sizeof(cur), "%s/%s", dir, target) >=
			    (int)sizeof(cur))
				return -1;
		}
	}
	if (realpath(w->path, target) == NULL ||
	    (c->real = rl_strdup(target)) == NULL)
		return -1;
	/* The file at the end is the resolved one, unless the walk was cut
	 * short (or the last step names it oddly, "dir/."): then watch the
	 * resolved file too. */
	last = &c->step[c->n - 1];
	slash = strrchr(c->real, '/');
	if (c->cut || strcmp(last->name, slash + 1) != 0)
		return chain_add(w, c, c->real);
	return 0;
}

/* Are a and b the same walk (same steps, same watches, same file)? */
static bool
chain_same(const struct watch_chain *a, const struct watch_chain *b)
{
	int i;

	if (a->n != b->n || a->real == NULL || b->real == NULL ||
	    strcmp(a->real, b->real) != 0)
		return false;
	for (i = 0; i < a->n; i++)
		if (a->step[i].wd != b->step[i].wd ||
		    strcmp(a->step[i].path, b->step[i].path) != 0)
			return false;
	return true;
}

/* Watch the directory the path names, again: another watch when another
 * directory has taken the name, none while there is none (logged). */
static void
watch_dir(struct watch *w)
{
	char dir[PATH_MAX];
	int wd, old = w->wd_dir;

	(void)split(w->path, dir, sizeof(dir));
	wd = inotify_add_watch(w->ifd, dir, WATCH_MASK);
	if (wd == old)
		return;
	if (wd < 0)
		log_warnx(
		    "watch: %s: %s; changes of %s are not seen until it is "
		    "back (looked for every %d ms; SIGHUP still reloads)",
		    dir, strerror(errno), w->path, WATCH_RETRY_MS);
	else if (old < 0)
		log_info("watch: %s is back; watching %s again", dir, w->path);
	/* The old one, unless the chain uses it (its drop removes it). */
	if (old >= 0 && !chain_uses(&w->chain, old))
		(void)inotify_rm_watch(w->ifd, old);
	w->wd_dir = wd;
}

/* Walk the path again and watch the directories it leads through.  True
 * if it leads somewhere else than before (a change).  A walk that fails
 * (a file being replaced, a link to a file not there yet, a loop) keeps
 * the directories it reached watched, so that the file is seen when it
 * comes, and leaves no chain known: the next walk that succeeds is a
 * change.  Nothing is removed that the failed walk still uses, so that a
 * walk failing the same way again adds and removes no watch (a removal
 * queues an IN_IGNORED, which drain() does not take for a change). */
static bool
resolve(struct watch *w)
{
	struct watch_chain c;

	watch_dir(w);
	memset(&c, 0, sizeof(c));
	if (chain_walk(w, &c) < 0) {
		rl_free(c.real);
		c.real = NULL;
		chain_drop(w, &w->chain, &c);
		w->chain = c;
		return false;
	}
	if (chain_same(&c, &w->chain)) {
		chain_drop(w, &c, &w->chain);
		return false;
	}
	if (c.cut && !w->chain.cut)
		log_warnx(
		    "watch: %s leads through more than %d symlinks; "
		    "a change of a link past the %dth is not seen",
		    w->path, WATCH_LINKS, WATCH_LINKS);
	chain_drop(w, &w->chain, &c);
	w->chain = c;
	return true;
}

/* Does event ev concern the config file? */
static bool
concerns(const struct watch *w, const struct inotify_event *ev)
{
	const struct watch_step *s;
	int i;

	if (ev->len == 0)
		return false;
	if (strcmp(ev->name, "..data") == 0 &&
	    (ev->wd == w->wd_dir || chain_uses(&w->chain, ev->wd)))
		return true;
	if (ev->wd == w->wd_dir && strcmp(ev->name, w->base) == 0)
		return true;
	for (i = 0; i < w->chain.n; i++) {
		s = &w->chain.step[i];
		if (ev->wd == s->wd && strcmp(ev->name, s->name) == 0)
			return true;
	}
	return false;
}

/* Read pending events; true if any concerns the config file, or it now
 * resolves to another file. */
static bool
drain(struct watch *w)
{
	char buf[4096]
	    __attribute__((aligned(__alignof__(struct inotify_event))));
	bool hit = false, seen = false;
	ssize_t n;
	char *p;

	while ((n = read(w->ifd, buf, sizeof(buf))) > 0) {
		for (p = buf; p < buf + n;) {
			const struct inotify_event *ev = (void *)p;

			/* A watch removed (by resolve(), or with its
			 * directory, whose deletion its parent reports) is
			 * no reason to walk again. */
			if (!(ev->mask & IN_IGNORED))
				seen = true;
			if (concerns(w, ev))
				hit = true;
			p += sizeof(*ev) + ev->len;
		}
	}
	if (seen && resolve(w))
		hit = true;
	return hit;
}

static void *
watch_main(void *arg)
{
	struct watch *w = arg;
	struct pollfd pfd[2] = {
		{ .fd = w->ifd, .events = POLLIN },
		{ .fd = w->stop[0], .events = POLLIN },
	};
	int64_t deadline = 0, left; /* 0: no change pending */
	int64_t retry = 0;	    /* the next walk when one failed */
	int64_t next;		    /* the sooner of the two */
	int rc, timeout;

	for (;;) {
		if (w->wd_dir >= 0 && w->chain.real != NULL)
			retry = 0;
		else if (retry == 0)
			retry = util_monotonic_us() +
			    (int64_t)WATCH_RETRY_MS * 1000;
		next = deadline;
		if (retry != 0 && (next == 0 || retry < next))
			next = retry;
		timeout = -1;
		if (next != 0) {
			left = next - util_monotonic_us();
			timeout = left <= 0 ? 0 : (int)((left + 999) / 1000);
		}
		rc = poll(pfd, 2, timeout);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0 || (pfd[1].revents & POLLIN))
			break;
		/* An event of the file itself starts the quiet time again
		 * (a file written in several steps is read once, whole);
		 * one of anything else in the directory never moves it. */
		if (rc > 0 && (pfd[0].revents & POLLIN) && drain(w))
			deadline = util_monotonic_us() +
			    (int64_t)w->debounce_ms * 1000;
		if (retry != 0 && util_monotonic_us() >= retry) {
			retry = 0;
			if (resolve(w))
				deadline = util_monotonic_us() +
				    (int64_t)w->debounce_ms * 1000;
		}
		if (deadline != 0 && util_monotonic_us() >= deadline) {
			deadline = 0;
			w->fn(w->arg);
		}
	}
	return NULL;
}

struct watch *
watch_start(const char *path, int debounce_ms, watch_fn fn, void *arg,
    char *err, size_t errlen)
{
	struct watch *w;
	char dir[PATH_MAX];
	const char *base = split(path, dir, sizeof(dir));

	if ((w = rl_calloc(1, sizeof(*w))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	w->ifd = w->stop[0] = w->stop[1] = -1;
	w->wd_dir = -1;
	w->debounce_ms = debounce_ms;
	w->fn = fn;
	w->arg = arg;
	if ((w->path = rl_strdup(path)) == NULL ||
	    (w->base = rl_strdup(base)) == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if ((w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0 ||
	    (w->wd_dir = inotify_add_watch(w->ifd, dir, WATCH_MASK)) < 0 ||
	    pipe2(w->stop, O_CLOEXEC) < 0) {
		snprintf(err, errlen, "watching %s: %s", dir, strerror(errno));
		goto fail;
	}
	(void)resolve(w);
	if ((errno = pthread_create(&w->thread, NULL, watch_main, w)) != 0) {
		snprintf(err, errlen, "watch thread: %s", strerror(errno));
		goto fail;
	}
	return w;

fail:
	if (w->ifd >= 0) {
		chain_drop(w, &w->chain, &w->chain);
		close(w->ifd);
	}
	if (w->stop[0] >= 0) {
		close(w->stop[0]);
		close(w->stop[1]);
	}
	rl_free(w->base);
	rl_free(w->path);
	rl_free(w);
	return NULL;
}

void
watch_stop(struct watch *w)
{
	char c = 0;

	if (w == NULL)
		return;
	if (write(w->stop[1], &c, 1) < 0)
		log_warn("watch: stop");
	pthread_join(w->thread, NULL);
	chain_drop(w, &w->chain, &w->chain); /* close() drops the watches */
	close(w->ifd);
	close(w->stop[0]);
	close(w->stop[1]);
	rl_free(w->base);
	rl_free(w->path);
	rl_free(w);
}
