"""Held session files: the spool keeps where an unarchived message's line is, not a copy of it.

The spool rows of messages still in the session file keep only their line's offsets and digest; the
version of the file they are in is held in the state folder as `held/<session id>.<generation>`:

- a hard link (no byte copied) once the file was seen replaced by a rename, the way nanobot saves every
  time (NANOBOT-COMPAT.md): the version read then lives on, whatever the writer does next, until nanobotd
  lets it go;
- until then (a file seen once, a writer that rewrites in place, a state folder that cannot link), a private
  copy of the version read: a writer truncating the file in place cannot take the held lines with it.

When a later version drops a message before it was archived, its line is copied out of the held version
into the spool first; then the held version moves on to the new one.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from loguru import logger

from nanobotd import fsio
from nanobotd.faults import FaultPoints
from nanobotd.memory.transcript import record_json
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions.scan import LineRef
from nanobotd.tuning import HELD_READ_GAP, HELD_READ_SPAN, STREAM_BLOCK

HELD_DIR = "held"
NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


class LinkUnsupported(OSError):
    """The state folder cannot hard-link session files (another filesystem, or not permitted)."""


class Holds:
    """The held session files in one state folder."""

    def __init__(self, state_dir: Path, faults: FaultPoints | None = None):
        self.folder = Path(state_dir) / HELD_DIR
        self.faults = faults or FaultPoints()  # "holds.sync": reached as a group's versions are synced
        # inside together(): the copies made, open, their syncs to come; and whether the folder has a new entry
        self._unsynced: list[int] | None = None
        self._folder_unsynced = False
        self._no_links: set[int] = set()  # the filesystems (st_dev) of session files a link from failed with EXDEV

    @contextmanager
    def together(self) -> Iterator[None]:
        """Sync the versions held inside it together as it ends (the caller commits the rows that refer to them
        after it): each copy's writeback starts as it is made, then one sync each and one of the folder, instead
        of a folder sync (a journal commit) for every file of a first start."""
        if self._unsynced is not None:  # already inside one: its end syncs these too
            yield
            return
        self._unsynced, self._folder_unsynced = [], False
        try:
            yield
            self.faults.reach("holds.sync")
            for fd in self._unsynced:
                os.fsync(fd)
            if self._folder_unsynced:
                fsio.fsync_dir(self.folder)
        finally:
            unsynced, self._unsynced = self._unsynced, None
            for fd in unsynced:
                os.close(fd)

    def path(self, session_id: int, generation: int) -> Path:
        return self.folder / f"{session_id}.{generation}"

    def inode(self, session_id: int, generation: int) -> int | None:
        """The inode a held file links, None when there is none."""
        if generation <= 0:
            return None
        try:
            return os.stat(self.path(session_id, generation)).st_ino
        except FileNotFoundError:
            return None

    def can_link(self, handle: BinaryIO) -> bool:
        """Whether a link of the file open in *handle* may work: not when one from its filesystem could not cross
        to the state folder's (every save of every session would try, fail and say so again)."""
        return os.fstat(handle.fileno()).st_dev not in self._no_links

    def hold(self, source: Path, handle: BinaryIO, session_id: int, generation: int, *, link: bool) -> bool:
        """Keep the version of the session file open in *handle* as generation *generation*.

        *link*: hard-link *source* (no bytes copied), when it is still that version (False when it was
        replaced meanwhile; LinkUnsupported when links cannot work here). Otherwise a private copy of the
        version read, made from *handle* and synced before the spool refers to it.
        """
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self.path(session_id, generation)
        target.unlink(missing_ok=True)
        if not link:
            self._settle(target, _copy_from(handle, target))
            return True
        try:
            os.link(source, target)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                self._no_links.add(os.fstat(handle.fileno()).st_dev)
            raise LinkUnsupported(exc.errno, f"cannot hard-link {source} into {self.folder}: {exc.strerror}") from exc
        if os.stat(target).st_ino != os.fstat(handle.fileno()).st_ino:
            target.unlink(missing_ok=True)
            return False
        self._settle(target)
        return True

    def _settle(self, target: Path, fd: int | None = None) -> None:
        """A new version in the folder, and the open descriptor of its copy when it is one: synced before the spool
        refers to it (a copy that cannot be is removed), now or at together()'s end."""
        if self._unsynced is not None:
            if fd is not None:
                self._unsynced.append(fd)
            self._folder_unsynced = True
            return
        if fd is not None:
            try:
                os.fsync(fd)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)
        fsio.fsync_dir(self.folder)

    def read(self, session_id: int, generation: int, shift: int, lines: Iterable[LineRef | None]) -> list[str | None]:
        """The text of each held line, its offsets before the session's *shift* (None for a line that is not
        held, or whose bytes are no longer there)."""
        wanted = list(lines)
        texts: list[str | None] = [None] * len(wanted)
        if not any(wanted):
            return texts
        try:
            return read_held_lines(self.path(session_id, generation), shift, wanted)
        except OSError as exc:
            logger.error("held session file {} is unreadable: {}", self.path(session_id, generation), exc)
            return texts

    def drop(self, session_id: int, generation: int) -> None:
        if generation > 0:
            self.path(session_id, generation).unlink(missing_ok=True)

    def sweep(self, owned: dict[int, int]) -> int:
        """Remove the held files of sessions in *owned* (session id -> its current generation) other than
        their current one (left behind by a crash between a link and its commit); returns how many."""
        if not self.folder.is_dir():
            return 0
        removed = 0
        for entry in self.folder.iterdir():
            session, _, generation = entry.name.partition(".")
            if not (session.isdigit() and generation.isdigit()) or int(session) not in owned:
                continue
            if int(generation) != owned[int(session)]:
                entry.unlink(missing_ok=True)
                removed += 1
        return removed


