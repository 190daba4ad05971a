"""Which spooled messages a consolidation run archives, in which chunks, and reading their records.

A run is planned from the spool's (seq, role, tokens) alone, sizes being the tracker's estimates (a raw archive needs no
exact count; a chunk sent to an LLM is counted exactly when sent); each chunk's records are read only when it is
archived, a few ahead, so a long session's records are never all in memory."""

from __future__ import annotations

import asyncio
import os
import threading
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nanobotd.jobs.env import JobEnv
from nanobotd.memory.agent_history import dropped_part
from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions.spool import PlanWindow, SpoolPlan
from nanobotd.tuning import PLAN_PAGE, PROMPT_OVERHEAD_TOKENS, SAFETY_MARGIN


@dataclass
class Chunk:
    """Consecutive spooled messages archived together, kept as sequence numbers and a token total; their records are
    loaded only when archived (`load`), so at most two chunks' records are in memory (see ChunkLoads)."""

    planned: array  # the sequence numbers
    planned_tokens: int
    oversized: bool = False
    loaded: list[tuple[int, PendingMessage, str]] = field(default_factory=list)
    backed_up: bool = False
    counted: int | None = None  # its exact tokens, counted only when it is sent to an LLM

    @property
    def messages(self) -> list[PendingMessage]:
        return [message for _, message, _ in self.loaded]

    @property
    def seqs(self) -> list[int]:
        return [seq for seq, _, _ in self.loaded] if self.loaded else list(self.planned)

    @property
    def digests(self) -> list[str]:
        return [message.digest for _, message, _ in self.loaded]

    @property
    def tokens(self) -> int:
        """Its exact tokens when counted, else the tracker's sizes it was planned with (an estimate)."""
        return self.planned_tokens if self.counted is None else self.counted

    def back_up(self, path: Path) -> None:
        """The chunk's messages in its new backup file *path* (`appending.backup_path`), its writeback started; the
        caller syncs it with its folder, once for the chunks appended together, before the journal names it."""
        if self.backed_up:
            return
        # each message's record as the spool holds its JSON text (not re-encoded)
        lines = [f'{{"digest":"{message.digest}","tokens":{int(message.tokens)},"record":{raw}}}'  # a hex digest
                 for _, message, raw in self.loaded]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as handle:
            handle.write(("\n".join(lines) + "\n").encode("utf-8"))
            handle.flush()
            # the advice starts the writeback now (Linux): the group's sync finds it done or going
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self.backed_up = True

    def load(self, env: JobEnv, session_key: str) -> bool:
        """Read the chunk's records from the spool; False when none is left there (archived meanwhile)."""
        agent_held = env.tracker.agent_held.get(session_key)
        self.loaded = env.tracker.spooled_messages(session_key, list(self.planned))
        if agent_held:  # a message the agent's cut [RAW] entry holds the start of: only the rest is archived
            self.loaded = [(seq, dropped_part(message, agent_held.get(message.digest, 0)), line)
                           for seq, message, line in self.loaded]
        return bool(self.loaded)

    def release(self) -> None:
        """Archived: its records are let go."""
        self.loaded = []


def chunk_ratio(env: JobEnv, total: int, count: int) -> float:
    """0.4 of the window for ordinary messages (*count* of *total* tokens), falling toward 0.15 as the average
    message grows."""
    settings = env.settings.consolidation
    if not count:
        return settings.chunk_ratio_max
    average = total / count * SAFETY_MARGIN
    pressure = min(1.0, average / (env.settings.llm.context_window * 0.05))
    return settings.chunk_ratio_max - (settings.chunk_ratio_max - settings.chunk_ratio_min) * pressure


def chunk_limit(env: JobEnv, total: int, count: int) -> int:
    """The tokens a chunk may hold, for a selection of *count* messages of *total* tokens."""
    window = env.settings.llm.context_window
    return max(1000, int(window * chunk_ratio(env, total, count) / SAFETY_MARGIN) - PROMPT_OVERHEAD_TOKENS)


def plan_run(env: JobEnv, session_key: str, reason: str, *, vanished_only: bool = False) -> list[Chunk]:
    """The chunks a run archives: every spooled message; for a budget run the oldest until the tail fits
    (`plan_budget`); *vanished_only* (beside an archiving agent): only messages gone from the session file."""
    if vanished_only:
        plan = vanished_messages(env.tracker.spool_plan(session_key))
    elif reason == "budget":  # rounds bound a trigger's LLM calls: a raw archive makes none
        most = None if env.llm.offline else env.settings.consolidation.max_rounds
        return env.tracker.plan_window(session_key, lambda window: plan_budget(env, window, most))
    else:
        plan = env.tracker.spool_plan(session_key)
    return plan_chunks(env, plan)


