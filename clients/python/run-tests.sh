#!/usr/bin/env bash
# Runs the Python client's tests (clients/python/tests) against a real
# `tollgate serve`.
#
#   TOLLGATE_BIN   the binary the tests start (default: target/debug/tollgate
#                  of this repository; build it with
#                  `cargo build -p tollgate-server`)
#   PYTHON         the interpreter that creates the venv (default python3,
#                  at least 3.11: google-adk 2.13, which the tests need,
#                  requires it; the client itself supports 3.10)
#   TOLLGATE_TEST_PG_URL, TOLLGATE_TEST_REQUIRE_PG
#                  postgres://user@host:port/db of a PostgreSQL the session
#                  tests may create and drop databases in (unset: those
#                  tests are skipped, or fail when TOLLGATE_TEST_REQUIRE_PG
#                  is set, as the suite does)
#   TOLLGATE_TEST_REDIS_PORT, TOLLGATE_TEST_REQUIRE_REDIS
#                  the Redis the tests start (default a free port), and
#                  whether a missing redis-server fails instead of skipping
#
# The venv lives outside the repository, in
# ${XDG_CACHE_HOME:-$HOME/.cache}/tollgate/py-client-venv, created from the
# committed pins (requirements-test.txt, installed with --require-hashes)
# and recreated when the pins change. The package itself is installed in
# editable mode from this checkout on every run. Extra arguments go to
# pytest.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/tollgate/py-client-venv"
python="${PYTHON:-python3}"

export TOLLGATE_BIN="${TOLLGATE_BIN:-$root/target/debug/tollgate}"
if [ ! -x "$TOLLGATE_BIN" ]; then
    echo "run-tests.sh: no tollgate binary at $TOLLGATE_BIN (cargo build -p tollgate-server, or set TOLLGATE_BIN)" >&2
    exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "run-tests.sh: $python is older than Python 3.11 (google-adk 2.13 needs it)" >&2
    exit 1
fi

pins="$here/requirements-test.txt"
want="$(sha256sum "$pins" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
stamp="$venv/.tollgate-pins"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "run-tests.sh: creating $venv from $pins"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r "$pins"
    echo "$want" > "$stamp"
fi
# Editable, from this checkout, with the pinned build backend already in
# the venv (no network for it).
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$here"

cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
