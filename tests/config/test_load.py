"""Config loading: defaults, the documented example, workspace overrides and environment paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanobotd.config.load import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


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
