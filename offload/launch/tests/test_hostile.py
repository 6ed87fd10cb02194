"""Hostile inputs: a table of cases, each the helper as a real process; then odd bytes
and pipes one at a time (lone surrogates, FIFOs, a stdout nobody reads, an unwritable
stderr, an ASCII terminal, keys cut in half) and odd inputs that must give one line.

Every case starts a hostile server (hostile.py) that plays scripted bytes, runs
`python3 warmup.py ...` (or probe, or report) under a 1 GiB address-space cap with a
3 s deadline (forked by forkserver.py's server, which has imported them once, unless the
case drives signals or odd stdio: then a fresh interpreter), and asserts: the exit
status; no traceback on stdout or stderr; exactly one `summary` record (none for usage
errors found before the run, which write nothing); the time bound; the peak memory
bound (VmHWM, polled); the message
fragment, where named, in stdout + stderr + records; no generated text anywhere; and
what the server received, where it matters (nothing sent, the request line, Host).

All cases run once, in a small thread pool, in setUpClass; each test method then
checks one class of cases (a subTest per case). Run `python3 test_hostile.py --table`
for a table of what each case actually did.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from dataclasses import dataclass, field
from typing import Callable

from hostile import (MODEL, TEXT_MARKER, Default, Hang, HostileServer, Received, Trickle,
                     chunked, completion_doc, completion_with, error_answer, http,
                     json_answer, metrics_answer, metrics_text, model_entry, models_doc,
                     sse_answer, stream_events)
from support import (PYTHON, WRAPPER, HelperCase, contract_requests, gate_scrubbed, read_records,
                     run_record, run_script, summary_record, wave_records)
import tools.gate as gate  # noqa: E402  (support puts offload/launch on sys.path)
from forkserver import ForkServer

TESTS = os.path.dirname(os.path.abspath(__file__))
LAUNCH = os.path.dirname(TESTS)
WARMUP = os.path.join(LAUNCH, "warmup.py")
QUALIFY = os.path.join(LAUNCH, "qualify.py")

DEADLINE_S = "3"
AS_LIMIT = 1 << 30                 # every case runs under this: a runaway dies, not the host
WORKERS = 4
KILL_MARGIN_S = 10.0               # a case still running this long after its bound is killed
# A case's bound is what a quiet machine needs, times LOAD_FACTOR plus LOAD_MARGIN_S: four
# cases run at once, on a busy 2-core box; the bound is there to catch a run that ignores
# its own deadline (runs on to the 60 s socket cap, or hangs), not to time it.
LOAD_FACTOR = 3.0
LOAD_MARGIN_S = 5.0
FORKS: list = []                   # the table's fork server, while the table runs
# The programs, and what each of their runs loads on the way (argparse's shutil and locale,
# a host name's idna codec): loaded once, not in each of ~100 children (~10 ms of CPU each).
PRELOAD = ["warmup", "qualify", "tools.report", "tools.probe", "shutil", "locale",
           "encodings.idna"]
# What an interpreter reads as it starts (streams' encoding, locale, time zone): a case
# that sets one runs in a fresh interpreter, never a forked one.
STARTUP_VARIABLES = ("PYTHON", "LC_", "LANG", "TZ")
API_KEY = "sk-KEYMARKER-h0st1le"
NEST = b"[" * 100000               # deeper than any JSON parser's recursion limit


@dataclass(frozen=True)
class Case:
    """One hostile input and what the helper must do about it."""
    name: str
    script: dict = field(default_factory=dict)      # endpoint -> answer (hostile.py)
    args: tuple = ()                                # {url} {port} {tmp} {records} expand
    env: dict = field(default_factory=dict)
    exit: int | tuple = 0                           # the exit status (or any of these)
    fragments: tuple = ()                           # each must appear in the output
    one_of: tuple = ()                              # at least one must appear
    time_s: float = 5.0                             # wall-clock bound, spawn to exit
    mem_mib: int = 150                              # peak RSS bound
    summary: bool | None = True                     # one summary record (False: no records;
                                                    # None: none only on a usage exit 2)
    completions: int | None = None                  # completions the server must receive
    command: str = "warmup"                         # warmup | probe | report
    host: str = "127.0.0.1"
    base_url: str = "{url}"
    records: bool = True                            # pass --records {records}
    fixture: Callable | None = None                 # fixture(tmp) -> stop function
    driver: Callable | None = None                  # driver(run) -> (code, peak, timed_out)
    checks: tuple = ()                              # check(outcome) -> list of problems
    damaged: int = 0                                # records lines that may be damaged


@dataclass
class Outcome:
    """What one case's process did, and what its server received."""
    case: Case
    code: int | None
    stdout_bytes: bytes
    stderr: str
    records: list
    records_text: str
    damaged_lines: int
    elapsed: float
    peak_mib: float
    timed_out: bool
    received: list = field(default_factory=list)
    port: int | None = None
    error: str | None = None                        # the harness itself failed

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr + "\n" + self.records_text

    def completions(self) -> list[Received]:
        return [r for r in self.received if r.endpoint == "/v1/completions"]

    def summaries(self) -> list[dict]:
        return [r for r in self.records if isinstance(r, dict) and r.get("record") == "summary"]

    def describe(self) -> str:
        """One line: what actually happened (for failure messages and the table)."""
        first = next((line for line in self.stderr.splitlines() if line.strip()), "")
        if not first:
            first = next((line for line in self.stdout.splitlines() if line.strip()), "")
        traceback = "TRACEBACK" if "Traceback" in self.stdout + self.stderr else "no traceback"
        killed = " (KILLED at the bound)" if self.timed_out else ""
        return (f"exit {self.code}{killed}, {self.elapsed:.2f} s, {self.peak_mib:.0f} MiB, "
                f"{traceback}, {len(self.summaries())} summary, "
                f"{len(self.completions())} completions; first line: {first[:160]!r}")


# ---------------------------------------------------------------------------
# Running one case: a real process (forked, or a fresh interpreter), bounded in time and
# address space.
# ---------------------------------------------------------------------------

def clean_env() -> dict:
    """The test's environment without the helper's variables and proxies."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("WARMUP_", "VLLM_")) and k.lower() not in
            ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}


def case_env(case: Case, tmp: str) -> dict:
    """The test's environment without the helper's variables, plus the case's own; the
    lock files in the case's folder (none left behind in /tmp)."""
    return dict(clean_env(), WARMUP_LOCK_DIR=tmp, **case.env)


def spawn(argv: list[str], env: dict, stdout, stderr, redirect: str = "") -> subprocess.Popen:
    """python3 argv under `ulimit -v` (bash execs python, so the pid is the helper's);
    `redirect` is a bash redirection for the helper (such as '>&-')."""
    command = ["bash", "-c", f'ulimit -v {AS_LIMIT >> 10} && exec "$@" {redirect}', "bash",
               *PYTHON, *argv]
    # glibc reserves 64 MiB of address space per malloc arena, up to 8 per core, as threads
    # allocate: 64 clients could reach the cap on reservations alone (seen as an abort,
    # 'libgcc_s.so.1 must be installed for pthread_exit to work', in 1 of ~10 runs). The
    # cap is there for memory a run really uses: two arenas.
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            env=dict(env, MALLOC_ARENA_MAX="2"))


