"""start.sh's launcher: start a vLLM server, guard its readiness, warm it up, report.

  main() -> start_settings.Settings(argv, env).check() (flags over START_* variables,
            all checked before anything is launched) -> start():
    refuse_a_running_server() -> Server.start() (own session and process group, output
    to server.log; with --supervise also to ours, the log rotated) -> wait_ready()
    -> warm_up_and_report(): run_warmup() (warmup_serve.sh keeps the hard bound),
       run_gate() (under coreutils timeout), verdicts judged() by contract.decide()
       (readback.last_verdict), the ready file from ready.ready_document() -> OK or WARN;
       publish_outcome() for a step that left no summary, or a server never healthy
    -> prune_records() (--keep) -> with --supervise, supervise(): stay the server's parent
       until it ends, then end with it (non-zero when it ended unasked)

start.sh execs this file. The server is the launched process (supervisor.py): its end
is the server's end, and what it leaves of its process group is stopped. Standard
library only.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                  # the folder's modules, imported where used
try:
    from start.processes import group_alive, process_alive, stop_session
    from tools.procfs import foreign_holders, port_owners
    from start.server_command import commanded_model, logged_chunk, redacted_command
    from core.readyfile import drop_ready_file
    from core.transport import clean_text, open_own, open_regular
    from start.settings import HELP, Settings, Usage, check_file_place, os_problem, os_reason
    from start.supervisor import LineWriter, ServerProcess, first_error, shell_status, size_of
except ImportError:                       # main() names the missing module (exit 2)
    group_alive = process_alive = None
    ServerProcess = object
WRAPPER = os.path.join(HERE, "warmup_serve.sh")
QUALIFY = os.path.join(HERE, "qualify.py")
TAIL_LINES = 20
SIGNALS = {s.value for s in signal.Signals}
STUCK_OUTPUT: list = []                # set when our output's reader stopped reading
KILL_AFTER_S = 5
PROBE_TIMEOUT_S = 2.0
SLEEP_WATCH_S = 3.0                   # --supervise reads the sleep gauge this often
COMPILE_LINES = re.compile(r"JIT compilation during inference|Compiling|autotun", re.I)


class Exit(Exception):
    """Leave main() with this status (after an ERROR)."""

    def __init__(self, code: int, name: str = ""):
        super().__init__(code)
        self.code, self.name = code, name


class Interrupted(Exit):
    """TERM or INT while starting (its name): the server it launched is stopped."""


# ---------------------------------------------------------------------------
# The start log, and the server it launched.
# ---------------------------------------------------------------------------

class Log:
    """One UTC-timestamped line per step, to start.log and the terminal."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, "start.log")
        self.writer = None                # a supervisor.LineWriter under --supervise
        self.lost = ""                    # why start.log could not be written, once said

    def __call__(self, text: str, stream=None) -> None:
        line = time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + text
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

    def show(self, text: str, stream) -> None:
        """Text to the terminal only: under --supervise through the writer (nobody reading
        never holds us), else printed (a stream that went away is silenced)."""
        if self.writer is not None:
            self.writer.put(text, stream)
            return
        try:
            print(text, file=stream, flush=True)
        except (OSError, ValueError):
            from core.runframe import silence
            silence(stream)

    def error(self, text: str) -> None:
        self("ERROR: " + text, sys.stderr)


class Server(ServerProcess):
    """The launched server as start.sh reports it: its launch line, server.pid, the first
    error and end of its log, an ERROR when it is gone."""

    def __init__(self, settings: Settings, log: Log):
        super().__init__(os.path.join(settings.log_dir, "server.log"))
        self.settings, self.log = settings, log
        self.server_log = self.log_path
        self.log_offset = 0

    def start(self) -> None:
        """Launch the command; under --supervise its output also reaches our own, and
        server.log is rotated at START_LOG_MAX_BYTES."""
        self.log_offset = size_of(self.server_log)
        supervised = self.settings.supervise == "1"
        if supervised:
            self.log.writer = LineWriter()
        self.launch(self.settings.command, sys.stdout if supervised else None,
                    int(self.settings.log_max_bytes) if supervised else 0, self.log.writer)
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
        self.stop(int(self.settings.stop_grace_s) if grace_s is None else grace_s, self.log)

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


# ---------------------------------------------------------------------------
# The steps.
# ---------------------------------------------------------------------------

