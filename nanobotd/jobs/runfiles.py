"""Where a run keeps its backups, and how big they are."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from nanobotd.state.store import RUNS_DIR, RunRecord, StateStore

RESTORE_STEP_KEY = "restore_step"  # in a restore's manifest: the step it journalled before changing anything
RUN_LIST_LIMIT = 1_000_000


def run_backups(store: StateStore, workspace: str) -> Iterator[tuple[RunRecord, Path]]:
    """Each run of *workspace* that keeps a backup folder, with that folder, newest first."""
    for run in store.list_runs(workspace=workspace, limit=RUN_LIST_LIMIT):
        folder = store.state_dir / RUNS_DIR / run.run_id  # not store.run_dir: that creates it
        if folder.is_dir():
            yield run, folder


def folder_size(folder: Path) -> int:
    """Bytes of the regular files under *folder*."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total