def peak_kib(pid: int) -> int:
    """VmHWM of a live process (its own peak RSS since exec), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def reap(proc: subprocess.Popen, timeout: float, peak: int = 0) -> tuple[int, float, bool]:
    """Wait for the process at most `timeout` s (then kill it): exit code, peak MiB, killed.

    The peak is VmHWM polled every 10 ms (ru_maxrss would count the forking test process).
    """
    def ended():
        pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
        return status if pid else None
    status, peak, timed_out = wait_ended(proc.pid, ended, timeout, peak)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, peak, timed_out


def wait_ended(pid: int, ended: Callable, timeout: float, peak: int = 0
               ) -> tuple[int, float, bool]:
    """Until ended() gives the process's wait status, at most `timeout` s (then KILL):
    (wait status, peak MiB, killed)."""
    end = time.monotonic() + timeout
    timed_out = False
    while (status := ended()) is None:
        peak = max(peak, peak_kib(pid))
        if time.monotonic() > end and not timed_out:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
        time.sleep(0.01)
    return status, peak / 1024, timed_out


@dataclass
class Run:
    """What a driver gets: the argv, environment, files and server of one case."""
    case: Case
    argv: list
    env: dict
    stdout_path: str
    stderr_path: str
    server: HostileServer | None
    timeout: float


def plain_driver(run: Run) -> tuple[int, float, bool]:
    """The case's program with its stdout and stderr in files: forked by the table's fork
    server where there is one, else a real interpreter."""
    with open(run.stdout_path, "wb") as out, open(run.stderr_path, "wb") as err:
        if not FORKS or any(name.startswith(STARTUP_VARIABLES) for name in run.case.env):
            return reap(spawn(run.argv, run.env, out, err), run.timeout)
        pid = FORKS[0].spawn(run.argv, run.env, out, err, AS_LIMIT)
        status, peak, timed_out = wait_ended(pid, lambda: FORKS[0].status(pid), run.timeout)
        return os.waitstatus_to_exitcode(status), peak, timed_out


def build_argv(case: Case, server: HostileServer | None, tmp: str, records: str) -> list[str]:
    values = {"url": server.url if server else "", "port": server.port if server else 0,
              "tmp": tmp, "records": records}
    args = [a.format(**values) for a in case.args]
    if case.command == "report":
        script = [QUALIFY, "report"] if os.path.exists(QUALIFY) else [WARMUP, "report"]
        return script + args
    head = [WARMUP] if case.command == "warmup" else (
        [QUALIFY, "probe"] if os.path.exists(QUALIFY) else [WARMUP, "probe"])
    head += ["--base-url", case.base_url.format(**values), "--deadline-s", DEADLINE_S]
    if case.records:
        head += ["--records", records]
    return head + args


def read_records_leniently(path: str) -> tuple[list, str, int]:
    """Records as parsed, the raw text, and how many lines were not JSON."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return [], "", 0
    records, damaged = [], 0
    for line in text.splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                damaged += 1
    return records, text, damaged


def execute(case: Case, root: str, servers: list) -> Outcome:
    """Run one case start to end; its server is stopped before this returns."""
    tmp = tempfile.mkdtemp(dir=root)
    records = os.path.join(tmp, "records.jsonl")
    server = None
    stop_fixture = None
    started = time.monotonic()
    try:
        if case.command != "report":
            server = HostileServer(case.script, case.host)
            servers.append(server)
            server.start()
        if case.fixture:
            stop_fixture = case.fixture(tmp)
        run = Run(case, build_argv(case, server, tmp, records), case_env(case, tmp),
                  os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr"), server,
                  time_bound(case) + KILL_MARGIN_S)
        started = time.monotonic()
        code, peak, timed_out = (case.driver or plain_driver)(run)
        elapsed = time.monotonic() - started
        error = None
    except Exception as exc:               # the harness failed: report it as the case's failure
        code, peak, timed_out, elapsed = None, 0.0, False, time.monotonic() - started
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if stop_fixture:
            stop_fixture()
        if server:
            server.stop()
    found, text, damaged = read_records_leniently(records)
    out = _read(os.path.join(tmp, "stdout"))
    return Outcome(case, code, out, _read(os.path.join(tmp, "stderr")).decode("utf-8", "replace"),
                   found, text, damaged, elapsed, peak, timed_out,
                   server.requests() if server else [], server.port if server else None, error)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


# ---------------------------------------------------------------------------
# Drivers: signals mid-wave, a stdout that closes early, a stdout nobody reads.
# ---------------------------------------------------------------------------

def wait_for_request(server: HostileServer, pid: int, endpoint: str,
                     limit_s: float = 5.0) -> int:
    """Until the server holds a request to `endpoint` (the helper waits on it), a bounded
    wait; the helper's peak memory meanwhile (KiB)."""
    end = time.monotonic() + limit_s
    peak = 0
    while not server.requests(endpoint) and time.monotonic() < end:
        peak = max(peak, peak_kib(pid))
        time.sleep(0.005)
    time.sleep(0.05)                       # the client thread is now in its read
    return max(peak, peak_kib(pid))


def signals_driver(signums: tuple, gap_us: float = 0.0,
                   endpoint: str = "/v1/completions") -> Callable:
    """Send `signums` once `endpoint` is waited on (mid-wave by default), `gap_us`
    microseconds apart (busy-waited)."""
    def drive(run: Run) -> tuple[int, float, bool]:
        with open(run.stdout_path, "wb") as out, open(run.stderr_path, "wb") as err:
            proc = spawn(run.argv, run.env, out, err)
            peak = 0
            try:
                peak = wait_for_request(run.server, proc.pid, endpoint)
                for i, signum in enumerate(signums):
                    if i:
                        until = time.perf_counter() + gap_us / 1e6
                        while time.perf_counter() < until:
                            pass
                    os.kill(proc.pid, signum)
            finally:
                result = reap(proc, run.timeout, peak)
        return result
    return drive


def head_one_driver(run: Run) -> tuple[int, float, bool]:
    """`warmup.py ... | head -1`: read one line of stdout, then close the pipe."""
    with open(run.stderr_path, "wb") as err:
        proc = spawn(run.argv, run.env, subprocess.PIPE, err)
        got = bytearray()
        end = time.monotonic() + run.timeout
        fd = proc.stdout.fileno()
        peak = 0
        while b"\n" not in got and time.monotonic() < end:
            peak = max(peak, peak_kib(proc.pid))
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                got += chunk
        proc.stdout.close()
        with open(run.stdout_path, "wb") as out:
            out.write(bytes(got).split(b"\n")[0] + b"\n")
        return reap(proc, max(end - time.monotonic(), 0.1), peak)


def unread_stdout_driver(run: Run) -> tuple[int, float, bool]:
    """Stdout a pipe (shrunk to one page) that nobody reads until the process has ended."""
    with open(run.stderr_path, "wb") as err:
        proc = spawn(run.argv, run.env, subprocess.PIPE, err)
        try:
            fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        except OSError:
            pass
        try:
            return reap(proc, run.timeout)
        finally:
            proc.stdout.close()


def stdout_driver(redirect: str = "", stdout_path: str | None = None) -> Callable:
    """Stdout closed before the start (redirect '>&-') or a file such as /dev/full."""
    def drive(run: Run) -> tuple[int, float, bool]:
        with open(stdout_path or os.devnull, "wb") as out, open(run.stderr_path, "wb") as err:
            proc = spawn(run.argv, run.env, out, err, redirect)
            return reap(proc, run.timeout)
    return drive


