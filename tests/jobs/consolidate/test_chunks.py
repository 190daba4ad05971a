"""What a run archives and in which chunks: the selection of a budget run is found from the tail's end and the chunks
are planned on the plan's arrays, but both must be exactly what the plain walk over every message gives (kept
here as the reference), for any plan: vanished messages, oversized ones, sessions without a user message."""

from __future__ import annotations

import types
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd.config.schema import ConsolidationSettings, LLMSettings, WorkspaceSettings
from nanobotd.jobs.consolidate.chunks import chunk_ratio, plan_chunks, select_messages
from nanobotd.sessions.spool import SpoolPlan, read_plan
from nanobotd.state.store import StateStore

ROLES = ("user", "assistant", "tool", "system")


def reference_selection(target: float, pending: list[tuple[int, str, int, bool]]) -> list[tuple]:
    """A budget run's selection as a walk from the oldest message: the vanished ones always, then the oldest
    until the tail still in the file fits *target*, stopping only before a user message (or at the first)."""
    selected: list[tuple] = []
    remaining = sum(tokens for _, _, tokens, present in pending if present)
    for seq, role, tokens, present in pending:
        if not present:
            selected.append((seq, role, tokens, present))
            continue
        if remaining <= target and (role == "user" or not selected):
            break
        selected.append((seq, role, tokens, present))
        remaining -= tokens
    return selected


def reference_chunks(window: int, limit: int, selected: list[tuple]) -> list[tuple[list[int], int, bool]]:
    """Chunks as (seqs, tokens, oversized), built a message at a time: a chunk over *limit* is cut before its
    last user message (whole when it has none after its first), a message over half the window is alone."""
    chunks, current, size = [], [], 0

    def close(items: list[tuple], oversized: bool = False) -> None:
        chunks.append(([seq for seq, _, _ in items], sum(tokens for _, _, tokens in items), oversized))

    for seq, role, tokens, _ in selected:
        if tokens > window // 2:
            if current:
                close(current)
                current, size = [], 0
            close([(seq, role, tokens)], oversized=True)
            continue
        if current and size + tokens > limit:
            cut = next((index for index in range(len(current) - 1, 0, -1) if current[index][1] == "user"), 0)
            cut = cut or len(current)
            close(current[:cut])
            current = current[cut:]
            size = sum(tokens for _, _, tokens in current)
        current.append((seq, role, tokens))
        size += tokens
    if current:
        close(current)
    return chunks


def _context(window: int, ratio: float, max_tokens: int) -> types.SimpleNamespace:
    settings = WorkspaceSettings(path=Path("/nonexistent"), name="ws",
                                 llm=LLMSettings(context_window=window, max_tokens=max_tokens),
                                 consolidation=replace(ConsolidationSettings(), ratio=ratio))
    return types.SimpleNamespace(settings=settings)


def _plan(messages: list[tuple[str, int, bool]]) -> tuple[SpoolPlan, list[tuple]]:
    plan, rows = SpoolPlan(), []
    for seq, (role, tokens, present) in enumerate(messages, start=1):
        plan.add(seq, role, tokens, present)
        rows.append((seq, role, tokens, present))
    return plan, rows


def _as_tuples(chunks) -> list[tuple[list[int], int, bool]]:
    return [(list(chunk.planned), chunk.planned_tokens, chunk.oversized) for chunk in chunks]


MESSAGE = st.tuples(st.sampled_from(ROLES),
                    st.one_of(st.integers(0, 400), st.integers(400, 6000)),  # some over half a small window
                    st.booleans() | st.just(True))


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=120), window=st.sampled_from([2000, 4000, 9000, 200_000]),
       ratio=st.sampled_from([0.0, 0.1, 0.5, 1.0]), max_tokens=st.integers(0, 3000),
       most=st.integers(1, 6))
def test_budget_selection_and_chunks_are_the_walk_over_every_message(messages, window, ratio, max_tokens, most):
    ctx = _context(window, ratio, max_tokens)
    plan, rows = _plan(messages)
    target = ctx.settings.budget * ratio
    selected = select_messages(ctx, plan, "budget")
    expected = reference_selection(target, rows)
    assert list(selected) == expected
    if not expected:
        return
    limit = max(1000, int(window * chunk_ratio(ctx, sum(row[2] for row in expected), len(expected)) / 1.2) - 600)
    planned = reference_chunks(window, limit, expected)
    assert _as_tuples(plan_chunks(ctx, selected)) == planned
    assert _as_tuples(plan_chunks(ctx, selected, most=most)) == planned[:most]


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=80), reason=st.sampled_from(["manual", "idle", "rescue"]))
def test_other_runs_take_every_message_and_vanished_only_runs_only_the_vanished(messages, reason):
    ctx = _context(9000, 0.5, 1000)
    plan, rows = _plan(messages)
    assert list(select_messages(ctx, plan, reason)) == rows
    assert list(select_messages(ctx, plan, reason, vanished_only=True)) == [row for row in rows if not row[3]]


def test_a_budget_run_of_a_long_session_reads_its_tail_and_plans_only_its_chunks():
    """100,000 messages of 40 tokens and a target of 197: the selection is every message but the last exchange
    (4 messages), found without reading the older ones' tokens; the chunks stop at the run's rounds, in order."""
    ctx = _context(4000, 0.1, 1000)
    roles = ["user", "assistant", "tool", "assistant"]
    plan, _ = _plan([(roles[index % 4], 40, True) for index in range(100_000)])
    read = []

    class Counted(list):
        def __getitem__(self, index):
            read.append(index)
            return super().__getitem__(index)

    counted = replace_tokens(plan, Counted(plan.tokens))
    selected = select_messages(ctx, counted, "budget")
    assert round(ctx.settings.budget * 0.1, 6) == 197.6
    assert len(selected) == 99_996 and selected[-1] == (99_996, "assistant", 40, True) and plan[99_996][1] == "user"
    assert len(read) < 40
    chunks = plan_chunks(ctx, selected, most=5)
    assert len(chunks) == 5 and list(chunks[0].planned)[0] == 1
    assert [seq for chunk in chunks for seq in chunk.planned] == list(range(1, chunks[-1].planned[-1] + 1))


def replace_tokens(plan: SpoolPlan, tokens) -> SpoolPlan:
    copy = plan.prefix(len(plan))
    copy.tokens = tokens
    return copy


def test_the_plan_read_from_the_spool_marks_the_vanished_messages(tmp_path):
    """Read with and without vanished digests: the same seqs, roles and tokens; only the vanished are absent,
    and a role's text is kept once however many messages have it."""
    store = StateStore(tmp_path).open()
    try:
        with store.transaction() as db:
            db.execute("INSERT INTO sessions (workspace, key, path) VALUES ('ws', 'cli:a', '/x')")
            session_id = db.execute("SELECT id FROM sessions").fetchone()[0]
            db.executemany(
                "INSERT INTO spool (session_id, digest, seq, role, timestamp, tokens, record, seen_at)"
                " VALUES (?, ?, ?, ?, '', ?, '', 0)",
                [(session_id, f"d{seq}", seq, ROLES[seq % 3], seq * 2) for seq in range(1, 301)])
        whole = read_plan(store, session_id, set())
        gone = read_plan(store, session_id, {"d5", "d300", "unknown"})
    finally:
        store.close()
    assert list(whole) == [(seq, ROLES[seq % 3], seq * 2, True) for seq in range(1, 301)]
    assert list(gone) == [(seq, ROLES[seq % 3], seq * 2, seq not in (5, 300)) for seq in range(1, 301)]
    assert len({id(role) for role in whole.roles}) == 3
