#!/usr/bin/env python3
"""Warm up a freshly started vLLM server, and leave records that prove it ran.

The first requests a new server sees pay one-time costs (a long chunked prefill,
decode and speculative draft/verify at batch depths 1-4, lazily compiled kernels).
This helper pays them on purpose, in waves B1..B4, inside hard time bounds, and
writes JSON Lines records that an operator reads before releasing producers.

Standard library only: copy this one file onto a host and run it with python3 3.10+.
The contract is SPEC.md; the README explains the options and the records.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

__version__ = "1.0.0"

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_TERMINATED = 143
EXIT_INTERRUPTED = 130

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_WAVES = (1, 2, 3, 4)
MIN_B1_PROMPT_TOKENS = 4097          # B1 must prefill more than 4096 tokens
MAX_BODY_BYTES = 4 << 20             # no answer we read is larger; a bigger one is an error
MAX_HEADER_BYTES = 64 << 10
ERROR_TEXT_LIMIT = 300
STOP_REASON_LIMIT = 64
METRICS_RETRY_PAUSE_S = 0.25
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
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


class Terminated(BaseException):
    """Raised in the main thread by the SIGTERM/SIGINT handler."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


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
        return sum(self.waves)


def wave_name(depth: int) -> str:
    return f"B{depth}"


def parse_waves(text: str) -> tuple[int, ...]:
    """'1,2,3,4' -> (1, 2, 3, 4); distinct positive depths, the first of them 1."""
    try:
        depths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--waves wants depths separated by commas, such as 1,2,3,4; got {text!r}")
    if any(d < 1 or d > 64 for d in depths):
        raise ValueError(f"--waves depths must be between 1 and 64; got {text!r}")
    if len(set(depths)) != len(depths):
        raise ValueError(f"--waves depths must be distinct; got {text!r}")
    if depths[0] != 1:
        raise ValueError(f"--waves must start with 1 (B1, the long-prompt wave); got {text!r}")
    return depths


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(3).hex()


def request_id(run_id: str, depth: int, index: int) -> str:
    return f"warmup-{run_id}-{wave_name(depth)}-{index}"


# Common short English words: about one token each in the usual BPE vocabularies, so
# an unsized prompt of N words is N to 1.5 N tokens.
_WORDS = (
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


def long_prompt(nonce: str, n_words: int) -> str:
    """B1's prompt: the run's nonce first (so no cached prefix matches), then filler."""
    rng = random.Random(nonce)
    return nonce + " " + " ".join(rng.choice(_WORDS) for _ in range(n_words))


def short_prompt(run_id: str, depth: int, index: int) -> str:
    """A distinct prompt of a few tens of tokens; its first word differs per request."""
    rng = random.Random(f"{run_id}/{depth}/{index}")
    tag = f"{rng.getrandbits(48):012x}"
    return tag + " " + " ".join(rng.choice(_WORDS) for _ in range(24))


def completion_body(model: str, prompt: str, rid: str, plan: Plan) -> dict:
    """The exact sampling fields of SPEC section 3: greedy, min = max tokens, EOS ignored."""
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


def size_long_prompt(count, nonce: str, budget: int) -> tuple[str, int | None]:
    """Size B1 to `budget` tokens with `count(prompt) -> int | None` (the server's /tokenize).

    Returns the prompt and its counted size, or an estimated prompt and None when the
    server cannot count. Never returns a counted prompt above the budget.
    """
    n_words = max(1, math.ceil(budget * EST_WORDS_PER_TOKEN))
    low = max(MIN_B1_PROMPT_TOKENS, int(budget * 0.97))
    best = None
    for _ in range(6):
        prompt = long_prompt(nonce, n_words)
        counted = count(prompt)
        if counted is None:
            return prompt, None
        if counted <= budget:
            best = (prompt, counted)
            if counted >= low:
                return best
        # Tokens grow about linearly in words: aim just under the budget.
        n_words = max(1, int(n_words * (budget - 8) / max(counted, 1)))
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
        "short_prompt_words": 25,
        "deadline_s": plan.deadline_s,
        "socket_cap_s": plan.socket_cap_s,
        "max_body_bytes": MAX_BODY_BYTES,
    }


# ---------------------------------------------------------------------------
# The guard: parse Prometheus text, decide whether the server is idle.
# ---------------------------------------------------------------------------

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_prometheus(text: str) -> tuple[list[tuple[str, dict, float]], int]:
    """Prometheus text format 0.0.4 -> ([(name, labels, value)], count of unparsable lines)."""
    samples, bad = [], 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(_parse_sample(line))
        except (ValueError, IndexError):
            bad += 1
    return samples, bad


def _parse_sample(line: str) -> tuple[str, dict, float]:
    match = _METRIC_NAME.match(line)
    if not match:
        raise ValueError(line)
    name, pos, labels = match.group(), match.end(), {}
    if pos < len(line) and line[pos] == "{":
        labels, pos = _parse_labels(line, pos + 1)
    if pos < len(line) and not line[pos].isspace():
        raise ValueError(line)
    rest = line[pos:].split()
    if len(rest) not in (1, 2):          # value, then an optional timestamp
        raise ValueError(line)
    if len(rest) == 2:
        int(rest[1])
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
            raise ValueError(line)
        key, pos = match.group(), match.end()
        while line[pos] in " \t":
            pos += 1
        if line[pos] != "=" or line[pos + 1] != '"':
            raise ValueError(line)
        pos, chars = pos + 2, []
        while line[pos] != '"':
            if line[pos] == "\\":
                pos += 1
                chars.append(_LABEL_ESCAPES.get(line[pos], "\\" + line[pos]))
            else:
                chars.append(line[pos])
            pos += 1
        labels[key] = "".join(chars)
        pos += 1
        while line[pos] in " \t":
            pos += 1
        if line[pos] == ",":
            pos += 1
        elif line[pos] != "}":
            raise ValueError(line)


def format_sample(name: str, labels: dict, value: float) -> str:
    return f"{series_key(name, labels)} = {value!r}"


def guard_problems(samples: list[tuple[str, dict, float]]) -> list[str]:
    """Both request gauges must exist and every series of each must be 0 (NaN is not 0)."""
    problems = []
    for gauge in GAUGES:
        series = [(labels, value) for name, labels, value in samples if name == gauge]
        if not series:
            problems.append(f"{gauge} missing from /metrics (metrics collection off, "
                            f"or not a vLLM server): the guard cannot see other work")
        for labels, value in series:
            if value != 0:
                problems.append(f"{format_sample(gauge, labels, value)}: the server is not idle")
    return problems


# ---------------------------------------------------------------------------
# Counters and status files: what moved during the warm-up (pure).
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


def _sum_of(deltas: dict, name: str) -> float | None:
    values = [v for k, v in deltas.items() if series_name(k) == name]
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


