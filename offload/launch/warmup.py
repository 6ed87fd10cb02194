#!/usr/bin/env python3
"""Warm up a freshly started vLLM server, and leave records of what the warm-up did.

The first requests a new server sees pay one-time costs (a long chunked prefill,
decode and speculative draft/verify at client concurrency 1-4, lazily compiled
kernels). This helper pays them on purpose, in waves B1..B4, inside hard time bounds,
and writes JSON Lines records that an operator reads before releasing producers.

The run, in order (each step is a function right below):

  main()              options -> Settings and a Plan (--dry-run prints the plan)
  run_session()       records open, signals handled, exactly one summary, exit code
    warm_up()         the warm-up's steps:
      learn_server()    model, context length, engines, B1 sized with /tokenize
      warm_waves()      for each wave: guarded_batch() (guard -> slots -> release ->
                        collect), then request_record() judges each response
      read_after()      counter deltas and status files over the warm-up
    summarize()       judge_run() -> the summary record and the verdict line

Then the sections in that order: the plan, the guard, counters, HTTP, one batch, the
judge, the records. Standard library only: copy this one file onto a host and run it
with python3 3.10+. The contract is CONTRACT.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

__version__ = "1.1.0"

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INTERRUPTED = 130              # SIGINT (Ctrl-C): 128 + 2
EXIT_TERMINATED = 143               # SIGTERM: 128 + 15
EXIT_HARD_BOUND = 124               # TERM from warmup_serve.sh's hard bound (timeout's status)
# Every terminating signal the helper catches ends in one 'killed' summary, 128 + signum.
CAUGHT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_WAVES = (1, 2, 3, 4)
MAX_WAVE_DEPTH = 64
MIN_B1_PROMPT_TOKENS = 4097          # B1 must prefill more than 4096 tokens
MAX_B1_TOKENS = 1 << 20              # the largest B1 asked for; the context caps it further
MAX_SECONDS = 3600.0                 # no wait, deadline or bound is longer than an hour
MAX_BODY_BYTES = 4 << 20             # no answer we read is larger; a bigger one is an error
MAX_HEADER_BYTES = 64 << 10
MAX_JSON_DEPTH = 64                  # deeper JSON from a server is an error, not a crash
ERROR_TEXT_LIMIT = 300               # a server's message, cut
PROBLEM_LIMIT = 300                  # one problem string, cut
STOP_REASON_LIMIT = 64
METRICS_RETRY_PAUSE_S = 0.25
SETTLE_POLL_S = 0.1
AFTER_READS_MIN_LEFT_S = 1.0         # the reads after the last wave must not make a run late
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
ENGINE_HEADER = "X-data-parallel-rank"
REQUEST_METRIC_FIELDS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms",
                         "mean_itl_ms", "tokens_per_second")


class UsageError(Exception):
    """A bad option or configuration: exit 2, nothing sent."""


class Fatal(Exception):
    """A problem that ends the run before (or between) waves, with its exit code."""

    def __init__(self, problem: str, exit_code: int = EXIT_FAIL):
        super().__init__(problem)
        self.problem = problem
        self.exit_code = exit_code


class RecordsError(Exception):
    """The records file cannot be written: the run cannot leave evidence, so it stops."""


class Terminated(BaseException):
    """Raised in the main thread by the handler of a terminating signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# ---------------------------------------------------------------------------
# The run: settings in, one summary out.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """What the command line asked for; fixed for the whole run."""
    plan: Plan
    target: Target
    api_key: str | None
    api_key_env: str
    model: str | None                     # the model asked for; None: the only one served
    records_path: str
    engines: str = "auto"                 # "auto" or a list such as "0,2"
    settle_s: float = 2.0
    metrics_targets: tuple = ()           # more Prometheus endpoints (Targets)
    status_files: tuple = ()
    status_wait_s: float = 15.0
    json: bool = False
    debug: bool = False
    mode: str = "warmup"                  # the run record's mode: warmup, probe, gate
    plan_record: dict | None = None       # the plan as recorded, when not the waves'
    planned: int | None = None            # requests planned, when not the waves'
    prog: str = "warmup.py"
    after_summary: object = None          # (run, summary) -> a record written right after it,
                                          # printed instead of the summary with --json


@dataclass
class Server:
    """What the run learned from the server before the first wave."""
    model: str | None = None
    max_model_len: int | None = None
    version: str | None = None
    engines: tuple[int, ...] | None = None   # None: one engine, no routing header
    b1_prompts: dict = field(default_factory=dict)   # engine -> B1 prompt (text never recorded)
    b1_counted: int | None = None                    # the smallest B1 counted (None: estimated)
    b1_counts: dict = field(default_factory=dict)    # engine -> its B1's counted tokens


@dataclass
class Outcome:
    """What the run has collected so far; only the main thread touches it."""
    requests: list = field(default_factory=list)     # request (or probe) records
    problems: list = field(default_factory=list)
    refusal: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    current: str | None = None                       # the wave (or round) in flight
    counters_before: dict = field(default_factory=dict)   # source -> (counters or None, why)
    status_before: dict = field(default_factory=dict)     # path -> (document or None, why)
    counter_highlights: dict | None = None
    settled_s: list = field(default_factory=list)    # how long each settled guard waited
    run_written: bool = False
    summary_extra: dict = field(default_factory=dict)
    final_record: dict | None = None                 # what --json prints


@dataclass
class Run:
    """One run: its settings, what it learned, what it collected, its clock and outputs."""
    settings: Settings
    clock: Clock
    sink: object                          # the records file, opened for appending
    say: object                           # one human line -> the terminal (never blocks)
    server: Server = field(default_factory=Server)
    outcome: Outcome = field(default_factory=Outcome)

    @property
    def redact(self) -> tuple[str, ...]:
        """Exact strings no output may hold: the key, URL credentials, our prompts' nonces."""
        found = [self.settings.api_key, self.settings.target.credentials]
        found += [prompt.split(" ", 1)[0] for prompt in self.server.b1_prompts.values()]
        return tuple(s for s in found if s)

    def write(self, record: dict) -> None:
        try:
            append_record(self.sink, record)
        except (OSError, ValueError) as exc:
            raise RecordsError(f"cannot write records to {self.settings.records_path}: "
                               f"{getattr(exc, 'strerror', None) or exc}")


def main(argv: list[str] | None = None, prog: str = "warmup.py") -> int:
    """The warm-up's command line; returns the exit status."""
    if argv is None:
        _as_program.set()
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, prog)
    except SystemExit as exc:             # argparse: --help, --version, a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if settings is None:
        return EXIT_PASS
    return run_session(settings, warm_up)


def warm_up(run: Run) -> None:
    """Everything the warm-up sends, in order; Fatal ends it early."""
    learn_server(run, size_b1=True)
    write_run_record(run)
    run.say(start_line(run))
    read_before(run)
    warm_waves(run)
    if run.outcome.requests:
        read_after(run)


def learn_server(run: Run, size_b1: bool) -> None:
    """The model and its context (/v1/models), the version, the engines, B1's prompt."""
    resolve_model(run)
    read_server_version(run)
    run.server.engines = choose_engines(run)
    if size_b1:
        size_b1_prompts(run)


def warm_waves(run: Run) -> None:
    """Guard, then wave, in order; stops at a refusal or at the deadline."""
    waves = run.settings.plan.waves
    for position, depth in enumerate(waves):
        if run.clock.remaining() <= 0:
            rest = ",".join(wave_name(d) for d in waves[position:])
            run.outcome.problems.append(f"deadline passed before {wave_name(depth)}: waves "
                                        f"{rest} not run")
            return
        if not warm_wave(run, depth, first=(position == 0)):
            return


def warm_wave(run: Run, depth: int, first: bool) -> bool:
    """One wave on every engine at once; False when the guard refused it."""
    name = wave_name(depth)
    slots = wave_slots(run, depth, first)
    started = run.clock.elapsed()
    finished = guarded_batch(run, name, slots, first=first)
    if finished is None:
        return False
    duration = run.clock.elapsed() - started
    wave_requests = [request_record(run, depth, slot, first) for slot in finished]
    for record in wave_requests:
        run.write(record)
    run.outcome.requests += wave_requests
    for engine in engines_of(run):
        mine = [r for r in wave_requests if r["engine"] == engine]
        skew = release_skew_ms([s for s in finished if s.engine == engine])
        problems = judge_wave(mine, depth, engine)
        run.write({"record": "wave", "run_id": run.settings.plan.run_id, "wave": name,
                   "depth": depth, "engine": engine,
                   "release_skew_ms": skew, "batch_release_skew_ms": release_skew_ms(finished),
                   "duration_s": round(duration, 4), "started_at_s": round(started, 4),
                   "ok": not problems, "requests_ok": sum(r["ok"] for r in mine),
                   "problems": problems})
        run.say(wave_line(name, engine, mine, skew, duration, first))
    if first and wave_requests and wave_requests[0]["http_status"] == 200 \
            and wave_requests[0]["cached_tokens"] is None:
        run.outcome.notes.append("B1 cache check not made: the server does not report cached "
                                 "tokens (start it with --enable-prompt-tokens-details to check)")
    return True


def guarded_batch(run: Run, label: str, slots: list[Slot], first: bool) -> list[Slot] | None:
    """The step every wave and probe round shares: guard, release the slots together, collect.

    None when the guard refused (nothing was sent). After one of our own batches a busy
    gauge may be ours not yet counted out, so it is read again for --settle-s.
    """
    if not check_guard(run, label, settle=not first):
        return None
    run.outcome.current = label
    finished = release_batch(run.settings.target, run.clock, slots)
    run.outcome.current = None
    return finished


def run_session(settings: Settings, steps) -> int:
    """Open the records, run `steps(run)` under the signal handlers, write one summary.

    Whatever goes wrong inside, the run ends with a summary record and the contract's
    exit code; an unexpected exception is a 'fail' with its reason in one line.
    """
    path = settings.records_path
    try:
        sink = open_records(path)
    except OSError as exc:
        emit(f"{settings.prog}: cannot write records to {path}: {exc.strerror or exc}; "
             f"choose a writable regular file with --records PATH or WARMUP_RECORDS_DIR",
             sys.stderr)
        return EXIT_USAGE
    printer = Printer(sys.stderr if settings.json else sys.stdout)
    run = Run(settings, Clock.start(settings.plan.deadline_s, settings.plan.socket_cap_s),
              sink, printer.say)
    previous, summary = {}, None
    try:
        previous = install_signal_handlers()
        summary = conclude(run, steps)
    except RecordsError as exc:
        printer.say(f"{settings.prog}: {exc}; the run stopped (exit {EXIT_USAGE})",
                    stream=sys.stderr)
    finally:
        _terminating.set()           # from here on a signal changes nothing: ignore it
        restore_signal_handlers(previous)
        try:
            sink.close()
        except OSError:
            pass
    if summary is not None:
        printer.say(verdict_line(summary, path))
        if settings.json:
            printer.say(json.dumps(run.outcome.final_record or summary), stream=sys.stdout)
    if not printer.close(max(min(run.clock.remaining(), 1.0), 0.2)):
        _stuck_output.set()          # the terminal stopped reading: exit without waiting on it
    return summary["exit_code"] if summary is not None else EXIT_USAGE


