/*
 * redis_conn.c - one pipelined, non-blocking Redis connection (see
 * redis_conn.h).
 *
 * DESIGN
 *
 * A connection is a socket, an output buffer of formatted commands not yet
 * written, hiredis's reply reader, and a ring of the commands waiting for a
 * reply (function, argument, time queued).  Redis answers in order, so the
 * n-th reply belongs to the n-th entry of the ring.  Nothing waits here:
 * the owner's event loop calls redis_conn_io() when the socket is ready
 * and redis_conn_send() appends; the write happens on the next io, so all
 * the commands queued in one turn of the loop leave in one write(2).
 *
 * Closing fails every entry of the ring with NULL and a reason: a command
 * in flight may or may not have run, and the owner must not send it again.
 * Only a command none of whose bytes reached the socket (queued while
 * connecting, or behind a write the socket did not take) is known not to
 * have run: each entry keeps where its bytes start in the stream of this
 * socket, the connection how far that stream was handed to send(2) or
 * SSL_write, and the callback may ask (redis_conn_unwritten()).  The ring
 * is moved aside before the callbacks run, so a callback may send on the
 * same connection (which then connects anew).
 *
 * A handshake that ends with ROLE (cfg->role_check, Sentinel) holds back
 * what is queued behind it: the stream is written up to the end of ROLE
 * (hold_at) and no further until the owner accepts its answer.  Refused,
 * the connection closes, and the commands behind were never written:
 * redis_conn_unwritten() says so, and nothing was run on a server that
 * was not the one wanted.  This costs a round trip per new connection,
 * not per command.
 *
 * Nothing blocks the owner's thread, not even DNS.  A numeric address is
 * connected to at once.  A host name is looked up on a thread of its own
 * (redis_resolve.c): meanwhile the connection is RESOLVING, its descriptor
 * is the lookup's eventfd (readable when the answer is there), commands
 * queue as they would during a connect, and the connect deadline, which
 * starts with the lookup, covers both.  A connection closed during a
 * lookup keeps it (closing only the eventfd, which so leaves the owner's
 * epoll set), and the next connect to the same host waits for that one
 * instead of starting another: a resolver that never answers costs one
 * thread per connection, not one per attempt.
 *
 * TLS (cfg->tls, redis_tls.c) sits between the socket and the buffers:
 * once connect(2) is done, an SSL from the store's current context runs
 * its handshake as the socket allows, still CONNECTING and so still under
 * the connect deadline; then SSL_write/SSL_read take the place of
 * send/recv.  The commands queued meanwhile leave after it.  A read loops
 * until OpenSSL wants more from the socket, since a record it has read may
 * hold more than one chunk.  Each connection keeps its last session and
 * offers it on its next connect, so a reconnect is an abbreviated
 * handshake when the server still knows it.
 */
#include "store/redis_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <limits.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "store/redis_reader.h"
#include "store/redis_resolve.h"
#include "store/redis_tls.h"
#include "base/log.h"
#include "base/util.h"

#define REDIS_KEEPALIVE_IDLE_S 15

#define REDIS_CONN_READ_CHUNK 16384
#define REDIS_CONN_RING_MIN   16

struct redis_pending {
	redis_reply_fn fn;
	void *arg;
	int64_t queued_us;
	uint64_t start; /* its first byte in the socket's stream */
};

struct redis_conn {
	const struct redis_conn_config *cfg;
	enum redis_conn_state state;
	int fd;
	uint64_t generation;
	int64_t connect_deadline_us;
	struct redis_resolve *resolve; /* the name's lookup, if one runs */
	redisReader *reader;

	SSL *ssl;	      /* with cfg->tls, once connect(2) is done */
	bool handshaking;     /* ssl's handshake is not over */
	bool tls_wants_write; /* OpenSSL waits for the socket to be writable */
	bool tls_fresh;	      /* handshake over, no reply read yet */
	struct redis_tls_session session; /* to resume on the next connect */

