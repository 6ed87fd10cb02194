"""What a vLLM server says: learning it, guarding it, sending it batches, reading answers.

It knows vLLM's OpenAI-compatible API and its /metrics, not a program's waves or probes.
A ServerProgram (the warm-up, the probe, the gate) learns its Server, asks its Guard
before each batch and sends it with guarded_batch(); extract_fields() is the one reader
of an answer (counts and reasons, never text); server_main() the programs' one main.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from core.values import Value
from core.contract import ENGINE_HEADER, decide
from core.locks import release_server_lock, take_server_lock
from core.prompts import (MIN_LONG_PROMPT_TOKENS, long_prompt_budget, new_nonce,
                          size_long_prompt)
from core.records import ANSWER_FIELDS, clean_stop_reason, typed
from core.cli import (EXIT_FAIL, EXIT_PASS, EXIT_REFUSED, EXIT_USAGE, argument_type,
                      comma_list, given_value, seconds)
from core.runframe import (Ending, Fatal, Program, Run, late_problem, parse_or_explain, publish_usage,
                           run_session, run_settings, textfile_of, usage_error)
from core.sanitize import (MODEL_CHARS, REDACTIONS, clean_text, count_value, describe, exact_str,
                           finite_number, json_number, scrub)
from core.transport import (DEFAULT_BASE_URL, Exchange, Response, Target, TransportError,
                            UsageError, __version__, base_url_from, decode_json, encode_request,
                            exchange_batch, fetch, is_header_value)
from core.vllm_metrics import (GAUGES, GaugeSampler, GuardRead, counters, engines_in,
                               busy_gauges, exposition_of, guard_problems, process_start,
                               sleep_states, spec_positions)

ERROR_TEXT_LIMIT = 300               # a server's message, cut
METRICS_RETRY_PAUSE_S = 0.25
SETTLE_POLL_S = 0.1
REQUEST_METRIC_FIELDS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms",
                         "mean_itl_ms", "tokens_per_second")
MAX_ENGINE = 1023
NO_ROUTING = (None,)                 # the engines of a single-engine server: no header


class Connection(Value):
    """How to reach the server, fixed from the command line."""
    target: Target
    api_key: str | None
    api_key_env: str
    model: str | None                     # the model asked for; None: the only one served
    engines: tuple[int, ...] | None       # the engines asked for; None: every one (auto)
    settle_s: float = 2.0


class Server(Value):
    """What the program learned from the server before its first batch."""
    FROZEN = False
    model: str | None = None
    max_model_len: int | None = None
    version: str | None = None
    engines: tuple = NO_ROUTING           # the engines a batch covers; (None,): no routing
    process_start: float | None = None    # process_start_time_seconds: changes on a restart
    served: tuple = ()                    # the engines /metrics shows
    spec_positions: int | None = None     # the draft positions it counts: its k


class Tally(Value):
    """What the program collected so far; only the main thread touches it."""
    FROZEN = False
    requests: list                        # judged records: each has ok, problems
    problems: list
    notes: list
    warnings: list
    FRESH = {"requests": list, "problems": list, "notes": list, "warnings": list}


def routed(engines: tuple) -> tuple[int, ...] | None:
    """The engines as a run record names them: None for a single engine without routing."""
    return None if engines == NO_ROUTING else tuple(engines)


# Learning the server: what it serves, before the first batch.

def lookup(connection: Connection, run: Run, method: str, path: str,
           body: dict | None = None) -> tuple[int, object]:
    """(status, parsed JSON or None) of one small request; Fatal on transport."""
    try:
        response = fetch(connection.target, run.clock, method, path, body,
                         bearer_for(path, connection.api_key))
    except TransportError as exc:
        raise Fatal(exc.problem if exc.kind == "connect" else f"{method} {path}: {exc.problem}")
    doc, _ = decode_json(response.body)
    return response.status, doc


def fetch_metrics(connection: Connection, run: Run, purpose: str,
                  code: int = EXIT_FAIL) -> Response:
    """GET /metrics under the one retry rule of every read of it: once more after a
    transport error (a dropped connection), then Fatal(code) naming `purpose`."""
    retried = False
    while True:
        try:
            return fetch(connection.target, run.clock, "GET", "/metrics")
        except TransportError as exc:
            if retried or exc.kind == "deadline" or run.clock.remaining() <= 1:
                raise Fatal(f"{purpose}: {exc.problem}", code)
        retried = True
        time.sleep(METRICS_RETRY_PAUSE_S)


def learn_server(connection: Connection, run: Run) -> Server:
    """A healthy server's model and its context (/v1/models), its version and its engines
    (/metrics); Fatal when it is not healthy or not the server asked for."""
    display = connection.target.display
    status, _ = lookup(connection, run, "GET", "/health")
    if status == 404:
        raise Fatal(f"GET {display}/health answered HTTP 404 (is --base-url the server's "
                    f"address, with no extra path?)", EXIT_USAGE)
    if status != 200:
        raise Fatal(f"refused: {display}/health answered HTTP {status}, not 200: the server "
                    f"is not healthy; nothing was sent", EXIT_REFUSED)
    model, max_model_len = resolve_model(connection, run)
    server = Server(model=model, max_model_len=max_model_len,
                    version=server_version(connection, run))
    exposition, why = exposition_of(fetch_metrics(
        connection, run, "refused: cannot tell how many engines the server has", EXIT_REFUSED))
    if exposition is None:
        raise Fatal(f"refused: cannot tell how many engines the server has: GET "
                    f"{display}/metrics: {why}; nothing was sent (a run on fewer engines "
                    f"than the server has would leave some cold)", EXIT_REFUSED)
    samples = exposition.samples
    server.served = engines_in(samples)
    server.process_start = process_start(samples)
    server.spec_positions = spec_positions(samples)
    server.engines = choose_engines(connection, server.served)
    return server


def resolve_model(connection: Connection, run: Run) -> tuple[str, int | None]:
    """The model (and its max_model_len) from GET /v1/models."""
    wanted, display = connection.model, connection.target.display
    status, doc = lookup(connection, run, "GET", "/v1/models")
    if status == 401:
        raise Fatal(diagnose_http_error(401, None, None, connection.api_key_env,
                                        bool(connection.api_key)))
    entries = doc.get("data") if status == 200 and isinstance(doc, dict) else None
    if not isinstance(entries, list):
        if wanted:
            return wanted, None
        raise Fatal(f"cannot find the model: GET {display}/v1/models answered HTTP "
                    f"{status} without a model list (is --base-url the server's address, "
                    f"with no extra path?); pass --model or set WARMUP_MODEL", EXIT_USAGE)
    served = {e["id"]: e for e in entries
              if isinstance(e, dict) and isinstance(e.get("id"), str) and e["id"]}
    names = ", ".join(clean_text(n, 80) for n in sorted(served)[:10])
    if wanted and wanted not in served:
        raise Fatal(f"model {clean_text(wanted, 80)!r} is not served at {display}; "
                    f"served: {names or 'none'}", EXIT_USAGE)
    if not wanted and len(served) != 1:
        raise Fatal(f"the server serves {len(served)} models "
                    f"({names or 'none with an id'}); choose one with --model", EXIT_USAGE)
    model = wanted or next(iter(served))
    return model, count_value(served[model].get("max_model_len")) or None


def server_version(connection: Connection, run: Run) -> str | None:
    try:
        status, doc = lookup(connection, run, "GET", "/version")
    except Fatal:
        return None
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("version"), str):
        return clean_text(doc["version"], 64)
    return None


def choose_engines(connection: Connection, served: tuple) -> tuple:
    """The engines a batch covers: every engine /metrics shows (auto) or the ones asked
    for; NO_ROUTING for one engine: exactly the single-engine run, no header."""
    asked = connection.engines
    if asked is None:
        return served if len(served) > 1 else NO_ROUTING
    missing = [e for e in asked if e not in (served or (0,))]
    if missing:
        raise Fatal(f"--engines {format_engines(asked)}: engine "
                    f"{','.join(map(str, missing))} is not served at "
                    f"{connection.target.display} (its /metrics shows engines "
                    f"{','.join(map(str, served)) or 'none'})", EXIT_USAGE)
    return asked


def count_tokens(connection: Connection, run: Run, server: Server, prompt: str) -> int | None:
    """The server's count of a prompt's tokens (/tokenize); None without /tokenize; the
    context it tells, when /v1/models did not. Only the count is kept: the ids are dropped
    with the document."""
    status, doc = lookup(connection, run, "POST", "/tokenize",
                         {"model": server.model, "prompt": prompt})
    if status != 200:
        return None                   # no /tokenize here: estimate
    if not isinstance(doc, dict) or count_value(doc.get("count")) is None:
        raise Fatal("could not size the B1 prompt: /tokenize answered without an "
                    "integer count; no completion was sent")
    if server.max_model_len is None:
        server.max_model_len = count_value(doc.get("max_model_len")) or None
    return doc["count"]


def size_long_prompts(connection: Connection, run: Run, server: Server, target_tokens: int,
                      tokens: int, chunk: int) -> dict:
    """One long prompt per engine, each with its own nonce, sized with /tokenize to at
    most `target_tokens`, longer than `chunk` (or the longest the context holds:
    prompts.b1_bounds), and room for `tokens` more: engine -> (prompt, counted or None
    when estimated)."""
    def counted(prompt: str) -> int | None:
        return count_tokens(connection, run, server, prompt)
    budget, minimum = long_prompt_budget(target_tokens, tokens, chunk, server.max_model_len)
    prompts = {}
    for engine in server.engines:
        nonce = new_nonce()
        REDACTIONS.tag(nonce)
        prompt, count = size_long_prompt(counted, nonce, budget, minimum)
        tighter = long_prompt_budget(target_tokens, tokens, chunk, server.max_model_len)
        if tighter[0] < budget:       # /tokenize told a smaller context than /v1/models did
            budget, minimum = tighter
            prompt, count = size_long_prompt(counted, nonce, budget, minimum)
        prompts[engine] = (prompt, count)
    return prompts


# The guard: is the server idle before a batch?

class Guard:
    """Reads /metrics before each batch (settling after our own) and records the gauges;
    keeps what it read: the counters before the last batch and before the first, how long
    each settled read waited, and the refusals."""

    def __init__(self, connection: Connection, engines: tuple | None):
        self.connection = connection
        self.engines = engines                # routed(): None for one engine, no routing
        self.counters_before: dict | None = None   # counters of the last read
        self.first_counters: dict | None = None    # counters of the first read
        self.settled_s: list = []                  # how long each settled read waited
        self.refusal: list = []

    def check(self, run: Run, label: str, settle: bool) -> bool:
        """Read /metrics before a batch and record the gauges; False = refused.

        With `settle`, a busy gauge right after our own batch is read again for up to
        --settle-s (within the deadline) before it counts as foreign work.
        """
        read, settle_s = self.settled_read(run, label, settle)
        self.counters_before = read.counters              # this batch's "before"
        if read.counters is not None and self.first_counters is None:
            self.first_counters = read.counters           # before the first batch
        run.write({
            "record": "gauges", "run_id": run.settings.run_id, "wave": label,
            "at_s": round(run.clock.elapsed(), 4), "ok": read.ok,
            "samples": [{"name": n, "labels": lab, "value": json_number(v)}
                        for n, lab, v in read.samples if n in GAUGES],
            "fresh_engines": read.fresh, "settle_s": settle_s, "problems": read.problems,
            "sleep_state": sleep_states(read.samples) or None,
        })
        if not read.ok:
            waited_for = "" if settle_s is None else f" (still after {settle_s:g} s of settling)"
            self.refusal += [f"refused before {label}: {p}{waited_for}" for p in read.problems]
        return read.ok

    def settled_read(self, run: Run, label: str, settle: bool
                     ) -> tuple[GuardRead, float | None]:
        """A guard read of /metrics; with `settle`, a busy gauge (our own requests not yet
        counted out) is read again for up to --settle-s, within the deadline. Returns the
        read and how long it settled (None when it did not wait)."""
        started = run.clock.elapsed()
        read = self.read(run, label)
        limit = started + self.connection.settle_s
        waited = False
        while settle and not read.ok and read.busy_only \
                and run.clock.elapsed() + SETTLE_POLL_S <= limit \
                and run.clock.remaining() > SETTLE_POLL_S:
            time.sleep(SETTLE_POLL_S)
            waited = True
            read = self.read(run, label)
        settle_s = round(run.clock.elapsed() - started, 4) if waited else None
        if waited and read.ok:                # counted in the summary's settled_s
            self.settled_s.append(settle_s)
        return read, settle_s

    def counters_after(self, run: Run, label: str) -> tuple[dict | None, str | None]:
        """The counters right after a batch, read once our requests are counted out (as the
        guard settles, and counted in the summary's settled_s); (None, why) when /metrics
        cannot be read: evidence, never fatal."""
        try:
            read, _ = self.settled_read(run, label, settle=True)
        except Fatal as exc:
            return None, exc.problem
        return (read.counters, None) if read.counters is not None else \
            (None, "; ".join(read.problems) or "no counters")

    def read(self, run: Run, label: str) -> GuardRead:
        """GET /metrics (fetch_metrics) and the guard's decision on it."""
        exposition, why = exposition_of(fetch_metrics(self.connection, run,
                                                      f"guard before {label}"))
        if exposition is None:
            return GuardRead(False, [f"guard cannot be read: GET "
                                     f"{self.connection.target.display}/metrics: {why}"],
                             [], None)
        problems, fresh = guard_problems(exposition, self.engines)
        return GuardRead(not problems, problems, exposition.samples,
                         counters(exposition.samples, exposition.declared), fresh,
                         busy_only=set(problems) <= set(busy_gauges(exposition)))


# A program against one server: a learned Server and a Guard.

class ServerProgram(Program):
    """A program against one vLLM server: the server learned (learn_server()), a Guard
    before each batch, the batches it sends. Subclasses give steps(), plan_fields() and
    planned_per_engine(); the judgement (contract.decide()), the run record and the
    summary's counts are shared."""

    def __init__(self, connection: Connection):
        self.connection = connection
        self.server = Server()
        self.guard = Guard(connection, None)
        self.tally = Tally()
        self.observed: dict | None = None          # what the last batch's sampler saw
        self.batch_ended_at: float | None = None   # when the last batch's requests ended
        self.lock: int | None = None               # the server's lock, held for the run
        self.verdict = None                        # contract.decide()'s, once judged
        REDACTIONS.secret(connection.api_key)
        REDACTIONS.secret(connection.target.credentials)

    # -- what a subclass says ------------------------------------------------

    def plan_fields(self) -> dict:
        """The plan as recorded in the run record (sizes and bounds, never prompt text)."""
        return {}

    def planned_per_engine(self) -> int:
        return 0

    # -- the server and its batches --------------------------------------------

    def learn_server(self, run: Run) -> None:
        """The server to ourselves (a lock per address on this host), then learned."""
        self.lock = take_server_lock(self.connection.target)
        self.server = learn_server(self.connection, run)
        self.guard = Guard(self.connection, routed(self.server.engines))

    def size_long_prompts(self, run: Run, target_tokens: int, tokens: int,
                          chunk: int = MIN_LONG_PROMPT_TOKENS - 1) -> dict:
        return size_long_prompts(self.connection, run, self.server, target_tokens, tokens,
                                 chunk)

    def make_slot(self, kind_, index: int, rid: str, engine: int | None, prompt: str,
                  tokens: int, priority: int, template_kwargs: dict | None,
                  tagged: bool = True) -> Slot:
        """One request of a kind (kinds.py), encoded now: the routing header only when
        engines are routed, the key only where vLLM wants it. Its prompt is registered with
        the sinks' redactions first (`tagged`: the prompt's first word is a nonce or tag, a
        secret of its own)."""
        body = kind_.build(self.server.model, prompt, rid, tokens, priority, template_kwargs)
        prompts = [body.get("prompt")] + [m.get("content") for m in body.get("messages", ())
                                          if isinstance(m, dict)]
        for text in prompts:
            if isinstance(text, str):
                REDACTIONS.prompt(text, tag=tagged)
        headers = {} if engine is None else {ENGINE_HEADER: str(engine)}
        payload = encode_request(self.connection.target, "POST", kind_.endpoint, body,
                                 bearer_for(kind_.endpoint, self.connection.api_key), headers)
        return Slot(index, rid, Exchange(payload, FIRST_TEXT if kind_.stream else None),
                    engine=engine)

    def guarded_batch(self, run: Run, label: str, slots: list[Slot], first: bool,
                      observe_ms: float = 0) -> list[Slot] | None:
        """Guard (a busy gauge after our own batch read again for --settle-s), release the
        slots together, collect; None when the guard refused. With observe_ms, the gauges
        read that often while it runs (self.observed)."""
        if not self.guard.check(run, label, settle=not first):
            return None
        run.current = label

        def still_running(seconds: float, finished: int) -> None:
            run.say(f"{label}: still running after {seconds:.0f} s ({finished} of "
                    f"{len(slots)} requests answered)")

        sampler = GaugeSampler(self.connection.target, run.clock, observe_ms / 1000,
                               routed(self.server.engines)) if observe_ms else None
        if sampler:
            sampler.start()
        finished = release_batch(self.connection.target, run.clock, slots, still_running)
        self.batch_ended_at = run.clock.elapsed()     # before the sampler's last read ends
        self.observed = sampler.stop() if sampler else None
        run.current = None
        return finished

    def diagnose(self, fields: dict) -> str:
        """Why a non-200 answer happened, with this connection's API key variable."""
        return diagnose_http_error(fields["http_status"], fields.get("error"),
                                   fields.get("error_param"), self.connection.api_key_env,
                                   bool(self.connection.api_key))

    # -- the run-frame interface -----------------------------------------------

    def planned(self) -> int:
        return self.planned_per_engine() * len(self.server.engines)

    def run_fields(self, run: Run) -> dict:
        plan = dict(self.plan_fields())
        plan.update(requests_per_engine=self.planned_per_engine(),   # one name, one
                    requests_total=self.planned())                   # meaning each
        engines = routed(self.server.engines)
        return {
            "base_url": self.connection.target.display,
            "model": clean_text(self.server.model, MODEL_CHARS) if self.server.model else None,
            "max_model_len": self.server.max_model_len,
            "engines": list(engines) if engines else None,
            "plan": plan,
            "versions": {"helper": __version__, "python": sys.version.split()[0],
                         "server": self.server.version},
            "process_start_time_seconds": self.server.process_start,
            "spec_positions": self.server.spec_positions,
            "api_key_env": self.connection.api_key_env,
            "api_key_set": bool(self.connection.api_key),
        }

    def judge(self, run: Run, ending: Ending) -> tuple[str, int, list[str]]:
        """contract.decide() on the records this run wrote, with how its steps ended:
        steps that ended by themselves (their problems, a guard's refusal, late), or
        stopped (a refusal, a usage error, a signal, a defect) after what was said so far."""
        said = tuple(self.tally.problems)
        refusal = tuple(self.guard.refusal)
        if ending.verdict != "pass":
            ending = ending.replace(problems=said + refusal + ending.problems)
        else:
            problems = said + ending.problems + tuple(late_problem(run))
            ending = Ending("fail", EXIT_FAIL, problems + refusal) if refusal and problems \
                else Ending("refused", EXIT_REFUSED, refusal) if refusal \
                else Ending(problems=problems)
        self.verdict = decide(run.run_record and typed(run.run_record),
                              [typed(r) for r in run.written], ending)
        return self.verdict.verdict, self.verdict.exit_code, list(self.verdict.problems)

    def summary_fields(self, run: Run) -> dict:
        """The counts of the verdict judge() made (contract.decide()) and what was said."""
        tally = self.tally
        return {"requests_ok": self.verdict.requests_ok,
                "requests_total": self.planned(), "requests_ran": len(tally.requests),
                "notes": list(self.verdict.notes) + tally.notes, "warnings": tally.warnings,
                "settled_s": self.guard.settled_s}

    def close(self) -> None:
        """Let the server's lock go, its file removed (release_server_lock)."""
        if self.lock is not None:
            release_server_lock(self.lock, self.connection.target)
            self.lock = None


# A batch with routing: slots over transport.exchange_batch.

class Slot(Value):
    """One request of a batch: who it is for, and its Exchange (its bytes, and what the
    client thread saw of them, in the run's clock)."""
    index: int
    request_id: str
    exchange: Exchange
    engine: int | None = None


# A server-sent event whose choice carries non-empty text: the first token has arrived.
FIRST_TEXT = re.compile(rb'"(?:text|content)":\s*"(?:[^"\\]|\\.)')


def release_batch(target: Target, clock, slots: list[Slot], still_running=None) -> list[Slot]:
    """Release the slots together (transport.exchange_batch); each slot as it ended."""
    done = exchange_batch(target, clock, [slot.exchange for slot in slots], still_running)
    return [slot.replace(exchange=ex) for slot, ex in zip(slots, done)]


def bearer_for(path: str, api_key: str | None) -> str | None:
    """vLLM's rule: only paths under /v1 take the API key (/health, /metrics, /tokenize and
    /version stay open); the key goes nowhere else."""
    return api_key if path.startswith("/v1/") else None


# Reading an answer: counts and reasons, never text or ids; the run's verdict.

def release_skew_ms(slots: list[Slot]) -> float | None:
    sent = [s.exchange.sent_at for s in slots if s.exchange.sent_at is not None]
    return round((max(sent) - min(sent)) * 1000, 3) if sent else None


def slot_timing(slot: Slot) -> dict:
    """A finished slot's HTTP status, transport error and times: shared by every record."""
    ex = slot.exchange
    latency = (ex.done_at - ex.sent_at) \
        if ex.sent_at is not None and ex.done_at is not None else None
    return {
        "http_status": ex.response.status if ex.response is not None else None,
        "transport_error": None if ex.response is not None else
        (ex.error.problem if ex.error else "no response"),
        "latency_s": None if latency is None else round(latency, 4),
        "sent_at_s": None if ex.sent_at is None else round(ex.sent_at, 4),
    }


def read_slot(slot: Slot) -> dict:
    """What one client got, as the judge reads it: the answer's fields (a stream's too,
    and whether token text arrived), or its transport error."""
    response = slot.exchange.response
    if response is None:
        return {"http_status": None, "transport_error": slot_timing(slot)["transport_error"]}
    if slot.exchange.watch is None:         # not streamed
        return extract_fields(response.status, response.body)
    answer = extract_stream_fields(response.status, response.body)
    if response.status == 200:
        answer["first_token"] = response.watched_at is not None
    return answer


def answer_record(answer: dict) -> dict:
    """The fields every record of a request keeps of its answer, enough to judge it again:
    counts, reasons and shape, never text."""
    record = {name: answer.get(name) for name in ANSWER_FIELDS}
    record.update(choices=answer.get("n_choices"), usage=bool(answer.get("usage")),
                  usage_problems=list(answer.get("usage_problems") or ()),
                  error=answer.get("error") or answer.get("transport_error"))
    return record


def extract_fields(status: int, body: bytes) -> dict:
    """The one reader of response bodies: the counts and reasons, sanitized; never text or ids."""
    fields = {"http_status": status, "body_error": None, "error": None, "error_param": None,
              "n_choices": None, "usage": False, "prompt_tokens": None, "cached_tokens": None,
              "completion_tokens": None, "reasoning_tokens": None, "finish_reason": None,
              "stop_reason": None, "metrics": None, "speculative_decoding": None,
              "usage_problems": [], "logprobs_count": None}
    doc, why = decode_json(body)
    if why is not None:
        fields["body_error"] = f"{why} in the response body"
        if status != 200:
            fields["error"] = scrub(body.decode("utf-8", "replace"), ERROR_TEXT_LIMIT) or None
        return fields
    if not isinstance(doc, dict):
        fields["body_error"] = "response body is JSON but not an object"
        return fields
    if status != 200:
        fields["error"], fields["error_param"] = _error_message(doc)
        return fields
    choices = doc.get("choices")
    if isinstance(choices, list):
        fields["n_choices"] = len(choices)
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        fields["finish_reason"] = exact_str(choice.get("finish_reason"), 32)
        fields["stop_reason"] = clean_stop_reason(choice.get("stop_reason"))
        fields["logprobs_count"] = logprobs_count(choice.get("logprobs"))
    usage = doc.get("usage")
    if isinstance(usage, dict):
        fields["usage"] = True
        counts, fields["usage_problems"] = read_usage(usage)
        fields.update(counts)
    metrics = doc.get("metrics")
    if isinstance(metrics, dict):
        fields["metrics"] = {k: finite_number(metrics.get(k))
                             for k in REQUEST_METRIC_FIELDS}
        fields["speculative_decoding"] = _numbers_only(metrics.get("speculative_decoding"))
    return fields


def logprobs_count(logprobs) -> int | None:
    """How many positions a choice's log-probabilities cover (completions: token_logprobs;
    chat: content), or None. They carry generated tokens as text: only counted, never
    read."""
    if not isinstance(logprobs, dict):
        return None
    entries = logprobs.get("token_logprobs", logprobs.get("content"))
    return len(entries) if isinstance(entries, list) else None


def extract_stream_fields(status: int, body: bytes) -> dict:
    """extract_fields for a streamed answer (server-sent events): the finish and stop
    reasons of the event that finished the choice, the last event's usage, the
    log-probabilities counted over the events, whether [DONE] came. Never the text."""
    if status != 200:
        return extract_fields(status, body)
    fields = extract_fields(status, b'{"choices": []}')
    fields.update(n_choices=None, stream_done=False)
    logprobs = None
    for line in body.split(b"\n"):
        line = line.strip()
        if line == b"data: [DONE]":
            fields["stream_done"] = True
        if not line.startswith(b"data: {"):
            continue
        event, why = decode_json(line[6:])
        if not isinstance(event, dict):
            fields["body_error"] = f"{why or 'not an object'} in an event of the stream"
            continue
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            fields["n_choices"] = max(fields["n_choices"] or 0, 1 + (
                choice.get("index") if isinstance(choice.get("index"), int) else 0))
            if choice.get("finish_reason") is not None:
                fields["finish_reason"] = exact_str(choice.get("finish_reason"), 32)
                fields["stop_reason"] = clean_stop_reason(choice.get("stop_reason"))
            counted = logprobs_count(choice.get("logprobs"))
            if counted is not None:
                logprobs = (logprobs or 0) + counted
        if isinstance(event.get("usage"), dict):
            fields["usage"] = True
            counts, fields["usage_problems"] = read_usage(event["usage"])
            fields.update(counts)
    fields["logprobs_count"] = logprobs
    return fields


USAGE_COUNTS = (("prompt_tokens", ("prompt_tokens",)),
                ("completion_tokens", ("completion_tokens",)),
                ("cached_tokens", ("prompt_tokens_details", "cached_tokens")),
                ("reasoning_tokens", ("completion_tokens_details", "reasoning_tokens")))

def read_usage(usage) -> tuple[dict, list[str]]:
    """The counts of a usage object (None where not reported, never 0) and a problem per
    value that is not a count, naming its type, never quoting it; `usage_bad` names those
    counts."""
    counts, problems = {"usage_bad": []}, []
    for name, path in USAGE_COUNTS:
        value = usage
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        counts[name] = count_value(value)
        if value is not None and counts[name] is None:
            problems.append(f"usage {name} is not a count: {describe(value)}")
            counts["usage_bad"].append(name)
    return counts, problems


def _numbers_only(value) -> dict | None:
    """Per-request speculative metrics: numeric fields (and short numeric lists) only."""
    if not isinstance(value, dict):
        return None
    kept = {}
    for key, item in list(value.items())[:32]:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_]{1,64}", key):
            continue                      # a field name, or nothing: never a server's text
        if isinstance(item, list):
            kept[key] = [finite_number(x) for x in item[:64]]
        else:
            kept[key] = finite_number(item)
    return kept


