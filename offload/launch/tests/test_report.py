"""qualify.py report: a records file read back within bounds, each run judged again from
its own evidence (kinds.judge with the run's plan), never from a record's own `ok`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import threading
import unittest

from support import (PYTHON, QUALIFY, REPO, HelperCase, contract_requests, qualify, read_records,
                     request_record, run_qualify, run_record, summary_record, wave_records)
import tools.probe as probe  # noqa: E402  (support puts offload/launch on sys.path)
import tools.readback as readback  # noqa: E402
import tools.report as report  # noqa: E402
import core.records as records_  # noqa: E402
import core.runframe as runframe  # noqa: E402
import core.transport as transport  # noqa: E402
import core.vllm_client as vllm_client  # noqa: E402
from core.records import ANSWER_FIELDS  # noqa: E402


class TestReportJudgesEvidence(HelperCase):
    def report(self, path: str, *args: str) -> subprocess.CompletedProcess:
        return run_qualify("report", path, *args)

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
        self.assertIn("only 9 of 10 requests ran", shown.stdout)
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
        cut = [json.dumps(dict(json.loads(line), run_id="an-earlier-run")) for line in lines
               if json.loads(line)["record"] != "summary"][:5]
        self.rewrite(cut + lines)
        doc = json.loads(self.report(self.records_path, "--json").stdout)
        first, second = doc["runs"]
        self.assertIn("its records end (another run follows) after a", first["ends"])
        self.assertNotIn("still running", first["ends"])
        self.assertEqual(second["ends"], "summary")
        self.assertEqual((doc["verdict"], doc["exit_code"]), ("pass", 0))


class TestReportBelievesOnlyEvidence(HelperCase):
    runs_long = 3                         # seconds on a quiet run: run.py starts it early
    def write(self, *records: dict) -> None:
        with open(self.records_path, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)

    def verdict(self) -> str:
        return json.loads(run_qualify("report", self.records_path, "--json").stdout)["verdict"]

    def test_crafted_files_are_not_a_pass(self):
        head = run_record("r")
        requests = contract_requests("r") + wave_records("r")
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
            "the whole run written twice": (head, *requests, passed, head, *requests, passed),
            "a wave that ended late": (dict(head, plan=dict(head["plan"], deadline_s=0.5)),
                                       *requests, passed),
            "a summary past its deadline": (head, *requests, dict(passed, elapsed_s=200.0)),
        }
        for name, records in cases.items():
            with self.subTest(name):
                self.write(*records)
                self.assertEqual(self.verdict(), "incomplete")
        self.write(head, *requests, passed)
        self.assertEqual(self.verdict(), "pass", "the same file, whole, passes")
        self.write(dict(head, mode=[]), *requests, passed)      # judged, no traceback
        shown = run_qualify("report", self.records_path)
        self.assertNotIn("Traceback", shown.stderr)
        self.assertIn("run record's mode is not str: the record is not read", shown.stdout)

    def test_a_file_not_read_to_its_end_has_no_last_run(self):
        records = [{"record": "run", "run_id": "r"}]
        built = readback.judge_file(records, ["stopped reading after 16 MiB: the rest of "
                                              "the file is not shown"], "big.jsonl")
        self.assertEqual((built["verdict"], built["exit_code"]), ("incomplete", 1))
        self.assertIn("not read to its end", built["ends"])


class TestReportJudgesAgain(HelperCase):
    def warmed(self) -> list[dict]:
        server = self.start_fake()
        self.assertEqual(self.run_helper(server).code, 0)
        found, _ = read_records(self.records_path)
        return found

    def report(self, found: list[dict], *args: str):
        with open(self.records_path, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in found)
        return self.run_argv(["report", self.records_path, *args], main=qualify.main)

    def test_the_counters_are_checked_again_not_taken_from_the_summary(self):
        server = self.start_fake(engines=2, ignore_rank=True)     # engine 1 stays cold
        self.assertEqual(self.run_helper(server).code, 1)
        found, _ = read_records(self.records_path)
        forged = [dict(r, verdict="pass", exit_code=0, problems=[])
                  if r["record"] == "summary" else r for r in found]
        shown = self.report(forged)
        self.assertEqual(shown.code, 1, shown.stdout)
        self.assertIn("engine 1 generated 0 of 320 tokens", shown.stdout)
        no_metrics = [r for r in forged if r["record"] != "metrics"]
        shown = self.report(no_metrics)
        self.assertEqual(shown.code, 1, "each engine's share from its wave records then")
        self.assertIn("engine 1 generated 0 of 320 tokens", shown.stdout)
        bare = [dict(r, counters={}) if r["record"] == "wave" else r for r in no_metrics]
        shown = self.report(bare)
        self.assertEqual(shown.code, 1)
        self.assertIn("each engine's share cannot be checked", shown.stdout)
        os.remove(self.records_path)
        passed = self.warmed()
        doubled = [dict(r, deltas={k: v * 2 if "generation_tokens" in k else v
                                   for k, v in r["deltas"].items()})
                   if r["record"] == "metrics" else r for r in passed]
        shown = self.report(doubled)
        self.assertEqual(shown.code, 1, shown.stdout)
        self.assertIn("the warm-up: generation tokens delta 640 exceeds "
                      "the records' 320", shown.stdout)
        self.assertEqual(self.report(passed).code, 0, "the run as written passes")

    def test_an_edited_record_is_named_with_its_rule(self):
        found = self.warmed()
        target = next(i for i, r in enumerate(found)
                      if r["record"] == "request" and r["wave"] == "B2" and r["index"] == 1)
        for field, value, rule in (("completion_tokens", 1, "one-token response"),
                                   ("finish_reason", "stop", "finish_reason 'stop', expected"),
                                   ("stop_reason", "SERVERWORDS generated",
                                    "stop_reason '<a string of 21 characters>', expected null"),
                                   ("prompt_tokens", "many", None)):
            with self.subTest(field=field):
                edited = list(found)
                edited[target] = dict(found[target], **{field: value})
                shown = self.report(edited)
                self.assertEqual(shown.code, 1, shown.stdout)
                if rule:
                    self.assertIn("B2#1: the record says ok, but", shown.stdout)
                    self.assertIn(rule, shown.stdout)
                    self.assertNotIn("SERVERWORDS", shown.stdout + shown.stderr,
                                     "the server's words: their type and size only")
                else:                 # off its declaration: the reader leaves it out
                    self.assertIn("B2#1: request record's prompt_tokens is not count: the "
                                  "record is not read", shown.stdout)
        self.assertEqual(self.report(found).code, 0, "the file as written passes")

    def test_a_usage_value_that_is_no_count_is_judged_the_same_again(self):
        server = self.start_fake()
        self.assertEqual(self.run_helper(server).code, 0)
        found, _ = read_records(self.records_path)
        target = next(i for i, r in enumerate(found) if r["record"] == "request")
        failed = dict(found[target], reasoning_tokens=None, ok=False,
                      usage_problems=["usage reasoning_tokens is not a count: str of 1"],
                      problems=["usage reasoning_tokens is not a count: str of 1"])
        shown = self.report(found[:target] + [failed] + found[target + 1:])
        self.assertEqual(shown.code, 1)
        self.assertNotIn("the record says not ok, but its fields pass", shown.stdout)

    def test_ok_is_never_what_decides(self):
        found = self.warmed()
        target = next(i for i, r in enumerate(found) if r["record"] == "request")
        edited = list(found)
        edited[target] = dict(found[target], ok=False)
        shown = self.report(edited)
        self.assertEqual(shown.code, 1)
        self.assertIn("B1#0: the record says not ok, but its fields pass", shown.stdout)

    def test_records_off_their_declaration_or_of_another_format(self):
        found = self.warmed()
        requests = [i for i, r in enumerate(found) if r["record"] == "request"]
        edited = list(found)
        edited[requests[0]] = {k: v for k, v in found[requests[0]].items() if k != "usage"}
        self.assertIn("request record without usage", self.report(edited).stdout)
        edited = [dict(r, format=1) if r["record"] == "run" else r for r in found]
        self.assertIn("the run record is of format 1, not 2", self.report(edited).stdout)
        # A duration or elapsed time below 0 is no measurement (a hand edit): not read.
        for kind, field in (("wave", "duration_s"), ("summary", "elapsed_s")):
            with self.subTest(field=field):
                edited = [dict(r, **{field: -0.5}) if r["record"] == kind else r
                          for r in found]
                shown = self.report(edited)
                self.assertEqual(shown.code, 1, shown.stdout)
                self.assertIn(f"{kind} record's {field} is not finite", shown.stdout)


class TestReportPieces(unittest.TestCase):
    def test_truncated_file_is_read_up_to_the_cut(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        path = os.path.join(tmp.name, "cut.jsonl")
        with open(path, "w") as handle:
            handle.write(json.dumps({"record": "run", "run_id": "r", "plan": {}}) + "\n")
            handle.write(json.dumps({"record": "request", "wave": "B1", "index": 0, "ok": True,
                                     "problems": []}) + "\n")
            handle.write('{"record": "wave", "wa')
        records, issues = readback.load_records(path)
        self.assertEqual(len(records), 2)
        self.assertIn("line 3 is not valid JSON: the file ends there", issues[0])
        built = readback.judge_file(records, issues)
        self.assertEqual(built["verdict"], "incomplete")
        self.assertEqual(built["exit_code"], 1)
        self.assertIn("ends after a 'request' record", built["runs"][0]["ends"])
        self.assertIn("verdict: incomplete (exit 1; no summary", report.format_report(built))

    def test_a_counter_that_went_down_is_named_with_or_without_a_table(self):
        wave = records_.CLASSES["wave"]
        down = wave(wave="B2", depth=2, counters_went_down=["vllm:prompt_tokens_total"])
        bare = report.evidence_table([down])
        self.assertEqual(bare, ["counter went down during a wave (a restart?): "
                                "vllm:prompt_tokens_total"])
        table = report.evidence_table([wave(down, gauge_samples=3, running_max=2.0)])
        self.assertEqual(table[-1], bare[0])
        self.assertTrue(table[0].startswith("wave"), table)
        self.assertEqual(report.evidence_table([wave(wave="B1", depth=1)]), [])

    def test_cut_short_probe_names_its_failed_requests(self):
        answer = {k: v for k, v in request_record("r", 1).items() if k in ANSWER_FIELDS}
        records = [run_record("r", 4, mode="probe"),
                   dict(answer, record="probe", run_id="r", item="burst3", round=2, index=1,
                        engine=None, request_id="probe-r-burst3-2-1", request_kind="stream",
                        ttft_s=None, total_s=0.5, http_status=500, ok=False,
                        problems=["HTTP 500"])]
        built = readback.judge_file(records, [])
        self.assertEqual(built["runs"][0]["problems"], ["burst3 round 2#1: HTTP 500"])

    def test_probe_summary_compares_first_round_with_later_ones(self):
        def rec(item, rnd, ttft, total, index=0):
            return {"item": item, "round": rnd, "index": index, "ttft_s": ttft, "total_s": total}
        records = [rec("single", 1, 0.5, 1.0), rec("single", 2, 0.1, 0.6),
                   rec("single", 3, 0.1, 0.4),
                   rec("burst3", 1, 0.1, 0.5), rec("burst3", 1, 0.4, 0.9, 1),
                   rec("burst3", 2, 0.1, 0.5), rec("burst3", 2, 0.1, 0.5, 1)]
        single, burst = probe.probe_summary(records)
        self.assertEqual((single["ttft_first_s"], single["ttft_later_median_s"]), (0.5, 0.1))
        self.assertEqual(single["ttft_ratio"], 5.0)
        self.assertEqual(single["total_ratio"], 2.0)
        self.assertEqual(burst["ttft_first_s"], 0.4, "a burst is as slow as its slowest request")

    def test_first_token_time_is_when_it_arrives_not_the_next_read(self):
        # Headers and the first event in one packet, the rest 0.5 s later.
        left, right = socket.socketpair()
        self.addCleanup(left.close)
        self.addCleanup(right.close)
        first = b'data: {"choices":[{"text":"a"}]}\n\n'
        right.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                      + f"{len(first):x}\r\n".encode() + first + b"\r\n")
        later = threading.Timer(2.0, right.sendall, [b"0\r\n\r\n"])
        later.start()
        self.addCleanup(later.cancel)
        clock = transport.Clock.start(10, 10)
        response = transport.read_response(left, clock, watch=vllm_client.FIRST_TEXT)
        self.assertLess(response.watched_at, 1.5, "noted when it came, not at the end")
        self.assertGreaterEqual(clock.elapsed(), 1.95)
        self.assertEqual(response.body, first)

    def test_probe_record_names_the_key_variable(self):
        record = self.probe_record_of(
            transport.Response(401, {}, b'{"error":"Unauthorized"}'))
        self.assertFalse(record["ok"])
        self.assertIn("unauthorized: OPS_KEY is not set; set OPS_KEY (or --api-key-env)",
                      record["problems"][0])
        self.assertIsNone(record["ttft_s"])

    def probe_record_of(self, response: transport.Response) -> dict:
        """probe_record of one streamed request of item single that got this response."""
        slot = vllm_client.Slot(0, "probe-r-single-r1-0", transport.Exchange(
            b"", vllm_client.FIRST_TEXT, sent_at=0.1, done_at=0.2, response=response))
        settings = runframe.RunSettings(prog="probe", run_id="r", records_path="unused",
                                        deadline_s=90, socket_cap_s=60)
        connection = vllm_client.Connection(
            target=transport.parse_base_url("http://h:1"), api_key=None,
            api_key_env="OPS_KEY", model="m", engines=None)
        program = probe.WarmthProbe(connection, probe.ProbeOptions(), settings)
        run = runframe.Run(settings, program, transport.Clock.start(90, 60), None, print)
        return probe.probe_record(run, program, "single", 1, slot)

    def test_probe_record_judges_the_stream(self):
        def streamed(body, watched_at=0.15):
            return self.probe_record_of(transport.Response(200, {}, body, watched_at))
        tokens = probe.ProbeOptions().tokens
        text = (b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
                b'data: {"choices":[{"index":0,"text":"y","finish_reason":"length",'
                b'"stop_reason":null}]}\n\n')
        usage = (b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d,'
                 b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n')
        done = b"data: [DONE]\n\n"
        good = streamed(text + usage % tokens + done)
        self.assertTrue(good["ok"], good["problems"])
        self.assertEqual((good["prompt_tokens"], good["cached_tokens"],
                          good["completion_tokens"], good["ttft_s"]), (7, 0, tokens, 0.05))
        cut = streamed(text[:text.index(b"\n") + 1], watched_at=None)
        self.assertEqual(cut["problems"], ["stream carried no usage",
                                           "finish_reason null, expected 'length'",
                                           "stream did not end with [DONE]",
                                           "no token text arrived"])
        self.assertIsNone(cut["completion_tokens"])
        short = streamed(text + usage % (tokens - 1) + done)
        self.assertEqual(short["problems"],
                         [f"completion_tokens {tokens - 1}, expected {tokens}"])
        odd = streamed(text + usage.replace(b"%d", b'"many"') + done)
        self.assertEqual(len(odd["problems"]), 1, odd["problems"])
        self.assertTrue(odd["problems"][0].startswith("usage completion_tokens is not a count"))

    def test_probe_summary_names_cached_rounds_per_engine(self):
        def rec(rnd, ttft, cached, engine):
            return {"item": "long", "round": rnd, "index": 0, "ttft_s": ttft, "total_s": ttft,
                    "cached_tokens": cached, "engine": engine}
        records = [rec(1, 0.27, 0, 0), rec(2, 0.03, 4992, 0), rec(3, 0.2, 0, 0),
                   rec(1, 0.3, None, 1), rec(2, 0.1, None, 1)]
        e0, e1 = probe.probe_summary(records)
        self.assertEqual((e0["engine"], e0["cached_rounds"]), (0, [2]))
        self.assertEqual(e0["ttft_later_median_s"], 0.2, "the cached round is left out")
        self.assertEqual(e0["ttft_ratio"], 1.35)
        self.assertEqual((e1["engine"], e1["cached_rounds"], e1["ttft_ratio"]), (1, [], 3.0))
        line = report.probe_line(records_.shaped(e0, records_.SHAPED["probe_item"]))
        self.assertIn("long e0", line)
        self.assertIn("round 2 served from the prefix cache, left out", line)

    def test_bad_usage_values_are_cut(self):
        counts, problems = vllm_client.read_usage({"completion_tokens": "9" * 10000,
                                              "prompt_tokens_details": {"cached_tokens": 1.5}})
        self.assertEqual((counts["completion_tokens"], counts["cached_tokens"]), (None, None))
        self.assertEqual(len(problems), 2)
        self.assertTrue(all(len(p) <= 300 for p in problems))

    def test_stream_usage(self):
        body = (b'data: {"choices":[{"text":"x"}],"usage":null}\n\n'
                b'data: {"choices":[],"usage":{"completion_tokens":32}}\n\ndata: [DONE]\n\n')
        fields = vllm_client.extract_stream_fields(200, body)
        self.assertEqual((fields["usage"], fields["completion_tokens"], fields["stream_done"]),
                         (True, 32, True))


class TestReportReading(unittest.TestCase):
    """report reads any file: bad lines, several runs, odd types, huge or endless input."""
    runs_long = 3                         # seconds on a quiet run: run.py starts it early

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "records.jsonl")

    def write(self, *lines):
        with open(self.path, "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write((line if isinstance(line, str) else json.dumps(line)) + "\n")

    def report(self, *args: str) -> subprocess.CompletedProcess:
        return run_qualify("report", self.path, *args)

    def test_reads_past_bad_lines_and_names_them(self):
        self.write(run_record("a"),
                   '{"record": "request", "wave": "B1"', "[1, 2]", *contract_requests("a"),
                   *wave_records("a"),
                   summary_record("a", "pass", 0, notes=["B1 cache check not made"],
                                  warnings=["w1"]))
        records, issues = readback.load_records(self.path)
        self.assertEqual([r["record"] for r in records],
                         ["run"] + ["request"] * 10 + ["gauges", "wave"] * 4 + ["summary"])
        self.assertEqual(issues, ["line 2 is not valid JSON (skipped)",
                                  "line 3 is JSON but not a record (skipped)"])
        shown = self.report()
        self.assertEqual(shown.returncode, 0)
        for text in ("note: line 2 is not valid JSON (skipped)", "note: B1 cache check not made",
                     "warning: w1", "verdict: pass (exit 0)"):
            self.assertIn(text, shown.stdout)

    def test_each_run_separately_and_the_last_one_decides(self):
        def run(rid, verdict, code, n):
            failed = {} if code == 0 else {"http_status": 500, "error": "boom", "ok": False,
                                           "problems": ["HTTP 500"]}
            return [run_record(rid)] + contract_requests(rid, **failed)[:n] + wave_records(rid) + \
                [summary_record(rid, verdict, code,
                                problems=[] if code == 0 else ["B1#0: HTTP 500"])]
        self.write(*run("first", "fail", 1, 10), *run("second", "pass", 0, 10))
        shown = self.report()
        self.assertEqual(shown.returncode, 0)
        self.assertIn("== run 1 of 2 ==", shown.stdout)
        self.assertIn("verdict: fail (exit 1)", shown.stdout)
        self.assertTrue(shown.stdout.rstrip().splitlines()[-1].startswith("verdict: pass (exit 0"),
                        "the last line is the file's verdict")
        doc = json.loads(self.report("--json").stdout)
        self.assertEqual([r["verdict"] for r in doc["runs"]], ["fail", "pass"])
        self.assertEqual([len(r["requests"]) for r in doc["runs"]], [10, 10])
        self.assertEqual((doc["verdict"], doc["exit_code"]), ("pass", 0))
        for key in ("run", "requests", "waves", "metrics", "status", "probe", "probe_summary",
                    "gate", "summary", "problems", "verdict", "exit_code", "ends"):
            self.assertIn(key, doc["runs"][0])
        # The other way round, and a last run cut short: its status decides.
        self.write(*run("second", "pass", 0, 10), *run("third", "pass", 0, 10)[:-1])
        shown = self.report()
        self.assertEqual(shown.returncode, 1)
        self.assertIn("verdict: incomplete (exit 1; no summary", shown.stdout)

    def test_odd_types_never_crash_and_never_print_none(self):
        self.write({"record": "run", "run_id": 5, "mode": "warmup", "model": None,
                    "plan": {"waves": [{"wave": {"x": 1}}, "B2"], "deadline_s": "90"},
                    "versions": None, "engines": "0,1"},
                   {"record": "request", "wave": {"a": "\x1b[31m"}, "index": "0", "ok": "yes",
                    "problems": "a string", "latency_s": "fast", "engine": 1},
                   {"record": "wave", "wave": ["B1"], "depth": None, "ok": 1},
                   {"record": "metrics", "highlights": [1, 2], "warnings": "w"},
                   {"record": "probe_summary", "items": [{"item": 3, "ttft_ratio": "x"}, "bad"]},
                   {"record": "gate", "shape": 1, "probe": None, "cer": "0.5", "removed": 7},
                   {"record": "summary", "verdict": None, "exit_code": "0",
                    "problems": "one problem", "notes": {"n": 1}})
        shown = self.report()
        self.assertEqual(shown.returncode, 1, shown.stderr)
        self.assertEqual(shown.stderr, "")
        self.assertNotIn("None", shown.stdout)
        self.assertNotIn("\x1b", shown.stdout)
        unread = [line for line in shown.stdout.splitlines()
                  if line.endswith(": the record is not read")]
        self.assertEqual(len(unread), 7, "each record off its declaration, said once")
        self.assertIn("run record without format", shown.stdout)
        self.assertIn("e1 ", unread[1], "a request record is named as it can be")
        doc = json.loads(self.report("--json").stdout)
        self.assertEqual(doc["exit_code"], 1)

    def test_json_holds_long_strings_of_any_script(self):
        # 700 characters a \uXXXX each would take the line past the terminal sink's 4,000
        for text in ("é" * 700, "模型" * 400, '"\\' * 400):
            with self.subTest(text=text[:2]):
                self.write(dict(run_record("r"), model=text), *contract_requests("r"),
                           *wave_records("r"), summary_record("r", "pass", 0))
                shown = subprocess.run([*PYTHON, QUALIFY, "report", self.path, "--json"],
                                       capture_output=True, text=True, timeout=30,
                                       env=dict(os.environ, PYTHONIOENCODING="utf-8"))
                self.assertEqual(shown.returncode, 0, shown.stderr)
                self.assertEqual(json.loads(shown.stdout)["runs"][0]["run"]["model"], text)
        # a number of 3,990 digits where a record takes any value: none to show, not a line cut
        self.write(dict(run_record("r"), versions={"server": int("9" * 3990)}),
                   *contract_requests("r"), *wave_records("r"), summary_record("r", "pass", 0))
        shown = self.report("--json")
        self.assertIsNone(json.loads(shown.stdout)["runs"][0]["run"]["versions"]["server"])

    def test_empty_file_and_unreadable_path(self):
        self.write()
        shown = self.report()
        self.assertEqual(shown.returncode, 1)
        self.assertIn("no warm-up run in", shown.stdout)
        self.assertEqual(json.loads(self.report("--json").stdout)["runs"], [])
        gone = run_qualify("report", self.path + ".nope")
        self.assertEqual(gone.returncode, 2)
        self.assertEqual(len(gone.stderr.strip().splitlines()), 1)
        self.assertNotIn("Traceback", gone.stderr)

    def test_line_and_file_caps(self):
        import io
        data = b'{"record": "run"}\n' + b"x" * 5000 + b"\n" + b'{"record": "summary"}\n'
        lines = list(readback.read_lines(io.BytesIO(data), max_line=100, max_total=10000))
        self.assertEqual([(n, line is None) for n, line, _ in lines],
                         [(1, False), (2, True), (3, False)])
        capped = list(readback.read_lines(io.BytesIO(b"y" * 5000), max_line=100, max_total=1000))
        self.assertEqual(capped[-1], (None, None, False))

    def test_endless_input_is_bounded(self):
        import resource

        def limit_memory():
            resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

        def report(path):
            return subprocess.run([*PYTHON, QUALIFY, "report", path],
                                  capture_output=True, text=True, timeout=60,
                                  preexec_fn=limit_memory)
        shown = report("/dev/zero")                     # a device, not a records file
        self.assertEqual(shown.returncode, 2, shown.stderr)
        self.assertIn("/dev/zero is not a regular file", shown.stderr)
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        zeros = os.path.join(tmp.name, "zeros.jsonl")
        with open(zeros, "wb") as handle:
            handle.truncate(1 << 30)                    # 1 GiB, sparse: one endless line
        shown = report(zeros)
        self.assertEqual(shown.returncode, 1, shown.stderr)
        self.assertIn("line 1 is longer than 1 MiB (skipped)", shown.stdout)
        self.assertIn("stopped reading after 16 MiB", shown.stdout)
        ones = os.path.join(tmp.name, "ones.jsonl")
        with open(ones, "wb") as handle:
            handle.write(b"1\n" * 200_000)              # 200,000 bad lines
        shown = report(ones)
        self.assertEqual(shown.returncode, 1, shown.stderr)
        self.assertIn("and 199980 more bad lines (skipped)", shown.stdout)
        junk = os.path.join(tmp.name, "junk.jsonl")
        with open(junk, "w") as handle:
            handle.write(json.dumps({"record": "run", "run_id": "r"}) + "\n")
            for _ in range(600):                        # values, not bytes, fill memory
                handle.write('{"record": "request", "junk": [' + "{}," * 999 + "{}]}\n")
        shown = report(junk)
        self.assertNotIn("Traceback", shown.stderr)
        self.assertEqual(shown.returncode, 1, shown.stderr)
        self.assertIn("the records so far hold as many values as report keeps", shown.stdout)


if __name__ == "__main__":
    unittest.main()
