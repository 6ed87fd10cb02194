"""start.sh and its launcher (launcher.py): the pure parts called directly, the rest as
real processes with the fake server (itself a real process) as the server; as a
container's entry point (--supervise); one address; the chunk it passes on; a custom plan
WARNed; the odd paths it refuses.

Every test stops every process it started: the server's process group is killed at
cleanup from the pid start.sh recorded.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import types
import unittest
from unittest import mock

from fake_vllm import TEXT_MARKER, TOKEN_ID_MARKER
from support import (PYTHON, FAKE, LAUNCH, PACKAGES, QUALIFY, START, WRAPPER, HelperCase,
                     SilentServer, StartCase, copy_product, free_port, gate_record, product_files, read_records,
                     run_record, summary_record)
import start.server_command as server_command  # noqa: E402
from start.server import LaunchedServer, Log  # noqa: E402
from start.settings import Settings  # noqa: E402
from start.server_command import flag_value, redacted_command, tokens_value  # noqa: E402
from tools.vllm_log import logged_chunk  # noqa: E402
from start.processes import group_alive
from tools.procfs import proc_stat
import core.prometheus as prometheus  # noqa: E402

SUPERVISING = "supervising server process group"
NEEDS_PID_NAMESPACE = unittest.skipUnless(shutil.which("unshare") and os.geteuid() == 0,
                                          "needs unshare and root for a new PID namespace")


class TestStart(StartCase):
    runs_long = 19                        # seconds on a quiet run: run.py starts it early
    def test_passing_start(self):
        result = self.start("--ready-file", self.ready,
                            server=self.fake("--compile-lines", "2"))
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"OK: warm-up passed: contract 10/10; records: \S+\.jsonl — read them before "
                                        r"releasing HOLD \(2 compile lines during warm-up")
        pid = self.server_pid()
        self.assertTrue(group_alive(pid), "the server must keep running after start.sh")
        self.assertTrue(os.path.exists(self.ready))
        records, text = read_records(self.records())
        self.assertEqual(records[-1]["verdict"], "pass")
        log = self.start_log()
        for step in ("launch pid", "ready after", "warm-up ended: exit 0, verdict pass",
                     "OK: warm-up passed", "exit 0: server process group"):
            self.assertIn(step, log)
        self.assertRegex(log.splitlines()[0], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")
        for output in (result.stdout, result.stderr, log, text):
            self.assertNotIn(TEXT_MARKER, output)
            self.assertNotIn(str(TOKEN_ID_MARKER), output)

    def test_keep_never_removes_this_run_s_records(self):
        os.makedirs(self.logs)
        ahead = os.path.join(self.logs, "warmup-20991231T000000Z.jsonl")   # a clock ahead
        with open(ahead, "w") as handle:
            handle.write("{}\n")
        result = self.start("--keep", "1", "--ready-file", self.ready, server=self.fake())
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertNotIn("records| ", result.stdout, "only a container's log gets them")
        with open(self.ready) as handle:
            records = json.load(handle)["records"]
        self.assertTrue(os.path.exists(records), "the ready file's records are kept")
        self.assertFalse(os.path.exists(ahead), "the older run goes, whatever its name says")

    def test_a_refused_start_leaves_the_ready_file_alone(self):
        passed = self.start("--ready-file", self.ready, server=self.fake())
        self.assertEqual(passed.code, 0, passed.stderr)
        again = self.start("--ready-file", self.ready, server=self.fake())
        self.assertEqual(again.code, 1)
        self.assertIn("still alive", again.stderr)
        self.assertTrue(os.path.exists(self.ready), "the running server is still warm")

    def test_odd_log_files_and_waits_are_usage_errors(self):
        os.makedirs(self.logs)
        os.mkfifo(os.path.join(self.logs, "server.log"))
        fifo = self.refused("--log-dir", self.logs, "--", "true")
        self.assertEqual(fifo.code, 2)
        self.assertIn("server.log is not a regular file", fifo.stderr)
        for poll in ("99999999999999999999", "0", "61"):
            with self.subTest(poll=poll):
                result = self.refused("--log-dir", self.tmp, "--", "true",
                                      env={"START_POLL_S": poll})
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn("START_POLL_S: must be a number of seconds from 0.01 to 60",
                              result.stderr)
        named = self.refused("--", "true", env={"START_LOG_DIR": "/proc/1"})
        self.assertIn("START_LOG_DIR '/proc/1'", named.stderr, "named as the variable")

    def test_start_sh_reads_its_settings_through_argparse_and_one_grammar(self):
        # C3 (55): flags by argparse, each with its START_* variable through core/cli.
        read = Settings(["--keep", "010", "--gate", "--", "vllm"],
                        {"START_STOP_GRACE_S": "08", "START_POLL_S": "0.5",
                         "START_SUPERVISE": "1", "START_KEEP": "3"})
        self.assertEqual((read.problem, read.keep, read.stop_grace_s, read.poll_s, read.gate,
                          read.supervise, read.warmup, read.command),
                         ("", 10, 8, 0.5, True, True, True, ["vllm"]))
        self.assertEqual((read.source["keep"], read.source["start_guard_s"]),
                         ("--keep", "START_GUARD_S"))
        for argv, env, said in (
                (["--keep"], {}, "argument --keep: expected one argument"),
                (["--keep", "1e2"], {}, "argument --keep: must be a whole number from 0 to "
                                        "99999, got '1e2'"),
                (["vllm"], {}, "unrecognized arguments: vllm (the server command goes after "
                               "--)"),
                ([], {"START_GATE": "yes"}, "START_GATE: must be 0 or 1, got 'yes'"),
                ([], {"START_SAY_S": "\u0665"}, "START_SAY_S: must be a whole number from 1 "
                                                "to 999999")):
            with self.subTest(argv=argv, env=env):
                self.assertIn(said, Settings([*argv, "--", "vllm"], env).problem)

    def test_the_ready_file_is_the_launcher_s_alone(self):
        settings = Settings(["--", "vllm"], {"WARMUP_READY_FILE": "/run/elsewhere",
                                             "WARMUP_MODEL": "m"})
        env = settings.server_env()
        self.assertNotIn("WARMUP_READY_FILE", env, "a warm-up must not write it before the "
                                                   "gate ran")
        self.assertEqual(env["WARMUP_MODEL"], "m")

    def test_keep_removes_all_but_the_last_runs_records(self):
        os.makedirs(self.logs)
        old = [f"warmup-2026010{i}T000000Z.jsonl" for i in range(1, 6)]
        for name in old + ["notes.jsonl", "gate-20260101T000000Z.jsonl"]:
            with open(os.path.join(self.logs, name), "w") as handle:
                handle.write("{}\n")
        os.symlink(os.path.join(self.logs, "notes.jsonl"),
                   os.path.join(self.logs, "warmup-20250101T000000Z.jsonl"))
        result = self.start("--keep", "3", server=self.fake())
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        left = sorted(os.listdir(self.logs))
        self.assertEqual([n for n in left if n.startswith("warmup-2026") and n in old],
                         old[-2:], "the newest two old runs and this one are kept")
        self.assertTrue(os.path.exists(self.records()), "this run's records are kept")
        for kept in ("notes.jsonl", "gate-20260101T000000Z.jsonl",
                     "warmup-20250101T000000Z.jsonl"):
            self.assertIn(kept, left, "only records files, never a link, are removed")
        self.assertIn(f"removed 3 records file(s) older than the last 3 runs (--keep): "
                      f"{', '.join(old[:3])}", self.start_log())
        self.assertEqual(self.refused("--keep", "-1", "--", "true").code, 2)

    def test_failing_warmup_warns_and_still_succeeds(self):
        with open(self.ready, "w") as handle:
            handle.write("old")
        result = self.start("--ready-file", self.ready, server=self.fake("--fault", "one_token"))
        self.assertEqual(result.code, 0, result.stderr)
        self.assertRegex(result.stdout, r"WARN: warm-up failed \(exit 1, verdict fail\); records: "
                                        r"\S+\.jsonl — inspect before releasing HOLD")
        self.assertFalse(os.path.exists(self.ready), "a failed warm-up must not leave a ready file")
        self.assertTrue(group_alive(self.server_pid()))
        self.assertIn("WARN: warm-up failed", self.start_log())

    def test_warmup_settings_reach_the_helper(self):
        result = self.start(server=self.fake(), env={"WARMUP_MODEL": "not-served"})
        self.assertEqual(result.code, 0)
        self.assertIn("WARN: warm-up failed (exit 2, verdict usage)", result.stdout)
        self.assertIn("model 'not-served' is not served", result.stdout)

    def test_server_that_exits_at_once(self):
        result = self.start(server=["bash", "-c", "echo boom-from-server; exit 7"], timeout=30)
        self.assertEqual(result.code, 1)
        self.assertIn("server exited with status 7", result.stderr)
        self.assertIn("boom-from-server", result.stderr)
        self.assertLess(result.elapsed, 10)

    def test_server_that_dies_while_starting(self):
        result = self.start(server=self.fake("--health-delay-s", "100", "--exit-after-s", "0.4"),
                            timeout=30)
        self.assertEqual(result.code, 1)
        self.assertIn("server exited with status 3", result.stderr)
        self.assertIn("engine died", result.stderr)

    def test_server_never_healthy_is_stopped_at_the_guard(self):
        result = self.start("--start-guard-s", "1", server=self.fake("--health-delay-s", "1000"),
                            timeout=30)
        self.assertEqual(result.code, 1)
        self.assertIn(f"{self.url}/health did not answer 200 within the 1 s start guard",
                      result.stderr)
        self.assertLess(result.elapsed, 1 + 8)
        self.assertFalse(group_alive(self.server_pid()), "the server's group must be stopped")
        self.assertIn("server process group", self.start_log())

    def test_live_pid_file_is_refused(self):
        sleeper = subprocess.Popen(["sleep", "60"])
        self.addCleanup(sleeper.wait)
        self.addCleanup(sleeper.kill)
        os.makedirs(self.logs)
        with open(os.path.join(self.logs, "server.pid"), "w") as handle:
            handle.write(f"{sleeper.pid}\n")
        result = self.start(server=self.fake(), timeout=30)
        self.assertEqual(result.code, 1)
        self.assertIn(f"names pid {sleeper.pid}, which is still alive", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.logs, "server.log")))

    def test_no_warmup(self):
        result = self.start("--no-warmup", server=self.fake())
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn("warm-up skipped", result.stdout)
        self.assertFalse([f for f in os.listdir(self.logs) if f.startswith("warmup-")])
        self.assertIn("warm-up skipped (--no-warmup)", self.start_log())   # CONTRACT §14
        self.assertNotIn("OK:", self.start_log())          # no warm-up, so no OK line

    def test_a_start_while_another_holds_the_log_folder_launches_and_publishes_nothing(self):
        # From hostile reviews: two starts begun at once in one folder both launched (each
        # passed the check of server.pid before the other wrote it); the refused one then
        # rewrote the running owner's textfile.
        import fcntl
        from test_outcomes import stale_success, verdict_of
        os.makedirs(self.logs)
        held = os.open(os.path.join(self.logs, "start.lock"), os.O_WRONLY | os.O_CREAT)
        self.addCleanup(os.close, held)
        fcntl.flock(held, fcntl.LOCK_EX)            # as a start or a re-warm there holds it
        textfile = os.path.join(self.tmp, "offload.prom")
        stale_success(textfile)                     # the holder's pass
        marker = os.path.join(self.tmp, "launched")
        result = self.start("--textfile", textfile,
                            server=["bash", "-c", f"touch {marker}; sleep 30"])
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        self.assertIn(f"another start.sh or re-warm runs in {self.logs}", result.stderr)
        self.assertFalse(os.path.exists(marker), "nothing may be launched")
        self.assertEqual(verdict_of(textfile), "pass", "the textfile is the holder's")

    def test_a_folder_whose_lock_cannot_be_taken_still_starts_and_says_so(self):
        # From a hostile review: on NFS an exclusive flock needs a descriptor open to write;
        # any error of the lock was told as another start, a crash loop's false reason.
        import errno
        import fcntl
        from start import steps
        from start.server import Log
        os.makedirs(self.logs)
        said = []
        log = Log(self.logs)
        log.show = lambda text, stream: said.append(text)
        with mock.patch.object(fcntl, "flock",
                               side_effect=OSError(errno.ENOLCK, "No locks available")):
            self.assertIsNone(steps.claim_log_dir(self.logs, log))
        self.assertIn("WARN: cannot lock", said[-1])
        self.assertIn("No locks available", said[-1])

    def test_a_supervised_start_without_a_warm_up_is_a_usage_error(self):
        # From a hostile review: it exited 0 at once, its server left running unsupervised
        # and no GET /ready answered.
        result = self.refused("--base-url", self.url, "--log-dir", self.logs, "--supervise",
                              "--no-warmup", "--", *self.fake())
        self.assertEqual(result.code, 2, result.stderr)
        self.assertIn("--no-warmup (START_WARMUP) with --supervise (START_SUPERVISE)",
                      result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.logs, "server.pid")))

    def test_a_readiness_port_held_or_the_server_s_own_is_refused_before_the_launch(self):
        # It was found once the server was healthy (minutes of model load), as a WARN, and
        # the pod was never Ready.
        holder = socket.socket()
        self.addCleanup(holder.close)
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        held, own = str(holder.getsockname()[1]), str(self.port)
        for port, said in ((held, f"START_READY_PORT {held} cannot be listened on (Address "
                                  f"already in use): another program listens on it"),
                           (own, f"--ready-port {own} is the server's own port "
                                 f"(http://127.0.0.1:{own})")):
            with self.subTest(port=port):
                logs = os.path.join(self.tmp, port)   # one each: an in-process start keeps its lock
                with open(self.ready, "w") as handle:         # another start's: left alone
                    handle.write("{}")
                if port == held:
                    result = self.refused("--base-url", self.url, "--log-dir", logs,
                                          "--supervise", "--ready-file", self.ready, "--",
                                          *self.fake(), env={"START_READY_PORT": port})
                else:
                    result = self.refused("--base-url", self.url, "--log-dir", logs,
                                          "--supervise", "--ready-port", port, "--",
                                          *self.fake())
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn(said, result.stderr)
                self.assertIn("choose another port", result.stderr)
                self.assertFalse(os.path.exists(os.path.join(logs, "server.pid")))
                self.assertTrue(os.path.exists(self.ready), "a refused start removes no file")
        # A port below 1024 without the right to it (a review: it said "another program").
        import start.settings as start_settings

        class Refused(socket.socket):
            def bind(self, address):
                raise PermissionError(errno.EACCES, "Permission denied")
        settings = types.SimpleNamespace(ready_port=801, supervise=True,
                                         source={"ready_port": "--ready-port"},
                                         target=types.SimpleNamespace(port=8000))
        with mock.patch.object(start_settings.socket, "socket", Refused):
            said = start_settings.ready_port_problem(settings)
        self.assertEqual(said, "--ready-port 801 cannot be listened on (Permission denied): a "
                               "port below 1024 needs root or CAP_NET_BIND_SERVICE; choose a "
                               "higher one")

    def test_secrets_in_a_shell_script_or_the_key_variable_are_not_logged(self):
        # From a hostile review: `bash -c "... --api-key K"` showed K in the launch line.
        script = " ".join([*self.fake(), "--api-key", "sk-SCRIPTKEY-1"])
        result = self.start("--no-warmup", server=["bash", "-c", f"exec {script}"])
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn("--api-key [redacted]", self.start_log())
        self.assertNotIn("SCRIPTKEY", self.start_log() + result.stdout + result.stderr)
        self.stop_server()
        key = "sk-VARKEY-12345"            # as a word no flag names: the sink knows the key
        result = self.start("--no-warmup", env={"VLLM_API_KEY": key}, server=[
            "bash", "-c", f'exec {" ".join(self.fake())} --api-key "$0"', key])
        self.assertEqual(result.code, 0, result.stderr)
        self.assertNotIn("VARKEY", self.start_log() + result.stdout + result.stderr)
        self.stop_server()                 # the server's own first error, shown on stderr
        result = self.start(env={"VLLM_API_KEY": key}, server=[
            "bash", "-c", 'echo "INFO non-default args: {api_key: $VLLM_API_KEY}"; '
                          'echo "ERROR engine failed"; exit 1'])
        self.assertEqual(result.code, 1, result.stderr)
        self.assertIn("the server's first error", result.stderr)
        self.assertNotIn("VARKEY", self.start_log() + result.stdout + result.stderr)

    def test_a_signal_before_the_launch_ends_the_start_in_one_line(self):
        # From a hostile review: a TERM, INT or HUP while start.sh probed the address before
        # launching ended it with a traceback (INT) or silently, the textfile left starting.
        from test_outcomes import verdict_of
        silent = SilentServer()                     # the probe waits on it (2 s at most)
        self.addCleanup(silent.stop)
        textfile = os.path.join(self.tmp, "offload.prom")
        for signum in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=signum):
                proc = subprocess.Popen(
                    ["bash", START, "--base-url", silent.url, "--log-dir", self.logs,
                     "--textfile", textfile, "--", "sleep", "30"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                self.addCleanup(lambda p=proc: p.poll() is None and p.kill())
                deadline = time.monotonic() + 20
                while not (os.path.exists(textfile) and verdict_of(textfile) == "starting") \
                        and time.monotonic() < deadline:
                    time.sleep(0.02)
                proc.send_signal(signum)
                out, err = proc.communicate(timeout=30)
                self.assertEqual(proc.returncode, 128 + signum, out + err)
                self.assertIn(f"interrupted by {signal.Signals(signum).name[3:]} while "
                              f"starting", err)
                self.assertNotIn("Traceback", out + err)
                self.assertEqual(verdict_of(textfile), "killed")

    def test_secrets_in_the_server_command_are_not_logged(self):
        result = self.start("--no-warmup", server=self.fake("--api-key", "sk-CMDKEY-1"))
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn("--api-key [redacted]", self.start_log())
        self.assertNotIn("sk-CMDKEY-1", self.start_log() + result.stdout)

    def test_term_while_waiting_stops_the_server(self):
        self.interrupted_while_waiting(signal.SIGTERM)

    def test_hup_while_waiting_stops_the_server_as_term_does(self):
        # From a hostile review: a hang-up (a terminal that went away) ended the launcher
        # without a word, its server left running with no parent.
        self.interrupted_while_waiting(signal.SIGHUP)

    def interrupted_while_waiting(self, signum: int):
        proc = subprocess.Popen(["bash", START, "--base-url", self.url, "--log-dir", self.logs,
                                 "--", *self.fake("--health-delay-s", "1000")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, START_POLL_S="0.2", START_STOP_GRACE_S="3"))
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(self.logs, "server.pid")) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        pid = self.server_pid()
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            tree = subprocess.run(["ps", "-eo", "pid,ppid,pgid,stat,args", "--forest"],
                                  capture_output=True, text=True).stdout
            with open(f"/proc/{proc.pid}/status") as handle:
                status = [l for l in handle if l.startswith(("SigIgn", "SigCgt", "State"))]
            proc.kill()
            out, err = proc.communicate()
            self.fail(f"start.sh did not end after {signum}\n{status}\n{out}\n{err}\n{tree}")
        self.assertEqual(proc.returncode, 128 + signum)
        self.assertIn(f"interrupted by {signal.Signals(signum).name[3:]} while starting", err)
        self.assertFalse(group_alive(pid))

    def write_script(self, name: str, text: str) -> str:
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def test_something_already_answering_is_refused_before_launch(self):
        marker = os.path.join(self.tmp, "launched")
        for health_delay_s in (0.0, 100.0):            # 200, then 503: any answer at all
            with self.subTest(health_delay_s=health_delay_s):
                other = self.start_fake(health_delay_s=health_delay_s)
                command = ["bash", START, "--base-url", other.url, "--log-dir", self.logs,
                           "--ready-file", self.ready, "--", "bash", "-c",
                           f"touch {marker}; sleep 30"]
                result = self.run_process(command, timeout=30,
                                          env={"START_POLL_S": "0.2", "START_STOP_GRACE_S": "3"})
                self.assertEqual(result.code, 1, result.stdout + result.stderr)
                self.assertIn(f"something already answers at {other.url}/health", result.stderr)
                self.assertFalse(os.path.exists(marker), "nothing may be launched")
                self.assertFalse(os.path.exists(os.path.join(self.logs, "server.pid")))
                self.assertFalse(os.path.exists(self.ready))

    def test_launched_server_gone_when_the_warm_up_ends(self):
        # The launched command starts a server outside its own process group (as another
        # service would), waits until it is healthy, lingers briefly and exits: the
        # warm-up talks to a server start.sh did not start.
        other_pid = os.path.join(self.tmp, "other.pid")
        self.addCleanup(self.kill_group_in, other_pid)
        launcher = self.write_script("launcher.py", f"""
