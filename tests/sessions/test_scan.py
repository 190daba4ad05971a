"""Incremental parsing: the fast path reads only what follows the known bytes, and falls back safely."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd import tokens
from nanobotd.sessions import file as sessionfile
from nanobotd.sessions.scan import LINE_KNOWN, LINE_NEW, SEARCHED_LOOKUPS, parse_session, read_line
from tests.sessions.test_file import LINES, RECORDS
from tests.support.workspace import conversation, make_workspace, write_session


def records(parsed, *kinds: int) -> dict:
    """The lines of a parse's counted messages of *kinds* (new in it, or reused), by digest."""
    lines, messages = parsed.lines, parsed.messages
    return {messages.digest(index): lines.ref(index, messages.line_digest(index))
            for index in range(lines.first, lines.first + len(lines.kinds)) if lines.kind(index) in kinds}


def full_then_append(tmp_path, first, second):
    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:a", first)
    before = parse_session(path)
    write_session(sessions, "cli:a", second)
    after = parse_session(path, cached=before.messages, tail=before.tail,
                          corrupt_before=before.corrupt)
    return before, after, parse_session(path)


def test_an_appended_message_takes_the_fast_path_and_matches_a_full_parse(tmp_path):
    messages = conversation(50)
    before, after, full = full_then_append(tmp_path, messages, messages + conversation(1, tag="z"))
    assert after.fast and len(records(after, LINE_NEW)) == 1
    assert after.messages == full.messages and after.tail == full.tail


def test_each_new_counted_message_points_at_its_own_line_and_reused_ones_do_not(tmp_path):
    command = {"role": "user", "content": "/status", "timestamp": "2026-11-01T09:00:30", "_command": True}
    messages = conversation(5)
    appended = [command] + messages + conversation(2, tag="z")
    before, after, full = full_then_append(tmp_path, [command] + messages, appended)
    path = tmp_path / "workspace" / "sessions" / sessionfile.filename_for_key("cli:a")
    lines = path.read_bytes().splitlines()[1:]  # after the metadata line
    with path.open("rb") as handle:
        for parsed in (before, full):
            assert parsed.new_line(0) is None  # a slash command is never spooled
            assert [read_line(handle, parsed.new_line(index)) for index in range(1, len(parsed.messages))] == \
                lines[1:len(parsed.messages)]
        assert full.new_count == len(full.messages) - 1 == len(records(full, LINE_NEW))
        # the fast path: only the two appended lines are new, the known ones are not looked at again
        assert after.fast and [after.new_line(index) is not None for index in range(8)] == [False] * 6 + [True] * 2
        assert [read_line(handle, after.new_line(index)) for index in (6, 7)] == lines[6:8]
    # a full parse reusing the earlier parse knows where the reused lines are, apart from the new ones
    reparsed = parse_session(path, cached=after.messages)
    assert set(records(reparsed, LINE_KNOWN)) | set(records(reparsed, LINE_NEW)) == set(records(full, LINE_NEW))
    assert not records(reparsed, LINE_NEW) and len(records(reparsed, LINE_NEW, LINE_KNOWN)) == 7


@pytest.mark.parametrize("numbers", [[], [0], [1, 2, 3], [0, 5, 6, 4099, 4100, 5000, 5001], list(range(5002))])
def test_spool_rows_give_each_asked_message_its_fields_and_line_as_one_message_at_a_time_does(tmp_path, numbers):
    """The rows a scan spools are read a block of columns at a time (past a block's end too, with gaps): the
    same digest, role, timestamp, tokens and line as reading each message and its new_line, in order."""
    command = {"role": "user", "content": "/status", "timestamp": "2026-11-01T09:00:30", "_command": True}
    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:a", [command] + conversation(5001, tag="b"))
    parsed = parse_session(path)
    expected = [(parsed.messages[index].digest, parsed.messages[index].role, parsed.messages[index].timestamp,
                 parsed.messages[index].tokens, parsed.new_line(index)) for index in numbers]
    assert list(parsed.spool_rows(numbers)) == expected
    if numbers[:1] == [0]:
        assert expected[0][4] is None  # the slash command has no line to spool
    assert all(row[4] is not None for row in expected[1:])


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


