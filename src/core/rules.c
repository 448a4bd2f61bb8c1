/*
 * rules.c - attributes, match patterns and key templates: the pure part of
 * rule evaluation (see rules.h).  Everything here is compiled once when a
 * config is loaded and only read afterwards, so the per-request work is a
 * few string comparisons and one bounded copy per rule.
 */
#include "core/rules.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

/* A pattern or template quoted in a message: its first 64 bytes (escaped,
 * so that the message stays one line), then "...". */
#define SRC_QUOTE_MAX 70

/* --- attributes ------------------------------------------------------- */

static uint32_t
attrs_hash(const char *s)
{
	return (uint32_t)util_fnv1a(s, strlen(s));
}

/* The position of name, or a->n when absent. */
static size_t
attrs_find(const struct attrs *a, const char *name, uint32_t h)
{
	size_t i, k;

	if (a->idx == NULL) {
		for (i = 0; i < a->n; i++)
			if (a->v[i].hash == h &&
			    strcmp(a->v[i].name, name) == 0)
				return i;
		return a->n;
	}
	for (k = h & (a->idx_cap - 1); a->idx[k] != 0;
	     k = (k + 1) & (a->idx_cap - 1)) {
		i = a->idx[k] - 1;
		if (a->v[i].hash == h && strcmp(a->v[i].name, name) == 0)
			return i;
	}
	return a->n;
}

/* Make the index hold the n entries with room to spare.  0 or -1. */
static int
attrs_reindex(struct attrs *a, size_t want)
{
	size_t cap = 16, i, k;
	uint32_t *idx;

	while (cap < 2 * want)
		cap *= 2;
	if (cap <= a->idx_cap)
		return 0;
	if ((idx = rl_calloc(cap, sizeof(*idx))) == NULL)
		return -1;
	for (i = 0; i < a->n; i++) {
		for (k = a->v[i].hash & (cap - 1); idx[k] != 0;
		     k = (k + 1) & (cap - 1))
			;
		idx[k] = (uint32_t)(i + 1);
	}
	rl_free(a->idx);
	a->idx = idx;
	a->idx_cap = cap;
	return 0;
}

/* name and value in one block, "name\0value\0": one allocation per
 * attribute, freed through its name. */
static char *
attr_block(const char *name, size_t namelen, const char *value, size_t valuelen)
{
	char *b;

	if (namelen > SIZE_MAX - 2 - valuelen ||
	    (b = rl_malloc(namelen + valuelen + 2)) == NULL)
		return NULL;
	memcpy(b, name, namelen + 1);
	memcpy(b + namelen + 1, value, valuelen);
	b[namelen + 1 + valuelen] = '\0';
	return b;
}

int
attrs_setn(struct attrs *a, const char *name, const char *value,
    size_t valuelen)
{
	uint32_t h = attrs_hash(name);
	size_t namelen = strlen(name), i, k;
	char *b;

	/* Made first: value may point into the block it replaces. */
	if ((b = attr_block(name, namelen, value, valuelen)) == NULL)
		return -1;
	if ((i = attrs_find(a, name, h)) < a->n) {
		rl_free(a->v[i].name);
		a->v[i].name = b;
		a->v[i].value = b + namelen + 1;
		return 0;
	}
	if (a->n == a->cap) {
		size_t cap = a->cap == 0 ? 16 : a->cap * 2;
		struct attr *nv = rl_realloc(a->v, cap * sizeof(*nv));

		if (nv == NULL)
			goto fail;
		a->v = nv;
		a->cap = cap;
	}
	if (a->n + 1 > ATTRS_SCAN && attrs_reindex(a, a->n + 1) == -1)
		goto fail;
	a->v[a->n].name = b;
	a->v[a->n].hash = h;
	a->v[a->n].value = b + namelen + 1;
	if (a->idx != NULL) {
		for (k = h & (a->idx_cap - 1); a->idx[k] != 0;
		     k = (k + 1) & (a->idx_cap - 1))
			;
		a->idx[k] = (uint32_t)(a->n + 1);
	}
	a->n++;
	return 0;

fail:
	rl_free(b);
	return -1;
}

int
attrs_set(struct attrs *a, const char *name, const char *value)
{
	return attrs_setn(a, name, value, strlen(value));
}

const char *
attrs_get(const struct attrs *a, const char *name)
{
	size_t i = attrs_find(a, name, attrs_hash(name));

	return i < a->n ? a->v[i].value : NULL;
}

void
attrs_clear(struct attrs *a)
{
	size_t i;

	for (i = 0; i < a->n; i++)
		rl_free(a->v[i].name); /* and the value: one block */
	rl_free(a->v);
	rl_free(a->idx);
	a->v = NULL;
	a->idx = NULL;
	a->n = a->cap = a->idx_cap = 0;
}

