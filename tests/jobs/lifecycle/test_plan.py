"""The lifecycle plan: the same steps for a dry run and a real one; bad notes are reported, never touched."""

from __future__ import annotations

import os
from datetime import timedelta

from nanobotd.jobs.planlines import describe_step
from tests.jobs.lifecycle.scenario import (
    NOW,
    lifecycle,
    seed_history,
    standard_workspace,
    tree,
    workspace,
    write_note,
)


def test_nothing_is_compacted_when_the_dream_has_read_nothing(tmp_path, store):
    ws = workspace(tmp_path, max_history_entries=5)
    seed_history(ws, count=12, dream_cursor=0)
    _, manifest = lifecycle(ws, store, dry_run=True)
    assert manifest["plan"] == []


def test_dry_run_plan_equals_the_real_runs_executed_steps_and_changes_nothing(tmp_path, store, clock):
    ws = standard_workspace(tmp_path)
    clock.set(NOW - timedelta(days=40))
    old_run = store.create_run("flush", ws.name)
    (store.run_dir(old_run) / "note.before.md").write_text("old backup\n")
    store.finish_run(old_run, state="finished", outcome="written")
    clock.set(NOW)
    before = tree(ws)
    runs_before = sorted(path.name for path in (store.state_dir / "runs").iterdir())
    dry_id, dry = lifecycle(ws, store, dry_run=True)
    assert tree(ws) == before
    assert sorted(path.name for path in (store.state_dir / "runs").iterdir()) == runs_before
    assert store.get_run(dry_id).state == "started"
    assert {step["action"] for step in dry["plan"]} == {"move", "summarise", "delete", "compact_history",
                                                        "prune_backups"}
    _, real = lifecycle(ws, store)
    assert real["executed"] == dry["plan"] == real["plan"]
    assert [describe_step(step).split()[0] for step in dry["plan"]] == [
        "move", "move", "summarise", "delete", "delete", "compact", "prune"]


def test_bad_state_is_reported_and_skipped_never_moved_or_deleted(tmp_path, store):
    ws = workspace(tmp_path)
    memory = ws.path / "memory"
    bad = {
        "memory/2026-01-02.md": b"# 2026-01-02\n\nno sections here, just prose\n",
        "memory/2026-01-03.md": b"# 2026-01-03\n\n## Topics\n- caf\xe9 au lait\n",
        "memory/2026-02-30.md": b"# 2026-02-30\n\n## Topics\n- a day that never was\n",
        "memory/2026-01-04-draft.md": b"# draft\n\n## Topics\n- not a note name\n",
    }
    for relative, data in bad.items():
        (ws.path / relative).write_bytes(data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "2025-01-01.md").write_text("# 2025-01-01\n\n## Topics\n- outside the workspace\n")
    os.symlink(elsewhere, memory / "archive")
    write_note(ws, "2026-01-05.md")
    _, manifest = lifecycle(ws, store)
    reasons = {item["path"]: item["reason"] for item in manifest["skipped"]}
    assert "no ## sections" in reasons["memory/2026-01-02.md"]
    assert "not valid UTF-8" in reasons["memory/2026-01-03.md"]
    assert "impossible date" in reasons["memory/2026-02-30.md"]
    assert "not a daily note" in reasons["memory/2026-01-04-draft.md"]
    assert reasons["memory/archive"] == "archive folder is a symlink"
    assert "archive folder is unusable" in reasons["memory/2026-01-05.md"]
    assert manifest["executed"] == []
    for relative, data in bad.items():
        assert (ws.path / relative).read_bytes() == data
    assert (elsewhere / "2025-01-01.md").exists() and (memory / "2026-01-05.md").exists()
