"""Load, validate and resolve nanobotd's TOML config into typed settings; the only place that reads os.environ.

Every mistake raises ConfigError naming the key, so `nanobotd` exits 2 at once, not long after start. Relative paths in
the file are from its folder (so `/` under systemd changes nothing), `--workspace` ones from the current one."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tomllib
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanobotd.config import paths
from nanobotd.config.schema import WORKSPACE_TABLES, DaemonSettings, WorkspaceSettings

WORKSPACE_KEYS = {"path", "sessions_dir", "name"}
# schema.py's annotations are strings (postponed evaluation); a field of another type takes its default's type
FIELD_TYPES = {"bool": bool, "int": int, "float": float, "str": str}
# Keys people try that do not exist, with what to write instead.
KEY_HINTS = {
    "api_key": "the key itself never goes in the config: put it in an environment variable and name that "
               "variable in llm.api_key_env, e.g. api_key_env = \"OPENAI_API_KEY\"",
}


class ConfigError(ValueError):
    """The config is unusable; the message names the offending key."""


def key_name(key: str) -> str:
    """*key* bare when TOML would write it bare, else quoted (so an empty key or one with ':' stays visible)."""
    bare = bool(key) and all(char.isascii() and (char.isalnum() or char in "_-") for char in key)
    return key if bare else json.dumps(key, ensure_ascii=False)


@dataclass(frozen=True)
class Config:
    """The whole effective configuration of one daemon."""

    daemon: DaemonSettings
    workspaces: tuple[WorkspaceSettings, ...]
    state_dir: Path
    socket_path: Path
    source: Path | None = None
    workspace_args: tuple[str, ...] = ()
    origin: str = ""
    under_systemd: bool = False
    environ: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict:
        """The effective config as plain data (no secrets) for check-config and status."""
        def plain(settings: Any) -> dict:
            data = dataclasses.asdict(settings)
            data.pop("api_key", None)
            return json.loads(json.dumps(data, default=str))  # paths as text

        return {
            "source": str(self.source) if self.source else None,
            "origin": self.origin,
            "state_dir": str(self.state_dir),
            "socket": str(self.socket_path),
            "daemon": plain(self.daemon),
            "workspaces": [plain(workspace) for workspace in self.workspaces],
        }


def load_config(
    config_path: Path | None = None,
    *,
    workspace_args: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """The effective Config: the config file (or the default one), --workspace arguments over its workspaces;
    with no workspace from either, nanobot's own (paths.nanobot_workspace)."""
    environ = dict(os.environ if environ is None else environ)
    source = Path(config_path).expanduser() if config_path is not None else paths.default_config_path(environ)
    data = _read_toml(source) if source is not None else {}
    workspace_args = list(workspace_args or [])
    # the start-up log's first words on where the settings came from
    origin = f"config file {source} read" if source is not None else "no config file found (defaults apply)"
    if not workspace_args and not data.get("workspaces"):
        workspace, nanobot_config = paths.nanobot_workspace(environ)
        if not workspace.is_dir():
            where = f"config file {source}" if source else "no config file found"
            read = f"{nanobot_config} names" if nanobot_config else "nanobot's default is"
            raise ConfigError(f"workspaces: no workspace configured ({where}; {read} {workspace}, which does "
                              f"not exist): add a [[workspaces]] table or pass --workspace DIR")
        config = build_config(data, source=source, workspace_args=[str(workspace)], environ=environ)
        named_by = f"named by {nanobot_config}" if nanobot_config else "nanobot's default"
        return dataclasses.replace(config, workspace_args=(), origin=(
            f"{origin}; workspace {workspace} ({named_by}: no workspace configured)"))
    if workspace_args:
        origin += f"; --workspace {' '.join(workspace_args)} over the file's workspaces"
    config = build_config(data, source=source, workspace_args=workspace_args, environ=environ)
    return dataclasses.replace(config, origin=origin)


