"""consolidate: archive a session's unarchived messages into memory/history.jsonl (summary or [RAW])."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanobotd.jobs.consolidate.archive import (
    chunk_cursors,
    consolidate_session,
    finish_restore_step,
    reapply_consolidation,
    recover_consolidation,
    restore_consolidation,
)
from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.job import HISTORY_FILE, Job, QueuePolicy
from nanobotd.state.store import RunRecord

KIND = "consolidate"
NARROW_REASONS = ("budget",)  # a budget run archives only down to its target; any other reason, everything


class Consolidate(Job):
    """params: session_key, reason (budget, idle, manual, rescue, mend), vanished_only (only messages that left
    the session file: beside an agent that archives the rest itself)."""

    kind = KIND
    trigger_key = "reason"
    recovers_failures = True
    reads_unread = True  # without an LLM, archiving as it reads (asread)

    async def run(self, env: JobEnv, run_id: str, params: Mapping[str, Any]) -> dict:
        return await consolidate_session(env, params["session_key"], run_id, reason=params["reason"],
                                         vanished_only=params.get("vanished_only", False))

    def recover(self, env: JobEnv, run: RunRecord) -> str:
        """Finish or roll back each chunk a crash interrupted (the write-ahead journal says which)."""
        return recover_consolidation(env, run)

    async def restore(self, env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool,
                      dry_run: bool) -> dict:
        """Remove the entries the run wrote and put its messages back in the spool."""
        return restore_consolidation(env, run, restore_run_id=restore_run_id, dry_run=dry_run)

    async def reapply(self, env: JobEnv, original: RunRecord | None, restore_run: RunRecord, *,
                      restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
        """Its entries go back, its messages count as archived again."""
        return reapply_consolidation(env, original, restore_run, restore_run_id=restore_run_id, dry_run=dry_run)

    def finish_restore(self, env: JobEnv, step: dict) -> dict:
        return finish_restore_step(env, step)

    def queue_policy(self, env: JobEnv, params: Mapping[str, Any]) -> QueuePolicy:
        key = params["session_key"]
        return QueuePolicy(target=f"session:{key}", session_key=key, uses_llm=not env.llm.offline,
                           manifest={"session": key, "reason": params["reason"]},
                           scope=0 if params["reason"] in NARROW_REASONS else 1)

    def changes(self, manifest: dict) -> dict:
        done = [chunk for chunk in manifest.get("chunks") or [] if isinstance(chunk, dict) and chunk.get("done")]
        # a running consolidation journals no `cursors` (its chunks hold them: state.runsteps)
        entries = len((manifest.get("cursors") if "cursors" in manifest else chunk_cursors(manifest)) or [])
        return {"entries_added": entries, "messages_archived": sum(int(chunk.get("count") or 0) for chunk in done),
                "files": [HISTORY_FILE] if entries else []}
