"""Qualification tools: counter deltas, status files, `report` and `probe` (issue 5)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from support import (QUALIFY, HelperCase, contract_requests, qualify, run_record,
                     summary_record)
import evidence  # noqa: E402  (support puts offload/launch on sys.path)
import probe  # noqa: E402
import report  # noqa: E402
import readback  # noqa: E402  (support puts offload/launch on sys.path)
import runframe  # noqa: E402  (support puts offload/launch on sys.path)
import transport  # noqa: E402  (support puts offload/launch on sys.path)
import vllm_client  # noqa: E402
import vllm_metrics  # noqa: E402  (support puts offload/launch on sys.path)

SERIES = 'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"}'


class TestCounterDeltas(unittest.TestCase):
    def test_deltas_by_label_set_with_absent_and_reset_counters(self):
        before = {SERIES: 4.0, "vllm:prompt_tokens_total": 100.0, "gone_total": 5.0,
                  "reset_total": 9.0}
        after = {SERIES: 14.0, "vllm:prompt_tokens_total": 5100.0, "new_total": 3.0,
                 "reset_total": 1.0}
        deltas = vllm_metrics.counter_deltas(before, after)
        self.assertEqual(deltas[SERIES], 10.0)
        self.assertEqual(deltas["vllm:prompt_tokens_total"], 5000.0)
        self.assertIsNone(deltas["gone_total"])
        self.assertIsNone(deltas["new_total"])
        self.assertIsNone(deltas["reset_total"])
        self.assertTrue(all(v is None for v in vllm_metrics.counter_deltas(None, after).values()))

    def test_counters_are_total_series_only(self):
        samples = transport.parse_prometheus(
            'vllm:num_requests_running{engine="0"} 0\n'
            'vllm:generation_tokens_total{engine="0"} 7\n'
            'vllm:generation_tokens_total{engine="1"} 3\n').samples
        self.assertEqual(vllm_client.counters(samples),
                         {'vllm:generation_tokens_total{engine="0"}': 7.0,
                          'vllm:generation_tokens_total{engine="1"}': 3.0})

    def test_highlights_name_absent_counters_as_null(self):
        shown = evidence.highlighted({SERIES: 10.0, "other_total": 1.0})
        self.assertEqual(shown[SERIES], 10.0)
        self.assertNotIn("other_total", shown)
        self.assertIsNone(shown["vllm:generation_tokens_total"])
        self.assertIsNone(shown["vllm:spec_decode_*"])
        with_spec = evidence.highlighted({"vllm:spec_decode_num_drafts_total": 7.0})
        self.assertNotIn("vllm:spec_decode_*", with_spec)

    def test_cross_check_fails_on_more_than_recorded_and_warns_on_less(self):
        requests = [{"completion_tokens": 32, "http_status": 200}] * 10
        good = {'vllm:generation_tokens_total{engine="0"}': 300.0,
                'vllm:generation_tokens_total{engine="1"}': 20.0, SERIES: 10.0}
        self.assertEqual(evidence.cross_check(good, requests), ([], []))
        more = dict(good, **{'vllm:generation_tokens_total{engine="1"}': 52.0})
        problems, warnings = evidence.cross_check(more, requests)
        self.assertEqual(warnings, [])
        self.assertIn("generation tokens delta 352 exceeds the records' 320 completion tokens: "
                      "foreign or concurrent work", problems[0])
        less = dict(good, **{SERIES: 9.0})
        self.assertIn("request success delta 9 is below the records' 10",
                      evidence.cross_check(less, requests)[1][0])
        self.assertIn("absent", evidence.cross_check({}, requests)[1][0])


class TestStatusDelta(unittest.TestCase):
    def test_numeric_fields_only_and_identity_checked(self):
        before = {"pid": 10, "session": "a", "steps": 5, "workers": {"drafted_requests": 2},
                  "ready": True, "name": "w"}
        after = {"pid": 10, "session": "a", "steps": 9, "workers": {"drafted_requests": 12},
                 "ready": False, "name": "w"}
        result = evidence.status_delta(before, after)
        self.assertEqual(result["state"], "valid")
        self.assertEqual(result["delta"], {"steps": 4, "workers.drafted_requests": 10})
        changed = evidence.status_delta(before, dict(after, pid=11))
        self.assertEqual(changed["state"], "invalid")
        self.assertIn("pid changed (10 -> 11)", changed["why"])
        missing = evidence.status_delta(None, after, "before: missing")
        self.assertEqual((missing["state"], missing["delta"]), ("incomplete", None))


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
        built = report.build_report(records, issues)
        self.assertEqual(built["verdict"], "incomplete")
        self.assertEqual(built["exit_code"], 1)
        self.assertIn("ends after a 'request' record", built["runs"][0]["ends"])
        self.assertIn("verdict: incomplete (exit 1; no summary", report.format_report(built))

    def test_cut_short_probe_names_its_failed_requests(self):
        records = [{"record": "run", "run_id": "r", "mode": "probe", "plan": {}},
                   {"record": "probe", "item": "burst3", "round": 2, "index": 1, "ok": False,
                    "problems": ["HTTP 500"]}]
        built = report.build_report(records, [])
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
        slot = vllm_client.Slot(0, "probe-r-single-r1-0", b"", sent_at=0.1, done_at=0.2,
                                response=response, stream=True)
        settings = runframe.RunSettings(prog="probe", run_id="r", records_path="unused",
                                        deadline_s=90, socket_cap_s=60)
        connection = vllm_client.Connection(
            target=vllm_client.parse_base_url("http://h:1"), api_key=None,
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
        self.assertIn("long e0", report.probe_line(e0))
        self.assertIn("round 2 served from the prefix cache, left out", report.probe_line(e0))

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

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "records.jsonl")

    def write(self, *lines):
        with open(self.path, "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write((line if isinstance(line, str) else json.dumps(line)) + "\n")

    def report(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, QUALIFY, "report", self.path, *args],
                              capture_output=True, text=True, timeout=30, **kwargs)

    def test_reads_past_bad_lines_and_names_them(self):
        self.write(run_record("a"),
                   '{"record": "request", "wave": "B1"', "[1, 2]", *contract_requests("a"),
                   summary_record("a", "pass", 0, notes=["B1 cache check not made"],
                                  warnings=["w1"]))
        records, issues = readback.load_records(self.path)
        self.assertEqual([r["record"] for r in records], ["run"] + ["request"] * 10 + ["summary"])
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
            return [run_record(rid)] + contract_requests(rid, **failed)[:n] + \
                [summary_record(rid, verdict, code,
                                problems=[] if code == 0 else ["B1#0: HTTP 500"])]
        self.write(*run("first", "fail", 1, 10), *run("second", "pass", 0, 10))
        shown = self.report()
        self.assertEqual(shown.returncode, 0)
        self.assertIn("== run 1 of 2 ==", shown.stdout)
        self.assertIn("verdict: fail (exit 1)", shown.stdout)
        self.assertTrue(shown.stdout.rstrip().splitlines()[-2].startswith("verdict: pass"))
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
        self.assertIn("model unknown (server unknown)", shown.stdout)
        self.assertIn("  - one problem", shown.stdout)
        self.assertIn("engine", shown.stdout.splitlines()[2])
        doc = json.loads(self.report("--json").stdout)
        self.assertEqual(doc["exit_code"], 1)

    def test_empty_file_and_unreadable_path(self):
        self.write()
        shown = self.report()
        self.assertEqual(shown.returncode, 1)
        self.assertIn("no warm-up run in", shown.stdout)
        self.assertEqual(json.loads(self.report("--json").stdout)["runs"], [])
        gone = subprocess.run([sys.executable, QUALIFY, "report", self.path + ".nope"],
                              capture_output=True, text=True, timeout=30)
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
            return subprocess.run([sys.executable, QUALIFY, "report", path],
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


class StatusWriter:
    """Rewrites a JSON status file on a timer, like a worker's; stopped at cleanup."""

    def __init__(self, path: str, period_s: float = 0.1):
        self.path, self.period_s = path, period_s
        self.doc = {"pid": 100, "session": "s1", "steps": 0, "proxy": {"rounds": 0}}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopped.wait(self.period_s):
            self.doc["steps"] += 3
            self.doc["proxy"]["rounds"] += 1
            tmp = self.path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(self.doc, handle)
            os.replace(tmp, self.path)

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=5)


