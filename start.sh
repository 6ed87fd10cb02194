#!/usr/bin/env bash
# Start a vLLM server in the background, guard its readiness, then warm it up.
#
#   ./start.sh [options] -- <server command and its arguments>
#
# The server runs in its own process group (setsid), its output in LOG_DIR/server.log.
# start.sh refuses to start when something already answers at the base URL, waits for
# GET /health = 200 within the start guard, then runs offload/launch/warmup_serve.sh
# (and, with --gate, the quality gate). It tracks the server's process group, so a
# server that forks and exits is still followed. A failed warm-up is a WARN (exit 0:
# the server is up); a server that dies or misses the guard is an ERROR (exit 1,
# server stopped). Readiness alone never proves warm-up success: the records do.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
readonly LAUNCH_DIR="${HERE}/offload/launch"
readonly WRAPPER="${LAUNCH_DIR}/warmup_serve.sh"
readonly QUALIFY="${LAUNCH_DIR}/qualify.py"
readonly PROCS="${LAUNCH_DIR}/procs.py"
readonly TAIL_LINES=20
readonly COMPILE_PATTERN='JIT compilation during inference|Compiling|autotun'
readonly KILL_AFTER_S=5
readonly PROBE_TIMEOUT_S=2
readonly NO_ANSWER=3   # qualify.py health: no HTTP answer at all
# How vLLM 0.32 says its prefill chunk at start (the only place it does).
readonly CHUNK_LINES='Chunked prefill is enabled with max_num_batched_tokens=[0-9]{1,7}|'\
'max_num_scheduled_tokens is set to [0-9]{1,7}'


# Settings: environment first, then flags; made readonly once checked.
base_url="${START_BASE_URL:-http://127.0.0.1:8000}"
guard_s="${START_GUARD_S:-600}"
guard_source="START_GUARD_S"       # where a bad value came from: the variable or the flag
base_url_source="START_BASE_URL"
gate_hard_source="START_GATE_HARD_S"
log_dir="${START_LOG_DIR:-./logs}"
ready_file="${START_READY_FILE:-}"
textfile="${START_TEXTFILE:-}"
warmup="${START_WARMUP:-1}"
gate="${START_GATE:-0}"
supervise="${START_SUPERVISE:-0}"
gate_hard_s="${START_GATE_HARD_S:-180}"
poll_s="${START_POLL_S:-1}"
say_s="${START_SAY_S:-30}"
stop_grace_s="${START_STOP_GRACE_S:-10}"
server_cmd=()

# State.
display_url=""     # base_url without credentials: the only form that is ever shown
server_pid=""      # the launched pid, which is also its process group id (setsid)
server_status=""   # the launched pid's exit status, once it has exited
child_pid=""       # the foreground step (health probe, sleep, warm-up), for signals
launched_at=0      # SECONDS at launch
stop_asked=""      # SECONDS when a TERM/INT was passed on to a supervised server
log_offset=0       # server.log's size at launch: what came after is this start's

