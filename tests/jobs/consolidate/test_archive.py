"""Consolidation against the fake OpenAI server through litellm: summaries, faults, rescue, recovery."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from datetime import datetime

import pytest

from nanobotd.config.schema import ConsolidationSettings, LLMSettings, WorkspaceSettings
from nanobotd.faults import FaultPoints
from nanobotd.jobs.consolidate import archive as consolidate
from nanobotd.jobs.env import JobEnv
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from tests.support.fakellm import Empty, FakeLLM, Garbage, Hang, HttpError, Text, ToolCalls
from tests.support.llmworker import llm_client
from tests.support.workspace import conversation, history_entries, make_workspace, write_session

NOW = datetime(2026, 11, 22, 10, 30)


def make_context(tmp_path, llm_settings: LLMSettings, **consolidation):
    workspace, sessions = make_workspace(tmp_path)
    settings = WorkspaceSettings(path=workspace, name="ws", llm=llm_settings,
                                 consolidation=ConsolidationSettings(**consolidation))
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store)
    return JobEnv(settings, store, tracker, llm_client(llm_settings), lambda: NOW), sessions


def online(fake: FakeLLM, **extra) -> LLMSettings:
    return LLMSettings(model=fake.model, api_base=fake.base_url, max_retries=0, timeout_seconds=2,
                       context_window=extra.pop("context_window", 200000), max_tokens=extra.pop("max_tokens", 8192))


def run_job(env, key, reason="manual"):
    run_id = env.store.create_run("consolidate", "ws", session_key=key)
    manifest = asyncio.run(consolidate.consolidate_session(env, key, run_id, reason=reason))
    return env.store.get_run(run_id), manifest


def raw_messages_in(entries) -> str:
    return "\n".join(entry["content"] for entry in entries if entry["content"].startswith("[RAW]"))


def test_summary_is_written_as_fact_lines_with_session_key(tmp_path):
    with FakeLLM() as fake:
        fake.push(Text("Here you go:\n- [permanent] User lives in Lyon\n- [skip] greeting\n- [durable] Uses Debian 12"))
        env, sessions = make_context(tmp_path, online(fake))
        env.tracker.scan(write_session(sessions, "cli:a", conversation(6)))
        run, manifest = run_job(env, "cli:a")
        request = fake.requests[0]
    entries = history_entries(env.settings.path)
    assert run.outcome == "summarized" and run.state == "finished"
    span = entries[0].pop("nanobotd_span")
    assert entries == [{"cursor": 1, "timestamp": "2026-11-22 10:30",
                        "content": "- [permanent] User lives in Lyon\n- [durable] Uses Debian 12",
                        "session_key": "cli:a"}]
    assert span["run"] == run.run_id and span["count"] == 6
    assert "M-0 user says" in request["messages"][1]["content"]
    assert "(nothing)" in request["messages"][0]["content"]
    assert env.tracker.sessions["cli:a"].unarchived_messages == 0
    assert manifest["cursors"] == [1] and manifest["chunks"][0]["count"] == 6


def test_nothing_answer_writes_no_entry_but_archives(tmp_path):
    with FakeLLM() as fake:
        fake.push(Text("(nothing)"))
        env, sessions = make_context(tmp_path, online(fake))
        env.tracker.scan(write_session(sessions, "cli:a", conversation(4)))
        run, _ = run_job(env, "cli:a")
    assert run.outcome == "nothing"
    assert history_entries(env.settings.path) == []
    assert env.tracker.pending("cli:a") == []


@pytest.mark.parametrize("fault", [
    HttpError(500), Hang(30), Garbage(b"{not json"), Empty(), ToolCalls([("archive", {"x": 1})]),
    Text("- [durable] cut off", finish_reason="length"), Text("I refuse to follow the format."),
], ids=["500", "timeout", "garbage", "empty", "tool_call", "length", "unformatted"])
def test_every_llm_fault_ends_in_a_raw_archive_of_the_whole_range(tmp_path, fault):
    with FakeLLM() as fake:
        fake.push(fault, fault)
        env, sessions = make_context(tmp_path, online(fake))
        env.tracker.scan(write_session(sessions, "cli:a", conversation(8)))
        run, _ = run_job(env, "cli:a")
    raw = raw_messages_in(history_entries(env.settings.path))
    assert run.outcome == "raw_fallback"
    for index in range(8):
        assert f"M-{index} " in raw
    assert env.tracker.pending("cli:a") == []


def test_offline_mode_raw_archives_and_splits_long_transcripts_without_truncating(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    messages = conversation(60, words=120)
    env.tracker.scan(write_session(sessions, "cli:a", messages))
    run, _ = run_job(env, "cli:a")
    entries = history_entries(env.settings.path)
    assert run.outcome == "raw_fallback" and len(entries) > 1
    assert all(len(entry["content"]) <= 16000 for entry in entries)
    raw = raw_messages_in(entries)
    for message in messages:
        assert message["content"] in raw
    assert [entry["cursor"] for entry in entries] == list(range(1, len(entries) + 1))


class LoadsSeen(SessionTracker):
    """Notes which thread reads each chunk's records from the spool."""

    loads: list[tuple[int, list[int]]] = []

    def spooled_messages(self, key, seqs):
        self.loads.append((threading.get_ident(), list(seqs)))
        return super().spooled_messages(key, seqs)


