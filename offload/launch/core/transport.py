"""Bytes on a socket, bounded: HTTP/1.1 and the JSON read from it. It knows nothing of vLLM,
waves or records: fetch() sends one request on its own connection, exchange_batch()
several, connected first and released together; every wait is bounded by a Clock."""

from __future__ import annotations

import json
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
# Terminating signals: helper threads never take them (the main thread must), and the
# run frame answers each with one 'killed' summary.
CAUGHT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


class UsageError(Exception):
    """A bad option or configuration: exit 2, nothing sent."""


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
