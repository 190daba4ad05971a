"""Parse a session file into message infos, incrementally.

nanobot rewrites the whole file on every save, but the message lines it had are written again byte for
byte after a metadata line that changes each time. So the bytes of the message region seen last time
are hashed; when the file still starts with them, only the lines after them are decoded and counted
(the fast path). Otherwise every line is read, reusing the parse of any line whose digest is known.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from nanobotd.sessions import file as sessionfile
from nanobotd.tokens import count_tokens

FLAG_COMMAND = 1
FLAG_HIDDEN = 2
HASH_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class MessageInfo:
    """What the tracker remembers of one message line (never its content)."""

    line_digest: str
    digest: str
    role: str
    timestamp: str
    tokens: int
    flags: int

    @property
    def counts(self) -> bool:
        """Conversation proper (not a slash command, not nanobot's checkpoint summary)."""
        return not self.flags


@dataclass(frozen=True)
class Tail:
    """The message region of the last scan: its length in bytes and their sha1."""

    length: int
    sha1: str


@dataclass
class ParseResult:
    """A parsed session file."""

    key: str
    header: sessionfile.SessionHeader
    messages: list[MessageInfo]
    corrupt: int
    new_records: dict[str, dict] = field(default_factory=dict)
    tail: Tail | None = None
    fast: bool = False


def parse_session(path: Path, encoding: str, *, cached: list[MessageInfo] | None = None,
                  tail: Tail | None = None, corrupt_before: int = 0) -> ParseResult:
    """Parse *path*; with the previous scan's *cached* messages and *tail*, decode only what is new."""
    if cached is not None and tail is not None:
        result = _parse_tail(path, encoding, cached, tail, corrupt_before)
        if result is not None:
            return result
    return _parse_all(path, encoding, cached or [])


def _message_info(line_digest: str, record: dict, taken: set[str], encoding: str) -> MessageInfo | None:
    """Parse one message; a digest already taken in this file gets a numbered variant (#1, #2, ...)."""
    fields = sessionfile.message_fields(record)
    if fields is None:
        return None
    role, text, timestamp = fields
    base = digest = sessionfile.message_digest(role, text, timestamp)
    copy = 0
    while digest in taken:
        copy += 1
        digest = hashlib.blake2b(f"{base}#{copy}".encode(), digest_size=16).hexdigest()
    taken.add(digest)
    flags = (FLAG_COMMAND if record.get("_command") else 0) | (FLAG_HIDDEN if record.get("_hidden_history") else 0)
    tokens = 0 if flags else count_tokens(sessionfile.message_text_for_tokens(record, text), encoding)
    return MessageInfo(line_digest, digest, role, timestamp, tokens, flags)


def _parse_all(path: Path, encoding: str, cached: list[MessageInfo]) -> ParseResult:
    # a line may repeat (same bytes twice): its k-th copy in the file reuses the k-th cached parse
    cache: dict[str, list[MessageInfo]] = {}
    for info in cached:
        cache.setdefault(info.line_digest, []).append(info)
    line_copies: dict[str, int] = {}
    header = sessionfile.SessionHeader()
    messages: list[MessageInfo] = []
    new_records: dict[str, dict] = {}
    taken: set[str] = set()
    corrupt = 0
    region_start = 0
    region_end = 0
    terminated = True
    leading = True
    fast_ok = True
    for line in sessionfile.iter_raw_lines(path):
        terminated = line.terminated
        region_end = line.end
        if leading and sessionfile.is_metadata_line(line):
            region_start = line.end
        else:
            leading = False
        copy = line_copies.get(line.line_digest, 0)
        line_copies[line.line_digest] = copy + 1
        infos = cache.get(line.line_digest, ())
        info = infos[copy] if copy < len(infos) else None
        if info is not None and info.digest not in taken:
            taken.add(info.digest)
            messages.append(info)
            continue
        record = sessionfile.decode_record(line)
        if record is None:
            corrupt += 1
            continue
        if "_type" in record:
            if record.get("_type") == "metadata":
                sessionfile.read_header(record, header)
            fast_ok = fast_ok and leading
            continue
        info = _message_info(line.line_digest, record, taken, encoding)
        if info is None:
            corrupt += 1
            continue
        messages.append(info)
        if info.counts:
            new_records[info.digest] = record
    key = header.key or sessionfile.key_from_filename(path) or path.stem
    tail = None
    if fast_ok and terminated:
        tail = Tail(region_end - region_start, _hash_range(path, region_start, region_end - region_start))
    return ParseResult(key, header, messages, corrupt, new_records, tail)


def _parse_tail(path: Path, encoding: str, cached: list[MessageInfo], tail: Tail,
                corrupt_before: int) -> ParseResult | None:
    """The fast path: None when the file no longer starts (after its metadata) with the known bytes."""
    header = sessionfile.SessionHeader()
    with open(path, "rb") as handle:
        region_start = 0
        while True:
            raw = handle.readline(sessionfile.MAX_LINE_BYTES)
            line = sessionfile.RawLine(0, raw.strip(), "", end=handle.tell())
            if not raw or not raw.endswith(b"\n") or not sessionfile.is_metadata_line(line):
                break
            record = sessionfile.decode_record(line)
            if record is not None and record.get("_type") == "metadata":
                sessionfile.read_header(record, header)
            region_start = handle.tell()
        handle.seek(region_start)
        digest = hashlib.sha1()
        remaining = tail.length
        while remaining:
            block = handle.read(min(HASH_BLOCK, remaining))
            if not block:
                return None
            digest.update(block)
            remaining -= len(block)
        if digest.hexdigest() != tail.sha1:
            return None
    known = {info.digest for info in cached}
    messages = list(cached)
    new_records: dict[str, dict] = {}
    corrupt = corrupt_before
    region_end = region_start + tail.length
    terminated = True
    for line in sessionfile.iter_raw_lines(path, offset=region_end):
        terminated = line.terminated
        region_end = line.end
        record = sessionfile.decode_record(line)
        if record is None:
            corrupt += 1
            continue
        if "_type" in record:
            return None
        if sessionfile.message_fields(record) is not None and _base_digest(record) in known:
            return None  # a copy of an earlier message: its numbering needs the full parse
        info = _message_info(line.line_digest, record, known, encoding)
        if info is None:
            corrupt += 1
            continue
        messages.append(info)
        if info.counts:
            new_records[info.digest] = record
    key = header.key or sessionfile.key_from_filename(path) or path.stem
    new_tail = None
    if terminated:
        # the known bytes are hashed already: continue the same hash over the new ones
        known_end = region_start + tail.length
        _update_hash(digest, path, known_end, region_end - known_end)
        new_tail = Tail(region_end - region_start, digest.hexdigest())
    return ParseResult(key, header, messages, corrupt, new_records, new_tail, fast=True)


def _base_digest(record: dict) -> str:
    role, text, timestamp = sessionfile.message_fields(record)
    return sessionfile.message_digest(role, text, timestamp)


def _hash_range(path: Path, start: int, length: int) -> str:
    digest = hashlib.sha1()
    _update_hash(digest, path, start, length)
    return digest.hexdigest()


def _update_hash(digest, path: Path, start: int, length: int) -> None:
    with open(path, "rb") as handle:
        handle.seek(start)
        remaining = length
        while remaining > 0:
            block = handle.read(min(HASH_BLOCK, remaining))
            if not block:
                break
            digest.update(block)
            remaining -= len(block)
