#!/usr/bin/env python3
"""A fake vLLM 0.32 OpenAI-compatible server for the helper's tests and demo.

It speaks the wire format of a real vLLM 0.32 server, as observed on one: /health,
/version, /v1/models, /tokenize, /v1/completions, /v1/chat/completions and /metrics, 401
{"error":"Unauthorized"} under /v1 when a key is set, context-length and min_tokens
errors, prefix caching in 128-token blocks per engine, usage details absent (null) unless
switched on, request gauges that count the requests really in flight, and data
parallelism (--engines N: per-engine counters from the start, gauge samples only once an
engine has run a request, X-data-parallel-rank routing). Faults are switched per test on
`FakeConfig`. The quality gate's copy probes (text between <text> and </text>) are
answered as `--copy` says: faithful (an exact copy), typos, or garbage.

Standalone: python3 offload/launch/tests/fake_vllm.py --port 8000
Demo:       python3 offload/launch/tests/fake_vllm.py --demo   (fake + warm-up, then stop)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.32.0"
BLOCK = 128                     # prefix-cache block size, as observed
EOS_ID = 2
# The generated text and the ids carry these markers, so tests can prove they never leak.
TEXT_MARKER = "GENTEXT-7Q9Z"
TOKEN_ID_MARKER = 987654321

# Completion faults; each changes what the server answers for matching requests.
FAULTS = ("", "one_token", "stop_string", "wrong_finish", "short_prompt_tokens", "cache_hit",
          "status", "truncated_json", "not_json", "no_usage", "no_choices", "hang", "trickle",
          "headers_close", "oversized", "oversized_stream", "redirect", "slow",
          "chat_template", "reasoning_exhausted")
METRICS_MODES = ("normal", "404", "garbage", "absent", "flaky_once")


class FakeConfig:
    model: str = "fake-model"
    extra_models: tuple = ()              # more entries in /v1/models
    max_model_len: int = 32768
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 4096    # the prefill chunk (--max-num-batched-tokens)
    api_key: str | None = None
    prompt_tokens_details: bool = False   # --enable-prompt-tokens-details
    per_request_metrics: bool = False     # --enable-per-request-metrics
    speculative: bool = True
    spec_k: int = 5                       # speculative tokens a draft proposes
    spec_schedule: tuple = ()             # ((low, high, k), ...): k by batch size (K1's
                                          # 1-2:5,3-4:4); () drafts spec_k at every size
    spec_method: str = "mtp"              # mtp drafts k every step; ngram at most k (its
                                          # lookup finds fewer on some steps)
    spec_accept: tuple = (0.8, 0.7, 0.5, 0.4, 0.3)   # share of drafts accepted at each position
    lack_paths: tuple = ()                # request kinds (PATH_KINDS) answered 400, as a
                                          # server without a grammar backend or template
    cold_paths: tuple = ()                # request kinds whose first request is cold_s slow
    reset_after: int = 0                  # counters drop to 0 after this many completions (a
                                          # restart); 0: never
    engines: int = 1                      # --data-parallel-size: engines behind one API server
    ignore_rank: bool = False             # balance requests even when X-data-parallel-rank names one
    late_gauge_s: float = 0.0             # the gauges count a finished request out this much later
    latency_s: float = 0.0                # engine time of one completion
    tokenize: bool = True                 # /tokenize answers (404 when False)
    models_report_len: bool = True        # /v1/models carries max_model_len
    reject_priority: bool = False         # like versions that refuse priority under fcfs
    fault: str = ""
    fault_match: str = ""                 # the fault hits request ids containing this ("" = all)
    fault_times: int = 0                  # the fault hits only this many requests (0: every one)
    fault_status: int = 500
    fault_message: str = "Internal server error"
    metrics_mode: str = "normal"
    engine_label: str = "engine"          # another name, as a vLLM that renamed it
    gauge_values: dict = None             # {(gauge, engine): value}; {} for each server
    waiting_by_reason: float = 0.0        # the gauge whose name is a trap for prefix matching
    health_delay_s: float = 0.0           # /health answers 503 until this long after start
    trickle_interval_s: float = 1.0
    echo_error_text: str = ""             # appended to error messages (leak tests)
    compile_lines: int = 0                # log lines like vLLM's JIT monitor, first completion
    cold_s: float = 0.0                   # extra time for the first request of each shape
    counter_skew: int = 0                 # generation tokens counted beyond those sent (foreign)
    copy: str = "faithful"                # how copy probes are answered: see COPY_MODES
    dev_mode: bool = False                # VLLM_SERVER_DEV_MODE=1: /sleep, /wake_up, /is_sleeping
    sleep_level: int | None = None        # asleep from the start at this level (None: awake)

    def __init__(self, **settings):
        """The defaults above, these settings over them (a plain class: dataclasses' import
        was a tenth of the fake's start, paid at every server a test starts)."""
        for name, value in settings.items():
            if name not in FakeConfig.__annotations__:
                raise TypeError(f"FakeConfig has no setting {name!r}")
            setattr(self, name, value)
        if self.gauge_values is None:
            self.gauge_values = {}

    def k_at(self, batch: int) -> int:
        """The k the server drafts at a batch size (its schedule, else spec_k)."""
        for low, high, k in self.spec_schedule:
            if low <= batch <= high:
                return k
        return self.spec_k

    def k_max(self) -> int:
        """The server's configured k: the draft positions it counts."""
        return max([k for _, _, k in self.spec_schedule] or [self.spec_k])


STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)   # vLLM 0.32, eager
# The request kinds a request is (the warm-up's --paths), for cold and missing paths.
PATH_KINDS = ("stream", "chat", "sampled", "logprobs", "json")
JSON_ANSWER = '{"id": 1, "name": "lorem"}'
LACK_ERRORS = {
    "json": "The structured output backend could not be initialized: no grammar backend is "
            "installed (xgrammar, guidance, outlines).",
    "logprobs": "logprobs are not supported by this server",
    "sampled": "sampling parameters are not supported",
    "stream": "streaming is not supported",
}


def request_kinds(body: dict, chat: bool) -> set:
    """Which of PATH_KINDS a request is: chat, streamed, sampled, with logprobs, held to
    a grammar."""
    kinds = set()
    if chat:
        kinds.add("chat")
    elif body.get("stream"):
        kinds.add("stream")
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and temperature > 0:
        kinds.add("sampled")
    if body.get("logprobs"):
        kinds.add("logprobs")
    if body.get("response_format") or body.get("structured_outputs"):
        kinds.add("json")
    return kinds


def completion_logprobs(n_out: int) -> dict:
    """A completion's logprobs object: the tokens as text (the marker among them), as vLLM
    sends them; a reader may count them, never keep them."""
    tokens = [TEXT_MARKER] + ["lorem"] * (n_out - 1)
    return {"text_offset": list(range(n_out)), "token_logprobs": [-0.5] * n_out,
            "tokens": tokens, "top_logprobs": [{t: -0.5} for t in tokens]}


