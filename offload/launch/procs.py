#!/usr/bin/env python3
"""Whether a process, or a process group, still runs: what start.sh asks of /proc.

  procs.py alive PID      exit 0 when the process runs (a zombie does not), else 1
  procs.py group PGID     exit 0 when a member of the group runs (zombies do not), else 1
  (2: usage error)

A zombie holds no port and waits for a reaper that may never come (pid 1 in a container
often does not reap), so `kill -0` alone would see a dead server as running. Without
/proc, a process that `kill -0` reaches counts as running. Standard library only.
"""

from __future__ import annotations

import os
import re
import sys

PROC = "/proc"
DIGITS = re.compile(r"[0-9]{1,10}")      # str.isdigit() would take "²"


def proc_stat(pid: int, proc: str = PROC) -> tuple[str, int] | None:
    """(state, process group) from /proc/PID/stat; None when there is no such process."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), "rb") as handle:
            line = handle.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = line[line.rfind(")") + 2:].split()     # the name may hold spaces and ')'
    if len(fields) < 3 or not DIGITS.fullmatch(fields[2].lstrip("-")):
        return None
    return fields[0], int(fields[2])


def signalable(pid: int) -> bool:
    """Whether kill(pid, 0) reaches a process (or group, for a negative pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive(pid: int, proc: str = PROC) -> bool:
    """The process exists and is not a zombie."""
    if not signalable(pid):
        return False
    stat = proc_stat(pid, proc)
    return stat is None and not os.path.isdir(proc) or stat is not None and stat[0] != "Z"


def group_alive(pgid: int, proc: str = PROC) -> bool:
    """Some member of the process group exists and is not a zombie."""
    if not signalable(-pgid):
        return False
    if not os.path.isdir(proc):
        return True                              # without /proc, trust kill -0
    for name in os.listdir(proc):
        if DIGITS.fullmatch(name):
            stat = proc_stat(int(name), proc)
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                return True
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("alive", "group") or not DIGITS.fullmatch(argv[1]) \
            or not 0 < int(argv[1]) < 1 << 22:
        print("usage: procs.py alive PID | procs.py group PGID", file=sys.stderr)
        return 2
    check = alive if argv[0] == "alive" else group_alive
    return 0 if check(int(argv[1])) else 1


if __name__ == "__main__":
    sys.exit(main())
