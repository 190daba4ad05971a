"""The session path: a changed file is scanned off the loop, and its counters start the runs it calls for."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from loguru import logger

from nanobotd.daemon import companion, indexing, runs
from nanobotd.daemon.core import Core
from nanobotd.daemon.lock import AlreadyRunning
from nanobotd.daemon.workspace import Workspace
from nanobotd.memory import history
from nanobotd.sessions.session import ScanResult


def path_changed(core: Core, path: Path) -> None:
    """The watcher saw a session file change: scan it in the workspace it belongs to."""
    for workspace in core.workspaces.values():
        if workspace.owns(path):
            asyncio.get_running_loop().create_task(scan_and_trigger(core, workspace, path))
            return


async def scan_and_trigger(core: Core, workspace: Workspace, path: Path) -> None:
    """A watched file changed: scan it off the loop, then start what its counters call for."""
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(core.executor, workspace.scan_path, path)
    if result is not None and result.changed:
        scanned(core, workspace, result)
        indexing.changed(core, workspace, {path})


async def reconcile_all(core: Core, *, waiting_only: bool = False) -> None:
    """Scan every workspace (catches missed events, overflow, recreated folders), opening each at its first reconcile.
    *waiting_only* (every tick): those unopened or without a sessions folder yet, so a first save is seen at once."""
    for workspace in list(core.workspaces.values()):
        if workspace.reconciling or (waiting_only and not waiting(workspace)):
            continue
        if not workspace.exists:
            logger.debug("workspace {} does not exist yet; waiting for it", workspace.settings.path)
        elif claimed(core, workspace):
            workspace.reconciling = True
            try:
                await reconcile_workspace(core, workspace)
            finally:
                workspace.reconciling = False


def waiting(workspace: Workspace) -> bool:
    """The tick reconciles a workspace that exists but was never opened (it appeared after the start), and one
    whose sessions folder has just appeared."""
    if workspace.held_elsewhere or not workspace.exists:
        return False
    if workspace.opening is None:
        return True
    return not workspace.sessions_dirs and workspace.last_reconcile is not None and bool(workspace.discover())


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


async def reconcile_workspace(core: Core, workspace: Workspace) -> None:
    """Watch a workspace's folders, scan its session files (a change during the scan is rescanned) and start what the
    counters call for. The first one opens it: git beside the scan, the agent's history followed from before it."""
    loop = asyncio.get_running_loop()
    first = workspace.last_reconcile is None
    if first:
        workspace.begin_open()
        if workspace.settings.consolidation.mode != "owner":
            companion.agent_archive(core, workspace)  # the cursor, saved: an agent entry written during the scan counts
    try:
        await loop.run_in_executor(core.executor, workspace.discover)
        watch_folders(core, workspace)
        results = await loop.run_in_executor(core.executor, functools.partial(workspace.reconcile, first=first))
        if first:
            logger.info("workspace {}: start-up reconcile of {} session file(s) done in {:.2f} s ({} changed)",
                        workspace.name, len(results), workspace.last_reconcile_seconds or 0.0,
                        sum(result.changed for result in results))
            if core.store.rebuilt:  # before any job: a run started meanwhile would archive those messages again
                await loop.run_in_executor(core.executor, rebuild_archive_marks, workspace)
            results = await loop.run_in_executor(core.executor, with_vanished, workspace, results)
    finally:
        if workspace.last_reconcile is not None:  # a session job queued meanwhile (runs.submit) goes on now
            workspace.first_scan_done.set()
    for result in results:
        if result.changed or first:
            scanned(core, workspace, result)
    if workspace.mode == "companion":
        companion.poll_agent_history(core, workspace)
    if first:
        loop.create_task(open_workspace(core, workspace))
    elif workspace.opened:
        await indexing.check_fingerprints(core, workspace)
        await indexing.sample_daily(core, workspace, new_day_only=True)


def watch_folders(core: Core, workspace: Workspace) -> None:
    """Watch (or re-arm) the workspace's session and memory folders."""
    if core.watcher is not None:
        for folder in workspace.sessions_dirs:
            core.watcher.watch(folder)
        for folder in indexing.memory_folders(workspace):
            core.watcher.watch(folder, memory=True)


