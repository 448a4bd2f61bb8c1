/*
 * rate_headers.c - the RateLimit headers of a decision (see
 * rate_headers.h).  Rule names are at most RL_MAX_NAME_BYTES (config.c
 * refuses longer ones), so every value fits its fixed buffer; a value that
 * did not would be cut, never overrun.
 */
#include "core/rate_headers.h"

#include <stdarg.h>
#include <stdio.h>

#include "base/util.h"

static void __attribute__((format(printf, 4, 5)))
add(struct rate_header *h, int *n, const char *name, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(h[*n].value, sizeof(h[*n].value), fmt, ap);
	va_end(ap);
	h[*n].name = name;
	(*n)++;
}

int
rate_headers(const struct decision *d, struct rate_header h[RATE_HEADERS_MAX])
{
	long long reset_s = util_ceil_div(d->reset_ms, 1000);
	long long ra = util_ceil_div(d->retry_after_ms, 1000);
	int n = 0;

	if (d->rule == NULL)
		return 0;
	if (d->rule->algorithm == RL_ALG_CONCURRENCY) {
		/* Units held at once: no window, and no time within which
		 * the quota comes back (a release frees it). */
		add(h, &n, "RateLimit-Policy",
		    "\"%s\";q=%lld;qu=\"concurrent-requests\"", d->rule->name,
		    (long long)d->limit);
		add(h, &n, "RateLimit", "\"%s\";r=%lld", d->rule->name,
		    (long long)d->remaining);
	} else {
		add(h, &n, "RateLimit-Policy", "\"%s\";q=%lld;w=%lld",
		    d->rule->name, (long long)d->limit,
		    (long long)util_ceil_div(d->window_ms > 0 ?
			    d->window_ms :
			    d->rule->window_ms,
			1000));
		/* t: the effective window (docs/http.md), never later than
		 * a denial's Retry-After. */
		add(h, &n, "RateLimit", "\"%s\";r=%lld;t=%lld", d->rule->name,
		    (long long)d->remaining,
		    (long long)util_ceil_div(d->effective_ms, 1000));
	}
	add(h, &n, "X-RateLimit-Limit", "%lld", (long long)d->limit);
	add(h, &n, "X-RateLimit-Remaining", "%lld", (long long)d->remaining);
	add(h, &n, "X-RateLimit-Reset", "%lld", reset_s);
	if (!d->allowed)
		add(h, &n, "Retry-After", "%lld", ra < 1 ? 1 : ra);
	return n;
}
