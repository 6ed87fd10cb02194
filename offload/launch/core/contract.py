"""What a warm-up is: the reviewed plan, declared once, and the one verdict on a run.

Pure: plain data and functions, no I/O. REVIEWED is the patch note's plan (B1..B4, 32
tokens, priority 20); a Plan is one as run, `given` naming what changed it; decide() is
the one verdict, on what a run just wrote or on a file, which the summary, the terminal,
the textfile, start.sh's OK/WARN and the ready file all read.
"""

from __future__ import annotations

from collections import Counter

from core.values import Value
from core.kinds import KINDS, Kind, answer_of, copy_problem, judge, kinds_of
from core.prompts import ONE_STEP_FLOOR, ONE_STEP_MARGIN, b1_bounds
from core.records import CLASSES, FORMAT, JUDGED, SHAPED, label, show
from core.cli import EXIT_FAIL, EXIT_PASS, comma_list
from core.runframe import Ending
from core.vllm_metrics import GAUGES, engine_index, engine_label, series_sum

ENGINE_HEADER = "X-data-parallel-rank"
MAX_WAVE_DEPTH = 64
MODES = tuple(JUDGED)


def wave_name(depth: int) -> str:
    return f"B{depth}"


class Plan(Value):
    """What a warm-up sends on each engine: waves by depth (the first, B1, of the long-prompt
    kind; the others greedy short prompts), each request's budget, and --paths kinds after
    the waves. `given`: (setting, where it came from) for each setting a flag or a WARMUP_*
    variable gave."""
    waves: tuple[int, ...] = (1, 2, 3, 4)
    tokens: int = 32
    priority: int = 20
    chunk_tokens: int = 4096              # the server's prefill chunk (K1's): B1 is longer
    chunk_source: str = "assumed"         # where the chunk came from: a flag, or assumed
    context: int | None = None            # the server's context B1 was sized in, if told
    paths: tuple = ()                     # --paths: request kinds warmed after the waves
    b1_tokens: int = 5000
    gauge_interval_ms: int = 20           # 0: no per-wave evidence (counters, observed depth)
    template_kwargs: dict | None = None   # passed to the chat template (chat kinds)
    given: tuple = ()
    file: tuple | None = None             # plan_file.PlanFile, if any
    UNCOMPARED = ("given", "file")

    def batches(self) -> list[tuple[Kind, int]]:
        """Every batch in order: (kind, depth) of each wave, then each --paths kind at depth
        1 and at the deepest wave's."""
        waves = [(KINDS["long" if i == 0 else "greedy"], d) for i, d in enumerate(self.waves)]
        return waves + [(k, d) for k in kinds_of(self.paths) for d in self.path_depths]

    @property
    def path_depths(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((1, max(self.waves))))

    @property
    def wave_requests(self) -> int:
        """The waves' requests per engine (B1..Bn, --paths kinds aside)."""
        return sum(self.waves)

    @property
    def requests_per_engine(self) -> int:
        return self.wave_requests + len(kinds_of(self.paths)) * sum(self.path_depths)

    @property
    def b1_minimum(self) -> int:
        """The fewest prompt tokens B1 may have: more than the prefill chunk, or in one
        step, nearly all the context holds (prompts.b1_bounds)."""
        return b1_bounds(self.b1_target, self.tokens, self.chunk_tokens, self.context)[1]

    @property
    def one_step(self) -> bool:
        """True when the server's context holds no B1 longer than its chunk: B1 is then
        the longest prompt it holds, prefilled in one step (that server's pass, said)."""
        return b1_bounds(self.b1_target, self.tokens, self.chunk_tokens, self.context)[2]

    @property
    def b1_target(self) -> int:
        """B1's target size: --b1-tokens, or past the chunk when that is not longer."""
        if self.b1_tokens > self.chunk_tokens:
            return self.b1_tokens
        return self.chunk_tokens + max(self.chunk_tokens // 8, 64)


REVIEWED = Plan()                     # the reviewed plan: 10 requests, 320 tokens per engine


def plan_of_file(file) -> Plan:
    """The plan a plan file (plan_file.PlanFile, its fields already held) declares."""
    fields = file.fields
    return Plan(waves=fields["waves"], tokens=fields["tokens"], priority=fields["priority"],
                b1_tokens=fields["b1_tokens"], paths=fields["paths"], file=file)


def plan_label(plan: Plan) -> str:
    """What a pass of the plan is called: 'contract', or 'plan NAME sha256:1a2b3c4d…'."""
    return f"plan {plan.file.name} sha256:{plan.file.sha256[:8]}…" if plan.file else \
        "contract"


def batch_name(kind_: Kind, depth: int) -> str:
    """A batch's name as records and ids carry it: B2, or a --paths kind's logprobs-chat-4."""
    return wave_name(depth) if kind_.path is None else f"{kind_.name}-{depth}"


def parse_waves(text: str) -> tuple[int, ...]:
    """'1,2,3,4' -> (1, 2, 3, 4); distinct depths of 1 to 64, the first of them 1."""
    depths = comma_list(text, int, "distinct depths separated by commas, such as 1,2,3,4")
    if any(d < 1 or d > MAX_WAVE_DEPTH for d in depths):
        raise ValueError(f"depths must be between 1 and {MAX_WAVE_DEPTH}; got {text!r}")
    if depths[0] != 1:
        raise ValueError(f"must start with 1 (B1, the long-prompt wave); got {text!r}")
    return depths


# The plan as a run record holds it, read back in one place.

def plan_record(plan: Plan) -> dict:
    """The plan as recorded (and printed by --dry-run): sizes only, never prompt text."""
    return {
        "waves": [{"wave": batch_name(k, d), "depth": d, "kind": k.name}
                  for k, d in plan.batches()[:len(plan.waves)]],
        "tokens": plan.tokens, "priority": plan.priority,
        "chunk_tokens": plan.chunk_tokens, "chunk_source": plan.chunk_source,
        "b1_tokens": plan.b1_tokens,
        "b1_target_tokens": plan.b1_target, "b1_min_prompt_tokens": plan.b1_minimum,
        "b1_context_tokens": plan.context, "b1_one_step": plan.one_step,
        "paths": [{"path": k.name, "depths": list(plan.path_depths), "endpoint": k.endpoint,
                   "stream": k.stream} for k in kinds_of(plan.paths)],
        "requests_per_engine": plan.requests_per_engine,
        "completion_tokens_max": plan.requests_per_engine * plan.tokens,
        "gauge_interval_ms": plan.gauge_interval_ms or None,
        "given": dict(plan.given),
        "file": plan.file and plan.file.recorded(),
    }


def read_plan(recorded: dict) -> tuple[Plan | None, list[str]]:
    """The one reader of a recorded warm-up plan (a run record's `plan`, held to its
    declaration by records.held()): (the Plan, []) or (None, why it cannot be read). A
    file cannot choose its own rules."""
    waves = recorded.waves or []
    depths = tuple(w.depth for w in waves)
    try:
        parse_waves(",".join(map(str, depths)))
    except ValueError:
        return None, [f"the run record's plan has no waves to judge by ({show(depths)})"]
    expected = [(wave_name(d), "long" if i == 0 else "greedy") for i, d in enumerate(depths)]
    if [(w.wave, w.kind) for w in waves] != expected:
        return None, ["the run record's waves are not named for their depths and kinds"]
    paths = [p.path for p in recorded.paths or []]
    if not all(p in KINDS and KINDS[p].path for p in paths):
        return None, ["the run record's plan names a request kind that is not a --paths kind"]
    tokens, priority, chunk = recorded.tokens, recorded.priority, recorded.chunk_tokens
    if tokens is None or chunk is None or priority is None or min(tokens, chunk) < 1:
        return None, ["the run record's plan holds no token count, priority or chunk to "
                      "judge it by"]
    context = recorded.b1_context_tokens
    if context is not None and context - tokens < ONE_STEP_FLOOR:
        return None, [f"the run record's plan holds a context ({context}) that no B1 fits in"]
    file = recorded.file
    if file:                              # loaded with a plan file only
        from core.plan_file import recorded_file
        file, why = recorded_file(file)
        if why:
            return None, [why]
    plan = Plan(waves=depths, tokens=tokens, priority=priority, chunk_tokens=chunk,
                chunk_source=show(recorded.chunk_source), context=context, file=file,
                b1_tokens=recorded.b1_tokens or REVIEWED.b1_tokens,
                paths=tuple(dict.fromkeys(KINDS[p].path for p in paths)),
                given=tuple((k, show(v, 120)) for k, v in (recorded.given or {}).items()))
    if [k.name for k in kinds_of(plan.paths)] != paths:
        return None, ["the run record's --paths kinds are not whole paths"]
    return plan, []


def differences(plan: Plan, engines_skipped=()) -> list[str]:
    """How a plan differs from the reviewed one, or from its plan file ([]: none), each
    said with the setting that made it, where one was given. --paths kinds are always a
    difference: a shape test of their own, never part of a pass (nor a ready file)."""
    given = dict(plan.given)
    found = []
    reviewed = plan_of_file(plan.file) if plan.file else REVIEWED
    for name, shown in (("tokens", plan.tokens), ("priority", plan.priority),
                        ("waves", ",".join(map(wave_name, plan.waves))),
                        ("b1_tokens", plan.b1_tokens),
                        ("paths", ",".join(plan.paths) or "none")):
        if getattr(plan, name) != getattr(reviewed, name):
            found.append(f"{name} {shown}" + (f" ({given[name]})" if name in given else ""))
    if engines_skipped:
        found.append(f"engines not warmed: {show(engines_skipped)}"
                     + (f" ({given['engines']})" if "engines" in given else ""))
    return found


def chunk_said(plan: Plan, where: str = "", flag: str = "--chunk-tokens") -> str:
    """Where B1's chunk came from, as the first line and start.sh's OK line say it:
    'chunk 4096 from the command', or 'chunk 4096 assumed: pass --chunk-tokens'."""
    if where or plan.chunk_source != "assumed":
        return f"chunk {plan.chunk_tokens} from {where or plan.chunk_source}"
    return f"chunk {plan.chunk_tokens} assumed: pass {flag}"


def one_step_said(plan: Plan) -> str:
    """A plan whose B1 the server prefills in one step (Plan.one_step), in words."""
    chunk = f"{plan.chunk_tokens}{', assumed' if plan.chunk_source == 'assumed' else ''}"
    return "B1 in one prefill step: " + (
        f"this server's chunk ({chunk}) is not smaller than its context ({plan.context})"
        if plan.chunk_tokens >= plan.context else f"this server's context ({plan.context}) "
        f"holds no prompt {ONE_STEP_MARGIN} tokens longer than its chunk ({chunk}) beside "
        f"{plan.tokens} completion tokens")


def planned_requests(plan: Plan, engines: list) -> list[tuple]:
    """(engine, batch, request kind, index) of every request a plan sends."""
    return [(engine, batch_name(k, d), k.name, index) for engine in engines
            for k, d in plan.batches() for index in range(d)]


# What the server's counters show against the records.

def cross_check(deltas: dict, requests: list[dict], scope: str = "the warm-up",
                down: list | tuple = ()) -> tuple[list[str], list[str]]:
    """What counter deltas show against the records of `scope` (a wave, or the warm-up):
    (problems, warnings). A counter that went down (`down`) is a restart; more counted
    than the records hold is foreign or concurrent work (both problems); less, or a
    counter absent, a warning. The one rule for a wave and for the whole run."""
    problems = [f"{scope}: {key} went down: the server restarted, and what was warmed "
                f"before is gone" for key in list(down)[:1]]
    warnings = []
    for name, counted, what in (
            ("vllm:generation_tokens_total",
             sum(r.completion_tokens or 0 for r in requests), "completion tokens"),
            ("vllm:request_success_total",
             sum(1 for r in requests if r.http_status == 200), "requests answered 200")):
        delta = series_sum(deltas, name)
        short = name.replace("vllm:", "").replace("_total", "").replace("_", " ")
        if delta is None:
            warnings.append(f"cross-check not made: {name} absent")
        elif delta > counted:
            problems.append(f"{scope}: {short} delta {delta:g} exceeds the records' {counted} "
                            f"{what}: foreign or concurrent work (hold producers; one helper "
                            f"at a time)")
        elif delta < counted:
            warnings.append(f"{short} delta {delta:g} is below the records' {counted} {what} "
                            f"(a counting difference)")
    return problems, warnings


def engine_shares(deltas: dict, engines: tuple[int, ...], want_generated: int,
                  want_prompt: dict) -> tuple[list[dict], list[str]]:
    """Each engine's share of the work from its own counter deltas: (per-engine figures,
    problems: an engine short of its share or without counters, never made up)."""
    shares, problems = [], []
    for engine in engines:
        generated = series_sum(deltas, "vllm:generation_tokens_total", engine)
        prompt = series_sum(deltas, "vllm:prompt_tokens_total", engine)
        shares.append({"engine": engine, "generation_tokens": generated,
                       "generation_tokens_planned": want_generated, "prompt_tokens": prompt,
                       "b1_prompt_tokens": want_prompt.get(engine)})
        if generated is None or prompt is None:
            problems.append(f"engine {engine}: counters absent or unreadable, its share "
                            f"cannot be checked: its warm-up is not proven")
            continue
        if generated < want_generated:
            problems.append(f"engine {engine} generated {generated:g} of {want_generated} "
                            f"tokens: is {ENGINE_HEADER} honoured by this server?")
        needed = want_prompt.get(engine)
        if needed is not None and prompt < needed:
            problems.append(f"engine {engine} prefilled {prompt:g} prompt tokens, fewer than "
                            f"its B1 prompt's {needed}: is {ENGINE_HEADER} honoured by this "
                            f"server?")
    return shares, problems


def engines_seen(records: list[dict]) -> set[int]:
    """Every engine the run's own gauge and metrics records show the server has: the
    engine labels of their samples and counters, their fresh, asleep and served engines."""
    names: list = []
    for record in records:
        if record.record == "gauges":
            names += [sample.labels.get("engine") for sample in record.samples]
            names += record.fresh_engines + list(record.sleep_state or {})
        elif record.record == "metrics":
            names += [engine_label(k) for k in record.deltas] + list(record.served or {})
        elif record.record == "wave":
            names += [engine_label(k) for k in record.counters or {}]
    return {engine_index(n) for n in names} - {None}


def unwarmed_engines(engines: list, skipped: list[int], records: list[dict]) -> list[str]:
    """An engine the run's own records show the server has, neither warmed nor named as
    left out (engines_skipped, a custom plan): a warm-up on fewer engines is no pass."""
    warmed = {0} if engines == [None] else set(engines)
    cold = sorted(engines_seen(records) - warmed - set(skipped))
    return [f"engine {', '.join(map(str, cold))} of the server (seen in this run's /metrics "
            f"records) was not warmed: the run covered engine(s) "
            f"{', '.join(map(str, sorted(warmed)))} only"] if cold else []


def b1_prompts(requests: list[dict]) -> dict:
    """Each engine's B1 prompt tokens, as its share of prefill must show them."""
    return {r.engine: r.prompt_tokens for r in requests
            if r.request_kind == "long" and r.prompt_tokens}


def counter_problems(plan: Plan, engines: list, records: list[dict],
                     requests: list[dict], foreign_work: str | None = None) -> list[str]:
    """What the counters the run recorded show: each wave's (from its wave records) and the
    whole run's (the first metrics record, when complete), foreign work or a restart; on
    a routed server, every engine its share."""
    problems = []
    waves: dict[str, tuple[dict, list]] = {}
    for wave in (r for r in records if r.record == "wave"):
        deltas, down = waves.setdefault(wave.wave, ({}, []))
        deltas.update(wave.counters or {})
        down += wave.counters_went_down or []
    for name, (deltas, down) in waves.items():
        if deltas or down:
            problems += cross_check(deltas, [r for r in requests if r.wave == name],
                                    name, down)[0]
    if foreign_work != "evidence":                 # unless the operator's choice
        for record in (r for r in records if r.record == "metrics"):
            counted, source = record.counted, show(record.source)
            if counted and counted.foreign != 0:
                problems.append(
                    f"foreign work on {source}: {show(counted.counter)} counted "
                    f"{counted.foreign:g} more than the warm-up sent (--foreign-work evidence "
                    f"keeps it as evidence)" if counted.foreign is not None
                    else f"{show(counted.counter)} on {source} could not be compared "
                         f"with what the warm-up sent ({show(counted.why)})")
    main = next((r for r in records if r.record == "metrics"), None)
    deltas = main.deltas if main and main.state == "complete" else {}
    if deltas:                        # foreign work, or a restart it saw
        problems += cross_check(deltas, requests, down=main.went_down or [])[0]
    else:                             # each engine's share from its wave records, then
        deltas = {}
        for series in waves.values():
            for key, value in series[0].items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    deltas[key] = deltas.get(key, 0) + value
    if len(engines) > 1 and len(requests) == plan.requests_per_engine * len(engines):
        problems += engine_shares(deltas, tuple(engines), plan.wave_requests * plan.tokens,
                                  b1_prompts(requests))[1] if deltas else [
            "no counters after the last wave nor per wave: each engine's share cannot be "
            "checked"]
    return problems


# The verdict.

class Verdict(Value):
    """A run judged: verdict (pass, custom, fail, refused, killed), exit code, problems,
    how the plan differs from the reviewed one, and the requests ok of each part."""
    verdict: str
    exit_code: int
    problems: tuple = ()
    differences: tuple = ()
    requests_ok: int = 0
    requests_total: int = 0
    parts: tuple = ()                     # ("contract", ok, total), ("paths stream", ok, total)
    structural: tuple = ()                # what the records lack to show the run they claim
    failed: tuple = ()                    # the identities of the records that fail
    notes: tuple = ()                     # what a pass means on this server (one_step_said)
    shape: "Shape | None" = None          # the --paths shape test's own verdict


class Shape(Value):
    """The --paths shape test's own verdict, apart from the waves' (never part of a pass):
    pass or fail, its requests ok of those planned, each path's count, its problems."""
    verdict: str
    requests_ok: int
    requests_total: int
    parts: tuple = ()                     # ("stream", ok, total) for each --paths name
    problems: tuple = ()

    def as_record(self) -> dict:
        """As a summary keeps it."""
        return {"verdict": self.verdict, "requests_ok": self.requests_ok,
                "requests_total": self.requests_total,
                "parts": [list(p) for p in self.parts], "problems": list(self.problems)}


def decide(run: dict | None, records: list[dict], ending: Ending,
           unread: list[str] = ()) -> Verdict:
    """The one verdict on a run from its run record, its records (held to their
    declarations; `unread`: those left out, each failing the run) and how its steps ended.
    Pure. A pass needs every planned request once, each passing its kind's rules judged
    again from its fields (never its own `ok`), and, for a warm-up, each wave guarded and
    recorded by the deadline, counters that show no foreign work or restart, and every
    engine its share. A pass of a plan other than the reviewed one is 'custom'."""
    run = run or CLASSES["run"]()         # none: every field None
    recorded = run.plan or SHAPED["plan"]()
    judged = [r for r in records if r.record == JUDGED.get(run.mode, "request")]
    structural = list(unread) + run_problems(run, judged)
    plan, differs = None, []
    if run.mode == "warmup":
        plan, why = read_plan(recorded)
        structural += why
        if plan is not None and plan.context is not None:
            structural += context_problems(plan, run.max_model_len, judged)
    failed, disagree = rejudge(run, plan, judged)
    structural += disagree
    engines = run.engines or []           # a negative index is named by run_problems()
    engines = engines if engines and min(engines) >= 0 else [None]
    planned = recorded.requests_total
    in_shape = shape_test(plan)
    waves_ran = sum(1 for r in judged if not in_shape(r))
    want = (plan.wave_requests * len(engines) if plan and plan.paths else planned)
    missing = [f"only {waves_ran} of {want} requests ran"] \
        if want is not None and waves_ran < want else []
    found = said_once([r for r in failed if not in_shape(r)])
    shape, parts = None, tuple(part_counts(plan, len(engines), judged, failed)) if plan else ()
    if plan is not None:
        skipped = recorded.engines_skipped or []
        differs = differences(plan, skipped)
        structural += coverage_problems(plan, engines, records, judged, planned)
        found += counter_problems(plan, engines, records, judged, recorded.foreign_work)
        several = len({e for e in [*engines, *skipped] if e is not None}) > 1
        waves = [r for r in records if not in_shape(r)]
        found += wave_problems(engines, waves, several, recorded.deadline_s, ending)
        if ending.verdict in ("pass", "custom"):      # a refusal or a kill stays itself
            found += unwarmed_engines(engines, skipped, records)
        if plan.paths:
            shape = shape_verdict(parts[1:], in_shape, judged, failed, wave_problems(
                engines, [r for r in records if in_shape(r)], several,
                recorded.deadline_s, ending))
    if parts:                 # the waves' part: the contract's, a plan file's, or custom
        parts = ((plan_label(plan) if not differs else "plan",) + tuple(parts[0][1:]),)
    ok = len(judged) - len(failed)
    base = dict(differences=tuple(differs), requests_ok=ok, shape=shape,
                notes=(one_step_said(plan),) if plan and plan.one_step else (),
                failed=tuple(identity(r) for r in failed),
                requests_total=planned if planned is not None else len(judged),
                parts=parts, structural=tuple(dict.fromkeys(structural)))
    problems = list(ending.problems) + found
    if ending.verdict == "killed" or ending.verdict == "refused" and not found + structural:
        return Verdict(ending.verdict, ending.exit_code,
                       tuple(dict.fromkeys(problems + missing)), **base)
    problems = list(dict.fromkeys(problems + structural + missing))
    if problems or ending.verdict not in ("pass", "custom"):
        code = ending.exit_code if ending.verdict == "fail" else EXIT_FAIL
        return Verdict("fail", code, tuple(problems), **base)
    code = EXIT_FAIL if shape is not None and shape.verdict != "pass" else EXIT_PASS
    return Verdict("custom" if differs else "pass", code, (), **base)


def shape_test(plan: Plan | None):
    """Whether a record belongs to the --paths shape test (its request and wave records,
    and the guard's reads before them: by their batch's name)."""
    names = {batch_name(k, d) for k, d in plan.batches()[len(plan.waves):]} if plan else ()
    return lambda record: record.record in ("request", "wave", "gauges") and record.wave in names


def wave_problems(engines: list, records: list[dict], several: bool, deadline,
                  ending: Ending) -> list[str]:
    """What the wave and guard records say of the waves they hold: guarded, none failed,
    none late."""
    failed = said_failed(records) if ending.verdict in ("pass", "custom") else []
    return unguarded_waves(engines, records, several) + failed + late_waves(deadline, records)


def shape_verdict(parts: tuple, in_shape, judged: list[dict], failed: list[dict],
                  waves: list[str]) -> Shape:
    """The shape test's own verdict from its paths' counts (part_counts'): every path's
    requests there and passing, its waves guarded, not failed, not late. Pure."""
    problems = said_once([r for r in failed if in_shape(r)]) + waves
    ran = sum(1 for r in judged if in_shape(r))
    total = sum(part[2] for part in parts)
    if ran < total:
        problems.append(f"only {ran} of its {total} requests ran")
    return Shape("fail" if problems else "pass", sum(part[1] for part in parts), total,
                 tuple((name.removeprefix("paths "), o, t) for name, o, t in parts),
                 tuple(dict.fromkeys(problems)))


def context_problems(plan: Plan, server_context, judged: list[dict]) -> list[str]:
    """The context B1 was sized in against the server's, and against B1's own size."""
    if plan.context != server_context:
        return [f"the run record's plan was sized in a context of {plan.context} tokens, "
                f"not the server's {show(server_context)}"]
    over = [label(r) for r in judged if r.request_kind == "long" and
            (r.prompt_tokens or 0) + plan.tokens > plan.context]
    return [f"{', '.join(over[:3])}: more prompt tokens than the context of {plan.context} "
            f"holds"] if over else []


def run_problems(run: dict, judged: list[dict]) -> list[str]:
    """The run record itself and its judged records' identities: a run record of a known
    mode and run id, every judged record of this run, each id once."""
    if not run:
        return ["no run record"]
    problems = []
    if run.mode not in MODES:
        problems.append(f"the run record's mode is {show(run['mode'])}, not warmup, "
                        f"probe or gate")
    foreign = [r for r in judged if r.run_id != run.run_id]
    if foreign:
        problems.append(f"{len(foreign)} request record(s) of no run or another run")
    ids = [identity(r) for r in judged]
    if len(set(ids)) != len(ids):
        problems.append(f"{len(ids) - len(set(ids))} request record(s) repeat another's id")
    planned = run.plan.requests_total
    if not planned:
        problems.append("the run record announces no number of requests")
    elif len(judged) > planned:
        problems.append(f"{len(judged)} request records, more than the {planned} planned")
    problems += engine_problems(run.engines, run.plan.requests_per_engine, judged)
    return problems


def identity(record: dict) -> str:
    """What tells one request record from another: its id."""
    return record.request_id


def engine_problems(engines: list[int] | None, per_engine: int | None,
                    judged: list[dict]) -> list[str]:
    """Each engine the run record names holds no more than its share of the records."""
    if engines is None:
        return []
    if not engines or min(engines) < 0:
        return ["the run record's engines are not a list of engine indexes"]
    if not per_engine:
        return ["the run record announces no number of requests per engine"]
    return [f"engine {engine}: {mine} request records, more than its {per_engine}"
            for engine in engines
            if (mine := sum(1 for r in judged if r.engine == engine)) > per_engine]


def coverage_problems(plan: Plan, engines: list, records: list[dict], judged: list[dict],
                      planned) -> list[str]:
    """A warm-up's records against its plan: every planned request once (its engine, wave,
    kind and index), nothing else, the plan's count the one announced, and once every
    request is there, each batch's wave record on every engine."""
    want = planned_requests(plan, engines)
    planned_set = set(want)
    problems = [] if planned == len(want) else [
        f"the run record announces {show(planned)} requests; its plan sends {len(want)}"]
    found = Counter(place(r) for r in judged)
    extra = [p for p in found if p not in planned_set]
    repeated = [p for p, n in found.items() if n > 1]
    if extra:
        problems.append(f"{len(extra)} request record(s) not in the plan (wave, kind or "
                        f"index): {', '.join(where(f) for f in extra[:5])}")
    if repeated:
        problems.append(f"{len(repeated)} planned request(s) recorded more than once: "
                        f"{', '.join(where(f) for f in repeated[:5])}")
    if len(judged) >= len(want):
        missing = [p for p in want if p not in found]
        if missing:
            problems.append(f"{len(missing)} planned request(s) have no record: "
                            f"{', '.join(where(f) for f in missing[:5])}")
        waves = Counter((r.engine, r.wave) for r in records if r.record == "wave")
        cold = [(e, batch_name(k, d)) for k, d in plan.batches() for e in engines
                if waves[(e, batch_name(k, d))] != 1]
        if cold:
            problems.append(f"{len(cold)} wave(s) without exactly one wave record: "
                            f"{', '.join(f'{show(w)} engine {show(e)}' for e, w in cold[:5])}")
    return problems


def unguarded_waves(engines: list, records: list[dict], several: bool) -> list[str]:
    """The guard judged again from the records (the patch note's first rule): before each
    wave, a gauges record of that wave whose samples hold both request gauges, each 0, for
    every engine; an engine without a sample counts only on a server of several engines
    that the record names fresh (idle by its counters). A wave without one is no part of a
    pass, whatever the record's own `ok` says. Pure."""
    reads, found = {}, []
    for record in records:
        if record.record == "gauges":
            reads[record.wave] = record
        elif record.record == "wave" and record.wave in reads:
            why = guard_read_problem(reads[record.wave], engines, several)
            found += [f"{record['wave']}: the guard read before it {why}"] if why else []
        elif record.record == "wave":
            found.append(f"{record['wave']}: no guard read before it in the records")
    return list(dict.fromkeys(found))          # one line a wave, not one an engine


def guard_read_problem(read: dict, engines: list, several: bool) -> str | None:
    """Why one gauges record shows no idle server (guard_problems' rule); None if it does."""
    fresh = {e for e in read.fresh_engines if type(e) is int} if several else set()
    for gauge in GAUGES:
        for engine in engines:
            values = [s.value for s in read.samples
                      if s.name == gauge and sample_engine(s) == (engine or 0)]
            if not values and engine not in fresh:
                return f"holds no {gauge} sample" + (f" for engine {engine}" if several else "")
            busy = [v for v in values if type(v) not in (int, float) or v != 0]
            if busy:
                return f"holds {gauge} = {show(busy[0], 20)}: the server was not idle"
    return None


def sample_engine(sample: dict) -> int | None:
    """The engine a recorded sample names (0 with no label); None for one no index names."""
    label = sample.labels.get("engine")
    return 0 if label is None else engine_index(label)


def said_failed(records: list[dict]) -> list[str]:
    """What the run's own records say went wrong, which no pass holds: a guard read that
    refused, a wave record that failed."""
    said = [f"the guard refused before {show(r['wave'])}, yet the run claims a pass"
            for r in records if r.record == "gauges" and not r.ok]
    for wave in (r for r in records if r.record == "wave" and not r.ok):
        engine = "" if wave.engine is None else f" engine {wave.engine}"
        said.append(f"{show(wave['wave'])}{engine}: its wave record says it failed")
    return said


def late_waves(deadline: float | None, records: list[dict]) -> list[str]:
    """Waves that ended after the run's recorded deadline."""
    if deadline is None:
        return []
    late = [show(wave.wave) for wave in records if wave.record == "wave"
            and not wave.started_at_s + wave.duration_s <= deadline]
    return [f"{', '.join(dict.fromkeys(late))} ended after the deadline ({deadline:g} s)"] \
        if late else []


def place(record: dict) -> tuple:
    """Where a request record stood: (engine, wave, request kind, index)."""
    return record.engine, record.wave, record.request_kind, record.index


def where(item: tuple) -> str:
    engine, wave, kind_, index = item
    return (f"{'' if engine is None else f'e{show(engine)} '}{show(wave)}#{show(index)} "
            f"({show(kind_)})")


def rejudge(run: dict, plan: Plan | None, judged: list[dict]) -> tuple[list[dict], list[str]]:
    """Every judged record judged again from its recorded fields, by kinds.judge() with the
    run's plan (never by its own `ok`): (the records that fail; a problem for each record
    whose `ok` says otherwise)."""
    if run.format != FORMAT:
        return judged, [f"the run record is of format {show(run.get('format'))}, not "
                        f"{FORMAT}: its requests cannot be judged again (run it again)"]
    failed, problems = [], []
    for record in judged:
        rules = judge_record(record, run, plan)
        if rules:
            failed.append(type(record)(record, problems=rules if record.ok
                                       else record.problems or rules))
        if rules and record.ok:
            problems.append(f"{label(record)}: the record says ok, but {rules[0]}")
        elif not rules and not record.ok:
            problems.append(f"{label(record)}: the record says not ok, but its fields pass")
    return failed, problems


def judge_record(record: dict, run: dict, plan: Plan | None) -> list[str]:
    """Why one record's answer fails its kind's rules ([] when it passes)."""
    kind_ = KINDS.get(record.request_kind)
    if kind_ is None:
        return ["a record without a known request kind"]
    recorded = run.plan
    if run.mode == "warmup":
        if plan is None:
            return ["the run record's plan cannot be read"]
        return judge(answer_of(record), kind_, plan.tokens, floor=plan.b1_minimum)
    tokens = recorded.max_tokens if run.mode == "gate" else recorded.tokens
    if not tokens:
        return ["the run record's plan holds no token count to judge it by"]
    rules = judge(answer_of(record), kind_, tokens)
    if run.mode == "gate" and not rules:
        said = copy_problem(record, recorded.max_cer or 0.0, recorded.max_typos or 0)
        rules = [said] if said else []
    return rules


def part_counts(plan: Plan, engines: int, judged: list[dict], failed: list[dict]):
    """('contract', ok, total) over the waves, then ('paths <name>', ok, total) for each
    --paths name, on every engine."""
    bad = {identity(r) for r in failed}
    groups = [("contract", None)] + [(f"paths {p}", p) for p in plan.paths]
    for name, path in groups:
        mine = [r for r in judged if kind_of(r).path == path]
        total = (plan.wave_requests if path is None else
                 sum(plan.path_depths) * len(kinds_of((path,)))) * engines
        yield name, sum(1 for r in mine if identity(r) not in bad), total


def kind_of(record: dict) -> Kind:
    """A record's request kind (the contract's, when it names none that is known)."""
    return KINDS.get(record.request_kind, KINDS["long"])


def said_once(failed: list[dict]) -> list[str]:
    """One problem a diagnosis: requests that failed the same way share one line with a
    count ('10 requests (B1#0, B2#0, B2#1, ...): one-token response ...'); a request that
    failed its own way keeps its label ('B2#1: HTTP 500')."""
    groups: dict[str, list[str]] = {}
    for record in failed:
        diagnosis = "; ".join(record.problems) or "not ok"
        groups.setdefault(diagnosis, []).append(label(record))
    said = []
    for diagnosis, labels in groups.items():
        if len(labels) == 1:
            said.append(f"{labels[0]}: {diagnosis}")
        else:
            shown = ", ".join(labels[:3]) + (", ..." if len(labels) > 3 else "")
            said.append(f"{len(labels)} requests ({shown}): {diagnosis}")
    return said


NOT_REPORTED = ("cache check not made: the server does not report cached tokens; start it "
                "with --enable-prompt-tokens-details to check")


def cache_check(requests: list[dict]) -> str:
    """B1's cache check as a code: 'made' (every B1 reported cached tokens, none cached),
    'hit' (a B1 was served from the prefix cache), 'not_made' (not reported, or no B1
    answered)."""
    b1 = [r for r in requests if r.request_kind == "long" and r.http_status == 200]
    if any(r.cached_tokens for r in b1):
        return "hit"
    return "made" if b1 and all(r.cached_tokens is not None for r in b1) else "not_made"

