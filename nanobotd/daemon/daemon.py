"""The Daemon: start, run, stop. One asyncio loop owns all state; signal handlers only set flags.

One tick loop sends watchdog pings (only while the watcher and scheduler are healthy), starts due nightly jobs, runs the
reconcile and the idle trigger, and applies a reload. The daemon hands a small `Core` down; nothing below holds it."""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from loguru import logger

from nanobotd import __version__, heap, tokens
from nanobotd.api.server import ControlServer
from nanobotd.config.load import Config, ConfigError, load_config, socket_group_id
from nanobotd.config.schema import WorkspaceSettings
from nanobotd.daemon import companion, indexing, runs, triggers
from nanobotd.daemon.core import Core, config_timezone
from nanobotd.daemon.handlers import all_routes
from nanobotd.daemon.jobqueue import JobQueue
from nanobotd.daemon.lock import DaemonLocks
from nanobotd.daemon.scheduler import JobScheduler
from nanobotd.daemon.workspace import Workspace
from nanobotd.faults import FaultPoints
from nanobotd.llm.process import LLMWorker
from nanobotd.notify import Notifier, watchdog_interval
from nanobotd.state.store import StateStore
from nanobotd.tuning import CACHE_IDLE_SECONDS, LLM_CLOSE_WAIT_SECONDS, TOKENIZER_IDLE_SECONDS
from nanobotd.watcher import SessionWatcher

TICK_SECONDS = 1.0
# [daemon] keys a reload cannot apply to a running process: status names them until the next restart.
RESTART_KEYS = ("socket", "state_dir", "socket_group", "log_level", "timezone")
IDLE_CHECK_SECONDS = 30.0


def idle_exit_seconds(config: Config) -> float:
    """The LLM worker's idle time: the longest any workspace asks for."""
    return max((ws.llm.idle_exit_seconds for ws in config.workspaces), default=300.0)


