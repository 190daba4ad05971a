"""nanobotd/memory/recall.py: the records of some days, read from notes and history, cut to a budget."""

from __future__ import annotations

import json
import os
from datetime import date
from pathlib import Path

from nanobotd.memory import recall


def write_history(memory: Path, *records: tuple[int, str, str]) -> None:
    lines = [json.dumps({"cursor": cursor, "timestamp": stamp, "content": content, "session_key": "cli:a"})
             for cursor, stamp, content in records]
    (memory / "history.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def memory_dir(tmp_path: Path) -> Path:
    memory = tmp_path / "workspace" / "memory"
    (memory / "archive").mkdir(parents=True)
    return memory


def test_a_day_brings_its_note_its_archived_note_and_its_history_entries_in_order(tmp_path):
    memory = memory_dir(tmp_path)
    (memory / "2026-11-20.md").write_text("# 2026-11-20\n\n## Decisions\n- Ship on Friday.\n")
    (memory / "archive" / "2026-11-20.md").write_text("# 2026-11-20\n\n## Topics\n- Kestrel launch.\n")
    (memory / "2026-11-21.md").write_text("# 2026-11-21\n\n## Topics\n- Not asked for.\n")
    write_history(memory, (4, "2026-11-19 23:59", "the day before"), (5, "2026-11-20 10:15", "talked about tea"),
                  (6, "2026-11-20 18:00", "booked the venue"), (7, "2026-11-21 00:00", "the day after"))
    answer = recall.collect(memory, date(2026, 11, 20), date(2026, 11, 20))
    assert [(item["source"], item["path"], item["cursor"]) for item in answer["items"]] == [
        ("daily note", "memory/2026-11-20.md", None), ("archived note", "memory/archive/2026-11-20.md", None),
        ("history", "memory/history.jsonl", 5), ("history", "memory/history.jsonl", 6)]
    assert "Ship on Friday" in answer["items"][0]["text"]
    assert answer["items"][2]["session_key"] == "cli:a" and answer["items"][2]["timestamp"] == "2026-11-20 10:15"
    assert answer["truncated"] is False and "note" not in answer


def test_a_range_covers_every_day_and_nothing_outside_it(tmp_path):
    memory = memory_dir(tmp_path)
    for day in (17, 18, 19, 20, 21):
        (memory / f"2026-11-{day}.md").write_text(f"# 2026-11-{day}\n\n## Topics\n- day {day}\n")
    write_history(memory, (1, "2026-11-18 09:00", "entry 18"), (2, "bad", "no date"), (3, "2026-11-21 09:00", "x"))
    answer = recall.collect(memory, date(2026, 11, 18), date(2026, 11, 20))
    assert [(item["date"], item["source"]) for item in answer["items"]] == [
        ("2026-11-18", "daily note"), ("2026-11-18", "history"), ("2026-11-19", "daily note"),
        ("2026-11-20", "daily note")]


def test_the_answer_is_cut_to_the_budget_and_says_what_was_left_out(tmp_path):
    memory = memory_dir(tmp_path)
    (memory / "2026-11-20.md").write_text("# 2026-11-20\n\n## Topics\n" + "- a long bullet of words\n" * 200)
    write_history(memory, *((cursor, "2026-11-20 12:00", f"entry {cursor} " + "x" * 500) for cursor in range(1, 9)))
    answer = recall.collect(memory, date(2026, 11, 20), date(2026, 11, 20), max_chars=6000)
    texts = [item["text"] for item in answer["items"]]
    assert sum(len(text) for text in texts) <= 6000
    assert answer["truncated"] is True
    assert "cut at 6000 characters" in answer["note"] and "not shown: 2026-11-20 history #" in answer["note"]
    assert "Ask for fewer days" in answer["note"]
    huge = recall.collect(memory, date(2026, 11, 20), date(2026, 11, 20), max_chars=1000)
    assert huge["items"][0]["cut"] is True and huge["items"][0]["text"].endswith("… (cut)")
    assert len(huge["items"][0]["text"]) <= 1000 and "shortened: 2026-11-20 daily note" in huge["note"]


def test_symlinked_notes_and_a_missing_memory_folder_give_nothing(tmp_path):
    memory = memory_dir(tmp_path)
    secret = tmp_path / "secret.md"
    secret.write_text("# secret\n\n## Topics\n- do not read\n")
    os.symlink(secret, memory / "2026-11-20.md")
    os.mkfifo(memory / "2026-11-21.md")  # would block a plain read forever
    assert recall.collect(memory, date(2026, 11, 20), date(2026, 11, 21))["items"] == []
    assert recall.collect(tmp_path / "none" / "memory", date(2026, 11, 20), date(2026, 11, 21))["items"] == []
