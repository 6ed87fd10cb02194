"""Signals that cannot outlive the truth: each signal goes to "not proven" before a step
that can change what is true, success is written last, and what cannot be seen is not
trusted. Real processes (the wrapper, start.sh, qualify.py), real files, real sockets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import unittest

from support import (FAKE, PYTHON, QUALIFY, START as START_SH, WRAPPER, HelperCase, StartCase,
                     read_records, run_qualify, wait_running)
from test_outcomes import stale_success, verdict_of
import core.readyfile as readyfile  # noqa: E402
# (support puts offload/launch on sys.path)
import tools.readback as readback  # noqa: E402

NEEDS_PID_NAMESPACE = unittest.skipUnless(shutil.which("unshare") and os.geteuid() == 0,
                                          "needs unshare and root for a new PID namespace")


# An interpreter that starts running the helper (the file warmup_serve.sh gives it to prove
# that, argv 5 after -I -S -c CODE, is written), then hangs.
RAN_THEN_HANG = 'echo ran > "$5"\nexec sleep 60'


def shim(folder: str, name: str, body: str) -> str:
    """An executable bash script standing in for the wrapper's interpreter."""
    path = os.path.join(folder, name)
    with open(path, "w") as handle:
        handle.write("#!/bin/bash\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


class TestTheHardBoundComesFirst(HelperCase):
    runs_long = 11                        # seconds on a quiet run: run.py starts it early
    def setUp(self):
        super().setUp()
        self.textfile = os.path.join(self.tmp, "offload.prom")
        stale_success(self.textfile)

    def wrapper(self, env: dict, *args: str):
        return self.run_process(["bash", WRAPPER, "--records", self.records_path, *args],
                                env=dict({"WARMUP_TEXTFILE": self.textfile}, **env),
                                timeout=60)

    def test_a_hanging_interpreter_ends_at_the_bound_and_is_published(self):
        hung = shim(self.tmp, "hung-python", "exec sleep 600")
        result = self.wrapper({"WARMUP_PYTHON": hung, "WARMUP_HARD_S": "2"},
                              "--base-url", "http://127.0.0.1:9")
        self.assertEqual(result.code, 124, result.stderr)
        self.assertLess(result.elapsed, 2 + 5 + 3 + 10, "the bound, its grace, the publish")
        self.assertIn("did not answer within the hard bound (2 s)", result.stderr)
        self.assertEqual(verdict_of(self.textfile), "killed")

    def test_a_helper_held_past_the_bound_is_said_and_published(self):
        held = shim(self.tmp, "held-python", RAN_THEN_HANG)   # it runs, then it hangs
        result = self.wrapper({"WARMUP_PYTHON": held, "WARMUP_HARD_S": "1"})
        self.assertEqual(result.code, 124, result.stderr)
        self.assertIn("warmup_serve.sh: warm-up ended by the hard bound (TERM at 1 s, exit "
                      "124)", result.stderr)
        self.assertEqual(verdict_of(self.textfile), "killed")

    def test_a_tiny_bound_is_refused_and_published(self):
        result = self.wrapper({"WARMUP_HARD_S": "0.01"}, "--dry-run")
        self.assertEqual(result.code, 2, result.stderr)
        self.assertIn("from 1 to 86400, got '0.01'", result.stderr)
        self.assertEqual(verdict_of(self.textfile), "usage")

    def test_a_helper_terminated_before_it_could_write_is_published_killed(self):
        # The helper's interpreter is TERMed before it runs a line (the first ~20 ms of a
        # warm-up): nothing of the helper's own could say so; the wrapper does.
        early = shim(self.tmp, "early-term", 'kill -s TERM $$')
        server = self.start_fake(latency_s=0.01)
        result = self.wrapper({"WARMUP_PYTHON": early}, "--base-url", server.url)
        self.assertEqual(result.code, 143, result.stderr)
        self.assertEqual(verdict_of(self.textfile), "killed")
        self.assertEqual(server.state.completions(), [])


    def test_a_comma_decimal_locale_keeps_the_bound(self):
        # bash writes EPOCHREALTIME with the locale's separator (1796374568,491901 in de_DE):
        # read as arithmetic, it once made `timeout 0`, no bound at all.
        locales, source = os.path.join(self.tmp, "locales"), os.path.join(self.tmp, "numeric")
        with open(source, "w") as handle:       # de_DE's numbers only: 0.5 s, not 1.5 s
            handle.write('LC_NUMERIC\ncopy "de_DE"\nEND LC_NUMERIC\n')
        os.mkdir(locales)
        if shutil.which("localedef"):
            subprocess.run(["localedef", "-c", "-i", source, "-f", "UTF-8",
                            os.path.join(locales, "de_DE.UTF-8")], capture_output=True,
                           timeout=120)
        german = {"LOCPATH": locales, "LC_ALL": "", "LC_NUMERIC": "de_DE.UTF-8"}
        said = subprocess.run(["bash", "-c", 'echo "$EPOCHREALTIME"'], capture_output=True,
                              text=True, env=dict(os.environ, **german), timeout=30).stdout
        if "," not in said:
            self.skipTest(f"no comma-decimal locale could be built here (bash said {said!r})")
        hang = shim(self.tmp, "hang-after-check", RAN_THEN_HANG)
        result = self.wrapper({"WARMUP_PYTHON": hang, "WARMUP_HARD_S": "2", **german},
                              "--base-url", "http://127.0.0.1:9")
        self.assertEqual(result.code, 124, result.stderr)
        self.assertLess(result.elapsed, 2 + 5 + 10)
        self.assertEqual(verdict_of(self.textfile), "killed")

    def test_an_interpreter_leaving_a_child_on_stdout_does_not_hold_the_wrapper(self):
        marker = f"sleep 61.{os.getpid()}"      # this process's own: another run's differs
        left = shim(self.tmp, "leaves-a-child", f'{marker} &\nexec {sys.executable} "$@"')
        self.addCleanup(subprocess.run, ["pkill", "-f", f"^{marker}$"])
        server = self.start_fake(latency_s=0.01)
        started = time.monotonic()
        with open(os.path.join(self.tmp, "out"), "w") as out:   # the child holds no pipe of ours
            code = subprocess.run(["bash", WRAPPER, "--records", self.records_path,
                                   "--base-url", server.url], stdout=out, stderr=out,
                                  env=dict(os.environ, WARMUP_PYTHON=left, WARMUP_HARD_S="30"),
                                  timeout=60).returncode
        self.assertEqual(code, 0)
        self.assertLess(time.monotonic() - started, 30, "the check's child held the wrapper")


class TestStartClearsFirst(StartCase):
    runs_long = 19                        # seconds on a quiet run: run.py starts it early
    def setUp(self):
        super().setUp()
        self.textfile = os.path.join(self.tmp, "offload.prom")
        stale_success(self.textfile)

    def test_every_refused_or_skipped_start_leaves_no_older_success(self):
        passed = self.start("--textfile", self.textfile, server=self.fake())
        self.assertEqual(passed.code, 0, passed.stdout + passed.stderr)
        self.assertEqual(verdict_of(self.textfile), "pass")
        again = self.start("--textfile", self.textfile, server=self.fake())   # a live pid
        self.assertEqual(again.code, 1)
        self.assertIn("still alive", again.stderr)
        self.assertEqual(verdict_of(self.textfile), "not_started")
        self.stop_server()
        os.remove(os.path.join(self.logs, "server.pid"))
        stale_success(self.textfile)
        other = subprocess.Popen(self.fake(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(other.wait)
        self.addCleanup(other.kill)
        deadline = time.monotonic() + 20
        while subprocess.run([*PYTHON, QUALIFY, "health", "--base-url", self.url],
                             capture_output=True).returncode and time.monotonic() < deadline:
            time.sleep(0.1)
        answered = self.start("--textfile", self.textfile, server=self.fake())
        self.assertEqual(answered.code, 1)
        self.assertIn("something already answers", answered.stderr)
        self.assertEqual(verdict_of(self.textfile), "not_started")
        stale_success(self.textfile)
        bad = self.start("--textfile", self.textfile, "--keep", "x", server=self.fake())
        self.assertEqual(bad.code, 2)
        self.assertEqual(verdict_of(self.textfile), "usage")

    def test_no_warmup_and_the_start_guard_are_not_a_pass(self):
        proc = subprocess.Popen(
            ["bash", os.path.join(os.path.dirname(QUALIFY), "..", "..", "start.sh"),
             "--base-url", self.url, "--log-dir", self.logs, "--textfile", self.textfile,
             "--no-warmup", "--", *self.fake("--health-delay-s", "2")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, START_POLL_S="0.2"))
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 20
        while verdict_of(self.textfile) == "pass" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(verdict_of(self.textfile), "starting", "cleared before the guard")
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, out + err)
        self.assertEqual(verdict_of(self.textfile), "not_warmed")

    def test_a_command_that_names_another_model_is_not_warmed(self):
        # What the command launches serves another model than the command names (a proxy
        # in front of an old server would): ERROR before any warm-up.
        other = shim(self.tmp, "serve-old", f'exec {sys.executable} {FAKE} '
                                            f'--port {self.port} --latency-s 0.01 --model old')
        result = self.start("--ready-file", self.ready, "--textfile", self.textfile,
                            server=["bash", other, "--model", "new"])
        self.assertEqual(result.code, 1, result.stdout + result.stderr)
        self.assertIn("names the model new, but", result.stderr)
        self.assertIn("serves old", result.stderr)
        self.assertNotIn("warm-up:", result.stdout)
        self.assertFalse(os.path.exists(self.ready))
        self.assertEqual(verdict_of(self.textfile), "not_started")

    def test_links_in_the_log_folder_are_never_written_through(self):
        os.makedirs(self.logs)
        target = os.path.join(self.tmp, "precious")
        with open(target, "w") as handle:
            handle.write("keep me\n")
        for name in ("server.pid", "server.url", "start.log", "server.log"):
            with self.subTest(name=name):
                link = os.path.join(self.logs, name)
                os.symlink(target, link)
                result = self.start(server=self.fake())
                os.remove(link)
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn(f"{name} is not a regular file (a link", result.stderr)
                with open(target) as handle:
                    self.assertEqual(handle.read(), "keep me\n")

    def test_rewarm_warms_the_started_server_again_and_publishes(self):
        self.assertEqual(self.refused("--rewarm", "--log-dir", self.logs, "--", "x").code, 2)
        none = self.refused("--rewarm", "--log-dir", self.logs, "--textfile", self.textfile)
        self.assertEqual(none.code, 2, none.stderr)
        self.assertIn("--rewarm: no server.pid in", none.stderr)
        self.assertIn("(--log-dir or START_LOG_DIR)", none.stderr)
        failed = self.start("--ready-file", self.ready, "--textfile", self.textfile,
                            server=self.fake("--fault", "one_token", "--fault-times", "1"))
        self.assertIn("WARN: warm-up failed", failed.stdout)
        self.assertEqual(verdict_of(self.textfile), "fail")
        again = self.run_process(["bash", START_SH, "--rewarm", "--log-dir", self.logs,
                                  "--ready-file", self.ready, "--textfile", self.textfile],
                                 timeout=120)
        self.assertEqual(again.code, 0, again.stdout + again.stderr)
        self.assertIn("OK: warm-up passed", again.stdout)
        self.assertEqual(verdict_of(self.textfile), "pass")
        with open(self.ready) as handle:
            self.assertEqual(json.load(handle)["server_pgid"], self.server_pid())
        self.assertEqual(subprocess.run([*PYTHON, QUALIFY, "ready", "--ready-file",
                                         self.ready], capture_output=True).returncode, 0)

    def test_re_warms_at_once_one_runs_and_a_refused_one_clears_the_gate_too(self):
        passed = self.start("--ready-file", self.ready, "--textfile", self.textfile, "--gate",
                            server=self.fake("--dev-mode"))
        self.assertIn("OK: warm-up passed", passed.stdout, passed.stdout + passed.stderr)
        command = ["bash", START_SH, "--rewarm", "--log-dir", self.logs, "--ready-file",
                   self.ready, "--textfile", self.textfile]
        both = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(2)]
        said = [proc.communicate(timeout=120) for proc in both]
        codes = sorted(proc.returncode for proc in both)
        self.assertEqual(codes, [0, 1], said)
        self.assertTrue(any("a start or another re-warm" in err for _, err in said), said)
        records = [n for n in os.listdir(self.logs) if n.startswith("warmup-")]
        self.assertEqual(len(records), len(set(records)))
        self.assertTrue(os.path.exists(self.ready))
        subprocess.run(["curl", "-s", "-X", "POST", self.url + "/sleep?level=1"],
                       capture_output=True, timeout=10)
        asleep = self.run_process(command + ["--gate"], timeout=120)
        self.assertEqual(asleep.code, 1, asleep.stdout + asleep.stderr)
        self.assertFalse(os.path.exists(self.ready), "refused: taken away, never restored")
        subprocess.run(["curl", "-s", "-X", "POST", self.url + "/wake_up"],
                       capture_output=True, timeout=10)
        woken = subprocess.run([*PYTHON, QUALIFY, "ready", "--ready-file", self.ready],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(woken.returncode, 1)
        self.assertIn("is missing", woken.stderr)
        with open(self.textfile) as handle:
            text = handle.read()
        self.assertNotRegex(text, r"(?m)^offload_gate_last_run_success 1")
        self.assertNotRegex(text, r"(?m)^offload_warmup_last_run_success 1")

    def test_a_re_warm_refused_by_a_busy_server_takes_readiness_away_for_good(self):
        self.ready = os.path.join(self.logs, "ready")   # one folder: its lock and the ready file's
        passed = self.start("--ready-file", self.ready, server=self.fake(
            "--fault", "slow", "--fault-match", "producer-"))
        self.assertIn("OK: warm-up passed", passed.stdout, passed.stderr)
        body = json.dumps({"model": "fake-model", "prompt": "p", "max_tokens": 4,
                           "request_id": "producer-1"})
        producer = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-H",
                                     "Content-Type: application/json", "-d", body,
                                     self.url + "/v1/completions"])
        self.addCleanup(producer.wait)
        wait_running(self.url, 1)                    # in flight: the gauges say 1 running
        busy = self.run_process(["bash", START_SH, "--rewarm", "--log-dir", self.logs,
                                 "--ready-file", self.ready], timeout=120)
        self.assertEqual(busy.code, 1, busy.stdout + busy.stderr)
        self.assertIn("removed: not ready until this re-warm passes", busy.stdout)
        self.assertIn("verdict refused", busy.stdout)
        ready = subprocess.run([*PYTHON, QUALIFY, "ready", "--ready-file", self.ready],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(ready.returncode, 1, "no warm-up passed since it was taken away")
        self.assertIn("is missing", ready.stderr)

    def test_a_term_stops_the_step_start_sh_runs_and_all_it_left(self):
        marker = f"sleep 62.{os.getpid()}"      # this process's own: another run's differs
        hang = shim(self.tmp, "hang-marker", f"exec {marker}")
        self.addCleanup(subprocess.run, ["pkill", "-f", f"^{marker}$"])
        proc = subprocess.Popen(["bash", START_SH, "--base-url", self.url, "--log-dir",
                                 self.logs, "--", *self.fake()], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                                env=dict(os.environ, START_POLL_S="0.2", START_STOP_GRACE_S="2",
                                         WARMUP_PYTHON=hang, WARMUP_HARD_S="60"))
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 30
        while subprocess.run(["pgrep", "-f", f"^{marker}$"], capture_output=True).returncode \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.terminate()
        self.assertEqual(proc.wait(30), 143)
        left = subprocess.run(["pgrep", "-f", f"^{marker}$"], capture_output=True, text=True)
        self.assertEqual(left.stdout, "", "the step's leftovers outlived start.sh")

    @NEEDS_PID_NAMESPACE
    def test_start_sh_that_cannot_see_the_port_s_holder_does_not_vouch(self):
        # start.sh in a PID namespace of its own (as a pod's container without
        # shareProcessNamespace); its server never binds, and a process it cannot see
        # takes the port: /proc names no holder, so no warm-up and no ready file.
        proc = subprocess.Popen(
            ["unshare", "-pf", "--mount-proc", "bash",
             os.path.join(os.path.dirname(QUALIFY), "..", "..", "start.sh"), "--base-url",
             self.url, "--log-dir", self.logs, "--ready-file", self.ready, "--textfile",
             self.textfile, "--", "sleep", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, START_POLL_S="0.2", START_STOP_GRACE_S="2"))
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(self.logs, "server.pid")) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        other = subprocess.Popen(self.fake(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(other.wait)
        self.addCleanup(other.kill)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1, out + err)
        self.assertIn("/proc cannot tell which process holds port", err)
        self.assertNotIn("warm-up:", out)
        self.assertFalse(os.path.exists(self.ready))
        self.assertEqual(verdict_of(self.textfile), "not_started")


class TestReadyMarks(HelperCase):
    runs_long = 3                         # seconds on a quiet run: run.py starts it early
    def setUp(self):
        super().setUp()
        self.ready = os.path.join(self.tmp, "ready")

    def warmed(self, **fake):
        server = self.start_fake(latency_s=0.01, dev_mode=True, **fake)
        self.assertEqual(self.run_helper(server).code, 0)
        self.assertIsNone(readback.ready_from_records(self.ready, self.records_path))
        return server

    def probe(self, *args: str) -> subprocess.CompletedProcess:
        return run_qualify("ready", "--ready-file", self.ready, *args)

    def test_an_earlier_release_s_mark_still_means_not_ready(self):
        server = self.warmed()
        self.assertEqual(self.probe("--base-url", server.url).returncode, 0)
        with open(self.ready) as handle:
            doc = json.load(handle)
        for mark in ("slept_at", "stopping_at", "rewarm_run_id"):
            with self.subTest(mark=mark):
                readyfile.write_ready(self.ready, dict(doc, **{mark: "2026-12-01T00:00:00Z"}))
                shown = self.probe("--base-url", server.url)
                self.assertEqual(shown.returncode, 1)
                self.assertIn(f"marked {mark}", shown.stderr)

    def test_a_taker_removes_only_the_run_it_judged_and_never_writes(self):
        self.warmed()
        with open(self.ready) as handle:
            doc = json.load(handle)
        self.assertEqual(readyfile.take_away(self.ready, "another-run"),
                         (None, "it vouches for another run now"))
        with open(self.ready) as handle:
            self.assertEqual(json.load(handle), doc, "a newer pass is not the taker's to judge")
        self.assertEqual(readyfile.take_away(self.ready, doc["run_id"]), (True, ""))
        self.assertFalse(os.path.exists(self.ready))
        self.assertEqual(readyfile.take_away(self.ready, doc["run_id"]), (None, ""))
        self.assertFalse(os.path.exists(self.ready), "nothing here ever writes it")

    def test_a_re_warm_refused_after_it_sent_requests_removes_the_file(self):
        self.warmed()
        server = self.start_fake(engines=2, late_gauge_s=30)
        os.remove(self.records_path)
        result = self.run_helper(server, "--ready-file", self.ready, "--settle-s", "0.3")
        self.assertEqual(result.code, 3, result.stdout)
        self.assertIn("not written: the warm-up's records show refused", result.stdout)
        self.assertFalse(os.path.exists(self.ready))


    def test_a_re_warm_by_another_spelling_keeps_the_group_to_hold_the_port_to(self):
        server = self.warmed()
        with open(self.ready) as handle:
            doc = json.load(handle)
        doc["server_pgid"] = os.getpgrp()          # the in-process fake's group
        readyfile.write_ready(self.ready, doc)
        os.remove(self.records_path)
        again = self.run_helper(server.url.replace("127.0.0.1", "localhost"), "--ready-file",
                                self.ready)
        self.assertEqual(again.code, 0, again.stdout)
        with open(self.ready) as handle:
            self.assertEqual(json.load(handle)["server_pgid"], os.getpgrp())
        for bad in (1.5, "7", True, 1):
            with self.subTest(server_pgid=bad):
                readyfile.write_ready(self.ready, dict(doc, server_pgid=bad))
                shown = self.probe("--base-url", server.url)
                self.assertEqual(shown.returncode, 1)
                self.assertIn("server_pgid is not a process group", shown.stderr)


class TestReportJudgesTheLastAttempt(HelperCase):
    runs_long = 3                         # seconds on a quiet run: run.py starts it early
    def report(self, path: str) -> subprocess.CompletedProcess:
        return run_qualify("report", path)

    def test_records_after_the_last_run_or_no_warm_up_exit_1(self):
        server = self.start_fake(latency_s=0.01)
        self.assertEqual(self.run_helper(server).code, 0)
        self.assertEqual(self.report(self.records_path).returncode, 0)
        with open(self.records_path, "a") as handle:        # a later run's line, its run lost
            handle.write(json.dumps({"record": "gauges", "run_id": "later", "wave": "B1",
                                     "ok": True}) + "\n")
        cut = self.report(self.records_path)
        self.assertEqual(cut.returncode, 1, cut.stdout)
        self.assertIn("belong to no run record", cut.stdout.splitlines()[-1])
        probe = os.path.join(self.tmp, "probe.jsonl")
        ran = subprocess.run([*PYTHON, QUALIFY, "probe", "--base-url", server.url,
                              "--records", probe, "--rounds", "2"], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(ran.returncode, 0, ran.stdout + ran.stderr)
        shown = self.report(probe)
        self.assertEqual(shown.returncode, 1, shown.stdout)
        self.assertIn("not a warm-up", shown.stdout.splitlines()[-1])
        empty = os.path.join(self.tmp, "none.jsonl")
        with open(empty, "w") as handle:
            handle.write("{}\n")
        self.assertRegex(self.report(empty).stdout.splitlines()[-1], r"verdict: none \(exit 1\)")

    def test_a_second_run_into_one_file_is_a_usage_error_without_append(self):
        server = self.start_fake(latency_s=0.01)
        self.assertEqual(self.run_helper(server).code, 0)
        again = self.run_argv(["--base-url", server.url, "--records", self.records_path])
        self.assertEqual(again.code, 2, again.stderr)
        self.assertIn("already holds records (one run to a file", again.stderr)
        self.assertEqual(len(read_records(self.records_path)[0]),
                         len([r for r in read_records(self.records_path)[0]]))

    def test_a_non_ascii_digit_engine_label_is_no_traceback(self):
        path = os.path.join(self.tmp, "hostile.jsonl")
        server = self.start_fake(latency_s=0.01)
        self.assertEqual(self.run_helper(server).code, 0)
        records = read_records(self.records_path)[0]
        for record in records:
            if record["record"] == "gauges":
                record["samples"] = [{"name": "vllm:num_requests_running",
                                      "labels": {"engine": "²"}, "value": 0.0}]
        with open(path, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
        shown = self.report(path)
        self.assertNotIn("Traceback", shown.stderr)
        self.assertIn(shown.returncode, (0, 1), shown.stderr)
        self.assertIn("exit", shown.stdout.splitlines()[-1] + " exit")

    def test_expect_k_ranges_are_written_low_to_high(self):
        for bad, said in (("2-1:5,4-3:4", "written high to low"), ("B1=²", "ASCII digits")):
            with self.subTest(bad=bad):
                shown = run_qualify("report", "x.jsonl", "--expect-k", bad)
                self.assertEqual(shown.returncode, 2)
                self.assertIn(said, shown.stderr)
                self.assertEqual(shown.stderr.count("error:"), 1, shown.stderr)
                self.assertIn(said, shown.stderr.strip().splitlines()[-1])


if __name__ == "__main__":
    unittest.main()
