"""The workspace audit: memory state and problems, each with the action that fixes it, beside an agent too."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import pytest

from nanobotd.config.schema import ConsolidationSettings, ContextSettings, LLMSettings, WorkspaceSettings
from nanobotd.jobs.audit import audit_workspace
from nanobotd.jobs.dreamnotes import mark_dream_notes, unread_note_bullets
from nanobotd.jobs.lifecycle.run import run_lifecycle
from nanobotd.llm.client import LLMClient
from nanobotd.sessions.agent_config import AgentSettings, read_agent_settings
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
    item, backlog = report["problems"]
    assert "lifecycle is behind" in item["problem"] and "nanobotctl lifecycle" in item["fix"]
    assert "1 daily-note bullets not dreamt" in backlog["problem"]


def test_disk_used_by_run_backups_is_counted_for_the_workspace(ws, store):
    mine = store.create_run("flush", ws.name)
    (store.run_dir(mine) / "note.before.md").write_bytes(b"x" * 100)
    other = store.create_run("flush", "other")
    (store.run_dir(other) / "note.before.md").write_bytes(b"x" * 999)
    state = audit(ws, store)["state"]
    assert (state["backup_bytes"], state["backup_runs"]) == (100, 1)


def online(ws: WorkspaceSettings, **tables) -> WorkspaceSettings:
    """The workspace with an LLM configured (the fixture's is offline)."""
    return WorkspaceSettings(path=ws.path, name=ws.name, llm=LLMSettings(model="openai/gpt-4o-mini"), **tables)


def agent_config(tmp_path, dream: dict, servers: dict | None = None) -> AgentSettings:
    path = tmp_path / "nanobot" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"agents": {"defaults": {"dream": dream}}, "tools": {"mcpServers": servers or {}}}))
    return read_agent_settings(path)


NANOBOTD_MCP = {"nanobotd": {"command": "/usr/bin/nanobotctl", "args": ["mcp", "--socket", "/run/n.sock"]}}


def test_an_agent_set_up_for_nanobotd_has_no_problems(ws, store, tmp_path):
    agent = agent_config(tmp_path, {"intervalH": 87_600}, NANOBOTD_MCP)
    assert audit_workspace(ws, store=store, now=NOW, lifecycle_plan=[], extra_state={}, agent=agent,
                           companion=True)["problems"] == []


@pytest.mark.parametrize("dream, servers, expected", [
    ({}, NANOBOTD_MCP, "nanobot's own dream runs every 2 h beside nanobotd's"),
    ({"intervalH": 87_600, "cron": "0 */4 * * *"}, NANOBOTD_MCP, "nanobot's own dream runs by cron '0 */4 * * *'"),
    ({"enabled": False}, NANOBOTD_MCP, "dream.enabled is false in"),
    ({"intervalH": 87_600}, {}, "nanobotd's MCP server is not registered in"),
])
def test_an_agent_config_that_fights_or_misses_nanobotd_is_a_problem_fixed_by_setup(ws, store, tmp_path, dream,
                                                                                    servers, expected):
    agent = agent_config(tmp_path, dream, servers)
    [item] = audit_workspace(ws, store=store, now=NOW, lifecycle_plan=[], extra_state={}, agent=agent)["problems"]
    assert expected in item["problem"]
    assert f"`nanobotctl setup nanobot --nanobot-config {agent.path} --apply`, then restart nanobot" in item["fix"]


def test_a_companion_workspace_whose_agent_config_is_missing_or_broken_says_so(ws, store, tmp_path):
    missing = AgentSettings(path=None)
    assert audit_workspace(ws, store=store, now=NOW, lifecycle_plan=[], extra_state={}, agent=missing)["problems"] == []
    [item] = audit_workspace(ws, store=store, now=NOW, lifecycle_plan=[], extra_state={}, agent=missing,
                             companion=True)["problems"]
    assert "config.json was not found" in item["problem"] and "sessions_dir" in item["fix"]
    broken = tmp_path / "config.json"
    broken.write_text("{nope")
    [item] = audit_workspace(ws, store=store, now=NOW, lifecycle_plan=[], extra_state={},
                             agent=read_agent_settings(broken))["problems"]
    assert "cannot be used" in item["problem"] and f"repair {broken}" in item["fix"]


def test_a_dream_backlog_over_two_days_old_is_a_problem_and_a_fresh_one_is_not(ws, store):
    stamped = [json.dumps({"cursor": n, "timestamp": stamp, "content": "- [durable] a fact"})
               for n, stamp in enumerate(["2026-06-10 10:00", "2026-06-14 10:00", "garbled"], start=1)]
    write_history(ws, stamped, cursor=3, dream=0)
    memory = ws.path / "memory"
    (memory / "archive").mkdir()
    (memory / "archive" / "2026-06-05.md").write_text("## Topics\n- Backups\n- Photos\n")
    (memory / "2026-06-14.md").write_text("## Topics\n- Fresh\n")
    report = audit(online(ws), store)
    [item] = report["problems"]
    assert item["problem"] == ("the dream is behind: 1 history entries and 2 daily-note bullets not dreamt are over"
                               " 2 days old (the oldest from 2026-06-05)")
    assert item["fix"].startswith("run `nanobotctl dream`") and report["state"]["undreamt_note_bullets"] == 3
    assert audit(ws, store)["problems"][0]["fix"].startswith("set [llm] model")
    mark_dream_notes(memory, {"2026-06-05": [bullet.digest for bullet in unread_note_bullets(memory)[:2]]},
                     read=True)
    write_history(ws, stamped, cursor=3, dream=1)
    assert audit(ws, store)["problems"] == []


def test_files_over_their_caps_are_problems_the_dream_fixes(ws, store):
    (ws.path / "SOUL.md").write_text("# Soul\n" + "- be kind\n" * 30)
    (ws.path / "USER.md").write_text("# User\n- Ada\n")
    caps = ContextSettings(max_chars=200, total_max_chars=250)
    report = audit(online(ws, context=caps), store)
    assert report["state"]["bootstrap_chars"] == {"SOUL.md": 307, "USER.md": 13}
    assert [item["problem"] for item in report["problems"]] == [
        "SOUL.md is 307 characters, over its cap of 200 (context.max_chars); nanobot puts it whole into every prompt",
        "SOUL.md, USER.md are 320 characters together, over their joint cap of 250 (context.total_max_chars);"
        " nanobot puts it whole into every prompt"]
    assert "condenses a file over its cap" in report["problems"][0]["fix"]
    offline = WorkspaceSettings(path=ws.path, name="main", context=caps)
    assert audit(offline, store)["problems"][0]["fix"].startswith("shorten it by hand")


def test_messages_archived_twice_are_reported_with_a_fix_for_the_mode(ws, store):
    report = audit_workspace(ws, store=store, now=NOW, lifecycle_plan=[], extra_state={}, archived_twice=3)
    assert report["state"]["archived_twice"] == 3
    [item] = report["problems"]
    assert item["problem"] == "3 message(s) were archived twice, by the agent and by nanobotd"
    assert "agent_grace_seconds (now 180 s)" in item["fix"]
    owner = WorkspaceSettings(path=ws.path, name="main", consolidation=ConsolidationSettings(mode="owner"))
    fix = audit_workspace(owner, store=store, now=NOW, lifecycle_plan=[], extra_state={}, archived_twice=1)
    assert 'consolidation.mode = "auto"' in fix["problems"][0]["fix"]
