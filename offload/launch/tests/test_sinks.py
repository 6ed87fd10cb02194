"""Sanitizing is one rule at the two sinks: the records writer and the terminal printer.

A marker, control characters, bidi marks, an invisible tag and the API key are planted in every
server field the code reads (model id, version, error message and param, finish and stop
reasons, usage values, /metrics labels and lines, /tokenize's context); our prompt text
is echoed back. Neither sink may show any of it raw. Also: a key split or cut by the
server is still redacted, server text in odd fields is not kept, and the atomic writer
only ever replaces a regular file.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import tempfile
import unittest

from hostile import (MODEL, HostileServer, completion_with, error_answer, http, json_answer,
                     metrics_answer, metrics_text, model_entry, models_doc)
from support import PYTHON, API_KEY, WARMUP, HelperCase, read_records, run_script
import core.runframe as runframe  # noqa: E402  (support puts offload/launch on sys.path)
import core.files as files  # noqa: E402
import core.transport as transport  # noqa: E402
import core.sanitize as sanitizing  # noqa: E402

MARK = "PLANTED-MARK"
DIRTY = f"\x1b[31m{MARK}\u202e\u061c\U000e0041\r\nkey={API_KEY}\x07"
CONTROL = ("\x1b", "\u202e", "\u061c", "\U000e0041", "\x07", "\r")


def echo_prompt(request) -> bytes:
    """A 400 that quotes the request's prompt, as a validation error does, with the key."""
    body = request.json() if isinstance(request.json(), dict) else {}
    prompt = str(body.get("prompt", ""))
    return error_answer(400, f"bad input {DIRTY} input_value={prompt[:400]!r}",
                        param=DIRTY)


SCRIPTS = {
    "model and version": {
        "/v1/models": json_answer(models_doc(model_entry(model_id=MODEL + DIRTY))),
        "/version": json_answer({"version": "0.32" + DIRTY}),
    },
    "finish, stop and usage": {
        "/v1/completions": lambda req: completion_with(req, choices=[{
            "index": 0, "text": "x", "finish_reason": "length" + DIRTY,
            "stop_reason": DIRTY}], usage={"prompt_tokens": DIRTY, "completion_tokens": 32,
                                           "prompt_tokens_details": {"cached_tokens": DIRTY}}),
    },
    "error echoing the prompt": {"/v1/completions": echo_prompt},
    "metrics labels and lines": {
        "/metrics": metrics_answer(metrics_text(
            f'vllm:num_requests_running{{engine="0",model_name="{MARK}\\n{API_KEY}"}} 1.0',
            f"vllm:num_requests_waiting{{bad {MARK} {API_KEY}")),
    },
}


class TestSinks(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def run_against(self, script: dict) -> tuple[str, str]:
        server = HostileServer(script).start()
        self.addCleanup(server.stop)
        records = os.path.join(self.tmp, f"r{len(os.listdir(self.tmp))}.jsonl")
        proc = subprocess.run([*PYTHON, WARMUP, "--base-url", server.url, "--records",
                               records, "--deadline-s", "20"], capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, VLLM_API_KEY=API_KEY,
                                                    WARMUP_LOCK_DIR=self.tmp))
        self.assertNotIn("Traceback", proc.stderr)
        prompts = [str((r.json() or {}).get("prompt", "")) for r in server.requests()
                   if isinstance(r.json(), dict)]
        with open(records, encoding="utf-8") as handle:
            text = handle.read()
        self.assertTrue(read_records(records)[0][-1]["record"] == "summary")
        return proc.stdout + proc.stderr, text, prompts

    def test_every_server_field_is_clean_in_both_sinks(self):
        for name, script in SCRIPTS.items():
            with self.subTest(name):
                terminal, records, prompts = self.run_against(script)
                decoded = json.dumps([json.loads(line) for line in records.splitlines()],
                                     ensure_ascii=False)
                for sink, text in (("terminal", terminal), ("records", decoded)):
                    self.assertNotIn(API_KEY, text, f"the key reached the {sink}")
                    for char in CONTROL:
                        self.assertNotIn(char, text.replace("\n", ""),
                                         f"{char!r} reached the {sink}")
                    for prompt in prompts:
                        words = prompt.split()
                        if words:
                            self.assertNotIn(words[0], text, f"a prompt's tag in the {sink}")
                            self.assertNotIn(" ".join(words[1:5]), text,
                                             f"prompt text in the {sink}")

    def test_the_sinks_clean_what_a_program_hands_them(self):
        sanitizing.REDACTIONS.secret("s3cr3t-sink-key")
        sanitizing.REDACTIONS.prompt("zz-tag-1 alpha beta gamma delta epsilon")
        dirty = "x\x1b[2J s3cr3t-sink-key alpha beta gamma delta \u202eend"
        sink = io.StringIO()
        run = runframe.Run(runframe.RunSettings("p", "r", "unused", 9, 9), runframe.Program(),
                           transport.Clock.start(9, 9), sink, print)
        run.write({"record": "status", "run_id": "r", "path": dirty, "state": dirty,
                   "why": dirty, "delta": {dirty: [dirty, {"k": dirty}]}})
        with self.assertRaises(runframe.RecordsError):     # off its declaration: never written
            run.write({"record": "x", dirty: [dirty]})
        written = sink.getvalue()
        self.assertEqual(written.count("\n"), 1)
        for bad in ("\x1b", "\\u001b", "s3cr3t", "alpha beta", "\u202e", "\\u202e"):
            self.assertNotIn(bad, written)
        self.assertIn("[redacted]", written)
        self.assertIn("[prompt text]", written)
        out = io.StringIO()
        printer = runframe.LineWriter(out)
        printer.say(f"line one {dirty}\n  - second {dirty}")
        self.assertTrue(printer.flush(5))
        shown = out.getvalue()
        self.assertEqual(shown.count("\n"), 2, "our own line break is kept, theirs are not")
        for bad in ("\x1b", "s3cr3t", "alpha beta", "\u202e"):
            self.assertNotIn(bad, shown)


