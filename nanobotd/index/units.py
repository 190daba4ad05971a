"""Turn memory files and history.jsonl into index units: small, located, dated pieces of text.
A unit is what one hit shows: a `##` section (long ones cut on line boundaries) or a few lines of a history entry;
its key changes with its text or place, so a refresh indexes only units whose key is new."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

from nanobotd.index.timeintent import dates_column, event_days
from nanobotd.memory import dailynote
from nanobotd.memory.history import parse_entry
from nanobotd.sessions.file import iter_raw_lines
from nanobotd.tuning import HISTORY_UNIT_CHARS, MAX_UNIT_CHARS

SECTION_HEADING = re.compile(r"^##(?!#)\s*\S")
FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Unit:
    """One piece of indexed text and where it lives (the fields' units are noted beside them)."""

    key: str
    source: str
    start: int  # start/end: inclusive; 1-based lines (files, history.jsonl), 0-based message positions (sessions)
    end: int
    text: str
    when: str = ""
    dates: str = ""
    session_key: str | None = None
    parts: tuple = ()  # session windows: [position, char offset, timestamp] per message, to trim overlaps


def text_digest(text: str) -> str:
    """A short digest naming a piece of text."""
    return hashlib.blake2b(text.encode("utf-8", errors="replace"), digest_size=12).hexdigest()


def iso_seconds(moment: datetime) -> str:
    """ISO text to the second: what a hit's `when` shows."""
    return moment.replace(microsecond=0).isoformat()


def parse_timestamp(text: str) -> datetime | None:
    """A nanobot timestamp (ISO, or history's "%Y-%m-%d %H:%M"), or None."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.replace(tzinfo=None) if moment.tzinfo else moment


def note_date(path: Path) -> date | None:
    """The day a daily note (memory/YYYY-MM-DD.md) is about, from its name."""
    try:
        return dailynote.note_date(path.name)
    except dailynote.NoteError:
        return None


def markdown_units(text: str, source: str, when: str = "", day: date | None = None) -> list[Unit]:
    """The `##` sections of a markdown file (and any preamble with content), each cut to size, dated by
    *day* (a daily note's) and the days each piece names (relative ones read from *day*)."""
    lines = text.splitlines()
    units: list[Unit] = []
    used: set[str] = set()
    for start, end in _section_ranges(lines):
        section = lines[start - 1:end]
        if not any(line.strip() and not line.lstrip().startswith("#") for line in section):
            continue
        heading = section[0] if SECTION_HEADING.match(section[0]) else ""
        for chunk_start, chunk_end, chunk in _chunks(section, start, heading):
            key = f"{chunk_start}-{chunk_end}-{text_digest(chunk)}"
            if key in used:
                key = f"{key}-{len(used)}"
            used.add(key)
            units.append(Unit(key, source, chunk_start, chunk_end, chunk, when, unit_dates(chunk, day)))
    return units


def history_units(path: Path, known: set[str]) -> Iterator[tuple[str, Unit | None]]:
    """(key, unit) for every entry of history.jsonl; the unit is None when *known* holds its key already.
    Keyed by line number and line digest: an appended entry costs one parse, an untouched file only hashing."""
    for line in iter_raw_lines(path):
        if line.data is None:
            continue
        first_key = f"{line.number}-{line.line_digest}-0"
        if first_key in known:
            yield from _known_history_keys(line.number, line.line_digest, known)
            continue
        entry = parse_entry(line.data.decode("utf-8-sig", errors="replace"), line.number)  # a BOM an editor saved
        if entry is None or not entry.content.strip():
            continue
        moment = parse_timestamp(entry.timestamp)
        when = iso_seconds(moment) if moment else entry.timestamp
        pieces = _chunks(entry.content.splitlines(), line.number, "", HISTORY_UNIT_CHARS)
        dates = unit_dates(entry.content, moment)  # the entry's, for each piece: read once
        for index, (_, _, chunk) in enumerate(pieces):
            key = f"{line.number}-{line.line_digest}-{index}"
            yield key, Unit(key, "history", line.number, line.number, chunk, when, dates, entry.session_key)


def unit_dates(text: str, said: date | datetime | None) -> str:
    """The `dates` column of a piece written at *said*: that day, then each day it names."""
    own = [said.date() if isinstance(said, datetime) else said] if said else []
    return dates_column(tuple(own + event_days(text, said)))


def _known_history_keys(number: int, digest: str, known: set[str]) -> Iterator[tuple[str, None]]:
    index = 0
    while f"{number}-{digest}-{index}" in known:
        yield f"{number}-{digest}-{index}", None
        index += 1


def _section_ranges(lines: list[str]) -> list[tuple[int, int]]:
    """1-based inclusive line ranges: the preamble, then one per `##` heading (fenced code ignored)."""
    starts = [1]
    fenced = False
    for number, line in enumerate(lines, start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and SECTION_HEADING.match(line) and number > 1:
            starts.append(number)
    ends = [start - 1 for start in starts[1:]] + [len(lines)]
    ranges = []
    for start, end in zip(starts, ends, strict=True):
        # Blank lines at the edges belong to no section: appending a section must not move the previous one.
        while start <= end and not lines[start - 1].strip():
            start += 1
        while end >= start and not lines[end - 1].strip():
            end -= 1
        if end >= start:
            ranges.append((start, end))
    return ranges


def _chunks(lines: list[str], first_line: int, heading: str,
            max_chars: int = MAX_UNIT_CHARS) -> list[tuple[int, int, str]]:
    """Cut *lines* into pieces of at most MAX_UNIT_CHARS, later ones repeating the heading; a single longer line
    (a 10 MB line without newlines) becomes several pieces, all pointing at that line."""
    pieces: list[tuple[int, int, str]] = []
    buffer: list[str] = []
    body_count = size = 0
    buffer_start = buffer_end = first_line
    for number, line in enumerate(lines, start=first_line):
        for fragment in _split_long(line):
            if body_count and size + len(fragment) + 1 > max_chars:
                pieces.append((buffer_start, buffer_end, "\n".join(buffer)))
                buffer, size, body_count = ([heading] if heading else []), len(heading) + 1, 0
                buffer_start = number
            buffer.append(fragment)
            size += len(fragment) + 1
            body_count += 1
            buffer_end = number
    if body_count:
        pieces.append((buffer_start, buffer_end, "\n".join(buffer)))
    return [piece for piece in pieces if piece[2].strip()]


def _split_long(line: str) -> list[str]:
    if len(line) <= MAX_UNIT_CHARS:
        return [line]
    step = MAX_UNIT_CHARS - 100
    return [line[offset:offset + step] for offset in range(0, len(line), step)]
