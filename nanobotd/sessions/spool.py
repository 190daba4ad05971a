"""The spool's rows in the state database: writing new ones a batch at a time, reading them back for jobs.

The spool keeps every conversation message that neither the agent nor nanobotd archived yet, as its line's
JSON text, so a rewrite of the session file cannot lose it. The tracker decides what goes in and out; this
module only moves rows (and the per-session message cache) between the database and Python.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from nanobotd.memory.transcript import PendingMessage, record_json
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions.scan import LineRef, MessageInfo, read_line
from nanobotd.state.store import StateStore

BATCH = 1000  # new spool rows read from the file and inserted together


def insert_rows(db: sqlite3.Connection, session_id: int, rows: list[tuple], handle: BinaryIO, now: float) -> None:
    """Spool *rows* (digest, role, timestamp, tokens, line ref) after the session's last sequence number,
    reading each record from *handle* a batch at a time; a line whose bytes changed since the parse is left out."""
    next_seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM spool WHERE session_id=?",
                          (session_id,)).fetchone()[0] + 1
    for first in range(0, len(rows), BATCH):
        batch = []
        for index, (digest, role, stamp, tokens, ref) in enumerate(rows[first:first + BATCH], start=first):
            record = record_text(handle, ref)
            if record is not None:
                batch.append((session_id, digest, next_seq + index, role, stamp, tokens, record, now))
        db.executemany(
            "INSERT OR IGNORE INTO spool (session_id, digest, seq, role, timestamp, tokens, record, seen_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", batch)


def read_message_cache(store: StateStore, session_id: int) -> list[MessageInfo]:
    """The session's message cache as stored at its last scan, in file order."""
    rows = store.query("SELECT line_digest, digest, role, timestamp, tokens, flags FROM messages"
                       " WHERE session_id=? ORDER BY seq", (session_id,))
    return [MessageInfo(*row) for row in rows]


def read_pending(store: StateStore, session_id: int, present: set[str]) -> list[tuple[int, PendingMessage, bool]]:
    """Every spooled message, decoded, in first-seen order: (seq, message, still in the file)."""
    rows = store.query("SELECT seq, digest, role, timestamp, tokens, record FROM spool WHERE session_id=?"
                       " ORDER BY seq", (session_id,))
    return [(seq, pending_message(digest, role, stamp, tokens, record)[0], digest in present)
            for seq, digest, role, stamp, tokens, record in rows]


def vanished_seqs(store: StateStore, session_id: int, present: set[str]) -> list[int]:
    """Sequence numbers of the spooled messages no longer in the file (their records are not read)."""
    rows = store.query("SELECT seq, digest FROM spool WHERE session_id=? ORDER BY seq", (session_id,))
    return [seq for seq, digest in rows if digest not in present]


def read_plan(store: StateStore, session_id: int, present: set[str]) -> list[tuple[int, str, int, bool]]:
    """(seq, role, tokens, still in the file) of every spooled message, in first-seen order, no records."""
    rows = store.query("SELECT seq, digest, role, tokens FROM spool WHERE session_id=? ORDER BY seq", (session_id,))
    return [(seq, role, tokens, digest in present) for seq, digest, role, tokens in rows]


def read_spooled(store: StateStore, session_id: int, seqs: list[int]) -> list[tuple[int, PendingMessage, str]]:
    """The spooled messages at *seqs* still spooled: (seq, message, its record as JSON text), read by ranges."""
    wanted = set(seqs)
    result = []
    for first, last in seq_ranges(wanted):
        rows = store.query("SELECT seq, digest, role, timestamp, tokens, record FROM spool"
                           " WHERE session_id=? AND seq BETWEEN ? AND ? ORDER BY seq", (session_id, first, last))
        for seq, digest, role, stamp, tokens, record in rows:
            if seq in wanted:
                message, text = pending_message(digest, role, stamp, tokens, record)
                result.append((seq, message, text))
    return result


def seq_ranges(seqs: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Runs of consecutive sequence numbers as (first, last) pairs: 1,2,3,7,8 -> (1, 3), (7, 8)."""
    first = last = None
    for seq in sorted(seqs):
        if last is not None and seq == last + 1:
            last = seq
            continue
        if first is not None:
            yield first, last
        first = last = seq
    if first is not None:
        yield first, last


def pending_message(digest: str, role: str, stamp: str, tokens: int, record: str) -> tuple[PendingMessage, str]:
    """A spool row as a message, and its record as JSON text (an unreadable one becomes its content)."""
    try:
        parsed = json.loads(record)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        parsed = {"role": role, "content": record, "timestamp": stamp}
        record = record_json(parsed)
    text = sessionfile.flatten_content(parsed.get("content"))
    return PendingMessage(digest, role, stamp, text, tokens, parsed), record


def record_text(handle: BinaryIO, ref: LineRef) -> str | None:
    """A new message's record as the file has it (JSON text, not re-encoded); None if its bytes changed."""
    data = read_line(handle, ref)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # JSON in another encoding: as compact JSON text
        record = json.loads(data)
        return record_json(record)
