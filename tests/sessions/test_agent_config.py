"""Reading the agent's own settings from nanobot's config.json."""

from __future__ import annotations

import json
from pathlib import Path

from nanobotd.sessions.agent_config import AgentSettings, find_agent_config, read_agent_settings

REAL_CONFIG = Path(__file__).parent.parent / "fixtures" / "nanobot-0.3.5-config.json"


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def test_the_config_nanobot_onboard_writes_gives_its_documented_defaults():
    settings = read_agent_settings(REAL_CONFIG)
    assert settings.error is None
    assert (settings.context_window, settings.max_tokens, settings.idle_compact_minutes) == (200000, 8192, 15)
    assert settings.budget == 200000 - 8192 - 1024
    assert settings.dream_enabled and settings.dream_interval_hours == 2 and settings.own_dream_runs
    assert settings.mcp_servers == {} and settings.mcp_server_for() is None


def test_the_active_model_preset_sets_the_window_and_max_tokens(tmp_path):
    path = write(tmp_path / "config.json", {
        "agents": {"defaults": {"modelPreset": "small", "contextWindowTokens": 200000, "maxTokens": 8192}},
        "modelPresets": {"small": {"model": "x", "contextWindowTokens": 32000, "maxTokens": 2048}}})
    settings = read_agent_settings(path)
    assert (settings.context_window, settings.max_tokens, settings.budget) == (32000, 2048, 32000 - 2048 - 1024)


def test_snake_case_keys_and_a_long_dream_interval_are_understood(tmp_path):
    path = write(tmp_path / "config.json", {"agents": {"defaults": {
        "context_window_tokens": 64000, "max_tokens": 4000, "idle_compact_after_minutes": 0,
        "dream": {"interval_h": 87600}}}})
    settings = read_agent_settings(path)
    assert (settings.context_window, settings.max_tokens, settings.idle_compact_minutes) == (64000, 4000, 0)
    assert not settings.own_dream_runs


def test_a_registered_nanobotctl_mcp_server_is_recognised_by_its_command(tmp_path):
    path = write(tmp_path / "config.json", {"tools": {"mcpServers": {
        "other": {"command": "npx", "args": ["something"]},
        "memory": {"command": "/opt/nanobotd/bin/nanobotctl", "args": ["mcp", "--socket", "/run/x.sock"]}}}})
    settings = read_agent_settings(path)
    assert settings.mcp_server_for() == "memory"
    assert settings.to_json()["mcp_servers"] == ["memory", "other"]


def test_a_broken_or_odd_config_gives_defaults_and_says_why(tmp_path):
    assert "cannot read" in read_agent_settings(write(tmp_path / "a.json", "{not json")).error
    assert "JSON object" in read_agent_settings(write(tmp_path / "b.json", "[1, 2]")).error
    odd = read_agent_settings(write(tmp_path / "c.json", {"agents": {"defaults": {
        "maxTokens": "many", "contextWindowTokens": -5, "dream": {"enabled": "no"}}}}))
    assert odd.error is None and (odd.max_tokens, odd.context_window) == (8192, 200000) and odd.dream_enabled
    assert read_agent_settings(None) == AgentSettings(path=None)


def test_config_json_is_found_beside_the_sessions_folder_in_use(tmp_path):
    config = write(tmp_path / "nb" / "config.json", {})
    sessions = tmp_path / "nb" / "sessions" / ("a" * 32)
    sessions.mkdir(parents=True)
    assert find_agent_config([sessions], []) == config
    assert find_agent_config([tmp_path / "ws" / "sessions"], [tmp_path / "nb"]) == config
    assert find_agent_config([tmp_path / "ws" / "sessions"], [tmp_path / "elsewhere"]) is None
