#!/usr/bin/env python3
"""Benchmark the warm-up helper's own cost, side by side with the alternatives, in one run.

    python3 bench/run.py [--quick] [--results PATH]

The helper runs as in production: through offload/launch/warmup_serve.sh (bash and
coreutils `timeout` around `python3 -I -S`, the helper imported with cached bytecode).
Its baselines run through a copy of that wrapper whose python line runs the baseline
instead, so the shell's cost is on both sides of every ratio. Everything talks to
127.0.0.1 only, against the fake server from the tests (fixed latency per completion);
every server and process started here is stopped here. Prints the machine and a table
of ratios with their targets. Not a test: CI does not run it. Bounded to 3 minutes.

The table goes to stdout and to bench/RESULTS.md (--results), with the machine and the
date: the figures live there, written by this program, never by hand.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, "offload", "launch")
TESTS = os.path.join(LAUNCH, "tests")
WARMUP = os.path.join(LAUNCH, "warmup.py")
QUALIFY = os.path.join(LAUNCH, "qualify.py")
WRAPPER = os.path.join(LAUNCH, "warmup_serve.sh")
sys.path.insert(0, TESTS)
sys.path.insert(0, LAUNCH)

from fake_vllm import FakeConfig, FakeServer  # noqa: E402
from support import SilentServer  # noqa: E402
import core.prometheus as prometheus  # noqa: E402
import core.transport as transport  # noqa: E402
import core.kinds as kinds  # noqa: E402
import core.vllm_metrics as vllm_metrics  # noqa: E402

# The real interpreter: `python3` may be a pyenv shim (a bash script) whose own start-up
# would be measured otherwise. The wrapper is told to use it too (WARMUP_PYTHON).
PYTHON = sys.executable
BUDGET_S = 180
LATENCY_S = 1.0      # about 32 tokens at 30 ms a token on a large model
ENGINES = 4          # the data-parallel size of the engines row
POLL_S = 0.002       # how often a process tree's peak RSS is read in its first half second
POLL_LATER_S = 0.02  # and later: VmHWM only grows, and the fake server shares this process
HOLD_S = 0.2         # a baseline stays this long, so its peak can be read by polling
START_TARGET = 1.4
RSS_TARGET = 1.6
ENGINES_TARGET = 1.2
# What any HTTP client over sockets that reads JSON imports: the floor under a helper's
# start-up, whatever else it drops.
FLOOR = "json, socket, threading"
READY_TARGET = 1.5
RESULTS = os.path.join(REPO, "bench", "RESULTS.md")
# The wrapper's python arguments; the copy replaces them with the baseline's, which first
# removes the file the wrapper hands it, as the helper does (the wrapper's proof that its
# interpreter ran: a baseline that left it would be refused as no Python at all).
WRAPPER_PY_ARGS = '-I -S -c "${RUN_HELPER}"'
COPY_PY_ARGS = '${BENCH_FLAGS} -c "import os, sys; os.unlink(sys.argv[1])\n${BENCH_CODE}"'
# When the wrapper's python line is not found: the same shell work, written out.
FALLBACK_WRAPPER = """#!/usr/bin/env bash
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE
hard="${WARMUP_HARD_S:-95}"
[[ "${hard}" =~ ^[0-9]+([.][0-9]+)?$ ]]
command -v timeout >/dev/null
python="${WARMUP_PYTHON:-python3}"
command -v "${python}" >/dev/null
status=0
trap 'true' TERM INT
timeout --kill-after=5s "${hard}" "${python}" ${BENCH_FLAGS} -c "${BENCH_CODE}" "${HERE}" "$@" &
wait "$!" || status=$?
trap - TERM INT
exit "${status}"
"""


class BenchError(Exception):
    """Something the bench needs did not work: one line for the operator, exit 1."""


# ---------------------------------------------------------------------------
# Processes: wall time, and the peak RSS of a whole process tree.
# ---------------------------------------------------------------------------

def base_env(python: str = PYTHON) -> dict:
    """The environment of every run: the wrapper uses the same interpreter as the baseline."""
    return dict(os.environ, WARMUP_PYTHON=python)


@dataclass
class Run:
    """One child process's measures, and the last line it wrote on stderr."""
    wall: float            # seconds, start to exit
    code: int              # exit status
    cpu: float             # user + system seconds of the child and its reaped descendants
    peak_kib: int          # the tree's peak RSS (0 unless asked for)
    error: str             # the last line of its stderr, for a failure's one-line message


def run_timed(command: list[str], env: dict | None = None) -> Run:
    """One child process, waited for without polling. The CPU time counts the child and
    every descendant it waited for (bash, timeout, python): unlike the wall time, it
    does not grow when other work loads the machine."""
    return _run(command, env, peak=False)


def run_peak(command: list[str], env: dict | None = None) -> Run:
    """One child process, and the peak RSS of it and all its descendants.

    The peak is the largest VmHWM from /proc of any process in the tree (bash, timeout,
    python), polled until the child exits: each is the high-water mark of the address
    space made at exec. (ru_maxrss would also count the RSS inherited from this large
    parent between fork and exec.) A process shorter than a few polls may be missed:
    baselines hold for HOLD_S.
    """
    return _run(command, env, peak=True)


def _run(command: list[str], env: dict | None, peak: bool) -> Run:
    """Start, optionally poll peaks from a thread (the wall time stays exact), wait."""
    peaks: dict[int, int] = {}
    finished = threading.Event()
    with tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=stderr, env=env)

        def poll() -> None:
            while not finished.is_set():
                for pid in process_tree(proc.pid):
                    peaks[pid] = max(peaks.get(pid, 0), vm_hwm_kib(pid))
                finished.wait(POLL_S if time.perf_counter() - started < 0.5 else POLL_LATER_S)

        poller = threading.Thread(target=poll, daemon=True)
        if peak:
            poller.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            finished.set()
            if peak:
                poller.join()
            stop_process(proc)
        stderr.seek(0)
        lines = stderr.read().decode("utf-8", "replace").strip().splitlines()
    return Run(wall, proc.returncode, usage.ru_utime + usage.ru_stime,
               max(peaks.values(), default=0), lines[-1][:200] if lines else "")


