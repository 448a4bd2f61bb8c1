/*
 * slot_map.c - Redis Cluster routing without I/O (slot_map.h): CRC16 and
 * hash tags as the cluster specification defines them, the slot table, and
 * the parsing of MOVED / ASK redirections.
 */
#include <stdio.h>
#include <string.h>

#include "store/slot_map.h"
#include "base/util.h"

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0, no reflection.  A
 * table built once per byte value would be faster; keys are short and
 * this runs once per key, so the bitwise form stays. */
uint16_t
slot_map_crc16(const char *buf, size_t len)
{
	uint16_t crc = 0;
	size_t i;
	int b;

	for (i = 0; i < len; i++) {
		crc ^= (uint16_t)((unsigned char)buf[i] << 8);
		for (b = 0; b < 8; b++)
			crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) :
					       (uint16_t)(crc << 1);
	}
	return crc;
}

unsigned
slot_map_keyslot(const char *key, size_t len)
{
	const char *open, *close;

	open = memchr(key, '{', len);
	if (open != NULL) {
		close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
		if (close != NULL && close > open + 1)
			return slot_map_crc16(open + 1,
				   (size_t)(close - open - 1)) &
			    (SLOT_MAP_SLOTS - 1);
	}
	return slot_map_crc16(key, len) & (SLOT_MAP_SLOTS - 1);
}

void
slot_map_init(struct slot_map *m)
{
	size_t i;

	for (i = 0; i < SLOT_MAP_SLOTS; i++)
		m->owner[i] = -1;
	m->nodes = NULL;
	m->nnodes = 0;
	m->version = 0;
}

void
slot_map_release(struct slot_map *m)
{
	rl_free(m->nodes);
	m->nodes = NULL;
	m->nnodes = 0;
}

int
slot_map_node(struct slot_map *m, const char *host, int port, char *err,
    size_t errlen)
{
	struct slot_map_node *grown;
	size_t i, hl = strlen(host);

	if (hl == 0 || hl >= SLOT_MAP_HOST_MAX || port < 1 || port > 65535) {
		snprintf(err, errlen, "bad node address \"%.64s\":%d", host,
		    port);
		return -1;
	}
	for (i = 0; i < m->nnodes; i++)
		if (m->nodes[i].port == port &&
		    strcmp(m->nodes[i].host, host) == 0)
			return (int)i;
	if (m->nnodes >= SLOT_MAP_NODES_MAX) {
		snprintf(err, errlen, "more than %d cluster node addresses",
		    SLOT_MAP_NODES_MAX);
		return -1;
	}
	grown = rl_realloc(m->nodes, (m->nnodes + 1) * sizeof(*grown));
	if (grown == NULL) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	m->nodes = grown;
	memcpy(grown[m->nnodes].host, host, hl + 1);
	grown[m->nnodes].port = port;
	return (int)m->nnodes++;
}

int
slot_map_build(struct slot_map *m, const struct slot_range *ranges, size_t n,
    char *err, size_t errlen)
{
	int16_t owner[SLOT_MAP_SLOTS];
	size_t i, s;
	int node;

	for (s = 0; s < SLOT_MAP_SLOTS; s++)
		owner[s] = -1;
	for (i = 0; i < n; i++) {
		const struct slot_range *r = &ranges[i];

		if (r->start > r->end || r->end >= SLOT_MAP_SLOTS) {
			snprintf(err, errlen, "bad slot range %u-%u", r->start,
			    r->end);
			return -1;
		}
		/* Nodes added for a map that is then refused stay known
		 * and own nothing: harmless. */
		if ((node = slot_map_node(m, r->host, r->port, err, errlen)) <
		    0)
			return -1;
		for (s = r->start; s <= r->end; s++) {
			if (owner[s] != -1) {
				snprintf(err, errlen,
				    "slot %zu is in two "
				    "ranges",
				    s);
				return -1;
			}
			owner[s] = (int16_t)node;
		}
	}
	memcpy(m->owner, owner, sizeof(owner));
	m->version++;
	return 0;
}

int
slot_map_move(struct slot_map *m, unsigned slot, const char *host, int port,
    char *err, size_t errlen)
{
	int node;

	if (slot >= SLOT_MAP_SLOTS) {
		snprintf(err, errlen, "bad slot %u", slot);
		return -1;
	}
	if ((node = slot_map_node(m, host, port, err, errlen)) < 0)
		return -1;
	if (m->owner[slot] != node) {
		m->owner[slot] = (int16_t)node;
		m->version++;
	}
	return 0;
}

size_t
slot_map_unowned(const struct slot_map *m)
{
	size_t s, n = 0;

	for (s = 0; s < SLOT_MAP_SLOTS; s++)
		n += m->owner[s] == -1;
	return n;
}

/* A decimal number of at most 5 digits from *p; advances *p. */
static int
read_number(const char **p, const char *end, long *out)
{
	long v = 0;
	int digits = 0;

	while (*p < end && **p >= '0' && **p <= '9' && digits < 6) {
		v = v * 10 + (**p - '0');
		(*p)++;
		digits++;
	}
	if (digits == 0 || digits > 5)
		return -1;
	*out = v;
	return 0;
}

enum slot_redirect
slot_map_parse_redirect(const char *msg, size_t len, unsigned *slot, char *host,
    size_t hostlen, int *port)
{
	const char *p = msg, *end = msg + len, *colon, *q;
	enum slot_redirect kind;
	long v;
	size_t hl;

	if (len > 6 && memcmp(msg, "MOVED ", 6) == 0) {
		kind = SLOT_REDIRECT_MOVED;
		p += 6;
	} else if (len > 4 && memcmp(msg, "ASK ", 4) == 0) {
		kind = SLOT_REDIRECT_ASK;
		p += 4;
	} else
		return SLOT_REDIRECT_NONE;
	if (read_number(&p, end, &v) < 0 || v >= SLOT_MAP_SLOTS || p >= end ||
	    *p != ' ')
		return SLOT_REDIRECT_NONE;
	*slot = (unsigned)v;
	p++;
	/* host:port, the port after the last ':' (IPv6 hosts have more). */
	colon = NULL;
	for (q = p; q < end && *q != ' ' && *q != '\r' && *q != '\n'; q++)
		if (*q == ':')
			colon = q;
	if (colon == NULL)
		return SLOT_REDIRECT_NONE;
	end = q;
	hl = (size_t)(colon - p);
	if (hostlen == 0 || hl >= hostlen)
		return SLOT_REDIRECT_NONE;
	q = colon + 1;
	if (read_number(&q, end, &v) < 0 || q != end || v < 1 || v > 65535)
		return SLOT_REDIRECT_NONE;
	memcpy(host, p, hl);
	host[hl] = '\0';
	*port = (int)v;
	return kind;
}
