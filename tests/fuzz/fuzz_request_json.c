/*
 * fuzz_request_json.c - libFuzzer target: a JSON body into attributes
 * (src/core/request_json.c), as /acquire reads it, then the reserved
 * fields through the same helpers the endpoint uses.  Any input must give
 * attributes or a 400/500 error, never a crash, a leak or undefined
 * behaviour.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "core/request_json.h"
#include "core/rules.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const reserved[] = { "cost", "rule", NULL };
	struct request_error e;
	struct attrs a = { 0 };
	json_t *fields = NULL;
	const char *rule = NULL;
	int64_t cost = -1;
	size_t i;

	if (request_json_parse((const char *)data, size, reserved, 64, &a,
		&fields, &e) == 0) {
		(void)request_json_int(fields, "cost", 0, INT64_MAX,
		    "invalid_cost", &cost, &e);
		(void)request_json_string(fields, "rule", "unknown_rule", &rule,
		    &e);
		for (i = 0; i < a.n; i++)
			if (attrs_get(&a, a.v[i].name) != a.v[i].value)
				__builtin_trap();
		json_decref(fields);
	}
	attrs_clear(&a);
	return 0;
}