def _error_message(doc: dict) -> tuple[str | None, str | None]:
    error = doc.get("error", doc.get("detail", doc.get("message")))
    if isinstance(error, dict):
        param = error.get("param")
        return (scrub(str(error.get("message", "")), ERROR_TEXT_LIMIT) or None,
                clean_text(param, 64) if isinstance(param, str) else None)
    if error is None:
        return None, None
    text = error if isinstance(error, str) else str(error)
    return scrub(text, ERROR_TEXT_LIMIT) or None, None


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
                f"--scheduling-policy priority (--priority 0 would pass a custom plan, not "
                f"the contract's){said}")
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


# The command line every program against a server shares.

ENVIRONMENT_HELP = """\
environment:
  WARMUP_BASE_URL     default for --base-url
  WARMUP_MODEL        default for --model
  WARMUP_ENGINES      default for --engines
  WARMUP_RECORDS_DIR  where the default records file goes (else ./warmup-records/)
  WARMUP_TEXTFILE     default for --textfile
  WARMUP_LOCK_DIR     where the per-server lock files are (default: the temporary
                      folder, $TMPDIR or /tmp): one folder for every helper on the
                      host; a run removes its file when it ends
  VLLM_API_KEY        the API key, sent as "Authorization: Bearer" to /v1 paths only;
                      never printed or recorded (another variable: --api-key-env)
"""


