"""The lifecycle job with an injected clock: archive, expire into history, compact, prune."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from nanobotd import fsio
from nanobotd.jobs.lifecycle.plan import plan_lifecycle
from nanobotd.jobs.lifecycle.run import _StepExecutor
from nanobotd.llm.reply import UsageMeter
from tests.jobs.lifecycle.scenario import (
    NOW,
    OFFLINE,
    lifecycle,
    standard_workspace,
    workspace,
    write_note,
)
from tests.support.histories import read_history


def test_notes_move_at_active_days_and_expire_at_ttl_days(tmp_path, store):
    ws = standard_workspace(tmp_path)
    run_id, manifest = lifecycle(ws, store)
    memory = ws.path / "memory"
    assert sorted(path.name for path in memory.glob("*.md")) == ["2026-06-08.md", "2026-06-14.md"]
    assert sorted(path.name for path in (memory / "archive").iterdir()) == ["2026-03-17.md", "2026-06-07.md"]
    steps = [(step["action"], step.get("from") or step.get("path") or step.get("notes")) for step in
             manifest["executed"]]
    assert steps == [
        ("move", "memory/2026-01-10.md"),
        ("move", "memory/2026-06-07.md"),
        ("summarise", ["memory/archive/2026-01-10.md", "memory/archive/2026-03-16.md"]),
        ("delete", "memory/archive/2026-01-10.md"),
        ("delete", "memory/archive/2026-03-16.md"),
        ("compact_history", None),
    ]
    for path, backup in manifest["backups"].items():
        assert Path(backup["backup"]).read_text().startswith(f"# {Path(path).stem}")
    run = store.get_run(run_id)
    assert (run.state, run.outcome) == ("finished", "raw_fallback")
    assert store.query("SELECT outcome, reason FROM outcomes") == [("raw_fallback", "offline")]


def test_compaction_never_removes_an_entry_after_the_dream_cursor(tmp_path, store):
    ws = standard_workspace(tmp_path)
    _, manifest = lifecycle(ws, store)
    cursors = [entry.cursor for entry in read_history(ws.path / "memory").entries]
    # 12 entries, keep 5: the oldest 7 would go, but only 1-4 have been dreamt.
    assert cursors[:8] == [5, 6, 7, 8, 9, 10, 11, 12]
    assert manifest["history_removed"]["cursors"] == [1, 2, 3, 4]
    saved = Path(manifest["history_removed"]["backup"]).read_text().splitlines()
    assert [json.loads(line)["cursor"] for line in saved] == [1, 2, 3, 4]


def test_backups_older_than_the_window_are_pruned_and_their_run_marked_expired(tmp_path, store, clock):
    ws = workspace(tmp_path)
    write_note(ws, "archive/2026-01-01.md")
    first_now = NOW - timedelta(days=31)
    clock.set(first_now)
    first_id, first = lifecycle(ws, store, now=first_now)
    first_backup = Path(first["backups"]["memory/archive/2026-01-01.md"]["backup"])
    assert first_backup.exists()
    clock.set(NOW - timedelta(days=10))
    recent_id = store.create_run("flush", ws.name)
    (store.run_dir(recent_id) / "note.before.md").write_text("recent\n")
    store.finish_run(recent_id, state="finished", outcome="written")
    clock.set(NOW)
    pruning_id, manifest = lifecycle(ws, store)
    assert [item["run_id"] for item in manifest["pruned"]] == [first_id]
    assert not first_backup.parent.parent.exists()
    assert (store.state_dir / "runs" / recent_id / "note.before.md").exists()
    expired = store.get_run(first_id)
    assert expired.manifest["expired"] is True and expired.manifest["expired_by"] == pruning_id


def test_a_run_with_nothing_to_do_records_no_change(tmp_path, store):
    ws = workspace(tmp_path)
    write_note(ws, "2026-06-14.md")
    run_id, manifest = lifecycle(ws, store)
    assert manifest["executed"] == [] and store.get_run(run_id).outcome == "no_change"
    assert store.query("SELECT outcome FROM outcomes") == [("no_change",)]


def test_an_archive_folder_symlinked_outside_the_workspace_receives_nothing(tmp_path, store):
    ws = workspace(tmp_path)
    note = write_note(ws, "2026-05-01.md")
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws.path / "memory" / "archive").symlink_to(outside, target_is_directory=True)
    _, manifest = lifecycle(ws, store)
    assert list(outside.iterdir()) == []
    assert note.is_file()
    assert {"path": "memory/archive", "reason": "archive folder is a symlink"} in manifest["skipped"]


def test_an_archive_folder_swapped_for_an_outside_symlink_after_planning_is_refused(tmp_path, store):
    ws = workspace(tmp_path)
    note = write_note(ws, "2026-05-01.md")
    outside = tmp_path / "outside"
    outside.mkdir()
    run_id = store.create_run("lifecycle", ws.name)
    plan, _ = plan_lifecycle(ws, store=store, now=NOW, run_id=run_id)
    (ws.path / "memory" / "archive").symlink_to(outside, target_is_directory=True)
    executor = _StepExecutor(ws, store, OFFLINE, run_id, NOW, {"backups": {}}, UsageMeter())
    with pytest.raises(fsio.UnsafePath):
        executor.move(plan[0])
    assert list(outside.iterdir()) == [] and note.is_file()
