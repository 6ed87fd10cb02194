"""qualify.py report: what a records file shows, each run judged from its own evidence.

  report_main()        FILE -> load_records() (readback.py) -> build_report() ->
                       format_report(), or --json
    build_run()        one run: its records grouped, evidence_problems() (pure: a run
                       record, a summary, every planned request record on every engine),
                       rejudge() (pure: each record judged again by kinds.judge() with
                       the run's plan, never by its own ok), run_verdict() (pure: a
                       claimed pass without the evidence is 'incomplete'; a pass of a
                       plan that is not the contract's is 'custom')
  drafted_findings()   --expect-k: each wave's drafted length against its k (pure)
  start_facts()        what start.sh's launcher shows of a report (pure)

A file cut short by a kill, holding several runs, or with damaged lines is read past its
bad lines. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys

from evidence import cross_check, engine_shares
from kinds import KINDS, answer_of, contract_differences, copy_problem, count, judge
from readback import READ_STOPPED, exit_status, load_records, split_runs, tidy
from records import (FORMAT, JUDGED, as_dict, as_list, field_problems, gate_line,
                     gate_summary_line, known, label, probe_line, show)
from runframe import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, emit
from transport import clean_text, finite_number

PROG = "qualify.py report"

PICKED = {
    "request": ("wave", "engine", "index", "request_id", "http_status", "prompt_tokens",
                "cached_tokens", "completion_tokens", "reasoning_tokens", "finish_reason",
                "stop_reason", "latency_s", "ok", "path", "depth", "logprobs_count"),
    "wave": ("wave", "engine", "depth", "release_skew_ms", "duration_s", "released_at",
             "last_answer_at", "ok", "running_max", "waiting_max", "gauge_samples",
             "spec_decode", "tokens_per_step", "counters_went_down"),
    "metrics": ("source", "state", "why", "highlights", "warnings"),
    "status": ("path", "state", "why", "delta"),
    "probe": ("item", "round", "engine", "index", "ttft_s", "total_s", "prompt_tokens",
              "cached_tokens", "ok"),
    "gate": ("shape", "probe", "kind", "engine", "index", "http_status", "finish_reason",
             "completion_tokens", "reasoning_tokens", "exact", "edit_distance",
             "reference_chars", "answer_chars", "cer", "word_errors", "reference_words",
             "preamble_chars", "removed", "ok"),
}


def evidence_problems(run: dict | None, summaries: list[dict], judged: list[dict]
                      ) -> tuple[list[str], list[dict]]:
    """What the records lack to show the run they claim: a run record, exactly one
    summary, as many judged records as the plan announced (at least one), each of this
    run, each once and passing when judged again, on every engine, and a summary whose
    counts agree with them: (reasons, [] when the evidence is complete; the judged records
    that fail their kind's rules). Pure: records in, reasons out; fails closed on any value
    of the wrong type."""
    problems = []
    if run is None:
        problems.append("no run record")
    elif as_dict(run).get("mode") not in tuple(JUDGED):      # a list is no key
        problems.append(f"the run record's mode is {show(as_dict(run).get('mode'))}, not "
                        f"warmup, probe or gate")
    for record in ([run] if run is not None else []) + summaries:
        problems += field_problems(record)[:3]
    if not summaries:
        problems.append("no summary record")
    elif len(summaries) > 1:
        problems.append(f"{len(summaries)} summary records (a run has exactly one)")
    summary = summaries[-1] if summaries else None
    run_id = as_dict(run).get("run_id")
    if isinstance(run_id, str):
        foreign = [r for r in judged if r.get("run_id") != run_id]
        if foreign:
            problems.append(f"{len(foreign)} request record(s) of no run or another run")
        judged = [r for r in judged if r.get("run_id") == run_id]
    elif run is not None:
        problems.append("the run record has no run id")
    identities = [identity(r) for r in judged]
    if len(set(identities)) != len(identities):
        problems.append(f"{len(identities) - len(set(identities))} request record(s) repeat "
                        f"another's id")
    plan = as_dict(as_dict(run).get("plan"))
    planned = plan.get("requests_total")
    if run is not None and not (is_count(planned) and planned > 0):
        problems.append("the run record announces no number of requests")
    if is_count(planned) and len(judged) != planned:
        problems.append(f"{len(judged)} of the {planned} planned request records are in the file")
    if as_dict(summary).get("verdict") == "pass" and as_list(as_dict(summary).get("problems")):
        problems.append("the summary claims a pass and names problems")
    if as_dict(run).get("mode") == "warmup":
        problems += plan_problems(as_dict(run), judged)
    failed, disagree = rejudge(as_dict(run), judged)
    if failed:
        problems.append(f"{len(failed)} request record(s) fail their kind's rules: "
                        f"{', '.join(label(r) for r in failed[:5])}")
    problems += disagree
    problems += engine_problems(as_dict(run).get("engines"), plan.get("requests_per_engine"),
                                judged)
    if summary is not None:
        ok = len(judged) - len(failed)
        for key, want, differs in (
                ("requests_ok", ok, "the summary says {} requests ok; the records show {}"),
                ("requests_total", planned,
                 "the summary counts {} planned requests; the run record {}")):
            said = summary.get(key)
            if key in summary and not is_count(said):
                problems.append(f"the summary's {key} is not a count")
            elif is_count(said) and is_count(want) and said != want:
                problems.append(differs.format(said, want))
    return problems, failed


def planned_requests(run: dict) -> list[tuple]:
    """What a warm-up's plan sends (pure): (engine, wave, request kind, index) for each
    request, from its waves (B<d>, d greedy requests each) and --paths kinds (<kind>-<d>
    for each of their depths), on every engine the run record names."""
    plan = as_dict(run.get("plan"))
    engines = run.get("engines") if isinstance(run.get("engines"), list) else [None]
    waves = [(as_dict(w).get("wave"), as_dict(w).get("depth"), "greedy")
             for w in as_list(plan.get("waves"))]
    waves += [(f"{as_dict(p).get('path')}-{d}", d, as_dict(p).get("path"))
              for p in as_list(plan.get("paths")) for d in as_list(as_dict(p).get("depths"))]
    return [(engine, wave, kind_, index) for engine in engines for wave, depth, kind_ in waves
            if is_count(depth) and depth <= 64 for index in range(depth)]


def plan_problems(run: dict, judged: list[dict]) -> list[str]:
    """A warm-up's request records against its plan: every planned request once, of the
    planned kind in the planned wave, and nothing else; each wave named for its depth.
    Pure; the plan is read as data, so a file cannot choose its own rules."""
    problems = [f"the plan's wave {show(as_dict(w).get('wave'))} has depth "
                f"{show(as_dict(w).get('depth'))}" for w in as_list(as_dict(run.get("plan"))
                                                           .get("waves"))
                if as_dict(w).get("wave") != f"B{as_dict(w).get('depth')}"]
    planned = planned_requests(run)
    found = [(r.get("engine"), r.get("wave"), r.get("request_kind"), r.get("index"))
             for r in judged]
    missing = [p for p in planned if p not in found]
    extra = [f for f in found if f not in planned]
    if missing:
        problems.append(f"{len(missing)} planned request(s) have no record of their wave and "
                        f"kind: {', '.join(where(p) for p in missing[:5])}")
    if extra:
        problems.append(f"{len(extra)} request record(s) not in the plan (wave, kind or "
                        f"index): {', '.join(where(f) for f in extra[:5])}")
    return problems


def where(item: tuple) -> str:
    engine, wave, kind_, index = item
    return f"{'' if engine is None else f'e{show(engine)} '}{show(wave)}#{show(index)} " \
           f"({show(kind_)})"


def rejudge(run: dict, judged: list[dict]) -> tuple[list[dict], list[str]]:
    """Every judged record judged again from its recorded fields, by kinds.judge() with the
    run record's plan (never by its own `ok`): (the records that fail, a record off its
    declaration among them; the evidence problems: each record whose `ok` says
    otherwise). Pure."""
    plan, mode = as_dict(run.get("plan")), run.get("mode")
    if run.get("format") != FORMAT:
        return judged, [f"the run record is of format {show(run.get('format'))}, not "
                        f"{FORMAT}: its requests cannot be judged again (run it again)"]
    waves = [as_dict(w).get("wave") for w in as_list(plan.get("waves"))]
    failed, problems = [], []
    for record in judged:
        rules = judge_record(record, mode, plan, waves[:1])
        if rules:
            failed.append(record)
        if rules and record.get("ok") is True:
            problems.append(f"{label(record)}: the record says ok, but {rules[0]}")
        elif not rules and record.get("ok") is not True:
            problems.append(f"{label(record)}: the record says not ok, but its fields pass")
    return failed, problems


def judge_record(record: dict, mode, plan: dict, first_wave: list) -> list[str]:
    """Why one record's answer fails its kind's rules ([] when it passes)."""
    shape = field_problems(record)
    kind_ = KINDS.get(record.get("request_kind")) \
        if isinstance(record.get("request_kind"), str) else None
    if shape or kind_ is None:
        return shape or ["a record without a known request kind"]
    tokens = plan.get("max_tokens" if mode == "gate" else "tokens")
    floor = plan.get("b1_min_prompt_tokens") if mode == "warmup" and kind_.path is None \
        and record.get("wave") in first_wave else None
    if not is_count(tokens) or floor is not None and not is_count(floor):
        return ["the run record's plan holds no token count to judge it by"]
    rules = judge(answer_of(record), kind_, tokens, floor=floor)
    if mode == "gate" and not rules:
        said = copy_problem(record, finite_number(plan.get("max_cer")) or 0.0,
                            plan.get("max_typos") if isinstance(plan.get("max_typos"), int)
                            else 0)
        rules = [said] if said else []
    return rules


def identity(record: dict) -> str:
    """What tells one request record from another: its id, else where it stood."""
    rid = record.get("request_id")
    if isinstance(rid, str):
        return rid
    return repr([record.get(k) for k in ("wave", "item", "round", "shape", "probe",
                                         "engine", "index")])


def engine_problems(engines, per_engine, judged: list[dict]) -> list[str]:
    """Each engine the run record names must hold its share of the judged records (engine
    indexes compared as integers, never as booleans)."""
    if engines is None:
        return []
    if not isinstance(engines, list) or not engines \
            or not all(is_count(e) for e in engines):
        return ["the run record's engines are not a list of engine indexes"]
    if not is_count(per_engine):
        return ["the run record announces no number of requests per engine"]
    problems = []
    for engine in engines:
        mine = sum(1 for r in judged if is_count(r.get("engine")) and r.get("engine") == engine)
        if mine != per_engine:
            problems.append(f"engine {engine}: {mine} of its {per_engine} request records")
    return problems


def is_count(value) -> bool:
    return count(value) is not None          # the judge's own rule of what a count is


def run_verdict(summary: dict | None, evidence: list[str]) -> tuple[str, int]:
    """The verdict the report stands behind: the summary's, unless it claims a pass the
    evidence does not show, or there is no summary: then 'incomplete' (exit 1)."""
    verdict = as_dict(summary).get("verdict")
    code = exit_status(as_dict(summary).get("exit_code"))
    if verdict not in ("pass", "fail", "refused", "killed") or verdict == "pass" and evidence \
            or (verdict == "pass") != (code == EXIT_PASS):
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
    kind = JUDGED.get(mode, "request") if isinstance(mode, str) else "request"
    judged = by_kind.get(kind, []) if run is not None else \
        [r for kind in ("request", "probe", "gate") for r in by_kind.get(kind, [])]
    evidence, failed = evidence_problems(run, by_kind.get("summary", []), judged)
    if mode == "warmup" and as_dict(summary).get("verdict") == "pass":
        evidence += counter_problems(run, by_kind.get("metrics", []), judged)
    fails, judged_ids = {id(r) for r in failed}, {id(r) for r in judged}
    if summary:
        problems = as_list(summary.get("problems"))
    else:                             # cut short: name what failed before the cut (a
        problems = [f"{label(r)}: {p}"  # record's own failure, or the judge's)
                    for kind in ("request", "probe", "gate") for r in by_kind.get(kind, [])
                    if r.get("ok") is not True or id(r) in fails
                    for p in as_list(r.get("problems")) or ["fails its kind's rules"]]
    differences = contract_differences(as_dict(as_dict(run).get("plan"))) \
        if mode == "warmup" else []
    if differences and as_dict(summary).get("contract") is True:
        evidence.append("the summary claims the contract's plan; the run record's plan "
                        "differs: " + "; ".join(differences))
    verdict, exit_code = run_verdict(summary, evidence)
    if verdict == "pass" and differences:
        verdict = "custom"            # it passed its own plan, not the contract's

    def pick(kind: str) -> list[dict]:
        """The shown fields; a judged record's `ok` is the report's own judgement (the
        record's claim beside it as `claimed_ok`)."""
        return [dict({k: r.get(k) for k in PICKED[kind]},
                     **({"ok": id(r) not in fails, "claimed_ok": r.get("ok")}
                        if id(r) in judged_ids and "ok" in PICKED[kind] else {}))
                for r in by_kind.get(kind, [])]

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
        "evidence_problems": evidence, "differences": differences,
        "ends": ends,
        # what the last guard read saw of vllm:engine_sleep_state (null: no such gauge)
        "sleep_state": as_dict((by_kind.get("gauges") or [{}])[-1]).get("sleep_state"),
    })


