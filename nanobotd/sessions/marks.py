"""Archive marks: which messages reached history.jsonl, for the session tracker.

`SessionTracker` mixes this in; the marks share its lock, its in-memory spool and archived sets and its
running totals, and every change to them goes through one transaction with the spool rows it affects.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

from loguru import logger

from nanobotd.sessions.session import (
    SessionState,
    digests_in,
    digests_in_spans,
    record_archived_twice,
    respool,
    save_session,
)
from nanobotd.sessions.spool import seq_ranges
from nanobotd.state import bulk


class ArchiveMarks:
    """Recording, dropping and undoing archive marks (the tracker's attributes and helpers are used as is)."""

    def mark_archived(self, key: str, digests: list[str], run_id: str, *, seqs: list[int] | None = None,
                      also: Callable[[sqlite3.Connection], None] | None = None) -> None:
        """Messages reached history.jsonl: record them as archived and drop them from the spool.

        *seqs*, their spool sequence numbers when known: the spool rows go by ranges instead of one by one.
        *also* runs inside the same transaction (the run's journal says the chunk is done in the same
        commit that marks its messages, so a crash leaves both or neither).
        """
        self._record_archived(self.sessions[key], {digest: run_id for digest in digests}, seqs=seqs, also=also)

    def _record_archived(self, session: SessionState, runs_by_digest: dict[str, str], *,
                         seqs: list[int] | None = None, also=None) -> None:
        with self._lock, self.store.transaction() as db:
            by_run: dict[str, list[str]] = {}  # one run, but for marks rebuilt from history's spans
            for digest, run in runs_by_digest.items():
                by_run.setdefault(run, []).append(digest)
            for run, digests in by_run.items():
                before = db.total_changes
                bulk.insert(db, "archived", "digest", digests, fixed={"session_id": session.session_id, "run_id": run},
                            conflict="IGNORE")
                if db.total_changes - before < len(digests):  # some were archived already: by this run, or twice
                    self._count_archived_again(db, session, run, digests)
            if seqs is not None and len(seqs) == len(runs_by_digest):
                db.executemany("DELETE FROM spool WHERE session_id=? AND seq BETWEEN ? AND ?",
                               [(session.session_id, first, last) for first, last in seq_ranges(seqs)])
            else:
                bulk.delete_in(db, "spool", "digest", runs_by_digest, where={"session_id": session.session_id})
            self._forget_spooled(session, list(runs_by_digest))
            save_session(db, session, self.clock())
            if also is not None:
                also(db)
        self._release_hold(session)

    def _count_archived_again(self, db: sqlite3.Connection, session: SessionState, run_id: str,
                              digests: list[str]) -> None:
        """Messages run *run_id* archived that another run of nanobotd had archived already are in history twice:
        counted with those the agent archived twice (a run finishing its own chunks again is not)."""
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

    def drop_agent_archived(self, key: str, digests: list[str]) -> None:
        """Messages that left the file and that the agent archived itself: out of the spool, not archived again."""
        session = self.sessions[key]
        with self.store.transaction() as db:
            bulk.delete_in(db, "spool", "digest", digests, where={"session_id": session.session_id})
        with self._lock:
            self._unspool(session, digests)
            self._save_session(session)
            self._release_hold(session)

    def count_archived_twice(self, key: str, digests: list[str]) -> int:
        """The agent archived messages nanobotd had already archived (its entry came after ours)."""
        session = self.sessions[key]
        return record_archived_twice(self.store, session.session_id, digests, self.clock())

    def apply_history_spans(self, key: str, spans: list[dict]) -> int:
        """Rebuild nanobotd's archive marks from the spans its history entries carry (after a lost DB)."""
        session = self.sessions.get(key)
        if session is None:
            return 0
        marked = digests_in_spans(self._cached_messages(session), spans)
        if marked:
            self._record_archived(session, marked)
        return len(marked)

    def _forget_spooled(self, session: SessionState, digests: list[str]) -> None:
        """Archived messages (marked in the database): out of the in-memory spool, counters updated."""
        self._unspool(session, digests)

    def unarchive(self, key: str, run_id: str, records: list[tuple[str, dict, int]]) -> int:
        """Undo an archive run: forget its archive marks and put its messages back in the spool."""
        session = self.sessions.get(key)
        if session is None:
            return 0
        respool(self.store, session.session_id, run_id, records, self.clock())
        with self._lock:
            spool = self._spool_map(session)
            in_file = digests_in(self.store, "messages", session.session_id, [digest for digest, _, _ in records])
            gone = self._gone(session)
            for digest, _, tokens in records:
                if digest not in spool:
                    spool[digest] = tokens
                    if digest not in in_file:
                        gone.add(digest)  # back in the spool, not in the file: vanished, for the rescue
                    else:
                        gone.discard(digest)
                        session.unarchived_messages += 1
                        session.unarchived_tokens += tokens
            self._save_session(session)
        return len(records)
