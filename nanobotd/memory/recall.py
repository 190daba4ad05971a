"""Recall by date ("what happened on the 20th"): the days' daily notes (active and archived) and history entries,
cut to a character budget that names what it cut, so the caller can ask for fewer days."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date, timedelta
from pathlib import Path

from nanobotd import fsio
from nanobotd.memory import dailynote, history

DEFAULT_MAX_CHARS = 12_000
MIN_CUT_CHARS = 400  # a cut item keeps at least this much of its head, or is left out whole
CUT_MARKER = "\n… (cut)"


@dataclass
class RecallItem:
    """One record of a day: a daily note or one history entry, with where it lives."""

    source: str  # "daily note", "archived note" or "history"
    date: str
    path: str
    text: str
    cursor: int | None = None
    session_key: str | None = None
    timestamp: str | None = None
    cut: bool = False

    def label(self) -> str:
        """A short name for the item, used when saying what was left out."""
        return f"{self.date} {self.source}" + (f" #{self.cursor}" if self.cursor is not None else "")


def collect(memory_dir: Path, first: date, last: date, max_chars: int = DEFAULT_MAX_CHARS) -> dict:
    """The records of the days *first*..*last*, oldest first, within *max_chars* characters of text."""
    days = [first + timedelta(days=offset) for offset in range((last - first).days + 1)]
    # A note is read at most 4 bytes per character of the budget: anything longer is cut anyway.
    items = [item for day in days for item in note_items(memory_dir, day, max_chars * 4)]
    items += history_items(memory_dir, {day.isoformat() for day in days})
    items.sort(key=lambda item: (item.date, item.source == "history", item.cursor or 0))
    kept, left_out = fit(items, max_chars)
    answer = {"from": first.isoformat(), "to": last.isoformat(), "items": [asdict(item) for item in kept],
              "truncated": bool(left_out) or any(item.cut for item in kept)}
    if answer["truncated"]:
        answer["note"] = cut_note(kept, left_out, max_chars)
    return answer


def note_items(memory_dir: Path, day: date, limit_bytes: int | None = None) -> list[RecallItem]:
    """The day's note in memory/ and in memory/archive/ (both when lifecycle left one in each)."""
    found = []
    for source, folder in (("daily note", memory_dir), ("archived note", memory_dir / dailynote.ARCHIVE_DIR_NAME)):
        path = dailynote.note_path(folder, day)
        try:  # missing, a symlink (never followed out) or not a regular file: no note
            text = fsio.read_text_lossy(path, limit_bytes, follow=False)
        except OSError:
            continue
        if text.strip():
            found.append(RecallItem(source, day.isoformat(), str(path.relative_to(memory_dir.parent)), text))
    return found


def history_items(memory_dir: Path, days: set[str]) -> list[RecallItem]:
    """The history entries whose timestamp falls on one of *days* (timestamps are local, as nanobot writes)."""
    relative = str(history.history_path(memory_dir).relative_to(memory_dir.parent))
    return [RecallItem("history", entry.timestamp[:10], relative, entry.content, cursor=entry.cursor,
                       session_key=entry.session_key, timestamp=entry.timestamp)
            for entry in history.iter_entries(memory_dir) if entry.timestamp[:10] in days]


def fit(items: list[RecallItem], max_chars: int) -> tuple[list[RecallItem], list[RecallItem]]:
    """(kept, left out): items in order while they fit; the first that does not keeps its head if worth it."""
    kept: list[RecallItem] = []
    room = max_chars
    for index, item in enumerate(items):
        if len(item.text) <= room:
            kept.append(item)
            room -= len(item.text)
            continue
        if room >= MIN_CUT_CHARS:
            item.text = item.text[:room - len(CUT_MARKER)].rstrip() + CUT_MARKER
            item.cut = True
            kept.append(item)
            index += 1
        return kept, items[index:]
    return kept, []


def cut_note(kept: list[RecallItem], left_out: list[RecallItem], max_chars: int) -> str:
    """Say what the size cap cut, so the reader knows the answer is partial and how to see the rest."""
    parts = [f"cut at {max_chars} characters"]
    cut = [item.label() for item in kept if item.cut]
    if cut:
        parts.append(f"shortened: {', '.join(cut)}")
    if left_out:
        names = ", ".join(item.label() for item in left_out[:10])
        more = f" and {len(left_out) - 10} more" if len(left_out) > 10 else ""
        parts.append(f"{len(left_out)} item(s) not shown: {names}{more}")
    return "; ".join(parts) + ". Ask for fewer days to see the rest."
