"""The memory-search skill file written into a workspace, so the agent knows how to reach its memory (the MCP
tools, else the shell). A file the user edited is never touched; an earlier text of ours is upgraded."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nanobotd import fsio

SKILL_PATH = Path("skills") / "memory-search" / "SKILL.md"
# sha256 of every earlier SKILL_TEXT: a file still holding one of them was never edited, so it is upgraded.
EARLIER_TEXT_DIGESTS = frozenset({"6c046a25c677343f5a76e923c654666927f2cceec0c7b22eb0dfc92ecaba728a"})
SKILL_TEXT = """---
name: memory-search
description: Search and recall older memory (past conversations, history, daily notes) kept by nanobotd.
---

# Memory search

Your long-term memory files (SOUL.md, USER.md, memory/MEMORY.md) are already in your prompt. Older
things — past conversations, archived history, daily notes — are kept by nanobotd. When the user refers
to something you do not see in your context, look it up before you answer.

Use the nanobotd memory tools first:

- `mcp_nanobotd_memory_search` — pass the distinctive words (names, places, terms), not a whole
  sentence. Returns the best matching notes, history entries and past conversation turns, each with
  where it is from and when.
- `mcp_nanobotd_memory_recall` — one day (`2026-11-20`) or a range (`2026-11-18..2026-11-20`): the
  daily notes and history of those days. For "what did we do yesterday / last week"; work the dates
  out from today's date first.
- `mcp_nanobotd_memory_context` — a budgeted digest of memory for the task at hand, for instance after
  your conversation was compacted. Pass your session key when you know it.

If these tools are not in your tool list, use the shell instead:

```sh
nanobotctl search "words from the question" --limit 8
```

Quote what you find, with its date; say so when nothing relevant comes back. When a tool says nanobotd
is not running, tell the user how to start it instead of retrying.
"""


def ensure_skill_file(workspace: Path) -> bool:
    """Create the memory-search skill when missing, or upgrade an unedited earlier one; True when written."""
    path = workspace / SKILL_PATH
    if path.is_symlink() or (path.exists() and not holds_earlier_text(path)):
        return False
    fsio.atomic_write(path, SKILL_TEXT, root=workspace)
    return True


def holds_earlier_text(path: Path) -> bool:
    """Whether *path* still holds a skill text an earlier nanobotd wrote, byte for byte."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() in EARLIER_TEXT_DIGESTS
    except OSError:
        return False
