"""Incremental parsing: the fast path reads only what follows the known bytes, and falls back safely."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd.sessions.scan import parse_session
from tests.sessions.test_file import LINES
from tests.support.workspace import conversation, make_workspace, write_session


def full_then_append(tmp_path, first, second):
    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:a", first)
    before = parse_session(path, "o200k_base")
    write_session(sessions, "cli:a", second)
    after = parse_session(path, "o200k_base", cached=before.messages, tail=before.tail,
                          corrupt_before=before.corrupt)
    return before, after, parse_session(path, "o200k_base")


def test_an_appended_message_takes_the_fast_path_and_matches_a_full_parse(tmp_path):
    messages = conversation(50)
    before, after, full = full_then_append(tmp_path, messages, messages + conversation(1, tag="z"))
    assert after.fast and len(after.new_records) == 1
    assert after.messages == full.messages and after.tail == full.tail


def test_a_message_inserted_mid_file_falls_back_to_the_full_parse(tmp_path):
    messages = conversation(10)
    checkpoint = {"role": "user", "content": "summary", "timestamp": "2026-11-01T09:01:00", "_hidden_history": True}
    before, after, full = full_then_append(tmp_path, messages, messages[:5] + [checkpoint] + messages[5:])
    assert not after.fast
    assert after.messages == full.messages


def test_a_duplicate_of_an_earlier_message_falls_back_so_digests_stay_unique(tmp_path):
    messages = conversation(6)
    before, after, full = full_then_append(tmp_path, messages, messages + [messages[0]])
    assert not after.fast
    assert len({info.digest for info in after.messages}) == 7 and after.messages == full.messages


def test_a_file_without_a_final_newline_has_no_fast_path_state(tmp_path):
    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:a", conversation(3))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert parse_session(path, "o200k_base").tail is None


def test_three_copies_of_a_line_keep_three_distinct_digests_across_rescans(tmp_path):
    messages = conversation(4)
    before, after, full = full_then_append(tmp_path, messages + [messages[1]], messages + [messages[1], messages[1]])
    assert len(after.messages) == 6 and len({info.digest for info in after.messages}) == 6
    assert after.messages == full.messages


@settings(max_examples=120, deadline=None)
@given(first=st.lists(LINES, max_size=8), more=st.lists(LINES, max_size=4))
def test_any_session_bytes_parse_to_messages_or_counted_corrupt_lines_incrementally_as_in_full(first, more):
    path = Path(tempfile.mkdtemp(prefix="nbs-")) / "c2Vzc2lvbg.jsonl"
    path.write_bytes(b"\n".join(first) + (b"\n" if first else b""))
    before = parse_session(path, "o200k_base")
    assert isinstance(before.key, str) and before.header.last_archived >= 0
    physical_lines = b"\n".join(first).count(b"\n") + 1 if first else 0  # a generated line may hold a LF
    assert len(before.messages) + before.corrupt <= physical_lines
    with open(path, "ab") as handle:
        handle.write(b"\n".join(more) + (b"\n" if more else b""))
    again = parse_session(path, "o200k_base", cached=before.messages, tail=before.tail, corrupt_before=before.corrupt)
    full = parse_session(path, "o200k_base")
    assert [info.digest for info in again.messages] == [info.digest for info in full.messages]
    assert again.corrupt == full.corrupt
    assert sum(info.tokens for info in again.messages) == sum(info.tokens for info in full.messages)
