"""Watching from a test or a benchmark: a condition until it holds, and the child processes of a daemon."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path


async def wait_until(predicate, timeout: float = 20.0):
    """*predicate*'s first truthy value, polled every 50 ms on the running loop; AssertionError after *timeout*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def child_pids(pid: int) -> list[int]:
    """Live children of *pid* (found by parent pid, so kernels without /proc/.../children work too)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(entry.name))
    return sorted(children)
