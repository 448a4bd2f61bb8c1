/*
 * rules.h - the pure part of a rule: request attributes, match patterns and
 * key templates.  No I/O, no HTTP, no Redis: config.c compiles patterns and
 * templates once at load, http.c fills attributes, decide.c asks which rules
 * apply and renders their keys.
 *
 * Patterns (docs/configuration.md) match a whole value, case-sensitively:
 *   "POST"          exact
 *   "/login*"       glob, '*' any run of bytes (also '/'), '?' one byte
 *   "~^/v[0-9]+/"   POSIX extended regex, searched (unanchored) in the value
 * Templates render "${name}" from attributes; any other byte is literal, and
 * "$$" is a literal '$'.  A name is [A-Za-z0-9_.-]+.
 */
#ifndef RL_RULES_H
#define RL_RULES_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RL_MAX_KEY_BYTES  512 /* rendered key; longer => key_too_long */
#define RL_MAX_NAME_BYTES 128 /* rule and stat names */
/* A rule's limit, and an override's (docs/configuration.md, docs/admin.md):
 * well inside the 15 digits of a Structured Fields integer (RFC 9651),
 * which RateLimit-Policy carries. */
#define RL_MAX_LIMIT 1000000000
/* A rule's window, and an override's: 366 days. */
#define RL_MAX_WINDOW_MS (INT64_C(366) * 86400000)

/* A map of string attributes, in insertion order.  Owns copies of names
 * and values (each name and its value in one allocation, freed through
 * the name).  Up to ATTRS_SCAN entries a lookup is a scan; past that an
 * open-addressing index of positions makes it O(1), so a request of many
 * attributes costs linear time, not quadratic.  One thread. */
#define ATTRS_SCAN 8

struct attr {
	char *name;
	char *value;
	uint32_t hash;
};

struct attrs {
	struct attr *v;
	size_t n, cap;
	uint32_t *idx;	/* position + 1, 0 empty; idx_cap slots */
	size_t idx_cap; /* 0, or a power of two >= 2 * n */
};

/* Set name=value (copies both), replacing an existing value.  0 or -1 (OOM). */
int attrs_set(struct attrs *a, const char *name, const char *value);
int attrs_setn(struct attrs *a, const char *name, const char *value,
    size_t valuelen);
/* Borrowed pointer valid until the attribute is replaced or cleared, or NULL.
 */
const char *attrs_get(const struct attrs *a, const char *name);
/* Free every entry; *a is then empty and reusable. */
void attrs_clear(struct attrs *a);

enum pattern_kind { PATTERN_EXACT, PATTERN_GLOB, PATTERN_REGEX };

struct pattern {
	enum pattern_kind kind;
	char *text; /* owned; for REGEX without the leading '~' */
	regex_t re; /* compiled iff kind == PATTERN_REGEX */
};

/* Compile src into *p.  Returns 0, or -1 with a message in err (e.g. the
 * regcomp error).  *p owns its memory until pattern_free(). */
int pattern_compile(struct pattern *p, const char *src, char *err,
    size_t errlen);
/* True iff value matches.  Thread-safe (regexec on a shared regex_t is). */
bool pattern_matches(const struct pattern *p, const char *value);
void pattern_free(struct pattern *p);

/* Pure glob matcher used by PATTERN_GLOB, exposed for tests. */
bool glob_match(const char *pat, const char *s);

struct template_part {
	bool is_attr; /* true: text is an attribute name */
	char *text;   /* owned */
	size_t len;
};

struct key_template {
	struct template_part *parts;
	size_t nparts;
	char *source; /* owned copy of the template text */
};

/* Compile "${ip}:${header.x-user}" into *t.  0, or -1 with err for an
 * unterminated "${", an empty or invalid name.  Owns memory until
 * template_free(). */
int template_compile(struct key_template *t, const char *src, char *err,
    size_t errlen);
void template_free(struct key_template *t);

enum render_result {
	RENDER_OK = 0,
	RENDER_MISSING = 1, /* an attribute is absent: rule does not apply */
	RENDER_TOO_LONG = 2 /* longer than buflen - 1 bytes */
};

/* Render t with attributes into buf (NUL-terminated), length in *outlen.
 * Thread-safe: t is read only. */
enum render_result template_render(const struct key_template *t,
    const struct attrs *a, char *buf, size_t buflen, size_t *outlen);

/* One entry of a rule's match: attribute `attr` must exist and match. */
struct rule_match {
	char *attr; /* owned */
	struct pattern pattern;
};

enum rl_algorithm {
	RL_ALG_SLIDING_LOG = 0,
	RL_ALG_SLIDING_WINDOW,
	RL_ALG_FIXED_WINDOW,
	RL_ALG_TOKEN_BUCKET,
	RL_ALG_CONCURRENCY /* leases held at once (docs/leases.md) */
};

/* "sliding_log" etc.  0 or -1. */
int rl_algorithm_parse(const char *s, enum rl_algorithm *out);
const char *rl_algorithm_name(enum rl_algorithm alg);

/* A compiled rule.  Owned by its struct config; read-only once loaded. */
struct rule {
	char *name;		  /* [A-Za-z0-9_.-]+, unique */
	struct rule_match *match; /* every entry must match */
	size_t nmatch;
	struct key_template *key; /* NULL: one counter for the rule */
	int64_t limit;		  /* >= 1 */
	int64_t window_ms;	  /* >= 1 */
	enum rl_algorithm algorithm;
	int64_t cost; /* default cost, >= 0 */
	bool shadow;
	/* docs/algorithms.md, "Taking quota in advance": a daemon may take
	 * up to prefetch_units units of a key in one store call and admit
	 * from them for prefetch_hold_ms.  0: not used. */
	int64_t prefetch_units;
	int64_t prefetch_hold_ms;
	size_t index; /* position in config->rules */
};

/* True iff every match entry's attribute is present and matches. */
bool rule_matches(const struct rule *r, const struct attrs *a);

/* Free everything a rule owns (not the struct itself). */
void rule_free_contents(struct rule *r);

/*
 * True iff /auth could produce every attribute r matches on and builds its
 * key from (method, path, host, ip, header.*), so that r could apply to an
 * /auth request.  --check warns with it about concurrency rules, which
 * /auth skips (docs/leases.md).
 */
bool rule_could_match_auth(const struct rule *r);

/* True iff s is a valid rule name: non-empty [A-Za-z0-9_.-]+. */
bool rule_name_is_valid(const char *s);

#endif
