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

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

/* Set the lowest level written.  Any thread (an atomic store). */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
bool log_enabled(enum log_level level);

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

/* Raw line of already formatted logfmt fields (the access log). */
void log_line(enum log_level level, const char *fields);

#endif
