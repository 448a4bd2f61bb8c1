/*
 * config_rules.c - the rules: section of the rules file
 * (docs/configuration.md): a sequence of rules, each a key table for the
 * engine in config_table.c (name, match, key, limit, window, algorithm,
 * cost, shadow), then the checks that span keys and rules: required keys,
 * no reserved field of /acquire as an attribute unless gRPC is on, cost
 * within the limit, a token bucket's limit within what its window can
 * space out, and names unique among rules and stats.
 *
 * Match patterns and key templates are compiled here (core/rules.h), so
 * that a bad regex or template is an error at its line and column, and an
 * attribute that could never be present (an upper-case header name, a
 * reserved field of the request body) is refused rather than left to never
 * match.  The name, match and key parsers, and the reserved-field check,
 * are shared with the stats (config_stats.c).
 */
#include "core/config_priv.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/request_json.h"
#include "core/rules.h"
#include "base/util.h"

/*
 * Attribute names (in match and in key templates) use the rule-name
 * alphabet.  Header attributes are always lower-case (docs/http.md), so an
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
		cfg_errf(ld, at, "%s: bad attribute name %s", what,
		    cfg_quote(q, name));
		return -1;
	}
	if (strncmp(name, "header.", 7) == 0) {
		for (c = name; *c != '\0'; c++) {
			if (*c >= 'A' && *c <= 'Z') {
				cfg_errf(ld, at,
				    "%s: attribute %s is never "
				    "present: header names are lower-case",
				    what, cfg_quote(q, name));
				return -1;
			}
		}
	}
	return 0;
}

int
cfg_parse_rule_name(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst)
{
	char q[QUOTE_MAX];
	const char *s;

	if ((s = cfg_scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (!rule_name_is_valid(s)) {
		cfg_errf(ld, v,
		    "bad rule name %s: use letters, digits, '_', "
		    "'.' and '-'",
		    cfg_quote(q, s));
		return -1;
	}
	if (strlen(s) > RL_MAX_NAME_BYTES) {
		cfg_errf(ld, v, "rule name %s is longer than %d bytes",
		    cfg_quote(q, s), RL_MAX_NAME_BYTES);
		return -1;
	}
	return cfg_parse_string(ld, what, v, false, dst);
}

/* match: attribute -> pattern.  dst: the struct rule. */
int
cfg_parse_match(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct rule *r = dst;
	yaml_node_pair_t *p;
	char q[QUOTE_MAX], path[64], perr[256];
	size_t n, i;

	if (cfg_is_null(v))
		return 0;
	if (v->type != YAML_MAPPING_NODE) {
		cfg_errf(ld, v, "%s: expected a mapping of attribute: pattern",
		    what);
		return -1;
	}
	n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
	if (n == 0)
		return 0;
	if ((r->match = rl_calloc(n, sizeof(*r->match))) == NULL)
		return cfg_oom(ld);
	for (p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *k = yaml_document_get_node(ld->doc, p->key);
		yaml_node_t *pv = yaml_document_get_node(ld->doc, p->value);
		struct rule_match m = { 0 };
		const char *attr, *src;

		if ((attr = cfg_key_name(ld, k, what)) == NULL ||
		    check_attr_name(ld, what, k, attr) != 0)
			return -1;
		for (i = 0; i < r->nmatch; i++) {
			if (strcmp(r->match[i].attr, attr) == 0) {
				cfg_errf(ld, k, "duplicate key %s in match",
				    cfg_quote(q, attr));
				return -1;
			}
		}
		snprintf(path, sizeof(path), "%s.%s", what, attr);
		if ((src = cfg_scalar(ld, path, pv, "a pattern string")) ==
		    NULL)
			return -1;
		if (pattern_compile(&m.pattern, src, perr, sizeof(perr)) != 0) {
			/* Only a regex can be wrong: 'bad regex "(": ...' */
			if (src[0] != '~' || strcmp(perr, "out of memory") == 0)
				return cfg_oom(ld);
			cfg_errf(ld, pv, "%s", perr);
			return -1;
		}
		if ((m.attr = rl_strdup(attr)) == NULL) {
			pattern_free(&m.pattern);
			return cfg_oom(ld);
		}
		r->match[r->nmatch++] = m;
	}
	return 0;
}

