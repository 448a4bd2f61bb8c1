/*
 * script_time.c - lua/ratelimit.lua with its clock fixed (see
 * script_time.h).
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "script_time.h"

#define TIME_LINE "local time = redis.call('TIME')\n"

extern const char rl_lua_ratelimit[];

/* The script split around TIME_LINE. */
static char *script_head, *script_tail;

static void
split_script(void)
{
	const char *s = rl_lua_ratelimit, *at, *again;
	size_t n = strlen(TIME_LINE);

	at = strstr(s, TIME_LINE);
	again = at != NULL ? strstr(at + n, TIME_LINE) : NULL;
	if (at == NULL || (at != s && at[-1] != '\n') || again != NULL) {
		fprintf(stderr,
		    "lua/ratelimit.lua: the line \"%.*s\" is %s; "
		    "the tests replace it to set the script's time\n",
		    (int)n - 1, TIME_LINE,
		    at == NULL	      ? "gone" :
			again != NULL ? "there twice" :
					"not a whole line");
		exit(EXIT_FAILURE);
	}
	script_head = strndup(s, (size_t)(at - s));
	script_tail = strdup(at + n);
	if (script_head == NULL || script_tail == NULL) {
		fprintf(stderr, "out of memory\n");
		exit(EXIT_FAILURE);
	}
}

char *
script_time_at(int64_t now_us)
{
	char *text;

	if (script_head == NULL)
		split_script();
	if (asprintf(&text, "%slocal time = {'%" PRId64 "', '%" PRId64 "'}\n%s",
		script_head, now_us / 1000000, now_us % 1000000,
		script_tail) == -1)
		ck_abort_msg("out of memory");
	return text;
}

redisReply *
script_time_eval(redisContext *c, int argc, const char **argv)
{
	size_t *lens;
	redisReply *rep;
	int i;

	if ((lens = calloc((size_t)argc, sizeof(*lens))) == NULL)
		ck_abort_msg("out of memory");
	for (i = 0; i < argc; i++)
		lens[i] = strlen(argv[i]);
	rep = redisCommandArgv(c, argc, argv, lens);
	free(lens);
	free((char *)argv[1]);
	ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_ARRAY,
	    "redis: %s",
	    rep == NULL			       ? c->errstr :
		rep->type == REDIS_REPLY_ERROR ? rep->str :
						 "not an array");
	return rep;
}
