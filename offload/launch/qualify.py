#!/usr/bin/env python3
"""The coordinator's tools after a start: read records back, probe warmth, gate quality.

  qualify.py report FILE      what a records file shows, run by run (exit: the last run's)
  qualify.py probe ...        streamed requests timed to the first token, first round
                              against later rounds, per engine; every prompt new
  qualify.py gate ...         exact-copy probes (six identifiers, an English and a Russian
                              passage), alone and batched, greedy; exit 0 only if all pass

Needs warmup.py beside it (it reuses its HTTP, guard, batch and records code); warmup.py
never imports this file. Standard library only. The contract: CONTRACT.md beside this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import textwrap
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import warmup  # noqa: E402

PROG = "qualify.py"


# ---------------------------------------------------------------------------
# report: read a records file back (also one cut short by a kill, or holding several runs).
# ---------------------------------------------------------------------------

MAX_RECORD_LINE_BYTES = 1 << 20       # a longer line is a bad line, skipped unread
MAX_REPORT_BYTES = 16 << 20           # report reads no more of a file than this
MAX_RECORDS = 20000                   # nor keeps more records than this
READ_CHUNK_BYTES = 1 << 20
ISSUES_NAMED = 20                     # bad lines named one by one; the rest counted
SHOW_LIMIT = 80                       # one value in a table or a line
JSON_TEXT_LIMIT = 1000                # one string in report --json


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

    with warmup.open_regular(path) as handle:
        for number, line, ended in read_lines(handle):
            if number is None:
                notes.append(f"stopped reading after {MAX_REPORT_BYTES >> 20} MiB: the rest "
                             f"of the file is not shown")
                break
            last_ended = ended
            if line is None:
                note_bad(f"line {number} is longer than {MAX_RECORD_LINE_BYTES >> 20} MiB "
                         f"(skipped)")
                continue
            if not line.strip():
                continue
            record, why = warmup.decode_json(line)
            if why is not None:
                cut = "" if ended else ": the file ends there (cut short by a kill?)"
                note_bad(f"line {number} is not valid JSON{cut or ' (skipped)'}")
            elif not isinstance(record, dict) or not isinstance(record.get("record"), str):
                note_bad(f"line {number} is JSON but not a record (skipped)")
            elif budget[0] <= 0 or len(records) >= MAX_RECORDS:
                notes.append(f"stopped at line {number}: the records so far hold as many "
                             f"values as report keeps; the rest of the file is not shown")
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
    if isinstance(value, dict):
        if depth >= MAX_KEPT_DEPTH:
            return {}
        return {key: prune(item, budget, depth + 1)
                for key, item in list(value.items())[:MAX_CONTAINER_ITEMS]}
    if isinstance(value, list):
        if depth >= MAX_KEPT_DEPTH:
            return []
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


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    """A list field as a list: a lone string becomes one item, anything else nothing."""
    if isinstance(value, list):
        return value
    return [value] if isinstance(value, str) else []


def show(value, limit: int = SHOW_LIMIT) -> str:
    """Any value from a records file as one clean line: None is '-', never 'None'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return warmup.clean_text(repr(value), limit)
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)[:64 * limit]
    return warmup.clean_text(value, limit) or "-"


def known(value) -> str:
    """A value the run may not have learned: 'unknown' rather than '-' or 'None'."""
    return "unknown" if value is None else show(value)


def tidy(value, depth: int = 0):
    """A records value made safe for report --json: strings cleaned and cut."""
    if isinstance(value, str):
        return warmup.clean_text(value, JSON_TEXT_LIMIT)
    if isinstance(value, list):
        return [tidy(v, depth + 1) for v in value] if depth < 32 else None
    if isinstance(value, dict):
        return {warmup.clean_text(str(k), 100): tidy(v, depth + 1)
                for k, v in value.items()} if depth < 32 else None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def exit_status(value) -> int | None:
    """A summary's exit code as a process status; anything that is not one is a fail (1)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255:
        return value
    return warmup.EXIT_FAIL


PICKED = {
    "request": ("wave", "engine", "index", "request_id", "http_status", "prompt_tokens",
                "cached_tokens", "completion_tokens", "reasoning_tokens", "finish_reason",
                "stop_reason", "latency_s", "ok"),
    "wave": ("wave", "engine", "depth", "release_skew_ms", "duration_s", "ok"),
    "metrics": ("source", "state", "why", "highlights", "warnings"),
    "status": ("path", "state", "why", "delta"),
    "probe": ("item", "round", "engine", "index", "ttft_s", "total_s", "prompt_tokens",
              "cached_tokens", "ok"),
    "gate": ("shape", "probe", "kind", "engine", "index", "http_status", "finish_reason",
             "completion_tokens", "reasoning_tokens", "exact", "edit_distance",
             "reference_chars", "answer_chars", "cer", "removed", "ok"),
}


def build_run(records: list[dict]) -> dict:
    """One run as one object: plan, requests, waves, counters, probe, gate, summary, verdict."""
    by_kind: dict[str, list[dict]] = {}
    for record in records:
        by_kind.setdefault(record["record"], []).append(record)
    summary = (by_kind.get("summary") or [None])[-1]
    ends = "summary" if summary else (
        f"no summary: the file ends after a '{show(records[-1]['record'], 40)}' record (the "
        f"run was killed, or is still running)")
    if summary:
        problems = _list(summary.get("problems"))
    else:                             # cut short: name what failed before the cut
        problems = [f"{warmup.request_label(r)}: {p}"
                    for kind in ("request", "probe", "gate") for r in by_kind.get(kind, [])
                    if r.get("ok") is not True for p in _list(r.get("problems"))]

    def pick(kind: str) -> list[dict]:
        return [{k: r.get(k) for k in PICKED[kind]} for r in by_kind.get(kind, [])]

    return tidy({
        "run": (by_kind.get("run") or [None])[-1],
        "requests": pick("request"), "waves": pick("wave"), "metrics": pick("metrics"),
        "status": pick("status"), "probe": pick("probe"),
        "probe_summary": (by_kind.get("probe_summary") or [None])[-1],
        "gate": pick("gate"), "gate_summary": (by_kind.get("gate_summary") or [None])[-1],
        "summary": summary, "problems": problems,
        "verdict": summary.get("verdict") if summary else None,
        "exit_code": exit_status(summary.get("exit_code")) if summary else None,
        "ends": ends,
    })


def build_report(records: list[dict], issues: list[str]) -> dict:
    """A records file as one object: each run, the bad lines, and the last run's verdict."""
    runs = [build_run(group) for group in split_runs(records)]
    last = runs[-1] if runs else None
    exit_code = warmup.EXIT_FAIL if last is None or last["exit_code"] is None \
        else last["exit_code"]
    return {"runs": runs, "issues": tidy(issues),
            "verdict": last["verdict"] if last else None, "exit_code": exit_code,
            "ends": last["ends"] if last else "no records: the file holds no record"}