def chat_doc(doc: dict, body: dict) -> dict:
    """A completion document in vLLM's chat shape (message, logprobs.content)."""
    choice = doc["choices"][0]
    n_out = doc["usage"]["completion_tokens"]
    logprobs = None
    if body.get("logprobs"):
        logprobs = {"content": [{"token": t, "logprob": -0.5, "bytes": list(t.encode()),
                                 "top_logprobs": [{"token": t, "logprob": -0.5,
                                                   "bytes": list(t.encode())}]}
                                for t in [TEXT_MARKER] + ["lorem"] * (n_out - 1)]}
    return dict(doc, id=f"chatcmpl-{os.urandom(16).hex()}", object="chat.completion",
                choices=[{"index": 0, "message": {"role": "assistant", "content": choice["text"],
                                                  "reasoning": None, "tool_calls": []},
                          "logprobs": logprobs, "finish_reason": choice["finish_reason"],
                          "stop_reason": choice["stop_reason"], "token_ids": None}])


def go_float(value: float) -> str:
    """A float as prometheus_client writes it (floatToGoString): repr, in Go's exponent form
    past six digits before the point, every digit kept: 1.79641114152e+09."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        return f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.") + f"e+{dot - 1:02d}"
    return text


def tokenize(text: str) -> list[int]:
    """A tokenizer that is not one token per word: a BOS, then one token per 3 characters."""
    ids = [1]
    for piece in re.findall(r"\w+|[^\w\s]", text):
        for start in range(0, len(piece), 3):
            ids.append(100 + zlib.crc32(piece[start:start + 3].encode()) % 50000)
    return ids


# The quality gate's copy probes: the text to copy stands between these markers.
COPY_OPEN, COPY_CLOSE = "<text>\n", "\n</text>"
COPY_MODES = ("faithful", "typos", "garbage", "onetypo", "preamble")
# What a model whose chat template ignores `thinking: false` writes before its answer.
PREAMBLE = "Okay, the user wants an exact copy of the text, so I will reproduce it as given."
CHAT_TEMPLATE_TOKENS = 12               # what the chat template adds around the messages
# What vLLM answers when the model's tokenizer has no chat template (HTTP 400).
CHAT_TEMPLATE_ERROR = ("As of transformers v4.44, default chat template is no longer allowed, "
                       "so you must provide a chat template if the tokenizer does not define "
                       "one.")


def copy_reference(prompt: str) -> str | None:
    """The text a copy probe asks for: between the first pair of markers."""
    start = prompt.find(COPY_OPEN)
    end = prompt.find(COPY_CLOSE, start + len(COPY_OPEN)) if start >= 0 else -1
    return prompt[start + len(COPY_OPEN):end] if end >= 0 else None


def with_typos(text: str) -> str:
    """Swap two neighbouring letters in about one word in twenty, as a garbling build does."""
    words = list(re.finditer(r"\w{4,}", text))
    chars = list(text)
    for match in words[7::20]:
        i = match.start() + 1
        if chars[i] == chars[i + 1]:
            i += 1
        chars[i], chars[i + 1] = chars[i + 1], chars[i]
    return "".join(chars)


def copy_answer(reference: str, mode: str, batched: bool) -> str:
    """A copy probe's answer: faithful copies exactly; typos changes one identifier (a
    version tag's last digit) and the passages (the Russian one always, the English one
    only in a batch); onetypo changes one character of the English passage (its 100th
    letter, to the next letter), alone and batched; preamble writes a plan sentence, then
    the exact copy; garbage answers noise. Every unfaithful passage carries TEXT_MARKER."""
    if mode == "preamble":
        return f"{PREAMBLE}\n\n{reference}"
    if mode == "onetypo":
        if any(ch.isspace() for ch in reference) and not any(
                "\u0400" <= ch <= "\u04ff" for ch in reference):
            letters = [i for i, ch in enumerate(reference) if "a" <= ch <= "y"]
            i = letters[100]
            return reference[:i] + chr(ord(reference[i]) + 1) + reference[i + 1:]
        return reference
    if mode == "garbage":
        rng = random.Random(zlib.crc32(reference.encode()))
        noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     ") for _ in reference)
        return f"{TEXT_MARKER} {noise}"
    if mode != "typos":
        return reference
    if not any(ch.isspace() for ch in reference):             # an identifier
        digits = [i for i, ch in enumerate(reference) if ch.isdigit()]
        if not re.match(r"v[0-9]", reference) or not digits:
            return reference
        i = digits[-1]
        return reference[:i] + str((int(reference[i]) + 1) % 10) + reference[i + 1:]
    cyrillic = any("\u0400" <= ch <= "\u04ff" for ch in reference)
    if cyrillic or batched:
        return with_typos(reference) + " " + TEXT_MARKER
    return reference


class FakeState:
    """What the server has seen: requests (for assertions), cache blocks, counters, gauges."""

    def __init__(self, config: FakeConfig):
        self.config = config
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.aborting = threading.Event()     # TERM with --shutdown-timeout 0: answer 500
        self.live: dict = {}                  # a running request -> [engine, largest batch]
        self.started = time.monotonic()
        # process_start_time_seconds: a restart; in clock ticks, rounded down as the kernel
        # (and so prometheus_client) gives it, never after the process started
        self.process_start = math.floor(time.time() * 100) / 100
        self.requests: list[dict] = []        # path, headers, body (parsed), arrived (monotonic)
        engines = range(max(config.engines, 1))
        self.cache: dict[int, set] = {e: set() for e in engines}    # each engine its own KV cache
        self.running = [0 for _ in engines]
        self.served = [0 for _ in engines]      # requests each engine has run (gauge samples)
        self.faults_left = config.fault_times or -1   # -1: the fault never runs out
        self.lingering: list[tuple[int, float]] = []   # (engine, until): counted out late
        self.next_engine = 0
        self.metrics_failed = False
        self.copying: list[dict] = []          # copy probes in flight (is this one batched?)
        self.warm_shapes: set = set()          # (engine, concurrency or "long") already served
        self.counters: dict[tuple[str, tuple], float] = {}
        # Like vLLM, every counter series exists from the start, at 0, for every engine.
        names = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"]
        if config.speculative:
            names += ["vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                      "vllm:spec_decode_num_accepted_tokens_total"]
        self.histograms: dict[int, list] = {e: [0.0] * (len(STEP_BUCKETS) + 2) for e in engines}
        self.completed = 0
        self.sleep_level = config.sleep_level    # None: awake; 0, 1, 2: POST /sleep?level=
        for engine in engines:
            for name in names:
                self.count(name, 0, engine=engine)
            for reason in ("stop", "length", "abort", "error", "repetition"):
                self.count("vllm:request_success_total", 0, engine=engine,
                           finished_reason=reason)
            for position in range(config.k_max() if config.speculative else 0):
                self.count("vllm:spec_decode_num_accepted_tokens_per_pos_total", 0,
                           engine=engine, position=str(position))

    def route(self, header: str | None) -> int:
        """The engine for a request: the one X-data-parallel-rank names (an integer in range),
        else the next in turn, as the API server balances. With ignore_rank the header is
        dropped and every request lands on engine 0, as when a proxy strips the header and
        the balancer's load figures are stale during a burst (deterministic on purpose)."""
        with self.lock:
            if self.config.ignore_rank:
                return 0
            if header is not None and re.fullmatch(r"[0-9]+", header.strip()) \
                    and int(header) < len(self.running):
                return int(header)
            engine = self.next_engine % len(self.running)
            self.next_engine += 1
            return engine

    def in_flight(self, engine: int) -> int:
        """Requests the gauges show on an engine: running, and those not yet counted out."""
        now = time.monotonic()
        with self.lock:
            self.lingering = [(e, until) for e, until in self.lingering if until > now]
            return self.running[engine] + sum(1 for e, _ in self.lingering if e == engine)

    def completions_by_engine(self) -> dict[int, int]:
        """How many completions each engine served (for assertions)."""
        with self.lock:
            return dict(enumerate(self.served))

    def log(self, entry: dict) -> None:
        with self.lock:
            self.requests.append(entry)

    def completions(self) -> list[dict]:
        with self.lock:
            return [r for r in self.requests if r["path"].endswith("/v1/completions")]

    def take_fault(self) -> bool:
        """Whether the fault hits this request: always, or while --fault-times lasts."""
        with self.lock:
            if self.faults_left == 0:
                return False
            self.faults_left -= self.faults_left > 0
            return True

    def count(self, name: str, value: float, engine: int = 0, **labels) -> None:
        key = (name, tuple(sorted(dict(labels, engine=str(engine)).items())))
        with self.lock:
            self.counters[key] = self.counters.get(key, 0.0) + value

    def steps(self, engine: int, tokens: list[int]) -> None:
        """Engine steps of `tokens` each, into vllm:iteration_tokens_total (a histogram:
        bucket counts, then count and sum)."""
        with self.lock:
            counts = self.histograms[engine]
            for n in tokens:
                for i, bound in enumerate(STEP_BUCKETS):
                    if n <= bound:
                        counts[i] += 1
                counts[-2] += 1
                counts[-1] += n

    def completed_one(self) -> None:
        """A completion finished; with reset_after, the counters then restart from 0."""
        with self.lock:
            self.completed += 1
            if self.config.reset_after and self.completed == self.config.reset_after:
                self.counters = {key: 0.0 for key in self.counters}
                self.histograms = {e: [0.0] * len(h) for e, h in self.histograms.items()}

    def speculate(self, engine: int, n_out: int, peak: int = 1, left: int = 1) -> None:
        """Draft/verify counters for n_out tokens: each step emits its accepted tokens plus
        one; spec_accept says which share of drafts each position accepts. Its steps ran at
        the largest batch seen while it ran (`peak`), its last two at the batch left when
        it ended (`left`, a tail when others had finished first), each drafting that batch
        size's k; an ngram proposer drafts three fewer on every other step."""
        cfg = self.config
        accept = [min(max(p, 0.0), 1.0) for p in cfg.spec_accept[:cfg.k_max()]]
        drafts = math.ceil(n_out / (1 + sum(accept)))
        accepted = max(n_out - drafts, 0)
        per_pos = [min(drafts, round(accepted * p / sum(accept))) if sum(accept) else 0
                   for p in accept]
        if per_pos:
            per_pos[0] += accepted - sum(per_pos)
        tail = min(2, drafts) if left < peak else 0
        sizes = [peak] * (drafts - tail) + [left] * tail
        draft_tokens = sum(max(cfg.k_at(b) - 3 * (cfg.spec_method == "ngram" and i % 2), 1)
                           for i, b in enumerate(sizes))
        self.count("vllm:spec_decode_num_drafts_total", drafts, engine)
        self.count("vllm:spec_decode_num_draft_tokens_total", draft_tokens, engine)
        self.count("vllm:spec_decode_num_accepted_tokens_total", accepted, engine)
        for position, value in enumerate(per_pos):
            self.count("vllm:spec_decode_num_accepted_tokens_per_pos_total", value, engine,
                       position=str(position))

    def cached_prefix(self, ids: list[int], engine: int = 0) -> int:
        """Whole leading blocks this engine saw before; the last token is always computed."""
        hashes, cached = [], 0
        for end in range(BLOCK, len(ids), BLOCK):
            hashes.append(hash(tuple(ids[:end])))
        with self.lock:
            cache = self.cache[engine]
            for h in hashes:
                if h not in cache:
                    break
                cached += BLOCK
            cache.update(hashes)
        return cached


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    @property
    def state(self) -> FakeState:
        return self.server.state

    def log_message(self, format, *args):     # keep test output clean
        pass

    # -- plumbing ---------------------------------------------------------
    def send_json(self, status: int, doc, headers: dict | None = None) -> None:
        data = json.dumps(doc).encode()
        self.send_bytes(status, data, "application/json", headers)

    def send_bytes(self, status: int, data: bytes, ctype: str, headers: dict | None = None):
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str, etype: str = "BadRequestError",
                        param=None) -> None:
        message += self.state.config.echo_error_text
        self.send_json(status, {"error": {"message": message, "type": etype, "param": param,
                                          "code": status}})

    def read_body(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def authorized(self) -> bool:
        key = self.state.config.api_key
        if not key or not self.path.startswith("/v1"):
            return True
        if self.headers.get("authorization") == f"Bearer {key}":
            return True
        self.send_json(401, {"error": "Unauthorized"})
        return False

    def handle_one_request(self):
        self.entry = None
        super().handle_one_request()
        if self.entry is not None and self.entry["done"] is None:
            self.entry["done"] = time.monotonic()

    def note(self, body) -> None:
        """Log the request; `arrived` is when its headers were read, `done` when answered."""
        self.entry = {"path": self.path, "method": self.command, "headers": dict(self.headers),
                      "body": body, "arrived": time.monotonic(), "done": None}
        self.state.log(self.entry)

    # -- endpoints --------------------------------------------------------
    def do_GET(self):
        self.note(None)
        cfg = self.state.config
        if self.path == "/health":
            ready = time.monotonic() - self.state.started >= cfg.health_delay_s
            return self.send_bytes(200 if ready else 503, b"", "application/json")
        if self.path == "/version":
            return self.send_json(200, {"version": VERSION})
        if self.path == "/metrics":
            return self.metrics()
        if self.path == "/is_sleeping" and cfg.dev_mode:
            return self.send_json(200, {"is_sleeping": self.state.sleep_level is not None})
        if not self.authorized():
            return
        if self.path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": int(time.time()),
                "owned_by": "vllm", "root": f"/models/{name}", "parent": None,
                **({"max_model_len": cfg.max_model_len} if cfg.models_report_len else {}),
                "permission": [{"id": "modelperm-0", "object": "model_permission"}]}
                for name in (cfg.model, *cfg.extra_models)]})
        self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        body = self.read_body()
        self.note(body)
        if not self.authorized():
            return
        if self.state.config.dev_mode and self.path.split("?")[0] in ("/sleep", "/wake_up"):
            return self.sleep_route()
        if self.path == "/tokenize":
            if not self.state.config.tokenize:
                return self.send_json(404, {"detail": "Not Found"})
            ids = tokenize(str((body or {}).get("prompt", "")))
            return self.send_json(200, {"count": len(ids),
                                        "max_model_len": self.state.config.max_model_len,
                                        "tokens": ids + [TOKEN_ID_MARKER], "token_strs": None})
        if self.path == "/v1/completions":
            return self.completion(body or {})
        if self.path == "/v1/chat/completions":
            body = body if isinstance(body, dict) else {}
            messages = body.get("messages") if isinstance(body.get("messages"), list) else []
            if any(COPY_OPEN in str(m.get("content", "")) for m in messages
                   if isinstance(m, dict)) or not messages:
                return self.copy_request(body, chat=True)
            return self.completion(body, chat=True)
        self.send_json(404, {"detail": "Not Found"})

    def sleep_route(self):
        """POST /sleep?level=N (0 to 2, default 1) and POST /wake_up, as vLLM 0.32's dev
        routes answer them; every engine sleeps and wakes together."""
        path, _, query = self.path.partition("?")
        if path == "/wake_up":
            self.state.sleep_level = None
            return self.send_json(200, {"status": "awake", "tags": None})
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        level = params.get("level", "1")
        if level not in ("0", "1", "2"):
            return self.send_json(422, {"detail": [{
                "type": "less_than_equal" if level.isdigit() else "int_parsing",
                "loc": ["query", "level"], "msg": "Input should be a valid integer, between "
                "0 and 2", "input": level}]})
        self.state.sleep_level = int(level)
        return self.send_json(200, {"status": "sleeping", "level": int(level)})

    def metrics(self):
        cfg, st = self.state.config, self.state
        if cfg.metrics_mode == "404":
            return self.send_json(404, {"detail": "Not Found"})
        if cfg.metrics_mode == "flaky_once" and not st.metrics_failed:
            st.metrics_failed = True          # the first read: connection dropped, no answer
            self.close_connection = True
            return
        if cfg.metrics_mode == "garbage":
            return self.send_bytes(200, b"<html><body>metrics moved</body></html>", "text/html")
        engines = range(len(st.running))
        in_flight = [st.in_flight(e) for e in engines]
        with st.lock:
            # A data-parallel server publishes an engine's gauge samples only once that
            # engine has run a request; a single engine shows them from the start.
            sampled = [cfg.engines <= 1 or st.served[e] or in_flight[e] for e in engines]
            counters = dict(st.counters)
        lines = []
        if cfg.metrics_mode != "absent":
            for gauge, help_text in (
                    ("vllm:num_requests_running",
                     "Number of requests in model execution batches."),
                    ("vllm:num_requests_waiting", "Number of requests waiting.")):
                lines += [f"# HELP {gauge} {help_text}", f"# TYPE {gauge} gauge"]
                for engine in engines:
                    running = min(in_flight[engine], cfg.max_num_seqs)
                    value = running if gauge.endswith("running") else in_flight[engine] - running
                    v = cfg.gauge_values.get((gauge, str(engine)), value)
                    if sampled[engine] or (gauge, str(engine)) in cfg.gauge_values:
                        lines.append(f'{gauge}{{engine="{engine}",model_name="{cfg.model}"}} '
                                     f'{float(v)}')
        # prometheus_client's process collector: the API server process's start time.
        lines += ["# HELP process_start_time_seconds Start time of the process since unix "
                  "epoch in seconds.", "# TYPE process_start_time_seconds gauge",
                  f"process_start_time_seconds {go_float(st.process_start)}"]
        # Published by every vLLM 0.32, per engine: awake 1 while awake; asleep, the level's
        # sample is 1 (level 0, a KV cache release, sets neither).
        level = st.sleep_level
        lines += ["# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine "
                  "is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means "
                  "sleep level 1; discard_all = 1 means sleep level 2.",
                  "# TYPE vllm:engine_sleep_state gauge"]
        for engine in engines:
            for state, on in (("awake", level is None), ("discard_all", level == 2),
                              ("weights_offloaded", level == 1)):
                lines.append(f'vllm:engine_sleep_state{{engine="{engine}",model_name='
                             f'"{cfg.model}",sleep_state="{state}"}} {float(on)}')
        lines += ["# TYPE vllm:num_requests_waiting_by_reason gauge",
                  f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="{cfg.model}",'
                  f'reason="capacity"}} {float(cfg.waiting_by_reason)}']
        declared = set()
        for (name, labels), value in sorted(counters.items()):
            inner = ",".join(f'{k}="{v}"' for k, v in
                             sorted(dict(labels, model_name=cfg.model).items()))
            if name not in declared:          # as prometheus_client writes a counter
                declared.add(name)
                lines.append(f"# TYPE {name} counter")
            shown = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}.get(str(float(value)),
                                                                    str(float(value)))
            lines.append(f"{name}{{{inner}}} {shown}")     # as prometheus_client writes it
            # Every counter also has a *_created sample: a Unix time, never a count.
            lines.append(f"{name[:-len('_total')]}_created{{{inner}}} {st.process_start}")
        lines += self.iteration_histogram(st, cfg)
        text = "\n".join(lines) + "\n"
        if cfg.engine_label != "engine":
            text = text.replace('{engine="', "{" + cfg.engine_label + '="').replace(
                ',engine="', "," + cfg.engine_label + '="')
        self.send_bytes(200, text.encode(),
                        "text/plain; version=0.0.4; charset=utf-8")

    def count_out(self, engine: int) -> None:
        """A request has finished on its engine: out of the gauges (late with
        late_gauge_s)."""
        st, cfg = self.state, self.state.config
        with st.lock:
            live = st.live.pop(id(self), [engine, st.running[engine]])
            self.spec_shape = (live[1], st.running[engine])   # (largest batch, batch left)
            st.running[engine] -= 1
            st.served[engine] += 1
            if cfg.late_gauge_s:
                st.lingering.append((engine, time.monotonic() + cfg.late_gauge_s))

    @staticmethod
    def iteration_histogram(st, cfg) -> list[str]:
        """vllm:iteration_tokens_total, per engine: tokens per engine step."""
        name = "vllm:iteration_tokens_total"
        lines = [f"# HELP {name} Histogram of number of tokens per engine_step.",
                 f"# TYPE {name} histogram"]
        with st.lock:
            histograms = {e: list(h) for e, h in st.histograms.items()}
        for engine, counts in sorted(histograms.items()):
            labels = f'engine="{engine}",model_name="{cfg.model}"'
            for bound, value in zip(STEP_BUCKETS, counts):
                lines.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {value}')
            lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {counts[-2]}')
            lines.append(f"{name}_count{{{labels}}} {counts[-2]}")
            lines.append(f"{name}_sum{{{labels}}} {counts[-1]}")
            lines.append(f"{name}_created{{{labels}}} {st.process_start}")
        return lines

    # -- completions --------------------------------------------------------
    def completion(self, body: dict, chat: bool = False):
        if not chat and COPY_OPEN in str(body.get("prompt", "")):
            return self.copy_request(body, chat=False)
        cfg, st = self.state.config, self.state
        kinds = request_kinds(body, chat)
        lacking = sorted(kinds & set(cfg.lack_paths))
        if lacking:
            return self.send_error_json(400, CHAT_TEMPLATE_ERROR if lacking[0] == "chat"
                                        else LACK_ERRORS.get(lacking[0], "not supported"))
        priority = body.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            return self.send_json(400, {"error": {"message": "Input should be a valid integer",
                                                  "type": "Bad Request", "param": "body.priority",
                                                  "code": 400}})
        if cfg.reject_priority and priority != 0:
            return self.send_error_json(400, "Got priority 20 but Priority scheduling is not "
                                             "enabled.", param="priority")
        if chat:
            ids = tokenize("\n".join(str(m.get("content", "")) for m in body["messages"]
                                     if isinstance(m, dict))) + [2] * CHAT_TEMPLATE_TOKENS
        else:
            ids = tokenize(str(body.get("prompt", "")))
        n_prompt = len(ids)
        max_tokens = int(body.get("max_tokens") or 16)
        min_tokens = int(body.get("min_tokens") or 0)
        if n_prompt > cfg.max_model_len:
            return self.send_error_json(
                400, f"This model's maximum context length is {cfg.max_model_len} tokens. "
                     f"However, your prompt contains at least {n_prompt} input tokens, which "
                     f"is too many.", param="input_tokens")
        max_tokens = min(max_tokens, cfg.max_model_len - n_prompt)
        if min_tokens > max_tokens:
            return self.send_error_json(400, f"min_tokens must be less than or equal to "
                                             f"max_tokens={max_tokens}, got {min_tokens}.")
        rid = str(body.get("request_id", ""))
        fault = cfg.fault if cfg.fault_match in rid and self.state.take_fault() else ""
        if fault == "status":
            return self.send_error_json(cfg.fault_status, cfg.fault_message,
                                        "InternalServerError" if cfg.fault_status >= 500
                                        else "BadRequestError")
        if fault == "redirect":
            host, port = self.server.server_address[:2]
            return self.send_bytes(307, b"", "text/plain",
                                   {"location": f"http://{host}:{port}/redirected"})
        engine = st.route(self.headers.get("X-data-parallel-rank"))
        self.entry["engine"] = engine
        cached = st.cached_prefix(ids, engine)
        with st.lock:
            st.running[engine] += 1
            for live in st.live.values():      # the batch it runs in grows with each arrival
                if live[0] == engine:
                    live[1] = max(live[1], st.running[engine])
            st.live[id(self)] = [engine, st.running[engine]]
            compile_lines, cfg.compile_lines = cfg.compile_lines, 0
            # A shape not served before is cold: the first batch at a depth, the first long
            # prefill, on each engine.
            shapes = {(engine, st.running[engine])} | \
                ({(engine, "long")} if n_prompt > 4096 else set()) | \
                {(engine, k) for k in kinds & set(cfg.cold_paths)}
            cold = cfg.cold_s * len(shapes - st.warm_shapes)
            self.entry["cold_s"] = cold      # what the tests check, beside the timings
            st.warm_shapes |= shapes
        for _ in range(compile_lines):
            print("WARNING [monitor.py] JIT compilation during inference: a kernel was "
                  "compiled for a new shape", flush=True)
        streaming = bool(body.get("stream"))
        try:
            # A stream is answered as it decodes; a plain request after the whole latency.
            st.stop.wait(cold + (0.2 if streaming else 1.0) * cfg.latency_s
                         + (5.0 if fault == "slow" else 0.0))
            if fault == "hang":
                st.stop.wait(600)
                self.close_connection = True
                return
        finally:
            if not streaming or fault == "hang":    # a stream runs until its last event
                self.count_out(engine)
        if st.aborting.is_set():      # vLLM 0.32 on TERM with --shutdown-timeout 0
            return self.send_json(500, {"error": {
                "message": "The request was aborted: the server is shutting down.",
                "type": "InternalServerError", "param": None, "code": 500}})
        n_out = max_tokens if body.get("ignore_eos") else max(min_tokens, 1)
        finish, stop_reason = ("length", None) if n_out >= max_tokens else ("stop", EOS_ID)
        if "json" in kinds:                  # the grammar ends the object early
            n_out, finish, stop_reason = min(n_out, len(tokenize(JSON_ANSWER)) + 1), "stop", None
        if fault == "one_token":
            n_out, finish, stop_reason = 1, "stop", EOS_ID
        elif fault == "stop_string":
            finish, stop_reason = "stop", "</answer>"
        elif fault == "wrong_finish":
            finish = "abort"
        elif fault == "cache_hit":
            cached = n_prompt - n_prompt % BLOCK
        reported_prompt = 1000 if fault == "short_prompt_tokens" else n_prompt
        st.count("vllm:prompt_tokens_total", n_prompt, engine)
        st.count("vllm:generation_tokens_total", n_out + cfg.counter_skew, engine)
        st.count("vllm:request_success_total", 1, engine, finished_reason=finish)
        st.count("vllm:prefix_cache_queries_total", n_prompt, engine)
        st.count("vllm:prefix_cache_hits_total", cached, engine)
        if cfg.speculative:
            st.speculate(engine, n_out, *getattr(self, "spec_shape", (1, 1)))
        # As vLLM 0.32 counts a step's tokens: a prefill chunk that ends without output adds
        # nothing; the step that ends the prefill adds the whole prompt and the first token.
        chunks = -(-(n_prompt - cached) // max(cfg.max_num_batched_tokens, 1))
        st.steps(engine, [0] * max(chunks - 1, 0) + [n_prompt + 1] + [1] * max(n_out - 1, 0))
        st.completed_one()
        doc = self.completion_doc(body, reported_prompt, n_out, finish, stop_reason, cached)
        if chat:
            doc = chat_doc(doc, body)
        elif body.get("logprobs"):
            doc["choices"][0]["logprobs"] = completion_logprobs(n_out)
        if not chat and isinstance(body.get("prompt_logprobs"), int):
            # vLLM's shape: None for the first prompt token, then token id -> Logprob
            # (its decoded text: the marker, which must never reach a record).
            doc["choices"][0]["prompt_logprobs"] = [None] + [
                {str(TOKEN_ID_MARKER): {"logprob": -0.5, "rank": 1,
                                        "decoded_token": TEXT_MARKER}}
                for _ in range(min(reported_prompt, 64) - 1)]
        if "json" in kinds:
            chosen = doc["choices"][0]
            if chat:
                chosen["message"]["content"] = JSON_ANSWER
            else:
                chosen["text"] = JSON_ANSWER
        if streaming:
            try:
                return self.send_stream(doc, bool((body.get("stream_options") or {})
                                                  .get("include_usage")))
            finally:
                self.count_out(engine)
        if fault == "no_usage":
            del doc["usage"]
        if fault == "no_choices":
            del doc["choices"]
        data = json.dumps(doc).encode()
        if fault == "truncated_json":
            data = data[:len(data) // 2]
        if fault == "not_json":
            data = f"<html>{TEXT_MARKER} upstream error</html>".encode()
        self.send_completion(fault, data)

    def completion_doc(self, body, n_prompt, n_out, finish, stop_reason, cached) -> dict:
        cfg = self.state.config
        details = ({"cached_tokens": cached, "created_cache_tokens": None,
                    "multimodal_tokens": None} if cfg.prompt_tokens_details else None)
        metrics = None
        if cfg.per_request_metrics:
            metrics = {"time_to_first_token_ms": 12.5, "generation_time_ms": 80.0,
                       "queue_time_ms": 0.4, "mean_itl_ms": 2.1, "tokens_per_second": 400.0,
                       "speculative_decoding": ({"num_drafts": 7, "num_draft_tokens": 35,
                                                 "num_accepted_tokens": 25,
                                                 "accepted_per_position": [7, 6, 5, 4, 3]}
                                                if cfg.speculative else None)}
        text = f"{TEXT_MARKER} " + " ".join(["lorem"] * (n_out - 1))
        return {
            "id": f"cmpl-{os.urandom(16).hex()}", "object": "text_completion",
            "created": int(time.time()), "model": body.get("model", cfg.model),
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                         "stop_reason": stop_reason, "token_ids": None,
                         "prompt_logprobs": None, "prompt_token_ids": None,
                         "routed_experts": None}],
            "service_tier": None, "system_fingerprint": f"vllm-{VERSION}-{os.urandom(4).hex()}",
            "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_out,
                      "completion_tokens": n_out, "prompt_tokens_details": details,
                      "completion_tokens_details": None},
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": metrics,
        }

    def send_stream(self, doc: dict, include_usage: bool) -> None:
        """Server-sent events in chunked transfer coding, one token an event, as vLLM streams."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        choice = doc["choices"][0]
        n_out = doc["usage"]["completion_tokens"]
        pause = 0.8 * self.state.config.latency_s / max(n_out, 1)

        def event(payload) -> None:
            data = b"data: " + (payload if isinstance(payload, bytes)
                                else json.dumps(payload).encode()) + b"\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        chat = doc.get("object") == "chat.completion"
        chunk = dict(doc, object="chat.completion.chunk") if chat else doc
        try:
            for i in range(n_out):
                last = i == n_out - 1
                text = TEXT_MARKER if i == 0 else " lorem"
                piece = {"index": 0, "logprobs": None,
                         "finish_reason": choice["finish_reason"] if last else None,
                         "stop_reason": choice["stop_reason"] if last else None}
                if chat:
                    piece["delta"] = {"role": "assistant", "content": text} if i == 0 \
                        else {"content": text}
                    if choice.get("logprobs"):
                        piece["logprobs"] = {"content": choice["logprobs"]["content"][i:i + 1]}
                else:
                    piece["text"] = text
                event(dict(chunk, usage=None, choices=[piece]))
                if not last and pause:
                    self.state.stop.wait(pause)
            if include_usage:
                event(dict(chunk, choices=[]))
            event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def send_completion(self, fault: str, data: bytes) -> None:
        """The 200 answer; a body fault sends the headers, then misbehaves and closes."""
        if fault not in ("headers_close", "oversized", "oversized_stream", "trickle"):
            return self.send_bytes(200, data, "application/json")
        length = {"oversized": 10 << 20, "oversized_stream": None}.get(fault, len(data))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if length is None:                  # no length: the body runs until the close
            self.send_header("connection", "close")
        else:
            self.send_header("content-length", str(length))
        self.end_headers()
        self.close_connection = True
        try:
            if fault.startswith("oversized"):
                for _ in range((10 << 20) // 65536):
                    self.wfile.write(b" " * 65536)
            elif fault == "trickle":
                for i in range(len(data)):
                    if self.state.stop.wait(self.state.config.trickle_interval_s):
                        break
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
            self.wfile.flush()              # headers_close: the headers, and nothing more
        except OSError:
            pass


    # -- copy probes (the quality gate): chat completions, and raw ones with markers ----
    def copy_request(self, body: dict, chat: bool):
        """Answer a copy probe as config.copy says, with vLLM's chat or completion shape."""
        cfg, st = self.state.config, self.state
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages \
                    or not all(isinstance(m, dict) for m in messages):
                return self.send_json(400, {"error": {
                    "message": "Field required", "type": "Bad Request",
                    "param": "body.messages", "code": 400}})
            kwargs = body.get("chat_template_kwargs")
            if kwargs is not None and not isinstance(kwargs, dict):
                return self.send_json(400, {"error": {
                    "message": "Input should be a valid dictionary", "type": "Bad Request",
                    "param": "body.chat_template_kwargs", "code": 400}})
            prompt = "\n".join(str(m.get("content", "")) for m in messages)
        else:
            prompt = str(body.get("prompt", ""))
        fault = cfg.fault if cfg.fault_match in str(body.get("request_id", "")) and \
            self.state.take_fault() else ""
        if fault == "chat_template" and chat:
            return self.send_error_json(400, CHAT_TEMPLATE_ERROR)
        if fault == "status":
            return self.send_error_json(cfg.fault_status, cfg.fault_message,
                                        "InternalServerError" if cfg.fault_status >= 500
                                        else "BadRequestError")
        n_prompt = len(tokenize(prompt)) + (CHAT_TEMPLATE_TOKENS if chat else 0)
        max_tokens = body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 16
        if n_prompt + max_tokens > cfg.max_model_len:
            return self.send_error_json(
                400, f"This model's maximum context length is {cfg.max_model_len} tokens. "
                     f"However, you requested {n_prompt + max_tokens} tokens ({n_prompt} in "
                     f"the messages, {max_tokens} in the completion). Please reduce the length "
                     f"of the messages or completion.", param="input_tokens")
        engine = st.route(self.headers.get("X-data-parallel-rank"))
        self.entry["engine"] = engine
        me = {"batched": False}
        with st.lock:
            st.running[engine] += 1
            st.copying.append(me)
            if len(st.copying) > 1:               # requests in flight together: a batch
                for other in st.copying:
                    other["batched"] = True
        try:
            st.stop.wait(max(cfg.latency_s, 0.05))
        finally:
            with st.lock:
                st.copying.remove(me)
                st.running[engine] -= 1
                st.served[engine] += 1
        reference = copy_reference(prompt)
        reasoning, reasoning_tokens, stop_reason = None, None, None
        if fault == "reasoning_exhausted":
            answer, n_out, finish = None, max_tokens, "length"
            reasoning, reasoning_tokens = f"{TEXT_MARKER} Let me think about this.", max_tokens
        else:
            answer = f"{TEXT_MARKER} lorem" if reference is None else \
                copy_answer(reference, cfg.copy, me["batched"])
            if not chat:
                answer += "\n"                   # then the stop string, which is not returned
            n_out = len(tokenize(answer))         # its tokens and an end-of-text token
            finish = "stop"
            if n_out > max_tokens:
                answer, n_out, finish = answer[:len(answer) * max_tokens // n_out], \
                    max_tokens, "length"
            elif not chat:
                stop_reason = COPY_CLOSE.strip()   # the stop string that ended it
        st.count("vllm:prompt_tokens_total", n_prompt, engine)
        st.count("vllm:generation_tokens_total", n_out, engine)
        st.count("vllm:request_success_total", 1, engine, finished_reason=finish)
        st.count("vllm:prefix_cache_queries_total", n_prompt, engine)
        if not chat:
            doc = self.completion_doc(body, n_prompt, n_out, finish, stop_reason, 0)
            doc["choices"][0]["text"] = answer
            return self.send_json(200, doc)
        details = ({"cached_tokens": 0, "created_cache_tokens": None, "multimodal_tokens": None}
                   if cfg.prompt_tokens_details else None)
        self.send_json(200, {
            "id": f"chatcmpl-{os.urandom(16).hex()}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", cfg.model),
            "choices": [{"index": 0, "message": {
                "role": "assistant", "content": answer, "refusal": None, "annotations": None,
                "audio": None, "function_call": None, "tool_calls": [], "reasoning": reasoning},
                "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason,
                "token_ids": None}],
            "service_tier": None, "system_fingerprint": f"vllm-{VERSION}-{os.urandom(4).hex()}",
            "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_out,
                      "completion_tokens": n_out, "prompt_tokens_details": details,
                      "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}
                      if reasoning_tokens else None},
            "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # uvicorn's default --backlog; socketserver's 5 drops handshakes when a wave opens more
    # connections at once (4 engines x B4), and TCP retries them a second later.
    request_queue_size = 2048

    def handle_error(self, request, client_address):
        """A client that hung up (the helper at its deadline) is expected, not an error."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class FakeServer:
    """A FakeServer on 127.0.0.1 and an ephemeral port, in a background thread."""

    def __init__(self, config: FakeConfig | None = None, port: int = 0):
        self.state = FakeState(config or FakeConfig())
        self.httpd = _Server(("127.0.0.1", port), Handler)
        self.httpd.state = self.state
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def config(self) -> FakeConfig:
        return self.state.config

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> "FakeServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.state.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def drain(self, shutdown_timeout_s: float) -> None:
        """What vLLM 0.32 does on TERM: with --shutdown-timeout S > 0 it takes no new
        connection and waits up to S seconds for the requests in flight to finish; with 0
        (its default) it aborts them (HTTP 500)."""
        st = self.state
        if shutdown_timeout_s <= 0:
            st.aborting.set()
            st.stop.set()                 # wake the requests in flight: they answer 500
            time.sleep(0.2)
            return
        self.httpd.shutdown()             # no new connection is taken
        self.httpd.server_close()
        deadline = time.monotonic() + shutdown_timeout_s
        while time.monotonic() < deadline:
            with st.lock:
                if not any(st.running):
                    break
            time.sleep(0.02)
        time.sleep(0.1)                   # the last answers leave their sockets


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="A fake vLLM 0.32 OpenAI server (tests, demo).")
    parser.add_argument("--host", default="127.0.0.1",
                        help="accepted as vLLM's; the fake listens on 127.0.0.1 only")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any)")
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--max-num-batched-tokens", type=human_int, default=4096,
                        help="the prefill chunk: a longer prompt is prefilled in steps of "
                             "this many tokens (vllm:iteration_tokens_total shows them); "
                             "16K = 16384, 8k = 8000, as vLLM reads it")
    parser.add_argument("--cpu-build", action="store_true",
                        help="log no chunk at start, as vLLM 0.32's CPU build does not")
    parser.add_argument("--api-key", default=os.environ.get("FAKE_VLLM_API_KEY"),
                        help="require this key under /v1 (default: $FAKE_VLLM_API_KEY)")
    parser.add_argument("--latency-s", type=float, default=0.05,
                        help="engine time of one completion")
    parser.add_argument("--fault", choices=FAULTS, default="")
    parser.add_argument("--fault-match", default="", help="request ids the fault hits")
    parser.add_argument("--fault-times", type=int, default=0,
                        help="the fault hits only the first N requests it matches (a "
                             "transient fault; 0: every one)")
    parser.add_argument("--copy", choices=COPY_MODES, default="faithful",
                        help="how the quality gate's copy probes are answered (chat and raw "
                             "completions): faithful (exact), typos, garbage")
    parser.add_argument("--metrics-mode", choices=METRICS_MODES, default="normal")
    parser.add_argument("--engine-label", default="engine",
                        help="the engine's label name in /metrics (a vLLM that renamed it)")
    parser.add_argument("--busy", type=float, default=0.0,
                        help="report this many running requests on engine 0")
    parser.add_argument("--prompt-tokens-details", action="store_true")
    parser.add_argument("--per-request-metrics", action="store_true")
    parser.add_argument("--health-delay-s", type=float, default=0.0,
                        help="/health answers 503 for this long after start")
    parser.add_argument("--lack-paths", default="", metavar="LIST",
                        help=f"request kinds answered 400 (of {', '.join(PATH_KINDS)}): a "
                             f"server without a grammar back-end or a chat template")
    parser.add_argument("--cold-paths", default="", metavar="LIST",
                        help="request kinds whose first request per engine waits --cold-s")
    parser.add_argument("--cold-s", type=float, default=0.0,
                        help="extra time for the first request of each batch depth and the "
                             "first long prompt (what a warm-up pays)")
    parser.add_argument("--compile-lines", type=int, default=0,
                        help="print this many JIT-compilation log lines at the first completion")
    parser.add_argument("--engines", type=int, default=1,
                        help="engines behind the API server (vLLM's --data-parallel-size)")
    parser.add_argument("--ignore-rank", action="store_true",
                        help="balance requests even when X-data-parallel-rank names an engine")
    parser.add_argument("--late-gauge-s", type=float, default=0.0,
                        help="count a finished request out of the gauges this much later")
    parser.add_argument("--exit-after-s", type=float, default=0.0,
                        help="exit with --exit-status this long after start (a dying server)")
    parser.add_argument("--exit-when", default="", metavar="PATH",
                        help="exit with --exit-status once this file exists (a server that "
                             "dies when a test says so)")
    parser.add_argument("--exit-status", type=int, default=3,
                        help="the status of --exit-after-s (vLLM exits 0 when its engine "
                             "core dies)")
    parser.add_argument("--chatter-bytes", type=int, default=0,
                        help="write this many bytes of log lines at start (a log to rotate)")
    parser.add_argument("--fail-start", action="store_true",
                        help="fail at start as vLLM does without its memory: a traceback, "
                             "then 60 lines of shutdown, exit 1")
    parser.add_argument("--dev-mode", action="store_true",
                        help="as VLLM_SERVER_DEV_MODE=1: POST /sleep?level=N, POST /wake_up "
                             "and GET /is_sleeping answer (vllm:engine_sleep_state follows)")
    parser.add_argument("--asleep", type=int, choices=(0, 1, 2), default=None,
                        metavar="LEVEL", help="start asleep at this sleep level")
    parser.add_argument("--k-schedule", default="", metavar="LIST",
                        help="k by batch size, as K1's server drafts (1-2:5,3-4:4); default: "
                             "5 at every size")
    parser.add_argument("--spec-method", choices=("mtp", "ngram"), default="mtp",
                        help="mtp drafts k every step; ngram at most k (fewer on some steps)")
    parser.add_argument("--speculative-config", type=json.loads, default=None,
                        metavar="JSON", help="vLLM's own flag: its method (ngram, else mtp) "
                        "and num_speculative_tokens (k at every size) set the two above")
    parser.add_argument("--engine-process", action="store_true",
                        help="run an engine-core child in its process group, as vLLM does: "
                             "when it ends (a TERM to the whole group), the requests in flight "
                             "fail (HTTP 500) whatever --shutdown-timeout says")
    parser.add_argument("--shutdown-timeout", type=float, default=0.0, metavar="S",
                        help="on TERM, wait up to S s for requests in flight (vLLM 0.32's "
                             "--shutdown-timeout; 0, its default: abort them, HTTP 500)")
    parser.add_argument("--ignore-term", action="store_true",
                        help="ignore TERM and INT (a server stuck in its teardown): only a "
                             "KILL ends it")
    parser.add_argument("--demo", action="store_true",
                        help="serve on a free port, run warmup_serve.sh against it, stop; "
                             "exits with the warm-up's status")
    return parser


def run_demo(server: FakeServer) -> int:
    """The README's demo: the real wrapper and helper against this fake, then stop."""
    import subprocess, tempfile       # the demo's alone: each test's fake starts without them
    here = os.path.dirname(os.path.abspath(__file__))
    wrapper = os.path.join(os.path.dirname(here), "warmup_serve.sh")
    records = os.environ.get("WARMUP_RECORDS_DIR") or tempfile.mkdtemp(prefix="warmup-demo-")
    # As start.sh would: the server's prefill chunk, which /metrics does not show.
    env = dict(os.environ, WARMUP_RECORDS_DIR=records, WARMUP_LOCK_DIR=records,
               WARMUP_CHUNK_TOKENS=str(server.config.max_num_batched_tokens))
    env.pop("WARMUP_MODEL", None)
    print(f"fake vLLM {VERSION} at {server.url}; running {os.path.relpath(wrapper)}", flush=True)
    try:
        return subprocess.call(["bash", wrapper, "--base-url", server.url], env=env)
    finally:
        server.stop()


def human_int(text: str) -> int:
    """vLLM 0.32's human_readable_int: 16K = 16384, 8k = 8000, 25.6k = 25600."""
    found = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmgtKMGT])", text.strip())
    if not found:
        return int(text)
    number, suffix = found.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)


