"""The compaction of history.jsonl (both the dream and the lifecycle compact it), its backup and its undo."""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from pathlib import Path

from nanobotd import fsio
from nanobotd.memory import history

HISTORY_BACKUP_NAME = "history-removed.jsonl"  # in the run folder: the entries a compaction removed


def compaction_candidates(memory_dir: Path, max_entries: int) -> list[int]:
    """Cursors of the oldest entries beyond *max_entries* that the dream has read; unread ones stay, even past
    *max_entries*. The history is streamed and only its cursors kept (8 bytes each)."""
    cursors = array("q", (entry.cursor for entry in history.iter_entries(memory_dir)))
    excess = max(len(cursors) - max(max_entries, 0), 0)
    if not excess:
        return []
    if any(later < earlier for earlier, later in pairwise(cursors)):
        cursors = array("q", sorted(cursors))
    dream_cursor = history.read_dream_cursor(memory_dir)
    return [cursor for cursor in cursors[:excess] if cursor <= dream_cursor]


def compact_history(memory_dir: Path, run_dir: Path, cursors: Iterable[int],
                    journal: Callable[[dict], None]) -> dict | None:
    """Remove the entries at *cursors* the dream has read, saved in *run_dir*; returns the record (None: none removed).
    *journal* gets it before history.jsonl changes, so a run cut short can put the entries back."""
    # Re-read: the dream cursor can only have moved on since planning, and never remove what it has not read.
    dream_cursor = history.read_dream_cursor(memory_dir)
    wanted = {cursor for cursor in cursors if cursor <= dream_cursor}
    backup = run_dir / HISTORY_BACKUP_NAME
    saved: list[int] = []
    with contextlib.ExitStack() as stack:
        writer = None
        for entry in history.iter_entries(memory_dir) if wanted else ():
            if entry.cursor not in wanted:
                continue
            if writer is None:
                writer = stack.enter_context(fsio.AtomicWriter(backup, 0o600))
            writer.write(entry.to_line())
            saved.append(entry.cursor)
        if writer is None:
            return None
        writer.commit()
    saved.sort()
    removal = {"removed": len(saved), "backup": str(backup), "cursors": saved}
    journal(removal)
    doomed = set(saved)
    removal["removed"] = history.remove_entries(memory_dir, keep=lambda entry: entry.cursor not in doomed)
    return removal


def compacted_entries_missing(memory_dir: Path, removal: dict | None) -> list[history.HistoryEntry]:
    """The entries a compaction saved (its *removal* record) that history.jsonl lacks: what its undo puts back."""
    backup = (removal or {}).get("backup")
    if not backup:
        return []
    saved = {entry.cursor for entry in _saved_entries(Path(backup))}
    present = {entry.cursor for entry in history.iter_entries(memory_dir) if entry.cursor in saved}
    return sorted((entry for entry in _saved_entries(Path(backup)) if entry.cursor not in present),
                  key=lambda entry: entry.cursor)


def _saved_entries(backup: Path) -> Iterator[history.HistoryEntry]:
    for number, line in history.iter_lines(backup):
        entry = history.parse_entry(line, number)
        if entry is not None:
            yield entry
