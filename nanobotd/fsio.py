"""Crash-safe file I/O: the only place that writes files that matter.

Whole files go temp file -> fsync -> os.replace -> fsync(dir); appends are one fsynced write per record, cut back when
they fail; flocks time out. A write may name the folder it must stay in (`root`, `confine`); files others own are read
through `open_regular`."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from loguru import logger

from nanobotd.tuning import FILE_LOCK_POLL_SECONDS as LOCK_POLL_SECONDS

TORN_SUFFIX = ".torn"
TORN_TAIL_LIMIT = 64 * 1024 * 1024  # a longer unterminated tail is no torn line but a file without newlines
TEMP_SUFFIX = ".tmp"
SECTOR_BYTES = 512  # a write this long at offset 0 lands whole or not at all (the unit disks write atomically)


class LockTimeout(TimeoutError):
    """A flock could not be taken within its timeout."""


class UnsafePath(PermissionError):
    """A write target, or a folder on its way, leads outside the folder the write must stay in."""


class NotRegularFile(OSError):
    """A file to read is a FIFO, a device, a socket or a symlink: reading it could block or never end."""


def confine(path: Path | str, root: Path | str | None) -> Path:
    """*path*, after checking that it resolves inside *root* (symlinks followed): a symlinked history.jsonl or
    memory folder would make a write land outside the workspace; UnsafePath, logged, instead."""
    path = Path(path)
    if root is None:
        return path
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and os.path.commonpath([real_root, real]) != real_root:
        logger.error("refusing to write {}: it leads to {}, outside {} (a symlink?)", path, real, root)
        raise UnsafePath(f"refusing to write {path}: it resolves to {real}, outside {root}")
    return path


def open_regular(path: Path | str, *, follow: bool = False) -> BinaryIO:
    """Open a regular file for reading, without blocking, and (unless *follow*) not through a symlink: a FIFO
    would block forever and /dev/zero never end, so both are NotRegularFile (an OSError: callers skip it)."""
    info = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(f"not a regular file ({file_kind(info.st_mode)}): {path}")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(f"not a regular file (symlink): {path}") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the stat and the open
        os.close(fd)
        raise NotRegularFile(f"not a regular file: {path}")
    return os.fdopen(fd, "rb")


def file_kind(mode: int) -> str:
    """'FIFO', 'character device', ... for a message about a file that is not regular."""
    kinds = ((stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"))
    return next((name for test, name in kinds if test(mode)), "special file")


def fsync_dir(directory: Path) -> None:
    """Make a rename or create inside *directory* durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(folder: Path, files: Iterable[Path]) -> None:
    """Make *files* (written under *folder*) and *folder*'s entries durable: one syncfs of the folder's filesystem
    instead of an fsync a file (a journal commit each); an fsync of each and of the folder where syncfs is missing."""
    syncfs = _syncfs()
    if syncfs is None:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


