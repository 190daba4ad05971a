"""A parse process: reads whole session files for the daemon, counting their tokens itself.

A cold start reads every session file from its first line (no parse to reuse). The daemon's reconciling thread
spent most of its time in the parse (JSON, digests) while its counting process counted beside it: one core
busy with Python, the other with tiktoken. Here each process parses and counts whole files, two of them side
by side, and the daemon is left with the writes (`parsepool.ParsesAhead`). The process exits when stdin closes,
as it does when the daemon dies.

A request: `<I` length, then the pickled (path, encoding name). The answer: `<I` length, then the pickled
(fingerprint, ParseResult) of the version read, or (None, why) when the file could not be read.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import BinaryIO

from nanobotd import fsio
from nanobotd.sessions.scan import ParseResult, parse_session
from nanobotd.tokens import count_text, get_encoding
from nanobotd.tokenworker import LENGTH, read_exactly

Fingerprint = tuple[int, int, int]


class _Counted:
    """Counts already counted, as a counter's pending answer."""

    def __init__(self, counts: list[int]) -> None:
        self._counts = counts

    def result(self) -> list[int]:
        return self._counts


def count_here(texts: list[str], encoding_name: str) -> _Counted:
    """A batch counted at once in this process (the counting process's count of each text)."""
    encoding = get_encoding(encoding_name)
    return _Counted([count_text(encoding, text) for text in texts])


def parse_file(path: Path, encoding_name: str) -> tuple[Fingerprint, ParseResult]:
    """The whole file parsed and counted, and which version of it was read (inode, size, mtime: the tracker's
    fingerprint), opened as the tracker opens it."""
    with fsio.open_regular(path) as handle:
        info = os.fstat(handle.fileno())
        parsed = parse_session(path, encoding_name, handle=handle, counter=count_here)
    return (info.st_ino, info.st_size, info.st_mtime_ns), parsed


def encode(item: object) -> bytes:
    """One request or answer as it travels (pickled: the daemon's own child, and a parse holds arrays)."""
    data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(data)) + data


def read_item(stream: BinaryIO) -> object | None:
    """The next request or answer; None at the end of the stream."""
    head = read_exactly(stream, LENGTH.size)
    data = None if head is None else read_exactly(stream, LENGTH.unpack(head)[0])
    return None if data is None else pickle.loads(data)


def serve(requests: BinaryIO, answers: BinaryIO) -> int:
    """Answer requests until *requests* ends."""
    while (request := read_item(requests)) is not None:
        path, encoding_name = request
        try:
            answer: tuple = parse_file(Path(path), encoding_name)
        except (OSError, ValueError) as exc:  # the daemon reads it again itself, and says why if it fails too
            answer = (None, f"{type(exc).__name__}: {exc}")
        answers.write(encode(answer))
        answers.flush()
    return 0
