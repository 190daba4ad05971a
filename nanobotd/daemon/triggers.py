"""The session path: a changed file is scanned off the loop, and its counters start the runs it calls for."""

from __future__ import annotations

import asyncio
from pathlib import Path

from loguru import logger

from nanobotd.daemon import companion, indexing, runs
from nanobotd.daemon.core import Core
from nanobotd.daemon.lock import AlreadyRunning
from nanobotd.daemon.workspace import Workspace
from nanobotd.memory import history


async def scan_and_trigger(core: Core, workspace: Workspace, path: Path) -> None:
    """A watched file changed: scan it off the loop, then start what its counters call for."""
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(core.executor, workspace.scan_path, path)
    if result is not None and result.changed:
        scanned(core, workspace, result.key, vanished=result.vanished, mark_moved=result.mark_moved,
                tail_before=result.tail_before)
        indexing.session_changed(core, workspace, path)


async def reconcile_all(core: Core, *, startup: bool = False, waiting_only: bool = False) -> None:
    """Scan every workspace (catches missed events, overflow, recreated folders).

    *waiting_only*: only workspaces whose sessions folder has not appeared yet (checked every tick, so the
    agent's first session is watched from its first save, not a reconcile interval later).
    """
    for workspace in list(core.workspaces.values()):
        if waiting_only and (workspace.sessions_dirs or not workspace.exists or workspace.last_reconcile is None
                             or not workspace.discover()):
            continue
        if not workspace.exists:
            logger.debug("workspace {} does not exist yet; waiting for it", workspace.settings.path)
            continue
        if not claimed(core, workspace):
            continue
        await reconcile_workspace(core, workspace, startup=startup)


def claimed(core: Core, workspace: Workspace) -> bool:
    """The workspace is this daemon's to work on: its lock is taken (when the workspace is first found, at start or
    when it appears); one another daemon holds is left alone, and status says who holds it."""
    locks = core.locks
    if locks is None or locks.holds_workspace(workspace.settings.path):
        return True
    try:
        locks.take_workspace(workspace.name, workspace.settings.path)
    except AlreadyRunning as exc:
        if workspace.held_elsewhere != str(exc):
            logger.error("workspace {} left alone: {}", workspace.name, exc)
        workspace.held_elsewhere = str(exc)
        return False
    workspace.held_elsewhere = None
    return True


async def reconcile_workspace(core: Core, workspace: Workspace, *, startup: bool) -> None:
    """Scan one workspace's session files, watch its folders, and start what the counters call for."""
    loop = asyncio.get_running_loop()
    results = await loop.run_in_executor(core.executor, workspace.reconcile)
    if core.watcher is not None:
        for folder in workspace.sessions_dirs:
            core.watcher.watch(folder)
        for folder in indexing.memory_folders(workspace):
            core.watcher.watch(folder, memory=True)
    counts = {}
    if startup:
        logger.info("workspace {}: start-up reconcile of {} session file(s) done in {:.2f} s ({} changed)",
                    workspace.name, len(results), workspace.last_reconcile_seconds or 0.0,
                    sum(result.changed for result in results))
        unchanged = [result.key for result in results if not result.changed]
        counts = await loop.run_in_executor(core.executor, vanished_counts, workspace, unchanged)
    for result in results:
        if result.changed:
            scanned(core, workspace, result.key, vanished=result.vanished, mark_moved=result.mark_moved,
                    tail_before=result.tail_before)
        elif startup:
            scanned(core, workspace, result.key, vanished=counts.get(result.key, 0))
    if workspace.mode == "companion":
        companion.poll_agent_history(core, workspace)
    if startup and core.store.rebuilt:
        await loop.run_in_executor(core.executor, rebuild_archive_marks, workspace)
    if startup:
        loop.create_task(open_workspace(core, workspace))
    elif workspace.opened:
        await indexing.check_fingerprints(core, workspace)
        await indexing.sample_daily(core, workspace, new_day_only=True)


async def open_workspace(core: Core, workspace: Workspace) -> None:
    """Open git, QMD and the skill file of a freshly scanned workspace, then refresh its index."""
    await workspace.open()
    indexing.schedule_refresh(core, workspace, None)


def vanished_counts(workspace: Workspace, keys: list[str]) -> dict[str, int]:
    """Spooled messages gone from each unchanged file (found at start: they vanished while nanobotd was down)."""
    return {key: workspace.tracker.vanished_count(key) for key in keys}