def test_chunks_are_read_one_ahead_off_the_event_loop_and_reach_history_in_order(tmp_path):
    workspace, sessions = make_workspace(tmp_path)
    settings = WorkspaceSettings(path=workspace, name="ws", llm=LLMSettings(model="none", context_window=8000))
    store = StateStore(tmp_path / "state").open()
    tracker = LoadsSeen("ws", store)
    tracker.loads = []
    env = JobEnv(settings, store, tracker, llm_client(settings.llm), lambda: NOW)
    messages = conversation(60, words=120)
    tracker.scan(write_session(sessions, "cli:a", messages))
    loop_threads = []

    async def job():
        loop_threads.append(threading.get_ident())
        run_id = store.create_run("consolidate", "ws", session_key="cli:a")
        return await consolidate.consolidate_session(env, "cli:a", run_id, reason="manual")

    manifest = asyncio.run(job())
    assert len(manifest["chunks"]) > 4
    assert [seqs for _, seqs in tracker.loads] == [list(range(chunk["seq"][0], chunk["seq"][1] + 1))
                                                   for chunk in manifest["chunks"]]
    assert loop_threads[0] not in {thread for thread, _ in tracker.loads}
    raw = raw_messages_in(history_entries(workspace))
    positions = [raw.index(message["content"]) for message in messages]
    assert positions == sorted(positions)
    assert tracker.sessions["cli:a"].unarchived_messages == 0


