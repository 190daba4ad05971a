"""Read nanobot session JSONL files (read-only): names, records, message digests.

nanobot rewrites the whole file on every save and may insert checkpoint messages mid-file, so
messages are identified by a digest of (role, content, timestamp), never by position. Reading is
streamed line by line with a cap, so a 100 MB line or a binary file costs bounded memory; only regular
files are opened, and never read past the size they had when opened (a FIFO or /dev/zero cannot stall us).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring
from pathlib import Path
from typing import BinaryIO, NamedTuple

from nanobotd import fsio
from nanobotd.jsontext import json_string
from nanobotd.tuning import READ_CHUNK

MAX_LINE_BYTES = 8 * 1024 * 1024
# The tracker reads a message line up to this size (a huge paste must be archived, not dropped); past it the
# line is counted corrupt and logged with its size.
MESSAGE_LINE_BYTES = 64 * 1024 * 1024
SESSION_SUFFIX = ".jsonl"
_DECODER = json.JSONDecoder()  # json.loads' own, called without its per-call encoding detection
# json.dumps(..., ensure_ascii=False) of decoded JSON (never circular), made once: json.dumps makes one at every call
_ENCODE = c_make_encoder(None, None, encode_basestring, None, ": ", ", ", False, False, True)


@dataclass
class SessionHeader:
    """The metadata record: the agent's own archive mark and the key."""

    key: str | None = None
    last_archived: int = 0
    marked: bool = False  # the agent keeps its own archive mark: it consolidates by itself
    created_at: str = ""
    updated_at: str = ""


class RawLine(NamedTuple):
    """One line of a session file, undecoded, with a digest of its bytes (the parse cache key); a named tuple,
    made for every line read (cheaper to make than a frozen dataclass)."""

    number: int
    data: bytes | None
    line_digest: str
    oversized: int = 0
    end: int = 0
    terminated: bool = True
    start: int = 0  # the offset of its first byte (so its bytes can be read again from the same file)


@dataclass(frozen=True)
class Message:
    """One conversation record of a session, in the order of the file."""

    index: int
    digest: str
    role: str
    text: str
    timestamp: str
    command: bool = False
    hidden: bool = False
    record: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def counts(self) -> bool:
        """Conversation proper: not a slash command and not nanobot's own checkpoint summary."""
        return not self.command and not self.hidden


