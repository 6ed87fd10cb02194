#!/usr/bin/env python3
"""Warm up a freshly started vLLM server, and leave records of what the warm-up did.

The first requests a new server sees pay one-time costs (a long chunked prefill,
decode and speculative draft/verify at client concurrency 1-4, lazily compiled
kernels). This helper pays them on purpose, in waves B1..B4, inside hard time bounds,
and writes JSON Lines records that an operator reads before releasing producers.

The run, in order (each step is a function or method right below):

  main()                vllm_client.server_main(): options -> build_warmup() -> a WarmUp
                        (--dry-run prints it: dry_run); a contract.Plan, or a --plan file's
  runframe.run_session  records open, signals handled, exactly one summary, exit code
    WarmUp.steps()      the warm-up's steps:
      learn_server()      model, context length, engines (vllm_client)
      size_long_prompts() B1's prompt per engine, sized with /tokenize
      warm_batch()        for each batch of plan.batches(): guarded_batch() (guard ->
                          release -> collect), request_record() per answer (kinds.judge),
                          wave records with what the engine's counters show
      Evidence.read_after counter deltas and status files over the warm-up (evidence.py)
    ServerProgram.judge contract.decide() on the records this run wrote: the one verdict
    after_summary()     with --ready-file: the ready file from that verdict (readyfile)

Python 3.10+; the contract is CONTRACT.md beside this file.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the folder's modules
try:
    import core.runframe as runframe
    from core.contract import (NOT_REPORTED, REVIEWED, Plan, b1_prompts, batch_name,
                               cache_check, chunk_said, cross_check, differences, engine_shares,
                               one_step_said, parse_waves, plan_label, plan_of_file,
                               plan_record, wave_name)
    from core.evidence import Evidence, EvidenceOptions, time_to_warm
    from core.kinds import PATH_NAMES, Kind, judge, kinds_of, parse_paths, request_id
    from core.prompts import MAX_LONG_PROMPT_TOKENS, ONE_STEP_FLOOR, make_short_prompt
    from core.records import typed
    from core.cli import (Setting, add_status_wait_options, given_value, number_type, plug_in,
                          seconds, whole)
    from core.runframe import Run, RunSettings, add_file_option, add_run_options
    from core.files import writable
    from core.prometheus import series_name
    from core.sanitize import clean_text, count_value
    from core.transport import UsageError, __version__, parse_url
    from core.vllm_client import (ENVIRONMENT_HELP, Connection, ServerProgram, Slot,
                                  add_server_options, answer_record, connection_from,
                                  format_engines, read_slot, release_skew_ms, routed,
                                  server_main, slot_timing, template_kwargs_type)
    from core.vllm_metrics import (changed_only, counter_deltas, engine_deltas, spec_figures,
                                   tokens_per_step, went_down)
except ImportError as exc:           # a module of the folder is missing: one line, no trace
    print(f"warmup.py: cannot load {exc.name or exc}: offload/launch/ is copied and rolled "
          f"back as one folder; restore the whole folder", file=sys.stderr)
    sys.exit(2)

TIME_TO_WARM_HELP = {
    "start_to_healthy_s": "The last run's server: its process start to its first /health "
                          "200 (WARMUP_HEALTHY_AT, from start.sh).",
    "healthy_to_warm_s": "The last run's server: its first /health 200 to the warm-up's end.",
    "start_to_warm_s": "The last run's server: its process start (process_start_time_seconds) "
                       "to the warm-up's end.",
}
MAX_WAVE_SERIES = 2000                # counter series one wave record holds at most
DEFAULT_DEADLINE_S = 90.0
DEFAULT_HARD_S = 95.0
MAX_HARD_S = 86400.0                  # warmup_serve.sh's bound too (its epoch sum stays exact)


def main(argv: list[str] | None = None, prog: str = "warmup.py") -> int:
    """The warm-up's command line; returns the exit status."""
    if argv is None:
        runframe.as_program()
    return server_main(build_parser(prog), sys.argv[1:] if argv is None else argv, prog,
                       "warmup", build_warmup)


# The warm-up: a ServerProgram whose steps are the plan's batches.