def read_held_lines(path: Path, shift: int, lines: list[LineRef | None], *, span_bytes: int = HELD_READ_SPAN,
                    gap_bytes: int = HELD_READ_GAP) -> list[str | None]:
    """The text of each line of the held version at *path* (None for a line that is not held, or whose bytes
    are no longer there); OSError when the file cannot be opened. Lines that follow each other in the file (a
    chunk's usually all do) are read with one read a span of them (*span_bytes* at most, gaps of *gap_bytes*)."""
    texts: list[str | None] = [None] * len(lines)
    with fsio.open_regular(path) as handle:
        for span in _spans(lines, span_bytes, gap_bytes):
            first = lines[span[0]].start
            handle.seek(first + shift)
            block = handle.read(lines[span[-1]].end - first)
            for index in span:
                line = lines[index]
                data = block[line.start - first:line.end - first].strip()
                texts[index] = line_text(data) if sessionfile.line_digest(data) == line.line_digest else None
    return texts


def _spans(lines: list[LineRef | None], span_bytes: int, gap_bytes: int) -> list[list[int]]:
    """The indexes of *lines* in groups read at once: lines in file order, each group at most *span_bytes* from
    the start of its first line to the end of its last, with gaps of at most *gap_bytes*."""
    spans: list[list[int]] = []
    start = end = 0
    for index, line in enumerate(lines):
        if line is None:
            continue
        if (not spans or line.start < end or line.start - end > gap_bytes
                or line.end - start > span_bytes):
            spans.append([])
            start = line.start
        spans[-1].append(index)
        end = max(end, line.end) if len(spans[-1]) > 1 else line.end
    return spans


def _copy_from(handle: BinaryIO, target: Path) -> int:
    """Copy the whole file open in *handle* to *target*, its writeback started; returns the copy's open
    descriptor, for Holds._settle to sync. In the kernel where it can; a streamed copy where the kernel will not
    copy between the two filesystems (a state folder on another mount than the sessions: EXDEV, or EINVAL /
    EOPNOTSUPP from filesystems without copy_file_range)."""
    source = handle.fileno()
    size = os.fstat(source).st_size
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        copied = _copy_in_kernel(source, fd, size)
        while copied < size:
            block = os.pread(source, min(STREAM_BLOCK, size - copied), copied)
            if not block:
                break
            copied += os.pwrite(fd, block, copied)
        # the advice starts the writeback now (Linux): a sync that follows finds it done or going
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except BaseException:
        os.close(fd)
        target.unlink(missing_ok=True)
        raise
    return fd


def _copy_in_kernel(source: int, fd: int, size: int) -> int:
    """How many bytes of *source* copy_file_range copied to *fd* (all of them, or as far as the kernel would)."""
    copied = 0
    while copied < size:
        try:
            done = os.copy_file_range(source, fd, size - copied, copied, copied)
        except OSError as exc:
            if exc.errno in NO_KERNEL_COPY:
                return copied
            raise
        if done == 0:
            break
        copied += done
    return copied


def line_text(data: bytes) -> str:
    """A message line as the spool keeps its record: the file's JSON text (JSON in another encoding than
    UTF-8 as compact JSON text)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return record_json(json.loads(data))
