"""Fixtures for the CLI tests: a short tmp socket path and a canned daemon listening on it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from nanobotd.api.server import ControlServer
from tests.cli.fakedaemon import FakeDaemon, ServerThread
from tests.cli.twoworkspaces import start_two_workspaces


@pytest.fixture
def socket_path():
    """A socket path under /tmp, short enough for AF_UNIX whatever the test's name."""
    base = Path(tempfile.mkdtemp(prefix="nbc-", dir="/tmp"))
    yield base / "run" / "nanobotd.sock"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def daemon(socket_path: Path):
    """The canned daemon serving on socket_path for the test's duration."""
    fake = FakeDaemon()
    with ServerThread(ControlServer(socket_path, fake.router)):
        yield fake


@pytest.fixture
def two_workspaces(tmp_path: Path):
    """A real nanobotd managing the workspaces "ws" and "other" (tests/cli/twoworkspaces.py)."""
    started = start_two_workspaces(tmp_path)
    yield started
    started.daemon.kill()
