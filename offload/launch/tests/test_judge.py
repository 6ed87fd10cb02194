"""One judge, one record schema (kinds.py, records.py): what makes an answer pass, the
contract's plan against a custom one, B1's floor, and the records table of CONTRACT.md."""

from __future__ import annotations

import json
import os
import re
import unittest
import subprocess
import sys

from support import (LAUNCH, QUALIFY, HelperCase, contract_requests, gauges_record,
                     read_records, request_record, run_record, summary_record, wave_records)
import core.vllm_client as vllm_client  # noqa: E402
import core.contract as contract  # noqa: E402
from support import decide_held, recorded_plan  # noqa: E402  (support puts offload/launch on sys.path)
import core.kinds as kinds  # noqa: E402
import start.steps as steps  # noqa: E402
import qualify  # noqa: E402
import tools.readback as readback  # noqa: E402
import core.records as records  # noqa: E402
import core.prometheus as prometheus  # noqa: E402
import core.vllm_metrics as vllm_metrics  # noqa: E402

GREEDY = kinds.KINDS["greedy"]
ANSWER = {"http_status": 200, "body_error": None, "n_choices": 1, "usage": True,
          "prompt_tokens": 5000, "cached_tokens": 0, "completion_tokens": 32,
          "finish_reason": "length", "stop_reason": None}


class TestTheJudge(unittest.TestCase):
    """kinds.judge(): pure, one rule set a kind."""

    def test_each_kind_is_held_to_what_it_declares(self):
        self.assertEqual(kinds.judge(ANSWER, GREEDY, 32, floor=4097), [])
        early = dict(ANSWER, completion_tokens=9, finish_reason="stop")
        self.assertEqual(kinds.judge(early, kinds.KINDS["json-schema"], 32), [])
        self.assertEqual(kinds.judge(early, GREEDY, 32),
                         ["completion_tokens 9, expected 32", "finish_reason 'stop', expected "
                          "'length'"])
        stream = dict(ANSWER, stream_done=False, first_token=False)
        self.assertEqual(kinds.judge(stream, kinds.KINDS["stream"], 32),
                         ["stream did not end with [DONE]", "no token text arrived"])
        copy = dict(ANSWER, usage=False, completion_tokens=None, finish_reason="stop",
                    stop_reason="</text>")
        self.assertEqual(kinds.judge(copy, kinds.KINDS["copy"], 2048), [],
                         "the gate's copy: any count, any finish; its text is scored apart")

    def test_the_long_prompt_rules_belong_to_the_long_kind(self):
        short = dict(ANSWER, prompt_tokens=4096, cached_tokens=128)
        self.assertEqual(kinds.judge(short, GREEDY, 32, floor=4097), [], "not by position")
        said = kinds.judge(short, kinds.KINDS["long"], 32, floor=4097)
        self.assertIn("B1 prompt_tokens 4096, expected more than 4096", said[0])
        self.assertIn("B1 cached_tokens 128, expected 0", said[1])

    def test_the_floor_is_past_the_chunk_and_4096_unless_the_context_is_smaller(self):
        self.assertEqual([contract.Plan(chunk_tokens=c).b1_minimum for c in (1, 2048, 4096, 8192)],
                         [4097, 4097, 4097, 8193])
        self.assertEqual(contract.Plan(chunk_tokens=2048, context=4096).b1_minimum, 3556)
        one_step = contract.Plan(chunk_tokens=8192, context=8192, chunk_source="--chunk-tokens")
        self.assertEqual((one_step.b1_minimum, one_step.one_step), (7140, True))
        self.assertEqual(contract.one_step_said(one_step), "B1 in one prefill step: this "
                         "server's chunk (8192) is not smaller than its context (8192)")
        self.assertFalse(contract.Plan(chunk_tokens=4096, context=327680).one_step)
        self.assertIn("chunk (4096, assumed)", contract.one_step_said(contract.Plan(context=4096)))

    def test_hostile_values_are_problems_at_the_edge_not_crashes(self):
        # 55: the readers are the edge (a server's body: extract_fields(); a file: held());
        # what they pass on is a count or None, which judge() reads without a check.
        for value in ("32", 32.0, True, [32], -1, 1 << 60):
            with self.subTest(value=value):
                body = json.dumps({"choices": [{"index": 0, "text": "x",
                                                "finish_reason": "length"}],
                                   "usage": {"prompt_tokens": value,
                                             "completion_tokens": value}}).encode()
                said = kinds.judge(vllm_client.extract_fields(200, body), kinds.KINDS["long"],
                                   32, floor=4097)
                self.assertTrue(any("is not a count" in p for p in said), said)
                kept, unread = records.held([dict(request_record("r", 0),
                                                  completion_tokens=value)])
                self.assertEqual((kept, len(unread)), ([], 1))
        missing = kinds.judge(dict(ANSWER, completion_tokens=None, prompt_tokens=None),
                              kinds.KINDS["long"], 32, floor=4097)
        self.assertIn("usage.completion_tokens missing", missing)

    def test_a_record_is_judged_as_its_answer_was(self):
        record = request_record("r", 0)
        self.assertEqual(kinds.judge(kinds.answer_of(record), GREEDY, 32, floor=4097), [])
        cut = kinds.answer_of(dict(record, http_status=None, error="read timed out"))
        self.assertEqual(kinds.judge(cut, GREEDY, 32), ["read timed out"])

    def test_a_recorded_plan_is_read_back_in_one_place(self):
        plan, why = contract.read_plan(recorded_plan(run_record("r", 10)["plan"]))
        self.assertEqual((plan, why), (contract.REVIEWED, []))
        self.assertEqual(contract.differences(plan), [])
        self.assertEqual((plan.requests_per_engine, plan.requests_per_engine * plan.tokens),
                         (10, 320), "the reviewed budget: ten requests, 320 tokens")
        recorded = contract.plan_record(contract.Plan(waves=(1, 2, 3, 4, 6, 8)))
        deeper, _ = contract.read_plan(recorded_plan(recorded))
        self.assertEqual(contract.differences(deeper), ["waves B1,B2,B3,B4,B6,B8"],
                         "waves past B4 make a custom plan")
        given = contract.Plan(tokens=2, waves=(1,), given=(("waves", "WARMUP_WAVES=1 from "
                                                                     "the environment"),))
        read = contract.read_plan(recorded_plan(contract.plan_record(given)))[0]
        self.assertEqual(contract.differences(read),
                         ["tokens 2", "waves B1 (WARMUP_WAVES=1 from the environment)"])

    def test_a_recorded_plan_that_cannot_be_read_fails_closed(self):
        plan = run_record("r", 10)["plan"]
        for name, bad in (("priority", "20"), ("tokens", True), ("waves", [{"wave": "B1"}]),
                          ("waves", [{"wave": "B1", "depth": 1, "kind": "greedy"}]),
                          ("paths", [{"path": "nonsense"}]), ("chunk_tokens", None)):
            with self.subTest(name=name, bad=bad):
                self.assertEqual(read_plan_held(dict(plan, **{name: bad})), None)


