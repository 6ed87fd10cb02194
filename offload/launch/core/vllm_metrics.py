"""What a vLLM server's /metrics says: the guard (guard_problems: both request gauges, 0 on
every engine), counters and their deltas, speculative figures (derived, not worker steps),
the engines, the server's identity and its engines' sleep. Pure, but the few reads."""

from __future__ import annotations

import math
import re
import threading
import time

from core.prometheus import Exposition, parse_prometheus, series_key, series_name
from core.sanitize import clean_text, finite_number
from core.transport import Clock, Target, TransportError, fetch, start_quiet

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


_NAMES_A_GAUGE = re.compile(r"vllm:num_requests_(?:running|waiting)(?![a-zA-Z0-9_:])")
_NAMES_SLEEP = re.compile(r"vllm:engine_sleep_state(?![a-zA-Z0-9_:])")

_ENGINE_INDEX = re.compile(r"[0-9]{1,4}")      # ASCII only: str.isdigit() takes "²", "١"


def engine_index(label) -> int | None:
    """The one engine-label rule: an engine index is 1-4 ASCII digits (a label, or an int
    a record kept); None for anything else."""
    if isinstance(label, int) and not isinstance(label, bool):
        label = str(label)
    return int(label) if isinstance(label, str) and _ENGINE_INDEX.fullmatch(label) else None


def engines_in(samples: list) -> tuple[int, ...]:
    """Sorted engine indexes named by the `engine` label of vllm:* series."""
    found = {engine_index(labels.get("engine")) for name, labels, _ in samples
             if name.startswith("vllm:")}
    return tuple(sorted(found - {None}))


def process_start(samples: list) -> float | None:
    """The API server process's start (process_start_time_seconds, Unix time): the same
    value means the same server process; None when /metrics does not say, or says it
    more than one way (fail closed)."""
    found = {finite_number(value) for name, _, value in samples
             if name == "process_start_time_seconds"}
    return found.pop() if len(found) == 1 else None


SUCCESS = "vllm:request_success_total"


def served_by_engine(samples: list) -> dict[str, float]:
    """Requests each engine has served since its server started (vllm:request_success_total
    summed over its reasons; engine "" without an engine label): it only grows, so a count
    below an earlier one is a restart. What tells a server apart when /metrics has no
    process_start_time_seconds (vLLM 0.32 with --data-parallel-size > 1 publishes none)."""
    served: dict[str, float] = {}
    for name, labels, value in samples:
        if name == SUCCESS and math.isfinite(value):
            engine = labels.get("engine", "")
            served[engine] = served.get(engine, 0.0) + value
    return served


SLEEP_GAUGE = "vllm:engine_sleep_state"
SLEEP_LEVELS = {"weights_offloaded": "weights offloaded",       # sleep level 1
                "discard_all": "weights and KV cache discarded"}  # sleep level 2


def sleep_states(samples: list, engines: tuple | None = None) -> dict[str, str]:
    """Each (given) engine's vllm:engine_sleep_state: "awake" only when its awake samples
    are exactly 1 and no level's is, a level's words, "asleep", or "sleep state not
    published"; {} without the gauge. Pure."""
    seen: dict[str, dict] = {}
    for name, labels, value in samples:
        if name == SLEEP_GAUGE:
            index = engine_index(labels.get("engine", "0"))     # a label not an index: as is
            engine = clean_text(labels["engine"], 8) if index is None else str(index)
            seen.setdefault(engine, {}).setdefault(labels.get("sleep_state"), []).append(value)
    if not seen:
        return {}
    wanted = [str(e) for e in engines if e is not None] if engines else sorted(seen)
    states = {}
    for engine in wanted:
        values = seen.get(engine)
        if values is None:
            states[engine] = "sleep state not published"
            continue
        levels = [words for key, words in SLEEP_LEVELS.items() if 1 in values.get(key, [])]
        awake = values.get("awake", []) and all(v == 1 for v in values["awake"])
        states[engine] = "awake" if awake and not levels else (levels or ["asleep"])[0]
    return states


def unreadable_lines(exposition: Exposition, names: re.Pattern, what: str) -> list[str]:
    """A problem for each line that names `what` (matches `names`) but cannot be read
    exactly: a gauge the checks read fails closed on it."""
    return [f"/metrics line {number} names {what} but cannot be read exactly ({why}): "
            f"{clean_text(raw, 120)!r}"
            for number, why, raw in exposition.bad_lines if names.search(raw)]