def conclude(run: Run, steps) -> dict:
    """Run the steps; turn how they ended (normally, Fatal, a signal, a bug) into a summary."""
    try:
        steps(run)
        return summarize(run)
    except Fatal as exc:
        problem = [clean_text(exc.problem, 500, run.redact)]
        if exc.exit_code == EXIT_FAIL:
            return summarize(run, extra=problem)
        return summarize(run, "fail", exc.exit_code, problem)   # configuration: exit 2
    except Terminated as exc:
        if exc.signum == signal.SIGTERM and hard_bound_reached():
            return summarize(run, "killed", EXIT_HARD_BOUND, [
                f"ended by warmup_serve.sh's hard bound (TERM at "
                f"{os.environ.get('WARMUP_HARD_S', '?')} s){killed_where(run)}"])
        return summarize(run, "killed", 128 + exc.signum, [killed_problem(run, exc.signum)])
    except RecordsError:
        raise
    except Exception as exc:             # a defect or an input nobody planned for
        if run.settings.debug:
            import traceback
            traceback.print_exc()
        where = f" during {run.outcome.current}" if run.outcome.current else ""
        return summarize(run, "fail", EXIT_FAIL, [
            f"internal error{where}: {type(exc).__name__}: "
            f"{clean_text(str(exc), 200, run.redact)} (run with --debug for the traceback)"])


def killed_where(run: Run) -> str:
    return f" during {run.outcome.current}" if run.outcome.current else ""


def killed_problem(run: Run, signum: int) -> str:
    return f"terminated by {signal.Signals(signum).name}{killed_where(run)}"


def hard_bound_reached() -> bool:
    """True when warmup_serve.sh said when its hard bound falls (WARMUP_HARD_BOUND_AT, epoch
    seconds) and that moment has come: the TERM is the bound's, so the run ends with the
    wrapper's 124, not 143."""
    try:
        return time.time() >= float(os.environ["WARMUP_HARD_BOUND_AT"]) - 0.5
    except (KeyError, ValueError):
        return False


def summarize(run: Run, verdict: str | None = None, exit_code: int | None = None,
              extra: list[str] = ()) -> dict:
    """Write the summary record from what the run has; returns it."""
    _terminating.set()               # one summary: a signal from now on is ignored
    elapsed = run.clock.elapsed()
    outcome, planned = run.outcome, requests_planned(run)
    if verdict is None:
        verdict, exit_code, problems = judge_run(
            requests=outcome.requests, planned=planned, problems=outcome.problems + list(extra),
            refusal=outcome.refusal, elapsed_s=elapsed, deadline_s=run.settings.plan.deadline_s)
    else:
        problems = outcome.problems + outcome.refusal + list(extra)
    write_run_record(run)
    summary = {
        "record": "summary", "run_id": run.settings.plan.run_id, "verdict": verdict,
        "exit_code": exit_code, "requests_ok": sum(r["ok"] for r in outcome.requests),
        "requests_total": planned, "requests_ran": len(outcome.requests),
        "elapsed_s": round(elapsed, 4), "deadline_s": run.settings.plan.deadline_s,
        "problems": [clean_text(p, PROBLEM_LIMIT) for p in problems],
        "notes": outcome.notes, "warnings": outcome.warnings,
        "records": clean_text(run.settings.records_path, 500),
        "settled_s": outcome.settled_s,
        "counters": outcome.counter_highlights, **outcome.summary_extra,
    }
    run.write(summary)
    outcome.final_record = summary
    if run.settings.after_summary is not None:
        follow = run.settings.after_summary(run, summary)
        if follow is not None:
            run.write(follow)
            outcome.final_record = follow
    return summary


def requests_planned(run: Run) -> int:
    if run.settings.planned is not None:
        return run.settings.planned
    return run.settings.plan.requests_total * len(engines_of(run))


# ---------------------------------------------------------------------------
# The plan: waves, prompts and bounds, as plain data.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    run_id: str
    waves: tuple[int, ...]
    tokens: int
    priority: int
    b1_tokens: int
    deadline_s: float
    socket_cap_s: float

    @property
    def requests_total(self) -> int:
        """Requests per engine."""
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


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(3).hex()


def request_id(run_id: str, depth: int, index: int, engine: int | None = None) -> str:
    """warmup-<run>-B2-1; with several engines warmup-<run>-e1-B2-1."""
    where = "" if engine is None else f"e{engine}-"
    return f"warmup-{run_id}-{where}{wave_name(depth)}-{index}"


# Common short English words: about one token each in the usual BPE vocabularies, so
# an unsized prompt of N words is N to 1.5 N tokens.
FILLER_WORDS = (
    "the of and to in is was for on are with as by at from or an be this which have "
    "time year people way day man thing woman life child world school state family "
    "group country problem hand part place case week company system program question "
    "work government number night point home water room mother area money story fact "
    "month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education river market signal garden "
    "engine table window paper stone music north south summer winter yellow orange "
    "simple quiet rapid gentle mountain station letter silver forest island bridge"
).split()
EST_WORDS_PER_TOKEN = 1.0     # sizing without /tokenize: one word per token, never fewer tokens
SHORT_PROMPT_WORDS = 24


def make_long_prompt(nonce: str, n_words: int) -> str:
    """B1's prompt: the nonce first (so no cached prefix matches), then filler words."""
    rng = random.Random(nonce)
    return nonce + " " + " ".join(rng.choice(FILLER_WORDS) for _ in range(n_words))


def make_short_prompt(seed: str, depth: int, index: int) -> str:
    """A distinct prompt of a few tens of tokens; its first word differs per request."""
    rng = random.Random(f"{seed}/{depth}/{index}")
    tag = f"{rng.getrandbits(48):012x}"
    return tag + " " + " ".join(rng.choice(FILLER_WORDS) for _ in range(SHORT_PROMPT_WORDS))


def completion_body(model: str, prompt: str, rid: str, plan: Plan) -> dict:
    """The exact sampling fields of one warm-up request: greedy, min = max, EOS ignored."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": plan.tokens,
        "min_tokens": plan.tokens,
        "ignore_eos": True,
        "temperature": 0,
        "priority": plan.priority,
        "stream": False,
        "request_id": rid,
    }


def b1_budget(b1_tokens: int, tokens: int, max_model_len: int | None) -> int:
    """How many prompt tokens B1 may have; Fatal when the context cannot hold >4096 + tokens."""
    if max_model_len is None:
        return b1_tokens
    room = max_model_len - tokens
    if room < MIN_B1_PROMPT_TOKENS:
        raise Fatal(f"context too small: max_model_len {max_model_len} leaves room for "
                    f"{max(room, 0)} prompt tokens beside {tokens} completion tokens, but B1 "
                    f"needs more than {MIN_B1_PROMPT_TOKENS - 1}; no completion was sent")
    return min(b1_tokens, room)


SIZING_ROUNDS = 6


def size_long_prompt(count, nonce: str, budget: int) -> tuple[str, int | None]:
    """Size B1 to `budget` tokens with `count(prompt) -> int | None` (the server's /tokenize).

    Returns the prompt and its counted size, or an estimated prompt and None when the
    server cannot count. Never returns a counted prompt above the budget; the word count
    stays within [budget / 8, 2 * budget] whatever the server answers, and a count that
    is not a positive integer is not believed.
    """
    low_words, high_words = max(1, budget // 8), 2 * budget
    n_words = max(1, math.ceil(budget * EST_WORDS_PER_TOKEN))
    low = max(MIN_B1_PROMPT_TOKENS, int(budget * 0.97))
    best = None
    for _ in range(SIZING_ROUNDS):
        prompt = make_long_prompt(nonce, n_words)
        counted = count(prompt)
        if counted is None:
            return prompt, None
        if not isinstance(counted, int) or counted < 1:
            raise Fatal(f"could not size the B1 prompt: /tokenize answered count "
                        f"{clean_text(repr(counted), 40)}; no completion was sent")
        if counted <= budget:
            best = (prompt, counted)
            if counted >= low:
                return best
        # Tokens grow about linearly in words: aim just under the budget.
        n_words = min(high_words, max(low_words, int(n_words * (budget - 8) / counted)))
    if best is not None and best[1] >= MIN_B1_PROMPT_TOKENS:
        return best
    raise Fatal(f"could not size the B1 prompt between {MIN_B1_PROMPT_TOKENS} and {budget} "
                f"tokens with the server's /tokenize; no completion was sent")


def plan_description(plan: Plan) -> dict:
    """The plan as recorded and as printed by --dry-run (sizes only, never prompt text)."""
    return {
        "waves": [{"wave": wave_name(d), "depth": d,
                   "prompt": "long" if i == 0 else "short"} for i, d in enumerate(plan.waves)],
        "requests_total": plan.requests_total,
        "completion_tokens_max": plan.requests_total * plan.tokens,
        "tokens": plan.tokens,
        "priority": plan.priority,
        "b1_target_tokens": plan.b1_tokens,
        "b1_min_prompt_tokens": MIN_B1_PROMPT_TOKENS,
        "short_prompt_words": SHORT_PROMPT_WORDS + 1,
        "deadline_s": plan.deadline_s,
        "socket_cap_s": plan.socket_cap_s,
        "max_body_bytes": MAX_BODY_BYTES,
    }


# ---------------------------------------------------------------------------
# Learning the server: model, version, engines, B1's prompt.
# ---------------------------------------------------------------------------

def resolve_model(run: Run) -> None:
    """Find the model (and its max_model_len) in GET /v1/models."""
    wanted, display = run.settings.model, run.settings.target.display
    status, doc = lookup(run, "GET", "/v1/models")
    if status == 401:
        raise Fatal(diagnose_http_error(401, None, None, run.settings.api_key_env,
                                        bool(run.settings.api_key)))
    entries = doc.get("data") if status == 200 and isinstance(doc, dict) else None
    if not isinstance(entries, list):
        if wanted:
            run.server.model = wanted
            return
        raise Fatal(f"cannot find the model: GET {display}/v1/models answered HTTP {status} "
                    f"without a model list (is --base-url the server's address, with no extra "
                    f"path?); pass --model or set WARMUP_MODEL", EXIT_USAGE)
    served = {e["id"]: e for e in entries
              if isinstance(e, dict) and isinstance(e.get("id"), str) and e["id"]}
    names = ", ".join(clean_text(n, 80) for n in sorted(served)[:10])
    if wanted and wanted not in served:
        raise Fatal(f"model {clean_text(wanted, 80)!r} is not served at {display}; "
                    f"served: {names or 'none'}", EXIT_USAGE)
    if not wanted and len(served) != 1:
        raise Fatal(f"the server serves {len(served)} models ({names or 'none with an id'}); "
                    f"choose one with --model", EXIT_USAGE)
    run.server.model = wanted or next(iter(served))
    run.server.max_model_len = positive_int(served[run.server.model].get("max_model_len"))


def lookup(run: Run, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    """(status, parsed JSON or None) of one small request before the waves; Fatal on transport."""
    try:
        response = fetch(run.settings.target, run.clock, method, path, body,
                         run.settings.api_key)
    except TransportError as exc:
        raise Fatal(exc.problem if exc.kind == "connect" else f"{method} {path}: {exc.problem}")
    doc, _ = decode_json(response.body)
    return response.status, doc


def read_server_version(run: Run) -> None:
    try:
        status, doc = lookup(run, "GET", "/version")
    except Fatal:
        return
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("version"), str):
        run.server.version = clean_text(doc["version"], 64)


def choose_engines(run: Run) -> tuple[int, ...] | None:
    """The engines to warm: every engine /metrics shows (auto) or the ones asked for.

    None means one engine and no routing header: exactly the single-engine warm-up.
    """
    wanted = run.settings.engines
    if wanted == "auto":
        served = read_engines(run)
        return served if served and len(served) > 1 else None
    asked = parse_engines(wanted)
    served = read_engines(run)
    missing = [e for e in asked if e not in (served or (0,))]
    if missing:
        raise Fatal(f"--engines {wanted}: engine {','.join(map(str, missing))} is not served "
                    f"at {run.settings.target.display} (its /metrics shows engines "
                    f"{','.join(map(str, served or ())) or 'none'})", EXIT_USAGE)
    return asked


def read_engines(run: Run) -> tuple[int, ...] | None:
    """Engine indexes in the `engine` label of vllm:* series; None when there is none."""
    samples, _ = read_samples(run, run.settings.target, "/metrics")
    return engines_in(samples or []) or None


def size_b1_prompts(run: Run) -> None:
    """One B1 prompt per engine, each with its own nonce, sized with the server's /tokenize."""
    plan, server = run.settings.plan, run.server
    budget = b1_budget(plan.b1_tokens, plan.tokens, server.max_model_len)

    def count(prompt: str) -> int | None:
        status, doc = lookup(run, "POST", "/tokenize", {"model": server.model, "prompt": prompt})
        if status != 200:
            return None                   # no /tokenize here: estimate
        if not isinstance(doc, dict) or not isinstance(doc.get("count"), int) \
                or isinstance(doc.get("count"), bool):
            raise Fatal("could not size the B1 prompt: /tokenize answered without an integer "
                        "count; no completion was sent")
        if server.max_model_len is None:
            server.max_model_len = positive_int(doc.get("max_model_len"))
        return doc["count"]           # only the count: the ids are dropped with `doc`

    counts = []
    for engine in engines_of(run):
        nonce = "warmup-" + os.urandom(12).hex()
        prompt, counted = size_long_prompt(count, nonce, budget)
        tighter = b1_budget(plan.b1_tokens, plan.tokens, server.max_model_len)
        if tighter < budget:          # /tokenize told a smaller context than /v1/models did
            budget = tighter
            prompt, counted = size_long_prompt(count, nonce, budget)
        server.b1_prompts[engine] = prompt
        counts.append(counted)
        if counted is not None and engine is not None:
            server.b1_counts[str(engine)] = counted
    server.b1_counted = None if None in counts else min(counts)


def engines_of(run: Run) -> tuple:
    """The engines a batch covers: (None,) for one engine without routing."""
    return run.server.engines or (None,)


def wave_slots(run: Run, depth: int, first: bool) -> list[Slot]:
    """The wave's requests on every engine, encoded before any client connects."""
    plan, server = run.settings.plan, run.server
    slots = []
    for engine in engines_of(run):
        for index in range(depth):
            rid = request_id(plan.run_id, depth, index, engine)
            prompt = server.b1_prompts[engine] if first else \
                make_short_prompt(f"{plan.run_id}/{engine}", depth, index)
            slots.append(make_slot(run, index, rid, engine,
                                   completion_body(server.model, prompt, rid, plan)))
    return slots


def make_slot(run: Run, index: int, rid: str, engine: int | None, body: dict,
              stream: bool = False, path: str = "/v1/completions") -> Slot:
    """One request, encoded now: the routing header only when engines are routed."""
    headers = {} if engine is None else {ENGINE_HEADER: str(engine)}
    payload = encode_request(run.settings.target, "POST", path, body, run.settings.api_key,
                             headers)
    return Slot(index, rid, payload, engine=engine, stream=stream)


def write_run_record(run: Run) -> None:
    """The run record, once: plan, model, versions (never prompt text or the key)."""
    outcome, server, settings = run.outcome, run.server, run.settings
    if outcome.run_written:
        return
    outcome.run_written = True
    plan = dict(settings.plan_record or plan_description(settings.plan))
    plan["requests_per_engine"] = plan.get("requests_total")
    plan["requests_total"] = requests_planned(run)
    plan["b1_prompt_tokens_counted"] = server.b1_counted
    plan["b1_prompt_tokens_by_engine"] = server.b1_counts or None
    plan["b1_sizing"] = "tokenize" if server.b1_counted is not None else "estimate"
    run.write({
        "record": "run", "run_id": settings.plan.run_id, "mode": settings.mode,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "base_url": settings.target.display,
        "model": clean_text(server.model, 200, run.redact) if server.model else None,
        "max_model_len": server.max_model_len, "engines": list(server.engines or []) or None,
        "plan": plan,
        "versions": {"helper": __version__, "python": sys.version.split()[0],
                     "server": server.version},
        "api_key_env": settings.api_key_env, "api_key_set": bool(settings.api_key),
        "pid": os.getpid(),
    })


# ---------------------------------------------------------------------------
# The guard: parse Prometheus text exactly, decide whether the server is idle, fail closed.
# ---------------------------------------------------------------------------

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_VALUE = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf|inf|NaN|nan)")
_TIMESTAMP = re.compile(r"-?[0-9]{1,19}")
# Characters no sample line of ours may hold raw: they split or hide lines for some readers.
_LINE_BREAKERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029\ufeff]")
_NAMES_A_GAUGE = re.compile(r"vllm:num_requests_(?:running|waiting)(?![a-zA-Z0-9_:])")


