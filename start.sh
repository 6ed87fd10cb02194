#!/usr/bin/env bash
# Start a vLLM server in the background, guard its readiness, then warm it up.
#
#   ./start.sh [options] -- <server command and its arguments>     (./start.sh --help)
#
# The server runs in its own process group, its output in LOG_DIR/server.log. start.sh
# refuses to start when something already answers at the base URL, waits for
# GET /health = 200 within the start guard, then runs offload/launch/warmup_serve.sh
# (and, with --gate, the quality gate). A failed warm-up is a WARN (exit 0: the server
# is up); a server that dies or misses the guard is an ERROR (exit 1, server stopped).
# With --supervise it stays the server's parent (a container's entry point).
# Readiness alone never proves warm-up success: the records do.
#
# The work is done by offload/launch/launcher.py (its --help is this script's); this
# file finds python3 and hands over, so a container's PID 1 is the launcher itself.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
readonly LAUNCHER="${HERE}/offload/launch/launcher.py"

# A missing piece is a usage error naming what to do (exit 2, nothing launched).
# Arguments: the message.
die_usage() {
  echo "start.sh: $*" >&2
  exit 2
}

main() {
  command -v python3 >/dev/null || die_usage "python3 (3.10 or newer) is required"
  [[ -f "${LAUNCHER}" ]] ||
    die_usage "${LAUNCHER} is missing: offload/launch/ is copied and rolled back as one" \
      "folder; restore the whole folder"
  # -I: no PYTHON* variable or user site changes how the launcher runs; -S: no site.
  exec python3 -I -S "${LAUNCHER}" "$@"
}

main "$@"
