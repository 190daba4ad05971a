"""Where nanobotd keeps its config, state and socket (XDG and systemd conventions); standard library only, as
nanobotctl imports it. The environment is passed in."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP = "nanobotd"
SOCKET_NAME = "nanobotd.sock"
SYSTEM_CONFIG = Path("/etc/nanobotd/config.toml")
NANOBOT_CONFIG = Path(".nanobot") / "config.json"  # under $HOME: where `nanobot onboard` writes it
NANOBOT_WORKSPACE = Path(".nanobot") / "workspace"  # nanobot's own default when its config names none
MAX_NANOBOT_CONFIG_BYTES = 4 * 1024 * 1024
MEMORY_FILES = ("SOUL.md", "USER.md", "memory/MEMORY.md")  # in a workspace; nanobot puts them whole into every prompt


def default_config_path(environ: Mapping[str, str]) -> Path | None:
    """The config file used when --config is not given, or None when there is none."""
    xdg = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".config")
    return next((path for path in (Path(xdg) / APP / "config.toml", SYSTEM_CONFIG) if path.is_file()), None)


def nanobot_workspace(environ: Mapping[str, str]) -> tuple[Path, Path | None]:
    """(the workspace `agents.defaults.workspace` in ~/.nanobot/config.json names, else nanobot's default; the
    config.json read or None): a daemon's workspace when neither a config file nor --workspace names one."""
    import json

    home = Path(environ.get("HOME", "~")).expanduser()
    config_json = home / NANOBOT_CONFIG
    try:
        if config_json.stat().st_size > MAX_NANOBOT_CONFIG_BYTES:
            return home / NANOBOT_WORKSPACE, config_json
        data = json.loads(config_json.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return home / NANOBOT_WORKSPACE, None
    except (OSError, ValueError):
        return home / NANOBOT_WORKSPACE, config_json
    return workspace_under(home, named_workspace(data)), config_json


def named_workspace(data: object) -> str:
    """The workspace a parsed nanobot config names (agents.defaults.workspace) as written, "" when none."""
    agents = data.get("agents") if isinstance(data, dict) else None
    defaults = agents.get("defaults") if isinstance(agents, dict) else None
    named = defaults.get("workspace") if isinstance(defaults, dict) else None
    return named.strip() if isinstance(named, str) else ""


def workspace_under(home: Path, named: str) -> Path:
    """Where *named* is, read from *home*: `~` is HOME and a relative path is taken from HOME (nanobot would take it
    from the folder it starts in, which nanobotd cannot know); "" is nanobot's default workspace."""
    if not named:
        return home / NANOBOT_WORKSPACE
    return home / (named[1:].lstrip("/") if named.startswith("~") else named)  # HOME / "/x" is "/x"


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """$STATE_DIRECTORY under systemd, else $XDG_STATE_HOME/nanobotd."""
    if environ.get("STATE_DIRECTORY"):
        return Path(environ["STATE_DIRECTORY"].split(":")[0])
    xdg = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".local" / "state")
    return Path(xdg) / APP


def default_socket_path(environ: Mapping[str, str]) -> Path:
    """$RUNTIME_DIRECTORY/nanobotd.sock under systemd, else $XDG_RUNTIME_DIR/nanobotd/nanobotd.sock."""
    if environ.get("RUNTIME_DIRECTORY"):
        return Path(environ["RUNTIME_DIRECTORY"].split(":")[0]) / SOCKET_NAME
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / APP / SOCKET_NAME
    return Path(f"/tmp/{APP}-{os.getuid()}") / SOCKET_NAME


def socket_from_config(config_path: Path | None) -> Path | None:
    """The `[daemon] socket` value of a config file, read with tomllib only (for nanobotctl)."""
    if config_path is None or not config_path.is_file():
        return None
    import tomllib

    try:
        data = tomllib.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = data.get("daemon", {}).get("socket", "")
    return Path(value).expanduser() if isinstance(value, str) and value else None
