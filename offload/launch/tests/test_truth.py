"""The report decides by decide() alone: recorded exit codes, verdicts and deadlines are
claims, never the verdict; a file of any shape fails closed, in one line, never a traceback.

The fuzz test mutates real records files (written by real warm-ups against the fake) and
holds two things for every mutation: report, the launcher's reader and decide() raise
nothing, and a file whose run did not pass the reviewed plan never exits 0.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import shutil
import subprocess
import sys
import unittest

from support import HelperCase, copy_product, qualify
import core.transport as transport  # noqa: E402  (support puts offload/launch on sys.path)
import tools.readback as readback  # noqa: E402  (support puts offload/launch on sys.path)
import tools.report as report  # noqa: E402

# 1,000 by default (the values that matter are in HOSTILE); CI asks for 5,000.
FUZZ_MUTATIONS = int(os.environ.get("OFFLOAD_FUZZ_MUTATIONS") or 1000)
BUSY = {"gauge_values": {("vllm:num_requests_running", "0"): 2.0}}
HOSTILE = [None, True, False, 0, 1, -1, 3, 143, 2 ** 70, 1e308, -0.5, "", "pass", "0", "1",
           "B1", "long", [], [0], [1], [[0]], [None], {}, {"0": 1}, {"engine": "1"},
           "x" * 300, "\x1b[2J", float("nan"), "²", "١", "1e3", -0.0, {"engine": "²"},
           {"0": "١"}, 10 ** 400, -10 ** 400]


class TruthCase(HelperCase):
    def records_of(self, *args: str, env: dict | None = None, **fake) -> list[dict]:
        server = self.start_fake(latency_s=0.01, **fake)
        self.run_helper(server, *args, env=env)
        with open(self.records_path, encoding="utf-8") as handle:
            found = [json.loads(line) for line in handle if line.strip()]
        open(self.records_path, "w").close()
        return found

    def report(self, records: list, *args: str) -> tuple[int, str]:
        with open(self.records_path, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = report.report_main([self.records_path, *args])
        return code, out.getvalue()


class TestRecordedClaimsAreNotTheVerdict(TruthCase):
    def test_a_failed_refused_or_killed_summary_that_says_exit_0_exits_by_its_verdict(self):
        failed, refused = self.records_of(fault="one_token"), self.records_of(**BUSY)
        for records, verdict, code in ((failed, "fail", 1), (failed, "killed", 143),
                                       (refused, "refused", 3)):
            edited = [dict(r, verdict=verdict, exit_code=0) if r["record"] == "summary"
                      else r for r in records]
            got, text = self.report(edited)
            self.assertEqual(got, code, text)
            self.assertNotIn("(exit 0)", text)
            self.assertTrue(text.rstrip().splitlines()[-1].startswith("verdict:"), text)

    def test_the_run_records_deadline_is_the_one_judged(self):
        records = self.records_of()
        edited = [dict(r, elapsed_s=500.0, deadline_s=1000.0) if r["record"] == "summary"
                  else r for r in records]
        got, text = self.report(edited)
        self.assertEqual(got, 1, text)
        self.assertIn("not within the run record's deadline_s 90", text)

    def test_a_run_that_left_an_engine_cold_edited_to_claim_the_contract_is_no_pass(self):
        records = self.records_of("--engines", "0", engines=2)
        for record in records:
            if record["record"] == "run":
                record["plan"].update(engines_skipped=[], contract=True, differences=[])
            if record["record"] == "summary":
                record.update(verdict="pass", contract=True, plan_differences=[])
        got, text = self.report(records)
        self.assertEqual(got, 1, text)
        self.assertIn("engine 1 of the server (seen in this run's /metrics records) was not "
                      "warmed", text)

    def test_a_run_record_claiming_the_contract_for_a_custom_plan_is_incomplete(self):
        # The copies of a verdict are held against the records in one place (55, R7).
        records = self.records_of("--tokens", "16")
        for record in records:
            if record["record"] == "run":
                record["plan"].update(contract=True, differences=[])
        got, text = self.report(records)
        self.assertEqual(got, 1, text)
        self.assertIn("the run record's plan says contract yes; its plan differs: tokens 16",
                      text)
        self.assertTrue(text.rstrip().splitlines()[-1].startswith("verdict: incomplete"), text)

    def test_a_file_not_read_to_its_end_says_so_on_its_last_line(self):
        records = self.records_of()
        got, text = self.report(records + [json.dumps({"record": "note", "x": "y" * (20 << 20)})])
        self.assertEqual(got, 1)
        last = text.rstrip().splitlines()[-1]
        self.assertTrue(last.startswith("verdict: incomplete (exit 1;"), last)
        self.assertIn("not read to its end", last)

    def test_a_failed_warm_up_followed_by_a_probe_in_one_file_exits_1(self):
        failed = self.records_of(fault="one_token")
        server = self.start_fake(latency_s=0.01)
        probed = self.run_argv(["probe", "--base-url", server.url, "--records",
                                self.records_path, "--rounds", "2"], main=qualify.main)
        self.assertEqual(probed.code, 0, probed.stdout)
        got, text = self.report(failed + probed.records)
        self.assertEqual(got, 1, text)
        self.assertTrue(text.rstrip().splitlines()[-1].startswith(
            "verdict: no warm-up (exit 1; its last run is a probe, not a warm-up"), text)

    def test_a_deadline_past_any_the_helper_allows_is_no_pass(self):
        records = self.records_of()
        for record in records:
            if record["record"] == "run":
                record["plan"]["deadline_s"] = 1e9
            if record["record"] == "summary":
                record.update(deadline_s=1e9, elapsed_s=5e8)
        got, text = self.report(records)
        self.assertEqual(got, 1, text)

    def test_engines_and_engine_of_the_wrong_shape_fail_closed(self):
        records = self.records_of(engines=2)
        for change in ("run", "request"):
            edited = copy.deepcopy(records)
            for record in edited:
                if record["record"] == "run" and change == "run":
                    record["engines"] = [[0]]
                if record["record"] == "request" and change == "request":
                    record["engine"] = [1]
            got, text = self.report(edited)
            self.assertEqual(got, 1, text)
            self.assertNotIn("Traceback", text)
            found = readback.judge_run([r for r in edited])
            self.assertNotEqual(found["verdict"], "pass")


class TestFuzz(TruthCase):
    """FUZZ_MUTATIONS mutations of real records files: no exception anywhere a file is
    judged, and no exit 0 for a file whose run did not pass the reviewed plan."""
    runs_long = 4                         # seconds on a quiet run: run.py starts it early

    def originals(self) -> list[tuple[str, list[dict]]]:
        return [
            ("pass", self.records_of()),
            ("pass", self.records_of(engines=2)),
            ("custom", self.records_of("--paths", "stream")),    # extras: never a pass
            ("fail", self.records_of(fault="one_token")),
            ("custom", self.records_of("--engines", "0", engines=2)),
            ("custom", self.records_of(env={"WARMUP_WAVES": "1,2"})),
            ("refused", self.records_of(**BUSY)),
        ]

    def mutate(self, rng: random.Random, records: list[dict]) -> list:
        """1-3 changes: a record dropped or repeated, or one value (at any depth) replaced
        by a hostile one or deleted. Only the records changed are copied."""
        records = list(records)
        for _ in range(rng.randint(1, 3)):
            choice = rng.random()
            if choice < 0.08 and len(records) > 1:
                del records[rng.randrange(len(records))]
                continue
            if choice < 0.14:
                records.insert(rng.randrange(len(records) + 1), rng.choice(records))
                continue
            at = rng.randrange(len(records))
            records[at] = holder = json.loads(json.dumps(records[at]))
            while rng.random() < 0.6:
                key = rng.choice(list(holder)) if isinstance(holder, dict) \
                    else rng.randrange(len(holder))
                if not isinstance(holder[key], (dict, list)) or not holder[key]:
                    break
                holder = holder[key]
            key = rng.choice(list(holder)) if isinstance(holder, dict) \
                else rng.randrange(len(holder))
            if isinstance(holder, dict) and rng.random() < 0.15:
                del holder[key]
            else:
                holder[key] = json.loads(json.dumps(rng.choice(HOSTILE)))
        return records

    def test_mutated_real_files_never_raise_and_never_pass_what_did_not(self):
        rng = random.Random(36)
        originals = self.originals()
        self.assertEqual([readback.judge_run(r)["verdict"] for _, r in originals],
                         [name for name, _ in originals])
        tried = 0
        while tried < FUZZ_MUTATIONS:
            for name, records in originals:
                mutated = self.mutate(rng, records)
                kept = [r for r in mutated if isinstance(r, dict)
                        and isinstance(r.get("record"), str)]
                try:            # judged as start.sh does, shown as report does
                    built = readback.tidy(readback.judge_file(kept, [], "f"))
                    report.format_report(built)
                    json.dumps(built)
                except Exception as exc:         # the one thing this test exists to find
                    self.fail(f"mutation {tried} of a {name} file raised "
                              f"{type(exc).__name__}: {exc}")
                if name != "pass":
                    self.assertNotEqual(built["exit_code"], 0,
                                        f"mutation {tried} of a {name} file exits 0")
                tried += 1
        self.assertGreaterEqual(tried, FUZZ_MUTATIONS)
        self.assertIs(readback.ENDING_EXITS["fail"][0], 1)


class TestLockPaths(HelperCase):
    def test_a_fifo_at_the_lock_path_is_a_refusal_naming_it(self):
        import core.locks as locks
        server = self.start_fake()
        path = locks.lock_path(transport.parse_url(server.url))
        os.mkfifo(path)
        result = self.run_helper(server)
        self.assertEqual(result.code, 3, result.stdout + result.stderr)
        self.assertIn(f"the lock path {path} for {server.url} is not a regular file",
                      result.summary["problems"][0])
        self.assertNotIn("internal error", result.stdout + result.stderr)
        self.assertEqual(server.state.requests, [])

    def test_a_link_at_the_lock_path_is_a_refusal_naming_it(self):
        import core.locks as locks
        server = self.start_fake()
        path = locks.lock_path(transport.parse_url(server.url))
        os.symlink(os.path.join(self.tmp, "elsewhere"), path)
        result = self.run_helper(server)
        self.assertEqual(result.code, 3, result.stdout + result.stderr)
        self.assertIn(f"the lock path {path} for {server.url} is a link",
                      result.summary["problems"][0])

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"),
                         "needs root to run the helper as another user")
    def test_a_lock_folder_we_may_not_write_says_permission_denied(self):
        server = self.start_fake()
        folder = os.path.join(self.tmp, "locked")
        os.mkdir(folder, 0o755)                       # root's: nobody may not write it
        out = os.path.join(self.tmp, "out")
        os.mkdir(out)
        os.chmod(out, 0o777)                          # the records: nobody may write there
        os.chmod(self.tmp, 0o755)
        # The product copied where nobody may read it: the checkout may be in a private
        # folder (mktemp -d makes it 0700).
        launch = copy_product(os.path.join(self.tmp, "launch"))
        for folder_, dirs, files in os.walk(launch):
            os.chmod(folder_, 0o755)
            for name in files:
                os.chmod(os.path.join(folder_, name), 0o644)
        shown = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             sys.executable, "-I", "-S", os.path.join(launch, "warmup.py"), "--base-url",
             server.url, "--records",
             os.path.join(out, "r.jsonl")], capture_output=True, text=True, timeout=60,
            env=dict(os.environ, WARMUP_LOCK_DIR=folder))
        self.assertEqual(shown.returncode, 2, shown.stdout + shown.stderr)
        self.assertIn("(Permission denied); point WARMUP_LOCK_DIR", shown.stdout + shown.stderr)


if __name__ == "__main__":
    unittest.main()
