#!/usr/bin/env bash
# Start a vLLM server in the background, guard its readiness, then warm it up.
#
#   ./start.sh [options] -- <server command and its arguments>
#
# The server runs in its own process group (setsid), its output in LOG_DIR/server.log.
# start.sh waits for GET /health = 200 within the start guard, then runs
# offload/launch/warmup_serve.sh. A failed warm-up is a WARN (exit 0: the server is
# up); a server that dies or misses the guard is an ERROR (exit 1, server stopped).
# Readiness alone never proves warm-up success: the records do. See README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
readonly WRAPPER="${HERE}/offload/launch/warmup_serve.sh"
readonly TAIL_LINES=20
readonly COMPILE_PATTERN='JIT compilation during inference|Compiling|autotun'

base_url="${START_BASE_URL:-http://127.0.0.1:8000}"
guard_s="${START_GUARD_S:-600}"
log_dir="${START_LOG_DIR:-./logs}"
ready_file="${START_READY_FILE:-}"
warmup="${START_WARMUP:-1}"
poll_s="${START_POLL_S:-1}"
stop_grace_s="${START_STOP_GRACE_S:-10}"
server_pid=""
child_pid=""

usage() {
  cat <<'EOF'
usage: start.sh [options] -- <server command and its arguments>

Start the server in the background (own process group, output to LOG_DIR/server.log),
wait for GET /health = 200 within the start guard, run the warm-up
(offload/launch/warmup_serve.sh), and report OK or WARN. The server keeps running.

options (environment variable in brackets):
  --base-url URL      where the server answers, passed to the warm-up
                      [START_BASE_URL, default http://127.0.0.1:8000]
  --start-guard-s N   seconds from launch for /health to answer 200 [START_GUARD_S, 600]
  --log-dir DIR       server.log, start.log, server.pid, warm-up records
                      [START_LOG_DIR, ./logs]
  --ready-file PATH   written only when the warm-up passed; removed at every start,
                      so `test -f PATH` gates traffic on a real warm-up [START_READY_FILE]
  --no-warmup         start and guard only [START_WARMUP=0]
  -h, --help          this text
  START_POLL_S (1) and START_STOP_GRACE_S (10: TERM, then KILL) tune the waits;
  WARMUP_* variables (WARMUP_HARD_S, WARMUP_MODEL, ...) reach the warm-up unchanged.

exit status: 0 server up (warm-up passed, failed with WARN, or skipped);
             1 server exited, missed the guard, or a live server.pid; 2 usage error;
             130/143 interrupted (the server was stopped).
EOF
}

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
  echo "${line}"
}

error() {
  log "ERROR: $*" >&2
}

is_number() {
  [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]
}

# The command line as it may be logged: values of key/token/secret/password flags hidden.
redacted_command() {
  local out=() hide=0 arg
  for arg in "$@"; do
    if ((hide)); then
      out+=("[redacted]")
      hide=0
    elif [[ "${arg}" =~ ^--?[A-Za-z0-9_-]*(key|token|secret|password)[A-Za-z0-9_-]*=(.*)$ ]]; then
      out+=("${arg%%=*}=[redacted]")
    elif [[ "${arg}" =~ ^--?[A-Za-z0-9_-]*(key|token|secret|password)[A-Za-z0-9_-]*$ ]]; then
      out+=("${arg}")
      hide=1
    else
      out+=("${arg}")
    fi
  done
  echo "${out[*]}"
}

# TERM the server's process group, then KILL it after the grace period.
stop_server() {
  [[ -n "${server_pid}" ]] || return 0
  kill -TERM -- "-${server_pid}" 2>/dev/null || return 0
  local waited=0
  while kill -0 -- "-${server_pid}" 2>/dev/null; do
    if ((waited >= stop_grace_s * 10)); then
      log "server group ${server_pid} still alive after ${stop_grace_s} s: KILL"
      kill -KILL -- "-${server_pid}" 2>/dev/null || true
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "${server_pid}" 2>/dev/null || true
  log "server process group ${server_pid} stopped"
}

