"""Bytes on a socket, bounded: HTTP/1.1, JSON, Prometheus text, and the sanitizing rules.

It knows nothing of vLLM, waves or records:

  fetch()              one request on its own connection, every wait bounded by a Clock
  exchange_batch()     several requests connected first, released together at a barrier
  decode_json()        the one JSON decoder for anything read (nesting bounded)
  parse_prometheus()   Prometheus text format 0.0.4, exactly, every bad line named
  clean_text(), sanitize()   the sanitizing rules: secrets and our prompt text out,
                       control characters out; the run frame applies sanitize() at its
                       sinks (records, terminal), clean_text() cuts where length matters
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
import time
import urllib.parse
from collections import namedtuple

__version__ = "1.2.0"

MAX_BODY_BYTES = 4 << 20             # no answer we read is larger; a bigger one is an error
MAX_HEADER_BYTES = 64 << 10
MAX_JSON_DEPTH = 64                  # deeper JSON from a server is an error, not a crash
SINK_TEXT_LIMIT = 4000               # no string reaches a record or the terminal longer
# Terminating signals: helper threads never take them (the main thread must), and the
# run frame answers each with one 'killed' summary.
CAUGHT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


class UsageError(Exception):
    """A bad option or configuration: exit 2, nothing sent."""


# Sanitizing: one set of rules, applied at the sinks (records, terminal).

class Redactions:
    """What no output may hold, registered as the process learns it: secrets (the API
    key, URL credentials), our prompts' nonces and tags, and our prompts' text. Lookups
    stay cheap however many prompts were registered: tags and word runs are sets."""

    PROMPT_RUN = 4                   # this many words in a row of one of our prompts

    def __init__(self):
        self.lock = threading.Lock()
        self.secrets: tuple[str, ...] = ()    # exact strings, longest first
        self.tags: set = set()                # nonces and tags (matched as whole tokens)
        self.words: set = set()
        self.runs: set = set()

    def secret(self, text: str | None) -> None:
        """Register a secret (a key, credentials): replaced by [redacted] wherever it, or a
        run of its first SECRET_PREFIX characters or more, appears."""
        if text and text not in self.secrets:
            with self.lock:
                # Longest first: a secret inside another is replaced as part of it.
                self.secrets = tuple(sorted(set(self.secrets) | {text}, key=len, reverse=True))

    def tag(self, text: str | None) -> None:
        """Register a nonce or a prompt's tag: replaced where it stands as a whole token."""
        if text and _HEX_TAG.fullmatch(text):
            self.tags.add(text)

    def prompt(self, text: str, tag: bool = True) -> None:
        """Register a prompt we send: its first word (nonce or tag) as a secret, its words
        and every run of PROMPT_RUN words, so an echo of it is found in any output."""
        words = [w.lower() for w in _WORD.findall(text)]
        if tag and words:
            self.tag(text.split(None, 1)[0])
        n = self.PROMPT_RUN
        with self.lock:
            self.words.update(words)
            self.runs.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))

    def reset(self) -> None:
        with self.lock:
            self.secrets, self.tags, self.words, self.runs = (), set(), set(), set()


REDACTIONS = Redactions()
_WORD = re.compile(r"\w+(?:[-.:/+]\w+)*")
# Control characters, line and paragraph separators, bidi overrides and zero-width marks:
# nothing from a server may move the cursor, start a line or hide text on a terminal.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e"
                      r"\u2066-\u2069\ufeff\ud800-\udfff]+")
_HEX_TAG = re.compile(r"(?:warmup-)?[0-9a-f]{12,}")


SECRET_PREFIX = 8                    # this much of a secret in a row is the secret
_INVISIBLE = re.compile(r"[\u200b-\u200f\u2060-\u2064\ufeff\u00ad]")


def redact_secrets(text: str) -> str:
    """Every registered secret, nonce and tag replaced, before anything cuts or quotes the
    text (a cut could keep half a key; repr() would double its backslashes). Invisible
    characters are dropped first (they could split a key); a secret of SECRET_PREFIX
    characters or more is found from its first SECRET_PREFIX on, however much of it
    follows; a shorter one only where it stands as a whole word."""
    if REDACTIONS.secrets:
        text = _INVISIBLE.sub("", text)
    for secret in REDACTIONS.secrets:
        if len(secret) < SECRET_PREFIX:
            text = re.sub(rf"(?<![\w-]){re.escape(secret)}(?![\w-])", "[redacted]", text)
            continue
        low = secret.lower()               # a hex key may come back in capitals
        at = text.lower().find(low[:SECRET_PREFIX])
        while at >= 0:
            end = at + SECRET_PREFIX
            while end < len(text) and end - at < len(low) and text[end].lower() == low[end - at]:
                end += 1
            text = text[:at] + "[redacted]" + text[end:]
            at = text.lower().find(low[:SECRET_PREFIX], at + len("[redacted]"))
    if REDACTIONS.tags:
        text = _HEX_TAG.sub(lambda m: "[redacted]" if m.group() in REDACTIONS.tags
                            else m.group(), text)
    return text


