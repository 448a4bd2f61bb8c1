#!/usr/bin/env bash
# script_cost.sh - what one decision of lua/ratelimit.lua costs Redis inside
# a batch, read from Redis's own INFO commandstats (usec_per_call), which
# other processes on a busy machine disturb less than a rate does.
#
# Starts its own redis-server on a free loopback port (stopped by PID when
# the script exits) and loads the script as the daemon sends it (the
# Makefile's LUA_STRIP).  Each scenario sends EVALSHA calls of N requests of
# one sliding_log check each (limit 1e9 per 60 s, cost 1, the ARGV layout
# of the script's top comment) back to back through redis-cli --pipe: once
# to fill the keys, then again after CONFIG RESETSTAT, measured.  Printed
# per scenario: µs per EVALSHA, µs per decision, and of that the part spent
# in the Redis commands the script calls (their own commandstats); the rest
# is Lua.
#   random N   N requests on keys drawn from 10,000 (N = 1, 4, 16, 64;
#              the daemon's batches held ~5 under wrk -c50, ~12 since the
#              event loop runs the Redis I/O), five values per check
#   same N     the same requests as the daemon sends a batch of one rule's
#              single checks: the five values once, after 'same' and the
#              count 1 (N = 16, 64)
#   hot 64     64 requests on one key, all allowed
#   three N    N requests of bench/speed.sh's row (e) (N = 4, 16): rules
#              r1 sliding_log and r2 fixed_window on a user drawn from
#              10,000 (both limit 1e9), r3 token_bucket with no key (limit
#              6e7: one key every request shares), all per 60 s and
#              allowed; keys as the daemon renders them (src/core/decide.c:
#              "rl:<rule>:{<key>}", "rl:r3:{}" for r3).  Per decision is
#              then per request of three checks.
#   same3 N    the same requests as the daemon sends them: the three
#              checks' values once, after 'same' (N = 4, 16)
#   denied 64  64 requests on one key at its limit (100), all denied
#   plain      bench/speed.sh's "Redis alone" sliding-window script, one
#              decision per call, 10,000 keys (redis-benchmark, 50 clients)
#
# Environment: REDIS_SERVER, REDIS_CLI, REDIS_BENCHMARK (default: PATH),
# DECISIONS (per scenario, default 32768), SCRIPT (default
# lua/ratelimit.lua: another version to compare, e.g. one from git show).
set -euo pipefail

cd "$(dirname "$0")/.."
server=${REDIS_SERVER:-redis-server}
cli=${REDIS_CLI:-redis-cli}
rbench=${REDIS_BENCHMARK:-redis-benchmark}
decisions=${DECISIONS:-32768}
script=${SCRIPT:-lua/ratelimit.lua}

. "$(dirname "$0")/redis.sh"
# What the daemon sends: the Makefile's LUA_STRIP.
sed -e '/^[[:space:]]*--/d' -e '/^[[:space:]]*$/d' -e 's/^[[:space:]]*//' \
	"$script" | awk 1 >"$tmp/ratelimit.lua"
sha=$("$cli" -p "$port" -x SCRIPT LOAD <"$tmp/ratelimit.lua")
echo "ratelimit.lua as sent: $(wc -c <"$tmp/ratelimit.lua") bytes"

