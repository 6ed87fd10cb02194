"""qualify.py health and ready: is the server answering, and is the ready file still true?

  health_main()        one bounded GET /health (the check the launcher polls)
  ready_main()         read_ready_file() -> check_ready(): one /health and one /metrics,
                       check_identity() (pure: the ready file against what /metrics says)
  slept()              some engine says it sleeps (the launcher's owner watches it too)

What a Kubernetes exec readiness probe runs every few seconds: over core's transport, cli,
files, vllm_metrics and readyfile and tools/procfs only (qualify.py loads a command's
module when that command runs). The ready file itself is core/readyfile.py's.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.parse

from core.cli import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, emit, seconds
from core.readyfile import (iso_time, read_ready_file, served_counts, sha256_type, take_away,
                            unmet)
from core.files import open_regular
from core.sanitize import MODEL_CHARS, clean_text, finite_number
from core.transport import (DEFAULT_BASE_URL, Clock, TransportError, UsageError, base_url_from,
                            fetch, parse_base_url)
from core.vllm_metrics import (SLEEP_GAUGE, asleep_problem, process_start, read_exposition,
                               served_by_engine, sleep_states)
from tools.procfs import not_held_by, port_owners

PROG = "qualify.py"


def served_models(samples: list) -> set[str]:
    """The model names on vllm:* series (their model_name label)."""
    return {labels["model_name"] for name, labels, _ in samples
            if name.startswith("vllm:") and isinstance(labels.get("model_name"), str)}


# health: one GET /health, bounded (what the launcher polls while the server starts).

EXIT_NO_ANSWER = 3                    # health: no HTTP answer at all


def basic_auth(target) -> dict:
    """user:password in the URL as a Basic auth header (a proxy in front may want them);
    never shown. {} without credentials."""
    if not target.credentials:
        return {}
    user, _, password = target.credentials.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    import base64                     # only with credentials: a probe loads less
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def check_health(target, clock: Clock) -> tuple[int, str]:
    """(exit code, one line) of one GET {base}/health within the clock's bound: 0 for HTTP
    200, 1 for another answer, EXIT_NO_ANSWER when nothing answered."""
    try:
        response = fetch(target, clock, "GET", "/health", headers=basic_auth(target))
    except TransportError as exc:
        return EXIT_NO_ANSWER, f"no answer from {target.display}/health: {exc.problem}"
    if response.status == 200:
        return EXIT_PASS, f"{target.display}/health answered 200"
    return EXIT_FAIL, f"{target.display}/health answered HTTP {response.status}"


def check_parser(command: str, description: str, epilog: str, base_url_default: str,
                 timeout_what: str) -> argparse.ArgumentParser:
    """The options of a bounded check (health, ready): --base-url and --timeout-s."""
    import textwrap                       # argparse's own, loaded when a parser is built
    parser = argparse.ArgumentParser(prog=f"{PROG} {command}", epilog=epilog,
                                     allow_abbrev=False,
                                     description=textwrap.fill(description, 79),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help=f"the server's address (default: $WARMUP_BASE_URL, else "
                             f"{base_url_default})")
    parser.add_argument("--timeout-s", metavar="S", type=seconds(60.0), default=2.0,
                        help=f"the longest {timeout_what} may take (default: %(default)g)")
    return parser


def health_main(argv: list[str]) -> int:
    """qualify.py health: exit 0 when /health answers 200 within the bound."""
    parser = check_parser(
        "health", "GET {base}/health once, within --timeout-s. The address comes from "
                  "--url-file, else --base-url or WARMUP_BASE_URL (start.sh passes it there, "
                  "out of the command line); user:password in it is sent as Basic auth and "
                  "never shown.",
        "exit status: 0 HTTP 200; 1 another HTTP answer; 2 usage error (a bad URL);\n"
        "3 no HTTP answer at all (nothing listening, no answer in time, or no --url-file "
        "yet)", DEFAULT_BASE_URL, "the request")
    parser.add_argument("--url-file", metavar="PATH",
                        help="the file start.sh writes the server's address to at launch "
                             "(LOG_DIR/server.url): what a Kubernetes probe reads, as it does "
                             "not get start.sh's environment")
    args = parser.parse_args(argv)
    try:
        text = args.base_url
        if args.url_file:
            text, why = url_from_file(args.url_file)
            if text is None:
                emit(f"no answer: {why}", sys.stderr)
                return EXIT_NO_ANSWER
        target = base_url_from(text)
    except UsageError as exc:
        emit(f"{PROG} health: {exc}", sys.stderr)
        return EXIT_USAGE
    code, line = check_health(target, Clock.start(args.timeout_s, args.timeout_s))
    emit(line, sys.stdout if code == EXIT_PASS else sys.stderr)
    return code


def url_from_file(path: str) -> tuple[str | None, str | None]:
    """The first line of start.sh's server.url, or (None, why there is none yet)."""
    try:
        with open_regular(path) as handle:         # a FIFO there never blocks a probe
            text = handle.read(4096).decode("utf-8", "replace").strip().split("\n")[0]
    except OSError as exc:
        return None, (f"{clean_text(path, 200)} cannot be read "
                      f"({exc.strerror or type(exc).__name__}): start.sh writes it at launch")
    return (text, None) if text else (None, f"{clean_text(path, 200)} is empty: start.sh "
                                            f"writes the server's address there at launch")


