"""Shared test support: a fake server per test, the helper run in-process or as a process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from dataclasses import dataclass
from unittest import mock

TESTS = os.path.dirname(os.path.abspath(__file__))
LAUNCH = os.path.dirname(TESTS)
REPO = os.path.dirname(os.path.dirname(LAUNCH))
WARMUP = os.path.join(LAUNCH, "warmup.py")
QUALIFY = os.path.join(LAUNCH, "qualify.py")
WRAPPER = os.path.join(LAUNCH, "warmup_serve.sh")
START = os.path.join(REPO, "start.sh")
FAKE = os.path.join(TESTS, "serve_fake.py")        # fake_vllm.py as a process
# How a test runs a Python program: as the wrapper runs the helper, without site (the
# product and the fake are standard library only), which also spares each of several
# hundred processes the site-packages' start-up (.pth files that import packages).
PYTHON = (sys.executable, "-S")
# What the tests start (start.sh, the wrapper) finds `python3` on PATH: the interpreter that
# runs the tests, first (a version manager's shim, a shell script, costs each ~50 ms of CPU).
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable),
                                      os.environ.get("PATH", "")])

if LAUNCH not in sys.path:
    sys.path.insert(0, LAUNCH)

import core.contract as contract  # noqa: E402
import qualify  # noqa: E402
import core.sanitize as sanitizing  # noqa: E402
import core.vllm_client as vllm_client  # noqa: E402
import warmup  # noqa: E402
from fake_vllm import TEXT_MARKER, TOKEN_ID_MARKER, FakeConfig, FakeServer  # noqa: E402
from start.processes import group_alive  # noqa: E402
from tools.procfs import listening_inodes  # noqa: E402

API_KEY = "sk-KEYMARKER-5d1f0c"


def decide_held(run: dict, found: list[dict], ending):
    """contract.decide() on records as readback gives them: held to their declarations
    first (records.held()), those left out failing the run."""
    import core.records as records
    kept, unread = records.held([run] + [r for r in found if r is not run])
    runs = [r for r in kept if r.record == "run"]
    return contract.decide(runs[-1] if runs else None, kept, ending, unread)


def recorded_plan(plan: dict):
    """A run record's plan as held (records.held() types it): what contract.read_plan reads."""
    import core.records as records
    return records.shaped(plan, records.SHAPED["plan"])


PACKAGES = ("core", "tools", "start")       # the folder's packages, beside the entry points


def product_files() -> list[str]:
    """The rollback unit: every file of offload/launch/ and its packages but the tests (and
    caches)."""
    found = []
    for folder in ("",) + PACKAGES:
        path = os.path.join(LAUNCH, folder)
        found += [os.path.join(path, name) for name in os.listdir(path)
                  if os.path.isfile(os.path.join(path, name))]
    return sorted(found)


def copy_product(folder: str, leave_out: tuple = ()) -> str:
    """The product's files copied into `folder` (created) with its packages, as an operator
    copies them; `leave_out` names files by their path in the folder (core/runframe.py)."""
    import shutil
    for source in product_files():
        relative = os.path.relpath(source, LAUNCH)
        if relative not in leave_out and os.path.basename(relative) not in leave_out:
            os.makedirs(os.path.join(folder, os.path.dirname(relative)), exist_ok=True)
            shutil.copy(source, os.path.join(folder, relative))
    return folder


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    records: list[dict]
    elapsed: float
    records_text: str = ""

    def kind(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["record"] == kind]

    @property
    def summary(self) -> dict:
        summaries = self.kind("summary")
        assert len(summaries) == 1, f"expected one summary record, got {len(summaries)}"
        return summaries[0]

    @property
    def requests(self) -> list[dict]:
        return self.kind("request")


def read_records(path: str) -> tuple[list[dict], str]:
    if not os.path.exists(path):
        return [], ""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return [json.loads(line) for line in text.splitlines() if line.strip()], text


