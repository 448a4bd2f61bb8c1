/*
 * redis_topology.c - Redis Cluster and Sentinel replies about where the
 * primaries are (redis_topology.h).
 */
#include "store/redis_topology.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int
redis_topology_slots(const redisReply *r, const char *asked_host,
    struct slot_range **out, size_t *n, char *err, size_t errlen)
{
	struct slot_range *ranges;
	size_t i, k = 0;

	*out = NULL;
	*n = 0;
	if (r->type == REDIS_REPLY_ERROR) {
		snprintf(err, errlen, "CLUSTER SLOTS: %s", r->str);
		return -1;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
		snprintf(err, errlen, "CLUSTER SLOTS: no slots assigned");
		return -1;
	}
	if ((ranges = rl_calloc(r->elements, sizeof(*ranges))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	for (i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i], *node;

		/* [start, end, [host, port, id, ...], replicas...] */
		if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
		    e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER ||
		    (node = e->element[2])->type != REDIS_REPLY_ARRAY ||
		    node->elements < 2 ||
		    node->element[0]->type != REDIS_REPLY_STRING ||
		    node->element[1]->type != REDIS_REPLY_INTEGER ||
		    e->element[0]->integer < 0 || e->element[1]->integer < 0) {
			snprintf(err, errlen,
			    "CLUSTER SLOTS: entry %zu is "
			    "not [start, end, [host, port, ...], ...]",
			    i);
			rl_free(ranges);
			return -1;
		}
		ranges[k].start = (unsigned)e->element[0]->integer;
		ranges[k].end = (unsigned)e->element[1]->integer;
		ranges[k].host = node->element[0]->len > 0 &&
			strcmp(node->element[0]->str, "?") != 0 ?
		    node->element[0]->str :
		    asked_host;
		ranges[k].port = node->element[1]->integer > 65535 ?
		    0 :
		    (int)node->element[1]->integer;
		k++;
	}
	*out = ranges;
	*n = k;
	return 0;
}

int
redis_topology_sentinel_addr(const redisReply *r, char *host, size_t hostlen,
    int *port)
{
	long p;
	char *end;

	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
	    r->element[0]->type != REDIS_REPLY_STRING ||
	    r->element[1]->type != REDIS_REPLY_STRING ||
	    r->element[0]->len == 0 || r->element[0]->len >= hostlen)
		return -1;
	p = strtol(r->element[1]->str, &end, 10);
	if (*end != '\0' || p < 1 || p > 65535)
		return -1;
	memcpy(host, r->element[0]->str, r->element[0]->len + 1);
	*port = (int)p;
	return 0;
}

int
redis_topology_switch_master(const redisReply *r, const char *master,
    char *host, size_t hostlen, int *port)
{
	char name[256], oldip[256], newip[256];
	int oldport, newport;
	const char *msg;

	if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
	    r->element[0]->type != REDIS_REPLY_STRING ||
	    strcmp(r->element[0]->str, "message") != 0 ||
	    r->element[2]->type != REDIS_REPLY_STRING)
		return -1;
	msg = r->element[2]->str;
	if (sscanf(msg, "%255s %255s %d %255s %d", name, oldip, &oldport, newip,
		&newport) != 5 ||
	    strcmp(name, master) != 0 || newport < 1 || newport > 65535 ||
	    strlen(newip) >= hostlen)
		return -1;
	memcpy(host, newip, strlen(newip) + 1);
	*port = newport;
	return 0;
}
