"""Defects a hostile review of the finished tools found, each driven through a real process.

Lone surrogates from a server or in a path, FIFOs where a regular file belongs, a key cut
in half by a message's length limit or doubled by repr(), a password quoted by a URL
parser's error, a wrapper whose stdout nobody reads, an unwritable stderr under --json, an
ASCII-only terminal, and probe text echoed in words too short to count as a run.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import threading
import time

from hostile import HostileServer, completion_with, error_answer, json_answer
from support import (QUALIFY, WARMUP, WRAPPER, HelperCase, contract_requests, read_records,
                     run_record, summary_record)
import gate  # noqa: E402  (support puts offload/launch on sys.path)

F_SETPIPE_SZ = 1031


class TestReviewFindings(HelperCase):
    def hostile(self, script: dict) -> HostileServer:
        server = HostileServer(script).start()
        self.addCleanup(server.stop)
        return server

    def helper(self, url: str, *args, env: dict | None = None, records: str | None = None,
               command: list | None = None, **popen) -> subprocess.CompletedProcess:
        argv = (command or [sys.executable, WARMUP]) + [
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
        proc = subprocess.run([sys.executable, WARMUP, "--base-url", server.url, "--records",
                               path, "--deadline-s", "3"], capture_output=True, timeout=30)
        self.assert_one_summary(proc, 0, path.decode("utf-8", "surrogateescape"))

    def test_report_reads_a_record_holding_a_lone_surrogate(self):
        run = json.dumps(run_record("a")).replace('"model": "m"', '"model": "m\\ud800"')
        requests = [json.dumps(r) for r in contract_requests("a")]
        requests[0] = requests[0].replace('"warmup-a-B1-0"', '"x\\udc00"')
        with open(self.records_path, "w", encoding="utf-8") as handle:
            handle.write("\n".join([run, *requests, json.dumps(summary_record("a", "pass", 0))])
                         + "\n")
        proc = subprocess.run([sys.executable, QUALIFY, "report", self.records_path],
                              capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertIn("verdict: pass", proc.stdout)

    def test_fifos_are_refused_not_waited_on(self):
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, QUALIFY, "report", fifo], capture_output=True,
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
        fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
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
        proc = subprocess.run([sys.executable, WARMUP, "--base-url",
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
        scrubbed = gate.scrub_probe_text(echoed)
        words = re.findall(r"\w+", passage.reference)
        runs = {" ".join(words[i:i + 3]) for i in range(len(words) - 2)}
        shown = " ".join(re.findall(r"\w+", scrubbed))
        self.assertFalse([run for run in runs if run in shown], scrubbed)
        self.assertTrue(scrubbed.startswith("cannot process: [probe text]"), scrubbed)
