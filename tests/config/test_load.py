"""Config loading: defaults, the documented example, workspace overrides and environment paths."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanobotd.config.load import ConfigError, build_config, load_config

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


def check_config_exit(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    """Run `nanobotd check-config` on *text*: its exit status and what it printed to stderr."""
    from nanobotd.cli.nanobotd import main

    path = tmp_path / "conf" / "nanobotd.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    status = main(["check-config", "--config", str(path)])
    return status, capsys.readouterr().err


@pytest.mark.parametrize("daemon, key", [
    ("debounce_seconds = nan", "daemon.debounce_seconds"),
    ("debounce_seconds = inf", "daemon.debounce_seconds"),
    ("debounce_seconds = 0", "daemon.debounce_seconds"),
    ("debounce_seconds = 1e300", "daemon.debounce_seconds"),
    ("reconcile_seconds = -inf", "daemon.reconcile_seconds"),
    ("reconcile_seconds = 1e12", "daemon.reconcile_seconds"),
    ("job_stop_seconds = 0", "daemon.job_stop_seconds"),
    ("job_stop_seconds = nan", "daemon.job_stop_seconds"),
    ("parse_processes = -1", "daemon.parse_processes"),
    ("parse_processes = 1.5", "daemon.parse_processes"),
    ("parse_processes = 1000", "daemon.parse_processes"),
])
def test_a_daemon_number_that_is_nan_inf_zero_or_huge_exits_2_naming_the_key(tmp_path, capsys, daemon, key):
    status, err = check_config_exit(tmp_path, f"[daemon]\n{daemon}\n[[workspaces]]\npath = \"ws\"\n", capsys)
    assert status == 2 and key in err and "Traceback" not in err


@pytest.mark.parametrize("table, line, key", [
    ("llm", "timeout_seconds = 0", "llm.timeout_seconds"),
    ("llm", "timeout_seconds = nan", "llm.timeout_seconds"),
    ("llm", "max_retries = 100000000000", "llm.max_retries"),
    ("llm", "idle_exit_seconds = 0", "llm.idle_exit_seconds"),
    ("search", "debounce_seconds = inf", "search.debounce_seconds"),
    ("search", "qmd_timeout_seconds = 0", "search.qmd_timeout_seconds"),
    ("consolidation", "idle_minutes = 0", "consolidation.idle_minutes"),
    ("lifecycle", "active_days = 100", "lifecycle.active_days"),
])
def test_a_workspace_number_out_of_range_exits_2_naming_the_key(tmp_path, capsys, table, line, key):
    status, err = check_config_exit(tmp_path, f"[{table}]\n{line}\n[[workspaces]]\npath = \"ws\"\n", capsys)
    assert status == 2 and key in err


def test_a_per_workspace_override_out_of_range_names_the_workspace(tmp_path, capsys):
    text = "[[workspaces]]\npath = \"ws\"\n[workspaces.llm]\ntimeout_seconds = -1\n"
    status, err = check_config_exit(tmp_path, text, capsys)
    assert status == 2 and "workspaces[0].llm.timeout_seconds" in err


def test_a_state_dir_that_is_a_file_exits_2_naming_the_key(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    for state_dir in (tmp_path / "afile", tmp_path / "afile" / "below"):
        status, err = check_config_exit(tmp_path, f"[daemon]\nstate_dir = \"{state_dir}\"\n[[workspaces]]\n"
                                                  "path = \"ws\"\n", capsys)
        assert status == 2 and "daemon.state_dir" in err and "is a file" in err


def test_a_workspace_path_that_is_a_file_exits_2_naming_the_key(tmp_path, capsys):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "ws").write_text("not a folder")
    status, err = check_config_exit(tmp_path, "[[workspaces]]\npath = \"ws\"\n", capsys)
    assert status == 2 and "workspaces[0].path" in err


@pytest.mark.parametrize("text, key", [
    ("[[workspaces]]\npath = \"ws\\u0000evil\"\n", "workspaces[0].path"),
    ("[daemon]\nstate_dir = \"/tmp/a\\u0000b\"\n[[workspaces]]\npath = \"ws\"\n", "daemon.state_dir"),
    ("[daemon]\nsocket = \"/tmp/s\\u0000\"\n[[workspaces]]\npath = \"ws\"\n", "daemon.socket"),
    ("[[workspaces]]\npath = \"ws\"\nsessions_dir = \"s\\u0000\"\n", "workspaces[0].sessions_dir"),
    ("[search]\nqmd_command = \"qmd\\u0000\"\n[[workspaces]]\npath = \"ws\"\n", "search.qmd_command"),
])
def test_a_nul_in_a_path_or_command_exits_2_naming_the_key(tmp_path, capsys, text, key):
    status, err = check_config_exit(tmp_path, text, capsys)
    assert status == 2 and key in err and "NUL" in err


def test_relative_paths_resolve_against_the_config_files_folder_not_the_current_one(tmp_path, monkeypatch):
    folder = tmp_path / "etc"
    folder.mkdir()
    config_path = folder / "nanobotd.toml"
    config_path.write_text("[daemon]\nstate_dir = \"state\"\nsocket = \"run/n.sock\"\n"
                           "[[workspaces]]\npath = \"../ws\"\nsessions_dir = \"sessions\"\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(config_path, environ={"HOME": str(tmp_path)})
    assert config.state_dir == folder / "state"
    assert config.socket_path == folder / "run" / "n.sock"
    assert config.workspaces[0].path == folder / ".." / "ws"
    assert config.workspaces[0].sessions_dir == folder / "sessions"
    assert "folder of this file" in (REPO / "config" / "nanobotd.toml").read_text()


def test_a_workspace_argument_still_resolves_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(None, workspace_args=["ws"], environ={"HOME": str(tmp_path)})
    assert config.workspaces[0].path == tmp_path / "ws"


KNOWN_KEYS = {
    "daemon": ["socket", "state_dir", "log_level", "reconcile_seconds", "debounce_seconds", "timezone",
               "job_stop_seconds", "socket_group", "parse_processes"],
    "llm": ["model", "timeout_seconds", "max_retries", "concurrency", "context_window", "max_tokens"],
    "consolidation": ["ratio", "idle_minutes", "mode", "chunk_ratio_min", "chunk_ratio_max", "raw_max_chars"],
    "lifecycle": ["schedule", "active_days", "ttl_days", "max_history_entries"],
    "search": ["backend", "qmd_command", "debounce_seconds", "qmd_timeout_seconds"],
    "dream": ["schedule", "max_iterations", "enabled"],
}
SCALARS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.text(max_size=12), st.sampled_from(["", "~", "ws", "../x", "/", "a\x00b", "15 4 * * *"]),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2), st.dictionaries(st.text(max_size=4), SCALARS, max_size=2))


@st.composite
def config_data(draw):
    """A config as TOML would parse it: known tables and keys with any values, and some stray keys."""
    data = {}
    for table, keys in KNOWN_KEYS.items():
        if draw(st.booleans()):
            data[table] = {key: draw(VALUES) for key in draw(st.lists(st.sampled_from(keys), max_size=3))}
    if draw(st.booleans()):
        data[draw(st.text(max_size=6))] = draw(VALUES)
    workspaces = draw(st.lists(st.one_of(
        st.fixed_dictionaries({"path": st.one_of(st.sampled_from(["ws", "/tmp/ws", "~/w"]), SCALARS)}),
        VALUES), max_size=2))
    data["workspaces"] = draw(st.one_of(st.just(workspaces), VALUES))
    return data


@settings(max_examples=150, deadline=None)
@given(data=config_data())
@example(data={":": 0, "workspaces": []})  # a key holding the ':' that ends the key in the message
@example(data={"": 0, "workspaces": []})
def test_any_config_ends_in_a_config_or_a_config_error_naming_a_key(data):
    try:
        config = build_config(data, source=None, workspace_args=[], environ={"HOME": "/nonexistent-home"})
    except ConfigError as exc:
        assert str(exc).split(":", 1)[0], "the message starts with the key"
        return
    assert config.workspaces and math.isfinite(config.daemon.debounce_seconds)
    assert config.daemon.debounce_seconds > 0 and config.daemon.reconcile_seconds >= 1
    for workspace in config.workspaces:
        assert workspace.path.is_absolute() and "\x00" not in str(workspace.path)
        assert workspace.lifecycle.active_days <= workspace.lifecycle.ttl_days


def test_a_workspace_argument_naming_a_configured_folder_keeps_its_table(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(f"""
[llm]
model = "openai/gpt-4o-mini"
[[workspaces]]
path = "{tmp_path}/a"
name = "alpha"
[workspaces.consolidation]
mode = "owner"
[[workspaces]]
path = "{tmp_path}/b"
""")
    config = load_config(path, workspace_args=[str(tmp_path / "a" / ".." / "a"), str(tmp_path / "c")],
                         environ={"HOME": str(tmp_path)})
    first, second = config.workspaces
    assert (first.name, first.consolidation.mode, first.llm.model) == ("alpha", "owner", "openai/gpt-4o-mini")
    assert second.path == tmp_path / "c" and second.llm.model == "openai/gpt-4o-mini"
    assert config.workspace_args == (str(tmp_path / "a" / ".." / "a"), str(tmp_path / "c"))
    assert f"config file {path} read" in config.origin


def test_the_default_config_file_is_read_with_a_workspace_argument(tmp_path):
    config_dir = tmp_path / "xdg" / "nanobotd"
    config_dir.mkdir(parents=True)
    (config_dir / "config.toml").write_text('[llm]\nmodel = "openai/x"\n')
    config = load_config(None, workspace_args=[str(tmp_path)],
                         environ={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert config.source == config_dir / "config.toml" and config.workspaces[0].llm.model == "openai/x"


@pytest.mark.parametrize("named", ["~/bots/ws", "bots/ws", None])
def test_with_no_workspace_anywhere_nanobots_own_is_taken(tmp_path, named):
    home = tmp_path / "home-dir"
    workspace = home / ("bots/ws" if named else ".nanobot/workspace")
    workspace.mkdir(parents=True)
    defaults = {"workspace": named} if named else {}
    (home / ".nanobot").mkdir(exist_ok=True)
    (home / ".nanobot" / "config.json").write_text(json.dumps({"agents": {"defaults": defaults}}))
    config = load_config(None, environ={"HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert [ws.path for ws in config.workspaces] == [workspace]
    assert config.workspace_args == () and "no config file found" in config.origin
    assert str(home / ".nanobot" / "config.json") in config.origin


def test_with_no_workspace_anywhere_the_error_names_what_was_looked_for(tmp_path):
    with pytest.raises(ConfigError, match=r"no config file found.*\.nanobot/workspace, which does not exist"):
        load_config(None, environ={"HOME": str(tmp_path / "empty"), "XDG_CONFIG_HOME": str(tmp_path / "none")})
