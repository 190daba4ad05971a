"""The state database's WAL is checkpointed beside the writes, soon after them, and never while idle."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time

from nanobotd.state.store import StateStore


def _checkpoint_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "state-checkpoint"]


def _open_files_of(path) -> int:
    """How many descriptors of this process are open on *path* or its -wal and -shm files."""
    names = {str(path), f"{path}-wal", f"{path}-shm"}
    return sum(os.readlink(f"/proc/self/fd/{fd}") in names for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}"))


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_store_never_checkpoints_in_a_commit_and_its_thread_does_soon_after(tmp_path):
    store = StateStore(tmp_path).open()
    assert store.query("PRAGMA wal_autocheckpoint")[0][0] == 0
    checkpointer = store._checkpointer
    before = checkpointer.checkpoints
    for number in range(3_000):  # well past the 1,000 pages SQLite would have checkpointed at, in a commit
        with store.transaction() as db:
            db.execute("INSERT INTO runs (run_id, kind, workspace, state, started_at, manifest)"
                       " VALUES (?, 'consolidate', 'ws', 'finished', 0, ?)", (f"r-{number}", "x" * 2_000))
    assert _wait_for(lambda: checkpointer.checkpoints > before)
    time.sleep(checkpointer.interval * 2)  # the last commits' checkpoint
    # the database file alone, without its log, has every row: they were copied into it
    shutil.copy(tmp_path / "state.db", tmp_path / "alone.db")
    alone = sqlite3.connect(tmp_path / "alone.db")
    assert alone.execute("SELECT count(*) FROM runs").fetchone()[0] == 3_000
    alone.close()
    store.close()


def test_an_idle_store_checkpoints_nothing_and_holds_no_second_connection(tmp_path):
    store = StateStore(tmp_path).open()
    assert _checkpoint_threads() == [] or all(thread is not store._checkpointer._thread
                                              for thread in _checkpoint_threads())
    store.create_run("consolidate", "ws")
    checkpointer = store._checkpointer
    assert _wait_for(lambda: checkpointer.checkpoints >= 1)
    time.sleep(checkpointer.interval * 2)
    done, files = checkpointer.checkpoints, _open_files_of(store.path)
    time.sleep(checkpointer.interval * 4)
    assert checkpointer.checkpoints == done  # nothing written, nothing checkpointed
    # the store's connection (database, log, shared memory), and at most the one descriptor SQLite keeps from a
    # closed connection while another holds locks on the file (reused by the next open, so it never grows)
    assert files == _open_files_of(store.path) <= 4
    for _ in range(5):
        store.create_run("consolidate", "ws")
        time.sleep(checkpointer.interval * 1.5)
    assert checkpointer.checkpoints > done and _open_files_of(store.path) <= 4
    thread = checkpointer._thread
    assert thread is not None and thread.is_alive()
    store.close()
    assert not thread.is_alive()


def test_a_store_closed_and_opened_again_checkpoints_again(tmp_path):
    store = StateStore(tmp_path).open()
    store.create_run("consolidate", "ws")
    store.close()
    store.open()
    store.create_run("consolidate", "ws")
    assert _wait_for(lambda: store._checkpointer.checkpoints >= 1)
    store.close()
