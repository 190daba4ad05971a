"""Session windows: layout, stable keys across appends, what counts as conversation."""

from __future__ import annotations

import json

import pytest

from nanobotd.index.sessionunits import LINE_OVERHEAD, MAX_MESSAGES, session_units, window_spans
from tests.support.workspace import conversation, write_session


def windows(path, known=frozenset()):
    return list(session_units(path, "cli:t", set(known)))


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 9, 30])
def test_windows_cover_every_message_without_redundant_tails(tmp_path, count):
    path = write_session(tmp_path, "cli:t", conversation(count))
    spans = [(unit.start, unit.end) for _, unit in windows(path)]
    covered = {position for start, end in spans for position in range(start, end + 1)}
    assert covered == set(range(count))
    pairs = zip(spans, spans[1:], strict=False)
    assert all(later[0] <= earlier[1] + 1 and later[1] > earlier[1] for earlier, later in pairs)


@pytest.mark.parametrize("words,messages", [(3, range(8, MAX_MESSAGES + 1)), (20, range(4, 8)), (200, range(1, 2))])
def test_a_window_holds_about_as_many_characters_however_long_its_messages(tmp_path, words, messages):
    path = write_session(tmp_path, "cli:t", conversation(60, words=words))
    full = [unit for _, unit in windows(path)][:-1]
    assert full and all(unit.end - unit.start + 1 in messages for unit in full)


def test_after_an_append_only_the_new_windows_are_decoded(tmp_path):
    messages = conversation(41)
    path = write_session(tmp_path, "cli:t", messages)
    before = windows(path)
    write_session(tmp_path, "cli:t", messages + conversation(2, tag="n"))
    fresh = [unit for _, unit in windows(path, {key for key, _ in before}) if unit is not None]
    assert fresh and len(fresh) <= 3 and all(unit.end >= 40 for unit in fresh)
    assert fresh[-1].end == 42


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
    assert unit.dates == "d20230508 d20230509 m202305"


def test_corrupt_and_oversized_lines_keep_their_place_but_add_no_text(tmp_path):
    path = tmp_path / "s.jsonl"
    good = json.dumps({"role": "user", "content": "kept", "timestamp": "2023-05-08T13:56:00"})
    path.write_text(json.dumps({"_type": "metadata", "key": "cli:t"}) + "\n{broken\n" + good + "\n")
    (_, unit), = windows(path)
    assert (unit.start, unit.end, unit.text) == (0, 1, "user: kept")


def test_a_session_read_in_chunks_has_the_windows_of_one_read_and_an_oversized_line_keeps_its_place(tmp_path):
    messages = conversation(4000, words=12)
    path = write_session(tmp_path, "cli:t", messages)
    lines = path.read_text().splitlines()
    huge = json.dumps({"role": "user", "content": "x" * (9 << 20)})
    path.write_text("\n".join(lines[:2001] + [huge] + lines[2001:]) + "\n")
    sizes = [max(0, len(line.encode()) - LINE_OVERHEAD) for line in lines[1:]]
    sizes.insert(2000, 0)
    before = [sum(sizes[:position]) for position in range(len(sizes) + 1)]
    closed, open_from = window_spans(before, 800, 400)
    expected = closed + ([(open_from, len(sizes) - 1)] if open_from < len(sizes) and closed[-1][1] < len(sizes) - 1
                         else [])
    units = [unit for _, unit in windows(path)]
    assert [(unit.start, unit.end) for unit in units] == expected
    assert path.stat().st_size > (9 << 20) and all("xxxx" not in unit.text for unit in units)
    assert units[-1].text.endswith("says " + " ".join(f"wm3999x{word}" for word in range(12)))
