#!/usr/bin/env bash
# Run the warm-up helper under a hard wall-clock bound (offload/launch/CONTRACT.md, section 6).
#
# The helper keeps its own deadline (90 s by default), but a trickling read, a stuck
# thread or a hung interpreter could outlive it; coreutils timeout makes the bound
# absolute: everything this script runs, its interpreter check too, ends by
# WARMUP_HARD_S (95 s by default), KILL 5 s later. The helper answers TERM by writing a
# 'killed' summary; an ending the helper could not publish, this script publishes
# (within PUBLISH_S). Exit status: the helper's, or timeout's 124 / 137.
#
# Usage: warmup_serve.sh [warmup.py options...]   (see: warmup_serve.sh --help)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
readonly KILL_AFTER_S=5 PUBLISH_S=2
child=""     # pid of timeout, once started
pending=""   # the signal (TERM, INT, HUP) that came before timeout started
forwarded="" # the signal forwarded to timeout, if any
bound_us=0   # when the hard bound falls (epoch microseconds)
began_us=0   # when this script began (epoch microseconds)

# The helper's entry point; argv[1] is the folder that holds warmup.py and the modules
# it imports (the folder is one unit). prog makes --help and usage errors name the
# program the operator ran. PUBLISH: an ending the helper did not publish (core/ending.py).
readonly RUN_HELPER='import sys; sys.path.insert(0, sys.argv.pop(1)); import warmup;
warmup.runframe.script_exit(warmup.main(prog="warmup_serve.sh"))'
readonly PUBLISH='import sys; sys.path.insert(0, sys.argv.pop(1)); import core.ending;
core.ending.publish_ending(sys.argv[5:], int(sys.argv[1]), int(sys.argv[2]) / 1e6,
                           int(sys.argv[3]) / 1e6, int(sys.argv[4]))'

# Publish an ending ($1: the exit status) the helper left unsaid, by python3 within
# PUBLISH_S (the helper's interpreter may be what hung), and say how the helper ended
# when it did not end by itself (the bound's TERM or KILL, a signal: core.ending.ending_said);
# then return. Arguments: the status, then the helper's arguments.
publish_ending() {
  local status="$1" said=""
  shift
  command -v python3 >/dev/null || return 0
  said="$(timeout --kill-after=1s "${PUBLISH_S}" python3 -I -S -c "${PUBLISH}" "${HERE}" \
    "${status}" "${began_us}" "${bound_us}" "${KILL_AFTER_S}" "$@" 2>/dev/null)" || true
  [[ -z "${said}" ]] || echo "warmup_serve.sh: ${said}" >&2
}

# End before the helper starts: the message, the ending published (no stale success
# stays; nothing said of the bound: bound_us 0), then exit with the status. Arguments:
# the status, the message, then the helper's arguments.
stop_early() {
  local status="$1" message="$2"
  shift 2
  echo "warmup_serve.sh: ${message}" >&2
  bound_us=0
  publish_ending "${status}" "$@"
  exit "${status}"
}

# A process's exit status, waited for even when a trapped signal interrupts the wait.
# Arguments: $1, the pid (a child of this shell).
wait_status() {
  local status=0
  wait "$1" || status=$?
  while kill -0 "$1" 2>/dev/null; do   # the wait was interrupted by a signal
    status=0
    wait "$1" || status=$?
  done
  return "${status}"
}

# Seconds (digits, maybe a fraction) as whole microseconds.
micros() {
  local whole="${1%%.*}" fraction=""
  [[ "$1" == *.* ]] && fraction="${1#*.}"
  fraction="${fraction}000000"
  echo "$((10#${whole:-0} * 1000000 + 10#${fraction:0:6}))"
}

