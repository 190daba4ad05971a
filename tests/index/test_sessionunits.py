"""Session windows: layout, stable keys across appends, what counts as conversation."""

from __future__ import annotations

import json

import pytest

from nanobotd.index.sessionunits import session_units, tail_starts
from tests.support.workspace import conversation, write_session


def windows(path, known=frozenset(), window=4, stride=2):
    return list(session_units(path, "cli:t", set(known), window=window, stride=stride))


@pytest.mark.parametrize("count,expected", [
    (0, []), (1, [(0, 0)]), (3, [(0, 2)]), (4, [(0, 3)]), (5, [(0, 3), (2, 4)]),
    (6, [(0, 3), (2, 5)]), (7, [(0, 3), (2, 5), (4, 6)]),
])
def test_windows_cover_every_message_without_redundant_tails(tmp_path, count, expected):
    path = write_session(tmp_path, "cli:t", conversation(count))
    assert [(unit.start, unit.end) for _, unit in windows(path)] == expected


def test_tail_starts_match_the_full_layout():
    assert tail_starts(7, 4, 2) == [4] and tail_starts(6, 4, 2) == [] and tail_starts(2, 4, 2) == [0]


def test_after_an_append_only_the_new_windows_are_decoded(tmp_path):
    messages = conversation(41)
    path = write_session(tmp_path, "cli:t", messages)
    known = {key for key, _ in windows(path)}
    write_session(tmp_path, "cli:t", messages + conversation(2, tag="n"))
    fresh = [unit for _, unit in windows(path, known) if unit is not None]
    assert [(unit.start, unit.end) for unit in fresh] == [(38, 41), (40, 42)]


def test_window_text_labels_messages_and_records_parts(tmp_path):
    messages = [
        {"role": "user", "name": "Caroline", "content": "hi", "timestamp": "2023-05-08T13:56:00"},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}, {"type": "image_url"}],
         "timestamp": "2023-05-08T13:56:30"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}], "timestamp": "2023-05-08T13:57:00"},
        {"role": "user", "content": "late", "timestamp": "2023-05-09T00:01:00.123456"},
    ]
    path = write_session(tmp_path, "cli:t", messages)
    (_, unit), = windows(path)
    assert unit.text == "Caroline: hi\nassistant: hello\n[image]\nuser: late"
    assert unit.parts == ((0, 0, "2023-05-08T13:56:00"), (1, 13, "2023-05-08T13:56:30"), (3, 38, "2023-05-09T00:01:00"))
    assert unit.when == "2023-05-08T13:56:00"
    assert unit.dates == "Monday 8 May 2023 d20230508 Tuesday 9 May 2023 d20230509 m202305"


def test_corrupt_and_oversized_lines_keep_their_place_but_add_no_text(tmp_path):
    path = tmp_path / "s.jsonl"
    good = json.dumps({"role": "user", "content": "kept", "timestamp": "2023-05-08T13:56:00"})
    path.write_text(json.dumps({"_type": "metadata", "key": "cli:t"}) + "\n{broken\n" + good + "\n")
    (_, unit), = windows(path)
    assert (unit.start, unit.end, unit.text) == (0, 1, "user: kept")
