"""Markdown sections and history entries as index units, with exact line ranges and stable keys."""

from __future__ import annotations

import json

from nanobotd.index.units import MAX_UNIT_CHARS, history_units, markdown_units


def test_each_section_is_a_unit_with_its_line_range():
    text = "# Memory\n\n## Pets\n- Luna the cat\n\n## Work\n- kestrel\n- debian\n\n"
    units = markdown_units(text, "memory")
    assert [(unit.start, unit.end, unit.text) for unit in units] == [
        (3, 4, "## Pets\n- Luna the cat"), (6, 8, "## Work\n- kestrel\n- debian")]


def test_a_preamble_with_content_is_a_unit_but_a_bare_title_is_not():
    assert markdown_units("# Title\n\nsome intro\n", "memory")[0].text == "# Title\n\nsome intro"
    assert markdown_units("# Title\n\n## Empty\n\n", "memory") == []


def test_headings_inside_code_fences_and_subsections_do_not_split():
    text = "## Code\n```\n## not a heading\n```\n### Sub\n- item\n"
    units = markdown_units(text, "memory")
    assert len(units) == 1 and (units[0].start, units[0].end) == (1, 6)


def test_appending_a_section_keeps_the_keys_of_the_others():
    before = markdown_units("## A\n- one\n", "memory")
    after = markdown_units("## A\n- one\n\n## B\n- two\n", "memory")
    assert before[0].key == after[0].key and len(after) == 2


def test_a_long_section_is_cut_on_line_boundaries_and_keeps_its_heading():
    lines = [f"- fact number {n} " + "x" * 60 for n in range(100)]
    units = markdown_units("## Facts\n" + "\n".join(lines) + "\n", "memory")
    assert len(units) > 3 and all(len(unit.text) <= MAX_UNIT_CHARS + 20 for unit in units)
    assert all(unit.text.startswith("## Facts\n") for unit in units)
    assert units[0].start == 1 and units[-1].end == 101
    assert all(later.start == earlier.end + 1 for earlier, later in zip(units, units[1:], strict=False))


def test_a_huge_single_line_becomes_many_units_pointing_at_that_line():
    units = markdown_units("## Blob\n" + "y" * 50_000 + "\n", "memory")
    assert len(units) > 30 and all(unit.start <= 2 <= unit.end for unit in units)
    assert len({unit.key for unit in units}) == len(units)


def test_history_entries_are_units_and_known_ones_are_not_parsed_again(tmp_path):
    path = tmp_path / "history.jsonl"
    entries = [{"cursor": 1, "timestamp": "2026-04-03 00:02", "content": "- [durable] tabs over spaces"},
               {"cursor": 2, "timestamp": "bad", "content": "second", "session_key": "cli:x"}]
    path.write_text(json.dumps(entries[0]) + "\nnot json\n" + json.dumps(entries[1]) + "\n")

    first = list(history_units(path, set()))

    assert [(unit.start, unit.when, unit.session_key) for _, unit in first] == [
        (1, "2026-04-03T00:02:00", None), (3, "bad", "cli:x")]
    assert first[0][1].dates == "d20260403 m202604"
    again = list(history_units(path, {key for key, _ in first}))
    assert [unit for _, unit in again] == [None, None]


def test_a_long_history_entry_is_cut_into_several_units(tmp_path):
    path = tmp_path / "history.jsonl"
    content = "[RAW] 300 messages\n" + "\n".join(f"[2026-04-03T00:02] USER: line {n} " + "z" * 80 for n in range(300))
    path.write_text(json.dumps({"cursor": 7, "timestamp": "2026-04-03 00:02", "content": content}) + "\n")
    units = [unit for _, unit in history_units(path, set())]
    assert len(units) > 10 and all(unit.start == unit.end == 1 for unit in units)


def test_the_first_entry_of_a_history_saved_with_a_byte_order_mark_is_a_unit(tmp_path):
    """An editor that saves UTF-8 with a BOM (Notepad) puts it before the first entry; the history still counts that
    entry, so search and the agent's context must find it too."""
    from nanobotd.index.agent_context import entries_newest_first

    path = tmp_path / "history.jsonl"
    entries = [{"cursor": 1, "timestamp": "2026-04-03 00:02", "content": "- [durable] the backup host is osprey"},
               {"cursor": 2, "timestamp": "2026-04-03 00:05", "content": "second"}]
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(entry) + "\r\n" for entry in entries).encode())

    units = [unit for _, unit in history_units(path, set())]

    assert [(unit.start, unit.text) for unit in units] == [(1, entries[0]["content"]), (2, "second")]
    assert [entry.cursor for entry in entries_newest_first(path, 0)] == [2, 1]