/* key: a template.  dst: the rule's struct key_template *. */
int
cfg_parse_key(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct key_template **out = dst, *t;
	char terr[256], name[128];
	const char *s;
	size_t i;

	if ((s = cfg_scalar(ld, what, v, "a string")) == NULL)
		return -1;
	if (*s == '\0') {
		cfg_errf(ld, v,
		    "%s: must not be empty (leave it out for one "
		    "counter per rule)",
		    what);
		return -1;
	}
	if ((t = rl_calloc(1, sizeof(*t))) == NULL)
		return cfg_oom(ld);
	if (template_compile(t, s, terr, sizeof(terr)) != 0) {
		rl_free(t);
		if (strcmp(terr, "out of memory") == 0)
			return cfg_oom(ld);
		cfg_errf(ld, v, "%s", terr); /* 'key template "${": ...' */
		return -1;
	}
	*out = t; /* the rule owns it from here */
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

/* "WHAT: attribute "NAME" is never present: NAME is a reserved field of
 * WHY" at node at when name is in reserved; else 0. */
static int
check_reserved(struct loader *ld, const char *what, yaml_node_t *at,
    const char *name, const char *const *reserved, const char *why)
{
	char q[QUOTE_MAX];

	if (!request_json_is_reserved(reserved, name))
		return 0;
	cfg_errf(ld, at,
	    "%s: attribute %s is never present: %s is a reserved field of "
	    "%s",
	    what, cfg_quote(q, name), name, why);
	return -1;
}

int
cfg_check_reserved(struct loader *ld, const struct rule *r, yaml_node_t *match,
    yaml_node_t *key, const char *const *reserved, const char *why)
{
	yaml_node_pair_t *p;
	char name[128];
	size_t i;

	/* The match keys from the document, for their places (the walk
	 * parsed them: each is a scalar). */
	if (match != NULL && match->type == YAML_MAPPING_NODE) {
		for (p = match->data.mapping.pairs.start;
		     p < match->data.mapping.pairs.top; p++) {
			yaml_node_t *k = yaml_document_get_node(ld->doc,
			    p->key);

			if (k != NULL && k->type == YAML_SCALAR_NODE &&
			    check_reserved(ld, "match", k,
				(const char *)k->data.scalar.value, reserved,
				why) != 0)
				return -1;
		}
	}
	for (i = 0; key != NULL && r->key != NULL && i < r->key->nparts; i++) {
		const struct template_part *tp = &r->key->parts[i];

		if (!tp->is_attr)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)tp->len, tp->text);
		if (check_reserved(ld, "key", key, name, reserved, why) != 0)
			return -1;
	}
	return 0;
}

static int
parse_algorithm(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	static const char expect[] =
	    "sliding_log, sliding_window, fixed_window, token_bucket or "
	    "concurrency";
	const char *s;

	if ((s = cfg_scalar(ld, what, v, expect)) == NULL)
		return -1;
	if (rl_algorithm_parse(s, dst) != 0) {
		cfg_errf(ld, v, "%s: expected %s", what, expect);
		return -1;
	}
	return 0;
}

/* prefetch: { max_units, hold } (docs/algorithms.md, "Taking quota in
 * advance"). */
#define PU(f) offsetof(struct rule, f)
/* clang-format off */
static const struct field prefetch_fields[] = {
	{ "max_units", F_INT64,    PU(prefetch_units), 1, RL_MAX_LIMIT, NULL, 0,
	    NULL },
	{ "hold",      F_DURATION, PU(prefetch_hold_ms), 1, 60000, NULL, 0,
	    NULL },
};
/* clang-format on */
#undef PU

