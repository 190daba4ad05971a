"""nanobotd/cli/nanobotd.py: the daemon's command line, down to a real daemon started without a command."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nanobotd.cli import nanobotd

NANOBOTD = Path(sys.executable).with_name("nanobotd")
NANOBOTCTL = Path(sys.executable).with_name("nanobotctl")
READY_SECONDS = 30


@pytest.fixture
def short_dir():
    """A directory under /tmp whose socket paths stay within the AF_UNIX limit."""
    base = Path(tempfile.mkdtemp(prefix="nbd-", dir="/tmp"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def wait_until_status_answers(daemon: subprocess.Popen, socket_path: Path, log_path: Path) -> None:
    """Poll `nanobotctl status` until the daemon answers; fail with its log when it dies or never does."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        assert daemon.poll() is None, f"nanobotd exited with {daemon.returncode}:\n{log_path.read_text()}"
        status = subprocess.run([str(NANOBOTCTL), "--socket", str(socket_path), "status"],
                                capture_output=True, text=True, timeout=30)
        if status.returncode == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"nanobotd did not answer in {READY_SECONDS}s:\n{log_path.read_text()}")


def test_nanobotd_with_only_a_config_runs_the_daemon_and_stops_cleanly_on_sigterm(tmp_path: Path,
                                                                                 short_dir: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    socket_path = short_dir / "nanobotd.sock"
    config = tmp_path / "nanobotd.toml"
    config.write_text(f'[daemon]\nsocket = "{socket_path}"\nstate_dir = "{tmp_path / "state"}"\n\n'
                      f'[[workspaces]]\npath = "{workspace}"\n')
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen([str(NANOBOTD), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_status_answers(daemon, socket_path, log_path)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0, log_path.read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=10)


def test_without_a_command_the_parser_gives_run_and_its_defaults() -> None:
    args = nanobotd.build_parser().parse_args(["--config", "nanobotd.toml"])
    assert (args.command, args.config, args.sub_config, args.workspace, args.polling) == (
        "run", Path("nanobotd.toml"), None, [], False)


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_the_config_option_of_each_command_is_shown_as_a_file(command: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        nanobotd.main([command, "--help"])
    help_text = capsys.readouterr().out
    assert "--config FILE" in help_text
    assert "SUB_CONFIG" not in help_text


def _config(tmp_path: Path, short_dir: Path):
    from nanobotd.config.load import load_config

    workspace = tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    path = tmp_path / "nanobotd.toml"
    path.write_text(f'[daemon]\nsocket = "{short_dir / "nanobotd.sock"}"\nstate_dir = "{tmp_path / "state"}"\n\n'
                    f'[[workspaces]]\npath = "{workspace}"\nname = "ws"\n'
                    f'[workspaces.consolidation]\nmode = "owner"\n[workspaces.llm]\nmodel = "gpt-4o"\n')
    return load_config(path)


def test_a_config_with_parse_processes_still_loads_and_is_told_the_key_is_ignored(tmp_path: Path,
                                                                                short_dir: Path) -> None:
    import dataclasses

    config = _config(tmp_path, short_dir)
    assert not any("parse_processes" in warning for warning in nanobotd.config_warnings(config))
    config = dataclasses.replace(config, daemon=dataclasses.replace(config.daemon, parse_processes=2))
    assert any("daemon.parse_processes is deprecated" in warning for warning in nanobotd.config_warnings(config))
