/*
 * grpc_priv.h - what the files of the gRPC front end share (grpc.h is the
 * outside's view): the server, its loops, a connection, a stream and a
 * call, the limits, and the functions each file gives the others, grouped
 * by file.
 *
 *   grpc.c       the server's life: start, the event-loop threads,
 *                quiesce, stop, the config; grpc_fuzz_feed()
 *   grpc_conn.c  connections: accept and its back-off, read, write, the
 *                loop's turn (answers back from the store, the sweep of
 *                timeouts)
 *   grpc_h2.c    the nghttp2 session callbacks: streams, headers and
 *                their limit, the message, resets and their accounting
 *   grpc_call.c  calls: a whole request checked, the decision or health
 *                call, the store's completion, the answers and gRPC's
 *                framing of them
 *
 * A call is one HTTP/2 stream (docs/grpc.md): request headers (:method
 * POST, :path the method, content-type application/grpc, grpc-timeout),
 * one length-prefixed message, end of stream.  The answer is headers, one
 * length-prefixed message and trailers with grpc-status; a call that fails
 * before a message is answered "trailers-only" (the status in the
 * headers).  nghttp2 does the HTTP/2 framing, flow control and stream
 * states; the front keeps per stream only what the call needs.
 *
 * Ownership: a struct gstream belongs to its connection and dies with its
 * HTTP/2 stream.  A decision or health probe in the store's hands is a
 * struct gcall, owned by the store until its completion queues it on its
 * loop; the loop then answers the stream if it still exists and frees the
 * call.  A stream that closes first only unlinks itself from its call.  A
 * closed connection stays allocated while calls of it are in the store.
 *
 * Threads: `threads` event loops (struct gloop), each with its own epoll
 * holding the shared listener (EPOLLEXCLUSIVE, so one loop wakes per new
 * connection); a connection, its streams and its calls' answers belong to
 * the loop that accepted it, and every function below runs on that loop's
 * thread unless its comment says otherwise.
 *
 * What one client can cost (docs/security.md, docs/grpc.md): a connection
 * has at most GRPC_MAX_STREAMS calls in the store at once, counting those
 * whose stream it has reset, and is not read while it has that many; a
 * whole request beyond it, or beyond GRPC_MAX_PENDING calls in the store
 * for the whole server, waits for a place.  A connection that abandons
 * more calls than it has had answered (plus GRPC_MAX_STREAMS) is sent
 * GOAWAY, as is one resetting streams faster than nghttp2's reset rate
 * limit allows, or one refusing header lists GRPC_HEADER_STRIKES times.
 */
#ifndef RL_GRPC_PRIV_H
#define RL_GRPC_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>

#include "core/backend.h"
#include "core/config_slot.h"
#include "core/decide.h"
#include "front/grpc.h"
#include "front/rls.h"

#define GRPC_PREFIX	 5   /* compressed flag, length (BE) */
#define GRPC_MAX_STREAMS 128 /* concurrent calls per connection */
#define GRPC_READ_CHUNK	 16384
/* Request bytes held per connection. */
#define GRPC_CONN_BUFFERED (256 * 1024)
#define GRPC_TICK_MS	   250 /* timeouts are checked this often */
#define GRPC_LINGER_MS \
	1000			  /* a closing connection's wait for the \
				   * client's own close */
#define GRPC_ACCEPT_PAUSE_MS 100  /* out of descriptors: accept later */
#define GRPC_ACCEPT_BATCH    16	  /* accepted per wake, so loops share */
#define GRPC_MAX_PENDING     1024 /* calls in the store, whole server */
#define GRPC_RESET_BURST     512  /* RST_STREAM frames a client may */
#define GRPC_RESET_RATE	     128  /* send at once, and then per second */
#define GRPC_HEADER_STRIKES  2	  /* header lists refused, then GOAWAY */

#define PATH_RLS \
	"/envoy.service.ratelimit.v3.RateLimitService/" \
	"ShouldRateLimit"
