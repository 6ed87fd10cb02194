"""Records read back: a JSON Lines file read within bounds, split into runs, each judged.

Used by report.py, the launcher and gate.py. A records file may be cut short by a kill,
hold several runs, damaged lines or hostile values: load_records() reads past bad lines
and names them, never holding more than a bounded amount; judge_file() splits them into
runs, gives each (judge_run()) contract.decide()'s verdict, held against what its summary
claims, and the file its last attempt's (decisive()), as one object: what report shows;
tidy() makes any value safe to show, as text or --json.
"""

from __future__ import annotations

import math

from core.contract import Ending, Verdict, decide, identity
from core.readyfile import ready_of, unmet, write_ready
from core.records import BIGGEST, JUDGED, held, label, parse_fields, record_class, show
from core.cli import (EXIT_FAIL, EXIT_HARD_BOUND, EXIT_HARD_KILLED, EXIT_INTERRUPTED,
                      EXIT_PASS, EXIT_REFUSED, EXIT_TERMINATED, MAX_SECONDS)
from core.files import open_regular
from core.sanitize import clean_text
from core.transport import decode_json

MAX_RECORD_LINE_BYTES = 1 << 20       # a longer line is a bad line, skipped unread
MAX_REPORT_BYTES = 16 << 20           # report reads no more of a file than this
MAX_RECORDS = 20000                   # nor keeps more records than this
READ_CHUNK_BYTES = 1 << 20
ISSUES_NAMED = 20                     # bad lines named one by one; the rest counted
JSON_TEXT_LIMIT = 1000                # one string in report --json
READ_STOPPED = "stopped reading"      # how a note says the file was not read to its end
ENDINGS = ("pass", "custom", "fail", "refused", "killed")    # what a summary may claim


def read_lines(handle, max_line: int = MAX_RECORD_LINE_BYTES,
               max_total: int = MAX_REPORT_BYTES):
    """Yield (line number, bytes, ended) from a binary file; bytes None for an over-long line.

    Never holds more than one capped line; stops (yielding (None, None, False)) once
    `max_total` bytes were read, so /dev/zero or a 1 GB file cannot exhaust memory.
    """
    total, number = 0, 0
    while total < max_total:
        line = handle.readline(min(max_line + 1, max_total - total))
        if not line:
            return
        total += len(line)
        number += 1
        if len(line) <= max_line or line.endswith(b"\n"):
            yield number, line, line.endswith(b"\n")
            continue
        while not line.endswith(b"\n") and total < max_total:    # skip the rest of it
            line = handle.readline(min(READ_CHUNK_BYTES, max_total - total))
            if not line:
                break
            total += len(line)
        yield number, None, line.endswith(b"\n")
    yield None, None, False


def load_records(path: str) -> tuple[list[dict], list[str]]:
    """Every record of a records file, read past bad lines, which are named in the issues.

    Bounded: at most MAX_REPORT_BYTES read, lines of at most MAX_RECORD_LINE_BYTES, and at
    most MAX_KEPT_VALUES values kept over all records (a file of junk cannot fill memory).
    OSError when the file cannot be opened or read, or is not a regular file.
    """
    records, bad, notes = [], [], []
    bad_count, last_ended, budget = 0, True, [MAX_KEPT_VALUES]

    def note_bad(message: str) -> None:
        nonlocal bad_count
        bad_count += 1
        if len(bad) < ISSUES_NAMED:
            bad.append(message)

    with open_regular(path) as handle:
        for number, line, ended in read_lines(handle):
            if number is None:
                notes.append(f"{READ_STOPPED} after {MAX_REPORT_BYTES >> 20} MiB: the rest "
                             f"of the file is not shown")
                break
            last_ended = ended
            if line is None:
                note_bad(f"line {number} is longer than {MAX_RECORD_LINE_BYTES >> 20} MiB "
                         f"(skipped)")
                continue
            if not line.strip():
                continue
            record, why = decode_json(line)
            if why is not None:
                cut = "" if ended else ": the file ends there (cut short by a kill?)"
                note_bad(f"line {number} is not valid JSON{cut or ' (skipped)'}")
            elif not isinstance(record, dict) or not isinstance(record.get("record"), str):
                note_bad(f"line {number} is JSON but not a record (skipped)")
            elif budget[0] <= 0 or len(records) >= MAX_RECORDS:
                notes.append(f"{READ_STOPPED} at line {number}: the records so far hold as "
                             f"many values as report keeps; the rest of the file is not shown")
                break
            else:
                records.append(prune(record, budget))
    issues = list(bad)
    if bad_count > len(bad):
        issues.append(f"and {bad_count - len(bad)} more bad lines (skipped)")
    if not last_ended and not notes and not any("ends there" in b for b in bad[-1:]):
        notes.append("the last line has no newline: the file was cut short")
    return records, issues + notes


