"""Verdicts follow from evidence, and every exit says what it read (issue 19's cases)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import QUALIFY, REPO, WARMUP, HelperCase, SilentServer
import transport  # noqa: E402  (support puts offload/launch on sys.path)
from support import StartCase


class TestReportJudgesEvidence(HelperCase):
    def report(self, path: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, QUALIFY, "report", path, *args],
                              capture_output=True, text=True, timeout=30)

    def passing_records(self) -> list[str]:
        server = self.start_fake()
        self.assertEqual(self.run_helper(server).code, 0)
        with open(self.records_path, encoding="utf-8") as handle:
            return handle.read().splitlines()

    def rewrite(self, lines: list[str]) -> None:
        with open(self.records_path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")

    def test_a_file_with_no_run_is_no_pass(self):
        shown = self.report(os.path.join(REPO, "README.md"))
        self.assertEqual(shown.returncode, 1)
        self.assertIn("no warm-up run in", shown.stdout)
        self.assertNotIn("verdict: pass", shown.stdout)
        doc = json.loads(self.report(os.path.join(REPO, "README.md"), "--json").stdout)
        self.assertEqual((doc["verdict"], doc["evidence"]), ("none", "incomplete"))

    def test_a_missing_request_record_makes_the_run_incomplete(self):
        lines = self.passing_records()
        kept = [line for line in lines
                if not (json.loads(line)["record"] == "request"
                        and json.loads(line)["wave"] == "B1")]
        self.assertEqual(len(kept), len(lines) - 1)
        self.rewrite(kept)
        shown = self.report(self.records_path)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("9 of the 10 planned request records are in the file", shown.stdout)
        self.assertIn("the summary says 10 requests ok; the records show 9", shown.stdout)
        self.assertIn("verdict: incomplete (exit 1; the summary claims pass", shown.stdout)
        doc = json.loads(self.report(self.records_path, "--json").stdout)
        self.assertEqual((doc["verdict"], doc["exit_code"], doc["evidence"]),
                         ("incomplete", 1, "incomplete"))
        self.assertEqual(doc["runs"][0]["claimed"], "pass")


    def test_a_complete_run_is_complete(self):
        self.passing_records()
        doc = json.loads(self.report(self.records_path, "--json").stdout)
        self.assertEqual((doc["verdict"], doc["evidence"]), ("pass", "complete"))
        self.assertEqual(doc["runs"][0]["evidence_problems"], [])

    def test_each_run_of_a_shared_file_ends_as_itself(self):
        lines = self.passing_records()
        cut = [line for line in lines if json.loads(line)["record"] != "summary"][:5]
        self.rewrite(cut + lines)
        doc = json.loads(self.report(self.records_path, "--json").stdout)
        first, second = doc["runs"]
        self.assertIn("its records end (another run follows) after a", first["ends"])
        self.assertNotIn("still running", first["ends"])
        self.assertEqual(second["ends"], "summary")
        self.assertEqual((doc["verdict"], doc["exit_code"]), ("pass", 0))


class TestEveryExitSaysWhatItRead(HelperCase):
    def run_program(self, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                              timeout=30, env=dict(os.environ, **(env or {})))

    def test_json_prints_its_object_when_records_cannot_be_written(self):
        server = self.start_fake()
        unwritable = os.path.join(self.tmp, "dir")
        os.makedirs(unwritable)
        for argv in ([WARMUP], [QUALIFY, "probe"], [QUALIFY, "gate"]):
            with self.subTest(argv[-1]):
                proc = self.run_program(*argv, "--base-url", server.url, "--records",
                                        unwritable, "--json")
                self.assertEqual(proc.returncode, 2, proc.stderr)
                doc = json.loads(proc.stdout)
                self.assertEqual((doc["verdict"], doc["exit_code"]), ("fail", 2))
                self.assertIn("cannot write records", doc["problems"][0])

    def test_a_bad_variable_is_named_as_the_variable(self):
        for name, value, flag in (("WARMUP_ENGINES", "zero", "--engines"),
                                  ("WARMUP_BASE_URL", "ftp://nowhere", "--base-url")):
            with self.subTest(name):
                proc = self.run_program(WARMUP, "--dry-run", env={name: value})
                self.assertEqual(proc.returncode, 2)
                self.assertIn(name, proc.stderr)
                self.assertNotIn(f"argument {flag}", proc.stderr)
                given = self.run_program(WARMUP, "--dry-run", flag, value)
                self.assertEqual(given.returncode, 2)
                self.assertIn(flag, given.stderr)

    def test_usage_counts_that_are_text_are_named_not_quoted(self):
        counts, problems = __import__("vllm_client").read_usage(
            {"prompt_tokens": "MARKER-IN-A-COUNT" * 3, "completion_tokens": [1]})
        self.assertEqual(problems, [
            "usage prompt_tokens is not a count: a string of 51 characters",
            "usage completion_tokens is not a count: a JSON array"])
        self.assertIsNone(counts["prompt_tokens"])


class TestSaysItIsStillWorking(HelperCase):
    def test_a_long_batch_says_it_is_still_running(self):
        silent = SilentServer()
        self.addCleanup(silent.stop)
        target = transport.parse_url(silent.url)
        clock = transport.Clock.start(1.0, 1.0)
        said = []
        done = transport.exchange_batch(target, clock, [transport.Exchange(b"x"),
                                                        transport.Exchange(b"y")],
                                        lambda s, n: said.append((s, n)), every_s=0.3)
        self.assertTrue(all(ex.error is not None for ex in done))
        self.assertGreaterEqual(len(said), 2, said)
        self.assertEqual([n for _, n in said], [0] * len(said))
        self.assertEqual(sorted(said), said, "said in order, as time went on")


class TestStartSaysItWaits(StartCase):
    def test_start_says_it_waits_for_health(self):
        result = self.start("--no-warmup", server=self.fake("--health-delay-s", "1.6"),
                            env={"START_SAY_S": "1"}, timeout=60)
        self.assertEqual(result.code, 0, result.stderr)
        self.assertRegex(result.stdout, r"waiting for http://127\.0\.0\.1:\d+/health: \d+ s of "
                                        r"the 600 s start guard; server process group \d+ is "
                                        r"running")

    def test_a_bad_start_variable_is_named(self):
        result = self.start(server=self.fake(), env={"START_GUARD_S": "soon"}, timeout=30)
        self.assertEqual(result.code, 2)
        self.assertIn("START_GUARD_S must be a whole number", result.stderr)
        flagged = self.start("--start-guard-s", "soon", server=self.fake(), timeout=30)
        self.assertIn("--start-guard-s must be a whole number", flagged.stderr)




if __name__ == "__main__":
    import unittest
    unittest.main()