static const struct schema prefetch_schema = { "prefetch", "prefetch.",
	prefetch_fields, NELEM(prefetch_fields) };

static int
parse_prefetch(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	yaml_node_t *seen[MAX_FIELDS] = { NULL };
	struct rule *r = dst;

	if (v->type != YAML_MAPPING_NODE) {
		cfg_errf(ld, v, "%s: expected a mapping { max_units, hold }",
		    what);
		return -1;
	}
	if (cfg_walk_mapping(ld, what, v, &prefetch_schema, r, seen) != 0)
		return -1;
	if (seen[0] == NULL || seen[1] == NULL) {
		cfg_errf(ld, v, "%s: needs both \"max_units\" and \"hold\"",
		    what);
		return -1;
	}
	return 0;
}

enum {
	RF_NAME,
	RF_MATCH,
	RF_KEY,
	RF_LIMIT,
	RF_WINDOW,
	RF_ALGORITHM,
	RF_COST,
	RF_SHADOW,
	RF_PREFETCH
};

#define RU(f) offsetof(struct rule, f)
/* clang-format off */
static const struct field rule_fields[] = {
	[RF_NAME] =      { "name",      F_CUSTOM,   RU(name), 0, 0,
	    cfg_parse_rule_name, 0, NULL },
	[RF_MATCH] =     { "match",     F_CUSTOM,   0, 0, 0, cfg_parse_match, 0,
	    NULL },
	[RF_KEY] =       { "key",       F_CUSTOM,   RU(key), 0, 0,
	    cfg_parse_key, 0, NULL },
	[RF_LIMIT] =     { "limit",     F_INT64,    RU(limit), 1, RL_MAX_LIMIT,
	    NULL, 0, NULL },
	[RF_WINDOW] =    { "window",    F_DURATION, RU(window_ms), 1,
	    RL_MAX_WINDOW_MS, NULL, 0, NULL },
	[RF_ALGORITHM] = { "algorithm", F_CUSTOM,   RU(algorithm), 0, 0,
	    parse_algorithm, 0, NULL },
	[RF_COST] =      { "cost",      F_INT64,    RU(cost), 0, RL_MAX_LIMIT,
	    NULL, 0, NULL },
	[RF_SHADOW] =    { "shadow",    F_BOOL,     RU(shadow), 0, 0, NULL, 0,
	    NULL },
	[RF_PREFETCH] =  { "prefetch",  F_CUSTOM,   0, 0, 0, parse_prefetch, 0,
	    NULL },
};
/* clang-format on */
#undef RU

_Static_assert(NELEM(rule_fields) <= MAX_FIELDS, "raise MAX_FIELDS");

static const struct schema rule_schema = { "rule", "", rule_fields,
	NELEM(rule_fields) };

/*
 * Is grpc_listen given?  A gRPC descriptor's entries are attributes of any
 * name (docs/grpc.md), the reserved fields of /acquire too; without gRPC
 * those never are.  Looked up in the document, since grpc_listen may come
 * after the rules; a bad value is refused by its own parser.
 */
static bool
grpc_is_on(struct loader *ld)
{
	yaml_node_t *root = yaml_document_get_root_node(ld->doc), *k;
	yaml_node_pair_t *p;

	if (root == NULL || root->type != YAML_MAPPING_NODE)
		return false;
	for (p = root->data.mapping.pairs.start;
	     p < root->data.mapping.pairs.top; p++) {
		k = yaml_document_get_node(ld->doc, p->key);
		if (k != NULL && k->type == YAML_SCALAR_NODE &&
		    strcmp((const char *)k->data.scalar.value, "grpc_listen") ==
			0)
			return true;
	}
	return false;
}

/* Parse rules[r->index] from node v into r, checking it against the rules
 * before it; grpc: grpc_listen is given. */