class HelperCase(unittest.TestCase):
    """A test with a temp dir, fake servers stopped at teardown, and the helper at hand."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.records_path = os.path.join(self.tmp, "records.jsonl")
        # Proxies in the developer's environment must not matter (a test sets its own).
        patcher = mock.patch.dict(os.environ, {}, clear=False)
        patcher.start()
        self.addCleanup(patcher.stop)
        for name in ("VLLM_API_KEY", "WARMUP_MODEL", "WARMUP_BASE_URL", "WARMUP_RECORDS_DIR",
                     "WARMUP_HARD_S", "WARMUP_TEXTFILE", "WARMUP_ENGINES", "WARMUP_LOCK_DIR"):
            os.environ.pop(name, None)
        # What an earlier test's run registered (its prompts, keys) must not colour this
        # one's output: in production one process is one run.
        sanitizing.REDACTIONS.reset()
        # The servers' lock files go with the test (a test's port is not used again);
        # the helpers it starts, in or out of this process, share this folder.
        os.environ["WARMUP_LOCK_DIR"] = self.tmp
        # The scripts under test (start.sh, the wrapper) run `python3`: let that be the
        # interpreter running the tests, not a version manager's shim in front of it.
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + \
            os.environ.get("PATH", "")

    def start_fake(self, **settings) -> FakeServer:
        server = FakeServer(FakeConfig(**settings)).start()
        self.addCleanup(server.stop)
        return server

    def run_helper(self, server_or_url, *args: str, env: dict | None = None) -> Result:
        """A warm-up against the server, in this process, records in the test's file (after
        those of the test's earlier runs: --append)."""
        url = server_or_url if isinstance(server_or_url, str) else server_or_url.url
        return self.run_argv(["--base-url", url, "--records", self.records_path, "--append",
                              *args], env)

    def run_argv(self, argv: list[str], env: dict | None = None, main=None) -> Result:
        """warmup.main(argv) (or another main) in this process (run_main), with its records."""
        started = time.monotonic()
        answered = run_main(main or warmup.main, *argv, env=env)
        elapsed = time.monotonic() - started
        records, text = read_records(self.records_path)
        return Result(answered.returncode, answered.stdout, answered.stderr, records, elapsed,
                      text)

    def run_process(self, command: list[str], env: dict | None = None, timeout: float = 60,
                    records: str | None = None) -> Result:
        """A real subprocess (the helper, the wrapper, start.sh), bounded in time."""
        started = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL)
        elapsed = time.monotonic() - started
        found, text = read_records(records or self.records_path)
        return Result(proc.returncode, proc.stdout, proc.stderr, found, elapsed, text)

    def start_helper_process(self, server: FakeServer, *args: str) -> subprocess.Popen:
        """The helper as a real process against `server`; killed and reaped at cleanup."""
        proc = subprocess.Popen([*PYTHON, WARMUP, "--base-url", server.url,
                                 "--records", self.records_path, "--append", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.communicate)      # cleanups run last-first: kill, then reap
        self.addCleanup(proc.kill)
        return proc

    def wait_for_completions(self, server: FakeServer, count: int) -> None:
        """Until the server has received `count` completions (20 s at most), then a moment."""
        deadline = time.monotonic() + 20
        while len(server.state.completions()) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertGreaterEqual(len(server.state.completions()), count)
        time.sleep(0.2)

    def assert_no_leak(self, server: FakeServer | None, *texts: str) -> None:
        """No generated text, token id, prompt text or key in any of `texts`."""
        forbidden = [TEXT_MARKER, str(TOKEN_ID_MARKER), API_KEY, "lorem"]
        if server is not None:
            for entry in server.state.requests:
                prompt = (entry["body"] or {}).get("prompt") if isinstance(entry["body"], dict) \
                    else None
                if prompt:
                    forbidden.append(prompt.split()[0])        # the nonce or the prompt's tag
                    forbidden.append(" ".join(prompt.split()[1:6]))
        for text in texts:
            for marker in forbidden:
                self.assertNotIn(marker, text, f"leaked {marker!r}")

    def assert_clean(self, server: FakeServer | None, result: Result) -> None:
        self.assert_no_leak(server, result.stdout, result.stderr, result.records_text)


class SilentServer:
    """Accepts connections on 127.0.0.1 and never answers (nor reads); closed at cleanup."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.accepted = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            self.accepted.append(conn)

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=5)
        for conn in self.accepted:
            conn.close()
        self.listener.close()


def send_completion(url: str, request_id: str, answers: list, prompt: str = "p",
                    key: str | None = None) -> None:
    """One short completion to the server at `url`, as a producer sends it (with `key` as
    its bearer); its HTTP status (or the error's name) appended to `answers`."""
    import urllib.error
    import urllib.request
    body = json.dumps({"model": "fake-model", "prompt": prompt, "max_tokens": 4,
                       "request_id": request_id}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + "/v1/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answers.append(answer.status)
    except urllib.error.HTTPError as exc:
        answers.append(exc.code)
    except OSError as exc:
        answers.append(type(exc).__name__)


def requests_running(url: str) -> float:
    """vllm:num_requests_running as the server at `url` says it now (every engine's)."""
    import urllib.request
    with urllib.request.urlopen(url + "/metrics", timeout=5) as got:
        return sum(float(line.split()[-1]) for line in got.read().decode().splitlines()
                   if line.startswith("vllm:num_requests_running"))


def wait_running(url: str, count: int, steady_s: float = 0.0, seconds: float = 30) -> None:
    """Until `count` requests run on the server at `url` (its /metrics) and have for
    `steady_s` (a slow fault's request lasts 5 s, a warm-up's 10 ms), `seconds` at most."""
    deadline, since = time.monotonic() + seconds, None
    while True:
        now = time.monotonic()
        since = (since or now) if requests_running(url) == count else None
        if since is not None and now - since >= steady_s:
            return
        if now > deadline:
            raise AssertionError(f"{count} requests running for {steady_s} s within {seconds} s")
        time.sleep(0.05)


# Ports the tests hand out: below Linux's ephemeral range (32768 and up), so no connection's
# local end is given one (nor connects to itself on one a server has not bound yet), and a
# block of them per class process, claimed by holding the block's first port bound while
# the process lives: no other class process, of this run or of another run on the machine,
# is handed the port a test is about to bind. run.py's slot (OFFLOAD_TEST_SLOT, else the
# pid) says which block to try first.
FIRST_PORT, PORTS_PER_CLASS, BLOCKS = 20000, 60, 212
_claimed: dict = {}                         # pid -> (the socket holding the block, its port)
_handed = [0]


def port_block() -> int:
    """The first port of this process's block, claimed at the first call."""
    if os.getpid() not in _claimed:
        slot = os.environ.get("OFFLOAD_TEST_SLOT", "")
        start = int(slot) if slot.isdigit() else os.getpid()
        for block in range(start, start + BLOCKS):
            first = FIRST_PORT + block % BLOCKS * PORTS_PER_CLASS
            holder = socket.socket()
            try:
                holder.bind(("127.0.0.1", first))      # no SO_REUSEADDR: nobody else may
            except OSError:
                holder.close()
                continue                               # another class process's
            _claimed[os.getpid()] = holder, first
            break
        else:
            raise AssertionError(f"every block of test ports from {FIRST_PORT} is taken")
    return _claimed[os.getpid()][1]


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, from this class process's own block."""
    first = port_block() + 1                    # the block's first port is its claim
    count = PORTS_PER_CLASS - 1
    for _ in range(count):
        port = first + _handed[0] % count
        _handed[0] += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue                  # another program's, or a server still on it
            return port
    raise AssertionError(f"no free port in {first}-{first + count - 1}")


# ---------------------------------------------------------------------------
# Records as the programs write them (records.py's declarations), for crafted files.
# ---------------------------------------------------------------------------

GOOD_ANSWER = {"http_status": 200, "choices": 1, "usage": True, "body_error": None,
               "prompt_tokens": 5000, "cached_tokens": None, "completion_tokens": 32,
               "reasoning_tokens": None, "finish_reason": "length", "stop_reason": None,
               "stream_done": None, "first_token": None, "logprobs_count": None,
               "usage_problems": [], "error": None}
CONTRACT_PLAN = dict(contract.plan_record(contract.REVIEWED), engines_skipped=[])


class StartCase(HelperCase):
    """start.sh as a process against a fake server on a free port; its group killed at
    cleanup."""

    def setUp(self):
        super().setUp()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = os.path.join(self.tmp, "logs")
        self.ready = os.path.join(self.tmp, "ready")
        self.addCleanup(self.stop_server)

    def stop_server(self):
        pid_file = os.path.join(self.logs, "server.pid")
        if os.path.exists(pid_file):
            with open(pid_file) as handle:
                pid = int(handle.read().strip() or 0)
            if pid and group_alive(pid):
                os.killpg(pid, signal.SIGKILL)
                # Gone, so the port and pid are free: a killed server's leader shows as a
                # zombie while its last thread may still hold the listening socket.
                deadline = time.monotonic() + 5
                while (group_alive(pid) or listening_inodes(self.port)) and \
                        time.monotonic() < deadline:
                    time.sleep(0.02)

    def server_pid(self) -> int:
        with open(os.path.join(self.logs, "server.pid")) as handle:
            return int(handle.read())

    def fake(self, *args: str) -> list[str]:
        return [*PYTHON, FAKE, "--port", str(self.port), "--latency-s", "0.01", *args]

    def start(self, *args: str, server: list[str], env: dict | None = None, timeout=90,
              script: str = START):
        command = ["bash", script, "--base-url", self.url, "--log-dir", self.logs, *args, "--",
                   *server]
        return self.run_process(command, env=dict({"START_POLL_S": "0.2",
                                                   "START_STOP_GRACE_S": "3"}, **(env or {})),
                                timeout=timeout, records=self.records())

    def refused(self, *args: str, env: dict | None = None) -> Result:
        """launcher.main() in this process, for a start refused before anything is launched
        (a usage error): its exit code and output; the environment is this test's plus env."""
        import launcher
        out, err = io.StringIO(), io.StringIO()
        started = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = launcher.main(list(args), dict(os.environ, **(env or {})))
        return Result(code, out.getvalue(), err.getvalue(), [], time.monotonic() - started, "")

    def records(self) -> str:
        if not os.path.isdir(self.logs):
            return os.path.join(self.tmp, "none")
        found = sorted(f for f in os.listdir(self.logs) if f.startswith("warmup-"))
        return os.path.join(self.logs, found[-1]) if found else os.path.join(self.tmp, "none")

    def start_log(self) -> str:
        with open(os.path.join(self.logs, "start.log"), encoding="utf-8") as handle:
            return handle.read()


def run_script(*argv: str, env: dict | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess:
    """A product script (warmup.py, qualify.py) as a process, its output as text."""
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def run_main(main, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A program's main(ARGV) in this process (exit status, stdout and stderr as its
    process's), for what it says; what only a process shows (its start, its signals, a
    closed stdout, a memory cap) is tested by starting one."""
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess([main.__module__, *argv], code, out.getvalue(),
                                       err.getvalue())


def run_qualify(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`qualify.py ARGV` answered in this process (run_main)."""
    return run_main(qualify.main, *argv, env=env)


def run_record(run_id: str, requests: int = 10, mode: str = "warmup", **plan) -> dict:
    """A run record of format 2 announcing `requests` requests (the contract's plan)."""
    base = dict(CONTRACT_PLAN) if mode == "warmup" else {"tokens": 32, "max_tokens": 2048,
                                                         "max_cer": 0.01, "max_typos": 0}
    return {"record": "run", "run_id": run_id, "mode": mode, "format": 2,
            "started_at": "2026-12-01T00:00:00.000Z", "base_url": "http://127.0.0.1:8000",
            "model": "m", "max_model_len": 32768, "engines": None,
            "plan": dict(base, requests_total=requests, requests_per_engine=requests,
                         **dict({"deadline_s": 90.0}, **plan)),
            "versions": {}, "process_start_time_seconds": 1.0, "api_key_env": "VLLM_API_KEY",
            "api_key_set": False, "pid": 1}


def request_record(run_id: str, index: int, wave: str = "B1", **changes) -> dict:
    """A greedy request record whose fields pass the contract's rules (unless changed)."""
    return dict({"record": "request", "run_id": run_id,
                 "request_id": f"warmup-{run_id}-{wave}-{index}",
                 "request_kind": "long" if wave == "B1" else "greedy",
                 "wave": wave, "depth": int(wave[1:]) if wave[1:].isdigit() else 1,
                 "index": index, "engine": None, **GOOD_ANSWER, "latency_s": 0.1,
                 "sent_at_s": 0.1, "ok": True, "problems": [], "metrics": None,
                 "speculative_decoding": None}, **changes)


def contract_requests(run_id: str, **changes) -> list[dict]:
    """The ten request records of the contract's plan (B1 to B4), each passing."""
    return [request_record(run_id, index, f"B{depth}", **changes)
            for depth in (1, 2, 3, 4) for index in range(depth)]


def wave_records(run_id: str, names=("B1", "B2", "B3", "B4"), engine=None,
                 engines=(0,)) -> list[dict]:
    """For each named wave (its depth from its name's last number) the guard's read
    before it, both gauges 0 on `engines`, then its wave record."""
    found = []
    for name in names:
        found.append(gauges_record(run_id, name, engines))
        found.append({"record": "wave", "run_id": run_id, "wave": name,
                      "depth": int(name.rsplit("-", 1)[-1].lstrip("B")), "engine": engine,
                      "release_skew_ms": 0.1, "batch_release_skew_ms": 0.1, "duration_s": 0.5,
                      "started_at_s": 1.0, "released_at": None, "last_answer_at": None,
                      "ok": True, "requests_ok": int(name.rsplit("-", 1)[-1].lstrip("B")),
                      "problems": []})
    return found


def gauges_record(run_id: str, wave: str, engines=(0,), value: float = 0.0) -> dict:
    """A guard read as the warm-up records it: both request gauges at `value` on each
    engine."""
    return {"record": "gauges", "run_id": run_id, "wave": wave, "at_s": 0.1, "ok": value == 0,
            "samples": [{"name": gauge, "labels": {"engine": str(e), "model_name": "m"},
                         "value": value} for gauge in ("vllm:num_requests_running",
                                                       "vllm:num_requests_waiting")
                        for e in engines],
            "fresh_engines": [], "settle_s": None, "problems": []}


def gate_record(run_id: str, index: int, **changes) -> dict:
    """A gate record of an identifier copied exactly."""
    return dict({"record": "gate", "run_id": run_id, "request_id": f"gate-{run_id}-{index}",
                 "request_kind": "copy", "probe": "id_repo", "kind": "identifier",
                 "shape": "alone", "index": index, "engine": None, **GOOD_ANSWER,
                 "exact": True, "edit_distance": 0, "reference_chars": 10, "answer_chars": 10,
                 "cer": 0.0, "word_errors": None, "reference_words": None,
                 "preamble_chars": 0, "removed": [], "latency_s": 0.1, "sent_at_s": 0.1,
                 "ok": True, "problems": []}, **changes)


def summary_record(run_id: str, verdict: str, exit_code: int, **changes) -> dict:
    return dict({"record": "summary", "run_id": run_id, "verdict": verdict,
                 "exit_code": exit_code, "elapsed_s": 1.0, "deadline_s": 90.0, "problems": [],
                 "records": "r.jsonl"}, **changes)


def gate_scrubbed(message: str) -> str | None:
    """A server's error message as a gate's record keeps it: the gate registers its
    identifiers as secrets and each probe's prompt (Gate(), make_slot()), and the one
    scrub of a server's message (vllm_client.extract_fields) does the rest."""
    import tools.gate as gate
    sanitizing.REDACTIONS.reset()
    try:
        for _, identifier in gate.IDENTIFIERS:
            sanitizing.REDACTIONS.secret(identifier)
        for probe in gate.PROBES:
            sanitizing.REDACTIONS.prompt(gate.gate_prompt(probe.reference, "chat"), tag=False)
        body = json.dumps({"error": {"message": message}}).encode()
        return vllm_client.extract_fields(400, body)["error"]
    finally:
        sanitizing.REDACTIONS.reset()
