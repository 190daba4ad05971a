"""Build nanobot-format workspaces and session files for tests (same format as nanobot 0.3.5 writes)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

from nanobotd.sessions.file import filename_for_key

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "nanobot-samples"  # real nanobot 0.3.5 output


def make_workspace(root: Path, *, layout: str = "legacy") -> tuple[Path, Path]:
    """A workspace with its memory files; returns (workspace, sessions_dir)."""
    workspace = root / "workspace"
    (workspace / "memory").mkdir(parents=True, exist_ok=True)
    (workspace / "SOUL.md").write_text("# Soul\n\n## Style\n- Be brief.\n")
    (workspace / "USER.md").write_text("# User\n\n## Preferences\n- Likes tea.\n")
    (workspace / "memory" / "MEMORY.md").write_text("# Memory\n\n## Project Context\n- Project kestrel.\n")
    if layout == "legacy":
        sessions = workspace / "sessions"
    else:
        workspace_id = "93b919bdf3574fe472f4373d44fb8233"
        (workspace / ".nanobot").mkdir()
        (workspace / ".nanobot" / "workspace-id").write_text(workspace_id + "\n")
        sessions = root / "sessions" / workspace_id
        sessions.mkdir(parents=True)
        (sessions / ".workspace").write_text(str(workspace))
    sessions.mkdir(parents=True, exist_ok=True)
    return workspace, sessions


def conversation(count: int, *, start: datetime | None = None, words: int = 20, tag: str = "m") -> list[dict]:
    """*count* alternating user/assistant messages with unique markers."""
    start = start or datetime(2026, 11, 1, 9, 0)
    messages = []
    for index in range(count):
        role = "user" if index % 2 == 0 else "assistant"
        filler = " ".join(f"w{tag}{index}x{word}" for word in range(words))
        messages.append({"role": role, "content": f"{tag.upper()}-{index} {role} says {filler}",
                         "timestamp": (start + timedelta(seconds=30 * index)).isoformat()})
    return messages


def write_session(sessions: Path, key: str, messages: list[dict], *, last_archived: int = 0,
                  extra_lines: list[str] | None = None) -> Path:
    """Save a session the way nanobot does: whole file to a temp name, then rename over the real one."""
    path = sessions / filename_for_key(key)
    metadata = {"_type": "metadata", "key": key, "created_at": "2026-11-01T09:00:00",
                "updated_at": datetime.now().isoformat(), "metadata": {},
                "last_archived": last_archived, "last_consolidated": last_archived}
    lines = [json.dumps(metadata)] + [json.dumps(message, ensure_ascii=False) for message in messages]
    lines += extra_lines or []
    temp = sessions / f".{path.name}.{os.getpid():x}.tmp"
    temp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(temp, path)
    return path


def history_entries(workspace: Path) -> list[dict]:
    """Every parseable history.jsonl record."""
    path = workspace / "memory" / "history.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