class WarmUp(ServerProgram):
    """The plan's batches on every engine, each behind the guard; judged by decide()."""

    mode = "warmup"

    def __init__(self, connection: Connection, plan: Plan, settings: RunSettings,
                 evidence: EvidenceOptions, ready_file: str | None = None):
        super().__init__(connection)
        self.plan = plan
        self.settings = settings
        self.evidence = Evidence(evidence)
        self.healthy_at = evidence.healthy_at
        self.ready_file = ready_file          # rewritten after a contract pass (after_summary)
        self.vouched: dict = {}               # the ready file as this run found it
        self.b1_prompts: dict = {}            # engine -> (prompt, counted or None)

    def steps(self, run: Run) -> None:
        """Everything the warm-up sends, in order; Fatal ends it early."""
        self.learn_server(run)        # the server to ourselves: no other helper runs now
        if self.ready_file:           # taken away first: a run that does not pass leaves none
            self.vouched = plug_in("core.readyfile").take_for_run(self.ready_file)
        self.b1_prompts = self.size_long_prompts(run, self.plan.b1_target, self.plan.tokens,
                                                 self.plan.chunk_tokens)
        self.plan = self.plan.replace(context=self.server.max_model_len)
        run.write_run_record()
        run.say(start_line(self, run))
        if self.plan.chunk_source == "assumed":
            self.tally.warnings.append(
                f"the server's prefill chunk was not given (--chunk-tokens, "
                f"WARMUP_CHUNK_TOKENS): {self.plan.chunk_tokens} (K1's) was assumed; a server "
                f"started with a larger --max-num-batched-tokens may prefill B1 in one step, "
                f"which /metrics cannot show")
        self.evidence.read_before(run)
        batches = self.plan.batches()
        for position, (kind_, depth) in enumerate(batches):
            if run.clock.remaining() <= 0:
                rest = ",".join(batch_name(*b) for b in batches[position:])
                said = f"deadline passed before {batch_name(kind_, depth)}: {rest} not run"
                # the shape test's own verdict counts what it missed; the waves had passed
                (self.tally.warnings if position >= len(self.plan.waves)
                 else self.tally.problems).append(said)
                break
            if not self.warm_batch(run, kind_, depth):
                break
        if self.tally.requests:
            self.evidence.read_after(run, self.connection.target, self.guard.first_counters,
                                     self.tally, lambda deltas, record: engine_figures(
                                         self, deltas, record))

    def planned_per_engine(self) -> int:
        return self.plan.requests_per_engine

    def engines_skipped(self) -> list:
        covered = routed(self.server.engines) or self.server.served
        return sorted(set(self.server.served) - set(covered))

    def plan_fields(self) -> dict:
        return recorded_plan(self)

    def summary_fields(self, run: Run) -> dict:
        """The summary's counts and parts (the verdict's), highlighted counters and, per
        engine, speculative acceptance over the whole run (null without speculative
        counters)."""
        deltas = self.evidence.main_deltas
        spec = None if deltas is None else {
            "all" if e is None else str(e): spec_figures(engine_deltas(deltas, e))
            for e in self.server.engines}
        found = list(self.verdict.differences)
        fields = dict(super().summary_fields(run), counters=self.evidence.highlights,
                      spec_decode=spec, contract=not found, plan_differences=found,
                      cache_check=cache_check(self.tally.requests),
                      time_to_warm=time_to_warm(self.server.process_start, self.healthy_at,
                                                time.time()),
                      parts=[list(part) for part in self.verdict.parts])
        if self.verdict.shape is not None:
            fields["shape"] = self.verdict.shape.as_record()
        return fields

    def after_summary(self, run: Run, summary: dict) -> None:
        """With --ready-file: the ready file from this run's own verdict."""
        if self.ready_file:
            plug_in("core.readyfile").rewrite_after_run(
                self.ready_file, run, summary, self.vouched, self.connection.target)

    def exported(self, run: Run, summary: dict) -> list[tuple]:
        return exported_samples(self.server.engines, self.tally.requests,
                                self.plan.requests_per_engine, summary,
                                self.server.process_start, self.plan)

    # -- one batch ---------------------------------------------------------------

    def warm_batch(self, run: Run, kind_: Kind, depth: int) -> bool:
        """One batch of a kind on every engine at once; False when the guard refused it."""
        name = batch_name(kind_, depth)
        slots = self.batch_slots(run, kind_, depth)
        self.evidence.mark(run, name)
        started = run.clock.elapsed()
        finished = self.guarded_batch(run, name, slots, first=not self.tally.requests,
                                      observe_ms=self.plan.gauge_interval_ms)
        if finished is None:
            return False
        duration = self.batch_ended_at - started
        answers = [typed(request_record(run, self, depth, slot, kind_)) for slot in finished]
        for record in answers:
            run.write(record)
        self.tally.requests += answers
        evidence = wave_evidence(self, run, name)
        # What the engines counted over the wave against its records: the wave records say
        # it, decide() judges it from them.
        shown = [] if evidence is None else cross_check(
            evidence["deltas"], answers, name, evidence["went_down"])[0]
        for engine in self.server.engines:
            mine = [r for r in answers if r["engine"] == engine]
            mine_slots = [s for s in finished if s.engine == engine]
            seen = wave_figures(evidence, engine, self.observed)
            run.write(wave_record(run, name, kind_, depth, engine, mine, mine_slots, finished,
                                  duration, started, shown, seen))
            run.say(wave_line(name, engine, mine, release_skew_ms(mine_slots), duration,
                              kind_.holds.long_prompt, seen))
        if kind_.holds.long_prompt and cache_check(answers) == "not_made" \
                and any(r["http_status"] == 200 for r in answers):
            self.tally.notes.append(f"B1 {NOT_REPORTED}")
        return True

    def batch_slots(self, run: Run, kind_: Kind, depth: int) -> list[Slot]:
        """The batch's requests on every engine, encoded before any client connects."""
        run_id, plan = run.settings.run_id, self.plan
        slots = []
        for engine in self.server.engines:
            for index in range(depth):
                rid = request_id("warmup", run_id, engine, batch_name(kind_, depth), index)
                seed = f"{run_id}/{engine}" + ("" if kind_.path is None else f"/{kind_.name}")
                prompt = self.b1_prompts[engine][0] if kind_.holds.long_prompt else \
                    make_short_prompt(seed, depth, index)
                slots.append(self.make_slot(kind_, index, rid, engine, prompt, plan.tokens,
                                            plan.priority, plan.template_kwargs))
        return slots



