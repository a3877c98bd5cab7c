#!/usr/bin/env bash
# Brings up a three-node Apache Kafka cluster on loopback for millrace's
# real-Kafka test tier and bench, and prints KAFKA_BROKERS=host:port,... on
# stdout (what it did goes to stderr). Idempotent: a running cluster is reused.
# scripts/kafka-down.sh stops what this started.
#
# - Apache Kafka (the version pinned in scripts/kafka/pom.xml) is fetched with
#   `mvn dependency:copy-dependencies` into a cache outside the repository
#   ($MILLRACE_KAFKA_CACHE, default ~/.cache/millrace/kafka-VERSION), once.
# - Each node is broker and KRaft controller; the three form the quorum.
#   Topics default to 8 partitions, replication factor 3 and
#   min.insync.replicas=2; unclean leader election is off.
# - Node N listens on 127.0.0.1:$((MILLRACE_KAFKA_PORT + N - 1)) (default
#   19092..19094; controllers on +100: below Linux's ephemeral port range,
#   so no client's outgoing connection can hold one of them). State, logs and each node's start
#   script live in $MILLRACE_KAFKA_DIR (default /tmp/millrace-kafka): nodeN/
#   holds server.properties, start.sh, pid, server.log and the log dirs.
# - Heap per node: $MILLRACE_KAFKA_HEAP (default 768m: the tests create a few
#   thousand partitions in a run).
# - When no node of the cluster is running (a new machine, or after
#   kafka-down.sh or a reboot), or the running cluster does not serve within
#   a minute, its data and logs are wiped and the storage formatted afresh: it is a test cluster, and the topics of earlier runs
#   would only slow the start and fill the heap. A node that is missing
#   while others run (a test killed it) is started again on its data.
#
# internal/kafkacluster (Go) and `go run ./internal/kafkacluster/cmd/kafkactl`
# kill, stop, continue and restart one node by its number and find the leader
# of a partition, for the failover tests.
set -euo pipefail
say() { echo "kafka-up: $*" >&2; }
root=$(cd "$(dirname "$0")/.." && pwd)

version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$root/scripts/kafka/pom.xml")
dir=${MILLRACE_KAFKA_DIR:-/tmp/millrace-kafka}
cache=${MILLRACE_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/millrace/kafka-$version}
base=${MILLRACE_KAFKA_PORT:-19092}
heap=${MILLRACE_KAFKA_HEAP:-768m}
nodes=(1 2 3)

command -v java >/dev/null 2>&1 || { say "java not found: Apache Kafka $version needs Java 17 or newer"; exit 1; }
javaver=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ -n "$javaver" ] && [ "$javaver" -lt 17 ]; then
	say "java $javaver found: Apache Kafka $version needs Java 17 or newer"
	exit 1
fi