@dataclass
class Exposition:
    """One /metrics body: the samples read, and every line that could not be read exactly."""
    samples: list                     # (name, labels, value)
    bad_lines: list                   # (line number, why, line)
    declared: set                     # metric names with a # TYPE line


def parse_prometheus(text: str) -> Exposition:
    """Prometheus text format 0.0.4, line by line (split on LF only, as the format says)."""
    samples, bad, declared = [], [], set()
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t")
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "TYPE":
                declared.add(parts[2])
            continue
        try:
            if _LINE_BREAKERS.search(line):
                raise ValueError("a control character, BOM or line separator in the line")
            samples.append(_parse_sample(line))
        except (ValueError, IndexError) as exc:
            why = str(exc) if isinstance(exc, ValueError) and str(exc) else "not a sample line"
            bad.append((number, why, raw))
    return Exposition(samples, bad, declared)


def _parse_sample(line: str) -> tuple[str, dict, float]:
    match = _METRIC_NAME.match(line)
    if not match:
        raise ValueError("no metric name")
    name, pos, labels = match.group(), match.end(), {}
    after = line[pos:].lstrip(" \t")
    if after.startswith("{"):            # Prometheus allows blanks between name and labels
        pos = len(line) - len(after)
    if pos < len(line) and line[pos] == "{":
        labels, pos = _parse_labels(line, pos + 1)
    if pos < len(line) and line[pos] not in " \t":
        raise ValueError("unexpected character after the name or labels")
    rest = line[pos:].split()
    if len(rest) not in (1, 2):          # value, then an optional timestamp
        raise ValueError("expected a value and at most an integer timestamp")
    if not _VALUE.fullmatch(rest[0]):
        raise ValueError(f"value {rest[0][:20]!r} is not a number")
    if len(rest) == 2 and not _TIMESTAMP.fullmatch(rest[1]):
        raise ValueError(f"timestamp {rest[1][:20]!r} is not an integer")
    return name, labels, float(rest[0])


def _parse_labels(line: str, pos: int) -> tuple[dict, int]:
    labels = {}
    while True:
        while line[pos] in " \t":
            pos += 1
        if line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match:
            raise ValueError("bad label name")
        key, pos = match.group(), match.end()
        while line[pos] in " \t":
            pos += 1
        if line[pos] != "=" or line[pos + 1] != '"':
            raise ValueError("bad label")
        pos, chars = pos + 2, []
        while line[pos] != '"':
            if line[pos] == "\\":
                pos += 1
                chars.append(_LABEL_ESCAPES.get(line[pos], "\\" + line[pos]))
            else:
                chars.append(line[pos])
            pos += 1
        if key in labels:
            raise ValueError(f"label {key} twice")
        labels[key] = "".join(chars)
        pos += 1
        while line[pos] in " \t":
            pos += 1
        if line[pos] == ",":
            pos += 1
        elif line[pos] != "}":
            raise ValueError("bad label list")


def format_sample(name: str, labels: dict, value: float) -> str:
    return f"{series_key(name, labels)} = {value!r}"


def engines_in(samples: list) -> tuple[int, ...]:
    """Sorted engine indexes named by the `engine` label of vllm:* series."""
    found = set()
    for name, labels, _ in samples:
        engine = labels.get("engine")
        if name.startswith("vllm:") and engine is not None and re.fullmatch(r"[0-9]{1,4}", engine):
            found.add(int(engine))
    return tuple(sorted(found))


FRESH_COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total",
                  "vllm:generation_tokens_total")


def guard_problems(exposition: Exposition, engines: tuple | None = None
                   ) -> tuple[list[str], list[int]]:
    """Both request gauges must be declared or sampled, and every sample of each must be 0.

    Fails closed: a line that names a gauge but cannot be read exactly refuses. With
    engines, each engine must have a 0 sample of each gauge, or (a fresh data-parallel
    server publishes none until an engine has run a request) no sample while the family
    is declared and that engine's own counters show it never ran one. Returns the problems
    and the engines judged idle that way.
    """
    problems, fresh = [], []
    for number, why, raw in exposition.bad_lines:
        if _NAMES_A_GAUGE.search(raw):
            problems.append(f"/metrics line {number} names a request gauge but cannot be read "
                            f"exactly ({why}): {clean_text(raw, 120)!r}")
    for gauge in GAUGES:
        series = [(labels, value) for name, labels, value in exposition.samples if name == gauge]
        for labels, value in series:
            if value != 0:
                problems.append(f"{format_sample(gauge, labels, value)}: the server is not idle")
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
        if not engines and not series and not engine_never_ran(exposition.samples, None):
            problems.append(f"{gauge} is declared but has no sample, and the server has run "
                            f"requests: the guard cannot see its work")
    return problems, fresh


def engine_never_ran(samples: list, engine: int | None) -> bool:
    """True when the engine's (or, with None, the server's) request counters are all 0."""
    for name, labels, value in samples:
        if name in FRESH_COUNTERS and (engine is None or labels.get("engine") == str(engine)):
            if value != 0:
                return False
    return True


@dataclass
class GuardRead:
    """One guard read: what /metrics said, and the decision."""
    ok: bool
    problems: list
    samples: list
    counters: dict | None
    fresh: list = field(default_factory=list)     # engines judged idle by their counters


def check_guard(run: Run, label: str, settle: bool) -> bool:
    """Read /metrics before a batch and record the gauges; False = refused.

    With `settle`, a busy gauge right after our own batch is read again for up to
    --settle-s (within the deadline) before it counts as foreign work.
    """
    started = run.clock.elapsed()
    read = read_guard(run, label)
    limit = started + run.settings.settle_s
    waited = False
    while settle and not read.ok and only_busy(read.problems) \
            and run.clock.elapsed() + SETTLE_POLL_S <= limit \
            and run.clock.remaining() > SETTLE_POLL_S:
        time.sleep(SETTLE_POLL_S)
        waited = True
        read = read_guard(run, label)
    settle_s = round(run.clock.elapsed() - started, 4) if waited else None
    source = metrics_source(run.settings.target, "/metrics")
    if read.counters is not None and source not in run.outcome.counters_before:
        run.outcome.counters_before[source] = (read.counters, None)   # before the first wave
    if waited and read.ok:
        run.outcome.settled_s.append(settle_s)
    run.write({
        "record": "gauges", "run_id": run.settings.plan.run_id, "wave": label,
        "at_s": round(run.clock.elapsed(), 4), "ok": read.ok,
        "samples": [{"name": n, "labels": {k: clean_text(v, 200) for k, v in lab.items()},
                     "value": json_number(v)} for n, lab, v in read.samples if n in GAUGES],
        "fresh_engines": read.fresh, "settle_s": settle_s, "problems": read.problems,
    })
    if not read.ok:
        waited_for = f" (still after {settle_s:g} s of settling)" if waited else ""
        run.outcome.refusal += [f"refused before {label}: {p}{waited_for}"
                                for p in read.problems]
    return read.ok