	char *out; /* formatted commands to write */
	size_t out_off, out_len, out_cap;
	/* Bytes of this socket's stream queued, and handed to the socket
	 * (a TLS write that waits counts all it was given). */
	uint64_t queued_bytes, written_bytes;
	uint64_t hold_at; /* not written from there (ROLE's answer is
			   * awaited); UINT64_MAX: all may be */
	bool unwritten;	  /* the closing callback's command never left */
	/* The last close was the server refusing the handshake (an error
	 * reply to AUTH, SELECT or SCRIPT LOAD, or TLS failing): until the
	 * next connect, nothing that never left waits for another try. */
	bool refused;

	struct redis_pending *ring; /* commands waiting for a reply */
	size_t head, count, cap;

	redis_reply_fn push_fn; /* replies nobody asked for */
	void *push_arg;

	char last_error[160];
};

/* ---- the ring of commands in flight ---------------------------------- */

static int
ring_push(struct redis_conn *c, redis_reply_fn fn, void *arg, uint64_t start)
{
	if (c->count == c->cap) {
		size_t cap = c->cap == 0 ? REDIS_CONN_RING_MIN : 2 * c->cap, i;
		struct redis_pending *r = rl_calloc(cap, sizeof(*r));

		if (r == NULL)
			return -1;
		for (i = 0; i < c->count; i++)
			r[i] = c->ring[(c->head + i) % c->cap];
		rl_free(c->ring);
		c->ring = r;
		c->cap = cap;
		c->head = 0;
	}
	c->ring[(c->head + c->count) % c->cap] = (struct redis_pending){
		.fn = fn,
		.arg = arg,
		.queued_us = util_monotonic_us(),
		.start = start,
	};
	c->count++;
	return 0;
}

static struct redis_pending
ring_pop(struct redis_conn *c)
{
	struct redis_pending p = c->ring[c->head];

	c->head = (c->head + 1) % c->cap;
	c->count--;
	return p;
}

/* ---- output buffer --------------------------------------------------- */