MAX_KEPT_VALUES = 500_000             # values kept over all records of one report
MAX_CONTAINER_ITEMS = 1000            # items kept of one list or object
MAX_KEPT_DEPTH = 8


def prune(value, budget: list, depth: int = 0):
    """A record as report keeps it: containers cut to MAX_CONTAINER_ITEMS and MAX_KEPT_DEPTH,
    every value counted against the shared budget."""
    budget[0] -= 1
    if isinstance(value, (dict, list)) and depth >= MAX_KEPT_DEPTH:
        return type(value)()
    if isinstance(value, dict):
        return {key: prune(item, budget, depth + 1)
                for key, item in list(value.items())[:MAX_CONTAINER_ITEMS]}
    if isinstance(value, list):
        return [prune(item, budget, depth + 1) for item in value[:MAX_CONTAINER_ITEMS]]
    return value


def split_runs(records: list[dict]) -> list[list[dict]]:
    """Records grouped by run: a `run` record starts one; `run_id` sends a record to its run."""
    runs: list[list[dict]] = []
    by_id: dict[str, list[dict]] = {}
    has_run_record: set[int] = set()
    current = None
    for record in records:
        rid = record.get("run_id") if isinstance(record.get("run_id"), str) else None
        target = by_id.get(rid) if rid is not None else None
        if record["record"] == "run" and (target is None or id(target) in has_run_record):
            target = None
        if target is None and (record["record"] == "run" or rid is not None
                               or current is None):
            target = []
            runs.append(target)
            if rid is not None:
                by_id[rid] = target
        target = current if target is None else target
        if record["record"] == "run":
            has_run_record.add(id(target))
        target.append(record)
        current = target
    return runs


def tidy(value, depth: int = 0):
    """A records value made safe to show (report, as text or --json): strings cleaned and
    cut, numbers JSON and a line can hold (a 4,000-digit one would pass the sink's cut)."""
    if isinstance(value, str):
        return clean_text(value, JSON_TEXT_LIMIT)
    if isinstance(value, list):
        return [tidy(v, depth + 1) for v in value] if depth < 32 else None
    if isinstance(value, dict):
        return type(value)({clean_text(str(k), 100): tidy(v, depth + 1)    # a Record stays one
                            for k, v in value.items()}) if depth < 32 else None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not -BIGGEST <= value < BIGGEST:      # as a record's int
        return None
    return value


def repeated_run(group: list[dict], groups: list[list[dict]]) -> bool:
    """A run whose id starts more than one run in the file (a run replayed, or forged)."""
    ids = [r.get("run_id") for g in groups for r in g if r["record"] == "run"]
    mine = [r.get("run_id") for r in group if r["record"] == "run"]
    return any(isinstance(i, str) and ids.count(i) > 1 for i in mine)


# One run judged: what judge_run() gives (a dict, each field an attribute).
Judged = record_class("judged", parse_fields(
    "run:any summary:any decided:any verdict:str exit_code:int claimed:any "
    "evidence_problems:list records:list ended_on:any"))
# What report --json prints, declared as the records are (a class each, each field an
# attribute): a run, the file.
RunReport = record_class("run_report", parse_fields(
    "run:any requests:list waves:list metrics:list status:list probe:list probe_summary:any "
    "gate:list gate_summary:any summary:any problems:list verdict:str exit_code:int "
    "claimed:any evidence:str evidence_problems:list differences:list parts:list notes:list "
    "ends:str shape:any sleep_state:any"))
FileReport = record_class("file_report", parse_fields(
    "runs:list issues:list verdict:str exit_code:int evidence:str ends:str ~expect_k:list "
    "~plan_sha256:any"))


