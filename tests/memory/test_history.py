"""history.jsonl appends: cursors unique and increasing, even with a second process appending."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd import fsio
from nanobotd.memory import history
from tests.support.histories import read_history

NOW = datetime(2026, 11, 22, 10, 0)
APPENDER = """
import sys
from datetime import datetime
from pathlib import Path
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd import fsio
from nanobotd.memory import history
memory = Path(sys.argv[1])
for index in range(int(sys.argv[2])):
    history.append_entries(memory, [(f"{sys.argv[3]} entry {index}", "cli:x")], datetime(2026, 11, 22))
"""


def test_next_cursor_is_max_of_cursor_file_and_file_plus_one(tmp_path):
    (tmp_path / "history.jsonl").write_text(json.dumps({"cursor": 7, "timestamp": "t", "content": "a"}) + "\n")
    (tmp_path / ".cursor").write_text("9")
    written = history.append_entries(tmp_path, [("b", None)], NOW)
    assert written[0].cursor == 10
    assert (tmp_path / ".cursor").read_text() == "10"


def test_two_processes_appending_at_once_never_duplicate_or_lose_a_cursor(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), "150", name])
             for name in ("alpha", "beta")]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    scan = read_history(tmp_path)
    cursors = [entry.cursor for entry in scan.entries]
    assert scan.bad_lines == []
    assert cursors == list(range(1, 301))
    assert (tmp_path / ".cursor").read_text() == "300"


def test_a_torn_last_line_gets_its_own_line_and_is_never_reused(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps({"cursor": 1, "timestamp": "t", "content": "a"}) + '\n{"cursor": 2, "timest')
    history.append_entries(tmp_path, [("b", None)], NOW)
    scan = read_history(tmp_path)
    assert [entry.cursor for entry in scan.entries] == [1, 2]
    assert scan.bad_lines == [2]


def test_reasoning_blocks_are_stripped_and_entries_capped(tmp_path):
    written = history.append_entries(tmp_path, [("<think>hidden</think>visible" + "x" * 70000, None)], NOW)
    assert written[0].content.startswith("visible") and len(written[0].content) == history.ENTRY_HARD_CAP


def test_rewrite_keeps_unparsable_lines_and_never_lowers_the_cursor(tmp_path):
    history.append_entries(tmp_path, [("a", None), ("b", None), ("c", None)], NOW)
    with open(tmp_path / "history.jsonl", "a") as handle:
        handle.write("garbage\n")
    removed = [entry for entry in history.iter_entries(tmp_path) if entry.cursor == 3]
    assert history.remove_entries(tmp_path, lambda entry: entry.cursor != 3) == 1
    assert [entry.cursor for entry in history.iter_entries(tmp_path)] == [1, 2]
    assert "garbage" in (tmp_path / "history.jsonl").read_text()
    assert history.append_entries(tmp_path, [("d", None)], NOW)[0].cursor == 4
    assert history.insert_entries(tmp_path, removed) == 1
    assert [entry.cursor for entry in read_history(tmp_path).entries] == [1, 2, 3, 4]


@pytest.mark.parametrize("linked", ["history.jsonl", ".cursor", ".history.lock"])
def test_an_append_through_a_file_symlinked_outside_the_workspace_writes_nothing(tmp_path, linked):
    memory = tmp_path / "workspace" / "memory"
    memory.mkdir(parents=True)
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("7")
    (memory / linked).symlink_to(outside)
    with pytest.raises(fsio.UnsafePath):
        history.append_entries(memory, [("must not escape", "cli:a")], NOW)
    assert outside.read_text() == "7"
    assert (memory / linked).is_symlink()
    assert not (memory / "history.jsonl").exists() or linked == "history.jsonl"


def test_an_append_into_a_memory_folder_symlinked_outside_writes_nothing(tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (workspace / "memory").symlink_to(outside, target_is_directory=True)
    with pytest.raises(fsio.UnsafePath):
        history.append_entries(workspace / "memory", [("must not escape", None)], NOW)
    assert list(outside.iterdir()) == []


def test_an_append_that_meets_a_full_disk_leaves_history_as_it_was(tiny_tmpfs):
    memory = tiny_tmpfs / "memory"
    history.append_entries(memory, [("first entry", "cli:a")], NOW)
    before = (memory / "history.jsonl").read_bytes()
    with pytest.raises(OSError) as caught:
        history.append_entries(memory, [("x" * 40_000, "cli:a"), ("y" * 40_000, "cli:a")], NOW)
    assert caught.value.errno == errno.ENOSPC
    assert (memory / "history.jsonl").read_bytes() == before
    assert read_history(memory).bad_lines == []
    assert history.append_entries(memory, [("after the disk filled", None)], NOW)[0].cursor > 1


def test_a_torn_last_line_is_moved_aside_and_the_next_append_is_clean(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps({"cursor": 1, "timestamp": "t", "content": "a"}) + '\n{"cursor": 2, "timest')
    assert history.repair_torn_line(tmp_path) == len('{"cursor": 2, "timest')
    assert (tmp_path / "history.jsonl.torn").read_text() == '{"cursor": 2, "timest\n'
    history.append_entries(tmp_path, [("b", None)], NOW)
    scan = read_history(tmp_path)
    assert [entry.cursor for entry in scan.entries] == [1, 2] and scan.bad_lines == []


HISTORY_LINES = st.one_of(
    st.fixed_dictionaries({"cursor": st.one_of(st.integers(-5, 10**20), st.floats(), st.text(max_size=3),
                                               st.booleans(), st.none()),
                           "content": st.one_of(st.text(max_size=30), st.integers(), st.none())},
                          optional={"timestamp": st.one_of(st.text(max_size=16), st.integers()),
                                    "session_key": st.one_of(st.text(max_size=8), st.lists(st.integers())),
                                    history.SPAN_FIELD: st.one_of(st.dictionaries(st.text(max_size=3), st.integers(),
                                                                                  max_size=2), st.text(max_size=3))})
    .map(lambda record: json.dumps(record).encode()),
    st.binary(max_size=40), st.just(b"[" * 3000), st.just(b'{"cursor": 3, "content": "cut'),
)


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(HISTORY_LINES, max_size=10), terminated=st.booleans())
def test_any_history_file_reads_as_entries_and_bad_lines_and_a_torn_tail_repairs(lines, terminated):
    memory = Path(tempfile.mkdtemp(prefix="nbh-")) / "memory"
    memory.mkdir()
    content = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
    (memory / "history.jsonl").write_bytes(content)
    scan = read_history(memory)
    non_blank = [line for line in content.split(b"\n") if line.strip()]  # LF only, as the reader splits
    assert len(scan.entries) + len(scan.bad_lines) == len(non_blank)
    assert all(entry.cursor >= 1 and isinstance(entry.content, str) for entry in scan.entries)
    largest = history.largest_cursor_in_file(memory / "history.jsonl")
    assert largest >= 0
    history.repair_torn_line(memory)
    repaired = (memory / "history.jsonl").read_bytes()
    assert repaired == b"" or repaired.endswith(b"\n")
    torn = memory / "history.jsonl.torn"
    assert len(repaired) + (len(torn.read_bytes()) - 1 if torn.exists() else 0) >= len(content)
    written = history.append_entries(memory, [("after", None)], NOW)
    assert written[0].cursor > max([largest] + [entry.cursor for entry in scan.entries])


def test_insert_merges_entries_before_the_first_larger_cursor_and_keeps_unreadable_lines_in_place(tmp_path):
    history.append_entries(tmp_path, [(text, None) for text in "abcdef"], NOW)
    removed = [entry for entry in history.iter_entries(tmp_path) if entry.cursor in (1, 3, 6)]
    history.remove_entries(tmp_path, lambda entry: entry.cursor not in (1, 3, 6))
    with open(tmp_path / "history.jsonl", "ab") as handle:
        handle.write(b"garbage after 5\n")
    lines = (tmp_path / "history.jsonl").read_bytes().splitlines()
    lines.insert(1, b"garbage after 2")
    (tmp_path / "history.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    assert history.insert_entries(tmp_path, removed + removed[:1]) == 4  # the duplicate of 1 goes in too
    after = [(number, entry.cursor if entry else None) for number, entry in history.iter_history(tmp_path)]
    assert after == [(1, 1), (2, 1), (3, 2), (4, None), (5, 3), (6, 4), (7, 5), (8, None), (9, 6)]
    assert not list(tmp_path.glob(".history.jsonl.*"))


def test_remove_entries_counts_what_it_streams_out_and_an_empty_removal_writes_nothing(tmp_path):
    history.append_entries(tmp_path, [(text, None) for text in "abcd"], NOW)
    before = (tmp_path / "history.jsonl").stat()
    assert history.remove_entries(tmp_path, lambda entry: True) == 0
    assert (tmp_path / "history.jsonl").stat().st_ino == before.st_ino
    assert history.remove_entries(tmp_path, lambda entry: entry.cursor % 2 == 1) == 2
    assert [entry.cursor for entry in history.iter_entries(tmp_path)] == [1, 3]
    assert (tmp_path / ".cursor").read_text() == "4"


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=8)
TEXTS = st.text(alphabet=st.characters(exclude_categories=("Cs",)))  # a lone surrogate cannot be written as UTF-8


@settings(max_examples=300, deadline=None)
@given(cursor=st.integers(min_value=1), timestamp=TEXTS, content=TEXTS,
       key=st.none() | TEXTS, span=st.none() | st.dictionaries(TEXTS, JSON_VALUES, max_size=4))
def test_an_entry_line_is_the_json_of_its_record_byte_for_byte(cursor, timestamp, content, key, span):
    entry = history.HistoryEntry(cursor, timestamp, content, key, span=span)
    assert entry.to_line() == (json.dumps(entry.to_record(), ensure_ascii=False) + "\n").encode("utf-8")


@settings(max_examples=60, deadline=None)
@given(contents=st.lists(TEXTS | st.sampled_from(["", "  ", "<think>only reasoning</think>", "a\u2028b \"q\" \\"]),
                         max_size=6),
       key=st.none() | st.sampled_from(["telegram:1", "cli:é"]))
def test_prepared_entries_append_the_very_bytes_and_cursors_of_plain_ones(contents, key):
    with tempfile.TemporaryDirectory() as folder:
        plain, prepared = Path(folder) / "plain" / "memory", Path(folder) / "prepared" / "memory"
        for memory in (plain, prepared):
            history.append_entries(memory, [("before", None)], NOW)
        journalled: list[list[int]] = []
        written = history.append_entries(plain, [(content, key) for content in contents], NOW,
                                         before_write=journalled.append)
        entries = [entry for entry in map(history.prepare_entry, contents) if entry is not None]
        cursors = history.append_prepared(prepared, [(entry, None) for entry in entries], key, NOW,
                                          before_write=journalled.append)
        assert cursors == [entry.cursor for entry in written]
        assert journalled == ([cursors, cursors] if cursors else [])
        assert [entry.hash for entry in entries] == [history.content_hash(entry.content) for entry in written]
        for name in (history.HISTORY_NAME, history.CURSOR_NAME):
            assert (prepared / name).read_bytes() == (plain / name).read_bytes()


# nanobot's own append (agent/memory.py): open "a", write one line, close; an in-process lock only.
AGENT_APPENDER = r"""
import json, os, sys, time
path, stop = sys.argv[1], sys.argv[2]
number = 0
while not os.path.exists(stop) or number < 200:
    number += 1
    record = {"cursor": 10_000_000 + number, "timestamp": "2026-11-01 10:00", "content": f"agent line {number}"}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    time.sleep(0.0002)
