"""llm.idle_exit_seconds on SIGHUP: a real signal to a daemon running in this process reopens the workspace,
whose LLM client shares the daemon's worker, which takes the new idle time."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from nanobotd.config.load import load_config
from nanobotd.daemon.daemon import Daemon
from nanobotd.notify import Notifier
from tests.support.observe import wait_until
from tests.support.workspace import make_workspace


@pytest.fixture
def short_dir():
    """A folder under /tmp, short enough for an AF_UNIX socket path."""
    base = Path(tempfile.mkdtemp(prefix="nbd-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def write_config(path: Path, state: Path, workspace: Path, idle_exit_seconds: float) -> None:
    path.write_text(f'[daemon]\nsocket = "{state}/sock/n.sock"\nstate_dir = "{state}/state"\n'
                    f'[llm]\nmodel = "openai/fake-model"\napi_base = "http://127.0.0.1:9/v1"\n'
                    f"idle_exit_seconds = {idle_exit_seconds}\n"
                    f'\n[[workspaces]]\nname = "ws"\npath = "{workspace}"\n')


def test_a_sighup_with_a_new_idle_exit_time_gives_the_workspace_a_worker_with_it(tmp_path, short_dir):
    workspace, _ = make_workspace(tmp_path / "ws")
    config_path = tmp_path / "nanobotd.toml"
    write_config(config_path, short_dir, workspace, 300)

    async def scenario():
        daemon = Daemon(load_config(config_path, environ=dict(os.environ)), notifier=Notifier({}))
        running = asyncio.get_running_loop().create_task(daemon.run())
        try:
            before = await wait_until(lambda: daemon.core.workspaces.get("ws"))
            await wait_until(lambda: before.opened)
            write_config(config_path, short_dir, workspace, 7)
            os.kill(os.getpid(), signal.SIGHUP)
            after = await wait_until(lambda: daemon.core.workspaces.get("ws") is not before
                                     and daemon.core.workspaces.get("ws"))
            return before, after
        finally:
            daemon.request_stop()
            await asyncio.wait_for(running, 30)

    before, after = asyncio.run(scenario())
    assert after.settings.llm.idle_exit_seconds == 7
    assert after.llm.worker is before.llm.worker  # the daemon's, shared by its workspaces
    assert after.llm.worker.idle_exit_seconds == 7  # the next worker child started leaves after 7 s idle
