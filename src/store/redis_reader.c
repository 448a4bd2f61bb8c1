/*
 * redis_reader.c - the Redis store's reply reader (see redis_reader.h):
 * hiredis's reader with two changes, made through its table of object
 * functions.  An array header past REDIS_REPLY_ELEMENTS_MAX is refused
 * as it is read, before hiredis allocates its table; and the integers
 * and element tables of the replies a thread frees are kept for its
 * next replies.
 *
 * Thread: a reader on the thread that reads its connection; what is kept
 * is the thread's own.
 */
#include "store/redis_reader.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static redisReplyObjectFunctions bounded_fns;
static pthread_once_t bounded_once = PTHREAD_ONCE_INIT;

/*
 * What a thread keeps of the replies it frees, for its next ones: integer
 * replies, and element tables.  A script call's reply is an array of five
 * integers per check: without these, each integer is a calloc and a
 * free, and its table (16 pointers per request of three rules) a calloc
 * over 1 KiB, before which glibc merges every small block freed since
 * (docs/operations.md).  A table's room is a power of two of at least
 * VEC_MIN pointers, so that its size class is known from its element
 * count when it is freed; one table per class is kept, up to
 * VEC_MIN << (VEC_CLASSES - 1) pointers.  The reader makes and frees
 * replies on the thread that reads the connection; a pthread key's
 * destructor frees what it kept when it ends.
 */
#define VEC_MIN	    16
#define VEC_CLASSES 9
static const size_t ints_kept = UTIL_KEEP(1024);
static const size_t tables_kept = UTIL_KEEP(VEC_CLASSES); /* classes */
struct kept_replies {
	redisReply *ints; /* linked by element */
	size_t nints;
	redisReply **vecs[VEC_CLASSES];
	bool armed; /* the destructor is */
};
static _Thread_local struct kept_replies kept;
static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

static void
kept_drop(void *unused)
{
	redisReply *r;
	size_t k;

	(void)unused;
	while ((r = kept.ints) != NULL) {
		kept.ints = (redisReply *)(void *)r->element;
		rl_free(r);
	}
	kept.nints = 0;
	for (k = 0; k < VEC_CLASSES; k++) {
		rl_free(kept.vecs[k]);
		kept.vecs[k] = NULL;
	}
	kept.armed = false;
}

static void
kept_init(void)
{
	(void)pthread_key_create(&kept_key, kept_drop);
}

/* About to keep something: arm the destructor, once per thread (it runs
 * only for a key set to something). */
static void
kept_arm(void)
{
	if (kept.armed)
		return;
	(void)pthread_once(&kept_once, kept_init);
	(void)pthread_setspecific(kept_key, &kept);
	kept.armed = true;
}

/* The size class of a table of n > 0 elements, and its room. */
static size_t
vec_class(size_t n, size_t *room)
{
	size_t k = 0, r = VEC_MIN;

	while (r < n) {
		r *= 2;
		k++;
	}
	*room = r;
	return k;
}

static void
link_parent(const redisReadTask *task, redisReply *r)
{
	redisReply *parent;

	if (task->parent != NULL) {
		parent = task->parent->obj;
		parent->element[task->idx] = r;
	}
}

/* hiredis's createInteger, from the thread's kept replies first. */
static void *
kept_create_integer(const redisReadTask *task, long long value)
{
	redisReply *r = kept.ints;

	if (r != NULL) {
		kept.ints = (redisReply *)(void *)r->element;
		kept.nints--;
	} else if ((r = rl_malloc(sizeof(*r))) == NULL)
		return NULL;
	memset(r, 0, sizeof(*r));
	r->type = REDIS_REPLY_INTEGER;
	r->integer = value;
	link_parent(task, r);
	return r;
}

/* hiredis's createArray, bounded (hiredis 0.14 would allocate the table
 * of any "*N" it reads), its table from the thread's kept ones first. */
static void *
kept_create_array(const redisReadTask *task, int elements)
{
	redisReply *r;
	size_t room, k;

	if (elements > REDIS_REPLY_ELEMENTS_MAX)
		return NULL; /* the reader says "Out of memory" */
	if ((r = rl_calloc(1, sizeof(*r))) == NULL)
		return NULL;
	r->type = REDIS_REPLY_ARRAY;
	if (elements > 0) {
		k = vec_class((size_t)elements, &room);
		if (k < VEC_CLASSES && kept.vecs[k] != NULL) {
			r->element = kept.vecs[k];
			kept.vecs[k] = NULL;
			memset(r->element, 0,
			    (size_t)elements * sizeof(*r->element));
		} else if ((r->element = rl_calloc(k < VEC_CLASSES ?
				    room :
				    (size_t)elements,
				sizeof(*r->element))) == NULL) {
			rl_free(r);
			return NULL;
		}
		r->elements = (size_t)elements;
	}
	link_parent(task, r);
	return r;
}

/* hiredis's freeReplyObject, integers and tables kept.  Every block of a
 * reply is malloc's, so freeReplyObject() may free it too. */
static void
kept_free(void *p)
{
	redisReply *r = p;
	size_t i, k, room;

	if (r == NULL)
		return;
	switch (r->type) {
	case REDIS_REPLY_INTEGER:
		if (kept.nints >= ints_kept) {
			rl_free(r);
			return;
		}
		kept_arm();
		r->element = (redisReply **)(void *)kept.ints;
		kept.ints = r;
		kept.nints++;
		return;
	case REDIS_REPLY_ARRAY:
		for (i = 0; r->element != NULL && i < r->elements; i++)
			kept_free(r->element[i]);
		if (r->element == NULL)
			break;
		k = vec_class(r->elements, &room);
		if (k < tables_kept && kept.vecs[k] == NULL) {
			kept_arm();
			kept.vecs[k] = r->element;
		} else
			rl_free(r->element);
		break;
	case REDIS_REPLY_ERROR:
	case REDIS_REPLY_STATUS:
	case REDIS_REPLY_STRING:
		rl_free(r->str);
		break;
	default:
		break;
	}
	rl_free(r);
}

void
redis_reply_free(redisReply *r)
{
	kept_free(r);
}

/* hiredis's own functions, with its arrays bounded and integers and
 * tables kept. */
static void
bounded_init(void)
{
	redisReader *r = redisReaderCreate();

	if (r == NULL)
		return;
	bounded_fns = *r->fn;
	bounded_fns.createArray = kept_create_array;
	bounded_fns.createInteger = kept_create_integer;
	bounded_fns.freeObject = kept_free;
	redisReaderFree(r);
}

redisReader *
redis_reader_new(void)
{
	pthread_once(&bounded_once, bounded_init);
	if (bounded_fns.createArray != kept_create_array)
		return NULL;
	return redisReaderCreateWithFunctions(&bounded_fns);
}
