"""Tests of the warm-up helper: pure decisions called directly, runs against the fake server.

Run: python3 -m unittest discover -s offload/launch/tests -v   (or pytest)
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import unittest
from unittest import mock

from support import PYTHON, API_KEY, REPO, WARMUP, WRAPPER, HelperCase, read_records, warmup
import core.runframe as runframe  # noqa: E402  (support puts offload/launch on sys.path)
import core.transport as transport  # noqa: E402  (support puts offload/launch on sys.path)
import core.sanitize as sanitizing  # noqa: E402
import core.prometheus as prometheus  # noqa: E402
import core.contract as contract  # noqa: E402  (support puts offload/launch on sys.path)
import core.kinds as kinds  # noqa: E402
import core.records as records  # noqa: E402
import core.prompts as prompts  # noqa: E402
import core.vllm_client as vllm_client  # noqa: E402
import core.vllm_metrics as vllm_metrics  # noqa: E402
from fake_vllm import tokenize

GOOD = {"http_status": 200, "body_error": None, "error": None, "error_param": None,
        "n_choices": 1, "usage": True, "prompt_tokens": 5000, "cached_tokens": 0,
        "completion_tokens": 32, "reasoning_tokens": None, "finish_reason": "length",
        "stop_reason": None, "metrics": None, "speculative_decoding": None}


def fields(**changes) -> dict:
    return dict(GOOD, **changes)


class TestPlan(unittest.TestCase):
    def test_waves_parse_and_reject(self):
        self.assertEqual(warmup.parse_waves("1,2,3,4,6,8"), (1, 2, 3, 4, 6, 8))
        for bad in ("2,1", "1,1,2", "1,x", "", "1,0", "1,-2"):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                warmup.parse_waves(bad)

    def test_bad_waves_is_a_usage_error(self):
        with mock.patch("sys.stderr") as err:
            self.assertEqual(warmup.main(["--waves", "2,3", "--dry-run"]), 2)
        said = "".join(call.args[0] for call in err.write.call_args_list)
        self.assertIn("argument --waves: must start with 1", said)

    def test_completion_body_has_exactly_the_sampling_fields(self):
        body = kinds.completion_body("m", "p", "warmup-r-B1-0", tokens=32, priority=20)
        self.assertEqual(body, {"model": "m", "prompt": "p", "max_tokens": 32, "min_tokens": 32,
                                "ignore_eos": True, "temperature": 0, "priority": 20,
                                "stream": False, "request_id": "warmup-r-B1-0"})

    def test_long_prompts_start_with_their_nonce_and_short_prompts_differ(self):
        a = prompts.make_long_prompt("nonce-a", 50)
        b = prompts.make_long_prompt("nonce-b", 50)
        self.assertTrue(a.startswith("nonce-a ") and b.startswith("nonce-b "))
        shorts = {prompts.make_short_prompt("run", d, i) for d in (2, 3, 4) for i in range(d)}
        self.assertEqual(len(shorts), 9)
        self.assertEqual(len({s.split()[0] for s in shorts}), 9, "first words must differ")

    def test_sizing_uses_the_count_and_stays_under_budget(self):
        calls = []

        def count(prompt):
            calls.append(prompt)
            return len(tokenize(prompt))       # about 1.6 tokens a word, not 1

        prompt, counted = prompts.size_long_prompt(count, "nonce", 5000)
        self.assertEqual(counted, len(tokenize(prompt)))
        self.assertTrue(0.97 * 5000 <= counted <= 5000, counted)
        self.assertLessEqual(len(calls), 6)

    def test_sizing_finds_a_narrow_window_past_the_chunk(self):
        # Context 4133, chunk 4096: B1 must land in 4097..4101 tokens.
        prompt, counted = prompts.size_long_prompt(lambda p: len(tokenize(p)), "nonce", 4101,
                                                   4097)
        self.assertTrue(4097 <= counted <= 4101, counted)

    def test_sizing_without_a_count_estimates(self):
        prompt, counted = prompts.size_long_prompt(lambda p: None, "nonce", 5000)
        self.assertIsNone(counted)
        self.assertGreaterEqual(len(prompt.split()), 5000)

    def test_budget_leaves_room_for_the_completion(self):
        self.assertEqual(prompts.long_prompt_budget(5000, 32, 4096, None), (5000, 4097))
        self.assertEqual(prompts.long_prompt_budget(5000, 32, 4096, 5010), (4978, 4097))
        self.assertEqual(prompts.long_prompt_budget(5000, 32, 2048, 4096), (4064, 3556))
        with self.assertRaises(runframe.Fatal) as cm:
            prompts.long_prompt_budget(5000, 32, 4096, 1055)
        self.assertIn("context too small", cm.exception.problem)

    def test_a_context_no_longer_than_the_chunk_holds_b1_in_one_step(self):
        self.assertEqual(prompts.b1_bounds(9216, 32, 8192, 8192), (8160, 7140, True))
        self.assertEqual(prompts.b1_bounds(5000, 32, 4096, 4128), (4096, 3584, True))
        self.assertEqual(prompts.b1_bounds(5000, 32, 4096, 4129), (4096, 3584, True))
        self.assertEqual(prompts.b1_bounds(5000, 32, 4096, 4144), (4112, 4097, False))
        self.assertEqual(prompts.b1_bounds(5000, 32, 512, None), (5000, 4097, False),
                         "a small chunk never lowers a 5,000-token B1's floor under 4097")
        self.assertEqual(prompts.long_prompt_budget(5000, 32, 4096, 1056), (1024, 896))


class TestGuard(unittest.TestCase):
    TEXT = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m \\"x\\" \\\\ y"} 0.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 0.0 1700000000000',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0',
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 5.0',
        "vllm:gpu_cache_usage_perc NaN",
        "vllm:something +Inf",
        "not a sample line {",
        "",
    ])

    def test_parse_labels_escapes_timestamps_and_special_values(self):
        exposition = prometheus.parse_prometheus(self.TEXT)
        samples = exposition.samples
        self.assertEqual([number for number, _, _ in exposition.bad_lines], [9])
        by_name = {}
        for name, labels, value in samples:
            by_name.setdefault(name, []).append((labels, value))
        self.assertEqual(by_name["vllm:num_requests_running"][0][0]["model_name"], 'm "x" \\ y')
        self.assertEqual(len(by_name["vllm:num_requests_running"]), 2)
        self.assertTrue(math.isnan(by_name["vllm:gpu_cache_usage_perc"][0][1]))
        self.assertEqual(by_name["vllm:something"][0][1], math.inf)

    def test_the_samplers_quick_read_keeps_exactly_the_lines_naming_a_gauge(self):
        pieces = [*vllm_metrics.GAUGES, "vllm:num_requests_runn", "x 1", "\n", "\n", "\r",
                  " ", '{engine="0"} 2', "\u2028", "process_start_time_seconds"]
        rng = random.Random(43)
        for names in (vllm_metrics.GAUGES, ("vllm:num_requests_", "process_start_time_seconds",
                                            "x"), ("",)):      # "": every line, and it ends
            for _ in range(1500):
                text = "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
                by_line = "\n".join(line for line in text.split("\n")
                                    if any(name in line for name in names))
                self.assertEqual(vllm_metrics.lines_naming(text, names), by_line,
                                 repr((text, names)))
        busy = self.TEXT + 'vllm:filler_total{n="1"} 1.0\n' * 5000 + \
            'vllm:num_requests_waiting{engine="1"} 3'
        self.assertEqual(vllm_metrics.lines_naming(busy, vllm_metrics.GAUGES).split("\n"),
                         self.TEXT.split("\n")[:6] + ['vllm:num_requests_waiting{engine="1"} 3'])

    def test_by_reason_gauge_is_not_the_waiting_gauge(self):
        self.assertEqual(vllm_client.guard_problems(prometheus.parse_prometheus(self.TEXT)), ([], []))

    def test_any_engine_busy_or_nan_refuses(self):
        text = self.TEXT.replace('engine="1",model_name="m"} 0.0', 'engine="1",model_name="m"} 2.0')
        problems, _ = vllm_client.guard_problems(prometheus.parse_prometheus(text))
        self.assertEqual(len(problems), 1)
        self.assertIn('vllm:num_requests_running{engine="1",model_name="m"} = 2.0', problems[0])
        nan = prometheus.parse_prometheus('vllm:num_requests_running 0\nvllm:num_requests_waiting NaN')
        self.assertIn("vllm:num_requests_waiting = nan", vllm_client.guard_problems(nan)[0][0])

    def test_a_sleeping_engine_refuses_by_name(self):
        def text(*states):
            lines = ["vllm:num_requests_running 0", "vllm:num_requests_waiting 0"]
            for engine, awake, offloaded, discarded in states:
                for state, value in (("awake", awake), ("weights_offloaded", offloaded),
                                     ("discard_all", discarded)):
                    lines.append(f'vllm:engine_sleep_state{{engine="{engine}",model_name="m",'
                                 f'sleep_state="{state}"}} {value}')
            return prometheus.parse_prometheus("\n".join(lines)).samples
        states = vllm_metrics.sleep_states
        self.assertEqual(states(text((0, 1, 0, 0), (1, 0, 1, 0))),
                         {"0": "awake", "1": "weights offloaded"})
        self.assertEqual(states(text((0, 0, 0, 1))), {"0": "weights and KV cache discarded"})
        self.assertEqual(states(text((0, 0, 0, 0))), {"0": "asleep"}, "level 0: neither set")
        self.assertEqual(states(text((0, 0.5, 0, 0))), {"0": "asleep"}, "fails closed")
        self.assertEqual(states(text()), {}, "no gauge: judged as before")
        self.assertEqual(states(text((0, 1, 0, 0), (1, 0, 1, 0)), engines=(0,)), {"0": "awake"})
        self.assertEqual(states(text((0, 1, 0, 1))), {"0": "weights and KV cache discarded"},
                         "awake and a level at once is not awake")
        self.assertEqual(states(text((0, 1, 0, 0), (0, 0, 0, 0))), {"0": "asleep"},
                         "two awake samples of one engine must both say awake")
        self.assertEqual(states(text((0, 1, 0, 0)), engines=(0, 1)),
                         {"0": "awake", "1": "sleep state not published"})
        # The engine label read by the one rule (engine_index): "01" is engine 1, as the
        # guard reads it; a label that is no index keeps its own name, and is judged too.
        self.assertEqual(states(text(("01", 0, 1, 0)), engines=(1,)), {"1": "weights offloaded"})
        self.assertEqual(states(text(("x", 0, 1, 0), (0, 1, 0, 0))),
                         {"0": "awake", "x": "weights offloaded"})

        def problem(*states, engines=None, extra=""):
            lines = [f'vllm:engine_sleep_state{{engine="{e}",sleep_state="{s}"}} {v}'
                     for e, a, o, d in states for s, v in (("awake", a),
                                                           ("weights_offloaded", o),
                                                           ("discard_all", d))]
            return vllm_metrics.asleep_problem(
                prometheus.parse_prometheus("\n".join(lines + [extra])), engines)
        self.assertEqual(problem((0, 0, 1, 0), (1, 0, 1, 0)),
                         "engine 0 is asleep (weights offloaded); engine 1 is asleep "
                         "(weights offloaded)")
        self.assertIsNone(problem((0, 1, 0, 0)))
        self.assertIn("cannot be read exactly", problem(
            (0, 1, 0, 0), extra='vllm:engine_sleep_state{engine="1",sleep_state="awake"} 1 '
                                '1700000000.5'))
        self.assertEqual(problem((0, 1, 0, 0), engines=(0, 1)),
                         "engine 1 has no sleep state sample (it cannot be told awake)")
        problems, _ = vllm_client.guard_problems(prometheus.parse_prometheus("\n".join([
            "vllm:num_requests_running 0", "vllm:num_requests_waiting 0",
            'vllm:engine_sleep_state{engine="0",sleep_state="awake"} 0.0',
            'vllm:engine_sleep_state{engine="0",sleep_state="discard_all"} 1.0'])))
        self.assertEqual(problems, ["engine 0 is asleep (weights and KV cache discarded): wake "
                                    "it (POST /wake_up), then run the warm-up again"])

    def test_missing_gauge_is_named(self):
        problems, _ = vllm_client.guard_problems(prometheus.parse_prometheus("vllm:num_requests_running 0"))
        self.assertEqual(len(problems), 1)
        self.assertIn("vllm:num_requests_waiting missing", problems[0])


class TestJudge(unittest.TestCase):
    def judge(self, is_b1=False, **changes):
        return kinds.judge(fields(**changes), kinds.KINDS["long" if is_b1 else "greedy"], 32,
                           floor=4097, diagnose=self.diagnose)

    @staticmethod
    def diagnose(answer, api_key_env="VLLM_API_KEY", key_set=False):
        return vllm_client.diagnose_http_error(answer["http_status"], answer.get("error"),
                                               answer.get("error_param"), api_key_env, key_set)

    def test_good_response_passes(self):
        self.assertEqual(self.judge(is_b1=True), [])
        self.assertEqual(self.judge(is_b1=True, cached_tokens=None), [])

    def test_one_token_response_is_named(self):
        problems = self.judge(completion_tokens=1, finish_reason="stop", stop_reason=2)
        # One diagnosis, said once: it names the finish and stop reasons it showed.
        self.assertEqual(problems, ["one-token response: completion_tokens 1 (finish_reason "
                                    "'stop', stop_reason '<a token id>')"])

    def test_wrong_counts_and_reasons(self):
        self.assertEqual(self.judge(completion_tokens=31), ["completion_tokens 31, expected 32"])
        self.assertEqual(self.judge(stop_reason="</s>"),
                         ["stop_reason '<a string of 4 characters>', expected null"])
        self.assertEqual(self.judge(n_choices=2), ["response has 2 choices, expected 1"])
        self.assertEqual(self.judge(usage=False), ["response has no usage object"])

    def test_b1_checks_apply_to_b1_only(self):
        self.assertIn("B1 prompt_tokens 4096", self.judge(is_b1=True, prompt_tokens=4096)[0])
        self.assertIn("B1 cached_tokens 4992", self.judge(is_b1=True, cached_tokens=4992)[0])
        self.assertEqual(self.judge(prompt_tokens=30, cached_tokens=16), [])

    def test_errors_are_diagnosed(self):
        said = self.judge(http_status=400, error="priority not allowed", error_param=None)[0]
        self.assertIn("--scheduling-policy priority", said)
        said = self.judge(http_status=400, error="This model's maximum context length is 8192 "
                          "tokens.", error_param="input_tokens")[0]
        self.assertIn("does not fit", said)
        self.assertIn("8192", said)
        said = self.judge(http_status=401, error="Unauthorized")[0]
        self.assertIn("unauthorized: VLLM_API_KEY is not set; set VLLM_API_KEY (or "
                      "--api-key-env)", said)
        said = kinds.judge(fields(http_status=401, error="Unauthorized"), kinds.KINDS["greedy"],
                           32, diagnose=lambda a: self.diagnose(a, "OPS_KEY", True))[0]
        self.assertIn("the server rejected the API key in OPS_KEY", said)
        self.assertEqual(self.judge(http_status=503, error="busy")[0], "HTTP 503: busy")

    def test_run_verdicts(self):
        from support import contract_requests, decide_held, run_record, wave_records
        ok = contract_requests("r")
        bad = list(ok)
        bad[1] = dict(bad[1], http_status=500, error="x", ok=False, problems=["x"])

        def verdict(records, ending=contract.Ending()):
            found = decide_held(run_record("r"), records + wave_records("r"), ending)
            return found.verdict, found.exit_code, list(found.problems)
        self.assertEqual(verdict(ok)[:2], ("pass", 0))
        self.assertEqual(verdict(bad)[:2], ("fail", 1))
        self.assertIn("B2#0: x", verdict(bad)[2])
        late = verdict(ok, contract.Ending(problems=("finished after the deadline (91.00 s > "
                                                     "90 s)",)))
        self.assertEqual(late[:2], ("fail", 1))
        self.assertIn("finished after the deadline", late[2][0])
        refused = contract.Ending("refused", 3, ("refused",))
        self.assertEqual(verdict(ok[:3], refused)[:2], ("refused", 3))
        self.assertEqual(verdict(bad[:3], refused)[:2], ("fail", 1))
        self.assertEqual(verdict(ok[:3])[:2], ("fail", 1))

    def test_wave_judge(self):
        ok = {"ok": True}
        self.assertEqual(warmup.judge_wave([ok, ok], 2), [])
        self.assertEqual(warmup.judge_wave([ok], 2), ["B2: 1 of 2 requests ran"])


class TestSanitize(unittest.TestCase):
    def test_fields_never_hold_text_or_ids(self):
        body = json.dumps({"choices": [{"text": "SECRET TEXT", "finish_reason": "length",
                                        "stop_reason": None, "token_ids": [987]}],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 32,
                                     "prompt_tokens_details": None,
                                     "completion_tokens_details": {"reasoning_tokens": 3}},
                           "metrics": {"time_to_first_token_ms": 5, "mean_itl_ms": "x",
                                       "speculative_decoding": {"num_drafts": 4, "note": "t"}}})
        got = vllm_client.extract_fields(200, body.encode())
        self.assertNotIn("SECRET", json.dumps(got))
        self.assertNotIn("987", json.dumps(got))
        self.assertIsNone(got["cached_tokens"])
        self.assertEqual(got["reasoning_tokens"], 3)
        self.assertEqual(got["metrics"]["time_to_first_token_ms"], 5)
        self.assertIsNone(got["metrics"]["mean_itl_ms"])
        self.assertEqual(got["speculative_decoding"], {"num_drafts": 4, "note": None})

    def test_error_messages_are_short_single_line_and_redacted(self):
        message = "bad\nthing\x1b[31m key=sk-123 " + "x" * 500
        body = json.dumps({"error": {"message": message, "param": None, "code": 400}})
        sanitizing.REDACTIONS.secret("sk-123")      # as a Connection registers its key
        got = vllm_client.extract_fields(400, body.encode())
        self.assertLessEqual(len(got["error"]), 300)
        self.assertNotIn("\n", got["error"])
        self.assertNotIn("\x1b", got["error"])
        self.assertNotIn("sk-123", got["error"])
        self.assertTrue(got["error"].startswith("bad thing [31m key=[redacted]"))

    def test_stop_reason_keeps_its_type_and_size_only(self):
        self.assertEqual(records.clean_stop_reason(2), "<a token id>")
        self.assertIsNone(records.clean_stop_reason(None))
        self.assertEqual(records.clean_stop_reason("generated text " * 9),
                         "<a string of 135 characters>")
        self.assertEqual(records.clean_stop_reason(2.5), "<float>")

    def test_chunked_decoding(self):
        self.assertEqual(transport.decode_chunked(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), b"abcde")
        self.assertIsNone(transport.decode_chunked(b"3\r\nabc\r\n"))


class TestRuns(HelperCase):
    runs_long = 9                         # seconds on a quiet run: run.py starts it early
    def test_passing_run_end_to_end(self):
        server = self.start_fake(prompt_tokens_details=True, latency_s=0.05)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        requests = result.requests
        self.assertEqual(len(requests), 10)
        self.assertEqual([r["wave"] for r in requests], ["B1"] + ["B2"] * 2 + ["B3"] * 3 + ["B4"] * 4)
        b1 = requests[0]
        self.assertGreater(b1["prompt_tokens"], 4096)
        self.assertLessEqual(b1["prompt_tokens"], 5000)
        self.assertEqual(b1["cached_tokens"], 0)
        run_id = result.kind("run")[0]["run_id"]
        for r in requests:
            self.assertTrue(r["ok"], r)
            self.assertEqual(r["request_id"], f"warmup-{run_id}-{r['wave']}-{r['index']}")
            self.assertEqual((r["completion_tokens"], r["finish_reason"], r["stop_reason"]),
                             (32, "length", None))
            for key in ("prompt_tokens", "cached_tokens", "reasoning_tokens", "latency_s",
                        "sent_at_s", "http_status", "problems"):
                self.assertIn(key, r)
        waves = result.kind("wave")
        self.assertEqual([w["depth"] for w in waves], [1, 2, 3, 4])
        self.assertTrue(all(isinstance(w["release_skew_ms"], float) for w in waves))
        self.assertEqual(len(result.kind("gauges")), 4)
        self.assertEqual(result.summary["verdict"], "pass")
        self.assertEqual((result.summary["requests_ok"], result.summary["requests_total"]), (10, 10))
        self.assertIn("PASS (exit 0)", result.stdout)
        self.assertEqual(len([l for l in result.stdout.splitlines() if l[:2] in ("B1", "B2", "B3",
                                                                                 "B4")]), 4)
        # What the server received: the exact bodies, and each wave after the previous one.
        sent = server.state.completions()
        self.assertEqual(len(sent), 10)
        for entry in sent:
            body = entry["body"]
            self.assertEqual((body["max_tokens"], body["min_tokens"], body["ignore_eos"],
                              body["temperature"], body["priority"], body["stream"]),
                             (32, 32, True, 0, 20, False))
            self.assertFalse({"stop", "stop_token_ids", "logprobs"} & set(body))
        order = [e["body"]["request_id"].split("-")[-2] for e in sent]
        self.assertEqual(order, sorted(order, key=lambda w: int(w[1:])))
        self.assert_clean(server, result)

    def test_second_run_on_the_same_server_still_reports_no_cached_prefix(self):
        server = self.start_fake(prompt_tokens_details=True)
        first = self.run_helper(server)
        os.remove(self.records_path)
        second = self.run_helper(server)
        self.assertEqual((first.code, second.code), (0, 0), second.stdout)
        self.assertEqual(second.requests[0]["cached_tokens"], 0)

    def test_one_token_reply_fails_and_is_named(self):
        server = self.start_fake(fault="one_token", fault_match="-B3-")
        result = self.run_helper(server)
        self.assertEqual(result.code, 1)
        bad = [r for r in result.requests if not r["ok"]]
        self.assertEqual([r["wave"] for r in bad], ["B3"] * 3)
        self.assertEqual((bad[0]["completion_tokens"], bad[0]["finish_reason"],
                          bad[0]["stop_reason"]), (1, "stop", "<a token id>"))
        self.assertIn("one-token response", bad[0]["problems"][0])
        self.assertEqual(result.summary["verdict"], "fail")
        self.assertIn("one-token response", " ".join(result.summary["problems"]))
        self.assertIn("one-token response", result.stdout)
        self.assertEqual(len(result.requests), 10, "later waves still run")
        self.assert_clean(server, result)

    def test_wrong_finish_and_stop_reason(self):
        server = self.start_fake(fault="stop_string", fault_match="-B2-1")
        result = self.run_helper(server)
        self.assertEqual(result.code, 1)
        bad = [r for r in result.requests if not r["ok"]]
        self.assertEqual(len(bad), 1)
        self.assertEqual(bad[0]["stop_reason"], "<a string of 9 characters>")
        self.assertIn("finish_reason 'stop', expected 'length'", bad[0]["problems"])
        self.assertNotIn("</answer>", result.stdout + result.stderr + result.records_text,
                         "nothing the server writes is kept beyond its type and size")

    def test_b1_too_short_fails(self):
        server = self.start_fake(fault="short_prompt_tokens", fault_match="-B1-")
        result = self.run_helper(server)
        self.assertEqual(result.code, 1)
        self.assertIn("B1 prompt_tokens 1000, expected more than 4096",
                      result.requests[0]["problems"])

    def test_cached_tokens_reported_non_zero_fails(self):
        server = self.start_fake(prompt_tokens_details=True, fault="cache_hit", fault_match="-B1-")
        result = self.run_helper(server)
        self.assertEqual(result.code, 1)
        self.assertGreater(result.requests[0]["cached_tokens"], 0)
        self.assertIn("B1 cached_tokens", result.summary["problems"][0])

    def test_cached_not_reported_is_null_and_said(self):
        server = self.start_fake(prompt_tokens_details=False)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0)
        self.assertTrue(all(r["cached_tokens"] is None for r in result.requests))
        self.assertTrue(all(r["reasoning_tokens"] is None for r in result.requests))
        self.assertIn("cache check not made", result.summary["notes"][0])
        self.assertIn("cache check not made", result.stdout)
        self.assertIn('"cached_tokens": null', result.records_text)

    def test_per_request_metrics_are_kept_as_numbers(self):
        server = self.start_fake(per_request_metrics=True)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0)
        b1 = result.requests[0]
        self.assertEqual(b1["metrics"]["time_to_first_token_ms"], 12.5)
        self.assertEqual(b1["speculative_decoding"]["accepted_per_position"], [7, 6, 5, 4, 3])

    def test_busy_gauge_refuses_before_any_completion(self):
        server = self.start_fake(gauge_values={("vllm:num_requests_running", "0"): 1.0})
        result = self.run_helper(server)
        self.assertEqual(result.code, 3)
        self.assertEqual(result.summary["verdict"], "refused")
        self.assertIn("vllm:num_requests_running", result.summary["problems"][0])
        self.assertEqual(server.state.completions(), [])
        self.assertIn("REFUSED (exit 3)", result.stdout)

    def test_by_reason_trap_does_not_refuse(self):
        server = self.start_fake(waiting_by_reason=3.0)
        self.assertEqual(self.run_helper(server).code, 0)

    def test_context_too_small_fails_before_sending(self):
        server = self.start_fake(max_model_len=1055)     # room for 1023 prompt tokens
        result = self.run_helper(server)
        self.assertEqual(result.code, 1)
        self.assertIn("context too small: max_model_len 1055 leaves room for 1023 prompt "
                      "tokens", result.summary["problems"][0])
        self.assertIn("fewer than the 1024 a B1 prompt needs", result.summary["problems"][0])
        self.assertEqual(server.state.completions(), [])

    def test_small_context_sizes_b1_to_fit(self):
        server = self.start_fake(max_model_len=4600, prompt_tokens_details=True)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertLessEqual(result.requests[0]["prompt_tokens"] + 32, 4600)

    def test_context_known_only_from_tokenize_is_respected(self):
        server = self.start_fake(max_model_len=4600, models_report_len=False)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertLessEqual(result.requests[0]["prompt_tokens"] + 32, 4600)
        self.assertEqual(result.kind("run")[0]["max_model_len"], 4600)

    def test_without_tokenize_the_prompt_is_estimated(self):
        server = self.start_fake(tokenize=False)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(result.kind("run")[0]["plan"]["b1_sizing"], "estimate")
        self.assertGreater(result.requests[0]["prompt_tokens"], 4096)

    def test_api_key_sent_to_v1_only_and_never_printed(self):
        server = self.start_fake(api_key=API_KEY)
        result = self.run_helper(server, env={"VLLM_API_KEY": API_KEY})
        self.assertEqual(result.code, 0, result.stdout)
        for entry in server.state.requests:
            sent = entry["headers"].get("Authorization")
            if entry["path"].startswith("/v1/"):
                self.assertEqual(sent, f"Bearer {API_KEY}")
            else:
                self.assertIsNone(sent, entry["path"])
        self.assertTrue(result.kind("run")[0]["api_key_set"])
        self.assert_clean(server, result)

    def test_api_key_from_another_variable(self):
        server = self.start_fake(api_key=API_KEY)
        result = self.run_helper(server, "--api-key-env", "MY_KEY", env={"MY_KEY": API_KEY})
        self.assertEqual(result.code, 0)

    def test_priority_zero_is_accepted_there(self):
        server = self.start_fake(reject_priority=True)
        self.assertEqual(self.run_helper(server, "--priority", "0").code, 0)

    def test_deadline_passed_mid_wave_fails_and_later_waves_do_not_run(self):
        # B2 takes 5 s more than it should; all before it takes ~0.2 s on a quiet machine.
        server = self.start_fake(fault="slow", fault_match="-B2-")
        result = self.run_helper(server, "--deadline-s", "2")
        self.assertEqual(result.code, 1)
        self.assertLess(result.elapsed, 2 + 5)
        b2 = [r for r in result.requests if r["wave"] == "B2"]
        self.assertTrue(all("deadline" in r["problems"][0] for r in b2), b2)
        self.assertEqual({e["body"]["request_id"].split("-")[-2]
                          for e in server.state.completions()}, {"B1", "B2"})
        self.assertIn("deadline passed before B3: B3,B4 not run", result.summary["problems"])

    def test_late_run_fails_even_with_every_response_correct(self):
        server = self.start_fake(latency_s=0.15)
        result = self.run_helper(server, "--deadline-s", "0.55")
        self.assertEqual(result.code, 1)
        self.assertTrue(any("deadline" in p for p in result.summary["problems"]))

    def test_deeper_waves(self):
        server = self.start_fake()
        result = self.run_helper(server, "--waves", "1,2,3,4,6,8")
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(len(result.requests), 24)
        self.assertEqual(result.kind("wave")[-1]["wave"], "B8")

    def test_several_models_is_a_usage_error_naming_them(self):
        server = self.start_fake(model="a", extra_models=("b",))
        result = self.run_helper(server)
        self.assertEqual(result.code, 2)
        self.assertIn("serves 2 models (a, b); choose one with --model",
                      result.summary["problems"][0])
        self.assertEqual(server.state.completions(), [])
        self.assertEqual(self.run_helper(server, "--model", "b").code, 0)

    def test_model_not_served_is_a_usage_error(self):
        server = self.start_fake(model="a")
        result = self.run_helper(server, "--model", "c")
        self.assertEqual(result.code, 2)
        self.assertIn("model 'c' is not served", result.summary["problems"][0])
        self.assertIn("served: a", result.summary["problems"][0])

    def test_json_summary_on_stdout(self):
        server = self.start_fake()
        result = self.run_helper(server, "--json")
        self.assertEqual(result.code, 0)
        self.assertEqual(json.loads(result.stdout)["verdict"], "pass")
        self.assertIn("PASS", result.stderr)

    def test_dry_run_makes_no_connection(self):
        server = self.start_fake()
        with mock.patch("socket.create_connection", side_effect=AssertionError("connected")):
            result = self.run_helper(server, "--dry-run")
        self.assertEqual(result.code, 0)
        self.assertIn("B4   4 concurrent", result.stdout)
        self.assertIn("320 completion tokens", result.stdout)
        self.assertEqual(server.state.requests, [])
        self.assertFalse(os.path.exists(self.records_path))

    def test_help_documents_every_option_and_exit_code(self):
        help_text = warmup.build_parser().format_help()
        for word in ("--base-url", "--model", "--records", "--deadline-s", "--socket-cap-s",
                     "--tokens", "--priority", "--api-key-env", "--waves", "--b1-tokens",
                     "--dry-run", "--json", "WARMUP_BASE_URL", "WARMUP_MODEL",
                     "WARMUP_RECORDS_DIR", "VLLM_API_KEY", "WARMUP_HARD_S", "143", "124"):
            self.assertIn(word, help_text)


class TestProcesses(HelperCase):
    """The helper and the wrapper as real processes: signals and the hard bound."""
    runs_long = 7                         # seconds on a quiet run: run.py starts it early

    def test_wrapper_kills_a_helper_stuck_on_a_trickling_server(self):
        # A deadline at or past the bound is refused, so the helper is made to outlive its
        # own deadline as a defect would: its clock never runs out (injected through
        # WARMUP_PYTHON, the wrapper's interpreter).
        server = self.start_fake(fault="trickle", fault_match="-B1-", trickle_interval_s=0.25)
        shim = os.path.join(self.tmp, "stuck-python")
        with open(shim, "w") as handle:
            handle.write('#!/bin/bash\n# -I -S -c CODE RAN FOLDER ARGS...: CODE after a clock '
                         'that never runs out\n'
                         'exec "$PYTHON" "$1" "$2" "$3" "import sys; '
                         'sys.path.insert(0, sys.argv[2]); import core.transport as transport; '
                         'transport.Clock.remaining = lambda self: 1.0; $4" "${@:5}"\n')
        os.chmod(shim, 0o755)
        result = self.run_process(["bash", WRAPPER, "--base-url", server.url, "--records",
                                   self.records_path, "--deadline-s", "1.5"],
                                  env={"WARMUP_HARD_S": "2", "WARMUP_PYTHON": shim,
                                       "PYTHON": sys.executable}, timeout=30)
        self.assertEqual(result.code, 124, result.stderr)
        self.assertLess(result.elapsed, 2 + 10)
        self.assertEqual(result.summary["verdict"], "killed")
        self.assertIn("hard bound", result.stderr)
        # The records say what the wrapper returned: the bound's 124, not a plain TERM's 143.
        self.assertEqual(result.summary["exit_code"], 124)
        problem = result.summary["problems"][0]
        self.assertIn("ended by warmup_serve.sh's hard bound (TERM at 2 s)", problem)
        if server.state.completions():     # on a busy machine the bound may come before B1
            self.assertIn("during B1", problem)

    def test_a_killed_warm_up_leaves_no_success_in_the_textfile(self):
        textfile = os.path.join(self.tmp, "offload.prom")
        self.assertEqual(self.run_helper(self.start_fake(), "--textfile", textfile).code, 0)
        hung = self.start_fake(fault="hang", fault_match="-B1-")
        proc = self.start_helper_process(hung, "--textfile", textfile)
        self.wait_for_completions(hung, 1)
        proc.kill()                                   # as the hard bound's KILL: no summary
        proc.wait(30)
        with open(textfile) as handle:
            text = handle.read()
        self.assertIn("offload_warmup_last_run_success 0.0", text)
        self.assertIn('offload_warmup_last_run_verdict{verdict="running"} 1.0', text)
        self.assertIn("offload_warmup_last_run_started_timestamp_seconds", text)

    def test_a_run_that_cannot_begin_is_published_as_usage(self):
        textfile = os.path.join(self.tmp, "offload.prom")
        for command, env in (
                (["bash", WRAPPER, "--textfile", textfile], {"WARMUP_HARD_S": "abc"}),
                (["bash", WRAPPER, "--textfile", textfile],
                 {"WARMUP_HARD_S": "9223372036854775000"}),
                ([*PYTHON, WARMUP, f"--textfile={textfile}", "--bogus"], {}),
                ([*PYTHON, WARMUP, "--textfile", textfile, "--tokens"], {})):
            with self.subTest(command=command[-1], env=env):
                with open(textfile, "w") as handle:
                    handle.write("offload_warmup_last_run_success 1\n")
                self.assertEqual(self.run_process(command, env=env).code, 2)
                with open(textfile) as handle:
                    text = handle.read()
                self.assertIn("offload_warmup_last_run_success 0.0", text)
                self.assertIn('offload_warmup_last_run_verdict{verdict="usage"} 1.0', text)

    def test_a_lowered_hard_bound_lowers_the_default_deadline(self):
        server = self.start_fake()
        result = self.run_process(["bash", WRAPPER, "--base-url", server.url, "--records",
                                   self.records_path, "--json"], env={"WARMUP_HARD_S": "60"})
        self.assertEqual(result.code, 0, result.stderr)
        self.assertEqual(result.summary["deadline_s"], 55.0)
        plan = self.run_argv(["--dry-run", "--json"], env={"WARMUP_DEADLINE_S": "30"})
        self.assertEqual(json.loads(plan.stdout)["deadline_s"], 30.0)

    def test_a_deadline_at_the_hard_bound_is_a_usage_error(self):
        result = self.run_process(["bash", WRAPPER, "--deadline-s", "95", "--dry-run"])
        self.assertEqual(result.code, 2)
        self.assertIn("--deadline-s: the deadline 95 s is not below the hard bound "
                      "WARMUP_HARD_S=95", result.stderr)
        self.assertEqual(self.run_process(["bash", WRAPPER, "--deadline-s", "94",
                                           "--dry-run"]).code, 0)
        lowered = self.run_process(["bash", WRAPPER, "--deadline-s", "70", "--dry-run"],
                                   env={"WARMUP_HARD_S": "60"})
        self.assertEqual(lowered.code, 2, "only an explicit deadline past the bound is refused")
        self.assertIn("the deadline 70 s is not below the hard bound WARMUP_HARD_S=60",
                      lowered.stderr)
        by_variable = self.run_argv(["--dry-run"], env={"WARMUP_HARD_S": "60",
                                                        "WARMUP_DEADLINE_S": "60"})
        self.assertEqual(by_variable.code, 2)
        self.assertIn("WARMUP_DEADLINE_S: the deadline 60 s", by_variable.stderr)
        for hard in ("nan", "inf", "-5", "x"):
            with self.subTest(hard=hard):
                said = self.run_argv(["--dry-run"], env={"WARMUP_HARD_S": hard})
                self.assertEqual(said.code, 2)
                self.assertIn("WARMUP_HARD_S: must be a number of seconds from 1 to 86400",
                              said.stderr)

    def test_wrapper_passes_ctrl_c_and_hangup_on_as_themselves(self):
        for signum, code in ((signal.SIGINT, 130), (signal.SIGHUP, 129)):
            if signal.getsignal(signum) == signal.SIG_IGN:   # nohup: bash could not trap it
                self.addCleanup(signal.signal, signum, signal.signal(signum, signal.SIG_DFL))
            with self.subTest(signal=signum.name):
                server = self.start_fake(fault="hang", fault_match="-B2-")
                records = os.path.join(self.tmp, f"{signum.name}.jsonl")
                proc = subprocess.Popen(["bash", WRAPPER, "--base-url", server.url,
                                         "--records", records, "--deadline-s", "20"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                self.addCleanup(proc.kill)
                self.wait_for_completions(server, 3)      # B1, and B2 hanging
                proc.send_signal(signum)
                _, err = proc.communicate(timeout=20)
                self.assertEqual(proc.returncode, code, (err, read_records(records)))
                summary = [r for r in read_records(records)[0] if r["record"] == "summary"]
                self.assertEqual([(s["verdict"], s["exit_code"]) for s in summary],
                                 [("killed", code)])
                self.assertIn(f"terminated by {signum.name} during B2", summary[0]["problems"][0])

    def test_wrapper_passes_arguments_and_status_through(self):
        result = self.run_process(["bash", WRAPPER, "--waves", "2"], timeout=30)
        self.assertEqual(result.code, 2)
        self.assertIn("argument --waves: must start with 1", result.stderr)
        result = self.run_process(["bash", WRAPPER, "--dry-run"], timeout=30)
        self.assertEqual(result.code, 0)
        self.assertIn("hard bound 95 s", result.stdout)

    def test_the_wrapper_and_the_warm_up_read_the_hard_bound_alike(self):
        # One number grammar (core/cli.NUMBER): what the wrapper refuses, warmup.py does (55).
        for hard in ("abc", "0", "-5", "1e3", "1_00", "1e2", " 50", "\u0665\u0660", "50.",
                     ".5", "0.5", "nan", "inf", "86400.5", "86401", "", "1", "007", "9.25",
                     "86400", "86400.0", "000000100", "0.9999999999999999999",
                     "86400.00000000000000001"):
            with self.subTest(hard=hard):
                wrapped = self.run_process(["bash", WRAPPER, "--dry-run"],
                                           env={"WARMUP_HARD_S": hard}, timeout=30)
                alone = self.run_argv(["--dry-run"], env={"WARMUP_HARD_S": hard})
                if hard == "1" and wrapped.code == 124:     # a busy machine: 1 s was short
                    self.assertIn("(TERM at 1 s, exit 124)", wrapped.stderr)   # but taken
                    wrapped = alone
                self.assertEqual(wrapped.code, alone.code, (wrapped.stderr, alone.stderr))
                self.assertIn(wrapped.code, (0, 2))
                if hard in ("", "1", "007", "9.25", "86400", "86400.0", "000000100"):
                    self.assertEqual(wrapped.code, 0, wrapped.stderr)
                    continue
                for said in (wrapped.stderr, alone.stderr):
                    self.assertIn("WARMUP_HARD_S: must be a number of seconds from 1 to "
                                  "86400, got", said)

    def test_scripts_parse(self):
        for script in (WRAPPER, os.path.join(REPO, "start.sh")):
            with self.subTest(script=script):
                self.assertTrue(os.path.isfile(script), f"{script} is missing")
                subprocess.run(["bash", "-n", script], check=True, timeout=30)


def load_tests(loader, standard_tests, pattern):
    """Run alone (the coordinator's `-p test_warmup.py`), also run the warm-up's fault matrix
    and its engines tests: together they are the warm-up's contract, and they pass on a busy
    2-core machine. The hostile table, the qualification tools, start.sh and the documents
    run with the whole suite (the README's test command). Discovered with the other files,
    each runs once, from its own module."""
    if pattern == "test_warmup.py":
        for name in ("test_faults", "test_engines"):
            standard_tests.addTests(loader.loadTestsFromName(name))
    return standard_tests



class TestK1Call(HelperCase):
    """The call K1's start.sh makes into the wrapper (CONTRACT section 10), held unchanged:
    no argument, the address and the chunk in the environment, the exit status read."""

    CALL = ("`bash\noffload/launch/warmup_serve.sh` with no argument, `WARMUP_BASE_URL` and\n"
            "`WARMUP_CHUNK_TOKENS`")

    def call(self, server) -> subprocess.CompletedProcess:
        records = os.path.join(self.tmp, "k1")
        os.makedirs(records, exist_ok=True)
        return subprocess.run(["bash", os.path.relpath(WRAPPER, REPO)], cwd=REPO,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, WARMUP_BASE_URL=server.url,
                                       WARMUP_CHUNK_TOKENS="4096", WARMUP_RECORDS_DIR=records))

    def test_the_call_k1_makes_passes_and_fails_by_exit_status(self):
        with open(os.path.join(os.path.dirname(WRAPPER), "CONTRACT.md"), encoding="utf-8") as f:
            self.assertIn(self.CALL, f.read(), "CONTRACT states the call this test makes")
        passed = self.call(self.start_fake(latency_s=0.01))
        self.assertEqual(passed.returncode, 0, passed.stdout + passed.stderr)
        self.assertIn("PASS (exit 0): contract 10/10", passed.stdout)
        written = os.listdir(os.path.join(self.tmp, "k1"))
        self.assertEqual(len(written), 1, "the records go to WARMUP_RECORDS_DIR")
        found, _ = read_records(os.path.join(self.tmp, "k1", written[0]))
        self.assertEqual(found[0]["plan"]["chunk_tokens"], 4096)
        failed = self.call(self.start_fake(latency_s=0.01, fault="one_token"))
        self.assertEqual(failed.returncode, 1, "K1's WARN reads a non-zero status")

    def test_k1_shape_sends_exactly_the_ten_requests_of_the_patch_note(self):
        # K1: chunk 4096, context 327,680. Sizing B1 to the server must leave its plan,
        # bodies and checks as they were: B1 more than 4096 and at most 5000 tokens.
        server = self.start_fake(latency_s=0.01, max_model_len=327680)
        self.assertEqual(self.call(server).returncode, 0)
        bodies = [r["body"] for r in server.state.completions()]
        self.assertEqual(len(bodies), 10)
        fixed = {"max_tokens": 32, "min_tokens": 32, "ignore_eos": True, "temperature": 0,
                 "priority": 20, "stream": False}
        for body in bodies:
            self.assertEqual({k: body.get(k) for k in fixed}, fixed)
            self.assertFalse({"stop", "stop_token_ids", "logprobs"} & set(body))
        written = os.listdir(os.path.join(self.tmp, "k1"))
        found, _ = read_records(os.path.join(self.tmp, "k1", written[0]))
        plan = found[0]["plan"]
        self.assertEqual((plan["b1_min_prompt_tokens"], plan["b1_target_tokens"],
                          plan["b1_context_tokens"], plan["b1_one_step"]),
                         (4097, 5000, 327680, False))
        b1 = [r for r in found if r["record"] == "request" and r["wave"] == "B1"]
        self.assertTrue(4096 < b1[0]["prompt_tokens"] <= 5000, b1[0]["prompt_tokens"])
        self.assertEqual([r["wave"] for r in found if r["record"] == "request"],
                         ["B1", "B2", "B2", "B3", "B3", "B3", "B4", "B4", "B4", "B4"])

if __name__ == "__main__":
    unittest.main()
