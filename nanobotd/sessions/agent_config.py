"""The agent's own settings, read from nanobot's config.json: how big its prompt may grow, when it compacts.

nanobot keeps config.json in the folder that holds `sessions/` (`<config dir>/sessions/<workspace-id>/`).
Keys are camelCase or snake_case; the active model preset overrides the window and max tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanobotd import fsio

CONFIG_NAME = "config.json"
DEFAULT_CONTEXT_WINDOW = 200_000
DEFAULT_MAX_TOKENS = 8192
DEFAULT_IDLE_COMPACT_MINUTES = 15
DEFAULT_DREAM_INTERVAL_HOURS = 2
MAX_CONFIG_BYTES = 4 * 1024 * 1024
REQUEST_RESERVE_TOKENS = 1024  # nanobot's own margin: budget = window - max_tokens - 1024


@dataclass(frozen=True)
class AgentSettings:
    """What nanobotd must know of the agent beside it; `error` says why the file could not be used."""

    path: Path | None
    context_window: int = DEFAULT_CONTEXT_WINDOW
    max_tokens: int = DEFAULT_MAX_TOKENS
    idle_compact_minutes: int = DEFAULT_IDLE_COMPACT_MINUTES
    dream_enabled: bool = True
    dream_interval_hours: int = DEFAULT_DREAM_INTERVAL_HOURS
    dream_cron: str = ""
    mcp_servers: dict[str, dict] = field(default_factory=dict)
    error: str | None = None

    @property
    def budget(self) -> int:
        """Prompt tokens at which nanobot compacts its own history mid-turn."""
        return max(1, self.context_window - self.max_tokens - REQUEST_RESERVE_TOKENS)

    @property
    def own_dream_runs(self) -> bool:
        """nanobot's own dream would run beside nanobotd's (every interval under a day, or by cron)."""
        return self.dream_enabled and (bool(self.dream_cron) or self.dream_interval_hours < 24)

    def mcp_server_for(self, command_name: str = "nanobotctl") -> str | None:
        """The name under which nanobotd's MCP server (`nanobotctl mcp`) is registered, if it is."""
        for name, server in self.mcp_servers.items():
            if not isinstance(server, dict):
                continue
            command = str(server.get("command", ""))
            args = [str(arg) for arg in server.get("args", []) if isinstance(arg, (str, int))]
            if Path(command).name == command_name and "mcp" in args:
                return name
        return None

    def to_json(self) -> dict:
        """Plain data for status and the audit."""
        return {
            "config": str(self.path) if self.path else None, "error": self.error,
            "context_window": self.context_window, "max_tokens": self.max_tokens, "budget": self.budget,
            "idle_compact_minutes": self.idle_compact_minutes, "dream_enabled": self.dream_enabled,
            "dream_interval_hours": self.dream_interval_hours, "dream_cron": self.dream_cron or None,
            "mcp_servers": sorted(self.mcp_servers), "nanobotd_mcp_server": self.mcp_server_for(),
        }


def find_agent_config(sessions_dirs: list[Path], candidates: list[Path]) -> Path | None:
    """nanobot's config.json: beside the `sessions/` folder in use, else in a candidate config dir."""
    for folder in sessions_dirs:
        if folder.parent.name == "sessions" and (folder.parent.parent / CONFIG_NAME).is_file():
            return folder.parent.parent / CONFIG_NAME
    for config_dir in candidates:
        if (config_dir / CONFIG_NAME).is_file():
            return config_dir / CONFIG_NAME
    return None


def read_agent_settings(path: Path | None) -> AgentSettings:
    """The agent's settings from *path* (None: nanobot's defaults); never raises for a bad file."""
    if path is None:
        return AgentSettings(path=None)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return AgentSettings(path=path, error=f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
        with fsio.open_regular(path, follow=True) as handle:
            data = json.loads(handle.read(MAX_CONFIG_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        return AgentSettings(path=path, error=f"cannot read {path}: {exc}")
    if not isinstance(data, dict):
        return AgentSettings(path=path, error=f"{path} does not hold a JSON object")
    return _settings_from(path, data)


def _settings_from(path: Path, data: dict) -> AgentSettings:
    defaults = _table(_table(data, "agents"), "defaults")
    preset = _active_preset(data, defaults)
    dream = _table(defaults, "dream")
    tools = _table(data, "tools")
    return AgentSettings(
        path=path,
        context_window=_int(_get(preset, "contextWindowTokens", "context_window_tokens"), DEFAULT_CONTEXT_WINDOW),
        max_tokens=_int(_get(preset, "maxTokens", "max_tokens"), DEFAULT_MAX_TOKENS),
        idle_compact_minutes=_int(_get(defaults, "idleCompactAfterMinutes", "idle_compact_after_minutes",
                                       "sessionTtlMinutes", "session_ttl_minutes"), DEFAULT_IDLE_COMPACT_MINUTES),
        dream_enabled=_get(dream, "enabled") is not False,
        dream_interval_hours=_int(_get(dream, "intervalH", "interval_h"), DEFAULT_DREAM_INTERVAL_HOURS),
        dream_cron=str(_get(dream, "cron") or ""),
        mcp_servers={name: value for name, value in _table(tools, "mcpServers", "mcp_servers").items()
                     if isinstance(value, dict)},
    )


def _active_preset(data: dict, defaults: dict) -> dict:
    """The fields of the active model preset (`agents.defaults.modelPreset`), else the defaults themselves."""
    name = _get(defaults, "modelPreset", "model_preset")
    presets = _table(data, "modelPresets", "model_presets")
    if isinstance(name, str) and name != "default" and isinstance(presets.get(name), dict):
        return presets[name]
    return defaults


def _table(data: dict, *names: str) -> dict:
    value = _get(data, *names)
    return value if isinstance(value, dict) else {}


def _get(data: dict, *names: str) -> Any:
    for name in names:
        if name in data:
            return data[name]
    return None


def _int(value: Any, default: int) -> int:
    """nanobot's integer settings; anything else (bool, text, negative) falls back to its default."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return default
    return int(value)
