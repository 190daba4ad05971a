"""Every test runs with XDG, state and runtime paths pointed at its own tmp dir."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.support.mounts import tmpfs

# A suite started in the background of a non-interactive shell (`cmd &` in a script) inherits SIGINT ignored, and
# exec keeps it ignored: the nanobotctl and daemon processes the tests start must meet Ctrl-C as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The test files that start real daemons and LLM workers (the long ones) are handed out first: pytest-xdist gives a
# worker a file at a time, in collection order (`--no-loadscope-reorder`), and the many short unit files then fill in
# beside the last long one, instead of a long file starting last while the other worker has nothing left.
LONG_FIRST = ("tests/e2e/", "tests/llm/")


def pytest_collection_modifyitems(items):
    """Put the long directories' tests first, each file's tests still together and in order."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_FIRST))


@pytest.fixture(autouse=True)
def isolated_paths(tmp_path, monkeypatch):
    """No test touches the machine's real config, state or socket."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".state"))
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    for name in ("STATE_DIRECTORY", "RUNTIME_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC", "INVOCATION_ID",
                 "NANOBOTD_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 64 KiB tmpfs, so a write really meets a full disk (skipped where mounting is refused)."""
    with tmpfs(tmp_path / "full", "64k") as mount_point:
        yield mount_point


@pytest.fixture(scope="session", autouse=True)
def shared_llm_worker():
    """The LLM worker child in-process clients share (tests/support/llmworker.py) goes with the session."""
    yield
    shared = sys.modules.get("tests.support.llmworker")  # imported by the tests that use it, only
    if shared is not None:
        shared.close_shared_worker()
