"""The lifecycle job with an injected clock: archive, expire into history, compact, prune, restore."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from nanobotd.memory import history
from nanobotd.jobs.common import RestoreRefused, describe_step
from nanobotd.jobs.lifecycle.run import run_lifecycle
from nanobotd.jobs.lifecycle.summary import summary_entries
from nanobotd.jobs.lifecycle.undo import restore_lifecycle_run
from nanobotd.llm.client import LLMClient, LLMSettings
from nanobotd.config.schema import LifecycleSettings, WorkspaceSettings
from nanobotd.state.store import StateStore
from tests.support.fakellm import FakeLLM, HttpError, Responder, Text

NOW = datetime(2026, 6, 15, 4, 45)
DAY = 86400
OFFLINE = LLMClient(LLMSettings())


class Clock:
    """A settable clock for the run ledger."""

    def __init__(self, moment: datetime):
        self.value = moment.timestamp()

    def __call__(self) -> float:
        return self.value

    def set(self, moment: datetime) -> None:
        self.value = moment.timestamp()


@pytest.fixture
def clock():
    return Clock(NOW)


@pytest.fixture
def store(tmp_path, clock):
    opened = StateStore(tmp_path / "state", clock=clock).open()
    yield opened
    opened.close()


def workspace(tmp_path: Path, **lifecycle) -> WorkspaceSettings:
    (tmp_path / "ws" / "memory").mkdir(parents=True, exist_ok=True)
    return WorkspaceSettings(path=tmp_path / "ws", name="main", lifecycle=LifecycleSettings(**lifecycle))


def write_note(ws: WorkspaceSettings, relative: str, extra: str = "") -> Path:
    path = ws.path / "memory" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    day = Path(relative).stem
    path.write_text(f"# {day}\n\n## Topics\n- worked on project {day}\n{extra}\n## Notes\nhand-written ✓\n")
    return path


def seed_history(ws: WorkspaceSettings, count: int, dream_cursor: int) -> None:
    memory = ws.path / "memory"
    history.append_entries(memory, [(f"- [durable] fact number {n}", "telegram:1") for n in range(1, count + 1)],
                           NOW - timedelta(days=1))
    (memory / history.DREAM_CURSOR_NAME).write_text(str(dream_cursor))


def tree(ws: WorkspaceSettings) -> dict[str, bytes]:
    """Every file under memory/ (the cursor file excluded: cursors are never reused, so it never goes back)."""
    memory = ws.path / "memory"
    return {str(path.relative_to(memory)): path.read_bytes() for path in sorted(memory.rglob("*"))
            if path.is_file() and path.name != history.CURSOR_NAME}


def lifecycle(ws, store, llm=OFFLINE, now=NOW, dry_run=False) -> tuple[str, dict]:
    run_id = store.create_run("lifecycle", ws.name)
    return run_id, asyncio.run(run_lifecycle(ws, store=store, llm=llm, run_id=run_id, now=now, dry_run=dry_run))


def standard_workspace(tmp_path) -> WorkspaceSettings:
    ws = workspace(tmp_path, max_history_entries=5)
    write_note(ws, "2026-06-14.md")             # 1 day: stays
    write_note(ws, "2026-06-08.md")             # 7 days: stays (not older than active_days)
    write_note(ws, "2026-06-07.md")             # 8 days: moves
    write_note(ws, "2026-01-10.md")             # 156 days: moves and expires in the same run
    write_note(ws, "archive/2026-03-17.md")     # 90 days: stays archived
    write_note(ws, "archive/2026-03-16.md")     # 91 days: expires
    seed_history(ws, count=12, dream_cursor=4)
    return ws


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


def test_offline_expired_notes_go_to_history_raw_and_whole(tmp_path, store):
    ws = standard_workspace(tmp_path)
    _, manifest = lifecycle(ws, store)
    entries = history.read_history(ws.path / "memory").entries
    added = [entry for entry in entries if entry.cursor in manifest["history_added"]]
    assert len(added) == 1 and added[0].content.startswith("[RAW] 2 messages\n")
    assert "[2026-03-16] NOTE: memory/archive/2026-03-16.md\n# 2026-03-16" in added[0].content
    assert "hand-written ✓" in added[0].content and "worked on project 2026-01-10" in added[0].content


def test_a_huge_expired_note_is_split_over_several_raw_entries_and_nothing_is_dropped(tmp_path, store):
    ws = workspace(tmp_path)
    facts = "".join(f"- fact-{number:05d} about the garden\n" for number in range(5000))
    write_note(ws, "archive/2026-01-01.md", facts)
    _, manifest = lifecycle(ws, store)
    entries = history.read_history(ws.path / "memory").entries
    assert len(entries) == len(manifest["history_added"]) > 5
    assert all(len(entry.content) <= ws.consolidation.raw_max_chars for entry in entries)
    joined = "".join(entry.content for entry in entries)
    assert all(f"fact-{number:05d}" in joined for number in range(5000))


def test_expired_notes_are_summarised_into_one_history_entry_by_the_llm(tmp_path, store):
    ws = standard_workspace(tmp_path)
    with FakeLLM() as fake:
        fake.push(Responder(lambda request: Text("- [durable] The project started in January.\n"
                                                 "- [ephemeral] Worked on it in March.",
                                                 prompt_tokens=120, completion_tokens=30)))
        llm = LLMClient(LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5))
        run_id, manifest = lifecycle(ws, store, llm)
    sent = fake.requests[0]["messages"][1]["content"]
    assert "=== memory/archive/2026-01-10.md ===" in sent and "=== memory/archive/2026-03-16.md ===" in sent
    [cursor] = manifest["history_added"]
    [entry] = [entry for entry in history.read_history(ws.path / "memory").entries if entry.cursor == cursor]
    assert entry.content == ("Archived daily notes 2026-01-10 to 2026-03-16 (2 notes), summarised before deletion:\n"
                             "- [durable] The project started in January.\n- [ephemeral] Worked on it in March.")
    assert entry.timestamp == "2026-06-15 04:45"
    assert store.get_run(run_id).outcome == "written"
    [(outcome, tokens, latency)] = store.query("SELECT outcome, tokens, latency_ms FROM outcomes")
    assert (outcome, tokens) == ("written", 150) and latency > 0


def test_an_llm_failure_falls_back_to_raw_entries(tmp_path, store):
    ws = standard_workspace(tmp_path)
    with FakeLLM() as fake:
        fake.push(HttpError(500))
        llm = LLMClient(LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=5))
        run_id, manifest = lifecycle(ws, store, llm)
    [cursor] = manifest["history_added"]
    [entry] = [entry for entry in history.read_history(ws.path / "memory").entries if entry.cursor == cursor]
    assert entry.content.startswith("[RAW] 2 messages")
    [(outcome, reason)] = store.query("SELECT outcome, reason FROM outcomes")
    assert outcome == "raw_fallback" and "500" in reason


def test_summary_entries_never_exceed_the_hard_cap():
    facts = "\n".join(f"- [durable] fact {number} " + "x" * 200 for number in range(1000))
    entries = summary_entries([("memory/archive/2026-01-01.md", "")], facts)
    assert len(entries) > 1 and all(len(entry) <= history.ENTRY_HARD_CAP for entry in entries)
    assert all(f"- [durable] fact {number} " in "".join(entries) for number in range(1000))


def test_compaction_never_removes_an_entry_after_the_dream_cursor(tmp_path, store):
    ws = standard_workspace(tmp_path)
    _, manifest = lifecycle(ws, store)
    cursors = [entry.cursor for entry in history.read_history(ws.path / "memory").entries]
    # 12 entries, keep 5: the oldest 7 would go, but only 1-4 have been dreamt.
    assert cursors[:8] == [5, 6, 7, 8, 9, 10, 11, 12]
    assert manifest["history_removed"]["cursors"] == [1, 2, 3, 4]
    saved = Path(manifest["history_removed"]["backup"]).read_text().splitlines()
    assert [json.loads(line)["cursor"] for line in saved] == [1, 2, 3, 4]


def test_nothing_is_compacted_when_the_dream_has_read_nothing(tmp_path, store):
    ws = workspace(tmp_path, max_history_entries=5)
    seed_history(ws, count=12, dream_cursor=0)
    _, manifest = lifecycle(ws, store, dry_run=True)
    assert manifest["plan"] == []


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


def test_backups_older_than_the_window_are_pruned_and_restore_then_refuses(tmp_path, store, clock):
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
    _, manifest = lifecycle(ws, store)
    assert [item["run_id"] for item in manifest["pruned"]] == [first_id]
    assert not first_backup.parent.parent.exists()
    assert (store.state_dir / "runs" / recent_id / "note.before.md").exists()
    expired = store.get_run(first_id)
    assert expired.manifest["expired"] is True
    with pytest.raises(RestoreRefused, match=f"run {first_id} is past the restore window"):
        restore_lifecycle_run(expired, store=store, dry_run=True)


def test_restore_refuses_when_a_backup_is_missing(tmp_path, store):
    ws = workspace(tmp_path)
    write_note(ws, "archive/2026-01-01.md")
    run_id, manifest = lifecycle(ws, store)
    Path(manifest["backups"]["memory/archive/2026-01-01.md"]["backup"]).unlink()
    with pytest.raises(RestoreRefused, match="is missing"):
        restore_lifecycle_run(store.get_run(run_id), store=store, dry_run=False)
    assert not (ws.path / "memory" / "archive" / "2026-01-01.md").exists()


def test_a_run_with_nothing_to_do_records_no_change(tmp_path, store):
    ws = workspace(tmp_path)
    write_note(ws, "2026-06-14.md")
    run_id, manifest = lifecycle(ws, store)
    assert manifest["executed"] == [] and store.get_run(run_id).outcome == "no_change"
    assert store.query("SELECT outcome FROM outcomes") == [("no_change",)]


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
    flush_run = store.create_run("flush", "main")
    with pytest.raises(RestoreRefused, match="not a lifecycle run"):
        restore_lifecycle_run(store.get_run(flush_run), store=store, dry_run=True)