def health(settings: Settings, timeout_s: float) -> int:
    """One GET /health: 0 for 200, 1 another answer, ready.EXIT_NO_ANSWER none."""
    from tools.ready import check_health
    from core.transport import Clock
    timeout_s = max(timeout_s, 0.1)
    return check_health(settings.target, Clock.start(timeout_s, timeout_s))[0]


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
    if health(settings, PROBE_TIMEOUT_S) != EXIT_NO_ANSWER:
        log.error(f"something already answers at {settings.target.display}/health before "
                  f"launch: start.sh reports only on a server it starts. Stop that server, "
                  f"or give the new server another port (its command's --port).")
        raise Exit(1)


def wait_ready(settings: Settings, server: Server, log: Log) -> float:
    """Poll /health until 200 (when: the Unix time returned); Exit(1) when the server is
    gone or the guard expires."""
    url, guard = settings.target.display, int(settings.guard_s)
    said = time.monotonic()
    while True:
        if not server.alive():
            raise server.gone(f"before {url}/health answered 200")
        left = guard - (time.monotonic() - server.launched_at)
        if time.monotonic() - said >= int(settings.say_s):
            said = time.monotonic()
            log(f"waiting for {url}/health: {server.since_launch()} s of the {guard} s start "
                f"guard; server process group {server.pid} is running")
        if left <= 0:
            log.error(f"server not ready: {url}/health did not answer 200 within the {guard} "
                      f"s start guard (is --base-url the server's address?)")
            server.show_error()
            server.stop_group()
            raise Exit(1)
        if health(settings, min(left, 5.0)) == 0:
            healthy_at = time.time()
            if not server.alive():
                raise server.gone(f"when {url}/health answered 200 (that answer came from "
                                  f"another process)")
            refuse_a_foreign_answer(settings, server, log)
            log(f"ready after {server.since_launch()} s ({url}/health = 200)")
            return healthy_at
        time.sleep(max(min(float(settings.poll_s), left), 0))


def refuse_a_foreign_answer(settings: Settings, server: Server, log: Log) -> None:
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
    others = [owner for owner in owners if owner[1] != server.pid]
    if others:
        refuse_the_server(server, log, (
            f"{settings.target.display}/health answered 200, but port {port} is held by "
            f"pid {others[0][0]} (process group {others[0][1]}), not by the server start.sh "
            f"launched (process group {server.pid})"))
    named = commanded_model(settings.command)
    served, why = served_model_ids(settings) if named else ([], None)
    if why:                           # the warm-up reads /v1/models too, and fails on it
        log(f"GET {settings.target.display}/v1/models {why}: the served model is checked "
            f"by the warm-up")
    elif named and named not in served:
        refuse_the_server(server, log, (
            f"the server command names the model {clean_text(named, 120)}, but "
            f"{settings.target.display}/v1/models serves " + (", ".join(
                clean_text(m, 80) for m in served[:5]) or "none") +
            " (another server behind the port, or a proxy in front of one?)"))


def refuse_the_server(server: Server, log: Log, problem: str) -> None:
    """ERROR naming the problem: no warm-up, no ready file, the launched server stopped."""
    log.error(f"{problem}: no warm-up, no ready file; stopping the launched server")
    server.stop_group()
    server.show_error()
    raise Exit(1)


def served_model_ids(settings: Settings) -> tuple[list[str], str | None]:
    """The model ids GET /v1/models lists (with the API key the warm-up sends), or ([],
    why none could be read)."""
    from core.transport import Clock, TransportError, decode_json, fetch
    key = settings.env.get("VLLM_API_KEY") or None
    try:
        response = fetch(settings.target, Clock.start(5.0, 5.0), "GET", "/v1/models",
                         bearer=key)
    except TransportError as exc:
        return [], f"did not answer ({exc.problem})"
    doc, why = decode_json(response.body) if response.status == 200 else (None, None)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return [], f"answered HTTP {response.status}" + (f" ({why})" if why else "")
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)], None


class Steps:
    """The foreground step (warm-up, gate) as a child a signal can stop."""

    child: subprocess.Popen | None = None

    @classmethod
    def run(cls, command: list[str], env: dict) -> int:
        """The step in a session of its own; once it ended, what it left there (a helper
        whose wrapper was KILLed, in timeout's group) is stopped: nothing outlives it."""
        cls.child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        status = shell_status(cls.child.wait())
        stop_session(cls.child.pid)
        return status

    @classmethod
    def stop(cls) -> None:
        """TERM the running step, if any, and give it 5 s to end."""
        if cls.child is not None and cls.child.poll() is None:
            cls.child.terminate()
            try:
                cls.child.wait(5)
            except subprocess.TimeoutExpired:
                pass


