"""Watching from a test or a benchmark: a condition until it holds, a daemon's child processes, what it maps."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

# compiled libraries only an imported litellm brings into a process (Python files are read, never mapped)
LITELLM_SIGNATURES = ("/litellm/", "/pydantic_core/", "/tokenizers/", "/aiohttp/")


async def wait_until(predicate, timeout: float = 20.0):
    """*predicate*'s first truthy value, polled every 50 ms on the running loop; AssertionError after *timeout*."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def pid_exists(pid: int) -> bool:
    """*pid* is still a process, a zombie not yet reaped included (a child that was waited for is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first, then the parent pid, ...); OSError when
    the process is gone."""
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime + stime of the process, of its waited-for children) in seconds."""
    fields = stat_fields(pid)
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, (int(fields[13]) + int(fields[14])) / ticks


def child_pids(pid: int) -> list[int]:
    """Live children of *pid* (found by parent pid, so kernels without /proc/.../children work too)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields(entry.name)
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(entry.name))
    return sorted(children)


def litellm_mappings(pid: int) -> list[str]:
    """Files mapped by *pid* that only an imported litellm would bring in."""
    try:
        with open(f"/proc/{pid}/maps") as handle:
            paths = {line.split()[-1] for line in handle if "/" in line}
    except (FileNotFoundError, ProcessLookupError):
        return []
    return sorted(path for path in paths if any(mark in path for mark in LITELLM_SIGNATURES))
