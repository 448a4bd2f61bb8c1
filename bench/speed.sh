#!/usr/bin/env bash
# speed.sh - ratelimitd's throughput and latency beside the ceilings that
# bound it, measured in one run on this machine, with public tools only.
#
# Starts its own redis-server, nginx and ratelimitd on free loopback ports
# (stopped by PID on exit) and runs, each for DURATION seconds:
#   redis   redis-benchmark: EVALSHA of a plain sliding-window script (one
#           ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE on a random key), 50
#           clients, no pipelining: what Redis alone does per second.
#   nginx   wrk against nginx `return 200` to the same POSTs: the ceiling
#           of an HTTP hop on this machine.
#   (a)     POST /acquire, Redis, 10,000 random keys, all allowed.
#   (b)     POST /acquire, Redis, one hot key, nearly all denied.
#   (c)     GET /auth with proxy headers, Redis, 10,000 random keys.
#   (d)     POST /acquire, memory store, 10,000 random keys.
#   (e)     POST /acquire, Redis, three rules per request.
#   (f)     gRPC ShouldRateLimit (h2load, one stream per connection), Redis,
#           one descriptor, all allowed: the Envoy path, against (a).
#   (g)     POST /acquire, Redis, one hot key, all allowed, its rule with
#           prefetch (docs/algorithms.md, "Taking quota in advance"): one
#           daemon, against Redis alone (its EVALSHA ceiling is per key).
#   (g3)    the same key from three daemons at once (one wrk each, the
#           rates summed), against Redis alone.
#   (a-tls) (a) over TLS: the same Redis also on a TLS port (a certificate
#           made here with the openssl command line), rediss:// with
#           ca_file: what TLS costs the decision path, against (a).
# wrk uses CONNECTIONS keep-alive connections and THREADS threads; the
# ratios are against the reference of the table in issue order: (a), (e)
# against redis; (b), (d) against nginx; (c), (f), (a-tls) against (a).  Then the RSS of
# the daemon holding 1,000 idle keep-alive connections.  CPU is the
# user+system seconds each process used during its run.
#
# Prints a Markdown table and writes it to bench/results/speed-DATE.md.
# Measures, never asserts.
#
# Environment: DURATION (s, default 10), CONNECTIONS (50), THREADS (2),
# RATELIMITD (default build/ratelimitd), REDIS_SERVER, NGINX, WRK,
# REDIS_BENCHMARK, H2LOAD; ONLY="a a-tls" runs only the runs named (redis,
# nginx, a .. g, g3, a-tls, rss) and writes no results file.
set -euo pipefail

cd "$(dirname "$0")/.."
dur=${DURATION:-10}
conns=${CONNECTIONS:-50}
wthreads=${THREADS:-2}
daemon=${RATELIMITD:-build/ratelimitd}
rserver=${REDIS_SERVER:-redis-server}
nginx=${NGINX:-nginx}
wrk=${WRK:-wrk}
rbench=${REDIS_BENCHMARK:-redis-benchmark}
h2load=${H2LOAD:-h2load}

for t in "$rserver" "$nginx" "$wrk" "$rbench" "$h2load" "$daemon"; do
  command -v "$t" >/dev/null 2>&1 || [ -x "$t" ] || {
    echo "speed.sh: $t not found (make deps installs wrk, nginx, redis)" >&2
    exit 1
  }
done

