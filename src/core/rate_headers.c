/*
 * rate_headers.c - the RateLimit headers of a decision (see
 * rate_headers.h).  Rule names are at most RL_MAX_NAME_BYTES (config.c
 * refuses longer ones), so every value fits its fixed buffer; a value that
 * did not would be cut, never overrun.
 */
#include "core/rate_headers.h"

#include "base/util.h"

/* One header's value, built piece by piece: printf costs more than the
 * rest of an answer (docs/http.md), and the numbers are all it formats. */
struct value {
	char *p;
	size_t n;
};

static void
put_s(struct value *v, const char *s)
{
	v->n += util_strlcpy(v->p + v->n, s, RATE_HEADER_VALUE_MAX - v->n);
	if (v->n >= RATE_HEADER_VALUE_MAX)
		v->n = RATE_HEADER_VALUE_MAX - 1; /* cut, never overrun */
}

static void
put_i(struct value *v, long long i)
{
	char num[UTIL_INT64_DEC_MAX + 1];

	num[util_fmt_int64(num, (int64_t)i)] = '\0';
	put_s(v, num);
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

/* "name";q=LIMIT */
static void
put_rule(struct value *v, const char *name, const char *key, long long i)
{
	put_s(v, "\"");
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
		put_s(&v, ";qu=\"concurrent-requests\"");
		v = start(h, &n, "RateLimit");
		put_rule(&v, d->rule->name, "\";r=", (long long)d->remaining);
	} else {
		v = start(h, &n, "RateLimit-Policy");
		put_rule(&v, d->rule->name, "\";q=", (long long)d->limit);
		put_s(&v, ";w=");
		put_i(&v,
		    (long long)util_ceil_div(d->window_ms > 0 ?
			    d->window_ms :
			    d->rule->window_ms,
			1000));
		/* t: the effective window (docs/http.md), never later than
		 * a denial's Retry-After. */
		v = start(h, &n, "RateLimit");
		put_rule(&v, d->rule->name, "\";r=", (long long)d->remaining);
		put_s(&v, ";t=");
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
