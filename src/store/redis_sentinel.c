/*
 * redis_sentinel.c - Redis Sentinel: node 0 is the primary the sentinels
 * name.  It is asked of them at start, and on +switch-master (a
 * subscription), a READONLY reply or a lost connection node 0 moves to the
 * primary they name then: its connections close and reconnect there.
 *
 * A sentinel may name a replica (one that has not yet heard of a failover
 * names the old primary, turned replica), so every connection to node 0
 * asks ROLE before anything else is written on it (redis_conn.c): an
 * answer other than "master" closes it, the commands held behind never
 * written, and the next sentinel is asked (docs/scale.md, "Sentinel").
 *
 * Thread: the store's I/O thread (redis_sentinel_init at start-up).
 */
#include <stdio.h>
#include <string.h>

#include "core/config.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/util.h"
#include "store/redis_priv.h"
#include "store/redis_topology.h"

/* Node 0 is host:port now; move its connections if it moved. */
static void
sentinel_primary(struct redis_backend *rb, const char *host, int port,
    const char *how)
{
	struct redis_sentinels *ss = &rb->sentinels;
	struct redis_node *node = rb->nodes[0];
	char why[SLOT_MAP_HOST_MAX + 64];

	if (!ss->known && ss->doubted && node->url.port == port &&
	    strcmp(node->host, host) == 0) {
		/* The one whose ROLE said replica, named again: its
		 * connections try again, and ROLE tells again. */
		ss->known = true;
	} else if (!ss->known || node->url.port != port ||
	    strcmp(node->host, host) != 0) {
		/* A move from a primary that was one (named and not
		 * doubted, or demoted after its ROLE said "master") is a
		 * failover; from one a stale sentinel named, not. */
		if (ss->known || (ss->doubted && ss->confirmed)) {
			metrics_redis_event(rb->metrics,
			    METRICS_REDIS_FAILOVER);
			log_warnx(
			    "redis sentinel: primary \"%s\" moved from "
			    "%s:%d to %s:%d (%s)",
			    ss->master, node->host, node->url.port, host, port,
			    how);
		} else if (ss->doubted)
			log_warnx(
			    "redis sentinel: primary \"%s\" is %s:%d (%s; "
			    "%s:%d, named before, was not the primary)",
			    ss->master, host, port, how, node->host,
			    node->url.port);
		else
			log_info("redis sentinel: primary \"%s\" is %s:%d",
			    ss->master, host, port);
		snprintf(why, sizeof(why), "the primary moved to %s:%d", host,
		    port);
		redis_node_close(rb, node, why);
		util_strlcpy(node->host, host, sizeof(node->host));
		node->url.port = port;
		ss->known = true;
		ss->confirmed = false;
		rb->rel_wanted = rb->rel_started; /* follow it there */
		rb->next_rel_us = 0;
		(void)redis_circuit_kick(rb);
	}
	ss->doubted = false;
	rb->unpark_us = util_monotonic_us();
}

/*
 * ROLE on a connection to node 0 (redis_conn.h, redis_role_fn): true for
 * "master".  Anything else is not the primary: why names it, and the
 * primary is unknown until a sentinel, the next one first, names one
 * again; meanwhile calls wait (parked) within their deadlines.  An error
 * (an ACL that refuses ROLE) is let through, said once a second: READONLY
 * is then the only sign of a replica, as before ROLE was asked.
 */
