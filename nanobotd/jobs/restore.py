"""Restore: undo exactly what one run changed, as a new forward change (itself a run).

A run id names a run of any kind; a hex string names a dream commit (like nanobot's
`/dream-restore <sha>`). Restoring a restore re-applies what it undid.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nanobotd.memory import history
from nanobotd.gitstore.store import GitStore
from nanobotd.jobs.consolidate import archive as consolidate
from nanobotd.jobs.dream import run as dream
from nanobotd.jobs.lifecycle import run as lifecycle
from nanobotd.jobs.common import JobContext
from nanobotd.jobs.flush import restore_flush_run
from nanobotd.state.store import RunRecord

SHA = re.compile(r"^[0-9a-f]{4,40}$")
RESTORABLE = ("consolidate", "flush", "dream", "lifecycle", "restore")


class RestoreError(ValueError):
    """The target cannot be restored; the message says why and what to do."""


@dataclass
class RestoreContext:
    """One workspace's job context, git store, state dir and clock."""

    job: JobContext
    git: GitStore
    state_dir: Path
    clock: Callable[[], float] = time.time

    @property
    def store(self):
        return self.job.store


def resolve_target(ctx: RestoreContext, target: str) -> RunRecord | None:
    """The run named by *target*, None when *target* is a commit sha; RestoreError when unknown/expired."""
    run = ctx.store.get_run(target)
    if run is None:
        if SHA.match(target.lower()):
            return None
        raise RestoreError(f"no run or dream commit named {target!r} (see `nanobotctl runs`)")
    if run.workspace != ctx.job.workspace.name:
        raise RestoreError(f"run {target} belongs to workspace {run.workspace}; pass --workspace {run.workspace}")
    if run.kind not in RESTORABLE:
        raise RestoreError(f"runs of kind {run.kind!r} change nothing that could be restored")
    if run.state in ("queued", "started"):
        raise RestoreError(f"run {target} is still {run.state}; wait for it to finish")
    window = ctx.job.workspace.lifecycle.restore_window_days * 86400
    if run.manifest.get("expired") or (run.finished_at and ctx.clock() - run.finished_at > window):
        raise RestoreError(f"run {target} is older than the restore window "
                           f"({ctx.job.workspace.lifecycle.restore_window_days} days); its backups are gone")
    if run.manifest.get("restored_by"):
        raise RestoreError(f"run {target} was already restored by {run.manifest['restored_by']}; "
                           f"restore that run to re-apply it")
    return run


async def plan_restore(ctx: RestoreContext, target: str, *, force: bool) -> dict:
    """The exact plan of a restore, changing nothing."""
    return await _dispatch(ctx, target, restore_run_id=None, force=force, dry_run=True)


async def restore_target(ctx: RestoreContext, target: str, *, restore_run_id: str, force: bool) -> dict:
    """Undo *target* as run *restore_run_id*; the manifest records what was done."""
    store = ctx.store
    try:
        result = await _dispatch(ctx, target, restore_run_id=restore_run_id, force=force, dry_run=False)
    except (RestoreError, dream.DreamError, lifecycle.RestoreRefused) as exc:
        manifest = {"target": target, "force": force, "error": str(exc)}
        store.finish_run(restore_run_id, state="failed", outcome="refused", manifest=manifest)
        return manifest
    manifest = {"target": target, "target_kind": result.get("kind"), "force": force, **result}
    target_run = store.get_run(target)
    if target_run is not None:
        store.journal(target, dict(target_run.manifest, restored_by=restore_run_id))
        store.record_outcome(target_run.kind, ctx.job.workspace.name, "restored", run_id=restore_run_id)
    store.finish_run(restore_run_id, state="finished", outcome="restored", manifest=manifest)
    return manifest


async def _dispatch(ctx: RestoreContext, target: str, *, restore_run_id: str | None, force: bool,
                    dry_run: bool) -> dict:
    run = resolve_target(ctx, target)
    if run is None:
        result = await ctx.git.call(dream.restore_dream_commit, target, store=ctx.store, git=ctx.git,
                                    restore_run_id=restore_run_id, force=force, dry_run=dry_run)
        return dict(result, kind="dream")
    kind = run.kind
    if kind == "consolidate":
        result = consolidate.restore_consolidation(ctx.job, run, dry_run=dry_run)
    elif kind == "flush":
        result = restore_flush_run(run, store=ctx.store, dry_run=dry_run)
    elif kind == "lifecycle":
        result = lifecycle.restore_lifecycle_run(run, store=ctx.store, dry_run=dry_run)
    elif kind == "dream":
        result = await ctx.git.call(dream.restore_dream_run, run, store=ctx.store, git=ctx.git,
                                    restore_run_id=restore_run_id, force=force, dry_run=dry_run)
    else:
        result = await reapply(ctx, run, restore_run_id=restore_run_id, force=force, dry_run=dry_run)
    return dict(result, kind=kind)


async def reapply(ctx: RestoreContext, restore_run: RunRecord, *, restore_run_id: str | None, force: bool,
                  dry_run: bool) -> dict:
    """Restore of a restore: put back what that restore undid."""
    original = ctx.store.get_run(restore_run.manifest.get("target", ""))
    kind = restore_run.manifest.get("target_kind")
    if kind == "dream":
        result = await ctx.git.call(dream.restore_dream_run, restore_run, store=ctx.store, git=ctx.git,
                                    restore_run_id=restore_run_id, force=force, dry_run=dry_run)
    elif kind == "consolidate" and original is not None:
        result = reapply_consolidation(ctx, original, restore_run, dry_run=dry_run)
    else:
        raise RestoreError(f"re-applying a {kind} run is not supported; run the job again instead")
    if not dry_run and original is not None:
        ctx.store.journal(original.run_id, {k: v for k, v in original.manifest.items() if k != "restored_by"})
    return result


def reapply_consolidation(ctx: RestoreContext, original: RunRecord, restore_run: RunRecord, *, dry_run: bool) -> dict:
    """Put the entries a consolidation restore removed back and mark their messages archived again."""
    entries = [history.parse_entry(json.dumps(record))
               for record in restore_run.manifest.get("removed_entries", [])]
    entries = [entry for entry in entries if entry is not None]
    digests = []
    for chunk in original.manifest.get("chunks", []):
        if chunk.get("done"):
            digests.extend(digest for digest, _, _ in consolidate.read_chunk_backup(Path(chunk["backup"])))
    plan = [f"re-insert history entries with cursors {[entry.cursor for entry in entries]}",
            f"mark {len(digests)} messages of {original.session_key} archived again"]
    if dry_run:
        return {"plan": plan}
    history.insert_entries(ctx.job.memory_dir, entries)
    ctx.job.tracker.mark_archived(original.session_key, digests, original.run_id)
    return {"plan": plan, "reinserted": len(entries)}
