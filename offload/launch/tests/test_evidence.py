"""Per-wave evidence: what each wave did inside the engine, from its counters and gauges."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unittest

from support import QUALIFY, HelperCase, SilentServer
import transport  # noqa: E402  (support puts offload/launch on sys.path)
import vllm_client  # noqa: E402
import vllm_metrics  # noqa: E402


def summed(waves: list[dict]) -> dict:
    """The per-wave counter deltas added up, series by series."""
    total: dict = {}
    for wave in waves:
        for key, value in wave["counters"].items():
            if value is not None:
                total[key] = total.get(key, 0.0) + value
    return total


class TestWaveEvidence(HelperCase):
    def test_per_wave_deltas_add_up_to_the_whole_run(self):
        for engines in (1, 2):
            with self.subTest(engines=engines):
                server = self.start_fake(engines=engines)
                result = self.run_helper(server)
                self.assertEqual(result.code, 0, result.stdout)
                waves = result.kind("wave")
                self.assertEqual(len(waves), 4 * engines)
                (metrics,) = result.kind("metrics")
                whole = {k: v for k, v in metrics["deltas"].items() if v}
                # No foreign traffic: the gaps between waves add nothing.
                self.assertEqual({k: v for k, v in summed(waves).items() if v}, whole)
                for wave in waves:
                    self.assertFalse([k for k in wave["counters"] if "_created" in k])
                    self.assertTrue(any("iteration_tokens_total_bucket" in k
                                        for k in wave["counters"]))
                    spec = wave["spec_decode"]
                    self.assertEqual(spec["mean_acceptance_length"],
                                     round(1 + spec["accepted_tokens"] / spec["drafts"], 3))
                    self.assertEqual(len(spec["acceptance_by_position"]), 5)
                    if wave["engine"] is not None:
                        self.assertTrue(all(f'engine="{wave["engine"]}"' in k
                                            for k in wave["counters"]))
                self.assertIn("accept", result.stdout)
                self.assertIsNotNone(result.summary["spec_decode"])
                os.remove(self.records_path)

    def test_observed_depth_is_evidence_not_a_verdict(self):
        server = self.start_fake(latency_s=0.3, max_num_seqs=3)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        b4 = [w for w in result.kind("wave") if w["wave"] == "B4"][0]
        self.assertGreater(b4["gauge_samples"], 0)
        self.assertEqual(b4["running_max"], 3.0, "the server runs three at most")
        self.assertEqual(b4["waiting_max"], 1.0)
        self.assertIn("observed 3 of 4", result.stdout)
        self.assertTrue(b4["ok"], "a depth observed below the wave's is not a failure")
        for wave in result.kind("wave"):
            self.assertLessEqual(wave["running_max"], wave["depth"])

    def test_a_counter_that_went_down_is_named_not_subtracted(self):
        server = self.start_fake(reset_after=2)          # a restart during B2
        result = self.run_helper(server)
        b2 = [w for w in result.kind("wave") if w["wave"] == "B2"][0]
        self.assertTrue(b2["counters_went_down"])
        for key in b2["counters_went_down"]:
            self.assertIsNone(b2["counters"][key])
        self.assertIn("counter went down", self.report_text())
        self.assertEqual((result.code, result.summary["verdict"]), (1, "fail"))
        self.assertIn("the server restarted", " ".join(result.summary["problems"]))

    def test_without_speculative_decoding_nothing_is_invented(self):
        server = self.start_fake(speculative=False)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        for wave in result.kind("wave"):
            self.assertIsNone(wave["spec_decode"])
            self.assertFalse([k for k in wave["counters"] if "spec_decode" in k])
        self.assertNotIn("accept", result.stdout)
        self.assertEqual(result.summary["spec_decode"], {"all": None})

    def test_evidence_can_be_switched_off(self):
        server = self.start_fake()
        result = self.run_helper(server, "--gauge-interval-ms", "0")
        self.assertEqual(result.code, 0, result.stdout)
        for wave in result.kind("wave"):
            self.assertNotIn("counters", wave)
            self.assertNotIn("running_max", wave)
        reads = [r for r in server.state.requests if r["path"] == "/metrics"]
        self.assertEqual(len(reads), 1 + 4 + 1, "engines, a guard a wave, the read after")

    def report_text(self) -> str:
        return subprocess.run([sys.executable, QUALIFY, "report", self.records_path],
                              capture_output=True, text=True, timeout=30).stdout


class TestSampler(unittest.TestCase):
    def test_a_silent_server_is_counted_not_fatal_and_the_sampler_ends(self):
        silent = SilentServer()
        self.addCleanup(silent.stop)
        sampler = vllm_client.GaugeSampler(transport.parse_url(silent.url),
                                           transport.Clock.start(30, 30), 0.02, None)
        sampler.start()
        time.sleep(1.2)
        seen = sampler.stop()
        self.assertFalse(sampler.thread.is_alive(), "it never outlives the batch")
        self.assertGreaterEqual(seen[None]["gauge_reads_failed"], 1)
        self.assertIsNone(seen[None]["running_max"])

    def test_samples_fold_into_per_engine_maxima(self):
        sampler = vllm_client.GaugeSampler(transport.parse_url("http://h:1"),
                                           transport.Clock.start(9, 9), 0.02, (0, 1))
        sampler.note([("vllm:num_requests_running", {"engine": "0"}, 2.0),
                      ("vllm:num_requests_running", {"engine": "1"}, 4.0),
                      ("vllm:num_requests_waiting", {"engine": "1"}, 1.0),
                      ("vllm:num_requests_waiting_by_reason", {"engine": "1"}, 9.0),
                      ("vllm:num_requests_running", {"engine": "7"}, 9.0)])
        sampler.note([("vllm:num_requests_running", {"engine": "0"}, 3.0)])
        self.assertEqual(sampler.seen[0]["running_max"], 3.0)
        self.assertEqual(sampler.seen[1], {"running_max": 4.0, "waiting_max": 1.0,
                                           "gauge_samples": 1})
        self.assertNotIn(7, sampler.seen)

    def test_derived_figures(self):
        deltas = {'vllm:spec_decode_num_drafts_total{engine="0"}': 53.0,
                  'vllm:spec_decode_num_draft_tokens_total{engine="0"}': 219.0,
                  'vllm:spec_decode_num_accepted_tokens_total{engine="0"}': 138.0,
                  'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"}':
                      43.0,
                  'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"}':
                      36.0,
                  'vllm:iteration_tokens_total_sum{engine="0"}': 600.0,
                  'vllm:iteration_tokens_total_count{engine="0"}': 150.0}
        spec = vllm_metrics.spec_figures(deltas)
        self.assertEqual(spec["acceptance_rate"], round(138 / 219, 4))
        self.assertEqual(spec["mean_acceptance_length"], round(1 + 138 / 53, 3))
        self.assertEqual(spec["acceptance_by_position"], [round(43 / 53, 4), round(36 / 53, 4)])
        self.assertEqual(vllm_metrics.tokens_per_step(deltas), 4.0)
        self.assertIsNone(vllm_metrics.spec_figures({}))
        self.assertIsNone(vllm_metrics.tokens_per_step({}))

    def test_created_samples_are_never_counts(self):
        types = {"vllm:x_total": "counter", "vllm:h": "histogram"}
        self.assertTrue(vllm_metrics.is_count_series("vllm:x_total", types))
        self.assertFalse(vllm_metrics.is_count_series("vllm:x_created", types))
        self.assertTrue(vllm_metrics.is_count_series("vllm:h_bucket", types))
        self.assertTrue(vllm_metrics.is_count_series("vllm:h_sum", types))
        self.assertFalse(vllm_metrics.is_count_series("vllm:h_created", types))
        self.assertFalse(vllm_metrics.is_count_series("vllm:g", {"vllm:g": "gauge"}))
        self.assertTrue(vllm_metrics.is_count_series("untyped_total", {}))


if __name__ == "__main__":
    unittest.main()
