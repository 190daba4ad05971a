"""The spool's rows in the state database: writing new ones a batch at a time, reading them back for jobs.

The spool keeps every conversation message that neither the agent nor nanobotd archived yet: where its line
is in the session's held version of the file (`sessions.hold`), or, once the file no longer has it (or the
session cannot be held), its line's JSON text; so a rewrite of the session file cannot lose it. The tracker
decides what goes in and out; this module only moves rows (and the per-session message cache) between the
database and Python.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO

from loguru import logger

from nanobotd.memory.transcript import PendingMessage, record_json
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions.hold import line_text
from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.scan import LineRef, read_line
from nanobotd.state.store import StateStore
from nanobotd.tuning import SPOOL_BATCH

HELD = ""  # the record of a held row: its line is in the session's held version of the file

# held lines -> their texts (None: unreadable), from the session's held version at the time of the query
Resolve = Callable[[list[LineRef | None]], list[str | None]]


def insert_rows(db: sqlite3.Connection, session_id: int, rows: Iterable[tuple], handle: BinaryIO, now: float, *,
                shift: int | None = None) -> None:
    """Spool *rows* (digest, role, timestamp, tokens, line ref) after the session's last sequence number,
    taking them from *rows* a batch at a time.

    *shift* None: each record is copied, read from *handle* a batch at a time (a line whose bytes changed
    since the parse is left out). Otherwise the rows are held: only the line's offsets (less *shift*) and
    digest are kept, its bytes stay in the held version of the file (the one open in *handle*).
    """
    seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM spool WHERE session_id=?", (session_id,)).fetchone()[0]
    rows = iter(rows)
    while taken := list(itertools.islice(rows, SPOOL_BATCH)):
        batch = []
        for digest, role, stamp, tokens, ref in taken:
            seq += 1
            if shift is not None:
                batch.append((session_id, digest, seq, role, stamp, tokens, HELD, now,
                              ref.start - shift, ref.end - shift, ref.line_digest))
                continue
            record = record_text(handle, ref)
            if record is not None:
                batch.append((session_id, digest, seq, role, stamp, tokens, record, now, None, None, None))
        db.executemany(
            "INSERT OR IGNORE INTO spool (session_id, digest, seq, role, timestamp, tokens, record, seen_at,"
            " line_start, line_end, line_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)


def has_held_rows(store: StateStore, session_id: int) -> bool:
    """The session has a held row (its line in the held version of the file)."""
    return bool(store.query("SELECT 1 FROM spool WHERE session_id=? AND record=? AND line_digest IS NOT NULL LIMIT 1",
                            (session_id, HELD)))


def held_row_batches(source: sqlite3.Connection | StateStore, session_id: int,
                     size: int | None = None) -> Iterator[list[tuple[str, LineRef]]]:
    """(digest, held line) of the session's held rows, *size* at a time in sequence order, so a long session's held
    rows are never all in memory. *source*: a connection in the caller's transaction (each batch may be moved or
    copied before the next is read: each query starts after the last row read), or the store (each batch read
    under its lock; the caller holds the tracker's, under which held rows come and go)."""
    def query(sql: str, args: tuple) -> list:
        return source.query(sql, args) if isinstance(source, StateStore) else source.execute(sql, args).fetchall()

    after, size = -(1 << 62), size or SPOOL_BATCH
    while rows := query("SELECT seq, digest, line_start, line_end, line_digest FROM spool WHERE session_id=?"
                        " AND seq>? AND record=? AND line_digest IS NOT NULL ORDER BY seq LIMIT ?",
                        (session_id, after, HELD, size)):
        after = rows[-1][0]
        yield [(digest, LineRef(start, end, line)) for _, digest, start, end, line in rows]


def copy_held(db: sqlite3.Connection, session_id: int, copies: list[tuple[str, str]]) -> None:
    """Held rows become copies: (digest, record text)."""
    db.executemany("UPDATE spool SET record=?, line_start=NULL, line_end=NULL, line_digest=NULL"
                   " WHERE session_id=? AND digest=?", [(text, session_id, digest) for digest, text in copies])


def move_held(db: sqlite3.Connection, session_id: int, moves: list[tuple[str, LineRef]]) -> None:
    """Held rows now point at their lines in another version of the file: (digest, where its line is)."""
    db.executemany("UPDATE spool SET line_start=?, line_end=?, line_digest=? WHERE session_id=? AND digest=?",
                   [(ref.start, ref.end, ref.line_digest, session_id, digest) for digest, ref in moves])


def _texts(rows: list[tuple], resolve: Resolve) -> list[str | None]:
    """Each row's record text: its copy, or its line read from the held version (rows end with record,
    line_start, line_end, line_digest)."""
    lines = held_lines(rows)
    held = resolve(lines) if any(lines) else [None] * len(rows)
    texts = []
    for row, line, text in zip(rows, lines, held, strict=True):
        if line is None:
            texts.append(row[-4])
            continue
        if text is None:
            logger.error("spooled message {} of session #{}: its line is no longer in the held session file",
                         row[1], row[0])
        texts.append(text)
    return texts


def read_message_cache(store: StateStore, session_id: int) -> MessageList:
    """The session's message cache as stored at its last scan, in file order."""
    return store.query_with("SELECT line_digest, digest, role, timestamp, tokens, flags FROM messages"
                            " WHERE session_id=? ORDER BY seq", (session_id,), MessageList.from_rows)


def read_pending(store: StateStore, session_id: int, gone: set[str],
                 resolve: Resolve) -> list[tuple[int, PendingMessage, bool]]:
    """Every spooled message, decoded, in first-seen order: (seq, message, still in the file)."""
    rows = store.query("SELECT session_id, digest, seq, role, timestamp, tokens, record, line_start, line_end,"
                       " line_digest FROM spool WHERE session_id=? ORDER BY seq", (session_id,))
    return [(seq, pending_message(digest, role, stamp, tokens, text)[0], digest not in gone)
            for (_, digest, seq, role, stamp, tokens, *_), text in zip(rows, _texts(rows, resolve), strict=True)
            if text is not None]


def vanished_seqs(store: StateStore, session_id: int, gone: set[str]) -> list[int]:
    """Sequence numbers of the spooled messages no longer in the file, *gone* (their records are not read)."""
    return [seq for seq, _ in _vanished_rows(store, session_id, gone)]


def vanished_digests_in_order(store: StateStore, session_id: int, gone: set[str]) -> list[str]:
    """Digests of the spooled messages no longer in the file, *gone*, in sequence order (no record is read)."""
    return [digest for _, digest in _vanished_rows(store, session_id, gone)]


def _vanished_rows(store: StateStore, session_id: int, gone: set[str]) -> list[tuple[int, str]]:
    if not gone:
        return []
    return store.query_with("SELECT seq, digest FROM spool WHERE session_id=? ORDER BY seq", (session_id,),
                            lambda rows: [(seq, digest) for seq, digest in rows if digest in gone])


class SpoolPlan(Sequence[tuple[int, str, int, bool]]):
    """(seq, role, tokens, still in the file) of a session's spooled messages, in first-seen order, without
    their records: kept in arrays, a few bytes a message, not a tuple each (a long session's plan is read again
    by every run)."""

    def __init__(self) -> None:
        self.seqs = array("q")
        self.roles: list[str] = []  # interned: a handful of strings
        self.tokens = array("q")
        self.present = bytearray()

    def add(self, seq: int, role: str, tokens: int, present: bool) -> None:
        self.seqs.append(seq)
        self.roles.append(sys.intern(role))
        self.tokens.append(tokens)
        self.present.append(present)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[at] for at in range(*index.indices(len(self)))]
        return self.seqs[index], self.roles[index], self.tokens[index], bool(self.present[index])

    def __iter__(self) -> Iterator[tuple[int, str, int, bool]]:
        for seq, role, tokens, present in zip(self.seqs, self.roles, self.tokens, self.present, strict=True):
            yield seq, role, tokens, bool(present)

    def extend(self, other: SpoolPlan) -> None:
        """*other*'s messages after these."""
        self.seqs.extend(other.seqs)
        self.roles.extend(other.roles)
        self.tokens.extend(other.tokens)
        self.present.extend(other.present)


