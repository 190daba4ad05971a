"""What every job shares: the environment a job runs in, the restore refusal, run backups, the
compaction of history.jsonl (both the dream and the lifecycle compact it), and what the dream has read of
the daily notes and the caps it keeps the bootstrap files under (the audit reports on both).

Jobs import this module and never each other; the daemon hands each job a `JobEnv`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from loguru import logger

from nanobotd import fsio
from nanobotd.config.schema import ContextSettings, WorkspaceSettings
from nanobotd.faults import FaultPoints
from nanobotd.gitstore.store import GitStore
from nanobotd.llm.client import LLMClient
from nanobotd.memory import history
from nanobotd.memory.dailynote import ARCHIVE_DIR_NAME, NoteBullet, note_bullets
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import RUNS_DIR, RunRecord, StateStore

EXPIRED = "expired"
RESTORE_STEP_KEY = "restore_step"  # in a restore's manifest: the step it journalled before changing anything
HISTORY_BACKUP_NAME = "history-removed.jsonl"  # in the run folder: the entries a compaction removed
DREAM_NOTES_NAME = ".dream_notes.json"  # in memory/, beside .dream_cursor: the note bullets the dream has read
BOOTSTRAP_FILES = ("SOUL.md", "USER.md", "memory/MEMORY.md")  # nanobot puts these whole into every prompt


@dataclass
class JobEnv:
    """One workspace's settings, state, tracker, LLM client, git store and clocks, handed to every job.

    *kinds* is the job registry (kind -> job module), handed in so that restore can dispatch by kind
    without importing the other jobs. *faults*: the fault points a test armed (none in normal use).
    """

    settings: WorkspaceSettings
    store: StateStore
    tracker: SessionTracker
    llm: LLMClient
    now: Callable[[], datetime]
    git: GitStore | None = None
    clock: Callable[[], float] = time.time
    kinds: Mapping[str, Any] = field(default_factory=dict)
    faults: FaultPoints = field(default_factory=FaultPoints)

    @property
    def memory_dir(self) -> Path:
        """The workspace's memory folder."""
        return self.settings.path / "memory"


class RestoreRefused(Exception):
    """A restore that would clobber later edits (or cannot apply); nothing was changed."""

    def __init__(self, message: str, *, plan: list[str] | None = None, conflicts: list[str] | None = None):
        super().__init__(message)
        self.plan = plan or []
        self.conflicts = conflicts or []


def note_progress(manifest: dict, step: str, done: int | None = None, total: int | None = None) -> None:
    """Say in the manifest how far the run has got (step, n of m), so a waiting `nanobotctl` can show it.

    The caller journals the manifest, as before any step that changes files.
    """
    manifest["progress"] = {"step": step, "done": done, "total": total}


def refuse_if_expired(run: RunRecord) -> None:
    """Refuse runs whose backups were pruned after the restore window."""
    if run.manifest.get(EXPIRED):
        raise RestoreRefused(
            f"run {run.run_id} is past the restore window: its backups were pruned"
            f" by {run.manifest.get('expired_by', 'a lifecycle run')}; it can no longer be restored"
        )


def run_backup_dir(store: StateStore, run_id: str) -> Path:
    """A run's backup folder, without creating it (store.run_dir creates on demand)."""
    return store.state_dir / RUNS_DIR / run_id


