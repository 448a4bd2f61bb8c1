/*
 * config_stats.c - the stats: section of the rules file (docs/stats.md,
 * docs/configuration.md): a sequence of stats, each named, matched and
 * keyed as a rule is (with the rule parsers of config_rules.c) and given a
 * window, a resolution and a relative accuracy instead of a limit.  Each
 * is a key table for the engine in config_table.c, then the checks that
 * span keys: required keys, no reserved field of /record as an attribute
 * (value, stat, quantiles: they never are one), a window the sketch can
 * divide (stats_window_params_set()), and names unique among stats and
 * rules.
 */
#include "core/config_priv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/stats_request.h"
#include "core/stats_window.h"
#include "base/util.h"

/* relative_accuracy: a number in [SKETCH_MIN_ACCURACY, SKETCH_MAX_ACCURACY].
 * dst: a double. */
static int
parse_accuracy(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	const char *s;
	char *end;
	double a;

	if ((s = cfg_scalar(ld, what, v, "a number")) == NULL)
		return -1;
	errno = 0;
	a = strtod(s, &end);
	if (*s == '\0' || *end != '\0' || errno != 0 ||
	    !(a >= SKETCH_MIN_ACCURACY && a <= SKETCH_MAX_ACCURACY)) {
		cfg_errf(ld, v, "%s: expected a number from %g to %g", what,
		    SKETCH_MIN_ACCURACY, SKETCH_MAX_ACCURACY);
		return -1;
	}
	*(double *)dst = a;
	return 0;
}

enum { SF_NAME, SF_MATCH, SF_KEY, SF_WINDOW, SF_RESOLUTION, SF_ACCURACY };

#define SD(f) offsetof(struct stat_def, f)
/* clang-format off */
static const struct field stat_fields[] = {
	[SF_NAME] =       { "name",       F_CUSTOM,   SD(rule.name), 0, 0,
	    cfg_parse_rule_name, 0, NULL },
	[SF_MATCH] =      { "match",      F_CUSTOM,   SD(rule), 0, 0,
	    cfg_parse_match, 0, NULL },
	[SF_KEY] =        { "key",        F_CUSTOM,   SD(rule.key), 0, 0,
	    cfg_parse_key, 0, NULL },
	[SF_WINDOW] =     { "window",     F_DURATION, SD(rule.window_ms), 1,
	    366 * DAY_MS, NULL, 0, NULL },
	[SF_RESOLUTION] = { "resolution", F_DURATION, SD(resolution_ms), 1,
	    366 * DAY_MS, NULL, 0, NULL },
	[SF_ACCURACY] =   { "relative_accuracy", F_CUSTOM, SD(accuracy), 0, 0,
	    parse_accuracy, 0, NULL },
};
/* clang-format on */
#undef SD

_Static_assert(NELEM(stat_fields) <= MAX_FIELDS, "raise MAX_FIELDS");

static const struct schema stat_schema = { "stat", "", stat_fields,
	NELEM(stat_fields) };

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
		cfg_errf(ld, v, "stats: each stat must be a mapping");
		return -1;
	}
	sd->accuracy = 0.01;
	if (cfg_walk_mapping(ld, "stat", v, &stat_schema, sd, seen) != 0)
		return -1;
	if (seen[SF_NAME] == NULL) {
		cfg_errf(ld, v, "stat is missing \"name\"");
		return -1;
	}
	if (seen[SF_WINDOW] == NULL) {
		cfg_errf(ld, v, "stat %s is missing \"window\"",
		    cfg_quote(q, sd->rule.name));
		return -1;
	}
	/* Every stat attribute comes from a /record or /stats body. */
	if (cfg_check_reserved(ld, &sd->rule, seen[SF_MATCH], seen[SF_KEY],
		stats_request_reserved, "/record and /stats") != 0)
		return -1;
	if (seen[SF_RESOLUTION] == NULL)
		sd->resolution_ms = sd->rule.window_ms / 20 > 0 ?
		    sd->rule.window_ms / 20 :
		    1;
	if (stats_window_params_set(&wp, sd->rule.window_ms, sd->resolution_ms,
		sd->accuracy, werr, sizeof(werr)) != 0) {
		cfg_errf(ld,
		    seen[SF_RESOLUTION] != NULL ? seen[SF_RESOLUTION] :
						  seen[SF_WINDOW],
		    "stat %s: %s", cfg_quote(q, sd->rule.name), werr);
		return -1;
	}
	for (i = 0; i < index; i++) {
		if (strcmp(c->stats[i].rule.name, sd->rule.name) == 0) {
			cfg_errf(ld, seen[SF_NAME], "duplicate stat name %s",
			    cfg_quote(q, sd->rule.name));
			return -1;
		}
	}
	if (config_find_rule(c, sd->rule.name) != NULL) {
		cfg_errf(ld, seen[SF_NAME],
		    "stat name %s is the name of a "
		    "rule",
		    cfg_quote(q, sd->rule.name));
		return -1;
	}
	return 0;
}

/* stats: a sequence of stat mappings.  dst: the struct config. */
int
cfg_parse_stats(struct loader *ld, const char *what, yaml_node_t *v, void *dst)
{
	struct config *c = dst;
	yaml_node_item_t *it;
	size_t n;

	if (cfg_is_null(v))
		return 0;
	if (v->type != YAML_SEQUENCE_NODE) {
		cfg_errf(ld, v, "%s: expected a sequence of stats", what);
		return -1;
	}
	n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	if (n == 0)
		return 0;
	if ((c->stats = rl_calloc(n, sizeof(*c->stats))) == NULL)
		return cfg_oom(ld);
	for (it = v->data.sequence.items.start; it < v->data.sequence.items.top;
	     it++) {
		struct stat_def *sd = &c->stats[c->nstats];

		/* Counted first, so that a half-built stat is freed with the
		 * config. */
		c->nstats++;
		if (parse_stat(ld, yaml_document_get_node(ld->doc, *it), c, sd,
			c->nstats - 1) != 0)
			return -1;
	}
	return 0;
}