def unwatch_folders(core: Core, workspace: Workspace) -> None:
    """Stop watching the folders of a workspace the config dropped or changed (a moved workspace's old path); a
    folder that is still configured is armed again by its workspace's reconcile."""
    if core.watcher is not None:
        for folder in workspace.sessions_dirs:
            core.watcher.unwatch(folder)
        for folder in indexing.memory_folders(workspace):
            core.watcher.unwatch(folder, memory=True)


async def open_workspace(core: Core, workspace: Workspace) -> None:
    """Open QMD and the skill file of a freshly scanned workspace (and see its git store open), then refresh its
    index."""
    await workspace.open()
    indexing.schedule_refresh(core, workspace, None)


def with_vanished(workspace: Workspace, results: list[ScanResult]) -> list[ScanResult]:
    """Each unchanged file's result with the spooled messages gone from it (found at start: they vanished while
    nanobotd was down)."""
    return [result if result.changed else ScanResult(result.key, False, vanished=workspace.tracker.vanished_count(
        result.key)) for result in results]


def rebuild_archive_marks(workspace: Workspace, batch: int = 1_000) -> None:
    """The state DB was lost: nanobotd's own history entries say which messages it archived. The history is streamed and
    its spans handed over *batch* at a time (marks only add up), so neither it nor its spans sit in memory."""
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


def scanned(core: Core, workspace: Workspace, result: ScanResult) -> None:
    """A session's counters changed: beside an agent, attribute its archive entries first; then trigger."""
    if workspace.mode == "companion":
        companion.session_scanned(core, workspace, result.key, mark_moved=result.mark_moved, vanished=result.vanished,
                                  tail_before=result.tail_before)
    trigger(core, workspace, result.key, vanished=result.vanished)


def restored(core: Core, workspace: Workspace, run_id: str) -> None:
    """A restore ended: the messages it put back in the spool are the session's to archive again, those that
    left the session file after the grace period (as if they had just vanished), the rest by the triggers."""
    run = core.store.get_run(run_id)
    target = core.store.get_run(run.manifest.get("target", "")) if run is not None else None
    key = target.session_key if target is not None else None
    if run is None or not run.manifest.get("messages") or key not in workspace.tracker.sessions:
        return
    scanned(core, workspace, ScanResult(key, False, vanished=workspace.tracker.vanished_count(key)))


def trigger(core: Core, workspace: Workspace, key: str, *, vanished: int = 0) -> None:
    """Submit the runs a session needs now (coalesced by the queue); none for a workspace a reload removed."""
    if core.queue is None or not core.queue.accepting or core.workspaces.get(workspace.name) is not workspace:
        return
    for kind, reason in workspace.due_jobs(key, vanished):
        submit_due(core, workspace, kind, key, reason)


def trigger_idle(core: Core) -> None:
    """Sessions quiet long enough: archive them (owner), or flush them before the agent compacts (companion)."""
    now = core.clock()
    for workspace in core.workspaces.values():
        for kind, key in workspace.idle_sessions(now):
            if not core.queue.busy(workspace.name, f"session:{key}"):
                submit_due(core, workspace, kind, key, "idle")


def submit_due(core: Core, workspace: Workspace, kind: str, key: str, reason: str) -> None:
    """Queue the flush or consolidation a session's counters (or its quiet) call for."""
    if kind == "flush":
        submit_flush(core, workspace, key)
    else:
        submit_consolidate(core, workspace, key, reason=reason)


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
        if (core.queue is not None and core.queue.accepting and core.workspaces.get(workspace.name) is workspace
                and workspace.may_flush(key)):
            submit_flush(core, workspace, key)

    asyncio.get_running_loop().call_later(delay, retry)


def submit_consolidate(core: Core, workspace: Workspace, key: str, *, reason: str) -> str:
    """Queue a consolidation of session *key*; when it ends, the session's counters are checked again."""
    return runs.submit(core, workspace, "consolidate", session_key=key, reason=reason,
                       vanished_only=workspace.mode == "companion", on_done=lambda: trigger(core, workspace, key))
