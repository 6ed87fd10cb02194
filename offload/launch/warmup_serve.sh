#!/usr/bin/env bash
# Run the warm-up helper under a hard wall-clock bound (offload/launch/CONTRACT.md, section 6).
#
# The helper keeps its own deadline (90 s by default), but a trickling read or a
# stuck thread could outlive it; coreutils timeout makes the bound absolute: TERM
# at WARMUP_HARD_S (95 s by default), KILL 5 s later. The helper answers TERM by
# writing a 'killed' summary. Exit status: the helper's, or timeout's 124 / 137.
#
# Usage: warmup_serve.sh [warmup.py options...]   (see: warmup_serve.sh --help)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
readonly KILL_AFTER_S=5
child=""     # pid of timeout, once started
pending=""   # the signal (TERM, INT, HUP) that came before timeout started
forwarded="" # the signal forwarded to timeout, if any

# The helper's entry point; argv[1] is the folder that holds warmup.py and the modules
# it imports (the folder is one unit). prog makes --help and usage errors name the
# program the operator ran.
readonly RUN_HELPER='import sys; sys.path.insert(0, sys.argv.pop(1)); import warmup;
warmup.runframe.script_exit(warmup.main(prog="warmup_serve.sh"))'
readonly PUBLISH_REFUSAL='import sys; sys.path.insert(0, sys.argv.pop(1)); import warmup;
warmup.publish_refusal(sys.argv[2:], int(sys.argv[1]))'

die() {
  echo "warmup_serve.sh: $*" >&2
  exit 2
}

# A usage error found before the helper starts is still published to the textfile
# (--textfile or WARMUP_TEXTFILE), by whichever python3 there is, so that no stale
# success stays there; then exit 2.
# Arguments: the message, then the helper's arguments.
refuse() {
  local message="$1" python
  shift
  for python in "${WARMUP_PYTHON:-python3}" python3; do
    if runs_python "${python}"; then
      "${python}" -I -S -c "${PUBLISH_REFUSAL}" "${HERE}" 2 "$@" 2>/dev/null || true
      break
    fi
  done
  die "${message}"
}

# True when the command runs Python 3.10 or later (an interpreter that runs nothing,
# such as /bin/true, would make a run that never happened exit 0).
# Arguments: $1, the interpreter.
runs_python() {
  command -v "$1" >/dev/null &&
    [[ "$("$1" -I -S -c 'import sys; print(sys.version_info >= (3, 10))' 2>/dev/null)" \
      == "True" ]]
}

# Say how the helper ended when it did not end by itself: the bound's TERM (124) or KILL
# (137 once the bound and its grace have passed), or a signal from elsewhere (the OOM
# killer, an operator's kill -9) that timeout passes on as 128+N.
# Arguments: $1, the status; $2, the hard bound as given; $3, the bound (epoch seconds).
say_ending() {
  local now="${EPOCHSECONDS:-$(date +%s)}"
  if [[ "$1" == 124 ]]; then
    echo "warmup_serve.sh: warm-up ended by the hard bound (TERM at $2 s, exit 124)" >&2
  elif [[ "$1" == 137 ]] && ((now >= $3 + KILL_AFTER_S)); then
    echo "warmup_serve.sh: warm-up killed by the hard bound" \
      "(KILL at $2+${KILL_AFTER_S} s, exit 137)" >&2
  elif (($1 > 128 && $1 < 160)); then
    echo "warmup_serve.sh: warm-up killed by signal $(($1 - 128)) (not the hard bound;" \
      "exit $1)" >&2
  fi
}

# Forward a signal to the helper's timeout (which passes it on to the helper), or
# remember it until timeout runs. Ctrl-C stays an INT (the helper exits 130), a hangup
# a HUP (129): the helper writes its 'killed' summary either way.
# Globals: child (pid of timeout, or empty), pending (the signal, when no child yet),
# forwarded (set: the signal sent to timeout).
# Arguments: $1, the signal's name.
forward_signal() {
  if [[ -n "${child}" ]]; then
    forwarded="$1"
    kill -s "$1" "${child}" 2>/dev/null || true
  else
    pending="$1"
  fi
}

main() {
  local hard="${WARMUP_HARD_S:-95}"
  # A positive number of seconds: timeout treats 0 as "no bound at all".
  # At most a day (86400 s): the sum below stays an exact epoch time.
  # A leading zero is decimal (10#), never octal: 08 is 8 seconds.
  if ! [[ "${hard}" =~ ^[0-9]{1,5}([.][0-9]+)?$ ]] || [[ "${hard}" =~ ^0*([.]0*)?$ ]] ||
    ((10#${hard%%.*} > 86400)); then
    refuse "WARMUP_HARD_S must be a positive number of seconds, at most 86400, got '${hard}'" \
      "$@"
  fi
  command -v timeout >/dev/null || refuse "coreutils 'timeout' is required" "$@"
  local python="${WARMUP_PYTHON:-python3}"
  runs_python "${python}" ||
    refuse "'${python}' does not run Python 3.10 or later (set WARMUP_PYTHON)" "$@"

  # timeout runs in its own process group, so a TERM to this script does not reach
  # it: the trap forwards it (and timeout to the helper, which writes its 'killed'
  # summary). The trap is set BEFORE timeout starts: a TERM in between would end
  # this script and leave timeout running to the hard bound. A signal that comes
  # before the child exists is remembered and forwarded as soon as it does.
  local status=0 now
  trap 'forward_signal TERM' TERM
  trap 'forward_signal INT' INT
  trap 'forward_signal HUP' HUP
  # When the bound falls (epoch seconds, rounded down): a TERM from then on is the
  # bound's, and the helper records the 124 this script returns rather than 143.
  now="${EPOCHSECONDS:-$(date +%s)}"
  export WARMUP_HARD_BOUND_AT="$((now + 10#${hard%%.*}))"
  # The helper refuses a deadline at or past the bound (a usage error, exit 2).
  export WARMUP_HARD_S="${hard}"
  # The helper runs as an imported module, not as a script: a script is compiled
  # on every start, an imported module's bytecode is cached (in __pycache__ beside
  # it when that is writable; it still runs when it is not). -I keeps the caller's
  # environment (PYTHON*) and the current directory out, so a stray json.py where
  # the operator stands cannot shadow the standard library; -S skips site-packages,
  # which the helper (standard library only) does not need. `python3 warmup.py`
  # works as well.
  timeout --kill-after="${KILL_AFTER_S}s" "${hard}" "${python}" -I -S -c "${RUN_HELPER}" \
    "${HERE}" "$@" &
  child=$!
  if [[ -n "${pending}" ]]; then
    forward_signal "${pending}"
  fi
  wait "${child}" || status=$?
  while kill -0 "${child}" 2>/dev/null; do   # the wait was interrupted by a signal
    status=0
    wait "${child}" || status=$?
  done
  trap - TERM INT HUP
  # timeout runs the helper in its own process group (its pid). A signal that reached
  # timeout while it was still starting the helper can leave the helper behind it:
  # pass the signal to whatever of that group is left.
  if [[ -n "${forwarded}" ]]; then
    kill -s "${forwarded}" -- "-${child}" 2>/dev/null || true
  fi
  say_ending "${status}" "${hard}" "${WARMUP_HARD_BOUND_AT}"
  if [[ "${status}" == 137 ]]; then   # KILLed: the helper could write no summary
    "${python}" -I -S -c "${PUBLISH_REFUSAL}" "${HERE}" 137 "$@" 2>/dev/null || true
  fi
  return "${status}"
}

main "$@"