static bool
sentinel_role_check(void *arg, const redisReply *r, char *why, size_t whylen)
{
	struct redis_node *node = arg;
	struct redis_backend *rb = node->rb;
	struct redis_sentinels *ss = &rb->sentinels;
	const char *role = "an unknown role";
	char msg[BACKEND_ERR_MAX];

	if (r->type == REDIS_REPLY_ERROR) {
		snprintf(msg, sizeof(msg),
		    "ROLE on %.64s:%d refused (%.64s): the primary the sentinels "
		    "name is used unchecked",
		    node->host, node->url.port, r->str);
		redis_log_failure(rb, BACKEND_ERR_PROTOCOL, msg);
		return true;
	}
	if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
	    (r->element[0]->type == REDIS_REPLY_STRING ||
		r->element[0]->type == REDIS_REPLY_STATUS)) {
		role = r->element[0]->str;
		if (strcmp(role, "master") == 0) {
			ss->confirmed = true;
			return true;
		}
	}
	if (strcmp(role, "slave") == 0 || strcmp(role, "replica") == 0)
		snprintf(why, whylen,
		    "%.64s:%d is a replica, not the primary the sentinel named",
		    node->host, node->url.port);
	else
		snprintf(why, whylen,
		    "%.64s:%d answers ROLE \"%.32s\", not the primary the "
		    "sentinel named",
		    node->host, node->url.port, role);
	/* Every connection of the pool may say so: the first moves on to
	 * the next sentinel and closes the pool's other connections, which
	 * passed ROLE while it was the primary: nothing more goes there.
	 * The one asking closes itself when this returns (redis_conn.c). */
	if (ss->known) {
		redis_log_failure(rb, BACKEND_ERR_CONNECT, why);
		ss->known = false;
		ss->doubted = true;
		if (!ss->asking)
			ss->ask_next++;
		ss->ask_wanted = true;
		redis_node_close(rb, node, why);
	}
	return false;
}

static void
sentinel_ask_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;
	struct redis_sentinels *ss = &rb->sentinels;
	char host[SLOT_MAP_HOST_MAX], msg[BACKEND_ERR_MAX];
	int port;

	ss->asking = false;
	if (r != NULL &&
	    redis_topology_sentinel_addr(r, host, sizeof(host), &port) == 0) {
		sentinel_primary(rb, host, port, "asked");
		return;
	}
	snprintf(msg, sizeof(msg), "sentinel %s:%d: %s",
	    ss->urls[ss->ask_next % ss->n].host,
	    ss->urls[ss->ask_next % ss->n].port,
	    r == NULL			     ? err :
		r->type == REDIS_REPLY_ERROR ? r->str :
					       "does not know the primary");
	redis_log_failure(rb, BACKEND_ERR_CONNECT, msg);
	ss->ask_next++;
	ss->ask_wanted = true;
}

void
redis_sentinel_ask(struct redis_backend *rb)
{
	struct redis_sentinels *ss = &rb->sentinels;
	struct redis_slot *s = &ss->q[ss->ask_next % ss->n];
	const char *argv[3] = { "SENTINEL", "GET-MASTER-ADDR-BY-NAME",
		ss->master };
	size_t lens[3] = { 8, 23, strlen(ss->master) };
	char err[BACKEND_ERR_MAX];

	ss->next_ask_us = util_monotonic_us() + REDIS_TOPOLOGY_US;
	if (redis_conn_send(s->conn, 3, argv, lens, sentinel_ask_reply, rb, err,
		sizeof(err)) == -1) {
		redis_log_failure(rb, BACKEND_ERR_CONNECT, err);
		ss->ask_next++;
		return;
	}
	ss->ask_wanted = false;
	ss->asking = true;
}

/* Messages on the subscription, and its end. */
static void
sentinel_push(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;
	struct redis_sentinels *ss = &rb->sentinels;
	char host[SLOT_MAP_HOST_MAX];
	int port;

	(void)err;
	if (r == NULL) {
		ss->subscribed = false;
		ss->sub_next++;
		ss->sub_wanted = true;
		ss->next_sub_us = util_monotonic_us() + 5 * REDIS_TOPOLOGY_US;
		return;
	}
	if (redis_topology_switch_master(r, ss->master, host, sizeof(host),
		&port) == 0)
		sentinel_primary(rb, host, port, "+switch-master");
}

static void
sentinel_sub_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_backend *rb = arg;
	struct redis_sentinels *ss = &rb->sentinels;

	(void)err;
	if (r != NULL && r->type == REDIS_REPLY_ARRAY) {
		ss->subscribed = true;
		/* A switch between the last question and now would be
		 * missed: ask once more. */
		ss->ask_wanted = true;
		return;
	}
	if (r != NULL)
		redis_conn_close(ss->sub.conn, "SUBSCRIBE refused");
}