def judged(records: str, status: int) -> dict:
    """What a step's records file shows, as qualify.py report judges it
    (readback.last_verdict: contract.decide(), the warm-up's own verdict), named as the
    terminal and the textfile name it (textfile.outcome; from the step's exit status when
    it left no summary): the verdict, the plan's differences (with the settings that made
    them), the cache check, what passed ('contract 10/10, paths stream 5/5') and the
    settings that added to the plan, with where they came from."""
    from tools.readback import last_verdict
    from core.records import as_dict, parts_text, show
    from core.textfile import outcome, outcome_of_status
    found = last_verdict(records) if os.path.isfile(records) else None
    if found is None or found["summary"] is None:
        return {"verdict": outcome_of_status(status), "differences": "-",
                "cache_check": "-", "judged": found, "counts": "", "given": ""}
    summary = found["summary"]
    given = as_dict(as_dict(as_dict(found["run"]).get("plan")).get("given"))
    return {"verdict": outcome(found["verdict"], status), "judged": found,
            "differences": "; ".join(found["decided"].differences) or "-",
            "cache_check": str(summary.get("cache_check", "-")),
            "counts": parts_text(found["decided"].parts),
            "given": ", ".join(show(v, 120) for v in given.values())}


def records_named(path: str) -> str:
    """A records file as a WARN line names it: only one that exists."""
    return f"records: {path}" if os.path.isfile(path) else \
        "no records file (the step ended before writing one)"


def publish_outcome(settings: Settings, mode: str, status: int, verdict: str = "",
                    log=None) -> None:
    """How a step or start.sh itself ended, in the textfile (success 0): a step that left
    no summary (its verdict from its exit status), a start begun (starting), refused or
    not trusted (not_started), interrupted (killed), skipped (not_warmed) or a usage
    error. A textfile that cannot be written is removed, and that said."""
    if not settings.textfile:
        return
    from core.textfile import outcome_of_status, publish_outcome as publish
    try:
        check_file_place(settings.source["textfile"], settings.textfile)
    except Usage as exc:              # never written through a link or into a FIFO
        why = str(exc)
    else:
        why = publish(settings.textfile, mode, verdict or outcome_of_status(status), status)
    if why and log is not None:
        log(f"WARN: {why}", sys.stderr)
    elif why:
        print(f"start.sh: {why}", file=sys.stderr)


def run_warmup(settings: Settings, server: Server, log: Log, env: dict, when: str) -> dict:
    """The warm-up through warmup_serve.sh, and what its records show."""
    records = os.path.join(settings.log_dir, f"warmup-{when}.jsonl")
    started, offset = time.monotonic(), size_of(server.server_log)
    log(f"warm-up: {WRAPPER} --records {records} (WARMUP_BASE_URL {settings.target.display})")
    status = Steps.run(["bash", WRAPPER, "--records", records], env)
    run = judged(records, status)
    if not (run["judged"] or {}).get("summary"):
        publish_outcome(settings, "warmup", status)
    compiles = sum(1 for line in server.logged_since(offset).splitlines()
                   if COMPILE_LINES.search(line))
    run.update(records=records, status=status, compiles=compiles)
    log(f"warm-up ended: exit {status}, verdict {run['verdict']}, "
        f"{int(time.monotonic() - started)} s, {compiles} compile lines in server.log during it")
    return run


def run_gate(settings: Settings, log: Log, env: dict, when: str) -> dict:
    """The quality gate under its hard bound, and what its records show."""
    records = os.path.join(settings.log_dir, f"gate-{when}.jsonl")
    started = time.monotonic()
    log(f"gate: {QUALIFY} gate --records {records} (WARMUP_BASE_URL "
        f"{settings.target.display}) (hard bound {settings.gate_hard_s} s)")
    status = Steps.run(["timeout", f"--kill-after={KILL_AFTER_S}s", settings.gate_hard_s,
                        sys.executable, QUALIFY, "gate", "--records", records], env)
    gate = judged(records, status)
    if not (gate["judged"] or {}).get("summary"):
        publish_outcome(settings, "gate", status)
    gate.update(figures=gate_figures(gate["judged"]), records=records, status=status)
    log(f"gate ended: exit {status}, verdict {gate['verdict']}, "
        f"{int(time.monotonic() - started)} s")
    return gate


