"""A JSON config file (nanobot's, shared with the user) changed in place: each change spliced into the old text at its
value's span, so all else stays byte for byte; the result is parsed again and must equal the intended data."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64  # nanobot's config nests 5 deep; far deeper is not a config, and recursion has limits
WHITESPACE = re.compile(r"[ \t\n\r]*")
COLON = re.compile(r'"[ \t]*:([ \t]*)')
COMMA = re.compile(r',([ \t]*)[^ \t\r\n]')  # a comma followed on its line by the next item


class Unfaithful(Exception):
    """The file cannot be read, or changed without rewriting what was not asked; the message says why."""


class Member(NamedTuple):
    """One `"key": value` of an object in the text: where the member starts and where its value lies."""

    key: str
    start: int
    value_start: int
    value_end: int


def read_regular_file(path: Path, limit: int = MAX_BYTES) -> bytes:
    """The bytes of *path* (links followed) if it is a regular file of at most *limit* bytes; Unfaithful if not
    (a FIFO cannot hang it, nor a device fill memory)."""
    from nanobotd import fsio  # here: its imports would slow every other nanobotctl command

    try:
        handle = fsio.open_regular(path, follow=True)
    except fsio.NotRegularFile:
        raise Unfaithful(f"{path} is a {fsio.file_kind(os.stat(path).st_mode)}, not a regular file") from None
    with handle:
        if os.fstat(handle.fileno()).st_size > limit:
            raise Unfaithful(f"{path} is larger than {limit} bytes")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise Unfaithful(f"{path} grew past {limit} bytes while it was read")
    return data


def parse_strictly(text: str) -> Any:
    """The JSON value of *text*; Unfaithful for what a rewrite could not keep: duplicate keys, numbers that
    overflow to Infinity, NaN, lone surrogates, nesting deeper than MAX_DEPTH; or what is not JSON at all."""
    try:
        value = json.loads(text, object_pairs_hook=unique_keys, parse_float=finite_float,
                           parse_constant=non_finite)
    except RecursionError:
        raise Unfaithful(f"it nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # Unfaithful from the hooks is no ValueError: it passes through as it is
        raise Unfaithful(f"it is not JSON ({exc})") from None
    check_depth_and_text(value)
    return value


def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        duplicate = next(key for key in keys if keys.count(key) > 1)
        raise Unfaithful(f"the key {duplicate!r} appears twice in one object (JSON readers keep only one of them)")
    return dict(pairs)


def finite_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise Unfaithful(f"the number {text[:40]} is too large for a 64-bit float; it would be written back "
                         "as Infinity, which is not JSON")
    return number


def non_finite(text: str) -> float:
    raise Unfaithful(f"it holds {text}, which is not JSON")


def check_depth_and_text(value: Any) -> None:
    """Unfaithful for nesting deeper than MAX_DEPTH or a lone surrogate in a key or string."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise Unfaithful(f"it nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            pending.extend((key, depth) for key in item)
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise Unfaithful(f"the string {ascii(item)[:60]} holds a lone surrogate, which is not text") \
                    from None


# -- splicing ----------------------------------------------------------------------------------------

def splice(text: str, old: dict, new: dict) -> str:
    """*text* (whose value is *old*) changed to hold *new*, rewriting only the members that differ."""
    style = Style.of(text)
    start = WHITESPACE.match(text).end()
    edits = object_edits(text, start, old, new, style)
    for edit_start, edit_end, replacement in sorted(edits, reverse=True):
        text = text[:edit_start] + replacement + text[edit_end:]
    if json.loads(text) != new:
        raise Unfaithful("changing only the keys concerned did not give the intended config")
    return text


class Style(NamedTuple):
    """How the file writes JSON: line ending, one level of indentation, what follows a colon and a comma
    between items on one line (a guess from the first of each; the result is checked by parsing it)."""

    newline: str
    indent: str
    after_colon: str
    after_comma: str

    @classmethod
    def of(cls, text: str) -> Style:
        newline = "\r\n" if "\r\n" in text else "\n"
        indent = next((line[:len(line) - len(line.lstrip(" \t"))] for line in text.splitlines()[1:]
                       if line.strip() and line[0] in " \t"), "  ")
        colon, comma = COLON.search(text), COMMA.search(text)
        return cls(newline, indent, colon.group(1) if colon else " ", comma.group(1) if comma else " ")


def object_edits(text: str, start: int, old: dict, new: dict, style: Style) -> list[tuple[int, int, str]]:
    """(start, end, replacement) edits turning the object at *start* from *old* into *new*."""
    members = scan_members(text, start)
    end = WHITESPACE.match(text, members[-1].value_end if members else start + 1).end() + 1
    if any(key not in new for key in old):  # a removal: this one object is written anew, in the file's style
        return [(start, end, render(new, line_indent(text, start), style, compact(text, start, end, old)))]
    edits = []
    for member in members:
        before, after = old[member.key], new[member.key]
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict):
            edits += object_edits(text, member.value_start, before, after, style)
        else:
            layout = compact(text, member.value_start, member.value_end, before)
            edits.append((member.value_start, member.value_end,
                          render(after, line_indent(text, member.start), style, layout)))
    added = {key: value for key, value in new.items() if key not in old}
    if added and members:
        last = members[-1]
        layout, indent = compact(text, start, end, old), line_indent(text, last.start)
        separator = f",{style.after_comma}" if layout else f",{style.newline}{indent}"
        edits.append((last.value_end, last.value_end, separator + separator.join(
            f"{json.dumps(key, ensure_ascii=False)}:{style.after_colon}{render(value, indent, style, layout)}"
            for key, value in added.items())))
    elif added:
        edits.append((start, end, render(added, line_indent(text, start), style, compact(text, start, end, old))))
    return edits


def compact(text: str, start: int, end: int, old: Any) -> bool:
    """Whether a value replacing text[start:end] (which held *old*) goes on one line: a non-empty array or
    object keeps its layout, anything else takes the whole file's."""
    if not (isinstance(old, (dict, list)) and old):
        start, end = 0, len(text.rstrip())
    return "\n" not in text[start:end] and "\r" not in text[start:end]


def render(value: Any, indent: str, style: Style, compact: bool) -> str:
    """*value* as JSON in the file's style, its lines after the first indented from *indent*."""
    if compact or not isinstance(value, (dict, list)) or not value:
        return json.dumps(value, ensure_ascii=False, separators=(f",{style.after_comma}", f":{style.after_colon}"))
    text = json.dumps(value, ensure_ascii=False, indent=style.indent, separators=(",", f":{style.after_colon}"))
    return text.replace("\n", style.newline + indent)


def scan_members(text: str, start: int) -> list[Member]:
    """The members of the object whose `{` is at *start*, with their spans, found by json's own scanner."""
    decoder = json.JSONDecoder()
    members, position = [], WHITESPACE.match(text, start + 1).end()
    if text[position] == "}":
        return members
    while True:
        key, after_key = decoder.raw_decode(text, position)
        value_start = WHITESPACE.match(text, WHITESPACE.match(text, after_key).end() + 1).end()
        _, value_end = decoder.raw_decode(text, value_start)
        members.append(Member(key, position, value_start, value_end))
        position = WHITESPACE.match(text, value_end).end()
        if text[position] == "}":
            return members
        position = WHITESPACE.match(text, position + 1).end()  # past the comma


def line_indent(text: str, position: int) -> str:
    """The whitespace that starts the line holding *position*."""
    line_start = text.rfind("\n", 0, position) + 1
    line = text[line_start:position]
    return line[:len(line) - len(line.lstrip(" \t"))]
