"""Say only what is true: documents against the code, messages against behaviour.

The exit-code tables of CONTRACT.md and --help are checked against the code's
constants, and every table is in CONTRACT.md once; the rest drives each claim (every
exit says what it read, a long batch says it still runs) through a real run or process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from support import (PYTHON, FAKE, LAUNCH, QUALIFY, REPO, WARMUP, HelperCase, SilentServer,
                     qualify, run_main, warmup)
import core.cli as cli  # noqa: E402  (support puts offload/launch on sys.path)
import core.kinds as kinds  # noqa: E402
import core.transport as transport  # noqa: E402
import core.status_files as status_files  # noqa: E402

CONTRACT = os.path.join(LAUNCH, "CONTRACT.md")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def table_codes(markdown: str, heading: str) -> set[int]:
    """Every number in the first column of the table under `heading`."""
    section = markdown[markdown.index(heading):]
    section = section[:section.index("\n#", 1)] if "\n#" in section[1:] else section
    codes = set()
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| code"):
            codes |= {int(n) for n in re.findall(r"\b\d+\b", line.split("|")[1])}
    return codes


def code_constants() -> set[int]:
    """What the helper and its wrapper can exit with, from the code."""
    signals = {128 + getattr(signal, name) for name in ("SIGHUP", "SIGINT", "SIGTERM")}
    return {cli.EXIT_PASS, cli.EXIT_FAIL, cli.EXIT_USAGE, cli.EXIT_REFUSED,
            cli.EXIT_INTERRUPTED, cli.EXIT_TERMINATED, 124, 137} | signals


class TestDocumentsMatchTheCode(unittest.TestCase):
    def test_exit_code_tables_match_the_constants(self):
        expected = code_constants()
        self.assertEqual(cli.EXIT_TERMINATED, 128 + signal.SIGTERM)
        self.assertEqual(cli.EXIT_INTERRUPTED, 128 + signal.SIGINT)
        contract_codes = table_codes(read(CONTRACT), "## 9. Exit status")
        self.assertEqual(contract_codes - {128}, expected)     # "128 + N" names the rule
        epilog = warmup.EPILOG[warmup.EPILOG.index("exit status:"):]
        help_codes = {int(n) for n in re.findall(r"^\s+(\d+(?:/\d+)*)", epilog, re.M)
                      for n in n.split("/")}
        self.assertEqual(help_codes, expected)

    def test_the_commands_sharing_the_warm_ups_codes_point_to_its_table(self):
        for command in ("probe", "gate", "report"):
            with self.subTest(command=command):
                help_text = " ".join(subprocess.run(
                    [sys.executable, "-I", "-S", QUALIFY, command, "--help"],
                    capture_output=True, text=True, timeout=30).stdout.split())
                self.assertIn("warmup.py --help's table", help_text)
                self.assertNotRegex(help_text, r"\b(124|137|143)\b", "a second exit table")

    def test_the_patch_note_s_facts_are_said(self):
        # 54: what the note states stays in the docs, whatever the word cap cuts.
        docs = " ".join((read(os.path.join(REPO, "README.md")) + read(CONTRACT)).split())
        for fact in ("5.629 s", "5,041 prompt tokens", "explicit max 32", "default min 0",
                     "`ignore_eos` false", "no explicit stop", "stop IDs merged",
                     "not a confirmed cause", "`dsv41.env` and start.sh hashes",
                     "manage.py restore and service changes are the coordinator's",
                     "`num_spec_steps`", "`drafted_requests`", "1024-round",
                     "| skew |", "| observed depth |", "| drafted length |",
                     "not the method", "long-context attention"):
            with self.subTest(fact=fact):
                self.assertIn(fact, docs)

    def test_each_table_is_in_the_contract_only(self):
        readme = read(os.path.join(REPO, "README.md"))
        contract = read(CONTRACT)
        for header in ("| code | meaning |", "| wave | requests per engine", "| fault | exit |",
                       "| kind | fields"):
            with self.subTest(table=header):
                self.assertEqual(contract.count(header), 1, header)
                self.assertNotIn(header, readme)
        self.assertLessEqual(len(readme.splitlines()), 250, "the README is the operator's page")
        self.assertLessEqual(len((readme + contract).split()), 6000, "plain words: README and "
                                                                      "CONTRACT together")

    def test_start_sh_exit_codes_are_in_the_contract(self):
        help_text = subprocess.run(["bash", os.path.join(REPO, "start.sh"), "--help"],
                                   capture_output=True, text=True, timeout=30).stdout
        codes = {int(n) for n in re.findall(r"^\s+(\d+)\s", help_text[help_text.index(
            "exit status:"):], re.M)}
        self.assertEqual(codes, {0, 1, 2, 129, 130, 143})
        self.assertIn("start.sh: 0 server up (OK or WARN), 1 server not started or not "
                      "trustworthy, 2 usage error, 129 / 130 / 143 interrupted",
                      read(CONTRACT).replace("\n", " "))

    def test_no_file_a_reader_cannot_open_is_cited(self):
        for root, _, files in os.walk(REPO):
            if ".git" in root or "__pycache__" in root:
                continue
            for name in files:
                if not name.endswith((".py", ".md", ".sh")) and name != "run":
                    continue
                text = read(os.path.join(root, name))
                for cited in ("SPEC" + ".md", "../" + "shared", "VLLM" + "_FACTS"):
                    self.assertNotIn(cited, text, f"{name} cites {cited}")

    def test_limits_and_client_concurrency_are_said_everywhere(self):
        help_text = warmup.build_parser().format_help()
        for text in (help_text, read(os.path.join(REPO, "README.md")), read(CONTRACT)):
            flat = " ".join(text.split())
            self.assertIn("client concurrency", flat)
            self.assertIn("long-context attention", flat)
            self.assertIn("every verification depth" if "every verification" in flat
                          else "every speculative verification depth", flat)
            self.assertIn("B6/B8", flat)
            self.assertNotIn("generation_config.json end such a request", flat)

    def test_one_token_problem_names_what_the_response_showed_not_a_cause(self):
        fields = {"http_status": 200, "body_error": None, "n_choices": 1, "usage": True,
                  "prompt_tokens": 10, "cached_tokens": None, "completion_tokens": 1,
                  "finish_reason": "length", "stop_reason": None}
        problems = kinds.judge(fields, kinds.KINDS["greedy"], 32)
        self.assertEqual(problems, ["one-token response: completion_tokens 1 (finish_reason "
                                    "'length', stop_reason null)"])
        self.assertNotIn("EOS", " ".join(problems))


class TestBenchSaysWhatItDoes(unittest.TestCase):
    """The benchmark is not run here (it is not a timed test); what it claims is checked."""

    def bench(self):
        spec = importlib.util.spec_from_file_location(
            "bench_run", os.path.join(REPO, "bench", "run.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_run"] = module              # dataclasses look their module up
        self.addCleanup(sys.modules.pop, "bench_run", None)
        spec.loader.exec_module(module)
        return module

    def test_a_breakdown_step_is_never_negative(self):
        bench = self.bench()
        self.assertEqual(bench.fmt_part("the rest", -0.0253), "the rest 0 ms (within noise)")
        self.assertEqual(bench.fmt_part("imports", 0.0211), "imports 21.1 ms")
        self.assertEqual(bench.fmt_part("run", -10, unit="KiB"), "run +0 MiB (within noise)")

    def test_its_baselines_run_where_the_wrapper_runs_the_helper(self):
        bench = self.bench()
        path, how = bench.write_wrapper_copy(self.enterContext(tempfile.TemporaryDirectory()))
        self.assertEqual(how, "a copy of warmup_serve.sh")
        command, env = bench.Shapes(path).wrapped("print('the baseline ran')")
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((done.returncode, done.stdout, done.stderr), (0, "the baseline ran\n", ""))

    def test_the_figures_are_written_by_the_bench(self):
        bench = self.bench()
        path = os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "RESULTS.md")
        rows = [bench.row("readiness probe", "70.0 ms vs 14.0 ms", "5.00", "≤ 1.3", False)]
        bench.write_results(path, "machine: 2 cores", rows, "bench took 1 s", quick=False)
        text = read(path)
        self.assertIn("Written by `python3 bench/run.py`", text)
        self.assertIn("| readiness probe | 70.0 ms vs 14.0 ms | 5.00 | ≤ 1.3 | MISSED |", text)
        help_text = subprocess.run([sys.executable, os.path.join(REPO, "bench", "run.py"),
                                    "--help"], capture_output=True, text=True, timeout=30).stdout
        self.assertIn("bench/RESULTS.md", help_text)
        self.assertIn("bench/RESULTS.md", read(os.path.join(REPO, "README.md")))


class TestMessages(HelperCase):
    def test_option_errors_name_the_option_once_and_no_function(self):
        for args, said in ((["--deadline-s", "1e10"], "argument --deadline-s: must be a number "
                                                      "of seconds greater than 0 and at most "
                                                      "3600, got '1e10'"),
                           (["--tokens", "x"], "argument --tokens: must be a whole number from "
                                               "2 to 32, got 'x'"),
                           (["--waves", "2"], "argument --waves: must start with 1")):
            with self.subTest(args=args):
                result = self.run_argv([*args, "--dry-run"])
                self.assertEqual(result.code, 2)
                self.assertIn(said, result.stderr)
                self.assertNotIn("invalid", result.stderr)
                self.assertEqual(result.stderr.count(args[0]), 2, "usage line and error only")

    def test_json_on_a_usage_error_still_prints_json(self):
        result = self.run_argv(["--json", "--deadline-s", "0"])
        self.assertEqual(result.code, 2)
        self.assertEqual(json.loads(result.stdout)["exit_code"], 2)
        dry = json.loads(self.run_argv(["--json", "--dry-run", "--deadline-s", "30"],
                                       env={"WARMUP_HARD_S": "40"}).stdout)
        self.assertEqual(dry["hard_bound_s"], 40.0)

    def test_json_summary_names_the_records(self):
        server = self.start_fake(model="a")
        result = self.run_helper(server, "--json", "--model", "b")
        self.assertEqual(result.code, 2)
        self.assertEqual(json.loads(result.stdout)["records"], self.records_path)

    def test_a_base_url_with_a_path_names_the_url_it_asked(self):
        server = self.start_fake()
        result = self.run_helper(server.url + "/foo")
        self.assertEqual(result.code, 2)
        self.assertIn(f"GET {server.url}/foo/health answered HTTP 404",
                      result.summary["problems"][0])
        self.assertIn("with no extra path", result.summary["problems"][0])

    def test_a_run_after_a_cut_line_starts_on_a_fresh_line(self):
        with open(self.records_path, "w", encoding="utf-8") as handle:
            handle.write('{"record": "request", "wave": "B2"')          # a kill cut it here
        server = self.start_fake()
        with contextlib.redirect_stdout(io.StringIO()):
            code = warmup.main(["--base-url", server.url, "--records", self.records_path,
                                "--append"])
        self.assertEqual(code, 0)
        lines = read(self.records_path).splitlines()
        self.assertEqual(lines[0], '{"record": "request", "wave": "B2"')
        self.assertEqual(json.loads(lines[1])["record"], "run")

    def test_missing_status_file_is_said_and_waited_for_once(self):
        server = self.start_fake()
        missing = os.path.join(self.tmp, "missing.json")
        started = time.monotonic()
        result = self.run_helper(server, "--status-file", missing, "--status-wait-s", "0.6")
        elapsed = time.monotonic() - started
        self.assertEqual(result.code, 0, result.stdout)
        self.assertIn(f"waiting up to 0.6 s for {missing} to be rewritten", result.stdout)
        self.assertEqual(result.stdout.count("waiting up to"), 1)
        self.assertLess(elapsed, 10, "waited once for 0.6 s, not the 15 s default, nor twice")
        (status,) = result.kind("status")
        self.assertIn("not waited for again", status["why"])

    def test_status_file_without_identity_is_unverified(self):
        result = status_files.status_delta({"steps": 1}, {"steps": 4})
        self.assertEqual((result["state"], result["delta"]), ("unverified", {"steps": 3}))
        self.assertIn("no identity field", result["why"])
        self.assertEqual(status_files.status_delta({"pid": 1, "steps": 1},
                                             {"pid": 1, "steps": 4})["state"], "valid")

    def test_the_fake_writes_a_float_as_prometheus_client_does(self):
        # floatToGoString: repr with every digit, Go's exponent past six digits before the
        # point (a process start cut to 0.1 s could read later than the process began).
        from fake_vllm import go_float
        for value, written in ((1796411141.52, "1.79641114152e+09"), (1e9, "1e+09"),
                               (1796411141.0, "1.796411141e+09"), (123.5, "123.5")):
            self.assertEqual(go_float(value), written)

    def test_fake_on_a_busy_port_says_one_line(self):
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            proc = subprocess.run([*PYTHON, FAKE, "--port", str(port)],
                                  capture_output=True, text=True, timeout=30)
        self.assertEqual(proc.returncode, 2)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
        self.assertIn(f"cannot listen on 127.0.0.1:{port}", proc.stderr)


class TestEveryExitSaysWhatItRead(HelperCase):
    def run_program(self, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
        """warmup.py or qualify.py ARGV, answered by its main() in this process."""
        main = warmup.main if argv[0] == WARMUP else qualify.main
        return run_main(main, *argv[1:], env=env)

    def test_json_prints_its_object_when_records_cannot_be_written(self):
        server = self.start_fake()
        unwritable = os.path.join(self.tmp, "dir")
        os.makedirs(unwritable)
        for argv in ([WARMUP], [QUALIFY, "probe"], [QUALIFY, "gate"]):
            with self.subTest(argv[-1]):
                proc = self.run_program(*argv, "--base-url", server.url, "--records",
                                        unwritable, "--json")
                self.assertEqual(proc.returncode, 2, proc.stderr)
                doc = json.loads(proc.stdout)
                self.assertEqual((doc["verdict"], doc["exit_code"]), ("fail", 2))
                self.assertIn("cannot write records", doc["problems"][0])

    def test_a_bad_variable_is_named_as_the_variable(self):
        for name, value, flag in (("WARMUP_ENGINES", "zero", "--engines"),
                                  ("WARMUP_BASE_URL", "ftp://nowhere", "--base-url")):
            with self.subTest(name):
                proc = self.run_program(WARMUP, "--dry-run", env={name: value})
                self.assertEqual(proc.returncode, 2)
                self.assertIn(name, proc.stderr)
                self.assertNotIn(f"argument {flag}", proc.stderr)
                given = self.run_program(WARMUP, "--dry-run", flag, value)
                self.assertEqual(given.returncode, 2)
                self.assertIn(flag, given.stderr)

    def test_usage_counts_that_are_text_are_named_not_quoted(self):
        counts, problems = __import__("core.vllm_client").vllm_client.read_usage(
            {"prompt_tokens": "MARKER-IN-A-COUNT" * 3, "completion_tokens": [1]})
        self.assertEqual(problems, [
            "usage prompt_tokens is not a count: a string of 51 characters",
            "usage completion_tokens is not a count: a JSON array"])
        self.assertIsNone(counts["prompt_tokens"])


class TestSaysItIsStillWorking(HelperCase):
    def test_a_long_batch_says_it_is_still_running(self):
        silent = SilentServer()
        self.addCleanup(silent.stop)
        target = transport.parse_url(silent.url)
        clock = transport.Clock.start(1.0, 1.0)
        said = []
        done = transport.exchange_batch(target, clock, [transport.Exchange(b"x"),
                                                        transport.Exchange(b"y")],
                                        lambda s, n: said.append((s, n)), every_s=0.3)
        self.assertTrue(all(ex.error is not None for ex in done))
        self.assertGreaterEqual(len(said), 2, said)
        self.assertEqual([n for _, n in said], [0] * len(said))
        self.assertEqual(sorted(said), said, "said in order, as time went on")


if __name__ == "__main__":
    unittest.main()
