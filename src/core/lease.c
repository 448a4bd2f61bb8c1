/*
 * lease.c - lease strings and tokens (see lease.h).  The format is checked
 * strictly on the way in, so /release and /renew answer 400 invalid_lease
 * for anything a daemon did not hand out, before any store is asked.
 */
#include "core/lease.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/util.h"

static const char hexdig[] = "0123456789abcdef";

int
lease_token_new(char out[LEASE_TOKEN_LEN + 1])
{
	unsigned char raw[LEASE_TOKEN_LEN / 2];
	size_t got = 0, i;
	ssize_t n;

	while (got < sizeof(raw)) {
		n = getrandom(raw + got, sizeof(raw) - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	for (i = 0; i < sizeof(raw); i++) {
		out[2 * i] = hexdig[raw[i] >> 4];
		out[2 * i + 1] = hexdig[raw[i] & 15];
	}
	out[LEASE_TOKEN_LEN] = '\0';
	return 0;
}

char *
lease_format(const char *suffix, size_t len, int64_t cost, const char *token)
{
	size_t cap = 2 * len + 1 + 24 + 1 + LEASE_TOKEN_LEN + 1, i;
	char *s, *p;

	if ((s = rl_malloc(cap)) == NULL)
		return NULL;
	for (i = 0, p = s; i < len; i++) {
		*p++ = hexdig[(unsigned char)suffix[i] >> 4];
		*p++ = hexdig[(unsigned char)suffix[i] & 15];
	}
	snprintf(p, cap - (size_t)(p - s), ".%lld.%.*s", (long long)cost,
	    LEASE_TOKEN_LEN, token);
	return s;
}

static int
hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int
lease_parse(const char *s, size_t len, struct lease_ref *out)
{
	const char *dot1, *dot2, *end = s + len, *p;
	size_t hexlen, i, namelen;
	int64_t cost = 0;

	memset(out, 0, sizeof(*out));
	if ((dot1 = memchr(s, '.', len)) == NULL ||
	    (dot2 = memchr(dot1 + 1, '.', (size_t)(end - dot1 - 1))) == NULL)
		return -1;
	hexlen = (size_t)(dot1 - s);
	if (hexlen == 0 || hexlen % 2 != 0 || hexlen / 2 > LEASE_SUFFIX_MAX)
		return -1;
	for (i = 0; i < hexlen / 2; i++) {
		int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -1;
		out->suffix[i] = (char)(hi << 4 | lo);
	}
	out->suffix_len = hexlen / 2;
	/* "<rule>:{<key>}" with a valid rule name */
	if ((p = memchr(out->suffix, ':', out->suffix_len)) == NULL)
		return -1;
	namelen = (size_t)(p - out->suffix);
	if (namelen == 0 || namelen > LEASE_RULE_MAX ||
	    out->suffix_len < namelen + 3 || p[1] != '{' ||
	    out->suffix[out->suffix_len - 1] != '}' ||
	    memchr(out->suffix, '\0', out->suffix_len) != NULL)
		return -1;
	memcpy(out->rule, out->suffix, namelen);
	out->rule[namelen] = '\0';
	if (!rule_name_is_valid(out->rule))
		return -1;
	/* cost: 1 .. 2^53, decimal without a sign or leading zero */
	if (dot2 == dot1 + 1 || dot1[1] == '0' || dot2 - dot1 - 1 > 16)
		return -1;
	for (p = dot1 + 1; p < dot2; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		cost = cost * 10 + (*p - '0');
	}
	if (cost < 1 || cost > LIMITER_MAX_LIMIT)
		return -1;
	out->cost = cost;
	if (end - dot2 - 1 != LEASE_TOKEN_LEN)
		return -1;
	for (p = dot2 + 1; p < end; p++)
		if (hexval(*p) < 0)
			return -1;
	memcpy(out->token, dot2 + 1, LEASE_TOKEN_LEN);
	return 0;
}

uint64_t
lease_key_hash(const char *key, size_t len)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	size_t i;

	for (i = 0; i < len; i++) {
		h ^= (unsigned char)key[i];
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}

void
lease_check_make(struct rl_check *c, char *buf, const char *prefix,
    const struct lease_ref *ref, int64_t limit, int64_t window_ms)
{
	size_t plen = strlen(prefix);

	memcpy(buf, prefix, plen);
	memcpy(buf + plen, ref->suffix, ref->suffix_len);
	buf[plen + ref->suffix_len] = '\0';
	memcpy(buf + plen + ref->suffix_len + 1, ref->token,
	    LEASE_TOKEN_LEN + 1);
	*c = (struct rl_check){
		.algorithm = RL_ALG_CONCURRENCY,
		.limit = limit > ref->cost ? limit : ref->cost,
		.window_ms = window_ms,
		.cost = ref->cost,
		.key = buf,
		.keylen = plen + ref->suffix_len,
		.token = buf + plen + ref->suffix_len + 1,
	};
}
