"""nanobotd/cli/commands/search.py: search hits and the memory context."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_search_prints_numbered_hits_with_locations(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, err = run_ctl(socket_path, "search", "tea & biscuits", "--limit", "5", "--mode", "query")
    assert code == 0
    assert daemon.requests[-1].query == {"q": "tea & biscuits", "limit": "5", "mode": "query"}
    assert "1. memory/MEMORY.md:L10-14  2025-01-01  [memory, score 3.500]" in out
    assert "   about tea & biscuits" in out
    assert "2. session cli:direct #3-8" in out
    assert "   about it" in out
    assert "degraded: qmd unavailable" in err


def test_context_prints_the_text(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "context", "cli:direct", "--query", "tea", "--budget", "2000")
    assert (code, out) == (0, "# Memory\nfor cli:direct: tea\n")
    assert daemon.requests[-1].query == {"session": "cli:direct", "query": "tea", "budget_tokens": "2000"}
    assert json.loads(run_ctl(socket_path, "--json", "context", "k", "--budget", "9")[1])["budget_tokens"] == 9


def test_a_vector_search_that_fell_back_to_keywords_says_so(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "search", "tea", "--mode", "vsearch")
    assert code == 0 and out.splitlines()[0] == "note: vsearch needs QMD"
    assert json.loads(run_ctl(socket_path, "--json", "search", "tea", "--mode", "vsearch")[1])["fallback"]


def test_an_empty_context_warns_and_an_unknown_session_is_an_error(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, err = run_ctl(socket_path, "context", "k", "--budget", "1")
    assert (code, out) == (0, "")
    assert err == "nanobotctl: the context is empty: a budget of 1 tokens fits none of SOUL.md; raise the budget\n"
    assert run_ctl(socket_path, "context", "nope")[::2] == (1, "nanobotctl: no session 'nope'\n")
