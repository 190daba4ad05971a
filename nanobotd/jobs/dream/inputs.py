"""What a dream reads: history entries after `.dream_cursor` and daily-note bullets it has not read yet, both in
batches, oldest first, so a later correction follows the fact it corrects; note bullets are tracked one by one."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from nanobotd.jobs.dreamnotes import unread_note_bullets
from nanobotd.memory.dailynote import NoteBullet
from nanobotd.memory.history import HistoryEntry, iter_entries

ENTRY_SHOWN_CHARS = 8_000  # the prompt shows at most this much of one history entry
NOTE_ITEM_CHARS = ENTRY_SHOWN_CHARS
END_OF_DAY = " 24:00"  # a day's note sorts after that day's history entries: it grows all day long


@dataclass(frozen=True)
class NoteItem:
    """New bullets of one daily note; a long note is split into several items so that none is cut."""

    day: date
    bullets: tuple[NoteBullet, ...]

    @property
    def size(self) -> int:
        """Characters the item takes in the prompt (about)."""
        return sum(map(_bullet_size, self.bullets))


@dataclass
class Batch:
    """What one analysis and edit loop of the dream reads."""

    entries: list[HistoryEntry] = field(default_factory=list)
    notes: list[NoteItem] = field(default_factory=list)

    def note_digests(self) -> dict[str, list[str]]:
        """{note day: digests of the bullets in this batch}, what the run marks read once the batch completes."""
        digests: dict[str, list[str]] = {}
        for item in self.notes:
            digests.setdefault(item.day.isoformat(), []).extend(bullet.digest for bullet in item.bullets)
        return digests

    def describe(self) -> dict:
        """The batch for the run's manifest: its history entries (first, last) and bullets per note."""
        counts = {day: len(digests) for day, digests in self.note_digests().items()}
        entries = [self.entries[0].cursor, self.entries[-1].cursor] if self.entries else None
        return {"entries": entries, "note_bullets": counts}


@dataclass
class Backlog:
    """Everything not dreamt yet, oldest first; batches are taken from its front."""

    entries: list[HistoryEntry]
    notes: list[NoteItem]

    def __bool__(self) -> bool:
        return bool(self.entries or self.notes)

    def next_batch(self, limit: int, char_budget: int) -> Batch:
        """Up to *limit* items (entries or note items) from the front, within a prompt-size budget."""
        batch, used = Batch(), 0
        # heapq.merge only ever takes the head of each sequence, so entries keep their cursor order.
        for item in heapq.merge(self.entries, self.notes, key=_item_time):
            size = item.size if isinstance(item, NoteItem) else min(len(item.content), ENTRY_SHOWN_CHARS)
            count = len(batch.entries) + len(batch.notes)
            if count >= max(1, limit) or (count and used + size > char_budget):
                break
            (batch.notes if isinstance(item, NoteItem) else batch.entries).append(item)
            used += size
        return batch

    def consume(self, batch: Batch) -> None:
        """Drop a completed batch: it was taken from the front of both sequences."""
        self.entries = self.entries[len(batch.entries):]
        self.notes = self.notes[len(batch.notes):]

    def left(self) -> dict:
        """What is still to dream, for the manifest of a run that stopped early."""
        return {"history_entries": len(self.entries),
                "note_bullets": sum(len(item.bullets) for item in self.notes)}


def _item_time(item: HistoryEntry | NoteItem) -> str:
    return item.day.isoformat() + END_OF_DAY if isinstance(item, NoteItem) else item.timestamp


def read_backlog(memory_dir: Path, after: int) -> Backlog:
    """The history entries after cursor *after* (streamed: only those are kept) and the unread note bullets."""
    entries = sorted((entry for entry in iter_entries(memory_dir) if entry.cursor > after),
                     key=lambda entry: entry.cursor)
    return Backlog(entries, note_items(unread_note_bullets(memory_dir)))


def note_items(bullets: list[NoteBullet]) -> list[NoteItem]:
    """Group bullets (oldest day first) into items of one day each, at most NOTE_ITEM_CHARS long."""
    items: list[NoteItem] = []
    current: list[NoteBullet] = []
    size = 0
    for bullet in bullets:
        if current and (current[0].day != bullet.day or size + _bullet_size(bullet) > NOTE_ITEM_CHARS):
            items.append(NoteItem(current[0].day, tuple(current)))
            current, size = [], 0
        current.append(bullet)
        size += _bullet_size(bullet)
    if current:
        items.append(NoteItem(current[0].day, tuple(current)))
    return items


def _bullet_size(bullet: NoteBullet) -> int:
    # The bullet itself, its "- " and line break, and its section's heading when the section changes.
    return len(bullet.text) + len(bullet.section) + 8
