"""qualify.py report: what a records file shows, each run judged from its own evidence.

report_main() has the file read and judged as one object (readback: load_records() and
judge_file()) and shows it, format_report() or --json; it never imports a program or
core.vllm_client. drafted_findings() is --expect-k's check.
"""

from __future__ import annotations

import argparse
import json
import sys

from core.contract import batch_name, chunk_said, read_plan
from core.readyfile import sha256_type
from tools.readback import FileReport, RunReport, decisive, judge_file, load_records, tidy
from core.records import (CLASSES, SHAPED, parse_fields, parts_text, record_class,
                          shape_text, show, shown_number)
from core.cli import EXIT_FAIL, EXIT_PASS, EXIT_USAGE, emit, number_in, whole
from core.sanitize import clean_text
from tools.lines import gate_line, gate_summary_line, known, probe_line

PROG = "qualify.py report"
# A --expect-k finding, declared as the records are (each field an attribute).
Finding = record_class("finding", parse_fields("wave:str holds:bool said:str "
                                               "~drafted_length:num"))
SPEC_NONE, SUMMARY_NONE = SHAPED["spec"](), CLASSES["summary"]()     # absent: every field None


def time_to_warm_line(phases) -> str:
    """'time to warm: process start -> healthy 36.2 s -> warm 4.1 s (40.3 s in all)'."""
    def secs(value):
        return "unknown" if value is None else f"{value:.1f} s"
    return (f"time to warm: process start -> healthy {secs(phases.start_to_healthy_s)} -> "
            f"warm {secs(phases.healthy_to_warm_s)} ({secs(phases.start_to_warm_s)} in all)")


def run_header(run: dict) -> str:
    """The run record in one line: what ran, where, against which model and server."""
    plan, mode = run.plan, run.mode
    model = f"model {known(run.model)} (server {known(run.versions.get('server'))})"
    where = f"{show(run.run_id)}: {show(run.base_url)} {model}"
    engines = run.engines or []
    where += f", engines {','.join(map(str, engines))}" if engines else ""
    deadline = f"deadline {show(plan.deadline_s)} s"
    if mode == "probe":
        items = ", ".join(show(i.item) for i in plan.get("items") or [])   # dict's items()
        return (f"probe {where}, {show(plan.rounds)} rounds of {items or '-'}, "
                f"{show(plan.requests_total)} requests, {deadline}")
    if mode == "gate":
        return (f"gate {where}, endpoint {show(plan.endpoint)}, {show(plan.requests_total)} "
                f"requests, max CER {show(plan.max_cer)}, max_tokens {show(plan.max_tokens)}, "
                f"{deadline}")
    warm, _ = read_plan(plan)             # the one reader of a warm-up's plan
    waves = ",".join(batch_name(k, d) for k, d in warm.batches()) if warm else "unreadable"
    given = "; given: " + ", ".join(v for _, v in warm.given) if warm and warm.given else ""
    counted = plan.b1_prompt_tokens_counted
    chunk = f" ({chunk_said(warm)})" if warm else ""
    return (f"warm-up {where}, waves {waves}, {show(plan.requests_total)} "
            f"requests, B1 {show(counted) if counted is not None else 'estimated'} "
            f"tokens{chunk}, {deadline}{given}")


def request_table(requests: list[dict]) -> list[str]:
    """The requests as an aligned table; an engine column only when some request has one."""
    columns = ["wave", "request_id", "http_status", "prompt_tokens", "cached_tokens",
               "completion_tokens", "finish_reason", "stop_reason", "latency_s", "ok"]
    heads = ["wave", "id", "status", "prompt", "cached", "completion", "finish", "stop",
             "latency", "ok"]
    if any(r.engine is not None for r in requests):
        columns.insert(1, "engine")
        heads.insert(1, "engine")
    rows = [heads] + [[show(r.get(c)) for c in columns] for r in requests]
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def wave_text(wave) -> str:
    where = show(wave.wave) + ("" if wave.engine is None else f" e{wave.engine}")
    return (f"{where:<4} depth {show(wave.depth)}  skew {show(wave.release_skew_ms)} ms  "
            f"{show(wave.duration_s)} s  {show(wave.released_at)} -> "
            f"{show(wave.last_answer_at)}  {'ok' if wave.ok else 'FAILED'}")


