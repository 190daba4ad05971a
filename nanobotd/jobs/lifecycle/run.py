"""The nightly lifecycle run: age daily notes into the archive, expire old archived notes into history, compact
history.jsonl, prune backups past the restore window; journalled before each step, so a crash is undone (undo.py)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from loguru import logger

from nanobotd import fsio
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.jobs.compaction import compact_history
from nanobotd.jobs.env import end_run, note_progress
from nanobotd.jobs.errors import EXPIRED
from nanobotd.jobs.lifecycle.plan import plan_lifecycle
from nanobotd.jobs.lifecycle.summary import summarise_notes
from nanobotd.jobs.planlines import describe_step
from nanobotd.llm.client import LLMClient
from nanobotd.llm.reply import UsageMeter
from nanobotd.memory import history
from nanobotd.state.store import StateStore

LIFECYCLE_KIND = "lifecycle"
NOTES_BACKUP_DIR = "notes"


async def run_lifecycle(ws: WorkspaceSettings, *, store: StateStore, llm: LLMClient, run_id: str,
                        now: datetime, dry_run: bool = False,
                        on_step: Callable[[str], None] | None = None) -> dict:
    """Plan and (unless *dry_run*) execute the lifecycle; returns the manifest, whose "executed" is the dry run's "plan"
    once all succeed. *on_step* gets each action after it ran, before the journal says so (`lifecycle.<action>`)."""
    plan, skipped = plan_lifecycle(ws, store=store, now=now, run_id=run_id)
    manifest = {"workspace": ws.name, "workspace_path": str(ws.path), "now": now.isoformat(timespec="seconds"),
                "dry_run": dry_run, "plan": plan, "skipped": skipped}
    if dry_run:
        return manifest
    manifest.update(executed=[], pending=None, backups={}, history_added=[], history_removed=None, pruned=[],
                    summary=None, created_archive_dir=False, tokens={})
    meter = UsageMeter()
    executor = _StepExecutor(ws, store, llm, run_id, now, manifest, meter)
    try:
        for index, step in enumerate(plan):
            manifest["pending"] = index
            note_progress(manifest, describe_step(step), index, len(plan))
            store.journal(run_id, manifest)
            await executor.execute(step)
            if on_step is not None:
                on_step(step["action"])
            manifest["executed"].append(step)
            manifest["pending"] = None
    except Exception as exc:  # a step failed: report it, keep what is done (restorable), carry on living
        logger.exception("lifecycle of {} failed at step {}", ws.name, manifest["pending"])
        manifest["error"] = f"{type(exc).__name__}: {exc}"
        return end_run(store, LIFECYCLE_KIND, ws.name, run_id, manifest, "error", manifest["error"], meter=meter)
    return end_run(store, LIFECYCLE_KIND, ws.name, run_id, manifest, *_outcome(manifest), meter=meter)


def _outcome(manifest: dict) -> tuple[str, str]:
    if not manifest["executed"]:
        return "no_change", "nothing to do"
    summary = manifest.get("summary") or {}
    if summary.get("raw_notes"):
        return "raw_fallback", summary.get("reason", "")
    return "written", ""


def move_note(source: Path, target: Path, workspace: Path) -> None:
    """Rename a note inside *workspace* and make both folders' entries durable (a lifecycle step and its undo)."""
    os.rename(fsio.confine(source, workspace), fsio.confine(target, workspace))
    fsio.fsync_dir(target.parent)
    fsio.fsync_dir(source.parent)


class _StepExecutor:
    """Executes one planned step at a time, journaling what it is about to change first."""

    def __init__(self, ws: WorkspaceSettings, store: StateStore, llm: LLMClient, run_id: str, now: datetime,
                 manifest: dict, meter: UsageMeter):
        self.ws, self.store, self.llm, self.run_id, self.now = ws, store, llm, run_id, now
        self.manifest, self.meter = manifest, meter
        self.memory_dir = ws.path / "memory"

    async def execute(self, step: dict) -> None:
        """Run one step of the plan."""
        action = step["action"]
        if action == "summarise":
            await self.summarise(step)
        else:
            getattr(self, action)(step)

    def move(self, step: dict) -> None:
        """Move a note into the archive (a rename needs no backup: the manifest says where it went)."""
        source = fsio.confine(self.ws.path / step["from"], self.ws.path)
        target = fsio.confine(self.ws.path / step["to"], self.ws.path)
        if not source.is_file() or target.exists() or target.is_symlink():
            raise RuntimeError(f"cannot move {step['from']} to {step['to']}: the files changed since planning")
        if not target.parent.exists():
            self.manifest["created_archive_dir"] = True
            self.store.journal(self.run_id, self.manifest)
            target.parent.mkdir(mode=0o755)
            fsio.fsync_dir(target.parent.parent)
        move_note(source, target, self.ws.path)

    async def summarise(self, step: dict) -> None:
        """Write the expiring notes into history, journaling the cursors before the append."""
        notes = [(path, (self.ws.path / path).read_bytes()) for path in step["notes"]]
        contents, summary = await summarise_notes(notes, llm=self.llm, meter=self.meter,
                                                  raw_max_chars=self.ws.consolidation.raw_max_chars)
        self.manifest["summary"] = summary

        def journal_cursors(cursors: list[int]) -> None:
            """Record the cursors, and the entries' hashes, before any byte is appended."""
            self.manifest["history_added"] = cursors
            self.manifest["history_added_hashes"] = sorted({history.content_hash(content) for content in contents})
            self.store.journal(self.run_id, self.manifest)

        written = history.append_entries(self.memory_dir, [(content, None) for content in contents], self.now,
                                         before_write=journal_cursors)
        self.manifest["history_added"] = [entry.cursor for entry in written]

    def delete(self, step: dict) -> None:
        """Delete an expired note after copying it into the run folder."""
        path = fsio.confine(self.ws.path / step["path"], self.ws.path)
        data = path.read_bytes()
        backup = self.store.run_dir(self.run_id) / NOTES_BACKUP_DIR / Path(step["path"]).name
        fsio.atomic_write(backup, data, mode=0o600)
        self.manifest["backups"][step["path"]] = {"backup": str(backup), "mode": path.stat().st_mode & 0o7777,
                                                  "bytes": len(data)}
        self.store.journal(self.run_id, self.manifest)
        path.unlink()
        fsio.fsync_dir(path.parent)

    def compact_history(self, step: dict) -> None:
        """Remove the planned, already dreamt entries, saving them in the run folder first."""

        def journal_removal(removal: dict) -> None:
            self.manifest["history_removed"] = removal
            self.store.journal(self.run_id, self.manifest)

        compact_history(self.memory_dir, self.store.run_dir(self.run_id), step["cursors"], journal_removal)

    def prune_backups(self, step: dict) -> None:
        """Delete an old run's backup folder, marking that run expired first."""
        target = self.store.get_run(step["run_id"])
        self.manifest["pruned"].append({"run_id": step["run_id"], "path": step["path"], "bytes": step["bytes"]})
        self.store.journal(self.run_id, self.manifest)
        if target is not None:
            self.store.journal(target.run_id, {**target.manifest, EXPIRED: True, "expired_by": self.run_id})
        shutil.rmtree(step["path"], ignore_errors=True)
