"""The server start.sh launched: its start log, the launched process and its /health
guard, whether it is the one answering its port, and --supervise.

Before a warm-up: no server already here (refuse_a_running_server), /health 200 within
the guard (wait_ready), the port held by the launched group and the command's model
served (refuse_a_foreign_answer). Log writes one UTC-timestamped line per step.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time

from core.files import open_own, open_regular
from core.sanitize import clean_text, redact_secrets
from start.processes import group_alive, process_alive
from start.server_command import commanded_model, redacted_command
from start.settings import Settings, os_reason
from core.runframe import LineWriter
from start.supervisor import ServerProcess, first_error, size_of
from tools.procfs import foreign_holders, not_held_by, port_owners

TAIL_LINES = 20
SIGNALS = {s.value for s in signal.Signals}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)   # each stops a start, as TERM
PROBE_TIMEOUT_S = 2.0


class Exit(Exception):
    """Leave main() with this status (after an ERROR)."""

    def __init__(self, code: int, name: str = ""):
        super().__init__(code)
        self.code, self.name = code, name


class Interrupted(Exit):
    """TERM, INT or HUP while starting (its name): the server it launched is stopped."""


class Log:
    """One UTC-timestamped line per step, to start.log and the terminal, every secret
    registered (VLLM_API_KEY: launcher.py) replaced."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, "start.log")
        self.writer = None                # a runframe.LineWriter under --supervise
        self.lost = ""                    # why start.log could not be written, once said
        self.tee = None                   # also to this callable (a re-warm's asker)

    def __call__(self, text: str, stream=None) -> None:
        line = time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + redact_secrets(text)
        # A full disk or a terminal that went away (| head -1) must not end the launcher:
        # the server it launched must still be followed or stopped.
        try:
            with open_own(self.path, "a") as handle:
                handle.write(line + "\n")
        except OSError as exc:
            if not self.lost:             # said once, on the terminal: the log cannot
                self.lost = f"cannot write {self.path}: {os_reason(exc)}"
                self.show(f"WARN: {self.lost}; start.log lines go to the terminal only",
                          sys.stderr)
        self.show(line, stream or sys.stdout)
        if self.tee is not None:
            self.tee(line)

    def show(self, text: str, stream) -> None:
        """Text to the terminal only: under --supervise through the writer (nobody reading
        never holds us), else printed (a stream that went away is silenced); secrets
        replaced here too (the server's first error is shown on the terminal only)."""
        text = redact_secrets(text)
        if self.writer is not None:
            self.writer.put(text, stream)
            return
        try:
            print(text, file=stream, flush=True)
        except (OSError, ValueError):
            from core.cli import silence
            silence(stream)

    def error(self, text: str) -> None:
        self("ERROR: " + text, sys.stderr)


