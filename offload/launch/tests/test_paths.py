"""Request kinds beyond the ten greedy completions (--paths), and a B1 that really chunks."""

from __future__ import annotations

import json
import os

from fake_vllm import TEXT_MARKER
from support import PYTHON, QUALIFY, HelperCase, run_qualify
import core.kinds as kinds  # noqa: E402  (support puts offload/launch on sys.path)


class TestPaths(HelperCase):
    runs_long = 9                         # seconds on a quiet run: run.py starts it early
    def test_every_path_passes_and_is_recorded(self):
        server = self.start_fake(prompt_tokens_details=True, latency_s=0.01)
        result = self.run_helper(server, "--paths", "all",
                                 "--chat-template-kwargs", '{"enable_thinking": false}')
        self.assertEqual(result.code, 0, result.stdout)
        requests = result.requests
        self.assertEqual(len(requests), 10 + 9 * (1 + 4))
        self.assertEqual(result.summary["requests_total"], 55)
        self.assertEqual(result.summary["shape"]["verdict"], "pass")
        run_id = result.kind("run")[0]["run_id"]
        for record in requests:
            if "path" not in record:
                continue
            self.assertEqual(record["request_id"],
                             f"warmup-{run_id}-{record['path']}-{record['depth']}-"
                             f"{record['index']}")
            self.assertEqual(record["wave"], f"{record['path']}-{record['depth']}")
        logprobs = [r for r in requests if r.get("path", "").startswith("logprobs")]
        self.assertTrue(all(r["logprobs_count"] == 32 for r in logprobs))
        structured = [r for r in requests if r.get("path", "").startswith("json")]
        self.assertTrue(all(r["finish_reason"] == "stop" and r["completion_tokens"] < 32
                            for r in structured))
        sent = [r["body"] for r in server.state.requests if isinstance(r["body"], dict)
                and "chat" in str(r["body"].get("request_id", ""))]
        self.assertTrue(sent and all(b["chat_template_kwargs"] == {"enable_thinking": False}
                                     for b in sent))
        waves = [w for w in result.kind("wave") if "path" in w]
        self.assertEqual(len(waves), 18)
        bodies = {kind: next(b for b in (r["body"] for r in server.state.requests
                                         if isinstance(r["body"], dict))
                             if f"-{kind}-1-" in str(b.get("request_id")))
                  for kind in ("sampled", "sampled-unseeded", "sampled-temperature")}
        self.assertEqual((bodies["sampled"]["seed"], bodies["sampled"]["top_p"]), (7, 0.95))
        self.assertNotIn("seed", bodies["sampled-unseeded"])
        self.assertEqual(bodies["sampled-unseeded"]["top_k"], 40)
        self.assertFalse({"seed", "top_p", "top_k"} & set(bodies["sampled-temperature"]))
        self.assertEqual(bodies["sampled-temperature"]["temperature"], 0.8)
        prompt_logprobs = [r["body"] for r in server.state.requests
                           if isinstance(r["body"], dict) and "prompt_logprobs" in r["body"]]
        self.assertTrue(prompt_logprobs and all(b["prompt_logprobs"] == 5
                                                for b in prompt_logprobs))
        self.assertLess(result.summary["elapsed_s"], 90)
        self.assert_clean(server, result)
        self.assertNotIn(TEXT_MARKER, result.records_text, "logprobs are counted, never kept")

    def test_the_report_finds_the_evidence_of_every_path_on_every_engine(self):
        # Extras are a shape test of their own: all answered well, never a pass (54).
        server = self.start_fake(engines=2)
        ready = os.path.join(self.tmp, "ready")
        result = self.run_helper(server, "--paths", "logprobs,json", "--ready-file", ready)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(result.summary["verdict"], "custom")
        self.assertIn("pass, custom plan", result.stdout)
        self.assertFalse(os.path.exists(ready), "extras never yield a ready file")
        self.assertEqual(result.summary["requests_total"], 2 * (10 + 4 * 5))
        plan = result.kind("run")[0]["plan"]
        self.assertEqual((plan["requests_per_engine"], plan["requests_total"]), (30, 60))
        shown = run_qualify("report", self.records_path, "--json")
        doc = json.loads(shown.stdout)
        self.assertEqual((shown.returncode, doc["verdict"], doc["evidence"]),
                         (1, "custom", "complete"))

    def test_without_paths_the_ten_requests_are_unchanged(self):
        server = self.start_fake()
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(len(result.requests), 10)
        for record in result.requests + result.kind("wave"):
            self.assertNotIn("path", record)
        self.assertNotIn("shape", result.summary)
        self.assertEqual({e["body"].get("stream") for e in server.state.completions()}, {False})

    def test_a_path_the_server_lacks_fails_its_own_verdict_by_name(self):
        # The shape test has a verdict of its own: the waves passed (custom), it failed (54).
        server = self.start_fake(lack_paths=("json",))
        result = self.run_helper(server, "--paths", "json,logprobs")
        self.assertEqual(result.code, 1, result.stdout)
        summary = result.summary
        self.assertEqual((summary["verdict"], summary["problems"]), ("custom", []))
        self.assertEqual(summary["parts"], [["plan", 10, 10]])
        shape = summary["shape"]
        self.assertEqual((shape["verdict"], shape["requests_ok"], shape["requests_total"]),
                         ("fail", 10, 20))
        self.assertEqual(shape["parts"], [["logprobs", 10, 10], ["json", 0, 10]])
        self.assertRegex(shape["problems"][0], r"json rejected: HTTP 400: The structured "
                                               r"output backend")
        problems = " ".join(shape["problems"])
        self.assertIn("json-schema rejected", problems)
        self.assertRegex(problems, r"\d+ requests \(json-1#0")
        self.assertIn("shape test, never part of a pass: fail, logprobs 10/10, json 0/10",
                      result.stdout)
        shown = run_qualify("report", self.records_path)
        self.assertEqual(shown.returncode, 1, shown.stdout)
        self.assertIn("shape test, never part of a pass: fail, logprobs 10/10, json 0/10",
                      shown.stdout)
        self.assertIn("verdict: custom plan", shown.stdout)
        self.assert_clean(server, result)

    def test_a_shape_verdict_the_records_do_not_show_is_incomplete(self):
        server = self.start_fake(lack_paths=("json",))
        self.run_helper(server, "--paths", "json")
        lines = open(self.records_path).read().splitlines()
        summary = json.loads(lines[-1])
        summary["shape"]["verdict"], summary["exit_code"] = "pass", 0
        with open(self.records_path, "w") as out:
            out.write("\n".join(lines[:-1] + [json.dumps(summary)]) + "\n")
        shown = run_qualify("report", self.records_path, "--json")
        doc = json.loads(shown.stdout)
        run = doc["runs"][-1]
        self.assertEqual((shown.returncode, doc["verdict"], run["shape"]["verdict"]),
                         (1, "incomplete", "fail"))
        self.assertIn("the summary says the shape test's verdict is pass; its records show "
                      "fail", run["evidence_problems"])

    def test_a_bad_path_is_a_usage_error_naming_its_source(self):
        for argv, env, source in ((["--paths", "nope"], {}, "--paths"),
                                  ([], {"WARMUP_PATHS": "nope"}, "WARMUP_PATHS")):
            with self.subTest(source):
                result = self.run_helper("http://127.0.0.1:9", "--dry-run", *argv, env=env)
                self.assertEqual(result.code, 2)
                self.assertIn(f"{source}: unknown path 'nope'", result.stderr)

    def test_every_program_reads_warmup_paths(self):
        qualify_main = __import__("qualify").main
        for name, argv in (("warm-up", ["--dry-run"]), ("probe", ["probe", "--dry-run"])):
            with self.subTest(name):
                main = qualify_main if argv[0] == "probe" else None
                shown = self.run_argv(argv, env={"WARMUP_PATHS": "stream"}, main=main)
                self.assertEqual(shown.code, 0, shown.stderr)
                self.assertIn("stream", shown.stdout)
                bad = self.run_argv(argv, env={"WARMUP_PATHS": "nope"}, main=main)
                self.assertEqual(bad.code, 2)
                self.assertIn("WARMUP_PATHS: unknown path 'nope'", bad.stderr)
                given = self.run_argv([*argv, "--paths", "none"], env={"WARMUP_PATHS": "nope"},
                                      main=main)
                self.assertEqual(given.code, 0, "the flag wins over the variable")

    def test_the_probe_finds_a_cold_path_and_the_warm_up_removes_it(self):
        cold = self.start_fake(cold_s=0.5, cold_paths=("logprobs",), latency_s=0.02)
        probe = self.run_argv(["probe", "--base-url", cold.url, "--records", self.records_path,
                               "--rounds", "2", "--paths", "logprobs"], main=__import__(
                                   "qualify").main)
        self.assertEqual(probe.code, 0, probe.stdout)
        items = {e["item"]: e for e in probe.kind("probe_summary")[0]["items"]}
        self.assertGreater(items["logprobs"]["total_first_s"], 0.45, "cold: 0.5 s more")
        warmed = self.start_fake(cold_s=0.5, cold_paths=("logprobs",), latency_s=0.02)
        os.remove(self.records_path)
        self.assertEqual(self.run_helper(warmed, "--paths", "logprobs").code, 0)
        os.remove(self.records_path)
        served = len(warmed.state.completions())
        after = self.run_argv(["probe", "--base-url", warmed.url, "--records",
                               self.records_path, "--rounds", "2", "--paths", "logprobs"],
                              main=__import__("qualify").main)
        self.assertEqual(after.code, 0, after.stdout)
        probed = warmed.state.completions()[served:]
        self.assertEqual([e.get("cold_s") for e in probed], [0.0] * len(probed),
                         "warmed: no request of the probe paid the cold cost")

    def test_structured_output_is_held_to_its_own_rule(self):
        kind = kinds.KINDS["json-schema"]
        ok = {"http_status": 200, "body_error": None, "n_choices": 1, "usage": True,
              "completion_tokens": 9, "finish_reason": "stop", "stop_reason": None}
        self.assertEqual(kinds.judge(ok, kind, 32), [])
        empty = dict(ok, completion_tokens=0)
        self.assertIn("expected 1 to 32", kinds.judge(empty, kind, 32)[0])
        plain = kinds.KINDS["sampled"]
        self.assertIn("completion_tokens 9, expected 32", kinds.judge(ok, plain, 32))
        lp = kinds.KINDS["logprobs"]
        full = dict(ok, completion_tokens=32, finish_reason="length", logprobs_count=None)
        self.assertEqual(kinds.judge(full, lp, 32),
                         ["no log-probabilities in the answer"])