def stop_process(proc: subprocess.Popen) -> None:
    """End a child still running (the bench was stopped): TERM, which the wrapper forwards
    to the helper, then KILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def children_listed() -> bool:
    """Whether this kernel lists a process's children in /proc (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def process_tree(root: int) -> list[int]:
    """The root and its descendants, from /proc/PID/task/PID/children."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as listing:
                todo += [int(child) for child in listing.read().split()]
        except (OSError, ValueError):
            pass
    return pids


def vm_hwm_kib(pid: int) -> int:
    """A process's peak resident set (VmHWM) in KiB; 0 when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def interleaved_medians(commands: dict[str, tuple[list[str], dict]], runs: int) -> dict:
    """Median wall time of each command, run in turns so that load from other work on
    the machine falls on all of them alike. One untimed run each first: it warms the
    page cache and writes the helper's bytecode cache after an edit."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(runs + 1):
        for name, (command, env) in commands.items():
            done = run_timed(command, env)
            if done.code != 0:
                raise BenchError(f"'{name}' exited {done.code}: {done.error or 'no message'}")
            if round_:
                times[name].append(done.wall)
    return {name: statistics.median(walls) for name, walls in times.items()}


# ---------------------------------------------------------------------------
# The wrapper, and a copy of it that runs a baseline in the helper's place.
# ---------------------------------------------------------------------------

def write_wrapper_copy(folder: str) -> tuple[str, str]:
    """(path, how it was made) of a wrapper that runs `$BENCH_FLAGS -c "$BENCH_CODE"`
    where the real one runs the helper: the same bash, timeout and traps around it."""
    with open(WRAPPER, encoding="utf-8") as handle:
        text = handle.read()
    path = os.path.join(folder, "wrapped.sh")
    if text.count(WRAPPER_PY_ARGS) == 1:
        text, how = text.replace(WRAPPER_PY_ARGS, COPY_PY_ARGS), "a copy of warmup_serve.sh"
    else:
        text, how = FALLBACK_WRAPPER, ("a bash script with the wrapper's timeout line "
                                       "(its python line has changed; update the bench)")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path, how


class Shapes:
    """The commands the bench times: the wrapper, its copy around baselines, bare python."""

    def __init__(self, copy: str):
        self.copy = copy

    def wrapper(self, *args: str) -> tuple[list[str], dict]:
        """The production path: bash warmup_serve.sh with these options."""
        return ["bash", WRAPPER, *args], base_env()

    def wrapped(self, code: str, flags: str = "-I -S",
                python: str = PYTHON) -> tuple[list[str], dict]:
        """`python flags -c code` in the wrapper's place, with the wrapper's arguments."""
        return (["bash", self.copy, "--dry-run"],
                dict(base_env(python), BENCH_FLAGS=flags, BENCH_CODE=code))

    @staticmethod
    def bare(*args: str) -> tuple[list[str], dict]:
        """The interpreter alone, no shell around it."""
        return [PYTHON, *args], base_env()


def import_helper(then: str = "") -> str:
    """Code that imports the helper as the wrapper does (cached bytecode), then `then`."""
    return f"import sys; sys.path.insert(0, {LAUNCH!r}); import warmup{then}"


def held(code: str) -> str:
    """Code, then a pause long enough for its peak RSS to be read (time is built in)."""
    return f"{code}; import time; time.sleep({HOLD_S})"


def helper_modules() -> list[str]:
    """The standard modules warmup.py and the layers it loads import at their top level
    (also inside a top-level try; not __future__, not the folder's own modules)."""
    local = {name[:-3] for name in os.listdir(LAUNCH) if name.endswith(".py")}
    for package in ("core", "tools", "start"):        # the folder's packages: dotted names
        local |= {f"{package}.{name[:-3]}" for name in os.listdir(os.path.join(LAUNCH, package))
                  if name.endswith(".py") and name != "__init__.py"}
    names, seen, todo = set(), set(), ["warmup"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        with open(os.path.join(LAUNCH, *module.split(".")) + ".py", encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        nodes = list(tree.body)
        for node in tree.body:
            if isinstance(node, ast.Try):
                nodes += node.body
        for node in nodes:
            found = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found = [node.module]
            for name in found:
                if name in local:
                    todo.append(name)
                else:
                    names.add(name)
    return sorted(names)


def bytecode_cached() -> bool:
    """Whether the helper's cached bytecode exists (the wrapper could write __pycache__)."""
    import importlib.util
    return os.path.exists(importlib.util.cache_from_source(WARMUP))


# ---------------------------------------------------------------------------
# Start-up.
# ---------------------------------------------------------------------------

def bench_ready(runs: int, tmp: str) -> dict:
    """What a readiness probe costs as the Kubernetes recipe runs it: `python3 qualify.py
    ready` against a warmed fake in a process of its own, as a server is (one /health, one
    /metrics), against `python3 -c pass` (site loaded, as both run), bytecode cached;
    median wall times and the peak RSS."""
    import tools.readback as readback
    import socket
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    fake = subprocess.Popen([PYTHON, os.path.join(LAUNCH, "tests", "fake_vllm.py"), "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        records = os.path.join(tmp, "ready-records.jsonl")
        ready_file = os.path.join(tmp, "ready.json")
        for _ in range(100):              # until the fake answers (10 s at most)
            done = run_timed([PYTHON, QUALIFY, "health", "--base-url", url])
            if done.code == 0:
                break
            time.sleep(0.1)
        done = run_timed([PYTHON, WARMUP, "--base-url", url, "--records", records])
        if done.code != 0:
            raise BenchError(f"the warm-up before the ready bench failed: {done.error}")
        why = readback.ready_from_records(ready_file, records)
        if why is not None:
            raise BenchError(f"the ready file was not written: {why}")
        env = {k: v for k, v in base_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
        probe = [PYTHON, QUALIFY, "ready", "--ready-file", ready_file]
        commands = {"ready": (probe, env), "pass": ([PYTHON, "-c", "pass"], env)}
        medians = interleaved_medians(commands, runs)
        peak = run_peak(probe, env)
        if peak.code != 0:
            raise BenchError(f"qualify.py ready said not ready: {peak.error}")
        probes = {"ready -I -S": [PYTHON, "-I", "-S", QUALIFY, "ready", "--ready-file",
                                  ready_file],
                  "health": [PYTHON, QUALIFY, "health", "--base-url", url]}
        quiet = probe_costs(probes, env, url, runs)
        with cpu_hogs(2):
            loaded = probe_costs(probes, env, url, runs)
        return dict(medians, rss_kib=peak.peak_kib, quiet=quiet, loaded=loaded)
    finally:
        fake.terminate()
        fake.wait(10)


def probe_costs(probes: dict, env: dict, url: str, runs: int) -> dict:
    """Each exec probe's median (wall, CPU) as the kubelet starts it in the container, and
    the kubelet's own httpGet of /health (no process in the container: its CPU is the
    kubelet's): median wall time."""
    found = {}
    for name, command in probes.items():
        done = [run_timed(command, env) for _ in range(runs)]
        if any(d.code != 0 for d in done):
            raise BenchError(f"the {name} probe failed: {done[-1].error}")
        found[name] = (statistics.median(d.wall for d in done),
                       statistics.median(d.cpu for d in done))
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        with direct.open(f"{url}/health", timeout=10) as answer:
            answer.read()
        walls.append(time.perf_counter() - started)
    found["httpGet"] = (statistics.median(walls), 0.0)
    return found


@contextlib.contextmanager
def cpu_hogs(count: int):
    """`count` busy Python loops for the duration, stopped after."""
    hogs = [subprocess.Popen([PYTHON, "-c", "while 1: pass"]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for hog in hogs:
            stop_process(hog)


def free_local_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_owner(runs: int, tmp: str) -> dict:
    """The readiness owner's answer as the kubelet's httpGet asks it: start.sh --supervise
    against a fake, GET /ready `runs` times quiet and under two CPU hogs; (median, max)
    wall of each, and what it answered."""
    port, ready_port = free_local_port(), free_local_port()
    logs = os.path.join(tmp, "owner-logs")
    proc = subprocess.Popen(
        ["bash", os.path.join(REPO, "start.sh"), "--supervise", "--log-dir", logs, "--",
         PYTHON, os.path.join(LAUNCH, "tests", "fake_vllm.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=dict(os.environ, START_READY_PORT=str(ready_port), START_POLL_S="0.2"))
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"http://127.0.0.1:{ready_port}/ready"

    def answers() -> tuple[float, float, float]:
        """GET /ready as a light client does (one request a connection, as the kubelet's
        httpGet): median, 99th percentile and max wall."""
        import socket
        walls = []
        for _ in range(runs):
            started = time.perf_counter()
            with socket.create_connection(("127.0.0.1", ready_port), timeout=10) as sock:
                sock.sendall(b"GET /ready HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                while sock.recv(4096):
                    pass
            walls.append(time.perf_counter() - started)
        walls.sort()
        return statistics.median(walls), walls[int(len(walls) * 0.99)], walls[-1]
    try:
        for _ in range(600):              # until warm (60 s at most)
            try:
                with direct.open(url, timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise BenchError("the owner never answered GET /ready 200")
        quiet = answers()
        with cpu_hogs(2):
            loaded = answers()
        return {"quiet": quiet, "loaded": loaded}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def owner_row(owner: dict, ready: dict) -> str:
    """The owner's answer (the manifest's readiness probe now) beside the exec probe."""
    (q_med, q_99, q_max), (l_med, l_99, l_max) = owner["quiet"], owner["loaded"]
    exec_wall, exec_cpu = ready["loaded"]["ready -I -S"]
    return row("readiness as the manifest runs it now: the owner's GET /ready (start.sh "
               "--supervise, from memory), median / 99th percentile / max, quiet and under "
               "two CPU hogs, vs the exec probe `python3 -I -S qualify.py ready` under the "
               "hogs. The max under hogs is the scheduler's: four runnable processes (the "
               "hogs, this client, the owner) on two cores",
               f"quiet {fmt_ms(q_med)} / {fmt_ms(q_99)} / {fmt_ms(q_max)}; hogs "
               f"{fmt_ms(l_med)} / {fmt_ms(l_99)} / {fmt_ms(l_max)}; exec probe "
               f"{fmt_ms(exec_wall)}, CPU {fmt_ms(exec_cpu)}",
               f"{exec_wall / l_med:.0f}× faster" if l_med else "-",
               "≤ 5 ms (median under hogs)", l_med <= 0.005)


def probe_row(ready: dict) -> str:
    """The probes side by side, quiet and under two CPU hogs."""
    def said(name: str) -> str:
        (q_wall, q_cpu), (l_wall, _) = ready["quiet"][name], ready["loaded"][name]
        cpu = f", CPU {fmt_ms(q_cpu)}" if q_cpu else ""
        return f"{name} {fmt_ms(q_wall)}{cpu} / {fmt_ms(l_wall)}"
    worst = ready["loaded"]["ready -I -S"][0]
    return row("probes as the manifest runs them, wall quiet / under two CPU hogs: exec "
               "`python3 -I -S qualify.py ready` (readiness), exec `python3 qualify.py "
               "health` (the old startup and liveness), the kubelet's httpGet /health (the "
               "new)", "; ".join(said(n) for n in ("ready -I -S", "health", "httpGet")),
               "-", "readiness ≤ its 5 s timeout under hogs", worst <= 5.0)


def bench_sizes(tmp: str) -> dict[str, int]:
    """Bytes of records a warm-up writes: the contract's, and with --paths all."""
    sizes = {}
    server = FakeServer(FakeConfig()).start()
    try:
        for name, extra in (("default", []), ("--paths all", ["--paths", "all"])):
            records = os.path.join(tmp, f"size-{len(sizes)}.jsonl")
            done = run_timed([PYTHON, WARMUP, "--base-url", server.url, "--records", records,
                              *extra])
            if done.code != 0:
                raise BenchError(f"the {name} warm-up for the size row failed: {done.error}")
            sizes[name] = os.path.getsize(records)
    finally:
        server.stop()
    return sizes


def size_rows(sizes: dict[str, int]) -> list[str]:
    return [row(f"records: a {name} warm-up against the fake", f"{size / 1024:.1f} KiB",
                "-", "-", None) for name, size in sizes.items()]


def bench_startup(shapes: Shapes, runs: int) -> dict:
    """Median wall times of the wrapper's --dry-run and --help and of every baseline and
    breakdown step, all interleaved."""
    modules = helper_modules()
    commands = {
        "bare -I -S pass": shapes.bare("-I", "-S", "-c", "pass"),
        "bare pass": shapes.bare("-c", "pass"),
        "wrapped -I -S pass": shapes.wrapped("pass"),
        "wrapped pass": shapes.wrapped("pass", flags=""),
        "wrapped imports": shapes.wrapped("import " + ", ".join(modules)),
        "wrapped module": shapes.wrapped(import_helper()),
        "wrapper --dry-run": shapes.wrapper("--dry-run"),
        "wrapper --help": shapes.wrapper("--help"),
        "script --dry-run": shapes.bare(WARMUP, "--dry-run"),
    }
    medians = interleaved_medians(commands, runs)
    medians["modules"] = modules
    return medians


def bench_module_costs(shapes: Shapes, modules: list[str], runs: int) -> dict[str, float]:
    """Each standard module the helper imports, alone, over a bare `python3 -I -S -c pass`
    (they overlap: dataclasses brings re, for one)."""
    commands = {"pass": shapes.bare("-I", "-S", "-c", "pass"),
                FLOOR: shapes.bare("-I", "-S", "-c", f"import {FLOOR}")}
    commands.update({m: shapes.bare("-I", "-S", "-c", f"import {m}") for m in modules})
    medians = interleaved_medians(commands, runs)
    return {m: medians[m] - medians["pass"] for m in [*modules, FLOOR]}


def startup_parts(m: dict) -> list[tuple[str, float]]:
    """The wrapper's --dry-run, step by step; the steps add up to it exactly (a step may
    come out below zero in noise: shown as 'within noise')."""
    return [("bash + timeout", m["wrapped -I -S pass"] - m["bare -I -S pass"]),
            ("the interpreter (-I -S)", m["bare -I -S pass"]),
            ("the helper's standard imports", m["wrapped imports"] - m["wrapped -I -S pass"]),
            ("loading warmup.py (cached bytecode, top level)",
             m["wrapped module"] - m["wrapped imports"]),
            ("main(): options, plan, print", m["wrapper --dry-run"] - m["wrapped module"])]


def fmt_part(label: str, seconds: float, unit: str = "ms") -> str:
    """One step of a breakdown; a difference of medians below zero is noise, not a gain."""
    if unit == "ms":
        value = f"{seconds * 1000:.1f} ms" if seconds > 0 else "0 ms (within noise)"
    else:
        value = f"+{seconds / 1024:.1f} MiB" if seconds > 0 else "+0 MiB (within noise)"
    return f"{label} {value}"


def startup_why(m: dict, costs: dict[str, float]) -> str:
    """Why the start-up ratio is what it is: the room the target leaves, what fills it."""
    base, dry = m["wrapped -I -S pass"], m["wrapper --dry-run"]
    room = (START_TARGET - 1) * base
    floor = costs.get(FLOOR, 0.0)
    heavy = sorted((item for item in costs.items() if item[0] != FLOOR),
                   key=lambda item: -item[1])[:4]
    alone = ", ".join(f"{name} {cost * 1000:.1f} ms" for name, cost in heavy if cost > 0)
    return (f"the target leaves {room * 1000:.1f} ms above the wrapped interpreter "
            f"({base * 1000:.1f} ms, bash and timeout included); the helper adds "
            f"{(dry - base) * 1000:.1f} ms, mostly standard imports (alone, overlapping: "
            f"{alone or 'all within noise'}); {FLOOR} alone, which any socket client "
            f"reading JSON needs, take {floor * 1000:.1f} ms")


def startup_rows(m: dict, costs: dict[str, float], copy_how: str) -> list[str]:
    """The start-up rows: targets against the same wrapping, then the honest extras."""
    base = m["wrapped -I -S pass"]
    rows = []
    for flag in ("--dry-run", "--help"):
        took = m[f"wrapper {flag}"]
        rows.append(row(f"start-up: `warmup_serve.sh {flag}` vs wrapped `python3 -I -S -c pass`",
                        f"{fmt_ms(took)} vs {fmt_ms(base)}", f"{took / base:.2f}",
                        f"≤ {START_TARGET}", took / base <= START_TARGET))
    plain = m["wrapped pass"]
    rows.append(row("start-up: the same vs wrapped plain `python3 -c pass` (site loaded)",
                    f"{fmt_ms(m['wrapper --dry-run'])} / {fmt_ms(m['wrapper --help'])} vs "
                    f"{fmt_ms(plain)}: part of the gain is -S skipping site "
                    f"({fmt_ms(m['bare pass'] - m['bare -I -S pass'])} here)",
                    f"{m['wrapper --dry-run'] / plain:.2f} / {m['wrapper --help'] / plain:.2f}",
                    "-", None))
    script = m["script --dry-run"]
    rows.append(row("start-up: `python3 warmup.py --dry-run` (script path, compiled every "
                    "start) vs `python3 -c pass`",
                    f"{fmt_ms(script)} vs {fmt_ms(m['bare pass'])}",
                    f"{script / m['bare pass']:.2f}", "-", None))
    parts = "; ".join(fmt_part(label, value) for label, value in startup_parts(m))
    missed = max(m["wrapper --dry-run"], m["wrapper --help"]) / base > START_TARGET
    why = f". Why the target is missed: {startup_why(m, costs)}" if missed else ""
    rows.append(row("start-up breakdown of `warmup_serve.sh --dry-run`",
                    f"{parts} (baselines wrapped by {copy_how}){why}", "-", "-", None))
    return rows


# ---------------------------------------------------------------------------
# A full warm-up: overhead against the server's busy time, memory, engines.
# ---------------------------------------------------------------------------

def merged_busy(intervals: list[tuple[float, float]]) -> float:
    """Total time covered by the union of the intervals: the server's busy time."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def wrapper_run(shapes: Shapes, url: str, records: str, *extra: str) -> Run:
    """A full warm-up through the wrapper, with its peak RSS."""
    command, env = shapes.wrapper("--base-url", url, "--records", records, *extra)
    return run_peak(command, env)


def bench_overhead(shapes: Shapes, runs: int, tmp: str) -> dict:
    """Whole-process wall time of a full warm-up against the server's own busy time."""
    walls, busies, rss = [], [], []
    for i in range(runs):
        server = FakeServer(FakeConfig(latency_s=LATENCY_S)).start()
        try:
            done = wrapper_run(shapes, server.url, os.path.join(tmp, f"o{i}.jsonl"))
            busy = merged_busy([(e["arrived"], e["done"]) for e in server.state.requests
                                if e["done"] is not None])
        finally:
            server.stop()
        if done.code != 0:
            raise BenchError(f"a warm-up failed in the overhead bench (exit {done.code}): "
                             f"{done.error}")
        walls.append(done.wall)
        busies.append(busy)
        rss.append(done.peak_kib)
    # The median peak: a run that recompiled the helper (edited meanwhile) is not typical.
    return {"wall": statistics.median(walls), "busy": statistics.median(busies),
            "rss_kib": statistics.median(rss)}


def overhead_row(over: dict, start: dict, runs: int) -> str:
    """Wall against busy time, the overhead split into the start to a plan and the rest."""
    base, overhead = start["wrapped -I -S pass"], over["wall"] - over["busy"]
    ratio_net = (over["wall"] - base) / over["busy"]
    to_plan = min(start["wrapper --dry-run"], overhead)
    why = ""
    if ratio_net > 1.02:
        why = (f". Why the target is missed: it allows {fmt_ms(0.02 * over['busy'])} beyond "
               f"the interpreter's start; the helper's own start-up (the breakdown below) "
               f"takes {fmt_ms(to_plan - base)} of it; load average now "
               f"{os.getloadavg()[0]:.1f}")
    return row(f"overhead: full warm-up through the wrapper, wall vs server busy "
               f"(median of {runs})",
               f"{over['wall']:.3f} s vs {over['busy']:.3f} s, overhead {fmt_ms(overhead)}: "
               f"start to a plan (`--dry-run`) {fmt_ms(to_plan)}, the rest "
               f"{fmt_ms(overhead - to_plan)} (model lookup, /tokenize, a /metrics read "
               f"before each wave and after the last, records, exit){why}",
               f"{over['wall'] / over['busy']:.3f} ({ratio_net:.3f} less the wrapped "
               f"interpreter's start)",
               "≤ 1.02 plus the interpreter's start", ratio_net <= 1.02)


def bench_evidence(shapes: Shapes, runs: int, tmp: str) -> dict:
    """Median wall time of a full warm-up with per-wave evidence (the default: gauges read
    every 20 ms during a wave, counters after it) and without (--gauge-interval-ms 0), in
    turns, at the same fixed latency: what the extra reads cost."""
    walls: dict[str, list[float]] = {"with": [], "without": []}
    for i in range(runs):
        for name, extra in (("with", ()), ("without", ("--gauge-interval-ms", "0"))):
            server = FakeServer(FakeConfig(latency_s=LATENCY_S)).start()
            try:
                done = wrapper_run(shapes, server.url, os.path.join(tmp, f"v{name}{i}.jsonl"),
                                   *extra)
                reads = sum(1 for e in server.state.requests if e["path"] == "/metrics")
            finally:
                server.stop()
            if done.code != 0:
                raise BenchError(f"a warm-up failed in the evidence bench (exit {done.code}): "
                                 f"{done.error}")
            walls[name].append(done.wall)
            walls.setdefault(f"reads {name}", []).append(reads)
    return {k: statistics.median(v) for k, v in walls.items()}


def evidence_row(result: dict, runs: int) -> str:
    ratio = result["with"] / result["without"]
    return row(f"per-wave evidence: full warm-up with vs without it (`--gauge-interval-ms 0`), "
               f"median of {runs} each",
               f"{result['with']:.3f} s vs {result['without']:.3f} s; /metrics reads "
               f"{result['reads with']:.0f} vs {result['reads without']:.0f}",
               f"{ratio:.3f}", "≤ 1.03", ratio <= 1.03)


def bench_engines(shapes: Shapes, runs: int, tmp: str) -> dict:
    """Median wall time of a full warm-up of 1 engine and of ENGINES engines (same fixed
    latency), in turns; every request counted on the engine it was sent to. Also the CPU
    time of the helper (its process tree) and of the fake server (this process's
    threads), which shows the work whatever else loads the machine."""
    walls: dict[int, list[float]] = {1: [], ENGINES: []}
    helper_cpu: dict[int, list[float]] = {1: [], ENGINES: []}
    server_cpu: dict[int, list[float]] = {1: [], ENGINES: []}
    skews: list[float] = []
    overflows = 0
    for i in range(runs):
        for engines in (1, ENGINES):
            server = FakeServer(FakeConfig(engines=engines, latency_s=LATENCY_S)).start()
            try:
                command, env = shapes.wrapper("--base-url", server.url, "--records",
                                              os.path.join(tmp, f"e{engines}-{i}.jsonl"))
                cpu_before, dropped = time.process_time(), listen_overflows()
                done = run_timed(command, env)
                server_cpu[engines].append(time.process_time() - cpu_before)
                overflows += listen_overflows() - dropped
                helper_cpu[engines].append(done.cpu)
                served = server.state.completions_by_engine()
                entries = server.state.completions()
            finally:
                server.stop()
            if done.code != 0:
                raise BenchError(f"a {engines}-engine warm-up failed (exit {done.code}): "
                                 f"{done.error}")
            if sorted(served.values()) != [10] * engines:
                raise BenchError(f"a {engines}-engine warm-up served {served} requests per "
                                 f"engine, not 10 each")
            walls[engines].append(done.wall)
            if engines > 1:
                skews += [s for wave, s in wave_skews(entries, across_engines=True).items()
                          if wave.endswith("-B4")]
    return {"one": statistics.median(walls[1]), "many": statistics.median(walls[ENGINES]),
            "helper_cpu": {k: statistics.median(v) for k, v in helper_cpu.items()},
            "server_cpu": {k: statistics.median(v) for k, v in server_cpu.items()},
            "b4_skew_ms": statistics.median(skews) if skews else None,
            "load": os.getloadavg()[0], "overflows": overflows}


def listen_overflows() -> int:
    """Machine-wide count of connections dropped on a full listen queue (TcpExt
    ListenOverflows in /proc/net/netstat); 0 when it cannot be read."""
    try:
        with open("/proc/net/netstat") as netstat:
            lines = [line.split() for line in netstat if line.startswith("TcpExt:")]
        return int(dict(zip(lines[0], lines[1]))["ListenOverflows"])
    except (OSError, IndexError, KeyError, ValueError):
        return 0


def engines_row(result: dict, runs: int) -> str:
    """The N-engine / 1-engine row."""
    ratio = result["many"] / result["one"]
    skew = ("" if result["b4_skew_ms"] is None else
            f"; B4 released {4 * ENGINES} requests within {result['b4_skew_ms']:.2f} ms "
            f"(median)")
    helper, server = result["helper_cpu"], result["server_cpu"]
    cpu = (f"; CPU: helper {helper[ENGINES]:.2f} s vs {helper[1]:.2f} s, fake server "
           f"{server[ENGINES]:.2f} s vs {server[1]:.2f} s")
    why = ""
    if ratio > ENGINES_TARGET:
        why = (f". Why the target is missed: not the work (the CPU above); a wave ends with "
               f"its slowest request, and {4 * ENGINES} at once instead of 4 are more exposed "
               f"to scheduling delays, here on {os.cpu_count()} cores under a load average "
               f"of {result['load']:.1f}; connections dropped on a full listen queue during "
               f"these runs (machine-wide): {result['overflows']}; rerun on an idle machine")
    return row(f"engines: full warm-up, {ENGINES} engines ({10 * ENGINES} requests) vs 1 "
               f"(median of {runs} each)",
               f"{result['many']:.3f} s vs {result['one']:.3f} s{skew}{cpu}{why}",
               f"{ratio:.3f}", f"≤ {ENGINES_TARGET}", ratio <= ENGINES_TARGET)


def bench_memory(shapes: Shapes, runs: int) -> dict:
    """Peak RSS (KiB, median) of each baseline and breakdown step through the same
    wrapping; the short ones are held so that polling sees their peak. Each standard
    module the helper imports, and the FLOOR, alone, once ("alone:" keys)."""
    alone = {f"alone:{m}": (shapes.wrapped(held(f"import {m}")), 1)
             for m in [*helper_modules(), FLOOR]}
    steps = {
        "wrapped -I -S pass": shapes.wrapped(held("pass")),
        "wrapped pass": shapes.wrapped(held("pass"), flags=""),
        "wrapped imports": shapes.wrapped(held("import " + ", ".join(helper_modules()))),
        "wrapped module": shapes.wrapped(held(import_helper())),
        "wrapped dry-run": shapes.wrapped(held(import_helper(
            "; warmup.main(['--dry-run'], prog='warmup_serve.sh')"))),
        "script --dry-run": shapes.bare(WARMUP, "--dry-run"),
    }
    run_timed(*shapes.wrapped(import_helper()))   # rewrites the bytecode after an edit
    peaks = {}
    for name, ((command, env), times) in {**{k: (v, runs) for k, v in steps.items()},
                                          **alone}.items():
        samples = [run_peak(command, env) for _ in range(times)]
        for done in samples:
            if done.code != 0:
                raise BenchError(f"'{name}' failed in the memory bench (exit {done.code}): "
                                 f"{done.error or 'no message'}")
        peaks[name] = statistics.median(done.peak_kib for done in samples)
    return peaks


def memory_why(p: dict) -> str:
    """Why the peak is over the target: the room it leaves, what the imports take."""
    base = p["wrapped -I -S pass"]
    alone = {key[len("alone:"):]: kib - base for key, kib in p.items()
             if key.startswith("alone:") and key != f"alone:{FLOOR}"}
    heavy = sorted(alone.items(), key=lambda item: -item[1])[:4]
    named = ", ".join(f"{name} +{mib(kib)}" for name, kib in heavy if kib > 0)
    return (f"it allows {mib((RSS_TARGET - 1) * base)} above the wrapped interpreter; the "
            f"helper's standard imports alone take {mib(max(p['wrapped imports'] - base, 0))} "
            f"(alone, overlapping: {named or 'all within noise'}); {FLOOR} alone, which any "
            f"socket client reading JSON needs, take "
            f"{mib(max(p[f'alone:{FLOOR}'] - base, 0))}")


def memory_rows(full_kib: int, p: dict) -> list[str]:
    """The memory rows: the target, the honest extra, and where the peak comes from."""
    base = p["wrapped -I -S pass"]
    ratio = full_kib / base
    rows = [row("memory: peak RSS of a full run through the wrapper vs wrapped "
                "`python3 -I -S -c pass`", f"{mib(full_kib)} vs {mib(base)}", f"{ratio:.2f}",
                f"≤ {RSS_TARGET}", ratio <= RSS_TARGET),
            row("memory: the same vs wrapped plain `python3 -c pass` (site loaded)",
                f"{mib(full_kib)} vs {mib(p['wrapped pass'])}",
                f"{full_kib / p['wrapped pass']:.2f}", "-", None)]
    parts = [("the interpreter (-I -S)", base),
             ("the helper's standard imports", p["wrapped imports"] - base),
             ("loading warmup.py", p["wrapped module"] - p["wrapped imports"]),
             ("--dry-run's main()", p["wrapped dry-run"] - p["wrapped module"]),
             ("the run (threads, sockets, responses)", full_kib - p["wrapped dry-run"])]
    text = f"{parts[0][0]} {mib(base)}; " + "; ".join(fmt_part(label, kib, unit="KiB")
                                                      for label, kib in parts[1:])
    if ratio > RSS_TARGET:
        text += f". Why the target is missed: {memory_why(p)}"
    rows.append(row("memory breakdown of a full run (peaks, each step through the wrapper)",
                    text, "-", "-", None))
    rows.append(row("memory: `python3 warmup.py --dry-run` (script path) vs `python3 -I -S -c "
                    "pass`", f"{mib(p['script --dry-run'])} vs {mib(base)}: compiling the "
                    f"script raises the peak", f"{p['script --dry-run'] / base:.2f}", "-", None))
    return rows


# ---------------------------------------------------------------------------
# Release skew: the helper's barrier against naive clients.
# ---------------------------------------------------------------------------

def wave_skews(entries: list[dict], across_engines: bool = False) -> dict[str, float]:
    """Per wave with more than one request, last minus first arrival at the server, in ms;
    across_engines puts a wave's requests on every engine together."""
    waves: dict[str, list[float]] = {}
    for e in entries:
        rid = e["body"]["request_id"]
        if across_engines:
            rid = re.sub(r"-e[0-9]+-", "-", rid)
        waves.setdefault(rid.rsplit("-", 1)[0], []).append(e["arrived"])
    return {wave: (max(t) - min(t)) * 1000 for wave, t in waves.items() if len(t) > 1}


def bench_skew_helper(shapes: Shapes, server: FakeServer, runs: int, tmp: str) -> list[float]:
    """The helper's barrier, through the wrapper."""
    skews = []
    for i in range(runs):
        before = len(server.state.completions())
        command, env = shapes.wrapper("--base-url", server.url, "--records",
                                      os.path.join(tmp, f"s{i}.jsonl"), "--waves", "1,2,3,4")
        done = run_timed(command, env)
        if done.code != 0:
            raise BenchError(f"a warm-up failed in the skew bench (exit {done.code}): "
                             f"{done.error}")
        skews += wave_skews(server.state.completions()[before:]).values()
    return skews


def bench_skew_threads(server: FakeServer, runs: int) -> list[float]:
    """The naive client: one thread per request started one after another, no barrier."""
    target = transport.parse_base_url(server.url)
    clock = transport.Clock.start(60, 10)
    before = len(server.state.completions())
    for r in range(runs):
        for depth in (2, 3, 4):
            def one(index, depth=depth, r=r):
                body = kinds.completion_body("fake-model", f"naive {r} {depth} {index}",
                                               f"naive-{r}-B{depth}-{index}", 32, 0)
                transport.fetch(target, clock, "POST", "/v1/completions", body)
            threads = [threading.Thread(target=one, args=(i,)) for i in range(depth)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    return list(wave_skews(server.state.completions()[before:]).values())


def bench_skew_curl(server: FakeServer, runs: int) -> list[float] | None:
    """A bash burst of `curl ... &`, as an operator might write it."""
    if not shutil.which("curl"):
        return None
    before = len(server.state.completions())
    script = ('for i in $(seq 0 $(($2 - 1))); do curl -s -o /dev/null -H "Content-Type: '
              'application/json" -d "{\\"model\\":\\"fake-model\\",\\"prompt\\":\\"curl $3 $i\\",'
              '\\"max_tokens\\":32,\\"min_tokens\\":32,\\"ignore_eos\\":true,'
              '\\"request_id\\":\\"curl-$3-B$2-$i\\"}" "$1/v1/completions" & done; wait')
    for r in range(runs):
        for depth in (2, 3, 4):
            subprocess.run(["bash", "-c", script, "burst", server.url, str(depth), str(r)],
                           check=True, timeout=30)
    return list(wave_skews(server.state.completions()[before:]).values())


def skew_rows(helper: list[float], naive: list[float], curl: list[float] | None) -> list[str]:
    """The release-skew rows: the helper's target, and how naive clients compare."""
    h_med = max(statistics.median(helper), 1e-6)     # a ratio's divisor
    rows = [row(f"release skew, helper's barrier ({len(helper)} waves)",
                f"median {h_med:.3f} ms, max {max(helper):.3f} ms", "-", "median ≤ 1 ms",
                h_med <= 1.0)]
    n_med = statistics.median(naive)
    rows.append(row(f"release skew, threads without barrier ({len(naive)} waves)",
                    f"median {n_med:.3f} ms, max {max(naive):.3f} ms",
                    f"{n_med / h_med:.1f}× the helper's", "-", None))
    if curl:
        c_med = statistics.median(curl)
        rows.append(row(f"release skew, bash `curl &` burst ({len(curl)} waves)",
                        f"median {c_med:.3f} ms, max {max(curl):.3f} ms",
                        f"{c_med / h_med:.1f}× the helper's", "≥ 5× the helper's",
                        c_med / h_med >= 5))
    else:
        rows.append(row("release skew, bash `curl &` burst", "skipped: curl not found",
                        "-", "-", None))
    return rows


# ---------------------------------------------------------------------------
# Deadline precision.
# ---------------------------------------------------------------------------

def bench_deadline(shapes: Shapes, deadline_s: float, runs: int, start_s: float,
                   tmp: str) -> list[float]:
    """How long after its deadline the wrapped helper exits when the server never answers
    (less start_s, the wrapped interpreter's own start)."""
    late = []
    for i in range(runs):
        silent = SilentServer()
        try:
            command, env = shapes.wrapper("--base-url", silent.url, "--records",
                                          os.path.join(tmp, f"d{i}.jsonl"), "--model", "m",
                                          "--deadline-s", str(deadline_s))
            done = run_timed(command, env)
        finally:
            silent.stop()
        if done.code != 1:
            raise BenchError(f"expected a failed run (exit 1) against a silent server, "
                             f"got {done.code}: {done.error}")
        late.append(done.wall - deadline_s - start_s)
    return late


# ---------------------------------------------------------------------------
# Output and the run.
# ---------------------------------------------------------------------------

def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds, one decimal."""
    return f"{seconds * 1000:.1f} ms"


def mib(kib: float) -> str:
    """KiB as MiB, one decimal."""
    return f"{kib / 1024:.1f} MiB"


def bench_quick_read(reps: int) -> dict:
    """The gauge sampler's quick read of a large /metrics (the hostile table's 20,000 lines,
    0.9 MB): the product's lines_naming() against a test per line, as it read before, and
    the full parse for scale; median seconds of each, in turns."""
    text = "\n".join(f'vllm:filler_total{{engine="0",n="{i}"}} 1.0' for i in range(20000))
    text += '\nvllm:num_requests_running{engine="0"} 0.0\n'
    names = vllm_metrics.GAUGES
    ways = {"find": lambda: vllm_metrics.lines_naming(text, names),
            "per line": lambda: "\n".join(line for line in text.split("\n")
                                           if any(name in line for name in names)),
            "parse": lambda: prometheus.parse_prometheus(text)}
    assert ways["find"]() == ways["per line"]()
    took: dict = {name: [] for name in ways}
    for _ in range(reps):
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            took[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in took.items()}


def quick_read_row(read: dict, reps: int) -> str:
    ratio = read["per line"] / read["find"]
    return row("gauge sampler's quick read of a 0.9 MB /metrics (20,000 lines; read every "
               f"20 ms while a batch runs), median of {reps}: the lines naming a gauge found "
               "by str.find vs a test per line (the reading before)",
               f"{fmt_ms(read['find'])} vs {fmt_ms(read['per line'])}; the whole text "
               f"parsed: {fmt_ms(read['parse'])}", f"{ratio:.0f}× faster",
               "≤ 1 ms a read (5% of the interval)", read["find"] <= 0.001)


def row(name: str, measured: str, ratio: str, target: str, verdict: bool | None) -> str:
    """One Markdown table row; verdict None: informational, no target."""
    mark = {True: "met", False: "MISSED", None: "-"}[verdict]
    return f"| {name} | {measured} | {ratio} | {target} | {mark} |"


def progress(text: str) -> None:
    """What the bench is doing now, on stderr (the table goes to stdout)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def machine_line() -> str:
    """The machine the figures come from, and how loaded it was when the bench started."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine: {os.cpu_count()} cores, {platform.machine()}, Python "
            f"{platform.python_version()} ({PYTHON}), {platform.system()} {platform.release()}, "
            f"load average {load}")


def _over_budget(signum, frame):
    """SIGALRM at the budget: unwind, stopping every server and process on the way."""
    raise BenchError(f"over its {BUDGET_S} s budget; stopped (servers and processes "
                     f"are stopped on the way out)")


def run_bench(args: argparse.Namespace, deadline: float) -> list[str]:
    """Every measure, in turn; the rows of the table."""
    n = 3 if args.quick else 5
    reps = 10 if args.quick else 20
    rows = ["| measure | measured | ratio | target | |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["WARMUP_LOCK_DIR"] = tmp     # every run's lock files go with the folder
        copy, copy_how = write_wrapper_copy(tmp)
        shapes = Shapes(copy)
        progress(f"start-up: 9 commands, {reps} runs each, in turns")
        start = bench_startup(shapes, reps)
        costs = bench_module_costs(shapes, start["modules"], max(reps // 2, 5))
        if not bytecode_cached():
            progress("note: the helper's bytecode cache could not be written: the wrapper "
                     "compiles it on every start")
        progress(f"overhead: {n} full warm-ups at {LATENCY_S:g} s per completion")
        over = bench_overhead(shapes, n, tmp)
        base = start["wrapped -I -S pass"]
        rows.append(overhead_row(over, start, n))

        progress(f"per-wave evidence: {n} warm-ups each with and without it")
        rows.append(evidence_row(bench_evidence(shapes, n, tmp), n))
        progress(f"the sampler's quick read: {reps} reads each way, in turns")
        rows.append(quick_read_row(bench_quick_read(reps), reps))

        engine_runs = 3
        progress(f"engines: {engine_runs} warm-ups each of 1 and {ENGINES} engines")
        rows.append(engines_row(bench_engines(shapes, engine_runs, tmp), engine_runs))

        progress("release skew: the helper, threads, curl")
        server = FakeServer(FakeConfig(latency_s=0.02)).start()
        try:
            helper = bench_skew_helper(shapes, server, reps, tmp)
            naive = bench_skew_threads(server, reps)
            curl = bench_skew_curl(server, reps)
        finally:
            server.stop()
        rows += skew_rows(helper, naive, curl)
        rows += startup_rows(start, costs, copy_how)

        if children_listed():
            progress("memory: peaks of the baselines and steps")
            rows += memory_rows(over["rss_kib"], bench_memory(shapes, 3))
        else:
            rows.append(row("memory", "skipped: this kernel does not list a process's "
                            "children in /proc", "-", "-", None))

        progress("deadline precision: a 3 s deadline against a silent server")
        late = bench_deadline(shapes, 3.0, 2 if args.quick else 3, base, tmp)
        rows.append(row("deadline precision: exit after a 3 s deadline, silent server, through "
                        "the wrapper",
                        f"max {fmt_ms(max(late))} late (median {fmt_ms(statistics.median(late))})",
                        "-", "≤ 500 ms", max(late) <= 0.5))
        progress(f"readiness probe: qualify.py ready, {reps} runs")
        ready = bench_ready(reps, tmp)
        ratio = ready["ready"] / ready["pass"]
        rows.append(row("readiness probe: `python3 qualify.py ready` (one /health, one "
                        "/metrics; seven of the folder's modules) vs `python3 -c pass`",
                        f"{fmt_ms(ready['ready'])} vs {fmt_ms(ready['pass'])}, peak "
                        f"{mib(ready['rss_kib'])}", f"{ratio:.2f}", f"≤ {READY_TARGET}",
                        ratio <= READY_TARGET))
        rows.append(probe_row(ready))
        progress(f"readiness owner: GET /ready, {10 * reps} answers quiet and under hogs")
        rows.append(owner_row(bench_owner(10 * reps, tmp), ready))
        progress("record sizes: a default warm-up and one with --paths all")
        rows += size_rows(bench_sizes(tmp))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Options, the machine, every measure, the table; 1 with one line when a measure
    could not be made."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--results", metavar="PATH", default=RESULTS,
                        help="where the table is written as Markdown, with the machine and "
                             "the date (default: bench/RESULTS.md); '-' for stdout only")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + BUDGET_S
    signal.signal(signal.SIGALRM, _over_budget)
    signal.alarm(BUDGET_S)
    machine = machine_line()
    print(machine)
    print(f"fake server: fixed {LATENCY_S * 1000:.0f} ms per completion, 127.0.0.1\n")
    try:
        rows = run_bench(args, deadline)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted; servers and processes stopped", file=sys.stderr)
        return 130
    finally:
        signal.alarm(0)
    spent = BUDGET_S - (deadline - time.monotonic())
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    ended = f"bench took {spent:.0f} s (budget {BUDGET_S} s); load average at the end {load}"
    print("\n".join(rows) + "\n\n" + ended)
    if args.results != "-":
        write_results(args.results, machine, rows, ended, args.quick)
        print(f"written: {args.results}")
    return 0


def write_results(path: str, machine: str, rows: list[str], ended: str, quick: bool) -> None:
    """The figures of this run as bench/RESULTS.md: written by the bench, never by hand."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = "python3 bench/run.py" + (" --quick" if quick else "")
    text = (f"# Benchmark results\n\nWritten by `{command}` on {when}; run it again to "
            f"replace this file. Each ratio is measured in this one run, on this machine "
            f"(figures from another machine are not comparable).\n\n{machine}  \n"
            f"fake server: fixed {LATENCY_S * 1000:.0f} ms per completion, 127.0.0.1  \n"
            f"{ended}\n\n" + "\n".join(rows) + "\n")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    sys.exit(main())