def counted_type(text: str) -> tuple:
    """--metrics-counter's value (core.counted's grammar, loaded with the flag)."""
    try:
        return plug_in("core.counted").counted_type(text)
    except UsageError as exc:             # the folder lost it: argparse's usage error
        raise ValueError(str(exc)) from None


def recorded_plan(warm: WarmUp) -> dict:
    """The plan as the run record holds it (contract.plan_record()), with what this run
    learned: engines left cold, how it differs from the reviewed plan, B1's counted size."""
    counts = [counted for _, counted in warm.b1_prompts.values()]
    smallest = None if not counts or None in counts else min(counts)
    by_engine = {str(e): c for e, (_, c) in warm.b1_prompts.items()
                 if e is not None and c is not None}
    skipped = warm.engines_skipped()
    found = differences(warm.plan, skipped)
    return dict(plan_record(warm.plan), engines_skipped=skipped,
                contract=not found, differences=found, deadline_s=warm.settings.deadline_s,
                foreign_work=warm.evidence.options.foreign_work,
                b1_prompt_tokens_counted=smallest, b1_prompt_tokens_by_engine=by_engine or None,
                b1_sizing="tokenize" if smallest is not None else "estimate")


def wave_evidence(warm: WarmUp, run: Run, name: str) -> dict | None:
    """What the engine counted during the wave: counter deltas from the guard's read
    before it to a settled read after it (None without per-wave evidence)."""
    if not warm.plan.gauge_interval_ms:
        return None
    before = warm.guard.counters_before
    after, why = warm.guard.counters_after(run, name)
    if before is None or after is None:
        return {"deltas": {}, "went_down": [], "why": why or "no counters before it"}

    def engine_series(counts: dict) -> dict:       # its own, a histogram's buckets aside
        return {k: v for k, v in counts.items()
                if k.startswith("vllm:") and not series_name(k).endswith("_bucket")}
    before, after = engine_series(before), engine_series(after)
    return {"deltas": {k: v for k, v in counter_deltas(before, after).items()
                       if v is not None or (k in before and k in after)},
            "went_down": went_down(before, after), "why": None}


def engine_figures(warm: WarmUp, deltas: dict, record: dict) -> None:
    """Each engine's figures in the main metrics record (its share is decide()'s to judge)."""
    engines = routed(warm.server.engines)
    if engines and deltas:
        record["engines"] = engine_shares(
            deltas, engines, warm.plan.wave_requests * warm.plan.tokens,
            b1_prompts(warm.tally.requests))[0]


def request_record(run: Run, warm: WarmUp, depth: int, slot: Slot, kind_: Kind) -> dict:
    """A request record from what one client got: counts, reasons, verdict (judge())."""
    timing, answer = slot_timing(slot), read_slot(slot)
    problems = judge(answer, kind_, warm.plan.tokens, floor=warm.plan.b1_minimum,
                     diagnose=warm.diagnose)
    path = {} if kind_.path is None else {"path": kind_.name}
    return {
        "record": "request", "run_id": run.settings.run_id,
        "request_id": slot.request_id, "request_kind": kind_.name,
        "wave": batch_name(kind_, depth),
        **path, "depth": depth, "index": slot.index, "engine": slot.engine,
        **answer_record(answer),
        "latency_s": timing["latency_s"], "sent_at_s": timing["sent_at_s"],
        "ok": not problems, "problems": problems,
        "metrics": answer.get("metrics"),
        "speculative_decoding": answer.get("speculative_decoding"),
    }


