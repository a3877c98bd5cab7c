#!/usr/bin/env bash
# Finds or starts a PostgreSQL for millrace's tests and demo, and prints its
# URL on stdout (what it did goes to stderr). Idempotent.
#
#   1. DATABASE_URL, if set and it answers;
#   2. 127.0.0.1:5432 (or $MILLRACE_PG_PORT) as user postgres, database test
#      (created if missing);
#   3. a throwaway cluster from the locally installed PostgreSQL binaries
#      (initdb into .pg/ under the repository, or /tmp/millrace-pg when root, since
#      the postgres user may not reach the repository; on a free port), reused if running;
#   4. as root, install Debian's postgresql package, then 3.
#
# The throwaway cluster runs with wal_level=logical and 64 replication slots
# (the CDC relay streams the WAL; its tests run in parallel), 300 connections (the test packages run in parallel), fsync on
# and pg_stat_statements preloaded when the installation has it (the bench
# reports PostgreSQL's cost per statement from it). A
# reused throwaway cluster started without those settings is restarted with
# them. A PostgreSQL found at 1 or 2 is used as it is.
set -euo pipefail
say() { echo "pg-up: $*" >&2; }
root=$(cd "$(dirname "$0")/.." && pwd)

answers() { # url
	if command -v psql >/dev/null 2>&1; then
		PGCONNECT_TIMEOUT=3 psql "$1" -Atqc 'select 1' >/dev/null 2>&1
	else
		(cd "$root" && go run ./internal/pgtest/cmd/pgping "$1") >/dev/null 2>&1
	fi
}

if [ -n "${DATABASE_URL:-}" ]; then
	if answers "$DATABASE_URL"; then
		say "using DATABASE_URL"
		echo "$DATABASE_URL"
		exit 0
	fi
	say "DATABASE_URL is set but does not answer; refusing to guess another database"
	exit 1
fi

port0=${MILLRACE_PG_PORT:-5432} # the port to try first; tests of this script point it elsewhere
local_url="postgres://postgres@127.0.0.1:$port0/test?sslmode=disable"
if answers "postgres://postgres@127.0.0.1:$port0/postgres?sslmode=disable"; then
	if ! answers "$local_url"; then
		say "creating database test on 127.0.0.1:$port0"
		psql "postgres://postgres@127.0.0.1:$port0/postgres?sslmode=disable" -qc 'CREATE DATABASE test' >&2 || true
	fi
	if answers "$local_url"; then
		say "using PostgreSQL at 127.0.0.1:$port0 (user postgres, database test)"
		echo "$local_url"
		exit 0
	fi
fi

find_bindir() {
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) "$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")"; do
		[ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
	done
	return 1
}

bindir=$(find_bindir || true)
if [ -z "$bindir" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		say "no PostgreSQL binaries found; installing Debian's postgresql"
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
		bindir=$(find_bindir)
	else
		say "no PostgreSQL answers at 127.0.0.1:$port0, none is installed, and I am not root to install one; set DATABASE_URL"
		exit 1
	fi
fi

pgdir="$root/.pg"
[ "$(id -u)" = 0 ] && pgdir=/tmp/millrace-pg
pgdir=${MILLRACE_PG_DIR:-$pgdir}
data="$pgdir/data"
portfile="$pgdir/port"
run_as=()
if [ "$(id -u)" = 0 ]; then
	# initdb refuses to run as root: use the postgres user when there is one.
	id postgres >/dev/null 2>&1 || useradd -r -m postgres
	run_as=(runuser -u postgres --)
fi
settings="-c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=on -c wal_level=logical -c max_wal_senders=64 -c max_replication_slots=64"
preload=
if [ -f "$("$bindir/pg_config" --pkglibdir 2>/dev/null)/pg_stat_statements.so" ]; then
	preload=pg_stat_statements
	settings="$settings -c shared_preload_libraries=pg_stat_statements"
fi
setting() { # port name
	"$bindir/psql" "postgres://postgres@127.0.0.1:$1/postgres?sslmode=disable" -Atqc "SHOW $2" 2>/dev/null
}
if [ -f "$portfile" ] && answers "postgres://postgres@127.0.0.1:$(cat "$portfile")/postgres?sslmode=disable"; then
	port=$(cat "$portfile")
	if [ "$(setting "$port" wal_level)" != logical ] || [ "$(setting "$port" max_connections)" -lt 300 ] ||
		[ "$(setting "$port" max_replication_slots)" -lt 64 ] ||
		{ [ -n "$preload" ] && [[ ",$(setting "$port" shared_preload_libraries | tr -d ' ')," != *",$preload,"* ]]; }; then
		say "restarting the throwaway cluster in $data with wal_level=logical, 300 connections, 64 replication slots and ${preload:-no preloaded library}"
		"${run_as[@]}" "$bindir/pg_ctl" -D "$data" -l "$pgdir/log" -w -m fast -o "-p $port -k /tmp $settings" restart >&2
	else
		say "reusing the throwaway cluster in $data on port $port"
	fi
else
	mkdir -p "$pgdir"
	[ "$(id -u)" = 0 ] && chown postgres "$pgdir"
	if [ ! -f "$data/PG_VERSION" ]; then
		say "initdb into $data ($bindir)"
		"${run_as[@]}" "$bindir/initdb" -D "$data" -U postgres -A trust >/dev/null
	fi
	port=54329
	while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done # first free port
	echo "$port" >"$portfile"
	say "starting a throwaway cluster on 127.0.0.1:$port"
	"${run_as[@]}" "$bindir/pg_ctl" -D "$data" -l "$pgdir/log" -w -o "-p $port -k /tmp $settings" start >&2
fi
url="postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
if ! answers "$url"; then
	say "creating database test on 127.0.0.1:$port"
	"$bindir/psql" "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable" -qc 'CREATE DATABASE test' >&2 2>/dev/null \
		|| (cd "$root" && go run ./internal/pgtest/cmd/pgping -create test "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable") >&2
fi
echo "$url"
