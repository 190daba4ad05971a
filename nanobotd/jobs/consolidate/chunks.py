"""Which spooled messages a consolidation run archives, in which chunks, and reading their records.

A run is planned from the spool's (seq, role, tokens) alone; each chunk's records are read from the spool
only when it is archived, one chunk ahead, so a long session's records are never all in memory.
"""

from __future__ import annotations

import asyncio
import functools
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from nanobotd import fsio
from nanobotd.jobs.common import JobEnv
from nanobotd.jobs.consolidate.reader import ChunkReader
from nanobotd.jobs.consolidate.readworker import ReadChunk, backup_text
from nanobotd.memory.agent_history import dropped_part
from nanobotd.memory.history import PreparedEntry
from nanobotd.memory.transcript import PendingMessage, raw_entries
from nanobotd.sessions.spool import PlanWindow, SpoolPlan
from nanobotd.tokenprocess import counting_processes

SAFETY_MARGIN = 1.2
PROMPT_OVERHEAD_TOKENS = 600
READER_MIN_CHUNKS = 8  # fewer chunks are read in the daemon: the process's start (~0.15 s) would not pay
# chunks asked of the reading process beyond the next: enough that it always has one queued while the run appends a
# group (up to APPEND_GROUP_CHUNKS, 8) and commits a batch of marks (their loads wait meanwhile); 6 left it waiting
# ~0.4 s of a 100k-message run once its backups were written beside its reading. Each in a thread of the run's own
# (READER_AHEAD + 1 threads)
READER_AHEAD = 12


@dataclass
class Chunk:
    """Consecutive spooled messages archived together: planned from (seq, role, tokens) alone and kept as
    their sequence numbers and token total, their records loaded from the spool only when the chunk is
    archived (`load`), so at most two chunks' records are in memory (see ChunkLoads)."""

    planned: array  # the sequence numbers
    planned_tokens: int
    oversized: bool = False
    loaded: list[tuple[int, PendingMessage, str]] = field(default_factory=list)
    read: ReadChunk | None = None  # or read by the chunk-reading process (a run without an LLM: no messages)

    @property
    def messages(self) -> list[PendingMessage]:
        return [message for _, message, _ in self.loaded]

    @property
    def seqs(self) -> list[int]:
        if self.read is not None:
            return self.read.seqs
        return [seq for seq, _, _ in self.loaded] if self.loaded else list(self.planned)

    @property
    def digests(self) -> list[str]:
        return self.read.digests if self.read is not None else [message.digest for _, message, _ in self.loaded]

    @property
    def tokens(self) -> int:
        if self.read is not None:
            return sum(self.read.tokens)
        if self.loaded:
            return sum(message.tokens for _, message, _ in self.loaded)
        return self.planned_tokens

    def raw_entries(self, max_chars: int) -> list[str] | list[PreparedEntry]:
        """The chunk's [RAW] history entries (prepared already, when the chunk-reading process read it)."""
        return self.read.entries if self.read is not None else raw_entries(self.messages, max_chars)

    @property
    def backed_up(self) -> bool:
        """Its backup is written already (by the reading process, which read it)."""
        return self.read is not None

    def back_up(self, path: Path) -> Path:
        """The chunk's messages in its backup file *path* (`archive.backup_path`: where the reading process wrote
        them already, when it read the chunk)."""
        if not self.backed_up:
            fsio.atomic_write(path, backup_text(self.loaded))
        return path

    def load(self, ctx: JobEnv, session_key: str, reader: ChunkReader | None = None,
             backup: Path | None = None) -> bool:
        """Read the chunk's records from the spool (by *reader*, when given and it can, which also backs them
        up to *backup*); False when none is left there (archived meanwhile)."""
        if reader is not None and reader.closed:  # the run ended before this read began: it is never used
            return False
        agent_held = ctx.tracker.agent_held.get(session_key)
        if reader is not None and backup is not None and not agent_held:
            rows, held, shift = ctx.tracker.spooled_rows(session_key, list(self.planned))
            if rows:
                self.read = reader.read(held, shift, rows, ctx.settings.consolidation.raw_max_chars, backup)
                if self.read is not None:
                    return bool(self.read.seqs)
        self.loaded = ctx.tracker.spooled_messages(session_key, list(self.planned))
        if agent_held:  # a message the agent's cut [RAW] entry holds the start of: only the rest is archived
            self.loaded = [(seq, dropped_part(message, agent_held.get(message.digest, 0)), line)
                           for seq, message, line in self.loaded]
        return bool(self.loaded)

    def release(self) -> None:
        """Archived: its records are let go."""
        self.loaded, self.read = [], None