def read_plan(store: StateStore, session_id: int, gone: set[str], *, after: int | None = None,
              before: int | None = None, limit: int | None = None, newest_first: bool = False) -> SpoolPlan:
    """The plan (seq, role, tokens, still in the file) of every spooled message, in first-seen order; or of those
    after seq *after* and before seq *before*, the first *limit* of them (*newest_first*: the last, last first).
    Digests are read only when some message left the file (a long session's plan is read by every run: a row's
    digest and a call a row cost a third of it)."""
    def fill(rows: Iterable[tuple]) -> SpoolPlan:
        plan = SpoolPlan()
        seq, role, tokens, present, interned = (plan.seqs.append, plan.roles.append, plan.tokens.append,
                                                plan.present.append, {})
        for row in rows:
            seq(row[0])
            role(interned.setdefault(row[1], row[1]))
            tokens(row[2])
            present(not gone or row[3] not in gone)
        return plan

    columns = "seq, role, tokens, digest" if gone else "seq, role, tokens"
    sql, args = f"SELECT {columns} FROM spool WHERE session_id=?", [session_id]
    if after is not None:
        sql, args = sql + " AND seq>?", [*args, after]
    if before is not None:
        sql, args = sql + " AND seq<?", [*args, before]
    sql += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
    if limit is not None:
        sql, args = sql + " LIMIT ?", [*args, limit]
    return store.query_with(sql, tuple(args), fill)


