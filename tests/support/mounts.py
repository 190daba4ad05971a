"""Real mounts for tests that need another filesystem (a state folder on its own tmpfs, a full disk)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(mount_point: Path, size: str = "64m") -> Iterator[Path]:
    """A real tmpfs mounted on *mount_point* (made if missing) for the block; the test is skipped, saying why,
    where mounting is refused (not root, no CAP_SYS_ADMIN)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
