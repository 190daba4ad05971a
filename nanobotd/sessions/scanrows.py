"""A long scan's rows, written while its tokens are still being counted.

A first scan of a long session file waits on the counting process for a third of its parse (the parse needs
less CPU than the counting), then writes a spool row and a message cache row for every message in one
transaction, on one core, while the counting process sits idle: a second of a 100k-message scan. Here the
messages that have their counts are written, as the parse goes on, into a temp table of the state database's
connection (its own file: no write transaction on the database itself, nothing else waits for it), and the apply
copies them into the spool and the message cache in SQL. The apply still decides which messages it spools and
from which message on the cache is rewritten, exactly as without it.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterable

from loguru import logger

from nanobotd.sessions.messages import MessageList
from nanobotd.sessions.scan import LINE_NEW, MessageLines
from nanobotd.sessions.spool import HELD, seq_ranges
from nanobotd.state.store import StateStore

# a file with this much unread is parsed with its rows written ahead (the same size that has it counted in the
# counting process, whose waits the writing fills)
ROWS_AHEAD_BYTES = 8 << 20
_NUMBERS = itertools.count(1)


class ScanRows:
    """The rows of one scan's messages (from the first it parsed, `lines.first`), in a temp table of its own."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.table = f"temp.scan_rows_{next(_NUMBERS)}"
        self.start = self.stop = 0  # the messages written: start..stop
        self.failed = False
        self._made = False

    def add(self, messages: MessageList, lines: MessageLines, start: int, stop: int) -> None:
        """Write messages *start* to *stop* (they have their counts); a start before what was written starts over
        (a fast path gave up for a full parse). A failure (the temp file cannot grow) leaves the apply to write
        the rows itself."""
        if self.failed:
            return
        try:
            if not self._made:
                self.store.execute_temp(f"CREATE TABLE {self.table} (idx INTEGER PRIMARY KEY, line_digest TEXT,"
                                        " digest TEXT, role TEXT, timestamp TEXT, tokens INTEGER, flags INTEGER,"
                                        " line_start INTEGER, line_end INTEGER)")
                self._made = True
            if start != self.stop or not self.stop:
                self.store.execute_temp(f"DELETE FROM {self.table}")
                self.start = start
            self.store.execute_temp(f"INSERT INTO {self.table} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                    _rows(messages, lines, start, stop))
            self.stop = stop
        except sqlite3.Error as exc:
            logger.debug("a scan's rows could not be written ahead ({}); the scan writes them as it applies", exc)
            self.failed = True

    def has(self, start: int, stop: int) -> bool:
        """Messages *start* to *stop* are all written."""
        return not self.failed and self.start <= start and stop <= self.stop

    def copy_messages(self, db: sqlite3.Connection, session_id: int, prefix: int) -> None:
        """The message cache rows from *prefix* on (inside the caller's transaction)."""
        db.execute(f"INSERT OR REPLACE INTO messages (session_id, seq, line_digest, digest, role, timestamp, tokens,"
                   f" flags) SELECT ?, idx, line_digest, digest, role, timestamp, tokens, flags FROM {self.table}"
                   " WHERE idx>=?", (session_id, prefix))

    def copy_spool(self, db: sqlite3.Connection, session_id: int, numbers: list[int], now: float, shift: int) -> None:
        """Spool messages *numbers* (ascending, each parsed in this scan) as held rows after the session's last
        sequence number, as spool.insert_rows does (inside the caller's transaction)."""
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) FROM spool WHERE session_id=?", (session_id,)).fetchone()[0]
        ranges = []
        for first, last in seq_ranges(numbers):
            ranges.append((session_id, seq + 1 - first, HELD, now, shift, shift, first, last))
            seq += last - first + 1
        db.executemany(
            "INSERT OR IGNORE INTO spool (session_id, digest, seq, role, timestamp, tokens, record, seen_at,"
            " line_start, line_end, line_digest) SELECT ?, digest, ? + idx, role, timestamp, tokens, ?, ?,"
            f" line_start - ?, line_end - ?, line_digest FROM {self.table} WHERE idx BETWEEN ? AND ?", ranges)

    def close(self) -> None:
        """Let the rows go (the scan was applied, or given up)."""
        if self._made:
            self._made = False
            try:
                self.store.execute_temp(f"DROP TABLE {self.table}")
            except sqlite3.Error as exc:
                logger.debug("cannot drop {}: {}", self.table, exc)


def _rows(messages: MessageList, lines: MessageLines, start: int, stop: int) -> Iterable[tuple]:
    """Each message's row: its fields, and where its line is when it was parsed in this scan."""
    first, kinds, starts, ends = lines.first, lines.kinds, lines.starts, lines.ends
    for index, (line_digest, digest, role, stamp, tokens, flags) in enumerate(messages.rows(start, stop), start):
        at = index - first
        if 0 <= at < len(kinds) and kinds[at] == LINE_NEW:
            yield index, line_digest, digest, role, stamp, tokens, flags, starts[at], ends[at]
        else:
            yield index, line_digest, digest, role, stamp, tokens, flags, None, None