#define PATH_HEALTH "/grpc.health.v1.Health/Check"
#define SERVICE_RLS "envoy.service.ratelimit.v3.RateLimitService"

enum gmethod { M_NONE, M_RLS, M_HEALTH, M_OTHER };

struct gconn;
struct gcall;

/* One call's HTTP/2 stream; its connection owns it (grpc_h2.c makes and
 * frees it). */
struct gstream {
	int32_t id;
	struct gconn *c;
	enum gmethod method;
	bool post, grpc_type; /* :method POST, application/grpc */
	bool too_big;	      /* the message passed max_body_bytes */
	bool over_budget;     /* or GRPC_CONN_BUFFERED */
	bool answered;
	bool cut;	     /* reset once its answer is out */
	bool waiting;	     /* whole, waiting for a place */
	size_t header_bytes; /* decoded, as HTTP/2 counts them */
	bool reset;	     /* RST_STREAM submitted */
	int64_t start_us;    /* monotonic, at its first header */
	int64_t answered_us; /* when its answer was submitted */
	int64_t timeout_us;  /* grpc-timeout (0: passed), or -1 */
	uint8_t *in;	     /* the request's bytes, until decoded */
	size_t inlen, incap;
	uint8_t *out; /* the framed response message */
	size_t outlen, outoff;
	int status;	    /* grpc-status for the trailers */
	struct gcall *call; /* in the store's hands, or NULL */
	struct gstream *next, *prev;
};

/* One client connection; its loop owns it (grpc_conn.c). */
struct gconn {
	int fd;
	struct grpc_server *s;
	struct gloop *l; /* the loop that owns it */
	nghttp2_session *h2;
	struct gstream *streams;
	int nstreams;
	int ncalls;	 /* its calls in the store, their
			  * streams reset or not */
	int nwaiting;	 /* streams with waiting set */
	int credit;	 /* calls it may still abandon */
	int strikes;	 /* header lists refused */
	size_t buffered; /* bytes allocated for its streams'
			  * requests (incap), not yet decoded */
	int64_t last_us; /* last read, monotonic */
	int64_t out_us;	 /* last byte written, or nothing
			  * left to write */
	uint32_t events; /* what its epoll entry watches */
	bool goaway;	 /* the graceful GOAWAY sent (quiesce,
			  * idle) */
	bool calm;	 /* GOAWAY ENHANCE_YOUR_CALM sent: it
			  * abused the server; sent even after
			  * the graceful one */
	bool dead;	 /* closed; freed when ncalls is 0 */
	bool closing;	 /* GOAWAY sent and our side shut: what
			  * comes is dropped until the client
			  * closes too or close_at */
	int64_t close_at;
	struct gconn *next, *prev;
};

/* A decision or a probe in the store's hands. */
struct gcall {
	struct grpc_server *s;
	struct gconn *c;    /* kept allocated while it is here */
	struct gstream *st; /* NULL once the stream is gone */
	struct config *cfg; /* one reference */
	enum gmethod method;
	struct rls_call rls;	   /* M_RLS */
	struct backend_call probe; /* M_HEALTH */
	struct gcall *qnext;
};

/* One event loop: its thread, epoll and connections. */
struct gloop {
	struct grpc_server *s;
	int efd, epfd;
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t lock; /* guards the done queue */
	struct gcall *done_head, *done_tail;
	bool quiesced;	      /* the loop acted on quiesce */
	bool listening;	      /* the listener is in the epoll */
	bool fd_warned;	      /* out of descriptors, logged */
	int64_t accept_at_us; /* paused: listen again then */
	struct config *cur;   /* the loop's snapshot for this turn */
	struct gconn *conns;
};

/* One per server: made by grpc_server_start(), freed by
 * grpc_server_stop(); the atomics are read and written by every thread. */
struct grpc_server {
	int lfd;
	const struct decider *decider;
	struct metrics *metrics;
	struct config_slot cfg; /* the snapshot served */

