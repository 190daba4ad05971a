"""nanobotd/cli/commands/reports.py: audit and observe."""

from __future__ import annotations

from pathlib import Path

from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_audit_lists_problems_with_fixes_and_observe_sends_the_period(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "audit")
    assert code == 0
    assert "- USER.md missing" in out and "fix: create USER.md" in out and "dream_cursor: 40" in out
    code, out, _ = run_ctl(socket_path, "observe", "--since", "30d")
    assert daemon.requests[-1].query == {"since": "30d"}
    assert "12345" in out and "P95_MS" in out


def test_observe_counts_restores_and_names_the_fallback_reasons(socket_path: Path, daemon: FakeDaemon) -> None:
    lines = run_ctl(socket_path, "observe")[1].splitlines()
    assert "restores: 3 (refused 1, restored 2); undid consolidate 2" in lines
    assert "raw fallback in consolidate/main: LLM failed: timeout (x1)" in lines
