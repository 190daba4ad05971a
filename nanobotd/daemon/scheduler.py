"""Cron scheduling of the nightly jobs (APScheduler 3, asyncio) with catch-up after downtime.

Each (job, workspace) gets a cron trigger with coalescing, one instance at a time and a misfire grace
of hours. The last success is persisted in the state database, so a nightly run missed while the
daemon was down runs once at start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, tzinfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from loguru import logger

MISFIRE_GRACE_SECONDS = 6 * 3600
CATCH_UP_LOOKBACK = timedelta(days=8)


def make_trigger(expression: str, timezone: tzinfo) -> CronTrigger:
    """A cron trigger from a 5-field crontab line (day-of-week by name, checked by config)."""
    return CronTrigger.from_crontab(expression, timezone=timezone)


def previous_fire_time(trigger: CronTrigger, now: datetime) -> datetime | None:
    """The last time *trigger* should have fired at or before *now* (within the look-back)."""
    candidate = trigger.get_next_fire_time(None, now - CATCH_UP_LOOKBACK)
    previous = None
    while candidate is not None and candidate <= now:
        previous = candidate
        candidate = trigger.get_next_fire_time(candidate, candidate + timedelta(seconds=1))
    return previous


def missed_run(trigger: CronTrigger, last_success: float | None, now: datetime) -> bool:
    """True when a scheduled run fell due after the last success (the daemon was down then)."""
    if last_success is None:
        return False
    previous = previous_fire_time(trigger, now)
    return previous is not None and previous.timestamp() > last_success


class JobScheduler:
    """Owns the APScheduler instance; jobs are async callables run on the daemon's loop."""

    def __init__(self, timezone: tzinfo):
        self.timezone = timezone
        self.scheduler = AsyncIOScheduler(timezone=timezone)
        self.triggers: dict[str, CronTrigger] = {}

    def add(self, job_id: str, expression: str, func: Callable[[], Awaitable[object]]) -> None:
        """Schedule *func* by cron *expression* under *job_id* (replacing an earlier one)."""
        trigger = make_trigger(expression, self.timezone)
        self.triggers[job_id] = trigger
        self.scheduler.add_job(func, trigger, id=job_id, replace_existing=True, coalesce=True, max_instances=1,
                               misfire_grace_time=MISFIRE_GRACE_SECONDS)

    def remove_all(self) -> None:
        """Drop every job (before a config reload re-adds them)."""
        self.scheduler.remove_all_jobs()
        self.triggers.clear()

    def start(self) -> None:
        """Start on the running loop."""
        self.scheduler.start()

    def shutdown(self) -> None:
        """Stop without waiting for running jobs (the job queue drains those)."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    @property
    def healthy(self) -> bool:
        """The scheduler runs."""
        return bool(self.scheduler.running)

    def next_run(self, job_id: str) -> str | None:
        """ISO time of the next run of *job_id*."""
        job = self.scheduler.get_job(job_id)
        when = getattr(job, "next_run_time", None) if job else None
        if when is None and job_id in self.triggers:
            when = self.triggers[job_id].get_next_fire_time(None, datetime.now(self.timezone))
        return when.isoformat(timespec="seconds") if when else None

    def is_missed(self, job_id: str, last_success: float | None, now: datetime) -> bool:
        """Whether *job_id* missed a run since *last_success*."""
        trigger = self.triggers.get(job_id)
        if trigger is None:
            return False
        missed = missed_run(trigger, last_success, now)
        if missed:
            logger.info("job {} missed a scheduled run while the daemon was down; running it once now", job_id)
        return missed
