"""A long scan's rows written while its tokens are counted (sessions.scanrows) leave the very spool rows, message
cache and counters that the scan leaves writing them as it applies, whatever the file holds and however the
scan goes; the temp tables go once the scan is applied."""

from __future__ import annotations

import json
import sqlite3

import pytest

from nanobotd.sessions import scan as scanmodule
from nanobotd.sessions import tracker as trackermodule
from nanobotd.sessions.scanrows import ScanRows
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from nanobotd.tokens import submit_tokens_batch
from tests.support.workspace import conversation, make_workspace, write_session

SPOOL = ("SELECT seq, digest, role, timestamp, tokens, record, line_start, line_end, line_digest FROM spool"
         " WHERE session_id=? ORDER BY seq")
CACHE = "SELECT seq, line_digest, digest, role, timestamp, tokens, flags FROM messages WHERE session_id=? ORDER BY seq"


def _messages(count: int, tag: str) -> list[dict]:
    """A conversation with slash commands, a checkpoint summary, tool calls and a repeated message."""
    messages = conversation(count, tag=tag, words=8)
    for index in range(5, count, 37):
        messages[index]["_command"] = True
    for index in range(11, count, 53):
        messages[index]["_hidden_history"] = True
    for index in range(3, count, 29):
        messages[index]["tool_calls"] = [{"id": f"c{index}", "function": {"name": "f", "arguments": "{}"}}]
    messages[40] = dict(messages[20])  # the same message twice: its second copy is numbered
    return messages


class _Sides:
    """Two trackers counting in the same counter, one writing rows ahead, one not; what each leaves."""

    def __init__(self, tmp_path, monkeypatch) -> None:
        monkeypatch.setattr(trackermodule, "ROWS_AHEAD_BYTES", 2_000)
        monkeypatch.setattr(scanmodule, "READY_BATCH", 100)
        self.made: list[ScanRows] = []
        made = ScanRows.__init__

        def spy(rows, *args, **kwargs):
            made(rows, *args, **kwargs)
            self.made.append(rows)

        monkeypatch.setattr(ScanRows, "__init__", spy)
        self.copied: list[str] = []
        for name in ("copy_spool", "copy_messages"):
            monkeypatch.setattr(ScanRows, name, self._counted(name, getattr(ScanRows, name)))
        _, self.sessions = make_workspace(tmp_path / "ws")
        self.stores = [StateStore(tmp_path / name).open() for name in ("plain-state", "ahead-state")]
        self.plain = SessionTracker("ws", self.stores[0], counter=submit_tokens_batch, process_scan_bytes=1 << 40)
        self.ahead = SessionTracker("ws", self.stores[1], counter=submit_tokens_batch, process_scan_bytes=2_000)

    def _counted(self, name, copy):
        def counted(*args, **kwargs):
            self.copied.append(name)
            return copy(*args, **kwargs)
        return counted

    def scan(self, path) -> None:
        self.plain.scan(path)
        self.ahead.scan(path)

    def left(self, tracker: SessionTracker, store: StateStore) -> dict:
        found = {}
        for key, session in tracker.sessions.items():
            found[key] = (session.unarchived_messages, session.unarchived_tokens, session.total_tokens,
                          session.message_count, session.agent_archived, session.hold_generation,
                          store.query(SPOOL, (session.session_id,)),
                          store.query(CACHE, (session.session_id,)))
        return found

    def same(self) -> dict:
        plain, ahead = self.left(self.plain, self.stores[0]), self.left(self.ahead, self.stores[1])
        assert ahead == plain
        assert not self.stores[1].query("SELECT name FROM sqlite_temp_master WHERE type='table'"), "dropped"
        return ahead

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def sides(tmp_path, monkeypatch):
    made = _Sides(tmp_path, monkeypatch)
    yield made
    made.close()


def test_a_first_scan_copies_the_rows_it_wrote_ahead_and_leaves_what_writing_them_at_the_end_leaves(sides):
    path = write_session(sides.sessions, "cli:long", _messages(700, "a"), last_archived=30)
    sides.scan(path)
    left = sides.same()["cli:long"]
    assert len(sides.made) == 1 and sides.made[0].stop == 700, "every message was written ahead"
    assert sides.copied == ["copy_spool", "copy_messages"]
    spooled = left[6]
    assert len(spooled) < 670 and all(row[5] == "" and row[6] is not None for row in spooled), "held rows"
    assert [row[0] for row in spooled] == list(range(1, len(spooled) + 1))


def test_appends_rewrites_and_a_fast_path_that_gives_up_leave_the_same(sides):
    first = _messages(400, "b")
    path = write_session(sides.sessions, "cli:long", first)
    sides.scan(path)
    more = conversation(300, tag="c", words=8)
    write_session(sides.sessions, "cli:long", first + more)  # a long append: the fast path, rows from message 400
    sides.scan(path)
    assert sides.made[-1].start == 400 and sides.made[-1].stop == 700
    assert sides.copied == ["copy_spool", "copy_messages"] * 2
    again = [dict(more[10])] + conversation(300, tag="d", words=8)  # a copy of an earlier message: a full parse
    write_session(sides.sessions, "cli:long", first + more + again)
    sides.scan(path)
    assert sides.made[-1].start == 0 and sides.made[-1].stop == 1001
    write_session(sides.sessions, "cli:long", first[:100] + more, last_archived=50)  # rewritten, shorter
    sides.scan(path)
    sides.same()


def test_rows_that_cannot_be_written_ahead_are_written_by_the_apply(sides, monkeypatch):
    def full(self, sql, rows=None):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(StateStore, "execute_temp", full)
    path = write_session(sides.sessions, "cli:long", _messages(500, "e"))
    sides.scan(path)
    assert sides.made[0].failed and not sides.copied
    sides.same()


def test_a_copied_session_cannot_hold_and_its_rows_are_copied_from_the_file(sides, monkeypatch):
    for tracker in (sides.plain, sides.ahead):
        monkeypatch.setattr(tracker, "_hold_version", lambda *args, **kwargs: None)
    path = write_session(sides.sessions, "cli:long", _messages(300, "f"))
    sides.scan(path)
    spooled = sides.same()["cli:long"][6]
    assert spooled and all(json.loads(row[5])["content"] for row in spooled), "records copied, not held"
    assert sides.copied == ["copy_messages"]
