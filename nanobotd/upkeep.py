"""Memory upkeep around the session jobs: dream, lifecycle, search index, git, restore wiring.

Kept apart from services.py so the session path (track -> spool -> archive) stays small.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nanobotd.runtime import WorkspaceRuntime

if TYPE_CHECKING:
    from nanobotd.daemon import Daemon


class Upkeep:
    """Scheduled and on-demand maintenance of each workspace's long-term memory."""

    def __init__(self, daemon: "Daemon"):
        self.daemon = daemon

    def add_routes(self, router) -> None:
        """Endpoints of the upkeep jobs."""

    def schedule_jobs(self) -> None:
        """Cron jobs per workspace."""

    def session_changed(self, runtime: WorkspaceRuntime, path) -> None:
        """A session file changed (search index input)."""

    def memory_changed(self, runtime: WorkspaceRuntime) -> None:
        """A job changed memory files."""

    def workspace_ready(self, runtime: WorkspaceRuntime) -> None:
        """The start-up reconcile of *runtime* is done."""

    def recover(self, runtime: WorkspaceRuntime, run) -> str:
        """Finish or roll back an interrupted run of an upkeep kind."""
        self.daemon.store.finish_run(run.run_id, state="rolled_back", outcome="interrupted")
        return "rolled_back"

    def workspace_status(self, runtime: WorkspaceRuntime) -> dict:
        """Upkeep figures for status."""
        return {}

    async def close(self) -> None:
        """Release resources."""
