#!/usr/bin/env python3
"""Warm up a freshly started vLLM server, and leave records of what the warm-up did.

The first requests a new server sees pay one-time costs (a long chunked prefill,
decode and speculative draft/verify at client concurrency 1-4, lazily compiled
kernels). This helper pays them on purpose, in waves B1..B4, inside hard time bounds,
and writes JSON Lines records that an operator reads before releasing producers.

The run, in order (each step is a function or method right below):

  main()                vllm_client.server_main(): options -> build_warmup() -> a WarmUp
                        (--dry-run prints the plan)
  runframe.run_session  records open, signals handled, exactly one summary, exit code
    WarmUp.steps()      the warm-up's steps:
      learn_server()      model, context length, engines (vllm_client)
      size_long_prompts() B1's prompt per engine, sized with /tokenize
      warm_waves()        for each wave: guarded_batch() (guard -> release -> collect),
                          then request_record() judges each answer (kinds.judge), and
                          evidence.cross_check() what the engine's counters show
      Evidence.read_after counter deltas and status files over the warm-up (evidence.py)
    WarmUp.judge()      judge_run(): every planned request ok, unrefused, in time

It is a program over the layers beside it: transport.py (bytes on a socket),
runframe.py (a run with one summary), vllm_client.py (what a vLLM server says) and
evidence.py (what moved). Standard library only, Python 3.10+. The contract is
CONTRACT.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the folder's modules
try:
    import runframe
    from evidence import Evidence, EvidenceOptions, cross_check, engine_shares, time_to_warm
    from runframe import (Run, RunSettings, add_file_option, add_run_options, argument_type,
                          emit, flag_or_env, seconds, whole)
    from kinds import (B1_FLOOR, CONTRACT_PRIORITY, CONTRACT_TOKENS, KINDS, PATH_NAMES, Kind,
                       b1_floor, contract_differences, judge, kinds_of, parse_paths,
                       request_id)
    from prompts import MAX_LONG_PROMPT_TOKENS, SHORT_PROMPT_WORDS, make_short_prompt
    from records import as_dict
    from transport import (MAX_BODY_BYTES, UsageError, __version__, clean_text, parse_url,
                           series_name, writable)
    from vllm_client import (ENVIRONMENT_HELP, Connection, ServerProgram, Slot,
                             add_server_options, answer_record, connection_from,
                             format_engines, read_slot, release_skew_ms, routed, server_main,
                             slot_timing, template_kwargs_type)
    from vllm_metrics import (changed_only, counter_deltas, engine_deltas, spec_figures,
                              tokens_per_step, went_down)
except ImportError as exc:           # a module of the folder is missing: one line, no trace
    print(f"warmup.py: cannot load {exc.name or exc}: offload/launch/ is copied and rolled "
          f"back as one folder; restore the whole folder", file=sys.stderr)
    sys.exit(2)

DEFAULT_WAVES = (1, 2, 3, 4)
MAX_WAVE_DEPTH = 64
GREEDY = KINDS["greedy"]              # the contract's request: every wave sends it
TIME_TO_WARM_HELP = {
    "start_to_healthy_s": "The last run's server: its process start to its first /health "
                          "200 (WARMUP_HEALTHY_AT, from start.sh).",
    "healthy_to_warm_s": "The last run's server: its first /health 200 to the warm-up's end.",
    "start_to_warm_s": "The last run's server: its process start (process_start_time_seconds) "
                       "to the warm-up's end.",
}
MAX_WAVE_SERIES = 2000                # counter series one wave record holds at most


def main(argv: list[str] | None = None, prog: str = "warmup.py") -> int:
    """The warm-up's command line; returns the exit status."""
    if argv is None:
        runframe.as_program()
    return server_main(build_parser(prog), sys.argv[1:] if argv is None else argv, prog,
                       "warmup", build_warmup)


