"""nanobotd/cli/commands/status.py: the daemon and each workspace, nested figures as labelled lines."""

from __future__ import annotations

from pathlib import Path

from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_status_prints_one_block_per_workspace(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, err = run_ctl(socket_path, "status")
    assert (code, err) == (0, "")
    assert "nanobotd 0.1.0  pid 4321  up 1h 2m 5s" in out
    assert "workspace main  (/srv/ws)" in out
    assert "workspace second  (/srv/ws2)" in out
    assert "12 messages, 3400 tokens\n" in out
    assert "healthy (inotify)" in out and "UNHEALTHY" in out
    assert "next 2025-01-02T04:45:00 (running)" in out
    assert "  git         head abc123def456, clean" in out.splitlines()


def test_search_figures_are_labelled_lines_not_a_run_on_line(socket_path: Path, daemon: FakeDaemon) -> None:
    lines = run_ctl(socket_path, "status")[1].splitlines()
    assert "  search      backend builtin" in lines
    assert "    index         185 units from 8 files, 446 KiB, refreshed 2025-01-01T10:00:01" in lines
    assert "    last refresh  8 files checked, 2 reindexed, +20 -3 units in 0.03s" in lines
    assert "    pending       0 changed file(s) to index" in lines
    assert "    refreshes     14 since the start, 3.25s in all, one running now" in lines
    assert not [line for line in lines if "=" in line]


def test_an_offline_workspace_says_its_dream_is_off_instead_of_announcing_one(socket_path: Path,
                                                                              daemon: FakeDaemon) -> None:
    block = run_ctl(socket_path, "status")[1].split("workspace second", 1)[1]
    assert "  dream    off: the dream needs an LLM" in block.splitlines()
    assert "next" not in block


def test_the_unarchived_row_says_how_many_long_sessions_are_not_read_yet() -> None:
    from nanobotd.cli.commands.status import _health_rows

    workspace = {"unarchived_messages": 400, "unarchived_tokens": 90000, "sessions_estimated": 2}
    rows = dict((label, text) for label, text in _health_rows(workspace))
    assert rows["unarchived"] == ("400 messages, 90000 tokens (~: 2 long sessions not read yet, estimated from "
                                  "their size)")
    rows = dict((label, text) for label, text in _health_rows({**workspace, "sessions_estimated": 0}))
    assert rows["unarchived"] == "400 messages, 90000 tokens"