import subprocess, sys, time, urllib.request
other = subprocess.Popen({self.fake("--latency-s", "0.3")!r}, start_new_session=True)
open({other_pid!r}, "w").write(str(other.pid))
for _ in range(200):
    try:
        urllib.request.urlopen({self.url!r} + "/health", timeout=1)
        break
    except OSError:
        time.sleep(0.05)
time.sleep(0.8)
""")
        result = self.start("--ready-file", self.ready, server=[sys.executable, launcher],
                            timeout=60)
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        # Caught when /health first answers: the port is held outside the launched group.
        self.assertRegex(result.stderr, r"/health answered 200, but port \d+ is held by pid "
                                        r"\d+ \(process group \d+\), not by the server "
                                        r"process start.sh launched")
        self.assertNotIn("warm-up:", result.stdout)
        self.assertNotIn("OK:", result.stdout)
        self.assertFalse(os.path.exists(self.ready), "no ready file for a server that is gone")

    def kill_group_in(self, pid_file: str) -> None:
        if os.path.exists(pid_file):
            with open(pid_file) as handle:
                pid = int(handle.read() or 0)
            if pid and group_alive(pid):
                os.killpg(pid, signal.SIGKILL)

    def daemonizing(self, *args: str) -> list[str]:
        """A server command that forks the fake into the background and exits 0."""
        return ["bash", "-c", '"$@" & exit 0', "daemonize", *self.fake(*args)]

    def test_a_server_that_forks_and_exits_has_ended_and_its_group_is_stopped(self):
        result = self.start("--ready-file", self.ready, server=self.daemonizing(), timeout=60)
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        pid = self.server_pid()
        self.assertIn("server exited with status 0", result.stderr)
        self.assertIn("a server that forks and exits has ended", result.stderr)
        self.assertNotIn("OK:", result.stdout)
        self.assertFalse(os.path.exists(self.ready))
        self.assertFalse(group_alive(pid), "what the server left of its group is stopped")

    def test_server_that_forks_and_leaves_little(self):
        result = self.start(server=["bash", "-c", "sleep 0.3 & exit 0"], timeout=30)
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        self.assertIn("server exited with status 0", result.stderr)
        self.assertFalse(group_alive(self.server_pid()))
        self.assertLess(result.elapsed, 10)

    def test_the_first_error_is_vllm_s_error_line_not_a_warning_that_says_error(self):
        import start.supervisor as supervisor
        log = ["(APIServer pid=1) WARNING 12-03 11:06:18 [system_utils.py:255] Found ulimit of "
               "20000 and failed to automatically increase with error current limit exceeds",
               "(EngineCore pid=2) INFO 12-03 11:06:37 [utils.py:347] Using LBHNC KV cache layout.",
               "(Worker pid=3) ERROR 12-03 11:06:37 [multiproc_executor.py:1063] WorkerProc hit "
               "an exception.",
               "(Worker pid=3) ERROR 12-03 11:06:37 [multiproc_executor.py:1063] ValueError: "
               "Available memory on node 0 (7.36/8.71 GiB) is less than requested"]
        found = supervisor.first_error("\n".join(log + ["INFO shutdown"] * 60), before=1)
        self.assertEqual(found[:3], log[1:])
        self.assertEqual(supervisor.first_error("INFO all is well\nWARNING with error"), [])

    def test_a_failed_start_shows_the_server_s_first_error(self):
        result = self.start(server=self.fake("--fail-start"), timeout=30)
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        self.assertIn("the server's first error", result.stderr)
        self.assertIn("torch.OutOfMemoryError: CUDA out of memory", result.stderr,
                      "the cause, 60 lines above the end of the log")
        self.assertIn("releasing resource 59", result.stderr, "and the end of the log")

    def test_unwritable_paths_are_usage_errors_before_launch(self):
        marker = os.path.join(self.tmp, "launched")
        regular = self.write_script("regular-file", "")
        cases = (("--ready-file", os.path.join(self.tmp, "missing", "ready")),
                 ("--log-dir", "/proc/1"),
                 ("--log-dir", os.path.join(regular, "logs")))
        for option, path in cases:
            with self.subTest(option=option, path=path):
                args = ["--log-dir", self.logs, option, path]
                result = self.refused("--base-url", self.url, *args, "--", "bash", "-c",
                                      f"touch {marker}")
                self.assertEqual(result.code, 2, result.stdout + result.stderr)
                self.assertIn(f"'{path}'", result.stderr)
                self.assertFalse(os.path.exists(marker), "nothing may be launched")

    def test_credentials_in_base_url_are_used_and_never_shown(self):
        password = "pw-CREDMARKER-77"
        server = self.write_script("auth_health.py", f"""
