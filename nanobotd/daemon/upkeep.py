"""Memory upkeep around the session jobs: git, dream, lifecycle, restore, search indexes.

Kept apart from services.py so the session path (track -> spool -> archive) stays small. Route
handlers for these live in control_upkeep.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

from nanobotd import fsio
from nanobotd.gitstore.store import GitStore
from nanobotd.index.builtin import BuiltinIndex
from nanobotd.config.schema import QmdSettings
from nanobotd.index.qmd import QmdBackend
from nanobotd.jobs import restore
from nanobotd.jobs.dream import run as dream
from nanobotd.jobs.lifecycle import run as lifecycle
from nanobotd.daemon.workspace import WorkspaceRuntime
from nanobotd.timestamps import iso_local

if TYPE_CHECKING:
    from nanobotd.daemon.daemon import Daemon

SKILL_PATH = Path("skills") / "memory-search" / "SKILL.md"
SKILL_TEXT = """---
name: memory-search
description: Search older memory (past conversations, history, notes) kept by nanobotd.
---

# Memory search

Your long-term memory files (SOUL.md, USER.md, memory/MEMORY.md) are already in your prompt. Older
things — past conversations, archived history, daily notes — are kept by nanobotd. When the user refers
to something you do not see in your context, search before you answer:

```sh
nanobotctl search "words from the question" --limit 8
```