def judge_run(records: list[dict], repeated: bool = False):
    """One run's records read (records.held(): one line for each that breaks its
    declaration, which fails the run) and judged: contract.decide() on them with how its
    summary says it ended, held against that claim. A summary that claims a pass or a
    custom plan the records do not show, two summaries, counts that disagree: 'incomplete'
    (exit 1), as is a run without a summary (killed, or still running). A custom plan exits
    1 here: it is not the contract's warm-up, whatever the run itself exited."""
    ended_on = records[-1].get("record") if records else None     # as read: its last line
    records, unread = held(records)
    runs = [r for r in records if r.record == "run"]
    summaries = [r for r in records if r.record == "summary"]
    run, summary = (runs or [None])[-1], (summaries or [None])[-1]
    deadline = run.plan.deadline_s if run else None
    decided = decide(run, records, ending_of(summary, deadline) or Ending("fail", EXIT_FAIL),
                     unread)
    found = list(unread)
    if len(summaries) > 1:
        found.append(f"{len(summaries)} summary records (a run has exactly one)")
    if repeated:
        found.append("its run id starts another run in this file too (a run written twice)")
    if summary is not None:
        found += claims_problems(run, summary, decided)
    if summary is None:
        verdict, code = "incomplete", EXIT_FAIL
    elif found or (summary.verdict in ("pass", "custom")
                   and decided.verdict != summary.verdict):
        verdict, code = "incomplete", EXIT_FAIL
        found += list(decided.structural) + list(decided.problems)
    else:
        verdict = decided.verdict
        code = EXIT_FAIL if verdict == "custom" else decided.exit_code
    return Judged(run=run, summary=summary, decided=decided, verdict=verdict, exit_code=code,
                  claimed=summary.verdict if summary else None,
                  evidence_problems=list(dict.fromkeys(found)), records=records,
                  ended_on=ended_on)


PICKED = {
    "request": ("wave", "engine", "index", "request_id", "http_status", "prompt_tokens",
                "cached_tokens", "completion_tokens", "reasoning_tokens", "finish_reason",
                "stop_reason", "latency_s", "ok", "path", "depth", "logprobs_count"),
    "wave": ("wave", "engine", "depth", "release_skew_ms", "duration_s", "released_at",
             "last_answer_at", "ok", "running_max", "waiting_max", "gauge_samples",
             "spec_decode", "tokens_per_step", "counters_went_down"),
    "metrics": ("source", "state", "why", "highlights", "warnings", "counted"),
    "status": ("path", "state", "why", "delta", "fresh_by"),
    "probe": ("item", "round", "engine", "index", "ttft_s", "total_s", "prompt_tokens",
              "cached_tokens", "ok"),
    "gate": ("shape", "probe", "kind", "engine", "index", "http_status", "finish_reason",
             "completion_tokens", "reasoning_tokens", "exact", "edit_distance",
             "reference_chars", "answer_chars", "cer", "word_errors", "reference_words",
             "preamble_chars", "removed", "ok"),
}


def build_run(judged, last: bool = True) -> dict:
    """One run as one object: plan, requests, waves, counters, probe, gate, summary, and
    the verdict judged from its evidence (judge_run(): contract.decide())."""
    run, summary, decided = judged.run, judged.summary, judged.decided
    by_kind: dict[str, list[dict]] = {}
    for record in judged.records:     # the records held to their declarations
        by_kind.setdefault(record.record, []).append(record)
    where = "the file ends" if last else "its records end (another run follows)"
    ends = "summary" if summary else (
        f"no summary: {where} after a '{show(judged.ended_on, 40)}' record (the "
        f"run was killed{', or is still running' if last else ''})")
    failed = set(decided.failed)
    judged_kind = JUDGED.get(run.mode, "request") if run else "request"
    if summary:
        problems = summary.problems
    else:                             # cut short: name what failed before the cut
        problems = [f"{label(r)}: {p}" for r in by_kind.get(judged_kind, [])
                    if not r.ok or identity(r) in failed
                    for p in r.problems or ["fails its kind's rules"]]

    def pick(kind: str) -> list[dict]:
        """The shown fields; a judged record's `ok` is the report's own judgement (the
        record's claim beside it as `claimed_ok`)."""
        return [type(r)({k: r.get(k) for k in PICKED[kind]},       # still its kind's class
                        **({"ok": identity(r) not in failed, "claimed_ok": r.ok}
                           if kind == judged_kind and "ok" in PICKED[kind] else {}))
                for r in by_kind.get(kind, [])]

    return RunReport({
        "run": run,
        "requests": pick("request"), "waves": pick("wave"), "metrics": pick("metrics"),
        "status": pick("status"), "probe": pick("probe"),
        "probe_summary": (by_kind.get("probe_summary") or [None])[-1],
        "gate": pick("gate"), "gate_summary": (by_kind.get("gate_summary") or [None])[-1],
        "summary": summary, "problems": problems,
        "verdict": judged.verdict, "exit_code": judged.exit_code, "claimed": judged.claimed,
        "evidence": "incomplete" if judged.evidence_problems else "complete",
        "evidence_problems": judged.evidence_problems,
        "differences": list(decided.differences), "parts": [list(p) for p in decided.parts],
        "notes": list(decided.notes), "ends": ends,
        "shape": decided.shape.as_record() if decided.shape else None,
        # what the last guard read saw of vllm:engine_sleep_state (null: no such gauge)
        "sleep_state": (by_kind.get("gauges") or [{}])[-1].get("sleep_state"),
    })


