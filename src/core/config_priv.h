/*
 * config_priv.h - private to the config module (src/core/config*.c): the
 * section parsers and key tables that one file of the YAML loader hands
 * another.  Nothing outside src/core/config*.c includes it; the public
 * interface is core/config.h.
 *
 * config.c holds the top-level key table (and the auth section, which lives
 * in struct config itself) and points from it at the sections below:
 * config_store.c (redis, redis.sentinel, memory), config_rules.c (rules)
 * and config_stats.c (stats, which reuse the rule parsers).  All of them are
 * built on the table engine, config_table.h.
 *
 * Every parser here is a field_parse_fn: `what` names the key in messages,
 * v is its value node, dst the field's address; it returns 0, or -1 with
 * the error set on ld.  What it allocated before an error stays in dst for
 * config_unref() to free.  Called only during a load, on its thread.
 */
#ifndef RL_CONFIG_PRIV_H
#define RL_CONFIG_PRIV_H

#include <stdbool.h>
#include <stddef.h>

#include "core/config.h"
#include "core/config_table.h"

/* --- config.c ---------------------------------------------------------- */

/* Where key's value is, from the seen nodes of a cfg_walk_mapping() of s
 * ({0, 0} when the key was not given). */
struct config_place cfg_place_of(const struct schema *s,
    yaml_node_t *const seen[MAX_FIELDS], const char *key);

/* --- config_store.c ---------------------------------------------------- */

/* The redis and memory key tables, for the reload comparison of their
 * start-only keys (struct field.sub of the top-level table). */
extern const struct schema cfg_redis_schema;
extern const struct schema cfg_memory_schema;

/* redis: its keys, redis.sentinel, and the checks across them (cluster or
 * sentinel, not both; a cluster URL gives credentials only).  dst: the
 * struct redis_config. */
int cfg_parse_redis(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst);

/*
 * The checks across the keys of redis (docs/configuration.md): cluster or
 * sentinel, not both; a cluster URL gives credentials only (db 0, TCP); no
 * '{' in key_prefix with a cluster; TLS needs a TCP address.  0, or -1
 * with the reason in err (*oom_out set when it is "out of memory").  Run
 * on the redis section as loaded, again when RATELIMITD_REDIS_URL
 * replaces redis.url, and on a reload once the start-only keys are kept.
 * rc is borrowed.
 */
int cfg_redis_check(const struct redis_config *rc, char *err, size_t errlen,
    bool *oom_out);

/* Give dst a copy of src (a reload keeping the running redis.tls: TLS
 * turned on or off applies at the next start).  0, or -1 out of memory
 * (dst unchanged). */
int cfg_redis_tls_keep(struct redis_tls_config *dst,
    const struct redis_tls_config *src);

/* memory: its keys.  dst: the struct memory_config. */
int cfg_parse_memory(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst);

/*
 * True iff url parses as a Redis address; else false with the (redacted)
 * reason in err, and *oom_out set when that reason is "out of memory".
 * Shared by redis.url and RATELIMITD_REDIS_URL.
 */
bool cfg_redis_url_is_valid(const char *url, char *err, size_t errlen,
    bool *oom_out);

/* --- config_rules.c ---------------------------------------------------- */

/* rules: a sequence of rule mappings, each checked against the rules before
 * it and the stats already loaded.  dst: the struct config (rules,
 * nrules). */
int cfg_parse_rules(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst);

/* The rule index (config.c): room for n rules; 0, or -1 out of memory.
 * Then each rule by its name: NULL once r is in, or the rule that already
 * has that name (r is then not put in). */
int cfg_rule_index_init(struct config *c, size_t n);
const struct rule *cfg_rule_index_put(struct config *c, const struct rule *r);

/* A rule's or a stat's name: the rule-name alphabet, at most
 * RL_MAX_NAME_BYTES.  dst: the char *name. */
int cfg_parse_rule_name(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst);

/* match: attribute -> pattern, each compiled.  dst: the struct rule
 * (match, nmatch). */
int cfg_parse_match(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst);

/* key: a template, compiled, its attribute names checked.  dst: the rule's
 * struct key_template *, which the rule owns from then on. */
int cfg_parse_key(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst);

/*
 * A reserved field of the request body (reserved, NULL-terminated: one
 * that is never an attribute) named by r's match, whose node is match, or
 * by its key template, whose node is key (either NULL: not given): the
 * error "WHAT: attribute "NAME" is never present: NAME is a reserved field
 * of WHY" at that key of match, or at key, and -1; else 0.
 */
int cfg_check_reserved(struct loader *ld, const struct rule *r,
    yaml_node_t *match, yaml_node_t *key, const char *const *reserved,
    const char *why);

/* --- config_stats.c ---------------------------------------------------- */

/* stats: a sequence of stat mappings, each checked against the stats before
 * it and the rules.  dst: the struct config (stats, nstats). */
int cfg_parse_stats(struct loader *ld, const char *what, yaml_node_t *v,
    void *dst);

#endif
