"""A fork server for the hostile table: one interpreter imports the programs once, then forks
a child for each case, run as `python3 -S SCRIPT ARGS` runs it: the script as __main__, in
the case's environment, with the case's stdout and stderr (files) and address-space cap.
A hundred cases then do not each pay Python's start and the imports again (~50 ms of CPU
each). Cases that drive signals or odd stdio (a closed stdout, a pipe closed early) start
a real interpreter instead: there the interpreter's own start is under test.

  server = ForkServer(preload)                  python3 -S this file, the modules imported
  pid = server.spawn(argv, env, stdout, stderr, as_limit)
  server.status(pid)                            its wait status once it has ended, else None
  server.stop()
"""

from __future__ import annotations

import atexit
import importlib
import io
import json
import os
import resource
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback

MESSAGE = 1 << 20
BASE_PATH = sys.path[1:]                   # the interpreter's own, without this file's folder


class ForkServer:
    """The test side: one server process, its socket, the statuses it has reported."""

    def __init__(self, launch: str, preload: list[str], env: dict):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock, self.lock, self.ended = ours, threading.Lock(), {}
        self.proc = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__), str(theirs.fileno()), launch,
             *preload], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, env=env)
        theirs.close()
        try:
            self.ask(None, [])                        # the imports are done once it answers
        except BaseException:
            self.stop()
            raise

    def ask(self, request: dict | None, fds: list[int]) -> int:
        """Send a request (None: a ping); the pid it started (0 for a ping)."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            while True:
                answer = self.read(timeout=30)
                if answer is None:
                    raise RuntimeError("the fork server did not answer within 30 s")
                if "started" in answer:
                    return answer["started"]

    def read(self, timeout: float) -> dict | None:
        """One message (an exit is kept in self.ended), or None within `timeout`."""
        if not select.select([self.sock], [], [], timeout)[0]:
            return None
        data = self.sock.recv(MESSAGE)
        if not data:
            raise RuntimeError("the fork server has ended")
        answer = json.loads(data)
        if "pid" in answer:
            self.ended[answer["pid"]] = answer["status"]
        return answer

    def spawn(self, argv: list[str], env: dict, stdout, stderr, as_limit: int) -> int:
        with open(os.devnull, "rb") as stdin:
            return self.ask({"argv": argv, "env": env, "as_limit": as_limit},
                            [stdin.fileno(), stdout.fileno(), stderr.fileno()])

    def status(self, pid: int) -> int | None:
        with self.lock:
            while pid not in self.ended and self.read(timeout=0) is not None:
                pass
            return self.ended.get(pid)

    def stop(self) -> None:
        self.sock.close()                             # the server ends when its socket does
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the server side ------------------------------------------------------------

def serve(sock: socket.socket) -> None:
    """Fork a child per request; report each child's wait status when it ends (SIGCHLD
    wakes the loop through a pipe)."""
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready = select.select([sock, woken], [], [])[0]
        if woken in ready:
            os.read(woken, 4096)
            report_ended(sock)
        if sock in ready:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE, 3)
            if not data:
                return
            request = json.loads(data)
            pid = os.fork() if request else 0
            if pid == 0 and request:
                os.close(woken)
                os.close(wake)
                sock.close()
                run_child(request, fds)               # never returns
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"started": pid}).encode())
            report_ended(sock)


def report_ended(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        sock.send(json.dumps({"pid": pid, "status": status}).encode())


def run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python3 -S argv...` and exit as it would."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    limit = request["as_limit"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path[:] = [os.path.dirname(os.path.abspath(sys.argv[0]))] + BASE_PATH
    sys.stdin = stream(0, "r", sys.__stdin__)
    sys.stdout = stream(1, "w", sys.__stdout__)
    sys.stderr = stream(2, "w", sys.__stderr__, line_buffering=True)
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException:                             # as the interpreter: a traceback, 1
        traceback.print_exc()
        code = 1
    threading._shutdown()                             # the interpreter's exit: its threads,
    atexit._run_exitfuncs()                           # atexit, then the streams flushed
    for std in (sys.stdout, sys.stderr):
        try:
            std.flush()
        except Exception:                             # the interpreter's exit status then
            code = 120
    os._exit(code)


def stream(fd: int, mode: str, like, line_buffering: bool = False) -> io.TextIOWrapper:
    """A standard stream on `fd` with the encoding and errors the interpreter chose for
    this environment (those of the server's own)."""
    raw = io.FileIO(fd, mode, closefd=False)
    buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=like.encoding, errors=like.errors,
                            line_buffering=line_buffering)


def exit_code(value) -> int:
    """SystemExit's code as the interpreter turns it into an exit status."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    sys.path.insert(0, sys.argv[2])
    for name in ["pkgutil", *sys.argv[3:]]:      # pkgutil: what runpy.run_path loads
        importlib.import_module(name)
    serve(sock)


if __name__ == "__main__":
    main()
