#!/usr/bin/env bash
# Finds or starts a NATS server with JetStream for the NATS tests and prints
# its URL (NATS_URL) on stdout; what it did goes to stderr. Idempotent.
#
#   1. NATS_URL, if set (used as it is);
#   2. a server answering on 127.0.0.1:4222 (it must have JetStream on);
#   3. as root, Debian's nats-server (installed if missing; 2.9 has
#      JetStream), started detached on loopback without systemd, with -js and
#      its store in /tmp/millrace-nats; then waits until it serves.
# Not root and nothing answering: says so and exits 1. The tests that kill
# the server mid-drain start private servers of their own from the same
# binary.
set -euo pipefail
say() { echo "nats-up: $*" >&2; }
port=4222
url="nats://127.0.0.1:$port"
dir=/tmp/millrace-nats
answers() { (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; }

if [ -n "${NATS_URL:-}" ]; then
	say "using NATS_URL"
	echo "$NATS_URL"
	exit 0
fi
if answers; then
	say "using NATS at 127.0.0.1:$port"
	echo "$url"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	say "no NATS answers at 127.0.0.1:$port and I am not root to install one; set NATS_URL"
	exit 1
fi
if ! command -v nats-server >/dev/null 2>&1; then
	say "installing Debian's nats-server"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >&2
fi
mkdir -p "$dir"
say "starting nats-server -js on 127.0.0.1:$port (store and log in $dir)"
# Detached: setsid and nohup, so it outlives this script and make.
setsid nohup nats-server -a 127.0.0.1 -p "$port" -js -sd "$dir/store" \
	-l "$dir/nats.log" -P "$dir/nats.pid" </dev/null >/dev/null 2>&1 &
for _ in $(seq 60); do
	if answers; then
		say "up"
		echo "$url"
		exit 0
	fi
	sleep 0.5
done
say "nats-server did not answer within 30 s; see $dir/nats.log"
exit 1