def wave_record(run: Run, name: str, kind_: Kind, depth: int, engine, mine: list[dict],
                slots: list[Slot], finished: list[Slot], duration: float, started: float,
                shown: list[str], seen: dict) -> dict:
    """One engine's record of a wave: its release skew, times, requests ok, evidence."""
    sent = [s.exchange.sent_at for s in slots if s.exchange.sent_at is not None]
    done = [s.exchange.done_at for s in slots if s.exchange.done_at is not None]
    problems = judge_wave(mine, depth, engine, name) + shown
    return {"record": "wave", "run_id": run.settings.run_id, "wave": name,
            **({} if kind_.path is None else {"path": kind_.name}),
            "depth": depth, "engine": engine, "release_skew_ms": release_skew_ms(slots),
            "batch_release_skew_ms": release_skew_ms(finished),
            "duration_s": round(duration, 4), "started_at_s": round(started, 4),
            "released_at": run.wall(min(sent, default=None)),
            "last_answer_at": run.wall(max(done, default=None)),
            "ok": not problems, "requests_ok": sum(r["ok"] for r in mine),
            "problems": problems, **seen}


def exported_samples(engines: tuple, requests: list[dict], per_engine: int,
                     summary: dict, server_start: float | None, plan=None) -> list[tuple]:
    """Requests ok and failed in the last run, per engine (the engine index only), the
    time to warm of a pass (process start -> first /health 200 -> warm-up end), when the
    server started (what an alert on 'no pass since the server started' compares), and
    what its pass assumed (the chunk, B1 in one prefill step)."""
    warm = (summary.get("time_to_warm") or {}) if summary.get("verdict") == "pass" else {}
    samples = [(f"offload_warmup_{phase[:-2]}_seconds", {}, float(value), help_text)
               for phase, help_text in TIME_TO_WARM_HELP.items()
               if (value := warm.get(phase)) is not None]
    said = (("chunk_assumed", plan and plan.chunk_source == "assumed", "prefill chunk was assumed"),
            ("b1_one_step", plan and plan.one_step, "B1 was one prefill step"))
    samples += [(f"offload_warmup_{name}", {}, float(bool(value)), f"1 when the last run's "
                 f"{text}.") for name, value, text in said]
    if server_start is not None:
        samples.append(("offload_warmup_server_start_time_seconds", {}, float(server_start),
                        "When the server the last run warmed started (its "
                        "process_start_time_seconds, Unix time)."))
    for engine in engines:
        ok = sum(1 for r in requests if r["engine"] == engine and r["ok"])
        labels = {} if engine is None else {"engine": str(engine)}
        for result, value in (("ok", ok), ("failed", per_engine - ok)):
            samples.append(("offload_warmup_requests", dict(labels, result=result),
                            float(value), "Requests of the last run, ok or failed (not "
                                          "run counts as failed), per engine."))
    return samples


def start_line(warm: WarmUp, run: Run) -> str:
    """What the run is about to do: server, model, engines, waves, B1's size, deadline,
    and every setting that changed the plan or added requests, with where it came from."""
    plan = warm.plan
    engines = routed(warm.server.engines)
    shown = "" if engines is None else f", engines {format_engines(engines)}"
    count = len(kinds_of(plan.paths))
    kinds = f" and {count} request kind{'s' * (count != 1)} of --paths" if count else ""
    counted = sorted((c for _, c in warm.b1_prompts.values()),
                     key=lambda c: (c is None, c or 0)) or [None]
    b1_size = "estimated" if None in counted else \
        "-".join(str(n) for n in dict.fromkeys((counted[0], counted[-1])))
    given = ", ".join(source for _, source in plan.given)
    read = environment_read(warm.connection.target.display, given)
    return (f"warm-up {run.settings.run_id}: {warm.connection.target.display} model "
            f"{clean_text(warm.server.model or '', 80)}{shown}, waves "
            f"{','.join(wave_name(d) for d in plan.waves)}{kinds} ({warm.planned()} "
            f"requests){', ' + plan_label(plan) if plan.file else ''}, B1 prompt {b1_size} "
            f"tokens ({chunk_said(plan)}), deadline "
            f"{run.settings.deadline_s:g} s" + (f"; {one_step_said(plan)}" if plan.one_step
                                                else "")
            + (f"; given: {given}" if given else "")
            + (f"; environment: {read}" if read else ""))


def environment_read(base_url: str, given: str) -> str:
    """Each WARMUP_* variable set in the environment and not already named as given, with
    its value ('WARMUP_HARD_S=60, WARMUP_TEXTFILE=/x.prom'; the base URL without
    credentials): a leftover in the environment is seen on the first line."""
    said = []
    for name in READ_VARIABLES:
        value = os.environ.get(name)
        if name == "WARMUP_HARD_S" and value == f"{DEFAULT_HARD_S:g}":
            continue                      # the wrapper passes its default bound on
        if value and f"{name}=" not in given:
            shown = base_url if name == "WARMUP_BASE_URL" else clean_text(value, 60)
            said.append(f"{name}={shown}")
    said += [f"{clean_text(name, 60)} (not a variable the warm-up reads)"
             for name in sorted(os.environ)
             if name.startswith("WARMUP_") and name not in READ_VARIABLES
             and name != "WARMUP_HARD_BOUND_AT"]          # a typo, or another tool's
    return ", ".join(said)


