"""Parse processes: a cold reconcile's new files parsed ahead in child processes leave exactly what the daemon's
own parse leaves, a file saved again meanwhile is read again, and a process that dies, hangs or answers garbage
costs only time."""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

import pytest

from nanobotd.sessions import parsepool, parseworker
from nanobotd.sessions.file import filename_for_key
from nanobotd.sessions.parsepool import ParsesAhead, processes_for
from nanobotd.sessions.scan import parse_session
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from tests.sessions.test_tracker import _accounting, _change_for_many, _sessions_for_many, _without_time
from tests.support.observe import pid_exists
from tests.support.workspace import conversation, make_workspace, write_session

ENCODING = "o200k_base"


def _trackers(tmp_path: Path, processes: int):
    """A tracker parsing in the daemon alone and one with parse processes, each on its own copy of the files."""
    made = []
    for name, count in (("alone", 0), ("ahead", processes)):
        _, sessions = make_workspace(tmp_path / name)
        store = StateStore(tmp_path / name / "state").open()
        made.append((sessions, store, SessionTracker("ws", store, parse_processes=count)))
    return made


class _Spy:
    """Records what the parse processes answered, per file name (None: the daemon parsed it)."""

    def __init__(self, monkeypatch) -> None:
        self.answers: dict[str, object] = {}  # of the files the processes were asked to parse
        self.asked: set[Path] = set()
        self.pids: list[int] = []
        take, start = ParsesAhead.take, ParsesAhead.__init__
        spy = self

        def taken(pool, path):
            answer = take(pool, path)
            if Path(path) in spy.asked:
                spy.answers[Path(path).name] = answer
            return answer

        def started(pool, paths, *args, **kwargs):
            spy.asked.update(Path(path) for path in paths)
            start(pool, paths, *args, **kwargs)
            spy.pids.extend(pool.pids)

        monkeypatch.setattr(ParsesAhead, "take", taken)
        monkeypatch.setattr(ParsesAhead, "__init__", started)

    def parsed_ahead(self) -> set[str]:
        return {name for name, answer in self.answers.items() if answer is not None}


def _scan_both(alone, ahead, names=()) -> None:
    (sessions_alone, _, tracker_alone), (sessions_ahead, _, tracker_ahead) = alone, ahead
    paths_alone = sorted(sessions_alone.iterdir()) + [sessions_alone / name for name in names]
    paths_ahead = sorted(sessions_ahead.iterdir()) + [sessions_ahead / name for name in names]
    one_by_one = [tracker_alone.scan(path) for path in paths_alone]
    together = list(tracker_ahead.scan_many(paths_ahead))
    assert [path.name for path, _ in together] == [path.name for path in paths_ahead]
    assert [_without_time(result) for _, result in together] == [_without_time(result) for result in one_by_one]


def test_new_files_parsed_in_the_processes_leave_what_the_daemons_own_parse_leaves(tmp_path, monkeypatch):
    """Long and short files, agent-archived, corrupt, empty, a folder and a missing path: the same counters,
    spool and message cache as one scan at a time; then changes, read by the daemon (the files are known)."""
    monkeypatch.setattr(parsepool, "MIN_NEW_FILES", 1)
    spy = _Spy(monkeypatch)
    alone, ahead = _trackers(tmp_path, processes=2)
    try:
        for sessions, _, _ in (alone, ahead):
            _sessions_for_many(sessions)
        _scan_both(alone, ahead, names=["never.jsonl"])
        assert _accounting(ahead[1], ahead[2]) == _accounting(alone[1], alone[2])
        files = {path.name for path in ahead[0].iterdir() if path.is_file()}
        assert spy.parsed_ahead() == files, "every readable file was parsed in a process"
        assert spy.answers[filename_for_key("cli:folder")] is None and spy.answers["never.jsonl"] is None
        assert len(spy.pids) == 2 and all(not pid_exists(pid) for pid in spy.pids), "let go once the scan is done"
        spy.answers.clear()
        spy.asked.clear()
        for sessions, _, _ in (alone, ahead):
            _change_for_many(sessions)
        _scan_both(alone, ahead)
        assert _accounting(ahead[1], ahead[2]) == _accounting(alone[1], alone[2])
        folder = filename_for_key("cli:folder")  # never a session: still new
        assert spy.answers == {folder: None}, "known files are read by the daemon, against their caches"
        assert ahead[2].sessions["cli:s1"].message_count == 238
    finally:
        alone[1].close()
        ahead[1].close()


def test_a_file_saved_again_after_its_parse_is_read_again_by_the_daemon(tmp_path, monkeypatch):
    """The parse is of the version before the save (another inode): the daemon reads the new one."""
    monkeypatch.setattr(parsepool, "MIN_NEW_FILES", 1)
    _, sessions = make_workspace(tmp_path)
    paths = [write_session(sessions, f"cli:r{number}", conversation(30, tag=f"r{number}")) for number in range(3)]
    take = ParsesAhead.take

    def take_then_save(pool, path):
        answer = take(pool, path)
        if Path(path) == paths[1]:
            assert answer is not None and len(answer[1].messages) == 30
            write_session(sessions, "cli:r1", conversation(45, tag="saved"))  # temp file + rename, as nanobot
        return answer

    monkeypatch.setattr(ParsesAhead, "take", take_then_save)
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store, parse_processes=1)
    results = dict(tracker.scan_many(paths))
    assert results[paths[1]].new_messages == 45
    assert tracker.sessions["cli:r1"].message_count == 45
    assert tracker.sessions["cli:r0"].message_count == tracker.sessions["cli:r2"].message_count == 30
    store.close()