# ready: a ready file bound to the server it warmed (a Kubernetes exec probe runs it).

IDENTITY_LINES = ("process_start_time_seconds", "vllm:num_requests_", "vllm:request_success_",
                  SLEEP_GAUGE)


def check_identity(doc: dict, samples: list) -> str | None:
    """Why the server /metrics describes is not the one the ready file vouches for; None
    when it is: the same process start, or where neither says one (vLLM with several
    engines), no engine that has served fewer requests than at the warm-up (the counts
    only grow: fewer is a restart); and the same model served. Pure; fails closed."""
    warmed = finite_number(doc.get("process_start_time_seconds"))
    now = process_start(samples)
    served = served_counts(doc.get("served_at_warm"))
    if warmed is not None and now is not None and now != warmed:
        return (f"the server restarted since the warm-up (its process started at "
                f"{iso_time(now)}; the warmed one at {iso_time(warmed)}): a new start runs "
                f"a new warm-up")
    if warmed is not None and now is None or warmed is None and (now is not None or not served):
        return ("/metrics and the ready file do not both name the process start: the "
                "server cannot be told apart")
    if warmed is None:
        current = served_by_engine(samples)
        fewer = [e for e, n in served.items() if current.get(e, 0.0) < n]
        if fewer:
            return (f"the server restarted since the warm-up (engine {fewer[0] or 'all'} has "
                    f"served {current.get(fewer[0], 0.0):g} requests, {served[fewer[0]]:g} "
                    f"at the warm-up): a new start runs a new warm-up")
    models = served_models(samples)
    if doc["model"] not in {clean_text(m, MODEL_CHARS) for m in models}:   # as recorded
        shown = ", ".join(sorted(clean_text(m, 80) for m in models)[:5]) or "none on /metrics"
        return f"the server serves {shown}, not the warmed model {clean_text(doc['model'], 80)}"
    return None


def check_ready(doc: dict, warmed, target, timeout_s: float, path: str | None = None
                ) -> tuple[int, str]:
    """(exit code, one line): the server at `target` against the ready file `doc` (at
    `path`) of the one at `warmed` (its base_url, parsed); one /health and one /metrics
    within timeout_s. A server seen asleep or held by another process takes the file away
    (take_away): after the wake it stays not ready until a warm-up passes again."""
    if warmed.port != target.port:
        return EXIT_FAIL, (f"not ready: the ready file vouches for the server at "
                           f"{warmed.display}, not at {target.display} (another port, "
                           f"another server)")
    marked = [m for m in ("slept_at", "stopping_at", "rewarm_run_id") if doc.get(m)]
    if marked:                        # an earlier release's marks: not ready, as they said
        return EXIT_FAIL, f"not ready: the ready file is marked {marked[0]}: warm it again"
    foreign = foreign_listener(doc, target.port)
    if foreign:
        return EXIT_FAIL, f"not ready: {foreign}{taken(path, doc)}"
    return read_server(doc, target, timeout_s, path)


def read_server(doc: dict, target, timeout_s: float, path: str | None) -> tuple[int, str]:
    """(exit code, one line): one /health and one /metrics against the ready file; a
    server seen asleep takes the file away."""
    clock = Clock.start(timeout_s, timeout_s)
    code, line = check_health(target, clock)
    if code == EXIT_NO_ANSWER:
        return EXIT_FAIL, f"not ready: the server is not answering ({line})"
    if code != EXIT_PASS:
        return EXIT_FAIL, f"not ready: the server is unhealthy ({line})"
    exposition, why = read_exposition(target, clock, only=IDENTITY_LINES,
                                      headers=basic_auth(target))
    if exposition is None:
        return EXIT_FAIL, f"not ready: /metrics did not answer as it should ({why})"
    engines = doc.get("engines") if isinstance(doc.get("engines"), list) else None
    why = check_identity(doc, exposition.samples)
    if why:
        return EXIT_FAIL, f"not ready: {why}"
    engines = tuple(e for e in engines if isinstance(e, int)) if engines else None
    asleep = asleep_problem(exposition, engines)
    if asleep:                        # taken away: after the wake, not ready until warmed
        gone = taken(path, doc) if slept(exposition, engines) else ""
        return EXIT_FAIL, f"not ready: {asleep}{gone}"
    return EXIT_PASS, (f"ready: {target.display} serves {clean_text(doc['model'], 80)}, "
                       f"warmed by run {shown(doc.get('run_id'))} at "
                       f"{shown(doc.get('warmed_at'))}")


