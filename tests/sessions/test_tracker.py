"""The session tracker against real nanobot files and rewrites of every kind."""

from __future__ import annotations

import os
import shutil

from nanobotd.sessions.file import filename_for_key
from nanobotd.sessions.spool import read_message_cache
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from tests.support.workspace import SAMPLES, conversation, make_workspace, write_session


def make_tracker(tmp_path):
    store = StateStore(tmp_path / "state").open()
    return store, SessionTracker("ws", store)


def test_real_nanobot_session_honours_last_archived_and_skips_commands(tmp_path):
    store, tracker = make_tracker(tmp_path)
    path = tmp_path / "Y2xpOmFscGhh.jsonl"
    shutil.copy(SAMPLES / "alpha.after-in-turn-consolidation.jsonl", path)
    result = tracker.scan(path)
    session = tracker.sessions["cli:alpha"]
    assert result.changed and result.corrupt_lines == 0
    assert session.agent_archived == 14
    unarchived = [message for _, message, _ in tracker.pending("cli:alpha")]
    assert all(not message.record.get("_hidden_history") for message in unarchived)
    assert len(unarchived) == session.unarchived_messages
    assert session.unarchived_tokens == sum(message.tokens for message in unarchived)


def test_final_sample_excludes_command_messages_from_tokens(tmp_path):
    store, tracker = make_tracker(tmp_path)
    path = tmp_path / "Y2xpOmFscGhh.jsonl"
    shutil.copy(SAMPLES / "alpha.final.jsonl", path)
    tracker.scan(path)
    texts = [message.text for _, message, _ in tracker.pending("cli:alpha")]
    assert "/dream" not in texts and "Dreaming..." not in texts
    assert any("MSG-12" in text for text in texts)


