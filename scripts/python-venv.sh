#!/usr/bin/env bash
# Makes (or reuses) the Python virtual environment of python/ from its
# pinned requirements and prints its python on stdout; what it did goes to
# stderr. Idempotent.
#
# The environment lives outside the repository, in
# ${MILLRACE_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/millrace}/venv-HASH,
# HASH naming python/requirements.txt's content: a changed pin makes a new
# one. A first run installs psycopg 3 (binary), confluent-kafka and pytest
# from PyPI (wheels, about 20 MB; under a minute here); later runs reuse it.
# The millrace package itself is not installed: run with
# PYTHONPATH=python (as make test does), so each checkout tests its own code.
set -euo pipefail
say() { echo "python-venv: $*" >&2; }
root="$(cd "$(dirname "$0")/.." && pwd)"
req="$root/python/requirements.txt"
py="${PYTHON:-python3}"
command -v "$py" >/dev/null 2>&1 || { say "no $py on PATH: install Python 3.10 or newer"; exit 1; }
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || { say "$py is older than 3.10"; exit 1; }
hash="$(cat "$req" <("$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12)"
base="${MILLRACE_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/millrace}"
venv="$base/venv-$hash"
if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
	say "reusing $venv"
	echo "$venv/bin/python"
	exit 0
fi
say "creating $venv from python/requirements.txt (first run: a minute)"
rm -rf "$venv"
mkdir -p "$base"
"$py" -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req" >&2
touch "$venv/.complete"
say "done"
echo "$venv/bin/python"