def time_to_warm_line(phases: dict) -> str:
    """'time to warm: process start -> healthy 36.2 s -> warm 4.1 s (40.3 s in all)'."""
    def secs(name):
        value = finite_number(phases.get(name))
        return "unknown" if value is None else f"{value:.1f} s"
    return (f"time to warm: process start -> healthy {secs('start_to_healthy_s')} -> warm "
            f"{secs('healthy_to_warm_s')} ({secs('start_to_warm_s')} in all)")


def counter_problems(run: dict, metrics: list[dict], requests: list[dict]) -> list[str]:
    """What the server's own counters (the first metrics record, when complete) show
    against the request records, checked again as the warm-up checked them: no foreign
    work or restart (evidence.cross_check), and on a routed server every engine its share
    (evidence.engine_shares). Pure; [] when no complete counters were recorded."""
    main = as_dict(metrics[0]) if metrics else {}
    deltas = as_dict(main.get("deltas"))
    if main.get("state") != "complete" or not deltas or \
            not all(isinstance(r.get("completion_tokens"), (int, type(None))) and
                    isinstance(r.get("http_status"), (int, type(None))) for r in requests):
        return []
    problems, _ = cross_check(deltas, requests)
    plan, engines = as_dict(run.get("plan")), as_list(run.get("engines"))
    waves = [as_dict(w) for w in as_list(plan.get("waves"))]
    depths = [w.get("depth") for w in waves]
    if len(engines) > 1 and all(is_count(e) for e in engines) and \
            all(is_count(d) for d in depths) and is_count(plan.get("tokens")) and waves:
        want_prompt = {r.get("engine"): r["prompt_tokens"] for r in requests
                       if r.get("wave") == waves[0].get("wave")
                       and is_count(r.get("prompt_tokens"))}
        problems += engine_shares(deltas, tuple(engines), sum(depths) * plan["tokens"],
                                  want_prompt)[1]
    return [f"the counters show: {p}" for p in problems]