def test_appending_a_message_reuses_the_cached_prefix(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(40)
    path = write_session(sessions, "cli:a", messages)
    tracker.scan(path)
    before = tracker.sessions["cli:a"].unarchived_tokens
    messages += conversation(1, tag="n")
    write_session(sessions, "cli:a", messages)
    result = tracker.scan(path)
    assert result.new_messages == 1
    assert tracker.sessions["cli:a"].unarchived_messages == 41
    assert tracker.sessions["cli:a"].unarchived_tokens > before


def test_new_command_leaves_every_unarchived_message_in_the_spool_as_vanished(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, "cli:a", conversation(30))
    tracker.scan(path)
    shutil.copy(SAMPLES / "alpha.after-new.jsonl", path)
    write_session(sessions, "cli:a", [])
    result = tracker.scan(path)
    assert result.vanished == 30
    vanished = tracker.pending("cli:a", vanished_only=True)
    assert len(vanished) == 30
    assert tracker.sessions["cli:a"].unarchived_tokens == 0


def test_messages_the_agent_archives_leave_the_spool(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(10)
    path = write_session(sessions, "cli:a", messages)
    tracker.scan(path)
    write_session(sessions, "cli:a", messages, last_archived=6)
    result = tracker.scan(path)
    assert result.vanished == 0
    assert len(tracker.pending("cli:a")) == 4


def test_corrupt_lines_and_binary_garbage_are_counted_and_a_huge_message_is_kept(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, "cli:a", conversation(4), extra_lines=["{not json", "[1, 2]"])
    with open(path, "ab") as handle:
        handle.write(b"\x00\xff\xfe binary \x00\n")
        handle.write(b'{"role": "user", "content": "' + b"x" * (9 * 1024 * 1024) + b'"}\n')
        handle.write(b'{"role": "user", "content": "after the huge line", "timestamp": "2026-11-01T10:00:00"}')
    tracker.scan(path)  # a long file seen the first time: held, its lines read when they are needed
    texts = [message.text for _, message, _ in tracker.pending("cli:a")]
    assert tracker.sessions["cli:a"].corrupt_lines == 3
    assert texts[-1] == "after the huge line" and len(texts) == 6
    assert texts[-2] == "x" * (9 * 1024 * 1024)
    assert tracker.totals()["large_messages"] == 1


def test_state_survives_a_restart_without_reparsing_unchanged_files(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, "cli:a", conversation(12))
    tracker.scan(path)
    tokens = tracker.sessions["cli:a"].unarchived_tokens
    store.close()
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store)
    assert tracker.scan(path).changed is False
    assert tracker.sessions["cli:a"].unarchived_tokens == tokens


def test_legacy_file_name_takes_its_key_from_the_metadata(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, "telegram:123456", conversation(2))
    legacy = sessions / "telegram_123456.jsonl"
    path.rename(legacy)
    assert tracker.scan(legacy).key == "telegram:123456"
    assert filename_for_key("telegram:123456") == "dGVsZWdyYW06MTIzNDU2.jsonl"


def test_deleted_file_hands_its_spool_to_the_rescue(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, "cli:a", conversation(6))
    tracker.scan(path)
    path.unlink()
    result = tracker.scan(path)
    assert result.vanished == 6
    assert tracker.sessions["cli:a"].state == "deleted"


def test_archive_marks_are_rebuilt_from_history_spans_after_the_db_is_lost(tmp_path):
    import asyncio
    from datetime import datetime

    from nanobotd.config.schema import LLMSettings, WorkspaceSettings
    from nanobotd.jobs.consolidate import archive as consolidate
    from nanobotd.jobs.env import JobEnv
    from nanobotd.llm.client import LLMClient
    from tests.support.histories import read_history

    workspace, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    ctx = JobEnv(WorkspaceSettings(path=workspace, name="ws"), store, tracker, LLMClient(LLMSettings()),
                     lambda: datetime(2026, 11, 22))
    runs = []
    for count in (6, 8):  # two runs: the marks rebuilt carry each one's run id
        path = write_session(sessions, "cli:a", conversation(count))
        tracker.scan(path)
        runs.append(store.create_run("consolidate", "ws", session_key="cli:a"))
        asyncio.run(consolidate.consolidate_session(ctx, "cli:a", runs[-1], reason="manual"))
    write_session(sessions, "cli:a", conversation(10))
    store.close()
    (tmp_path / "state" / "state.db").unlink()
    store = StateStore(tmp_path / "state").open()
    assert store.rebuilt
    tracker = SessionTracker("ws", store)
    tracker.scan(path)
    spans = [entry.span for entry in read_history(workspace / "memory").entries]
    assert tracker.apply_history_spans("cli:a", spans) == 8
    assert [message.text.split()[0] for _, message, _ in tracker.pending("cli:a")] == ["M-8", "M-9"]
    assert store.query("SELECT run_id, count(*) FROM archived GROUP BY run_id ORDER BY count(*) DESC") == [
        (runs[0], 6), (runs[1], 2)]


def test_a_100_mb_line_and_a_binary_file_cost_bounded_memory(tmp_path):
    import subprocess
    import sys

    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:huge", conversation(2))
    with open(path, "ab") as handle:
        handle.write(b'{"role": "user", "content": "')
        block = b"y" * (1024 * 1024)
        for _ in range(100):
            handle.write(block)
        handle.write(b'"}\n')
    binary = sessions / "YmluOmJpbg.jsonl"
    binary.write_bytes(bytes(range(256)) * 40000)
    script = f"""
import resource
from pathlib import Path
from nanobotd.state.store import StateStore
from nanobotd.sessions.tracker import SessionTracker
tracker = SessionTracker("ws", StateStore(Path({str(tmp_path / 'st')!r})).open())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracker.scan(Path({str(path)!r}))
tracker.pending("cli:huge")  # the held copy read
b = tracker.scan(Path({str(binary)!r}))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(tracker.sessions["cli:huge"].corrupt_lines, b.corrupt_lines, (after - before) // 1024)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    corrupt_huge, corrupt_binary, grown_mb = map(int, out.stdout.split())
    assert corrupt_huge == 1 and corrupt_binary >= 1
    assert grown_mb < 40, f"scanning grew the process by {grown_mb} MB"


def test_seq_ranges_group_consecutive_numbers():
    from nanobotd.sessions.spool import seq_ranges

    assert list(seq_ranges([7, 1, 2, 3, 8, 10])) == [(1, 3), (7, 8), (10, 10)]
    assert list(seq_ranges([])) == []


def test_caches_read_back_from_the_database_give_the_same_counts_as_caches_kept(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store, cached_messages=10)
    conversations = {f"cli:{name}": conversation(8, tag=name) for name in "abc"}
    paths = {key: write_session(sessions, key, messages) for key, messages in conversations.items()}
    for path in paths.values():
        tracker.scan(path)
    first = tracker.sessions["cli:a"]
    assert first.messages is None  # scanned first, then trimmed when the others were scanned
    write_session(sessions, "cli:a", conversations["cli:a"] + conversation(1, tag="n"))
    result = tracker.scan(paths["cli:a"])
    assert result.new_messages == 1 and first.unarchived_messages == 9
    write_session(sessions, "cli:b", conversations["cli:b"][4:])  # four messages cut from the file
    assert tracker.scan(paths["cli:b"]).vanished == 4
    tracker.scan(paths["cli:c"])
    second = tracker.sessions["cli:b"]
    assert second.unarchived_messages == 4
    assert len(tracker.pending("cli:b", vanished_only=True)) == 4
    tracker.mark_archived("cli:b", [message.digest for _, message, _ in tracker.pending("cli:b")], "r-1")
    assert (second.unarchived_messages, second.unarchived_tokens) == (0, 0)


def test_the_message_caches_kept_are_those_used_last_within_the_limit(tmp_path):
    """After every scan the caches in memory are the sessions used last that fit in CACHED_MESSAGES (the one
    just scanned always), and the running total the trim goes by is the sum of what is cached; letting idle
    caches go keeps it so."""
    _, sessions = make_workspace(tmp_path)
    store = StateStore(tmp_path / "state").open()
    now = [1_000.0]
    tracker = SessionTracker("ws", store, cached_messages=20, clock=lambda: now[0])
    sizes = [6, 9, 4, 25, 3, 7, 7, 1, 12, 5]
    paths = [write_session(sessions, f"cli:t{number}", conversation(size, tag=f"t{number}"))
             for number, size in enumerate(sizes)]
    used: list[str] = []  # keys, last used last
    for path in [*paths, paths[2], paths[0]]:  # two used again, from the database
        key = tracker.scan(path, force=True).key
        used = [other for other in used if other != key] + [key]
        cached = [other for other in used if tracker.sessions[other].messages is not None]
        expected, total = [], 0
        for other in reversed(used):  # the one just scanned, then the ones used last until one does not fit
            size = tracker.sessions[other].message_count
            if other != key and total + size > 20:
                break
            expected.append(other)
            total += size
        assert sorted(cached) == sorted(expected)
        assert tracker.caches.total == sum(len(tracker.sessions[other].messages) for other in cached)
        assert tracker.caches.total <= 20 or cached == [key]
    now[0] = 10 ** 10
    tracker.release_idle_caches(1.0)
    assert tracker.caches.total == 0 and all(session.messages is None for session in tracker.sessions.values())
    store.close()


def test_the_running_totals_match_a_recount_through_archive_restore_and_the_agents_mark(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(20)
    path = write_session(sessions, "cli:a", messages)
    tracker.scan(path)
    session = tracker.sessions["cli:a"]

    def recounted():
        live = [message.tokens for _, message, present in tracker.pending("cli:a") if present]
        return len(live), sum(live)

    chunk = tracker.spooled_messages("cli:a", [seq for seq, _, _, _ in tracker.spool_plan("cli:a")[:6]])
    records = [(message.digest, message.record, message.tokens) for _, message, _ in chunk]
    tracker.mark_archived("cli:a", [digest for digest, _, _ in records], "r-1", seqs=[seq for seq, _, _ in chunk])
    assert (session.unarchived_messages, session.unarchived_tokens) == recounted() and recounted()[0] == 14
    tracker.unarchive("cli:a", "r-1", records)
    assert (session.unarchived_messages, session.unarchived_tokens) == recounted() and recounted()[0] == 20
    write_session(sessions, "cli:a", messages + conversation(2, tag="n"), last_archived=5)
    tracker.scan(path)
    assert (session.unarchived_messages, session.unarchived_tokens) == recounted() and recounted()[0] == 17


def test_the_spool_keeps_each_record_as_the_file_has_it(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, "cli:a", conversation(3, words=3000))  # most of the file, new: held in a copy
    tracker.scan(path)
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    spooled = [text for _, _, text in tracker.spooled_messages("cli:a", [1, 2, 3])]
    assert spooled == lines
    # the lines stay in the held version of the file: the spool's rows keep where they are, not a copy
    assert [row[0] for row in store.query("SELECT record FROM spool ORDER BY seq")] == ["", "", ""]


def test_archived_messages_stay_archived_when_a_rewrite_makes_the_file_read_whole_again(tmp_path):
    """The archive marks are looked up in the database, not held in memory: a rewrite (full parse) after a
    restart and after the message caches were dropped still spools only what was never archived."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(12)
    path = write_session(sessions, "cli:a", messages)
    tracker.scan(path)
    chunk = tracker.spooled_messages("cli:a", [seq for seq, _, _, _ in tracker.spool_plan("cli:a")[:8]])
    archived = [message.digest for _, message, _ in chunk]
    tracker.mark_archived("cli:a", archived, "r-1", seqs=[seq for seq, _, _ in chunk])
    assert store.query("SELECT count(*) FROM archived")[0][0] == 8

    store.close()
    store = StateStore(tmp_path / "state").open()
    restarted = SessionTracker("ws", store)
    # every line written again with its keys in another order (the same messages, other bytes: none of
    # their parses can be reused), and a message inserted mid-file
    reordered = [dict(reversed(list(message.items()))) for message in messages]
    inserted = conversation(1, tag="mid")
    write_session(sessions, "cli:a", reordered[:10] + inserted + reordered[10:])
    result = restarted.scan(path)
    assert result.changed and result.new_messages == 13
    session = restarted.sessions["cli:a"]
    spooled = {row[0] for row in store.query("SELECT digest FROM spool")}
    assert not spooled & set(archived)
    assert (session.unarchived_messages, len(spooled)) == (5, 5)  # 4 never archived, and the one inserted
    assert not hasattr(session, "archived")


def test_a_vanished_message_stays_vanished_through_archive_restore_and_a_restart(tmp_path):
    """Only the spooled messages that left the file are kept as such (not every digest in the file): an
    archive undone puts a vanished message back as vanished, and a restart finds them again in the database."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, "cli:a", conversation(10))
    tracker.scan(path)
    kept = conversation(4, tag="after")
    write_session(sessions, "cli:a", kept)  # the old ten left the file (/new), four new ones came
    assert tracker.scan(path).vanished == 10
    session = tracker.sessions["cli:a"]
    assert (session.unarchived_messages, len(session.gone)) == (4, 10)

    rescued = tracker.pending("cli:a", vanished_only=True)[:3]
    records = [(message.digest, message.record, message.tokens) for _, message, _ in rescued]
    tracker.mark_archived("cli:a", [digest for digest, _, _ in records], "r-1", seqs=[seq for seq, _, _ in rescued])
    assert len(tracker.pending("cli:a", vanished_only=True)) == 7 and session.unarchived_messages == 4
    tracker.unarchive("cli:a", "r-1", records)
    assert len(tracker.pending("cli:a", vanished_only=True)) == 10 and session.unarchived_messages == 4
    plan = tracker.spool_plan("cli:a")
    assert sorted(present for _, _, _, present in plan) == [False] * 10 + [True] * 4

    store.close()
    store = StateStore(tmp_path / "state").open()
    restarted = SessionTracker("ws", store)
    assert restarted.scan(path).changed is False
    again = restarted.sessions["cli:a"]
    assert again.gone is None and again.messages is None  # nothing read until asked
    assert len(restarted.pending("cli:a", vanished_only=True)) == 10
    assert [present for _, _, _, present in restarted.spool_plan("cli:a")] == [present for _, _, _, present in plan]
    assert again.messages is None  # the vanished ones were found without reading the message cache
    write_session(sessions, "cli:a", kept + conversation(1, tag="later"))
    restarted.scan(path)
    assert (again.unarchived_messages, len(again.gone)) == (5, 10)


def test_the_vanished_digests_come_in_the_order_of_the_vanished_messages_without_reading_them(tmp_path):
    """What the companion decides with: the digests alone, in the order pending(vanished_only=True) reads the
    messages (a /new of a long session vanishes every message; their records are not decoded for that)."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(12)
    path = write_session(sessions, "cli:a", messages[:6])
    tracker.scan(path)
    write_session(sessions, "cli:a", messages)
    tracker.scan(path)
    write_session(sessions, "cli:a", messages[3:5] + messages[8:])  # six left the file, seen in two saves
    tracker.scan(path)
    expected = [message.digest for _, message, _ in tracker.pending("cli:a", vanished_only=True)]
    assert len(expected) == 6 and tracker.vanished("cli:a") == expected
    tracker.mark_archived("cli:a", expected[:2], "r-1")
    assert tracker.vanished("cli:a") == expected[2:]
    assert tracker.vanished("cli:b") == []
    store.close()


def _sessions_for_many(sessions) -> list:
    """Files of every kind a reconcile meets: long and short, agent-archived, corrupt, empty, not a session."""
    paths = [write_session(sessions, f"cli:s{number}", conversation(number * 37 % 300 + 1, tag=f"s{number}"))
             for number in range(9)]
    paths.append(write_session(sessions, "cli:marked", conversation(150, tag="k"), last_archived=60))
    paths.append(write_session(sessions, "cli:corrupt", conversation(20, tag="c"), extra_lines=["{not json", "[1]"]))
    empty = sessions / filename_for_key("cli:empty")
    empty.write_bytes(b"")
    paths.append(empty)
    folder = sessions / filename_for_key("cli:folder")  # unreadable as a file: scan() gives None
    folder.mkdir()
    paths.append(folder)
    return sorted(paths)


def _change_for_many(sessions) -> None:
    """Appends, a rewrite that drops messages (/new), a deletion."""
    write_session(sessions, "cli:s1", conversation(38, tag="s1") + conversation(200, tag="more"))
    write_session(sessions, "cli:s2", conversation(5, tag="fresh"))
    (sessions / filename_for_key("cli:s3")).unlink()
    write_session(sessions, "cli:marked", conversation(180, tag="k"), last_archived=170)


def _accounting(store, tracker) -> dict:
    """Everything a scan leaves behind, per session: counters, spool and message cache."""
    found = {}
    for key, session in tracker.sessions.items():
        spool = store.query("SELECT digest, tokens, role FROM spool WHERE session_id=? ORDER BY digest",
                            (session.session_id,))
        cache = list(read_message_cache(store, session.session_id))
        found[key] = (session.state, session.unarchived_messages, session.unarchived_tokens, session.total_tokens,
                      session.message_count, session.agent_archived, session.corrupt_lines, sorted(spool), cache)
    return found


def test_scan_many_leaves_what_one_scan_at_a_time_leaves(tmp_path):
    """scan_many (the caches let go after every file, so a file is applied to a session whose cache was dropped)
    leaves each session exactly as scanning the files one by one leaves it, cold and after changes."""
    one_by_one, many = tmp_path / "one", tmp_path / "many"
    _, sessions_one = make_workspace(one_by_one)
    _, sessions_many = make_workspace(many)
    store_one, store_many = StateStore(one_by_one / "state").open(), StateStore(many / "state").open()
    tracker_one = SessionTracker("ws", store_one)
    tracker_many = SessionTracker("ws", store_many, cached_messages=10)
    try:
        for change in (_sessions_for_many, _change_for_many):
            change(sessions_one)
            change(sessions_many)
            # and two paths with no file: one never seen, one deleted (cli:s3, once changed)
            missing = ["never.jsonl", filename_for_key("cli:s3")]
            paths_one = sorted(path for path in sessions_one.iterdir()) + [sessions_one / name for name in missing]
            paths_many = sorted(path for path in sessions_many.iterdir()) + [sessions_many / name for name in missing]
            alone = [tracker_one.scan(path) for path in paths_one]
            together = list(tracker_many.scan_many(paths_many))
            assert [path.name for path, _ in together] == [path.name for path in paths_many]
            assert [_without_time(result) for _, result in together] == [_without_time(result) for result in alone]
            assert _accounting(store_many, tracker_many) == _accounting(store_one, tracker_one)
        assert tracker_many.sessions["cli:s3"].state == "deleted"
        assert tracker_many.sessions["cli:s1"].message_count == 238
    finally:
        store_one.close()
        store_many.close()


def _without_time(result):
    return None if result is None else (result.key, result.changed, result.new_messages, result.vanished,
                                        result.corrupt_lines, result.mark_moved, result.tail_before)


def test_scan_many_reports_each_file_that_fails_and_goes_on_with_the_next(tmp_path):
    """A scan that fails (the fault point before its writes, armed as a full disk) is reported with its path, in its
    turn, and the next files are still read; nothing of theirs is applied, and a healthy reconcile reads them all."""
    from nanobotd.faults import FaultPoints

    _, sessions = make_workspace(tmp_path)
    paths = [write_session(sessions, f"cli:f{number}", conversation(140, tag=f"f{number}")) for number in range(4)]
    store = StateStore(tmp_path / "state").open()
    failing = SessionTracker("ws", store, faults=FaultPoints({"scan.apply": "enospc"}))
    results = list(failing.scan_many(sorted(paths)))
    assert [path for path, _ in results] == sorted(paths)
    assert all(isinstance(result, OSError) and "scan.apply" in str(result) for _, result in results)
    assert failing.sessions == {}
    tracker = SessionTracker("ws", store)
    assert all(result.changed for _, result in tracker.scan_many(sorted(paths)))
    assert all(tracker.sessions[f"cli:f{number}"].message_count == 140 for number in range(4))
    store.close()


def test_idle_sessions_let_their_caches_go_and_read_them_back_with_the_same_accounting(tmp_path):
    """release_idle_caches drops the caches of sessions unused for the idle time, and only theirs; a later
    save, a cut and an archive of such a session leave exactly what a tracker that kept its caches leaves."""
    now = [1_000.0]
    _, sessions = make_workspace(tmp_path / "one")
    kept_store = StateStore(tmp_path / "kept-state").open()
    kept = SessionTracker("ws", kept_store)
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store, clock=lambda: now[0])
    conversations = {f"cli:{name}": conversation(12, tag=name) for name in "ab"}
    paths = {key: write_session(sessions, key, messages) for key, messages in conversations.items()}
    for path in paths.values():
        tracker.scan(path)
        kept.scan(path)
    now[0] += 200
    tracker.scan(paths["cli:b"])  # unchanged, but b is used again
    write_session(sessions, "cli:b", conversations["cli:b"] + conversation(1, tag="b2"))
    tracker.scan(paths["cli:b"])
    kept.scan(paths["cli:b"])
    now[0] += 150  # a: 350 s unused; b: 150 s
    assert tracker.release_idle_caches(300) == 12 + 12  # a's 12 messages and its 12 spooled rows
    a, b = tracker.sessions["cli:a"], tracker.sessions["cli:b"]
    assert (a.messages, a.spool, a.gone) == (None, None, None)
    assert b.messages is not None and len(b.messages) == 13
    assert tracker.release_idle_caches(300) == 0  # nothing more is idle
    write_session(sessions, "cli:a", conversations["cli:a"][5:] + conversation(2, tag="a2"))  # a cut and a save
    assert _without_time(tracker.scan(paths["cli:a"])) == _without_time(kept.scan(paths["cli:a"]))
    for each in (tracker, kept):
        each.mark_archived("cli:a", [message.digest for _, message, _ in each.pending("cli:a")][:4], "r-1")
    assert _accounting(store, tracker) == _accounting(kept_store, kept)
    store.close()
    kept_store.close()


