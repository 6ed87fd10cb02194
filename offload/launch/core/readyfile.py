"""The ready file: what a passing warm-up vouches for, written, read, marked and removed.

One creator per file (start.sh --supervise's owner, else the start.sh or warm-up holding
the server's lock) writes it with write_ready(); every other process may only take it
away (take_away()); qualify.py ready (tools/ready.py) reads it and checks unmet().
"""

from __future__ import annotations

import argparse
import json
import os
import time

from core.files import read_json_file, remove_regular, write_atomically
from core.sanitize import clean_text, finite_number
from core.transport import UsageError, parse_base_url, parse_url

READY_KIND = "offload-ready/1"


MAX_READY_BYTES = 64 << 10


def ready_document(verdict: str, run, summary, records: str, sleep_state=None,
                   gate: dict | None = None, served: dict | None = None,
                   written_at: str | None = None, server_pgid: int | None = None
                   ) -> tuple[dict | None, str | None]:
    """The ready file's content from a run's verdict (contract.decide()'s), its run record
    and summary, the requests each engine had served after it (`served`, from its metrics
    record), with --gate the gate's pass, and the process group start.sh launched (the
    one that must hold the port): (document, None) for a warm-up's contract pass, else
    (None, why). Pure; the run record and the summary typed (records.held(), typed())."""
    if run.mode != "warmup":
        return None, f"the records are not a warm-up's (mode {clean_text(str(run.mode), 20)})"
    if verdict != "pass":
        return None, f"the warm-up's records show {clean_text(str(verdict), 20)}, not a pass"
    if gate is not None and gate.get("verdict") != "pass":
        return None, f"the gate's records show {gate.get('verdict')}, not a pass"
    served = served_counts(served)
    if run.process_start_time_seconds is None and not served:
        return None, ("the warm-up saw neither process_start_time_seconds nor request "
                      "counters on /metrics, so the ready file could never be checked")
    plan = run.plan
    return {
        "kind": READY_KIND, "base_url": run.base_url, "model": run.model,
        "process_start_time_seconds": run.process_start_time_seconds,
        "served_at_warm": served, "engines": run.engines,
        "server_version": run.versions.get("server"),
        "run_id": run.run_id, "verdict": "pass", "warmed_at": run.started_at,
        "elapsed_s": summary.elapsed_s, "records": records,
        "written_at": written_at or iso_time(time.time()), "sleep_state": sleep_state,
        "time_to_warm": summary.time_to_warm, "gate": gate, "server_pgid": server_pgid,
        "chunk_tokens": plan.chunk_tokens, "chunk_source": plan.chunk_source,
        "b1_one_step": plan.b1_one_step, "plan": plan_vouched(plan.file),
    }, None


def plan_vouched(file: dict | None) -> dict:
    """The plan a pass vouches for, by its digest: its file's, or the default's (the
    patch note's, plans/patch-note.json) for a contract pass without one."""
    if file:
        return {k: file[k] for k in ("name", "sha256")}
    from core.plan_file import DEFAULT_NAME, DEFAULT_SHA256
    return {"name": DEFAULT_NAME, "sha256": DEFAULT_SHA256}


def unmet(doc: dict, plan_sha256: str | None = None, require_chunk: bool = False
          ) -> str | None:
    """Why a ready document does not vouch for what its reader requires (a plan by its
    digest, a chunk the server's command or log said, not assumed); None when it does.
    The creators check it before writing, `qualify.py ready` when reading. Pure."""
    plan = doc.get("plan") if isinstance(doc.get("plan"), dict) else {}
    if plan_sha256 and plan.get("sha256") != plan_sha256:
        return (f"the ready file vouches for a warm-up of plan "
                f"{clean_text(str(plan.get('name')), 64)} sha256:"
                f"{clean_text(str(plan.get('sha256')), 64)}, not of the plan "
                f"sha256:{plan_sha256}")
    if require_chunk and doc.get("chunk_source") in (None, "assumed"):
        return ("the warm-up assumed the server's prefill chunk: pin "
                "--max-num-batched-tokens in the server command")
    return None


def last_gauges(records: list[dict]) -> dict:
    """The last guard read's record of a run ({} when none)."""
    return ([r for r in records if r.record == "gauges"] or [{}])[-1]


def served_after(records: list[dict]) -> dict | None:
    """The requests each engine had served after the run (its main metrics record's)."""
    main = next((r for r in records if r.record == "metrics"), None)
    return (main and main.served) or None