def run_header(run: dict) -> str:
    """The run record in one line: what ran, where, against which model and server."""
    plan = _dict(run.get("plan"))
    mode = run.get("mode")
    model = (f"model {known(run.get('model'))} "
             f"(server {known(_dict(run.get('versions')).get('server'))})")
    where = f"{show(run.get('run_id'))}: {show(run.get('base_url'))} {model}"
    engines = _list(run.get("engines")) if isinstance(run.get("engines"), list) else []
    where += f", engines {','.join(show(e) for e in engines)}" if engines else ""
    deadline = f"deadline {show(plan.get('deadline_s'))} s"
    if mode == "probe":
        items = ", ".join(show(_dict(i).get("item")) for i in _list(plan.get("items")))
        return (f"probe {where}, {show(plan.get('rounds'))} rounds of {items or '-'}, "
                f"{show(plan.get('requests_total'))} requests, {deadline}")
    if mode == "gate":
        return (f"gate {where}, endpoint {show(plan.get('endpoint'))}, "
                f"{show(plan.get('requests_total'))} requests, max CER "
                f"{show(plan.get('max_cer'))}, max_tokens {show(plan.get('max_tokens'))}, "
                f"{deadline}")
    waves = ",".join(show(_dict(w).get("wave")) for w in _list(plan.get("waves")))
    counted = plan.get("b1_prompt_tokens_counted")
    return (f"warm-up {where}, waves {waves or '-'}, {show(plan.get('requests_total'))} "
            f"requests, B1 {show(counted) if counted is not None else 'estimated'} tokens, "
            f"{deadline}")


def request_table(requests: list[dict]) -> list[str]:
    """The requests as an aligned table; an engine column only when some request has one."""
    columns = ["wave", "request_id", "http_status", "prompt_tokens", "cached_tokens",
               "completion_tokens", "finish_reason", "stop_reason", "latency_s", "ok"]
    heads = ["wave", "id", "status", "prompt", "cached", "completion", "finish", "stop",
             "latency", "ok"]
    if any(r.get("engine") is not None for r in requests):
        columns.insert(1, "engine")
        heads.insert(1, "engine")
    rows = [heads] + [[show(r.get(c)) for c in columns] for r in requests]
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def wave_text(wave: dict) -> str:
    where = show(wave.get("wave")) + ("" if wave.get("engine") is None
                                      else f" e{show(wave.get('engine'))}")
    return (f"{where:<4} depth {show(wave.get('depth'))}  skew "
            f"{show(wave.get('release_skew_ms'))} ms  {show(wave.get('duration_s'))} s  "
            f"{'ok' if wave.get('ok') is True else 'FAILED'}")


def format_run(run: dict) -> list[str]:
    """One run's lines, ending with its verdict line."""
    lines = [run_header(_dict(run["run"]))] if run["run"] else ["(no run record)"]
    if run["requests"]:
        lines += [""] + request_table(run["requests"])
    if run["waves"]:
        lines += [""] + [wave_text(w) for w in run["waves"]]
    for m in run["metrics"]:
        why = f": {show(m.get('why'), 200)}" if m.get("why") else ""
        lines += ["", f"counter deltas from {show(m.get('source'))} ({show(m.get('state'))}"
                      f"{why}):"]
        lines += [f"  {show(k, 160)} {show(v)}" for k, v in _dict(m.get("highlights")).items()]
        lines += [f"  warning: {show(w, 300)}" for w in _list(m.get("warnings"))]
    for st in run["status"]:
        why = f": {show(st.get('why'), 200)}" if st.get("why") else ""
        lines.append(f"status file {show(st.get('path'), 200)}: {show(st.get('state'))}{why}")
    if run["probe_summary"]:
        lines += ["", "probe (first round against the median of later rounds):"]
        lines += [probe_line(_dict(i)) for i in _list(_dict(run["probe_summary"]).get("items"))]
    if run["gate"]:
        lines += ["", "gate (exact copies; counts and distances only):"]
        lines += [gate_line(_dict(r)) for r in run["gate"]]
    if run["gate_summary"]:
        lines.append(gate_summary_line(_dict(run["gate_summary"])))
    if run["problems"]:
        lines += ["", "problems:"] + [f"  - {show(p, 300)}" for p in run["problems"]]
    summary = _dict(run["summary"])
    lines += [f"note: {show(n, 300)}" for n in _list(summary.get("notes"))]
    lines += [f"warning: {show(w, 300)}" for w in _list(summary.get("warnings"))]
    lines.append(f"verdict: {show(run['verdict'])} (exit {run['exit_code']})" if run["summary"]
                 else f"verdict: none ({run['ends']})")
    return lines


def format_report(report: dict) -> str:
    """The whole file for a terminal: bad lines first, then each run, the last run last."""
    lines = [f"note: {show(issue, 300)}" for issue in report["issues"]]
    runs = report["runs"]
    if not runs:
        lines.append(f"verdict: none ({report['ends']})")
    for number, run in enumerate(runs, 1):
        if len(runs) > 1:
            lines += ["", f"== run {number} of {len(runs)} =="]
        lines += format_run(run)
    if len(runs) > 1:
        lines.append(f"(the file holds {len(runs)} runs; the exit status is the last run's)")
    return "\n".join(lines).lstrip("\n")


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG + " report",
        description="Print a readable report of a records file (warm-up, probe or gate), run "
                    "by run; also a file cut short by a kill, holding several runs, or with "
                    "damaged lines (skipped and named). Exit status: the last run's own (0 "
                    "pass), 1 when it has no summary or the file no record, 2 when the file "
                    "cannot be read.")
    parser.add_argument("records", help="the JSON Lines records file")
    parser.add_argument("--json", action="store_true",
                        help="the report as one JSON object: runs (each with its run, requests, "
                             "waves, metrics, status, probe, probe_summary, gate, summary, "
                             "problems, verdict, exit_code, ends), issues, and the last run's "
                             "verdict and exit_code")
    args = parser.parse_args(argv)
    try:
        records, issues = load_records(args.records)
    except OSError as exc:
        warmup.emit(f"{PROG} report: cannot read {show(args.records, 200)}: "
                    f"{exc.strerror or type(exc).__name__}; give the path of a records file",
                    sys.stderr)
        return warmup.EXIT_USAGE
    report = build_report(records, issues)
    warmup.emit(json.dumps(report, indent=2) if args.json else format_report(report))
    return report["exit_code"]


# ---------------------------------------------------------------------------
# probe: time to first token, first round against later rounds (did the warm-up work?).
# Every prompt is new (a nonce first), so a later round is never a prefix-cache hit.
# ---------------------------------------------------------------------------