import base64, http.server, sys
expected = "Basic " + base64.b64encode(b"ops:{password}").decode()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == expected
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", {self.port}), Handler).serve_forever()
""")
        for given, code, guard in ((password, 0, "20"), ("wrong-CREDMARKER", 1, "1")):
            with self.subTest(password=given):
                url = f"http://ops:{given}@127.0.0.1:{self.port}"
                command = ["bash", START, "--base-url", url, "--log-dir", self.logs,
                           "--start-guard-s", guard, "--no-warmup", "--",
                           sys.executable, server]
                result = self.run_process(command, timeout=30, env={"START_POLL_S": "0.2",
                                                                    "START_STOP_GRACE_S": "3"})
                self.stop_server()
                self.assertEqual(result.code, code, result.stdout + result.stderr)
                if code == 0:
                    self.assertIn("ready after", result.stdout)
                else:
                    self.assertIn(f"{self.url}/health did not answer 200", result.stderr)
                for text in (result.stdout, result.stderr, self.start_log()):
                    self.assertNotIn("CREDMARKER", text)
                    self.assertNotIn("ops:", text)

    def test_credentials_reach_the_warm_up_and_are_never_shown(self):
        url = f"http://ops:pw-CREDMARKER-78@127.0.0.1:{self.port}"
        command = ["bash", START, "--base-url", url, "--log-dir", self.logs, "--", *self.fake()]
        result = self.run_process(command, timeout=60, records=self.records(),
                                  env={"START_POLL_S": "0.2", "START_STOP_GRACE_S": "3"})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("OK: warm-up passed", result.stdout)
        _, records_text = read_records(self.records())
        for text in (result.stdout, result.stderr, self.start_log(), records_text):
            self.assertNotIn("CREDMARKER", text)

    def test_launch_line_hides_secret_values_only(self):
        table = (
            (["vllm", "serve", "m", "--api-key", "S1"], "vllm serve m --api-key [redacted]"),
            (["--api-key=S1", "--hf-token", "S2"], "--api-key=[redacted] --hf-token [redacted]"),
            (["--db-password", "S1", "--client-secret=S2", "--my_key", "S3", "--TOKEN", "S4"],
             "--db-password [redacted] --client-secret=[redacted] --my_key [redacted] "
             "--TOKEN [redacted]"),
            (["--max-num-batched-tokens", "4096"], "--max-num-batched-tokens 4096"),
            (["--enable-prompt-tokens-details", "--tokenizer", "/models/x"],
             "--enable-prompt-tokens-details --tokenizer /models/x"),
            (["--ssl-keyfile", "/k.pem", "--keys", "3", "--tokenizer-mode", "auto"],
             "--ssl-keyfile /k.pem --keys 3 --tokenizer-mode auto"),
            (["--api-key"], "--api-key"),
            (["--api-key", "OLD", "NEW", "--port", "8000"],     # a key rotation: both hidden
             "--api-key [redacted] [redacted] --port 8000"),
            (["env", "VLLM_API_KEY=S1", "HF_TOKEN=S2", "aws_secret_access_key=S3",
              "MAX_NUM_BATCHED_TOKENS=4096", "vllm", "serve", "m"],
             "env VLLM_API_KEY=[redacted] HF_TOKEN=[redacted] aws_secret_access_key=[redacted] "
             "MAX_NUM_BATCHED_TOKENS=4096 vllm serve m"),
            (["serve", "m", "--tokenizer=a=b", "x=y"], "serve m --tokenizer=a=b x=y"),
            (["--apikey", "S1"], "--apikey [redacted]"),
            (["env", "PGPASSWORD=S2", "psql"], "env PGPASSWORD=[redacted] psql"),
            (["bash", "-c", "HF_TOKEN=S3 vllm serve m --api-key=S1 --hf-token 'S 2'; echo"],
             "bash -c HF_TOKEN=[redacted] vllm serve m --api-key=[redacted] --hf-token "
             "[redacted]; echo"),
            (["bash", "-c", "vllm serve m --max-num-batched-tokens 8192 --ssl-keyfile /k"],
             "bash -c vllm serve m --max-num-batched-tokens 8192 --ssl-keyfile /k"),
            (["bash", "-c", "vllm serve m --api-key OLD NEW --port 8000 --hf-token --x"],
             "bash -c vllm serve m --api-key [redacted] --port 8000 --hf-token --x"),
        )
        for argv, expected in table:
            with self.subTest(argv=argv):
                self.assertEqual(redacted_command(argv), expected)

    def test_help_names_every_exit_status(self):
        result = self.run_process(["bash", START, "--help"], timeout=10)
        self.assertEqual(result.code, 0)
        for line in (r"\n  0 +server up", r"\n  1 +server not started", r"\n  2 +usage error",
                     r"\n  129 +interrupted by HUP", r"\n  130 +interrupted by INT",
                     r"\n  143 +interrupted by TERM"):
            self.assertRegex(result.stdout, line)
        self.assertIn("Read the records before releasing HOLD", result.stdout)
        self.assertIn("--rewarm without server.pid in LOG_DIR); nothing was launched",
                      result.stdout, "the status the refusal gives (test_signals: 2)")

    def test_ok_line_says_when_the_cache_check_was_not_made(self):
        for details, said in ((False, True), (True, False)):
            with self.subTest(prompt_tokens_details=details):
                flags = ("--prompt-tokens-details",) if details else ()
                result = self.start(server=self.fake(*flags))
                self.stop_server()
                self.assertEqual(result.code, 0, result.stdout + result.stderr)
                ok = [line for line in result.stdout.splitlines() if " OK: " in line]
                self.assertEqual(len(ok), 1, result.stdout)
                self.assertIn("read them before releasing HOLD", ok[0])
                self.assertEqual("B1 cache check not made" in ok[0], said, ok[0])

    def test_gate_with_the_real_gate(self):
        # The gate's own verdicts are tested with it; here: start.sh runs it and obeys it.
        for copy, verdict in (("faithful", "pass"), ("typos", "fail")):
            with self.subTest(copy=copy):
                result = self.start("--gate", "--ready-file", self.ready,
                                    server=self.fake("--copy", copy))
                self.stop_server()
                self.assertEqual(result.code, 0, result.stdout + result.stderr)
                gates = [f for f in os.listdir(self.logs) if f.startswith("gate-")]
                self.assertTrue(gates, "the gate writes its records in the log dir")
                if verdict == "pass":
                    self.assertIn("OK: warm-up passed: contract 10/10, gate passed (identifiers 6/6 alone and "
                                  "batched, worst CER 0.000); records: ", result.stdout)
                    self.assertTrue(os.path.exists(self.ready))
                else:
                    self.assertIn("WARN: warm-up passed, gate failed (exit 1, verdict fail; "
                                  "identifiers ", result.stdout)
                    self.assertFalse(os.path.exists(self.ready))
                self.assert_no_leak(None, result.stdout, result.stderr, self.start_log())

    def test_a_usage_error_is_published_to_the_textfile_however_the_flag_is_written(self):
        for form in (["--textfile", "{}"], ["--textfile={}"]):
            with self.subTest(form=form[0]):
                textfile = os.path.join(self.tmp, f"{len(form)}.prom")
                args = [a.format(textfile) for a in form]
                result = self.refused("--log-dir", self.logs, *args, "--bogus", "--", "true",
                                      env={"START_TEXTFILE": os.path.join(self.tmp, "v.prom")})
                self.assertEqual(result.code, 2, result.stderr)
                with open(textfile) as handle:
                    self.assertIn('offload_warmup_last_run_verdict{verdict="usage"} 1.0',
                                  handle.read())
        # A textfile whose folder is missing is the usage error, said once.
        result = self.refused("--log-dir", self.logs, "--", "true",
                              env={"START_TEXTFILE": os.path.join(self.tmp, "no", "x.prom")})
        self.assertEqual(result.code, 2, result.stderr)
        self.assertEqual(result.stderr.count("its folder does not exist"), 1, result.stderr)

    def test_usage_errors(self):
        for args, env in ((["--start-guard-s", "soon", "--", "true"], {}), (["--bogus"], {}),
                          ([], {}), (["--start-guard-s", "9223372036854775808", "--", "true"], {}),
                          (["--", "true"], {"START_STOP_GRACE_S": "8.5"}),
                          (["--base-url", "http://admin:Hunter2secret/x@127.0.0.1:9", "--",
                            "true"], {})):
            with self.subTest(args=args, env=env):
                result = self.refused("--log-dir", self.logs, *args, env=env)
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn("start.sh:", result.stderr)
                self.assertNotIn("Hunter2secret", result.stdout + result.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.logs, "server.pid")))

    def test_a_terminal_that_goes_away_does_not_end_start_sh(self):
        # `start.sh ... | head -1`: the reader leaves after one line; start.sh carries on,
        # warms the server up and says OK in start.log, as if the terminal were still there.
        proc = subprocess.Popen(["bash", START, "--base-url", self.url, "--log-dir", self.logs,
                                 "--", *self.fake()], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, START_POLL_S="0.2"))
        self.addCleanup(proc.kill)
        proc.stdout.readline()
        proc.stdout.close()
        self.assertEqual(proc.wait(timeout=60), 0)
        self.assertIn("OK: warm-up passed", self.start_log())
        self.assertTrue(group_alive(self.server_pid()))


# Stands in for qualify.py in a copy of the tree: `report` is the real one, `gate` does
# what STUB_GATE says (print a JSON summary and exit with a status, or hang), so that
# start.sh's side of the gate is tested whatever the real gate finds.
GATE_STUB = """
import json, os, sys, time
if sys.argv[1:2] != ["gate"]:
    os.execv(sys.executable, [sys.executable, {qualify!r}, *sys.argv[1:]])
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gate-argv"), "w") as out:
    json.dump(sys.argv[1:] + ["WARMUP_BASE_URL=" + os.environ.get("WARMUP_BASE_URL", "")], out)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gate-flags"), "w") as out:
    json.dump([sys.flags.isolated, sys.flags.no_site], out)
