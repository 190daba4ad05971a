"""A group of chunks into history.jsonl, as every consolidation appends one: each chunk backed up, its cursors
journalled (with a hash of their content) before the one append of the group, its messages marked archived afterwards,
a batch of chunks at a time, in one transaction with the journal saying they are done (`PendingMarks`). Shared by the
runs that read their chunks from the spool (archive.py) and the pass that archives a held copy as it reads it
(asread.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import NamedTuple

from nanobotd import fsio
from nanobotd.jobs.consolidate.chunks import Chunk
from nanobotd.jobs.env import JobEnv
from nanobotd.llm.reply import UsageMeter
from nanobotd.memory import history
from nanobotd.memory.transcript import raw_entries
from nanobotd.state.runsteps import STEPS_KEY, write_steps
from nanobotd.tuning import MARK_BATCH_CHUNKS, MARK_BATCH_SECONDS

OFFLINE_REASON = "offline mode: no LLM configured"
OVERSIZED_REASON = "a message over half the context window is never sent to the LLM"
GROWING_KEYS = (STEPS_KEY, "cursors")  # journalled as steps (chunks) or made from them (cursors), not in the head


def backup_path(env: JobEnv, run_id: str, number: int) -> Path:
    """Where a run's chunk *number* is backed up: its messages, each record as the spool holds its JSON text."""
    return env.store.run_dir(run_id) / f"chunk-{number:03d}.jsonl"


def manifest_head(manifest: dict) -> dict:
    """What the run's own row journals while it archives: the manifest less what grows with every chunk."""
    return {key: value for key, value in manifest.items() if key not in GROWING_KEYS}


class PendingMarks:
    """Chunks whose entries reached history, awaiting archive marks: committed a batch at a time in one transaction with
    the journal saying they are done, so a crash leaves both or neither (chunks not yet done, recovery finishes)."""

    def __init__(self, env: JobEnv, session_key: str, run_id: str, manifest: dict, *, unspooled: bool = False):
        self.env, self.session_key, self.run_id, self.manifest = env, session_key, run_id, manifest
        self.unspooled = unspooled  # archived as a held copy is read: no spool row (tracker.mark_read)
        self.records: list[tuple[int, dict]] = []  # (chunk number, its record)
        self.digests: list[str] = []
        self.seqs: list[int] = []
        self.tokens = 0
        self.since = 0.0

    def add(self, number: int, record: dict, digests: list[str], seqs: list[int], tokens: int) -> None:
        if not self.records:
            self.since = time.monotonic()
        self.records.append((number, record))
        self.digests.extend(digests)
        self.seqs.extend(seqs)
        self.tokens += tokens

    def due(self) -> bool:
        return bool(self.records) and (len(self.records) >= MARK_BATCH_CHUNKS
                                       or time.monotonic() - self.since >= MARK_BATCH_SECONDS)

    async def commit(self) -> None:
        """Mark the waiting chunks' messages archived, off the event loop."""
        if self.records:
            await asyncio.to_thread(self.commit_now)

    def commit_now(self) -> None:
        if not self.records:
            return
        for _, record in self.records:
            record["done"] = True
        seqs = self.seqs if len(self.seqs) == len(self.digests) else None
        steps, head = self.records, manifest_head(self.manifest)
        journal = lambda db: write_steps(db, self.run_id, steps, head)  # noqa: E731
        if self.unspooled:
            self.env.tracker.mark_read(self.session_key, self.digests, self.tokens, self.run_id, also=journal)
        else:
            self.env.tracker.mark_archived(self.session_key, self.digests, self.run_id, seqs=seqs, also=journal)
        self.records, self.digests, self.seqs, self.tokens = [], [], [], 0
        self.env.faults.reach("consolidate.marked")


def raw_summary(env: JobEnv, chunk: Chunk) -> tuple[str, list[str], str]:
    """summarize_chunk's answer without an LLM: the chunk's [RAW] entries."""
    reason = OVERSIZED_REASON if chunk.oversized else OFFLINE_REASON
    return "raw_fallback", raw_entries(chunk.messages, env.settings.consolidation.raw_max_chars), reason


