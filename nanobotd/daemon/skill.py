"""The memory-search skill file nanobotd writes into a workspace, so the agent knows how to search."""

from __future__ import annotations

from pathlib import Path

from nanobotd import fsio

SKILL_PATH = Path("skills") / "memory-search" / "SKILL.md"
SKILL_TEXT = """---
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


def ensure_skill_file(workspace: Path) -> bool:
    """Create the memory-search skill when missing; an existing file (maybe edited) is never overwritten."""
    path = workspace / SKILL_PATH
    if path.exists() or path.is_symlink():
        return False
    fsio.atomic_write(path, SKILL_TEXT)
    return True