class TestQualificationRuns(HelperCase):
    def test_warmup_records_counter_deltas_that_match_the_records(self):
        server = self.start_fake()
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        (metrics,) = result.kind("metrics")
        self.assertEqual(metrics["state"], "complete")
        self.assertIn("not a count of worker rounds", metrics["meaning"])
        gen = 'vllm:generation_tokens_total{engine="0",model_name="fake-model"}'
        ok = 'vllm:request_success_total{engine="0",finished_reason="length",model_name="fake-model"}'
        self.assertEqual(metrics["deltas"][gen], 320.0)
        self.assertEqual(metrics["highlights"][ok], 10.0)
        self.assertGreater(metrics["highlights"][
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="fake-model"}'], 0)
        self.assertEqual(metrics["warnings"], [])
        self.assertEqual(result.summary["counters"][gen], 320.0)
        self.assertIn("counters over the warm-up: generation_tokens +320", result.stdout)

    def test_foreign_work_fails_the_run_by_name(self):
        server = self.start_fake(counter_skew=1)      # one more token counted per request
        result = self.run_helper(server)
        self.assertEqual((result.code, result.summary["verdict"]), (1, "fail"))
        problems = result.summary["problems"]
        self.assertIn("B2: generation tokens delta 66 exceeds the records' 64 completion "
                      "tokens: foreign or concurrent work", " ".join(problems))
        self.assertIn("the warm-up: generation tokens delta 330 exceeds the records' 320",
                      " ".join(problems))
        self.assertTrue(all(r["ok"] for r in result.requests), "the answers themselves passed")

    def test_counting_less_than_recorded_is_a_warning(self):
        server = self.start_fake(counter_skew=-1)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.summary["problems"])
        self.assertIn("generation tokens delta 310 is below the records' 320",
                      " ".join(result.summary["warnings"]))
        self.assertIn("warning: generation tokens delta 310", result.stdout)

    def test_absent_counters_are_null(self):
        server = self.start_fake(speculative=False)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0)
        self.assertIsNone(result.summary["counters"]["vllm:spec_decode_*"])

    def test_counters_are_skipped_rather_than_making_the_run_late(self):
        # Less than a second left after the last wave: the reads after it are not made.
        sink = io.StringIO()
        settings = runframe.RunSettings("p", "r", "unused", 0.5, 0.5)
        run = runframe.Run(settings, runframe.Program(), transport.Clock.start(0.5, 0.5),
                           sink, print)
        tally = vllm_client.Tally()
        evidence.Evidence(evidence.EvidenceOptions()).read_after(
            run, transport.parse_url("http://127.0.0.1:9"), {}, tally)
        self.assertEqual(sink.getvalue(), "", "no metrics record, nothing read")
        self.assertIn("not read after the last wave: less than 1 s left", tally.warnings[0])

    def test_more_metrics_endpoints(self):
        server, proxy = self.start_fake(), self.start_fake()
        result = self.run_helper(server, "--metrics-url", proxy.url + "/metrics")
        self.assertEqual(result.code, 0, result.stdout)
        sources = {m["source"]: m for m in result.kind("metrics")}
        self.assertEqual(set(sources), {server.url + "/metrics", proxy.url + "/metrics"})
        self.assertEqual(sources[proxy.url + "/metrics"]["state"], "complete")
        self.assertEqual([r["path"] for r in proxy.state.requests], ["/metrics", "/metrics"])

    def test_status_file_delta(self):
        path = os.path.join(self.tmp, "status.json")
        writer = StatusWriter(path)
        self.addCleanup(writer.stop)
        server = self.start_fake(latency_s=0.1)
        result = self.run_helper(server, "--status-file", path, "--status-wait-s", "3")
        self.assertEqual(result.code, 0, result.stdout)
        (status,) = result.kind("status")
        self.assertEqual(status["state"], "valid")
        self.assertGreater(status["delta"]["steps"], 0)
        self.assertGreater(status["delta"]["proxy.rounds"], 0)
        self.assertNotIn("pid", status["delta"])

    def test_status_file_identity_change_invalidates(self):
        path = os.path.join(self.tmp, "status.json")
        writer = StatusWriter(path)
        self.addCleanup(writer.stop)
        server = self.start_fake(latency_s=0.05)

        def restart_worker():
            while not server.state.completions() and not writer.stopped.is_set():
                time.sleep(0.01)
            writer.doc["pid"] = 101
        threading.Thread(target=restart_worker, daemon=True).start()
        result = self.run_helper(server, "--status-file", path, "--status-wait-s", "3")
        self.assertEqual(result.code, 0)
        (status,) = result.kind("status")
        self.assertEqual(status["state"], "invalid")
        self.assertIn("pid changed (100 -> 101)", status["why"])
        self.assertIn("status file", " ".join(result.summary["warnings"]))

    def test_missing_or_stale_status_file_is_incomplete(self):
        server = self.start_fake()
        stale = os.path.join(self.tmp, "stale.json")
        with open(stale, "w") as handle:
            json.dump({"pid": 1, "steps": 5}, handle)
        missing = os.path.join(self.tmp, "missing.json")
        result = self.run_helper(server, "--status-file", stale, "--status-file", missing,
                                 "--status-wait-s", "0.15")
        self.assertEqual(result.code, 0)
        states = {r["path"]: r for r in result.kind("status")}
        self.assertEqual(states[stale]["state"], "incomplete")
        self.assertIn("stale", states[stale]["why"])
        self.assertEqual(states[missing]["state"], "incomplete")
        self.assertIn("missing", states[missing]["why"])
        self.assertIsNone(states[stale]["delta"])

    def report(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, QUALIFY, "report", *args], capture_output=True,
                              text=True, timeout=30)

    def test_report_of_a_full_run(self):
        server = self.start_fake(prompt_tokens_details=True)
        self.assertEqual(self.run_helper(server).code, 0)
        shown = self.report(self.records_path)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        for text in ("wave  id", "warmup-", "length", "B4   depth 4  skew", "counter deltas from",
                     "verdict: pass (exit 0)"):
            self.assertIn(text, shown.stdout)
        as_json = json.loads(self.report(self.records_path, "--json").stdout)
        self.assertEqual(len(as_json["runs"][0]["requests"]), 10)
        self.assertEqual(as_json["verdict"], "pass")

    def test_report_of_a_failed_run_exits_with_its_status(self):
        server = self.start_fake(fault="one_token", fault_match="-B2-0")
        self.assertEqual(self.run_helper(server).code, 1)
        shown = self.report(self.records_path)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("B2#0: one-token response", shown.stdout)

    def test_report_of_a_killed_run(self):
        server = self.start_fake(fault="hang", fault_match="-B3-")
        proc = self.start_helper_process(server)
        self.wait_for_completions(server, 6)
        proc.kill()
        proc.communicate(timeout=10)
        shown = self.report(self.records_path)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("verdict: incomplete (exit 1; no summary", shown.stdout)
        self.assertEqual(self.report(os.path.join(self.tmp, "nope.jsonl")).returncode, 2)

    def test_probe_finds_what_a_warm_up_leaves_cold(self):
        server = self.start_fake(cold_s=0.2, latency_s=0.02)
        cold = self.run_probe(server, "--rounds", "2")
        self.assertEqual(cold.code, 0, cold.stdout)
        self.assertEqual(len(cold.kind("probe")), 16)
        summary = {e["item"]: e for e in cold.kind("probe_summary")[0]["items"]}
        self.assertEqual(set(summary), {"single", "burst3", "burst4"})
        self.assertGreater(summary["single"]["ttft_first_s"], 0.18)
        self.assertGreater(summary["single"]["ttft_ratio"], 2)
        self.assertRegex(cold.stdout, r"single +TTFT first")
        self.assert_clean(server, cold)
        # A fresh server warmed up first: the probe's first round is no longer cold.
        warmed = self.start_fake(cold_s=0.5, latency_s=0.02)
        os.remove(self.records_path)
        self.assertEqual(self.run_helper(warmed).code, 0)
        os.remove(self.records_path)
        served = len(warmed.state.completions())
        after = self.run_probe(warmed, "--rounds", "2")
        self.assertEqual(after.code, 0)
        probed = warmed.state.completions()[served:]
        self.assertEqual([e.get("cold_s") for e in probed], [0.0] * len(probed),
                         "after the warm-up no probe request paid a first-use cost")

    def test_probe_prompts_are_never_cache_hits(self):
        server = self.start_fake(prompt_tokens_details=True, engines=2)
        result = self.run_probe(server, "--long-tokens", "4200", "--json")
        self.assertEqual(result.code, 0, result.stderr)
        probes = result.kind("probe")
        self.assertEqual(len(probes), 2 * 3 * 9)
        self.assertEqual({r["cached_tokens"] for r in probes}, {0})
        prompts = [r["body"]["prompt"] for r in server.state.completions()]
        self.assertEqual(len(set(p.split()[0] for p in prompts)), len(prompts))
        shown = json.loads(result.stdout)
        self.assertEqual({(e["item"], e["engine"]) for e in shown["probe"]},
                         {(i, e) for i in ("single", "burst3", "burst4", "long") for e in (0, 1)})
        self.assertIn("ttft_ratio", shown["probe"][0])
        self.assert_clean(server, result)

    def test_probe_respects_the_guard(self):
        server = self.start_fake(gauge_values={("vllm:num_requests_waiting", "0"): 1.0})
        result = self.run_probe(server)
        self.assertEqual(result.code, 3)
        self.assertEqual(server.state.completions(), [])

    def run_probe(self, server, *args: str):
        return self.run_argv(["probe", "--base-url", server.url, "--records", self.records_path,
                              "--rounds", "3", *args], main=qualify.main)


if __name__ == "__main__":
    unittest.main()
