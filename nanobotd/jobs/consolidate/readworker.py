"""A chunk-reading process: reads the chunks of an archive run without an LLM for the daemon, a few ahead.

Archiving a long session offline is CPU work in one process, and nearly half of it was reading each chunk's
records (from the session's held version of the file), decoding them, rendering the chunk's [RAW] entries and
backup, and encoding the entries for history.jsonl. Here a child process does that for the next chunks while the
daemon archives the current one, on another core: the daemon still queries the spool rows (under the tracker's
lock), journals, appends and marks.
It exits when stdin closes, as it does when the daemon dies.

A request: (the held version's path, its shift, the chunk's spool rows, the [RAW] entry size, where its backup
goes), as `tokenprocess.encode` frames it. The answer: a ReadChunk once its backup is written (synced), or why
it could not read every record (a held line gone or changed): the daemon then reads that chunk itself, and
says what it could not read.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nanobotd import fsio
from nanobotd.memory.history import PreparedEntry, prepare_entry
from nanobotd.memory.transcript import PendingMessage, raw_entries
from nanobotd.sessions import spool as spooldb
from nanobotd.sessions.hold import read_held_lines
from nanobotd.tokenprocess import encode, read_item


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


def read_chunk(path: Path, shift: int, rows: list[tuple], raw_max_chars: int,
               backup: Path) -> tuple[ReadChunk, str] | str:
    """The chunk of spool *rows*, its held lines read from *path* (with *shift*), and the text of its backup (to
    be written to *backup*, which the answer names); why not, when a record is unreadable."""
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
    entries = [entry for entry in map(prepare_entry, raw_entries(messages, raw_max_chars)) if entry is not None]
    chunk = ReadChunk([seq for seq, _, _ in loaded], [message.digest for message in messages],
                      [int(message.tokens) for message in messages], str(backup), entries)
    return chunk, backup_text(loaded)


def serve(requests: BinaryIO, answers: BinaryIO) -> int:
    """Answer requests until *requests* ends. A chunk is answered once its backup is written and synced, by a
    thread that does that while the next chunk is read (a chunk's two syncs were a third of this process's time,
    its CPU idle meanwhile); answers go in the order asked, at most WRITES_WAITING chunks behind the reading."""
    written: queue.Queue = queue.Queue(WRITES_WAITING)
    writer = threading.Thread(target=_write_answers, args=(written, answers), name="backups", daemon=True)
    writer.start()
    while (request := read_item(requests)) is not None:
        path, shift, rows, raw_max_chars, backup = request
        try:
            written.put(read_chunk(Path(path), shift, rows, raw_max_chars, Path(backup)))
        except (OSError, ValueError, TypeError) as exc:  # the daemon reads (and backs up) the chunk itself
            written.put(f"{type(exc).__name__}: {exc}")
    written.put(None)
    writer.join()
    return 0


WRITES_WAITING = 2  # chunks read and waiting for their backups' writes (their entries held meanwhile)


def _write_answers(written: queue.Queue, answers: BinaryIO) -> None:
    """Write each chunk's backup, then its answer (the answer of a chunk not read, or not backed up, is why). An
    answer that cannot be written (the daemon is gone) ends the process, as it would have ended a single thread."""
    while (item := written.get()) is not None:
        if isinstance(item, str):
            answer: ReadChunk | str = item
        else:
            answer, backup = item
            try:
                fsio.atomic_write(answer.backup, backup)
            except OSError as exc:
                answer = f"{type(exc).__name__}: {exc}"
        try:
            answers.write(encode(answer))
            answers.flush()
        except BaseException:
            traceback.print_exc()
            os._exit(1)