PROBE_ITEMS = (("single", 1), ("burst3", 3), ("burst4", 4))
def probe_body(model: str, prompt: str, rid: str, plan: warmup.Plan) -> dict:
    """A warm-up request, streamed with usage in the last event (the text is never kept)."""
    return dict(warmup.completion_body(model, prompt, rid, plan), stream=True,
                stream_options={"include_usage": True})


def stream_usage(body: bytes) -> tuple[dict | None, bool]:
    """(the last usage object, whether the stream ended with [DONE]) of an SSE body."""
    usage, done = None, False
    for line in body.split(b"\n"):
        line = line.strip()
        if line == b"data: [DONE]":
            done = True
        elif line.startswith(b"data: {") and b'"usage"' in line:
            doc, _ = warmup.decode_json(line[6:])
            if isinstance(doc, dict) and isinstance(doc.get("usage"), dict):
                usage = doc["usage"]
    return usage, done


def probe_record(run: warmup.Run, item: str, round_no: int, slot: warmup.Slot) -> dict:
    """One streamed request: when its first token and its end came; counts only, no text."""
    timing, usage = warmup.slot_timing(slot), None
    response, tokens = slot.response, run.settings.plan.tokens
    problems = []
    if response is None:
        problems.append(timing["transport_error"])
    elif response.status != 200:
        fields = warmup.extract_fields(response.status, response.body, run.redact)
        problems.append(warmup.diagnose_http_error(response.status, fields["error"],
                                                   fields["error_param"],
                                                   run.settings.api_key_env,
                                                   bool(run.settings.api_key)))
    else:
        usage, done = stream_usage(response.body)
        if not done:
            problems.append("stream did not end with [DONE]")
        if usage is None:
            problems.append("stream carried no usage")
        if response.watched_at is None:
            problems.append("no token text arrived")
    counts, bad_counts = warmup.read_usage(usage, run.redact)
    problems += bad_counts
    if usage is not None and counts["completion_tokens"] != tokens \
            and not any(p.startswith("usage completion_tokens") for p in bad_counts):
        problems.append(f"completion_tokens {show(counts['completion_tokens'])}, expected "
                        f"{tokens}")
    sent = slot.sent_at
    first = response.watched_at if response is not None else None
    return {
        "record": "probe", "run_id": run.settings.plan.run_id, "item": item, "round": round_no,
        "index": slot.index, "engine": slot.engine, "request_id": slot.request_id,
        "http_status": timing["http_status"],
        "ttft_s": round(first - sent, 4) if first is not None and sent is not None else None,
        "total_s": timing["latency_s"],
        "prompt_tokens": counts["prompt_tokens"],
        "cached_tokens": counts["cached_tokens"],
        "completion_tokens": counts["completion_tokens"],
        "ok": not problems,
        "problems": [warmup.clean_text(p, warmup.PROBLEM_LIMIT) for p in problems],
    }


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _slowest(values: list) -> float | None:
    """A burst is as slow as its slowest request; a missing time makes the round unknown."""
    values = [warmup.finite_number(v) for v in values]
    return None if not values or None in values else max(values)


def _served_from_cache(records: list[dict]) -> int:
    """The most cached prompt tokens any request of a round reported (0: none, or unknown)."""
    return max((r.get("cached_tokens") for r in records
                if isinstance(r.get("cached_tokens"), int)
                and not isinstance(r.get("cached_tokens"), bool)), default=0)


