"""nanobotd/daemon/daemon.py: reloads driven by a real SIGHUP sent to a daemon running in this process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from nanobotd.config.load import load_config
from nanobotd.daemon.daemon import Daemon
from nanobotd.notify import Notifier
from tests.index.test_qmd import fake_qmd, hang_with_child, process_is_gone
from tests.support.observe import wait_until
from tests.support.workspace import conversation, make_workspace, write_session


@pytest.fixture
def short_dir():
    """A folder under /tmp, short enough for an AF_UNIX socket path whatever the test's name."""
    base = Path(tempfile.mkdtemp(prefix="nbd-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def running_daemon(config_path: Path):
    """A daemon started from *config_path* in this process's loop, stopped when the block ends."""
    daemon = Daemon(load_config(config_path, environ=dict(os.environ)), notifier=Notifier({}))
    running = asyncio.get_running_loop().create_task(daemon.run())
    try:
        yield daemon
    finally:
        daemon.request_stop()
        await asyncio.wait_for(running, 30)


def write_config(path: Path, state: Path, workspaces: list[tuple[str, Path, Path, float]], *,
                 debounce: float = 0.2, log_level: str = "INFO", daemon_lines: str = "") -> None:
    """A config of (name, workspace, fake qmd, search debounce) workspaces, each searched through QMD."""
    text = (f'[daemon]\nsocket = "{state}/sock/n.sock"\nstate_dir = "{state}/state"\nreconcile_seconds = 1\n'
            f'debounce_seconds = {debounce}\nlog_level = "{log_level}"\n{daemon_lines}')
    for name, workspace, qmd, search_debounce in workspaces:
        text += (f'\n[[workspaces]]\nname = "{name}"\npath = "{workspace}"\nconsolidation = {{ mode = "owner" }}\n'
                 f'search = {{ backend = "both", qmd_command = "{qmd}", debounce_seconds = {search_debounce} }}\n')
    path.write_text(text)


def one_workspace(tmp_path: Path, short_dir: Path, search_debounce: float, *, daemon_lines: str = ""):
    """(workspace, fake qmd, config path) of a config with one workspace "ws"."""
    workspace, _ = make_workspace(tmp_path)
    qmd = fake_qmd(tmp_path, workspace)
    config_path = tmp_path / "nanobotd.toml"
    write_config(config_path, short_dir, [("ws", workspace, qmd, search_debounce)], daemon_lines=daemon_lines)
    return workspace, qmd, config_path


def test_a_sighup_that_drops_a_workspace_closes_its_git_thread_and_qmd_child(tmp_path, short_dir):
    keep, keep_sessions = make_workspace(tmp_path / "keep")
    drop, _ = make_workspace(tmp_path / "drop")
    write_session(keep_sessions, "cli:a", conversation(2))
    child_pid_file = tmp_path / "qmd-child.pid"
    keep_qmd = fake_qmd(tmp_path / "keep", keep)
    drop_qmd = fake_qmd(tmp_path / "drop", drop, update=hang_with_child(child_pid_file))
    config_path = tmp_path / "nanobotd.toml"
    write_config(config_path, short_dir, [("keep", keep, keep_qmd, 0.1), ("drop", drop, drop_qmd, 0.1)])

    async def scenario():
        async with running_daemon(config_path) as daemon:
            await wait_until(child_pid_file.exists)  # the dropped workspace's QMD update is running
            dropped = daemon.core.workspaces["drop"]
            write_config(config_path, short_dir, [("keep", keep, keep_qmd, 0.1)], debounce=0.7, log_level="DEBUG")
            os.kill(os.getpid(), signal.SIGHUP)
            await wait_until(lambda: "drop" not in daemon.core.workspaces)
            kept = daemon.core.workspaces["keep"]
            return dropped, kept, daemon.core.watcher.debounce, list(daemon.core.restart_needed)

    dropped, kept, debounce, restart_needed = asyncio.run(scenario())
    assert process_is_gone(int(child_pid_file.read_text()))
    assert dropped.git._executor._shutdown
    assert dropped.qmd._closed and kept is not dropped
    assert debounce == 0.7
    assert restart_needed == ["log_level"]


def test_a_sighup_that_changes_the_search_debounce_reopens_the_workspace_with_it(tmp_path, short_dir):
    workspace, qmd, config_path = one_workspace(tmp_path, short_dir, 2.0)

    async def scenario():
        async with running_daemon(config_path) as daemon:
            before = await wait_until(lambda: daemon.core.workspaces.get("ws"))
            await wait_until(lambda: before.opened)
            write_config(config_path, short_dir, [("ws", workspace, qmd, 0.3)])
            os.kill(os.getpid(), signal.SIGHUP)
            after = await wait_until(lambda: daemon.core.workspaces.get("ws") is not before
                                     and daemon.core.workspaces.get("ws"))
            return before, after, list(daemon.core.restart_needed)

    before, after, restart_needed = asyncio.run(scenario())
    assert before.qmd._closed and before.git._executor._shutdown
    assert after.settings.search.debounce_seconds == 0.3
    assert after.qmd.settings.debounce_seconds == 0.3
    assert restart_needed == []


def test_the_idle_check_gives_the_state_databases_page_cache_back_only_while_no_job_runs(tmp_path, short_dir):
    _, _, config_path = one_workspace(tmp_path, short_dir, 0.3)

    async def scenario():
        async with running_daemon(config_path) as daemon:
            workspace = await wait_until(lambda: daemon.core.workspaces.get("ws"))
            await wait_until(lambda: workspace.opened)  # not stopped while its QMD check is being spawned
            shrunk = []
            daemon.core.store.shrink_memory = lambda: shrunk.append(True)
            daemon._release_idle_caches()
            idle = len(shrunk)
            daemon.core.queue._running["run-x"] = type("Job", (), {"kind": "consolidate", "task": None})()
            daemon._release_idle_caches()
            daemon.core.queue._running.pop("run-x")
            return idle, len(shrunk)

    idle, busy = asyncio.run(scenario())
    assert idle == 1 and busy == 1  # given back when idle; kept while a job runs
