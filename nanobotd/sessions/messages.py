"""What the tracker remembers of a session file's messages, kept in columns.

A session's message cache lives as long as the session is in use, one entry per message in the file: kept in
columns (digests as their 16 bytes, timestamps as UTF-8 in one buffer, tokens and flags in arrays) it costs a
fraction of what MessageInfo objects with hex strings would. A MessageInfo is made when one is read.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from nanobotd.tuning import ROWS_BLOCK

DIGEST_BYTES = 16  # blake2b digest_size of every message and line digest (file.line_digest, file.message_digest)
_HEX = DIGEST_BYTES * 2


@dataclass(frozen=True, slots=True)
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


class MessageList:
    """A session file's MessageInfos, in file order, in columns (a Sequence of MessageInfo); every digest is 32
    lower-case hex digits, as blake2b's hexdigest makes them (a scan makes no other)."""

    __slots__ = ("_line_digests", "_digests", "_roles", "_role_names", "_role_numbers", "_stamps",
                 "_stamp_ends", "_tokens", "_flags")

    def __init__(self, infos: Iterable[MessageInfo] = ()) -> None:
        self._line_digests = bytearray()
        self._digests = bytearray()
        self._roles = array("I")
        self._role_names: list[str] = []
        self._role_numbers: dict[str, int] = {}
        self._stamps = bytearray()
        self._stamp_ends = array("q")
        self._tokens = array("q")
        self._flags = bytearray()
        for info in infos:
            self.append(info)

    @classmethod
    def of(cls, messages: Iterable[MessageInfo]) -> MessageList:
        """*messages* as a MessageList of their own (a copy, so appending to it leaves *messages* alone)."""
        return messages.copy() if isinstance(messages, MessageList) else cls(messages)

    @classmethod
    def from_blocks(cls, blocks: Iterable[tuple[bytes, bytes, str]]) -> MessageList:
        """A MessageList of the message cache's blocks (see blocks()), in order."""
        messages = cls()
        for line_digests, digests, columns in blocks:
            names, roles, stamps, ends, tokens, flags = json.loads(columns)
            stamp_base = len(messages._stamps)
            numbers = [messages._role_number(name) for name in names]
            messages._line_digests += line_digests
            messages._digests += digests
            messages._roles.extend(numbers[role] for role in roles)
            messages._stamps += stamps.encode("utf-8", "surrogatepass")
            messages._stamp_ends.extend(end + stamp_base for end in ends)
            messages._tokens.extend(tokens)
            messages._flags.extend(flags)
        return messages

    def blocks(self, start: int, size: int) -> Iterator[tuple[int, bytes, bytes, str]]:
        """The message cache's rows from the block holding message *start* on, *size* messages a block: (first
        message, line digests, digests, the other columns as JSON). A row a block, not a row a message: a first
        start stores every message of every file."""
        for first in range(start - start % size, len(self), size):
            part = self._slice(slice(first, first + size))
            columns = json.dumps([part._role_names, part._roles.tolist(),
                                  part._stamps.decode("utf-8", "surrogatepass"), part._stamp_ends.tolist(),
                                  part._tokens.tolist(), list(part._flags)], separators=(",", ":"))
            yield first, bytes(part._line_digests), bytes(part._digests), columns

    # -- writing -------------------------------------------------------------------------------------
    def append(self, info: MessageInfo) -> None:
        """Add *info* at the end."""
        self.add(info.line_digest, info.digest, info.role, info.timestamp, info.tokens, info.flags)

    def add(self, line_digest: str, digest: str, role: str, timestamp: str, tokens: int, flags: int) -> None:
        """Add a message at the end from its fields (a MessageInfo's, in its order)."""
        self.add_packed(self._packed(line_digest), self._packed(digest), role, timestamp, tokens, flags)

    def add_packed(self, line_digest: bytes, digest: bytes, role: str, timestamp: str, tokens: int,
                   flags: int) -> None:
        """add() of a message whose two digests are given as their 16 bytes (`bytes.fromhex` of blake2b hexdigests, as
        a scan makes them: a scan adds every message it parses, without the checks a digest from elsewhere needs)."""
        self._line_digests += line_digest
        self._digests += digest
        number = self._role_numbers.get(role)
        self._roles.append(number if number is not None else self._role_number(role))
        self._stamps += timestamp.encode("utf-8", "surrogatepass")
        self._stamp_ends.append(len(self._stamps))
        self._tokens.append(tokens)
        self._flags.append(flags)

    def _role_number(self, role: str) -> int:
        number = self._role_numbers.get(role)
        if number is None:
            number = self._role_numbers[role] = len(self._role_names)
            self._role_names.append(role)
        return number

    @classmethod
    def _packed(cls, digest: str) -> bytes:
        packed = cls._packed_only(digest)
        if packed is None:
            raise ValueError(f"not a message or line digest: {digest!r}")
        return packed

    @staticmethod
    def _packed_only(digest: str) -> bytes | None:
        """*digest*'s 16 bytes, when it is 32 lower-case hex digits (as blake2b's hexdigest) and nothing else."""
        if len(digest) != _HEX:
            return None
        try:
            packed = bytes.fromhex(digest)
        except ValueError:
            return None
        return packed if packed.hex() == digest else None

    # -- reading -------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._flags)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._slice(index)
        index = range(len(self))[index]  # negative indexes, and IndexError past the end
        return MessageInfo(self.line_digest(index), self.digest(index), self._role_names[self._roles[index]],
                           self.timestamp(index), self._tokens[index], self._flags[index])

    def __iter__(self) -> Iterator[MessageInfo]:
        for row in self.rows():
            yield MessageInfo(*row)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (MessageList, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(mine == theirs for mine, theirs in zip(self, other, strict=True))

    __hash__ = None  # mutable, like a list

    def __repr__(self) -> str:
        return f"MessageList({list(self)!r})"

    def line_digest(self, index: int) -> str:
        """Message *index*'s line digest (the parse cache key)."""
        return self._line_digests[index * DIGEST_BYTES:(index + 1) * DIGEST_BYTES].hex()

    def digest(self, index: int) -> str:
        """Message *index*'s identity across rewrites."""
        return self._digests[index * DIGEST_BYTES:(index + 1) * DIGEST_BYTES].hex()

    def timestamp(self, index: int) -> str:
        """Message *index*'s timestamp, as written in the file."""
        start = self._stamp_ends[index - 1] if index else 0
        return self._stamps[start:self._stamp_ends[index]].decode("utf-8", "surrogatepass")

    def tokens(self, index: int) -> int:
        """Message *index*'s token count."""
        return self._tokens[index]

    def flags(self, index: int) -> int:
        """Message *index*'s flags (0: it counts)."""
        return self._flags[index]

    def has_digest(self, digest: str) -> bool:
        """A message has *digest* (a search of the digest column: no string is made per message)."""
        packed = self._packed_only(digest)
        if packed is None:
            return False
        start = 0
        while (at := self._digests.find(packed, start)) >= 0:
            if at % DIGEST_BYTES == 0:
                return True
            start = at + 1
        return False

    def digests(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """The digests of messages *start* to *stop*, without making their MessageInfos."""
        return self._column(self._digests, start, stop)

    def line_digests(self) -> Iterator[str]:
        """The line digests of every message, without making their MessageInfos."""
        return self._column(self._line_digests, 0, None)

    def _column(self, data: bytearray, start: int, stop: int | None) -> Iterator[str]:
        start, stop, _ = slice(start, stop).indices(len(self))
        for first in range(start, stop, ROWS_BLOCK):
            last = min(first + ROWS_BLOCK, stop)
            column = data[first * DIGEST_BYTES:last * DIGEST_BYTES].hex()
            for index in range(first, last):
                at = (index - first) * _HEX
                yield column[at:at + _HEX]

    def rows(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[str, str, str, str, int, int]]:
        """The fields of the messages from *start* (to *stop*), in MessageInfo's order, made a block of columns
        at a time (a first scan writes a row for every message)."""
        stop = len(self) if stop is None else min(stop, len(self))
        for first in range(max(0, start), stop, ROWS_BLOCK):
            yield from self._block(first, min(first + ROWS_BLOCK, stop))

    def _block(self, first: int, last: int) -> Iterator[tuple[str, str, str, str, int, int]]:
        lines = self._line_digests[first * DIGEST_BYTES:last * DIGEST_BYTES].hex()
        digests = self._digests[first * DIGEST_BYTES:last * DIGEST_BYTES].hex()
        base = self._stamp_ends[first - 1] if first else 0
        stamps = self._stamps[base:self._stamp_ends[last - 1]]
        text = stamps.decode("utf-8", "surrogatepass")
        ascii_only = len(text) == len(stamps)  # then byte offsets are character offsets
        names, roles, ends, tokens, flags = self._role_names, self._roles, self._stamp_ends, self._tokens, self._flags
        start = 0
        for index in range(first, last):
            end = ends[index] - base
            stamp = text[start:end] if ascii_only else stamps[start:end].decode("utf-8", "surrogatepass")
            at = (index - first) * _HEX
            yield lines[at:at + _HEX], digests[at:at + _HEX], names[roles[index]], stamp, tokens[index], flags[index]
            start = end

    def total_tokens(self, start: int = 0, stop: int | None = None) -> int:
        """The tokens of messages *start* to *stop*."""
        return sum(self._tokens[start:stop])

    # -- copies --------------------------------------------------------------------------------------
    def copy(self) -> MessageList:
        """A MessageList of the same messages that changes apart from this one."""
        return self._slice(slice(None))

    def _slice(self, part: slice) -> MessageList:
        start, stop, step = part.indices(len(self))
        if step != 1:
            return MessageList(self[index] for index in range(start, stop, step))
        stop = max(start, stop)
        copy = MessageList()
        copy._line_digests = self._line_digests[start * DIGEST_BYTES:stop * DIGEST_BYTES]
        copy._digests = self._digests[start * DIGEST_BYTES:stop * DIGEST_BYTES]
        copy._roles = self._roles[start:stop]
        copy._role_names = list(self._role_names)
        copy._role_numbers = dict(self._role_numbers)
        first = self._stamp_ends[start - 1] if start else 0
        copy._stamps = self._stamps[first:self._stamp_ends[stop - 1]] if stop > start else bytearray()
        ends = self._stamp_ends[start:stop]
        copy._stamp_ends = array("q", (end - first for end in ends)) if first else ends
        copy._tokens = self._tokens[start:stop]
        copy._flags = self._flags[start:stop]
        return copy
