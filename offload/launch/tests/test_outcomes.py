"""Every outcome publishes, under one name: the wrapper, the warm-up and start.sh leave no
stale success in the textfile, name a configuration error 'usage' on the terminal, in
start.log and in the textfile alike, and say a kill the hard bound did not make as such."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import unittest

from support import LAUNCH, REPO, START as START_SH, WRAPPER, HelperCase, StartCase, wait_running
import core.runframe as runframe  # noqa: E402  (support puts offload/launch on sys.path)
import core.textfile as textfile  # noqa: E402
import core.cli as cli  # noqa: E402
import core.ending as ending  # noqa: E402

SUCCESS = "offload_warmup_last_run_success 1.0"


def stale_success(path: str) -> None:
    """A textfile as a passing run left it."""
    samples = textfile.result_samples("offload_warmup", {"verdict": "pass", "exit_code": 0,
                                                         "elapsed_s": 1.0}, time.time())
    assert textfile.publish(path, "offload_warmup", samples) is None


def verdict_of(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    found = re.findall(r'offload_warmup_last_run_verdict\{verdict="([a-z_]+)"\} 1\.0', text)
    return found[0] if len(found) == 1 else f"unclear: {found}"


def event_table() -> list[dict]:
    """CONTRACT section 14's rows, each a dict of its columns."""
    with open(os.path.join(LAUNCH, "CONTRACT.md"), encoding="utf-8") as handle:
        text = handle.read().split("## 14. One name per event", 1)[1]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    heads = rows[0]
    return [dict(zip(heads, row)) for row in rows[1:]]


