"""nanobotd/cli/commands/sessions.py: sessions, session, runs and run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_sessions_prints_an_aligned_table(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "sessions")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["WORKSPACE", "KEY", "MESSAGES", "UNARCHIVED", "TOKENS", "AGENT_ARCH",
                                "DAEMON_ARCH", "CORRUPT", "UPDATED", "STATE"]
    assert lines[1].split()[:3] == ["main", "telegram:42", "120"]
    assert lines[1].index("idle") == lines[2].index("watching") == lines[0].index("STATE")
    assert lines[1].index("120") + 3 == lines[2].index("5") + 1  # numbers right-aligned
    assert lines[-1].startswith("TOKENS: tokens of the UNARCHIVED messages only")


def test_a_session_key_with_slash_and_colon_round_trips(socket_path: Path, daemon: FakeDaemon) -> None:
    key = "slack:C042/thread:1700000000.1234 x"
    code, out, _ = run_ctl(socket_path, "session", key)
    assert code == 0
    assert daemon.requests[-1].params["key"] == key
    assert f"key:                 {key}" in out
    assert "last_run:" in out and "  run_id: r7" in out


def test_runs_sends_filters_and_prints_a_table(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "runs", "--kind", "flush", "--limit", "5")
    assert code == 0
    assert daemon.requests[-1].query == {"kind": "flush", "limit": "5"}
    assert out.splitlines()[0].split()[:3] == ["RUN_ID", "KIND", "WORKSPACE"]
    assert "r1" in out and "flush" in out
    run_ctl(socket_path, "runs")
    assert daemon.requests[-1].query == {}


def test_runs_hides_the_runs_that_changed_nothing_and_says_how_many(socket_path: Path, daemon: FakeDaemon) -> None:
    out = run_ctl(socket_path, "runs")[1]
    assert out.splitlines()[-1] == ("(3 runs that changed nothing not shown: --all lists them; "
                                    "`nanobotctl observe` counts them)")
    out = run_ctl(socket_path, "runs", "--all")[1]
    assert daemon.requests[-1].query == {"all": "true"}
    assert "not shown" not in out


def test_run_reads_as_a_summary_and_json_keeps_the_manifest(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "run", "r-5")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "run r-5"
    assert "  outcome:               summarized" in lines and "  took:                  2.25s" in lines
    assert "  files:                 memory/history.jsonl" in lines
    assert "removed_transcript" not in out and "{" not in out
    assert lines[-1] == "(--json shows the whole manifest)"
    data = json.loads(run_ctl(socket_path, "--json", "run", "r-5")[1])
    assert data["run"]["manifest"]["removed_transcript"] == "x" * 2000


def test_an_open_run_shows_how_far_it_has_got(socket_path: Path, daemon: FakeDaemon) -> None:
    daemon.run_states["r-6"] = ["started"]
    out = run_ctl(socket_path, "run", "r-6")[1]
    assert "  progress:  running, archiving 2/3, 2.00s" in out.splitlines()


def test_an_unknown_run_exits_1_with_the_daemons_message(socket_path: Path, daemon: FakeDaemon) -> None:
    assert run_ctl(socket_path, "run", "nope")[::2] == (1, "nanobotctl: no run 'nope'\n")


def test_a_session_held_unread_shows_its_estimated_counts_with_a_tilde() -> None:
    from nanobotd.cli.commands.sessions import ESTIMATED_NOTE, _session_lines

    row = {"workspace": "main", "key": "telegram:7", "messages": 200, "unarchived_messages": 200,
           "unarchived_tokens": 41000, "agent_archived": 0, "daemon_archived": 0, "corrupt_lines": 0,
           "updated_at": "2026-11-29T10:00", "state": "active"}
    lines = _session_lines({"sessions": [row, {**row, "key": "telegram:8", "estimated": True}]})
    assert lines[1].split()[2:5] == ["200", "200", "41000"]
    assert lines[2].split()[2:5] == ["~200", "~200", "~41000"]
    assert ESTIMATED_NOTE in lines
    assert ESTIMATED_NOTE not in _session_lines({"sessions": [row]})
