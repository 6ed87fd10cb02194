"""qualify.py's runs against the fake: the warm-up's counter and status-file deltas as
the report shows them, and `probe` (first round against later, never a cache hit)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
import unittest

from support import PYTHON, QUALIFY, HelperCase, qualify
import core.evidence as evidence  # noqa: E402  (support puts offload/launch on sys.path)
import core.runframe as runframe  # noqa: E402
import core.transport as transport  # noqa: E402
import core.vllm_client as vllm_client  # noqa: E402


class StatusWriter:
    """Rewrites a JSON status file on a timer, like a worker's; stopped at cleanup."""

    def __init__(self, path: str, period_s: float = 0.1, stamp: bool = True):
        self.path, self.period_s, self.stamp = path, period_s, stamp
        self.doc = {"pid": 100, "session": "s1", "steps": 0, "proxy": {"rounds": 0}}
        if stamp:
            self.doc["timestamp"] = "2026-12-03T00:00:00.000Z"
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopped.wait(self.period_s):
            self.doc["steps"] += 3
            self.doc["proxy"]["rounds"] += 1
            if self.stamp == "frozen":          # rewritten, its own timestamp unchanged
                pass
            elif self.stamp:
                self.doc["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + \
                    f".{int(time.time() * 1000) % 1000:03d}Z"
            tmp = self.path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(self.doc, handle)
            os.replace(tmp, self.path)

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=5)


