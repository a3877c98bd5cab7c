#!/usr/bin/env bash
# Makes sure a Chromium browser is available for the console's browser test
# (console/browser_test.go) and prints its path on stdout (what it did goes to
# stderr). Idempotent.
#
#   1. CHROMIUM_PATH, if set and executable;
#   2. chromium (or chromium-browser, google-chrome) on PATH;
#   3. as root, apt-get update and install Debian's chromium package;
#   4. otherwise (not root, no apt-get, or the install failed) say so and
#      exit 0 with nothing on stdout: the browser test then skips with the
#      same advice, and the rest of the suite runs.
#
# Set MILLRACE_NO_CHROMIUM_INSTALL=1 to never install anything.
set -euo pipefail
say() { echo "chromium: $*" >&2; }

find_browser() {
	if [ -n "${CHROMIUM_PATH:-}" ] && [ -x "$CHROMIUM_PATH" ]; then
		echo "$CHROMIUM_PATH"
		return 0
	fi
	local b
	for b in chromium chromium-browser google-chrome; do
		if command -v "$b" >/dev/null 2>&1; then
			command -v "$b"
			return 0
		fi
	done
	return 1
}

if path=$(find_browser); then
	say "using $path"
	echo "$path"
	exit 0
fi
if [ -n "${CHROMIUM_PATH:-}" ]; then
	say "CHROMIUM_PATH=$CHROMIUM_PATH is not executable; looking elsewhere"
fi
if [ "${MILLRACE_NO_CHROMIUM_INSTALL:-}" = 1 ]; then
	say "not installed and MILLRACE_NO_CHROMIUM_INSTALL=1: the console browser test will be skipped"
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	say "not installed, and installing needs root and apt-get: the console browser test will be skipped"
	say "install Debian's chromium (apt-get install chromium) or set CHROMIUM_PATH to run it"
	exit 0
fi
say "installing Debian's chromium (apt-get update; apt-get install -y chromium)"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq chromium; } >&2; then
	say "apt-get could not install chromium (see above): the console browser test will be skipped"
	exit 0
fi
if path=$(find_browser); then
	say "installed $path"
	echo "$path"
	exit 0
fi
say "apt-get installed chromium but no browser is on PATH"
exit 1
