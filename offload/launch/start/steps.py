"""start.sh's steps: the start (launch, guard, warm up, report), a re-warm, and the
warm-up and gate as children whose records decide OK or WARN.

start() refuses a running server, launches, waits for /health, runs the warm-up under
warmup_serve.sh's hard bound (and the gate), judges their records (readback.last_verdict),
writes the ready file and says OK or WARN (under --supervise, from /health on, the owner
does: start/owner.py); rewarm() warms LOG_DIR's server again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from core.cli import number_in, seconds, whole
from core.contract import NOT_REPORTED, chunk_said, read_plan
from core.files import open_own, open_regular, regular, remove_regular
from core.runframe import records_name
from tools.vllm_log import COMPILE_LINES, logged_chunk
from start.processes import process_alive, stop_session
from start.server import (STOP_SIGNALS, AttachedServer, Exit, Interrupted, LaunchedServer,
                          Log, interrupt_while_starting, read_small, refuse_a_foreign_answer,
                          refuse_a_running_server, wait_ready)
from start.settings import Settings, Usage, check_file_place, os_problem, ready_port_problem
from start.supervisor import shell_status, size_of

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # offload/launch/
WRAPPER = os.path.join(HERE, "warmup_serve.sh")
QUALIFY = os.path.join(HERE, "qualify.py")
RECORDS_PREFIX = "records| "            # a step's record on a container's log
MAX_ECHO_BYTES = 1 << 20
KILL_AFTER_S = 5                      # TERM to KILL of a step (warmup_serve.sh keeps its own, in bash)
RECORDS_NAME = re.compile(r"(warmup|gate)-[0-9]{8}T[0-9]{6}Z(_[0-9]{1,3})?\.jsonl")


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
        """TERM the running step, if any, and give it KILL_AFTER_S to end."""
        if cls.child is not None and cls.child.poll() is None:
            cls.child.terminate()
            try:
                cls.child.wait(KILL_AFTER_S)
            except subprocess.TimeoutExpired:
                pass
        if cls.child is not None:         # and what it left in its session: KILLed
            stop_session(cls.child.pid, 1.0)


def judged(records: str, status: int) -> dict:
    """What a step's records file shows, as qualify.py report judges it
    (readback.last_verdict: contract.decide(), the warm-up's own verdict), named as the
    terminal and the textfile name it (cli.outcome; from the step's exit status when
    it left no summary): the verdict, the plan's differences (with the settings that made
    them), the cache check, what passed ('contract 10/10, paths stream 5/5') and the
    settings that added to the plan, with where they came from."""
    from tools.readback import last_verdict
    from core.records import parts_text, show
    from core.cli import outcome
    from core.textfile import outcome_of_status
    found = last_verdict(records) if os.path.isfile(records) else None
    if found is None or found.summary is None:
        return {"verdict": outcome_of_status(status), "differences": "-", "plan": None,
                "cache_check": "-", "judged": found, "counts": "", "given": "", "notes": ()}
    run, decided = found.run, found.decided
    given = (run.plan.given or {}) if run else {}
    plan = read_plan(run.plan)[0] if run and run.mode == "warmup" else None
    return {"verdict": outcome(found.verdict, status), "judged": found, "plan": plan,
            "differences": "; ".join(decided.differences) or "-",
            "cache_check": str(found.summary.cache_check or "-"),
            "counts": parts_text(decided.parts), "notes": decided.notes,
            "given": ", ".join(show(v, 120) for v in given.values())}


def records_line(path: str) -> str:
    """A records file as a WARN line names it: only one that exists."""
    return f"records: {path}" if os.path.isfile(path) and os.path.getsize(path) else \
        "no records file (the step ended before writing one)"


def publish_start_outcome(settings: Settings, mode: str, status: int, verdict: str = "",
                          log=None, said: str = "") -> None:
    """How a step or start.sh itself ended, in the textfile (success 0): a step that left
    no summary (its verdict from its exit status), a start begun (starting), refused or
    not trusted (not_started), interrupted (killed), skipped (not_warmed) or a usage
    error. A textfile that cannot be written is removed, and that said (unless `said`
    already is the reason: a usage error about the textfile itself)."""
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
    elif why and why != said:
        print(f"start.sh: {why}", file=sys.stderr)


def run_warmup(settings: Settings, server: LaunchedServer, log: Log, env: dict, when: str) -> dict:
    """The warm-up through warmup_serve.sh, and what its records show."""
    records = os.path.join(settings.log_dir, records_name("warmup", when))
    started, offset = time.monotonic(), size_of(server.server_log)
    log(f"warm-up: {WRAPPER} --records {records} (WARMUP_BASE_URL {settings.target.display})")
    status = Steps.run(["bash", WRAPPER, "--records", records], env)
    run = judged(records, status)
    if not (run["judged"] and run["judged"].summary):
        publish_start_outcome(settings, "warmup", status)
    compiles = sum(1 for line in server.logged_since(offset).splitlines()
                   if COMPILE_LINES.search(line))
    run.update(records=records, status=status, compiles=compiles)
    log(f"warm-up ended: exit {status}, verdict {run['verdict']}, "
        f"{int(time.monotonic() - started)} s, {compiles} compile lines in server.log during it")
    if settings.supervise:
        echo_records(log, records)
    return run


def echo_records(log: Log, path: str) -> None:
    """A container's step records, sanitized as written, also on its log ('records| ' before
    each line, at most MAX_ECHO_BYTES): the cluster's log pipeline keeps them when the pod,
    and its log volume, are gone."""
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_ECHO_BYTES + 1)
    except OSError:
        return                            # no records: the WARN line says so
    text = data[:MAX_ECHO_BYTES].decode("utf-8", "replace")
    lines = text.splitlines()[:-1] if len(data) > MAX_ECHO_BYTES else text.splitlines()
    for line in lines:
        log.show(RECORDS_PREFIX + line, sys.stdout)
    if len(data) > MAX_ECHO_BYTES:
        log.show(f"{RECORDS_PREFIX}(cut at {MAX_ECHO_BYTES >> 20} MiB: the rest is in {path})",
                 sys.stdout)


def run_gate(settings: Settings, log: Log, env: dict, when: str) -> dict:
    """The quality gate under its hard bound, and what its records show."""
    records = os.path.join(settings.log_dir, records_name("gate", when))
    started = time.monotonic()
    log(f"gate: {QUALIFY} gate --records {records} (WARMUP_BASE_URL "
        f"{settings.target.display}) (hard bound {settings.gate_hard_s:g} s)")
    status = Steps.run(["timeout", f"--kill-after={KILL_AFTER_S}s", f"{settings.gate_hard_s:f}",
                        sys.executable, "-I", "-S", QUALIFY, "gate", "--records", records],
                       env)
    gate = judged(records, status)
    if settings.supervise:
        echo_records(log, records)
    if not (gate["judged"] and gate["judged"].summary):
        publish_start_outcome(settings, "gate", status)
    gate.update(figures=gate_said(gate["judged"]), records=records, status=status)
    log(f"gate ended: exit {status}, verdict {gate['verdict']}, "
        f"{int(time.monotonic() - started)} s")
    return gate


def run_stamp(folder: str) -> str:
    """WHEN for this run's warmup-WHEN.jsonl and gate-WHEN.jsonl: the UTC second, with a
    _N after it (sorted after the plain name) when another run of that second has its
    files there. The warm-up's file is made here, exclusively (empty), so that two runs
    never share one (a file holds one run)."""
    second = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        when = f"{second}_{n}" if n else second
        if os.path.lexists(os.path.join(folder, records_name("gate", when))):
            continue
        try:
            os.close(os.open(os.path.join(folder, records_name("warmup", when)),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
            return when
        except FileExistsError:
            continue
    raise OSError(0, f"no free records name for {second}", folder)


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
                    name not in current and regular(path):
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


def gate_said(found: dict | None) -> str:
    """A gate's identifiers and worst CER as the OK and WARN lines show them."""
    from core.records import show
    summary = found and found.summary
    exact = (summary and summary.identifiers_exact) or {}
    alone, batched = show(exact.get("alone"), 20), show(exact.get("batched"), 20)
    cer = summary and summary.worst_cer
    shapes = f"{alone} alone and batched" if alone == batched else \
        f"{alone} alone, {batched} batched"
    return f"identifiers {shapes}, worst CER " + (
        f"{cer:.3f}" if cer is not None else "n/a")


