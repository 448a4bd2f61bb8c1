/*
 * redis_reader.h - the hiredis reply reader every Redis connection of the
 * store uses (redis_conn.c): bounded, and keeping what it frees.
 *
 * Thread: a reader on one thread at a time; redis_reply_free() on the
 * thread that read the reply.
 */
#ifndef RL_STORE_REDIS_READER_H
#define RL_STORE_REDIS_READER_H

#include <hiredis/hiredis.h>

/*
 * A hiredis reply reader that refuses an array of more than
 * REDIS_REPLY_ELEMENTS_MAX elements (an error, "Out of memory"): hiredis
 * 0.14 allocates the element table as soon as it reads "*N", so one line
 * from a server could make it ask for gigabytes.  Free with
 * redisReaderFree().  NULL on OOM.  Any thread.
 */
#define REDIS_REPLY_ELEMENTS_MAX (1 << 20)
redisReader *redis_reader_new(void);
/* Free a reply that such a reader read, keeping its integers and its
 * element tables for the thread's next replies (a script call's reply is
 * five integers per check).  freeReplyObject() frees it too, keeping
 * nothing. */
void redis_reply_free(redisReply *r);

#endif
