"""The layout holds: imports go one way, modules stay small, the folder is one unit."""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import support
from support import LAUNCH, PACKAGES, copy_product, product_files

# Each module's layer: a module imports only from lower layers; no program imports another
# (qualify.py loads a command's module by name when that command runs). The packages: core/
# is what the warm-up loads and imports only core; tools/ (qualify.py's commands) imports
# core and tools, never start; start/ (the launcher's internals) imports all three.
LAYERS = {
    "core": -1, "tools": -1, "start": -1,          # the packages' faces: docstrings only
    "core.sanitize": 0, "core.values": 0, "start.server_command": 0,
    "core.prometheus": 0.01, "core.transport": 0.02, "core.files": 0.05,
    "core.cli": 0.1, "tools.procfs": 0.15,
    "start.processes": 0.16, "start.readiness": 0.17,
    "core.records": 0.2,
    "core.textfile": 0.5,
    "core.runframe": 1, "start.supervisor": 1.1, "core.ending": 1.2, "core.locks": 1.5,
    "core.prompts": 2,
    "core.kinds": 2.2,
    "core.vllm_metrics": 2.5,
    "core.plan_file": 2.55, "core.readyfile": 2.6, "start.settings": 2.65,
    "core.contract": 2.7,
    "tools.readback": 2.8, "tools.ready": 2.9, "tools.lines": 2.9,
    "core.vllm_client": 3, "core.status_files": 3.5, "core.counted": 3.5, "core.dry_run": 3.5,
    "core.evidence": 4,
    "start.server": 4.5, "start.steps": 4.6, "start.owner": 4.7,
    "warmup": 5, "qualify": 5, "tools.gate": 5, "tools.report": 5, "tools.probe": 5,
    "tools.compat": 5, "tools.vllm_log": 0.2,
    "launcher": 5,
}
PROGRAMS = {name for name, layer in LAYERS.items() if layer == 5}
MAX_FUNCTION_LINES = 150
MAX_LINES = 900
WARM_UP_LINES = 5500                 # what warmup.py loads without its four plug-in flags