def parse_engines(text: str) -> tuple[int, ...] | None:
    """'auto' -> None (every engine the server has); '0,2' -> (0, 2): distinct indexes.
    The one parser of an engine list; ValueError says what is wrong."""
    if text.strip() == "auto":
        return None
    engines = comma_list(text, int, "auto or distinct engine indexes separated by commas, "
                                    "such as 0,1")
    if any(e < 0 or e > MAX_ENGINE for e in engines):
        raise ValueError(f"engine indexes must be from 0 to {MAX_ENGINE}; got {text!r}")
    return engines


def format_engines(engines: tuple[int, ...] | None) -> str:
    """The engines as an operator writes them: auto, or 0,2."""
    return "auto" if engines is None else ",".join(map(str, engines))


def template_kwargs_type(text: str) -> dict:
    """An argparse type: a JSON object passed to the chat template."""
    doc, why = decode_json(text.encode("utf-8", "replace"))
    if why is not None or not isinstance(doc, dict):
        raise argparse.ArgumentTypeError('must be a JSON object such as '
                                         '{"enable_thinking": false}')
    return doc


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """The options every program that talks to the server shares (warm-up, probe, gate).
    Defaults from the environment are checked by connection_from(), which names the
    variable when one is bad."""
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help=f"the server's address, without /v1 (default: $WARMUP_BASE_URL, "
                             f"else {DEFAULT_BASE_URL}); credentials in it are never printed "
                             f"or sent")
    parser.add_argument("--model", metavar="NAME", default=None,
                        help="model name (default: $WARMUP_MODEL, else the only model in "
                             "GET /v1/models)")
    parser.add_argument("--engines", metavar="auto|LIST", type=argument_type(parse_engines),
                        default=argparse.SUPPRESS,
                        help="engines of a data-parallel server to cover: auto (every engine "
                             "in /metrics' engine label; one engine: no routing header) or a "
                             "list such as 0,2, each request carrying X-data-parallel-rank "
                             "(default: $WARMUP_ENGINES, else auto)")
    parser.add_argument("--settle-s", metavar="S", type=seconds(60.0), default=2.0,
                        help="after one of our own batches, how long a non-zero request gauge "
                             "is read again (our requests not yet counted out) before it "
                             "refuses; within the deadline (default: %(default)g)")
    parser.add_argument("--api-key-env", default="VLLM_API_KEY", metavar="NAME",
                        help="environment variable holding the API key (default: %(default)s)")