/* Room for len more bytes at c->out + c->out_len.  0 or -1 (OOM). */
static int
out_reserve(struct redis_conn *c, size_t len)
{
	if (c->out_off > 0 && c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	if (c->out_len + len > c->out_cap) {
		size_t cap = c->out_cap == 0 ? 4096 : c->out_cap;
		char *nb;

		if (c->out_off > 0) {
			memmove(c->out, c->out + c->out_off,
			    c->out_len - c->out_off);
			c->out_len -= c->out_off;
			c->out_off = 0;
		}
		while (cap < c->out_len + len)
			cap *= 2;
		if (cap != c->out_cap) {
			if ((nb = rl_realloc(c->out, cap)) == NULL)
				return -1;
			c->out = nb;
			c->out_cap = cap;
		}
	}
	return 0;
}

/* Where writing stops in c->out: its end, or where the stream is held
 * (c->out[0] is at stream position queued_bytes - out_len). */
static size_t
out_end(const struct redis_conn *c)
{
	uint64_t base = c->queued_bytes - c->out_len;

	if (c->hold_at >= c->queued_bytes)
		return c->out_len;
	return c->hold_at > base ? (size_t)(c->hold_at - base) : 0;
}

/* "<mark><n>\r\n" at p; the end. */
static char *
put_head(char *p, char mark, size_t n)
{
	*p++ = mark;
	p += util_fmt_int64(p, (int64_t)n);
	*p++ = '\r';
	*p++ = '\n';
	return p;
}

/* Format one command (a RESP array of bulk strings) into the output
 * buffer, in place, and remember fn for its reply.  0 or -1 (OOM; nothing
 * queued). */
static int
queue_command(struct redis_conn *c, int argc, const char **argv,
    const size_t *lens, redis_reply_fn fn, void *arg)
{
	char *p;
	size_t need = 3 + UTIL_INT64_DEC_MAX, before;
	int i;

	if (argc < 1)
		return -1;
	for (i = 0; i < argc; i++)
		need += 5 + UTIL_INT64_DEC_MAX + lens[i];
	if (out_reserve(c, need) == -1)
		return -1;
	before = c->out_len;
	p = put_head(c->out + before, '*', (size_t)argc);
	for (i = 0; i < argc; i++) {
		p = put_head(p, '$', lens[i]);
		if (lens[i] > 0)
			memcpy(p, argv[i], lens[i]);
		p += lens[i];
		*p++ = '\r';
		*p++ = '\n';
	}
	c->out_len = (size_t)(p - c->out);
	if (ring_push(c, fn, arg, c->queued_bytes) == -1) {
		c->out_len = before;
		return -1;
	}
	c->queued_bytes += c->out_len - before;
	return 0;
}

/* ---- life cycle ------------------------------------------------------ */

struct redis_conn *
redis_conn_new(const struct redis_conn_config *cfg)
{
	struct redis_conn *c = rl_calloc(1, sizeof(*c));

	if (c == NULL)
		return NULL;
	c->cfg = cfg;
	c->fd = -1;
	c->state = REDIS_CONN_CLOSED;
	c->hold_at = UINT64_MAX;
	return c;
}

void
redis_conn_set_push(struct redis_conn *c, redis_reply_fn fn, void *arg)
{
	c->push_fn = fn;
	c->push_arg = arg;
}

void
redis_conn_close(struct redis_conn *c, const char *why)
{
	struct redis_pending *ring = c->ring;
	size_t head = c->head, count = c->count, cap = c->cap, i;
	bool was_open = c->state != REDIS_CONN_CLOSED;
	uint64_t written = c->written_bytes;

	if (c->ssl != NULL) {
		/* No close_notify (we are not waiting for its answer), but
		 * not a failure either: a session freed unshut would be
		 * marked not resumable. */
		if (!c->handshaking) {
			SSL_set_quiet_shutdown(c->ssl, 1);
			(void)SSL_shutdown(c->ssl);
		}
		SSL_free(c->ssl);
	}
	c->ssl = NULL;
	c->handshaking = c->tls_wants_write = c->tls_fresh = false;
	/* While resolving, fd is the lookup's eventfd, closed below with
	 * the lookup (which a connect again may still wait for). */
	if (c->fd >= 0 && c->state != REDIS_CONN_RESOLVING)
		close(c->fd);
	c->fd = -1;
	c->state = REDIS_CONN_CLOSED;
	if (c->resolve != NULL && redis_resolve_is_done(c->resolve)) {
		redis_resolve_drop(c->resolve);
		c->resolve = NULL;
	} else if (c->resolve != NULL)
		redis_resolve_unwatch(c->resolve); /* leaves epoll too */
	if (c->reader != NULL)
		redisReaderFree(c->reader);
	c->reader = NULL;
	c->out_off = c->out_len = 0;
	c->queued_bytes = c->written_bytes = 0;
	c->hold_at = UINT64_MAX;
	if (why != NULL && *why != '\0')
		snprintf(c->last_error, sizeof(c->last_error), "%s", why);
	c->ring = NULL;
	c->head = c->count = c->cap = 0;
	for (i = 0; i < count; i++) {
		struct redis_pending *p = &ring[(head + i) % cap];

		c->unwritten = !c->refused && p->start >= written;
		p->fn(p->arg, NULL, c->last_error);
		c->unwritten = false;
	}
	rl_free(ring);
	if (was_open && c->push_fn != NULL)
		c->push_fn(c->push_arg, NULL, c->last_error);
}

void
redis_conn_free(struct redis_conn *c, const char *why)
{
	if (c == NULL)
		return;
	redis_conn_close(c, why);
	redis_resolve_drop(c->resolve);
	redis_tls_session_clear(&c->session);
	rl_free(c->out);
	rl_free(c);
}

/* ---- the handshake --------------------------------------------------- */

/* AUTH and SELECT must answer +OK, SCRIPT LOAD the script's SHA1: else
 * nothing works on this connection, and it closes with the reason. */
static void
handshake_check(struct redis_conn *c, const char *what, redisReply *r)
{
	char why[160];

	if (r == NULL)
		return; /* closing already */
	if (r->type == REDIS_REPLY_ERROR) {
		snprintf(why, sizeof(why), "%s failed: %s", what, r->str);
		c->refused = true;
		redis_conn_close(c, why);
	}
}

static void load_reply(void *arg, redisReply *r, const char *err);

/* Authenticated: a script over 16 KiB, which the handshake could not
 * send (queue_handshake), is loaded now, so that only calls already
 * queued behind AUTH meet NOSCRIPT (and go again, redis_batch.c). */
static void
auth_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_conn *c = arg;
	const char *argv[3] = { "SCRIPT", "LOAD", c->cfg->script };
	size_t lens[3] = { 6, 4, 0 };

	(void)err;
	handshake_check(c, "AUTH", r);
	if (r == NULL || r->type == REDIS_REPLY_ERROR ||
	    c->state == REDIS_CONN_CLOSED || c->cfg->script == NULL ||
	    (lens[2] = strlen(c->cfg->script)) <= 16384)
		return;
	(void)queue_command(c, 3, argv, lens, load_reply, c);
}

