"""What the jobs share, on real files in a tmp folder: the history compaction both the dream and the lifecycle
use, what the dream has read of the daily notes, and the caps of the bootstrap files."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from nanobotd.config.schema import ContextSettings
from nanobotd.jobs.compaction import (
    HISTORY_BACKUP_NAME,
    compact_history,
    compacted_entries_missing,
    compaction_candidates,
)
from nanobotd.jobs.dreamnotes import (
    DREAM_NOTES_NAME,
    cap_overruns,
    mark_dream_notes,
    read_dream_notes,
    unread_note_bullets,
)
from nanobotd.memory import history
from tests.support.histories import read_history

NOW = datetime(2026, 6, 15, 4, 45)


def memory_with_history(tmp_path: Path, count: int, dream_cursor: int) -> Path:
    memory = tmp_path / "memory"
    memory.mkdir()
    history.append_entries(memory, [(f"- [durable] fact {number}", None) for number in range(1, count + 1)], NOW)
    (memory / history.DREAM_CURSOR_NAME).write_text(str(dream_cursor))
    return memory


def cursors(memory: Path) -> list[int]:
    return [entry.cursor for entry in read_history(memory).entries]


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


def memory_with_notes(tmp_path: Path) -> Path:
    memory = tmp_path / "memory"
    (memory / "archive").mkdir(parents=True)
    (memory / "2026-06-14.md").write_text("## Decisions\n- Use Go\n- Use Go.\n## Topics\n- Backups\n")
    (memory / "archive" / "2026-06-01.md").write_text("## Topics\n- Photos\n")
    return memory


def texts(memory: Path) -> list[str]:
    return [bullet.text for bullet in unread_note_bullets(memory)]


def test_marked_bullets_are_no_longer_unread_and_unmarking_makes_them_unread_again(tmp_path):
    memory = memory_with_notes(tmp_path)
    assert texts(memory) == ["Photos", "Use Go", "Backups"]
    [_, go, _] = unread_note_bullets(memory)
    mark_dream_notes(memory, {"2026-06-14": [go.digest]}, read=True)
    assert texts(memory) == ["Photos", "Backups"]
    assert read_dream_notes(memory) == {"2026-06-14": {go.digest}}
    (memory / "2026-06-14.md").rename(memory / "archive" / "2026-06-14.md")
    assert texts(memory) == ["Photos", "Backups"]
    mark_dream_notes(memory, {"2026-06-14": [go.digest]}, read=False)
    assert texts(memory) == ["Photos", "Use Go", "Backups"] and read_dream_notes(memory) == {}


def test_days_whose_note_is_gone_are_dropped_from_the_read_state(tmp_path):
    memory = memory_with_notes(tmp_path)
    mark_dream_notes(memory, {"2026-06-01": ["a" * 16], "2026-06-14": ["b" * 16]}, read=True)
    (memory / "archive" / "2026-06-01.md").unlink()
    mark_dream_notes(memory, {"2026-06-14": ["c" * 16]}, read=True)
    assert read_dream_notes(memory) == {"2026-06-14": {"b" * 16, "c" * 16}}


def test_an_unreadable_read_state_counts_every_bullet_as_unread(tmp_path):
    memory = memory_with_notes(tmp_path)
    (memory / DREAM_NOTES_NAME).write_text("{not json")
    assert read_dream_notes(memory) == {} and len(texts(memory)) == 3


def test_cap_overruns_name_each_file_over_its_cap_and_the_joint_total():
    caps = ContextSettings(max_chars=100, total_max_chars=250)
    assert cap_overruns({"SOUL.md": 50, "USER.md": 100, "memory/MEMORY.md": 90}, caps) == []
    assert cap_overruns({"SOUL.md": 50, "USER.md": 101, "memory/MEMORY.md": 100}, caps) == [
        "USER.md is 101 characters, over its cap of 100 (context.max_chars)",
        "SOUL.md, USER.md, memory/MEMORY.md are 251 characters together, over their joint cap of 250"
        " (context.total_max_chars)"]