# gen KIND N LIMIT: the calls of one scenario, in RESP.
gen() {
	python3 - "$sha" "$1" "$2" "$3" "$decisions" <<'PY'
import random, sys
sha, kind, n, limit, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    sys.argv[4], int(sys.argv[5])
rng = random.Random(1)
out = []
for _ in range(max(1, total // n)):
    if kind == 'same3':
        keys = []
        for _ in range(n):
            u = 'u%d' % rng.randrange(10000)
            keys += ['rl:r1:{%s}' % u, 'rl:r2:{%s}' % u, 'rl:r3:{}']
        args = ['EVALSHA', sha, str(len(keys))] + keys + ['same', '3'] + \
            ['0', limit, '60000', '1', '0', '2', limit, '60000', '1', '0',
             '3', '60000000', '60000', '1', '0']
        out.append('*%d\r\n' % len(args) + ''.join(
            '$%d\r\n%s\r\n' % (len(a), a) for a in args))
        continue
    if kind == 'three':
        keys = []
        for _ in range(n):
            u = 'u%d' % rng.randrange(10000)
            keys += ['rl:r1:{%s}' % u, 'rl:r2:{%s}' % u, 'rl:r3:{}']
        args = ['EVALSHA', sha, str(len(keys))] + keys + [str(n)] + \
            ['3'] * n + ['0', limit, '60000', '1', '0',
                         '2', limit, '60000', '1', '0',
                         '3', '60000000', '60000', '1', '0'] * n
        out.append('*%d\r\n' % len(args) + ''.join(
            '$%d\r\n%s\r\n' % (len(a), a) for a in args))
        continue
    if kind == 'same':
        keys = ['rl:bench:{k%d}' % rng.randrange(10000) for _ in range(n)]
        args = ['EVALSHA', sha, str(n)] + keys + \
            ['same', '1', '0', limit, '60000', '1', '0']
        out.append('*%d\r\n' % len(args) + ''.join(
            '$%d\r\n%s\r\n' % (len(a), a) for a in args))
        continue
    if kind == 'random':
        keys = ['rl:bench:{k%d}' % rng.randrange(10000) for _ in range(n)]
    else:
        keys = ['rl:%s:{hot}' % kind] * n
    args = ['EVALSHA', sha, str(n)] + keys + [str(n)] + ['1'] * n + \
        ['0', limit, '60000', '1', '0'] * n
    out.append('*%d\r\n' % len(args) + ''.join(
        '$%d\r\n%s\r\n' % (len(a), a) for a in args))
sys.stdout.write(''.join(out))
PY
}

# report WHAT N: µs per call and per decision from INFO commandstats.
report() {
	"$cli" -p "$port" INFO commandstats | tr -d '\r' |
		awk -F'[:,=]' -v what="$1" -v n="$2" '
		/^cmdstat_/ {
			name = substr($1, 9)
			calls[name] = $3; usec[name] = $5
		}
		END {
			ev = "evalsha"
			c = calls[ev]
			inner = 0
			for (k in usec)
				if (k != "evalsha" && k != "config" && k != "info")
					inner += usec[k]
			printf "%-10s N=%-3d %6d calls %9.1f us/call %6.2f us/decision" \
			    " (commands %5.2f, Lua %5.2f)\n", what, n, c,
			    usec[ev] / c, usec[ev] / c / n, inner / c / n,
			    (usec[ev] - inner) / c / n
		}'
}

run() {
	local kind=$1 n=$2 limit=$3
	gen "$kind" "$n" "$limit" >"$tmp/load.resp"
	"$cli" -p "$port" --pipe <"$tmp/load.resp" >/dev/null
	"$cli" -p "$port" CONFIG RESETSTAT >/dev/null
	"$cli" -p "$port" --pipe <"$tmp/load.resp" >/dev/null
	report "$kind" "$n"
}

run random 1 1000000000
run random 4 1000000000
run random 16 1000000000
run random 64 1000000000
run same 16 1000000000
run same 64 1000000000
run hot 64 1000000000
run denied 64 100
run three 4 1000000000
run three 16 1000000000
run same3 4 1000000000
run same3 16 1000000000

# Redis alone, as bench/speed.sh runs it.
plain='local t = redis.call("TIME")
local now = t[1] * 1000000 + t[2]
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now - 60000000)
local n = redis.call("ZCARD", KEYS[1])
if n < 1000000000 then
  redis.call("ZADD", KEYS[1], now, now .. "." .. math.random(1000000))
end
redis.call("PEXPIRE", KEYS[1], 60000)
return n'
psha=$("$cli" -p "$port" SCRIPT LOAD "$plain")
"$cli" -p "$port" CONFIG RESETSTAT >/dev/null
"$rbench" -p "$port" -c 50 -n "$decisions" -r 10000 -q \
	EVALSHA "$psha" 1 "bench:{key:__rand_int__}" >/dev/null 2>&1
report plain 1