print(number)
"""


HISTORY_LINES_BEFORE = 4_000  # a rewrite long enough for the agent to append while it copies, and again after it


@pytest.mark.parametrize("rewrite", ["remove", "insert"])
def test_every_line_the_agent_appends_during_a_rewrite_is_kept(tmp_path, rewrite):
    """nanobot appends without our lock while nanobotd rewrites history.jsonl (a restore, a compaction, a roll
    back): every line it appended before, during or after the rename is in the file once, whole."""
    path = tmp_path / "history.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for cursor in range(1, HISTORY_LINES_BEFORE + 1):
            handle.write(json.dumps({"cursor": cursor, "timestamp": "t", "content": f"entry {cursor} " * 8}) + "\n")
    stop = tmp_path / "stop"
    appender = subprocess.Popen([sys.executable, "-c", AGENT_APPENDER, str(path), str(stop)],
                                stdout=subprocess.PIPE, text=True)
    try:
        removed: list[history.HistoryEntry] = []
        for round_number in range(12):
            doomed = {round_number * 10 + 1}
            if rewrite == "remove" or round_number % 2 == 0:
                removed += [entry for entry in history.iter_entries(tmp_path) if entry.cursor in doomed]
                history.remove_entries(tmp_path, lambda entry, gone=doomed: entry.cursor not in gone)
            else:
                assert history.insert_entries(tmp_path, removed) == len(removed)
                removed = []
    finally:
        stop.touch()
        written = int(appender.communicate(timeout=60)[0])
    scan = read_history(tmp_path)
    assert scan.bad_lines == []
    agent = [entry.cursor - 10_000_000 for entry in scan.entries if entry.cursor > 10_000_000]
    lost = sorted(set(range(1, written + 1)) - set(agent))
    assert not lost, f"{len(lost)} of {written} agent lines lost, first {lost[:5]}"
    assert len(agent) == written, "an agent line was kept twice"


LINE = st.binary(min_size=0, max_size=12).map(lambda data: data.replace(b"\n", b"x"))


@given(lines=st.lists(LINE, max_size=30), block=st.integers(min_value=1, max_value=40), newline=st.booleans())
def test_lines_from_end_are_the_files_lines_reversed_whatever_the_block_size(tmp_path_factory, lines, block,
                                                                              newline) -> None:
    path = tmp_path_factory.mktemp("h") / "history.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if newline else b""))
    wanted = [line for line in reversed(path.read_bytes().split(b"\n")) if line.strip()]
    assert list(history.lines_from_end(path, block)) == wanted


def test_a_missing_file_has_no_lines(tmp_path: Path) -> None:
    assert list(history.lines_from_end(tmp_path / "history.jsonl")) == []


@given(lines=st.lists(st.integers(min_value=0, max_value=30), max_size=12),
       block=st.integers(min_value=1, max_value=40))
def test_lines_from_end_skip_a_line_over_the_cap_whatever_the_block_size(tmp_path_factory, lines, block) -> None:
    path = tmp_path_factory.mktemp("h") / "history.jsonl"
    texts = [b"L" + b"x" * size for size in lines]
    path.write_bytes(b"\n".join(texts) + b"\n")
    wanted = [text for text in reversed(texts) if len(text) <= 16]
    assert list(history.lines_from_end(path, block, max_line_bytes=16)) == wanted


def test_insert_keeps_an_entry_written_since_at_the_same_cursor_and_skips_one_present_already(tmp_path):
    history.append_entries(tmp_path, [("a", None), ("b", None)], NOW)
    removed = list(history.iter_entries(tmp_path))
    (tmp_path / "history.jsonl").unlink()  # memory/ deleted: cursors start again at 1
    (tmp_path / ".cursor").unlink()
    history.append_entries(tmp_path, [("written since", None)], NOW)
    assert history.insert_entries(tmp_path, removed) == 2
    assert history.insert_entries(tmp_path, removed) == 0  # a restore step taken again after a crash
    assert sorted(entry.content for entry in history.iter_entries(tmp_path)) == ["a", "b", "written since"]
