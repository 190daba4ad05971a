"""The Daemon: start, run, stop. One asyncio loop owns all state.

Signal handlers only set flags; one tick loop sends watchdog pings (only while the watcher and the
scheduler are healthy), runs the periodic reconcile and the idle trigger, and applies a reload.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from loguru import logger

from nanobotd import __version__, tokens
from nanobotd.api.server import ControlServer
from nanobotd.config.load import Config, ConfigError, load_config
from nanobotd.daemon.control import build_router
from nanobotd.daemon.jobqueue import JobQueue
from nanobotd.notify import Notifier, watchdog_interval
from nanobotd.daemon.workspace import WorkspaceRuntime
from nanobotd.daemon.scheduler import JobScheduler
from nanobotd.daemon.services import Services
from nanobotd.state.store import StateStore
from nanobotd.watcher import SessionWatcher

TICK_SECONDS = 1.0
IDLE_CHECK_SECONDS = 30.0
TOKENIZER_IDLE_SECONDS = 60.0


class Daemon:
    """nanobotd's process: wiring, lifecycle and the tick loop."""

    def __init__(self, config: Config, *, notifier: Notifier, clock=time.time, polling: bool = False):
        self.config = config
        self.notifier = notifier
        self.clock = clock
        self.polling = polling
        self.started_at = clock()
        self.store = StateStore(config.state_dir, clock=clock)
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="io")
        self.runtimes: dict[str, WorkspaceRuntime] = {}
        self.queue: JobQueue | None = None
        self.watcher: SessionWatcher | None = None
        self.scheduler = JobScheduler(self.timezone)
        self.services = Services(self)
        self.server: ControlServer | None = None
        self._stop = asyncio.Event()
        self._reload_requested = False
        self._tasks: list[asyncio.Task] = []

    # -- clock -------------------------------------------------------------------------------------
    @property
    def timezone(self):
        """The configured time zone, else the machine's."""
        if self.config.daemon.timezone:
            return ZoneInfo(self.config.daemon.timezone)
        return datetime.now().astimezone().tzinfo

    def now(self) -> datetime:
        """Local wall time (naive, as nanobot writes it)."""
        return datetime.fromtimestamp(self.clock(), self.timezone).replace(tzinfo=None)

    # -- start / run / stop ------------------------------------------------------------------------
    async def start(self) -> None:
        """Open state, recover interrupted runs, listen on the socket (READY=1), then start watching."""
        loop = asyncio.get_running_loop()
        self.store.open()
        if self.store.rebuilt:
            logger.warning("state database was (re)created; session progress is rebuilt from the files")
        self.queue = JobQueue(self.store, llm_concurrency=self._llm_concurrency())
        home = Path(self.config.environ.get("HOME", "~")).expanduser()
        for settings in self.config.workspaces:
            self.runtimes[settings.name] = WorkspaceRuntime(settings, self.store, home=home, now=self.now,
                                                            clock=self.clock)
        self.services.recover_interrupted_runs()
        self.server = ControlServer(self.config.socket_path, build_router(self))
        await self.server.start()
        self.notifier.ready()
        self.notifier.status(f"listening on {self.config.socket_path}")
        logger.info("nanobotd {} listening on {} ({} workspace(s))", __version__, self.config.socket_path,
                    len(self.runtimes))
        self.watcher = SessionWatcher(loop, self._on_path_changed, debounce=self.config.daemon.debounce_seconds,
                                      polling=self.polling)
        self.watcher.start()
        for signum, handler in ((signal.SIGTERM, self.request_stop), (signal.SIGINT, self.request_stop),
                                (signal.SIGHUP, self.request_reload)):
            loop.add_signal_handler(signum, handler)
        self.services.schedule_jobs()
        self.scheduler.start()
        self._tasks.append(loop.create_task(self._startup_reconcile(), name="startup-reconcile"))
        self._tasks.append(loop.create_task(self._tick(), name="tick"))

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit status."""
        await self.start()
        await self._stop.wait()
        await self.stop()
        return 0

    async def stop(self) -> None:
        """Stop taking work, let running jobs reach a safe point (bounded), close everything."""
        self.notifier.stopping()
        self.notifier.status("stopping")
        logger.info("stopping")
        for task in self._tasks:
            task.cancel()
        self.scheduler.shutdown()
        if self.watcher is not None:
            self.watcher.stop()
        if self.queue is not None:
            await self.queue.drain(self.config.daemon.job_stop_seconds)
        await self.services.close()
        if self.server is not None:
            await self.server.stop()
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.store.close()
        logger.info("stopped")

    def request_stop(self) -> None:
        """SIGTERM/SIGINT: only set the flag."""
        self._stop.set()

    def request_reload(self) -> None:
        """SIGHUP: only set the flag; the tick loop reloads."""
        self._reload_requested = True

    def _llm_concurrency(self) -> int:
        return max(settings.llm.concurrency for settings in self.config.workspaces)

    # -- watching ----------------------------------------------------------------------------------
    def _on_path_changed(self, path: Path) -> None:
        for runtime in self.runtimes.values():
            if runtime.owns(path):
                asyncio.get_running_loop().create_task(self.services.scan_and_trigger(runtime, path))
                return

    async def _startup_reconcile(self) -> None:
        await self.services.reconcile_all(startup=True)
        self.notifier.status(self.services.status_line())

    async def _tick(self) -> None:
        interval = watchdog_interval(self.config.environ)
        last_ping = 0.0
        last_reconcile = time.monotonic()
        last_idle = time.monotonic()
        while True:
            await asyncio.sleep(TICK_SECONDS if interval is None else min(TICK_SECONDS, interval / 2))
            now = time.monotonic()
            if interval is not None and now - last_ping >= interval and self.healthy():
                self.notifier.watchdog()
                last_ping = now
            try:
                if self._reload_requested:
                    self._reload_requested = False
                    await self.reload()
                if now - last_reconcile >= self.config.daemon.reconcile_seconds:
                    last_reconcile = now
                    await self.services.reconcile_all()
                    self.notifier.status(self.services.status_line())
                if now - last_idle >= self._idle_check_seconds():
                    last_idle = now
                    self.services.trigger_idle()
                    if tokens.release_if_idle(TOKENIZER_IDLE_SECONDS):
                        logger.debug("released the idle tokenizer")
            except Exception as exc:  # the tick loop carries the watchdog: it must outlive any bug
                logger.opt(exception=exc).error("tick: {}", exc)

    def _idle_check_seconds(self) -> float:
        """Check for idle sessions often enough for the shortest idle_minutes, at most every 30 s."""
        shortest = min(settings.consolidation.idle_minutes * 60 for settings in self.config.workspaces)
        return max(TICK_SECONDS, min(IDLE_CHECK_SECONDS, shortest / 4))

    def healthy(self) -> bool:
        """Watchdog pings only while the watcher and the scheduler work."""
        watcher_ok = self.watcher is not None and self.watcher.observer.is_alive()
        return watcher_ok and self.scheduler.healthy

    async def reload(self) -> None:
        """Re-read the config (SIGHUP); a bad config is logged and the old one kept."""
        self.notifier.reloading()
        try:
            new_config = load_config(self.config.source, environ=self.config.environ,
                                     workspace_args=None if self.config.source else
                                     [str(settings.path) for settings in self.config.workspaces])
        except ConfigError as exc:
            logger.error("reload refused, keeping the running config: {}", exc)
            self.notifier.ready()
            return
        self.config = new_config
        home = Path(self.config.environ.get("HOME", "~")).expanduser()
        names = {settings.name for settings in new_config.workspaces}
        for name in list(self.runtimes):
            if name not in names:
                logger.info("workspace {} removed from the config", name)
                self.runtimes.pop(name)
        for settings in new_config.workspaces:
            runtime = self.runtimes.get(settings.name)
            if runtime is None:
                self.runtimes[settings.name] = WorkspaceRuntime(settings, self.store, home=home, now=self.now,
                                                                clock=self.clock)
            else:
                runtime.apply_settings(settings)
        self.scheduler.remove_all()
        self.services.schedule_jobs()
        await self.services.reconcile_all()
        logger.info("config reloaded from {}", new_config.source or "arguments")
        self.notifier.ready()
        self.notifier.status(self.services.status_line())

    @property
    def uptime(self) -> float:
        return self.clock() - self.started_at

    @property
    def pid(self) -> int:
        return os.getpid()