# ---------------------------------------------------------------------------
# The plan: waves, prompts and budgets, as plain data.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What the warm-up sends on each engine: the waves, and each request's budget."""
    waves: tuple[int, ...] = DEFAULT_WAVES
    tokens: int = CONTRACT_TOKENS
    priority: int = CONTRACT_PRIORITY
    b1_tokens: int = 5000
    gauge_interval_ms: int = 20           # 0: no per-wave evidence (counters, observed depth)
    chunk_tokens: int = 4096              # the server's prefill chunk: B1 must be longer
    chunk_source: str = "assumed"         # where the chunk came from: a flag, or assumed
    paths: tuple = ()                     # --paths: request kinds warmed after the waves
    template_kwargs: dict | None = None   # passed to the chat template (chat kinds)

    @property
    def path_depths(self) -> tuple[int, ...]:
        """A --paths kind runs at depth 1 and at the deepest wave's."""
        return tuple(dict.fromkeys((1, max(self.waves))))

    @property
    def requests_per_engine(self) -> int:
        """Every request on one engine: the waves', then every kind's."""
        return self.wave_requests + len(kinds_of(self.paths)) * sum(self.path_depths)

    @property
    def b1_minimum(self) -> int:
        """The fewest prompt tokens B1 may have: above 4096 and above the prefill chunk."""
        return b1_floor(self.chunk_tokens)

    @property
    def b1_target(self) -> int:
        """B1's target size: --b1-tokens, or past the chunk when that is not longer."""
        if self.b1_tokens > self.chunk_tokens:
            return self.b1_tokens
        return self.chunk_tokens + max(self.chunk_tokens // 8, 64)

    @property
    def wave_requests(self) -> int:
        """The waves' requests per engine (B1..Bn, --paths kinds aside)."""
        return sum(self.waves)


def wave_name(depth: int) -> str:
    return f"B{depth}"


def parse_waves(text: str) -> tuple[int, ...]:
    """'1,2,3,4' -> (1, 2, 3, 4); distinct depths of 1 to 64, the first of them 1."""
    try:
        depths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"wants depths separated by commas, such as 1,2,3,4; got {text!r}")
    if any(d < 1 or d > MAX_WAVE_DEPTH for d in depths):
        raise ValueError(f"depths must be between 1 and {MAX_WAVE_DEPTH}; got {text!r}")
    if len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct; got {text!r}")
    if depths[0] != 1:
        raise ValueError(f"must start with 1 (B1, the long-prompt wave); got {text!r}")
    return depths


def kind_wave_name(kind_: Kind, depth: int) -> str:
    """A wave's name as records and ids carry it: B2, or a --paths kind's logprobs-chat-4."""
    return wave_name(depth) if kind_.path is None else f"{kind_.name}-{depth}"


def plan_description(plan: Plan, settings: RunSettings) -> dict:
    """The plan as recorded and as printed by --dry-run (sizes only, never prompt text)."""
    return {
        "waves": [{"wave": wave_name(d), "depth": d,
                   "prompt": "long" if i == 0 else "short"} for i, d in enumerate(plan.waves)],
        "requests_per_engine": plan.requests_per_engine,
        "completion_tokens_max": plan.requests_per_engine * plan.tokens,
        "request_kind": GREEDY.name,
        "tokens": plan.tokens,
        "priority": plan.priority,
        "b1_target_tokens": plan.b1_target,
        "b1_min_prompt_tokens": plan.b1_minimum,
        "chunk_tokens": plan.chunk_tokens,
        "chunk_source": plan.chunk_source,
        "short_prompt_words": SHORT_PROMPT_WORDS + 1,
        "deadline_s": settings.deadline_s,
        "socket_cap_s": settings.socket_cap_s,
        "max_body_bytes": MAX_BODY_BYTES,
        "paths": [{"path": k.name, "depths": list(plan.path_depths), "endpoint": k.endpoint,
                   "stream": k.stream, "held_to": "1 to N tokens, length or stop"
                   if k.holds.tokens == "upto" else "N tokens, length"}
                  for k in kinds_of(plan.paths)],
        "wave_evidence": bool(plan.gauge_interval_ms),
        "gauge_interval_ms": plan.gauge_interval_ms or None,
    }


# ---------------------------------------------------------------------------
# The warm-up: a ServerProgram whose steps are the waves.
# ---------------------------------------------------------------------------