# What is left of the hard bound, as timeout takes it (seconds); false when nothing is
# (timeout would read 0 as no bound at all).
left_s() {
  local left=$((bound_us - ${EPOCHREALTIME//[.,]/}))
  ((left > 0)) || return 1
  printf '%d.%06d' "$((left / 1000000))" "$((left % 1000000))"
}

# True when the command runs Python 3.10 or later within what is left of the bound (an
# interpreter that runs nothing, such as /bin/true, would make a run that never happened
# exit 0); 124/137 when it did not answer in time. Its answer is read with read -t, never
# to the end of its output: a child it left holding stdout cannot hold this script.
# Arguments: $1, the interpreter.
runs_python() {
  local said="" status=0 left out checker
  command -v "$1" >/dev/null || return 1
  left="$(left_s)" || return 124
  exec {out}< <(exec timeout --kill-after=1s "${left}" "$1" -I -S -c \
    'import sys; print(sys.version_info >= (3, 10))' 2>/dev/null)
  checker=$!
  read -r -t "${left}" said <&"${out}" || true
  exec {out}<&-
  wait_status "${checker}" || status=$?
  ((status == 124 || status == 137)) && return "${status}"
  [[ "${said}" == "True" ]]
}

# Forward a signal to the helper's timeout (which passes it on to the helper), or
# remember it until timeout runs. Ctrl-C stays an INT (exit 130), a hangup a HUP (129).
# Globals: child, pending, forwarded. Arguments: $1, the signal's name.
forward_signal() {
  if [[ -n "${child}" ]]; then
    forwarded="$1"
    kill -s "$1" "${child}" 2>/dev/null || true
  else
    pending="$1"
  fi
}

main() {
  local hard="${WARMUP_HARD_S:-95}" python="${WARMUP_PYTHON:-python3}" status=0
  began_us="${EPOCHREALTIME//[.,]/}" # in whole microseconds (the separator: . or ,)
  # The house's number grammar (core/cli.py NUMBER, a test feeds both the same values);
  # at least 1 s (timeout treats 0 as no bound; less runs nothing), at most a day; a
  # leading zero is decimal (10#), never octal: 08 is 8 seconds.
  if ! [[ "${hard}" =~ ^0*[0-9]{1,5}([.][0-9]+)?$ ]] || ((10#${hard%%.*} < 1)) ||
    ((10#${hard%%.*} > 86400)) || [[ "${hard}" =~ ^0*86400[.][0-9]*[1-9] ]]; then
    stop_early 2 "WARMUP_HARD_S: must be a number of seconds from 1 to 86400, got '${hard}'" "$@"
  fi
  command -v timeout >/dev/null || stop_early 2 "coreutils 'timeout' is required" "$@"
  bound_us=$((began_us + $(micros "${hard}")))
  # The trap is set BEFORE anything starts: a TERM before the helper exists is
  # remembered and forwarded as soon as it does (timeout runs in its own process group,
  # so only the trap reaches it).
  local signal
  # shellcheck disable=SC2064  # the signal's name is meant to be expanded now
  for signal in TERM INT HUP; do trap "forward_signal ${signal}" "${signal}"; done
  runs_python "${python}" || status=$?
  ((status != 124 && status != 137)) || stop_early 124 "'${python}' did not answer within \
the hard bound (${hard} s): a hung interpreter (a stuck mount, a broken site-packages?); \
nothing was sent" "$@"
  [[ -z "${pending}" ]] || stop_early "$((128 + $(kill -l "${pending}")))" \
    "${pending} received before the warm-up began; nothing was sent" "$@"
  ((status == 0)) || stop_early 2 "'${python}' does not run Python 3.10 or later (set WARMUP_PYTHON)" "$@"
  # The helper records the bound's TERM as 124 (rather than 143) from this time on.
  export WARMUP_HARD_BOUND_AT="$((bound_us / 1000000))" WARMUP_HARD_S="${hard}"
  # -I keeps PYTHON* variables and the current folder out, -S site-packages; imported,
  # the helper's bytecode is cached beside it when that is writable.
  local left
  left="$(left_s)" ||                 # the check took the whole bound
    stop_early 124 "the hard bound (${hard} s) passed before the warm-up began" "$@"
  timeout --kill-after="${KILL_AFTER_S}s" "${left}" "${python}" -I -S -c "${RUN_HELPER}" \
    "${HERE}" "$@" &
  child=$!
  [[ -z "${pending}" ]] || forward_signal "${pending}"
  wait_status "${child}" || status=$?
  trap - TERM INT HUP
  # A signal that reached timeout while it was still starting the helper can leave the
  # helper behind it (in timeout's process group): pass the signal on to what is left.
  [[ -z "${forwarded}" ]] || kill -s "${forwarded}" -- "-${child}" 2>/dev/null || true
  ((status == 0)) || publish_ending "${status}" "$@"
  return "${status}"
}

main "$@"