# ---------------------------------------------------------------------------
# Fixtures and checks.
# ---------------------------------------------------------------------------

def fifo_fixture(tmp: str) -> Callable:
    os.mkfifo(os.path.join(tmp, "fifo"))
    return lambda: None


def rewriting_status_fixture(content: bytes) -> Callable:
    """A status file rewritten every 50 ms (so the helper reads it), until stopped."""
    def start(tmp: str) -> Callable:
        path = os.path.join(tmp, "status.json")
        done = threading.Event()

        def rewrite():
            while not done.wait(0.05):
                with open(path, "wb") as handle:
                    handle.write(content)

        with open(path, "wb") as handle:
            handle.write(content)
        thread = threading.Thread(target=rewrite, daemon=True)
        thread.start()
        return lambda: (done.set(), thread.join(timeout=2))
    return start


def file_fixture(name: str, content: bytes) -> Callable:
    def start(tmp: str) -> Callable:
        with open(os.path.join(tmp, name), "wb") as handle:
            handle.write(content)
        return lambda: None
    return start


def nothing_received(outcome: Outcome) -> list[str]:
    return [f"the server received {len(outcome.received)} requests; expected none "
            f"({outcome.received[0].request_line!r} first)"] if outcome.received else []


def request_lines_have_three_parts(outcome: Outcome) -> list[str]:
    return [f"malformed request line {r.request_line!r}" for r in outcome.received
            if len(r.request_line.split(" ")) != 3]


def metrics_url_request_line(outcome: Outcome) -> list[str]:
    lines = [r.request_line for r in outcome.received]
    problems = [f"empty request target: {line!r}" for line in lines if "  " in line]
    if "GET / HTTP/1.1" not in lines:
        problems.append(f"no 'GET / HTTP/1.1' among {sorted(set(lines))}")
    return problems


def ipv6_host_header(outcome: Outcome) -> list[str]:
    want = f"[::1]:{outcome.port}"
    hosts = {r.header("host") for r in outcome.received}
    return [] if hosts == {want} else [f"Host headers {sorted(map(str, hosts))}, expected {want}"]


def no_injected_header(outcome: Outcome) -> list[str]:
    return [f"injected header in {r.request_line!r}" for r in outcome.received
            if r.header("x-injected") is not None]


def secrets_of(outcome: Outcome) -> list[str]:
    """What must never be shown: the nonce and words of every prompt sent, the key."""
    forbidden = [API_KEY]
    for request in outcome.completions():
        words = (request.prompt() or "").split()
        if words:
            forbidden.append(words[0])
            if len(words) > 5:
                forbidden.append(" ".join(words[1:6]))
    return forbidden


def nothing_leaked(outcome: Outcome) -> list[str]:
    if not outcome.completions():
        return ["no completion was sent, so the leak check proves nothing"]
    return [f"leaked {secret[:40]!r}" for secret in secrets_of(outcome) if secret in outcome.output]


def stdout_has_no_forged_lines(outcome: Outcome) -> list[str]:
    """No raw control characters but the helper's newlines; no PASS line on a failed run."""
    problems = []
    for text, where in ((outcome.stdout, "stdout"), (outcome.stderr, "stderr")):
        bad = sorted({f"{ord(c):#04x}" for c in text if (ord(c) < 32 and c != "\n")
                      or 0x7f <= ord(c) <= 0x9f or c in "\u2028\u2029"})
        if bad:
            problems.append(f"{where} holds raw control characters {bad}")
        passing = [line for line in text.splitlines() if line.lstrip().startswith("PASS")]
        if passing and outcome.code != 0:
            problems.append(f"{where} shows a forged PASS line on exit {outcome.code}")
    return problems


def short_lines(limit: int) -> Callable:
    def check(outcome: Outcome) -> list[str]:
        long = [len(line) for line in (outcome.stdout + "\n" + outcome.stderr).splitlines()
                if len(line) > limit]
        return [f"output lines of {long} characters (limit {limit})"] if long else []
    return check


def short_problems(limit: int) -> Callable:
    """Every problem string in every record is at most `limit` characters."""
    def check(outcome: Outcome) -> list[str]:
        found = []
        for record in outcome.records:
            for problem in (record.get("problems") or []) if isinstance(record, dict) else []:
                if isinstance(problem, str) and len(problem) > limit:
                    found.append(f"{record.get('record')} problem of {len(problem)} characters")
        return found
    return check


def verdict_is(verdict: str) -> Callable:
    def check(outcome: Outcome) -> list[str]:
        got = [s.get("verdict") for s in outcome.summaries()]
        return [] if got == [verdict] else [f"summary verdicts {got}, expected [{verdict!r}]"]
    return check


def no_broken_pipe_noise(outcome: Outcome) -> list[str]:
    return ["stderr shows BrokenPipeError"] if "BrokenPipe" in outcome.stderr else []


def model_sent_as_served(model_id: str) -> Callable:
    """Every completion names the model exactly as /v1/models served it (not a cleaned copy)."""
    def check(outcome: Outcome) -> list[str]:
        sent = {(r.json() or {}).get("model") for r in outcome.completions()}
        return [] if sent <= {model_id} else [f"completions named {sorted(map(repr, sent))}"]
    return check


def run_record_readable(outcome: Outcome) -> list[str]:
    runs = [r for r in outcome.records if isinstance(r, dict) and r.get("record") == "run"]
    return [] if runs else ["the run record is not readable (glued to a cut line?)"]


def cut_records_fixture(tmp: str) -> Callable:
    """A records file left by a killed run: its last line cut, without a newline."""
    with open(os.path.join(tmp, "records.jsonl"), "wb") as handle:
        handle.write(b'{"record": "run", "run_id": "old"}\n{"record": "requ')
    return lambda: None


# ---------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------

R1 = f'vllm:num_requests_running{{engine="1",model_name="{MODEL}"}}'
W1 = f'vllm:num_requests_waiting{{engine="1",model_name="{MODEL}"}}'
R0 = f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}}'


def running_with_model(model_name: str) -> str:
    """A busy running-gauge sample of engine 1 whose model_name label is `model_name`."""
    return f'vllm:num_requests_running{{engine="1",model_name="{model_name}"}} 2'
UNREADABLE = ("cannot be read exactly", "line 7")


def guard(name: str, line: str, fragments: tuple = UNREADABLE, **kw) -> Case:
    """A /metrics whose line 7 is `line`; the other series of both gauges read 0."""
    return Case(f"guard: {name}", {"/metrics": metrics_answer(metrics_text(line))},
                exit=kw.pop("exit", 3), fragments=fragments, completions=kw.pop("completions", 0),
                **kw)