static void
select_reply(void *arg, redisReply *r, const char *err)
{
	(void)err;
	handshake_check(arg, "SELECT", r);
}

static void
ping_reply(void *arg, redisReply *r, const char *err)
{
	(void)err;
	handshake_check(arg, "PING", r);
}

static void
load_reply(void *arg, redisReply *r, const char *err)
{
	(void)err;
	handshake_check(arg, "SCRIPT LOAD", r);
}

/* ROLE: the owner says whether this server may have the commands held
 * behind it; they leave with the next write, or never. */
static void
role_reply(void *arg, redisReply *r, const char *err)
{
	struct redis_conn *c = arg;
	char why[160];

	(void)err;
	if (r == NULL)
		return; /* closing already */
	why[0] = '\0';
	if (c->cfg->role_check(c->cfg->role_arg, r, why, sizeof(why)))
		c->hold_at = UINT64_MAX;
	else
		redis_conn_close(c, why[0] != '\0' ? why : "ROLE refused");
}

static int
queue_handshake(struct redis_conn *c)
{
	const struct redis_url *u = c->cfg->url;
	const char *argv[3];
	size_t lens[3];
	char db[24];
	int n = 0, i;

	if (u->password != NULL) {
		argv[n++] = "AUTH";
		if (u->user != NULL)
			argv[n++] = u->user;
		argv[n++] = u->password;
		for (i = 0; i < n; i++)
			lens[i] = strlen(argv[i]);
		if (queue_command(c, n, argv, lens, auth_reply, c) == -1)
			return -1;
	}
	if (u->db != 0) {
		snprintf(db, sizeof(db), "%" PRId64, u->db);
		argv[0] = "SELECT";
		argv[1] = db;
		lens[0] = 6;
		lens[1] = strlen(db);
		if (queue_command(c, 2, argv, lens, select_reply, c) == -1)
			return -1;
	}
	/* Redis refuses a bulk string over 16 KiB from a client not yet
	 * authenticated, and reads the pipelined SCRIPT LOAD before AUTH
	 * has run: a larger script waits for its first NOSCRIPT instead.
	 * Without a password a server that wants one would close on such a
	 * SCRIPT LOAD with "unauthenticated bulk length": a PING first gets
	 * its clear NOAUTH, read before that.  With a password, AUTH's reply
	 * sends the script (auth_reply). */
	if (c->cfg->script != NULL && u->password == NULL &&
	    strlen(c->cfg->script) > 16384) {
		argv[0] = "PING";
		lens[0] = 4;
		if (queue_command(c, 1, argv, lens, ping_reply, c) == -1)
			return -1;
	}
	if (c->cfg->script != NULL &&
	    (u->password == NULL || strlen(c->cfg->script) <= 16384)) {
		argv[0] = "SCRIPT";
		argv[1] = "LOAD";
		argv[2] = c->cfg->script;
		lens[0] = 6;
		lens[1] = 4;
		lens[2] = strlen(c->cfg->script);
		if (queue_command(c, 3, argv, lens, load_reply, c) == -1)
			return -1;
	}
	if (c->cfg->role_check != NULL) {
		argv[0] = "ROLE";
		lens[0] = 4;
		if (queue_command(c, 1, argv, lens, role_reply, c) == -1)
			return -1;
		c->hold_at = c->queued_bytes;
	}
	return 0;
}

