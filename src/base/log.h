/*
 * log.h - one line per event on stderr, in logfmt:
 *   ts=2026-01-02T03:04:05.678Z level=warn msg="redis: connection refused"
 * log_warn() appends strerror(errno) (as err="..."); log_warnx() does not,
 * as in OpenBSD's log.c.  fatal()/fatalx() print and exit(1): start-up only.
 *
 * Every function may be called from any thread; a line is written with one
 * write(2) so lines from several threads never interleave.
 */
#ifndef RL_LOG_H
#define RL_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum log_level {
	LOG_LEVEL_DEBUG,
	LOG_LEVEL_INFO,
	LOG_LEVEL_WARN,
	LOG_LEVEL_ERROR
};

/* Set the lowest level written.  Any thread (an atomic store). */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
bool log_enabled(enum log_level level);

/* Write JSON objects instead of logfmt lines.  Any thread. */
void log_set_json(bool json);

/* Parse "debug" | "info" | "warn" | "error".  Returns 0 or -1. */
int log_level_parse(const char *s, enum log_level *out);
const char *log_level_name(enum log_level level);

void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fatalx(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

/*
 * A line with extra fields after msg: keys[i]=vals[i] (values are quoted
 * and escaped as needed).  Used for the access log.
 */
void log_fields(enum log_level level, const char *msg, const char *const *keys,
    const char *const *vals, size_t n);

#endif
