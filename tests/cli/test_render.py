"""nanobotd/cli/render.py: tables, fields, durations and locations from plain data."""

from __future__ import annotations

from nanobotd.cli import render


def test_format_table_aligns_columns_and_marks_missing_values() -> None:
    lines = render.format_table(["NAME", "COUNT", "OK"], [["a", 5, True], ["longer", 12345, None]])
    assert lines == ["NAME    COUNT  OK", "a           5  yes", "longer  12345  -"]
