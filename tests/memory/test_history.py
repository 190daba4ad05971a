"""history.jsonl appends: cursors unique and increasing, even with a second process appending."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

from nanobotd.memory import history

NOW = datetime(2026, 11, 22, 10, 0)
APPENDER = """
import sys
from datetime import datetime
from pathlib import Path
from nanobotd.memory import history
memory = Path(sys.argv[1])
for index in range(int(sys.argv[2])):
    history.append_entries(memory, [(f"{sys.argv[3]} entry {index}", "cli:x")], datetime(2026, 11, 22))
"""


def test_next_cursor_is_max_of_cursor_file_and_file_plus_one(tmp_path):
    (tmp_path / "history.jsonl").write_text(json.dumps({"cursor": 7, "timestamp": "t", "content": "a"}) + "\n")
    (tmp_path / ".cursor").write_text("9")
    written = history.append_entries(tmp_path, [("b", None)], NOW)
    assert written[0].cursor == 10
    assert (tmp_path / ".cursor").read_text() == "10"


def test_two_processes_appending_at_once_never_duplicate_or_lose_a_cursor(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), "150", name])
             for name in ("alpha", "beta")]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    scan = history.read_history(tmp_path)
    cursors = [entry.cursor for entry in scan.entries]
    assert scan.bad_lines == []
    assert cursors == list(range(1, 301))
    assert (tmp_path / ".cursor").read_text() == "300"


def test_a_torn_last_line_gets_its_own_line_and_is_never_reused(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps({"cursor": 1, "timestamp": "t", "content": "a"}) + '\n{"cursor": 2, "timest')
    history.append_entries(tmp_path, [("b", None)], NOW)
    scan = history.read_history(tmp_path)
    assert [entry.cursor for entry in scan.entries] == [1, 2]
    assert scan.bad_lines == [2]


def test_reasoning_blocks_are_stripped_and_entries_capped(tmp_path):
    written = history.append_entries(tmp_path, [("<think>hidden</think>visible" + "x" * 70000, None)], NOW)
    assert written[0].content.startswith("visible") and len(written[0].content) == history.ENTRY_HARD_CAP


def test_rewrite_keeps_unparsable_lines_and_never_lowers_the_cursor(tmp_path):
    history.append_entries(tmp_path, [("a", None), ("b", None), ("c", None)], NOW)
    with open(tmp_path / "history.jsonl", "a") as handle:
        handle.write("garbage\n")
    removed = history.rewrite_history(tmp_path, lambda entry: entry.cursor != 3)
    assert [entry.cursor for entry in removed] == [3]
    assert "garbage" in (tmp_path / "history.jsonl").read_text()
    assert history.append_entries(tmp_path, [("d", None)], NOW)[0].cursor == 4
    assert history.insert_entries(tmp_path, removed) == 1
    assert [entry.cursor for entry in history.read_history(tmp_path).entries] == [1, 2, 3, 4]
