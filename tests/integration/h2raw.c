/*
 * h2raw.c - HTTP/2 by hand for the gRPC tests (see h2raw.h): the frame
 * layout of RFC 9113 section 4.1 written out, and the server's header
 * blocks decoded with libnghttp2's HPACK inflater (only that part of the
 * library: the frames are the test's own).
 */
#include "h2raw.h"

#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

static long long
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
h2raw_frame(uint8_t *buf, size_t *len, uint8_t type, uint8_t flags,
    uint32_t stream, const void *payload, size_t plen)
{
	uint8_t *p = buf + *len;

	p[0] = (uint8_t)(plen >> 16);
	p[1] = (uint8_t)(plen >> 8);
	p[2] = (uint8_t)plen;
	p[3] = type;
	p[4] = flags;
	p[5] = (uint8_t)(stream >> 24 & 0x7f);
	p[6] = (uint8_t)(stream >> 16);
	p[7] = (uint8_t)(stream >> 8);
	p[8] = (uint8_t)stream;
	if (plen > 0)
		memcpy(p + 9, payload, plen);
	*len += 9 + plen;
}

void
h2raw_connect(struct h2raw *c, int port, const uint32_t *settings, size_t n)
{
	static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
	struct sockaddr_in a = { .sin_family = AF_INET };
	uint8_t buf[256], set[6 * 8];
	size_t len = 0, i;
	int one = 1;

	ck_assert_uint_le(n, 8);
	memset(c, 0, sizeof(*c));
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0),
	    0);
	ck_assert_msg(connect(c->fd, (struct sockaddr *)&a, sizeof(a)) == 0,
	    "connect to %d: %s", port, strerror(errno));
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	ck_assert_int_eq(
	    nghttp2_hd_inflate_new((nghttp2_hd_inflater **)&c->inflater), 0);
	for (i = 0; i < n; i++) {
		set[i * 6] = (uint8_t)(settings[2 * i] >> 8);
		set[i * 6 + 1] = (uint8_t)settings[2 * i];
		set[i * 6 + 2] = (uint8_t)(settings[2 * i + 1] >> 24);
		set[i * 6 + 3] = (uint8_t)(settings[2 * i + 1] >> 16);
		set[i * 6 + 4] = (uint8_t)(settings[2 * i + 1] >> 8);
		set[i * 6 + 5] = (uint8_t)settings[2 * i + 1];
	}
	memcpy(buf, preface, sizeof(preface) - 1);
	len = sizeof(preface) - 1;
	h2raw_frame(buf, &len, H2_SETTINGS, 0, 0, set, n * 6);
	ck_assert_uint_eq(h2raw_send(c, buf, len, 2000), len);
}

void
h2raw_close(struct h2raw *c)
{
	if (c->fd > 0)
		close(c->fd);
	c->fd = -1;
	nghttp2_hd_inflate_del(c->inflater);
	c->inflater = NULL;
	free(c->in);
	c->in = NULL;
}

static void
literal(uint8_t *p, size_t *len, const char *name, const char *value)
{
	size_t n = strlen(name), v = strlen(value);

	ck_assert(n < 127 && v < 127);
	p[(*len)++] = 0x00; /* without indexing, new name */
	p[(*len)++] = (uint8_t)n;
	memcpy(p + *len, name, n);
	*len += n;
	p[(*len)++] = (uint8_t)v;
	memcpy(p + *len, value, v);
	*len += v;
}

void
h2raw_call_headers(uint8_t *buf, size_t *len, uint32_t stream, const char *path,
    bool end)
{
	h2raw_call_headers_timeout(buf, len, stream, path, NULL, end);
}

void
h2raw_call_headers_timeout(uint8_t *buf, size_t *len, uint32_t stream,
    const char *path, const char *timeout, bool end)
{
	uint8_t block[512];
	size_t n = 0;

	literal(block, &n, ":method", "POST");
	literal(block, &n, ":scheme", "http");
	literal(block, &n, ":path", path);
	literal(block, &n, ":authority", "x");
	literal(block, &n, "content-type", "application/grpc");
	literal(block, &n, "te", "trailers");
	if (timeout != NULL)
		literal(block, &n, "grpc-timeout", timeout);
	h2raw_frame(buf, len, H2_HEADERS,
	    H2_END_HEADERS | (end ? H2_END_STREAM : 0), stream, block, n);
}

/* A length-delimited protobuf field (its length a varint). */
static void
field(uint8_t *p, size_t *len, int number, const void *v, size_t vlen)
{
	size_t l = vlen;

	p[(*len)++] = (uint8_t)(number << 3 | 2);
	while (l >= 128) {
		p[(*len)++] = (uint8_t)(l % 128 + 128);
		l /= 128;
	}
	p[(*len)++] = (uint8_t)l;
	memcpy(p + *len, v, vlen);
	*len += vlen;
}

void
h2raw_call_data(uint8_t *buf, size_t *len, uint32_t stream, const char *domain,
    const char *key, const char *value)
{
	h2raw_call_data_pad(buf, len, stream, domain, key, value, 0, true);
}

