"""The job environment: what a job needs of its workspace, handed to every job by the daemon."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from loguru import logger

from nanobotd.config.schema import WorkspaceSettings
from nanobotd.faults import FaultPoints
from nanobotd.gitstore.store import GitStore
from nanobotd.index.builtin import BuiltinIndex
from nanobotd.index.qmd import QmdBackend
from nanobotd.llm.client import LLMClient
from nanobotd.llm.reply import UsageMeter
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore


@dataclass
class JobEnv:
    """One workspace's settings, state, tracker, LLM client, git store, search indexes and clocks, handed to every job.
    """

    settings: WorkspaceSettings
    store: StateStore
    tracker: SessionTracker
    llm: LLMClient
    now: Callable[[], datetime]
    git: GitStore | None = None
    clock: Callable[[], float] = time.time
    kinds: Mapping[str, Any] = field(default_factory=dict)  # the registry, so restore dispatches without imports
    faults: FaultPoints = field(default_factory=FaultPoints)  # the fault points a test armed (none in normal use)
    index: BuiltinIndex | None = None
    qmd: QmdBackend | None = None

    @property
    def memory_dir(self) -> Path:
        """The workspace's memory folder."""
        return self.settings.path / "memory"


def note_progress(manifest: dict, step: str, done: int | None = None, total: int | None = None) -> None:
    """Say in the manifest how far the run has got (step, n of m), for a waiting `nanobotctl` to show. The caller
    journals the manifest, as before any step that changes files."""
    manifest["progress"] = {"step": step, "done": done, "total": total}


def end_run(store: StateStore, kind: str, workspace: str, run_id: str, manifest: dict, outcome: str, reason: str = "",
            *, meter: UsageMeter | None = None) -> dict:
    """Close a run as every job does at its end: its reason (and tokens) in the manifest, the run failed on an
    "error" outcome, and one outcome row for the metrics (its LLM calls' tokens and time); returns the manifest."""
    tokens, latency_ms = 0, None
    if meter is not None:
        latency_ms = sum(meter.latencies_ms) if meter.latencies_ms else None
        usage = manifest["tokens"] = meter.to_json()
        tokens = usage["prompt_tokens"] + usage["completion_tokens"]
    manifest["reason"] = reason
    if outcome == "error":
        logger.warning("{} run {} in {}: {}", kind, run_id, workspace, reason)
    store.finish_run(run_id, state="failed" if outcome == "error" else "finished", outcome=outcome,
                     manifest=manifest)
    store.record_outcome(kind, workspace, outcome, run_id=run_id, reason=reason, tokens=tokens,
                         latency_ms=latency_ms)
    return manifest