def foreign_listener(doc: dict, port: int) -> str | None:
    """Why the process holding the port is not, or cannot be told to be, the one the ready
    file vouches for: the server process start.sh launched itself (its pid is its group,
    server_pgid), never another member of its group (a proxy it started); None when it is."""
    pgid = doc.get("server_pgid")
    if pgid is None:              # a re-warm by hand names no group: nothing to hold it to
        return None
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
        return "the ready file's server_pgid is not a process group start.sh wrote"
    owners = port_owners(port)
    if owners == []:              # nobody listens: /health says the server is not answering
        return None
    if owners is None:            # what cannot be seen is not trusted
        return (f"/proc cannot tell which process holds port {port}: run the probe where "
                f"it sees the server's processes (the same PID namespace and user)")
    other = not_held_by(owners, pgid)
    return None if other is None else (
        f"another process answers port {port} (pid {other[0]}, process group {other[1]}), "
        f"not the server process {pgid} the ready file vouches for")


def taken(path: str | None, doc: dict) -> str:
    """The ready file taken away (when it still vouches for doc's run): what to add to
    the line that says why."""
    if not path:
        return ""
    removed, why = take_away(path, doc.get("run_id"))
    return "; the ready file is removed: warm it again" if removed else \
        f" (the ready file could not be removed: {why})" if removed is False else ""


def slept(exposition, engines: tuple | None = None) -> bool:
    """Some engine says it sleeps (a sleep gauge read exactly; one left out is unknown)."""
    return any(state not in ("awake", "sleep state not published")
               for state in sleep_states(exposition.samples, engines).values())


def shown(value) -> str:
    """A ready file's string as one clean word, or 'unknown'."""
    return clean_text(value, 40) if isinstance(value, str) and value else "unknown"


def ready_main(argv: list[str]) -> int:
    """qualify.py ready: exit 0 only while the ready file is true of the running server."""
    parser = check_parser(
        "ready", "Is the server still the one the ready file vouches for? Exit 0 only when "
                 "the file exists and parses, names the port --base-url names (the host may "
                 "be spelled another way), the server answers /health 200 within "
                 "--timeout-s, and its /metrics shows the same process start "
                 "(process_start_time_seconds) and the same model, every engine awake "
                 "(vllm:engine_sleep_state, where the server has it), its port held by the "
                 "server process start.sh launched; otherwise exit 1 with one line saying "
                 "which. A sleep or another process on the port also removes the file (only "
                 "a warm-up that passes writes it again); nothing here ever writes it. One /health and one /metrics, no records: what a "
                 "Kubernetes exec readiness probe runs. start.sh writes the file from the "
                 "records of a passing warm-up (and gate).",
        "exit status: 0 ready; 1 not ready; 2 usage error",
        "the one the ready file names", "both requests together")
    parser.add_argument("--ready-file", metavar="PATH", required=True,
                        help="the ready file start.sh --ready-file writes")
    parser.add_argument("--plan-sha256", metavar="HEX", type=sha256_type,
                        help="ready only when the warm-up ran the plan of this SHA-256 (the "
                             "one reviewed: sha256sum FILE; the default plan's is "
                             "plans/patch-note.json's)")
    parser.add_argument("--require-chunk", action="store_true",
                        help="ready only when the warm-up knew the server's prefill chunk "
                             "(its command or server.log said it), not assumed")
    args = parser.parse_args(argv)
    doc, why = read_ready_file(args.ready_file)
    why = why or unmet(doc, args.plan_sha256, args.require_chunk)
    doc = None if why else doc
    if doc is None:
        emit(f"not ready: {why}", sys.stderr)
        return EXIT_FAIL
    warmed = parse_base_url(doc["base_url"], args.ready_file)   # read_ready_file checked it
    try:
        target = base_url_from(args.base_url) if args.base_url or \
            os.environ.get("WARMUP_BASE_URL") else warmed
    except UsageError as exc:
        emit(f"{PROG} ready: {exc}", sys.stderr)
        return EXIT_USAGE
    code, line = check_ready(doc, warmed, target, args.timeout_s, args.ready_file)
    emit(line, sys.stdout if code == EXIT_PASS else sys.stderr)
    return code
