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
#   repeat  Redis alone, (a), (e), nginx, (b) and (d) again, REPEAT
#           rounds (4) of REPEAT_DURATION seconds (5): the spread of
#           their ratios.
# Like with like: the daemon runs `threads` event loops and nginx as many
# worker processes (RL_THREADS, default the cores the load generator
# leaves: the core count less THREADS, at least 1; on 2 cores, one each);
# every wrk run uses the same CONNECTIONS keep-alive connections and
# THREADS threads.  Why not the core count: with wrk on one of two cores,
# two server threads share one core with each other and with wrk, and
# the scheduler's time slices, not the server, make the tail (seen: p99
# 4.1 ms for the hot denied key with two loops, 0.8-1.0 ms with one; RL_THREADS=2
# shows it).  The ratios are against the reference
# of the table in issue order: (a), (g), (g3) against redis; (b), (d)
# against nginx; (c), (e), (f), (a-tls) against (a).  Then the RSS of the daemon
# holding 1,000 idle keep-alive connections.
#
# CPU: "CPU of the server" is the user+system seconds the server of the
# run used over its duration; "machine busy" is the share of all cores'
# time the machine was not idle during the run (/proc/stat: 200 % on two
# cores is every core busy all along).  The columns "µs/req" are each process's
# CPU time over the run divided by the requests answered: the daemon (the
# three summed in (g3)), redis-server, nginx (its own run; the workers
# summed) and the load generator (wrk; redis-benchmark for redis, h2load
# for (f)).  A process a run does not use shows "-".  The shares are of the
# run's time: DURATION, or for redis, which sends a number of requests,
# the time it took.  After the table, how long Redis (and in (a) the
# daemon) waited for a core, runnable but not running, from the kernel's
# run-queue time per thread: a server that waits there while the others
# run is why a chain of processes on few cores does less than its CPU
# figures add up to.
#
# Prints a Markdown table and writes it to bench/results/speed-DATE.md.
# Measures, never asserts.
#
# Environment: DURATION (s, default 10), CONNECTIONS (50), THREADS (wrk's
# threads, 1: one core left to the server, as the reference runs were made),
# RL_THREADS (the daemon's threads and nginx's workers; nproc - THREADS),
# RATELIMITD (default build/ratelimitd), REDIS_SERVER, NGINX, WRK,
# REDIS_BENCHMARK, H2LOAD, REPEAT and REPEAT_DURATION (see repeat above);
# ONLY="a a-tls" runs only the runs named (redis,
# nginx, a .. g, g3, a-tls, rss, repeat) and writes no results file.
set -euo pipefail

cd "$(dirname "$0")/.."
dur=${DURATION:-10}
conns=${CONNECTIONS:-50}
wthreads=${THREADS:-1}
sthreads=${RL_THREADS:-$(($(nproc) - wthreads))}
[ "$sthreads" -ge 1 ] || sthreads=1
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

# CPU seconds (user + system) the processes named used so far, summed.
cpu_s() {
  local p
  for p in "$@"; do cat "/proc/$p/stat"; done 2>/dev/null |
    awk -v hz="$(getconf CLK_TCK)" '{ s += $14 + $15 }
      END { printf "%.3f", s / hz }'
}

# Run a load generator ("$@"): its output in $tmp/load-NAME.out, where
# NAME is $load_name (default "load"), and its CPU seconds (user + system,
# from the subshell's `times`) in $tmp/load-NAME.cpu.
load() {
  local f=$tmp/load-${load_name:-load}
  (
    "$@" >"$f.out" 2>&1 || true
    times >"$f.times"
  )
  awk 'NR == 2 { for (i = 1; i <= 2; i++) { sub(/s$/, "", $i);
      split($i, t, "m"); s += t[1] * 60 + t[2] } printf "%.3f\n", s }' \
    "$f.times" >"$f.cpu"
}

# Seconds every core spent not idle so far (/proc/stat's first line: all
# but idle and iowait).
busy_s() {
  awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" {
      printf "%.3f", ($2 + $3 + $4 + $7 + $8 + $9) / hz; exit }' /proc/stat
}

