/*
 * redis_topology.h - what Redis Cluster and Sentinel say about where the
 * primaries are, read from their replies: CLUSTER SLOTS into slot ranges
 * (for slot_map.c), SENTINEL GET-MASTER-ADDR-BY-NAME into an address, and
 * a +switch-master message into the new primary.
 *
 * Thread: any; nothing is shared.
 */
#ifndef RL_REDIS_TOPOLOGY_H
#define RL_REDIS_TOPOLOGY_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#include "store/slot_map.h"

/*
 * The primaries' ranges of a CLUSTER SLOTS reply, into a new array
 * (*out, rl_free) of *n ranges whose hosts point into r (valid while r
 * lives).  An empty host (a node that does not know its own address)
 * becomes asked_host, the node that answered.  Returns 0, or -1 with a
 * message in err.
 */
int redis_topology_slots(const redisReply *r, const char *asked_host,
    struct slot_range **out, size_t *n, char *err, size_t errlen);

/* A SENTINEL GET-MASTER-ADDR-BY-NAME reply: ["host", "port"].  0 with
 * host (truncated to hostlen) and *port, or -1 (no such master, or not
 * that shape). */
int redis_topology_sentinel_addr(const redisReply *r, char *host,
    size_t hostlen, int *port);

/* A pub/sub message ["message", "+switch-master", "<name> <old-ip>
 * <old-port> <new-ip> <new-port>"] for master: 0 with the new address,
 * or -1 (another message, another master). */
int redis_topology_switch_master(const redisReply *r, const char *master,
    char *host, size_t hostlen, int *port);

#endif
