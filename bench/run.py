#!/usr/bin/env python3
"""Benchmark the warm-up helper's own cost, side by side with the alternatives, in one run.

    python3 bench/run.py [--quick]

Everything runs on 127.0.0.1 against the fake server from the tests (fixed latency per
completion); every server started here is stopped here. Prints the machine and a table
of ratios with their targets. Not a test: CI does not run it. Bounded to 3 minutes.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import venv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "offload", "launch", "tests")
WARMUP = os.path.join(REPO, "offload", "launch", "warmup.py")
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.dirname(WARMUP))

from fake_vllm import FakeConfig, FakeServer  # noqa: E402
from support import SilentServer  # noqa: E402
import warmup  # noqa: E402

BUDGET_S = 180
LATENCY_S = 1.0      # about 32 tokens at 30 ms a token on a large model


def run_timed(command: list[str], env: dict | None = None) -> tuple[float, int, int]:
    """(wall seconds, exit status, peak RSS in KiB) of one child process.

    The peak is VmHWM from /proc, polled until the child exits: the high-water mark of
    the address space made at exec. (ru_maxrss would also count the RSS the child
    inherited from this large parent between fork and exec.)
    """
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _vm_hwm_kib(proc.pid))
        time.sleep(0.002)
    return time.perf_counter() - started, proc.returncode, peak


def _vm_hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def merged_busy(intervals: list[tuple[float, float]]) -> float:
    """Total time covered by the union of the intervals: the server's busy time."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def helper_run(url: str, records: str, *extra: str) -> tuple[float, int, int]:
    return run_timed([sys.executable, WARMUP, "--base-url", url, "--records", records, *extra])


def bench_overhead(runs: int, tmp: str) -> dict:
    """Whole-process wall time of a full warm-up against the server's own busy time."""
    walls, busies, rss = [], [], []
    for i in range(runs):
        server = FakeServer(FakeConfig(latency_s=LATENCY_S)).start()
        try:
            wall, code, peak = helper_run(server.url, os.path.join(tmp, f"o{i}.jsonl"))
            assert code == 0, f"warm-up failed in the overhead bench (exit {code})"
            busy = merged_busy([(e["arrived"], e["done"]) for e in server.state.requests
                                if e["done"] is not None])
        finally:
            server.stop()
        walls.append(wall)
        busies.append(busy)
        rss.append(peak)
    return {"wall": statistics.median(walls), "busy": statistics.median(busies),
            "rss_kib": max(rss)}


def wave_skews(entries: list[dict]) -> list[float]:
    """Per wave (depth > 1), last minus first arrival at the server, in ms."""
    waves: dict[str, list[float]] = {}
    for e in entries:
        rid = e["body"]["request_id"]
        waves.setdefault(rid.rsplit("-", 1)[0], []).append(e["arrived"])
    return [(max(t) - min(t)) * 1000 for t in waves.values() if len(t) > 1]


def bench_skew_helper(server: FakeServer, runs: int, tmp: str) -> list[float]:
    skews = []
    for i in range(runs):
        before = len(server.state.completions())
        _, code, _ = helper_run(server.url, os.path.join(tmp, f"s{i}.jsonl"), "--waves", "1,2,3,4")
        assert code == 0, f"warm-up failed in the skew bench (exit {code})"
        skews += wave_skews(server.state.completions()[before:])
    return skews