# Seconds the threads of the processes named spent runnable but waiting
# for a core so far (the second field of /proc/PID/task/*/schedstat),
# summed.
runq_s() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/schedstat; done 2>/dev/null |
    awk '{ s += $2 } END { printf "%.3f", s / 1e9 }'
}

# The share of the run a process waited for a core: $1 to $2 seconds.
waited() {
  awk -v a="$1" -v b="$2" -v d="${elapsed:-$dur}" \
    'BEGIN { printf "%.0f%%", 100 * (b - a) / d }'
}

# Microseconds of CPU per request: $1 CPU seconds over $2 requests.
per() {
  awk -v c="$1" -v n="${2:-0}" \
    'BEGIN { if (n > 0) printf "%.1f", 1e6 * c / n; else print "-" }'
}

# Record run NAME's CPU figures: the servers' CPU seconds went from $2 to
# $3 (shown as a share of the run and, in column $col, per request),
# Redis's from $4 to $5, the load generator's were $6, for $7 requests.
account() {
  local name=$1 n=${7:-0}
  cpu[$name]=$(awk -v a="$2" -v b="$3" -v d="${elapsed:-$dur}" \
    'BEGIN { printf "%.0f%%", 100 * (b - a) / d }')
  us_d[$name]=- us_n[$name]=-
  if [ "$col" = nginx ]; then
    us_n[$name]=$(per "$(awk -v a="$2" -v b="$3" 'BEGIN { print b - a }')" "$n")
  elif [ "$col" = daemon ]; then
    us_d[$name]=$(per "$(awk -v a="$2" -v b="$3" 'BEGIN { print b - a }')" "$n")
  fi
  us_r[$name]=$(per "$(awk -v a="$4" -v b="$5" 'BEGIN { print b - a }')" "$n")
  us_w[$name]=$(per "$6" "$n")
}