def judge_file(records: list[dict], issues: list[str], path: str = "FILE") -> dict:
    """A records file as one object: each run, the bad lines, and the last run's verdict.
    A file with no run record holds no run, whatever else it holds: exit 1."""
    groups = split_runs(records)
    runs = [build_run(judge_run(group, repeated_run(group, groups)), last=group is groups[-1])
            for group in groups]
    if any(issue.startswith(READ_STOPPED) for issue in issues):
        return FileReport(runs=runs, issues=issues, verdict="incomplete",
                          exit_code=EXIT_FAIL, evidence="incomplete",
                          ends=f"{clean_text(path, 200)} was not read to its end (too large "
                               f"to read whole): its last run is not known")
    if not any(r.get("record") == "run" for r in records):      # records as read: dicts
        return FileReport(runs=runs, issues=issues, verdict="none",
                          exit_code=EXIT_FAIL, evidence="incomplete",
                          ends=f"no warm-up run in {clean_text(path, 200)} (no run record)")
    last = decisive(runs)
    return FileReport(runs=runs, issues=issues, verdict=last.verdict,
                      exit_code=last.exit_code, evidence=last.evidence, ends=last.ends)


def decisive(runs: list[dict]) -> dict:
    """The file's exit status, from its last attempt: its last run, with what came after
    it. Records of a run whose run record is missing (a run KILLed before writing it, or
    its line lost) make it incomplete; a last run that is not a warm-up (a probe, a gate)
    exits 1: the file holds no warm-up pass to go by."""
    last = runs[-1]
    if last.run is None:            # none, or none it could read
        return RunReport(last, verdict="incomplete", exit_code=EXIT_FAIL, evidence="incomplete",
                    ends="the file's last records belong to no run record it could read (a "
                         "run KILLed before writing it, its line lost or damaged): its last "
                         "attempt is not known to have passed")
    mode = last.run.mode
    if mode != "warmup" and last.exit_code == EXIT_PASS:
        return RunReport(last, exit_code=EXIT_FAIL, verdict="no warm-up",
                    ends=f"its last run is a {show(mode, 20)}, not a warm-up: the file holds "
                         f"no warm-up pass to release HOLD by")
    return last


def claims_problems(run: dict | None, summary: dict, decided: Verdict) -> list[str]:
    """The one place the copies of a verdict the writer left (the run record's plan, the
    summary) are held against the verdict its records give: a pass with problems, counts,
    the shape test's verdict, a claim of the contract's plan."""
    found = []
    claim = run.plan.contract if run else None
    differs = "; ".join(decided.differences)
    if claim is not None and claim is not (not differs):
        found.append(f"the run record's plan says contract {show(claim)}; its "
                     f"plan {'differs: ' + differs if differs else 'is the reviewed one'}")
    if summary.verdict == "pass" and summary.problems:
        found.append("the summary claims a pass and names problems")
    for said, want, differs in (
            (summary.requests_ok, decided.requests_ok,
             "the summary says {} requests ok; the records show {}"),
            (summary.requests_total, decided.requests_total,
             "the summary counts {} planned requests; the run record {}")):
        if said is not None and said != want:
            found.append(differs.format(said, want))
    said = summary.shape and summary.shape.verdict
    judged = decided.shape.verdict if decided.shape else None
    if said != judged:
        found.append(f"the summary says the shape test's verdict is {show(said)}; its records "
                     f"show {show(judged)}")
    if summary.contract is True and decided.differences:
        found.append("the summary claims the contract's plan; the run record's plan "
                     "differs: " + "; ".join(decided.differences))
    return found