def folder_size(folder: Path) -> int:
    """Bytes of the regular files under *folder*."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def compaction_candidates(memory_dir: Path, max_entries: int) -> list[int]:
    """Cursors of the oldest entries beyond *max_entries* that the dream has read.

    An entry the dream has not read stays, even when that leaves more than *max_entries*. The history is
    streamed and only its cursors are kept (8 bytes each).
    """
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
    """Remove the entries at *cursors* that the dream has read, saved in *run_dir* and journalled first.

    *journal* receives the record ({"removed", "backup", "cursors"}) before history.jsonl changes, so a run
    cut short can still put the entries back; returns that record, or None when nothing was removed.
    The entries are streamed into the backup and out of history.jsonl, never held all at once.
    """
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


def describe_step(step: dict) -> str:
    """One lifecycle plan step as a line for people (the lifecycle dry run and the audit both show plans)."""
    action = step.get("action")
    if action == "move":
        return f"move {step['from']} -> {step['to']} ({step['bytes']} bytes, {step['age_days']} days old)"
    if action == "summarise":
        return f"summarise {len(step['notes'])} expired note(s) ({step['bytes']} bytes) into memory/history.jsonl"
    if action == "delete":
        return f"delete {step['path']} ({step['bytes']} bytes, {step['age_days']} days old; backup kept)"
    if action == "compact_history":
        return (f"compact memory/history.jsonl to {step['keep']} entries: remove {step['count']} dreamt entries"
                f" (cursors {step['first']}-{step['last']}; saved in the run's backups)")
    if action == "prune_backups":
        return f"prune backups of run {step['run_id']} ({step['bytes']} bytes, {step['age_days']} days old)"
    return str(step)


# -- what the dream has read of the daily notes --------------------------------------------------------
def read_dream_notes(memory_dir: Path) -> dict[str, set[str]]:
    """{note day: digests of its bullets the dream has read}; a missing or unreadable file means none read."""
    path = memory_dir / DREAM_NOTES_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        logger.warning("{} is unreadable ({}); the dream reads every note bullet again", path, exc)
        return {}
    notes = data.get("notes") if isinstance(data, dict) else None
    if not isinstance(notes, dict):
        return {}
    return {day: {digest for digest in digests if isinstance(digest, str)}
            for day, digests in notes.items() if isinstance(digests, list)}


def mark_dream_notes(memory_dir: Path, digests: Mapping[str, Iterable[str]], *, read: bool) -> None:
    """Mark note bullets read (a dream applied them) or unread again (its roll-back or restore).

    Days whose note is gone (expired from the archive) are dropped, so the file stays small.
    """
    before = read_dream_notes(memory_dir)
    state = {day: set(found) for day, found in before.items()}
    for day, day_digests in digests.items():
        if read:
            state.setdefault(day, set()).update(day_digests)
        elif day in state:
            state[day].difference_update(day_digests)
    kept = {day: sorted(found) for day, found in sorted(state.items()) if found and _note_exists(memory_dir, day)}
    path = memory_dir / DREAM_NOTES_NAME
    if not kept:
        path.unlink(missing_ok=True)  # nothing read: as before the first dream that read a note
    elif kept != {day: sorted(found) for day, found in sorted(before.items())}:
        fsio.atomic_write(path, json.dumps({"notes": kept}, indent=1) + "\n")


def _note_exists(memory_dir: Path, day: str) -> bool:
    return (memory_dir / f"{day}.md").exists() or (memory_dir / ARCHIVE_DIR_NAME / f"{day}.md").exists()


def unread_note_bullets(memory_dir: Path) -> list[NoteBullet]:
    """The note bullets the dream has not read yet, oldest day first, each text once per day."""
    read = read_dream_notes(memory_dir)
    unread, seen = [], set()
    for bullet in note_bullets(memory_dir):
        key = (bullet.day.isoformat(), bullet.digest)
        if key not in seen and bullet.digest not in read.get(key[0], ()):
            seen.add(key)
            unread.append(bullet)
    return unread


def cap_overruns(sizes: Mapping[str, int], caps: ContextSettings) -> list[str]:
    """What is over the caps (each file, then the files together), as lines for people; empty when all fit."""
    lines = [f"{path} is {size:,} characters, over its cap of {caps.max_chars:,} (context.max_chars)"
             for path, size in sizes.items() if size > caps.max_chars]
    total = sum(sizes.values())
    if total > caps.total_max_chars:
        lines.append(f"{', '.join(sizes)} are {total:,} characters together, over their joint cap of"
                     f" {caps.total_max_chars:,} (context.total_max_chars)")
    return lines
