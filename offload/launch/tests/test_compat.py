"""qualify.py compat: what the helper relies on, checked against a running server (56)."""

from __future__ import annotations

import json
import os
import unittest

from support import API_KEY, PYTHON, QUALIFY, HelperCase, free_port, qualify


class TestCompat(HelperCase):
    def compat(self, server_or_url, *args: str, env: dict | None = None):
        url = server_or_url if isinstance(server_or_url, str) else server_or_url.url
        return self.run_argv(["compat", "--base-url", url, *args], env=env, main=qualify.main)

    def lines(self, result) -> dict:
        """check name -> its first word (held, MISSING, n/a)."""
        return {line[8:].split(": ")[0]: line.split()[0] for line in
                result.stdout.splitlines() if line[:7].strip() in ("held", "MISSING", "n/a")}

    def test_the_fake_holds_every_check_with_the_warm_up_s_own_request(self):
        server = self.start_fake(latency_s=0.01)
        result = self.compat(server)
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertEqual(set(self.lines(result).values()), {"held"}, result.stdout)
        self.assertIn("0 missing (exit 0)", result.stdout.splitlines()[-1])
        (sent,) = server.state.completions()
        self.assertEqual({k: sent["body"][k] for k in ("max_tokens", "min_tokens",
                                                       "ignore_eos", "temperature",
                                                       "priority")},
                         {"max_tokens": 4, "min_tokens": 4, "ignore_eos": True,
                          "temperature": 0, "priority": 20})

    def test_a_server_without_the_request_gauges_is_named(self):
        result = self.compat(self.start_fake(metrics_mode="absent"))
        self.assertEqual(result.code, 1, result.stdout)
        said = self.lines(result)
        self.assertEqual((said["vllm:num_requests_running"], said["vllm:num_requests_waiting"]),
                         ("MISSING", "MISSING"))
        self.assertIn("vllm:num_requests_running: not published", result.stdout)

    def test_an_engine_label_that_differs_is_named(self):
        result = self.compat(self.start_fake(engine_label="engine_idx"))
        self.assertEqual(result.code, 1, result.stdout)
        self.assertIn("vllm:generation_tokens_total: a sample without an engine index label "
                      "(labels: engine_idx, model_name)", result.stdout)
        self.assertEqual(self.lines(result)["GET /health"], "held")

    def test_a_fresh_data_parallel_server_holds(self):
        result = self.compat(self.start_fake(engines=2))
        self.assertEqual(result.code, 0, result.stdout)
        self.assertIn("vllm:num_requests_running: declared, no samples yet", result.stdout)

    def test_a_server_that_ends_early_fails_the_request_check(self):
        result = self.compat(self.start_fake(fault="one_token"))
        self.assertEqual(result.code, 1, result.stdout)
        self.assertEqual(self.lines(result)["POST /v1/completions"], "MISSING")
        self.assertIn("one-token response", result.stdout)

    def test_the_log_lines_start_sh_reads(self):
        server = self.start_fake()
        log = os.path.join(self.tmp, "server.log")
        with open(log, "w") as handle:
            handle.write("INFO [scheduler.py:307] Chunked prefill is enabled with "
                         "max_num_batched_tokens=8192.\n")
        held = self.compat(server, "--log", log)
        self.assertEqual(held.code, 0, held.stdout)
        self.assertIn("log: the prefill chunk line: max_num_batched_tokens 8192", held.stdout)
        with open(log, "w") as handle:
            handle.write("INFO nothing of the chunk\n")
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        refused = self.compat(server, "--log", fifo, "--timeout-s", "5")
        self.assertEqual(refused.code, 1, "a FIFO is refused, never waited on")
        self.assertIn("MISSING log", refused.stdout)
        missing = self.compat(server, "--log", log, "--json")
        doc = json.loads(missing.stdout)
        self.assertEqual((missing.code, doc["missing"], doc["checks"][-1]["held"]),
                         (1, 1, False))

    def test_no_server_is_one_line_a_check_and_the_key_is_never_shown(self):
        url = f"http://127.0.0.1:{free_port()}"
        result = self.compat(url, env={"VLLM_API_KEY": API_KEY})
        self.assertEqual(result.code, 1)
        self.assertIn("MISSING GET /health: no answer", result.stdout)
        self.assertNotIn("Traceback", result.stdout + result.stderr)
        self.assertNotIn(API_KEY, result.stdout + result.stderr)
        bad = self.run_process([*PYTHON, QUALIFY, "compat", "--base-url", "ftp://x"])
        self.assertEqual(bad.code, 2, bad.stderr)


if __name__ == "__main__":
    unittest.main()