GUARD = [
    guard("float timestamp", f"{R1} 2 1700000000.5"),
    guard("exemplar", f'{R1} 2 # {{trace_id="x"}} 1'),
    guard("raw CR in a label value", running_with_model("m\rx")),
    guard("U+0085 in a label value", running_with_model("m\u0085x")),
    guard("U+2028 in a label value", running_with_model("m\u2028x")),
    guard("unterminated label value", 'vllm:num_requests_running{engine="1} 2'),
    guard("no value", R1),
    guard("a word for a value", f"{W1} busy"),
    guard("NUL after the value", f"{W1} 2\x00"),
    guard("space before {: read it or refuse, never drop it",
          f'vllm:num_requests_running {{engine="1",model_name="{MODEL}"}} 2',
          fragments=(), one_of=("cannot be read exactly", "not idle")),
    Case("guard: BOM before the first line, a busy sample",
         {"/metrics": metrics_answer("\ufeff" + f"{R1} 2\n" + metrics_text())},
         exit=3, fragments=("cannot be read exactly", "line 1"), completions=0),
    guard("the same series twice, 0 then 3", f"{R0} 3.0", fragments=()),
    guard("+Inf gauge", f"{W1} +Inf", fragments=()),
    guard("NaN gauge", f"{W1} NaN", fragments=()),
    guard("waiting_by_reason is another gauge (prefix trap)",
          f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="{MODEL}",'
          f'reason="capacity"}} 5.0', fragments=(), exit=0, completions=10),
    guard("an unreadable line of another metric is not a gauge line",
          "vllm:some_other_gauge{engine=0} 1 2 3", fragments=(), exit=0, completions=10),
    Case("guard: 20,000 lines of other metrics (0.9 MB)", {"/metrics": metrics_answer(metrics_text(
         *(f'vllm:filler_total{{engine="0",n="{i}"}} 1.0' for i in range(20000))))},
         args=("--deadline-s", "60"), exit=0, completions=10, mem_mib=400, time_s=10.0),
    # The settle window (2 s) must end well inside the deadline on a busy machine too.
    Case("guard: busy for good after B1 (the settle window ends, then refuse)",
         {"/metrics": lambda req: metrics_answer(metrics_text(f"{R1} 1.0"))
          if req.seen.get("/v1/completions") else Default()},
         args=("--deadline-s", "15"), exit=3, completions=1, fragments=("not idle",),
         time_s=20.0),
    Case("guard: a /metrics that trickles a byte every 0.2 s",
         {"/metrics": Trickle(metrics_answer(metrics_text()), 0.2)},
         exit=(1, 3), completions=0, time_s=float(DEADLINE_S) + 1.5),
    Case("guard: a /metrics body of 4 MiB + 1", {"/metrics": metrics_answer(
         metrics_text("#" + "x" * ((4 << 20) - len(metrics_text()) - 1)).encode())},
         exit=(1, 3), one_of=("larger than", "cannot be read"), completions=0),
]


def tokenize_count(value) -> Callable:
    return lambda req: json_answer({"count": value, "max_model_len": 32768, "tokens": [],
                                    "token_strs": None})


TOKENIZE = [
    Case("/tokenize trickles a byte every 0.2 s", {"/tokenize": lambda req: Trickle(
        json_answer({"count": 5000, "max_model_len": 32768, "tokens": [], "token_strs": None}),
        0.2)}, exit=1, completions=0, time_s=float(DEADLINE_S) + 1.5),
] + [
    Case(f"/tokenize count {label}", {"/tokenize": tokenize_count(value)}, exit=1,
         fragments=("could not size the B1 prompt",), completions=0, mem_mib=150)
    for label, value in (("0", 0), ("1", 1), ("-5", -5), ("10**12", 10 ** 12),
                         ("a string", "5000"), ("a float", 4999.5), ("true", True),
                         ("null", None), ("stuck at 100", 100))
]

OPTIONS = [
    Case("--b1-tokens 1000000000 (no max_model_len anywhere)",
         {"/v1/models": json_answer(models_doc(model_entry(max_model_len=None))),
          "/tokenize": lambda req: json_answer({"count": 10 ** 9, "max_model_len": None,
                                                "tokens": [], "token_strs": None})},
         args=("--b1-tokens", "1000000000"), exit=2, fragments=("--b1-tokens",),
         summary=False, completions=0, time_s=2.0),
] + [
    Case(f"--deadline-s {value}", args=("--deadline-s", value), exit=2,
         fragments=("--deadline-s",), summary=False, completions=0, time_s=2.0,
         checks=(nothing_received,))
    for value in ("1e10", "nan", "inf")
]


def framed(build: Callable) -> Callable:
    """A completion answer: the default document for the request, framed by `build`."""
    return lambda req: build(completion_with(req))


def chunk_head(te: str = "chunked") -> bytes:
    return http(200, b"", [("transfer-encoding", te)], length=False)