def build_config(data: dict, *, source: Path | None, workspace_args: list[str], environ: Mapping[str, str]) -> Config:
    """Validate parsed TOML *data* and resolve paths against *environ*. Workspace arguments replace the file's
    workspaces; one naming a configured workspace's folder keeps that workspace's name and settings."""
    known = {"daemon", "workspaces", *WORKSPACE_TABLES}
    for key in data:
        if key not in known:
            raise ConfigError(f"{key_name(key)}: unknown key (known: {', '.join(sorted(known))})")
    daemon = _make(DaemonSettings, _table(data, "daemon"), "daemon")
    _check_daemon(daemon)
    global_tables = {name: _table(data, name) for name in WORKSPACE_TABLES}
    raw_workspaces = data.get("workspaces", [])
    if not isinstance(raw_workspaces, list):
        raise ConfigError("workspaces: expected an array of tables ([[workspaces]])")
    base = Path(source).expanduser().absolute().parent if source else None
    bases = [base] * len(raw_workspaces)
    if workspace_args:
        raw_workspaces, bases = _argument_workspaces(workspace_args, raw_workspaces, base)
    if not raw_workspaces:
        raise ConfigError("workspaces: no workspace configured (add a [[workspaces]] table or pass --workspace DIR)")
    workspaces = [_make_workspace(raw, index, global_tables, environ, raw_base)
                  for index, (raw, raw_base) in enumerate(zip(raw_workspaces, bases, strict=True))]
    names = [workspace.name for workspace in workspaces]
    if twice := next((name for name in names if names.count(name) > 1), None):
        raise ConfigError(f"workspaces.name: two workspaces are named {twice!r}")
    state_dir = (resolve_path(daemon.state_dir, "daemon.state_dir", base) if daemon.state_dir
                 else paths.default_state_dir(environ))
    _check_folder(state_dir, "daemon.state_dir")
    socket_path = (resolve_path(daemon.socket, "daemon.socket", base) if daemon.socket
                   else paths.default_socket_path(environ))
    if socket_path.is_dir():
        raise ConfigError(f"daemon.socket: {socket_path} is a folder; name the socket file inside it")
    _check_folder(socket_path.parent, "daemon.socket")
    return Config(
        daemon=daemon,
        workspaces=tuple(workspaces),
        state_dir=state_dir,
        socket_path=socket_path,
        source=Path(source) if source else None,
        workspace_args=tuple(workspace_args),
        under_systemd=bool(environ.get("INVOCATION_ID") or environ.get("NOTIFY_SOCKET")),
        environ=environ,
    )


def _argument_workspaces(workspace_args: list[str], raw_workspaces: list, base: Path | None) -> tuple[list, list]:
    """The workspaces --workspace names, each as the file's own table when the file configures that folder
    (its name, LLM and the rest kept), else a bare one under the file's global tables."""
    configured = {}
    for index, raw in enumerate(raw_workspaces):
        if isinstance(raw, dict) and isinstance(raw.get("path"), str) and raw["path"].strip():
            folder = resolve_path(raw["path"], f"workspaces[{index}].path", base).resolve()
            configured.setdefault(folder, raw)
    chosen, bases = [], []
    for argument in workspace_args:
        raw = configured.get(resolve_path(argument, "--workspace", None).resolve())
        chosen.append(raw if raw is not None else {"path": argument})
        bases.append(base if raw is not None else None)
    return chosen, bases


def _read_toml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: cannot read {path}: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None


def _table(data: dict, name: str) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a table ([{name}])")
    return value


def _make(cls: type, values: dict, prefix: str, base: Any = None) -> Any:
    """Build dataclass *cls* from *values* over *base* (or the defaults), checking names and types."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "api_key"}
    current = base if base is not None else cls()
    updates = {}
    for key, value in values.items():
        if key not in fields:
            hint = KEY_HINTS.get(key) or f"known: {', '.join(sorted(fields))}"
            raise ConfigError(f"{prefix}.{key_name(key)}: unknown key ({hint})")
        expected = FIELD_TYPES.get(fields[key].type, type(getattr(current, key)))
        updates[key] = _coerce(value, expected, f"{prefix}.{key}", fields[key].metadata)
    return dataclasses.replace(current, **updates)


def _coerce(value: Any, expected: type, key: str, metadata: Mapping[str, Any]) -> Any:
    """*value* as *expected*, inside the field's bounds or one of its choices (in any case)."""
    if expected is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {type(value).__name__}")
        return value
    if expected in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__}")
        if expected is int and not float(value).is_integer():
            raise ConfigError(f"{key}: expected a whole number, got {value}")
        if value < 0:
            raise ConfigError(f"{key}: must not be negative, got {value}")
        return _check_number(expected(value), key, metadata.get("bounds"))
    if expected is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__}")
        choices = metadata.get("choices")
        _check_text(value, key)
        match = next((name for name in choices or () if name.casefold() == value.casefold()), None)
        if choices and match is None:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
        return match or value
    return value


def _check_number(value: float, key: str, bounds: tuple[float, bool, float] | None) -> float:
    """A finite number inside its field's *bounds* (lowest, whether it is allowed, highest)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")
    if bounds is not None:
        low, low_allowed, high = bounds
        if value < low or (value == low and not low_allowed) or value > high:
            lowest = f"at least {low:g}" if low_allowed else f"more than {low:g}"
            raise ConfigError(f"{key}: must be {lowest} and at most {high:g}, got {value}")
    return value


def _check_text(value: str, key: str) -> str:
    """A string that can become a path or a command: no NUL byte (the OS would refuse it much later)."""
    if "\x00" in value:
        raise ConfigError(f"{key}: contains a NUL character")
    return value


def _check_folder(path: Path, key: str) -> Path:
    """A folder nanobotd creates or uses: it, and every existing folder above it, must be a folder."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            if not candidate.is_dir():
                what = "it" if candidate == path else str(candidate)
                raise ConfigError(f"{key}: {path} cannot be a folder: {what} is a file, not a folder")
            break
    return path


