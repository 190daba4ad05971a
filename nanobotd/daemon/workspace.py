"""One managed workspace at run time: tracker, LLM client, git store, search indexes and the job env. Git opens on its
own thread beside the first scan, the rest after it; closed whole on stop or when a reload drops or changes it.

Triggers (DESIGN.md §4): the unarchived tail reaching the budget -> consolidate; reaching the flush threshold -> flush,
once per compaction cycle; messages vanished from a rewritten file -> rescue; idle_minutes without writes -> consolidate
everything."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from loguru import logger

from nanobotd import fsio
from nanobotd.config.schema import QmdSettings, WorkspaceSettings
from nanobotd.daemon.skill import ensure_skill_file
from nanobotd.faults import FaultPoints
from nanobotd.gitstore.store import GitStore
from nanobotd.index.builtin import BuiltinIndex
from nanobotd.index.qmd import QmdBackend
from nanobotd.index.qmdexport import QmdExport
from nanobotd.jobs.env import JobEnv
from nanobotd.jobs.registry import JOB_KINDS
from nanobotd.llm.client import LLMClient
from nanobotd.llm.embeddings import Embedder
from nanobotd.llm.process import LLMWorker
from nanobotd.memory import history
from nanobotd.sessions import discovery
from nanobotd.sessions.agent_config import AgentSettings, find_agent_config, read_agent_settings
from nanobotd.sessions.file import is_session_file
from nanobotd.sessions.tracker import ScanResult, SessionTracker
from nanobotd.state.store import StateStore
from nanobotd.timestamps import iso_local
from nanobotd.tokens import workspace_encoding
from nanobotd.tuning import EXACT_BAND_HIGH, EXACT_BAND_LOW

ALL_FILES = Path("*")  # a pending index change that means "check every file"
AGENT_TOKENS_PER_MESSAGE = 4  # nanobot adds this per message to its estimate


class Workspace:
    """Everything the daemon keeps for one configured workspace."""

    def __init__(self, settings: WorkspaceSettings, store: StateStore, *, state_dir: Path, environ,
                 home: Path | None, now: Callable[[], datetime], clock=time.time,
                 llm_worker: LLMWorker | None = None):
        self.settings = settings
        self.store = store
        self.home = home
        self.clock = clock
        encoding = workspace_encoding(settings.consolidation.mode, settings.llm.model)
        faults = FaultPoints.from_environ(environ)
        self.tracker = SessionTracker(settings.name, store, encoding=encoding, clock=clock, faults=faults)
        self.agent = AgentSettings(path=None)
        self.agent_base_tokens = settings.consolidation.agent_base_tokens  # learned at each agent compaction
        self.agent_archive = None  # companion mode's state (daemon.companion), made on first use
        self.llm = LLMClient(settings.llm, settings.api_key, worker=llm_worker)  # the daemon's worker, shared
        self.git = GitStore(settings.path, faults=faults)
        self.embedder = Embedder(settings.search.embeddings, settings.llm, settings.api_key,
                                 dimensions=settings.search.embedding_dimensions, worker=self.llm.worker)
        self.index = BuiltinIndex(settings.path, state_dir / "index" / f"{settings.name}.sqlite",
                                  embed=self.embedder.embed if self.embedder.enabled else None)
        self.qmd = self._make_qmd(state_dir, environ)
        self.env = JobEnv(settings, store, self.tracker, self.llm, now, git=self.git, clock=clock, kinds=JOB_KINDS,
                          faults=faults, index=self.index, qmd=self.qmd)
        self.sessions_dirs: list[Path] = []
        self.last_reconcile: float | None = None
        self.last_reconcile_seconds: float | None = None
        self.scan_errors = 0
        self.last_scan_error: dict | None = None  # what the last failed scan said, for status
        self.held_elsewhere: str | None = None  # another daemon holds this workspace's lock (daemon.lock)
        self.torn_lines = 0
        self.ahead_writes: dict[str, tuple[float, float]] = {}  # session key -> (a write time ahead of the clock, seen)
        self.opening: asyncio.Task | None = None  # the git store opening (begin_open), beside the first scan
        # set once the first scan and what must follow it before any job (archive marks rebuilt) are done
        self.first_scan_done = asyncio.Event()
        self.opened = False
        self.reconciling = False
        self.pending_paths: dict[Path, float] = {}  # changed file -> when it last changed (loop time)
        self.pending_since = 0.0
        self.refresh_handle: asyncio.TimerHandle | None = None
        self.refreshes = 0  # index refreshes finished since the start, the seconds they ran, the one running
        self.refresh_seconds = 0.0
        self.refresh_started: float | None = None  # time.monotonic(); the refresh is single-flight
        self.last_refresh: dict | None = None
        self.sampled_day: str | None = None  # the last day whose figures went to the daily samples

    def _make_qmd(self, state_dir: Path, environ) -> QmdBackend | None:
        search = self.settings.search
        if search.backend not in ("qmd", "both"):
            return None
        home = state_dir / "qmd" / self.settings.name
        # History and session transcripts reach QMD as markdown exported beside its index.
        export = QmdExport(home / "export", self.index.sources)
        return QmdBackend(self.settings.path, home, QmdSettings(
            command=search.qmd_command, timeout_seconds=search.qmd_timeout_seconds,
            debounce_seconds=search.debounce_seconds, vectors=search.qmd_vectors), environ=dict(environ),
            export=export)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def mode(self) -> str:
        """companion or owner: the configured mode, or in auto the one the session files call for."""
        configured = self.settings.consolidation.mode
        if configured != "auto":
            return configured
        return "companion" if self.tracker.agent_marks() else "owner"

    @property
    def exists(self) -> bool:
        """A configured workspace that does not exist yet is waited for."""
        return self.settings.path.is_dir()

    # -- open / close --------------------------------------------------------------------------------
    def begin_open(self) -> None:
        """Mend a torn history line, then open the git store on its own thread, beside the first scan (restore and
        dream-log wait for it); once only."""
        if self.opening is None:
            self.repair_history()
            self.opening = asyncio.get_running_loop().create_task(self._open_git(), name=f"open-git-{self.name}")

    async def _open_git(self) -> None:
        try:
            await self.git.call(self._open_git_now)
        except Exception as exc:
            logger.warning("workspace {}: git store unavailable: {}", self.name, exc)

    def _open_git_now(self) -> None:
        self.env.faults.reach("workspace.opening_git")
        self.git.open()

    async def open(self) -> None:
        """After the first scan: write the skill file, start QMD (the index refresh follows), and see git open."""
        try:
            ensure_skill_file(self.settings.path)
        except OSError as exc:  # a full disk or a `skills` that is no folder must not keep the index closed
            logger.error("workspace {}: the memory-search skill file cannot be written ({}); nanobotd goes on without "
                         "it and writes it at its next start", self.name, exc)
        if self.qmd is not None:
            await self.qmd.start()
            self.qmd.request_update()
        self.begin_open()
        await self.opening
        self.opened = True

    def repair_history(self) -> None:
        """A torn last line in history.jsonl (a write cut short before this start) moves to history.jsonl.torn."""
        try:
            moved = history.repair_torn_line(self.env.memory_dir)
        except (OSError, fsio.LockTimeout) as exc:
            logger.error("workspace {}: cannot check history.jsonl for a torn line: {}", self.name, exc)
            return
        if moved:
            self.torn_lines += 1
            logger.warning("workspace {}: history.jsonl ended in a torn line ({} bytes); moved to {}{}", self.name,
                           moved, history.HISTORY_NAME, fsio.TORN_SUFFIX)

    async def close(self) -> None:
        """Release what the workspace holds: refresh timer, QMD child, LLM worker, index and git thread."""
        if self.refresh_handle is not None:
            self.refresh_handle.cancel()
        if self.qmd is not None:
            await self.qmd.close()
        await self.llm.aclose()
        self.index.close()
        self.git.close()

    # -- session files -------------------------------------------------------------------------------
    def discover(self) -> list[Path]:
        """(Re)discover the sessions folders and re-read the agent's settings; cheap, called at every reconcile."""
        self.sessions_dirs = discovery.discover_sessions_dirs(self.settings.path, self.settings.sessions_dir,
                                                              self.home)
        self.index.set_sessions_dirs(self.sessions_dirs)  # every folder: both layouts may hold sessions
        candidates = discovery.candidate_config_dirs(self.settings.path, self.home)
        self.agent = read_agent_settings(find_agent_config(self.sessions_dirs, candidates))
        return self.sessions_dirs

    def owns(self, path: Path) -> bool:
        """The changed path is one of this workspace's session files."""
        return path.parent in self.sessions_dirs

    def scan_path(self, path: Path) -> ScanResult | None:
        """Scan one file (runs on an executor thread); errors are logged and counted, never raised."""
        try:
            result = self.tracker.scan(path)
            if result is not None and result.changed:
                self.count_if_near(result.key)
            return result
        except Exception as exc:  # one bad file must never stop the daemon
            return self._scan_failed(path, exc)

    def count_if_near(self, key: str) -> None:
        """Count a session's tail exactly when its estimate is near a threshold that decides a job (on the executor:
        the decision on the loop then reads the exact figure); far from every threshold the estimate decides."""
        session = self.tracker.sessions.get(key)
        if session is None or session.skipped or not session.unarchived_messages:
            return
        if self.mode == "companion":
            estimate, thresholds = self.agent_prompt_tokens(key), [self.agent_flush_threshold()]
        else:
            estimate, thresholds = session.unarchived_tokens, [self.settings.flush_threshold, self.settings.budget]
        if any(EXACT_BAND_LOW * threshold <= estimate <= EXACT_BAND_HIGH * threshold for threshold in thresholds):
            self.tracker.count_tail(key)

    def _scan_failed(self, path: Path, exc: Exception) -> None:
        self.scan_errors += 1
        self.last_scan_error = {"at": iso_local(self.clock()), "path": str(path), "error": str(exc)}
        logger.opt(exception=exc).error("workspace {}: scanning {} failed: {}", self.name, path, exc)

    def reconcile(self, *, first: bool = False) -> list[ScanResult]:
        """Scan every session file of the folders discover() found (fingerprints make unchanged files free) and
        notice deleted ones."""
        started = time.perf_counter()
        results = []
        seen: set[Path] = set()
        for folder in self.sessions_dirs:
            try:
                entries = sorted(folder.iterdir())
            except OSError as exc:
                logger.warning("workspace {}: cannot list {}: {}", self.name, folder, exc)
                continue
            files = [path for path in entries if is_session_file(path) and path.is_file()]
            seen.update(files)
            for path, result in self.tracker.scan_many(files):  # one bad file must never stop the daemon
                if isinstance(result, Exception):
                    self._scan_failed(path, result)
                elif result is not None:
                    results.append(result)
        for session in list(self.tracker.sessions.values()):
            if session.state != "deleted" and session.path not in seen and session.path.parent in self.sessions_dirs:
                result = self.tracker.forget_path(session.path)
                if result is not None:
                    results.append(result)
        for result in results:
            if result.changed:
                try:
                    self.count_if_near(result.key)
                except Exception as exc:
                    self._scan_failed(self.tracker.sessions[result.key].path, exc)
        self.env.faults.reach("reconcile.startup_scanned" if first else "reconcile.scanned")
        self.last_reconcile = self.clock()
        self.last_reconcile_seconds = time.perf_counter() - started
        return results

    # -- triggers ------------------------------------------------------------------------------------
    def due_jobs(self, key: str, vanished: int = 0) -> list[tuple[str, str]]:
        """(kind, reason) jobs a session needs now, from its counters and vanished messages. Beside an archiving agent
        only the flush: what vanished waits for the agent's entry (daemon.companion), none in the file is archived."""
        session = self.tracker.sessions.get(key)
        if session is None or session.skipped:
            return []
        if self.mode == "companion":
            flush_due = self.agent_prompt_tokens(key) >= self.agent_flush_threshold()
            return [("flush", "agent_budget")] if flush_due and self._may_flush(session) else []
        jobs = []
        if vanished:
            jobs.append(("consolidate", "rescue"))
        tokens = session.tail_tokens
        if tokens >= self.settings.flush_threshold and self._may_flush(session):
            jobs.append(("flush", "threshold"))
        if tokens >= self.settings.budget:
            jobs.append(("consolidate", "budget"))
        return jobs

    def _may_flush(self, session) -> bool:
        """Flush once per compaction cycle, with an LLM, when there is something unarchived to read; after a
        failed LLM call, again once its backoff has passed, a bounded number of times."""
        return (self.settings.consolidation.flush and not self.llm.offline and session.unarchived_messages > 0
                and session.flushed_cycle != session.cycle
                and session.flush_failures <= self.settings.consolidation.flush_retries
                and self.clock() >= session.flush_retry_at)

    def may_flush(self, key: str) -> bool:
        """Session *key* may be flushed now (see _may_flush)."""
        session = self.tracker.sessions.get(key)
        return session is not None and not session.skipped and self._may_flush(session)

    def agent_prompt_tokens(self, key: str) -> int:
        """The agent's prompt as it counts it: its base (system prompt, tools) plus the unarchived tail."""
        return self.agent_base_tokens + self.agent_tail_tokens(key)

    def agent_tail_tokens(self, key: str) -> int:
        """The unarchived tail as the agent counts it (cl100k tokens plus a few per message)."""
        session = self.tracker.sessions[key]
        return session.tail_tokens + AGENT_TOKENS_PER_MESSAGE * session.unarchived_messages

    def agent_flush_threshold(self) -> int:
        """Flush when the agent's prompt is this large: short of its budget by soft_threshold, or by half the
        room its base leaves for the conversation when that room is small (its next turn must still fit)."""
        room = max(0, self.agent.budget - self.agent_base_tokens)
        return self.agent.budget - min(self.settings.consolidation.soft_threshold, room // 2)

    def budgets(self) -> dict:
        """The budget and flush threshold that decide this workspace's jobs, and whose they are: the agent's prompt
        against its own budget beside an archiving agent (companion), else nanobotd's tail against [llm]'s."""
        if self.mode == "companion":
            return {"budget": self.agent.budget, "flush_threshold": self.agent_flush_threshold(),
                    "budget_source": f"the agent's ({self.agent.path or 'nanobot defaults'}), against its prompt"}
        return {"budget": self.settings.budget, "flush_threshold": self.settings.flush_threshold,
                "budget_source": "nanobotd's [llm] context_window - max_tokens - 1024, against the unarchived tail"}

    def llm_last_call(self) -> dict | None:
        """The last LLM call's outcome and time (None before the first): `online` says only that one is set."""
        last = self.llm.last_call
        return None if last is None else dict(last, at=iso_local(last["at"]))

    def learn_agent_base(self, tail_before: int) -> None:
        """The agent just compacted, so its base is what the tail left of its budget: nanobot's base (system prompt,
        bootstrap files, tool schemas) is not in any file. The estimate errs large (the new message is not counted)."""
        budget = self.agent.budget
        self.agent_base_tokens = min(int(budget * 0.95), max(0, budget - tail_before))

    def idle_sessions(self, now: float) -> list[tuple[str, str]]:
        """(kind, key) for sessions quiet long enough: consolidate (owner), or flush before the agent compacts."""
        if self.mode == "companion":
            limit = self.agent_idle_flush_seconds()
            if limit is None:
                return []
            return [("flush", key) for key, session in self.tracker.sessions.items()
                    if not session.skipped and session.last_write and now - self._quiet_since(key, now) >= limit
                    and self._may_flush(session)]
        limit = self.settings.consolidation.idle_minutes * 60
        return [("consolidate", key) for key, session in self.tracker.sessions.items()
                if not session.skipped and session.unarchived_messages > 0 and session.last_write
                and now - self._quiet_since(key, now) >= limit]

    def _quiet_since(self, key: str, now: float) -> float:
        """When the session was last written: its file's time, or, when that lies ahead of the clock (the clock was
        set back since), when the daemon first saw that write, so the session still goes idle on time."""
        last_write = self.tracker.sessions[key].last_write
        if last_write <= now:
            self.ahead_writes.pop(key, None)
            return last_write
        seen = self.ahead_writes.get(key)
        if seen is None or seen[0] != last_write:
            seen = self.ahead_writes[key] = (last_write, now)
        return seen[1]

    def agent_idle_flush_seconds(self) -> float | None:
        """How long after the last write the flush runs, ahead of the agent's own idle compaction."""
        idle = self.agent.idle_compact_minutes * 60
        if idle <= 0:
            return None
        return idle - min(self.settings.consolidation.flush_idle_margin_seconds, idle / 2)

    def idle_check_seconds(self) -> float:
        """How often the idle check must look for this workspace to be on time."""
        limit = self.agent_idle_flush_seconds() if self.mode == "companion" else None
        return (limit if limit is not None else self.settings.consolidation.idle_minutes * 60) / 4

    def status(self) -> dict:
        """Per-workspace figures for GET /v1/status."""
        return {
            "name": self.name, "path": str(self.settings.path), "exists": self.exists,
            "sessions_dir": str(self.sessions_dirs[0]) if self.sessions_dirs else None,
            "sessions_dirs": [str(folder) for folder in self.sessions_dirs],
            **self.tracker.totals(),
            "llm_mode": self.llm.mode, "llm_model": self.settings.llm.model, "llm_last_call": self.llm_last_call(),
            "consolidation_mode": self.mode, "scanning": self.last_reconcile is None,
            "agent": self.agent.to_json(),
            **self.budgets(),
            "last_reconcile": iso_local(self.last_reconcile), "last_reconcile_seconds": self.last_reconcile_seconds,
            "scan_errors": self.scan_errors, "last_scan_error": self.last_scan_error, "torn_lines": self.torn_lines,
            "held_elsewhere": self.held_elsewhere, "git": self.git.health(), "search": self.search_status(),
        }

    @property
    def refreshing(self) -> bool:
        """An index refresh is running (refreshes are single-flight)."""
        return self.refresh_started is not None

    def search_status(self) -> dict:
        """Backends, index figures and freshness (refresh_seconds: refreshes since the start, the running one too)."""
        running = time.monotonic() - self.refresh_started if self.refresh_started is not None else 0.0
        search = {"backend": self.settings.search.backend, "builtin": self.index.stats(),
                  "last_refresh": self.last_refresh, "pending_changes": len(self.pending_paths),
                  "refreshing": self.refreshing, "refreshes": self.refreshes,
                  "refresh_seconds": round(self.refresh_seconds + running, 3)}
        if self.qmd is not None:
            search["qmd"] = self.qmd.freshness()
        return search