def vanished_messages(pending: SpoolPlan) -> SpoolPlan:
    """The messages of *pending* no longer in the session file."""
    selected = SpoolPlan()
    for seq, role, tokens, present in pending:
        if not present:
            selected.add(seq, role, tokens, present)
    return selected


def plan_budget(env: JobEnv, window: PlanWindow, most: int | None, page_size: int = PLAN_PAGE) -> list[Chunk]:
    """A budget run's first *most* chunks (None: all): the oldest messages until the tail left in the file fits
    budget x ratio, ending before a user message, vanished ones taken whatever their size; only the plan's ends are
    read."""
    newest, whole = _fitting_tail(window, env.settings.budget * env.settings.consolidation.ratio, page_size)
    cut = None
    for index, (seq, role, present) in enumerate(reversed(newest)):
        if present and ((whole and index == 0) or role == "user"):  # the very first message, or a user's
            cut = seq
            break
    if cut is None:  # no user message in the tail (or no tail fits): every message is selected
        return plan_chunks(env, window.oldest(), most=most)
    count, tokens = window.totals(cut)
    limit = chunk_limit(env, tokens, count)
    head, size = SpoolPlan(), page_size
    while True:
        head.extend(window.oldest(min(size, count - len(head)), after=head.seqs[-1] if head else None,
                                  before=cut))
        chunks = plan_chunks(env, head, most=most, limit=limit)
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


def plan_chunks(env: JobEnv, selected: SpoolPlan, *, most: int | None = None,
                limit: int | None = None) -> list[Chunk]:
    """Split into chunks that fit one request and end just before a user message: all, or the first *most* (a chunk is
    final once the next begins). *limit*: a chunk's tokens when *selected* starts the selection."""
    window = env.settings.llm.context_window
    limit = chunk_limit(env, sum(selected.tokens), len(selected)) if limit is None else limit
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
    """The chunks' records read ahead in an executor thread while the current ones are archived (their appends and marks
    spend their time in fsync and SQLite, without the GIL); at most *ahead* + 1 chunks' records are in memory.

    With *backups* (a run without an LLM), a chunk read ahead is backed up there too, its writeback started beside the
    appends (a group's backups are synced together before its journal); backups of chunks never taken go at the end."""

    def __init__(self, env: JobEnv, session_key: str, chunks: list[Chunk], *, ahead: int = 1,
                 backups: Callable[[int], Path] | None = None):
        self.env, self.session_key, self.chunks, self.ahead, self.backups = env, session_key, chunks, ahead, backups
        self.pending: dict[int, asyncio.Future[bool]] = {}
        self._last: asyncio.Future[bool] | None = None
        self._ended = False
        self._ending = threading.Lock()  # a backup is written whole before the run's end, or not at all
        self._start(0)

    async def take(self, number: int) -> bool:
        """Chunk *number* loaded (False: none of its messages is left in the spool); the next ones start."""
        loaded = await self.pending.pop(number)
        self._start(number + 1)
        return loaded

    def ready(self, number: int) -> bool:
        """Chunk *number* is being read and its records are in (take() would not wait)."""
        pending = self.pending.get(number)
        return pending is not None and pending.done()

    def cancel(self) -> None:
        """The run ends: a read still going is left to finish in its thread, its records unused, and the backups
        of the chunks never taken go."""
        for pending in self.pending.values():
            pending.cancel()
        with self._ending:
            self._ended = True
        for number in self.pending if self.backups is not None else ():
            self.backups(number).unlink(missing_ok=True)
        self.pending = {}

    def _start(self, number: int) -> None:
        for ahead in range(number, min(number + self.ahead + 1, len(self.chunks))):
            if ahead not in self.pending:
                self._last = self.pending[ahead] = asyncio.ensure_future(self._load(ahead, self._last))

    async def _load(self, number: int, previous: asyncio.Future[bool] | None) -> bool:
        if previous is not None:
            await asyncio.wait([previous])  # read in order, one at a time
        return await asyncio.to_thread(self._read, number)

    def _read(self, number: int) -> bool:
        chunk = self.chunks[number]
        loaded = chunk.load(self.env, self.session_key)
        if loaded and self.backups is not None:
            with self._ending:
                if not self._ended:
                    chunk.back_up(self.backups(number))
        return loaded
