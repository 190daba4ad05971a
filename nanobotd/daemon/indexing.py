"""Keeping the search indexes fresh: debounced, single-flight refreshes after session and memory changes.

Memory files change under three hands: nanobotd's jobs (each calls changed() when it ends), the agent's file tools and
the user's editor (seen by the watcher), and anything the watcher missed (caught at the next reconcile by comparing each
indexed file's inode, size and mtime with the index's record)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from loguru import logger

from nanobotd import heap
from nanobotd.daemon.core import Core
from nanobotd.daemon.workspace import ALL_FILES, Workspace
from nanobotd.index.sources import NOTE_DIRS
from nanobotd.jobs.registry import JOB_KINDS
from nanobotd.sessions.session import archived_twice_count
from nanobotd.state import metrics
from nanobotd.tuning import MAX_WAIT_FACTOR, TRIM_AFTER_REFRESH_SECONDS

# While a job whose refresh_waits runs in a workspace, its index refresh waits (up to MAX_WAIT_FACTOR): the job
# rewrites memory files all along and refreshes the index when it ends, so the watcher's events of its own writes
# would only add refreshes.
WRITING_KINDS = tuple(kind for kind, job in JOB_KINDS.items() if job.refresh_waits)


def changed(core: Core, workspace: Workspace, paths: set[Path] | None = None) -> None:
    """Session or memory files changed (None: a job's writes, check every file): refresh the indexes (debounced; QMD's
    markdown export of a session changes too)."""
    schedule_refresh(core, workspace, paths)
    if workspace.qmd is not None:
        workspace.qmd.request_update()


def memory_folders(workspace: Workspace) -> list[Path]:
    """The folders holding the memory files the indexes read (SOUL.md and USER.md, MEMORY.md, notes, history)."""
    root = workspace.index.sources.workspace
    return [root, *(root / name for name in NOTE_DIRS)]


def is_memory_file(workspace: Workspace, path: Path) -> bool:
    """*path* (in a memory folder) is a file an index reads (for QMD any markdown file: its collection mask); not swap
    files, backups (`~`), editors' probe files (vim's `4913`), nanobotd's lock and cursor files."""
    kind = workspace.index.sources.classify(path)
    if kind is not None:
        return kind != "session"
    return (workspace.qmd is not None and path.suffix == ".md" and not path.name.startswith(".")
            and path.parent != workspace.index.sources.workspace)


def memory_path_changed(core: Core, path: Path) -> None:
    """The watcher saw a memory folder change: refresh the indexes of each open workspace that reads it."""
    for workspace in core.workspaces.values():
        if workspace.opened and path.parent in memory_folders(workspace) and is_memory_file(workspace, path):
            changed(core, workspace, {path})


async def check_fingerprints(core: Core, workspace: Workspace) -> list[Path]:
    """At a reconcile: refresh the indexes when a covered file changed, appeared or went away without an event. Skipped
    while a refresh is pending or running: that refresh reads every file it needs anyway."""
    if workspace.pending_paths or workspace.refreshing:
        return []
    stale = await asyncio.get_running_loop().run_in_executor(core.executor, workspace.index.stale_files)
    if not stale:
        return []
    shown = ", ".join(workspace.index.sources.display_path(str(path)) for path in stale[:3])
    logger.info("workspace {}: {} indexed file(s) changed unseen ({}{}); refreshing the index", workspace.name,
                len(stale), shown, ", ..." if len(stale) > 3 else "")
    changed(core, workspace, set(stale))
    return stale


