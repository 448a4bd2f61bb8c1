/*
 * request_json.h - a JSON request body into attributes (docs/http.md).
 *
 * Every JSON endpoint (/acquire, /record, /stats, /release, ...) takes a
 * flat object: its top-level strings, integers and booleans are the
 * request's attributes; `null` means absent; a few names are reserved by
 * the endpoint (`cost`, `rule`, `value`, ...) and are not attributes.  This
 * module does that split once for all of them, so no endpoint parses
 * untrusted JSON its own way, and the fuzzers have one pure target.
 *
 * Pure: no I/O; jansson only.  Any thread.
 */
#ifndef RL_REQUEST_JSON_H
#define RL_REQUEST_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/rules.h"

#define REQUEST_ERROR_MAX 256

/* Why a body was refused: an error code (docs/http.md) and a message for
 * people. */
struct request_error {
	const char *code; /* "invalid_json", "invalid_attribute", ... */
	int status;	  /* 400, or 500 for out of memory */
	char message[REQUEST_ERROR_MAX];
};

/*
 * Parse body (len bytes; len 0 counts as "{}") into attributes added to
 * *a, at most max_attrs of them (0: no bound; past it
 * `too_many_attributes`).  Fields whose names are in `reserved` (a
 * NULL-terminated list, may be NULL) are not attributes: they are moved,
 * unchecked, into a new object in *fields for the endpoint to read with
 * the helpers below (NULL when the body has none of them, which the
 * helpers read as an object without the field; the caller json_decref()s
 * it, which takes NULL).  Returns 0, or -1 with *e set (invalid_json,
 * invalid_attribute, too_many_attributes, or internal_error on OOM); *a
 * may then hold some attributes, which the caller clears as usual.
 */
int request_json_parse(const char *body, size_t len,
    const char *const *reserved, size_t max_attrs, struct attrs *a,
    json_t **fields, struct request_error *e);

/* With this flag, an integer outside the int64 range (JavaScript writes
 * 1e19 as 10000000000000000000) is read as a real, a double, instead of
 * refusing the body as invalid_json; every other number keeps its type.
 * For /record and /stats, whose "value" is a double (docs/stats.md). */
#define REQUEST_JSON_BIG_INT_REAL 1u

/* request_json_parse() with flags (0 or REQUEST_JSON_BIG_INT_REAL). */
int request_json_parse_flags(const char *body, size_t len,
    const char *const *reserved, size_t max_attrs, struct attrs *a,
    json_t **fields, unsigned flags, struct request_error *e);

/*
 * Parse body (len bytes) as JSON, a name given twice refused: a new value
 * (the caller json_decref()s it), or NULL with *e set: 400 invalid_json
 * whose message says where (line and column) and what, in the daemon's
 * words for a name given twice (naming it) and for a \u0000 (docs/http.md),
 * else in jansson's; 500 internal_error on out of memory.  flags: 0 or
 * REQUEST_JSON_BIG_INT_REAL.  The value may be of any JSON type: the caller
 * checks for the object it wants.
 */
json_t *request_json_load(const char *body, size_t len, unsigned flags,
    struct request_error *e);

/*
 * Reserved-field readers: each reads `name` from fields (the object of
 * request_json_parse, or NULL).  A missing field, or one that is null, leaves
 * *out as it is and returns 0; a field of the wrong type or range returns -1
 * with *e set to `code`.
 */
/* An integer in [min, max]. */
int request_json_int(const json_t *fields, const char *name, int64_t min,
    int64_t max, const char *code, int64_t *out, struct request_error *e);
/* A string without NUL bytes; *out is borrowed from fields. */
int request_json_string(const json_t *fields, const char *name,
    const char *code, const char **out, struct request_error *e);

/*
 * The fields of an /acquire or /report body that are not attributes
 * (docs/http.md): cost, rule and wait_ms, NULL-terminated.  The front end
 * parses bodies with it; the config refuses these names as a rule's
 * attributes (config_rules.c), so the two cannot disagree.
 */
extern const char *const request_json_acquire_reserved[];

/* True if name is in reserved (NULL-terminated; NULL holds none). */
bool request_json_is_reserved(const char *const *reserved, const char *name);

/* Set *e (printf-style message).  Returns -1, for `return` chains. */
int request_error_set(struct request_error *e, int status, const char *code,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
