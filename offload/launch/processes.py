"""What /proc says of a process and its process group: alive, or gone (a zombie is gone).

A zombie holds no port and may wait forever for a reaper (pid 1 in a container often does
not reap), so `kill -0` alone would see a dead server as running. Without /proc, a process
that `kill -0` reaches counts as running. The launcher's; standard library only.
"""

from __future__ import annotations

import os
import re

DIGITS = re.compile(r"[0-9]{1,10}")          # str.isdigit() would take "²"


def proc_stat(pid: str, proc: str = "/proc") -> tuple[str, int, int] | None:
    """(state, process group, session) from /proc/PID/stat; None when there is no such
    process."""
    try:
        with open(os.path.join(proc, pid, "stat"), "rb") as handle:
            line = handle.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = line[line.rfind(")") + 2:].split()     # the name may hold spaces and ')'
    if len(fields) < 4 or not DIGITS.fullmatch(fields[2]) or not DIGITS.fullmatch(fields[3]):
        return None
    return fields[0], int(fields[2]), int(fields[3])


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
        stat = proc_stat(name, proc) if DIGITS.fullmatch(name) else None
        if stat is not None and stat[field] == value and stat[0] != "Z":
            found.append(int(name))
    return found


def listening_inodes(port: int, proc: str = "/proc") -> set[str] | None:
    """The socket inodes listening on a TCP port in this network namespace (IPv4 and IPv6,
    any address); None when /proc/net/tcp cannot be read."""
    found, read = set(), False
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table), "rb") as handle:
                lines = handle.read(16 << 20).decode("ascii", "replace").splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and \
                    fields[1].rpartition(":")[2] == f"{port:04X}":
                found.add(fields[9])
    return found if read else None


def port_owners(port: int, proc: str = "/proc") -> list[tuple[int, int]] | None:
    """(pid, process group) of each process holding a socket that listens on the port
    ([]: nothing listens); None when that cannot be told (/proc/net unreadable, or a
    listener whose holder this process may not see: another PID namespace or user)."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None if inodes is None else []
    wanted = {f"socket:[{inode}]" for inode in inodes}
    owners, seen = [], set()
    for name in os.listdir(proc):
        if not DIGITS.fullmatch(name):
            continue
        try:
            fds = os.listdir(os.path.join(proc, name, "fd"))
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(os.path.join(proc, name, "fd", fd))
            except OSError:
                continue
            if link in wanted:
                seen.add(link)
                stat = proc_stat(name, proc)
                if stat is not None and (int(name), stat[1]) not in owners:
                    owners.append((int(name), stat[1]))
    return owners if seen == wanted else None


def foreign_holders(port: int, pgid: int, proc: str = "/proc") -> list[tuple[int, int]] | None:
    """The (pid, group) outside process group `pgid` that listen on the port ([]: only
    that group); None when /proc cannot tell."""
    owners = port_owners(port, proc)
    return None if owners is None else [o for o in owners if o[1] != pgid]


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