def resolve_path(value: str, key: str, base: Path | None) -> Path:
    """`~` expanded, then a relative path taken from *base* (the config file's folder), else the current one."""
    path = Path(_check_text(value, key)).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return Path(*path.parts)  # normalised without resolving symlinks


def _make_workspace(raw: Any, index: int, global_tables: dict, environ: Mapping[str, str],
                    base: Path | None) -> WorkspaceSettings:
    prefix = f"workspaces[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix}: expected a table")
    for key in raw:
        if key not in WORKSPACE_KEYS and key not in WORKSPACE_TABLES:
            raise ConfigError(f"{prefix}.{key_name(key)}: unknown key")
    path_value = raw.get("path")
    if not isinstance(path_value, str) or not path_value.strip():
        raise ConfigError(f"{prefix}.path: missing (every workspace needs a path)")
    path = _check_folder(resolve_path(path_value, f"{prefix}.path", base), f"{prefix}.path")
    sessions_value = raw.get("sessions_dir", "")
    if not isinstance(sessions_value, str):
        raise ConfigError(f"{prefix}.sessions_dir: expected a string")
    key = f"{prefix}.sessions_dir"
    sessions_dir = _check_folder(resolve_path(sessions_value, key, base), key) if sessions_value else None
    name = raw.get("name") or _default_name(path)
    if not isinstance(name, str):
        raise ConfigError(f"{prefix}.name: expected a string")
    _check_text(name, f"{prefix}.name")
    tables = {}
    for table_name, cls in WORKSPACE_TABLES.items():
        settings = _make(cls, global_tables[table_name], table_name)
        override = raw.get(table_name, {})
        if not isinstance(override, dict):
            raise ConfigError(f"{prefix}.{table_name}: expected a table")
        tables[table_name] = _make(cls, override, f"{prefix}.{table_name}", base=settings)
    _check_workspace_tables(tables, prefix if raw.keys() & WORKSPACE_TABLES.keys() else "")
    api_key = environ.get(tables["llm"].api_key_env) or None
    return WorkspaceSettings(path=path, name=name, sessions_dir=sessions_dir, api_key=api_key, **tables)


def _default_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:6]
    return f"{path.name or 'root'}-{digest}"


def _check_daemon(daemon: DaemonSettings) -> None:
    if daemon.socket_group and socket_group_id(daemon.socket_group) is None:
        raise ConfigError(f"daemon.socket_group: no group named {daemon.socket_group!r} on this machine")
    if daemon.timezone:
        try:
            zoneinfo.ZoneInfo(daemon.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"daemon.timezone: unknown time zone {daemon.timezone!r}") from None


def _check_workspace_tables(tables: dict, prefix: str) -> None:
    where = f"{prefix}." if prefix else ""
    consolidation = tables["consolidation"]
    if not 0 < consolidation.ratio < 1:
        raise ConfigError(f"{where}consolidation.ratio: must be between 0 and 1, got {consolidation.ratio}")
    llm = tables["llm"]
    if llm.context_window <= llm.max_tokens + 1024:
        raise ConfigError(f"{where}llm.context_window: must exceed llm.max_tokens + 1024")
    for table_name in ("dream", "lifecycle"):
        check_cron(tables[table_name].schedule, f"{where}{table_name}.schedule")
    lifecycle = tables["lifecycle"]
    if lifecycle.active_days > lifecycle.ttl_days:  # notes must reach the archive before they expire from it
        raise ConfigError(f"{where}lifecycle.active_days: must not exceed lifecycle.ttl_days "
                          f"({lifecycle.active_days} > {lifecycle.ttl_days})")
    if consolidation.chunk_ratio_min > consolidation.chunk_ratio_max:
        raise ConfigError(f"{where}consolidation.chunk_ratio_min: must not exceed consolidation.chunk_ratio_max")


def check_cron(expression: str, key: str) -> None:
    """Reject a malformed cron line, and numeric day-of-week (APScheduler 3 counts 0 as Monday)."""
    parts = expression.split()
    if len(parts) != 5:
        raise ConfigError(f"{key}: expected 5 cron fields (minute hour day month day-of-week), got {expression!r}")
    day_of_week = parts[4]
    if any(ch.isdigit() for ch in day_of_week):
        raise ConfigError(f"{key}: use day names (mon..sun) in day-of-week, not numbers: {day_of_week!r}")
    from apscheduler.triggers.cron import CronTrigger

    try:
        CronTrigger.from_crontab(expression)
    except ValueError as exc:
        raise ConfigError(f"{key}: invalid cron expression {expression!r}: {exc}") from None


def socket_group_id(name: str) -> int | None:
    """The gid of `daemon.socket_group` (a group name or a number); None when there is no such group."""
    import grp

    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None