def ready_file_writer(settings: Settings, log: Log, server_pid: int, chunk_from: str):
    """How a start or re-warm without --supervise vouches (it holds the log folder's lock: the
    one creator): the ready file from the verdicts of the warm-up's (and the gate's)
    records, naming the server process that must hold the port and where the chunk came
    from; why not, or None."""
    def vouch(run: dict, gate_records: str | None) -> str | None:
        if not settings.ready_file:
            return None
        from tools.readback import ready_from_records
        why = ready_from_records(settings.ready_file, run["records"],
                                 gate_records=gate_records, server_pgid=server_pid,
                                 required=settings.required(), chunk_from=chunk_from)
        if why is None:
            log(f"ready file {settings.ready_file} written: it names the server it vouches "
                f"for; `qualify.py ready --ready-file {settings.ready_file}` says while it "
                f"stays true")
        return why
    return vouch


def warm_up_and_report(settings: Settings, server: LaunchedServer, log: Log, env: dict,
                       when: str, vouch, chunk_from: str = "") -> dict:
    """Warm-up (and gate), then OK or WARN from the warm-up's one verdict; the server must
    still run after them. OK only once `vouch(run, gate records)` said None (the ready
    file written, the state warm); its reason is a WARN. A WARN names only files that
    exist; both say the chunk B1 was sized past (`chunk_from`: where start.sh found it,
    '' when it did not). The warm-up's run, with `passed` True for OK."""
    run = run_warmup(settings, server, log, env, when)
    notes = f"{run['compiles']} compile lines during warm-up"
    if run["plan"] is not None:
        notes += f"; {chunk_said(run['plan'], chunk_from, '--max-num-batched-tokens')}"
    notes += "".join(f"; {note}" for note in run["notes"])
    if run["cache_check"] == "not_made":
        notes += f"; B1 {NOT_REPORTED}"
    inspect = f"inspect before releasing HOLD ({notes})"
    custom = f"; custom plan: {run['differences']}" if run["differences"] != "-" else ""
    if run["status"] == 0 and run["verdict"] == "custom":
        log(f"WARN: warm-up passed a custom plan, not the contract's: {run['differences']}; "
            f"no ready file; {records_line(run['records'])} — {inspect}")
        return dict(run, passed=False)
    warm = run["status"] == 0 and run["verdict"] == "pass"
    gate = run_gate(settings, log, env, when) if warm and settings.gate else None
    if not server.alive():
        raise server.gone("during the warm-up and gate" if gate else "during the warm-up")
    if not warm:
        log(f"WARN: warm-up failed (exit {run['status']}, verdict {run['verdict']}{custom}); "
            f"{records_line(run['records'])} — {inspect}")
        return dict(run, passed=False)
    records = f"records: {run['records']}"
    if gate:
        records += f" and {gate['records']}" if os.path.isfile(gate["records"]) else \
            " (the gate wrote no records)"
        if gate["status"] != 0 or gate["verdict"] != "pass":
            log(f"WARN: warm-up passed, gate failed (exit {gate['status']}, verdict "
                f"{gate['verdict']}; {gate['figures']}); {records} — {inspect}")
            return dict(run, passed=False)
    why = vouch(run, gate and gate["records"])
    if why:
        log(f"WARN: warm-up passed, but the ready file was not written: {why}; {records} "
            f"— {inspect}")
        return dict(run, passed=False)
    what = f": {run['counts']}" if run["counts"] else ""
    what += f" ({run['given']})" if run["given"] else ""
    passed = f"gate passed ({gate['figures']})" if gate else ""
    log(f"OK: warm-up passed{what}{', ' + passed if passed else ''}; {records} — read "
        f"them before releasing HOLD ({notes})")
    return dict(run, passed=True)


