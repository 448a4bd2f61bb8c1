#!/usr/bin/python3
"""rls_client.py - a real gRPC client (python3-grpcio) for the tests of the
gRPC front end: stubs generated from proto/*.proto at run time with
grpc_tools, one command per run, the outcome printed as one line of JSON.

  rls_client.py TARGET PROTO_DIR call JSON
      JSON: {"domain": "d", "descriptors": [[["key", "value"], ...], ...],
             "hits_addend": N, "descriptor_hits": [null | N, ...],
             "timeout": seconds}
  rls_client.py TARGET PROTO_DIR concurrent N JSON
      N calls at once on one channel (one HTTP/2 connection)
  rls_client.py TARGET PROTO_DIR health [SERVICE]
  rls_client.py TARGET PROTO_DIR method PATH      (an empty message)
  rls_client.py TARGET PROTO_DIR raw HEX           (bytes as the message)
"""
import atexit
import json
import os
import shutil
import sys
import tempfile

import grpc
from grpc_tools import protoc


def stubs(proto_dir):
    out = tempfile.mkdtemp(prefix="rls-stubs-")
    atexit.register(shutil.rmtree, out, True)
    for name in ("rls.proto", "health.proto"):
        rc = protoc.main(["protoc", "-I" + proto_dir, "--python_out=" + out,
                          os.path.join(proto_dir, name)])
        if rc != 0:
            sys.exit("protoc failed on " + name)
    sys.path.insert(0, out)
    import rls_pb2
    import health_pb2
    return rls_pb2, health_pb2


def code_name(enum, value):
    return enum.Name(value)


def request(pb, spec):
    rq = pb.RateLimitRequest(domain=spec.get("domain", ""),
                             hits_addend=spec.get("hits_addend", 0))
    hits = spec.get("descriptor_hits", [])
    for i, entries in enumerate(spec.get("descriptors", [])):
        d = rq.descriptors.add()
        for k, v in entries:
            d.entries.add(key=k, value=v)
        if i < len(hits) and hits[i] is not None:
            d.hits_addend.value = hits[i]
    return rq


def answer(pb, r):
    Code = pb.RateLimitResponse.Code
    Unit = pb.RateLimitResponse.RateLimit.Unit
    out = {"code": "OK", "overall": Code.Name(r.overall_code),
           "statuses": [],
           "headers": {h.key: h.value for h in r.response_headers_to_add}}
    for s in r.statuses:
        st = {"code": Code.Name(s.code)}
        if s.HasField("current_limit"):
            st["limit"] = {"name": s.current_limit.name,
                           "per_unit": s.current_limit.requests_per_unit,
                           "unit": Unit.Name(s.current_limit.unit)}
            st["remaining"] = s.limit_remaining
            st["reset_ms"] = (s.duration_until_reset.seconds * 1000 +
                              s.duration_until_reset.nanos // 1000000)
        out["statuses"].append(st)
    return out


def error(e):
    return {"code": e.code().name, "message": e.details() or ""}


def main():
    target, proto_dir, cmd = sys.argv[1], sys.argv[2], sys.argv[3]
    pb, hpb = stubs(proto_dir)
    ch = grpc.insecure_channel(target)
    path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    call = ch.unary_unary(path,
                          request_serializer=pb.RateLimitRequest.SerializeToString,
                          response_deserializer=pb.RateLimitResponse.FromString)
    if cmd == "call":
        spec = json.loads(sys.argv[4])
        try:
            out = answer(pb, call(request(pb, spec),
                                  timeout=spec.get("timeout", 10)))
        except grpc.RpcError as e:
            out = error(e)
    elif cmd == "concurrent":
        n, spec = int(sys.argv[4]), json.loads(sys.argv[5])
        rq = request(pb, spec)
        futs = [call.future(rq, timeout=30) for _ in range(n)]
        out = {}
        for f in futs:
            try:
                k = pb.RateLimitResponse.Code.Name(f.result().overall_code)
            except grpc.RpcError as e:
                k = e.code().name
            out[k] = out.get(k, 0) + 1
    elif cmd == "health":
        check = ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=hpb.HealthCheckRequest.SerializeToString,
            response_deserializer=hpb.HealthCheckResponse.FromString)
        svc = sys.argv[4] if len(sys.argv) > 4 else ""
        try:
            r = check(hpb.HealthCheckRequest(service=svc), timeout=10)
            out = {"code": "OK", "status":
                   hpb.HealthCheckResponse.ServingStatus.Name(r.status)}
        except grpc.RpcError as e:
            out = error(e)
    elif cmd in ("method", "raw"):
        m = sys.argv[4] if cmd == "method" else path
        body = b"" if cmd == "method" else bytes.fromhex(sys.argv[4])
        raw = ch.unary_unary(m, request_serializer=lambda b: b,
                             response_deserializer=lambda b: b)
        try:
            raw(body, timeout=10)
            out = {"code": "OK"}
        except grpc.RpcError as e:
            out = error(e)
    else:
        sys.exit("unknown command " + cmd)
    ch.close()
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
