"""A daemon told to stop while a qmd child starts, indexes, serves or searches exits in bounded time, and leaves
no qmd (or node, or anything else it started) behind.

The qmd command is a launcher script given by config, as a packaged qmd is (a shell script that starts node):
it hangs at one chosen command with a grandchild of its own, and runs the real qmd for every other one. The
real `qmd mcp --http` it starts is a node grandchild, not exec'd, so a kill of the launcher alone leaves it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.observe import stat_fields
from tests.support.workspace import make_workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
QMD_BINARY = REPO_ROOT / ".qmd-prefix" / "bin" / "qmd"
STOP_SECONDS = 15  # a bound, not a figure: the daemon's own grace periods are a few seconds
pytestmark = pytest.mark.skipif(not os.access(QMD_BINARY, os.X_OK), reason=f"qmd not installed at {QMD_BINARY}")


def slow_launcher(folder: Path, hang_at: tuple[str, ...]) -> Path:
    """A qmd launcher that hangs at the commands *hang_at* (its pid and its grandchild's go to `hung-<command>`),
    runs the real qmd as a child (not exec'd) for `mcp`, and execs it for everything else."""
    script, words = folder / "slow-qmd", " ".join(hang_at)
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--index" ]; then word="$3"; else word="$1"; fi\n'
        f'case " {words} " in *" $word "*)\n'
        f'  sleep 1000 & echo "$$ $!" >> "{folder}/hung-$word"; wait; exit 0 ;;\n'
        "esac\n"
        f'if [ "$word" = mcp ]; then "{QMD_BINARY}" "$@"; exit $?; fi\n'
        f'exec "{QMD_BINARY}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def processes_of(state_dir: Path) -> list[str]:
    """Live processes (not zombies) whose environment points QMD at *state_dir*: every qmd child and its own."""
    marker = f"QMD_CONFIG_DIR={state_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
            if marker in environ and stat_fields(entry)[0] != "Z":
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry}: {command[:120]}")
        except (OSError, IndexError):
            continue
    return found


@pytest.mark.parametrize("hang_at", [("--version",), ("update",), ("mcp",), ("mcp", "search")],
                         ids=["start", "update", "mcp-server-start", "search"])
def test_sigterm_while_a_qmd_child_hangs_stops_the_daemon_and_every_qmd_process(tmp_path, daemon_process, hang_at):
    workspace, _ = make_workspace(tmp_path, layout="current")
    launcher = slow_launcher(tmp_path, hang_at)
    daemon = daemon_process(workspace, extra_config=f"""
[search]
backend = "qmd"
debounce_seconds = 0.2
qmd_timeout_seconds = 600
qmd_command = "{launcher}"
""")
    daemon.start()
    if hang_at[0] == "mcp":  # the server starts with the first search; the CLI answers (or hangs) meanwhile
        daemon.wait_for(lambda: "serves" in daemon.log(), timeout=60)
        threading.Thread(target=daemon.api, args=("/v1/search?q=kestrel",), kwargs={"timeout": 60},
                         daemon=True).start()
    hung = tmp_path / f"hung-{hang_at[-1]}"
    daemon.wait_for(lambda: hung.exists() and hung.read_text().strip(), timeout=60)
    time.sleep(0.5)  # the daemon is now awaiting the hung child
    assert processes_of(daemon.state_dir), "the test found none of the daemon's qmd processes"

    began = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    try:
        daemon.proc.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"daemon still running {STOP_SECONDS}s after SIGTERM:\n{daemon.log()[-3000:]}") from None
    elapsed = time.monotonic() - began
    left = left_after(daemon.state_dir, 3)
    assert not left, f"qmd processes outlived the daemon (stopped in {elapsed:.1f}s): {left}"
    assert daemon.proc.returncode == 0, daemon.log()[-3000:]


def test_a_daemon_killed_outright_takes_its_qmd_mcp_server_along(tmp_path, daemon_process):
    workspace, _ = make_workspace(tmp_path, layout="current")
    daemon = daemon_process(workspace, extra_config=f"""
[search]
backend = "qmd"
debounce_seconds = 0.2
qmd_command = "{QMD_BINARY}"
""").start()
    daemon.wait_for(lambda: "serves" in daemon.log(), timeout=60)
    daemon.api("/v1/search?q=kestrel")  # the server starts with the first search
    daemon.wait_for(lambda: "qmd mcp server ready" in daemon.log(), timeout=60)

    daemon.kill()

    left = left_after(daemon.state_dir, 5)
    assert not left, f"qmd processes outlived a SIGKILLed daemon: {left}"


def left_after(state_dir: Path, seconds: float) -> list[str]:
    """The daemon's qmd processes still there after *seconds* of waiting for them to go; each is then killed, so a
    failing test leaves none behind."""
    deadline = time.monotonic() + seconds
    while processes_of(state_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = processes_of(state_dir)
    for line in left:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    return left