def server_chunk_said(log: Log, asked: str | None, server_chunk: str | None,
                      where: str) -> None:
    """Say where B1's chunk comes from: the server's own wins over WARMUP_CHUNK_TOKENS (a
    smaller one would let B1 run as one unchunked prefill and still pass)."""
    if not server_chunk or server_chunk == asked:
        return
    replaced = f"; WARMUP_CHUNK_TOKENS '{asked}' is not used" if asked else ""
    log(f"prefill chunk {server_chunk} tokens (from {where}): B1 is sized past it where the "
        f"context allows{replaced}")


def start_usage_error(problem: str) -> int:
    print(f"start.sh: {problem}\nstart.sh: see start.sh --help", file=sys.stderr)
    return 2


def start(settings: Settings, log: Log, owner=None) -> int:
    """Launch, guard, warm up: the exit status. The textfile says 'starting' first (no
    older success stays standing), and how the start ended when no warm-up says it; a
    server it launched and stopped leaves no ready file. With --supervise the warm-up and
    everything after are the readiness owner's: `owner(settings, server, log, env,
    chunk_from)` (start.owner.Owner) and its run()."""
    server = LaunchedServer(settings, log)
    env = settings.server_env()
    ended = None
    interrupt_while_starting()
    try:
        server.lock = claim_log_dir(settings.log_dir, log)    # the one creator, to the end
        publish_starting(settings, log)
        refuse_a_running_server(settings, log)
        server_chunk_said(log, settings.env.get("WARMUP_CHUNK_TOKENS"),
                          env.get("WARMUP_CHUNK_TOKENS"),
                          "the server command's --max-num-batched-tokens")
        problem = ready_port_problem(settings)      # refused before any file is touched
        if not problem and settings.ready_file:     # a start it launches vouches anew
            removed, why = remove_regular(settings.ready_file)
            problem = f"--ready-file '{settings.ready_file}' cannot be removed ({why})" if \
                removed is False else ""
        if problem:
            ended = 2, "usage"
            return start_usage_error(problem)
        supervised = launch_and_warm(settings, server, log, env)
        if supervised is not None:
            return owner(settings, server, log, env, *supervised).run()
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
    except FolderHeld:
        raise
    except Exit as exc:
        ended = exc.code, "not_started"
        raise
    finally:
        if ended is not None:
            publish_start_outcome(settings, "warmup", ended[0], ended[1], log)
        if ended is not None and server.pid and settings.ready_file:
            remove_regular(settings.ready_file)
    if settings.textfile and settings.warmup and os.path.isfile(settings.textfile):
        log(f"results published for monitoring in {settings.textfile}")
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    log(f"exit 0: server process group {server.pid} keeps running")
    return 0


