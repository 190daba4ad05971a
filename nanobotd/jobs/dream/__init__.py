"""dream: fold new history and daily-note bullets into SOUL.md / USER.md / memory/MEMORY.md with small edits,
committed to git."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanobotd.gitstore.store import CURSOR_FILE
from nanobotd.jobs.dream.apply import recover_dream_run
from nanobotd.jobs.dream.restore import restore_dream
from nanobotd.jobs.dream.run import KIND, DreamRun
from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.job import HISTORY_FILE, Job, QueuePolicy
from nanobotd.state.store import RunRecord

OFFLINE_DREAM = "the dream needs an LLM and this workspace runs offline (llm.model = \"none\")"


class Dream(Job):
    """params: none."""

    kind = KIND
    scheduled = True

    async def run(self, env: JobEnv, run_id: str, params: Mapping[str, Any]) -> dict:
        """Dream the backlog (in batches, within the token budget) for an already created run."""
        dream = DreamRun(env.settings, store=env.store, llm=env.llm, git=env.git, run_id=run_id, clock=env.now,
                         on_stage=lambda stage: env.faults.reach(f"dream.{stage}"))
        return (await dream.run()).manifest

    def recover(self, env: JobEnv, run: RunRecord) -> str:
        """Finish a dream whose commit exists, else roll its file writes back (start-up, before other git work)."""
        return recover_dream_run(run, store=env.store, git=env.git)

    async def restore(self, env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool,
                      dry_run: bool) -> dict:
        """Revert the run's dream commit as a new commit (refused on conflicting later edits unless forced)."""
        return await env.git.call(restore_dream, run, store=env.store, git=env.git,
                                  restore_run_id=restore_run_id, force=force, dry_run=dry_run)

    async def reapply(self, env: JobEnv, original: RunRecord | None, restore_run: RunRecord, *,
                      restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
        """Undo a dream restore: revert the restore's own commit."""
        return await self.restore(env, restore_run, restore_run_id=restore_run_id, force=force, dry_run=dry_run)

    async def restore_commit(self, env: JobEnv, sha: str, *, restore_run_id: str | None, force: bool,
                             dry_run: bool) -> dict:
        """Revert one `dream:` commit by sha, nanobot's own included (like nanobot's `/dream-restore <sha>`)."""
        return await env.git.call(restore_dream, sha, store=env.store, git=env.git,
                                  restore_run_id=restore_run_id, force=force, dry_run=dry_run)

    def queue_policy(self, env: JobEnv, params: Mapping[str, Any]) -> QueuePolicy:
        return QueuePolicy(target=KIND, uses_llm=not env.llm.offline, join_running=True)

    def off_reason(self, env: JobEnv) -> str | None:
        return OFFLINE_DREAM if env.llm.offline else None

    def changes(self, manifest: dict) -> dict:
        compacted = manifest.get("history_compacted") or {}
        removed = int(compacted.get("removed") or 0) if isinstance(compacted, dict) else 0
        files = list(manifest.get("files_changed") or {})
        before, after = manifest.get("cursor_before"), manifest.get("cursor_after")
        moved = isinstance(before, int) and isinstance(after, int) and after != before
        cursor = None
        if moved:  # a dream that read entries with nothing new for the memory files moves only its cursor: say so
            cursor = f"{before} -> {after}" + ("" if files else " only (no memory file changed: the entries read "
                                                                "held nothing new for them)")
        return {"entries_removed": removed, "dream_cursor": cursor,
                "files": files + ([HISTORY_FILE] if removed else []) + ([CURSOR_FILE] if moved else []),
                "commits": [manifest.get("commit")]}
