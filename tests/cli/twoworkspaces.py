"""A real nanobotd managing two workspaces, each with a session and a memory only it holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from tests.support.daemonproc import DaemonProcess
from tests.support.workspace import conversation, make_workspace, write_session

SECRET = "The vault code is heron-7731."
OTHER_NOTE_DAY = "2026-11-21"


class TwoWorkspaces(NamedTuple):
    """The daemon; "ws" (its memory says "Project kestrel.") and "other" (its memory holds SECRET).

    Each fact is in MEMORY.md and in a history entry: memory_context leaves MEMORY.md out (nanobot injects it)
    and gives the history the agent does not have yet."""

    daemon: DaemonProcess
    home: Path
    other: Path


def write_history_entry(workspace: Path, content: str, session_key: str) -> None:
    """One history entry as nanobot writes it (memory/history.jsonl, cursor 1)."""
    entry = {"cursor": 1, "timestamp": "2026-11-22 04:25", "content": content, "session_key": session_key}
    (workspace / "memory" / "history.jsonl").write_text(json.dumps(entry) + "\n")


def start_two_workspaces(tmp_path: Path) -> TwoWorkspaces:
    """Start the daemon and wait until it tracks both sessions: telegram:home in ws, telegram:other in other."""
    home, home_sessions = make_workspace(tmp_path / "home")
    other, other_sessions = make_workspace(tmp_path / "other")
    (other / "memory" / "MEMORY.md").write_text(f"# Memory\n\n## Secrets\n- {SECRET}\n")
    write_history_entry(home, "Project kestrel.", "telegram:home")
    write_history_entry(other, SECRET, "telegram:other")
    (other / "memory" / f"{OTHER_NOTE_DAY}.md").write_text(f"# {OTHER_NOTE_DAY}\n\n- Counted herons at the lake.\n")
    write_session(home_sessions, "telegram:home", conversation(2, tag="h"))
    write_session(other_sessions, "telegram:other", conversation(2, tag="o"))
    extra = f'[[workspaces]]\npath = "{other}"\nname = "other"\nconsolidation = {{ mode = "owner" }}\n'
    daemon = DaemonProcess(tmp_path, home, extra_config=extra).start()
    daemon.wait_for(lambda: daemon.session("telegram:home") and daemon.session("telegram:other"))
    return TwoWorkspaces(daemon, home, other)