/*
 * TCP keepalive, probed after REDIS_KEEPALIVE_IDLE_S idle, so that a peer
 * gone without a word (a host that vanished, a NAT or load balancer that
 * dropped the idle flow) closes the connection within about 30 s.  Calls
 * in flight have their own timeout; this is for the connections that may
 * sit idle for long: the release subscription, Sentinel's, a pool
 * connection between bursts (docs/operations.md).
 */
static void
keepalive_on(int fd)
{
	int one = 1, idle = REDIS_KEEPALIVE_IDLE_S, intvl = 5, cnt = 3;

	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

/* A non-blocking connect to the first address of res that takes one.
 * Returns the socket, or -1 with err. */
static int
connect_addrs(const struct addrinfo *res, char *err, size_t errlen)
{
	const struct addrinfo *ai;
	int fd = -1, one = 1, saved = EADDRNOTAVAIL;

	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family,
		    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
		if (fd < 0) {
			saved = errno;
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ||
		    errno == EINPROGRESS)
			break;
		saved = errno;
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		snprintf(err, errlen, "connect: %s", strerror(saved));
		return -1;
	}
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	keepalive_on(fd);
	return fd;
}

/* A non-blocking connect to the unix socket at path: the socket, or -1
 * with err. */
static int
connect_unix(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sun;
	int fd;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sun.sun_path)) {
		snprintf(err, errlen, "connect: unix path too long");
		return -1;
	}
	util_strlcpy(sun.sun_path, path, sizeof(sun.sun_path));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 ||
	    (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 &&
		errno != EINPROGRESS && errno != EAGAIN)) {
		snprintf(err, errlen, "connect: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* The socket for a numeric host, -1 with err; or -2 when host is a name
 * (to be resolved off this thread). */
static int
connect_numeric(const struct redis_url *u, char *err, size_t errlen)
{
	struct addrinfo hints, *res = NULL;
	char port[8];
	int fd, rc;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%d", u->port);
	if ((rc = getaddrinfo(u->host, port, &hints, &res)) == EAI_NONAME)
		return -2;
	if (rc != 0) {
		snprintf(err, errlen, "connect: %s: %s", u->host,
		    gai_strerror(rc));
		return -1;
	}
	fd = connect_addrs(res, err, errlen);
	freeaddrinfo(res);
	return fd;
}

/*
 * Start connecting: a non-blocking connect, or for a host name a lookup
 * (the one in progress for that name if there is one), and queue the
 * handshake.  0 or -1 (err).
 */
static int
conn_open(struct redis_conn *c, char *err, size_t errlen)
{
	const struct redis_url *u = c->cfg->url;
	enum redis_conn_state state = REDIS_CONN_CONNECTING;
	int fd;

	c->refused = false;
	if (u->is_unix)
		fd = connect_unix(u->path, err, errlen);
	else if ((fd = connect_numeric(u, err, errlen)) == -2) {
		/* Wait again for a lookup still running; an answer that
		 * came while closed may be old: ask anew. */
		if (c->resolve != NULL &&
		    (!redis_resolve_is_for(c->resolve, u->host, u->port) ||
			redis_resolve_is_done(c->resolve))) {
			redis_resolve_drop(c->resolve);
			c->resolve = NULL;
		}
		if (c->resolve == NULL &&
		    (c->resolve = redis_resolve_start(u->host, u->port, err,
			 errlen)) == NULL)
			return -1;
		fd = redis_resolve_fd(c->resolve, err, errlen);
		state = REDIS_CONN_RESOLVING;
	}
	if (fd < 0)
		return -1;
	if ((c->reader = redis_reader_new()) == NULL) {
		if (state != REDIS_CONN_RESOLVING)
			close(fd);
		else
			redis_resolve_unwatch(c->resolve);
		snprintf(err, errlen, "connect: out of memory");
		return -1;
	}
	c->fd = fd;
	c->generation++;
	c->state = state;
	c->connect_deadline_us = util_monotonic_us() +
	    c->cfg->connect_timeout_us;
	if (queue_handshake(c) == -1) {
		redis_conn_close(c, "connect: out of memory");
		snprintf(err, errlen, "connect: out of memory");
		return -1;
	}
	return 0;
}

/* The lookup of a RESOLVING connection may be done: connect to what it
 * found, or close with why it found nothing. */
static void
conn_resolved(struct redis_conn *c)
{
	const struct addrinfo *res;
	char why[160];
	int fd;

	if (!redis_resolve_is_done(c->resolve))
		return;
	if ((res = redis_resolve_result(c->resolve, why, sizeof(why))) ==
		NULL ||
	    (fd = connect_addrs(res, why, sizeof(why))) < 0) {
		redis_conn_close(c, why);
		return;
	}
	redis_resolve_drop(c->resolve); /* closes the eventfd */
	c->resolve = NULL;
	c->fd = fd;
	c->generation++;
	c->state = REDIS_CONN_CONNECTING;
}

/* ---- sending and receiving ------------------------------------------- */

int
redis_conn_send(struct redis_conn *c, int argc, const char **argv,
    const size_t *lens, redis_reply_fn fn, void *arg, char *err, size_t errlen)
{
	if (c->state == REDIS_CONN_CLOSED && conn_open(c, err, errlen) == -1) {
		snprintf(c->last_error, sizeof(c->last_error), "%s", err);
		return -1;
	}
	if (queue_command(c, argc, argv, lens, fn, arg) == -1) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/* A TLS call that returned ret failed for good or waits for the socket:
 * 0 to wait (for writability when tls_wants_write), -1 after closing. */
static int
tls_wait_or_close(struct redis_conn *c, int ret)
{
	const struct redis_url *u = c->cfg->url;
	enum redis_tls_reason r;
	char why[256];
	bool handshake;

	switch (SSL_get_error(c->ssl, ret)) {
	case SSL_ERROR_WANT_WRITE:
		c->tls_wants_write = true;
		return 0;
	case SSL_ERROR_WANT_READ:
		return 0; /* the loop always waits for readability */
	default:
		/* In TLS 1.3 the server checks the client's certificate
		 * after our side of the handshake is over: a refusal comes
		 * with (or instead of) the first reply. */
		handshake = c->handshaking || c->tls_fresh;
		r = redis_tls_fail(c->cfg->tls, c->ssl, ret, handshake, u->host,
		    u->port, why, sizeof(why));
		if (r == REDIS_TLS_SHUTDOWN)
			handshake = false; /* closed on purpose: no refusal */
		else if (r != REDIS_TLS_CLOSED || handshake)
			redis_tls_session_clear(&c->session); /* failed */
		c->refused = handshake;
		redis_conn_close(c, why);
		return -1;
	}
}

/* Write what is buffered through TLS.  0, or -1 after closing. */
static int
conn_write_tls(struct redis_conn *c)
{
	size_t left, end = out_end(c);
	int w;

	while (c->out_off < end) {
		left = end - c->out_off;
		/* Whatever SSL_write is given may leave, in part, even when
		 * it asks to be called again. */
		c->written_bytes = c->queued_bytes - (c->out_len - end);
		ERR_clear_error();
		w = SSL_write(c->ssl, c->out + c->out_off,
		    left > INT_MAX ? INT_MAX : (int)left);
		if (w <= 0)
			return tls_wait_or_close(c, w);
		c->out_off += (size_t)w;
	}
	if (end == c->out_len)
		c->out_off = c->out_len = 0;
	return 0;
}

/* Write what is buffered.  0, or -1 after closing. */
static int
conn_write(struct redis_conn *c)
{
	char why[160];
	size_t end;
	ssize_t w;

	if (c->ssl != NULL)
		return conn_write_tls(c);
	end = out_end(c);
	while (c->out_off < end) {
		w = send(c->fd, c->out + c->out_off, end - c->out_off,
		    MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			snprintf(why, sizeof(why), "write: %s",
			    strerror(errno));
			redis_conn_close(c, why);
			return -1;
		}
		c->out_off += (size_t)w;
		c->written_bytes += (uint64_t)w;
	}
	if (end == c->out_len)
		c->out_off = c->out_len = 0;
	return 0;
}

/* Read what is there and hand back every complete reply.  Returns the
 * number of replies; the connection may be closed afterwards. */
static size_t
conn_read(struct redis_conn *c)
{
	char buf[REDIS_CONN_READ_CHUNK], why[160];
	struct redis_pending p;
	size_t replies = 0;
	void *reply;
	ssize_t n;

	for (;;) {
		if (c->ssl != NULL) {
			int r;

			ERR_clear_error();
			if ((r = SSL_read(c->ssl, buf, sizeof(buf))) <= 0) {
				(void)tls_wait_or_close(c, r);
				return replies;
			}
			n = r;
		} else
			n = recv(c->fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return replies;
		if (n <= 0) {
			snprintf(why, sizeof(why), "%s",
			    n == 0 ? "connection closed by the server" :
				     strerror(errno));
			redis_conn_close(c, why);
			return replies;
		}
		if (redisReaderFeed(c->reader, buf, (size_t)n) != REDIS_OK) {
			redis_conn_close(c, "reply reader: out of memory");
			return replies;
		}
		for (;;) {
			reply = NULL;
			if (redisReaderGetReply(c->reader, &reply) !=
			    REDIS_OK) {
				snprintf(why, sizeof(why), "protocol: %s",
				    c->reader->errstr);
				redis_conn_close(c, why);
				return replies;
			}
			if (reply == NULL)
				break;
			c->tls_fresh = false;
			if (c->count == 0 && c->push_fn != NULL) {
				c->push_fn(c->push_arg, reply, NULL);
				redis_reply_free(reply);
				replies++;
				if (c->state == REDIS_CONN_CLOSED)
					return replies;
				continue;
			}
			if (c->count == 0) {
				redis_reply_free(reply);
				redis_conn_close(c,
				    "protocol: a reply "
				    "nobody asked for");
				return replies;
			}
			p = ring_pop(c);
			p.fn(p.arg, reply, NULL);
			redis_reply_free(reply);
			replies++;
			/* A callback may have closed us. */
			if (c->state == REDIS_CONN_CLOSED)
				return replies;
		}
		if ((size_t)n < sizeof(buf) && c->ssl == NULL)
			return replies;
	}
}

/* With cfg->tls, once connect(2) is done: start or go on with the TLS
 * handshake.  1 when it is over (UP), 0 while it waits for the socket,
 * -1 after closing. */
static int
conn_handshake(struct redis_conn *c)
{
	const struct redis_url *u = c->cfg->url;
	char why[256];
	int r;

	if (c->ssl == NULL) {
		c->ssl = redis_tls_ssl_new(c->cfg->tls, u->host, u->port,
		    &c->session, why, sizeof(why));
		if (c->ssl == NULL || SSL_set_fd(c->ssl, c->fd) != 1) {
			if (c->ssl != NULL)
				snprintf(why, sizeof(why),
				    REDIS_TLS_PREFIX "cannot set up");
			redis_conn_close(c, why);
			return -1;
		}
		SSL_set_connect_state(c->ssl);
		c->handshaking = true;
	}
	ERR_clear_error();
	if ((r = SSL_do_handshake(c->ssl)) != 1)
		return tls_wait_or_close(c, r);
	c->handshaking = false;
	c->tls_fresh = true;
	log_debug("redis %s:%d: %s, %s%s", u->host, u->port,
	    SSL_get_version(c->ssl), SSL_get_cipher_name(c->ssl),
	    SSL_session_reused(c->ssl) ? ", session resumed" : "");
	return 1;
}

void
redis_conn_flush(struct redis_conn *c)
{
	if (c->state == REDIS_CONN_UP)
		(void)conn_write(c);
}

size_t
redis_conn_io(struct redis_conn *c)
{
	char why[160];
	socklen_t len = sizeof(int);
	int soerr = 0;

	c->tls_wants_write = false;
	if (c->state == REDIS_CONN_RESOLVING) {
		conn_resolved(c);
		return 0;
	}
	if (c->state == REDIS_CONN_CLOSED)
		return 0;
	if (c->state == REDIS_CONN_CONNECTING && c->ssl != NULL) {
		if (conn_handshake(c) != 1)
			return 0;
		c->state = REDIS_CONN_UP;
	} else if (c->state == REDIS_CONN_CONNECTING) {
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
			soerr = errno;
		if (soerr == EINPROGRESS || soerr == EALREADY)
			return 0;
		if (soerr != 0) {
			snprintf(why, sizeof(why), "connect: %s",
			    strerror(soerr));
			redis_conn_close(c, why);
			return 0;
		}
		if (c->cfg->tls != NULL && !c->cfg->url->is_unix &&
		    conn_handshake(c) != 1)
			return 0;
		c->state = REDIS_CONN_UP;
	}
	if (conn_write(c) == -1)
		return 0;
	return conn_read(c);
}

/* ---- state ----------------------------------------------------------- */

int
redis_conn_fd(const struct redis_conn *c)
{
	return c->fd;
}

bool
redis_conn_wants_write(const struct redis_conn *c)
{
	if (c->state == REDIS_CONN_RESOLVING)
		return false; /* an eventfd is always writable */
	if (c->tls_wants_write)
		return true;
	if (c->state == REDIS_CONN_CONNECTING)
		return c->ssl == NULL; /* the handshake reads */
	return c->out_off < out_end(c);
}

enum redis_conn_state
redis_conn_state(const struct redis_conn *c)
{
	return c->state;
}

uint64_t
redis_conn_generation(const struct redis_conn *c)
{
	return c->generation;
}

size_t
redis_conn_pending(const struct redis_conn *c)
{
	return c->count;
}

int64_t
redis_conn_oldest_us(const struct redis_conn *c)
{
	return c->count == 0 ? INT64_MAX : c->ring[c->head].queued_us;
}

int64_t
redis_conn_connect_deadline_us(const struct redis_conn *c)
{
	return c->state == REDIS_CONN_CONNECTING ||
		c->state == REDIS_CONN_RESOLVING ?
	    c->connect_deadline_us :
	    INT64_MAX;
}

void
redis_conn_connect_expired(struct redis_conn *c)
{
	const struct redis_url *u = c->cfg->url;

	if (c->ssl != NULL && c->handshaking) {
		redis_tls_fail_timeout(c->cfg->tls, u->host, u->port);
		c->refused = true;
		redis_conn_close(c, REDIS_TLS_HUNG);
	} else
		redis_conn_close(c, "connect: timed out");
}

bool
redis_conn_unwritten(const struct redis_conn *c)
{
	return c->unwritten;
}

bool
redis_conn_refused(const struct redis_conn *c)
{
	return c->refused;
}

const char *
redis_conn_last_error(const struct redis_conn *c)
{
	return c->last_error;
}