def wave_figures(evidence: dict | None, engine: int | None, observed: dict | None) -> dict:
    """A wave record's evidence fields for one engine (pure): its counters' deltas as
    changed_only() keeps them (one that went down null, named), the depth observed, the
    derived spec_decode and tokens_per_step (null when the server counts none)."""
    if evidence is None:
        return {}
    deltas = engine_deltas(evidence["deltas"], engine)
    seen = (observed or {}).get(engine) or {}
    kept = changed_only(deltas)           # what the record keeps (absent: did not change)
    shown = dict(sorted(kept.items())[:MAX_WAVE_SERIES])
    return {
        "counters": shown,
        "counters_cut": len(kept) - len(shown) or None,     # series left out of the record
        "counters_went_down": list(engine_deltas(dict.fromkeys(evidence["went_down"]),
                                                 engine)),
        "counters_why": evidence["why"],
        "running_max": seen.get("running_max"), "waiting_max": seen.get("waiting_max"),
        "gauge_samples": seen.get("gauge_samples", 0),
        "gauge_reads": seen.get("gauge_reads"),
        "gauge_reads_failed": seen.get("gauge_reads_failed"),
        "spec_decode": spec_figures(deltas),
        "tokens_per_step": tokens_per_step(deltas),
    }


def judge_wave(requests: list[dict], depth: int, engine: int | None = None,
               name: str | None = None) -> list[str]:
    """A wave record's own problems (on one engine): fewer than `depth` requests ran, or
    some failed (the run's verdict is decide()'s, from the request records)."""
    name = (name or wave_name(depth)) + ("" if engine is None else f" engine {engine}")
    problems = []
    if len(requests) != depth:
        problems.append(f"{name}: {len(requests)} of {depth} requests ran")
    failed = sum(1 for r in requests if not r["ok"])
    if failed:
        problems.append(f"{name}: {failed} of {len(requests)} requests failed")
    return problems


def wave_line(name: str, engine: int | None, wave_requests: list[dict], skew: float | None,
              duration: float, long_prompt: bool, seen: dict | None = None) -> str:
    """One engine's line of a wave: requests ok, skew, time; B1's prompt size and cache."""
    ok = sum(r["ok"] for r in wave_requests)
    where = name if engine is None else f"{name} e{engine}"
    shown_skew = "-" if skew is None else f"{skew:.1f}"
    line = f"{where:<4} {ok}/{len(wave_requests)} ok  skew {shown_skew} ms  {duration:.2f} s"
    if long_prompt and wave_requests:
        cached = wave_requests[0]["cached_tokens"]
        line += (f"  prompt {wave_requests[0]['prompt_tokens']}"
                 f"  cached {'n/a' if cached is None else cached}")
    line += evidence_text(seen or {}, len(wave_requests))
    same: dict[str, list[str]] = {}          # one line a diagnosis, not one a request
    for r in wave_requests:
        if not r["ok"]:
            same.setdefault("; ".join(r["problems"]), []).append(f"#{r['index']}")
    for diagnosis, indexes in same.items():
        line += f"\n     {', '.join(indexes)}: {diagnosis}"
    return line


def evidence_text(seen: dict, depth: int) -> str:
    """The wave line's compact addition: depth observed below the wave's (evidence, not a
    failure) and, with speculative decoding, acceptance."""
    text = ""
    running = seen.get("running_max")
    if seen.get("gauge_samples") and running is not None and running < depth:
        text += f"  observed {running:g} of {depth}"
    spec = seen.get("spec_decode")
    if spec and spec.get("acceptance_rate") is not None:
        text += (f"  accept {spec['acceptance_rate']:.2f}, mean length "
                 f"{spec['mean_acceptance_length']:g}")
    return text


# The command line.

PRIORITY = whole(-(1 << 31), (1 << 31) - 1)


def foreign_work_type(text: str) -> str:
    """--foreign-work, WARMUP_FOREIGN_WORK: evidence or fail."""
    if text not in ("evidence", "fail"):
        raise ValueError(f"must be evidence or fail, got {clean_text(text, 40)!r}")
    return text


