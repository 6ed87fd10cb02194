"""The fault and security matrix: one test per row, through real sockets and processes.

MATRIX below is the source of CONTRACT.md's fault matrix (section 13); a test checks that
CONTRACT.md shows exactly it, and that every row names a test that exists.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import time
import tracemalloc
import unittest

from support import (API_KEY, QUALIFY, REPO, HelperCase, run_script, SilentServer, free_port,
                     read_records)

# (fault, exit status, what the operator sees, the test that proves it)
MATRIX = [
    ("nothing listens on the port", "1", "`cannot connect to URL: Connection refused`, at once",
     "test_faults.TestFaults.test_nothing_listens"),
    ("`/metrics` answers 404 or garbage", "3", "`cannot tell how many engines the server has`, "
     "nothing sent",
     "test_faults.TestFaults.test_metrics_404_or_garbage"),
    ("request gauges absent (metrics collection off)", "3",
     "`vllm:num_requests_running missing from /metrics`, nothing sent",
     "test_faults.TestFaults.test_gauges_absent"),
    ("a gauge non-zero on any engine", "3",
     "gauge, labels and value, nothing sent",
     "test_faults.TestFaults.test_gauge_busy_on_second_engine"),
    ("`/metrics` drops the connection once", "0", "read again once (the engines too); the "
     "run passes",
     "test_faults.TestFaults.test_metrics_read_retried_once"),
    ("server accepts and never answers", "1", "`no complete response by the deadline`",
     "test_faults.TestFaults.test_server_never_answers"),
    ("server trickles one byte per second", "1", "`no complete response by the deadline`",
     "test_faults.TestFaults.test_trickling_server"),
    ("response headers, then the connection closed", "1",
     "`connection closed before the response was complete`; records intact",
     "test_faults.TestFaults.test_headers_then_close"),
    ("200 with truncated or non-JSON body", "1", "`invalid JSON in the response body`",
     "test_faults.TestFaults.test_truncated_or_non_json"),
    ("200 without `usage` or without `choices`", "1",
     "`response has no usage object` / `response has no choices`",
     "test_faults.TestFaults.test_missing_usage_or_choices"),
    ("401 (key missing or wrong)", "1", "`unauthorized: VLLM_API_KEY is not set` (or "
     "rejected); key never shown",
     "test_faults.TestFaults.test_unauthorized"),
    ("400 naming priority", "1", "`the server lacks priority scheduling; start it with "
     "--scheduling-policy priority`", "test_faults.TestFaults.test_priority_rejected"),
    ("400 context length / min_tokens", "1", "`the long prompt does not fit the model's "
     "context` and the server's limit", "test_faults.TestFaults.test_prompt_does_not_fit"),
    ("500 / 503", "1", "`HTTP 500: <sanitized message>`",
     "test_faults.TestFaults.test_server_errors"),
    ("oversized body (10 MB)", "1", "`larger than the 4194304 bytes the helper reads`", "test_faults.TestFaults.test_oversized_body"),
    ("HTTP redirect", "1", "`HTTP 307 redirect not followed`",
     "test_faults.TestFaults.test_redirect_not_followed"),
    ("`http_proxy` / `HTTPS_PROXY` set", "0", "ignored for the server's address; the run "
     "passes", "test_faults.TestFaults.test_proxy_variables_ignored"),
    ("a completion fails", "1", "never retried: one request per planned request",
     "test_faults.TestFaults.test_completion_never_retried"),
    ("SIGTERM mid-wave", "143", "`summary` with verdict `killed`, at once",
     "test_faults.TestFaults.test_sigterm_mid_wave"),
    ("SIGKILL mid-wave (the wrapper's KILL)", "137", "every record written before the kill "
     "is intact", "test_faults.TestFaults.test_sigkill_mid_wave"),
    ("records path not writable", "2", "`cannot write records to PATH`, before any request",
     "test_faults.TestFaults.test_records_not_writable"),
    ("`--base-url` with credentials", "0", "works; credentials appear nowhere",
     "test_faults.TestFaults.test_credentials_in_url"),
    ("generated text / token ids carry a marker", "0", "the marker appears nowhere", "test_launcher.TestStart.test_passing_start"),
    ("a gauge line that cannot be read exactly (timestamp, exemplar, CR, BOM)", "3",
     "`… cannot be read exactly`, naming the line; nothing sent",
     "test_hostile.TestHostile.test_guard_fails_closed_on_unreadable_gauge_lines"),
    ("fresh data-parallel server: gauges declared, no samples yet", "0",
     "idle by its own counters; 10 routed requests per engine",
     "test_engines.TestEngines.test_fresh_two_engine_server_is_warmed_on_both"),
    ("a proxy drops `X-data-parallel-rank`", "1",
     "`engine 1 generated 0 of 320 tokens: is X-data-parallel-rank honoured by this server?`",
     "test_engines.TestEngines.test_server_that_ignores_the_header_fails_naming_the_cold_engine"),
    ("our own requests counted out of the gauges late", "0",
     "re-read for `--settle-s`, recorded",
     "test_engines.TestEngines.test_gauge_counted_out_late_settles_and_passes"),
    ("a gauge stays busy after our own wave", "3",
     "refused after `--settle-s`, nothing more sent",
     "test_engines.TestEngines.test_gauge_that_stays_busy_is_refused_after_the_settle_window"),
    ("`/tokenize` counts 0, 1, negative or not an integer", "1",
     "`could not size the B1 prompt`",
     "test_hostile.TestHostile.test_tokenize_counts_that_cannot_size_b1"),
    ("deeply nested JSON in any body", "1 (2 from `/v1/models`)",
     "one line and a `summary`, no traceback",
     "test_hostile.TestHostile.test_deeply_nested_json"),
    ("malformed HTTP (1xx first, `2000 OK`, bad chunk, huge headers)", "1 or 0",
     "`malformed HTTP response: …`; interim 1xx skipped",
     "test_hostile.TestHostile.test_malformed_http_framing"),
    ("stdout closed early (`| head -1`) or never read", "0",
     "the run ends by its deadline with its `summary`",
     "test_hostile.TestHostile.test_stdout_closed_or_unread"),
    ("any catchable terminating signal, or two 100 µs apart", "128 + N",
     "exactly one `killed` summary",
     "test_hostile.TestHostile.test_terminating_signals_give_one_killed_summary"),
    ("a server message echoes our prompt; a model id carries CR, LF, ESC", "1",
     "removed from every output",
     "test_hostile.TestHostile.test_nothing_leaks_or_forges_output"),
    ("a bad API key or URL (CR/LF, non-ASCII, port 0)", "2",
     "one line naming the variable or option; nothing sent",
     "test_hostile.TestHostile.test_urls_and_api_keys"),
    ("records on a FIFO, `/dev/full` or a device", "2", "`cannot write records to PATH`",
     "test_hostile.TestHostile.test_records_destination_unwritable"),
]


def render_matrix() -> str:
    lines = ["| fault | exit | what the operator sees | test |", "|---|---|---|---|"]
    for fault, code, sees, test in MATRIX:
        lines.append(f"| {fault} | {code} | {sees} | `{test}` |")
    return "\n".join(lines)


class TestMatrixIsDocumented(unittest.TestCase):
    def test_the_contract_shows_the_matrix_once(self):
        with open(os.path.join(REPO, "offload", "launch", "CONTRACT.md"),
                  encoding="utf-8") as handle:
            contract = handle.read()
        self.assertTrue(render_matrix() in contract,
                        "CONTRACT.md's fault matrix differs from MATRIX; paste:\n" +
                        render_matrix())
        with open(os.path.join(REPO, "README.md"), encoding="utf-8") as handle:
            self.assertNotIn("| fault | exit |", handle.read(), "the matrix lives in CONTRACT.md")

    def test_every_row_names_a_test(self):
        for *_, name in MATRIX:
            module, cls, method = name.split(".")
            self.assertTrue(callable(getattr(getattr(importlib.import_module(module), cls),
                                             method, None)), name)


class TestFaults(HelperCase):
    runs_long = 10                        # seconds on a quiet run: run.py starts it early
    def assert_fails_with(self, result, code: int, text: str):
        self.assertEqual(result.code, code, result.stdout + result.stderr)
        self.assertIn(text, result.stdout)
        self.assertIn(text, " ".join(result.summary["problems"]))

    def test_nothing_listens(self):
        url = f"http://127.0.0.1:{free_port()}"
        result = self.run_helper(url)
        self.assert_fails_with(result, 1, f"cannot connect to {url}: Connection refused")
        self.assertLess(result.elapsed, 10, "a refused connection fails at once, not at the "
                                            "deadline")

    def test_metrics_404_or_garbage(self):
        for mode in ("404", "garbage"):
            with self.subTest(mode=mode):
                server = self.start_fake(metrics_mode=mode)
                result = self.run_helper(server)
                # The engines are learned from /metrics before any guard reads it.
                self.assert_fails_with(result, 3, "cannot tell how many engines the server has")
                self.assertEqual(server.state.completions(), [])
                os.remove(self.records_path)

    def test_gauges_absent(self):
        server = self.start_fake(metrics_mode="absent")
        result = self.run_helper(server)
        self.assert_fails_with(result, 3, "vllm:num_requests_running missing from /metrics")
        self.assertIn("vllm:num_requests_waiting missing from /metrics", result.stdout)
        self.assertEqual(server.state.completions(), [])

    def test_gauge_busy_on_second_engine(self):
        server = self.start_fake(engines=2,
                                 gauge_values={("vllm:num_requests_running", "1"): 2.0})
        result = self.run_helper(server)
        self.assert_fails_with(result, 3,
                               'vllm:num_requests_running{engine="1",model_name="fake-model"} '
                               '= 2.0')
        self.assertEqual(server.state.completions(), [])
        self.assertEqual(result.kind("gauges")[0]["ok"], False)

    def test_metrics_read_retried_once(self):
        server = self.start_fake(metrics_mode="flaky_once")
        result = self.run_helper(server, "--gauge-interval-ms", "0")   # guard reads only
        self.assertEqual(result.code, 0, result.stdout)
        reads = [r for r in server.state.requests if r["path"] == "/metrics"]
        # The engines' read dropped, then read again; B1..B4; one more after the last wave.
        self.assertEqual(len(reads), 1 + 1 + 4 + 1)
        self.assertEqual(len(result.kind("gauges")), 4)

    def test_server_never_answers(self):
        silent = SilentServer()
        self.addCleanup(silent.stop)
        result = self.run_helper(silent.url, "--model", "m", "--deadline-s", "0.6")
        self.assert_fails_with(result, 1, "no complete response by the deadline (0.6 s)")
        self.assertLess(result.elapsed, 0.6 + 5)

    def test_trickling_server(self):
        server = self.start_fake(fault="trickle", fault_match="-B1-", trickle_interval_s=0.2)
        result = self.run_helper(server, "--deadline-s", "0.8")
        self.assert_fails_with(result, 1, "no complete response by the deadline (0.8 s)")
        self.assertLess(result.elapsed, 0.8 + 5)

    def test_headers_then_close(self):
        server = self.start_fake(fault="headers_close", fault_match="-B2-0")
        result = self.run_helper(server)
        self.assert_fails_with(result, 1, "connection closed before the response was complete")
        self.assertEqual(len(result.requests), 10)
        self.assertEqual(sum(not r["ok"] for r in result.requests), 1)

    def test_truncated_or_non_json(self):
        for fault in ("truncated_json", "not_json"):
            with self.subTest(fault=fault):
                server = self.start_fake(fault=fault, fault_match="-B3-1")
                result = self.run_helper(server)
                self.assert_fails_with(result, 1, "invalid JSON in the response body")
                bad = [r for r in result.requests if not r["ok"]]
                self.assertEqual([r["problems"] for r in bad],
                                 [["invalid JSON in the response body"]])
                self.assert_clean(server, result)
                os.remove(self.records_path)

    def test_missing_usage_or_choices(self):
        for fault, said in (("no_usage", "response has no usage object"),
                            ("no_choices", "response has no choices")):
            with self.subTest(fault=fault):
                server = self.start_fake(fault=fault, fault_match="-B4-2")
                self.assert_fails_with(self.run_helper(server), 1, said)
                os.remove(self.records_path)

    def test_unauthorized(self):
        server = self.start_fake(api_key=API_KEY)
        for env, said in (({}, "unauthorized: VLLM_API_KEY is not set; set VLLM_API_KEY (or "
                               "--api-key-env)"),
                          ({"VLLM_API_KEY": "sk-wrong-key-77"},
                           "unauthorized: the server rejected the API key in VLLM_API_KEY")):
            with self.subTest(env=list(env)):
                result = self.run_helper(server, env=env)
                self.assert_fails_with(result, 1, said)
                self.assert_clean(server, result)
                self.assertNotIn("sk-wrong-key-77", result.stdout + result.records_text)
                os.remove(self.records_path)

    def test_priority_rejected(self):
        server = self.start_fake(reject_priority=True)
        result = self.run_helper(server)
        self.assert_fails_with(result, 1, "the server lacks priority scheduling; start it with "
                                          "--scheduling-policy priority")
        self.assertEqual(result.requests[0]["http_status"], 400)
        self.assertIn("priority", result.requests[0]["error"].lower())

    def test_prompt_does_not_fit(self):
        # Without /tokenize the estimated prompt overshoots a 6000-token context.
        server = self.start_fake(tokenize=False, max_model_len=6000)
        result = self.run_helper(server)
        self.assert_fails_with(result, 1, "the long prompt does not fit the model's context")
        self.assertIn("maximum context length is 6000 tokens", result.stdout)
        os.remove(self.records_path)
        server = self.start_fake(fault="status", fault_status=400, fault_match="-B1-",
                                 fault_message="min_tokens must be less than or equal to "
                                               "max_tokens=10, got 32.")
        result = self.run_helper(server)
        self.assert_fails_with(result, 1, "the long prompt does not fit the model's context")
        self.assertIn("max_tokens=10, got 32", result.stdout)

    def test_server_errors(self):
        for status in (500, 503):
            with self.subTest(status=status):
                server = self.start_fake(fault="status", fault_status=status,
                                         fault_message="engine\ndead \x1b[0m", fault_match="-B2-")
                result = self.run_helper(server)
                self.assert_fails_with(result, 1, f"HTTP {status}: engine dead [0m")
                os.remove(self.records_path)

    def test_oversized_body(self):
        for fault in ("oversized", "oversized_stream"):
            with self.subTest(fault=fault):
                server = self.start_fake(fault=fault, fault_match="-B1-")
                tracemalloc.start()
                try:
                    result = self.run_helper(server)
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                self.assert_fails_with(result, 1, "larger than the 4194304 bytes the helper reads")
                self.assertLess(peak, 16 << 20, "the read was not bounded")
                os.remove(self.records_path)

    def test_redirect_not_followed(self):
        server = self.start_fake(fault="redirect", fault_match="-B1-")
        result = self.run_helper(server)
        self.assert_fails_with(result, 1, "HTTP 307 redirect not followed")
        self.assertNotIn("/redirected", [r["path"] for r in server.state.requests])

    def test_proxy_variables_ignored(self):
        server = self.start_fake()
        dead = f"http://127.0.0.1:{free_port()}"
        result = self.run_helper(server, env={"http_proxy": dead, "HTTP_PROXY": dead,
                                              "https_proxy": dead, "HTTPS_PROXY": dead,
                                              "no_proxy": "", "NO_PROXY": ""})
        self.assertEqual(result.code, 0, result.stdout)

    def test_completion_never_retried(self):
        server = self.start_fake(fault="status", fault_status=503, fault_message="overloaded")
        result = self.run_helper(server)
        self.assertEqual(result.code, 1)
        self.assertEqual(len(server.state.completions()), 10)
        self.assertEqual(len({e["body"]["request_id"] for e in server.state.completions()}), 10)

    def test_sigterm_mid_wave(self):
        server = self.start_fake(fault="hang", fault_match="-B3-")
        proc = self.start_helper_process(server, "--deadline-s", "60")
        self.wait_for_completions(server, 6)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        self.assertLess(time.monotonic() - sent, 10, "at once, not at the 60 s deadline")
        self.assertEqual(proc.returncode, 143)
        self.assertIn("KILLED (exit 143)", out)
        records, _ = read_records(self.records_path)
        self.assertEqual(records[-1]["record"], "summary")
        self.assertEqual(records[-1]["verdict"], "killed")
        self.assertEqual(records[-1]["exit_code"], 143)
        self.assertIn("during B3", records[-1]["problems"][0])

    def test_sigkill_mid_wave(self):
        server = self.start_fake(fault="hang", fault_match="-B3-")
        ready_file = os.path.join(self.tmp, "ready")
        with open(ready_file, "w") as handle:      # the ready file of the run before
            json.dump({"kind": "offload-ready/1", "model": "fake-model", "base_url": server.url,
                       "verdict": "pass",
                       "run_id": "before", "process_start_time_seconds": None,
                       "served_at_warm": {"0": 1.0}}, handle)
        proc = self.start_helper_process(server, "--deadline-s", "60", "--ready-file",
                                         ready_file)
        self.wait_for_completions(server, 6)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        self.assertEqual(proc.returncode, -signal.SIGKILL)
        probe = run_script(QUALIFY, "ready", "--ready-file", ready_file)
        self.assertEqual(probe.returncode, 1, "a killed re-warm leaves no old 'ready'")
        self.assertRegex(probe.stderr, r"^not ready: \S+ is missing: no warm-up has passed "
                                       r"since")
        self.assertFalse(os.path.exists(ready_file), "taken away when the re-warm began")
        with open(self.records_path, encoding="utf-8") as handle:
            text = handle.read()
        self.assertTrue(text.endswith("\n"))
        records, _ = read_records(self.records_path)      # every line parses
        kinds = [r["record"] for r in records]
        self.assertEqual(kinds[0], "run")
        self.assertEqual(kinds.count("request"), 3)
        self.assertEqual(kinds.count("wave"), 2)
        self.assertNotIn("summary", kinds)

    def test_records_not_writable(self):
        server = self.start_fake()
        blocker = os.path.join(self.tmp, "a-file")
        open(blocker, "w").close()
        self.records_path = os.path.join(blocker, "records.jsonl")
        result = self.run_helper(server)
        self.assertEqual(result.code, 2)
        self.assertIn(f"cannot write records to {self.records_path}", result.stderr)
        self.assertEqual(server.state.requests, [])

    def test_credentials_in_url(self):
        server = self.start_fake()
        url = server.url.replace("http://", "http://opsuser:pw-CREDMARK-31@")
        result = self.run_helper(url)
        self.assertEqual(result.code, 0, result.stdout)
        for text in (result.stdout, result.stderr, result.records_text):
            self.assertNotIn("CREDMARK", text)
            self.assertNotIn("opsuser", text)
        self.assertEqual(result.kind("run")[0]["base_url"], server.url)
        for entry in server.state.requests:
            self.assertNotIn("CREDMARK", str(entry["headers"]))


if __name__ == "__main__":
    unittest.main()
