# redis.sh - sourced by the bench scripts that time one Lua script on a
# Redis of their own (script_cost.sh, stats_cost.sh, stats_memory.sh):
# starts redis-server ($server; $cli answers its PING) on a free loopback
# port with no persistence, in a temporary directory $tmp, and stops it
# (by PID) and removes $tmp when the script exits.  Sets port and pid.

tmp=$(mktemp -d)
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
	--dir "$tmp" >"$tmp/redis.log" 2>&1 &
pid=$!
for _ in $(seq 50); do
	"$cli" -p "$port" PING >/dev/null 2>&1 && break
	sleep 0.1
done