def only_busy(problems: list[str]) -> bool:
    """True when every problem is a busy gauge (worth a settle), none a missing or bad line."""
    return all(p.endswith("the server is not idle") for p in problems)


def read_guard(run: Run, label: str) -> GuardRead:
    """GET /metrics (one retry after a transport error) and the guard's decision on it."""
    for attempt in (1, 2):
        try:
            response = fetch(run.settings.target, run.clock, "GET", "/metrics")
            break
        except TransportError as exc:
            if attempt == 2 or exc.kind == "deadline" or run.clock.remaining() <= 1:
                raise Fatal(f"guard before {label}: {exc.problem}")
            time.sleep(METRICS_RETRY_PAUSE_S)
    if response.status != 200:
        return GuardRead(False, [f"guard cannot be read: GET {run.settings.target.display}"
                                 f"/metrics answered HTTP {response.status}"], [], None)
    exposition = parse_prometheus(response.body.decode("utf-8", "replace"))
    if not exposition.samples:
        return GuardRead(False, ["guard cannot be read: /metrics is not Prometheus text"],
                         [], None)
    problems, fresh = guard_problems(exposition, run.server.engines)
    return GuardRead(not problems, problems, exposition.samples, counters(exposition.samples),
                     fresh)


# ---------------------------------------------------------------------------
# Counters and status files: what moved during the warm-up.
# ---------------------------------------------------------------------------

COUNTER_MEANING = ("engine-wide counts over the warm-up window (from the /metrics read before "
                   "the first wave to the read after the last); attributable to the warm-up only "
                   "as far as the guards saw an idle server at each wave; not a count of worker "
                   "rounds")
HIGHLIGHTS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
              "vllm:request_success_total", "vllm:prefix_cache_queries_total",
              "vllm:prefix_cache_hits_total")
SPEC_DECODE_PREFIX = "vllm:spec_decode_"
STATUS_IDENTITY = ("pid", "session", "session_id", "boot_id", "started_at", "start_time")


def series_key(name: str, labels: dict) -> str:
    """name{k="v",...} with sorted labels; label values come from the server, so cleaned."""
    inner = ",".join(f'{k}="{clean_text(v, 200)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if labels else name


def series_name(key: str) -> str:
    """The metric name of a series key made by series_key."""
    return key.split("{")[0]


def counters(samples: list[tuple[str, dict, float]]) -> dict[str, float]:
    """Every counter series (`*_total`) by name and label set."""
    return {series_key(n, labels): v for n, labels, v in samples if n.endswith("_total")}


def counter_deltas(before: dict | None, after: dict | None) -> dict[str, float | None]:
    """after - before for every series; None where a side lacks it or the counter went back."""
    before, after = before or {}, after or {}
    deltas = {}
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        ok = b is not None and a is not None and math.isfinite(a - b) and a >= b
        deltas[key] = json_number(a - b) if ok else None
    return deltas


def highlighted(deltas: dict[str, float | None]) -> dict[str, float | None]:
    """The series an operator looks at; a highlighted counter absent everywhere is None."""
    shown = {k: v for k, v in deltas.items()
             if series_name(k) in HIGHLIGHTS or k.startswith(SPEC_DECODE_PREFIX)}
    names = {series_name(k) for k in shown}
    for name in HIGHLIGHTS:
        if name not in names:
            shown[name] = None
    if not any(n.startswith(SPEC_DECODE_PREFIX) for n in names):
        shown[SPEC_DECODE_PREFIX + "*"] = None
    return shown


def _sum_of(deltas: dict, name: str, engine: int | None = None) -> float | None:
    values = [v for k, v in deltas.items() if series_name(k) == name
              and (engine is None or f'engine="{engine}"' in k)]
    if not values or any(not isinstance(v, (int, float)) for v in values):
        return None
    return sum(values)


def cross_check(deltas: dict, requests: list[dict]) -> list[str]:
    """Counter deltas against the records; a mismatch is a warning, never a failure."""
    warnings = []
    generated = _sum_of(deltas, "vllm:generation_tokens_total")
    completed = sum(r["completion_tokens"] or 0 for r in requests)
    if generated is None:
        warnings.append("cross-check not made: vllm:generation_tokens_total absent")
    elif generated != completed:
        warnings.append(f"generation tokens delta {generated:g} differs from the records' "
                        f"{completed} completion tokens (foreign traffic or a counting difference)")
    succeeded = _sum_of(deltas, "vllm:request_success_total")
    answered = sum(1 for r in requests if r["http_status"] == 200)
    if succeeded is None:
        warnings.append("cross-check not made: vllm:request_success_total absent")
    elif succeeded != answered:
        warnings.append(f"request success delta {succeeded:g} differs from the {answered} "
                        f"requests answered 200 (foreign traffic or a counting difference)")
    return warnings


def engine_shares(deltas: dict, engines: tuple[int, ...], want_generated: int,
                  want_prompt: dict) -> tuple[list[dict], list[str], list[str]]:
    """Each engine's share of the work from its own counter deltas.

    Returns per-engine figures, problems (an engine short of its share fails the run) and
    warnings (counters absent: null, never made up).
    """
    shares, problems, warnings = [], [], []
    for engine in engines:
        generated = _sum_of(deltas, "vllm:generation_tokens_total", engine)
        prompt = _sum_of(deltas, "vllm:prompt_tokens_total", engine)
        shares.append({"engine": engine, "generation_tokens": generated,
                       "generation_tokens_planned": want_generated, "prompt_tokens": prompt,
                       "b1_prompt_tokens": want_prompt.get(engine)})
        if generated is None or prompt is None:
            warnings.append(f"engine {engine}: counters absent, its share cannot be checked")
            continue
        if generated < want_generated:
            problems.append(f"engine {engine} generated {generated:g} of {want_generated} tokens: "
                            f"is {ENGINE_HEADER} honoured by this server?")
        needed = want_prompt.get(engine)
        if needed is not None and prompt < needed:
            problems.append(f"engine {engine} prefilled {prompt:g} prompt tokens, fewer than its "
                            f"B1 prompt's {needed}: is {ENGINE_HEADER} honoured by this server?")
    return shares, problems, warnings


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


def metrics_source(target: Target, path: str = "") -> str:
    return target.display + path


def read_samples(run: Run, target: Target, path: str) -> tuple[list | None, str | None]:
    """The samples of one Prometheus endpoint, or None and why."""
    try:
        response = fetch(target, run.clock, "GET", path)
    except TransportError as exc:
        return None, exc.problem
    if response.status != 200:
        return None, f"HTTP {response.status}"
    samples = parse_prometheus(response.body.decode("utf-8", "replace")).samples
    return (samples, None) if samples else (None, "not Prometheus text")


def read_counters(run: Run, target: Target, path: str) -> tuple[dict | None, str | None]:
    """Counters of one Prometheus endpoint, or None and why (never a made-up number)."""
    samples, why = read_samples(run, target, path)
    return (counters(samples), None) if samples else (None, why)


def wait_for_status(run: Run, path: str, missing_before: bool = False
                    ) -> tuple[dict | None, str | None]:
    """The status file once rewritten after this moment, within --status-wait-s and the deadline."""
    if missing_before and not os.path.exists(path):
        return None, "missing (and missing before the first wave: not waited for again)"
    wait_s = run.settings.status_wait_s
    if os.path.exists(path) and not os.path.isfile(path):
        return None, "not a regular file (a FIFO or a device could block the read)"
    run.say(f"waiting up to {wait_s:g} s for {path} to be rewritten")
    asked = time.time()
    limit = time.monotonic() + min(wait_s, max(run.clock.remaining() - 1, 0))
    while True:
        try:
            if os.stat(path).st_mtime > asked:
                doc, _ = read_json_file(path)
                if isinstance(doc, dict):
                    return doc, None
        except FileNotFoundError:
            if time.monotonic() >= limit:
                return None, "missing"
        except OSError:
            pass                                # being rewritten: read it again
        if time.monotonic() >= limit:
            return None, (f"stale: not rewritten within {wait_s:g} s "
                          f"(or the time left to the deadline)")
        time.sleep(0.1)


def read_json_file(path: str) -> tuple[object, str | None]:
    """A small JSON file (status files), read within the body cap; (None, why) when bad.
    Only a regular file: a FIFO or a device could block the read past the deadline."""
    with open_regular(path) as handle:
        data = handle.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        return None, "larger than the body cap"
    return decode_json(data)


def read_before(run: Run) -> None:
    """Counters of the extra endpoints and the status files, before the first wave."""
    for target in run.settings.metrics_targets:
        run.outcome.counters_before[metrics_source(target)] = read_counters(run, target, "")
    for path in run.settings.status_files:
        run.outcome.status_before[path] = wait_for_status(run, path)


def read_after(run: Run) -> None:
    """Read every counter source and status file again; record deltas and cross-checks.

    Skipped (and said) when less than a second is left: a run that finished its waves in
    time must not become late for the sake of its counters.
    """
    outcome, settings = run.outcome, run.settings
    if run.clock.remaining() < AFTER_READS_MIN_LEFT_S:
        outcome.warnings.append("counter deltas and status files not read after the last wave: "
                                "less than 1 s left to the deadline")
        return
    main_source = metrics_source(settings.target, "/metrics")
    sources = [(main_source, settings.target, "/metrics")] + \
        [(metrics_source(t), t, "") for t in settings.metrics_targets]
    for source, target, path in sources:
        before, why_before = outcome.counters_before.get(
            source, (None, "not read before the first wave"))
        after, why_after = read_counters(run, target, path)
        deltas = counter_deltas(before, after)
        why = why_before or why_after
        record = {"record": "metrics", "run_id": settings.plan.run_id, "source": source,
                  "state": "incomplete" if why else "complete",
                  "why": None if not why else f"{'before' if why_before else 'after'}: {why}",
                  "meaning": COUNTER_MEANING, "deltas": deltas, "highlights": highlighted(deltas)}
        if source == main_source:
            outcome.counter_highlights = record["highlights"]
            record["warnings"] = [] if why else cross_check(deltas, outcome.requests)
            outcome.warnings += record["warnings"]
            if why:
                outcome.warnings.append(f"counter deltas incomplete: {record['why']}")
            if run.server.engines and settings.mode == "warmup" \
                    and len(outcome.requests) == requests_planned(run):
                check_engine_shares(run, deltas if not why else {}, record)
        run.write(record)
    for path in settings.status_files:
        before, why_before = outcome.status_before.get(path, (None, "not read"))
        after, why_after = wait_for_status(run, path, missing_before=before is None
                                           and str(why_before).startswith("missing"))
        why = "; ".join([f"before: {why_before}"] * bool(why_before)
                        + [f"after: {why_after}"] * bool(why_after)) or None
        result = status_delta(before, after, why)
        run.write(dict({"record": "status", "run_id": settings.plan.run_id, "path": path},
                       **result))
        if result["state"] != "valid":
            outcome.warnings.append(f"status file {path}: {result['state']}: {result['why']}")
    run.say(counters_line(outcome.counter_highlights))


def check_engine_shares(run: Run, deltas: dict, record: dict) -> None:
    """Proof per engine: each engine's own counters must show its planned work."""
    plan = run.settings.plan
    want_prompt = {}
    for r in run.outcome.requests:
        if r["wave"] == wave_name(plan.waves[0]) and isinstance(r.get("prompt_tokens"), int):
            want_prompt[r["engine"]] = r["prompt_tokens"]
    shares, problems, warnings = engine_shares(deltas, run.server.engines,
                                               plan.requests_total * plan.tokens, want_prompt)
    record["engines"] = shares
    run.outcome.problems += problems
    run.outcome.warnings += warnings


# ---------------------------------------------------------------------------
# HTTP over a bare socket: every connect, send and read bounded by the deadline.
# (http.client's timeout is per read, so a trickling server could hold it forever.)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str                 # base path without trailing slash, ASCII, already safe
    credentials: str | None   # user:password from the URL: never printed, never sent

    @property
    def display(self) -> str:
        return f"{self.scheme}://{self.host_port}{self.path}"

    @property
    def host_port(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


_URL_CHARS = re.compile(r"[!-~]+")       # printable ASCII, no space


def parse_url(text: str, option: str = "--base-url") -> Target:
    """http(s)://[user:pass@]host[:port][/path] -> Target; UsageError otherwise."""
    text = text.strip()
    if not _URL_CHARS.fullmatch(text):
        raise UsageError(f"{option} must be printable ASCII without spaces (percent-encode "
                         f"anything else), such as http://HOST:PORT/PATH")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:                  # its message may quote a password: not shown
        raise UsageError(f"{option} is not a valid URL (check the port, and percent-encode "
                         f"any / : @ in a user:password@ part)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{option} must look like http://HOST:PORT/PATH")
    if parts.query or parts.fragment:
        raise UsageError(f"{option} must not carry a query or a fragment")
    if port == 0:
        raise UsageError(f"{option}: port 0 is not a port a server listens on")
    creds = parts.netloc.rpartition("@")[0] or None
    return Target(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80),
                  parts.path.rstrip("/"), creds)


def parse_base_url(text: str) -> Target:
    """The server's address; a trailing /v1 is dropped (the helper adds its paths)."""
    target = parse_url(text)
    if target.path.endswith("/v1"):
        target = Target(target.scheme, target.host, target.port, target.path[:-3],
                        target.credentials)
    return target


@dataclass(frozen=True)
class Clock:
    """The helper's deadline; every socket wait is min(cap, time left)."""
    started: float
    deadline_s: float
    cap_s: float

    @classmethod
    def start(cls, deadline_s: float, cap_s: float) -> "Clock":
        return cls(time.monotonic(), deadline_s, cap_s)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.deadline_s - self.elapsed()

    def timeout(self) -> float:
        left = self.remaining()
        if left <= 0:
            raise TransportError("deadline", self.deadline_problem())
        return min(self.cap_s, left)

    def deadline_problem(self) -> str:
        return f"no complete response by the deadline ({self.deadline_s:g} s)"


class TransportError(Exception):
    """Connect, send or read failed; `problem` is short and safe to record."""

    def __init__(self, kind: str, problem: str):
        super().__init__(problem)
        self.kind = kind
        self.problem = problem


@dataclass
class Response:
    status: int
    headers: dict
    body: bytes
    watched_at: float | None = None     # when `watch` first matched the raw body (streams)


_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def encode_request(target: Target, method: str, path: str, body: dict | None,
                   api_key: str | None, headers: dict | None = None) -> bytes:
    """The request's bytes; the key goes only to paths under /v1.

    The one place a request is built: the target is ASCII without spaces (parse_url), and
    every header value is checked printable ASCII, so nothing can inject a header line.
    """
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {target.path + path or '/'} HTTP/1.1",
             f"Host: {target.host_port}",
             f"User-Agent: offload-warmup/{__version__}",
             "Accept: application/json",
             "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    if api_key and path.startswith("/v1/"):
        lines.append(f"Authorization: Bearer {api_key}")
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    for line in lines[1:]:
        if not _HEADER_VALUE.fullmatch(line):
            raise UsageError("a request header would hold a character that is not printable "
                             "ASCII")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + data


def connect(target: Target, clock: Clock) -> socket.socket:
    try:
        sock = socket.create_connection((target.host, target.port), timeout=clock.timeout())
        if target.scheme == "https":
            import ssl                  # only https needs it; it costs start-up time
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=target.host)
    except TransportError:
        raise
    except (socket.timeout, TimeoutError):
        raise TransportError("connect", f"cannot connect to {target.display}: timed out")
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise TransportError("connect", f"cannot connect to {target.display}: {reason}")
    return sock