def asleep_problem(exposition: Exposition, engines: tuple | None = None) -> str | None:
    """Which engines are not awake ("engine 0 is asleep (weights offloaded)"), or a sleep
    gauge line that cannot be read exactly; None when every engine is awake or the server
    has no sleep gauge. Pure."""
    unreadable = unreadable_lines(exposition, _NAMES_SLEEP, SLEEP_GAUGE)
    if unreadable:
        return unreadable[0]
    said = {"asleep": "is asleep", "sleep state not published": "has no sleep state sample "
            "(it cannot be told awake)"}
    asleep = [f"engine {engine} " + said.get(state, f"is asleep ({state})")
              for engine, state in sleep_states(exposition.samples, engines).items()
              if state != "awake"]
    return "; ".join(asleep) or None


FRESH_COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total",
                  "vllm:generation_tokens_total")

def guard_problems(exposition: Exposition, engines: tuple | None = None
                   ) -> tuple[list[str], list[int]]:
    """(problems, engines judged fresh): both request gauges declared or sampled, every
    sample 0, a line naming one that cannot be read refusing; with engines, each with a 0
    sample, or none while declared where its counters show it never ran (fresh)."""
    problems, fresh = [], []
    problems += unreadable_lines(exposition, _NAMES_A_GAUGE, "a request gauge")
    for gauge in GAUGES:
        series = [(labels, value) for name, labels, value in exposition.samples if name == gauge]
        problems += busy_gauges(exposition, gauge)
        sampled = {labels.get("engine") for labels, _ in series}
        if not series and gauge not in exposition.declared:
            problems.append(f"{gauge} missing from /metrics (metrics collection off, "
                            f"or not a vLLM server): the guard cannot see other work")
            continue
        for engine in engines or ():
            if str(engine) in sampled:
                continue
            if gauge in exposition.declared and engine_never_ran(exposition.samples, engine):
                if engine not in fresh:
                    fresh.append(engine)
                continue
            problems.append(f"{gauge} has no sample for engine {engine}, and that engine has "
                            f"run requests: the guard cannot see its work")
        if not engines and not series:      # one engine publishes its samples from the start
            problems.append(f"{gauge} is declared but has no sample: a server with one engine "
                            f"shows it from the start, so the guard cannot see its work")
    asleep = asleep_problem(exposition, engines)
    if asleep:
        problems.append(f"{asleep}: wake it (POST /wake_up), then run the warm-up again")
    return problems, fresh


def engine_never_ran(samples: list, engine: int | None) -> bool:
    """True when the engine's (or, with None, the server's) request counters are all 0."""
    for name, labels, value in samples:
        if name in FRESH_COUNTERS and (engine is None or labels.get("engine") == str(engine)):
            if value != 0:
                return False
    return True


class GuardRead:
    """One guard read: what /metrics said, and the decision; `fresh`: engines judged idle
    by their counters; `busy_only`: every problem a busy gauge (it may settle)."""
    __slots__ = ("ok", "problems", "samples", "counters", "fresh", "busy_only")

    def __init__(self, ok: bool, problems: list, samples: list, counters: dict | None,
                 fresh: list | None = None, busy_only: bool = False):
        self.ok, self.problems, self.samples, self.counters = ok, problems, samples, counters
        self.fresh, self.busy_only = fresh if fresh is not None else [], busy_only


def busy_gauges(exposition: Exposition, gauge: str | None = None) -> list[str]:
    """A problem for each request-gauge sample (of `gauge`, or of both) that is not 0:
    work on the server, which may be ours not yet counted out (worth a settle)."""
    return [f"{series_key(name, labels)} = {value!r}: the server is not idle"
            for name, labels, value in exposition.samples
            if name in ((gauge,) if gauge else GAUGES) and value != 0]


COUNTING_TYPES = ("counter", "histogram", "summary")
FAMILY_SUFFIXES = ("_bucket", "_count", "_sum")


def is_count_series(name: str, types: dict) -> bool:
    """A series that counts: a counter's, or a histogram's bucket, count or sum (from the
    family's # TYPE line; without one, a name ending in _total). A `*_created` sample is a
    time, never a count."""
    if name.endswith("_created"):
        return False
    family = [name] + [name[:-len(s)] for s in FAMILY_SUFFIXES if name.endswith(s)]
    if any(types.get(f) in COUNTING_TYPES for f in family):
        return True
    return name.endswith("_total") and not any(f in types for f in family)


def counters(samples: list[tuple[str, dict, float]], types: dict | None = None
             ) -> dict[str, float]:
    """Every counting series by name and label set (is_count_series)."""
    types = types or {}
    return {series_key(n, labels): v for n, labels, v in samples
            if is_count_series(n, types)}


