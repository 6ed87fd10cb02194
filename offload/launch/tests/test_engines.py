"""Every engine of a data-parallel server: routing, the fresh-server guard, settling, proof.

The fake behaves as a real data-parallel vLLM 0.32 was seen to: counters for every engine from
the start, gauge samples for an engine only once it has run a request, the
X-data-parallel-rank header routes, requests without it are balanced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import unittest

from support import QUALIFY, HelperCase, read_records
from support import decide_held  # noqa: E402
import core.contract as contract  # noqa: E402
import core.prometheus as prometheus  # noqa: E402
import core.vllm_client as vllm_client  # noqa: E402  (support puts offload/launch on sys.path)

GAUGE_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 0.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} %s
vllm:prompt_tokens_total{engine="0",model_name="m"} 0.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 0.0
"""


class TestGuardPerEngine(unittest.TestCase):
    def test_fresh_engines_without_gauge_samples_are_idle(self):
        exposition = prometheus.parse_prometheus(GAUGE_TEXT % "0.0")
        self.assertEqual(vllm_client.engines_in(exposition.samples), (0, 1))
        self.assertEqual(vllm_client.guard_problems(exposition, (0, 1)), ([], [0, 1]))

    def test_an_engine_that_ran_requests_needs_its_samples(self):
        exposition = prometheus.parse_prometheus(GAUGE_TEXT % "3.0")
        problems, fresh = vllm_client.guard_problems(exposition, (0, 1))
        self.assertEqual(fresh, [0])
        self.assertEqual(len(problems), 2)
        self.assertIn("vllm:num_requests_running has no sample for engine 1", problems[0])

    def test_an_undeclared_family_is_still_missing(self):
        text = GAUGE_TEXT.replace("# TYPE vllm:num_requests_waiting gauge\n", "")
        problems, _ = vllm_client.guard_problems(prometheus.parse_prometheus(text % "0.0"), (0, 1))
        self.assertEqual(problems, ["vllm:num_requests_waiting missing from /metrics (metrics "
                                    "collection off, or not a vLLM server): the guard cannot "
                                    "see other work"])

    def test_engine_shares(self):
        deltas = {'vllm:generation_tokens_total{engine="0"}': 320.0,
                  'vllm:generation_tokens_total{engine="1"}': 0.0,
                  'vllm:prompt_tokens_total{engine="0"}': 5200.0,
                  'vllm:prompt_tokens_total{engine="1"}': 0.0}
        shares, problems = contract.engine_shares(deltas, (0, 1), 320, {0: 4990, 1: 4990})
        self.assertEqual([s["generation_tokens"] for s in shares], [320.0, 0.0])
        self.assertEqual(problems[0], "engine 1 generated 0 of 320 tokens: is "
                                      "X-data-parallel-rank honoured by this server?")
        # An engine without readable counters: its warm-up is not proven (a NaN, a text or
        # a deleted delta, as a hand edit leaves it, the same).
        self.assertEqual(len(contract.engine_shares({}, (0, 1), 320, {})[1]), 2)
        for value in (float("nan"), "320", None):
            edited = dict(deltas, **{'vllm:generation_tokens_total{engine="1"}': value})
            if value is None:
                del edited['vllm:generation_tokens_total{engine="1"}']
            problems = contract.engine_shares(edited, (0, 1), 320, {0: 4990, 1: 4990})[1]
            self.assertEqual(problems, ["engine 1: counters absent or unreadable, its share "
                                        "cannot be checked: its warm-up is not proven"])


