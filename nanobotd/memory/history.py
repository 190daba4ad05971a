"""memory/history.jsonl: read entries, append with safe cursor allocation, rewrite atomically; streamed (tens of MB).

nanobot appends with only an in-process lock, so every append takes an exclusive flock and re-reads the largest cursor:
next = max(.cursor, largest) + 1. Every write stays inside the workspace (the memory folder's parent)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, NamedTuple

from nanobotd import fsio
from nanobotd.jsontext import json_string
from nanobotd.tuning import HISTORY_LOCK_SECONDS as LOCK_TIMEOUT
from nanobotd.tuning import LATE_APPEND_POLL_SECONDS, LATE_APPEND_QUIET_SECONDS

HISTORY_NAME = "history.jsonl"
CURSOR_NAME = ".cursor"
DREAM_CURSOR_NAME = ".dream_cursor"
LOCK_NAME = ".history.lock"
ENTRY_HARD_CAP = 64_000
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M"
TAIL_BLOCK = 64 * 1024
# Entries nanobotd writes name the message range they archive, so a lost state DB can be rebuilt
# from the files; nanobot ignores unknown fields.
SPAN_FIELD = "nanobotd_span"
# Reasoning blocks some models put before their answer; every reader of a model reply strips them with this.
THINK_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>\s*", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class HistoryEntry:
    """One archived entry; *line* is its 1-based line number in the file when read."""

    cursor: int
    timestamp: str
    content: str
    session_key: str | None = None
    line: int = 0
    span: dict | None = None

    def to_record(self) -> dict:
        """The JSON object as nanobot writes it, plus the archive span of entries nanobotd wrote."""
        record = {"cursor": self.cursor, "timestamp": self.timestamp, "content": self.content}
        if self.session_key:
            record["session_key"] = self.session_key
        if self.span:
            record[SPAN_FIELD] = self.span
        return record

    def to_line(self) -> bytes:
        """The entry as one line of history.jsonl: `json.dumps(to_record(), ensure_ascii=False)`, encoded."""
        return entry_line(self.cursor, self.timestamp, _json_text(self.content).encode(), self.session_key, self.span)


class PreparedEntry(NamedTuple):
    """An entry's content cleaned, as its JSON string in UTF-8, with its content hash, ready before its append."""

    content_json: bytes
    hash: str


def entry_line(cursor: int, timestamp: str, content_json: bytes, session_key: str | None, span: dict | None) -> bytes:
    """One line of history.jsonl, its content already JSON: byte for byte what json.dumps of the record makes."""
    head = f'{{"cursor": {json.dumps(cursor)}, "timestamp": {_json_text(timestamp)}, "content": '
    tail = f', "session_key": {json.dumps(session_key, ensure_ascii=False)}' if session_key else ""
    if span:
        tail += f', "{SPAN_FIELD}": {json.dumps(span, ensure_ascii=False)}'
    return head.encode("utf-8") + content_json + (tail + "}\n").encode("utf-8")


