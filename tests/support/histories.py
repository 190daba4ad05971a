"""Read a whole history.jsonl at once, for assertions on small test files (nanobotd itself only streams it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from nanobotd.memory.history import HistoryEntry, iter_history


@dataclass(frozen=True)
class HistoryScan:
    """Every valid entry in file order, and the numbers of the lines that did not parse."""

    entries: list[HistoryEntry]
    bad_lines: list[int]


def read_history(memory_dir: Path) -> HistoryScan:
    """The whole file, entries and unreadable line numbers."""
    entries, bad_lines = [], []
    for number, entry in iter_history(memory_dir):
        if entry is None:
            bad_lines.append(number)
        else:
            entries.append(entry)
    return HistoryScan(entries, bad_lines)


def archived_markers(workspace: Path) -> list[str]:
    """The `A-<n> ` markers of tests.support.workspace.conversation messages archived in history.jsonl, with
    repeats (a message archived twice is there twice)."""
    path = workspace / "memory" / "history.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return re.findall(r"\bA-\d+ ", "\n".join(json.loads(line)["content"] for line in lines))
