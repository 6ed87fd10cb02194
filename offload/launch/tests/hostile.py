"""A raw-socket server that plays scripted bytes per endpoint: the hostile server.

fake_vllm.py answers the way vLLM 0.32 does; this one answers the way an attacker or a
broken proxy might. Each endpoint (/v1/models, /version, /tokenize, /metrics,
/v1/completions) gets either a faithful default answer (the shapes of fake_vllm and of
a real vLLM 0.32: one model "m" with max_model_len 32768, /tokenize counting about 1.6
tokens a word, idle request gauges, a 32-token length completion with usage) or what
the case scripts: raw bytes (status line, headers, body, or nothing at all), a trickle,
a hang, a close, a function of the request, or a list played by request number.

Every request is kept (request line, headers, body) so tests can assert on what the
helper sent. Network: 127.0.0.1 (or ::1) and an ephemeral port only.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field

MODEL = "m"
MAX_MODEL_LEN = 32768
TOKENS_PER_WORD = 1.6
# The generated text carries this marker, so tests can prove it never leaks.
TEXT_MARKER = "GENTEXT-H0ST1LE"
ENDPOINTS = ("/health", "/v1/models", "/version", "/tokenize", "/metrics", "/v1/completions")
MAX_REQUEST_HEAD = 1 << 20
MAX_REQUEST_BODY = 16 << 20          # a runaway prompt is cut here, not held in memory
READ_TIMEOUT_S = 10.0
HANG_LIMIT_S = 30.0                  # a hang ends at stop(), or after this at the latest


# ---------------------------------------------------------------------------
# What the server received.
# ---------------------------------------------------------------------------

@dataclass
class Received:
    """One request as it arrived: its line, headers (in order) and body bytes."""
    endpoint: str | None          # one of ENDPOINTS, or None for any other path
    number: int                   # 0 for the first request to this endpoint, then 1, ...
    request_line: str
    headers: list[tuple[str, str]]
    body: bytes
    body_cut: bool = False        # the body was longer than MAX_REQUEST_BODY
    seen: dict = field(default_factory=dict)   # requests per endpoint before this one

    @property
    def method(self) -> str:
        return self.request_line.split(" ")[0]

    @property
    def target(self) -> str:
        parts = self.request_line.split(" ")
        return parts[1] if len(parts) > 1 else ""

    def header(self, name: str) -> str | None:
        """The first header of that name (case-insensitive), or None."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def json(self):
        """The body parsed as JSON, or None."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def prompt(self) -> str | None:
        doc = self.json()
        prompt = doc.get("prompt") if isinstance(doc, dict) else None
        return prompt if isinstance(prompt, str) else None


# ---------------------------------------------------------------------------
# Answers: bytes, or one of these, or a function of the request, or a list by number.
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Trickle:
    """Send `data` in pieces of `step` bytes, `interval_s` apart, then close."""
    data: bytes
    interval_s: float = 0.5
    step: int = 1


@dataclass(frozen=True)
class Hang:
    """Read the request and answer nothing until the server stops."""
    head: bytes = b""             # sent first (e.g. a status line and some headers)


@dataclass(frozen=True)
class Close:
    """Close the connection without a byte."""


@dataclass(frozen=True)
class Default:
    """The faithful answer for the endpoint (as if the case had not scripted it)."""


# ---------------------------------------------------------------------------
# Building responses.
# ---------------------------------------------------------------------------

def http(status: int = 200, body: bytes | str = b"", headers: list | None = None,
         reason: str | None = None, content_type: str = "application/json",
         length: bool = True, version: str = "HTTP/1.1") -> bytes:
    """A whole response as uvicorn frames it (date, server, content-length, content-type)."""
    data = body.encode() if isinstance(body, str) else body
    reasons = {100: "Continue", 103: "Early Hints", 200: "OK", 400: "Bad Request",
               401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}
    line = f"{version} {status} {reasons.get(status, 'OK') if reason is None else reason}"
    head = [line, "date: Mon, 01 Jan 2024 00:00:00 GMT", "server: uvicorn"]
    if length:
        head.append(f"content-length: {len(data)}")
    if content_type:
        head.append(f"content-type: {content_type}")
    head += [f"{k}: {v}" for k, v in (headers or [])]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data


def json_answer(doc, status: int = 200) -> bytes:
    return http(status, json.dumps(doc))


def error_answer(status: int, message: str, param=None) -> bytes:
    """vLLM's error object (most 4xx/5xx)."""
    etype = "BadRequestError" if status < 500 else "InternalServerError"
    return json_answer({"error": {"message": message, "type": etype, "param": param,
                                  "code": status}}, status)


