"""A large history.jsonl (tens of MB) and the peak memory of what nanobotd does with it.

Shared by the memory test (tests/jobs/test_history_memory.py) and scripts/bench_history_memory.py, which
prints the same figures for any checkout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from nanobotd.config.schema import LLMSettings, WorkspaceSettings
from nanobotd.daemon.triggers import rebuild_archive_marks
from nanobotd.faults import FaultAbort, FaultPoints
from nanobotd.jobs.audit import audit_workspace
from nanobotd.jobs.compaction import compact_history, compaction_candidates
from nanobotd.jobs.consolidate import archive
from nanobotd.jobs.dream.inputs import read_backlog
from nanobotd.jobs.env import JobEnv
from nanobotd.memory import history
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from tests.support.llmworker import llm_client
from tests.support.workspace import conversation, make_workspace, write_session

NOW = datetime(2026, 11, 22, 10, 30)
ENTRIES = 6_000
CONTENT_CHARS = 8_000  # about 8.3 KB a line (long [RAW] entries): 6,000 entries make a ~50 MB file
SPAN_EVERY = 2  # every other entry is nanobotd's own, with the archive span of a session
BAD_EVERY = 3_000  # a few unreadable lines, which every rewrite keeps
KEEP_FRACTION = 0.9  # compaction keeps this share of the entries; the oldest tenth (all dreamt) goes
UNDREAMT_FRACTION = 0.01  # the share of entries after .dream_cursor: the dream's backlog


@dataclass(frozen=True)
class BigHistory:
    """A workspace whose memory holds a large history, with the job environment that works on it."""

    ctx: JobEnv
    sessions: Path
    size: int  # bytes of history.jsonl

    @property
    def memory_dir(self) -> Path:
        """The workspace's memory folder."""
        return self.ctx.memory_dir


def write_big_history(path: Path, entries: int = ENTRIES, content_chars: int = CONTENT_CHARS) -> int:
    """Write *entries* entries (plus a few unreadable lines) to *path* quickly; return the file's size."""
    filler = ("lorem ipsum dolor sit amet consectetur " * (content_chars // 39 + 1))[:content_chars]
    with open(path, "w", encoding="utf-8") as handle:
        block = []
        for cursor in range(1, entries + 1):
            record = {"cursor": cursor, "timestamp": f"2026-{1 + cursor * 10 // entries:02d}-01 10:00",
                      "content": f"- [durable] fact {cursor} {filler}"}
            if cursor % SPAN_EVERY == 0:
                record["session_key"] = f"cli:s{cursor % 7}"
                record[history.SPAN_FIELD] = {"run": f"run-{cursor:08d}", "first": f"{cursor:064x}",
                                              "last": f"{cursor + 3:064x}", "count": 4}
            block.append(json.dumps(record))
            if cursor % BAD_EVERY == 0:
                block.append('{"cursor": "not a number", "content": 1}')
            if len(block) >= 5_000:
                handle.write("\n".join(block) + "\n")
                block = []
        if block:
            handle.write("\n".join(block) + "\n")
    return path.stat().st_size


def big_history(tmp_path: Path, entries: int = ENTRIES, content_chars: int = CONTENT_CHARS) -> BigHistory:
    """A workspace with a large history.jsonl, .cursor and .dream_cursor, and a state DB and tracker."""
    workspace, sessions = make_workspace(tmp_path)
    memory = workspace / "memory"
    memory.mkdir(exist_ok=True)
    size = write_big_history(history.history_path(memory), entries, content_chars)
    (memory / history.CURSOR_NAME).write_text(str(entries))
    (memory / history.DREAM_CURSOR_NAME).write_text(str(entries - int(entries * UNDREAMT_FRACTION)))
    settings = WorkspaceSettings(path=workspace, name="ws", llm=LLMSettings(model="none"))
    store = StateStore(tmp_path / "state").open()
    ctx = JobEnv(settings, store, SessionTracker("ws", store), llm_client(settings.llm), lambda: NOW)
    return BigHistory(ctx, sessions, size)


def crashed_consolidation(big: BigHistory):
    """A consolidation that wrote its entries at the end of the big history and died before marking them."""
    ctx = big.ctx
    ctx.tracker.scan(write_session(big.sessions, "cli:crash", conversation(4)))
    run_id = ctx.store.create_run("consolidate", "ws", session_key="cli:crash")
    dying = dataclasses.replace(ctx, faults=FaultPoints({"consolidate.appended": "abort"}))
    with contextlib.suppress(FaultAbort):
        asyncio.run(archive.consolidate_session(dying, "cli:crash", run_id, reason="manual"))
    return ctx.store.get_run(run_id)


def peak_of(operation: Callable[[], object]) -> tuple[object, int, float]:
    """(result, peak bytes Python allocated while *operation* ran over what was allocated before, seconds)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        started = time.perf_counter()
        result = operation()
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before, elapsed


def operations(big: BigHistory, tmp_path: Path) -> dict[str, Callable[[], object]]:
    """Name -> what nanobotd does with the whole history, in the order they run (compaction changes the file).

    Each returns what it found, so a caller can check it did its work: the compaction candidates and the
    entries removed, the recovery's outcome, the archive marks rebuilt, the backlog's entries and the
    audit's count of entries.
    """
    ctx, memory = big.ctx, big.memory_dir
    dream_cursor = history.read_dream_cursor(memory)
    keep = int(dream_cursor / (1 - UNDREAMT_FRACTION) * KEEP_FRACTION)
    workspace = SimpleNamespace(env=ctx, name="ws", tracker=ctx.tracker)  # what rebuild_archive_marks reads
    crashed = crashed_consolidation(big)
    state: dict = {}

    def candidates():
        state["cursors"] = compaction_candidates(memory, keep)
        return len(state["cursors"])

    def compact():
        removal = compact_history(memory, tmp_path / "run", state["cursors"], lambda record: None)
        return removal["removed"] if removal else 0

    def marks():
        rebuild_archive_marks(workspace)
        return len(ctx.tracker.pending("cli:crash"))  # messages still unarchived: none, after the recovery

    return {
        "compaction_candidates": candidates,
        "compact_history": compact,
        "recover_consolidation": lambda: archive.recover_consolidation(ctx, crashed),
        "rebuild_archive_marks": marks,
        "read_backlog": lambda: len(read_backlog(memory, dream_cursor).entries),
        "audit": lambda: audit_workspace(ctx.settings, store=ctx.store, now=NOW, lifecycle_plan=[],
                                         extra_state={})["state"]["history_entries"],
    }


def measure(tmp_path: Path, entries: int = ENTRIES, content_chars: int = CONTENT_CHARS) -> tuple[int, dict]:
    """(size of history.jsonl, {operation: (result, peak bytes, seconds)}) on a fresh big history in *tmp_path*.

    Every operation runs once on a small history first, so one-time costs (imports, compiled patterns,
    caches) are not counted against the big one.
    """
    warm = big_history(tmp_path / "warm-up", entries=50, content_chars=100)
    for operation in operations(warm, tmp_path / "warm-up").values():
        operation()
    big = big_history(tmp_path / "big", entries, content_chars)
    return big.size, {name: peak_of(operation) for name, operation in operations(big, tmp_path / "big").items()}
