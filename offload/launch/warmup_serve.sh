#!/usr/bin/env bash
# Run the warm-up helper under a hard wall-clock bound (SPEC section 6).
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

die() {
  echo "warmup_serve.sh: $*" >&2
  exit 2
}

main() {
  local hard="${WARMUP_HARD_S:-95}"
  # A positive number of seconds: timeout treats 0 as "no bound at all".
  if ! [[ "${hard}" =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ "${hard}" =~ ^0*([.]0*)?$ ]]; then
    die "WARMUP_HARD_S must be a positive number of seconds, got '${hard}'"
  fi
  command -v timeout >/dev/null || die "coreutils 'timeout' is required"
  local python="${WARMUP_PYTHON:-python3}"
  command -v "${python}" >/dev/null || die "'${python}' not found (set WARMUP_PYTHON)"

  # timeout runs in its own process group, so a TERM to this script is forwarded
  # to it (and from it to the helper, which writes its 'killed' summary).
  local status=0 child
  timeout --kill-after="${KILL_AFTER_S}s" "${hard}" "${python}" "${HERE}/warmup.py" "$@" &
  child=$!
  trap 'kill -TERM "${child}" 2>/dev/null || true' TERM INT
  wait "${child}" || status=$?
  while kill -0 "${child}" 2>/dev/null; do   # the wait was interrupted by a signal
    status=0
    wait "${child}" || status=$?
  done
  trap - TERM INT
  case "${status}" in
    124) echo "warmup_serve.sh: warm-up ended by the hard bound (TERM at ${hard} s, exit 124)" >&2 ;;
    137) echo "warmup_serve.sh: warm-up killed by the hard bound (KILL at ${hard}+${KILL_AFTER_S} s, exit 137)" >&2 ;;
  esac
  return "${status}"
}

main "$@"