def quoted(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


class TestEventTable(unittest.TestCase):
    """Every row of the event table: the one name on the terminal, in start.log and in
    the textfile, and the alert (or none) its textfile raises in promtool."""

    def test_every_row_names_its_event_once(self):
        rows = event_table()
        self.assertGreaterEqual(len(rows), 10)
        for row in rows:
            with self.subTest(event=row["event"]):
                name = quoted(row["textfile"])[0]
                self.assertIn(name, textfile.VERDICTS)
                codes = [int(c) for c in re.findall(r"\d+", row["exit"])]
                if row["exit"].isdigit() or "/" in row["exit"]:
                    for code in codes:       # what a step without a summary is named
                        if name not in ("pass", "custom"):
                            self.assertEqual(textfile.outcome_of_status(code), name, code)
                    said = quoted(row["terminal"])[0]
                    if said.endswith(f"(exit {codes[0]})"):
                        summary = {"verdict": "fail" if name == "usage" else name,
                                   "exit_code": codes[0], "problems": [], "elapsed_s": 1.0}
                        self.assertTrue(runframe.verdict_line(summary, "r").startswith(said),
                                        said)
                        self.assertEqual(cli.outcome(summary["verdict"], codes[0]), name)
                    self.assertIn(f"verdict {name}", quoted(row["start.log"]))

    def test_every_row_raises_its_alert_and_no_other(self):
        promtool = shutil.which("promtool")
        if not promtool:
            self.skipTest("promtool is not installed (.ci/run installs it)")
        rows = event_table()
        alerts = ("OffloadWarmupFailed", "OffloadWarmupCustomPlan", "OffloadWarmupRefused",
                  "OffloadWarmupNeverEnded")
        tests = []
        for number, row in enumerate(rows):
            name = quoted(row["textfile"])[0]
            codes = re.findall(r"\d+", row["exit"]) or ["1"]
            series = [(f'offload_warmup_last_run_verdict{{instance="e{number}", job="vllm-offload", '
                       f'verdict="{v}"}}', "1" if v == name else "0") for v in textfile.VERDICTS]
            series += [(f'offload_warmup_last_run_exit_code{{instance="e{number}", '
                        f'job="vllm-offload"}}', codes[0]),
                       (f'offload_warmup_last_run_started_timestamp_seconds{{instance='
                        f'"e{number}", job="vllm-offload"}}', "0")]
            tests.append({"interval": "1m", "input_series": [
                {"series": s, "values": f"{v}x30"} for s, v in series],
                "alert_rule_test": [{"eval_time": "25m", "alertname": a, "exp_alerts": []}
                                    for a in alerts]})
        spec = os.path.join(self.tmp(), "events_test.yml")
        with open(spec, "w", encoding="utf-8") as handle:     # JSON is YAML
            json.dump({"rule_files": [os.path.join(REPO, "offload", "monitoring",
                                                   "alerts.yml")],
                       "evaluation_interval": "1m", "tests": tests}, handle)
        done = subprocess.run([promtool, "test", "rules", spec], capture_output=True,
                              text=True, timeout=60)
        fired = {}
        for labels in re.findall(r"Labels:\{([^}]*)\}", done.stdout + done.stderr):
            found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            fired.setdefault(found["instance"], set()).add(
                (found["alertname"], found["severity"]))
        for number, row in enumerate(rows):
            with self.subTest(event=row["event"]):
                want = set() if row["alert"] == "none" else {
                    (quoted(row["alert"])[0], row["alert"].split()[-1])}
                self.assertEqual(fired.get(f"e{number}", set()), want)

    def tmp(self) -> str:
        import tempfile
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        return folder


class TestWrapperPublishes(HelperCase):
    def setUp(self):
        super().setUp()
        self.textfile = os.path.join(self.tmp, "offload.prom")
        stale_success(self.textfile)

    def wrapper(self, *args: str, env: dict | None = None, timeout: float = 60):
        return self.run_process(["bash", WRAPPER, *args], env=dict(
            {"WARMUP_TEXTFILE": self.textfile}, **(env or {})), timeout=timeout)

    def test_a_hard_bound_with_a_leading_zero_is_decimal(self):
        server = self.start_fake(latency_s=0.01)
        result = self.wrapper("--base-url", server.url, "--records", self.records_path,
                              env={"WARMUP_HARD_S": "08"})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertEqual(verdict_of(self.textfile), "pass")
        refused = self.wrapper("--base-url", server.url, env={"WARMUP_HARD_S": "086401"})
        self.assertEqual(refused.code, 2, refused.stderr)
        self.assertIn("from 1 to 86400, got '086401'", refused.stderr)
        self.assertEqual(verdict_of(self.textfile), "usage")

    def test_records_that_cannot_be_written_publish_a_usage_error(self):
        server = self.start_fake(latency_s=0.01)
        under_a_file = os.path.join(self.textfile, "r.jsonl")
        for records in ("/dev/full", under_a_file):
            with self.subTest(records=records):
                stale_success(self.textfile)
                result = self.wrapper("--base-url", server.url, "--records", records)
                self.assertEqual(result.code, 2, result.stdout + result.stderr)
                self.assertIn("cannot write records to", result.stderr)
                self.assertEqual(verdict_of(self.textfile), "usage")
        self.assertEqual(server.state.completions(), [])

    def test_a_python_that_runs_nothing_is_no_run(self):
        server = self.start_fake(latency_s=0.01)
        result = self.wrapper("--base-url", server.url, "--records", self.records_path,
                              env={"WARMUP_PYTHON": "/bin/true"})
        self.assertEqual(result.code, 2, result.stderr)
        self.assertIn("'/bin/true' does not run Python 3.10 or later (set WARMUP_PYTHON)",
                      result.stderr)
        self.assertEqual(verdict_of(self.textfile), "usage")
        self.assertEqual(server.state.completions(), [])

    def test_no_temporary_folder_is_a_usage_error_before_anything_is_sent(self):
        server = self.start_fake(latency_s=0.01)
        result = self.wrapper("--base-url", server.url, "--records", self.records_path,
                              env={"TMPDIR": os.path.join(self.tmp, "gone")})
        self.assertEqual(result.code, 2, result.stderr)
        self.assertIn("cannot create a temporary file in", result.stderr)
        self.assertEqual(verdict_of(self.textfile), "usage")
        self.assertEqual(server.state.completions(), [])

    def test_a_kill_the_bound_did_not_make_is_named_as_such(self):
        server = self.start_fake(latency_s=2.0)
        proc = subprocess.Popen(["bash", WRAPPER, "--base-url", server.url, "--records",
                                 self.records_path], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, WARMUP_TEXTFILE=self.textfile))
        self.addCleanup(proc.kill)
        self.wait_for_completions(server, 1)           # the helper is sending B1
        helper = subprocess.run(["pgrep", "-f", "-P", str(self.timeout_pid(proc.pid)),
                                 "import warmup"], capture_output=True, text=True).stdout
        os.kill(int(helper.split()[0]), signal.SIGKILL)   # as the OOM killer would
        out, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 137, err)
        self.assertIn("warm-up killed by signal 9 (not the hard bound; exit 137)", err)
        self.assertNotIn("by the hard bound", err)
        self.assertEqual(verdict_of(self.textfile), "killed", "not 'running' for ever")

    def test_how_a_helper_ended_is_said_only_when_it_did_not_end_by_itself(self):
        said = [ending.ending_said(status, 100.0, 5, "95", now) for status, now in
                ((0, 200.0), (1, 200.0), (124, 96.0), (137, 101.0), (137, 106.0),
                 (143, 50.0))]
        self.assertEqual(said, [None, None,
                                "warm-up ended by the hard bound (TERM at 95 s, exit 124)",
                                "warm-up killed by signal 9 (not the hard bound; exit 137)",
                                "warm-up killed by the hard bound (KILL at 95+5 s, exit 137)",
                                "warm-up killed by signal 15 (not the hard bound; exit 143)"])

    @staticmethod
    def timeout_pid(wrapper_pid: int) -> int:
        """The wrapper's coreutils timeout (its only child), once it is there."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = subprocess.run(["pgrep", "-P", str(wrapper_pid)], capture_output=True,
                                   text=True).stdout.split()
            if found:
                return int(found[0])
            time.sleep(0.05)
        raise AssertionError("the wrapper started no timeout")


class TestWarmupNamesAUsageError(HelperCase):
    def test_a_configuration_error_found_during_a_run_is_usage_everywhere(self):
        server = self.start_fake(latency_s=0.01)
        path = os.path.join(self.tmp, "offload.prom")
        result = self.run_helper(server, "--textfile", path,
                                 env={"WARMUP_LOCK_DIR": os.path.join(self.tmp, "no")})
        self.assertEqual(result.code, 2)
        self.assertIn("USAGE (exit 2)", result.stdout)
        self.assertNotIn("FAIL", result.stdout)
        self.assertEqual(verdict_of(path), "usage")


class TestStartPublishes(StartCase):
    runs_long = 3                         # seconds on a quiet run: run.py starts it early
    def setUp(self):
        super().setUp()
        self.textfile = os.path.join(self.tmp, "offload.prom")
        stale_success(self.textfile)

    def test_warmup_textfile_alone_is_where_a_server_never_healthy_is_published(self):
        result = self.start("--start-guard-s", "1", server=self.fake("--health-delay-s", "1000"),
                            env={"WARMUP_TEXTFILE": self.textfile}, timeout=30)
        self.assertEqual(result.code, 1)
        self.assertEqual(verdict_of(self.textfile), "not_started")

    def test_a_bad_lock_dir_is_usage_on_every_sink(self):
        result = self.start("--textfile", self.textfile, server=self.fake(),
                            env={"WARMUP_LOCK_DIR": os.path.join(self.tmp, "no")})
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn("USAGE (exit 2)", result.stdout)
        self.assertIn("warm-up ended: exit 2, verdict usage", self.start_log())
        self.assertEqual(verdict_of(self.textfile), "usage")


class TestLeftoversNamed(StartCase):
    def test_a_variable_left_in_the_environment_is_named_where_the_operator_looks(self):
        result = self.start(server=self.fake(), env={"WARMUP_PATHS": "stream",
                                                     "WARMUP_HARD_S": "60",
                                                     "WARMUP_WAVE": "1,2"})
        self.assertEqual(result.code, 0, result.stderr)
        first = [line for line in result.stdout.splitlines() if line.startswith("warm-up 2")][0]
        self.assertIn("deadline 55 s; given: WARMUP_PATHS=stream from the environment; "
                      "environment: WARMUP_BASE_URL=" + self.url, first)
        self.assertIn("WARMUP_HARD_S=60", first)
        self.assertIn("WARMUP_WAVE (not a variable the warm-up reads)", first)
        self.assertIn("WARN: warm-up passed a custom plan, not the contract's: paths stream "
                      "(WARMUP_PATHS=stream from the environment); no ready file; records: ",
                      result.stdout)


class TestStartStepsLeaveNothing(StartCase):
    runs_long = 10                        # seconds on a quiet run: run.py starts it early
    def test_a_wrapper_killed_under_start_sh_takes_its_helper_with_it(self):
        textfile = os.path.join(self.tmp, "offload.prom")
        proc = subprocess.Popen(["bash", START_SH, "--base-url", self.url, "--log-dir",
                                 self.logs, "--textfile", textfile, "--",
                                 *self.fake("--latency-s", "1")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, START_POLL_S="0.2"))
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 30
        wrapper = []
        while not wrapper and time.monotonic() < deadline:
            wrapper = subprocess.run(["pgrep", "-f", "bash .*warmup_serve.sh --records " +
                                      self.logs], capture_output=True, text=True).stdout.split()
            time.sleep(0.1)
        wait_running(self.url, 1)                  # the helper is sending B1 (1 s)
        os.kill(int(wrapper[0]), signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        self.assertIn("warm-up ended: exit 137, verdict killed", out)
        time.sleep(6)                              # what a helper left running would do
        self.assertEqual(verdict_of(textfile), "killed", "no later pass from an orphan")
        left = subprocess.run(["pgrep", "-f", "import warmup"], capture_output=True, text=True)
        self.assertNotIn(self.logs, subprocess.run(
            ["ps", "-o", "args=", "-p", ",".join(left.stdout.split()) or "0"],
            capture_output=True, text=True).stdout)

    def test_a_pid_file_naming_pid_1_is_stale_not_a_server(self):
        os.makedirs(self.logs, exist_ok=True)
        with open(os.path.join(self.logs, "server.pid"), "w") as handle:
            handle.write("1\n")
        result = self.start(server=self.fake())
        self.assertEqual(result.code, 0, result.stderr)
        self.assertNotIn("kill -TERM -- -1", result.stderr)
        self.assertIn("stale", self.start_log())


class TestStartSaysWhoHoldsThePort(StartCase):
    def test_a_server_that_daemonizes_is_named_with_the_pid_still_listening(self):
        daemon_pid = os.path.join(self.tmp, "daemon.pid")
        script = os.path.join(self.tmp, "daemonize.py")
        with open(script, "w", encoding="utf-8") as handle:
            handle.write(f"""
