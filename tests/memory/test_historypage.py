"""nanobotd/memory/historypage.py: reading history.jsonl backwards, a block at a time."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nanobotd.memory.historypage import lines_from_end

LINE = st.binary(min_size=0, max_size=12).map(lambda data: data.replace(b"\n", b"x"))


@given(lines=st.lists(LINE, max_size=30), block=st.integers(min_value=1, max_value=40), newline=st.booleans())
def test_lines_from_end_are_the_files_lines_reversed_whatever_the_block_size(tmp_path_factory, lines, block,
                                                                              newline) -> None:
    path = tmp_path_factory.mktemp("h") / "history.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if newline else b""))
    wanted = [line for line in reversed(path.read_bytes().split(b"\n")) if line.strip()]
    assert list(lines_from_end(path, block)) == wanted


def test_a_missing_file_has_no_lines(tmp_path: Path) -> None:
    assert list(lines_from_end(tmp_path / "history.jsonl")) == []
