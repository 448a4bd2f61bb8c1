/*
 * slot_map.h - Redis Cluster's key-to-node routing, without any I/O: the
 * CRC16 of a key's hash tag, the map of the 16384 slots to the primaries
 * that own them, and the MOVED / ASK redirections that change it.
 *
 * hiredis 0.14 has no cluster client, so the routing is ours; the Redis
 * store (src/store/backend_redis.c) asks the cluster (CLUSTER SLOTS),
 * hands the ranges it read to slot_map_build(), and routes each call by
 * slot_map_owner(slot_map_keyslot(key)).  Everything here follows the
 * Redis Cluster specification and is unit-tested alone
 * (tests/unit/check_slot_map.c).
 *
 * Nodes are numbered in the order they were first seen and never
 * renumbered: a caller can keep per-node state (connections) in an array
 * indexed the same way and grow it as nnodes grows.  A node that leaves the
 * cluster keeps its number and owns no slot; at most SLOT_MAP_NODES_MAX
 * addresses are ever kept.
 *
 * Thread: a map belongs to one thread (the store's I/O thread); nothing
 * here locks.
 */
#ifndef RL_SLOT_MAP_H
#define RL_SLOT_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SLOT_MAP_SLOTS	   16384
#define SLOT_MAP_NODES_MAX 1024
#define SLOT_MAP_HOST_MAX  256 /* host names up to 255 bytes */

/* CRC16-CCITT (XMODEM), the cluster's: "123456789" -> 0x31C3. */
uint16_t slot_map_crc16(const char *buf, size_t len);

/*
 * The slot of a key: the CRC16 of its hash tag (the bytes between the
 * first '{' and the first '}' after it, if that is not empty), else of
 * the whole key, modulo 16384.
 */
unsigned slot_map_keyslot(const char *key, size_t len);

struct slot_map_node {
	char host[SLOT_MAP_HOST_MAX];
	int port;
};

/* One range of a CLUSTER SLOTS answer: slots start..end owned by the
 * primary host:port.  Borrowed by slot_map_build(). */
struct slot_range {
	unsigned start, end;
	const char *host;
	int port;
};

struct slot_map {
	int16_t owner[SLOT_MAP_SLOTS]; /* node index, or -1 */
	struct slot_map_node *nodes;
	size_t nnodes;
	uint64_t version; /* grows with every change */
};

/* An empty map (every slot unowned, no node).  Cannot fail. */
void slot_map_init(struct slot_map *m);
void slot_map_release(struct slot_map *m);

/*
 * Find host:port among the nodes, adding it if new.  Returns its index, or
 * -1 with a message in err (a host too long, a bad port, too many nodes,
 * out of memory).
 */
int slot_map_node(struct slot_map *m, const char *host, int port, char *err,
    size_t errlen);

/*
 * Replace the whole map by ranges[0..n-1] (a CLUSTER SLOTS answer).
 * Slots no range names become unowned.  Returns 0, or -1 with a message in
 * err and the map unchanged (a range out of 0..16383 or reversed, a bad
 * node, overlapping ranges).
 */
int slot_map_build(struct slot_map *m, const struct slot_range *ranges,
    size_t n, char *err, size_t errlen);

/* Give one slot to host:port (a MOVED answer).  0, or -1 with err. */
int slot_map_move(struct slot_map *m, unsigned slot, const char *host, int port,
    char *err, size_t errlen);

/* The node that owns slot, or -1 (unknown: refresh the map). */
static inline int
slot_map_owner(const struct slot_map *m, unsigned slot)
{
	return slot < SLOT_MAP_SLOTS ? m->owner[slot] : -1;
}

/* Slots with no owner. */
size_t slot_map_unowned(const struct slot_map *m);

enum slot_redirect {
	SLOT_REDIRECT_NONE,
	SLOT_REDIRECT_MOVED, /* the slot lives elsewhere now */
	SLOT_REDIRECT_ASK    /* this once, ask the other node (migrating) */
};

/*
 * Read an error reply: "MOVED <slot> <host>:<port>" or "ASK ...".  The
 * host may be an IPv6 address (the port follows the last ':'), and empty
 * ("MOVED 3999 :6380"), meaning the host of the node that answered, which
 * the caller then fills in.  Returns the kind, with *slot, host (NUL
 * terminated, truncated to hostlen) and *port set; SLOT_REDIRECT_NONE for
 * any other text, or a redirection that does not parse.
 */
enum slot_redirect slot_map_parse_redirect(const char *msg, size_t len,
    unsigned *slot, char *host, size_t hostlen, int *port);

#endif