def test_command_messages_are_not_archived_and_dream_sessions_are_skipped(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    messages = conversation(2) + [{"role": "user", "content": "/dream", "timestamp": "2026-11-01T10:00:00",
                                   "_command": True}]
    env.tracker.scan(write_session(sessions, "cli:a", messages))
    run_job(env, "cli:a")
    assert "/dream" not in raw_messages_in(history_entries(env.settings.path))
    env.tracker.scan(write_session(sessions, "dream:20261122", conversation(4)))
    runtime_jobs = env.tracker.sessions["dream:20261122"].skipped
    assert runtime_jobs is True


def test_budget_trigger_archives_down_to_the_target_ending_before_a_user_message(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none", context_window=12000, max_tokens=1000))
    messages = conversation(200, words=20)
    env.tracker.scan(write_session(sessions, "cli:a", messages))
    session = env.tracker.sessions["cli:a"]
    assert session.unarchived_tokens >= env.settings.budget
    run_job(env, "cli:a", reason="budget")
    remaining = env.tracker.pending("cli:a")
    assert 0 < sum(m.tokens for _, m, _ in remaining) <= env.settings.budget * 0.5
    assert remaining[0][1].role == "user"


def test_a_message_over_half_the_window_is_raw_archived_and_never_sent(tmp_path):
    with FakeLLM() as fake:
        fake.push(Text("- [durable] small talk summary"))
        env, sessions = make_context(tmp_path, online(fake, context_window=4000, max_tokens=500))
        messages = conversation(2)
        messages.append({"role": "user", "content": "HUGE " + "lorem " * 5000, "timestamp": "2026-11-01T11:00:00"})
        env.tracker.scan(write_session(sessions, "cli:a", messages))
        run_job(env, "cli:a")
        sent = " ".join(str(request["messages"]) for request in fake.requests)
    assert "HUGE" not in sent
    entries = [entry["content"] for entry in history_entries(env.settings.path)]
    joined = "".join(re.sub(r"^\(part \d+/\d+\) ", "", content.split("\n", 1)[1]) for content in entries[1:])
    assert messages[-1]["content"].rstrip() in joined


def test_new_right_after_thirty_unarchived_messages_loses_none(tmp_path):
    with FakeLLM() as fake:
        fake.push(HttpError(500))
        env, sessions = make_context(tmp_path, online(fake))
        path = write_session(sessions, "cli:a", conversation(30))
        env.tracker.scan(path)
        write_session(sessions, "cli:a", [])
        result = env.tracker.scan(path)
        assert result.vanished == 30
        run, _ = run_job(env, "cli:a", reason="rescue")
    raw = raw_messages_in(history_entries(env.settings.path))
    for index in range(30):
        assert f"M-{index} " in raw
    assert env.tracker.pending("cli:a") == []


def test_messages_below_the_agents_mark_are_never_archived_again(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(10), last_archived=6))
    run_job(env, "cli:a")
    raw = raw_messages_in(history_entries(env.settings.path))
    assert "M-5 " not in raw and "M-6 " in raw and "M-9 " in raw


def test_crash_after_cursor_journal_is_rolled_back_or_finished(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    env.faults = FaultPoints({"consolidate.journalled": "enospc"})  # cursors journalled, history not written
    env.tracker.scan(write_session(sessions, "cli:a", conversation(4)))
    run_id = env.store.create_run("consolidate", "ws", session_key="cli:a")
    with pytest.raises(OSError):
        asyncio.run(consolidate.consolidate_session(env, "cli:a", run_id, reason="manual"))
    env.faults = FaultPoints()
    outcome = consolidate.recover_consolidation(env, env.store.get_run(run_id))
    assert outcome == "rolled_back"
    assert len(env.tracker.pending("cli:a")) == 4
    run, _ = run_job(env, "cli:a")
    assert len(raw_messages_in(history_entries(env.settings.path)).splitlines()) == 5


def test_restore_removes_entries_and_rewinds_so_they_are_archived_again(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(6)))
    run, _ = run_job(env, "cli:a")
    plan = consolidate.restore_consolidation(env, run, dry_run=True)
    assert history_entries(env.settings.path) and "cursors [1]" in plan["plan"][0]
    consolidate.restore_consolidation(env, run, dry_run=False)
    assert history_entries(env.settings.path) == []
    assert len(env.tracker.pending("cli:a")) == 6
    assert env.tracker.sessions["cli:a"].unarchived_messages == 6
    run_job(env, "cli:a")
    entries = history_entries(env.settings.path)
    assert [entry["cursor"] for entry in entries] == [2]


def test_a_raw_fallback_records_why_and_a_run_with_nothing_to_archive_counts_as_no_change(tmp_path):
    with FakeLLM() as fake:
        fake.push(HttpError(500))
        env, sessions = make_context(tmp_path, online(fake))
        env.tracker.scan(write_session(sessions, "cli:a", conversation(4)))
        run, manifest = run_job(env, "cli:a")
        again, _ = run_job(env, "cli:a")
    assert run.outcome == "raw_fallback"
    assert manifest["chunks"][0]["fallback_reason"].startswith("LLM failed: ")
    assert manifest["progress"] == {"step": "archived", "done": 1, "total": 1}
    assert again.outcome == "no_change"
    rows = env.store.query("SELECT outcome, reason FROM outcomes ORDER BY id")
    assert [row[0] for row in rows] == ["raw_fallback", "no_change"]
    assert rows[0][1].startswith("LLM failed: ") and rows[1][1] == "nothing unarchived to archive"


def journal_statements(store) -> list[str]:
    """Every statement that journals a run's manifest or a step of it, as SQLite ran it (values bound)."""
    seen: list[str] = []
    store._require().set_trace_callback(seen.append)
    return seen


def test_a_long_run_journals_each_chunk_at_its_own_size_not_with_every_chunk_before_it(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none", context_window=8000, max_tokens=1000))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(120, words=100)))
    statements = journal_statements(env.store)
    run, manifest = run_job(env, "cli:a")
    env.store._require().set_trace_callback(None)
    chunks = len(manifest["chunks"])
    journalled = [len(sql) for sql in statements
                  if sql.startswith(("UPDATE runs SET manifest=", "INSERT OR REPLACE INTO run_steps"))]
    assert chunks >= 20 and all(chunk["done"] for chunk in run.manifest["chunks"])
    # the whole manifest once it finished is ~chunks x a chunk's record; no journal of the run comes near it
    whole = len(json.dumps(run.manifest))
    assert journalled and max(journalled) < 3 * whole / chunks
    assert sum(journalled) < 6 * whole
    assert env.store.query("SELECT count(*) FROM run_steps")[0][0] == 0


def test_a_run_cut_short_after_its_entries_reached_history_is_recovered_and_restored_whole(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none", context_window=8000, max_tokens=1000))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(30, words=100)))
    run_id = env.store.create_run("consolidate", "ws", session_key="cli:a")
    env.faults = FaultPoints({"consolidate.appended": "enospc"})  # chunks reached history, none marked archived
    with pytest.raises(OSError):
        asyncio.run(consolidate.consolidate_session(env, "cli:a", run_id, reason="manual"))
    env.faults = FaultPoints()
    interrupted = env.store.get_run(run_id)
    written = [entry["cursor"] for entry in history_entries(env.settings.path)]
    assert len(interrupted.manifest["chunks"]) >= 1 and len(written) >= 1
    assert consolidate.recover_consolidation(env, interrupted) == "recovered"
    recovered = env.store.get_run(run_id)
    assert recovered.manifest["cursors"] == written
    finished = sum(chunk["count"] for chunk in recovered.manifest["chunks"] if chunk.get("done"))
    assert finished and env.tracker.sessions["cli:a"].unarchived_messages == 30 - finished
    consolidate.restore_consolidation(env, recovered, dry_run=False)
    assert history_entries(env.settings.path) == []
    assert len(env.tracker.pending("cli:a")) == 30
    run_job(env, "cli:a")
    raw = raw_messages_in(history_entries(env.settings.path))
    assert all(raw.count(f"M-{index} ") == 1 for index in range(30))


def test_re_applying_a_restore_whose_messages_a_later_run_archived_is_refused_and_archives_nothing_twice(tmp_path):
    from nanobotd.jobs.errors import RestoreRefused

    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(6)))
    first, _ = run_job(env, "cli:a")
    restore_id = env.store.create_run("restore", "ws")
    result = consolidate.restore_consolidation(env, first, dry_run=False, restore_run_id=restore_id)
    env.store.finish_run(restore_id, state="finished", outcome="restored", manifest=result)
    run_job(env, "cli:a")  # the same six messages, archived again by a later run
    with pytest.raises(RestoreRefused, match="6 of its 6 messages were archived again since"):
        consolidate.reapply_consolidation(env, first, env.store.get_run(restore_id), dry_run=False,
                                            restore_run_id=None)
    raw = raw_messages_in(history_entries(env.settings.path))
    assert all(raw.count(f"M-{index} ") == 1 for index in range(6))


def test_archived_twice_counts_messages_two_runs_of_nanobotd_archived_not_a_run_finishing_its_own(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(6)))
    run, _ = run_job(env, "cli:a")
    digests = [digest for chunk in run.manifest["chunks"]
               for digest, _, _ in consolidate.read_chunk_backup(chunk["backup"])]
    env.tracker.mark_archived("cli:a", digests, run.run_id)  # recovery finishing a chunk again
    assert env.tracker.totals()["archived_twice"] == 0
    env.tracker.mark_archived("cli:a", digests[:4], "r-20261122-103000-consolidate-0a0a0a")  # a second archive
    assert env.tracker.totals()["archived_twice"] == 4


