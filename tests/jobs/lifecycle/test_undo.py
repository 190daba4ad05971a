"""Restoring a lifecycle run: every byte back, interrupted runs included; refused when a backup is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from nanobotd.jobs.errors import RestoreRefused
from nanobotd.jobs.lifecycle.undo import restore_lifecycle_run
from nanobotd.memory import history
from tests.jobs.lifecycle.scenario import (
    NOW,
    lifecycle,
    standard_workspace,
    tree,
    workspace,
    write_note,
)
from tests.support.histories import read_history


def test_restore_brings_back_every_byte(tmp_path, store):
    ws = standard_workspace(tmp_path)
    before = tree(ws)
    run_id, _ = lifecycle(ws, store)
    assert tree(ws) != before
    preview = restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=True)
    assert len(preview["plan"]) == 6
    result = restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert result["plan"] == preview["plan"]
    assert tree(ws) == before


def test_restore_removes_the_archive_folder_the_run_created(tmp_path, store):
    ws = workspace(tmp_path)
    write_note(ws, "2026-05-01.md")
    before = tree(ws)
    run_id, _ = lifecycle(ws, store)
    assert (ws.path / "memory" / "archive" / "2026-05-01.md").exists()
    restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert tree(ws) == before and not (ws.path / "memory" / "archive").exists()


def test_restore_refuses_when_a_backup_is_missing(tmp_path, store):
    ws = workspace(tmp_path)
    write_note(ws, "archive/2026-01-01.md")
    run_id, manifest = lifecycle(ws, store)
    Path(manifest["backups"]["memory/archive/2026-01-01.md"]["backup"]).unlink()
    with pytest.raises(RestoreRefused, match="is missing"):
        restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert not (ws.path / "memory" / "archive" / "2026-01-01.md").exists()


def test_a_run_interrupted_mid_step_is_rolled_back_by_restore(tmp_path, store):
    ws = standard_workspace(tmp_path)
    before = tree(ws)
    run_id, manifest = lifecycle(ws, store)
    # As if the process died right after rewriting history, before marking the compaction executed.
    assert manifest["executed"][5]["action"] == "compact_history"
    interrupted = dict(manifest, executed=manifest["executed"][:5], pending=5)
    store.journal(run_id, interrupted)
    store.finish_run(run_id, state="started", outcome="")
    restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert tree(ws) == before


def test_a_run_that_never_journaled_restores_to_nothing(store):
    run_id = store.create_run("lifecycle", "main")
    result = restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert result["files"] == [] and "changed nothing" in result["plan"][0]


def test_restore_refuses_when_an_expired_note_was_created_again_and_keeps_both(tmp_path, store):
    ws = workspace(tmp_path)
    old = write_note(ws, "archive/2026-03-01.md", extra="- the old content\n")
    old_bytes = old.read_bytes()
    run_id, _ = lifecycle(ws, store)
    assert not old.exists()
    summary = read_history(ws.path / "memory").entries
    assert summary, "the expired note was summarised into history"
    old.write_text("# 2026-03-01\n\n## Topics\n- written again later\n")
    before = tree(ws)
    with pytest.raises(RestoreRefused, match="created again") as refused:
        restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert refused.value.conflicts and "archive/2026-03-01.md" in refused.value.conflicts[0]
    assert tree(ws) == before  # nothing changed: the summary and the new note are both still there
    backup = store.get_run(run_id).manifest["backups"]["memory/archive/2026-03-01.md"]["backup"]
    assert Path(backup).read_bytes() == old_bytes


def test_restore_after_the_new_note_is_moved_aside_brings_the_old_one_back(tmp_path, store):
    ws = workspace(tmp_path)
    old = write_note(ws, "archive/2026-03-01.md", extra="- the old content\n")
    old_bytes = old.read_bytes()
    run_id, _ = lifecycle(ws, store)
    old.write_text("written again\n")
    old.rename(old.with_name("elsewhere.md"))
    restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert old.read_bytes() == old_bytes
    assert old.with_name("elsewhere.md").read_text() == "written again\n"
    assert read_history(ws.path / "memory").entries == []


def test_restore_after_history_was_deleted_leaves_the_entry_written_since_at_the_summarys_cursor(tmp_path, store):
    ws = workspace(tmp_path)
    write_note(ws, "archive/2026-01-01.md")
    run_id, manifest = lifecycle(ws, store)
    memory = ws.path / "memory"
    assert manifest["history_added"] == [1]
    (memory / history.HISTORY_NAME).unlink()  # cursors start again at 1
    (memory / history.CURSOR_NAME).unlink()
    history.append_entries(memory, [("- a fact written since", "telegram:1")], NOW)
    restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert [entry.content for entry in read_history(memory).entries] == ["- a fact written since"]
    assert (memory / "archive" / "2026-01-01.md").exists()
