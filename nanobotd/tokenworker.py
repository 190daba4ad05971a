"""The counting process: counts batches of texts' tokens for the daemon, beside it.

A reconcile reading several session files has their tokens counted here, not in the daemon's threads: tiktoken
encodes without the GIL, but each text's call takes the GIL twice, and beside a scanning thread busy
in Python every take waits. The daemon writes a batch to stdin and reads its counts from stdout (see
`tokenprocess.CountingProcess`); the process exits when stdin closes, as it does when the daemon dies.

A request: `<I` length, then the pickled (encoding name, texts). The answer: `<I` texts, then a `<I`
count each, in the order asked.
"""

from __future__ import annotations

import pickle
import struct
from array import array
from typing import BinaryIO

from nanobotd.tokens import count_text, get_encoding

LENGTH = struct.Struct("<I")


def encode_request(texts: list[str], encoding_name: str) -> bytes:
    """One batch, as the counting process reads it (pickled: the daemon's own child, and pickle keeps the
    lone surrogates json.loads may give a text)."""
    data = pickle.dumps((encoding_name, texts), protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(data)) + data


def read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    """*size* bytes, or None at the end of the stream (a short read at the end is the end too)."""
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def serve(requests: BinaryIO, answers: BinaryIO) -> int:
    """Answer batches until *requests* ends."""
    while (head := read_exactly(requests, LENGTH.size)) is not None:
        data = read_exactly(requests, LENGTH.unpack(head)[0])
        if data is None:
            return 0
        encoding_name, texts = pickle.loads(data)
        encoding = get_encoding(encoding_name)
        counts = array("I", [count_text(encoding, text) for text in texts])
        answers.write(LENGTH.pack(len(counts)) + counts.tobytes())
        answers.flush()
    return 0