def schedule_refresh(core: Core, workspace: Workspace, paths: set[Path] | None) -> None:
    """Remember what changed and (re)arm the refresh for a debounce after the first changed file went quiet, but at most
    MAX_WAIT_FACTOR x debounce after the first change (empty *paths*: look again a debounce from now)."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    if not workspace.pending_paths:
        workspace.pending_since = now
    for path in [ALL_FILES] if paths is None else paths:
        workspace.pending_paths[path] = now
    debounce = workspace.settings.search.debounce_seconds
    quiet = min(workspace.pending_paths.values()) if paths or paths is None else now
    # Capped: a busy agent saves every second or so, and a plain debounce would keep the index stale all exchange long.
    delay = max(0.0, min(quiet + debounce, workspace.pending_since + debounce * MAX_WAIT_FACTOR) - now)
    if workspace.refresh_handle is not None:
        workspace.refresh_handle.cancel()
    workspace.refresh_handle = loop.call_later(delay, lambda: loop.create_task(refresh_index(core, workspace)))


async def refresh_index(core: Core, workspace: Workspace) -> dict | None:
    """Bring the builtin index up to date (single-flight), waiting (up to MAX_WAIT_FACTOR) for the end of a job writing
    memory: beside it a refresh would share the CPU and GIL, and the job's end refreshes anyway."""
    if not workspace.pending_paths:
        return None  # a refresh that started after this one was armed took the changes
    if workspace.refreshing or _writing(core, workspace):
        schedule_refresh(core, workspace, set())
        return None
    paths, workspace.pending_paths = workspace.pending_paths, {}
    changed = None if ALL_FILES in paths else sorted(paths)
    # counted for status: an index refresh runs beside jobs and shares the CPU (and the GIL) with them
    loop = asyncio.get_running_loop()
    waited = loop.time() - workspace.pending_since
    started = workspace.refresh_started = time.monotonic()
    try:
        workspace.last_refresh = await loop.run_in_executor(core.executor, workspace.index.refresh, changed)
    except Exception as exc:  # the index is a cache: a failure is logged, never fatal
        logger.opt(exception=exc).error("workspace {}: index refresh failed: {}", workspace.name, exc)
    finally:
        workspace.refreshes += 1
        workspace.refresh_seconds += time.monotonic() - started
        workspace.refresh_started = None
        # how stale a search could be: the wait since the first change, then the refresh itself
        logger.debug("workspace {}: index refresh of {} took {:.2f}s, {:.2f}s after the first change",
                     workspace.name, "every file" if changed is None else f"{len(changed)} file(s)",
                     time.monotonic() - started, waited)
    if time.monotonic() - started >= TRIM_AFTER_REFRESH_SECONDS:
        # a long refresh read a long transcript: its transient memory goes back before the next scan adds its own
        await loop.run_in_executor(core.executor, heap.trim)
    await sample_daily(core, workspace)
    return workspace.last_refresh


async def sample_daily(core: Core, workspace: Workspace, *, new_day_only: bool = False) -> None:
    """Keep today's archived-twice count and index size in the daily samples: after each index refresh (which follows
    what changes them), and at a reconcile when the day has none (*new_day_only*), so an idle day gets one row."""
    day = core.now().date().isoformat()
    if new_day_only and workspace.sampled_day == day:
        return

    def sample() -> None:
        stats = workspace.index.stats()
        metrics.record_daily_sample(core.store, workspace.name, day,
                                    archived_twice=archived_twice_count(core.store, workspace.name),
                                    index_units=int(stats.get("units") or 0),
                                    index_db_bytes=int(stats.get("db_bytes") or 0))

    try:
        await asyncio.get_running_loop().run_in_executor(core.executor, sample)
    except Exception as exc:  # a chart's figure: a failure is logged, never fatal
        logger.opt(exception=exc).warning("workspace {}: daily sample not kept: {}", workspace.name, exc)
        return
    workspace.sampled_day = day


def _writing(core: Core, workspace: Workspace) -> bool:
    """A job that writes memory runs in the workspace and the changes waiting for the index have not waited their
    most."""
    if core.queue is None or not workspace.pending_paths or not any(
            core.queue.running_in(workspace.name, kind) for kind in WRITING_KINDS):
        return False
    most = workspace.pending_since + workspace.settings.search.debounce_seconds * MAX_WAIT_FACTOR
    return asyncio.get_running_loop().time() < most
