#!/usr/bin/env python3
"""Generate a demo nanobot workspace with realistic sessions in nanobot 0.3.5's on-disk format.

Usage: python scripts/make_demo.py DIR

Creates DIR/workspace (AGENTS.md, SOUL.md, USER.md, memory/MEMORY.md and .nanobot/workspace-id) and four
sessions in DIR/sessions/<workspace-id>/, DIR standing for nanobot's config folder (~/.nanobot), where
nanobotd finds them on its own. Prints the workspace path.
"""

from __future__ import annotations

import base64
import json
import os
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path

WORKSPACE_ID = "5d1e0c0ffee0b0a7d3m0000000000000"[:32].replace("m", "a")
TOPICS = [
    ("user", "Our staging server is called kestrel and runs Debian 12."),
    ("assistant", "Noted: staging is kestrel on Debian 12. Want me to check its disk usage?"),
    ("user", "Yes please, and remember I prefer answers in short bullet points."),
    ("assistant", "- kestrel: / is 71% full\n- /var/log is the largest folder (18 GB)"),
    ("user", "Rotate the nginx logs weekly instead of daily, we decided that on Monday."),
    ("assistant", "Changed logrotate for nginx to weekly with 8 rotations kept."),
    ("user", "Actually my cat is called Luna, not Lina. She hates the vacuum cleaner."),
    ("assistant", "Sorry about that: Luna it is."),
    ("user", "What was the name of the postgres replica again?"),
    ("assistant", "The replica is heron, streaming from kestrel since October."),
    ("user", "Open question: should we move backups from rsync to restic?"),
    ("assistant", "Restic would give deduplication and encryption; rsync is simpler. I can draft a plan."),
]


def session_name(key: str) -> str:
    """nanobot's file name: URL-safe base64 of the key without padding."""
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=") + ".jsonl"


def write_session(folder: Path, key: str, start: datetime, turns: int, rng: random.Random) -> None:
    """One session file, written as nanobot does (temp file, then rename)."""
    messages = []
    when = start
    for index in range(turns):
        role, text = TOPICS[index % len(TOPICS)]
        when += timedelta(seconds=rng.randint(20, 240))
        message = {"role": role, "content": f"{text} (turn {index})", "timestamp": when.isoformat()}
        if role == "assistant" and index % 5 == 3:
            call_id = f"call_{index:04d}"
            messages.append({"role": "assistant", "content": "", "timestamp": when.isoformat(),
                             "tool_calls": [{"id": call_id, "type": "function",
                                             "function": {"name": "exec", "arguments": json.dumps({"cmd": "df -h"})}}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "name": "exec",
                             "content": "/dev/vda 252G 180G 72G 71% /", "timestamp": when.isoformat()})
        messages.append(message)
    messages.append({"role": "user", "content": "/status", "timestamp": when.isoformat(), "_command": True})
    metadata = {"_type": "metadata", "key": key, "created_at": start.isoformat(), "updated_at": when.isoformat(),
                "metadata": {}, "last_archived": 0, "last_consolidated": 0}
    path = folder / session_name(key)
    temp = folder / f".{path.name}.{os.getpid():x}.tmp"
    temp.write_text("\n".join(json.dumps(line, ensure_ascii=False) for line in [metadata, *messages]) + "\n")
    os.replace(temp, path)


def make_demo(root: Path) -> Path:
    """Create the demo workspace under *root*; returns the workspace path."""
    rng = random.Random(7)
    workspace = root / "workspace"
    (workspace / "memory").mkdir(parents=True, exist_ok=True)
    (workspace / ".nanobot").mkdir(exist_ok=True)
    (workspace / ".nanobot" / "workspace-id").write_text(WORKSPACE_ID + "\n")
    (workspace / "AGENTS.md").write_text("# Agent\n\nYou are a helpful assistant on a personal server.\n")
    (workspace / "SOUL.md").write_text("# Soul\n\n## Style\n- Friendly and direct.\n")
    (workspace / "USER.md").write_text("# User\n\n## Profile\n- Runs a small home server.\n\n## Preferences\n")
    (workspace / "memory" / "MEMORY.md").write_text("# Memory\n\n## Project Context\n- Servers: kestrel.\n")
    sessions = root / "sessions" / WORKSPACE_ID
    sessions.mkdir(parents=True, exist_ok=True)
    (sessions / ".workspace").write_text(str(workspace.resolve()))
    start = datetime(2026, 11, 20, 9, 0)
    for number, key in enumerate(["cli:direct", "telegram:123456", "discord:998877", "heartbeat"]):
        write_session(sessions, key, start + timedelta(hours=5 * number), 24 + 12 * number, rng)
    return workspace


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(make_demo(Path(sys.argv[1]).absolute()))