class WarmUp(ServerProgram):
    """Waves B1..Bn on every engine, each behind the guard; judged per request."""

    mode = "warmup"

    def __init__(self, connection: Connection, plan: Plan, settings: RunSettings,
                 evidence: EvidenceOptions, ready_file: str | None = None):
        super().__init__(connection)
        self.plan = plan
        self.settings = settings
        self.evidence = Evidence(evidence)
        self.healthy_at = evidence.healthy_at
        self.ready_file = ready_file          # removed first, rewritten after a contract pass
        self.ready_dropped = ""               # what removing it before the run did
        self.b1_prompts: dict = {}            # engine -> (prompt, counted or None)

    def steps(self, run: Run) -> None:
        """Everything the warm-up sends, in order; Fatal ends it early."""
        if self.ready_file:           # until this run passes: a killed run leaves none
            removed, self.ready_dropped = self.drop_ready_file()
            if removed is False:
                run.say(f"ready file {self.ready_file}{self.ready_dropped}: it stays until "
                        f"this run passes or you remove it")
        self.learn_server(run)
        self.b1_prompts = self.size_long_prompts(run, self.plan.b1_target, self.plan.tokens,
                                                 self.plan.b1_minimum)
        run.write_run_record()
        run.say(self.start_line(run))
        if self.plan.chunk_source == "assumed":
            self.tally.warnings.append(
                f"the server's prefill chunk was not given (--chunk-tokens, "
                f"WARMUP_CHUNK_TOKENS): B1 is longer than {self.plan.chunk_tokens}, the "
                f"contract's chunk; a server started with a larger --max-num-batched-tokens "
                f"prefills it in one step, which /metrics cannot show")
        self.evidence.read_before(run)
        self.warm_waves(run)
        if self.tally.requests:
            self.evidence.read_after(run, self.connection.target, self.tally.first_counters,
                                     self.tally, self.check_engine_shares)

    def planned_per_engine(self) -> int:
        return self.plan.requests_per_engine

    def b1_counts(self) -> list:
        return [counted for _, counted in self.b1_prompts.values()]

    def plan_fields(self) -> dict:
        counts = self.b1_counts()
        smallest = None if not counts or None in counts else min(counts)
        by_engine = {str(e): c for e, (_, c) in self.b1_prompts.items()
                     if e is not None and c is not None}
        covered = routed(self.server.engines) or self.server.served
        plan = dict(plan_description(self.plan, self.settings),
                    engines_skipped=sorted(set(self.server.served) - set(covered)))
        differences = contract_differences(plan)
        return dict(plan, contract=not differences, differences=differences,
                    b1_prompt_tokens_counted=smallest,
                    b1_prompt_tokens_by_engine=by_engine or None,
                    b1_sizing="tokenize" if smallest is not None else "estimate")

    def summary_fields(self, run: Run) -> dict:
        """The summary's counts, highlighted counters and, per engine, speculative
        acceptance over the whole run (null without speculative counters)."""
        deltas = self.evidence.main_deltas
        spec = None if deltas is None else {
            "all" if e is None else str(e): spec_figures(engine_deltas(deltas, e))
            for e in self.server.engines}
        differences = self.plan_fields()["differences"]
        fields = dict(super().summary_fields(run), counters=self.evidence.highlights,
                      spec_decode=spec, contract=not differences,
                      plan_differences=differences,
                      cache_check=cache_check(self.tally.requests),
                      time_to_warm=time_to_warm(self.server.process_start, self.healthy_at,
                                                time.time()))
        if self.plan.paths:
            fields["paths"] = path_results(self.tally.requests, kinds_of(self.plan.paths))
        return fields

    def drop_ready_file(self) -> tuple[bool | None, str]:
        """Remove the ready file (a regular file only): (removed, or None when there was
        none to remove; what was done, as a clause)."""
        if not os.path.isfile(self.ready_file) or os.path.islink(self.ready_file):
            return None, ""
        try:
            os.remove(self.ready_file)
            return True, "; the old one was removed"
        except OSError as exc:
            return False, f"; the old one could not be removed ({exc.strerror})"

    def after_summary(self, run: Run, summary: dict) -> None:
        """With --ready-file: the ready file, removed before anything was sent (a re-warm
        after a wake that fails or is killed leaves no stale 'ready'), rewritten from these
        records when they show a contract pass (as start.sh writes it)."""
        if not self.ready_file:
            return None
        from ready import write_ready
        code, line = write_ready(self.ready_file, run.settings.records_path, None,
                                 run.settings.run_id)
        if code == 0:
            run.say(f"ready file {self.ready_file} written: `qualify.py ready --ready-file "
                    f"{self.ready_file}` says while it stays true")
            return None
        removed = self.drop_ready_file()[1] or self.ready_dropped
        run.say(f"ready file {self.ready_file} {line}{removed}")
        return None

    def exported(self, run: Run, summary: dict) -> list[tuple]:
        """Requests ok and failed in the last run, per engine (the engine index only), and
        the time to warm: process start -> first /health 200 -> warm-up end."""
        samples = [(f"offload_warmup_{phase[:-2]}_seconds", {}, float(value), help_text)
                   for phase, help_text in TIME_TO_WARM_HELP.items()
                   if (value := as_dict(summary.get("time_to_warm")).get(phase)) is not None]
        for engine in self.server.engines:
            mine = [r for r in self.tally.requests if r["engine"] == engine]
            ok = sum(1 for r in mine if r["ok"])
            labels = {} if engine is None else {"engine": str(engine)}
            for result, value in (("ok", ok), ("failed", self.plan.requests_per_engine - ok)):
                samples.append(("offload_warmup_requests", dict(labels, result=result),
                                float(value), "Requests of the last run, ok or failed (not "
                                              "run counts as failed), per engine."))
        return samples

    # -- the waves -------------------------------------------------------------

    def warm_waves(self, run: Run) -> None:
        """Guard, then wave, in order: the waves, then each request kind of --paths at depth
        1 and at the deepest wave's, on every engine; stops at a refusal or the deadline."""
        plan = self.plan
        batches = [(GREEDY, d) for d in plan.waves] + \
            [(k, d) for k in kinds_of(plan.paths) for d in plan.path_depths]
        for position, (kind_, depth) in enumerate(batches):
            if run.clock.remaining() <= 0:
                rest = ",".join(wave_name(d) for d in plan.waves[position:])
                self.tally.problems.append(f"deadline passed before {kind_wave_name(kind_, depth)}"
                                           + (f": waves {rest} not run" if rest else ""))
                return
            if not self.warm_wave(run, depth, position == 0, kind_):
                return

    def warm_wave(self, run: Run, depth: int, first: bool, kind_: Kind) -> bool:
        """One wave of a kind on every engine at once; False when the guard refused it."""
        name = kind_wave_name(kind_, depth)
        slots = self.wave_slots(run, depth, first, kind_)
        started = run.clock.elapsed()
        finished = self.guarded_batch(run, name, slots, first=first,
                                      observe_ms=self.plan.gauge_interval_ms)
        if finished is None:
            return False
        duration = self.batch_ended_at - started
        wave_requests = [self.request_record(run, depth, slot, first, kind_)
                         for slot in finished]
        for record in wave_requests:
            run.write(record)
        self.tally.requests += wave_requests
        evidence = self.wave_evidence(run, name)
        # What every engine counted over the wave against all its requests: foreign work
        # or a restart (a request sent to another engine is the engine shares' to name).
        shown = [] if evidence is None else cross_check(
            evidence["deltas"], wave_requests, name, evidence["went_down"])[0]
        self.tally.problems += shown
        for engine in self.server.engines:
            mine = [r for r in wave_requests if r["engine"] == engine]
            slots = [s for s in finished if s.engine == engine]
            skew = release_skew_ms(slots)
            sent = [s.sent_at for s in slots if s.sent_at is not None]
            done = [s.done_at for s in slots if s.done_at is not None]
            seen = wave_figures(evidence, engine, self.observed)
            problems = judge_wave(mine, depth, engine, name) + shown
            run.write({"record": "wave", "run_id": run.settings.run_id, "wave": name,
                       **({} if kind_.path is None else {"path": kind_.name}),
                       "depth": depth, "engine": engine,
                       "release_skew_ms": skew,
                       "batch_release_skew_ms": release_skew_ms(finished),
                       "duration_s": round(duration, 4), "started_at_s": round(started, 4),
                       "released_at": run.wall(min(sent, default=None)),
                       "last_answer_at": run.wall(max(done, default=None)),
                       "ok": not problems, "requests_ok": sum(r["ok"] for r in mine),
                       "problems": problems, **seen})
            run.say(wave_line(name, engine, mine, skew, duration, first, seen))
        if first and cache_check(wave_requests) == "not_made" \
                and any(r["http_status"] == 200 for r in wave_requests):
            self.tally.notes.append("B1 cache check not made: the server does not report "
                                    "cached tokens (start it with "
                                    "--enable-prompt-tokens-details to check)")
        return True

    def wave_slots(self, run: Run, depth: int, first: bool, kind_: Kind) -> list[Slot]:
        """The wave's requests on every engine, encoded before any client connects."""
        run_id, plan = run.settings.run_id, self.plan
        slots = []
        for engine in self.server.engines:
            for index in range(depth):
                rid = request_id("warmup", run_id, engine, kind_wave_name(kind_, depth), index)
                seed = f"{run_id}/{engine}" + ("" if kind_.path is None else f"/{kind_.name}")
                prompt = self.b1_prompts[engine][0] if first else \
                    make_short_prompt(seed, depth, index)
                slots.append(self.make_slot(kind_, index, rid, engine, prompt, plan.tokens,
                                            plan.priority, plan.template_kwargs))
        return slots

    def wave_evidence(self, run: Run, name: str) -> dict | None:
        """What the engine counted during the wave: counter deltas from the guard's read
        before it to a settled read after it (None without per-wave evidence)."""
        if not self.plan.gauge_interval_ms:
            return None
        before = self.counters_before
        after, why = self.counters_after(run, name)
        if before is None or after is None:
            return {"deltas": {}, "went_down": [], "why": why or "no counters before it"}
        def engine_series(counts: dict) -> dict:       # its own, a histogram's buckets aside
            return {k: v for k, v in counts.items()
                    if k.startswith("vllm:") and not series_name(k).endswith("_bucket")}
        before, after = engine_series(before), engine_series(after)
        return {"deltas": {k: v for k, v in counter_deltas(before, after).items()
                           if v is not None or (k in before and k in after)},
                "went_down": went_down(before, after), "why": None}

    def request_record(self, run: Run, depth: int, slot: Slot, first: bool,
                       kind_: Kind) -> dict:
        """A request record from what one client got: counts, reasons, verdict (judge())."""
        timing, answer = slot_timing(slot), read_slot(slot)
        problems = judge(answer, kind_, self.plan.tokens,
                         floor=self.plan.b1_minimum if first else None,
                         diagnose=self.diagnose)
        path = {} if kind_.path is None else {"path": kind_.name}
        return {
            "record": "request", "run_id": run.settings.run_id,
            "request_id": slot.request_id, "request_kind": kind_.name,
            "wave": kind_wave_name(kind_, depth),
            **path, "depth": depth, "index": slot.index, "engine": slot.engine,
            **answer_record(answer),
            "latency_s": timing["latency_s"], "sent_at_s": timing["sent_at_s"],
            "ok": not problems, "problems": problems,
            "metrics": answer.get("metrics"),
            "speculative_decoding": answer.get("speculative_decoding"),
        }

    def check_engine_shares(self, deltas: dict, record: dict) -> None:
        """Proof per engine: each engine's own counters must show its planned work (only
        when every planned request ran, on a routed server)."""
        engines = routed(self.server.engines)
        if not engines or len(self.tally.requests) != self.planned():
            return
        want_prompt = {}
        for r in self.tally.requests:
            if r["wave"] == wave_name(self.plan.waves[0]) \
                    and isinstance(r.get("prompt_tokens"), int):
                want_prompt[r["engine"]] = r["prompt_tokens"]
        shares, problems, warnings = engine_shares(
            deltas, engines, self.plan.wave_requests * self.plan.tokens, want_prompt)
        record["engines"] = shares
        self.tally.problems += problems
        self.tally.warnings += warnings

    def start_line(self, run: Run) -> str:
        """What the run is about to do: server, model, engines, waves, B1's size, deadline."""
        engines = routed(self.server.engines)
        shown = "" if engines is None else f", engines {format_engines(engines)}"
        count = len(kinds_of(self.plan.paths))
        kinds = f" and {count} request kinds of --paths" if count else ""
        counted = sorted(self.b1_counts(), key=lambda c: (c is None, c or 0)) or [None]
        b1_size = "estimated" if None in counted else \
            "-".join(str(n) for n in dict.fromkeys((counted[0], counted[-1])))
        return (f"warm-up {run.settings.run_id}: {self.connection.target.display} model "
                f"{clean_text(self.server.model or '', 80)}{shown}, waves "
                f"{','.join(wave_name(d) for d in self.plan.waves)}{kinds} ({self.planned()} "
                f"requests), B1 prompt {b1_size} tokens, deadline "
                f"{run.settings.deadline_s:g} s")