def _json_text(value: object) -> str:
    return json_string(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def content_hash(content: str) -> str:
    """Identifies an entry we wrote (by its cleaned content), should its cursor be found after a crash."""
    return hashlib.sha1(clean_content(content).encode("utf-8")).hexdigest()[:16]


def prepare_entry(content: str) -> PreparedEntry | None:
    """*content* ready for append_prepared; None when nothing is left of it once cleaned (it is not appended)."""
    cleaned = clean_content(content)
    if not cleaned:
        return None
    return PreparedEntry(_json_text(cleaned).encode(), hashlib.sha1(cleaned.encode("utf-8")).hexdigest()[:16])


def history_path(memory_dir: Path) -> Path:
    """Where history.jsonl lives."""
    return memory_dir / HISTORY_NAME


def workspace_root(memory_dir: Path) -> Path:
    """The folder every memory write must stay in: the workspace holding memory/."""
    return memory_dir.parent


def clean_content(content: str) -> str:
    """Strip reasoning blocks and enforce the hard cap on one entry."""
    return THINK_BLOCK.sub("", content).strip()[:ENTRY_HARD_CAP]


def parse_entry(line: bytes | str, number: int = 0) -> HistoryEntry | None:
    """One history record, or None when the line is not a valid entry."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # deep nesting is garbage too, not a crash
        return None
    if not isinstance(record, dict):
        return None
    cursor = record.get("cursor")
    content = record.get("content")
    if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 1 or not isinstance(content, str):
        return None
    key = record.get("session_key")
    timestamp = record.get("timestamp")
    span = record.get(SPAN_FIELD)
    return HistoryEntry(cursor, timestamp if isinstance(timestamp, str) else "", content,
                        key if isinstance(key, str) else None, number, span if isinstance(span, dict) else None)


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of every non-blank line; nothing when the file is missing."""
    try:
        handle = fsio.open_regular(path, follow=True)
    except FileNotFoundError:
        return
    with handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line


def iter_history(memory_dir: Path) -> Iterator[tuple[int, HistoryEntry | None]]:
    """(line number, entry) of every non-blank line, one at a time; the entry is None when the line is unreadable."""
    for number, line in iter_lines(history_path(memory_dir)):
        yield number, parse_entry(line, number)


def iter_entries(memory_dir: Path) -> Iterator[HistoryEntry]:
    """Every valid entry in file order, one at a time."""
    yield from (entry for _, entry in iter_history(memory_dir) if entry is not None)


def lines_from_end(path: Path, block_bytes: int = TAIL_BLOCK, max_line_bytes: int | None = None) -> Iterator[bytes]:
    """Every non-blank line of *path*, the last first, read backwards a block at a time; nothing when missing.
    A line over *max_line_bytes* is skipped, never held whole."""
    try:
        handle = fsio.open_regular(path, follow=True)
    except FileNotFoundError:
        return
    with handle:
        position = handle.seek(0, 2)
        carry, skipping = b"", False
        while position > 0:
            start = max(0, position - block_bytes)
            handle.seek(start)
            lines = (handle.read(position - start) + carry).split(b"\n")
            position = start
            if skipping:  # the end of this block is the head of the oversized line
                if len(lines) == 1:
                    continue
                lines.pop()
                skipping = False
            # the first piece may be the tail of a line that began in the block before this one
            carry = lines.pop(0) if position > 0 else b""
            for line in reversed(lines):
                if line.strip() and (max_line_bytes is None or len(line) <= max_line_bytes):
                    yield line
            if max_line_bytes is not None and len(carry) > max_line_bytes:
                carry, skipping = b"", True


def largest_cursor_in_file(path: Path) -> int:
    """The largest cursor among the last TAIL_BLOCK bytes' parseable lines, further back until one parses
    (cursors only grow, so look at the tail)."""
    largest, seen = 0, 0
    for line in lines_from_end(path):
        seen += len(line) + 1
        entry = parse_entry(line)
        largest = max(largest, entry.cursor if entry else 0)
        if largest and seen >= TAIL_BLOCK:
            break
    return largest


def read_cursor_file(path: Path) -> int:
    """A plain decimal cursor file; missing or unreadable is 0."""
    try:
        with fsio.open_regular(path, follow=True) as handle:
            return max(0, int(handle.read(64).decode("utf-8").strip() or 0))
    except (OSError, ValueError):
        return 0


def read_dream_cursor(memory_dir: Path) -> int:
    """The last cursor consumed by dream."""
    return read_cursor_file(memory_dir / DREAM_CURSOR_NAME)


def append_entries(
    memory_dir: Path,
    contents: Iterable[tuple[str, str | None]],
    now: datetime,
    *,
    before_write: Callable[[list[int]], None] | None = None,
) -> list[HistoryEntry]:
    """Append (content, session_key) entries with fresh cursors; return what was written. *before_write* gets
    the cursors before any byte is written, so a caller journals them first (recovery knows what to look for)."""
    items = [(clean_content(content), key) for content, key in contents]
    items = [(content, key) for content, key in items if content]
    entries: list[HistoryEntry] = []

    def lines(start: int, stamp: str) -> Iterator[bytes]:
        entries.extend(HistoryEntry(start + offset, stamp, content, key)
                       for offset, (content, key) in enumerate(items))
        return (entry.to_line() for entry in entries)

    _append(memory_dir, len(items), now, lines, before_write)
    return entries


def append_prepared(memory_dir: Path, prepared: list[tuple[PreparedEntry, dict | None]], session_key: str | None,
                    now: datetime, *, before_write: Callable[[list[int]], None] | None = None) -> list[int]:
    """append_entries of contents prepared already (prepare_entry), each with its span; returns their cursors."""
    def lines(start: int, stamp: str) -> Iterator[bytes]:
        return (entry_line(start + offset, stamp, entry.content_json, session_key, span)
                for offset, (entry, span) in enumerate(prepared))

    start = _append(memory_dir, len(prepared), now, lines, before_write)
    return list(range(start, start + len(prepared)))


def _append(memory_dir: Path, count: int, now: datetime, lines: Callable[[int, str], Iterable[bytes]],
            before_write: Callable[[list[int]], None] | None) -> int:
    """Append the *count* lines *lines*(first cursor, timestamp) makes, under the history lock; the first cursor."""
    if not count:
        return 0
    root = workspace_root(memory_dir)
    fsio.confine(memory_dir, root).mkdir(parents=True, exist_ok=True)
    path = history_path(memory_dir)
    with fsio.file_lock(memory_dir / LOCK_NAME, timeout=LOCK_TIMEOUT, root=root):
        start = max(read_cursor_file(memory_dir / CURSOR_NAME), largest_cursor_in_file(path)) + 1
        last = start + count - 1
        if before_write is not None:
            before_write(list(range(start, last + 1)))
        payload = b"".join(lines(start, now.strftime(TIMESTAMP_FORMAT)))
        fsio.confine(path, root)
        # The cursors are reserved in .cursor before the append: an append that then fails (and is cut back
        # off) leaves only a gap in the numbering, never entries that .cursor does not cover.
        fsio.overwrite_counter(memory_dir / CURSOR_NAME, str(last), root=root)
        fsio.ensure_trailing_newline(path, root=root)
        fsio.append_record(path, payload, root=root)
    return start


def repair_torn_line(memory_dir: Path) -> int:
    """Move a torn last line of history.jsonl to history.jsonl.torn (a whole entry only gets its newline); its size."""
    with fsio.file_lock(memory_dir / LOCK_NAME, timeout=LOCK_TIMEOUT, root=workspace_root(memory_dir)):
        return fsio.repair_torn_tail(history_path(memory_dir), root=workspace_root(memory_dir),
                                     is_whole=lambda line: parse_entry(line) is not None)


def remove_entries(memory_dir: Path, keep: Callable[[HistoryEntry], bool]) -> int:
    """Atomically rewrite history.jsonl keeping entries *keep* accepts, and every line it cannot read; returns how
    many were removed."""
    root = workspace_root(memory_dir)
    removed, largest = 0, 0

    def copy(lines: Iterator[tuple[int, bytes]], writer: fsio.AtomicWriter) -> bool:
        nonlocal removed, largest
        for number, line in lines:
            entry = parse_entry(line, number)
            if entry is not None and not keep(entry):
                removed += 1
                largest = max(largest, entry.cursor)
            else:
                writer.write(line)
        fsio.confine(memory_dir / CURSOR_NAME, root)
        return bool(removed)

    with fsio.file_lock(memory_dir / LOCK_NAME, timeout=LOCK_TIMEOUT, root=root):
        if not _rewrite(memory_dir, copy):
            return 0
        # Cursors are never reused, even after the entries holding them are gone.
        if largest > read_cursor_file(memory_dir / CURSOR_NAME):
            fsio.atomic_write(memory_dir / CURSOR_NAME, str(largest), root=root)
    return removed


def insert_entries(memory_dir: Path, entries: Iterable[HistoryEntry]) -> int:
    """Put entries back (restore) in cursor order, each before the first line with a larger cursor, skipping those
    present already (taking a step again after a crash); return how many. An entry written since at the same
    cursor (cursors start again at 1 when memory/ is deleted) does not count: both are kept."""
    root = workspace_root(memory_dir)
    with fsio.file_lock(memory_dir / LOCK_NAME, timeout=LOCK_TIMEOUT, root=root):
        entries = list(entries)
        wanted = {entry.cursor for entry in entries}
        present = {(entry.cursor, content_hash(entry.content)) for entry in iter_entries(memory_dir)
                   if entry.cursor in wanted}
        added = sorted((entry for entry in entries if (entry.cursor, content_hash(entry.content)) not in present),
                       key=lambda entry: entry.cursor)
        if not added:
            return 0

        def copy(lines: Iterator[tuple[int, bytes]], writer: fsio.AtomicWriter) -> bool:
            pending = iter(added)
            following = next(pending, None)
            cursor = 0
            for number, line in lines:
                entry = parse_entry(line, number)
                cursor = entry.cursor if entry else cursor
                while following is not None and following.cursor < cursor:
                    writer.write(following.to_line())
                    following = next(pending, None)
                writer.write(line)
            while following is not None:
                writer.write(following.to_line())
                following = next(pending, None)
            return True

        _rewrite(memory_dir, copy)
    return len(added)


def _rewrite(memory_dir: Path, copy: Callable[[Iterator[tuple[int, bytes]], fsio.AtomicWriter], bool]) -> bool:
    """Replace history.jsonl with what *copy* writes of its whole lines (False: change nothing); whether it did. The
    caller holds the history lock; nanobot appends without it, opening the file anew each time: lines appended while
    *copy* ran follow its output, what still reaches the old file after the rename moves over until quiet, and only
    whole lines move, so the agent's next append never lands mid-line."""
    path = history_path(memory_dir)
    root = workspace_root(memory_dir)
    try:
        source = fsio.open_regular(path, follow=True)
    except FileNotFoundError:
        source = None
    with contextlib.ExitStack() as stack:
        if source is not None:
            stack.enter_context(source)
        writer = stack.enter_context(fsio.AtomicWriter(path, root=root))
        if not copy(whole_lines(source), writer):
            return False
        partial = b""
        if source is not None:
            whole, partial = _split_partial(source.read())  # appended while we read
            writer.write(whole)
        writer.commit()
        if source is not None:
            _take_late_appends(source, path, root, partial)
    return True


def _split_partial(data: bytes) -> tuple[bytes, bytes]:
    """(the whole lines of *data*, the unfinished line after them)."""
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:]


def whole_lines(source: BinaryIO | None) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of every non-blank whole line; stops before an unfinished last line, left unread."""
    if source is None:
        return
    number = 0
    while True:
        offset = source.tell()
        line = source.readline()
        if not line:
            return
        if not line.endswith(b"\n"):
            source.seek(offset)
            return
        number += 1
        if line.strip():
            yield number, line


def _take_late_appends(source: BinaryIO, path: Path, root: Path, partial: bytes) -> None:
    """Move what reaches the replaced file (still open as *source*: an append that opened it before the rename)
    to *path* a whole line at a time, until quiet; an unfinished line (*partial*) goes over raw at the end."""
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < LATE_APPEND_QUIET_SECONDS:
        late = source.read()
        if late:
            whole, partial = _split_partial(partial + late)
            if whole:
                fsio.append_record(path, whole, root=root)
            quiet_since = time.monotonic()
        else:
            time.sleep(LATE_APPEND_POLL_SECONDS)
    if partial:
        fsio.append_record(path, partial, root=root)
