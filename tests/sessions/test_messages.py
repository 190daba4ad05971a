"""The columnar message list behaves as the list of MessageInfo it replaces."""

from __future__ import annotations

import hashlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd.sessions.messages import ROWS_BLOCK, MessageInfo, MessageList


def _hex(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


digests = st.text(min_size=1, max_size=12).map(_hex)  # what the scan makes
NOT_DIGESTS = ["", "not-a-digest", "G" * 32, _hex("x").upper(), "ab" * 20]
infos = st.builds(
    MessageInfo, line_digest=digests, digest=digests,
    role=st.sampled_from(["user", "assistant", "tool", "system", "", "rôle"]),
    timestamp=st.text(max_size=40),  # any text, lone surrogates included (JSON can carry them)
    tokens=st.integers(min_value=0, max_value=2**40), flags=st.integers(min_value=0, max_value=3))


@settings(max_examples=150, deadline=None)
@given(st.lists(infos, max_size=30), st.data())
def test_a_message_list_reads_back_what_was_put_in_it_like_a_list(items, data):
    messages = MessageList(items)
    assert len(messages) == len(items) and list(messages) == items and messages == items
    for index, info in enumerate(items):
        assert messages[index] == info and messages[index - len(items)] == info
        assert (messages.digest(index), messages.line_digest(index), messages.timestamp(index),
                messages.tokens(index), messages.flags(index)) == (
                    info.digest, info.line_digest, info.timestamp, info.tokens, info.flags)
    start = data.draw(st.integers(min_value=-5, max_value=len(items) + 5))
    stop = data.draw(st.one_of(st.none(), st.integers(min_value=-5, max_value=len(items) + 5)))
    assert list(messages[start:stop]) == items[start:stop]
    assert list(messages.digests(start, stop)) == [info.digest for info in items[start:stop]]
    assert messages.total_tokens(start, stop) == sum(info.tokens for info in items[start:stop])
    assert list(messages[::2]) == items[::2]


scanned = st.builds(
    MessageInfo, line_digest=st.text(min_size=1, max_size=12).map(_hex), digest=st.text(max_size=12).map(_hex),
    role=st.sampled_from(["user", "assistant", "tool"]), timestamp=st.text(max_size=40),
    tokens=st.integers(min_value=0, max_value=2**40), flags=st.integers(min_value=0, max_value=3))


@settings(max_examples=100, deadline=None)
@given(st.lists(scanned, max_size=30))
def test_messages_added_packed_as_a_scan_adds_them_read_back_as_added_whole(items):
    packed = MessageList()
    for info in items:
        packed.add_packed(bytes.fromhex(info.line_digest), bytes.fromhex(info.digest), info.role, info.timestamp,
                          info.tokens, info.flags)
    assert list(packed) == items and packed == MessageList(items)
    assert all(packed.has_digest(info.digest) for info in items)
    assert list(packed.rows(0)) == [(info.line_digest, info.digest, info.role, info.timestamp, info.tokens, info.flags)
                                    for info in items]


@settings(max_examples=100, deadline=None)
@given(st.lists(infos, max_size=20), st.lists(infos, max_size=10))
def test_a_copy_changes_apart_from_its_original(items, more):
    messages = MessageList(items)
    copy = MessageList.of(messages)
    for info in more:
        copy.append(info)
    assert list(copy) == items + more
    assert list(messages) == items  # the original is untouched
    tail = messages[len(items) // 2:]
    tail.append(more[0] if more else MessageInfo(_hex("a"), _hex("b"), "user", "t", 1, 0))
    assert list(messages) == items


@settings(max_examples=150, deadline=None)
@given(st.lists(infos, max_size=30), st.lists(st.one_of(digests, st.sampled_from(NOT_DIGESTS)), max_size=5))
def test_has_digest_answers_as_a_set_of_the_digests_would(items, others):
    messages = MessageList(items)
    present = {info.digest for info in items}
    for digest in [info.digest for info in items] + [info.line_digest for info in items] + others + ["0" * 32]:
        assert messages.has_digest(digest) == (digest in present)


@settings(max_examples=150, deadline=None)
@given(st.lists(infos, max_size=30), st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=35))
def test_the_message_cache_blocks_read_back_the_list_they_were_made_of(items, size, start):
    messages = MessageList(items)
    rows = list(messages.blocks(0, size))
    assert [first for first, *_ in rows] == list(range(0, len(items), size))
    assert list(MessageList.from_blocks(row[1:] for row in rows)) == items
    again = list(messages.blocks(start, size))  # what a scan rewrites: the blocks from the one holding *start*
    assert again == [row for row in rows if row[0] + size > start]


def test_rows_and_digests_across_blocks_read_back_every_field():
    count = 2 * ROWS_BLOCK + 5
    items = [MessageInfo(_hex(f"l{n}"), _hex(f"d{n}"),
                         "user" if n % 3 else "tool",
                         f"2026-11-26T05:00:{n % 60:02d}" + ("é\ud800" if n % 4099 == 7 else ""), n, n % 4)
             for n in range(count)]
    messages = MessageList(items)
    assert list(messages) == items
    assert list(messages.line_digests()) == [info.line_digest for info in items]
    for start in (0, 1, ROWS_BLOCK - 1, ROWS_BLOCK, ROWS_BLOCK + 7, count - 1, count, count + 3):
        assert [MessageInfo(*row) for row in messages.rows(start)] == items[start:]
        assert list(messages.digests(start, start + ROWS_BLOCK + 2)) == \
            [info.digest for info in items[start:start + ROWS_BLOCK + 2]]


def test_a_string_that_is_no_digest_is_refused_not_stored():
    for text in NOT_DIGESTS:
        for info in (MessageInfo(text, _hex("d"), "user", "t", 1, 0), MessageInfo(_hex("l"), text, "user", "t", 1, 0)):
            with pytest.raises(ValueError):
                MessageList([info])


def test_past_the_end_is_an_index_error_as_in_a_list():
    messages = MessageList([MessageInfo(_hex("l"), _hex("d"), "user", "2026-11-26T05:00:00", 12, 0)])
    for index in (1, -2):
        try:
            messages[index]
        except IndexError:
            continue
        raise AssertionError(f"messages[{index}] did not raise IndexError")


def test_a_long_session_costs_a_fraction_of_its_message_infos():
    """~80 bytes a message in columns, against ~340 as MessageInfo objects (their strings included)."""
    items = [MessageInfo(_hex(f"line {n}"), _hex(f"message {n}"), sys.intern("user"),
                         f"2026-11-26T05:{n % 60:02d}:00.{n:06d}", 300 + n % 1000, 0) for n in range(10_000)]
    as_objects = sum(sys.getsizeof(info) + sys.getsizeof(info.line_digest) + sys.getsizeof(info.digest)
                     + sys.getsizeof(info.timestamp) + sys.getsizeof(info.tokens) + 8 for info in items)
    messages = MessageList(items)
    in_columns = sum(sys.getsizeof(column) for column in (
        messages._line_digests, messages._digests, messages._roles, messages._stamps, messages._stamp_ends,
        messages._tokens, messages._flags))
    assert in_columns * 4 < as_objects
    assert list(messages) == items
