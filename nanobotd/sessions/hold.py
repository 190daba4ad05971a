"""The held versions of session files: the spool keeps where an unarchived message's line is, not a copy of it.

When a scan finds many new unarchived messages at once (a file seen the first time, a cold start, a backlog) and
no version of the file is held, it makes a private copy of the version it read (a long file seen the first time
is copied before it is even read: the tracker holds it unread), `held/<session id>.<generation>`,
and their spool rows keep only their lines' offsets and digests. Nothing writes a copy again, whatever the agent,
the user or an editor does to the session file, so a held line stays readable until its message is archived. (A
hard link would not do: it is the file itself for every write in place, `: > file` or vim's save of a file with
more than one link, and would raise the file's link count, which makes vim write in place.)

A session holds one version at most. New rows that arrive while it is held, or too few to pay for a copy of the
whole file (an ordinary turn's save), go into the spool as text. The copy goes once no row is held in it.

An older state folder may hold hard links (listed in `held_links` by the state database's migration): at start
each is copied and its held lines are checked, once; rows whose line a write in place took are reported, and
that session's file is read whole at its next scan, so what is still in it (moved) is spooled again.
"""

from __future__ import annotations

import errno
import functools
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from loguru import logger

from nanobotd import fsio
from nanobotd.faults import FaultPoints
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.scan import LineRef, ParseResult, parse_session
from nanobotd.sessions.session import SessionState, save_hold
from nanobotd.state import bulk
from nanobotd.state.store import StateStore
from nanobotd.tuning import HELD_READ_GAP, HELD_READ_SPAN, HOLD_MIN_BYTES, STREAM_BLOCK

HELD_DIR = "held"
NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


@dataclass(frozen=True)
class HoldPlan:
    """What one scan does about a session's held version."""

    made: int = 0  # the generation of the copy made to hold this scan's new rows (0: they go in as text)
    drop: int = 0  # the version it replaces (no row was held in it), removed once the scan committed

    @property
    def shift(self) -> int | None:
        """spool.insert_rows' *shift*: 0, the rows are held in the copy; None, they are copied as text."""
        return 0 if self.made else None


