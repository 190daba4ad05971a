"""dream: fold new history and daily-note bullets into SOUL.md / USER.md / memory/MEMORY.md with small edits,
committed to git."""

from __future__ import annotations

from nanobotd.jobs.common import JobEnv
from nanobotd.jobs.dream.recover import recover_dream_run
from nanobotd.jobs.dream.restore import restore_dream_commit, restore_dream_run
from nanobotd.jobs.dream.run import KIND, dream_workspace
from nanobotd.state.store import RunRecord

__all__ = ["KIND", "recover", "reapply", "restore", "restore_commit", "run"]


async def run(env: JobEnv, run_id: str) -> dict:
    """Dream the backlog (in batches, within the token budget) for an already created run."""
    result = await dream_workspace(env.settings, store=env.store, llm=env.llm, git=env.git, run_id=run_id,
                                   clock=env.now)
    return result.manifest


def recover(env: JobEnv, run: RunRecord) -> str:
    """Finish a dream whose commit exists, else roll its file writes back (start-up, before other git work)."""
    return recover_dream_run(run, store=env.store, git=env.git)


async def restore(env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
    """Revert the run's dream commit as a new commit (refused on conflicting later edits unless forced)."""
    return await env.git.call(restore_dream_run, run, store=env.store, git=env.git, restore_run_id=restore_run_id,
                              force=force, dry_run=dry_run)


async def reapply(env: JobEnv, original: RunRecord | None, restore_run: RunRecord, *, restore_run_id: str | None,
                  force: bool, dry_run: bool) -> dict:
    """Undo a dream restore: revert the restore's own commit."""
    return await restore(env, restore_run, restore_run_id=restore_run_id, force=force, dry_run=dry_run)


async def restore_commit(env: JobEnv, sha: str, *, restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
    """Revert one `dream:` commit by sha, nanobot's own included (like nanobot's `/dream-restore <sha>`)."""
    return await env.git.call(restore_dream_commit, sha, store=env.store, git=env.git,
                              restore_run_id=restore_run_id, force=force, dry_run=dry_run)
