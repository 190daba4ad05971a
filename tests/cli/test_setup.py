"""nanobotd/cli/commands/setup.py: `nanobotctl setup nanobot` on a copy of a real nanobot 0.3.5 config."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from nanobotd.cli.commands import setup
from nanobotd.config import paths
from nanobotd.sessions.agent_config import read_agent_settings
from tests.cli.fakedaemon import NANOBOTCTL, run_ctl
from tests.cli.twoworkspaces import SECRET
from tests.support.daemonproc import REPO

FIXTURE = REPO / "tests" / "fixtures" / "nanobot-0.3.5-config.json"
SOCKET = Path("/run/user/1000/nanobotd/nanobotd.sock")
WORKSPACE = "/home/user/.nanobot/workspace"  # the fixture's agents.defaults.workspace


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
    assert (f'+          "--socket",\n+          "{SOCKET}",\n'
            f'+          "--workspace",\n+          "{WORKSPACE}"\n') in out
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
    assert written["tools"]["mcpServers"] == {"nanobotd": {"command": str(NANOBOTCTL), "args": [
        "mcp", "--socket", str(SOCKET), "--workspace", WORKSPACE]}}
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



def test_the_entry_as_nanobot_writes_it_back_after_a_refresh_is_left_as_it_is(config: Path) -> None:
    """nanobot saves its config (`nanobot onboard`'s refresh) with every field of the entry it loaded, the HTTP ones
    empty; those belong to a stdio entry as well, so a second run finds nothing to change."""
    assert ctl_subprocess(config, "--apply").returncode == 0
    data = json.loads(config.read_text())
    entry = data["tools"]["mcpServers"]["nanobotd"]
    data["tools"]["mcpServers"]["nanobotd"] = {"type": None, "auth": None, **entry, "env": {}, "cwd": "", "url": "",
                                               "headers": {}, "toolTimeout": 30, "enabledTools": ["*"]}
    config.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    refreshed = config.read_bytes()
    again = ctl_subprocess(config, "--apply")
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{config} already runs nanobotd beside nanobot: nothing to change.\n"
    assert config.read_bytes() == refreshed and len(backups(config)) == 1


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
        "tools": {"mcpServers": {"nanobotd": {"command": str(NANOBOTCTL), "args": [
            "mcp", "--socket", str(SOCKET), "--workspace", str(isolated_paths / ".nanobot" / "workspace")]}}},
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


def limited_ctl(config: Path, *args: str) -> subprocess.CompletedProcess:
    """ctl_subprocess under a 1 GiB address-space limit, so reading /dev/zero without bound fails fast."""
    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([str(NANOBOTCTL), "--socket", str(SOCKET), "setup", "nanobot", "--nanobot-config",
                           str(config), *args], capture_output=True, text=True, timeout=60, preexec_fn=limit_memory,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("make, kind", [
    (lambda path: os.mkfifo(path), "a FIFO"),
    (lambda path: path.symlink_to("/dev/zero"), "a character device"),
    (lambda path: path.mkdir(), "a directory"),
], ids=["fifo", "dev-zero", "folder"])
def test_a_fifo_a_link_to_dev_zero_and_a_folder_are_refused_without_reading_them(tmp_path: Path, make,
                                                                                 kind) -> None:
    path = tmp_path / "config.json"
    make(path)
    result = limited_ctl(path, "--apply")
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert f"{path} is {kind}, not a regular file; is it nanobot's config.json? Nothing was written" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("text, message", [
    ('{"tools": {}, "tools": {"mcpServers": {}}}', "the key 'tools' appears twice in one object"),
    ('{"agents": {"defaults": {"temperature": 1e400}}}', "the number 1e400 is too large for a 64-bit float"),
    ('{"agents": {"defaults": {"temperature": NaN}}}', "it holds NaN, which is not JSON"),
    ('{"agents": {"defaults": {"model": "a\\ud800b"}}}', "holds a lone surrogate, which is not text"),
    ('{"channels": {"\\udc80": {}}}', "holds a lone surrogate, which is not text"),
    ('{"x": ' + "[" * 100 + "]" * 100 + "}", "it nests deeper than 64 levels"),
    ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "it nests deeper than 64 levels"),
    ("{}" + " " * (4 * 1024 * 1024), "is larger than 4194304 bytes"),
], ids=["duplicate-key", "1e400", "nan", "surrogate-value", "surrogate-key", "nesting-100", "nesting-100000",
        "over-4-mib"])
def test_what_could_not_be_written_back_as_it_is_is_refused(config: Path, text: str, message: str) -> None:
    config.write_text(text)
    code, out, err = run_ctl(SOCKET, "setup", "nanobot", "--nanobot-config", str(config), "--apply")
    assert code == 1 and out == "", err
    assert message in err and "othing was written" in err
    assert config.read_text() == text and backups(config) == []


def test_crlf_tabs_and_compact_arrays_are_kept_and_only_the_changed_keys_are_rewritten(config: Path) -> None:
    lines = ['{', '\t"agents": {', '\t\t"defaults": {', '\t\t\t"workspace": "/srv/agent",',
             '\t\t\t"dream": {"intervalH": 2, "cron": "0 3 * * *"}', '\t\t}', '\t},',
             '\t"channels": {"telegram": {"allowFrom": ["ann", "bob"], "name": "Zoë"}},',
             '\t"tools": {', '\t\t"mcpServers": {', '\t\t\t"web": {"command": "npx", "args": ["-y", "web"]}',
             '\t\t}', '\t}', '}', '']
    original = "\r\n".join(lines)
    config.write_bytes(original.encode())
    result = ctl_subprocess(config, "--apply")
    assert result.returncode == 0, result.stderr
    entry = {"command": str(NANOBOTCTL), "args": ["mcp", "--socket", str(SOCKET), "--workspace", "/srv/agent"]}
    rendered = json.dumps(entry, indent="\t", ensure_ascii=False).replace("\n", "\r\n\t\t\t")
    expected = original.replace('"dream": {"intervalH": 2, "cron": "0 3 * * *"}', '"dream": {"intervalH": 87600}')
    expected = expected.replace('["-y", "web"]}\r\n', f'["-y", "web"]}},\r\n\t\t\t"nanobotd": {rendered}\r\n')
    assert config.read_bytes().decode() == expected


def test_a_one_line_config_stays_on_one_line(config: Path) -> None:
    config.write_text('{"agents":{"defaults":{"workspace":"/srv/a","dream":{"intervalH":2}}},"tools":{}}')
    assert ctl_subprocess(config, "--apply").returncode == 0
    assert config.read_text() == (
        '{"agents":{"defaults":{"workspace":"/srv/a","dream":{"intervalH":87600}}},"tools":{"mcpServers":'
        f'{{"nanobotd":{{"command":"{NANOBOTCTL}","args":["mcp","--socket","{SOCKET}","--workspace","/srv/a"]}}}}}}}}')


def test_the_entry_is_bound_to_the_configs_workspace_and_its_server_refuses_another(two_workspaces,
                                                                                   config: Path) -> None:
    data = json.loads(config.read_text())
    data["agents"]["defaults"]["workspace"] = str(two_workspaces.other)
    config.write_text(json.dumps(data, indent=2))
    socket = str(two_workspaces.daemon.socket)
    applied = subprocess.run([str(NANOBOTCTL), "--socket", socket, "setup", "nanobot", "--nanobot-config",
                              str(config), "--apply"], capture_output=True, text=True, timeout=30,
                             env={"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "PYTHONPATH": str(REPO)})
    assert applied.returncode == 0 and applied.stderr == "", applied.stderr
    entry = json.loads(config.read_text())["tools"]["mcpServers"]["nanobotd"]
    assert entry["args"] == ["mcp", "--socket", socket, "--workspace", str(two_workspaces.other)]
    own, foreign = run_entry(entry, [("memory_context", {"session_key": "telegram:other"}),
                                     ("memory_context", {"session_key": "telegram:home"})])
    assert SECRET in own
    assert foreign == ("nanobotd could not answer: session 'telegram:home' belongs to another workspace, not "
                       "'other'; this request may read only workspace 'other'")


def test_a_workspace_the_daemon_does_not_manage_is_warned_about(two_workspaces, config: Path) -> None:
    code, _, err = run_ctl(two_workspaces.daemon.socket, "setup", "nanobot", "--nanobot-config", str(config))
    assert code == 0
    assert f"nanobotd does not manage the workspace {WORKSPACE} (no workspace named '{WORKSPACE}'" in err


def run_entry(entry: dict, calls: list[tuple[str, dict]]) -> list[str]:
    """Start the MCP server exactly as the written entry says, as nanobot would, and make *calls*."""
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env={"PYTHONPATH": str(REPO)})

    async def session() -> list[str]:
        async with stdio_client(params) as (read_stream, write_stream):
            async with ClientSession(read_stream, write_stream) as client:
                await client.initialize()
                results = [await client.call_tool(name, arguments) for name, arguments in calls]
                return ["\n".join(block.text for block in result.content) for result in results]

    return asyncio.run(asyncio.wait_for(session(), 60))



@pytest.mark.parametrize("named", ["notes/ws", "~/notes/ws", "~", "/srv/agent/ws"])
def test_the_entry_names_the_workspace_the_daemon_reads_from_the_same_config(tmp_path: Path, monkeypatch,
                                                                            named: str) -> None:
    home = tmp_path / "home"
    config = home / ".nanobot" / "config.json"
    config.parent.mkdir(parents=True)
    data = json.loads(FIXTURE.read_text())
    data["agents"]["defaults"]["workspace"] = named
    config.write_text(json.dumps(data, indent=2))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    daemon_reads, _ = paths.nanobot_workspace({"HOME": str(home)})
    code, out, err = run_ctl(SOCKET, "setup", "nanobot")
    assert code == 0 and f"--workspace {os.path.abspath(daemon_reads)}`" in out, out
    assert ("is the relative path 'notes/ws'" in err) == (named == "notes/ws"), err