def send_all(sock: socket.socket, data: bytes, clock: Clock) -> None:
    view = memoryview(data)
    try:
        while view:
            sock.settimeout(clock.timeout())
            view = view[sock.send(view):]
    except (socket.timeout, TimeoutError):
        raise TransportError("timeout", _timeout_problem(clock, "sending the request"))
    except OSError as exc:
        raise TransportError("closed", f"connection closed while sending: {exc.strerror or exc}")


def _timeout_problem(clock: Clock, doing: str) -> str:
    if clock.remaining() <= 0:
        return clock.deadline_problem()
    return f"no progress for {clock.cap_s:g} s (socket cap) while {doing}"


def read_response(sock: socket.socket, clock: Clock, max_body: int = MAX_BODY_BYTES,
                  watch: re.Pattern | None = None) -> Response:
    """Read one HTTP/1.1 response; the whole read ends by the deadline, however it trickles.

    Interim 1xx responses (100 Continue, 103 Early Hints) are skipped. With `watch`, also
    note (in the clock's time) when the pattern first arrives in the body: the first
    generated text of a stream, for time-to-first-token.
    """
    buf = bytearray()
    head = None
    watched_at, searched = None, 0
    while True:
        while head is None:
            end = buf.find(b"\r\n\r\n")
            if (end < 0 and len(buf) > MAX_HEADER_BYTES) or end > MAX_HEADER_BYTES:
                raise TransportError("malformed", "malformed HTTP response: headers larger "
                                     f"than {MAX_HEADER_BYTES} bytes")
            if end < 0:
                break
            head = _parse_head(bytes(buf[:end]), max_body)
            del buf[:end + 4]
            if 100 <= head[0] < 200 and head[0] != 101:
                head = None                 # interim response: the final one follows
        if watch is not None and watched_at is None and head is not None:
            if watch.search(buf, max(searched - 64, 0)):
                watched_at = clock.elapsed()
            searched = len(buf)
        if head is not None:
            body = _complete_body(head, buf, max_body)
            if body is not None:
                return Response(head[0], head[1], body, watched_at)
        try:
            sock.settimeout(clock.timeout())
            chunk = sock.recv(65536)
        except (socket.timeout, TimeoutError):
            raise TransportError("timeout", _timeout_problem(clock, "reading the response"))
        except OSError as exc:
            raise TransportError("closed", f"connection closed before the response was complete "
                                 f"({exc.strerror or type(exc).__name__})")
        if not chunk:
            if head is not None and _reads_to_close(head[1]):
                return Response(head[0], head[1], bytes(buf), watched_at)
            raise TransportError("closed", "connection closed before the response was complete")
        buf += chunk


_STATUS_LINE = re.compile(r"HTTP/1\.[01] ([1-5][0-9][0-9])(?: [\x20-\x7e\t\x80-\xff]*)?")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,15}")


