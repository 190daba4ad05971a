"""Driving the real `nanobotctl` console script the way a user does: a subprocess, in a pipe or on a pty."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NANOBOTCTL = Path(sys.executable).with_name("nanobotctl")


def user_env() -> dict:
    """The caller's environment, importing this checkout's nanobotd."""
    return dict(os.environ, PYTHONPATH=str(REPO))


def nanobotctl(daemon, *args: str, timeout: float = 60, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`nanobotctl --socket S ARGS` in a pipe, run in *cwd*: exit code, stdout and stderr as text."""
    return subprocess.run([str(NANOBOTCTL), "--socket", str(daemon.socket), *args], capture_output=True, text=True,
                          timeout=timeout, env=user_env(), cwd=cwd)


def nanobotctl_json(daemon, *args: str) -> dict:
    """`nanobotctl --json ARGS`, which must succeed; its answer parsed."""
    proc = nanobotctl(daemon, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def on_a_terminal(daemon, *args: str, interrupt_after: float | None = None,
                  timeout: float = 60) -> tuple[int, str]:
    """`nanobotctl ARGS` with a pseudo-terminal as stdin, stdout and stderr: exit code and everything shown.

    With *interrupt_after*, Ctrl-C is sent that many seconds in (as the terminal does: SIGINT to the process).
    """
    leader, follower = pty.openpty()
    proc = subprocess.Popen([str(NANOBOTCTL), "--socket", str(daemon.socket), *args], stdin=follower,
                            stdout=follower, stderr=follower, env=dict(user_env(), TERM="xterm", COLUMNS="120"),
                            cwd=REPO, close_fds=True)
    os.close(follower)
    shown = bytearray()
    began = time.monotonic()
    interrupted = False
    try:
        while True:
            if interrupt_after is not None and not interrupted and time.monotonic() - began >= interrupt_after:
                proc.send_signal(signal.SIGINT)
                interrupted = True
            ready, _, _ = select.select([leader], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the other side closed: the process is gone
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                shown.extend(chunk)
            elif proc.poll() is not None:
                break
            if time.monotonic() - began > timeout:
                proc.kill()
                raise AssertionError(f"nanobotctl did not end in {timeout}s: {bytes(shown)!r}")
    finally:
        os.close(leader)
    return proc.wait(timeout=10), shown.decode("utf-8", errors="replace")