def rebuild_archive_marks(workspace: Workspace, batch: int = 1_000) -> None:
    """The state DB was lost: nanobotd's own history entries say which messages it archived.

    The history is streamed and its spans handed over *batch* at a time (marks only add up), so a long
    history never sits in memory, nor do all of its spans.
    """
    spans: dict[str, list[dict]] = {}
    pending = marked = 0
    for entry in history.iter_entries(workspace.env.memory_dir):
        if entry.span and entry.session_key:
            key_spans = spans.setdefault(entry.session_key, [])
            if not key_spans or key_spans[-1] != entry.span:  # the entries of one chunk carry the same span
                key_spans.append(entry.span)
                pending += 1
            if pending >= batch:
                marked += sum(workspace.tracker.apply_history_spans(key, key_spans) for key, key_spans in spans.items())
                spans, pending = {}, 0
    marked += sum(workspace.tracker.apply_history_spans(key, key_spans) for key, key_spans in spans.items())
    if marked:
        logger.warning("workspace {}: rebuilt {} archive marks from history.jsonl", workspace.name, marked)


def scanned(core: Core, workspace: Workspace, key: str, *, vanished: int = 0, mark_moved: bool = False,
            tail_before: int = 0) -> None:
    """A session's counters changed: beside an agent, attribute its archive entries first; then trigger."""
    if workspace.mode == "companion" and (vanished or mark_moved):
        companion.session_scanned(core, workspace, key, mark_moved=mark_moved, vanished=vanished,
                                  tail_before=tail_before)
    trigger(core, workspace, key, vanished=vanished)


def restored(core: Core, workspace: Workspace, run_id: str) -> None:
    """A restore ended: the messages it put back in the spool are the session's to archive again, those that
    left the session file after the grace period (as if they had just vanished), the rest by the triggers."""
    run = core.store.get_run(run_id)
    target = core.store.get_run(run.manifest.get("target", "")) if run is not None else None
    key = target.session_key if target is not None else None
    if run is None or not run.manifest.get("messages") or key not in workspace.tracker.sessions:
        return
    scanned(core, workspace, key, vanished=workspace.tracker.vanished_count(key))


def trigger(core: Core, workspace: Workspace, key: str, *, vanished: int = 0) -> None:
    """Submit the runs a session needs now (coalesced by the queue)."""
    if core.queue is None or not core.queue.accepting:
        return
    for kind, reason in workspace.due_jobs(key, vanished):
        if kind == "flush":
            submit_flush(core, workspace, key)
        else:
            submit_consolidate(core, workspace, key, reason=reason)


def trigger_idle(core: Core) -> None:
    """Sessions quiet long enough: archive them (owner), or flush them before the agent compacts (companion)."""
    now = core.clock()
    for workspace in core.workspaces.values():
        for kind, key in workspace.idle_sessions(now):
            if core.queue.busy(workspace.name, f"session:{key}"):
                continue
            if kind == "flush":
                submit_flush(core, workspace, key)
            else:
                submit_consolidate(core, workspace, key, reason="idle")


def submit_flush(core: Core, workspace: Workspace, key: str) -> str:
    """Queue a flush of session *key*; one whose LLM call failed is submitted again when its backoff has
    passed, while the cycle lasts (the agent's compaction, or nanobotd's, ends it)."""
    return runs.submit(core, workspace, "flush", session_key=key,
                       on_done=lambda: _retry_flush_later(core, workspace, key))


def _retry_flush_later(core: Core, workspace: Workspace, key: str) -> None:
    session = workspace.tracker.sessions.get(key)
    if session is None or not session.flush_failures or session.flush_failures > \
            workspace.settings.consolidation.flush_retries:
        return
    delay = max(0.0, session.flush_retry_at - core.clock())
    logger.info("workspace {}: flush of {} failed ({} so far this cycle); trying again in {:.0f}s",
                workspace.name, key, session.flush_failures, delay)

    def retry() -> None:
        if core.queue is not None and core.queue.accepting and workspace.may_flush(key):
            submit_flush(core, workspace, key)

    asyncio.get_running_loop().call_later(delay, retry)


def submit_consolidate(core: Core, workspace: Workspace, key: str, *, reason: str) -> str:
    """Queue a consolidation of session *key*; when it ends, the session's counters are checked again."""
    return runs.submit(core, workspace, "consolidate", session_key=key, reason=reason,
                       vanished_only=workspace.mode == "companion", on_done=lambda: trigger(core, workspace, key))