def chunked(body: bytes, te: str = "chunked", piece: int = 64,
            content_type: str = "application/json") -> bytes:
    """A 200 in chunked transfer coding with the given Transfer-Encoding spelling."""
    out = bytearray(http(200, b"", [("transfer-encoding", te)], content_type=content_type,
                         length=False))
    for start in range(0, len(body), piece):
        part = body[start:start + piece]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    out += b"0\r\n\r\n"
    return bytes(out)


def count_tokens(text: str) -> int:
    """The default tokenizer: a BOS and about 1.6 tokens a word (never one per word)."""
    return 1 + round(len(text.split()) * TOKENS_PER_WORD)


# ---------------------------------------------------------------------------
# The faithful defaults.
# ---------------------------------------------------------------------------

def models_doc(*entries: dict) -> dict:
    data = list(entries) or [model_entry()]
    return {"object": "list", "data": data}


def model_entry(model_id=MODEL, max_model_len=MAX_MODEL_LEN, **extra) -> dict:
    entry = {"id": model_id, "object": "model", "created": 1700000000, "owned_by": "vllm",
             "root": "/models/m", "parent": None, "max_model_len": max_model_len,
             "permission": []}
    entry.update(extra)
    return entry


GAUGE_LINES = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.",
    "# TYPE vllm:num_requests_running gauge",
    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0',
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
    "# TYPE vllm:num_requests_waiting gauge",
    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0',
)
COUNTER_LINES = (
    "# TYPE vllm:prompt_tokens_total counter",
    f'vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} 0.0',
    "# TYPE vllm:generation_tokens_total counter",
    f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 0.0',
    "# TYPE vllm:request_success_total counter",
    f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} 0.0',
)


def metrics_text(*extra_lines: str, at: int | None = None) -> str:
    """The idle gauges (lines 1-6), then `extra_lines` (from line 7, or at line `at`), counters."""
    lines = list(GAUGE_LINES) + list(COUNTER_LINES)
    position = len(GAUGE_LINES) if at is None else at - 1
    lines[position:position] = list(extra_lines)
    return "\n".join(lines) + "\n"


def metrics_answer(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return http(200, data, content_type="text/plain; version=0.0.4; charset=utf-8")


def completion_doc(model: str = MODEL, prompt_tokens: int = 10, completion_tokens: int = 32,
                   finish_reason="length", stop_reason=None, usage: dict | None = None) -> dict:
    text = TEXT_MARKER + " " + " ".join(["lorem"] * (completion_tokens - 1))
    return {
        "id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1700000000,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                     "stop_reason": stop_reason, "token_ids": None, "prompt_logprobs": None,
                     "prompt_token_ids": None, "routed_experts": None}],
        "service_tier": None, "system_fingerprint": "vllm-0.32.0-abcd1234",
        "usage": usage if usage is not None else {
            "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": None,
            "completion_tokens_details": None},
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    }


def sse_answer(events: list) -> bytes:
    """A text/event-stream in chunked coding: one chunk an event, then [DONE]."""
    out = bytearray(http(200, b"", [("transfer-encoding", "chunked")],
                         content_type="text/event-stream; charset=utf-8", length=False))
    for event in list(events) + [b"[DONE]"]:
        payload = event if isinstance(event, bytes) else json.dumps(event).encode()
        data = b"data: " + payload + b"\n\n"
        out += f"{len(data):x}\r\n".encode() + data + b"\r\n"
    out += b"0\r\n\r\n"
    return bytes(out)


def stream_events(doc: dict) -> list:
    """A completion as vLLM streams it: a token an event, then usage with no choices."""
    choice = doc["choices"][0]
    n_out = doc["usage"]["completion_tokens"] if isinstance(doc.get("usage"), dict) else 32
    n_out = n_out if isinstance(n_out, int) and 0 < n_out < 4096 else 32
    events = []
    for i in range(n_out):
        last = i == n_out - 1
        events.append(dict(doc, usage=None, choices=[{
            "index": 0, "text": TEXT_MARKER if i == 0 else " lorem", "logprobs": None,
            "finish_reason": choice["finish_reason"] if last else None,
            "stop_reason": choice["stop_reason"] if last else None}]))
    events.append(dict(doc, choices=[]))
    return events