def build_report(records: list[dict], issues: list[str], path: str = "FILE") -> dict:
    """A records file as one object: each run, the bad lines, and the last run's verdict.
    A file with no run record holds no run, whatever else it holds: exit 1."""
    groups = split_runs(records)
    runs = [build_run(group, last=(i == len(groups) - 1)) for i, group in enumerate(groups)]
    if any(issue.startswith(READ_STOPPED) for issue in issues):
        return {"runs": runs, "issues": tidy(issues), "verdict": "incomplete",
                "exit_code": EXIT_FAIL, "evidence": "incomplete",
                "ends": f"{clean_text(path, 200)} was not read to its end (too large to "
                        f"read whole): its last run is not known"}
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


def evidence_table(waves: list[dict]) -> list[str]:
    """Per wave (and engine): what the engine did, as its counters and gauges say —
    observed depth, speculative acceptance, tokens per engine step. Evidence, not proof
    of batch shapes or graph capture; '-' where the server did not say. [] when no wave
    has any (run with --gauge-interval-ms 0): a table of '-' would say nothing. A counter
    that went down during a wave is named either way."""
    went_down = sorted({show(k, 160) for w in waves for k in as_list(w.get("counters_went_down"))})
    notes = [f"counter went down during a wave (a restart?): {k}" for k in went_down]
    if not any(w.get(k) is not None for w in waves
               for k in ("gauge_samples", "running_max", "spec_decode", "tokens_per_step")):
        return notes
    heads = ["wave", "engine", "depth", "observed", "gauge samples", "drafted",
             "accept rate", "mean accept len", "accept by position", "tokens/step"]
    rows = [heads]
    for wave in waves:
        spec = as_dict(wave.get("spec_decode"))
        positions = " ".join(show(p, 8) for p in as_list(spec.get("acceptance_by_position")))
        running = finite_number(wave.get("running_max"))
        rows.append([show(wave.get("wave")), show(wave.get("engine")), show(wave.get("depth")),
                     "-" if running is None else f"{running:g}",
                     show(wave.get("gauge_samples")), show(spec.get("drafted_length")),
                     show(spec.get("acceptance_rate")),
                     show(spec.get("mean_acceptance_length")), positions or "-",
                     show(wave.get("tokens_per_step"))])
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return lines + notes