def cache_check(requests: list[dict]) -> str:
    """B1's cache check as a code (pure): 'made' (every B1 reported cached tokens, none
    cached), 'hit' (a B1 was served from the prefix cache), 'not_made' (not reported, or
    no B1 answered)."""
    b1 = [r for r in requests if r["wave"] == "B1" and r["http_status"] == 200]
    if any(r["cached_tokens"] for r in b1):
        return "hit"
    return "made" if b1 and all(r["cached_tokens"] is not None for r in b1) else "not_made"


def path_results(requests: list[dict], kinds: list[Kind]) -> dict:
    """Each --paths kind's result (pure): ok, failed with its first problem, or not run."""
    results = {}
    for kind_ in kinds:
        mine = [r for r in requests if r.get("path") == kind_.name]
        failed = [r for r in mine if not r["ok"]]
        results[kind_.name] = "not run" if not mine else "ok" if not failed else \
            f"failed: {failed[0]['problems'][0] if failed[0]['problems'] else 'not ok'}"
    return results


def wave_figures(evidence: dict | None, engine: int | None, observed: dict | None) -> dict:
    """A wave record's evidence fields for one engine (pure): `counters` (series ->
    delta, keyed as the metrics record's deltas, as vllm_metrics.changed_only() keeps
    them: a series absent did not change; a counter that went down null and named in
    `counters_went_down`), `running_max`, `waiting_max`,
    `gauge_samples`, and the derived `spec_decode` and `tokens_per_step` (null when the
    server does not count them)."""
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


