/*
 * util.c - the allocation wrapper, duration and integer parsing, strlcpy and
 * clocks.  See util.h.
 *
 * The allocation wrapper exists for one reason: tests set
 * rl_alloc_fail_after(n) and walk every error path that an out-of-memory
 * condition can take, the way hiredis's test suite does.
 */
#include "base/util.h"

#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long alloc_budget = -1; /* < 0: never fail */

void
rl_alloc_fail_after(long n)
{
	__atomic_store_n(&alloc_budget, n, __ATOMIC_SEQ_CST);
}

/* True if this allocation should fail (test hook). */
static bool
alloc_should_fail(void)
{
	long b = __atomic_load_n(&alloc_budget, __ATOMIC_RELAXED);

	if (b < 0)
		return false;
	if (b == 0)
		return true;
	__atomic_sub_fetch(&alloc_budget, 1, __ATOMIC_SEQ_CST);
	return false;
}

void *
rl_malloc(size_t n)
{
	if (alloc_should_fail())
		return NULL;
	return malloc(n == 0 ? 1 : n);
}

void *
rl_calloc(size_t n, size_t size)
{
	if (alloc_should_fail())
		return NULL;
	return calloc(n == 0 ? 1 : n, size == 0 ? 1 : size);
}

void *
rl_realloc(void *p, size_t n)
{
	if (alloc_should_fail())
		return NULL;
	return realloc(p, n == 0 ? 1 : n);
}

char *
rl_strdup(const char *s)
{
	return rl_strndup(s, strlen(s));
}

char *
rl_strndup(const char *s, size_t n)
{
	char *p;

	if ((p = rl_malloc(n + 1)) == NULL)
		return NULL;
	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

void
rl_free(void *p)
{
	free(p);
}

int
util_parse_int64(const char *s, int64_t *out)
{
	char *end;
	long long v;

	if (s == NULL || *s == '\0' || (*s != '-' && (*s < '0' || *s > '9')))
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return -1;
	*out = v;
	return 0;
}

int
util_parse_duration_ms(const char *s, int64_t *out_ms)
{
	static const struct {
		const char *suffix;
		int64_t ms;
	} units[] = {
		{ "ms", 1 },
		{ "s", 1000 },
		{ "m", 60000 },
		{ "h", 3600000 },
		{ "d", 86400000 },
	};
	const char *p = s;
	int64_t v = 0;
	size_t i;

	if (s == NULL || *p < '0' || *p > '9')
		return -1;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (INT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (*p - '0');
	}
	for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(p, units[i].suffix) != 0)
			continue;
		if (v > INT64_MAX / units[i].ms)
			return -1;
		*out_ms = v * units[i].ms;
		return 0;
	}
	return -1;
}

size_t
util_strlcpy(char *dst, const char *src, size_t dstlen)
{
	size_t n = strlen(src);

	if (dstlen > 0) {
		size_t c = n < dstlen - 1 ? n : dstlen - 1;

		memcpy(dst, src, c);
		dst[c] = '\0';
	}
	return n;
}

/* "00" to "99": two digits per division (an answer formats a dozen
 * numbers, most of them ten digits long at a limit of 1e9). */
static const char util_digit_pairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233"
    "34353637383940414243444546474849505152535455565758596061626364656667"
    "6869707172737475767778798081828384858687888990919293949596979899";

size_t
util_fmt_int64(char *dst, int64_t v)
{
	char tmp[UTIL_INT64_DEC_MAX];
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	size_t i = sizeof(tmp), n = 0, d;

	while (u >= 100) {
		d = (size_t)(u % 100) * 2;
		u /= 100;
		tmp[--i] = util_digit_pairs[d + 1];
		tmp[--i] = util_digit_pairs[d];
	}
	if (u >= 10) {
		d = (size_t)u * 2;
		tmp[--i] = util_digit_pairs[d + 1];
		tmp[--i] = util_digit_pairs[d];
	} else {
		tmp[--i] = (char)('0' + u);
	}
	if (v < 0)
		dst[n++] = '-';
	memcpy(dst + n, tmp + i, sizeof(tmp) - i);
	return n + sizeof(tmp) - i;
}

