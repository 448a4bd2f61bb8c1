#!/usr/bin/env bash
# check_dashboard.sh - the Grafana dashboard and the Prometheus alert rules
# against a real Prometheus: promtool checks the rules, then a Prometheus
# (started here on a free loopback port, stopped by PID) scrapes a daemon
# under some load every second, loads the rules, and every panel query of
# deploy/grafana/ratelimitd.json and every alert expression must evaluate
# without error, and every panel query must return data, so no panel names
# a metric that does not exist.
#
# Environment: RATELIMITD_BIN (the built daemon, absolute path) and
# RATELIMITD_SRCDIR (the repository root), as `make integration` sets them.
set -euo pipefail

: "${RATELIMITD_BIN:?set RATELIMITD_BIN to the built daemon}"
: "${RATELIMITD_SRCDIR:?set RATELIMITD_SRCDIR to the repository root}"
src=$RATELIMITD_SRCDIR
dash=$src/deploy/grafana/ratelimitd.json
rules=$src/deploy/prometheus/ratelimitd-alerts.yaml
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rl-dashboard-XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$1"; [ -z "${2:-}" ] ||
  printf '%s\n' "$2" | sed 's/^/     /'; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_http() {
  local _
  for _ in $(seq 100); do
    curl -sf -o /dev/null "$1" && return 0
    sleep 0.1
  done
  return 1
}

if out=$(promtool check rules "$rules" 2>&1); then
  ok "promtool check rules $(basename "$rules")"
else
  fail "promtool check rules $(basename "$rules")" "$out"
fi

# The daemon, with rules that allow and deny.
dport=$(free_port)
gport=$(free_port)
cat > "$tmp/rl.yaml" <<YAML
listen: "127.0.0.1:$dport"
grpc_listen: "127.0.0.1:$gport"
backend: memory
shutdown_timeout: 1s
rules:
  - name: per-user
    key: "\${user}"
    limit: 5
    window: 60s
  - name: global
    limit: 100000
    window: 1s
    algorithm: token_bucket
YAML
"$RATELIMITD_BIN" -c "$tmp/rl.yaml" 2>"$tmp/rl.log" &
pids+=($!)
wait_http "http://127.0.0.1:$dport/healthz" || { cat "$tmp/rl.log"; exit 1; }

# Some load: allowed and denied decisions, a reload; and gRPC calls
# (ShouldRateLimit of one descriptor {user: g}, framed by hand).
python3 - "$tmp/rls.bin" <<'PY'
import sys
def ld(field, b):
    return bytes([field << 3 | 2, len(b)]) + b
req = ld(1, b"edge") + ld(2, ld(1, ld(1, b"user") + ld(2, b"g")))
open(sys.argv[1], "wb").write(b"\0" + len(req).to_bytes(4, "big") + req)
PY
load() {
  local i
  for i in $(seq 400); do
    curl -s -o /dev/null -X POST -d "{\"user\":\"u$((i % 20))\"}" \
      "http://127.0.0.1:$dport/acquire" || true
    [ $((i % 40)) -ne 0 ] || nghttp -H 'content-type: application/grpc' \
      -d "$tmp/rls.bin" \
      "http://127.0.0.1:$gport/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
      >/dev/null 2>&1 || true
  done
}
load &
pids+=($!)
kill -HUP "${pids[0]}"

pport=$(free_port)
cat > "$tmp/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$rules"]
scrape_configs:
  - job_name: ratelimitd
    static_configs: [{targets: ["127.0.0.1:$dport"]}]
YAML
prometheus --config.file="$tmp/prometheus.yml" \
  --storage.tsdb.path="$tmp/data" --web.listen-address="127.0.0.1:$pport" \
  >"$tmp/prometheus.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$pport/-/ready" || { tail "$tmp/prometheus.log"; exit 1; }
# Enough scrapes for rate() over them: 8 at 1 s.
sleep 9

query() {
  curl -s --get "http://127.0.0.1:$pport/api/v1/query" \
    --data-urlencode "query=$1"
}

# Every panel query: success and at least one series.
while IFS=$'\t' read -r title expr; do
  res=$(query "$expr")
  n=$(printf '%s' "$res" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(len(r["data"]["result"]) if r.get("status")=="success" else -1)')
  if [ "$n" -gt 0 ]; then
    ok "panel \"$title\": $n series"
  else
    fail "panel \"$title\": no data" "$expr
$res"
  fi
done < <(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["panels"]:
    for t in p.get("targets", []):
        print(p["title"] + "\t" + t["expr"])
' "$dash")

# Every alert expression evaluates; the rules loaded and are healthy.
while IFS= read -r expr; do
  res=$(query "$expr")
  if printf '%s' "$res" | grep -q '"status":"success"'; then
    ok "alert expression evaluates: ${expr:0:60}"
  else
    fail "alert expression: $expr" "$res"
  fi
done < <(python3 -c '
import sys, re
text = open(sys.argv[1]).read()
import yaml
for g in yaml.safe_load(text)["groups"]:
    for r in g["rules"]:
        print(" ".join(r["expr"].split()))
' "$rules")
health=$(curl -s "http://127.0.0.1:$pport/api/v1/rules" | python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["groups"]
rules = [x for g in r for x in g["rules"]]
print(len(rules), sum(1 for x in rules if x.get("health") == "ok"))')
if [ "$health" = "5 5" ]; then
  ok "Prometheus loaded the 5 alert rules, all healthy"
else
  fail "alert rules in Prometheus: loaded/healthy $health"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