# ---------------------------------------------------------------------------
# The judge: what makes a warm-up response, and a wave, pass (pure functions).
# ---------------------------------------------------------------------------

def judge_wave(requests: list[dict], depth: int, engine: int | None = None,
               name: str | None = None) -> list[str]:
    """A wave passes (on one engine) when all `depth` requests ran and passed."""
    name = (name or wave_name(depth)) + ("" if engine is None else f" engine {engine}")
    problems = []
    if len(requests) != depth:
        problems.append(f"{name}: {len(requests)} of {depth} requests ran")
    failed = sum(1 for r in requests if not r["ok"])
    if failed:
        problems.append(f"{name}: {failed} of {len(requests)} requests failed")
    return problems


def wave_line(name: str, engine: int | None, wave_requests: list[dict], skew: float | None,
              duration: float, first: bool, seen: dict | None = None) -> str:
    ok = sum(r["ok"] for r in wave_requests)
    where = name if engine is None else f"{name} e{engine}"
    shown_skew = "-" if skew is None else f"{skew:.1f}"
    line = f"{where:<4} {ok}/{len(wave_requests)} ok  skew {shown_skew} ms  {duration:.2f} s"
    if first and wave_requests:
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


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------

EPILOG = ENVIRONMENT_HELP + """\
  WARMUP_TOKENS       default for --tokens (not 32: a custom plan)
  WARMUP_WAVES        default for --waves (not starting 1,2,3,4: a custom plan)
  WARMUP_PATHS        default for --paths
  WARMUP_CHUNK_TOKENS default for --chunk-tokens (start.sh sets it from the server
                      command's --max-num-batched-tokens)
  WARMUP_READY_FILE   default for --ready-file
  WARMUP_HEALTHY_AT   when /health first answered 200 (Unix time; start.sh sets it): the
                      summary's time_to_warm then has all three phases
  WARMUP_HARD_S       read by warmup_serve.sh: hard wall-clock bound (default 95);
                      --deadline-s must be below it
  WARMUP_PYTHON       read by warmup_serve.sh: the interpreter (default python3)

exit status:
  0    pass: every response as required (32 tokens, finish 'length', no stop reason;
       B1 more than 4096 prompt tokens, none cached), in time; a custom plan (another
       --tokens, --waves, --priority, or engines left cold) that passed also exits 0,
       its verdict line saying 'pass, custom plan: ...', never PASS
  1    fail: a wrong response, a request error, cannot connect, context too small,
       an engine short of its share, an internal error, or late
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
bands (B6/B8; --waves 1,2,3,4,6,8 sends them, but a server with --max-num-seqs 4 never
runs six at once). Readiness is not warm-up success: read the
records before releasing producers. The contract: CONTRACT.md beside this file.
"""

