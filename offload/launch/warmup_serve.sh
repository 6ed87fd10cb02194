#!/usr/bin/env bash
# Run the warm-up helper under a hard wall-clock bound (offload/launch/CONTRACT.md, section 6):
# coreutils timeout ends its interpreter at WARMUP_HARD_S (95 s), KILL 5 s later, whatever
# hangs; an ending the helper could not publish, this script publishes. Exit status: the
# helper's, or timeout's 124 / 137. Usage: warmup_serve.sh [warmup.py options...]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE KILL_AFTER_S=5 PUBLISH_S=2
child=""     # pid of timeout, once started
pending=""   # the signal (TERM, INT, HUP) that came before timeout started
forwarded="" # the signal forwarded to timeout, if any
began_us=0 bound_us=0 # when this script began, and when the bound falls (epoch µs)
ran=""       # the file the helper's interpreter removes first (proof that it ran)

# The helper: Python 3.10+ removes the file argv[1] first (/bin/true, which runs nothing,
# would exit 0; a removal needs no space), argv[2] is the folder (one unit).
readonly RUN_HELPER='import os, sys
if sys.version_info < (3, 10): sys.exit(2)
os.unlink(sys.argv.pop(1)); sys.path.insert(0, sys.argv.pop(1))
try: import warmup
except (ImportError, SyntaxError) as e: print("warmup_serve.sh: cannot load", getattr(e, "name", None) or e, "(offload/launch/ is copied and rolled back as one folder: restore it whole)", file=sys.stderr); sys.exit(2)
except KeyboardInterrupt: sys.exit(130)
warmup.runframe.script_exit(warmup.main(prog="warmup_serve.sh"))'
readonly PUBLISH='import sys; sys.path.insert(0, sys.argv.pop(1)); import core.ending;
core.ending.publish_ending(sys.argv[5:], int(sys.argv[1]), int(sys.argv[2]) / 1e6,
                           int(sys.argv[3]) / 1e6, int(sys.argv[4]))'

# Publish an ending the helper left unsaid (by python3: the helper's may hang), and say how
# it ended when not by itself. Arguments: the status, then the helper's arguments.
publish_ending() {
  local status="$1" said=""
  shift
  command -v python3 >/dev/null || return 0
  said="$(timeout --kill-after=1s "${PUBLISH_S}" python3 -I -S -c "${PUBLISH}" "${HERE}" \
    "${status}" "${began_us}" "${bound_us}" "${KILL_AFTER_S}" "$@" 2>/dev/null)" || true
  [[ -z "${said}" ]] || echo "warmup_serve.sh: ${said}" >&2
}

# Say why the warm-up did not run, publish it, exit. Arguments: status, message, helper's.
stop_early() {
  local status="$1" message="$2"
  shift 2
  echo "warmup_serve.sh: ${message}" >&2
  bound_us=0                          # nothing said of the bound
  publish_ending "${status}" "$@"
  exit "${status}"
}

# A child's ($1) exit status, waited for even when a signal interrupts the wait.
wait_status() {
  local status=0
  wait "$1" 2>/dev/null || status=$?  # bash's own "Killed" job line is not for operators
  while kill -0 "$1" 2>/dev/null; do
    status=0
    wait "$1" 2>/dev/null || status=$?
  done
  return "${status}"
}

# Forward a signal ($1) to timeout, or keep it until timeout runs: INT stays INT (130).
forward_signal() {
  if [[ -n "${child}" ]]; then
    forwarded="$1"
    kill -s "$1" "${child}" 2>/dev/null || true
  else
    pending="$1"
  fi
}

main() {
  local hard="${WARMUP_HARD_S:-95}" python="${WARMUP_PYTHON:-python3}" status=0 signal
  began_us="${EPOCHREALTIME//[.,]/}" # whole microseconds (the locale's separator: . or ,)
  # core/cli.py's NUMBER (a test feeds both the same values), 1 s to a day; 08 is decimal.
  if ! [[ "${hard}" =~ ^0*[0-9]{1,5}([.][0-9]+)?$ ]] || ((10#${hard%%.*} < 1)) ||
    ((10#${hard%%.*} > 86400)) || [[ "${hard}" =~ ^0*86400[.][0-9]*[1-9] ]]; then
    stop_early 2 "WARMUP_HARD_S: must be a number of seconds from 1 to 86400, got '${hard}'" "$@"
  fi
  command -v timeout >/dev/null || stop_early 2 "coreutils 'timeout' is required" "$@"
  command -v "${python}" >/dev/null || stop_early 2 "'${python}' does not run Python 3.10 \
or later (set WARMUP_PYTHON)" "$@"
  local fraction="000000" && [[ "${hard}" == *.* ]] && fraction="${hard#*.}000000"
  bound_us=$((began_us + 10#${hard%%.*} * 1000000 + 10#${fraction:0:6}))
  # Set first: a TERM before the helper exists is forwarded once it does (SC2064: meant).
  # shellcheck disable=SC2064
  for signal in TERM INT HUP; do trap "forward_signal ${signal}" "${signal}"; done
  ran="$(mktemp)" || stop_early 2 "cannot create a temporary file in ${TMPDIR:-/tmp}" "$@"
  trap 'rm -f "${ran}"' EXIT
  # The helper records the bound's TERM as 124 from then on; -I -S: no PYTHON*, no site.
  export WARMUP_HARD_BOUND_AT="$((bound_us / 1000000))" WARMUP_HARD_S="${hard}"
  [[ -z "${pending}" ]] || stop_early "$((128 + $(kill -l "${pending}")))" \
    "${pending} received before the warm-up began; nothing was sent" "$@"
  timeout --kill-after="${KILL_AFTER_S}s" "${hard}" "${python}" -I -S -c "${RUN_HELPER}" \
    "${ran}" "${HERE}" "$@" &
  child=$!
  [[ -z "${pending}" ]] || forward_signal "${pending}"
  wait_status "${child}" || status=$?
  trap - TERM INT HUP
  [[ -z "${forwarded}" ]] || kill -s "${forwarded}" -- "-${child}" 2>/dev/null || true  # leftovers
  if [[ -e "${ran}" && -z "${forwarded}" ]] && ((status == 124 || status == 137)); then
    echo "warmup_serve.sh: '${python}' did not answer within the hard bound (${hard} s): a \
hung interpreter (a stuck mount, a broken site-packages?); nothing was sent" >&2
  elif [[ -e "${ran}" ]] && ((status < 129 || status > 159)); then
    stop_early 2 "'${python}' does not run Python 3.10 or later (set WARMUP_PYTHON)" "$@"
  fi
  ((status == 0)) || publish_ending "${status}" "$@"
  return "${status}"
}

main "$@"
