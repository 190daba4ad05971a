"""Session transcripts as index units: overlapping windows of consecutive messages, sized in characters.

A window holds messages up to WINDOW characters and one starts every STRIDE (positions: the file's records but
metadata, 0-based), so windows are alike whatever the messages; windows counted in messages did worse
(scripts/bench_locomo.py --chat). Sizes come from line bytes less LINE_OVERHEAD and keys are digests of raw lines, so
laying out windows decodes nothing and a re-read only hashes: only windows with new keys are decoded and indexed.
Slash commands, checkpoint prompts (`_hidden_history`), tool output and calls of nanobotd's own memory tools are not
conversation and are left out."""

from __future__ import annotations

import hashlib
import json
import os
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from itertools import accumulate
from pathlib import Path

from nanobotd import fsio
from nanobotd.index.timeintent import dates_column, event_days
from nanobotd.index.units import Unit, iso_seconds, parse_timestamp
from nanobotd.sessions.file import (
    MAX_LINE_BYTES,
    SessionHeader,
    is_metadata_line,
    iter_raw_lines,
    key_from_filename,
    message_fields,
    read_header,
)
from nanobotd.tuning import LINE_OVERHEAD, MAX_MESSAGES, READ_CHUNK, STRIDE, WINDOW

MAX_MESSAGE_CHARS = 2000
OVERSIZED = b"\x00"  # stands for a line too long to read: it keeps its place and is no message
INDEXED_ROLES = ("user", "assistant")
HEADER_PROBE_LINES = 8
# nanobotd's own memory tools as nanobot names them (mcp_<server>_memory_search, ...): their calls and
# results are the agent looking memory up, not memory; indexed, a failed lookup outranks the fact it missed.
MEMORY_TOOL = re.compile(r"^mcp_.+_memory_(search|context|recall)$")


def session_key_for(path: Path) -> str | None:
    """The session key: from the file name, or from the metadata record of a legacy-named file."""
    key = key_from_filename(path)
    if key is not None:
        return key
    header = SessionHeader()
    try:
        for count, line in enumerate(iter_raw_lines(path)):
            if count >= HEADER_PROBE_LINES:
                break
            if is_metadata_line(line):
                record = decode_line(line.data)
                if record is not None and record.get("_type") == "metadata":
                    read_header(record, header)
    except OSError:
        return None
    return header.key


def is_skipped_session(key: str | None) -> bool:
    """nanobot's own dream turns are not conversation."""
    return bool(key) and key.startswith("dream:")