class LaunchedServer(ServerProcess):
    """The launched server as start.sh reports it: its launch line, server.pid, the first
    error and end of its log, an ERROR when it is gone."""

    stop_words = "stopping the launched server"

    def __init__(self, settings: Settings, log: Log):
        super().__init__(os.path.join(settings.log_dir, "server.log"))
        self.settings, self.log = settings, log
        self.server_log = self.log_path
        self.log_offset = 0
        self.lock: int | None = None      # the log folder's lock (start.lock), held to the end

    def start(self) -> None:
        """Launch the command; under --supervise its output also reaches our own, and
        server.log is rotated at START_LOG_MAX_BYTES."""
        self.log_offset = size_of(self.server_log)
        supervised = self.settings.supervise
        if supervised:
            self.log.writer = LineWriter()
        self.launch(self.settings.command, sys.stdout if supervised else None,
                    self.settings.log_max_bytes if supervised else 0, self.log.writer)
        if self.pid:                      # the pid, and the address a probe reads
            for name, text in (("server.pid", f"{self.pid}\n"),
                               ("server.url", f"{self.settings.target.display}\n")):
                path = os.path.join(self.settings.log_dir, name)
                try:
                    with open_own(path, "w") as handle:
                        handle.write(text)
                except OSError as exc:    # a full disk says so only when it is written
                    raise OSError(exc.errno, exc.strerror, path) from None
        self.log(f"launch pid {self.pid or 'none'} (process group {self.pid or 'none'}): "
                 f"{redacted_command(self.settings.command)}")

    def stop_group(self, grace_s: int | None = None) -> None:
        """TERM the group, KILL it after START_STOP_GRACE_S (or what is left of it)."""
        self.stop(self.settings.stop_grace_s if grace_s is None else grace_s, self.log)

    def show_error(self) -> None:
        """This start's first error in server.log (a Traceback, an ERROR line, an
        out-of-memory line, with its context) and the end of the log, on stderr."""
        text = self.logged_since(max(self.log_offset, size_of(self.server_log) - (4 << 20)))
        found, lines = first_error(text), text.splitlines()
        shown = f"---- the server's first error in {self.server_log} ----\n" + \
            "\n".join(found) + "\n" if found else ""
        if not found or found[-1] not in lines[-TAIL_LINES:]:
            shown += f"---- last {TAIL_LINES} lines of {self.server_log} ----\n" + \
                "\n".join(lines[-TAIL_LINES:]) + "\n"
        self.log.show(shown + "----", sys.stderr)

    def gone(self, when: str) -> Exit:
        """ERROR for a server whose launched process ended, what is left of its group
        stopped, its first error shown: Exit(1)."""
        status = "unknown" if self.status is None else self.status
        hint = (" (a server that forks and exits has ended for start.sh: run it in the "
                "foreground)") if status == 0 else ""
        left = self.left()
        others = foreign_holders(self.settings.target.port, self.pid) if self.pid else None
        daemon = (f"; port {self.settings.target.port} is still held by pid {others[0][0]} "
                  f"outside its process group (a server that daemonized?)") if others else ""
        self.log.error(f"server exited with status {status} after {self.since_launch()} s, "
                       f"{when}{hint}; " + (f"stopping what is left of its process group "
                                            f"{self.pid}" if left else
                                            f"nothing of its process group {self.pid or 'none'} "
                                            f"is left") + daemon)
        if left:
            self.stop_group()
        self.show_error()
        return Exit(1)


def health(target, timeout_s: float) -> int:
    """One GET /health: 0 for 200, 1 another answer, ready.EXIT_NO_ANSWER none."""
    from tools.ready import check_health
    from core.transport import Clock
    timeout_s = max(timeout_s, 0.1)
    return check_health(target, Clock.start(timeout_s, timeout_s))[0]


def refuse_a_running_server(settings: Settings, log: Log) -> None:
    """Exit(1) when server.pid names a live process, or something answers already."""
    pid_file = os.path.join(settings.log_dir, "server.pid")
    if os.path.isfile(pid_file):
        with open(pid_file, "rb") as handle:
            old = re.sub(rb"[^0-9]", b"", handle.read(64)).decode()[:10]
        if old and 1 < int(old) < 1 << 22 and (process_alive(int(old)) or
                                               group_alive(int(old))):
            log.error(f"{pid_file} names pid {old}, which is still alive: a server may "
                      f"already run here. Stop it (kill -TERM -- -{old}) or remove the file "
                      f"if that pid is not the server.")
            raise Exit(1)
        log(f"stale {pid_file} (pid {old or 'none'} is gone): replacing it")
    from tools.ready import EXIT_NO_ANSWER
    if health(settings.target, PROBE_TIMEOUT_S) != EXIT_NO_ANSWER:
        log.error(f"something already answers at {settings.target.display}/health before "
                  f"launch: start.sh reports only on a server it starts. Stop that server, "
                  f"or give the new server another port (its command's --port).")
        raise Exit(1)


def wait_ready(settings: Settings, server: LaunchedServer, log: Log) -> float:
    """Poll /health until 200 (when: the Unix time returned); Exit(1) when the server is
    gone or the guard expires."""
    url, guard = settings.target.display, settings.start_guard_s
    said = time.monotonic()
    while True:
        if not server.alive():
            raise server.gone(f"before {url}/health answered 200")
        left = guard - (time.monotonic() - server.launched_at)
        if time.monotonic() - said >= settings.say_s:
            said = time.monotonic()
            log(f"waiting for {url}/health: {server.since_launch()} s of the {guard} s start "
                f"guard; server process group {server.pid} is running")
        if left <= 0:
            log.error(f"server not ready: {url}/health did not answer 200 within the {guard} "
                      f"s start guard (is --base-url the server's address?)")
            server.show_error()
            server.stop_group()
            raise Exit(1)
        if health(settings.target, min(left, 5.0)) == 0:
            healthy_at = time.time()
            if not server.alive():
                raise server.gone(f"when {url}/health answered 200 (that answer came from "
                                  f"another process)")
            refuse_a_foreign_answer(settings, server, log)
            log(f"ready after {server.since_launch()} s ({url}/health = 200)")
            return healthy_at
        time.sleep(max(min(settings.poll_s, left), 0))