on_signal() {
  local name="$1" code="$2"
  trap - TERM INT
  error "interrupted by ${name} while starting: stopping the server it launched"
  if [[ -n "${child_pid}" ]]; then
    kill -TERM "${child_pid}" 2>/dev/null || true
    wait "${child_pid}" 2>/dev/null || true
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

show_log_tail() {
  echo "---- last ${TAIL_LINES} lines of ${log_dir}/server.log ----" >&2
  tail -n "${TAIL_LINES}" "${log_dir}/server.log" >&2 || true
  echo "----" >&2
}

# GET /health once; 0 when it answers 200. Proxies are ignored: the server is local.
health_ok() {
  local timeout_s="$1"
  python3 - "${base_url%/}/health" "${timeout_s}" <<'PY' >/dev/null 2>&1
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(sys.argv[1], timeout=float(sys.argv[2])) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

parse_args() {
  while (($#)); do
    case "$1" in
      --base-url) (($# >= 2)) || die_usage "--base-url needs a URL"; base_url="$2"; shift 2 ;;
      --start-guard-s) (($# >= 2)) || die_usage "--start-guard-s needs seconds"; guard_s="$2"; shift 2 ;;
      --log-dir) (($# >= 2)) || die_usage "--log-dir needs a directory"; log_dir="$2"; shift 2 ;;
      --ready-file) (($# >= 2)) || die_usage "--ready-file needs a path"; ready_file="$2"; shift 2 ;;
      --no-warmup) warmup=0; shift ;;
      -h | --help) usage; exit 0 ;;
      --) shift; server_cmd=("$@"); return 0 ;;
      *) die_usage "unknown option '$1' (the server command goes after --)" ;;
    esac
  done
}

check_settings() {
  ((${#server_cmd[@]})) || die_usage "no server command: start.sh [options] -- vllm serve MODEL ..."
  [[ "${guard_s}" =~ ^[1-9][0-9]*$ ]] || die_usage "--start-guard-s must be a whole number of seconds > 0, got '${guard_s}'"
  is_number "${poll_s}" || die_usage "START_POLL_S must be a number of seconds, got '${poll_s}'"
  [[ "${stop_grace_s}" =~ ^[0-9]+$ ]] || die_usage "START_STOP_GRACE_S must be whole seconds, got '${stop_grace_s}'"
  [[ "${base_url}" =~ ^https?:// ]] || die_usage "--base-url must start with http:// or https://"
  command -v setsid >/dev/null || die_usage "setsid (util-linux) is required"
  mkdir -p "${log_dir}" || die_usage "cannot create --log-dir '${log_dir}'"
}

# Refuse a second server: a live pid in server.pid means one is (probably) running.
check_pid_file() {
  local pid_file="${log_dir}/server.pid" old
  [[ -f "${pid_file}" ]] || return 0
  old="$(tr -dc '0-9' <"${pid_file}")"
  if [[ -n "${old}" ]] && kill -0 "${old}" 2>/dev/null; then
    error "${pid_file} names pid ${old}, which is still alive: a server may already run here." \
      "Stop it (kill -TERM -- -${old}) or remove the file if that pid is not the server."
    exit 1
  fi
  log "stale ${pid_file} (pid ${old:-none} is gone): replacing it"
}

launch() {
  : >>"${log_dir}/server.log"
  setsid "${server_cmd[@]}" >>"${log_dir}/server.log" 2>&1 </dev/null &
  server_pid=$!
  echo "${server_pid}" >"${log_dir}/server.pid"
  log "launch pid ${server_pid}: $(redacted_command "${server_cmd[@]}")"
}

# Poll /health until 200; ERROR and exit when the server exits or the guard expires.
wait_ready() {
  local started=${SECONDS} left status
  while true; do
    if ! kill -0 "${server_pid}" 2>/dev/null; then
      status=0
      wait "${server_pid}" || status=$?
      server_pid=""
child_pid=""
      error "server exited with status ${status} after $((SECONDS - started)) s, before /health answered 200"
      show_log_tail
      exit 1
    fi
    left=$((guard_s - (SECONDS - started)))
    if ((left <= 0)); then
      error "server not ready: ${base_url%/}/health did not answer 200 within the ${guard_s} s start guard (is --base-url the server's address?)"
      show_log_tail
      stop_server
      exit 1
    fi
    if run_child health_ok "$((left < 5 ? left : 5))"; then
      log "ready after $((SECONDS - started)) s (${base_url%/}/health = 200)"
      return 0
    fi
    run_child sleep "${poll_s}"
  done
}

summary_verdict() {
  python3 - "$1" <<'PY' 2>/dev/null || echo "none"
import json, sys
verdict = "none"
with open(sys.argv[1], encoding="utf-8") as records:
    for line in records:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("record") == "summary":
            verdict = record.get("verdict", "none")
print(verdict)
PY
}

write_ready_file() {
  local records="$1" tmp
  tmp="$(mktemp "${ready_file}.XXXXXX")"
  printf 'warm-up passed %s\nrecords: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${records}" >"${tmp}"
  mv -f "${tmp}" "${ready_file}"
}

run_warmup() {
  local records offset status=0 started=${SECONDS} verdict compiles
  records="${log_dir}/warmup-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
  offset="$(stat -c %s "${log_dir}/server.log")"
  log "warm-up: ${WRAPPER} --base-url ${base_url} --records ${records}"
  run_child bash "${WRAPPER}" --base-url "${base_url}" --records "${records}" || status=$?
  verdict="$(summary_verdict "${records}")"
  # Kernels compiled while serving the warm-up are worth knowing about.
  compiles="$(tail -c "+$((offset + 1))" "${log_dir}/server.log" | grep -Eci "${COMPILE_PATTERN}" || true)"
  log "warm-up ended: exit ${status}, verdict ${verdict}, $((SECONDS - started)) s, ${compiles} compile lines in server.log during it"
  if ((status == 0)) && [[ "${verdict}" == "pass" ]]; then
    [[ -z "${ready_file}" ]] || write_ready_file "${records}"
    log "OK: warm-up passed (${compiles} compile lines during warm-up); records: ${records}"
  else
    log "WARN: warm-up failed (exit ${status}, verdict ${verdict}); records: ${records} — inspect before releasing HOLD (${compiles} compile lines during warm-up)"
  fi
}

main() {
  server_cmd=()
  parse_args "$@"
  check_settings
  if [[ -n "${ready_file}" ]]; then
    rm -f -- "${ready_file}"
  fi
  check_pid_file
  trap 'on_signal TERM 143' TERM
  trap 'on_signal INT 130' INT
  launch
  wait_ready
  if [[ "${warmup}" == "0" ]]; then
    log "warm-up skipped (--no-warmup); server pid ${server_pid} is up"
  else
    run_warmup
  fi
  trap - TERM INT
  log "exit 0: server pid ${server_pid} keeps running"
}

main "$@"
