"""Evidence of what moved during a warm-up: counter deltas and status files.

Used by warmup.py: the main /metrics (from the first guard's read to a read after the last
wave), more Prometheus endpoints (--metrics-url: a proxy's, a worker's) and JSON status
files another process rewrites on a timer (--status-file). Deltas are evidence for an
operator, never a count of worker rounds; what they show against the records (foreign
work, a restart, each engine's share) is contract.decide()'s to judge, from the records
written here.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.files import read_json_file
from core.transport import MAX_JSON_DEPTH, Target, clean_text, json_number, series_name
from core.contract import cross_check
from core.vllm_metrics import (changed_only, counter_deltas, engine_label, read_counters,
                               served_by_engine, went_down)

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

STATUS_IDENTITY = ("pid", "session", "session_id", "boot_id", "started_at", "start_time")

def highlighted(deltas: dict[str, float | None]) -> dict[str, float | None]:
    """The series an operator looks at; a highlighted counter absent everywhere is None."""
    shown = {k: v for k, v in deltas.items()
             if series_name(k) in HIGHLIGHTS or k.startswith(SPEC_DECODE_PREFIX)}
    names = {series_name(k) for k in shown}
    shown.update({name: None for name in HIGHLIGHTS if name not in names})
    if not any(n.startswith(SPEC_DECODE_PREFIX) for n in names):
        shown[SPEC_DECODE_PREFIX + "*"] = None
    return shown


def flatten_numbers(doc, prefix: str = "", depth: int = 0) -> dict[str, float]:
    """A status document's numeric fields as dotted keys (booleans are not numbers)."""
    found = {}
    if isinstance(doc, dict) and depth < MAX_JSON_DEPTH:
        for key, value in list(doc.items())[:1000]:
            found.update(flatten_numbers(value, f"{prefix}{clean_text(str(key), 64)}.",
                                         depth + 1))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool) and math.isfinite(doc):
        found[prefix[:-1]] = doc
    return found


def status_delta(before: dict | None, after: dict | None, why_missing: str | None = None) -> dict:
    """Numeric deltas of a status file; 'invalid' when its identity (pid, session) changed,
    'unverified' when it has no identity field to compare."""
    if before is None or after is None:
        return {"state": "incomplete", "why": why_missing or "no snapshot", "delta": None}
    changed = [f"{k} changed ({clean_text(str(before.get(k)), 40)} -> "
               f"{clean_text(str(after.get(k)), 40)})"
               for k in STATUS_IDENTITY if before.get(k) != after.get(k)]
    b, a = flatten_numbers(before), flatten_numbers(after)
    delta = {k: json_number(a[k] - b[k]) if k in a and k in b else None
             for k in sorted(set(a) | set(b)) if k.split(".")[0] not in STATUS_IDENTITY}
    if changed:
        return {"state": "invalid", "why": "; ".join(changed), "delta": delta}
    if not any(k in before for k in STATUS_IDENTITY):
        return {"state": "unverified", "delta": delta,
                "why": f"no identity field ({', '.join(STATUS_IDENTITY)}) to show both snapshots "
                       f"come from the same process"}
    return {"state": "valid", "why": None, "delta": delta}


