"""The SQLite FTS5 database behind the builtin index: schema, unit storage, ranked matching. It holds only what the
workspace can rebuild, so speed beats durability (WAL, synchronous=NORMAL) and a damaged file is deleted and rebuilt."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nanobotd.index.units import Unit

SCHEMA_VERSION = "1"
TOKENIZER = "porter unicode61 remove_diacritics 2"
DELETE_BATCH = 500
# A refresh that writes the whole index grows the WAL to the index's size; past a checkpoint it is cut
# back to this, so the WAL does not keep that size on disk for as long as the daemon runs.
WAL_SIZE_LIMIT = 8 * 1024 * 1024
SIDE_FILES = ("-wal", "-shm", "-journal")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    source TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    session_key TEXT
);
CREATE TABLE IF NOT EXISTS units (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL,
    unit_key TEXT NOT NULL,
    source TEXT NOT NULL,
    first INTEGER NOT NULL,
    last INTEGER NOT NULL,
    when_text TEXT NOT NULL DEFAULT '',
    session_key TEXT,
    parts TEXT,
    UNIQUE (file_id, unit_key)
);
CREATE VIRTUAL TABLE IF NOT EXISTS units_fts USING fts5(body, dates, tokenize='{TOKENIZER}');
CREATE TABLE IF NOT EXISTS vectors (unit_id INTEGER PRIMARY KEY, code BLOB NOT NULL);
"""


class IndexCorrupt(RuntimeError):
    """The index database cannot be used as it is; it must be deleted and rebuilt."""


@dataclass(frozen=True)
class FileRecord:
    """What the index knows about one source file."""

    file_id: int
    source: str
    fingerprint: str


@dataclass(frozen=True)
class MatchRow:
    """One matching unit, with its text and location, best first."""

    unit_id: int
    path: str
    source: str
    first: int
    last: int
    when: str
    session_key: str | None
    parts: str | None
    body: str
    score: float
    dates: str = ""


def is_corruption(error: sqlite3.Error) -> bool:
    """True for errors that mean a damaged database file rather than a bad statement."""
    if isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError):
        return True
    message = str(error).lower()
    return any(word in message for word in ("malformed", "corrupt", "not a database", "no such table"))


def delete_database(db_path: Path) -> None:
    """Remove the database file and its WAL/SHM companions."""
    for suffix in ("",) + SIDE_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(db_path) + suffix)


