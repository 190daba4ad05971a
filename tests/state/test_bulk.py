"""Many rows in one statement: the same rows as executemany writes, in a few statements."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanobotd.state import bulk

TABLE = "CREATE TABLE t (k INTEGER NOT NULL, tag TEXT, v, PRIMARY KEY (k, v))"

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)  # SQLite keeps UTF-8 text only
values = st.lists(st.one_of(texts, st.integers(-(1 << 63), (1 << 63) - 1),
                            st.floats(allow_nan=False, allow_infinity=False)),
                  max_size=30, unique=True)


def _table() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)  # as the store: no implicit BEGIN
    db.execute(TABLE)
    return db


def _read(db: sqlite3.Connection) -> list[tuple]:
    return db.execute("SELECT k, tag, v, typeof(v) FROM t ORDER BY v").fetchall()


@settings(max_examples=150, deadline=None)
@given(values)
@example(["", "\x00", "\\u0000", 'say "hi" \\ \n\t', "ünïcødé ✓ 😀"])  # SQLite's JSON ends a string at NUL
def test_values_written_by_json_read_back_as_executemany_writes_them(written):
    assert bulk.json_rows_supported()  # this machine's SQLite has json_each; the other path is tested below
    by_json, by_rows = _table(), _table()
    bulk.insert(by_json, "t", "v", written, fixed={"k": 7, "tag": "run-1"}, conflict="IGNORE", by_json=True)
    by_rows.executemany("INSERT OR IGNORE INTO t (k, tag, v) VALUES (7, 'run-1', ?)", [(value,) for value in written])
    assert _read(by_json) == _read(by_rows)
    bulk.delete_in(by_json, "t", "v", written[::2], where={"k": 7}, by_json=True)
    by_rows.executemany("DELETE FROM t WHERE k=7 AND v=?", [(value,) for value in written[::2]])
    assert _read(by_json) == _read(by_rows)


@pytest.mark.parametrize("by_json", [True, False])
def test_insert_and_delete_agree_whether_or_not_sqlite_reads_json(by_json):
    db = _table()
    bulk.insert(db, "t", "v", [f"row {number}" for number in range(1200)], fixed={"k": 1, "tag": "a"},
                by_json=by_json)
    bulk.insert(db, "t", "v", ["row 5", "new"], fixed={"k": 1, "tag": "b"}, conflict="IGNORE", by_json=by_json)
    bulk.delete_in(db, "t", "v", [f"row {number}" for number in range(0, 1200, 2)], where={"k": 1},
                   by_json=by_json)
    left = db.execute("SELECT v, tag FROM t").fetchall()
    assert sorted(left) == sorted([("new", "b")] + [(f"row {number}", "a") for number in range(1, 1200, 2)])


def test_a_thousand_rows_take_a_few_statements_not_one_step_each():
    """Each statement's step gives up the GIL once, so rows written one by one wait for it once per row."""
    db = _table()
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    bulk.insert(db, "t", "v", [f"row {number}" for number in range(1200)], fixed={"k": 1, "tag": "a"}, by_json=True)
    bulk.delete_in(db, "t", "v", [f"row {number}" for number in range(1200)], where={"k": 1}, by_json=True)
    assert len(statements) == 6  # 500 + 500 + 200 rows, twice
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    before = len(statements)
    db.executemany("INSERT INTO t (k, v) VALUES (1, ?)", [(f"row {number}",) for number in range(1200)])
    assert len(statements) - before == 1200  # for comparison: executemany steps once a row


def test_nothing_to_write_runs_no_statement():
    db = _table()
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    bulk.insert(db, "t", "v", [], fixed={"k": 1})
    bulk.delete_in(db, "t", "v", iter(()), where={"k": 1})
    assert statements == []