# The --help text, on stdout.
usage() {
  cat <<'EOF'
usage: start.sh [options] -- <server command and its arguments>

Start the server in the background (own process group, output to LOG_DIR/server.log),
wait for GET /health = 200 within the start guard, run the warm-up
(offload/launch/warmup_serve.sh), optionally the quality gate, and report OK or WARN.
The server keeps running. start.sh refuses to start when something already answers at
the base URL: it reports only on a server it launched and still sees running (its
process group: a server that forks and exits is still followed).

options (environment variable in brackets):
  --base-url URL      where the server answers, passed to the warm-up and the gate as
                      is (as WARMUP_BASE_URL, out of their command lines); user:pass@
                      in it is sent as Basic auth and never shown
                      [START_BASE_URL, default http://127.0.0.1:8000]
  --start-guard-s N   seconds from launch for /health to answer 200 [START_GUARD_S, 600]
  --log-dir DIR       server.log, start.log, server.pid, records [START_LOG_DIR, ./logs]
  --ready-file PATH   written only when the warm-up (and with --gate, the gate) passed;
                      removed at every start. It names the server it vouches for (its
                      process start, model): `qualify.py ready --ready-file PATH` says
                      whether it is still true (a readiness probe); its folder must
                      exist [START_READY_FILE]
  --textfile PATH     the warm-up and the gate also publish their result there for
                      monitoring (node_exporter's textfile collector, *.prom), as
                      WARMUP_TEXTFILE [START_TEXTFILE]
  --no-warmup         start and guard only [START_WARMUP=0]
  --gate              after a passing warm-up, run `qualify.py gate` [START_GATE=1]
  --gate-hard-s N     hard bound on the gate: TERM at N s, KILL 5 s later
                      [START_GATE_HARD_S, 180]
  --supervise         a container's entry point: after the warm-up stay the server's
                      parent, pass TERM and INT on to its process group (KILL after
                      START_STOP_GRACE_S), reap what it leaves, and exit with the
                      server's status when it ends [START_SUPERVISE=1]
  -h, --help          this text
  START_POLL_S (1), START_SAY_S (30: a "waiting" line while /health is not yet 200)
  and START_STOP_GRACE_S (10: TERM, then KILL) tune the waits;
  WARMUP_* variables (WARMUP_HARD_S, WARMUP_MODEL, ...) reach the warm-up and the gate
  unchanged, except WARMUP_BASE_URL, which start.sh sets to --base-url, and
  WARMUP_CHUNK_TOKENS, which it sets from the server command's --max-num-batched-tokens,
  else from the server log's "Chunked prefill is enabled with max_num_batched_tokens=N",
  when the variable is not set.

Read the records before releasing HOLD, after OK as after WARN.

exit status:
  0    server up: warm-up (and gate) passed, failed with a WARN, or skipped
  N    with --supervise: the server's own exit status once it ended
  1    server not started or not trustworthy: something already answered at the base
       URL, a live server.pid, the server exited (also during the warm-up), or it
       missed the start guard (its process group is stopped)
  2    usage error (bad option, --log-dir not writable, --ready-file folder missing);
       nothing was launched
  130  interrupted by INT (the server was stopped)
  143  interrupted by TERM (the server was stopped)
EOF
}

# A usage error: what is wrong, where to look; exits 2 (nothing has been launched).
# Arguments: the message.
die_usage() {
  echo "start.sh: $*" >&2
  echo "start.sh: see start.sh --help" >&2
  exit 2
}

# One timestamped line per step, to start.log and the terminal.
log() {
  local line
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) $*"
  echo "${line}" >>"${log_dir}/start.log"
  # A terminal that went away (| head -1, a full disk) must not end start.sh: the log
  # file has the line, and the server it launched must still be followed or stopped.
  echo "${line}" 2>/dev/null || true
}

# An ERROR line, timestamped in start.log and on stderr.
error() {
  log "ERROR: $*" >&2
}

# Returns: 0 when the argument is a non-negative decimal number.
is_number() {
  [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]
}

# The base URL as it may be shown (no user:password@), checked by the programs' own URL
# parser (qualify.py health --print-url), so start.sh and the warm-up accept the same URLs;
# the URL goes in the environment, out of any command line (ps shows those).
# Arguments: the URL. Outputs: the URL to show, or why it is not valid (exit 2).
url_without_credentials() {
  WARMUP_BASE_URL="$1" python3 -I -S "${QUALIFY}" health --print-url
}

# Whether a flag's value is a secret: --api-key, --hf-token, and any flag whose name
# ends in -key, -token, -secret or -password (also with _ ). --max-num-batched-tokens
# and --ssl-keyfile are not secrets.
# Arguments: the flag, without any =value. Returns: 0 when its value must be hidden.
is_secret_flag() {
  local name="${1,,}"
  [[ "${name}" =~ ^--?([a-z0-9_-]*[-_])?(key|token|secret|password)$ ]]
}

# The command line as it may be logged: the values of secret flags hidden (both
# `--api-key VALUE` and `--api-key=VALUE`), everything else shown as given.
# Arguments: the command and its arguments. Outputs: one line.
redacted_command() {
  local out=() hide=0 arg
  for arg in "$@"; do
    if ((hide)); then
      out+=("[redacted]")
      hide=0
    elif [[ "${arg}" == -*=* ]] && is_secret_flag "${arg%%=*}"; then
      out+=("${arg%%=*}=[redacted]")
    elif [[ "${arg}" == -* ]] && is_secret_flag "${arg}"; then
      out+=("${arg}")
      hide=1
    else
      out+=("${arg}")
    fi
  done
  echo "${out[*]}"
}

# The server's prefill chunk as vLLM logs it at start (CHUNK_LINES: "Chunked prefill is
# enabled with max_num_batched_tokens=N.", or with speculative decoding and no such flag
# "max_num_scheduled_tokens is set to N"), for a command line that does not say it; only
# what this start wrote (server.log is appended to). Globals: log_dir, log_offset.
# Outputs: N, or nothing.
chunk_tokens_logged() {
  tail -c "+$((log_offset + 1))" "${log_dir}/server.log" 2>/dev/null |
    grep -Eo "${CHUNK_LINES}" | tail -n 1 | grep -Eo '[0-9]+$' || true
}

# GET /health once (qualify.py health; the URL in the environment, out of ps).
# Globals: base_url. Arguments: timeout in seconds.
# Returns: 0 HTTP 200, 1 another HTTP answer, NO_ANSWER (3) no answer.
probe_health() {
  WARMUP_BASE_URL="${base_url}" python3 -I -S "${QUALIFY}" health --timeout-s "$1" \
    >/dev/null 2>&1
}

# Whether a process group has a live member; a zombie does not count (procs.py reads
# /proc). kill -0 first: a group nothing of which is left needs no Python.
# Arguments: the process group id. Returns: 0 when a non-zombie member exists.
group_alive() {
  kill -0 -- "-$1" 2>/dev/null || return 1
  python3 -I -S "${PROCS}" group "$1"
}

# Whether a process is alive: a zombie is not (procs.py).
# Arguments: the pid. Returns: 0 when it runs.
process_alive() {
  kill -0 "$1" 2>/dev/null || return 1
  python3 -I -S "${PROCS}" alive "$1"
}

# Whether the launched server still runs: the launched pid, or once it has exited, any
# process of its group (a server that forks and exits leaves its group running). The
# first time the launched pid is seen gone, keeps its status and says so when the
# group lives on. (Until the launched pid has called setsid its group is empty: the
# pid itself is checked first.) The launched pid is start.sh's own child, which bash
# reaps itself, so `kill -0` tells whether it runs; its group's other members may be
# zombies nobody reaps, so they are checked with procs.py.
# Globals: server_pid, server_status (set). Returns: 0 while the server runs.
server_alive() {
  if [[ -z "${server_status}" ]]; then
    kill -0 "${server_pid}" 2>/dev/null && return 0
    server_status=0
    wait "${server_pid}" 2>/dev/null || server_status=$?
    if group_alive "${server_pid}"; then
      log "launched pid ${server_pid} exited with status ${server_status} but its process" \
        "group is still running: the server daemonized; start.sh tracks process group" \
        "${server_pid}"
    fi
  fi
  group_alive "${server_pid}"
}

# ERROR for a server that is gone, with the end of its log; exits 1 (no ready file).
# Globals: server_pid, server_status. Arguments: when it was found gone.
die_server_gone() {
  local when="$1"
  if [[ -z "${server_status}" ]]; then
    server_status="unknown"
  fi
  local hint=""
  if [[ "${server_status}" == "0" ]]; then
    hint=" (a server that detaches into a new session cannot be followed: run it in the foreground)"
  fi
  error "server exited with status ${server_status} after $((SECONDS - launched_at)) s," \
    "${when}; nothing of its process group ${server_pid} is left${hint}"
  show_log_tail
  exit 1
}

# TERM the server's process group, then KILL it after the grace period.
stop_server() {
  [[ -n "${server_pid}" ]] || return 0
  kill -TERM -- "-${server_pid}" 2>/dev/null || return 0
  local started=${SECONDS}
  while group_alive "${server_pid}"; do
    if ((SECONDS - started >= stop_grace_s)); then
      log "server group ${server_pid} still alive after ${stop_grace_s} s: KILL"
      kill -KILL -- "-${server_pid}" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  # No `wait` here: start.sh exits next, and its exit hands any zombie to init (a
  # `wait` inside a trap handler has hung bash when the child was already collected).
  log "server process group ${server_pid} stopped"
}

# TERM/INT while starting: stop the current step, then the server; exit 143/130.
# Globals: child_pid, server_pid. Arguments: signal name, exit status.
on_signal() {
  local name="$1" code="$2"
  trap - TERM INT
  error "interrupted by ${name} while starting: stopping the server it launched"
  if [[ -n "${child_pid}" ]]; then
    kill -TERM "${child_pid}" 2>/dev/null || true
    # Bounded, and without `wait`: inside this handler a wait for a child bash had
    # already collected could block forever (seen about once in thirty runs).
    local started=${SECONDS}
    while ((SECONDS - started < 5)) && process_alive "${child_pid}"; do
      sleep 0.1
    done
  fi
  stop_server
  exit "${code}"
}

# Run a command in the background and wait for it: a trapped TERM/INT interrupts
# `wait` at once, where a foreground child would delay the trap until it ended.
run_child() {
  local status=0
  "$@" &
  child_pid=$!
  wait "${child_pid}" || status=$?
  child_pid=""
  return "${status}"
}

# The end of server.log on stderr, for an ERROR about the server.
show_log_tail() {
  echo "---- last ${TAIL_LINES} lines of ${log_dir}/server.log ----" >&2
  tail -n "${TAIL_LINES}" "${log_dir}/server.log" >&2 || true
  echo "----" >&2
}

# Fails with a usage error when an option has no value.
# Arguments: the remaining arguments, option first.
need_value() {
  (($# >= 2)) || die_usage "$1 needs a value"
}

# Globals: the settings (set). Arguments: start.sh's arguments.
parse_args() {
  while (($#)); do
    case "$1" in
      --base-url)
        need_value "$@"
        base_url="$2"
        base_url_source="--base-url"
        shift 2
        ;;
      --start-guard-s)
        need_value "$@"
        guard_s="$2"
        guard_source="--start-guard-s"
        shift 2
        ;;
      --log-dir)
        need_value "$@"
        log_dir="$2"
        shift 2
        ;;
      --ready-file)
        need_value "$@"
        ready_file="$2"
        shift 2
        ;;
      --textfile)
        need_value "$@"
        textfile="$2"
        shift 2
        ;;
      --no-warmup)
        warmup=0
        shift
        ;;
      --supervise)
        supervise=1
        shift
        ;;
      --gate)
        gate=1
        shift
        ;;
      --gate-hard-s)
        need_value "$@"
        gate_hard_s="$2"
        gate_hard_source="--gate-hard-s"
        shift 2
        ;;
      -h | --help)
        usage
        exit 0
        ;;
      --)
        shift
        server_cmd=("$@")
        return 0
        ;;
      *)
        die_usage "unknown option '$1' (the server command goes after --)"
        ;;
    esac
  done
}

