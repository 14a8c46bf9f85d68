#!/usr/bin/env bash
# A throwaway PostgreSQL server for the step-postgres tests.
#
#   export STEP_POSTGRES_URL="$(scripts/postgres-server.sh start)"
#   uv run pytest packages/step-postgres
#   scripts/postgres-server.sh stop
#
# `start` installs Debian's postgresql package when no server binaries are found, initdb's a fresh
# cluster under ${STEPCORE_SERVICES_DIR:-.ci-services}/postgres, starts it on 127.0.0.1 on a free
# port (its unix socket stays inside the state directory), waits until it accepts connections,
# creates the role and database `stepcore` (password `stepcore`) and prints the connection URL on
# stdout (everything else goes to stderr). Starting again while it runs prints the same URL.
# `stop` shuts the server down and deletes the cluster.
#
# PostgreSQL refuses to run as root: as root, the server runs as the `postgres` OS user (created
# by the Debian package). Set PG_BIN to use other server binaries.
set -euo pipefail

STATE_DIR="${STEPCORE_SERVICES_DIR:-.ci-services}/postgres"
STATE_FILE="$STATE_DIR/state"
DB_NAME=stepcore
DB_USER=stepcore
DB_PASSWORD=stepcore

# shellcheck disable=SC2034  # read by lib/services.sh
service_name=postgres-server
# shellcheck source-path=SCRIPTDIR source=lib/services.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/services.sh"

find_bin() {
    if [[ -n "${PG_BIN:-}" ]]; then
        [[ -x "$PG_BIN/initdb" ]] || die "PG_BIN=$PG_BIN has no initdb: point it at a PostgreSQL bin directory"
        echo "$PG_BIN"
        return
    fi
    local dir
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    [[ -n "$dir" && -x "$dir/initdb" ]] && echo "$dir"
}

install_server() {
    [[ "$(id -u)" == 0 ]] || die "PostgreSQL is not installed and installing it needs root: apt-get install postgresql (or set PG_BIN)"
    command -v apt-get >/dev/null || die "no PostgreSQL binaries found and no apt-get to install them: set PG_BIN"
    log "installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
}

# Run a server binary as the account that owns the cluster.
as_owner() {
    if [[ "$(id -u)" == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

running() {
    [[ -f "$STATE_FILE" ]] || return 1
    # shellcheck disable=SC1090
    source "$STATE_FILE"
    as_owner "$BIN/pg_ctl" status -D "$PGDATA_DIR" >/dev/null 2>&1
}

start() {
    if running; then
        log "already running on port $PORT"
        echo "$URL"
        return
    fi
    if [[ -f "$STATE_FILE" ]]; then
        log "removing a stale cluster left by an earlier run ($CLUSTER)"
        rm -rf "$CLUSTER"
        rm -f "$STATE_FILE"
    fi
    local bin
    bin="$(find_bin || true)"
    if [[ -z "$bin" ]]; then
        install_server
        bin="$(find_bin || true)"
        [[ -n "$bin" ]] || die "postgresql installed but no /usr/lib/postgresql/<version>/bin/initdb found"
    fi
    mkdir -p "$STATE_DIR"
    STATE_DIR="$(cd "$STATE_DIR" && pwd)"
    STATE_FILE="$STATE_DIR/state"

    local cluster
    cluster="$(mktemp -d "$STATE_DIR/cluster.XXXXXX")"
    if [[ "$(id -u)" == 0 ]]; then
        id postgres >/dev/null 2>&1 || die "no 'postgres' OS user to run the server as (install the postgresql package)"
        chown postgres: "$cluster"
        if ! runuser -u postgres -- test -w "$cluster"; then
            # The state directory sits below a directory the postgres user cannot enter (e.g. /root):
            # keep the cluster in /tmp and remember where it is.
            rmdir "$cluster"
            cluster="$(mktemp -d /tmp/stepcore-postgres.XXXXXX)"
            chown postgres: "$cluster"
            log "state directory is not reachable by the postgres user; cluster lives in $cluster"
        fi
    fi
    local data="$cluster/data" sock="$cluster/sock" port
    as_owner mkdir -m 700 "$data" "$sock"
    port="$(free_port)"
    local url="postgresql://$DB_USER:$DB_PASSWORD@127.0.0.1:$port/$DB_NAME"
    cat >"$STATE_FILE" <<EOF
BIN='$bin'
CLUSTER='$cluster'
PGDATA_DIR='$data'
PORT='$port'
URL='$url'
EOF

    log "initdb $data ($("$bin/postgres" --version))"
    as_owner "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 --no-sync >"$cluster/initdb.log" 2>&1 ||
        die "initdb failed: $(tail -n 20 "$cluster/initdb.log")"
    log "starting on 127.0.0.1:$port"
    # fsync off: a throwaway test cluster never needs crash safety.
    as_owner "$bin/pg_ctl" start -D "$data" -l "$cluster/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $sock -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        >&2 || die "server did not start: $(tail -n 20 "$cluster/server.log")"
    local i
    for i in $(seq 1 60); do
        if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
            break
        fi
        [[ "$i" == 60 ]] && die "server not ready after 30 s: $(tail -n 20 "$cluster/server.log")"
        sleep 0.5
    done
    as_owner "$bin/psql" -q -v ON_ERROR_STOP=1 -h "$sock" -p "$port" -U postgres -d postgres \
        -c "CREATE ROLE $DB_USER LOGIN PASSWORD '$DB_PASSWORD'" \
        -c "CREATE DATABASE $DB_NAME OWNER $DB_USER" >&2
    log "ready: $url"
    echo "$url"
}

stop() {
    if [[ ! -f "$STATE_FILE" ]]; then
        log "not running (no $STATE_FILE)"
        return
    fi
    # shellcheck disable=SC1090
    source "$STATE_FILE"
    if as_owner "$BIN/pg_ctl" status -D "$PGDATA_DIR" >/dev/null 2>&1; then
        as_owner "$BIN/pg_ctl" stop -D "$PGDATA_DIR" -m fast -w -t 60 >&2
    fi
    rm -rf "$CLUSTER"
    rm -f "$STATE_FILE"
    rmdir "$STATE_DIR" 2>/dev/null || true
    log "stopped and removed $CLUSTER"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
url)
    running || die "not running: run '$0 start' first"
    echo "$URL"
    ;;
*)
    echo "usage: $0 start|stop|url" >&2
    exit 2
    ;;
esac
