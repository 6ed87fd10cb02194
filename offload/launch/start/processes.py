"""What /proc says of a process and its process group: alive, or gone (a zombie is gone).

A zombie holds no port and may wait forever for a reaper (pid 1 in a container often does
not reap), so `kill -0` alone would see a dead server as running. Without /proc, a process
that `kill -0` reaches counts as running. The launcher's.
"""

from __future__ import annotations

import os

from core.cli import number_in
from tools.procfs import PROCESS_ID, proc_stat


def signalable(pid: int) -> bool:
    """Whether kill(pid, 0) reaches a process (or a group, for a negative pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_alive(pid: int, proc: str = "/proc") -> bool:
    """The process exists and is not a zombie (without /proc, kill -0 decides)."""
    if not signalable(pid):
        return False
    stat = proc_stat(str(pid), proc)
    return stat[0] != "Z" if stat else not os.path.isdir(proc)


def group_alive(pgid: int, proc: str = "/proc") -> bool:
    """Some member of the process group exists and is not a zombie."""
    if not signalable(-pgid):
        return False
    if not os.path.isdir(proc):
        return True                              # without /proc, trust kill -0
    return bool(live_members(1, pgid, proc))


def live_members(field: int, value: int, proc: str = "/proc") -> list[int]:
    """The live (not zombie) pids whose /proc stat has `value` at `field` (1: process
    group, 2: session, as proc_stat gives them); [] without /proc."""
    if not os.path.isdir(proc):
        return []
    found = []
    for name in os.listdir(proc):
        stat = proc_stat(name, proc) if number_in(name, PROCESS_ID) is not None else None
        if stat is not None and stat[field] == value and stat[0] != "Z":
            found.append(int(name))
    return found


def stop_session(sid: int, grace_s: float = 5.0, proc: str = "/proc") -> list[int]:
    """TERM every live process of session `sid` (a step's leftovers), KILL what is left
    after grace_s; the pids it found."""
    import signal
    import time

    found = live_members(2, sid, proc)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in live_members(2, sid, proc):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while live_members(2, sid, proc) and time.monotonic() < deadline:
            time.sleep(0.05)
    return found
