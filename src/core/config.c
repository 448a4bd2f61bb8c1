/*
 * config.c - the YAML rules file (CONTRACT 2) into an immutable struct
 * config.
 *
 * The text is parsed whole with libyaml's document API (yaml_parser_load),
 * which keeps every node's position, and then walked against a small schema:
 * each mapping the file may hold (the top level, redis, memory, auth, a rule)
 * is a table with one line per key giving its type, bounds and destination,
 * in the manner of Redis's config.c.  Anything a user can get wrong is
 * reported as "FILE:LINE:COL: message" at the offending key or value, and
 * nothing half-built escapes: a load returns a complete snapshot or NULL,
 * which is what lets a reload keep the old rules.
 *
 * Conversions are strict on purpose, so that a typo never silently turns a
 * limit off: every scalar is taken as a string and converted here (a quoted
 * "5" is an integer, `yes` is not a boolean), durations must carry a unit,
 * and unknown or repeated keys are errors rather than being ignored.
 */
#include "core/config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <yaml.h>

#include "core/listen_addr.h"
#include "core/redis_url.h"
#include "core/stats_window.h"
#include "base/util.h"

#define MAX_FIELDS	32		/* keys in the largest schema */
#define MAX_FILE_BYTES	(16 << 20)	/* a rules file larger is a mistake */
#define QUOTE_MAX	72		/* user text quoted in a message */
#define MAX_LIMIT	1000000000
#define DAY_MS		INT64_C(86400000)

/* State of one load, threaded through every parsing function. */
struct loader {
	const char *name;	/* FILE in messages */
	const char *text;	/* the YAML text, to place reader errors */
	size_t len;
	yaml_document_t *doc;
	char *err;
	size_t errlen;
};

/*
 * A custom field parser.  `what` is the key as messages name it
 * ("redis.pool_size"), v the value node, dst the field's address in the
 * object being filled.  Returns 0, or -1 with the error set.
 */
typedef int (*field_parse_fn)(struct loader *ld, const char *what,
    yaml_node_t *v, void *dst);

enum field_type {
	F_STRING,	/* char *, non-empty */
	F_STRING0,	/* char *, may be empty */
	F_INT,		/* int within [min, max] */
	F_INT64,	/* int64_t within [min, max] */
	F_DURATION,	/* int64_t milliseconds within [min, max] */
	F_BOOL,		/* bool: true | false */
	F_CUSTOM	/* parse(); compound fields get the whole object */
};

/* Flags of a key (struct field.flags). */
#define F_START_ONLY	0x1	/* applies at the next start, not on reload */
#define F_CMP_ENUM	0x2	/* F_CUSTOM holding an enum (compared as int) */
#define F_CMP_LIST	0x4	/* F_CUSTOM at a `char **v; size_t n;` pair */

struct schema;

struct field {
	const char *name;
	enum field_type type;
	size_t off;
	int64_t min, max;
	field_parse_fn parse;
	unsigned flags;			/* F_START_ONLY, F_CMP_* */
	const struct schema *sub;	/* a section: its own keys at off */
};

/* The keys one mapping may hold. */
struct schema {
	const char *where;	/* "redis": 'unknown key "x" in redis' */
	const char *prefix;	/* "redis.": 'redis.timeout: ...' */
	const struct field *fields;
	size_t nfields;
};

static const char *const backend_names[] = {
	[RL_BACKEND_MEMORY] = "memory",
	[RL_BACKEND_REDIS] = "redis",
};
static const char *const on_error_names[] = {
	[RL_ON_ERROR_ALLOW] = "allow",
	[RL_ON_ERROR_DENY] = "deny",
	[RL_ON_ERROR_LOCAL] = "local",
};
static const char *const log_format_names[] = {
	[RL_LOG_LOGFMT] = "logfmt",
	[RL_LOG_JSON] = "json",
};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* --- messages ---------------------------------------------------------- */

static void seterr(struct loader *ld, size_t line, size_t col,
    const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));
