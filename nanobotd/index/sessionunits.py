"""Session transcripts as index units: overlapping windows of consecutive messages, sized in characters.

A window holds messages until their lines reach WINDOW characters, and a new one starts every STRIDE
characters (positions count the file's records other than metadata, 0-based), so a window is about as
long whatever the messages are: four LoCoMo turns, ten short chat messages, one long answer. Windows
counted in messages (four, every two) showed ten short chat messages only 310 words in the top 10
(scripts/bench_locomo.py --chat); the sizes were chosen on LoCoMo, its chat form and LongMemEval together.
The size of a message is told from its line's bytes less LINE_OVERHEAD, so laying out the windows
decodes nothing.

A window's key is a digest of the raw bytes of its lines, so re-reading a changed 100,000-message
session only hashes the lines; only windows whose key is new are decoded and indexed (after an append
that is the last one or two). Slash commands (`_command`), nanobot's checkpoint prompts
(`_hidden_history`: fixed boilerplate, its summary goes to history.jsonl), tool output and the agent's
calls of nanobotd's own memory tools are not conversation and are left out of the text.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from nanobotd.index.timeintent import dates_column, event_days
from nanobotd.index.units import Unit, iso_seconds, parse_timestamp
from nanobotd.sessions.file import (
    RawLine,
    SessionHeader,
    is_metadata_line,
    iter_raw_lines,
    key_from_filename,
    message_fields,
    read_header,
)
from nanobotd.tuning import LINE_OVERHEAD, MAX_MESSAGES, STRIDE, WINDOW

MAX_MESSAGE_CHARS = 2000
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
                record = decode_line(line)
                if record is not None and record.get("_type") == "metadata":
                    read_header(record, header)
    except OSError:
        return None
    return header.key


def is_skipped_session(key: str | None) -> bool:
    """nanobot's own dream turns are not conversation."""
    return bool(key) and key.startswith("dream:")


def decode_line(line: RawLine) -> dict | None:
    """The JSON object on a line; undecodable bytes are replaced, never fatal."""
    if line.data is None:
        return None
    try:
        record = json.loads(line.data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def session_units(
    path: Path, session_key: str | None, known: set[str], *, window: int = WINDOW, stride: int = STRIDE
) -> Iterator[tuple[str, Unit | None]]:
    """(key, unit) for every window of the session; the unit is None when *known* holds the key."""
    stride = max(1, min(stride, window))
    recent: deque[RawLine] = deque()  # the lines from the oldest window still filling on, from position *held*
    # Windows overlap: a message is read once for all the windows that hold it.
    messages: dict[int, Message | None] = {}
    starts: deque[tuple[int, int]] = deque()  # (position, characters before it) of each window still filling
    total = last_end = position = newest = -1
    first, held = (0, 0), 0  # the oldest window still filling; the position of recent[0]
    for line in iter_raw_lines(path):
        if is_metadata_line(line):
            continue
        position += 1
        if newest < 0 or total - starts[-1][1] >= stride or position - newest >= MAX_MESSAGES // 2:
            starts.append((position, total))
            newest = position
            first = starts[0]
        data = line.data  # its size told from its bytes: laying the windows out decodes nothing
        if data is not None and len(data) > LINE_OVERHEAD and b'"_' not in data and b'"tool"' not in data:
            total += len(data) - LINE_OVERHEAD  # not a _command, _hidden_history or tool line
        recent.append(line)
        while total - first[1] >= window or position - first[0] >= MAX_MESSAGES - 1:
            yield _window(list(enumerate(recent, held)), session_key, known, messages)
            last_end = position
            starts.popleft()
            if not starts:
                newest, held = -1, position + 1
                recent.clear()
                break
            first = starts[0]
            while held < first[0]:
                recent.popleft()
                held += 1
    if newest >= 0 and last_end < position:
        yield _window(list(enumerate(recent, held)), session_key, known, messages)


def _window(items: list[tuple[int, RawLine]], session_key: str | None, known: set[str],
            messages: dict[int, Message | None]) -> tuple[str, Unit | None]:
    start, end = items[0][0], items[-1][0]
    digest = hashlib.blake2b("".join(line.line_digest for _, line in items).encode(), digest_size=12).hexdigest()
    key = f"{start}-{end}-{digest}"
    if key in known:
        return key, None
    for position in [position for position in messages if position < start]:
        del messages[position]
    return key, _decode_window(key, items, session_key, messages)


@dataclass(frozen=True)
class Message:
    """One message as windows show it: its text, when it was said, and the days it is dated by."""

    text: str
    when: str
    days: tuple[date, ...]


def read_message(line: RawLine) -> Message | None:
    """The message on a line, or None for what is not conversation."""
    record = decode_line(line)
    rendered = render_message(record) if record is not None else None
    if rendered is None:
        return None
    text, timestamp = rendered
    moment = parse_timestamp(timestamp)
    own = [moment.date()] if moment else []
    return Message(text, iso_seconds(moment) if moment else timestamp,
                   tuple(dict.fromkeys(own + event_days(text, moment))))


def _decode_window(key: str, items: list[tuple[int, RawLine]], session_key: str | None,
                   messages: dict[int, Message | None]) -> Unit:
    texts, parts, days = [], [], []
    offset = 0
    first_when = ""
    for position, line in items:
        if position not in messages:
            messages[position] = read_message(line)
        message = messages[position]
        if message is None:
            continue
        text, when = message.text, message.when
        first_when = first_when or when
        days += message.days
        parts.append((position, offset, when))
        texts.append(text)
        offset += len(text) + 1
    return Unit(key, "session", items[0][0], items[-1][0], "\n".join(texts), first_when, dates_column(tuple(days)),
                session_key, tuple(parts))


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
