"""What is unarchived: each session's spool, as the tracker keeps it in step and the jobs read it.

The rows live in the state database (`sessions.spool` moves them); here, per session, the spooled digests and
their tokens, the ones no longer in the session file (`gone`: they wait for the rescue) and the running totals of
the rest, kept in memory once loaded (the tracker lets them go with a session's other caches).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.holding import Holding
from nanobotd.sessions.session import SessionState, digests_in, respool, vanished_digests, vanished_in_spool
from nanobotd.state.store import StateStore
from nanobotd.tokens import count_tokens

T = TypeVar("T")


class Spool:
    """The unarchived messages of a workspace's sessions; its lock is the tracker's (a held row and the held
    version it is in are read as one)."""

    def __init__(self, store: StateStore, holding: Holding, lock: threading.RLock, clock) -> None:
        self.store, self.holding, self.lock, self.clock = store, holding, lock, clock

    # -- in memory ----------------------------------------------------------------------------------
    def rows(self, session: SessionState) -> dict[str, int]:
        """Spooled digests and their tokens (loaded once, then kept in step with the database)."""
        if session.spool is None:
            found = self.store.query("SELECT digest, tokens FROM spool WHERE session_id=?", (session.session_id,))
            session.spool = dict(found)
            self.recount(session)  # the running totals start from the spool itself
        return session.spool

    def gone(self, session: SessionState) -> set[str]:
        """Spooled digests no longer in the session file: kept in step by each scan, and read from the database
        (the spool rows without a message in the message cache) when the caches were dropped."""
        with self.lock:
            if session.gone is None:
                session.gone = set(vanished_digests(self.store, session.session_id))
            return session.gone

    def recount(self, session: SessionState) -> None:
        """Unarchived = spooled messages still present in the file (vanished ones wait for the rescue): a full pass,
        for when the file's contents were replaced; small changes keep the totals running (add, drop)."""
        spool, gone = self.rows(session), self.gone(session)
        live = [tokens for digest, tokens in spool.items() if digest not in gone]
        session.unarchived_messages = len(live)
        session.unarchived_tokens = sum(live)

    def add(self, session: SessionState, spooled: Iterable[tuple[str, int]]) -> None:
        """Messages spooled (digest, tokens) by a scan: the scan updates the totals."""
        rows = self.rows(session)
        for digest, tokens in spooled:
            rows[digest] = tokens

    def discard(self, session: SessionState, digests: Iterable[str]) -> None:
        """*digests* left the spool in a scan, which recounts the totals itself."""
        rows = self.rows(session)
        for digest in digests:
            rows.pop(digest, None)

    def drop(self, session: SessionState, digests: Iterable[str]) -> None:
        """*digests* left the spool: the live ones leave the running totals."""
        rows, gone = self.rows(session), self.gone(session)
        for digest in digests:
            tokens = rows.pop(digest, None)
            if tokens is not None and digest not in gone:
                session.unarchived_messages -= 1
                session.unarchived_tokens -= tokens

    def respool(self, session: SessionState, run_id: str, records: list[tuple[str, dict, int]]) -> int:
        """Undo an archive run: its messages back in the spool (its marks forgotten); those no longer in the file
        count as vanished, for the rescue."""
        respool(self.store, session.session_id, run_id, records, self.clock())
        with self.lock:
            rows, gone = self.rows(session), self.gone(session)
            in_file = digests_in(self.store, "messages", session.session_id, [digest for digest, _, _ in records])
            for digest, _, tokens in records:
                if digest in rows:
                    continue
                rows[digest] = tokens
                if digest not in in_file:
                    gone.add(digest)
                else:
                    gone.discard(digest)
                    session.unarchived_messages += 1
                    session.unarchived_tokens += tokens
        return len(records)

    def count_tail(self, session: SessionState, encoding: str) -> int:
        """The tail's exact tokens (the spooled messages still in the file), for a decision near a threshold: each
        message counted once (kept by digest), its text read back from the spool; the session's tail_tokens is
        this figure until the tail changes."""
        with self.lock:
            rows, gone = self.rows(session), self.gone(session)
            exact = {digest: tokens for digest, tokens in (session.exact or {}).items() if digest in rows}
            wanted = {digest for digest in rows if digest not in gone and digest not in exact}
            if wanted:
                seqs = self.store.query_with("SELECT seq, digest FROM spool WHERE session_id=?", (session.session_id,),
                                             lambda found: [seq for seq, digest in found if digest in wanted])
                for _, message, _ in self.messages(session, seqs):
                    text = sessionfile.message_text_for_tokens(message.record, message.text)
                    exact[message.digest] = count_tokens(text, encoding)
            session.exact = exact
            total = sum(exact.get(digest, tokens) for digest, tokens in rows.items() if digest not in gone)
            session.exact_tail = (session.unarchived_messages, session.unarchived_tokens, total)
            return total

    # -- the jobs' reads ----------------------------------------------------------------------------
    def vanished_count(self, session: SessionState) -> int:
        """Spooled messages no longer in the session file (in SQL: no message cache is loaded)."""
        return vanished_in_spool(self.store, session.session_id)

    def pending(self, session: SessionState, *, vanished_only: bool = False) -> list[tuple[int, PendingMessage, bool]]:
        """Spooled messages in first-seen order: (seq, message, still present in the file), every record read and
        decoded (for the few a flush or the rescue needs; consolidation plans with plan_window)."""
        gone = self.gone(session)
        if vanished_only:  # few, usually: their records alone are read
            seqs = spooldb.vanished_seqs(self.store, session.session_id, gone)
            return [(seq, message, False) for seq, message, _ in self.messages(session, seqs)]
        with self.lock:
            return spooldb.read_pending(self.store, session.session_id, gone, self.holding.resolver(session))

    def vanished(self, session: SessionState) -> list[str]:
        """The digests of the spooled messages no longer in the file, in first-seen order (no record is read)."""
        return spooldb.vanished_digests_in_order(self.store, session.session_id, self.gone(session))

    def plan_window(self, session: SessionState | None, use: Callable[[spooldb.PlanWindow], T]) -> T:
        """What *use* makes of a session's plan read a part at a time, every part as of one state of the spool."""
        window = spooldb.PlanWindow(self.store, session.session_id if session else None,
                                    self.gone(session) if session else set())
        with self.store.reading():
            return use(window)

    def messages(self, session: SessionState, seqs: list[int]) -> list[tuple[int, PendingMessage, str]]:
        """The spooled messages at *seqs* still spooled: (seq, message, its record as JSON text)."""
        if not seqs:
            return []
        with self.lock:
            return spooldb.read_spooled(self.store, session.session_id, seqs, self.holding.resolver(session))