/* --- patterns --------------------------------------------------------- */

/*
 * Iterative glob with one backtrack point: on a mismatch after a '*', the
 * star absorbs one more byte.  Linear-ish, no recursion, no allocation.
 */
bool
glob_match(const char *pat, const char *s)
{
	const char *star = NULL, *resume = NULL;

	while (*s != '\0') {
		if (*pat == '*') {
			star = ++pat;
			resume = s;
		} else if (*pat == '?' || *pat == *s) {
			pat++;
			s++;
		} else if (star != NULL) {
			pat = star;
			s = ++resume;
		} else
			return false;
	}
	while (*pat == '*')
		pat++;
	return *pat == '\0';
}

/*
 * An upper bound on the work regcomp() does for the ERE src: every atom
 * counts 1, a group the sum of its parts (alternatives included), and a
 * repetition multiplies what it repeats (`{m,n}` by n, `{m,}` by m + 1,
 * `*` `+` `?` by 2), as glibc copies the atom that many times:
 * `a{1000}{1000}{1000}` is 1e9, gigabytes and minutes.  Loops inside loops
 * cost glibc more than their size (its epsilon closures grow with the
 * nesting: `a*++++++++++++` alone takes minutes), so more than
 * REGEX_STACK_MAX repetitions of one atom, or loops nested deeper than
 * REGEX_NEST_MAX, count as too large too.  So do more than
 * REGEX_OPTIONAL_MAX optional copies once expanded (`?`, `*` and `+` make
 * one of what they repeat, `{m,n}` n - m, `{m,}` one, each as large as
 * what it repeats, and a copy of something holding optional ones holds
 * them too): glibc's memory grows with the square of a run of them,
 * 10 MB for `a{0,1000}`, 800 MB for `((a?){100}){100}` (found by
 * fuzzing: `a{,15666}` took over 2 GB).  Saturates at REGEX_COST_MAX + 1.
 * Returns -1 for a back-reference (`\1`), which makes matching exponential
 * in the value's length.
 */
#define REGEX_COST_MAX	   20000
#define REGEX_OPTIONAL_MAX 500
#define REGEX_DEPTH_MAX	   32
#define REGEX_STACK_MAX	   2
#define REGEX_NEST_MAX	   3

static double
regex_cost(const char *src)
{
	double cur[REGEX_DEPTH_MAX + 1], opt[REGEX_DEPTH_MAX + 1],
	    last = 0, last_opt = 0, k, optional, grown, m, n;
	int nest[REGEX_DEPTH_MAX + 1], last_nest = 0, stacked = 0, depth = 0;
	const char *p = src, *q;

	cur[0] = opt[0] = 0;
	nest[0] = 0;
	while (*p != '\0') {
		switch (*p) {
		case '\\':
			if (p[1] >= '1' && p[1] <= '9')
				return -1; /* a back-reference */
			p += p[1] != '\0' ? 2 : 1;
			goto atom;
		case '[':
			q = p + 1;
			if (*q == '^')
				q++;
			if (*q == ']')
				q++;
			while (*q != '\0' && *q != ']')
				q++;
			p = *q == ']' ? q + 1 : q;
			goto atom;
		case '(':
			if (depth == REGEX_DEPTH_MAX)
				return REGEX_COST_MAX + 1;
			depth++;
			cur[depth] = opt[depth] = 0;
			nest[depth] = 0;
			last = last_opt = 0;
			last_nest = 0;
			stacked = 0;
			p++;
			continue;
		case ')':
			if (depth > 0) {
				last = cur[depth];
				last_opt = opt[depth];
				last_nest = nest[depth];
				depth--;
				cur[depth] += last;
				opt[depth] += last_opt;
			}
			stacked = 0;
			p++;
			continue;
		case '*':
		case '+':
		case '?':
			k = 2;
			optional = 1;
			p++;
			break;
		case '{':
			m = n = 0;
			for (q = p + 1; *q >= '0' && *q <= '9'; q++)
				m = m * 10 + (*q - '0');
			optional = 0;
			if (*q == ',') {
				for (q++; *q >= '0' && *q <= '9'; q++)
					n = n * 10 + (*q - '0');
				if (n == 0) {
					n = m + 1;
					optional = 1;
				} else if (n > m)
					optional = n - m;
			} else
				n = m;
			if (*q != '}') { /* a literal '{' */
				p++;
				goto atom;
			}
			k = n < 1 ? 1 : n;
			p = q + 1;
			break;
		default:
			p++;
			goto atom;
		}
		/* A repetition of the last atom. */
		if (++stacked > REGEX_STACK_MAX || ++last_nest > REGEX_NEST_MAX)
			return REGEX_COST_MAX + 1;
		if (last_nest > nest[depth])
			nest[depth] = last_nest;
		cur[depth] += last * (k - 1);
		grown = k * last_opt + optional * last;
		opt[depth] += grown - last_opt;
		last_opt = grown;
		last *= k;
		if (cur[depth] > REGEX_COST_MAX ||
		    opt[depth] > REGEX_OPTIONAL_MAX)
			return REGEX_COST_MAX + 1;
		continue;
atom:
		last = 1;
		last_opt = 0;
		last_nest = 0;
		stacked = 0;
		cur[depth] += 1;
	}
	while (depth > 0) {
		cur[depth - 1] += cur[depth];
		opt[depth - 1] += opt[depth];
		depth--;
	}
	return opt[0] > REGEX_OPTIONAL_MAX ? REGEX_COST_MAX + 1 : cur[0];
}