static int
parse_rule(struct loader *ld, yaml_node_t *v, struct config *c, struct rule *r,
    bool grpc)
{
	yaml_node_t *seen[MAX_FIELDS] = { NULL };
	char q[QUOTE_MAX];

	if (v->type != YAML_MAPPING_NODE) {
		cfg_errf(ld, v, "rules: each rule must be a mapping");
		return -1;
	}
	r->algorithm = RL_ALG_SLIDING_LOG;
	r->cost = 1;
	r->shadow = false;
	if (cfg_walk_mapping(ld, "rule", v, &rule_schema, r, seen) != 0)
		return -1;
	if (seen[RF_NAME] == NULL) {
		cfg_errf(ld, v, "rule is missing \"name\"");
		return -1;
	}
	if (seen[RF_LIMIT] == NULL || seen[RF_WINDOW] == NULL) {
		cfg_errf(ld, v, "rule %s is missing \"%s\"",
		    cfg_quote(q, r->name),
		    seen[RF_LIMIT] == NULL ? "limit" : "window");
		return -1;
	}
	if (!grpc &&
	    cfg_check_reserved(ld, r, seen[RF_MATCH], seen[RF_KEY],
		request_json_acquire_reserved,
		"/acquire and /report, and no gRPC descriptor gives it "
		"without grpc_listen") != 0)
		return -1;
	if (r->cost > r->limit) {
		cfg_errf(ld, seen[RF_COST],
		    "cost: %" PRId64
		    " is larger than "
		    "limit %" PRId64,
		    r->cost, r->limit);
		return -1;
	}
	/* A lease is held until released: nothing to take in advance. */
	if (r->algorithm == RL_ALG_CONCURRENCY && r->prefetch_units > 0) {
		cfg_errf(ld, seen[RF_PREFETCH],
		    "prefetch: not for a concurrency rule (its units are "
		    "leases)");
		return -1;
	}
	/* GCRA spaces units window/limit apart on a microsecond clock: a
	 * smaller step would round to 0 and admit without bound. */
	if (r->algorithm == RL_ALG_TOKEN_BUCKET &&
	    r->limit > r->window_ms * 1000) {
		cfg_errf(ld, seen[RF_LIMIT],
		    "limit: token_bucket needs at "
		    "least 1us of window per unit (limit <= %" PRId64
		    " for "
		    "this window)",
		    r->window_ms * 1000);
		return -1;
	}
	if (cfg_rule_index_put(c, r) != NULL) {
		cfg_errf(ld, seen[RF_NAME], "duplicate rule name %s",
		    cfg_quote(q, r->name));
		return -1;
	}
	if (config_find_stat(c, r->name) != NULL) {
		cfg_errf(ld, seen[RF_NAME],
		    "rule name %s is the name of a "
		    "stat",
		    cfg_quote(q, r->name));
		return -1;
	}
	return 0;
}

/* rules: a sequence of rule mappings.  dst: the struct config. */
int
cfg_parse_rules(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct config *c = dst;
	yaml_node_item_t *it;
	bool grpc = grpc_is_on(ld);
	size_t n;

	if (cfg_is_null(v))
		return 0;
	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_errf(ld, v, "%s: expected a sequence of rules", what);
		return -1;
	}
	n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	if (n == 0)
		return 0;
	if ((c->rules = rl_calloc(n, sizeof(*c->rules))) == NULL ||
	    cfg_rule_index_init(c, n) == -1)
		return cfg_oom(ld);
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top;
	     it++) {
		struct rule *r = &c->rules[c->nrules];

		/* Counted before parsing, so that a half-built rule is freed
		 * with the config (rule_free_contents takes zeroed fields). */
		r->index = c->nrules++;
		if (parse_rule(ld, yaml_document_get_node(ld->doc, *it), c, r,
			grpc) != 0)
			return -1;
	}
	return 0;
}
