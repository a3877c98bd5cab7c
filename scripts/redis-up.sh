#!/usr/bin/env bash
# Finds or starts a Redis for the Redis Streams tests and prints its URL
# (REDIS_URL) on stdout; what it did goes to stderr. Idempotent.
#
#   1. REDIS_URL, if set (used as it is);
#   2. a Redis answering on 127.0.0.1:6379;
#   3. as root, Debian's redis-server (installed if missing), started
#      detached on loopback without systemd, with the append-only file
#      fsynced on every write (appendfsync always: a write Redis has
#      acknowledged survives a crash) in /tmp/millrace-redis; then waits
#      until it answers PING.
# Not root and nothing answering: says so and exits 1. The tests that kill
# Redis mid-drain start private servers of their own from the same binary.
set -euo pipefail
say() { echo "redis-up: $*" >&2; }
port=6379
url="redis://127.0.0.1:$port/0"
dir=/tmp/millrace-redis
answers() { (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; }
pong() { [ "$(redis-cli -h 127.0.0.1 -p $port ping 2>/dev/null)" = PONG ]; }

if [ -n "${REDIS_URL:-}" ]; then
	say "using REDIS_URL"
	echo "$REDIS_URL"
	exit 0
fi
if answers; then
	say "using Redis at 127.0.0.1:$port"
	echo "$url"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	say "no Redis answers at 127.0.0.1:$port and I am not root to install one; set REDIS_URL"
	exit 1
fi
if ! command -v redis-server >/dev/null 2>&1; then
	say "installing Debian's redis-server"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
fi
mkdir -p "$dir"
say "starting redis-server on 127.0.0.1:$port (data and log in $dir)"
redis-server --bind 127.0.0.1 --port "$port" --daemonize yes --dir "$dir" \
	--logfile "$dir/redis.log" --pidfile "$dir/redis.pid" \
	--save '' --appendonly yes --appendfsync always >&2
for _ in $(seq 60); do
	if pong; then
		say "up"
		echo "$url"
		exit 0
	fi
	sleep 0.5
done
say "redis-server did not answer within 30 s; see $dir/redis.log"
exit 1
