#!/usr/bin/env bash
# stats_cost.sh - what one call of lua/stats.lua costs Redis, on a stat key
# at its largest and on a small one, measured with redis-benchmark (one
# client, so each figure is the script's own time plus one round trip).
#
# Starts its own redis-server on a free loopback port (stopped by PID when
# the script exits).  The large key: window 1 min, resolution 3 s
# (21 live sub-windows), each sub-window a copy of one that holds 100,000
# lognormal values (median 20, sigma 1): about 340 fields each, every
# sub-window full.  Three calls are timed:
#   record + read  what POST /record sends (record 1, p50 p90 p99)
#   record only    record 2 (the bulk mode of bench/stats_memory.sh)
#   small key      record + read on a key with one value a sub-window
#
# Environment: REDIS_SERVER, REDIS_CLI, REDIS_BENCHMARK (default: PATH).
set -euo pipefail

cd "$(dirname "$0")/.."
server=${REDIS_SERVER:-redis-server}
cli=${REDIS_CLI:-redis-cli}
rbench=${REDIS_BENCHMARK:-redis-benchmark}

. "$(dirname "$0")/redis.sh"
sha=$("$cli" -p "$port" SCRIPT LOAD "$(awk 1 lua/stats.lua)")
key='c:stat:lat:{api}'

python3 - "$sha" "$key" >"$tmp/load.resp" <<'PY'
import math, random, sys
sha, key = sys.argv[1], sys.argv[2]
rng = random.Random(1)
for _ in range(100000):
    v = '%.17g' % math.exp(math.log(20) + rng.gauss(0, 1))
    args = ['EVALSHA', sha, '1', key, '60000', '3000', '0.01', '2', v]
    sys.stdout.write('*%d\r\n' % len(args) + ''.join(
        '$%d\r\n%s\r\n' % (len(a), a) for a in args))
PY
"$cli" -p "$port" --pipe <"$tmp/load.resp" >/dev/null
src=$("$cli" -p "$port" --scan --pattern "$key:*" | head -1)
s=${src##*:}
for i in $(seq 1 20); do
	"$cli" -p "$port" COPY "$src" "$key:$((s - i))" >/dev/null
	"$cli" -p "$port" COPY "$src" "$key:$((s + i))" >/dev/null
done
echo "large key: 21 live sub-windows of $("$cli" -p "$port" HLEN "$src") fields"

run() {
	local what=$1 n=$2
	shift 2
	"$rbench" -p "$port" -n "$n" -c 1 -q "$@" | tr '\r' '\n' |
		grep 'requests per second' | sed "s/.*: /$what: /"
}
run "record + read, large key" 2000 EVALSHA "$sha" 1 "$key" 60000 3000 \
	0.01 1 42 0.5 0.9 0.99
run "record only, large key" 20000 EVALSHA "$sha" 1 "$key" 60000 3000 \
	0.01 2 42
run "record + read, small key" 20000 EVALSHA "$sha" 1 'c:stat:lat:{small}' \
	60000 3000 0.01 1 42 0.5 0.9 0.99
