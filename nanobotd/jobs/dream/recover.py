"""Closing a dream run that a crash left "started": finished when its commit exists, else rolled back."""

from __future__ import annotations

from loguru import logger

from nanobotd.gitstore.repo import GitStoreError
from nanobotd.gitstore.store import GitStore
from nanobotd.jobs.dream.apply import leftover_undo_copies
from nanobotd.jobs.dream.restore import roll_back
from nanobotd.state.store import RunRecord, StateStore

KIND = "dream"


def recover_dream_run(run: RunRecord, *, store: StateStore, git: GitStore) -> str:
    """Close a dream run left "started" by a crash: finish it if committed, else roll it back.

    Runs on the calling thread: recovery happens at start-up, before any other git work.
    """
    if not git.opened:
        # Whether the run's commit exists decides between finishing and rolling back.
        git.open()
    manifest = dict(run.manifest)
    stage = manifest.get("stage")
    manifest["recovered"] = True
    if stage == "applying" and git.available:
        try:
            manifest["commit"] = git.find_commit_for_run(run.run_id)
        except GitStoreError as exc:
            logger.warning("could not look for the commit of run {}: {}", run.run_id, exc)
        if manifest.get("commit"):
            stage = "committed"
    if stage in ("committed", "compacting"):
        outcome = "written" if manifest.get("files_changed") else "no_change"
        store.finish_run(run.run_id, state="finished", outcome=outcome, manifest=manifest)
        return "finished"
    for copy in leftover_undo_copies(git.workspace):  # the apply step's own undo copies, of no use now
        copy.unlink(missing_ok=True)
    if stage == "applying":
        manifest["left_alone"] = roll_back(git.workspace, manifest)
        manifest["cursor_after"] = manifest.get("cursor_before")
        store.record_outcome(KIND, run.workspace, "error", run_id=run.run_id, reason="interrupted; rolled back")
        store.finish_run(run.run_id, state="rolled_back", outcome="rolled_back", manifest=manifest)
        return "rolled_back"
    store.record_outcome(KIND, run.workspace, "error", run_id=run.run_id, reason="interrupted")
    store.finish_run(run.run_id, state="failed", outcome="interrupted", manifest=manifest)
    return "failed"