def flatten_numbers(doc, prefix: str = "") -> dict[str, float]:
    """A status document's numeric fields as dotted keys (booleans are not numbers)."""
    found = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.update(flatten_numbers(value, f"{prefix}{clean_text(str(key), 64)}."))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool) and math.isfinite(doc):
        found[prefix[:-1]] = doc
    return found


def status_delta(before: dict | None, after: dict | None, why_missing: str | None = None) -> dict:
    """Numeric deltas of a status file; 'invalid' when its identity (pid, session) changed."""
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
    return {"state": "valid", "why": None, "delta": delta}


# ---------------------------------------------------------------------------
# HTTP over a bare socket: every connect, send and read bounded by the deadline.
# (http.client's timeout is per read, so a trickling server could hold it forever.)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str                 # base path without trailing slash
    credentials: str | None   # user:password from the URL: never printed, never sent

    @property
    def display(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def parse_url(text: str, option: str = "--base-url") -> Target:
    """http(s)://[user:pass@]host[:port][/path] -> Target; UsageError otherwise."""
    try:
        parts = urllib.parse.urlsplit(text.strip())
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"{option} is not a valid URL: {exc}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{option} must look like http://HOST:PORT/PATH")
    if parts.query or parts.fragment:
        raise UsageError(f"{option} must not carry a query or a fragment")
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