static void errf(struct loader *ld, const yaml_node_t *n,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errat(struct loader *ld, yaml_mark_t mark,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Write "NAME:LINE:COL: message" (1-based; line 0 means no position). */
static void
seterr(struct loader *ld, size_t line, size_t col, const char *fmt,
    va_list ap)
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
static void
errf(struct loader *ld, const yaml_node_t *n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	seterr(ld, n->start_mark.line + 1, n->start_mark.column + 1, fmt, ap);
	va_end(ap);
}

static int
oom(struct loader *ld)
{
	if (ld->err != NULL && ld->errlen > 0)
		snprintf(ld->err, ld->errlen, "%s: out of memory", ld->name);
	return -1;
}

/*
 * s double-quoted for a one-line message: quotes, backslashes and control
 * bytes escaped, and cut short with "..." past QUOTE_MAX bytes.  Returns buf.
 */
static const char *
quote(char buf[QUOTE_MAX], const char *s)
{
	size_t o = 0;

	buf[o++] = '"';
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
		if (o + n + 5 > QUOTE_MAX) {	/* room for `..."` and NUL */
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		memcpy(buf + o, esc, n);
		o += n;
	}
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
		{ "d", DAY_MS }, { "h", 3600000 }, { "m", 60000 },
		{ "s", 1000 }, { "ms", 1 },
	};
	size_t i;

	for (i = 0; i < NELEM(units) - 1; i++)
		if (ms != 0 && ms % units[i].ms == 0)
			break;
	snprintf(buf, size, "%" PRId64 "%s", ms / units[i].ms, units[i].unit);
	return buf;
}

/* The parser's own message, at its position. */
static void
yaml_error(struct loader *ld, const yaml_parser_t *p)
{
	yaml_mark_t mark = p->problem_mark;
	const char *problem = p->problem != NULL ? p->problem : "syntax error";
	size_t i;

	switch (p->error) {
	case YAML_MEMORY_ERROR:
		oom(ld);
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
static bool
is_null(const yaml_node_t *v)
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
static const char *
scalar(struct loader *ld, const char *what, yaml_node_t *v,
    const char *expect)
{
	const char *s = (const char *)v->data.scalar.value;

	if (v->type != YAML_SCALAR_NODE || is_null(v)) {
		errf(ld, v, "%s: expected %s", what, expect);
		return NULL;
	}
	if (strlen(s) != v->data.scalar.length) {
		errf(ld, v, "%s: contains a NUL byte", what);
		return NULL;
	}
	return s;
}

/* The text of mapping key k, or NULL after an error.  where: as in struct
 * schema. */
static const char *
key_name(struct loader *ld, yaml_node_t *k, const char *where)
{
	if (k->type != YAML_SCALAR_NODE || is_null(k) ||
	    strlen((const char *)k->data.scalar.value) !=
	    k->data.scalar.length) {
		errf(ld, k, "expected a key name%s%s", where ? " in " : "",
		    where ? where : "");
		return NULL;
	}
	return (const char *)k->data.scalar.value;
}

static int
parse_string(struct loader *ld, const char *what, yaml_node_t *v,
    bool empty_ok, char **dst)
{
	const char *s;
	char *copy;

	if ((s = scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (!empty_ok && *s == '\0') {
		errf(ld, v, "%s: must not be empty", what);
		return -1;
	}
	if ((copy = rl_strdup(s)) == NULL)
		return oom(ld);
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
		snprintf(expect, sizeof(expect), "an integer of at least %"
		    PRId64, min);
	else
		snprintf(expect, sizeof(expect), "an integer from %" PRId64
		    " to %" PRId64, min, max);
	if ((s = scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (util_parse_int64(s, &n) != 0 || n < min || n > max) {
		errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	*out = n;
	return 0;
}

static int
parse_duration(struct loader *ld, const char *what, yaml_node_t *v,
    int64_t min, int64_t max, int64_t *out)
{
	static const char expect[] =
	    "a duration such as 250ms, 10s, 1m, 1h or 1d";
	char q[QUOTE_MAX], lo[32], hi[32];
	const char *s;
	int64_t n;

	if ((s = scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (util_parse_int64(s, &n) == 0) {
		errf(ld, v, "%s: %s has no unit; add one of ms, s, m, h or d "
		    "(e.g. %ss)", what, quote(q, s), s);
		return -1;
	}
	if (util_parse_duration_ms(s, &n) != 0) {
		errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	if (n < min || n > max) {
		duration_text(lo, sizeof(lo), min);
		duration_text(hi, sizeof(hi), max);
		if (max == INT64_MAX)
			errf(ld, v, "%s: expected a duration of at least %s",
			    what, lo);
		else
			errf(ld, v, "%s: expected a duration from %s to %s",
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

	if ((s = scalar(ld, what, v, "true or false")) == NULL)
		return -1;
	if (strcmp(s, "true") == 0)
		*out = true;
	else if (strcmp(s, "false") == 0)
		*out = false;
	else {
		errf(ld, v, "%s: expected true or false", what);
		return -1;
	}
	return 0;
}

/* Index of v in names[], or -1 after "WHAT: expected EXPECT". */
static int
parse_enum(struct loader *ld, const char *what, yaml_node_t *v,
    const char *const *names, size_t n, const char *expect)
{
	const char *s;
	size_t i;

	if ((s = scalar(ld, what, v, expect)) == NULL)
		return -1;
	for (i = 0; i < n; i++)
		if (strcmp(s, names[i]) == 0)
			return (int)i;
	errf(ld, v, "%s: expected %s", what, expect);
	return -1;
}

/* --- mappings ---------------------------------------------------------- */

/*
 * Fill base from mapping `map` as schema s says.  A null value (`redis:`
 * with nothing after it) is an empty mapping.  If seen is not NULL it gets,
 * for each field of s, the value node given or NULL, for checks that span
 * fields.  Returns 0 or -1.
 */
static int
walk_mapping(struct loader *ld, const char *what, yaml_node_t *map,
    const struct schema *s, void *base, yaml_node_t **seen)
{
	yaml_node_t *local[MAX_FIELDS] = { NULL };
	yaml_node_pair_t *p;
	char q[QUOTE_MAX], path[64];

	if (seen == NULL)
		seen = local;
	if (is_null(map))
		return 0;
	if (map->type != YAML_MAPPING_NODE) {
		errf(ld, map, "%s: expected a mapping", what);
		return -1;
	}
	for (p = map->data.mapping.pairs.start;
	    p < map->data.mapping.pairs.top; p++) {
		yaml_node_t *k = yaml_document_get_node(ld->doc, p->key);
		yaml_node_t *v = yaml_document_get_node(ld->doc, p->value);
		const struct field *f = NULL;
		const char *name;
		void *dst;
		int64_t n;
		size_t i;

		if ((name = key_name(ld, k, s->where)) == NULL)
			return -1;
		for (i = 0; i < s->nfields; i++) {
			if (strcmp(name, s->fields[i].name) == 0) {
				f = &s->fields[i];
				break;
			}
		}
		if (f == NULL || seen[i] != NULL) {
			errf(ld, k, "%s key %s%s%s",
			    f == NULL ? "unknown" : "duplicate",
			    quote(q, name), s->where ? " in " : "",
			    s->where ? s->where : "");
			return -1;
		}
		seen[i] = v;
		snprintf(path, sizeof(path), "%s%s", s->prefix, f->name);
		dst = (char *)base + f->off;
		switch (f->type) {
		case F_STRING:
		case F_STRING0:
			if (parse_string(ld, path, v, f->type == F_STRING0,
			    dst) != 0)
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
			if (parse_duration(ld, path, v, f->min, f->max,
			    dst) != 0)
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
	}
	return 0;
}

/*
 * Attribute names (in match and in key templates) use the rule-name
 * alphabet.  Header attributes are always lower-case (CONTRACT 3), so an
 * upper-case letter after "header." could never match: say so now rather
 * than let the rule silently never apply.
 */
static int
check_attr_name(struct loader *ld, const char *what, yaml_node_t *at,
    const char *name)
{
	char q[QUOTE_MAX];
	const char *c;

	if (!rule_name_is_valid(name)) {
		errf(ld, at, "%s: bad attribute name %s", what,
		    quote(q, name));
		return -1;
	}
	if (strncmp(name, "header.", 7) == 0) {
		for (c = name; *c != '\0'; c++) {
			if (*c >= 'A' && *c <= 'Z') {
				errf(ld, at, "%s: attribute %s is never "
				    "present: header names are lower-case",
				    what, quote(q, name));
				return -1;
			}
		}
	}
	return 0;
}

/* --- enums and sections ------------------------------------------------ */

static int
parse_log_level(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	static const char expect[] = "debug, info, warn or error";
	const char *s;

	if ((s = scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (log_level_parse(s, dst) != 0) {
		errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	return 0;
}

static int
parse_log_format(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	int i = parse_enum(ld, what, v, log_format_names,
	    NELEM(log_format_names), "logfmt or json");

	if (i < 0)
		return -1;
	*(enum rl_log_format *)dst = (enum rl_log_format)i;
	return 0;
}

static int
parse_backend(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	int i = parse_enum(ld, what, v, backend_names, NELEM(backend_names),
	    "memory or redis");

	if (i < 0)
		return -1;
	*(enum rl_backend_kind *)dst = (enum rl_backend_kind)i;
	return 0;
}

static int
parse_on_error(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	int i = parse_enum(ld, what, v, on_error_names, NELEM(on_error_names),
	    "allow, deny or local");

	if (i < 0)
		return -1;
	*(enum rl_on_error *)dst = (enum rl_on_error)i;
	return 0;
}

/* A `char **v; size_t n;` pair of a config struct (F_CMP_LIST). */
struct string_list {
	char **v;
	size_t n;
};

/* redis.cluster, redis.sentinel.nodes: a sequence of "host:port".  dst:
 * the string_list. */
static int
parse_hostports(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	static const char expect[] = "a sequence of \"host:port\" strings";
	struct string_list *l = dst;
	yaml_node_item_t *it;
	size_t n;

	if (is_null(v))
		return 0;
	if (v->type != YAML_SEQUENCE_NODE) {
		errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	n = (size_t)(v->data.sequence.items.top -
	    v->data.sequence.items.start);
	if (n == 0)
		return 0;
	if ((l->v = rl_calloc(n, sizeof(*l->v))) == NULL)
		return oom(ld);
	for (it = v->data.sequence.items.start;
	    it < v->data.sequence.items.top; it++) {
		yaml_node_t *e = yaml_document_get_node(ld->doc, *it);
		char q[QUOTE_MAX];
		const char *s, *colon;
		int64_t port;

		if ((s = scalar(ld, what, e, expect)) == NULL)
			return -1;
		colon = strrchr(s, ':');
		if (colon == NULL || colon == s ||
		    util_parse_int64(colon + 1, &port) != 0 ||
		    port < 1 || port > 65535) {
			errf(ld, e, "%s: expected \"host:port\", got %s", what,
			    quote(q, s));
			return -1;
		}
		if ((l->v[l->n] = rl_strdup(s)) == NULL)
			return oom(ld);
		l->n++;
	}
	return 0;
}

/*
 * True iff url parses as a Redis address; else false with the (redacted)
 * reason in err, or "out of memory" when oom is set.
 */
static bool
redis_url_is_valid(const char *url, char *err, size_t errlen, bool *oom_out)
{
	struct redis_url u;

	*oom_out = false;
	if (redis_url_parse(url, &u, err, errlen) != 0) {
		*oom_out = strcmp(err, "out of memory") == 0;
		return false;
	}
	redis_url_free(&u);
	return true;
}

/* redis.url, checked now so that --check catches a bad address.  dst: the
 * char *url.  Messages never show a password (redis_url_parse redacts). */
static int
parse_redis_url(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	char uerr[256];
	const char *s;
	bool nomem;

	if ((s = scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (!redis_url_is_valid(s, uerr, sizeof(uerr), &nomem)) {
		if (nomem)
			return oom(ld);
		errf(ld, v, "%s: %s", what, uerr);
		return -1;
	}
	return parse_string(ld, what, v, false, dst);
}

#define SO(f) offsetof(struct sentinel_config, f)
static const struct field sentinel_fields[] = {
	{ "master",        F_STRING,   SO(master),        0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "nodes",         F_CUSTOM,   SO(nodes),         0, 0,
	    parse_hostports, F_START_ONLY | F_CMP_LIST, NULL },
	{ "password_file", F_STRING,   SO(password_file), 0, 0, NULL,
	    F_START_ONLY, NULL },
};
#undef SO

static const struct schema sentinel_schema = {
	"redis.sentinel", "redis.sentinel.", sentinel_fields,
	NELEM(sentinel_fields)
};

/* redis.sentinel: master and at least one node.  dst: the
 * struct sentinel_config. */
static int
parse_sentinel(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	struct sentinel_config *sc = dst;

	if (is_null(v))
		return 0;
	if (walk_mapping(ld, what, v, &sentinel_schema, dst, NULL) == -1)
		return -1;
	if (sc->master == NULL || sc->nnodes == 0) {
		errf(ld, v, "%s: needs master and at least one of nodes",
		    what);
		return -1;
	}
	return 0;
}

#define RO(f) offsetof(struct redis_config, f)
static const struct field redis_fields[] = {
	{ "url",           F_CUSTOM,   RO(url),           0, 0,
	    parse_redis_url, F_START_ONLY, NULL },
	{ "cluster",       F_CUSTOM,   RO(cluster),       0, 0,
	    parse_hostports, F_START_ONLY | F_CMP_LIST, NULL },
	{ "sentinel",      F_CUSTOM,   RO(sentinel),      0, 0,
	    parse_sentinel, 0, &sentinel_schema },
	{ "pool_size",     F_INT,      RO(pool_size),     1, 1024, NULL,
	    F_START_ONLY, NULL },
	{ "timeout",       F_DURATION, RO(timeout_ms),    1, DAY_MS, NULL,
	    F_START_ONLY, NULL },
	{ "key_prefix",    F_STRING0,  RO(key_prefix),    0, 0, NULL, 0, NULL },
	{ "password_file", F_STRING,   RO(password_file), 0, 0, NULL,
	    F_START_ONLY, NULL },
};
#undef RO

static const struct field memory_fields[] = {
	{ "max_keys", F_INT64, offsetof(struct memory_config, max_keys),
	    1, INT64_MAX, NULL, F_START_ONLY, NULL },
};

static int
parse_client_ip(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	int i = parse_enum(ld, what, v, client_ip_source_names,
	    CLIENT_IP_NSOURCES,
	    "auto, x-real-ip, x-forwarded-for or peer");

	if (i < 0)
		return -1;
	*(enum client_ip_source *)dst = (enum client_ip_source)i;
	return 0;
}

/* The auth section lives in struct config itself. */
#define AU(f) offsetof(struct config, f)
static const struct field auth_fields[] = {
	{ "deny_status",      F_INT,    AU(auth_deny_status), 400, 599, NULL,
	    0, NULL },
	{ "xff_trusted_hops", F_INT,    AU(auth_ip.xff_trusted_hops), 0, 64,
	    NULL, 0, NULL },
	{ "client_ip",        F_CUSTOM, AU(auth_ip.source), 0, 0,
	    parse_client_ip, 0, NULL },
	{ "ipv6_prefix",      F_INT,    AU(auth_ip.ipv6_prefix), 1, 128,
	    NULL, 0, NULL },
};
#undef AU

static const struct schema redis_schema = {
	"redis", "redis.", redis_fields, NELEM(redis_fields)
};
static const struct schema memory_schema = {
	"memory", "memory.", memory_fields, NELEM(memory_fields)
};
static const struct schema auth_schema = {
	"auth", "auth.", auth_fields, NELEM(auth_fields)
};

static int
parse_redis(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct redis_config *rc = dst;
	struct redis_url u;
	char uerr[256];

	if (walk_mapping(ld, what, v, &redis_schema, dst, NULL) == -1)
		return -1;
	if (rc->ncluster > 0 && rc->sentinel.master != NULL) {
		errf(ld, v, "%s: set redis.cluster or redis.sentinel, not "
		    "both", what);
		return -1;
	}
	if (rc->ncluster > 0 && rc->url != NULL &&
	    redis_url_parse(rc->url, &u, uerr, sizeof(uerr)) == 0) {
		bool bad = u.db != 0 || u.is_unix;

		redis_url_free(&u);
		if (bad) {
			errf(ld, v, "%s: Redis Cluster has only db 0 and TCP "
			    "nodes; redis.url may give credentials only",
			    what);
			return -1;
		}
	}
	return 0;
}

static int
parse_memory(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	return walk_mapping(ld, what, v, &memory_schema, dst, NULL);
}

static int
parse_auth(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	return walk_mapping(ld, what, v, &auth_schema, dst, NULL);
}

/* --- rules ------------------------------------------------------------- */

static int
parse_rule_name(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	char q[QUOTE_MAX];
	const char *s;

	if ((s = scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (!rule_name_is_valid(s)) {
		errf(ld, v, "bad rule name %s: use letters, digits, '_', '.' "
		    "and '-'", quote(q, s));
		return -1;
	}
	if (strlen(s) > RL_MAX_NAME_BYTES) {
		errf(ld, v, "rule name %s is longer than %d bytes",
		    quote(q, s), RL_MAX_NAME_BYTES);
		return -1;
	}
	return parse_string(ld, what, v, false, dst);
}

/* match: attribute -> pattern.  dst: the struct rule. */
static int
parse_match(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct rule *r = dst;
	yaml_node_pair_t *p;
	char q[QUOTE_MAX], path[64], perr[256];
	size_t n, i;

	if (is_null(v))
		return 0;
	if (v->type != YAML_MAPPING_NODE) {
		errf(ld, v, "%s: expected a mapping of attribute: pattern",
		    what);
		return -1;
	}
	n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
	if (n == 0)
		return 0;
	if ((r->match = rl_calloc(n, sizeof(*r->match))) == NULL)
		return oom(ld);
	for (p = v->data.mapping.pairs.start;
	    p < v->data.mapping.pairs.top; p++) {
		yaml_node_t *k = yaml_document_get_node(ld->doc, p->key);
		yaml_node_t *pv = yaml_document_get_node(ld->doc, p->value);
		struct rule_match m = { 0 };
		const char *attr, *src;

		if ((attr = key_name(ld, k, what)) == NULL ||
		    check_attr_name(ld, what, k, attr) != 0)
			return -1;
		for (i = 0; i < r->nmatch; i++) {
			if (strcmp(r->match[i].attr, attr) == 0) {
				errf(ld, k, "duplicate key %s in match",
				    quote(q, attr));
				return -1;
			}
		}
		snprintf(path, sizeof(path), "%s.%s", what, attr);
		if ((src = scalar(ld, path, pv, "a pattern string")) == NULL)
			return -1;
		if (pattern_compile(&m.pattern, src, perr, sizeof(perr)) != 0) {
			/* Only a regex can be wrong: 'bad regex "(": ...' */
			if (src[0] != '~' || strcmp(perr, "out of memory") == 0)
				return oom(ld);
			errf(ld, pv, "%s", perr);
			return -1;
		}
		if ((m.attr = rl_strdup(attr)) == NULL) {
			pattern_free(&m.pattern);
			return oom(ld);
		}
		r->match[r->nmatch++] = m;
	}
	return 0;
}

/* key: a template.  dst: the rule's struct key_template *. */
static int
parse_key(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct key_template **out = dst, *t;
	char terr[256], name[128];
	const char *s;
	size_t i;

	if ((s = scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (*s == '\0') {
		errf(ld, v, "%s: must not be empty (leave it out for one "
		    "counter per rule)", what);
		return -1;
	}
	if ((t = rl_calloc(1, sizeof(*t))) == NULL)
		return oom(ld);
	if (template_compile(t, s, terr, sizeof(terr)) != 0) {
		rl_free(t);
		if (strcmp(terr, "out of memory") == 0)
			return oom(ld);
		errf(ld, v, "%s", terr);	/* 'key template "${": ...' */
		return -1;
	}
	*out = t;	/* the rule owns it from here */
	for (i = 0; i < t->nparts; i++) {
		const struct template_part *tp = &t->parts[i];

		if (!tp->is_attr)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)tp->len, tp->text);
		if (check_attr_name(ld, what, v, name) != 0)
			return -1;
	}
	return 0;
}

static int
parse_algorithm(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	static const char expect[] =
	    "sliding_log, sliding_window, fixed_window, token_bucket or "
	    "concurrency";
	const char *s;

	if ((s = scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (rl_algorithm_parse(s, dst) != 0) {
		errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	return 0;
}

enum { RF_NAME, RF_MATCH, RF_KEY, RF_LIMIT, RF_WINDOW, RF_ALGORITHM,
    RF_COST, RF_SHADOW };

#define RU(f) offsetof(struct rule, f)
static const struct field rule_fields[] = {
	[RF_NAME] =      { "name",      F_CUSTOM,   RU(name), 0, 0,
	    parse_rule_name, 0, NULL },
	[RF_MATCH] =     { "match",     F_CUSTOM,   0, 0, 0, parse_match, 0,
	    NULL },
	[RF_KEY] =       { "key",       F_CUSTOM,   RU(key), 0, 0, parse_key, 0,
	    NULL },
	[RF_LIMIT] =     { "limit",     F_INT64,    RU(limit), 1, MAX_LIMIT,
	    NULL, 0, NULL },
	[RF_WINDOW] =    { "window",    F_DURATION, RU(window_ms), 1,
	    366 * DAY_MS, NULL, 0, NULL },
	[RF_ALGORITHM] = { "algorithm", F_CUSTOM,   RU(algorithm), 0, 0,
	    parse_algorithm, 0, NULL },
	[RF_COST] =      { "cost",      F_INT64,    RU(cost), 0, MAX_LIMIT,
	    NULL, 0, NULL },
	[RF_SHADOW] =    { "shadow",    F_BOOL,     RU(shadow), 0, 0, NULL, 0, NULL },
};
#undef RU

static const struct schema rule_schema = {
	"rule", "", rule_fields, NELEM(rule_fields)
};

/* Parse rules[r->index] from node v into r, checking it against the rules
 * before it. */
static int
parse_rule(struct loader *ld, yaml_node_t *v, const struct config *c,
    struct rule *r)
{
	yaml_node_t *seen[MAX_FIELDS] = { NULL };
	char q[QUOTE_MAX];
	size_t i;

	if (v->type != YAML_MAPPING_NODE) {
		errf(ld, v, "rules: each rule must be a mapping");
		return -1;
	}
	r->algorithm = RL_ALG_SLIDING_LOG;
	r->cost = 1;
	r->shadow = false;
	if (walk_mapping(ld, "rule", v, &rule_schema, r, seen) != 0)
		return -1;
	if (seen[RF_NAME] == NULL) {
		errf(ld, v, "rule is missing \"name\"");
		return -1;
	}
	if (seen[RF_LIMIT] == NULL || seen[RF_WINDOW] == NULL) {
		errf(ld, v, "rule %s is missing \"%s\"", quote(q, r->name),
		    seen[RF_LIMIT] == NULL ? "limit" : "window");
		return -1;
	}
	if (r->cost > r->limit) {
		errf(ld, seen[RF_COST], "cost: %" PRId64 " is larger than "
		    "limit %" PRId64, r->cost, r->limit);
		return -1;
	}
	/* GCRA spaces units window/limit apart on a microsecond clock: a
	 * smaller step would round to 0 and admit without bound. */
	if (r->algorithm == RL_ALG_TOKEN_BUCKET &&
	    r->limit > r->window_ms * 1000) {
		errf(ld, seen[RF_LIMIT], "limit: token_bucket needs at least "
		    "1us of window per unit (limit <= %" PRId64 " for this "
		    "window)", r->window_ms * 1000);
		return -1;
	}
	for (i = 0; i < r->index; i++) {
		if (strcmp(c->rules[i].name, r->name) == 0) {
			errf(ld, seen[RF_NAME], "duplicate rule name %s",
			    quote(q, r->name));
			return -1;
		}
	}
	if (config_find_stat(c, r->name) != NULL) {
		errf(ld, seen[RF_NAME], "rule name %s is the name of a stat",
		    quote(q, r->name));
		return -1;
	}
	return 0;
}

/* rules: a sequence of rule mappings.  dst: the struct config. */
static int
parse_rules(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct config *c = dst;
	yaml_node_item_t *it;
	size_t n;

	if (is_null(v))
		return 0;
	if (v->type != YAML_SEQUENCE_NODE) {
		errf(ld, v, "%s: expected a sequence of rules", what);
		return -1;
	}
	n = (size_t)(v->data.sequence.items.top -
	    v->data.sequence.items.start);
	if (n == 0)
		return 0;
	if ((c->rules = rl_calloc(n, sizeof(*c->rules))) == NULL)
		return oom(ld);
	for (it = v->data.sequence.items.start;
	    it < v->data.sequence.items.top; it++) {
		struct rule *r = &c->rules[c->nrules];

		/* Counted before parsing, so that a half-built rule is freed
		 * with the config (rule_free_contents takes zeroed fields). */
		r->index = c->nrules++;
		if (parse_rule(ld, yaml_document_get_node(ld->doc, *it), c,
		    r) != 0)
			return -1;
	}
	return 0;
}

/* --- stats (CONTRACT 9) ------------------------------------------------ */

/* relative_accuracy: a number in [SKETCH_MIN_ACCURACY, SKETCH_MAX_ACCURACY].
 * dst: a double. */
static int
parse_accuracy(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	const char *s;
	char *end;
	double a;

	if ((s = scalar(ld, what, v, "a number")) == NULL)
		return -1;
	errno = 0;
	a = strtod(s, &end);
	if (*s == '\0' || *end != '\0' || errno != 0 ||
	    !(a >= SKETCH_MIN_ACCURACY && a <= SKETCH_MAX_ACCURACY)) {
		errf(ld, v, "%s: expected a number from %g to %g", what,
		    SKETCH_MIN_ACCURACY, SKETCH_MAX_ACCURACY);
		return -1;
	}
	*(double *)dst = a;
	return 0;
}

enum { SF_NAME, SF_MATCH, SF_KEY, SF_WINDOW, SF_RESOLUTION, SF_ACCURACY };

#define SD(f) offsetof(struct stat_def, f)
static const struct field stat_fields[] = {
	[SF_NAME] =       { "name",       F_CUSTOM,   SD(rule.name), 0, 0,
	    parse_rule_name, 0, NULL },
	[SF_MATCH] =      { "match",      F_CUSTOM,   SD(rule), 0, 0,
	    parse_match, 0, NULL },
	[SF_KEY] =        { "key",        F_CUSTOM,   SD(rule.key), 0, 0,
	    parse_key, 0, NULL },
	[SF_WINDOW] =     { "window",     F_DURATION, SD(rule.window_ms), 1,
	    366 * DAY_MS, NULL, 0, NULL },
	[SF_RESOLUTION] = { "resolution", F_DURATION, SD(resolution_ms), 1,
	    366 * DAY_MS, NULL, 0, NULL },
	[SF_ACCURACY] =   { "relative_accuracy", F_CUSTOM, SD(accuracy), 0, 0,
	    parse_accuracy, 0, NULL },
};
#undef SD

static const struct schema stat_schema = {
	"stat", "", stat_fields, NELEM(stat_fields)
};

/* Parse stats[index] from node v into sd, checking it against the stats
 * before it and the rules. */
static int
parse_stat(struct loader *ld, yaml_node_t *v, const struct config *c,
    struct stat_def *sd, size_t index)
{
	yaml_node_t *seen[MAX_FIELDS] = { NULL };
	struct stats_window_params wp;
	char q[QUOTE_MAX], werr[128];
	size_t i;

	if (v->type != YAML_MAPPING_NODE) {
		errf(ld, v, "stats: each stat must be a mapping");
		return -1;
	}
	sd->accuracy = 0.01;
	if (walk_mapping(ld, "stat", v, &stat_schema, sd, seen) != 0)
		return -1;
	if (seen[SF_NAME] == NULL) {
		errf(ld, v, "stat is missing \"name\"");
		return -1;
	}
	if (seen[SF_WINDOW] == NULL) {
		errf(ld, v, "stat %s is missing \"window\"",
		    quote(q, sd->rule.name));
		return -1;
	}
	if (seen[SF_RESOLUTION] == NULL)
		sd->resolution_ms = sd->rule.window_ms / 20 > 0 ?
		    sd->rule.window_ms / 20 : 1;
	if (stats_window_params_set(&wp, sd->rule.window_ms,
	    sd->resolution_ms, sd->accuracy, werr, sizeof(werr)) != 0) {
		errf(ld, seen[SF_RESOLUTION] != NULL ? seen[SF_RESOLUTION] :
		    seen[SF_WINDOW], "stat %s: %s", quote(q, sd->rule.name),
		    werr);
		return -1;
	}
	for (i = 0; i < index; i++) {
		if (strcmp(c->stats[i].rule.name, sd->rule.name) == 0) {
			errf(ld, seen[SF_NAME], "duplicate stat name %s",
			    quote(q, sd->rule.name));
			return -1;
		}
	}
	if (config_find_rule(c, sd->rule.name) != NULL) {
		errf(ld, seen[SF_NAME], "stat name %s is the name of a rule",
		    quote(q, sd->rule.name));
		return -1;
	}
	return 0;
}

/* stats: a sequence of stat mappings.  dst: the struct config. */
static int
parse_stats(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct config *c = dst;
	yaml_node_item_t *it;
	size_t n;

	if (is_null(v))
		return 0;
	if (v->type != YAML_SEQUENCE_NODE) {
		errf(ld, v, "%s: expected a sequence of stats", what);
		return -1;
	}
	n = (size_t)(v->data.sequence.items.top -
	    v->data.sequence.items.start);
	if (n == 0)
		return 0;
	if ((c->stats = rl_calloc(n, sizeof(*c->stats))) == NULL)
		return oom(ld);
	for (it = v->data.sequence.items.start;
	    it < v->data.sequence.items.top; it++) {
		struct stat_def *sd = &c->stats[c->nstats];

		/* Counted first, so that a half-built stat is freed with the
		 * config. */
		c->nstats++;
		if (parse_stat(ld, yaml_document_get_node(ld->doc, *it), c,
		    sd, c->nstats - 1) != 0)
			return -1;
	}
	return 0;
}

/* --- the top level ----------------------------------------------------- */

/* listen_mode: an octal file mode in a string, "0660". */
static int
parse_listen_mode(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	const char *s, *p;
	long m = 0;

	if ((s = scalar(ld, what, v, "a string")) == NULL)
		return -1;
	for (p = s; *p >= '0' && *p <= '7' && m <= 07777; p++)
		m = m * 8 + (*p - '0');
	if (*s == '\0' || *p != '\0' || m > 07777) {
		errf(ld, v, "%s: expected an octal file mode such as \"0660\"",
		    what);
		return -1;
	}
	*(int *)dst = (int)m;
	return 0;
}

static int
parse_listen(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct listen_addr a;
	char lerr[256];
	const char *s;

	if ((s = scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (*s == '\0')
		return parse_string(ld, what, v, false, dst);	/* says so */
	if (listen_addr_parse(s, &a, lerr, sizeof(lerr)) == -1) {
		errf(ld, v, "%s: %s", what, lerr);
		return -1;
	}
	return parse_string(ld, what, v, false, dst);
}

#define CO(f) offsetof(struct config, f)
static const struct field top_fields[] = {
	{ "listen",           F_CUSTOM,   CO(listen),         0, 0,
	    parse_listen, F_START_ONLY, NULL },
	{ "grpc_listen",      F_CUSTOM,   CO(grpc_listen),    0, 0,
	    parse_listen, F_START_ONLY, NULL },
	{ "threads",          F_INT,      CO(threads),        1, 1024, NULL,
	    F_START_ONLY, NULL },
	{ "max_body_bytes",   F_INT64,    CO(max_body_bytes), 1, 64 << 20,
	    NULL, 0, NULL },
	{ "max_connections",  F_INT64,    CO(max_connections), 1, 1000000,
	    NULL, 0, NULL },
	{ "idle_timeout",     F_DURATION, CO(idle_timeout_ms), 1000, DAY_MS,
	    NULL, F_START_ONLY, NULL },
	{ "request_timeout",  F_DURATION, CO(request_timeout_ms), 1, DAY_MS,
	    NULL, 0, NULL },
	{ "max_header_bytes", F_INT,      CO(max_header_bytes), 1024,
	    1 << 20, NULL, F_START_ONLY, NULL },
	{ "max_attributes",   F_INT,      CO(max_attributes), 1, 4096, NULL,
	    0, NULL },
	{ "user",             F_STRING,   CO(user),           0, 0, NULL,
	    F_START_ONLY, NULL },
	{ "listen_mode",      F_CUSTOM,   CO(listen_mode),    0, 0,
	    parse_listen_mode, F_START_ONLY | F_CMP_ENUM, NULL },
	{ "shutdown_timeout", F_DURATION, CO(shutdown_timeout_ms),
	    0, DAY_MS, NULL, 0, NULL },
	{ "max_wait",         F_DURATION, CO(max_wait_ms),    0, DAY_MS,
	    NULL, 0, NULL },
	{ "max_waiting",      F_INT64,    CO(max_waiting),    0, 10000000,
	    NULL, 0, NULL },
	{ "log_level",        F_CUSTOM,   CO(log_level),      0, 0,
	    parse_log_level, 0, NULL },
	{ "log_format",       F_CUSTOM,   CO(log_format),     0, 0,
	    parse_log_format, 0, NULL },
	{ "access_log",       F_BOOL,     CO(access_log),     0, 0, NULL, 0, NULL },
	{ "backend",          F_CUSTOM,   CO(backend),        0, 0,
	    parse_backend, F_START_ONLY | F_CMP_ENUM, NULL },
	{ "backend_required", F_BOOL,     CO(backend_required), 0, 0, NULL, 0, NULL },
	{ "redis",            F_CUSTOM,   CO(redis),          0, 0,
	    parse_redis, 0, &redis_schema },
	{ "memory",           F_CUSTOM,   CO(memory),         0, 0,
	    parse_memory, 0, &memory_schema },
	{ "on_backend_error", F_CUSTOM,   CO(on_backend_error), 0, 0,
	    parse_on_error, 0, NULL },
	{ "auth",             F_CUSTOM,   0,                  0, 0,
	    parse_auth, 0, NULL },
	{ "rules",            F_CUSTOM,   0,                  0, 0,
	    parse_rules, 0, NULL },
	{ "stats",            F_CUSTOM,   0,                  0, 0,
	    parse_stats, 0, NULL },
};
#undef CO

static const struct schema top_schema = {
	NULL, "", top_fields, NELEM(top_fields)
};

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
	case F_CUSTOM:		/* custom strings (redis.url) */
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

static size_t
schema_start_changes(const struct schema *s, const char *a, const char *b,
    void (*fn)(const char *key, void *arg), void *arg)
{
	char path[64];
	size_t i, n = 0;

	for (i = 0; i < s->nfields; i++) {
		const struct field *f = &s->fields[i];

		if (f->sub != NULL)
			n += schema_start_changes(f->sub, a + f->off,
			    b + f->off, fn, arg);
		else if ((f->flags & F_START_ONLY) &&
		    field_differs(f, a, b)) {
			snprintf(path, sizeof(path), "%s%s",
			    s->prefix != NULL ? s->prefix : "", f->name);
			fn(path, arg);
			n++;
		}
	}
	return n;
}

size_t
config_start_only_changes(const struct config *old, const struct config *c,
    void (*fn)(const char *key, void *arg), void *arg)
{
	return schema_start_changes(&top_schema, (const char *)old,
	    (const char *)c, fn, arg);
}

_Static_assert(NELEM(top_fields) <= MAX_FIELDS, "raise MAX_FIELDS");
_Static_assert(NELEM(rule_fields) <= MAX_FIELDS, "raise MAX_FIELDS");
_Static_assert(NELEM(stat_fields) <= MAX_FIELDS, "raise MAX_FIELDS");
_Static_assert(NELEM(redis_fields) <= MAX_FIELDS, "raise MAX_FIELDS");

static void
config_free(struct config *c)
{
	size_t i;

	if (c == NULL)
		return;
	for (i = 0; i < c->nrules; i++)
		rule_free_contents(&c->rules[i]);
	rl_free(c->rules);
	for (i = 0; i < c->nstats; i++)
		rule_free_contents(&c->stats[i].rule);
	rl_free(c->stats);
	for (i = 0; i < c->redis.ncluster; i++)
		rl_free(c->redis.cluster[i]);
	rl_free(c->redis.cluster);
	for (i = 0; i < c->redis.sentinel.nnodes; i++)
		rl_free(c->redis.sentinel.nodes[i]);
	rl_free(c->redis.sentinel.nodes);
	rl_free(c->redis.sentinel.master);
	rl_free(c->redis.sentinel.password_file);
	rl_free(c->redis.url);
	rl_free(c->redis.key_prefix);
	rl_free(c->redis.password_file);
	rl_free(c->listen);
	rl_free(c->grpc_listen);
	rl_free(c->user);
	rl_free(c->path);
	rl_free(c);
}

/* One event loop per core: more only take turns on the same cores. */
static int
config_default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

/* A config holding the defaults of config.h, or NULL (out of memory). */
static struct config *
config_new(const char *path)
{
	struct config *c;

	if ((c = rl_calloc(1, sizeof(*c))) == NULL)
		return NULL;
	c->refs = 1;
	c->threads = config_default_threads();
	c->max_body_bytes = 16384;
	c->max_connections = 10000;
	c->idle_timeout_ms = 60000;
	c->request_timeout_ms = 10000;
	c->max_header_bytes = 8192;
	c->max_attributes = 64;
	c->listen_mode = -1;
	c->shutdown_timeout_ms = 10000;
	c->max_wait_ms = 30000;
	c->max_waiting = 10000;
	c->log_level = LOG_LEVEL_INFO;
	c->log_format = RL_LOG_LOGFMT;
	c->access_log = false;
	c->backend = RL_BACKEND_MEMORY;
	c->redis.pool_size = 8;
	c->redis.timeout_ms = 50;
	c->memory.max_keys = 1000000;
	c->backend_required = false;
	c->on_backend_error = RL_ON_ERROR_ALLOW;
	c->auth_deny_status = 429;
	c->auth_ip.source = CLIENT_IP_AUTO;
	c->auth_ip.xff_trusted_hops = 0;
	c->auth_ip.ipv6_prefix = 64;
	if ((c->path = rl_strdup(path)) == NULL ||
	    (c->listen = rl_strdup("127.0.0.1:8080")) == NULL ||
	    (c->redis.url = rl_strdup("redis://127.0.0.1:6379/0")) == NULL ||
	    (c->redis.key_prefix = rl_strdup("rl:")) == NULL) {
		config_free(c);
		return NULL;
	}
	return c;
}

struct config *
config_load_string(const char *name, const char *text, size_t len,
    char *err, size_t errlen)
{
	struct loader ld = { name, text != NULL ? text : "", len, NULL, err,
	    errlen };
	yaml_parser_t parser;
	yaml_document_t doc, extra;
	yaml_node_t *root, *next;
	struct config *c, *ret = NULL;

	if (text == NULL)
		ld.len = 0;
	if ((c = config_new(name)) == NULL) {
		oom(&ld);
		return NULL;
	}
	if (!yaml_parser_initialize(&parser)) {
		oom(&ld);
		goto out;
	}
	yaml_parser_set_input_string(&parser, (const unsigned char *)ld.text,
	    ld.len);
	if (!yaml_parser_load(&parser, &doc)) {	/* deletes doc on failure */
		yaml_error(&ld, &parser);
		goto out_parser;
	}
	ld.doc = &doc;

	/* A second document is an error, found before any semantics so that
	 * syntax errors anywhere in the file come first. */
	if (!yaml_parser_load(&parser, &extra)) {
		yaml_error(&ld, &parser);
		goto out_doc;
	}
	next = yaml_document_get_root_node(&extra);
	if (next != NULL)
		errf(&ld, next, "only one YAML document is allowed");
	yaml_document_delete(&extra);
	if (next != NULL)
		goto out_doc;

	root = yaml_document_get_root_node(&doc);
	if (root != NULL && !is_null(root)) {
		if (root->type != YAML_MAPPING_NODE) {
			errf(&ld, root, "expected a mapping of settings at "
			    "the top level");
			goto out_doc;
		}
		if (walk_mapping(&ld, "top level", root, &top_schema, c,
		    NULL) != 0)
			goto out_doc;
	}
	ret = c;
	c = NULL;
out_doc:
	yaml_document_delete(&doc);
out_parser:
	yaml_parser_delete(&parser);
out:
	config_free(c);
	return ret;
}

struct config *
config_load(const char *path, char *err, size_t errlen)
{
	struct loader ld = { path, NULL, 0, NULL, err, errlen };
	struct config *c = NULL;
	char *buf = NULL, *nbuf, eb[128];
	size_t len = 0, cap = 0;
	ssize_t n;
	int fd;

	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1) {
		if (err != NULL && errlen > 0)
			snprintf(err, errlen, "%s: cannot open: %s", path,
			    strerror_r(errno, eb, sizeof(eb)));
		return NULL;
	}
	for (;;) {
		if (len == cap) {
			if (cap >= MAX_FILE_BYTES) {
				if (err != NULL && errlen > 0)
					snprintf(err, errlen, "%s: larger "
					    "than %d MiB", path,
					    MAX_FILE_BYTES >> 20);
				goto out;
			}
			cap = cap == 0 ? 8192 : cap * 2;
			if ((nbuf = rl_realloc(buf, cap)) == NULL) {
				oom(&ld);
				goto out;
			}
			buf = nbuf;
		}
		n = read(fd, buf + len, cap - len);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1) {
			if (err != NULL && errlen > 0)
				snprintf(err, errlen, "%s: cannot read: %s",
				    path, strerror_r(errno, eb, sizeof(eb)));
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	c = config_load_string(path, buf, len, err, errlen);
out:
	close(fd);
	rl_free(buf);
	return c;
}

/* Set err to "VAR: message"; returns -1. */
static int
env_error(char *err, size_t errlen, const char *var, const char *msg)
{
	if (err != NULL && errlen > 0)
		snprintf(err, errlen, "%s: %s", var, msg);
	return -1;
}

int
config_apply_env(struct config *c, char *err, size_t errlen)
{
	const char *listen = getenv("RATELIMITD_LISTEN");
	const char *url = getenv("RATELIMITD_REDIS_URL");
	const char *level = getenv("RATELIMITD_LOG_LEVEL");
	char *nlisten = NULL, *nurl = NULL, uerr[256];
	struct listen_addr la;
	enum log_level lv = c->log_level;
	bool nomem;

	/* Check and copy everything first, so that a failure changes
	 * nothing. */
	if (listen != NULL && *listen == '\0')
		return env_error(err, errlen, "RATELIMITD_LISTEN",
		    "must not be empty");
	if (listen != NULL && listen_addr_parse(listen, &la, uerr,
	    sizeof(uerr)) == -1)
		return env_error(err, errlen, "RATELIMITD_LISTEN", uerr);
	if (url != NULL && *url == '\0')
		return env_error(err, errlen, "RATELIMITD_REDIS_URL",
		    "must not be empty");
	if (url != NULL && !redis_url_is_valid(url, uerr, sizeof(uerr),
	    &nomem))
		return env_error(err, errlen, "RATELIMITD_REDIS_URL", uerr);
	if (level != NULL && log_level_parse(level, &lv) != 0)
		return env_error(err, errlen, "RATELIMITD_LOG_LEVEL",
		    "expected debug, info, warn or error");
	if (listen != NULL && (nlisten = rl_strdup(listen)) == NULL)
		return env_error(err, errlen, "RATELIMITD_LISTEN",
		    "out of memory");
	if (url != NULL && (nurl = rl_strdup(url)) == NULL) {
		rl_free(nlisten);
		return env_error(err, errlen, "RATELIMITD_REDIS_URL",
		    "out of memory");
	}

	if (nlisten != NULL) {
		rl_free(c->listen);
		c->listen = nlisten;
	}
	if (nurl != NULL) {
		rl_free(c->redis.url);
		c->redis.url = nurl;
	}
	c->log_level = lv;
	return 0;
}

struct config *
config_ref(struct config *c)
{
	if (c != NULL)
		__atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
	return c;
}

void
config_unref(struct config *c)
{
	if (c != NULL && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
		config_free(c);
}

const struct rule *
config_find_rule(const struct config *c, const char *name)
{
	size_t i;

	if (c == NULL || name == NULL)
		return NULL;
	for (i = 0; i < c->nrules; i++)
		if (c->rules[i].name != NULL &&
		    strcmp(c->rules[i].name, name) == 0)
			return &c->rules[i];
	return NULL;
}

const struct stat_def *
config_find_stat(const struct config *c, const char *name)
{
	size_t i;

	if (c == NULL || name == NULL)
		return NULL;
	for (i = 0; i < c->nstats; i++)
		if (c->stats[i].rule.name != NULL &&
		    strcmp(c->stats[i].rule.name, name) == 0)
			return &c->stats[i];
	return NULL;
}

const char *
config_backend_name(enum rl_backend_kind kind)
{
	if ((size_t)kind < NELEM(backend_names))
		return backend_names[kind];
	return "unknown";
}

const char *
config_on_error_name(enum rl_on_error e)
{
	if ((size_t)e < NELEM(on_error_names))
		return on_error_names[e];
	return "unknown";
}
