#!/usr/bin/env python3
"""The coordinator's tools after a start: read records back, probe warmth, gate quality.

  qualify.py report FILE      what a records file shows, run by run (exit: the last run's)
  qualify.py probe ...        streamed requests timed to the first token, first round
                              against later rounds, per engine; every prompt new
  qualify.py gate ...         exact-copy probes (six identifiers, an English and a Russian
                              passage), alone and batched, greedy; exit 0 only if all pass

main() dispatches; report_main() -> load_records() (readback.py) -> build_report() ->
format_report(); probe_main() -> run_session(WarmthProbe) -> WarmthProbe.steps() ->
probe_record() per request -> probe_summary(); gate_main() lives in gate.py. Programs over
the layers beside this file (transport, runframe, vllm_client); never imports warmup.py.
Standard library only. The contract: CONTRACT.md beside this file.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import textwrap
import urllib.parse
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import gate
    import runframe
    from readback import (as_dict, as_list, exit_status, known, load_records, show,
                          split_runs, tidy)
    from runframe import (EXIT_FAIL, EXIT_PASS, EXIT_USAGE, PROBLEM_LIMIT, Run, RunSettings,
                          add_run_options, emit, parse_or_explain, run_session, run_settings,
                          seconds, usage_error, whole)
    from transport import Clock, TransportError, UsageError, clean_text, fetch, finite_number
    from prompts import (MAX_LONG_PROMPT_TOKENS, MIN_LONG_PROMPT_TOKENS, completion_body,
                         fresh_long_prompt, make_short_prompt)
    from vllm_client import (ENVIRONMENT_HELP, Connection, ServerProgram, Slot,
                             add_server_options, base_url_from, connection_from,
                             extract_fields, read_usage, request_label, slot_timing,
                             stream_usage)
except ImportError as exc:           # a module of the folder is missing: one line, no trace
    print(f"qualify.py: cannot load {exc.name or exc}: offload/launch/ is copied and rolled "
          f"back as one folder; restore the whole folder", file=sys.stderr)
    sys.exit(2)

PROG = "qualify.py"


# ---------------------------------------------------------------------------
# report: read a records file back (also one cut short by a kill, or holding several runs).
# ---------------------------------------------------------------------------



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


JUDGED_KIND = {"warmup": "request", "probe": "probe", "gate": "gate"}   # mode -> record


def evidence_problems(run: dict | None, summary: dict | None, judged: list[dict]
                      ) -> list[str]:
    """What the records lack to show the run they claim: a run record, a summary, as many
    judged records as the plan announced (each ok) on every engine, and a summary whose
    counts agree with them. [] when the evidence is complete. Pure: records in, reasons out."""
    problems = []
    if run is None:
        problems.append("no run record")
    if summary is None:
        problems.append("no summary record")
    plan = as_dict(as_dict(run).get("plan"))
    planned = plan.get("requests_total")
    if run is not None and not is_count(planned):
        problems.append("the run record announces no number of requests")
    if is_count(planned) and len(judged) != planned:
        problems.append(f"{len(judged)} of the {planned} planned request records are in the file")
    failed = [r for r in judged if r.get("ok") is not True]
    if failed:
        problems.append(f"{len(failed)} request record(s) not ok: "
                        f"{', '.join(request_label(r) for r in failed[:5])}")
    engines = as_dict(run).get("engines")
    per_engine = plan.get("requests_per_engine")
    if isinstance(engines, list) and engines and is_count(per_engine):
        for engine in engines:
            mine = sum(1 for r in judged if r.get("engine") == engine)
            if mine != per_engine:
                problems.append(f"engine {show(engine)}: {mine} of its {per_engine} request "
                                f"records")
    if summary is not None:
        ok = sum(1 for r in judged if r.get("ok") is True)
        said = summary.get("requests_ok")
        if is_count(said) and said != ok:
            problems.append(f"the summary says {said} requests ok; the records show {ok}")
        total = summary.get("requests_total")
        if is_count(total) and is_count(planned) and total != planned:
            problems.append(f"the summary counts {total} planned requests; the run record "
                            f"{planned}")
    return problems


def is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def run_verdict(summary: dict | None, evidence: list[str]) -> tuple[str, int]:
    """The verdict the report stands behind: the summary's, unless it claims a pass the
    evidence does not show, or there is no summary: then 'incomplete' (exit 1)."""
    if summary is None:
        return "incomplete", EXIT_FAIL
    verdict = summary.get("verdict")
    if verdict not in ("pass", "fail", "refused", "killed"):
        return "incomplete", EXIT_FAIL
    if verdict == "pass" and evidence:
        return "incomplete", EXIT_FAIL
    code = exit_status(summary.get("exit_code"))
    if verdict == "pass" and code != EXIT_PASS or verdict != "pass" and code == EXIT_PASS:
        return "incomplete", EXIT_FAIL
    return verdict, code


def build_run(records: list[dict], last: bool = True) -> dict:
    """One run as one object: plan, requests, waves, counters, probe, gate, summary, and
    the verdict judged from its evidence."""
    by_kind: dict[str, list[dict]] = {}
    for record in records:
        by_kind.setdefault(record["record"], []).append(record)
    summary = (by_kind.get("summary") or [None])[-1]
    run = (by_kind.get("run") or [None])[-1]
    where = "the file ends" if last else "its records end (another run follows)"
    ends = "summary" if summary else (
        f"no summary: {where} after a '{show(records[-1]['record'], 40)}' record (the "
        f"run was killed{', or is still running' if last else ''})")
    mode = as_dict(run).get("mode")
    judged = by_kind.get(JUDGED_KIND.get(mode, "request"), []) if run is not None else \
        [r for kind in ("request", "probe", "gate") for r in by_kind.get(kind, [])]
    if summary:
        problems = as_list(summary.get("problems"))
    else:                             # cut short: name what failed before the cut
        problems = [f"{request_label(r)}: {p}"
                    for kind in ("request", "probe", "gate") for r in by_kind.get(kind, [])
                    if r.get("ok") is not True for p in as_list(r.get("problems"))]
    evidence = evidence_problems(run, summary, judged)
    verdict, exit_code = run_verdict(summary, evidence)

    def pick(kind: str) -> list[dict]:
        return [{k: r.get(k) for k in PICKED[kind]} for r in by_kind.get(kind, [])]

    return tidy({
        "run": run,
        "requests": pick("request"), "waves": pick("wave"), "metrics": pick("metrics"),
        "status": pick("status"), "probe": pick("probe"),
        "probe_summary": (by_kind.get("probe_summary") or [None])[-1],
        "gate": pick("gate"), "gate_summary": (by_kind.get("gate_summary") or [None])[-1],
        "summary": summary, "problems": problems,
        "verdict": verdict, "exit_code": exit_code,
        "claimed": summary.get("verdict") if summary else None,
        "evidence": "incomplete" if evidence else "complete",
        "evidence_problems": evidence,
        "ends": ends,
    })


def build_report(records: list[dict], issues: list[str], path: str = "FILE") -> dict:
    """A records file as one object: each run, the bad lines, and the last run's verdict.
    A file with no run record holds no run, whatever else it holds: exit 1."""
    groups = split_runs(records)
    runs = [build_run(group, last=(i == len(groups) - 1)) for i, group in enumerate(groups)]
    if not any(run["run"] is not None for run in runs):
        return {"runs": runs, "issues": tidy(issues), "verdict": "none",
                "exit_code": EXIT_FAIL, "evidence": "incomplete",
                "ends": f"no warm-up run in {clean_text(path, 200)} (no run record)"}
    last = runs[-1]
    return {"runs": runs, "issues": tidy(issues),
            "verdict": last["verdict"], "exit_code": last["exit_code"],
            "evidence": last["evidence"], "ends": last["ends"]}


def run_header(run: dict) -> str:
    """The run record in one line: what ran, where, against which model and server."""
    plan = as_dict(run.get("plan"))
    mode = run.get("mode")
    model = (f"model {known(run.get('model'))} "
             f"(server {known(as_dict(run.get('versions')).get('server'))})")
    where = f"{show(run.get('run_id'))}: {show(run.get('base_url'))} {model}"
    engines = as_list(run.get("engines")) if isinstance(run.get("engines"), list) else []
    where += f", engines {','.join(show(e) for e in engines)}" if engines else ""
    deadline = f"deadline {show(plan.get('deadline_s'))} s"
    if mode == "probe":
        items = ", ".join(show(as_dict(i).get("item")) for i in as_list(plan.get("items")))
        return (f"probe {where}, {show(plan.get('rounds'))} rounds of {items or '-'}, "
                f"{show(plan.get('requests_total'))} requests, {deadline}")
    if mode == "gate":
        return (f"gate {where}, endpoint {show(plan.get('endpoint'))}, "
                f"{show(plan.get('requests_total'))} requests, max CER "
                f"{show(plan.get('max_cer'))}, max_tokens {show(plan.get('max_tokens'))}, "
                f"{deadline}")
    waves = ",".join(show(as_dict(w).get("wave")) for w in as_list(plan.get("waves")))
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
    lines = [run_header(as_dict(run["run"]))] if run["run"] else ["(no run record)"]
    if run["requests"]:
        lines += [""] + request_table(run["requests"])
    if run["waves"]:
        lines += [""] + [wave_text(w) for w in run["waves"]]
    for m in run["metrics"]:
        why = f": {show(m.get('why'), 200)}" if m.get("why") else ""
        lines += ["", f"counter deltas from {show(m.get('source'))} ({show(m.get('state'))}"
                      f"{why}):"]
        lines += [f"  {show(k, 160)} {show(v)}" for k, v in as_dict(m.get("highlights")).items()]
        lines += [f"  warning: {show(w, 300)}" for w in as_list(m.get("warnings"))]
    for st in run["status"]:
        why = f": {show(st.get('why'), 200)}" if st.get("why") else ""
        lines.append(f"status file {show(st.get('path'), 200)}: {show(st.get('state'))}{why}")
    if run["probe_summary"]:
        lines += ["", "probe (first round against the median of later rounds):"]
        lines += [probe_line(as_dict(i)) for i in as_list(as_dict(run["probe_summary"]).get("items"))]
    if run["gate"]:
        lines += ["", "gate (exact copies; counts and distances only):"]
        lines += [gate.gate_line(as_dict(r)) for r in run["gate"]]
    if run["gate_summary"]:
        lines.append(gate.gate_summary_line(as_dict(run["gate_summary"])))
    if run["problems"]:
        lines += ["", "problems:"] + [f"  - {show(p, 300)}" for p in run["problems"]]
    summary = as_dict(run["summary"])
    lines += [f"note: {show(n, 300)}" for n in as_list(summary.get("notes"))]
    lines += [f"warning: {show(w, 300)}" for w in as_list(summary.get("warnings"))]
    if run["evidence_problems"]:
        lines += ["evidence: incomplete"] + [f"  - {show(p, 300)}"
                                             for p in run["evidence_problems"]]
    if not run["summary"]:
        lines.append(f"verdict: incomplete (exit {run['exit_code']}; {run['ends']})")
    elif run["verdict"] != run["claimed"]:
        lines.append(f"verdict: {show(run['verdict'])} (exit {run['exit_code']}; the summary "
                     f"claims {show(run['claimed'])}, the evidence does not show it)")
    else:
        lines.append(f"verdict: {show(run['verdict'])} (exit {run['exit_code']})")
    return lines


def format_report(report: dict) -> str:
    """The whole file for a terminal: bad lines first, then each run, the last run last."""
    lines = [f"note: {show(issue, 300)}" for issue in report["issues"]]
    runs = report["runs"]
    if not any(run["run"] for run in runs):
        lines.append(f"verdict: none ({report['ends']})")
        return "\n".join(lines)
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
                    "damaged lines (skipped and named). Each run's verdict is judged from its "
                    "records: a pass needs its run record, its summary and every request "
                    "record the plan announced, each ok, on every engine; otherwise the run "
                    "is 'incomplete', whatever its summary claims. Exit status: the last "
                    "run's (0 pass), 1 when it is incomplete or the file holds no run, 2 "
                    "when the file cannot be read.")
    parser.add_argument("records", help="the JSON Lines records file")
    parser.add_argument("--json", action="store_true",
                        help="the report as one JSON object: runs (each with its run, requests, "
                             "waves, metrics, status, probe, probe_summary, gate, summary, "
                             "problems, verdict, exit_code, claimed, evidence, "
                             "evidence_problems, ends), issues, and the last run's verdict, "
                             "exit_code and evidence")
    parser.add_argument("--fields", metavar="LIST", type=fields_type,
                        help="for scripts: print only these fields of the last run, space "
                             "separated, on one line, in the order given; each a single word "
                             f"(- when unknown). Fields: {', '.join(SCRIPT_FIELDS)}")
    args = parser.parse_args(argv)
    try:
        records, issues = load_records(args.records)
    except OSError as exc:
        emit(f"{PROG} report: cannot read {show(args.records, 200)}: "
                    f"{exc.strerror or type(exc).__name__}; give the path of a records file",
                    sys.stderr)
        return EXIT_USAGE
    report = build_report(records, issues, args.records)
    if args.fields:
        emit(" ".join(script_field(report, name) for name in args.fields))
    else:
        emit(json.dumps(report, indent=2) if args.json else format_report(report))
    return report["exit_code"]


def _last_run(report: dict) -> dict:
    return report["runs"][-1] if report["runs"] else {}


def _cache_check(report: dict) -> str:
    notes = as_list(as_dict(_last_run(report).get("summary")).get("notes"))
    return "not-made" if any("cache check not made" in str(n) for n in notes) else "made"


def _gate_figure(report: dict, shape: str) -> str:
    exact = as_dict(as_dict(_last_run(report).get("gate_summary")).get("identifiers_exact"))
    return show(exact.get(shape), 20)


def _worst_cer(report: dict) -> str:
    cer = finite_number(as_dict(_last_run(report).get("gate_summary")).get("worst_cer"))
    return "n/a" if cer is None else f"{cer:.3f}"


SCRIPT_FIELDS = {                     # what start.sh reads: one word each
    "verdict": lambda report: show(report["verdict"], 20),
    "exit_code": lambda report: str(report["exit_code"]),
    "evidence": lambda report: report["evidence"],
    "cache_check": _cache_check,
    "identifiers_alone": lambda report: _gate_figure(report, "alone"),
    "identifiers_batched": lambda report: _gate_figure(report, "batched"),
    "worst_cer": _worst_cer,
}


def fields_type(text: str) -> list[str]:
    """An argparse type: a comma-separated list of SCRIPT_FIELDS names."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in SCRIPT_FIELDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown field {unknown[0]!r}; fields: "
                                         f"{', '.join(SCRIPT_FIELDS)}")
    return names