def rewarm(settings: Settings, log: Log, ask_owner=None) -> int:
    """start.sh --rewarm: under --supervise asked of the readiness owner (`ask_owner`:
    start.owner.ask_owner, over LOG_DIR/owner.sock), which runs it; else the server
    LOG_DIR's server.pid names, at the address its server.url says, warmed again here as
    a start warms it (its port held by that process, the chunk from server.chunk when it
    names that process): the ready file taken away first, written anew only from a pass;
    0 only for a pass."""
    from core.transport import UsageError, parse_base_url
    interrupt_while_starting()
    try:
        asked = ask_owner and ask_owner(settings.log_dir, rewarm_bound_s(
            settings.env.get("WARMUP_HARD_S", ""), settings.gate and settings.gate_hard_s),
                                        lambda line: log.show(line, sys.stdout))
    except Interrupted as signalled:
        log.error(f"start.sh --rewarm interrupted by {signalled.name}: the owner's re-warm "
                  f"goes on (start.log says how it ends)")
        return signalled.code
    if asked is not None:
        return asked
    read = {name: read_small(os.path.join(settings.log_dir, name))
            for name in ("server.pid", "server.url", "server.chunk")}
    pid = number_in(read["server.pid"], whole(2, (1 << 22) - 1)) or 0
    try:
        settings.target = parse_base_url(read["server.url"], "server.url")
    except UsageError:
        pid = 0
    if not pid or not process_alive(pid):
        log.error(f"no server to warm again in {settings.log_dir}: server.pid and server.url "
                  f"must name the live server an earlier start.sh launched there")
        return 1
    settings.base_url = settings.target.display
    try:
        claim_log_dir(settings.log_dir, log, f"a start or another re-warm of the server in "
                      f"{settings.log_dir} runs: one at a time; nothing was sent and nothing "
                      f"changed")
    except FolderHeld:
        return 1
    log(f"re-warm of server process group {pid} at {settings.target.display} (--rewarm)")
    publish_starting(settings, log)
    if settings.ready_file and remove_regular(settings.ready_file)[0]:
        log(f"ready file {settings.ready_file} removed: not ready until this re-warm passes")
    server = AttachedServer(settings, log, pid)
    env = settings.server_env()
    chunk, _, owner = read["server.chunk"].partition(" ")
    kept = number_in(chunk, whole(1, 1 << 30)) is not None and owner == str(pid)
    if kept:
        env["WARMUP_CHUNK_TOKENS"] = chunk
    when = run_stamp(settings.log_dir)
    try:
        refuse_a_foreign_answer(settings, server, log)
        chunk_from = "server.chunk" if kept else ""
        run = warm_up_and_report(settings, server, log, env, when,
                                 ready_file_writer(settings, log, pid, chunk_from), chunk_from)
        return 0 if run["passed"] else 1
    except Interrupted as signalled:
        log.error(f"re-warm interrupted by {signalled.name}: the server keeps running")
        Steps.stop()
        publish_start_outcome(settings, "warmup", signalled.code, "killed", log)
        return signalled.code
    except Exit as exc:
        publish_start_outcome(settings, "warmup", exc.code, "not_started", log)
        return exc.code
    finally:
        prune_records(settings.log_dir, settings.keep,
                      (records_name("warmup", when), records_name("gate", when)))