def remove_prompt_runs(text: str, min_run: int = Redactions.PROMPT_RUN) -> str:
    """Runs of words that stand in one of our prompts become [prompt text].

    With min_run = PROMPT_RUN a run must repeat our prompt word for word; shorter
    (a server's validation message, which echoes the request) any run of our prompt
    words counts, and so does anything that looks like a nonce or tag.
    """
    words = list(_WORD.finditer(text))
    if len(words) < min(min_run, 3) or not REDACTIONS.words:
        return text
    lowered = [m.group().lower() for m in words]
    marked = [False] * len(words)
    if min_run >= Redactions.PROMPT_RUN:
        n, runs = Redactions.PROMPT_RUN, REDACTIONS.runs
        for i in range(len(words) - n + 1):
            if tuple(lowered[i:i + n]) in runs:
                marked[i:i + n] = [True] * n
    else:
        vocabulary, i = REDACTIONS.words, 0
        while i < len(words):
            j = i
            while j < len(words) and (lowered[j] in vocabulary or _HEX_TAG.fullmatch(lowered[j])):
                j += 1
            if j - i >= min_run or any(_HEX_TAG.fullmatch(w) for w in lowered[i:j]):
                marked[i:j] = [True] * (j - i)
            i = max(j, i + 1)
    spans, start = [], None
    for i, hit in enumerate(marked + [False]):
        if hit and start is None:
            start = i
        elif not hit and start is not None:
            spans.append((words[start].start(), words[i - 1].end()))
            start = None
    for start, end in reversed(spans):
        text = text[:start] + "[prompt text]" + text[end:]
    return text


