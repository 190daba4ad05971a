"""Following the agent's own history entries, and finding what a cut [RAW] entry dropped."""

from __future__ import annotations

import json
from pathlib import Path

from nanobotd.memory.agent_history import (
    HistoryFollower,
    dropped_part,
    is_agent_entry,
    is_truncated_raw,
    kept_of_cut,
)
from nanobotd.memory.history import parse_entry
from nanobotd.memory.transcript import PendingMessage

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "nanobot-samples"  # real nanobot 0.3.5 output


def append(path: Path, *records: dict, partial: str = "") -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.write(partial)


def test_the_follower_returns_each_new_entry_once_and_waits_for_a_line_being_written(tmp_path):
    memory = tmp_path / "memory"
    memory.mkdir()
    follower = HistoryFollower(memory)
    assert follower.poll() == []
    path = memory / "history.jsonl"
    append(path, {"cursor": 1, "timestamp": "t", "content": "a", "session_key": "cli:x"},
           partial='{"cursor": 2, "timestamp": "t", "con')
    assert [entry.cursor for entry in follower.poll()] == [1]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('tent": "b"}\n')
    assert [entry.cursor for entry in follower.poll()] == [2]
    assert follower.poll() == []


def test_a_rewritten_history_is_read_again_but_old_cursors_are_not_reported_twice(tmp_path):
    memory = tmp_path / "memory"
    memory.mkdir()
    path = memory / "history.jsonl"
    append(path, *({"cursor": n, "timestamp": "t", "content": str(n)} for n in (1, 2, 3)))
    follower = HistoryFollower(memory)
    assert len(follower.poll()) == 3
    path.unlink()
    append(path, {"cursor": 3, "timestamp": "t", "content": "3"}, {"cursor": 4, "timestamp": "t", "content": "4"})
    assert [entry.cursor for entry in follower.poll()] == [4]


def test_entries_with_a_nanobotd_span_are_not_the_agents():
    assert is_agent_entry(parse_entry('{"cursor": 1, "timestamp": "t", "content": "x", "session_key": "a"}'))
    assert not is_agent_entry(parse_entry(
        '{"cursor": 1, "timestamp": "t", "content": "x", "nanobotd_span": {"run": "r", "count": 1}}'))


def test_the_messages_after_the_agents_cut_are_the_ones_dropped():
    texts = ["first message", "second message " + "x" * 50, "third message is long " + "y" * 80, "fourth"]
    body = "[RAW] 4 messages\n" + "\n".join(f"[2026-11-22T04:25] USER: {text}" for text in texts)
    cut = body[:body.index("third message") + 30] + "\n... (truncated)"
    assert is_truncated_raw(cut) and not is_truncated_raw(body)
    assert kept_of_cut(cut, texts)[0] == 2
    assert kept_of_cut(body, texts)[0] == 4
    assert kept_of_cut(cut, texts) == (2, 30)  # the cut fell 30 characters into the third message
    assert kept_of_cut(body[:body.index("third message") - 3] + "\n... (truncated)", texts) == (2, 0)
    third = PendingMessage("d3", "user", "2026-11-22T04:25", texts[2], 30, {})
    rest = dropped_part(third, 30)
    assert rest.text.endswith(texts[2][30:]) and texts[2][:30] not in rest.text and "first 30 characters" in rest.text
    assert dropped_part(third, 0) is third


def test_the_real_sample_raw_entry_of_nanobot_is_recognised():
    entries = [parse_entry(line) for line in (SAMPLES / "history.jsonl").read_text(encoding="utf-8").splitlines()]
    raw = [entry for entry in entries if entry and entry.content.startswith("[RAW]")]
    assert raw and all(is_agent_entry(entry) for entry in raw)