# The warm-up's settings that a flag or its WARMUP_* variable give: the parser's options,
# the help's list of variables and the first line's "given" are made from this table.
# The first four change the plan or add requests: each one given is named with where.
SETTINGS = (
    Setting("--waves", "WARMUP_WAVES", parse_waves, REVIEWED.waves,
            "client concurrency of each wave in order: distinct depths 1 to 64, the first 1 "
            "(B1), e.g. 1,2,3,4,6,8; not 1,2,3,4 is a custom plan", shown="1,2,3,4",
            metavar="1,2,3,4", note="not 1,2,3,4: a custom plan"),
    Setting("--tokens", "WARMUP_TOKENS", whole(2, 32), REVIEWED.tokens,
            "completion tokens per request: max_tokens = min_tokens, 2 to 32 (never a "
            "longer generation); not 32 is a custom plan", note="not 32: a custom plan"),
    Setting("--priority", "WARMUP_PRIORITY", PRIORITY, REVIEWED.priority,
            "request priority; with --scheduling-policy priority, real traffic at 0 goes "
            "first; not 20 is a custom plan", note="not 20: a custom plan"),
    Setting("--paths", "WARMUP_PATHS", parse_paths, (),
            f"after the waves, a shape test of other request kinds, each at depth 1 and at "
            f"the deepest wave's, on every engine: {', '.join(PATH_NAMES)}, all or none; "
            f"never a pass (a custom plan)", shown="none: the contract's ten requests only",
            metavar="LIST", note="a shape test, never a pass"),
    Setting("--chunk-tokens", "WARMUP_CHUNK_TOKENS", whole(1, MAX_LONG_PROMPT_TOKENS - 1),
            REVIEWED.chunk_tokens, "the server's prefill chunk (its "
            "--max-num-batched-tokens): B1 is longer, so that the chunked prefill really "
            "runs, or where the context holds no longer prompt, the longest it holds (said: "
            "B1 in one prefill step)", note="set by start.sh"),
    Setting("--foreign-work", "WARMUP_FOREIGN_WORK", foreign_work_type, "fail",
            "what foreign work on a --metrics-counter does: fail (the run fails, as does a "
            "counter that cannot be compared: a series that went down, NaN, a read that "
            "failed) or evidence (a warning in the records and the report; the run may "
            "pass); recorded in the plan", metavar="evidence|fail"),
    Setting("--metrics-counter", "WARMUP_METRICS_COUNTER", counted_type, (),
            "an operator's counter of the work an endpoint saw (a proxy's requests, or with "
            ":tokens its prompt and completion tokens), read as each wave is released and "
            "after the last: more than the warm-up sent is foreign work, named with the "
            "waves it overlaps", shown="none", metavar="URL=NAME[:tokens]", many=True),
    Setting("--status-file", "WARMUP_STATUS_FILE", str, (),
            "a JSON status file another process rewrites on a timer; its numeric deltas "
            "over the warm-up are recorded (invalid when pid or session changed, unverified "
            "when it has neither)", shown="none", metavar="PATH", many=True),
    Setting("--plan", "WARMUP_PLAN", str, None, "a plan file an operator reviewed (JSON, "
            "CONTRACT section 4), judged as the contract's plan, its name and SHA-256 recorded "
            "and said; a setting above that changes it is custom", metavar="FILE",
            shown="the contract's plan"),
)
PLANNED = SETTINGS[:4]
# Every WARMUP_* variable the warm-up reads (WARMUP_HARD_BOUND_AT is the wrapper's own).
READ_VARIABLES = ("WARMUP_BASE_URL", "WARMUP_MODEL", "WARMUP_ENGINES") + tuple(
    s.variable for s in SETTINGS) + (
    "WARMUP_DEADLINE_S", "WARMUP_HARD_S", "WARMUP_RECORDS_DIR", "WARMUP_TEXTFILE",
    "WARMUP_READY_FILE", "WARMUP_LOCK_DIR", "WARMUP_HEALTHY_AT", "WARMUP_PYTHON")

EPILOG = ENVIRONMENT_HELP + "\n".join(s.listed() for s in SETTINGS) + """
  WARMUP_DEADLINE_S   default for --deadline-s
  WARMUP_READY_FILE   default for --ready-file (a re-warm: a ready file there gives
                      the base URL and the chunk when they are not given)
  WARMUP_HEALTHY_AT   when /health first answered 200 (Unix time; start.sh sets it): the
                      summary's time_to_warm then has all three phases
  WARMUP_HARD_S       read by warmup_serve.sh: hard wall-clock bound (default 95);
                      deadline 90 s, 5 s under a lower bound (half one under 10 s);
                      an explicit --deadline-s or WARMUP_DEADLINE_S must be below it
  WARMUP_PYTHON       read by warmup_serve.sh: the interpreter (default python3)

exit status:
  0    pass: every response as required (32 tokens, finish 'length', no stop reason;
       B1 longer than the server's chunk where the context allows, none cached), in
       time; a custom plan (other --tokens, --waves, --priority, --paths, engines) also 0,
       its verdict line saying 'pass, custom plan: ...' and the setting that made it,
       never PASS (qualify.py report exits 1 for it: not the contract's warm-up); 1 when
       the --paths shape test, judged on its own, failed
  1    fail: a wrong response, a request error, cannot connect, context too small,
       an engine short of its share, foreign work, an internal error, or late
  2    usage or configuration error (bad option, bad URL, records or textfile not
       writable, a deadline at or past WARMUP_HARD_S, a lock folder that cannot be used,
       model not served, several models and no --model)
  3    refused: a request gauge in /metrics was missing, unreadable or non-zero; another
       helper is sending to the same server from this host; /health is not 200
  124/137  ended by warmup_serve.sh's hard bound (TERM at WARMUP_HARD_S; KILL 5 s later)
  129/130/143  the helper received SIGHUP / SIGINT (Ctrl-C) / SIGTERM and wrote a
       'killed' summary first (any caught signal N: 128 + N)

A wave's depth is client concurrency (requests released together), not the engine's
batch shape. Not covered: long-context attention, every verification depth, deeper
bands (B6/B8; --waves 1,2,3,4,6,8 sends them, a custom plan, but a server with
--max-num-seqs 4 never runs six at once). Every setting that changes the plan or adds
requests is named with where it came from on the run's first line. Readiness is not warm-up success: read the
records before releasing producers. The contract: CONTRACT.md beside this file.
"""

