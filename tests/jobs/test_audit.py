"""The workspace audit: memory state and problems, each with the action that fixes it."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import pytest

from nanobotd.config.schema import LLMSettings, WorkspaceSettings
from nanobotd.jobs.audit import audit_workspace
from nanobotd.jobs.lifecycle.run import run_lifecycle
from nanobotd.llm.client import LLMClient
from nanobotd.state.store import StateStore

NOW = datetime(2026, 6, 15, 9, 0)


@pytest.fixture
def store(tmp_path):
    opened = StateStore(tmp_path / "state", clock=lambda: NOW.timestamp()).open()
    yield opened
    opened.close()


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "ws" / "memory").mkdir(parents=True)
    return WorkspaceSettings(path=tmp_path / "ws", name="main")


def write_history(ws, lines: list[str], cursor: int | None = None, dream: int | None = None) -> None:
    memory = ws.path / "memory"
    (memory / "history.jsonl").write_text("".join(line + "\n" for line in lines))
    if cursor is not None:
        (memory / ".cursor").write_text(str(cursor))
    if dream is not None:
        (memory / ".dream_cursor").write_text(str(dream))


def entry(cursor: int, content: str = "- [durable] a fact") -> str:
    return json.dumps({"cursor": cursor, "timestamp": "2026-06-14 10:00", "content": content})


def audit(ws, store, plan=None, extra=None) -> dict:
    return audit_workspace(ws, store=store, now=NOW, lifecycle_plan=plan or [], extra_state=extra or {})


def problem_texts(report: dict) -> list[str]:
    return [item["problem"] for item in report["problems"]]


def test_a_healthy_workspace_has_no_problems_and_gaps_are_normal(ws, store):
    write_history(ws, [entry(3), entry(4), entry(9)], cursor=9, dream=4)
    report = audit(ws, store, extra={"sessions": 2, "unarchived_tokens": 1234, "git": "ok"})
    assert report["name"] == "main" and report["problems"] == []
    state = report["state"]
    assert (state["history_entries"], state["undreamt_entries"], state["largest_cursor"]) == (3, 1, 9)
    assert state["history_bytes"] == (ws.path / "memory" / "history.jsonl").stat().st_size
    assert (state["sessions"], state["unarchived_tokens"], state["git"]) == (2, 1234, "ok")


def test_duplicate_cursors_are_found_with_their_lines_and_a_fix(ws, store):
    write_history(ws, [entry(1), entry(2), entry(2, "- [durable] other"), entry(3)], cursor=3)
    [item] = audit(ws, store)["problems"]
    assert item["problem"] == "memory/history.jsonl holds cursor 2 more than once (lines 2, 3)"
    assert "keep one of lines 2, 3" in item["fix"]


def test_cursors_going_backwards_are_reported(ws, store):
    write_history(ws, [entry(1), entry(5), entry(3)], cursor=5)
    [item] = audit(ws, store)["problems"]
    assert "cursor 3 at line 3 follows cursor 5 at line 2" in item["problem"]
    assert "sort" in item["fix"]


def test_unparsable_history_lines_are_reported_by_line_number(ws, store):
    write_history(ws, [entry(1), "{not json", entry(2), '{"cursor": "x", "content": 1}'], cursor=2)
    [item] = audit(ws, store)["problems"]
    assert item["problem"] == "memory/history.jsonl has 2 unparsable line(s): 2, 4"
    assert "repair or delete" in item["fix"]


def test_a_dream_cursor_ahead_of_history_is_reported_with_the_edit_that_fixes_it(ws, store):
    write_history(ws, [entry(1), entry(2)], cursor=2, dream=7)
    [item] = audit(ws, store)["problems"]
    assert "memory/.dream_cursor is 7, ahead of the last allocated cursor 2" in item["problem"]
    assert item["fix"] == "edit memory/.dream_cursor to 2"


def test_a_cursor_file_behind_the_history_is_reported(ws, store):
    write_history(ws, [entry(1), entry(8)], cursor=5, dream=1)
    [item] = audit(ws, store)["problems"]
    assert item == {"problem": "memory/.cursor is 5, behind the largest cursor in history.jsonl (8)",
                    "fix": "edit memory/.cursor to 8"}


def test_bad_state_notes_are_problems_with_fixes(ws, store):
    memory = ws.path / "memory"
    (memory / "2026-02-30.md").write_text("## Topics\n- x\n")
    (memory / "2026-06-01.md").write_bytes(b"## Topics\n- caf\xe9\n")
    (memory / "2026-06-02.md").write_text("just prose\n")
    report = audit(ws, store)
    fixes = {item["problem"].split(":")[0]: item["fix"] for item in report["problems"]}
    assert "rename it to the date" in fixes["memory/2026-02-30.md"]
    assert "UTF-8" in fixes["memory/2026-06-01.md"]
    assert "## Topics" in fixes["memory/2026-06-02.md"]


def test_the_plan_is_passed_through_and_an_overdue_lifecycle_is_a_problem(ws, store):
    memory = ws.path / "memory"
    (memory / "2026-05-01.md").write_text("# 2026-05-01\n\n## Topics\n- x\n")
    run_id = store.create_run("lifecycle", ws.name)
    dry = asyncio.run(run_lifecycle(ws, store=store, llm=LLMClient(LLMSettings()), run_id=run_id, now=NOW,
                                    dry_run=True))
    report = audit(ws, store, plan=dry["plan"])
    assert report["plan_steps"] == [{"action": "move", "from": "memory/2026-05-01.md",
                                     "to": "memory/archive/2026-05-01.md", "bytes": 28, "age_days": 45}]
    assert report["plan"] == ["move memory/2026-05-01.md -> memory/archive/2026-05-01.md (28 bytes, 45 days old)"]
    [item] = report["problems"]
    assert "lifecycle is behind" in item["problem"] and "nanobotctl lifecycle" in item["fix"]


def test_disk_used_by_run_backups_is_counted_for_the_workspace(ws, store):
    mine = store.create_run("flush", ws.name)
    (store.run_dir(mine) / "note.before.md").write_bytes(b"x" * 100)
    other = store.create_run("flush", "other")
    (store.run_dir(other) / "note.before.md").write_bytes(b"x" * 999)
    state = audit(ws, store)["state"]
    assert (state["backup_bytes"], state["backup_runs"]) == (100, 1)