FRAMING = [
    Case("chunk size -6", {"/v1/completions": framed(
        lambda body: chunk_head() + b"-6\r\n" + body[:10] + b"\r\n0\r\n\r\n")},
        exit=1, fragments=("malformed",)),
    Case("chunk size not hex", {"/v1/completions": framed(
        lambda body: chunk_head() + b"zz\r\n" + body + b"\r\n0\r\n\r\n")},
        exit=1, fragments=("malformed",)),
    Case("chunk size 2**64 - 1", {"/v1/completions": framed(
        lambda body: chunk_head() + b"ffffffffffffffff\r\n" + body)},
        exit=1, one_of=("malformed", "larger than", "closed before")),
    Case("Content-Length: \u00b2 (a latin-1 digit that is not a number)", {
        "/v1/completions": framed(lambda body: http(200, body, [("content-length", "\u00b2")],
                                                    length=False))},
        exit=1, fragments=("malformed",)),
    Case("two different Content-Length headers", {"/v1/completions": framed(
        lambda body: http(200, body, [("content-length", str(len(body))),
                                      ("content-length", str(len(body) + 5))], length=False))},
        exit=1, fragments=("malformed",)),
    Case("status 2000", {"/v1/completions": framed(lambda body: http(2000, body, reason="OK"))},
         exit=1, fragments=("malformed",)),
    Case("headers of 70 KB", {"/v1/completions": framed(
        lambda body: http(200, body, [("x-filler", "a" * 70000)]))},
        exit=1, fragments=("malformed",)),
    Case("LF-only line ends: parsed or refused, never a false pass", {
        "/v1/completions": framed(lambda body: http(200, body).replace(b"\r\n", b"\n"))},
        exit=(0, 1)),
    Case("a folded header line", {"/v1/completions": framed(
        lambda body: http(200, body, [("x-note", "one\r\n two")]))}, exit=(0, 1)),
    Case("status line without a reason", {"/v1/completions": framed(
        lambda body: http(200, body).replace(b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200\r\n", 1))},
        exit=0, completions=10),
    Case("100 Continue before the 200", {"/v1/completions": framed(
        lambda body: b"HTTP/1.1 100 Continue\r\n\r\n" + http(200, body))},
        exit=0, completions=10),
    Case("103 Early Hints and 100 Continue before the 200", {"/v1/completions": framed(
        lambda body: b"HTTP/1.1 103 Early Hints\r\nlink: </x.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 100 Continue\r\n\r\n" + http(200, body))},
        exit=0, completions=10),
    Case("Transfer-Encoding: Chunked", {"/v1/completions": framed(
        lambda body: chunked(body, te="Chunked"))}, exit=0, completions=10),
]

NESTED = [
    Case("nested JSON: a completion (200)", {"/v1/completions": http(200, NEST)}, exit=1),
    Case("nested JSON: a 500 body", {"/v1/completions": http(500, NEST)}, exit=1),
    Case("nested JSON: /v1/models", {"/v1/models": http(200, NEST)}, exit=2,
         fragments=("cannot find the model",), completions=0),
    Case("nested JSON: /tokenize", {"/tokenize": http(200, NEST)}, exit=1, completions=0),
    Case("nested JSON: /version (optional: the run passes)", {"/version": http(200, NEST)},
         exit=0, completions=10),
    Case("nested JSON: an SSE event (probe)", {"/v1/completions": sse_answer(
        [b'{"choices": [], "usage": ' + NEST + b"}"])}, command="probe",
        args=("--rounds", "2"), exit=1),
    Case("nested JSON: a status file (evidence, not the verdict)",
         fixture=rewriting_status_fixture(NEST),
         args=("--status-file", "{tmp}/status.json", "--status-wait-s", "0.5"),
         exit=0, completions=10, checks=(verdict_is("pass"),)),
]

REPORT = [
    Case("report: a nested records line", command="report", args=("{tmp}/r.jsonl",),
         fixture=file_fixture("r.jsonl", NEST + b"\n"), exit=(1, 2), summary=False,
         time_s=3.0),
] + [
    Case(f"report: {label}", command="report", args=("{tmp}/r.jsonl",),
         fixture=file_fixture("r.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in (
             {"record": "run", "run_id": "r1", "plan": {"waves": []}}, odd))),
         exit=(1, 2), summary=False, time_s=3.0)
    for label, odd in (
        ("a record kind that is a list", {"record": ["list"]}),
        ("a line that is an array", [1, 2]),
        ("a line that is a number", 5),
        ("a run whose plan and versions are not objects",
         {"record": "run", "plan": "x", "versions": 3, "run_id": ["a"]}),
        ("a request of odd types", {"record": "request", "wave": 5, "index": {}, "problems": "abc",
                                    "ok": False, "latency_s": "slow"}),
        ("a wave of odd types", {"record": "wave", "wave": None, "depth": "2", "ok": 1,
                                 "release_skew_ms": [], "duration_s": {}}),
        ("metrics of odd types", {"record": "metrics", "highlights": [1, 2], "warnings": 7}),
        ("a summary of odd types", {"record": "summary", "verdict": 7, "exit_code": "0",
                                    "problems": 9}),
        ("a summary whose exit_code is 300", {"record": "summary", "verdict": "pass",
                                              "exit_code": 300, "problems": []}),
        ("a summary whose exit_code is true", {"record": "summary", "verdict": "pass",
                                               "exit_code": True, "problems": []}),
    )
] + [
    Case("report: /dev/zero", command="report", args=("/dev/zero",), exit=(1, 2),
         summary=False, time_s=3.0, mem_mib=150),
]

URLS = [
    Case("non-ASCII URL path", base_url="{url}/\u00e9", exit=2, fragments=("--base-url",),
         summary=False, time_s=2.0, checks=(nothing_received,)),
    Case("--base-url port 0", base_url="http://127.0.0.1:0", exit=2, fragments=("--base-url",),
         summary=False, time_s=2.0),
    Case("a space in the URL path: refused, or percent-encoded", base_url="{url}/a b",
         exit=(0, 2), summary=None, checks=(request_lines_have_three_parts,)),
    Case("--metrics-url http://HOST:PORT/ sends GET /", args=("--metrics-url", "{url}/"),
         exit=0, completions=10, checks=(metrics_url_request_line,)),
] + [
    Case(f"API key {label}", env={"VLLM_API_KEY": key}, exit=2, fragments=("VLLM_API_KEY",),
         summary=False, time_s=2.0, checks=(nothing_received, no_injected_header))
    for label, key in (("with a latin-1 letter", "sk-\u00e9t\u00e9"),
                       ("with a euro sign", "sk-\u20ac"),
                       ("with CR LF and a header", "sk-x\r\nX-Injected: 1"),
                       ("with LF and a header", "sk-x\nX-Injected: 1"))
]


def ipv6_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


if ipv6_available():
    URLS.append(Case("IPv6 Host header in brackets", host="::1", exit=0, completions=10,
                     checks=(ipv6_host_header,)))

RECORDS = [
    Case("--records /dev/full", args=("--records", "/dev/full"), records=False, exit=2,
         fragments=("cannot write records",), summary=False, completions=0, time_s=2.0),
    Case("--records a FIFO with no reader", args=("--records", "{tmp}/fifo"), records=False,
         fixture=fifo_fixture, exit=2, fragments=("cannot write records",), summary=False,
         completions=0, time_s=2.0),
    Case("records appended to a file cut mid-line by a kill", fixture=cut_records_fixture,
         args=("--append",), exit=0, completions=10, damaged=1, checks=(run_record_readable,)),
    Case("--records a directory", args=("--records", "{tmp}"), records=False, exit=2,
         fragments=("cannot write records",), summary=False, completions=0, time_s=2.0),
]

OVERLOADED = "the upstream is overloaded, try again later " * 6     # ~270 characters
STDOUT = [
    Case("stdout closed after one line (| head -1)",
         {"/metrics": [lambda req: (time.sleep(0.3), default_metrics(req))[1], Default()]},
         exit=0, completions=10, driver=head_one_driver,
         checks=(verdict_is("pass"), no_broken_pipe_noise)),
    Case("stdout closed before the start (>&-)", exit=0, completions=10,
         driver=stdout_driver(">&-"), checks=(verdict_is("pass"),)),
    Case("stdout /dev/full", exit=0, completions=10, driver=stdout_driver("", "/dev/full"),
         checks=(verdict_is("pass"), no_broken_pipe_noise)),
    Case("stdout a pipe nobody reads, a lot printed",
         {"/v1/completions": error_answer(500, OVERLOADED)},
         args=("--waves", "1,2,3,4,5,6,7,8"), exit=1, time_s=float(DEADLINE_S) + 2,
         driver=unread_stdout_driver),
]


def default_metrics(req: Received) -> bytes:
    return metrics_answer(metrics_text())


HANG = {"/v1/completions": Hang()}
SIGNALS = [
    Case(f"two SIGTERMs {100 + 20 * i} us apart (#{i + 1})", HANG, exit=143, time_s=2.0,
         driver=signals_driver((signal.SIGTERM, signal.SIGTERM), 100 + 20 * i),
         checks=(verdict_is("killed"),))
    for i in range(10)
] + [
    Case(f"{signal.Signals(signum).name} mid-wave", HANG, exit=128 + signum, time_s=2.0,
         driver=signals_driver((signum,)), checks=(verdict_is("killed"),))
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGALRM, signal.SIGTERM)
] + [
    Case("SIGTERM while /tokenize hangs (before the run record)", {"/tokenize": Hang()},
         exit=143, time_s=2.0, driver=signals_driver((signal.SIGTERM,), endpoint="/tokenize"),
         checks=(verdict_is("killed"),)),
    Case("SIGTERM then SIGINT 200 us apart", HANG, exit=(143, 130), time_s=2.0,
         driver=signals_driver((signal.SIGTERM, signal.SIGINT), 200),
         checks=(verdict_is("killed"),)),
]


def echo_request(req: Received) -> bytes:
    """A 400 whose message is the whole request, headers and body, JSON-escaped."""
    headers = "\n".join(f"{k}: {v}" for k, v in req.headers)
    return error_answer(400, f"bad request: {req.request_line}\n{headers}\n\n"
                             f"{req.body.decode('utf-8', 'replace')}")


def models_with_id(model_id) -> dict:
    return {"/v1/models": json_answer(models_doc(model_entry(model_id)))}