def script_field(report: dict, name: str) -> str:
    """One field as one word: spaces become '_', nothing becomes '-'."""
    value = SCRIPT_FIELDS[name](report) or "-"
    return "_".join(value.split()) or "-"


# ---------------------------------------------------------------------------
# probe: time to first token, first round against later rounds (did the warm-up work?).
# Every prompt is new (a nonce first), so a later round is never a prefix-cache hit.
# ---------------------------------------------------------------------------

PROBE_ITEMS = (("single", 1), ("burst3", 3), ("burst4", 4))


@dataclass(frozen=True)
class ProbeOptions:
    rounds: int = 3
    long_tokens: int = 0              # 0: no long item
    tokens: int = 32
    priority: int = 20

    @property
    def items(self) -> list[tuple[str, int]]:
        return list(PROBE_ITEMS) + ([("long", 1)] if self.long_tokens else [])


class WarmthProbe(ServerProgram):
    """Rounds of single, burst3, burst4 (and long) streamed requests, each round behind the
    guard like a wave; every request judged complete or not, warmth measured, never judged."""

    mode = "probe"

    def __init__(self, connection: Connection, options: ProbeOptions, settings: RunSettings):
        super().__init__(connection)
        self.options = options
        self.settings = settings
        self.long_prompts: dict = {}          # engine -> (prompt, counted or None)
        self.items: list = []                 # probe_summary() of the records

    def planned_per_engine(self) -> int:
        return self.options.rounds * sum(depth for _, depth in self.options.items)

    def plan_fields(self) -> dict:
        options = self.options
        counts = [c for _, c in self.long_prompts.values()]
        return {"items": [{"item": i, "depth": d} for i, d in options.items],
                "rounds": options.rounds, "requests_total": self.planned_per_engine(),
                "long_tokens": options.long_tokens or None,
                "long_prompt_tokens_counted": None if not counts or None in counts
                else min(counts),
                "tokens": options.tokens, "priority": options.priority, "stream": True,
                "prompts": "new every request", "deadline_s": self.settings.deadline_s,
                "socket_cap_s": self.settings.socket_cap_s}

    def summary_fields(self, run: Run) -> dict:
        return dict(super().summary_fields(run), probe=self.items)

    def steps(self, run: Run) -> None:
        options = self.options
        self.learn_server(run)
        if options.long_tokens:
            self.long_prompts = self.size_long_prompts(run, options.long_tokens, options.tokens)
        run.write_run_record()
        run.say(f"probe {run.settings.run_id}: {self.connection.target.display} model "
                f"{clean_text(self.server.model or '', 80)}, {options.rounds} rounds, deadline "
                f"{run.settings.deadline_s:g} s")
        try:
            self.run_rounds(run)
        finally:
            self.items = probe_summary(self.tally.requests)
        run.write({"record": "probe_summary", "run_id": run.settings.run_id,
                   "items": self.items,
                   "meaning": "first round against the median of later rounds; a ratio, "
                              "not a verdict on the warm-up; rounds served from the prefix "
                              "cache are left out"})
        records = self.tally.requests
        if records and all(r["cached_tokens"] is None for r in records
                           if r["http_status"] == 200):
            self.tally.notes.append("cache check not made: the server does not report cached "
                                    "tokens (start it with --enable-prompt-tokens-details)")
        for entry in self.items:
            if entry["cached_rounds"]:
                where = "" if entry["engine"] is None else f" on engine {entry['engine']}"
                rounds = ", ".join(map(str, entry["cached_rounds"]))
                self.tally.notes.append(
                    f"{entry['item']}{where}: round {rounds} served from the prefix cache "
                    f"(cached_tokens > 0): left out of the ratios")
        run.say("probe (first round against the median of later rounds):")
        for entry in self.items:
            run.say(probe_line(entry))

    def run_rounds(self, run: Run) -> None:
        """Each round, each item, behind the guard; stops at a refusal or the deadline."""
        options, run_id = self.options, run.settings.run_id
        for round_no in range(1, options.rounds + 1):
            for item, depth in options.items:
                label = f"{item} round {round_no}"
                if run.clock.remaining() <= 0:
                    self.tally.problems.append(f"deadline passed before {label}")
                    return
                slots = []
                for engine in self.server.engines:
                    for index in range(depth):
                        where = "" if engine is None else f"e{engine}-"
                        rid = f"probe-{run_id}-{where}{item}-r{round_no}-{index}"
                        prompt = self.prompt_for(run_id, item, depth, round_no, index, engine)
                        body = dict(completion_body(self.server.model, prompt, rid,
                                                    options.tokens, options.priority),
                                    stream=True, stream_options={"include_usage": True})
                        slots.append(self.make_slot(index, rid, engine, body, stream=True))
                finished = self.guarded_batch(run, label, slots,
                                              first=not self.tally.requests)
                if finished is None:
                    return
                for slot in finished:
                    record = probe_record(run, self, item, round_no, slot)
                    run.write(record)
                    self.tally.requests.append(record)

    def prompt_for(self, run_id: str, item: str, depth: int, round_no: int, index: int,
                   engine: int | None) -> str:
        """A prompt no earlier request sent: a nonce (or a per-request tag) first."""
        if item == "long":
            return fresh_long_prompt(self.long_prompts[engine][0])
        seed = f"{run_id}-{engine}-{item}-r{round_no}-{os.urandom(4).hex()}"
        return make_short_prompt(seed, depth, index)


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _slowest(values: list) -> float | None:
    """A burst is as slow as its slowest request; a missing time makes the round unknown."""
    values = [finite_number(v) for v in values]
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
        v = finite_number(v)
        return "-" if v is None else f"{v * 1000:.0f} ms"
    where = show(entry.get("item")) + ("" if entry.get("engine") is None
                                       else f" e{show(entry.get('engine'))}")
    line = (f"  {where:<7} TTFT first {ms(entry.get('ttft_first_s'))} vs later "
            f"{ms(entry.get('ttft_later_median_s'))} (x{show(entry.get('ttft_ratio'))}); total "
            f"first {ms(entry.get('total_first_s'))} vs later "
            f"{ms(entry.get('total_later_median_s'))} (x{show(entry.get('total_ratio'))})")
    cached = as_list(entry.get("cached_rounds"))
    if cached:
        line += (f"; round {', '.join(show(n) for n in cached)} served from the prefix cache, "
                 f"left out")
    return line