def connect(db_path: Path) -> sqlite3.Connection:
    """Open (creating if needed) the index database; raise IndexCorrupt when it is damaged."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        connection.executescript(SCHEMA)
        row = connection.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            connection.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise IndexCorrupt(f"index schema {row[0]} is not {SCHEMA_VERSION}")
    except sqlite3.Error as exc:
        connection.close()
        if is_corruption(exc):
            raise IndexCorrupt(str(exc)) from exc
        raise  # a full disk, a lock held too long: the file is sound, and deleting it would not help
    except IndexCorrupt:
        connection.close()
        raise
    return connection


def trim_wal(connection: sqlite3.Connection, db_path: Path) -> None:
    """After a large write, copy the WAL into the database and cut it to nothing (a no-op when small)."""
    try:
        size = os.stat(str(db_path) + "-wal").st_size
    except FileNotFoundError:
        return
    if size >= WAL_SIZE_LIMIT:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@contextlib.contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """BEGIN ... COMMIT, rolled back on any error."""
    connection.execute("BEGIN")
    try:
        yield
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def get_meta(connection: sqlite3.Connection, key: str) -> str | None:
    """A value of the meta table."""
    row = connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def set_meta(connection: sqlite3.Connection, key: str, value: str) -> None:
    """Store a value in the meta table."""
    connection.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


def all_files(connection: sqlite3.Connection) -> dict[str, FileRecord]:
    """Every indexed file by path."""
    rows = connection.execute("SELECT id, path, source, fingerprint FROM files")
    return {path: FileRecord(file_id, source, fingerprint) for file_id, path, source, fingerprint in rows}


def save_file(connection: sqlite3.Connection, path: str, source: str, fingerprint: str,
              session_key: str | None = None) -> int:
    """Insert or update a file row; return its id."""
    connection.execute(
        "INSERT INTO files (path, source, fingerprint, session_key) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (path) DO UPDATE SET source = excluded.source, fingerprint = excluded.fingerprint, "
        "session_key = excluded.session_key",
        (path, source, fingerprint, session_key),
    )
    return connection.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()[0]


def unit_keys(connection: sqlite3.Connection, file_id: int) -> dict[str, int]:
    """unit_key -> unit id of every unit of a file."""
    rows = connection.execute("SELECT unit_key, id FROM units WHERE file_id = ?", (file_id,))
    return dict(rows.fetchall())


def insert_units(connection: sqlite3.Connection, file_id: int, units: list[Unit]) -> int:
    """Store units of distinct keys new to the file (text into FTS when there is any); return how many."""
    first_id = connection.execute("SELECT coalesce(max(id), 0) + 1 FROM units").fetchone()[0]
    connection.executemany(
        "INSERT INTO units (id, file_id, unit_key, source, first, last, when_text, session_key, parts) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(first_id + number, file_id, unit.key, unit.source, unit.start, unit.end, unit.when, unit.session_key,
          json.dumps(unit.parts) if unit.parts else None) for number, unit in enumerate(units)])
    connection.executemany("INSERT INTO units_fts (rowid, body, dates) VALUES (?, ?, ?)",
                           [(first_id + number, unit.text, unit.dates) for number, unit in enumerate(units)
                            if unit.text.strip()])
    return len(units)


def delete_units(connection: sqlite3.Connection, unit_ids: list[int]) -> int:
    """Remove units and their text; return how many."""
    for offset in range(0, len(unit_ids), DELETE_BATCH):
        batch = unit_ids[offset:offset + DELETE_BATCH]
        marks = ",".join("?" * len(batch))
        connection.execute(f"DELETE FROM units_fts WHERE rowid IN ({marks})", batch)
        connection.execute(f"DELETE FROM vectors WHERE unit_id IN ({marks})", batch)
        connection.execute(f"DELETE FROM units WHERE id IN ({marks})", batch)
    return len(unit_ids)


def delete_file(connection: sqlite3.Connection, file_id: int) -> int:
    """Forget a file and all its units; return how many units went."""
    ids = [row[0] for row in connection.execute("SELECT id FROM units WHERE file_id = ?", (file_id,))]
    delete_units(connection, ids)
    connection.execute("DELETE FROM files WHERE id = ?", (file_id,))
    return len(ids)


def clear(connection: sqlite3.Connection) -> None:
    """Drop every file and unit (the schema stays)."""
    connection.execute("DELETE FROM units_fts")
    connection.execute("DELETE FROM vectors")
    connection.execute("DELETE FROM units")
    connection.execute("DELETE FROM files")


def match(connection: sqlite3.Connection, expression: str, limit: int, *, newest_first: bool = False) -> list[MatchRow]:
    """The *limit* best units for an FTS5 expression by bm25 (higher is better), or the newest; ranking reads no text.
    bm25() first counts every unit holding each phrase; for words found everywhere *newest_first* reads only *limit*."""
    if newest_first:
        sql = "SELECT rowid, 0.0 FROM units_fts WHERE units_fts MATCH ? ORDER BY rowid DESC LIMIT ?"
    else:
        sql = ("SELECT rowid, bm25(units_fts) AS rank_value "  # a date key named counts like a word
               "FROM units_fts WHERE units_fts MATCH ? ORDER BY rank_value LIMIT ?")
    ranked = connection.execute(sql, (expression, limit)).fetchall()
    return _with_locations(connection, _with_text(connection, ranked))


def fetch(connection: sqlite3.Connection, unit_ids: list[int]) -> list[MatchRow]:
    """The units with these ids (in that order, missing ones left out), with score 0."""
    return _with_locations(connection, _with_text(connection, [(unit_id, 0.0) for unit_id in unit_ids]))


def _with_text(connection: sqlite3.Connection, ranked: list[tuple]) -> list[tuple]:
    """(id, rank value) rows with the body and dates of each unit: (id, rank value, body, dates)."""
    if not ranked:
        return []
    marks = ",".join("?" * len(ranked))
    found = {row[0]: row[1:] for row in connection.execute(
        f"SELECT rowid, body, dates FROM units_fts WHERE rowid IN ({marks})", [row[0] for row in ranked])}
    return [(unit_id, rank_value, *found[unit_id]) for unit_id, rank_value in ranked if unit_id in found]


def _with_locations(connection: sqlite3.Connection, ranked: list[tuple]) -> list[MatchRow]:
    """(id, rank value, body, dates) rows joined with where their unit lives."""
    if not ranked:
        return []
    marks = ",".join("?" * len(ranked))
    meta = {
        row[0]: row
        for row in connection.execute(
            "SELECT u.id, f.path, u.source, u.first, u.last, u.when_text, u.session_key, u.parts "
            f"FROM units u JOIN files f ON f.id = u.file_id WHERE u.id IN ({marks})",
            [row[0] for row in ranked],
        )
    }
    return [MatchRow(*meta[unit_id], body=body, score=-rank_value, dates=dates or "")
            for unit_id, rank_value, body, dates in ranked if unit_id in meta]


def counts(connection: sqlite3.Connection) -> tuple[int, int]:
    """(units, files) in the index."""
    units = connection.execute("SELECT count(*) FROM units").fetchone()[0]
    files = connection.execute("SELECT count(*) FROM files").fetchone()[0]
    return units, files
