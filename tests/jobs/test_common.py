"""The history compaction both the dream and the lifecycle use, on a real history.jsonl in a tmp folder."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from nanobotd.jobs.common import (
    HISTORY_BACKUP_NAME,
    compact_history,
    compacted_entries_missing,
    compaction_candidates,
)
from nanobotd.memory import history

NOW = datetime(2026, 6, 15, 4, 45)


def memory_with_history(tmp_path: Path, count: int, dream_cursor: int) -> Path:
    memory = tmp_path / "memory"
    memory.mkdir()
    history.append_entries(memory, [(f"- [durable] fact {number}", None) for number in range(1, count + 1)], NOW)
    (memory / history.DREAM_CURSOR_NAME).write_text(str(dream_cursor))
    return memory


def cursors(memory: Path) -> list[int]:
    return [entry.cursor for entry in history.read_history(memory).entries]


def test_candidates_are_the_oldest_entries_beyond_the_limit_that_the_dream_has_read(tmp_path):
    memory = memory_with_history(tmp_path, count=10, dream_cursor=3)
    assert compaction_candidates(memory, 5) == [1, 2, 3]
    assert compaction_candidates(memory, 10) == []


def test_compaction_journals_its_backup_before_rewriting_and_its_undo_puts_back_what_is_missing(tmp_path):
    memory = memory_with_history(tmp_path, count=10, dream_cursor=3)
    run_dir = tmp_path / "backups"
    journalled = []

    def journal(removal: dict) -> None:
        journalled.append((dict(removal), cursors(memory)))

    removal = compact_history(memory, run_dir, [1, 2, 3, 4], journal)
    assert removal == {"removed": 3, "backup": str(run_dir / HISTORY_BACKUP_NAME), "cursors": [1, 2, 3]}
    assert journalled == [(removal, list(range(1, 11)))]
    assert cursors(memory) == list(range(4, 11))
    missing = compacted_entries_missing(memory, removal)
    assert [entry.content for entry in missing] == ["- [durable] fact 1", "- [durable] fact 2", "- [durable] fact 3"]
    history.insert_entries(memory, missing)
    assert cursors(memory) == list(range(1, 11)) and compacted_entries_missing(memory, removal) == []


def test_nothing_the_dream_has_not_read_is_compacted(tmp_path):
    memory = memory_with_history(tmp_path, count=4, dream_cursor=0)
    assert compact_history(memory, tmp_path / "backups", [1, 2], lambda removal: None) is None
    assert cursors(memory) == [1, 2, 3, 4] and not (tmp_path / "backups").exists()
