"""The agent's own history entries (no nanobotd span): following history.jsonl for new ones, and what a [RAW]
entry the agent cut at its cap (`... (truncated)`) dropped."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from nanobotd import fsio
from nanobotd.memory.history import HistoryEntry, history_path, parse_entry, whole_lines
from nanobotd.memory.transcript import PendingMessage

RAW_PREFIX = "[RAW]"
TRUNCATED_SUFFIX = "... (truncated)"


def is_agent_entry(entry: HistoryEntry) -> bool:
    """An entry the agent wrote: nanobotd's own entries carry the span of the messages they archive."""
    return entry.span is None


def is_truncated_raw(content: str) -> bool:
    """A raw transcript the agent cut at its cap: the messages after the cut are lost unless mended."""
    return content.startswith(RAW_PREFIX) and content.rstrip().endswith(TRUNCATED_SUFFIX)


def kept_of_cut(content: str, texts: list[str]) -> tuple[int, int]:
    """How many of the messages (by text, in order) a cut [RAW] entry holds whole (each found after the one
    before), and how many leading characters of the next one's text it holds (the cut fell inside it)."""
    body = content[:len(content.rstrip()) - len(TRUNCATED_SUFFIX)] if is_truncated_raw(content) else content
    position = 0
    for index, text in enumerate(texts):
        text = text.strip()
        if not text:
            continue
        found = body.find(text, position)
        if found < 0:
            return index, _held_start(body[position:].rstrip(), texts[index])
        position = found + len(text)
    return len(texts), 0


def _held_start(rest: str, text: str) -> int:
    """How much of *text* *rest* (the cut entry past the last whole message: `[stamp] ROLE: ` + a start) holds."""
    start = rest.find(": ")
    while start >= 0:
        held = rest[start + 2:]
        if held and text.startswith(held):
            return len(held)
        start = rest.find(": ", start + 1)
    return 0


def dropped_part(message: PendingMessage, held_chars: int) -> PendingMessage:
    """*message* without the first *held_chars* characters the agent's cut [RAW] entry holds, saying so."""
    if held_chars <= 0 or held_chars >= len(message.text):
        return message
    rest = message.text[held_chars:]
    note = f"(continued: the agent's own [RAW] entry holds the first {held_chars} characters) "
    return dataclasses.replace(message, text=note + rest)


class HistoryFollower:
    """New entries of history.jsonl since the last look, read from where the last look stopped."""

    def __init__(self, memory_dir: Path, after_cursor: int = 0):
        self.path = history_path(memory_dir)
        self.last_cursor = after_cursor
        self._identity: tuple[int, int] | None = None
        self._offset = 0

    def poll(self) -> list[HistoryEntry]:
        """Entries with a cursor above the last one seen (a rewritten file is read again from the start)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return []
        identity = (stat.st_dev, stat.st_ino)
        if identity != self._identity or stat.st_size < self._offset:
            self._identity, self._offset = identity, 0
        if stat.st_size == self._offset:
            return []
        with fsio.open_regular(self.path, follow=True) as handle:  # line by line: the file can be tens of MB
            handle.seek(self._offset)
            # a line still being written is read next time
            entries = [entry for _, line in whole_lines(handle)
                       if (entry := parse_entry(line)) is not None and entry.cursor > self.last_cursor]
            self._offset = handle.tell()
        if entries:
            self.last_cursor = max(entry.cursor for entry in entries)
        return entries
