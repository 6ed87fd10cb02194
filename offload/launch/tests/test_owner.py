"""The readiness owner (start.sh --supervise, start/owner.py): its table, held to
CONTRACT §12 row by row; and each finding of issue 53 driven through real processes (the
real start.sh, the fake server, real files, a real TERM, the owner's GET /ready).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import types
import unittest
import urllib.error
import urllib.request

from support import START, StartCase, free_port, read_records, send_completion, wait_running
import start.owner as owner  # noqa: E402
from start.processes import group_alive  # noqa: E402
import warmup  # noqa: E402

CONTRACT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "CONTRACT.md")


def table_rows() -> list[list[str]]:
    """CONTRACT §12's readiness table: its rows, cell by cell."""
    with open(CONTRACT, encoding="utf-8") as handle:
        text = handle.read()
    section = text[text.index("## 12."):text.index("## 13.")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def names(cell: str) -> tuple[str, ...]:
    """The `names` of a cell, in order."""
    return tuple(re.findall(r"`([^`]+)`", cell))


class TestTheTable(unittest.TestCase):
    def test_every_row_of_the_contract_is_a_move_of_the_code(self):
        rows = table_rows()
        self.assertEqual([names(row[0])[0] for row in rows], list(owner.MOVES))
        for event, seen_by, leaves, enters, published in rows:
            event = names(event)[0]
            with self.subTest(event=event):
                expected = owner.STATES[:-1] if leaves == "every state" else names(leaves)
                self.assertEqual(owner.MOVES[event], (tuple(expected), names(enters)[0]))
                for state in owner.STATES:         # walked: from each state, or not at all
                    self.assertEqual(owner.move(state, event),
                                     names(enters)[0] if state in expected else None)
                self.assertTrue(seen_by and published)

    def test_ready_only_in_warm_and_stopping_is_the_end(self):
        self.assertEqual([s for s in owner.STATES if any(
            to == s for _, to in owner.MOVES.values())], list(owner.STATES[1:]))
        self.assertEqual([e for e in owner.MOVES if owner.move("stopping", e)], [])
        self.assertEqual(owner.move("warm", "passed"), None, "a pass never re-enters warm")

    def test_how_a_stop_went_for_the_requests_in_flight(self):
        cases = [((0, None, 1.5, False), "drained"), ((4, 30.0, 28.5, False), "drained"),
                 ((2, None, 0.7, False), "cut"), ((2, 0.0, 0.7, False), "cut"),
                 ((2, 30.0, 35.0, False), "unknown"), ((None, None, 1.0, False), "unknown"),
                 ((None, 30.0, 3.0, False), "drained"), ((0, 30.0, 50.0, True), "drained"),
                 ((2, 30.0, 50.0, True), "cut")]
        for args, outcome in cases:
            with self.subTest(args=args):
                self.assertEqual(owner.stop_outcome(*args)[0], outcome)
        self.assertIn("2 requests in flight at the TERM, no --shutdown-timeout",
                      owner.stop_outcome(2, None, 0.7, False)[1])

    def test_time_to_warm_is_published_for_a_pass_only(self):
        summary = {"time_to_warm": {"start_to_healthy_s": 3.0, "healthy_to_warm_s": 4.0,
                                    "start_to_warm_s": 7.0}}
        for verdict, count in (("pass", 3), ("refused", 0), ("fail", 0), ("killed", 0)):
            with self.subTest(verdict=verdict):
                samples = warmup.exported_samples((None,), [], 10, dict(summary,
                                                                        verdict=verdict), 1.0)
                self.assertEqual(sum(s[0].endswith("warm_seconds") or "to_healthy" in s[0]
                                     for s in samples), count)


class TestRetries(unittest.TestCase):
    """A refused warm-up's retry belongs to the refused state alone (from a hostile review:
    a retry still due after a re-warm had made the pod warm ran a warm-up against the
    serving pod, and the end of its budget published fail while /ready said warm)."""

    def owner(self, launched_s_ago: float = 0.0):
        settings = types.SimpleNamespace(start_guard_s=600, ready_file="", textfile="",
                                         command_shutdown_s=lambda: None)
        server = types.SimpleNamespace(launched_at=time.monotonic() - launched_s_ago, pid=0,
                                       status=None)
        said: list = []
        held = owner.Owner(settings, server, said.append, {}, "")
        held.warm = lambda: said.append("a warm-up")
        held.publish = lambda verdict, status: said.append(f"published {verdict}")
        return held, said

    def test_leaving_refused_cancels_its_retry(self):
        for event, state in (("asked", "rewarming"), ("slept", "asleep"),
                             ("failed", "failed")):
            with self.subTest(event=event):
                held, said = self.owner()
                held.state, held.retry_at = "refused", time.monotonic()
                self.assertTrue(held.go(event))
                self.assertEqual((held.state, held.retry_at), (state, None))

    def test_a_retry_due_outside_refused_runs_and_publishes_nothing(self):
        for state in ("warm", "asleep", "rewarming"):
            for budget_s in (100, -1):          # within the start guard, and past it
                with self.subTest(state=state, budget_s=budget_s):
                    held, said = self.owner()
                    held.state, held.budget_until = state, time.monotonic() + budget_s
                    held.retry()
                    self.assertEqual((held.state, said), (state, []))

    def test_the_retries_budget_is_the_start_guard_from_the_launch(self):
        held, said = self.owner(launched_s_ago=590)            # a slow /health: 590 s of 600
        self.assertLess(held.budget_until - time.monotonic(), 11)
        held.state = "refused"
        held.retry()
        self.assertEqual(held.state, "warming")                  # still within: retried
        self.assertEqual(said[-1], "a warm-up")
        held, said = self.owner(launched_s_ago=601)
        held.state = "refused"
        held.retry()
        self.assertEqual((held.state, said[-1]), ("failed", "published fail"))

    def test_a_retry_the_start_guard_ends_before_is_not_promised(self):
        # It said "retried in 2 s, within the 600 s start guard" with 1 s of it left, and
        # gave up 1 s after the guard.
        held, said = self.owner(launched_s_ago=590)            # 10 s left: 2 s, then 4 s
        held.state = "refused"
        owner.plan_retry(held)
        self.assertEqual(said[-1], "warm-up refused (1): retried in 2 s, within the 600 s "
                                   "start guard")
        held, said = self.owner(launched_s_ago=598.5)          # 1.5 s left: before 2 s
        owner.plan_retry(held)
        self.assertRegex(said[-1], r"^warm-up refused \(1\): the 600 s start guard ends in "
                                   r"1\.\d s, before a retry could \(2 s\): failed then$")
        self.assertAlmostEqual(held.retry_at, held.budget_until)
        held, said = self.owner(launched_s_ago=700)            # past it: failed at once
        held.state = "refused"
        owner.plan_retry(held)
        self.assertEqual(said[-1], "warm-up refused (1): the 600 s start guard has ended: "
                                   "failed now")
        self.assertLessEqual(held.retry_at, time.monotonic())
        held.retry()
        self.assertEqual((held.state, said[-2:]), ("failed", [
            "readiness: refused -> failed (failed: refused 1 time, no retry after the 600 s "
            "start guard; warm it again: start.sh --rewarm)", "published fail"]))

    def test_a_re_warm_or_a_wake_counts_its_refusals_from_none(self):
        held, said = self.owner()
        held.state, held.refusals, held.backoff = "refused", 3, 16
        self.assertTrue(held.go("asked"))
        self.assertEqual((held.refusals, held.backoff), (0, owner.RETRY_FIRST_S))


class TestAskOwner(unittest.TestCase):
    def test_an_owner_that_never_answers_is_said_when_the_wait_runs_out(self):
        # From a hostile review: the wait running out ended --rewarm with exit 1 and nothing.
        import socket
        import tempfile
        folder = self.enterContext(tempfile.TemporaryDirectory())
        listener = socket.socket(socket.AF_UNIX)
        self.addCleanup(listener.close)
        listener.bind(os.path.join(folder, owner.SOCKET_NAME))
        listener.listen(1)                          # accepted by the kernel, never answered
        said: list = []
        started = time.monotonic()
        self.assertEqual(owner.ask_owner(folder, 0.5, said.append), 1)
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(said, ["start.sh --rewarm: the owner gave no outcome (none within "
                                "0.5 s): see start.log"])


class OwnerCase(StartCase):
    """start.sh --supervise against the fake as a process, its GET /ready on a free port."""

    runs_long = 12

    def setUp(self):
        super().setUp()
        self.ready_port = free_port()
        self.textfile = os.path.join(self.tmp, "offload.prom")

    def supervised(self, *fake: str, env: dict | None = None,
                   ready_file: bool = True) -> subprocess.Popen:
        command = ["bash", START, "--base-url", self.url, "--log-dir", self.logs,
                   "--textfile", self.textfile, "--supervise",
                   *(["--ready-file", self.ready] if ready_file else []), "--",
                   *self.fake(*fake)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, START_POLL_S="0.2", START_STOP_GRACE_S="5",
                                         START_READY_PORT=str(self.ready_port), **(env or {})),
                                start_new_session=True)
        self.addCleanup(lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
        return proc

    def answer(self) -> tuple[int, str]:
        """GET /ready: (status, body); (0, why) when nothing answers."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ready_port}/ready",
                                        timeout=5) as got:
                return got.status, got.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def wait_for(self, condition, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.05)
        self.fail(f"{what} within {seconds} s; start.log:\n{self.log_text()}")

    def read_textfile(self) -> str:
        with open(self.textfile, encoding="utf-8") as handle:
            return handle.read()

    def textfile_says(self, verdict: str) -> str:
        """The textfile once it publishes `verdict` (10 s at most): the owner publishes a
        move just after it logs it."""
        line = f'offload_warmup_last_run_verdict{{verdict="{verdict}"}} 1.0'
        self.wait_for(lambda: line in self.read_textfile(), 10, f"the textfile says {verdict}")
        return self.read_textfile()

    def log_text(self) -> str:
        try:
            with open(os.path.join(self.logs, "start.log"), encoding="utf-8") as handle:
                return handle.read()
        except OSError:
            return ""

    def ready_answer(self, status: int, seconds: float = 60) -> None:
        self.wait_for(lambda: self.answer()[0] == status, seconds, f"GET /ready {status}")

    def b4_guards(self) -> int:
        """The guard reads before B4 in the log folder's records (each warm-up's), whole
        lines only: a line being written is not read."""
        found = 0
        for name in os.listdir(self.logs):
            if name.endswith(".jsonl"):
                with open(os.path.join(self.logs, name), encoding="utf-8") as handle:
                    found += sum(line.startswith('{"record": "gauges"') and line.endswith("\n")
                                 and '"wave": "B4"' in line for line in handle)
        return found

    def post(self, path: str) -> None:
        request = urllib.request.Request(self.url + path, method="POST")
        with urllib.request.urlopen(request, timeout=5):
            pass

    def rewarm(self) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", START, "--rewarm", "--log-dir", self.logs],
                              capture_output=True, text=True, timeout=150,
                              env=dict(os.environ, START_READY_PORT=str(self.ready_port)))


class TestOwnerAnswers(OwnerCase):
    runs_long = 42                        # seconds on a quiet run: run.py starts it first
    def test_ready_by_http_only_while_warm_for_its_process_sleep_wake_rewarm_stop(self):
        proc = self.supervised("--dev-mode", "--max-num-batched-tokens", "4096")
        self.ready_answer(200)
        with open(self.ready, encoding="utf-8") as handle:
            self.assertEqual(json.load(handle)["chunk_source"], "the command",
                             "where start.sh found the chunk, not the variable it set")
        self.assertIn("readiness: warming -> warm", self.log_text())
        self.assertEqual(self.answer(), (200, "warm\n"))
        # A sleep: not Ready within the owner's 2 s watch (and a period), the file taken away.
        self.post("/sleep?level=1")
        slept = time.monotonic()
        self.ready_answer(503, 10)
        self.assertLess(time.monotonic() - slept, 5 * owner.WATCH_S)
        self.assertEqual(self.answer(), (503, "asleep\n"))
        self.assertFalse(os.path.exists(self.ready))
        refused = self.rewarm()                    # asleep: the owner refuses, sends nothing
        self.assertEqual(refused.returncode, 1, refused.stdout + refused.stderr)
        self.assertIn("re-warm refused: the pod is asleep", refused.stdout)
        self.post("/wake_up")                      # the owner warms again by itself
        self.ready_answer(200, 60)
        self.assertIn("readiness: asleep -> rewarming (woke", self.log_text())
        self.assertIn("readiness: rewarming -> warm", self.log_text())
        asked = self.rewarm()                      # the kubectl exec recipe, through the owner
        self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
        self.assertIn("readiness: warm -> rewarming (asked: start.sh --rewarm)", asked.stdout)
        self.assertIn("OK: warm-up passed", asked.stdout)
        self.assertNotIn("no outcome", asked.stdout + asked.stderr)   # its exit line said it
        self.assertEqual(self.answer()[0], 200)
        # A second start of the pod's folder and port (from a review: the port's check came
        # before the folder's lock, and published usage over the warm pod's pass).
        published = self.read_textfile()
        second = subprocess.run(["bash", START, "--base-url", self.url, "--log-dir", self.logs,
                                 "--textfile", self.textfile, "--supervise", "--", *self.fake()],
                                capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, START_READY_PORT=str(self.ready_port)))
        self.assertEqual(second.returncode, 1, second.stdout + second.stderr)
        self.assertIn("(it holds start.lock)", second.stdout + second.stderr)
        self.assertEqual((self.read_textfile(), self.answer()[0]), (published, 200))
        os.kill(proc.pid, signal.SIGTERM)
        self.ready_answer(503, 2)
        self.assertEqual(proc.wait(30), 0)
        self.assertFalse(os.path.exists(self.ready))
        self.assertFalse(os.path.exists(os.path.join(self.logs, "owner.sock")))
        self.assertRegex(self.log_text(), r"stop: drained: the server ended \d+\.\d s after "
                                          r"TERM, within the 5 s grace; nothing was in flight")

    def test_a_warm_up_refused_at_the_first_healthy_second_is_retried_until_ready(self):
        # One producer request as the port opens, 2 s before /health says 200; it runs 5 s
        # (the fake's slow fault), so the warm-up at the first healthy second is refused;
        # the owner retries until it is idle.
        self.supervised("--health-delay-s", "2", "--fault", "slow", "--fault-match",
                        "producer-")
        answers: list = []
        deadline = time.monotonic() + 30
        while not answers and time.monotonic() < deadline:
            attempt: list = []
            send_completion(self.url, "producer-1", attempt)
            if attempt and attempt[0] == 200:
                answers = attempt
            time.sleep(0.05)
        self.assertEqual(answers, [200])
        self.ready_answer(200, 60)
        log = self.log_text()
        self.assertIn("readiness: warming -> refused (refused: the guard refused)", log)
        self.assertIn("warm-up refused (1): retried in 2 s", log)
        self.assertIn("readiness: refused -> warming (retry", log)
        records = sorted(n for n in os.listdir(self.logs) if n.startswith("warmup-"))
        self.assertGreaterEqual(len(records), 2, "each attempt keeps its records")
        first, _ = read_records(os.path.join(self.logs, records[0]))
        self.assertEqual(first[-1]["verdict"], "refused")
        self.textfile_says("pass")

    def test_refusals_past_the_start_guard_end_failed_and_critical(self):
        self.supervised("--busy", "1", env={"START_GUARD_S": "3"})
        self.wait_for(lambda: "readiness: refused -> failed" in self.log_text(), 60,
                      "given up")
        self.assertEqual(self.answer(), (503, "failed\n"))
        text = self.textfile_says("fail")
        self.assertNotIn("offload_warmup_start_to_warm_seconds", text, "never warmed")
        self.assertFalse(os.path.exists(self.ready))

    def test_the_owner_is_never_ready_on_a_pass_that_assumed_a_required_chunk(self):
        self.supervised("--cpu-build", env={"START_REQUIRE_CHUNK": "1"})
        self.wait_for(lambda: "readiness: warming -> failed" in self.log_text(), 60, "failed")
        self.assertIn("WARN: warm-up passed, but the ready file was not written: the warm-up "
                      "assumed the server's prefill chunk", self.log_text())
        self.assertEqual(self.answer(), (503, "failed\n"))
        self.assertFalse(os.path.exists(self.ready))
        text = self.textfile_says("fail")                # a pass not vouched for is none
        self.assertNotIn("offload_warmup_last_success_timestamp_seconds", text)

    def test_hostile_clients_neither_block_nor_disable_the_owner(self):
        # From a hostile review: a client silent on owner.sock ended its accept loop for
        # good; a reset on the readiness port printed a traceback; idle clients held the
        # one-at-a-time answer past the kubelet's timeout; then, more slow clients than it
        # serves at once held every slot (a second review).
        import socket
        from start.readiness import ReadinessServer
        log = os.path.join(self.tmp, "out.txt")
        with open(log, "w") as out:
            command = ["bash", START, "--base-url", self.url, "--log-dir", self.logs,
                       "--supervise", "--", *self.fake()]
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, START_POLL_S="0.2",
                                             START_READY_PORT=str(self.ready_port)),
                                    start_new_session=True)
        self.addCleanup(lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
        self.ready_answer(200)
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(os.path.join(self.logs, "owner.sock"))
        idle, done = [], threading.Event()
        for _ in range(ReadinessServer.MAX_CLIENTS + 4):
            idle.append(socket.create_connection(("127.0.0.1", self.ready_port), timeout=10))
            idle[-1].sendall(b"GET /ready HTTP/1.1\r\n")       # and never the end of it
            time.sleep(0.05)                        # each accepted (a backlog of 5)

        def trickle():                              # a header line each, every 0.3 s
            while not done.wait(0.3):
                for sock in idle:
                    try:
                        sock.sendall(b"X-a: b\r\n")
                    except OSError:
                        pass                        # closed by the owner: the oldest go
        feeder = threading.Thread(target=trickle, daemon=True)
        feeder.start()
        self.addCleanup(feeder.join)
        self.addCleanup(done.set)
        time.sleep(0.6)
        started = time.monotonic()
        self.assertEqual(self.answer(), (200, "warm\n"))
        self.assertLess(time.monotonic() - started, 1.0, "slow clients hold no answer")
        done.set()
        for _ in range(5):                          # resets: no traceback
            reset = socket.create_connection(("127.0.0.1", self.ready_port))
            reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            reset.sendall(b"GET /ready HTTP/1.0\r\n\r\n")
            reset.close()
        time.sleep(6)                               # the silent client's 5 s pass
        silent.close()
        for sock in idle:
            sock.close()
        asked = self.rewarm()
        self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
        self.assertIn("readiness: warm -> rewarming (asked", asked.stdout)
        os.kill(proc.pid, signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0)
        with open(log) as handle:
            self.assertNotIn("Traceback", handle.read())

    def test_a_sleep_during_a_re_warm_is_no_pass(self):
        self.supervised("--dev-mode", "--fault", "slow", "--fault-match", "B4-0")
        self.ready_answer(200, 60)
        rewarm = subprocess.Popen(["bash", START, "--rewarm", "--log-dir", self.logs],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: rewarm.poll() is None and rewarm.kill())
        self.wait_for(lambda: "warm -> rewarming" in self.log_text(), 30, "re-warming")
        self.wait_for(lambda: self.b4_guards() == 2, 30, "the re-warm's B4 released")
        wait_running(self.url, 1, steady_s=0.3)     # B4's slow request, alone
        self.post("/sleep?level=1")
        said, _ = rewarm.communicate(timeout=60)
        self.assertEqual(rewarm.returncode, 1, said)
        self.assertIn("the server went to sleep during the warm-up", said)
        self.assertNotEqual(self.answer()[0], 200)
        self.assertFalse(os.path.exists(self.ready))

    def test_a_term_during_a_re_warm_stays_stopping_and_cuts_are_said(self):
        # --shutdown-timeout absent (vLLM's default 0): a WARN at launch, and the requests
        # in flight at the TERM are said cut; a re-warm running then writes no pass back.
        proc = self.supervised("--fault", "slow", "--fault-match", "producer-")
        self.ready_answer(200)
        self.assertIn("WARN: the server command gives no --shutdown-timeout", self.log_text())
        rewarm = subprocess.Popen(["bash", START, "--rewarm", "--log-dir", self.logs],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: rewarm.poll() is None and rewarm.kill())
        self.ready_answer(503, 10)                  # re-warming: not Ready
        answers: list = []
        clients = [threading.Thread(target=send_completion,
                                    args=(self.url, f"producer-{n}", answers))
                   for n in range(2)]
        for client in clients:
            client.start()
        wait_running(self.url, 2, steady_s=0.3)     # the two slow producers, not a wave
        os.kill(proc.pid, signal.SIGTERM)
        said, _ = rewarm.communicate(timeout=60)
        for client in clients:
            client.join(30)
        self.assertEqual(proc.wait(30), 0)
        self.assertNotEqual(rewarm.returncode, 0, said)
        self.assertNotIn("OK: warm-up passed", said)
        self.assertFalse(os.path.exists(self.ready), "nothing written back after the TERM")
        self.assertEqual(answers.count(500), 2, answers)
        self.assertRegex(self.log_text(), r"stop: cut: .*2 requests in flight at the TERM, "
                                          r"no --shutdown-timeout")
        with open(self.textfile) as handle:
            text = handle.read()
        self.assertIn("offload_stop_last_in_flight 2.0", text)
        self.assertIn("offload_stop_last_drained 0.0", text)


class TestOwnerStops(OwnerCase):
    """A HUP stops as a TERM does; a re-warm asked during a stop, or interrupted, says so
    (from a hostile review: a HUP ended the owner without a word, its server left running
    and its ready file standing; --rewarm during a stop said nothing; a Ctrl-C on --rewarm
    printed a traceback)."""

    runs_long = 12

    def test_a_hup_stops_the_server_and_a_re_warm_asked_meanwhile_is_told(self):
        proc = self.supervised("--ignore-term")
        self.ready_answer(200)
        pid = self.server_pid()
        head = subprocess.Popen(["bash", START, "--rewarm", "--log-dir", self.logs],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        head.stdout.readline()                      # | head -1: the reader goes away
        head.stdout.close()
        _, err = head.communicate(timeout=60)
        self.assertNotIn(b"Traceback", err)
        self.ready_answer(200, 30)                  # the owner's re-warm went on
        os.kill(proc.pid, signal.SIGHUP)
        self.ready_answer(503, 5)                  # stopping: not Ready at once
        self.assertFalse(os.path.exists(self.ready))
        asked = self.rewarm()                      # answered only by the owner's end
        self.assertEqual(asked.returncode, 1, asked.stdout + asked.stderr)
        self.assertIn("the owner gave no outcome (it is stopping, or ended)", asked.stdout)
        proc.wait(30)
        self.assertFalse(group_alive(pid))
        self.assertIn("HUP received: passed on to the server (pid", self.log_text())
        self.assertIn(", as TERM)", self.log_text())
        self.assertIn("still alive 5 s after the signal: KILL", self.log_text())

    def test_an_interrupted_re_warm_says_the_owner_s_goes_on(self):
        proc = self.supervised("--fault", "slow", "--fault-match", "B4-0")   # each B4: 5 s
        self.ready_answer(200)
        rewarm = subprocess.Popen(["bash", START, "--rewarm", "--log-dir", self.logs],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: rewarm.poll() is None and rewarm.kill())
        self.wait_for(lambda: "warm -> rewarming (asked" in self.log_text(), 30, "re-warming")
        rewarm.send_signal(signal.SIGINT)
        said, _ = rewarm.communicate(timeout=30)
        self.assertEqual(rewarm.returncode, 130, said)
        self.assertIn("start.sh --rewarm interrupted by INT: the owner's re-warm goes on", said)
        self.assertNotIn("Traceback", said)
        self.wait_for(lambda: "rewarming -> warm" in self.log_text(), 60, "the re-warm passed")
        os.kill(proc.pid, signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0)


class TestOnlyTheCreatorVouches(StartCase):
    runs_long = 14

    def rewarm(self) -> subprocess.CompletedProcess:
        """start.sh --rewarm on this test's folder and ready file (no owner: here)."""
        return subprocess.run(["bash", START, "--rewarm", "--log-dir", self.logs,
                               "--ready-file", self.ready], capture_output=True, text=True,
                              timeout=120)

    def test_a_proxy_in_the_launched_group_does_not_vouch(self):
        # The launched process is a shell that runs the server as a child (no exec): the
        # port is held by a member of the group, never by the launched process itself.
        fake = " ".join(f"'{arg}'" for arg in self.fake())
        result = self.start("--ready-file", self.ready,
                            server=["bash", "-c", f"{fake} & wait"], timeout=60)
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        self.assertIn("not by the server process start.sh launched", result.stderr)
        self.assertIn("a wrapper script must exec the server", result.stderr)
        self.assertFalse(os.path.exists(self.ready))

    def test_a_re_warm_refused_during_a_start_removes_no_records_and_no_chunk_is_borrowed(self):
        slow = self.fake("--fault", "slow", "--fault-match=-B1-")
        os.makedirs(self.logs)
        command = ["bash", START, "--base-url", self.url, "--log-dir", self.logs, "--keep", "1",
                   "--ready-file", self.ready, "--", *slow]
        started = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=dict(os.environ, START_POLL_S="0.2"))
        self.addCleanup(lambda: started.poll() is None and started.kill())
        deadline = time.monotonic() + 30
        while not any(n.startswith("warmup-") and os.path.getsize(os.path.join(self.logs, n))
                      for n in os.listdir(self.logs)) and time.monotonic() < deadline:
            time.sleep(0.05)
        busy = subprocess.run(["bash", START, "--rewarm", "--log-dir", self.logs, "--keep", "1",
                               "--ready-file", self.ready], capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(busy.returncode, 1, busy.stdout + busy.stderr)
        self.assertIn("a start or another re-warm of the server", busy.stderr)
        out, _ = started.communicate(timeout=120)
        self.assertIn("OK: warm-up passed", out)
        self.assertTrue(os.path.exists(self.ready))
        records = [n for n in os.listdir(self.logs) if n.startswith("warmup-")]
        self.assertEqual(len(records), 1, "the running warm-up's records are kept")
        # server.chunk names its server: another's is not borrowed by a re-warm.
        with open(os.path.join(self.logs, "server.chunk")) as handle:
            self.assertEqual(handle.read().split(), ["4096", str(self.server_pid())])
        with open(os.path.join(self.logs, "server.chunk"), "w") as handle:
            handle.write("2048 999999\n")            # left by another server
        again = self.rewarm()
        self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
        self.assertNotIn("chunk 2048", again.stdout)
        self.assertNotIn("from server.chunk", again.stdout)

    def test_a_re_warm_that_meets_another_process_says_only_what_it_did(self):
        started = self.start("--ready-file", self.ready, server=self.fake())
        self.assertIn("OK: warm-up passed", started.stdout, started.stderr)
        other = self.start_fake()                  # in this process: not the launched server
        with open(os.path.join(self.logs, "server.url"), "w") as handle:
            handle.write(other.url + "\n")
        again = self.rewarm()
        self.assertEqual(again.returncode, 1, again.stdout + again.stderr)
        self.assertIn("not by the server process start.sh launched", again.stderr)
        self.assertIn("the server keeps running (a re-warm stops nothing)", again.stderr)
        self.assertNotIn("stopping the launched server", again.stderr)
        os.kill(self.server_pid(), 0)              # and it does
        self.assertFalse(os.path.exists(self.ready), "taken away when the re-warm began")

    def test_a_ready_file_asked_for_and_not_written_is_a_warn(self):
        # The server command plants a FIFO where the ready file goes, after start.sh
        # checked the place: the write is refused, and the last word is WARN, not OK.
        fake = " ".join(f"'{arg}'" for arg in self.fake())
        result = self.start("--ready-file", self.ready, server=[
            "bash", "-c", f"mkfifo '{self.ready}'; exec {fake}"], timeout=60)
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("WARN: warm-up passed, but the ready file was not written", result.stdout)
        self.assertNotIn("OK: warm-up passed", result.stdout)


if __name__ == "__main__":
    unittest.main()
