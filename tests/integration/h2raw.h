/*
 * h2raw.h - HTTP/2 by hand for the tests of the gRPC front end
 * (check_grpc.c): frames written byte by byte, as no well-behaved client
 * library would send them (a window of 0, thousands of resets, a header
 * block that decodes to megabytes), and the server's frames read back one
 * at a time, with its header blocks decoded by libnghttp2's HPACK
 * inflater so a test can look for "grpc-status: 4".
 *
 * One struct h2raw is one connection, used by one thread.  Functions that
 * can fail call ck_abort_msg(), like the harness's.
 */
#ifndef RL_H2RAW_H
#define RL_H2RAW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
	H2_DATA = 0,
	H2_HEADERS = 1,
	H2_RST_STREAM = 3,
	H2_SETTINGS = 4,
	H2_PING = 6,
	H2_GOAWAY = 7,
	H2_WINDOW_UPDATE = 8,
	H2_CONTINUATION = 9
};
enum { H2_END_STREAM = 0x1, H2_ACK = 0x1, H2_END_HEADERS = 0x4 };
enum { H2_SET_INITIAL_WINDOW_SIZE = 4 };

#define H2RAW_RLS_PATH \
	"/envoy.service.ratelimit.v3.RateLimitService/" \
	"ShouldRateLimit"

struct h2raw {
	int fd;
	void *inflater; /* nghttp2_hd_inflater */
	uint8_t *in;	/* read, not yet a whole frame */
	size_t inlen, incap;
	int closed_errno; /* once h2raw_read() saw the close: 0 for an
			   * orderly one (EOF), else recv's errno */
};

/* One frame from the server.  payload is valid until the next read. */
struct h2raw_frame {
	uint8_t type, flags;
	uint32_t stream;
	const uint8_t *payload;
	size_t len;
	char headers[4096]; /* HEADERS: "name: value\n" lines */
};

/* Connect to 127.0.0.1:port and send the preface and one SETTINGS frame
 * with n (id, value) pairs.  Aborts the test on failure. */
void h2raw_connect(struct h2raw *c, int port, const uint32_t *settings,
    size_t n);

void h2raw_close(struct h2raw *c);

/* Append one frame's bytes to buf at *len (buf must have room). */
void h2raw_frame(uint8_t *buf, size_t *len, uint8_t type, uint8_t flags,
    uint32_t stream, const void *payload, size_t plen);

/* Append a HEADERS frame (END_HEADERS, and END_STREAM when end) opening
 * a gRPC call of path on stream: literal fields, no Huffman, no index. */
void h2raw_call_headers(uint8_t *buf, size_t *len, uint32_t stream,
    const char *path, bool end);

/* The same with a grpc-timeout header of value timeout (NULL: none). */
void h2raw_call_headers_timeout(uint8_t *buf, size_t *len, uint32_t stream,
    const char *path, const char *timeout, bool end);

/* Append a DATA frame with END_STREAM carrying one gRPC message: a
 * RateLimitRequest for domain with one descriptor [key=value]. */
void h2raw_call_data(uint8_t *buf, size_t *len, uint32_t stream,
    const char *domain, const char *key, const char *value);

/* The same with a second attribute in the descriptor, "pad" of padlen
 * bytes (up to 15,000: one frame), and END_STREAM only when end. */
void h2raw_call_data_pad(uint8_t *buf, size_t *len, uint32_t stream,
    const char *domain, const char *key, const char *value, size_t padlen,
    bool end);

/* Send len bytes, waiting at most ms for the socket to take them.  The
 * bytes sent (fewer when the server stops reading or closes). */
size_t h2raw_send(struct h2raw *c, const void *buf, size_t len, int ms);

/* The next frame within ms: 1, 0 on timeout, -1 when the server closed
 * the connection.  A SETTINGS frame from the server is acknowledged and
 * still returned; header blocks are decoded into f->headers. */
int h2raw_read(struct h2raw *c, struct h2raw_frame *f, int ms);

/* The value of header name in f->headers, copied to out; false if absent. */
bool h2raw_header(const struct h2raw_frame *f, const char *name, char *out,
    size_t outlen);

#endif
