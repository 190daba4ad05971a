"""nanobotd/daemon/lock.py: one daemon per state folder and per workspace, the second told who holds it."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from loguru import logger

from nanobotd.daemon.lock import WORKSPACE_LOCK_NAME, AlreadyRunning, DaemonLocks
from tests.daemon.test_daemon import running_daemon
from tests.support.mounts import tmpfs
from tests.support.observe import wait_until
from tests.support.workspace import conversation, make_workspace, write_session


@pytest.fixture
def short_dir():
    """A folder under /tmp, short enough for an AF_UNIX socket path whatever the test's name."""
    base = Path(tempfile.mkdtemp(prefix="nbl-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


HOLD_IN_A_CHILD = """
import sys, time
from pathlib import Path
from loguru import logger

from nanobotd.daemon.lock import DaemonLocks
locks = DaemonLocks(Path(sys.argv[2]))
locks.take_state(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def test_a_lock_held_by_another_process_names_its_pid_and_socket_and_goes_with_it(tmp_path):
    state = tmp_path / "state"
    child = subprocess.Popen([sys.executable, "-c", HOLD_IN_A_CHILD, str(state), "/run/first/nanobotd.sock"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        with pytest.raises(AlreadyRunning, match=rf"pid {child.pid}, socket /run/first/nanobotd.sock\) already runs "
                                                 rf"on the state folder {state}"):
            DaemonLocks(tmp_path / "second.sock").take_state(state)
    finally:
        child.kill()
        child.wait()
    locks = DaemonLocks(tmp_path / "second.sock")
    locks.take_state(state)  # a killed holder's file is left behind, holding nothing
    assert f'"pid": {os.getpid()}' in (state / "nanobotd.lock").read_text()
    locks.release_all()


def test_a_workspace_listed_twice_is_named_and_a_released_one_can_be_taken_again(tmp_path):
    workspace, _ = make_workspace(tmp_path)
    first, second = DaemonLocks(tmp_path / "a.sock"), DaemonLocks(tmp_path / "b.sock")
    first.take_workspace("ws", workspace)
    with pytest.raises(AlreadyRunning, match="workspace again .* is the same folder as workspace ws"):
        first.take_workspace("again", workspace / "." )
    with pytest.raises(AlreadyRunning, match=f"socket {tmp_path / 'a.sock'}"):
        second.take_workspace("ws", workspace)
    first.release_workspace(workspace)
    second.take_workspace("ws", workspace)
    assert not first.holds_workspace(workspace) and second.holds_workspace(workspace)
    second.release_all()


def test_a_workspace_that_appears_held_by_another_daemon_is_left_alone_until_it_is_let_go(tmp_path, short_dir):
    workspace = tmp_path / "later" / "workspace"
    config_path = tmp_path / "nanobotd.toml"
    config_path.write_text(f'[daemon]\nsocket = "{short_dir}/sock/n.sock"\nstate_dir = "{short_dir}/state"\n'
                           f'reconcile_seconds = 1\n\n[[workspaces]]\nname = "ws"\npath = "{workspace}"\n'
                           f'consolidation = {{ mode = "owner" }}\n')
    other = DaemonLocks(tmp_path / "other.sock")

    async def scenario():
        async with running_daemon(config_path) as daemon:
            await wait_until(lambda: daemon.server is not None and daemon.server.listening)
            made, sessions = make_workspace(tmp_path / "made")
            write_session(sessions, "cli:a", conversation(4))
            other.take_workspace("ws", made)  # another daemon holds it as it appears (moved in whole)
            workspace.parent.mkdir()
            os.rename(made, workspace)
            held = daemon.core.workspaces["ws"]
            await wait_until(lambda: held.held_elsewhere)
            left_alone = (held.held_elsewhere, dict(held.tracker.sessions))
            other.release_all()
            await wait_until(lambda: "cli:a" in held.tracker.sessions)
            return left_alone, held.held_elsewhere

    (message, sessions), after = asyncio.run(scenario())
    assert f"socket {tmp_path / 'other.sock'}" in message and WORKSPACE_LOCK_NAME in message
    assert sessions == {} and after is None


def test_a_workspace_on_a_read_only_mount_is_worked_on_unlocked_with_a_warning(tmp_path):
    with tmpfs(tmp_path / "ro"):
        workspace, _ = make_workspace(tmp_path / "ro")
        subprocess.run(["mount", "-o", "remount,ro", str(tmp_path / "ro")], check=True)
        messages: list[str] = []
        sink = logger.add(messages.append, level="WARNING", format="{message}")
        try:
            locks = DaemonLocks(tmp_path / "a.sock")
            locks.take_workspace("ws", workspace)
            assert locks.holds_workspace(workspace)
        finally:
            logger.remove(sink)
        assert len(messages) == 1 and "Read-only file system" in messages[0]


def test_a_session_job_on_a_workspace_another_daemon_holds_is_refused(tmp_path, short_dir):
    """The state folder remembers the workspace's sessions, but another daemon holds the workspace now: a run
    asked for would wait for a first scan that never comes."""
    from nanobotd.cli.client import Client, DaemonError

    workspace, sessions = make_workspace(tmp_path)
    write_session(sessions, "cli:a", conversation(4))
    socket = short_dir / "sock" / "n.sock"
    config_path = tmp_path / "nanobotd.toml"
    config_path.write_text(f'[daemon]\nsocket = "{socket}"\nstate_dir = "{short_dir}/state"\n\n[[workspaces]]\n'
                           f'name = "ws"\npath = "{workspace}"\nconsolidation = {{ mode = "owner" }}\n')
    other = DaemonLocks(tmp_path / "other.sock")

    async def scenario():
        async with running_daemon(config_path) as daemon:
            await wait_until(lambda: daemon.server is not None and daemon.server.listening)
            await wait_until(lambda: "cli:a" in daemon.core.workspaces["ws"].tracker.sessions)
        away = tmp_path / "away"
        os.rename(workspace, away)  # gone at the next start, then moved back in held by another daemon
        other.take_workspace("ws", away)
        async with running_daemon(config_path) as daemon:
            await wait_until(lambda: daemon.server is not None and daemon.server.listening)
            os.rename(away, workspace)
            await wait_until(lambda: daemon.core.workspaces["ws"].held_elsewhere)
            assert "cli:a" in daemon.core.workspaces["ws"].tracker.sessions  # remembered by the state folder
            try:
                await asyncio.to_thread(Client(socket, 10).post, "/v1/consolidate", {"session": "cli:a"})
            except DaemonError as exc:
                return exc.status, exc.code
            return None

    try:
        assert asyncio.run(scenario()) == (409, "held_elsewhere")
    finally:
        other.release_all()
