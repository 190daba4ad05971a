"""The lifecycle's plan: which notes move into the archive, which expire, what history and backups go. Computed the same
for a dry run and a real one, so `nanobotctl lifecycle --dry-run` shows exactly what the next run does."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from nanobotd.config.schema import WorkspaceSettings
from nanobotd.jobs.compaction import compaction_candidates
from nanobotd.jobs.runfiles import folder_size, run_backups
from nanobotd.memory.dailynote import ARCHIVE_DIR_NAME, scan_notes
from nanobotd.state.store import OPEN_RUN_STATES, StateStore

SECONDS_PER_DAY = 86400


def plan_lifecycle(ws: WorkspaceSettings, *, store: StateStore, now: datetime,
                   run_id: str | None = None) -> tuple[list[dict], list[dict]]:
    """The steps a lifecycle run would execute now, and the files it must leave alone (with reasons)."""
    memory_dir = ws.path / "memory"
    scan = scan_notes(memory_dir)
    settings = ws.lifecycle
    today = now.date()
    plan: list[dict] = []
    skipped = list(scan.skipped)
    expiring: list[tuple[str, int, int]] = []
    for note in scan.active:
        age = (today - note.day).days
        if age <= settings.active_days:
            continue
        source = str(note.path.relative_to(ws.path))
        target = memory_dir / ARCHIVE_DIR_NAME / note.path.name
        if not scan.archive_usable:
            skipped.append({"path": source, "reason": "not archived: the archive folder is unusable"})
            continue
        if target.exists() or target.is_symlink():
            skipped.append({"path": source, "reason": "not archived: the archive already holds a note of that date"})
            continue
        plan.append({"action": "move", "from": source, "to": str(target.relative_to(ws.path)),
                     "bytes": note.size, "age_days": age})
        if age > settings.ttl_days:
            expiring.append((str(target.relative_to(ws.path)), note.size, age))
    for note in scan.archived:
        age = (today - note.day).days
        if age > settings.ttl_days:
            expiring.append((str(note.path.relative_to(ws.path)), note.size, age))
    if expiring:
        expiring.sort()
        plan.append({"action": "summarise", "notes": [path for path, _, _ in expiring],
                     "bytes": sum(size for _, size, _ in expiring)})
        plan.extend({"action": "delete", "path": path, "bytes": size, "age_days": age}
                    for path, size, age in expiring)
    plan.extend(_plan_compaction(memory_dir, settings.max_history_entries))
    plan.extend(_plan_pruning(ws, store, now, run_id))
    return plan, skipped


def _plan_compaction(memory_dir: Path, max_entries: int) -> list[dict]:
    cursors = compaction_candidates(memory_dir, max_entries)
    if not cursors:
        return []
    return [{"action": "compact_history", "count": len(cursors), "first": cursors[0], "last": cursors[-1],
             "keep": max_entries, "cursors": cursors}]


def _plan_pruning(ws: WorkspaceSettings, store: StateStore, now: datetime, run_id: str | None) -> list[dict]:
    cutoff = now.timestamp() - ws.lifecycle.restore_window_days * SECONDS_PER_DAY
    return [{"action": "prune_backups", "run_id": run.run_id, "path": str(folder), "bytes": folder_size(folder),
             "age_days": int((now.timestamp() - run.started_at) // SECONDS_PER_DAY)}
            for run, folder in reversed(list(run_backups(store, ws.name)))
            if run.run_id != run_id and run.state not in OPEN_RUN_STATES and run.started_at < cutoff]
