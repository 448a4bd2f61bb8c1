/*
 * script_time.h - lua/ratelimit.lua as the daemon sends it, with its clock
 * fixed: the tests that compare the script's answers exactly
 * (check_vectors_redis, check_batch_merge) run it with EVAL at a time of
 * their choosing instead of Redis's TIME.
 *
 * Thread: the test's.  The script is split once, at the first call.
 */
#ifndef RL_TEST_SCRIPT_TIME_H
#define RL_TEST_SCRIPT_TIME_H

#include <stdint.h>

#include <hiredis/hiredis.h>

/* The compiled-in script with its line "local time = redis.call('TIME')"
 * replaced by the time now_us (microseconds).  The caller frees it.
 * Exits the test binary if the line is not there exactly once, as a
 * whole line. */
char *script_time_at(int64_t now_us);

/* Send argv[0 .. argc - 1] (EVAL, a script_time_at() text in argv[1],
 * which this frees, then its keys and arguments) on c, and fail the test
 * unless the reply is an array.  The caller frees the reply. */
redisReply *script_time_eval(redisContext *c, int argc, const char **argv);

#endif