def clean_text(text: str, limit: int) -> str:
    """One line, no control characters or lone surrogates, secrets replaced, at most
    `limit` characters: for a cut whose length carries meaning."""
    text = redact_secrets(text)
    if len(text) > 64 * limit:
        text = text[:64 * limit]
    text = " ".join(_CONTROL.sub(" ", text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def scrub(text: str, limit: int) -> str:
    """A server's message made safe to show: our prompts' words and tags removed (any run
    of three of them: validation errors echo the request), then cleaned and cut."""
    return clean_text(remove_prompt_runs(redact_secrets(text)[:64 * limit], 3), limit)


def sanitize_text(text: str, limit: int = SINK_TEXT_LIMIT) -> str:
    """The sink rule for one string: secrets and our prompt text out, control characters
    out (each run becomes one space; other spacing kept), at most `limit` characters."""
    text = redact_secrets(text)[:4 * limit]
    text = remove_prompt_runs(_CONTROL.sub(" ", text))
    return text if len(text) <= limit else text[:limit - 1] + "…"


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def sanitize(value, depth: int = 0):
    """The sink rule for a record: every string in it through sanitize_text; keys too,
    except a plain field name (ours), which a short secret must never rename."""
    if isinstance(value, str):
        return sanitize_text(value)
    if isinstance(value, dict):
        return {k if isinstance(k, str) and _FIELD_NAME.fullmatch(k)
                else sanitize_text(str(k), 200): sanitize(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v, depth + 1) for v in value]
    return value


def exact_str(value, limit: int) -> str | None:
    """A server's short string kept exact when it is clean; otherwise its quoted form, so a
    'length\\n' can never be judged as 'length'."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"<{type(value).__name__}>"   # a container may hold text: never quoted
    if value == clean_text(value, limit):
        return value
    return clean_text(repr(redact_secrets(value)), limit)


def describe(value) -> str:
    """What a value that should have been a number is, never the value itself (a string
    from a server may hold anything): its type, and a string's length."""
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number that is not a count" if math.isfinite(value) else "a non-finite number"
    if isinstance(value, int):
        return "an integer out of range"
    return f"a JSON {type(value).__name__.replace('dict', 'object').replace('list', 'array')}"


def json_number(value: float):
    """Prometheus values as JSON: NaN and infinities become strings, as Prometheus spells them."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def count_value(value) -> int | None:
    """A count as the server gave it (a non-negative integer); anything else is None, never 0."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53:
        return value
    return None


def finite_number(value) -> float | int | None:
    """A finite number as the server gave it; anything else (bool, NaN, text, an integer
    no float can hold) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value if abs(value) < 1 << 1000 else None
    return value if math.isfinite(value) else None


# HTTP over a bare socket: every connect, send and read bounded by the deadline.
# (http.client's timeout is per read, so a trickling server could hold it forever.)

class Target(namedtuple("Target", "scheme host port path credentials")):
    """A server's address: scheme, host, port, base path (no trailing slash, ASCII, safe),
    and user:password from the URL (never printed; sent only as Basic auth by qualify's
    health and ready). A named tuple: the readiness probe imports no dataclasses."""
    __slots__ = ()

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


DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def base_url_from(flag: str | None) -> Target:
    """The server's address from --base-url, else WARMUP_BASE_URL, else the default;
    UsageError naming where the bad value came from."""
    if flag is not None:
        return parse_base_url(flag, "--base-url")
    from_env = os.environ.get("WARMUP_BASE_URL")
    if from_env:
        return parse_base_url(from_env, "WARMUP_BASE_URL")
    return parse_base_url(DEFAULT_BASE_URL)


def parse_base_url(text: str, source: str = "--base-url") -> Target:
    """The server's address; a trailing /v1 is dropped (the programs add their paths)."""
    target = parse_url(text, source)
    if target.path.endswith("/v1"):
        target = target._replace(path=target.path[:-3])
    return target


class Clock(namedtuple("Clock", "started deadline_s cap_s")):
    """The helper's deadline; every socket wait is min(cap, time left)."""
    __slots__ = ()

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


# An HTTP answer; watched_at: when `watch` first matched the raw body (streams).
Response = namedtuple("Response", "status headers body watched_at", defaults=(None,))


_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def is_header_value(text: str) -> bool:
    """True when the text may stand in a header line: printable ASCII, no line break."""
    return bool(_HEADER_VALUE.fullmatch(text))

def encode_request(target: Target, method: str, path: str, body: dict | None,
                   bearer: str | None = None, headers: dict | None = None) -> bytes:
    """The request's bytes (JSON body; `bearer` as "Authorization: Bearer").

    The one place a request is built: the target is ASCII without spaces (parse_url), and
    every header value is checked printable ASCII, so nothing can inject a header line.
    """
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {target.path + path or '/'} HTTP/1.1",
             f"Host: {target.host_port}",
             f"User-Agent: offload-launch/{__version__}",
             "Accept: application/json",
             "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    if bearer:
        lines.append(f"Authorization: Bearer {bearer}")
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


def read_response(sock: socket.socket, clock: Clock, watch: re.Pattern | None = None) -> Response:
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
            head = _parse_head(bytes(buf[:end]))
            del buf[:end + 4]
            if 100 <= head[0] < 200 and head[0] != 101:
                head = None                 # interim response: the final one follows
        if watch is not None and watched_at is None and head is not None:
            if watch.search(buf, max(searched - 64, 0)):
                watched_at = clock.elapsed()
            searched = len(buf)
        if head is not None:
            body = _complete_body(head, buf)
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

def _parse_head(raw: bytes) -> tuple[int, dict]:
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
        if int(length) > MAX_BODY_BYTES:
            raise TransportError("too_large", f"response body of {int(length)} bytes is larger "
                                 f"than the {MAX_BODY_BYTES} bytes the helper reads; read stopped")
    return int(match.group(1)), headers


def _chunked(headers: dict) -> bool:
    return "chunked" in headers.get("transfer-encoding", "")


def _reads_to_close(headers: dict) -> bool:
    return "content-length" not in headers and not _chunked(headers)


def _complete_body(head: tuple[int, dict], buf: bytearray) -> bytes | None:
    status, headers = head
    if len(buf) > MAX_BODY_BYTES + MAX_HEADER_BYTES:
        raise TransportError("too_large", f"response body larger than the {MAX_BODY_BYTES} "
                             f"bytes the helper reads; read stopped")
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
          bearer: str | None = None, headers: dict | None = None) -> Response:
    """One request on its own connection, bounded by the clock."""
    sock = connect(target, clock)
    try:
        send_all(sock, encode_request(target, method, path, body, bearer, headers), clock)
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


# Prometheus text format 0.0.4, parsed exactly: a line that cannot be read is named.

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}

_VALUE = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf|inf|NaN|nan)")