def build_parser(prog: str = "warmup.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Warm up a freshly started vLLM server: waves B1..B4 of raw completions\n"
                    "(a ~5K-token prefill, then 2, 3 and 4 requests released together), on\n"
                    "every engine; check every response; write JSON Lines records for the\n"
                    "operator to inspect. After a start: qualify.py report|probe|gate.")
    add_server_options(parser)
    add_run_options(parser)
    parser.add_argument("--tokens", metavar="N", type=whole(2, 4096), default=None,
                        help="completion tokens per request: max_tokens = min_tokens, 2 to "
                             "4096; not 32 is a custom plan (default: $WARMUP_TOKENS, else 32)")
    parser.add_argument("--priority", metavar="N", type=whole(-(1 << 31), (1 << 31) - 1),
                        default=20,
                        help="request priority; with --scheduling-policy priority, real "
                             "traffic at 0 goes first; not 20 is a custom plan (default: "
                             "%(default)s)")
    parser.add_argument("--waves", type=argument_type(parse_waves), default=None, metavar="1,2,3,4",
                        help="client concurrency of each wave, in order: distinct depths of 1 "
                             "to 64, the first 1 (B1, the long prompt), e.g. 1,2,3,4,6,8; "
                             "not starting 1,2,3,4 is a custom plan (default: $WARMUP_WAVES, "
                             "else 1,2,3,4)")
    parser.add_argument("--b1-tokens", metavar="N", type=whole(B1_FLOOR, MAX_LONG_PROMPT_TOKENS),
                        default=None,
                        help="target size of B1's long prompt in tokens, more than 4096 (and "
                             "more than --chunk-tokens) and at most 1048576, capped by the "
                             "context; counted with the server's /tokenize when it has one "
                             "(default: 5000, or past --chunk-tokens when that is larger)")
    parser.add_argument("--paths", metavar="LIST", type=argument_type(parse_paths),
                        default=None,
                        help="after the waves, warm other request kinds, each at depth 1 and "
                             "at the deepest wave's, on every engine: "
                             f"{', '.join(PATH_NAMES)}, all or none (default: $WARMUP_PATHS, "
                             "else none: the contract's ten requests only)")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", type=template_kwargs_type,
                        help="a JSON object passed to the chat template by the chat kinds of "
                             "--paths, e.g. '{\"enable_thinking\": false}'")
    parser.add_argument("--chunk-tokens", metavar="N", type=whole(1, MAX_LONG_PROMPT_TOKENS - 1),
                        default=None,
                        help="the server's prefill chunk (its --max-num-batched-tokens): B1 "
                             "must be longer, so that the chunked prefill really runs; B1 is "
                             "sized past it when --b1-tokens is not (default: "
                             "$WARMUP_CHUNK_TOKENS, else 4096)")
    parser.add_argument("--gauge-interval-ms", metavar="MS", type=whole(0, 25), default=20,
                        help="per-wave evidence: read the request gauges this often while a "
                             "wave runs (the depth observed), and the counters after each "
                             "wave (their deltas, speculative acceptance, tokens per step); "
                             "0: none of it (default: %(default)s)")
    parser.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                        help="another Prometheus endpoint (a proxy's, a worker's) whose counter "
                             "deltas over the warm-up are recorded; repeatable")
    parser.add_argument("--status-file", action="append", default=[], metavar="PATH",
                        help="a JSON status file another process rewrites on a timer; its "
                             "numeric deltas over the warm-up are recorded (invalid when pid "
                             "or session changed, unverified when it has neither); repeatable")
    parser.add_argument("--status-wait-s", metavar="S", type=seconds(), default=15.0,
                        help="how long to wait for each status file to be rewritten, before "
                             "the first wave and after the last (default: %(default)g)")
    add_file_option(parser, "--ready-file", "WARMUP_READY_FILE",
                    "the ready file `qualify.py ready` checks: removed before anything is "
                    "sent, written after the run when the records show a contract pass (as "
                    "start.sh does): how to warm again after a wake")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (waves, prompt sizes, budgets, bounds) and exit 0 "
                             "without touching the network")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def build_warmup(args: argparse.Namespace, settings: RunSettings):
    """The parsed options -> (the WarmUp, its dry run); UsageError naming a bad value."""
    check_deadline(settings.deadline_s)
    chunk = flag_or_env(args.chunk_tokens, "WARMUP_CHUNK_TOKENS",
                        whole(1, MAX_LONG_PROMPT_TOKENS - 1), 4096)
    if args.b1_tokens is not None and args.b1_tokens <= chunk:
        raise UsageError(f"--b1-tokens {args.b1_tokens} is not more than the prefill chunk "
                         f"({chunk}, --chunk-tokens or WARMUP_CHUNK_TOKENS): B1 must be "
                         f"longer; leave --b1-tokens out to size it past the chunk")
    chunk_source = "--chunk-tokens" if args.chunk_tokens is not None else \
        "WARMUP_CHUNK_TOKENS" if os.environ.get("WARMUP_CHUNK_TOKENS") else "assumed"
    plan = Plan(waves=flag_or_env(args.waves, "WARMUP_WAVES", parse_waves, DEFAULT_WAVES),
                tokens=flag_or_env(args.tokens, "WARMUP_TOKENS", whole(2, 4096), 32),
                priority=args.priority, b1_tokens=args.b1_tokens or 5000,
                gauge_interval_ms=args.gauge_interval_ms, chunk_tokens=chunk,
                chunk_source=chunk_source,
                paths=flag_or_env(args.paths, "WARMUP_PATHS", parse_paths, ()),
                template_kwargs=args.chat_template_kwargs)
    connection = connection_from(args)
    evidence = EvidenceOptions(
        metrics_targets=tuple(parse_url(url, "--metrics-url") for url in args.metrics_url),
        status_files=tuple(args.status_file), status_wait_s=args.status_wait_s,
        healthy_at=flag_or_env(None, "WARMUP_HEALTHY_AT", unix_time, None))
    if args.ready_file:
        same = [name for path, name in ((settings.records_path, "the records file"),
                                        (settings.textfile, "the --textfile"))
                if path and os.path.abspath(path) == os.path.abspath(args.ready_file)]
        why = f"it is {same[0]}" if same else writable(args.ready_file)
        if why:
            raise UsageError(f"--ready-file {args.ready_file}: {why}; choose another, "
                             f"writable file in an existing folder")
    return (WarmUp(connection, plan, settings, evidence, args.ready_file),
            lambda: print_plan(plan, settings, connection, args.json))


