/*
 * util.h - small helpers shared by every module: the allocation wrapper,
 * duration parsing, bounded string copies and clocks.
 *
 * Allocation goes through rl_malloc() and friends so that unit tests can
 * make the n-th allocation fail (rl_alloc_fail_after) and check the error
 * paths.  None of these functions keeps state besides that test hook.
 */
#ifndef RL_UTIL_H
#define RL_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* malloc/calloc/realloc/strdup that return NULL on failure (never abort).
 * rl_free(NULL) does nothing.  Any thread. */
void *rl_malloc(size_t n);
void *rl_calloc(size_t n, size_t size);
void *rl_realloc(void *p, size_t n);
char *rl_strdup(const char *s);
char *rl_strndup(const char *s, size_t n);
void rl_free(void *p);

/* Test hook: after `n` more successful allocations, every allocation fails.
 * n < 0 switches the failure off (the default). */
void rl_alloc_fail_after(long n);

/* Parse a duration: a non-negative integer followed by ms, s, m, h or d
 * ("250ms", "10s", "1m", "1h", "1d").  Stores milliseconds in *out_ms.
 * Returns 0, or -1 for anything else (empty, no unit, overflow). */
int util_parse_duration_ms(const char *s, int64_t *out_ms);

/* Parse a whole decimal integer (optional leading '-') into *out.
 * Returns 0, or -1 if s is not entirely an integer or overflows. */
int util_parse_int64(const char *s, int64_t *out);

/* Copy at most dstlen-1 bytes of src and NUL-terminate; returns strlen(src)
 * like OpenBSD strlcpy, so a result >= dstlen means truncation. */
size_t util_strlcpy(char *dst, const char *src, size_t dstlen);

/* How many freed objects a cache of them keeps: n, and none under
 * AddressSanitizer, which then sees each object's life.  The caches (HTTP
 * records, decision jobs, Redis batches and replies) spare glibc the
 * merging it does before each malloc of 1 KiB or more
 * (docs/operations.md). */
#if defined(__SANITIZE_ADDRESS__)
#define UTIL_KEEP(n) ((size_t)0)
#else
#define UTIL_KEEP(n) ((size_t)(n))
#endif

/* v in decimal at dst, which has room for UTIL_INT64_DEC_MAX bytes; no
 * NUL.  Returns the length.  What an answer's numbers are written with on
 * every request (docs/http.md), where printf's generality costs more than
 * the rest of the rendering.  Any thread. */
#define UTIL_INT64_DEC_MAX 20
size_t util_fmt_int64(char *dst, int64_t v);

/* The value of the hex digit ch (either case), or -1 when it is none.
 * Any thread. */
int util_hex_value(int ch);

/* The length of the valid UTF-8 sequence at s (1-4), or 0 if there is
 * none (an overlong form, a surrogate or a code point past U+10FFFF is
 * none).  Reads no further than a NUL.  JSON holds nothing else, so what
 * quotes a client's bytes in JSON (an answer, a log line) checks with it.
 * Any thread. */
size_t util_utf8_len(const unsigned char *s);
/* Is the C string s valid UTF-8 throughout? */
bool util_utf8_valid(const char *s);
/* src (a C string) into dst (room for 3 * strlen(src) + 1 bytes) as valid
 * UTF-8: each byte that starts no valid sequence becomes U+FFFD. */
void util_utf8_clean(char *dst, const char *src);

/* s into buf (buflen >= 4 bytes) for a one-line message: '"', '\\' and
 * control bytes escaped (\", \\, \xNN), and cut short with "..." where the
 * rest would not fit; always NUL-terminated.  A value a config error
 * quotes goes through it, so that every error stays one line.  Returns
 * buf.  Any thread. */
const char *util_escape(char *buf, size_t buflen, const char *s);

/* CLOCK_MONOTONIC and CLOCK_REALTIME in microseconds.  Any thread. */
int64_t util_monotonic_us(void);

/* A one-shot event for a thread that waits for another's completion:
 * util_event_init, then util_event_set (any thread, once), util_event_wait
 * (returns once set), util_event_destroy. */
struct util_event {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool set;
};
void util_event_init(struct util_event *e);
void util_event_set(struct util_event *e);
void util_event_wait(struct util_event *e);
void util_event_destroy(struct util_event *e);

/* FNV-1a, 64 bits, of len bytes: for tables whose keys have no adversary
 * worth a keyed hash, or whose size bounds what one can do. */
static inline uint64_t
util_fnv1a(const void *p, size_t len)
{
	const unsigned char *b = p;
	uint64_t h = UINT64_C(0xcbf29ce484222325);

	while (len-- > 0) {
		h ^= *b++;
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}
int64_t util_realtime_us(void);

/* Ceiling division for non-negative a and positive b (a <= 0 gives 0),
 * without the overflow of a + b - 1 near INT64_MAX. */
static inline int64_t
util_ceil_div(int64_t a, int64_t b)
{
	return a <= 0 ? 0 : a / b + (a % b != 0);
}

/*
 * A growing text buffer: p holds len bytes and a NUL (p is NULL while
 * nothing was added); after an allocation fails, oom is set and every
 * later append does nothing, so a writer checks once, at the end.  The
 * owner frees p with rl_free().  Zero-initialise it.  One thread at a
 * time.
 */
struct util_buf {
	char *p;
	size_t len, cap;
	bool oom;
};

/* Room for `more` bytes plus the NUL; false on OOM. */
bool util_buf_reserve(struct util_buf *b, size_t more);
void util_buf_add(struct util_buf *b, const char *s, size_t n);
void util_buf_puts(struct util_buf *b, const char *s);
void util_buf_printf(struct util_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
