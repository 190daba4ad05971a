"""The held versions of session files: the spool keeps where an unarchived message's line is, not a copy of it.

The spool rows of messages still in the session file keep only their line's offsets and digest; the version of
the file they are in is held in the state folder as `held/<session id>.<generation>`:

- a hard link (no byte copied) once the file was seen replaced by a rename, the way nanobot saves every time
  (NANOBOT-COMPAT.md): the version read then lives on, whatever the writer does next, until nanobotd lets it go;
- until then (a file seen once, a writer that rewrites in place, a state folder that cannot link), a private
  copy of the version read: a writer truncating the file in place cannot take the held lines with it.

At each scan that writes the spool, `Holding.plan` decides (before the transaction) where the held rows will be
after it, holding the new version of the file when it has to:

- the held version is the file itself (a link), grown in place or untouched: nothing moves;
- a private copy and no new row to hold: the copy still has every held line, nothing moves;
- a new version whose known bytes are unchanged (the fast path, nanobot's ordinary save): the held rows keep
  their offsets and the session's shift follows the new metadata line's length;
- otherwise each held row still in the file points at its line in the new version, and each one that left
  the file is copied out of the old version into the spool first: inside the scan's transaction, a batch of
  rows at a time (a long session's held rows are never all in memory).

The file itself rewritten in place under a link (the held lines changed) is held by private copies again, and
the lines it took are reported. `apply` writes the plan inside the scan's transaction; `finish` drops the old
version after it.
"""

from __future__ import annotations

import errno
import functools
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from loguru import logger

from nanobotd import fsio
from nanobotd.faults import FaultPoints
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.scan import LINE_KNOWN, LINE_NEW, LineFinder, LineRef, ParseResult, read_line
from nanobotd.sessions.session import SessionState, save_hold
from nanobotd.state import bulk
from nanobotd.state.store import StateStore
from nanobotd.tuning import HELD_READ_GAP, HELD_READ_SPAN, STREAM_BLOCK

HELD_DIR = "held"
NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


@dataclass
class HeldCarry:
    """How the held rows follow the file into the version just held (see Holding._carry_held)."""

    where: LineFinder  # the lines the scan parsed, by digest
    handle: BinaryIO  # the new version, to check a known line where the fast path says it is
    moved: int | None  # the fast path: a held row's offset to its known line in the new version (None: a full parse)


@dataclass
class HoldPlan:
    """What one scan does to a session's held rows."""

    shift: int | None  # new rows are held with this shift; None: they are copied into the spool
    generation: int  # the session's held version after the scan (0: none)
    links: bool  # that version is a hard link of the file
    held_of: tuple[int, int, int] | None = None  # the fingerprint of the version held, when known
    lost: list[str] = field(default_factory=list)  # held rows whose line is nowhere any more
    drop: int = 0  # the generation to unlink once the transaction committed
    carry: HeldCarry | None = None  # the held rows follow the file in the transaction, a batch at a time


