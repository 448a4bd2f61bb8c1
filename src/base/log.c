/*
 * log.c - the daemon's log: one line per event on stderr, logfmt by default
 * or JSON.  See log.h.
 *
 * A line is formatted into a stack buffer and written with one write(2), so
 * concurrent threads never interleave within a line and no lock is taken.
 * A line that would be too long is planned to fit: long values are cut
 * (ending "...") so that every field and the closing brace still fit.  Values
 * are quoted and escaped (put_quoted()) so that a line holds no control
 * character and, in JSON, no byte that is not UTF-8, whatever the value quotes.
 */
#include "base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
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
 * The escaped form of the character at p, for logfmt or JSON alike: '"',
 * '\\' and newline by a backslash; the other C0 controls, DEL and the C1
 * controls (U+0080-U+009F) as \u00XX; a byte that starts no valid UTF-8
 * sequence as \u00XX of its value, so that a value quoting a client's
 * bytes (an admin's key, an attribute) leaves a JSON line JSON and shows
 * which bytes they were.  Other UTF-8 text is kept as is.  Writes at most
 * 6 bytes to out (no NUL); returns how many, and in *used how many bytes
 * of p it stands for.
 */
static size_t
escape_char(const unsigned char *p, char out[6], size_t *used)
{
	unsigned char ch = *p;
	size_t n = util_utf8_len(p);

	*used = 1;
	if (ch == '"' || ch == '\\') {
		out[0] = '\\';
		out[1] = (char)ch;
		return 2;
	}
	if (ch == '\n') {
		out[0] = '\\';
		out[1] = 'n';
		return 2;
	}
	if (ch == 0xc2 && n == 2 && p[1] < 0xa0) {
		*used = 2;
		ch = p[1];
	} else if (!(ch < 0x20 || ch == 0x7f || n == 0)) {
		memcpy(out, p, n);
		*used = n;
		return n;
	}
	out[0] = '\\';
	out[1] = 'u';
	out[2] = '0';
	out[3] = '0';
	out[4] = "0123456789abcdef"[ch >> 4];
	out[5] = "0123456789abcdef"[ch & 0xf];
	return 6;
}

/* Bytes of s once escaped, without the quotes; counting stops past cap. */
static size_t
escaped_len(const char *s, size_t cap)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t total = 0, used;
	char tmp[6];

	while (*p != '\0' && total <= cap) {
		total += escape_char(p, tmp, &used);
		p += used;
	}
	return total;
}

/*
 * Append s to buf at *off, quoted and escaped (escape_char()), with at
 * most budget bytes between the quotes.  A value longer than that is cut
 * at a character and ends with "..." inside its quotes; no escape is ever
 * split.  The caller makes sure budget + 2 bytes fit (plan_budgets()).
 */
#define LOG_CUT_MARK "..."
#define LOG_CUT_LEN  (sizeof(LOG_CUT_MARK) - 1)

static void
put_quoted(char *buf, size_t *off, const char *s, size_t budget)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t o = *off, room, n, used;
	char esc[6];
	bool cut = escaped_len(s, budget) > budget;

	room = cut ? (budget >= LOG_CUT_LEN ? budget - LOG_CUT_LEN : 0) :
		     budget;
	buf[o++] = '"';
	while (*p != '\0') {
		n = escape_char(p, esc, &used);
		if (n > room)
			break;
		memcpy(buf + o, esc, n);
		o += n;
		room -= n;
		p += used;
	}
	if (cut && budget >= LOG_CUT_LEN) {
		memcpy(buf + o, LOG_CUT_MARK, LOG_CUT_LEN);
		o += LOG_CUT_LEN;
	}
	buf[o++] = '"';
	*off = o;
}

static void
put_raw(char *buf, size_t *off, const char *s)
{
	size_t n = strlen(s);

	memcpy(buf + *off, s, n);
	*off += n;
}

/*
 * The least a value is given when the line is full: room for the cut
 * mark and a few bytes of the value, so each field still says something.
 */
#define LOG_VALUE_MIN 16

/*
 * Share avail bytes among the n values (escaped lengths len[]): a value
 * that fits in an equal share keeps all it needs and leaves the rest to
 * the others; the longer ones share what is left equally.  Writes each
 * value's budget to out[].
 */