def server_main(parser: argparse.ArgumentParser, argv: list[str], prog: str, mode: str,
                build) -> int:
    """The one main of the programs that talk to a server (warm-up, probe, gate): parse
    the options, make the run's settings, build(args, settings) -> (program, print_plan)
    (UsageError: exit 2 naming it), then print the dry run or run the program. A usage
    error is published to the textfile too (verdict 'usage'): every run begun says so."""
    try:
        args = parse_or_explain(parser, argv)
    except SystemExit as exc:             # argparse: --help, --version, a usage error
        return usage_exit(exc, mode, textfile_of(argv) if "--dry-run" not in argv else None)
    try:
        try:
            settings = run_settings(args, prog, mode)
            program, print_plan = build(args, settings)
        except UsageError as exc:
            usage_error(parser, args.json, str(exc))
    except SystemExit as exc:
        return usage_exit(exc, mode, None if args.dry_run else args.textfile)
    if args.dry_run:
        print_plan()
        return EXIT_PASS
    return run_session(program.settings, program)


def usage_exit(exc: SystemExit, mode: str, textfile: str | None) -> int:
    """argparse's exit as a status; a usage error (2) is published to the textfile."""
    code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if code == EXIT_USAGE and textfile:
        publish_usage(mode, textfile)
    return code


def connection_from(args: argparse.Namespace) -> Connection:
    """The Connection from add_server_options' options and the environment; UsageError
    naming the flag, or the variable when the bad value came from the environment."""
    env = os.environ
    if not args.api_key_env.isidentifier():
        raise UsageError("--api-key-env must name an environment variable")
    api_key = env.get(args.api_key_env) or None
    if api_key is not None and not is_header_value(api_key):
        raise UsageError(f"{args.api_key_env} holds a character that is not printable ASCII "
                         f"(a line break?); an API key is sent in a header and must be "
                         f"printable ASCII")
    target = base_url_from(args.base_url)
    engines = args.engines if hasattr(args, "engines") else \
        given_value(None, "", "WARMUP_ENGINES", parse_engines, None)[0]   # --engines auto wins
    return Connection(target=target, api_key=api_key, api_key_env=args.api_key_env,
                      model=args.model or env.get("WARMUP_MODEL") or None, engines=engines,
                      settle_s=args.settle_s)