def build_parser(prog: str = "warmup.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=prog, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Warm up a freshly started vLLM server: waves B1..B4 of raw completions\n"
                    "(a ~5K-token prefill, then 2, 3 and 4 requests released together), on\n"
                    "every engine; check every response; write JSON Lines records for the\n"
                    "operator to inspect. After a start: qualify.py report|probe|gate.")
    add_server_options(parser)
    add_run_options(parser, deadline_s=None)
    for setting in SETTINGS:
        setting.add_to(parser)
    parser.add_argument("--b1-tokens", metavar="N",
                        type=whole(ONE_STEP_FLOOR, MAX_LONG_PROMPT_TOKENS), default=None,
                        help="target size of B1's long prompt in tokens, more than "
                             "--chunk-tokens and at most 1048576, capped by the context; "
                             "counted with the server's /tokenize when it has one (default: "
                             "5000, or past --chunk-tokens when that is larger); given, the "
                             "plan is custom")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", type=template_kwargs_type,
                        help="a JSON object passed to the chat template by the chat kinds of "
                             "--paths, e.g. '{\"enable_thinking\": false}'")
    parser.add_argument("--gauge-interval-ms", metavar="MS", type=whole(0, 25), default=20,
                        help="per-wave evidence: read the request gauges this often while a "
                             "wave runs (the depth observed), and the counters after each "
                             "wave (their deltas, speculative acceptance, tokens per step); "
                             "from 0 to 25; 0: none of it (default: %(default)s)")
    parser.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                        help="another Prometheus endpoint (a proxy's, a worker's) whose counter "
                             "deltas over the warm-up are recorded only, never compared with "
                             "what the warm-up sent: name a counter there with "
                             "--metrics-counter to have it compared; repeatable")
    add_status_wait_options(parser, "before the first wave and after the last")
    add_file_option(parser, "--ready-file", "WARMUP_READY_FILE",
                    "the ready file `qualify.py ready` checks: removed when the run begins, "
                    "written after it only when the records show a contract pass (as "
                    "start.sh does): how to warm again after a wake. One creator per file: "
                    "not a file start.sh --supervise owns")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (waves, prompt sizes, budgets, bounds) and exit 0 "
                             "without touching the network")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def build_warmup(args: argparse.Namespace, settings: RunSettings):
    """The parsed options -> (the WarmUp, its dry run); UsageError naming a bad value."""
    settings = settings.replace(deadline_s=deadline_for(args.deadline_s))
    values = {s.dest: s.value(args) for s in SETTINGS}   # name -> (value, where from)
    chunk, chunk_source = values["chunk_tokens"]
    if args.b1_tokens is not None and args.b1_tokens <= chunk:
        raise UsageError(f"--b1-tokens {args.b1_tokens} is not more than the prefill chunk "
                         f"({chunk}, --chunk-tokens or WARMUP_CHUNK_TOKENS): B1 must be "
                         f"longer; leave --b1-tokens out to size it past the chunk")
    chunk_source = chunk_source.split("=")[0].split(" ")[0] if chunk_source else "assumed"
    # A plug-in loads with its flag; one the folder lost is a usage error, before a run.
    for flag, name in ((values["status_file"][0], "core.status_files"),
                       (values["metrics_counter"][0], "core.counted")):
        if flag:
            plug_in(name)
    vouched = plug_in("core.readyfile").read_ready_file(args.ready_file)[0] \
        if args.ready_file else None
    if vouched and chunk_source == "assumed" and count_value(vouched.get("chunk_tokens")):
        chunk, chunk_source = vouched["chunk_tokens"], "the ready file"   # a re-warm
    if vouched and not args.base_url and not os.environ.get("WARMUP_BASE_URL"):
        args.base_url = vouched["base_url"]          # the server it vouches for
    file = plug_in("core.plan_file").read_plan_file(values["plan"][0]) \
        if values["plan"][0] else None
    base = plan_of_file(file) if file else REVIEWED     # what a given setting differs from
    given = {s.dest: values[s.dest][1] for s in PLANNED if values[s.dest][1]}
    if args.b1_tokens is not None:
        given["b1_tokens"] = "--b1-tokens on the command line"
    plan = Plan(**{s.dest: values[s.dest][0] if s.dest in given else getattr(base, s.dest)
                   for s in PLANNED},
                b1_tokens=args.b1_tokens or base.b1_tokens, file=file,
                gauge_interval_ms=args.gauge_interval_ms,
                chunk_tokens=chunk, chunk_source=chunk_source,
                template_kwargs=args.chat_template_kwargs)
    connection = connection_from(args)
    if connection.engines is not None:
        given["engines"] = "--engines on the command line" if hasattr(args, "engines") \
            else f"WARMUP_ENGINES={format_engines(connection.engines)} from the environment"
    plan = plan.replace(given=tuple(given.items()))
    counted = values["metrics_counter"][0]
    displays = [t.display for t, _, _ in counted]
    twice = [d for d in displays if displays.count(d) > 1]
    if twice:                             # its record holds one counter's comparison
        raise UsageError(f"--metrics-counter: one counter per endpoint; {twice[0]} is named "
                         f"{len(twice)} times")
    urls = [parse_url(url, "--metrics-url") for url in args.metrics_url]
    main = connection.target.display + "/metrics"     # the guard's source: read as the main
    targets = {t.display: t for t in urls + [t for t, _, _ in counted] if t.display != main}
    evidence = EvidenceOptions(
        metrics_targets=tuple(targets.values()),
        counted=counted, foreign_work=values["foreign_work"][0],
        status_files=values["status_file"][0], status_wait_s=args.status_wait_s,
        status_time_field=args.status_time_field,
        healthy_at=given_value(None, "", "WARMUP_HEALTHY_AT", unix_time, None)[0])
    if args.ready_file:
        same = [name for path, name in ((settings.records_path, "the records file"),
                                        (settings.textfile, "the --textfile"))
                if path and os.path.abspath(path) == os.path.abspath(args.ready_file)]
        why = f"it is {same[0]}" if same else writable(args.ready_file)
        if why:
            raise UsageError(f"--ready-file {args.ready_file}: {why}; choose another, "
                             f"writable file in an existing folder")
    dry = plug_in("core.dry_run") if args.dry_run else None     # loads with its flag
    return (WarmUp(connection, plan, settings, evidence, args.ready_file),
            lambda: dry.print_plan(plan, settings, connection, args.json,
                                   hard_bound() or DEFAULT_HARD_S))


