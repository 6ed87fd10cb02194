"""One helper per server on this host: a lock per server address, held for a run. Every
helper takes it before it sends anything; a second one at the same address is refused at
once (exit 3). It lives in WARMUP_LOCK_DIR (else the temporary folder), gone with its run.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import stat

from core.cli import EXIT_REFUSED, EXIT_USAGE
from core.runframe import Fatal
from core.sanitize import clean_text
from core.transport import Target


def lock_path(target: Target) -> str:
    """The lock file of a server's address (localhost and 127.0.0.1 are one address), in
    one folder for every helper on the host: WARMUP_LOCK_DIR, else the temporary folder."""
    name = re.sub(r"[^A-Za-z0-9.-]", "_", f"{lock_host(target.host)}_{target.port}")
    folder = os.environ.get("WARMUP_LOCK_DIR")
    if not folder:
        import tempfile                  # not loaded where the folder is given
        folder = tempfile.gettempdir()
    return os.path.join(folder, f"offload-launch-{name}.lock")


def lock_host(host: str) -> str:
    """One spelling per address this host connects to: localhost, 127.1, 2130706433,
    ::ffff:127.0.0.1 and 0.0.0.0 (a connect there reaches this host) are all 127.0.0.1;
    another name is itself, lower case (a second name for one server is caught by the
    counters, not the lock)."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return "127.0.0.1"
    try:
        packed = socket.inet_aton(host)
    except OSError:
        try:
            packed = socket.inet_pton(socket.AF_INET6, host)
        except OSError:
            return host
        packed = packed[12:] if packed[:12] == bytes(10) + b"\xff\xff" else packed  # ::ffff:
    if not any(packed):
        return "127.0.0.1" if len(packed) == 4 else "::1"
    return socket.inet_ntop(socket.AF_INET if len(packed) == 4 else socket.AF_INET6, packed)


def take_server_lock(target: Target) -> int:
    """An exclusive lock on the server's address for the run (flock): a second helper
    against the same server on this host is refused at once, while the first runs on.
    Returns the lock's descriptor. The holder removes the file when it lets go, so a lock
    taken on a file that is no longer the path's is taken again on the new one. A file
    another user made is locked read-only."""
    path = lock_path(target)
    for _ in range(10):
        fd = open_lock_file(path, target)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise Fatal(f"refused: another helper (pid {clean_text(holder, 20) or 'unknown'}) "
                        f"is sending to {target.display} from this host; one at a time, or "
                        f"neither warm-up shows what it did; nothing was sent", EXIT_REFUSED)
        if same_file(fd, path):
            break
        os.close(fd)                      # its holder removed it as we opened it: again
    else:
        raise Fatal(f"cannot take the lock {path} for {target.display}: it keeps being "
                    f"replaced; nothing was sent", EXIT_USAGE)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except OSError:
        pass                              # a read-only lock: no pid to name
    return fd


def open_lock_file(path: str, target: Target) -> int:
    """The lock file opened (made when missing), a regular file only: a FIFO, a device or
    a folder at the path is a refusal naming it (exit 3); a folder we cannot write, a
    usage error that says so."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK     # a FIFO must not block us
    if os.path.islink(path):
        raise Fatal(f"refused: the lock path {path} for {target.display} is a link, not a "
                    f"regular file: something else put it there; remove it, or point "
                    f"WARMUP_LOCK_DIR elsewhere; nothing was sent", EXIT_REFUSED)
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
        except PermissionError as denied:  # another user's file: a read-only lock holds too
            try:
                fd = os.open(path, os.O_RDONLY | flags)
            except FileNotFoundError:      # no file, and a folder we may not write
                raise denied from None
    except OSError as exc:
        raise Fatal(f"cannot take the lock {path} for {target.display} "
                    f"({exc.strerror or exc}); point WARMUP_LOCK_DIR at a folder every "
                    f"helper on this host can write; nothing was sent", EXIT_USAGE)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Fatal(f"refused: the lock path {path} for {target.display} is not a regular "
                    f"file (a FIFO, device or folder): something else put it there; remove "
                    f"it, or point WARMUP_LOCK_DIR elsewhere; nothing was sent", EXIT_REFUSED)
    return fd


def same_file(fd: int, path: str) -> bool:
    """The descriptor is the file at path (not one its holder removed)."""
    try:
        held, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def release_server_lock(fd: int, target: Target) -> None:
    """Remove the lock file while still holding it, then let go: no file is left behind,
    and a helper that opened it meanwhile finds it replaced and locks the new one."""
    try:
        if same_file(fd, lock_path(target)):
            os.unlink(lock_path(target))
    except OSError:
        pass                              # another user's file in a shared folder
    os.close(fd)
