/*
 * http_priv.h - what the files of the HTTP front end share (http.h is the
 * outside's view): the server, a request, and the functions each file
 * gives the others, grouped by file.
 *
 *   http.c           the server's life cycle, the dispatch of
 *                    libmicrohttpd's calls, suspend and resume
 *   http_request.c   a request's attributes from its body and headers
 *   http_framing.c   how a request says where it ends (RFC 9112 6)
 *   http_handlers.c  one handler per endpoint, and the routing
 *   http_wait.c      waiting for a turn or for a lease
 *   http_response.c  every answer: errors, decisions, the raw answer
 *   http_loop.c      an event loop: its libmicrohttpd daemon, its inbox,
 *                    and on the first the store's I/O
 *   http_accept.c    the acceptor: connections to the loops in turn
 *
 * Threads: a request belongs to the event-loop thread of its connection
 * (http_loop.c) except while its connection is suspended; then exactly
 * one other thread has it (the one that runs the store's I/O, the wait
 * timer or the lease queues), and the resume gives it back.  On the loop
 * that runs the store's I/O, that is the loop itself.
 */
#ifndef RL_HTTP_PRIV_H
#define RL_HTTP_PRIV_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "core/config_slot.h"
#include "core/decide.h"
#include "core/rate_headers.h"
#include "core/rules.h"
#include "core/stats_request.h"
#include "front/http.h"
#include "front/lease_wait.h"

#define JSON_TYPE "application/json"

enum endpoint {
	EP_ACQUIRE,
	EP_AUTH,
	EP_READY,
	EP_SIMPLE,
	EP_BAD_METHOD,
	EP_NOT_FOUND,
	EP_RECORD,
	EP_STATS, /* docs/stats.md */
	EP_RELEASE,
	EP_RENEW,   /* docs/leases.md */
	EP_REPORT,  /* docs/http.md, POST /report */
	EP_NUL_PATH /* any: the path has an encoded NUL (400) */
};

/* The endpoints whose JSON body is read, and which are answered with a
 * decision when answered straight on the socket (http_resume()). */
#define EP_HAS_BODY(ep) \
	((ep) == EP_ACQUIRE || (ep) == EP_RECORD || (ep) == EP_STATS || \
	    (ep) == EP_RELEASE || (ep) == EP_RENEW || (ep) == EP_REPORT)
#define EP_DECIDES(ep) ((ep) == EP_ACQUIRE || (ep) == EP_AUTH)

/* One per server; made by http_server_start(), freed by
 * http_server_stop().  The atomics are read and written by every thread. */
struct http_server {
	struct MHD_Daemon **mhd;  /* one per loop, external epoll */
	struct http_loop **loops; /* `threads` (http_loop.h) */
	size_t nloops;
	size_t next_loop;		/* the acceptor's: the next to get a
					 * connection */
	struct http_acceptor *acceptor; /* owns the listening socket */
	struct config_slot cfg;		/* the snapshot served */
	const struct decider *decider;	/* borrowed */
	struct metrics *metrics;	/* borrowed */
	int inflight;			/* atomic */
	int suspended;			/* atomic: waiting for the store */
	int resuming;			/* atomic: resumes under way */
	bool draining;			/* atomic: quiesced; close after each
					 * answer */
	bool stopping;			/* atomic: suspend nothing more */
	struct http_guard *guard;	/* connection limit, request timeout */
	struct wait_timer *timer;	/* answers waiting requests */
	long long waiting;		/* atomic: requests that may wait */
	struct lease_wait *leases;	/* requests waiting for a lease;
					 * borrowed */
};

/*
 * Where a request is in its life.  Every move goes through
 * http_request_enter() (http.c), which refuses a move the life does not
 * make and does what the move implies:
 *
 *   READING --> ANSWERING --------------------------------> DONE
 *      |            |  ^                                     ^
 *      |            v  |                                     |
 *      +--> DECIDING, WAITING_LEASE, WAITING_TURN            |
 *           (suspended)    |                                 |
 *                          +--> RESUMED --> ANSWERING ...    |
 *                                   |                        |
 *                                   +------------------------+
 *
 * Entering a suspended state counts the request in s->suspended (refused
 * when the server is stopping), marks it waiting for the guard and
 * suspends the connection; WAITING_TURN and WAITING_LEASE count it once
 * in their gauge.  RESUMED resumes the connection (the thread that moves
 * it there has the request until then); RESUMED goes to DONE when the
 * client half-closed meanwhile (request_completed() answers on the
 * socket).  Leaving them
 * uncounts the suspension; DONE gives back the wait slot and the gauges.
 */
enum request_state {
	RQ_READING,	  /* the loop: headers and body come in */
	RQ_DECIDING,	  /* suspended: a store call is out
			   * (http_submit) */
	RQ_WAITING_LEASE, /* suspended: in the lease queues, tries
			   * included (http_wait.c) */
	RQ_WAITING_TURN,  /* suspended: the wait timer has it */
	RQ_RESUMED,	  /* resumed with its answer; the handler has
			   * not run yet */
	RQ_ANSWERING,	  /* the loop: answered inline or after a
			   * resume, or about to wait */
	RQ_DONE		  /* answered or abandoned; freed next */
};

