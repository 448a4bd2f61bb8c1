/*
 * rate_headers.c - the RateLimit headers of a decision (see
 * rate_headers.h).  Rule names are at most RL_MAX_NAME_BYTES (config.c
 * refuses longer ones), so every value fits its fixed buffer; a value that
 * did not would be cut, never overrun.
 */
#include "core/rate_headers.h"

#include <string.h>

#include "base/util.h"

/* One header's value, built piece by piece: printf costs more than the
 * rest of an answer (docs/http.md), and the numbers are all it formats. */
struct value {
	char *p;
	size_t n;
};

/* Append the len bytes at s; a value that would not fit is cut, never
 * overrun. */
static void
put_n(struct value *v, const char *s, size_t len)
{
	if (len > RATE_HEADER_VALUE_MAX - 1 - v->n)
		len = RATE_HEADER_VALUE_MAX - 1 - v->n;
	memcpy(v->p + v->n, s, len);
	v->n += len;
	v->p[v->n] = '\0';
}

static void
put_s(struct value *v, const char *s)
{
	put_n(v, s, strlen(s));
}

/* A string literal, its length known when compiled. */
#define PUT_LIT(v, lit) put_n((v), (lit), sizeof(lit) - 1)

static void
put_i(struct value *v, long long i)
{
	char num[UTIL_INT64_DEC_MAX];

	if (RATE_HEADER_VALUE_MAX - 1 - v->n >= UTIL_INT64_DEC_MAX) {
		v->n += util_fmt_int64(v->p + v->n, (int64_t)i);
		v->p[v->n] = '\0';
	} else {
		put_n(v, num, util_fmt_int64(num, (int64_t)i));
	}
}

/* Start header n named name: its value, empty. */
static struct value
start(struct rate_header *h, int *n, const char *name)
{
	struct value v = { h[*n].value, 0 };

	h[*n].name = name;
	h[*n].value[0] = '\0';
	(*n)++;
	return v;
}

/* "name";q=LIMIT (key: the '";q=' between) */
static void
put_rule(struct value *v, const char *name, const char *key, long long i)
{
	PUT_LIT(v, "\"");
	put_s(v, name);
	put_s(v, key);
	put_i(v, i);
}

/* A time of d from now, when the answer goes out: d's times are as of the
 * decision, and an answer that waited for its turn goes out waited_ms
 * later (docs/waiting.md). */
static int64_t
from_now(const struct decision *d, int64_t ms)
{
	if (d->waited_ms <= 0)
		return ms;
	return ms > d->waited_ms ? ms - d->waited_ms : 0;
}

int
rate_headers(const struct decision *d, struct rate_header h[RATE_HEADERS_MAX])
{
	long long reset_s = util_ceil_div(from_now(d, d->reset_ms), 1000);
	long long ra = util_ceil_div(d->retry_after_ms, 1000);
	struct value v;
	int n = 0;

	if (d->rule == NULL)
		return 0;
	if (d->rule->algorithm == RL_ALG_CONCURRENCY) {
		/* Units held at once: no window, and no time within which
		 * the quota comes back (a release frees it). */
		v = start(h, &n, "RateLimit-Policy");
		put_rule(&v, d->rule->name, "\";q=", (long long)d->limit);
		PUT_LIT(&v, ";qu=\"concurrent-requests\"");
		v = start(h, &n, "RateLimit");
		put_rule(&v, d->rule->name, "\";r=", (long long)d->remaining);
	} else {
		v = start(h, &n, "RateLimit-Policy");
		put_rule(&v, d->rule->name, "\";q=", (long long)d->limit);
		PUT_LIT(&v, ";w=");
		put_i(&v,
		    (long long)util_ceil_div(d->window_ms > 0 ?
			    d->window_ms :
			    d->rule->window_ms,
			1000));
		/* t: the effective window (docs/http.md), never later than
		 * a denial's Retry-After. */
		v = start(h, &n, "RateLimit");
		put_rule(&v, d->rule->name, "\";r=", (long long)d->remaining);
		PUT_LIT(&v, ";t=");
		put_i(&v,
		    (long long)util_ceil_div(from_now(d, d->effective_ms),
			1000));
	}
	v = start(h, &n, "X-RateLimit-Limit");
	put_i(&v, (long long)d->limit);
	v = start(h, &n, "X-RateLimit-Remaining");
	put_i(&v, (long long)d->remaining);
	v = start(h, &n, "X-RateLimit-Reset");
	put_i(&v, reset_s);
	if (!d->allowed) {
		v = start(h, &n, "Retry-After");
		put_i(&v, ra < 1 ? 1 : ra);
	}
	return n;
}
