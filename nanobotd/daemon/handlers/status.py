"""GET /v1/status: the daemon and every workspace at a glance."""

from __future__ import annotations

import os

from nanobotd import __version__
from nanobotd.api.app import Request
from nanobotd.daemon import runs
from nanobotd.daemon.core import Core
from nanobotd.daemon.handlers.common import named_workspaces
from nanobotd.daemon.workspace import Workspace


async def status(core: Core, request: Request) -> dict:
    """The daemon (version, pid, uptime, paths, jobs running) and each workspace named (else all)."""
    queue = core.queue
    return {
        "version": __version__, "pid": os.getpid(), "uptime_seconds": round(core.uptime, 1),
        "socket": str(core.config.socket_path), "state_dir": str(core.config.state_dir),
        "jobs_running": queue.running_kinds() if queue else [],
        "restart_needed": [f"daemon.{key}" for key in core.restart_needed],
        "workspaces": [workspace_status(core, workspace) for workspace in named_workspaces(core, request)],
    }


def workspace_status(core: Core, workspace: Workspace) -> dict:
    """One workspace: counters, watcher health, git, search and the scheduled jobs."""
    data = workspace.status()
    watcher = core.watcher
    data["watcher"] = {
        "healthy": bool(watcher and watcher.healthy(workspace.sessions_dirs)),
        "mode": watcher.mode if watcher else None,
        "last_reconcile": data["last_reconcile"],
        "waiting_for": None if workspace.sessions_dirs else str(workspace.settings.path),
    }
    data["jobs"] = runs.next_runs(core, workspace) if core.queue else {}
    return data


ROUTES = [("GET", "/v1/status", status)]
