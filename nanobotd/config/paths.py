"""Where nanobotd keeps its config, state and socket (XDG and systemd conventions).

Standard library only: nanobotctl imports this to find the socket without loading the daemon.
The environment is passed in, so callers decide where it comes from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP = "nanobotd"
SOCKET_NAME = "nanobotd.sock"
SYSTEM_CONFIG = Path("/etc/nanobotd/config.toml")


def default_config_path(environ: Mapping[str, str]) -> Path | None:
    """The config file used when --config is not given, or None when there is none."""
    candidates = []
    xdg = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".config")
    candidates.append(Path(xdg) / APP / "config.toml")
    candidates.append(SYSTEM_CONFIG)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


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
