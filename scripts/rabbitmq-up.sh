#!/usr/bin/env bash
# Finds or starts a RabbitMQ for the relay's AMQP test and prints its URL
# (AMQP_URL) on stdout; what it did goes to stderr. Idempotent.
#
#   1. AMQP_URL, if set (used as it is);
#   2. a broker answering on 127.0.0.1:5672 (guest/guest);
#   3. as root, Debian's rabbitmq-server (installed if missing, about 30 s on
#      a first run), started detached without systemd; then waits until it
#      serves AMQP.
# Not root and nothing answering: says so and exits 1.
set -euo pipefail
say() { echo "rabbitmq-up: $*" >&2; }
url="amqp://guest:guest@127.0.0.1:5672/"
answers() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

if [ -n "${AMQP_URL:-}" ]; then
	say "using AMQP_URL"
	echo "$AMQP_URL"
	exit 0
fi
if answers; then
	say "using RabbitMQ at 127.0.0.1:5672"
	echo "$url"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	say "no RabbitMQ answers at 127.0.0.1:5672 and I am not root to install one; set AMQP_URL"
	exit 1
fi
if ! command -v rabbitmq-server >/dev/null 2>&1; then
	say "installing Debian's rabbitmq-server"
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >&2
fi
say "starting rabbitmq-server (log in /var/log/rabbitmq)"
# Loopback only; the node name pins the host so a changed hostname does not
# strand the node's data.
mkdir -p /etc/rabbitmq
[ -f /etc/rabbitmq/rabbitmq-env.conf ] || printf 'NODENAME=rabbit@localhost\nNODE_IP_ADDRESS=127.0.0.1\n' >/etc/rabbitmq/rabbitmq-env.conf
rabbitmq-server -detached >&2
for _ in $(seq 120); do
	if answers && rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; then
		say "up"
		echo "$url"
		exit 0
	fi
	sleep 0.5
done
say "rabbitmq-server did not start within a minute; see /var/log/rabbitmq"
exit 1