class TestEngines(HelperCase):
    runs_long = 6                         # seconds on a quiet run: run.py starts it early
    def completions(self, server):
        return server.state.completions()

    def test_fresh_two_engine_server_is_warmed_on_both(self):
        server = self.start_fake(engines=2, prompt_tokens_details=True, latency_s=0.2)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(len(result.requests), 20)
        self.assertEqual(server.state.completions_by_engine(), {0: 10, 1: 10})
        run_id = result.kind("run")[0]["run_id"]
        self.assertEqual(result.kind("run")[0]["engines"], [0, 1])
        for entry in self.completions(server):
            rid = entry["body"]["request_id"]
            engine = entry["headers"].get("X-data-parallel-rank")
            self.assertEqual(rid.split("-")[3], f"e{engine}", rid)
            self.assertEqual(entry["engine"], int(engine))
        for record in result.requests:
            self.assertEqual(record["request_id"],
                             f"warmup-{run_id}-e{record['engine']}-{record['wave']}-"
                             f"{record['index']}")
        b1 = [r for r in result.requests if r["wave"] == "B1"]
        self.assertEqual(sorted(r["engine"] for r in b1), [0, 1])
        self.assertEqual([r["cached_tokens"] for r in b1], [0, 0], "each B1 has its own nonce")
        nonces = {e["body"]["prompt"].split()[0] for e in self.completions(server)
                  if e["body"]["request_id"].endswith("-B1-0")}
        self.assertEqual(len(nonces), 2)
        self.assertEqual(result.kind("gauges")[0]["fresh_engines"], [0, 1])
        waves = result.kind("wave")
        self.assertEqual([(w["wave"], w["engine"]) for w in waves],
                         [(f"B{d}", e) for d in (1, 2, 3, 4) for e in (0, 1)])
        (metrics,) = result.kind("metrics")
        self.assertEqual([s["generation_tokens"] for s in metrics["engines"]], [320.0, 320.0])
        self.assertIn("B4 e1 4/4 ok", result.stdout)
        self.assertEqual(result.summary["requests_total"], 20)
        # Every wave's requests on both engines were released together: all eight of B4
        # arrived before the first of them was answered (order, not a time bound).
        b4 = [e for e in self.completions(server) if "-B4-" in e["body"]["request_id"]]
        self.assertEqual(len(b4), 8)
        self.assertLess(max(e["arrived"] for e in b4), min(e["done"] for e in b4))
        # Read again, an engine whose counter delta was edited away (a text, a deletion)
        # is no pass: its share of the warm-up cannot be checked.
        report = [sys.executable, "-S", QUALIFY, "report", self.records_path]
        self.assertEqual(subprocess.run(report, capture_output=True, timeout=30).returncode, 0)
        for value in ("320", None):
            found, _ = read_records(self.records_path)
            for record in found:
                if record["record"] == "metrics":
                    key = next(k for k in record["deltas"] if k.startswith(
                        "vllm:generation_tokens_total") and 'engine="1"' in k)
                    if value is None:
                        del record["deltas"][key]
                    else:
                        record["deltas"][key] = value
            edited = os.path.join(self.tmp, "edited.jsonl")
            with open(edited, "w", encoding="utf-8") as handle:
                handle.write("".join(json.dumps(r) + "\n" for r in found))
            shown = subprocess.run(report[:-1] + [edited], capture_output=True, text=True,
                                   timeout=30)
            self.assertEqual(shown.returncode, 1, shown.stdout)
            self.assertIn("engine 1: counters absent or unreadable", shown.stdout)

    def test_server_that_ignores_the_header_fails_naming_the_cold_engine(self):
        server = self.start_fake(engines=2, ignore_rank=True)
        result = self.run_helper(server)
        self.assertEqual(result.code, 1, result.stdout)
        self.assertEqual(server.state.completions_by_engine(), {0: 20, 1: 0})
        self.assertIn("engine 1 generated 0 of 320 tokens: is X-data-parallel-rank honoured by "
                      "this server?", result.summary["problems"])
        self.assertIn("engine 1 generated 0 of 320", result.stdout)

    def test_engines_list_warms_only_those(self):
        server = self.start_fake(engines=2)
        result = self.run_helper(server, "--engines", "1")
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(server.state.completions_by_engine(), {0: 0, 1: 10})
        self.assertTrue(all(e["headers"].get("X-data-parallel-rank") == "1"
                            for e in self.completions(server)))
        self.assertTrue(all("-e1-" in r["request_id"] for r in result.requests))

    def test_engine_not_served_is_a_usage_error(self):
        server = self.start_fake(engines=2)
        result = self.run_helper(server, "--engines", "0,5")
        self.assertEqual(result.code, 2)
        self.assertIn("--engines 0,5: engine 5 is not served", result.summary["problems"][0])
        self.assertEqual(self.completions(server), [])

    def test_one_engine_sends_no_header_and_keeps_its_ids(self):
        server = self.start_fake()
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertTrue(all("X-data-parallel-rank" not in e["headers"]
                            for e in self.completions(server)))
        run_id = result.kind("run")[0]["run_id"]
        self.assertEqual([r["request_id"] for r in result.requests],
                         [f"warmup-{run_id}-B{d}-{i}" for d in (1, 2, 3, 4) for i in range(d)])
        self.assertTrue(all(r["engine"] is None for r in result.requests + result.kind("wave")))
        self.assertIsNone(result.kind("run")[0]["engines"])

    def test_gauge_counted_out_late_settles_and_passes(self):
        server = self.start_fake(engines=2, late_gauge_s=0.25)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        settled = [g["settle_s"] for g in result.kind("gauges")]
        self.assertIsNone(settled[0], "before B1 nothing of ours ran: no settling")
        # The read after each wave (its counters) settles first; the guards then find the
        # server idle. Either way the summary says how long each settling took.
        self.assertTrue(result.summary["settled_s"], result.summary)
        self.assertTrue(all(0.1 <= s <= 2 for s in result.summary["settled_s"]),
                        result.summary["settled_s"])
        without = self.start_fake(engines=2, late_gauge_s=0.25)
        os.remove(self.records_path)
        guarded = self.run_helper(without, "--gauge-interval-ms", "0")
        self.assertEqual(guarded.code, 0, guarded.stdout)
        guard_settled = [g["settle_s"] for g in guarded.kind("gauges")]
        self.assertTrue(any(s and 0.1 <= s <= 2 for s in guard_settled[1:]), guard_settled)
        self.assertEqual(guarded.summary["settled_s"], [s for s in guard_settled if s])

    def test_gauge_that_stays_busy_is_refused_after_the_settle_window(self):
        server = self.start_fake(engines=2, late_gauge_s=30)
        started = time.monotonic()
        result = self.run_helper(server, "--settle-s", "0.6")
        self.assertEqual(result.code, 3, result.stdout)
        self.assertLess(time.monotonic() - started, 0.6 + 10, "refused after the settle window")
        settled = [g["settle_s"] for g in result.kind("gauges") if g["settle_s"]]
        self.assertTrue(settled and 0.5 <= settled[-1] <= 0.6 + 0.2, settled)
        self.assertEqual(len(self.completions(server)), 2, "nothing more after B1")
        self.assertIn("refused before B2", result.summary["problems"][0])
        self.assertIn("still after", result.summary["problems"][0])

    def test_busy_before_b1_refuses_at_once(self):
        server = self.start_fake(engines=2, gauge_values={("vllm:num_requests_waiting", "0"): 1})
        started = time.monotonic()
        result = self.run_helper(server, "--settle-s", "30")
        self.assertEqual(result.code, 3)
        self.assertLess(time.monotonic() - started, 15, "no settling before B1")
        self.assertEqual([g["settle_s"] for g in result.kind("gauges")], [None])
        self.assertEqual(self.completions(server), [])

    def test_undeclared_gauges_on_a_fresh_data_parallel_server_refuse(self):
        server = self.start_fake(engines=2, metrics_mode="absent")
        result = self.run_helper(server)
        self.assertEqual(result.code, 3)
        self.assertIn("vllm:num_requests_running missing from /metrics",
                      result.summary["problems"][0])

    def test_a_dropped_first_metrics_read_is_read_again_and_both_engines_warmed(self):
        server = self.start_fake(engines=2, metrics_mode="flaky_once")
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(result.kind("run")[0]["engines"], [0, 1])
        self.assertEqual(server.state.completions_by_engine(), {0: 10, 1: 10})

    def test_engines_that_cannot_be_named_refuse_before_anything_is_sent(self):
        server = self.start_fake(engines=2, metrics_mode="404")
        result = self.run_helper(server)
        self.assertEqual(result.code, 3, result.stdout)
        self.assertEqual(result.summary["verdict"], "refused")
        self.assertIn("cannot tell how many engines the server has",
                      result.summary["problems"][0])
        self.assertEqual(self.completions(server), [])