def test_a_run_that_fails_midway_leaves_only_the_backups_it_journalled(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none", context_window=8000, max_tokens=1000))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(120, words=100)))
    env.faults = FaultPoints({"consolidate.journalled": "enospc"})
    run_id = env.store.create_run("consolidate", "ws", session_key="cli:a")
    with pytest.raises(OSError):
        asyncio.run(consolidate.consolidate_session(env, "cli:a", run_id, reason="manual"))
    journalled = {chunk["backup"] for chunk in env.store.get_run(run_id).manifest["chunks"]}
    left = {str(path) for path in env.store.run_dir(run_id).iterdir()}
    assert journalled and left == journalled


def test_a_chunk_sent_to_the_llm_records_its_exact_count_and_a_raw_one_the_planned_size(tmp_path):
    from nanobotd.memory.transcript import transcript
    from nanobotd.tokens import count_tokens, encoding_name_for

    with FakeLLM() as fake:
        fake.push(Text("- [durable] User lives in Lyon"))
        env, sessions = make_context(tmp_path / "online", online(fake))
        env.tracker.scan(write_session(sessions, "cli:a", conversation(6)))
        sent = transcript([message for _, message, _ in env.tracker.spooled_messages("cli:a", list(range(1, 7)))])
        _, manifest = run_job(env, "cli:a")
    assert manifest["chunks"][0]["tokens"] == count_tokens(sent, encoding_name_for(fake.model))
    offline, sessions = make_context(tmp_path / "offline", LLMSettings(model="none"))
    offline.tracker.scan(write_session(sessions, "cli:a", conversation(6)))
    planned = offline.tracker.sessions["cli:a"].unarchived_tokens
    _, manifest = run_job(offline, "cli:a")
    assert manifest["chunks"][0]["tokens"] == planned


def test_a_run_cut_short_after_every_chunk_was_marked_is_recovered_not_rolled_back(tmp_path):
    env, sessions = make_context(tmp_path, LLMSettings(model="none"))
    env.tracker.scan(write_session(sessions, "cli:a", conversation(6)))
    run_id = env.store.create_run("consolidate", "ws", session_key="cli:a")
    env.faults = FaultPoints({"consolidate.marked": "enospc"})  # every chunk marked archived, the run not closed
    with pytest.raises(OSError):
        asyncio.run(consolidate.consolidate_session(env, "cli:a", run_id, reason="manual"))
    env.faults = FaultPoints()
    assert consolidate.recover_consolidation(env, env.store.get_run(run_id)) == "recovered"
    recovered = env.store.get_run(run_id)
    assert recovered.state == "finished" and history_entries(env.settings.path)
    consolidate.restore_consolidation(env, recovered, dry_run=False)  # its entries can still be undone
    assert history_entries(env.settings.path) == []
    assert len(env.tracker.pending("cli:a")) == 6
