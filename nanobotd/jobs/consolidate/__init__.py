"""consolidate: archive a session's unarchived messages into memory/history.jsonl (summary or [RAW])."""

from __future__ import annotations

from nanobotd.jobs.common import JobEnv
from nanobotd.jobs.consolidate.archive import (
    consolidate_session,
    finish_restore_step,
    reapply_consolidation,
    recover_consolidation,
    restore_consolidation,
)
from nanobotd.state.store import RunRecord

KIND = "consolidate"


async def run(env: JobEnv, run_id: str, *, session_key: str, reason: str, vanished_only: bool = False) -> dict:
    """Archive session *session_key* as run *run_id*; *reason* decides how much (budget, idle, manual, rescue).

    *vanished_only*: only messages that left the session file (companion mode: the agent archives the rest).
    """
    return await consolidate_session(env, session_key, run_id, reason=reason, vanished_only=vanished_only)


def recover(env: JobEnv, run: RunRecord) -> str:
    """Finish or roll back each chunk a crash interrupted (the write-ahead journal says which)."""
    return recover_consolidation(env, run)


async def restore(env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
    """Remove the entries the run wrote and put its messages back in the spool."""
    return restore_consolidation(env, run, restore_run_id=restore_run_id, dry_run=dry_run)


async def reapply(env: JobEnv, original: RunRecord, restore_run: RunRecord, *, restore_run_id: str | None,
                  force: bool, dry_run: bool) -> dict:
    """Undo the restore *restore_run* of *original*: its entries go back, its messages count as archived."""
    return reapply_consolidation(env, original, restore_run, restore_run_id=restore_run_id, dry_run=dry_run)


def finish_restore(env: JobEnv, step: dict) -> dict:
    """Finish a restore step of a consolidation run that a crash interrupted (it was journalled first)."""
    return finish_restore_step(env, step)
