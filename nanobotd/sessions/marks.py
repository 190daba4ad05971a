"""Archive marks: which messages reached history.jsonl, recorded with the spool rows they take out, as one
transaction (a crash leaves both or neither)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable

from loguru import logger

from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.session import (
    SessionState,
    digests_in,
    digests_in_spans,
    record_archived_twice,
    save_session,
)
from nanobotd.sessions.spool import Spool, seq_ranges
from nanobotd.state import bulk
from nanobotd.state.store import StateStore


class ArchiveMarks:
    """Recording, dropping and counting archive marks; its lock is the tracker's."""

    def __init__(self, store: StateStore, spool: Spool, lock: threading.RLock, clock) -> None:
        self.store, self.spool, self.lock, self.clock = store, spool, lock, clock

    def record(self, session: SessionState, runs_by_digest: dict[str, str], *, seqs: list[int] | None = None,
               also: Callable[[sqlite3.Connection], None] | None = None, spooled: bool = True) -> None:
        """Messages reached history.jsonl: marked archived (by run) and out of the spool. *seqs*, their spool
        sequence numbers when known (the rows go by ranges); *also* runs inside the same transaction; not *spooled*:
        they have no spool row (archived as a held copy was read)."""
        with self.lock, self.store.transaction() as db:
            by_run: dict[str, list[str]] = {}  # one run, but for marks rebuilt from history's spans
            for digest, run in runs_by_digest.items():
                by_run.setdefault(run, []).append(digest)
            for run, digests in by_run.items():
                before = db.total_changes
                bulk.insert(db, "archived", "digest", digests, fixed={"session_id": session.session_id, "run_id": run},
                            conflict="IGNORE")
                if db.total_changes - before < len(digests):  # some were archived already: by this run, or twice
                    self._count_archived_again(db, session, run, digests)
            if spooled and seqs is not None and len(seqs) == len(runs_by_digest):
                db.executemany("DELETE FROM spool WHERE session_id=? AND seq BETWEEN ? AND ?",
                               [(session.session_id, first, last) for first, last in seq_ranges(seqs)])
            elif spooled:
                bulk.delete_in(db, "spool", "digest", runs_by_digest, where={"session_id": session.session_id})
            if spooled:
                self.spool.drop(session, list(runs_by_digest))
            save_session(db, session, self.clock())
            if also is not None:
                also(db)

    def _count_archived_again(self, db: sqlite3.Connection, session: SessionState, run_id: str,
                              digests: list[str]) -> None:
        """Messages run *run_id* archived that another run had archived already are in history twice: counted with
        those the agent archived twice (a run finishing its own chunks again is not)."""
        if not bulk.json_rows_supported():
            return
        twice = [digest for (digest,) in db.execute(
            "SELECT digest FROM archived WHERE session_id=? AND run_id!=?"
            " AND digest IN (SELECT value FROM json_each(?))", (session.session_id, run_id, json.dumps(digests)))]
        if twice:
            db.executemany("INSERT OR IGNORE INTO archived_twice (session_id, digest, at) VALUES (?, ?, ?)",
                           [(session.session_id, digest, self.clock()) for digest in twice])
            logger.warning("session {}: run {} archived {} message(s) another run had archived", session.key, run_id,
                           len(twice))

    def drop_agent_archived(self, session: SessionState, digests: list[str]) -> None:
        """Messages that left the file and that the agent archived itself: out of the spool, not archived again."""
        with self.lock:
            with self.store.transaction() as db:
                bulk.delete_in(db, "spool", "digest", digests, where={"session_id": session.session_id})
                self.spool.drop(session, digests)
                save_session(db, session, self.clock())

    def from_spans(self, session: SessionState, messages: MessageList, spans: list[dict]) -> int:
        """Rebuild nanobotd's marks from the spans its history entries carry (after a lost state database)."""
        marked = digests_in_spans(messages, spans)
        if marked:
            self.record(session, marked)
        return len(marked)

    def archived_among(self, session: SessionState, digests: Iterable[str]) -> set[str]:
        """Which of *digests* nanobotd archived, looked up in the database: a session's marks are not kept in memory
        (a long session's would be its every message, twice over)."""
        return digests_in(self.store, "archived", session.session_id, digests)

    def count_overlap(self, session: SessionState, agent_archived: list[str]) -> None:
        """Messages under the agent's mark (*agent_archived*, their digests) that nanobotd archived too: counted
        as archived twice."""
        archived = self.archived_among(session, agent_archived)
        twice = [digest for digest in agent_archived if digest in archived]
        if twice and record_archived_twice(self.store, session.session_id, twice, self.clock()):
            logger.warning("session {}: the agent archived {} message(s) nanobotd had archived already",
                           session.key, len(twice))
