#!/usr/bin/env python3
"""Run the whole suite with plain unittest, a few test classes at a time.

  python3 offload/launch/tests/run.py [-j N] [PATTERN]

Most tests wait on sockets and processes (a fake server, start.sh, the wrapper), not on
the CPU, so a 2-core machine runs several classes at once. Each class runs in its own
process, forked from this one once it has imported the test modules (as
`python3 -m unittest NAME` would run it alone, without paying Python's start and the
imports again), bounded in time; a class whose process fails shows its whole output.
The last lines are unittest's ("Ran N tests", OK or FAILED), each skipped test with why,
and one plain "tests: N passed, N failed, N skipped".
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import re
import select
import signal
import sys
import time
import traceback
import unittest

TESTS = os.path.dirname(os.path.abspath(__file__))
CLASS_BOUND_S = 600           # one class's process: far above any class's quiet run
SPLIT_AFTER_S = 12            # a class this long (runs_long) runs as two halves
RAN = re.compile(r"^Ran (\d+) tests? in", re.M)
COUNTS = re.compile(r"(failures|errors|skipped|expected failures|unexpected successes)=(\d+)")
SKIPPED = re.compile(r"^\S+ \(([\w.]+)\)(?:\n[^\n]*)? \.\.\. skipped '(.*)'$", re.M)


def test_classes(pattern: str) -> list[tuple[str, list[str]]]:
    """Every test class as (its name, the names to load), the longest to run first so that
    none starts last: those that say how long they run (a class attribute `runs_long`:
    seconds on a quiet run), longest first, then by test count. A class that runs
    SPLIT_AFTER_S or longer and sets up per test runs as two halves, side by side (each
    counted as half as long)."""
    found: dict[str, float] = {}
    tests: dict[str, list[str]] = {}
    once: set[str] = set()
    suites = [unittest.defaultTestLoader.discover(TESTS, pattern=pattern, top_level_dir=TESTS)]
    while suites:
        for item in suites.pop():
            if isinstance(item, unittest.TestSuite):
                suites.append(item)
            elif type(item).__name__ == "_FailedTest":      # a module that cannot import
                found[item.id().rpartition(".")[2]] = 0.0    # its name: it fails there
            else:
                cls = type(item)
                name = f"{cls.__module__}.{cls.__qualname__}"
                found[name] = float(getattr(cls, "runs_long", 0))
                tests.setdefault(name, []).append(item.id())
                if "setUpClass" in vars(cls):
                    once.add(name)
    units = []                          # (seconds, test count, name, names to load)
    for name, seconds in found.items():
        ids = sorted(tests.get(name, ()))
        if seconds < SPLIT_AFTER_S or name in once or len(ids) < 2:
            units.append((seconds, len(ids), name, [name]))
        else:
            units += [(seconds / 2, len(half), f"{name} [{i}/2]", half)
                      for i, half in ((1, ids[0::2]), (2, ids[1::2]))]
    return [(name, names) for _, _, name, names in
            sorted(units, key=lambda unit: (-unit[0], -unit[1], unit[2]))]


def run_class(names: list[str], slot: int) -> int:
    """In a forked child: run one class (or half of one), its output on stdout; the exit
    status to leave with. `slot`: which block of ports its tests hand out (support.py)."""
    os.environ["OFFLOAD_TEST_SLOT"] = str(slot)
    sys.stdout = sys.stderr = open(1, "w", encoding="utf-8", errors="replace",
                                   closefd=False, buffering=1)
    os.chdir(TESTS)                     # where `python3 -m unittest NAME` would run it
    unittest.installHandler()           # INT: the test running ends, cleanups and all
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    sys.stdout.flush()
    return 0 if result.wasSuccessful() else 1


class Child:
    """One class's process: forked from this one, so the test modules it imported are
    not imported again (a fresh `python3 -m unittest` paid ~0.1 s of CPU a class)."""

    def __init__(self, name: str, names: list[str], slot: int):
        self.name, self.output, self.started = name, bytearray(), time.monotonic()
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        self.pid = os.fork()
        if self.pid == 0:                                    # the child
            code = 1
            try:
                os.setpgid(0, 0)             # Ctrl-C reaches the runner, which passes it on
                os.close(read_end)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(write_end, 1)
                os.dup2(write_end, 2)
                code = run_class(names, slot)
            except BaseException:            # the class could not even run: say why
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        os.close(write_end)
        self.fd = read_end

    def result(self, status: int) -> tuple[str, int, dict, str, float]:
        """(name, exit status, counts, output, seconds) once the child has ended."""
        code = os.waitstatus_to_exitcode(status)
        output = self.output.decode("utf-8", "replace")
        if code < 0 and time.monotonic() - self.started >= CLASS_BOUND_S:
            code, output = 124, output + f"\n{self.name}: still running after " \
                                         f"{CLASS_BOUND_S} s: ended\n"
        ran = RAN.findall(output)
        counts = {"ran": int(ran[-1]) if ran else 0}
        for key, value in COUNTS.findall(output.rpartition("\nRan ")[2]):
            counts[key] = counts.get(key, 0) + int(value)
        if code != 0 and not counts.get("failures") and not counts.get("errors"):
            counts["errors"] = 1             # the process itself failed (an import, a kill)
        return self.name, code, counts, output, time.monotonic() - self.started


def stop_children(children) -> None:
    """INT to each running class's process group, as a terminal's Ctrl-C (its running
    test ends and cleans up); KILL to each group left after 30 s, or at a second Ctrl-C."""
    children = list(children)
    for child in children:
        signal_group(child.pid, signal.SIGINT)
    end = time.monotonic() + 30
    try:
        while children and time.monotonic() < end:
            children = [c for c in children if os.waitpid(c.pid, os.WNOHANG)[0] == 0]
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass                                  # a second Ctrl-C: no more waiting
    for child in children:
        signal_group(child.pid, signal.SIGKILL)
        os.waitpid(child.pid, 0)


def signal_group(pgid: int, signum: int) -> None:
    """A signal to a class's process group (its own: setpgid in the child), if any is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def run_all(classes: list[tuple[str, list[str]]], jobs: int, running: dict):
    """Each class's result as it ends, `jobs` children at a time (`running`: fd -> Child,
    for stop_children()); one thread, no pool (a child forked beside other threads could
    inherit a lock one of them held). A child has ended when it is reaped, not when its
    pipe closes: a process it left behind may hold the pipe open. Each child's slot (its
    block of ports) is its own."""
    waiting, slots = list(classes), itertools.count()
    while waiting or running:
        while waiting and len(running) < jobs:
            child = Child(*waiting.pop(0), next(slots))
            running[child.fd] = child
        ready, _, _ = select.select(list(running), [], [], 0.2)
        for fd in ready:
            running[fd].output += os.read(fd, 65536)
        for fd, child in list(running.items()):
            pid, status = os.waitpid(child.pid, os.WNOHANG)
            if pid == 0:
                if time.monotonic() - child.started > CLASS_BOUND_S:
                    signal_group(child.pid, signal.SIGKILL)     # and what it started
                continue
            os.set_blocking(fd, False)
            try:
                while chunk := os.read(fd, 65536):
                    child.output += chunk
            except BlockingIOError:
                pass                          # a process it left holds the pipe: no more
            os.close(fd)
            del running[fd]
            yield child.result(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=12,
                        help="classes run at once (default: %(default)s: on two cores the "
                             "suite then waits on the CPU, not on its sleeps: at 8 the CPU "
                             "sat idle a fifth of a run)")
    parser.add_argument("pattern", nargs="?", default="test*.py",
                        help="which test modules (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)   # each process imports the same modules
    classes = test_classes(args.pattern)
    gc.freeze()          # what is imported now, each child shares: its collections skip it
    started = time.monotonic()
    totals: dict[str, int] = {}
    failed_classes, skipped_tests = [], []
    running: dict = {}
    try:
        for name, code, counts, output, took in run_all(classes, args.jobs, running):
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
            skipped_tests += SKIPPED.findall(output)
            bad = counts.get("failures", 0) + counts.get("errors", 0)
            print(f"{'ok  ' if code == 0 else 'FAIL'} {name} ({counts['ran']} tests, "
                  f"{took:.1f} s)", flush=True)
            if code != 0 or bad:
                failed_classes.append(name)
                print(output, flush=True)
    except KeyboardInterrupt:           # Ctrl-C: each class stops as a terminal's would
        print("interrupted: stopping the running classes (Ctrl-C again: KILL them now)",
              file=sys.stderr, flush=True)
        stop_children(running.values())
        print("interrupted: the running classes were stopped", file=sys.stderr)
        return 130
    ran, failed = totals.get("ran", 0), totals.get("failures", 0) + totals.get("errors", 0)
    print("-" * 70)
    print(f"Ran {ran} tests in {time.monotonic() - started:.3f}s\n")
    extra = ", ".join(f"{key}={value}" for key, value in totals.items()
                      if key != "ran" and value)
    print(("FAILED" if failed_classes else "OK") + (f" ({extra})" if extra else ""))
    if failed_classes:
        print("failed: " + ", ".join(failed_classes))
    for test_id, why in sorted(skipped_tests):
        print(f"skipped: {test_id}: {why}")
    skipped = totals.get("skipped", 0)
    print(f"tests: {ran - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed_classes or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
