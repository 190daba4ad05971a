"""Cron scheduling: previous fire times and missed runs after downtime."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from nanobotd.daemon.scheduler import make_trigger, missed_run, previous_fire_time

TZ = ZoneInfo("Europe/Paris")


def test_previous_fire_time_of_a_nightly_and_a_weekly_job():
    now = datetime(2026, 11, 22, 10, 0, tzinfo=TZ)
    assert previous_fire_time(make_trigger("15 4 * * *", TZ), now) == datetime(2026, 11, 22, 4, 15, tzinfo=TZ)
    assert previous_fire_time(make_trigger("0 5 * * mon", TZ), now) == datetime(2026, 11, 16, 5, 0, tzinfo=TZ)


def test_a_run_missed_while_down_is_detected_once():
    trigger = make_trigger("15 4 * * *", TZ)
    now = datetime(2026, 11, 22, 10, 0, tzinfo=TZ)
    two_days_ago = datetime(2026, 11, 20, 4, 16, tzinfo=TZ).timestamp()
    this_morning = datetime(2026, 11, 22, 4, 16, tzinfo=TZ).timestamp()
    assert missed_run(trigger, two_days_ago, now) is True
    assert missed_run(trigger, this_morning, now) is False
    assert missed_run(trigger, None, now) is False
