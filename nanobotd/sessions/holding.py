"""The held versions of session files: the one job of keeping, for each session, the version of its file the
spool's held rows point into (`sessions.hold` keeps the files themselves), and moving the rows along.

Spool rows of messages still in the file keep only where their line is: nanobot saves by writing a new file and
renaming it over the old, so the old version must be kept (a hard link, no byte copied) for as long as rows point
into it. At each scan that writes the spool, `plan` decides (before the transaction) where the held rows will be
after it, holding the new version of the file when it has to:

- the held version is the file itself (a link), grown in place or untouched: nothing moves;
- a private copy and no new row to hold: the copy still has every held line, nothing moves;
- a new version whose known bytes are unchanged (the fast path, nanobot's ordinary save): the held rows keep
  their offsets and the session's shift follows the new metadata line's length;
- otherwise each held row still in the file points at its line in the new version, and each one that left
  the file is copied out of the old version into the spool first: inside the scan's transaction, a batch of
  rows at a time (a long session's held rows are never all in memory).

A file seen replaced by a rename is held by hard links from then on; the file itself rewritten in place
under a link (the held lines changed) is held by private copies again, and the lines it took are reported.
`apply` writes the plan inside the scan's transaction; `finish` drops the old version after it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from loguru import logger

from nanobotd.faults import FaultPoints
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.hold import Holds, LinkUnsupported
from nanobotd.sessions.scan import LINE_KNOWN, LINE_NEW, LineFinder, LineRef, ParseResult, read_line
from nanobotd.sessions.session import SessionState, save_hold
from nanobotd.state import bulk
from nanobotd.state.store import StateStore


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
    moves: list[tuple[str, LineRef]] = field(default_factory=list)  # held rows pointing at the new version
    lost: list[str] = field(default_factory=list)  # held rows whose line is nowhere any more
    drop: int = 0  # the generation to unlink once the transaction committed
    carry: HeldCarry | None = None  # the held rows follow the file in the transaction, a batch at a time


class Holding:
    """Each session's held version; its lock is the tracker's (a held row and its version are read as one)."""

    def __init__(self, store: StateStore, lock: threading.RLock, faults: FaultPoints | None = None) -> None:
        self.store, self.lock = store, lock
        self.files = Holds(store.state_dir, faults)

    def sweep(self, sessions: Iterable[SessionState]) -> None:
        """At start: remove the held versions a crash between a link and its commit left behind."""
        swept = self.files.sweep({session.session_id: session.hold_generation for session in sessions})
        if swept:
            logger.info("removed {} held session file version(s) an interrupted scan left behind", swept)

    def resolver(self, session: SessionState) -> spooldb.Resolve:
        """Reads held lines from the session's held version as it is now (call under the lock)."""
        generation, shift = session.hold_generation, session.hold_shift
        return lambda lines: self.files.read(session.session_id, generation, shift, lines)

    def forget(self, session: SessionState) -> None:
        """A session rolled back before its first commit: its held version goes."""
        self.files.drop(session.session_id, session.hold_generation)

    def plan(self, session: SessionState, parsed: ParseResult, handle: BinaryIO, *, fast: bool,
                   fingerprint: tuple[int, int, int], tail_start: int | None, new_rows: bool) -> HoldPlan:
        generation, shift, previous = session.hold_generation, session.hold_shift, session.fingerprint
        inode = fingerprint[0]
        link = session.hold_links or (previous is not None and previous[0] != inode)
        keep = HoldPlan(shift, generation, session.hold_links, session.hold_of)
        if generation and session.hold_links and self.files.inode(session.session_id, generation) == inode:
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
        """Hold the version open in *handle*: True as a link, False as a copy, None when it was replaced."""
        if link and self.files.can_link(handle):
            try:
                linked = self.files.hold(session.path, handle, session.session_id, generation, link=True)
                return True if linked else None
            except LinkUnsupported as exc:
                logger.warning("session {}: {}; its held versions are copies", session.key, exc)
        self.files.hold(session.path, handle, session.session_id, generation, link=False)
        return False

    def _check_in_place(self, session: SessionState, parsed: ParseResult, handle: BinaryIO,
                        fingerprint: tuple[int, int, int]) -> HoldPlan:
        """The held link was read whole (after a restart, or rewritten in place): when its held lines are all
        still where they were, nothing moves; otherwise it was rewritten in place, and from now on the
        session is held by copies (the lines the rewrite took are reported lost)."""
        generation, shift = session.hold_generation, session.hold_shift
        if all(None not in self.files.read(session.session_id, generation, shift, [line for _, line in rows])
               for rows in spooldb.held_row_batches(self.store, session.session_id)):  # a batch in memory at a time
            return HoldPlan(shift, generation, True, fingerprint)
        logger.error("session {}: its file was rewritten in place (not replaced by a rename), changing the version"
                     " nanobotd held; it is held by copies from now on", session.key)
        self._hold_version(session, handle, generation + 1, False)
        plan = HoldPlan(0, generation + 1, False, fingerprint, drop=generation)
        where = parsed.finder()
        for rows in spooldb.held_row_batches(self.store, session.session_id):
            for digest, _ in rows:
                ref = where.get(digest)
                if ref is not None:
                    plan.moves.append((digest, ref))
                else:
                    plan.lost.append(digest)
        if plan.lost:
            logger.error("session {}: {} unarchived message(s) left the file in that rewrite and cannot be archived",
                         session.key, len(plan.lost))
        return plan

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
        texts = self.files.read(session.session_id, session.hold_generation, session.hold_shift,
                                [line for _, line in rows])
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
        spooldb.move_held(db, session.session_id, plan.moves)
        bulk.delete_in(db, "spool", "digest", plan.lost, where={"session_id": session.session_id})
        session.hold_generation = plan.generation
        session.hold_shift = plan.shift or 0
        session.hold_links = plan.links
        session.hold_of = plan.held_of
        save_hold(db, session)

    def finish(self, session: SessionState, plan: HoldPlan) -> list[str]:
        """After the transaction committed: the old version goes; returns the rows lost (out of the spool)."""
        if plan.drop and plan.drop != plan.generation:
            self.files.drop(session.session_id, plan.drop)
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
            self.files.drop(session.session_id, generation)

    def undo(self, session: SessionState, plan: HoldPlan, before: tuple) -> None:
        """The transaction failed: the session keeps its held version; a version made for it goes."""
        session.hold_generation, session.hold_shift, session.hold_links, session.hold_of = before
        if plan.generation and plan.generation != before[0]:
            self.files.drop(session.session_id, plan.generation)
