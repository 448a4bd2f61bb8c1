/*
 * redis_split.h - one request whose keys live in several Redis Cluster
 * slots, decided as one part per slot and made all-or-nothing again
 * (docs/scale.md).
 *
 * A script on Redis Cluster may touch the keys of one slot only, and each
 * rule's key is its own hash tag, so the rules of one request usually fall
 * in different slots.  The request is split into one call per slot (the
 * parts), each atomic on its own node.  When every part allows, the
 * request is allowed.  When any part denies or fails, the parts that
 * recorded are taken back (lua/takeback.lua, one call per such part, with
 * the marks their script returned) before the request is answered: a
 * denied request leaves nothing behind once answered, and no rule ever
 * admits more than its limit.  For the one round trip between the parts
 * and the take-back, the units held may make another request see less
 * remaining: it may be denied, never wrongly allowed (docs/scale.md).
 *
 * No I/O here: the Redis store (redis_cluster.c) submits the parts and
 * the take-backs as ordinary calls and reports their completion.
 *
 * Thread: a split belongs to the store's I/O thread.
 */
#ifndef RL_REDIS_SPLIT_H
#define RL_REDIS_SPLIT_H

#include <stdbool.h>
#include <stddef.h>

#include "core/backend.h"

struct redis_split;

/*
 * Split parent (n >= 1 checks; slots[i] is check i's hash slot, not all
 * equal) into one part per slot.  Each part is a backend_call with
 * checks, out, deadline, done = part_done and the split as
 * redis_split_of(part).  NULL on OOM.  The parent is borrowed until
 * redis_split_answer().
 */
struct redis_split *redis_split_new(struct backend_call *parent,
    const unsigned *slots, backend_done_fn part_done, void *user);
/* The split a part or take-back belongs to, NULL for any other call of
 * the store (kept in the call's store area, redis_priv.h). */
struct redis_split *redis_split_of(struct backend_call *call);
/* The caller's pointer given to redis_split_new(). */
void *redis_split_user(const struct redis_split *s);
/* Whether redis_split_answer() ran. */
bool redis_split_answered(const struct redis_split *s);
void redis_split_free(struct redis_split *s);

size_t redis_split_nparts(const struct redis_split *s);
struct backend_call *redis_split_part(struct redis_split *s, size_t i);
struct backend_call *redis_split_parent(const struct redis_split *s);

/* A part (or take-back) finished; true when none is outstanding. */
bool redis_split_one_done(struct redis_split *s);

/*
 * Once every part is in: the take-back calls needed (one per part that
 * allowed, hence recorded, when the request as a whole does not stand),
 * each with done = tb_done, the split as redis_split_of(tb) and the given
 * deadline.  Returns how many (0: nothing to take back); -1 on OOM.
 */
int redis_split_takebacks(struct redis_split *s, backend_done_fn tb_done,
    int64_t deadline_us);
struct backend_call *redis_split_takeback(struct redis_split *s, size_t i);

/* Whether the parts' outcome stands as it is (every part allowed). */
bool redis_split_allowed(const struct redis_split *s);

/*
 * Fill the parent's out[], all_allowed, rc, kind and err from the parts:
 * rc 0, denied, when a part denied (a part that failed meanwhile leaves
 * its checks' results empty: not allowed, no retry); else rc -1 with the
 * first failed part's error if any failed; else rc 0, allowed.  Results
 * of taken-back checks count their units as not recorded.  Does not call
 * the parent's done.
 */
void redis_split_answer(struct redis_split *s);

#endif