def process_start_time() -> float:
    """This process's start as prometheus_client's process collector reads it (boot time
    plus the start in clock ticks): never after the process began, so never after a
    /health that start.sh timed after launching it."""
    with open("/proc/stat") as stat:
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
    with open("/proc/self/stat") as own:
        ticks = int(own.read().rpartition(")")[2].split()[19])   # field 22, starttime
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if isinstance(args.speculative_config, dict):       # as a manifest's server command
        spec = args.speculative_config
        args.spec_method = "ngram" if spec.get("method") == "ngram" else "mtp"
        k = spec.get("num_speculative_tokens")
        args.k_schedule = f"1-4096:{k}" if isinstance(k, int) and 0 < k < 64 else args.k_schedule
    config = FakeConfig(model=args.model, max_model_len=args.max_model_len,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        lack_paths=tuple(p for p in args.lack_paths.split(",") if p),
                        cold_paths=tuple(p for p in args.cold_paths.split(",") if p),
                        api_key=args.api_key, latency_s=args.latency_s, fault=args.fault,
                        copy=args.copy,
                        fault_match=args.fault_match, fault_times=args.fault_times,
                        metrics_mode=args.metrics_mode, engine_label=args.engine_label,
                        prompt_tokens_details=args.prompt_tokens_details,
                        per_request_metrics=args.per_request_metrics,
                        health_delay_s=args.health_delay_s, compile_lines=args.compile_lines,
                        cold_s=args.cold_s, engines=args.engines,
                        ignore_rank=args.ignore_rank, late_gauge_s=args.late_gauge_s,
                        dev_mode=args.dev_mode, sleep_level=args.asleep,
                        spec_schedule=parse_schedule(args.k_schedule),
                        spec_method=args.spec_method,
                        gauge_values={("vllm:num_requests_running", "0"): args.busy}
                        if args.busy else {})
    if args.fail_start:
        return fail_start()
    try:
        server = FakeServer(config, 0 if args.demo else args.port)
        server.state.process_start = process_start_time()
        server.start()
    except OSError as exc:
        print(f"fake_vllm.py: cannot listen on 127.0.0.1:{args.port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.demo:
        return run_demo(server)
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN if args.ignore_term else lambda *_: done.set())
    if args.engine_process:
        engine_core(server)
    # vLLM 0.32 says its prefill chunk at start, in this line (the only place it does).
    # vLLM 0.32 says its speculative config in its engine's start line (where k is read).
    print(f"(EngineCore pid={os.getpid()}) INFO [core.py:133] Initializing a V1 LLM engine "
          f"(v{VERSION}) with config: model='{args.model}', speculative_config="
          f"SpeculativeConfig(method='{args.spec_method}', model=None, num_spec_tokens="
          f"{config.k_max()}), "
          f"max_seq_len={args.max_model_len}", flush=True)
    if not args.cpu_build:
        print(f"INFO [scheduler.py:307] Chunked prefill is enabled with "
              f"max_num_batched_tokens={args.max_num_batched_tokens}.", flush=True)
    print(f"fake vLLM {VERSION} listening on {server.url}", flush=True)
    for number in range(args.chatter_bytes // 100 + bool(args.chatter_bytes % 100)):
        print(f"INFO [chatter.py:1] line {number:08d} " + "x" * 70, flush=True)
    if args.exit_when:
        while not done.wait(0.05) and not os.path.exists(args.exit_when):
            pass
    died = not done.wait(args.exit_after_s or None) if not args.exit_when else \
        not done.is_set()                 # a timeout (or the file) means it died
    if not died:
        server.drain(args.shutdown_timeout)
    server.stop()
    if died:
        print("fake vLLM: engine died (--exit-after-s)", flush=True)
        return args.exit_status
    return 0


def engine_core(server: FakeServer) -> None:
    """vLLM's EngineCore: a child in the server's process group. When it ends, the server
    can no longer answer: every request in flight fails (HTTP 500)."""
    import subprocess
    core = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])

    def watch():
        core.wait()
        server.state.aborting.set()
        server.state.stop.set()
    threading.Thread(target=watch, daemon=True).start()
    import atexit
    atexit.register(core.kill)


def parse_schedule(text: str) -> tuple:
    """'1-2:5,3-4:4' -> ((1, 2, 5), (3, 4, 4)); '' -> ()."""
    schedule = []
    for item in filter(None, text.split(",")):
        sizes, _, k = item.partition(":")
        low, _, high = sizes.partition("-")
        schedule.append((int(low), int(high or low), int(k)))
    return tuple(schedule)


def fail_start() -> int:
    """What vLLM prints when it cannot get its memory: the cause, then a long shutdown."""
    print("INFO [api_server.py:1] vLLM API server version 0.32.0 (fake)", flush=True)
    print("ERROR [core.py:708] EngineCore failed to start.\nTraceback (most recent call "
          "last):\n  File \"core.py\", line 699, in run_engine_core\n"
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    for number in range(60):
        print(f"INFO [shutdown.py:{number}] releasing resource {number}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
