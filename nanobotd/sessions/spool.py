"""What is unarchived: each session's spool, its rows in the state database and what is kept of it in memory.

The spool keeps every conversation message that neither the agent nor nanobotd archived yet: where its line
is in the session's held copy of the file (`sessions.hold`), or its line's JSON text (a message that came when
no copy was made for it); so a rewrite of the session file cannot lose it. The tracker
decides what goes in and out. The functions move rows (and the per-session message cache) between the database
and Python; `Spool` keeps, per session, the spooled digests and their tokens, the ones no longer in the session
file (`gone`: they wait for the rescue) and the running totals of the rest, and answers the jobs' reads.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import BinaryIO, TypeVar

from loguru import logger

from nanobotd.memory.transcript import PendingMessage, record_json
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.scan import LineRef, read_line
from nanobotd.sessions.session import SessionState
from nanobotd.state.store import StateStore
from nanobotd.tokens import count_tokens
from nanobotd.tuning import SPOOL_BATCH

T = TypeVar("T")
RAW_DECODE = json.JSONDecoder().raw_decode
HELD = ""  # the record of a held row: its line is in the session's held version of the file

# held lines -> their texts (None: unreadable), from the session's held version at the time of the query
Resolve = Callable[[list[LineRef | None]], list[str | None]]


def insert_rows(db: sqlite3.Connection, session_id: int, rows: Iterable[tuple], handle: BinaryIO, now: float, *,
                shift: int | None = None) -> list[tuple[str, int]]:
    """Spool *rows* (digest, role, timestamp, tokens, line ref) after the session's last sequence number,
    taking them from *rows* a batch at a time; returns (digest, tokens) of each of *rows*.

    *shift* None: each record is copied, read from *handle* a batch at a time (a line whose bytes changed
    since the parse is left out). Otherwise the rows are held: only the line's offsets (less *shift*) and
    digest are kept, its bytes stay in the held version of the file (the one open in *handle*).
    """
    seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM spool WHERE session_id=?", (session_id,)).fetchone()[0]
    rows, added = iter(rows), []
    while taken := list(itertools.islice(rows, SPOOL_BATCH)):
        added += [(digest, tokens) for digest, _, _, tokens, _ in taken]
        if shift is not None:
            batch = [(session_id, digest, number, role, stamp, tokens, HELD, now, ref.start - shift, ref.end - shift,
                      ref.line_digest) for number, (digest, role, stamp, tokens, ref) in enumerate(taken, seq + 1)]
            seq += len(taken)
        else:
            batch = []
            for digest, role, stamp, tokens, ref in taken:
                seq += 1
                data = read_line(handle, ref)  # the file's JSON text, not re-encoded; None: its bytes changed
                if data is not None:
                    batch.append((session_id, digest, seq, role, stamp, tokens, line_text(data), now, None, None,
                                  None))
        db.executemany(
            "INSERT OR IGNORE INTO spool (session_id, digest, seq, role, timestamp, tokens, record, seen_at,"
            " line_start, line_end, line_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
    return added


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


def read_message_cache(store: StateStore, session_id: int) -> MessageList:
    """The session's message cache as stored at its last scan, in file order."""
    return store.query_with("SELECT line_digests, digests, columns FROM message_blocks WHERE session_id=?"
                            " ORDER BY first", (session_id,), MessageList.from_blocks)


def cached_digests(store: StateStore, session_id: int) -> set[str]:
    """The digests of the session's message cache as stored (its digest column alone is read)."""
    found: set[str] = set()
    for (digests,) in store.query("SELECT digests FROM message_blocks WHERE session_id=?", (session_id,)):
        text = digests.hex()
        found.update(text[at:at + 32] for at in range(0, len(text), 32))
    return found


def vanished_rows(store: StateStore, session_id: int, gone: set[str]) -> list[tuple[int, str]]:
    """(seq, digest) of the spooled messages no longer in the file, *gone*, in sequence order (no record is read)."""
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


def read_spooled(store: StateStore, session_id: int, seqs: list[int] | None,
                 resolve: Resolve) -> list[tuple[int, PendingMessage, str]]:
    """The spooled messages at *seqs* (every one: None) still spooled, in sequence order: (seq, message, its
    record as JSON text), read by runs of consecutive seqs."""
    columns = "digest, seq, role, timestamp, tokens, record, line_start, line_end, line_digest"
    if seqs is None:
        rows = store.query(f"SELECT {columns} FROM spool WHERE session_id=? ORDER BY seq", (session_id,))
    else:
        rows = []
        for first, last in seq_ranges(set(seqs)):
            rows += store.query(f"SELECT {columns} FROM spool WHERE session_id=? AND seq BETWEEN ? AND ? ORDER BY seq",
                                (session_id, first, last))
    lines = [LineRef(row[6], row[7], row[8]) if row[5] == HELD and row[8] is not None else None for row in rows]
    held = resolve(lines) if any(lines) else lines  # a copy's record is its row's, a held one's read from its line
    result = []
    for (digest, seq, role, stamp, tokens, copy, *_), line, record in zip(rows, lines, held, strict=True):
        if line is None:
            record = copy
        elif record is None:
            logger.error("spooled message {} of session #{}: its line is no longer in the held session file",
                         digest, session_id)
            continue
        result.append((seq, *pending_message(digest, role, stamp, tokens, record)))
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
    parsed = parse_record(record)
    if not isinstance(parsed, dict):
        parsed = {"role": role, "content": record, "timestamp": stamp}
        record = record_json(parsed)
    text = sessionfile.flatten_content(parsed.get("content"))
    return PendingMessage(digest, role, stamp, text, tokens, parsed), record