	atomic_bool quiesce, stop;
	atomic_int inflight;  /* calls received, not answered */
	atomic_int pending;   /* places in the store taken: gcalls
			       * not yet back (grpc_call_take_place) */
	atomic_int nconns;    /* open connections, every loop */
	atomic_int nquiesced; /* loops that acted on quiesce */
	nghttp2_session_callbacks *cbs;
	nghttp2_option *opt;
	struct gloop *loops;
	int nloops;
};

/* epoll tags for the two fds of a loop that are not connections (grpc.c). */
extern char grpc_tag_listen, grpc_tag_event;

/* ---- grpc.c ----------------------------------------------------------- */

/* Wake loop l (its eventfd).  Any thread. */
void grpc_loop_wake(struct gloop *l);

/* ---- grpc_conn.c ------------------------------------------------------ */

/* A connection of loop l on fd (-1: none, for grpc_fuzz_feed), its
 * SETTINGS queued; linked into l's list.  NULL when out of memory. */
struct gconn *grpc_conn_new(struct gloop *l, int fd);

/* Close c: its streams, session and socket; it is freed at once, or with
 * the last of its calls back from the store (grpc_loop_drain). */
void grpc_conn_close(struct gconn *c);

/* Is c read?  Not while it has GRPC_MAX_STREAMS calls in the store or a
 * whole request waiting for a place. */
bool grpc_conn_reading(const struct gconn *c);

/* Write what nghttp2 has and set what c's epoll entry watches.  Closes a
 * connection that is done or failed (returns false then). */
bool grpc_conn_flush(struct gconn *c);

/* Read what the socket has (while c is read), then flush. */
void grpc_conn_read(struct gconn *c);

/* Put the listener back in l's epoll, unless quiescing.  0 or -1. */
int grpc_listen_resume(struct gloop *l);

/* Accept up to GRPC_ACCEPT_BATCH connections; out of descriptors, take
 * the listener out of the epoll for GRPC_ACCEPT_PAUSE_MS. */
void grpc_loop_accept(struct gloop *l);

/* Answer the calls the store gave back, start requests that waited for
 * their places, and write. */
void grpc_loop_drain(struct gloop *l);

/* Once per tick: request_timeout, idle_timeout and quiescing. */
void grpc_loop_sweep(struct gloop *l);

/* ---- grpc_h2.c -------------------------------------------------------- */

/* Make s->cbs (the session callbacks) and s->opt (the reset rate limit).
 * 0, or -1 when out of memory (what was made is the caller's to free).
 * Start-up, or grpc_fuzz_feed()'s thread. */
int grpc_h2_callbacks_new(struct grpc_server *s);

/* Free the request bytes of st (it is decoded, refused or answered) and
 * take them off its connection's GRPC_CONN_BUFFERED.  Again: nothing. */
void grpc_stream_drop_request(struct gstream *st);

/* Unlink st from c (and from its call, which the store may still have)
 * and free it. */
void grpc_stream_free(struct gconn *c, struct gstream *st);

/* ---- grpc_call.c ------------------------------------------------------ */

/* Answer st, once, with a failure: trailers-only, the status in the
 * headers, message percent-encoded into grpc-message. */
void grpc_answer_status(struct gstream *st, int status, const char *message);

/* The whole request of st is in (END_STREAM): check it, then start its
 * call, or let it wait while its connection (or the server) has no place
 * in the store. */
void grpc_stream_request(struct gstream *st);

/* Start the call of a whole, well-formed request in the place
 * grpc_call_take_place() gave it (given back if the call is settled
 * without the store). */
void grpc_stream_start(struct gstream *st);

/* Take a place in the store for one more call of c: true when there was
 * one (c below GRPC_MAX_STREAMS, the server below GRPC_MAX_PENDING, the
 * latter reserved atomically against the other loops). */
bool grpc_call_take_place(const struct gconn *c);

/* Answer a call back from the store, if its stream is still there. */
void grpc_call_answer(struct gcall *gc);

/* Free a call (its config reference and decoded request). */
void grpc_call_free(struct gcall *gc);

#endif
