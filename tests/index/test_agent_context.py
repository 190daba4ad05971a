"""The budgeted memory context on real workspaces: caps, trimming, priorities, and a budget never exceeded."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from nanobotd.index.agent_context import build_context
from nanobotd.index.builtin import BuiltinIndex
from nanobotd.index.hit import SearchBackendError, SearchHit
from nanobotd.tokens import count_tokens
from tests.support.workspace import conversation, make_workspace, write_session


def history_line(cursor: int, content: str, key: str | None = None) -> str:
    record = {"cursor": cursor, "timestamp": f"2026-11-{cursor % 28 + 1:02d} 10:00", "content": content}
    if key:
        record["session_key"] = key
    return json.dumps(record) + "\n"


@pytest.fixture
def rich(tmp_path):
    """A workspace with every part present, an index over it, and a session of the asking agent."""
    workspace, sessions = make_workspace(tmp_path)
    (workspace / "AGENTS.md").write_text("# Agents\n\n## Rules\n- Always cite the source.\n" * 40)
    (workspace / "memory" / "MEMORY.md").write_text("# Memory\n\n## Infra\n- The staging host is kestrel.\n" * 8)
    (workspace / "memory" / "history.jsonl").write_text(
        "".join(history_line(n, f"- [durable] decision {n} about the billing service") for n in range(1, 61)))
    (workspace / "memory" / ".dream_cursor").write_text("20")
    write_session(sessions, "cli:direct", conversation(60), last_archived=30)
    index = BuiltinIndex(workspace, tmp_path / "index.db", sessions)
    index.refresh()
    yield workspace, index
    index.close()


def search_with(index):
    return lambda query, limit: index.search(query, limit=limit)


@pytest.mark.parametrize("budget", [0, 1, 2, 5, 10, 20, 50, 80, 100, 200, 500, 1000, 2000, 5000, 8000, 20000, 100000])
def test_the_budget_is_never_exceeded(rich, budget):
    workspace, index = rich
    result = build_context(workspace, budget_tokens=budget, query="billing decision M-40",
                           search=search_with(index), session_key="cli:direct")
    assert result["tokens"] == count_tokens(result["text"]) <= max(budget, 0)
    assert result["budget_tokens"] == budget
    assert sum(part["tokens"] for part in result["parts"]) <= max(budget, 0)


def test_parts_come_in_order_with_their_headers(rich):
    workspace, index = rich
    result = build_context(workspace, budget_tokens=100000, query="billing M-10",
                           search=search_with(index))
    names = [part["name"] for part in result["parts"]]
    assert names == ["Search: billing M-10", "Recent history"]  # nanobot injects AGENTS/SOUL/USER/MEMORY.md itself
    text = result["text"]
    positions = [text.index(f"## {name}\n") for name in names]
    assert positions == sorted(positions)
    assert result["omitted"] == []


def test_recent_history_starts_after_the_dream_cursor_and_prefers_the_newest(rich):
    workspace, _ = rich
    full = build_context(workspace, budget_tokens=100000)["text"]
    assert "decision 21 " in full and "decision 60 " in full and "decision 20 " not in full
    small = build_context(workspace, budget_tokens=150)
    history = small["text"].split("## Recent history\n", 1)[1]
    assert "decision 60 " in history and "decision 21 " not in history
    shown = [int(part.split(" ")[0]) for part in history.split("decision ")[1:]]
    assert shown == sorted(shown) and shown[-1] == 60  # a timeline, oldest of the newest first


def test_search_hits_carry_where_and_when_and_skip_what_the_context_already_has(rich):
    workspace, index = rich
    result = build_context(workspace, budget_tokens=100000,
                           query="kestrel staging billing wm12x3", search=search_with(index))
    search, history = result["text"].split("## Search: kestrel staging billing wm12x3\n", 1)[1].split(
        "## Recent history\n")
    where = re.search(r"### session cli:direct messages (\d+)-(\d+) \(2026-11-01T09:", search)
    assert where and int(where.group(1)) <= 12 <= int(where.group(2))
    assert "### memory/history.jsonl:3-3 (2026-11-04T10:00:00)\n- [durable] decision 3 " in search
    assert "memory/MEMORY.md" not in search  # in the agent's prompt already
    in_hits = {line.split(" about")[0] for line in search.splitlines() if "decision " in line}
    in_history = {line.split("] ", 1)[1].split(" about")[0] for line in history.splitlines() if "decision " in line}
    assert in_hits and in_history and not in_hits & in_history  # each entry shown once


def test_hits_from_the_live_part_of_the_asking_session_are_left_out(rich):
    workspace, index = rich
    asked = dict(budget_tokens=100000, search=search_with(index))
    live = build_context(workspace, query="wm50x1", session_key="cli:direct", **asked)
    assert "## Search" not in live["text"] and {"name": "Search: wm50x1", "reason": "no hits"} in live["omitted"]
    archived = build_context(workspace, query="wm10x1", session_key="cli:direct", **asked)
    assert "M-10 user says" in archived["text"].split("## Search: wm10x1\n", 1)[1]


def test_a_failing_search_backend_is_noted_not_fatal(rich):
    workspace, _ = rich

    def broken(query, limit):
        raise SearchBackendError("qmd timed out")

    result = build_context(workspace, budget_tokens=5000, query="x", search=broken)
    assert {"name": "Search: x", "reason": "search unavailable: qmd timed out"} in result["omitted"]


def test_a_huge_memory_file_is_never_read_and_bad_utf8_in_history_is_replaced(tmp_path):
    workspace, _ = make_workspace(tmp_path)
    (workspace / "memory" / "MEMORY.md").write_bytes(b"# Memory\n\xff\xfe\xc3(" + "é".encode() * 5_000_000 + b"\nEND\n")
    (workspace / "memory" / "history.jsonl").write_bytes(b"\xff garbage\n" + history_line(1, "caf\u00e9").encode()
                                                          + b'{"cursor": 2, "content": "bad \xff byte"}\n'
                                                          + history_line(3, "x" * 40000).encode())
    result = build_context(workspace, budget_tokens=100000)
    assert "END" not in result["text"] and "memory/MEMORY.md" not in result["text"]
    assert "bad \ufffd byte" in result["text"] and "café" in result["text"]
    small = build_context(workspace, budget_tokens=3000)
    assert small["tokens"] <= 3000 and "[... cut to fit the token budget]" in small["text"]


def test_a_tiny_budget_gives_an_empty_text_and_says_why(rich):
    workspace, _ = rich
    result = build_context(workspace, budget_tokens=3)
    assert result["text"] == "" and result["tokens"] == 0 and result["parts"] == []
    assert {"name": "Recent history", "reason": "budget"} in result["omitted"]


def test_a_part_that_does_not_fit_is_cut_to_the_budget(rich):
    workspace, _ = rich
    (workspace / "memory" / "history.jsonl").write_text(history_line(61, "- [durable] " + "long words " * 400))
    result = build_context(workspace, budget_tokens=120)
    assert result["parts"][0]["name"] == "Recent history" and result["parts"][0]["truncated"]
    assert result["text"].rstrip().endswith("[... cut to fit the token budget]")
    assert result["tokens"] <= 120


def test_search_hits_are_rendered_from_any_backend():
    hit = SearchHit(source="history", path="memory/history.jsonl", snippet="s", score=1.0, text="the text",
                    when="2026-11-01T10:00:00", line_start=4, line_end=4)
    from nanobotd.index.agent_context import render_hit

    assert render_hit(hit) == "### memory/history.jsonl:4-4 (2026-11-01T10:00:00)\nthe text"


def test_missing_workspace_files_are_omitted(tmp_path):
    result = build_context(tmp_path / "nowhere", budget_tokens=1000, query="x",
                           search=lambda query, limit: [])
    assert result["text"] == ""
    assert {"name": "Search: x", "reason": "no hits"} in result["omitted"]
    assert datetime.now()  # the context never needs the clock
