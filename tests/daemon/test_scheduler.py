"""Cron scheduling: previous fire times and missed runs after downtime."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger

from nanobotd.config.load import load_config
from nanobotd.daemon.daemon import Daemon
from nanobotd.daemon.scheduler import JobScheduler, previous_fire_time
from nanobotd.notify import Notifier
from tests.support.observe import wait_until
from tests.support.workspace import make_workspace

TZ = ZoneInfo("Europe/Paris")


def test_previous_fire_time_of_a_nightly_and_a_weekly_job():
    now = datetime(2026, 11, 22, 10, 0, tzinfo=TZ)
    nightly, weekly = (CronTrigger.from_crontab(line, timezone=TZ) for line in ("15 4 * * *", "0 5 * * mon"))
    assert previous_fire_time(nightly, now) == datetime(2026, 11, 22, 4, 15, tzinfo=TZ)
    assert previous_fire_time(weekly, now) == datetime(2026, 11, 16, 5, 0, tzinfo=TZ)


def test_a_run_missed_while_down_is_detected_once():
    scheduler = JobScheduler(TZ)
    scheduler.add("dream:ws", "15 4 * * *", lambda: None)
    now = datetime(2026, 11, 22, 10, 0, tzinfo=TZ)
    two_days_ago = datetime(2026, 11, 20, 4, 16, tzinfo=TZ).timestamp()
    this_morning = datetime(2026, 11, 22, 4, 16, tzinfo=TZ).timestamp()
    assert scheduler.is_missed("dream:ws", two_days_ago, now) is True
    assert scheduler.is_missed("dream:ws", this_morning, now) is False
    assert scheduler.is_missed("dream:ws", None, now) is False


class Clocks:
    """A wall clock the test steps, beside a monotonic clock that only moves as real time would."""

    def __init__(self, wall: datetime):
        self.wall = wall.timestamp()
        self.steady = 1000.0

    def elapse(self, seconds: float) -> None:
        self.wall += seconds
        self.steady += seconds

    def step(self, seconds: float) -> None:
        """The wall clock is set (or the machine slept): the monotonic clock does not move."""
        self.wall += seconds


def nightly(at: datetime):
    """A scheduler with one nightly job at 04:15, started at *at*; (scheduler, clocks, the runs it started)."""
    clocks = Clocks(at)
    scheduler = JobScheduler(TZ, clock=lambda: clocks.wall, monotonic=lambda: clocks.steady)
    runs: list[float] = []

    async def dream() -> None:
        runs.append(clocks.wall)

    scheduler.add("dream:ws", "15 4 * * *", dream)
    scheduler.start()
    return scheduler, clocks, runs


async def ticks(scheduler, clocks, count: int = 3) -> None:
    for _ in range(count):
        clocks.elapse(1)
        scheduler.tick()
        await asyncio.sleep(0)


def test_a_forward_step_over_the_nightly_time_runs_it_once_at_the_next_tick():
    async def scenario():
        scheduler, clocks, runs = nightly(datetime(2026, 11, 22, 4, 14, 50, tzinfo=TZ))
        await ticks(scheduler, clocks)
        clocks.step(7 * 3600)  # 04:14:53 -> 11:14:53: the 04:15 run was passed over
        await ticks(scheduler, clocks)
        return runs, scheduler.next_run("dream:ws")

    runs, next_run = asyncio.run(scenario())
    assert len(runs) == 1
    assert next_run == "2026-11-23T04:15:00+01:00"


def test_a_forward_step_before_the_nightly_time_does_not_delay_it_by_the_step():
    async def scenario():
        scheduler, clocks, runs = nightly(datetime(2026, 11, 21, 23, 0, tzinfo=TZ))
        await ticks(scheduler, clocks)
        clocks.step(5 * 3600 + 14 * 60)  # 23:00 -> 04:14:03: a timer armed for 5 h 15 min would fire at 09:29
        await ticks(scheduler, clocks)
        assert runs == []
        for _ in range(60):
            await ticks(scheduler, clocks, 1)
        return runs

    runs = asyncio.run(scenario())
    assert [datetime.fromtimestamp(run, TZ).strftime("%H:%M") for run in runs] == ["04:15"]


def test_nights_slept_through_are_one_run_when_the_machine_wakes():
    async def scenario():
        scheduler, clocks, runs = nightly(datetime(2026, 11, 20, 23, 0, tzinfo=TZ))
        await ticks(scheduler, clocks)
        clocks.step(3 * 86400)  # suspended for three nights
        await ticks(scheduler, clocks, 10)
        return runs

    assert len(asyncio.run(scenario())) == 1


def test_a_backward_step_after_the_run_does_not_run_it_again_the_same_night():
    async def scenario():
        scheduler, clocks, runs = nightly(datetime(2026, 11, 22, 4, 14, 58, tzinfo=TZ))
        await ticks(scheduler, clocks, 5)
        assert len(runs) == 1
        clocks.step(-2 * 3600)  # back to 02:15: 04:15 comes again on the wall clock
        for _ in range(3):
            await ticks(scheduler, clocks, 1)
        clocks.step(2 * 3600 + 300)  # and passes again (04:20): the night's run was done
        await ticks(scheduler, clocks)
        return runs, scheduler.next_run("dream:ws")

    runs, next_run = asyncio.run(scenario())
    assert len(runs) == 1 and next_run == "2026-11-23T04:15:00+01:00"


def test_a_real_daemon_runs_the_nightly_job_its_clock_stepped_over_once(tmp_path):
    """A daemon whose (injected) wall clock reads 04:14:55, then is set 7 h forward: the 04:15 lifecycle, passed
    over, runs once at the next tick; the daemon's timers, in monotonic time, never saw the step."""
    workspace, _ = make_workspace(tmp_path)
    folder = Path(tempfile.mkdtemp(prefix="nbs-", dir="/tmp"))
    config_path = tmp_path / "nanobotd.toml"
    config_path.write_text(f'[daemon]\nsocket = "{folder}/n.sock"\nstate_dir = "{tmp_path}/state"\n'
                           f'timezone = "Europe/Paris"\n\n[lifecycle]\nschedule = "15 4 * * *"\n\n'
                           f'[[workspaces]]\nname = "ws"\npath = "{workspace}"\n')
    offset = [datetime(2026, 11, 22, 4, 14, 55, tzinfo=TZ).timestamp() - time.time()]
    daemon = Daemon(load_config(config_path, environ=dict(os.environ)), notifier=Notifier({}),
                    clock=lambda: time.time() + offset[0])

    def lifecycle_runs() -> list:
        return daemon.core.store.list_runs(kind="lifecycle")

    async def scenario():
        running = asyncio.get_running_loop().create_task(daemon.run())
        try:
            await wait_until(lambda: daemon.server is not None and daemon.server.listening)
            await asyncio.sleep(1.5)  # ticks at 04:14:5x: nothing due
            before = list(lifecycle_runs())
            offset[0] += 7 * 3600
            await wait_until(lifecycle_runs)
            await wait_until(lambda: lifecycle_runs()[0].state == "finished")
            await asyncio.sleep(2.5)  # more ticks, at 11:15: the run is not repeated
            return before, lifecycle_runs(), daemon.core.scheduler.next_run("lifecycle:ws")
        finally:
            daemon.request_stop()
            await asyncio.wait_for(running, 30)

    try:
        before, after, next_run = asyncio.run(scenario())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert before == [] and len(after) == 1
    assert next_run == "2026-11-23T04:15:00+01:00"
