"""Parse a session file into message infos, incrementally.

nanobot rewrites the whole file on every save, but the message lines it had are written again byte for
byte after a metadata line that changes each time. So the bytes of the message region seen last time
are hashed; when the file still starts with them, only the lines after them are decoded (the fast path).
Otherwise every line is read, reusing the parse of any line whose digest is known. A message's tokens are
estimated from its size (`tokens.estimate_tokens`): no decision a scan feeds needs more.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, NamedTuple

from loguru import logger

from nanobotd import fsio
from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions.messages import MessageInfo, MessageList
from nanobotd.tokens import estimate_tokens
from nanobotd.tuning import ESTIMATE_BYTES_PER_TOKEN, HASH_BLOCK, LINE_OVERHEAD, READ_CHUNK, SEARCHED_LOOKUPS

FLAG_COMMAND = 1
FLAG_HIDDEN = 2
LINE_NONE, LINE_NEW, LINE_KNOWN = 0, 1, 2  # a message's line: not kept, parsed in this scan, parse reused
_PLAIN_CONTENT = (str, type(None))  # content that is its message's text as it is
# told of each conversation message as a full parse decodes it: (its number, the message, its line)
Listener = Callable[[int, PendingMessage, sessionfile.RawLine], None]


@dataclass(frozen=True, slots=True)
class Tail:
    """The message region of the last scan: its length in bytes and their sha1, and where it started."""

    length: int
    sha1: str
    start: int = 0


class LineRef(NamedTuple):
    """Where a new message's line is in the file read (its bytes are read again from the same open file); a
    tuple: a first scan makes one for every message it spools."""

    start: int
    end: int
    line_digest: str


@dataclass
class MessageLines:
    """Where the counted messages' lines are, from message number *first* on: a few bytes a message in
    arrays, not a LineRef object each (a first scan has every message new)."""

    first: int = 0
    starts: array = field(default_factory=lambda: array("q"))
    ends: array = field(default_factory=lambda: array("q"))
    kinds: bytearray = field(default_factory=bytearray)  # LINE_NONE, LINE_NEW or LINE_KNOWN

    def add(self, kind: int, line: sessionfile.RawLine) -> None:
        self.kinds.append(kind)
        self.starts.append(line.start)
        self.ends.append(line.end)

    def kind(self, index: int) -> int:
        at = index - self.first
        return self.kinds[at] if 0 <= at < len(self.kinds) else LINE_NONE

    def ref(self, index: int, line_digest: str) -> LineRef:
        at = index - self.first
        return LineRef(self.starts[at], self.ends[at], line_digest)


@dataclass
class ParseResult:
    """A parsed session file."""

    key: str
    header: sessionfile.SessionHeader
    messages: MessageList
    corrupt: int
    lines: MessageLines = field(default_factory=MessageLines)
    tail: Tail | None = None
    fast: bool = False
    large: int = 0  # new messages over sessionfile.MAX_LINE_BYTES (read whole, archived raw in parts)
    region_start: int = 0  # where the message lines start (after the leading metadata)

    def new_line(self, index: int) -> LineRef | None:
        """Where message *index* is, when it is a counted message parsed in this scan (not reused)."""
        if self.lines.kind(index) != LINE_NEW:
            return None
        return self.lines.ref(index, self.messages.line_digest(index))

    def spool_rows(self, numbers: Sequence[int]) -> Iterator[tuple[str, str, str, int, LineRef | None]]:
        """(digest, role, timestamp, tokens, new_line) of the messages *numbers* (ascending), read a block of
        columns at a time: a first scan spools every message, and a MessageInfo and a new_line looked up for
        each took twice as long."""
        if not numbers:
            return
        wanted = iter(numbers)
        number = next(wanted)
        first, kinds, starts, ends = self.lines.first, self.lines.kinds, self.lines.starts, self.lines.ends
        for index, (line_digest, digest, role, stamp, tokens, _) in enumerate(
                self.messages.rows(numbers[0], numbers[-1] + 1), start=numbers[0]):
            if index != number:
                continue
            at = index - first  # MessageLines.kind and .ref, inlined
            new = 0 <= at < len(kinds) and kinds[at] == LINE_NEW
            yield digest, role, stamp, tokens, LineRef(starts[at], ends[at], line_digest) if new else None
            number = next(wanted, None)

    @property
    def new_count(self) -> int:
        """How many counted messages this scan parsed."""
        return self.lines.kinds.count(LINE_NEW)


@dataclass(frozen=True, slots=True)
class Sketch:
    """A session file told from its bytes, no line decoded: its leading metadata, and its lines after them
    (every one taken for a message) and theirs after the agent's mark, with their tokens estimated from their
    size less LINE_OVERHEAD a line."""

    header: sessionfile.SessionHeader
    size: int
    lines: int
    tokens: int
    unarchived_lines: int
    unarchived_bytes: int
    unarchived_tokens: int

    @property
    def agent_archived(self) -> int:
        """The agent's mark, as a parse takes it (0 when it is past the end)."""
        return self.header.last_archived if self.header.last_archived <= self.lines else 0


