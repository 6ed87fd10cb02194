"""The server a launcher started: its process, its output, how it ended, stopping it.

ServerProcess launches the command in its own session and process group, its output
appended to server.log (under --supervise, OutputPump copies it there, rotated at a size,
and to the launcher's output through a bounded LineWriter); the launched pid's end is the
server's end; stop() TERMs the group and KILLs what is left after the grace.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

from start.processes import group_alive, signalable
from core.files import open_own, open_regular
from core.runframe import LineWriter
from core.sanitize import sanitize_text

PREFIX = "server| "                   # a forwarded line of the server, told from ours
LINE_BYTES = 64 << 10                 # a longer line is forwarded in pieces
ERROR_LINES = re.compile(r"Traceback \(most recent call last\)|(?:^|[\s\]])(?:ERROR|CRITICAL)\s|"
                         r"(?i:out of memory|OutOfMemory|\bOOM\b|CUDA error)")


def shell_status(returncode: int) -> int:
    """A child's return code as a shell shows it: the exit code, or 128 + the signal."""
    return returncode if returncode >= 0 else 128 - returncode


class OutputPump:
    """The server's output from a pipe: each line appended to server.log (rotated past
    max_bytes: server.log.1 is the one old copy kept) and handed to `writer` with PREFIX.
    The pipe is always read: the server never blocks on its output."""

    def __init__(self, pipe, log_path: str, max_bytes: int, writer: LineWriter, stream):
        self.pipe, self.log_path, self.max_bytes = pipe, log_path, max_bytes
        self.writer, self.stream = writer, stream
        self.reader = threading.Thread(target=self._read, name="server-output", daemon=True)

    def start(self) -> None:
        self.reader.start()

    def _read(self) -> None:
        out = self._open()
        for line in iter(lambda: self.pipe.readline(LINE_BYTES), b""):
            if out is not None:
                out = self._append(out, line)
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            self.writer.put(PREFIX + sanitize_text(text, LINE_BYTES), self.stream)
            # (the server's bytes: control characters out, its spacing kept)
        if out is not None:
            out.close()

    def _open(self):
        try:
            return open_own(self.log_path)
        except OSError:
            return None                   # no log file: the pipe is still read and forwarded

    def _append(self, out, line: bytes):
        """Append a line, rotating past max_bytes; None once the disk fails (the pipe is
        still read: the server never blocks on a full pipe)."""
        try:
            if self.max_bytes and out.tell() + len(line) > self.max_bytes and out.tell():
                out.close()
                os.replace(self.log_path, self.log_path + ".1")
                out = open_own(self.log_path)
            out.write(line)
            out.flush()
            return out
        except (OSError, ValueError):
            return None

    def join(self, wait_s: float) -> None:
        """Wait up to wait_s for the last lines once the pipe closed."""
        self.reader.join(wait_s)
        self.writer.flush(max(wait_s / 2, 0.1))


class ServerProcess:
    """The launched command: its pid is its process group (its own session)."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.pid = 0
        self.status: int | None = None    # the launched pid's exit status, once reaped
        self.launched_at = 0.0
        self.ended_after: int | None = None  # seconds from launch to its end
        self.popen = None                 # kept: a dropped Popen would reap our pid
        self.pump: OutputPump | None = None

    def launch(self, command: list[str], forward=None, max_bytes: int = 0,
               writer: LineWriter | None = None) -> str | None:
        """Start the command in a new session; None, or why it could not start (the pid
        then stays 0, the status 127 or 126 as setsid(1) says it). With `forward` (a
        stream) the output goes through an OutputPump and `writer`, else straight to
        server.log."""
        with open_own(self.log_path) as out:
            try:
                self.popen = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if forward else out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            except OSError as exc:
                out.write(f"start.sh: failed to execute {command[0]}: {exc.strerror}\n"
                          .encode())
                self.status = 127 if isinstance(exc, FileNotFoundError) else 126
                return exc.strerror or type(exc).__name__
            finally:
                self.launched_at = time.monotonic()
        self.pid = self.popen.pid
        if forward:
            self.pump = OutputPump(self.popen.stdout, self.log_path, max_bytes,
                                   writer or LineWriter(), forward)
            self.pump.start()
        return None

    def since_launch(self) -> int:
        return int(time.monotonic() - self.launched_at)

    def logged_since(self, offset: int) -> str:
        """What server.log gained since offset (this start's part only); a FIFO or a
        device there reads as nothing."""
        try:
            with open_regular(self.log_path) as handle:
                handle.seek(offset)
                return handle.read(64 << 20).decode("utf-8", "replace")
        except OSError:
            return ""

    def reap(self, pid: int = -1) -> None:
        """Collect exited children without waiting (as PID 1, orphans too); the launched
        pid's status is kept."""
        while True:
            try:
                found, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return
            if found == 0:
                return
            if found == self.pid and self.status is None:
                self.status = shell_status(os.waitstatus_to_exitcode(status))
                self.popen.returncode = self.status
                self.ended_after = self.since_launch()
            if pid > 0:
                return

    def alive(self) -> bool:
        """The launched pid has not ended (a zombie has: it is reaped here)."""
        if not self.pid or self.status is not None:
            return False
        self.reap(self.pid)
        return self.status is None

    def left(self) -> bool:
        """A process of its group is still there (the server's children, once it ended)."""
        return bool(self.pid) and group_alive(self.pid)

    def kill(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except OSError:
            pass

    def signal_server(self, sig: int) -> None:
        """The signal to the launched process alone, as Kubernetes sends TERM to PID 1:
        vLLM drains its requests (--shutdown-timeout), then stops its own engines; a TERM
        to the whole group would stop the engines first and fail what is in flight."""
        try:
            os.kill(self.pid, sig)
        except OSError:
            pass

    def stop(self, grace_s: int, say) -> None:
        """TERM the process group, KILL what is left after grace_s; reap as it goes."""
        if not self.pid or not signalable(-self.pid):
            return
        self.kill(signal.SIGTERM)
        started = time.monotonic()
        while group_alive(self.pid):
            self.reap()
            if time.monotonic() - started >= grace_s:
                say(f"server group {self.pid} still alive after {grace_s} s: KILL")
                self.kill(signal.SIGKILL)
                break
            time.sleep(0.1)
        self.reap()
        if self.pump is not None:
            self.pump.join(2.0)
        say(f"server process group {self.pid} stopped")


def size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def first_error(text: str, before: int = 3, after: int = 25) -> list[str]:
    """The first error in a server's output (a Traceback, an ERROR line, an out-of-memory
    line) with `before` lines above it and up to `after` below; [] when none. Pure."""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if ERROR_LINES.search(line):
            return lines[max(number - before, 0):number + after + 1]
    return []