RECORDS_NAME = re.compile(r"(warmup|gate)-[0-9]{8}T[0-9]{6}Z(_[0-9]{1,3})?\.jsonl")


def run_stamp(folder: str) -> str:
    """WHEN for this run's warmup-WHEN.jsonl and gate-WHEN.jsonl: the UTC second, with a
    _N after it (sorted after the plain name) when an earlier run of that second has its
    files there (a file holds one run)."""
    when = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1, 1000):
        if not any(os.path.lexists(os.path.join(folder, f"{kind}-{when}.jsonl"))
                   for kind in ("warmup", "gate")):
            break
        when = f"{when.split('_')[0]}_{n}"
    return when


def prune_records(folder: str, keep: int, current: tuple = ()) -> list[str]:
    """The records files of all but the last `keep` warm-ups (and gates) in the folder,
    removed: this run's (`current`) always stay and count among them, the others go oldest
    first (by modification time; only regular files named as start.sh names them, never a
    link). Their names."""
    if keep == 0:
        return []
    removed = []
    for kind in ("warmup", "gate"):
        others = []
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if RECORDS_NAME.fullmatch(name) and name.startswith(kind + "-") and \
                    name not in current and os.path.isfile(path) and not os.path.islink(path):
                others.append((os.stat(path).st_mtime, name))
        mine = sum(1 for name in current if name.startswith(kind + "-")
                   and os.path.isfile(os.path.join(folder, name)))
        for _, name in sorted(others)[:max(len(others) - (keep - mine), 0)]:
            try:
                os.remove(os.path.join(folder, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def gate_figures(found: dict | None) -> str:
    """A gate's identifiers and worst CER as the OK and WARN lines show them."""
    from core.records import as_dict, show
    summary = as_dict(found and found["summary"])
    exact = as_dict(summary.get("identifiers_exact"))
    alone, batched = show(exact.get("alone"), 20), show(exact.get("batched"), 20)
    cer = summary.get("worst_cer")
    shapes = f"{alone} alone and batched" if alone == batched else \
        f"{alone} alone, {batched} batched"
    return f"identifiers {shapes}, worst CER " + (
        f"{cer:.3f}" if isinstance(cer, (int, float)) and not isinstance(cer, bool) else "n/a")


def write_ready_file(settings: Settings, log: Log, records: str, gate_records: str | None,
                     server_pgid: int):
    """The ready file from the verdicts of the warm-up's (and the gate's) records, naming
    the process group that must hold the port."""
    from tools.readback import ready_from_records
    why = ready_from_records(settings.ready_file, records, gate_records=gate_records,
                             server_pgid=server_pgid)
    if why is None:
        log(f"ready file {settings.ready_file} written: it names the server it vouches for; "
            f"`qualify.py ready --ready-file {settings.ready_file}` says while it stays true")
    else:
        log(f"WARN: the ready file {settings.ready_file} was not written: {why}")


def warm_up_and_report(settings: Settings, server: Server, log: Log, env: dict,
                       when: str) -> bool:
    """Warm-up (and gate), then OK or WARN from the warm-up's one verdict; the server must
    still run after them. A WARN names only files that exist. True for OK."""
    run = run_warmup(settings, server, log, env, when)
    notes = f"{run['compiles']} compile lines during warm-up"
    if run["cache_check"] == "not_made":
        notes += "; B1 cache check not made: the server does not report cached tokens"
    inspect = f"inspect before releasing HOLD ({notes})"
    custom = f"; custom plan: {run['differences']}" if run["differences"] != "-" else ""
    if run["status"] == 0 and run["verdict"] == "custom":
        log(f"WARN: warm-up passed a custom plan, not the contract's: {run['differences']}; "
            f"no ready file; {records_named(run['records'])} — {inspect}")
        return False
    warm = run["status"] == 0 and run["verdict"] == "pass"
    gate = run_gate(settings, log, env, when) if warm and settings.gate == "1" else None
    if not server.alive():
        raise server.gone("during the warm-up and gate" if gate else "during the warm-up")
    if not warm:
        log(f"WARN: warm-up failed (exit {run['status']}, verdict {run['verdict']}{custom}); "
            f"{records_named(run['records'])} — {inspect}")
        return False
    records = f"records: {run['records']}"
    if gate:
        records += f" and {gate['records']}" if os.path.isfile(gate["records"]) else \
            " (the gate wrote no records)"
        if gate["status"] != 0 or gate["verdict"] != "pass":
            log(f"WARN: warm-up passed, gate failed (exit {gate['status']}, verdict "
                f"{gate['verdict']}; {gate['figures']}); {records} — {inspect}")
            return False
    if settings.ready_file:
        write_ready_file(settings, log, run["records"], gate and gate["records"], server.pid)
    what = f": {run['counts']}" if run["counts"] else ""
    what += f" ({run['given']})" if run["given"] else ""
    passed = f"gate passed ({gate['figures']})" if gate else ""
    log(f"OK: warm-up passed{what}{', ' + passed if passed else ''}; {records} — read "
        f"them before releasing HOLD ({notes})")
    return True


# ---------------------------------------------------------------------------
# Signals, supervision, main().
# ---------------------------------------------------------------------------

def interrupt_while_starting() -> None:
    """TERM/INT while starting raise Interrupted (exit 143 / 130)."""
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        name, code = ("TERM", 143) if signum == signal.SIGTERM else ("INT", 130)
        raise Interrupted(code, name)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def supervise(settings: Settings, server: Server, log: Log) -> int:
    """Stay the server's parent until its launched process ends (a container's entry
    point): TERM and INT go to the server process (vLLM drains first); every child is
    reaped (as PID 1, orphans too).
    When it ends, say how and after how long, stop what is left of its group (KILL after
    the grace), and exit: with its status when a signal asked it to stop, else non-zero
    (a crash, a signal from elsewhere, or an exit 0 nobody asked for), so that every
    restart policy restarts it."""
    asked: list = []                        # (signal name, when), from the handler
    marked: list = []                       # what marking the ready file stopping did
    from tools.ready import mark_stopping, watch_sleep

    def pass_on(signum, frame):
        """Not ready first (the ready file marked stopping: no lock is taken here), then the
        signal to the server, which drains while traffic leaves."""
        if settings.ready_file and not asked:
            marked.append(mark_stopping(settings.ready_file))
        asked.append((signal.Signals(signum).name[3:], time.monotonic()))
        server.signal_server(signum)
    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    log(f"supervising server process group {server.pid} (--supervise): TERM and INT go to "
        f"the server; start.sh ends when the server does")
    told, killed, watched = 0, False, time.monotonic()
    grace = int(settings.stop_grace_s)
    while True:
        server.reap()
        if settings.ready_file and not asked and time.monotonic() - watched >= SLEEP_WATCH_S:
            watched = time.monotonic()            # a short sleep between probes is seen too
            said = watch_sleep(settings.ready_file, settings.target, PROBE_TIMEOUT_S)
            if said:
                log(f"server asleep: {said}")
        while told < len(asked):
            log(f"{asked[told][0]} received: passed on to the server (pid {server.pid}); "
                f"what is left of its group is stopped when it ends")
            if told == 0 and marked:
                log(f"ready file {settings.ready_file}: {marked[0]}")
            told += 1
        if not server.alive():
            break
        if asked and not killed and time.monotonic() - asked[0][1] >= grace:
            log(f"server group {server.pid} still alive {grace} s after the signal: KILL")
            server.kill(signal.SIGKILL)
            killed = True
        time.sleep(0.1)
    status = 1 if server.status is None else server.status
    how = f"with status {status}" if status < 128 else \
        f"by signal {signal.Signals(status - 128).name if status - 128 in SIGNALS else status - 128}"
    if asked:
        code = status
        log(f"server ended {how} after {server.ended_after} s, asked to stop ({asked[0][0]} "
            f"passed on): start.sh exits {code}")
    else:
        code = status or 1
        log.error(f"server ended {how} after {server.ended_after} s, unasked (a crash, a "
                  f"signal from elsewhere, or an exit nobody asked for): start.sh exits "
                  f"{code}, so that a restart policy restarts it")
    if server.left():                 # asked: within the one grace since the signal
        log(f"stopping what is left of server process group {server.pid}")
        server.stop_group(max(int(grace - (time.monotonic() - asked[0][1])), 1)
                          if asked else None)
    if log.writer is not None and log.writer.dropped:
        log(f"{log.writer.dropped} lines of output were dropped: nobody read them in time "
            f"(server.log keeps the server's)")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return code


def chunk_said(log: Log, asked: str | None, server_chunk: str | None, where: str) -> None:
    """Say where B1's chunk comes from: the server's own wins over WARMUP_CHUNK_TOKENS (a
    smaller one would let B1 run as one unchunked prefill and still pass)."""
    if not server_chunk or server_chunk == asked:
        return
    replaced = f"; WARMUP_CHUNK_TOKENS '{asked}' is not used" if asked else ""
    log(f"prefill chunk {server_chunk} tokens (from {where}): B1 is sized past it{replaced}")


def usage_error(problem: str) -> int:
    print(f"start.sh: {problem}\nstart.sh: see start.sh --help", file=sys.stderr)
    return 2


def start(settings: Settings, log: Log) -> int:
    """Launch, guard, warm up: the exit status. The textfile says 'starting' first (no
    older success stays standing), and how the start ended when no warm-up says it."""
    publish_outcome(settings, "warmup", 0, "starting", log)
    if settings.gate == "1":
        publish_outcome(settings, "gate", 0, "starting", log)
    server = Server(settings, log)
    env = settings.server_env()
    ended = None
    try:
        refuse_a_running_server(settings, log)
        chunk_said(log, settings.env.get("WARMUP_CHUNK_TOKENS"), env.get("WARMUP_CHUNK_TOKENS"),
                   "the server command's --max-num-batched-tokens")
        if settings.ready_file:        # a start it launches vouches anew (a refused one not)
            try:
                os.remove(settings.ready_file)
            except FileNotFoundError:
                pass
            except OSError as exc:
                ended = 2, "usage"
                return usage_error(f"--ready-file '{settings.ready_file}' cannot be removed "
                                   f"({exc.strerror})")
        interrupt_while_starting()
        launch_and_warm(settings, server, log, env)
    except Interrupted as signalled:
        ended = signalled.code, "killed"
        log.error(f"interrupted by {signalled.name} while starting: stopping the server it "
                  f"launched")
        Steps.stop()
        server.stop_group()
        return signalled.code
    except (OSError, ValueError) as exc:    # a step that cannot run (no bash, no timeout)
        ended = 1, "not_started"
        said = os_problem(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
        log.error(f"start.sh cannot go on: {said}; stopping the server it launched")
        Steps.stop()
        server.stop_group()
        return 1
    except Exit as exc:
        ended = exc.code, "not_started"
        raise
    finally:
        if ended is not None:
            publish_outcome(settings, "warmup", ended[0], ended[1], log)
    if settings.textfile and settings.warmup == "1" and os.path.isfile(settings.textfile):
        log(f"results published for monitoring in {settings.textfile}")
    if settings.supervise == "1":
        return supervise(settings, server, log)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    log(f"exit 0: server process group {server.pid} keeps running")
    return 0


class AttachedServer(Server):
    """The server an earlier start.sh launched in LOG_DIR (--rewarm): alive while its
    launched pid is; a re-warm never stops it."""

    def __init__(self, settings: Settings, log: Log, pid: int):
        super().__init__(settings, log)
        self.pid, self.launched_at = pid, time.monotonic()
        self.log_offset = size_of(self.server_log)      # its errors from now on

    def alive(self) -> bool:
        return process_alive(self.pid)

    def stop_group(self, grace_s: int | None = None) -> None:
        self.log(f"server process group {self.pid} left running (a re-warm stops nothing)")


def rewarm(settings: Settings, log: Log) -> int:
    """start.sh --rewarm: the server LOG_DIR's server.pid names, at the address its
    server.url says, warmed again as a start warms it (its port held by its group, the
    chunk from server.chunk); the ready file removed first, written only from a pass; 0
    only for a pass."""
    from core.transport import UsageError, parse_base_url
    read = {name: read_small(os.path.join(settings.log_dir, name))
            for name in ("server.pid", "server.url", "server.chunk")}
    pid = int(read["server.pid"]) if read["server.pid"].isascii() and \
        read["server.pid"].isdigit() and 1 < int(read["server.pid"]) < 1 << 22 else 0
    try:
        settings.target = parse_base_url(read["server.url"], "server.url")
    except UsageError:
        pid = 0
    if not pid or not process_alive(pid):
        log.error(f"no server to warm again in {settings.log_dir}: server.pid and server.url "
                  f"must name the live server an earlier start.sh launched there")
        return 1
    settings.base_url = settings.target.display
    log(f"re-warm of server process group {pid} at {settings.target.display} (--rewarm)")
    publish_outcome(settings, "warmup", 0, "starting", log)
    if settings.ready_file:                  # not ready until this re-warm passes
        drop_ready_file(settings.ready_file)
    server = AttachedServer(settings, log, pid)
    env = settings.server_env()
    if read["server.chunk"].isascii() and read["server.chunk"].isdigit():
        env["WARMUP_CHUNK_TOKENS"] = read["server.chunk"]
    interrupt_while_starting()
    when = run_stamp(settings.log_dir)
    try:
        refuse_a_foreign_answer(settings, server, log)
        return 0 if warm_up_and_report(settings, server, log, env, when) else 1
    except Interrupted as signalled:
        log.error(f"re-warm interrupted by {signalled.name}: the server keeps running")
        Steps.stop()
        publish_outcome(settings, "warmup", signalled.code, "killed", log)
        return signalled.code
    except Exit as exc:
        publish_outcome(settings, "warmup", exc.code, "not_started", log)
        return exc.code
    finally:
        prune_records(settings.log_dir, int(settings.keep),
                      (f"warmup-{when}.jsonl", f"gate-{when}.jsonl"))


def read_small(path: str) -> str:
    """The first line of a small file start.sh wrote (a regular file only), or ''."""
    try:
        with open_regular(path) as handle:
            return handle.read(4096).decode("ascii", "replace").split("\n")[0].strip()
    except OSError:
        return ""


def launch_and_warm(settings: Settings, server: Server, log: Log, env: dict) -> None:
    """Launch the server, wait for /health within the guard, warm it up (and gate it)."""
    server.start()
    env["WARMUP_HEALTHY_AT"] = f"{wait_ready(settings, server, log):.3f}"
    chunk = logged_chunk(server.logged_since(server.log_offset))
    if chunk and not settings.command_chunk():
        chunk_said(log, env.get("WARMUP_CHUNK_TOKENS"), chunk, "server.log")
        env["WARMUP_CHUNK_TOKENS"] = chunk       # B1 must be longer than the chunk
    if chunk or settings.command_chunk():       # for a re-warm (--rewarm) of this server
        with open_own(os.path.join(settings.log_dir, "server.chunk"), "w") as handle:
            handle.write(env["WARMUP_CHUNK_TOKENS"] + "\n")
    if settings.warmup == "0":
        log(f"warm-up skipped (--no-warmup); server process group {server.pid} is up")
        publish_outcome(settings, "warmup", 0, "not_warmed", log)
        return
    when = run_stamp(settings.log_dir)           # warmup-WHEN, gate-WHEN
    try:
        warm_up_and_report(settings, server, log, env, when)
    finally:
        removed = prune_records(settings.log_dir, int(settings.keep),
                                (f"warmup-{when}.jsonl", f"gate-{when}.jsonl"))
        if removed:
            log(f"removed {len(removed)} records file(s) older than the last "
                f"{settings.keep} runs (--keep): {', '.join(removed)}")


def main(argv: list[str] | None = None, env: dict | None = None) -> int:
    """start.sh's exit status (see HELP)."""
    argv = sys.argv[1:] if argv is None else argv
    try:                 # every module of the folder it uses, before anything is launched
        for module in ("start.processes", "start.server_command", "start.settings",
                       "start.supervisor", "tools.procfs", "tools.readback", "tools.ready",
                       "core.readyfile", "core.textfile", "core.vllm_client"):
            importlib.import_module(module)
    except ImportError as exc:                 # one line, no trace, nothing launched
        print(f"start.sh: cannot load {exc.name or exc}: offload/launch/ is copied and "
              f"rolled back as one folder; restore the whole folder", file=sys.stderr)
        return 2
    settings = None
    try:
        settings = Settings(argv, dict(os.environ if env is None else env))
        if settings.help:
            print(HELP)
            return 0
        settings.check()
    except Usage as exc:
        if settings is not None:          # no older success stays standing
            publish_outcome(settings, "warmup", 2, "usage")
        return usage_error(str(exc))
    log = Log(settings.log_dir)
    try:
        return rewarm(settings, log) if settings.rewarm else start(settings, log)
    except Exit as exc:
        return exc.code
    finally:
        if log.writer is not None and not log.writer.flush(2.0):
            STUCK_OUTPUT.append(True)     # nobody reads our output: leave without it


if __name__ == "__main__":
    code = main()
    if STUCK_OUTPUT:
        os._exit(code)                    # flushing would wait on a reader forever
    sys.exit(code)