def probe_summary(records: list[dict]) -> list[dict]:
    """Per item and engine: round 1 against the median of later rounds (each round: its
    slowest request), for TTFT and total; a ratio, never a verdict. A round served from
    the prefix cache (cached_tokens > 0) would look like warmth: it is named and left out."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for r in records:
        key = (r.get("item"), r.get("engine"))
        groups.setdefault(key, {}).setdefault(r.get("round"), []).append(r)
    items = []
    for (item, engine), rounds in groups.items():
        cached = sorted(n for n, rs in rounds.items() if _served_from_cache(rs) > 0)
        per_round = {n: (_slowest([r.get("ttft_s") for r in rs]),
                         _slowest([r.get("total_s") for r in rs]))
                     for n, rs in rounds.items() if n not in cached}
        first = per_round.get(1, (None, None))
        later = [v for n, v in per_round.items() if isinstance(n, int) and n > 1]
        entry = {"item": item, "engine": engine, "rounds": len(rounds),
                 "cached_rounds": cached}
        for i, name in enumerate(("ttft", "total")):
            warm = _median([v[i] for v in later])
            entry[f"{name}_first_s"] = first[i]
            entry[f"{name}_later_median_s"] = warm
            entry[f"{name}_ratio"] = round(first[i] / warm, 2) if first[i] and warm else None
        items.append(entry)
    return items


def probe_line(entry: dict) -> str:
    """One item (on one engine) in a line; any value from a file goes through show()."""
    def ms(v):
        v = warmup.finite_number(v)
        return "-" if v is None else f"{v * 1000:.0f} ms"
    where = show(entry.get("item")) + ("" if entry.get("engine") is None
                                       else f" e{show(entry.get('engine'))}")
    line = (f"  {where:<7} TTFT first {ms(entry.get('ttft_first_s'))} vs later "
            f"{ms(entry.get('ttft_later_median_s'))} (x{show(entry.get('ttft_ratio'))}); total "
            f"first {ms(entry.get('total_first_s'))} vs later "
            f"{ms(entry.get('total_later_median_s'))} (x{show(entry.get('total_ratio'))})")
    cached = _list(entry.get("cached_rounds"))
    if cached:
        line += (f"; round {', '.join(show(n) for n in cached)} served from the prefix cache, "
                 f"left out")
    return line


def fresh_long_prompt(sized: str) -> str:
    """The sized long prompt under a new nonce: the same length, no cached prefix."""
    return "warmup-" + os.urandom(12).hex() + " " + sized.split(" ", 1)[-1]


def probe_prompt_for(run: warmup.Run, item: str, depth: int, round_no: int, index: int,
                     engine: int | None) -> str:
    """A prompt no earlier request sent: a nonce (or a per-request tag) first."""
    if item == "long":
        return fresh_long_prompt(run.server.b1_prompts[engine])
    seed = f"{run.settings.plan.run_id}-{engine}-{item}-r{round_no}-{os.urandom(4).hex()}"
    return warmup.make_short_prompt(seed, depth, index)


def run_probe(run: warmup.Run, rounds: int, long_tokens: int) -> list[dict]:
    """Rounds of single, burst3, burst4 (and long); each behind the guard, like a wave."""
    plan, server = run.settings.plan, run.server
    records = []
    for round_no in range(1, rounds + 1):
        for item, depth in probe_items(long_tokens):
            label = f"{item} round {round_no}"
            if run.clock.remaining() <= 0:
                run.outcome.problems.append(f"deadline passed before {label}")
                return records
            slots = []
            for engine in warmup.engines_of(run):
                for index in range(depth):
                    where = "" if engine is None else f"e{engine}-"
                    rid = f"probe-{plan.run_id}-{where}{item}-r{round_no}-{index}"
                    prompt = probe_prompt_for(run, item, depth, round_no, index, engine)
                    slots.append(warmup.make_slot(run, index, rid, engine,
                                                  probe_body(server.model, prompt, rid, plan),
                                                  stream=True))
            finished = warmup.guarded_batch(run, label, slots, first=not records)
            if finished is None:
                return records
            for slot in finished:
                record = probe_record(run, item, round_no, slot)
                run.write(record)
                records.append(record)
    return records


def probe_items(long_tokens: int) -> list[tuple[str, int]]:
    return list(PROBE_ITEMS) + ([("long", 1)] if long_tokens else [])


def probe_main(argv: list[str]) -> int:
    """qualify.py probe: the same connection options, guards, bounds and records as the
    warm-up."""
    parser = build_probe_parser()
    args = warmup.parse_or_explain(parser, argv)
    if args.long_tokens and args.long_tokens < warmup.MIN_B1_PROMPT_TOKENS:
        parser.error(f"--long-tokens must be more than {warmup.MIN_B1_PROMPT_TOKENS - 1}")
    plan = warmup.Plan(run_id=warmup.new_run_id(), waves=(1,), tokens=args.tokens,
                       priority=args.priority,
                       b1_tokens=max(args.long_tokens, warmup.MIN_B1_PROMPT_TOKENS),
                       deadline_s=args.deadline_s, socket_cap_s=args.socket_cap_s)
    items = probe_items(args.long_tokens)
    planned_per_engine = args.rounds * sum(depth for _, depth in items)
    plan_record = {"items": [{"item": i, "depth": d} for i, d in items],
                   "rounds": args.rounds, "requests_total": planned_per_engine,
                   "long_tokens": args.long_tokens or None, "tokens": plan.tokens,
                   "priority": plan.priority, "stream": True, "prompts": "new every request",
                   "deadline_s": plan.deadline_s, "socket_cap_s": plan.socket_cap_s}
    settings = warmup.common_settings(parser, args, plan, PROG + " probe", mode="probe",
                                      plan_record=plan_record, planned=planned_per_engine)
    if args.dry_run:
        long = f", long ({args.long_tokens} tokens)" if args.long_tokens else ""
        print(f"probe plan for {settings.target.display}: {args.rounds} rounds of single, "
              f"burst3, burst4{long}; streaming, {plan.tokens} tokens each, every prompt new; "
              f"deadline "
              f"{plan.deadline_s:g} s")
        return warmup.EXIT_PASS
    return warmup.run_session(settings, lambda run: execute_probe(run, args,
                                                                  planned_per_engine))


def execute_probe(run: warmup.Run, args: argparse.Namespace, planned_per_engine: int) -> None:
    warmup.learn_server(run, size_b1=bool(args.long_tokens))
    run.settings = dataclasses.replace(
        run.settings, planned=planned_per_engine * len(warmup.engines_of(run)))
    warmup.write_run_record(run)
    run.say(f"probe {run.settings.plan.run_id}: {run.settings.target.display} model "
            f"{warmup.clean_text(run.server.model or '', 80)}, {args.rounds} rounds, deadline "
            f"{run.settings.plan.deadline_s:g} s")
    records = run_probe(run, args.rounds, args.long_tokens)
    run.outcome.requests = records    # judged like warm-up requests: every one must be ok
    items = probe_summary(records)
    run.write({"record": "probe_summary", "run_id": run.settings.plan.run_id, "items": items,
               "meaning": "first round against the median of later rounds; a ratio, "
                          "not a verdict on the warm-up; rounds served from the prefix "
                          "cache are left out"})
    run.outcome.summary_extra["probe"] = items
    if records and all(r["cached_tokens"] is None for r in records if r["http_status"] == 200):
        run.outcome.notes.append("cache check not made: the server does not report cached "
                                 "tokens (start it with --enable-prompt-tokens-details)")
    for entry in items:
        if entry["cached_rounds"]:
            where = "" if entry["engine"] is None else f" on engine {entry['engine']}"
            run.outcome.notes.append(
                f"{entry['item']}{where}: round {', '.join(map(str, entry['cached_rounds']))} "
                f"served from the prefix cache (cached_tokens > 0): left out of the ratios")
    run.say("probe (first round against the median of later rounds):")
    for entry in items:
        run.say(probe_line(entry))


def build_probe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG + " probe", epilog=PROBE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
                    "Did the warm-up work? Measure time to first token and total time with "
                    "streamed completions: a single request, a burst of 3 and a burst of 4 "
                    "(and a long prompt), repeated --rounds times, on every engine; report the "
                    "first round against the median of the later ones, per engine. Every "
                    "prompt is new (a nonce first), so a later round is not a prefix-cache "
                    "hit; cached tokens are recorded and a round served from the cache is "
                    "named and left out. A ratio, never a verdict.", 79))
    warmup.add_connection_options(parser)
    parser.add_argument("--tokens", metavar="N", type=warmup.whole(2, 4096), default=32,
                        help="completion tokens per request (default: %(default)s)")
    parser.add_argument("--priority", metavar="N", type=warmup.whole(-(1 << 31), (1 << 31) - 1),
                        default=20, help="request priority (default: %(default)s)")
    parser.add_argument("--rounds", metavar="N", type=warmup.whole(2, 100), default=3,
                        help="rounds of single, burst3, burst4 (default: %(default)s)")
    parser.add_argument("--long-tokens", type=warmup.whole(0, warmup.MAX_B1_TOKENS), default=0,
                        metavar="N",
                        help="also a long request of N prompt tokens (more than 4096), "
                             "sized once with /tokenize, a new nonce every round "
                             "(default: none)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and exit 0 without touching the network")
    return parser


# ---------------------------------------------------------------------------
# gate: can the model copy text exactly? Six identifiers and two passages, alone and in
# one batch, greedy; scored in memory; records keep counts and distances, never text.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    name: str
    kind: str                         # "identifier" or "passage"
    reference: str


# Our own text, written for this gate. Identifiers of the kinds operators type: mixed
# case, digits and - _ . / : (a model repo id, a config key, a hex digest, a path, a
# version tag, a flag).
IDENTIFIERS = (
    ("id_repo", "Gullpoint-Labs/Ferry-7B_Instruct.v2"),
    ("id_config_key", "ferry.tideTable.max_depth_cm:420"),
    ("id_digest", "sha256:7c41e0b9d2a35f68c09e1b74a2d8f3c6"),
    ("id_path", "/srv/gullpoint/ckpt/run-0419_B/shard-003.safetensors"),
    ("id_version", "v2.14.0-rc.3+build.7f3a9c"),
    ("id_flag", "--rope-scaling=yarn:factor_4.0"),
)

PASSAGE_EN = """\
The weather station on Gull Point was built in the spring of a dry year, when the road \
from the village still ended at the old quarry. Two engineers carried the first \
instruments up the hill by hand: a wind vane, a rain gauge with a copper funnel, and a \
thermometer screen painted white so that the sun would not warm the air inside it. For \
the first month they slept in a tent beside the mast and wrote every reading twice, once \
in a paper log and once on a card that went down to the village with the baker's van.