def probe_record(run: Run, probe: WarmthProbe, item: str, round_no: int, slot: Slot) -> dict:
    """One streamed request: when its first token and its end came; counts only, no text."""
    timing, usage = slot_timing(slot), None
    response, tokens = slot.response, probe.options.tokens
    problems = []
    if response is None:
        problems.append(timing["transport_error"])
    elif response.status != 200:
        problems.append(probe.diagnose(extract_fields(response.status, response.body)))
    else:
        usage, done = stream_usage(response.body)
        if not done:
            problems.append("stream did not end with [DONE]")
        if usage is None:
            problems.append("stream carried no usage")
        if response.watched_at is None:
            problems.append("no token text arrived")
    counts, bad_counts = read_usage(usage)
    problems += bad_counts
    if usage is not None and counts["completion_tokens"] != tokens \
            and not any(p.startswith("usage completion_tokens") for p in bad_counts):
        problems.append(f"completion_tokens {show(counts['completion_tokens'])}, expected "
                        f"{tokens}")
    sent = slot.sent_at
    first = response.watched_at if response is not None else None
    return {
        "record": "probe", "run_id": run.settings.run_id, "item": item, "round": round_no,
        "index": slot.index, "engine": slot.engine, "request_id": slot.request_id,
        "http_status": timing["http_status"],
        "ttft_s": round(first - sent, 4) if first is not None and sent is not None else None,
        "total_s": timing["latency_s"],
        "prompt_tokens": counts["prompt_tokens"],
        "cached_tokens": counts["cached_tokens"],
        "completion_tokens": counts["completion_tokens"],
        "ok": not problems,
        "problems": [clean_text(p, PROBLEM_LIMIT) for p in problems],
    }


