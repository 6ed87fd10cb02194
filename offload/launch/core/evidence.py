"""Evidence of what moved during a warm-up: counter deltas of the main /metrics, the
--metrics-url endpoints and an operator's --metrics-counter, and --status-file changes (those
two load with their flags); evidence, never a count of worker rounds: decide() judges it.
"""

from __future__ import annotations

import re

from core.values import Value
from core.prometheus import series_name
from core.transport import Target
from core.contract import cross_check
from core.vllm_metrics import (changed_only, counter_deltas, engine_label, read_counters,
                               served_by_engine, went_down)

TYPE_CHECKING = False                 # typing's, without importing typing (3 ms)
if TYPE_CHECKING:                     # names in annotations only: no import at run time
    from core.runframe import Run
    from core.vllm_client import Tally

AFTER_READS_MIN_LEFT_S = 1.0         # the reads after the last wave must not make a run late

COUNTER_MEANING = ("engine-wide counts over the warm-up window (from the /metrics read before "
                   "the first wave to the read after the last); attributable to the warm-up only "
                   "as far as the guards saw an idle server at each wave; not a count of worker "
                   "rounds")

HIGHLIGHTS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
              "vllm:request_success_total", "vllm:prefix_cache_queries_total",
              "vllm:prefix_cache_hits_total")

SPEC_DECODE_PREFIX = "vllm:spec_decode_"

def highlighted(deltas: dict[str, float | None]) -> dict[str, float | None]:
    """The series an operator looks at; a highlighted counter absent everywhere is None."""
    shown = {k: v for k, v in deltas.items()
             if series_name(k) in HIGHLIGHTS or k.startswith(SPEC_DECODE_PREFIX)}
    names = {series_name(k) for k in shown}
    shown.update({name: None for name in HIGHLIGHTS if name not in names})
    if not any(n.startswith(SPEC_DECODE_PREFIX) for n in names):
        shown[SPEC_DECODE_PREFIX + "*"] = None
    return shown


class EvidenceOptions(Value):
    """Where else to look for what moved during the run (from the command line)."""
    metrics_targets: tuple = ()           # more Prometheus endpoints (Targets)
    status_files: tuple = ()
    status_wait_s: float = 15.0
    status_time_field: str = "timestamp"  # the field a status file's writer stamps
    counted: tuple = ()                   # (Target, counter name, unit "requests"/"tokens"):
                                          # an operator's counter of the work it saw
    foreign_work: str = "fail"            # what foreign work on one does: fail, or evidence
    healthy_at: float | None = None       # when /health first answered 200 (the launcher's)


def time_to_warm(process_start: float | None, healthy_at: float | None,
                 warm_at: float) -> dict:
    """Server process start -> first /health 200 -> warm-up end, in seconds (Unix times
    in); a phase is null when one of its times is unknown or it would be negative. Without
    the first /health 200 (a run by hand) the whole is unknown too: process start -> warm
    would be the server's uptime, not its time to warm. Pure."""
    def span(start, end):
        return round(end - start, 3) if start is not None and end is not None and \
            end >= start else None
    return {"start_to_healthy_s": span(process_start, healthy_at),
            "healthy_to_warm_s": span(healthy_at, warm_at),
            "start_to_warm_s": span(process_start, warm_at) if healthy_at is not None
            else None}


