"""nanobotd/cli/commands/setup.py: `nanobotctl setup nanobot` on a copy of a real nanobot 0.3.5 config."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from nanobotd.cli.commands import setup
from nanobotd.sessions.agent_config import read_agent_settings
from tests.cli.fakedaemon import NANOBOTCTL, run_ctl
from tests.support.daemonproc import REPO

FIXTURE = REPO / "tests" / "fixtures" / "nanobot-0.3.5-config.json"
SOCKET = Path("/run/user/1000/nanobotd/nanobotd.sock")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "nanobot" / "config.json"
    path.parent.mkdir()
    shutil.copyfile(FIXTURE, path)
    path.chmod(0o600)
    return path


def ctl_subprocess(config: Path, *args: str) -> subprocess.CompletedProcess:
    """The installed console script, running this tree: the path it registers is its own."""
    return subprocess.run([str(NANOBOTCTL), "--socket", str(SOCKET), "setup", "nanobot", "--nanobot-config",
                           str(config), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "PYTHONPATH": str(REPO)})


def backups(config: Path) -> list[Path]:
    return sorted(config.parent.glob("config.json.nanobotd-backup-*"))


def test_without_apply_the_change_is_shown_as_a_diff_and_nothing_is_written(config: Path) -> None:
    before = config.read_bytes()
    code, out, err = run_ctl(SOCKET, "setup", "nanobot", "--nanobot-config", str(config))
    assert code == 0
    assert f"--- {config}\n+++ {config} (after nanobotctl setup nanobot)\n" in out
    assert '-        "intervalH": 2,\n+        "intervalH": 87600,\n' in out
    assert f'+        "command": "{NANOBOTCTL}",' in out
    assert f'+          "--socket",\n+          "{SOCKET}"\n' in out
    assert '-    "mcpServers": {},\n' in out
    assert "enabled" not in "".join(line for line in out.splitlines(keepends=True) if line.startswith(("+", "-")))
    assert "Run again with --apply" in out
    assert f"cannot connect to nanobotd at {SOCKET}" in err
    assert config.read_bytes() == before and backups(config) == []


def test_apply_writes_the_change_after_a_backup_and_keeps_everything_else(config: Path) -> None:
    original = json.loads(FIXTURE.read_text())
    applied = ctl_subprocess(config, "--apply")
    assert applied.returncode == 0, applied.stderr
    [backup] = backups(config)
    assert backup.read_bytes() == FIXTURE.read_bytes()
    assert f"Wrote {config} (backup: {backup.name})" in applied.stdout
    written = json.loads(config.read_text())
    assert written["tools"]["mcpServers"] == {"nanobotd": {"command": str(NANOBOTCTL),
                                                           "args": ["mcp", "--socket", str(SOCKET)]}}
    assert written["agents"]["defaults"]["dream"] == {"enabled": True, "intervalH": 87600, "modelOverride": None}
    expected = json.loads(FIXTURE.read_text())
    expected["tools"]["mcpServers"] = written["tools"]["mcpServers"]
    expected["agents"]["defaults"]["dream"]["intervalH"] = 87600
    assert config.read_text() == json.dumps(expected, indent=2, ensure_ascii=False)  # order, indent, "🐈" kept
    assert list(written) == list(original) and list(written["tools"]) == list(original["tools"])
    assert stat.S_IMODE(config.stat().st_mode) == 0o600 and stat.S_IMODE(backup.stat().st_mode) == 0o600
    settings = read_agent_settings(config)
    assert settings.mcp_server_for() == "nanobotd" and not settings.own_dream_runs


def test_running_it_again_changes_nothing_and_says_so(config: Path) -> None:
    assert ctl_subprocess(config, "--apply").returncode == 0
    after_first = config.read_bytes()
    again = ctl_subprocess(config, "--apply")
    assert again.returncode == 0
    assert again.stdout == f"{config} already runs nanobotd beside nanobot: nothing to change.\n"
    assert config.read_bytes() == after_first and len(backups(config)) == 1


@pytest.mark.parametrize("text, message", [
    ('{"agents": {"defaults": {', "cannot parse"),
    ("[1, 2]", "holds JSON but not an object"),
    (b"\xff\xfe{}", "cannot parse"),
    ('{"tools": "none"}', "'tools' in nanobot's config is str, not an object"),
    ('{"agents": {"defaults": {"dream": 7}}}', "'dream' in nanobot's config is int"),
])
def test_a_config_it_cannot_parse_is_refused_and_never_rewritten(config: Path, text, message) -> None:
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, out, err = run_ctl(SOCKET, "setup", "nanobot", "--nanobot-config", str(config), "--apply")
    assert code == 1 and out == ""
    assert message in err and "nothing was written" in err
    assert config.read_bytes() == (text if isinstance(text, bytes) else text.encode()) and backups(config) == []


def test_a_missing_config_is_refused_and_the_default_is_nanobots_home(tmp_path: Path, isolated_paths: Path) -> None:
    code, _, err = run_ctl(SOCKET, "setup", "nanobot")
    assert code == 1 and f"no nanobot config at {isolated_paths / '.nanobot' / 'config.json'}" in err
    assert "nanobot onboard" in err
    (isolated_paths / ".nanobot").mkdir()
    (isolated_paths / ".nanobot" / "config.json").write_text("{}")
    code, out, _ = run_ctl(SOCKET, "setup", "nanobot", "--apply")
    assert code == 0 and json.loads((isolated_paths / ".nanobot" / "config.json").read_text()) == {
        "tools": {"mcpServers": {"nanobotd": {"command": str(NANOBOTCTL), "args": ["mcp", "--socket", str(SOCKET)]}}},
        "agents": {"defaults": {"dream": {"intervalH": 87600}}}}


def test_a_dream_cron_or_disabled_dream_and_an_old_entry_are_set_right(config: Path) -> None:
    config.write_text(json.dumps({
        "agents": {"defaults": {"dream": {"enabled": False, "cron": "0 3 * * *", "interval_h": 2}}},
        "tools": {"mcp_servers": {
            "nanobotd": {"type": "streamableHttp", "url": "http://x", "command": "old", "env": {"A": "1"}},
            "memory": {"command": "/opt/bin/nanobotctl", "args": ["mcp"]}}}}, indent=4) + "\n")
    code, out, err = run_ctl(SOCKET, "setup", "nanobot", "--nanobot-config", str(config), "--apply", "--workspace",
                             "main")
    assert code == 0, err
    written = config.read_text()
    assert written.endswith("}\n") and '\n    "agents": {\n        "defaults"' in written
    data = json.loads(written)
    assert data["agents"]["defaults"]["dream"] == {"enabled": True, "interval_h": 87600}
    assert data["tools"]["mcp_servers"]["nanobotd"] == {
        "command": str(NANOBOTCTL), "env": {"A": "1"}, "args": ["mcp", "--socket", str(SOCKET), "--workspace", "main"]}
    assert "tools.mcpServers.memory also runs nanobotctl mcp" in err
    assert "dream.cron: removed" in out and "dream.enabled: true" in out


def test_a_symlinked_config_keeps_its_link(config: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(config)
    assert run_ctl(SOCKET, "setup", "nanobot", "--nanobot-config", str(link), "--apply")[0] == 0
    assert link.is_symlink() and "87600" in config.read_text() and len(backups(config)) == 1


def test_the_registered_program_is_the_nanobotctl_being_run(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "nanobotctl"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    assert setup.nanobotctl_program(str(script), "/usr/bin/python3") == str(script)
    python = tmp_path / "bin" / "python"
    assert setup.nanobotctl_program("-c", str(python)) == str(script)
