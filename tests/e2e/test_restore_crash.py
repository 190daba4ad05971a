"""SIGKILL a restore (and a restore of a restore) at each step it takes: after the restart every message is
archived exactly once, and `archived twice` counts what it claims."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from nanobotd.faults import ENV_NAME
from tests.support.histories import read_history
from tests.support.workspace import make_workspace, write_session

MESSAGES = 240
MARKER = re.compile(r"\bR\d+x\d+\b")
RUN_ID = re.compile(r"r-\d{8}-\d{6}-\w+-[0-9a-f]{6}")
# Every step a journalled restore takes: journalled, history rewritten, spool and archive marks changed.
POINTS = ("restore.journalled", "restore.history_rewritten", "restore.spool_changed")


def messages(count: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"R0x{i} message body {i}",
             "timestamp": f"2026-11-01T10:{i // 60:02d}:{i % 60:02d}"} for i in range(count)]


def archived_markers(workspace) -> Counter:
    scan = read_history(workspace / "memory")
    assert scan.bad_lines == []
    return Counter(marker for entry in scan.entries for marker in MARKER.findall(entry.content))


def run_ctl(proc, *args: str) -> str:
    answer = proc.ctl(*args, timeout=120)
    assert answer.returncode == 0, answer.stderr + proc.log()[-3000:]
    return RUN_ID.search(answer.stdout).group(0)


def killed_at(proc, point: str, *args: str) -> None:
    """Start the daemon with *point* armed, ask it for *args* and see it die there."""
    proc.env[ENV_NAME] = f"{point}=kill"
    proc.start()
    proc.ctl(*args, "--no-wait")
    deadline = time.monotonic() + 60
    while proc.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.proc.returncode == -9, f"the daemon did not die at {point}:\n" + proc.log()[-3000:]
    del proc.env[ENV_NAME]


def unarchived(proc) -> int:
    return (proc.session("cli:r") or {}).get("unarchived_messages", -1)


def archived_twice(proc) -> int:
    return proc.ctl_json("status")["workspaces"][0]["archived_twice"]


@pytest.fixture
def archived(tmp_path, daemon_process):
    """A daemon (stopped) whose consolidation run archived every message of session cli:r; (proc, run id)."""
    workspace, sessions = make_workspace(tmp_path, layout="current")
    write_session(sessions, "cli:r", messages(MESSAGES))
    proc = daemon_process(workspace, extra_config='\n[llm]\nmodel = "none"\ncontext_window = 8000\nmax_tokens = 1000')
    proc.start()
    proc.wait_for(lambda: unarchived(proc) == MESSAGES, timeout=60)
    run_id = run_ctl(proc, "consolidate", "cli:r", "--wait")
    assert unarchived(proc) == 0
    assert proc.stop() == 0
    return proc, workspace, run_id


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_during_a_restore_loses_no_message(archived, point):
    proc, workspace, run_id = archived
    killed_at(proc, point, "restore", run_id)

    proc.start()
    assert "was interrupted; recovery: recovered" in proc.log()
    assert sum(archived_markers(workspace).values()) == 0, "the restored run's entries are still in history"
    assert unarchived(proc) == MESSAGES, "the messages the restore took out of history are not back in the spool"
    assert proc.ctl_json("run", run_id)["run"]["manifest"].get("restored_by")
    run_ctl(proc, "consolidate", "cli:r", "--wait")
    seen = archived_markers(workspace)
    assert set(seen) == {f"R0x{i}" for i in range(MESSAGES)}, "a message was lost"
    assert {marker for marker, count in seen.items() if count > 1} == set()
    assert archived_twice(proc) == 0
    assert proc.stop() == 0


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_during_a_restore_of_a_restore_archives_no_message_twice(archived, point):
    proc, workspace, run_id = archived
    proc.start()
    restore_id = run_ctl(proc, "restore", run_id)
    assert unarchived(proc) == MESSAGES
    assert proc.stop() == 0
    killed_at(proc, point, "restore", restore_id)

    proc.start()
    assert "was interrupted; recovery: recovered" in proc.log()
    assert unarchived(proc) == 0, "the re-applied entries are in history, their messages must not wait again"
    run_ctl(proc, "consolidate", "cli:r", "--wait")
    seen = archived_markers(workspace)
    assert set(seen) == {f"R0x{i}" for i in range(MESSAGES)}, "a message was lost"
    doubled = sum(count - 1 for count in seen.values())
    assert doubled == 0, f"{doubled} messages archived twice"
    assert archived_twice(proc) == doubled
    assert proc.stop() == 0
