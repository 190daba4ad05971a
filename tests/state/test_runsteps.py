"""A long run's steps journalled a row each: read back in its manifest, folded into it when the run ends."""

from __future__ import annotations

from nanobotd.state.store import StateStore


def open_run(tmp_path):
    store = StateStore(tmp_path / "state").open()
    run_id = store.create_run("consolidate", "ws", session_key="cli:a", manifest={"session": "cli:a"})
    return store, run_id


def step_rows(store, run_id):
    return store.query("SELECT step FROM run_steps WHERE run_id=? ORDER BY step", (run_id,))


def test_an_open_runs_steps_come_back_in_order_under_its_chunks_beside_its_head(tmp_path):
    store, run_id = open_run(tmp_path)
    store.journal_steps(run_id, [(2, {"count": 3})], {"session": "cli:a", "progress": {"done": 2}})
    store.journal_steps(run_id, [(0, {"count": 1}), (1, {"count": 2})], {"session": "cli:a", "progress": {"done": 3}})
    store.journal_steps(run_id, [(1, {"count": 2, "done": True})], {"session": "cli:a", "progress": {"done": 3}})
    run = store.get_run(run_id)
    assert run.manifest == {"session": "cli:a", "progress": {"done": 3},
                            "chunks": [{"count": 1}, {"count": 2, "done": True}, {"count": 3}]}
    assert store.list_runs(states=("started",))[0].manifest == run.manifest
    # the run's own row holds the head only, however many steps there are
    assert "chunks" not in store.query("SELECT manifest FROM runs WHERE run_id=?", (run_id,))[0][0]


def test_an_open_run_read_again_and_again_shows_each_step_as_last_journalled_and_a_reader_changes_none(tmp_path):
    store, run_id = open_run(tmp_path)
    store.journal_steps(run_id, [(0, {"count": 1}), (1, {"count": 2})], {"session": "cli:a"})
    first = store.get_run(run_id).manifest["chunks"]
    first[0]["done"] = True  # a reader's own copy
    store.journal_steps(run_id, [(1, {"count": 2, "done": True})], {"session": "cli:a"})
    assert store.get_run(run_id).manifest["chunks"] == [{"count": 1}, {"count": 2, "done": True}]
    store.finish_run(run_id, state="finished", outcome="raw_fallback")
    assert store.get_run(run_id).manifest["chunks"] == [{"count": 1}, {"count": 2, "done": True}]


def test_a_head_given_with_its_chunks_journals_them_as_steps_only(tmp_path):
    store, run_id = open_run(tmp_path)
    store.journal_steps(run_id, [(0, {"count": 1})], {"session": "cli:a", "chunks": [{"count": 99}]})
    assert store.get_run(run_id).manifest["chunks"] == [{"count": 1}]


def test_finishing_with_the_whole_manifest_keeps_it_and_drops_the_steps(tmp_path):
    store, run_id = open_run(tmp_path)
    store.journal_steps(run_id, [(0, {"count": 1})], {"session": "cli:a"})
    whole = {"session": "cli:a", "chunks": [{"count": 1, "done": True}], "cursors": [7]}
    store.finish_run(run_id, state="finished", outcome="raw_fallback", manifest=whole)
    assert store.get_run(run_id).manifest == whole
    assert step_rows(store, run_id) == []


def test_finishing_without_a_manifest_folds_the_journalled_steps_into_it(tmp_path):
    store, run_id = open_run(tmp_path)
    store.journal_steps(run_id, [(0, {"count": 1}), (1, {"count": 2})], {"session": "cli:a", "progress": {}})
    store.finish_run(run_id, state="failed", outcome="interrupted")
    assert step_rows(store, run_id) == []
    run = store.get_run(run_id)
    assert (run.state, run.outcome) == ("failed", "interrupted")
    assert run.manifest == {"session": "cli:a", "progress": {}, "chunks": [{"count": 1}, {"count": 2}]}


def test_steps_survive_a_reopened_database_and_other_runs_keep_their_own(tmp_path):
    store, run_id = open_run(tmp_path)
    other = store.create_run("consolidate", "ws", session_key="cli:b", manifest={"session": "cli:b"})
    store.journal_steps(run_id, [(0, {"count": 1})], {"session": "cli:a"})
    store.journal_steps(other, [(0, {"count": 5})], {"session": "cli:b"})
    store.close()
    store = StateStore(tmp_path / "state").open()
    assert store.get_run(run_id).manifest["chunks"] == [{"count": 1}]
    assert store.get_run(other).manifest["chunks"] == [{"count": 5}]
    store.finish_run(run_id, state="finished", outcome="summarized")
    assert store.get_run(other).manifest["chunks"] == [{"count": 5}]


def test_a_database_from_before_run_steps_gains_them_and_its_open_run_reads_as_it_was(tmp_path):
    """An interrupted run journalled whole by an older nanobotd (schema 4, no run_steps) is read, recovered and
    finished exactly as it was journalled."""
    import json
    import sqlite3

    from nanobotd.state.store import MIGRATIONS

    (tmp_path / "state").mkdir()
    db = sqlite3.connect(tmp_path / "state" / "state.db", isolation_level=None)
    for number, script in enumerate(MIGRATIONS[:4]):
        db.executescript("BEGIN;" + script + f"; PRAGMA user_version={number + 1}; COMMIT;")
    whole = {"session": "cli:a", "chunks": [{"count": 2, "cursors": [4], "done": False}], "cursors": []}
    db.execute("INSERT INTO runs (run_id, kind, workspace, session_key, state, started_at, manifest)"
               " VALUES ('r-old', 'consolidate', 'ws', 'cli:a', 'started', 1.0, ?)", (json.dumps(whole),))
    db.close()
    store = StateStore(tmp_path / "state").open()
    assert store.query("PRAGMA user_version")[0][0] == len(MIGRATIONS)
    assert store.list_runs(states=("started",))[0].manifest == whole
    store.finish_run("r-old", state="rolled_back", outcome="rolled_back")
    assert store.get_run("r-old").manifest == whole
