"""Many rows in one SQLite statement.

Python's sqlite3 releases the GIL around each row's step of an `executemany`, and a thread that gives the
GIL up waits to get it back (up to the 5 ms switch interval) whenever another thread is busy in Python, as the
event loop and the indexer often are. Here a column's values travel as one JSON array that SQLite's `json_each`
unpacks inside a single step, so the GIL is given up once per statement. Where the SQLite library has no JSON functions,
the rows go by `executemany`.
"""

from __future__ import annotations

import functools
import itertools
import json
import sqlite3
from collections.abc import Iterable

from nanobotd.tuning import ROWS_PER_STATEMENT


@functools.cache
def json_rows_supported() -> bool:
    """The SQLite library has `json_each` (built in since 3.38, and in most builds long before)."""
    probe = sqlite3.connect(":memory:")
    try:
        return probe.execute("SELECT value FROM json_each(?)", ('["a"]',)).fetchall() == [("a",)]
    except sqlite3.Error:
        return False
    finally:
        probe.close()


def insert(db: sqlite3.Connection, table: str, column: str, values: Iterable[object], *,
           fixed: dict[str, object], conflict: str = "ABORT", by_json: bool | None = None) -> None:
    """INSERT OR *conflict* into *table* a row for each of *values* (in *column*; str, int, float or None),
    each row with the same *fixed* columns. *by_json* None: as the SQLite library allows."""
    head = f"INSERT OR {conflict} INTO {table} ({', '.join([*fixed, column])})"
    for batch in _batches(values):
        _write(db, f"{head} SELECT {'?, ' * len(fixed)}value FROM json_each(?)",
               f"{head} VALUES ({'?, ' * len(fixed)}?)", tuple(fixed.values()), batch, by_json)


def delete_in(db: sqlite3.Connection, table: str, column: str, values: Iterable[object], *,
              where: dict[str, object], by_json: bool | None = None) -> None:
    """DELETE the rows of *table* matching every column of *where* whose *column* is one of *values*."""
    head = f"DELETE FROM {table} WHERE {' AND '.join(f'{name}=?' for name in where)} AND {column}"
    for batch in _batches(values):
        _write(db, f"{head} IN (SELECT value FROM json_each(?))", f"{head}=?", tuple(where.values()), batch,
               by_json)


def _batches(rows: Iterable) -> Iterable[list]:
    rows = iter(rows)
    while batch := list(itertools.islice(rows, ROWS_PER_STATEMENT)):
        yield batch


def _write(db: sqlite3.Connection, by_array: str, by_rows: str, fixed: tuple, values: list,
           by_json: bool | None) -> None:
    """One batch: as one JSON array, or row by row where SQLite has no JSON functions or a text has a NUL
    (SQLite's JSON functions end a string at U+0000; the escape is looked for in the encoded array, a text
    that spells the escape out goes row by row too)."""
    if by_json if by_json is not None else json_rows_supported():
        # not ASCII-escaped: SQLite reads the UTF-8 as is, and the array stays the size of its text
        encoded = json.dumps(values, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        if "\\u0000" not in encoded:
            db.execute(by_array, (*fixed, encoded))
            return
    db.executemany(by_rows, ((*fixed, value) for value in values))