The readings were plain numbers, but the engineers learned to trust them only after they \
had been checked. A gust of wind could shake the vane loose; a spider could build its web \
across the funnel; a careless visitor could lean on the screen and leave it tilted toward \
the south. Each morning began with a walk around the mast, a look at every joint and \
screw, and a short note about anything that had changed during the night.

Years later the station was given a small computer, a solar panel and a radio link to the \
city. The paper log was kept anyway. The new system sent its figures every ten minutes, \
and most days they agreed with the old instruments to the last decimal place. On the days \
they did not, someone climbed the hill to find out why, and usually the answer was \
ordinary: a loose cable, a battery that had grown tired in the cold, a bird that had \
chosen the warmest corner of the roof.

Visitors sometimes asked why anyone still bothered to copy numbers by hand. The answer \
written on the first page of the log was short: a record is only useful if you can tell \
when it is wrong, and the only way to know is to compare it with something you trust."""

PASSAGE_RU = """\
Паром через северную реку ходит с середины мая до первых заморозков. Утром, когда над \
водой ещё стоит туман, паромщик проверяет трос, смазывает блоки и записывает в тетрадь \
уровень реки по старой рейке у причала. Эту тетрадь завели задолго до него, и в ней можно \
найти записи о половодьях, о сухих годах и о том дне, когда лёд сошёл на две недели \
раньше обычного.

Первые пассажиры приезжают к семи часам: почтальон на велосипеде, фермер с молоком для \
сыроварни, учительница, которая живёт на одном берегу, а работает на другом. Переправа \
занимает двенадцать минут, если ветер спокойный, и почти двадцать, если он дует против \
течения. За это время люди успевают обменяться новостями, договориться о ремонте крыши \
или просто помолчать, глядя на воду.

Несколько лет назад на пароме поставили датчики, которые сами измеряют глубину, скорость \
течения и температуру воды. Данные уходят по радио в районный центр, и там по ним \
составляют прогноз для рыбаков и речников. Паромщик всё равно продолжает вести тетрадь. \
Он говорит, что прибор может ошибиться так же, как человек, только об ошибке прибора \
никто не узнает, если её не с чем сравнить.

Однажды осенью датчик показал, что уровень реки за ночь упал почти на метр. В районе уже \
готовили предупреждение о мели, но паромщик спустился к рейке и увидел, что вода стоит \
там же, где вчера. Оказалось, что на датчик налипли листья и ил. Его почистили, и цифры \
снова совпали с тетрадью.

С тех пор в районном центре каждую неделю сверяют показания датчиков с записями \
паромщика. Эта простая проверка занимает несколько минут и не раз помогала найти \
неисправность раньше, чем она становилась бедой.

Зимой, когда паром стоит на берегу, тетрадь хранится в доме паромщика на полке рядом с \
картами реки. Весной он первым делом открывает её на чистой странице, пишет дату и снова \
идёт к рейке, чтобы посмотреть, как высоко поднялась вода."""

PROBES = tuple(Probe(name, "identifier", text) for name, text in IDENTIFIERS) + (
    Probe("passage_en", "passage", PASSAGE_EN),
    Probe("passage_ru", "passage", PASSAGE_RU),
)
SHAPES = ("alone", "batched")
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
COPY_OPEN, COPY_CLOSE = "<text>", "</text>"
INSTRUCTION = (f"Reply with exactly the text between {COPY_OPEN} and {COPY_CLOSE}, character "
               f"for character, and nothing else: no quotes, no tags, no comments.")
GATE_SEED = 20240601
GATE_MAX_TOKENS = 2048
GATE_MAX_CER = 0.01
INTRO_LINE_LIMIT = 120                # a longer first line is not "only an introduction"
THINKING_OFF = '{"enable_thinking": false}'


def gate_prompt(reference: str, endpoint: str) -> str:
    """The instruction and the text between markers; a raw completion ends inside the
    opening marker, so a base model continues with the copy (and stops at the close)."""
    prompt = f"{INSTRUCTION}\n{COPY_OPEN}\n{reference}\n{COPY_CLOSE}"
    if endpoint == "completions":
        prompt += f"\n\nThe exact copy:\n{COPY_OPEN}\n"
    return prompt


def gate_body(model: str, probe: Probe, rid: str, endpoint: str, max_tokens: int,
              template_kwargs: dict | None) -> dict:
    """One probe request: greedy, a fixed seed, not streamed; chat or raw completion."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "seed": GATE_SEED,
            "stream": False, "request_id": rid}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": gate_prompt(probe.reference, "chat")}]
        if template_kwargs is not None:
            body["chat_template_kwargs"] = template_kwargs
    else:
        body["prompt"] = gate_prompt(probe.reference, "completions")
        body["stop"] = [COPY_CLOSE]
    return body


# -- scoring: pure functions ------------------------------------------------

_FENCE_OPEN = re.compile(r"```[\w+.-]*[ \t]*")
_QUOTES = ("\"", "'", "`")


def unwrap(answer: str) -> tuple[str, list[str]]:
    """Remove what chat models wrap around a faithful answer and is not garbling: a first
    line that only introduces it and ends with a colon, a surrounding code fence.

    Returns the answer and the names of what was removed (never the removed text).
    """
    removed = []
    text = answer.strip()
    for _ in range(2):                          # "Here it is:" then a fence, or the reverse
        first, newline, rest = text.partition("\n")
        if newline and rest.strip() and first.rstrip().endswith(":") \
                and len(first) <= INTRO_LINE_LIMIT and "intro line" not in removed:
            removed.append("intro line")
            text = rest.strip()
            continue
        lines = text.split("\n")
        if len(lines) >= 3 and _FENCE_OPEN.fullmatch(lines[0].strip()) \
                and lines[-1].strip() == "```" and "code fence" not in removed:
            removed.append("code fence")
            text = "\n".join(lines[1:-1]).strip()
            continue
        break
    return text, removed


def clean_identifier(answer: str) -> str:
    """An identifier answer without surrounding whitespace, one pair of surrounding quotes
    or backticks, and a trailing period (outside or inside the quotes, once)."""
    text = answer.strip()
    period = text.endswith(".")
    if period:
        text = text[:-1].rstrip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in _QUOTES:
        text = text[1:-1]
    if not period and text.endswith("."):
        text = text[:-1]
    return text


