"""lifecycle: age daily notes into memory/archive/, expire them after the TTL, compact history, prune backups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.job import HISTORY_FILE, Job
from nanobotd.jobs.lifecycle.run import LIFECYCLE_KIND as KIND
from nanobotd.jobs.lifecycle.run import run_lifecycle
from nanobotd.jobs.lifecycle.undo import restore_lifecycle_run
from nanobotd.jobs.planlines import describe_step
from nanobotd.state.store import RunRecord

__all__ = ["KIND", "Lifecycle", "describe_step", "plan"]


async def plan(env: JobEnv) -> dict:
    """What a run would do now (a dry run changes nothing)."""
    return await run_lifecycle(env.settings, store=env.store, llm=env.llm, run_id="dry-run", now=env.now(),
                               dry_run=True)


class Lifecycle(Job):
    """params: none."""

    kind = KIND
    scheduled = True

    async def run(self, env: JobEnv, run_id: str, params: Mapping[str, Any]) -> dict:
        """Execute today's plan as run *run_id*, journalling each step before it changes anything."""
        return await run_lifecycle(env.settings, store=env.store, llm=env.llm, run_id=run_id, now=env.now(),
                                   on_step=lambda action: env.faults.reach(f"lifecycle.{action}"))

    def recover(self, env: JobEnv, run: RunRecord) -> str:
        """An interrupted lifecycle run is rolled back whole: its journal says what each step changed."""
        restore_lifecycle_run(run, store=env.store, dry_run=False)
        env.store.finish_run(run.run_id, state="rolled_back", outcome="rolled_back")
        return "rolled_back"

    async def restore(self, env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool,
                      dry_run: bool) -> dict:
        """Undo every step of the run, newest first, from its backups."""
        return restore_lifecycle_run(run, store=env.store, dry_run=dry_run)

    def changes(self, manifest: dict) -> dict:
        executed = [step for step in manifest.get("executed") or [] if isinstance(step, dict)]
        removed = manifest.get("history_removed") or {}
        added = len(manifest.get("history_added") or [])
        removed_count = int(removed.get("removed") or 0) if isinstance(removed, dict) else 0
        files = [step.get("from") for step in executed if step.get("action") == "move"]
        files += [step.get("path") for step in executed if step.get("action") == "delete"]
        return {"entries_added": added, "entries_removed": removed_count,
                "notes_moved": sum(step.get("action") == "move" for step in executed),
                "notes_deleted": sum(step.get("action") == "delete" for step in executed),
                "backups_pruned": len(manifest.get("pruned") or []),
                "files": files + ([HISTORY_FILE] if added or removed_count else [])}
