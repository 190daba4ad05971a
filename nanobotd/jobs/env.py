"""The job environment: what a job needs of its workspace, handed to every job by the daemon."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nanobotd.config.schema import WorkspaceSettings
from nanobotd.faults import FaultPoints
from nanobotd.gitstore.store import GitStore
from nanobotd.index.builtin import BuiltinIndex
from nanobotd.index.qmd import QmdBackend
from nanobotd.llm.client import LLMClient
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore


@dataclass
class JobEnv:
    """One workspace's settings, state, tracker, LLM client, git store, search indexes and clocks, handed to every
    job.

    *kinds* is the job registry (kind -> Job), handed in so that restore can dispatch by kind without importing
    the other jobs. *faults*: the fault points a test armed (none in normal use).
    """

    settings: WorkspaceSettings
    store: StateStore
    tracker: SessionTracker
    llm: LLMClient
    now: Callable[[], datetime]
    git: GitStore | None = None
    clock: Callable[[], float] = time.time
    kinds: Mapping[str, Any] = field(default_factory=dict)
    faults: FaultPoints = field(default_factory=FaultPoints)
    index: BuiltinIndex | None = None
    qmd: QmdBackend | None = None

    @property
    def memory_dir(self) -> Path:
        """The workspace's memory folder."""
        return self.settings.path / "memory"


def note_progress(manifest: dict, step: str, done: int | None = None, total: int | None = None) -> None:
    """Say in the manifest how far the run has got (step, n of m), so a waiting `nanobotctl` can show it.

    The caller journals the manifest, as before any step that changes files.
    """
    manifest["progress"] = {"step": step, "done": done, "total": total}