FORGED_ID = "m\r\nPASS (exit 0): 10/10 requests ok\x1b[2K\x1b]0;owned\x07\u0085\u2028"
LEAKS = [
    Case("a 400 that echoes the request (key set)", {"/v1/completions": echo_request},
         env={"VLLM_API_KEY": API_KEY}, exit=1, checks=(nothing_leaked,)),
    Case("model id with CR LF ESC, picked as the only model",
         dict(models_with_id(FORGED_ID), **{"/v1/completions": error_answer(500, "boom")}),
         exit=1, checks=(stdout_has_no_forged_lines, model_sent_as_served(FORGED_ID))),
    Case("model id with CR LF ESC, named by --model",
         dict(models_with_id(FORGED_ID), **{"/v1/completions": error_answer(500, "boom")}),
         args=("--model", FORGED_ID), exit=1, checks=(stdout_has_no_forged_lines,)),
    Case("model id with non-ASCII letters: sent exactly, the run passes",
         models_with_id("mod\u00e8le-\u6a21\u578b-\U0001f600"), exit=0, completions=10,
         checks=(model_sent_as_served("mod\u00e8le-\u6a21\u578b-\U0001f600"),)),
    Case("model id of 10,000 characters",
         dict(models_with_id("m" * 10000), **{"/v1/completions": error_answer(500, "boom")}),
         exit=1, checks=(short_lines(1000),)),
    Case("usage values: strings of 3,000 characters", {"/v1/completions": lambda req: json_answer(
        dict(completion_doc(), usage={"prompt_tokens": "7" * 3000,
                                      "completion_tokens": "3" * 3000,
                                      "total_tokens": "x" * 3000}))},
         exit=1, checks=(short_problems(300), short_lines(1000))),
    Case("usage values: strings of 3,000 characters (probe)", {"/v1/completions": sse_answer(
        stream_events(completion_doc())[:-1] + [dict(completion_doc(), choices=[], usage={
            "prompt_tokens": "7" * 3000, "completion_tokens": "3" * 3000})])},
         command="probe", args=("--rounds", "2"), exit=1,
         checks=(short_problems(300), short_lines(1000))),
]

MODELS = [
    Case("/v1/models with 20,000 entries (3 MB)", {"/v1/models": json_answer(models_doc(
         *(model_entry(f"model-{i}") for i in range(20000))))},
         exit=2, completions=0, mem_mib=250, checks=(short_lines(1000), short_problems(1000))),
    Case("--waves 1,64: 64 clients at once, under the 1 GiB cap", args=("--waves", "1,64"),
         exit=0, completions=65, mem_mib=250),
] + [
    Case(f"/v1/models entry {label}", models_with_id(value) if label != "without id" else
         {"/v1/models": json_answer(models_doc({k: v for k, v in model_entry().items()
                                                if k != "id"}))},
         args=args, exit=2, completions=0, time_s=3.0)
    for label, value, args in (("without id", None, ()),
                               ("without id, --model None", None, ("--model", "None")),
                               ("with id 42", 42, ()), ("with id null", None, ()),
                               ("with id a list", ["m"], ()), ("with id an object", {"m": 1}, ()),
                               ("with an empty id", "", ()))
]

JUDGING = [
    Case(f"completion {label}: not a pass", {"/v1/completions": lambda req, c=changes: http(
        200, completion_with(req, **c))}, exit=1, completions=10)
    for label, changes in (
        ("finish_reason 'length\\n'", {"choices": [dict(completion_doc()["choices"][0],
                                                         finish_reason="length\n")]}),
        ("finish_reason ' length'", {"choices": [dict(completion_doc()["choices"][0],
                                                     finish_reason=" length")]}),
        ("completion_tokens 32.0", {"usage": dict(completion_doc()["usage"],
                                                  completion_tokens=32.0)}),
        ("stop_reason ''", {"choices": [dict(completion_doc()["choices"][0], stop_reason="")]}))
]

CLASSES = {
    "guard": GUARD, "tokenize": TOKENIZE, "options": OPTIONS, "framing": FRAMING,
    "nested": NESTED, "report": REPORT, "urls": URLS, "records": RECORDS, "stdout": STDOUT,
    "signals": SIGNALS, "leaks": LEAKS, "models": MODELS, "judging": JUDGING,
}


# ---------------------------------------------------------------------------
# Judging an outcome, and the tests: one method per class of cases.
# ---------------------------------------------------------------------------

def time_bound(case: Case) -> float:
    """The wall-clock bound a case is held to: its quiet-machine bound, made generous."""
    return case.time_s * LOAD_FACTOR + LOAD_MARGIN_S


def problems_of(outcome: Outcome) -> list[str]:
    """Every way the outcome differs from what its case requires; [] when it held."""
    case = outcome.case
    if outcome.error:
        return [f"the harness failed: {outcome.error}"]
    problems = []
    if outcome.timed_out:
        problems.append(f"still running {time_bound(case) + KILL_MARGIN_S:g} s after start: "
                        f"killed")
    allowed = case.exit if isinstance(case.exit, tuple) else (case.exit,)
    if outcome.code not in allowed:
        problems.append(f"exit {outcome.code}, expected {' or '.join(map(str, allowed))}")
    if "Traceback" in outcome.stdout + outcome.stderr:
        problems.append("a traceback reached the operator")
    if outcome.elapsed > time_bound(case):
        problems.append(f"took {outcome.elapsed:.2f} s, bound {time_bound(case):g} s")
    if outcome.peak_mib > case.mem_mib:
        problems.append(f"peak memory {outcome.peak_mib:.0f} MiB, bound {case.mem_mib} MiB")
    summaries = len(outcome.summaries())
    wants_summary = case.summary if case.summary is not None else outcome.code != 2
    if wants_summary and summaries != 1:
        problems.append(f"{summaries} summary records, expected exactly one")
    if not wants_summary and outcome.records_text:
        problems.append("records written on an error found before the run")
    if outcome.damaged_lines > case.damaged:
        problems.append(f"{outcome.damaged_lines} records lines are not JSON")
    problems += [f"missing {f!r} in the output" for f in case.fragments if f not in outcome.output]
    if case.one_of and not any(f in outcome.output for f in case.one_of):
        problems.append(f"none of {list(case.one_of)} in the output")
    if case.completions is not None and len(outcome.completions()) != case.completions:
        problems.append(f"{len(outcome.completions())} completions sent, expected "
                        f"{case.completions}")
    if TEXT_MARKER in outcome.output:
        problems.append("generated text in the output")
    for check in case.checks:
        problems += check(outcome)
    return problems


def run_all(cases: list[Case], root: str, servers: list) -> list[Outcome]:
    """Every case, WORKERS at a time; the order of `cases` is kept."""
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(lambda case: execute(case, root, servers), cases))


def all_cases() -> list[tuple[str, Case]]:
    return [(name, case) for name, cases in CLASSES.items() for case in cases]


