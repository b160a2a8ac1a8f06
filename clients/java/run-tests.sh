#!/usr/bin/env bash
# Runs the Java client's build and tests (clients/java, `mvn -B verify`)
# against a real `tollgate serve`.
#
#   TOLLGATE_BIN   the binary the tests start (default: target/debug/tollgate
#                  of this repository, built with `cargo build -p
#                  tollgate-server` by the suite when it is missing)
#   TOLLGATE_TEST_REQUIRE_REDIS
#                  set: a missing redis-server fails the Redis tests instead
#                  of skipping them (the suite starts its own on free ports)
#   TOLLGATE_TEST_PG_URL
#                  postgres://user@host:port/db of a PostgreSQL the session
#                  tests may create and drop databases in (unset: those
#                  tests are skipped)
#   TOLLGATE_TEST_REQUIRE_PG
#                  set: a missing TOLLGATE_TEST_PG_URL fails the PostgreSQL
#                  tests instead of skipping them (the suite sets both)
#   MAVEN_REPO     the local Maven repository (default: Maven's, ~/.m2,
#                  outside this repository); every artifact is pinned in
#                  the POMs
#
# Extra arguments go to Maven (e.g. -Dtest=RetryTest -pl tollgate-client).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export TOLLGATE_BIN="${TOLLGATE_BIN:-$root/target/debug/tollgate}"

for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "run-tests.sh: $tool is missing (apt-get install openjdk-17-jdk-headless maven)" >&2
        exit 1
    fi
done
major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
if [ "${major:-0}" -lt 17 ] 2>/dev/null; then
    echo "run-tests.sh: Java $major is older than 17 (ADK Java's baseline)" >&2
    exit 1
fi

repo=()
if [ -n "${MAVEN_REPO:-}" ]; then repo=(-Dmaven.repo.local="$MAVEN_REPO"); fi
cd "$here"
exec mvn -B -ntp "${repo[@]}" verify "$@"
