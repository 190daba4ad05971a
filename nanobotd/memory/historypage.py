"""The newest history entries for the web page, read backwards from the end of history.jsonl a block at a time
and stopping once they have enough (streaming tens of MB from the start would cost most of a second a page)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from nanobotd.memory.history import HistoryEntry, history_path, lines_from_end, parse_entry

BLOCK_BYTES = 256 * 1024
MAX_PAGE = 500


def newest_entries(memory_dir: Path, limit: int, before: int | None = None) -> list[HistoryEntry]:
    """Up to *limit* valid entries, newest first; with *before*, only those of a smaller cursor (the next page)."""
    page: list[HistoryEntry] = []
    for line in lines_from_end(history_path(memory_dir), BLOCK_BYTES):
        entry = parse_entry(line)
        if entry is None or (before is not None and entry.cursor >= before):
            continue
        page.append(entry)
        if len(page) >= min(limit, MAX_PAGE):
            break
    return page


def entries_per_day(memory_dir: Path, first_day: str) -> dict[str, int]:
    """Entries per day (YYYY-MM-DD) from *first_day* on; the walk back stops at the first older entry."""
    counts: Counter = Counter()
    for line in lines_from_end(history_path(memory_dir), BLOCK_BYTES):
        entry = parse_entry(line)
        if entry is None or not entry.timestamp:
            continue
        day = entry.timestamp[:10]
        if day < first_day:
            break
        counts[day] += 1
    return dict(sorted(counts.items()))
