#!/usr/bin/env bash
# memory.sh - what one key of each algorithm costs in Redis at full use.
#
# Starts its own redis-server on a free loopback port (stopped by PID when
# the script exits), loads lua/ratelimit.lua, drives one key per algorithm
# to its limit L = 10, 1,000 and 100,000 through the real script, and
# prints `MEMORY USAGE key SAMPLES 0` (bytes, the key's name and Redis'
# per-key overhead included) per algorithm and limit, with the key's
# encoding and size.  `make bench` runs it; docs/algorithms.md "Measured"
# holds the table.
#
# The calls are the daemon's: EVALSHA of the script with one key and ARGV
# algorithm, limit, window_ms, cost, shadow (backend_redis.c sends the
# same).  sliding_log keeps one sorted-set member per admitted call, so its
# units go in with cost 1, its worst case (one member per unit); the other
# algorithms get cost 1 up to L = 1,000 and chunks of cost 1,000 above.
# sliding_log, fixed_window and token_bucket use a 1 h window, so nothing
# expires while the key fills.  sliding_window keeps at most B + 1 = 21
# bucket fields, which only a spread of requests over a whole window fills,
# so its key gets a 1 s window (G = 50 ms) and one call in each of 21
# consecutive buckets, cost L / 21 (at least 1; some are denied at L = 10),
# refilled if a delayed call left a bucket out.
#
# Environment: REDIS_SERVER, REDIS_CLI (default: from PATH).
set -euo pipefail

cd "$(dirname "$0")/.."
server=${REDIS_SERVER:-redis-server}
cli=${REDIS_CLI:-redis-cli}
script=lua/ratelimit.lua
limits=(10 1000 100000)
algorithms=(sliding_log sliding_window fixed_window token_bucket)
declare -A algnum=([sliding_log]=0 [sliding_window]=1 [fixed_window]=2
  [token_bucket]=3)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rl-memory-XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

port_is_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Sets port and pid.
start_redis() {
  local _
  for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    port_is_free "$port" || continue
    "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
      --daemonize no --dir "$tmp" --logfile "$tmp/redis.log" &
    pid=$!
    for _ in $(seq 50); do
      if "$cli" -p "$port" PING 2>/dev/null | grep -q PONG; then
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
  done
  echo "memory.sh: could not start $server" >&2
  if [ -f "$tmp/redis.log" ]; then cat "$tmp/redis.log" >&2; fi
  return 1
}

port=
start_redis
rcli() { "$cli" -p "$port" "$@"; }
sha=$(rcli SCRIPT LOAD "$(cat "$script")")

# Pipe "EVALSHA ..." lines into redis-cli; fail on any error reply.
run_lines() {
  local out
  out=$(rcli)
  if printf '%s\n' "$out" | grep -qE '^(ERR|NOSCRIPT|WRONGTYPE)'; then
    printf '%s\n' "$out" | grep -E '^(ERR|NOSCRIPT|WRONGTYPE)' >&2
    return 1
  fi
}

# used KEY ALG L W: units in use, from a cost-0 call (L - remaining).
used() {
  local rem
  rem=$(rcli EVALSHA "$sha" 1 "$1" "$2" "$3" "$4" 0 0 | sed -n 3p)
  echo $(($3 - rem))
}

now_us() { echo "${EPOCHREALTIME/./}"; }

# fill_window L KEY: one call 5 ms into each of 21 consecutive 50 ms
# buckets (the host's clock is Redis' TIME).  A call that a loaded machine
# delays into the next bucket leaves a field out; then the key is refilled
# (up to 5 times) until it holds as many fields as it can: 21, or L when
# L < 21 (only L calls of cost 1 fit under the limit).
fill_window() {
  local L=$1 key=$2 g=50000 cost=$(($1 / 21)) want=21 b0 k wait_us _
  [ "$cost" -ge 1 ] || cost=1
  [ "$L" -ge 21 ] || want=$L
  for _ in 1 2 3 4 5; do
    rcli DEL "$key" >/dev/null
    b0=$(( ($(now_us) / g + 1) * g ))
    for k in $(seq 0 20); do
      wait_us=$((b0 + k * g + 5000 - $(now_us)))
      if [ "$wait_us" -gt 0 ]; then
        sleep "$((wait_us / 1000000)).$(printf '%06d' \
          $((wait_us % 1000000)))"
      fi
      rcli EVALSHA "$sha" 1 "$key" "${algnum[sliding_window]}" "$L" 1000 \
        "$cost" 0 >/dev/null
    done
    [ "$(rcli HLEN "$key")" -lt "$want" ] || return 0
  done
  echo "memory.sh: $key: fewer than $want fields after 5 tries" >&2
}

# fill ALG L KEY: drive KEY to full use; prints the window used (ms).
fill() {
  local alg=$1 L=$2 key=$3 n=${algnum[$1]} chunk calls k
  if [ "$alg" = sliding_window ]; then
    fill_window "$L" "$key"
    echo 1000
    return
  fi
  if [ "$L" -le 1000 ] || [ "$alg" = sliding_log ]; then chunk=1
  else chunk=1000; fi
  calls=$((L / chunk))
  for k in $(seq "$calls"); do
    echo "EVALSHA $sha 1 $key $n $L 3600000 $chunk 0"
  done | run_lines
  echo 3600000
}

# size ALG KEY: the key's element count as its type counts it.
size() {
  case $(rcli TYPE "$2") in
    zset) echo "$(rcli ZCARD "$2") members" ;;
    hash) echo "$(rcli HLEN "$2") fields" ;;
    string) echo "$(rcli STRLEN "$2") bytes" ;;
    *) echo "no key" ;;
  esac
}

declare -A mem desc
for alg in "${algorithms[@]}"; do
  for L in "${limits[@]}"; do
    key="rl:bench:{$alg-$L}"
    w=$(fill "$alg" "$L" "$key")
    mem[$alg,$L]=$(rcli MEMORY USAGE "$key" SAMPLES 0)
    desc[$alg,$L]="$(rcli OBJECT ENCODING "$key"), $(size "$alg" "$key"),\
 used $(used "$key" "${algnum[$alg]}" "$L" "$w")"
  done
done

echo "redis-server $("$server" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'),"\
  "MEMORY USAGE <key> SAMPLES 0 in bytes, key names like rl:bench:{alg-L}"
echo
printf '| algorithm | L = 10 | L = 1,000 | L = 100,000 |\n'
printf '|---|---:|---:|---:|\n'
for alg in "${algorithms[@]}"; do
  printf '| %s | %s | %s | %s |\n' "$alg" "${mem[$alg,10]}" \
    "${mem[$alg,1000]}" "${mem[$alg,100000]}"
done
echo
for alg in "${algorithms[@]}"; do
  for L in "${limits[@]}"; do
    printf '%-14s L=%-6s %s\n' "$alg" "$L" "${desc[$alg,$L]}"
  done
done