class TestWriter(HelperCase):
    def planted(self) -> tuple[str, str, str]:
        """A FIFO, and a link to a file that says 'keep me': (fifo, link, the file)."""
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        target = os.path.join(self.tmp, "precious")
        with open(target, "w") as handle:
            handle.write("keep me")
        link = os.path.join(self.tmp, "link")
        os.symlink(target, link)
        return fifo, link, target

    def test_only_a_regular_file_is_ever_replaced(self):
        fifo, link, target = self.planted()
        for path in (fifo, link, self.tmp):
            with self.subTest(path=os.path.basename(path)):
                self.assertIn("not a regular file", files.write_atomically(path, "x"))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertTrue(os.path.islink(link))
        with open(target) as handle:
            self.assertEqual(handle.read(), "keep me")
        fresh = os.path.join(self.tmp, "fresh")
        self.assertIsNone(files.write_atomically(fresh, "new"))
        self.assertEqual([n for n in os.listdir(self.tmp) if n.endswith(".tmp")], [])

    def test_own_files_and_records_are_never_opened_through_a_link_or_a_fifo(self):
        # A FIFO planted at server.chunk while start.sh waited for /health held its open().
        fifo, link, target = self.planted()
        for path in (fifo, link):
            for mode in ("w", "ab"):
                with self.subTest(path=os.path.basename(path), mode=mode):
                    with self.assertRaises(OSError):
                        files.open_own(path, mode)
            with self.subTest(records=os.path.basename(path)):
                with self.assertRaises(OSError):
                    runframe.open_records(path)
        with open(target) as handle:
            self.assertEqual(handle.read(), "keep me")


class TestSecrets(HelperCase):
    def test_a_key_split_or_cut_by_the_server_is_still_redacted(self):
        key = "sk-live-QwErTyUiOpAsDfGhJkLzXc"
        server = HostileServer({"/v1/completions": lambda req: json_answer(
            {"error": {"message": f"auth failed for {key[:18]}\u200b{key[18:]}; invalid key "
                                  f"provided: {key[:20]}...", "type": "x", "param": None,
                       "code": 500}}, 500)}).start()
        self.addCleanup(server.stop)
        proc = run_script(WARMUP, "--base-url", server.url, "--records", self.records_path,
                   "--deadline-s", "20", env={"VLLM_API_KEY": key})
        _, text = read_records(self.records_path)
        for where in (proc.stdout, proc.stderr, text):
            self.assertNotIn(key[:12], where.replace("\u200b", ""))
        self.assertIn("[redacted]", text)

    def test_a_short_key_does_not_rewrite_our_own_words(self):
        server = self.start_fake(api_key="ok")
        result = self.run_helper(server, env={"VLLM_API_KEY": "ok"})
        self.assertEqual(result.code, 0, result.stdout + result.stderr)
        self.assertEqual(result.summary["requests_ok"], 10)
        self.assertNotIn("Traceback", result.stderr)


class TestServerTextInOddFields(HelperCase):
    def test_a_finish_reason_object_and_speculative_field_names_are_not_kept(self):
        marker = "GENTEXT-H0ST1LE"
        server = HostileServer({"/v1/completions": lambda req: http(200, completion_with(
            req, choices=[{"index": 0, "text": "x", "finish_reason": {"text": marker},
                           "stop_reason": None}],
            metrics={"speculative_decoding": {marker: 1, "num_drafts": 3}}))}).start()
        self.addCleanup(server.stop)
        proc = run_script(WARMUP, "--base-url", server.url, "--records", self.records_path,
                   "--deadline-s", "20")
        _, text = read_records(self.records_path)
        for where in (proc.stdout, proc.stderr, text):
            self.assertNotIn(marker, where)
        self.assertIn("<dict>", text)


if __name__ == "__main__":
    unittest.main()
