"""A long session file seen the first time is held unread: a copy, counters from its bytes, its lines decoded only
when a decision needs its messages. Whatever happens to the file meanwhile, no unarchived message is lost."""

from __future__ import annotations

import json
import os

from tests.sessions.test_hold import long_conversation, make_tracker
from tests.support.workspace import conversation, make_workspace, write_session

KEY = "cli:a"


def spooled(tracker, key: str = KEY) -> list[str]:
    """The spooled messages' texts, in first-seen order."""
    return [message.text for _, message, _ in tracker.pending(key)]


def counters(session) -> tuple[int, int, int]:
    return session.message_count, session.unarchived_messages, session.agent_archived


def spool_rows(store) -> int:
    return store.query("SELECT count(*) FROM spool")[0][0]


def test_the_estimates_an_unread_file_shows_are_its_counts_once_read(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(20)
    path = write_session(sessions, KEY, messages, last_archived=4)
    result = tracker.scan(path)
    session = tracker.sessions[KEY]
    assert session.unread and result.new_messages == 16 and spool_rows(store) == 0
    estimated = counters(session), session.unarchived_tokens
    assert spooled(tracker) == [message["content"] for message in messages[4:]]
    assert not session.unread and counters(session) == estimated[0]
    assert abs(session.unarchived_tokens - estimated[1]) <= 0.05 * session.unarchived_tokens


def test_an_unread_file_unchanged_across_a_restart_is_not_read_and_a_changed_one_is_read_against_its_copy(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(14)
    path = write_session(sessions, KEY, messages[:12])
    tracker.scan(path)
    store.close()
    store, tracker = make_tracker(tmp_path)
    assert tracker.sessions[KEY].unread and tracker.scan(path).changed is False
    assert tracker.sessions[KEY].unread and spool_rows(store) == 0
    path = write_session(sessions, KEY, messages)  # the agent's next save: two messages more
    result = tracker.scan(path)
    assert result.changed and result.new_messages == 2 and result.vanished == 0
    assert spooled(tracker) == [message["content"] for message in messages]
    assert counters(tracker.sessions[KEY]) == (14, 14, 0)


def test_an_unread_file_cut_to_nothing_in_place_or_deleted_loses_no_message(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(10)
    cut = write_session(sessions, KEY, messages)
    gone = write_session(sessions, "cli:b", long_conversation(10, tag="b"))
    tracker.scan(cut)
    tracker.scan(gone)
    inode = os.stat(cut).st_ino
    with open(cut, "w", encoding="utf-8") as handle:  # in place: same inode, a new first line, nothing else
        handle.write(json.dumps({"_type": "metadata", "key": KEY}) + "\n")
    assert os.stat(cut).st_ino == inode
    assert tracker.scan(cut).vanished == 10
    assert tracker.vanished(KEY) and spooled(tracker) == [message["content"] for message in messages]
    os.unlink(gone)
    assert tracker.forget_path(gone).vanished == 10
    assert len(tracker.vanished("cli:b")) == 10


def test_an_unread_session_archived_lets_its_copy_go(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, KEY, long_conversation(10))
    tracker.scan(path)
    held = store.state_dir / "held"
    assert len(os.listdir(held)) == 1
    pending = tracker.pending(KEY)
    tracker.mark_archived(KEY, [message.digest for _, message, _ in pending], "run-1",
                          seqs=[seq for seq, _, _ in pending])
    session = tracker.sessions[KEY]
    assert session.unarchived_messages == 0 and spool_rows(store) == 0
    assert os.listdir(held) == [] and session.hold_generation == 0


def test_short_files_and_files_the_agent_mostly_archived_are_read_at_once(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    short = write_session(sessions, KEY, conversation(10))
    archived = write_session(sessions, "cli:b", long_conversation(20, tag="b"), last_archived=15)
    tracker.scan(short)
    tracker.scan(archived)
    assert not tracker.sessions[KEY].unread and not tracker.sessions["cli:b"].unread
    assert spool_rows(store) == 10 + 5


def test_an_unread_session_whose_copy_is_gone_is_read_again_from_its_file(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(10)
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    for held in (store.state_dir / "held").iterdir():
        held.unlink()  # the state folder damaged
    assert spooled(tracker) == [] and not tracker.sessions[KEY].unread
    assert tracker.scan(path).changed  # its fingerprint forgotten: the file is read whole
    assert spooled(tracker) == [message["content"] for message in messages]
