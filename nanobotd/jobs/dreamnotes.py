"""What the dream has read of the daily notes (the dream marks it, the audit reports on it), and the caps it
keeps the bootstrap files under."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from loguru import logger

from nanobotd import fsio
from nanobotd.config.schema import ContextSettings
from nanobotd.memory.dailynote import ARCHIVE_DIR_NAME, NoteBullet, note_bullets

DREAM_NOTES_NAME = ".dream_notes.json"  # in memory/, beside .dream_cursor: the note bullets the dream has read


def read_dream_notes(memory_dir: Path) -> dict[str, set[str]]:
    """{note day: digests of its bullets the dream has read}; a missing or unreadable file means none read."""
    path = memory_dir / DREAM_NOTES_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        logger.warning("{} is unreadable ({}); the dream reads every note bullet again", path, exc)
        return {}
    notes = data.get("notes") if isinstance(data, dict) else None
    if not isinstance(notes, dict):
        return {}
    return {day: {digest for digest in digests if isinstance(digest, str)}
            for day, digests in notes.items() if isinstance(digests, list)}


def mark_dream_notes(memory_dir: Path, digests: Mapping[str, Iterable[str]], *, read: bool) -> None:
    """Mark note bullets read (a dream applied them) or unread again (its roll-back or restore). Days whose note is gone
    (expired from the archive) are dropped, so the file stays small."""
    before = read_dream_notes(memory_dir)
    state = {day: set(found) for day, found in before.items()}
    for day, day_digests in digests.items():
        if read:
            state.setdefault(day, set()).update(day_digests)
        elif day in state:
            state[day].difference_update(day_digests)
    kept = {day: sorted(found) for day, found in sorted(state.items()) if found and _note_exists(memory_dir, day)}
    path = memory_dir / DREAM_NOTES_NAME
    if not kept:
        path.unlink(missing_ok=True)  # nothing read: as before the first dream that read a note
    elif kept != {day: sorted(found) for day, found in sorted(before.items())}:
        fsio.atomic_write(path, json.dumps({"notes": kept}, indent=1) + "\n")


def _note_exists(memory_dir: Path, day: str) -> bool:
    return (memory_dir / f"{day}.md").exists() or (memory_dir / ARCHIVE_DIR_NAME / f"{day}.md").exists()


def unread_note_bullets(memory_dir: Path) -> list[NoteBullet]:
    """The note bullets the dream has not read yet, oldest day first, each text once per day."""
    read = read_dream_notes(memory_dir)
    unread, seen = [], set()
    for bullet in note_bullets(memory_dir):
        key = (bullet.day.isoformat(), bullet.digest)
        if key not in seen and bullet.digest not in read.get(key[0], ()):
            seen.add(key)
            unread.append(bullet)
    return unread


def cap_overruns(sizes: Mapping[str, int], caps: ContextSettings) -> list[str]:
    """What is over the caps (each file, then the files together), as lines for people; empty when all fit."""
    lines = [f"{path} is {size:,} characters, over its cap of {caps.max_chars:,} (context.max_chars)"
             for path, size in sizes.items() if size > caps.max_chars]
    total = sum(sizes.values())
    if total > caps.total_max_chars:
        lines.append(f"{', '.join(sizes)} are {total:,} characters together, over their joint cap of"
                     f" {caps.total_max_chars:,} (context.total_max_chars)")
    return lines
