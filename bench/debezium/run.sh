#!/usr/bin/env bash
# Debezium's PostgreSQL connector with its outbox event router, run by Kafka
# Connect standalone against the same table shape, backlog and cluster as
# `make bench`, for the side-by-side figures in bench/README.md (Debezium).
# Writes bench/results-debezium.json (BENCH_OUT to change); `make bench-debezium`.
#
#   DATABASE_URL=... KAFKA_BROKERS=... bench/debezium/run.sh
#   BENCH_QUICK=1 bench/debezium/run.sh      # 20,000 events, 3 s latency phase
#
# - Kafka Connect and Debezium (the versions pinned in bench/debezium/pom.xml)
#   are fetched with `mvn dependency:copy-dependencies` into a cache outside
#   the repository ($MILLRACE_DEBEZIUM_CACHE, default
#   ~/.cache/millrace/debezium-VERSION), once: libs/ is the worker's classpath,
#   plugins/ its plugin.path.
# - A fresh schema holds an outbox table in the shape of millrace's
#   outbox_event; a publication and a pgoutput slot for it are created before
#   the backlog is written, so the backlog is in the slot's stream, and the
#   connector starts with snapshot.mode=no_data. The router writes to a topic
#   of the run's own (8 partitions, replication factor 3).
# - Figures: drain rate (Connect's start until the topic's high-water marks
#   sum to N, and from the first record), commit -> consumer latency at 1,000
#   events/s, the JVM's peak RSS, and (Connect stopped) the write cost of the
#   business transaction as make bench's write_ratio measures it. bench/debezium/drive (Go) does the
#   PostgreSQL and Kafka parts.
# - On exit, also on failure or Ctrl-C: Connect is stopped, the slot (a
#   leftover slot keeps WAL forever), publication, schema and topic dropped.
#   Connect's log is kept on failure and its path printed.
#
# Heap: $MILLRACE_CONNECT_HEAP (default 512m). DEBEZIUM_POLL_INTERVAL_MS sets
# the connector's poll.interval.ms (unset: Debezium's default).
set -euo pipefail
say() { echo "bench-debezium: $*" >&2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/bench/debezium
pom=$here/pom.xml

: "${DATABASE_URL:?DATABASE_URL must name the PostgreSQL database (wal_level=logical)}"
: "${KAFKA_BROKERS:?KAFKA_BROKERS must name the Kafka cluster (scripts/kafka-up.sh)}"
prop() { sed -n "s:.*<$1>\(.*\)</$1>.*:\1:p" "$pom"; }
dbz_version=$(prop debezium.version)
connect_version=$(prop connect.version)
cache=${MILLRACE_DEBEZIUM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/millrace/debezium-$dbz_version}
heap=${MILLRACE_CONNECT_HEAP:-512m}
out=${BENCH_OUT:-$root/bench/results-debezium.json}
quick=false n=200000 duration=10s
if [ "${BENCH_QUICK:-}" = 1 ]; then quick=true n=20000 duration=3s; fi

command -v java >/dev/null 2>&1 || { say "java not found: Kafka Connect $connect_version needs Java 17 or newer"; exit 1; }
stamp="debezium $dbz_version, connect $connect_version"
if [ ! -f "$cache/complete" ] || [ "$(cat "$cache/complete")" != "$stamp" ]; then
	command -v mvn >/dev/null 2>&1 || { say "mvn not found: it fetches Kafka Connect and Debezium"; exit 1; }
	say "fetching Kafka Connect $connect_version and Debezium $dbz_version with mvn into $cache (a first fetch takes a minute or two)"
	rm -rf "$cache/libs" "$cache/plugins"
	mkdir -p "$cache"
	mvn -q -B -f "$pom" -P connect dependency:copy-dependencies \
		-DoutputDirectory="$cache/libs" -DincludeScope=runtime >&2
	# The connector's own class loader gets Debezium and its dependencies;
	# the Connect API, the clients and slf4j come from the worker.
	mvn -q -B -f "$pom" -P connector dependency:copy-dependencies \
		-DoutputDirectory="$cache/plugins/debezium-connector-postgres" -DincludeScope=runtime \
		-DexcludeGroupIds=org.apache.kafka,org.slf4j >&2
	echo "$stamp" >"$cache/complete"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-debezium.XXXXXX")
id=$(date +%s)_$$
schema=bench_dbz_$id slot=bench_dbz_$id pub=bench_dbz_$id topic=bench_debezium_$id
drive=$tmp/drive
connect_pid=""
ok=0
stop_connect() {
	[ -n "$connect_pid" ] || return 0
	if kill -0 "$connect_pid" 2>/dev/null; then
		kill -TERM "$connect_pid" 2>/dev/null || true
		for _ in $(seq 60); do kill -0 "$connect_pid" 2>/dev/null || break; sleep 0.5; done
		kill -0 "$connect_pid" 2>/dev/null && { kill -KILL "$connect_pid" 2>/dev/null || true; say "killed Kafka Connect (pid $connect_pid)"; }
	fi
	wait "$connect_pid" 2>/dev/null || true
	connect_pid=""
}
finish() {
	stop_connect
	if [ -x "$drive" ]; then
		"$drive" cleanup -schema "$schema" -slot "$slot" -pub "$pub" -topic "$topic" || say "cleanup failed: check pg_replication_slots for $slot"
	fi
	if [ "$ok" = 1 ]; then
		rm -rf "$tmp"
	else
		say "failed; Kafka Connect's log and configs are in $tmp"
		tail -20 "$tmp/connect.log" 2>/dev/null >&2 || true
	fi
}
trap finish EXIT
trap 'exit 130' INT TERM

loadavg() { cut -d' ' -f1 /proc/loadavg; }
load_start=$(loadavg)
say "building bench/debezium/drive"
(cd "$root" && go build -o "$drive" ./bench/debezium/drive)
"$drive" setup -schema "$schema" -slot "$slot" -pub "$pub" -topic "$topic" -n "$n" -out "$tmp/setup.json"

cat >"$tmp/worker.properties" <<EOF
# Kafka Connect standalone worker for bench/debezium/run.sh.
bootstrap.servers=$KAFKA_BROKERS
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=$tmp/offsets
offset.flush.interval.ms=10000
plugin.path=$cache/plugins
listeners=http://127.0.0.1:0
# The producer as millrace's relay configures sarama: acks from all in-sync
# replicas, idempotent (Connect's defaults, stated).
producer.acks=all
producer.enable.idempotence=true
EOF
{
	cat <<EOF
# Debezium's PostgreSQL connector with the outbox event router, for bench/debezium/run.sh.
name=bench-debezium
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
EOF
	"$drive" connprops
	cat <<EOF
plugin.name=pgoutput
slot.name=$slot
publication.name=$pub
publication.autocreate.mode=disabled
snapshot.mode=no_data
table.include.list=$schema.outbox_event
topic.prefix=bench_dbz_$id
tombstones.on.delete=false
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=event_id
transforms.outbox.table.field.event.key=partition_key
transforms.outbox.table.field.event.payload=payload
transforms.outbox.table.fields.additional.placement=event_type:header:event_type,aggregate_type:header:aggregate_type,aggregate_id:header:aggregate_id
transforms.outbox.route.by.field=topic
transforms.outbox.route.topic.replacement=\${routedByValue}
EOF
	if [ -n "${DEBEZIUM_POLL_INTERVAL_MS:-}" ]; then echo "poll.interval.ms=$DEBEZIUM_POLL_INTERVAL_MS"; fi
} >"$tmp/connector.properties"

say "starting Kafka Connect $connect_version standalone with Debezium $dbz_version (heap $heap, log $tmp/connect.log)"
since=$(date +%s%N)
java -Xms128m -Xmx"$heap" -XX:+UseG1GC -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1 \
	-XX:CICompilerCount=2 -Djava.awt.headless=true \
	-Dlog4j2.configurationFile="$here/log4j2.properties" -Dmillrace.connect.log="$tmp/connect.log" \
	-cp "$cache/libs/*" org.apache.kafka.connect.cli.ConnectStandalone \
	"$tmp/worker.properties" "$tmp/connector.properties" >"$tmp/connect.stdout" 2>&1 </dev/null &
connect_pid=$!
"$drive" drain -topic "$topic" -n "$n" -since "$since" -pid "$connect_pid" -out "$tmp/drain.json"
"$drive" latency -schema "$schema" -topic "$topic" -duration "$duration" -out "$tmp/latency.json"
rss_kib=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$connect_pid/status")
say "Kafka Connect peak RSS $((rss_kib / 1024)) MiB"
stop_connect
# The write cost with Connect stopped, as make bench's write_ratio runs with
# no relay: what the business transaction itself pays.
"$drive" write -schema "$schema" -topic "$topic" -duration "$duration" -out "$tmp/write.json"
load_end=$(loadavg)

"$drive" report -out "$out" -part "$tmp/setup.json" -part "$tmp/drain.json" -part "$tmp/latency.json" -part "$tmp/write.json" \
	quick="$quick" rss_kib="$rss_kib" debezium="$dbz_version" kafka_connect="$connect_version" \
	java="$(java -version 2>&1 | head -1 | sed 's/"//g')" heap="$heap" \
	kafka_brokers="$(echo "$KAFKA_BROKERS" | tr ',' '\n' | wc -l)" \
	poll_interval_ms="${DEBEZIUM_POLL_INTERVAL_MS:-connector default}" \
	cpus="$(nproc)" load_avg_start="$load_start" load_avg_end="$load_end"
ok=1
say "wrote $out"
cat "$out"
