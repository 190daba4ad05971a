"""nanobotd/sessions/file.py: reading session lines from any bytes at all, and only from regular files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd import fsio
from nanobotd.sessions import file as sessionfile

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10)
RECORDS = st.one_of(
    st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant", "tool"]), JSON_VALUES)},
                          optional={"content": JSON_VALUES, "timestamp": JSON_VALUES, "tool_calls": JSON_VALUES,
                                    "_command": JSON_VALUES, "_hidden_history": JSON_VALUES}),
    st.fixed_dictionaries({"_type": st.just("metadata")},
                          optional={"key": JSON_VALUES, "last_archived": JSON_VALUES,
                                    "last_consolidated": JSON_VALUES}),
    JSON_VALUES,
)
LINES = st.one_of(RECORDS.map(lambda record: json.dumps(record).encode()), st.binary(max_size=60),
                  st.just(b"[" * 5000 + b"]" * 5000), st.just(b'{"role": "user", "content": "cut'))


def write(content: bytes) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="nbf-"))
    path = folder / "c2Vzc2lvbg.jsonl"
    path.write_bytes(content)
    return path


@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=400), limit=st.integers(min_value=1, max_value=64))
def test_lines_of_any_bytes_are_the_non_blank_lines_or_say_they_were_too_long(content, limit):
    lines = list(sessionfile.iter_raw_lines(write(content), max_line_bytes=limit))
    expected = [piece for piece in content.split(b"\n")]
    kept = [line.data for line in lines if line.data is not None]
    assert kept == [piece.strip() for piece in expected if piece.strip() and len(piece) <= limit]
    for line in lines:
        if line.data is None:
            assert line.oversized > limit
    assert all(line.end <= len(content) for line in lines)


def expected_lines(content: bytes, limit: int) -> list[tuple]:
    """(number, data or None, oversized, start, end, terminated) of each non-blank line, from a plain split."""
    found, start = [], 0
    pieces = content.split(b"\n")
    for number, piece in enumerate(pieces, start=1):
        terminated = number < len(pieces)
        end = start + len(piece) + terminated
        if len(piece) > limit:
            found.append((number, None, len(piece), start, end, terminated))
        elif piece.strip():
            found.append((number, piece.strip(), 0, start, end, terminated))
        start = end
    return found


@settings(max_examples=300, deadline=None)
@given(content=st.lists(st.sampled_from([b"\n", b" ", b"{", b"x", b"\xff", b"ab\ncd", b"  \n"]), max_size=80)
       .map(b"".join), limit=st.integers(min_value=1, max_value=40), chunk=st.integers(min_value=1, max_value=17))
def test_lines_that_cross_read_chunks_are_read_as_lines_inside_one_are(content, limit, chunk):
    """A line inside one read chunk is sliced from it, one across chunks gathered: both give the same line,
    offsets and numbering as a plain split, over or under the size cap, the last one unterminated."""
    lines = list(sessionfile.iter_raw_lines(write(content), max_line_bytes=limit, chunk_bytes=chunk))
    assert [(line.number, line.data, line.oversized, line.start, line.end, line.terminated) for line in lines] == \
        expected_lines(content, limit)
    assert all(line.line_digest == sessionfile.line_digest(line.data) for line in lines if line.data is not None)


def decoded_as_json_loads_would(data: bytes) -> dict | None:
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


@settings(max_examples=300, deadline=None)
@given(record=RECORDS, encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32-le"]),
       junk=st.binary(max_size=6))
def test_a_line_decodes_exactly_as_json_loads_decodes_its_bytes_whatever_their_encoding(record, encoding, junk):
    text = json.dumps(record, ensure_ascii=False)
    for data in (text.encode(encoding, "surrogatepass"), text.encode("utf-8", "surrogatepass") + junk,
                 b"{" + junk, junk):
        line = sessionfile.RawLine(1, data, "")
        assert sessionfile.decode_record(line) == decoded_as_json_loads_would(data)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(LINES, max_size=12))
def test_any_line_decodes_to_a_record_or_none_and_a_header_stays_sane(lines):
    header = sessionfile.SessionHeader()
    for raw in sessionfile.iter_raw_lines(write(b"\n".join(lines))):
        record = sessionfile.decode_record(raw)
        if record is None:
            continue
        assert isinstance(record, dict)
        if record.get("_type") == "metadata":
            sessionfile.read_header(record, header)
        fields = sessionfile.message_fields(record)
        if fields is not None:
            role, text, timestamp = fields
            assert isinstance(text, str) and isinstance(timestamp, str)
            assert len(sessionfile.message_digest(role, text, timestamp)) == 32
    assert isinstance(header.last_archived, int) and header.last_archived >= 0


def test_a_fifo_and_a_link_to_dev_zero_are_refused_before_any_read(tmp_path):
    fifo = tmp_path / "Zmlmbw.jsonl"
    os.mkfifo(fifo)
    link = tmp_path / "emVybw.jsonl"
    link.symlink_to("/dev/zero")
    for path in (fifo, link):
        with pytest.raises(fsio.NotRegularFile):
            list(sessionfile.iter_raw_lines(path))


def test_a_line_over_the_cap_is_reported_with_its_size_and_the_next_line_still_read(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"x" * 100 + b"\n" + b'{"role": "user"}\n')
    lines = list(sessionfile.iter_raw_lines(path, max_line_bytes=50))
    assert lines[0].data is None and lines[0].oversized == 100
    assert lines[1].data == b'{"role": "user"}'


@settings(max_examples=300, deadline=None)
@given(role=st.text(max_size=12), text=st.text(max_size=200), timestamp=st.text(max_size=30))
def test_a_message_digest_is_the_digest_of_its_fields_as_json_text_whatever_they_hold(role, text, timestamp):
    """Digests are stored (archive marks, spool): the same fields must keep giving the same digest."""
    import hashlib

    payload = json.dumps([role, text, timestamp], ensure_ascii=False).encode("utf-8", errors="replace")
    assert sessionfile.message_digest(role, text, timestamp) == hashlib.blake2b(payload, digest_size=16).hexdigest()
    lone = "\ud800" + text  # a lone surrogate, as a broken client may write
    payload = json.dumps([role, lone, timestamp], ensure_ascii=False).encode("utf-8", errors="replace")
    assert sessionfile.message_digest(role, lone, timestamp) == hashlib.blake2b(payload, digest_size=16).hexdigest()


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(JSON_VALUES, min_size=1, max_size=4), text=st.text(max_size=20))
def test_a_message_with_tool_calls_counts_them_as_json_dumps_writes_them(calls, text):
    record = {"role": "assistant", "content": text, "tool_calls": calls}
    assert sessionfile.message_text_for_tokens(record, text) == text + "\n" + json.dumps(calls, ensure_ascii=False)