@dataclass(frozen=True)
class EvidenceOptions:
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
        for path in self.options.status_files:
            self.status_before[path] = self.wait_for_status(run, path)[:2]

    def mark(self, run: Run, wave: str) -> None:
        """Each operator counter (--metrics-counter) read now, as a wave is released (or,
        `wave` None, after the last): what moved between two marks is that wave's."""
        if self.options.counted:
            self.marks.append((wave, {t.display: counted_value(t, run.clock, name)
                                      for t, name, _ in self.options.counted}))

    def counted_records(self, requests: list[dict]) -> dict:
        """Per operator counter: what it counted over the run and over each wave, against
        what the warm-up sent (its requests, or their prompt and completion tokens); more is
        foreign work, named with the waves it overlaps. Pure over the marks."""
        found = {}
        for target, name, unit in self.options.counted:
            values = [(wave, seen.get(target.display)) for wave, seen in self.marks]
            waves, foreign_in, whys = {}, [], set()
            for (wave, before), (_, after) in zip(values, values[1:]):
                sent = sent_by(unit, [r for r in requests if r.get("wave") == wave])
                delta, why = series_delta(before, after)
                whys.add(why)
                waves[wave] = {"delta": maybe_number(delta), "sent": sent}
                if delta is not None and delta > sent:
                    foreign_in.append(wave)
            delta, why = series_delta(values[0][1], values[-1][1]) if values else (None, None)
            why = next((w for w in (WENT_DOWN, NOT_FINITE) if w in whys | {why}), why)
            sent = sent_by(unit, requests)
            found[target.display] = {
                "counter": name, "unit": unit, "delta": maybe_number(delta), "sent": sent,
                "foreign": None if delta is None or why else json_number(max(delta - sent, 0)),
                "went_down": why == WENT_DOWN, "why": why, "waves": waves,
                "overlaps": foreign_in}
        return found

    def read_after(self, run: Run, target: Target, first_counters: dict | None, tally: Tally,
                   judge_main=None) -> None:
        """Read every counter source and status file again; record deltas and cross-checks.

        `target`'s /metrics is the main source, its `before` the first guard's counters;
        `judge_main(deltas, record)` may add to its record (and the tally's warnings).
        Skipped (and said) when less than a second is left: a run that
        finished its waves in time must not become late for the sake of its counters.
        """
        if run.clock.remaining() < AFTER_READS_MIN_LEFT_S:
            tally.warnings.append("counter deltas and status files not read after the last "
                                  "wave: less than 1 s left to the deadline")
            return
        main_source = target.display + "/metrics"
        self.mark(run, None)
        counted = self.counted_records(tally.requests)
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
        for path in self.options.status_files:
            before, why_before = self.status_before.get(path, (None, "not read"))
            after, why_after, fresh_by = self.wait_for_status(
                run, path, missing_before=before is None
                and str(why_before).startswith("missing"))
            why = "; ".join([f"before: {why_before}"] * bool(why_before)
                            + [f"after: {why_after}"] * bool(why_after)) or None
            result = status_delta(before, after, why)
            run.write(dict({"record": "status", "run_id": run.settings.run_id, "path": path},
                           **result, fresh_by=fresh_by))
            if result["state"] != "valid":
                tally.warnings.append(f"status file {path}: {result['state']}: {result['why']}")
        run.say(counters_line(self.highlights))

    def wait_for_status(self, run: Run, path: str, missing_before: bool = False
                        ) -> tuple[dict | None, str | None, str | None]:
        """The status file once fresh, within --status-wait-s and the deadline: (document,
        why not, what told it fresh). Fresh is a new value of its own timestamp field
        (--status-time-field), the writer's word; only a file without that field is told
        fresh by its modification time."""
        if missing_before and not os.path.exists(path):
            return None, "missing (and missing before the first wave: not waited for " \
                "again)", None
        wait_s, field = self.options.status_wait_s, self.options.status_time_field
        if os.path.exists(path) and not os.path.isfile(path):
            return None, "not a regular file (a FIFO or a device could block the read)", None
        run.say(f"waiting up to {wait_s:g} s for {path} to be rewritten")
        asked, stamp = time.time(), time_stamp(path, field)
        limit = time.monotonic() + min(wait_s, max(run.clock.remaining() - 1, 0))
        while True:
            try:
                moved = os.stat(path).st_mtime > asked
                doc = read_json_file(path)[0] if moved or stamp is not None else None
                if isinstance(doc, dict) and stamped(doc, field):
                    if doc[field] != stamp and not later_than(stamp, doc[field]):
                        return doc, None, f"its {field} field"
                elif isinstance(doc, dict) and moved:
                    return doc, None, f"modification time (no {field} field)"
            except FileNotFoundError:
                if time.monotonic() >= limit:
                    return None, "missing", None
            except OSError:
                pass                                # being rewritten: read it again
            if time.monotonic() >= limit:
                return None, (f"stale: no fresh {field} (nor, without one, a rewrite) within "
                              f"{wait_s:g} s (or the time left to the deadline)"), None
            time.sleep(0.1)


