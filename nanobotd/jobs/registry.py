"""The job registry: every kind of run and the module that runs, recovers and restores it.

Dispatch by kind is written here once; the daemon reads it, and restore receives it through
`JobEnv.kinds`. Each job module exposes `KIND`, `run(env, run_id, ...)`, `recover(env, run)` and
`restore(env, run, *, restore_run_id, force, dry_run)`.
"""

from __future__ import annotations

from types import ModuleType

from nanobotd.jobs import consolidate, dream, flush, lifecycle, restore

JOB_KINDS: dict[str, ModuleType] = {job.KIND: job for job in (consolidate, flush, dream, lifecycle, restore)}
SCHEDULED_KINDS = (dream.KIND, lifecycle.KIND)  # cron jobs, caught up after downtime


def job_kind(kind: str) -> ModuleType:
    """The module of job *kind*; KeyError naming the known kinds otherwise."""
    try:
        return JOB_KINDS[kind]
    except KeyError:
        raise KeyError(f"unknown job kind {kind!r} (known: {', '.join(JOB_KINDS)})") from None