# The log folder exists (or is created), start.log can be written there, and so can
# server.log when it is already there (the start log proves the folder takes files).
check_log_dir() {
  mkdir -p -- "${log_dir}" 2>/dev/null ||
    die_usage "cannot create --log-dir '${log_dir}'; choose a writable folder"
  { : >>"${log_dir}/start.log"; } 2>/dev/null ||
    die_usage "cannot write start.log in --log-dir '${log_dir}'; choose a writable folder"
  [[ ! -e "${log_dir}/server.log" || -w "${log_dir}/server.log" ]] ||
    die_usage "cannot write server.log in --log-dir '${log_dir}'; choose a writable folder"
}

# The ready file can be written where it goes: its folder exists and takes a file.
check_ready_file() {
  local folder probe
  folder="$(dirname -- "${ready_file}")"
  [[ -d "${folder}" ]] ||
    die_usage "--ready-file '${ready_file}': folder '${folder}' does not exist; create it first"
  [[ ! -d "${ready_file}" ]] || die_usage "--ready-file '${ready_file}' is a folder"
  # Only a regular file is ever removed or replaced: never a device, FIFO or link.
  if [[ -L "${ready_file}" || -e "${ready_file}" && ! -f "${ready_file}" ]]; then
    die_usage "--ready-file '${ready_file}' is not a regular file (a device, FIFO or link)"
  fi
  probe="$(mktemp "${ready_file}.XXXXXX" 2>/dev/null)" ||
    die_usage "--ready-file '${ready_file}': cannot write in folder '${folder}'"
  rm -f -- "${probe}"
}

