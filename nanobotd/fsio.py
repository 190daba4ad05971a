"""Crash-safe file I/O: the only place that writes files that matter.

Whole-file writes go temp file -> fsync -> os.replace -> fsync(dir), so a crash leaves either the old or
the new content. Appends are one os.write per record followed by fsync. Locks are flock based, with a
timeout so nanobotd never waits forever on somebody else's lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_POLL_SECONDS = 0.02


class LockTimeout(TimeoutError):
    """A flock could not be taken within its timeout."""


def fsync_dir(directory: Path) -> None:
    """Make a rename or create inside *directory* durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path | str, data: bytes | str, mode: int | None = None) -> None:
    """Replace *path* with *data* so that a crash leaves the old or the new file, never a mix."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644 & ~_current_umask()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_dir(path.parent)


def append_record(path: Path | str, record: bytes | str) -> None:
    """Append one record (a line) with a single write and fsync it."""
    path = Path(path)
    if isinstance(record, str):
        record = record.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(record)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def ensure_trailing_newline(path: Path) -> None:
    """Terminate a torn last line so the next appended record starts on its own line."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
    except FileNotFoundError:
        return
    if last != b"\n":
        append_record(path, b"\n")


@contextlib.contextmanager
def file_lock(path: Path | str, *, shared: bool = False, timeout: float = 10.0) -> Iterator[int]:
    """Hold an flock on *path* (created if missing); raise LockTimeout after *timeout* seconds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    operation = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, operation)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"could not lock {path} within {timeout:.1f}s") from exc
                time.sleep(LOCK_POLL_SECONDS)
        yield fd
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_text_lossy(path: Path, limit: int | None = None) -> str:
    """Read a text file as UTF-8, replacing undecodable bytes, optionally at most *limit* bytes."""
    with open(path, "rb") as handle:
        data = handle.read() if limit is None else handle.read(limit)
    return data.decode("utf-8", errors="replace")


def _current_umask() -> int:
    # os.umask() can only be read by setting it, which races with other threads; /proc has it read-only.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
