/*
 * log.c - the daemon's log: one line per event on stderr, logfmt by default
 * or JSON.  See log.h.
 *
 * A line is formatted into a stack buffer and written with one write(2), so
 * concurrent threads never interleave within a line and no lock is taken.
 * Over-long messages are truncated, never split.  Values are quoted and
 * escaped (put_quoted()) so that a line holds no control character and,
 * in JSON, no byte that is not UTF-8, whatever the value quotes.
 */
#include "base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"

#define LOG_LINE_MAX 2048

static int log_level = LOG_LEVEL_INFO;
static int log_json;

static const char *const level_names[] = { "debug", "info", "warn", "error" };

void
log_set_level(enum log_level level)
{
	__atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

enum log_level
log_get_level(void)
{
	return (enum log_level)__atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

bool
log_enabled(enum log_level level)
{
	return (int)level >= __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

void
log_set_json(bool json)
{
	__atomic_store_n(&log_json, json ? 1 : 0, __ATOMIC_RELAXED);
}

int
log_level_parse(const char *s, enum log_level *out)
{
	size_t i;

	for (i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

const char *
log_level_name(enum log_level level)
{
	if ((unsigned)level >= sizeof(level_names) / sizeof(level_names[0]))
		return "?";
	return level_names[level];
}

/*
 * Append s to buf at *off, quoted and escaped for logfmt or JSON alike:
 * '"', '\\' and newline by a backslash; the other C0 controls, DEL and
 * the C1 controls (U+0080-U+009F) as \u00XX; a byte that starts no valid
 * UTF-8 sequence as \u00XX of its value, so that a value quoting a
 * client's bytes (an admin's key, an attribute) leaves a JSON line JSON
 * and shows which bytes they were.  Other UTF-8 text is kept as is.
 */
static void
put_quoted(char *buf, size_t len, size_t *off, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t o = *off, n;

	if (o + 1 < len)
		buf[o++] = '"';
	while (*p != '\0' && o + 8 < len) {
		unsigned char ch = *p;

		n = util_utf8_len(p);
		if (ch == '"' || ch == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)ch;
		} else if (ch == '\n') {
			buf[o++] = '\\';
			buf[o++] = 'n';
		} else if (ch < 0x20 || ch == 0x7f || n == 0) {
			o += (size_t)snprintf(buf + o, len - o, "\\u%04x", ch);
		} else if (ch == 0xc2 && p[1] < 0xa0) {
			o += (size_t)snprintf(buf + o, len - o, "\\u%04x",
			    p[1]);
			p += 2;
			continue;
		} else {
			memcpy(buf + o, p, n);
			o += n;
			p += n;
			continue;
		}
		p++;
	}
	if (o + 1 < len)
		buf[o++] = '"';
	buf[o] = '\0';
	*off = o;
}

static void
put_raw(char *buf, size_t len, size_t *off, const char *s)
{
	size_t n = strlen(s);

	if (*off + n >= len)
		n = len - *off - 1;
	memcpy(buf + *off, s, n);
	*off += n;
	buf[*off] = '\0';
}

/* Append one key=value (logfmt) or ,"key":value (JSON). */
static void
put_field(char *buf, size_t len, size_t *off, const char *key, const char *val,
    bool json)
{
	if (json) {
		put_raw(buf, len, off, ",");
		put_quoted(buf, len, off, key);
		put_raw(buf, len, off, ":");
	} else {
		put_raw(buf, len, off, " ");
		put_raw(buf, len, off, key);
		put_raw(buf, len, off, "=");
	}
	put_quoted(buf, len, off, val);
}

static void
emit(enum log_level level, const char *msg, const char *const *keys,
    const char *const *vals, size_t n)
{
	char buf[LOG_LINE_MAX], ts[96];
	struct timespec now;
	struct tm tm;
	size_t off = 0, i;
	bool json = __atomic_load_n(&log_json, __ATOMIC_RELAXED) != 0;
	ssize_t w;

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
	    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
	    tm.tm_sec, (long)(now.tv_nsec / 1000000) % 1000);
	if (json) {
		put_raw(buf, sizeof(buf) - 2, &off, "{\"ts\":");
		put_quoted(buf, sizeof(buf) - 2, &off, ts);
		put_field(buf, sizeof(buf) - 2, &off, "level",
		    log_level_name(level), true);
		put_field(buf, sizeof(buf) - 2, &off, "msg", msg, true);
	} else {
		put_raw(buf, sizeof(buf) - 2, &off, "ts=");
		put_raw(buf, sizeof(buf) - 2, &off, ts);
		put_raw(buf, sizeof(buf) - 2, &off, " level=");
		put_raw(buf, sizeof(buf) - 2, &off, log_level_name(level));
		put_field(buf, sizeof(buf) - 2, &off, "msg", msg, false);
	}
	for (i = 0; i < n; i++)
		put_field(buf, sizeof(buf) - 2, &off, keys[i], vals[i], json);
	if (json)
		buf[off++] = '}';
	buf[off++] = '\n';
	do {
		w = write(STDERR_FILENO, buf, off);
	} while (w < 0 && errno == EINTR);
}

static void
vlog(enum log_level level, const char *errstr, const char *fmt, va_list ap)
{
	char msg[LOG_LINE_MAX / 2];
	const char *k[] = { "err" };
	const char *v[] = { errstr };

	if (!log_enabled(level))
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	emit(level, msg, k, v, errstr != NULL ? 1 : 0);
}

void
log_fields(enum log_level level, const char *msg, const char *const *keys,
    const char *const *vals, size_t n)
{
	if (log_enabled(level))
		emit(level, msg, keys, vals, n);
}

#define LOG_FN(name, level, with_errno) \
	void name(const char *fmt, ...) \
	{ \
		int saved = errno; \
		va_list ap; \
\
		va_start(ap, fmt); \
		vlog(level, with_errno ? strerror(saved) : NULL, fmt, ap); \
		va_end(ap); \
		errno = saved; \
	}

LOG_FN(log_debug, LOG_LEVEL_DEBUG, false)
LOG_FN(log_info, LOG_LEVEL_INFO, false)
LOG_FN(log_warn, LOG_LEVEL_WARN, true)
LOG_FN(log_warnx, LOG_LEVEL_WARN, false)
LOG_FN(log_error, LOG_LEVEL_ERROR, false)

void
fatalx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(LOG_LEVEL_ERROR, NULL, fmt, ap);
	va_end(ap);
	exit(1);
}