class Evidence:
    """Counters and status files read before the first wave and after the last: what moved
    during the run, recorded as `metrics` and `status` records."""

    def __init__(self, options: EvidenceOptions):
        self.options = options
        self.counters_before: dict = {}       # source -> (counters or None, why)
        self.status_before: dict = {}         # path -> (document or None, why)
        self.highlights: dict | None = None   # the main source's highlighted deltas
        self.main_deltas: dict | None = None  # the main source's deltas, when complete
        self.served: dict | None = None       # requests each engine served, after the run
        self.marks: list = []                 # (wave, {source: counter now}) at each release

    def read_before(self, run: Run) -> None:
        """Counters of the extra endpoints and the status files, before the first wave."""
        for target in self.options.metrics_targets:
            self.counters_before[target.display] = read_counters(target, run.clock, "")
        if self.options.status_files:            # loaded with --status-file only
            from core.status_files import wait_for_status
            for path in self.options.status_files:
                self.status_before[path] = wait_for_status(run, path, self.status_wait())[:2]

    def status_wait(self) -> tuple[float, str]:
        """How long a status file is waited for, and the field that tells it fresh."""
        return self.options.status_wait_s, self.options.status_time_field

    def mark(self, run: Run, wave: str) -> None:
        """Each operator counter (--metrics-counter) read now, as a wave is released (or,
        `wave` None, after the last): what moved between two marks is that wave's."""
        if self.options.counted:                 # loaded with --metrics-counter only
            from core.counted import counted_value
            self.marks.append((wave, {t.display: counted_value(t, run.clock, name)
                                      for t, name, _ in self.options.counted}))

    def read_after(self, run: Run, target: Target, first_counters: dict | None, tally: Tally,
                   judge_main=None) -> None:
        """Every counter source and status file read again, deltas and cross-checks recorded
        (`target`'s /metrics the main one; `judge_main(deltas, record)` may add to it);
        skipped, and said, with less than a second left: never late for its counters."""
        if run.clock.remaining() < AFTER_READS_MIN_LEFT_S:
            tally.warnings.append("counter deltas and status files not read after the last "
                                  "wave: less than 1 s left to the deadline")
            return
        main_source = target.display + "/metrics"
        self.mark(run, None)
        counted = {}
        if self.options.counted:                 # loaded with --metrics-counter only
            from core.counted import counted_records, foreign_said
            counted = counted_records(self.options.counted, self.marks, tally.requests)
        befores = dict(self.counters_before)
        if first_counters is not None:
            befores[main_source] = (first_counters, None)
        sources = [(main_source, target, "/metrics")] + \
            [(t.display, t, "") for t in self.options.metrics_targets]
        for source, where, path in sources:
            before, why_before = befores.get(source, (None, "not read before the first wave"))
            after, why_after = read_counters(where, run.clock, path)
            deltas = counter_deltas(before, after)
            why = why_before or why_after
            record = {"record": "metrics", "run_id": run.settings.run_id, "source": source,
                      "state": "incomplete" if why else "complete",
                      "why": None if not why else f"{'before' if why_before else 'after'}: {why}",
                      "meaning": COUNTER_MEANING, "deltas": changed_only(deltas),
                      "highlights": highlighted(deltas)}
            if source == main_source:
                self.highlights = record["highlights"]
                self.served = None if after is None else served_by_engine(
                    [(series_name(k), {"engine": e} if (e := engine_label(k)) else {}, v)
                     for k, v in after.items()])
                record["served"] = self.served
                self.main_deltas = None if why else deltas
                record["went_down"] = [] if why else went_down(before, after)
                record["problems"], record["warnings"] = ([], []) if why else \
                    cross_check(deltas, tally.requests, down=record["went_down"])
                tally.warnings += record["warnings"]
                if why:
                    tally.warnings.append(f"counter deltas incomplete: {record['why']}")
                if judge_main is not None:
                    judge_main(deltas if not why else {}, record)
            if source in counted:
                record["counted"] = counted[source]
                tally.warnings += foreign_said(source, counted[source])
            run.write(record)
        if self.options.status_files:            # loaded with --status-file only
            from core.status_files import status_records
            status_records(run, self.options.status_files, self.status_wait(),
                           self.status_before, tally)
        run.say(counters_line(self.highlights))


def counters_line(highlights: dict | None) -> str:
    """One line: each highlighted counter summed over engines; success by reason when it moved."""
    if not highlights:
        return "counters: not read"
    totals: dict[str, float | None] = {}
    for key, value in highlights.items():
        name = series_name(key).replace("vllm:", "").replace("_total", "")
        reason = re.search(r'finished_reason="([^"]*)"', key)
        if reason:
            if not value:
                continue
            name += f"[{reason.group(1)}]"
        previous = totals.get(name, 0)
        totals[name] = None if value is None or previous is None else previous + value
    return "counters over the warm-up: " + ", ".join(
        f"{k} {'n/a' if v is None else f'+{v:g}'}" for k, v in totals.items())


