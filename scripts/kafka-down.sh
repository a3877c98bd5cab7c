#!/usr/bin/env bash
# Stops the cluster scripts/kafka-up.sh started (SIGTERM, then SIGKILL after
# 30 s). With --purge it also removes its state ($MILLRACE_KAFKA_DIR, default
# /tmp/millrace-kafka); the fetched jars stay in their cache.
set -euo pipefail
say() { echo "kafka-down: $*" >&2; }
dir=${MILLRACE_KAFKA_DIR:-/tmp/millrace-kafka}
pids=()
for pidf in "$dir"/node*/pid; do
	[ -f "$pidf" ] || continue
	pid=$(cat "$pidf")
	if kill -0 "$pid" 2>/dev/null; then
		kill -CONT "$pid" 2>/dev/null || true # a node a test left stopped
		kill -TERM "$pid" && pids+=("$pid")
	fi
	rm -f "$pidf"
done
for _ in $(seq 60); do
	left=()
	for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
	[ ${#left[@]} = 0 ] && break
	sleep 0.5
done
for pid in "${pids[@]}"; do
	if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" && say "killed $pid"; fi
done
say "stopped ${#pids[@]} node(s)"
if [ "${1:-}" = --purge ]; then
	rm -rf "$dir"
	say "removed $dir"
fi