class Holding:
    """Each session's held version, the files in the state folder and the rows pointing into them; its lock is the
    tracker's (a held row and its version are read as one)."""

    def __init__(self, store: StateStore, lock: threading.RLock, faults: FaultPoints | None = None) -> None:
        self.store, self.lock = store, lock
        self.folder = Path(store.state_dir) / HELD_DIR
        self.faults = faults or FaultPoints()  # "holds.sync": reached as a group's versions are synced
        self._unsynced: list[Path] | None = None  # inside together(): the versions made, their sync to come
        self._no_links: set[int] = set()  # the filesystems (st_dev) of session files a link from failed with EXDEV

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

    def _inode(self, session_id: int, generation: int) -> int | None:
        """The inode a held file links, None when there is none."""
        if generation <= 0:
            return None
        try:
            return os.stat(self._path(session_id, generation)).st_ino
        except FileNotFoundError:
            return None

    def _settle(self, target: Path, fd: int | None = None) -> None:
        """A new version in the folder, and the open descriptor of its copy when it is one: synced before the spool
        refers to it (a copy that cannot be is removed), now or at together()'s end."""
        try:
            if self._unsynced is not None:
                self._unsynced.append(target)
                return
            if fd is not None:
                os.fsync(fd)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        finally:
            if fd is not None:
                os.close(fd)
        fsio.fsync_dir(self.folder)

    def _read(self, session: SessionState, lines: Iterable[LineRef | None]) -> list[str | None]:
        """The text of each held line in the session's held version, its offsets before the session's shift (None
        for a line that is not held, or whose bytes are no longer there)."""
        wanted = list(lines)
        path = self._path(session.session_id, session.hold_generation)
        if not any(wanted):
            return [None] * len(wanted)
        try:
            return read_held_lines(path, session.hold_shift, wanted)
        except OSError as exc:
            logger.error("held session file {} is unreadable: {}", path, exc)
            return [None] * len(wanted)

    def _drop(self, session_id: int, generation: int) -> None:
        if generation > 0:
            self._path(session_id, generation).unlink(missing_ok=True)

    def sweep(self, sessions: Iterable[SessionState]) -> None:
        """At start: remove the held versions of known sessions other than their current one (a crash between a
        link and its commit left them behind)."""
        if not self.folder.is_dir():
            return
        owned = {session.session_id: session.hold_generation for session in sessions}
        removed = 0
        for entry in self.folder.iterdir():
            session, _, generation = entry.name.partition(".")
            if not (session.isdigit() and generation.isdigit()) or int(session) not in owned:
                continue
            if int(generation) != owned[int(session)]:
                entry.unlink(missing_ok=True)
                removed += 1
        if removed:
            logger.info("removed {} held session file version(s) an interrupted scan left behind", removed)

    # -- the rows -------------------------------------------------------------------------------------
    def resolver(self, session: SessionState) -> spooldb.Resolve:
        """Reads held lines from the session's held version as it is at the call (made and called under the lock)."""
        return functools.partial(self._read, session)

    def forget(self, session: SessionState) -> None:
        """A session rolled back before its first commit: its held version goes."""
        self._drop(session.session_id, session.hold_generation)

    def plan(self, session: SessionState, parsed: ParseResult, handle: BinaryIO, *, fast: bool,
                   fingerprint: tuple[int, int, int], tail_start: int | None, new_rows: bool) -> HoldPlan:
        generation, shift, previous = session.hold_generation, session.hold_shift, session.fingerprint
        inode = fingerprint[0]
        link = session.hold_links or (previous is not None and previous[0] != inode)
        keep = HoldPlan(shift, generation, session.hold_links, session.hold_of)
        if generation and session.hold_links and self._inode(session.session_id, generation) == inode:
            # the held version is this file: grown in place (or read whole after a restart) and unchanged
            if not fast:
                return self._check_in_place(session, parsed, handle, fingerprint)
            keep.held_of = fingerprint
            if tail_start is not None:  # its known bytes, after a metadata line that may have changed length
                keep.shift = shift + parsed.region_start - tail_start
            return keep
        # whether any row is held; the rows themselves are read only when they move (nanobot's ordinary save
        # of a long session holds them all, and moves none)
        held = bool(generation) and spooldb.has_held_rows(self.store, session.session_id)
        if held and not session.hold_links and not link and not new_rows:
            return keep  # a private copy: it still has every held line
        if not held and not new_rows:
            return HoldPlan(None, 0, link, drop=generation)
        made = self._hold_version(session, handle, generation + 1, link)
        if made is None:  # replaced since it was opened: the old version keeps its rows, new rows are copied
            return HoldPlan(None, generation, session.hold_links, session.hold_of)
        plan = HoldPlan(0, generation + 1, made, fingerprint, drop=generation)
        if fast and tail_start is not None and session.hold_of == previous and previous is not None:
            plan.shift = shift + parsed.region_start - tail_start  # the known bytes, after the new metadata line
            return plan
        if not held:  # nothing held before: only the new rows, held in the version just made
            return plan
        # the known bytes moved with the new metadata line: a known line is that far from its old offset, if there
        moved = shift + parsed.region_start - tail_start if fast and tail_start is not None else None
        plan.carry = HeldCarry(parsed.finder((LINE_NEW,) if fast else (LINE_NEW, LINE_KNOWN)), handle, moved)
        return plan

    def _hold_version(self, session: SessionState, handle: BinaryIO, generation: int, link: bool) -> bool | None:
        """Keep the version of the session file open in *handle* as *generation*: True as a hard link of the file
        (no byte copied), False as a private copy of the version read (synced before the spool refers to it), None
        when the file was replaced since it was opened (its link would be another version)."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self._path(session.session_id, generation)
        target.unlink(missing_ok=True)
        device = os.fstat(handle.fileno()).st_dev
        if link and device not in self._no_links:  # not from a filesystem a link already failed to cross from
            try:
                os.link(session.path, target)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    self._no_links.add(device)
                logger.warning("session {}: cannot hard-link {} into {}: {}; its held versions are copies",
                               session.key, session.path, self.folder, exc.strerror)
            else:
                if os.stat(target).st_ino != os.fstat(handle.fileno()).st_ino:
                    target.unlink(missing_ok=True)
                    return None
                self._settle(target)
                return True
        self._settle(target, _copy_from(handle, target))
        return False

    def _check_in_place(self, session: SessionState, parsed: ParseResult, handle: BinaryIO,
                        fingerprint: tuple[int, int, int]) -> HoldPlan:
        """The held link was read whole (after a restart, or rewritten in place): when its held lines are all
        still where they were, nothing moves; otherwise it was rewritten in place, and from now on the
        session is held by copies (the rows carried into one, the lines the rewrite took reported lost)."""
        generation, shift = session.hold_generation, session.hold_shift
        if all(None not in self._read(session, [line for _, line in rows])
               for rows in spooldb.held_row_batches(self.store, session.session_id)):  # a batch in memory at a time
            return HoldPlan(shift, generation, True, fingerprint)
        logger.error("session {}: its file was rewritten in place (not replaced by a rename), changing the version"
                     " nanobotd held; it is held by copies from now on", session.key)
        self._hold_version(session, handle, generation + 1, False)
        return HoldPlan(0, generation + 1, False, fingerprint, drop=generation,
                        carry=HeldCarry(parsed.finder(), handle, None))

    def _carry_held(self, db: sqlite3.Connection, session: SessionState, plan: HoldPlan) -> None:
        """Inside the scan's transaction, a batch of held rows at a time: each row still in the file points at its
        line in the version just held; each one that left the file is copied out of the old version into the
        spool (lost when its line is unreadable there too)."""
        carry = plan.carry
        for rows in spooldb.held_row_batches(db, session.session_id):
            moves, gone = [], []
            for digest, line in rows:
                ref = carry.where.get(digest)
                if ref is None and carry.moved is not None:  # a known line: where the known bytes are now, if there
                    ref = LineRef(line.start + carry.moved, line.end + carry.moved, line.line_digest)
                    ref = ref if read_line(carry.handle, ref) is not None else None
                if ref is not None:
                    moves.append((digest, ref))
                else:
                    gone.append((digest, line))
            spooldb.move_held(db, session.session_id, moves)
            spooldb.copy_held(db, session.session_id, self._copy_out(session, gone, plan.lost))
        if plan.lost:
            logger.error("session {}: {} unarchived message(s) left the file and their held lines are gone;"
                         " they cannot be archived", session.key, len(plan.lost))

    def _copy_out(self, session: SessionState, rows: list[tuple[str, LineRef]],
                  lost: list[str]) -> list[tuple[str, str]]:
        """(digest, text) of *rows*, read from the session's current held version; an unreadable one is *lost*."""
        if not rows:
            return []
        texts = self._read(session, [line for _, line in rows])
        copies = []
        for (digest, _), text in zip(rows, texts, strict=True):
            if text is None:
                lost.append(digest)
            else:
                copies.append((digest, text))
        return copies

    def apply(self, db: sqlite3.Connection, session: SessionState, plan: HoldPlan) -> None:
        """Inside the scan's transaction: the held rows moved, copied or dropped, the session's held version."""
        if plan.carry is not None:
            self._carry_held(db, session, plan)
        bulk.delete_in(db, "spool", "digest", plan.lost, where={"session_id": session.session_id})
        session.hold_generation = plan.generation
        session.hold_shift = plan.shift or 0
        session.hold_links = plan.links
        session.hold_of = plan.held_of
        save_hold(db, session)

    def finish(self, session: SessionState, plan: HoldPlan) -> list[str]:
        """After the transaction committed: the old version goes; returns the rows lost (out of the spool)."""
        if plan.drop and plan.drop != plan.generation:
            self._drop(session.session_id, plan.drop)
        return plan.lost

    def release(self, session: SessionState) -> None:
        """No held row left: a private copy, or a link to a file that is gone, is not kept (a link to the
        live file costs nothing and is kept for the next rows)."""
        with self.lock:
            generation = session.hold_generation
            if not generation or (session.hold_links and session.state != "deleted"):
                return
            if spooldb.has_held_rows(self.store, session.session_id):
                return
            with self.store.transaction() as db:
                session.hold_generation, session.hold_shift, session.hold_of = 0, 0, None
                save_hold(db, session)
            self._drop(session.session_id, generation)

    def undo(self, session: SessionState, plan: HoldPlan, before: tuple) -> None:
        """The transaction failed: the session keeps its held version; a version made for it goes."""
        session.hold_generation, session.hold_shift, session.hold_links, session.hold_of = before
        if plan.generation and plan.generation != before[0]:
            self._drop(session.session_id, plan.generation)


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
    descriptor, for Holding._settle to sync. In the kernel where it can; a streamed copy where the kernel will not
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

