"""The one interface every job kind answers: how it runs, recovers, restores, re-applies, queues and reads. The daemon
holds only `Job` objects (jobs/registry.py) and asks them; nothing outside jobs/ branches on a kind."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.errors import RestoreError
from nanobotd.state.store import RunRecord

HISTORY_FILE = "memory/history.jsonl"  # as a run's changes name it


@dataclass(frozen=True)
class QueuePolicy:
    """How the queue treats a run: what it excludes (one run per target), whether it needs an LLM slot or joins a
    running one, its queued manifest, and its *scope* (a queued run is not joined by one that must do more)."""

    target: str
    uses_llm: bool = False
    session_key: str | None = None
    manifest: dict | None = None
    scope: int = 0
    join_running: bool = False


class Job:
    """A job kind: each kind subclasses this and overrides what it does differently from these defaults."""

    kind: ClassVar[str] = ""
    scheduled: ClassVar[bool] = False  # a cron job, caught up after downtime
    restorable: ClassVar[bool] = True  # its runs change what a restore can undo
    writes_memory: ClassVar[bool] = True  # the indexes refresh after each run
    # a run an exception left open is recovered as after a crash: its journal may hold appends not yet marked
    recovers_failures: ClassVar[bool] = False
    refresh_waits: ClassVar[bool] = True  # an index refresh waits for its end (it rewrites memory all along)
    reads_unread: ClassVar[bool] = False  # reads its session itself when it is held unread (off the event loop)
    trigger_key: ClassVar[str | None] = None  # the manifest key saying why it ran, shown as the run's trigger

    async def run(self, env: JobEnv, run_id: str, params: Mapping[str, Any]) -> dict:
        """Do the work as run *run_id* (created queued in the ledger); returns its manifest."""
        raise NotImplementedError

    def recover(self, env: JobEnv, run: RunRecord) -> str:
        """Finish or roll back a run a crash interrupted; returns the outcome. By default the run leaves every file
        whole whenever it stops, so an interrupted one is only reported."""
        env.store.finish_run(run.run_id, state="failed", outcome="interrupted")
        return "interrupted"

    async def restore(self, env: JobEnv, run: RunRecord, *, restore_run_id: str | None, force: bool,
                      dry_run: bool) -> dict:
        """Undo what *run* changed (its plan only, with *dry_run*)."""
        raise RestoreError(f"runs of kind {self.kind!r} change nothing that could be restored")

    async def reapply(self, env: JobEnv, original: RunRecord | None, restore_run: RunRecord, *,
                      restore_run_id: str | None, force: bool, dry_run: bool) -> dict:
        """Undo the restore *restore_run* of *original*."""
        raise RestoreError(f"re-applying a {self.kind} run is not supported; run the job again instead")

    def finish_restore(self, env: JobEnv, step: dict) -> dict | None:
        """Finish a journalled restore step a crash cut short; None when the kind journals none."""
        return None

    def queue_policy(self, env: JobEnv, params: Mapping[str, Any]) -> QueuePolicy:
        """How the queue treats a run of this kind with *params*."""
        return QueuePolicy(target=self.kind, join_running=True)

    def off_reason(self, env: JobEnv) -> str | None:
        """Why the job cannot run in this workspace (it is then never scheduled), or None."""
        return None

    def changes(self, manifest: dict) -> dict:
        """What a run changed, read from its manifest: counts, "files", "commits" (runview shows them)."""
        return {}