def refuse_a_foreign_answer(settings: Settings, server: LaunchedServer, log: Log) -> None:
    """Exit(1) when what answered /health is not the launched server: the port is held
    by a process outside its group (vLLM binds only after loading, so another process can
    take the port meanwhile), or /proc cannot tell who holds it (what cannot be seen is
    not trusted), or the server serves another model than its command names."""
    port = settings.target.port
    owners = port_owners(port)            # None, or [] although /health answered: unseen
    if not owners:
        refuse_the_server(server, log, (
            f"{settings.target.display}/health answered 200, but /proc cannot tell which "
            f"process holds port {port} (start.sh in a PID namespace of its own, or another "
            f"user than the server's?): start.sh does not warm or vouch for what it cannot "
            f"see; run it where it sees its server (a pod with shareProcessNamespace, or "
            f"start.sh as the server itself) and as the same user"))
    other = not_held_by(owners, server.pid)
    if other:
        refuse_the_server(server, log, (
            f"{settings.target.display}/health answered 200, but port {port} is held by "
            f"pid {other[0]} (process group {other[1]}), not by the server process start.sh "
            f"launched (pid {server.pid}; another member of its group, such as a proxy, "
            f"does not count: a wrapper script must exec the server)"))
    named = commanded_model(settings.command)
    served, why = served_model_ids(settings.target, settings.env.get("VLLM_API_KEY")) \
        if named else ([], None)
    if why:                           # the warm-up reads /v1/models too, and fails on it
        log(f"GET {settings.target.display}/v1/models {why}: the served model is checked "
            f"by the warm-up")
    elif named and named not in served:
        refuse_the_server(server, log, (
            f"the server command names the model {clean_text(named, 120)}, but "
            f"{settings.target.display}/v1/models serves " + (", ".join(
                clean_text(m, 80) for m in served[:5]) or "none") +
            " (another server behind the port, or a proxy in front of one?)"))


def refuse_the_server(server: LaunchedServer, log: Log, problem: str) -> None:
    """ERROR naming the problem: no warm-up, no ready file, the launched server stopped
    (an attached one, --rewarm's, is left running)."""
    log.error(f"{problem}: no warm-up, no ready file; {server.stop_words}")
    server.stop_group()
    server.show_error()
    raise Exit(1)


def served_model_ids(target, key: str | None) -> tuple[list[str], str | None]:
    """The model ids GET /v1/models lists (with the API key the warm-up sends), or ([],
    why none could be read)."""
    from core.transport import Clock, TransportError, decode_json, fetch
    try:
        response = fetch(target, Clock.start(5.0, 5.0), "GET", "/v1/models",
                         bearer=key or None)
    except TransportError as exc:
        return [], f"did not answer ({exc.problem})"
    doc, why = decode_json(response.body) if response.status == 200 else (None, None)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return [], f"answered HTTP {response.status}" + (f" ({why})" if why else "")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)], None


def interrupt_while_starting() -> None:
    """TERM/INT/HUP while starting raise Interrupted (exit 143 / 130 / 129)."""
    def handler(signum, frame):
        for stop in STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
        raise Interrupted(128 + signum, signal.Signals(signum).name[3:])
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)


class AttachedServer(LaunchedServer):
    """The server an earlier start.sh launched in LOG_DIR (--rewarm): alive while its
    launched pid is; a re-warm never stops it."""

    stop_words = "the server keeps running (a re-warm stops nothing)"

    def __init__(self, settings: Settings, log: Log, pid: int):
        super().__init__(settings, log)
        self.pid, self.launched_at = pid, time.monotonic()
        self.log_offset = size_of(self.server_log)      # its errors from now on

    def alive(self) -> bool:
        return process_alive(self.pid)

    def stop_group(self, grace_s: int | None = None) -> None:
        self.log(f"server process group {self.pid} left running (a re-warm stops nothing)")


def read_small(path: str) -> str:
    """The first line of a small file start.sh wrote (a regular file only), or ''."""
    try:
        with open_regular(path) as handle:
            return handle.read(4096).decode("ascii", "replace").split("\n")[0].strip()
    except OSError:
        return ""
