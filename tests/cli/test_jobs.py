"""nanobotd/cli/commands/jobs.py: starting runs, waiting for them by default, summaries, dream commits."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from nanobotd.cli import nanobotctl as ctl
from nanobotd.cli import runtext, waiting
from tests.cli.fakedaemon import NANOBOTCTL, FakeDaemon, run_ctl, subprocess_env


def test_consolidate_waits_for_its_run_and_sums_up_what_changed(socket_path: Path, daemon: FakeDaemon) -> None:
    daemon.run_states["run-cli:direct"] = ["queued", "started", "finished"]
    started = time.monotonic()
    code, out, err = run_ctl(socket_path, "consolidate", "cli:direct")
    assert (code, err) == (0, "")
    assert time.monotonic() - started >= 2 * waiting.POLL_SECONDS
    assert daemon.requests[0].body == {"session": "cli:direct"}
    assert [request.path for request in daemon.requests[1:4]] == ["/v1/runs/run-cli%3Adirect"] * 3
    lines = out.splitlines()
    assert lines[0] == "consolidate run-cli:direct: summarized in 2.25s"
    assert "  history entries added: 2" in lines and "  messages archived:     30" in lines
    assert "  left unarchived:       4 messages, 120 tokens" in lines
    assert lines[-1] == "Details: nanobotctl run run-cli:direct; undo: nanobotctl restore run-cli:direct"
    assert "removed_transcript" not in out and "{" not in out


def test_no_wait_queues_and_says_how_to_follow_the_run(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "consolidate", "cli:direct", "--no-wait")
    assert (code, out) == (0, "queued run run-cli:direct\nFollow it with: nanobotctl run run-cli:direct\n")
    assert [request.path for request in daemon.requests] == ["/v1/consolidate"]
    code, out, _ = run_ctl(socket_path, "--json", "restore", "r9", "--no-wait")
    assert json.loads(out) == {"run_id": "restore-1", "status_url": "/v1/runs/restore-1"}


def test_a_failed_run_exits_1_and_says_why(socket_path: Path, daemon: FakeDaemon) -> None:
    daemon.run_states["run-s"] = ["started", "failed"]
    code, out, _ = run_ctl(socket_path, "flush", "s")
    assert code == 1
    assert out.splitlines()[0] == "consolidate run-s: failed (error) in 2.25s"
    assert "  error: LLMUnavailable: connection refused" in out.splitlines()


def test_a_joined_run_and_what_the_agent_keeps_are_said_after_a_consolidation(socket_path: Path,
                                                                              daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "consolidate", "joined")
    assert out.splitlines()[0] == "joined run run-joined, already queued for session joined"
    code, out, _ = run_ctl(socket_path, "consolidate", "agent")
    assert "Companion mode: messages still in the session file are the agent's to archive" in out
    data = json.loads(run_ctl(socket_path, "--json", "consolidate", "agent")[1])
    assert data["run"]["state"] == "finished" and data["left_unarchived"] == {"messages": 4, "tokens": 120}
    assert data["run_id"] == "run-agent" and data["consolidation_mode"] == "companion"


def test_dream_waits_for_each_of_several_runs(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "dream", "--no-wait")
    assert out.splitlines()[:2] == ["queued run d-main", "queued run d-second"]
    assert daemon.requests[-1].body == {}
    code, out, _ = run_ctl(socket_path, "--json", "dream")
    assert [run["run_id"] for run in json.loads(out)["runs"]] == ["d-main", "d-second"]
    code, out, _ = run_ctl(socket_path, "dream")
    assert "consolidate d-main: summarized" in out and "consolidate d-second: summarized" in out


def test_dream_log_prints_message_then_diff(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "dream-log", "r9")
    assert code == 0
    assert daemon.requests[-1].query == {"target": "r9"}
    assert out.index("    dream: tidy USER.md") < out.index("+new")
    run_ctl(socket_path, "dream-log")
    assert daemon.requests[-1].query == {}


def test_restore_dry_run_prints_the_plan_and_changes_nothing(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "restore", "r9", "--dry-run")
    assert (code, out) == (0, "Dry run: restoring r9 would\n  revert r9\n  restore memory/MEMORY.md\n"
                              "Nothing was changed. To do it: nanobotctl restore r9\n")
    assert daemon.requests[-1].body == {"target": "r9", "dry_run": True, "force": False}
    assert [request.path for request in daemon.requests] == ["/v1/restore"]
    code, out, _ = run_ctl(socket_path, "restore", "r9", "--force")
    assert code == 0 and out.startswith("consolidate restore-1: summarized")


def test_lifecycle_prints_its_plan_or_runs(socket_path: Path, daemon: FakeDaemon) -> None:
    out = run_ctl(socket_path, "lifecycle", "--dry-run")[1]
    assert out.splitlines()[:2] == ["Dry run: the lifecycle would", "  move memory/2024-12-01.md to memory/archive/"]
    assert run_ctl(socket_path, "lifecycle", "--no-wait")[1].startswith("queued run life-1\n")


def test_reindex_is_a_run_like_the_others(socket_path: Path, daemon: FakeDaemon) -> None:
    code, out, _ = run_ctl(socket_path, "reindex")
    assert code == 0 and "reindex-1" in out.splitlines()[0]
    assert [request.path for request in daemon.requests] == ["/v1/reindex", "/v1/runs/reindex-1"]
    assert run_ctl(socket_path, "reindex", "--no-wait")[1].startswith("queued run reindex-1\n")


@pytest.mark.parametrize("argv", [["consolidate", "k"], ["flush", "k"], ["dream"], ["restore", "r9"], ["lifecycle"],
                                  ["reindex"]])
def test_every_command_that_starts_a_run_waits_by_default(socket_path: Path, daemon: FakeDaemon,
                                                         argv: list[str]) -> None:
    for run_id in ("run-k", "d-main", "d-second", "restore-1", "life-1", "reindex-1"):
        daemon.run_states[run_id] = ["queued", "finished"]
    for extra in ([], ["--wait"]):
        code, out, _ = run_ctl(socket_path, *argv, *extra)
        assert code == 0
        assert ": summarized in 2.25s" in out and "queued run" not in out
        assert daemon.requests[-1].path.startswith("/v1/")
    assert run_ctl(socket_path, *argv, "--wait", "--no-wait")[0] == 2


def test_ctrl_c_while_waiting_leaves_the_run_going_and_says_so(socket_path: Path, daemon: FakeDaemon) -> None:
    daemon.run_states["restore-1"] = ["started"]
    waiter = subprocess.Popen([str(NANOBOTCTL), "restore", "r9"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=subprocess_env(socket_path))
    deadline = time.monotonic() + 30
    while not any(request.path.startswith("/v1/runs/restore-1") for request in daemon.requests):
        assert time.monotonic() < deadline and waiter.poll() is None, "nanobotctl never asked about its run"
        time.sleep(0.02)
    waiter.send_signal(signal.SIGINT)
    out, err = waiter.communicate(timeout=30)
    assert (waiter.returncode, out) == (130, "")
    assert "stopped waiting; the run goes on in the daemon (Ctrl-C does not cancel it)" in err
    assert "nanobotctl run restore-1" in err and "Traceback" not in err


def test_the_progress_line_is_drawn_on_a_terminal_and_cleared_at_the_end() -> None:
    class Terminal:
        def __init__(self) -> None:
            self.written = ""

        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> None:
            self.written += text

        def flush(self) -> None:
            pass

        def fileno(self) -> int:
            raise OSError("no real terminal")

    terminal = Terminal()
    line = waiting.ProgressLine(terminal)
    line.show("consolidate r1: running, archiving 2/3, 2.00s")
    line.clear()
    assert terminal.written == "\rconsolidate r1: running, archiving 2/3, 2.00s\x1b[K\r\x1b[K"
    piped = io.StringIO()
    waiting.ProgressLine(piped).show("consolidate r1: running")
    assert piped.getvalue() == ""


def test_a_long_progress_line_keeps_the_time_so_far_within_80_columns() -> None:
    """The fallback width is 80 (no real terminal here): a long step is cut, the elapsed time never."""
    run = {"kind": "consolidate", "state": "running",
           "progress": {"phase": "running", "step": "archiving the session telegram:1234567890 of the workspace "
                                                     "main, its oldest messages first", "done": 1, "total": 3}}
    shown = []

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            raise OSError("no real terminal")

        def write(self, text: str) -> int:
            shown.append(text)
            return len(text)

    line = waiting.ProgressLine(Terminal())
    line.show(f"consolidate r-20261123-124845-conso-0eff7f: {runtext.progress_text(run, with_time=False)}",
              ", 1m 15s")
    text = shown[-1].removeprefix("\r").removesuffix("\x1b[K")
    assert len(text) <= 79 and text.endswith("~, 1m 15s"), text


def test_dream_and_lifecycle_have_no_now_flag(socket_path: Path, daemon: FakeDaemon,
                                             capsys: pytest.CaptureFixture) -> None:
    for command in ("dream", "lifecycle"):
        assert ctl.main([command, "--now"], environ={}) == 2
        assert ctl.main([command, "--help"], environ={}) == 0
        assert "--now" not in capsys.readouterr().out