plan = json.loads(os.environ["STUB_GATE"])
if plan.get("hang"):
    time.sleep(600)
print("gate: a human line")
summary = plan["summary"]
planned = 0 if summary["verdict"] != "pass" else 16
run = json.loads({run!r})
run["plan"].update(requests_total=planned, requests_per_engine=planned)
records = [run] + [dict(json.loads({gate!r}), index=i, request_id=f"gate-stub-{{i}}")
                   for i in range(planned)]
records += [dict(json.loads({base!r}), **summary, requests_ok=planned, requests_total=planned),
            dict({{"max_typos": 0, "preambles": [], "max_cer": 0.01, "endpoint": "completions",
                  "elapsed_s": 1.0, "records": None, "passages_ok": None, "worst_typos": None}},
                 **summary, record="gate_summary",
                 run_id="stub")]
with open(sys.argv[sys.argv.index("--records") + 1], "a") as out:
    out.writelines(json.dumps(r) + "\\n" for r in records)
sys.exit(summary["exit_code"])
"""

PASSED_GATE = {"verdict": "pass", "exit_code": 0, "worst_cer": 0.0, "problems": [],
               "identifiers_exact": {"alone": "6/6", "batched": "6/6"}}


class TestStartGate(StartCase):
    """start.sh --gate, with a stand-in gate (its real side: bounds, OK/WARN, ready file)."""
    runs_long = 11                        # seconds on a quiet run: run.py starts it early

    def setUp(self):
        super().setUp()
        repo = os.path.join(self.tmp, "repo")
        self.launch = os.path.join(repo, "offload", "launch")
        os.makedirs(self.launch)
        shutil.copy(START, repo)
        copy_product(self.launch)
        with open(os.path.join(self.launch, "qualify.py"), "w") as handle:
            handle.write(GATE_STUB.format(qualify=QUALIFY,
                                          run=json.dumps(run_record("stub", 0, "gate")),
                                          gate=json.dumps(gate_record("stub", 0)),
                                          base=json.dumps(summary_record("stub", "fail", 1))))
        self.script = os.path.join(repo, "start.sh")

    def gate(self, *args: str, plan: dict, server_args=(), timeout=60):
        """start.sh --gate in the copied tree (the stand-in gate), the fake as server."""
        return self.start("--gate", "--ready-file", self.ready, *args,
                          server=self.fake(*server_args), script=self.script, timeout=timeout,
                          env={"STUB_GATE": json.dumps(plan)})

    def gate_argv(self) -> list[str]:
        with open(os.path.join(self.launch, "gate-argv")) as handle:
            return json.load(handle)

    def test_warm_up_and_gate_passed(self):
        secret_url = f"http://ops:pw-CREDMARKER-79@127.0.0.1:{self.port}"
        result = self.gate("--base-url", secret_url, plan={"summary": PASSED_GATE})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("OK: warm-up passed: contract 10/10, gate passed (identifiers 6/6 alone and batched, "
                      "worst CER 0.000); records: ", result.stdout)
        self.assertIn("read them before releasing HOLD", result.stdout)
        # The URL as given, in the environment: a command line is visible to every user.
        argv = self.gate_argv()
        self.assertEqual(argv[:2], ["gate", "--records"])
        self.assertRegex(os.path.basename(argv[2]), r"^gate-\d{8}T\d{6}Z\.jsonl$")
        self.assertEqual(os.path.dirname(argv[2]), self.logs)
        self.assertEqual(argv[3:], [f"WARMUP_BASE_URL={secret_url}"])
        with open(os.path.join(self.launch, "gate-flags")) as handle:
            self.assertEqual(json.load(handle), [1, 1], "the gate runs as -I -S, as the others")
        with open(self.ready) as handle:
            ready = handle.read()
        doc = json.loads(ready)
        self.assertEqual((doc["verdict"], doc["gate"]["verdict"]), ("pass", "pass"))
        self.assertEqual(doc["gate"]["records"], argv[2])
        self.assertEqual(doc["base_url"], self.url, "the URL without its credentials")
        for text in (result.stdout, result.stderr, self.start_log(), ready):
            self.assertNotIn("CREDMARKER", text)

    def test_failed_gate_warns_without_a_ready_file(self):
        failed = dict(PASSED_GATE, verdict="fail", exit_code=1, worst_cer=0.125,
                      identifiers_exact={"alone": "6/6", "batched": "4/6"})
        result = self.gate(plan={"summary": failed})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"WARN: warm-up passed, gate failed \(exit 1, verdict "
                                        r"fail; identifiers 6/6 alone, 4/6 batched, worst CER "
                                        r"0\.125\); records: \S+/warmup-\S+\.jsonl and "
                                        r"\S+/gate-\S+\.jsonl — inspect before releasing HOLD")
        self.assertFalse(os.path.exists(self.ready))
        self.assertTrue(group_alive(self.server_pid()), "the server keeps running after a WARN")

    def test_gate_is_ended_by_its_hard_bound(self):
        result = self.gate("--gate-hard-s", "0.5", plan={"hang": True})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("WARN: warm-up passed, gate failed (exit 124, verdict killed", result.stdout)
        self.assertFalse(os.path.exists(self.ready))
        self.assertLess(result.elapsed, 15)

    def test_term_during_the_gate_stops_everything(self):
        proc = subprocess.Popen(["bash", self.script, "--base-url", self.url, "--log-dir",
                                 self.logs, "--gate", "--", *self.fake()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, START_POLL_S="0.2", START_STOP_GRACE_S="3",
                                         STUB_GATE=json.dumps({"hang": True})))
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        self.addCleanup(kill_processes_naming, self.launch)
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(self.launch, "gate-argv")) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        self.assertEqual(proc.returncode, 143, err)
        self.assertIn("interrupted by TERM", err)
        self.assertFalse(group_alive(self.server_pid()))
        self.assertEqual(processes_naming(self.launch, "python"), [], "the gate outlived TERM")
        self.assertFalse([f for f in os.listdir(self.logs) if f.startswith(".gate-summary")])

    def test_no_gate_after_a_failed_warm_up(self):
        result = self.gate(plan={"summary": PASSED_GATE}, server_args=("--fault", "one_token"))
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("WARN: warm-up failed (exit 1, verdict fail)", result.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.launch, "gate-argv")))
        self.assertFalse(os.path.exists(self.ready))

    def test_gate_from_the_environment_and_its_bound_checked(self):
        result = self.start("--ready-file", self.ready, server=self.fake(), script=self.script,
                            env={"START_GATE": "1", "STUB_GATE": json.dumps(
                                {"summary": PASSED_GATE})})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("gate passed", result.stdout)
        for env in ({"START_GATE": "yes"}, {"START_GATE_HARD_S": "0"}):
            with self.subTest(env=env):
                result = self.run_process(["bash", self.script, "--", "true"], env=env,
                                          timeout=30)
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn(f"'{list(env.values())[0]}'", result.stderr)


def processes_naming(marker: str, program: str = "") -> list[int]:
    """Pids of live processes whose command line holds `marker` (a test's unique path),
    and whose program is `program` when given."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            if marker.encode() in b" ".join(argv) and \
                    os.path.basename(argv[0].decode()).startswith(program):
                found.append(int(entry))
        except OSError:
            continue
    return found


def kill_processes_naming(marker: str) -> None:
    """SIGKILL every live process whose command line holds `marker` (test cleanup)."""
    for pid in processes_naming(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class TestWrapper(HelperCase):
    """warmup_serve.sh as a real process: its signal handling and how it starts the helper."""

    def test_help_and_usage_errors_name_the_wrapper(self):
        result = self.run_process(["bash", WRAPPER, "--help"], timeout=30)
        self.assertEqual(result.code, 0, result.stderr)
        self.assertTrue(result.stdout.startswith("usage: warmup_serve.sh "), result.stdout[:80])
        result = self.run_process(["bash", WRAPPER, "--waves", "2,3"], timeout=30)
        self.assertEqual(result.code, 2)
        self.assertIn("warmup_serve.sh: error:", result.stderr)

    def test_trap_is_set_before_the_helper_starts(self):
        result = self.run_process(["bash", "-x", WRAPPER, "--dry-run"], timeout=30)
        self.assertEqual(result.code, 0, result.stderr)
        trace = result.stderr.splitlines()
        trap = next(i for i, line in enumerate(trace) if line.startswith("+ trap ")
                    and "TERM" in line)
        # `child=<pid>` is traced by the wrapper itself right after it started timeout
        # (the `+ timeout` line comes from the child, in no fixed order).
        launched = next(i for i, line in enumerate(trace) if line.startswith("+ child=")
                        and line[8:].isdigit())
        self.assertLess(trap, launched, "a TERM before the trap would leave timeout running")

    def test_term_right_after_start_ends_everything(self):
        silent = SilentServer()
        self.addCleanup(silent.stop)
        self.addCleanup(kill_processes_naming, self.records_path)
        for when in ("at once", "once the helper runs"):
            with self.subTest(when=when):
                proc = subprocess.Popen(["bash", WRAPPER, "--base-url", silent.url, "--records",
                                         self.records_path],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env=dict(os.environ, WARMUP_HARD_S="60"))
                self.addCleanup(proc.wait)
                self.addCleanup(proc.kill)
                if when != "at once":
                    deadline = time.monotonic() + 10
                    while not processes_naming(self.records_path, "timeout") and \
                            time.monotonic() < deadline:
                        time.sleep(0.005)
                started = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
                deadline = time.monotonic() + 5
                while processes_naming(self.records_path) and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.assertEqual(processes_naming(self.records_path), [],
                                 "timeout or the helper outlived the wrapper's TERM")
                self.assertLess(time.monotonic() - started, 10)

    def copy_launch(self, name: str) -> str:
        """The folder offload/launch/ without its tests, in a new place (as on a host)."""
        return copy_product(os.path.join(self.tmp, name))

    def test_helper_runs_as_a_cached_module_isolated_from_the_caller(self):
        folder = self.copy_launch("writable")
        stray = os.path.join(self.tmp, "stray")
        os.makedirs(stray)
        for name in ("json.py", "warmup.py"):
            with open(os.path.join(stray, name), "w") as handle:
                handle.write("raise SystemExit('shadowed by a stray module')\n")
        proc = subprocess.run(["bash", os.path.join(folder, "warmup_serve.sh"), "--dry-run"],
                              capture_output=True, text=True, timeout=30, cwd=stray,
                              env=dict(os.environ, PYTHONPATH=stray))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("plan for", proc.stdout)
        cache = os.path.join(folder, "__pycache__")
        self.assertTrue([f for f in os.listdir(cache) if f.startswith("warmup.")],
                        "an imported helper leaves its bytecode cached")

    def test_helper_runs_where_its_bytecode_cannot_be_cached(self):
        folder = self.copy_launch("readonly")
        packages = [folder] + [os.path.join(folder, p) for p in PACKAGES]
        for package in packages:
            with open(os.path.join(package, "__pycache__"), "w") as handle:
                handle.write("a file where the cache folder would go\n")   # blocks even root
            os.chmod(package, 0o555)
            self.addCleanup(os.chmod, package, 0o755)
        result = self.run_process(["bash", os.path.join(folder, "warmup_serve.sh"), "--dry-run"],
                                  timeout=30)
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn("plan for", result.stdout)
        found = sorted(os.path.relpath(os.path.join(d, f), folder)
                       for d, _, files in os.walk(folder) for f in files)
        self.assertEqual(found, sorted([os.path.join(p, "__pycache__") for p in
                                        ("",) + PACKAGES] +
                                       [os.path.relpath(f, LAUNCH) for f in product_files()]))


class TestSupervise(StartCase):
    runs_long = 25                        # seconds on a quiet run: run.py starts it early
    def supervised(self, *launcher: str, server: list[str] | None = None,
                   stdout=subprocess.DEVNULL, env: dict | None = None) -> subprocess.Popen:
        """start.sh --supervise against the fake, as a process; running until it logs that
        it supervises (60 s at most; a quiet machine needs about 1 s)."""
        command = [*launcher, "bash", START, "--base-url", self.url, "--log-dir", self.logs,
                   "--textfile", os.path.join(self.tmp, "offload.prom"),
                   "--supervise", "--", *(server or self.fake())]
        proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.STDOUT,
                                env=dict(os.environ, START_POLL_S="0.2",
                                         START_STOP_GRACE_S="3", **(env or {})),
                                start_new_session=True)
        self.addCleanup(lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
        deadline = time.monotonic() + 60
        while SUPERVISING not in self.start_log() and time.monotonic() < deadline:
            if proc.poll() is not None:
                self.fail(f"start.sh ended ({proc.returncode}) before it supervised; its "
                          f"log ends:\n{self.start_log()[-3000:]}")
            time.sleep(0.05)
        self.assertIn(SUPERVISING, self.start_log())
        return proc

    def as_pid_1(self, shell: str) -> tuple[subprocess.Popen, int]:
        """start.sh --supervise as PID 1 of a new PID namespace, its server `bash -c shell`
        ({fake}: the fake's command); the process and PID 1's pid outside."""
        fake = " ".join(f"'{arg}'" for arg in self.fake())
        proc = self.supervised("unshare", "-pf", "--mount-proc", server=[
            "bash", "-c", shell.format(fake=fake)])
        (pid_1,) = children_of(proc.pid)
        return proc, pid_1

    def start_log(self) -> str:
        try:
            with open(os.path.join(self.logs, "start.log")) as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def test_term_reaches_the_server_and_its_status_is_start_sh_s(self):
        proc = self.supervised()
        server = self.server_pid()
        os.kill(proc.pid, signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=30), 0, "the fake ends gracefully on TERM: 0")
        self.assertIn("TERM received: passed on to the server (pid ", self.start_log())
        self.assertRegex(self.start_log(), r"server ended with status 0 after \d+ s, asked to "
                                           r"stop \(TERM passed on\): start.sh exits 0")
        self.assertRegex(self.start_log(), r"stop: drained: the server ended \d+\.\d s after "
                                           r"TERM, within the 3 s grace")
        found = self.textfile_samples()
        self.assertEqual(found["offload_stop_last_killed"], 0.0)
        self.assertLess(found["offload_stop_last_duration_seconds"], 3.0)
        self.assertIn("offload_warmup_last_run_success", found, "the warm-up's stay")
        self.assertFalse(os.path.exists(f"/proc/{server}"), "the server is gone and reaped")

    def test_a_server_that_outlasts_the_grace_is_killed_and_the_stop_says_so(self):
        proc = self.supervised(server=self.fake("--ignore-term"))
        os.kill(proc.pid, signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=30), 128 + signal.SIGKILL)
        # KILLed, with nothing in flight at the TERM: nothing was cut (a hostile review)
        self.assertIn("stop: drained: KILLed after the 3 s grace (START_STOP_GRACE_S): nothing "
                      "was in flight at the TERM", self.start_log())
        found = self.textfile_samples()
        self.assertEqual((found["offload_stop_last_killed"], found["offload_stop_last_grace_seconds"]),
                         (1.0, 3.0))
        self.assertGreaterEqual(found["offload_stop_last_duration_seconds"], 3.0)

    def textfile_samples(self) -> dict:
        """The unlabelled samples of the textfile start.sh --supervise published."""
        with open(os.path.join(self.tmp, "offload.prom")) as handle:
            return {name: value for name, labels, value in
                    prometheus.parse_prometheus(handle.read()).samples if not labels}

    def test_a_server_killed_from_outside_ends_start_sh_at_once(self):
        proc = self.supervised()
        os.kill(self.server_pid(), signal.SIGKILL)
        started = time.monotonic()
        self.assertEqual(proc.wait(timeout=30), 128 + signal.SIGKILL)
        self.assertLess(time.monotonic() - started, 5, "a second on a quiet machine")
        self.assertRegex(self.start_log(), r"ERROR: server ended by signal SIGKILL after \d+ "
                                           r"s, unasked")

    def test_a_crashed_server_s_child_does_not_keep_it_alive(self):
        # A server whose child outlives it (vLLM's engine core processes after a kill -9
        # of the API server): start.sh ends, and nothing of the group is left.
        proc = self.supervised(server=["bash", "-c", 'sleep 600 & exec "$@"', "server",
                                       *self.fake()])
        group = self.server_pid()
        os.kill(group, signal.SIGKILL)
        started = time.monotonic()
        self.assertEqual(proc.wait(timeout=60), 128 + signal.SIGKILL)
        self.assertLess(time.monotonic() - started, 10 + 3, "10 s and the grace, at most")
        self.assertFalse(group_alive(group), "the child that outlived the server is stopped")
        self.assertIn("stopping what is left of server process group", self.start_log())

    def test_an_exit_0_nobody_asked_for_ends_start_sh_non_zero(self):
        # vLLM exits 0 when its engine core dies: a restart policy must still restart it.
        trigger = os.path.join(self.tmp, "die")
        proc = self.supervised(server=self.fake("--exit-when", trigger, "--exit-status", "0"))
        open(trigger, "w").close()                       # once it supervises
        self.assertEqual(proc.wait(timeout=60), 1)
        self.assertRegex(self.start_log(), r"server ended with status 0 after \d+ s, unasked")

    def test_a_reader_that_stops_reading_never_holds_start_sh(self):
        # The server floods its output while nobody reads start.sh's: the server is not
        # held (its pipe is always read), and start.sh still ends with it, memory bounded.
        flood = ("import sys, time\nend = time.time() + 60\nwhile time.time() < end:\n"
                 "    sys.stdout.write('x' * 65535 + '\\n')\n    sys.stdout.flush()\n"
                 "    time.sleep(0.002)\n")
        proc = self.supervised(server=["bash", "-c", f'{sys.executable} -c "$0" & exec "$@"',
                                       flood, *self.fake()], stdout=subprocess.PIPE,
                               env={"START_LOG_MAX_BYTES": "1000000"})
        time.sleep(1)
        with open(f"/proc/{proc.pid}/status") as handle:     # start.sh execs the launcher
            rss_kib = int(next(line for line in handle if line.startswith("VmRSS")).split()[1])
        self.assertLess(rss_kib, 200 << 10, "what waits for a reader is bounded")
        os.kill(self.server_pid(), signal.SIGKILL)
        self.assertEqual(proc.wait(timeout=30), 128 + signal.SIGKILL)
        self.assertIn("unasked", self.start_log())
        self.assertLessEqual(os.path.getsize(os.path.join(self.logs, "server.log")), 1000000)

    def test_the_server_s_output_reaches_start_sh_s_and_its_log_is_bounded(self):
        out = os.path.join(self.tmp, "container.log")
        with open(out, "w") as stdout:
            proc = self.supervised(server=self.fake("--chatter-bytes", "250000"), stdout=stdout,
                                   env={"START_LOG_MAX_BYTES": "100000"})
            os.kill(proc.pid, signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=30), 0)
        with open(out) as handle:
            shown = handle.read()
        self.assertIn("server| fake vLLM", shown, "the server's start line, told apart")
        self.assertIn("server| INFO [chatter.py:1] line 00002499", shown)
        self.assertIn("supervising server process group", shown)
        log = os.path.join(self.logs, "server.log")
        for path in (log, log + ".1"):
            self.assertLessEqual(os.path.getsize(path), 100000, path)
        self.assertFalse(os.path.exists(log + ".2"), "one old copy")

    @NEEDS_PID_NAMESPACE
    def test_as_pid_1_of_a_pid_namespace(self):
        proc = self.supervised("unshare", "-pf", "--mount-proc")
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        self.assertEqual(len(children), 1, "start.sh runs as the namespace's PID 1")
        os.kill(int(children[0]), signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=30), 0)
        self.assertIn("TERM received: passed on", self.start_log())


    @NEEDS_PID_NAMESPACE
    def test_as_pid_1_it_reaps_orphans_and_ends_with_a_killed_server(self):
        # The server leaves an orphan (a subshell's background sleep), which the kernel
        # hands to PID 1: start.sh must reap it, and end when the server is killed.
        proc, pid_1 = self.as_pid_1("(sleep 0.3 &); exec {fake}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                state(pid) == "Z" or name_of(pid) == "sleep" for pid in children_of(pid_1)):
            time.sleep(0.05)
        left = children_of(pid_1)
        self.assertEqual([name_of(pid) for pid in left], [os.path.basename(sys.executable)],
                         "only the server is left: the orphan ran and was reaped")
        os.kill(left[0], signal.SIGKILL)
        started = time.monotonic()
        self.assertEqual(proc.wait(timeout=30), 128 + signal.SIGKILL)
        self.assertLess(time.monotonic() - started, 5, "a second on a quiet machine")

    @NEEDS_PID_NAMESPACE
    def test_as_pid_1_a_crashed_server_ends_the_container(self):
        proc, pid_1 = self.as_pid_1('sleep 600 & exec {fake}')
        server = self.server_pid()
        os.kill(self.outside_pid(pid_1, server), signal.SIGKILL)
        self.assertEqual(proc.wait(timeout=60), 128 + signal.SIGKILL)
        self.assertEqual(children_of(pid_1), [], "no process of the server is left")
        self.assertIn("unasked", self.start_log())

    def outside_pid(self, pid_1: int, inside: int) -> int:
        """The pid, seen from here, of the namespace's process `inside` (server.pid holds
        the namespace's own pid)."""
        for pid in children_of(pid_1):
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("NSpid:") and line.split()[-1] == str(inside):
                        return pid
        self.fail(f"no process {inside} under PID 1 ({pid_1})")


def children_of(pid: int) -> list[int]:
    """The pids whose parent is pid (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry))
    return sorted(found)


def state(pid: int) -> str:
    stat = proc_stat(str(pid))
    return stat[0] if stat else "gone"


def name_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return "gone"


class TestOneAddress(StartCase):
    def test_a_port_or_host_other_than_the_base_url_s_is_a_usage_error(self):
        other = str(free_port())
        for server, said in (
                ([*PYTHON, FAKE, "--port", other], f"the server command --port {other}"),
                ([*PYTHON, FAKE, f"--port={self.port}", "--host", "10.1.2.3"],
                 "names host 127.0.0.1, the server command --host 10.1.2.3")):
            with self.subTest(said=said):
                result = self.refused("--base-url", self.url, "--log-dir", self.logs, "--",
                                      *server)
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn(said, result.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.logs, "server.pid")))
        # Set by the variable, the variable is named (not a flag nobody gave).
        result = self.refused("--log-dir", self.logs, "--", *PYTHON, FAKE, "--port", other,
                              env={"START_BASE_URL": self.url})
        self.assertEqual(result.code, 2, result.stderr)
        self.assertIn(f"START_BASE_URL {self.url} names port {self.port}", result.stderr)

    def test_the_last_chunk_flag_counts_as_vllm_s_parser_takes_it(self):
        self.assertEqual(flag_value("--max-num-batched-tokens", [
            "serve", "--max-num-batched-tokens", "4096", "m", "--max-num-batched-tokens=16384"]),
            "16384")

    def test_the_chunk_from_this_start_s_server_log(self):
        # vLLM 0.32's lines, as a real server printed them (a spec-decoding server without
        # --max-num-batched-tokens says only the second); an earlier start's line is past.
        os.makedirs(self.logs)
        with open(os.path.join(self.logs, "server.log"), "w") as handle:
            handle.write("INFO [scheduler.py:307] Chunked prefill is enabled with "
                         "max_num_batched_tokens=8192.\n")
            offset = handle.tell()
            handle.write("(APIServer pid=1) WARNING 12-02 01:33:55 [vllm.py:2276] "
                         "max_num_scheduled_tokens is set to 2048 based on the speculative "
                         "decoding settings.\n")
        settings = Settings(["--log-dir", self.logs, "--", "vllm"], {})
        server = LaunchedServer(settings, Log(self.logs))
        for start_offset, chunk in ((offset, "2048"), (10 ** 6, "")):
            self.assertEqual(logged_chunk(server.logged_since(start_offset)), chunk)

    def test_one_address_written_two_ways_is_fine(self):
        result = self.start("--no-warmup", server=[*self.fake(), "--host", "0.0.0.0"])
        self.assertEqual(result.code, 0, result.stderr)

    def test_the_port_is_said_once_in_the_server_command(self):
        command = ["bash", START, "--log-dir", self.logs, "--", sys.executable, FAKE,
                   "--latency-s", "0.01", "--port", str(self.port), "--host", "0.0.0.0"]
        result = self.run_process(command, env={"START_POLL_S": "0.2"}, timeout=90,
                                  records=self.records())
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn(f"WARMUP_BASE_URL http://127.0.0.1:{self.port}", result.stdout)
        self.assertIn("OK: warm-up passed", result.stdout)
        self.assertEqual(server_command.command_url(["vllm", "serve", "m"]), "http://127.0.0.1:8000")
        self.assertEqual(server_command.command_url(["x", "--port=8041", "--host", "::1"]),
                         "http://[::1]:8041")


class TestStartRefusesOddPaths(StartCase):
    def test_a_fifo_ready_file_is_refused_and_left_alone(self):
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        for option in ("--ready-file", "--textfile"):
            with self.subTest(option):
                result = self.start(option, fifo, server=["true"], timeout=30)
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn("is not a regular file", result.stderr)
                self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode), "never removed")


class TestStartSaysItWaits(StartCase):
    def test_start_says_it_waits_for_health(self):
        result = self.start("--no-warmup", server=self.fake("--health-delay-s", "1.6"),
                            env={"START_SAY_S": "1"}, timeout=60)
        self.assertEqual(result.code, 0, result.stderr)
        self.assertRegex(result.stdout, r"waiting for http://127\.0\.0\.1:\d+/health: \d+ s of "
                                        r"the 600 s start guard; server process group \d+ is "
                                        r"running")

    def test_a_bad_start_variable_is_named(self):
        result = self.refused("--", *self.fake(), env={"START_GUARD_S": "soon"})
        self.assertEqual(result.code, 2)
        self.assertIn("START_GUARD_S: must be a whole number", result.stderr)
        flagged = self.refused("--start-guard-s", "soon", "--", *self.fake())
        self.assertIn("argument --start-guard-s: must be a whole number", flagged.stderr)


class TestStartWarnsOnACustomPlan(StartCase):
    def test_warn_names_the_variable_and_no_ready_file(self):
        result = self.start("--ready-file", self.ready, server=self.fake(),
                            env={"WARMUP_TOKENS": "2", "WARMUP_WAVES": "1,2"})
        self.assertEqual(result.code, 0, result.stdout)
        self.assertIn("WARN: warm-up passed a custom plan, not the contract's: tokens 2 "
                      "(WARMUP_TOKENS=2 from the environment); waves B1,B2 (WARMUP_WAVES=1,2 "
                      "from the environment); no ready file", result.stdout)
        self.assertNotIn("OK:", result.stdout)
        self.assertFalse(os.path.exists(self.ready))


class TestStartPublishesEveryOutcome(StartCase):
    """The textfile is rewritten for every start that begins a warm-up: a server that never
    became healthy and a warm-up that could not begin both leave success 0."""
    runs_long = 4                         # seconds on a quiet run: run.py starts it early

    def setUp(self):
        super().setUp()
        self.textfile = os.path.join(self.tmp, "offload.prom")

    def published(self) -> str:
        with open(self.textfile) as handle:
            return handle.read()

    def test_a_pass_then_a_server_that_never_answers_health(self):
        passed = self.start("--textfile", self.textfile, server=self.fake())
        self.assertIn("OK: warm-up passed", passed.stdout)
        self.assertIn("offload_warmup_last_run_success 1.0", self.published())
        os.killpg(self.server_pid(), signal.SIGKILL)
        deadline = time.monotonic() + 20
        while group_alive(self.server_pid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        never = self.start("--textfile", self.textfile, "--start-guard-s", "1",
                           server=self.fake("--health-delay-s", "1000"), timeout=30)
        self.assertEqual(never.code, 1)
        text = self.published()
        self.assertIn("offload_warmup_last_run_success 0.0", text)
        self.assertIn('offload_warmup_last_run_verdict{verdict="not_started"} 1.0', text)
        self.assertIn("offload_warmup_last_success_timestamp_seconds", text,
                      "the last success's time is kept")

    def test_a_warm_up_that_cannot_begin_is_published_and_its_warn_names_what_exists(self):
        result = self.start("--textfile", self.textfile, server=self.fake(),
                            env={"WARMUP_TOKENS": "abc"})
        self.assertEqual(result.code, 0, result.stderr)
        text = self.published()
        self.assertIn("offload_warmup_last_run_success 0.0", text)
        self.assertIn('offload_warmup_last_run_verdict{verdict="usage"} 1.0', text)
        warn = [line for line in result.stdout.splitlines() if "WARN:" in line]
        self.assertEqual(len(warn), 1, result.stdout)
        self.assertIn("exit 2", warn[0])
        self.assertIn("no records file", warn[0])
        for path in re.findall(r"(/[^\s;,()]+)", warn[0]):
            self.assertTrue(os.path.exists(path), f"the WARN names {path}, which is not there")
        self.assertNotIn("results published", result.stdout.replace(
            f"results published for monitoring in {self.textfile}", ""))

    def test_a_lowered_hard_bound_still_passes(self):
        result = self.start("--textfile", self.textfile, server=self.fake(),
                            env={"WARMUP_HARD_S": "60"})
        self.assertIn("OK: warm-up passed", result.stdout)
        self.assertIn("offload_warmup_last_run_success 1.0", self.published())


class TestStartFindsTheChunk(StartCase):
    def test_from_the_server_log_when_the_command_does_not_say(self):
        # The fake logs vLLM's start line; its command line names no chunk here.
        # A WARMUP_CHUNK_TOKENS below the server's own would let B1 pass unchunked.
        result = self.start(server=self.fake("--max-model-len", "32768"),
                            env={"WARMUP_CHUNK_TOKENS": "2048"})
        self.assertEqual(result.code, 0, result.stdout)
        self.assertIn("prefill chunk 4096 tokens (from server.log): B1 is sized past it where "
                      "the context allows; "
                      "WARMUP_CHUNK_TOKENS '2048' is not used", result.stdout)
        warmed = [name for name in os.listdir(self.logs) if name.startswith("warmup-")]
        found, _ = read_records(os.path.join(self.logs, warmed[0]))
        run = [r for r in found if r["record"] == "run"][0]
        self.assertEqual((run["plan"]["chunk_tokens"], run["plan"]["chunk_source"]),
                         (4096, "WARMUP_CHUNK_TOKENS"))
        self.assertIn("; chunk 4096 from server.log;", result.stdout.split("OK: ")[1])

    def test_a_chunk_nobody_said_is_said_assumed(self):
        # vLLM 0.32's CPU build logs no chunk; the command names none: 4096 is assumed.
        result = self.start(server=self.fake("--cpu-build"))
        self.assertEqual(result.code, 0, result.stdout)
        self.assertIn("; chunk 4096 assumed: pass --max-num-batched-tokens;",
                      result.stdout.split("OK: ")[1])
        self.assertIn("(chunk 4096 assumed: pass --chunk-tokens)", result.stdout)


class TestStartPassesTheChunk(StartCase):
    def test_start_sh_reads_the_chunk_from_the_server_command(self):
        # vLLM reads 6K as 6144 tokens; the command's chunk wins over the variable.
        result = self.start(server=self.fake("--max-model-len", "8192",
                                             "--max-num-batched-tokens=6K"),
                            env={"WARMUP_CHUNK_TOKENS": "4096"})
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn("prefill chunk 6144 tokens (from the server command's "
                      "--max-num-batched-tokens): B1 is sized past it where the context "
                      "allows; WARMUP_CHUNK_TOKENS "
                      "'4096' is not used", self.start_log())
        records, _ = read_records(self.records())
        b1 = [r for r in records if r["record"] == "request"][0]
        self.assertGreater(b1["prompt_tokens"], 6144)
        run = [r for r in records if r["record"] == "run"][0]
        self.assertEqual(run["plan"]["chunk_tokens"], 6144)
        self.assertTrue(re.search(r"max-num-batched-tokens=6K", self.start_log()))
        self.assertEqual(json.loads(json.dumps(run["plan"]))["b1_min_prompt_tokens"], 6145)
        self.assertIn("; chunk 6144 from the command;", self.start_log().split("OK: ")[1])

    def test_tokens_are_read_as_vllm_reads_them(self):
        readings = {"4096": "4096", "16K": "16384", "8k": "8000", "25.6k": "25600",
                    " 2M": "2097152", "1.5K": "", "4096.5": "", "lots": "", "": ""}
        self.assertEqual({text: tokens_value(text) for text in readings}, readings)



class TestStartSizesB1ToTheServer(StartCase):
    """The default plan on servers smaller than K1: B1 past the chunk inside the context,
    or, where the context holds no longer prompt, the longest it holds, said."""

    def test_a_small_context_and_chunk_pass_with_b1_between_them(self):
        result = self.start("--ready-file", self.ready, server=self.fake(
            "--max-model-len", "4096", "--max-num-batched-tokens", "2048"))
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("OK: warm-up passed: contract 10/10", result.stdout)
        self.assertTrue(os.path.exists(self.ready))
        records, _ = read_records(self.records())
        b1 = [r for r in records if r["record"] == "request"][0]
        self.assertTrue(2048 < b1["prompt_tokens"] <= 4064, b1["prompt_tokens"])
        self.assertNotIn("one prefill step", result.stdout)

    def test_a_chunk_as_long_as_the_context_passes_in_one_step_said(self):
        said = ("B1 in one prefill step: this server's chunk (8192) is not smaller than its "
                "context (8192)")
        result = self.start("--ready-file", self.ready, server=self.fake(
            "--max-model-len", "8192", "--max-num-batched-tokens", "8192"))
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        ok = [line for line in result.stdout.splitlines() if " OK: " in line]
        self.assertIn(said, ok[0])
        self.assertIn(said, [line for line in result.stdout.splitlines()
                             if line.startswith("warm-up ")][0], "the first line says it")
        self.assertTrue(os.path.exists(self.ready))
        records, _ = read_records(self.records())
        self.assertIn(said, records[-1]["notes"])
        self.assertTrue([r for r in records if r["record"] == "run"][0]["plan"]["b1_one_step"])
        b1 = [r for r in records if r["record"] == "request"][0]
        self.assertTrue(7140 <= b1["prompt_tokens"] <= 8160, b1["prompt_tokens"])


if __name__ == "__main__":
    unittest.main()
