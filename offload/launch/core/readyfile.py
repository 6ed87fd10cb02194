"""The ready file: what a passing warm-up vouches for, written, read, marked and removed.

  ready_document(), ready_of()    the document from a passing run's verdict and records (pure)
  write_ready(), replace_ready_file(), drop_ready_file()   the writers' one way to write and
                                  remove it (the warm-up from its own verdict, the launcher
                                  from the records')
  read_ready_file()               the file as a document, or why it is none
  mark_ready_file()               a read-modify-write under the folder's lock (ReadyLock)
                                  that keeps the marks (MARKS) another writer made
  rewrite_after_run()             the warm-up's file from its own verdict (--ready-file)
  sha256_type()                   --plan-sha256: the reviewed plan the file must name

The warm-up's (core); qualify.py ready (tools/ready.py) reads and marks it too. Standard
library only.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from core.files import read_json_file, write_atomically
from core.transport import (UsageError, clean_text, finite_number, parse_base_url,
                            parse_url)

READY_KIND = "offload-ready/1"


MAX_READY_BYTES = 64 << 10


def ready_document(verdict: str, run: dict, summary: dict, records: str, sleep_state=None,
                   gate: dict | None = None, served: dict | None = None,
                   written_at: str | None = None, server_pgid: int | None = None
                   ) -> tuple[dict | None, str | None]:
    """The ready file's content from a run's verdict (contract.decide()'s), its run record
    and summary, the requests each engine had served after it (`served`, from its metrics
    record), with --gate the gate's pass, and the process group start.sh launched (the
    one that must hold the port): (document, None) for a warm-up's contract pass, else
    (None, why). Pure."""
    if run.get("mode") != "warmup":
        return None, f"the records are not a warm-up's (mode {clean_text(str(run.get('mode')), 20)})"
    if verdict != "pass":
        return None, f"the warm-up's records show {clean_text(str(verdict), 20)}, not a pass"
    if gate is not None and gate.get("verdict") != "pass":
        return None, f"the gate's records show {gate.get('verdict')}, not a pass"
    served = served_counts(served)
    if finite_number(run.get("process_start_time_seconds")) is None and not served:
        return None, ("the warm-up saw neither process_start_time_seconds nor request "
                      "counters on /metrics, so the ready file could never be checked")
    versions = run.get("versions") if isinstance(run.get("versions"), dict) else {}
    return {
        "kind": READY_KIND, "base_url": run.get("base_url"), "model": run.get("model"),
        "process_start_time_seconds": run.get("process_start_time_seconds"),
        "served_at_warm": served, "engines": run.get("engines"),
        "server_version": versions.get("server"),
        "run_id": run.get("run_id"), "verdict": "pass", "warmed_at": run.get("started_at"),
        "elapsed_s": summary.get("elapsed_s"), "records": records,
        "written_at": written_at or iso_time(time.time()), "sleep_state": sleep_state,
        "time_to_warm": summary.get("time_to_warm"), "gate": gate,
        "server_pgid": server_pgid, "slept_at": None,
        "chunk_tokens": run.get("plan", {}).get("chunk_tokens"),
        "plan": {k: file[k] for k in ("name", "sha256")} if (file := run.get("plan", {})
                                                               .get("file")) else None,
    }, None


def last_gauges(records: list[dict]) -> dict:
    """The last guard read's record of a run ({} when none)."""
    return ([r for r in records if r["record"] == "gauges"] or [{}])[-1]


def seen_asleep(records: list[dict]) -> bool:
    """A run's last guard read saw an engine asleep (a re-warm refused so: the ready file
    is marked, and stays not ready after the wake)."""
    states = last_gauges(records).get("sleep_state") or {}
    return any(state not in ("awake", "sleep state not published")
               for state in states.values())


def served_after(records: list[dict]) -> dict | None:
    """The requests each engine had served after the run (its main metrics record's)."""
    main = next((r for r in records if r["record"] == "metrics"), {})
    return main.get("served") or None


