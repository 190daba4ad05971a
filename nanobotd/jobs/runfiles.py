"""Where a run keeps its backups, how big they are, and the file reads and writes that keep and put them back."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from nanobotd import fsio
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


def save_backup(backup_dir: Path, path: str, data: bytes | None) -> str | None:
    """Keep *data* as the backup of *path* in a run's folder; None when the file did not exist."""
    if data is None:
        return None
    target = backup_dir / path
    fsio.atomic_write(target, data)
    return str(target)


def load_backup(backup: str | None) -> bytes | None:
    """A backup's bytes; None stands for "the file did not exist"."""
    return Path(backup).read_bytes() if backup else None


def read_or_none(path: Path) -> bytes | None:
    """A file's bytes, or None when it does not exist."""
    return path.read_bytes() if path.is_file() else None


def write_or_delete(path: Path, data: bytes | None, *, root: Path) -> None:
    """Put *data* back atomically; None means the file did not exist, so remove it. Never outside *root*."""
    if data is None:
        fsio.confine(path, root).unlink(missing_ok=True)
        fsio.fsync_dir(path.parent)
    else:
        fsio.atomic_write(path, data, root=root)


def digest(data: bytes) -> str:
    """The sha256 a manifest records of what a run wrote."""
    return hashlib.sha256(data).hexdigest()