/* One per request: made by the first call of access_handler() (http.c),
 * freed by request_completed(); owns everything it points to but s, conn
 * and cfg's reference. */
struct request {
	enum endpoint ep;
	enum request_state state;
	struct http_server *s;
	struct http_loop *loop; /* whose daemon has conn (http_loop.h) */
	struct config *cfg;	/* the snapshot this request uses */
	int64_t arrived_us;
	int64_t replied_us; /* the store's reply resumed it (the
			     * resume phase, metrics_phase); 0: not */
	char *body;
	size_t len, cap;
	bool too_large;

	/* What decide takes and gives, kept here while the connection is
	 * suspended and the store decides. */
	struct MHD_Connection *conn;
	struct attrs attrs;
	char *rule;
	struct decide_request dr;
	struct decision decision;
	struct backend_call probe;   /* EP_READY */
	struct stats_request sr;     /* EP_RECORD, EP_STATS */
	struct rl_check lease_check; /* EP_RELEASE, EP_RENEW, with probe */
	struct rl_result lease_out;
	char *lease_key;      /* lease_check's key and token */
	int calls_pending;    /* atomic: store calls not done */
	uint64_t body_seen;   /* body bytes, kept or not */
	int64_t declared_len; /* Content-Length, or -1 */
	/*
	 * Waiting (docs/waiting.md, docs/leases.md with wait_ms).  These are
	 * not states: wait_slot is a share of max_waiting held for the whole
	 * life whatever the state; waited_turn, waited_lease and lease_over
	 * remember what already happened, which the state does not (a
	 * request waits at most once for each, is in each gauge until DONE,
	 * and stops waiting for a lease at its deadline while the last try
	 * is still out); cut is part of the answer, like the decision.
	 */
	bool wait_slot;	   /* counted in s->waiting */
	bool waited_turn;  /* entered WAITING_TURN; in its gauge */
	bool waited_lease; /* entered WAITING_LEASE; in its gauge */
	bool turn_came;	   /* the decision's reserved time came (it
			    * entered WAITING_TURN for it): answer */
	bool lease_over;   /* no more waiting for a lease */
	bool lease_lost;   /* a lease ran out before its answer:
			    * released, and decided again */
	bool lease_look;   /* the next try only looks at the lease */
	bool cut;	   /* a shutdown cut the wait: the answer
			    * is 503 shutting_down */
	struct lease_waiter lw;
	int64_t wait_until_us;	 /* arrival + wait_ms */
	int64_t lease_waited_ms; /* answered after this wait */
	int64_t answer_us;	 /* the answer goes out then: its leases'
				  * expires_ms count to it; 0: not set */
	int64_t tried_us;	 /* the last decision was asked then */
	bool queued;		 /* behind others that wait for queued_key:
				  * the decision only looked at the lease */
	uint64_t queued_key;
};

/* --- http.c: suspend and resume (the event loop; http_resume() on any
 * thread) ----------------------------------------------------------------- */
/* Move rq (enum request_state above); false only when the server stops
 * and refuses a suspension. */
bool http_request_enter(struct request *rq, enum request_state to);
/* Wake a suspended rq: the store's, the timer's or the queues' thread. */
void http_resume(void *arg);
/* Hand a decision job or n backend calls to the store: 1 answered inline
 * (answer now), 0 suspended (return MHD_YES), -1 the server stops. */
int http_submit(struct request *rq, struct decide_job *job,
    struct backend_call *calls, size_t n);

/* --- http_response.c (the event loop; http_answer_raw() where noted) --- */
/* Queue an answer on conn (body copied, or a prepared response consumed);
 * "Connection: close" once the server drains. */
enum MHD_Result http_respond(struct http_server *s, struct MHD_Connection *conn,
    int status, const char *type, const char *body, size_t len,
    struct MHD_Response *prepared);
/* The one place the error JSON {"error": code, "message": ...} is built:
 * a new buffer (free()), or NULL when out of memory. */
