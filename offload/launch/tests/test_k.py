"""K1's k by batch size, as `qualify.py report --expect-k` reads it: the fake drafts by how
many requests run (a schedule such as K1's 5 at batch 1-2 and 4 at 3-4), a wave that ends
at a smaller batch has tails at that batch's k, and ngram drafts at most k."""

from __future__ import annotations

import argparse
import unittest

from support import HelperCase, qualify
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
        for depth, drafted, holds in ((3, 4.111, True), (3, 4.0, True), (3, 5.0, False),
                                      (3, 4.6, False), (1, 4.0, False), (2, 4.6, True),
                                      (2, 4.5, False), (4, 3.6, True), (4, 3.5, False)):
            with self.subTest(depth=depth, drafted=drafted):
                wave = {"wave": f"B{depth}", "depth": depth, "engine": None,
                        "spec_decode": {"drafts": 10, "drafted_length": drafted}}
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
                                           rf"drafts 5\)")
        self.assertIn("expect-k B1: drafted length 5, k 5: holds", shown.stdout)
        # The same file read by wave with the old rule: the tails read as a wrong k.
        self.assertEqual(self.report("--expect-k", "B1=5,B2=5,B3=4,B4=4").code, 1)

    def test_a_wrong_schedule_is_not_explained_by_tails(self):
        self.warm(spec_schedule=K1)
        for wrong in ("1-4:5", "1-2:5,3-4:3"):
            with self.subTest(expect=wrong):
                shown = self.report("--expect-k", wrong)
                self.assertEqual(shown.code, 1, shown.stdout)
                self.assertRegex(shown.stdout, r"expect-k B3: drafted length 4\.\d+, k \d: "
                                               r"DIFFERS")

    def test_a_flat_k_5_differs_at_b3_and_b4(self):
        self.warm(spec_schedule=((1, 4, 5),))
        shown = self.report("--expect-k", "1-2:5,3-4:4")
        self.assertEqual(shown.code, 1)
        self.assertIn("expect-k B3: drafted length 5, k 4: DIFFERS", shown.stdout)
        self.assertIn("expect-k B4: drafted length 5, k 4: DIFFERS", shown.stdout)
        self.assertIn("expect-k B2: drafted length 5, k 5: holds", shown.stdout)

    def test_a_flat_k_4_differs_at_b1_and_b2(self):
        self.warm(spec_schedule=((1, 4, 4),))
        shown = self.report("--expect-k", "1-2:5,3-4:4")
        self.assertEqual(shown.code, 1)
        self.assertIn("expect-k B1: drafted length 4, k 5: DIFFERS", shown.stdout)
        self.assertIn("expect-k B2: drafted length 4, k 5: DIFFERS", shown.stdout)
        self.assertIn("it counts 4 draft positions: its k is 4, not 5", shown.stdout)

    def test_ngram_drafts_less_and_holds_by_its_rule(self):
        self.warm(spec_schedule=((1, 4, 5),), spec_method="ngram")
        exact = self.report("--expect-k", "1-4:5")
        self.assertEqual(exact.code, 1, "ngram's short drafts do not hold as exact k")
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