def ready_of(verdict: str, records: list[dict], path: str, gate: dict | None = None,
             server_pgid: int | None = None):
    """The ready file's document from a warm-up's verdict and its records, and the process
    group start.sh launched when it did: (doc, why)."""
    from core.records import CLASSES           # the writers' only: never the probe's load
    runs = [r for r in records if r.record == "run"] or [CLASSES["run"]()]
    summaries = [r for r in records if r.record == "summary"] or [CLASSES["summary"]()]
    return ready_document(verdict, runs[-1], summaries[-1], path,
                          last_gauges(records).get("sleep_state"), gate,
                          served_after(records), server_pgid=server_pgid)


def served_counts(served) -> dict:
    """Requests served per engine, as a ready file keeps them: finite numbers only."""
    if not isinstance(served, dict):
        return {}
    return {str(k)[:8]: v for k, v in served.items()
            if finite_number(v) is not None and v == v and v >= 0}


def write_ready(path: str, doc: dict) -> str | None:
    """Write the ready file atomically (a temporary file beside it, then a rename); None
    when written, else why not."""
    return write_atomically(path, json.dumps(doc, indent=1) + "\n")


def read_ready_file(path: str) -> tuple[dict | None, str | None]:
    """The ready file as a document, or (None, why it is not one)."""
    where = clean_text(path, 200)
    if os.path.islink(path):          # no writer writes through a link: not one of theirs
        return None, f"{where} is a link, not the file start.sh or the warm-up writes"
    try:
        doc, why = read_json_file(path, MAX_READY_BYTES)
    except FileNotFoundError:
        return None, (f"{where} is missing: no warm-up has passed since the last start, "
                      f"re-warm, sleep or stop")
    except OSError as exc:
        return None, f"{where} cannot be read ({exc.strerror or type(exc).__name__})"
    if not isinstance(doc, dict) or doc.get("kind") != READY_KIND or doc.get("verdict") != "pass" \
            or not isinstance(doc.get("model"), str) or not isinstance(doc.get("base_url"), str):
        return None, f"{where} is not a ready file ({why or 'not what start.sh writes'})"
    try:
        parse_base_url(doc["base_url"], "its base_url")
    except UsageError as exc:
        return None, f"{where} is not a ready file ({exc})"
    return doc, None


def iso_time(seconds_since_epoch: float) -> str:
    """A Unix time as UTC; one a calendar cannot hold is named as a number."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds_since_epoch))
    except (OverflowError, OSError, ValueError):
        return f"{seconds_since_epoch:g} (not a calendar time)"


def take_away(path: str, run_id=None) -> tuple[bool | None, str]:
    """What every process but the creator may do to a ready file: remove it (when it still
    vouches for run `run_id`, if one is named; a newer pass is not ours to judge). Never a
    rewrite: readiness is only taken away here, never restored. remove_regular's answer."""
    now = read_ready_file(path)[0] if run_id is not None else None
    if now is not None and now.get("run_id") != run_id:
        return None, "it vouches for another run now"
    return remove_regular(path)


def take_for_run(path: str) -> dict:
    """The ready file as a warm-up (--ready-file) found it ({} without one), then removed:
    a run that does not pass leaves none."""
    found = read_ready_file(path)[0] or {}
    remove_regular(path)
    return found


def rewrite_after_run(path: str, run, summary: dict, vouched: dict, target) -> None:
    """The warm-up's ready file from its own verdict (--ready-file; the file was taken away
    when the run began): written anew for a contract pass, else left absent."""
    same = same_address(vouched.get("base_url"), target)
    from core.records import typed
    doc, why = ready_of(summary["verdict"], [typed(r) for r in run.written],
                        run.settings.records_path,
                        server_pgid=vouched.get("server_pgid") if same else None)
    why = why or write_ready(path, doc)
    if why is None:
        run.say(f"ready file {path} written: `qualify.py ready --ready-file {path}` says "
                f"while it stays true")
        return
    remove_regular(path)
    run.say(f"ready file {path} not written: {why}")


def same_address(text, target) -> bool:
    """The ready file's base_url names the server at `target` (localhost and 127.0.0.1 are
    one address: locks.lock_host, loaded by the warm-up, not by `qualify.py ready`)."""
    from core.locks import lock_host
    try:
        vouched = parse_url(str(text), "the ready file's base_url")
    except UsageError:
        return False
    return (lock_host(vouched.host), vouched.port) == (lock_host(target.host), target.port)


def sha256_type(text: str) -> str:
    """An argparse type: a SHA-256 digest, 64 hex digits (as sha256sum prints it)."""
    if len(text) != 64 or text.strip("0123456789abcdefABCDEF"):
        raise argparse.ArgumentTypeError(f"must be a SHA-256 digest (64 hex digits, as "
                                         f"sha256sum prints it), got {text[:80]!r}")
    return text.lower()