class PlanWindow:
    """A session's plan read a part at a time: its newest messages, its oldest, and how many come before a seq (a
    session that is not known has none)."""

    def __init__(self, store: StateStore, session_id: int | None, gone: set[str]) -> None:
        self.store, self.session_id, self.gone = store, session_id, gone

    def newest(self, limit: int, *, before: int | None = None) -> SpoolPlan:
        """The last *limit* messages (before seq *before*), the last first."""
        if self.session_id is None:
            return SpoolPlan()
        return read_plan(self.store, self.session_id, self.gone, before=before, limit=limit, newest_first=True)

    def oldest(self, limit: int | None = None, *, after: int | None = None, before: int | None = None) -> SpoolPlan:
        """The first *limit* messages (all of them: None) after seq *after* and before seq *before*."""
        if self.session_id is None:
            return SpoolPlan()
        return read_plan(self.store, self.session_id, self.gone, after=after, before=before, limit=limit)

    def totals(self, before: int) -> tuple[int, int]:
        """How many messages come before seq *before*, and their tokens."""
        if self.session_id is None:
            return 0, 0
        count, tokens = self.store.query("SELECT COUNT(*), COALESCE(SUM(tokens), 0) FROM spool"
                                         " WHERE session_id=? AND seq<?", (self.session_id, before))[0]
        return count, tokens


def read_spooled(store: StateStore, session_id: int, seqs: list[int],
                 resolve: Resolve) -> list[tuple[int, PendingMessage, str]]:
    """The spooled messages at *seqs* still spooled: (seq, message, its record as JSON text), read by ranges."""
    rows = spooled_rows(store, session_id, seqs)
    return spooled_messages(rows, _texts(rows, resolve))


def spooled_rows(store: StateStore, session_id: int, seqs: list[int]) -> list[tuple]:
    """The spool's rows at *seqs* (those still spooled), in sequence order, queried by ranges: session_id,
    digest, seq, role, timestamp, tokens, record, line_start, line_end, line_digest."""
    wanted = set(seqs)
    rows = []
    for first, last in seq_ranges(wanted):
        rows.extend(row for row in store.query(
            "SELECT session_id, digest, seq, role, timestamp, tokens, record, line_start, line_end, line_digest"
            " FROM spool WHERE session_id=? AND seq BETWEEN ? AND ? ORDER BY seq", (session_id, first, last))
            if row[2] in wanted)
    return rows


def spooled_messages(rows: list[tuple], texts: list[str | None]) -> list[tuple[int, PendingMessage, str]]:
    """(seq, message, its record as JSON text) of spool *rows* whose record *texts* could be read."""
    result = []
    for (_, digest, seq, role, stamp, tokens, *_), record in zip(rows, texts, strict=True):
        if record is not None:
            message, text = pending_message(digest, role, stamp, tokens, record)
            result.append((seq, message, text))
    return result


def held_lines(rows: list[tuple]) -> list[LineRef | None]:
    """The held line of each spool row (rows end with record, line_start, line_end, line_digest); None for a
    row whose record is a copy."""
    return [LineRef(start, end, line) if record == HELD and line is not None else None
            for *_, record, start, end, line in rows]


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
    return None if data is None else line_text(data)
