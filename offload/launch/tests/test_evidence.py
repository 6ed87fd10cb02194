"""What the evidence shows (evidence.py, vllm_metrics.py): counter and status-file deltas,
each wave's counters and gauges, and what decides a run (foreign work, the lock, /health,
the textfile found unwritable first, wall-clock wave times and the drafted length)."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import time
import unittest
from unittest import mock

from support import (PYTHON, WARMUP, HelperCase, SilentServer, qualify, read_records,
                     run_qualify)
import core.evidence as evidence  # noqa: E402
import core.runframe as runframe  # noqa: E402  (support puts offload/launch on sys.path)
import tools.report as report  # noqa: E402
import core.transport as transport  # noqa: E402
import core.prometheus as prometheus  # noqa: E402
import core.records as records  # noqa: E402
import core.locks as locks  # noqa: E402
import core.vllm_client as vllm_client  # noqa: E402
import core.vllm_metrics as vllm_metrics  # noqa: E402
import core.status_files as status_files  # noqa: E402


def expanded(kept: dict, keys: set) -> dict:
    """Deltas as records keep them (vllm_metrics.changed_only) made whole again for these
    series: a missing bucket has the delta of the nearest lower kept bucket of its
    histogram, 0 below the first; any other missing series did not change."""
    def group_and_bound(key):
        found = re.search(r',?le="([^"]*)"', key)
        if not found:
            return None, None
        return key.replace(found.group(0), "", 1), vllm_metrics.bucket_bound(found.group(1))
    whole = {}
    for key in keys:
        if key in kept:
            whole[key] = kept[key]
            continue
        group, bound = group_and_bound(key)
        lower = [(b, kept[k]) for k in kept for g, b in [group_and_bound(k)]
                 if group is not None and g == group and b < bound]
        whole[key] = max(lower)[1] if lower else 0.0
    return whole


def summed(waves: list[dict], keys: set) -> dict:
    """The per-wave counter deltas, made whole, added up series by series."""
    total: dict = {}
    for wave in waves:
        for key, value in expanded(wave["counters"], keys).items():
            if value is not None:
                total[key] = total.get(key, 0.0) + value
    return total


SERIES = 'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"}'
UTC_MS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"

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
                keys = {k for k in set(metrics["deltas"]).union(*(w["counters"] for w in waves))
                        if not k.split("{")[0].endswith("_bucket")}
                whole = {k: v for k, v in expanded(metrics["deltas"], keys).items() if v}
                # No foreign traffic: the gaps between waves add nothing.
                self.assertEqual({k: v for k, v in summed(waves, keys).items() if v}, whole)
                buckets = [k for k in metrics["deltas"] if "iteration_tokens_total_bucket" in k]
                self.assertLess(len(buckets), engines * 14, "a bucket like the one below it "
                                                            "is left out")
                for wave in waves:
                    self.assertFalse([k for k in wave["counters"] if "_created" in k])
                    names = {k.split("{")[0] for k in wave["counters"]}
                    self.assertIn("vllm:iteration_tokens_total_count", names)
                    self.assertFalse([n for n in names if n.endswith("_bucket")],
                                     "a wave keeps a histogram's count and sum; its buckets "
                                     "are the whole run's (the metrics record)")
                    self.assertEqual([k for k, v in wave["counters"].items() if v == 0 and
                                      not k.startswith(vllm_metrics.TOKEN_COUNTERS)], [],
                                     "a series that did not move is left out")
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
        text = self.report_text()
        self.assertIn("B4   depth 4", text)
        self.assertNotIn("per-wave evidence", text, "no evidence: no table of dashes")

    def test_the_report_shows_the_per_wave_evidence_it_has(self):
        self.run_helper(self.start_fake())
        self.assertIn("per-wave evidence", self.report_text())

    def report_text(self) -> str:
        return run_qualify("report", self.records_path).stdout


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
        samples = prometheus.parse_prometheus(
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
        requests = [records.CLASSES["request"](completion_tokens=32, http_status=200)] * 10
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


class TestChangedOnly(unittest.TestCase):
    def test_unchanged_buckets_go_and_counters_stay(self):
        bucket = 'vllm:iteration_tokens_total_bucket{{engine="0",le="{}"}}'.format
        deltas = {bucket("8.0"): 0.0, bucket("16.0"): 3.0, bucket("32.0"): 3.0,
                  bucket("64.0"): 5.0, bucket("+Inf"): 5.0,
                  'vllm:iteration_tokens_total_count{engine="0"}': 0.0,
                  'vllm:generation_tokens_total{engine="1"}': 0.0,
                  'vllm:mm_cache_hits_total{engine="0"}': 0.0,
                  'vllm:request_success_total{engine="0",finished_reason="stop"}': 0.0,
                  'vllm:prompt_tokens_total{engine="0"}': None}
        kept = vllm_metrics.changed_only(deltas)
        self.assertEqual(kept, {bucket("16.0"): 3.0, bucket("64.0"): 5.0,
                                'vllm:generation_tokens_total{engine="1"}': 0.0,
                                'vllm:prompt_tokens_total{engine="0"}': None})
        self.assertEqual(expanded(kept, set(deltas)), deltas, "nothing is lost")


class TestTimeToWarm(unittest.TestCase):
    def test_three_phases_and_null_where_a_time_is_unknown_or_out_of_order(self):
        self.assertEqual(evidence.time_to_warm(1000.0, 1036.25, 1040.5),
                         {"start_to_healthy_s": 36.25, "healthy_to_warm_s": 4.25,
                          "start_to_warm_s": 40.5})
        self.assertEqual(evidence.time_to_warm(None, 1036.0, 1040.0),
                         {"start_to_healthy_s": None, "healthy_to_warm_s": 4.0,
                          "start_to_warm_s": None})
        self.assertEqual(evidence.time_to_warm(1000.0, 990.0, 1040.0)["start_to_healthy_s"],
                         None, "a clock that went backwards is no phase")
        self.assertEqual(evidence.time_to_warm(1000.0, None, 1984.8),
                         {"start_to_healthy_s": None, "healthy_to_warm_s": None,
                          "start_to_warm_s": None}, "by hand: never the server's uptime")


class TestStatusDelta(unittest.TestCase):
    def test_numeric_fields_only_and_identity_checked(self):
        before = {"pid": 10, "session": "a", "steps": 5, "workers": {"drafted_requests": 2},
                  "ready": True, "name": "w"}
        after = {"pid": 10, "session": "a", "steps": 9, "workers": {"drafted_requests": 12},
                 "ready": False, "name": "w"}
        result = status_files.status_delta(before, after)
        self.assertEqual(result["state"], "valid")
        self.assertEqual(result["delta"], {"steps": 4, "workers.drafted_requests": 10})
        changed = status_files.status_delta(before, dict(after, pid=11))
        self.assertEqual(changed["state"], "invalid")
        self.assertIn("pid changed (10 -> 11)", changed["why"])
        missing = status_files.status_delta(None, after, "before: missing")
        self.assertEqual((missing["state"], missing["delta"]), ("incomplete", None))


class TestEvidenceDecides(HelperCase):
    runs_long = 6                         # seconds on a quiet run: run.py starts it early
    def test_two_helpers_at_one_server_never_both_pass(self):
        # The first runs four waves of 1 s each; the others start once its B1 was sent,
        # while it holds the lock (about 3 s; a quiet machine starts one in 0.2 s).
        server = self.start_fake(latency_s=1.0)
        procs = []
        for n, host in enumerate(("127.0.0.1", "127.0.0.1", "localhost")):
            if n == 1:
                self.wait_for_completions(server, 1)
            records_path = os.path.join(self.tmp, f"r{n}.jsonl")
            procs.append((subprocess.Popen(
                [*PYTHON, WARMUP, "--base-url", server.url.replace("127.0.0.1", host),
                 "--records", records_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True), records_path))
        codes = []
        for proc, _ in procs:
            proc.communicate(timeout=60)
            codes.append(proc.returncode)
        said = [read_records(path)[0][-1]["problems"] for _, path in procs]
        locked = ["another helper" in " ".join(problems) for problems in said]
        self.assertEqual(locked, [False, True, True], f"localhost is the same address: {said}")
        self.assertEqual(codes, [0, 3, 3])

    def test_a_run_leaves_no_lock_file_and_the_lock_still_holds(self):
        folder = os.path.join(self.tmp, "locks")
        os.mkdir(folder)
        server = self.start_fake()
        for _ in range(10):
            self.assertEqual(self.run_helper(server, env={"WARMUP_LOCK_DIR": folder}).code, 0)
        self.assertEqual(os.listdir(folder), [], "every run removes its lock file")
        target = transport.parse_base_url(server.url)
        with mock.patch.dict(os.environ, {"WARMUP_LOCK_DIR": folder}):
            first = locks.take_server_lock(target)
            stale = os.open(locks.lock_path(target), os.O_RDWR)   # opened meanwhile
            locks.release_server_lock(first, target)
            fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)   # a lock on a removed file
            second = locks.take_server_lock(target)      # on the new file
            with self.assertRaises(runframe.Fatal) as refused:
                locks.take_server_lock(target)
            self.assertEqual(refused.exception.exit_code, 3, "one helper per server still")
            os.close(stale)
            locks.release_server_lock(second, target)
        self.assertEqual(os.listdir(folder), [])
        spellings = {locks.lock_host(h) for h in ("localhost", "127.0.0.1", "127.1",
                                                         "2130706433", "::ffff:127.0.0.1",
                                                         "0.0.0.0")}
        self.assertEqual(spellings, {"127.0.0.1"}, "one lock for one address, however spelled")
        self.assertEqual({locks.lock_host(h) for h in ("::", "::1", "[::1]", "0:0:0:0:0:0:0:1")},
                         {"::1"})
        self.assertEqual(locks.lock_host("2001:DB8:0:0::1"), "2001:db8::1")
        self.assertEqual(locks.lock_host("Server.Example"), "server.example")

    def test_a_lock_folder_that_cannot_be_used_is_named(self):
        server = self.start_fake()
        result = self.run_helper(server, env={"WARMUP_LOCK_DIR": os.path.join(self.tmp, "no")})
        self.assertEqual(result.code, 2)
        self.assertIn("point WARMUP_LOCK_DIR at a folder", result.summary["problems"][0])
        self.assertEqual(server.state.requests, [])

    def test_an_unhealthy_server_is_refused(self):
        server = self.start_fake(health_delay_s=600)
        result = self.run_helper(server)
        self.assertEqual((result.code, result.summary["verdict"]), (3, "refused"))
        self.assertIn("/health answered HTTP 503", result.summary["problems"][0])
        self.assertEqual(server.state.completions(), [])

    def test_an_unwritable_textfile_is_found_before_anything_is_sent(self):
        server = self.start_fake()
        for textfile, said in ((os.path.join(self.tmp, "no", "x.prom"), "No such file"),
                               (self.records_path, "it is the records file")):
            with self.subTest(said=said):
                result = self.run_helper(server, "--textfile", textfile)
                self.assertEqual(result.code, 2)
                self.assertIn(f"cannot publish to --textfile {textfile}: {said}",
                              result.stderr)
                self.assertEqual(server.state.requests, [])

    def test_waves_carry_wall_clock_times_and_the_drafted_length(self):
        server = self.start_fake(spec_k=5)
        started = time.time()
        result = self.run_helper(server)
        self.assertRegex(result.kind("run")[0]["started_at"], UTC_MS)
        for wave in result.kind("wave"):
            self.assertRegex(wave["released_at"], UTC_MS)
            self.assertLessEqual(wave["released_at"], wave["last_answer_at"])
            self.assertEqual(wave["spec_decode"]["drafted_length"], 5.0)
        self.assertLessEqual(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started - 1)),
                             result.kind("wave")[0]["released_at"])
        held = self.run_argv(["report", self.records_path, "--expect-k", "B1=5,B4=5"],
                             main=qualify.main)
        self.assertEqual(held.code, 0, held.stdout)
        self.assertIn("expect-k B4: drafted length 5, k 5: holds", held.stdout)
        flagged = self.run_argv(["report", self.records_path, "--expect-k", "B1=5,B3=4"],
                                main=qualify.main)
        self.assertEqual(flagged.code, 1)
        self.assertIn("expect-k B3: drafted length 5, k 4: DIFFERS", flagged.stdout)
        self.assertIn("verdict: pass, but --expect-k does not hold (exit 1)", flagged.stdout,
                      "the text never says exit 0 beside an exit 1")

    def test_a_wave_named_twice_is_a_usage_error(self):
        shown = self.run_argv(["report", self.records_path, "--expect-k", "B1=5,B1=1"],
                              main=qualify.main)
        self.assertEqual(shown.code, 2)
        self.assertIn("names B1 twice", shown.stderr)

    def test_without_speculative_counters_k_is_not_observed(self):
        server = self.start_fake(speculative=False)
        self.assertEqual(self.run_helper(server).code, 0)
        shown = self.run_argv(["report", self.records_path, "--expect-k", "B1=5"],
                              main=qualify.main)
        self.assertEqual(shown.code, 1)
        self.assertIn("expect-k B1: drafted length not observed (no speculative counters "
                      "over the wave)", shown.stdout)

    def test_a_wave_with_no_drafts_says_so(self):
        wave = records.typed({"record": "wave", "wave": "B1", "engine": None,
                              "spec_decode": {"drafts": 0.0, "drafted_length": None}})
        (found,) = report.drafted_findings([wave], {"wave": {"B1": 5}})
        self.assertFalse(found["holds"])
        self.assertIn("no drafts over the wave", found["said"])


if __name__ == "__main__":
    unittest.main()