int
pattern_compile(struct pattern *p, const char *src, char *err, size_t errlen)
{
	char q[SRC_QUOTE_MAX];
	double cost;
	int rc;

	memset(p, 0, sizeof(*p));
	if (src[0] == '~') {
		p->kind = PATTERN_REGEX;
		src++;
	} else if (strpbrk(src, "*?") != NULL)
		p->kind = PATTERN_GLOB;
	else
		p->kind = PATTERN_EXACT;
	if ((p->text = rl_strdup(src)) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (p->kind != PATTERN_REGEX)
		return 0;
	if ((cost = regex_cost(src)) < 0) {
		snprintf(err, errlen,
		    "regex \"%s\": back-references are not allowed",
		    util_escape(q, sizeof(q), src));
		rl_free(p->text);
		p->text = NULL;
		return -1;
	}
	if (cost > REGEX_COST_MAX) {
		snprintf(err, errlen,
		    "regex \"%s\" is too large once its "
		    "repetitions are expanded (more than %d states, or "
		    "%d optional ones)",
		    util_escape(q, sizeof(q), src), REGEX_COST_MAX,
		    REGEX_OPTIONAL_MAX);
		rl_free(p->text);
		p->text = NULL;
		return -1;
	}
	if ((rc = regcomp(&p->re, src, REG_EXTENDED | REG_NOSUB)) != 0) {
		char msg[128];

		regerror(rc, &p->re, msg, sizeof(msg));
		snprintf(err, errlen, "bad regex \"%s\": %s",
		    util_escape(q, sizeof(q), src), msg);
		rl_free(p->text);
		p->text = NULL;
		return -1;
	}
	return 0;
}

bool
pattern_matches(const struct pattern *p, const char *value)
{
	switch (p->kind) {
	case PATTERN_EXACT:
		return strcmp(p->text, value) == 0;
	case PATTERN_GLOB:
		return glob_match(p->text, value);
	case PATTERN_REGEX:
		return regexec(&p->re, value, 0, NULL, 0) == 0;
	}
	return false;
}

void
pattern_free(struct pattern *p)
{
	if (p->text != NULL && p->kind == PATTERN_REGEX)
		regfree(&p->re);
	rl_free(p->text);
	p->text = NULL;
}

/* --- key templates ---------------------------------------------------- */

static bool
is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

static int
template_add(struct key_template *t, bool is_attr, const char *text, size_t len)
{
	struct template_part *np;

	np = rl_realloc(t->parts, (t->nparts + 1) * sizeof(*np));
	if (np == NULL)
		return -1;
	t->parts = np;
	if ((np[t->nparts].text = rl_strndup(text, len)) == NULL)
		return -1;
	np[t->nparts].is_attr = is_attr;
	np[t->nparts].len = len;
	t->nparts++;
	return 0;
}

int
template_compile(struct key_template *t, const char *src, char *err,
    size_t errlen)
{
	const char *p = src, *lit = src;
	char q[SRC_QUOTE_MAX];

	memset(t, 0, sizeof(*t));
	if ((t->source = rl_strdup(src)) == NULL)
		goto oom;
	while (*p != '\0') {
		const char *name, *end;

		if (p[0] != '$' || (p[1] != '{' && p[1] != '$')) {
			p++;
			continue;
		}
		/* Flush the literal before "$$" (keeping one '$') or "${". */
		if (p[1] == '$') {
			if (template_add(t, false, lit, (size_t)(p - lit) + 1))
				goto oom;
			lit = p += 2;
			continue;
		}
		if (p > lit && template_add(t, false, lit, (size_t)(p - lit)))
			goto oom;
		name = p + 2;
		for (end = name; is_name_char(*end); end++)
			;
		if (*end != '}') {
			snprintf(err, errlen,
			    *end == '\0' ?
				"key template \"%s\": unterminated \"${\"" :
				"key template \"%s\": bad attribute name",
			    util_escape(q, sizeof(q), src));
			goto fail;
		}
		if (end == name) {
			snprintf(err, errlen,
			    "key template \"%s\": empty attribute name",
			    util_escape(q, sizeof(q), src));
			goto fail;
		}
		if (template_add(t, true, name, (size_t)(end - name)))
			goto oom;
		lit = p = end + 1;
	}
	if (p > lit && template_add(t, false, lit, (size_t)(p - lit)))
		goto oom;
	return 0;

oom:
	snprintf(err, errlen, "out of memory");
fail:
	template_free(t);
	return -1;
}

void
template_free(struct key_template *t)
{
	size_t i;

	for (i = 0; i < t->nparts; i++)
		rl_free(t->parts[i].text);
	rl_free(t->parts);
	rl_free(t->source);
	memset(t, 0, sizeof(*t));
}

enum render_result
template_render(const struct key_template *t, const struct attrs *a, char *buf,
    size_t buflen, size_t *outlen)
{
	size_t off = 0, i;
	enum render_result rc = RENDER_OK;

	for (i = 0; i < t->nparts; i++) {
		const char *s = t->parts[i].text;
		size_t n = t->parts[i].len;

		if (t->parts[i].is_attr) {
			if ((s = attrs_get(a, s)) == NULL)
				return RENDER_MISSING;
			n = strlen(s);
		}
		/* Keep scanning after overflow: a missing attribute wins. */
		if (rc == RENDER_OK && off + n < buflen) {
			memcpy(buf + off, s, n);
			off += n;
		} else
			rc = RENDER_TOO_LONG;
	}
	if (buflen > 0)
		buf[off < buflen ? off : buflen - 1] = '\0';
	*outlen = off;
	return rc;
}

/* --- rules ------------------------------------------------------------ */

/* An attribute /auth sets (docs/http.md). */
static bool
auth_attr(const char *name, size_t len)
{
	static const char *const fixed[] = { "method", "path", "host", "ip" };
	size_t i;

	for (i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (strlen(fixed[i]) == len && memcmp(fixed[i], name, len) == 0)
			return true;
	return len > 7 && memcmp(name, "header.", 7) == 0;
}

bool
rule_could_match_auth(const struct rule *r)
{
	size_t i;

	for (i = 0; i < r->nmatch; i++)
		if (!auth_attr(r->match[i].attr, strlen(r->match[i].attr)))
			return false;
	for (i = 0; r->key != NULL && i < r->key->nparts; i++)
		if (r->key->parts[i].is_attr &&
		    !auth_attr(r->key->parts[i].text, r->key->parts[i].len))
			return false;
	return true;
}

static const char *const algorithm_names[] = {
	[RL_ALG_SLIDING_LOG] = "sliding_log",
	[RL_ALG_SLIDING_WINDOW] = "sliding_window",
	[RL_ALG_FIXED_WINDOW] = "fixed_window",
	[RL_ALG_TOKEN_BUCKET] = "token_bucket",
	[RL_ALG_CONCURRENCY] = "concurrency",
};

int
rl_algorithm_parse(const char *s, enum rl_algorithm *out)
{
	size_t i;

	for (i = 0; i < sizeof(algorithm_names) / sizeof(*algorithm_names);
	     i++) {
		if (strcmp(s, algorithm_names[i]) == 0) {
			*out = (enum rl_algorithm)i;
			return 0;
		}
	}
	return -1;
}

const char *
rl_algorithm_name(enum rl_algorithm alg)
{
	if ((unsigned)alg >= sizeof(algorithm_names) / sizeof(*algorithm_names))
		return "?";
	return algorithm_names[alg];
}

bool
rule_matches(const struct rule *r, const struct attrs *a)
{
	size_t i;

	for (i = 0; i < r->nmatch; i++) {
		const char *v = attrs_get(a, r->match[i].attr);

		if (v == NULL || !pattern_matches(&r->match[i].pattern, v))
			return false;
	}
	return true;
}

void
rule_free_contents(struct rule *r)
{
	size_t i;

	for (i = 0; i < r->nmatch; i++) {
		rl_free(r->match[i].attr);
		pattern_free(&r->match[i].pattern);
	}
	rl_free(r->match);
	if (r->key != NULL) {
		template_free(r->key);
		rl_free(r->key);
	}
	rl_free(r->name);
	memset(r, 0, sizeof(*r));
}

bool
rule_name_is_valid(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (!is_name_char(*s))
			return false;
	return true;
}
