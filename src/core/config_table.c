/*
 * config_table.c - the table engine of the YAML loader (config_table.h):
 * messages at a line and column, strict scalar conversions, the walk of a
 * mapping against a key table, and the key-by-key comparison and copy a
 * reload makes.  It knows nothing of ratelimitd's sections, whose tables live
 * in config.c, config_store.c, config_rules.c and config_stats.c.
 *
 * Conversions are strict on purpose, so that a typo never silently turns a
 * limit off: every scalar is taken as a string and converted here (a quoted
 * "5" is an integer, `yes` is not a boolean), durations must carry a unit,
 * and unknown or repeated keys are errors rather than being ignored.
 */
#include "core/config_table.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

/* --- messages ---------------------------------------------------------- */

static void seterr(struct loader *ld, size_t line, size_t col, const char *fmt,
    va_list ap) __attribute__((format(printf, 4, 0)));
static void errat(struct loader *ld, yaml_mark_t mark, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Write "NAME:LINE:COL: message" (1-based; line 0 means no position). */
static void
seterr(struct loader *ld, size_t line, size_t col, const char *fmt, va_list ap)
{
	int n;

	if (ld->err == NULL || ld->errlen == 0)
		return;
	if (line > 0)
		n = snprintf(ld->err, ld->errlen, "%s:%zu:%zu: ", ld->name,
		    line, col);
	else
		n = snprintf(ld->err, ld->errlen, "%s: ", ld->name);
	if (n >= 0 && (size_t)n < ld->errlen)
		vsnprintf(ld->err + n, ld->errlen - (size_t)n, fmt, ap);
}

/* An error at a libyaml mark (0-based line and column). */
static void
errat(struct loader *ld, yaml_mark_t mark, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	seterr(ld, mark.line + 1, mark.column + 1, fmt, ap);
	va_end(ap);
}

/* An error at the start of node n. */
void
cfg_errf(struct loader *ld, const yaml_node_t *n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	seterr(ld, n->start_mark.line + 1, n->start_mark.column + 1, fmt, ap);
	va_end(ap);
}

int
cfg_oom(struct loader *ld)
{
	if (ld->err != NULL && ld->errlen > 0)
		snprintf(ld->err, ld->errlen, "%s: out of memory", ld->name);
	return -1;
}

/*
 * s double-quoted for a one-line message: quotes, backslashes and control
 * bytes escaped, and cut short with "..." past QUOTE_MAX bytes.  Returns buf.
 */
const char *
cfg_quote(char buf[QUOTE_MAX], const char *s)
{
	size_t o;

	buf[0] = '"';
	util_escape(buf + 1, QUOTE_MAX - 2, s);
	o = 1 + strlen(buf + 1);
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

/* A duration in the largest unit that states it exactly: "366d", "1ms". */
static const char *
duration_text(char *buf, size_t size, int64_t ms)
{
	static const struct {
		const char *unit;
		int64_t ms;
	} units[] = {
		{ "d", DAY_MS },
		{ "h", 3600000 },
		{ "m", 60000 },
		{ "s", 1000 },
		{ "ms", 1 },
	};
	size_t i;

	for (i = 0; i < NELEM(units) - 1; i++)
		if (ms != 0 && ms % units[i].ms == 0)
			break;
	snprintf(buf, size, "%" PRId64 "%s", ms / units[i].ms, units[i].unit);
	return buf;
}

/* The parser's own message, at its position. */
void
cfg_yaml_error(struct loader *ld, const yaml_parser_t *p)
{
	yaml_mark_t mark = p->problem_mark;
	const char *problem = p->problem != NULL ? p->problem : "syntax error";
	size_t i;

	switch (p->error) {
	case YAML_MEMORY_ERROR:
		cfg_oom(ld);
		return;
	case YAML_READER_ERROR:
		/* Reader errors (bad UTF-8, control bytes) carry only an
		 * offset; count lines in the text to place them. */
		memset(&mark, 0, sizeof(mark));
		for (i = 0; i < p->problem_offset && i < ld->len; i++) {
			if (ld->text[i] == '\n') {
				mark.line++;
				mark.column = 0;
			} else {
				mark.column++;
			}
		}
		if (p->problem_value >= 0)
			errat(ld, mark, "%s (0x%02x)", problem,
			    (unsigned)p->problem_value);
		else
			errat(ld, mark, "%s", problem);
		return;
	default:
		if (p->context != NULL)
			errat(ld, mark, "%s (%s at line %zu)", problem,
			    p->context, p->context_mark.line + 1);
		else
			errat(ld, mark, "%s", problem);
		return;
	}
}

/* --- scalars ----------------------------------------------------------- */

/* True for an absent value: a plain "", "~" or "null". */
bool
cfg_is_null(const yaml_node_t *v)
{
	const char *s;

	if (v->type != YAML_SCALAR_NODE ||
	    v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return false;
	s = (const char *)v->data.scalar.value;
	return strcmp(s, "") == 0 || strcmp(s, "~") == 0 ||
	    strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
	    strcmp(s, "NULL") == 0;
}

/*
 * The text of a scalar value, or NULL after the error "WHAT: expected
 * EXPECT" (a mapping, a sequence or nothing where a value belongs).
 */
const char *
cfg_scalar(struct loader *ld, const char *what, yaml_node_t *v,
    const char *expect)
{
	const char *s = (const char *)v->data.scalar.value;

	if (v->type != YAML_SCALAR_NODE || cfg_is_null(v)) {
		cfg_errf(ld, v, "%s: expected %s", what, expect);
		return NULL;
	}
	if (strlen(s) != v->data.scalar.length) {
		cfg_errf(ld, v, "%s: contains a NUL byte", what);
		return NULL;
	}
	return s;
}

/* The text of mapping key k, or NULL after an error.  where: as in struct
 * schema. */
const char *
cfg_key_name(struct loader *ld, yaml_node_t *k, const char *where)
{
	if (k->type != YAML_SCALAR_NODE || cfg_is_null(k) ||
	    strlen((const char *)k->data.scalar.value) !=
		k->data.scalar.length) {
		cfg_errf(ld, k, "expected a key name%s%s", where ? " in " : "",
		    where ? where : "");
		return NULL;
	}
	return (const char *)k->data.scalar.value;
}

int
cfg_parse_string(struct loader *ld, const char *what, yaml_node_t *v,
    bool empty_ok, char **dst)
{
	const char *s;
	char *copy;

	if ((s = cfg_scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (!empty_ok && *s == '\0') {
		cfg_errf(ld, v, "%s: must not be empty", what);
		return -1;
	}
	if ((copy = rl_strdup(s)) == NULL)
		return cfg_oom(ld);
	rl_free(*dst);
	*dst = copy;
	return 0;
}

static int
parse_int(struct loader *ld, const char *what, yaml_node_t *v, int64_t min,
    int64_t max, int64_t *out)
{
	char expect[80];
	const char *s;
	int64_t n;

	if (max == INT64_MAX)
		snprintf(expect, sizeof(expect),
		    "an integer of at least %" PRId64, min);
	else
		snprintf(expect, sizeof(expect),
		    "an integer from %" PRId64 " to %" PRId64, min, max);
	if ((s = cfg_scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (util_parse_int64(s, &n) != 0 || n < min || n > max) {
		cfg_errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	*out = n;
	return 0;
}

static int
parse_duration(struct loader *ld, const char *what, yaml_node_t *v, int64_t min,
    int64_t max, int64_t *out)
{
	static const char expect[] =
	    "a duration such as 250ms, 10s, 1m, 1h or 1d";
	char q[QUOTE_MAX], lo[32], hi[32];
	const char *s;
	int64_t n;

	if ((s = cfg_scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (util_parse_int64(s, &n) == 0) {
		cfg_errf(ld, v,
		    "%s: %s has no unit; add one of ms, s, m, h or "
		    "d (e.g. %ss)",
		    what, cfg_quote(q, s), s);
		return -1;
	}
	if (util_parse_duration_ms(s, &n) != 0) {
		cfg_errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	if (n < min || n > max) {
		duration_text(lo, sizeof(lo), min);
		duration_text(hi, sizeof(hi), max);
		if (max == INT64_MAX)
			cfg_errf(ld, v,
			    "%s: expected a duration of at least "
			    "%s",
			    what, lo);
		else
			cfg_errf(ld, v, "%s: expected a duration from %s to %s",
			    what, lo, hi);
		return -1;
	}
	*out = n;
	return 0;
}

static int
parse_bool(struct loader *ld, const char *what, yaml_node_t *v, bool *out)
{
	const char *s;

	if ((s = cfg_scalar(ld, what, v, "true or false")) == NULL)
		return -1;
	if (strcmp(s, "true") == 0)
		*out = true;
	else if (strcmp(s, "false") == 0)
		*out = false;
	else {
		cfg_errf(ld, v, "%s: expected true or false", what);
		return -1;
	}
	return 0;
}

/* Index of v in names[], or -1 after "WHAT: expected EXPECT". */
int
cfg_parse_enum(struct loader *ld, const char *what, yaml_node_t *v,
    const char *const *names, size_t n, const char *expect)
{
	const char *s;
	size_t i;

	if ((s = cfg_scalar(ld, what, v, expect)) == NULL)
		return -1;
	for (i = 0; i < n; i++)
		if (strcmp(s, names[i]) == 0)
			return (int)i;
	cfg_errf(ld, v, "%s: expected %s", what, expect);
	return -1;
}

/* --- mappings ---------------------------------------------------------- */

/* Convert value v of key f into dst as f's type says; path names the key
 * in messages.  Returns 0 or -1. */
static int
parse_field(struct loader *ld, const struct field *f, const char *path,
    yaml_node_t *v, void *dst)
{
	int64_t n;

	switch (f->type) {
	case F_STRING:
	case F_STRING0:
		if (cfg_parse_string(ld, path, v, f->type == F_STRING0, dst) !=
		    0)
			return -1;
		break;
	case F_INT:
		if (parse_int(ld, path, v, f->min, f->max, &n) != 0)
			return -1;
		*(int *)dst = (int)n;
		break;
	case F_INT64:
		if (parse_int(ld, path, v, f->min, f->max, dst) != 0)
			return -1;
		break;
	case F_DURATION:
		if (parse_duration(ld, path, v, f->min, f->max, dst) != 0)
			return -1;
		break;
	case F_BOOL:
		if (parse_bool(ld, path, v, dst) != 0)
			return -1;
		break;
	case F_CUSTOM:
		if (f->parse(ld, path, v, dst) != 0)
			return -1;
		break;
	}
	return 0;
}

/*
 * Fill base from mapping `map` as schema s says.  A null value (`redis:`
 * with nothing after it) is an empty mapping.  If seen is not NULL it gets,
 * for each field of s, the value node given or NULL, for checks that span
 * fields.  Returns 0 or -1.
 */
int
cfg_walk_mapping(struct loader *ld, const char *what, yaml_node_t *map,
    const struct schema *s, void *base, yaml_node_t **seen)
{
	yaml_node_t *local[MAX_FIELDS] = { NULL };
	yaml_node_pair_t *p;
	char q[QUOTE_MAX], path[64];

	if (seen == NULL)
		seen = local;
	if (cfg_is_null(map))
		return 0;
	if (map->type != YAML_MAPPING_NODE) {
		cfg_errf(ld, map, "%s: expected a mapping", what);
		return -1;
	}
	for (p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *k = yaml_document_get_node(ld->doc, p->key);
		yaml_node_t *v = yaml_document_get_node(ld->doc, p->value);
		const struct field *f = NULL;
		const char *name;
		void *dst;
		size_t i;

		if ((name = cfg_key_name(ld, k, s->where)) == NULL)
			return -1;
		for (i = 0; i < s->nfields; i++) {
			if (strcmp(name, s->fields[i].name) == 0) {
				f = &s->fields[i];
				break;
			}
		}
		if (f == NULL || seen[i] != NULL) {
			cfg_errf(ld, k, "%s key %s%s%s",
			    f == NULL ? "unknown" : "duplicate",
			    cfg_quote(q, name), s->where ? " in " : "",
			    s->where ? s->where : "");
			return -1;
		}
		seen[i] = v;
		snprintf(path, sizeof(path), "%s%s", s->prefix, f->name);
		dst = (char *)base + f->off;
		if (parse_field(ld, f, path, v, dst) != 0)
			return -1;
	}
	return 0;
}

/* --- reload ------------------------------------------------------------ */

/* Does key f differ between the structs at a and b? */
static bool
field_differs(const struct field *f, const char *a, const char *b)
{
	const void *x = a + f->off, *y = b + f->off;
	const char *const *la, *const *lb;
	size_t na, nb, i;

	if (f->flags & F_CMP_LIST) {
		la = *(const char *const *const *)x;
		lb = *(const char *const *const *)y;
		na = *(const size_t *)(const void *)((const char *)x +
		    sizeof(char **));
		nb = *(const size_t *)(const void *)((const char *)y +
		    sizeof(char **));
		if (na != nb)
			return true;
		for (i = 0; i < na; i++)
			if (strcmp(la[i], lb[i]) != 0)
				return true;
		return false;
	}
	if (f->flags & F_CMP_ENUM)
		return *(const int *)x != *(const int *)y;
	switch (f->type) {
	case F_STRING:
	case F_STRING0:
	case F_CUSTOM: /* custom strings (redis.url) */
		x = *(const char *const *)x;
		y = *(const char *const *)y;
		if (x == NULL || y == NULL)
			return x != y;
		return strcmp(x, y) != 0;
	case F_INT:
		return *(const int *)x != *(const int *)y;
	case F_INT64:
	case F_DURATION:
		return *(const int64_t *)x != *(const int64_t *)y;
	case F_BOOL:
		return *(const bool *)x != *(const bool *)y;
	}
	return false;
}

size_t
cfg_start_changes(const struct schema *s, const char *a, const char *b,
    void (*fn)(const char *key, void *arg), void *arg)
{
	char path[64];
	size_t i, n = 0;

	for (i = 0; i < s->nfields; i++) {
		const struct field *f = &s->fields[i];

		if (f->sub != NULL)
			n += cfg_start_changes(f->sub, a + f->off, b + f->off,
			    fn, arg);
		else if ((f->flags & F_START_ONLY) && field_differs(f, a, b)) {
			snprintf(path, sizeof(path), "%s%s",
			    s->prefix != NULL ? s->prefix : "", f->name);
			fn(path, arg);
			n++;
		}
	}
	return n;
}

/* A copy of the n strings of v in *out (NULL when n is 0).  0, or -1 out
 * of memory (nothing allocated). */
static int
copy_list(char *const *v, size_t n, char ***out)
{
	char **c = NULL;
	size_t i;

	if (n > 0 && (c = rl_calloc(n, sizeof(*c))) == NULL)
		return -1;
	for (i = 0; i < n; i++)
		if ((c[i] = rl_strdup(v[i])) == NULL)
			goto oom;
	*out = c;
	return 0;
oom:
	while (i > 0)
		rl_free(c[--i]);
	rl_free(c);
	return -1;
}

/* Copy key f from the struct at src into the one at dst, freeing what
 * dst held.  0, or -1 out of memory (dst unchanged). */
static int
copy_field(const struct field *f, char *dst, const char *src)
{
	void *x = dst + f->off;
	const void *y = src + f->off;
	struct string_list *dl;
	const struct string_list *sl;
	char **v, *str;
	size_t i;

	if (f->flags & F_CMP_LIST) {
		dl = x;
		sl = y;
		if (copy_list(sl->v, sl->n, &v) == -1)
			return -1;
		for (i = 0; i < dl->n; i++)
			rl_free(dl->v[i]);
		rl_free(dl->v);
		dl->v = v;
		dl->n = sl->n;
		return 0;
	}
	if (f->flags & F_CMP_ENUM) {
		*(int *)x = *(const int *)y;
		return 0;
	}
	switch (f->type) {
	case F_STRING:
	case F_STRING0:
	case F_CUSTOM: /* custom strings (listen, redis.url) */
		str = NULL;
		if (*(char *const *)y != NULL &&
		    (str = rl_strdup(*(char *const *)y)) == NULL)
			return -1;
		rl_free(*(char **)x);
		*(char **)x = str;
		break;
	case F_INT:
		*(int *)x = *(const int *)y;
		break;
	case F_INT64:
	case F_DURATION:
		*(int64_t *)x = *(const int64_t *)y;
		break;
	case F_BOOL:
		*(bool *)x = *(const bool *)y;
		break;
	}
	return 0;
}

int
cfg_keep_start(const struct schema *s, char *dst, const char *src)
{
	size_t i;

	for (i = 0; i < s->nfields; i++) {
		const struct field *f = &s->fields[i];

		if (f->sub != NULL) {
			if (cfg_keep_start(f->sub, dst + f->off,
				src + f->off) == -1)
				return -1;
		} else if ((f->flags & F_START_ONLY) &&
		    copy_field(f, dst, src) == -1)
			return -1;
	}
	return 0;
}