def series_sum(deltas: dict, name: str, engine: int | None = None) -> float | None:
    """The sum of one metric's deltas (over labels; one engine's only, when given); None
    when absent or any of them is unknown."""
    values = [v for k, v in engine_deltas(deltas, engine).items() if series_name(k) == name]
    if not values or any(finite_number(v) is None for v in values):
        return None                   # a value no sum may use: NaN, text, a bool, 10**400
    return sum(values)


_ENGINE_LABEL = re.compile(r'[{,]engine="([^"]*)"')


def engine_label(key: str) -> str:
    """A series key's engine label ('' without one)."""
    found = _ENGINE_LABEL.search(key)
    return found.group(1) if found else ""


def engine_deltas(deltas: dict, engine: int | None) -> dict:
    """One engine's series of a deltas dict (all of them for a single engine)."""
    if engine is None:
        return dict(deltas)
    return {k: v for k, v in deltas.items() if f'engine="{engine}"' in k}


SPEC = "vllm:spec_decode_num_"


def spec_figures(deltas: dict) -> dict | None:
    """Derived from speculative-decoding counter deltas (pure): drafted length (draft
    tokens / drafts), acceptance rate (accepted / draft tokens), mean acceptance length
    (1 + accepted / drafts), acceptance by position (accepted there / drafts). Not worker
    RPC steps, not proof of graph capture.
    None without speculative counters (nothing invented)."""
    drafts = series_sum(deltas, SPEC + "drafts_total")
    draft_tokens = series_sum(deltas, SPEC + "draft_tokens_total")
    accepted = series_sum(deltas, SPEC + "accepted_tokens_total")
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    positions = {}
    for key, value in deltas.items():
        found = re.search(r'position="([0-9]{1,3})"', key)
        if series_name(key) == SPEC + "accepted_tokens_per_pos_total" and found \
                and isinstance(value, (int, float)):
            positions[int(found.group(1))] = positions.get(int(found.group(1)), 0) + value
    return {
        "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
        "drafted_length": round(draft_tokens / drafts, 3) if drafts else None,
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
        "acceptance_by_position": [round(positions[p] / drafts, 4) if drafts else None
                                   for p in sorted(positions)],
    }


def spec_positions(samples: list) -> int | None:
    """The draft positions the server counts (vllm:spec_decode_num_accepted_tokens_per_pos
    has one series per position, from its start): its configured k; None without them."""
    found = {labels.get("position") for name, labels, _ in samples
             if name == SPEC + "accepted_tokens_per_pos_total"}
    return len(found) or None


def tokens_per_step(deltas: dict) -> float | None:
    """Mean tokens per engine step over the deltas (vllm:iteration_tokens_total's sum /
    count); None when absent or no step ran."""
    total = series_sum(deltas, "vllm:iteration_tokens_total_sum")
    steps = series_sum(deltas, "vllm:iteration_tokens_total_count")
    return round(total / steps, 3) if total is not None and steps else None


def went_down(before: dict | None, after: dict | None) -> list[str]:
    """The series whose count went down between two reads: a restart (named, never
    subtracted)."""
    before, after = before or {}, after or {}
    return sorted(k for k in set(before) & set(after) if after[k] < before[k])


def counter_deltas(before: dict | None, after: dict | None) -> dict[str, float | None]:
    """after - before for every series; None where a side lacks it or the counter went back."""
    before, after = before or {}, after or {}
    deltas = {}
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        ok = b is not None and a is not None and math.isfinite(a - b) and a >= b
        deltas[key] = a - b if ok else None
    return deltas


_LE = re.compile(r',?le="([^"]*)"')


TOKEN_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")   # kept whole


def changed_only(deltas: dict) -> dict:
    """The deltas as records keep them, losing nothing: a series that did not change left
    out (but TOKEN_COUNTERS, 0 too: an engine's share), and a bucket equal to the next lower
    one's (a missing bucket's delta is the nearest lower kept one's, 0 below the first)."""
    kept, histograms = {}, {}
    for key, value in deltas.items():
        le = _LE.search(key) if series_name(key).endswith("_bucket") else None
        if le is not None:
            histograms.setdefault(_LE.sub("", key, count=1), []).append(
                (bucket_bound(le.group(1)), key, value))
        elif value != 0 or series_name(key).startswith(TOKEN_COUNTERS):
            kept[key] = value
    for buckets in histograms.values():
        below = 0
        for _, key, value in sorted(buckets, key=lambda b: b[0]):
            if value != below:
                kept[key] = value
            below = value if value is not None else below
    return dict(sorted(kept.items()))


