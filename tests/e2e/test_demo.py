"""scripts/demo.sh as a user runs it: two demos at once on one machine, each in its own folder, each
succeeding with its own output; the hints it prints work against the daemon it leaves running."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.cli import REPO

DEMO = REPO / "scripts" / "demo.sh"


def demo_env(tmp_path: Path, **extra: str) -> dict:
    """The caller's environment, with the test's virtualenv (nothing installed) and this checkout's code."""
    venv = Path(sys.executable).parent.parent
    return dict(os.environ, NANOBOTD_DEMO_VENV=str(venv), PYTHONPATH=str(REPO), TMPDIR=str(tmp_path), **extra)


def stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


@pytest.fixture
def short_tmp():
    """A folder under /tmp, short enough for the demo's socket path (pytest's own gains a worker folder under
    pytest-xdist, past AF_UNIX's 108 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="nbdemo-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_two_demos_at_once_both_succeed_with_their_own_output_and_working_hints(short_tmp):
    tmp_path = short_tmp
    kept = subprocess.Popen(["bash", str(DEMO)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=demo_env(tmp_path))
    stopped = subprocess.Popen(["bash", str(DEMO)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=demo_env(tmp_path, NANOBOTD_DEMO_KEEP="0"))
    outputs = [process.communicate(timeout=300) for process in (kept, stopped)]
    pids = [int(re.search(r"nanobotd pid (\d+)", out).group(1)) for out, _ in outputs if "nanobotd pid" in out]
    try:
        for process, (out, err) in zip((kept, stopped), outputs, strict=True):
            assert process.returncode == 0, out + err
        folders = [re.match(r"== demo in (\S+), nanobotd pid \d+", out).group(1) for out, _ in outputs]
        assert folders[0] != folders[1] and all(Path(folder).parent == tmp_path for folder in folders)
        for folder, (out, _) in zip(folders, outputs, strict=True):
            assert out.count("consolidate r-") == 4 and "left unarchived:       0 messages" in out
            assert re.search(r"^restore r-\S+: restored in ", out, re.MULTILINE)
            assert "undid:                   consolidate run r-" in out
            assert [line for line in out.splitlines() if "/nanobotd-demo." in line
                    and folder not in line] == [], "each demo speaks only of its own folder"
        out = outputs[0][0]
        commands = [line.strip() for line in out.split("Try:", 1)[1].splitlines() if line.startswith("  ")]
        for command in commands:
            hint = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60,
                                  env=demo_env(tmp_path))
            assert hint.returncode == 0, f"{command}: {hint.stderr}"
        kill = re.search(r"Stop it with: kill (\d+)", out)
        assert kill and int(kill.group(1)) == pids[0]
        subprocess.run(["kill", kill.group(1)], check=True)
        status = shlex.split(commands[0])[:-1] + ["status"]
        deadline = time.monotonic() + 20
        while subprocess.run(status, capture_output=True, env=demo_env(tmp_path)).returncode != 2:
            assert time.monotonic() < deadline, "the daemon did not stop"
            time.sleep(0.2)
        assert "nanobotd stopped. Start it again on this demo with:" in outputs[1][0]
    finally:
        for pid in pids:
            stop(pid)