class TestHostile(unittest.TestCase):
    """Each method checks one class of hostile inputs; all cases ran once in setUpClass."""
    runs_long = 16                        # seconds on a quiet run: run.py starts it early

    outcomes: dict = {}

    @classmethod
    def setUpClass(cls):
        tmp = tempfile.TemporaryDirectory(prefix="hostile-")
        cls.addClassCleanup(tmp.cleanup)
        servers: list = []
        cls.addClassCleanup(lambda: [server.stop() for server in list(servers)])
        forks = ForkServer(LAUNCH, PRELOAD, dict(clean_env(), MALLOC_ARENA_MAX="2"))
        FORKS.append(forks)
        cls.addClassCleanup(lambda: (FORKS.clear(), forks.stop()))
        pairs = all_cases()
        outcomes = run_all([case for _, case in pairs], tmp.name, servers)
        cls.outcomes = {}
        for (name, _), outcome in zip(pairs, outcomes):
            cls.outcomes.setdefault(name, []).append(outcome)

    def check_class(self, name: str) -> None:
        for outcome in self.outcomes[name]:
            with self.subTest(outcome.case.name):
                problems = problems_of(outcome)
                if problems:
                    self.fail(f"{outcome.case.name}: {'; '.join(problems)}\n"
                              f"    actual: {outcome.describe()}")

    def test_guard_fails_closed_on_unreadable_gauge_lines(self):
        self.check_class("guard")

    def test_tokenize_counts_that_cannot_size_b1(self):
        self.check_class("tokenize")

    def test_options_out_of_range_are_usage_errors(self):
        self.check_class("options")

    def test_malformed_http_framing(self):
        self.check_class("framing")

    def test_deeply_nested_json(self):
        self.check_class("nested")

    def test_report_on_hostile_files(self):
        self.check_class("report")

    def test_urls_and_api_keys(self):
        self.check_class("urls")

    def test_records_destination_unwritable(self):
        self.check_class("records")

    def test_stdout_closed_or_unread(self):
        self.check_class("stdout")

    def test_terminating_signals_give_one_killed_summary(self):
        self.check_class("signals")

    def test_nothing_leaks_or_forges_output(self):
        self.check_class("leaks")

    def test_models_entries_that_are_not_models(self):
        self.check_class("models")

    def test_responses_judged_on_what_the_server_sent(self):
        self.check_class("judging")


def main(argv: list[str]) -> int:
    """--table [TEXT]: run the cases (whose name holds TEXT) and print what each did, held
    or not, with the helper in --launch DIR (default: beside the tests); else the tests."""
    global WARMUP, QUALIFY
    if argv[:1] != ["--table"]:
        return 0 if unittest.main(argv=[sys.argv[0], *argv], exit=False).result \
            .wasSuccessful() else 1
    if "--launch" in argv:
        launch = argv[argv.index("--launch") + 1]
        WARMUP, QUALIFY = os.path.join(launch, "warmup.py"), os.path.join(launch, "qualify.py")
        del argv[argv.index("--launch"):argv.index("--launch") + 2]
    wanted = argv[1] if len(argv) > 1 else ""
    servers: list = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as root:
        pairs = [(name, case) for name, case in all_cases() if wanted in case.name]
        started = time.monotonic()
        try:
            outcomes = run_all([case for _, case in pairs], root, servers)
        finally:
            for server in servers:
                server.stop()
    held = 0
    for (name, case), outcome in zip(pairs, outcomes):
        problems = problems_of(outcome)
        held += not problems
        print(f"{'held' if not problems else 'FAILS':5} [{name}] {case.name}: "
              f"{outcome.describe()}")
        for problem in problems:
            print(f"        - {problem}")
        if "-v" in argv:
            print("        stdout: " + outcome.stdout.replace("\n", "\n        ")[:3000])
            print("        stderr: " + outcome.stderr.replace("\n", "\n        ")[:3000])
    print(f"{held}/{len(outcomes)} cases held in {time.monotonic() - started:.1f} s")
    return 0 if held == len(outcomes) else 1


class TestNoTraceback(HelperCase):
    def test_odd_inputs_give_one_line(self):
        server = HostileServer({"/metrics": metrics_answer(metrics_text(
            'vllm:num_requests_running{engine="\u00b2",model_name="m"} 0.0'))}).start()
        self.addCleanup(server.stop)
        proc = run_script(WARMUP, "--base-url", server.url, "--records", self.records_path,
                   "--deadline-s", "20")
        self.assertNotIn("Traceback", proc.stderr)
        chunk = run_script(WARMUP, "--dry-run", env={"WARMUP_CHUNK_TOKENS": "\u00b2"})
        self.assertEqual(chunk.returncode, 2)
        self.assertIn("WARMUP_CHUNK_TOKENS: must be a whole number", chunk.stderr)


