/*
 * fuzz_template.c - libFuzzer target: key templates and patterns
 * (src/core/rules.c).  The input up to the first NUL is a template, then a
 * pattern (glob, exact, or ~regex), then attribute values; each compiles
 * or is refused, and a compiled one renders within its buffer.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rules.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct key_template t;
	struct pattern pat;
	struct attrs a = { 0 };
	char *buf, *tpl, *pt, *val, err[256], out[RL_MAX_KEY_BYTES + 1];
	size_t n;

	if ((buf = malloc(size + 3)) == NULL)
		return 0;
	memcpy(buf, data, size);
	buf[size] = buf[size + 1] = buf[size + 2] = '\0';
	tpl = buf;
	pt = tpl + strlen(tpl) + 1;
	if (pt > buf + size)
		pt = buf + size + 1;
	val = pt + strlen(pt) + 1;
	if (val > buf + size + 1)
		val = buf + size + 2;
	(void)attrs_set(&a, "ip", val);
	(void)attrs_set(&a, "user", pt);
	(void)attrs_set(&a, "header.x-user", tpl);
	if (template_compile(&t, tpl, err, sizeof(err)) == 0) {
		if (template_render(&t, &a, out, sizeof(out), &n) ==
			RENDER_OK &&
		    (n >= sizeof(out) || strlen(out) != n))
			__builtin_trap();
		template_free(&t);
	}
	if (strlen(pt) < 256 &&
	    pattern_compile(&pat, pt, err, sizeof(err)) == 0) {
		(void)pattern_matches(&pat, val);
		pattern_free(&pat);
	}
	attrs_clear(&a);
	free(buf);
	return 0;
}
