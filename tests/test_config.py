"""Config loading: defaults, overrides, and a dozen bad configs that each exit 2 naming the key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanobotd.config.load import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]

BAD_CONFIGS = [
    ("[daemon]\nlog_levle = 'INFO'\n", "daemon.log_levle"),
    ("[llm]\ntimeout_seconds = 'sixty'\n", "llm.timeout_seconds"),
    ("[consolidation]\nratio = 1.5\n", "consolidation.ratio"),
    ("[dream]\nschedule = '15 4 * * 0'\n", "dream.schedule"),
    ("[lifecycle]\nschedule = 'every night'\n", "lifecycle.schedule"),
    ("[search]\nbackend = 'elastic'\n", "search.backend"),
    ("[daemon]\ntimezone = 'Mars/Olympus'\n", "daemon.timezone"),
    ("[bogus]\nx = 1\n", "bogus"),
    ("[lifecycle]\nactive_days = 2.5\n", "lifecycle.active_days"),
    ("[dream]\nenabled = 'yes'\n", "dream.enabled"),
    ("[[workspaces]]\nsessions_dir = '/tmp'\n", "workspaces[0].path"),
    ("[[workspaces]]\npath = '/tmp/x'\n[workspaces.llm]\nmodle = 'x'\n", "workspaces[0].llm.modle"),
    ("[llm]\ncontext_window = 1000\nmax_tokens = 8192\n", "llm.context_window"),
    ("daemon = 3\n", "daemon"),
    ("[daemon\n", "not valid TOML"),
    ("", "workspaces"),
]


@pytest.mark.parametrize("text,key", BAD_CONFIGS, ids=[key for _, key in BAD_CONFIGS])
def test_bad_config_exits_2_naming_the_key(tmp_path, text, key):
    path = tmp_path / "bad.toml"
    if "workspaces" not in text and key != "workspaces":
        text += f"\n[[workspaces]]\npath = '{tmp_path}'\n"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "nanobotd.cli.nanobotd", "check-config", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert key in proc.stderr


def test_example_config_is_valid_and_documents_every_key(tmp_path):
    example = REPO / "config" / "nanobotd.toml"
    config = load_config(example, environ={"HOME": str(tmp_path)})
    text = example.read_text()
    data = config.to_json()
    for table in ("llm", "consolidation", "dream", "lifecycle", "search", "context"):
        for key in data["workspaces"][0][table]:
            assert f"{key} =" in text, f"{table}.{key} is not documented in the example config"
    for key in data["daemon"]:
        assert f"{key} =" in text


def test_workspace_overrides_and_env_paths(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f"""
[llm]
model = "openai/gpt-4o-mini"
api_key_env = "MY_KEY"
[[workspaces]]
path = "{tmp_path}/a"
[[workspaces]]
path = "{tmp_path}/b"
name = "bee"
[workspaces.llm]
model = "none"
""")
    config = load_config(path, environ={"MY_KEY": "sk-secret", "STATE_DIRECTORY": "/var/lib/nanobotd",
                                        "RUNTIME_DIRECTORY": "/run/nanobotd"})
    first, second = config.workspaces
    assert first.llm.model == "openai/gpt-4o-mini" and first.api_key == "sk-secret"
    assert second.name == "bee" and second.llm.model == "none"
    assert config.state_dir == Path("/var/lib/nanobotd")
    assert config.socket_path == Path("/run/nanobotd/nanobotd.sock")
    assert "sk-secret" not in json.dumps(config.to_json())


def test_run_with_a_workspace_and_no_config_file(tmp_path):
    config = load_config(None, workspace_args=[str(tmp_path)], environ={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert config.workspaces[0].path == tmp_path
    assert config.socket_path == tmp_path / "nanobotd" / "nanobotd.sock"
    assert config.workspaces[0].llm.model == "none"


def test_missing_config_file_is_named():
    with pytest.raises(ConfigError, match="not found"):
        load_config(Path("/nonexistent/nanobotd.toml"))