# "prepare 12 µs, queue 300 µs, ...": the mean of each phase of
# ratelimitd_request_phase_seconds on the daemon at port $1, so far.
phases() {
  curl -s "http://127.0.0.1:$1/metrics" | awk '
    /^ratelimitd_request_phase_seconds_sum/ {
      split($1, a, "\""); sum[a[2]] = $2 }
    /^ratelimitd_request_phase_seconds_count/ {
      split($1, a, "\""); cnt[a[2]] = $2 }
    END {
      n = split("prepare queue store resume", names, " ")
      for (i = 1; i <= n; i++) {
        p = names[i]
        mean = cnt[p] > 0 ? 1e6 * sum[p] / cnt[p] : 0
        printf "%s%s %.0f µs", (i > 1 ? ", " : ""), p, mean
      }
    }'
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
worker_processes $sthreads;
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
for _ in $(seq 100); do
  [ "$(pgrep -P "$npid" | wc -l)" -ge "$sthreads" ] && break
  sleep 0.05
done
nworkers=$(pgrep -P "$npid" | tr '\n' ' ')

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
threads: $sthreads
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
  io.write(string.format("RESULT %.0f %.2f %.2f %d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    summary.requests))
end
EOF
cat "$tmp/report.lua" >> "$tmp/post.lua"
cat "$tmp/report.lua" >> "$tmp/auth.lua"

declare -A rate p50 p99 cpu busy us_d us_r us_n us_w phases wait_d wait_r
# run NAME PORT SCRIPT [KIND KEYS]: wrk against PORT; the servers measured
# are the pids in $srv, shown in column $col (daemon or nginx).
run() {
  local name=$1 port=$2 script=$3 c0 c1 r0 r1 q0 q1 w0 w1 b0 n
  export BENCH_KIND=${4:-one} BENCH_KEYS=${5:-10000}
  b0=$(busy_s)
  c0=$(cpu_s $srv)
  r0=$(cpu_s "$rpid")
  q0=$(runq_s $srv)
  w0=$(runq_s "$rpid")
  load "$wrk" -t"$wthreads" -c"$conns" -d"${dur}s" --latency -s "$script" \
    "http://127.0.0.1:$port"
  c1=$(cpu_s $srv)
  r1=$(cpu_s "$rpid")
  q1=$(runq_s $srv)
  w1=$(runq_s "$rpid")
  busy[$name]=$(waited "$b0" "$(busy_s)")
  wait_d[$name]=$(waited "$q0" "$q1")
  wait_r[$name]=$(waited "$w0" "$w1")
  read -r _ rate[$name] p50[$name] p99[$name] n \
    <<<"$(grep '^RESULT' "$tmp/load-load.out")" || true
  account "$name" "$c0" "$c1" "$r0" "$r1" "$(cat "$tmp/load-load.cpu")" "$n"
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
# redis_alone NAME: that script through redis-benchmark, as run NAME.
redis_alone() {
  local name=$1 c0 c1 w0 t0 b0 out
  c0=$(cpu_s "$rpid")
  w0=$(runq_s "$rpid")
  b0=$(busy_s)
  t0=$(date +%s.%N)
  load "$rbench" -p "$rport" -c 50 -n $((dur * 40000)) -r 10000 -q \
    EVALSHA "$sha" 1 "bench:{key:__rand_int__}"
  # It sends a number of requests, not for a time: its shares are of the
  # time it took.
  elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  out=$(tr '\r' '\n' <"$tmp/load-load.out" |
    grep -E 'requests per second' | tail -1)
  c1=$(cpu_s "$rpid")
  wait_r[$name]=$(waited "$w0" "$(runq_s "$rpid")")
  busy[$name]=$(waited "$b0" "$(busy_s)")
  col=redis account "$name" "$c0" "$c1" "$c0" "$c1" \
    "$(cat "$tmp/load-load.cpu")" $((dur * 40000))
  elapsed=
  rate[$name]=$(echo "$out" | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' |
    cut -d. -f1)
  p50[$name]=$(echo "$out" | sed -n 's/.*p50=\([0-9.]*\) msec.*/\1/p')
  p99[$name]="-"
  redis-cli -p "$rport" FLUSHALL >/dev/null
}
sha=$(redis-cli -p "$rport" SCRIPT LOAD "$sw")
want redis && redis_alone redis

if want nginx; then
  srv=$nworkers col=nginx run nginx "$nport" "$tmp/post.lua"
fi

if want a || want b || want c || want e || want f || want g || want g3 ||
  want rss || want repeat; then
  dport=$(free_port)
  gport=$(free_port)
  start_daemon "$dport" redis "$gport"
  dpid=$started
  wait_port "$dport"
  wait_port "$gport"
  if want a; then
    srv=$dpid col=daemon run a "$dport" "$tmp/post.lua" one 10000
    # Where (a)'s requests spent their time in the daemon: the mean of
    # each phase of ratelimitd_request_phase_seconds (the daemon's first
    # run, so the sums are (a)'s).
    phases[a]=$(phases "$dport")
  fi
  want b && srv=$dpid col=daemon run b "$dport" "$tmp/post.lua" hot 1
  want c && srv=$dpid col=daemon run c "$dport" "$tmp/auth.lua"
  want e && srv=$dpid col=daemon run e "$dport" "$tmp/post.lua" three 10000
  want g && srv=$dpid col=daemon run g "$dport" "$tmp/post.lua" hotpf 1

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
    c0=$(cpu_s "${g3pids[@]}")
    r0=$(cpu_s "$rpid")
    export BENCH_KIND=hotpf BENCH_KEYS=1
    for i in 0 1 2; do
      load_name=g3-$i load "$wrk" -t"$wthreads" -c"$conns" -d"${dur}s" \
        --latency -s "$tmp/post.lua" "http://127.0.0.1:${g3ports[$i]}" &
      g3wrk[$i]=$!
    done
    for i in 0 1 2; do wait "${g3wrk[$i]}" || true; done
    c1=$(cpu_s "${g3pids[@]}")
    r1=$(cpu_s "$rpid")
    rate[g3]=$(cat "$tmp"/load-g3-*.out | awk '/^RESULT/ { s += $2 } END { printf "%.0f", s }')
    read -r _ _ p50[g3] p99[g3] _ <<<"$(grep -h '^RESULT' "$tmp/load-g3-0.out")"
    col=daemon account g3 "$c0" "$c1" "$r0" "$r1" \
      "$(cat "$tmp"/load-g3-*.cpu | awk '{ s += $1 } END { print s }')" \
      "$(cat "$tmp"/load-g3-*.out | awk '/^RESULT/ { s += $5 } END { print s }')"
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
    r0=$(cpu_s "$rpid")
    load "$h2load" -D "$dur" -c "$conns" -m 1 -t "$wthreads" -d "$tmp/rls.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' \
      "http://127.0.0.1:$gport/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    out=$(cat "$tmp/load-load.out")
    c1=$(cpu_s "$dpid")
    r1=$(cpu_s "$rpid")
    rate[f]=$(echo "$out" | sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' |
      cut -d. -f1)
    p50[f]="$(echo "$out" | awk '/^time for request:/ { print $6 }') (mean)"
    p99[f]="-"
    col=daemon account f "$c0" "$c1" "$r0" "$r1" \
      "$(cat "$tmp/load-load.cpu")" \
      "$(echo "$out" | sed -n 's/^requests: .* \([0-9]*\) done.*/\1/p')"
  fi

  # RSS with 1,000 idle keep-alive connections (each has sent one request
  # and read its answer).  VmRSS is read once the client says every answer
  # came (not after a guess of how long that takes), and the client holds
  # the connections open until it has been read.
  if want rss; then
    rss0=$(awk '/VmRSS/ { print $2 }' "/proc/$dpid/status")
    rm -f "$tmp/rss.ready" "$tmp/rss.done"
    python3 - "$dport" "$tmp/rss.ready" "$tmp/rss.done" <<'EOF' &
import os, resource, socket, sys, time
port, ready, done = int(sys.argv[1]), sys.argv[2], sys.argv[3]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft != resource.RLIM_INFINITY and soft < 1100:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1100, hard), hard))
socks = []
for i in range(1000):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    socks.append(s)
ok = 0
for s in socks:
    s.settimeout(10)
    try:
        if s.recv(4096).startswith(b"HTTP/1.1 200"):
            ok += 1
    except OSError:
        pass
with open(ready + ".tmp", "w") as f:
    f.write("%d\n" % ok)
os.rename(ready + ".tmp", ready)
for _ in range(600):
    if os.path.exists(done):
        break
    time.sleep(0.05)
EOF
    hold=$!
    for _ in $(seq 600); do
      [ -e "$tmp/rss.ready" ] && break
      sleep 0.05
    done
    rss_ok=$(cat "$tmp/rss.ready" 2>/dev/null || echo 0)
    rss1=$(awk '/VmRSS/ { print $2 }' "/proc/$dpid/status")
    touch "$tmp/rss.done"
    wait "$hold" 2>/dev/null || true
  fi

  # Redis alone, (a), (e), nginx, (b) and (d) again, REPEAT times
  # (default 4) for REPEAT_DURATION seconds each (5), one after the
  # other: one run's ratio moves with whatever else the machine does
  # meanwhile (seen: nginx alone from 92k to 113k requests/s in runs a
  # minute apart), so the ratios of each round are printed, and their
  # median.  (d)'s daemon is a second one, on the memory store.
  if want repeat; then
    rmport=$(free_port)
    start_daemon "$rmport" memory
    rmpid=$started
    wait_port "$rmport"
    for i in $(seq "${REPEAT:-4}"); do
      dur=${REPEAT_DURATION:-5} redis_alone "redis-$i"
      dur=${REPEAT_DURATION:-5} srv=$dpid col=daemon \
        run "a-$i" "$dport" "$tmp/post.lua" one 10000
      dur=${REPEAT_DURATION:-5} srv=$dpid col=daemon \
        run "e-$i" "$dport" "$tmp/post.lua" three 10000
      dur=${REPEAT_DURATION:-5} srv=$nworkers col=nginx \
        run "nginx-$i" "$nport" "$tmp/post.lua"
      dur=${REPEAT_DURATION:-5} srv=$dpid col=daemon \
        run "b-$i" "$dport" "$tmp/post.lua" hot 1
      dur=${REPEAT_DURATION:-5} srv=$rmpid col=daemon \
        run "d-$i" "$rmport" "$tmp/post.lua" one 10000
    done
    kill "$rmpid"
    wait "$rmpid" 2>/dev/null || true
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
  srv=$spid col=daemon run a-tls "$sport" "$tmp/post.lua" one 10000
  kill "$spid"
  wait "$spid" 2>/dev/null || true
fi

if want d; then
  mport=$(free_port)
  start_daemon "$mport" memory
  mpid=$started
  wait_port "$mport"
  srv=$mpid col=daemon run d "$mport" "$tmp/post.lua" one 10000
  kill "$mpid"
  wait "$mpid" 2>/dev/null || true
fi

# Runs left out by ONLY show "-".
for n in redis nginx a b c d e f g g3 a-tls; do
  for v in rate p50 p99 cpu us_d us_r us_n us_w; do
    declare -n cell=$v
    : "${cell[$n]:=-}"
    unset -n cell
  done
done

ratio() {
  awk -v a="${rate[$1]:-0}" -v b="${rate[$2]:-0}" \
    'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'
}

# The median of ratios such as 0.70x ("-" when there are none).
median() {
  printf '%s\n' "$@" | grep -v '^-$' | tr -d x | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-";
      else if (NR % 2) printf "%.2fx", v[(NR + 1) / 2];
      else printf "%.2fx", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

{
  echo "## make bench: speed, $(date -u +%Y-%m-%d), $(nproc) cores," \
    "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
  echo
  echo "wrk -t$wthreads -c$conns -d${dur}s, keep-alive; redis-benchmark -c 50" \
    "no pipelining; the daemon with threads: $sthreads, nginx with" \
    "worker_processes $sthreads; all processes on one machine.  µs/req:" \
    "a process's CPU time over the run ÷ requests answered (wrk: the" \
    "load generator, redis-benchmark or h2load in their rows)."
  echo
  echo "| run | requests/s | p50 ms | p99 ms | CPU of the server | machine busy | µs/req daemon | Redis | nginx | wrk | reference | ratio |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
  echo "| Redis alone: EVALSHA sliding window | ${rate[redis]} | ${p50[redis]} | ${p99[redis]} | ${cpu[redis]} | ${busy[redis]:--} | ${us_d[redis]} | ${us_r[redis]} | ${us_n[redis]} | ${us_w[redis]} |  |  |"
  echo "| nginx return 200 | ${rate[nginx]} | ${p50[nginx]} | ${p99[nginx]} | ${cpu[nginx]} | ${busy[nginx]:--} | ${us_d[nginx]} | ${us_r[nginx]} | ${us_n[nginx]} | ${us_w[nginx]} |  |  |"
  echo "| (a) /acquire, Redis, 10k keys, allowed | ${rate[a]} | ${p50[a]} | ${p99[a]} | ${cpu[a]} | ${busy[a]:--} | ${us_d[a]} | ${us_r[a]} | ${us_n[a]} | ${us_w[a]} | Redis alone | $(ratio a redis) |"
  echo "| (b) /acquire, Redis, one hot key, denied | ${rate[b]} | ${p50[b]} | ${p99[b]} | ${cpu[b]} | ${busy[b]:--} | ${us_d[b]} | ${us_r[b]} | ${us_n[b]} | ${us_w[b]} | nginx | $(ratio b nginx) |"
  echo "| (c) /auth, Redis, headers | ${rate[c]} | ${p50[c]} | ${p99[c]} | ${cpu[c]} | ${busy[c]:--} | ${us_d[c]} | ${us_r[c]} | ${us_n[c]} | ${us_w[c]} | (a) | $(ratio c a) |"
  echo "| (d) /acquire, memory, 10k keys | ${rate[d]} | ${p50[d]} | ${p99[d]} | ${cpu[d]} | ${busy[d]:--} | ${us_d[d]} | ${us_r[d]} | ${us_n[d]} | ${us_w[d]} | nginx | $(ratio d nginx) |"
  echo "| (e) /acquire, Redis, 3 rules | ${rate[e]} | ${p50[e]} | ${p99[e]} | ${cpu[e]} | ${busy[e]:--} | ${us_d[e]} | ${us_r[e]} | ${us_n[e]} | ${us_w[e]} | (a) | $(ratio e a) |"
  echo "| (f) gRPC ShouldRateLimit, Redis, allowed | ${rate[f]} | ${p50[f]} | ${p99[f]} | ${cpu[f]} | ${busy[f]:--} | ${us_d[f]} | ${us_r[f]} | ${us_n[f]} | ${us_w[f]} | (a) | $(ratio f a) |"
  echo "| (g) /acquire, Redis, one hot key, prefetch, allowed | ${rate[g]} | ${p50[g]} | ${p99[g]} | ${cpu[g]} | ${busy[g]:--} | ${us_d[g]} | ${us_r[g]} | ${us_n[g]} | ${us_w[g]} | Redis alone | $(ratio g redis) |"
  echo "| (g3) the same, three daemons | ${rate[g3]} | ${p50[g3]} | ${p99[g3]} | ${cpu[g3]} | ${busy[g3]:--} | ${us_d[g3]} | ${us_r[g3]} | ${us_n[g3]} | ${us_w[g3]} | Redis alone | $(ratio g3 redis) |"
  echo "| (a-tls) /acquire, Redis over TLS, 10k keys, allowed | ${rate[a-tls]} | ${p50[a-tls]} | ${p99[a-tls]} | ${cpu[a-tls]} | ${busy[a-tls]:--} | ${us_d[a-tls]} | ${us_r[a-tls]} | ${us_n[a-tls]} | ${us_w[a-tls]} | (a) | $(ratio a-tls a) |"
  echo
  if want a; then
    echo "(a) in the daemon, mean per request: ${phases[a]}" \
      "(ratelimitd_request_phase_seconds: prepare = arrival to the" \
      "store call, queue = until it is written to Redis, store = until" \
      "its reply is read and decided, resume = until the loop answers)."
    echo
    echo "Waiting for a core (runnable, not running: the run-queue time" \
      "of /proc/PID/task/*/schedstat over the run): Redis" \
      "${wait_r[redis]:--} of the Redis alone run; in (a), Redis" \
      "${wait_r[a]} and the daemon ${wait_d[a]}; in (e), Redis" \
      "${wait_r[e]:--} and the daemon ${wait_d[e]:--}."
    echo
  fi
  if want repeat; then
    ra= re= rb= rd= rr= rn=
    for i in $(seq "${REPEAT:-4}"); do
      ra="$ra $(ratio "a-$i" "redis-$i")"
      re="$re $(ratio "e-$i" "a-$i")"
      rb="$rb $(ratio "b-$i" "nginx-$i")"
      rd="$rd $(ratio "d-$i" "nginx-$i")"
      rr="$rr${rr:+;} ${rate[redis-$i]}, ${rate[a-$i]}, ${rate[e-$i]}"
      rn="$rn${rn:+;} ${rate[nginx-$i]}, ${rate[b-$i]} (p99"
      rn="$rn ${p99[b-$i]} ms), ${rate[d-$i]} (p99 ${p99[d-$i]} ms;"
      rn="$rn ${us_d[d-$i]} µs/req against nginx's ${us_n[nginx-$i]})"
    done
    echo "Again, ${REPEAT:-4} rounds of ${REPEAT_DURATION:-5} s each" \
      "(Redis alone, (a), (e), nginx, (b), (d)): (a) against Redis" \
      "alone:$ra (median $(median $ra)); (e) against (a):$re (median" \
      "$(median $re)); (b) against nginx:$rb (median $(median $rb));" \
      "(d) against nginx:$rd (median $(median $rd)).  Requests/s of" \
      "each round (Redis alone, (a), (e)):$rr; (nginx, (b), (d)):$rn."
    echo
  fi
  if want rss; then
    echo "RSS of the daemon (Redis): $((rss0 / 1024)) MiB before," \
      "$((rss1 / 1024)) MiB with 1,000 idle keep-alive connections" \
      "($(awk -v a="$rss0" -v b="$rss1" 'BEGIN { printf "%.1f", (b - a) / 1000 }')" \
      "KiB each; $rss_ok of 1,000 answered)."
  fi
} | tee "$tmp/table.md"
if [ -z "${ONLY:-}" ]; then
  mkdir -p bench/results
  cp "$tmp/table.md" "bench/results/speed-$(date -u +%Y%m%d-%H%M%S).md"
fi
