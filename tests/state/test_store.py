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


PAGE_CACHE_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from nanobotd import heap
from nanobotd.state.store import StateStore

def rss_kib():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1])

store = StateStore(Path(sys.argv[1])).open()
with store.transaction() as db:
    db.execute("CREATE TABLE filler (body BLOB)")
    db.executemany("INSERT INTO filler VALUES (randomblob(3000))", [()] * 10_000)  # ~30 MB of pages
store.close()
store = StateStore(Path(sys.argv[1])).open()
heap.trim()
before = rss_kib()
store.query("SELECT SUM(length(hex(body))) FROM filler")  # every page through the cache
filled = rss_kib()
store.shrink_memory()
heap.trim()
print(store.query("PRAGMA cache_size")[0][0], before, filled, rss_kib())
"""


def test_the_page_cache_holds_8_mib_while_busy_and_is_given_back_when_idle(tmp_path):
    """A long session's archive marks need more than SQLite's 2 MiB default; opening the database (its check reads
    every page) and an idle daemon keep none of it."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", PAGE_CACHE_SCRIPT, str(tmp_path), str(repo)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cache_size, before, filled, after = (int(value) for value in done.stdout.split())
    assert cache_size == -8 * 1024  # KiB
    assert filled - before > 6 * 1024, "reading 30 MB filled the 8 MiB cache"
    assert filled - after > 6 * 1024, "shrink_memory gave it back"


def _names(store) -> list[str]:
    return [row[0] for row in store.query("SELECT run_id FROM runs ORDER BY run_id")]


def test_an_outer_transaction_commits_its_nested_ones_together_and_one_that_fails_is_rolled_back_alone(tmp_path):
    store = StateStore(tmp_path).open()
    with store.transaction():
        store.create_run("consolidate", "ws", run_id="r-1")
        try:
            with store.transaction() as db:
                db.execute("INSERT INTO runs (run_id, kind, workspace, state, started_at, manifest)"
                           " VALUES ('r-2', 'dream', 'ws', 'started', 0, '{}')")
                raise RuntimeError("this one fails")
        except RuntimeError:
            pass
        store.create_run("consolidate", "ws", run_id="r-3")
        outside = sqlite3.connect(tmp_path / "state.db")
        assert outside.execute("SELECT count(*) FROM runs").fetchone()[0] == 0  # nothing committed yet
    assert _names(store) == ["r-1", "r-3"]
    assert outside.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    outside.close()


def test_an_outer_transaction_that_fails_leaves_none_of_its_nested_ones(tmp_path):
    store = StateStore(tmp_path).open()
    try:
        with store.transaction():
            store.create_run("consolidate", "ws", run_id="r-1")
            store.create_run("consolidate", "ws", run_id="r-2")
            raise OSError("a sync failed before the commit")
    except OSError:
        pass
    assert _names(store) == []
    store.create_run("consolidate", "ws", run_id="r-4")  # the connection is usable again
    assert _names(store) == ["r-4"]


def test_another_thread_waits_for_an_outer_transaction_and_sees_it_whole(tmp_path):
    import threading

    store = StateStore(tmp_path).open()
    seen: list[list[str]] = []
    started = threading.Event()

    def read() -> None:
        started.set()
        seen.append(_names(store))

    with store.transaction():
        store.create_run("consolidate", "ws", run_id="r-1")
        reader = threading.Thread(target=read)
        reader.start()
        started.wait(5)
        reader.join(0.2)
        assert reader.is_alive()  # waiting for the store
        store.create_run("consolidate", "ws", run_id="r-2")
    reader.join(5)
    assert seen == [["r-1", "r-2"]]
