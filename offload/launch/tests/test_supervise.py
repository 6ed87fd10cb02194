"""start.sh as a container's entry point (--supervise), and one address for the server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

from support import FAKE, START, free_port
from launcher import Log, Server, Settings, flag_value, logged_chunk
from support import StartCase

SUPERVISING = "supervising server process group"


class TestSupervise(StartCase):
    def supervised(self, *launcher: str) -> subprocess.Popen:
        """start.sh --supervise against the fake, as a process; running until it logs that
        it supervises (60 s at most; a quiet machine needs about 1 s)."""
        command = [*launcher, "bash", START, "--base-url", self.url, "--log-dir", self.logs,
                   "--supervise", "--", *self.fake()]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, START_POLL_S="0.2",
                                                    START_STOP_GRACE_S="3"),
                                start_new_session=True)
        self.addCleanup(lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
        deadline = time.monotonic() + 60
        while SUPERVISING not in self.start_log() and time.monotonic() < deadline:
            self.assertIsNone(proc.poll(), "start.sh ended before it supervised")
            time.sleep(0.05)
        self.assertIn(SUPERVISING, self.start_log())
        return proc

    def start_log(self) -> str:
        try:
            with open(os.path.join(self.logs, "start.log")) as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def test_term_reaches_the_server_and_its_status_is_start_sh_s(self):
        proc = self.supervised()
        server = self.server_pid()
        os.kill(proc.pid, signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=30), 0, "the fake ends gracefully on TERM: 0")
        self.assertIn("TERM received: passed on to server process group", self.start_log())
        self.assertIn("server ended with status 0: start.sh exits with it", self.start_log())
        self.assertFalse(os.path.exists(f"/proc/{server}"), "the server is gone and reaped")

    def test_a_server_killed_from_outside_ends_start_sh_at_once(self):
        proc = self.supervised()
        os.kill(self.server_pid(), signal.SIGKILL)
        started = time.monotonic()
        self.assertEqual(proc.wait(timeout=30), 128 + signal.SIGKILL)
        self.assertLess(time.monotonic() - started, 5, "a second on a quiet machine")

    @unittest.skipUnless(shutil.which("unshare") and os.geteuid() == 0,
                         "needs unshare and root for a new PID namespace")
    def test_as_pid_1_of_a_pid_namespace(self):
        proc = self.supervised("unshare", "-pf", "--mount-proc")
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        self.assertEqual(len(children), 1, "start.sh runs as the namespace's PID 1")
        os.kill(int(children[0]), signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=30), 0)
        self.assertIn("TERM received: passed on", self.start_log())


class TestOneAddress(StartCase):
    def test_a_port_or_host_other_than_the_base_url_s_is_a_usage_error(self):
        other = str(free_port())
        for server, said in (
                ([sys.executable, FAKE, "--port", other], f"the server command --port {other}"),
                ([sys.executable, FAKE, f"--port={self.port}", "--host", "10.1.2.3"],
                 "names host 127.0.0.1, the server command --host 10.1.2.3")):
            with self.subTest(said=said):
                result = self.start(server=server)
                self.assertEqual(result.code, 2, result.stderr)
                self.assertIn(said, result.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.logs, "server.pid")))

    def test_the_last_chunk_flag_counts_as_vllm_s_parser_takes_it(self):
        self.assertEqual(flag_value("--max-num-batched-tokens", [
            "serve", "--max-num-batched-tokens", "4096", "m", "--max-num-batched-tokens=16384"]),
            "16384")

    def test_the_chunk_from_this_start_s_server_log(self):
        # vLLM 0.32's lines, as a real server printed them (a spec-decoding server without
        # --max-num-batched-tokens says only the second); an earlier start's line is past.
        os.makedirs(self.logs)
        with open(os.path.join(self.logs, "server.log"), "w") as handle:
            handle.write("INFO [scheduler.py:307] Chunked prefill is enabled with "
                         "max_num_batched_tokens=8192.\n")
            offset = handle.tell()
            handle.write("(APIServer pid=1) WARNING 12-02 01:33:55 [vllm.py:2276] "
                         "max_num_scheduled_tokens is set to 2048 based on the speculative "
                         "decoding settings.\n")
        settings = Settings(["--log-dir", self.logs, "--", "vllm"], {})
        server = Server(settings, Log(self.logs))
        for start_offset, chunk in ((offset, "2048"), (10 ** 6, "")):
            self.assertEqual(logged_chunk(server.logged_since(start_offset)), chunk)

    def test_one_address_written_two_ways_is_fine(self):
        result = self.start("--no-warmup", server=[*self.fake(), "--host", "0.0.0.0"])
        self.assertEqual(result.code, 0, result.stderr)


if __name__ == "__main__":
    unittest.main()
