"""Which spooled messages a consolidation run archives, in which chunks, and reading their records.

A run is planned from the spool's (seq, role, tokens) alone; each chunk's records are read from the spool
only when it is archived, one chunk ahead, so a long session's records are never all in memory.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from nanobotd.jobs.common import JobEnv
from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions.spool import SpoolPlan

SAFETY_MARGIN = 1.2
PROMPT_OVERHEAD_TOKENS = 600


@dataclass
class Chunk:
    """Consecutive spooled messages archived together: planned from (seq, role, tokens) alone and kept as
    their sequence numbers and token total, their records loaded from the spool only when the chunk is
    archived (`load`), so at most two chunks' records are in memory (see ChunkLoads)."""

    planned: array  # the sequence numbers
    planned_tokens: int
    oversized: bool = False
    loaded: list[tuple[int, PendingMessage, str]] = field(default_factory=list)

    @classmethod
    def of(cls, items: list[tuple[int, str, int]], *, oversized: bool = False) -> Chunk:
        return cls(array("q", [seq for seq, _, _ in items]), sum(tokens for _, _, tokens in items), oversized)

    @property
    def messages(self) -> list[PendingMessage]:
        return [message for _, message, _ in self.loaded]

    @property
    def seqs(self) -> list[int]:
        return [seq for seq, _, _ in self.loaded] if self.loaded else list(self.planned)

    @property
    def tokens(self) -> int:
        if self.loaded:
            return sum(message.tokens for _, message, _ in self.loaded)
        return self.planned_tokens

    def load(self, ctx: JobEnv, session_key: str) -> bool:
        """Read the chunk's records from the spool; False when none is left there (archived meanwhile)."""
        self.loaded = ctx.tracker.spooled_messages(session_key, list(self.planned))
        return bool(self.loaded)


def chunk_ratio(ctx: JobEnv, tokens: Sequence[int]) -> float:
    """0.4 of the window for ordinary messages, falling toward 0.15 as the average message grows."""
    settings = ctx.settings.consolidation
    if not tokens:
        return settings.chunk_ratio_max
    average = sum(tokens) / len(tokens) * SAFETY_MARGIN
    pressure = min(1.0, average / (ctx.settings.llm.context_window * 0.05))
    return settings.chunk_ratio_max - (settings.chunk_ratio_max - settings.chunk_ratio_min) * pressure


def select_messages(ctx: JobEnv, pending: SpoolPlan, reason: str, *, vanished_only: bool = False) -> SpoolPlan:
    """What this run archives, of the spool's plan: all of it (not budget); otherwise a plan of its own
    (arrays: a long session's selection is every message) with the vanished messages always, then the
    oldest until the tail fits the target.

    *vanished_only* (beside an agent that archives by itself): never a message still in the session file.
    """
    if not vanished_only and reason != "budget":
        return pending
    selected = SpoolPlan()
    if vanished_only:
        for seq, role, tokens, present in pending:
            if not present:
                selected.add(seq, role, tokens, present)
        return selected
    target = ctx.settings.budget * ctx.settings.consolidation.ratio
    remaining = sum(tokens for _, _, tokens, present in pending if present)
    for seq, role, tokens, present in pending:
        if not present:
            selected.add(seq, role, tokens, present)
            continue
        if remaining <= target and (role == "user" or not selected):
            break
        selected.add(seq, role, tokens, present)
        remaining -= tokens
    return selected


def plan_chunks(ctx: JobEnv, selected: SpoolPlan) -> list[Chunk]:
    """Split into chunks that fit one request and end just before a user message."""
    window = ctx.settings.llm.context_window
    ratio = chunk_ratio(ctx, selected.tokens)
    limit = max(1000, int(window * ratio / SAFETY_MARGIN) - PROMPT_OVERHEAD_TOKENS)
    chunks: list[Chunk] = []
    current: list[tuple[int, str, int]] = []
    size = 0
    for seq, role, tokens, _ in selected:
        item = (seq, role, tokens)
        if tokens > window // 2:
            if current:
                chunks.append(Chunk.of(current))
                current, size = [], 0
            chunks.append(Chunk.of([item], oversized=True))
            continue
        if current and size + tokens > limit:
            cut = _last_user_boundary(current)
            if cut == 0:
                cut = len(current)
            chunks.append(Chunk.of(current[:cut]))
            current = current[cut:]
            size = sum(tokens for _, _, tokens in current)
        current.append(item)
        size += tokens
    if current:
        chunks.append(Chunk.of(current))
    return chunks


def _last_user_boundary(items: list[tuple[int, str, int]]) -> int:
    """Index of the last user message (a chunk may end just before it); 0 when there is none."""
    for index in range(len(items) - 1, 0, -1):
        if items[index][1] == "user":
            return index
    return 0


class ChunkLoads:
    """The chunks' records read one chunk ahead, in a thread: the next chunk is read while the current one is
    archived (its backup, history append and marks spend much of their time in fsync and SQLite, without the
    GIL), and the event loop never reads records itself. At most two chunks' records are in memory."""

    def __init__(self, ctx: JobEnv, session_key: str, chunks: list[Chunk]):
        self.ctx, self.session_key, self.chunks = ctx, session_key, chunks
        self.pending: asyncio.Future[bool] | None = None
        self._start(0)

    async def take(self, number: int) -> bool:
        """Chunk *number* loaded (False: none of its messages is left in the spool); the next one starts."""
        assert self.pending is not None
        loaded = await self.pending
        self._start(number + 1)
        return loaded

    def cancel(self) -> None:
        """The run ends: a read still going is left to finish in its thread, its records unused."""
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None

    def _start(self, number: int) -> None:
        self.pending = None
        if number < len(self.chunks):
            load = asyncio.to_thread(self.chunks[number].load, self.ctx, self.session_key)
            self.pending = asyncio.ensure_future(load)