char *http_error_json(const char *code, const char *fmt, va_list ap);
char *http_error_text(const char *code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
enum MHD_Result http_respond_error(struct http_server *s,
    struct MHD_Connection *conn, int status, const char *code, const char *fmt,
    ...) __attribute__((format(printf, 5, 6)));
/* An error answer that closes its connection (framing in doubt). */
enum MHD_Result http_refuse(struct http_server *s, struct MHD_Connection *conn,
    int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The same, written straight on the socket fd of a request that
 * libmicrohttpd refused itself (http_framing.c); false when the socket
 * refused it. */
bool http_refuse_raw(struct http_server *s, int fd, int status,
    const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
char *http_fmt_buf(char *stack, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void http_fmt_free(char *text, const char *stack);
enum MHD_Result http_respond_decision(struct http_server *s,
    struct MHD_Connection *conn, const struct request *rq);
/*
 * A decision rendered once (http_render_decision()): what the MHD response
 * and the raw answer both send.  body points into stack or to a new
 * buffer, so an http_answer is never copied; http_answer_clear() frees.
 */
struct http_answer {
	int status;
	const char *type; /* Content-Type (static), or NULL */
	char *body;
	size_t len;
	struct rate_header headers[RATE_HEADERS_MAX];
	size_t nheaders;
	char stack[512];
};
int http_render_decision(const struct request *rq, struct http_answer *a);
void http_answer_clear(struct http_answer *a);
/* The event loop, for a resumed request whose client half-closed
 * (request_completed()): the rendered answer written straight on the
 * socket fd. */
bool http_answer_raw(struct http_server *s, int fd, const struct request *rq);

/* --- http_request.c (the event loop) ------------------------------------ */
/* The headers and peer of conn through http_request.h: 0, -1 (out of
 * memory), -2 (more headers than max_attributes, less the four that
 * /auth derives) or -3 (a path refused: an encoded NUL).  The mapping
 * itself is in http_request.h. */
int http_auth_attrs(struct MHD_Connection *conn, const struct config *cfg,
    const char *url, const char *method, struct attrs *a);

/* The guard's record of a connection (its socket context), or NULL.
 * http.c; the connection's loop. */
void *http_conn_ctx(struct MHD_Connection *conn);

/* --- http_framing.c (the event loop) ------------------------------------ */
/* MHD_YES with *answered false to go on, or an answer that closes. */
enum MHD_Result http_check_framing(struct http_server *s,
    struct MHD_Connection *conn, const struct config *cfg, const char *url,
    bool *answered);
/* libmicrohttpd's request-line callback (MHD_OPTION_URI_LOG_CALLBACK):
 * conn's headers are being read.  Returns the access handler's first
 * *con_cls: NULL, or a mark (http_framing_path_nul()) when the path of
 * the raw target uri has an encoded NUL, which the decoded url hides. */
void *http_framing_request_line(void *cls, const char *uri,
    struct MHD_Connection *conn);
/* Is con_cls the mark of a path with an encoded NUL (no struct request)? */
bool http_framing_path_nul(const void *con_cls);
/* conn's headers reached the access handler, or conn closed. */
void http_framing_headers_done(struct MHD_Connection *conn);
/* libmicrohttpd logged msg: when it refused a Content-Length by itself,
 * answer that request once here and shut its socket (see
 * http_framing.c).  True when it did. */
bool http_framing_mhd_refused(struct http_server *s, const char *msg);

/* --- http_wait.c (the event loop, but http_lease_event() on the queues'
 * thread) ---------------------------------------------------------------- */
/* Allowed by a reservation whose time has not come yet. */
bool http_wait_needed(const struct request *rq);
/* Take a share of max_waiting for a request with wait_ms (else it is
 * decided as if it had none). */
void http_wait_take_slot(struct http_server *s, struct request *rq);
/* The lease queues' thread: what became of rq's wait for a lease. */
void http_lease_event(struct lease_waiter *w, enum lease_wait_event ev);
/* A newcomer of a key others wait for: its job only looks at the lease,
 * and it queues behind them if it may wait (before http_submit()). */
void http_lease_queue_behind(struct http_server *s, struct request *rq,
    struct decide_job *job);
/* A decided request: wait for a lease or for its turn, or answer. */
enum MHD_Result http_answer_decision(struct http_server *s,
    struct MHD_Connection *conn, struct request *rq);
/* Before the raw answer of a resumed request (request_completed()): true
 * when it may go out; false when a lease it took has nothing left, which
 * is then released (the connection closes unanswered). */
bool http_wait_raw_ready(struct request *rq);

/* --- http_handlers.c (the event loop) ----------------------------------- */
void http_log_access(const struct request *rq);
enum MHD_Result http_finish_decision(struct http_server *s,
    struct MHD_Connection *conn, struct request *rq);
enum MHD_Result http_handle_decision(struct http_server *s,
    struct MHD_Connection *conn, struct request *rq, const char *url,
    const char *method);
enum MHD_Result http_handle_ready(struct http_server *s,
    struct MHD_Connection *conn, struct request *rq);
enum MHD_Result http_handle_stats(struct http_server *s,
    struct MHD_Connection *conn, struct request *rq);
enum MHD_Result http_handle_lease(struct http_server *s,
    struct MHD_Connection *conn, struct request *rq);
enum MHD_Result http_handle_report(struct http_server *s,
    struct MHD_Connection *conn, struct request *rq);
enum MHD_Result http_handle_simple(struct http_server *s,
    struct MHD_Connection *conn, const char *url);
enum endpoint http_route(const char *url, const char *method);

#endif