@functools.cache
def _syncfs() -> Callable[[int], None] | None:
    """The C library's syncfs (Linux) raising OSError as os functions do; None where there is none."""
    import ctypes  # here, not at the top: nanobotctl's imports stay light

    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None

    def syncfs(fd: int) -> None:
        if call(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
    return syncfs


def atomic_write(path: Path | str, data: bytes | str, mode: int | None = None, *,
                 root: Path | str | None = None) -> None:
    """Replace *path* with *data* so that a crash leaves the old or the new file, never a mix."""
    with AtomicWriter(path, mode, root=root) as writer:
        writer.write(data.encode("utf-8") if isinstance(data, str) else data)
        writer.commit()


def overwrite_counter(path: Path | str, text: str, *, root: Path | str | None = None) -> None:
    """Put a growing counter's decimal *text* in *path* in place: one write at offset 0 (a few bytes in the first
    sector, so a power cut leaves old or new) and an fdatasync, not temp file, rename and folder sync. The new digits
    cover the old (an old trailing newline stays until the truncate after it); atomic_write for a file missing,
    not regular or hard-linked."""
    path = confine(path, root)
    data = text.encode("ascii")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        atomic_write(path, data, root=root)
        return
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or len(data) > SECTOR_BYTES:
            os.close(fd)
            fd = -1
            atomic_write(path, data, root=root)
            return
        os.pwrite(fd, data, 0)
        if info.st_size > len(data):
            os.ftruncate(fd, len(data))
        os.fdatasync(fd)
    finally:
        if fd >= 0:
            os.close(fd)


class AtomicWriter:
    """A replacement for *path* written piece by piece into a temp file beside it, put in place by `commit()`;
    leaving the `with` block without it deletes the temp file (a file of any size, never held in memory)."""

    def __init__(self, path: Path | str, mode: int | None = None, *, root: Path | str | None = None):
        self.path = confine(path, root)
        self.mode = mode
        self._handle: BinaryIO | None = None
        self._tmp_name = ""

    def __enter__(self) -> AtomicWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.mode is None:
            try:
                self.mode = os.stat(self.path).st_mode & 0o7777
            except FileNotFoundError:
                self.mode = 0o644 & ~_current_umask()
        fd, self._tmp_name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=TEMP_SUFFIX, dir=self.path.parent)
        self._handle = os.fdopen(fd, "wb")
        return self

    def write(self, data: bytes) -> None:
        """Add *data* to the new content."""
        self._handle.write(data)

    def commit(self) -> None:
        """Put the new content in place of *path*, durably."""
        handle, self._handle = self._handle, None
        try:
            with handle:
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(self._tmp_name, self.mode)
            os.replace(self._tmp_name, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp_name)
            raise
        fsync_dir(self.path.parent)

    def __exit__(self, *exc_info) -> None:
        if self._handle is not None:  # not committed: the old file stays
            self._handle.close()
            self._handle = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp_name)


def append_record(path: Path | str, record: bytes | str, *, root: Path | str | None = None) -> None:
    """Append one record with a single write and fsync it; a failed append (a full disk) is truncated back off,
    so no reader trips over a torn line."""
    path = confine(path, root)
    if isinstance(record, str):
        record = record.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _append_or_undo(fd, record)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def _append_or_undo(fd: int, record: bytes) -> None:
    before = os.fstat(fd).st_size
    try:
        view = memoryview(record)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, before)
            os.fsync(fd)
        raise


def repair_torn_tail(path: Path, *, root: Path | str | None = None,
                     is_whole: Callable[[bytes], bool] | None = None) -> int:
    """Move an unterminated last line (a write cut short) to `<name>.torn` for a person to read; its size (0:
    none). A last line that *is_whole* accepts only gets its newline."""
    try:
        handle = open_regular(path, follow=True)
    except FileNotFoundError:
        return 0
    with handle:
        size = os.fstat(handle.fileno()).st_size
        start = _last_line_start(handle, size)
        if start is None:
            return 0
        handle.seek(start)
        torn = handle.read(size - start)
    if is_whole is not None and is_whole(torn):
        append_record(path, b"\n", root=root)
        return 0
    append_record(path.with_name(path.name + TORN_SUFFIX), torn + b"\n", root=root)
    fd = os.open(confine(path, root), os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, start)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size - start


def _last_line_start(handle: BinaryIO, size: int) -> int | None:
    """Where an unterminated last line starts, or None when the file ends with a newline (or is empty)."""
    if size == 0:
        return None
    handle.seek(size - 1)
    if handle.read(1) == b"\n":
        return None
    position, block = size, 64 * 1024
    while position > 0 and size - position < TORN_TAIL_LIMIT:
        start = max(0, position - block)
        handle.seek(start)
        newline = handle.read(position - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return position if position == 0 else None


def ensure_trailing_newline(path: Path, *, root: Path | str | None = None) -> None:
    """Terminate a torn last line so the next appended record starts on its own line."""
    try:
        with open_regular(path, follow=True) as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
    except FileNotFoundError:
        return
    if last != b"\n":
        append_record(path, b"\n", root=root)


@contextlib.contextmanager
def file_lock(path: Path | str, *, shared: bool = False, timeout: float = 10.0,
              root: Path | str | None = None) -> Iterator[int]:
    """Hold an flock on *path* (created if missing); raise LockTimeout after *timeout* seconds."""
    path = confine(path, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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


def read_text_lossy(path: Path, limit: int | None = None, *, follow: bool = True) -> str:
    """Read a regular text file as UTF-8, replacing undecodable bytes, optionally at most *limit* bytes (through
    a symlink unless not *follow*)."""
    with open_regular(path, follow=follow) as handle:
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