def test_new_files_are_applied_together_and_a_group_whose_copies_cannot_sync_is_read_again(tmp_path):
    """Files never seen, in a row, are applied in one transaction with their held copies synced together. A group
    whose copies cannot be synced (the fault point armed as a full disk) is rolled back whole: its files are
    reported with the error, their sessions and copies are gone, and the next reconcile reads them as never seen."""
    from nanobotd.faults import FaultPoints

    _, sessions = make_workspace(tmp_path / "ws")
    paths = [write_session(sessions, f"cli:g{number}", conversation(20 + number, words=600, tag=f"g{number}"))
             for number in range(8)]
    store = StateStore(tmp_path / "state").open()
    failing = SessionTracker("ws", store, faults=FaultPoints({"holds.sync": "enospc"}))
    results = list(failing.scan_many(paths))
    assert [path for path, _ in results] == paths
    assert all(isinstance(result, OSError) for _, result in results)
    assert failing.sessions == {} and store.query("SELECT count(*) FROM sessions")[0][0] == 0
    assert os.listdir(store.state_dir / "held") == []
    tracker = SessionTracker("ws", store)
    assert all(result.changed for _, result in tracker.scan_many(paths))
    held = sorted(os.listdir(store.state_dir / "held"))
    assert held == sorted(f"{session.session_id}.1" for session in tracker.sessions.values())
    one_store, one = make_tracker(tmp_path / "one")
    for path in paths:
        one.scan(path)
    assert sorted(_accounting(store, tracker).values()) == sorted(_accounting(one_store, one).values())
    store.close()
    one_store.close()