def decode_line(data: bytes | None) -> dict | None:
    """The JSON object on a line's bytes; undecodable bytes are replaced, never fatal."""
    if data is None:
        return None
    try:
        record = json.loads(data.decode("utf-8-sig", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def session_units(
    path: Path, session_key: str | None, known: set[str], *, window: int = WINDOW, stride: int = STRIDE
) -> Iterator[tuple[str, Unit | None]]:
    """(key, unit) for every window of the session; the unit is None when *known* holds the key."""
    stride = max(1, min(stride, window))
    held: list[bytes] = []  # the lines from position *base* on: those of the windows not closed yet
    base, last_end = 0, -1
    # Windows overlap: a message is read once for all the windows that hold it.
    messages: dict[int, Message | None] = {}
    for lines in _message_lines(path):
        held += lines
        closed, carried = window_spans(_sizes(held), window, stride)
        for first, last in closed:
            yield _window(held[first:last + 1], base + first, session_key, known, messages)
            last_end = base + last
        del held[:carried]
        base += carried
    if held and last_end < base + len(held) - 1:
        yield _window(held, base, session_key, known, messages)


def _message_lines(path: Path) -> Iterator[list[bytes]]:
    """The file's non-blank, non-metadata lines, stripped, a chunk at a time up to its size at the open (OVERSIZED for
    one over MAX_LINE_BYTES). bytes.split per chunk, not per line: a refresh after an append re-reads the session."""
    with fsio.open_regular(path) as handle:
        remaining = os.fstat(handle.fileno()).st_size
        rest, skipping = b"", False
        while remaining > 0 and (chunk := handle.read(min(READ_CHUNK, remaining))):
            remaining -= len(chunk)
            pieces = chunk.split(b"\n")
            if skipping:
                if len(pieces) == 1:
                    continue
                pieces[0], skipping = OVERSIZED, False
            else:
                pieces[0] = rest + pieces[0]
            rest = pieces.pop()
            if len(rest) > MAX_LINE_BYTES:
                rest, skipping = b"", True
            yield _kept(pieces)
        if skipping:
            yield [OVERSIZED]
        elif rest:
            yield _kept([rest])


def _kept(pieces: list[bytes]) -> list[bytes]:
    lines = [piece.strip() if len(piece) <= MAX_LINE_BYTES else OVERSIZED for piece in pieces]
    return [line for line in lines if line and b'"_type"' not in line[:64]]


def _sizes(lines: list[bytes]) -> list[int]:
    """Characters before each line and after the last: a message's size is told from its bytes (none for
    _command, _hidden_history and tool lines), so laying the windows out decodes nothing."""
    # b"_" first: one byte is found at memchr's speed, and most lines hold none.
    return [0, *accumulate([len(line) - LINE_OVERHEAD if len(line) > LINE_OVERHEAD
                            and not (b"_" in line and b'"_' in line) and b'"tool"' not in line else 0
                            for line in lines])]


def window_spans(before: list[int], window: int, stride: int) -> tuple[list[tuple[int, int]], int]:
    """The (first, last) positions of windows closing within these lines (the first starting at 0), and where the first
    unclosed one starts (len(before) - 1 if none). *before*: characters before each line; a window closes at *window*
    characters or MAX_MESSAGES lines, the next starting *stride* characters or half as many lines after it."""
    count, start, closed = len(before) - 1, 0, []
    while start < count:
        last = min(bisect_left(before, before[start] + window, start + 1) - 1, start + MAX_MESSAGES - 1)
        if last >= count:
            break
        closed.append((start, last))
        start = min(bisect_left(before, before[start] + stride, start + 1), start + MAX_MESSAGES // 2)
    return closed, start


def _window(lines: list[bytes], start: int, session_key: str | None, known: set[str],
            messages: dict[int, Message | None]) -> tuple[str, Unit | None]:
    digest = hashlib.blake2b(b"\n".join(lines), digest_size=12).hexdigest()
    key = f"{start}-{start + len(lines) - 1}-{digest}"
    if key in known:
        return key, None
    for position in [position for position in messages if position < start]:
        del messages[position]
    texts, parts, days = [], [], []
    offset = 0
    first_when = ""
    for position, line in enumerate(lines, start):
        if position not in messages:
            messages[position] = read_message(line)
        message = messages[position]
        if message is None:
            continue
        first_when = first_when or message.when
        days += message.days
        parts.append((position, offset, message.when))
        texts.append(message.text)
        offset += len(message.text) + 1
    return key, Unit(key, "session", start, start + len(lines) - 1, "\n".join(texts), first_when,
                     dates_column(tuple(days)), session_key, tuple(parts))


@dataclass(frozen=True)
class Message:
    """One message as windows show it: its text, when it was said, and the days it is dated by."""

    text: str
    when: str
    days: tuple[date, ...]


def read_message(data: bytes) -> Message | None:
    """The message on a line's bytes, or None for what is not conversation."""
    record = decode_line(data)
    rendered = render_message(record) if record is not None else None
    if rendered is None:
        return None
    text, timestamp = rendered
    moment = parse_timestamp(timestamp)
    own = [moment.date()] if moment else []
    return Message(text, iso_seconds(moment) if moment else timestamp,
                   tuple(dict.fromkeys(own + event_days(text, moment))))


def is_memory_lookup(record: dict) -> bool:
    """A tool call (with the words the agent said around it) or a tool result of nanobotd's memory tools."""
    if record.get("role") == "tool":
        return isinstance(record.get("name"), str) and bool(MEMORY_TOOL.match(record["name"]))
    calls = record.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return False
    names = [(call.get("function") or {}).get("name") if isinstance(call, dict) else None for call in calls]
    return all(isinstance(name, str) and MEMORY_TOOL.match(name) for name in names)


def render_message(record: dict) -> tuple[str, str] | None:
    """"label: text" for a conversation message, or None for what is not conversation."""
    if record.get("_command") or record.get("_hidden_history") or is_memory_lookup(record):
        return None
    fields = message_fields(record)
    if fields is None:
        return None
    role, text, timestamp = fields
    text = text.strip()
    if role not in INDEXED_ROLES or not text:
        return None
    name = record.get("name")
    label = name.strip() if isinstance(name, str) and name.strip() else role
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + " …"
    return f"{label}: {text}", timestamp