def _parse_head(raw: bytes, max_body: int) -> tuple[int, dict]:
    lines = raw.decode("latin-1").split("\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if not match:
        raise TransportError("malformed", "malformed HTTP response: bad status line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[:1] in " \t":
            raise TransportError("malformed", "malformed HTTP response: bad header line")
        name, value = name.lower(), value.strip()
        if name in headers and name in ("content-length", "transfer-encoding") \
                and headers[name] != value:
            raise TransportError("malformed", f"malformed HTTP response: two {name} headers")
        headers[name] = value.lower() if name == "transfer-encoding" else value
    length = headers.get("content-length")
    if length is not None:
        if not _CONTENT_LENGTH.fullmatch(length):
            raise TransportError("malformed", "malformed HTTP response: bad Content-Length")
        if int(length) > max_body:
            raise TransportError("too_large", f"response body of {int(length)} bytes is larger "
                                 f"than the {max_body} bytes the helper reads; read stopped")
    return int(match.group(1)), headers


def _chunked(headers: dict) -> bool:
    return "chunked" in headers.get("transfer-encoding", "")


def _reads_to_close(headers: dict) -> bool:
    return "content-length" not in headers and not _chunked(headers)


def _complete_body(head: tuple[int, dict], buf: bytearray, max_body: int) -> bytes | None:
    status, headers = head
    if len(buf) > max_body + MAX_HEADER_BYTES:
        raise TransportError("too_large", f"response body larger than the {max_body} bytes the "
                             f"helper reads; read stopped")
    if status in (204, 304) or 100 <= status < 200:
        return b""
    if _chunked(headers):
        return decode_chunked(bytes(buf)) if buf.endswith(b"\r\n\r\n") else None
    if "content-length" in headers:
        length = int(headers["content-length"])
        return bytes(buf[:length]) if len(buf) >= length else None
    return None


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,8}")


def decode_chunked(data: bytes) -> bytes | None:
    """Chunked transfer coding -> body, or None while the terminating chunk is missing."""
    body, pos = bytearray(), 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return None
        size_text = data[pos:end].split(b";")[0].strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise TransportError("malformed", "malformed HTTP response: bad chunk size")
        size = int(size_text, 16)
        if size == 0:
            return bytes(body) if data.find(b"\r\n\r\n", end) >= 0 else None
        if len(data) < end + 2 + size + 2:
            return None
        if data[end + 2 + size:end + 4 + size] != b"\r\n":
            raise TransportError("malformed", "malformed HTTP response: chunk not terminated")
        body += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


def fetch(target: Target, clock: Clock, method: str, path: str, body: dict | None = None,
          api_key: str | None = None) -> Response:
    """One request on its own connection, bounded by the clock."""
    sock = connect(target, clock)
    try:
        send_all(sock, encode_request(target, method, path, body, api_key), clock)
        return read_response(sock, clock)
    finally:
        sock.close()


def decode_json(data: bytes) -> tuple[object, str | None]:
    """The one JSON decoder for server bodies and records lines: (doc, None) or (None, why).

    Bounded: the input is already capped; nesting deeper than MAX_JSON_DEPTH is refused
    before the parser could recurse into it.
    """
    if _nesting_depth(data) > MAX_JSON_DEPTH:
        return None, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        return json.loads(data), None
    except (ValueError, RecursionError):
        return None, "invalid JSON"


def _nesting_depth(data) -> int:
    """The deepest bracket nesting outside strings; a quick scan, not a parse."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


# ---------------------------------------------------------------------------
# One batch: connect every client, release them together at a barrier, read under
# the deadline. Threads are daemons: a stuck one never keeps the process alive.
# ---------------------------------------------------------------------------

@dataclass
class Slot:
    """One request of a batch: what the client thread did, in the helper's clock."""
    index: int
    request_id: str
    payload: bytes
    sent_at: float | None = None
    done_at: float | None = None
    response: Response | None = None
    error: TransportError | None = None
    engine: int | None = None
    stream: bool = False                # a streamed request: note its first token


# A server-sent event whose choice carries non-empty text: the first token has arrived.
FIRST_TEXT = re.compile(rb'"(?:text|content)":\s*"(?:[^"\\]|\\.)')


def _client(target: Target, clock: Clock, slot: Slot, barrier: threading.Barrier) -> None:
    sock = None
    try:
        try:
            sock = connect(target, clock)
        except TransportError as exc:
            slot.error = exc
        barrier.wait(timeout=max(clock.remaining(), 0.001))
        if sock is None:
            return
        slot.sent_at = clock.elapsed()
        send_all(sock, slot.payload, clock)
        slot.response = read_response(sock, clock, watch=FIRST_TEXT if slot.stream else None)
    except threading.BrokenBarrierError:
        slot.error = slot.error or TransportError(
            "barrier", "not released: a sibling client did not get ready by the deadline")
    except TransportError as exc:
        slot.error = exc
    except Exception as exc:            # never let a client die silently
        slot.error = TransportError("internal", f"client error: {type(exc).__name__}")
    finally:
        slot.done_at = clock.elapsed()
        if sock is not None:
            sock.close()


def release_batch(target: Target, clock: Clock, slots: list[Slot]) -> list[Slot]:
    """Run one batch; the main thread waits on the clients only until the deadline."""
    barrier = threading.Barrier(len(slots))
    threads = [threading.Thread(target=_client, args=(target, clock, slot, barrier),
                                name=f"warmup-{slot.request_id}", daemon=True) for slot in slots]
    for thread in threads:
        start_quiet(thread)
    for thread in threads:
        thread.join(timeout=max(clock.remaining(), 0))
    finished = []
    for thread, slot in zip(threads, slots):
        if thread.is_alive():        # still reading at the deadline: abandon it
            slot = Slot(slot.index, slot.request_id, b"", slot.sent_at, clock.elapsed(),
                        None, TransportError("deadline", clock.deadline_problem()),
                        slot.engine, slot.stream)
            barrier.abort()
        finished.append(slot)
    return finished


CLIENT_STACK_BYTES = 512 << 10       # 64 clients stay small under an address-space limit


def start_quiet(thread: threading.Thread) -> None:
    """Start a helper thread that never receives the caught signals, so the kernel delivers
    them to the main thread and interrupts its wait at once (a signal taken by another thread
    would leave the main thread blocked until its timeout)."""
    signums = {getattr(signal, name) for name in CAUGHT_SIGNALS if hasattr(signal, name)}
    blocked = hasattr(signal, "pthread_sigmask")
    if blocked:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    stack = threading.stack_size(CLIENT_STACK_BYTES)
    try:
        thread.start()
    finally:
        threading.stack_size(stack)
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def release_skew_ms(slots: list[Slot]) -> float | None:
    sent = [slot.sent_at for slot in slots if slot.sent_at is not None]
    return round((max(sent) - min(sent)) * 1000, 3) if sent else None


def slot_timing(slot: Slot) -> dict:
    """A finished slot's HTTP status, transport error and times: shared by every record."""
    latency = (slot.done_at - slot.sent_at) \
        if slot.sent_at is not None and slot.done_at is not None else None
    return {
        "http_status": slot.response.status if slot.response is not None else None,
        "transport_error": None if slot.response is not None else
        (slot.error.problem if slot.error else "no response"),
        "latency_s": None if latency is None else round(latency, 4),
        "sent_at_s": None if slot.sent_at is None else round(slot.sent_at, 4),
    }


# ---------------------------------------------------------------------------
# The judge: response -> problems, wave -> problems, run -> verdict.
# ---------------------------------------------------------------------------

def extract_fields(status: int, body: bytes, redact: tuple[str, ...] = ()) -> dict:
    """The one reader of response bodies: the counts and reasons, sanitized; never text or ids."""
    fields = {"http_status": status, "body_error": None, "error": None, "error_param": None,
              "n_choices": None, "usage": False, "prompt_tokens": None, "cached_tokens": None,
              "completion_tokens": None, "reasoning_tokens": None, "finish_reason": None,
              "stop_reason": None, "metrics": None, "speculative_decoding": None,
              "usage_problems": []}
    doc, why = decode_json(body)
    if why is not None:
        fields["body_error"] = f"{why} in the response body"
        if status != 200:
            fields["error"] = scrub(body.decode("utf-8", "replace"), ERROR_TEXT_LIMIT,
                                    redact) or None
        return fields
    if not isinstance(doc, dict):
        fields["body_error"] = "response body is JSON but not an object"
        return fields
    if status != 200:
        fields["error"], fields["error_param"] = _error_message(doc, redact)
        return fields
    choices = doc.get("choices")
    if isinstance(choices, list):
        fields["n_choices"] = len(choices)
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        fields["finish_reason"] = exact_str(choice.get("finish_reason"), 32, redact)
        fields["stop_reason"] = clean_stop_reason(choice.get("stop_reason"), redact)
    usage = doc.get("usage")
    if isinstance(usage, dict):
        fields["usage"] = True
        counts, fields["usage_problems"] = read_usage(usage, redact)
        fields.update(counts)
    metrics = doc.get("metrics")
    if isinstance(metrics, dict):
        fields["metrics"] = {k: finite_number(metrics.get(k))
                             for k in REQUEST_METRIC_FIELDS}
        fields["speculative_decoding"] = _numbers_only(metrics.get("speculative_decoding"))
    return fields


USAGE_COUNTS = (("prompt_tokens", ("prompt_tokens",)),
                ("completion_tokens", ("completion_tokens",)),
                ("cached_tokens", ("prompt_tokens_details", "cached_tokens")),
                ("reasoning_tokens", ("completion_tokens_details", "reasoning_tokens")))


def read_usage(usage, redact: tuple[str, ...] = ()) -> tuple[dict, list[str]]:
    """The counts of a usage object (None where not reported, never 0) and a problem per
    value that is not a count, cleaned and cut, secrets redacted before it is quoted."""
    counts, problems = {}, []
    for name, path in USAGE_COUNTS:
        value = usage
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        counts[name] = count_value(value)
        if value is not None and counts[name] is None:
            shown = redact_secrets(value, redact) if isinstance(value, str) else value
            problems.append(f"usage {name} is not a count: "
                            f"{clean_text(repr(shown)[:400], 40, redact)}")
    return counts, problems


def count_value(value) -> int | None:
    """A count as the server gave it (a non-negative integer); anything else is None, never 0."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53:
        return value
    return None


def positive_int(value) -> int | None:
    count = count_value(value)
    return count if count else None


def finite_number(value) -> float | int | None:
    """A finite number as the server gave it; anything else (bool, NaN, text) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _numbers_only(value) -> dict | None:
    """Per-request speculative metrics: numeric fields (and short numeric lists) only."""
    if not isinstance(value, dict):
        return None
    kept = {}
    for key, item in list(value.items())[:32]:
        key = clean_text(str(key), 64)
        if isinstance(item, list):
            kept[key] = [finite_number(x) for x in item[:64]]
        else:
            kept[key] = finite_number(item)
    return kept


def _error_message(doc: dict, redact: tuple[str, ...]) -> tuple[str | None, str | None]:
    error = doc.get("error", doc.get("detail", doc.get("message")))
    if isinstance(error, dict):
        param = error.get("param")
        return (scrub(str(error.get("message", "")), ERROR_TEXT_LIMIT, redact) or None,
                _short_str(param, 64, redact))
    if error is None:
        return None, None
    return scrub(str(error) if not isinstance(error, str) else error, ERROR_TEXT_LIMIT,
                 redact) or None, None


def diagnose_http_error(status: int, message: str | None, param: str | None,
                        api_key_env: str, key_set: bool = False) -> str:
    """Name why a non-200 answer happened and what the operator can do about it."""
    text = f"{message or ''} {param or ''}".lower()
    said = f": {message}" if message else ""
    if status == 401:
        if key_set:
            return (f"unauthorized: the server rejected the API key in {api_key_env}; set it "
                    f"to the key the server was started with (HTTP 401)")
        return (f"unauthorized: {api_key_env} is not set; set {api_key_env} (or --api-key-env) "
                f"to the server's API key (HTTP 401)")
    if status == 400 and "priority" in text:
        return ("HTTP 400 naming priority: the server lacks priority scheduling; start it with "
                f"--scheduling-policy priority, or run the warm-up with --priority 0{said}")
    if status == 400 and ("context length" in text or "min_tokens" in text
                          or "input_tokens" in text):
        return ("the long prompt does not fit the model's context (prompt tokens + completion "
                f"tokens must not exceed max_model_len; lower --b1-tokens) (HTTP 400){said}")
    if 300 <= status < 400:
        return f"HTTP {status} redirect not followed: point --base-url at the server itself"
    if status == 404:
        return (f"HTTP 404: no such path on the server (is --base-url the server's address, "
                f"with no extra path?){said}")
    return f"HTTP {status}{said}"


def judge_response(fields: dict, *, tokens: int, is_b1: bool,
                   api_key_env: str = "VLLM_API_KEY", key_set: bool = False) -> list[str]:
    """What makes one warm-up response pass; [] means it passed."""
    if fields.get("transport_error"):
        return [fields["transport_error"]]
    status = fields["http_status"]
    if status != 200:
        return [diagnose_http_error(status, fields["error"], fields["error_param"], api_key_env,
                                    key_set)]
    if fields["body_error"]:
        return [fields["body_error"]]
    problems = []
    if fields["n_choices"] is None:
        problems.append("response has no choices")
    elif fields["n_choices"] != 1:
        problems.append(f"response has {fields['n_choices']} choices, expected 1")
    if not fields["usage"]:
        problems.append("response has no usage object")
        return problems
    problems += fields.get("usage_problems", [])
    completion, finish, stop = (fields["completion_tokens"], fields["finish_reason"],
                                fields["stop_reason"])
    if completion == 1:
        problems.append(f"one-token response: completion_tokens 1 (finish_reason {finish!r}, "
                        f"stop_reason {stop!r})")
    elif completion is None:
        problems.append("usage.completion_tokens missing")
    elif completion != tokens:
        problems.append(f"completion_tokens {completion}, expected {tokens}")
    if finish != "length":
        problems.append(f"finish_reason {finish!r}, expected 'length'")
    if stop is not None:
        problems.append(f"stop_reason {stop!r}, expected null")
    if is_b1:
        prompt, cached = fields["prompt_tokens"], fields["cached_tokens"]
        if prompt is None:
            problems.append("usage.prompt_tokens missing: B1's size cannot be checked")
        elif prompt < MIN_B1_PROMPT_TOKENS:
            problems.append(f"B1 prompt_tokens {prompt}, expected more than "
                            f"{MIN_B1_PROMPT_TOKENS - 1}")
        if cached:
            problems.append(f"B1 cached_tokens {cached}, expected 0: a cached prefix matched, "
                            f"so the long prefill did not run in full")
    return [clean_text(p, PROBLEM_LIMIT) for p in problems]


def judge_wave(requests: list[dict], depth: int, engine: int | None = None) -> list[str]:
    """A wave passes (on one engine) when all `depth` requests ran and passed."""
    name = wave_name(depth) + ("" if engine is None else f" engine {engine}")
    problems = []
    if len(requests) != depth:
        problems.append(f"{name}: {len(requests)} of {depth} requests ran")
    failed = sum(1 for r in requests if not r["ok"])
    if failed:
        problems.append(f"{name}: {failed} of {len(requests)} requests failed")
    return problems


def request_label(record: dict) -> str:
    """How problems name a request: B2#1 (e1 B2#1 with engines), 'single round 1#0' (probe),
    'alone id_repo#0' (gate)."""
    if record.get("shape"):
        where = f"{record.get('shape')} {record.get('probe')}"
    else:
        where = record.get("wave") or f"{record.get('item')} round {record.get('round')}"
    engine = record.get("engine")
    return f"{'' if engine is None else f'e{engine} '}{where}#{record.get('index')}"


def judge_run(*, requests: list[dict], planned: int, problems: list[str], refusal: list[str],
              elapsed_s: float, deadline_s: float) -> tuple[str, int, list[str]]:
    """The run's verdict: pass only with every planned request passed, in time, unrefused."""
    problems = list(problems)
    failed = [r for r in requests if not r["ok"]]
    for r in failed:
        problems += [f"{request_label(r)}: {p}" for p in r["problems"]]
    late = elapsed_s > deadline_s
    if late:
        problems.append(f"finished after the deadline ({elapsed_s:.2f} s > {deadline_s:g} s)")
    if failed or late or problems or (len(requests) < planned and not refusal):
        if len(requests) < planned:
            problems.append(f"only {len(requests)} of {planned} requests ran")
        return "fail", EXIT_FAIL, problems + refusal
    if refusal:
        return "refused", EXIT_REFUSED, refusal + [f"only {len(requests)} of {planned} "
                                                   f"requests ran"]
    return "pass", EXIT_PASS, problems


# ---------------------------------------------------------------------------
# The records: sanitize, append line by line.
# ---------------------------------------------------------------------------

# Control characters, line and paragraph separators, bidi overrides and zero-width marks:
# nothing from a server may move the cursor, start a line or hide text on a terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e"
                      r"\u2066-\u2069\ufeff\ud800-\udfff]+")