class Daemon:
    """nanobotd's process: wiring, lifecycle, signals, reload and the tick loop."""

    def __init__(self, config: Config, *, notifier: Notifier, clock=time.time, polling: bool = False):
        self.config = config
        self._started_config = config
        self.notifier = notifier
        self.polling = polling
        executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="io")
        self.core = Core(config, StateStore(config.state_dir, clock=clock), executor,
                         JobScheduler(config_timezone(config), clock=clock), clock=clock, started_at=clock())
        self.server: ControlServer | None = None
        self._stop = asyncio.Event()
        self._reload_requested = False
        self._tasks: list[asyncio.Task] = []
        # One LLM worker for every workspace (one litellm in memory); it stays as long as the longest idle time.
        self.llm_worker = LLMWorker(idle_exit_seconds=idle_exit_seconds(config))

    # -- start / run / stop ------------------------------------------------------------------------
    async def start(self) -> None:
        """Lock the state folder and the workspaces (AlreadyRunning when another daemon has one), open state,
        recover interrupted runs, listen on the socket (READY=1), then open each workspace, watch and scan it."""
        core = self.core
        loop = asyncio.get_running_loop()
        self._take_locks()
        core.store.open()
        if core.store.first_start:
            logger.info("state database created at {} (first start)", core.store.path)
        elif core.store.rebuilt:
            logger.warning("state database was (re)created; session progress is rebuilt from the files")
        core.queue = JobQueue(core.store, llm_concurrency=max(ws.llm.concurrency for ws in self.config.workspaces))
        for settings in self.config.workspaces:
            core.workspaces[settings.name] = self._new_workspace(settings)
        runs.recover_interrupted_runs(core)
        group = self.config.daemon.socket_group
        self.server = ControlServer(self.config.socket_path, all_routes(core),
                                    socket_gid=socket_group_id(group) if group else None)
        await self.server.start()
        self.notifier.ready()
        self.notifier.status(f"listening on {self.config.socket_path}")
        logger.info("nanobotd {} listening on {} ({} workspace(s))", __version__, self.config.socket_path,
                    len(core.workspaces))
        core.watcher = SessionWatcher(loop, functools.partial(triggers.path_changed, core), polling=self.polling,
                                      debounce=self.config.daemon.debounce_seconds,
                                      on_memory_change=functools.partial(indexing.memory_path_changed, core),
                                      faults=FaultPoints.from_environ(self.config.environ))
        core.watcher.start()
        for signum, handler in ((signal.SIGTERM, self.request_stop), (signal.SIGINT, self.request_stop),
                                (signal.SIGHUP, self.request_reload)):
            loop.add_signal_handler(signum, handler)
        runs.schedule_jobs(core)
        core.scheduler.start()
        for workspace in core.workspaces.values():
            if workspace.exists:  # locked above: each one's git store opens beside the start-up scans
                workspace.begin_open()
        self._tasks.append(loop.create_task(self._startup_reconcile(), name="startup-reconcile"))
        self._tasks.append(loop.create_task(self._tick(), name="tick"))

    def _take_locks(self) -> None:
        """Before anything is touched: the state folder's lock, then each existing workspace's (a workspace that
        appears later is locked when it is found). A second daemon leaves the first untouched and exits 1."""
        locks = self.core.locks = DaemonLocks(self.config.socket_path)
        try:
            locks.take_state(self.config.state_dir)
            for settings in self.config.workspaces:
                if settings.path.is_dir():
                    locks.take_workspace(settings.name, settings.path)
        except BaseException:
            locks.release_all()
            raise

    def _new_workspace(self, settings: WorkspaceSettings) -> Workspace:
        home = Path(self.config.environ.get("HOME", "~")).expanduser()
        return Workspace(settings, self.core.store, state_dir=self.config.state_dir, environ=self.config.environ,
                         home=home, now=self.core.now, clock=self.core.clock, llm_worker=self.llm_worker)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit status."""
        await self.start()
        await self._stop.wait()
        await self.stop()
        return 0

    async def stop(self) -> None:
        """Stop taking work, let running jobs reach a safe point (bounded), close everything."""
        core = self.core
        self.notifier.stopping()
        self.notifier.status("stopping")
        logger.info("stopping")
        for task in self._tasks:
            task.cancel()
        core.scheduler.shutdown()
        if core.watcher is not None:
            core.watcher.stop()
        if core.queue is not None:
            await core.queue.drain(self.config.daemon.job_stop_seconds)
        for workspace in core.workspaces.values():
            companion.close(workspace)
            triggers.unwatch_folders(self.core, workspace)
            await workspace.close()
        await asyncio.to_thread(self.llm_worker.close, LLM_CLOSE_WAIT_SECONDS)
        if self.server is not None:
            await self.server.stop()
        core.executor.shutdown(wait=True, cancel_futures=True)
        core.store.close()
        if core.locks is not None:
            core.locks.release_all()
        logger.info("stopped")

    def request_stop(self) -> None:
        """SIGTERM/SIGINT: only set the flag."""
        self._stop.set()

    def request_reload(self) -> None:
        """SIGHUP: only set the flag; the tick loop reloads."""
        self._reload_requested = True

    async def _startup_reconcile(self) -> None:
        await triggers.reconcile_all(self.core)
        self.notifier.status(self.core.status_line())

    async def _tick(self) -> None:
        interval = watchdog_interval(self.config.environ)
        last_ping = 0.0
        last_reconcile = last_idle = time.monotonic()
        while True:
            await asyncio.sleep(TICK_SECONDS if interval is None else min(TICK_SECONDS, interval / 2))
            now = time.monotonic()
            if interval is not None and now - last_ping >= interval and self.healthy():
                self.notifier.watchdog()
                last_ping = now
            try:
                self.core.scheduler.tick()
                if self._reload_requested:
                    self._reload_requested = False
                    await self.reload()
                if now - last_reconcile >= self.config.daemon.reconcile_seconds:
                    last_reconcile = now
                    await triggers.reconcile_all(self.core)
                    self.notifier.status(self.core.status_line())
                else:
                    await triggers.reconcile_all(self.core, waiting_only=True)
                if now - last_idle >= self._idle_check_seconds():
                    last_idle = now
                    triggers.trigger_idle(self.core)
                    if tokens.release_if_idle(TOKENIZER_IDLE_SECONDS):
                        logger.debug("released the idle tokenizer")
                    released = await asyncio.get_running_loop().run_in_executor(self.core.executor,
                                                                                self._release_idle_caches)
                    if released:
                        logger.debug("let go of {} idle session cache entries", released)
            except Exception as exc:  # the tick loop carries the watchdog: it must outlive any bug
                logger.opt(exception=exc).error("tick: {}", exc)

    def _release_idle_caches(self) -> int:
        """Idle sessions' caches go, and so does the state database's page cache while no job runs; the heap gives
        their pages back (on the executor: a scan may hold a tracker's lock)."""
        released = sum(workspace.tracker.release_idle_caches(CACHE_IDLE_SECONDS)
                       for workspace in self.core.workspaces.values())
        idle = not self.core.queue.running_kinds()
        if idle:
            self.core.store.shrink_memory()
        if released or idle:
            heap.trim()  # a few ms at most, every IDLE_CHECK_SECONDS
        return released

    def _idle_check_seconds(self) -> float:
        """Check for idle sessions often enough for the most pressing workspace, at most every 30 s."""
        shortest = min((workspace.idle_check_seconds() for workspace in self.core.workspaces.values()),
                       default=IDLE_CHECK_SECONDS)
        return max(TICK_SECONDS, min(IDLE_CHECK_SECONDS, shortest))

    def healthy(self) -> bool:
        """Watchdog pings only while the watcher and the scheduler work."""
        watcher = self.core.watcher
        return watcher is not None and watcher.observer.is_alive() and self.core.scheduler.running

    async def reload(self) -> None:
        """Re-read the config (SIGHUP); a bad config is logged and the old one kept."""
        self.notifier.reloading()
        try:
            new_config = load_config(self.config.source, environ=self.config.environ,
                                     workspace_args=list(self.config.workspace_args))
        except ConfigError as exc:
            logger.error("reload refused, keeping the running config: {}", exc)
            self.notifier.ready()
            return
        try:
            FaultPoints.from_environ(new_config.environ).reach("daemon.reloading")
            self._apply_daemon_settings(new_config)
            self.config = self.core.config = new_config
            self.llm_worker.idle_exit_seconds = idle_exit_seconds(new_config)
            await self._swap_workspaces(new_config.workspaces)
            self.core.scheduler.jobs.clear()
            runs.schedule_jobs(self.core)
            await triggers.reconcile_all(self.core)
            logger.info("config reloaded from {}", new_config.source or "arguments")
        finally:  # systemd waits in "reloading" until READY=1, whatever stopped the reload
            self.notifier.ready()
        self.notifier.status(self.core.status_line())

    def _apply_daemon_settings(self, new_config: Config) -> None:
        """Hand a new debounce to the watcher; note the [daemon] keys only a restart applies (status shows them)."""
        new = new_config.daemon
        if self.core.watcher is not None and new.debounce_seconds != self.core.watcher.debounce:
            logger.info("reload: watcher debounce {}s -> {}s", self.core.watcher.debounce, new.debounce_seconds)
            self.core.watcher.debounce = new.debounce_seconds
        started = self._started_config
        pending = {key for key in RESTART_KEYS if getattr(started.daemon, key) != getattr(new, key)}
        if new_config.socket_path != started.socket_path:  # the paths they resolve to, too
            pending.add("socket")
        if new_config.state_dir != started.state_dir:
            pending.add("state_dir")
        self.core.restart_needed = sorted(pending)
        if pending:
            logger.warning("reload: daemon.{} changed; only a restart applies it", ", daemon.".join(sorted(pending)))

    async def _swap_workspaces(self, configured: tuple[WorkspaceSettings, ...]) -> None:
        """Close workspaces the config dropped or changed, once their jobs have ended; add the new and changed ones
        (their first reconcile opens them)."""
        workspaces = self.core.workspaces
        wanted = {settings.name: settings for settings in configured}
        for name, workspace in list(workspaces.items()):
            settings = wanted.get(name)
            if settings == workspace.settings and settings.api_key == workspace.settings.api_key:
                continue
            logger.info("workspace {} {} the config", name, "changed in" if settings else "removed from")
            del workspaces[name]  # no trigger finds it now: its jobs end (bounded) before it closes
            await self.core.queue.drain(self.config.daemon.job_stop_seconds, workspace=name)
            runs.recover_interrupted_runs(self.core, only=workspace)  # those it had to cut short
            companion.close(workspace)
            await workspace.close()
            if self.core.locks is not None and not any(kept.path == workspace.settings.path
                                                       for kept in wanted.values()):
                self.core.locks.release_workspace(workspace.settings.path)
        for name, settings in wanted.items():
            if name not in workspaces:  # opened by the reconcile that follows
                workspaces[name] = self._new_workspace(settings)
                runs.recover_interrupted_runs(self.core, only=workspaces[name])  # cut short when it was removed