class TestChunk(HelperCase):
    def test_b1_is_longer_than_the_prefill_chunk(self):
        server = self.start_fake(max_model_len=8192)
        result = self.run_helper(server, "--chunk-tokens", "6000")
        self.assertEqual(result.code, 0, result.stdout)
        b1 = result.requests[0]
        self.assertGreater(b1["prompt_tokens"], 6000)
        self.assertLessEqual(b1["prompt_tokens"] + 32, 8192)
        plan = result.kind("run")[0]["plan"]
        self.assertEqual((plan["chunk_tokens"], plan["b1_min_prompt_tokens"]), (6000, 6001))

    def test_a_context_that_holds_no_longer_b1_passes_in_one_step_said(self):
        server = self.start_fake(max_model_len=6020, max_num_batched_tokens=6000)
        result = self.run_helper(server, env={"WARMUP_CHUNK_TOKENS": "6000"})
        self.assertEqual(result.code, 0, result.stdout)
        said = ("B1 in one prefill step: this server's context (6020) holds no prompt 16 "
                "tokens longer than its chunk (6000) beside 32 completion tokens")
        self.assertIn(said, result.stdout.splitlines()[0])
        self.assertIn(said, result.summary["notes"])
        self.assertIn("PASS (exit 0): contract 10/10", result.stdout)
        self.assertTrue(5988 - 5988 // 8 <= result.kind("request")[0]["prompt_tokens"] <= 5988)
        plan = result.kind("run")[0]["plan"]
        self.assertEqual((plan["b1_one_step"], plan["b1_context_tokens"]), (True, 6020))
        report = self.run_process([*PYTHON, QUALIFY, "report", self.records_path])
        self.assertEqual(report.code, 0, report.stdout)
        self.assertEqual(report.stdout.count(f"note: {said}"), 1, report.stdout)