class TestReviewFindings(HelperCase):
    def hostile(self, script: dict) -> HostileServer:
        server = HostileServer(script).start()
        self.addCleanup(server.stop)
        return server

    def helper(self, url: str, *args, env: dict | None = None, records: str | None = None,
               command: list | None = None, **popen) -> subprocess.CompletedProcess:
        argv = (command or [*PYTHON, WARMUP]) + [
            "--base-url", url, "--records", records or self.records_path,
            "--deadline-s", "3", *args]
        popen.setdefault("stderr", subprocess.PIPE)
        return subprocess.run(argv, stdout=subprocess.PIPE, timeout=30, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, **(env or {})), **popen)

    def records_bytes(self) -> bytes:
        with open(self.records_path, "rb") as handle:
            return handle.read()

    def assert_one_summary(self, proc, code: int, path: str | None = None) -> dict:
        out = proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")
        self.assertNotIn("Traceback", out)
        self.assertEqual(proc.returncode, code, out[-500:])
        summaries = [r for r in read_records(path or self.records_path)[0]
                     if r["record"] == "summary"]
        self.assertEqual(len(summaries), 1, out[-500:])
        return summaries[0]

    def test_lone_surrogates_from_the_server_end_with_a_summary(self):
        for name, script in (
                ("500 message", {"/v1/completions": error_answer(500, "boom \ud800 x")}),
                ("stop_reason", {"/v1/completions": lambda r: b"HTTP/1.1 200 OK\r\n"
                                 b"content-type: application/json\r\ncontent-length: %d\r\n\r\n"
                                 % len(body := completion_with(r, choices=[{
                                     "index": 0, "text": "x", "finish_reason": "length",
                                     "stop_reason": "\ud800"}])) + body})):
            with self.subTest(name=name):
                server = self.hostile(script)
                summary = self.assert_one_summary(self.helper(server.url), 1)
                self.assertEqual(summary["verdict"], "fail")
                os.remove(self.records_path)

    def test_a_records_path_that_is_not_utf8_still_gets_its_summary(self):
        server = self.hostile({})
        path = os.fsencode(self.tmp) + b"/r\xff.jsonl"
        proc = subprocess.run([*PYTHON, WARMUP, "--base-url", server.url, "--records",
                               path, "--deadline-s", "3"], capture_output=True, timeout=30)
        self.assert_one_summary(proc, 0, path.decode("utf-8", "surrogateescape"))

    def test_report_reads_a_record_holding_a_lone_surrogate(self):
        run = json.dumps(run_record("a")).replace('"model": "m"', '"model": "m\\ud800"')
        requests = [json.dumps(r) for r in contract_requests("a")]
        requests[0] = requests[0].replace('"warmup-a-B1-0"', '"x\\udc00"')
        requests += [json.dumps(r) for r in wave_records("a")]
        with open(self.records_path, "w", encoding="utf-8") as handle:
            handle.write("\n".join([run, *requests, json.dumps(summary_record("a", "pass", 0))])
                         + "\n")
        proc = subprocess.run([*PYTHON, QUALIFY, "report", self.records_path],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertIn("verdict: pass", proc.stdout)

    def test_fifos_are_refused_not_waited_on(self):
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        started = time.monotonic()
        proc = subprocess.run([*PYTHON, QUALIFY, "report", fifo], capture_output=True,
                              text=True, timeout=30)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("is not a regular file", proc.stderr)
        self.assertLess(time.monotonic() - started, 5)
        # A status file that is a FIFO someone keeps open and writes to: not read, said.
        holder = os.open(fifo, os.O_RDWR)
        self.addCleanup(os.close, holder)
        stop = threading.Event()
        self.addCleanup(stop.set)

        def writer():
            while not stop.wait(0.1):
                try:
                    os.write(holder, b'{"pid": 1}\n')
                except BlockingIOError:
                    pass
        os.set_blocking(holder, False)
        threading.Thread(target=writer, daemon=True).start()
        server = self.hostile({})
        started = time.monotonic()
        proc = self.helper(server.url, "--status-file", fifo, "--status-wait-s", "1")
        self.assertLess(time.monotonic() - started, 5)
        self.assert_one_summary(proc, 0)
        (status,) = [r for r in read_records(self.records_path)[0] if r["record"] == "status"]
        self.assertEqual(status["state"], "incomplete")
        self.assertIn("not a regular file", status["why"])

    def test_wrapper_with_a_stdout_nobody_reads_exits_cleanly(self):
        server = self.hostile({"/v1/completions": error_answer(500, "x" * 270)})
        read_end, write_end = os.pipe()
        self.addCleanup(os.close, read_end)
        fcntl.fcntl(write_end, 1031, 4096)   # F_SETPIPE_SZ
        proc = subprocess.Popen(["bash", WRAPPER, "--base-url", server.url, "--records",
                                 self.records_path, "--deadline-s", "3", "--waves",
                                 "1,2,3,4,5,6,7,8"], stdout=write_end, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=dict(os.environ, WARMUP_HARD_S="10"))
        os.close(write_end)
        self.addCleanup(proc.kill)
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 1, err.decode()[-400:])
        self.assertNotIn(b"Fatal Python error", err)
        self.assertEqual([r["record"] for r in read_records(self.records_path)[0]].count(
            "summary"), 1)

    def test_json_with_an_unwritable_stderr_still_prints_its_json(self):
        server = self.hostile({})
        with open("/dev/full", "w") as full:
            proc = self.helper(server.url, "--json", stderr=full)
        self.assertEqual(proc.returncode, 0)
        self.assertEqual(json.loads(proc.stdout)["verdict"], "pass")
        proc = self.helper(server.url, "--json", stderr=subprocess.DEVNULL,
                           records=os.path.join(self.tmp, "closed.jsonl"),
                           command=["bash", "-c", 'exec 2>&-; exec "$@"', "_", sys.executable,
                                    WARMUP])
        self.assertEqual(json.loads(proc.stdout)["verdict"], "pass")

    def test_a_key_is_never_shown_in_part(self):
        key = "sk-" + "Z9q" * 10
        echo = {"/v1/completions": lambda r: error_answer(
            500, " " * 19180 + (r.header("authorization") or "")[len("Bearer "):])}
        proc = self.helper(self.hostile(echo).url, env={"VLLM_API_KEY": key})
        shown = proc.stdout + proc.stderr + self.records_bytes()
        self.assertNotIn(b"Z9qZ9q", shown)
        os.remove(self.records_path)
        key = "sk-Sec\\ret-7777"
        finish = {"/v1/completions": lambda r: json_answer(json.loads(completion_with(
            r, choices=[{"index": 0, "text": "x", "finish_reason": key + "\n",
                         "stop_reason": None}])))}
        proc = self.helper(self.hostile(finish).url, env={"VLLM_API_KEY": key})
        self.assertEqual(proc.returncode, 1)
        shown = (proc.stdout + proc.stderr + self.records_bytes()).decode()
        self.assertNotIn("Sec", shown)

    def test_a_password_is_not_quoted_by_a_url_error(self):
        proc = subprocess.run([*PYTHON, WARMUP, "--base-url",
                               "http://admin:Hunter2secret/x@127.0.0.1:9", "--dry-run"],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 2)
        self.assertNotIn("Hunter2secret", proc.stdout + proc.stderr)
        self.assertIn("--base-url is not a valid URL", proc.stderr)

    def test_an_ascii_terminal_still_gets_the_verdict(self):
        server = self.hostile({"/v1/models": json_answer({"object": "list", "data": [
            {"id": "mod\u00e8le", "object": "model", "max_model_len": 32768}]})})
        proc = self.helper(server.url, env={"PYTHONIOENCODING": "ascii"})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(b"model mod?le", proc.stdout)
        self.assertIn(b"PASS (exit 0)", proc.stdout)

    def test_probe_text_echoed_by_a_server_is_removed_whole(self):
        passage = next(p for p in gate.PROBES if p.kind == "passage")
        start = passage.reference.index(" ") + 1
        echoed = "cannot process: " + passage.reference[start:start + 280]
        scrubbed = gate_scrubbed(echoed)
        words = re.findall(r"\w+", passage.reference)
        runs = {" ".join(words[i:i + 3]) for i in range(len(words) - 2)}
        shown = " ".join(re.findall(r"\w+", scrubbed))
        self.assertFalse([run for run in runs if run in shown], scrubbed)
        self.assertTrue(scrubbed.startswith("cannot process: [prompt text]"), scrubbed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


FORKED_SCRIPTS = {        # name -> (script, env): each run as python3 -S and by the fork server
    "exit 3, both streams": ("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                             "sys.exit(3)\n", {}),
    "a traceback": ("raise ValueError('boom')\n", {}),
    "a message exit": ("import sys\nsys.exit('said')\n", {}),
    "a thread that ends late": ("import threading, time\nthreading.Thread(target=lambda: "
                                "(time.sleep(0.2), print('late', flush=True))).start()\n", {}),
    "argv, path, env, cap": ("import os, resource, sys\nprint(sys.argv[1:], sys.path[0] == "
                             "os.path.dirname(os.path.abspath(__file__)), os.environ.get('X'), "
                             "os.environ.get('WARMUP_X'), resource.getrlimit("
                             "resource.RLIMIT_AS)[0] == 1 << 30, __name__)\n", {"X": "1"}),
}


class TestForkServer(unittest.TestCase):
    """The table's fork server runs a script as a real `python3 -S` does: the same exit
    status, the same streams (a traceback: its last line), threads waited for."""

    def test_a_forked_run_is_a_real_one(self):
        tmp = self.enterContext(tempfile.TemporaryDirectory())
        forks = ForkServer(LAUNCH, [], clean_env())
        self.addCleanup(forks.stop)
        for name, (script, env) in FORKED_SCRIPTS.items():
            path = os.path.join(tmp, "script.py")
            with open(path, "w") as handle:
                handle.write(script)
            runs = []
            for forked in (False, True):
                with open(os.path.join(tmp, "out"), "w+b") as out, \
                        open(os.path.join(tmp, "err"), "w+b") as err:
                    argv = [path, "a b", "c"]
                    if forked:
                        pid = forks.spawn(argv, dict(clean_env(), **env), out, err, AS_LIMIT)
                        status = wait_ended(pid, lambda: forks.status(pid), 10)[0]
                        code = os.waitstatus_to_exitcode(status)
                    else:
                        code = reap(spawn(argv, dict(clean_env(), **env), out, err), 10)[0]
                    out.seek(0)
                    err.seek(0)
                    runs.append((code, out.read(), err.read().splitlines()[-1:]))
            with self.subTest(name):
                self.assertEqual(runs[0], runs[1])
