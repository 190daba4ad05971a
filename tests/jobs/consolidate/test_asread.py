"""A session held unread, archived raw as its held copy is read: each message once in history, no spool row for what
the pass archives, a budget run's tail spooled by the read, and a run cut short anywhere recovered and restorable."""

from __future__ import annotations

import asyncio

import pytest

from nanobotd.config.schema import LLMSettings
from nanobotd.faults import FaultAbort, FaultPoints
from nanobotd.jobs.consolidate import archive as consolidate
from nanobotd.sessions.hold import HELD_DIR
from tests.jobs.consolidate.test_archive import make_context, raw_messages_in, run_job
from tests.support.workspace import conversation, history_entries, write_session

COUNT = 400  # ~150 KB: held unread at its first scan
OFFLINE = LLMSettings(model="none", context_window=8000, max_tokens=1000)


def unread_session(tmp_path, count: int = COUNT):
    env, sessions = make_context(tmp_path, OFFLINE)
    env.tracker.scan(write_session(sessions, "cli:a", conversation(count, words=40)))
    assert env.tracker.sessions["cli:a"].unread
    return env


def spool_inserts(env) -> list[str]:
    """Every statement that writes a spool row, as SQLite runs it."""
    seen: list[str] = []
    env.store._require().set_trace_callback(lambda sql: seen.append(sql) if "INTO spool" in sql else None)
    return seen


def assert_each_once(env, count: int = COUNT) -> None:
    raw = raw_messages_in(history_entries(env.settings.path))
    assert [index for index in range(count) if raw.count(f"M-{index} ") != 1] == []


def test_an_unread_session_is_archived_as_it_is_read_without_a_spool_row_and_restored_whole(tmp_path):
    env = unread_session(tmp_path)
    inserts = spool_inserts(env)
    run, manifest = run_job(env, "cli:a")
    env.store._require().set_trace_callback(None)
    session = env.tracker.sessions["cli:a"]
    assert run.outcome == "raw_fallback" and not session.unread and session.unarchived_messages == 0
    assert inserts == [], "a message the pass archived went through the spool"
    assert sum(chunk["count"] for chunk in manifest["chunks"]) == COUNT
    assert_each_once(env)
    assert not list((env.store.state_dir / HELD_DIR).iterdir()), "the held copy outlived its last message"
    consolidate.restore_consolidation(env, run, dry_run=False)  # the backups the pass wrote bring every message back
    assert history_entries(env.settings.path) == [] and len(env.tracker.pending("cli:a")) == COUNT
    run_job(env, "cli:a")
    assert_each_once(env)


def test_a_budget_run_archives_as_it_reads_and_spools_only_the_tail_it_leaves(tmp_path):
    env = unread_session(tmp_path)
    run_job(env, "cli:a", reason="budget")
    pending = env.tracker.pending("cli:a")
    session = env.tracker.sessions["cli:a"]
    assert not session.unread and 0 < len(pending) == session.unarchived_messages < COUNT
    assert sum(message.tokens for _, message, _ in pending) <= env.settings.budget * env.settings.consolidation.ratio
    assert pending[0][1].role == "user", "the tail starts with a user message"
    first = int(pending[0][1].text.split()[0].removeprefix("M-"))
    raw = raw_messages_in(history_entries(env.settings.path))
    assert all(raw.count(f"M-{index} ") == 1 for index in range(first))
    assert f"M-{first} " not in raw
    run_job(env, "cli:a")
    assert_each_once(env)


@pytest.mark.parametrize("point", ["consolidate.journalled", "consolidate.appended", "consolidate.marked"])
def test_a_pass_cut_short_leaves_the_session_unread_and_each_message_is_archived_once(tmp_path, point):
    env = unread_session(tmp_path)
    run_id = env.store.create_run("consolidate", "ws", session_key="cli:a")
    env.faults = FaultPoints({point: "abort"})  # a kill inside the pass: no handler runs
    with pytest.raises(FaultAbort):
        asyncio.run(consolidate.consolidate_session(env, "cli:a", run_id, reason="manual"))
    env.faults = FaultPoints()
    assert env.tracker.sessions["cli:a"].unread
    assert env.store.query("SELECT count(*) FROM spool")[0][0] == 0
    consolidate.recover_consolidation(env, env.store.get_run(run_id))
    # the recovery reads the copy: what the pass did not archive is spooled, every message unarchived counted
    session = env.tracker.sessions["cli:a"]
    assert not session.unread and session.unarchived_messages == len(env.tracker.pending("cli:a"))
    run_job(env, "cli:a")
    assert_each_once(env)
    assert env.store.query("SELECT count(*) FROM spool")[0][0] == 0


def test_a_pass_cut_short_as_its_tail_is_spooled_keeps_what_it_archived_and_archives_the_rest_once(tmp_path):
    env = unread_session(tmp_path)
    run_id = env.store.create_run("consolidate", "ws", session_key="cli:a")
    env.tracker.faults = FaultPoints({"scan.read_held": "abort"})  # the tail's rows written, not committed
    with pytest.raises(FaultAbort):
        asyncio.run(consolidate.consolidate_session(env, "cli:a", run_id, reason="budget"))
    env.tracker.faults = FaultPoints()
    archived = len(history_entries(env.settings.path))
    assert archived and env.tracker.sessions["cli:a"].unread
    assert consolidate.recover_consolidation(env, env.store.get_run(run_id)) == "recovered"
    run_job(env, "cli:a")
    assert_each_once(env)
