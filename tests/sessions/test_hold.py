"""The spool refers to lines in a held version of the session file: what each kind of save does to it."""

from __future__ import annotations

import json
import os
import random
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


def test_a_file_seen_once_is_held_by_a_private_copy_that_an_in_place_truncation_cannot_touch(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(12)
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    session = tracker.sessions[KEY]
    assert not session.hold_links and held_files(store) == [f"{session.session_id}.1"]
    assert os.stat(store.state_dir / "held" / held_files(store)[0]).st_ino != os.stat(path).st_ino
    write_in_place(path, KEY, [])  # every message gone, in place
    result = tracker.scan(path)
    assert result.vanished == 12
    texts = spooled_texts(tracker)
    assert texts == by_marker(messages)


def test_a_file_replaced_by_renames_is_held_by_a_link_and_the_spool_keeps_no_copy(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(10)
    path = write_session(sessions, KEY, messages[:6])
    tracker.scan(path)
    path = write_session(sessions, KEY, messages)  # nanobot's save: a new file renamed over the old one
    tracker.scan(path)
    session = tracker.sessions[KEY]
    assert session.hold_links
    assert held_files(store) == [f"{session.session_id}.2"]  # the first version (a copy) is gone
    assert os.stat(store.state_dir / "held" / held_files(store)[0]).st_ino == os.stat(path).st_ino
    assert [row[0] for row in store.query("SELECT record FROM spool")] == [""] * 10
    assert spooled_texts(tracker) == by_marker(messages)


def save_padded(sessions, messages: list[dict], padding: int):
    """write_session, then the same save again with a metadata line *padding* bytes longer."""
    path = write_session(sessions, KEY, messages)
    extra = json.dumps({"n": "x" * padding})
    text = path.read_text(encoding="utf-8").replace('"metadata": {}', f'"metadata": {extra}', 1)
    temp = path.with_name(".padded.tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)
    return path


def test_a_metadata_line_that_changes_length_moves_the_held_lines_with_it(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(8)
    path = save_padded(sessions, messages[:2], 0)
    tracker.scan(path)
    first_line = len(path.read_bytes().split(b"\n", 1)[0])
    for count, padding in ((4, 40), (6, 3), (8, 90)):
        path = save_padded(sessions, messages[:count], padding)
        result = tracker.scan(path)
        assert result.new_messages == 2
        # the held rows keep their offsets: the session's shift is how far the message lines moved
        assert tracker.sessions[KEY].hold_shift == len(path.read_bytes().split(b"\n", 1)[0]) - first_line != 0
    assert spooled_texts(tracker) == by_marker(messages)
    assert store.query("SELECT count(*) FROM spool WHERE record != ''")[0][0] == 0


def test_messages_a_rename_drops_are_copied_out_of_the_held_link_before_it_moves_on(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(10)
    path = write_session(sessions, KEY, messages[:4])
    tracker.scan(path)
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    path = write_session(sessions, KEY, messages[6:])  # /new-like: the first six are gone
    result = tracker.scan(path)
    assert result.vanished == 6
    copied = {row[0] for row in store.query("SELECT digest FROM spool WHERE record != ''")}
    assert len(copied) == 6
    assert spooled_texts(tracker) == by_marker(messages)
    session = tracker.sessions[KEY]
    assert held_files(store) == [f"{session.session_id}.3"]


def test_a_link_rewritten_in_place_switches_the_session_to_copies_and_reports_what_it_took(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(8)
    path = write_session(sessions, KEY, messages[:4])
    tracker.scan(path)
    path = write_session(sessions, KEY, messages)
    tracker.scan(path)
    assert tracker.sessions[KEY].hold_links
    write_in_place(path, KEY, messages[3:])  # the held link is the file: the first three lines are gone
    lines: list[str] = []
    sink = logger.add(lines.append, level="ERROR", format="{message}")
    try:
        tracker.scan(path)
    finally:
        logger.remove(sink)
    session = tracker.sessions[KEY]
    assert not session.hold_links
    assert any("rewritten in place" in text for text in lines)
    assert any("3 unarchived message(s)" in text for text in lines)
    assert spooled_texts(tracker) == by_marker(messages[3:])
    # from now on it is held by a private copy: another in-place truncation loses nothing
    write_in_place(path, KEY, [])
    tracker.scan(path)
    assert spooled_texts(tracker) == by_marker(messages[3:])


def test_a_held_version_left_by_a_crash_before_its_commit_is_removed_at_start(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    path = write_session(sessions, KEY, conversation(4))
    tracker.scan(path)
    session_id = tracker.sessions[KEY].session_id
    (store.state_dir / "held" / f"{session_id}.7").write_bytes(b"left behind")
    (store.state_dir / "held" / "999.1").write_bytes(b"another workspace's")
    SessionTracker("ws", store)
    assert held_files(store) == sorted(["999.1", f"{session_id}.1"])


def test_a_state_folder_on_another_filesystem_holds_streamed_copies_that_keep_every_line(tmp_path):
    """The state folder on its own real tmpfs, the sessions on the disk: neither a link nor copy_file_range crosses
    the two (EXDEV), so the held versions are copies made by reading and writing."""
    _, sessions = make_workspace(tmp_path)
    with tmpfs(tmp_path / "state"):
        store, tracker = make_tracker(tmp_path)
        messages = conversation(6)
        path = write_session(sessions, KEY, messages[:3])
        tracker.scan(path)  # seen once: a copy
        path = write_session(sessions, KEY, messages)
        tracker.scan(path)  # replaced by a rename: a link is tried, and cannot be made
        session = tracker.sessions[KEY]
        assert not session.hold_links
        held = store.state_dir / "held" / f"{session.session_id}.{session.hold_generation}"
        assert held.read_bytes() == path.read_bytes()
        write_in_place(path, KEY, [])
        tracker.scan(path)
        assert spooled_texts(tracker) == by_marker(messages)
        store.close()


def test_held_lines_are_read_again_after_a_restart_and_follow_the_next_save(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(9)
    path = write_session(sessions, KEY, messages[:3])
    tracker.scan(path)
    path = write_session(sessions, KEY, messages[:6])
    tracker.scan(path)
    restarted = SessionTracker("ws", store)
    path = write_session(sessions, KEY, messages[2:])  # two gone, three new, after the restart
    result = restarted.scan(path)
    assert result.vanished == 2
    assert spooled_texts(restarted) == by_marker(messages)


@pytest.mark.parametrize("seed", range(12))
def test_any_sequence_of_saves_keeps_every_unarchived_line_readable(tmp_path, seed):
    """Saves by rename that add or cut messages, in-place rewrites that add some, metadata lines of changing
    length and restarts, in a random order: every message ever seen reads back as the line it had."""
    rng = random.Random(seed)
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    pool = conversation(40, tag=f"s{seed}")
    shown: list[dict] = []
    seen: dict[str, str] = {}
    path = None
    for _ in range(14):
        action = rng.choice(["append", "append", "cut", "restart", "inplace"]) if path else "append"
        if action == "restart":
            tracker = SessionTracker("ws", store)
            continue
        if action == "cut" and len(shown) > 1:
            shown = shown[rng.randrange(1, len(shown)):]
        else:
            shown = shown + [message for message in pool if message not in shown][:rng.randint(1, 4)]
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
        seen.update(by_marker(shown))
    assert spooled_texts(tracker) == seen


def test_a_private_copy_goes_once_no_row_is_held_in_it_and_a_link_to_the_live_file_stays(tmp_path):
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(6)
    path = write_session(sessions, KEY, messages[:3])
    tracker.scan(path)
    assert len(held_files(store)) == 1  # a copy
    tracker.mark_archived(KEY, [message.digest for _, message, _ in tracker.pending(KEY)], "r-1")
    assert held_files(store) == [] and tracker.sessions[KEY].hold_generation == 0
    path = write_session(sessions, KEY, messages)  # a rename: three new rows, held by a link
    tracker.scan(path)
    tracker.mark_archived(KEY, [message.digest for _, message, _ in tracker.pending(KEY)], "r-2")
    assert tracker.sessions[KEY].hold_links and len(held_files(store)) == 1
    os.unlink(path)  # the file is deleted: a link to it would keep its bytes for nothing
    tracker.scan(path)
    assert held_files(store) == []


def test_the_held_rows_of_a_long_session_follow_a_full_rewrite_batch_by_batch(tmp_path):
    """More held rows than a batch (tuning.SPOOL_BATCH): a checkpoint inserted mid-file moves every held row, and the
    first messages leaving the file are copied out, across the batch boundaries."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(2 * SPOOL_BATCH + 500, words=4)
    tracker.scan(write_session(sessions, KEY, messages[:10]))
    tracker.scan(write_session(sessions, KEY, messages))  # a rename: held by a link from now on
    checkpoint = {"role": "assistant", "content": "CHECKPOINT summary", "timestamp": "2026-11-02T00:00:00",
                  "_hidden_history": True}
    kept = messages[SPOOL_BATCH + 200:]
    path = write_session(sessions, KEY, kept[:300] + [checkpoint] + kept[300:])
    result = tracker.scan(path)
    assert not tracker.sessions[KEY].hold_links or result.vanished == SPOOL_BATCH + 200
    copied = store.query("SELECT count(*) FROM spool WHERE record != ''")[0][0]
    held = store.query("SELECT count(*) FROM spool WHERE record = '' AND line_digest IS NOT NULL")[0][0]
    assert (copied, held) == (SPOOL_BATCH + 200, len(kept))
    assert spooled_texts(tracker) == by_marker(messages)
    assert tracker.sessions[KEY].unarchived_messages == len(kept)


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
    """The memory a rewrite that is not an append takes grows slowly with the session: the held rows follow the
    file a batch at a time (they once were read all at once, with a dict of every line: ~830 bytes a message)."""
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
        assert hold.read_held_lines(path, shift, wanted) == expected
        assert hold.read_held_lines(path, shift, wanted, span_bytes=400, gap_bytes=10) == expected


def test_after_a_restart_a_long_held_link_is_checked_a_batch_of_rows_at_a_time(tmp_path):
    """A restarted tracker reads a held link whole (grown in place: its lines are checked where they were held): its
    held rows are read a batch at a time, never all at once, and, rows many batches long, every one is checked and
    still reads back."""
    _, sessions = make_workspace(tmp_path)
    store, tracker = make_tracker(tmp_path)
    messages = conversation(5_000, words=4)
    tracker.scan(write_session(sessions, KEY, messages[:10]))
    path = write_session(sessions, KEY, messages[:4_000])
    tracker.scan(path)
    assert tracker.sessions[KEY].hold_links
    restarted = SessionTracker("ws", store)
    with open(path, "a", encoding="utf-8") as handle:  # grown in place: the held link is the file itself
        handle.write("\n".join(line(message) for message in messages[4_000:]) + "\n")
    restarted.caches.messages(restarted.sessions[KEY])  # loaded before the scan, as a scan loads it
    peak = scan_peak(restarted, path)
    assert restarted.sessions[KEY].hold_links  # its lines were all where they were held: still a link
    assert spooled_texts(restarted) == by_marker(messages)
    # the parse itself is most of it; the held rows read all at once made it 589 bytes a message
    assert peak / len(messages) < 540, f"{peak / len(messages):.0f} bytes a message"
    again = SessionTracker("ws", store)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line(conversation(1, tag="z")[0]) + "\n")
    again.scan(path)
    assert again.sessions[KEY].hold_links
    assert spooled_texts(again) == by_marker(messages + conversation(1, tag="z"))
