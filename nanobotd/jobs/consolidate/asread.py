"""A session held unread, archived raw as its held copy is read: one pass, each line decoded once.

Without an LLM, a run that meets a session whose lines were never read (held unread at a first start) does not read it
into the spool and then read each chunk back: the tracker reads the held copy (`SessionTracker.read_archiving`) and
tells an ArchivingRead of each message as it decodes it. The pass cuts chunks as `chunks.plan_chunks` does and archives
a group of them as soon as the run surely archives them (every chunk; for a budget run, those followed by more than the
tail it leaves), each backed up from the lines read, journalled, appended and marked as any chunk is
(`appending.append_group`), with no spool row. When the copy ends, a budget run's last chunks are cut as
`chunks.plan_budget` cuts them, and what stays unarchived is spooled by the read itself.

A crash leaves the session unread and the chunks marked so far archived: its next read spools only the rest, and the
run's recovery finishes or rolls back the group it interrupted, from the journal and backups as for any run."""

from __future__ import annotations

import asyncio
from array import array
from collections import deque

from nanobotd.jobs.consolidate.appending import (
    PendingMarks,
    append_group,
    journal_records,
    raw_summary,
    record_outcomes,
)
from nanobotd.jobs.consolidate.chunks import Chunk, chunk_limit, plan_chunks
from nanobotd.jobs.env import JobEnv, note_progress
from nanobotd.llm.reply import UsageMeter
from nanobotd.memory.agent_history import dropped_part
from nanobotd.memory.transcript import PendingMessage
from nanobotd.sessions.file import RawLine
from nanobotd.sessions.spool import SpoolPlan, line_text
from nanobotd.tuning import APPEND_GROUP_CHUNKS, APPEND_GROUP_TOKENS

Item = tuple[int, PendingMessage, str]  # (message number, the message, its line as the spool would keep it)


