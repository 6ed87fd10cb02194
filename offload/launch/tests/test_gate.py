"""The quality gate (gate.py): the scorers called directly, and whole gates against the fake.

Run: python3 -m unittest discover -s offload/launch/tests -p 'test_gate.py' -v
"""

from __future__ import annotations

import json
import random
import re
import time
import unittest

from support import TEXT_MARKER, HelperCase, gate_scrubbed, qualify
import tools.gate as gate  # noqa: E402  (support puts offload/launch on sys.path)

IDENTIFIER = gate.Probe("id", "identifier", "Gullpoint-Labs/Ferry-7B_Instruct.v2")
PASSAGE = gate.Probe("p", "passage", "The quick brown fox jumps over the lazy dog. " * 4)


def dp_distance(a: str, b: str) -> int:
    """The textbook dynamic programme, to check the fast one against."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def reference_fragments() -> list[str]:
    """Strings that would show a reference text leaked: every identifier, every run of four
    words of each passage, and any Cyrillic letter."""
    found = [text for _, text in gate.IDENTIFIERS]
    for passage in (gate.PASSAGE_EN, gate.PASSAGE_RU):
        words = passage.split()
        found += [" ".join(words[i:i + 4]) for i in range(len(words) - 3)]
    return found


FRAGMENTS = reference_fragments()


class TestScorers(unittest.TestCase):
    def test_identifier_exact_after_whitespace_quotes_and_a_period(self):
        ref = IDENTIFIER.reference
        for answer in (ref, f"  {ref}\n", f'"{ref}"', f"'{ref}'", f"`{ref}`", f"{ref}.",
                       f'"{ref}".', f'"{ref}."', f"```\n{ref}\n```",
                       f"Here is the identifier:\n{ref}"):
            with self.subTest(answer=answer):
                self.assertTrue(gate.score_answer(IDENTIFIER, answer, 0.01)["exact"])

    def test_identifier_near_misses_are_misses(self):
        ref = IDENTIFIER.reference
        for answer in (ref.lower(), ref.replace("7B", "7b"), ref.replace("_", "-"),
                       ref + "..", f'""{ref}""', f"{ref} (copied)", ref[:-1], ref + "2",
                       ref.replace("/", " / "), f"The identifier is {ref}"):
            with self.subTest(answer=answer):
                score = gate.score_answer(IDENTIFIER, answer, 0.01)
                self.assertFalse(score["exact"])
                self.assertFalse(score["ok"])
                self.assertGreater(score["edit_distance"], 0)
        near = gate.score_answer(IDENTIFIER, ref.replace("7B", "8B"), 0.01)
        self.assertEqual(near["edit_distance"], 1)
        self.assertEqual(gate.score_problem(IDENTIFIER, near, 0.01),
                         f"not an exact copy (edit distance 1 of {len(ref)} characters)")

    def test_distance_of_known_edits(self):
        cases = [("kitten", "sitting", 3), ("flaw", "lawn", 2), ("", "abc", 3), ("abc", "", 3),
                 ("abc", "abc", 0), ("abc", "abxc", 1), ("abxc", "abc", 1), ("abc", "abd", 1),
                 ("паромщик", "паромшик", 1), ("тетрадь", "тетардь", 2), ("лёд", "лед", 1),
                 ("река", "реками", 2)]
        for a, b, want in cases:
            with self.subTest(a=a, b=b):
                self.assertEqual(gate.levenshtein(a, b), want)
                self.assertEqual(gate.levenshtein(b, a), want)

    def test_distance_matches_the_textbook_programme(self):
        rng = random.Random(7)
        for _ in range(300):
            a = "".join(rng.choice("ab cдж") for _ in range(rng.randint(0, 40)))
            b = "".join(rng.choice("ab cдж") for _ in range(rng.randint(0, 40)))
            self.assertEqual(gate.levenshtein(a, b), dp_distance(a, b), (a, b))

    def test_distance_is_fast_for_two_thousand_characters(self):
        rng = random.Random(3)
        a = "".join(rng.choice("abcdefghij klmnopqrstuvwxyz") for _ in range(2000))
        b = "".join(rng.choice("abcdefghij klmnopqrstuvwxyz") for _ in range(2000))
        started = time.process_time()     # this process's CPU time: another's load is not ours
        gate.levenshtein(a, b)
        self.assertLess(time.process_time() - started, 0.5, "about 10 ms on a quiet machine")

    def test_cer_collapses_whitespace_and_counts_known_edits(self):
        ref = PASSAGE.reference
        spaced = "\n\n" + ref.replace(" ", "  \n ") + "\n"
        self.assertEqual(gate.score_answer(PASSAGE, spaced, 0.01)["cer"], 0.0)
        n = len(gate.collapse(ref))
        for answer, edits in ((ref.replace("quick", "quikc", 1), 2),
                              (ref.replace("fox", "fx", 1), 1),
                              (ref.replace("lazy", "lazzy", 1), 1),
                              (ref.replace("dog", "cat"), 12)):
            with self.subTest(answer=answer[:30]):
                score = gate.score_answer(PASSAGE, answer, 0.01)
                self.assertEqual(score["edit_distance"], edits)
                self.assertAlmostEqual(score["cer"], edits / n, places=5)
        # One typo is one word error: clean means none (unless --max-typos allows it).
        typo = gate.score_answer(PASSAGE, ref.replace("fox", "fx", 1), 0.01)
        self.assertEqual((typo["ok"], typo["word_errors"], typo["reference_words"]),
                         (False, 1, 36))
        self.assertTrue(gate.score_answer(PASSAGE, ref.replace("fox", "fx", 1), 0.01, 1)["ok"])
        bad = gate.score_answer(PASSAGE, ref.replace("dog", "cat"), 0.01)
        self.assertFalse(bad["ok"])
        self.assertEqual(gate.score_problem(PASSAGE, bad, 0.01),
                         "4 word error(s) of 36 words (allowed: 0), CER 0.0670 (bound 0.01; "
                         "edit distance 12 of 179 characters)")

    def test_one_normalization_before_scoring(self):
        ref = "Don't stop - wait... it's \"fine\" caf\u00e9"
        probe = gate.Probe("p", "passage", ref)
        typographic = ("Don\u2019t stop \u2014 wait\u2026 it\u2019s \u201cfine\u201d "
                       "cafe\u0301\n")
        score = gate.score_answer(probe, typographic, 0.01)
        self.assertEqual((score["ok"], score["word_errors"], score["edit_distance"]),
                         (True, 0, 0))
        inserted = gate.score_answer(probe, ref.replace("wait...", "wait wait..."), 0.01)
        deleted = gate.score_answer(probe, ref.replace(" stop", ""), 0.01)
        self.assertEqual((inserted["word_errors"], deleted["word_errors"]), (1, 1))

    def test_a_preamble_is_counted_not_scored(self):
        ref = PASSAGE.reference
        plan = "Okay, I will copy the text exactly as it is given."
        score = gate.score_answer(PASSAGE, f"{plan}\n\n{ref}", 0.01)
        self.assertEqual((score["ok"], score["word_errors"], score["preamble_chars"]),
                         (True, 0, len(plan)))
        garbled = gate.score_answer(PASSAGE, f"{plan}\n\n{ref.replace('lazy', 'lacy')}", 0.01)
        self.assertFalse(garbled["ok"], "a preamble never makes a typo pass")
        ident = IDENTIFIER.reference
        found = gate.score_answer(IDENTIFIER, f"{plan}\n{ident}", 0.01)
        self.assertEqual((found["ok"], found["preamble_chars"]), (True, len(plan)))
        last_line = gate.score_answer(IDENTIFIER, f"{plan}\n{ident[:-1]}3", 0.01)
        self.assertEqual((last_line["ok"], last_line["preamble_chars"]), (False, len(plan)))
        self.assertEqual(last_line["edit_distance"], 1, "the last line is the copy scored")

    def test_cer_of_a_russian_passage(self):
        probe = gate.Probe("ru", "passage", "Паром ходит с мая до заморозков.")
        score = gate.score_answer(probe, "Паром ходит с мая до замарозков.", 0.01)
        self.assertEqual(score["edit_distance"], 1)
        self.assertEqual(score["reference_chars"], 32)

    def test_empty_answers_fail_as_empty(self):
        for probe in (IDENTIFIER, PASSAGE):
            for answer in ("", "  \n ", "``````", '""'):
                with self.subTest(probe=probe.kind, answer=answer):
                    score = gate.score_answer(probe, answer, 0.01)
                    self.assertFalse(score["ok"])
                    if probe.kind == "passage" and answer.strip() in ("",):
                        self.assertEqual(score["cer"], 1.0)
        self.assertTrue(gate.score_problem(
            PASSAGE, gate.score_answer(PASSAGE, "", 0.01), 0.01).startswith("empty answer"))

    def test_wrappers_are_removed_and_named(self):
        ref = PASSAGE.reference.strip()
        for answer, removed in ((f"```text\n{ref}\n```", ["code fence"]),
                                (f"Here is the exact text:\n\n{ref}", ["intro line"]),
                                (f"Sure:\n```\n{ref}\n```\n", ["intro line", "code fence"]),
                                (ref, [])):
            with self.subTest(removed=removed):
                score = gate.score_answer(PASSAGE, answer, 0.01)
                self.assertEqual(score["removed"], removed)
                self.assertEqual(score["edit_distance"], 0)
        # A long first line is text, not an introduction: it stays and is scored.
        long_line = "x" * 200 + ":\n" + ref
        self.assertEqual(gate.score_answer(PASSAGE, long_line, 0.01)["removed"], [])
        # An answer that is only an introduction keeps it (nothing else would be left).
        self.assertEqual(gate.unwrap("Here it is:")[1], [])

    def test_server_messages_lose_the_probe_text(self):
        ident = gate.IDENTIFIERS[3][1]
        said = gate_scrubbed(
            f"bad request near {ident}: 'The weather station on Gull Point was built' at 3")
        self.assertNotIn(ident, said)
        self.assertNotIn("weather station", said)
        self.assertIn("bad request near [redacted]", said)

    def test_probes_are_the_ones_promised(self):
        self.assertEqual([p.kind for p in gate.PROBES].count("identifier"), 6)
        joined = "".join(text for _, text in gate.IDENTIFIERS)
        for char in "-_./:":
            self.assertIn(char, joined)
        self.assertTrue(re.search(r"[a-z]", joined) and re.search(r"[A-Z]", joined)
                        and re.search(r"[0-9]", joined))
        for passage in (gate.PASSAGE_EN, gate.PASSAGE_RU):
            self.assertTrue(280 <= len(passage.split()) <= 340, len(passage.split()))
        self.assertTrue(re.search("[а-я]", gate.PASSAGE_RU))


class TestGateRuns(HelperCase):
    runs_long = 7                         # seconds on a quiet run: run.py starts it early
    def gate(self, server, *args: str):
        return self.run_argv(["gate", "--base-url", server.url, "--records", self.records_path,
                              "--deadline-s", "20", *args], main=qualify.main)

    def assert_nothing_copied_out(self, result):
        """No answer, reference text or fake marker in stdout, stderr or the records."""
        self.assert_clean(None, result)
        for text in (result.stdout, result.stderr, result.records_text):
            self.assertNotIn(TEXT_MARKER, text)
            self.assertIsNone(re.search("[а-яё]", text, re.IGNORECASE), "Cyrillic leaked")
            for fragment in FRAGMENTS:
                self.assertNotIn(fragment, text)

    def gate_records(self, result) -> dict:
        return {(r["shape"], r["probe"], r["engine"]): r for r in result.kind("gate")}

    def test_a_faithful_model_passes_and_json_is_the_gate_summary(self):
        server = self.start_fake()
        result = self.gate(server, "--json")
        self.assertEqual(result.code, 0, result.stderr)
        shown = json.loads(result.stdout)
        self.assertEqual(shown["record"], "gate_summary")
        self.assertEqual((shown["verdict"], shown["exit_code"]), ("pass", 0))
        self.assertEqual(shown["identifiers_exact"], {"alone": "6/6", "batched": "6/6"})
        self.assertEqual(shown["worst_cer"], 0.0)
        self.assertEqual(shown["problems"], [])
        self.assertEqual(result.kind("gate_summary"), [shown])
        self.assertEqual(result.summary["verdict"], "pass")
        self.assertEqual(result.summary["identifiers_exact"], shown["identifiers_exact"])
        records = self.gate_records(result)
        self.assertEqual(len(records), 16)
        first = records[("alone", "passage_ru", None)]
        for key in ("probe", "kind", "shape", "engine", "http_status", "finish_reason",
                    "completion_tokens", "reasoning_tokens", "exact", "edit_distance",
                    "reference_chars", "answer_chars", "cer", "ok", "problems"):
            self.assertIn(key, first)
        self.assertEqual((first["cer"], first["edit_distance"], first["finish_reason"]),
                         (0.0, 0, "stop"))
        self.assertIsNone(first["reasoning_tokens"])
        self.assertTrue(records[("batched", "id_flag", None)]["exact"])
        # The alone probes went one at a time; the batch all together, after the barrier.
        chats = [r for r in server.state.requests if r["path"] == "/v1/chat/completions"]
        self.assertEqual(len(chats), 16)
        body = chats[0]["body"]
        self.assertEqual((body["temperature"], body["seed"], body["max_tokens"]),
                         (0, gate.GATE_SEED, gate.GATE_MAX_TOKENS))
        batch = chats[8:]
        self.assertLess(max(r["arrived"] for r in chats[:8]), min(r["arrived"] for r in batch))
        self.assertEqual({e["body"]["request_id"].split("-")[-2] for e in batch}, {"batched"})
        self.assertIn("alone   passage_ru", result.stderr)
        self.assertIn("PASS (exit 0)", result.stderr)
        self.assert_nothing_copied_out(result)

    def test_raw_completions_for_base_models(self):
        server = self.start_fake()
        result = self.gate(server, "--endpoint", "completions")
        self.assertEqual(result.code, 0, result.stdout)
        sent = [r["body"] for r in server.state.completions()]
        self.assertEqual(len(sent), 16)
        self.assertEqual(sent[0]["stop"], ["</text>"])
        self.assertIn("gate: pass; identifiers exact: alone 6/6, batched 6/6", result.stdout)
        self.assert_nothing_copied_out(result)

    def test_typos_fail_naming_probe_shape_and_figures(self):
        server = self.start_fake(copy="typos")
        result = self.gate(server, "--json")
        self.assertEqual(result.code, 1)
        shown = json.loads(result.stdout)
        self.assertEqual(shown["verdict"], "fail")
        self.assertEqual(shown["identifiers_exact"], {"alone": "5/6", "batched": "5/6"})
        self.assertGreater(shown["worst_cer"], 0.01)
        problems = "\n".join(shown["problems"])
        self.assertIn("2 requests (alone id_version#4, batched id_version#4): not an exact "
                      "copy (edit distance 1 of", problems)
        self.assertRegex(problems, r"batched passage_en#6: \d+ word error\(s\) of \d+ words "
                                   r"\(allowed: 0\), CER 0\.0\d+ \(bound 0\.01; edit "
                                   r"distance \d+ of \d+ characters\)")
        self.assertIn("(alone passage_ru#7, batched passage_ru#7): ", problems)
        records = self.gate_records(result)
        self.assertTrue(records[("alone", "passage_en", None)]["ok"],
                        "the English passage is garbled only in the batch")
        self.assertFalse(records[("batched", "passage_en", None)]["ok"])
        self.assertRegex(result.stderr, r"batched passage_en +\d+ typos, CER 0\.0\d+")
        self.assert_nothing_copied_out(result)

    def test_one_typo_fails_the_gate(self):
        server = self.start_fake(copy="onetypo")
        result = self.gate(server, "--json")
        self.assertEqual(result.code, 1, result.stderr)
        shown = json.loads(result.stdout)
        self.assertEqual(shown["identifiers_exact"], {"alone": "6/6", "batched": "6/6"})
        self.assertEqual(shown["worst_typos"], 1)
        self.assertLess(shown["worst_cer"], 0.01, "a CER bound alone would have passed it")
        failed = {(r["shape"], r["probe"]) for r in result.kind("gate") if not r["ok"]}
        self.assertEqual(failed, {("alone", "passage_en"), ("batched", "passage_en")})
        self.assertEqual(self.run_argv(["gate", "--base-url", server.url, "--records",
                                        self.records_path, "--append", "--max-typos", "1"],
                                       main=qualify.main).code, 0)
        self.assert_nothing_copied_out(result)

    def test_a_plan_before_each_answer_passes_and_is_named(self):
        server = self.start_fake(copy="preamble")
        result = self.gate(server, "--json")
        self.assertEqual(result.code, 0, result.stderr)
        shown = json.loads(result.stdout)
        self.assertEqual(len(shown["preambles"]), 16)
        self.assertIn("preamble before the answer in 16 probe(s)", result.stderr)
        self.assertTrue(all(r["preamble_chars"] > 0 for r in result.kind("gate")))
        self.assertIn("a preamble of", result.stderr)
        self.assert_nothing_copied_out(result)

    def test_garbage_fails(self):
        server = self.start_fake(copy="garbage")
        result = self.gate(server)
        self.assertEqual(result.code, 1)
        self.assertFalse(any(r["ok"] for r in result.kind("gate")))
        self.assertIn("identifiers exact: alone 0/6, batched 0/6", result.stdout)
        self.assert_nothing_copied_out(result)

    def test_a_chat_template_error_says_what_to_do(self):
        server = self.start_fake(fault="chat_template")
        result = self.gate(server)
        self.assertEqual(result.code, 1)
        problem = result.kind("gate")[0]["problems"][0]
        self.assertIn("could not apply its chat template (HTTP 400)", problem)
        self.assertIn("--endpoint completions", problem)
        self.assert_nothing_copied_out(result)

    def test_reasoning_that_used_every_token_fails_with_the_reason(self):
        server = self.start_fake(fault="reasoning_exhausted", fault_match="passage_en")
        result = self.gate(server, "--max-tokens", "300")
        self.assertEqual(result.code, 1)
        record = self.gate_records(result)[("alone", "passage_en", None)]
        self.assertEqual((record["reasoning_tokens"], record["finish_reason"]), (300, "length"))
        self.assertIn("empty answer: the model spent its 300 completion tokens on reasoning",
                      record["problems"][0])
        self.assertIn("raise --max-tokens (now 300)", record["problems"][0])
        self.assertIn("enable_thinking", record["problems"][0])
        self.assert_nothing_copied_out(result)

    def test_template_kwargs_are_passed_through(self):
        server = self.start_fake()
        result = self.gate(server, "--chat-template-kwargs", '{"enable_thinking": false}')
        self.assertEqual(result.code, 0, result.stdout)
        body = [r for r in server.state.requests if r["path"] == "/v1/chat/completions"][0]
        self.assertEqual(body["body"]["chat_template_kwargs"], {"enable_thinking": False})

    def test_busy_server_is_refused_and_nothing_is_sent(self):
        server = self.start_fake(gauge_values={("vllm:num_requests_running", "0"): 2.0})
        result = self.gate(server, "--json")
        self.assertEqual(result.code, 3)
        self.assertEqual(json.loads(result.stdout)["verdict"], "refused")
        self.assertFalse([r for r in server.state.requests if r["path"].startswith("/v1/chat")])

    def test_every_engine_is_gated(self):
        server = self.start_fake(engines=2)
        result = self.gate(server, "--json")
        self.assertEqual(result.code, 0, result.stderr)
        self.assertEqual(len(result.kind("gate")), 32)
        self.assertEqual({r["engine"] for r in result.kind("gate")}, {0, 1})
        self.assertEqual(json.loads(result.stdout)["identifiers_exact"],
                         {"alone": "12/12", "batched": "12/12"})

    def test_usage_errors_and_help(self):
        for args in (["--chat-template-kwargs", "[1]"], ["--max-cer", "2"],
                     ["--endpoint", "responses"],
                     ["--endpoint", "completions", "--chat-template-kwargs", "{}"]):
            with self.subTest(args=args):
                result = self.run_argv(["gate", *args], main=qualify.main)
                self.assertEqual(result.code, 2)
                self.assertNotIn("Traceback", result.stderr)
                self.assertEqual(len(result.stderr.strip().splitlines()[-1:]), 1)
        shown = self.run_argv(["gate", "--help"], main=qualify.main)
        self.assertEqual(shown.code, 0)
        for text in ("what it proves, and what it cannot", "random or wrong", "exact copying",
                     "identifiers_exact"):
            self.assertIn(text, shown.stdout)
        for command in ("report", "probe"):
            self.assertEqual(self.run_argv([command, "--help"], main=qualify.main).code, 0)


if __name__ == "__main__":
    unittest.main()