def bucket_bound(text: str) -> float:
    """A bucket's `le` as a number (+Inf, or anything unreadable, last)."""
    try:
        return float(text)
    except ValueError:
        return math.inf


def exposition_of(response, only: tuple = ()) -> tuple[Exposition | None, str | None]:
    """A Prometheus answer parsed, or None and why; with `only`, just the lines that name
    one of those (a quick test drops the rest, for reads that must cost little; a line
    that names one but is damaged is kept, so the reader can fail closed on it)."""
    if response.status != 200:
        return None, f"HTTP {response.status}"
    text = response.body.decode("utf-8", "replace")
    exposition = parse_prometheus(lines_naming(text, only) if only else text)
    return (exposition, None) if exposition.samples or only else (None, "not Prometheus text")


def lines_naming(text: str, names: tuple) -> str:
    """The lines of `text` (split on LF) holding one of `names`, found by str.find."""
    kept = {}                                       # a line's start -> the line
    for name in names:
        at = -1
        while (at := text.find(name, at + 1)) >= 0:        # then on from the next line
            start, at = text.rfind("\n", 0, at) + 1, text.find("\n", at) % (len(text) + 1)
            kept[start] = text[start:at]                     # (-1: the text's end)
    return "\n".join(kept[start] for start in sorted(kept))


def read_exposition(target: Target, clock, path: str = "/metrics", only: tuple = (),
                    headers: dict | None = None) -> tuple[Exposition | None, str | None]:
    """The one reader of a Prometheus endpoint: parsed (exposition_of), or None and why."""
    try:
        response = fetch(target, clock, "GET", path, headers=headers)
    except TransportError as exc:
        return None, exc.problem
    return exposition_of(response, only)


def read_counters(target: Target, clock, path: str) -> tuple[dict | None, str | None]:
    """Counters of one Prometheus endpoint, or None and why (never a made-up number)."""
    exposition, why = read_exposition(target, clock, path)
    return (counters(exposition.samples, exposition.declared), None) if exposition \
        else (None, why)


class GaugeSampler:
    """Reads the request gauges every `interval_s` while a batch runs, in its own thread
    and on its own connections (each read bounded to 1 s and by the deadline); never
    delays the release, ends within a read's bound after stop(), and a failed read is
    counted, not fatal. Per engine: the largest running and waiting values seen."""

    MAX_READS = 3000                      # a minute at 20 ms

    def __init__(self, target: Target, clock, interval_s: float, engines: tuple | None):
        self.target, self.clock, self.interval_s = target, clock, interval_s
        self.engines = engines
        self.stopping = threading.Event()
        self.seen: dict = {}                 # engine -> {"running_max", "waiting_max", ...}
        self.reads = self.failed = 0
        self.thread = threading.Thread(target=self._sample, name="gauge-sampler", daemon=True)

    def start(self) -> None:
        start_quiet(self.thread)

    def stop(self) -> dict:
        """End the sampling; per engine (None: one engine) what it saw."""
        self.stopping.set()
        self.thread.join(timeout=1.5)
        return {engine: dict(seen, gauge_reads=self.reads, gauge_reads_failed=self.failed)
                for engine, seen in self.seen.items()} or \
            {None: {"running_max": None, "waiting_max": None, "gauge_samples": 0,
                    "gauge_reads": self.reads, "gauge_reads_failed": self.failed}}

    def _sample(self) -> None:
        while not self.stopping.is_set() and self.reads < self.MAX_READS:
            started = time.monotonic()
            left = self.clock.remaining()
            if left <= 0:
                return
            read, _ = read_exposition(self.target, Clock.start(min(left, 1.0), 1.0),
                                      only=GAUGES)
            self.reads += 1
            if read is None:
                self.failed += 1
            else:
                self.note(read.samples)
            self.stopping.wait(max(self.interval_s - (time.monotonic() - started), 0))

    def note(self, samples: list) -> None:
        """Fold one read's gauge samples into the per-engine maxima."""
        for name, labels, value in samples:
            if name not in GAUGES or not math.isfinite(value):
                continue
            engine = None
            if self.engines is not None:
                engine = engine_index(labels.get("engine"))
                if engine is None or engine not in self.engines:
                    continue
            seen = self.seen.setdefault(engine, {"running_max": 0.0, "waiting_max": 0.0,
                                                 "gauge_samples": 0})
            key = "running_max" if name.endswith("running") else "waiting_max"
            seen[key] = max(seen[key], value)
            if key == "running_max":
                seen["gauge_samples"] += 1