@pytest.mark.parametrize("new", [3, SEARCHED_LOOKUPS + 40])
def test_a_duplicate_after_many_new_messages_is_still_found(tmp_path, new):
    """Known digests are searched in their column up to SEARCHED_LOOKUPS lookups, then put in a set: a copy
    of an earlier message is noticed either way."""
    messages = conversation(30)
    fresh = conversation(new, tag="n")
    before, after, full = full_then_append(tmp_path, messages, messages + fresh + [messages[7]])
    assert not after.fast
    assert len({info.digest for info in after.messages}) == 30 + new + 1 and after.messages == full.messages
    before, after, full = full_then_append(tmp_path / "unique", messages, messages + fresh)
    assert after.fast and after.messages == full.messages


def test_a_file_without_a_final_newline_has_no_fast_path_state(tmp_path):
    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:a", conversation(3))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert parse_session(path).tail is None


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
    before = parse_session(path)
    assert isinstance(before.key, str) and before.header.last_archived >= 0
    physical_lines = b"\n".join(first).count(b"\n") + 1 if first else 0  # a generated line may hold a LF
    assert len(before.messages) + before.corrupt <= physical_lines
    with open(path, "ab") as handle:
        handle.write(b"\n".join(more) + (b"\n" if more else b""))
    again = parse_session(path, cached=before.messages, tail=before.tail, corrupt_before=before.corrupt)
    full = parse_session(path)
    assert [info.digest for info in again.messages] == [info.digest for info in full.messages]
    assert again.corrupt == full.corrupt
    assert sum(info.tokens for info in again.messages) == sum(info.tokens for info in full.messages)


def mixed_corpus(count: int) -> list[dict]:
    """Messages of every kind a scan meets: plain, empty, tool calls, special-token text, non-ASCII, commands and
    hidden summaries (which count none)."""
    messages = conversation(count, words=30)
    for index, message in enumerate(messages):
        if index % 97 == 5:
            message.update(content="/new", _command=True)
        elif index % 89 == 11:
            message.update(content="summary of what came before", _hidden_history=True)
        elif index % 50 == 3:
            message["content"] = ""
        elif index % 40 == 7:
            message["tool_calls"] = [{"id": f"c{index}", "type": "function",
                                      "function": {"name": "read_file", "arguments": '{"path": "USER.md"}'}}]
        elif index % 30 == 1:
            message["content"] += " <|endoftext|> ünïcödé 日本語 🙂"
    return messages


def estimates(messages: list[dict]) -> list[int]:
    """Each message's estimate, one text at a time: commands and hidden summaries count none."""
    counts = []
    for record in messages:
        _, text, _ = sessionfile.message_fields(record)
        hidden = record.get("_command") or record.get("_hidden_history")
        counts.append(0 if hidden else tokens.estimate_tokens(sessionfile.message_text_for_tokens(record, text)))
    return counts


@settings(max_examples=300, deadline=None)
@given(records=st.lists(RECORDS, max_size=6), ascii_only=st.booleans())
def test_a_scan_digests_each_message_as_message_digest_does_from_its_decoded_fields(records, ascii_only):
    """Digests are stored: a line read without escaping its fields again (no backslash in it) digests the same."""
    lines = [json.dumps(record, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass") for record in records]
    folder = Path(tempfile.mkdtemp(prefix="nbd-"))
    path = folder / "c2Vzc2lvbg.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    expected = []
    for line in lines:
        record = sessionfile.decode_record(sessionfile.RawLine(0, line, ""))
        fields = sessionfile.message_fields(record) if record is not None else None
        if fields is not None:
            expected.append(sessionfile.message_digest(*fields))
    digests = [info.digest for info in parse_session(path).messages]
    assert set(expected) <= set(digests)  # a copy of a message gets a numbered variant beside it
    assert digests == expected or len(set(expected)) < len(expected)


def test_each_message_gets_its_size_estimate_fully_and_incrementally_and_no_encoding_is_loaded(tmp_path):
    tokens.get_encoding.cache_clear()
    messages = mixed_corpus(700)
    expected = estimates(messages)
    assert 0 in expected and all(count >= 0 for count in expected)
    _, sessions = make_workspace(tmp_path)
    path = write_session(sessions, "cli:a", messages[:400])
    before = parse_session(path)
    assert [info.tokens for info in before.messages] == expected[:400]
    write_session(sessions, "cli:a", messages)
    after = parse_session(path, cached=before.messages, tail=before.tail)
    full = parse_session(path)
    assert after.fast and after.messages == full.messages
    assert [info.tokens for info in full.messages] == expected
    assert [info.timestamp for info in full.messages] == [message["timestamp"] for message in messages]
    assert [info.counts for info in full.messages] == [
        not (message.get("_command") or message.get("_hidden_history")) for message in messages]
    assert not tokens.encodings_loaded(), "a scan counts no token exactly"
