"""Starting runs: submission by kind through the job registry, the cron schedule, crash recovery. Every kind goes
through its `Job` (jobs/registry.py); nothing here knows one kind from another."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from loguru import logger

from nanobotd.daemon import indexing
from nanobotd.daemon.core import Core
from nanobotd.daemon.workspace import Workspace
from nanobotd.jobs.registry import SCHEDULED_KINDS, job_kind
from nanobotd.state.store import RunRecord
from nanobotd.timestamps import iso_local


def submit(core: Core, workspace: Workspace, kind: str, *, on_done: Callable[[], None] | None = None,
           **params) -> str:
    """Queue a run of *kind* in *workspace* with the kind's *params*; returns its run_id. Its LLM requests take their
    slots from the queue's, shared by every workspace's client."""
    job = job_kind(kind)
    workspace.llm.share_slots(core.queue.llm_slots)

    async def body(run_id: str) -> None:
        if (key := params.get("session_key")) is not None:  # its counters and marks are whole after the first scan
            await workspace.first_scan_done.wait()
            # a session held unread is read here, off the event loop (the job's plan would read it on it)
            if not job.reads_unread:
                await asyncio.get_running_loop().run_in_executor(core.executor, workspace.tracker.read_unread, key)
        await job.run(workspace.env, run_id, params)
        if job.scheduled:
            run = core.store.get_run(run_id)
            if run is not None and run.state == "finished":
                core.store.set_job_success(kind, workspace.name, run_id)
        if job.writes_memory:
            indexing.changed(core, workspace)
        if on_done is not None:
            on_done()

    policy = job.queue_policy(workspace.env, params)
    return core.queue.submit(kind, workspace.name, target=policy.target, body=body, uses_llm=policy.uses_llm,
                             session_key=policy.session_key, manifest=policy.manifest, scope=policy.scope,
                             join_running=policy.join_running,
                             recover=functools.partial(_recover_failed, core, workspace.name, kind)
                             if job.recovers_failures else None)


def _recover_failed(core: Core, name: str, kind: str, run: RunRecord) -> str | None:
    """Close a failed run of *kind* as after a crash, in workspace *name* as it is configured now; None when a reload
    removed it (the run is recovered when it is back, as a crashed one)."""
    workspace = core.workspaces.get(name)
    return None if workspace is None else job_kind(kind).recover(workspace.env, run)


def joinable(core: Core, workspace: Workspace, kind: str, **params) -> str | None:
    """The queued (or running) run that submitting *kind* with *params* would join, if any."""
    policy = job_kind(kind).queue_policy(workspace.env, params)
    return core.queue.joinable(kind, workspace.name, policy.target, scope=policy.scope,
                               join_running=policy.join_running)


def schedule_jobs(core: Core) -> None:
    """Cron jobs per workspace (dream, lifecycle) and the catch-up of runs missed while the daemon was down."""
    scheduler = core.scheduler
    now = core.now().replace(tzinfo=scheduler.timezone)
    for workspace in core.workspaces.values():
        for kind in SCHEDULED_KINDS:
            settings = getattr(workspace.settings, kind)
            if not getattr(settings, "enabled", True) or job_kind(kind).off_reason(workspace.env):
                continue
            job_id = f"{kind}:{workspace.name}"

            async def fire(workspace=workspace, kind=kind) -> None:
                submit(core, workspace, kind)

            scheduler.add(job_id, settings.schedule, fire)
            last, _ = core.store.job_last_success(kind, workspace.name)
            if last is None:
                # a baseline, not a success: a run missed from now on is caught up at the next start
                core.store.set_job_success(kind, workspace.name, None, core.clock())
            elif scheduler.is_missed(job_id, last, now):
                asyncio.get_running_loop().call_soon(lambda w=workspace, k=kind: submit(core, w, k))


def next_runs(core: Core, workspace: Workspace) -> dict:
    """Last success and next run per scheduled job."""
    result = {}
    for kind in SCHEDULED_KINDS:
        if off := job_kind(kind).off_reason(workspace.env):
            result[kind] = {"off": off, "last_success": None, "next_run": None, "running": False}
            continue
        last, last_run = core.store.job_last_success(kind, workspace.name)
        result[kind] = {
            "last_success": iso_local(last) if last_run else None, "last_run_id": last_run,
            "next_run": core.scheduler.next_run(f"{kind}:{workspace.name}"),
            "running": core.queue.busy(workspace.name, kind) if core.queue else False,
        }
    return result


def recover_interrupted_runs(core: Core, only: Workspace | None = None) -> None:
    """Finish or roll back every run (or *only*'s) a crash or a reload left open; queued ones are cancelled. A run of a
    workspace no longer configured stays open until it is back: its journal may hold appends not yet marked."""
    for run in core.store.list_runs(states=("queued", "started"), limit=100000):
        workspace = core.workspaces.get(run.workspace) if only is None else only
        if only is not None and run.workspace != only.name:
            continue
        if run.state == "queued":
            core.store.finish_run(run.run_id, state="cancelled", outcome="cancelled")
            continue
        if workspace is None:
            logger.warning("run {} of workspace {}, which the config no longer has, was interrupted; it is"
                           " recovered when the workspace is configured again", run.run_id, run.workspace)
            continue
        try:
            outcome = job_kind(run.kind).recover(workspace.env, run)
        except Exception as exc:
            logger.opt(exception=exc).error("recovery of run {} failed: {}", run.run_id, exc)
            try:
                core.store.finish_run(run.run_id, state="failed", outcome="recovery_failed")
            except Exception as finish_error:  # a full state disk: the run stays open for the next start or reload
                logger.error("run {} stays open, to be recovered at the next start or reload: {}", run.run_id,
                             finish_error)
            continue
        logger.warning("run {} ({}) was interrupted; recovery: {}", run.run_id, run.kind, outcome)