def unix_time(text: str) -> float:
    """WARMUP_HEALTHY_AT: when /health first answered 200, in Unix seconds, not in the
    future."""
    return number_type(float, lambda v: 1e9 <= v <= time.time() + 60, "must be a Unix time "
                       "in seconds, not in the future", "unix_time")(text)


def hard_bound() -> float | None:
    """WARMUP_HARD_S, the bound warmup_serve.sh holds, as the wrapper reads it (None when
    not set); UsageError when it is not a number of seconds from 1 to 86400."""
    return given_value(None, "", "WARMUP_HARD_S", number_type(
        float, lambda v: 1 <= v <= MAX_HARD_S, f"must be a number of seconds from 1 to "
        f"{MAX_HARD_S:g}", "seconds"), None)[0]


def deadline_for(flag: float | None) -> float:
    """The deadline: --deadline-s, else WARMUP_DEADLINE_S, else 90 s, or 5 s under a lower
    hard bound (half of a bound under 10 s), so a run fits under the bound that ends it.
    An explicit deadline at or past the bound is a usage error: the bound would end the
    run with a 'killed' summary, never a verdict."""
    deadline, source = given_value(flag, "--deadline-s", "WARMUP_DEADLINE_S", seconds(), None)
    source = re.split("[= ]", source or "")[0]
    hard = hard_bound()
    if deadline is None:
        return DEFAULT_DEADLINE_S if hard is None else \
            min(DEFAULT_DEADLINE_S, max(hard - 5, hard / 2))
    if hard is not None and deadline >= hard:
        raise UsageError(f"{source}: the deadline {deadline:g} s is not below "
                         f"the hard bound WARMUP_HARD_S={hard:g} (warmup_serve.sh ends the "
                         f"run there); lower the deadline, leave it out, or raise "
                         f"WARMUP_HARD_S")
    return deadline


if __name__ == "__main__":
    runframe.script_exit(main())