def chunk_ratio(ctx: JobEnv, total: int, count: int) -> float:
    """0.4 of the window for ordinary messages (*count* of *total* tokens), falling toward 0.15 as the average
    message grows."""
    settings = ctx.settings.consolidation
    if not count:
        return settings.chunk_ratio_max
    average = total / count * SAFETY_MARGIN
    pressure = min(1.0, average / (ctx.settings.llm.context_window * 0.05))
    return settings.chunk_ratio_max - (settings.chunk_ratio_max - settings.chunk_ratio_min) * pressure


def chunk_limit(ctx: JobEnv, total: int, count: int) -> int:
    """The tokens a chunk may hold, for a selection of *count* messages of *total* tokens."""
    window = ctx.settings.llm.context_window
    return max(1000, int(window * chunk_ratio(ctx, total, count) / SAFETY_MARGIN) - PROMPT_OVERHEAD_TOKENS)


def early_reader(ctx: JobEnv, session_key: str, reason: str, *, vanished_only: bool = False) -> ChunkReader | None:
    """A chunk-reading process started before the run is planned (reading the plan of a long session takes about
    as long as the process's start), when the run surely wants one: it has no LLM, archives every unarchived
    message, and their tokens fill READER_MIN_CHUNKS chunks or more (no chunk holds more than chunk_limit). None
    otherwise, or with a counting process alive (see ChunkLoads)."""
    session = ctx.tracker.sessions.get(session_key)
    if (session is None or not ctx.llm.offline or vanished_only or reason == "budget" or counting_processes()
            or session.unarchived_tokens < READER_MIN_CHUNKS * chunk_limit(ctx, session.unarchived_tokens,
                                                                           session.unarchived_messages)):
        return None
    return _new_reader()


def _new_reader() -> ChunkReader | None:
    """A chunk-reading process; None when it cannot start (the daemon reads the chunks)."""
    try:
        return ChunkReader()
    except OSError as exc:
        logger.warning("cannot start a chunk-reading process: {}; chunks are read in the daemon", exc)
        return None


def plan_run(ctx: JobEnv, session_key: str, reason: str, *, vanished_only: bool = False) -> list[Chunk]:
    """The chunks a run archives: every spooled message; a budget run, the oldest until the tail fits the target
    (`budget_chunks`); *vanished_only* (beside an agent that archives by itself), only the messages no longer in
    the session file."""
    if vanished_only:
        plan = vanished_messages(ctx.tracker.spool_plan(session_key))
    elif reason == "budget":
        return budget_chunks(ctx, session_key, ctx.settings.consolidation.max_rounds)
    else:
        plan = ctx.tracker.spool_plan(session_key)
    return plan_chunks(ctx, plan)


def vanished_messages(pending: SpoolPlan) -> SpoolPlan:
    """The messages of *pending* no longer in the session file."""
    selected = SpoolPlan()
    for seq, role, tokens, present in pending:
        if not present:
            selected.add(seq, role, tokens, present)
    return selected


def budget_chunks(ctx: JobEnv, session_key: str, most: int) -> list[Chunk]:
    """A budget run's first *most* chunks. It selects the oldest messages until the tail still in the file fits
    the target (budget x ratio), ending just before a user message (or at the very first); the vanished messages
    among them are taken whatever their size. Of the session's plan only its newest messages are read (back to
    where the selection ends) and its oldest (as far as *most* chunks go), a page at a time: a long session's
    whole plan is not read for a few chunks (100k messages: 70 ms)."""
    return ctx.tracker.plan_window(session_key, lambda window: plan_budget(ctx, window, most))


