/*
 * watch.h - notice when the config file changes on disk.
 *
 * The watch is on the file's directory, not the file, because the common
 * ways of replacing a config never write the old inode: an editor or
 * deployment tool renames a new file over it, and a Kubernetes ConfigMap
 * volume swaps a "..data" symlink to a new directory.  A path that is a
 * symlink is followed link by link (at most 8), and the directory of
 * every link and of the file at the end is watched, so that pointing any
 * link elsewhere, or replacing the file, is a change (docs/operations.md).
 * Events are debounced (a burst of writes is one change).
 */
#ifndef RL_WATCH_H
#define RL_WATCH_H

struct watch;

typedef void (*watch_fn)(void *arg);

/*
 * Watch path; call fn(arg) from the watch's own thread once the file has
 * had no event for debounce_ms after a change (events of other files in
 * the directory never postpone the call).  Returns a new watch, or NULL
 * with a message in err (no inotify, a missing directory).  Start-up
 * only.
 */
struct watch *watch_start(const char *path, int debounce_ms, watch_fn fn,
    void *arg, char *err, size_t errlen);

/* Stop the thread and free.  NULL does nothing. */
void watch_stop(struct watch *w);

#endif