def default_answer(request: Received):
    """The faithful answer for each endpoint; 404 (vLLM's shape) for any other path."""
    if request.endpoint == "/health":
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"
    if request.endpoint == "/v1/models":
        return json_answer(models_doc())
    if request.endpoint == "/version":
        return json_answer({"version": "0.32.0"})
    if request.endpoint == "/metrics":
        return metrics_answer(metrics_text())
    body = request.json() if isinstance(request.json(), dict) else {}
    prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else ""
    if request.endpoint == "/tokenize":
        count = count_tokens(prompt)
        return json_answer({"count": count, "max_model_len": MAX_MODEL_LEN,
                            "tokens": list(range(100, 100 + count)), "token_strs": None})
    if request.endpoint == "/v1/completions":
        model = body.get("model") if isinstance(body.get("model"), str) else MODEL
        doc = completion_doc(model, count_tokens(prompt))
        return sse_answer(stream_events(doc)) if body.get("stream") else json_answer(doc)
    return json_answer({"detail": "Not Found"}, 404)


def completion_with(request: Received, **changes) -> bytes:
    """The default completion document for this request, with fields changed."""
    body = request.json() if isinstance(request.json(), dict) else {}
    prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else ""
    return json.dumps(dict(completion_doc(MODEL, count_tokens(prompt)), **changes)).encode()


# ---------------------------------------------------------------------------
# The server.
# ---------------------------------------------------------------------------

def endpoint_of(target: str) -> str | None:
    """Which endpoint a request target names (whatever base path precedes it)."""
    path = target.split("?")[0]
    for endpoint in ENDPOINTS:
        if path.endswith(endpoint):
            return endpoint
    return None


class HostileServer:
    """Plays `script` ({endpoint or "*": answer}) on an ephemeral port; stop() at cleanup."""

    def __init__(self, script: dict | None = None, host: str = "127.0.0.1"):
        self.script = dict(script or {})
        self.host = host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(128)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.received: list[Received] = []
        self.connections: list[socket.socket] = []
        self.counts: dict = {}
        self.thread = threading.Thread(target=self._accept, daemon=True, name="hostile-accept")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "HostileServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, end every hang, close every connection."""
        self.stopped.set()
        self.thread.join(timeout=5)
        with self.lock:
            connections = list(self.connections)
        for conn in connections:
            try:
                conn.close()
            except OSError:
                pass
        self.listener.close()

    def requests(self, endpoint: str | None = None) -> list[Received]:
        """What arrived (at `endpoint` only, when given), in order."""
        with self.lock:
            return [r for r in self.received if endpoint is None or r.endpoint == endpoint]

    # -- accepting and answering --------------------------------------------
    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            with self.lock:
                self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="hostile-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(READ_TIMEOUT_S)
            request = self._read_request(conn)
            if request is None:
                return
            self._play(conn, self._answer_for(request), request)
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def _read_request(self, conn: socket.socket) -> Received | None:
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk or len(buf) > MAX_REQUEST_HEAD:
                return None
            buf += chunk
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
        length = 0
        for name, value in headers:
            if name.lower() == "content-length" and value.isdigit():
                length = int(value)
        body, cut = bytearray(rest), False
        while len(body) < length:
            if len(body) > MAX_REQUEST_BODY:
                cut = True
                break
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            body += chunk
        line = lines[0]
        endpoint = endpoint_of(line[line.find(" ") + 1:line.rfind(" ")])
        with self.lock:
            number = self.counts.get(endpoint, 0)
            seen = dict(self.counts)
            self.counts[endpoint] = number + 1
            request = Received(endpoint, number, lines[0], headers,
                               bytes(body[:MAX_REQUEST_BODY]), cut, seen)
            self.received.append(request)
        return request

    def _answer_for(self, request: Received):
        answer = self.script.get(request.endpoint, self.script.get("*", Default()))
        while True:
            if isinstance(answer, (list, tuple)):
                answer = answer[min(request.number, len(answer) - 1)]
            elif callable(answer) and not isinstance(answer, (Trickle, Hang, Close, Default)):
                answer = answer(request)
            elif isinstance(answer, Default):
                answer = default_answer(request)
            else:
                return answer

    def _play(self, conn: socket.socket, answer, request: Received) -> None:
        if isinstance(answer, Close):
            return
        if isinstance(answer, Hang):
            if answer.head:
                conn.sendall(answer.head)
            self.stopped.wait(HANG_LIMIT_S)
            return
        if isinstance(answer, Trickle):
            for start in range(0, len(answer.data), answer.step):
                if self.stopped.wait(answer.interval_s):
                    return
                conn.sendall(answer.data[start:start + answer.step])
            return
        if isinstance(answer, str):
            answer = answer.encode("utf-8")
        conn.sendall(answer)
        # Let the client read everything before the close (no RST on unread request bytes).
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 2
        conn.settimeout(0.2)
        while time.monotonic() < deadline and not self.stopped.is_set():
            try:
                if not conn.recv(65536):
                    return
            except socket.timeout:
                continue
