"""A real nanobotd managing two workspaces, each with a session and a memory only it holds."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from tests.support.daemonproc import DaemonProcess
from tests.support.workspace import conversation, make_workspace, write_session

SECRET = "The vault code is heron-7731."
OTHER_NOTE_DAY = "2026-11-21"


class TwoWorkspaces(NamedTuple):
    """The daemon; "ws" (its MEMORY.md says "Project kestrel.") and "other" (its MEMORY.md holds SECRET)."""

    daemon: DaemonProcess
    home: Path
    other: Path


def start_two_workspaces(tmp_path: Path) -> TwoWorkspaces:
    """Start the daemon and wait until it tracks both sessions: telegram:home in ws, telegram:other in other."""
    home, home_sessions = make_workspace(tmp_path / "home")
    other, other_sessions = make_workspace(tmp_path / "other")
    (other / "memory" / "MEMORY.md").write_text(f"# Memory\n\n## Secrets\n- {SECRET}\n")
    (other / "memory" / f"{OTHER_NOTE_DAY}.md").write_text(f"# {OTHER_NOTE_DAY}\n\n- Counted herons at the lake.\n")
    write_session(home_sessions, "telegram:home", conversation(2, tag="h"))
    write_session(other_sessions, "telegram:other", conversation(2, tag="o"))
    extra = f'[[workspaces]]\npath = "{other}"\nname = "other"\nconsolidation = {{ mode = "owner" }}\n'
    daemon = DaemonProcess(tmp_path, home, extra_config=extra).start()
    daemon.wait_for(lambda: daemon.session("telegram:home") and daemon.session("telegram:other"))
    return TwoWorkspaces(daemon, home, other)