def rewarm_bound_s(hard: str, gate_hard_s: float | None) -> float:
    """How long start.sh --rewarm waits for the owner: a warm-up (under WARMUP_HARD_S,
    `hard`) and a gate (when one runs) under their bounds, one more that may be running,
    and a margin."""
    hard_s = number_in(hard, seconds(86400)) or 95.0
    return 2 * (hard_s + KILL_AFTER_S) + (gate_hard_s + KILL_AFTER_S if gate_hard_s else 0) + 30


class FolderHeld(Exit):
    """Another start or re-warm holds the log folder: nothing launched, nothing published
    (the textfile is the holder's)."""


def claim_log_dir(folder: str, log: Log, held: str = "") -> int | None:
    """An exclusive flock on the log folder's start.lock (opened to write: NFS's flock needs
    it), taken before anything is launched and kept until the process ends: one start or
    re-warm in a folder at a time, the one creator of the ready file without --supervise.
    FolderHeld when another holds it (`held`: what the refusal says, a start's by default);
    a lock the filesystem cannot take is said, and the start goes on without one."""
    import fcntl
    fd = -1
    try:
        fd = os.open(os.path.join(folder, "start.lock"), os.O_WRONLY | os.O_CREAT |
                     os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        if isinstance(exc, BlockingIOError):
            log.error(held or f"another start.sh or re-warm runs in {folder} (it holds "
                              f"start.lock): one at a time; nothing was launched")
            raise FolderHeld(1) from None
        log(f"WARN: cannot lock {folder}/start.lock ({os_problem(exc)}): two starts in this "
            f"folder at once are not kept apart", sys.stderr)
        return None


def publish_starting(settings: Settings, log: Log) -> None:
    """Before a start or a re-warm: the textfile says 'starting' (the gate's too, with
    --gate), so no older success stays standing."""
    publish_start_outcome(settings, "warmup", 0, "starting", log)
    if settings.gate:
        publish_start_outcome(settings, "gate", 0, "starting", log)


def launch_and_warm(settings: Settings, server: LaunchedServer, log: Log, env: dict):
    """Launch the server, wait for /health within the guard, warm it up (and gate it);
    with --supervise, what the readiness owner needs to: (where the chunk came from,),
    else None."""
    server.start()
    if settings.supervise:
        shutdown_warned(settings.command, settings.stop_grace_s, log)
    env["WARMUP_HEALTHY_AT"] = f"{wait_ready(settings, server, log):.3f}"
    chunk = logged_chunk(server.logged_since(server.log_offset))
    if chunk and not settings.command_chunk():
        server_chunk_said(log, env.get("WARMUP_CHUNK_TOKENS"), chunk, "server.log")
        env["WARMUP_CHUNK_TOKENS"] = chunk       # B1 must be longer than the chunk
    chunk_file = os.path.join(settings.log_dir, "server.chunk")
    remove_regular(chunk_file)                  # never an earlier server's
    if chunk or settings.command_chunk():       # for a re-warm (--rewarm) of this server
        with open_own(chunk_file, "w") as handle:
            handle.write(f"{env['WARMUP_CHUNK_TOKENS']} {server.pid}\n")
    chunk_from = "the command" if settings.command_chunk() else "server.log" if chunk else ""
    if not settings.warmup:
        log(f"warm-up skipped (--no-warmup); server process group {server.pid} is up")
        publish_start_outcome(settings, "warmup", 0, "not_warmed", log)
        return None
    if settings.supervise:
        return (chunk_from,)
    when = run_stamp(settings.log_dir)           # warmup-WHEN, gate-WHEN
    try:
        warm_up_and_report(settings, server, log, env, when,
                           ready_file_writer(settings, log, server.pid, chunk_from),
                           chunk_from)
    finally:
        removed = prune_records(settings.log_dir, settings.keep,
                                (records_name("warmup", when), records_name("gate", when)))
        if removed:
            log(f"removed {len(removed)} records file(s) older than the last "
                f"{settings.keep} runs (--keep): {', '.join(removed)}")
    return None


def shutdown_warned(command: list[str], grace_s: int, log: Log) -> None:
    """WARN at launch when the server command gives vLLM no --shutdown-timeout (or 0, its
    default): a stop then fails the requests in flight."""
    from start.server_command import flag_value, seconds_of
    given = flag_value("--shutdown-timeout", command)
    if not seconds_of(given):
        log("WARN: the server command gives " + (f"--shutdown-timeout {given}" if given else
                                                  "no --shutdown-timeout") +
            f": vLLM's default, 0, fails the requests in flight at a stop (500s, or "
            f"connections held until the KILL); give it one below START_STOP_GRACE_S "
            f"({grace_s} s)")