def redact_secrets(text: str, redact: tuple[str, ...] = ()) -> str:
    """Every secret (the key, URL credentials, our nonces) replaced, before anything cuts or
    quotes the text (a cut could keep half a key; repr() would double its backslashes)."""
    for secret in redact:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


def clean_text(text: str, limit: int, redact: tuple[str, ...] = ()) -> str:
    """One line, no control characters or lone surrogates, secrets replaced, at most
    `limit` characters."""
    text = redact_secrets(text, redact)
    if len(text) > 64 * limit:
        text = text[:64 * limit]
    text = " ".join(_CONTROL.sub(" ", text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


_FILLER = frozenset(FILLER_WORDS)
_WORD = re.compile(r"[A-Za-z0-9_-]+")
_HEX_TAG = re.compile(r"(?:warmup-)?[0-9a-f]{12,}")


def scrub(text: str, limit: int, redact: tuple[str, ...] = ()) -> str:
    """A server's message made safe to show: our prompts' text and nonces removed, cleaned.

    Validation errors echo the request: any run of three or more of our filler words, and
    any nonce or prompt tag, becomes [prompt text].
    """
    text = redact_secrets(text, redact)[:64 * limit]
    words = list(_WORD.finditer(text))
    spans, run = [], []
    for match in words + [None]:
        ours = match is not None and (match.group().lower() in _FILLER
                                      or _HEX_TAG.fullmatch(match.group()))
        if ours:
            run.append(match)
            continue
        if len(run) >= 3 or any(_HEX_TAG.fullmatch(m.group()) for m in run):
            spans.append((run[0].start(), run[-1].end()))
        run = []
    for start, end in reversed(spans):
        text = text[:start] + "[prompt text]" + text[end:]
    return clean_text(text, limit, redact)


def _short_str(value, limit: int, redact: tuple[str, ...] = ()) -> str | None:
    return clean_text(value, limit, redact) if isinstance(value, str) else None


def exact_str(value, limit: int, redact: tuple[str, ...] = ()) -> str | None:
    """A server's short string kept exact when it is clean; otherwise its quoted form, so a
    'length\\n' can never be judged as 'length'."""
    if value is None:
        return None
    if isinstance(value, str) and value == clean_text(value, limit, redact):
        return value
    if isinstance(value, str):
        value = redact_secrets(value, redact)
    return clean_text(repr(value), limit, redact)


def clean_stop_reason(value, redact: tuple[str, ...] = ()) -> int | str | None:
    """stop_reason as the server gave it (a token id or a stop string, cut to 64 characters)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)
                         and abs(value) < 1 << 53):
        return value
    if isinstance(value, str):
        return clean_text(value, STOP_REASON_LIMIT, redact)
    return f"<{type(value).__name__}>"


def json_number(value: float):
    """Prometheus values as JSON: NaN and infinities become strings, as Prometheus spells them."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def request_record(run: Run, depth: int, slot: Slot, first: bool) -> dict:
    """A request record from what one client got: counts, reasons, verdict."""
    timing = slot_timing(slot)
    if slot.response is not None:
        fields = extract_fields(slot.response.status, slot.response.body, run.redact)
    else:
        fields = {"http_status": None, "transport_error": timing["transport_error"]}
    problems = judge_response(fields, tokens=run.settings.plan.tokens, is_b1=first,
                              api_key_env=run.settings.api_key_env,
                              key_set=bool(run.settings.api_key))
    return {
        "record": "request", "run_id": run.settings.plan.run_id, "request_id": slot.request_id,
        "wave": wave_name(depth), "index": slot.index, "engine": slot.engine,
        "http_status": timing["http_status"],
        "prompt_tokens": fields.get("prompt_tokens"),
        "cached_tokens": fields.get("cached_tokens"),
        "completion_tokens": fields.get("completion_tokens"),
        "reasoning_tokens": fields.get("reasoning_tokens"),
        "finish_reason": fields.get("finish_reason"),
        "stop_reason": fields.get("stop_reason"),
        "latency_s": timing["latency_s"],
        "sent_at_s": timing["sent_at_s"],
        "ok": not problems,
        "problems": problems,
        "error": fields.get("error") or fields.get("transport_error"),
        "metrics": fields.get("metrics"),
        "speculative_decoding": fields.get("speculative_decoding"),
    }


def default_records_path(run_id: str, kind: str = "warmup") -> str:
    directory = os.environ.get("WARMUP_RECORDS_DIR") or "warmup-records"
    return os.path.join(directory, f"{kind}-{run_id}.jsonl")


def open_records(path: str):
    """Open the records file for appending; OSError when it cannot be written.

    Only a regular file: a FIFO without a reader would block the open, a device may
    swallow or refuse what is written. A file cut mid-line by a kill gets a newline
    first, so the next record starts on a line of its own.
    """
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    try:
        info = os.fstat(fd)
        import stat
        if not stat.S_ISREG(info.st_mode):
            raise OSError(0, "not a regular file")
        os.set_blocking(fd, True)
        needs_newline = info.st_size > 0 and _last_byte(path) != b"\n"
        stream = os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
    if needs_newline:
        stream.write("\n")
        stream.flush()
    return stream


def open_regular(path: str):
    """A regular file opened for reading without blocking on a FIFO; OSError otherwise."""
    import stat
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _last_byte(path: str) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def append_record(stream, record: dict) -> None:
    """One JSON object a line, flushed at once, so a killed run keeps what finished."""
    try:
        line = json.dumps(record, allow_nan=False, ensure_ascii=False) + "\n"
        line.encode("utf-8")
    except UnicodeEncodeError:          # a lone surrogate somewhere: escape it, keep the record
        line = json.dumps(record, allow_nan=False) + "\n"
    stream.write(line)
    stream.flush()


# ---------------------------------------------------------------------------
# What the terminal shows: one line per wave (and engine), counters, the verdict.
# ---------------------------------------------------------------------------

class Printer:
    """Human lines go out through a daemon thread, so a terminal that stops reading can
    never hold the run, and a closed one (`| head -1`) ends the printing, not the run."""

    def __init__(self, stream):
        self.stream = stream
        self.lines: queue.Queue = queue.Queue()
        self.closed: set = set()            # ids of streams whose reader went away
        self.thread = threading.Thread(target=self._drain, name="warmup-printer", daemon=True)
        start_quiet(self.thread)

    def say(self, line: str, stream=None) -> None:
        self.lines.put((line, self.stream if stream is None else stream))

    def _drain(self) -> None:
        while True:
            line, stream = self.lines.get()
            if line is None:
                return
            if stream is None or id(stream) in self.closed:
                continue                    # closed at start (2>&-), or its reader went away
            try:
                print(printable(line, stream), file=stream, flush=True)
            except (OSError, ValueError):
                self.closed.add(id(stream))  # keep running; print no more to this stream
                _silence(stream)

    def close(self, wait_s: float) -> bool:
        """Wait up to `wait_s` for the lines to go out; False when the terminal is stuck."""
        self.lines.put((None, None))
        self.thread.join(wait_s)
        return not self.thread.is_alive()


def printable(text: str, stream) -> str:
    """The text as the stream can encode it (an ASCII terminal gets '?', never an error)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        return text.encode(encoding, "replace").decode(encoding, "replace")


def emit(text: str, stream=None) -> bool:
    """Print from the main thread when no run is in flight (reports, plans); a reader that
    went away (`| head -1`) ends the printing quietly. False when it did."""
    stream = sys.stdout if stream is None else stream
    if stream is None:                  # the descriptor was closed at start (1>&-)
        return False
    try:
        print(printable(text, stream), file=stream, flush=True)
        return True
    except (OSError, ValueError):
        _silence(stream)
        return False


def _silence(stream) -> None:
    """Point a dead stream's descriptor at /dev/null, so the interpreter's exit is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def start_line(run: Run) -> str:
    """What the run is about to do: server, model, engines, waves, B1's size, deadline."""
    plan, server = run.settings.plan, run.server
    engines = "" if server.engines is None else \
        f", engines {','.join(map(str, server.engines))}"
    counted = sorted(server.b1_counts.values()) or [server.b1_counted]
    b1_size = "estimated" if counted[0] is None else \
        "-".join(str(n) for n in dict.fromkeys((counted[0], counted[-1])))
    return (f"warm-up {plan.run_id}: {run.settings.target.display} model "
            f"{clean_text(server.model or '', 80)}{engines}, waves "
            f"{','.join(wave_name(d) for d in plan.waves)} ({requests_planned(run)} requests), "
            f"B1 prompt {b1_size} tokens, deadline {plan.deadline_s:g} s")


def wave_line(name: str, engine: int | None, wave_requests: list[dict], skew: float | None,
              duration: float, first: bool) -> str:
    ok = sum(r["ok"] for r in wave_requests)
    where = name if engine is None else f"{name} e{engine}"
    shown_skew = "-" if skew is None else f"{skew:.1f}"
    line = f"{where:<4} {ok}/{len(wave_requests)} ok  skew {shown_skew} ms  {duration:.2f} s"
    if first and wave_requests:
        cached = wave_requests[0]["cached_tokens"]
        line += (f"  prompt {wave_requests[0]['prompt_tokens']}"
                 f"  cached {'n/a' if cached is None else cached}")
    for r in wave_requests:
        if not r["ok"]:
            line += f"\n     #{r['index']}: " + "; ".join(r["problems"])
    return line


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


def verdict_line(summary: dict, records_path: str) -> str:
    head = (f"{summary['verdict'].upper()} (exit {summary['exit_code']}): "
            f"{summary['requests_ok']}/{summary['requests_total']} requests ok in "
            f"{summary['elapsed_s']:.2f} s")
    reasons = summary["problems"][:5]
    if len(summary["problems"]) > 5:
        reasons.append(f"and {len(summary['problems']) - 5} more in the records")
    notes = "".join(f"\nnote: {n}" for n in summary["notes"])
    notes += "".join(f"\nwarning: {w}" for w in summary.get("warnings", []))
    return head + "".join(f"\n  - {p}" for p in reasons) + notes + f"\nrecords: {records_path}"


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------

ENVIRONMENT_HELP = """\
environment:
  WARMUP_BASE_URL     default for --base-url
  WARMUP_MODEL        default for --model
  WARMUP_ENGINES      default for --engines
  WARMUP_RECORDS_DIR  where the default records file goes (else ./warmup-records/)
  VLLM_API_KEY        the API key, sent as "Authorization: Bearer" to /v1 paths only;
                      never printed or recorded (another variable: --api-key-env)
"""

EPILOG = ENVIRONMENT_HELP + """\
  WARMUP_HARD_S       read by warmup_serve.sh: hard wall-clock bound (default 95)
  WARMUP_PYTHON       read by warmup_serve.sh: the interpreter (default python3)

exit status:
  0    pass: every response as required (32 tokens, finish 'length', no stop reason;
       B1 more than 4096 prompt tokens, none cached), in time
  1    fail: a wrong response, a request error, cannot connect, context too small,
       an engine short of its share, an internal error, or late
  2    usage or configuration error (bad option, bad URL, records not writable,
       model not served, several models and no --model)
  3    refused: a request gauge in /metrics was missing, unreadable or non-zero
  124/137  ended by warmup_serve.sh's hard bound (TERM at WARMUP_HARD_S; KILL 5 s later)
  129/130/143  the helper received SIGHUP / SIGINT (Ctrl-C) / SIGTERM and wrote a
       'killed' summary first (any caught signal N: 128 + N)

A wave's depth is client concurrency (requests released together), not the engine's
batch shape. Not covered: long-context attention, every verification depth, deeper
bands (B6/B8) unless asked for with --waves. Readiness is not warm-up success: read the
records before releasing producers. The contract: CONTRACT.md beside this file.
"""


def seconds(high: float = MAX_SECONDS):
    """An argparse type: a number of seconds in (0, high]."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (0 < value <= high):
            raise argparse.ArgumentTypeError(f"must be a number of seconds greater than 0 and "
                                             f"at most {high:g}, got {text!r}")
        return value
    parse.__name__ = "seconds"
    return parse


def whole(low: int, high: int):
    """An argparse type: a whole number in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}, "
                                             f"got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


def waves_type(text: str) -> tuple[int, ...]:
    try:
        return parse_waves(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def parse_engines(text: str) -> tuple[int, ...]:
    """'auto' stays; '0,2' -> (0, 2): distinct engine indexes."""
    try:
        engines = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"wants auto or engine indexes separated by commas, such as 0,1; "
                         f"got {text!r}")
    if any(e < 0 or e > 1023 for e in engines) or len(set(engines)) != len(engines):
        raise ValueError(f"engine indexes must be distinct, from 0 to 1023; got {text!r}")
    return engines


def engines_type(text: str) -> str:
    if text.strip() == "auto":
        return "auto"
    try:
        return ",".join(map(str, parse_engines(text)))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The options every command that talks to the server shares (warm-up, probe, gate)."""
    env = os.environ
    parser.add_argument("--base-url", metavar="URL",
                        default=env.get("WARMUP_BASE_URL") or DEFAULT_BASE_URL,
                        help="the server's address, without /v1 (default: $WARMUP_BASE_URL, "
                             "else %(default)s); credentials in it are never printed or sent")
    parser.add_argument("--model", metavar="NAME", default=env.get("WARMUP_MODEL") or None,
                        help="model name (default: $WARMUP_MODEL, else the only model in "
                             "GET /v1/models)")
    parser.add_argument("--engines", metavar="auto|LIST", type=engines_type,
                        default=env.get("WARMUP_ENGINES") or "auto",
                        help="engines of a data-parallel server to cover: auto (every engine "
                             "in /metrics' engine label; one engine: no routing header) or a "
                             "list such as 0,2, each request carrying X-data-parallel-rank "
                             "(default: $WARMUP_ENGINES, else auto)")
    parser.add_argument("--records", metavar="PATH",
                        help="JSON Lines records file, appended to (default: a new "
                             "<kind>-<run id>.jsonl in $WARMUP_RECORDS_DIR or ./warmup-records)")
    parser.add_argument("--deadline-s", metavar="S", type=seconds(), default=90.0,
                        help="the deadline from the start; nothing starts after it and a run "
                             "that ends after it fails (default: %(default)g, at most 3600)")
    parser.add_argument("--socket-cap-s", metavar="S", type=seconds(), default=60.0,
                        help="the longest any one connect, send or read waits, within the "
                             "deadline (default: %(default)g)")
    parser.add_argument("--settle-s", metavar="S", type=seconds(60.0), default=2.0,
                        help="after one of our own waves, how long a non-zero request gauge "
                             "is read again (our requests not yet counted out) before it "
                             "refuses; within the deadline (default: %(default)g)")
    parser.add_argument("--api-key-env", default="VLLM_API_KEY", metavar="NAME",
                        help="environment variable holding the API key (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary record as JSON on stdout (also on a usage "
                             "error); the human lines go to stderr")
    parser.add_argument("--debug", action="store_true",
                        help="on an internal error, print the Python traceback to stderr")


def build_parser(prog: str = "warmup.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Warm up a freshly started vLLM server: waves B1..B4 of raw completions\n"
                    "(a ~5K-token prefill, then 2, 3 and 4 requests released together), on\n"
                    "every engine; check every response; write JSON Lines records for the\n"
                    "operator to inspect. After a start: qualify.py report|probe|gate.")
    add_connection_options(parser)
    parser.add_argument("--tokens", metavar="N", type=whole(2, 4096), default=32,
                        help="completion tokens per request: max_tokens = min_tokens, 2 to "
                             "4096 (default: %(default)s)")
    parser.add_argument("--priority", metavar="N", type=whole(-(1 << 31), (1 << 31) - 1),
                        default=20,
                        help="request priority; with --scheduling-policy priority, real "
                             "traffic at 0 goes first (default: %(default)s)")
    parser.add_argument("--waves", type=waves_type, default=DEFAULT_WAVES, metavar="1,2,3,4",
                        help="client concurrency of each wave, in order: distinct depths of 1 "
                             "to 64, the first 1 (B1, the long prompt), e.g. 1,2,3,4,6,8 "
                             "(default: 1,2,3,4)")
    parser.add_argument("--b1-tokens", metavar="N", type=whole(MIN_B1_PROMPT_TOKENS,
                                                               MAX_B1_TOKENS), default=5000,
                        help="target size of B1's long prompt in tokens, more than 4096 and at "
                             "most 1048576, capped by the context; counted with the server's "
                             "/tokenize when it has one (default: %(default)s)")
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
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (waves, prompt sizes, budgets, bounds) and exit 0 "
                             "without touching the network")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_settings(argv: list[str], prog: str) -> Settings | None:
    """The command line -> Settings; None after a dry run (printed here)."""
    parser = build_parser(prog)
    args = parse_or_explain(parser, argv)
    plan = Plan(run_id=new_run_id(), waves=args.waves, tokens=args.tokens,
                priority=args.priority, b1_tokens=args.b1_tokens, deadline_s=args.deadline_s,
                socket_cap_s=args.socket_cap_s)
    settings = common_settings(parser, args, plan, prog)
    if args.dry_run:
        dry_run(plan, settings.target, args.json, args.engines)
        return None
    return settings


def parse_or_explain(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args; with --json a usage error also prints a JSON object on stdout."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None) and "--json" in argv:
            emit_usage_json("usage error (see stderr)")
        raise


def emit_usage_json(problem: str) -> None:
    """What --json prints for a usage error: a summary-shaped object, no run behind it."""
    emit(json.dumps({"record": "summary", "verdict": "fail", "exit_code": EXIT_USAGE,
                     "problems": [problem], "records": None}))


def common_settings(parser: argparse.ArgumentParser, args: argparse.Namespace, plan: Plan,
                    prog: str, **more) -> Settings:
    """Settings from the shared options; parser.error (exit 2) on a bad URL or key."""
    def fail(message: str):
        if args.json:
            emit_usage_json(message)
        parser.error(message)

    if not args.api_key_env.isidentifier():
        fail("--api-key-env must name an environment variable")
    api_key = os.environ.get(args.api_key_env) or None
    if api_key is not None and not _HEADER_VALUE.fullmatch(api_key):
        fail(f"{args.api_key_env} holds a character that is not printable ASCII (a line break?); "
             f"an API key is sent in a header and must be printable ASCII")
    try:
        target = parse_base_url(args.base_url)
        metrics_targets = tuple(parse_url(url, "--metrics-url")
                                for url in getattr(args, "metrics_url", []))
    except UsageError as exc:
        fail(str(exc))
    kind = more.pop("mode", "warmup")
    return Settings(plan=plan, target=target, api_key=api_key, api_key_env=args.api_key_env,
                    model=args.model,
                    records_path=args.records or default_records_path(plan.run_id, kind),
                    engines=args.engines, settle_s=args.settle_s,
                    metrics_targets=metrics_targets,
                    status_files=tuple(getattr(args, "status_file", [])),
                    status_wait_s=getattr(args, "status_wait_s", 15.0), json=args.json,
                    debug=args.debug, prog=prog, mode=kind, **more)


def dry_run(plan: Plan, target: Target, as_json: bool, engines: str) -> None:
    description = plan_description(plan)
    description["base_url"] = target.display
    description["engines"] = engines
    hard = os.environ.get("WARMUP_HARD_S") or "95"
    try:
        description["hard_bound_s"] = float(hard)
    except ValueError:
        description["hard_bound_s"] = None
    if as_json:
        emit(json.dumps(description, indent=2))
        return
    lines = [f"plan for {target.display} (dry run: nothing sent)"]
    for i, depth in enumerate(plan.waves):
        prompt = (f"1 long prompt of ~{plan.b1_tokens} tokens (more than "
                  f"{MIN_B1_PROMPT_TOKENS - 1}), run-unique nonce first") if i == 0 else \
            f"{depth} distinct short prompts of ~{SHORT_PROMPT_WORDS + 1} words"
        lines.append(f"  {wave_name(depth):<4} {depth} concurrent: {prompt}")
    lines.append(f"  budget: {plan.requests_total} requests, at most "
                 f"{plan.requests_total * plan.tokens} completion tokens ({plan.tokens} each, "
                 f"min = max, ignore_eos, greedy, priority {plan.priority}), per engine "
                 f"(engines: {engines})")
    lines.append(f"  bounds: deadline {plan.deadline_s:g} s, socket cap {plan.socket_cap_s:g} s, "
                 f"body cap {MAX_BODY_BYTES} bytes, hard bound {hard} s (warmup_serve.sh)")
    emit("\n".join(lines))


# ---------------------------------------------------------------------------
# Signals: every terminating signal the helper can catch ends in one 'killed' summary.
# ---------------------------------------------------------------------------

_terminating = threading.Event()
_stuck_output = threading.Event()
_as_program = threading.Event()      # main() run as the process (not called by a test)


def _raise_terminated(signum, frame):
    if _terminating.is_set():        # a second signal while the first is being handled
        return
    _terminating.set()
    raise Terminated(signum)


def install_signal_handlers() -> dict:
    previous = {}
    _terminating.clear()
    if threading.current_thread() is threading.main_thread():
        for name in CAUGHT_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:
                previous[signum] = signal.signal(signum, _raise_terminated)
    return previous


def restore_signal_handlers(previous: dict) -> None:
    """Give the signals back to their previous handlers; as a program, keep ignoring them
    instead: a second TERM arriving after the summary must not kill the process untidily."""
    if _as_program.is_set():
        for signum in previous:           # SIG_IGN survives the interpreter's exit;
            signal.signal(signum, signal.SIG_IGN)   # our handler would become SIG_DFL there
        return
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def script_exit(code: int) -> None:
    """Leave the process with `code`; a stdout nobody reads cannot hold the exit."""
    if _stuck_output.is_set():
        os._exit(code)               # flushing would wait on the reader forever
    sys.exit(code)


if __name__ == "__main__":
    script_exit(main())