@functools.lru_cache(maxsize=None)
def local_imports(path: str) -> frozenset[str]:
    """The modules of offload/launch/ that a file imports (at any depth of its code), by
    their dotted names (core.transport); each file parsed once a run."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return frozenset(names & set(LAYERS))


def modules() -> dict[str, str]:
    """Every module of the product by its dotted name (a package's face by the package's)."""
    found = {}
    for path in product_files():
        if path.endswith(".py"):
            dotted = os.path.relpath(path, LAUNCH)[:-3].replace(os.sep, ".")
            found[dotted.removesuffix(".__init__")] = path
    return found


# Numbers the house reads from its own flags, variables and files go through core/cli.NUMBER
# (number_type, whole, seconds, number_in). Other grammars are other people's: the wire's
# (HTTP, Prometheus text, a metric's labels), vLLM's own (its human-readable token counts),
# and names that hold digits (a records file's name, a described value).
OTHER_GRAMMARS = {"core.transport", "core.prometheus", "core.sanitize", "core.vllm_metrics",
                  "tools.vllm_log", "start.server_command",
                  "start.steps", "core.records", "core.cli"}
DIGIT_SPELLINGS = re.compile(r"\.is(?:digit|decimal|numeric)\(|\[0-9\]|\\d")


class TestLayers(unittest.TestCase):
    def test_one_number_grammar_and_its_callers(self):
        callers, spelled = set(), {}
        for name, path in modules().items():
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            if re.search(r"\b(?:number_type|whole|seconds|number_in)\(", text):
                callers.add(name)
            found = DIGIT_SPELLINGS.findall(text)
            if found and name not in OTHER_GRAMMARS:
                spelled[name] = found
        self.assertEqual(spelled, {}, "a number read another way than core/cli.NUMBER")
        self.assertEqual(sorted(callers), sorted(
            ["core.cli", "core.runframe", "core.vllm_client", "start.owner", "start.processes",
             "start.settings", "start.steps", "tools.compat", "tools.gate", "tools.probe",
             "tools.procfs",
             "tools.ready", "tools.report", "warmup"]), "the callers of the one grammar")

    def test_every_module_has_a_layer(self):
        self.assertEqual(sorted(modules()), sorted(LAYERS),
                         "a new module of offload/launch/ needs its layer in LAYERS")

    def test_imports_go_one_way(self):
        for name, path in modules().items():
            for imported in local_imports(path):
                with self.subTest(module=name, imports=imported):
                    self.assertLess(LAYERS[imported], LAYERS[name],
                                    f"{name}.py imports {imported}.py, a layer above it")

    def test_no_program_imports_another(self):
        for name, path in modules().items():
            self.assertFalse(local_imports(path) & (PROGRAMS - {name}),
                             f"{name}.py imports a program")

    def test_the_contract_s_table_names_every_module_where_it_is(self):
        with open(os.path.join(LAUNCH, "CONTRACT.md"), encoding="utf-8") as handle:
            text = handle.read().split("## 2. Files and layers", 1)[1].split("\n## ", 1)[0]
        said = set()
        for row in (line for line in text.splitlines() if line.startswith("| ")):
            package = re.match(r"\| `(\w+)/`", row)
            for name in re.findall(r"`(\w+)\.py`", row.split("|")[2]):
                said.add(f"{package[1]}.{name}" if package else name)
        self.assertEqual(said, {name for name in modules() if name not in PACKAGES})

    def test_core_imports_only_core_and_tools_never_start(self):
        for name, path in modules().items():
            for imported in local_imports(path):
                with self.subTest(module=name, imports=imported):
                    if name.startswith("core"):
                        self.assertTrue(imported.startswith("core"), imported)
                    if name.startswith("tools"):
                        self.assertFalse(imported.startswith("start"), imported)

    def test_the_warm_up_loads_only_core(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-X", "importtime",
                                   os.path.join(LAUNCH, "warmup.py"), "--dry-run"],
                                  capture_output=True, text=True, timeout=30, cwd=tmp)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        loaded = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                  if line.startswith("import time:") and "|" in line}
        ours = loaded & set(LAYERS)
        self.assertTrue(ours and all(n.startswith("core") for n in ours), sorted(ours))
        # What a warm-up without --ready-file, --textfile, --status-file, --metrics-counter
        # and --plan loads (start.sh's warm-up: the launcher writes the ready file) stays
        # within the house's bound; those load their modules with them, as --dry-run does.
        files = [modules()[name] for name in ours - {"core.dry_run"} | {"warmup"}]
        lines = 0
        for path in files:
            with open(path, encoding="utf-8") as handle:
                lines += len(handle.readlines())
        self.assertLessEqual(lines, WARM_UP_LINES, sorted(ours))
        self.assertFalse(ours & {"core.readyfile", "core.textfile", "core.status_files",
                                 "core.counted", "core.plan_file"}, sorted(ours))

    def test_the_report_reads_records_not_programs_nor_the_http_client(self):
        graph = {name: local_imports(path) for name, path in modules().items()}
        reached, todo = set(), ["tools.report"]
        while todo:
            for found in graph[todo.pop()] - reached:
                reached.add(found)
                todo.append(found)
        self.assertFalse(reached & (PROGRAMS | {"core.vllm_client", "core.evidence"}), reached)

    def test_no_class_or_function_is_longer_than_the_bound(self):
        for name, path in modules().items():
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    lines = node.end_lineno - node.lineno + 1
                    with self.subTest(module=name, name=node.name):
                        self.assertLessEqual(lines, MAX_FUNCTION_LINES)

    def test_the_readiness_probe_loads_six_of_the_folder_s_modules(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-X", "importtime",
                                   os.path.join(LAUNCH, "qualify.py"), "ready", "--ready-file",
                                   os.path.join(tmp, "missing")], capture_output=True,
                                  text=True, timeout=30, cwd=tmp)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        loaded = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                  if line.startswith("import time:") and "|" in line}
        ours = (loaded & set(LAYERS)) | {"qualify"}      # qualify runs as __main__
        self.assertLessEqual(ours, {"qualify", "tools", "tools.ready", "tools.procfs",
                                    "core", "core.sanitize", "core.prometheus",
                                    "core.transport", "core.vllm_metrics",
                                    "core.readyfile", "core.files", "core.cli"}, ours)

    def test_no_import_cycle(self):
        graph = {name: local_imports(path) for name, path in modules().items()}

        def visit(name: str, trail: tuple) -> None:
            self.assertNotIn(name, trail, f"import cycle: {' -> '.join(trail + (name,))}")
            for following in graph[name]:
                visit(following, trail + (name,))

        for name in graph:
            visit(name, ())

    def test_modules_stay_small(self):
        for name, path in modules().items():
            with open(path, encoding="utf-8") as handle:
                lines = sum(1 for _ in handle)
            self.assertLessEqual(lines, MAX_LINES, f"{name}.py has {lines} lines")

    def test_a_missing_module_is_one_line_not_a_traceback(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = copy_product(os.path.join(tmp, "launch"), leave_out=("core/runframe.py",))
            for command in (["warmup.py", "--dry-run"], ["qualify.py", "report", "x"],
                            ["qualify.py", "gate", "--dry-run"],
                            ["launcher.py", "--", "true"]):
                with self.subTest(command=command[0]):
                    proc = subprocess.run([sys.executable, os.path.join(folder, command[0]),
                                           *command[1:]], capture_output=True, text=True,
                                          timeout=30, cwd=tmp)
                    self.assertEqual(proc.returncode, 2, proc.stderr)
                    self.assertNotIn("Traceback", proc.stderr)
                    self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                    self.assertIn("cannot load core.runframe", proc.stderr)
                    self.assertIn("restore the whole folder", proc.stderr)
            wrapper = subprocess.run(["bash", os.path.join(folder, "warmup_serve.sh"),
                                      "--dry-run"], capture_output=True, text=True, timeout=30)
            self.assertEqual(wrapper.returncode, 2, wrapper.stderr)
            self.assertNotIn("Traceback", wrapper.stderr)

    def test_a_missing_plug_in_is_a_usage_error_when_its_flag_is_given(self):
        plug_ins = {"core/readyfile.py": "--ready-file=r.json", "core/textfile.py":
                    "--textfile=t.prom", "core/status_files.py": "--status-file=s.json",
                    "core/counted.py": "--metrics-counter=http://127.0.0.1:9/m=c",
                    "core/plan_file.py": "--plan=p.json"}
        with tempfile.TemporaryDirectory() as tmp:
            folder = copy_product(os.path.join(tmp, "launch"), leave_out=tuple(plug_ins))
            for path, flag in plug_ins.items():
                with self.subTest(flag=flag):        # refused before anything is sent
                    proc = subprocess.run([sys.executable, os.path.join(folder, "warmup.py"),
                                           "--base-url", "http://127.0.0.1:9", flag],
                                          capture_output=True, text=True, timeout=30, cwd=tmp)
                    self.assertEqual(proc.returncode, 2, proc.stderr)
                    self.assertNotIn("Traceback", proc.stderr)
                    module = path[:-3].replace("/", ".")
                    self.assertIn(f"cannot load {module}: offload/launch/ is copied", proc.stderr)
            plain = subprocess.run([sys.executable, os.path.join(folder, "warmup.py"),
                                    "--dry-run"], capture_output=True, text=True, timeout=30)
            self.assertEqual(plain.returncode, 0, plain.stderr)    # without them: no need
            with open(os.path.join(folder, "core", "counted.py"), "w") as cut:
                cut.write('"""Operator counters over a warm-up\n')      # a copy cut short
            cut_short = subprocess.run([sys.executable, os.path.join(folder, "warmup.py"),
                                        "--dry-run", plug_ins["core/counted.py"]],
                                       capture_output=True, text=True, timeout=30)
            self.assertEqual(cut_short.returncode, 2, cut_short.stderr)
            self.assertIn("cannot load core.counted", cut_short.stderr)
            self.assertNotIn("Traceback", cut_short.stderr)

    def test_the_readiness_answer_is_a_plug_in_of_its_port(self):
        """start/readiness.py (http.server) loads only when --supervise answers a port:
        missing, such a start is refused before anything is launched; other starts go on."""
        with tempfile.TemporaryDirectory() as tmp:
            folder = copy_product(os.path.join(tmp, "launch"), leave_out=("start/readiness.py",))
            marker = os.path.join(tmp, "launched")
            base = {k: v for k, v in os.environ.items() if k != "START_READY_PORT"}

            def supervised(log_dir: str, **env: str) -> subprocess.CompletedProcess:
                return subprocess.run(
                    [sys.executable, "-I", "-S", os.path.join(folder, "launcher.py"),
                     "--supervise", "--log-dir", log_dir, "--", "touch", marker],
                    capture_output=True, text=True, timeout=30, env=dict(base, **env))

            for state in ("missing", "cut short"):
                if state == "cut short":
                    with open(os.path.join(folder, "start", "readiness.py"), "w") as cut:
                        cut.write('"""GET /ready on START_READY_PORT"""\n')
                with self.subTest(state):
                    proc = supervised(os.path.join(tmp, "logs"), START_READY_PORT="8081")
                    self.assertEqual(proc.returncode, 2, proc.stderr)
                    self.assertIn("cannot load start.readiness: offload/launch/ is copied",
                                  proc.stderr)
                    self.assertNotIn("Traceback", proc.stderr)
                    self.assertFalse(os.path.exists(marker), "refused before anything is launched")
            plain = supervised("/proc/offload-logs")
            self.assertEqual(plain.returncode, 2, plain.stderr)     # on to the next check
            self.assertIn("cannot create", plain.stderr)
            self.assertNotIn("start.readiness", plain.stderr)

    def test_runs_from_any_directory(self):
        with tempfile.TemporaryDirectory() as tmp:
            for command in (["warmup.py", "--dry-run"], ["qualify.py", "--help"]):
                proc = subprocess.run([sys.executable, os.path.join(LAUNCH, command[0]),
                                       *command[1:]], capture_output=True, text=True,
                                      timeout=30, cwd=tmp)
                self.assertEqual(proc.returncode, 0, proc.stderr)



