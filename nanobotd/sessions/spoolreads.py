"""Reading the spool for jobs (flush, rescue, consolidation), for the session tracker.

`SessionTracker` mixes this in: the readers share its lock (a held row and the held version it is in are
read as one) and its in-memory view of which spooled messages left the file (`_gone`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.session import SessionState

T = TypeVar("T")


class SpoolReads:
    """The spooled messages of a session, as the jobs read them (the tracker's attributes are used as is)."""

    def pending(self, key: str, *, vanished_only: bool = False) -> list[tuple[int, PendingMessage, bool]]:
        """Spooled messages of a session in first-seen order: (seq, message, still present in the file).

        Every record is read and decoded: for the few messages a flush or the rescue needs; consolidation
        plans with `spool_plan` and reads one chunk at a time with `spooled_messages`.
        """
        session = self.sessions.get(key)
        if session is None:
            return []
        gone = self._gone(session)
        if vanished_only:  # few, usually: their records alone are read
            seqs = spooldb.vanished_seqs(self.store, session.session_id, gone)
            return [(seq, message, False) for seq, message, _ in self.spooled_messages(key, seqs)]
        with self._lock:  # the held rows and the held version they are in, as one
            return spooldb.read_pending(self.store, session.session_id, gone, self._resolver(session))

    def vanished(self, key: str) -> list[str]:
        """The digests of a session's spooled messages no longer in its file, in first-seen order (as
        `pending(key, vanished_only=True)` has them, without reading a record)."""
        session = self.sessions.get(key)
        if session is None:
            return []
        return spooldb.vanished_digests_in_order(self.store, session.session_id, self._gone(session))

    def spool_plan(self, key: str) -> spooldb.SpoolPlan:
        """(seq, role, tokens, still present in the file) of a session's spooled messages, in first-seen
        order, without their records."""
        return self.plan_window(key, spooldb.PlanWindow.oldest)

    def plan_window(self, key: str, use: Callable[[spooldb.PlanWindow], T]) -> T:
        """What *use* makes of a session's plan read a part at a time (`spool.PlanWindow`), every part as of one
        state of the spool (no write of this process comes between them)."""
        session = self.sessions.get(key)
        window = spooldb.PlanWindow(self.store, session.session_id if session else None,
                                    self._gone(session) if session else set())
        with self.store.reading():
            return use(window)

    def spooled_messages(self, key: str, seqs: list[int]) -> list[tuple[int, PendingMessage, str]]:
        """The spooled messages at *seqs* that are still spooled: (seq, message, its record as JSON text)."""
        session = self.sessions.get(key)
        if session is None or not seqs:
            return []
        with self._lock:  # the held rows and the held version they are in, as one
            return spooldb.read_spooled(self.store, session.session_id, seqs, self._resolver(session))

    def spooled_rows(self, key: str, seqs: list[int]) -> tuple[list[tuple], Path, int]:
        """The spool rows at *seqs* still spooled (`spool.spooled_rows`), and where their held lines were at the
        query: the held version's path and shift. A reader outside the lock (`spool.held_lines`) keeps only lines
        whose bytes still match their digest, so a version replaced meanwhile is never misread."""
        session = self.sessions.get(key)
        if session is None or not seqs:
            return [], Path(), 0
        with self._lock:
            rows = spooldb.spooled_rows(self.store, session.session_id, seqs)
            return rows, self.holds.path(session.session_id, session.hold_generation), session.hold_shift

    def _resolver(self, session: SessionState) -> spooldb.Resolve:
        """Reads held lines from the session's held version as it is now (call under the lock)."""
        generation, shift = session.hold_generation, session.hold_shift
        return lambda lines: self.holds.read(session.session_id, generation, shift, lines)
