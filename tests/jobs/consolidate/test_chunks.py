"""What a run archives and in which chunks. A budget run reads only the newest messages of its session's plan (back
to where its selection ends) and the oldest (as far as its chunks go), a page at a time, and chunks are planned on
the plan's arrays; both must give exactly what the plain walk over every message gives (kept here as the
reference), for any plan: vanished messages, oversized ones, sessions without a user message, any page size."""

from __future__ import annotations

import itertools
import tempfile
import types
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd.config.schema import ConsolidationSettings, LLMSettings, WorkspaceSettings
from nanobotd.jobs.consolidate.chunks import chunk_ratio, plan_budget, plan_chunks, vanished_messages
from nanobotd.sessions.spool import PlanWindow, SpoolPlan, read_plan
from nanobotd.state.store import StateStore
from nanobotd.tuning import PLAN_PAGE

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


def reference_limit(window: int, env, selected: list[tuple]) -> int:
    return max(1000, int(window * chunk_ratio(env, sum(row[2] for row in selected), len(selected)) / 1.2) - 600)


def _context(window: int, ratio: float, max_tokens: int) -> types.SimpleNamespace:
    settings = WorkspaceSettings(path=Path("/nonexistent"), name="ws",
                                 llm=LLMSettings(context_window=window, max_tokens=max_tokens),
                                 consolidation=replace(ConsolidationSettings(), ratio=ratio))
    return types.SimpleNamespace(settings=settings)


def _as_tuples(planned) -> list[tuple[list[int], int, bool]]:
    return [(list(chunk.planned), chunk.planned_tokens, chunk.oversized) for chunk in planned]


class _Spool:
    """Sessions' spools in one state database, a new session each time (seqs start at 1 or after a gap)."""

    def __init__(self, folder: Path) -> None:
        self.store = StateStore(folder).open()
        self.numbers = itertools.count(1)

    def session(self, messages: list[tuple[str, int, bool]], first_seq: int = 1) -> tuple[int, set[str], list]:
        number = next(self.numbers)
        rows = [(first_seq + index, role, tokens, present) for index, (role, tokens, present) in enumerate(messages)]
        with self.store.transaction() as db:
            session_id = db.execute("INSERT INTO sessions (workspace, key, path) VALUES ('ws', ?, '/x')",
                                    (f"cli:{number}",)).lastrowid
            db.executemany(
                "INSERT INTO spool (session_id, digest, seq, role, timestamp, tokens, record, seen_at)"
                " VALUES (?, ?, ?, ?, '', ?, '', 0)",
                [(session_id, f"{number}-{seq}", seq, role, tokens) for seq, role, tokens, _ in rows])
        gone = {f"{number}-{seq}" for seq, _, _, present in rows if not present}
        return session_id, gone, rows


@pytest.fixture(scope="module")
def spools():
    with tempfile.TemporaryDirectory() as folder:
        made = _Spool(Path(folder))
        yield made
        made.store.close()


MESSAGE = st.tuples(st.sampled_from(ROLES),
                    st.one_of(st.integers(0, 400), st.integers(400, 6000)),  # some over half a small window
                    st.booleans() | st.just(True))


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=120), window=st.sampled_from([2000, 4000, 9000, 200_000]),
       ratio=st.sampled_from([0.0, 0.1, 0.5, 1.0]), max_tokens=st.integers(0, 3000),
       most=st.integers(1, 6), page_size=st.integers(1, 8) | st.just(PLAN_PAGE),
       first_seq=st.sampled_from([1, 7]))
def test_a_budget_runs_chunks_read_a_page_at_a_time_are_the_walk_over_every_message(
        spools, messages, window, ratio, max_tokens, most, page_size, first_seq):
    env = _context(window, ratio, max_tokens)
    session_id, gone, rows = spools.session(messages, first_seq)
    expected = reference_selection(env.settings.budget * ratio, rows)
    planned = reference_chunks(window, reference_limit(window, env, expected), expected) if expected else []
    got = plan_budget(env, PlanWindow(spools.store, session_id, gone), most, page_size)
    assert _as_tuples(got) == planned[:most]


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(MESSAGE, max_size=120), window=st.sampled_from([2000, 4000, 9000, 200_000]),
       most=st.integers(1, 6) | st.none())