def sketch_session(handle: BinaryIO) -> Sketch:
    """Read the file open in *handle* for a Sketch: its newlines counted a block at a time."""
    header = sessionfile.SessionHeader()
    handle.seek(0)
    start = _read_leading_metadata(handle, header)
    mark, lines, position, mark_at, last = header.last_archived, 0, start, start, b"\n"
    handle.seek(start)
    while block := handle.read(READ_CHUNK):
        count = block.count(b"\n")
        if lines < mark <= lines + count:  # the mark's line ends in this block
            at = -1
            for _ in range(mark - lines):
                at = block.find(b"\n", at + 1)
            mark_at = position + at + 1
        lines, position, last = lines + count, position + len(block), block[-1:]
    lines += last != b"\n"  # an unterminated last line
    archived = header.last_archived if header.last_archived <= lines else 0
    if not archived:
        mark_at = start
    total_bytes, unarchived_bytes = position - start, position - mark_at
    return Sketch(header, position, lines, _estimate(total_bytes, lines), lines - archived, unarchived_bytes,
                  _estimate(unarchived_bytes, lines - archived))


def _estimate(size: int, lines: int) -> int:
    return -(-max(0, size - LINE_OVERHEAD * lines) // ESTIMATE_BYTES_PER_TOKEN)


def parse_session(path: Path, *, cached: Sequence[MessageInfo] | None = None, tail: Tail | None = None,
                  corrupt_before: int = 0, handle: BinaryIO | None = None,
                  listener: Listener | None = None) -> ParseResult:
    """Parse *path*; with the previous scan's *cached* messages and *tail*, decode only what is new.

    *handle*: the file already open (the caller reads the new messages' lines from it again afterwards).
    *listener*: told of each conversation message a full parse (no *cached*) decodes, as it decodes it.
    """
    if handle is None:
        with fsio.open_regular(path) as opened:
            return parse_session(path, cached=cached, tail=tail, corrupt_before=corrupt_before, handle=opened,
                                 listener=listener)
    result = None
    if cached is not None and tail is not None:
        result = _parse_appended(path, handle, cached, tail, corrupt_before)
    return result if result is not None else _parse_all(path, handle, cached or [], listener)


def read_line(handle: BinaryIO, ref: LineRef) -> bytes | None:
    """The line *ref* points at, read again from *handle*; None when those bytes are no longer that line."""
    handle.seek(ref.start)
    data = handle.read(ref.end - ref.start).strip()
    return data if sessionfile.line_digest(data) == ref.line_digest else None


class _Taken:
    """The digests of the messages read so far, to number a copy of one (digest#1, ...).

    An append to a long session checks its few new messages against the known ones in their digest column
    (a search of 16 bytes a message) instead of making a set of every digest on each save; after
    SEARCHED_LOOKUPS lookups the set is made.
    """

    def __init__(self, known: MessageList | None = None) -> None:
        self._known = known
        self._digests: set[str] = set()
        self._searches = 0

    def __contains__(self, digest: str) -> bool:
        if digest in self._digests:
            return True
        if self._known is None:
            return False
        self._searches += 1
        if self._searches > SEARCHED_LOOKUPS:
            self._digests.update(self._known.digests())
            self._known = None
            return digest in self._digests
        return self._known.has_digest(digest)

    def add(self, digest: str) -> None:
        self._digests.add(digest)


@dataclass
class _Reading:
    """What one pass over a file's lines has collected so far."""

    header: sessionfile.SessionHeader
    messages: MessageList
    taken: _Taken | set[str]  # a plain set when no known message list is searched (a full parse)
    corrupt: int = 0
    region_start: int = 0
    region_end: int = 0
    leading: bool = True
    terminated: bool = True
    fast_ok: bool = True
    large: int = 0
    lines: MessageLines = field(default_factory=MessageLines)
    cached: MessageList | None = None  # the previous scan's messages, whose parse a line reuses
    cache: dict[str, int | deque[int]] = field(default_factory=dict)  # line digest -> its parse(s) in cached
    listener: Listener | None = None

    def reuse(self, line: sessionfile.RawLine) -> bool:
        """Take the cached parse of *line* when there is one; a line may repeat (same bytes twice), so
        its k-th copy in the file reuses the k-th cached parse (each parse is taken out of the cache once)."""
        entry = self.cache.pop(line.line_digest, None)
        if entry is None:
            return False
        if isinstance(entry, deque):
            index = entry.popleft()
            if entry:
                self.cache[line.line_digest] = entry
        else:
            index = entry
        info = self.cached[index]
        if info.digest in self.taken:
            return False
        self.taken.add(info.digest)
        self.messages.append(info)
        self.lines.add(LINE_KNOWN if info.counts else LINE_NONE, line)
        return True

    def take(self, record: dict, line: sessionfile.RawLine) -> bool:
        """A newly parsed message record (False: it is none); a digest already taken in this file gets a numbered
        variant (#1, ...); one over MAX_LINE_BYTES is counted as large (it will be archived raw)."""
        fields = sessionfile.message_fields(record)
        if fields is None:
            return False
        role, text, timestamp = fields
        role = sys.intern(role)  # a handful of roles, one string each instead of one per message
        # a line without a backslash has no character JSON escapes; a text made of content blocks may have
        plain = b"\\" not in line.data and type(record.get("content", "")) in _PLAIN_CONTENT
        base = digest = sessionfile.message_digest(role, text, timestamp, plain=plain)
        copy, taken = 0, self.taken
        while digest in taken:
            copy += 1
            digest = hashlib.blake2b(f"{base}#{copy}".encode(), digest_size=16).hexdigest()
        taken.add(digest)
        flags = (FLAG_COMMAND if record.get("_command") else 0) | (FLAG_HIDDEN if record.get("_hidden_history") else 0)
        lines = self.lines  # MessageLines.add, inlined: a first start adds every message of every file
        lines.kinds.append(LINE_NONE if flags else LINE_NEW)
        lines.starts.append(line.start)
        lines.ends.append(line.end)
        tokens = 0 if flags else estimate_tokens(sessionfile.message_text_for_tokens(record, text))
        self.messages.add_packed(bytes.fromhex(line.line_digest), bytes.fromhex(digest), role, timestamp, tokens,
                                 flags)
        if len(line.data) > sessionfile.MAX_LINE_BYTES:
            self.large += 1
        if self.listener is not None and not flags:
            self.listener(len(self.messages) - 1, PendingMessage(digest, role, timestamp, text, tokens, record), line)
        return True


def _parse_all(path: Path, handle: BinaryIO, cached: Sequence[MessageInfo],
               listener: Listener | None = None) -> ParseResult:
    reading = _Reading(sessionfile.SessionHeader(), MessageList(), set(), listener=listener)
    reading.cached = cached if isinstance(cached, MessageList) else MessageList(cached)
    for index, line_digest in enumerate(reading.cached.line_digests()):
        known = reading.cache.setdefault(line_digest, index)
        if known != index:  # a line repeated: its parses in file order
            if not isinstance(known, deque):
                reading.cache[line_digest] = known = deque((known,))
            known.append(index)
    _read_lines(path, handle, reading)
    tail = None
    if reading.fast_ok and reading.terminated:
        length = reading.region_end - reading.region_start
        digest = hashlib.sha1()
        _hash(digest, handle, reading.region_start, length)
        tail = Tail(length, digest.hexdigest(), reading.region_start)
    return ParseResult(_key(path, reading.header), reading.header, reading.messages, reading.corrupt,
                       reading.lines, tail, large=reading.large, region_start=reading.region_start)


def _parse_appended(path: Path, handle: BinaryIO, cached: Sequence[MessageInfo], tail: Tail,
                    corrupt_before: int) -> ParseResult | None:
    """The fast path: None when the file no longer starts (after its metadata) with the known bytes."""
    header = sessionfile.SessionHeader()
    known = _known_region(handle, tail, header)
    if known is None:
        return None
    region_start, digest = known
    known_end = region_start + tail.length
    messages = MessageList.of(cached)
    reading = _Reading(header, messages, _Taken(messages), corrupt=corrupt_before,
                       region_start=region_start, region_end=known_end, leading=False,
                       lines=MessageLines(first=len(cached)))
    if not _read_lines(path, handle, reading, offset=known_end, appending=True):
        return None
    new_tail = None
    if reading.terminated:
        # the known bytes are hashed already: continue the same hash over the new ones
        _hash(digest, handle, known_end, reading.region_end - known_end)
        new_tail = Tail(reading.region_end - region_start, digest.hexdigest(), region_start)
    return ParseResult(_key(path, header), header, reading.messages, reading.corrupt, reading.lines,
                       new_tail, fast=True, large=reading.large, region_start=region_start)


def _read_lines(path: Path, handle: BinaryIO, reading: _Reading, *, offset: int = 0, appending: bool = False) -> bool:
    """The one loop over a file's lines, from *offset*, collecting into *reading*.

    *appending*: the lines follow known messages; returns False as soon as one needs the full parse.
    """
    for line in sessionfile.iter_raw_lines(path, sessionfile.MESSAGE_LINE_BYTES, offset=offset, handle=handle):
        reading.terminated = line.terminated
        reading.region_end = line.end
        leading = reading.leading and sessionfile.is_metadata_line(line)
        reading.leading = leading
        if reading.cache and reading.reuse(line):  # nothing to reuse in a first scan
            continue
        record = sessionfile.decode_record(line)
        if record is None:  # corrupt: a message line (however it starts), as the fast path reads it
            reading.leading = False
            _count_corrupt(path, line, reading)
            continue
        if leading:
            reading.region_start = line.end
        if "_type" in record:
            if appending:
                return False
            if record.get("_type") == "metadata":
                sessionfile.read_header(record, reading.header)
            reading.fast_ok = reading.fast_ok and reading.leading
            continue
        if appending and sessionfile.message_fields(record) is not None and _base_digest(record) in reading.taken:
            return False  # a copy of an earlier message: its numbering needs the full parse
        if not reading.take(record, line):
            reading.corrupt += 1
    return True


def _count_corrupt(path: Path, line: sessionfile.RawLine, reading: _Reading) -> None:
    reading.corrupt += 1
    if line.oversized:
        logger.error("{} line {}: {} bytes, over the {} MiB a message may have; not read", path, line.number,
                     line.oversized, sessionfile.MESSAGE_LINE_BYTES >> 20)


def _known_region(handle: BinaryIO, tail: Tail, header: sessionfile.SessionHeader) -> tuple[int, Any] | None:
    """Read the leading metadata into *header* and hash the known message bytes after it.

    Returns where the message region starts and the running hash, or None when those bytes changed.
    """
    handle.seek(0)
    region_start = _read_leading_metadata(handle, header)
    digest = hashlib.sha1()
    if _hash(digest, handle, region_start, tail.length) != tail.length or digest.hexdigest() != tail.sha1:
        return None
    return region_start, digest


def _read_leading_metadata(handle: IO[bytes], header: sessionfile.SessionHeader) -> int:
    """Read the metadata lines at the top of the file into *header*; return where the messages start."""
    region_start = 0
    while True:
        raw = handle.readline(sessionfile.MAX_LINE_BYTES)
        line = sessionfile.RawLine(0, raw.strip(), "", end=handle.tell())
        if not raw or not raw.endswith(b"\n") or not sessionfile.is_metadata_line(line):
            return region_start
        record = sessionfile.decode_record(line)
        if record is None:  # a corrupt line: the message lines read it (and count it) as the full parse does
            return region_start
        if record.get("_type") == "metadata":
            sessionfile.read_header(record, header)
        region_start = handle.tell()


def _key(path: Path, header: sessionfile.SessionHeader) -> str:
    return header.key or sessionfile.key_from_filename(path) or path.stem


def _base_digest(record: dict) -> str:
    role, text, timestamp = sessionfile.message_fields(record)
    return sessionfile.message_digest(role, text, timestamp)


def _hash(digest: Any, handle: IO[bytes], start: int, length: int) -> int:
    """Feed up to *length* bytes of *handle* from *start* into *digest*; return how many there were."""
    handle.seek(start)
    hashed = 0
    while hashed < length:
        block = handle.read(min(HASH_BLOCK, length - hashed))
        if not block:
            break
        digest.update(block)
        hashed += len(block)
    return hashed
