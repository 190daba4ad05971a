"""nanobotd/daemon/skill.py: the skill file points the agent at the MCP tools first, and respects edits."""

from __future__ import annotations

from pathlib import Path

from nanobotd.cli.agent_tools import TOOLS
from nanobotd.cli.commands.mcp import SERVER_NAME
from nanobotd.daemon import skill

EARLIER_TEXT = """---
name: memory-search
description: Search older memory (past conversations, history, notes) kept by nanobotd.
---

# Memory search

Your long-term memory files (SOUL.md, USER.md, memory/MEMORY.md) are already in your prompt. Older
things — past conversations, archived history, daily notes — are kept by nanobotd. When the user refers
to something you do not see in your context, search before you answer:

```sh
nanobotctl search "words from the question" --limit 8
```

Each hit says where it is from (file and lines, or session and messages) and when. Quote what you find;
say so when nothing relevant comes back. Use `--json` if you want to parse the hits.
"""


def test_a_new_skill_names_every_mcp_tool_before_the_shell_fallback(tmp_path: Path) -> None:
    assert skill.ensure_skill_file(tmp_path) is True
    text = (tmp_path / skill.SKILL_PATH).read_text()
    names = [f"mcp_{SERVER_NAME}_{tool.name}" for tool in TOOLS]
    assert sorted(names) == ["mcp_nanobotd_memory_context", "mcp_nanobotd_memory_recall", "mcp_nanobotd_memory_search"]
    assert all(f"`{name}`" in text for name in names)
    assert max(text.index(name) for name in names) < text.index("nanobotctl search")
    assert skill.ensure_skill_file(tmp_path) is False


def test_an_unedited_earlier_skill_is_upgraded_and_an_edited_one_is_kept(tmp_path: Path) -> None:
    path = tmp_path / skill.SKILL_PATH
    path.parent.mkdir(parents=True)
    path.write_text(EARLIER_TEXT)
    assert skill.ensure_skill_file(tmp_path) is True and path.read_text() == skill.SKILL_TEXT
    path.write_text(EARLIER_TEXT + "\nMy own note.\n")
    assert skill.ensure_skill_file(tmp_path) is False and path.read_text().endswith("My own note.\n")


def test_a_symlinked_skill_is_never_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.md"
    target.write_text(EARLIER_TEXT)
    path = tmp_path / "ws" / skill.SKILL_PATH
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    assert skill.ensure_skill_file(tmp_path / "ws") is False and target.read_text() == EARLIER_TEXT