def test_a_state_database_with_the_older_message_cache_reads_each_known_file_whole_again(tmp_path):
    """Schema 7 keeps the message cache a block a row; the per-message cache it drops is rebuilt by reading each
    known file whole once more (its file identity forgotten), so nothing spooled counts as vanished."""
    import sqlite3

    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:a", conversation(600))
    store, tracker = make_tracker(tmp_path)
    tracker.scan(path)
    tracker.pending("cli:a")  # read, not held unread
    before = _accounting(store, tracker)
    store.close()
    db = sqlite3.connect(tmp_path / "state" / "state.db", isolation_level=None)
    db.executescript("BEGIN; ALTER TABLE sessions DROP COLUMN unread; DROP TABLE message_blocks;"
                     " CREATE TABLE messages (session_id INTEGER NOT NULL,"
                     " seq INTEGER NOT NULL, line_digest TEXT NOT NULL, digest TEXT NOT NULL, role TEXT NOT NULL,"
                     " timestamp TEXT NOT NULL, tokens INTEGER NOT NULL, flags INTEGER NOT NULL,"
                     " PRIMARY KEY (session_id, seq)); PRAGMA user_version=6; COMMIT;")
    db.close()
    store, tracker = make_tracker(tmp_path)
    assert tracker.sessions["cli:a"].fingerprint is None
    assert tracker.scan(path).changed and tracker.vanished_count("cli:a") == 0
    assert _accounting(store, tracker) == before
    assert len(read_message_cache(store, tracker.sessions["cli:a"].session_id)) == 600
