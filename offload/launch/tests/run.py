#!/usr/bin/env python3
"""Run the whole suite with plain unittest, a few test classes at a time.

  python3 offload/launch/tests/run.py [-j N] [PATTERN]

Most tests wait on sockets and processes (a fake server, start.sh, the wrapper), not on
the CPU, so a 2-core machine runs several classes at once. Each class runs in its own
`python3 -m unittest` process (as `python3 -m unittest discover -s offload/launch/tests`
would run it alone), bounded in time; a class whose process fails shows its whole
output. The last lines are unittest's ("Ran N tests", OK or FAILED) and one plain
"tests: N passed, N failed". Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import time
import unittest

TESTS = os.path.dirname(os.path.abspath(__file__))
CLASS_BOUND_S = 600           # one class's process: far above any class's quiet run
RAN = re.compile(r"^Ran (\d+) tests? in", re.M)
COUNTS = re.compile(r"(failures|errors|skipped|expected failures|unexpected successes)=(\d+)")


def test_classes(pattern: str) -> list[str]:
    """Every test class's dotted name, the longest to run first so that none starts last:
    those that set up once for all their tests (the hostile table) or say they run long
    (a class attribute `runs_long`: real servers, few tests), then by test count."""
    found: dict[str, bool] = {}
    count: dict[str, int] = {}
    suites = [unittest.defaultTestLoader.discover(TESTS, pattern=pattern, top_level_dir=TESTS)]
    while suites:
        for item in suites.pop():
            if isinstance(item, unittest.TestSuite):
                suites.append(item)
            elif type(item).__name__ == "_FailedTest":      # a module that cannot import
                found[item.id().rpartition(".")[0]] = True
            else:
                cls = type(item)
                once = "setUpClass" in vars(cls) or getattr(cls, "runs_long", False)
                name = f"{cls.__module__}.{cls.__qualname__}"
                found[name] = once
                count[name] = count.get(name, 0) + 1
    return sorted(found, key=lambda name: (not found[name], -count.get(name, 0), name))


def run_class(name: str) -> tuple[str, int, dict, str, float]:
    """(name, exit status, counts, output, seconds) of one class in its own process."""
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "unittest", "-v", name], cwd=TESTS,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=CLASS_BOUND_S)
        code, output = done.returncode, done.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as exc:
        code = 124
        output = (exc.stdout or b"").decode("utf-8", "replace") + \
            f"\n{name}: still running after {CLASS_BOUND_S} s: ended\n"
    ran = RAN.findall(output)
    counts = {"ran": int(ran[-1]) if ran else 0}
    for key, value in COUNTS.findall(output.rpartition("\nRan ")[2]):
        counts[key] = counts.get(key, 0) + int(value)
    if code != 0 and not counts.get("failures") and not counts.get("errors"):
        counts["errors"] = 1                 # the process itself failed (an import, a kill)
    return name, code, counts, output, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=8,
                        help="classes run at once (default: %(default)s: on two cores the "
                             "suite then waits on the CPU, not on its sleeps)")
    parser.add_argument("pattern", nargs="?", default="test*.py",
                        help="which test modules (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)   # each process imports the same modules
    classes = test_classes(args.pattern)
    started = time.monotonic()
    totals: dict[str, int] = {}
    failed_classes = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        running = [pool.submit(run_class, name) for name in classes]
        for future in concurrent.futures.as_completed(running):
            name, code, counts, output, took = future.result()
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
            bad = counts.get("failures", 0) + counts.get("errors", 0)
            print(f"{'ok  ' if code == 0 else 'FAIL'} {name} ({counts['ran']} tests, "
                  f"{took:.1f} s)", flush=True)
            if code != 0 or bad:
                failed_classes.append(name)
                print(output, flush=True)
    ran, failed = totals.get("ran", 0), totals.get("failures", 0) + totals.get("errors", 0)
    print("-" * 70)
    print(f"Ran {ran} tests in {time.monotonic() - started:.3f}s\n")
    extra = ", ".join(f"{key}={value}" for key, value in totals.items()
                      if key != "ran" and value)
    print(("FAILED" if failed_classes else "OK") + (f" ({extra})" if extra else ""))
    if failed_classes:
        print("failed: " + ", ".join(failed_classes))
    skipped = totals.get("skipped", 0)
    print(f"tests: {ran - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed_classes or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