UNIX_TIME = re.compile(r"[0-9]{10}(\.[0-9]{1,9})?")


def unix_time(text: str) -> float:
    """A Unix time in seconds, not in the future (WARMUP_HEALTHY_AT: when /health first
    answered 200)."""
    if not UNIX_TIME.fullmatch(text) or float(text) > time.time() + 60:
        raise ValueError(f"must be a Unix time in seconds, not in the future, got "
                         f"{clean_text(text, 40)!r}")
    return float(text)


def check_deadline(deadline_s: float) -> None:
    """Under warmup_serve.sh (WARMUP_HARD_S), the deadline must fall before the hard bound:
    a run the bound kills leaves a 'killed' summary, never a verdict."""
    text = os.environ.get("WARMUP_HARD_S")
    try:
        hard = float(text) if text else None
    except ValueError:
        hard = -1.0
    if hard is not None and not 0 < hard < float("inf"):
        raise UsageError(f"WARMUP_HARD_S must be a positive number of seconds, got {text!r}")
    if hard is not None and deadline_s >= hard:
        raise UsageError(f"--deadline-s {deadline_s:g} is not below the hard bound "
                         f"WARMUP_HARD_S={text} (warmup_serve.sh ends the run there); lower "
                         f"--deadline-s or raise WARMUP_HARD_S")


