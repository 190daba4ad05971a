"""`nanobotctl setup nanobot`: show, and with --apply write, the nanobot config that runs nanobotd beside it.

`tools.mcpServers.nanobotd` runs `nanobotctl mcp --socket S --workspace W` (the agent's own workspace only), and
nanobot's dream moves to every ten years (`enabled: false` would make nanobot move `.dream_cursor` past entries
nanobotd's dream has not read). Only the changed keys' text is rewritten (configtext.py)."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from nanobotd.cli.client import CannotConnect, Client, DaemonError
from nanobotd.cli.invocation import EXIT_DAEMON_ERROR, EXIT_OK, Invocation
from nanobotd.config import paths

DEFAULT_NANOBOT_CONFIG = "~/.nanobot/config.json"
SERVER_NAME = "nanobotd"
DREAM_INTERVAL_HOURS = 87_600
BACKUP_INFIX = ".nanobotd-backup-"
# Keys of an mcpServers entry that belong to HTTP transports; a stdio entry must not keep them.
OTHER_TRANSPORT_KEYS = ("type", "url", "headers", "auth")


class SetupRefused(Exception):
    """The config cannot be changed safely; the message says why and what to do. Nothing was written."""


def setup(invocation: Invocation) -> int:
    """Show the change as a unified diff; with --apply back the file up and write it atomically."""
    from nanobotd.cli import configtext  # here: only setup needs it, and nanobotctl imports this module always

    args = invocation.args
    path = Path(args.nanobot_config or DEFAULT_NANOBOT_CONFIG).expanduser().absolute()
    try:
        raw, data = read_config(path)
        old_text = raw.decode("utf-8")
        workspace = args.workspace or nanobot_workspace(data)
        server = mcp_server_entry(nanobotctl_program(), invocation.client.socket_path, workspace)
        changes, warnings = change(data, server)
        new_text = configtext.splice(old_text, configtext.parse_strictly(old_text), data)
    except (SetupRefused, configtext.Unfaithful) as exc:
        invocation.warn(str(exc) if isinstance(exc, SetupRefused) else
                        f"{path} cannot be changed without rewriting what it holds: {exc}; nothing was written")
        return EXIT_DAEMON_ERROR
    for warning in warnings + relative_workspace(data, args.workspace) + daemon_warnings(invocation, workspace):
        invocation.warn(warning)
    if new_text == old_text:
        invocation.out(f"{path} already runs nanobotd beside nanobot: nothing to change.")
        return EXIT_OK
    invocation.out(f"Changes to {path}:")
    invocation.out_lines(f"- {change}" for change in changes)
    invocation.out_lines(diff_lines(old_text, new_text, str(path)))
    if not args.apply:
        invocation.out("Nothing written. Run again with --apply to write it (a backup is kept beside it).")
        return EXIT_OK
    try:
        backup = apply(path, raw, new_text)
    except (SetupRefused, OSError) as exc:
        invocation.warn(f"{path} was not changed: {exc}")
        return EXIT_DAEMON_ERROR
    invocation.out(f"Wrote {path} (backup: {backup.name}). Restart nanobot so it loads the memory tools.")
    return EXIT_OK


def read_config(path: Path) -> tuple[bytes, dict]:
    """The file's bytes and its JSON object; SetupRefused when it cannot be read or written back as it is."""
    from nanobotd.cli import configtext

    try:
        raw = configtext.read_regular_file(path)
    except FileNotFoundError:
        raise SetupRefused(f"no nanobot config at {path}: run `nanobot onboard` first, or pass "
                           "--nanobot-config PATH") from None
    except OSError as exc:
        raise SetupRefused(f"cannot read {path}: {exc.strerror or exc}") from None
    except configtext.Unfaithful as exc:
        raise SetupRefused(f"{exc}; is it nanobot's config.json? Nothing was written") from None
    try:
        data = configtext.parse_strictly(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SetupRefused(f"cannot parse {path} as JSON ({exc}); fix it (nanobot cannot read it either) and "
                           "run again; nothing was written") from None
    except configtext.Unfaithful as exc:
        raise SetupRefused(f"cannot parse {path} safely: {exc}; fix it and run again; nothing was written") from None
    if not isinstance(data, dict):
        raise SetupRefused(f"{path} holds JSON but not an object; nanobot's config is an object; nothing was written")
    return raw, data


def nanobotctl_program(argv0: str | None = None, executable: str | None = None) -> str:
    """The absolute path of the nanobotctl being run (argv[0], else beside the interpreter, else on PATH), so
    nanobot starts this very installation."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).name == "nanobotctl" and Path(argv0).is_file():
        return os.path.abspath(argv0)
    beside = Path(sys.executable if executable is None else executable).with_name("nanobotctl")
    if beside.is_file():
        return str(beside.absolute())
    import shutil  # here: only this fallback needs it

    found = shutil.which("nanobotctl")
    if not found:
        raise SetupRefused("cannot find the nanobotctl program to register; run this as `nanobotctl` from the "
                           "installation nanobot should use")
    return os.path.abspath(found)


def nanobot_workspace(data: dict) -> str:
    """The absolute path of the workspace the config's agent works in, read as the daemon reads it
    (config.paths.workspace_under), so the MCP entry and the daemon name the same folder."""
    return os.path.abspath(paths.workspace_under(Path.home(), paths.named_workspace(data)))


def relative_workspace(data: dict, given: str | None) -> list[str]:
    """A warning when the config names its workspace by a relative path: nanobot reads it from the folder it
    starts in, which neither nanobotctl nor the daemon can know."""
    named = paths.named_workspace(data)
    if given or not named or named.startswith(("/", "~")):
        return []
    return [f"agents.defaults.workspace is the relative path '{named}': nanobot reads it from the folder it starts"
            f" in, nanobotd from your home folder ({nanobot_workspace(data)}); write it as an absolute path so"
            " both use the same folder"]


def mcp_server_entry(program: str, socket_path: Path, workspace: str) -> dict:
    """The tools.mcpServers entry: nanobotctl mcp with the socket it must use and the workspace it answers for."""
    return {"command": program, "args": ["mcp", "--socket", os.path.abspath(socket_path), "--workspace", workspace]}


def change(data: dict, server: dict) -> tuple[list[str], list[str]]:
    """Change the parsed config *data* in place; return the changes in words and any warnings."""
    changes, warnings = [], []
    servers = table(table(data, "tools"), "mcpServers", "mcp_servers")
    current = servers.get(SERVER_NAME)
    entry = {key: value for key, value in current.items() if not other_transport(key, value)} \
        if isinstance(current, dict) else {}
    entry.update(server)
    if entry != current:
        servers[SERVER_NAME] = entry
        changes.append(f"tools.mcpServers.{SERVER_NAME}: start `{' '.join([server['command'], *server['args']])}`, "
                       f"so the agent gets mcp_{SERVER_NAME}_memory_search, _memory_context and _memory_recall")
    for name, other in servers.items():
        if name != SERVER_NAME and isinstance(other, dict) and runs_nanobotctl_mcp(other):
            warnings.append(f"tools.mcpServers.{name} also runs nanobotctl mcp; remove it, or the agent gets "
                            "the memory tools twice")
    dream = table(table(table(data, "agents"), "defaults"), "dream")
    changes.extend(quiet_dream(dream))
    return changes, warnings


def other_transport(key: str, value: object) -> bool:
    """Whether an entry's key sets up an HTTP transport. nanobot saves every field of an entry it loaded, the HTTP
    ones empty (`"type": null, "url": ""`); those are a stdio entry's too, and dropping them would fight its saves."""
    return key in OTHER_TRANSPORT_KEYS and value not in (None, "", {}, [], "stdio")


def quiet_dream(dream: dict) -> list[str]:
    """Push nanobot's dream ten years out, keeping it enabled so it never fast-forwards .dream_cursor."""
    changes = []
    interval_key = "interval_h" if "interval_h" in dream and "intervalH" not in dream else "intervalH"
    if dream.get(interval_key) != DREAM_INTERVAL_HOURS:
        dream[interval_key] = DREAM_INTERVAL_HOURS
        changes.append(f"agents.defaults.dream.{interval_key}: {DREAM_INTERVAL_HOURS} hours, so only nanobotd's "
                       "dream edits SOUL.md, USER.md and MEMORY.md")
    if dream.get("cron"):
        del dream["cron"]
        changes.append("agents.defaults.dream.cron: removed (a cron expression wins over intervalH)")
    if dream.get("enabled") is False:
        dream["enabled"] = True
        changes.append("agents.defaults.dream.enabled: true (when false, nanobot moves .dream_cursor past "
                       "entries nanobotd's dream has not read)")
    return changes


def runs_nanobotctl_mcp(server: dict) -> bool:
    """Whether an mcpServers entry starts `nanobotctl mcp` (as agent_config.mcp_server_for recognises it)."""
    args = server.get("args") if isinstance(server.get("args"), list) else []
    return Path(str(server.get("command", ""))).name == "nanobotctl" and "mcp" in args


def table(data: dict, *names: str) -> dict:
    """The JSON object under the first of *names* present (camelCase or snake_case), created when absent."""
    name = next((name for name in names if name in data), names[0])
    value = data.setdefault(name, {})
    if not isinstance(value, dict):
        raise SetupRefused(f"'{name}' in nanobot's config is {type(value).__name__}, not an object; fix it and "
                           "run again; nothing was written")
    return value


def diff_lines(old_text: str, new_text: str, name: str) -> list[str]:
    """The change as a unified diff, for the user to read before --apply."""
    import difflib  # here: only setup needs it, and nanobotctl imports this module for every command

    return [line.rstrip("\n") for line in difflib.unified_diff(
        old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
        fromfile=name, tofile=f"{name} (after nanobotctl setup nanobot)")]


def apply(path: Path, raw: bytes, new_text: str) -> Path:
    """Back the file up beside it, then replace it atomically with its mode kept; returns the backup's path."""
    from nanobotd import fsio  # here: its tempfile import would slow every other nanobotctl command
    from nanobotd.cli import configtext

    target = path.resolve()  # a symlinked config keeps its link; the file it points to is replaced
    if configtext.read_regular_file(target) != raw:
        raise SetupRefused("it changed while this ran (is nanobot writing it?); run again")
    info = target.stat()
    backup = target.with_name(f"{target.name}{BACKUP_INFIX}{datetime.now():%Y%m%d-%H%M%S}")
    if backup.exists():
        raise SetupRefused(f"{backup.name} already exists; wait a second and run again")
    fsio.atomic_write(backup, raw, mode=info.st_mode & 0o7777)
    fsio.atomic_write(target, new_text, mode=info.st_mode & 0o7777)
    for written in (backup, target):
        keep_owner(written, info)
    return backup


def keep_owner(path: Path, info: os.stat_result) -> None:
    """Give a file written as root back to the config's owner, so nanobot can still write its config."""
    if os.geteuid() == 0 and (info.st_uid, info.st_gid) != (0, 0):
        os.chown(path, info.st_uid, info.st_gid)


def daemon_warnings(invocation: Invocation, workspace: str) -> list[str]:
    """A reminder when no daemon answers on the socket registered, or it does not manage *workspace*."""
    client = Client(invocation.client.socket_path, invocation.client.timeout, workspace)
    try:
        client.get("/v1/status")
    except CannotConnect as exc:
        return [f"{exc}; start nanobotd before restarting nanobot, or its memory tools will say it is down"]
    except DaemonError as exc:
        if exc.code == "unknown_workspace":
            return [f"nanobotd does not manage the workspace {workspace} ({exc.message}); add it to nanobotd's "
                    "config, or pass --workspace NAME, or the memory tools will refuse every call"]
    return []
