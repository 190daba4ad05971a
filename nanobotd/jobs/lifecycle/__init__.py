"""lifecycle: age daily notes into memory/archive/, expire them after the TTL, compact history, prune backups."""

from __future__ import annotations

from nanobotd.jobs.common import JobEnv, describe_step
from nanobotd.jobs.lifecycle.run import LIFECYCLE_KIND as KIND
from nanobotd.jobs.lifecycle.run import run_lifecycle
from nanobotd.jobs.lifecycle.undo import restore_lifecycle_run
from nanobotd.state.store import RunRecord

__all__ = ["KIND", "describe_step", "plan", "recover", "restore", "run"]


async def run(env: JobEnv, run_id: str) -> dict:
    """Execute today's plan as run *run_id*, journalling each step before it changes anything."""
    return await run_lifecycle(env.settings, store=env.store, llm=env.llm, run_id=run_id, now=env.now())


async def plan(env: JobEnv) -> dict:
    """What a run would do now (a dry run changes nothing)."""
    return await run_lifecycle(env.settings, store=env.store, llm=env.llm, run_id="dry-run", now=env.now(),
                               dry_run=True)


def recover(env: JobEnv, run: RunRecord) -> str:
    """An interrupted lifecycle run is rolled back whole: its journal says what each step changed."""
    restore_lifecycle_run(run, store=env.store, dry_run=False)
    env.store.finish_run(run.run_id, state="rolled_back", outcome="rolled_back")
    return "rolled_back"


async def restore(env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
    """Undo every step of the run, newest first, from its backups."""
    return restore_lifecycle_run(run, store=env.store, dry_run=dry_run)