def parse_record(record: str) -> object:
    """What json.loads makes of *record*, None where it raises: its decoder called directly (a run reads every
    message it archives; json.loads's wrappers were a third of the decode), json.loads for what does not start
    with its value (leading whitespace)."""
    try:
        parsed, end = RAW_DECODE(record)
    except ValueError:
        try:
            return json.loads(record)
        except (ValueError, RecursionError):
            return None
    except RecursionError:
        return None
    return parsed if end == len(record) or not record[end:].strip(" \t\n\r") else None


def line_text(data: bytes) -> str:
    """A message line as the spool keeps its record: the file's JSON text (JSON in another encoding than
    UTF-8 as compact JSON text)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return record_json(json.loads(data))


class Spool:
    """The unarchived messages of a workspace's sessions; its lock is the tracker's (a held row and the held
    version it is in are read as one)."""

    def __init__(self, store: StateStore, resolver: Callable[[SessionState], Resolve], lock: threading.RLock,
                 clock) -> None:
        self.store, self.resolver, self.lock, self.clock = store, resolver, lock, clock

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
                session.gone = self._vanished(session)
            return session.gone

    def _present(self, session: SessionState) -> set[str]:
        """The digests of the messages in the session file (its message cache)."""
        if session.messages is not None:
            return set(session.messages.digests())
        return cached_digests(self.store, session.session_id)

    def _vanished(self, session: SessionState) -> set[str]:
        """The spooled digests without a message in the message cache: their messages left the file."""
        present = self._present(session)
        spooled = session.spool if session.spool is not None else (digest for (digest,) in self.store.query(
            "SELECT digest FROM spool WHERE session_id=?", (session.session_id,)))
        return {digest for digest in spooled if digest not in present}

    def recount(self, session: SessionState) -> None:
        """Unarchived = spooled messages still present in the file (vanished ones wait for the rescue): a full pass,
        for when the file's contents were replaced; small changes keep the totals running (add, drop)."""
        spool, gone = self.rows(session), self.gone(session)
        live = [tokens for digest, tokens in spool.items() if digest not in gone]
        session.unarchived_messages = len(live)
        session.unarchived_tokens = sum(live)

    def spooled(self, session: SessionState, added: Iterable[tuple[str, int]], removed: Iterable[str]) -> None:
        """A scan spooled messages (digest, tokens) and took *removed* out; it updates the totals itself."""
        rows = self.rows(session)
        rows.update(added)
        for digest in removed:
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
        now = self.clock()
        with self.store.transaction() as db:  # forget its marks; its messages back at the head of the spool
            db.execute("DELETE FROM archived WHERE session_id=? AND run_id=?", (session.session_id, run_id))
            next_seq = db.execute("SELECT COALESCE(MIN(seq), 1) FROM spool WHERE session_id=?",
                                  (session.session_id,)).fetchone()[0] - len(records) - 1
            db.executemany(
                "INSERT OR IGNORE INTO spool (session_id, digest, seq, role, timestamp, tokens, record, seen_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(session.session_id, digest, next_seq + offset, str(record.get("role", "?")),
                  str(record.get("timestamp", "")), tokens, record_json(record), now)
                 for offset, (digest, record, tokens) in enumerate(records)])
        with self.lock:
            rows, gone = self.rows(session), self.gone(session)
            in_file = self._present(session)
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
        """Spooled messages no longer in the session file (neither the spool nor the message cache is loaded)."""
        with self.lock:
            return len(session.gone if session.gone is not None else self._vanished(session))

    def pending(self, session: SessionState, *, vanished_only: bool = False) -> list[tuple[int, PendingMessage, bool]]:
        """Spooled messages in first-seen order: (seq, message, still present in the file), every record read and
        decoded (for the few a flush or the rescue needs; consolidation plans with plan_window)."""
        gone = self.gone(session)
        seqs = [seq for seq, _ in vanished_rows(self.store, session.session_id, gone)] if vanished_only else None
        with self.lock:  # the vanished ones are few, usually: their records alone are read
            return [(seq, message, message.digest not in gone)
                    for seq, message, _ in read_spooled(self.store, session.session_id, seqs, self.resolver(session))]

    def vanished(self, session: SessionState) -> list[str]:
        """The digests of the spooled messages no longer in the file, in first-seen order (no record is read)."""
        return [digest for _, digest in vanished_rows(self.store, session.session_id, self.gone(session))]

    def plan_window(self, session: SessionState | None, use: Callable[[PlanWindow], T]) -> T:
        """What *use* makes of a session's plan read a part at a time, every part as of one state of the spool."""
        window = PlanWindow(self.store, session.session_id if session else None,
                                    self.gone(session) if session else set())
        with self.store.reading():
            return use(window)

    def messages(self, session: SessionState, seqs: list[int]) -> list[tuple[int, PendingMessage, str]]:
        """The spooled messages at *seqs* still spooled: (seq, message, its record as JSON text)."""
        if not seqs:
            return []
        with self.lock:
            return read_spooled(self.store, session.session_id, seqs, self.resolver(session))