void
redis_sentinel_subscribe(struct redis_backend *rb)
{
	struct redis_sentinels *ss = &rb->sentinels;
	const char *argv[2] = { "SUBSCRIBE", "+switch-master" };
	size_t lens[2] = { 9, 14 };
	char err[BACKEND_ERR_MAX];

	ss->sub_wanted = false;
	ss->next_sub_us = util_monotonic_us() + 5 * REDIS_TOPOLOGY_US;
	if (ss->sub.conn != NULL) {
		redis_conn_set_push(ss->sub.conn, NULL, NULL);
		redis_conn_free(ss->sub.conn, "moving the subscription");
		ss->sub.reg_fd = -1;
	}
	ss->sub.conn = redis_conn_new(&ss->cfgs[ss->sub_next % ss->n]);
	if (ss->sub.conn == NULL) {
		ss->sub_wanted = true;
		return;
	}
	redis_conn_set_push(ss->sub.conn, sentinel_push, rb);
	if (redis_conn_send(ss->sub.conn, 2, argv, lens, sentinel_sub_reply, rb,
		err, sizeof(err)) == -1) {
		redis_log_failure(rb, BACKEND_ERR_CONNECT, err);
		ss->sub_next++;
		ss->sub_wanted = true;
	}
}

/* The sentinels of redis.sentinel, and node 0 waiting for a primary. */
int
redis_sentinel_init(struct redis_backend *rb, const struct redis_config *rc,
    char *err, size_t errlen)
{
	const struct sentinel_config *sc = &rc->sentinel;
	struct redis_sentinels *ss = &rb->sentinels;
	char host[SLOT_MAP_HOST_MAX], *password = NULL;
	size_t i;
	int port;

	rb->mode = REDIS_SENTINEL;
	if (sc->password_file != NULL &&
	    redis_read_password_file(sc->password_file, &password, err,
		errlen) == -1)
		return -1;
	if ((ss->master = rl_strdup(sc->master)) == NULL ||
	    (ss->urls = rl_calloc(sc->nnodes, sizeof(*ss->urls))) == NULL ||
	    (ss->cfgs = rl_calloc(sc->nnodes, sizeof(*ss->cfgs))) == NULL ||
	    (ss->q = rl_calloc(sc->nnodes, sizeof(*ss->q))) == NULL) {
		rl_free(password);
		goto oom;
	}
	if (sc->nnodes > 0)
		ss->urls[0].password = password;
	for (i = 0; i < sc->nnodes; i++) {
		if (redis_hostport_parse(sc->nodes[i], host, sizeof(host),
			&port) == -1) {
			snprintf(err, errlen,
			    "redis.sentinel.nodes: bad node "
			    "\"%.64s\"",
			    sc->nodes[i]);
			return -1;
		}
		if ((ss->urls[i].host = rl_strdup(host)) == NULL)
			goto oom;
		ss->urls[i].port = port;
		ss->urls[i].password = password;
		ss->cfgs[i].url = &ss->urls[i];
		ss->cfgs[i].connect_timeout_us = rb->timeout_us;
		ss->cfgs[i].tls = rb->tls_sentinels ? rb->tls : NULL;
		ss->q[i].reg_fd = -1;
		if ((ss->q[i].conn = redis_conn_new(&ss->cfgs[i])) == NULL)
			goto oom;
		ss->n++;
	}
	ss->sub.reg_fd = -1;
	ss->ask_wanted = ss->sub_wanted = true;
	if (redis_node_add(rb, "", 0) == -1)
		goto oom;
	rb->nodes[0]->ccfg.role_check = sentinel_role_check;
	rb->nodes[0]->ccfg.role_arg = rb->nodes[0];
	return 0;
oom:
	snprintf(err, errlen, "redis: out of memory");
	return -1;
}
