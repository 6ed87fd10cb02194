"""Plan files (--plan, WARMUP_PLAN): a plan an operator reviews, run and judged as the
contract's, named with its SHA-256 in the records, the ready file and the report; a wrong
one refused before anything is sent; a setting that changes it makes a custom plan."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import unittest

from support import (LAUNCH, PYTHON, HelperCase, StartCase, copy_product,
                     read_records, run_qualify)
import core.contract as contract  # noqa: E402
from support import recorded_plan  # noqa: E402  (support puts offload/launch on sys.path)
from core.plan_file import plan_fields, read_plan_file  # noqa: E402
from core.transport import UsageError

DEEP = {"name": "deep-8", "waves": [{"depth": 1, "prompt": "long"},
                                    {"depth": 2, "prompt": "short"},
                                    {"depth": 4, "prompt": "short"},
                                    {"depth": 8, "prompt": "short"}],
        "tokens": 32, "priority": 20, "b1_tokens": 5000, "paths": []}


def write_plan(folder: str, doc, name: str = "plan.json") -> tuple[str, str]:
    """A plan file in `folder` (a dict as JSON, or text as it is): (its path, its SHA-256)."""
    path = os.path.join(folder, name)
    data = (json.dumps(doc, indent=2) if isinstance(doc, dict) else doc).encode()
    with open(path, "wb") as handle:
        handle.write(data)
    return path, hashlib.sha256(data).hexdigest()


def qualify(*args: str) -> subprocess.CompletedProcess:
    return run_qualify(*args)


class TestPlanFiles(HelperCase):
    def test_the_default_is_exactly_the_patch_note_s_plan_file(self):
        shipped = read_plan_file(os.path.join(LAUNCH, "plans", "patch-note.json"))
        from core.plan_file import DEFAULT_NAME, DEFAULT_SHA256
        self.assertEqual((shipped.name, shipped.sha256), (DEFAULT_NAME, DEFAULT_SHA256),
                         "the default plan is known by the digest of the file shipped")
        self.assertEqual(contract.plan_of_file(shipped), contract.REVIEWED)
        self.assertEqual(contract.differences(contract.plan_of_file(shipped)), [])

    def test_a_plan_file_passes_with_its_name_and_digest_everywhere(self):
        path, digest = write_plan(self.tmp, DEEP)
        server = self.start_fake()
        result = self.run_helper(server, "--plan", path)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertIn(f"PASS (exit 0): plan deep-8 sha256:{digest[:8]}… 15/15", result.stdout)
        self.assertEqual(len(server.state.completions()), 15)
        self.assertEqual({(r["body"]["max_tokens"], r["body"]["min_tokens"], r["body"]["priority"])
                          for r in server.state.completions()}, {(32, 32, 20)})
        plan = result.kind("run")[0]["plan"]
        self.assertEqual((plan["file"]["name"], plan["file"]["sha256"]), ("deep-8", digest))
        self.assertEqual(result.summary["verdict"], "pass")
        report = qualify("report", self.records_path, "--plan-sha256", digest)
        self.assertEqual(report.returncode, 0, report.stdout)
        self.assertIn(f"plan deep-8 sha256:{digest[:8]}… 15/15", report.stdout)
        other = qualify("report", self.records_path, "--plan-sha256", "ab" * 32)
        self.assertEqual(other.returncode, 1)
        self.assertIn(f"its plan is sha256:{digest}, not sha256:{'ab' * 32}", other.stdout)

    def test_the_default_plan_is_not_any_plan_file(self):
        self.assertEqual(self.run_helper(self.start_fake()).code, 0)
        report = qualify("report", self.records_path, "--plan-sha256", "ab" * 32)
        self.assertEqual(report.returncode, 1)
        self.assertIn("its plan is not a plan file", report.stdout)

    def test_a_setting_or_leftover_variable_over_a_plan_file_is_custom(self):
        path, _ = write_plan(self.tmp, DEEP)
        server = self.start_fake()
        waves = self.run_helper(server, "--plan", path, env={"WARMUP_WAVES": "1,2"})
        self.assertEqual(waves.summary["verdict"], "custom")
        self.assertIn("waves B1,B2 (WARMUP_WAVES=1,2 from the environment)",
                      waves.summary["plan_differences"])

    def test_an_ad_hoc_b1_size_is_custom(self):
        b1 = self.run_helper(self.start_fake(), "--b1-tokens", "6000")
        self.assertEqual(b1.summary["verdict"], "custom", "ad-hoc flags stay custom")
        self.assertIn("b1_tokens 6000 (--b1-tokens on the command line)",
                      b1.summary["plan_differences"])

    def test_a_wrong_plan_file_is_refused_naming_the_field_before_anything_is_sent(self):
        server = self.start_fake()
        wrong = {
            "waves[0].prompt": dict(DEEP, waves=[{"depth": 2, "prompt": "long"}]),
            "waves: each depth once": dict(DEEP, waves=DEEP["waves"] + [{"depth": 2,
                                                                         "prompt": "short"}]),
            "tokens: must be 32 (the patch note's max_tokens = min_tokens); a plan changes "
            "only its waves and B1's size": dict(DEEP, tokens=512),
            "tokens: must be 32": dict(DEEP, tokens=2),
            "tokens: must be 32 ": dict(DEEP, tokens=True),
            "priority: must be 20": dict(DEEP, priority=0),
            "paths: must be [] (request kinds are a shape test of their own": dict(
                DEEP, paths=["sampled", "chat"]),
            "name: 'patch-note' is the default plan's, known by its digest": dict(
                DEEP, name="patch-note"),
            "field 'stop' unknown": dict(DEEP, stop=["\n"]),
            "field 'priority' missing": {k: v for k, v in DEEP.items() if k != "priority"},
            "waves: at most 128 requests per engine": dict(DEEP, waves=[
                {"depth": d, "prompt": "long" if d == 1 else "short"} for d in range(1, 17)]),
            "name: 1 to 64 letters": dict(DEEP, name="a b"),
            "NaN is not JSON": '{"name": "x", "tokens": NaN}',
            "not a JSON object": "[1, 2]",
        }
        for said, doc in wrong.items():
            with self.subTest(said=said):
                path, _ = write_plan(self.tmp, doc)
                result = self.run_helper(server, "--plan", path)
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn(f"--plan {path}: {said}", result.stderr)
                self.assertIn("nothing was sent", result.stderr)
        self.assertEqual(server.state.requests, [], "refused before any request")

    def test_a_fifo_or_a_folder_as_the_plan_is_refused_without_blocking(self):
        fifo = os.path.join(self.tmp, "plan.fifo")
        os.mkfifo(fifo)
        for path in (fifo, self.tmp):
            with self.subTest(path=path):
                result = self.run_argv(["--dry-run", "--plan", path])
                self.assertEqual(result.code, 2)
                self.assertIn(f"--plan {path}: cannot be read ({path} is not a regular file)",
                              result.stderr)

    def test_a_record_whose_plan_text_was_changed_is_not_believed(self):
        path, digest = write_plan(self.tmp, DEEP)
        plan = contract.plan_of_file(read_plan_file(path))
        recorded = contract.plan_record(plan)
        self.assertEqual(contract.read_plan(recorded_plan(recorded))[0].file.sha256, digest)
        forged = json.dumps(dict(DEEP, tokens=32)).encode()
        recorded["file"]["base64"] = base64.b64encode(forged).decode()
        self.assertEqual(contract.read_plan(recorded_plan(recorded)),
                         (None, ["the run record's plan file does not hash to its sha256"]))

    def test_a_short_b1_fails_whatever_the_chunk(self):
        # A small chunk must not lower the floor of a ~5,000-token B1: the server's
        # prompt_tokens (1000 here, for a prompt /tokenize counted near 5,000) fails it.
        server = self.start_fake(fault="short_prompt_tokens", fault_match="B1")
        result = self.run_helper(server, env={"WARMUP_CHUNK_TOKENS": "512"})
        self.assertEqual(result.code, 1)
        self.assertIn("B1 prompt_tokens 1000, expected more than 4096",
                      " ".join(result.summary["problems"]))

    def test_a_context_just_past_the_chunk_passes(self):
        for context, one_step in ((4129, True), (4144, False)):
            with self.subTest(context=context):
                server = self.start_fake(max_model_len=context)
                records = os.path.join(self.tmp, f"r{context}.jsonl")
                result = self.run_argv(["--base-url", server.url, "--records", records,
                                        "--chunk-tokens", "4096"])
                self.assertEqual(result.code, 0, result.stdout)
                self.assertEqual("one prefill step" in result.stdout, one_step)
                b1 = [r for r in read_records(records)[0] if r["record"] == "request"][0]
                self.assertLessEqual(b1["prompt_tokens"] + 32, context)

    def test_a_plan_file_at_its_bound_is_recorded_whole(self):
        padded = json.dumps(DEEP, indent=2)
        path, digest = write_plan(self.tmp, padded + " " * (2048 - len(padded)))
        result = self.run_helper(self.start_fake(), "--plan", path)
        self.assertEqual(result.code, 0, result.stdout)
        self.assertEqual(qualify("report", self.records_path, "--plan-sha256", digest)
                         .returncode, 0)
        over, _ = write_plan(self.tmp, padded + " " * (2049 - len(padded)), "over.json")
        refused = self.run_argv(["--dry-run", "--plan", over])
        self.assertEqual(refused.code, 2)
        self.assertIn("larger than 2048 bytes", refused.stderr)

    def test_the_dry_run_says_the_whole_digest_to_pin(self):
        path, digest = write_plan(self.tmp, DEEP)
        result = self.run_argv(["--dry-run", "--plan", path])
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn(f"\n  sha256 {digest}\n", result.stdout)
        self.assertEqual(len(digest), 64)

    def test_a_key_said_twice_is_refused(self):
        text = json.dumps(DEEP)[:-1] + ', "tokens": 4096}'
        path, _ = write_plan(self.tmp, text)
        result = self.run_argv(["--dry-run", "--plan", path])
        self.assertEqual(result.code, 2)
        self.assertIn("field 'tokens' twice", result.stderr)

    def test_a_record_whose_context_cannot_hold_its_b1_is_not_believed(self):
        path, digest = write_plan(self.tmp, DEEP)
        self.assertEqual(self.run_helper(self.start_fake(), "--plan", path).code, 0)
        records, _ = read_records(self.records_path)
        records[0]["max_model_len"] = records[0]["plan"]["b1_context_tokens"] = 2048
        forged = os.path.join(self.tmp, "forged.jsonl")
        with open(forged, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
        report = qualify("report", forged, "--plan-sha256", digest)
        self.assertEqual(report.returncode, 1, report.stdout)
        self.assertIn("more prompt tokens than the context of 2048", report.stdout)

    def test_report_without_the_plan_file_reader_says_so_in_one_line(self):
        path, _ = write_plan(self.tmp, DEEP)
        self.assertEqual(self.run_helper(self.start_fake(), "--plan", path).code, 0)
        folder = copy_product(os.path.join(self.tmp, "launch"), leave_out=("core/plan_file.py",))
        report = subprocess.run([*PYTHON, os.path.join(folder, "qualify.py"), "report",
                                 self.records_path], capture_output=True, text=True, timeout=60)
        self.assertEqual(report.returncode, 2, report.stderr)
        self.assertIn("cannot load core.plan_file", report.stderr)
        self.assertNotIn("Traceback", report.stderr)

    def test_plan_fields_hold_every_bound(self):
        self.assertEqual(plan_fields(json.dumps(DEEP))["waves"], (1, 2, 4, 8))
        with self.assertRaises(ValueError):
            plan_fields("[" * 5000)
        with self.assertRaises(UsageError):
            read_plan_file(os.path.join(self.tmp, "missing.json"))


class TestPlanFileUnderStart(StartCase):
    def test_start_sh_passes_a_plan_file_and_the_ready_file_names_its_digest(self):
        path, digest = write_plan(self.tmp, DEEP)
        result = self.start("--ready-file", self.ready, server=self.fake(),
                            env={"WARMUP_PLAN": path})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn(f"OK: warm-up passed: plan deep-8 sha256:{digest[:8]}… 15/15",
                      result.stdout)
        with open(self.ready) as handle:
            self.assertEqual(json.load(handle)["plan"], {"name": "deep-8", "sha256": digest})
        records, _ = read_records(self.records())
        self.assertEqual(records[0]["plan"]["file"]["sha256"], digest)
        ready = qualify("ready", "--ready-file", self.ready, "--plan-sha256", digest)
        self.assertEqual(ready.returncode, 0, ready.stderr)
        other = qualify("ready", "--ready-file", self.ready, "--plan-sha256", "cd" * 32)
        self.assertEqual(other.returncode, 1)
        self.assertIn(f"vouches for a warm-up of plan deep-8 sha256:{digest}", other.stderr)

    def test_a_wrong_plan_file_stops_start_sh_before_it_launches_anything(self):
        path, _ = write_plan(self.tmp, dict(DEEP, tokens=1))
        result = self.start("--ready-file", self.ready, server=self.fake(),
                            env={"WARMUP_PLAN": path})
        self.assertEqual(result.code, 2, result.stdout + result.stderr)
        self.assertIn(f"WARMUP_PLAN {path}: tokens: must be 32", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.logs, "server.pid")),
                         "nothing was launched")

    def test_a_leftover_waves_variable_over_a_plan_file_leaves_no_ready_file(self):
        path, _ = write_plan(self.tmp, DEEP)
        result = self.start("--ready-file", self.ready, server=self.fake(),
                            env={"WARMUP_PLAN": path, "WARMUP_WAVES": "1,2"})
        self.assertEqual(result.code, 0, result.stderr)
        self.assertIn("WARN: warm-up passed a custom plan", result.stdout)
        self.assertFalse(os.path.exists(self.ready))


if __name__ == "__main__":
    unittest.main()


class TestAPassSaysWhatItAssumed(StartCase):
    """54: the ready file, the textfile and the run record say which plan passed (by its
    digest), where the chunk came from and whether B1 was one prefill step; a creator
    asked to require a digest or a known chunk writes no ready file without them."""

    runs_long = 6

    def test_the_ready_file_names_the_default_by_digest_and_the_chunk_s_source(self):
        from core.plan_file import DEFAULT_SHA256
        textfile = os.path.join(self.tmp, "offload.prom")
        result = self.start("--ready-file", self.ready, "--textfile", textfile,
                            "--plan-sha256", DEFAULT_SHA256, "--require-chunk",
                            server=self.fake())
        self.assertIn("OK: warm-up passed", result.stdout, result.stdout + result.stderr)
        with open(self.ready) as handle:
            doc = json.load(handle)
        self.assertEqual((doc["plan"], doc["chunk_source"], doc["b1_one_step"]),
                         ({"name": "patch-note", "sha256": DEFAULT_SHA256},
                          "server.log", False))
        for args, code in ((["--plan-sha256", DEFAULT_SHA256, "--require-chunk"], 0),
                           (["--plan-sha256", "0" * 64], 1)):
            with self.subTest(args=args):
                self.assertEqual(qualify("ready", "--ready-file", self.ready, *args)
                                 .returncode, code)
        with open(textfile) as handle:
            text = handle.read()
        self.assertIn("offload_warmup_chunk_assumed 0.0", text)
        self.assertIn("offload_warmup_b1_one_step 0.0", text)

    def test_a_pass_that_assumed_the_chunk_is_not_vouched_for_when_one_is_required(self):
        # A CPU build logs no chunk and the command gives none: the warm-up assumes 4096.
        textfile = os.path.join(self.tmp, "offload.prom")
        result = self.start("--ready-file", self.ready, "--textfile", textfile,
                            "--require-chunk", server=self.fake("--cpu-build"))
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertIn("WARN: warm-up passed, but the ready file was not written: the warm-up "
                      "assumed the server's prefill chunk: pin --max-num-batched-tokens",
                      result.stdout)
        self.assertFalse(os.path.exists(self.ready))
        with open(textfile) as handle:
            self.assertIn("offload_warmup_chunk_assumed 1.0", handle.read())
        self.stop_server()
        wrong = self.start("--ready-file", self.ready, "--plan-sha256", "a" * 64,
                           server=self.fake())
        self.assertIn("ready file was not written: the ready file vouches for a warm-up of "
                      "plan patch-note", wrong.stdout, wrong.stdout + wrong.stderr)
        self.assertFalse(os.path.exists(self.ready))
        bad = self.refused("--plan-sha256", "xyz", "--", "true")
        self.assertEqual(bad.code, 2)
        self.assertIn("argument --plan-sha256: must be a SHA-256 digest", bad.stderr)