class Holding:
    """Each session's held version: the files in the state folder and the spool rows pointing into them; its lock
    is the tracker's (a held row and its version are read as one)."""

    def __init__(self, store: StateStore, lock: threading.RLock, faults: FaultPoints | None = None) -> None:
        self.store, self.lock = store, lock
        self.folder = Path(store.state_dir) / HELD_DIR
        self.faults = faults or FaultPoints()  # "holds.sync": reached as a group's versions are synced
        self._unsynced: list[Path] | None = None  # inside together(): the versions made, their sync to come

    # -- the files ------------------------------------------------------------------------------------
    @contextmanager
    def together(self) -> Iterator[None]:
        """Sync the versions held inside it together as it ends (the caller commits the rows that refer to them
        after it): each copy's writeback starts as it is made, then one sync of the state folder's filesystem,
        instead of a sync a file and a folder sync (a journal commit each) for every file of a first start."""
        if self._unsynced is not None:  # already inside one: its end syncs these too
            yield
            return
        self._unsynced = []
        try:
            yield
            self.faults.reach("holds.sync")
            if self._unsynced:
                fsio.sync_folder(self.folder, self._unsynced)
        finally:
            self._unsynced = None

    def _path(self, session_id: int, generation: int) -> Path:
        return self.folder / f"{session_id}.{generation}"

    def _copy(self, session_id: int, handle: BinaryIO, generation: int) -> None:
        """A private copy of the version open in *handle*, as *generation*: synced before the spool refers to it,
        now or at together()'s end (a copy that cannot be is removed)."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self._path(session_id, generation)
        target.unlink(missing_ok=True)
        fd = _copy_from(handle, target)
        try:
            if self._unsynced is not None:
                self._unsynced.append(target)
                return
            os.fsync(fd)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        fsio.fsync_dir(self.folder)

    def _read(self, session: SessionState, lines: Iterable[LineRef | None]) -> list[str | None]:
        """The text of each held line in the session's held version (None for a line that is not held, or whose
        bytes are not there)."""
        wanted = list(lines)
        path = self._path(session.session_id, session.hold_generation)
        if not any(wanted):
            return [None] * len(wanted)
        try:
            return read_held_lines(path, wanted)
        except OSError as exc:
            logger.error("held session file {} is unreadable: {}", path, exc)
            return [None] * len(wanted)

    def _drop(self, session_id: int, generation: int) -> None:
        if generation > 0:
            self._path(session_id, generation).unlink(missing_ok=True)

    def sweep(self, sessions: Iterable[SessionState]) -> None:
        """At start: remove the held versions of known sessions other than their current one (a crash between a
        copy and its commit left them behind), then copy the hard links an older nanobotd held."""
        owned = {session.session_id: session for session in sessions}
        removed = 0
        for entry in self.folder.iterdir() if self.folder.is_dir() else ():
            session, _, generation = entry.name.partition(".")
            if not (session.isdigit() and generation.isdigit()) or int(session) not in owned:
                continue
            if int(generation) != owned[int(session)].hold_generation:
                entry.unlink(missing_ok=True)
                removed += 1
        if removed:
            logger.info("removed {} held session file version(s) an interrupted scan left behind", removed)
        for (session_id,) in self.store.query("SELECT session_id FROM held_links"):
            if session_id in owned:
                self._copy_link(owned[session_id])

    def _copy_link(self, session: SessionState) -> None:
        """A version an older nanobotd held as a hard link of the session file: copied, and its held lines checked,
        once. Rows whose line is not where it was (the file written in place) leave the spool, reported, and the
        file is read whole at its next scan: a message still in it is spooled again."""
        session_id, linked = session.session_id, session.hold_generation
        made = linked + 1
        try:
            with fsio.open_regular(self._path(session_id, linked)) as handle:
                self._copy(session_id, handle, made)
        except FileNotFoundError:
            made = 0  # nothing left to copy: every held line is gone
        except OSError as exc:
            logger.error("session {}: cannot copy its held version ({}); tried again at the next start",
                         session.key, exc)
            return
        session.hold_generation, lost = made, []
        try:
            for rows in spooldb.held_row_batches(self.store, session_id):  # a batch in memory at a time
                texts = self._read(session, [line for _, line in rows]) if made else [None] * len(rows)
                lost += [digest for (digest, _), text in zip(rows, texts, strict=True) if text is None]
            with self.store.transaction() as db:
                bulk.delete_in(db, "spool", "digest", lost, where={"session_id": session_id})
                db.execute("DELETE FROM held_links WHERE session_id=?", (session_id,))
                if lost:
                    db.execute("DELETE FROM message_blocks WHERE session_id=?", (session_id,))
                    db.execute("UPDATE sessions SET inode=NULL, size=NULL, mtime_ns=NULL WHERE id=?", (session_id,))
                save_hold(db, session)
        except BaseException:
            session.hold_generation = linked
            self._drop(session_id, made)
            raise
        self._drop(session_id, linked)
        if lost:
            session.fingerprint = None
            if cut := self._cut(made, session, lost):
                logger.error("session {}: its file was written in place while nanobotd held it by a hard link; {}"
                             " unarchived message(s) left it and cannot be archived", session.key, len(cut))

    def _cut(self, made: int, session: SessionState, lost: list[str]) -> list[str]:
        """Which of *lost* the copy *made* of the file (0: none) has no message for."""
        try:
            with fsio.open_regular(self._path(session.session_id, made)) as handle:
                present = set(parse_session(session.path, handle=handle).messages.digests())
        except OSError:
            return lost
        return [digest for digest in lost if digest not in present]

    # -- the rows -------------------------------------------------------------------------------------
    def resolver(self, session: SessionState) -> spooldb.Resolve:
        """Reads held lines from the session's held version as it is at the call (made and called under the lock)."""
        return functools.partial(self._read, session)

    def forget(self, session: SessionState) -> None:
        """A session rolled back before its first commit: its held version goes."""
        self._drop(session.session_id, session.hold_generation)

    def plan(self, session: SessionState, parsed: ParseResult, handle: BinaryIO, to_spool: list[int]) -> HoldPlan:
        """Where a scan's new rows (the messages numbered *to_spool*) go: into a private copy of the version open in
        *handle*, made now, when no version with a held row is kept and their lines are most of the file and at
        least HOLD_MIN_BYTES (the copy costs the file's bytes, text rows their own twice: the database's log, then
        the database); into the spool as text otherwise."""
        lines = parsed.lines
        size = sum(lines.ends[index - lines.first] - lines.starts[index - lines.first] for index in to_spool)
        if not worth_a_copy(size, os.fstat(handle.fileno()).st_size):
            return HoldPlan()
        held = session.hold_generation
        if held and spooldb.has_held_rows(self.store, session.session_id):
            return HoldPlan()
        self._copy(session.session_id, handle, held + 1)
        return HoldPlan(held + 1, held)

    def hold_whole(self, session: SessionState, handle: BinaryIO) -> HoldPlan:
        """A copy of the version open in *handle*, for a long file seen the first time that is held unread (no
        other version of it is held: it has no row)."""
        held = session.hold_generation
        self._copy(session.session_id, handle, held + 1)
        return HoldPlan(held + 1, held)

    def open_held(self, session: SessionState) -> BinaryIO:
        """The session's held version, open for reading (OSError when it cannot be)."""
        return fsio.open_regular(self._path(session.session_id, session.hold_generation))

    def apply(self, db: sqlite3.Connection, session: SessionState, plan: HoldPlan) -> None:
        """Inside the scan's transaction: the session's held version."""
        if plan.made:
            session.hold_generation = plan.made
            save_hold(db, session)

    def finish(self, session: SessionState, plan: HoldPlan) -> None:
        """After the transaction committed: the version replaced goes."""
        self._drop(session.session_id, plan.drop)

    def undo(self, session: SessionState, plan: HoldPlan, before: int) -> None:
        """The transaction failed: the session keeps its held version; a copy made for it goes."""
        session.hold_generation = before
        if plan.made != before:
            self._drop(session.session_id, plan.made)

    def release(self, session: SessionState) -> None:
        """No held row left: the held version goes."""
        with self.lock:
            generation = session.hold_generation
            if not generation or session.unread or spooldb.has_held_rows(self.store, session.session_id):
                return
            with self.store.transaction() as db:
                session.hold_generation = 0
                save_hold(db, session)
            self._drop(session.session_id, generation)


