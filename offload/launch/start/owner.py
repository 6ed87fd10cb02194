"""The owner of a pod's readiness (start.sh --supervise): the one process that moves it.

MOVES and move() say which event moves which state where (Ready only in `warm`); an Owner
holds the state in memory and is the one writer of what it publishes, once per move; it
answers GET /ready (start/readiness.py) and start.sh --rewarm (RewarmSocket). Every other
process may only take readiness away (remove the ready file); none writes it.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time

from core.cli import number_in, whole
from core.files import remove_regular
from core.runframe import records_name
from start.server import STOP_SIGNALS, Exit
from start.steps import (Steps, prune_records, publish_start_outcome, run_stamp,
                         warm_up_and_report)

STATES = ("starting", "warming", "warm", "asleep", "rewarming", "refused", "failed",
          "stopping")
MOVES = {                 # event: (the states it leaves, the state it enters)
    "healthy": (("starting",), "warming"),
    "passed": (("warming", "rewarming"), "warm"),
    "refused": (("warming", "rewarming"), "refused"),
    "retry": (("refused",), "warming"),
    "failed": (("warming", "rewarming", "refused"), "failed"),
    "slept": (("warm", "refused", "failed"), "asleep"),
    "woke": (("asleep",), "rewarming"),
    "asked": (("warm", "refused", "failed"), "rewarming"),
    "port lost": (("warm",), "failed"),
    "stop": (STATES[:-1], "stopping"),
}
WATCH_S = 2.0                         # the server is looked at this often, at most
RETRY_FIRST_S, RETRY_MAX_S = 2.0, 30.0    # a refused warm-up's backoff, doubling
SOCKET_NAME = "owner.sock"


def move(state: str, event: str) -> str | None:
    """The state `event` moves `state` to, or None when it does not apply there. Pure."""
    leaves, enters = MOVES[event]
    return enters if state in leaves else None


def stop_outcome(in_flight: int | None, shutdown_s: float | None, took_s: float,
                 killed: bool) -> tuple[str, str]:
    """(drained, cut or unknown; the words): drained only when nothing in flight can have
    been cut: none was in flight at the TERM, or the server ended within its
    --shutdown-timeout (vLLM waits that long for them; 0, its default, fails them). Pure."""
    timeout = f"--shutdown-timeout {shutdown_s:g}" if shutdown_s else \
        "no --shutdown-timeout (vLLM's default 0 fails requests in flight)"
    if in_flight == 0:
        return "drained", "nothing was in flight at the TERM"
    if killed:
        return "cut", "what it still had in flight was lost"
    counted = "requests in flight at the TERM: unknown (/metrics unread)" \
        if in_flight is None else f"{in_flight} requests in flight at the TERM"
    if shutdown_s and took_s <= shutdown_s:
        return "drained", f"{counted}, ended within its {timeout}"
    if in_flight is None:
        return "unknown", f"{counted}; {timeout}: cannot tell whether any was cut"
    if not shutdown_s:
        return "cut", f"{counted}, {timeout}: they were cut"
    return "unknown", f"{counted}, ended past its {timeout}: some may have been cut"


def remove_socket(path: str) -> None:
    """An owner's socket removed (an earlier owner's, or ours at the end); never a link."""
    import stat
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.remove(path)
    except OSError:
        pass


class RewarmSocket:
    """A Unix socket in the log folder (mode 600): each connection that says `rewarm`
    is queued for the owner, which answers with its log lines and `exit N`."""

    def __init__(self, path: str, asked: queue.Queue):
        self.path, self.asked = path, asked
        remove_socket(path)               # an earlier owner's, gone with it
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(path)
        finally:
            os.umask(old)
        self.sock.listen(4)
        threading.Thread(target=self._accept, name="rewarm", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return                    # the socket closed: the owner is gone
            try:                          # a client that says nothing holds it 5 s at most
                conn.settimeout(5.0)
                said = conn.recv(64)
            except OSError:
                said = b""
            if said.strip() == b"rewarm":
                self.asked.put(conn)
            else:
                conn.close()


def ask_owner(log_dir: str, bound_s: float, say) -> int | None:
    """start.sh --rewarm through the owner: its lines said, its exit status; None when no
    owner listens in log_dir (no --supervise: the re-warm runs here)."""
    path = os.path.join(log_dir, SOCKET_NAME)
    if not os.path.exists(path):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(5.0)
        conn.connect(path)
        conn.sendall(b"rewarm\n")
    except OSError:
        conn.close()
        return None
    deadline, rest, code, closed = time.monotonic() + bound_s, b"", None, False
    with conn:
        while not closed and time.monotonic() < deadline:
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                got = conn.recv(65536)
            except OSError:
                break                     # the wait ran out, or the socket broke
            closed = not got
            *lines, rest = (rest + got).split(b"\n")
            for line in lines:
                text = line.decode("utf-8", "replace")
                said = number_in(text[5:], whole(0, 255)) if text.startswith("exit ") else None
                if said is None:
                    say(text)
                else:
                    code = said
    if code is None:
        say("start.sh --rewarm: the owner gave no outcome (" + (
            "it is stopping, or ended" if closed else f"none within {bound_s:g} s") +
            "): see start.log")
    return 1 if code is None else code


class Owner:
    """The pod's readiness, held in memory and moved only here (see MOVES)."""

    def __init__(self, settings, server, log, env: dict, chunk_from: str):
        self.settings, self.server, self.log, self.env, self.chunk_from = \
            settings, server, log, env, chunk_from
        self.state, self.warmed_pid = "starting", 0
        self.budget_until = server.launched_at + settings.start_guard_s  # from the launch
        self.retry_at, self.backoff, self.refusals = None, RETRY_FIRST_S, 0
        self.next_watch = time.monotonic() + WATCH_S
        self.asked: list = []                  # (signal name, when, number), the handler's
        self.said_stop, self.in_flight = False, None      # passed on; in flight at the TERM
        self.stopped_from, self.answering = "", 0
        self.requests: queue.Queue = queue.Queue()
        self.shutdown_s = settings.command_shutdown_s()

    def ready(self, state: str | None = None) -> bool:
        """Warm (`state`, or now), for the launched process still running (any thread)."""
        return (state or self.state) == "warm" and self.warmed_pid == self.server.pid and \
            self.server.status is None

    def go(self, event: str, why: str = "") -> bool:
        """Move by `event` if it applies: leaving warm takes the ready file away first;
        the move said in start.log. False when the event does not apply now."""
        new = move(self.state, event)
        if new is None:
            return False
        old = self.state
        if old == "warm" and self.settings.ready_file:
            remove_regular(self.settings.ready_file)
        if old == "refused":
            self.retry_at = None          # a re-warm asked, or a sleep: no stale retry after
        if event in ("asked", "woke"):    # a new attempt: its refusals counted from none
            self.refusals, self.backoff = 0, RETRY_FIRST_S
        self.state = new
        if self.asked:                    # a TERM between the two lines above wins
            self.state = "stopping"
            return False
        self.log(f"readiness: {old} -> {new} ({event}{': ' + why if why else ''})")
        if new in ("warming", "rewarming"):
            self.publish("running", 0)
        return True

    def publish(self, verdict: str, status: int) -> None:
        publish_start_outcome(self.settings, "warmup", status, verdict, self.log)

    def vouch(self, run: dict, gate_records: str | None) -> str | None:
        """A warm-up (and gate) that passed and vouches for what is required (a plan's
        digest, a chunk not assumed): the ready file written and the state warm, unless
        something moved it meanwhile (a TERM); None when vouched, else why not."""
        if self.state not in ("warming", "rewarming"):
            return f"the pod is {self.state} now"
        from tools.ready import slept
        exposition = read_gauges(self.settings.target, 5.0)   # a sleep during the warm-up
        if exposition is None or slept(exposition):
            return "the server " + ("went to sleep during the warm-up" if exposition else
                                    "did not answer /metrics after it")
        from tools.readback import ready_from_records
        why = ready_from_records(self.settings.ready_file, run["records"],
                                 gate_records=gate_records, server_pgid=self.server.pid,
                                 required=self.settings.required(),
                                 chunk_from=self.chunk_from)
        if why:
            return why
        if self.state not in ("warming", "rewarming"):      # a TERM while it was written
            if self.settings.ready_file:
                remove_regular(self.settings.ready_file)
            return f"the pod is {self.state} now"
        self.warmed_pid = self.server.pid
        self.go("passed", f"records {os.path.basename(run['records'])}")
        return None

    def warm(self) -> None:
        """One warm-up (and gate) through the start's steps, its textfile staged and
        carried over once it ended; then passed (vouch moved it), refused (a retry is
        due after the backoff) or failed."""
        from core.textfile import carry
        settings, textfile, env = self.settings, self.settings.textfile, dict(self.env)
        stage = os.path.join(settings.log_dir, "attempt.prom")
        if textfile:
            remove_regular(stage)            # the step publishes there; the owner carries it
            settings.textfile = env["WARMUP_TEXTFILE"] = stage
        when, run = run_stamp(settings.log_dir), {}
        try:
            run = warm_up_and_report(settings, self.server, self.log, env, when,
                                     chunk_from=self.chunk_from, vouch=self.vouch)
        finally:
            settings.textfile = textfile
            if textfile and run.get("verdict") == "pass" and not run["passed"]:
                self.publish("fail", 1)   # a pass the owner did not vouch for is none
            elif textfile:
                why = carry(stage, textfile)
                if why:
                    self.log(f"WARN: {why}")
            prune_records(settings.log_dir, settings.keep,
                          (records_name("warmup", when), records_name("gate", when)))
        if run["passed"]:
            self.backoff, self.refusals = RETRY_FIRST_S, 0
        elif run["verdict"] == "refused" and self.go("refused", "the guard refused"):
            plan_retry(self)
        else:                 # a wrong answer, or a pass the ready file cannot vouch for
            self.go("failed", f"exit {run['status']}, {run['verdict']}: its WARN says why")

    def retry(self) -> None:
        """A refused warm-up tried again, or, past the start guard, given up: failed; only
        while refused (a re-warm or a sleep since then cancelled it)."""
        self.retry_at = None
        if self.state != "refused":
            return
        if time.monotonic() < self.budget_until:
            if self.go("retry", f"attempt {self.refusals + 1}"):
                self.warm()
        elif self.go("failed", f"refused {self.refusals} time{'s' * (self.refusals != 1)}, "
                               f"no retry after the {self.settings.start_guard_s} s start "
                               f"guard; warm it again: start.sh --rewarm"):
            self.publish("fail", 3)

    def on_signal(self, signum, frame) -> None:
        """TERM, INT or HUP: not ready at once (in memory, the ready file removed), the running
        step stopped; the signal reaches the server from the loop, after the requests in
        flight are counted. No lock, no line here."""
        self.asked.append((signal.Signals(signum).name[3:], time.monotonic(), signum))
        if len(self.asked) == 1:
            self.stopped_from, self.state = self.state, "stopping"
            if self.settings.ready_file:
                remove_regular(self.settings.ready_file)
            if Steps.child is not None and Steps.child.poll() is None:
                Steps.child.terminate()

    def run(self) -> int:
        """Warm, then watch until the server ends; start.sh's exit status (supervise's)."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.on_signal)
        self.answering = open_channels(self)
        try:
            return supervise(self)
        except Exit:                      # the server ended during a warm-up (its ERROR said)
            if self.state != "stopping":
                self.log(f"readiness: {self.state} -> failed (the server ended)")
                self.state = "failed"
            remove_socket(os.path.join(self.settings.log_dir, SOCKET_NAME))
            raise


def plan_retry(owner: "Owner") -> None:
    """A refused warm-up's retry: after the backoff, or as the start guard ends if that is
    sooner (Owner.retry() then gives up)."""
    now, wait, guard = time.monotonic(), owner.backoff, owner.settings.start_guard_s
    left = owner.budget_until - now
    owner.refusals, owner.backoff = owner.refusals + 1, min(wait * 2, RETRY_MAX_S)
    owner.retry_at = now + max(0.0, min(wait, left))
    if wait < left:
        said = f"retried in {wait:g} s, within the {guard} s start guard"
    elif left > 0:
        said = (f"the {guard} s start guard ends in {left:.1f} s, before a retry could "
                f"({wait:g} s): failed then")
    else:
        said = f"the {guard} s start guard has ended: failed now"
    owner.log(f"warm-up refused ({owner.refusals}): {said}")


def supervise(owner: "Owner") -> int:
    """The first warm-up, then the loop until the server ends."""
    if owner.go("healthy"):
        owner.warm()
    owner.log(f"supervising server process group {owner.server.pid} (--supervise): "
              f"readiness is this process's (GET /ready" + (
                  f" on port {owner.answering}" if owner.answering else
                  ": not answered") + "); TERM, INT and HUP stop the server")
    killed = False
    while True:
        owner.server.reap()
        if owner.asked and not owner.said_stop:
            pass_on(owner)
        if not owner.server.alive():
            break
        if owner.asked:
            if not killed and time.monotonic() - owner.asked[0][1] >= \
                    owner.settings.stop_grace_s:
                owner.log(f"server group {owner.server.pid} still alive "
                          f"{owner.settings.stop_grace_s} s after the signal: KILL")
                owner.server.kill(signal.SIGKILL)
                killed = True
        elif owner.retry_at is not None and time.monotonic() >= owner.retry_at:
            owner.retry()
        elif time.monotonic() >= owner.next_watch:
            watch(owner)
        elif not owner.requests.empty():
            answer(owner, owner.requests.get())
        time.sleep(0.1)
    return ended(owner, killed)


def watch(owner: "Owner") -> None:
    """The port's holder and the sleep state, every WATCH_S: another process on the
    port or a sleep takes readiness away; a wake warms again."""
    from tools.ready import foreign_listener
    owner.next_watch = time.monotonic() + WATCH_S
    if owner.state == "warm":             # the port's holder, by the one rule (procfs)
        why = foreign_listener({"server_pgid": owner.server.pid}, owner.settings.target.port)
        if why:
            owner.go("port lost", why)
    exposition = read_gauges(owner.settings.target, 1.0)
    if exposition is None:
        return
    from tools.ready import slept
    from core.vllm_metrics import asleep_problem
    if slept(exposition):
        owner.go("slept", asleep_problem(exposition) or "asleep")
    elif owner.go("woke", "every engine awake again"):
        owner.warm()


def read_gauges(target, timeout_s: float):
    """The sleep and request gauges from /metrics, or None (bounded)."""
    from core.transport import Clock
    from core.vllm_metrics import GAUGES, SLEEP_GAUGE, read_exposition
    from tools.ready import basic_auth
    return read_exposition(target, Clock.start(timeout_s, timeout_s),
                           only=(SLEEP_GAUGE,) + GAUGES, headers=basic_auth(target))[0]


def answer(owner: "Owner", conn: socket.socket) -> None:
    """start.sh --rewarm asked: warmed again (its lines sent back), or refused."""
    def tee(line: str) -> None:
        try:
            conn.sendall(line.encode("utf-8", "replace") + b"\n")
        except OSError:
            owner.log.tee = None
    owner.log.tee = tee
    try:
        if owner.go("asked", "start.sh --rewarm"):
            owner.warm()
        else:
            owner.log(f"ERROR: re-warm refused: the pod is {owner.state} (asleep: wake it "
                      f"first; stopping: nothing more runs)")
        tee(f"exit {0 if owner.state == 'warm' else 1}")
    finally:
        owner.log.tee = None
        conn.close()


def pass_on(owner: "Owner") -> None:
    """The first signal said, the requests in flight counted, then passed on."""
    owner.said_stop = True
    name, _, signum = owner.asked[0]
    exposition = read_gauges(owner.settings.target, 1.0)
    if exposition is not None:
        from core.vllm_metrics import GAUGES
        owner.in_flight = int(sum(v for n, _, v in exposition.samples if n in GAUGES
                                 and v == v and v >= 0))
    owner.server.signal_server(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
    owner.log(f"{name} received: passed on to the server (pid {owner.server.pid}" +
              (", as TERM" if signum == signal.SIGHUP else "") + ") with " +
              ("an unknown number of" if owner.in_flight is None else str(owner.in_flight)) +
              f" requests in flight; readiness: {owner.stopped_from} -> stopping (stop: not "
              f"ready, the ready file removed); what is left of its group is stopped when it "
              f"ends")


def open_channels(owner: "Owner") -> int:
    """The readiness answer and the re-warm socket; one that cannot open is said. The port
    answered on, or 0."""
    port = owner.settings.ready_port
    if port:
        from start.readiness import serve_readiness     # loaded with the port (settings)
        try:
            serve_readiness(owner, port)
        except OSError as exc:
            owner.log(f"WARN: GET /ready cannot listen on port {port} "
                      f"({exc.strerror or exc}): the pod is never Ready by it")
            port = 0
    try:
        RewarmSocket(os.path.join(owner.settings.log_dir, SOCKET_NAME), owner.requests)
    except OSError as exc:
        owner.log(f"WARN: start.sh --rewarm cannot reach this process "
                  f"({exc.strerror or exc}): re-warm by restarting the container")
    return port


def ended(owner: "Owner", killed: bool) -> int:
    """The server ended: said, how a stop went published, what is left stopped."""
    from start.server import SIGNALS
    server, log, grace = owner.server, owner.log, owner.settings.stop_grace_s
    status = 1 if server.status is None else server.status
    how = f"with status {status}" if status < 128 else "by signal " + (
        signal.Signals(status - 128).name if status - 128 in SIGNALS else str(status - 128))
    if owner.asked:
        code = status
        log(f"server ended {how} after {server.ended_after} s, asked to stop "
            f"({owner.asked[0][0]} passed on): start.sh exits {code}")
        took = time.monotonic() - owner.asked[0][1]
        outcome, words = stop_outcome(owner.in_flight, owner.shutdown_s, took, killed)
        log(f"stop: {outcome}: " + (f"KILLed after the {grace:g} s grace "
                                    f"(START_STOP_GRACE_S): {words}" if killed else
                                    f"the server ended {took:.1f} s after "
                                    f"{owner.asked[0][0]}, within the {grace:g} s grace; "
                                    f"{words}"))
        if owner.settings.textfile:
            from core.textfile import publish
            why = publish(owner.settings.textfile, "offload_stop", stop_samples(
                took, grace, killed, time.time(), owner.in_flight, outcome))
            if why:
                log(why)
    else:
        code = status or 1
        owner.state = "failed"
        log.error(f"server ended {how} after {server.ended_after} s, unasked (a crash, a "
                  f"signal from elsewhere, or an exit nobody asked for): start.sh exits "
                  f"{code}, so that a restart policy restarts it")
        if owner.settings.ready_file:
            remove_regular(owner.settings.ready_file)
    if server.left():
        log(f"stopping what is left of server process group {server.pid}")
        server.stop_group(max(int(grace - (time.monotonic() - owner.asked[0][1])), 1)
                          if owner.asked else None)
    remove_socket(os.path.join(owner.settings.log_dir, SOCKET_NAME))
    if log.writer is not None and log.writer.dropped:
        log(f"{log.writer.dropped} lines of output were dropped: nobody read them in time "
            f"(server.log keeps the server's)")
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    return code


def stop_samples(took_s: float, grace_s: float, killed: bool, at: float,
                 in_flight: int | None, outcome: str) -> list[tuple]:
    """The textfile's record of the last asked stop (offload_stop_*; the warm-up's series
    stay as they are), with the requests in flight at the TERM where /metrics said them.
    Pure."""
    counted = [] if in_flight is None else [
        ("offload_stop_last_in_flight", {}, float(in_flight),
         "Requests in flight (running and waiting) when start.sh passed the TERM on.")]
    return counted + [
        ("offload_stop_last_drained", {}, 1.0 if outcome == "drained" else 0.0,
         "1 when nothing in flight can have been cut (none was, or the server ended within "
         "its --shutdown-timeout); 0 when they were cut or it cannot tell."),
        ("offload_stop_last_timestamp_seconds", {}, at,
         "When start.sh --supervise last saw its server end after a TERM, INT or HUP."),
        ("offload_stop_last_duration_seconds", {}, round(took_s, 3),
         "From the signal to the server's end (its drain and teardown)."),
        ("offload_stop_last_grace_seconds", {}, float(grace_s),
         "START_STOP_GRACE_S: how long start.sh waits before it KILLs the server."),
        ("offload_stop_last_killed", {}, 1.0 if killed else 0.0,
         "1 when the server outlasted the grace and was KILLed (its in-flight work lost).")]
