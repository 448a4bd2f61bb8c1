#!/usr/bin/env bash
# stats_memory.sh - what one stat key (docs/stats.md) costs in
# Redis after a million recorded values, against a sorted set holding the
# same events, and how far its quantiles are from the exact ones.
#
# Starts its own redis-server on a free loopback port (stopped by PID when
# the script exits) and pipes, with redis-cli --pipe:
#   - N (default 1,000,000) EVALSHA calls of lua/stats.lua on one stat key
#     (window 1 h, resolution 3 min: 21 sub-windows, so none expires while
#     it loads), in record-only mode (record = 2: the daemon records with
#     1, which also merges and answers; the stored state is the same);
#   - the same N values as ZADD members of one sorted set (member
#     "<seq>", score the value): what a hand-made version keeps.
# The values are a latency-like lognormal (median 20 ms, sigma 1) from a
# seeded generator.  Then it prints MEMORY USAGE (SAMPLES 0, summed over
# the stat key's sub-window hashes) beside the sorted set's, and each
# quantile read back through the script against the exact one.
#
# Environment: N, ACCURACY (default 0.01), REDIS_SERVER, REDIS_CLI.
set -euo pipefail

cd "$(dirname "$0")/.."
server=${REDIS_SERVER:-redis-server}
cli=${REDIS_CLI:-redis-cli}
n=${N:-1000000}
acc=${ACCURACY:-0.01}
script=lua/stats.lua

. "$(dirname "$0")/redis.sh"
sha=$("$cli" -p "$port" SCRIPT LOAD "$(awk 1 "$script")")

python3 - "$n" "$acc" "$sha" "$tmp" <<'PY'
import math, random, sys
n, acc, sha, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
rng = random.Random(20261124)
vals = [math.exp(math.log(20) + rng.gauss(0, 1)) for _ in range(n)]

def resp(*args):
    out = ['*%d\r\n' % len(args)]
    for a in args:
        a = str(a)
        out.append('$%d\r\n%s\r\n' % (len(a.encode()), a))
    return ''.join(out)

with open(tmp + '/stat.resp', 'w') as f:
    for v in vals:
        f.write(resp('EVALSHA', sha, 1, 'b:stat:lat:{api}', 3600000,
                     180000, acc, 2, '%.17g' % v))
with open(tmp + '/zset.resp', 'w') as f:
    for i, v in enumerate(vals):
        f.write(resp('ZADD', 'b:zset:lat:{api}', '%.17g' % v, i))
vals.sort()
with open(tmp + '/sorted', 'w') as f:
    f.write('\n'.join('%.17g' % v for v in vals))
PY

"$cli" -p "$port" --pipe <"$tmp/stat.resp" >"$tmp/pipe1.log"
"$cli" -p "$port" --pipe <"$tmp/zset.resp" >"$tmp/pipe2.log"

stat_bytes=0
subwindows=0
fields=0
for k in $("$cli" -p "$port" --scan --pattern 'b:stat:lat:{api}:*'); do
	b=$("$cli" -p "$port" MEMORY USAGE "$k" SAMPLES 0)
	stat_bytes=$((stat_bytes + b))
	subwindows=$((subwindows + 1))
	fields=$((fields + $("$cli" -p "$port" HLEN "$k")))
done
zset_bytes=$("$cli" -p "$port" MEMORY USAGE 'b:zset:lat:{api}' SAMPLES 0)
zcard=$("$cli" -p "$port" ZCARD 'b:zset:lat:{api}')

echo "values recorded:       $n (lognormal, median 20, sigma 1)"
echo "relative_accuracy:     $acc"
echo "stat key:              $stat_bytes bytes in $subwindows sub-window" \
	"hashes, $fields fields"
echo "sorted set:            $zset_bytes bytes, $zcard members"
echo "ratio:                 $(python3 -c "print('%.0f' % ($zset_bytes / $stat_bytes))")x"

"$cli" -p "$port" EVALSHA "$sha" 1 'b:stat:lat:{api}' 3600000 180000 \
	"$acc" 0 0 0.5 0.9 0.99 0.999 >"$tmp/answer"
python3 - "$tmp" "$acc" <<'PY'
import math, sys
tmp, acc = sys.argv[1], float(sys.argv[2])
vals = [float(x) for x in open(tmp + '/sorted')]
ans = [float(x) for x in open(tmp + '/answer').read().split()]
n = len(vals)
assert int(ans[0]) == n, 'count %s, expected %d' % (ans[0], n)
print('count / sum / min / max: %d / %.6f / %.6f / %.6f (exact sum %.6f)' %
      (ans[0], ans[1], ans[2], ans[3], math.fsum(vals)))
for q, got in zip([0.5, 0.9, 0.99, 0.999], ans[4:]):
    truth = vals[int(math.floor(q * (n - 1)))]
    err = abs(got - truth) / truth
    print('p%-5g %12.6f  exact %12.6f  relative error %.5f%s' %
          (q * 100, got, truth, err, '' if err <= acc * (1 + 1e-9)
           else '  OVER THE BOUND'))
PY
