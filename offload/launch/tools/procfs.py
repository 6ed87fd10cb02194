"""What /proc says of a port: which processes (and process groups) hold a socket that
listens on it, and a process's state and group (proc_stat). Where /proc cannot tell, the
answer is None: what cannot be seen is not trusted. The readiness probe's and the launcher's.
"""

from __future__ import annotations

import os

from core.cli import number_in, whole

PROCESS_ID = whole(0, 9999999999)            # a pid or a group in /proc (NUMBER's grammar)


def proc_stat(pid: str, proc: str = "/proc") -> tuple[str, int, int] | None:
    """(state, process group, session) from /proc/PID/stat; None when there is no such
    process."""
    try:
        with open(os.path.join(proc, pid, "stat"), "rb") as handle:
            line = handle.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    fields = line[line.rfind(")") + 2:].split()     # the name may hold spaces and ')'
    group, session = (number_in(f, PROCESS_ID) for f in fields[2:4]) if len(fields) > 3 \
        else (None, None)
    return None if group is None or session is None else (fields[0], group, session)


def listening_inodes(port: int, proc: str = "/proc") -> set[str] | None:
    """The socket inodes listening on a TCP port in this network namespace (IPv4 and IPv6,
    any address); None when /proc/net/tcp cannot be read."""
    found, read = set(), False
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table), "rb") as handle:
                read = listeners(handle, f"{port:04X}", found) or read
        except OSError:
            continue
    return found if read else None


def listeners(handle, port: str, found: set) -> bool:
    """Add the inodes of a /proc/net/tcp table's listeners on `port` (hex) to `found`.
    The kernel lists every listening socket first (tcp_get_idx: the listening hash, then
    the established one; before Linux 4.4 each listener's half-open connections, SYN_RECV,
    follow it there), so the reading stops at the first line in another state: on a
    server with thousands of connections the kernel does not format them all, at every
    readiness probe. True once the header was read."""
    if not handle.readline():
        return False
    for line in iter(handle.readline, b""):
        fields = line.decode("ascii", "replace").split()
        if len(fields) <= 9 or fields[3] not in ("0A", "03"):
            break
        if fields[3] != "0A":
            continue
        if fields[1].rpartition(":")[2] == port:
            found.add(fields[9])
    return True


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
        if number_in(name, PROCESS_ID) is None:
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


def not_held_by(owners: list, pid: int) -> tuple[int, int] | None:
    """The one rule of who may hold a server's port: the process start.sh launched itself
    (its pid is its group), never only another member of its group (a proxy it started),
    and nothing outside that group. The (pid, group) that breaks it, or None. Pure."""
    others = [owner for owner in owners if owner[1] != pid]
    if others or not any(holder == pid for holder, _ in owners):
        return (others or owners)[0]
    return None


def foreign_holders(port: int, pgid: int, proc: str = "/proc") -> list[tuple[int, int]] | None:
    """The (pid, group) outside process group `pgid` that listen on the port ([]: only
    that group); None when /proc cannot tell."""
    owners = port_owners(port, proc)
    return None if owners is None else [o for o in owners if o[1] != pgid]
