#!/usr/bin/python3
"""h2_dribble.py - a gRPC client that never finishes its request: HTTP/2
by hand (preface, SETTINGS, one HEADERS frame without END_STREAM, then
silence), to see what the server does with it.  Prints one line of JSON:
when (ms after the HEADERS) the server reset the stream, and when it
closed the connection (null: not within the wait).

  h2_dribble.py PORT WAIT_SECONDS
"""
import json
import socket
import struct
import sys
import time


def frame(ftype, flags, stream, payload):
    return (struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) +
            struct.pack(">I", stream) + payload)


def literal(name, value):
    # HPACK: literal header field without indexing, new name, no Huffman
    # (names and values here are under 127 bytes).
    n, v = name.encode(), value.encode()
    return bytes([0x00, len(n)]) + n + bytes([len(v)]) + v


def main():
    port, wait = int(sys.argv[1]), float(sys.argv[2])
    s = socket.create_connection(("127.0.0.1", port))
    block = b"".join(literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"),
        (":path", "/envoy.service.ratelimit.v3.RateLimitService/"
                  "ShouldRateLimit"),
        (":authority", "x"), ("content-type", "application/grpc"),
        ("te", "trailers")))
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") +
              frame(1, 0x4, 1, block))        # HEADERS, END_HEADERS only
    t0 = time.monotonic()
    out = {"rst_after_ms": None, "closed_after_ms": None}
    buf = b""
    s.settimeout(0.2)
    while time.monotonic() - t0 < wait:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        now = int((time.monotonic() - t0) * 1000)
        if not data:
            out["closed_after_ms"] = now
            break
        buf += data
        while len(buf) >= 9:
            n = struct.unpack(">I", b"\0" + buf[:3])[0]
            if len(buf) < 9 + n:
                break
            ftype, flags = buf[3], buf[4]
            stream = struct.unpack(">I", buf[5:9])[0] & 0x7fffffff
            if ftype == 4 and not flags & 1:       # SETTINGS: ack it
                s.sendall(frame(4, 1, 0, b""))
            if ftype == 3 and stream == 1 and out["rst_after_ms"] is None:
                out["rst_after_ms"] = now
            buf = buf[9 + n:]
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
