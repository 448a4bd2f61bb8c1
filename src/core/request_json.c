/*
 * request_json.c - JSON request bodies into attributes (see request_json.h).
 *
 * jansson parses the whole body (bounded by max_body_bytes before it gets
 * here) with JSON_REJECT_DUPLICATES, so a name given twice is an error
 * rather than a choice between two values.  Without JSON_ALLOW_NUL jansson
 * refuses "\u0000" in strings; values are checked for NUL bytes all the
 * same, since one would cut a key short.  What jansson says of those two
 * refusals names its own flags or cuts the name short, so they are told in
 * the daemon's words (refusal()); any other keeps jansson's.
 */
#include "core/request_json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int
request_error_set(struct request_error *e, int status, const char *code,
    const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	e->code = code;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -1;
}

const char *const request_json_acquire_reserved[] = { "cost", "rule", "wait_ms",
	NULL };

bool
request_json_is_reserved(const char *const *reserved, const char *name)
{
	if (reserved == NULL)
		return false;
	for (; *reserved != NULL; reserved++)
		if (strcmp(*reserved, name) == 0)
			return true;
	return false;
}

/* The attribute text of v into val/vlen (num is scratch).  0, or -1 for a
 * type that is no attribute; *skip for null. */
static int
attr_text(json_t *v, char *num, size_t numlen, const char **val, size_t *vlen,
    bool *skip)
{
	*skip = false;
	switch (json_typeof(v)) {
	case JSON_STRING:
		*val = json_string_value(v);
		*vlen = json_string_length(v);
		return 0;
	case JSON_INTEGER:
		*vlen = (size_t)snprintf(num, numlen, "%lld",
		    (long long)json_integer_value(v));
		*val = num;
		return 0;
	case JSON_TRUE:
		*val = "true";
		*vlen = 4;
		return 0;
	case JSON_FALSE:
		*val = "false";
		*vlen = 5;
		return 0;
	case JSON_NULL:
		*skip = true;
		return 0;
	default:
		return -1;
	}
}

/* True if the integer text t (n bytes: an optional '-' and digits) is
 * outside the int64 range jansson reads integers into. */
static bool
int_overflows(const char *t, size_t n)
{
	char buf[24];
	char *end;

	if (n >= sizeof(buf))
		return true; /* 23 characters or more: past 2^63 */
	memcpy(buf, t, n);
	buf[n] = '\0';
	errno = 0;
	(void)strtoll(buf, &end, 10);
	return errno == ERANGE;
}

/*
 * A copy of body (*outlen bytes, rl_free() it) in which every integer
 * outside the int64 range, outside strings, is followed by ".0": jansson
 * then reads it as a real (a double), and every other number as it was.
 * *changed counts them.  NULL on out of memory.
 */
static char *
big_ints_as_reals(const char *body, size_t len, size_t *outlen, size_t *changed)
{
	/* Each integer changed has 20 characters or more and gains 2. */
	char *out = rl_malloc(len + 2 * (len / 20 + 1) + 1);
	size_t i = 0, j, o = 0;
	bool in_str = false;

	if (out == NULL)
		return NULL;
	*changed = 0;
	while (i < len) {
		char c = body[i];

		if (in_str || c == '"') {
			out[o++] = body[i++];
			if (c == '\\' && in_str && i < len)
				out[o++] = body[i++];
			else if (c == '"')
				in_str = !in_str;
			continue;
		}
		if (c != '-' && !(c >= '0' && c <= '9')) {
			out[o++] = body[i++];
			continue;
		}
		j = i + 1;
		while (j < len && body[j] >= '0' && body[j] <= '9')
			j++;
		if (j < len &&
		    (body[j] == '.' || body[j] == 'e' || body[j] == 'E')) {
			/* A real: copied whole, as it is. */
			while (j < len &&
			    strchr("0123456789.eE+-", body[j]) != NULL)
				j++;
			memcpy(out + o, body + i, j - i);
			o += j - i;
		} else {
			memcpy(out + o, body + i, j - i);
			o += j - i;
			if (int_overflows(body + i, j - i)) {
				memcpy(out + o, ".0", 2);
				o += 2;
				(*changed)++;
			}
		}
		i = j;
	}
	out[o] = '\0';
	*outlen = o;
	return out;
}

/*
 * The name jansson refused as given twice in text (len bytes), quoted for
 * a message into buf: jansson stops at the closing quote of the second
 * one, at byte pos, and names it itself only when it is short.  NULL when
 * the text there is not a name.
 */
static const char *
duplicate_name(const char *text, size_t len, size_t pos, char *buf,
    size_t buflen)
{
	size_t end = pos, start, bs;
	json_t *name;

	if (end > len || end < 2 || text[end - 1] != '"')
		return NULL;
	/* The opening quote: the first one back that no odd run of
	 * backslashes escapes (a name holds no other). */
	for (start = end - 1; start > 0; start--) {
		if (text[start - 1] != '"')
			continue;
		for (bs = 0; start - 1 > bs && text[start - 2 - bs] == '\\';)
			bs++;
		if (bs % 2 == 0)
			break;
	}
	if (start == 0)
		return NULL;
	name = json_loadb(text + start - 1, end - start + 1, JSON_DECODE_ANY,
	    NULL);
	if (!json_is_string(name)) {
		json_decref(name);
		return NULL;
	}
	util_escape(buf, buflen, json_string_value(name));
	json_decref(name);
	return buf;
}

/* jansson's refusal of text (len bytes, what it parsed) into *e: 400
 * invalid_json, in the daemon's words for a name given twice and for a
 * NUL (docs/http.md).  Returns -1. */
