"""The core the daemon hands down (state, queue, executor, scheduler, clock, open workspaces): nothing below the
`Daemon` holds the daemon."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from nanobotd.config.load import Config
from nanobotd.daemon.jobqueue import JobQueue
from nanobotd.daemon.lock import DaemonLocks
from nanobotd.daemon.scheduler import JobScheduler
from nanobotd.daemon.workspace import Workspace
from nanobotd.state.store import StateStore
from nanobotd.watcher import SessionWatcher


@dataclass
class Core:
    """Process-wide state shared by the daemon's parts (one asyncio loop owns it)."""

    config: Config
    store: StateStore
    executor: ThreadPoolExecutor
    scheduler: JobScheduler
    clock: Callable[[], float] = time.time
    started_at: float = 0.0
    queue: JobQueue | None = None
    watcher: SessionWatcher | None = None
    locks: DaemonLocks | None = None  # one daemon per state folder and per workspace
    workspaces: dict[str, Workspace] = field(default_factory=dict)
    restart_needed: list[str] = field(default_factory=list)  # [daemon] keys a reload changed but cannot apply

    def now(self) -> datetime:
        """Local wall time (naive, as nanobot writes it)."""
        return datetime.fromtimestamp(self.clock(), config_timezone(self.config)).replace(tzinfo=None)

    @property
    def uptime(self) -> float:
        return self.clock() - self.started_at

    def workspace(self, name: str | None) -> Workspace:
        """The workspace named (by name or path), or the only one; KeyError with a clear message otherwise."""
        if name:
            if name in self.workspaces:
                return self.workspaces[name]
            for workspace in self.workspaces.values():
                if same_path(workspace.settings.path, name):
                    return workspace
            raise KeyError(f"no workspace named {name!r} (known: {', '.join(self.workspaces)})")
        if len(self.workspaces) == 1:
            return next(iter(self.workspaces.values()))
        raise KeyError(f"several workspaces are managed; name one with --workspace ({', '.join(self.workspaces)})")

    def status_line(self) -> str:
        """Short ASCII summary for systemd's STATUS=."""
        workspaces = list(self.workspaces.values())
        sessions = sum(len(workspace.tracker.sessions) for workspace in workspaces)
        tokens = sum(workspace.tracker.totals()["unarchived_tokens"] for workspace in workspaces)
        return f"{len(workspaces)} workspace(s), {sessions} session(s), {tokens} unarchived tokens"


def same_path(path: Path, text: str) -> bool:
    """Whether *text* names *path*: `~`, a trailing slash or a symlink on the way make no difference."""
    if str(path) == text:
        return True
    if "/" not in text and not text.startswith("~"):
        return False
    try:
        return Path(text).expanduser().resolve() == Path(path).resolve()
    except (OSError, RuntimeError):
        return False


def config_timezone(config: Config):
    """The configured time zone, else the machine's."""
    if config.daemon.timezone:
        return ZoneInfo(config.daemon.timezone)
    return datetime.now().astimezone().tzinfo
