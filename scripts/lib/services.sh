# shellcheck shell=bash
# shellcheck disable=SC2154  # service_name, pid_file and commands are set by the sourcing script
# Shell functions shared by the throwaway test-server scripts (scripts/*-server.sh).
#
# Source it after setting `service_name` (the prefix of every message); the functions that use
# a pid file read it from `pid_file`. Everything meant for people goes to stderr, so a script's
# stdout stays the one line a caller captures (the server's URL).

log() { echo "$service_name: $*" >&2; }

die() {
    log "error: $*"
    exit 1
}

# Prints a TCP port on 127.0.0.1 that nothing listens on right now.
free_port() {
    local py
    py="$(command -v python3 || command -v python || true)"
    [[ -n "$py" ]] || die "python3 is needed to pick a free port"
    "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Prints the pid recorded in $pid_file when that process is still alive; fails otherwise.
running_pid() {
    [[ -f "$pid_file" ]] || return 1
    local pid
    pid="$(cat "$pid_file")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

# Stops the process recorded in $pid_file: SIGTERM, up to 5 s to exit, then SIGKILL.
stop_recorded_pid() {
    local pid
    if pid="$(running_pid)"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -9 "$pid" 2>/dev/null || true
        fi
        log "stopped (pid $pid)"
    else
        log "not running"
    fi
}

# Prints the URL saved in file $1 when the recorded process runs and `answers URL` succeeds;
# otherwise says so and fails. The calling script defines `answers`.
print_url_if_running() {
    if running_pid >/dev/null && [[ -f "$1" ]] && answers "$(cat "$1")"; then
        cat "$1"
    else
        log "not running"
        return 1
    fi
}

# Prints the URL saved in file $1 and returns 0 when the recorded server already answers there.
already_running() {
    local pid
    if pid="$(running_pid)" && [[ -f "$1" ]] && answers "$(cat "$1")"; then
        log "already running (pid $pid)"
        cat "$1"
        return 0
    fi
    return 1
}

# Shows the server's log ($1) on stderr after a start-up failure message ($2).
fail_with_log() {
    log "$2; its log ($1):"
    cat "$1" >&2
}

# Runs the function named by the script's first argument when it is one of the words in
# $commands (e.g. "start stop status"); prints the usage and exits 2 otherwise.
main() {
    local command
    for command in $commands; do
        if [[ "${1:-}" == "$command" ]]; then
            "$command"
            return
        fi
    done
    echo "usage: $0 ${commands// /|}" >&2
    exit 2
}
