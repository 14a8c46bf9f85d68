#!/usr/bin/env bash
# Start or stop a local S3-compatible test server (s3rver) for the media-s3 tests.
#
#   scripts/s3-server.sh start   # installs s3rver if needed, starts it, prints the endpoint URL
#   scripts/s3-server.sh stop    # stops the server started by `start` and removes its data
#   scripts/s3-server.sh status  # prints the endpoint URL if the server answers, else exits 1
#
# Typical use:
#   export STEP_S3_ENDPOINT="$(scripts/s3-server.sh start)"
#   uv run pytest packages/media-s3
#   scripts/s3-server.sh stop
#
# s3rver verifies request signatures; its fixed credentials are S3RVER / S3RVER. The bucket
# named by STEP_S3_BUCKET (default `stepcore-test`) exists from the start.
#
# Everything lives under ${STEPCORE_SERVICES_DIR:-<repo>/.ci-services}/s3: the npm prefix holding
# s3rver, the pid file, the endpoint file, the log, and a temporary data directory.
set -euo pipefail

S3RVER_VERSION="3.7.1"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
services_dir="${STEPCORE_SERVICES_DIR:-$repo_root/.ci-services}"
state_dir="$services_dir/s3"
pid_file="$state_dir/server.pid"
endpoint_file="$state_dir/endpoint"
log_file="$state_dir/server.log"
data_dir_file="$state_dir/data-dir"
bucket="${STEP_S3_BUCKET:-stepcore-test}"
s3rver_bin="$state_dir/node_modules/.bin/s3rver"

# shellcheck disable=SC2034  # read by lib/services.sh
service_name=s3-server
# shellcheck source-path=SCRIPTDIR source=lib/services.sh
source "$repo_root/scripts/lib/services.sh"

answers() {
    # Any HTTP status (even 403 for an unsigned request) means the server is up.
    local code
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1/$bucket" || true)"
    [[ "$code" != "000" && -n "$code" ]]
}

install_s3rver() {
    local installed=""
    if [[ -f "$state_dir/node_modules/s3rver/package.json" ]]; then
        installed="$(node -p "require('$state_dir/node_modules/s3rver/package.json').version")"
    fi
    if [[ "$installed" != "$S3RVER_VERSION" ]]; then
        command -v npm >/dev/null || { log "npm is required (install Node.js 18+ and npm)"; exit 1; }
        log "installing s3rver@$S3RVER_VERSION into $state_dir"
        npm install --prefix "$state_dir" --no-audit --no-fund --loglevel=error "s3rver@$S3RVER_VERSION" >&2
    fi
}

start() {
    mkdir -p "$state_dir"
    already_running "$endpoint_file" && return 0
    command -v node >/dev/null || { log "node is required (install Node.js 18+)"; exit 1; }
    install_s3rver
    local data_dir
    data_dir="$(mktemp -d "${TMPDIR:-/tmp}/stepcore-s3rver.XXXXXX")"
    echo "$data_dir" >"$data_dir_file"
    : >"$log_file"
    # Port 0: the kernel picks a free port; s3rver prints the one it bound.
    setsid nohup node "$s3rver_bin" --directory "$data_dir" --address 127.0.0.1 --port 0 \
        --configure-bucket "$bucket" >"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    local endpoint="" port=""
    for _ in $(seq 1 100); do
        if ! running_pid >/dev/null; then
            fail_with_log "$log_file" "s3rver exited during start-up"
            exit 1
        fi
        port="$(sed -n 's/.*S3rver listening on 127\.0\.0\.1:\([0-9][0-9]*\).*/\1/p' "$log_file" | head -n 1)"
        if [[ -n "$port" ]]; then
            endpoint="http://127.0.0.1:$port"
            if answers "$endpoint"; then
                break
            fi
        fi
        sleep 0.2
    done
    if [[ -z "$endpoint" ]] || ! answers "$endpoint"; then
        fail_with_log "$log_file" "s3rver did not answer within 20 s"
        stop
        exit 1
    fi
    echo "$endpoint" >"$endpoint_file"
    log "listening on $endpoint (pid $(cat "$pid_file"), bucket $bucket, data $data_dir)"
    echo "$endpoint"
}

stop() {
    stop_recorded_pid
    if [[ -f "$data_dir_file" ]]; then
        local data_dir
        data_dir="$(cat "$data_dir_file")"
        case "$data_dir" in
            */stepcore-s3rver.*) rm -rf "$data_dir" ;;
        esac
    fi
    rm -f "$pid_file" "$endpoint_file" "$data_dir_file"
}

status() { print_url_if_running "$endpoint_file"; }

commands="start stop status"
main "$@"
