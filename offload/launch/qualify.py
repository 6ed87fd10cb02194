#!/usr/bin/env python3
"""The coordinator's tools after a start: read records back, probe warmth, gate quality.

  qualify.py report FILE      what a records file shows, run by run
  qualify.py probe ...        streamed requests timed to the first token, first round
                              against later rounds
  qualify.py gate ...         (see its --help)

Needs warmup.py beside it (it reuses its HTTP, guard, batch and records code); warmup.py
never imports this file. Standard library only. The contract: CONTRACT.md beside this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import warmup  # noqa: E402

PROG = "qualify.py"


# ---------------------------------------------------------------------------
# report: read a records file back (also one cut short by a kill).
# ---------------------------------------------------------------------------

def load_records(path: str) -> tuple[list[dict], list[str]]:
    """Parse a records file; stop at the first damaged line and say where the file ends."""
    records, issues = [], []
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record, why = warmup.decode_json(line)
        if why is not None:
            issues.append(f"line {number} is not valid JSON: the file ends there "
                          f"(cut short by a kill?)")
            break
        if isinstance(record, dict) and "record" in record:
            records.append(record)
    if text and not text.endswith("\n") and not issues:
        issues.append("the last line has no newline: the file was cut short")
    return records, issues


def build_report(records: list[dict], issues: list[str]) -> dict:
    """A records file as one object: plan, requests, waves, counters, problems, verdict."""
    by_kind: dict[str, list[dict]] = {}
    for record in records:
        by_kind.setdefault(record["record"], []).append(record)
    summaries = by_kind.get("summary", [])
    summary = summaries[-1] if summaries else None
    ends = "summary" if summary else (
        f"no summary: the file ends after a '{records[-1]['record']}' record (the run was "
        f"killed, or is still running)" if records else "no records")
    problems = list(summary["problems"]) if summary else []
    if not summary:                   # cut short: name what failed before the cut
        for record in by_kind.get("request", []) + by_kind.get("probe", []):
            if not record.get("ok"):
                problems += [f"{warmup.request_label(record)}: {p}" for p in record["problems"]]
    return {
        "run": (by_kind.get("run") or [None])[-1],
        "requests": [{k: r.get(k) for k in ("wave", "index", "request_id", "http_status",
                                            "prompt_tokens", "cached_tokens",
                                            "completion_tokens", "finish_reason", "stop_reason",
                                            "latency_s", "ok")}
                     for r in by_kind.get("request", [])],
        "waves": [{k: w.get(k) for k in ("wave", "depth", "release_skew_ms", "duration_s", "ok")}
                  for w in by_kind.get("wave", [])],
        "metrics": [{k: m.get(k) for k in ("source", "state", "why", "highlights", "warnings")}
                    for m in by_kind.get("metrics", [])],
        "status": [{k: r.get(k) for k in ("path", "state", "why", "delta")}
                   for r in by_kind.get("status", [])],
        "probe": [{k: r.get(k) for k in ("item", "round", "index", "ttft_s", "total_s", "ok")}
                  for r in by_kind.get("probe", [])],
        "probe_summary": (by_kind.get("probe_summary") or [None])[-1],
        "problems": problems,
        "verdict": summary["verdict"] if summary else None,
        "exit_code": summary["exit_code"] if summary else None,
        "ends": ends,
        "issues": issues,
    }


def _cell(value) -> str:
    return "-" if value is None else str(value)


def format_report(report: dict) -> str:
    lines = []
    run = report["run"]
    if run and run.get("mode") == "probe":
        plan = run.get("plan") or {}
        lines.append(f"probe {run.get('run_id')}: {run.get('base_url')} model {run.get('model')} "
                     f"(server {(run.get('versions') or {}).get('server')}), "
                     f"{plan.get('rounds')} rounds of "
                     f"{', '.join(i['item'] for i in plan.get('items', []))}, "
                     f"{plan.get('requests_total')} requests, deadline {plan.get('deadline_s')} s")
    elif run:
        plan = run.get("plan") or {}
        waves = ",".join(w["wave"] for w in plan.get("waves", []))
        lines.append(f"run {run.get('run_id')}: {run.get('base_url')} model {run.get('model')} "
                     f"(server {(run.get('versions') or {}).get('server')}), waves {waves}, "
                     f"{plan.get('requests_total')} requests, B1 "
                     f"{plan.get('b1_prompt_tokens_counted') or 'estimated'} tokens, deadline "
                     f"{plan.get('deadline_s')} s")
    if report["requests"]:
        columns = ("wave", "request_id", "http_status", "prompt_tokens", "cached_tokens",
                   "completion_tokens", "finish_reason", "stop_reason", "latency_s", "ok")
        heads = ("wave", "id", "status", "prompt", "cached", "completion", "finish", "stop",
                 "latency", "ok")
        rows = [heads] + [tuple(_cell(r[c]) for c in columns) for r in report["requests"]]
        widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
        lines += ["", *("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                        for row in rows)]
    if report["waves"]:
        lines.append("")
        lines += [f"{w['wave']:<4} depth {w['depth']}  skew {_cell(w['release_skew_ms'])} ms  "
                  f"{_cell(w['duration_s'])} s  {'ok' if w['ok'] else 'FAILED'}"
                  for w in report["waves"]]
    for m in report["metrics"]:
        lines += ["", f"counter deltas from {m['source']} ({m['state']}"
                  f"{': ' + m['why'] if m['why'] else ''}):"]
        lines += [f"  {k} {_cell(v)}" for k, v in (m["highlights"] or {}).items()]
        lines += [f"  warning: {w}" for w in m.get("warnings") or []]
    for st in report["status"]:
        lines.append(f"status file {st['path']}: {st['state']}"
                     f"{': ' + st['why'] if st['why'] else ''}")
    if report["probe_summary"]:
        lines += ["", "probe (first round against the median of later rounds):"]
        lines += [probe_line(item) for item in report["probe_summary"]["items"]]
    if report["problems"]:
        lines += ["", "problems:"] + [f"  - {p}" for p in report["problems"]]
    lines.append("")
    lines += [f"note: {issue}" for issue in report["issues"]]
    verdict = report["verdict"]
    lines.append(f"verdict: {verdict} (exit {report['exit_code']})" if verdict
                 else f"verdict: none ({report['ends']})")
    return "\n".join(lines).lstrip("\n")


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG + " report",
        description="Print a readable report of a warm-up (or probe) records file, also one cut "
                    "short by a kill. Exit status: the run's own (0 pass), 1 when the file has "
                    "no summary, 2 when it cannot be read.")
    parser.add_argument("records", help="the JSON Lines records file")
    parser.add_argument("--json", action="store_true", help="the report as one JSON object")
    args = parser.parse_args(argv)
    try:
        records, issues = load_records(args.records)
    except OSError as exc:
        print(f"{PROG} report: cannot read {args.records}: {exc.strerror or exc}",
              file=sys.stderr)
        return warmup.EXIT_USAGE
    report = build_report(records, issues)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return report["exit_code"] if report["exit_code"] is not None else warmup.EXIT_FAIL


# ---------------------------------------------------------------------------
# probe: time to first token, first round against later rounds (did the warm-up work?).
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
        elif warmup.count_value(usage.get("completion_tokens")) != tokens:
            shown = warmup.clean_text(repr(usage.get("completion_tokens")), 40)
            problems.append(f"completion_tokens {shown}, expected {tokens}")
        if response.watched_at is None:
            problems.append("no token text arrived")
    sent = slot.sent_at
    first = response.watched_at if response is not None else None
    return {
        "record": "probe", "run_id": run.settings.plan.run_id, "item": item, "round": round_no,
        "index": slot.index, "engine": slot.engine, "request_id": slot.request_id,
        "http_status": timing["http_status"],
        "ttft_s": round(first - sent, 4) if first is not None and sent is not None else None,
        "total_s": timing["latency_s"],
        "prompt_tokens": warmup.count_value((usage or {}).get("prompt_tokens")),
        "completion_tokens": warmup.count_value((usage or {}).get("completion_tokens")),
        "ok": not problems, "problems": problems,
    }


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def _slowest(values: list[float | None]) -> float | None:
    """A burst is as slow as its slowest request; a missing time makes the round unknown."""
    return None if not values or None in values else max(values)


def probe_summary(records: list[dict]) -> list[dict]:
    """Per item: round 1 against the median of later rounds (each round: its slowest request),
    for TTFT and total; a ratio, never a verdict."""
    items = []
    for item in dict.fromkeys(r["item"] for r in records):
        rounds: dict[int, list[dict]] = {}
        for r in records:
            if r["item"] == item:
                rounds.setdefault(r["round"], []).append(r)
        per_round = {n: (_slowest([r["ttft_s"] for r in rs]), _slowest([r["total_s"] for r in rs]))
                     for n, rs in rounds.items()}
        first = per_round.get(1, (None, None))
        later = [v for n, v in per_round.items() if n > 1]
        entry = {"item": item, "rounds": len(per_round)}
        for i, name in enumerate(("ttft", "total")):
            warm = _median([v[i] for v in later])
            entry[f"{name}_first_s"] = first[i]
            entry[f"{name}_later_median_s"] = warm
            entry[f"{name}_ratio"] = round(first[i] / warm, 2) if first[i] and warm else None
        items.append(entry)
    return items


def probe_line(entry: dict) -> str:
    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f} ms"
    return (f"  {entry['item']:<7} TTFT first {ms(entry['ttft_first_s'])} vs later "
            f"{ms(entry['ttft_later_median_s'])} (x{_cell(entry['ttft_ratio'])}); total first "
            f"{ms(entry['total_first_s'])} vs later {ms(entry['total_later_median_s'])} "
            f"(x{_cell(entry['total_ratio'])})")


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
                    prompt = server.b1_prompts[engine] if item == "long" else \
                        warmup.make_short_prompt(f"{plan.run_id}-{round_no}", depth, index)
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
                   "priority": plan.priority, "stream": True,
                   "deadline_s": plan.deadline_s, "socket_cap_s": plan.socket_cap_s}
    settings = warmup.common_settings(parser, args, plan, PROG + " probe", mode="probe",
                                      plan_record=plan_record, planned=planned_per_engine)
    if args.dry_run:
        print(f"probe plan for {settings.target.display}: {args.rounds} rounds of single, "
              f"burst3, burst4{', long (' + str(args.long_tokens) + ' tokens)' if args.long_tokens else ''}"
              f"; streaming, {plan.tokens} tokens each; deadline {plan.deadline_s:g} s")
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
                          "not a verdict on the warm-up"})
    run.say("probe (first round against the median of later rounds):")
    for entry in items:
        run.say(probe_line(entry))


def build_probe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG + " probe", epilog=warmup.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Did the warm-up work? Measure time to first token and total time with "
                    "streamed completions: a single request, a burst of 3 and a burst of 4 "
                    "(and a long prompt), repeated --rounds times; report the first round "
                    "against the median of the later ones. A ratio, never a verdict.")
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
                             "sized with /tokenize (default: none)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and exit 0 without touching the network")
    return parser


# ---------------------------------------------------------------------------
# main()
# ---------------------------------------------------------------------------

COMMANDS = {"report": report_main, "probe": probe_main}


def main(argv: list[str] | None = None) -> int:
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