def encode_request(target: Target, method: str, path: str, body: dict | None,
                   api_key: str | None) -> bytes:
    """The request's bytes; the key goes only to paths under /v1 (SPEC section 3)."""
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {target.path}{path} HTTP/1.1",
             f"Host: {target.host}:{target.port}",
             f"User-Agent: offload-warmup/{__version__}",
             "Accept: application/json",
             "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    if api_key and path.startswith("/v1/"):
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


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
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
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

    With `watch`, also note (in the clock's time) when the pattern first arrives in the
    body: the first generated text of a stream, for time-to-first-token.
    """
    buf = bytearray()
    head = None
    watched_at, searched = None, 0
    while True:
        if head is None:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head = _parse_head(bytes(buf[:end]), max_body)
                del buf[:end + 4]
            elif len(buf) > MAX_HEADER_BYTES:
                raise TransportError("malformed", "malformed HTTP response: headers too large")
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


def _parse_head(raw: bytes, max_body: int) -> tuple[int, dict]:
    lines = raw.decode("latin-1").split("\r\n")
    match = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    if not match:
        raise TransportError("malformed", "malformed HTTP response: no status line")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise TransportError("malformed", "malformed HTTP response: bad Content-Length")
        if int(length) > max_body:
            raise TransportError("too_large", f"response body of {int(length)} bytes is larger "
                                 f"than the {max_body} bytes the helper reads; read stopped")
    return int(match.group(1)), headers


def _reads_to_close(headers: dict) -> bool:
    return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")


def _complete_body(head: tuple[int, dict], buf: bytearray, max_body: int) -> bytes | None:
    status, headers = head
    if len(buf) > max_body + MAX_HEADER_BYTES:
        raise TransportError("too_large", f"response body larger than the {max_body} bytes the "
                             f"helper reads; read stopped")
    if status in (204, 304) or 100 <= status < 200:
        return b""
    if "chunked" in headers.get("transfer-encoding", ""):
        return decode_chunked(bytes(buf)) if buf.endswith(b"\r\n\r\n") else None
    if "content-length" in headers:
        length = int(headers["content-length"])
        return bytes(buf[:length]) if len(buf) >= length else None
    return None


def decode_chunked(data: bytes) -> bytes | None:
    """Chunked transfer coding -> body, or None while the terminating chunk is missing."""
    body, pos = bytearray(), 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return None
        try:
            size = int(data[pos:end].split(b";")[0], 16)
        except ValueError:
            raise TransportError("malformed", "malformed HTTP response: bad chunk size")
        if size == 0:
            return bytes(body) if data.find(b"\r\n\r\n", end) >= 0 else None
        if len(data) < end + 2 + size + 2:
            return None
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


def fetch_json(target: Target, clock: Clock, method: str, path: str, body: dict | None = None,
               api_key: str | None = None) -> tuple[int, object]:
    """(status, parsed JSON or None) for the small lookups before the waves."""
    response = fetch(target, clock, method, path, body, api_key)
    try:
        return response.status, json.loads(response.body)
    except ValueError:
        return response.status, None


# ---------------------------------------------------------------------------
# One wave: connect every client, release them together at a barrier, read under
# the deadline. Threads are daemons: a stuck one never keeps the process alive.
# ---------------------------------------------------------------------------

@dataclass
class Slot:
    """One request of a wave: what the client thread did, in the helper's clock."""
    index: int
    request_id: str
    payload: bytes
    sent_at: float | None = None
    done_at: float | None = None
    response: Response | None = None
    error: TransportError | None = None
    stream: bool = False                # a probe's streaming request: note its first token


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
    finally:
        slot.done_at = clock.elapsed()
        if sock is not None:
            sock.close()


def run_wave(target: Target, clock: Clock, slots: list[Slot]) -> list[Slot]:
    """Run one wave; the main thread waits on the clients only until the deadline."""
    barrier = threading.Barrier(len(slots))
    threads = [threading.Thread(target=_client, args=(target, clock, slot, barrier),
                                name=f"warmup-{slot.request_id}", daemon=True) for slot in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(clock.remaining(), 0))
    finished = []
    for thread, slot in zip(threads, slots):
        if thread.is_alive():        # still reading at the deadline: abandon it
            slot = Slot(slot.index, slot.request_id, b"", slot.sent_at, clock.elapsed(),
                        None, TransportError("deadline", clock.deadline_problem()), slot.stream)
            barrier.abort()
        finished.append(slot)
    return finished


# A server-sent event whose choice carries non-empty text: the first token has arrived.
FIRST_TEXT = re.compile(rb'"text":\s*"(?:[^"\\]|\\.)')


def release_skew_ms(slots: list[Slot]) -> float | None:
    sent = [slot.sent_at for slot in slots if slot.sent_at is not None]
    return round((max(sent) - min(sent)) * 1000, 3) if sent else None


# ---------------------------------------------------------------------------
# The judge: response -> problems, wave -> problems, run -> verdict.
# ---------------------------------------------------------------------------

def extract_fields(status: int, body: bytes, redact: tuple[str, ...] = ()) -> dict:
    """The one reader of response bodies: the counts and reasons, sanitized; never text or ids."""
    fields = {"http_status": status, "body_error": None, "error": None, "error_param": None,
              "n_choices": None, "usage": False, "prompt_tokens": None, "cached_tokens": None,
              "completion_tokens": None, "reasoning_tokens": None, "finish_reason": None,
              "stop_reason": None, "metrics": None, "speculative_decoding": None}
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
        fields["body_error"] = "invalid JSON in the response body"
        if status != 200:
            fields["error"] = clean_text(body.decode("utf-8", "replace"), ERROR_TEXT_LIMIT,
                                         redact) or None
    if doc is not None and not isinstance(doc, dict):
        fields["body_error"] = "response body is JSON but not an object"
        return fields
    if doc is None:
        return fields
    if status != 200:
        fields["error"], fields["error_param"] = _error_message(doc, redact)
        return fields
    choices = doc.get("choices")
    if isinstance(choices, list):
        fields["n_choices"] = len(choices)
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        fields["finish_reason"] = _short_str(choice.get("finish_reason"), 32, redact)
        fields["stop_reason"] = clean_stop_reason(choice.get("stop_reason"), redact)
    usage = doc.get("usage")
    if isinstance(usage, dict):
        fields["usage"] = True
        fields["prompt_tokens"] = _count(usage.get("prompt_tokens"))
        fields["completion_tokens"] = _count(usage.get("completion_tokens"))
        fields["cached_tokens"] = _count(_get(usage, "prompt_tokens_details", "cached_tokens"))
        fields["reasoning_tokens"] = _count(
            _get(usage, "completion_tokens_details", "reasoning_tokens"))
    metrics = doc.get("metrics")
    if isinstance(metrics, dict):
        fields["metrics"] = {k: _number(metrics.get(k)) for k in REQUEST_METRIC_FIELDS}
        fields["speculative_decoding"] = _numbers_only(metrics.get("speculative_decoding"))
    return fields


def _get(doc: dict, key: str, inner: str):
    value = doc.get(key)
    return value.get(inner) if isinstance(value, dict) else None


def _count(value) -> int | None:
    """An integer count as the server gave it; anything else is 'not reported' (None, never 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value) -> float | int | None:
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
            kept[key] = [_number(x) for x in item[:64]]
        else:
            kept[key] = _number(item)
    return kept


def _error_message(doc: dict, redact: tuple[str, ...]) -> tuple[str | None, str | None]:
    error = doc.get("error", doc.get("detail", doc.get("message")))
    if isinstance(error, dict):
        param = error.get("param")
        return (clean_text(str(error.get("message", "")), ERROR_TEXT_LIMIT, redact) or None,
                _short_str(param, 64, redact))
    if error is None:
        return None, None
    return clean_text(str(error), ERROR_TEXT_LIMIT, redact) or None, None


def diagnose_http_error(status: int, message: str | None, param: str | None,
                        api_key_env: str) -> str:
    """Name why a non-200 answer happened and what the operator can do about it."""
    text = f"{message or ''} {param or ''}".lower()
    said = f": {message}" if message else ""
    if status == 401:
        return (f"unauthorized: set {api_key_env} (or --api-key-env) to the server's API key "
                f"(HTTP 401)")
    if status == 400 and "priority" in text:
        return ("HTTP 400 naming priority: the server lacks priority scheduling; start it with "
                f"--scheduling-policy priority, or run the warm-up with --priority 0{said}")
    if status == 400 and ("context length" in text or "min_tokens" in text
                          or "input_tokens" in text):
        return ("the long prompt does not fit the model's context (prompt tokens + completion "
                f"tokens must not exceed max_model_len; lower --b1-tokens) (HTTP 400){said}")
    if 300 <= status < 400:
        return f"HTTP {status} redirect not followed: point --base-url at the server itself"
    return f"HTTP {status}{said}"


def judge_response(fields: dict, *, tokens: int, long_prompt: bool,
                   api_key_env: str = "VLLM_API_KEY") -> list[str]:
    """What makes one warm-up response pass (SPEC section 7); [] means it passed."""
    if fields.get("transport_error"):
        return [fields["transport_error"]]
    status = fields["http_status"]
    if status != 200:
        return [diagnose_http_error(status, fields["error"], fields["error_param"], api_key_env)]
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
    completion, finish, stop = (fields["completion_tokens"], fields["finish_reason"],
                                fields["stop_reason"])
    if completion == 1:
        problems.append(f"one-token response: completion_tokens 1, finish_reason {finish!r}, "
                        f"stop_reason {stop!r} (EOS or a stop ended it)")
    elif completion is None:
        problems.append("usage.completion_tokens missing")
    elif completion != tokens:
        problems.append(f"completion_tokens {completion}, expected {tokens}")
    if finish != "length":
        problems.append(f"finish_reason {finish!r}, expected 'length'")
    if stop is not None:
        problems.append(f"stop_reason {stop!r}, expected null")
    if long_prompt:
        prompt, cached = fields["prompt_tokens"], fields["cached_tokens"]
        if prompt is None:
            problems.append("usage.prompt_tokens missing: B1's size cannot be checked")
        elif prompt < MIN_B1_PROMPT_TOKENS:
            problems.append(f"B1 prompt_tokens {prompt}, expected more than "
                            f"{MIN_B1_PROMPT_TOKENS - 1}")
        if cached:
            problems.append(f"B1 cached_tokens {cached}, expected 0: a cached prefix matched, "
                            f"so the long prefill did not run in full")
    return problems


def judge_wave(requests: list[dict], depth: int) -> list[str]:
    """A wave passes when all `depth` requests ran and passed."""
    name = wave_name(depth)
    problems = []
    if len(requests) != depth:
        problems.append(f"{name}: {len(requests)} of {depth} requests ran")
    failed = sum(1 for r in requests if not r["ok"])
    if failed:
        problems.append(f"{name}: {failed} of {len(requests)} requests failed")
    return problems


def request_label(record: dict) -> str:
    """How problems name a request: B2#1 for a warm-up wave, 'single round 1#0' for a probe."""
    where = record.get("wave") or f"{record.get('item')} round {record.get('round')}"
    return f"{where}#{record.get('index')}"


def judge_run(requests: list[dict], planned: int, problems: list[str], refusal: list[str],
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

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def clean_text(text: str, limit: int, redact: tuple[str, ...] = ()) -> str:
    """One line, no control characters, secrets replaced, at most `limit` characters."""
    for secret in redact:
        if secret:
            text = text.replace(secret, "[redacted]")
    text = " ".join(_CONTROL.sub(" ", text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _short_str(value, limit: int, redact: tuple[str, ...] = ()) -> str | None:
    return clean_text(value, limit, redact) if isinstance(value, str) else None


def clean_stop_reason(value, redact: tuple[str, ...] = ()) -> int | str | None:
    """stop_reason as the server gave it (a token id or a stop string, cut to 64 characters)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        return clean_text(value, STOP_REASON_LIMIT, redact)
    return f"<{type(value).__name__}>"


def json_number(value: float):
    """Prometheus values as JSON: NaN and infinities become strings, as Prometheus spells them."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def request_record(run_id: str, depth: int, slot: Slot, plan: Plan, api_key_env: str,
                   redact: tuple[str, ...]) -> dict:
    """Build a request record from what one client got: counts, reasons, verdict."""
    if slot.response is not None:
        fields = extract_fields(slot.response.status, slot.response.body, redact)
    else:
        fields = {"http_status": None, "transport_error": slot.error.problem if slot.error
                  else "no response"}
    problems = judge_response(fields, tokens=plan.tokens, long_prompt=(depth == plan.waves[0]),
                              api_key_env=api_key_env)
    latency = (slot.done_at - slot.sent_at) if slot.sent_at is not None and slot.done_at else None
    return {
        "record": "request", "run_id": run_id, "request_id": slot.request_id,
        "wave": wave_name(depth), "index": slot.index,
        "http_status": fields.get("http_status"),
        "prompt_tokens": fields.get("prompt_tokens"),
        "cached_tokens": fields.get("cached_tokens"),
        "completion_tokens": fields.get("completion_tokens"),
        "reasoning_tokens": fields.get("reasoning_tokens"),
        "finish_reason": fields.get("finish_reason"),
        "stop_reason": fields.get("stop_reason"),
        "latency_s": None if latency is None else round(latency, 4),
        "sent_at_s": None if slot.sent_at is None else round(slot.sent_at, 4),
        "ok": not problems,
        "problems": problems,
        "error": fields.get("error") or fields.get("transport_error"),
        "metrics": fields.get("metrics"),
        "speculative_decoding": fields.get("speculative_decoding"),
    }


def default_records_path(run_id: str) -> str:
    directory = os.environ.get("WARMUP_RECORDS_DIR") or "warmup-records"
    return os.path.join(directory, f"warmup-{run_id}.jsonl")


def open_records(path: str):
    """Open the records file for appending; OSError when it cannot be written."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    return open(path, "a", encoding="utf-8")


def append_record(stream, record: dict) -> None:
    """One JSON object a line, flushed at once, so a killed run keeps what finished."""
    stream.write(json.dumps(record, allow_nan=False, ensure_ascii=False) + "\n")
    stream.flush()


# ---------------------------------------------------------------------------
# The run: resolve the server, size B1, then guard + wave, in order, to the verdict.
# ---------------------------------------------------------------------------

@dataclass
class Run:
    """What one run has learned and written so far (only the main thread touches it)."""
    plan: Plan
    target: Target
    clock: Clock
    records: object
    say: object
    api_key: str | None
    api_key_env: str
    model: str | None = None
    max_model_len: int | None = None
    server_version: str | None = None
    b1_prompt: str | None = None
    b1_counted: int | None = None
    run_written: bool = False
    requests: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    refusal: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    current_wave: str | None = None
    metrics_urls: list = field(default_factory=list)      # more Prometheus endpoints (Targets)
    status_files: list = field(default_factory=list)
    status_wait_s: float = 15.0
    before: dict = field(default_factory=dict)            # source -> (counters or None, why)
    before_status: dict = field(default_factory=dict)     # path -> (document or None, why)
    counter_highlights: dict | None = None
    planned: int | None = None                            # requests planned, when not the waves'
    probe_plan: dict | None = None                        # the probe's plan, recorded instead

    @property
    def redact(self) -> tuple[str, ...]:
        return tuple(s for s in (self.api_key, self.target.credentials) if s)

    def write(self, record: dict) -> None:
        append_record(self.records, record)


def resolve_model(run: Run, wanted: str | None) -> None:
    """Find the model (and its max_model_len) in GET /v1/models."""
    status, doc = _lookup(run, "GET", "/v1/models")
    if status == 401:
        raise Fatal(diagnose_http_error(401, None, None, run.api_key_env))
    entries = doc.get("data") if status == 200 and isinstance(doc, dict) else None
    if not isinstance(entries, list):
        if wanted:
            run.model = wanted
            return
        raise Fatal(f"cannot find the model: GET /v1/models answered HTTP {status}; "
                    f"pass --model or set WARMUP_MODEL", EXIT_USAGE)
    served = {str(e.get("id")): e for e in entries if isinstance(e, dict)}
    names = ", ".join(clean_text(n, 80) for n in sorted(served))
    if wanted and wanted not in served:
        raise Fatal(f"model {clean_text(wanted, 80)!r} is not served at {run.target.display}; "
                    f"served: {names or 'none'}", EXIT_USAGE)
    if not wanted and len(served) != 1:
        raise Fatal(f"the server serves {len(served)} models ({names or 'none'}); "
                    f"choose one with --model", EXIT_USAGE)
    run.model = wanted or next(iter(served))
    run.max_model_len = _count(served[run.model].get("max_model_len"))


def _lookup(run: Run, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    try:
        return fetch_json(run.target, run.clock, method, path, body, run.api_key)
    except TransportError as exc:
        raise Fatal(exc.problem if exc.kind == "connect" else f"{method} {path}: {exc.problem}")


def read_server_version(run: Run) -> None:
    try:
        status, doc = _lookup(run, "GET", "/version")
    except Fatal:
        return
    if status == 200 and isinstance(doc, dict) and isinstance(doc.get("version"), str):
        run.server_version = clean_text(doc["version"], 64)


def size_b1(run: Run) -> None:
    """Size the long prompt with the server's tokenizer when it has /tokenize, else estimate."""
    budget = b1_budget(run.plan.b1_tokens, run.plan.tokens, run.max_model_len)
    nonce = "warmup-" + os.urandom(12).hex()

    def count(prompt: str) -> int | None:
        status, doc = _lookup(run, "POST", "/tokenize", {"model": run.model, "prompt": prompt})
        if status != 200 or not isinstance(doc, dict) or _count(doc.get("count")) is None:
            return None
        if run.max_model_len is None:
            run.max_model_len = _count(doc.get("max_model_len"))
        return doc["count"]           # only the count: the ids are dropped with `doc`

    run.b1_prompt, run.b1_counted = size_long_prompt(count, nonce, budget)
    tighter = b1_budget(run.plan.b1_tokens, run.plan.tokens, run.max_model_len)
    if tighter < budget:              # /tokenize told a smaller context than /v1/models did
        run.b1_prompt, run.b1_counted = size_long_prompt(count, nonce, tighter)


def write_run_record(run: Run) -> None:
    if run.run_written:
        return
    run.run_written = True
    plan = run.probe_plan or plan_description(run.plan)
    plan["b1_prompt_tokens_counted"] = run.b1_counted
    plan["b1_sizing"] = "tokenize" if run.b1_counted is not None else "estimate"
    run.write({
        "record": "run", "run_id": run.plan.run_id,
        "mode": "probe" if run.probe_plan else "warmup",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "base_url": run.target.display,
        "model": clean_text(run.model, 200, run.redact) if run.model else None,
        "max_model_len": run.max_model_len, "plan": plan,
        "versions": {"helper": __version__, "python": sys.version.split()[0],
                     "server": run.server_version},
        "api_key_env": run.api_key_env, "api_key_set": bool(run.api_key),
        "pid": os.getpid(),
    })


def check_guard(run: Run, depth: int) -> bool:
    """Read /metrics (one retry on a transport error) and record the gauges; False = refused."""
    name = wave_name(depth)
    for attempt in (1, 2):
        try:
            response = fetch(run.target, run.clock, "GET", "/metrics")
            break
        except TransportError as exc:
            if attempt == 2 or exc.kind == "deadline" or run.clock.remaining() <= 1:
                raise Fatal(f"guard before {name}: {exc.problem}")
            time.sleep(METRICS_RETRY_PAUSE_S)
    samples, bad = [], 0
    if response.status != 200:
        problems = [f"guard cannot be read: GET /metrics answered HTTP {response.status}"]
    else:
        samples, bad = parse_prometheus(response.body.decode("utf-8", "replace"))
        problems = guard_problems(samples)
        if bad and not samples:
            problems.insert(0, "guard cannot be read: /metrics is not Prometheus text")
        source = metrics_source(run.target, "/metrics")
        if samples and source not in run.before:      # the read before the first wave
            run.before[source] = (counters(samples), None)
    run.write({
        "record": "gauges", "run_id": run.plan.run_id, "wave": name,
        "at_s": round(run.clock.elapsed(), 4), "ok": not problems,
        "samples": [{"name": n, "labels": {k: clean_text(v, 200) for k, v in lab.items()},
                     "value": json_number(v)} for n, lab, v in samples if n in GAUGES],
        "unparsed_lines": bad, "problems": problems,
    })
    if problems:
        run.refusal += [f"refused before {name}: {p}" for p in problems]
    return not problems


def wave_slots(run: Run, depth: int, first: bool) -> list[Slot]:
    """The wave's requests, encoded before any client connects."""
    slots = []
    for index in range(depth):
        rid = request_id(run.plan.run_id, depth, index)
        prompt = run.b1_prompt if first else short_prompt(run.plan.run_id, depth, index)
        payload = encode_request(run.target, "POST", "/v1/completions",
                                 completion_body(run.model, prompt, rid, run.plan), run.api_key)
        slots.append(Slot(index, rid, payload))
    return slots


def run_one_wave(run: Run, depth: int, first: bool) -> None:
    name = wave_name(depth)
    run.current_wave = name
    slots = wave_slots(run, depth, first)
    started = run.clock.elapsed()
    finished = run_wave(run.target, run.clock, slots)
    duration = run.clock.elapsed() - started
    records = [request_record(run.plan.run_id, depth, slot, run.plan, run.api_key_env,
                              run.redact) for slot in finished]
    for record in records:
        run.write(record)
    run.requests += records
    problems = judge_wave(records, depth)
    skew = release_skew_ms(finished)
    run.write({"record": "wave", "run_id": run.plan.run_id, "wave": name, "depth": depth,
               "release_skew_ms": skew, "duration_s": round(duration, 4),
               "started_at_s": round(started, 4), "ok": not problems,
               "requests_ok": sum(r["ok"] for r in records), "problems": problems})
    run.current_wave = None
    run.say(wave_line(name, records, skew, duration, first))
    if first and records and records[0]["http_status"] == 200 \
            and records[0]["cached_tokens"] is None:
        run.notes.append("B1 cache check not made: the server does not report cached tokens "
                         "(start it with --enable-prompt-tokens-details to check)")


def wave_line(name: str, records: list[dict], skew: float | None, duration: float,
              first: bool) -> str:
    ok = sum(r["ok"] for r in records)
    line = (f"{name:<4} {ok}/{len(records)} ok  skew {'-' if skew is None else f'{skew:.1f}'} ms"
            f"  {duration:.2f} s")
    if first and records:
        cached = records[0]["cached_tokens"]
        line += (f"  prompt {records[0]['prompt_tokens']}"
                 f"  cached {'n/a' if cached is None else cached}")
    for r in records:
        if not r["ok"]:
            line += f"\n     #{r['index']}: " + "; ".join(r["problems"])
    return line


def execute(run: Run, wanted_model: str | None) -> None:
    """Everything that talks to the server, in order; Fatal ends it early."""
    resolve_model(run, wanted_model)
    read_server_version(run)
    size_b1(run)
    write_run_record(run)
    run.say(f"warm-up {run.plan.run_id}: {run.target.display} model {run.model}, waves "
            f"{','.join(wave_name(d) for d in run.plan.waves)} ({run.plan.requests_total} "
            f"requests), B1 prompt {run.b1_counted or 'estimated'} tokens, deadline "
            f"{run.plan.deadline_s:g} s")
    snapshot_before(run)
    run_waves(run)
    if run.requests:
        snapshot_after(run)


def run_waves(run: Run) -> None:
    """Guard, then wave, in order; stops at a refusal or at the deadline."""
    for position, depth in enumerate(run.plan.waves):
        if run.clock.remaining() <= 0:
            rest = ",".join(wave_name(d) for d in run.plan.waves[position:])
            run.problems.append(f"deadline passed before {wave_name(depth)}: waves {rest} "
                                f"not run")
            return
        if not check_guard(run, depth):
            return
        run_one_wave(run, depth, first=(position == 0))


def metrics_source(target: Target, path: str = "") -> str:
    return target.display + path


def read_counters(run: Run, target: Target, path: str) -> tuple[dict | None, str | None]:
    """Counters of one Prometheus endpoint, or None and why (never a made-up number)."""
    try:
        response = fetch(target, run.clock, "GET", path)
    except TransportError as exc:
        return None, exc.problem
    if response.status != 200:
        return None, f"HTTP {response.status}"
    samples, _ = parse_prometheus(response.body.decode("utf-8", "replace"))
    return (counters(samples), None) if samples else (None, "not Prometheus text")


def wait_for_status(run: Run, path: str) -> tuple[dict | None, str | None]:
    """The status file once rewritten after this moment, within --status-wait-s and the deadline."""
    asked = time.time()
    limit = time.monotonic() + min(run.status_wait_s, max(run.clock.remaining() - 1, 0))
    while True:
        try:
            if os.stat(path).st_mtime > asked:
                with open(path, encoding="utf-8") as handle:
                    doc = json.load(handle)
                if isinstance(doc, dict):
                    return doc, None
        except FileNotFoundError:
            if time.monotonic() >= limit:
                return None, "missing"
        except (OSError, ValueError):
            pass                                # being rewritten: read it again
        if time.monotonic() >= limit:
            return None, (f"stale: not rewritten within {run.status_wait_s:g} s "
                          f"(or the time left to the deadline)")
        time.sleep(0.1)


def snapshot_before(run: Run) -> None:
    for target in run.metrics_urls:
        run.before[metrics_source(target)] = read_counters(run, target, "")
    for path in run.status_files:
        run.before_status[path] = wait_for_status(run, path)


AFTER_READS_MIN_LEFT_S = 1.0   # the reads after the last wave must not make a run late


def snapshot_after(run: Run) -> None:
    """Read every counter source and status file again; record deltas and cross-checks.

    Skipped (and said) when less than a second is left: a run that finished its waves in
    time must not become late for the sake of its counters.
    """
    if run.clock.remaining() < AFTER_READS_MIN_LEFT_S:
        run.warnings.append("counter deltas and status files not read after the last wave: "
                            "less than 1 s left to the deadline")
        return
    main = metrics_source(run.target, "/metrics")
    sources = [(main, run.target, "/metrics")] + [(metrics_source(t), t, "")
                                                   for t in run.metrics_urls]
    for source, target, path in sources:
        before, why_before = run.before.get(source, (None, "not read before the first wave"))
        after, why_after = read_counters(run, target, path)
        deltas = counter_deltas(before, after)
        why = why_before or why_after
        record = {"record": "metrics", "run_id": run.plan.run_id, "source": source,
                  "state": "incomplete" if why else "complete",
                  "why": None if not why else f"{'before' if why_before else 'after'}: {why}",
                  "meaning": COUNTER_MEANING, "deltas": deltas, "highlights": highlighted(deltas)}
        if source == main:
            run.counter_highlights = record["highlights"]
            record["warnings"] = [] if why else cross_check(deltas, run.requests)
            run.warnings += record["warnings"]
            if why:
                run.warnings.append(f"counter deltas incomplete: {record['why']}")
        run.write(record)
    for path in run.status_files:
        before, why_before = run.before_status.get(path, (None, "not read"))
        after, why_after = wait_for_status(run, path)
        why = (f"before: {why_before}" if why_before else None) or \
            (f"after: {why_after}" if why_after else None)
        result = status_delta(before, after, why)
        run.write(dict({"record": "status", "run_id": run.plan.run_id, "path": path}, **result))
        if result["state"] != "valid":
            run.warnings.append(f"status file {path}: {result['state']}: {result['why']}")
    run.say(counters_line(run.counter_highlights))


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


def summarize(run: Run, verdict: str | None = None, exit_code: int | None = None,
              extra: list[str] = ()) -> dict:
    """Write the summary record from what the run has; returns it."""
    elapsed = run.clock.elapsed()
    planned = run.planned or run.plan.requests_total
    if verdict is None:
        verdict, exit_code, problems = judge_run(run.requests, planned,
                                                 run.problems + list(extra), run.refusal,
                                                 elapsed, run.plan.deadline_s)
    else:
        problems = run.problems + run.refusal + list(extra)
    write_run_record(run)
    summary = {
        "record": "summary", "run_id": run.plan.run_id, "verdict": verdict,
        "exit_code": exit_code, "requests_ok": sum(r["ok"] for r in run.requests),
        "requests_total": planned, "requests_ran": len(run.requests),
        "elapsed_s": round(elapsed, 4), "deadline_s": run.plan.deadline_s,
        "problems": problems, "notes": run.notes, "warnings": run.warnings,
        "counters": run.counter_highlights,
    }
    run.write(summary)
    return summary


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
        try:
            record = json.loads(line)
        except ValueError:
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
                problems += [f"{request_label(record)}: {p}" for p in record["problems"]]
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
        prog="warmup.py report",
        description="Print a readable report of a warm-up (or probe) records file, also one cut "
                    "short by a kill. Exit status: the run's own (0 pass), 1 when the file has "
                    "no summary, 2 when it cannot be read.")
    parser.add_argument("records", help="the JSON Lines records file")
    parser.add_argument("--json", action="store_true", help="the report as one JSON object")
    args = parser.parse_args(argv)
    try:
        records, issues = load_records(args.records)
    except OSError as exc:
        print(f"warmup.py report: cannot read {args.records}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_USAGE
    report = build_report(records, issues)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return report["exit_code"] if report["exit_code"] is not None else EXIT_FAIL


# ---------------------------------------------------------------------------
# probe: time to first token, first round against later rounds (did the warm-up work?).
# ---------------------------------------------------------------------------

PROBE_ITEMS = (("single", 1), ("burst3", 3), ("burst4", 4))


def probe_body(model: str, prompt: str, rid: str, plan: Plan) -> dict:
    """A warm-up request, streamed with usage in the last event (the text is never kept)."""
    return dict(completion_body(model, prompt, rid, plan), stream=True,
                stream_options={"include_usage": True})


def stream_usage(body: bytes) -> tuple[dict | None, bool]:
    """(the last usage object, whether the stream ended with [DONE]) of an SSE body."""
    usage, done = None, False
    for line in body.split(b"\n"):
        line = line.strip()
        if line == b"data: [DONE]":
            done = True
        elif line.startswith(b"data: {") and b'"usage"' in line:
            try:
                doc = json.loads(line[6:])
            except ValueError:
                continue
            if isinstance(doc.get("usage"), dict):
                usage = doc["usage"]
    return usage, done


def probe_record(run_id: str, item: str, round_no: int, slot: Slot, tokens: int,
                 api_key_env: str, redact: tuple[str, ...]) -> dict:
    """One streamed request: when its first token and its end came; counts only, no text."""
    problems, usage = [], None
    response = slot.response
    if response is None:
        problems.append(slot.error.problem if slot.error else "no response")
    elif response.status != 200:
        fields = extract_fields(response.status, response.body, redact)
        problems.append(diagnose_http_error(response.status, fields["error"],
                                            fields["error_param"], api_key_env))
    else:
        usage, done = stream_usage(response.body)
        if not done:
            problems.append("stream did not end with [DONE]")
        if usage is None:
            problems.append("stream carried no usage")
        elif _count(usage.get("completion_tokens")) != tokens:
            problems.append(f"completion_tokens {usage.get('completion_tokens')!r}, "
                            f"expected {tokens}")
        if response.watched_at is None:
            problems.append("no token text arrived")
    sent = slot.sent_at
    first = response.watched_at if response is not None else None
    return {
        "record": "probe", "run_id": run_id, "item": item, "round": round_no,
        "index": slot.index, "request_id": slot.request_id,
        "http_status": response.status if response is not None else None,
        "ttft_s": round(first - sent, 4) if first is not None and sent is not None else None,
        "total_s": round(slot.done_at - sent, 4) if sent is not None and slot.done_at else None,
        "prompt_tokens": _count((usage or {}).get("prompt_tokens")),
        "completion_tokens": _count((usage or {}).get("completion_tokens")),
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


def run_probe(run: Run, rounds: int, long_tokens: int) -> list[dict]:
    """Rounds of single, burst3, burst4 (and long); each item behind the guard, like a wave."""
    items = list(PROBE_ITEMS) + ([("long", 1)] if long_tokens else [])
    records = []
    for round_no in range(1, rounds + 1):
        for item, depth in items:
            if run.clock.remaining() <= 0:
                run.problems.append(f"deadline passed before round {round_no} {item}")
                return records
            if not check_guard(run, depth):
                return records
            run.current_wave = f"{item} round {round_no}"
            slots = []
            for index in range(depth):
                rid = f"probe-{run.plan.run_id}-{item}-r{round_no}-{index}"
                prompt = run.b1_prompt if item == "long" else \
                    short_prompt(f"{run.plan.run_id}-{round_no}", depth, index)
                payload = encode_request(run.target, "POST", "/v1/completions",
                                         probe_body(run.model, prompt, rid, run.plan),
                                         run.api_key)
                slots.append(Slot(index, rid, payload, stream=True))
            for slot in run_wave(run.target, run.clock, slots):
                record = probe_record(run.plan.run_id, item, round_no, slot, run.plan.tokens,
                                      run.api_key_env, run.redact)
                run.write(record)
                records.append(record)
            run.current_wave = None
    return records


def probe_main(argv: list[str]) -> int:
    """warmup.py probe: the same connection options, guards, bounds and records as the warm-up."""
    args = parse_args(argv, probe=True)
    plan = Plan(new_run_id(), (1,), args.tokens, args.priority, max(args.long_tokens,
                                                                    MIN_B1_PROMPT_TOKENS),
                args.deadline_s, args.socket_cap_s)
    if args.dry_run:
        print(f"probe plan for {args.target.display}: {args.rounds} rounds of single, burst3, "
              f"burst4{', long (' + str(args.long_tokens) + ' tokens)' if args.long_tokens else ''}"
              f"; streaming, {plan.tokens} tokens each; deadline {plan.deadline_s:g} s")
        return EXIT_PASS
    return run_with_records(args, plan, lambda run: execute_probe(run, args))


def execute_probe(run: Run, args: argparse.Namespace) -> None:
    resolve_model(run, args.model)
    read_server_version(run)
    if args.long_tokens:
        size_b1(run)
    write_run_record(run)
    run.say(f"probe {run.plan.run_id}: {run.target.display} model {run.model}, {args.rounds} "
            f"rounds, deadline {run.plan.deadline_s:g} s")
    records = run_probe(run, args.rounds, args.long_tokens)
    run.requests = records          # judged like warm-up requests: every one must be ok
    items = probe_summary(records)
    run.write({"record": "probe_summary", "run_id": run.plan.run_id, "items": items,
               "meaning": "first round against the median of later rounds; a ratio, "
                          "not a verdict on the warm-up"})
    run.say("probe (first round against the median of later rounds):")
    for entry in items:
        run.say(probe_line(entry))


# ---------------------------------------------------------------------------
# main()
# ---------------------------------------------------------------------------

EPILOG = """\
environment:
  WARMUP_BASE_URL     default for --base-url
  WARMUP_MODEL        default for --model
  WARMUP_RECORDS_DIR  where the default records file goes (else ./warmup-records/)
  VLLM_API_KEY        the API key, sent as "Authorization: Bearer" to /v1 paths only;
                      never printed or recorded (another variable: --api-key-env)
  WARMUP_HARD_S       read by warmup_serve.sh: hard wall-clock bound (default 95)

exit status:
  0    pass: every response as SPEC section 7 requires, in time
  1    fail: a wrong response, a request error, cannot connect, or late
  2    usage or configuration error (bad option, bad URL, unwritable records)
  3    refused: a request gauge in /metrics was missing or non-zero before a wave
  124  ended by warmup_serve.sh's hard bound (TERM); 137 if it had to KILL
  143  the helper received SIGTERM (it wrote a 'killed' summary first)

Readiness is not warm-up success: read the records before releasing producers.
"""


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def waves_arg(text: str) -> tuple[int, ...]:
    try:
        return parse_waves(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def build_parser(probe: bool = False) -> argparse.ArgumentParser:
    env = os.environ
    if probe:
        parser = argparse.ArgumentParser(
            prog="warmup.py probe", epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description="Did the warm-up work? Measure time to first token and total time with "
                        "streamed completions: a single request, a burst of 3 and a burst of 4 "
                        "(and a long prompt), repeated --rounds times; report the first round "
                        "against the median of the later ones. A ratio, never a verdict.")
    else:
        parser = argparse.ArgumentParser(
            prog="warmup.py", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
            description="Warm up a freshly started vLLM server (waves B1..B4 of raw completions: "
                        "a ~5K-token prefill, then batch depths 2-4), check every response, and "
                        "write JSON Lines records that prove the warm-up ran. Also: "
                        "'warmup.py report RECORDS' and 'warmup.py probe' (see their --help).")
    parser.add_argument("--base-url", metavar="URL", default=env.get("WARMUP_BASE_URL") or DEFAULT_BASE_URL,
                        help="the server's address, without /v1 (default: $WARMUP_BASE_URL, "
                             "else %(default)s); credentials in it are never printed")
    parser.add_argument("--model", metavar="NAME", default=env.get("WARMUP_MODEL") or None,
                        help="model name (default: $WARMUP_MODEL, else the only model in "
                             "GET /v1/models)")
    parser.add_argument("--records", metavar="PATH",
                        help="JSON Lines records file, appended to (default: a new "
                             "warmup-<run id>.jsonl in $WARMUP_RECORDS_DIR or ./warmup-records)")
    parser.add_argument("--deadline-s", metavar="S", type=positive_float, default=90.0,
                        help="the helper's deadline from its start; no wave starts after it "
                             "and a run that ends after it fails (default: %(default)g)")
    parser.add_argument("--socket-cap-s", metavar="S", type=positive_float, default=60.0,
                        help="the longest any one connect, send or read waits, within the "
                             "deadline (default: %(default)g)")
    parser.add_argument("--tokens", metavar="N", type=int, default=32,
                        help="completion tokens per request: max_tokens = min_tokens "
                             "(default: %(default)s)")
    parser.add_argument("--priority", metavar="N", type=int, default=20,
                        help="request priority; with --scheduling-policy priority, real "
                             "traffic at 0 goes first (default: %(default)s)")
    parser.add_argument("--api-key-env", default="VLLM_API_KEY", metavar="NAME",
                        help="environment variable holding the API key (default: %(default)s)")
    if probe:
        parser.add_argument("--rounds", metavar="N", type=int, default=3,
                            help="rounds of single, burst3, burst4 (default: %(default)s)")
        parser.add_argument("--long-tokens", type=int, default=0, metavar="N",
                            help="also a long request of N prompt tokens (more than 4096), "
                                 "sized with /tokenize (default: none)")
        parser.add_argument("--dry-run", action="store_true",
                            help="print the plan and exit 0 without touching the network")
        parser.add_argument("--json", action="store_true",
                            help="print the summary record as JSON on stdout")
        return parser
    parser.add_argument("--waves", type=waves_arg, default=DEFAULT_WAVES, metavar="1,2,3,4",
                        help="the concurrency of each wave, in order; the first must be 1 "
                             "(B1, the long prompt), e.g. 1,2,3,4,6,8 (default: 1,2,3,4)")
    parser.add_argument("--b1-tokens", metavar="N", type=int, default=5000,
                        help="target size of B1's long prompt in tokens, more than 4096; "
                             "counted with the server's /tokenize when it has one "
                             "(default: %(default)s)")
    parser.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                        help="another Prometheus endpoint (a proxy's, a worker's) whose counter "
                             "deltas over the warm-up are recorded; repeatable")
    parser.add_argument("--status-file", action="append", default=[], metavar="PATH",
                        help="a JSON status file another process rewrites on a timer; its "
                             "numeric deltas over the warm-up are recorded (invalid when pid "
                             "or session changed); repeatable")
    parser.add_argument("--status-wait-s", metavar="S", type=positive_float, default=15.0,
                        help="how long to wait for each status file to be rewritten, before "
                             "the first wave and after the last (default: %(default)g)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (waves, prompt sizes, budgets, bounds) and exit 0 "
                             "without touching the network")
    parser.add_argument("--json", action="store_true",
                        help="print the summary record as JSON on stdout; the human lines go "
                             "to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_args(argv: list[str] | None, probe: bool = False) -> argparse.Namespace:
    parser = build_parser(probe)
    args = parser.parse_args(argv)
    if probe:
        if args.rounds < 2:
            parser.error("--rounds must be at least 2 (the first round is compared with later ones)")
        if args.long_tokens and args.long_tokens < MIN_B1_PROMPT_TOKENS:
            parser.error(f"--long-tokens must be more than {MIN_B1_PROMPT_TOKENS - 1}")
        args.metrics_url, args.status_file, args.status_wait_s = [], [], 15.0
    elif args.b1_tokens < MIN_B1_PROMPT_TOKENS:
        parser.error(f"--b1-tokens must be more than {MIN_B1_PROMPT_TOKENS - 1}")
    if args.tokens < 2:
        parser.error("--tokens must be at least 2 (a one-token reply is the fault this finds)")
    if not args.api_key_env.isidentifier():
        parser.error("--api-key-env must name an environment variable")
    try:
        args.target = parse_base_url(args.base_url)
        args.metrics_targets = [parse_url(url, "--metrics-url") for url in args.metrics_url]
    except UsageError as exc:
        parser.error(str(exc))
    return args


def dry_run(plan: Plan, target: Target, as_json: bool) -> int:
    description = plan_description(plan)
    description["base_url"] = target.display
    description["hard_bound_s"] = os.environ.get("WARMUP_HARD_S", "95")
    if as_json:
        print(json.dumps(description, indent=2))
        return EXIT_PASS
    print(f"plan for {target.display} (dry run: nothing sent)")
    for i, depth in enumerate(plan.waves):
        prompt = (f"1 long prompt of ~{plan.b1_tokens} tokens (more than "
                  f"{MIN_B1_PROMPT_TOKENS - 1}), run-unique nonce first") if i == 0 else \
            f"{depth} distinct short prompts of ~25 words"
        print(f"  {wave_name(depth):<4} {depth} concurrent: {prompt}")
    print(f"  budget: {plan.requests_total} requests, at most "
          f"{plan.requests_total * plan.tokens} completion tokens ({plan.tokens} each, "
          f"min = max, ignore_eos, greedy, priority {plan.priority})")
    print(f"  bounds: deadline {plan.deadline_s:g} s, socket cap {plan.socket_cap_s:g} s, "
          f"body cap {MAX_BODY_BYTES} bytes, hard bound {description['hard_bound_s']} s "
          f"(warmup_serve.sh)")
    return EXIT_PASS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    if argv[:1] == ["probe"]:
        return probe_main(argv[1:])
    args = parse_args(argv)
    plan = Plan(new_run_id(), args.waves, args.tokens, args.priority, args.b1_tokens,
                args.deadline_s, args.socket_cap_s)
    if args.dry_run:
        return dry_run(plan, args.target, args.json)
    return run_with_records(args, plan, lambda run: execute(run, args.model))


def run_with_records(args: argparse.Namespace, plan: Plan, body) -> int:
    """Open the records, run `body(run)` under the signal handlers, write the summary."""
    clock = Clock.start(plan.deadline_s, plan.socket_cap_s)
    path = args.records or default_records_path(plan.run_id)
    try:
        records = open_records(path)
    except OSError as exc:
        print(f"warmup.py: cannot write records to {path}: {exc.strerror or exc}; choose a "
              f"writable --records PATH or WARMUP_RECORDS_DIR", file=sys.stderr)
        return EXIT_USAGE
    human = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=human, flush=True)

    run = Run(plan, args.target, clock, records, say,
              os.environ.get(args.api_key_env) or None, args.api_key_env,
              metrics_urls=args.metrics_targets, status_files=args.status_file,
              status_wait_s=args.status_wait_s)
    if getattr(args, "rounds", None):
        items = list(PROBE_ITEMS) + ([("long", 1)] if args.long_tokens else [])
        run.planned = args.rounds * sum(depth for _, depth in items)
        run.probe_plan = {"items": [{"item": i, "depth": d} for i, d in items],
                          "rounds": args.rounds, "requests_total": run.planned,
                          "long_tokens": args.long_tokens or None, "tokens": plan.tokens,
                          "priority": plan.priority, "stream": True,
                          "deadline_s": plan.deadline_s, "socket_cap_s": plan.socket_cap_s}
    previous = _install_handlers()
    try:
        try:
            body(run)
            summary = summarize(run)
        except Fatal as exc:
            problem = [clean_text(exc.problem, 500, run.redact)]
            if exc.exit_code == EXIT_FAIL:
                summary = summarize(run, extra=problem)
            else:                       # a configuration error found on the server: exit 2
                summary = summarize(run, "fail", exc.exit_code, problem)
        except Terminated as exc:
            code = EXIT_TERMINATED if exc.signum == signal.SIGTERM else EXIT_INTERRUPTED
            where = f" during {run.current_wave}" if run.current_wave else ""
            summary = summarize(run, "killed", code,
                                [f"terminated by {signal.Signals(exc.signum).name}{where}"])
    finally:
        _restore_handlers(previous)
        records.close()
    say(verdict_line(summary, path))
    if args.json:
        print(json.dumps(summary))
    return summary["exit_code"]


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _install_handlers() -> dict:
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, _raise_terminated)
    return previous


def _restore_handlers(previous: dict) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