def worth_a_copy(held_bytes: int, file_bytes: int) -> bool:
    """Rows whose lines are *held_bytes* of a file of *file_bytes* are held in a copy of it: at least
    HOLD_MIN_BYTES and half the file (the copy costs the file's bytes, text rows their own twice)."""
    return held_bytes >= HOLD_MIN_BYTES and 2 * held_bytes >= file_bytes


def read_held_lines(path: Path, lines: list[LineRef | None], *, span_bytes: int = HELD_READ_SPAN,
                    gap_bytes: int = HELD_READ_GAP) -> list[str | None]:
    """The text of each line of the held version at *path* (None for a line that is not held, or whose bytes
    are not there); OSError when the file cannot be opened. Lines that follow each other in the file (a chunk's
    usually all do) are read with one read a span of them (*span_bytes* at most, gaps of *gap_bytes*)."""
    texts: list[str | None] = [None] * len(lines)
    with fsio.open_regular(path) as handle:
        for span in _spans(lines, span_bytes, gap_bytes):
            first = lines[span[0]].start
            handle.seek(first)
            block = handle.read(lines[span[-1]].end - first)
            for index in span:
                line = lines[index]
                data = block[line.start - first:line.end - first].strip()
                texts[index] = spooldb.line_text(data) if sessionfile.line_digest(data) == line.line_digest else None
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
    descriptor, for the caller to sync. In the kernel where it can; a streamed copy where the kernel will not copy
    between the two filesystems (a state folder on another mount than the sessions: EXDEV, or EINVAL / EOPNOTSUPP
    from filesystems without copy_file_range)."""
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