def print_plan(plan: Plan, settings: RunSettings, connection: Connection,
               as_json: bool) -> None:
    """Print the plan, sending nothing."""
    target, engines = connection.target, format_engines(connection.engines)
    hard = os.environ.get("WARMUP_HARD_S") or "95"      # a number: check_deadline() held it
    description = dict(plan_description(plan, settings), base_url=target.display,
                       engines=engines, hard_bound_s=float(hard))
    if as_json:
        emit(json.dumps(description, indent=2))
        return
    lines = [f"plan for {target.display} (dry run: nothing sent)"]
    for i, depth in enumerate(plan.waves):
        prompt = (f"1 long prompt of ~{plan.b1_target} tokens (more than "
                  f"{plan.b1_minimum - 1}: above 4096 and the prefill chunk "
                  f"{plan.chunk_tokens}, {plan.chunk_source}), run-unique nonce first") \
            if i == 0 else \
            f"{depth} distinct short prompts of ~{SHORT_PROMPT_WORDS + 1} words"
        lines.append(f"  {wave_name(depth):<4} {depth} concurrent: {prompt}")
    for kind_ in kinds_of(plan.paths):
        held = (f"1 to {plan.tokens} tokens (its grammar may end it)"
                if kind_.holds.tokens == "upto" else f"{plan.tokens} tokens")
        lines.append(f"  {kind_.name:<13} depths {','.join(map(str, plan.path_depths))}: "
                     f"{'streamed ' if kind_.stream else ''}{kind_.endpoint}, held to {held}")
    lines.append(f"  budget: {plan.requests_per_engine} requests, at most "
                 f"{plan.requests_per_engine * plan.tokens} completion tokens ({plan.tokens} "
                 f"each, min = max, ignore_eos, priority {plan.priority}; the waves greedy), "
                 f"per engine (engines: {engines})")
    lines.append(f"  bounds: deadline {settings.deadline_s:g} s, socket cap "
                 f"{settings.socket_cap_s:g} s, body cap {MAX_BODY_BYTES} bytes, hard bound "
                 f"{hard} s (warmup_serve.sh)")
    emit("\n".join(lines))


if __name__ == "__main__":
    runframe.script_exit(main())
