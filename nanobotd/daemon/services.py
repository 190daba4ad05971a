"""The daemon's operations: reconcile, triggers, job submission, crash recovery, scheduling.

Control handlers (control.py) and the tick loop call these; the jobs themselves live in jobs/.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

from nanobotd.memory import history
from nanobotd.jobs.consolidate import archive as consolidate
from nanobotd.jobs.flush import flush_session
from nanobotd.daemon.workspace import WorkspaceRuntime
from nanobotd.daemon.upkeep import Upkeep

if TYPE_CHECKING:
    from nanobotd.daemon.daemon import Daemon


class Services:
    """What the daemon can do, on its loop."""

    def __init__(self, daemon: "Daemon"):
        self.daemon = daemon
        self.upkeep = Upkeep(daemon)

    # -- wiring --------------------------------------------------------------------------------------
    def schedule_jobs(self) -> None:
        """Cron jobs per workspace (dream, lifecycle) and the catch-up of missed runs."""
        self.upkeep.schedule_jobs()

    async def close(self) -> None:
        """Release what the extras hold (QMD child, git thread, indexes)."""
        await self.upkeep.close()

    def runtime(self, name: str | None) -> WorkspaceRuntime:
        """The named workspace, or the only one; KeyError with a clear message otherwise."""
        runtimes = self.daemon.runtimes
        if name:
            if name in runtimes:
                return runtimes[name]
            for runtime in runtimes.values():
                if str(runtime.settings.path) == name:
                    return runtime
            raise KeyError(f"no workspace named {name!r} (known: {', '.join(runtimes)})")
        if len(runtimes) == 1:
            return next(iter(runtimes.values()))
        raise KeyError(f"several workspaces are managed; name one with --workspace ({', '.join(runtimes)})")

    def find_session(self, key: str, workspace: str | None) -> WorkspaceRuntime:
        """The workspace holding session *key*."""
        if workspace:
            runtime = self.runtime(workspace)
            if key in runtime.tracker.sessions:
                return runtime
            raise KeyError(f"no session {key!r} in workspace {runtime.name}")
        for runtime in self.daemon.runtimes.values():
            if key in runtime.tracker.sessions:
                return runtime
        raise KeyError(f"no session {key!r}")

    # -- scanning and triggers -------------------------------------------------------------------------
    async def scan_and_trigger(self, runtime: WorkspaceRuntime, path: Path) -> None:
        """A watched file changed: scan it off the loop, then start what its counters call for."""
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self.daemon.executor, runtime.scan_path, path)
        if result is not None and result.changed:
            self.trigger(runtime, result.key, vanished=result.vanished)
            self.upkeep.session_changed(runtime, path)

    async def reconcile_all(self, *, startup: bool = False) -> None:
        """Scan every workspace (catches missed events, overflow, recreated folders)."""
        loop = asyncio.get_running_loop()
        for runtime in list(self.daemon.runtimes.values()):
            if not runtime.exists:
                logger.debug("workspace {} does not exist yet; waiting for it", runtime.settings.path)
                continue
            results = await loop.run_in_executor(self.daemon.executor, runtime.reconcile)
            watcher = self.daemon.watcher
            if watcher is not None:
                for folder in runtime.sessions_dirs:
                    watcher.watch(folder)
            if startup:
                unchanged = [result.key for result in results if not result.changed]
                counts = await loop.run_in_executor(
                    self.daemon.executor, lambda: {key: runtime.tracker.vanished_count(key) for key in unchanged})
            for result in results:
                if result.changed:
                    self.trigger(runtime, result.key, vanished=result.vanished)
                elif startup:
                    self.trigger(runtime, result.key, vanished=counts.get(result.key, 0))
            if startup and self.daemon.store.rebuilt:
                await loop.run_in_executor(self.daemon.executor, self._rebuild_archive_marks, runtime)
            if startup:
                self.upkeep.workspace_ready(runtime)

    @staticmethod
    def _rebuild_archive_marks(runtime: WorkspaceRuntime) -> None:
        """The state DB was lost: nanobotd's own history entries say which messages it archived."""
        spans: dict[str, list[dict]] = {}
        for entry in history.read_history(runtime.context.memory_dir).entries:
            if entry.span and entry.session_key:
                spans.setdefault(entry.session_key, []).append(entry.span)
        marked = sum(runtime.tracker.apply_history_spans(key, key_spans) for key, key_spans in spans.items())
        if marked:
            logger.warning("workspace {}: rebuilt {} archive marks from history.jsonl", runtime.name, marked)

    def trigger(self, runtime: WorkspaceRuntime, key: str, *, vanished: int = 0) -> None:
        """Submit the jobs a session needs now (coalesced by the queue)."""
        queue = self.daemon.queue
        if queue is None or not queue.accepting:
            return
        for kind, reason in runtime.due_jobs(key, vanished):
            if kind == "flush":
                self.submit_flush(runtime, key)
            else:
                self.submit_consolidate(runtime, key, reason=reason)

    def trigger_idle(self) -> None:
        """Archive sessions that have been quiet for idle_minutes."""
        now = self.daemon.clock()
        for runtime in self.daemon.runtimes.values():
            for key in runtime.idle_sessions(now):
                if not self.daemon.queue.busy(runtime.name, f"session:{key}"):
                    self.submit_consolidate(runtime, key, reason="idle")

    # -- jobs ------------------------------------------------------------------------------------------
    def submit_consolidate(self, runtime: WorkspaceRuntime, key: str, *, reason: str) -> str:
        """Queue a consolidation of session *key*; returns its run_id."""
        async def body(run_id: str) -> None:
            await consolidate.consolidate_session(runtime.context, key, run_id, reason=reason)
            self.upkeep.memory_changed(runtime)
            self.trigger(runtime, key)

        return self.daemon.queue.submit("consolidate", runtime.name, f"session:{key}", body, session_key=key,
                                        uses_llm=not runtime.llm.offline, manifest={"session": key, "reason": reason})

    def submit_flush(self, runtime: WorkspaceRuntime, key: str) -> str:
        """Queue a pre-compaction memory flush of session *key*."""
        async def body(run_id: str) -> None:
            context = runtime.context
            messages = [message for _, message, present in runtime.tracker.pending(key) if present]
            await flush_session(context.workspace, messages, session_key=key, llm=context.llm, store=context.store,
                                run_id=run_id, now=context.now())
            runtime.tracker.set_cycle(key, flushed=True)
            self.upkeep.memory_changed(runtime)

        return self.daemon.queue.submit("flush", runtime.name, f"session:{key}", body, session_key=key,
                                        manifest={"session": key})

    # -- crash recovery --------------------------------------------------------------------------------
    def recover_interrupted_runs(self) -> None:
        """Finish or roll back every run a crash left open; queued runs never started and are cancelled."""
        for run in self.daemon.store.list_runs(states=("queued", "started"), limit=100000):
            runtime = self.daemon.runtimes.get(run.workspace)
            if run.state == "queued" or runtime is None:
                self.daemon.store.finish_run(run.run_id, state="cancelled", outcome="cancelled")
                continue
            try:
                outcome = self._recover(runtime, run)
            except Exception as exc:
                logger.opt(exception=exc).error("recovery of run {} failed: {}", run.run_id, exc)
                self.daemon.store.finish_run(run.run_id, state="failed", outcome="recovery_failed")
                continue
            logger.warning("run {} ({}) was interrupted; recovery: {}", run.run_id, run.kind, outcome)

    def _recover(self, runtime: WorkspaceRuntime, run) -> str:
        if run.kind == "consolidate":
            return consolidate.recover_consolidation(runtime.context, run)
        return self.upkeep.recover(runtime, run)

    def status_line(self) -> str:
        """Short ASCII summary for STATUS=."""
        sessions = sum(len(runtime.tracker.sessions) for runtime in self.daemon.runtimes.values())
        tokens = sum(runtime.tracker.totals()["unarchived_tokens"] for runtime in self.daemon.runtimes.values())
        return f"{len(self.daemon.runtimes)} workspace(s), {sessions} session(s), {tokens} unarchived tokens"