class TestEnginesSeenAreWarmed(unittest.TestCase):
    """decide() holds the engines a run record names against those its own records show."""

    def records(self, engines, skipped=()):
        from support import contract_requests, run_record, wave_records
        run = run_record("r1", engines_skipped=list(skipped))
        run["engines"] = engines
        gauges = {"record": "gauges", "run_id": "r1", "wave": "B1", "ok": True, "at_s": 0.0, "settle_s": None,
                  "samples": [{"name": "vllm:num_requests_running",
                               "labels": {"engine": e, "model_name": "m"}, "value": 0.0}
                              for e in ("0", "1")], "fresh_engines": [], "problems": []}
        return run, [run, gauges] + contract_requests("r1") + wave_records("r1")

    def test_an_engine_seen_and_not_warmed_is_not_a_pass(self):
        run, records = self.records(None)
        verdict = decide_held(run, records, contract.Ending())
        self.assertEqual(verdict.verdict, "fail")
        self.assertIn("engine 1 of the server (seen in this run's /metrics records) was not "
                      "warmed", verdict.problems[0])

    def test_an_engine_named_as_left_out_is_a_custom_plan_not_a_failure(self):
        run, records = self.records(None, skipped=[1])
        self.assertEqual(decide_held(run, records, contract.Ending()).verdict, "custom")

    def test_the_engines_warmed_pass(self):
        run, records = self.records(None)
        records[1]["samples"] = records[1]["samples"][:1]        # engine 0 only
        self.assertEqual(decide_held(run, records, contract.Ending()).verdict, "pass")


if __name__ == "__main__":
    unittest.main()
