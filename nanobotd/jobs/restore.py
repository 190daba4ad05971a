"""restore: undo exactly what one run changed, as a new forward change (itself a run); restoring a restore re-applies. A
run id names a run of any kind, a hex string a dream commit; other kinds are reached by `JobEnv.kinds`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from nanobotd.gitstore.repo import DREAM_PREFIX, GitStoreError
from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.errors import EXPIRED, RestoreError, RestoreRefused, UnknownRun
from nanobotd.jobs.job import HISTORY_FILE, Job, QueuePolicy
from nanobotd.jobs.runfiles import RESTORE_STEP_KEY
from nanobotd.state.store import RunRecord

KIND = "restore"
SHA = re.compile(r"^[0-9a-f]{4,40}$")
DREAM_KIND = "dream"  # the kind whose commits a sha names
REFUSALS = (RestoreError, RestoreRefused, GitStoreError)  # a restore that cannot go ahead (409)


async def validate(env: JobEnv, target: str) -> None:
    """Refuse, before anything is queued, a target that names nothing restorable: UnknownRun for a name
    that is neither a run nor a commit, RestoreError for one that cannot be restored."""
    if resolve_target(env, target) is not None or env.git is None:
        return
    try:
        commit = await env.git.call(env.git.show, target)
    except GitStoreError:
        raise UnknownRun(f"no run or dream commit named {target!r} (see `nanobotctl runs`)") from None
    if not commit["message"].startswith(DREAM_PREFIX):
        raise RestoreError(f"commit {target} is not a dream: commit; only dream commits are restored by sha")


def resolve_target(env: JobEnv, target: str) -> RunRecord | None:
    """The run named by *target*, None when *target* is a commit sha; RestoreError when unknown/expired."""
    run = env.store.get_run(target)
    if run is None:
        if SHA.match(target.lower()):
            return None
        raise UnknownRun(f"no run or dream commit named {target!r} (see `nanobotctl runs`)")
    if run.workspace != env.settings.name:
        raise RestoreError(f"run {target} belongs to workspace {run.workspace}; pass --workspace {run.workspace}")
    if run.kind not in env.kinds or not env.kinds[run.kind].restorable:
        raise RestoreError(f"runs of kind {run.kind!r} change nothing that could be restored")
    if run.state in ("queued", "started"):
        raise RestoreError(f"run {target} is still {run.state}; wait for it to finish")
    window_days = env.settings.lifecycle.restore_window_days
    if run.manifest.get(EXPIRED) or (run.finished_at and env.clock() - run.finished_at > window_days * 86400):
        raise RestoreError(f"run {target} is older than the restore window ({window_days} days); its backups are gone")
    if run.manifest.get("restored_by"):
        raise RestoreError(f"run {target} was already restored by {run.manifest['restored_by']}; "
                           f"restore that run to re-apply it")
    return run


async def plan(env: JobEnv, target: str, *, force: bool) -> dict:
    """The exact plan of a restore, changing nothing."""
    return await _dispatch(env, target, restore_run_id=None, force=force, dry_run=True)


def _finish(env: JobEnv, run_id: str, target: str, force: bool, result: dict) -> dict:
    """Close the restore *run_id* of *target*: the target says it was restored by it (a restore of a restore
    clears that mark from the run it re-applied)."""
    store = env.store
    manifest = {"target": target, "target_kind": result.get("kind"), "force": force, **result}
    target_run = store.get_run(target)
    if target_run is not None:
        if target_run.kind == KIND and (original := store.get_run(target_run.manifest.get("target", ""))):
            store.journal(original.run_id, {k: v for k, v in original.manifest.items() if k != "restored_by"})
        store.journal(target, dict(target_run.manifest, restored_by=run_id))
        store.record_outcome(target_run.kind, env.settings.name, "restored", run_id=run_id)
    store.finish_run(run_id, state="finished", outcome="restored", manifest=manifest)
    return manifest


async def _dispatch(env: JobEnv, target: str, *, restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
    run = resolve_target(env, target)
    if run is None:
        result = await env.kinds[DREAM_KIND].restore_commit(env, target, restore_run_id=restore_run_id, force=force,
                                                            dry_run=dry_run)
        return dict(result, kind=DREAM_KIND)
    result = await env.kinds[run.kind].restore(env, run, restore_run_id=restore_run_id, force=force, dry_run=dry_run)
    return dict(result, kind=run.kind)


class Restore(Job):
    """params: target (a run id, or a dream commit's sha), force."""

    kind = KIND

    async def run(self, env: JobEnv, run_id: str, params: Mapping[str, Any]) -> dict:
        """Undo the target as run *run_id*; the manifest records what was done (or why it was refused)."""
        target, force = params["target"], params["force"]
        try:
            result = await _dispatch(env, target, restore_run_id=run_id, force=force, dry_run=False)
        except REFUSALS as exc:
            manifest = {"target": target, "force": force, "error": str(exc)}
            env.store.finish_run(run_id, state="failed", outcome="refused", manifest=manifest)
            return manifest
        return _finish(env, run_id, target, force, result)

    def recover(self, env: JobEnv, run: RunRecord) -> str:
        """A restore whose step was journalled is finished (the step is taken again to its end: history and the
        spool never stay half changed); one interrupted before that changed nothing and is reported."""
        step = run.manifest.get(RESTORE_STEP_KEY)
        job = env.kinds.get(step.get("kind")) if isinstance(step, dict) else None
        result = job.finish_restore(env, step) if job is not None else None
        if result is None:
            return super().recover(env, run)
        target = run.manifest.get("target", "")
        target_run = env.store.get_run(target)
        kind = target_run.kind if target_run is not None else step.get("kind")
        _finish(env, run.run_id, target, bool(run.manifest.get("force")), dict(result, kind=kind, recovered=True))
        return "recovered"

    async def restore(self, env: JobEnv, restore_run: RunRecord, *, restore_run_id: str | None, force: bool,
                      dry_run: bool) -> dict:
        """Restore of a restore: put back what that restore undid."""
        original = env.store.get_run(restore_run.manifest.get("target", ""))
        kind = restore_run.manifest.get("target_kind")
        job = env.kinds.get(kind)
        if job is None or (original is None and kind != DREAM_KIND):
            raise RestoreError(f"re-applying a {kind} run is not supported; run the job again instead")
        return await job.reapply(env, original, restore_run, restore_run_id=restore_run_id, force=force,
                                 dry_run=dry_run)

    def queue_policy(self, env: JobEnv, params: Mapping[str, Any]) -> QueuePolicy:
        return QueuePolicy(target=f"restore:{params['target']}",
                           manifest={"target": params["target"], "force": params["force"]})

    def changes(self, manifest: dict) -> dict:
        removed = len(manifest.get("removed_entries") or [])
        restored = manifest.get("history_restored")
        added = int(manifest.get("reinserted") or 0) + (len(restored) if isinstance(restored, list)
                                                         else int(restored or 0))
        return {"entries_added": added, "entries_removed": removed,
                "messages_unarchived": int(manifest.get("messages") or 0),
                "files": list(manifest.get("files") or []) + ([HISTORY_FILE] if added or removed else []),
                "commits": [manifest.get("commit")]}
