"""nanobotd/cli/commands/jobs.py: starting jobs, waiting for their runs, dream commits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from nanobotd.cli import nanobotctl as ctl
from nanobotd.cli.commands import jobs
from tests.cli.fakedaemon import FakeDaemon, run_ctl


def test_consolidate_queues_a_run_and_wait_polls_until_it_ends(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "consolidate", "cli:direct")
    assert (code, out) == (0, "queued run run-cli:direct\n")
    assert daemon.requests[-1].body == {"session": "cli:direct"}
    daemon.run_states["run-cli:direct"] = ["queued", "started", "done"]
    started = time.monotonic()
    code, out, _ = run_ctl(socket_path, "consolidate", "cli:direct", "--wait")
    assert code == 0
    assert "state:  done" in out
    assert time.monotonic() - started >= 2 * jobs.POLL_SECONDS
    assert [request.path for request in daemon.requests[-3:]] == ["/v1/runs/run-cli%3Adirect"] * 3


def test_a_failed_run_after_wait_exits_1(socket_path: Path, daemon: FakeDaemon) -> None:
    daemon.run_states["run-s"] = ["started", "failed"]
    code, out, _ = run_ctl(socket_path, "flush", "s", "--wait")
    assert code == 1
    assert "state:  failed" in out


def test_dream_handles_several_run_ids(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "dream")
    assert (code, out) == (0, "queued run d-main\nqueued run d-second\n")
    assert daemon.requests[-1].body == {}
    code, out, _ = run_ctl(socket_path, "--json", "dream", "--wait")
    assert [run["run_id"] for run in json.loads(out)["runs"]] == ["d-main", "d-second"]


def test_dream_log_prints_message_then_diff(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "dream-log", "r9")
    assert code == 0
    assert daemon.requests[-1].query == {"target": "r9"}
    assert out.index("    dream: tidy USER.md") < out.index("+new")
    run_ctl(socket_path, "dream-log")
    assert daemon.requests[-1].query == {}


def test_restore_dry_run_prints_the_plan(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "restore", "r9", "--dry-run")
    assert (code, out) == (0, "revert r9\nrestore memory/MEMORY.md\n")
    assert daemon.requests[-1].body == {"target": "r9", "dry_run": True, "force": False}
    code, out, _ = run_ctl(socket_path, "restore", "r9", "--force")
    assert (code, out) == (0, "queued run restore-1\n")


def test_lifecycle_prints_its_plan_or_queues_a_run_and_reindex_prints_its_answer(socket_path: Path,
                                                                                 daemon: FakeDaemon) -> None:
    assert run_ctl(socket_path, "lifecycle", "--dry-run")[1] == "move memory/2024-12-01.md to memory/archive/\n"
    assert run_ctl(socket_path, "lifecycle")[1] == "queued run life-1\n"
    assert run_ctl(socket_path, "reindex")[1] == "indexed: 12\n"


@pytest.mark.parametrize("argv", [["consolidate", "k"], ["flush", "k"], ["dream"], ["restore", "r9"], ["lifecycle"]])
def test_wait_prints_the_finished_run_for_every_command_that_queues_one(socket_path: Path, daemon: FakeDaemon,
                                                                        argv: list[str]) -> None:
    for run_id in ("run-k", "d-main", "d-second", "restore-1", "life-1"):
        daemon.run_states[run_id] = ["queued", "done"]
    code, out, _ = run_ctl(socket_path, *argv, "--wait")
    assert code == 0
    assert "state:  done" in out and "queued run" not in out
    assert daemon.requests[-1].path.startswith("/v1/runs/")


def test_dream_and_lifecycle_have_no_now_flag(socket_path: Path, daemon: FakeDaemon,
                                             capsys: pytest.CaptureFixture) -> None:
    for command in ("dream", "lifecycle"):
        assert ctl.main([command, "--now"], environ={}) == 2
        assert ctl.main([command, "--help"], environ={}) == 0
        assert "--now" not in capsys.readouterr().out


def test_reindex_answers_when_done_and_has_no_wait_option(socket_path: Path, daemon: FakeDaemon,
                                                          capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run_ctl(socket_path, "reindex")
    assert (code, out) == (0, "indexed: 12\n")
    assert [request.path for request in daemon.requests] == ["/v1/reindex"]
    assert run_ctl(socket_path, "reindex", "--wait")[0] == 2
    assert "unrecognized arguments: --wait" in capsys.readouterr().err