def key_from_filename(path: Path) -> str | None:
    """Decode the session key from a URL-safe base64 stem; None for a legacy name."""
    stem = path.name[: -len(SESSION_SUFFIX)] if path.name.endswith(SESSION_SUFFIX) else path.stem
    try:
        decoded = base64.urlsafe_b64decode(stem + "=" * (-len(stem) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if filename_for_key(decoded) != stem + SESSION_SUFFIX:
        return None
    return decoded


def filename_for_key(key: str) -> str:
    """The file name nanobot uses for *key*."""
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii").rstrip("=") + SESSION_SUFFIX


def is_session_file(path: Path) -> bool:
    """A real session file: *.jsonl, not a hidden temp file or checkpoint sidecar."""
    name = path.name
    return name.endswith(SESSION_SUFFIX) and not name.startswith(".") and not name.endswith(".tmp")


def iter_raw_lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES, offset: int = 0, *,
                   handle: BinaryIO | None = None, chunk_bytes: int = READ_CHUNK) -> Iterator[RawLine]:
    """Yield the file's non-blank lines from byte *offset*; a line over *max_line_bytes* has data=None.

    Each line knows the byte offsets of its start and just after it (`end`) and whether a newline ended it.
    Only a regular file is read (fsio.NotRegularFile otherwise), and only up to its size at the open;
    *handle*: read this open file (of *path*) instead of opening it; *chunk_bytes*: read this much at a time.
    """
    if handle is None:
        with fsio.open_regular(path) as opened:
            yield from iter_raw_lines(path, max_line_bytes, offset, handle=opened, chunk_bytes=chunk_bytes)
        return
    reader = _LineReader(max_line_bytes, offset)
    remaining = os.fstat(handle.fileno()).st_size - offset
    handle.seek(offset)
    while remaining > 0:
        chunk = handle.read(min(chunk_bytes, remaining))
        if not chunk:
            break
        remaining -= len(chunk)
        yield from reader.lines_in(chunk)
    if reader.pending or reader.skipping:
        line = _finish_line(reader.number + 1, reader.pending, reader.skipping, reader.position, False)
        if line is not None:
            yield line


class _LineReader:
    """The lines of a file read a chunk at a time: a line inside one chunk is sliced from it (nearly every
    line), one across chunks is gathered in *pending* (or only measured, past the size cap)."""

    def __init__(self, max_line_bytes: int, offset: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.number = 0
        self.pending = bytearray()
        self.skipping = 0
        self.position = offset  # where the chunk being read starts

    def lines_in(self, chunk: bytes) -> Iterator[RawLine]:
        start, position, find, limit = 0, self.position, chunk.find, self.max_line_bytes
        while True:
            newline = find(b"\n", start)
            if newline >= 0 and not (self.pending or self.skipping) and newline - start <= limit:
                self.number += 1
                data = chunk[start:newline].strip()
                if data:  # RawLine's fields in order, made as a tuple is (its generated __new__ took a third)
                    yield _new_line((self.number, data, _blake2b(data, digest_size=16).hexdigest(), 0,
                                     position + newline + 1, True, position + start))
            else:
                self._gather(chunk[start:] if newline < 0 else chunk[start:newline])
                if newline < 0:
                    break
                self.number += 1
                line = _finish_line(self.number, self.pending, self.skipping, position + newline + 1, True)
                if line is not None:
                    yield line
                self.pending.clear()
                self.skipping = 0
            start = newline + 1
        self.position += len(chunk)

    def _gather(self, piece: bytes) -> None:
        if self.skipping:
            self.skipping += len(piece)
            return
        self.pending += piece
        if len(self.pending) > self.max_line_bytes:
            self.skipping = len(self.pending)
            self.pending.clear()


_new_line = functools.partial(tuple.__new__, RawLine)
_blake2b = hashlib.blake2b


def _finish_line(number: int, pending: bytearray, skipping: int, end: int, terminated: bool) -> RawLine | None:
    start = end - (skipping or len(pending)) - terminated
    if skipping:
        return RawLine(number, None, f"oversized:{number}:{skipping}", oversized=skipping, end=end,
                       terminated=terminated, start=start)
    data = bytes(pending).strip()
    if not data:
        return None
    return RawLine(number, data, line_digest(data), end=end, terminated=terminated, start=start)


def line_digest(data: bytes) -> str:
    """The digest of a line's stripped bytes: the parse cache key."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def decode_record(line: RawLine) -> dict | None:
    """The JSON object on *line*, or None when it is not one (corrupt, binary, oversized)."""
    data = line.data
    if data is None:
        return None
    try:
        if data[:1] == b"{" and not data.startswith(b"{\x00"):  # UTF-8, as json.loads would detect it
            # raw_decode, without json.loads' whitespace matches at either end: a line read is stripped (one that is
            # not, or has more after the object, takes the whole decode)
            text = data.decode("utf-8", "surrogatepass")
            record, end = _DECODER.raw_decode(text)
            if end != len(text):
                record = _DECODER.decode(text)
        else:
            record = json.loads(data)
    except (ValueError, RecursionError):  # deep nesting is garbage too, not a crash
        return None
    return record if isinstance(record, dict) else None


def is_metadata_line(line: RawLine) -> bool:
    """Cheap test for the records that are not messages (without a full JSON parse)."""
    return line.data is not None and b'"_type"' in line.data[:64]


def read_header(record: dict, header: SessionHeader) -> None:
    """Fold a metadata record into *header* (the last one wins)."""
    key = record.get("key")
    if isinstance(key, str):
        header.key = key
    for name in ("created_at", "updated_at"):
        if isinstance(record.get(name), str):
            setattr(header, name, record[name])
    header.marked = header.marked or "last_archived" in record or "last_consolidated" in record
    mark = record.get("last_archived", record.get("last_consolidated", 0))
    header.last_archived = mark if isinstance(mark, int) and not isinstance(mark, bool) and mark > 0 else 0


def message_fields(record: dict) -> tuple[str, str, str] | None:
    """(role, flattened text, timestamp) of a message record, or None when it is not a message."""
    role = record.get("role")
    if not isinstance(role, str) or "_type" in record:
        return None
    timestamp = record.get("timestamp")
    return role, flatten_content(record.get("content")), timestamp if isinstance(timestamp, str) else ""


def flatten_content(content: object) -> str:
    """Message content as text: strings as they are, text blocks joined, images named."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif "image" in str(block.get("type", "")):
                    parts.append("[image]")
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def message_digest(role: str, text: str, timestamp: str, *, plain: bool = False) -> str:
    """Identity of a message across rewrites: a digest of role, content and timestamp.

    The digested bytes are `json.dumps([role, text, timestamp], ensure_ascii=False)`, built from the JSON
    string encoders themselves (json.dumps with options makes a new encoder for every call: a third of a scan).
    *plain*: no character of the three is one JSON escapes (they were read from a line without a backslash), so
    each is its own JSON text between quotes: escaping a message's text took half of its digest.
    """
    if plain:
        payload = f'["{role}", "{text}", "{timestamp}"]'
    else:
        payload = f"[{json_string(role)}, {json_string(text)}, {json_string(timestamp)}]"
    return hashlib.blake2b(payload.encode("utf-8", errors="replace"), digest_size=16).hexdigest()


def message_text_for_tokens(record: dict, text: str) -> str:
    """What a message costs in a prompt: its text plus tool-call arguments."""
    calls = record.get("tool_calls")
    if isinstance(calls, list) and calls:
        return text + "\n" + "".join(_ENCODE(calls, 0))
    return text
