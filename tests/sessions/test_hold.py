"""The spool refers to lines in a held version of the session file: what each kind of save does to it."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loguru import logger

from nanobotd.sessions import hold
from nanobotd.sessions.file import line_digest
from nanobotd.sessions.scan import LineRef, read_line
from nanobotd.sessions.tracker import SessionTracker
from nanobotd.state.store import StateStore
from nanobotd.tuning import SPOOL_BATCH
from tests.support.mounts import tmpfs
from tests.support.workspace import conversation, make_workspace, write_session

KEY = "cli:a"


def make_tracker(tmp_path):
    store = StateStore(tmp_path / "state").open()
    return store, SessionTracker("ws", store)


def line(message: dict) -> str:
    """A message's line as write_session writes it."""
    return json.dumps(message, ensure_ascii=False)


def by_marker(messages: list[dict]) -> dict[str, str]:
    """Each message's line as write_session writes it, by the marker its content starts with."""
    return {message["content"].split(" ")[0]: line(message) for message in messages}


def spooled_texts(tracker) -> dict[str, str]:
    """Every spooled message's record text, by the marker its content starts with."""
    return {message.text.split(" ")[0]: json.dumps(message.record, ensure_ascii=False)
            for _, message, _ in tracker.pending(KEY)}


def held_files(store) -> list[str]:
    folder = store.state_dir / "held"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def write_in_place(path, key: str, messages: list[dict]) -> None:
    """A writer that truncates and rewrites the session file itself (same inode), as `cp` or open('w') do."""
    inode = os.stat(path).st_ino
    metadata = {"_type": "metadata", "key": key, "last_archived": 0, "last_consolidated": 0}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join([json.dumps(metadata)] + [line(message) for message in messages]) + "\n")
    assert os.stat(path).st_ino == inode


def long_conversation(count: int, tag: str = "m") -> list[dict]:
    """Messages of ~8 KB: a few of them new at once are worth a held copy (tuning.HOLD_MIN_BYTES)."""
    return conversation(count, words=1000, tag=tag)


def records(store) -> list[str]:
    """Each spool row's record in sequence order: '' for a held row, the line's text for a copied one."""
    return [row[0] for row in store.query("SELECT record FROM spool ORDER BY session_id, seq")]