def maybe_number(value: float | None):
    """A count as a record keeps it; None stays None (not read)."""
    return None if value is None else json_number(value)


WENT_DOWN = "went down during the warm-up (a restart or a reset)"
NOT_FINITE = "read NaN or an infinity"
UNREAD = "could not be read at every wave"


def counted_value(target: Target, clock, name: str) -> dict | None:
    """An operator counter's series now, by their labels (None: unreadable, absent)."""
    found, _ = read_counters(target, clock, "")
    values = {k: v for k, v in (found or {}).items() if series_name(k) == name}
    return values if values and all(v is not None for v in values.values()) else None


def series_delta(before: dict | None, after: dict | None) -> tuple[float | None, str | None]:
    """What a counter counted between two reads, series by series (a series new since the
    first read counts from 0): (delta, None), or (None, why it cannot be compared: a
    series went down or vanished, a value is not finite, a read failed). Pure."""
    if before is None or after is None:
        return None, UNREAD
    if not all(math.isfinite(v) for v in [*before.values(), *after.values()]):
        return None, NOT_FINITE
    if any(after.get(key, -math.inf) < value for key, value in before.items()):
        return None, WENT_DOWN
    return sum(value - before.get(key, 0.0) for key, value in after.items()), None


def sent_by(unit: str, requests: list[dict]) -> int:
    """What the warm-up sent, as an operator counter counts it: requests, or the prompt
    and completion tokens the server reported for them."""
    if unit == "requests":
        return len(requests)
    return sum((r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0)
               for r in requests if isinstance(r.get("prompt_tokens"), int))


def foreign_said(source: str, counted: dict) -> list[str]:
    """The warning a counter that counted more than the warm-up sent gives (or why it
    could not be compared)."""
    if counted["delta"] is None or counted.get("why"):
        return [f"{source}: {counted['counter']} {counted.get('why') or UNREAD}: not "
                f"compared, foreign work there not checked"]
    if counted["delta"] < counted["sent"]:
        return [f"{source}: {counted['counter']} counted {counted['delta']:g} "
                f"{counted['unit']}, fewer than the {counted['sent']} the warm-up sent: "
                f"does it count this traffic?"]
    if not counted["foreign"]:
        return []
    during = f" (during {', '.join(map(str, counted['overlaps']))})" if counted["overlaps"] \
        else ""
    return [f"foreign work on {source}: {counted['counter']} counted {counted['delta']:g} "
            f"{counted['unit']}, the warm-up sent {counted['sent']}: {counted['foreign']:g} "
            f"more{during}"]


def later_than(first, second) -> bool:
    """A timestamp that went backwards: `first` (numbers, or ISO strings of one shape)
    after `second`. A rewrite that turns time back is not fresh."""
    if isinstance(first, str) and isinstance(second, str) and len(first) == len(second):
        return first > second
    return isinstance(first, (int, float)) and isinstance(second, (int, float)) and \
        not isinstance(first, bool) and first > second


def stamped(doc: dict, field: str) -> bool:
    """The document carries its timestamp field (a number or a string)."""
    return isinstance(doc.get(field), (int, float, str)) and not isinstance(doc[field], bool)


def time_stamp(path: str, field: str):
    """A status file's timestamp field now (None: unreadable, or no such field)."""
    try:
        doc, _ = read_json_file(path)
    except OSError:
        return None
    return doc[field] if isinstance(doc, dict) and stamped(doc, field) else None


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