# Validates every setting before anything is launched, then makes them readonly.
check_settings() {
  ((${#server_cmd[@]})) || die_usage "no server command: start.sh [options] -- vllm serve MODEL ..."
  # Whole numbers in decimal, bounded: bash arithmetic reads 08 as octal and overflows
  # past 2^63.
  [[ "${guard_s}" =~ ^[1-9][0-9]{0,6}$ ]] ||
    die_usage "${guard_source} must be a whole number of seconds from 1 to 9999999," \
      "got '${guard_s}'"
  is_number "${poll_s}" || die_usage "START_POLL_S must be a number of seconds, got '${poll_s}'"
  [[ "${say_s}" =~ ^[1-9][0-9]{0,5}$ ]] ||
    die_usage "START_SAY_S must be whole seconds from 1 to 999999, got '${say_s}'"
  [[ "${stop_grace_s}" =~ ^(0|[1-9][0-9]{0,4})$ ]] ||
    die_usage "START_STOP_GRACE_S must be whole seconds from 0 to 99999, got '${stop_grace_s}'"
  [[ "${warmup}" =~ ^[01]$ ]] || die_usage "START_WARMUP must be 0 or 1, got '${warmup}'"
  [[ "${gate}" =~ ^[01]$ ]] || die_usage "START_GATE must be 0 or 1, got '${gate}'"
  [[ "${supervise}" =~ ^[01]$ ]] || die_usage "START_SUPERVISE must be 0 or 1, got '${supervise}'"
  if ! is_number "${gate_hard_s}" || [[ "${gate_hard_s}" =~ ^0*([.]0*)?$ ]]; then
    die_usage "${gate_hard_source} must be a positive number of seconds, got '${gate_hard_s}'"
  fi
  [[ "${base_url}" =~ ^https?:// ]] ||
    die_usage "${base_url_source} must start with http:// or https://"
  command -v setsid >/dev/null || die_usage "setsid (util-linux) is required"
  check_log_dir
  if [[ -n "${ready_file}" ]]; then
    check_ready_file
  fi
  if [[ -n "${textfile}" && ! -d "$(dirname -- "${textfile}")" ]]; then
    die_usage "--textfile '${textfile}': its folder does not exist; create it first"
  fi
  if [[ -n "${textfile}" && ( -L "${textfile}" || -e "${textfile}" && ! -f "${textfile}" ) ]]; then
    die_usage "--textfile '${textfile}' is not a regular file (a device, FIFO or link)"
  fi
  display_url="$(url_without_credentials "${base_url%/}" 2>&1)" ||
    die_usage "${display_url}"
  check_address
  readonly base_url guard_s log_dir ready_file textfile warmup gate gate_hard_s poll_s say_s
  readonly supervise
  readonly stop_grace_s
  readonly display_url server_cmd
}

# The value of a server flag (--port N or --port=N); the last one counts.
# Arguments: the flag, then the server command. Outputs: the value, or nothing.
flag_value() {
  local flag="$1" arg take=0 value=""
  shift
  for arg in "$@"; do
    if ((take)); then
      value="${arg}"
      take=0
    fi
    case "${arg}" in
      "${flag}="*) value="${arg#*=}" ;;
      "${flag}") take=1 ;;
    esac
  done
  echo "${value}"
}

# The base URL and the server command's --port / --host must name one address: a
# mismatch would only show as a start guard running out. Globals: display_url,
# server_cmd. Exits 2 on a mismatch.
check_address() {
  local rest host port want_port want_host
  rest="${display_url#*://}"
  rest="${rest%%/*}"
  if [[ "${rest}" =~ ^(.*):([0-9]+)$ ]]; then
    host="${BASH_REMATCH[1]}"
    port="${BASH_REMATCH[2]}"
  else
    host="${rest}"
    port=$([[ "${display_url}" == https://* ]] && echo 443 || echo 80)
  fi
  want_port="$(flag_value --port "${server_cmd[@]}")"
  want_host="$(flag_value --host "${server_cmd[@]}")"
  if [[ -n "${want_port}" && "${want_port}" != "${port}" ]]; then
    die_usage "--base-url ${display_url} names port ${port}, the server command --port" \
      "${want_port}: make them one address"
  fi
  case "${want_host}:${host}" in
    :* | 0.0.0.0:* | "[::]":* | "${host}:${host}") ;;   # ":*" holds no host and "::"
    127.0.0.1:localhost | localhost:127.0.0.1) ;;
    *)
      die_usage "--base-url ${display_url} names host ${host}, the server command --host" \
        "${want_host}: make them one address"
      ;;
  esac
}

# Refuse a second server: a live pid (or process group) in server.pid means one is
# (probably) running.
check_pid_file() {
  local pid_file="${log_dir}/server.pid" old
  [[ -f "${pid_file}" ]] || return 0
  old="$(tr -dc '0-9' <"${pid_file}")"
  if [[ -n "${old}" ]] && { process_alive "${old}" || group_alive "${old}"; }; then
    error "${pid_file} names pid ${old}, which is still alive: a server may already run here." \
      "Stop it (kill -TERM -- -${old}) or remove the file if that pid is not the server."
    exit 1
  fi
  log "stale ${pid_file} (pid ${old:-none} is gone): replacing it"
}

# start.sh reports only on a server it starts: refuse when /health already answers.
check_nothing_answers() {
  local status=0
  probe_health "${PROBE_TIMEOUT_S}" || status=$?
  if ((status != NO_ANSWER)); then
    error "something already answers at ${display_url}/health before launch: start.sh" \
      "reports only on a server it starts. Stop that server, or choose another --base-url."
    exit 1
  fi
}

# Start the server command in its own session and process group (setsid), its output
# appended to server.log. Globals: server_pid, launched_at (set).
launch() {
  log_offset="$(stat -c %s "${log_dir}/server.log" 2>/dev/null || echo 0)"
  setsid "${server_cmd[@]}" >>"${log_dir}/server.log" 2>&1 </dev/null &
  server_pid=$!
  launched_at=${SECONDS}
  echo "${server_pid}" >"${log_dir}/server.pid"
  log "launch pid ${server_pid} (process group ${server_pid}):" \
    "$(redacted_command "${server_cmd[@]}")"
}

# A TERM or INT while supervising: passed on to the server's process group.
# Globals: server_pid, stop_asked (set). Arguments: the signal's name.
pass_on() {
  log "${1} received: passed on to server process group ${server_pid}"
  kill -s "$1" -- "-${server_pid}" 2>/dev/null || true
  stop_asked="${stop_asked:-${SECONDS}}"
}

# --supervise: stay the server's parent until it ends (a container's entry point), then
# exit with its status. Signals go to its group; a group still alive START_STOP_GRACE_S
# after one is KILLed. Bash reaps every child, so orphans handed to a PID 1 start.sh are
# reaped too. Globals: server_pid, server_status, stop_asked, stop_grace_s.
supervise_server() {
  trap 'pass_on TERM' TERM
  trap 'pass_on INT' INT
  log "supervising server process group ${server_pid} (--supervise): TERM and INT go to" \
    "it; start.sh ends with the server's status"
  while server_alive; do
    if [[ -n "${stop_asked}" ]] && ((SECONDS - stop_asked >= stop_grace_s)); then
      log "server group ${server_pid} still alive ${stop_grace_s} s after the signal: KILL"
      kill -KILL -- "-${server_pid}" 2>/dev/null || true
    fi
    if [[ -z "${server_status}" && -z "${stop_asked}" ]]; then
      wait "${server_pid}" 2>/dev/null || true   # returns at once when a signal comes
    else
      sleep 0.2 & wait "$!" 2>/dev/null || true
    fi
  done
  trap - TERM INT
  log "server ended with status ${server_status:-unknown}: start.sh exits with it"
  exit "${server_status:-1}"
}

# Poll /health until 200; ERROR and exit when the server is gone or the guard expires.
wait_ready() {
  local left said=${SECONDS}
  while true; do
    server_alive || die_server_gone "before ${display_url}/health answered 200"
    left=$((guard_s - (SECONDS - launched_at)))
    if ((SECONDS - said >= say_s)); then
      said=${SECONDS}
      log "waiting for ${display_url}/health: $((SECONDS - launched_at)) s of the" \
        "${guard_s} s start guard; server process group ${server_pid} is running"
    fi
    if ((left <= 0)); then
      error "server not ready: ${display_url}/health did not answer 200 within the" \
        "${guard_s} s start guard (is --base-url the server's address?)"
      show_log_tail
      stop_server
      exit 1
    fi
    if run_child probe_health "$((left < 5 ? left : 5))"; then
      server_alive || die_server_gone "when ${display_url}/health answered 200 (that answer" \
        "came from another process)"
      log "ready after $((SECONDS - launched_at)) s (${display_url}/health = 200)"
      return 0
    fi
    run_child sleep "${poll_s}"
  done
}

# Read what start.sh needs from a records file, judged by qualify.py report (a pass
# needs complete evidence and the contract's plan). Globals: run_verdict ("pass",
# "custom", "fail", "refused", "killed", "incomplete" or "none"), cache_check ("made",
# "not_made", "hit" or "-"), differences (how a custom plan differs) are set.
# Arguments: the records file.
read_run() {
  run_verdict="none"
  cache_check="-"
  differences="-"
  read -r run_verdict cache_check differences < <(python3 -I -S "${QUALIFY}" report "$1" \
    --fields verdict,cache_check,differences 2>/dev/null) || true
  run_verdict="${run_verdict:-none}"
  differences="${differences//_/ }"
}

# Globals: warmup_records, warmup_status, run_verdict, cache_check, differences, compiles
# (set).
run_warmup() {
  local offset started=${SECONDS}
  warmup_records="${log_dir}/warmup-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
  warmup_status=0
  offset="$(stat -c %s "${log_dir}/server.log")"
  log "warm-up: ${WRAPPER} --records ${warmup_records} (WARMUP_BASE_URL ${display_url})"
  # The URL goes in the environment: a command line is visible to every user (ps).
  WARMUP_BASE_URL="${base_url}" run_child bash "${WRAPPER}" --records "${warmup_records}" ||
    warmup_status=$?
  read_run "${warmup_records}"
  # Kernels compiled while serving the warm-up are worth knowing about.
  compiles="$(tail -c "+$((offset + 1))" "${log_dir}/server.log" |
    grep -Eci "${COMPILE_PATTERN}" || true)"
  log "warm-up ended: exit ${warmup_status}, verdict ${run_verdict}, $((SECONDS - started)) s," \
    "${compiles} compile lines in server.log during it"
}

# The quality gate under a hard bound, then what its records show (qualify.py report).
# Like the warm-up, it gets the base URL in WARMUP_BASE_URL: a command line is visible to
# every user (ps), and the URL may hold credentials.
# Globals: gate_records, gate_status, gate_verdict, gate_alone, gate_batched, gate_cer (set).
run_gate() {
  local started=${SECONDS}
  gate_records="${log_dir}/gate-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
  gate_status=0
  log "gate: ${QUALIFY} gate --records ${gate_records} (WARMUP_BASE_URL ${display_url})" \
    "(hard bound ${gate_hard_s} s)"
  WARMUP_BASE_URL="${base_url}" run_child timeout --kill-after="${KILL_AFTER_S}s" \
    "${gate_hard_s}" python3 "${QUALIFY}" gate --records "${gate_records}" || gate_status=$?
  gate_verdict="none"
  gate_alone="?"
  gate_batched="?"
  gate_cer="n/a"
  read -r gate_verdict gate_alone gate_batched gate_cer < <(python3 -I -S "${QUALIFY}" report \
    "${gate_records}" --fields verdict,identifiers_alone,identifiers_batched,worst_cer \
    2>/dev/null) || true
  gate_verdict="${gate_verdict:-none}"
  log "gate ended: exit ${gate_status}, verdict ${gate_verdict}, $((SECONDS - started)) s"
}

# The ready file, written atomically by qualify.py ready --write from the records that
# show the pass: the server it vouches for (URL, process start, model, engines, version),
# the run, its time and records. Globals: ready_file, warmup_records.
# Arguments: the gate's records, when the gate ran.
write_ready_file() {
  local gate_args=()
  if [[ -n "${1:-}" ]]; then
    gate_args=(--gate-records "$1")
  fi
  if python3 -I -S "${QUALIFY}" ready --write --ready-file "${ready_file}" \
    --records "${warmup_records}" "${gate_args[@]}" >/dev/null; then
    log "ready file ${ready_file} written: it names the server it vouches for;" \
      "\`qualify.py ready --ready-file ${ready_file}\` says while it stays true"
  else
    log "WARN: the ready file ${ready_file} was not written (see above)"
  fi
}

# Identifiers and worst CER as the OK line shows them.
# Globals: gate_alone, gate_batched, gate_cer.
gate_figures() {
  if [[ "${gate_alone}" == "${gate_batched}" ]]; then
    echo "identifiers ${gate_alone} alone and batched, worst CER ${gate_cer}"
  else
    echo "identifiers ${gate_alone} alone, ${gate_batched} batched, worst CER ${gate_cer}"
  fi
}

# Warm-up (and gate), then OK or WARN; the server must still run after them.
warm_up_and_report() {
  local notes records
  run_warmup
  notes="${compiles} compile lines during warm-up"
  if [[ "${cache_check}" == "not_made" ]]; then
    notes+="; B1 cache check not made: the server does not report cached tokens"
  fi
  if ((warmup_status == 0)) && [[ "${run_verdict}" == "custom" ]]; then
    log "WARN: warm-up passed a custom plan, not the contract's (${differences//;/; });" \
      "no ready file; records: ${warmup_records} — inspect before releasing HOLD (${notes})"
    return 0
  fi
  if ((warmup_status != 0)) || [[ "${run_verdict}" != "pass" ]]; then
    server_alive || die_server_gone "during the warm-up"
    log "WARN: warm-up failed (exit ${warmup_status}, verdict ${run_verdict}); records:" \
      "${warmup_records} — inspect before releasing HOLD (${notes})"
    return 0
  fi
  if ((gate)); then
    run_gate
    server_alive || die_server_gone "during the warm-up and gate"
    records="${warmup_records} and ${gate_records}"
    if ((gate_status != 0)) || [[ "${gate_verdict}" != "pass" ]]; then
      log "WARN: warm-up passed, gate failed (exit ${gate_status}, verdict ${gate_verdict};" \
        "$(gate_figures)); records: ${records} — inspect before releasing HOLD (${notes})"
      return 0
    fi
    [[ -z "${ready_file}" ]] || write_ready_file "${gate_records}"
    log "OK: warm-up passed, gate passed ($(gate_figures)); records: ${records} — read them" \
      "before releasing HOLD (${notes})"
    return 0
  fi
  server_alive || die_server_gone "during the warm-up"
  [[ -z "${ready_file}" ]] || write_ready_file
  log "OK: warm-up passed; records: ${warmup_records} — read them before releasing HOLD" \
    "(${notes})"
}

# Arguments: start.sh's arguments.
main() {
  # A write to a terminal that went away fails (log() carries on) instead of killing
  # start.sh; a handler, not an ignore, so the server's own SIGPIPE stays the default.
  trap ':' PIPE
  parse_args "$@"
  check_settings
  if [[ -n "${ready_file}" ]]; then
    rm -f -- "${ready_file}"
  fi
  if [[ -n "${textfile}" ]]; then
    export WARMUP_TEXTFILE="${textfile}"
  fi
  local chunk
  chunk="$(flag_value --max-num-batched-tokens "${server_cmd[@]}")"   # the last one counts
  if [[ -z "${WARMUP_CHUNK_TOKENS:-}" && -n "${chunk}" ]]; then
    export WARMUP_CHUNK_TOKENS="${chunk}"   # B1 must be longer than the server's chunk
  fi
  check_pid_file
  check_nothing_answers
  trap 'on_signal TERM 143' TERM
  trap 'on_signal INT 130' INT
  launch
  wait_ready
  if [[ -z "${WARMUP_CHUNK_TOKENS:-}" ]]; then
    chunk="$(chunk_tokens_logged)"
    if [[ -n "${chunk}" ]]; then
      export WARMUP_CHUNK_TOKENS="${chunk}"   # B1 must be longer than the server's chunk
      log "prefill chunk ${chunk} tokens (from server.log): B1 is sized past it"
    fi
  fi
  if [[ "${warmup}" == "0" ]]; then
    log "warm-up skipped (--no-warmup); server process group ${server_pid} is up"
  else
    warm_up_and_report
  fi
  if [[ "${supervise}" == "0" ]]; then
    trap - TERM INT
  fi
  if [[ -n "${textfile}" && "${warmup}" == "1" ]]; then
    log "results published for monitoring in ${textfile}"
  fi
  if [[ "${supervise}" == "1" ]]; then
    supervise_server
  fi
  log "exit 0: server process group ${server_pid} keeps running"
}

# Sourcing start.sh (the tests do) defines its functions without running it.
if [[ "${BASH_SOURCE[0]}" == "${0}" ]]; then
  main "$@"
fi