def read_plan_held(plan: dict):
    """The Plan of a run record holding `plan`, read as a file's is: held to its
    declaration first (records.held()), then contract.read_plan(); None when not read."""
    kept, _ = records.held([dict(run_record("r", 10), plan=plan)])
    return contract.read_plan(kept[0]["plan"])[0] if kept else None




class TestTheVerdict(unittest.TestCase):
    """contract.decide(): one pure function from a run record, its records and how its
    steps ended to the verdict the summary, the report and the launcher all give."""

    def decide(self, records, ending=None, run=None, waves=("B1", "B2", "B3", "B4")):
        return decide_held(run or run_record("r"), records + wave_records("r", waves),
                           ending or contract.Ending())

    def test_the_guard_is_judged_again_from_its_gauges_records(self):
        # 54: a wave is part of a pass only after a read of both gauges, each 0, on every
        # engine; the records' own ok is not believed.
        def judged(changed):
            waves = wave_records("r")
            changed(waves)
            return decide_held(run_record("r"), contract_requests("r") + waves,
                               contract.Ending())
        busy = judged(lambda w: w.__setitem__(2, gauges_record("r", "B2", value=3.0)))
        self.assertEqual(busy.verdict, "fail")
        self.assertIn("B2: the guard read before it holds vllm:num_requests_running = 3.0: "
                      "the server was not idle", busy.problems)
        gone = judged(lambda w: w.__delitem__(4))           # B3's read
        self.assertIn("B3: no guard read before it in the records", gone.problems)
        empty = judged(lambda w: w.__setitem__(6, dict(w[6], samples=[], ok=True)))
        self.assertIn("B4: the guard read before it holds no vllm:num_requests_running "
                      "sample", empty.problems)
        foreign = judged(lambda w: w.__setitem__(0, gauges_record("r", "B1", engines=("²",))))
        self.assertIn("B1: the guard read before it holds no vllm:num_requests_running "
                      "sample", foreign.problems, "an engine label no index names")
        fresh = judged(lambda w: w.__setitem__(0, dict(w[0], samples=[],
                                                       fresh_engines=[0])))
        self.assertEqual(fresh.verdict, "fail", "fresh only on a server of several engines")
        import tempfile
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        path = os.path.join(tmp.name, "busy.jsonl")
        waves = wave_records("r")
        waves[2] = gauges_record("r", "B2", value=3.0)
        with open(path, "w") as handle:
            for record in [run_record("r"), *contract_requests("r"), *waves,
                           summary_record("r", "pass", 0)]:
                handle.write(json.dumps(record) + "\n")
        shown = subprocess.run([sys.executable, "-S", QUALIFY, "report", path],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(shown.returncode, 1, shown.stdout + shown.stderr)
        self.assertIn("B2: the guard read before it holds vllm:num_requests_running = 3.0",
                      shown.stdout)

    def test_one_engine_s_declared_gauge_without_a_sample_is_no_idle_server(self):
        text = ("# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_waiting "
                "gauge\nvllm:request_success_total{engine=\"0\"} 0\n")
        problems, fresh = vllm_metrics.guard_problems(prometheus.parse_prometheus(text))
        self.assertEqual(fresh, [])
        self.assertIn("vllm:num_requests_running is declared but has no sample: a server with "
                      "one engine shows it from the start", problems[0])

    def test_a_run_and_its_records_make_its_verdict(self):
        passed = self.decide(contract_requests("r"))
        self.assertEqual((passed.verdict, passed.exit_code, records.parts_text(passed.parts)),
                         ("pass", 0, "contract 10/10"))
        one_token = contract_requests("r")
        one_token[3] = dict(one_token[3], completion_tokens=1, ok=False,
                            problems=["one-token response"])
        failed = self.decide(one_token)
        self.assertEqual((failed.verdict, failed.exit_code), ("fail", 1))
        self.assertEqual(failed.problems, ("B3#0: one-token response",))
        short = self.decide(contract_requests("r")[:9])
        self.assertIn("only 9 of 10 requests ran", short.problems)

    def test_how_the_steps_ended_comes_first(self):
        late = self.decide(contract_requests("r"),
                           contract.Ending(problems=("finished after the deadline",)))
        self.assertEqual((late.verdict, late.problems), ("fail", ("finished after the deadline",)))
        refused = self.decide(contract_requests("r")[:3],
                              contract.Ending("refused", 3, ("refused before B3: busy",)))
        self.assertEqual((refused.verdict, refused.exit_code), ("refused", 3))
        killed = self.decide(contract_requests("r")[:1], contract.Ending("killed", 143, ("x",)))
        self.assertEqual((killed.verdict, killed.exit_code), ("killed", 143))

    def test_a_record_that_claims_ok_is_judged_again(self):
        lying = contract_requests("r")
        lying[0] = dict(lying[0], prompt_tokens=4000)          # B1 under its floor, "ok"
        said = self.decide(lying)
        self.assertEqual(said.verdict, "fail")
        self.assertIn("B1#0: the record says ok, but B1 prompt_tokens 4000, expected more "
                      "than 4096", said.problems)

    def test_every_planned_request_once_each_wave_recorded_and_in_time(self):
        requests = contract_requests("r")
        moved = requests[:3] + [dict(requests[9], wave="B2", index=0, depth=2)] + \
            requests[3:9]                  # B2#0 twice, B4#3 missing: ten records still
        said = self.decide(moved)
        self.assertEqual(said.verdict, "fail")
        self.assertTrue(any("recorded more than once" in p for p in said.problems), said)
        self.assertTrue(any("have no record: B4#3" in p for p in said.problems), said)
        unwaved = self.decide(requests, waves=("B1", "B2", "B3"))
        self.assertIn("1 wave(s) without exactly one wave record: B4 engine -",
                      unwaved.problems)
        late = decide_held(run_record("r", deadline_s=1.0), requests + wave_records("r"),
                           contract.Ending())
        self.assertIn("B1, B2, B3, B4 ended after the deadline (1 s)", late.problems)
        lying = run_record("r", contract=False)
        claimed = decide_held(lying, requests + wave_records("r"), contract.Ending())
        self.assertEqual(readback.claims_problems(records.typed(lying), records.typed(
                             summary_record("r", "pass", 0)), claimed),
                         ["the run record's plan says contract no; its plan is the reviewed "
                          "one"], "the copies of a verdict are held in one place: readback")
        hostile = dict(requests[0], request_kind=[])
        self.assertEqual(self.decide([hostile] + requests[1:]).verdict, "fail",
                         "a value of the wrong type fails closed, without a traceback")

    def test_a_restart_is_judged_from_the_metrics_record_s_data_not_its_text(self):
        deltas = {'vllm:generation_tokens_total{engine="0"}': 320.0,
                  'vllm:request_success_total{engine="0"}': 10.0}
        metrics = {"record": "metrics", "run_id": "r", "source": "http://h/metrics",
                   "state": "complete", "why": None, "meaning": "m", "deltas": deltas,
                   "highlights": {}, "problems": [], "went_down": []}
        self.assertEqual(self.decide(contract_requests("r") + [metrics]).verdict, "pass")
        down = dict(metrics, went_down=['vllm:prompt_tokens_total{engine="0"}'])
        said = self.decide(contract_requests("r") + [down])
        self.assertEqual(said.verdict, "fail")
        self.assertIn("the warm-up: vllm:prompt_tokens_total{engine=\"0\"} went down: the "
                      "server restarted, and what was warmed before is gone", said.problems)
        text = dict(metrics, problems=["the warm-up: something went down"])
        self.assertEqual(self.decide(contract_requests("r") + [text]).verdict, "pass",
                         "a record's stored problem text is the writer's, never judged")

    def test_what_the_records_say_failed_is_no_pass(self):
        refused = {"record": "gauges", "run_id": "r", "wave": "B3", "at_s": 1.0, "ok": False,
                   "samples": [], "fresh_engines": [], "settle_s": None,
                   "problems": ["vllm:num_requests_running is 1"]}
        said = self.decide(contract_requests("r") + [refused])
        self.assertEqual(said.verdict, "fail")
        self.assertIn("the guard refused before B3, yet the run claims a pass", said.problems)
        waves = wave_records("r")                  # each wave's guard read, then the wave
        waves[3] = dict(waves[3], ok=False)
        said = decide_held(run_record("r"), contract_requests("r") + waves,
                           contract.Ending())
        self.assertIn("B2: its wave record says it failed", said.problems)
        refusal = self.decide(contract_requests("r")[:3] + [refused],
                              contract.Ending("refused", 3, ("refused before B3",)))
        self.assertEqual(refusal.verdict, "refused", "a refused run's records say so")

    def test_a_summary_s_pass_with_a_failing_exit_code_is_not_read_as_a_pass(self):
        said = readback.ending_of(records.typed(summary_record("r", "pass", 1)), 90.0)
        self.assertEqual((said.verdict, said.exit_code), ("fail", 1))
        self.assertIn("verdict pass and exit code 1 disagree", said.problems[0])

    def test_a_custom_plan_is_custom_and_extras_are_counted(self):
        plan = contract.plan_record(contract.Plan(paths=("stream",)))
        run = run_record("r", 15, **{k: v for k, v in plan.items() if k != "requests_per_engine"})
        streams = [request_record("r", i, f"stream-{d}", request_kind="stream", path="stream",
                                  depth=d, stream_done=True, first_token=True)
                   for d in (1, 4) for i in range(d)]
        said = self.decide(contract_requests("r") + streams, run=run,
                           waves=("B1", "B2", "B3", "B4", "stream-1", "stream-4"))
        self.assertEqual((said.verdict, said.exit_code, records.parts_text(said.parts)),
                         ("custom", 0, "plan 10/10"),
                         "extras are a shape test of their own, never a pass")
        self.assertEqual((said.shape.verdict, said.shape.parts), ("pass", (("stream", 5, 5),)))
        broken = [dict(r, stream_done=False, ok=False, problems=["no [DONE]"])
                  if r["wave"] == "stream-4" else r for r in streams]
        said = self.decide(contract_requests("r") + broken, run=run,
                           waves=("B1", "B2", "B3", "B4", "stream-1", "stream-4"))
        self.assertEqual((said.verdict, said.exit_code, said.problems, said.shape.verdict,
                          said.shape.parts), ("custom", 1, (), "fail", (("stream", 1, 5),)),
                         "the waves' verdict stands; the shape test's own fails the exit")
        said = self.decide(contract_requests("r")[1:] + streams, run=run,
                           waves=("B2", "B3", "B4", "stream-1", "stream-4"))
        self.assertEqual((said.verdict, said.shape.verdict), ("fail", "pass"))
        plan = contract.plan_record(contract.Plan(waves=(1,)))
        custom = run_record("r", 1, **{k: v for k, v in plan.items() if k != "requests_per_engine"})
        said = self.decide(contract_requests("r")[:1], run=custom, waves=("B1",))
        self.assertEqual((said.verdict, said.exit_code, said.differences, records.parts_text(said.parts)),
                         ("custom", 0, ("waves B1",), "plan 1/1"))


class TestCustomPlan(HelperCase):
    def test_a_custom_plan_passes_by_name_never_as_pass(self):
        server = self.start_fake()
        result = self.run_helper(server, "--tokens", "2", "--waves", "1")
        self.assertEqual(result.code, 0, result.stdout)
        differences = ["tokens 2 (--tokens on the command line)",
                       "waves B1 (--waves on the command line)"]
        self.assertIn(f"pass, custom plan: {'; '.join(differences)} (exit 0)", result.stdout)
        self.assertNotIn("PASS", result.stdout)
        self.assertEqual((result.summary["verdict"], result.summary["contract"],
                          result.summary["plan_differences"]), ("custom", False, differences))
        self.assertFalse(result.kind("run")[0]["plan"]["contract"])
        shown = self.run_argv(["report", self.records_path], main=qualify.main)
        self.assertEqual(shown.code, 1, "a script deciding by the report's exit never "
                                        "releases HOLD on a custom plan")
        self.assertIn(f"verdict: custom plan, not the contract's (exit 1; "
                      f"{'; '.join(differences)})", shown.stdout)
        facts = steps.judged(self.records_path, 0)
        self.assertEqual((facts["verdict"], facts["differences"]),
                         ("custom", "; ".join(differences)))

    def test_the_environment_makes_a_custom_plan_too_and_is_named(self):
        server = self.start_fake()
        result = self.run_helper(server, env={"WARMUP_TOKENS": "8", "WARMUP_WAVES": "1,2"})
        self.assertEqual(result.summary["plan_differences"],
                         ["tokens 8 (WARMUP_TOKENS=8 from the environment)",
                          "waves B1,B2 (WARMUP_WAVES=1,2 from the environment)"])
        first = result.stdout.splitlines()[0]
        self.assertIn("given: WARMUP_WAVES=1,2 from the environment, WARMUP_TOKENS=8 from the "
                      "environment", first)
        self.assertEqual(result.kind("run")[0]["plan"]["given"],
                         {"waves": "WARMUP_WAVES=1,2 from the environment",
                          "tokens": "WARMUP_TOKENS=8 from the environment"})
        textfile = os.path.join(self.tmp, "offload.prom")
        bad = self.run_helper(server, "--textfile", textfile, env={"WARMUP_TOKENS": "lots"})
        self.assertEqual(bad.code, 2)
        self.assertIn("WARMUP_TOKENS: must be a whole number", bad.stderr)
        with open(textfile) as handle:
            self.assertIn('offload_warmup_last_run_verdict{verdict="usage"} 1.0', handle.read(),
                          "a run that could not begin is published too")

    def test_waves_past_b4_are_a_custom_plan_and_leave_no_ready_file(self):
        server = self.start_fake()
        ready_file = os.path.join(self.tmp, "ready")
        result = self.run_helper(server, "--ready-file", ready_file,
                                 env={"WARMUP_WAVES": "1,2,3,4,6,8"})
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(result.summary["verdict"], "custom")
        self.assertNotIn("PASS", result.stdout)
        self.assertIn("waves B1,B2,B3,B4,B6,B8 (WARMUP_WAVES=1,2,3,4,6,8 from the environment)",
                      result.stdout)
        self.assertFalse(os.path.exists(ready_file))
        shown = self.run_argv(["report", self.records_path], main=qualify.main)
        self.assertNotEqual(shown.code, 0)
        self.assertIn("verdict: custom plan", shown.stdout)

    def test_warming_some_engines_only_is_a_custom_plan(self):
        server = self.start_fake(engines=2)
        result = self.run_helper(server, "--engines", "0")
        self.assertEqual(result.code, 0, result.stdout)
        said = "engines not warmed: [1] (--engines on the command line)"
        self.assertEqual(result.summary["plan_differences"], [said])
        self.assertIn(f"pass, custom plan: {said}", result.stdout)

    def test_a_custom_plan_is_no_success_in_the_textfile(self):
        server = self.start_fake()
        textfile = os.path.join(self.tmp, "offload.prom")
        self.run_helper(server, "--tokens", "2", "--textfile", textfile)
        with open(textfile) as handle:
            text = handle.read()
        self.assertIn("offload_warmup_last_run_success 0", text)
        self.assertIn('offload_warmup_last_run_verdict{verdict="custom"} 1', text)
        self.assertNotIn("offload_warmup_last_success_timestamp_seconds", text)

    def test_only_a_warm_up_s_records_make_a_ready_file(self):
        server = self.start_fake()
        self.assertEqual(self.run_argv(["probe", "--base-url", server.url, "--records",
                                        self.records_path, "--rounds", "2"],
                                       main=qualify.main).code, 0)
        ready_file = os.path.join(self.tmp, "ready")
        line = readback.ready_from_records(ready_file, self.records_path)
        self.assertIsNotNone(line)
        self.assertIn("the records are not a warm-up's (mode probe)", line)
        self.assertFalse(os.path.exists(ready_file))

    def test_records_after_the_last_run_make_no_ready_file(self):
        server = self.start_fake()
        self.assertEqual(self.run_helper(server).code, 0)
        found, _ = read_records(self.records_path)
        stray = dict(next(r for r in found if r["record"] == "gauges"), run_id="other")
        with open(self.records_path, "a") as handle:      # as the report judges the file
            handle.write(json.dumps(stray) + "\n")
        ready_file = os.path.join(self.tmp, "ready")
        self.assertIsNotNone(readback.ready_from_records(ready_file, self.records_path))
        self.assertFalse(os.path.exists(ready_file))

    def test_json_is_one_whole_object_however_long(self):
        server = self.start_fake(engines=2)
        result = self.run_helper(server, "--json", "--paths", "stream")
        summary = json.loads(result.stdout)
        self.assertGreater(len(result.stdout), 4000, "longer than a terminal line is cut")
        self.assertEqual(summary["verdict"], "custom")

    def test_extras_are_a_shape_test_never_a_pass_and_counted_on_the_verdict_line(self):
        server = self.start_fake()
        result = self.run_helper(server, env={"WARMUP_PATHS": "stream"})
        self.assertEqual(result.code, 0, result.stdout)
        self.assertIn("pass, custom plan: paths stream (WARMUP_PATHS=stream from the "
                      "environment) (exit 0): plan 10/10 in ", result.stdout)
        self.assertIn("\nshape test, never part of a pass: pass, stream 5/5\n", result.stdout)
        self.assertNotIn("PASS", result.stdout)
        self.assertIn("given: WARMUP_PATHS=stream from the environment",
                      result.stdout.splitlines()[0])
        self.assertFalse(result.summary["contract"])
        shown = self.run_argv(["report", self.records_path], main=qualify.main)
        self.assertEqual(shown.code, 1)
        self.assertIn("verdict: custom plan, not the contract's (exit 1; paths stream",
                      shown.stdout)


class TestB1(HelperCase):
    def test_a_smaller_chunk_sizes_b1_past_it_inside_the_context(self):
        server = self.start_fake(max_model_len=3032, max_num_batched_tokens=2048)
        result = self.run_helper(server, env={"WARMUP_CHUNK_TOKENS": "2048"})
        self.assertEqual(result.code, 0, result.stdout)
        b1 = result.kind("request")[0]
        self.assertTrue(2048 < b1["prompt_tokens"] <= 3000, b1["prompt_tokens"])
        self.assertIn("(chunk 2048 from WARMUP_CHUNK_TOKENS)", result.stdout.splitlines()[0])
        self.assertNotIn("one prefill step", result.stdout)
        dry = self.run_argv(["--dry-run", "--json", "--chunk-tokens", "2048"])
        self.assertEqual(json.loads(dry.stdout)["b1_min_prompt_tokens"], 4097)

    def test_b1_under_the_chunk_fails_when_the_context_holds_more(self):
        # A forged run record cannot move a server into one step: the context it was
        # sized in is the server's own (run record), and B1 must pass the chunk there.
        plan = contract.Plan(chunk_tokens=2048, context=3032)
        self.assertEqual((plan.b1_minimum, plan.one_step), (2625, False))
        said = kinds.judge(dict(ANSWER, prompt_tokens=2100), kinds.KINDS["long"], 32,
                           floor=plan.b1_minimum)
        self.assertIn("B1 prompt_tokens 2100, expected more than 2624", said)

    def test_an_unknown_chunk_is_said_and_a_given_one_sizes_b1(self):
        # vLLM 0.32's /metrics cannot show a chunked prefill (its step histogram counts the
        # whole prompt at the step that ends it): the chunk must be given, and is recorded.
        server = self.start_fake(max_num_batched_tokens=8192)
        result = self.run_helper(server)
        self.assertEqual(result.code, 0)
        self.assertEqual(result.kind("run")[0]["plan"]["chunk_source"], "assumed")
        self.assertIn("the server's prefill chunk was not given", result.summary["warnings"][0])
        os.remove(self.records_path)
        given = self.run_helper(server, "--chunk-tokens", "8192")
        self.assertEqual(given.code, 0, given.summary["problems"])
        self.assertGreater(given.requests[0]["prompt_tokens"], 8192)
        self.assertEqual(given.kind("run")[0]["plan"]["chunk_source"], "--chunk-tokens")
        self.assertFalse(any("prefill chunk" in w for w in given.summary["warnings"]))


class TestRecordsSchema(unittest.TestCase):
    def contract_table(self) -> dict[str, set]:
        with open(os.path.join(LAUNCH, "CONTRACT.md"), encoding="utf-8") as handle:
            text = handle.read()
        rows = re.findall(r"^\| `([a-z_]+)` \| (.*) \|$", text, re.M)
        return {kind: set(re.findall(r"`~?([a-z_0-9]+)\??`", fields.replace("(as `request`)", "")))
                | (set(records.ANSWER_FIELDS) if "the answer's fields" in fields else set())
                for kind, fields in rows if kind in records.RECORDS}

    def test_contract_md_lists_every_declared_field(self):
        table = self.contract_table()
        self.assertEqual(sorted(table), sorted(records.RECORDS))
        for kind, fields in records.RECORDS.items():
            with self.subTest(kind=kind):
                self.assertEqual(table[kind], set(fields))

    def test_a_record_is_held_to_its_declaration(self):
        self.assertEqual(records.field_problems(request_record("r", 0)), [])
        self.assertEqual(records.field_problems(run_record("r", 1)), [])
        self.assertEqual(records.field_problems(summary_record("r", "pass", 0)), [])
        wave = wave_records("r")[1]
        self.assertEqual(records.field_problems(dict(wave, duration_s=10 ** 400)),
                         ["wave record's duration_s is not finite (an integer past 64 bits)"],
                         "valid JSON no float can hold: no sum or format may meet it")
        # finite: a number 0 or more (a hand-edited negative duration is no evidence).
        for value in (-0.5, -1, float("nan"), float("inf")):
            with self.subTest(duration_s=value):
                self.assertEqual(records.field_problems(dict(wave, duration_s=value)),
                                 ["wave record's duration_s is not finite"])
        said = records.field_problems(dict(request_record("r", 0), ok="yes", extra=1))
        self.assertEqual(said, ["request record's ok is not bool",
                                "request record with an undeclared field 'extra'"])


if __name__ == "__main__":
    unittest.main()
