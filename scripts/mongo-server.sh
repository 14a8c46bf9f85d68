#!/usr/bin/env bash
# Start or stop a local MongoDB wire-protocol test server for the step-mongo tests.
#
#   scripts/mongo-server.sh start   # installs the server if needed, starts it, prints the URL
#   scripts/mongo-server.sh stop    # stops the server started by `start`
#   scripts/mongo-server.sh status  # prints the URL if the server answers a ping, else exits 1
#
# Typical use:
#   export STEP_MONGO_URL="$(scripts/mongo-server.sh start)"
#   uv run pytest packages/step-mongo
#   scripts/mongo-server.sh stop
#
# The server is mongoeco (a MongoDB wire-protocol server written in Python, in-memory engine,
# following MongoDB 8.0 behaviour), installed into its own virtualenv because it needs
# Python >= 3.13. The interpreter is taken from $MONGOECO_PYTHON, else pyenv's newest 3.13/3.14,
# else python3.13 / python3.14 on PATH. Data lives in memory and is gone after `stop`.
# Against a real MongoDB (for example the mongo:8 service in CI) skip this script and set
# STEP_MONGO_URL=mongodb://127.0.0.1:27017 yourself.
#
# Everything lives under ${STEPCORE_SERVICES_DIR:-<repo>/.ci-services}/mongo: the virtualenv,
# the pid file, the url file and the log.
set -euo pipefail

MONGOECO_VERSION="4.11.0"
PYMONGO_VERSION="4.20.1"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
services_dir="${STEPCORE_SERVICES_DIR:-$repo_root/.ci-services}"
state_dir="$services_dir/mongo"
venv_dir="$state_dir/venv"
venv_python="$venv_dir/bin/python"
stamp_file="$venv_dir/.stepcore-installed"
pid_file="$state_dir/server.pid"
port_file="$state_dir/port"
url_file="$state_dir/url"
log_file="$state_dir/server.log"
serve_py="$repo_root/scripts/mongo/serve.py"
start_timeout="${MONGO_SERVER_START_TIMEOUT:-30}"

# shellcheck disable=SC2034  # read by lib/services.sh
service_name=mongo-server
# shellcheck source-path=SCRIPTDIR source=lib/services.sh
source "$repo_root/scripts/lib/services.sh"

answers() {
    [[ -x "$venv_python" ]] || return 1
    "$venv_python" "$serve_py" --ping "$1" --timeout "${2:-2}" 2>/dev/null
}

find_python() {
    if [[ -n "${MONGOECO_PYTHON:-}" ]]; then
        echo "$MONGOECO_PYTHON"
        return 0
    fi
    local candidate root
    if command -v pyenv >/dev/null 2>&1 && root="$(pyenv root 2>/dev/null)"; then
        for candidate in $(ls -d "$root"/versions/3.1[3-9]* 2>/dev/null | sort -V -r); do
            if [[ -x "$candidate/bin/python3" ]]; then
                echo "$candidate/bin/python3"
                return 0
            fi
        done
    fi
    for candidate in python3.14 python3.13; do
        if command -v "$candidate" >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

install_server() {
    local wanted="mongoeco[wire]==$MONGOECO_VERSION pymongo==$PYMONGO_VERSION"
    if [[ -x "$venv_python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$wanted" ]]; then
        return 0
    fi
    local python uv
    if ! python="$(find_python)"; then
        log "no Python >= 3.13 found (mongoeco needs it): set MONGOECO_PYTHON=/path/to/python3.13," \
            "install one with pyenv, or point STEP_MONGO_URL at a real MongoDB instead"
        exit 1
    fi
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 13))' 2>/dev/null; then
        log "$python is not a runnable Python >= 3.13, which mongoeco needs: set MONGOECO_PYTHON to one"
        exit 1
    fi
    uv="$("$repo_root/scripts/ensure-uv.sh")"
    log "installing mongoeco $MONGOECO_VERSION into $venv_dir (Python: $python)"
    rm -rf "$venv_dir"
    "$uv" venv --quiet --python "$python" "$venv_dir" >&2
    # shellcheck disable=SC2086
    "$uv" pip install --quiet --python "$venv_python" $wanted >&2
    echo "$wanted" >"$stamp_file"
}

start() {
    mkdir -p "$state_dir"
    already_running "$url_file" && return 0
    install_server
    rm -f "$port_file" "$url_file"
    : >"$log_file"
    # Port 0: the kernel picks a free port; serve.py writes the bound one to $port_file.
    setsid nohup "$venv_python" "$serve_py" --host 127.0.0.1 --port 0 --port-file "$port_file" \
        >"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    local deadline=$((SECONDS + start_timeout))
    while [[ ! -s "$port_file" ]]; do
        if ! running_pid >/dev/null; then
            fail_with_log "$log_file" "the server exited during start-up"
            rm -f "$pid_file"
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            fail_with_log "$log_file" "the server did not bind a port within $start_timeout s"
            stop
            exit 1
        fi
        sleep 0.2
    done
    local url
    url="mongodb://127.0.0.1:$(tr -d '[:space:]' <"$port_file")"
    if ! answers "$url" "$start_timeout"; then
        fail_with_log "$log_file" "the server at $url did not answer ping within $start_timeout s"
        stop
        exit 1
    fi
    echo "$url" >"$url_file"
    log "listening on $url (pid $(cat "$pid_file"), mongoeco $MONGOECO_VERSION, in-memory)"
    echo "$url"
}

stop() {
    stop_recorded_pid
    rm -f "$pid_file" "$port_file" "$url_file"
}

status() { print_url_if_running "$url_file"; }

commands="start stop status"
main "$@"
