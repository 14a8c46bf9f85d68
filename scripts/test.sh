#!/usr/bin/env bash
# Run the whole test suite: install the workspace, start the servers the backends are tested
# against (PostgreSQL, Redis, a MongoDB-protocol server, an S3-compatible server) on loopback, run
# pytest on the newest supported pydantic-ai (the whole suite) and on the oldest (the tests that
# depend on pydantic-ai, see scripts/test-oldest.sh), and stop the servers again. Extra arguments go
# to pytest; the suite runs in two processes (STEPCORE_TEST_WORKERS sets how many, 0 for one).
set -euo pipefail
cd "$(dirname "$0")/.."
UV=$(bash scripts/ensure-uv.sh)
"$UV" sync --all-packages --all-extras --quiet

export STEPCORE_SERVICES_DIR="${STEPCORE_SERVICES_DIR:-$(mktemp -d -t stepcore-services.XXXXXX)}"
started=()
stop_services() {
    for ((i=${#started[@]}-1; i>=0; i--)); do
        bash "scripts/${started[i]}-server.sh" stop || true
    done
}
trap stop_services EXIT

start_service() {  # name env-var
    local name=$1 var=$2
    if [ -n "${!var:-}" ]; then
        echo "using $var=${!var}"
        return
    fi
    local url
    url=$(bash "scripts/$name-server.sh" start | tail -n 1)
    started+=("$name")
    export "$var=$url"
    echo "started $name: $var=$url"
}
for svc in postgres:STEP_POSTGRES_URL redis:STEP_REDIS_URL mongo:STEP_MONGO_URL s3:STEP_S3_ENDPOINT; do
    name=${svc%%:*}
    if [ -f "scripts/$name-server.sh" ]; then
        start_service "$name" "${svc##*:}"
    fi
done

# Two processes (pytest-xdist), a test file's tests in one of them: a backend's conformance class
# shares its fixtures (the crash-window zygote, for one) across its tests. STEPCORE_TEST_WORKERS=0
# runs everything in this process.
workers=${STEPCORE_TEST_WORKERS:-2}
"$UV" run pytest -n "$workers" --dist loadfile --durations=30 "$@"

# The tests that depend on pydantic-ai, on the oldest release stepcore supports (the newest is in .venv).
bash scripts/test-oldest.sh "$@"

