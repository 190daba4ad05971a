"""Undoing a lifecycle run from its manifest and backups, newest step first; a run interrupted mid-step is undone the
same way, as each undo is harmless for a step that never ran."""

from __future__ import annotations

from pathlib import Path

from nanobotd import fsio
from nanobotd.jobs.compaction import compacted_entries_missing
from nanobotd.jobs.errors import RestoreRefused
from nanobotd.jobs.lifecycle.run import move_note
from nanobotd.memory import history
from nanobotd.memory.dailynote import ARCHIVE_DIR_NAME
from nanobotd.state.store import RunRecord, StateStore


def restore_lifecycle_run(run: RunRecord, *, store: StateStore, dry_run: bool) -> dict:
    """Undo a lifecycle run (notes moved back, deleted ones recreated byte-identical, its summaries out, compacted
    entries back): {"run_id", "plan", "files"}, or RestoreRefused. Pruned backups cannot come back."""
    manifest = run.manifest
    if manifest.get("dry_run") or "workspace_path" not in manifest:
        # Interrupted before its first journal entry: it changed nothing.
        return {"run_id": run.run_id, "plan": [f"lifecycle run {run.run_id} changed nothing; nothing to restore"],
                "files": []}
    workspace = Path(manifest["workspace_path"])
    steps = list(manifest.get("executed") or [])
    pending = manifest.get("pending")
    if isinstance(pending, int) and pending < len(manifest.get("plan") or []):
        steps.append(manifest["plan"][pending])  # interrupted: its undo is written to be harmless if it never ran
    _check_backups(run, steps)
    undo = _Undo(workspace, manifest)
    for step in reversed(steps):
        getattr(undo, "undo_" + step["action"])(step)
    if undo.conflicts:
        raise RestoreRefused(f"run {run.run_id} cannot be restored: {'; '.join(undo.conflicts)}. Move the new"
                             " note aside, then restore again", plan=undo.plan, conflicts=undo.conflicts)
    if manifest.get("created_archive_dir"):
        undo.remove_archive_dir_if_empty()
    if not undo.plan:
        undo.plan.append(f"lifecycle run {run.run_id} changed nothing; nothing to restore")
    if not dry_run:
        for action in undo.actions:
            action()
    return {"run_id": run.run_id, "plan": undo.plan, "files": sorted(set(undo.files))}


def _check_backups(run: RunRecord, steps: list[dict]) -> None:
    manifest = run.manifest
    needed = []
    for step in steps:
        if step["action"] == "delete" and step["path"] in manifest.get("backups", {}):
            needed.append(manifest["backups"][step["path"]]["backup"])
        if step["action"] == "compact_history" and manifest.get("history_removed"):
            needed.append(manifest["history_removed"]["backup"])
    missing = [path for path in needed if not Path(path).is_file()]
    if missing:
        raise RestoreRefused(f"run {run.run_id} cannot be restored: backup {missing[0]} is missing")


class _Undo:
    """Collects the plan lines and the actions that undo a lifecycle run, newest step first."""

    def __init__(self, workspace: Path, manifest: dict):
        self.workspace = workspace
        self.manifest = manifest
        self.memory_dir = workspace / "memory"
        self.plan: list[str] = []
        self.files: list[str] = []
        self.actions: list = []
        self.conflicts: list[str] = []

    def undo_prune_backups(self, step: dict) -> None:
        """Pruned backups are gone for good; say so."""
        self.plan.append(f"backups of run {step['run_id']} were pruned; they cannot come back")

    def undo_compact_history(self, step: dict) -> None:
        """Put the compacted entries back in cursor order."""
        entries = compacted_entries_missing(self.memory_dir, self.manifest.get("history_removed"))
        if not entries:
            return
        self.plan.append(f"put {len(entries)} compacted entries back into memory/history.jsonl")
        self.files.append(str(history.history_path(self.memory_dir)))
        self.actions.append(lambda: history.insert_entries(self.memory_dir, entries))

    def undo_delete(self, step: dict) -> None:
        """Recreate a deleted note byte-identical, unless something took its place since."""
        backup = self.manifest.get("backups", {}).get(step["path"])
        if backup is None:
            return  # interrupted before its backup existed, so before the delete
        path = self.workspace / step["path"]
        data = Path(backup["backup"]).read_bytes()
        if path.exists() or path.is_symlink():
            if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
                self.plan.append(f"{step['path']} is already back; left as is")
            else:  # undoing the summary now would leave the old note only in the backup
                self.conflicts.append(f"{step['path']} was created again (the expired one is in {backup['backup']})")
            return
        self.plan.append(f"recreate {step['path']} ({len(data)} bytes) from {backup['backup']}")
        self.files.append(str(path))
        self.actions.append(lambda: fsio.atomic_write(path, data, mode=backup["mode"], root=self.workspace))

    def undo_summarise(self, step: dict) -> None:
        """Remove the summary entries the run wrote."""
        cursors = set(self.manifest.get("history_added") or [])
        if not cursors:
            return
        self.plan.append(f"remove the {len(cursors)} summary entries (cursors {min(cursors)}-{max(cursors)})"
                         " from memory/history.jsonl")
        self.files.append(str(history.history_path(self.memory_dir)))
        hashes = set(self.manifest.get("history_added_hashes") or [])

        def keep(entry: history.HistoryEntry) -> bool:
            """Not a summary of the run: another cursor, or another content at its cursor (cursors start again at 1
            when memory/ is deleted)."""
            return entry.cursor not in cursors or bool(hashes) and history.content_hash(entry.content) not in hashes

        self.actions.append(lambda: history.remove_entries(self.memory_dir, keep))

    def undo_move(self, step: dict) -> None:
        """Move an archived note back where it was."""
        source, target = self.workspace / step["from"], self.workspace / step["to"]
        # Deletes are undone first (newest step first), so a note moved and expired in one run is back here.
        will_exist = any(str(target) == path for path in self.files)
        if source.exists() or source.is_symlink():
            self.plan.append(f"{step['from']} exists again; {step['to']} left in the archive")
            return
        if not (target.is_file() or will_exist):
            self.plan.append(f"{step['to']} is gone; nothing to move back")
            return
        self.plan.append(f"move {step['to']} back to {step['from']}")
        self.files.extend([str(target), str(source)])
        self.actions.append(lambda: move_note(target, source, self.workspace))

    def remove_archive_dir_if_empty(self) -> None:
        """Drop the archive folder the run created once the notes it holds have moved back."""
        archive = self.memory_dir / ARCHIVE_DIR_NAME
        moved_out = {path for path in self.files if Path(path).parent == archive}
        try:
            left = {str(path) for path in archive.iterdir()} - moved_out
        except (FileNotFoundError, NotADirectoryError):
            return
        if not left and not archive.is_symlink():
            self.plan.append("remove the memory/archive folder the run created (empty again)")
            self.actions.append(lambda: _remove_empty_dir(archive))


def _remove_empty_dir(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        return  # something arrived meanwhile: keep the folder
    fsio.fsync_dir(folder.parent)