PROBE_EPILOG = ENVIRONMENT_HELP + """
exit status:
  0    every streamed request was answered completely (usage, [DONE], its tokens), in
       time; says nothing about warmth: the ratios are measurements, not a verdict
  1    a request failed, or late; 2 usage or configuration error; 3 refused by a guard;
  129/130/143  SIGHUP / SIGINT / SIGTERM: a 'killed' summary was written first
"""


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
    add_server_options(parser)
    add_run_options(parser)
    parser.add_argument("--tokens", metavar="N", type=whole(2, 4096), default=32,
                        help="completion tokens per request (default: %(default)s)")
    parser.add_argument("--priority", metavar="N", type=whole(-(1 << 31), (1 << 31) - 1),
                        default=20, help="request priority (default: %(default)s)")
    parser.add_argument("--rounds", metavar="N", type=whole(2, 100), default=3,
                        help="rounds of single, burst3, burst4 (default: %(default)s)")
    parser.add_argument("--long-tokens", type=whole(0, MAX_LONG_PROMPT_TOKENS), default=0,
                        metavar="N",
                        help="also a long request of N prompt tokens (more than 4096), "
                             "sized once with /tokenize, a new nonce every round "
                             "(default: none)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and exit 0 without touching the network")
    return parser


def probe_main(argv: list[str]) -> int:
    """qualify.py probe: the same connection options, guards, bounds and records as the
    warm-up."""
    parser = build_probe_parser()
    args = parse_or_explain(parser, argv)
    if args.long_tokens and args.long_tokens < MIN_LONG_PROMPT_TOKENS:
        usage_error(parser, args.json,
                    f"--long-tokens must be more than {MIN_LONG_PROMPT_TOKENS - 1}")
    options = ProbeOptions(rounds=args.rounds, long_tokens=args.long_tokens,
                           tokens=args.tokens, priority=args.priority)
    settings = run_settings(args, PROG + " probe", "probe")
    try:
        connection = connection_from(args)
    except UsageError as exc:
        usage_error(parser, args.json, str(exc))
    if args.dry_run:
        long = f", long ({args.long_tokens} tokens)" if args.long_tokens else ""
        emit(f"probe plan for {connection.target.display}: {args.rounds} rounds of single, "
             f"burst3, burst4{long}; streaming, {args.tokens} tokens each, every prompt new; "
             f"deadline {settings.deadline_s:g} s")
        return EXIT_PASS
    return run_session(settings, WarmthProbe(connection, options, settings))