class ArchivingRead:
    """The pass over one unread session's held copy for run *run_id*: `take` each message as it is decoded, then
    `end`, which archives what the run still archives and answers the messages archived (the read spools none)."""

    def __init__(self, env: JobEnv, session_key: str, run_id: str, manifest: dict, *, budget: bool,
                 usage: UsageMeter) -> None:
        session = env.tracker.sessions[session_key]
        self.env, self.session_key, self.run_id, self.manifest, self.usage = env, session_key, run_id, manifest, usage
        self.marks = PendingMarks(env, session_key, run_id, manifest, unspooled=True)
        self.window = env.settings.llm.context_window
        # the estimates of its bytes stand for the selection's sizes (as the read goes, its size is not known)
        self.limit = chunk_limit(env, session.unarchived_tokens, session.unarchived_messages)
        self.target = env.settings.budget * env.settings.consolidation.ratio if budget else None
        self.below = session.agent_archived  # under the agent's mark: archived by the agent
        self.known = env.tracker.archived_digests(session_key)  # a crashed run's chunks, marked before the crash
        self.agent_held = env.tracker.agent_held.get(session_key) or {}
        self.open: list[Item] = []  # the chunk being cut
        self.open_tokens, self.last_user = 0, 0
        self.waiting: deque[tuple[Chunk, int]] = deque()  # a budget run's cut chunks, with the tokens read to their end
        self.read = 0  # the tokens of the messages taken so far
        self.group: list[tuple[int, Chunk]] = []
        self.chunks = 0
        self.archived: set[int] = set()  # the numbers of the messages archived
        self.outcomes: list[str] = []
        self.stopped = False

    def stop(self) -> None:
        """The run was cancelled (a stop, a reload): the pass changes nothing more and ends at its next step, and the
        session's next read (its run's recovery) does not wait for it; what it appended and did not mark, that
        recovery finishes."""
        self.stopped = True
        self.env.tracker.let_pass_go(self.session_key)

    def _go_on(self) -> None:
        if self.stopped:
            raise asyncio.CancelledError("the consolidation was stopped")

    def take(self, number: int, message: PendingMessage, line: RawLine) -> None:
        """Message *number* was decoded: cut into a chunk, archived once the run surely archives it."""
        if number < self.below or message.digest in self.known:
            return
        tokens = message.tokens
        if held := self.agent_held.get(message.digest):  # the agent's cut [RAW] entry holds its start
            message = dropped_part(message, held)
        item = (number, message, line_text(line.data))
        if tokens > self.window // 2:  # alone in a chunk that is never sent
            self._cut(len(self.open))
            self._cut_items([item], tokens, oversized=True)
        else:
            if self.open and self.open_tokens + tokens > self.limit:
                self._cut(self.last_user if self.last_user > 0 else len(self.open))
            self.open.append(item)
            self.open_tokens += tokens
            if message.role == "user":
                self.last_user = len(self.open) - 1
        self.read += tokens
        while self.waiting and self.read - self.waiting[0][1] > self.target:
            self._archive(self.waiting.popleft()[0])

    def end(self) -> set[int]:
        """The copy is read: archive what the run still archives (a budget run: down to its target, cut before a user
        message, as `plan_budget`), mark it all; returns the numbers of the messages archived."""
        items = [item for chunk, _ in self.waiting for item in chunk.loaded] + self.open
        self.waiting.clear()
        self.open = []
        if self.target is not None:
            items = items[:_budget_cut(items, self.target)]
        plan = SpoolPlan()
        by_number = {}
        for item in items:
            plan.add(item[0], item[1].role, item[1].tokens, True)
            by_number[item[0]] = item
        for chunk in plan_chunks(self.env, plan, limit=self.limit):
            chunk.loaded = [by_number[number] for number in chunk.planned]
            self._archive(chunk)
        self._append()
        self._go_on()
        self.marks.commit_now()
        self._go_on()
        return self.archived

    def _cut(self, end: int) -> None:
        """The open chunk's first *end* messages make a chunk; the rest stay open."""
        if end:
            head, self.open = self.open[:end], self.open[end:]
            tokens = sum(item[1].tokens for item in head)
            self.open_tokens -= tokens
            self.last_user = 0
            self._cut_items(head, tokens)

    def _cut_items(self, items: list[Item], tokens: int, *, oversized: bool = False) -> None:
        chunk = Chunk(array("q", [item[0] for item in items]), tokens, oversized, loaded=items)
        if self.target is None:
            self._archive(chunk)
        else:  # archived once more than the tail it leaves was read after it
            self.waiting.append((chunk, self.read - self.open_tokens))

    def _archive(self, chunk: Chunk) -> None:
        self.group.append((self.chunks, chunk))
        self.chunks += 1
        if (len(self.group) >= APPEND_GROUP_CHUNKS
                or sum(chunk.planned_tokens for _, chunk in self.group) >= APPEND_GROUP_TOKENS):
            self._append()

    def _append(self) -> None:
        """The group's chunks in history, as archive_chunks appends a group: their marks wait in self.marks."""
        if not self.group:
            return
        self._go_on()
        note_progress(self.manifest, "archiving", self.group[0][0], None)
        summaries = [(number, chunk, *raw_summary(self.env, chunk)) for number, chunk in self.group]
        records = journal_records(self.env, self.run_id, summaries, self.manifest, self.usage)
        append_group(self.env, self.session_key, self.run_id, records, self.manifest)
        self._go_on()
        self.outcomes += record_outcomes(self.env, self.run_id, records, self.manifest, self.usage, self.marks)
        for _, chunk in self.group:
            self.archived.update(chunk.planned)
            chunk.release()
        self.group = []
        if self.marks.due():
            self._go_on()
            self.marks.commit_now()


def _budget_cut(items: list[Item], target: float) -> int:
    """How many of *items* (the oldest first) a budget run archives: those before the oldest user message of the
    newest ones that fit *target*; none when all fit, all when no user message does (as `chunks.plan_budget`)."""
    tail = 0
    for index in range(len(items) - 1, -1, -1):
        tail += items[index][1].tokens
        if tail > target:
            first_fitting = index + 1
            break
    else:
        return 0
    for index in range(first_fitting, len(items)):
        if items[index][1].role == "user":
            return index
    return len(items)
