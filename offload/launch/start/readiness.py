"""GET /ready on START_READY_PORT, for start.sh --supervise's owner: 200 only while it is
warm for the process it warmed, from memory. Loaded with the port (start/settings.py), so a
start without one never loads http.server.
"""

from __future__ import annotations

import http.server
import socket
import threading


class ReadinessAnswer(http.server.BaseHTTPRequestHandler):
    """GET /ready: 200 only while the owner is warm for the process it warmed, else 503
    naming the state; from memory, no request to the server. Each read within `timeout`."""

    owner = None                          # the Owner: state, ready(state)
    timeout = 2.0

    def do_GET(self):
        if self.path.split("?")[0] != "/ready":
            self.answer(404, "not found: GET /ready\n")
            return
        state = self.owner.state          # one read: the status and the body agree
        self.answer(200 if self.owner.ready(state) else 503, state + "\n")

    def answer(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):     # the kubelet asks every period: no line
        pass


class ReadinessServer(http.server.ThreadingHTTPServer):
    """A thread a client, at most MAX_CLIENTS at once: a new client closes the oldest, so
    slow or idle clients, however many, never hold the kubelet's answer (a probe asks at
    once and is answered within a millisecond); a client's error is no traceback."""

    daemon_threads = True
    MAX_CLIENTS = 16
    request_queue_size = 128              # a burst of connections queued, not dropped

    def __init__(self, *args):
        super().__init__(*args)
        self.clients: list = []           # the connections being answered, oldest first
        self.lock = threading.Lock()

    def process_request(self, request, client_address):
        with self.lock:
            if len(self.clients) >= self.MAX_CLIENTS:
                try:                      # its thread's read ends, and the thread with it
                    self.clients.pop(0).shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass                  # it was closing already
            self.clients.append(request)
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                if request in self.clients:
                    self.clients.remove(request)

    def handle_error(self, request, client_address):
        pass                              # a reset or a timeout: that client's alone


def serve_readiness(owner, port: int) -> http.server.ThreadingHTTPServer:
    """The readiness answer on every address's `port`, served by a daemon thread."""
    handler = type("Answer", (ReadinessAnswer,), {"owner": owner})
    server = ReadinessServer(("", port), handler)
    threading.Thread(target=server.serve_forever, name="readiness", daemon=True).start()
    return server