# ---------------------------------------------------------------------------
# health: one GET /health, bounded (what start.sh polls while the server starts).
# ---------------------------------------------------------------------------

EXIT_NO_ANSWER = 3                    # health: no HTTP answer at all


def check_health(target, timeout_s: float) -> tuple[int, str]:
    """(exit code, one line) of one GET {base}/health within timeout_s: 0 for HTTP 200, 1
    for another answer, EXIT_NO_ANSWER when nothing answered. user:password in the URL
    become Basic auth (a proxy in front may want them); they are never shown."""
    headers = {}
    if target.credentials:
        user, _, password = target.credentials.partition(":")
        pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    clock = Clock.start(timeout_s, timeout_s)
    try:
        response = fetch(target, clock, "GET", "/health", headers=headers)
    except TransportError as exc:
        return EXIT_NO_ANSWER, f"no answer from {target.display}/health: {exc.problem}"
    if response.status == 200:
        return EXIT_PASS, f"{target.display}/health answered 200"
    return EXIT_FAIL, f"{target.display}/health answered HTTP {response.status}"


def health_main(argv: list[str]) -> int:
    """qualify.py health: exit 0 when /health answers 200 within the bound."""
    parser = argparse.ArgumentParser(
        prog=PROG + " health", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="GET {base}/health once, within --timeout-s. The address comes from "
                    "--base-url or WARMUP_BASE_URL (start.sh passes it there, out of the "
                    "command line); user:password in it is sent as Basic auth and never "
                    "shown.",
        epilog="exit status: 0 HTTP 200; 1 another HTTP answer; 2 usage error (a bad URL);\n"
               "3 no HTTP answer at all (nothing listening, or no answer in time)")
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help="the server's address (default: $WARMUP_BASE_URL, else "
                             "http://127.0.0.1:8000)")
    parser.add_argument("--timeout-s", metavar="S", type=seconds(60.0), default=2.0,
                        help="the longest the request may take (default: %(default)g)")
    parser.add_argument("--print-url", action="store_true",
                        help="print the address as it may be shown (no user:password) and "
                             "exit 0, sending nothing; exit 2 when it is not a valid URL")
    args = parser.parse_args(argv)
    try:
        target = base_url_from(args.base_url)
    except UsageError as exc:
        emit(f"{PROG} health: {exc}", sys.stderr)
        return EXIT_USAGE
    if args.print_url:
        emit(target.display)
        return EXIT_PASS
    code, line = check_health(target, args.timeout_s)
    emit(line, sys.stdout if code == EXIT_PASS else sys.stderr)
    return code


# ---------------------------------------------------------------------------
# main()
# ---------------------------------------------------------------------------

COMMANDS = {"report": report_main, "probe": probe_main, "gate": gate.gate_main,
            "health": health_main}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        runframe.as_program()       # run as the process: signals stay ignored after the summary
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        if argv[:1] in (["-h"], ["--help"]):
            emit(__doc__)
            return EXIT_PASS
        emit(f"usage: {PROG} {{{','.join(COMMANDS)}}} ...  (see {PROG} COMMAND --help)",
             sys.stderr)
        return EXIT_USAGE
    try:
        return COMMANDS[argv[0]](argv[1:])
    except SystemExit as exc:         # argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


if __name__ == "__main__":
    runframe.script_exit(main())