def test_a_file_seen_once_is_held_by_a_private_copy_that_an_in_place_truncation_cannot_touch(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(12)
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    session = tracker.sessions[KEY]
    # a long file seen the first time is held unread: a copy, no spool row yet, its counters from its bytes
    assert session.unread and session.unarchived_messages == 12
    assert held_files(store) == [f"{session.session_id}.1"] and records(store) == []
    held = store.state_dir / "held" / held_files(store)[0]
    assert os.stat(held).st_ino != os.stat(path).st_ino and os.stat(held).st_nlink == 1
    write_in_place(path, KEY, [])  # every message gone, in place
    result = tracker.scan(path)
    assert result.vanished == 12 and records(store) == [""] * 12  # read from the copy, its rows held in it
    assert spooled_texts(tracker) == by_marker(messages)


def test_rows_that_come_while_a_copy_is_held_go_into_the_spool_as_text_and_no_other_copy_is_made(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(14)
    path = write_session(sessions, KEY, messages[:10])
    tracker.scan(path)
    for count in (12, 14):  # the agent's saves: a new file renamed over the old one, a turn at a time
        path = write_session(sessions, KEY, messages[:count])
        tracker.scan(path)
    session = tracker.sessions[KEY]
    assert held_files(store) == [f"{session.session_id}.1"] and session.hold_generation == 1
    assert records(store) == [""] * 10 + [line(message) for message in messages[10:]]
    assert os.stat(path).st_nlink == 1
    assert spooled_texts(tracker) == by_marker(messages)


def test_a_few_new_rows_with_no_copy_held_go_into_the_spool_as_text(tmp_path):
    """A turn's messages cost their own bytes as text; a copy would cost the whole file and a sync."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(6)
    tracker.scan(write_session(sessions, KEY, messages[:4]))
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    assert held_files(store) == [] and tracker.sessions[KEY].hold_generation == 0
    assert records(store) == [line(message) for message in messages]
    write_in_place(path, KEY, [])
    tracker.scan(path)
    assert spooled_texts(tracker) == by_marker(messages)


def test_messages_a_rename_drops_are_read_from_the_held_copy_which_nothing_rewrites(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(10)
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    copy = store.state_dir / "held" / held_files(store)[0]
    before = copy.read_bytes()
    path = write_session(sessions, KEY, messages[6:])  # /new-like: the first six are gone
    result = tracker.scan(path)
    assert result.vanished == 6
    assert records(store) == [""] * 10 and copy.read_bytes() == before
    assert spooled_texts(tracker) == by_marker(messages)


def test_an_in_place_rewrite_that_keeps_some_lines_loses_no_unarchived_message(tmp_path):
    """vim writes a file in place (same inode) when it has more than one link: lines kept move, others go. The
    held copy is not the file, so every unarchived line still reads back and none is reported lost."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(12)
    tracker.scan(write_session(sessions, KEY, messages[:8]))
    path = write_session(sessions, KEY, messages)  # the agent's save by rename
    tracker.scan(path)
    assert os.stat(path).st_nlink == 1
    lines: list[str] = []
    sink = logger.add(lines.append, level="ERROR", format="{message}")
    try:
        write_in_place(path, KEY, messages[:2] + messages[5:])  # three lines cut from the middle, the rest moved
        result = tracker.scan(path)
        assert result.vanished == 3
        write_in_place(path, KEY, messages[5:9])
        tracker.scan(path)
    finally:
        logger.remove(sink)
    assert lines == []
    assert spooled_texts(tracker) == by_marker(messages)
    assert tracker.sessions[KEY].unarchived_messages == 4


def test_a_held_version_left_by_a_crash_before_its_commit_is_removed_at_start(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, KEY, long_conversation(12))
    tracker.scan(path)
    session_id = tracker.sessions[KEY].session_id
    (store.state_dir / "held" / f"{session_id}.7").write_bytes(b"left behind")
    (store.state_dir / "held" / "999.1").write_bytes(b"another workspace's")
    SessionTracker("ws", store)
    assert held_files(store) == sorted(["999.1", f"{session_id}.1"])


def test_a_state_folder_on_another_filesystem_holds_streamed_copies_that_keep_every_line(tmp_path):
    """The state folder on its own real tmpfs, the sessions on the disk: copy_file_range does not cross the two
    (EXDEV), so the held version is a copy made by reading and writing."""
    _, sessions = make_workspace(tmp_path)
    with tmpfs(tmp_path / "state"):
        store, tracker = make_tracker(tmp_path)
        messages = long_conversation(12)
        path = write_session(sessions, KEY, messages[:10])
        tracker.scan(path)
        session = tracker.sessions[KEY]
        held = store.state_dir / "held" / f"{session.session_id}.{session.hold_generation}"
        assert held.read_bytes() == path.read_bytes()
        path = write_session(sessions, KEY, messages)
        tracker.scan(path)
        write_in_place(path, KEY, [])
        tracker.scan(path)
        assert spooled_texts(tracker) == by_marker(messages)
        store.close()


def test_held_lines_are_read_again_after_a_restart_and_after_the_next_save(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(12)
    path = write_session(sessions, KEY, messages[:8])
    tracker.scan(path)
    path = write_session(sessions, KEY, messages[:9])
    tracker.scan(path)
    restarted = SessionTracker("ws", store)
    path = write_session(sessions, KEY, messages[2:])  # two gone, three new, after the restart
    result = restarted.scan(path)
    assert result.vanished == 2
    assert spooled_texts(restarted) == by_marker(messages)


@pytest.mark.parametrize("seed", range(12))
def test_any_sequence_of_saves_keeps_every_unarchived_line_readable(tmp_path, seed):
    """Saves by rename that add or cut messages, in-place rewrites that add some, metadata lines of changing
    length, restarts and archive runs, in a random order: every message not archived reads back as the line it
    had, and the session file never gets a second link."""
    rng = random.Random(seed)
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    pool = conversation(80, words=rng.choice([20, 400]), tag=f"s{seed}")
    shown: list[dict] = []
    seen: dict[str, str] = {}
    archived: set[str] = set()
    path = None
    for _ in range(14):
        action = rng.choice(["append", "append", "cut", "restart", "inplace", "archive"]) if path else "append"
        if action == "restart":
            tracker = SessionTracker("ws", store)
            continue
        if action == "archive":
            pending = [message for _, message, _ in tracker.pending(KEY)]
            chosen = pending[:rng.randint(0, len(pending))]
            tracker.mark_archived(KEY, [message.digest for message in chosen], "r-1")
            archived.update(message.text.split(" ")[0] for message in chosen)
            continue
        if action == "cut" and len(shown) > 1:
            shown = shown[rng.randrange(1, len(shown)):]
        else:
            fresh = [message for message in pool if message not in shown]
            shown = shown + fresh[:rng.choice([1, 3, 25])]
        if action == "inplace":
            write_in_place(path, KEY, shown)
        else:
            path = write_session(sessions, KEY, shown, last_archived=0)
            if rng.random() < 0.5:  # a metadata line of another length
                padding = json.dumps({"n": "x" * rng.randint(1, 30)})
                text = path.read_text(encoding="utf-8").replace('"metadata": {}', f'"metadata": {padding}', 1)
                temp = path.with_name(".again.tmp")
                temp.write_text(text, encoding="utf-8")
                os.replace(temp, path)
        tracker.scan(path)
        assert os.stat(path).st_nlink == 1
        seen.update(by_marker(shown))
    assert spooled_texts(tracker) == {marker: text for marker, text in seen.items() if marker not in archived}


def test_the_held_copy_goes_once_no_row_is_held_in_it(tmp_path):
    """Archived by nanobotd, or by the agent itself (its mark moves over them): the copy is not kept for nothing,
    and the next many rows get a copy of their own."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = long_conversation(30)
    path = write_session(sessions, KEY, messages[:10])
    tracker.scan(path)
    assert len(held_files(store)) == 1
    tracker.mark_archived(KEY, [message.digest for _, message, _ in tracker.pending(KEY)], "r-1")
    assert held_files(store) == [] and tracker.sessions[KEY].hold_generation == 0
    path = write_session(sessions, KEY, messages)  # twenty new: most of the file, a copy again
    tracker.scan(path)
    session = tracker.sessions[KEY]
    assert held_files(store) == [f"{session.session_id}.1"]
    tracker.scan(write_session(sessions, KEY, messages, last_archived=30))  # the agent archived them itself
    assert held_files(store) == [] and session.hold_generation == 0


def test_a_full_rewrite_of_a_long_session_moves_no_held_row(tmp_path):
    """More held rows than a batch (tuning.SPOOL_BATCH): a checkpoint inserted mid-file and the first messages
    leaving the file rewrite no spool row; the ones that left are counted vanished, and all read back."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(2 * SPOOL_BATCH + 500, words=4)
    tracker.scan(write_session(sessions, KEY, messages))
    checkpoint = {"role": "assistant", "content": "CHECKPOINT summary", "timestamp": "2026-11-02T00:00:00",
                  "_hidden_history": True}
    kept = messages[SPOOL_BATCH + 200:]
    result = tracker.scan(write_session(sessions, KEY, kept[:300] + [checkpoint] + kept[300:]))
    assert result.vanished == SPOOL_BATCH + 200
    assert records(store) == [""] * len(messages)
    assert spooled_texts(tracker) == by_marker(messages)
    assert tracker.sessions[KEY].unarchived_messages == len(kept)


def shifted(lines: list[LineRef | None], shift: int) -> list[LineRef | None]:
    return [None if ref is None else LineRef(ref.start + shift, ref.end + shift, ref.line_digest) for ref in lines]


def scan_peak(tracker: SessionTracker, path: Path) -> int:
    """The most memory (bytes, traced) *tracker*'s scan of *path* took beyond what was allocated before it."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracker.scan(path)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_a_full_rewrite_of_a_long_session_never_holds_all_its_held_rows_in_memory(tmp_path):
    """The memory a rewrite that is not an append takes grows slowly with the session (held rows were once read all
    at once, with a dict of every line: ~830 bytes a message)."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(5_000, words=4)
    tracker.scan(write_session(sessions, KEY, messages[:10]))
    tracker.scan(write_session(sessions, KEY, messages))
    checkpoint = {"role": "assistant", "content": "CHECKPOINT summary", "timestamp": "2026-11-02T00:00:00",
                  "_hidden_history": True}
    path = write_session(sessions, KEY, messages[:2_500] + [checkpoint] + messages[2_500:])
    peak = scan_peak(tracker, path)
    assert peak / len(messages) < 600, f"{peak / len(messages):.0f} bytes a message"
    assert spooled_texts(tracker) == by_marker(messages)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40),
       shift=st.integers(min_value=0, max_value=50))
def test_held_lines_read_by_spans_are_read_as_line_by_line(data, sizes, shift):
    lines = [(f'{{"n": {number}, "pad": "{"x" * size}"}}').encode() for number, size in enumerate(sizes)]
    content = b"-" * shift + b"\n".join(lines) + b"\n"
    refs, offset = [], shift
    for line in lines:
        refs.append(LineRef(offset - shift, offset - shift + len(line) + 1, line_digest(line)))
        offset += len(line) + 1
    wanted = data.draw(st.lists(st.sampled_from(refs) | st.none() | st.builds(
        lambda ref: LineRef(ref.start, ref.end, "0" * 32), st.sampled_from(refs)), max_size=30))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "held"
        path.write_bytes(content)
        with path.open("rb") as handle:
            expected = [None if ref is None else read_line(handle, LineRef(ref.start + shift, ref.end + shift,
                                                                            ref.line_digest)) for ref in wanted]
        expected = [None if data is None else data.decode() for data in expected]
        assert hold.read_held_lines(path, shifted(wanted, shift)) == expected
        assert hold.read_held_lines(path, shifted(wanted, shift), span_bytes=400, gap_bytes=10) == expected


def older_state_holding_a_link(tmp_path, sessions, messages: list[dict], shift: int):
    """A state folder as the nanobotd before schema 8 left it: the session's held version a hard link of its file,
    its held rows' offsets *shift* bytes short of their lines (the session's hold_shift makes up for it)."""
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    tracker.pending(KEY)  # read: its rows held
    session = tracker.sessions[KEY]
    held = store.state_dir / "held" / f"{session.session_id}.{session.hold_generation}"
    held.unlink()
    os.link(path, held)
    store.close()
    db = sqlite3.connect(tmp_path / "state" / "state.db", isolation_level=None)
    db.executescript(f"BEGIN; UPDATE sessions SET hold_links=1, hold_shift={shift};"
                     f" UPDATE spool SET line_start=line_start-{shift}, line_end=line_end-{shift};"
                     " DROP TABLE held_links; ALTER TABLE sessions DROP COLUMN unread; PRAGMA user_version=7;"
                     " COMMIT;")
    db.close()
    return path


def test_a_hard_link_an_older_nanobotd_held_is_copied_at_start_and_its_lines_read_back(tmp_path):
    _, sessions = make_workspace(tmp_path)
    messages = long_conversation(12)
    path = older_state_holding_a_link(tmp_path, sessions, messages, shift=7)
    assert os.stat(path).st_nlink == 2
    store, tracker = make_tracker(tmp_path)  # schema 8, then the tracker's start
    assert os.stat(path).st_nlink == 1 and held_files(store) == [f"{tracker.sessions[KEY].session_id}.2"]
    assert store.query("SELECT count(*) FROM held_links")[0][0] == 0
    assert tracker.scan(path).changed is False
    write_in_place(path, KEY, [])  # the file is not the held version any more
    tracker.scan(path)
    assert spooled_texts(tracker) == by_marker(messages)


def test_a_hard_link_written_in_place_before_the_start_reports_only_the_lines_the_file_lost(tmp_path):
    """Lines a write in place moved are not where the held rows say: they leave the spool and the file is read
    whole again, so those still in it are spooled again; only the ones it cut are reported lost."""
    _, sessions = make_workspace(tmp_path)
    messages = long_conversation(12)
    path = older_state_holding_a_link(tmp_path, sessions, messages, shift=0)
    write_in_place(path, KEY, messages[:2] + messages[5:])  # while no daemon runs: three cut, the rest moved
    lines: list[str] = []
    sink = logger.add(lines.append, level="ERROR", format="{message}")
    try:
        store, tracker = make_tracker(tmp_path)
    finally:
        logger.remove(sink)
    assert any("3 unarchived message(s)" in text for text in lines), lines
    assert tracker.sessions[KEY].fingerprint is None
    result = tracker.scan(path)
    assert result.changed and result.vanished == 0
    assert spooled_texts(tracker) == by_marker(messages[:2] + messages[5:])
    assert tracker.sessions[KEY].unarchived_messages == 9 and os.stat(path).st_nlink == 1