class TestQualificationRuns(HelperCase):
    runs_long = 17                        # seconds on a quiet run: run.py starts it early
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

    def proxied(self, reset: bool = False):
        """The server, and a second fake playing the proxy in front of it: the proxy's
        proxy:requests_total counts every completion the server gets, and one more (a
        foreign request) while B3 runs; with `reset`, it drops back by 100 during B2."""
        server, proxy = self.start_fake(latency_s=0.02), self.start_fake()
        logged, foreign = server.state.log, []
        proxy.state.count("proxy:requests_total", 100 if reset else 0)   # from the start

        def log(entry):
            logged(entry)
            body = entry["body"] if isinstance(entry["body"], dict) else {}
            if entry["path"].endswith("/v1/completions"):
                proxy.state.count("proxy:requests_total", 1)
                if "-B3-" in str(body.get("request_id")) and not foreign:
                    foreign.append(proxy.state.count("proxy:requests_total", 1))
                if reset and "-B2-0" in str(body.get("request_id")):
                    proxy.state.count("proxy:requests_total", -100)
        server.state.log = log
        return server, proxy

    def test_foreign_work_on_an_operators_counter_is_named_with_its_wave(self):
        server, proxy = self.proxied()
        counter = f"{proxy.url}/metrics=proxy:requests_total"
        result = self.run_helper(server, "--metrics-counter", counter,
                                 "--foreign-work", "evidence")
        self.assertEqual(result.code, 0, result.stdout)         # evidence, asked for
        (counted,) = [m["counted"] for m in result.kind("metrics") if "counted" in m]
        self.assertEqual((counted["delta"], counted["sent"], counted["foreign"],
                          counted["overlaps"]), (11.0, 10, 1.0, ["B3"]))
        self.assertEqual(result.kind("run")[0]["plan"]["foreign_work"], "evidence")
        self.assertIn(f"foreign work on {proxy.url}/metrics: proxy:requests_total counted 11 "
                      f"requests, the warm-up sent 10: 1 more (during B3)",
                      result.summary["warnings"])
        shown = self.run_argv(["report", self.records_path], main=qualify.main)
        self.assertEqual(shown.code, 0)
        self.assertRegex(shown.stdout, r"(?m)^B3 .*ok  foreign work on " + proxy.url)
        self.assertNotRegex(shown.stdout, r"(?m)^B[124] .*foreign work")
        self.assertIn("proxy:requests_total: counted 11 requests, the warm-up sent 10: "
                      "FOREIGN WORK: 1 more (during B3)", shown.stdout)
        os.remove(self.records_path)
        server, proxy = self.proxied()           # the default: foreign work is no pass
        strict = self.run_helper(server, "--metrics-counter",
                                 f"{proxy.url}/metrics=proxy:requests_total")
        self.assertEqual(strict.code, 1, strict.stdout)
        self.assertEqual(strict.kind("run")[0]["plan"]["foreign_work"], "fail")
        self.assertIn(f"foreign work on {proxy.url}/metrics: proxy:requests_total counted 1 "
                      f"more than the warm-up sent (--foreign-work evidence keeps it as "
                      f"evidence)", strict.summary["problems"])
        self.assertEqual(self.run_argv(["report", self.records_path], main=qualify.main).code, 1)
        # The same through the environment, as start.sh passes WARMUP_* on.
        os.remove(self.records_path)
        server, proxy = self.proxied()
        strict = self.run_helper(server, env={
            "WARMUP_METRICS_COUNTER": f"{proxy.url}/metrics=proxy:requests_total",
            "WARMUP_FOREIGN_WORK": "fail"})
        self.assertEqual(strict.code, 1, strict.stdout)
        self.assertIn("WARMUP_FOREIGN_WORK=fail", strict.stdout.splitlines()[0])
        # A counter that went down (a proxy restarted) cannot be compared: no pass.
        os.remove(self.records_path)
        server, proxy = self.proxied(reset=True)
        reset = self.run_helper(server, "--metrics-counter",
                                f"{proxy.url}/metrics=proxy:requests_total")
        self.assertEqual(reset.code, 1, reset.stdout)
        self.assertIn("proxy:requests_total on " + proxy.url + "/metrics could not be compared",
                      " ".join(reset.summary["problems"]))
        self.assertIn("went down during the warm-up", " ".join(reset.summary["warnings"]))

    def test_a_counter_on_the_server_s_own_metrics_is_one_record(self):
        # The server's /metrics named as an operator's counter: one metrics record (the
        # main one, with the counter's comparison), one warning, not each twice.
        server = self.start_fake()
        result = self.run_helper(server, "--metrics-counter",
                                 f"{server.url}/metrics=vllm:request_success_total")
        self.assertEqual(result.code, 0, result.stdout)
        (record,) = result.kind("metrics")
        self.assertEqual(record["source"], f"{server.url}/metrics")
        self.assertEqual((record["counted"]["delta"], record["counted"]["sent"]), (10.0, 10))
        self.assertEqual(len(result.summary["warnings"]), len(set(result.summary["warnings"])))
        # Two counters on one endpoint would share its one record: refused, nothing sent.
        twice = self.run_helper(server, "--metrics-counter", f"{server.url}/metrics=a",
                                "--metrics-counter", f"{server.url}/metrics=b")
        self.assertEqual(twice.code, 2, twice.stderr)
        self.assertIn("one counter per endpoint", twice.stderr)

    def test_a_counter_is_compared_series_by_series_and_never_through_nan(self):
        # One series resets (a worker restarted) while another counts the foreign request:
        # their sum would cancel out; series by series, the reset is seen and nothing passes.
        # A counter that reads NaN or +Inf is "not compared", said, never a TypeError.
        for case in ("reset one series", "nan", "inf"):
            with self.subTest(case=case):
                if os.path.exists(self.records_path):
                    os.remove(self.records_path)
                server, proxy = self.proxied()
                if case == "reset one series":
                    proxy.state.count("proxy:requests_total", 5, worker="b")
                    logged = server.state.log

                    def log(entry, logged=logged, proxy=proxy):
                        logged(entry)
                        if "-B2-0" in str(entry.get("body", {}).get("request_id")
                                          if isinstance(entry.get("body"), dict) else ""):
                            proxy.state.count("proxy:requests_total", -5, worker="b")
                    server.state.log = log
                else:
                    proxy.state.count("proxy:requests_total", float(case), worker="c")
                result = self.run_helper(server, "--metrics-counter",
                                         f"{proxy.url}/metrics=proxy:requests_total")
                self.assertEqual(result.code, 1, result.stdout)
                self.assertNotIn("internal error", result.stdout + result.stderr)
                (counted,) = [m["counted"] for m in result.kind("metrics") if "counted" in m]
                self.assertIsNone(counted["foreign"])
                self.assertIn("went down" if case == "reset one series" else "NaN",
                              counted["why"])
                self.assertIn("could not be compared", " ".join(result.summary["problems"]))

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
        self.assertEqual(status["fresh_by"], "its timestamp field")
        shown = self.run_argv(["report", self.records_path], main=qualify.main)
        self.assertIn(f"status file {path}: valid (fresh by its timestamp field); deltas: ",
                      shown.stdout)
        self.assertIn(f"steps {status['delta']['steps']}", shown.stdout,
                      "the runbook reads the deltas in the report")

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

    def test_freshness_is_the_files_own_timestamp_mtime_only_without_one(self):
        server = self.start_fake(latency_s=0.02)
        for stamp, state, fresh_by in (("frozen", "incomplete", None),
                                       (False, "valid", "modification time (no timestamp "
                                                        "field)")):
            with self.subTest(stamp=stamp):
                path = os.path.join(self.tmp, f"status-{stamp}.json")
                writer = StatusWriter(path, stamp=stamp)
                self.addCleanup(writer.stop)
                if os.path.exists(self.records_path):
                    os.remove(self.records_path)
                result = self.run_helper(server, "--status-file", path, "--status-wait-s", "0.8")
                (status,) = result.kind("status")
                self.assertEqual((status["state"], status["fresh_by"]), (state, fresh_by),
                                 status)
                if stamp == "frozen":
                    self.assertIn("stale: no fresh timestamp", status["why"],
                                  "its mtime moved, its timestamp did not: not fresh")

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
        return subprocess.run([*PYTHON, QUALIFY, "report", *args], capture_output=True,
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
        warmed = self.start_fake(cold_s=0.5, latency_s=0.1)   # a batch overlaps under load
        os.remove(self.records_path)
        self.assertEqual(self.run_helper(warmed).code, 0)
        os.remove(self.records_path)
        served = len(warmed.state.completions())
        after = self.run_probe(warmed, "--rounds", "2")
        self.assertEqual(after.code, 0)
        probed = warmed.state.completions()[served:]
        self.assertEqual([e.get("cold_s") for e in probed], [0.0] * len(probed),
                         "after the warm-up no probe request paid a first-use cost")

    def test_probe_counts_an_operator_counter_per_round(self):
        # 54 (the note's step 5): a worker's counters per round, the first against later.
        server = self.start_fake()
        counter = f"{server.url}/metrics=vllm:request_success_total"
        result = self.run_probe(server, "--rounds", "3", "--metrics-counter", counter)
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        (summary,) = result.kind("probe_summary")
        seen = summary["counters"][f"{server.url}/metrics"]
        self.assertEqual((seen["counter"], seen["rounds"], seen["first"], seen["later_median"]),
                         ("vllm:request_success_total", [8, 8, 8], 8, 8))
        self.assertIn("counter vllm:request_success_total at", result.stdout)
        bad = self.run_probe(server, "--metrics-counter", "no-name")
        self.assertEqual(bad.code, 2)
        self.assertIn("--metrics-counter", bad.stderr)

    def test_probe_reads_a_status_file_fresh_around_each_round(self):
        # A worker's status file, rewritten on a timer with its rounds counted: each
        # round's delta, the first against the later ones.
        import threading
        server = self.start_fake()
        path = os.path.join(self.tmp, "worker.json")
        stop = threading.Event()

        def writer():
            steps = 0
            while not stop.is_set():
                steps += 1 + len(server.state.completions())
                with open(path + ".tmp", "w") as handle:
                    json.dump({"pid": 7, "timestamp": time.time(), "steps": steps,
                               "served": len(server.state.completions())}, handle)
                os.replace(path + ".tmp", path)
                stop.wait(0.2)
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        self.addCleanup(thread.join, 5)
        self.addCleanup(stop.set)
        time.sleep(0.5)
        result = self.run_probe(server, "--rounds", "3", "--status-file", path,
                                "--status-wait-s", "5")
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        seen = result.kind("probe_summary")[0]["status"][path]
        self.assertEqual(seen["states"], ["valid"] * 3)
        self.assertEqual(seen["moved"]["served"], {"first": 8, "later_median": 8})
        self.assertGreater(seen["moved"]["steps"]["first"], 0)
        self.assertIn(f"status {path} (valid, valid, valid)", result.stdout)

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

    def test_the_long_item_is_streamed_its_ttft_the_prefill(self):
        server = self.start_fake(latency_s=0.02, max_model_len=8192)
        result = self.run_probe(server, "--long-tokens", "8160")
        self.assertEqual(result.code, 0, result.stdout)
        long = [r for r in result.kind("probe") if r["item"] == "long"]
        self.assertEqual(len(long), 3)
        self.assertTrue(all(isinstance(r["ttft_s"], float) for r in long), long)
        self.assertTrue(all(r["request_kind"] == "stream" for r in long))
        bodies = [e["body"] for e in server.state.completions() if "-long-" in
                  e["body"]["request_id"]]
        self.assertTrue(all(b["stream"] is True for b in bodies))
        self.assertRegex(result.stdout, r"long +TTFT first \d+ ms vs later \d+ ms")
        shown = self.run_argv(["report", self.records_path], main=qualify.main)
        self.assertRegex(shown.stdout, r"long +TTFT first \d+ ms vs later \d+ ms")
        os.remove(self.records_path)
        past = self.run_probe(server, "--long-tokens", "32768")
        self.assertEqual(past.code, 2)
        self.assertIn("--long-tokens 32768 does not fit the server's context: max_model_len "
                      "8192 leaves room for 8160 prompt tokens", past.stdout)
        self.assertEqual(len(server.state.completions()), 3 * 9, "the refused run sent nothing")

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


class TestOneOptionGrammar(unittest.TestCase):
    """Every program refuses an abbreviated option (exit 2), naming the one it did not
    know: start.sh, the warm-up and every qualify.py command alike."""

    def test_an_abbreviated_option_is_a_usage_error_everywhere(self):
        from support import START, run_main
        import warmup
        cases = [((warmup.main, "--chunk", "4096", "--dry-run"), "--chunk"),
                 ((qualify.main, "report", "--jso", "x.jsonl"), "--jso"),
                 ((qualify.main, "probe", "--round", "2", "--dry-run"), "--round"),
                 ((qualify.main, "gate", "--max-tok", "9", "--dry-run"), "--max-tok"),
                 ((qualify.main, "ready", "--ready", "f"), "--ready"),
                 ((qualify.main, "health", "--time", "1"), "--time")]
        answers = [(argv[:2], run_main(main, *argv), option) for (main, *argv), option in cases]
        answers.append((["start.sh"], subprocess.run(["bash", START, "--supe", "--", "true"],
                                                     capture_output=True, text=True,
                                                     timeout=30, stdin=subprocess.DEVNULL),
                        "--supe"))
        for program, proc, option in answers:
            with self.subTest(program=program):
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn(option, proc.stderr)
                self.assertNotIn("Traceback", proc.stderr)

    def test_a_number_is_ascii_digits_and_one_point_everywhere(self):
        # int() and float() take these too; no option means them.
        from support import run_main
        import warmup
        cases = [(["--tokens", "3_2"], {}), (["--deadline-s", "1e3"], {}),
                 (["--settle-s", "nan"], {}), (["--tokens", " 32"], {}),
                 ([], {"WARMUP_TOKENS": "\u0663\u0662"}),           # Arabic-Indic 32
                 ([], {"WARMUP_PRIORITY": "2\u0660"})]
        for args, env in cases:
            with self.subTest(args=args, env=env):
                proc = run_main(warmup.main, "--dry-run", *args, env=env)
                self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
                self.assertNotIn("Traceback", proc.stderr)
        lower = run_main(warmup.main, "--dry-run", "--priority", "-5")
        self.assertEqual(lower.returncode, 0, lower.stderr)     # a priority may be negative
        probe = run_main(qualify.main, "probe", "--rounds", "\u0662", "--dry-run")
        self.assertEqual(probe.returncode, 2, probe.stdout + probe.stderr)