def test_chunks_planned_on_the_plans_arrays_are_the_walk_over_every_message(messages, window, most):
    env = _context(window, 0.5, 1000)
    plan = SpoolPlan()
    rows = []
    for seq, (role, tokens, present) in enumerate(messages, start=1):
        plan.add(seq, role, tokens, present)
        rows.append((seq, role, tokens, present))
    planned = reference_chunks(window, reference_limit(window, env, rows), rows)
    assert _as_tuples(plan_chunks(env, plan, most=most)) == (planned if most is None else planned[:most])
    assert list(vanished_messages(plan)) == [row for row in rows if not row[3]]


class CountedWindow(PlanWindow):
    """A plan window that notes how many messages each page it reads holds."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: list[int] = []

    def newest(self, *args, **kwargs):
        page = super().newest(*args, **kwargs)
        self.read.append(len(page))
        return page

    def oldest(self, *args, **kwargs):
        page = super().oldest(*args, **kwargs)
        self.read.append(len(page))
        return page


def test_a_budget_run_of_a_long_session_reads_its_tail_and_the_start_of_its_plan_only(spools):
    """100,000 messages of 40 tokens and a target of 197.6: the selection is every message but the last 4; the run
    reads the tail's page and the first pages as far as its 5 chunks go, not the rest."""
    env = _context(4000, 0.1, 1000)
    session_id, gone, rows = spools.session([(ROLES[index % 3], 40, True) for index in range(100_000)])
    window = CountedWindow(spools.store, session_id, gone)
    got = plan_budget(env, window, 5)
    expected = reference_selection(env.settings.budget * 0.1, rows)
    assert len(expected) == 99_996 and rows[99_996][1] == "user"  # the 4 that fit begin with a user's
    assert _as_tuples(got) == reference_chunks(4000, reference_limit(4000, env, expected), expected)[:5]
    assert 0 < sum(window.read) < 5_000, f"read {window.read} of 100,000"


def test_the_plan_read_from_the_spool_marks_the_vanished_messages_and_reads_windows(spools):
    """Read with and without vanished digests: the same seqs, roles and tokens; only the vanished are absent,
    and a role's text is kept once however many messages have it. A window reads the newest or the oldest
    messages between two seqs, and the totals count what comes before a seq."""
    session_id, _, _ = spools.session([(ROLES[seq % 3], seq * 2, True) for seq in range(1, 301)])
    store = spools.store

    def digest(seq: int) -> str:
        return store.query("SELECT digest FROM spool WHERE session_id=? AND seq=?", (session_id, seq))[0][0]

    whole = read_plan(store, session_id, set())
    gone = read_plan(store, session_id, {digest(5), digest(300), "unknown"})
    assert list(whole) == [(seq, ROLES[seq % 3], seq * 2, True) for seq in range(1, 301)]
    assert list(gone) == [(seq, ROLES[seq % 3], seq * 2, seq not in (5, 300)) for seq in range(1, 301)]
    assert len({id(role) for role in whole.roles}) == 3
    window = PlanWindow(store, session_id, {digest(299)})
    assert list(window.newest(3)) == [(300, ROLES[0], 600, True), (299, ROLES[2], 598, False),
                                      (298, ROLES[1], 596, True)]
    assert window.newest(2, before=3).seqs.tolist() == [2, 1]
    assert window.oldest(3, after=10, before=12).seqs.tolist() == [11]
    assert window.oldest().seqs.tolist() == list(range(1, 301))
    assert window.totals(4) == (3, 2 + 4 + 6) and window.totals(1) == (0, 0)
    unknown = PlanWindow(store, None, set())
    assert len(unknown.newest(5)) == len(unknown.oldest()) == 0 and unknown.totals(10) == (0, 0)
