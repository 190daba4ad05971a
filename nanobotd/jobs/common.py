"""What a session job needs from the daemon, injected as one object (tests build it directly)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from nanobotd.llm.client import LLMClient
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.state.store import StateStore
from nanobotd.sessions.tracker import SessionTracker


@dataclass
class JobContext:
    """One workspace's settings, state, tracker, LLM client and clock."""

    workspace: WorkspaceSettings
    store: StateStore
    tracker: SessionTracker
    llm: LLMClient
    now: Callable[[], datetime]

    @property
    def memory_dir(self):
        """The workspace's memory folder."""
        return self.workspace.path / "memory"
