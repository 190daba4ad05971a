"""A chunk-reading process: reads the chunks of an archive run without an LLM for the daemon, a few ahead.

Archiving a long session offline is CPU work in one process, and nearly half of it was reading each chunk's
records (from the session's held version of the file), decoding them, rendering the chunk's [RAW] entries and
backup, and encoding the entries for history.jsonl. Here a child process does that for the next chunks while the
daemon archives the current one, on another core: the daemon still queries the spool rows (under the tracker's
lock), journals, appends and marks.
It exits when stdin closes, as it does when the daemon dies.

A request: (the held version's path, its shift, the chunk's spool rows, the [RAW] entry size, where its backup
goes), as `parseworker.encode` frames it. The answer: a ReadChunk once its backup is written (synced), or why
it could not read every record (a held line gone or changed): the daemon then reads that chunk itself, and
says what it could not read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nanobotd import fsio
from nanobotd.memory.history import PreparedEntry, prepare_entry
from nanobotd.memory.transcript import PendingMessage, raw_entries
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.hold import read_held_lines
from nanobotd.sessions.parseworker import encode, read_item


@dataclass
class ReadChunk:
    """A chunk's messages as an archive run without an LLM uses them: no message is kept, only what is written."""

    seqs: list[int]
    digests: list[str]
    tokens: list[int]
    backup: str  # the path of the chunk's backup, written
    entries: list[PreparedEntry]  # its [RAW] history entries, ready to append


def backup_text(loaded: list[tuple[int, PendingMessage, str]]) -> str:
    """A chunk's backup file: each message's record as the spool holds its JSON text (not re-encoded)."""
    lines = [f'{{"digest":{json.dumps(message.digest)},"tokens":{int(message.tokens)},"record":{raw}}}'
             for _, message, raw in loaded]
    return "\n".join(lines) + "\n"


def read_chunk(path: Path, shift: int, rows: list[tuple], raw_max_chars: int, backup: Path) -> ReadChunk | str:
    """The chunk of spool *rows*, its held lines read from *path* (with *shift*), backed up to *backup*; why
    not, when a record is unreadable."""
    lines = spooldb.held_lines(rows)
    if any(lines):
        try:
            held = read_held_lines(path, shift, lines)
        except OSError as exc:
            return f"held version unreadable ({type(exc).__name__}: {exc})"
    else:
        held = [None] * len(rows)
    if any(line is not None and text is None for line, text in zip(lines, held, strict=True)):
        return "a held line is gone or changed"
    texts = [row[6] if line is None else text for row, line, text in zip(rows, lines, held, strict=True)]
    loaded = spooldb.spooled_messages(rows, texts)
    messages = [message for _, message, _ in loaded]
    fsio.atomic_write(backup, backup_text(loaded))
    return ReadChunk([seq for seq, _, _ in loaded], [message.digest for message in messages],
                     [int(message.tokens) for message in messages], str(backup),
                     [entry for entry in map(prepare_entry, raw_entries(messages, raw_max_chars)) if entry is not None])


def serve(requests: BinaryIO, answers: BinaryIO) -> int:
    """Answer requests until *requests* ends."""
    while (request := read_item(requests)) is not None:
        path, shift, rows, raw_max_chars, backup = request
        try:
            answer: ReadChunk | str = read_chunk(Path(path), shift, rows, raw_max_chars, Path(backup))
        except (OSError, ValueError, TypeError) as exc:  # the daemon reads (and backs up) the chunk itself
            answer = f"{type(exc).__name__}: {exc}"
        answers.write(encode(answer))
        answers.flush()
    return 0
