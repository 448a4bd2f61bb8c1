/*
 * watch.c - inotify on the config file's directory (see watch.h).
 *
 * One thread polls the inotify descriptor and a pipe used to stop it.  Two
 * directories are watched: the one the path names, where an event counts
 * when it names the file itself or "..data" (the symlink a ConfigMap
 * volume swaps), and the one the path resolves to (realpath: the target
 * of a symlink into another directory), where it counts when it names the
 * target.  Often they are one directory, and one watch.  After every batch
 * of events the path is resolved again: a target that moved is a change,
 * and its directory is watched instead of the old one.
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
	(IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ATTRIB)

struct watch {
	int ifd;
	int stop[2]; /* pipe: write one byte to stop */
	int debounce_ms;
	char *path; /* as given */
	char *base; /* the file's name within its directory */
	int wd_dir; /* the directory the path names */
	/* What the path resolved to last, its name within its directory
	 * (into real) and that directory's watch (maybe wd_dir); NULL and
	 * -1 while it does not resolve. */
	char *real;
	const char *real_base;
	int wd_real;
	watch_fn fn;
	void *arg;
	pthread_t thread;
};

/* Resolve the path again and watch the directory it leads to.  True if
 * it leads somewhere else than before (a change).  A path that does not
 * resolve (a file being replaced) keeps the watch it had. */
static bool
resolve(struct watch *w)
{
	char buf[PATH_MAX], *real, *slash;
	int wd;

	if (realpath(w->path, buf) == NULL)
		return false;
	if (w->real != NULL && strcmp(buf, w->real) == 0)
		return false;
	if ((real = rl_strdup(buf)) == NULL)
		return false;	   /* try again at the next event */
	slash = strrchr(buf, '/'); /* realpath: absolute */
	if (slash == buf)
		slash[1] = '\0';
	else
		*slash = '\0';
	if ((wd = inotify_add_watch(w->ifd, buf, WATCH_MASK)) < 0) {
		log_warn("watch: %s", buf);
		rl_free(real);
		return false;
	}
	/* The old directory may be gone already (a ConfigMap version is
	 * deleted after the swap): then its watch went with it. */
	if (w->wd_real >= 0 && w->wd_real != w->wd_dir && w->wd_real != wd)
		(void)inotify_rm_watch(w->ifd, w->wd_real);
	rl_free(w->real);
	w->real = real;
	w->real_base = strrchr(real, '/') + 1;
	w->wd_real = wd;
	return true;
}

/* Does event ev concern the config file? */
static bool
concerns(const struct watch *w, const struct inotify_event *ev)
{
	if (ev->len == 0)
		return false;
	if (ev->wd == w->wd_dir &&
	    (strcmp(ev->name, w->base) == 0 || strcmp(ev->name, "..data") == 0))
		return true;
	return ev->wd == w->wd_real && strcmp(ev->name, w->real_base) == 0;
}

/* Read pending events; true if any concerns the config file, or it now
 * resolves to another file. */
static bool
drain(struct watch *w)
{
	char buf[4096]
	    __attribute__((aligned(__alignof__(struct inotify_event))));
	bool hit = false;
	ssize_t n;
	char *p;

	while ((n = read(w->ifd, buf, sizeof(buf))) > 0) {
		for (p = buf; p < buf + n;) {
			const struct inotify_event *ev = (void *)p;

			if (concerns(w, ev))
				hit = true;
			p += sizeof(*ev) + ev->len;
		}
	}
	if (resolve(w))
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
	int rc, timeout;

	for (;;) {
		timeout = -1;
		if (deadline != 0) {
			left = deadline - util_monotonic_us();
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
	const char *slash = strrchr(path, '/');
	char dir[PATH_MAX];

	if (slash == NULL)
		util_strlcpy(dir, ".", sizeof(dir));
	else if (slash == path)
		util_strlcpy(dir, "/", sizeof(dir));
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	if ((w = rl_calloc(1, sizeof(*w))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	w->ifd = w->stop[0] = w->stop[1] = -1;
	w->wd_dir = w->wd_real = -1;
	w->debounce_ms = debounce_ms;
	w->fn = fn;
	w->arg = arg;
	if ((w->path = rl_strdup(path)) == NULL ||
	    (w->base = rl_strdup(slash != NULL ? slash + 1 : path)) == NULL) {
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
	if (w->ifd >= 0)
		close(w->ifd);
	if (w->stop[0] >= 0) {
		close(w->stop[0]);
		close(w->stop[1]);
	}
	rl_free(w->real);
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
	close(w->ifd);
	close(w->stop[0]);
	close(w->stop[1]);
	rl_free(w->real);
	rl_free(w->base);
	rl_free(w->path);
	rl_free(w);
}