_TIMESTAMP = re.compile(r"-?[0-9]{1,19}")

_LINE_BREAKERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029\ufeff]")

# One /metrics body: the samples read ((name, labels, value)), every line that could not be
# read exactly ((line number, why, line)), and each metric's type from its # TYPE line.
Exposition = namedtuple("Exposition", "samples bad_lines declared")


def parse_prometheus(text: str) -> Exposition:
    """Prometheus text format 0.0.4, line by line (split on LF only, as the format says)."""
    samples, bad, declared = [], [], {}
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t")
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "TYPE":
                declared[parts[2]] = parts[3] if len(parts) > 3 else "untyped"
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
        labels, pos = _parse_labels(line, len(line) - len(after) + 1)
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


def series_key(name: str, labels: dict) -> str:
    """name{k="v",...} with sorted labels; label values come from the server, so cleaned."""
    inner = ",".join(f'{k}="{clean_text(v, 200)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if labels else name


def series_name(key: str) -> str:
    """The metric name of a series key made by series_key."""
    return key.split("{")[0]


# A batch: connect every client, release them together at a barrier, read under the
# deadline. Threads are daemons: a stuck one never keeps the process alive.

class Exchange:
    """One request of a batch: its bytes, and what its client thread saw, in the clock's
    time (seconds since the run started); `watch`: note when it first arrives in the body."""
    __slots__ = ("payload", "watch", "sent_at", "done_at", "response", "error")

    def __init__(self, payload: bytes, watch: re.Pattern | None = None, sent_at=None,
                 done_at=None, response: Response | None = None, error=None):
        self.payload, self.watch, self.sent_at, self.done_at = payload, watch, sent_at, done_at
        self.response, self.error = response, error


def _client(target: Target, clock: Clock, exchange: Exchange,
            barrier: threading.Barrier) -> None:
    sock = None
    try:
        try:
            sock = connect(target, clock)
        except TransportError as exc:
            exchange.error = exc
        barrier.wait(timeout=max(clock.remaining(), 0.001))
        if sock is None:
            return
        exchange.sent_at = clock.elapsed()
        send_all(sock, exchange.payload, clock)
        exchange.response = read_response(sock, clock, watch=exchange.watch)
    except threading.BrokenBarrierError:
        exchange.error = exchange.error or TransportError(
            "barrier", "not released: a sibling client did not get ready by the deadline")
    except TransportError as exc:
        exchange.error = exc
    except Exception as exc:            # never let a client die silently
        exchange.error = TransportError("internal", f"client error: {type(exc).__name__}")
    finally:
        exchange.done_at = clock.elapsed()
        if sock is not None:
            sock.close()


def exchange_batch(target: Target, clock: Clock, exchanges: list[Exchange],
                   still_running=None, every_s: float = 10.0) -> list[Exchange]:
    """Run one batch; the main thread waits on the clients only until the deadline.

    Returns what each exchange ended with, in order; one still reading at the deadline is
    abandoned (its thread is a daemon) and ends with a deadline error. While the batch
    runs, `still_running(seconds, finished)` is called every `every_s` seconds.
    """
    barrier = threading.Barrier(len(exchanges))
    threads = [threading.Thread(target=_client, args=(target, clock, ex, barrier),
                                name=f"client-{i}", daemon=True)
               for i, ex in enumerate(exchanges)]
    for thread in threads:
        start_quiet(thread)
    started = clock.elapsed()
    next_say = started + every_s
    for thread in threads:
        while thread.is_alive() and clock.remaining() > 0:
            thread.join(timeout=max(min(clock.remaining(), next_say - clock.elapsed()), 0))
            if clock.elapsed() >= next_say:
                next_say += every_s
                if still_running is not None:
                    still_running(clock.elapsed() - started,
                                  sum(1 for t in threads if not t.is_alive()))
    finished = []
    for thread, ex in zip(threads, exchanges):
        if thread.is_alive():        # still reading at the deadline: abandon it
            ex = Exchange(b"", ex.watch, ex.sent_at, clock.elapsed(), None,
                          TransportError("deadline", clock.deadline_problem()))
            barrier.abort()
        finished.append(ex)
    return finished


CLIENT_STACK_BYTES = 512 << 10       # 64 clients stay small under an address-space limit


def start_quiet(thread: threading.Thread) -> None:
    """Start a helper thread that never receives the caught signals, so the kernel delivers
    them to the main thread and interrupts its wait at once (a signal taken by another thread
    would leave the main thread blocked until its timeout)."""
    import signal                      # here: the readiness probe starts no thread
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