def last_verdict(path: str, run_id: str | None = None) -> dict | None:
    """The last run of a records file (of run `run_id` where given) judged, or None when
    the file cannot be read, or its last records belong to no run record (as the report
    says: its last attempt is not known)."""
    try:
        records, _ = load_records(path)
    except OSError:
        return None
    if run_id is not None:
        records = [r for r in records if r.get("run_id") == run_id]
    groups = split_runs(records)
    if not groups or not any(r["record"] == "run" for r in groups[-1]):
        return None
    return judge_run(groups[-1], repeated_run(groups[-1], groups))


def ready_from_records(path: str, records: str, run_id: str | None = None,
                       gate_records: str | None = None, server_pgid: int | None = None,
                       required: tuple = (), chunk_from: str = "") -> str | None:
    """The ready file written (by its one creator) from the verdict of a warm-up's records
    (of run `run_id` where given: a records file another run also writes to is not its
    pass) and, with --gate, the gate's, when it vouches for what is `required`
    (readyfile.unmet's: a plan digest, a chunk not assumed); None when written (or, with
    no path, when it would be), else why not. `chunk_from`: where start.sh found the
    WARMUP_CHUNK_TOKENS it gave the warm-up (the command, server.log, server.chunk)."""
    warm = last_verdict(records, run_id)
    gate = last_verdict(gate_records) if gate_records else None
    if warm is None or gate_records and gate is None:
        return f"cannot read a run in {clean_text(records if warm is None else gate_records, 200)}"
    gate_part = None if gate is None else {
        "verdict": gate.verdict, "records": gate_records,
        "run_id": gate.run.run_id if gate.run else None}
    doc, why = ready_of(warm.verdict, warm.records, records, gate_part, server_pgid)
    if doc and chunk_from and doc["chunk_source"] == "WARMUP_CHUNK_TOKENS":
        doc["chunk_source"] = chunk_from
    return why or unmet(doc, *required) or (write_ready(path, doc) if path else None)


# The exit statuses an ending read from a file may have: a file cannot give a failed run
# exit 0 (nor 2, report's own 'cannot be read').
ENDING_EXITS = {"fail": (EXIT_FAIL,), "refused": (EXIT_REFUSED,),
                "killed": (EXIT_TERMINATED, EXIT_INTERRUPTED, 129, EXIT_HARD_BOUND,
                           EXIT_HARD_KILLED)}


def ending_of(summary: dict | None, deadline) -> Ending | None:
    """How a summary says its run ended, as decide() takes it; None without a summary
    (the run was killed, or is still running). The summary's exit code is kept only where
    its verdict allows it (a failed run never exits 0), and its time is held against the
    run record's deadline (`deadline`), never the summary's own."""
    if summary is None:
        return None
    claimed, code = summary.verdict, summary.exit_code
    if claimed not in ENDINGS or not 0 <= code <= 255:
        return Ending("fail", EXIT_FAIL, ("the summary's verdict or exit code cannot be read",))
    shape_failed = claimed == "custom" and code == EXIT_FAIL and \
        summary.shape is not None and summary.shape.verdict == "fail"   # judged again
    if claimed in ("pass", "custom") and code != EXIT_PASS and not shape_failed:
        return Ending("fail", EXIT_FAIL, (f"the summary's verdict {claimed} and exit code "
                                          f"{code} disagree",))
    elapsed = summary.elapsed_s
    if claimed in ("pass", "custom") and (elapsed is None or deadline is None
                                          or elapsed > deadline or deadline > MAX_SECONDS):
        return Ending("fail", EXIT_FAIL, (f"the summary's elapsed_s {show(elapsed)} is not "
                                          f"within the run record's deadline_s "
                                          f"{show(deadline)}",))
    if claimed in ("pass", "custom"):
        return Ending()
    allowed = ENDING_EXITS[claimed]
    return Ending(claimed, code if code in allowed else allowed[0],
                  tuple(summary.problems))
