#!/usr/bin/env bash
# A throwaway Redis server for the step-redis tests.
#
#   export STEP_REDIS_URL="$(scripts/redis-server.sh start)"
#   uv run pytest packages/step-redis
#   scripts/redis-server.sh stop
#
# `start` installs Debian's redis-server package when no `redis-server` is found (as root; set
# REDIS_SERVER to use another binary), starts a server on 127.0.0.1 on a free port with its data
# under ${STEPCORE_SERVICES_DIR:-.ci-services}/redis, waits until it answers PING and prints the
# URL on stdout (everything else goes to stderr). Starting again while it runs prints the same URL.
# `stop` shuts the server down and deletes its data; `status` prints the URL when it answers.
#
# Persistence is the one step-redis documents as crash-safe: the append-only file with
# `appendfsync always` (every write is on disk before the server answers) and no RDB snapshots,
# so a store's write is durable once it returns. The server listens on loopback only, with
# protected mode on, and reads no configuration file but the one written here.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
services_dir="${STEPCORE_SERVICES_DIR:-$repo_root/.ci-services}"
state_dir="$services_dir/redis"
data_dir="$state_dir/data"
conf_file="$state_dir/redis.conf"
pid_file="$state_dir/server.pid"
url_file="$state_dir/url"
log_file="$state_dir/server.log"
start_timeout="${REDIS_SERVER_START_TIMEOUT:-30}"

# shellcheck disable=SC2034  # read by lib/services.sh
service_name=redis-server
# shellcheck source-path=SCRIPTDIR source=lib/services.sh
source "$repo_root/scripts/lib/services.sh"

find_server() {
    if [[ -n "${REDIS_SERVER:-}" ]]; then
        [[ -x "$REDIS_SERVER" ]] || die "REDIS_SERVER=$REDIS_SERVER is not an executable redis-server"
        echo "$REDIS_SERVER"
        return 0
    fi
    command -v redis-server
}

install_server() {
    [[ "$(id -u)" == 0 ]] || die "redis-server is not installed and installing it needs root: apt-get install redis-server (or set REDIS_SERVER)"
    command -v apt-get >/dev/null || die "no redis-server found and no apt-get to install it: set REDIS_SERVER"
    log "installing Debian's redis-server package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq redis-server >&2
}

# `answers URL`: the server at URL replies PONG (used by lib/services.sh).
answers() {
    local port="${1##*:}"
    port="${port%%/*}"
    [[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" == PONG ]]
}

start() {
    mkdir -p "$state_dir"
    already_running "$url_file" && return 0
    local server
    if ! server="$(find_server)"; then
        install_server
        server="$(find_server)" || die "redis-server installed but not found on PATH"
    fi
    command -v redis-cli >/dev/null || die "redis-cli not found: install Debian's redis-tools package"
    rm -rf "$data_dir"
    mkdir -m 700 "$data_dir"
    local port
    port="$(free_port)"
    cat >"$conf_file" <<EOF
bind 127.0.0.1
protected-mode yes
port $port
daemonize no
dir $data_dir
logfile $log_file
save ""
appendonly yes
appendfsync always
EOF
    : >"$log_file"
    setsid nohup "$server" "$conf_file" >>"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    local url="redis://127.0.0.1:$port/0"
    local deadline=$((SECONDS + start_timeout))
    until answers "$url"; do
        if ! running_pid >/dev/null; then
            fail_with_log "$log_file" "the server exited during start-up"
            rm -f "$pid_file"
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            fail_with_log "$log_file" "the server did not answer PING within $start_timeout s"
            stop
            exit 1
        fi
        sleep 0.1
    done
    echo "$url" >"$url_file"
    log "listening on $url (pid $(cat "$pid_file"), redis $("$server" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p'), appendfsync always)"
    echo "$url"
}

stop() {
    stop_recorded_pid
    rm -rf "$data_dir"
    rm -f "$pid_file" "$url_file" "$conf_file" "$log_file"
    rmdir "$state_dir" 2>/dev/null || true
}

status() { print_url_if_running "$url_file"; }

commands="start stop status"
main "$@"
