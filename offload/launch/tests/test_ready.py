"""Readiness that stays true (ready.py): the ready file names its server, `qualify.py
ready` checks it, its edges; and the result published as a textfile (textfile.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from support import (PYTHON, FAKE, QUALIFY, HelperCase, SilentServer, StartCase, free_port,
                     read_records, run_qualify)
import tools.readback as readback  # noqa: E402  (support puts offload/launch on sys.path)
import tools.procfs as procfs  # noqa: E402
import tools.ready as readiness  # noqa: E402
import core.textfile as textfile  # noqa: E402
import core.transport as transport  # noqa: E402
import core.prometheus as prometheus  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:                      # installed by .ci/run for this check only
    text_string_to_metric_families = None




def ready(path: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_qualify("ready", "--ready-file", path, *args, env=env)


def post(url: str) -> dict:
    """POST with no body (vLLM's /sleep and /wake_up), the JSON answer."""
    import http.client
    import urllib.parse
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("POST", parts.path + ("?" + parts.query if parts.query else ""))
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def families(text: str) -> dict:
    """name -> {labels as a sorted tuple: value}, through Prometheus' own parser."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = \
                sample.value
    return found


class TestReadyStaysTrue(StartCase):
    runs_long = 10                        # seconds on a quiet run: run.py starts it early
    def start_fake_on_port(self) -> subprocess.Popen:
        """A fake server on this test's port, as a restarted server would be."""
        proc = subprocess.Popen([*PYTHON, FAKE, "--port", str(self.port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(proc.wait, 10)
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if run_qualify("health", "--base-url", self.url).returncode == 0:
                return proc
            time.sleep(0.1)
        self.fail("the second fake server did not come up")

    def test_a_model_named_with_invisible_marks_is_the_one_warmed(self):
        # Its run record keeps the name cleaned (a joiner, a bidi mark, a tag taken out):
        # ready holds the served names to it cleaned alike (another name: check_identity's).
        for model in ("org/Model\u200dv2", "org/\u061cModel\U000e0041v2"):
            with self.subTest(model=model):
                server = self.start_fake(model=model)
                self.assertEqual(self.run_helper(server).code, 0)
                self.assertIsNone(readback.ready_from_records(self.ready, self.records_path))
                said = ready(self.ready, "--base-url", server.url)
                self.assertEqual(said.returncode, 0, said.stderr)

    def test_ready_follows_sleep_and_wake(self):
        server = self.start_fake(dev_mode=True)
        self.assertEqual(self.run_helper(server).code, 0)
        line = readback.ready_from_records(self.ready, self.records_path)
        self.assertIsNone(line)
        with open(self.ready) as handle:
            self.assertEqual(json.load(handle)["sleep_state"], {"0": "awake"})
        self.assertEqual(ready(self.ready, "--base-url", server.url).returncode, 0)
        for level, said in ((1, "engine 0 is asleep (weights offloaded)"),
                            (2, "engine 0 is asleep (weights and KV cache discarded)")):
            with self.subTest(level=level):
                self.assertEqual(post(server.url + f"/sleep?level={level}"),
                                 {"status": "sleeping", "level": level})
                asleep = ready(self.ready, "--base-url", server.url)
                self.assertEqual(asleep.returncode, 1)
                self.assertEqual(asleep.stderr.strip(), f"not ready: {said}; the ready file "
                                 f"is removed: warm it again")
                self.assertFalse(os.path.exists(self.ready), "the probe only takes away")
                refused = self.run_helper(server, "--ready-file", self.ready)
                self.assertEqual(refused.code, 3, refused.stdout)
                self.assertIn(said, refused.stdout)
                self.assertEqual(refused.kind("summary")[-1]["verdict"], "refused")
                self.assertFalse(os.path.exists(self.ready), "a refusal restores nothing")
                self.assertEqual(post(server.url + "/wake_up"), {"status": "awake", "tags": None})
                woken = ready(self.ready, "--base-url", server.url)
                self.assertEqual(woken.returncode, 1, "a woken server must be warmed again")
                self.assertIn("is missing", woken.stderr)
                again = self.run_helper(server, "--ready-file", self.ready)
                self.assertEqual(again.code, 0, again.stdout)
                self.assertEqual(ready(self.ready, "--base-url", server.url).returncode, 0)

    def test_a_refused_re_warm_restores_nothing_of_the_one_running(self):
        server = self.start_fake(latency_s=0.5)
        self.assertEqual(self.run_helper(server, "--ready-file", self.ready).code, 0)
        running = self.start_helper_process(server, "--ready-file", self.ready)
        self.wait_for_completions(server, 11)           # the re-warm is sending
        self.assertIn("is missing", ready(self.ready).stderr, "taken away while it runs")
        other = os.path.join(self.tmp, "other.jsonl")
        refused = self.run_argv(["--base-url", server.url, "--ready-file", self.ready,
                                 "--records", other])
        self.assertEqual(refused.code, 3, refused.stdout)     # another helper at the server
        self.assertFalse(os.path.exists(self.ready), "still not ready while the re-warm runs")
        running.kill()
        running.wait(10)
        self.assertFalse(os.path.exists(self.ready), "a KILLed re-warm leaves it not ready")

    def test_a_ready_file_that_does_not_say_pass_is_not_one(self):
        server = self.start_fake()
        self.assertEqual(self.run_helper(server, "--ready-file", self.ready).code, 0)
        with open(self.ready) as handle:
            doc = json.load(handle)
        with open(self.ready, "w") as handle:
            json.dump(dict(doc, verdict="fail"), handle)
        shown = ready(self.ready)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("is not a ready file", shown.stderr)

    def test_an_empty_url_file_is_no_answer_yet(self):
        path = os.path.join(self.tmp, "server.url")
        open(path, "w").close()
        shown = run_qualify("health", "--url-file", path)
        self.assertEqual(shown.returncode, 3)
        self.assertIn(f"{path} is empty: start.sh writes the server's address there",
                      shown.stderr)

    def test_a_re_warm_takes_the_address_and_chunk_from_the_ready_file(self):
        server = self.start_fake(latency_s=0.01)
        first = self.run_helper(server, "--ready-file", self.ready, "--chunk-tokens", "6000")
        self.assertEqual(first.code, 0, first.stdout)
        os.remove(self.records_path)
        with open(self.ready) as handle:          # as start.sh writes it: the server's group
            doc = json.load(handle)
        with open(self.ready, "w") as handle:
            json.dump(dict(doc, server_pgid=os.getpgrp()), handle)
        again = self.run_argv(["--ready-file", self.ready, "--records", self.records_path])
        self.assertEqual(again.code, 0, again.stdout + again.stderr)
        plan = again.kind("run")[0]["plan"]
        self.assertEqual((plan["chunk_tokens"], plan["chunk_source"]), (6000, "the ready file"))
        self.assertEqual(again.kind("run")[0]["base_url"], server.url)
        self.assertGreater(again.requests[0]["prompt_tokens"], 6000)
        with open(self.ready) as handle:
            self.assertEqual(json.load(handle)["server_pgid"], os.getpgrp(),
                             "the re-warm's ready file still names the group on the port")

    def test_the_warm_up_rewrites_the_ready_file_or_removes_it(self):
        server = self.start_fake()
        passed = self.run_helper(server, "--ready-file", self.ready)
        self.assertEqual(passed.code, 0, passed.stdout)
        self.assertIn(f"ready file {self.ready} written", passed.stdout)
        self.assertEqual(ready(self.ready, "--base-url", server.url).returncode, 0)
        with open(self.ready) as handle:
            self.assertIsNone(json.load(handle)["time_to_warm"]["start_to_healthy_s"],
                              "no launcher said when /health first answered")
        custom = self.run_helper(server, "--ready-file", self.ready, "--tokens", "2")
        self.assertEqual(custom.code, 0)
        self.assertFalse(os.path.exists(self.ready), "a custom plan leaves no ready file")
        self.assertIn("not written: the warm-up's records show custom", custom.stdout)
        bad = self.run_helper(server, "--dry-run", env={"WARMUP_HEALTHY_AT": "soon"})
        self.assertEqual(bad.code, 2)
        self.assertIn("WARMUP_HEALTHY_AT: must be a Unix time in seconds", bad.stderr)

    def test_ready_follows_the_server_it_warmed(self):
        textfile = os.path.join(self.tmp, "offload.prom")
        result = self.start("--ready-file", self.ready, "--textfile", textfile,
                            server=self.fake())
        self.assertEqual(result.code, 0, result.stderr)
        with open(self.ready) as handle:
            doc = json.load(handle)
        self.assertEqual((doc["kind"], doc["verdict"], doc["model"], doc["base_url"]),
                         ("offload-ready/1", "pass", "fake-model", self.url))
        self.assertIsInstance(doc["process_start_time_seconds"], float)
        self.assertTrue(os.path.exists(doc["records"]))
        # The time to warm: process start -> first /health 200 (start.sh's) -> warm-up end.
        phases = doc["time_to_warm"]
        self.assertEqual(sorted(phases), ["healthy_to_warm_s", "start_to_healthy_s",
                                          "start_to_warm_s"])
        self.assertTrue(all(isinstance(v, float) and v >= 0 for v in phases.values()), phases)
        self.assertAlmostEqual(phases["start_to_healthy_s"] + phases["healthy_to_warm_s"],
                               phases["start_to_warm_s"], delta=0.01)
        with open(textfile) as handle:
            published = {name: value for name, labels, value in
                         prometheus.parse_prometheus(handle.read()).samples if not labels}
        for phase, value in phases.items():
            self.assertEqual(published[f"offload_warmup_{phase[:-2]}_seconds"], value)
        report = run_qualify("report", doc["records"])
        self.assertRegex(report.stdout, r"time to warm: process start -> healthy \d+\.\d s -> "
                                        r"warm \d+\.\d s \(\d+\.\d s in all\)")
        shown = ready(self.ready)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn("ready: ", shown.stdout)
        # The server goes away: not answering.
        self.stop_server()
        gone = ready(self.ready)
        self.assertEqual(gone.returncode, 1)
        self.assertRegex(gone.stderr, r"^not ready: the server is not answering")
        self.assertEqual(len(gone.stderr.strip().splitlines()), 1)
        # A new server on the same port: restarted, until a new start warms it.
        time.sleep(0.2)         # process_start_time_seconds is written in 0.1 s steps
        self.start_fake_on_port()
        again = ready(self.ready)
        self.assertEqual(again.returncode, 1)
        # Another process holds the port now (start.sh named its server's process group).
        self.assertIn("not ready: another process answers port", again.stderr)
        with open(textfile) as handle:
            self.assertIn("offload_warmup_last_run_success 1.0", handle.read())


class TestReadyRefuses(HelperCase):
    def test_missing_garbage_and_a_server_that_hangs(self):
        missing = os.path.join(self.tmp, "nope")
        shown = ready(missing)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("not ready: " + missing + " is missing", shown.stderr)
        garbage = os.path.join(self.tmp, "garbage")
        with open(garbage, "wb") as handle:
            handle.write(b"\x00\xffwarm\n")
        shown = ready(garbage)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("is not a ready file", shown.stderr)
        silent = SilentServer()
        self.addCleanup(silent.stop)
        doc = os.path.join(self.tmp, "ready")
        with open(doc, "w") as handle:
            json.dump({"kind": "offload-ready/1", "base_url": silent.url, "model": "m",
                       "verdict": "pass", "process_start_time_seconds": 1.0}, handle)
        started = time.monotonic()
        shown = ready(doc, "--timeout-s", "1")
        self.assertEqual(shown.returncode, 1)
        self.assertLess(time.monotonic() - started, 1 + 10, "bounded by --timeout-s")
        self.assertIn("not ready: the server is not answering", shown.stderr)
        for proc in (shown,):
            self.assertNotIn("Traceback", proc.stderr)
            self.assertEqual(len(proc.stderr.strip().splitlines()), 1)
        with open(doc, "w") as handle:
            json.dump({"kind": "offload-ready/1", "base_url": f"http://127.0.0.1:{free_port()}",
                       "model": "m", "verdict": "pass", "process_start_time_seconds": 1.0},
                      handle)
        nothing = ready(doc)
        self.assertIn("not answering", nothing.stderr)
        link = os.path.join(self.tmp, "link")
        os.symlink(doc, link)
        self.assertIn(f"not ready: {link} is a link", ready(link).stderr)

    def test_a_ready_file_vouches_for_its_own_port_only(self):
        warmed, other = self.start_fake(), self.start_fake()
        path = os.path.join(self.tmp, "ready")
        self.assertEqual(self.run_helper(warmed, "--ready-file", path).code, 0)
        self.assertEqual(ready(path, "--base-url", warmed.url).returncode, 0)
        for env in ({}, {"WARMUP_BASE_URL": other.url}):
            shown = ready(path, *(() if env else ("--base-url", other.url)), env=env)
            self.assertEqual(shown.returncode, 1, shown.stdout)
            self.assertIn(f"vouches for the server at {warmed.url}, not at {other.url}",
                          shown.stderr)
        self.assertFalse([r for r in other.state.requests if r["path"] == "/metrics"],
                         "the other server is not asked: its port already says no")

    def test_a_records_file_two_runs_share_vouches_only_for_the_run_that_passed(self):
        passed = self.run_helper(self.start_fake())
        self.assertEqual(passed.code, 0, passed.stdout)
        os.remove(self.records_path)
        failed = self.run_helper(self.start_fake(fault="one_token", fault_match="-B4-0"))
        self.assertEqual(failed.code, 1, failed.stdout)
        # The failing run began first and ended last; the passing run came between.
        shared = os.path.join(self.tmp, "shared.jsonl")
        with open(shared, "w") as handle:
            for record in failed.records[:1] + passed.records + failed.records[1:]:
                handle.write(json.dumps(record) + "\n")
        path = os.path.join(self.tmp, "ready")
        line = readback.ready_from_records(path, shared, failed.summary["run_id"])
        self.assertIsNotNone(line)
        self.assertIn("records show fail, not a pass", line)
        self.assertFalse(os.path.exists(path))
        line = readback.ready_from_records(path, shared, passed.summary["run_id"])
        self.assertIsNone(line)

    def test_a_warm_up_vouches_only_for_its_own_run_in_a_shared_records_file(self):
        hung = self.start_fake(fault="hang", fault_match="-B1-")
        path = os.path.join(self.tmp, "ready")
        proc = self.start_helper_process(hung, "--deadline-s", "60", "--ready-file", path)
        self.wait_for_completions(hung, 1)          # its run record is written; B1 hangs
        self.assertEqual(self.run_helper(self.start_fake()).code, 0, "a pass in the same file")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 143, out)
        self.assertIn("records show killed, not a pass", out)
        self.assertFalse(os.path.exists(path), "the neighbour's pass is not this run's")

    def test_the_ready_file_is_not_the_records_file_or_the_textfile(self):
        for same in (self.records_path, os.path.join(self.tmp, "offload.prom")):
            result = self.run_helper("http://127.0.0.1:1", "--textfile",
                                     os.path.join(self.tmp, "offload.prom"), "--ready-file", same)
            self.assertEqual(result.code, 2, result.stderr)
            self.assertIn(f"--ready-file {same}: it is the ", result.stderr)
        self.assertFalse(os.path.exists(self.records_path))

    def test_identity_is_judged_from_metrics(self):
        doc = {"model": "m", "process_start_time_seconds": 100.0}
        same = [("process_start_time_seconds", {}, 100.0),
                ("vllm:num_requests_running", {"model_name": "m", "engine": "0"}, 0.0)]
        self.assertIsNone(readiness.check_identity(doc, same))
        later = [("process_start_time_seconds", {}, 160.0)] + same[1:]
        self.assertIn("restarted since the warm-up", readiness.check_identity(doc, later))
        other = same[:1] + [("vllm:x_total", {"model_name": "n"}, 1.0)]
        self.assertIn("serves n, not the warmed model m", readiness.check_identity(doc, other))
        self.assertIn("cannot be told apart", readiness.check_identity(doc, same[1:]))
        self.assertIn("cannot be told apart", readiness.check_identity({"model": "m"}, same))
        self.assertIn("cannot be told apart", readiness.check_identity({"model": "m"},
                                                                        same[1:]))

    def test_without_a_process_start_the_requests_served_tell_a_restart(self):
        # vLLM 0.32 with --data-parallel-size 2 publishes no process_start_time_seconds
        # (seen on the real server): the requests each engine served only grow.
        doc = {"model": "m", "process_start_time_seconds": None,
               "served_at_warm": {"0": 10.0, "1": 10.0}}

        def served(zero, one):
            return [("vllm:request_success_total",
                     {"engine": e, "finished_reason": "length", "model_name": "m"}, n)
                    for e, n in (("0", zero), ("1", one))]
        self.assertIsNone(readiness.check_identity(doc, served(10.0, 25.0)))
        said = readiness.check_identity(doc, served(0.0, 0.0))
        self.assertIn("restarted since the warm-up (engine 0 has served 0 requests, 10 at "
                      "the warm-up)", said)

    def test_no_ready_file_from_records_that_do_not_pass(self):
        server = self.start_fake(fault="one_token", fault_match="-B4-0")
        self.assertEqual(self.run_helper(server).code, 1)
        path = os.path.join(self.tmp, "ready")
        line = readback.ready_from_records(path, self.records_path)
        self.assertIsNotNone(line)
        self.assertIn("the warm-up's records show fail", line)
        self.assertFalse(os.path.exists(path))


@unittest.skipIf(text_string_to_metric_families is None,
                 "prometheus_client is not installed (.ci/run installs it for this check)")
class TestTextfile(HelperCase):
    def test_textfile_parses_and_keeps_the_last_success(self):
        textfile = os.path.join(self.tmp, "offload.prom")
        server = self.start_fake(engines=2)
        self.assertEqual(self.run_helper(server, "--textfile", textfile).code, 0)
        with open(textfile) as handle:
            first = families(handle.read())
        self.assertEqual(first["offload_warmup_last_run_success"][()], 1.0)
        success = first["offload_warmup_last_success_timestamp_seconds"][()]
        self.assertEqual(first["offload_warmup_requests"][
            (("engine", "1"), ("result", "ok"))], 10.0)
        for name in ("offload_warmup_last_run_timestamp_seconds",
                     "offload_warmup_last_run_duration_seconds",
                     "offload_warmup_last_run_exit_code"):
            self.assertIn(name, first)
        broken = self.start_fake(fault="one_token", fault_match="-B2-")
        os.remove(self.records_path)
        self.assertEqual(self.run_helper(broken, "--textfile", textfile).code, 1)
        with open(textfile) as handle:
            text = handle.read()
        after = families(text)
        self.assertEqual(after["offload_warmup_last_run_success"][()], 0.0)
        self.assertEqual(after["offload_warmup_last_run_exit_code"][()], 1.0)
        self.assertEqual(after["offload_warmup_last_success_timestamp_seconds"][()], success,
                         "the last success is kept through a failed run")
        self.assertEqual(after["offload_warmup_requests"][(("result", "failed"),)], 2.0)
        self.assertNotIn("fake-model", text, "no label from the server")
        for line in text.splitlines():
            if not line.startswith("#"):
                self.assertEqual(len(line.split()), 2, f"no timestamp: {line}")

    def test_gate_writes_beside_the_warm_up(self):
        textfile = os.path.join(self.tmp, "offload.prom")
        server = self.start_fake()
        self.assertEqual(self.run_helper(server, "--textfile", textfile).code, 0)
        os.remove(self.records_path)
        gate = subprocess.run([*PYTHON, QUALIFY, "gate", "--base-url", server.url,
                               "--records", self.records_path, "--textfile", textfile],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(gate.returncode, 0, gate.stderr)
        with open(textfile) as handle:
            found = families(handle.read())
        self.assertEqual(found["offload_gate_last_run_success"][()], 1.0)
        self.assertEqual(found["offload_gate_identifiers_exact"][(("shape", "batched"),)], 6.0)
        self.assertEqual(found["offload_warmup_last_run_success"][()], 1.0, "kept beside")


class TestTextfileCarriesSafely(unittest.TestCase):
    def test_carried_samples_are_escaped_and_a_damaged_file_is_dropped(self):
        before = [("offload_gate_x", {"shape": 'al"one\nx'}, float("inf"), "h"),
                  ("offload_warmup_last_success_timestamp_seconds", {}, 5.0, "h")]
        text = textfile.render(textfile.merged("offload_warmup", [], before))
        self.assertIn('offload_gate_x{shape="al\\"one\\nx"} +Inf', text)
        self.assertEqual(len(text.strip().splitlines()), 6)
        parsed = prometheus.parse_prometheus(text)
        self.assertEqual(parsed.bad_lines, [])


class TestReadyEdges(HelperCase):
    def test_an_invalid_base_url_is_not_a_ready_file(self):
        path = os.path.join(self.tmp, "ready")
        with open(path, "w") as handle:
            json.dump({"kind": "offload-ready/1", "base_url": "ftp://x", "model": "m",
                       "process_start_time_seconds": 1.0}, handle)
        shown = ready(path)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("is not a ready file", shown.stderr)

    def test_no_ready_file_that_could_never_be_checked(self):
        server = self.start_fake()
        self.assertEqual(self.run_helper(server).code, 0)
        records, _ = read_records(self.records_path)
        with open(self.records_path, "w") as handle:
            for record in records:
                if record["record"] == "run":
                    record["process_start_time_seconds"] = None
                if record["record"] == "metrics":
                    record.pop("served", None)
                handle.write(json.dumps(record) + "\n")
        path = os.path.join(self.tmp, "ready")
        line = readback.ready_from_records(path, self.records_path)
        self.assertIsNotNone(line)
        self.assertIn("could never be checked", line)
        self.assertFalse(os.path.exists(path))



NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


class TestNodeExporter(HelperCase):
    """The textfiles as a fleet reads them: Debian's prometheus-node-exporter, its textfile
    collector only, on 127.0.0.1 (.ci/run installs it; in CI this test never skips)."""

    def setUp(self):
        super().setUp()
        if NODE_EXPORTER is None:
            if os.environ.get("CI") == "true":
                self.fail("prometheus-node-exporter is not installed: .ci/run installs it")
            self.skipTest("prometheus-node-exporter is not installed (.ci/run installs it)")

    def scrape(self, folder: str) -> str:
        port = free_port()
        proc = subprocess.Popen([NODE_EXPORTER, "--collector.disable-defaults",
                                 "--collector.textfile",
                                 f"--collector.textfile.directory={folder}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(proc.wait, 10)
        self.addCleanup(proc.kill)
        target = transport.parse_url(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                response = transport.fetch(target, transport.Clock.start(5, 5), "GET",
                                           "/metrics")
                if response.status == 200:
                    return response.body.decode("utf-8")
            except transport.TransportError:
                pass
            self.assertIsNone(proc.poll(), "node_exporter ended before it answered")
            time.sleep(0.1)
        self.fail("node_exporter did not answer on /metrics")

    def test_every_offload_family_is_read_without_a_scrape_error(self):
        folder = os.path.join(self.tmp, "textfile")
        os.mkdir(folder)
        server = self.start_fake(engines=2)
        warm = os.path.join(folder, "warmup.prom")
        self.assertEqual(self.run_helper(server, "--textfile", warm).code, 0)
        broken = self.start_fake(fault="one_token", fault_match="-B2-")
        self.assertEqual(self.run_helper(broken, "--textfile", warm).code, 1, "a failed run")
        for command, name in (("gate", "gate.prom"), ("probe", "probe.prom")):
            done = subprocess.run([*PYTHON, QUALIFY, command, "--base-url", server.url,
                                   "--records", os.path.join(self.tmp, f"{command}.jsonl"),
                                   "--textfile", os.path.join(folder, name)],
                                  capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stderr)
        scraped = self.scrape(folder)
        samples = {(name, tuple(sorted(labels.items()))): value for name, labels, value in
                   prometheus.parse_prometheus(scraped).samples}
        self.assertEqual(samples[("node_textfile_scrape_error", ())], 0.0, scraped[-2000:])
        for mode in ("warmup", "gate", "probe"):
            for family in ("last_run_timestamp_seconds", "last_run_success",
                           "last_run_duration_seconds", "last_run_exit_code"):
                with self.subTest(mode=mode, family=family):
                    self.assertIn((f"offload_{mode}_{family}", ()), samples)
        self.assertEqual(samples[("offload_warmup_last_run_success", ())], 0.0)
        self.assertIn(("offload_warmup_last_success_timestamp_seconds", ()), samples,
                      "the last success is kept through the failed run")
        self.assertEqual(samples[("offload_warmup_requests", (("result", "failed"),))], 2.0)
        self.assertEqual(samples[("offload_gate_identifiers_exact", (("shape", "batched"),))],
                         12.0, "six identifiers on each of two engines")

if __name__ == "__main__":
    unittest.main()


TCP_HEADER = b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  " \
    b"timeout inode\n"


def tcp_line(port: int, state: str, inode: int) -> bytes:
    return (f"   0: 0100007F:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 "
            f"00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0\n").encode()


class TestPortOwners(unittest.TestCase):
    """Who listens on a port, read from /proc/net/tcp{,6}: the listeners, which the kernel
    lists first, and only they."""

    def test_a_listener_among_connections_is_found_with_its_process(self):
        listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(listener.close)
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        for client in clients:
            self.addCleanup(client.close)
        self.assertEqual(len(procfs.listening_inodes(port)), 1)
        self.assertIn((os.getpid(), os.getpgid(0)), procfs.port_owners(port))
        listener.close()
        self.assertEqual(procfs.port_owners(port), [], "connections are not listeners")

    def test_reading_stops_at_the_first_line_that_is_not_a_listener(self):
        proc = self.enterContext(tempfile.TemporaryDirectory())
        os.makedirs(os.path.join(proc, "net"))
        tables = {"tcp": TCP_HEADER + tcp_line(8000, "0A", 11) + tcp_line(9000, "0A", 12) +
                  tcp_line(8000, "01", 13) + tcp_line(8000, "0A", 14),
                  "tcp6": TCP_HEADER + tcp_line(8000, "06", 15)}
        for name, table in tables.items():
            with open(os.path.join(proc, "net", name), "wb") as handle:
                handle.write(table)
        self.assertEqual(procfs.listening_inodes(8000, proc), {"11"})
        self.assertEqual(procfs.listening_inodes(9000, proc), {"12"})
        self.assertEqual(procfs.listening_inodes(7000, proc), set())
        self.assertIsNone(procfs.listening_inodes(8000, os.path.join(proc, "none")))
        # Before Linux 4.4 a listener's half-open connections follow it in its section.
        with open(os.path.join(proc, "net", "tcp"), "wb") as handle:
            handle.write(TCP_HEADER + tcp_line(22, "0A", 21) + tcp_line(22, "03", 22) +
                         tcp_line(8000, "0A", 23) + tcp_line(22, "01", 24))
        self.assertEqual(procfs.listening_inodes(8000, proc), {"23"})
