"""Files a program reads, writes and removes: regular files only (a FIFO or a device could
block, a link could point anywhere), small JSON files within a bound, atomic writes."""

from __future__ import annotations

import os
import stat

from core.transport import MAX_BODY_BYTES, decode_json


def regular(path: str) -> bool | None:
    """The one rule for a file of ours: True for a regular file (never a link), False for
    anything else there (a link, FIFO, device, folder, or what cannot be looked at), None
    for nothing."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None
    except OSError:
        return False


def open_regular(path: str):
    """A regular file opened for reading without blocking on a FIFO; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_own(path: str, mode: str = "ab"):
    """A file of ours (a log, a pid file) opened to append or rewrite, never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (
        os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)          # a FIFO planted there never blocks the open
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file (a FIFO or a device)", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
    except BaseException:
        os.close(fd)
        raise


def read_json_file(path: str, limit: int = MAX_BODY_BYTES) -> tuple[object, str | None]:
    """A small JSON file (status files, the ready file), read within `limit` bytes; (None,
    why) when bad. Only a regular file: a FIFO or a device could block the read."""
    with open_regular(path) as handle:
        data = handle.read(limit + 1)
    return decode_json(data) if len(data) <= limit else (None, "too large")


def _temporary_beside(path: str) -> tuple[int, str, str | None]:
    """A new temporary file beside `path`, which must be a regular file or nothing:
    (descriptor, its path, None), or (-1, '', why not)."""
    import tempfile
    if regular(path) is False:
        return -1, "", "not a regular file (a device, FIFO, link or folder is never replaced)"
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                         dir=os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        return -1, "", f"{exc.strerror or exc}"
    return fd, temporary, None


def writable(path: str) -> str | None:
    """Why write_atomically(path) would fail, found by trying its first step; None when
    it would not."""
    fd, temporary, why = _temporary_beside(path)
    if why is None:
        os.close(fd)
        os.unlink(temporary)
    return why


def write_atomically(path: str, text: str) -> str | None:
    """Write a whole file at once (a temporary file beside it, then a rename: a reader sees
    the old or the new, never half), replacing only a regular file; None, or why not."""
    fd, temporary, why = _temporary_beside(path)
    if why:
        return why
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        return f"{exc.strerror or exc}"
    return None


def remove_regular(path: str) -> tuple[bool | None, str]:
    """A regular file of ours removed, never a link: (True, ''), (None, '') none, (False, why)."""
    try:
        return (os.remove(path) or True, "") if regular(path) else (None, "")
    except OSError as exc:
        return False, exc.strerror or type(exc).__name__