void
h2raw_call_data_pad(uint8_t *buf, size_t *len, uint32_t stream,
    const char *domain, const char *key, const char *value, size_t padlen,
    bool end)
{
	enum { MAX = 16000 };
	static uint8_t entry[MAX], pad[MAX], desc[MAX], msg[MAX + 5];
	size_t ne = 0, np = 0, nd = 0, nm = 5;

	ck_assert(strlen(domain) < 128 && strlen(key) < 128 &&
	    strlen(value) < 128 && padlen <= 15000);
	/* RateLimitRequest { domain = 1; descriptors = 2 { entries = 1 {
	 * key = 1; value = 2 } } } */
	field(entry, &ne, 1, key, strlen(key));
	field(entry, &ne, 2, value, strlen(value));
	field(desc, &nd, 1, entry, ne);
	if (padlen > 0) {
		memset(entry, 'x', padlen);
		field(pad, &np, 1, "pad", 3);
		field(pad, &np, 2, entry, padlen);
		field(desc, &nd, 1, pad, np);
	}
	field(msg, &nm, 1, domain, strlen(domain));
	field(msg, &nm, 2, desc, nd);
	msg[0] = 0;
	msg[1] = (uint8_t)((nm - 5) >> 24);
	msg[2] = (uint8_t)((nm - 5) >> 16);
	msg[3] = (uint8_t)((nm - 5) >> 8);
	msg[4] = (uint8_t)(nm - 5);
	h2raw_frame(buf, len, H2_DATA, end ? H2_END_STREAM : 0, stream, msg,
	    nm);
}

size_t
h2raw_send(struct h2raw *c, const void *buf, size_t len, int ms)
{
	const uint8_t *p = buf;
	long long end = now_ms() + ms;
	struct pollfd pf = { .fd = c->fd, .events = POLLOUT };
	size_t off = 0;
	ssize_t n;

	while (off < len) {
		n = send(c->fd, p + off, len - off,
		    MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			off += (size_t)n;
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
		    errno != EINTR)
			break;
		if (now_ms() >= end)
			break;
		(void)poll(&pf, 1, (int)(end - now_ms()));
	}
	return off;
}

static void
decode_headers(struct h2raw *c, struct h2raw_frame *f)
{
	const uint8_t *in = f->payload;
	size_t inlen = f->len, o = 0;
	nghttp2_nv nv;
	ssize_t n;
	int flags;

	f->headers[0] = '\0';
	if (f->flags & 0x8) { /* PADDED */
		ck_assert(inlen >= 1u + in[0]);
		inlen -= 1u + in[0];
		in++;
	}
	if (f->flags & 0x20) { /* PRIORITY */
		ck_assert(inlen >= 5);
		in += 5;
		inlen -= 5;
	}
	ck_assert_msg(f->flags & H2_END_HEADERS,
	    "a header block in "
	    "CONTINUATION frames");
	for (;;) {
		flags = 0;
		n = nghttp2_hd_inflate_hd2(c->inflater, &nv, &flags, in, inlen,
		    1);
		ck_assert_msg(n >= 0, "HPACK: %s", nghttp2_strerror((int)n));
		in += n;
		inlen -= (size_t)n;
		if ((flags & NGHTTP2_HD_INFLATE_EMIT) &&
		    o + nv.namelen + nv.valuelen + 4 < sizeof(f->headers))
			o += (size_t)snprintf(f->headers + o,
			    sizeof(f->headers) - o, "%.*s: %.*s\n",
			    (int)nv.namelen, nv.name, (int)nv.valuelen,
			    nv.value);
		if (flags & NGHTTP2_HD_INFLATE_FINAL) {
			nghttp2_hd_inflate_end_headers(c->inflater);
			break;
		}
		if (n == 0 && inlen == 0)
			break;
	}
}

int
h2raw_read(struct h2raw *c, struct h2raw_frame *f, int ms)
{
	long long end = now_ms() + ms;
	struct pollfd pf = { .fd = c->fd, .events = POLLIN };
	uint8_t ack[9];
	size_t need, alen = 0;
	ssize_t n;

	/* Drop the frame returned last time. */
	if (f->payload != NULL) {
		need = 9 + f->len;
		memmove(c->in, c->in + need, c->inlen - need);
		c->inlen -= need;
		f->payload = NULL;
	}
	for (;;) {
		if (c->inlen >= 9) {
			need = 9 +
			    ((size_t)c->in[0] << 16 | (size_t)c->in[1] << 8 |
				c->in[2]);
			if (c->inlen >= need)
				break;
		}
		if (c->incap - c->inlen < 65536) {
			c->incap = c->incap * 2 + 65536;
			ck_assert_ptr_nonnull(c->in = realloc(c->in, c->incap));
		}
		if (now_ms() >= end)
			return 0;
		if (poll(&pf, 1, (int)(end - now_ms())) <= 0)
			continue;
		n = recv(c->fd, c->in + c->inlen, c->incap - c->inlen, 0);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			c->closed_errno = n == 0 ? 0 : errno;
			return -1;
		}
		if (n > 0)
			c->inlen += (size_t)n;
	}
	f->len = need - 9;
	f->type = c->in[3];
	f->flags = c->in[4];
	f->stream = ((uint32_t)c->in[5] << 24 | (uint32_t)c->in[6] << 16 |
			(uint32_t)c->in[7] << 8 | c->in[8]) &
	    0x7fffffff;
	f->payload = c->in + 9;
	f->headers[0] = '\0';
	if (f->type == H2_HEADERS)
		decode_headers(c, f);
	if (f->type == H2_SETTINGS && !(f->flags & H2_ACK)) {
		h2raw_frame(ack, &alen, H2_SETTINGS, H2_ACK, 0, NULL, 0);
		(void)h2raw_send(c, ack, alen, 1000);
	}
	return 1;
}

bool
h2raw_header(const struct h2raw_frame *f, const char *name, char *out,
    size_t outlen)
{
	size_t n = strlen(name);
	const char *p = f->headers, *e;

	while (*p != '\0') {
		e = strchr(p, '\n');
		if (e == NULL)
			break;
		if ((size_t)(e - p) > n + 1 && strncmp(p, name, n) == 0 &&
		    p[n] == ':' && p[n + 1] == ' ') {
			snprintf(out, outlen, "%.*s", (int)(e - p - n - 2),
			    p + n + 2);
			return true;
		}
		p = e + 1;
	}
	return false;
}
