"""What a hostile review of the layers and the new tools found, each driven through the
real code: the atomic writer and odd paths, partial and short keys, evidence the report
must not believe, tracebacks, the textfile's carried-over samples, server text in odd
fields, and the ready file's edge cases."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import unittest

from hostile import (HostileServer, completion_with, http, json_answer, metrics_answer,
                     metrics_text)
from support import (QUALIFY, WARMUP, HelperCase, contract_requests, read_records,
                     run_record, summary_record)
import ready  # noqa: E402  (support puts offload/launch on sys.path)
import report  # noqa: E402
import textfile  # noqa: E402
import transport  # noqa: E402
from support import StartCase


def run(*argv: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


class TestWriter(HelperCase):
    def test_only_a_regular_file_is_ever_replaced(self):
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        target = os.path.join(self.tmp, "precious")
        with open(target, "w") as handle:
            handle.write("keep me")
        link = os.path.join(self.tmp, "link")
        os.symlink(target, link)
        for path in (fifo, link, self.tmp):
            with self.subTest(path=os.path.basename(path)):
                self.assertIn("not a regular file", transport.write_atomically(path, "x"))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertTrue(os.path.islink(link))
        with open(target) as handle:
            self.assertEqual(handle.read(), "keep me")
        fresh = os.path.join(self.tmp, "fresh")
        self.assertIsNone(transport.write_atomically(fresh, "new"))
        self.assertEqual([n for n in os.listdir(self.tmp) if n.endswith(".tmp")], [])


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


class TestSecrets(HelperCase):
    def test_a_key_split_or_cut_by_the_server_is_still_redacted(self):
        key = "sk-live-QwErTyUiOpAsDfGhJkLzXc"
        server = HostileServer({"/v1/completions": lambda req: json_answer(
            {"error": {"message": f"auth failed for {key[:18]}\u200b{key[18:]}; invalid key "
                                  f"provided: {key[:20]}...", "type": "x", "param": None,
                       "code": 500}}, 500)}).start()
        self.addCleanup(server.stop)
        proc = run(WARMUP, "--base-url", server.url, "--records", self.records_path,
                   "--deadline-s", "20", env={"VLLM_API_KEY": key})
        _, text = read_records(self.records_path)
        for where in (proc.stdout, proc.stderr, text):
            self.assertNotIn(key[:12], where.replace("\u200b", ""))
        self.assertIn("[redacted]", text)

    def test_a_short_key_does_not_rewrite_our_own_words(self):
        server = self.start_fake(api_key="ok")
        result = self.run_helper(server, env={"VLLM_API_KEY": "ok"})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertEqual(result.summary["requests_ok"], 10)
        self.assertNotIn("Traceback", result.stderr)


class TestReportBelievesOnlyEvidence(HelperCase):
    def write(self, *records: dict) -> None:
        with open(self.records_path, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)

    def verdict(self) -> str:
        return json.loads(run(QUALIFY, "report", self.records_path, "--json").stdout)["verdict"]

    def test_crafted_files_are_not_a_pass(self):
        head = run_record("r")
        requests = contract_requests("r")
        passed = summary_record("r", "pass", 0)
        cases = {
            "a duplicated request": (head, *requests, requests[0], passed),
            "two summaries": (head, *requests, dict(passed, verdict="fail", exit_code=1),
                              passed),
            "no request planned": (run_record("r", 0, waves=[]), passed),
            "engines as booleans": (dict(head, engines=[0, 1], plan=dict(
                head["plan"], requests_total=20, requests_per_engine=10)),
                *[dict(r, engine=False) for r in requests],
                *[dict(r, engine=True) for r in requests], passed),
            "an empty engine list": (dict(head, engines=[]), *requests, passed),
            "a count that is text": (head, *requests, dict(passed, requests_ok="2")),
            "records of no run": (head, *[dict(r, run_id=None) for r in requests], passed),
            "a mode that is not one": (dict(head, mode=[]), *requests, passed),
            "a pass that names problems": (head, *requests, dict(passed, problems=["x"])),
            "every request of another kind": (head, *[dict(r, request_kind="copy")
                                                      for r in requests], passed),
            "no B1": (head, *[dict(r, wave="B2") for r in requests], passed),
            "fewer requests announced": (run_record("r", 1), requests[0], passed),
        }
        for name, records in cases.items():
            with self.subTest(name):
                self.write(*records)
                self.assertEqual(self.verdict(), "incomplete")
        self.write(head, *requests, passed)
        self.assertEqual(self.verdict(), "pass", "the same file, whole, passes")
        self.write(dict(head, mode=[]), *requests, passed)      # judged, no traceback
        shown = run(QUALIFY, "report", self.records_path)
        self.assertNotIn("Traceback", shown.stderr)
        self.assertIn("the run record's mode is", shown.stdout)

    def test_a_file_not_read_to_its_end_has_no_last_run(self):
        records = [{"record": "run", "run_id": "r"}]
        built = report.build_report(records, ["stopped reading after 16 MiB: the rest of "
                                              "the file is not shown"], "big.jsonl")
        self.assertEqual((built["verdict"], built["exit_code"]), ("incomplete", 1))
        self.assertIn("not read to its end", built["ends"])


class TestNoTraceback(HelperCase):
    def test_odd_inputs_give_one_line(self):
        server = HostileServer({"/metrics": metrics_answer(metrics_text(
            'vllm:num_requests_running{engine="\u00b2",model_name="m"} 0.0'))}).start()
        self.addCleanup(server.stop)
        proc = run(WARMUP, "--base-url", server.url, "--records", self.records_path,
                   "--deadline-s", "20")
        self.assertNotIn("Traceback", proc.stderr)
        chunk = run(WARMUP, "--dry-run", env={"WARMUP_CHUNK_TOKENS": "\u00b2"})
        self.assertEqual(chunk.returncode, 2)
        self.assertIn("WARMUP_CHUNK_TOKENS: must be a whole number", chunk.stderr)


class TestTextfileCarriesSafely(unittest.TestCase):
    def test_carried_samples_are_escaped_and_a_damaged_file_is_dropped(self):
        before = [("offload_gate_x", {"shape": 'al"one\nx'}, float("inf"), "h"),
                  ("offload_warmup_last_success_timestamp_seconds", {}, 5.0, "h")]
        text = textfile.render(textfile.merged("offload_warmup", [], before))
        self.assertIn('offload_gate_x{shape="al\\"one\\nx"} +Inf', text)
        self.assertEqual(len(text.strip().splitlines()), 6)
        parsed = transport.parse_prometheus(text)
        self.assertEqual(parsed.bad_lines, [])


class TestServerTextInOddFields(HelperCase):
    def test_a_finish_reason_object_and_speculative_field_names_are_not_kept(self):
        marker = "GENTEXT-H0ST1LE"
        server = HostileServer({"/v1/completions": lambda req: http(200, completion_with(
            req, choices=[{"index": 0, "text": "x", "finish_reason": {"text": marker},
                           "stop_reason": None}],
            metrics={"speculative_decoding": {marker: 1, "num_drafts": 3}}))}).start()
        self.addCleanup(server.stop)
        proc = run(WARMUP, "--base-url", server.url, "--records", self.records_path,
                   "--deadline-s", "20")
        _, text = read_records(self.records_path)
        for where in (proc.stdout, proc.stderr, text):
            self.assertNotIn(marker, where)
        self.assertIn("<dict>", text)


class TestReadyEdges(HelperCase):
    def test_an_invalid_base_url_is_not_a_ready_file(self):
        path = os.path.join(self.tmp, "ready")
        with open(path, "w") as handle:
            json.dump({"kind": "offload-ready/1", "base_url": "ftp://x", "model": "m",
                       "process_start_time_seconds": 1.0}, handle)
        shown = run(QUALIFY, "ready", "--ready-file", path)
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
                handle.write(json.dumps(record) + "\n")
        path = os.path.join(self.tmp, "ready")
        code, line = ready.write_ready(path, self.records_path, None)
        self.assertEqual(code, 1)
        self.assertIn("could never be checked", line)
        self.assertFalse(os.path.exists(path))




if __name__ == "__main__":
    unittest.main()
