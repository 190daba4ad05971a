"""How nanobotctl shows the daemon's answers: pure functions from JSON values to lines, testable on plain data."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Columns = Sequence[tuple[str, str]]
# C0 and C1 controls, DEL and the bidi overrides: a session key or file name holding them would move the
# cursor, recolour or rewrite the user's terminal, or reorder what it shows.
CONTROL_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """*text* with every control character shown as an escape (`\x1b`), so the terminal prints it, not obeys it."""
    return CONTROL_CHARS.sub(_escape, text)


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def format_cell(value: Any) -> str:
    """A table or field value as short single-line text, so one value never breaks a row."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, dict):
        return ", ".join(f"{key}={format_cell(item)}" for key, item in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_cell(item) for item in value) or "-"
    return printable(" ".join(str(value).split()))


def format_table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """Plain aligned columns, numeric columns right-aligned, so the output reads in a terminal and in `cut`."""
    cells = [[format_cell(value) for value in row] for row in rows]
    numeric = [_is_numeric_column([row[index] for row in rows]) for index in range(len(headers))]
    widths = [max([len(header)] + [len(row[index]) for row in cells]) for index, header in enumerate(headers)]
    lines = []
    for row in [headers] + cells:
        parts = [text.rjust(width) if numeric[index] and row is not headers else text.ljust(width)
                 for index, (text, width) in enumerate(zip(row, widths, strict=False))]
        lines.append("  ".join(parts).rstrip())
    return lines


def format_rows(columns: Columns, items: Sequence[Mapping[str, Any]], empty: str) -> list[str]:
    """A table of *items* with one (title, key) per column, or the *empty* line when there is nothing."""
    if not items:
        return [empty]
    return format_table([title for title, _ in columns], [[item.get(key) for _, key in columns] for item in items])


def format_fields(data: Mapping[str, Any], indent: str = "") -> list[str]:
    """`key: value` lines, nested objects indented below their key, for answers about one thing."""
    width = max((len(str(key)) for key in data), default=0)
    lines = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            lines.append(f"{indent}{printable(str(key))}:")
            lines.extend(format_fields(value, indent + "  "))
        else:
            lines.extend(aligned([(printable(str(key)), format_cell(value))], indent, width=width))
    return lines


def aligned(rows: Columns, indent: str = "", mark: str = ":", width: int | None = None) -> list[str]:
    """`label: text` lines (`label  text` with mark " "), every text in one column *width* past the labels
    (default: the longest label's), so a block of figures reads down its column."""
    width = max((len(label) for label, _ in rows), default=0) if width is None else width
    return [f"{indent}{label + mark:<{width + 1}} {text}".rstrip() for label, text in rows]


def format_duration(seconds: Any) -> str:
    """3725 -> '1h 2m 5s': uptimes read better in units than in seconds."""
    if not isinstance(seconds, (int, float)):
        return format_cell(seconds)
    remaining, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if remaining >= size:
            parts.append(f"{remaining // size}{unit}")
            remaining %= size
    if remaining or not parts:
        parts.append(f"{remaining}s")
    return " ".join(parts)


def format_location(hit: Mapping[str, Any]) -> str:
    """Where a search hit lives, `path:L10-14` or `session KEY #3-8`, so a reader can open it."""
    if hit.get("session_key"):
        return printable(f"session {hit['session_key']}{span(' #', hit.get('message_start'), hit.get('message_end'))}")
    return printable(f"{hit.get('path') or '?'}{span(':L', hit.get('line_start'), hit.get('line_end'))}")


def _is_numeric_column(values: list[Any]) -> bool:
    present = [value for value in values if value not in (None, "")]
    return bool(present) and all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in present)


def span(prefix: str, start: Any, end: Any) -> str:
    """`<prefix>3-5`, `<prefix>3` or nothing, for a location that may have no range."""
    if start is None:
        return ""
    return f"{prefix}{start}" if end in (None, start) else f"{prefix}{start}-{end}"
