"""A dream on a workspace whose disk fills up: a real small tmpfs, filled to a few KiB before the dream applies.
A failed dream leaves the files, the cursor and git as they were; one that finishes has committed its edits."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nanobotd.config.paths import MEMORY_FILES
from nanobotd.gitstore.store import GitStore
from nanobotd.memory.history import read_dream_cursor
from tests.jobs.dream.scenario import MEMORY, SOUL, USER, dream_two_files, git_cli, tree, write_history
from tests.support.mounts import tmpfs

KIB = 1024


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs (skipped where mounting is refused)."""
    with tmpfs(tmp_path / "disk", "2m") as mount_point:
        yield mount_point


def fill(disk: Path, leave: int) -> None:
    """Fill *disk* until only *leave* bytes are free."""
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))
        handle.flush()
        os.fsync(handle.fileno())


@pytest.mark.parametrize("free_kib", [0, 4, 8, 12, 16, 24, 32, 48])
def test_a_dream_that_fills_the_disk_leaves_files_cursor_and_git_as_they_were_or_finishes(
        small_disk, store, fake, free_kib):
    root = small_disk / "workspace"
    (root / "memory").mkdir(parents=True)
    for path, text in zip(MEMORY_FILES, (SOUL, USER, MEMORY), strict=True):
        (root / path).write_text(text)
    (root / "memory" / ".dream_cursor").write_text("0")
    write_history(root, 5)
    git = GitStore(root)
    git.open()
    try:
        before, head, clean = tree(root), git_cli(root, "rev-parse", "HEAD"), git_cli(root, "status", "--porcelain")
        fill(small_disk, free_kib * KIB)
        result = dream_two_files(root, store, git, fake)
    finally:
        git.close()
    (small_disk / "filler").unlink()
    status = git_cli(root, "status", "--porcelain")
    if result.state == "finished":
        assert result.outcome == "written"
        assert git_cli(root, "rev-parse", "HEAD") != head and status == clean
        assert read_dream_cursor(root / "memory") == 5
    else:
        assert result.state == "failed", result
        assert tree(root) == before, "a failed dream changed the files or the cursor"
        assert git_cli(root, "rev-parse", "HEAD") == head and status == clean, status