static void
plan_budgets(const size_t *len, size_t *out, size_t n, size_t avail)
{
	size_t i, open = n, share;
	bool changed = true;

	for (i = 0; i < n; i++)
		out[i] = SIZE_MAX;
	while (changed && open > 0) {
		changed = false;
		share = avail / open;
		for (i = 0; i < n; i++) {
			if (out[i] == SIZE_MAX && len[i] <= share) {
				out[i] = len[i];
				avail -= len[i];
				open--;
				changed = true;
			}
		}
	}
	for (i = 0; i < n && open > 0; i++)
		if (out[i] == SIZE_MAX)
			out[i] = avail / open;
}

/*
 * Bytes a field takes besides its value (which is in quotes): ,"key":
 * (JSON) or " key=" (logfmt).
 */
static size_t
field_frame(const char *key, bool json)
{
	if (json)
		return 1 + 2 + escaped_len(key, SIZE_MAX) + 1 + 2;
	return 1 + strlen(key) + 1 + 2;
}

/* Append one key=value (logfmt) or ,"key":value (JSON). */
static void
put_field(char *buf, size_t *off, const char *key, const char *val,
    size_t budget, bool json)
{
	if (json) {
		put_raw(buf, off, ",");
		put_quoted(buf, off, key, SIZE_MAX);
		put_raw(buf, off, ":");
	} else {
		put_raw(buf, off, " ");
		put_raw(buf, off, key);
		put_raw(buf, off, "=");
	}
	put_quoted(buf, off, val, budget);
}

/*
 * The most fields a line carries: msg, and log_fields()'s extra ones
 * (the access log has about a dozen).  Fields past it, or whose key
 * leaves no room for a value, are left off whole.
 */
#define LOG_FIELDS_MAX 32

/*
 * Format and write one line.  The line is planned before it is written:
 * the fixed parts (time, level, keys, quotes and separators) are counted,
 * and what remains of LOG_LINE_MAX is shared among the values, so a long
 * value is cut (ending "...") and every field after it is still whole and
 * the line still closed: one record per line, valid JSON in JSON.
 */
static void
emit(enum log_level level, const char *msg, const char *const *keys,
    const char *const *vals, size_t n)
{
	char buf[LOG_LINE_MAX], ts[96];
	const char *k[LOG_FIELDS_MAX], *v[LOG_FIELDS_MAX];
	size_t len[LOG_FIELDS_MAX], budget[LOG_FIELDS_MAX];
	struct timespec now;
	struct tm tm;
	size_t off = 0, i, nf, used, frame;
	bool json = __atomic_load_n(&log_json, __ATOMIC_RELAXED) != 0;
	ssize_t w;

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
	    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
	    tm.tm_sec, (long)(now.tv_nsec / 1000000) % 1000);
	/* {"ts":"<ts>","level":"<level>"...}\n or ts=<ts> level=<level>...\n */
	used = (json ? strlen("{\"ts\":\"\",\"level\":\"\"}\n") :
		       strlen("ts= level=\n")) +
	    strlen(ts) + strlen(log_level_name(level));
	nf = 0;
	for (i = 0; i <= n && nf < LOG_FIELDS_MAX; i++) {
		const char *key = i == 0 ? "msg" : keys[i - 1];
		const char *val = i == 0 ? msg : vals[i - 1];

		frame = field_frame(key, json);
		if (used + frame + LOG_VALUE_MIN > sizeof(buf))
			continue;
		used += frame + LOG_VALUE_MIN;
		k[nf] = key;
		v[nf] = val != NULL ? val : "";
		len[nf] = escaped_len(v[nf], sizeof(buf));
		nf++;
	}
	plan_budgets(len, budget, nf, sizeof(buf) - used + nf * LOG_VALUE_MIN);
	if (json) {
		put_raw(buf, &off, "{\"ts\":");
		put_quoted(buf, &off, ts, SIZE_MAX);
		put_raw(buf, &off, ",\"level\":");
		put_quoted(buf, &off, log_level_name(level), SIZE_MAX);
	} else {
		put_raw(buf, &off, "ts=");
		put_raw(buf, &off, ts);
		put_raw(buf, &off, " level=");
		put_raw(buf, &off, log_level_name(level));
	}
	for (i = 0; i < nf; i++)
		put_field(buf, &off, k[i], v[i], budget[i], json);
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
