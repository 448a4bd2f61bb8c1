/*
 * memory.h - the in-process store (backend_memory.c): every algorithm of
 * core/limiter.c behind the core/backend.h interface, answering inline.
 * Used as the configured store (redis absent) and as the local fallback
 * of on_backend_error: local.
 */
#ifndef RL_STORE_MEMORY_H
#define RL_STORE_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"

/*
 * The in-process store.  max_keys bounds the number of live keys (expired
 * keys are reclaimed first; a full store answers BACKEND_ERR_FULL).  clock
 * returns microseconds on a monotonic-enough scale; NULL means
 * util_realtime_us.  Returns a new backend, or NULL (OOM).
 */
typedef int64_t (*backend_clock_fn)(void *arg);
struct backend *backend_memory_new(int64_t max_keys, backend_clock_fn clock,
    void *clock_arg);
/* Live keys now (for tests and metrics).  Any thread. */
size_t backend_memory_key_count(struct backend *b);

#endif
