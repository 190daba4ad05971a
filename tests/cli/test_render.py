"""nanobotd/cli/render.py: tables, fields, durations and locations from plain data."""

from __future__ import annotations

import pytest

from nanobotd.cli import render


def test_format_table_aligns_columns_and_marks_missing_values() -> None:
    lines = render.format_table(["NAME", "COUNT", "OK"], [["a", 5, True], ["longer", 12345, None]])
    assert lines == ["NAME    COUNT  OK", "a           5  yes", "longer  12345  -"]


def test_format_rows_picks_columns_by_key_or_says_there_is_nothing() -> None:
    items = [{"key": "a", "count": 1, "ignored": "x"}, {"key": "bb"}]
    assert render.format_rows([("KEY", "key"), ("COUNT", "count")], items, "none") == [
        "KEY  COUNT", "a        1", "bb       -"]
    assert render.format_rows([("KEY", "key")], [], "no sessions tracked") == ["no sessions tracked"]


def test_format_duration_uses_the_largest_units_and_passes_other_values_through() -> None:
    assert render.format_duration(3725) == "1h 2m 5s"
    assert render.format_duration(90061.5) == "1d 1h 1m 1s"
    assert render.format_duration(0) == "0s"
    assert render.format_duration(None) == "-"


def test_format_location_names_a_file_span_or_a_session_span() -> None:
    assert render.format_location({"path": "memory/MEMORY.md", "line_start": 3, "line_end": 3}) == "memory/MEMORY.md:L3"
    assert render.format_location({"path": "USER.md"}) == "USER.md"
    session_hit = {"session_key": "cli:x", "message_start": 2, "message_end": 5}
    assert render.format_location(session_hit) == "session cli:x #2-5"
    assert render.format_location({}) == "?"


@pytest.mark.parametrize("hostile, shown", [
    ("telegram:\x1b[2J\x1b[31mred", "telegram:\\x1b[2J\\x1b[31mred"),
    ("bell\x07and\x9bcsi", "bell\\x07and\\x9bcsi"),
    ("evil\u202egnp.exe", "evil\\u202egnp.exe"),
])
def test_control_characters_in_keys_and_names_are_escaped_not_sent_to_the_terminal(hostile, shown):
    lines = render.format_rows([("KEY", "key")], [{"key": hostile}], "none")
    assert lines[1] == shown
    assert render.format_fields({hostile: hostile}) == [f"{shown}: {shown}"]
    assert render.format_location({"session_key": hostile}) == f"session {shown}"
    assert render.format_location({"path": f"memory/{hostile}.md"}) == f"memory/{shown}.md"
    assert not any(render.CONTROL_CHARS.search(line) for line in lines)


def test_plain_text_and_unicode_letters_are_printed_as_they_are():
    assert render.format_cell("café 東京 ✓") == "café 東京 ✓"
