"""K1's k by batch size, as `qualify.py report --expect-k` reads it: the fake drafts by how
many requests run (a schedule such as K1's 5 at batch 1-2 and 4 at 3-4), a wave that ends
at a smaller batch has tails at that batch's k, and ngram drafts at most k."""

from __future__ import annotations

import argparse
import unittest

from support import HelperCase, qualify
import core.records as records  # noqa: E402
import tools.report as report  # noqa: E402  (support puts offload/launch on sys.path)

K1 = ((1, 2, 5), (3, 4, 4))


class TestExpectKGrammar(unittest.TestCase):
    def test_both_forms_and_their_errors(self):
        self.assertEqual(report.expect_k_type("1-2:5,3-4:4"),
                         {"batch": {1: 5, 2: 5, 3: 4, 4: 4}})
        self.assertEqual(report.expect_k_type("B1=5,B3=4"), {"wave": {"B1": 5, "B3": 4}})
        for bad in ("1-2:5,2-3:4", "0-2:5", "1-2:x", "B1=5,B1=4", "1-2:65", "x:5"):
            with self.subTest(bad=bad), self.assertRaises(argparse.ArgumentTypeError):
                report.expect_k_type(bad)

    def test_the_rule_on_figures(self):
        k1 = {"batch": {1: 5, 2: 5, 3: 4, 4: 4}}
        # 54: under k is evidence (tails, smaller shapes), not failure; only more than any
        # k the wave's batch sizes allow differs.
        for depth, drafted, holds in ((3, 4.111, True), (3, 4.0, True), (3, 5.0, False),
                                      (3, 5.2, False), (1, 4.0, True), (2, 4.6, True),
                                      (2, 4.5, True), (4, 3.6, True), (4, 3.5, True),
                                      (1, 5.1, False)):
            with self.subTest(depth=depth, drafted=drafted):
                wave = records.typed({"record": "wave", "wave": f"B{depth}", "depth": depth,
                                      "engine": None,
                                      "spec_decode": {"drafts": 10, "drafted_length": drafted}})
                (found,) = report.drafted_findings([wave], k1)
                self.assertIs(found["holds"], holds, found["said"])


class TestKByBatchSize(HelperCase):
    def report(self, *args: str):
        return self.run_argv(["report", self.records_path, *args], main=qualify.main)

    def warm(self, **fake) -> None:
        server = self.start_fake(latency_s=0.05, **fake)
        self.assertEqual(self.run_helper(server).code, 0)

    def test_k1_with_its_tails_holds(self):
        self.warm(spec_schedule=K1)
        shown = self.report("--expect-k", "1-2:5,3-4:4")
        self.assertEqual(shown.code, 0, shown.stdout)
        for wave in ("B3", "B4"):
            self.assertRegex(shown.stdout, rf"expect-k {wave}: drafted length 4\.\d+, k 4: "
                                           rf"holds, explained by tails \(a smaller batch "
                                           rf"drafts 5: about \d+% of its steps\)")
        self.assertIn("expect-k B1: drafted length 5, k 5: holds", shown.stdout)
        # The same file read by wave: no tails to explain B3's, more than its k 4.
        self.assertEqual(self.report("--expect-k", "B1=5,B2=5,B3=4,B4=4").code, 1)

    def test_short_drafts_are_evidence_and_only_a_larger_k_or_another_server_k_fails(self):
        self.warm(spec_schedule=K1)
        flat = self.report("--expect-k", "1-4:5")      # K1's largest k is 5: it holds
        self.assertEqual(flat.code, 0, flat.stdout)
        self.assertRegex(flat.stdout, r"expect-k B3: drafted length 4\.\d+, k 5: holds as "
                                      r"evidence, \d+% under k")
        tails = self.report("--expect-k", "1-2:5,3-4:3")   # its tail share said, evidence
        self.assertEqual(tails.code, 0, tails.stdout)
        self.assertRegex(tails.stdout, r"expect-k B3: drafted length 4\.\d+, k 3: holds, "
                                       r"explained by tails \(a smaller batch drafts 5: about "
                                       r"\d+% of its steps\)")
        other = self.report("--expect-k", "1-4:4")          # the server's own k is 5
        self.assertEqual(other.code, 1, other.stdout)
        self.assertIn("it counts 5 draft positions: its k is 5, not 4", other.stdout)
        self.assertRegex(other.stdout, r"expect-k B1: drafted length 5, k 4: DIFFERS")

    def test_a_flat_k_5_differs_at_b3_and_b4(self):
        self.warm(spec_schedule=((1, 4, 5),))
        shown = self.report("--expect-k", "1-2:5,3-4:4")
        self.assertEqual(shown.code, 1)
        self.assertIn("expect-k B3: drafted length 5, k 4: DIFFERS", shown.stdout)
        self.assertIn("expect-k B4: drafted length 5, k 4: DIFFERS", shown.stdout)
        self.assertIn("expect-k B2: drafted length 5, k 5: holds", shown.stdout)

    def test_a_flat_k_4_is_caught_by_the_server_s_k(self):
        self.warm(spec_schedule=((1, 4, 4),))
        shown = self.report("--expect-k", "1-2:5,3-4:4")
        self.assertEqual(shown.code, 1)
        self.assertIn("expect-k B1: drafted length 4, k 5: holds as evidence", shown.stdout)
        self.assertIn("it counts 4 draft positions: its k is 4, not 5", shown.stdout,
                      "what fails: the server's own k")

    def test_ngram_drafts_less_and_holds_by_its_rule(self):
        self.warm(spec_schedule=((1, 4, 5),), spec_method="ngram")
        exact = self.report("--expect-k", "1-4:5")
        self.assertEqual(exact.code, 0, "ngram's short drafts are evidence under mtp's rule")
        self.assertIn("holds as evidence", exact.stdout)
        shown = self.report("--expect-k", "1-4:5", "--proposer", "ngram")
        self.assertEqual(shown.code, 0, shown.stdout)
        self.assertRegex(shown.stdout, r"expect-k B3: drafted length 3(\.\d+)?, k 5 \(ngram: "
                                       r"at most 5\): holds")

    def test_an_ngram_server_started_with_k_3_is_caught(self):
        self.warm(spec_schedule=((1, 4, 3),), spec_method="ngram")
        shown = self.report("--expect-k", "1-4:5", "--proposer", "ngram")
        self.assertEqual(shown.code, 1)
        self.assertIn("it counts 3 draft positions: its k is 3, not 5", shown.stdout)


if __name__ == "__main__":
    unittest.main()