def bench_skew_threads(server: FakeServer, runs: int) -> list[float]:
    """The naive client: one thread per request started one after another, no barrier."""
    target = warmup.parse_base_url(server.url)
    clock = warmup.Clock.start(60, 10)
    before = len(server.state.completions())
    for r in range(runs):
        for depth in (2, 3, 4):
            def one(index, depth=depth):
                body = warmup.completion_body("fake-model", f"naive {r} {depth} {index}",
                                              f"naive-{r}-B{depth}-{index}",
                                              warmup.Plan("x", (1,), 32, 0, 5000, 60, 10))
                warmup.fetch(target, clock, "POST", "/v1/completions", body)
            threads = [threading.Thread(target=one, args=(i,)) for i in range(depth)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    return wave_skews(server.state.completions()[before:])


def bench_skew_curl(server: FakeServer, runs: int) -> list[float] | None:
    """A bash burst of `curl ... &`, as an operator might write it."""
    if not shutil.which("curl"):
        return None
    before = len(server.state.completions())
    script = ('for i in $(seq 0 $(($2 - 1))); do curl -s -o /dev/null -H "Content-Type: '
              'application/json" -d "{\\"model\\":\\"fake-model\\",\\"prompt\\":\\"curl $3 $i\\",'
              '\\"max_tokens\\":32,\\"min_tokens\\":32,\\"ignore_eos\\":true,'
              '\\"request_id\\":\\"curl-$3-B$2-$i\\"}" "$1/v1/completions" & done; wait')
    for r in range(runs):
        for depth in (2, 3, 4):
            subprocess.run(["bash", "-c", script, "burst", server.url, str(depth), str(r)],
                           check=True, timeout=30)
    return wave_skews(server.state.completions()[before:])


def bench_startup(runs: int) -> dict:
    def median_of(command):
        return statistics.median(run_timed(command)[0] for _ in range(runs))
    return {"pass": median_of([sys.executable, "-c", "pass"]),
            "help": median_of([sys.executable, WARMUP, "--help"]),
            "dry": median_of([sys.executable, WARMUP, "--dry-run"])}


def startup_breakdown(runs: int) -> dict:
    """Where --dry-run's start-up goes: compiling the script, and its standard imports."""
    with open(WARMUP, encoding="utf-8") as handle:
        source = handle.read()
    compile_s = []
    for _ in range(runs):
        started = time.perf_counter()
        compile(source, WARMUP, "exec")
        compile_s.append(time.perf_counter() - started)
    modules = sorted({node.names[0].name.split(".")[0] if isinstance(node, ast.Import)
                      else node.module.split(".")[0]
                      for node in ast.parse(source).body
                      if isinstance(node, (ast.Import, ast.ImportFrom)) and
                      (not isinstance(node, ast.ImportFrom) or node.module != "__future__")})
    imports = statistics.median(run_timed([sys.executable, "-c", "import " + ", ".join(modules)])[0]
                                for _ in range(runs))
    return {"compile": statistics.median(compile_s), "imports": imports,
            "lines": source.count("\n")}


def bench_openai_import(runs: int, deadline: float) -> tuple[float | None, str]:
    """`import openai` in a throwaway venv (cached between bench runs), when pip can get it."""
    home = os.path.join(tempfile.gettempdir(), "offload-bench-openai-venv")
    python = os.path.join(home, "bin", "python")
    if not os.path.exists(os.path.join(home, "ok")):
        left = deadline - time.monotonic() - 60
        if left < 20:
            return None, "skipped: not enough of the bench's time budget left to install openai"
        shutil.rmtree(home, ignore_errors=True)
        venv.create(home, with_pip=True)
        try:
            subprocess.run([python, "-m", "pip", "install", "--quiet", "openai"], check=True,
                           timeout=left, capture_output=True)
        except (subprocess.SubprocessError, OSError) as exc:
            return None, f"skipped: openai could not be installed ({type(exc).__name__})"
        open(os.path.join(home, "ok"), "w").close()
    times = [run_timed([python, "-c", "import openai"])[0] for _ in range(runs)]
    return statistics.median(times), "openai in a throwaway venv"


def bench_deadline(deadline_s: float, runs: int, tmp: str) -> list[float]:
    """How long after its deadline the helper exits when the server never answers."""
    late = []
    start_cost = statistics.median(run_timed([sys.executable, "-c", "pass"])[0] for _ in range(3))
    for i in range(runs):
        silent = SilentServer()
        try:
            wall, code, _ = helper_run(silent.url, os.path.join(tmp, f"d{i}.jsonl"), "--model",
                                       "m", "--deadline-s", str(deadline_s))
        finally:
            silent.stop()
        assert code == 1, f"expected a failed run against a silent server, got {code}"
        late.append(wall - deadline_s - start_cost)
    return late


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def row(name: str, measured: str, ratio: str, target: str, verdict: bool | None) -> str:
    mark = {True: "met", False: "MISSED", None: "-"}[verdict]
    return f"| {name} | {measured} | {ratio} | {target} | {mark} |"


def _over_budget(signum, frame):
    raise SystemExit(f"bench: over its {BUDGET_S} s budget; stopped (servers are stopped "
                     f"by their finally blocks)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + BUDGET_S
    signal.signal(signal.SIGALRM, _over_budget)
    signal.alarm(BUDGET_S)
    n = 3 if args.quick else 5
    print(f"machine: {os.cpu_count()} cores, {platform.machine()}, Python "
          f"{platform.python_version()}, {platform.system()} {platform.release()}")
    print(f"fake server: fixed {LATENCY_S * 1000:.0f} ms per completion, 127.0.0.1\n")
    rows = ["| measure | measured | ratio | target | |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        start = bench_startup(10 if args.quick else 20)
        over = bench_overhead(n, tmp)
        overhead = over["wall"] - over["busy"]
        ratio = over["wall"] / over["busy"]
        ratio_net = (over["wall"] - start["pass"]) / over["busy"]
        rows.append(row("overhead: full warm-up wall vs server busy (median of %d)" % n,
                        f"{over['wall']:.3f} s vs {over['busy']:.3f} s, overhead "
                        f"{fmt_ms(overhead)}",
                        f"{ratio:.3f} ({ratio_net:.3f} less the interpreter's start)",
                        "≤ 1.02 plus the interpreter's start", ratio_net <= 1.02))

        server = FakeServer(FakeConfig(latency_s=0.02)).start()
        try:
            helper = bench_skew_helper(server, 10 if args.quick else 20, tmp)
            naive = bench_skew_threads(server, 10 if args.quick else 20)
            curl = bench_skew_curl(server, 10 if args.quick else 20)
        finally:
            server.stop()
        h_med = statistics.median(helper)
        rows.append(row(f"release skew, helper's barrier ({len(helper)} waves)",
                        f"median {h_med:.3f} ms, max {max(helper):.3f} ms", "-", "median ≤ 1 ms",
                        h_med <= 1.0))
        n_med = statistics.median(naive)
        rows.append(row(f"release skew, threads without barrier ({len(naive)} waves)",
                        f"median {n_med:.3f} ms, max {max(naive):.3f} ms",
                        f"{n_med / h_med:.1f}× the helper's", "-", None))
        if curl:
            c_med = statistics.median(curl)
            rows.append(row(f"release skew, bash `curl &` burst ({len(curl)} waves)",
                            f"median {c_med:.3f} ms, max {max(curl):.3f} ms",
                            f"{c_med / h_med:.1f}× the helper's", "≥ 5× the helper's",
                            c_med / h_med >= 5))
        else:
            rows.append(row("release skew, bash `curl &` burst", "skipped: curl not found",
                            "-", "-", None))

        rows.append(row("start-up: `warmup.py --help` vs `python3 -c pass`",
                        f"{fmt_ms(start['help'])} vs {fmt_ms(start['pass'])}",
                        f"{start['help'] / start['pass']:.2f}", "≤ 1.4",
                        start["help"] / start["pass"] <= 1.4))
        rows.append(row("start-up: `warmup.py --dry-run` vs `python3 -c pass`",
                        f"{fmt_ms(start['dry'])} vs {fmt_ms(start['pass'])}",
                        f"{start['dry'] / start['pass']:.2f}", "≤ 1.4",
                        start["dry"] / start["pass"] <= 1.4))
        parts = startup_breakdown(10 if args.quick else 20)
        rows.append(row("start-up breakdown of `--dry-run`",
                        f"compiling the {parts['lines']}-line script {fmt_ms(parts['compile'])} "
                        f"(every run: a script's bytecode is not cached); its standard imports "
                        f"{fmt_ms(parts['imports'] - start['pass'])}; the rest "
                        f"{fmt_ms(start['dry'] - parts['imports'] - parts['compile'])}",
                        "-", "-", None))
        sdk, how = bench_openai_import(5 if args.quick else 10, deadline)
        if sdk is None:
            rows.append(row("start-up: vs `import openai`", how, "-", "≤ 1/3", None))
        else:
            rows.append(row("start-up: `--dry-run` vs `python3 -c \"import openai\"`",
                            f"{fmt_ms(start['dry'])} vs {fmt_ms(sdk)}",
                            f"{start['dry'] / sdk:.2f}", "≤ 0.33", start["dry"] / sdk <= 1 / 3))

        base_rss = statistics.median(run_timed([sys.executable, "-c", "pass"])[2]
                                     for _ in range(3))
        rows.append(row("memory: peak RSS of a full run vs `python3 -c pass`",
                        f"{over['rss_kib'] / 1024:.1f} MiB vs {base_rss / 1024:.1f} MiB",
                        f"{over['rss_kib'] / base_rss:.2f}", "≤ 1.6",
                        over["rss_kib"] / base_rss <= 1.6))

        dry_rss = statistics.median(run_timed([sys.executable, WARMUP, "--dry-run"])[2]
                                    for _ in range(3))
        rows.append(row("memory: peak RSS of `--dry-run` (no network) vs `python3 -c pass`",
                        f"{dry_rss / 1024:.1f} MiB vs {base_rss / 1024:.1f} MiB: compiling the "
                        f"script, not the run, sets the peak",
                        f"{dry_rss / base_rss:.2f}", "-", None))

        late = bench_deadline(3.0, 2 if args.quick else 3, tmp)
        rows.append(row("deadline precision: exit after a 3 s deadline, silent server",
                        f"max {fmt_ms(max(late))} late (median {fmt_ms(statistics.median(late))})",
                        "-", "≤ 500 ms", max(late) <= 0.5))
    print("\n".join(rows))
    spent = BUDGET_S - (deadline - time.monotonic())
    print(f"\nbench took {spent:.0f} s (budget {BUDGET_S} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
