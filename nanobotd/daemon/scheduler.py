"""Cron scheduling of the nightly jobs, checked on the daemon's tick against its wall clock, with catch-up.

A timer counts monotonic time, which neither a clock step nor a suspend moves (jobs would come hours late or never), so
each tick starts, once, every run whose wall time has passed, and a backward jump re-plans. A run missed while the
daemon was down runs once at start (last success in the state DB)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

from apscheduler.triggers.cron import CronTrigger
from loguru import logger

from nanobotd.tuning import CATCH_UP_DAYS, CLOCK_JUMP_SECONDS

CATCH_UP_LOOKBACK = timedelta(days=CATCH_UP_DAYS)
LATE_LOG_SECONDS = 60.0  # a run this late says why in the log
ONE_SECOND = timedelta(seconds=1)  # cron's resolution


def previous_fire_time(trigger: CronTrigger, now: datetime) -> datetime | None:
    """The last time *trigger* should have fired at or before *now* (within the look-back)."""
    candidate = trigger.get_next_fire_time(None, now - CATCH_UP_LOOKBACK)
    previous = None
    while candidate is not None and candidate <= now:
        previous = candidate
        candidate = trigger.get_next_fire_time(candidate, candidate + ONE_SECOND)
    return previous


@dataclass
class PlannedJob:
    """One cron job: its trigger, what it runs, and the wall time of its next run."""

    trigger: CronTrigger
    func: Callable[[], Awaitable[object]]
    next_run: datetime | None


class JobScheduler:
    """The cron jobs, started on the daemon's loop from its tick (tick()), by its injected wall clock."""

    def __init__(self, timezone: tzinfo, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic):
        self.timezone = timezone
        self.clock = clock
        self.monotonic = monotonic
        self.jobs: dict[str, PlannedJob] = {}
        self.running = False  # the daemon's watchdog pings only while it runs
        self._last_tick: tuple[float, float] | None = None  # (wall, monotonic) at the last tick
        self._tasks: set[asyncio.Task] = set()

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), self.timezone)

    def add(self, job_id: str, expression: str, func: Callable[[], Awaitable[object]]) -> None:
        """Schedule *func* by cron *expression* under *job_id* (replacing an earlier one)."""
        trigger = CronTrigger.from_crontab(expression, timezone=self.timezone)  # day-of-week by name: config checks
        self.jobs[job_id] = PlannedJob(trigger, func, trigger.get_next_fire_time(None, self.now()))

    def start(self) -> None:
        """Run due jobs from now on (the daemon's tick calls tick())."""
        self.running = True
        self._last_tick = (self.clock(), self.monotonic())

    def shutdown(self) -> None:
        """Start no more runs (the job queue drains the running ones)."""
        self.running = False

    def tick(self) -> list[str]:
        """Notice a wall clock jump, then start each job whose time has come (once, however late); the ids."""
        if not self.running:
            return []
        wall, steady = self.clock(), self.monotonic()
        if self._last_tick is not None:
            jump = (wall - self._last_tick[0]) - (steady - self._last_tick[1])
            if abs(jump) >= CLOCK_JUMP_SECONDS:
                self._clock_jumped(jump)
        self._last_tick = (wall, steady)
        now = datetime.fromtimestamp(wall, self.timezone)
        started = []
        for job_id, job in self.jobs.items():
            if job.next_run is None or job.next_run > now:
                continue
            late = (now - job.next_run).total_seconds()
            if late >= LATE_LOG_SECONDS:
                logger.info("job {} was due at {} ({} ago); running it once now", job_id,
                            job.next_run.isoformat(timespec="seconds"), timedelta(seconds=round(late)))
            job.next_run = job.trigger.get_next_fire_time(None, now + ONE_SECOND)  # now itself would count
            self._start(job.func)
            started.append(job_id)
        return started

    def _clock_jumped(self, jump: float) -> None:
        """Forward: the runs it passed are due now. Backward: each next run moves with the clock."""
        direction = "forward" if jump > 0 else "back"
        logger.warning("the wall clock jumped {} by {}; re-planning the nightly jobs", direction,
                       timedelta(seconds=round(abs(jump))))
        if jump > 0:
            return
        for job in self.jobs.values():
            if job.next_run is not None:
                job.next_run = job.trigger.get_next_fire_time(None, job.next_run + timedelta(seconds=jump))

    def _start(self, func: Callable[[], Awaitable[object]]) -> None:
        task = asyncio.get_running_loop().create_task(func())
        self._tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.opt(exception=task.exception()).error("a scheduled job could not start: {}", task.exception())

    def next_run(self, job_id: str) -> str | None:
        """ISO time of the next run of *job_id*."""
        job = self.jobs.get(job_id)
        return job.next_run.isoformat(timespec="seconds") if job and job.next_run else None

    def is_missed(self, job_id: str, last_success: float | None, now: datetime) -> bool:
        """Whether *job_id* fell due after *last_success* (the daemon was down then)."""
        job = self.jobs.get(job_id)
        if job is None or last_success is None:
            return False
        previous = previous_fire_time(job.trigger, now)
        missed = previous is not None and previous.timestamp() > last_success
        if missed:
            logger.info("job {} missed a scheduled run while the daemon was down; running it once now", job_id)
        return missed