static int64_t
clock_us(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
util_monotonic_us(void)
{
	return clock_us(CLOCK_MONOTONIC);
}

int64_t
util_realtime_us(void)
{
	return clock_us(CLOCK_REALTIME);
}

void
util_event_init(struct util_event *e)
{
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	e->set = false;
}

void
util_event_set(struct util_event *e)
{
	pthread_mutex_lock(&e->mu);
	e->set = true;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

void
util_event_wait(struct util_event *e)
{
	pthread_mutex_lock(&e->mu);
	while (!e->set)
		pthread_cond_wait(&e->cv, &e->mu);
	pthread_mutex_unlock(&e->mu);
}

void
util_event_destroy(struct util_event *e)
{
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->mu);
}

int
util_hex_value(int ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

size_t
util_utf8_len(const unsigned char *s)
{
	unsigned char lo = 0x80, hi = 0xbf;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		return (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (s[0] >= 0xe0 && s[0] <= 0xef) {
		if (s[0] == 0xe0)
			lo = 0xa0; /* overlong */
		if (s[0] == 0xed)
			hi = 0x9f; /* surrogates */
		if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80)
			return 0;
		return 3;
	}
	if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		if (s[0] == 0xf0)
			lo = 0x90; /* overlong */
		if (s[0] == 0xf4)
			hi = 0x8f; /* past U+10FFFF */
		if (s[1] < lo || s[1] > hi || (s[2] & 0xc0) != 0x80 ||
		    (s[3] & 0xc0) != 0x80)
			return 0;
		return 4;
	}
	return 0;
}

bool
util_utf8_valid(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n;

	for (; *p != '\0'; p += n)
		if ((n = util_utf8_len(p)) == 0)
			return false;
	return true;
}

const char *
util_escape(char *buf, size_t buflen, const char *s)
{
	size_t o = 0;

	for (; *s != '\0'; s++) {
		unsigned char ch = (unsigned char)*s;
		char esc[8];
		size_t n;

		if (ch == '"' || ch == '\\')
			n = (size_t)snprintf(esc, sizeof(esc), "\\%c", ch);
		else if (ch < 0x20 || ch == 0x7f)
			n = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", ch);
		else
			n = (size_t)snprintf(esc, sizeof(esc), "%c", ch);
		if (o + n + 4 > buflen) { /* room for "..." and NUL */
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		memcpy(buf + o, esc, n);
		o += n;
	}
	buf[o] = '\0';
	return buf;
}

void
util_utf8_clean(char *dst, const char *src)
{
	const unsigned char *p = (const unsigned char *)src;
	size_t n, o = 0;

	while (*p != '\0') {
		if ((n = util_utf8_len(p)) == 0) {
			memcpy(dst + o, "\xef\xbf\xbd", 3);
			o += 3;
			p++;
			continue;
		}
		memcpy(dst + o, p, n);
		o += n;
		p += n;
	}
	dst[o] = '\0';
}

/* ---- a growing buffer (util.h) ---- */

bool
util_buf_reserve(struct util_buf *b, size_t more)
{
	size_t cap;
	char *p;

	if (b->oom)
		return false;
	if (more < b->cap - b->len)
		return true;
	cap = b->cap == 0 ? 4096 : b->cap;
	while (more >= cap - b->len) {
		if (cap > SIZE_MAX / 2)
			goto oom;
		cap *= 2;
	}
	if ((p = rl_realloc(b->p, cap)) == NULL)
		goto oom;
	b->p = p;
	b->cap = cap;
	return true;

oom:
	b->oom = true;
	return false;
}

void
util_buf_add(struct util_buf *b, const char *s, size_t n)
{
	if (!util_buf_reserve(b, n))
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void
util_buf_puts(struct util_buf *b, const char *s)
{
	util_buf_add(b, s, strlen(s));
}

void
util_buf_printf(struct util_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!util_buf_reserve(b, 64))
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return; /* not for our formats; drop the piece */
	if ((size_t)n >= b->cap - b->len) {
		if (!util_buf_reserve(b, (size_t)n))
			return;
		va_start(ap, fmt);
		vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t)n;
}