def _many_files(sessions: Path, count: int = 6) -> list[Path]:
    return sorted(write_session(sessions, f"cli:k{number}", conversation(40 + number, tag=f"k{number}"))
                  for number in range(count))


def _expected(paths: list[Path]) -> dict[str, int]:
    return {f"cli:k{number}": 40 + number for number in range(len(paths))}


def test_a_parse_process_killed_mid_run_loses_no_file(tmp_path, monkeypatch):
    from nanobotd.sessions import pipeline

    monkeypatch.setattr(pipeline, "SCAN_SLICE_SECONDS", 0.0)  # a file a slice: the first comes back alone
    monkeypatch.setattr(parsepool, "MIN_NEW_FILES", 1)
    _, sessions = make_workspace(tmp_path)
    paths = _many_files(sessions)
    spy = _Spy(monkeypatch)
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store, parse_processes=2)
    results = []
    for _, result in tracker.scan_many(paths):
        results.append(result)
        if len(results) == 1:
            for pid in spy.pids:
                os.kill(pid, signal.SIGKILL)  # both: the files left are parsed in the daemon
    assert all(result.changed for result in results)
    assert {key: session.message_count for key, session in tracker.sessions.items()} == _expected(paths)
    assert len(spy.parsed_ahead()) < len(paths)
    store.close()


HUNG = "import sys, time; sys.stdin.buffer.read(4); time.sleep(60)"
GARBAGE = ("import sys; sys.stdin.buffer.read(4); sys.stdout.buffer.write(b'\\x05\\x00\\x00\\x00hello');"
           " sys.stdout.flush()")
WRONG = ("import pickle, struct, sys; sys.stdin.buffer.read(4); data = pickle.dumps(((1, 2, 3), 'not a parse'));"
         " sys.stdout.buffer.write(struct.pack('<I', len(data)) + data); sys.stdout.flush(); sys.stdin.read()")


@pytest.mark.parametrize("script", [HUNG, GARBAGE, WRONG], ids=["hangs", "answers-garbage", "answers-no-parse"])
def test_a_process_that_hangs_or_answers_garbage_leaves_every_file_to_the_daemon(tmp_path, monkeypatch, script):
    monkeypatch.setattr(parsepool, "MIN_NEW_FILES", 1)
    monkeypatch.setattr(parsepool, "TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(parsepool, "TIMEOUT_PER_MIB", 0.0)
    monkeypatch.setattr(parsepool, "worker_command", lambda module: [sys.executable, "-c", script])
    _, sessions = make_workspace(tmp_path)
    paths = _many_files(sessions)
    spy = _Spy(monkeypatch)
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store, parse_processes=1)
    results = dict(tracker.scan_many(paths))
    assert all(results[path].changed for path in paths)
    assert {key: session.message_count for key, session in tracker.sessions.items()} == _expected(paths)
    assert spy.parsed_ahead() == set()
    assert all(not pid_exists(pid) for pid in spy.pids), "killed, and reaped"
    store.close()


def test_a_few_new_files_or_a_single_core_start_no_process(tmp_path, monkeypatch):
    spy = _Spy(monkeypatch)
    _, sessions = make_workspace(tmp_path)
    paths = _many_files(sessions, count=parsepool.MIN_NEW_FILES - 1)
    store = StateStore(tmp_path / "state").open()
    tracker = SessionTracker("ws", store, parse_processes=2)
    assert all(result.changed for _, result in tracker.scan_many(paths))
    assert spy.pids == []
    store.close()
    assert [processes_for(cores) for cores in (None, 1, 2, 4, 64)] == [0, 0, 2, 2, 2]


def test_the_worker_answers_the_parse_the_daemon_makes_and_why_it_could_not_read(tmp_path):
    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:w", conversation(25, tag="w"), extra_lines=["{not json"])
    requests = io.BytesIO(parseworker.encode((str(path), ENCODING)) + parseworker.encode((str(tmp_path), ENCODING)))
    answers = io.BytesIO()
    assert parseworker.serve(requests, answers) == 0
    answers.seek(0)
    (fingerprint, parsed), (nothing, why) = parseworker.read_item(answers), parseworker.read_item(answers)
    info = os.stat(path)
    assert fingerprint == (info.st_ino, info.st_size, info.st_mtime_ns)
    here = parse_session(path, ENCODING)
    assert list(parsed.messages) == list(here.messages) and parsed.corrupt == here.corrupt == 1
    assert parsed.tail == here.tail and parsed.lines == here.lines and parsed.counting is None
    assert nothing is None and "not a regular file" in why
    assert parseworker.read_item(answers) is None