def format_run(run: dict) -> list[str]:
    """One run's lines, ending with its verdict line."""
    lines = [run_header(as_dict(run["run"]))] if run["run"] else ["(no run record)"]
    if run["requests"]:
        lines += [""] + request_table(run["requests"])
    if run["waves"]:
        lines += [""] + [wave_text(w) for w in run["waves"]]
        table = evidence_table(run["waves"])
        if table:
            lines += ["", "per-wave evidence (counters and gauges; not worker RPC steps, not "
                          "proof of graph capture):"] + table
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
        items = as_list(as_dict(run["probe_summary"]).get("items"))
        lines += [probe_line(as_dict(i)) for i in items]
    if run["gate"]:
        lines += ["", "gate (exact copies; counts and distances only):"]
        lines += [gate_line(as_dict(r)) for r in run["gate"]]
    if run["gate_summary"]:
        lines.append(gate_summary_line(as_dict(run["gate_summary"])))
    if run["problems"]:
        lines += ["", "problems:"] + [f"  - {show(p, 300)}" for p in run["problems"]]
    summary = as_dict(run["summary"])
    if summary.get("time_to_warm"):
        lines.append(time_to_warm_line(as_dict(summary["time_to_warm"])))
    lines += [f"note: {show(n, 300)}" for n in as_list(summary.get("notes"))]
    lines += [f"warning: {show(w, 300)}" for w in as_list(summary.get("warnings"))]
    if run["evidence_problems"]:
        lines += ["evidence: incomplete"] + [f"  - {show(p, 300)}"
                                             for p in run["evidence_problems"]]
    if not run["summary"]:
        lines.append(f"verdict: incomplete (exit {run['exit_code']}; {run['ends']})")
    elif run["verdict"] == "custom":
        lines.append(f"verdict: custom plan, not the contract's (exit {run['exit_code']}; "
                     f"{show('; '.join(run['differences']), 200)}): it passed its own plan")
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
        prog=PROG,
        description="Print a readable report of a records file (warm-up, probe or gate), run "
                    "by run; also a file cut short by a kill, holding several runs, or with "
                    "damaged lines (skipped and named). Each run's verdict is judged from its "
                    "records: a pass needs its run record (format 2), its summary and every "
                    "request record the plan announced, on every engine, each judged again "
                    "from its recorded fields by its kind's rules and the run's plan (a "
                    "record's own 'ok' is never believed: one that disagrees is named); "
                    "otherwise the run is 'incomplete', whatever its summary claims. A "
                    "warm-up that passed a plan other than the contract's is 'custom', never "
                    "'pass'. Exit status: the last run's (0 pass or custom; 1 fail; 3 "
                    "refused; 124, 137, 129, 130, 143 ended by the hard bound or a signal), "
                    "1 when it is "
                    "incomplete or the file holds no run (or --expect-k does not hold), 2 "
                    "when the file cannot be read.")
    parser.add_argument("records", help="the JSON Lines records file")
    parser.add_argument("--json", action="store_true",
                        help="the report as one JSON object: runs (each with its run, requests, "
                             "waves, metrics, status, probe, probe_summary, gate, summary, "
                             "problems, verdict, exit_code, claimed, evidence, "
                             "evidence_problems, differences, ends), issues, the last run's "
                             "verdict, exit_code and evidence, and expect_k when asked")
    parser.add_argument("--expect-k", metavar="B1=5,...", type=expect_k_type,
                        help="check each named wave's drafted length (speculative draft "
                             "tokens / drafts over the wave, from its counters) against its "
                             "k: it holds when k-1 < drafted <= k; a wave that differs, or "
                             "whose length was not observed, makes the exit status 1")
    args = parser.parse_args(argv)
    try:
        records, issues = load_records(args.records)
    except OSError as exc:
        emit(f"{PROG}: cannot read {show(args.records, 200)}: "
                    f"{exc.strerror or type(exc).__name__}; give the path of a records file",
                    sys.stderr)
        return EXIT_USAGE
    report = build_report(records, issues, args.records)
    if args.expect_k:
        report["expect_k"] = drafted_findings(_last_run(report).get("waves") or [],
                                              args.expect_k)
    if args.json:
        emit(json.dumps(report, indent=2))
    else:
        emit(format_report(report) + "".join(
            f"\nexpect-k {f['wave']}: {f['said']}" for f in report.get("expect_k", [])))
    held = all(f["holds"] for f in report.get("expect_k", []))
    return report["exit_code"] or (EXIT_PASS if held else EXIT_FAIL)


