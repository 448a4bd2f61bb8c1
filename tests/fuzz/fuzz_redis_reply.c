/*
 * fuzz_redis_reply.c - libFuzzer target: bytes from a Redis server through
 * hiredis's reply reader into a batch's results (src/store/redis_script.c),
 * as the Redis store reads them (redis_reader_new).  A reply of the wrong
 * shape must be an error, never a read past the reply, a write past the
 * results, or a huge allocation ("*1333333333" once asked for 10 GB).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "store/redis_conn.h"
#include "store/redis_reader.h"
#include "store/redis_script.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rl_result out[3][2];
	struct backend_call calls[3], *cp[3];
	size_t counts[3] = { 1, 2, 1 }, i;
	redisReader *r;
	void *reply = NULL;
	char err[256];

	if ((r = redis_reader_new()) == NULL)
		return 0;
	memset(calls, 0, sizeof(calls));
	for (i = 0; i < 3; i++) {
		calls[i].n = counts[i];
		calls[i].out = out[i];
		cp[i] = &calls[i];
	}
	cp[1] = size > 0 && data[0] & 1 ? NULL : cp[1]; /* one answered */
	if (redisReaderFeed(r, (const char *)data, size) == REDIS_OK) {
		while (redisReaderGetReply(r, &reply) == REDIS_OK &&
		    reply != NULL) {
			(void)redis_script_decode(reply, cp, counts, 3,
			    size > 0 && data[0] & 2, err, sizeof(err));
			freeReplyObject(reply);
			reply = NULL;
		}
	}
	redisReaderFree(r);
	return 0;
}