def collapse(text: str) -> str:
    """Runs of whitespace as one space, none at the ends."""
    return " ".join(text.split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions), exact, in O(len(a)) big-integer
    steps: Myers' bit-parallel algorithm (Hyyrö's formulation); 2,000 x 2,000 in ms."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    m = len(b)
    peq: dict[str, int] = {}
    for i, ch in enumerate(b):
        peq[ch] = peq.get(ch, 0) | (1 << i)
    full, top = (1 << m) - 1, 1 << (m - 1)
    pv, mv, score = full, 0, m
    for ch in a:
        eq = peq.get(ch, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & top:
            score += 1
        elif mh & top:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


def score_answer(probe: Probe, answer: str, max_cer: float) -> dict:
    """The answer against the reference: counts and distances only, never the text.

    Identifiers: exact after clean_identifier. Passages: character error rate (edit
    distance / reference length, whitespace collapsed in both) at most `max_cer`.
    """
    text, removed = unwrap(answer)
    if probe.kind == "identifier":
        got, want = clean_identifier(text), probe.reference
    else:
        got, want = collapse(text), collapse(probe.reference)
    distance = levenshtein(got, want)
    cer = round(distance / len(want), 6)
    exact = got == want
    ok = exact if probe.kind == "identifier" else cer <= max_cer
    return {"exact": exact if probe.kind == "identifier" else None, "edit_distance": distance,
            "reference_chars": len(want), "answer_chars": len(got), "cer": cer,
            "removed": removed, "ok": ok, "empty": not got}


def score_problem(probe: Probe, score: dict, max_cer: float) -> str | None:
    """Why a scored answer failed, in figures; None when it passed."""
    if score["ok"]:
        return None
    figures = (f"edit distance {score['edit_distance']} of {score['reference_chars']} "
               f"characters")
    if score["empty"]:
        return f"empty answer ({figures})"
    if probe.kind == "identifier":
        return f"not an exact copy ({figures})"
    return f"CER {score['cer']:.4f} above {max_cer:g} ({figures})"


# -- one response -> one record ---------------------------------------------

GATE_WORDS = frozenset(w.lower() for probe in PROBES
                       for w in re.findall(r"\w+", probe.reference))
_ANY_WORD = re.compile(r"\w+")


def scrub_probe_text(text: str | None) -> str | None:
    """A server's message without our probes' text: an identifier, or a run of three or
    more of the passages' words, becomes [probe text]."""
    if not text:
        return text
    for name, identifier in IDENTIFIERS:
        text = text.replace(identifier, "[probe text]")
    words = list(_ANY_WORD.finditer(text))
    spans, run = [], []
    for match in words + [None]:
        if match is not None and match.group().lower() in GATE_WORDS:
            run.append(match)
            continue
        if len(run) >= 3:
            spans.append((run[0].start(), run[-1].end()))
        run = []
    for start, end in reversed(spans):
        text = text[:start] + "[probe text]" + text[end:]
    return text


def read_answer(body: bytes, endpoint: str) -> tuple[str | None, bool, str | None]:
    """(the answer, whether a reasoning part came with it, a problem) of a 200 body.

    The answer is message.content (chat) or text (completions); a reasoning part is not
    the answer. The text stays in memory: the caller scores it and drops it.
    """
    doc, why = warmup.decode_json(body)
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if why is not None or not isinstance(choices, list) or not choices \
            or not isinstance(choices[0], dict):
        return None, False, (f"{why} in the response body" if why
                             else "response has no choices")
    choice = choices[0]
    if endpoint == "chat":
        message = choice.get("message")
        if not isinstance(message, dict):
            return None, False, "response choice has no message"
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        content = message.get("content")
        has_reasoning = isinstance(reasoning, str) and bool(reasoning.strip())
        if content is None:
            return "", has_reasoning, None
        if not isinstance(content, str):
            return None, has_reasoning, "message.content is not text"
        return content, has_reasoning, None
    text = choice.get("text")
    if not isinstance(text, str):
        return None, False, "response choice has no text"
    return text, False, None


def diagnose_gate_error(status: int, message: str | None, param: str | None,
                        settings: warmup.Settings, endpoint: str) -> str:
    """Why a probe request was refused, and what to do about it."""
    text = f"{message or ''} {param or ''}".lower()
    said = f": {message}" if message else ""
    if status == 400 and endpoint == "chat" and ("template" in text or "chat_template" in text):
        return (f"the server could not apply its chat template (HTTP 400): for a base model "
                f"run the gate with --endpoint completions; otherwise check "
                f"--chat-template-kwargs, or start the server with --chat-template FILE{said}")
    if status == 400 and ("context length" in text or "input_tokens" in text
                          or "max_tokens" in text):
        return (f"a probe does not fit the model's context (its prompt plus --max-tokens must "
                f"not exceed max_model_len; lower --max-tokens) (HTTP 400){said}")
    if status == 404:
        return (f"HTTP 404: the server has no {ENDPOINTS[endpoint]} (a base model without a "
                f"chat endpoint? try --endpoint completions; is --base-url the server "
                f"itself?){said}")
    return warmup.diagnose_http_error(status, message, param, settings.api_key_env,
                                      bool(settings.api_key))


def exhausted_problem(reasoning_tokens: int | None, max_tokens: int) -> str:
    spent = f"its {reasoning_tokens} " if reasoning_tokens is not None else "its "
    return (f"empty answer: the model spent {spent}completion tokens on reasoning and ran "
            f"out (finish_reason length); raise --max-tokens (now {max_tokens}) or turn its "
            f"thinking off, e.g. --chat-template-kwargs '{THINKING_OFF}'")


def gate_record(run: warmup.Run, probe: Probe, index: int, shape: str, slot: warmup.Slot,
                options: "GateOptions") -> dict:
    """One probe's response scored: counts, distances and reasons; the answer is dropped."""
    timing = warmup.slot_timing(slot)
    response = slot.response
    fields: dict = {}
    score, problems = None, []
    if response is None:
        problems.append(timing["transport_error"])
    else:
        fields = warmup.extract_fields(response.status, response.body, run.redact)
        if response.status != 200:
            problems.append(diagnose_gate_error(
                response.status, scrub_probe_text(fields["error"]),
                scrub_probe_text(fields["error_param"]), run.settings, options.endpoint))
        else:
            answer, reasoned, why = read_answer(response.body, options.endpoint)
            problems += fields["usage_problems"]
            if why is not None:
                problems.append(why)
            else:
                score = score_answer(probe, answer, options.max_cer)
                finish = fields["finish_reason"]
                if score["empty"] and finish == "length" and \
                        (reasoned or fields["reasoning_tokens"]):
                    problems.append(exhausted_problem(fields["reasoning_tokens"],
                                                      options.max_tokens))
                else:
                    problem = score_problem(probe, score, options.max_cer)
                    if problem and finish == "length":
                        problem += (f"; the answer was cut at --max-tokens "
                                    f"{options.max_tokens} (finish_reason length)")
                    problems += [problem] if problem else []
            del answer                    # the text goes no further than this function
    score = score or {}
    return {
        "record": "gate", "run_id": run.settings.plan.run_id, "request_id": slot.request_id,
        "probe": probe.name, "kind": probe.kind,
        "shape": shape, "index": index, "engine": slot.engine,
        "http_status": timing["http_status"],
        "finish_reason": fields.get("finish_reason"),
        "completion_tokens": fields.get("completion_tokens"),
        "reasoning_tokens": fields.get("reasoning_tokens"),
        "exact": score.get("exact"), "edit_distance": score.get("edit_distance"),
        "reference_chars": score.get("reference_chars", len(probe.reference)),
        "answer_chars": score.get("answer_chars"), "cer": score.get("cer"),
        "removed": score.get("removed", []),
        "latency_s": timing["latency_s"], "sent_at_s": timing["sent_at_s"],
        "ok": not problems,
        "problems": [warmup.clean_text(p, warmup.PROBLEM_LIMIT, run.redact) for p in problems],
    }


def gate_line(record: dict) -> str:
    """One probe and shape in a line, figures only; any value from a file through show()."""
    where = f"{show(record.get('shape')):<7} {show(record.get('probe')):<13}"
    if record.get("engine") is not None:
        where = f"e{show(record.get('engine'))} " + where
    if record.get("kind") == "identifier":
        figure = "exact" if record.get("exact") is True else (
            f"MISS (distance {show(record.get('edit_distance'))})")
    else:
        cer = warmup.finite_number(record.get("cer"))
        figure = (f"CER {cer:.4f} ({show(record.get('edit_distance'))}/"
                  f"{show(record.get('reference_chars'))})" if cer is not None else "CER -")
    tokens = f"{show(record.get('completion_tokens'))} tokens"
    if record.get("reasoning_tokens") is not None:
        tokens += f" ({show(record.get('reasoning_tokens'))} reasoning)"
    removed = _list(record.get("removed"))
    line = (f"  {where} {figure:<20} finish {show(record.get('finish_reason'))}  {tokens}"
            f"{'  removed ' + ', '.join(show(r) for r in removed) if removed else ''}  "
            f"{'ok' if record.get('ok') is True else 'FAILED'}")
    if record.get("ok") is not True:
        line += "".join(f"\n      {show(p, 300)}" for p in _list(record.get("problems")))
    return line


def gate_summary_line(summary: dict) -> str:
    exact = _dict(summary.get("identifiers_exact"))
    worst = warmup.finite_number(summary.get("worst_cer"))
    return (f"gate: {show(summary.get('verdict'))}; identifiers exact: alone "
            f"{show(exact.get('alone'))}, batched {show(exact.get('batched'))}; worst passage "
            f"CER {'-' if worst is None else f'{worst:.4f}'} (bound "
            f"{show(summary.get('max_cer'))})")


# -- the run ---------------------------------------------------------------

@dataclass(frozen=True)
class GateOptions:
    endpoint: str
    max_tokens: int
    max_cer: float
    template_kwargs: dict | None


def gate_figures(records: list[dict], engines: int) -> dict:
    """The gate's figures over its records: identifiers exact per shape, the worst CER."""
    exact = {}
    for shape in SHAPES:
        hits = sum(1 for r in records if r["shape"] == shape and r["exact"] is True)
        exact[shape] = f"{hits}/{len(IDENTIFIERS) * engines}"
    cers = [r["cer"] for r in records if r["kind"] == "passage" and r["cer"] is not None]
    passages = [r for r in records if r["kind"] == "passage"]
    return {"identifiers_exact": exact, "worst_cer": max(cers) if cers else None,
            "passages_ok": f"{sum(r['ok'] for r in passages)}/"
                           f"{len(SHAPES) * 2 * engines}"}


def gate_batch(run: warmup.Run, shape: str, probes: list[tuple[int, Probe]], first: bool,
               options: GateOptions) -> bool:
    """Send these probes together (on every engine), score and record them; False when
    refused by the guard or the deadline."""
    plan, server = run.settings.plan, run.server
    label = f"gate {shape}" + (f" {probes[0][1].name}" if len(probes) == 1 else "")
    if run.clock.remaining() <= 0:
        run.outcome.problems.append(f"deadline passed before {label}")
        return False
    slots, which = [], {}
    for engine in warmup.engines_of(run):
        for index, probe in probes:
            where = "" if engine is None else f"e{engine}-"
            rid = f"gate-{plan.run_id}-{where}{shape}-{probe.name}"
            body = gate_body(server.model, probe, rid, options.endpoint, options.max_tokens,
                             options.template_kwargs)
            slots.append(warmup.make_slot(run, index, rid, engine, body,
                                          path=ENDPOINTS[options.endpoint]))
            which[rid] = probe
    finished = warmup.guarded_batch(run, label, slots, first=first)
    if finished is None:
        return False
    for slot in finished:
        record = gate_record(run, which[slot.request_id], slot.index, shape, slot, options)
        run.write(record)
        run.outcome.requests.append(record)
        run.say(gate_line(record))
    return True


def execute_gate(run: warmup.Run, options: GateOptions) -> None:
    """Every probe alone (one after another), then all together in one batch."""
    warmup.learn_server(run, size_b1=False)
    engines = len(warmup.engines_of(run))
    run.settings = dataclasses.replace(run.settings,
                                       planned=len(PROBES) * len(SHAPES) * engines)
    warmup.write_run_record(run)
    run.say(f"gate {run.settings.plan.run_id}: {run.settings.target.display} model "
            f"{warmup.clean_text(run.server.model or '', 80)}, endpoint {options.endpoint}, "
            f"{len(PROBES)} probes alone then batched, max CER {options.max_cer:g}, deadline "
            f"{run.settings.plan.deadline_s:g} s")
    try:
        for position, (index, probe) in enumerate(enumerate(PROBES)):
            if not gate_batch(run, "alone", [(index, probe)], position == 0, options):
                return
        gate_batch(run, "batched", list(enumerate(PROBES)), False, options)
    finally:
        run.outcome.summary_extra.update(gate_figures(run.outcome.requests, engines))


def gate_summary_record(summary: dict | None, run_id: str, options: GateOptions,
                        records_path: str | None, exit_code: int) -> dict:
    """The gate_summary: the run's own summary (verdict, exit code, problems) with the
    gate's figures, so the two always agree."""
    summary = summary or {}
    return {
        "record": "gate_summary", "run_id": run_id,
        "verdict": summary.get("verdict", "fail"),
        "exit_code": exit_status(summary["exit_code"]) if "exit_code" in summary
        else exit_code,
        "identifiers_exact": summary.get("identifiers_exact",
                                         {shape: f"0/{len(IDENTIFIERS)}" for shape in SHAPES}),
        "worst_cer": summary.get("worst_cer"), "passages_ok": summary.get("passages_ok"),
        "max_cer": options.max_cer, "endpoint": options.endpoint,
        "elapsed_s": summary.get("elapsed_s"),
        "problems": _list(summary.get("problems")) or
        ([] if summary else ["the run left no summary record (see stderr)"]),
        "records": records_path,
    }


def template_kwargs_type(text: str) -> dict:
    """An argparse type: a JSON object passed to the chat template."""
    doc, why = warmup.decode_json(text.encode("utf-8", "replace"))
    if why is not None or not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {THINKING_OFF}")
    return doc


def fraction(text: str) -> float:
    """An argparse type: a number from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}")
    return value


PROBE_EPILOG = warmup.ENVIRONMENT_HELP + """
exit status:
  0    every streamed request was answered completely (usage, [DONE], its tokens), in
       time; says nothing about warmth: the ratios are measurements, not a verdict
  1    a request failed, or late; 2 usage or configuration error; 3 refused by a guard;
  129/130/143  SIGHUP / SIGINT / SIGTERM: a 'killed' summary was written first
"""

GATE_EPILOG = """\
what it proves, and what it cannot:
  A model that garbles text (typos, swapped or dropped characters), a random or wrong
  model, a broken chat template, or a build that garbles only when requests are batched
  fails it. Passing it proves exact copying, nothing more: not answer quality, not
  reasoning, not speed. The answers are scored in memory; records keep counts and
  distances (edit distance, CER), never the answer or the reference text.

exit status: 0 pass, 1 fail, 2 usage or configuration error, 3 refused by a guard.
--json prints the gate_summary record on stdout as one JSON object: verdict, exit_code,
identifiers_exact ({"alone": "6/6", "batched": "6/6"}), worst_cer (a number or null),
problems; the human lines go to stderr.
"""


def build_gate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG + " gate", epilog=GATE_EPILOG + "\n" + warmup.ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
                    "The quality gate: can the served model copy text exactly? Six "
                    "identifiers (a repo id, a config key, a digest, a path, a version tag, "
                    "a flag) must come back exactly, and an English and a Russian passage of "
                    "about 300 words within a character error rate (--max-cer), each probe "
                    "once alone and once with all the others in one batch, greedy "
                    "(temperature 0, a fixed seed). Same connection options, API key, guards, "
                    "deadline and records as the warm-up.", 79))
    warmup.add_connection_options(parser)
    parser.set_defaults(deadline_s=175.0)   # within start.sh's 180 s hard bound for the gate
    for action in parser._actions:        # the gate prints its gate_summary, not the summary
        if action.dest == "json":
            action.help = ("print the gate_summary record as one JSON object on stdout (also "
                           "on a usage error); the human lines go to stderr")
    parser.add_argument("--endpoint", choices=tuple(ENDPOINTS), default="chat",
                        help="chat: /v1/chat/completions, the server's chat template applies, "
                             "as for real users; completions: raw /v1/completions, for base "
                             "models (default: %(default)s)")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", type=template_kwargs_type,
                        help=f"a JSON object passed to the chat template, e.g. "
                             f"'{THINKING_OFF}' to turn a model's thinking off")
    parser.add_argument("--max-tokens", metavar="N", type=warmup.whole(64, 65536),
                        default=GATE_MAX_TOKENS,
                        help="completion tokens each probe may use; raise it for reasoning "
                             "models (default: %(default)s)")
    parser.add_argument("--max-cer", metavar="F", type=fraction, default=GATE_MAX_CER,
                        help="the highest character error rate a passage may have "
                             "(default: %(default)g)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and exit 0 without touching the network")
    return parser


def gate_main(argv: list[str]) -> int:
    """qualify.py gate: every probe alone, then all in one batch; exit 0 only if all pass."""
    parser = build_gate_parser()
    args = warmup.parse_or_explain(parser, argv)
    if args.chat_template_kwargs is not None and args.endpoint != "chat":
        parser.error("--chat-template-kwargs needs --endpoint chat")
    options = GateOptions(args.endpoint, args.max_tokens, args.max_cer,
                          args.chat_template_kwargs)
    plan = warmup.Plan(run_id=warmup.new_run_id(), waves=(1,), tokens=args.max_tokens,
                       priority=0, b1_tokens=warmup.MIN_B1_PROMPT_TOKENS,
                       deadline_s=args.deadline_s, socket_cap_s=args.socket_cap_s)
    per_engine = len(PROBES) * len(SHAPES)
    plan_record = {
        "probes": [{"probe": p.name, "kind": p.kind, "reference_chars": len(collapse(p.reference))}
                   for p in PROBES],
        "shapes": list(SHAPES), "endpoint": args.endpoint, "path": ENDPOINTS[args.endpoint],
        "max_tokens": args.max_tokens, "max_cer": args.max_cer, "temperature": 0,
        "seed": GATE_SEED, "chat_template_kwargs": args.chat_template_kwargs,
        "requests_total": per_engine, "deadline_s": plan.deadline_s,
        "socket_cap_s": plan.socket_cap_s}
    settings = warmup.common_settings(parser, args, plan, PROG + " gate", mode="gate",
                                      plan_record=plan_record, planned=per_engine)
    if args.dry_run:
        print(f"gate plan for {settings.target.display}: {len(IDENTIFIERS)} identifiers and "
              f"2 passages, each alone then all in one batch ({per_engine} requests per "
              f"engine) on {ENDPOINTS[args.endpoint]}; greedy, max_tokens {args.max_tokens}, "
              f"max CER {args.max_cer:g}; deadline {plan.deadline_s:g} s")
        return warmup.EXIT_PASS
    def follow_summary(run: warmup.Run, summary: dict) -> dict:
        """The gate_summary, right after the run's summary however the run ended (pass, fail,
        refused, killed); --json prints it instead of the summary."""
        record = gate_summary_record(summary, plan.run_id, options,
                                     run.settings.records_path, warmup.EXIT_FAIL)
        run.say(gate_summary_line(record))
        return record

    settings = dataclasses.replace(settings, after_summary=follow_summary)
    return warmup.run_session(settings, lambda run: execute_gate(run, options))


# ---------------------------------------------------------------------------
# main()
# ---------------------------------------------------------------------------

COMMANDS = {"report": report_main, "probe": probe_main, "gate": gate_main}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        warmup._as_program.set()      # run as the process: signals stay ignored after the summary
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        if argv[:1] in (["-h"], ["--help"]):
            print(__doc__)
            return warmup.EXIT_PASS
        print(f"usage: {PROG} {{{','.join(COMMANDS)}}} ...  (see {PROG} COMMAND --help)",
              file=sys.stderr)
        return warmup.EXIT_USAGE
    try:
        return COMMANDS[argv[0]](argv[1:])
    except SystemExit as exc:         # argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else warmup.EXIT_USAGE


if __name__ == "__main__":
    warmup.script_exit(main())
