"""Fault points armed through the environment: a typo fails loudly, an armed point does what it says."""

from __future__ import annotations

import errno
import subprocess
import sys
import threading
import time

import pytest

from nanobotd.faults import ENV_NAME, FaultAbort, FaultPoints


def test_an_unarmed_point_does_nothing_and_an_enospc_point_raises_a_full_disk_error():
    faults = FaultPoints.from_environ({ENV_NAME: "a.step=enospc"})
    FaultPoints.from_environ({}).reach("a.step")
    faults.reach("another.step")
    with pytest.raises(OSError) as raised:
        faults.reach("a.step")
    assert raised.value.errno == errno.ENOSPC


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="must be one of kill, enospc"):
        FaultPoints.from_environ({ENV_NAME: "a.step=explode"})


def test_an_abort_point_passes_every_exception_handler():
    faults = FaultPoints.from_environ({ENV_NAME: "a.step=abort"})
    with pytest.raises(FaultAbort, match="a.step"):
        try:
            faults.reach("a.step")
        except Exception:  # a handler of the code under test: not what an abort stops at
            pytest.fail("caught as an Exception")


def test_a_kill_point_ends_the_process_with_sigkill():
    code = "from nanobotd.faults import FaultPoints; FaultPoints({'x': 'kill'}).reach('x'); print('alive')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == -9 and "alive" not in result.stdout


def test_a_hold_point_waits_until_its_file_exists(tmp_path):
    release = tmp_path / "go"
    faults = FaultPoints.from_environ({ENV_NAME: f"a.step=hold:{release}"})
    threading.Timer(0.3, release.touch).start()
    started = time.monotonic()
    faults.reach("a.step")
    assert release.exists() and time.monotonic() - started >= 0.25
