/*
 * config_table.h - the table engine of the YAML loader; private to the
 * config module (src/core/config*.c), which alone includes it.  The public
 * interface is core/config.h.
 *
 * Each mapping a rules file may hold is described by a struct schema: a
 * table with one struct field per key giving its type, bounds, destination
 * and flags, in the manner of Redis's config.c.  cfg_walk_mapping() fills a
 * struct from a mapping node against such a table, converting every scalar
 * strictly (a quoted "5" is an integer, `yes` is not a boolean, durations
 * carry a unit) and reporting unknown or repeated keys; cfg_start_changes()
 * compares two structs key by key for a reload.  The engine knows nothing
 * of ratelimitd's sections: their tables live in config.c (top level,
 * auth), config_store.c (redis, memory), config_rules.c and config_stats.c.
 *
 * Errors are written to the struct loader as "FILE:LINE:COL: message".
 * Everything here runs on the thread doing the load and touches no shared
 * state.  cfg_ is the module's private prefix.
 */
#ifndef RL_CONFIG_TABLE_H
#define RL_CONFIG_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <yaml.h>

#define MAX_FIELDS 32 /* keys in the largest schema */
#define QUOTE_MAX  72 /* user text quoted in a message */
#define DAY_MS	   INT64_C(86400000)

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* State of one load, threaded through every parsing function. */
struct loader {
	const char *name; /* FILE in messages */
	const char *text; /* the YAML text, to place reader errors */
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
	F_STRING,   /* char *, non-empty */
	F_STRING0,  /* char *, may be empty */
	F_INT,	    /* int within [min, max] */
	F_INT64,    /* int64_t within [min, max] */
	F_DURATION, /* int64_t milliseconds within [min, max] */
	F_BOOL,	    /* bool: true | false */
	F_CUSTOM    /* parse(); compound fields get the whole object */
};

/* Flags of a key (struct field.flags). */
#define F_START_ONLY 0x1 /* applies at the next start, not on reload */
#define F_CMP_ENUM   0x2 /* F_CUSTOM holding an enum (compared as int) */
#define F_CMP_LIST   0x4 /* F_CUSTOM at a `char **v; size_t n;` pair */

struct schema;

struct field {
	const char *name;
	enum field_type type;
	size_t off;
	int64_t min, max;
	field_parse_fn parse;
	unsigned flags;		  /* F_START_ONLY, F_CMP_* */
	const struct schema *sub; /* a section: its own keys at off */
};

/* The keys one mapping may hold. */
struct schema {
	const char *where;  /* "redis": 'unknown key "x" in redis' */
	const char *prefix; /* "redis.": 'redis.timeout: ...' */
	const struct field *fields;
	size_t nfields;
};

/* A `char **v; size_t n;` pair of a config struct (F_CMP_LIST). */
struct string_list {
	char **v;
	size_t n;
};

/* --- messages --------------------------------------------------------- */

/* Set the error "FILE:LINE:COL: message" at the start of node n. */
void cfg_errf(struct loader *ld, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Set the error "FILE: out of memory".  Returns -1, for `return
 * cfg_oom(ld);`. */
int cfg_oom(struct loader *ld);

/*
 * s double-quoted for a one-line message: quotes, backslashes and control
 * bytes escaped, and cut short with "..." past QUOTE_MAX bytes.  Returns buf
 * (the caller's), so that it can be an argument of cfg_errf().
 */
const char *cfg_quote(char buf[QUOTE_MAX], const char *s);

/* Set the error for libyaml's failure in p (syntax, bad bytes, memory) at
 * the position it gives. */
void cfg_yaml_error(struct loader *ld, const yaml_parser_t *p);

/* --- scalars ---------------------------------------------------------- */

/* True for an absent value: a plain "", "~" or "null". */
bool cfg_is_null(const yaml_node_t *v);

/*
 * The text of a scalar value, or NULL after the error "WHAT: expected
 * EXPECT" (a mapping, a sequence or nothing where a value belongs) or
 * "WHAT: contains a NUL byte".  Borrowed from the document.
 */
const char *cfg_scalar(struct loader *ld, const char *what, yaml_node_t *v,
    const char *expect);

/* The text of mapping key k, or NULL after an error naming `where` (as in
 * struct schema; may be NULL).  Borrowed from the document. */
const char *cfg_key_name(struct loader *ld, yaml_node_t *k, const char *where);

/* A copy of string v in *dst (freeing what *dst held), empty only if
 * empty_ok.  Returns 0, or -1 with the error set (*dst unchanged). */
int cfg_parse_string(struct loader *ld, const char *what, yaml_node_t *v,
    bool empty_ok, char **dst);

/* Index of v in names[0..n), or -1 after "WHAT: expected EXPECT". */
int cfg_parse_enum(struct loader *ld, const char *what, yaml_node_t *v,
    const char *const *names, size_t n, const char *expect);

/* --- mappings --------------------------------------------------------- */

/*
 * Fill base from mapping `map` as schema s says, each key with its
 * field's type and bounds (F_CUSTOM: its parse()).  A null value (`redis:`
 * with nothing after it) is an empty mapping.  If seen is not NULL (an
 * array of MAX_FIELDS, zeroed) it gets, for each field of s, the value node
 * given or NULL, for checks that span fields.  Returns 0, or -1 with the
 * error set; what was filled before the error stays in base, for its owner
 * to free.
 */
int cfg_walk_mapping(struct loader *ld, const char *what, yaml_node_t *map,
    const struct schema *s, void *base, yaml_node_t **seen);

/* --- reload ----------------------------------------------------------- */

/*
 * For each key of s (and of its sections, through field.sub) flagged
 * F_START_ONLY whose value differs between the structs at a and b, call
 * fn("PREFIXKEY", arg).  Returns how many.
 */
size_t cfg_start_changes(const struct schema *s, const char *a, const char *b,
    void (*fn)(const char *key, void *arg), void *arg);

/*
 * For each key of s (and of its sections) flagged F_START_ONLY, copy the
 * value of the struct at src into the one at dst, strings and lists
 * duplicated, freeing what dst held.  Returns 0, or -1 out of memory (dst
 * then holds some keys of each, all its own: free it whole).
 */
int cfg_keep_start(const struct schema *s, char *dst, const char *src);

#endif
