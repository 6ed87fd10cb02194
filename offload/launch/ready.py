"""qualify.py health and ready: is the server answering, and is the ready file still true?

  health_main()        one bounded GET /health (the check the launcher polls)
  ready_main()         read_ready_file() -> check_ready(): one /health and one /metrics,
                       check_identity() (pure: the ready file against what /metrics says)
  write_ready()        the ready file from the records of a passing warm-up (the launcher)

What a Kubernetes exec readiness probe runs every few seconds: it imports only what these
two need (qualify.py loads a command's module when that command runs). Standard library
only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import textwrap
import time
import urllib.parse

from records import as_dict
from runframe import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, emit, seconds
from transport import (Clock, TransportError, UsageError, clean_text, fetch, finite_number,
                       read_json_file, write_atomically)
from vllm_client import base_url_from, parse_base_url
from vllm_metrics import (SLEEP_GAUGE, asleep_problem, process_start, read_exposition,
                          served_models)

PROG = "qualify.py"


# ---------------------------------------------------------------------------
# health: one GET /health, bounded (what the launcher polls while the server starts).
# ---------------------------------------------------------------------------

EXIT_NO_ANSWER = 3                    # health: no HTTP answer at all


def basic_auth(target) -> dict:
    """user:password in the URL as a Basic auth header (a proxy in front may want them);
    never shown. {} without credentials."""
    if not target.credentials:
        return {}
    user, _, password = target.credentials.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
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
    parser = argparse.ArgumentParser(prog=f"{PROG} {command}", epilog=epilog,
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
                  "--base-url or WARMUP_BASE_URL (start.sh passes it there, out of the "
                  "command line); user:password in it is sent as Basic auth and never shown.",
        "exit status: 0 HTTP 200; 1 another HTTP answer; 2 usage error (a bad URL);\n"
        "3 no HTTP answer at all (nothing listening, or no answer in time)",
        "http://127.0.0.1:8000", "the request")
    args = parser.parse_args(argv)
    try:
        target = base_url_from(args.base_url)
    except UsageError as exc:
        emit(f"{PROG} health: {exc}", sys.stderr)
        return EXIT_USAGE
    code, line = check_health(target, Clock.start(args.timeout_s, args.timeout_s))
    emit(line, sys.stdout if code == EXIT_PASS else sys.stderr)
    return code


# ---------------------------------------------------------------------------
# ready: a ready file bound to the server it warmed (a Kubernetes exec probe runs it).
# ---------------------------------------------------------------------------

READY_KIND = "offload-ready/1"
IDENTITY_LINES = ("process_start_time_seconds", "vllm:num_requests_", "vllm:request_success_",
                  SLEEP_GAUGE)
MAX_READY_BYTES = 64 << 10


def ready_document(warmup: dict, warmup_path: str, gate_report: dict | None = None,
                   gate_path: str | None = None, written_at: str = ""
                   ) -> tuple[dict | None, str | None]:
    """The ready file's content from the reports of the warm-up's (and the gate's) records:
    (document, None) when they show a complete pass, else (None, why). Pure."""
    for report, mode, name in ((warmup, "warmup", "warm-up"), (gate_report, "gate", "gate")):
        run = as_dict(report["runs"][-1]["run"]) if report and report["runs"] else {}
        if report is not None and run.get("mode") != mode:
            return None, f"the {name}'s records are not a {name}'s (mode {run.get('mode')!r})"
    if warmup["verdict"] != "pass":
        return None, f"the warm-up's records show {warmup['verdict']}, not a pass"
    if gate_report is not None and gate_report["verdict"] != "pass":
        return None, f"the gate's records show {gate_report['verdict']}, not a pass"
    last = warmup["runs"][-1]
    run, summary = as_dict(last["run"]), as_dict(last["summary"])
    doc = {
        "kind": READY_KIND, "base_url": run.get("base_url"), "model": run.get("model"),
        "process_start_time_seconds": run.get("process_start_time_seconds"),
        "engines": run.get("engines"),
        "server_version": as_dict(run.get("versions")).get("server"),
        "run_id": run.get("run_id"), "verdict": "pass", "warmed_at": run.get("started_at"),
        "elapsed_s": summary.get("elapsed_s"), "records": warmup_path,
        "written_at": written_at,
        "sleep_state": last.get("sleep_state"), "time_to_warm": summary.get("time_to_warm"),
        "gate": None,
    }
    if gate_report is not None:
        gate_run = as_dict(gate_report["runs"][-1]["run"])
        doc["gate"] = {"verdict": "pass", "run_id": gate_run.get("run_id"),
                       "records": gate_path}
    return doc, None


def read_ready_file(path: str) -> tuple[dict | None, str | None]:
    """The ready file as a document, or (None, why it is not one)."""
    where = clean_text(path, 200)
    if os.path.islink(path):          # no writer writes through a link: not one of theirs
        return None, f"{where} is a link, not the file start.sh or the warm-up writes"
    try:
        doc, why = read_json_file(path, MAX_READY_BYTES)
    except FileNotFoundError:
        return None, f"{where} is missing: no warm-up has passed since the last start"
    except OSError as exc:
        return None, f"{where} cannot be read ({exc.strerror or type(exc).__name__})"
    if not isinstance(doc, dict) or doc.get("kind") != READY_KIND \
            or not isinstance(doc.get("model"), str) or not isinstance(doc.get("base_url"), str):
        return None, f"{where} is not a ready file ({why or 'not what start.sh writes'})"
    try:
        parse_base_url(doc["base_url"], "its base_url")
    except UsageError as exc:
        return None, f"{where} is not a ready file ({exc})"
    return doc, None


def check_identity(doc: dict, samples: list) -> str | None:
    """Why the server /metrics describes is not the one the ready file vouches for; None
    when it is (same process start, the same model served). Pure; fails closed."""
    warmed = finite_number(doc.get("process_start_time_seconds"))
    now = process_start(samples)
    if warmed is None:
        return "the ready file names no process start: the server cannot be told apart"
    if now is None:
        return "/metrics has no process_start_time_seconds: the server cannot be told apart"
    if now != warmed:
        return (f"the server restarted since the warm-up (its process started at "
                f"{iso_time(now)}; the warmed one at {iso_time(warmed)}): a new start runs "
                f"a new warm-up")
    models = served_models(samples)
    if doc["model"] not in models:
        shown = ", ".join(sorted(clean_text(m, 80) for m in models)[:5]) or "none on /metrics"
        return f"the server serves {shown}, not the warmed model {clean_text(doc['model'], 80)}"
    return None


def iso_time(seconds_since_epoch: float) -> str:
    """A Unix time as UTC; one a calendar cannot hold is named as a number."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds_since_epoch))
    except (OverflowError, OSError, ValueError):
        return f"{seconds_since_epoch:g} (not a calendar time)"


def check_ready(doc: dict, warmed, target, timeout_s: float) -> tuple[int, str]:
    """(exit code, one line): the server at `target` against the ready file `doc` of the
    one at `warmed` (its base_url, parsed); one /health and one /metrics within timeout_s."""
    if warmed.port != target.port:
        return EXIT_FAIL, (f"not ready: the ready file vouches for the server at "
                           f"{warmed.display}, not at {target.display} (another port, "
                           f"another server)")
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
    why = check_identity(doc, exposition.samples) or asleep_problem(
        exposition, tuple(e for e in engines if isinstance(e, int)) if engines else None)
    if why:
        return EXIT_FAIL, f"not ready: {why}"
    return EXIT_PASS, (f"ready: {target.display} serves {clean_text(doc['model'], 80)}, "
                       f"warmed by run {shown(doc.get('run_id'))} at "
                       f"{shown(doc.get('warmed_at'))}")


def shown(value) -> str:
    """A ready file's string as one clean word, or 'unknown'."""
    return clean_text(value, 40) if isinstance(value, str) and value else "unknown"


def write_ready(path: str, records: str, gate_records: str | None,
                run_id: str | None = None) -> tuple[int, str]:
    """Write the ready file atomically (a temporary file beside it, then a rename) when the
    records show a pass — of run `run_id` where given (a records file another run also
    writes to is not its pass), else of the last run; (exit code, one line)."""
    from readback import load_records           # only writing reads records
    from report import build_report
    reports = []
    for source, only in [(records, run_id)] + ([(gate_records, None)] if gate_records else []):
        try:
            found, issues = load_records(source)
        except OSError as exc:
            return EXIT_FAIL, f"not written: cannot read {source} ({exc.strerror or exc})"
        if only is not None:
            found = [r for r in found if r.get("run_id") == only]
        reports.append(build_report(found, issues, source))
    gate_report = reports[1] if gate_records else None
    doc, why = ready_document(reports[0], records, gate_report, gate_records, iso_time(time.time()))
    if doc is None:
        return EXIT_FAIL, f"not written: {why}"
    if finite_number(doc.get("process_start_time_seconds")) is None:
        return EXIT_FAIL, ("not written: the warm-up saw no process_start_time_seconds on "
                           "/metrics, so the ready file could never be checked")
    why = write_atomically(path, json.dumps(doc, indent=1) + "\n")
    if why is not None:
        return EXIT_USAGE, f"cannot write {clean_text(path, 200)}: {why}"
    return EXIT_PASS, f"wrote {clean_text(path, 200)}"


def ready_main(argv: list[str]) -> int:
    """qualify.py ready: exit 0 only while the ready file is true of the running server."""
    parser = check_parser(
        "ready", "Is the server still the one the ready file vouches for? Exit 0 only when "
                 "the file exists and parses, names the port --base-url names (the host may "
                 "be spelled another way), the server answers /health 200 within "
                 "--timeout-s, and its /metrics shows the same process start "
                 "(process_start_time_seconds) and the same model, every engine awake "
                 "(vllm:engine_sleep_state, where the server has it); otherwise exit 1 with "
                 "one line saying which. One /health and one /metrics, no records: what a "
                 "Kubernetes exec readiness probe runs. start.sh writes the file from the "
                 "records of a passing warm-up (and gate).",
        "exit status: 0 ready; 1 not ready; 2 usage error",
        "the one the ready file names", "both requests together")
    parser.add_argument("--ready-file", metavar="PATH", required=True,
                        help="the ready file start.sh --ready-file writes")
    args = parser.parse_args(argv)
    doc, why = read_ready_file(args.ready_file)
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
    code, line = check_ready(doc, warmed, target, args.timeout_s)
    emit(line, sys.stdout if code == EXIT_PASS else sys.stderr)
    return code
