"""One managed workspace at run time: its tracker, watched folders, triggers and job context.

Triggers (DESIGN.md §4): the unarchived tail reaching the budget -> consolidate; reaching the flush
threshold -> flush, once per compaction cycle; messages vanished from a rewritten file -> rescue;
no writes for idle_minutes -> consolidate everything.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from loguru import logger

from nanobotd.sessions import discovery
from nanobotd.jobs.common import JobContext
from nanobotd.llm.client import LLMClient
from nanobotd.sessions.file import is_session_file
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.state.store import StateStore
from nanobotd.tokens import encoding_name_for
from nanobotd.sessions.tracker import ScanResult, SessionTracker
from nanobotd.timestamps import iso_local


class WorkspaceRuntime:
    """Everything the daemon keeps for one workspace."""

    def __init__(self, settings: WorkspaceSettings, store: StateStore, *, home: Path | None,
                 now: Callable[[], datetime], clock=time.time):
        self.settings = settings
        self.store = store
        self.home = home
        self.clock = clock
        self.tracker = SessionTracker(settings.name, store, encoding=encoding_name_for(settings.llm.model),
                                      clock=clock)
        self.llm = LLMClient(settings.llm, settings.api_key)
        self.context = JobContext(settings, store, self.tracker, self.llm, now)
        self.sessions_dirs: list[Path] = []
        self.last_reconcile: float | None = None
        self.last_reconcile_seconds: float | None = None
        self.scan_errors = 0

    @property
    def name(self) -> str:
        return self.settings.name

    def apply_settings(self, settings: WorkspaceSettings) -> None:
        """A reload changed this workspace's settings: new LLM client and job context, same tracker."""
        if settings == self.settings and settings.api_key == self.settings.api_key:
            return
        self.settings = settings
        self.llm = LLMClient(settings.llm, settings.api_key)
        self.context = JobContext(settings, self.store, self.tracker, self.llm, self.context.now)

    @property
    def exists(self) -> bool:
        """A configured workspace that does not exist yet is waited for."""
        return self.settings.path.is_dir()

    def discover(self) -> list[Path]:
        """(Re)discover the sessions folders; cheap, called at every reconcile."""
        self.sessions_dirs = discovery.discover_sessions_dirs(self.settings.path, self.settings.sessions_dir,
                                                              self.home)
        return self.sessions_dirs

    def owns(self, path: Path) -> bool:
        """The changed path is one of this workspace's session files."""
        return path.parent in self.sessions_dirs

    def scan_path(self, path: Path) -> ScanResult | None:
        """Scan one file (runs on an executor thread); errors are logged and counted, never raised."""
        try:
            return self.tracker.scan(path)
        except Exception as exc:  # one bad file must never stop the daemon
            self.scan_errors += 1
            logger.opt(exception=exc).error("workspace {}: scanning {} failed: {}", self.name, path, exc)
            return None

    def reconcile(self) -> list[ScanResult]:
        """Scan every session file (fingerprints make unchanged files free) and notice deleted ones."""
        started = time.perf_counter()
        results = []
        seen: set[Path] = set()
        for folder in self.discover():
            try:
                entries = sorted(folder.iterdir())
            except OSError as exc:
                logger.warning("workspace {}: cannot list {}: {}", self.name, folder, exc)
                continue
            for path in entries:
                if is_session_file(path) and path.is_file():
                    seen.add(path)
                    result = self.scan_path(path)
                    if result is not None:
                        results.append(result)
        for session in list(self.tracker.sessions.values()):
            if session.state != "deleted" and session.path not in seen and session.path.parent in self.sessions_dirs:
                result = self.tracker.forget_path(session.path)
                if result is not None:
                    results.append(result)
        self.last_reconcile = self.clock()
        self.last_reconcile_seconds = time.perf_counter() - started
        return results

    def due_jobs(self, key: str, vanished: int = 0) -> list[tuple[str, str]]:
        """(kind, reason) jobs a session needs now, from its counters and the messages that vanished."""
        session = self.tracker.sessions.get(key)
        if session is None or session.skipped:
            return []
        jobs = []
        if vanished:
            jobs.append(("consolidate", "rescue"))
        tokens = session.unarchived_tokens
        if (self.settings.consolidation.flush and tokens >= self.settings.flush_threshold
                and session.flushed_cycle != session.cycle and not self.llm.offline):
            jobs.append(("flush", "threshold"))
        if tokens >= self.settings.budget:
            jobs.append(("consolidate", "budget"))
        return jobs

    def idle_sessions(self, now: float) -> list[str]:
        """Sessions with unarchived messages and no writes for idle_minutes."""
        limit = self.settings.consolidation.idle_minutes * 60
        return [key for key, session in self.tracker.sessions.items()
                if not session.skipped and session.unarchived_messages > 0 and session.last_write
                and now - session.last_write >= limit]

    def status(self) -> dict:
        """Per-workspace figures for GET /v1/status."""
        totals = self.tracker.totals()
        return {
            "name": self.name, "path": str(self.settings.path), "exists": self.exists,
            "sessions_dir": str(self.sessions_dirs[0]) if self.sessions_dirs else None,
            "sessions_dirs": [str(folder) for folder in self.sessions_dirs],
            **totals,
            "llm_mode": self.llm.mode, "llm_model": self.settings.llm.model,
            "budget": self.settings.budget, "flush_threshold": self.settings.flush_threshold,
            "last_reconcile": iso_local(self.last_reconcile), "last_reconcile_seconds": self.last_reconcile_seconds,
            "scan_errors": self.scan_errors,
        }