class Summarised(NamedTuple):
    """A chunk of a group on its way to history: its number, its record in the run's manifest, what it became."""

    number: int
    chunk: Chunk
    record: dict
    outcome: str
    reason: str
    contents: list[str]  # its entries
    span: dict  # the messages its entries stand for, written with them (history.SPAN_FIELD)
    digests: list[str]
    seqs: list[int]


def journal_records(env: JobEnv, run_id: str, summaries: list[tuple[int, Chunk, str, list[str], str]],
                    manifest: dict, usage: UsageMeter) -> list[Summarised]:
    """Each summarised chunk (number, chunk, outcome, entry contents, reason) with its record, in the manifest."""
    records = []
    for number, chunk, outcome, contents, reason in summaries:
        digests, seqs, backup = chunk.digests, chunk.seqs, backup_path(env, run_id, number)
        record = {
            "seq": [seqs[0], seqs[-1]], "count": len(digests),
            "first_digest": digests[0], "last_digest": digests[-1],
            "tokens": chunk.tokens, "outcome": outcome, "oversized": chunk.oversized,
            "backup": str(backup), "done": False,
        }
        if reason:
            record["fallback_reason"] = reason
        manifest["chunks"].append(record)
        span = {"run": run_id, "first": digests[0], "last": digests[-1], "count": len(digests)}
        records.append(Summarised(number, chunk, record, outcome, reason, contents, span, digests, seqs))
    manifest["tokens"] = usage.to_json()
    return records


def append_group(env: JobEnv, session_key: str, run_id: str, records: list[Summarised], manifest: dict) -> None:
    """Back the chunks of *records* up, journal their cursors, then append their entries to history in one append.
    Recovery looks only at chunks whose cursors were journalled, so a chunk's record is journalled with its cursors
    (before the append), or with done (no entry to append), not on its own before."""
    backups = [Path(item.record["backup"]) for item in records]
    for item, backup in zip(records, backups, strict=True):
        item.chunk.back_up(backup)
    # the backups and their names, durable together before the journal names them
    fsio.sync_folder(env.store.run_dir(run_id), backups)
    # each chunk's entries ready for history; one left empty once cleaned is not appended
    prepared = [[entry for entry in map(history.prepare_entry, item.contents) if entry is not None]
                for item in records]
    written = [(entry, item.span) for entries, item in zip(prepared, records, strict=True) for entry in entries]

    def journal_cursors(cursors: list[int]) -> None:
        steps, cursors = [], iter(cursors)
        for item, entries in zip(records, prepared, strict=True):
            if entries:
                item.record["cursors"] = [next(cursors) for _ in entries]
                item.record["hashes"] = [entry.hash for entry in entries]
                steps.append((item.number, item.record))
        env.store.journal_steps(run_id, steps, manifest_head(manifest))
        env.faults.reach("consolidate.journalled")

    history.append_prepared(env.memory_dir, written, session_key, env.now(), before_write=journal_cursors)
    env.faults.reach("consolidate.appended")


def record_outcomes(env: JobEnv, run_id: str, records: list[Summarised], manifest: dict, usage: UsageMeter,
                    marks: PendingMarks) -> list[str]:
    """After the append: the chunks' marks wait in *marks*, their outcome rows go in one commit; their outcomes."""
    outcomes = []
    with env.store.transaction():
        for item in records:
            item.record.setdefault("cursors", [])
            manifest["cursors"].extend(item.record["cursors"])
            marks.add(item.number, item.record, item.digests, item.seqs, item.chunk.planned_tokens)
            row = {"summarized": "written", "nothing": "no_change"}.get(item.outcome, item.outcome)
            env.store.record_outcome("consolidate", env.settings.name, row, run_id=run_id, reason=item.reason,
                                     tokens=usage.prompt_tokens + usage.completion_tokens,
                                     latency_ms=usage.latencies_ms[-1] if usage.latencies_ms else None)
            outcomes.append(item.outcome)
    return outcomes
