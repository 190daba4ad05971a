"""Keeping the search indexes fresh: debounced, single-flight refreshes after session and memory changes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from loguru import logger

from nanobotd import heap
from nanobotd.daemon.core import Core
from nanobotd.daemon.workspace import ALL_FILES, Workspace

MAX_WAIT_FACTOR = 5  # changes wait at most this many debounce periods for the index
ARCHIVING_KIND = "consolidate"  # while it runs in a workspace, its index refresh waits (up to MAX_WAIT_FACTOR)
TRIM_AFTER_REFRESH_SECONDS = 1.0  # a refresh this long gives its freed memory back (heap.trim) when it ends


def session_changed(core: Core, workspace: Workspace, path: Path) -> None:
    """A session file changed: the indexes refresh it (debounced)."""
    schedule_refresh(core, workspace, {path})
    if workspace.qmd is not None:
        workspace.qmd.request_update()  # its markdown export of the session changes too


def memory_changed(core: Core, workspace: Workspace) -> None:
    """A job changed memory files: refresh the indexes (debounced)."""
    schedule_refresh(core, workspace, None)
    if workspace.qmd is not None:
        workspace.qmd.request_update()


def schedule_refresh(core: Core, workspace: Workspace, paths: set[Path] | None) -> None:
    """Remember what changed and (re)arm the debounce timer, never postponing past MAX_WAIT_FACTOR x debounce.

    An agent busy in a long exchange saves its session every second or so: a plain debounce would keep the
    index stale for as long as the exchange lasts.
    """
    loop = asyncio.get_running_loop()
    if not workspace.pending_paths:
        workspace.pending_since = loop.time()
    if paths is None:
        workspace.pending_paths.add(ALL_FILES)
    else:
        workspace.pending_paths |= paths
    debounce = workspace.settings.search.debounce_seconds
    delay = min(debounce, max(0.0, workspace.pending_since + debounce * MAX_WAIT_FACTOR - loop.time()))
    if workspace.refresh_handle is not None:
        workspace.refresh_handle.cancel()
    workspace.refresh_handle = loop.call_later(delay, lambda: loop.create_task(refresh_index(core, workspace)))


async def refresh_index(core: Core, workspace: Workspace) -> dict | None:
    """Bring the builtin index up to date with what changed (single-flight). While the workspace is being archived
    the refresh waits for its end, as long as the changes may wait (MAX_WAIT_FACTOR): the archive changes history
    and the sessions' spool all along, and a refresh beside it would share the CPU and the GIL with it."""
    if workspace.refreshing or _archiving(core, workspace):
        schedule_refresh(core, workspace, set())
        return None
    paths, workspace.pending_paths = workspace.pending_paths, set()
    changed = None if ALL_FILES in paths or not paths else sorted(paths)
    # counted for status: an index refresh runs beside jobs and shares the CPU (and the GIL) with them
    loop = asyncio.get_running_loop()
    started = workspace.refresh_started = time.monotonic()
    try:
        workspace.last_refresh = await loop.run_in_executor(core.executor, workspace.index.refresh, changed)
    except Exception as exc:  # the index is a cache: a failure is logged, never fatal
        logger.opt(exception=exc).error("workspace {}: index refresh failed: {}", workspace.name, exc)
    finally:
        workspace.refreshes += 1
        workspace.refresh_seconds += time.monotonic() - started
        workspace.refresh_started = None
    if time.monotonic() - started >= TRIM_AFTER_REFRESH_SECONDS:
        # a long refresh read a long transcript: its transient memory goes back before the next scan adds its own
        await loop.run_in_executor(core.executor, heap.trim)
    return workspace.last_refresh


def _archiving(core: Core, workspace: Workspace) -> bool:
    """A consolidation runs in the workspace and the changes waiting for the index have not waited their most."""
    if core.queue is None or not core.queue.running_in(workspace.name, ARCHIVING_KIND) or not workspace.pending_paths:
        return False
    most = workspace.pending_since + workspace.settings.search.debounce_seconds * MAX_WAIT_FACTOR
    return asyncio.get_running_loop().time() < most


async def reindex(core: Core, workspace: Workspace) -> dict:
    """Rebuild the builtin index from scratch (and update QMD)."""
    loop = asyncio.get_running_loop()
    stats = await loop.run_in_executor(core.executor, workspace.index.rebuild)
    if workspace.qmd is not None and workspace.qmd.available:
        await workspace.qmd.update_now()
    return stats