static int
refusal(const char *text, size_t len, const json_error_t *jerr,
    struct request_error *e)
{
	char name[72];

	switch (json_error_code(jerr)) {
	case json_error_duplicate_key:
		if (duplicate_name(text, len, (size_t)jerr->position, name,
			sizeof(name)) != NULL)
			return request_error_set(e, 400, "invalid_json",
			    "line %d column %d: the field \"%s\" is named "
			    "twice",
			    jerr->line, jerr->column, name);
		return request_error_set(e, 400, "invalid_json",
		    "line %d column %d: a field is named twice", jerr->line,
		    jerr->column);
	case json_error_null_character:
		return request_error_set(e, 400, "invalid_json",
		    "line %d column %d: a string holds \\u0000 (NUL), which "
		    "no value may",
		    jerr->line, jerr->column);
	case json_error_null_byte_in_key:
		return request_error_set(e, 400, "invalid_json",
		    "line %d column %d: a field name holds \\u0000 (NUL), "
		    "which no name may",
		    jerr->line, jerr->column);
	default:
		return request_error_set(e, 400, "invalid_json",
		    "line %d column %d: %s", jerr->line, jerr->column,
		    jerr->text);
	}
}

json_t *
request_json_load(const char *body, size_t len, unsigned flags,
    struct request_error *e)
{
	json_t *root;
	json_error_t jerr;
	size_t n, changed;
	char *copy;

	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	if (root != NULL)
		return root;
	/* With REQUEST_JSON_BIG_INT_REAL, a body refused for an integer
	 * past int64 is read again with such integers as reals. */
	if (!(flags & REQUEST_JSON_BIG_INT_REAL) ||
	    json_error_code(&jerr) != json_error_numeric_overflow) {
		refusal(body, len, &jerr, e);
		return NULL;
	}
	if ((copy = big_ints_as_reals(body, len, &n, &changed)) == NULL) {
		request_error_set(e, 500, "internal_error", "out of memory");
		return NULL;
	}
	if (changed == 0)
		refusal(body, len, &jerr, e);
	else if ((root = json_loadb(copy, n, JSON_REJECT_DUPLICATES, &jerr)) ==
	    NULL)
		refusal(copy, n, &jerr, e); /* where it is in the copy */
	rl_free(copy);
	return root;
}

int
request_json_parse(const char *body, size_t len, const char *const *reserved,
    size_t max_attrs, struct attrs *a, json_t **fields, struct request_error *e)
{
	return request_json_parse_flags(body, len, reserved, max_attrs, a,
	    fields, 0, e);
}

int
request_json_parse_flags(const char *body, size_t len,
    const char *const *reserved, size_t max_attrs, struct attrs *a,
    json_t **fields, unsigned flags, struct request_error *e)
{
	json_t *root = NULL, *v;
	const char *name;
	char num[32];
	size_t nattrs = 0;

	*fields = NULL;
	if (len == 0)
		return 0; /* no body: no attributes */
	if ((root = request_json_load(body, len, flags, e)) == NULL)
		goto fail;
	if (!json_is_object(root)) {
		request_error_set(e, 400, "invalid_json",
		    "the body must be a JSON object");
		goto fail;
	}
	json_object_foreach(root, name, v)
	{
		const char *val = NULL;
		size_t vlen = 0;
		bool skip;

		if (request_json_is_reserved(reserved, name)) {
			/* made for the first: most bodies have none */
			if ((*fields == NULL &&
				(*fields = json_object()) == NULL) ||
			    json_object_set(*fields, name, v) != 0)
				goto oom;
			continue;
		}
		if (attr_text(v, num, sizeof(num), &val, &vlen, &skip) < 0) {
			request_error_set(e, 400, "invalid_attribute",
			    "attribute \"%.64s\" must be a string, integer "
			    "or boolean",
			    name);
			goto fail;
		}
		if (skip)
			continue; /* null: the attribute is absent */
		if (memchr(val, '\0', vlen) != NULL) {
			request_error_set(e, 400, "invalid_attribute",
			    "attribute \"%.64s\" contains a NUL byte", name);
			goto fail;
		}
		if (max_attrs > 0 && ++nattrs > max_attrs) {
			request_error_set(e, 400, "too_many_attributes",
			    "more than %zu attributes", max_attrs);
			goto fail;
		}
		if (attrs_setn(a, name, val, vlen) < 0)
			goto oom;
	}
	json_decref(root);
	return 0;

oom:
	request_error_set(e, 500, "internal_error", "out of memory");
fail:
	json_decref(root);
	json_decref(*fields);
	*fields = NULL;
	return -1;
}

/* The reserved-field readers take null as absent, as an attribute's null
 * is (docs/http.md): {"cost": null} is the rule's own cost. */
int
request_json_int(const json_t *fields, const char *name, int64_t min,
    int64_t max, const char *code, int64_t *out, struct request_error *e)
{
	json_t *v = json_object_get(fields, name);
	json_int_t i;

	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || (i = json_integer_value(v)) < min || i > max)
		return request_error_set(e, 400, code,
		    "%s must be an integer from %lld to %lld", name,
		    (long long)min, (long long)max);
	*out = i;
	return 0;
}

int
request_json_string(const json_t *fields, const char *name, const char *code,
    const char **out, struct request_error *e)
{
	json_t *v = json_object_get(fields, name);

	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_string(v) ||
	    memchr(json_string_value(v), '\0', json_string_length(v)) != NULL)
		return request_error_set(e, 400, code, "%s must be a string",
		    name);
	*out = json_string_value(v);
	return 0;
}
