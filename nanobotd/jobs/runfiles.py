"""Where a run keeps its backups, and how big they are."""

from __future__ import annotations

import os
from pathlib import Path

from nanobotd.state.store import RUNS_DIR, StateStore

RESTORE_STEP_KEY = "restore_step"  # in a restore's manifest: the step it journalled before changing anything


def run_backup_dir(store: StateStore, run_id: str) -> Path:
    """A run's backup folder, without creating it (store.run_dir creates on demand)."""
    return store.state_dir / RUNS_DIR / run_id


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