Each hit says where it is from (file and lines, or session and messages) and when. Quote what you find;
say so when nothing relevant comes back. Use `--json` if you want to parse the hits.
"""


class WorkspaceExtras:
    """Git store, search backends and index refresh state of one workspace."""

    def __init__(self, runtime: WorkspaceRuntime, state_dir: Path, environ):
        self.runtime = runtime
        settings = runtime.settings
        self.git = GitStore(settings.path)
        self.index = BuiltinIndex(settings.path, state_dir / "index" / f"{settings.name}.sqlite",
                                  runtime.sessions_dirs[0] if runtime.sessions_dirs else settings.sessions_dir)
        self.qmd: QmdBackend | None = None
        if settings.search.backend in ("qmd", "both"):
            self.qmd = QmdBackend(settings.path, state_dir / "qmd" / settings.name, QmdSettings(
                command=settings.search.qmd_command, timeout_seconds=settings.search.qmd_timeout_seconds,
                debounce_seconds=settings.search.debounce_seconds, vectors=settings.search.qmd_vectors),
                environ=dict(environ))
        self.pending_paths: set[Path] = set()
        self.refresh_handle: asyncio.TimerHandle | None = None
        self.refreshing = False
        self.last_refresh: dict | None = None


class Upkeep:
    """Scheduled and on-demand maintenance of each workspace's long-term memory."""

    def __init__(self, daemon: "Daemon"):
        self.daemon = daemon
        self.extras: dict[str, WorkspaceExtras] = {}

    def extra(self, runtime: WorkspaceRuntime) -> WorkspaceExtras:
        """The extras of *runtime*, created on first use."""
        extras = self.extras.get(runtime.name)
        if extras is None:
            extras = WorkspaceExtras(runtime, self.daemon.config.state_dir, self.daemon.config.environ)
            self.extras[runtime.name] = extras
        return extras

    # -- scheduling ------------------------------------------------------------------------------------
    def schedule_jobs(self) -> None:
        """Dream and lifecycle cron jobs per workspace, and the catch-up of runs missed while down."""
        scheduler = self.daemon.scheduler
        now = self.daemon.now().replace(tzinfo=scheduler.timezone)
        for runtime in self.daemon.runtimes.values():
            jobs = [("lifecycle", runtime.settings.lifecycle.schedule, self.submit_lifecycle)]
            if runtime.settings.dream.enabled:
                jobs.append(("dream", runtime.settings.dream.schedule, self.submit_dream))
            for kind, expression, submit in jobs:
                job_id = f"{kind}:{runtime.name}"

                async def fire(runtime=runtime, submit=submit) -> None:
                    submit(runtime)

                scheduler.add(job_id, expression, fire)
                last = self.daemon.store.job_last_success(kind, runtime.name)
                if last is None:
                    # a baseline, not a success: a run missed from now on is caught up at the next start
                    self.daemon.store.set_job_success(kind, runtime.name, None, self.daemon.clock())
                elif scheduler.is_missed(job_id, last, now):
                    asyncio.get_running_loop().call_soon(submit, runtime)

    def next_runs(self, runtime: WorkspaceRuntime) -> dict:
        """Last success and next run per scheduled job."""
        result = {}
        for kind in ("dream", "lifecycle"):
            last = self.daemon.store.job_last_success(kind, runtime.name)
            last_run = self.daemon.store.job_last_run(kind, runtime.name)
            result[kind] = {
                "last_success": iso_local(last) if last_run else None, "last_run_id": last_run, "next_run": self.daemon.scheduler.next_run(f"{kind}:{runtime.name}"),
                "running": self.daemon.queue.busy(runtime.name, kind) if self.daemon.queue else False,
            }
        return result

    # -- jobs --------------------------------------------------------------------------------------------
    def submit_dream(self, runtime: WorkspaceRuntime) -> str:
        """Queue a dream (one at a time per workspace; a running dream is never started twice)."""
        extras = self.extra(runtime)

        async def body(run_id: str) -> None:
            result = await dream.dream_workspace(runtime.settings, store=self.daemon.store, llm=runtime.llm,
                                                 git=extras.git, run_id=run_id, clock=self.daemon.now)
            run = self.daemon.store.get_run(run_id)
            if run is not None and run.state == "finished":
                self.daemon.store.set_job_success("dream", runtime.name, run_id)
            self.memory_changed(runtime)
            return result

        return self.daemon.queue.submit("dream", runtime.name, "dream", body, uses_llm=not runtime.llm.offline,
                                        join_running=True)

    def submit_lifecycle(self, runtime: WorkspaceRuntime) -> str:
        """Queue a lifecycle run."""
        async def body(run_id: str) -> None:
            await lifecycle.run_lifecycle(runtime.settings, store=self.daemon.store, llm=runtime.llm, run_id=run_id,
                                          now=self.daemon.now())
            run = self.daemon.store.get_run(run_id)
            if run is not None and run.state == "finished":
                self.daemon.store.set_job_success("lifecycle", runtime.name, run_id)
            self.memory_changed(runtime)

        return self.daemon.queue.submit("lifecycle", runtime.name, "lifecycle", body, uses_llm=False,
                                        join_running=True)

    async def lifecycle_plan(self, runtime: WorkspaceRuntime) -> dict:
        """What the next lifecycle run would do (a dry run changes nothing)."""
        return await lifecycle.run_lifecycle(runtime.settings, store=self.daemon.store, llm=runtime.llm,
                                             run_id="dry-run", now=self.daemon.now(), dry_run=True)

    def submit_restore(self, runtime: WorkspaceRuntime, target: str, *, force: bool) -> str:
        """Queue a restore run (itself a run, so it can be restored in turn)."""
        async def body(run_id: str) -> None:
            await restore.restore_target(self.restore_context(runtime), target, restore_run_id=run_id,
                                         force=force)
            self.memory_changed(runtime)

        return self.daemon.queue.submit("restore", runtime.name, f"restore:{target}", body, uses_llm=False,
                                        manifest={"target": target, "force": force})

    def restore_context(self, runtime: WorkspaceRuntime) -> restore.RestoreContext:
        """What restore needs of one workspace."""
        return restore.RestoreContext(runtime.context, self.extra(runtime).git,
                                      self.daemon.config.state_dir, self.daemon.clock)

    # -- index upkeep ------------------------------------------------------------------------------------
    def session_changed(self, runtime: WorkspaceRuntime, path: Path) -> None:
        """A session file changed: the index refreshes it (debounced)."""
        self._schedule_refresh(runtime, {path})

    def memory_changed(self, runtime: WorkspaceRuntime) -> None:
        """A job changed memory files: refresh the indexes (debounced)."""
        self._schedule_refresh(runtime, None)
        extras = self.extra(runtime)
        if extras.qmd is not None:
            extras.qmd.request_update()

    def _schedule_refresh(self, runtime: WorkspaceRuntime, paths: set[Path] | None) -> None:
        extras = self.extra(runtime)
        if paths is None:
            extras.pending_paths.add(Path("*"))
        else:
            extras.pending_paths |= paths
        if extras.refresh_handle is not None:
            extras.refresh_handle.cancel()
        loop = asyncio.get_running_loop()
        extras.refresh_handle = loop.call_later(runtime.settings.search.debounce_seconds,
                                                lambda: loop.create_task(self.refresh_index(runtime)))

    async def refresh_index(self, runtime: WorkspaceRuntime) -> dict | None:
        """Bring the builtin index up to date with what changed (single-flight)."""
        extras = self.extra(runtime)
        if extras.refreshing:
            self._schedule_refresh(runtime, set())
            return None
        paths, extras.pending_paths = extras.pending_paths, set()
        changed = None if Path("*") in paths or not paths else sorted(paths)
        extras.refreshing = True
        try:
            loop = asyncio.get_running_loop()
            extras.last_refresh = await loop.run_in_executor(self.daemon.executor, extras.index.refresh, changed)
        except Exception as exc:  # the index is a cache: a failure is logged, never fatal
            logger.opt(exception=exc).error("workspace {}: index refresh failed: {}", runtime.name, exc)
        finally:
            extras.refreshing = False
        return extras.last_refresh

    async def reindex(self, runtime: WorkspaceRuntime) -> dict:
        """Rebuild the builtin index from scratch (and update QMD)."""
        extras = self.extra(runtime)
        loop = asyncio.get_running_loop()
        stats = await loop.run_in_executor(self.daemon.executor, extras.index.rebuild)
        if extras.qmd is not None and extras.qmd.available:
            await extras.qmd.update_now()
        return stats

    def workspace_ready(self, runtime: WorkspaceRuntime) -> None:
        """After the start-up reconcile: open git, start QMD, write the skill file, first index refresh."""
        loop = asyncio.get_running_loop()
        extras = self.extra(runtime)
        if runtime.sessions_dirs and extras.index.sessions_dir is None:
            extras.index.sessions_dir = runtime.sessions_dirs[0]
        loop.create_task(self._open_workspace(runtime, extras))

    async def _open_workspace(self, runtime: WorkspaceRuntime, extras: WorkspaceExtras) -> None:
        try:
            await extras.git.call(extras.git.open)
        except Exception as exc:
            logger.warning("workspace {}: git store unavailable: {}", runtime.name, exc)
        ensure_skill_file(runtime.settings.path)
        if extras.qmd is not None:
            await extras.qmd.start()
            extras.qmd.request_update()
        self._schedule_refresh(runtime, None)

    # -- recovery and status -----------------------------------------------------------------------------
    def recover(self, runtime: WorkspaceRuntime, run) -> str:
        """Finish or roll back an interrupted run of an upkeep kind."""
        store = self.daemon.store
        if run.kind == "dream":
            return dream.recover_dream_run_sync(run, store=store, git=self.extra(runtime).git)
        if run.kind == "lifecycle":
            lifecycle.restore_lifecycle_run(run, store=store, dry_run=False)
            store.finish_run(run.run_id, state="rolled_back", outcome="rolled_back")
            return "rolled_back"
        # flush writes its note in one atomic replace: the file is whole either way; restore can undo it
        store.finish_run(run.run_id, state="failed", outcome="interrupted")
        return "interrupted"

    def workspace_status(self, runtime: WorkspaceRuntime) -> dict:
        """Upkeep figures for status."""
        extras = self.extras.get(runtime.name)
        if extras is None:
            return {"jobs": self.next_runs(runtime) if self.daemon.queue else {}}
        search = {"backend": runtime.settings.search.backend, "builtin": extras.index.stats(),
                  "last_refresh": extras.last_refresh, "pending_changes": len(extras.pending_paths)}
        if extras.qmd is not None:
            search["qmd"] = extras.qmd.freshness()
        return {"git": extras.git.health(), "jobs": self.next_runs(runtime), "search": search}

    async def close(self) -> None:
        """Release what the extras hold."""
        for extras in self.extras.values():
            if extras.refresh_handle is not None:
                extras.refresh_handle.cancel()
            if extras.qmd is not None:
                await extras.qmd.close()
            extras.index.close()
            extras.git.close()


def ensure_skill_file(workspace: Path) -> bool:
    """Create the memory-search skill when missing; an existing file (maybe edited) is never overwritten."""
    path = workspace / SKILL_PATH
    if path.exists() or path.is_symlink():
        return False
    fsio.atomic_write(path, SKILL_TEXT)
    return True
