"""The order of a workspace's start, through a real daemon held at named steps (fault action `hold:PATH`): the
agent's history is followed and the folders are watched before the first scan, git opens beside it, and a
workspace that appears later is opened too."""

from __future__ import annotations

import threading
import time

import pytest

from nanobotd.cli.client import Client, DaemonError
from tests.e2e.test_companion import CONFIG, GRACE, agent_entry, nanobotd_entries, past_the_grace, workspace_status
from tests.support.workspace import conversation, make_workspace, write_session

HELD_SCAN = "reconcile.startup_scanned"


def held(daemon, point: str) -> None:
    """Wait until the daemon holds at fault point *point*."""
    daemon.wait_for(lambda: f"fault point {point}: holding" in daemon.log())


def refusal(daemon, method: str, path: str, body: dict | None = None) -> tuple[DaemonError | None, float]:
    """The error answer of one request (None when it succeeded) and the seconds it took."""
    started = time.monotonic()
    try:
        Client(daemon.socket, 30).request(method, path, body)
    except DaemonError as error:
        return error, time.monotonic() - started
    return None, time.monotonic() - started


@pytest.fixture
def release(tmp_path):
    """The file whose creation lets a held step go on."""
    return tmp_path / "go"


def test_an_agent_entry_written_during_the_start_up_scan_is_the_agents_and_not_archived_again(
        tmp_path, daemon_process, release):
    workspace, sessions = make_workspace(tmp_path, layout="current")
    write_session(sessions, "cli:a", conversation(6))
    daemon = daemon_process(workspace, extra_config=CONFIG, mode="auto",
                            env={"NANOBOTD_FAULTS": f"{HELD_SCAN}=hold:{release}"}).start()
    held(daemon, HELD_SCAN)
    write_session(sessions, "cli:a", [])  # /new while nanobotd scans: the file is cut, then the agent archives
    agent_entry(workspace, "cli:a", "- [durable] the user talked about a")
    release.touch()
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("messages") == 0)
    cut_seen = time.monotonic()  # the daemon saw the cut by now
    daemon.wait_for(lambda: daemon.session("cli:a")["vanished_messages"] == 0, timeout=GRACE + 8)
    past_the_grace(cut_seen)  # a rescue would be queued by now
    assert nanobotd_entries(workspace) == []
    assert daemon.ctl_json("runs", "--kind", "consolidate")["runs"] == []
    assert workspace_status(daemon)["archived_twice"] == 0


def test_a_session_saved_during_the_start_up_scan_is_seen_at_once(tmp_path, daemon_process, release):
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:a", conversation(2))
    daemon = daemon_process(workspace, reconcile_seconds=600,
                            env={"NANOBOTD_FAULTS": f"{HELD_SCAN}=hold:{release}"}).start()
    held(daemon, HELD_SCAN)
    write_session(sessions, "cli:b", conversation(4, tag="b"))
    release.touch()
    daemon.wait_for(lambda: (daemon.session("cli:b") or {}).get("messages") == 4, timeout=10)


def test_git_opens_beside_the_start_up_scan(tmp_path, daemon_process, release):
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:a", conversation(2))
    daemon = daemon_process(workspace, env={"NANOBOTD_FAULTS": f"{HELD_SCAN}=hold:{release}"}).start()
    held(daemon, HELD_SCAN)
    daemon.wait_for(lambda: workspace_status(daemon)["git"]["available"], timeout=15)
    error, _ = refusal(daemon, "GET", "/v1/dream-log")
    assert error is None or error.code == "no_commit"
    release.touch()


def test_restore_and_dream_log_wait_for_a_workspace_still_opening_then_answer_409_not_open(
        tmp_path, daemon_process, release):
    workspace, sessions = make_workspace(tmp_path)
    daemon = daemon_process(workspace, env={"NANOBOTD_FAULTS": f"workspace.opening_git=hold:{release}"}).start()
    held(daemon, "workspace.opening_git")
    answers = {}
    asks = [threading.Thread(target=lambda name=name, args=args: answers.__setitem__(name, refusal(daemon, *args)))
            for name, args in (("log", ("GET", "/v1/dream-log")),
                               ("restore", ("POST", "/v1/restore", {"target": "r-1", "dry_run": True})))]
    for ask in asks:
        ask.start()
    for ask in asks:
        ask.join(30)
    for error, seconds in answers.values():
        assert (error.status, error.code) == (409, "not_open") and 9.5 <= seconds < 20
    release.touch()
    daemon.wait_for(lambda: workspace_status(daemon)["git"]["available"])
    error, seconds = refusal(daemon, "GET", "/v1/dream-log")
    assert (error is None or error.code == "no_commit") and seconds < 5


def test_a_workspace_that_appears_after_the_start_is_opened(tmp_path, daemon_process):
    daemon = daemon_process(tmp_path / "workspace", reconcile_seconds=600).start()
    assert workspace_status(daemon)["exists"] is False
    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:a", conversation(2))
    daemon.wait_for(lambda: (daemon.session("cli:a") or {}).get("messages") == 2)
    daemon.wait_for(lambda: workspace_status(daemon)["git"]["available"])
    daemon.wait_for(lambda: (workspace / "skills" / "memory-search" / "SKILL.md").exists())