def ready_of(verdict: str, records: list[dict], path: str, gate: dict | None = None,
             server_pgid: int | None = None):
    """The ready file's document from a warm-up's verdict and its records, and the process
    group start.sh launched when it did: (doc, why)."""
    runs = [r for r in records if r["record"] == "run"]
    summaries = [r for r in records if r["record"] == "summary"]
    return ready_document(verdict, (runs or [{}])[-1], (summaries or [{}])[-1], path,
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


def drop_ready_file(path: str) -> tuple[bool | None, str]:
    """Remove the ready file (a regular file only): (True removed, None none to remove,
    False could not; why not)."""
    if not os.path.isfile(path) or os.path.islink(path):
        return None, ""
    try:
        os.remove(path)
        return True, ""
    except OSError as exc:
        return False, exc.strerror or type(exc).__name__


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


MARKS = ("slept_at", "stopping_at")      # what makes a ready file not ready, kept by every writer


class ReadyLock:
    """An exclusive lock on the ready file's folder (flock), tried for wait_s, held for a
    `with` block so that every read-modify-write of the file sees the one before it;
    `held` says whether it was had."""

    def __init__(self, path: str, wait_s: float = 2.0):
        self.path, self.wait_s, self.fd = path, wait_s, None

    def __enter__(self) -> "ReadyLock":
        import fcntl
        try:
            fd = os.open(os.path.dirname(os.path.abspath(self.path)),
                         os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return self
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                return self
            except OSError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return self
                time.sleep(0.02)

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)


def mark_ready_file(path: str, run_id, wait_s: float = 2.0, **fields) -> str | None:
    """The ready file rewritten with `fields` changed (None removes one), if it is still
    run `run_id`'s (a newer warm-up's is not ours to mark), under the folder's lock; None
    when done, else why not. A not-ready mark that cannot be written (a full disk, the
    lock not had) removes the file instead: unlinking needs no space."""
    with ReadyLock(path, wait_s) as lock:
        now, why = read_ready_file(path)
        if now is None or now.get("run_id") != run_id:
            return why or "it vouches for another run now"
        changed = {k: v for k, v in dict(now, **fields).items()
                   if v is not None or k not in fields}
        why = write_ready(path, changed) if lock.held else \
            "the ready file's folder could not be locked"
    if why and any(v is not None for v in fields.values()):
        removed, failed = drop_ready_file(path)
        why += "; removed it instead: not ready" if removed else \
            f"; nor could it be removed ({failed})"
    return why


def replace_ready_file(path: str, doc: dict, found: dict) -> str | None:
    """Write `doc` as the ready file under the folder's lock, keeping the marks (a sleep,
    a stop) another writer made since the file was `found`; None when written."""
    with ReadyLock(path):
        now = read_ready_file(path)[0] or {}
        kept = {m: now[m] for m in MARKS if now.get(m) and now.get(m) != found.get(m)}
        return write_ready(path, dict(doc, **kept))


def rewrite_after_run(path: str, run, summary: dict, sent: int, vouched: dict,
                      target) -> None:
    """The warm-up's ready file from its own verdict (`run`: the run, `sent` requests, the
    file as it found it, the server at `target`): written anew for a contract pass (a
    mark that the server slept or stops made while this run ran is kept; one from before
    goes), left as it was by a refusal that sent nothing (our own mark undone), removed
    after any other end (the server this run tried to warm is not known warm)."""
    if summary["verdict"] == "refused" and not sent:
        now = read_ready_file(path)[0] or {}
        if now.get("rewarm_run_id") == run.settings.run_id:   # a sleep it saw is marked
            asleep = iso_time(time.time()) if seen_asleep(run.written) else None
            mark_ready_file(path, now.get("run_id"), rewarm_run_id=None, slept_at=asleep)
        run.say(f"ready file {path} left as it was: this run was refused before it sent "
                f"anything")
        return
    same = same_address(vouched.get("base_url"), target)
    doc, why = ready_of(summary["verdict"], run.written, run.settings.records_path,
                        server_pgid=vouched.get("server_pgid") if same else None)
    if why and summary["verdict"] == "refused":
        why = f"this run was refused after it sent {sent} requests"
    why = why or replace_ready_file(path, doc, vouched)
    if why is None:
        run.say(f"ready file {path} written: `qualify.py ready --ready-file {path}` says "
                f"while it stays true")
        return
    removed, failed = drop_ready_file(path)
    gone = "; the old one was removed" if removed else \
        f"; the old one could not be removed ({failed})" if removed is False else ""
    run.say(f"ready file {path} not written: {why}{gone}")


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
