"""The state database: versioned schema, corrupt files moved aside and rebuilt, never fatal."""

from __future__ import annotations

import sqlite3

from nanobotd.state.store import MIGRATIONS, StateStore


def test_a_fresh_database_has_the_latest_schema_and_private_mode(tmp_path):
    store = StateStore(tmp_path).open()
    assert store.rebuilt
    version = store.query("PRAGMA user_version")[0][0]
    assert version == len(MIGRATIONS)
    assert (tmp_path / "state.db").stat().st_mode & 0o777 == 0o600
    assert store.query("PRAGMA journal_mode")[0][0] == "wal"


def test_a_corrupt_database_is_moved_aside_and_rebuilt(tmp_path):
    store = StateStore(tmp_path).open()
    store.create_run("consolidate", "ws")
    store.close()
    (tmp_path / "state.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"state.db{suffix}").unlink(missing_ok=True)
    store = StateStore(tmp_path).open()
    assert store.rebuilt and store.list_runs() == []
    assert list(tmp_path.glob("state.db.corrupt-*"))


def test_a_database_from_a_newer_nanobotd_is_not_touched_but_set_aside(tmp_path):
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(f"PRAGMA user_version={len(MIGRATIONS) + 5}")
    db.close()
    store = StateStore(tmp_path).open()
    assert store.rebuilt
    assert list(tmp_path.glob("state.db.corrupt-*"))


def test_an_existing_database_is_reopened_without_loss(tmp_path):
    store = StateStore(tmp_path).open()
    run_id = store.create_run("flush", "ws", manifest={"a": 1})
    store.close()
    store = StateStore(tmp_path).open()
    assert not store.rebuilt
    assert store.get_run(run_id).manifest == {"a": 1}


def test_a_first_start_is_told_apart_from_a_database_that_was_lost(tmp_path):
    first = StateStore(tmp_path / "state").open()
    assert first.rebuilt and first.first_start
    first.close()
    assert not StateStore(tmp_path / "state").open().first_start
    (tmp_path / "state" / "state.db").unlink()
    lost = StateStore(tmp_path / "state").open()
    assert lost.rebuilt and not lost.first_start


def test_runs_that_changed_nothing_can_be_left_out_and_counted(tmp_path):
    store = StateStore(tmp_path).open()
    changed = store.create_run("consolidate", "ws")
    store.finish_run(changed, state="finished", outcome="raw_fallback")
    for _ in range(2):
        idle = store.create_run("consolidate", "ws")
        store.finish_run(idle, state="finished", outcome="no_change")
    failed = store.create_run("flush", "ws")
    store.finish_run(failed, state="failed", outcome="no_change")
    assert [run.run_id for run in store.list_runs(unchanged=False)] == [failed, changed]
    assert len(store.list_runs()) == 4
    assert store.count_unchanged_runs() == 2 and store.count_unchanged_runs(kind="flush") == 0
