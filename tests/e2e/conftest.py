"""Real-daemon scenarios: one fixture starts `nanobotd` subprocesses and makes sure none outlives its test."""

from __future__ import annotations

import pytest

from tests.support.daemonproc import DaemonProcess


@pytest.fixture
def daemon_process(tmp_path):
    """A factory of daemon subprocesses (not started) on this test's tmp dir; each is killed at the end."""
    made: list[DaemonProcess] = []

    def make(workspace, *, base=None, **kwargs) -> DaemonProcess:
        proc = DaemonProcess(base or tmp_path, workspace, **kwargs)
        made.append(proc)
        return proc

    yield make
    for proc in made:
        proc.kill()