PLAN_PAGE = 1024  # messages of a plan read at a time by a budget run (each page of its oldest twice the one before)


def plan_budget(ctx: JobEnv, window: PlanWindow, most: int, page_size: int = PLAN_PAGE) -> list[Chunk]:
    """`budget_chunks` of the plan *window* gives."""
    newest, whole = _fitting_tail(window, ctx.settings.budget * ctx.settings.consolidation.ratio, page_size)
    cut = None
    for index, (seq, role, present) in enumerate(reversed(newest)):
        if present and ((whole and index == 0) or role == "user"):  # the very first message, or a user's
            cut = seq
            break
    if cut is None:  # no user message in the tail (or no tail fits): every message is selected
        return plan_chunks(ctx, window.oldest(), most=most)
    count, tokens = window.totals(cut)
    limit = chunk_limit(ctx, tokens, count)
    head, size = SpoolPlan(), page_size
    while True:
        head.extend(window.oldest(min(size, count - len(head)), after=head.seqs[-1] if head else None,
                                  before=cut))
        chunks = plan_chunks(ctx, head, most=most, limit=limit)
        if len(head) >= count or (len(chunks) == most and chunks[-1].planned[-1] < head.seqs[-1]):
            return chunks  # every selected message read, or the last chunk ends before the last one read
        size *= 2


def _fitting_tail(window: PlanWindow, target: float, page_size: int) -> tuple[list[tuple[int, str, bool]], bool]:
    """The newest messages as far back as their tail (those still in the file) fits *target*, the last first, as
    (seq, role, present); and whether that is every message."""
    newest: list[tuple[int, str, bool]] = []
    tail, before = 0, None
    while True:
        page = window.newest(page_size, before=before)
        for seq, role, tokens, present in page:
            tail += tokens if present else 0
            if tail > target:
                return newest, False
            newest.append((seq, role, present))
        if len(page) < page_size:
            return newest, True
        before = page.seqs[-1]


def plan_chunks(ctx: JobEnv, selected: SpoolPlan, *, most: int | None = None,
                limit: int | None = None) -> list[Chunk]:
    """Split into chunks that fit one request and end just before a user message: all of them, or the first
    *most* (a chunk is final once the next one begins, so the rest are never planned). *limit*: the tokens a chunk
    may hold, when *selected* is only the start of the selection (its chunk_limit otherwise)."""
    window = ctx.settings.llm.context_window
    limit = chunk_limit(ctx, sum(selected.tokens), len(selected)) if limit is None else limit
    seqs, roles, tokens = selected.seqs, selected.roles, selected.tokens
    most = len(selected) if most is None else most
    chunks: list[Chunk] = []

    def close(first: int, end: int, *, oversized: bool = False) -> None:
        chunks.append(Chunk(seqs[first:end], sum(tokens[first:end]), oversized))

    first, size, last_user = 0, 0, 0  # the current chunk: its first message, its tokens, its last user message
    for index in range(len(selected)):
        if len(chunks) >= most:
            return chunks[:most]
        if tokens[index] > window // 2:  # alone in a chunk that is never sent
            if index > first:
                close(first, index)
            close(index, index + 1, oversized=True)
            first, size, last_user = index + 1, 0, 0
            continue
        if index > first and size + tokens[index] > limit:
            cut = last_user if last_user > first else index  # before its last user message, or all of it
            close(first, cut)
            first, size, last_user = cut, sum(tokens[cut:index]), 0
        size += tokens[index]
        if roles[index] == "user":
            last_user = index
    if len(selected) > first:
        close(first, len(selected))
    return chunks[:most]