port_of() { echo $((base + $1 - 1)); }
cport_of() { echo $((base + 100 + $1 - 1)); }
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
alive() { # node
	local pidf="$dir/node$1/pid"
	[ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null
}
brokers() {
	local out="" n
	for n in "${nodes[@]}"; do out="$out${out:+,}127.0.0.1:$(port_of "$n")"; done
	echo "$out"
}
kafkactl() { (cd "$root" && go run ./internal/kafkacluster/cmd/kafkactl -dir "$dir" "$@"); }

# A cluster this script started and still running: reuse it.
all=1
for n in "${nodes[@]}"; do alive "$n" && answers "$(port_of "$n")" || all=0; done
if [ "$all" = 1 ]; then
	say "reusing the running cluster in $dir"
	if kafkactl wait -timeout 60s >&2; then
		echo "KAFKA_BROKERS=$(brokers)"
		exit 0
	fi
	# Running but not serving (a node wedged, or the heap full of the
	# topics of many earlier runs): it is a test cluster, start afresh.
	say "the running cluster is not healthy: stopping it and starting afresh"
	"$root/scripts/kafka-down.sh" --purge
fi
# Ports taken by something that is not ours: refuse rather than guess.
for n in "${nodes[@]}"; do
	if ! alive "$n" && { answers "$(port_of "$n")" || answers "$(cport_of "$n")"; }; then
		say "port $(port_of "$n") or $(cport_of "$n") is in use by another process; set MILLRACE_KAFKA_PORT to another base"
		exit 1
	fi
done

if [ ! -f "$cache/complete" ]; then
	command -v mvn >/dev/null 2>&1 || { say "mvn not found: it fetches Apache Kafka $version"; exit 1; }
	say "fetching Apache Kafka $version with mvn into $cache (a first fetch takes about a minute)"
	rm -rf "$cache/libs"
	mkdir -p "$cache"
	mvn -q -B -f "$root/scripts/kafka/pom.xml" dependency:copy-dependencies \
		-DoutputDirectory="$cache/libs" -DincludeScope=runtime >&2
	touch "$cache/complete"
fi

any=0
for n in "${nodes[@]}"; do alive "$n" && any=1; done
if [ "$any" = 0 ] && [ -d "$dir" ]; then
	say "no node running: starting afresh (removing $dir's data and logs)"
	rm -rf "$dir"
fi
mkdir -p "$dir"
# A cluster id is 16 random bytes in URL-safe base64. One that begins with
# "-" would read as an option to the storage tool (one in 64 did): drawn again.
[ -f "$dir/cluster-id" ] || python3 -c '
import uuid, base64
while True:
    cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not cid.startswith("-"):
        print(cid)
        break' >"$dir/cluster-id"
cid=$(cat "$dir/cluster-id")
voters=""
for n in "${nodes[@]}"; do voters="$voters${voters:+,}$n@127.0.0.1:$(cport_of "$n")"; done

for n in "${nodes[@]}"; do
	nd="$dir/node$n"
	mkdir -p "$nd/data"
	cat >"$nd/server.properties" <<EOF
# Written by scripts/kafka-up.sh: node $n of a three-node KRaft cluster on loopback.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(port_of "$n"),CONTROLLER://127.0.0.1:$(cport_of "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(port_of "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$nd/data
# The settings millrace's guarantees rest on (README: Against a real Kafka cluster).
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
num.partitions=8
auto.create.topics.enable=true
# Small for two cores: fewer threads and internal partitions, fast rebalances,
# short session timeouts allowed for the tests.
offsets.topic.num.partitions=8
transaction.state.log.num.partitions=4
share.coordinator.state.topic.num.partitions=1
num.network.threads=2
num.io.threads=4
background.threads=2
num.replica.fetchers=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
# A dead node is fenced (its partitions get new leaders) after 6 s, not 9.
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
log.segment.bytes=67108864
log.retention.hours=24
EOF
	cat >"$nd/start.sh" <<EOF
#!/bin/sh
# Written by scripts/kafka-up.sh: starts node $n in the background and records its pid.
cd "$nd" || exit 1
setsid java -Xms$heap -Xmx$heap -XX:+UseG1GC -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1 \\
	-XX:CICompilerCount=2 -Djava.awt.headless=true \\
	-Dlog4j2.configurationFile="$root/scripts/kafka/log4j2.properties" -Dmillrace.kafka.log="$nd/server.log" \\
	-cp "$cache/libs/*" kafka.Kafka "$nd/server.properties" >>"$nd/stdout" 2>&1 </dev/null &
echo \$! >"$nd/pid"
EOF
	chmod +x "$nd/start.sh"
	if [ ! -f "$nd/data/meta.properties" ]; then
		say "formatting node $n's storage (cluster $cid)"
		java -Dlog4j2.configurationFile="$root/scripts/kafka/log4j2.properties" -Dmillrace.kafka.log="$nd/format.log" \
			-cp "$cache/libs/*" kafka.tools.StorageTool format -t "$cid" -c "$nd/server.properties" --ignore-formatted >&2
	fi
done

for n in "${nodes[@]}"; do
	if alive "$n"; then
		say "node $n already running (pid $(cat "$dir/node$n/pid"))"
	else
		say "starting node $n on 127.0.0.1:$(port_of "$n") (heap $heap, log $dir/node$n/server.log)"
		sh "$dir/node$n/start.sh"
	fi
done
brokers >"$dir/brokers"
say "waiting for the cluster to serve metadata (three brokers, a replicated topic accepting acks=all)"
up=0
for try in 1 2 3; do
	if kafkactl wait -timeout 60s >&2; then
		up=1
		break
	fi
	# A node that exited at start (a port briefly taken, say) is started again.
	for n in "${nodes[@]}"; do
		if ! alive "$n"; then
			say "node $n is not running (try $try); its log: $dir/node$n/server.log; starting it again"
			grep -m3 'ERROR' "$dir/node$n/server.log" >&2 || true
			sh "$dir/node$n/start.sh"
		fi
	done
done
if [ "$up" = 0 ]; then
	say "the cluster did not come up; the last lines of each node's log:"
	for n in "${nodes[@]}"; do tail -n 5 "$dir/node$n/server.log" "$dir/node$n/stdout" 1>&2 || true; done
	exit 1
fi
say "up: $(brokers)"
echo "KAFKA_BROKERS=$(brokers)"
