"""What the dream reads, in batches: history entries after the cursor and unread note bullets, oldest first."""

from __future__ import annotations

import json
from pathlib import Path

from nanobotd.jobs.dream.inputs import NOTE_ITEM_CHARS, read_backlog
from nanobotd.jobs.dreamnotes import mark_dream_notes


def write_memory(tmp_path: Path, stamps: list[str], notes: dict[str, str]) -> Path:
    memory = tmp_path / "memory"
    (memory / "archive").mkdir(parents=True)
    lines = [json.dumps({"cursor": cursor, "timestamp": stamp, "content": f"fact {cursor}"})
             for cursor, stamp in enumerate(stamps, start=1)]
    (memory / "history.jsonl").write_text("\n".join(lines) + "\n")
    for name, text in notes.items():
        (memory / name).write_text(text)
    return memory


def item_names(batch) -> list[str]:
    return [f"entry {entry.cursor}" for entry in batch.entries] + [f"note {item.day}" for item in batch.notes]


def test_entries_and_notes_are_batched_oldest_first_with_entries_in_cursor_order(tmp_path):
    memory = write_memory(tmp_path, ["2026-06-01 09:00", "2026-06-03 09:00", "2026-06-02 23:00"], {
        "2026-06-02.md": "## Topics\n- Backups\n", "archive/2026-05-20.md": "## Decisions\n- Use Go\n"})
    backlog = read_backlog(memory, after=0)
    first = backlog.next_batch(limit=3, char_budget=10_000)
    assert item_names(first) == ["entry 1", "note 2026-05-20", "note 2026-06-02"]
    backlog.consume(first)
    assert backlog.left() == {"history_entries": 2, "note_bullets": 0}
    second = backlog.next_batch(limit=3, char_budget=10_000)
    assert item_names(second) == ["entry 2", "entry 3"]
    backlog.consume(second)
    assert not backlog and second.describe() == {"entries": [2, 3], "note_bullets": {}}


def test_entries_after_the_cursor_and_bullets_not_read_are_all_that_is_read(tmp_path):
    memory = write_memory(tmp_path, ["2026-06-01 09:00", "2026-06-02 09:00"], {
        "2026-06-02.md": "## Topics\n- Backups\n- Photos\n"})
    bullets = read_backlog(memory, after=0).notes[0].bullets
    mark_dream_notes(memory, {"2026-06-02": [bullets[0].digest]}, read=True)
    backlog = read_backlog(memory, after=1)
    batch = backlog.next_batch(limit=20, char_budget=10_000)
    assert [entry.cursor for entry in batch.entries] == [2]
    assert [bullet.text for item in batch.notes for bullet in item.bullets] == ["Photos"]
    assert batch.note_digests() == {"2026-06-02": [bullets[1].digest]}


def test_a_long_note_is_split_into_items_and_the_char_budget_ends_a_batch(tmp_path):
    bullets = "".join(f"- fact {number}: {'x' * 900}\n" for number in range(20))
    memory = write_memory(tmp_path, [], {"2026-06-02.md": "## Topics\n" + bullets})
    backlog = read_backlog(memory, after=0)
    assert len(backlog.notes) == 3 and all(item.size <= NOTE_ITEM_CHARS for item in backlog.notes)
    assert sum(len(item.bullets) for item in backlog.notes) == 20
    batch = backlog.next_batch(limit=20, char_budget=NOTE_ITEM_CHARS)
    assert len(batch.notes) == 1 and batch.describe()["note_bullets"] == {"2026-06-02": 8}
    assert len(backlog.next_batch(limit=20, char_budget=1).notes) == 1, "the first item always goes"