def evidence_table(waves: list[dict]) -> list[str]:
    """Per wave (and engine): what the engine did, as its counters and gauges say —
    observed depth, speculative acceptance, tokens per engine step. Evidence, not proof
    of batch shapes or graph capture; '-' where the server did not say. [] when no wave
    has any (run with --gauge-interval-ms 0): a table of '-' would say nothing. A counter
    that went down during a wave is named either way."""
    went_down = sorted({show(k, 160) for w in waves for k in w.counters_went_down or []})
    notes = [f"counter went down during a wave (a restart?): {k}" for k in went_down]
    if all(w.gauge_samples is None and w.running_max is None and w.spec_decode is None
           and w.tokens_per_step is None for w in waves):
        return notes
    heads = ["wave", "engine", "depth", "observed", "gauge samples", "drafted",
             "accept rate", "mean accept len", "accept by position", "tokens/step"]
    rows = [heads]
    for wave in waves:
        spec = wave.spec_decode or SPEC_NONE
        positions = " ".join(show(p, 8) for p in spec.acceptance_by_position or [])
        rows.append([show(wave.wave), show(wave.engine), show(wave.depth),
                     shown_number(wave.running_max), show(wave.gauge_samples),
                     show(spec.drafted_length), show(spec.acceptance_rate),
                     show(spec.mean_acceptance_length), positions or "-",
                     show(wave.tokens_per_step)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return lines + notes


def counted_lines(counted) -> list[str]:
    """An operator counter (--metrics-counter) against what the warm-up sent."""
    if not counted:
        return []
    more = counted.foreign
    during = ", ".join(map(show, counted.overlaps)) or "-"
    said = "not compared (a read failed)" if more is None else "no foreign work" \
        if not more else f"FOREIGN WORK: {shown_number(more)} more (during {during})"
    return [f"  {show(counted.counter)}: counted {shown_number(counted.delta)} "
            f"{show(counted.unit)}, the warm-up sent {shown_number(counted.sent)}: {said}"]


def overlapped(metrics: list) -> dict:
    """wave -> the sources whose operator counter saw foreign work during it."""
    found: dict = {}
    for m in metrics:
        for wave in m.counted.overlaps if m.counted else []:
            found.setdefault(wave, []).append(show(m.source, 120))
    return found


def format_run(run) -> list[str]:
    """One run's lines (a RunReport), ending with its verdict line."""
    lines = [run_header(run.run)] if run.run else ["(no run record it could read)"]
    if run.requests:
        lines += [""] + request_table(run.requests)
    if run.waves:
        foreign = overlapped(run.metrics)
        lines += [""] + [wave_text(w) + "".join(f"  foreign work on {s}" for s in
                                                foreign.get(w.wave, []))
                         for w in run.waves]
        table = evidence_table(run.waves)
        if table:
            lines += ["", "per-wave evidence (counters and gauges; not worker RPC steps, not "
                          "proof of graph capture):"] + table
    for m in run.metrics:
        why = f": {show(m.why, 200)}" if m.why else ""
        lines += ["", f"counter deltas from {show(m.source)} ({show(m.state)}{why}):"]
        lines += [f"  {show(k, 160)} {show(v)}" for k, v in m.highlights.items()]
        lines += [f"  warning: {show(w, 300)}" for w in m.warnings or []]
        lines += counted_lines(m.counted)
    for st in run.status:
        why = f": {show(st.why, 200)}" if st.why else ""
        moved = ", ".join(f"{show(k, 60)} {show(v)}"
                          for k, v in list((st.delta or {}).items())[:12])
        fresh = f" (fresh by {show(st.fresh_by, 80)})" if st.fresh_by else ""
        lines.append(f"status file {show(st.path, 200)}: {show(st.state)}{why}"
                     f"{fresh}" + (f"; deltas: {moved}" if moved else ""))
    if run.probe_summary:
        lines += ["", "probe (first round against the median of later rounds):"]
        lines += [probe_line(i) for i in run.probe_summary["items"]]   # a dict method's name
    if run.gate:
        lines += ["", "gate (exact copies; counts and distances only):"]
        lines += [gate_line(r) for r in run.gate]
    if run.gate_summary:
        lines.append(gate_summary_line(run.gate_summary))
    if run.problems:
        lines += ["", "problems:"] + [f"  - {show(p, 300)}" for p in run.problems]
    summary = run.summary or SUMMARY_NONE
    if summary.time_to_warm:
        lines.append(time_to_warm_line(summary.time_to_warm))
    lines += [f"note: {show(n, 300)}" for n in dict.fromkeys(run.notes + (summary.notes or []))]
    lines += [f"warning: {show(w, 300)}" for w in summary.warnings or []]
    if run.evidence_problems:
        lines += ["evidence: incomplete"] + [f"  - {show(p, 300)}" for p in run.evidence_problems]
    if run.shape:
        lines.append(shape_text(run.shape))
    code = run.exit_code
    if not run.summary:
        lines.append(f"verdict: incomplete (exit {code}; {run.ends})")
    elif run.verdict == "custom":
        lines.append(f"verdict: custom plan, not the contract's (exit {code}; "
                     f"{show('; '.join(run.differences), 300)}): it passed its own plan")
    elif run.verdict != run.claimed:
        lines.append(f"verdict: {show(run.verdict)} (exit {code}; the summary claims "
                     f"{show(run.claimed)}, the evidence does not show it)")
    else:
        counts = parts_text(run.parts)
        lines.append(f"verdict: {show(run.verdict)} (exit {code})"
                     + (f": {counts}" if counts else ""))
    return lines


def format_report(report) -> str:
    """The whole file for a terminal: bad lines first, then each run, the last run last."""
    lines = [f"note: {show(issue, 300)}" for issue in report.issues]
    runs = report.runs
    if report.verdict == "none":
        lines.append(f"verdict: none ({report.ends})")
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
        allow_abbrev=False,
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
                    "'pass'. The warm-up judged itself by the same rules (core/contract.py "
                    "decide()). Exit status: the last run's, judged again, by warmup.py "
                    "--help's table (0 only for the contract's pass); 1 also for an "
                    "incomplete run, a custom plan, no run in the file, or --expect-k not "
                    "holding; 2 when the file cannot be read.")
    parser.add_argument("records", help="the JSON Lines records file")
    parser.add_argument("--json", action="store_true",
                        help="the report as one JSON object: runs (each with its run, requests, "
                             "waves, metrics, status, probe, probe_summary, gate, summary, "
                             "problems, verdict, exit_code, claimed, evidence, "
                             "evidence_problems, differences, notes, ends), issues, the last run's "
                             "verdict, exit_code and evidence, and expect_k when asked")
    parser.add_argument("--expect-k", metavar="1-2:5,3-4:4", type=expect_k_type,
                        help="the server's k by batch size (1-2:5,3-4:4: 5 at batch 1-2, 4 at "
                             "3-4), or by wave (B1=5,B3=4): each wave's drafted length "
                             "(draft tokens / drafts over the wave) against the k its depth "
                             "allows: under it, or toward a smaller batch's larger k (its "
                             "tails, their share said), is evidence; the exit status is 1 "
                             "only when the server counts other draft positions than the "
                             "largest k, a wave drafts more than its batch sizes allow, or "
                             "a wave's length was not observed")
    parser.add_argument("--plan-sha256", metavar="HEX", type=sha256_type,
                        help="exit 0 only when the last run ran the plan of this SHA-256 "
                             "(the one reviewed: sha256sum FILE)")
    parser.add_argument("--proposer", choices=("mtp", "ngram"), default="mtp",
                        help="how the server drafts: mtp (or a draft model) k tokens every "
                             "step, ngram at most k (fewer when its lookup finds less: only "
                             "more than k, or another count of draft positions, differs) "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        records, issues = load_records(args.records)
    except OSError as exc:
        emit(f"{PROG}: cannot read {show(args.records, 200)}: "
                    f"{exc.strerror or type(exc).__name__}; give the path of a records file",
                    sys.stderr)
        return EXIT_USAGE
    report = tidy(judge_file(records, issues, args.records))     # safe to show, once
    last, unheld = _last_run(report), []
    if args.expect_k:
        findings = drafted_findings(last.waves or [], args.expect_k, args.proposer,
                                    last.run.spec_positions if last.run else None)
        report = FileReport(report, expect_k=findings)
        unheld += [] if all(f.holds for f in findings) else ["--expect-k does not hold"]
    if args.plan_sha256:
        pinned = plan_pinned(last, args.plan_sha256)
        report = FileReport(report, plan_sha256=pinned)
        unheld += [] if pinned.holds else [pinned.said]
    code = report.exit_code or (EXIT_FAIL if unheld else EXIT_PASS)
    if args.json:
        # as written, not \uXXXX: six characters each could take a line past the sink's
        # cut (core.sanitize.SINK_TEXT_LIMIT), which would leave JSON that does not parse
        emit(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        emit(format_report(report) + "".join(
            f"\nexpect-k {f.wave}: {f.said}" for f in report.expect_k or [])
            + final_line(report, unheld, code))
    return code


Pinned = record_class("pinned", parse_fields("wanted:str found:str? holds:bool said:str"))


def plan_pinned(last, wanted: str):
    """--plan-sha256: does the last run's plan file have the digest reviewed?"""
    file = last.run and last.run.plan.file
    found = file.sha256 if file else None
    said = f"its plan is {'sha256:' + show(found, 64) if found else 'not a plan file'}, " \
           f"not sha256:{wanted}"
    return Pinned(wanted=wanted, found=found, holds=found == wanted,
                  said="" if found == wanted else said)


def final_line(report: dict, unheld: list, code: int) -> str:
    """The file's verdict with the exit status report returns, as a last line of its own
    where the last run's verdict line does not already say it ("": it does)."""
    last = _last_run(report)
    if report.verdict == "none":
        return f"\nverdict: none (exit {code})"
    if unheld:
        return f"\nverdict: {show(report.verdict)}, but {'; '.join(unheld)} (exit {code})"
    shown = report.runs[-1] if report.runs else RunReport()     # what its own line says
    if shown.verdict != report.verdict or shown.exit_code != code or \
            last.ends != shown.ends or len(report.runs) > 1:
        return f"\nverdict: {show(report.verdict)} (exit {code}; {show(report.ends, 300)})"
    return ""


def expect_k_type(text: str) -> dict:
    """An argparse type, either form: k by batch size, as the server's schedule says it
    ('1-2:5,3-4:4' -> {"batch": {1: 5, 2: 5, 3: 4, 4: 4}}), or k by wave ('B1=5,B3=4' ->
    {"wave": {"B1": 5, "B3": 4}})."""
    batch, size = ":" in text, whole(1, 99)
    expected: dict = {}
    for item in text.split(","):
        name, _, k = item.strip().partition(":" if batch else "=")
        low, _, high = name.partition("-")
        sizes = (number_in(low, size), number_in(high if "-" in name else low, size)) \
            if batch else None
        if number_in(k, whole(1, 64)) is None or (None in sizes if batch else not (
                name[:1] == "B" and number_in(name[1:], size))):
            raise argparse.ArgumentTypeError(
                f"wants k by batch size such as 1-2:5,3-4:4, or WAVE=K pairs such as "
                f"B1=5,B3=4 (K from 1 to 64, in ASCII digits); got {clean_text(text, 80)!r}")
        if batch and sizes[1] < sizes[0]:
            raise argparse.ArgumentTypeError(
                f"the range {name} is written high to low: write it low to high "
                f"({high}-{low}); got {clean_text(text, 80)!r}")
        for key in range(sizes[0], sizes[1] + 1) if batch else [name]:
            if key in expected:
                raise argparse.ArgumentTypeError(f"names {key} twice; got {text!r}")
            expected[key] = int(k)
    return {"batch" if batch else "wave": expected}


def drafted_findings(waves: list[dict], expected: dict, proposer: str = "mtp",
                     positions: int | None = None) -> list[dict]:
    """Each wave (each engine's record of it) the expectation names: its drafted length
    (draft tokens / drafts over the wave) against its k (pure).

    With k by batch size a wave of depth d runs most steps at batch d (its own k) and may
    end at any smaller size when a request finishes first (its tails, at their k). mtp
    (drafts k every step): holds when k-1/2 < drafted <= k; between its own k and a
    smaller batch's larger k it holds, its tail share said; under k it holds as evidence
    (the patch note: smaller shapes and tails are evidence, not failure); only more than
    any k its batch sizes allow differs. ngram (drafts at most k): holds when 0 < drafted
    <= the largest k the wave may run at. Either way the draft positions the server counts
    (`positions`, from its /metrics) must be the largest k expected: a server started with
    another k is what fails."""
    by_batch = expected.get("batch")
    wanted = by_batch or expected.get("wave", {})
    top = max(wanted.values()) if wanted else None
    found = []
    if positions is not None and top is not None and positions != top:
        found.append(Finding(wave="server", holds=False, said=f"it counts {positions} draft "
                             f"positions: its k is {positions}, not {top}"))
    names = sorted({str(w.wave) for w in waves if not w.path}) if by_batch else list(wanted)
    for name in names:
        mine = [w for w in waves if w.wave == name]
        if not mine:
            found.append(Finding(wave=name, holds=False, said="no wave record of it"))
        for wave in mine:
            found.append(judge_drafted(wave, name, by_batch, wanted, proposer))
    return found


def judge_drafted(wave, name: str, by_batch: dict | None, wanted: dict, proposer: str):
    """One wave record's drafted length against the k its depth (and its tails) allow."""
    where = name + ("" if wave.engine is None else f" e{show(wave.engine)}")
    spec = wave.spec_decode or SPEC_NONE
    drafted, depth = spec.drafted_length, wave.depth or 0
    k = by_batch.get(depth) if by_batch else wanted.get(name)
    if drafted is None or k is None:
        why = f"no k for batch size {depth}" if k is None else \
            "no drafts over the wave: the proposer proposed nothing" if spec.drafts == 0 \
            else "no speculative counters over the wave"
        return Finding(wave=where, holds=False, said=f"drafted length not observed ({why})"
                       if drafted is None else f"drafted length {drafted:g}: {why}")
    tails = sorted({by_batch[s] for s in range(1, depth) if s in by_batch} - {k}) \
        if by_batch else []
    said = f"drafted length {drafted:g}, k {k}"
    tail = next((t for t in tails if k < drafted < t), None)     # a smaller batch's larger k
    if proposer == "ngram":
        most = max([k] + tails)
        holds, said = 0 < drafted <= most, f"{said} (ngram: at most {most}): " + (
            "holds" if 0 < drafted <= most else "DIFFERS")
    elif k - 0.5 < drafted <= k:              # a step that drafted less, at most
        holds, said = True, f"{said}: holds"
    elif tail is not None:
        holds, said = True, (f"{said}: holds, explained by tails (a smaller batch drafts "
                             f"{tail}: about {(drafted - k) / (tail - k):.0%} of its steps)")
    elif drafted < k:                        # tails and short steps: evidence, not failure
        holds, said = True, (f"{said}: holds as evidence, {(k - drafted) / k:.0%} under k "
                             f"(steps that drafted fewer: requests ending, smaller shapes, "
                             f"tails)")
    else:
        holds, said = False, f"{said}: DIFFERS (more than any k its batch sizes allow)"
    return Finding(wave=where, holds=holds, drafted_length=drafted, said=said)


def _last_run(report):
    return decisive(report.runs) if report.runs else RunReport()
