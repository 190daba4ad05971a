"""Messages on their way to memory: the pending-message type, prompt transcripts and [RAW] entries. [RAW] is nanobot's
format (NANOBOT-COMPAT.md), but split where nanobot truncates at 16,000 chars, so nothing is ever cut away."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

RAW_MAX_CHARS = 16_000
TOOL_ARGS_PREVIEW = 2_000


@dataclass(frozen=True)
class PendingMessage:
    """A conversation message not yet archived, as the spool keeps it."""

    digest: str
    role: str
    timestamp: str
    text: str
    tokens: int
    record: dict


def render_message(message: PendingMessage, max_chars: int | None = None) -> str:
    """One message as a transcript line: `[YYYY-MM-DDTHH:MM] ROLE: text` (+ tool calls)."""
    stamp = message.timestamp[:16] if message.timestamp else "?"
    text = message.text
    calls = message.record.get("tool_calls")
    if isinstance(calls, list) and calls:
        names = []
        for call in calls:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            arguments = str(function.get("arguments", ""))[:TOOL_ARGS_PREVIEW]
            names.append(f"{function.get('name', '?')}({arguments})")
        text = (text + "\n" if text else "") + "[tool calls] " + "; ".join(names)
    if message.role == "tool" and message.record.get("name"):
        text = f"[{message.record['name']}] {text}"
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + f" ... ({len(text) - max_chars} more chars)"
    return f"[{stamp}] {message.role.upper()}: {text}"


def transcript(messages: list[PendingMessage]) -> str:
    """The messages as a prompt transcript, one rendered message per paragraph."""
    return "\n".join(map(render_message, messages))


def raw_entries(messages: list[PendingMessage], max_chars: int = RAW_MAX_CHARS) -> list[str]:
    """[RAW] history entries holding every message in full, each at most *max_chars* (a longer message split
    across entries, marked `(part i/n)`)."""
    lines: list[str] = []
    for message in messages:
        line = render_message(message)
        budget = max_chars - 200
        if len(line) <= budget:
            lines.append(line)
            continue
        pieces = [line[start:start + budget] for start in range(0, len(line), budget)]
        lines.extend(f"(part {number}/{len(pieces)}) {piece}" for number, piece in enumerate(pieces, start=1))
    return packed_entries(lines, max_chars - 200, lambda chunk: f"[RAW] {len(chunk)} messages")


def packed_entries(lines: list[str], room: int, header: Callable[[list[str]], str]) -> list[str]:
    """*lines* packed in order into entries of at most *room* characters each, every entry its *header* line
    first, numbered `(part i of n)` when there are several."""
    entries: list[list[str]] = [[]]
    size = 0
    for line in lines:
        if entries[-1] and size + len(line) + 1 > room:
            entries.append([])
            size = 0
        entries[-1].append(line)
        size += len(line) + 1
    total = len(entries)
    return [header(chunk) + (f" (part {number} of {total})" if total > 1 else "") + "\n" + "\n".join(chunk)
            for number, chunk in enumerate(entries, start=1)]


def record_json(record: dict) -> str:
    """A spool record as compact JSON text."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))