def expect_k_type(text: str) -> dict[str, int]:
    """An argparse type: 'B1=5,B2=5,B3=4,B4=4' -> {"B1": 5, ...}."""
    expected = {}
    for item in text.split(","):
        wave, _, k = item.strip().partition("=")
        if not wave or not k.isdigit() or not 1 <= int(k) <= 64:
            raise argparse.ArgumentTypeError(f"wants WAVE=K pairs such as B1=5,B3=4 (K from "
                                             f"1 to 64); got {text!r}")
        if wave in expected:
            raise argparse.ArgumentTypeError(f"names {wave} twice; got {text!r}")
        expected[wave] = int(k)
    return expected


def drafted_findings(waves: list[dict], expected: dict[str, int]) -> list[dict]:
    """Each expected wave (each engine's record of it): its drafted length (draft tokens /
    drafts over the wave) against k (pure). It holds when k - 1 < drafted <= k: more than
    k cannot be a k-token draft; k - 1 or less means shorter drafts than k (an n-gram
    proposer drafts less when its lookup finds less) or another k."""
    found = []
    for name, k in expected.items():
        mine = [w for w in waves if w.get("wave") == name]
        if not mine:
            found.append({"wave": name, "holds": False, "said": "no wave record of it"})
        for wave in mine:
            where = name + ("" if wave.get("engine") is None else f" e{show(wave['engine'])}")
            spec = as_dict(wave.get("spec_decode"))
            drafted = finite_number(spec.get("drafted_length"))
            if drafted is None:
                why = "no drafts over the wave: the proposer proposed nothing" \
                    if spec.get("drafts") == 0 else "no speculative counters over the wave"
                found.append({"wave": where, "holds": False,
                              "said": f"drafted length not observed ({why})"})
                continue
            holds = k - 1 < drafted <= k
            found.append({"wave": where, "holds": holds, "drafted_length": drafted,
                          "said": f"drafted length {drafted:g}, k {k}: "
                                  f"{'holds' if holds else 'DIFFERS'}"})
    return found


def _last_run(report: dict) -> dict:
    return report["runs"][-1] if report["runs"] else {}


def start_facts(report: dict) -> dict[str, str]:
    """What the launcher's OK and WARN lines show of a report, each a short word or '-'."""
    run = _last_run(report)
    cache_check = as_dict(run.get("summary")).get("cache_check")
    gate = as_dict(run.get("gate_summary"))
    exact, cer = as_dict(gate.get("identifiers_exact")), finite_number(gate.get("worst_cer"))
    found = {
        "verdict": show(report["verdict"], 20),
        "cache_check": cache_check if cache_check in ("made", "not_made", "hit") else "-",
        "differences": "; ".join(run.get("differences") or []),
        "identifiers_alone": show(exact.get("alone"), 20),
        "identifiers_batched": show(exact.get("batched"), 20),
        "worst_cer": "n/a" if cer is None else f"{cer:.3f}",
    }
    return {name: value or "-" for name, value in found.items()}
