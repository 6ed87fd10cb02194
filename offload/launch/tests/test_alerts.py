"""The alerting rules (offload/monitoring/alerts.yml), checked by a real Prometheus: its
promtool's unit tests, and a real Prometheus over the real node_exporter textfile
collector, reading the textfile of a real failed warm-up against the fake (.ci/run
installs Debian's prometheus and prometheus-node-exporter; in CI these tests never skip)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import unittest

from support import REPO, HelperCase, free_port
import core.transport as transport  # noqa: E402  (support puts offload/launch on sys.path)

RULES = os.path.join(REPO, "offload", "monitoring", "alerts.yml")
RULE_TESTS = os.path.join(REPO, "offload", "monitoring", "alerts_test.yml")
WEEK_TESTS = os.path.join(REPO, "offload", "monitoring", "alerts_week_test.yml")
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def needs(*tools) -> None:
    """Skip without the tools; in CI (which installs them) fail instead."""
    if all(tools):
        return
    if os.environ.get("CI") == "true":
        raise AssertionError("prometheus / prometheus-node-exporter not installed: .ci/run "
                             "installs them")
    raise unittest.SkipTest("prometheus and prometheus-node-exporter are not installed "
                            "(.ci/run installs them)")


class TestRuleUnitTests(unittest.TestCase):
    runs_long = 3                         # seconds on a quiet run: run.py starts it early
    def test_promtool_checks_and_tests_the_rules(self):
        needs(PROMTOOL)
        for command in (["check", "rules", RULES], ["test", "rules", RULE_TESTS],
                        ["test", "rules", WEEK_TESTS]):
            with self.subTest(command=command[:2]):
                done = subprocess.run([PROMTOOL, *command], capture_output=True, text=True,
                                      timeout=60)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.assertIn("SUCCESS", done.stdout + done.stderr)


class TestAlertsInARealPrometheus(HelperCase):
    """A failed warm-up's textfile raises OffloadWarmupFailed in a real Prometheus, a
    node_exporter with no offload textfile OffloadTextfileMissing; a passing one's raises
    nothing."""

    runs_long = 13                        # seconds on a quiet run: run.py starts it early

    def serve(self, command: list[str], port: int, path: str) -> transport.Target:
        """A process listening on 127.0.0.1:port, answering `path` (60 s at most), stopped
        at cleanup."""
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(proc.wait, 20)
        self.addCleanup(proc.terminate)
        target = transport.parse_url(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.assertIsNone(proc.poll(), f"{command[0]} ended before it answered")
            try:
                if transport.fetch(target, transport.Clock.start(5, 5), "GET",
                                   path).status == 200:
                    return target
            except transport.TransportError:
                pass
            time.sleep(0.2)
        self.fail(f"{command[0]} did not answer {path}")

    def exporter(self, folder: str) -> int:
        port = free_port()
        self.serve([NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                    f"--collector.textfile.directory={folder}",
                    f"--web.listen-address=127.0.0.1:{port}"], port, "/metrics")
        return port

    def alerts(self, prometheus: transport.Target) -> list[dict]:
        response = transport.fetch(prometheus, transport.Clock.start(5, 5), "GET",
                                   "/api/v1/alerts")
        return json.loads(response.body)["data"]["alerts"]

    def test_a_failed_warm_up_alerts_and_a_passing_one_does_not(self):
        needs(PROMETHEUS, NODE_EXPORTER)
        folders = {}
        for name, server, code in (("failed", self.start_fake(fault="one_token",
                                                             fault_match="-B2-"), 1),
                                   ("passed", self.start_fake(), 0)):
            folders[name] = os.path.join(self.tmp, name)
            os.mkdir(folders[name])
            textfile = os.path.join(folders[name], "offload.prom")
            self.assertEqual(self.run_helper(server, "--textfile", textfile, "--chunk-tokens",
                                             "4096").code, code)   # the chunk known: no warning
        folders["none"] = os.path.join(self.tmp, "none")      # no textfile written there
        os.mkdir(folders["none"])
        targets = {name: f"127.0.0.1:{self.exporter(folder)}" for name, folder in folders.items()}
        config = os.path.join(self.tmp, "prometheus.yml")
        with open(config, "w") as handle:
            handle.write(f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n"
                         f"rule_files: [{json.dumps(RULES)}]\n"
                         f"scrape_configs:\n  - job_name: vllm-offload\n    static_configs:\n"
                         f"      - targets: {json.dumps(list(targets.values()))}\n"
                         f"        labels: {{offload_textfile: '1'}}\n")
        port = free_port()
        prometheus = self.serve([PROMETHEUS, f"--config.file={config}",
                                 f"--storage.tsdb.path={os.path.join(self.tmp, 'tsdb')}",
                                 f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=error"], port, "/-/ready")
        deadline = time.monotonic() + 60
        raised, missing = [], []
        while time.monotonic() < deadline and not (raised and missing):
            alerts = self.alerts(prometheus)
            raised = [a for a in alerts if a["labels"].get("alertname") == "OffloadWarmupFailed"]
            missing = [a for a in alerts
                       if a["labels"].get("alertname") == "OffloadTextfileMissing"]
            time.sleep(0.5)
        self.assertEqual([(a["labels"]["instance"], a["labels"]["verdict"]) for a in raised],
                         [(targets["failed"], "fail")])
        self.assertIn(raised[0]["state"], ("pending", "firing"))
        self.assertEqual([a["labels"]["instance"] for a in missing], [targets["none"]])
        time.sleep(3)                     # three more evaluations of the passing instance
        response = transport.fetch(prometheus, transport.Clock.start(5, 5), "GET",
                                   "/api/v1/query?query=offload_warmup_last_run_success")
        seen = {r["metric"]["instance"]: r["value"][1]
                for r in json.loads(response.body)["data"]["result"]}
        self.assertEqual(seen, {targets["failed"]: "0", targets["passed"]: "1"},
                         "both textfiles were scraped")
        self.assertEqual([a["labels"]["alertname"] for a in self.alerts(prometheus)
                          if a["labels"].get("instance") == targets["passed"]], [])


if __name__ == "__main__":
    unittest.main()