class TestRunner(unittest.TestCase):
    """tests/run.py, the README's test command, on a folder of its own."""

    def runner_in(self, tmp: str, modules: dict) -> str:
        import shutil
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py"), tmp)
        for name, text in modules.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        return os.path.join(tmp, "run.py")

    def test_a_module_that_cannot_import_fails_the_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = self.runner_in(tmp, {"test_broken.py": "import no_such_module_xyz\n"})
            proc = subprocess.run([sys.executable, run], capture_output=True, text=True,
                                  timeout=60)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertIn("failed: test_broken", proc.stdout)
        self.assertIn("No module named 'no_such_module_xyz'", proc.stdout)

    def test_ctrl_c_stops_each_class_and_what_it_started(self):
        # INT to the runner reaches each class's process group, as a terminal's would.
        with tempfile.TemporaryDirectory() as tmp:
            pid_file = os.path.join(tmp, "sleep.pid")
            run = self.runner_in(tmp, {"test_waits.py": (
                "import subprocess, unittest\n"
                "class TestWaits(unittest.TestCase):\n"
                "    def test_waits(self):\n"
                "        p = subprocess.Popen(['sleep', '301'])\n"
                f"        open({pid_file!r}, 'w').write(str(p.pid))\n"
                "        p.wait(120)\n")})
            proc = subprocess.Popen([sys.executable, run], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                     signal.SIG_DFL))
            self.addCleanup(proc.kill)
            end = time.monotonic() + 30
            while not os.path.exists(pid_file) and time.monotonic() < end:
                time.sleep(0.05)
            time.sleep(0.2)
            with open(pid_file, encoding="utf-8") as handle:
                sleeper = int(handle.read())
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 130, out)
        self.assertIn("interrupted: the running classes were stopped", out)
        self.assertFalse(os.path.exists(f"/proc/{sleeper}"), "the test's child was left")

    def test_each_class_process_has_a_slot_of_its_own(self):
        # The slot picks the block of ports its tests hand out: two classes, two blocks.
        with tempfile.TemporaryDirectory() as tmp:
            run = self.runner_in(tmp, {"test_slots.py": (
                "import os, unittest\n"
                "class TestA(unittest.TestCase):\n"
                "    def test_slot(self):\n"
                f"        with open(os.path.join({tmp!r}, type(self).__name__), 'w') as f:\n"
                "            f.write(os.environ['OFFLOAD_TEST_SLOT'])\n"
                "class TestB(TestA):\n"
                "    pass\n")})
            proc = subprocess.run([sys.executable, run], capture_output=True, text=True,
                                  timeout=60)
            slots = []
            for name in ("TestA", "TestB"):
                with open(os.path.join(tmp, name), encoding="utf-8") as handle:
                    slots.append(handle.read())
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertEqual(sorted(slots), ["0", "1"])

    def test_a_free_port_is_of_the_class_s_own_block_below_the_ephemeral_range(self):
        first = support.port_block()
        block = range(first + 1, first + support.PORTS_PER_CLASS)
        handed = support.free_port()
        self.assertIn(handed, block)
        for port in block:                        # all but one held by another program
            if port != handed:
                with contextlib.suppress(OSError):
                    held = socket.socket()
                    self.addCleanup(held.close)
                    held.bind(("127.0.0.1", port))
        self.assertEqual(support.free_port(), handed)
        with socket.socket() as held:
            held.bind(("127.0.0.1", handed))
            with self.assertRaisesRegex(AssertionError, f"no free port in {first + 1}-"):
                support.free_port()
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as handle:
            ephemeral = int(handle.read().split()[0])
        self.assertLess(support.FIRST_PORT + support.BLOCKS * support.PORTS_PER_CLASS,
                        ephemeral + 1, "a block reaches into the ephemeral range")

    def test_a_block_claimed_by_another_process_is_passed_over(self):
        # Two suites on one machine count their slots from 0 alike (a review found two runs
        # at once failing on each other's ports): the second takes the next free block.
        mine = support.port_block()
        slot = (mine - support.FIRST_PORT) // support.PORTS_PER_CLASS
        code = ("import support; print(support.port_block())")
        other = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True,
                               text=True, timeout=30, cwd=os.path.dirname(support.__file__),
                               env=dict(os.environ, OFFLOAD_TEST_SLOT=str(slot)))
        self.assertEqual(other.returncode, 0, other.stderr)
        theirs = int(other.stdout)
        self.assertNotEqual(theirs, mine)
        self.assertEqual((theirs - support.FIRST_PORT) % support.PORTS_PER_CLASS, 0)

if __name__ == "__main__":
    unittest.main()