class ChunkLoads:
    """The chunks' records read ahead, in threads: the next chunk is read while the current one is archived (its
    backup, history append and marks spend much of their time in fsync and SQLite, without the GIL), and the
    event loop never reads records itself. At most two chunks' records are in memory (with a reading process,
    READER_AHEAD more chunks' entries and backup lines).

    A run that renders every chunk raw (no LLM) of READER_MIN_CHUNKS chunks or more has them read and backed up
    by a chunk-reading process (`reader`), on another core, from the second chunk on (the first is read here
    while the process starts; with a counting process alive, from the first chunk after it went),
    READER_AHEAD chunks ahead (its backups' fsyncs wait in that process, not in the
    run), in threads of the run's own (the loads wait there for the process's answers, in the order asked, and
    would otherwise hold the threads the run appends and marks in). The backups of chunks read ahead that the run
    never reached (it failed or was cancelled first) go when it ends; only a chunk it took and failed to journal
    leaves its backup in the run folder, unlisted in the run's manifest.
    """

    def __init__(self, ctx: JobEnv, session_key: str, chunks: list[Chunk], *,
                 raw_backups: Callable[[int], Path] | None = None, started: ChunkReader | None = None):
        """*started*: a process started already (`early_reader`), used when the run wants one, let go if not."""
        self.ctx, self.session_key, self.chunks = ctx, session_key, chunks
        self.pending: dict[int, asyncio.Future[bool]] = {}
        self.reader: ChunkReader | None = None
        self.backups = raw_backups
        self._threads: ThreadPoolExecutor | None = None  # the loads' threads, while the process reads
        self._reader_wanted = raw_backups is not None and len(chunks) >= READER_MIN_CHUNKS
        self._start(0)
        self._start_reader(started)

    def _start_reader(self, started: ChunkReader | None = None) -> None:
        """The chunk-reading process (*started*, or one started now), when the run wants one and no counting process
        is alive (a scan's, ~57 MB: the two together would hold more than the run is allowed; until it goes,
        chunks are read here)."""
        if not self._reader_wanted or counting_processes():
            if started is not None:
                started.close()
            return
        self._reader_wanted = False
        self.reader = started or _new_reader()
        if self.reader is not None:
            self._threads = ThreadPoolExecutor(READER_AHEAD + 1, thread_name_prefix="chunk-load")

    async def take(self, number: int) -> bool:
        """Chunk *number* loaded (False: none of its messages is left in the spool); the next ones start."""
        loaded = await self.pending.pop(number)
        self._start_reader()
        self._start(number + 1)
        return loaded

    def ready(self, number: int) -> bool:
        """Chunk *number* is being read and its records are in (take() would not wait)."""
        pending = self.pending.get(number)
        return pending is not None and pending.done()

    def cancel(self) -> None:
        """The run ends: reads still going are left to finish in their threads, their records unused; the
        chunk-reading process goes, and with it the backups it wrote (or began) for chunks never taken: the run
        never journalled them."""
        for pending in self.pending.values():
            pending.cancel()
        untaken, self.pending = list(self.pending), {}
        if self.reader is not None:
            self.reader.close()
            for number in untaken:
                _drop_backup(self.backups(number))
        if self._threads is not None:
            self._threads.shutdown(wait=False)

    def _start(self, number: int) -> None:
        """Chunk *number* and, with a reading process, the READER_AHEAD after it are being read."""
        last = number + (READER_AHEAD if self.reader is not None and not self.reader.failed else 0)
        for ahead in range(number, min(last + 1, len(self.chunks))):
            if ahead not in self.pending:
                backup = self.backups(ahead) if self.reader is not None else None
                load = functools.partial(self.chunks[ahead].load, self.ctx, self.session_key, self.reader, backup)
                self.pending[ahead] = asyncio.get_running_loop().run_in_executor(self._threads, load)


def _drop_backup(path: Path) -> None:
    """A chunk's backup (and a temp file of it a killed process left) that its run never journalled."""
    for leftover in (path, *fsio.temp_files(path)):
        leftover.unlink(missing_ok=True)