# Is run $1 wanted (ONLY unset, or names it)?
want() {
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rl-speed-XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# A port the kernel just gave out (bind to 0): free, not just unanswered.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_port() {
  local _
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "speed.sh: nothing listens on port $1" >&2
  cat "$tmp"/*.log >&2 2>/dev/null || true
  return 1
}

# CPU seconds (user + system) a process used so far.
cpu_s() {
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' \
    "/proc/$1/stat"
}

# A CA and a certificate for 127.0.0.1, for the same Redis on a TLS port.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$tmp/ca.key" -out "$tmp/ca.pem" -days 2 -subj /CN=bench-ca \
  2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$tmp/redis.key" -out "$tmp/redis.csr" -subj /CN=localhost \
  2>/dev/null
echo "subjectAltName=DNS:localhost,IP:127.0.0.1" > "$tmp/ext.cnf"
openssl x509 -req -in "$tmp/redis.csr" -CA "$tmp/ca.pem" \
  -CAkey "$tmp/ca.key" -CAcreateserial -days 2 -extfile "$tmp/ext.cnf" \
  -out "$tmp/redis.pem" 2>/dev/null

rport=$(free_port)
tport=$(free_port)
"$rserver" --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
  --tls-port "$tport" --tls-cert-file "$tmp/redis.pem" \
  --tls-key-file "$tmp/redis.key" --tls-ca-cert-file "$tmp/ca.pem" \
  --tls-auth-clients no \
  --dir "$tmp" --logfile "$tmp/redis.log" &
rpid=$!
pids+=("$rpid")
wait_port "$rport"
wait_port "$tport"

nport=$(free_port)
mkdir -p "$tmp/nginx"
cat > "$tmp/nginx.conf" <<EOF
worker_processes 1;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/nginx;
  server {
    listen 127.0.0.1:$nport;
    location / { return 200 '{"allowed":true}'; }
  }
}
EOF
"$nginx" -c "$tmp/nginx.conf" -p "$tmp/nginx" &
npid=$!
pids+=("$npid")
wait_port "$nport"
nworker=$(pgrep -P "$npid" | head -1)

# The daemon on port $1 with backend $2 (redis|memory), and gRPC on port
# $3 if given; with use_tls=1, to Redis's TLS port; sets started.
start_daemon() {
  local port=$1 backend=$2 conf="$tmp/rl-$1.yaml" url tls_lines=""
  url="redis://127.0.0.1:$rport/0"
  if [ "${use_tls:-0}" = 1 ]; then
    url="rediss://127.0.0.1:$tport/0"
    tls_lines="  tls: { ca_file: \"$tmp/ca.pem\" }"
  fi
  cat > "$conf" <<EOF
listen: "127.0.0.1:$port"
${3:+grpc_listen: \"127.0.0.1:$3\"}
backend: $backend
threads: ${RL_THREADS:-2}
log_level: warn
access_log: false
redis:
  url: "$url"
  timeout: 1s
$tls_lines
rules:
  - name: user
    match: { bench: "one" }
    key: "\${user}"
    limit: 1000000000
    window: 60s
  - name: hot
    match: { bench: "hot" }
    key: "\${user}"
    limit: 10
    window: 60s
  - name: hotpf
    match: { bench: "hotpf" }
    key: "global"
    limit: 1000000000
    window: 60s
    prefetch: { max_units: 1000, hold: 100ms }
  - name: r1
    match: { bench: "three" }
    key: "\${user}"
    limit: 1000000000
    window: 60s
  - name: r2
    match: { bench: "three" }
    key: "\${user}"
    limit: 1000000000
    window: 60s
    algorithm: fixed_window
  - name: r3
    match: { bench: "three" }
    limit: 60000000
    window: 60s
    algorithm: token_bucket
  - name: grpc
    match: { domain: "bench" }
    key: "\${user}"
    limit: 1000000000
    window: 60s
  - name: auth
    match: { path: "/api/*" }
    key: "\${ip}"
    limit: 1000000000
    window: 60s
auth:
  client_ip: x-real-ip
EOF
  "$daemon" -c "$conf" 2>"$tmp/rl-$1.log" &
  started=$!
  pids+=("$started")
}

# wrk Lua: POST /acquire {"bench": KIND, "user": random of 10,000}.
cat > "$tmp/post.lua" <<'EOF'
local kind = os.getenv("BENCH_KIND") or "one"
local keys = tonumber(os.getenv("BENCH_KEYS") or "10000")
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local u = math.random(keys)
  return wrk.format(nil, "/acquire",
    nil, '{"bench":"' .. kind .. '","user":"u' .. u .. '"}')
end
EOF
cat > "$tmp/auth.lua" <<'EOF'
request = function()
  local u = math.random(10000)
  return wrk.format("GET", "/auth", {
    ["X-Original-URI"] = "/api/items?id=" .. u,
    ["X-Original-Method"] = "GET",
    ["X-Real-IP"] = "10.0." .. (u % 250) .. "." .. (u % 199),
    ["X-Forwarded-For"] = "10.0." .. (u % 250) .. "." .. (u % 199),
    ["Host"] = "api.example.com",
    ["User-Agent"] = "bench"
  })
end
EOF
cat > "$tmp/report.lua" <<'EOF'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %.0f %.2f %.2f\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
EOF
cat "$tmp/report.lua" >> "$tmp/post.lua"
cat "$tmp/report.lua" >> "$tmp/auth.lua"

declare -A rate p50 p99 cpu
# run NAME PORT PID SCRIPT [KIND KEYS]: wrk against PORT; CPU of PID.
run() {
  local name=$1 port=$2 pid=$3 script=$4 c0 c1 out
  c0=$(cpu_s "$pid")
  out=$(BENCH_KIND=${5:-one} BENCH_KEYS=${6:-10000} "$wrk" -t"$wthreads" \
    -c"$conns" -d"${dur}s" --latency -s "$script" \
    "http://127.0.0.1:$port" 2>&1 | grep '^RESULT') || true
  c1=$(cpu_s "$pid")
  read -r _ rate[$name] p50[$name] p99[$name] <<<"$out"
  cpu[$name]=$(awk -v a="$c0" -v b="$c1" -v d="$dur" \
    'BEGIN { printf "%.0f%%", 100 * (b - a) / d }')
}

echo "speed.sh: ${dur}s per run, wrk -t$wthreads -c$conns" >&2

# Redis alone: the script a limiter needs, through redis-benchmark.
sw='local t = redis.call("TIME")
local now = t[1] * 1000000 + t[2]
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - 60000000)
local n = redis.call("ZCARD", KEYS[1])
if n < 1000000000 then
  redis.call("ZADD", KEYS[1], now, now .. "." .. math.random(1000000))
end
redis.call("PEXPIRE", KEYS[1], 60000)
return n'
if want redis; then
  sha=$(redis-cli -p "$rport" SCRIPT LOAD "$sw")
  c0=$(cpu_s "$rpid")
  out=$("$rbench" -p "$rport" -c 50 -n $((dur * 40000)) -r 10000 -q \
    EVALSHA "$sha" 1 "bench:{key:__rand_int__}" 2>/dev/null | tr '\r' '\n' |
    grep -E 'requests per second' | tail -1)
  c1=$(cpu_s "$rpid")
  rate[redis]=$(echo "$out" | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' |
    cut -d. -f1)
  p50[redis]=$(echo "$out" | sed -n 's/.*p50=\([0-9.]*\) msec.*/\1/p')
  p99[redis]="-"
  cpu[redis]="-"
  redis-cli -p "$rport" FLUSHALL >/dev/null
fi

if want nginx; then
  run nginx "$nport" "${nworker:-$npid}" "$tmp/post.lua"
fi

if want a || want b || want c || want e || want f || want g || want g3 ||
  want rss; then
  dport=$(free_port)
  gport=$(free_port)
  start_daemon "$dport" redis "$gport"
  dpid=$started
  wait_port "$dport"
  wait_port "$gport"
  want a && run a "$dport" "$dpid" "$tmp/post.lua" one 10000
  want b && run b "$dport" "$dpid" "$tmp/post.lua" hot 1
  want c && run c "$dport" "$dpid" "$tmp/auth.lua"
  want e && run e "$dport" "$dpid" "$tmp/post.lua" three 10000
  want g && run g "$dport" "$dpid" "$tmp/post.lua" hotpf 1

  # (g3): three daemons on the hot key, one wrk each at the same time.
  if want g3; then
    g3ports=("$dport")
    g3pids=("$dpid")
    for _ in 1 2; do
      p=$(free_port)
      start_daemon "$p" redis
      wait_port "$p"
      g3ports+=("$p")
      g3pids+=("$started")
    done
    c0=0
    for p in "${g3pids[@]}"; do c0=$(awk -v a="$c0" -v b="$(cpu_s "$p")" 'BEGIN { print a + b }'); done
    for i in 0 1 2; do
      BENCH_KIND=hotpf BENCH_KEYS=1 "$wrk" -t"$wthreads" -c"$conns" \
        -d"${dur}s" --latency -s "$tmp/post.lua" \
        "http://127.0.0.1:${g3ports[$i]}" >"$tmp/g3-$i.out" 2>&1 &
      g3wrk[$i]=$!
    done
    for i in 0 1 2; do wait "${g3wrk[$i]}" || true; done
    c1=0
    for p in "${g3pids[@]}"; do c1=$(awk -v a="$c1" -v b="$(cpu_s "$p")" 'BEGIN { print a + b }'); done
    rate[g3]=$(cat "$tmp"/g3-*.out | awk '/^RESULT/ { s += $2 } END { printf "%.0f", s }')
    read -r _ _ p50[g3] p99[g3] <<<"$(grep -h '^RESULT' "$tmp/g3-0.out")"
    cpu[g3]=$(awk -v a="$c0" -v b="$c1" -v d="$dur" \
      'BEGIN { printf "%.0f%%", 100 * (b - a) / d }')
    for p in "${g3pids[@]:1}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
  fi


  # (f): one framed ShouldRateLimit message {domain: "bench", descriptors:
  # [{user: g}]}, sent by h2load on every stream (h2load has no percentiles:
  # its mean time per request goes in the p50 column, marked).
  if want f; then
    python3 - "$tmp/rls.bin" <<'EOF'
import sys
def ld(field, b):
    return bytes([field << 3 | 2, len(b)]) + b
entry = ld(1, b"user") + ld(2, b"g")
req = ld(1, b"bench") + ld(2, ld(1, entry))
open(sys.argv[1], "wb").write(b"\0" + len(req).to_bytes(4, "big") + req)
EOF
    c0=$(cpu_s "$dpid")
    out=$("$h2load" -D "$dur" -c "$conns" -m 1 -t "$wthreads" -d "$tmp/rls.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' \
      "http://127.0.0.1:$gport/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
      2>&1) || true
    c1=$(cpu_s "$dpid")
    rate[f]=$(echo "$out" | sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' |
      cut -d. -f1)
    p50[f]="$(echo "$out" | awk '/^time for request:/ { print $6 }') (mean)"
    p99[f]="-"
    cpu[f]=$(awk -v a="$c0" -v b="$c1" -v d="$dur" \
      'BEGIN { printf "%.0f%%", 100 * (b - a) / d }')
  fi

  # RSS with 1,000 idle keep-alive connections (each has sent one request).
  if want rss; then
    rss0=$(awk '/VmRSS/ { print $2 }' "/proc/$dpid/status")
    python3 - "$dport" <<'EOF' &
import socket, sys, time
port = int(sys.argv[1])
socks = []
for i in range(1000):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    socks.append(s)
for s in socks:
    s.recv(4096)
time.sleep(3)
EOF
    hold=$!
    sleep 2
    rss1=$(awk '/VmRSS/ { print $2 }' "/proc/$dpid/status")
    wait "$hold" 2>/dev/null || true
  fi
  kill "$dpid"
  wait "$dpid" 2>/dev/null || true
fi

# (a-tls): (a) again, the daemon speaking TLS to the same Redis.
if want a-tls; then
  sport=$(free_port)
  use_tls=1 start_daemon "$sport" redis
  spid=$started
  wait_port "$sport"
  run a-tls "$sport" "$spid" "$tmp/post.lua" one 10000
  kill "$spid"
  wait "$spid" 2>/dev/null || true
fi

if want d; then
  mport=$(free_port)
  start_daemon "$mport" memory
  mpid=$started
  wait_port "$mport"
  run d "$mport" "$mpid" "$tmp/post.lua" one 10000
  kill "$mpid"
  wait "$mpid" 2>/dev/null || true
fi

# Runs left out by ONLY show "-".
for n in redis nginx a b c d e f g g3 a-tls; do
  for v in rate p50 p99 cpu; do
    declare -n cell=$v
    : "${cell[$n]:=-}"
    unset -n cell
  done
done

ratio() {
  awk -v a="${rate[$1]:-0}" -v b="${rate[$2]:-0}" \
    'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'
}

{
  echo "## make bench: speed, $(date -u +%Y-%m-%d), $(nproc) cores," \
    "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
  echo
  echo "wrk -t$wthreads -c$conns -d${dur}s, keep-alive; redis-benchmark -c 50" \
    "no pipelining; all processes on one machine."
  echo
  echo "| run | requests/s | p50 ms | p99 ms | CPU of the server | reference | ratio |"
  echo "|---|---:|---:|---:|---:|---|---:|"
  echo "| Redis alone: EVALSHA sliding window | ${rate[redis]} | ${p50[redis]} | - | - | | |"
  echo "| nginx return 200 | ${rate[nginx]} | ${p50[nginx]} | ${p99[nginx]} | ${cpu[nginx]} | | |"
  echo "| (a) /acquire, Redis, 10k keys, allowed | ${rate[a]} | ${p50[a]} | ${p99[a]} | ${cpu[a]} | Redis alone | $(ratio a redis) |"
  echo "| (b) /acquire, Redis, one hot key, denied | ${rate[b]} | ${p50[b]} | ${p99[b]} | ${cpu[b]} | nginx | $(ratio b nginx) |"
  echo "| (c) /auth, Redis, headers | ${rate[c]} | ${p50[c]} | ${p99[c]} | ${cpu[c]} | (a) | $(ratio c a) |"
  echo "| (d) /acquire, memory, 10k keys | ${rate[d]} | ${p50[d]} | ${p99[d]} | ${cpu[d]} | nginx | $(ratio d nginx) |"
  echo "| (e) /acquire, Redis, 3 rules | ${rate[e]} | ${p50[e]} | ${p99[e]} | ${cpu[e]} | Redis alone | $(ratio e redis) |"
  echo "| (f) gRPC ShouldRateLimit, Redis, allowed | ${rate[f]} | ${p50[f]} | ${p99[f]} | ${cpu[f]} | (a) | $(ratio f a) |"
  echo "| (g) /acquire, Redis, one hot key, prefetch, allowed | ${rate[g]} | ${p50[g]} | ${p99[g]} | ${cpu[g]} | Redis alone | $(ratio g redis) |"
  echo "| (g3) the same, three daemons | ${rate[g3]} | ${p50[g3]} | ${p99[g3]} | ${cpu[g3]} | Redis alone | $(ratio g3 redis) |"
  echo "| (a-tls) /acquire, Redis over TLS, 10k keys, allowed | ${rate[a-tls]} | ${p50[a-tls]} | ${p99[a-tls]} | ${cpu[a-tls]} | (a) | $(ratio a-tls a) |"
  echo
  if want rss; then
    echo "RSS of the daemon (Redis): $((rss0 / 1024)) MiB before," \
      "$((rss1 / 1024)) MiB with 1,000 idle keep-alive connections."
  fi
} | tee "$tmp/table.md"
if [ -z "${ONLY:-}" ]; then
  mkdir -p bench/results
  cp "$tmp/table.md" "bench/results/speed-$(date -u +%Y%m%d-%H%M%S).md"
fi