import subprocess, time, urllib.request
daemon = subprocess.Popen({self.fake()!r}, start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
open({daemon_pid!r}, "w").write(str(daemon.pid))
for _ in range(400):
    try:
        urllib.request.urlopen({self.url!r} + "/health", timeout=1)
        break
    except OSError:
        time.sleep(0.05)
""")
        self.addCleanup(self.kill_pid_in, daemon_pid)
        result = self.start("--ready-file", self.ready, server=[sys.executable, script])
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        with open(daemon_pid) as handle:
            pid = handle.read().strip()
        self.assertRegex(result.stderr, rf"held by pid {pid}\b")
        self.assertNotRegex(result.stderr, r"is left$")
        self.assertFalse(os.path.exists(self.ready))
        self.assertNotIn("warm-up:", result.stdout)

    @staticmethod
    def kill_pid_in(path: str) -> None:
        if os.path.exists(path):
            with open(path) as handle:
                try:
                    os.killpg(int(handle.read()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass


@unittest.skipUnless(os.geteuid() == 0, "needs root to mount a small file system")
class TestStartOnAFullOrReadOnlyDisk(StartCase):
    def mount(self, *options: str) -> str:
        folder = os.path.join(self.tmp, "mnt")
        os.mkdir(folder)
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=64k",) + options),
                               "tmpfs", folder], capture_output=True)
        if made.returncode != 0:
            self.skipTest("cannot mount a tmpfs here")
        self.addCleanup(subprocess.run, ["umount", "-l", folder], capture_output=True)
        return folder

    def test_a_full_log_folder_is_named_with_no_space_left(self):
        self.logs = self.mount()
        with open(os.path.join(self.logs, "start.log"), "w"):
            pass
        with open(os.path.join(self.logs, "filler"), "wb") as handle:
            try:
                handle.write(b"x" * (1 << 20))
            except OSError:
                pass
        result = self.start(server=self.fake(), timeout=60)
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        said = result.stdout + result.stderr
        self.assertIn(f"cannot write {os.path.join(self.logs, 'server.pid')}: no space left "
                      f"on the device", said)
        self.assertNotIn("Errno", said)

    def test_records_lost_mid_run_to_a_full_disk_are_a_failure_on_every_sink(self):
        folder = self.mount()
        with open(os.path.join(folder, "filler"), "wb") as handle:
            try:                           # leave room for the run record and a little
                handle.write(b"x" * (64 * 1024 - 3 * 4096))
            except OSError:
                pass
        textfile = os.path.join(self.tmp, "offload.prom")
        stale_success(textfile)
        server = self.start_fake(latency_s=0.01)
        records = os.path.join(folder, "r.jsonl")
        result = self.run_process([sys.executable, "-I", "-S", os.path.join(LAUNCH, "warmup.py"),
                                   "--base-url", server.url, "--records", records,
                                   "--textfile", textfile],
                                  records=os.path.join(self.tmp, "none"))   # cut: not read
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        self.assertIn("the run stopped (exit 1)", result.stderr)
        self.assertEqual(verdict_of(textfile), "fail")
        self.assertNotIn("Traceback", result.stdout + result.stderr)

    def test_a_read_only_log_folder_is_named_read_only(self):
        self.logs = self.mount("ro")
        result = self.start(server=self.fake(), timeout=60)
        self.assertEqual(result.code, 2, result.stdout + result.stderr)
        self.assertIn("(read-only file system); choose a writable folder", result.stderr)


if __name__ == "__main__":
    unittest.main()
