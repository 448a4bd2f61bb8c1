/*
 * watch.c - inotify on the config file's directory (see watch.h).
 *
 * One thread polls the inotify descriptor and a pipe used to stop it.  An
 * event counts when it names the file itself or "..data" (the symlink a
 * ConfigMap volume swaps); after the first such event the thread waits
 * debounce_ms for the burst to settle, then calls back once.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "base/log.h"
#include "base/util.h"
#include "base/watch.h"

struct watch {
	int ifd;
	int stop[2]; /* pipe: write one byte to stop */
	int debounce_ms;
	char *base; /* the file's name within its directory */
	watch_fn fn;
	void *arg;
	pthread_t thread;
};

/* Read pending events; true if any concerns the config file. */
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

			if (ev->len > 0 &&
			    (strcmp(ev->name, w->base) == 0 ||
				strcmp(ev->name, "..data") == 0))
				hit = true;
			p += sizeof(*ev) + ev->len;
		}
	}
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
	bool pending = false;
	int rc;

	for (;;) {
		rc = poll(pfd, 2, pending ? w->debounce_ms : -1);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0 || (pfd[1].revents & POLLIN))
			break;
		if (rc == 0) { /* quiet for debounce_ms */
			pending = false;
			w->fn(w->arg);
			continue;
		}
		if ((pfd[0].revents & POLLIN) && drain(w))
			pending = true;
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
	w->debounce_ms = debounce_ms;
	w->fn = fn;
	w->arg = arg;
	if ((w->base = rl_strdup(slash != NULL ? slash + 1 : path)) == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if ((w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0 ||
	    inotify_add_watch(w->ifd, dir,
		IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE |
		    IN_ATTRIB) < 0 ||
	    pipe2(w->stop, O_CLOEXEC) < 0) {
		snprintf(err, errlen, "watching %s: %s", dir, strerror(errno));
		goto fail;
	}
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
	rl_free(w->base);
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
	rl_free(w->base);
	rl_free(w);
}
