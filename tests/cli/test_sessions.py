"""nanobotd/cli/commands/sessions.py: status, sessions, session, runs and run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_status_prints_one_block_per_workspace(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, err = run_ctl(socket_path, "status")
    assert (code, err) == (0, "")
    assert "nanobotd 0.1.0  pid 4321  up 1h 2m 5s" in out
    assert "workspace main  (/srv/ws)" in out
    assert "workspace second  (/srv/ws2)" in out
    assert "12 messages, 3400 tokens" in out
    assert "healthy (inotify)" in out and "UNHEALTHY" in out
    assert "next 2025-01-02T04:45:00 (running)" in out
    assert "head=abc123, dirty=no" in out


def test_sessions_prints_an_aligned_table(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "sessions")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["WORKSPACE", "KEY", "MESSAGES", "UNARCHIVED", "TOKENS", "AGENT_ARCH",
                                "DAEMON_ARCH", "CORRUPT", "UPDATED", "STATE"]
    assert lines[1].split()[:3] == ["main", "telegram:42", "120"]
    assert lines[1].index("idle") == lines[2].index("watching") == lines[0].index("STATE")
    assert lines[1].index("120") + 3 == lines[2].index("5") + 1  # numbers right-aligned


def test_a_session_key_with_slash_and_colon_round_trips(socket_path: Path, daemon: FakeDaemon) -> None:
    key = "slack:C042/thread:1700000000.1234 x"
    code, out, _ = run_ctl(socket_path, "session", key)
    assert code == 0
    assert daemon.requests[-1].params["key"] == key
    assert f"key:      {key}" in out
    assert "last_run:" in out and "  run_id: r7" in out


def test_runs_sends_filters_and_prints_a_table(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "runs", "--kind", "flush", "--limit", "5")
    assert code == 0
    assert daemon.requests[-1].query == {"kind": "flush", "limit": "5"}
    assert out.splitlines()[0].split()[:3] == ["RUN_ID", "KIND", "WORKSPACE"]
    assert "r1" in out and "flush" in out
    run_ctl(socket_path, "runs")
    assert daemon.requests[-1].query == {}


def test_run_prints_fields_then_the_manifest(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "run", "r-5")
    assert code == 0
    fields, _, manifest = out.partition("manifest:\n")
    assert "run_id: r-5" in fields
    assert json.loads(manifest) == {"files": ["memory/history.jsonl"], "cursor": [10, 12]}
